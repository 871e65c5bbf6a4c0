//! `softroce capture`: a live capture inside the daemon of everything a device sends and
//! receives. A same-host pingpong (packets handed from engine to engine, which no socket and
//! no tcpdump ever sees) and a two-daemon `ib_write_bw` with UDP GSO on (the default; a capture
//! on `lo` would show 64 KiB super-datagrams) are captured as whole Ethernet frames, one per
//! RoCE packet, that `softroce pcap check`, the independent oracle and tshark all accept, and
//! hold exactly as many RoCE packets as `stat` counted. `-w -` feeds `tshark -i -` live. An
//! `ibv_rc_pingpong -c` between two daemons under a capture checks the payload copies the
//! capture's room sends backward, byte for byte.

mod shim_support;

use shim_support::captures::{self, udp_checksums, LiveCapture};
use shim_support::operator::{counters, delta, ProgramPair};
use shim_support::programs::loopback_daemon;
use shim_support::{check_output, require_program, softroce_bin};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Checks a capture with the three checkers; returns how many RoCE packets it holds.
fn check_capture(file: &Path) -> u64 {
    let out = Command::new(softroce_bin())
        .args(["pcap", "check"])
        .arg(file)
        .output()
        .unwrap();
    let report = check_output("softroce pcap check", out);
    // "... N RoCE packets ..." in the summary.
    let roce: u64 = report
        .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .collect::<Vec<_>>()
        .windows(2)
        .find(|w| w[1] == "RoCE")
        .and_then(|w| w[0].parse().ok())
        .unwrap_or_else(|| panic!("no RoCE count in:\n{report}"));
    assert!(
        report.contains(&format!(
            "ICRC ok {roce}, bad 0, cut short by snaplen 0, other 0"
        )),
        "every frame a whole RoCE packet with a good ICRC:\n{report}"
    );

    let out = Command::new("python3")
        .arg(captures::oracle())
        .arg(captures::classic_pcap(file))
        .output()
        .unwrap();
    let line = check_output("roce-pcap-check", out);
    let field = |name: &str| -> u64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {line}"))
    };
    assert_eq!(field("roce"), roce, "{line}");
    assert_eq!(field("icrc_ok"), roce, "{line}");
    assert_eq!(field("icrc_bad"), 0, "{line}");
    assert_eq!(field("truncated"), 0, "{line}");

    // tshark: every frame decodes as RoCE (InfiniBand over UDP), none malformed, and no
    // UDP checksum a frame carries is wrong (tshark checks them when asked).
    assert_eq!(
        tshark_count(file, "_ws.malformed || _ws.expert.severity >= error"),
        0,
        "malformed frames"
    );
    assert_eq!(tshark_count(file, "infiniband"), roce);
    assert_eq!(
        tshark_count(file, "frame"),
        roce,
        "nothing but RoCE packets"
    );
    assert_eq!(udp_checksums(file).1, 0, "bad UDP checksums");
    roce
}

/// How many frames of a capture tshark's display `filter` takes.
fn tshark_count(file: &Path, filter: &str) -> u64 {
    let out = Command::new(require_program("tshark"))
        .args(["-n", "-r"])
        .arg(file)
        .args(["-Y", filter, "-T", "fields", "-e", "frame.number"])
        .output()
        .unwrap();
    check_output("tshark", out).lines().count() as u64
}

