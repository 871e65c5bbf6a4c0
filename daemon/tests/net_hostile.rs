//! Hostile packets at a live daemon over UDP (issue 16). A victim client holds an RC QP in
//! RTS and a UC QP, both connected to a peer on a second daemon, over registered memory whose
//! checksum the test keeps. An attacker on the peer's address sends the hostile corpus
//! (`proto::sim::hostile`: every opcode, truncation at every length, wrong pads, bad and valid
//! ICRCs, disagreeing lengths, PSNs outside the window, unknown and foreign QPNs, other PDs'
//! R_Keys, bounds past the MR, misaligned atomics, unsolicited READ responses, CNPs for
//! unknown QPs), CM MADs with nonsense fields, and a flood of guessed R_Keys (at the live UC
//! QP, which stays up) and guessed QPNs. Meanwhile a SEND pingpong between two other clients
//! of the two daemons checks every byte it receives.
//!
//! Then: both daemons are up, the victim's memory is unchanged, the pingpong completed with
//! correct data, and the daemon's counters account for the attack: each guessed key under
//! `drop_uc_abandoned`, each guessed QPN under an unknown-QP drop, every bad ICRC under the
//! link's drops, and every hostile packet under some reason.
//!
//! Runs as root in a private network namespace (`scripts/test`, or `sudo unshare --net`).

mod support;

use proto::ctl::{self, DeviceCounters, Request, Response};
use proto::sim::hostile::{self, ExtFields, Icrc, RawPacket, Victim};
use proto::wire::Opcode;
use softroce_daemon::ctl::Client;
use softroce_daemon::net::PacketBuilder;
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};
use support::client::*;

const A: &str = "127.0.0.231";
const B: &str = "127.0.0.232";
const LEN: usize = 64 * 1024;

fn counters(socket: &Path) -> DeviceCounters {
    let mut c = Client::connect(socket, "net-hostile").unwrap();
    let Response::Counters(mut devs) = ok(c.request(&Request::Counters).unwrap()) else {
        panic!("not a counters response")
    };
    devs.pop().expect("one device")
}

/// What every hostile packet must end under: a drop anywhere (link, device, engine), a NAK,
/// or an rxe counter for a packet refused in order.
fn accounted(c: &DeviceCounters) -> u64 {
    c.counters
        .iter()
        .filter(|(n, _)| {
            n.starts_with("device_drop_")
                || n.starts_with("drop_")
                || n.starts_with("nak_")
                || [
                    "link_rx_bad_icrc",
                    "link_rx_malformed",
                    "link_rx_truncated",
                    "link_rx_not_our_address",
                    "icrc_errors",
                    "duplicate_request",
                    "out_of_seq_request",
                    "rp_cnp_handled",
                    "rp_cnp_ignored",
                    "send_rnr_err",
                ]
                .contains(&n.as_str())
        })
        .map(|(_, v)| *v)
        .sum()
}

