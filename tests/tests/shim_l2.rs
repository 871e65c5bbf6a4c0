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
//! - ECN on the TAP device: CE marks a bridge (nftables) puts on ECT(0) frames, in RoCE
//!   v1's GRH and in v2's IPv4 and IPv6 headers, are seen and answered by CNPs.
//! - A TAP device and a `--addr` device on the kernel's UDP socket on the host side of the
//!   bridge, both roles.
//!
//! The programs' out-of-band TCP exchange (pingpong, perftest) runs over the namespace's
//! loopback; their RDMA traffic is TAP to TAP, across the bridge.

mod shim_support;

use shim_support::captures::{self, CaptureReport};
use shim_support::netns::{listening, Capture, Netns};
use shim_support::programs::{assert_fails_saying, rping_client, scratch, Logged};
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
fn tap_args<'a>(
    name: &'a str,
    tap: &'a str,
    n: u8,
    mode: &'a str,
    extra: &[&'a str],
) -> Vec<String> {
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
        self.ns
            .capture("br0", &self.dir.join(format!("{name}.pcap")))
    }
}

fn start(ns: &Netns, name: &str, args: &[String]) -> Daemon {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Daemon::start_in(name, Some(&ns.name), &args)
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
            && c[2..]
                .iter()
                .any(|v| v.parse::<f64>().is_ok_and(|x| x > 0.0))
    });
    assert!(
        nonzero,
        "no results: {}",
        run.report(&what, &[&pair.a, &pair.b])
    );
}

/// rdma_cm address resolution on the TAP device waits for the peer's Ethernet address, as the
/// kernel's on a netdev: `rping` to addresses on the link that nobody answers (ARP, neighbour
/// discovery) fails with `RDMA_CM_EVENT_ADDR_ERROR` -ETIMEDOUT in the 2 s rping gives
/// resolution, not when its REQs run out of retries a minute later; to an address off the
/// link (the device has no router), `rdma_resolve_addr` itself fails with ENETUNREACH.
fn nobody_answers_on_the_link(pair: &Pair, addrs: [&str; 2]) {
    let since = Instant::now();
    let expected = [
        (addrs[0], "RDMA_CM_EVENT_ADDR_ERROR, error -110"),
        (addrs[1], "RDMA_CM_EVENT_ADDR_ERROR, error -110"),
        ("10.99.0.1", "rdma_resolve_addr: Network is unreachable"),
    ];
    let clients = expected.map(|(addr, says)| {
        let log = pair.dir.join(format!("nobody-{addr}.log"));
        (addr, says, rping_client(&pair.a, addr, &[], log))
    });
    for (addr, says, mut c) in clients {
        assert_fails_saying(&mut c, &format!("rping to {addr}"), says, &pair.a);
    }
    assert!(
        since.elapsed() < Duration::from_secs(10),
        "{:?}",
        since.elapsed()
    );
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
    pingpong(
        &pair,
        "ibv_rc_pingpong",
        18801,
        0,
        &["-s", "4096", "-n", "100", "-c"],
    );
    pingpong(
        &pair,
        "ibv_rc_pingpong",
        18802,
        0,
        &["-s", "1048576", "-n", "5", "-c"],
    );
    pingpong(
        &pair,
        "ibv_ud_pingpong",
        18803,
        0,
        &["-s", "1024", "-n", "100", "-c"],
    );
    pingpong(
        &pair,
        "ibv_srq_pingpong",
        18804,
        0,
        &["-q", "4", "-s", "4096", "-n", "50", "-c"],
    );
    perftest(
        &pair,
        "ib_write_bw",
        18805,
        0,
        &["-s", "65536", "-n", "200"],
    );
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
    // Two softroce devices (`--loss-recovery auto`): they found each other with the
    // capability MAD in RoCE v1 framing (the capture holds v1 only) and their RC QPs use
    // selective retransmission (docs/loss-recovery.md).
    for d in [&pair.a, &pair.b] {
        let log = d.log();
        assert!(
            log.contains("peer is a softroce device")
                && log.contains("QP uses selective retransmission"),
            "{log}"
        );
    }
}