#[test]
fn a_same_host_pingpong_is_captured_whole_and_verified() {
    let d = loopback_daemon("op-capture-pp", 120);
    let cap = LiveCapture::start(&d, "pingpong");
    let before = counters(&d, "srxe0");
    ProgramPair::start(
        &d,
        &d,
        "ibv_rc_pingpong",
        19520,
        &["-d", "srxe0", "-g", "0", "-n", "100", "-s", "5000"],
        "capture-pp",
    )
    .succeed(Duration::from_secs(60), &d);
    let after = counters(&d, "srxe0");
    let file = cap.stop();
    let captured = check_capture(&file);
    // Engine to engine: each packet is sent and received by this device, and shown once.
    let (sent, rcvd) = (
        delta(&before, &after, "sent_pkts"),
        delta(&before, &after, "rcvd_pkts"),
    );
    let dropped = delta(&before, &after, "dropped_pkts");
    assert_eq!(
        captured, sent,
        "sent {sent} received {rcvd} dropped {dropped}"
    );
    assert_eq!(
        captured,
        rcvd + dropped,
        "sent {sent} received {rcvd} dropped {dropped}"
    );
    assert!(
        captured >= 100 * 2 * 2 * 2,
        "5000 bytes at MTU 1024 is 5 packets: {captured}"
    );
}

/// A program run between two daemons (its server on `server`, its client on `client`) while a
/// capture listens on the client's daemon.
struct TwoDaemonRun {
    file: std::path::PathBuf,
    before: std::collections::BTreeMap<String, u64>,
    after: std::collections::BTreeMap<String, u64>,
    /// RoCE packets in the capture, which the three checkers accepted.
    captured: u64,
    sent: u64,
}

/// Runs `program` between `server` and `client` under a capture on `client`, and checks that
/// the capture holds exactly the packets the client's device counted: each one sent and each
/// one that arrived, taken in or dropped (a late packet for a QP already destroyed).
fn captured_between(
    server: &shim_support::Daemon,
    client: &shim_support::Daemon,
    program: &str,
    port: u16,
    args: &[&str],
    name: &str,
) -> TwoDaemonRun {
    let cap = LiveCapture::start(client, name);
    let before = counters(client, "srxe0");
    ProgramPair::start(server, client, program, port, args, name)
        .succeed(Duration::from_secs(120), client);
    let after = counters(client, "srxe0");
    let file = cap.stop();
    let captured = check_capture(&file);
    let sent = delta(&before, &after, "sent_pkts");
    let rcvd = delta(&before, &after, "rcvd_pkts");
    let dropped = delta(&before, &after, "dropped_pkts");
    assert_eq!(
        captured,
        sent + rcvd + dropped,
        "sent {sent} received {rcvd} dropped {dropped}"
    );
    TwoDaemonRun {
        file,
        before,
        after,
        captured,
        sent,
    }
}

#[test]
fn a_two_daemon_write_bw_with_gso_is_captured_packet_by_packet() {
    let a = loopback_daemon("op-capture-bw-a", 121);
    let b = loopback_daemon("op-capture-bw-b", 122);
    let run = captured_between(
        &b,
        &a,
        "ib_write_bw",
        19521,
        &["-d", "srxe0", "-x", "0", "-F", "-s", "65536", "-n", "200"],
        "capture-bw",
    );
    let (sent, before, after) = (run.sent, &run.before, &run.after);
    assert!(
        sent >= 200 * 16,
        "64 KiB at MTU 4096 is 16 packets a message: {sent}"
    );
    assert!(
        after["net.tx_gso_sends"] > before["net.tx_gso_sends"],
        "GSO was on: {after:?}"
    );
    // Every datagram sent went out with the UDP checksum its socket computed (GSO needs
    // one), and the capture shows it right: summed by the pass that copied the datagram.
    assert_eq!(
        udp_checksums(&run.file),
        (sent, 0),
        "good UDP checksums, one per datagram sent, and no bad one"
    );
}

