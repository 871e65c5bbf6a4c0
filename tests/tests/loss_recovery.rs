//! Loss recovery with real programs: two daemons in network namespaces this test creates,
//! joined by a veth pair whose outgoing RoCE packets nftables drops at random (`numgen
//! random`, both directions) and duplicates (`dup`). Unmodified `ibv_rc_pingpong -c` (which
//! checks the data it receives), `ib_write_bw` and `rping -V` (which verifies every RDMA
//! READ and WRITE of its buffer) complete with 0.1 %, 1 % and 5 % loss, with go-back-N
//! (`--loss-recovery gbn`) and with the default `auto`, where the two daemons find each
//! other softroce (the capability MAD on QP1) and use selective retransmission: the daemons'
//! logs show the switch and the SACKs and retransmissions it took, and the nftables counters
//! show the packets really dropped. Two more cases prove the fallback: toward a softroce
//! peer on `gbn` and toward a peer that never answers the capability probe (every probe
//! dropped on the path), every QP stays on go-back-N. Reordering, which nftables cannot do,
//! comes from each sending daemon's fault injector (`softroce fault srxe0 reorder`), on top
//! of the path's loss and duplication, in both modes. The loss runs' daemons send one
//! datagram per packet (`--no-gso`), so that nftables drops packets, not GSO batches. The
//! capability exchange also decides IPv4 GSO on this non-loopback path: on toward a softroce
//! peer, off toward the silent one. Short runs here; `scripts/bench loss` measures goodput.
//!
//! Needs root in a network namespace of its own (as `scripts/test` runs),
//! `ip`, `nft`, rdma-core's examples, perftest and rdmacm-utils: a missing one fails.

mod shim_support;

use shim_support::programs::{scratch, Logged};
use shim_support::{check_output, require_program, Daemon};
use std::process::Command;
use std::time::{Duration, Instant};

/// How long one program may run before the test counts it as hung.
const RUN_LIMIT: Duration = Duration::from_secs(180);
const SERVER_IP: &str = "10.13.0.1";
const CLIENT_IP: &str = "10.13.0.2";

fn sh(what: &str, cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    check_output(what, out)
}

fn ip(args: &[&str]) {
    sh(
        &format!("ip {}", args.join(" ")),
        Command::new("ip").args(args),
    );
}

/// Two namespaces, `<tag>-a` (the server, 10.13.0.1) and `<tag>-b` (the client,
/// 10.13.0.2), joined by a veth pair. Each drops `loss` and duplicates `dup` of its
/// outgoing UDP packets to port 4791, per mille, except plain ACKs (BTH opcode 0x11) and
/// the client's DREQ: rc_pingpong's and rping's programs exit as soon as their last message
/// arrives, so a lost ACK of the peer's last SEND could never be repeated (the QP is gone)
/// and the peer would end with RETRY_EXC_ERR (the client did, once in a full run, when the
/// server's last ACK was lost); and rping's client destroys its
/// CM ID right after `rdma_disconnect`, which stops the DREQ's retries (the ID goes to
/// timewait, as in ib_cm's `cm_destroy_id`), so a lost DREQ leaves the server waiting for
/// DISCONNECTED for ever. Those are the programs' own races, on rxe and on hardware too;
/// every other packet, SACKs, NAKs and the rest of the CM included, is fair game (lost ACKs
/// in the middle of a transfer are the simulator's: `proto::sim`). Deleted on drop.
struct LossyPath {
    ns: [String; 2],
}

/// What a path does to softroce's capability MADs (docs/loss-recovery.md, "Negotiation").
#[derive(Clone, Copy, PartialEq)]
enum CapsMads {
    /// Carried, dropped at random as everything else.
    Carried,
    /// Every one dropped, both ways: each daemon sees a peer that never answers.
    Silenced,
}

