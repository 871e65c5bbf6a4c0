#!/usr/bin/env python3
"""Goodput against packet loss, go-back-N against selective retransmission (issue 13), run by
`scripts/bench loss`.

For each recovery mode (`--loss-recovery gbn`, and `auto`, which negotiates selective
between the two softroce daemons) two release daemons in network namespaces created here
(names with this process's pid), a veth pair between them (10.13.N.1 and .2, IB MTU 1024 on a
1500-byte link), and nftables on both sides dropping that share of the outgoing RoCE packets
(`numgen random`). Both pairs are up for the whole run and their runs alternate (go-back-N,
selective, go-back-N, ...), so a change of load on the machine hits both modes alike. For
each loss rate, mode and program, the median of the runs:

  * ib_write_bw -s 65536 -D SECONDS: the average bandwidth perftest reports;
  * ibv_rc_pingpong -s 1048576 -n N -c: the Mbit/s it reports (both directions, data
    checked), bounded by a per-run time limit (a run that does not finish counts as 0).

The lossless figure of each mode, measured in the same run, is its baseline; the report
gives each goodput as a share of it, and the selective/go-back-N ratio per loss rate (IRN
reports the gap widening with loss). Writes Markdown to stdout and a PNG plot (gnuplot)
beside the results.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = ["gbn", "auto"]
MODE_NAMES = {"gbn": "go-back-N", "auto": "selective (auto)"}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def sh(*cmd, check=True, **kw):
    return subprocess.run(cmd, check=check, capture_output=True, text=True, **kw)


class Path2:
    """The two namespaces and the veth; `set_loss` rewrites the drop rules."""

    def __init__(self, index):
        tag = f"irnb{os.getpid() % 100000}{index}"
        self.ns = [f"{tag}-a", f"{tag}-b"]
        self.dev = [f"{tag}a", f"{tag}b"]
        self.ips = [f"10.13.{index}.1", f"10.13.{index}.2"]
        for n in self.ns:
            sh("ip", "netns", "add", n)
        sh("ip", "link", "add", self.dev[0], "type", "veth", "peer", "name", self.dev[1])
        for i, addr in enumerate(self.ips):
            sh("ip", "link", "set", self.dev[i], "netns", self.ns[i])
            sh("ip", "-n", self.ns[i], "addr", "add", f"{addr}/24", "dev", self.dev[i])
            sh("ip", "-n", self.ns[i], "link", "set", self.dev[i], "up")
            sh("ip", "-n", self.ns[i], "link", "set", "lo", "up")

    def set_loss(self, per_10k):
        for i, n in enumerate(self.ns):
            sh("ip", "netns", "exec", n, "nft", "flush", "ruleset")
            if per_10k == 0:
                continue
            # The client's plain ACKs (opcode 0x11) are spared: rc_pingpong's client exits as
            # soon as its last message arrives, and a lost ACK of the server's last SEND could
            # never be repeated (see tests/tests/loss_recovery.rs).
            spare = "@th,64,8 != 0x11 " if i == 1 else ""
            rules = (
                "table ip irnbench {\n chain out {\n  type filter hook output priority 0;\n"
                f"  udp dport 4791 {spare}numgen random mod 10000 < {per_10k} counter drop\n"
                " }\n}\n"
            )
            subprocess.run(["ip", "netns", "exec", n, "nft", "-f", "-"], input=rules,
                           text=True, check=True)

    def close(self):
        for n in self.ns:
            sh("ip", "netns", "del", n, check=False)


class Daemons:
    def __init__(self, path, daemon, mode, tmp):
        self.procs, self.socks = [], []
        for i, (n, addr) in enumerate(zip(path.ns, path.ips)):
            sock = Path(tmp) / f"{mode}-{i}.sock"
            logf = open(Path(tmp) / f"{mode}-{i}.log", "w")
            p = subprocess.Popen(
                ["ip", "netns", "exec", n, daemon, "daemon", "--socket", str(sock), "--addr",
                 addr, "--mtu", "1024", "--loss-recovery", mode,
                 # One datagram per packet: nftables sees a GSO send (which a softroce
                 # peer gets over IPv4 on any path) as one packet, and would drop batches.
                 "--no-gso"],
                stdout=subprocess.DEVNULL, stderr=logf)
            self.procs.append(p)
            self.socks.append(sock)
        deadline = time.time() + 20
        while not all(s.exists() for s in self.socks):
            if time.time() > deadline:
                raise RuntimeError("the daemons did not start")
            time.sleep(0.05)
        time.sleep(0.3)

    def stop(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def run_pair(path, daemons, shim, argv, limit):
    """Server in namespace a, client in b (server address appended); returns client output
    or None when either failed or ran out of time."""
    env = [f"LD_PRELOAD={shim}"]

    def cmd(i):
        return ["ip", "netns", "exec", path.ns[i], "env", *env,
                f"SOFTROCE_SOCKET={daemons.socks[i]}", "timeout", str(limit), *argv]

    server = subprocess.Popen(cmd(0), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(0.6)
    client = subprocess.run(cmd(1) + [path.ips[0]], capture_output=True, text=True)
    try:
        sout, _ = server.communicate(timeout=limit + 10)
    except subprocess.TimeoutExpired:
        server.kill()
        sout = ""
    if client.returncode != 0 or server.returncode != 0:
        log(f"    failed: client {client.returncode} server {server.returncode}: "
            f"{client.stdout[-300:]!r}")
        return None
    return client.stdout


def write_bw(path, daemons, shim, secs):
    out = run_pair(path, daemons, shim,
                   ["ib_write_bw", "-d", "srxe0", "-x", "0", "-s", "65536", "-D", str(secs),
                    "-F", "--report_gbits"], secs + 60)
    if out is None:
        return 0.0
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 4 and f[0] == "65536":
            return float(f[3]) * 1000.0  # Gbit/s -> Mbit/s
    return 0.0


def pingpong(path, daemons, shim, iters, limit):
    out = run_pair(path, daemons, shim,
                   ["ibv_rc_pingpong", "-d", "srxe0", "-g", "0", "-s", "1048576", "-n",
                    str(iters), "-c"], limit)
    if out is None or "invalid data" in out:
        return 0.0
    m = re.search(r"= ([0-9.]+) Mbit/sec", out)
    return float(m.group(1)) if m else 0.0


def counters(tmp, mode):
    """Summed selective counters of the runs, from the daemons' logs."""
    total = {"sack_sent": 0, "sel_retransmits": 0, "probes": 0, "timeouts": 0, "switched": 0}
    for i in (0, 1):
        for line in (Path(tmp) / f"{mode}-{i}.log").read_text().splitlines():
            if "QP uses selective retransmission" in line:
                total["switched"] += 1
            if "selective retransmission counters" in line:
                for k in total:
                    m = re.search(rf"\b{k}=(\d+)", line)
                    total[k] += int(m.group(1)) if m else 0
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--shim", required=True)
    ap.add_argument("--results", required=True)
    ap.add_argument("--stamp", required=True)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    # Loss per 10,000 packets.
    losses = [0, 10, 100, 500] if a.quick else [0, 10, 50, 100, 200, 500]
    runs = 1 if a.quick else 3
    secs = 2 if a.quick else 4
    iters = 10
    paths = {mode: Path2(i) for i, mode in enumerate(MODES)}
    table = {}  # (program, mode, loss) -> median Mbit/s
    extra = {}
    t0 = time.time()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            daemons = {}
            try:
                for mode in MODES:
                    daemons[mode] = Daemons(paths[mode], a.daemon, mode, tmp)
                for loss in losses:
                    for mode in MODES:
                        paths[mode].set_loss(loss)
                    for prog in ("ib_write_bw", "ibv_rc_pingpong"):
                        vals = {mode: [] for mode in MODES}
                        for _ in range(runs):
                            for mode in MODES:
                                p, d = paths[mode], daemons[mode]
                                if prog == "ib_write_bw":
                                    vals[mode].append(write_bw(p, d, a.shim, secs))
                                else:
                                    vals[mode].append(pingpong(p, d, a.shim, iters, 90))
                        for mode in MODES:
                            table[(prog, mode, loss)] = statistics.median(vals[mode])
                            log(f"  {MODE_NAMES[mode]:18} loss {loss / 100:5.2f}% {prog:16} "
                                f"{vals[mode]} Mbit/s")
            finally:
                for d in daemons.values():
                    d.stop()
            for mode in MODES:
                extra[mode] = counters(tmp, mode)
    finally:
        for p in paths.values():
            p.close()

    print(f"## Goodput against loss: go-back-N and selective retransmission (issue 13)\n")
    print(f"Two daemons (release) in network namespaces joined by a veth, IB MTU 1024; "
          f"nftables drops the stated share of each side's RoCE packets (`numgen random`; `--no-gso`, "
          f"so that each packet is a datagram of its own). "
          f"Median of {runs} run(s): `ib_write_bw -s 65536 -D {secs}` (Mbit/s perftest reports) "
          f"and `ibv_rc_pingpong -s 1048576 -n {iters} -c` (Mbit/s, both directions, data "
          f"checked; 0 = did not finish in 90 s). Each mode's lossless figure, same run, is its "
          f"baseline. The two modes' runs alternate. Took {time.time() - t0:.0f} s.\n")
    for prog in ("ib_write_bw", "ibv_rc_pingpong"):
        print(f"### {prog}\n")
        print("| loss | go-back-N Mbit/s | share of lossless | selective Mbit/s | share of lossless "
              "| selective / go-back-N |")
        print("|---|---|---|---|---|---|")
        for loss in losses:
            g = table[(prog, "gbn", loss)]
            s = table[(prog, "auto", loss)]
            g0 = table[(prog, "gbn", 0)] or 1.0
            s0 = table[(prog, "auto", 0)] or 1.0
            ratio = f"{s / g:.1f}x" if g > 0 else ("inf" if s > 0 else "-")
            print(f"| {loss / 100:.2f} % | {g:.0f} | {g / g0:.2f} | {s:.0f} | {s / s0:.2f} | "
                  f"{ratio} |")
        print()
    g = extra.get("gbn", {})
    if g.get("switched", 0) or g.get("sack_sent", 0):
        # The go-back-N column must be go-back-N: a daemon on gbn never switches a QP.
        raise SystemExit(f"go-back-N runs used selective retransmission: {g}")
    c = extra.get("auto", {})
    if not c.get("switched", 0):
        raise SystemExit("no QP of the selective runs switched to selective retransmission")
    print(f"Selective runs, all loss rates: {c.get('switched', 0)} QPs switched (both ends), "
          f"{c.get('sack_sent', 0)} SACKs sent, "
          f"{c.get('sel_retransmits', 0)} packets resent selectively, {c.get('probes', 0)} "
          f"probe-timer firings, {c.get('timeouts', 0)} retransmit timeouts.\n")

    data = Path(a.results) / f"{a.stamp}-loss.dat"
    with open(data, "w") as f:
        for loss in losses:
            row = [loss / 100] + [table[(p, m, loss)] for p in ("ib_write_bw", "ibv_rc_pingpong")
                                  for m in MODES]
            f.write(" ".join(f"{v}" for v in row) + "\n")
    png = Path(a.results) / f"{a.stamp}-loss.png"
    plot = f"""
set terminal pngcairo size 900,520
set output '{png}'
set title 'Goodput against loss between two softroce daemons (MTU 1024)'
set xlabel 'packets dropped (%)'
set ylabel 'Mbit/s'
set logscale y
set yrange [1:*]
set key outside right
set grid
plot '{data}' using 1:2 with linespoints title 'ib\\_write\\_bw, go-back-N', \\
     '{data}' using 1:3 with linespoints title 'ib\\_write\\_bw, selective', \\
     '{data}' using 1:4 with linespoints title 'rc\\_pingpong 1 MiB, go-back-N', \\
     '{data}' using 1:5 with linespoints title 'rc\\_pingpong 1 MiB, selective'
"""
    if subprocess.run(["gnuplot"], input=plot, text=True).returncode == 0:
        print(f"![goodput against loss]({png.name})\n")
        print(f"Plot: `bench/results/{png.name}` (data `{data.name}`).\n")


if __name__ == "__main__":
    main()