/// The capture's RoCE frames are all RoCE v2 (IPv4 or IPv6, UDP 4791); the others are ARP
/// or neighbour discovery only. Returns the IPv4 Identifications of the RoCE frames.
fn assert_v2_only(report: &CaptureReport, min: usize, file: &Path) -> Vec<u16> {
    assert_eq!(report.v1, 0, "{}: RoCE v1 frames", file.display());
    let others: Vec<_> = report
        .frames
        .iter()
        .filter(|f| !matches!(f.ethertype, 0x0800 | 0x86dd | 0x0806))
        .collect();
    assert!(others.is_empty(), "{}: {others:?}", file.display());
    assert!(
        report.v2 >= min,
        "{}: only {} RoCE v2 frames",
        file.display(),
        report.v2
    );
    report
        .frames
        .iter()
        .filter(|f| f.udp_dport == Some(4791))
        .filter_map(|f| f.ip_id)
        .collect()
}

#[test]
fn roce_v2_on_tap_over_ipv4_and_ipv6() {
    let pair = Pair::new("l2v2", "v2", "v2", &[], &[]);
    let cap = pair.capture("v2");
    // GID 1 is ::ffff:10.9.0.n (ARP), GID 2 is fd09::n (neighbour discovery).
    pingpong(
        &pair,
        "ibv_rc_pingpong",
        18811,
        1,
        &["-s", "4096", "-n", "100", "-c"],
    );
    pingpong(
        &pair,
        "ibv_rc_pingpong",
        18812,
        2,
        &["-s", "65536", "-n", "20", "-c"],
    );
    pingpong(
        &pair,
        "ibv_ud_pingpong",
        18813,
        2,
        &["-s", "1024", "-n", "50", "-c"],
    );
    rping(&pair, &pair.b, &pair.a, "10.9.0.2", 18814);
    rping(&pair, &pair.b, &pair.a, "fd09::2", 18815);
    // rdma_cm to the device's own address: its MADs loop back inside the device (no
    // neighbour to ask for them, nothing on the bridge), as rxe's do.
    rping(&pair, &pair.a, &pair.a, "10.9.0.1", 18816);
    rping(&pair, &pair.a, &pair.a, "fd09::1", 18817);
    let file = cap.stop();
    nobody_answers_on_the_link(&pair, ["10.9.0.77", "fd09::77"]);
    let report = captures::check(&file);
    let ids = assert_v2_only(&report, 500, &file);
    // The daemon wrote the IPv4 headers itself, with Identifications as the kernel gives
    // rxe's packets: per flow, mostly consecutive, not all zero. The ICRCs above were
    // checked over them.
    assert!(ids.len() > 200, "{} IPv4 RoCE frames", ids.len());
    let consecutive = ids
        .windows(2)
        .filter(|w| w[1] == w[0].wrapping_add(1))
        .count();
    assert!(ids.iter().any(|&i| i != 0), "all Identifications are 0");
    assert!(
        consecutive > ids.len() / 10,
        "{consecutive} of {}: {ids:?}",
        ids.len()
    );
    // Both families were resolved: ARP and neighbour discovery frames are there.
    assert!(
        report.ethertypes.contains_key(&0x0806),
        "{:?}",
        report.ethertypes
    );
    assert!(
        report
            .frames
            .iter()
            .any(|f| f.ethertype == 0x86dd && f.udp_dport.is_none()),
        "no neighbour discovery: {:?}",
        report.ethertypes
    );
}

