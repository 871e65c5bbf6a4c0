//! Debian's unmodified perftest (`ib_*_bw`, `ib_*_lat`) under LD_PRELOAD runs through softroce:
//! each test starts its own daemon on a private loopback address with the real RoCE v2 port
//! (4791), runs a server and a client of the same program on it (`-x 0`: GID index 0, the
//! device's address; `-F`: no CPU-frequency check) and checks that both exit 0 and that the
//! results table has a line with a non-zero bandwidth or latency.
//!
//! Every wait is bounded: a program that does not finish within [`RUN_LIMIT`] is killed and
//! the test fails with both programs' output and the daemon's log.

mod shim_support;

use std::process::Command;
use std::time::{Duration, Instant};

use shim_support::programs::{loopback_daemon, scratch, tcp_listening, Logged};
use shim_support::{require_program, Daemon};

/// How long one perftest pair may take before it counts as hung.
const RUN_LIMIT: Duration = Duration::from_secs(60);

/// Which figure of a results line must be non-zero.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// `#bytes #iterations BW-peak BW-average MsgRate`: the message rate, and the average.
    Bandwidth,
    /// `#bytes #iterations t_min t_max t_typical t_avg ...`: the minimum (so all are).
    Latency,
}

/// The results-table lines of perftest output: two integers (#bytes, #iterations) followed
/// by decimal figures.
fn result_lines(out: &str) -> Vec<Vec<f64>> {
    out.lines()
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() < 5
                || cols[0].parse::<u64>().is_err()
                || cols[1].parse::<u64>().is_err()
                || !cols[2].contains('.')
            {
                return None;
            }
            cols.iter().map(|c| c.parse::<f64>().ok()).collect()
        })
        .collect()
}