fn checksum(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
        (h ^ u64::from(*x)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Sends transport packets (BTH .. 4 ICRC bytes) from `from` to the daemon at `to`, sealing
/// the valid ones for the headers the kernel will write, and pacing them so that the
/// daemon's socket buffer never overflows (a kernel drop would be counted nowhere).
struct Attacker {
    sock: UdpSocket,
    builder: PacketBuilder,
    sent: u64,
}

impl Attacker {
    fn new(from: &str, to: &str) -> Attacker {
        let sock = UdpSocket::bind((from, 0)).unwrap();
        let port = sock.local_addr().unwrap().port();
        let builder = PacketBuilder::new(from.parse().unwrap(), to.parse().unwrap(), port);
        sock.connect(SocketAddr::new(to.parse().unwrap(), 4791))
            .unwrap();
        Attacker {
            sock,
            builder,
            sent: 0,
        }
    }

    fn send(&mut self, bytes: &[u8], icrc: Icrc) {
        let mut b = bytes.to_vec();
        if icrc == Icrc::Valid && b.len() >= 16 {
            self.builder.seal(0, &mut b).unwrap();
        } else if b.len() >= 16 {
            // A wrong ICRC: the right one with a bit flipped, so no chance of a match.
            self.builder.seal(0, &mut b).unwrap();
            let n = b.len();
            b[n - 1] ^= 0x80;
        }
        self.sock.send(&b).unwrap();
        self.sent += 1;
        if self.sent.is_multiple_of(32) {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// A SEND pingpong of `iters` round trips between `a` and `b`, every payload checked.
fn pingpong(a: &mut Side, b: &mut Side, iters: u32) {
    for i in 0..iters {
        let len = 1 + (i as usize * 97) % 3000;
        for (k, x) in a.buf[..len].iter_mut().enumerate() {
            *x = (k as u32 ^ i) as u8;
        }
        b.post_recv(u64::from(i), 8192, 4096);
        let sge = a.sge(0, len as u32);
        a.post_send(&send_wqe(
            u64::from(i),
            proto::ring::wqe::WrOpcode::Send,
            &sge,
            0,
            0,
        ));
        assert_eq!(a.poll().status, 0, "ping {i}");
        let c = b.poll();
        assert_eq!((c.status, c.byte_len), (0, len as u32), "ping {i} received");
        assert_eq!(&b.buf[8192..8192 + len], &a.buf[..len], "ping {i} data");
        // And back.
        a.post_recv(u64::from(i), 8192, 4096);
        b.buf.copy_within(8192..8192 + len, 0);
        let sge = b.sge(0, len as u32);
        b.post_send(&send_wqe(
            u64::from(i),
            proto::ring::wqe::WrOpcode::Send,
            &sge,
            0,
            0,
        ));
        assert_eq!(b.poll().status, 0, "pong {i}");
        let c = a.poll();
        assert_eq!((c.status, c.byte_len), (0, len as u32), "pong {i} received");
        assert_eq!(&a.buf[8192..8192 + len], &b.buf[..len], "pong {i} data");
    }
}

#[test]
fn hostile_packets_change_nothing_are_counted_and_the_daemon_serves_on() {
    let mut da = start_daemon("hostile-a", A);
    let mut db = start_daemon("hostile-b", B);
    let (ga, gb) = (
        ctl::gid_of(A.parse().unwrap()),
        ctl::gid_of(B.parse().unwrap()),
    );
    // The victim: an RC QP and a UC QP on daemon A, connected to peers on daemon B.
    let mut victim = Side::new(&da.socket, LEN);
    let mut peer = Side::new(&db.socket, LEN);
    let (qv, qp) = (victim.qpn, peer.qpn);
    victim.connect(qp, gb);
    peer.connect(qv, ga);
    let mut uc = Side::with_type(&da.socket, LEN, ctl::qp_type::UC);
    let mut uc_peer = Side::with_type(&db.socket, LEN, ctl::qp_type::UC);
    let (qu, qup) = (uc.qpn, uc_peer.qpn);
    uc.connect(qup, gb);
    uc_peer.connect(qu, ga);
    for (i, x) in victim.buf.iter_mut().enumerate() {
        *x = (i * 131 + 17) as u8;
    }
    for (i, x) in uc.buf.iter_mut().enumerate() {
        *x = (i * 29 + 3) as u8;
    }
    let (sum_rc, sum_uc) = (checksum(&victim.buf), checksum(&uc.buf));
    // The pingpong, on its own QPs between the same two daemons, running meanwhile.
    let mut ping = Side::new(&da.socket, LEN);
    let mut pong = Side::new(&db.socket, LEN);
    let (q1, q2) = (ping.qpn, pong.qpn);
    ping.connect(q2, gb);
    pong.connect(q1, ga);
    let pinger = std::thread::spawn(move || {
        pingpong(&mut ping, &mut pong, 400);
        (ping, pong)
    });

    let before = counters(&da.socket);
    let v = Victim {
        rc_qpn: qv,
        // The victim's next expected PSN: Side::connect starts every QP at PSN 0.
        rc_psn: 0,
        // No UD QP: the UD sweep goes to a QPN nobody has.
        ud_qpn: 0x00ff_fffd,
        ud_qkey: 0,
        mr_va: victim.buf.as_ptr() as u64,
        mr_len: LEN as u64,
        mr_rkey: victim.rkey,
        foreign_rkey: uc.rkey,
        // In a QPN block no client holds.
        unknown_qpn: 0x00ff_fffe,
    };
    let mut attacker = Attacker::new(B, A);
    let corpus = hostile::corpus(&v);
    let bad = corpus.iter().filter(|h| h.icrc == Icrc::Bad).count() as u64;
    for h in &corpus {
        attacker.send(&h.bytes, h.icrc);
    }
    // CM MADs with nonsense fields, as UD SENDs to QP1.
    let cm = hostile::cm_corpus();
    for mad in &cm {
        let f = ExtFields {
            qkey: 0x8001_0000,
            src_qpn: 1,
            ..ExtFields::default()
        };
        let mut p = RawPacket::new(Opcode::UD_SEND_ONLY.0, 1, 0, &f, 256);
        p.payload = mad.to_vec();
        attacker.send(&p.to_bytes(), Icrc::Valid);
    }
    // Guessed R_Keys at the UC QP (which a refused WRITE does not take down), in bounds.
    let mut rng = proto::transport::chacha::ChaCha20Rng::from_seed([0x5a; 32]);
    let keys = 3000u64;
    for i in 0..keys {
        let mut rkey = rng.next_u32();
        if rkey == uc.rkey {
            rkey ^= 1;
        }
        let f = ExtFields {
            va: uc.buf.as_ptr() as u64 + (i % 1000) * 8,
            rkey,
            dma_len: 64,
            ..ExtFields::default()
        };
        let p = RawPacket::new(Opcode::UC_RDMA_WRITE_ONLY.0, qu, i as u32, &f, 64);
        attacker.send(&p.to_bytes(), Icrc::Valid);
    }
    // Guessed QPNs, with the victim's real R_Key: none of them is a QP of the victim.
    let qpns = 2000u64;
    for _ in 0..qpns {
        let mut qpn = rng.next_u32() & 0xff_ffff;
        if [qv, qu, q1, 0, 1, 0xff_ffff].contains(&qpn) {
            qpn ^= 0x10;
        }
        let f = ExtFields {
            va: v.mr_va,
            rkey: v.mr_rkey,
            dma_len: 64,
            ..ExtFields::default()
        };
        let p = RawPacket::new(Opcode::RC_RDMA_WRITE_ONLY.0, qpn, 0, &f, 64);
        attacker.send(&p.to_bytes(), Icrc::Valid);
    }
    let sent = attacker.sent;

    // The daemon has taken everything when the counters stop moving.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut after = counters(&da.socket);
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = counters(&da.socket);
        if now == after || Instant::now() > deadline {
            after = now;
            break;
        }
        after = now;
    }
    let (ping, pong) = pinger
        .join()
        .expect("the pingpong completed with correct data");
    assert!(da.child.try_wait().unwrap().is_none(), "daemon A is up");
    assert!(db.child.try_wait().unwrap().is_none(), "daemon B is up");
    let delta = |n: &str| after.get(n) - before.get(n);
    let report: Vec<String> = after
        .counters
        .iter()
        .filter(|(n, v)| *v != before.get(n))
        .map(|(n, v)| format!("{n}={}", v - before.get(n)))
        .collect();
    println!(
        "{sent} hostile packets; counters moved: {}",
        report.join(" ")
    );

    assert_eq!(
        checksum(&victim.buf),
        sum_rc,
        "the RC victim's memory changed"
    );
    assert_eq!(checksum(&uc.buf), sum_uc, "the UC victim's memory changed");
    assert_eq!(
        delta("drop_uc_abandoned"),
        keys,
        "every guessed key counted"
    );
    assert!(
        delta("device_drop_unknown_qp") + delta("drop_unknown_qp") >= qpns,
        "every guessed QPN counted"
    );
    assert!(
        delta("link_rx_bad_icrc") + delta("link_rx_malformed") >= bad,
        "every bad ICRC counted: {bad} sent"
    );
    // Every CM MAD reached the CM and was counted (malformed, ignored, or answered).
    assert_eq!(
        delta("cm_mads_rcvd"),
        cm.len() as u64,
        "every CM MAD counted"
    );
    assert!(delta("cm_mads_malformed") + delta("cm_mads_ignored") <= cm.len() as u64);
    assert!(delta("cm_mads_malformed") > 0 && delta("cm_mads_ignored") > 0);
    // Every hostile packet under a reason (the pingpong's own packets are all good ones).
    assert!(
        accounted(&after) - accounted(&before) + delta("cm_mads_rcvd") >= sent,
        "{} of {sent} hostile packets accounted for",
        accounted(&after) - accounted(&before)
    );
    // Still serving: a new pingpong on fresh QPs, and the UC victim's real key writes.
    let mut x = Side::new(&da.socket, LEN);
    let mut y = Side::new(&db.socket, LEN);
    let (qx, qy) = (x.qpn, y.qpn);
    x.connect(qy, gb);
    y.connect(qx, ga);
    pingpong(&mut x, &mut y, 20);
    // The peers stay connected until here, so that the victims' QPs keep their paths.
    drop((peer, uc_peer, ping, pong));
}