#[test]
fn roce_both_frames_each_connection_by_its_gid_type() {
    // Each address twice: GID 0 fe80:: v1, 1 fe80:: v2, 2 ::ffff:10.9.0.n v1, 3 the same
    // v2, 4 fd09::n v1, 5 v2 (mlx5's order).
    let pair = Pair::new("l2both", "both", "both", &[], &[]);
    let devinfo = pair
        .a
        .run_preloaded(&require_program("ibv_devinfo"), &["-v", "-d", "srxe1"]);
    let gid_lines: Vec<&str> = devinfo.lines().filter(|l| l.contains("GID[")).collect();
    assert_eq!(gid_lines.len(), 6, "{devinfo}");
    for (i, l) in gid_lines.iter().enumerate() {
        let want = if i % 2 == 0 { "RoCE v1" } else { "RoCE v2" };
        assert!(l.ends_with(want), "GID {i}: {l}\n{devinfo}");
    }
    let cap = pair.capture("both");
    // Two connections at the same time, one per GID type, on the same addresses.
    std::thread::scope(|s| {
        let p = &pair;
        let v1 = s.spawn(move || {
            pingpong(
                p,
                "ibv_rc_pingpong",
                18821,
                2,
                &["-s", "4096", "-n", "300", "-c"],
            )
        });
        let v2 = s.spawn(move || {
            pingpong(
                p,
                "ibv_rc_pingpong",
                18822,
                3,
                &["-s", "4096", "-n", "300", "-c"],
            )
        });
        v1.join().unwrap();
        v2.join().unwrap();
    });
    let file = cap.stop();
    let report = captures::check(&file);
    assert!(report.v1 >= 600 && report.v2 >= 600, "{report:?}");
    // Each QP's packets, requests and ACKs alike, in one framing only (a QP is its host's
    // MAC and its number: both daemons hand out the same QPN blocks). QP1 is the device's
    // management QP on every GID: the daemons' capability MADs to a peer (the loss-recovery
    // negotiation) go in the framing of whichever connection reached it first, and both
    // may, when the two start together.
    let qps = |v1: bool| -> std::collections::BTreeSet<(String, u32)> {
        report
            .frames
            .iter()
            .filter(|f| (f.ethertype == 0x8915) == v1 && f.infiniband)
            .filter_map(|f| f.dest_qp.map(|q| (f.eth_dst.clone(), q)))
            .filter(|(_, q)| *q != 1)
            .collect()
    };
    let (q1, q2) = (qps(true), qps(false));
    assert!(!q1.is_empty() && !q2.is_empty());
    assert!(
        q1.is_disjoint(&q2),
        "QPs in both framings: v1 {q1:?} v2 {q2:?}"
    );
}

#[test]
fn rdma_cm_uses_the_default_roce_mode_and_the_passive_side_answers_in_kind() {
    // The client's device defaults rdma_cm to v1, the server's to v2: the server follows
    // the REQ, so the whole connection (MADs and data) is RoCE v1.
    let pair = Pair::new(
        "l2cm",
        "both",
        "both",
        &["--default-roce-mode", "v1"],
        &["--default-roce-mode", "v2"],
    );
    let cap = pair.capture("cm-v1");
    rping(&pair, &pair.b, &pair.a, "10.9.0.2", 18831);
    let file = cap.stop();
    let report = captures::check(&file);
    assert_v1_only(&report, 40, &file);
    // And the other way round: a v2 REQ gets v2 answers.
    let cap = pair.capture("cm-v2");
    rping(&pair, &pair.a, &pair.b, "10.9.0.1", 18832);
    let file = cap.stop();
    let report = captures::check(&file);
    assert_v2_only(&report, 40, &file);
}

/// The counter `name` in the daemon's "device stopped" line (its link counters).
fn stopped_counter(log: &str, name: &str) -> u64 {
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("device stopped"))
        .unwrap_or_else(|| panic!("no \"device stopped\" line:\n{log}"));
    let at = line
        .find(&format!("{name}: "))
        .unwrap_or_else(|| panic!("no {name} in: {line}"));
    line[at + name.len() + 2..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap()
}

/// The log's lines that say a packet of the wrong version was dropped.
fn mismatch_lines(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("dropped:") && l.contains("(see --roce)"))
        .collect()
}