/// Runs `program ARGS` as server and client (`... 127.0.0.nn`) on `daemon`; both must exit 0
/// and every results line must carry a non-zero figure. Returns the client's results lines.
fn perftest(
    daemon: &Daemon,
    nn: u8,
    program: &str,
    port: u16,
    args: &[&str],
    kind: Kind,
) -> Vec<Vec<f64>> {
    let dir = scratch("perftest", &format!("{program}-{port}"));
    let path = require_program(program);
    let base = |cmd: &mut Command| {
        cmd.args(["-d", "srxe0", "-x", "0", "-F", "-p", &port.to_string()])
            .args(args);
    };
    let deadline = Instant::now() + RUN_LIMIT;

    let mut cmd = daemon.command(&path);
    base(&mut cmd);
    let mut server = Logged::spawn(cmd, dir.join("server.log"));
    while !tcp_listening(port) {
        if let Some(status) = server.wait_until(Instant::now()) {
            panic!(
                "{program} {args:?} server exited before listening ({status}):\n{}\n--- daemon\n{}",
                server.output(),
                daemon.log()
            );
        }
        assert!(
            Instant::now() < deadline,
            "{program} server never listened on {port}:\n{}",
            server.output()
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let mut cmd = daemon.command(&path);
    base(&mut cmd);
    cmd.arg(format!("127.0.0.{nn}"));
    let mut client = Logged::spawn(cmd, dir.join("client.log"));
    let client_status = client.wait_until(deadline);
    let server_status = server.wait_until(deadline);
    let report = || {
        format!(
            "{program} {args:?}\n--- server ({server_status:?})\n{}\n--- client ({client_status:?})\n{}\n--- daemon\n{}",
            server.output(),
            client.output(),
            daemon.log()
        )
    };
    assert!(
        client_status.is_some_and(|s| s.success()) && server_status.is_some_and(|s| s.success()),
        "perftest failed or hung (None: killed after {RUN_LIMIT:?}): {}",
        report()
    );
    let client_lines = result_lines(&client.output());
    assert!(
        !client_lines.is_empty(),
        "client printed no results: {}",
        report()
    );
    // Bandwidth: the message rate must be non-zero on every line (a 2-byte line rounds its
    // MB/sec to 0.00) and the average bandwidth on at least one client line.
    let (column, headline) = match kind {
        Kind::Bandwidth => (4, 3),
        Kind::Latency => (2, 2),
    };
    for line in client_lines
        .iter()
        .chain(result_lines(&server.output()).iter())
    {
        assert!(
            line.get(column).is_some_and(|v| *v > 0.0),
            "a results line has a zero {kind:?} figure ({line:?}): {}",
            report()
        );
    }
    assert!(
        client_lines
            .iter()
            .any(|l| l.get(headline).is_some_and(|v| *v > 0.0)),
        "no client results line has a non-zero {kind:?}: {}",
        report()
    );
    client_lines
}

/// The #iterations column of the first results line.
fn iterations(lines: &[Vec<f64>]) -> f64 {
    lines[0][1]
}

#[test]
fn rc_write_read_send_bandwidth() {
    let d = loopback_daemon("pt-rc-bw", 150);
    for (port, program) in [
        (18801, "ib_write_bw"),
        (18802, "ib_read_bw"),
        (18803, "ib_send_bw"),
    ] {
        let lines = perftest(&d, 150, program, port, &["-n", "50"], Kind::Bandwidth);
        assert_eq!(lines[0][0], 65536.0, "default size");
        assert_eq!(iterations(&lines), 50.0);
    }
}

#[test]
fn rc_atomic_bandwidth_fetch_add_and_compare_swap() {
    let d = loopback_daemon("pt-rc-atomic-bw", 151);
    for (port, op) in [(18811, "FETCH_AND_ADD"), (18812, "CMP_AND_SWAP")] {
        let lines = perftest(
            &d,
            151,
            "ib_atomic_bw",
            port,
            &["-n", "50", "-A", op],
            Kind::Bandwidth,
        );
        assert_eq!(lines[0][0], 8.0, "atomics move 8 bytes");
    }
}

#[test]
fn rc_latency_all_four() {
    let d = loopback_daemon("pt-rc-lat", 152);
    for (port, program) in [
        (18821, "ib_write_lat"),
        (18822, "ib_read_lat"),
        (18823, "ib_send_lat"),
        (18824, "ib_atomic_lat"),
    ] {
        let lines = perftest(&d, 152, program, port, &["-n", "50"], Kind::Latency);
        assert_eq!(iterations(&lines), 50.0);
    }
}

#[test]
fn uc_send_and_write() {
    let d = loopback_daemon("pt-uc", 153);
    perftest(
        &d,
        153,
        "ib_send_bw",
        18831,
        &["-c", "UC", "-n", "50"],
        Kind::Bandwidth,
    );
    perftest(
        &d,
        153,
        "ib_write_bw",
        18832,
        &["-c", "UC", "-n", "50"],
        Kind::Bandwidth,
    );
    perftest(
        &d,
        153,
        "ib_send_lat",
        18833,
        &["-c", "UC", "-n", "50"],
        Kind::Latency,
    );
    perftest(
        &d,
        153,
        "ib_write_lat",
        18834,
        &["-c", "UC", "-n", "50"],
        Kind::Latency,
    );
}

#[test]
fn ud_send_at_1024_byte_mtu() {
    let d = loopback_daemon("pt-ud", 154);
    // -m 1024: the engine sends UD messages up to the QP's path MTU (default 1024) rather
    // than the port's active MTU as rxe does, so perftest's default UD size (the port MTU,
    // 4096) is dropped by the requester; see the perftest task report.
    let lines = perftest(
        &d,
        154,
        "ib_send_bw",
        18841,
        &["-c", "UD", "-m", "1024", "-n", "50"],
        Kind::Bandwidth,
    );
    assert_eq!(lines[0][0], 1024.0);
    perftest(
        &d,
        154,
        "ib_send_lat",
        18842,
        &["-c", "UD", "-n", "50"],
        Kind::Latency,
    );
}

#[test]
fn one_four_and_sixteen_qps() {
    let d = loopback_daemon("pt-qps", 155);
    let mut port = 18851;
    for qps in [1u32, 4, 16] {
        for program in ["ib_write_bw", "ib_send_bw"] {
            let q = qps.to_string();
            let lines = perftest(
                &d,
                155,
                program,
                port,
                &["-q", &q, "-n", "50"],
                Kind::Bandwidth,
            );
            port += 1;
            // perftest reports iterations summed over the QPs.
            assert_eq!(
                iterations(&lines),
                f64::from(50 * qps),
                "{program} -q {qps}"
            );
        }
    }
}

#[test]
fn bidirectional() {
    let d = loopback_daemon("pt-bidir", 156);
    for (port, program) in [
        (18861, "ib_write_bw"),
        (18862, "ib_read_bw"),
        (18863, "ib_send_bw"),
    ] {
        perftest(&d, 156, program, port, &["-b", "-n", "50"], Kind::Bandwidth);
    }
}

#[test]
fn completion_events() {
    let d = loopback_daemon("pt-events", 157);
    // -e: ibv_req_notify_cq + ibv_get_cq_event on a completion channel. perftest itself
    // refuses -e for WRITE ("Events feature not available on WRITE verb").
    for (port, program) in [
        (18871, "ib_send_bw"),
        (18872, "ib_read_bw"),
        (18873, "ib_atomic_bw"),
    ] {
        perftest(&d, 157, program, port, &["-e", "-n", "50"], Kind::Bandwidth);
    }
    perftest(
        &d,
        157,
        "ib_send_lat",
        18874,
        &["-e", "-n", "50"],
        Kind::Latency,
    );
    perftest(
        &d,
        157,
        "ib_read_lat",
        18875,
        &["-e", "-n", "50"],
        Kind::Latency,
    );
}

#[test]
fn report_gbits() {
    let d = loopback_daemon("pt-gbits", 158);
    perftest(
        &d,
        158,
        "ib_write_bw",
        18881,
        &["--report_gbits", "-n", "50"],
        Kind::Bandwidth,
    );
}

#[test]
fn all_sizes_write_bw() {
    let d = loopback_daemon("pt-all-sizes", 159);
    let lines = perftest(
        &d,
        159,
        "ib_write_bw",
        18891,
        &["-a", "-n", "5"],
        Kind::Bandwidth,
    );
    let sizes: Vec<f64> = lines.iter().map(|l| l[0]).collect();
    // -a: every power of two from 2 bytes to 8 MiB.
    let expected: Vec<f64> = (1..=23).map(|e| f64::from(1u32 << e)).collect();
    assert_eq!(sizes, expected);
}

#[test]
fn srq_inline_and_post_lists() {
    let d = loopback_daemon("pt-srq-inline-list", 160);
    // --use-srq: receives through ibv_create_srq / ibv_post_srq_recv.
    perftest(
        &d,
        160,
        "ib_send_bw",
        18901,
        &["--use-srq", "-n", "50"],
        Kind::Bandwidth,
    );
    // -I 64: IBV_SEND_INLINE up to the granted max_inline_data.
    let lines = perftest(
        &d,
        160,
        "ib_send_bw",
        18902,
        &["-I", "64", "-s", "64", "-n", "50"],
        Kind::Bandwidth,
    );
    assert_eq!(lines[0][0], 64.0);
    perftest(
        &d,
        160,
        "ib_write_lat",
        18903,
        &["-I", "64", "-s", "32", "-n", "50"],
        Kind::Latency,
    );
    // -l 4: chains of four work requests per ibv_post_send.
    perftest(
        &d,
        160,
        "ib_write_bw",
        18904,
        &["-l", "4", "-n", "52"],
        Kind::Bandwidth,
    );
}

#[test]
fn ud_send_on_several_qps_and_both_ways() {
    let d = loopback_daemon("pt-ud-more", 161);
    let lines = perftest(
        &d,
        161,
        "ib_send_bw",
        18911,
        &["-c", "UD", "-q", "2", "-n", "50"],
        Kind::Bandwidth,
    );
    assert_eq!(iterations(&lines), 100.0);
    perftest(
        &d,
        161,
        "ib_send_bw",
        18912,
        &["-c", "UD", "-b", "-n", "50"],
        Kind::Bandwidth,
    );
}

/// perftest's default UD size is the port's active MTU (4096 here). Like kernel rxe
/// (`get_mtu()` in rxe_req.c: `qp->mtu` only for RC/UC), the engine limits UD messages by the
/// port MTU, not by a path MTU that UD QPs never set. (Before that fix, larger UD sends
/// completed without being sent and the server waited for ever.)
#[test]
fn ud_send_at_the_port_mtu() {
    let d = loopback_daemon("pt-ud-4096", 162);
    let lines = perftest(
        &d,
        162,
        "ib_send_bw",
        18921,
        &["-c", "UD", "-n", "50"],
        Kind::Bandwidth,
    );
    assert_eq!(lines[0][0], 4096.0);
}
