//! The same-host fast path (docs/architecture.md, "The same-host fast path") with unmodified
//! programs: two processes of one user on one daemon run their RC traffic in their own
//! processes (the daemon grants *directions*, `device_fast_grants` counts them), and what
//! they see is what the daemon's own path gives them: the same bytes (`ibv_rc_pingpong -c`
//! checks every buffer), the same message counters, no errors. Processes of two users, or a
//! shim with `SOFTROCE_FAST_PATH=0`, or a daemon that sends local packets through its link
//! (`--local-via-socket`), stay on the daemon's path (no grant) and still work.
//!
//! Every wait is bounded: a program that does not finish is killed and the test fails with
//! both programs' output and the daemon's log.

mod shim_support;

use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use proto::ctl::{self, Request, Response};
use shim_support::programs::{loopback_daemon, scratch, tcp_listening, Logged};
use shim_support::{compile_c, require_program, shim_libs, Daemon};

const RUN_LIMIT: Duration = Duration::from_secs(120);
const NOBODY: u32 = 65534;

/// The daemon's counters of device srxe0, by name, straight from the control protocol.
fn counters(daemon: &Daemon) -> Vec<(String, u64)> {
    use nix::sys::socket::{
        connect, recv, send, socket, AddressFamily, MsgFlags, SockFlag, SockType, UnixAddr,
    };
    let fd = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .expect("socket");
    connect(fd.as_raw_fd(), &UnixAddr::new(&daemon.socket).unwrap()).expect("connect");
    let mut buf = vec![0u8; ctl::MAX_MESSAGE];
    let mut ask = |req: Request| -> Response {
        send(
            fd.as_raw_fd(),
            &ctl::encode(&req).unwrap(),
            MsgFlags::empty(),
        )
        .unwrap();
        let n = recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()).unwrap();
        ctl::decode(&buf[..n]).unwrap()
    };
    let hello = ask(Request::Hello {
        version: ctl::PROTOCOL_VERSION,
        program: "fast-path-e2e".into(),
    });
    assert!(matches!(hello, Response::Hello { .. }), "{hello:?}");
    match ask(Request::Counters) {
        Response::Counters(devs) => {
            devs.into_iter()
                .find(|d| d.device == "srxe0")
                .expect("srxe0's counters")
                .counters
        }
        other => panic!("Counters answered {other:?}"),
    }
}

fn get(c: &[(String, u64)], name: &str) -> u64 {
    c.iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no counter {name} in {c:?}"))
}

/// `after - before`, counter by counter.
fn delta(before: &[(String, u64)], after: &[(String, u64)]) -> Vec<(String, u64)> {
    after
        .iter()
        .map(|(n, v)| {
            let was = before.iter().find(|(m, _)| m == n).map_or(0, |(_, w)| *w);
            (n.clone(), v - was)
        })
        .collect()
}

/// The counters that say something went wrong (errors, drops, NAKs, retries).
fn trouble(c: &[(String, u64)]) -> Vec<(String, u64)> {
    c.iter()
        .filter(|(n, v)| {
            *v != 0
                && (n.contains("err")
                    || n.starts_with("drop_")
                    || n.starts_with("nak_")
                    || n.starts_with("device_drop")
                    || n == "duplicate_request"
                    || n == "out_of_seq_request"
                    || n == "dropped_pkts")
        })
        .cloned()
        .collect()
}

/// How a pingpong program is started: as this process's user (with extra environment), or
/// as `nobody` through setpriv.
#[derive(Clone, Copy)]
enum As<'a> {
    Me(&'a [(&'a str, &'a str)]),
    Nobody,
}

fn command(daemon: &Daemon, who: As<'_>, program: &Path, args: &[&str]) -> Command {
    match who {
        As::Me(env) => {
            let mut cmd = daemon.command(program);
            cmd.args(args);
            for (k, v) in env {
                cmd.env(k, v);
            }
            cmd
        }
        As::Nobody => {
            let mut cmd = Command::new(require_program("setpriv"));
            cmd.arg(format!("--reuid={NOBODY}"))
                .arg(format!("--regid={NOBODY}"))
                .arg("--clear-groups")
                .arg("--")
                .arg(program)
                .args(args)
                .env("LD_PRELOAD", &shim_libs().preload)
                .env("SOFTROCE_SOCKET", &daemon.socket);
            cmd
        }
    }
}

