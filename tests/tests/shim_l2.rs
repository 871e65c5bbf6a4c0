//! The L2 device (`softroce daemon --tap`) end to end: two daemons, each on its own TAP
//! interface, both TAPs on one Linux bridge in a network namespace the test creates, and
//! rdma-core's unmodified programs (pingpongs, perftest, rping) through the shim.
//!
//! - RoCE v1 (`--roce v1`): every program; a capture on the bridge holds RoCE v1 frames
//!   (Ethertype 0x8915) and the ARP that resolved rping's addresses, nothing else; tshark
//!   decodes every frame as InfiniBand with no malformed or expert information;
//!   `softroce pcap check` and the oracle accept every ICRC.
//! - RoCE v2 on the TAP, IPv4 and IPv6, with the daemon building Ethernet, IP and UDP.
//! - `--roce both`: one connection on a v1 GID and one on a v2 GID at once, each framed by
//!   its GID type; rdma_cm's `--default-roce-mode` picks the type, the passive side answers
//!   in the REQ's.
//! - A v2 client against a v1-only server: the client's error, the server's log line and
//!   counter, and the time it took.
//! - A TAP device and a `--addr` device on the kernel's UDP socket on the host side of the
//!   bridge, both roles.
//!
//! The programs' out-of-band TCP exchange (pingpong, perftest) runs over the namespace's
//! loopback; their RDMA traffic is TAP to TAP, across the bridge.

mod shim_support;

use shim_support::captures::{self, CaptureReport};
use shim_support::netns::{Capture, Netns};
use shim_support::programs::{scratch, Logged};
use shim_support::{require_program, Daemon};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const RUN_LIMIT: Duration = Duration::from_secs(120);
const MAC_A: &str = "02:00:00:09:00:01";
const MAC_B: &str = "02:00:00:09:00:02";

/// Two daemons on TAPs `tapa` and `tapb` bridged by `br0` in a namespace of their own.
struct Pair {
    a: Daemon,
    b: Daemon,
    dir: PathBuf,
    // Dropped last: the daemons stop before their namespace goes.
    ns: Netns,
}

/// Daemon arguments for a TAP device `name` on `tap`, `n` = 1 or 2 (its addresses
/// 10.9.0.n/24 and fd09::n/64), RoCE `mode`, then `extra`.
fn tap_args<'a>(name: &'a str, tap: &'a str, n: u8, mode: &'a str, extra: &[&'a str]) -> Vec<String> {
    let mac = if n == 1 { MAC_A } else { MAC_B };
    let mut v: Vec<String> = [
        "--name", name, "--tap", tap, "--roce", mode, "--mac", mac, "--mtu", "1024",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.push("--addr".into());
    v.push(format!("10.9.0.{n}/24"));
    v.push("--addr".into());
    v.push(format!("fd09::{n}/64"));
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

impl Pair {
    fn new(tag: &str, mode_a: &str, mode_b: &str, extra_a: &[&str], extra_b: &[&str]) -> Pair {
        let ns = Netns::new(tag);
        ns.bridge("br0", &["tapa", "tapb"], 1500, &[]);
        let dir = scratch("l2", tag);
        let args_a = tap_args("srxe1", "tapa", 1, mode_a, extra_a);
        let args_b = tap_args("srxe2", "tapb", 2, mode_b, extra_b);
        let a = start(&ns, &format!("{tag}-a"), &args_a);
        let b = start(&ns, &format!("{tag}-b"), &args_b);
        Pair { a, b, dir, ns }
    }

    fn capture(&self, name: &str) -> Capture {
        self.ns.capture("br0", &self.dir.join(format!("{name}.pcap")))
    }
}

fn start(ns: &Netns, name: &str, args: &[String]) -> Daemon {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Daemon::start_in(Some(ns), name, &args)
}

/// Whether process `pid` (inside the namespace) sees something listening on TCP `port`.
fn listening(pid: u32, port: u16) -> bool {
    let needle = format!(":{port:04X} ");
    ["tcp", "tcp6"].iter().any(|f| {
        std::fs::read_to_string(format!("/proc/{pid}/net/{f}"))
            .unwrap_or_default()
            .lines()
            .any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.get(1)
                    .is_some_and(|local| format!("{local} ").ends_with(&needle))
                    && cols.get(3) == Some(&"0A")
            })
    })
}

/// One finished run of a server and a client.
struct Run {
    server: Option<std::process::ExitStatus>,
    client: Option<std::process::ExitStatus>,
    server_out: String,
    client_out: String,
    /// From the client's start to its exit.
    client_time: Duration,
}