#[test]
fn a_v2_client_against_a_v1_only_server_fails_clearly() {
    // A (the client) speaks v2 only, B (the server) v1 only. Short CM timeouts on A: its
    // REQ is retried twice, 3 × (2 · 2^(16-8) + 2^(12-8)) ms ≈ 1.6 s in all. B on go-back-N:
    // with `auto` its pingpong QP would probe A for selective retransmission in RoCE v1
    // (docs/loss-recovery.md), which A refuses and logs, and this test checks that A
    // receives nothing at all.
    let mut pair = Pair::new(
        "l2mis",
        "v2",
        "v1",
        &["--cm-response-timeout", "12", "--cm-max-retries", "2"],
        &["--loss-recovery", "gbn"],
    );

    // By hand: ibv_rc_pingpong's QP has timeout 14 (4.096 µs · 2^14 = 67 ms) and
    // retry_cnt 7: the first send and 7 retries, then RETRY_EXC_ERR, ~0.54 s after it
    // started sending.
    let args = ["-p", "18841", "-g", "1", "-s", "4096", "-n", "10"];
    let mut client = args.to_vec();
    client.push("127.0.0.1");
    let run = run_pair(
        &pair.dir,
        "mismatch-pingpong",
        &pair.b,
        &pair.a,
        "ibv_rc_pingpong",
        &args,
        &client,
        Some(18841),
        Duration::from_secs(1),
    );
    let what = "v2 ibv_rc_pingpong client against a v1-only server";
    assert!(
        run.client.is_some_and(|s| !s.success()),
        "{}",
        run.report(what, &[&pair.a, &pair.b])
    );
    assert!(
        run.client_out
            .contains("transport retry counter exceeded (12)"),
        "{}",
        run.report(what, &[&pair.a, &pair.b])
    );
    assert!(
        (Duration::from_millis(500)..Duration::from_secs(10)).contains(&run.client_time),
        "{}",
        run.report(what, &[&pair.a, &pair.b])
    );

    // By rdma_cm: rping's REQ goes unanswered, the client gets UNREACHABLE (-ETIMEDOUT).
    let server = ["-s", "-a", "10.9.0.2", "-p", "18842", "-C", "5", "-v"];
    let client = ["-c", "-a", "10.9.0.2", "-p", "18842", "-C", "5", "-v"];
    let run = run_pair(
        &pair.dir,
        "mismatch-rping",
        &pair.b,
        &pair.a,
        "rping",
        &server,
        &client,
        None,
        Duration::from_secs(1),
    );
    let what = "v2 rping client against a v1-only server";
    assert!(
        run.client.is_some_and(|s| !s.success())
            && run
                .client_out
                .contains("RDMA_CM_EVENT_UNREACHABLE, error -110"),
        "{}",
        run.report(what, &[&pair.a, &pair.b])
    );
    assert!(
        (Duration::from_millis(1200)..Duration::from_secs(10)).contains(&run.client_time),
        "{}",
        run.report(what, &[&pair.a, &pair.b])
    );

    // The server said why, once for the peer (both attempts came within a minute), and
    // counted every packet it refused: 8 data packets and 3 REQs at least.
    let log = pair.b.log();
    let lines = mismatch_lines(&log);
    assert_eq!(lines.len(), 1, "{log}");
    assert!(
        lines[0]
            .contains("RoCE v2 packet from 10.9.0.1 dropped: srxe2 is RoCE v1 only (see --roce)"),
        "{}",
        lines[0]
    );
    pair.b.stop_with(libc::SIGTERM);
    let refused = stopped_counter(&pair.b.log(), "rx_v2_refused");
    assert!(refused >= 11, "{refused} refused:\n{}", pair.b.log());
    // The client's device saw nothing refused: it never got an answer at all.
    assert!(mismatch_lines(&pair.a.log()).is_empty());
}

#[test]
fn a_v1_frame_at_a_v2_only_device_is_refused_and_logged() {
    let mut pair = Pair::new("l2mis1", "v1", "v2", &[], &[]);
    let args = ["-p", "18851", "-g", "0", "-s", "4096", "-n", "10"];
    let mut client = args.to_vec();
    client.push("127.0.0.1");
    let run = run_pair(
        &pair.dir,
        "mismatch-v1",
        &pair.b,
        &pair.a,
        "ibv_rc_pingpong",
        &args,
        &client,
        Some(18851),
        Duration::from_secs(1),
    );
    assert!(
        run.client_out
            .contains("transport retry counter exceeded (12)"),
        "{}",
        run.report("v1 client against a v2-only server", &[&pair.a, &pair.b])
    );
    let log = pair.b.log();
    let lines = mismatch_lines(&log);
    assert_eq!(lines.len(), 1, "{log}");
    assert!(
        lines[0].contains(
            "RoCE v1 frame from fe80::ff:fe09:1 dropped: srxe2 is RoCE v2 only (see --roce)"
        ),
        "{}",
        lines[0]
    );
    pair.b.stop_with(libc::SIGTERM);
    assert!(stopped_counter(&pair.b.log(), "rx_v1_refused") >= 8);
}

