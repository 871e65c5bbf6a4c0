//! rdma-core's unmodified `ibv_*_pingpong` examples under LD_PRELOAD move data through
//! softroce: each test starts its own daemon on a private loopback address with the real RoCE
//! v2 port (4791), runs a server and a client (`-g 0`: the device's first GID, its address)
//! and checks that both exit 0 and report their transfer ("N bytes in S seconds").
//!
//! Every wait is bounded: a program that does not finish is killed and the test fails with
//! both programs' output and the daemon's log.

mod shim_support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use shim_support::netns::{ip, TwoHosts};
use shim_support::operator::{counters, delta};
use shim_support::programs::{loopback_daemon, scratch, tcp_listening, Logged};
use shim_support::{check_output, require_program, softroce_bin, Daemon};

/// How long one pingpong run may take before it counts as hung.
const RUN_LIMIT: Duration = Duration::from_secs(120);

/// Starts `program` as a server on `daemon`, waiting until it listens on `port`.
fn start_server(daemon: &Daemon, program: &str, port: u16, args: &[&str], dir: &Path) -> Logged {
    start_server_until(daemon, program, port, args, dir, || tcp_listening(port))
}

/// [`start_server`], waiting until `listening` says the server listens (in the daemon's
/// network namespace, where the test's own view does not reach).
fn start_server_until(
    daemon: &Daemon,
    program: &str,
    port: u16,
    args: &[&str],
    dir: &Path,
    listening: impl Fn() -> bool,
) -> Logged {
    let mut cmd = daemon.command(&require_program(program));
    cmd.args(["-d", "srxe0", "-g", "0", "-p", &port.to_string()])
        .args(args);
    let mut server = Logged::spawn(cmd, dir.join(format!("{program}-{port}-server.log")));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !listening() {
        if let Some(status) = server.wait_for(Duration::ZERO) {
            panic!(
                "{program} server exited before listening ({status}):\n{}\n--- daemon\n{}",
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
    server
}

/// Starts `program` as a client on `daemon` of the server at `server` (its out-of-band TCP).
fn start_client(
    daemon: &Daemon,
    program: &str,
    port: u16,
    args: &[&str],
    dir: &Path,
    server: &str,
) -> Logged {
    let mut cmd = daemon.command(&require_program(program));
    cmd.args(["-d", "srxe0", "-g", "0", "-p", &port.to_string()])
        .args(args)
        .arg(server);
    Logged::spawn(cmd, dir.join(format!("{program}-{port}-client.log")))
}

/// Runs a server on `server_daemon` and a client on `client_daemon`; both must exit 0 and
/// print their throughput lines. Returns (server output, client output).
fn pingpong(
    server_daemon: &Daemon,
    client_daemon: &Daemon,
    program: &str,
    port: u16,
    args: &[&str],
) -> (String, String) {
    let dir = scratch("pingpong", program);
    let mut server = start_server(server_daemon, program, port, args, &dir);
    let mut client = start_client(client_daemon, program, port, args, &dir, "127.0.0.1");
    let client_status = client.wait_for(RUN_LIMIT);
    let server_status = server.wait_for(if client_status.is_some() {
        Duration::from_secs(30)
    } else {
        Duration::ZERO
    });
    let report = || {
        format!(
            "{program} {args:?}\n--- server ({server_status:?})\n{}\n--- client ({client_status:?})\n{}\n--- daemon\n{}",
            server.output(),
            client.output(),
            server_daemon.log()
        )
    };
    assert!(
        client_status.is_some_and(|s| s.success()) && server_status.is_some_and(|s| s.success()),
        "pingpong failed or hung: {}",
        report()
    );
    for (side, out) in [("server", server.output()), ("client", client.output())] {
        assert!(
            out.contains(" bytes in ") && out.contains(" iters in "),
            "{side} printed no throughput: {}",
            report()
        );
    }
    (server.output(), client.output())
}

/// The byte count of the "N bytes in S seconds" line.
fn bytes_moved(out: &str) -> u64 {
    out.lines()
        .find_map(|l| {
            l.split_once(" bytes in ")
                .map(|(n, _)| n.trim().parse().ok())
        })
        .flatten()
        .unwrap_or_else(|| panic!("no byte count in:\n{out}"))
}

#[test]
fn rc_pingpong_default() {
    let d = loopback_daemon("pp-rc-default", 21);
    let (server, client) = pingpong(&d, &d, "ibv_rc_pingpong", 18601, &["-n", "200"]);
    // 200 exchanges of the default 4096 bytes, each way (rc_pingpong counts both).
    assert_eq!(bytes_moved(&server), 2 * 200 * 4096);
    assert_eq!(bytes_moved(&client), 2 * 200 * 4096);
}

#[test]
fn rc_pingpong_sizes_including_inline_and_multi_packet() {
    let d = loopback_daemon("pp-rc-sizes", 22);
    // 1 byte goes inline (rc_pingpong asks for it when max_inline_data allows); 1 MiB is
    // a thousand packets per message at the default 1024-byte path MTU.
    for (port, size, iters) in [
        (18611, "1", "20"),
        (18612, "4096", "20"),
        (18613, "1048576", "3"),
    ] {
        let (server, _) = pingpong(
            &d,
            &d,
            "ibv_rc_pingpong",
            port,
            &["-s", size, "-n", iters, "-c"],
        );
        let size: u64 = size.parse().unwrap();
        let iters: u64 = iters.parse().unwrap();
        assert_eq!(bytes_moved(&server), 2 * size * iters);
    }
}

#[test]
fn rc_pingpong_with_completion_events() {
    let d = loopback_daemon("pp-rc-events", 23);
    pingpong(&d, &d, "ibv_rc_pingpong", 18621, &["-e", "-n", "100"]);
}

#[test]
fn rc_pingpong_path_mtus() {
    let d = loopback_daemon("pp-rc-mtu", 24);
    pingpong(
        &d,
        &d,
        "ibv_rc_pingpong",
        18631,
        &["-m", "1024", "-s", "8192", "-n", "20"],
    );
    pingpong(
        &d,
        &d,
        "ibv_rc_pingpong",
        18632,
        &["-m", "4096", "-s", "8192", "-n", "20"],
    );
}

#[test]
fn rc_pingpong_with_the_ibv_wr_send_api() {
    let d = loopback_daemon("pp-rc-new-send", 32);
    // -N: ibv_create_qp_ex with send ops, ibv_wr_start/ibv_wr_send/ibv_wr_set_sge (or the
    // inline setter for 1 byte)/ibv_wr_complete.
    pingpong(&d, &d, "ibv_rc_pingpong", 18701, &["-N", "-n", "50"]);
    pingpong(
        &d,
        &d,
        "ibv_rc_pingpong",
        18702,
        &["-N", "-s", "1", "-n", "50"],
    );
}

#[test]
fn uc_pingpong() {
    let d = loopback_daemon("pp-uc", 25);
    pingpong(&d, &d, "ibv_uc_pingpong", 18641, &["-n", "100"]);
}

#[test]
fn ud_pingpong() {
    let d = loopback_daemon("pp-ud", 26);
    let (server, _) = pingpong(&d, &d, "ibv_ud_pingpong", 18651, &["-n", "100"]);
    // ud_pingpong's 2048-byte default is cut to the port's active MTU (1024 here).
    assert_eq!(bytes_moved(&server), 2 * 100 * 1024);
    pingpong(&d, &d, "ibv_ud_pingpong", 18652, &["-e", "-n", "50"]);
}

#[test]
fn srq_pingpong() {
    let d = loopback_daemon("pp-srq", 27);
    pingpong(&d, &d, "ibv_srq_pingpong", 18661, &["-n", "50"]);
    pingpong(
        &d,
        &d,
        "ibv_srq_pingpong",
        18662,
        &["-e", "-q", "4", "-n", "50"],
    );
}

#[test]
fn pingpongs_across_two_daemons() {
    let a = loopback_daemon("pp-two-a", 28);
    let b = loopback_daemon("pp-two-b", 29);
    let (server, client) = pingpong(&a, &b, "ibv_rc_pingpong", 18671, &["-n", "100"]);
    // Each side saw the other daemon's address as the remote GID.
    assert!(server.contains("GID ::ffff:127.0.0.29"), "{server}");
    assert!(client.contains("GID ::ffff:127.0.0.28"), "{client}");
    pingpong(&a, &b, "ibv_ud_pingpong", 18672, &["-n", "50"]);
    pingpong(&a, &b, "ibv_uc_pingpong", 18673, &["-n", "50"]);
    pingpong(&a, &b, "ibv_srq_pingpong", 18674, &["-n", "50"]);
    pingpong(
        &a,
        &b,
        "ibv_rc_pingpong",
        18675,
        &["-s", "1048576", "-n", "5", "-c"],
    );
}

/// RC between two hosts over IPv6 (two namespaces on a veth). Each 1 MiB message crosses the
/// daemons' UDP sockets as GSO sends (IPv6 uses GSO on any path) and arrives in GRO
/// aggregates, whose segments the receiving link hands to the engine with their IPv6 and UDP
/// headers rebuilt in the receive buffer itself, over the last 48 bytes of the segment
/// before. `-c` compares every buffer; the receiver's counters show the aggregates.
#[test]
fn rc_pingpong_over_ipv6_between_two_hosts() {
    let hosts = TwoHosts::new("pp6", ["fd00:94::1", "fd00:94::2"]);
    let [ns_a, ns_b] = &hosts.names;
    // The programs' out-of-band exchange is TCP over IPv4 (their server listens on IPv4
    // only); the devices have the IPv6 addresses alone, so every RoCE packet is IPv6.
    for (ns, dev, addr) in [
        (ns_a, "mc6a", "10.94.0.1/24"),
        (ns_b, "mc6b", "10.94.0.2/24"),
    ] {
        ip(&["-n", ns, "addr", "add", addr, "dev", dev]);
    }
    let a = Daemon::start_in(
        "pp6-a",
        Some(ns_a),
        &["--addr", "fd00:94::1", "--port", "4791"],
    );
    let b = Daemon::start_in(
        "pp6-b",
        Some(ns_b),
        &["--addr", "fd00:94::2", "--port", "4791"],
    );
    let before = counters(&b, "srxe0");
    let args = ["-s", "1048576", "-n", "5", "-c"];
    let dir = scratch("pingpong", "rc-ipv6-two-hosts");
    let program = "ibv_rc_pingpong";
    let listening = || {
        let ss = Command::new("ip")
            .args(["netns", "exec", ns_b, "ss", "-Hltn", "sport = :18676"])
            .output()
            .expect("run ss in the namespace");
        !String::from_utf8_lossy(&ss.stdout).trim().is_empty()
    };
    let mut server = start_server_until(&b, program, 18676, &args, &dir, listening);
    let mut client = start_client(&a, program, 18676, &args, &dir, "10.94.0.2");
    let client_status = client.wait_for(RUN_LIMIT);
    let server_status = server.wait_for(Duration::from_secs(30));
    let report = format!(
        "--- server ({server_status:?})\n{}\n--- client ({client_status:?})\n{}\n--- daemon a\n{}\n--- daemon b\n{}",
        server.output(),
        client.output(),
        a.log(),
        b.log()
    );
    assert!(
        client_status.is_some_and(|s| s.success()) && server_status.is_some_and(|s| s.success()),
        "IPv6 pingpong failed or hung: {report}"
    );
    for out in [server.output(), client.output()] {
        assert_eq!(bytes_moved(&out), 2 * 5 * 1048576, "{report}");
    }
    assert!(client.output().contains("GID fd00:94::2"), "{report}");
    let after = counters(&b, "srxe0");
    assert!(
        delta(&before, &after, "net.rx_gro_batches") > 0,
        "no GRO aggregate reached the receiver: {after:?}"
    );
    assert_eq!(delta(&before, &after, "net.rx_bad_icrc"), 0, "{after:?}");
}

#[test]
fn xsrq_pingpong_fails_clearly() {
    let d = loopback_daemon("pp-xsrq", 30);
    let out = d
        .command(&require_program("ibv_xsrq_pingpong"))
        .args(["-d", "srxe0", "-g", "0", "-p", "18681"])
        .output()
        .expect("run ibv_xsrq_pingpong");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // XRC is not offered (as on rxe): ibv_open_xrcd fails with EOPNOTSUPP (95).
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("Couldn't Open the XRC Domain 95"),
        "unexpected failure: {text}"
    );
}

fn res_show(d: &Daemon) -> String {
    let out = Command::new(softroce_bin())
        .args(["res", "show", "--socket"])
        .arg(&d.socket)
        .output()
        .expect("softroce res show");
    check_output("softroce res show", out)
}

/// The QP count `softroce res show` lists for process `pid` (0 if not listed).
fn qps_of(shown: &str, pid: u32) -> u32 {
    shown
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|c| c.get(1) == Some(&pid.to_string().as_str()))
        .and_then(|c| c.get(7).and_then(|q| q.parse().ok()))
        .unwrap_or(0)
}

fn lists_pid(shown: &str, pid: u32) -> bool {
    shown
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(&pid.to_string()))
}