impl Run {
    fn report(&self, what: &str, daemons: &[&Daemon]) -> String {
        let mut s = format!(
            "{what}\n--- server ({:?})\n{}\n--- client ({:?}, {:?})\n{}",
            self.server, self.server_out, self.client, self.client_time, self.client_out
        );
        for (i, d) in daemons.iter().enumerate() {
            s += &format!("\n--- daemon {i}\n{}", d.log());
        }
        s
    }

    fn assert_ok(&self, what: &str, daemons: &[&Daemon]) {
        assert!(
            self.server.is_some_and(|s| s.success()) && self.client.is_some_and(|s| s.success()),
            "{}",
            self.report(what, daemons)
        );
    }
}

/// Runs `program` as a server on `sd` (`server_args`) and as a client on `cd`
/// (`client_args`); with `port`, the client starts once the server listens on it (TCP).
/// The server gets `server_grace` after the client's exit before it is killed.
#[allow(clippy::too_many_arguments)]
fn run_pair(
    dir: &Path,
    name: &str,
    sd: &Daemon,
    cd: &Daemon,
    program: &str,
    server_args: &[&str],
    client_args: &[&str],
    port: Option<u16>,
    server_grace: Duration,
) -> Run {
    let exe = require_program(program);
    let mut cmd = sd.command(&exe);
    cmd.args(server_args);
    let mut server = Logged::spawn(cmd, dir.join(format!("{name}-server.log")));
    let deadline = Instant::now() + Duration::from_secs(30);
    match port {
        Some(p) => {
            while !listening(server.child.id(), p) {
                if server.wait_for(Duration::ZERO).is_some() {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{name}: server never listened:\n{}",
                    server.output()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        // rdma_cm servers: give the listen a moment (rping prints nothing until connected).
        None => std::thread::sleep(Duration::from_millis(500)),
    }
    let mut cmd = cd.command(&exe);
    cmd.args(client_args);
    let t0 = Instant::now();
    let mut client = Logged::spawn(cmd, dir.join(format!("{name}-client.log")));
    let client_status = client.wait_for(RUN_LIMIT);
    let client_time = t0.elapsed();
    let server_status = server.wait_for(if client_status.is_some() {
        server_grace
    } else {
        Duration::ZERO
    });
    Run {
        server: server_status,
        client: client_status,
        server_out: server.output(),
        client_out: client.output(),
        client_time,
    }
}

/// An `ibv_*_pingpong` pair on GID index `gid` (both sides), over TCP `port`.
fn pingpong(pair: &Pair, program: &str, port: u16, gid: u8, args: &[&str]) {
    pingpong_on(pair, &pair.b, &pair.a, program, port, gid, args);
}

#[allow(clippy::too_many_arguments)]
fn pingpong_on(
    pair: &Pair,
    sd: &Daemon,
    cd: &Daemon,
    program: &str,
    port: u16,
    gid: u8,
    args: &[&str],
) {
    let (port_s, gid_s) = (port.to_string(), gid.to_string());
    let mut common: Vec<&str> = vec!["-p", &port_s, "-g", &gid_s];
    common.extend_from_slice(args);
    let mut client = common.clone();
    client.push("127.0.0.1");
    let name = format!("{program}-{port}");
    let run = run_pair(
        &pair.dir,
        &name,
        sd,
        cd,
        program,
        &common,
        &client,
        Some(port),
        Duration::from_secs(30),
    );
    let what = format!("{program} {args:?} on GID {gid}");
    run.assert_ok(&what, &[sd, cd]);
    for out in [&run.server_out, &run.client_out] {
        assert!(
            out.contains(" bytes in ") && out.contains(" iters in "),
            "{}",
            run.report(&what, &[sd, cd])
        );
    }
}

/// A perftest pair (`-x gid -F`), its results table checked for a non-zero figure.
fn perftest(pair: &Pair, program: &str, port: u16, gid: u8, args: &[&str]) {
    let (port_s, gid_s) = (port.to_string(), gid.to_string());
    let mut common: Vec<&str> = vec!["-p", &port_s, "-x", &gid_s, "-F"];
    common.extend_from_slice(args);
    let mut client = common.clone();
    client.push("127.0.0.1");
    let name = format!("{program}-{port}");
    let run = run_pair(
        &pair.dir,
        &name,
        &pair.b,
        &pair.a,
        program,
        &common,
        &client,
        Some(port),
        Duration::from_secs(30),
    );
    let what = format!("{program} {args:?}");
    run.assert_ok(&what, &[&pair.a, &pair.b]);
    let nonzero = run.client_out.lines().any(|l| {
        let c: Vec<&str> = l.split_whitespace().collect();
        c.len() >= 5
            && c[0].parse::<u64>().is_ok()
            && c[1].parse::<u64>().is_ok()
            && c[2..].iter().any(|v| v.parse::<f64>().is_ok_and(|x| x > 0.0))
    });
    assert!(nonzero, "no results: {}", run.report(&what, &[&pair.a, &pair.b]));
}

/// `rping -C 20 -v` (data checked: rping compares every buffer it reads back) from `cd` to
/// the server `sd` at `addr`.
fn rping(pair: &Pair, sd: &Daemon, cd: &Daemon, addr: &str, port: u16) {
    let port_s = port.to_string();
    let server = ["-s", "-a", addr, "-p", &port_s, "-C", "20", "-v"];
    let client = ["-c", "-a", addr, "-p", &port_s, "-C", "20", "-v"];
    let run = run_pair(
        &pair.dir,
        &format!("rping-{port}"),
        sd,
        cd,
        "rping",
        &server,
        &client,
        None,
        Duration::from_secs(30),
    );
    let what = format!("rping to {addr}");
    run.assert_ok(&what, &[sd, cd]);
    // -v prints each ping's data: 20 lines on each side.
    for out in [&run.server_out, &run.client_out] {
        let pings = out.lines().filter(|l| l.contains("ping data:")).count();
        assert_eq!(pings, 20, "{}", run.report(&what, &[sd, cd]));
    }
}

/// The capture's frames other than RoCE v1 are ARP only (rping resolving addresses), and
/// the RoCE ones number at least `min`.
fn assert_v1_only(report: &CaptureReport, min: usize, file: &Path) {
    let others: Vec<_> = report
        .ethertypes
        .iter()
        .filter(|(t, _)| !matches!(**t, 0x8915 | 0x0806))
        .collect();
    assert!(
        others.is_empty() && report.v2 == 0,
        "{}: frames other than RoCE v1 and ARP: {:?}",
        file.display(),
        report.ethertypes
    );
    assert!(
        report.v1 >= min,
        "{}: only {} RoCE v1 frames",
        file.display(),
        report.v1
    );
}

#[test]
fn roce_v1_pair_runs_every_program_and_the_bridge_carries_only_roce_v1() {
    let pair = Pair::new("l2v1", "v1", "v1", &[], &[]);
    // ibv_devinfo -v reports the types as a kernel device does.
    let devinfo = pair
        .a
        .run_preloaded(&require_program("ibv_devinfo"), &["-v", "-d", "srxe1"]);
    assert!(
        devinfo.contains("link_layer:\t\tEthernet") && devinfo.contains("RoCE v1"),
        "{devinfo}"
    );
    assert!(!devinfo.contains("RoCE v2"), "{devinfo}");
    let cap = pair.capture("v1");
    // GID 0 is the fe80:: EUI-64 address: the peer's MAC follows from it, no resolution.
    pingpong(&pair, "ibv_rc_pingpong", 18801, 0, &["-s", "4096", "-n", "100", "-c"]);
    pingpong(&pair, "ibv_rc_pingpong", 18802, 0, &["-s", "1048576", "-n", "5", "-c"]);
    pingpong(&pair, "ibv_ud_pingpong", 18803, 0, &["-s", "1024", "-n", "100", "-c"]);
    pingpong(&pair, "ibv_srq_pingpong", 18804, 0, &["-q", "4", "-s", "4096", "-n", "50", "-c"]);
    perftest(&pair, "ib_write_bw", 18805, 0, &["-s", "65536", "-n", "200"]);
    perftest(&pair, "ib_read_bw", 18806, 0, &["-s", "65536", "-n", "200"]);
    perftest(&pair, "ib_atomic_bw", 18807, 0, &["-n", "200"]);
    // rdma_cm on IPv4 addresses: ARP, then CM MADs and data on RoCE v1 (--roce v1 makes
    // rdma_cm's default mode v1).
    rping(&pair, &pair.b, &pair.a, "10.9.0.2", 18808);
    let file = cap.stop();
    let report = captures::check(&file);
    assert_v1_only(&report, 1000, &file);
    assert!(
        report.ethertypes.get(&0x0806).copied().unwrap_or(0) >= 2,
        "rping's addresses were resolved by ARP: {:?}",
        report.ethertypes
    );
}