#[test]
fn a_tap_device_and_an_addr_device_on_the_host_side_talk_v2_both_ways() {
    // The bridge itself is the host's leg, 10.9.0.254: a softroce --addr device there uses
    // the kernel's UDP socket, ARP and IP; the TAP device behind tapa builds its own.
    let ns = Netns::new("l2host");
    ns.bridge("br0", &["tapa"], 1500, &["10.9.0.254/24"]);
    let dir = scratch("l2", "l2host");
    let tap = start(&ns, "l2host-tap", &tap_args("srxe1", "tapa", 1, "v2", &[]));
    let host = Daemon::start_in(
        "l2host-udp",
        Some(&ns.name),
        &[
            "--name",
            "srxe2",
            "--addr",
            "10.9.0.254",
            "--port",
            "4791",
            "--mtu",
            "1024",
        ],
    );
    let pair = Pair {
        a: tap,
        b: host,
        dir,
        ns,
    };
    let cap = pair.capture("host");
    // GID 1 of the TAP device is ::ffff:10.9.0.1; GID 0 of the host device its address.
    for (port, sd, cd, sg, cg) in [
        (18861u16, &pair.b, &pair.a, "0", "1"),
        (18862, &pair.a, &pair.b, "1", "0"),
    ] {
        let p = port.to_string();
        let server = ["-p", &p, "-g", sg, "-s", "4096", "-n", "100", "-c"];
        let client = [
            "-p",
            &p,
            "-g",
            cg,
            "-s",
            "4096",
            "-n",
            "100",
            "-c",
            "127.0.0.1",
        ];
        let run = run_pair(
            &pair.dir,
            &format!("host-pingpong-{port}"),
            sd,
            cd,
            "ibv_rc_pingpong",
            &server,
            &client,
            Some(port),
            Duration::from_secs(30),
        );
        run.assert_ok("TAP and --addr devices, ibv_rc_pingpong", &[sd, cd]);
    }
    rping(&pair, &pair.b, &pair.a, "10.9.0.254", 18863);
    rping(&pair, &pair.a, &pair.b, "10.9.0.1", 18864);
    let file = cap.stop();
    let report = captures::check(&file);
    assert_v2_only(&report, 400, &file);
    // The TAP device checks the IPv4 Identification it sees rather than solving for it, and
    // says so in the capability exchange: the --addr device sends it every packet as a
    // datagram of its own (a NIC's segmentation could number GSO segments otherwise).
    let host = shim_support::operator::counters(&pair.b, "srxe2");
    assert_eq!(host["net.tx_gso_sends"], 0, "{host:?}");
    let link = shim_support::operator::softroce_json(&pair.b, &["link", "show", "srxe2"]);
    assert_eq!(
        link[0]["peers"],
        serde_json::json!([{"addr": "10.9.0.1", "kind": "softroce", "selective": true, "any_ident": false}]),
        "{link}"
    );
}

/// Host `d`'s congestion-control counter `name` (mlx5's names, `Request::CongestionShow`).
fn cc_counter(d: &Daemon, name: &str) -> u64 {
    use proto::ctl::{Request, Response};
    match shim_support::daemon_request(&d.socket, "shim_l2", &Request::CongestionShow) {
        Some(Response::Congestion(devs)) => devs
            .iter()
            .flat_map(|dev| dev.counters.iter())
            .filter(|(n, _)| n == name)
            .map(|(_, v)| *v)
            .sum(),
        other => panic!("no congestion report: {other:?}\n{}", d.log()),
    }
}

/// `nft` inside the pair's namespace.
fn nft(pair: &Pair, args: &[&str]) -> String {
    let out = pair
        .ns
        .command(&require_program("nft"))
        .args(args)
        .output()
        .expect("run nft");
    shim_support::check_output(&format!("nft {args:?}"), out)
}

/// The packets nft's rule with comment `tag` counted.
fn nft_marked(pair: &Pair, tag: &str) -> u64 {
    let rules = nft(pair, &["list", "chain", "bridge", "cc", "marks"]);
    let line = rules
        .lines()
        .find(|l| l.contains(&format!("comment \"{tag}\"")))
        .unwrap_or_else(|| panic!("no rule {tag}: {rules}"));
    let at = line.find("packets ").expect("a counter") + "packets ".len();
    line[at..]
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap()
}