/// Payloads between two daemons while a capture listens: the room a capture leaves in front
/// of each frame puts the engine's copy of a payload into its frame just after its source
/// modulo 4 KiB, the placement `proto::wire::payload_copy` copies backward. An unmodified
/// `ibv_rc_pingpong -c` compares every buffer it receives (it fails when a block of the
/// backward copy is wrong: checked by mutation), and the capture holds every packet.
#[test]
fn a_two_daemon_pingpong_under_capture_arrives_byte_for_byte() {
    let a = loopback_daemon("op-capture-pp-a", 127);
    let b = loopback_daemon("op-capture-pp-b", 128);
    let run = captured_between(
        &b,
        &a,
        "ibv_rc_pingpong",
        19526,
        &[
            "-d", "srxe0", "-g", "0", "-m", "4096", "-s", "262144", "-n", "40", "-c",
        ],
        "capture-pp-two",
    );
    assert!(
        run.sent >= 40 * 64,
        "256 KiB at MTU 4096 is 64 packets a message: {}",
        run.sent
    );
    assert!(run.captured >= 2 * 40 * 64, "{}", run.captured);
}

#[test]
fn a_live_stream_feeds_tshark() {
    let d = loopback_daemon("op-capture-live", 123);
    let shell = format!(
        "'{}' capture -q -i srxe0 -c 20 --opcode RC_SEND_ONLY -w - | tshark -n -i - -T fields -e infiniband.bth.opcode 2>/dev/null",
        softroce_bin().display()
    );
    let tshark = Command::new("bash")
        .args(["-o", "pipefail", "-c", &shell])
        .env("SOFTROCE_SOCKET", &d.socket)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    ProgramPair::start(
        &d,
        &d,
        "ibv_rc_pingpong",
        19522,
        &["-d", "srxe0", "-g", "0", "-n", "50", "-s", "64"],
        "capture-live",
    )
    .succeed(Duration::from_secs(60), &d);
    let out = tshark.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", d.log());
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    // The first 20 RC SEND_ONLY packets (opcode 4), and nothing else.
    assert_eq!(lines.len(), 20, "{lines:?}");
    assert!(lines.iter().all(|l| l == "4"), "{lines:?}");
}

/// QPs that send long messages side by side take turns of a message, not of a packet
/// (`transport::engine::TRANSMIT_QUANTUM`): in a capture of an unmodified `ib_write_bw -q 2
/// -s 65536` on one daemon (a capture keeps it on the daemon's path), the WRITE packets to
/// the two responder QPs come in runs of a message's 16 packets. With turns of one packet
/// they alternated packet by packet, and the daemon read 64 KiB of the sender's memory for
/// every 4 KiB it sent.
#[test]
fn qps_sending_side_by_side_show_whole_messages_in_turn() {
    let d = loopback_daemon("op-capture-turns", 124);
    let cap = LiveCapture::start(&d, "turns");
    ProgramPair::start(
        &d,
        &d,
        "ib_write_bw",
        19523,
        &[
            "-d", "srxe0", "-x", "0", "-F", "-s", "65536", "-q", "2", "-n", "100",
        ],
        "capture-turns",
    )
    .succeed(Duration::from_secs(120), &d);
    let file = cap.stop();
    let report = captures::check(&file);
    // The two QPs that receive the WRITEs get 16 packets per message; the requesters only
    // the ACKs.
    let mut per_qp = std::collections::BTreeMap::<u32, usize>::new();
    for q in report.frames.iter().filter_map(|f| f.dest_qp) {
        *per_qp.entry(q).or_default() += 1;
    }
    let mut by_count: Vec<(usize, u32)> = per_qp.iter().map(|(q, n)| (*n, *q)).collect();
    by_count.sort_unstable_by(|a, b| b.cmp(a));
    let responders: Vec<u32> = by_count.iter().take(2).map(|(_, q)| *q).collect();
    let writes: Vec<u32> = report
        .frames
        .iter()
        .filter_map(|f| f.dest_qp)
        .filter(|q| responders.contains(q))
        .collect();
    assert!(
        writes.len() >= 2 * 100 * 16,
        "16 packets per message, 100 messages per QP: {per_qp:?}"
    );
    let runs = 1 + writes.windows(2).filter(|w| w[0] != w[1]).count();
    assert!(
        runs * 8 <= writes.len(),
        "{runs} runs of WRITE packets for {} packets: the QPs alternated within messages",
        writes.len()
    );
}
