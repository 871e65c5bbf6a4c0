//! The operator's tools on the L2 (TAP) device: a device added at run time with
//! `softroce link add NAME tap TAP roce v1 ...`, captured by `softroce capture` frame for
//! frame as the bridge carries it (tcpdump on the bridge sees the same RoCE v1 packets,
//! and tshark, `softroce pcap check` and the oracle accept both captures), and fault
//! injection on it: corrupted frames fail the peer's ICRC check on the wire (the bridge's
//! capture shows them bad) and are retransmitted, dropped ones are retried.
//!
//! Two daemons in a network namespace the test creates: A starts on the namespace's
//! loopback (UDP) and gets its TAP device from `link add`; B starts on a TAP. Both TAPs are
//! on one bridge. The programs' TCP exchange runs over the namespace's loopback.

mod shim_support;

use shim_support::captures::{self, LiveCapture};
use shim_support::netns::Netns;
use shim_support::operator::{counters, delta, softroce, softroce_json, softroce_ok};
use shim_support::programs::{scratch, Logged};
use shim_support::{require_program, softroce_bin, Daemon};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(120);

struct Pair {
    a: Daemon,
    b: Daemon,
    dir: PathBuf,
    // Dropped last: the daemons stop before their namespace goes.
    ns: Netns,
}

impl Pair {
    /// A on the namespace's loopback with srxe1 added on `tapa` (RoCE v1, 10.14.0.1/24);
    /// B on `tapb` (srxe2, RoCE v1, 10.14.0.2/24).
    fn new(tag: &str) -> Pair {
        let ns = Netns::new(tag);
        ns.bridge("br0", &["tapa", "tapb"], 1500, &[]);
        let dir = scratch("operator-l2", tag);
        let a = Daemon::start_in(
            &format!("{tag}-a"),
            Some(&ns.name),
            &["--name", "srxe0", "--addr", "127.0.0.1"],
        );
        let b = Daemon::start_in(
            &format!("{tag}-b"),
            Some(&ns.name),
            &[
                "--name",
                "srxe2",
                "--tap",
                "tapb",
                "--roce",
                "v1",
                "--mac",
                "02:00:00:0e:00:02",
                "--addr",
                "10.14.0.2/24",
                "--mtu",
                "1024",
            ],
        );
        softroce_ok(
            &a,
            &[
                "link",
                "add",
                "srxe1",
                "tap",
                "tapa",
                "roce",
                "v1",
                "mac",
                "02:00:00:0e:00:01",
                "addr",
                "10.14.0.1/24",
                "mtu",
                "1024",
            ],
        );
        Pair { a, b, dir, ns }
    }