impl LossyPath {
    fn new(tag: &str, loss: u32, dup: u32, caps: CapsMads) -> LossyPath {
        require_program("nft");
        let base = format!("irn-{}-{tag}", std::process::id());
        let ns = [format!("{base}-a"), format!("{base}-b")];
        let path = LossyPath { ns: ns.clone() };
        for n in &ns {
            ip(&["netns", "add", n]);
        }
        let (va, vb) = (format!("{tag}a"), format!("{tag}b"));
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb]);
        for (i, (dev, addr)) in [(&va, SERVER_IP), (&vb, CLIENT_IP)].into_iter().enumerate() {
            ip(&["link", "set", dev, "netns", &ns[i]]);
            ip(&[
                "-n",
                &ns[i],
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                dev,
            ]);
            ip(&["-n", &ns[i], "link", "set", dev, "up"]);
            ip(&["-n", &ns[i], "link", "set", "lo", "up"]);
            let peer = if i == 0 { CLIENT_IP } else { SERVER_IP };
            // @th,64,8: the first byte after the UDP header, the BTH opcode.
            let spare = "@th,64,8 != 0x11 ";
            // A UD SEND_ONLY whose MAD has class 0x07 (CM, @th,232,8) and attribute 0x0015
            // (DREQ, @th,352,16: the MAD starts 28 bytes into the UDP datagram).
            let keep_dreq = if i == 1 {
                "udp dport 4791 @th,64,8 0x64 @th,232,8 0x07 @th,352,16 0x0015 counter accept comment \"dreq\"\n  "
            } else {
                ""
            };
            // A UD SEND_ONLY (0x64) whose MAD (after the 12-byte BTH and the 8-byte DETH)
            // has management class 0x30 (@th,232,8): softroce's capability probe or answer.
            let silence = match caps {
                CapsMads::Carried => String::new(),
                CapsMads::Silenced => format!(
                    "udp dport 4791 @th,64,8 0x64 @th,232,8 {:#04x} counter drop comment \"caps\"\n  ",
                    proto::cm::caps::CLASS
                ),
            };
            let rules = format!(
                "table ip irn {{\n chain out {{\n  type filter hook output priority 0;\n  \
                 {silence}{keep_dreq}udp dport 4791 {spare}numgen random mod 1000 < {loss} counter drop\n  \
                 udp dport 4791 numgen random mod 1000 < {dup} counter dup to {peer} device \"{dev}\"\n }}\n}}\n"
            );
            let f = scratch("loss-recovery", tag).join(format!("nft-{i}.conf"));
            std::fs::write(&f, rules).expect("write nft rules");
            sh(
                "nft -f",
                Command::new("ip")
                    .args(["netns", "exec", &ns[i], "nft", "-f"])
                    .arg(&f),
            );
        }
        path
    }

    /// Packets nftables dropped at random and duplicated so far, both directions, and the
    /// capability MADs it silenced.
    fn counts(&self) -> (u64, u64, u64) {
        let mut dropped = 0;
        let mut duplicated = 0;
        let mut silenced = 0;
        for n in &self.ns {
            let list = sh(
                "nft list ruleset",
                Command::new("ip").args(["netns", "exec", n, "nft", "list", "ruleset"]),
            );
            for line in list.lines() {
                let packets = line
                    .split("packets ")
                    .nth(1)
                    .and_then(|r| r.split_whitespace().next())
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
                if line.contains("comment \"caps\"") {
                    silenced += packets;
                } else if line.contains(" drop") {
                    dropped += packets;
                } else if line.contains(" dup ") {
                    duplicated += packets;
                }
            }
        }
        (dropped, duplicated, silenced)
    }

    /// `per_packet`: `--no-gso`, so that nftables, which sees a GSO send as one packet,
    /// drops and duplicates RoCE packets one by one at the stated rate, not whole batches
    /// (a softroce peer gets IPv4 GSO on any path).
    fn daemon(&self, side: usize, name: &str, mode: &str, per_packet: bool) -> Daemon {
        let addr = [SERVER_IP, CLIENT_IP][side];
        let gso: &[&str] = if per_packet { &["--no-gso"] } else { &[] };
        Daemon::start_in(
            name,
            Some(&self.ns[side]),
            &[
                gso,
                &[
                    "--addr",
                    addr,
                    "--port",
                    "4791",
                    // A 1500-byte Ethernet: IB MTU 1024, as rxe derives from it.
                    "--mtu",
                    "1024",
                    "--loss-recovery",
                    mode,
                    // A QP that fails logs its recovery state.
                    "--log",
                    "info,softroce_daemon::device::completions=debug",
                ],
            ]
            .concat(),
        )
    }
}