/// `ibv_rc_pingpong -c ARGS` between a server started as `server_as` and a client as
/// `client_as`; both must exit 0 and report their transfer.
fn rc_pingpong(daemon: &Daemon, port: u16, args: &[&str], server_as: As<'_>, client_as: As<'_>) {
    let program = require_program("ibv_rc_pingpong");
    let dir = scratch("fast-path", &format!("rc-{port}"));
    let port_s = port.to_string();
    let mut common = vec!["-d", "srxe0", "-g", "0", "-p", &port_s, "-c"];
    common.extend_from_slice(args);
    let mut server = Logged::spawn(
        command(daemon, server_as, &program, &common),
        dir.join("server.log"),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !tcp_listening(port) {
        assert!(
            Instant::now() < deadline && server.wait_for(Duration::ZERO).is_none(),
            "server never listened:\n{}\n--- daemon\n{}",
            server.output(),
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    common.push("127.0.0.1");
    let mut client = Logged::spawn(
        command(daemon, client_as, &program, &common),
        dir.join("client.log"),
    );
    let c = client.wait_for(RUN_LIMIT);
    let s = server.wait_for(if c.is_some() {
        Duration::from_secs(30)
    } else {
        Duration::ZERO
    });
    let report = || {
        format!(
            "ibv_rc_pingpong {args:?}\n--- server ({s:?})\n{}\n--- client ({c:?})\n{}\n--- daemon\n{}",
            server.output(),
            client.output(),
            daemon.log()
        )
    };
    assert!(
        c.is_some_and(|s| s.success()) && s.is_some_and(|s| s.success()),
        "pingpong failed or hung: {}",
        report()
    );
    for out in [server.output(), client.output()] {
        assert!(out.contains(" bytes in "), "no transfer line: {}", report());
    }
}

/// One user, one daemon: the pingpong runs on the fast path (directions granted) and counts
/// exactly the messages the daemon's path counts for the same run, with no error anywhere;
/// every buffer is checked by the program (`-c`), at one packet and at many per message.
#[test]
fn rc_pingpong_on_the_fast_path_counts_as_on_the_daemons_path() {
    let d = loopback_daemon("fast-rc", 71);
    let iters = 100u64;
    for (port, size) in [(18711u16, "64"), (18712, "65536")] {
        let args = ["-s", size, "-n", "100"];
        let before = counters(&d);
        rc_pingpong(&d, port, &args, As::Me(&[]), As::Me(&[]));
        let fast = delta(&before, &counters(&d));

        let before = counters(&d);
        let off: &[(&str, &str)] = &[("SOFTROCE_FAST_PATH", "0")];
        rc_pingpong(&d, port + 10, &args, As::Me(off), As::Me(off));
        let slow = delta(&before, &counters(&d));

        assert!(
            get(&fast, "device_fast_grants") >= 1,
            "size {size}: no direction was granted: {fast:?}\n{}",
            d.log()
        );
        assert_eq!(
            get(&slow, "device_fast_grants"),
            0,
            "size {size}: SOFTROCE_FAST_PATH=0 still took a direction"
        );
        // Every direction granted came back (the programs destroyed their QPs).
        assert_eq!(
            get(&fast, "device_fast_grants"),
            get(&fast, "device_fast_returns"),
            "size {size}: {fast:?}"
        );
        for name in ["rdma_sends", "rdma_recvs"] {
            // Each side sends and receives `iters` messages.
            assert_eq!(get(&slow, name), 2 * iters, "daemon path, {name}");
            assert_eq!(get(&fast, name), get(&slow, name), "size {size}: {name}");
        }
        assert_eq!(trouble(&fast), vec![], "size {size}: fast path");
        assert_eq!(trouble(&slow), vec![], "size {size}: daemon path");
    }
}

/// Processes of two users on one daemon never share a direction (each may not reach the
/// other's memory): the pingpong runs on the daemon's path, and works.
#[test]
fn processes_of_two_users_stay_on_the_daemons_path() {
    let d = Daemon::start(
        "fast-two-users",
        &[
            "--allow-uid",
            "nobody",
            "--addr",
            "127.0.0.72",
            "--port",
            "4791",
        ],
    );
    let before = counters(&d);
    rc_pingpong(
        &d,
        18721,
        &["-s", "4096", "-n", "50"],
        As::Nobody,
        As::Me(&[]),
    );
    let after = delta(&before, &counters(&d));
    assert_eq!(get(&after, "device_fast_grants"), 0, "{after:?}");
    assert_eq!(get(&after, "rdma_sends"), 100);
    assert_eq!(trouble(&after), vec![]);
}

/// A daemon whose packets between local QPs go through its link (`--local-via-socket`, where
/// a capture on `lo` sees them) grants no direction: those packets must exist.
#[test]
fn local_packets_through_the_link_stay_on_the_daemons_path() {
    let d = Daemon::start(
        "fast-via-socket",
        &[
            "--addr",
            "127.0.0.73",
            "--port",
            "4791",
            "--local-via-socket",
        ],
    );
    let before = counters(&d);
    rc_pingpong(
        &d,
        18731,
        &["-s", "4096", "-n", "50"],
        As::Me(&[]),
        As::Me(&[]),
    );
    let after = delta(&before, &counters(&d));
    assert_eq!(get(&after, "device_fast_grants"), 0, "{after:?}");
    assert_eq!(get(&after, "rdma_sends"), 100);
    assert_eq!(trouble(&after), vec![]);
}

/// The statuses of success and failure are the daemon's: a C program whose parent and forked
/// child each open their own context (two clients of one user) runs WRITE, SEND and READ
/// (bytes compared on both sides), a WRITE with a wrong R_Key (REM_ACCESS_ERR, then a flush)
/// and a SEND with no receive posted (RNR_RETRY_EXC_ERR): every completion either side sees,
/// and every error counter, is the same with the fast path as with `SOFTROCE_FAST_PATH=0`.
#[test]
fn completions_and_errors_on_the_fast_path_are_the_daemons() {
    let exe = compile_c(
        "fast_pair",
        include_str!("shim_support/fast_pair.c"),
        &["ibverbs"],
    );
    let d = loopback_daemon("fast-errors", 74);
    let run = |scenario: &str, env: &[(&str, &str)]| {
        let before = counters(&d);
        let mut cmd = d.command(&exe);
        cmd.arg(scenario);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("run fast_pair");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success() && text.ends_with("done\n"),
            "fast_pair {scenario} {env:?}: {}\n{text}\n{}\n--- daemon\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            d.log()
        );
        (text, delta(&before, &counters(&d)))
    };
    for (scenario, expect) in [
        (
            "ok",
            &[
                "parent wr_id=1 opcode=1 status=0",
                "child WRITE bytes match",
                "parent wr_id=2 opcode=0 status=0",
                "child wr_id=7 opcode=128 status=0 byte_len=100",
                "child SEND bytes match",
                "parent wr_id=3 opcode=2 status=0 byte_len=4096",
                "parent READ bytes match",
            ][..],
        ),
        (
            "access",
            &[
                "parent wr_id=4 opcode=1 status=10",
                "parent wr_id=5 opcode=1 status=5",
            ][..],
        ),
        ("rnr", &["parent wr_id=6 opcode=0 status=13"][..]),
    ] {
        let (fast, fast_counters) = run(scenario, &[]);
        let (slow, slow_counters) = run(scenario, &[("SOFTROCE_FAST_PATH", "0")]);
        for line in expect {
            assert!(fast.contains(line), "{scenario}: no {line:?} in\n{fast}");
        }
        assert_eq!(fast, slow, "{scenario}: the fast path's completions differ");
        assert_eq!(get(&slow_counters, "device_fast_grants"), 0);
        if scenario != "rnr" {
            assert!(
                get(&fast_counters, "device_fast_grants") >= 1,
                "{scenario}: the fast path was not taken: {fast_counters:?}"
            );
        }
        assert_eq!(
            trouble(&fast_counters),
            trouble(&slow_counters),
            "{scenario}: error counters"
        );
    }
}
