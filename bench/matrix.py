#!/usr/bin/env python3
"""softroce's performance matrix against the limits of the machine (issue 5), run by scripts/bench.

Measures, in one run on this machine:
  * the baselines (bench/baseline.c): memcpy and process_vm_writev of each message size, a raw
    UDP stream of RoCE-sized datagrams over loopback (one system call per datagram, and UDP GSO
    on send + GRO on receive), one TCP stream over loopback, a busy-polled UDP ping-pong;
  * Debian's unmodified perftest through libsoftroce.so, on one daemon and across two daemons
    over loopback: ib_write_bw, ib_read_bw, ib_send_bw over message sizes, ib_write_bw -s 8
    -q 16 (messages/s), ib_send_lat -s 2 and ib_write_lat -s 2 (percentiles);
  * the scale goals (bench/scale.c): 100,000 RC QPs (each one's create + RTS timed at the 100th,
    1,000th, ... 100,000th) and 100,000 MRs in one daemon, its CPU while they sit idle, and an MR
    register/deregister loop past 2^19 registrations in one process (issues 5 and 17);
and writes a Markdown report (every softroce figure beside its baseline and the ratio, the
issue's goals met / not met) plus PNG plots (gnuplot) under bench/results/.

Addresses: 127.0.0.201 and .202 for the two daemons, .210-.213 for the baselines, .214 for the
scale daemon; TCP/UDP ports 19000-19999.
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KIB, MIB = 1024, 1024 * 1024
FULL_SIZES = [2, 16, 128, 1 * KIB, 4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, 1 * MIB, 8 * MIB]
QUICK_SIZES = [2, 4 * KIB, 64 * KIB, 1 * MIB]
# A RoCE packet on the UDP payload: BTH (12) + payload + ICRC (4); the first packet of a WRITE
# also carries a RETH, middle ones do not.
ROCE_OVERHEAD = 16
ADDR_A, ADDR_B = "127.0.0.201", "127.0.0.202"


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def human_size(n):
    if n >= MIB and n % MIB == 0:
        return f"{n // MIB} MiB"
    if n >= KIB and n % KIB == 0:
        return f"{n // KIB} KiB"
    return f"{n} B"


def fmt(x, digits=3):
    if x is None:
        return "—"
    if x == 0:
        return "0"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.{digits}g}"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def parse_kv(line):
    return {k: v for k, v in re.findall(r"(\w+)=([^\s]+)", line)}


def tcp_listening(port):
    """Whether some socket listens on TCP `port` (perftest's server is ready)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for row in f:
                    cols = row.split()
                    if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                        return True
        except OSError:
            pass
    return False


class Bench:
    def __init__(self, args):
        self.args = args
        self.quick = args.quick
        self.tmp = Path(tempfile.mkdtemp(prefix="softroce-bench-"))
        self.daemons = {}
        self.port = 19100
        self.results = {}  # free-form store of every figure
        self.failures = []

    # --- processes -------------------------------------------------------------------------

    def start_daemon(self, name, addr, extra=()):
        sock = self.tmp / f"{name}.sock"
        logf = open(self.tmp / f"{name}.log", "w")
        proc = subprocess.Popen(
            [self.args.daemon, "daemon", "--socket", str(sock), "--addr", addr, "--log", "warn", *extra],
            stdout=subprocess.DEVNULL, stderr=logf)
        for _ in range(200):
            if sock.exists():
                break
            if proc.poll() is not None:
                raise SystemExit(f"daemon {name} exited: {(self.tmp / f'{name}.log').read_text()}")
            time.sleep(0.02)
        self.daemons[name] = (proc, sock, addr)
        return proc

    def stop_daemons(self):
        for proc, _, _ in self.daemons.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.daemons = {}

    def env(self, daemon):
        env = dict(os.environ)
        env["LD_PRELOAD"] = self.args.shim
        env["SOFTROCE_SOCKET"] = str(self.daemons[daemon][1])
        return env

    def perftest(self, program, args, server_daemon, client_daemon, limit):
        """Runs `program ARGS` as server on one daemon and client on another (or the same);
        returns the client's results lines (lists of floats), or None when it failed."""
        self.port += 1
        port = self.port
        common = [program, "-d", "srxe0", "-x", "0", "-F", "-p", str(port), *args]
        label = f"{program} {' '.join(args)} ({server_daemon}->{client_daemon})"
        deadline = time.monotonic() + limit
        with open(self.tmp / "server.out", "w") as sout:
            server = subprocess.Popen(common, env=self.env(server_daemon), stdout=sout, stderr=subprocess.STDOUT)
            while not tcp_listening(port):
                if server.poll() is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            client = subprocess.Popen(common + [self.daemons[server_daemon][2]], env=self.env(client_daemon),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            try:
                out, _ = client.communicate(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                client.kill()
                out, _ = client.communicate()
                out += f"\n(killed after {limit} s)"
            try:
                server.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        lines = []
        for line in out.splitlines():
            cols = line.split()
            if len(cols) >= 5 and cols[0].isdigit() and cols[1].isdigit() and "." in cols[2]:
                try:
                    lines.append([float(c) for c in cols])
                except ValueError:
                    pass
        if client.returncode != 0 or not lines:
            tail = "\n".join(out.splitlines()[-6:])
            log(f"FAILED: {label}: exit {client.returncode}\n{tail}")
            self.failures.append(f"{label}: exit {client.returncode}, {tail.splitlines()[-1] if tail else ''}")
            return None
        return lines

    # --- baselines ---------------------------------------------------------------------------

    def baseline(self, *args):
        env = dict(os.environ, BASELINE_SECONDS="0.4" if self.quick else "1")
        out = subprocess.run([self.args.baseline, *map(str, args)], env=env, capture_output=True, text=True,
                             timeout=120)
        if out.returncode != 0:
            log(f"baseline {args} failed: {out.stderr}")
        return [parse_kv(l) for l in out.stdout.splitlines() if l.startswith("baseline=")]

    def run_baselines(self, sizes):
        """Measures every baseline; called before and after softroce's runs, keeping the better
        figure of the two (the machine is shared: a baseline disturbed by someone else's build
        would flatter softroce's ratios)."""
        log("baselines: memcpy, process_vm_writev")
        r = self.results

        def best(old, new, key=lambda d: d):
            if old is None:
                return new
            if new is None:
                return old
            return new if key(new) > key(old) else old

        for name, mode in (("memcpy", "memcpy"), ("pvm", "pvm")):
            got = {int(d["size"]): float(d["GBps"]) for d in self.baseline(mode, *sizes)}
            prev = r.setdefault(name, {})
            for size, v in got.items():
                prev[size] = best(prev.get(size), v)
        log("baselines: UDP streams, TCP, UDP ping-pong")
        udp = r.setdefault("udp", {})
        for mode, port in (("pkt", 19011), ("gso", 19013)):
            for payload in (4096, 1024):
                got = self.baseline("udp", "127.0.0.210", port, payload + ROCE_OVERHEAD, mode)
                udp[(mode, payload)] = best(udp.get((mode, payload)), got[0] if got else None,
                                            key=lambda d: float(d["payload_GBps"]))
        got = self.baseline("tcp", "127.0.0.211", 19020)
        r["tcp"] = best(r.get("tcp"), float(got[0]["GBps"]) if got else None)
        got = self.baseline("pingpong", "127.0.0.212", 19030, 20000 if self.quick else 100000)
        r["pingpong"] = best(r.get("pingpong"), got[0] if got else None,
                             key=lambda d: -float(d["oneway_us_median"]))

    # --- softroce ----------------------------------------------------------------------------

    def run_bandwidth(self, sizes):
        r = self.results
        r["bw"] = {}
        duration = "1"
        for setup, (s, c) in (("one", ("a", "a")), ("two", ("a", "b"))):
            for op in ("write", "read", "send"):
                for size in sizes:
                    log(f"ib_{op}_bw -s {size} ({setup} daemon{'s' if setup == 'two' else ''})")
                    lines = self.perftest(f"ib_{op}_bw", ["-s", str(size), "-D", duration], s, c, 40)
                    # #bytes #iterations BW-peak BW-average[MiB/s] MsgRate[Mpps]: bytes/s from the
                    # message rate (exact), in GB/s (10^9).
                    r["bw"][(setup, op, size)] = lines[-1][4] * size / 1e3 if lines else None

    def run_msgrate(self):
        r = self.results
        r["msgrate"] = {}
        for setup, (s, c) in (("one", ("a", "a")), ("two", ("a", "b"))):
            log(f"ib_write_bw -s 8 -q 16 ({setup})")
            lines = self.perftest("ib_write_bw", ["-s", "8", "-q", "16", "-D", "2"], s, c, 40)
            r["msgrate"][setup] = lines[-1][4] * 1e6 if lines else None

    def run_latency(self):
        r = self.results
        r["lat"] = {}
        iters = "1000" if self.quick else "5000"
        limit = 30 if self.quick else 90
        for setup, (s, c) in (("one", ("a", "a")), ("two", ("a", "b"))):
            for prog in ("ib_send_lat", "ib_write_lat"):
                log(f"{prog} -s 2 -n {iters} ({setup})")
                lines = self.perftest(prog, ["-s", "2", "-n", iters], s, c, limit)
                if lines:
                    # #bytes #iter t_min t_max t_typical t_avg t_stdev 99% 99.9%
                    l = lines[-1]
                    r["lat"][(setup, prog)] = {"min": l[2], "median": l[4], "avg": l[5], "p99": l[7],
                                               "p999": l[8], "max": l[3]}
                else:
                    r["lat"][(setup, prog)] = None

    # --- scale -------------------------------------------------------------------------------

    def run_scale(self):
        # Issue 17: 100,000 QPs, each one's create + RTS timed at checkpoints (the 100th, ...,
        # the 100,000th), then an MR register/deregister loop that takes the process past 2^19
        # registrations in its life (100,000 + 450,000 + 2 > 524,288).
        qps, mrs, churn = (2000, 20000, 20000) if self.quick else (100000, 100000, 450000)
        log(f"scale: {qps} RC QPs, {mrs} MRs in one daemon, {churn} MR re-registrations")
        # The daemon's default limits (131,072 QPs, 524,288 MRs) already allow the goal.
        self.start_daemon("scale", "127.0.0.214")
        proc, sock, _ = self.daemons["scale"]
        env = dict(os.environ, LD_PRELOAD=self.args.shim, SOFTROCE_SOCKET=str(sock))

        def rss_kib(pid):
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])
            return 0

        def ticks(pid):
            total = 0
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])  # utime + stime
            return total

        time.sleep(0.5)
        daemon_before = rss_kib(proc.pid)
        # QPs first: a control request no longer costs a pass over every ring (doorbells), so
        # the MRs and the churn are timed with all the QPs in place.
        client = subprocess.Popen([self.args.scale, str(qps), str(mrs), "--churn", str(churn)], env=env,
                                  stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        result = {"qps": qps, "mrs": mrs, "churn": churn}
        created = {"qp_cost": {}, "mr_cost": {}}
        deadline = time.monotonic() + 900
        ok = False
        while time.monotonic() < deadline:
            line = client.stdout.readline()
            if not line:
                break
            log("  " + line.rstrip())
            if line.startswith("scale="):
                kv = parse_kv(line)
                kv["daemon_rss_kib"] = rss_kib(proc.pid)
                if kv["scale"] in ("qp_cost", "mr_cost"):
                    created[kv["scale"]][int(kv["at"])] = float(kv["us"])
                else:
                    created[kv["scale"]] = kv
            if line.startswith("scale=ready"):
                ok = True
                break
        if not ok:
            err = client.stderr.read() if client.poll() is not None else ""
            client.kill()
            client.wait()
            self.failures.append(f"scale: the client did not finish: {err.strip()[-300:]}")
            self.results["scale"] = None
            self.stop_daemons()
            return
        daemon_rss = rss_kib(proc.pid)
        client_rss = rss_kib(client.pid)
        res = subprocess.run([self.args.daemon, "res", "show", "--socket", str(sock)], capture_output=True, text=True)
        result["res_show"] = res.stdout.strip().splitlines()[:4]
        idle_seconds = 5 if self.quick else 10
        t0 = ticks(proc.pid)
        time.sleep(idle_seconds)
        t1 = ticks(proc.pid)
        try:  # closing its stdin (communicate does) lets the program destroy everything
            rest, _ = client.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            client.kill()
            rest, _ = client.communicate()
        for line in rest.splitlines():
            log("  " + line)
            if line.startswith("scale="):
                kv = parse_kv(line)
                created[kv["scale"]] = kv
        if client.returncode != 0:
            self.failures.append(f"scale: the client failed while destroying (exit {client.returncode})")
        result.update({
            "daemon_rss_before_kib": daemon_before,
            "daemon_rss_kib": daemon_rss,
            "client_rss_kib": client_rss,
            "idle_ticks": t1 - t0,
            "idle_seconds": idle_seconds,
            "clk_tck": os.sysconf("SC_CLK_TCK"),
            "created": created,
        })
        self.results["scale"] = result
        self.stop_daemons()

    # --- report ------------------------------------------------------------------------------

    def report(self, sizes):
        r = self.results
        out = []
        w = out.append
        w(f"## softroce against the limits of the machine ({'quick' if self.quick else 'full'} run)\n")
        w("Unmodified perftest through the release `libsoftroce.so` and release daemon(s) (one daemon: "
          f"both ends on {ADDR_A}; two daemons: {ADDR_A} and {ADDR_B} over loopback; MTU 4096). "
          "Bandwidth is bytes/s from perftest's message rate (GB = 10^9 B), `-D 1` per size. Baselines "
          "come from `bench/baseline.c` in the same run (each side its own process, unpinned), "
          "measured before and after softroce's runs, the better of the two kept.\n")

        w("### Baselines\n")
        w("| baseline | figure |\n|---|---|")
        for (mode, payload), d in sorted(r.get("udp", {}).items()):
            if d:
                name = "per-packet (one sendmsg per datagram)" if mode == "pkt" else "UDP GSO send + GRO receive"
                w(f"| UDP stream, {payload}+{ROCE_OVERHEAD} B datagrams, {name} | "
                  f"{float(d['datagrams_per_s']) / 1e6:.3f} M datagrams/s, {d['payload_GBps']} GB/s payload |")
        if r.get("tcp") is not None:
            w(f"| TCP over loopback, one stream | {r['tcp']:.3f} GB/s |")
        p = r.get("pingpong")
        if p:
            w(f"| UDP ping-pong over loopback, busy-polled, one way (RTT/2) | min {p['oneway_us_min']} µs, "
              f"median {p['oneway_us_median']} µs, avg {p['oneway_us_avg']}, 99% {p['oneway_us_p99']}, "
              f"99.9% {p['oneway_us_p999']} µs |")
        w("")

        w("### Bandwidth against message size (GB/s)\n")
        w("Ratios: one daemon to process_vm_writev of the same size (the cross-address-space copy "
          "every message needs at least once); two daemons to the raw UDP GSO/GRO stream of "
          f"4096+{ROCE_OVERHEAD} B datagrams.\n")
        gso = r.get("udp", {}).get(("gso", 4096))
        gso_bw = float(gso["payload_GBps"]) if gso else None
        w("| size | memcpy | process_vm_writev | write, 1 daemon | ratio | read, 1 daemon | ratio | send, 1 daemon "
          "| ratio | write, 2 daemons | ratio | read, 2 daemons | ratio | send, 2 daemons | ratio |")
        w("|---" * 15 + "|")
        for size in sizes:
            pvm = r.get("pvm", {}).get(size)
            row = [human_size(size), fmt(r.get("memcpy", {}).get(size)), fmt(pvm)]
            for setup, base in (("one", pvm), ("two", gso_bw)):
                for op in ("write", "read", "send"):
                    v = r.get("bw", {}).get((setup, op, size))
                    row += [fmt(v), fmt(ratio(v, base), 2)]
            w("| " + " | ".join(row) + " |")
        w("")

        w("### Latency, 2-byte messages (µs, one way as perftest reports it)\n")
        w("| what | min | median (t_typical) | avg | 99% | 99.9% | max | median / UDP ping-pong |")
        w("|---|---|---|---|---|---|---|---|")
        if p:
            w(f"| UDP ping-pong (baseline) | {p['oneway_us_min']} | {p['oneway_us_median']} | {p['oneway_us_avg']} | "
              f"{p['oneway_us_p99']} | {p['oneway_us_p999']} | {p['oneway_us_max']} | 1 |")
        pp_med = float(p["oneway_us_median"]) if p else None
        for (setup, prog), d in r.get("lat", {}).items():
            name = f"{prog} -s 2, {'one daemon' if setup == 'one' else 'two daemons'}"
            if d:
                w(f"| {name} | {fmt(d['min'])} | {fmt(d['median'])} | {fmt(d['avg'])} | {fmt(d['p99'])} | "
                  f"{fmt(d['p999'])} | {fmt(d['max'])} | {fmt(ratio(d['median'], pp_med), 2)} |")
            else:
                w(f"| {name} | failed | | | | | | |")
        w("")

        mr = r.get("msgrate", {})
        if mr:
            w("### Message rate, `ib_write_bw -s 8 -q 16`\n")
            w("| setup | messages/s |\n|---|---|")
            for setup, v in mr.items():
                w(f"| {'one daemon' if setup == 'one' else 'two daemons'} | {fmt(v / 1e6 if v else None)} M |")
            w("")

        sc = r.get("scale")
        if "scale" in r:
            w("### Scale: RC QPs and MRs in one daemon (`bench/scale.c`, unmodified libibverbs API)\n")
            if sc:
                d_kib = sc["daemon_rss_kib"] - sc["daemon_rss_before_kib"]
                c = sc["created"]
                w("| figure | value |\n|---|---|")
                w(f"| QPs created (RC, moved to RTS) | {sc['qps']} in {c.get('qps', {}).get('seconds', '?')} s |")
                w(f"| MRs registered after them (4 KiB each) | {sc['mrs']} in {c.get('mrs', {}).get('seconds', '?')} s |")
                for at, us in sorted(c.get("qp_cost", {}).items()):
                    w(f"| create + INIT + RTR + RTS of the QPs up to the {at:,}th (median of 64) | {us} µs |")
                for at, us in sorted(c.get("mr_cost", {}).items()):
                    w(f"| `ibv_reg_mr` of the MRs up to the {at:,}th (median of 64) | {us} µs |")
                ch = c.get("churn")
                if ch:
                    w(f"| MR churn: dereg + reg {ch['count']} times, {ch['registrations']} registrations in the "
                      f"process's life | {ch['seconds']} s; first 1,000 {ch['first_us']} µs, last 1,000 "
                      f"{ch['last_us']} µs each; a deregistered MR's R_Key: {ch['stale_key']} |")
                one = c.get("single")
                if one:
                    w(f"| one RDMA WRITE on one QP after the idle phase (wakes the device) | {one['us']} µs |")
                v = c.get("verify", {})
                w(f"| all proven to work: RDMA WRITEs through every QP and every MR | {v.get('writes', '?')} "
                  f"writes in {v.get('seconds', '?')} s, {v.get('bytes_checked', '?')} bytes compared |")
                w(f"| daemon RSS growth | {d_kib / 1024:.1f} MiB |")
                try:
                    after_mrs = c["mrs"]["daemon_rss_kib"]
                    after_qps = c["qps"]["daemon_rss_kib"]
                    # QPs first, then MRs (run_scale).
                    w(f"| daemon memory per QP / per MR (RSS growth while creating them) | "
                      f"{(after_qps - sc['daemon_rss_before_kib']) / sc['qps']:.2f} KiB / "
                      f"{(after_mrs - after_qps) / sc['mrs']:.2f} KiB |")
                except KeyError:
                    pass
                w(f"| client RSS | {sc['client_rss_kib'] / 1024:.1f} MiB |")
                per_qp = c.get("qps", {}).get("client_kib_per")
                per_mr = c.get("mrs", {}).get("client_kib_per")
                w(f"| client memory per QP / per MR (RSS growth while creating them) | {per_qp} KiB / {per_mr} KiB |")
                w(f"| daemon CPU over {sc['idle_seconds']} s with all of them idle | {sc['idle_ticks']} ticks "
                  f"(1 tick = {1000 // sc['clk_tck']} ms) |")
                w(f"| everything destroyed (QPs, then MRs) | {c.get('destroyed', {}).get('seconds', '?')} s |")
                w("")
                w("`softroce res show`:\n\n```\n" + "\n".join(sc["res_show"]) + "\n```\n")
            else:
                w("failed (see below)\n")

        w("### The issue's goals\n")
        w("| goal | measured | baseline | ratio | met? |\n|---|---|---|---|---|")

        def goal(text, value, base, rat, ok):
            state = "—" if ok is None else ("**met**" if ok else "not met")
            w(f"| {text} | {value} | {base} | {rat} | {state} |")

        v = r.get("bw", {}).get(("one", "write", 64 * KIB))
        b = r.get("pvm", {}).get(64 * KIB)
        q = ratio(v, b)
        goal("one daemon, `ib_write_bw -s 65536` ≥ 0.5 × process_vm_writev 64 KiB", f"{fmt(v)} GB/s",
             f"{fmt(b)} GB/s", fmt(q, 2), None if q is None else q >= 0.5)
        v2 = r.get("bw", {}).get(("two", "write", 64 * KIB))
        q = ratio(v2, gso_bw)
        goal("two daemons, `ib_write_bw -s 65536` MTU 4096 ≥ 0.8 × UDP GSO/GRO stream", f"{fmt(v2)} GB/s",
             f"{fmt(gso_bw)} GB/s", fmt(q, 2), None if q is None else q >= 0.8)
        q = ratio(v2, r.get("tcp"))
        goal("two daemons, `ib_write_bw -s 65536` ≥ TCP single stream", f"{fmt(v2)} GB/s",
             f"{fmt(r.get('tcp'))} GB/s", fmt(q, 2), None if q is None else q >= 1)
        d = r.get("lat", {}).get(("one", "ib_send_lat"))
        med = d["median"] if d else None
        goal("one daemon, `ib_send_lat -s 2` median ≤ 2 µs", f"{fmt(med)} µs", "2 µs", fmt(ratio(med, 2), 2),
             None if med is None else med <= 2)
        d = r.get("lat", {}).get(("two", "ib_send_lat"))
        med = d["median"] if d else None
        q = ratio(med, pp_med)
        goal("two daemons, `ib_send_lat -s 2` median ≤ 1.5 × UDP ping-pong one way", f"{fmt(med)} µs",
             f"{fmt(pp_med)} µs", fmt(q, 2), None if q is None else q <= 1.5)
        v = r.get("msgrate", {}).get("one")
        goal("one daemon, `ib_write_bw -s 8 -q 16` ≥ 1 M messages/s", f"{fmt(v / 1e6 if v else None)} M/s",
             "1 M/s", fmt(ratio(v, 1e6), 2), None if v is None else v >= 1e6)
        if "scale" in r:
            ok = sc is not None and sc["qps"] >= 10000 and sc["mrs"] >= 100000 and sc["idle_ticks"] <= 2
            measured = (f"{sc['qps']} QPs, {sc['mrs']} MRs, {sc['idle_ticks']} idle ticks / {sc['idle_seconds']} s"
                        if sc else "failed")
            goal("10,000 RC QPs and 100,000 MRs in one daemon, no CPU on idle QPs", measured,
                 "", "", ok if sc and not self.quick else (False if not sc else None))
            # Issue 17: flat. The 100,000th QP's create + RTS against the 100th's, in the same
            # run (issue 17's "today": 10,000 QPs in 21 s, 2.1 ms each on average, growing).
            cost = sc["created"].get("qp_cost", {}) if sc else {}
            first, last = cost.get(100), cost.get(max(cost) if cost else None)
            q = ratio(last, first)
            flat = (None if q is None else last <= 100 and q <= 1.25 and sc["idle_ticks"] <= 2)
            nth = f"{max(cost):,}" if cost else "?"
            goal(f"QP create + RTS flat: the {nth}th ≤ 100 µs and ≤ 1.25 × the 100th; "
                 "no CPU when idle", f"{fmt(last)} µs, {sc['idle_ticks'] if sc else '?'} idle ticks",
                 f"{fmt(first)} µs (100th)", fmt(q, 2), flat if sc and not self.quick else (False if not sc else None))
            ch = sc["created"].get("churn") if sc else None
            regs = int(ch["registrations"]) if ch else 0
            goal("MR register/deregister past 2^19 registrations in one process, stale key refused",
                 f"{regs:,} registrations" if ch else "failed", "524,288", fmt(ratio(regs, 1 << 19), 2),
                 (regs > 1 << 19 and ch["stale_key"] == "refused") if ch and not self.quick else
                 (False if not ch else None))
        w("")
        if self.failures:
            w("### Runs that failed\n")
            for f in self.failures:
                w(f"- {f}")
            w("")
        w("Plots: `bench/results/bandwidth.png` (bandwidth against message size), "
          "`bench/results/latency.png` (latency percentiles).\n")
        return "\n".join(out)

    # --- plots -------------------------------------------------------------------------------

    def plot(self, sizes, results_dir):
        r = self.results
        data = self.tmp / "bw.dat"
        cols = [("memcpy", lambda s: r.get("memcpy", {}).get(s)),
                ("process_vm_writev", lambda s: r.get("pvm", {}).get(s))]
        for setup in ("one", "two"):
            for op in ("write", "read", "send"):
                cols.append((f"{op} {setup}", lambda s, setup=setup, op=op: r.get("bw", {}).get((setup, op, s))))
        with open(data, "w") as f:
            for s in sizes:
                vals = [c[1](s) for c in cols]
                f.write(f"{s} " + " ".join("NaN" if v is None else f"{v:.6f}" for v in vals) + "\n")
        gso = r.get("udp", {}).get(("gso", 4096))
        pkt = r.get("udp", {}).get(("pkt", 4096))
        lines = []
        styles = {"memcpy": "lc rgb '#999999' dt 2", "process_vm_writev": "lc rgb '#000000' dt 2"}
        names = {"memcpy": "memcpy (baseline)", "process_vm_writev": "process_vm_writev (baseline)"}
        colors = {"write": "#1f77b4", "read": "#2ca02c", "send": "#d62728"}
        for i, (name, _) in enumerate(cols):
            if name in styles:
                lines.append(f"'{data}' using 1:{i + 2} with linespoints {styles[name]} lw 2 pt 7 ps 0.6 "
                             f"title '{names[name]}'")
            else:
                op, setup = name.split()
                dt = "1" if setup == "one" else "4"
                pt = "7" if setup == "one" else "5"
                lines.append(f"'{data}' using 1:{i + 2} with linespoints lc rgb '{colors[op]}' dt {dt} lw 2 pt {pt} "
                             f"title 'ib_{op}_bw, {'one daemon' if setup == 'one' else 'two daemons'}'")
        consts = []
        if gso:
            consts.append(f"{float(gso['payload_GBps'])} with lines lc rgb '#ff7f0e' lw 3 dt 2 "
                          "title 'UDP GSO/GRO stream, 4 KiB packets (baseline)'")
        if pkt:
            consts.append(f"{float(pkt['payload_GBps'])} with lines lc rgb '#8c564b' lw 3 dt 2 "
                          "title 'UDP one sendmsg per packet, 4 KiB (baseline)'")
        if r.get("tcp"):
            consts.append(f"{r['tcp']} with lines lc rgb '#9467bd' lw 3 dt 2 title 'TCP one stream (baseline)'")
        script = f"""
set terminal pngcairo size 1200,900 font 'sans,11' noenhanced
set output '{results_dir}/bandwidth.png'
set title 'Bandwidth against message size (perftest through libsoftroce.so; baselines in the same run)'
set logscale x 2
set logscale y 10
set format x '%.0b%B'
set format y '%g'
set xlabel 'message size (bytes)'
set ylabel 'GB/s (1e9 bytes/s), log scale'
set grid
set key outside below maxrows 4
set xrange [{sizes[0]}:{sizes[-1]}]
plot {', '.join(lines + consts)}
"""
        self.gnuplot(script)

        # Latency percentiles: one cluster per percentile, one bar per measured program.
        lat = self.tmp / "lat.dat"
        series = []
        p = r.get("pingpong")
        if p:
            series.append(("UDP ping-pong (baseline)", [float(p[f"oneway_us_{k}"]) for k in
                                                        ("min", "median", "avg", "p99", "p999")]))
        for (setup, prog), d in r.get("lat", {}).items():
            if d:
                series.append((f"{prog}, {'one daemon' if setup == 'one' else 'two daemons'}",
                               [d[k] for k in ("min", "median", "avg", "p99", "p999")]))
        if not series:
            return
        with open(lat, "w") as f:
            f.write("pct " + " ".join(f'"{n}"' for n, _ in series) + "\n")
            for i, name in enumerate(("min", "median", "avg", "99%", "99.9%")):
                f.write(f'"{name}" ' + " ".join(f"{v[i]:.3f}" for _, v in series) + "\n")
        plots = ", ".join(f"'{lat}' using {i + 2}:xtic(1) title columnheader({i + 2})" for i in range(len(series)))
        script = f"""
set terminal pngcairo size 1200,700 font 'sans,11' noenhanced
set output '{results_dir}/latency.png'
set title 'Latency percentiles, 2-byte messages, one way (µs, log scale)'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set logscale y 10
set ylabel 'µs'
set grid ytics
set key outside right top
set format y '%g'
set yrange [0.1:*]
plot {plots}
"""
        self.gnuplot(script)

    def gnuplot(self, script):
        got = subprocess.run(["gnuplot"], input=script, capture_output=True, text=True)
        if got.returncode != 0:
            log(f"gnuplot failed: {got.stderr}")

    # --- main --------------------------------------------------------------------------------

    def run(self):
        sizes = QUICK_SIZES if self.quick else FULL_SIZES
        sections = self.args.sections
        try:
            if "baselines" in sections or "perftest" in sections:
                self.run_baselines(sizes)
            if "perftest" in sections:
                self.start_daemon("a", ADDR_A)
                self.start_daemon("b", ADDR_B)
                self.run_bandwidth(sizes)
                self.run_msgrate()
                self.run_latency()
                self.stop_daemons()
                self.run_baselines(sizes)
            if "scale" in sections:
                self.run_scale()
        finally:
            self.stop_daemons()
        text = self.report(sizes)
        print(text)
        if "perftest" in sections:
            self.plot(sizes, self.args.results)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--shim", required=True)
    ap.add_argument("--baseline", required=True)
    ap.add_argument("--scale", required=True)
    ap.add_argument("--results", required=True)
    ap.add_argument("sections", nargs="*", default=["baselines", "perftest", "scale"])
    args = ap.parse_args()
    if not args.sections:
        args.sections = ["baselines", "perftest", "scale"]
    Bench(args).run()


if __name__ == "__main__":
    main()