impl Drop for LossyPath {
    fn drop(&mut self) {
        for n in &self.ns {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

/// Whether process `pid` (in its own namespace) has a TCP socket listening on `port`.
fn listening(pid: u32, port: u16) -> bool {
    let needle = format!(":{port:04X} ");
    ["tcp", "tcp6"].iter().any(|f| {
        std::fs::read_to_string(format!("/proc/{pid}/net/{f}")).is_ok_and(|t| {
            t.lines()
                .any(|l| l.contains(&needle) && l.split_whitespace().nth(3) == Some("0A"))
        })
    })
}

struct Outcome {
    server: String,
    client: String,
}

/// Runs `program` as a server on `sd` (waiting until it listens on TCP `port`, or for
/// `settle` when it does not say) and as a client on `cd` with the server's address last;
/// both must exit 0 within [`RUN_LIMIT`].
fn run_pair(
    what: &str,
    (sd, cd): (&Daemon, &Daemon),
    program: &str,
    server_args: &[&str],
    client_args: &[&str],
    port: Option<u16>,
) -> Outcome {
    let dir = scratch("loss-recovery", what);
    let exe = require_program(program);
    let mut s = sd.command(&exe);
    s.args(server_args);
    let mut server = Logged::spawn(s, dir.join("server.log"));
    let deadline = Instant::now() + Duration::from_secs(30);
    match port {
        Some(p) => {
            while !listening(server.child.id(), p) {
                assert!(
                    server.wait_for(Duration::ZERO).is_none() && Instant::now() < deadline,
                    "{what}: server never listened:\n{}\n--- daemon\n{}",
                    server.output(),
                    sd.log()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        None => std::thread::sleep(Duration::from_millis(500)),
    }
    let mut c = cd.command(&exe);
    c.args(client_args);
    let mut client = Logged::spawn(c, dir.join("client.log"));
    let cs = client.wait_for(RUN_LIMIT);
    let ss = server.wait_for(if cs.is_some() {
        Duration::from_secs(30)
    } else {
        Duration::ZERO
    });
    let report = || {
        format!(
            "{what}\n--- server ({ss:?})\n{}\n--- client ({cs:?})\n{}\n--- server daemon\n{}\n--- client daemon\n{}",
            server.output(),
            client.output(),
            sd.log(),
            cd.log()
        )
    };
    assert!(
        cs.is_some_and(|s| s.success()) && ss.is_some_and(|s| s.success()),
        "{}",
        report()
    );
    Outcome {
        server: server.output(),
        client: client.output(),
    }
}

/// The selective-retransmission counters a daemon logged for its clients: (SACKs sent,
/// SACKs received, packets sent again, probes), summed.
fn selective_counters(log: &str) -> (u64, u64, u64, u64) {
    let field = |line: &str, name: &str| -> u64 {
        line.split(&format!("{name}="))
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    log.lines()
        .filter(|l| l.contains("selective retransmission counters"))
        .fold((0, 0, 0, 0), |(a, b, c, d), l| {
            (
                a + field(l, "sack_sent"),
                b + field(l, "sack_rcvd"),
                c + field(l, "sel_retransmits"),
                d + field(l, "probes"),
            )
        })
}

/// What the daemons of one run logged about loss recovery.
struct Observed {
    logs: Vec<String>,
    /// QPs switched to selective retransmission, per daemon (server, client).
    switched: Vec<usize>,
    sacks_sent: u64,
    sacks_rcvd: u64,
    resent: u64,
    /// Capability MADs nftables silenced.
    silenced: u64,
    /// Per daemon (server, client): its GSO sends, and the IPv4 packets it received whose
    /// ICRC needed a non-zero Identification (GSO segments after the first).
    gso_sends: Vec<u64>,
    idents_recovered: Vec<u64>,
    /// Per daemon: the peers `softroce link show -j` lists (what the exchange learnt).
    peers: Vec<serde_json::Value>,
    summary: String,
}

/// Runs the three programs over a path with `loss` per mille in `mode`, checks they succeed
/// and, per mode, that the daemons used (or never used) selective retransmission.
fn programs_survive(tag: &str, loss: u32, mode: &str) {
    programs_survive_faults(tag, loss, mode, &[]);
}

/// As [`programs_survive`], with `faults` (`softroce fault srxe0 ...` arguments) on both
/// daemons from the start.
fn programs_survive_faults(tag: &str, loss: u32, mode: &str, faults: &[&[&str]]) {
    let o = programs_over_faults(tag, loss, [mode, mode], CapsMads::Carried, true, faults);
    let summary = &o.summary;
    match mode {
        "gbn" => {
            assert_eq!(o.switched, [0, 0], "{summary}");
            assert_eq!(o.sacks_sent + o.sacks_rcvd + o.resent, 0, "{summary}");
        }
        _ => {
            // ib_write_bw's and rping's QPs on each side; pingpong's too, unless the first
            // probe's answer was lost and it finished on go-back-N (which is the design:
            // no QP waits for the answer).
            assert!(
                o.switched.iter().all(|&n| n >= 2),
                "{summary}\n{}",
                o.logs[0]
            );
            if loss >= 10 {
                assert!(
                    o.sacks_sent > 0 && o.sacks_rcvd > 0 && o.resent > 0,
                    "{summary}"
                );
            }
        }
    }
}

/// The three programs with the server's daemon in `modes[0]` and the client's in
/// `modes[1]` (`per_packet`: `--no-gso`); they must succeed. Returns what the daemons logged.
fn programs_over(
    tag: &str,
    loss: u32,
    modes: [&str; 2],
    caps: CapsMads,
    per_packet: bool,
) -> Observed {
    programs_over_faults(tag, loss, modes, caps, per_packet, &[])
}

fn programs_over_faults(
    tag: &str,
    loss: u32,
    modes: [&str; 2],
    caps: CapsMads,
    per_packet: bool,
    faults: &[&[&str]],
) -> Observed {
    let path = LossyPath::new(tag, loss, loss / 2, caps);
    let (sd, cd) = (
        path.daemon(0, &format!("{tag}-server"), modes[0], per_packet),
        path.daemon(1, &format!("{tag}-client"), modes[1], per_packet),
    );
    for d in [&sd, &cd] {
        for f in faults {
            let args: Vec<&str> = ["fault", "srxe0"].iter().chain(f.iter()).copied().collect();
            shim_support::operator::softroce_ok(d, &args);
        }
    }
    let pp = ["-d", "srxe0", "-g", "0", "-s", "1048576", "-n", "3", "-c"];
    let pp_client: Vec<&str> = pp.iter().copied().chain([SERVER_IP]).collect();
    let p = run_pair(
        &format!("{tag}-pingpong"),
        (&sd, &cd),
        "ibv_rc_pingpong",
        &pp,
        &pp_client,
        Some(18515),
    );
    for out in [&p.server, &p.client] {
        // -c: rc_pingpong checks each page of every buffer it receives.
        assert!(!out.contains("invalid data"), "{out}");
        // Three 1 MiB messages each way.
        assert!(out.contains("6291456 bytes in"), "{out}");
    }
    let bw = [
        "-d",
        "srxe0",
        "-x",
        "0",
        "-s",
        "65536",
        "-n",
        "200",
        "-F",
        "--report_gbits",
    ];
    let bw_client: Vec<&str> = bw.iter().copied().chain([SERVER_IP]).collect();
    let w = run_pair(
        &format!("{tag}-write-bw"),
        (&sd, &cd),
        "ib_write_bw",
        &bw,
        &bw_client,
        Some(18515),
    );
    assert!(
        w.client
            .lines()
            .any(|l| l.trim_start().starts_with("65536")),
        "{}",
        w.client
    );
    let rping = ["-a", SERVER_IP, "-C", "50", "-S", "16384", "-V"];
    let rs: Vec<&str> = ["-s"].into_iter().chain(rping).collect();
    let rc: Vec<&str> = ["-c"].into_iter().chain(rping).collect();
    run_pair(&format!("{tag}-rping"), (&sd, &cd), "rping", &rs, &rc, None);

    let (dropped, duplicated, silenced) = path.counts();
    if loss > 0 {
        assert!(dropped > 0, "nftables dropped nothing");
    }
    if loss >= 10 {
        assert!(duplicated > 0, "nftables duplicated nothing");
    }
    // Three clients per daemon: their engines' counters are logged as they go.
    let logs: Vec<String> = [&sd, &cd].iter().map(|d| settled_log(d, 3)).collect();
    if !faults.is_empty() {
        // The injector really acted on both sides.
        for d in [&sd, &cd] {
            let shown = shim_support::operator::softroce_json(d, &["fault", "show", "srxe0"]);
            let injected = shown[0]["rules"][0]["injected"].as_u64().unwrap_or(0);
            assert!(injected > 0, "no fault injected: {shown}");
        }
    }
    let net: Vec<_> = [&sd, &cd]
        .iter()
        .map(|d| shim_support::operator::counters(d, "srxe0"))
        .collect();
    let net_counter = |name: &str| -> Vec<u64> { net.iter().map(|c| c[name]).collect() };
    let (gso_sends, idents_recovered) = (
        net_counter("net.tx_gso_sends"),
        net_counter("net.rx_ident_recovered"),
    );
    let peers: Vec<serde_json::Value> = [&sd, &cd]
        .iter()
        .map(|d| {
            shim_support::operator::softroce_json(d, &["link", "show", "srxe0"])[0]["peers"].clone()
        })
        .collect();
    let switched: Vec<usize> = logs
        .iter()
        .map(|l| l.matches("QP uses selective retransmission").count())
        .collect();
    let (sacks_sent, sacks_rcvd, resent, probes) = logs
        .iter()
        .map(|l| selective_counters(l))
        .fold((0, 0, 0, 0), |a, b| {
            (a.0 + b.0, a.1 + b.1, a.2 + b.2, a.3 + b.3)
        });
    let summary = format!(
        "{tag}: {dropped} dropped, {duplicated} duplicated; QPs switched {switched:?}; \
         SACKs {sacks_sent} sent, {sacks_rcvd} received; {resent} packets resent selectively \
         ({probes} probes); {silenced} capability MADs silenced; GSO sends {gso_sends:?}, \
         Identifications recovered {idents_recovered:?}"
    );
    println!("{summary}");
    Observed {
        logs,
        switched,
        sacks_sent,
        sacks_rcvd,
        resent,
        silenced,
        gso_sends,
        idents_recovered,
        peers,
        summary,
    }
}

/// Asserts that no QP left go-back-N and no SACK or selective retransmission happened.
#[track_caller]
fn all_go_back_n(o: &Observed) {
    let summary = &o.summary;
    assert_eq!(o.switched, [0, 0], "{summary}\n{}", o.logs.join("\n---\n"));
    assert_eq!(o.sacks_sent + o.sacks_rcvd + o.resent, 0, "{summary}");
}

/// The daemon's log once `clients` client engines have been destroyed (they go shortly after
/// their programs exit).
fn settled_log(d: &Daemon, clients: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = d.log();
        if log.matches("client's engine destroyed").count() >= clients {
            return log;
        }
        assert!(Instant::now() < deadline, "clients never went:\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn go_back_n_survives_0_1_percent_loss() {
    programs_survive("gbn1", 1, "gbn");
}

#[test]
fn go_back_n_survives_1_percent_loss() {
    programs_survive("gbn10", 10, "gbn");
}

#[test]
fn go_back_n_survives_5_percent_loss() {
    programs_survive("gbn50", 50, "gbn");
}

#[test]
fn selective_survives_0_1_percent_loss() {
    programs_survive("sel1", 1, "auto");
}

#[test]
fn selective_survives_1_percent_loss() {
    programs_survive("sel10", 10, "auto");
}

#[test]
fn selective_survives_5_percent_loss() {
    programs_survive("sel50", 50, "auto");
}

/// 2 % of each daemon's outgoing packets held back and sent after the next one (the fault
/// injector's reorder), on a path that also drops 1 % and duplicates 0.5 %: go-back-N
/// repairs each reordering as a sequence error, selective retransmission holds the early
/// packet; both complete the three programs with their data checked.
const REORDER: &[&str] = &["reorder", "--rate", "0.02", "--direction", "tx"];

#[test]
fn go_back_n_survives_reordering_duplication_and_loss() {
    programs_survive_faults("gbnro", 10, "gbn", &[REORDER]);
}

#[test]
fn selective_survives_reordering_duplication_and_loss() {
    programs_survive_faults("selro", 10, "auto", &[REORDER]);
}

/// Fallback, a softroce peer that does not offer it: the server's daemon is on `auto`, the
/// client's on `gbn`. The client's daemon answers the probe "not offered", the server's
/// learns that (`peer is a softroce device ... selective=false`), and every QP of the three
/// programs stays on go-back-N on both ends, through 1 % loss.
#[test]
fn auto_toward_a_go_back_n_peer_stays_on_go_back_n() {
    // Per packet: the two learn that each other is softroce, and nftables would drop GSO
    // batches whole.
    let o = programs_over("fbgbn", 10, ["auto", "gbn"], CapsMads::Carried, true);
    all_go_back_n(&o);
    assert!(
        o.logs[0]
            .lines()
            .any(|l| l.contains("peer is a softroce device")
                && l.contains(CLIENT_IP)
                && l.contains("selective=false")),
        "the auto daemon never learnt its peer's answer: {}\n{}",
        o.summary,
        o.logs[0]
    );
}

/// Fallback, a peer that never answers (as a device that drops unknown MADs would): both
/// daemons on `auto`, every capability MAD dropped on the path. Each daemon probes its
/// peer, hears nothing, gives up after its retries (`peer is not a softroce device`), and
/// every QP stays on go-back-N (rxe's own behaviour), through 1 % loss.
#[test]
fn auto_toward_a_peer_that_never_answers_stays_on_go_back_n() {
    // GSO allowed: the daemons must not use it toward a peer they know nothing of (so the
    // loss is per packet all the same).
    let o = programs_over("fbsil", 10, ["auto", "auto"], CapsMads::Silenced, false);
    all_go_back_n(&o);
    assert!(o.silenced > 0, "no capability MAD was sent: {}", o.summary);
    // Toward a peer not known to be softroce, whose ICRC check may cover an Identification
    // numbered by a NIC's segmentation, every IPv4 packet is a datagram of its own; and
    // `softroce link show` says what each daemon made of the other: not softroce, or (once
    // the silence is 10 s old and a new QP looks the peer up) asking again.
    assert_eq!(o.gso_sends, [0, 0], "{}", o.summary);
    for (peers, peer) in o.peers.iter().zip([CLIENT_IP, SERVER_IP]) {
        let kind = peers[0]["kind"].as_str();
        assert!(
            peers.as_array().map(Vec::len) == Some(1)
                && peers[0]["addr"] == peer
                && matches!(kind, Some("other" | "asking"))
                && peers[0]["selective"] == false
                && peers[0]["any_ident"] == false,
            "{peers}\n{}",
            o.summary
        );
    }
    for (log, peer) in o.logs.iter().zip([CLIENT_IP, SERVER_IP]) {
        assert!(
            log.lines()
                .any(|l| l.contains("peer is not a softroce device") && l.contains(peer)),
            "a daemon never gave up on its silent peer: {}\n{log}",
            o.summary
        );
    }
}

/// IPv4 sends batched with UDP GSO beyond loopback, toward softroce peers only. The path is
/// a veth between two namespaces (not loopback), both daemons on `auto`: once the capability
/// exchange tells each that the other is softroce, which solves for the IPv4 Identification
/// the ICRC covers, the three programs' packets leave in GSO sends, the receiver recovers the
/// segments' Identifications (1, 2, ...), and the data arrives checked. (Toward a peer that
/// never answers: `auto_toward_a_peer_that_never_answers_stays_on_go_back_n`, no GSO.)
#[test]
fn ipv4_sends_to_a_softroce_peer_are_batched_on_any_path() {
    let o = programs_over("gso4", 0, ["auto", "auto"], CapsMads::Carried, false);
    assert!(
        o.gso_sends.iter().all(|&n| n > 0),
        "no GSO toward a softroce peer over a veth: {}",
        o.summary
    );
    assert!(
        o.idents_recovered.iter().all(|&n| n > 0),
        "no segment arrived with a non-zero Identification: {}",
        o.summary
    );
    // `softroce link show` names each daemon's peer and what it learnt of it.
    for (peers, peer) in o.peers.iter().zip([CLIENT_IP, SERVER_IP]) {
        assert_eq!(
            peers,
            &serde_json::json!([{"addr": peer, "kind": "softroce", "selective": true, "any_ident": true}]),
            "{}",
            o.summary
        );
    }
}
