//! What softroce puts on the wire, checked by the independent oracle: a tcpdump capture of
//! its own sends (single packets and GSO, IPv4 and IPv6) must pass
//! `/work/shared/tools/roce-pcap-check`.
//!
//! The oracle recognises RoCE by UDP port 4791, so the test runs in a private network
//! namespace (no clash with a running daemon), whose loopback is limited to one segment per
//! packet (`gso_max_segs 1`): the kernel then segments GSO sends in software as a NIC
//! without UDP segmentation offload would, and the capture shows the real segments with
//! their Identifications 0, 1, 2, ... Needs root (`scripts/test` runs as root; by hand, run it
//! under `unshare --net`), `ip` and `tcpdump` (`scripts/install-deps`) and the
//! oracle in `../shared`: a missing one fails the test, it never passes without running.

mod net_util;

use net_util::*;
use softroce_daemon::net::{NetConfig, TxMeta, UdpTransport};
use std::io::{BufRead, BufReader};
use std::net::IpAddr;
use std::path::Path;
use std::process::{Command, Stdio};

const SINGLES: u32 = 40;
const GSO_BATCHES: [u32; 4] = [1, 2, 8, 20];

/// The oracle: `../shared` beside the project (as CI lays it), else the team machine's.
fn oracle() -> std::path::PathBuf {
    let beside = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/tools/roce-pcap-check");
    let team = Path::new("/work/shared/tools/roce-pcap-check");
    let found = [beside.as_path(), team]
        .into_iter()
        .find(|p| p.exists())
        .map(Path::to_path_buf);
    match found {
        Some(p) => p,
        None => panic!(
            "precondition missing: the ICRC oracle is expected at {} (../shared beside the project)",
            beside.display()
        ),
    }
}

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn run(cmd: &str, args: &[&str]) {
    let st = Command::new(cmd).args(args).status().unwrap();
    assert!(st.success(), "{cmd} {args:?} failed");
}