#[test]
fn ecn_on_the_tap_device_ce_marks_in_v1_and_v2_come_back_as_cnps() {
    // DCQCN (the default) on both; the rate floor at 200 Mbit/s keeps the marked runs short.
    let floor = ["--cc-param", "rpg_min_rate=200"];
    let pair = Pair::new("l2ecn", "both", "both", &floor, &floor);
    // The bridge is the congestion point: one in 20 of the frames from a to b that carry
    // ECT(0), RoCE v1's GRH traffic class (bits 10-11 of the GRH) or RoCE v2's IP header,
    // is marked CE (nft fixes the IPv4 header checksum). Only ECT(0) frames match: a
    // frame is marked only if the sender's data packets are ECN-capable.
    nft(&pair, &["add", "table", "bridge", "cc"]);
    nft(
        &pair,
        &[
            "add",
            "chain",
            "bridge",
            "cc",
            "marks",
            "{ type filter hook forward priority 0; }",
        ],
    );
    let from_a = ["ether", "saddr", MAC_A];
    let one_in_20 = ["numgen", "random", "mod", "20", "0"];
    let rules: [(&str, &[&str]); 3] = [
        ("v1", &["ether", "type", "0x8915", "@nh,10,2", "2"]),
        ("v2-ipv4", &["udp", "dport", "4791", "ip", "ecn", "ect0"]),
        ("v2-ipv6", &["udp", "dport", "4791", "ip6", "ecn", "ect0"]),
    ];
    for (tag, m) in rules {
        let set: &[&str] = match tag {
            "v1" => &["@nh,10,2", "set", "3"],
            "v2-ipv4" => &["ip", "ecn", "set", "ce"],
            _ => &["ip6", "ecn", "set", "ce"],
        };
        let mut args = vec!["add", "rule", "bridge", "cc", "marks"];
        args.extend(from_a);
        args.extend(m);
        args.extend(one_in_20);
        args.push("counter");
        args.extend(set);
        args.extend(["comment", tag]);
        nft(&pair, &args);
    }
    // GIDs of --roce both: 2 ::ffff:10.9.0.n v1, 3 the same v2, 5 fd09::n v2.
    for (tag, gid, port) in [
        ("v1", 2, 18841),
        ("v2-ipv4", 3, 18842),
        ("v2-ipv6", 5, 18843),
    ] {
        let before = (
            cc_counter(&pair.b, "np_ecn_marked_roce_packets"),
            cc_counter(&pair.b, "np_cnp_sent"),
            cc_counter(&pair.a, "rp_cnp_handled"),
        );
        perftest(
            &pair,
            "ib_write_bw",
            port,
            gid,
            &["-s", "65536", "-n", "200"],
        );
        let marked = nft_marked(&pair, tag);
        let ce = cc_counter(&pair.b, "np_ecn_marked_roce_packets") - before.0;
        let cnps = cc_counter(&pair.b, "np_cnp_sent") - before.1;
        let handled = cc_counter(&pair.a, "rp_cnp_handled") - before.2;
        println!(
            "{tag}: the bridge marked {marked}, b saw {ce} CE marks and sent {cnps} CNPs, \
             a handled {handled}"
        );
        // 200 x 64 KiB at MTU 1024 is 12,800 data packets: about 640 marked.
        assert!(
            marked >= 300,
            "{tag}: ECT(0) frames on the bridge: {marked}"
        );
        // (A frame can still be lost in a full TAP queue.)
        assert!(
            ce <= marked && ce * 10 >= marked * 9,
            "{tag}: the marks reached b's engine: {ce} of {marked}"
        );
        assert!(cnps > 0 && cnps <= ce, "{tag}: CNPs {cnps} for {ce} marks");
        assert!(
            handled <= cnps && handled * 10 >= cnps * 9,
            "{tag}: a's reaction point took the CNPs: {handled} of {cnps}"
        );
    }
    // The v1 CNPs went out as RoCE v1, the v2 ones as v2 (the pair has no other path).
    assert_eq!(cc_counter(&pair.a, "rp_cnp_ignored"), 0, "{}", pair.a.log());
}