#[test]
fn killed_pingpong_is_cleaned_up_and_the_device_keeps_working() {
    let d = loopback_daemon("pp-kill", 31);
    let dir = scratch("pingpong", "kill");
    let args = ["-e", "-n", "100000000", "-s", "65536"];
    let mut server = start_server(&d, "ibv_rc_pingpong", 18691, &args, &dir);
    let mut client = start_client(&d, "ibv_rc_pingpong", 18691, &args, &dir, "127.0.0.1");
    // Mid-run: both programs hold their QP (stdout is a file, so their address lines are
    // still buffered) and have had time to connect and move data.
    let client_pid = client.child.id();
    let server_pid = server.child.id();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let shown = res_show(&d);
        if qps_of(&shown, client_pid) >= 1 && qps_of(&shown, server_pid) >= 1 {
            break;
        }
        assert!(
            Instant::now() < deadline && client.wait_for(Duration::ZERO).is_none(),
            "pingpong never created its QPs:\n{shown}\n--- client\n{}\n--- server\n{}",
            client.output(),
            server.output()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        client.wait_for(Duration::ZERO).is_none(),
        "client ended early:\n{}",
        client.output()
    );
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(client_pid as libc::pid_t, libc::SIGKILL) };
    let status = client.wait_for(Duration::from_secs(10));
    assert!(status.is_some(), "SIGKILLed client did not die");

    // The daemon notices the closed control socket and drops everything the client held.
    let deadline = Instant::now() + Duration::from_secs(10);
    while lists_pid(&res_show(&d), client_pid) {
        assert!(
            Instant::now() < deadline,
            "dead client still listed:\n{}",
            res_show(&d)
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // The survivor gets a failed completion and exits: IBV_WC_REM_OP_ERR when a message
    // reached the dead process's engine after its memory was gone, IBV_WC_RETRY_EXC_ERR after
    // seven retries to a QP that no longer exists (the engine counts retry_cnt 7 as seven, as
    // IBTA does, not as "forever" as rxe does). Only a survivor whose own messages were all
    // acknowledged and that waits to receive cannot be told; that case is bounded and stopped.
    match server.wait_for(Duration::from_secs(10)) {
        Some(status) => {
            eprintln!("the peer failed: {}", server.output());
            assert!(!status.success(), "server: {}", server.output());
            assert!(
                server.output().contains("Failed status"),
                "server did not report the failed completion:\n{}",
                server.output()
            );
        }
        None => {
            eprintln!("the peer only waits to receive; stopped");
            server.kill();
        }
    }

    // The device still works for a new pair.
    pingpong(&d, &d, "ibv_rc_pingpong", 18692, &["-n", "50"]);
    let shown = res_show(&d);
    assert!(!lists_pid(&shown, client_pid), "{shown}");
}