/// Runs in the calling thread's new network namespace. Returns the pcap path and the number
/// of RoCE packets that must be in it, or why the namespace could not be made.
fn capture_in_netns(pcap: &Path) -> Result<usize, String> {
    // SAFETY: unshare affects only this thread's namespaces; the thread ends with the test.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(format!(
            "unshare(CLONE_NEWNET): {}",
            std::io::Error::last_os_error()
        ));
    }
    run("ip", &["link", "set", "dev", "lo", "up"]);
    run("ip", &["link", "set", "dev", "lo", "gso_max_segs", "1"]);

    // Per family: SINGLES packets, then GSO sends of GSO_BATCHES[i] + 1 segments.
    let expected =
        2 * (SINGLES as usize + GSO_BATCHES.iter().map(|b| *b as usize + 1).sum::<usize>());
    // A large capture buffer (-B, KiB): GSO bursts otherwise overflow the packet ring.
    // `-c` makes tcpdump stop by itself once it has written every packet.
    let mut tcpdump = Command::new("tcpdump")
        .args([
            "-U",
            "--immediate-mode",
            "-B",
            "32768",
            "-n",
            "-i",
            "lo",
            "-c",
        ])
        .arg(expected.to_string())
        .arg("-w")
        .arg(pcap)
        .args(["udp", "port", "4791"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("tcpdump: {e}"))?;
    // Wait until it listens.
    let mut err = BufReader::new(tcpdump.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    assert!(line.contains("listening"), "tcpdump: {line}");

    // The receiver on the real RoCE port; senders on ephemeral ports, one with GSO.
    let mut rx = UdpTransport::open(&NetConfig {
        port: 4791,
        ..cfg()
    })
    .unwrap();
    let mut tx = UdpTransport::open(&cfg()).unwrap();
    let mut tx_gso = UdpTransport::open(&NetConfig { gso: true, ..cfg() }).unwrap();
    let mut sent = 0;
    for family in [IpAddr::V4(LO4), IpAddr::V6(LO6)] {
        let dst = local(&rx, family);
        let pb = builder(local(&tx, family), dst);
        for psn in 0..SINGLES {
            let meta = TxMeta {
                tos: (psn as u8) & 3,
                ..TxMeta::to(dst)
            };
            let pkt = build(&pb, 0, psn, [0, 3, 64, 1024][psn as usize % 4], false);
            tx.send(&meta, &pkt).unwrap();
        }
        tx.flush().unwrap();
        assert_eq!(recv_n(&mut rx, SINGLES as usize).len(), SINGLES as usize);
        sent += SINGLES as usize;

        let pb = builder(local(&tx_gso, family), dst);
        let mut psn = 1000;
        for batch in GSO_BATCHES {
            let mut agg = Vec::new();
            for k in 0..=batch {
                let len = if k == batch { 36 } else { 1024 };
                agg.extend(build(&pb, k as u16, psn, len, k != batch));
                psn += 1;
            }
            let meta = TxMeta {
                segment_size: Some(1040),
                ..TxMeta::to(dst)
            };
            tx_gso.send(&meta, &agg).unwrap();
            tx_gso.flush().unwrap();
            assert_eq!(
                recv_n(&mut rx, batch as usize + 1).len(),
                batch as usize + 1
            );
            sent += batch as usize + 1;
        }
    }
    assert_eq!(sent, expected);
    assert_eq!(rx.counters().rx_bad_icrc, 0);
    // A guard against a tcpdump that missed packets and would wait for ever.
    for _ in 0..100 {
        if tcpdump.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    if tcpdump.try_wait().unwrap().is_none() {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(tcpdump.id() as libc::pid_t, libc::SIGINT) };
        tcpdump.wait().unwrap();
    }
    Ok(expected)
}

#[test]
fn own_sends_pass_the_icrc_oracle() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "precondition missing: root, for a private network namespace (scripts/test runs as root)"
    );
    for tool in ["ip", "tcpdump", "python3"] {
        assert!(
            have(tool),
            "precondition missing: {tool} is not installed (scripts/install-deps installs it)"
        );
    }
    let oracle = oracle();
    let pcap = std::env::temp_dir().join(format!("softroce-net-{}.pcap", std::process::id()));
    let p = pcap.clone();
    let expected = std::thread::spawn(move || capture_in_netns(&p))
        .join()
        .unwrap()
        .unwrap_or_else(|why| panic!("precondition missing: {why}"));
    let out = Command::new("python3")
        .arg(&oracle)
        .arg(&pcap)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout).to_string();
    println!("{report}");
    assert!(out.status.success(), "oracle failed: {report}");
    assert!(
        report.contains(&format!("roce={expected} "))
            && report.contains(&format!("icrc_ok={expected} "))
            && report.contains("icrc_bad=0 "),
        "want {expected} RoCE packets, all with a good ICRC: {report}"
    );
    check_headers_like_rxe(&std::fs::read(&pcap).unwrap(), expected);
    let _ = std::fs::remove_file(&pcap);
}

/// The headers the kernel wrote look like rxe's (facts §1.1): IPv4 with DF, IPv6 with flow
/// label 0, and UDP checksum 0 on the sender without GSO (the GSO sender must checksum).
fn check_headers_like_rxe(pcap: &[u8], expected: usize) {
    assert!(
        pcap.len() >= 24 && pcap[..4] == [0xd4, 0xc3, 0xb2, 0xa1],
        "pcap, little-endian"
    );
    let mut at = 24;
    let (mut v4, mut v6, mut zero_csum) = (0, 0, 0);
    while at + 16 <= pcap.len() {
        let incl = u32::from_le_bytes(pcap[at + 8..at + 12].try_into().unwrap()) as usize;
        let frame = &pcap[at + 16..at + 16 + incl];
        at += 16 + incl;
        let ip = &frame[14..]; // Ethernet header of the loopback device
        let udp = match ip[0] >> 4 {
            4 => {
                v4 += 1;
                assert_eq!(ip[6] & 0x40, 0x40, "DF set");
                &ip[20..]
            }
            6 => {
                v6 += 1;
                let flow = u32::from_be_bytes(ip[..4].try_into().unwrap()) & 0xfffff;
                assert_eq!(flow, 0, "flow label 0");
                &ip[40..]
            }
            v => panic!("IP version {v}"),
        };
        if udp[6..8] == [0, 0] {
            zero_csum += 1;
        }
    }
    assert_eq!(v4 + v6, expected);
    assert_eq!(v4, v6);
    // Exactly the packets of the sender without GSO.
    assert_eq!(zero_csum, 2 * SINGLES as usize);
}