    /// `program` served on B's srxe2 and run from A's srxe1 (GID 0 both: the fe80:: RoCE v1
    /// GID), over TCP `port`; both must exit 0.
    fn run(&self, program: &str, port: u16, gid_flag: &str, args: &[&str]) {
        let exe = require_program(program);
        let port_s = port.to_string();
        let name = format!("{program}-{port}");
        let mut cmd = self.b.command(&exe);
        cmd.args(["-d", "srxe2", gid_flag, "0", "-p", &port_s])
            .args(args);
        let mut server = Logged::spawn(cmd, self.dir.join(format!("{name}-server.log")));
        let deadline = Instant::now() + Duration::from_secs(30);
        while !listening(server.child.id(), port) {
            assert!(
                server.wait_for(Duration::ZERO).is_none() && Instant::now() < deadline,
                "{program} server never listened:\n{}",
                server.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut cmd = self.a.command(&exe);
        cmd.args(["-d", "srxe1", gid_flag, "0", "-p", &port_s])
            .args(args)
            .arg("127.0.0.1");
        let mut client = Logged::spawn(cmd, self.dir.join(format!("{name}-client.log")));
        let c = client.wait_for(LIMIT);
        let s = server.wait_for(if c.is_some() {
            Duration::from_secs(30)
        } else {
            Duration::ZERO
        });
        assert!(
            s.is_some_and(|s| s.success()) && c.is_some_and(|c| c.success()),
            "{program} {args:?}: server {s:?}, client {c:?}\n--- server\n{}\n--- client\n{}\n--- daemon A\n{}\n--- daemon B\n{}",
            server.output(),
            client.output(),
            self.a.log(),
            self.b.log()
        );
    }
}

/// Whether process `pid` (inside the namespace) sees something listening on TCP `port`.
fn listening(pid: u32, port: u16) -> bool {
    let needle = format!(":{port:04X}");
    ["tcp", "tcp6"].iter().any(|f| {
        std::fs::read_to_string(format!("/proc/{pid}/net/{f}"))
            .unwrap_or_default()
            .lines()
            .any(|l| {
                let c: Vec<&str> = l.split_whitespace().collect();
                c.get(1).is_some_and(|local| local.ends_with(&needle)) && c.get(3) == Some(&"0A")
            })
    })
}

/// `softroce pcap check -v FILE`'s per-packet lines (addresses, opcode, QPN, PSN, headers),
/// sorted: what the packets were, whatever order two capture points saw them in.
fn packet_lines(file: &Path) -> Vec<String> {
    let out = Command::new(softroce_bin())
        .args(["pcap", "check", "-v"])
        .arg(file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| l.contains(" PSN="))
        // The frame number leads each line; the packet is the rest.
        .map(|l| {
            l.trim_start()
                .split_once(char::is_whitespace)
                .map_or(l, |(_, rest)| rest)
                .to_string()
        })
        .collect();
    lines.sort();
    lines
}

fn deltas(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .keys()
        .map(|k| (k.clone(), delta(before, after, k)))
        .collect()
}

#[test]
fn a_tap_device_added_at_run_time_is_captured_frame_for_frame_as_the_bridge_carries_it() {
    let pair = Pair::new("opl2cap");
    // The new device is listed, with its TAP, its mode and its RoCE v1 GIDs.
    let devices = pair.a.run_preloaded(&require_program("ibv_devices"), &[]);
    assert!(devices.contains("srxe1"), "{devices}");
    let show = softroce_json(&pair.a, &["link", "show", "srxe1"]);
    let l = &show.as_array().expect("an array")[0];
    assert_eq!(l["mode"], "v1", "{l}");
    assert!(
        l["transport"][0]
            .as_str()
            .is_some_and(|t| t.starts_with("tap tapa")),
        "{l}"
    );
    let gids = l["gids"].as_array().expect("gids");
    assert!(
        !gids.is_empty() && gids.iter().all(|g| g["type"] == "RoCE v1"),
        "{l}"
    );

    let soft = LiveCapture::on(&pair.a, "srxe1", pair.dir.join("softroce.pcapng"));
    let wire = pair.ns.capture("br0", &pair.dir.join("bridge.pcap"));
    let before = counters(&pair.a, "srxe1");
    pair.run(
        "ibv_rc_pingpong",
        19560,
        "-g",
        &["-n", "50", "-s", "3000", "-m", "1024"],
    );
    let after = counters(&pair.a, "srxe1");
    let soft = soft.stop();
    let wire = wire.stop();

    // Both captures: whole RoCE v1 frames that every reader accepts.
    let s = captures::check(&soft);
    let w = captures::check(&wire);
    assert_eq!(s.v2, 0, "{:?}", s.ethertypes);
    assert_eq!(
        s.ethertypes.keys().copied().collect::<Vec<_>>(),
        vec![0x8915],
        "the daemon's capture holds RoCE frames only"
    );
    // 50 round trips of 3000 bytes at MTU 1024: 3 packets and an ACK each way.
    assert!(s.v1 >= 50 * 2 * 4, "{} frames", s.v1);
    // What the daemon captured is what crossed the bridge, packet for packet.
    assert_eq!(s.v1, w.v1, "daemon {} vs bridge {}", s.v1, w.v1);
    let (sl, wl) = (packet_lines(&soft), packet_lines(&wire));
    assert_eq!(sl.len(), s.v1, "one -v line per packet");
    assert_eq!(sl, wl, "the same packets at both capture points");
    // And as many as the device counted.
    let c = deltas(&before, &after);
    assert_eq!(
        s.v1 as u64,
        c["sent_pkts"] + c["rcvd_pkts"] + c["dropped_pkts"],
        "{c:?}"
    );
}

#[test]
fn faults_on_a_tap_device_reach_the_wire_and_are_repaired() {
    let pair = Pair::new("opl2fault");
    // corrupt: five frames leave with a flipped bit; B's ICRC check drops them, the bridge's
    // capture shows them bad, A retransmits, ib_write_bw completes.
    softroce_ok(
        &pair.a,
        &[
            "fault",
            "srxe1",
            "corrupt",
            "--next",
            "5",
            "--direction",
            "tx",
        ],
    );
    let wire = pair.ns.capture("br0", &pair.dir.join("corrupt.pcap"));
    let (ba, bb) = (counters(&pair.a, "srxe1"), counters(&pair.b, "srxe2"));
    pair.run(
        "ib_write_bw",
        19561,
        "-x",
        &["-F", "-s", "16384", "-n", "100"],
    );
    let (aa, ab) = (counters(&pair.a, "srxe1"), counters(&pair.b, "srxe2"));
    let wire = wire.stop();
    let (ca, cb) = (deltas(&ba, &aa), deltas(&bb, &ab));
    assert_eq!(cb["net.rx_bad_icrc"], 5, "B dropped them: {cb:?}");
    // Repaired by whichever recovery the two softroce devices agreed on: selective
    // retransmission (the default between softroce peers) or go-back-N.
    assert!(
        ca["rcvd_seq_err"] + ca["completer_retry_err"] + ca["sel_retransmits"] >= 1,
        "A retransmitted: {ca:?}"
    );
    let out = Command::new(softroce_bin())
        .args(["pcap", "check"])
        .arg(&wire)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(
        report.contains(", bad 5,"),
        "5 bad ICRCs on the wire:\n{report}"
    );
    softroce_ok(&pair.a, &["fault", "srxe1", "clear"]);

    // drop: four of A's packets are lost; the pingpong completes on A's retries.
    softroce_ok(&pair.a, &["fault", "srxe1", "drop", "--next", "4"]);
    let ba = counters(&pair.a, "srxe1");
    pair.run("ibv_rc_pingpong", 19562, "-g", &["-n", "50", "-m", "1024"]);
    let ca = deltas(&ba, &counters(&pair.a, "srxe1"));
    let injected = softroce_json(&pair.a, &["fault", "show", "srxe1"])[0]["rules"][0]["injected"]
        .as_u64()
        .unwrap();
    assert_eq!(injected, 4);
    assert!(
        ca["completer_retry_err"] + ca["sel_retransmits"] >= 1,
        "{ca:?}"
    );

    // A deleted TAP device is gone; the daemon's other device still answers.
    softroce_ok(&pair.a, &["link", "del", "srxe1"]);
    assert_eq!(softroce(&pair.a, &["stat", "srxe1"]).status.code(), Some(1));
    softroce_ok(&pair.a, &["stat", "srxe0"]);
}
