//! Selective retransmission (`transport::selective`), one scenario per behaviour: what is
//! resent after a loss (only what is missing), what the responder reports, READ and atomic
//! responses lost on the way back, timeouts, RNR, reordering, a peer still on go-back-N, and
//! go-back-N's own packets unchanged. Bytes, statuses, counters and the packets on the wire
//! are asserted.

use proto::sim::{Action, LinkModel, PacketInfo, QpOptions, Sim};
use proto::transport::*;
use proto::types::{Psn, Qpn};
use proto::wire::Opcode;

const MS: u64 = 1_000_000;
const LEN: usize = 256 * 1024;

fn selective() -> LossRecovery {
    LossRecovery::Selective(SelectiveParams::default())
}

struct Pair {
    sim: Sim,
    qa: Qpn,
    qb: Qpn,
    a: u64,
    ka: MrKeys,
    b: u64,
    kb: MrKeys,
}

fn options(mode: LossRecovery) -> QpOptions {
    QpOptions {
        loss_recovery: mode,
        mtu: Mtu::Mtu1024,
        ..Default::default()
    }
}

fn setup_with(link: LinkModel, o: QpOptions, seed: u64) -> Pair {
    let mut sim = Sim::pair(seed, link);
    let (qa, qb) = sim.connect(0, 1, &o);
    let acc = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
    let (a, ka) = sim.alloc_mr(0, LEN, acc);
    let (b, kb) = sim.alloc_mr(1, LEN, acc);
    Pair {
        sim,
        qa,
        qb,
        a,
        ka,
        b,
        kb,
    }
}

fn setup(mode: LossRecovery) -> Pair {
    setup_with(LinkModel::default(), options(mode), 7)
}

/// Panics with the first differing offset (not the whole buffers).
#[track_caller]
fn same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: first difference at byte {i} of {}", want.len());
    }
}

fn data(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 7 + i / 251) as u8).wrapping_add(salt))
        .collect()
}

impl Pair {
    fn write(&mut self, wr_id: u64, off: u64, len: u32) {
        let mut wr = SendWr::new(
            wr_id,
            SendOp::Write(RemoteAddr {
                va: self.b + off,
                rkey: self.kb.rkey,
            }),
            Some(Sge {
                addr: self.a + off,
                length: len,
                lkey: self.ka.lkey,
            }),
        );
        wr.flags = SendFlags::SIGNALED;
        self.sim.post_send(0, self.qa, wr).expect("post_send");
    }
    fn read(&mut self, wr_id: u64, off: u64, len: u32) {
        let wr = SendWr::new(
            wr_id,
            SendOp::Read(RemoteAddr {
                va: self.b + off,
                rkey: self.kb.rkey,
            }),
            Some(Sge {
                addr: self.a + off,
                length: len,
                lkey: self.ka.lkey,
            }),
        );
        self.sim.post_send(0, self.qa, wr).expect("post_send");
    }
    fn send(&mut self, wr_id: u64, off: u64, len: u32) {
        let wr = SendWr::new(
            wr_id,
            SendOp::Send,
            Some(Sge {
                addr: self.a + off,
                length: len,
                lkey: self.ka.lkey,
            }),
        );
        self.sim.post_send(0, self.qa, wr).expect("post_send");
    }
    fn recv(&mut self, wr_id: u64, off: u64, len: u32) {
        let sg = Sge {
            addr: self.b + off,
            length: len,
            lkey: self.kb.lkey,
        };
        self.sim
            .post_recv(
                1,
                self.qb,
                RecvWr {
                    wr_id,
                    sg_list: vec![sg],
                },
            )
            .expect("post_recv");
    }
    fn statuses(&self, node: usize) -> Vec<(u64, WcStatus)> {
        let q = if node == 0 { self.qa } else { self.qb };
        self.sim
            .completions_of(node, q)
            .iter()
            .map(|w| (w.wr_id, w.status))
            .collect()
    }
    fn requests(&self) -> Vec<PacketInfo> {
        self.sim
            .trace
            .iter()
            .filter(|p| p.from == 0 && p.dest_qpn == self.qb)
            .copied()
            .collect()
    }
    fn times_sent(&self, psn: Psn) -> usize {
        self.requests().iter().filter(|p| p.psn == psn).count()
    }
    fn counters(&mut self, node: usize) -> Counters {
        *self.sim.dev(node).counters()
    }
}

fn drop_nth_request(p: &mut Pair, opcode: Opcode, nth: usize) {
    let qb = p.qb;
    let mut seen = 0;
    p.sim.on_packet(1, Action::Drop, move |i| {
        if i.from == 0 && i.dest_qpn == qb && i.opcode == opcode {
            seen += 1;
            return seen == nth;
        }
        false
    });
}

#[test]
fn a_lost_write_packet_is_the_only_one_sent_again() {
    let mut p = setup(selective());
    let bytes = data(64 * 1024, 3);
    p.sim.write_mem(0, p.a, &bytes);
    drop_nth_request(&mut p, Opcode::RC_RDMA_WRITE_MIDDLE, 10);
    p.write(1, 0, bytes.len() as u32);
    p.sim.run(100 * MS);
    p.sim.check_all_sends_completed();
    assert_eq!(p.statuses(0), vec![(1, WcStatus::Success)]);
    same(&p.sim.read_mem(1, p.b, bytes.len()), &bytes, "data");
    // 64 packets, one lost: 65 sent, the lost one twice, every other once.
    let reqs = p.requests();
    assert_eq!(reqs.len(), 65, "{reqs:?}");
    let lost = reqs
        .iter()
        .find(|r| p.times_sent(r.psn) == 2)
        .expect("one PSN twice");
    assert_eq!(lost.psn, reqs[0].psn.add(10));
    let resent = reqs.iter().rposition(|r| r.psn == lost.psn).unwrap();
    assert!(reqs[resent].ack_req, "a retransmission asks for an ACK");
    let (a, b) = (p.counters(0), p.counters(1));
    assert_eq!(a.sel_retransmits, 1);
    assert!(
        b.sack_sent >= 1 && a.sack_rcvd == b.sack_sent,
        "{a:?} {b:?}"
    );
    assert!(
        b.ooo_held >= 50,
        "the packets after the hole were held: {b:?}"
    );
    assert_eq!(a.completer_retry_err, 0, "no timeout");
    p.sim.check();
}

#[test]
fn go_back_n_resends_everything_after_the_same_loss() {
    let mut p = setup(LossRecovery::GoBackN);
    let bytes = data(64 * 1024, 3);
    p.sim.write_mem(0, p.a, &bytes);
    drop_nth_request(&mut p, Opcode::RC_RDMA_WRITE_MIDDLE, 10);
    p.write(1, 0, bytes.len() as u32);
    p.sim.run(100 * MS);
    p.sim.check_all_sends_completed();
    same(&p.sim.read_mem(1, p.b, bytes.len()), &bytes, "data");
    // The baseline: every packet from the lost one on goes again, and nothing selective
    // appears on the wire (the packets are rxe's).
    assert!(p.requests().len() >= 64 + 50, "{}", p.requests().len());
    assert!(p
        .sim
        .trace
        .iter()
        .all(|i| i.opcode != Opcode::SOFTROCE_SACK));
    let (a, b) = (p.counters(0), p.counters(1));
    assert_eq!((a.sack_rcvd, b.sack_sent, b.ooo_held), (0, 0, 0));
    assert_eq!(b.out_of_seq_request, 1);
}

#[test]
fn a_multi_packet_send_survives_losses_and_lands_whole() {
    let mut p = setup(selective());
    let bytes = data(40 * 1024, 9);
    p.sim.write_mem(0, p.a, &bytes);
    p.recv(50, 0, 64 * 1024);
    for nth in [1, 7, 8, 20] {
        drop_nth_request(&mut p, Opcode::RC_SEND_MIDDLE, nth);
    }
    drop_nth_request(&mut p, Opcode::RC_SEND_FIRST, 1);
    p.send(1, 0, bytes.len() as u32);
    p.sim.run(100 * MS);
    p.sim.check_all_sends_completed();
    assert_eq!(p.statuses(0), vec![(1, WcStatus::Success)]);
    assert_eq!(p.statuses(1), vec![(50, WcStatus::Success)]);
    let wc = p.sim.completions_of(1, p.qb)[0];
    assert_eq!(wc.byte_len, bytes.len() as u32);
    same(&p.sim.read_mem(1, p.b, bytes.len()), &bytes, "data");
    assert_eq!(p.requests().len(), 40 + 5);
    p.sim.check();
}

#[test]
fn a_lost_tail_is_probed_after_two_round_trips_and_then_repaired_selectively() {
    let mut p = setup(selective());
    let bytes = data(32 * 1024, 5);
    p.sim.write_mem(0, p.a, &bytes);
    // The last three packets: nothing follows them to reveal the hole.
    let qb = p.qb;
    p.sim.on_packet(3, Action::Drop, move |i| {
        i.from == 0 && i.dest_qpn == qb && i.psn.value() >= 29 && i.psn.value() < 32
    });
    p.write(1, 0, bytes.len() as u32);
    // Recovered within 2 ms: the write completes in that time (the simulator's clock may
    // then move on to deadlines that went away, which the timer queue drops when they come).
    p.sim.run(2 * MS);
    p.sim.check_all_sends_completed();
    same(&p.sim.read_mem(1, p.b, bytes.len()), &bytes, "data");
    let a = p.counters(0);
    // The probe timer (1 ms before any round trip was measured), not the 4.2 ms
    // retransmit timeout (which would count a retry).
    assert_eq!((a.sel_probes, a.completer_retry_err), (1, 0));
    p.sim.run(100 * MS);
    assert_eq!(p.counters(0).sel_probes, 1, "nothing more to probe");
    // The probes (the lowest and highest PSNs not acknowledged: 0, which the responder
    // had, and 31), then 29 and 30 once the SACK for 31 showed them missing.
    let resent: Vec<u32> = p.requests()[32..].iter().map(|r| r.psn.value()).collect();
    assert_eq!(resent, vec![0, 31, 29, 30]);
    assert_eq!(a.sel_retransmits, 4);
}

#[test]
fn several_writes_in_flight_complete_in_order_with_their_bytes() {
    let link = LinkModel {
        loss: 0.05,
        ..Default::default()
    };
    let mut p = setup_with(link, options(selective()), 11);
    let bytes = data(LEN, 1);
    p.sim.write_mem(0, p.a, &bytes);
    for i in 0..8u64 {
        p.write(i, i * 32 * 1024, 32 * 1024);
    }
    p.sim.run(2_000 * MS);
    p.sim.check_all_sends_completed();
    assert_eq!(
        p.statuses(0),
        (0..8).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    same(&p.sim.read_mem(1, p.b, LEN), &bytes, "data");
    p.sim.check();
}

#[test]
fn a_lost_read_response_is_asked_for_again_alone() {
    let mut p = setup(selective());
    let bytes = data(32 * 1024, 7);
    p.sim.write_mem(1, p.b, &bytes);
    let qa = p.qa;
    let mut seen = 0;
    p.sim.on_packet(1, Action::Drop, move |i| {
        if i.from == 1 && i.dest_qpn == qa && i.opcode == Opcode::RC_RDMA_READ_RESPONSE_MIDDLE {
            seen += 1;
            return seen == 5;
        }
        false
    });
    p.read(1, 0, bytes.len() as u32);
    p.sim.run(100 * MS);
    p.sim.check_all_sends_completed();
    assert_eq!(p.statuses(0), vec![(1, WcStatus::Success)]);
    same(&p.sim.read_mem(0, p.a, bytes.len()), &bytes, "data");
    let reads = p.requests();
    assert_eq!(reads.len(), 2, "the READ, then one for the missing packet");
    assert_eq!(reads[1].psn, reads[0].psn.add(5));
    let responses = p
        .sim
        .trace
        .iter()
        .filter(|i| i.from == 1 && i.opcode != Opcode::RC_ACKNOWLEDGE)
        .count();
    assert_eq!(responses, 32 + 1);
    assert_eq!(p.counters(0).completer_retry_err, 0);
}

/// rping's pattern: one READ at a time, its last response lost; nothing follows it.
#[test]
fn a_lost_last_read_response_is_asked_for_again_after_two_round_trips() {
    let mut p = setup(selective());
    let bytes = data(16 * 1024, 4);
    p.sim.write_mem(1, p.b, &bytes);
    let qa = p.qa;
    p.sim.drop_once(move |i| {
        i.from == 1 && i.dest_qpn == qa && i.opcode == Opcode::RC_RDMA_READ_RESPONSE_LAST
    });
    p.read(1, 0, bytes.len() as u32);
    p.sim.run(100 * MS);
    p.sim.check_all_sends_completed();
    same(&p.sim.read_mem(0, p.a, bytes.len()), &bytes, "data");
    let reads: Vec<(u32, u32)> = p
        .requests()
        .iter()
        .map(|r| (r.psn.value(), r.len as u32))
        .collect();
    assert_eq!(
        reads.len(),
        2,
        "the READ, then one for its last packet: {reads:?}"
    );
    assert_eq!(reads[1].0, 15);
    let a = p.counters(0);
    assert_eq!((a.sel_probes, a.completer_retry_err), (1, 0));
    assert!(p.sim.now < 2 * MS, "recovered after {} ns", p.sim.now);
}

#[test]
fn a_lost_atomic_ack_is_answered_from_the_saved_result_once() {
    let mut p = setup(selective());
    p.sim.write_mem(1, p.b, &5u64.to_ne_bytes());
    let qa = p.qa;
    p.sim.drop_once(move |i| {
        i.from == 1 && i.dest_qpn == qa && i.opcode == Opcode::RC_ATOMIC_ACKNOWLEDGE
    });
    let mut fa = SendWr::new(
        1,
        SendOp::FetchAdd {
            remote: RemoteAddr {
                va: p.b,
                rkey: p.kb.rkey,
            },
            add: 10,
        },
        Some(Sge {
            addr: p.a,
            length: 8,
            lkey: p.ka.lkey,
        }),
    );
    fa.flags = SendFlags::SIGNALED;
    p.sim.post_send(0, p.qa, fa).unwrap();
    // A WRITE behind it: its ACK shows the atomic's answer went missing.
    p.sim.write_mem(0, p.a + 4096, &data(2048, 1));
    p.write(2, 4096, 2048);
    p.sim.run(100 * MS);
    p.sim.check_all_sends_completed();
    assert_eq!(
        p.statuses(0),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(p.sim.read_mem(0, p.a, 8), 5u64.to_ne_bytes());
    assert_eq!(p.sim.read_mem(1, p.b, 8), 15u64.to_ne_bytes(), "added once");
    assert_eq!(p.counters(0).completer_retry_err, 0, "no timeout needed");
    assert_eq!(
        p.sent_by(0, Opcode::RC_FETCH_ADD),
        2,
        "the atomic went again"
    );
}

impl Pair {
    fn sent_by(&self, node: usize, op: Opcode) -> usize {
        self.sim
            .trace
            .iter()
            .filter(|i| i.from == node && i.opcode == op)
            .count()
    }
}

#[test]
fn a_black_hole_ends_in_retry_exc_err_after_retry_cnt_timeouts() {
    let o = QpOptions {
        retry_cnt: 3,
        timeout: 10,
        ..options(selective())
    };
    let mut p = setup_with(LinkModel::default(), o, 3);
    // Everything from node 0 after the connection is up vanishes.
    p.sim.on_packet(usize::MAX, Action::Drop, |i| i.from == 0);
    p.write(1, 0, 8192);
    p.write(2, 8192, 8192);
    let start = p.sim.now;
    p.sim.run(10_000 * MS);
    assert_eq!(
        p.statuses(0),
        vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    let failed_at = p.sim.completions_of(0, p.qa)[0];
    let _ = failed_at;
    let timeout = 4096u64 << 10;
    let elapsed = p.sim.now - start;
    assert!(
        elapsed >= 4 * timeout && elapsed < 6 * timeout,
        "(retry_cnt + 1) timeouts: {elapsed} ns"
    );
    assert_eq!(p.counters(0).retry_exceeded_err, 1);
}

#[test]
fn rnr_holds_what_follows_and_resends_only_the_refused_packet() {
    let mut p = setup(selective());
    let bytes = data(8 * 1024, 2);
    p.sim.write_mem(0, p.a, &bytes);
    // Two SENDs; the receive for the first is posted late.
    p.send(1, 0, 4096);
    p.send(2, 4096, 4096);
    p.sim.run(MS / 10);
    assert!(p.counters(1).send_rnr_err >= 1);
    p.recv(10, 0, 4096);
    p.recv(11, 4096, 4096);
    p.sim.run(100 * MS);
    p.sim.check_all_sends_completed();
    assert_eq!(
        p.statuses(1),
        vec![(10, WcStatus::Success), (11, WcStatus::Success)]
    );
    same(&p.sim.read_mem(1, p.b, 8192), &bytes, "data");
    p.sim.check();
}

#[test]
fn reordering_and_duplication_keep_data_and_order() {
    for seed in 1..20 {
        let link = LinkModel {
            jitter: 30_000,
            duplicate: 0.05,
            loss: 0.02,
            ..Default::default()
        };
        let mut p = setup_with(link, options(selective()), seed);
        let bytes = data(LEN, seed as u8);
        p.sim.write_mem(0, p.a, &bytes);
        for i in 0..4u64 {
            p.recv(100 + i, i * 16384, 16384);
        }
        for i in 0..4u64 {
            p.send(i, i * 16384, 16384);
        }
        for i in 4..8u64 {
            p.write(i, i * 16384, 16384);
        }
        for i in 8..12u64 {
            p.sim
                .write_mem(1, p.b + i * 16384, &bytes[i as usize * 16384..][..16384]);
            p.read(i, i * 16384, 16384);
        }
        p.sim.run(5_000 * MS);
        p.sim.check_all_sends_completed();
        assert_eq!(
            p.statuses(0),
            (0..12).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>(),
            "seed {seed}"
        );
        assert_eq!(
            p.statuses(1),
            (100..104)
                .map(|i| (i, WcStatus::Success))
                .collect::<Vec<_>>(),
            "seed {seed}"
        );
        same(
            &p.sim.read_mem(1, p.b, 8 * 16384),
            &bytes[..8 * 16384],
            &format!("seed {seed}"),
        );
        same(
            &p.sim.read_mem(0, p.a + 8 * 16384, 4 * 16384),
            &bytes[8 * 16384..12 * 16384],
            &format!("seed {seed}"),
        );
        p.sim.check();
    }
}

/// One end selective, the other still go-back-N (during negotiation, or a peer forced to
/// selective against one set to gbn): both directions still deliver.
#[test]
fn a_selective_end_and_a_go_back_n_end_still_deliver() {
    for selective_side in [0usize, 1] {
        let link = LinkModel {
            loss: 0.03,
            ..Default::default()
        };
        let mut p = setup_with(link, options(LossRecovery::GoBackN), 21);
        let q = if selective_side == 0 { p.qa } else { p.qb };
        p.sim
            .dev(selective_side)
            .set_loss_recovery(q, selective())
            .unwrap();
        let bytes = data(LEN, 4);
        p.sim.write_mem(0, p.a, &bytes);
        for i in 0..8u64 {
            p.write(i, i * 32 * 1024, 32 * 1024);
        }
        p.sim.run(5_000 * MS);
        p.sim.check_all_sends_completed();
        assert_eq!(
            p.statuses(0),
            (0..8).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>(),
            "selective on {selective_side}"
        );
        same(
            &p.sim.read_mem(1, p.b, LEN),
            &bytes,
            &format!("selective on {selective_side}"),
        );
        p.sim.check();
    }
}

/// The switch from go-back-N to selective happens with packets in flight (the daemon learns
/// the peer is softroce after the first packets went out).
#[test]
fn switching_to_selective_mid_transfer_loses_nothing() {
    // 1 Gbit/s: the 256 KiB take about 2 ms.
    let link = LinkModel {
        loss: 0.02,
        rate_bps: Some(1_000_000_000),
        ..Default::default()
    };
    let mut p = setup_with(link, options(LossRecovery::GoBackN), 5);
    let bytes = data(LEN, 8);
    p.sim.write_mem(0, p.a, &bytes);
    for i in 0..8u64 {
        p.write(i, i * 32 * 1024, 32 * 1024);
    }
    p.sim.run(MS / 2);
    let (qa, qb) = (p.qa, p.qb);
    p.sim.dev(0).set_loss_recovery(qa, selective()).unwrap();
    p.sim.run(MS / 4);
    p.sim.dev(1).set_loss_recovery(qb, selective()).unwrap();
    p.sim.run(5_000 * MS);
    p.sim.check_all_sends_completed();
    assert_eq!(
        p.statuses(0),
        (0..8).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    same(&p.sim.read_mem(1, p.b, LEN), &bytes, "data");
    assert!(p.counters(1).sack_sent > 0);
    assert_eq!(
        p.sim.dev(0).loss_recovery(qa),
        Some(selective()),
        "reported"
    );
    assert!(p
        .sim
        .dev(0)
        .set_loss_recovery(qa, LossRecovery::GoBackN)
        .is_err());
    p.sim.check();
}

/// At the same loss rate, selective retransmission sends far fewer packets than go-back-N
/// (the simulator's deterministic version of the goodput benchmark).
#[test]
fn selective_resends_less_than_go_back_n_and_the_gap_widens_with_loss() {
    let mut ratios = Vec::new();
    for loss in [0.01, 0.05] {
        let mut sent = Vec::new();
        for mode in [LossRecovery::GoBackN, selective()] {
            let link = LinkModel {
                loss,
                delay: 10_000,
                ..Default::default()
            };
            let mut p = setup_with(link, options(mode), 99);
            let bytes = data(LEN, 6);
            p.sim.write_mem(0, p.a, &bytes);
            for i in 0..4u64 {
                p.write(i, i * 64 * 1024, 64 * 1024);
            }
            p.sim.run(20_000 * MS);
            p.sim.check_all_sends_completed();
            same(&p.sim.read_mem(1, p.b, LEN), &bytes, "data");
            sent.push(p.requests().len() as f64);
        }
        let packets = (LEN / 1024) as f64;
        // Selective sends about packets / (1 - loss); go-back-N much more.
        assert!(sent[1] < packets * (1.0 + 3.0 * loss), "{loss}: {sent:?}");
        ratios.push(sent[0] / sent[1]);
    }
    assert!(ratios[0] > 1.3 && ratios[1] > ratios[0], "{ratios:?}");
}

/// ib_write_bw's pattern: 128 WRITEs of 64 KiB in flight at MTU 1024 over a lossy,
/// duplicating link, perftest's timeout (14) and retry count (7).
#[test]
fn a_deep_queue_of_writes_completes_under_loss() {
    for seed in 1..8 {
        let link = LinkModel {
            loss: 0.01,
            duplicate: 0.005,
            delay: 20_000,
            rate_bps: Some(4_000_000_000),
            ..Default::default()
        };
        let o = QpOptions {
            timeout: 14,
            ..options(selective())
        };
        let mut sim = Sim::pair(seed, link);
        let (qa, qb) = sim.connect(0, 1, &o);
        let acc = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
        let (a, ka) = sim.alloc_mr(0, 65536, acc);
        let (b, kb) = sim.alloc_mr(1, 65536, acc);
        for i in 0..128u64 {
            let mut wr = SendWr::new(
                i,
                SendOp::Write(RemoteAddr {
                    va: b,
                    rkey: kb.rkey,
                }),
                Some(Sge {
                    addr: a,
                    length: 65536,
                    lkey: ka.lkey,
                }),
            );
            wr.flags = SendFlags::SIGNALED;
            sim.post_send(0, qa, wr).expect("post");
        }
        sim.run(60_000 * MS);
        let st: Vec<WcStatus> = sim.completions_of(0, qa).iter().map(|w| w.status).collect();
        assert!(
            st.len() == 128 && st.iter().all(|s| *s == WcStatus::Success),
            "seed {seed}: {} completions, first bad {:?}, timeouts {}",
            st.len(),
            st.iter().find(|s| **s != WcStatus::Success),
            sim.dev(0).counters().completer_retry_err
        );
        let _ = qb;
        sim.check();
    }
}

/// One seeded workload of SENDs, WRITEs and READs, run over the same lossy link in both
/// modes: what was delivered (both memories, every completion on both ends) must be
/// identical, and selective retransmission must resend fewer data packets.
struct SweepRun {
    mem_a: Vec<u8>,
    mem_b: Vec<u8>,
    /// (wr_id, status, opcode, byte_len) per completion, requester then responder.
    completions: Vec<(u64, WcStatus, WcOpcode, u32)>,
    /// Request packets (0 → 1) and READ responses (1 → 0) carried.
    data_packets: usize,
}

fn sweep_run(seed: u64, loss: f64, mode: LossRecovery) -> SweepRun {
    let link = LinkModel {
        loss,
        delay: 10_000,
        ..Default::default()
    };
    let mut p = setup_with(link, options(mode), seed);
    p.sim.write_mem(0, p.a, &data(LEN, seed as u8));
    p.sim.write_mem(1, p.b, &data(LEN, 0x80 ^ seed as u8));
    // A small xorshift so the workload depends on the seed only, not on the mode.
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    const SLOT: u64 = 16 * 1024;
    for i in 0..12u64 {
        let len = 1 + (next() % SLOT) as u32;
        let slot = i % 4;
        match next() % 3 {
            // WRITEs into B's first 64 KiB.
            0 => p.write(i, slot * SLOT, len),
            // READs of B's second 64 KiB into A's.
            1 => p.read(i, 4 * SLOT + slot * SLOT, len),
            // SENDs from A's third 64 KiB into receive buffers in B's third 64 KiB.
            _ => {
                p.recv(i, 8 * SLOT + slot * SLOT, SLOT as u32);
                p.send(i, 8 * SLOT + slot * SLOT, len);
            }
        }
    }
    p.sim.run(60_000 * MS);
    p.sim.check_all_sends_completed();
    p.sim.check();
    let mut completions = Vec::new();
    for (node, q) in [(0, p.qa), (1, p.qb)] {
        completions.extend(
            p.sim
                .completions_of(node, q)
                .iter()
                .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len)),
        );
    }
    let (qa, qb) = (p.qa, p.qb);
    let data_packets = p
        .sim
        .trace
        .iter()
        .filter(|i| {
            (i.from == 0 && i.dest_qpn == qb)
                || (i.from == 1 && i.dest_qpn == qa && (0x0d..=0x10).contains(&i.opcode.0))
        })
        .count();
    SweepRun {
        mem_a: p.sim.read_mem(0, p.a, LEN),
        mem_b: p.sim.read_mem(1, p.b, LEN),
        completions,
        data_packets,
    }
}

/// The seeded sweep of the brief: for 0.1 %, 1 % and 5 % loss and 30 seeds each, selective
/// retransmission and go-back-N deliver byte-identical memory and identical completions (all
/// successful), and selective resends fewer data packets, the gap widening with loss.
#[test]
fn seed_sweep_selective_delivers_what_go_back_n_does_with_fewer_retransmissions() {
    let mut report = Vec::new();
    for loss in [0.001, 0.01, 0.05] {
        let (mut gbn_extra, mut sel_extra) = (0usize, 0usize);
        for seed in 1..=30u64 {
            let base = sweep_run(seed, 0.0, LossRecovery::GoBackN);
            let gbn = sweep_run(seed, loss, LossRecovery::GoBackN);
            let sel = sweep_run(seed, loss, selective());
            assert!(
                base.completions.iter().all(|c| c.1 == WcStatus::Success),
                "seed {seed}: {:?}",
                base.completions
            );
            for (name, run) in [("go-back-N", &gbn), ("selective", &sel)] {
                assert_eq!(
                    run.completions, base.completions,
                    "seed {seed}, loss {loss}, {name}: completions"
                );
                same(&run.mem_a, &base.mem_a, "requester memory");
                same(&run.mem_b, &base.mem_b, "responder memory");
            }
            // The lossless run sends each data packet once; the rest are retransmissions.
            gbn_extra += gbn.data_packets - base.data_packets;
            sel_extra += sel.data_packets.saturating_sub(base.data_packets);
        }
        report.push((loss, gbn_extra, sel_extra));
    }
    eprintln!("(loss, go-back-N retransmissions, selective retransmissions): {report:?}");
    for &(loss, gbn, sel) in &report {
        assert!(sel < gbn, "loss {loss}: selective {sel} >= go-back-N {gbn}");
    }
    // Measured (30 seeds): 112 / 6, 1139 / 39, 5759 / 268. Go-back-N resends about a
    // window per loss, selective about the lost packet: an order of magnitude at 1 % and
    // 5 %, and the number of packets saved grows with the loss.
    let ratio = |r: &(f64, usize, usize)| r.1 as f64 / r.2.max(1) as f64;
    let saved = |r: &(f64, usize, usize)| r.1 - r.2;
    assert!(
        ratio(&report[1]) > 5.0 && ratio(&report[2]) > 5.0,
        "{report:?}"
    );
    assert!(
        saved(&report[0]) < saved(&report[1]) && saved(&report[1]) < saved(&report[2]),
        "{report:?}"
    );
}

/// A message longer than the window asks for an ACK often enough that the window never
/// fills unasked: at MTU 4096 a BDP of 128 KiB is a window of 32 packets, and asking only every 64
/// packets, as go-back-N does against its window of 128, left the requester waiting for its
/// probe timer once per window (between two daemons, 1 MiB WRITEs ran at a quarter of the
/// rate of 64 KiB ones). Lossless, a 256 KiB WRITE (64 packets) completes with no probe,
/// and no 17 request packets in a row go without one that asks for an ACK.
#[test]
fn a_message_longer_than_the_window_never_waits_for_a_probe() {
    // `--selective-bdp 131072`, the default until the window grew to 128 packets.
    let params = SelectiveParams {
        bdp_bytes: 128 * 1024,
    };
    let o = QpOptions {
        mtu: Mtu::Mtu4096,
        ..options(LossRecovery::Selective(params))
    };
    let window = params.window(4096);
    assert_eq!(window, 32);
    let mut p = setup_with(LinkModel::default(), o, 5);
    let bytes = data(LEN, 3);
    p.sim.write_mem(0, p.a, &bytes);
    p.write(1, 0, LEN as u32);
    p.sim.run(2 * MS);
    assert_eq!(p.statuses(0), vec![(1, WcStatus::Success)]);
    same(&p.sim.read_mem(1, p.b, LEN), &bytes, "data");
    assert_eq!(p.counters(0).sel_probes, 0);
    let asks: Vec<bool> = p.requests().iter().map(|r| r.ack_req).collect();
    assert_eq!(asks.len(), LEN / 4096, "each packet once");
    // As rxe counts: AckReq once more than half a window went unasked.
    let most_unasked = window as usize / 2;
    for (i, run) in asks.windows(most_unasked + 1).enumerate() {
        assert!(
            run.contains(&true),
            "packets {i}.. ask for no ACK: {asks:?}"
        );
    }
    p.sim.check();
}

/// Response packets node 1 sent to node 0 (READ responses, ACKs aside).
fn read_responses(p: &Pair) -> usize {
    let qa = p.qa;
    p.sim
        .trace
        .iter()
        .filter(|i| {
            i.from == 1
                && i.dest_qpn == qa
                && matches!(
                    i.opcode,
                    Opcode::RC_RDMA_READ_RESPONSE_FIRST
                        | Opcode::RC_RDMA_READ_RESPONSE_MIDDLE
                        | Opcode::RC_RDMA_READ_RESPONSE_LAST
                        | Opcode::RC_RDMA_READ_RESPONSE_ONLY
                )
        })
        .count()
}

/// A 64-packet READ whose responses from the `from`-th on, and everything the responder
/// sends after them (in order, as one QP's packets travel), are 2.5 ms late (a responder
/// behind other READs, or its device thread waiting for a CPU), past the first probe. Returns the pair after the READ completed.
fn late_read_responses(from: usize) -> Pair {
    let mut p = setup(selective());
    let bytes = data(64 * 1024, 9);
    p.sim.write_mem(1, p.b, &bytes);
    let qa = p.qa;
    let mut seen = 0;
    p.sim
        .on_packet(usize::MAX, Action::Delay(5 * MS / 2), move |i| {
            if i.from == 1 && i.dest_qpn == qa {
                seen += 1;
                return seen > from;
            }
            false
        });
    read_completes_within(&mut p, &bytes, 100 * MS);
    assert_eq!(p.counters(0).completer_retry_err, 0);
    p
}

/// READs `bytes` (already in node 1's memory) and checks it completed within `within`,
/// successfully and with those bytes.
fn read_completes_within(p: &mut Pair, bytes: &[u8], within: u64) {
    p.read(1, 0, bytes.len() as u32);
    p.sim.run(within);
    p.sim.check_all_sends_completed();
    p.sim.run(100 * MS);
    assert_eq!(p.statuses(0), vec![(1, WcStatus::Success)]);
    same(&p.sim.read_mem(0, p.a, bytes.len()), bytes, "data");
}

/// MPICH's rendezvous between two daemons: 1 MiB READs, a probe when they were late, and
/// the responder sent each one's rest again (20,000 duplicate responses in 100 round
/// trips). A probe of a READ that has had no response asks for one packet.
#[test]
fn a_probe_of_an_unanswered_read_asks_for_one_packet_not_the_whole_read() {
    let mut p = late_read_responses(0);
    // At 1 ms (no round trip measured yet); the next would come at 3 ms.
    assert_eq!(p.counters(0).sel_probes, 1);
    let reads: Vec<u32> = p.requests().iter().map(|r| r.psn.value()).collect();
    assert_eq!(reads.len(), 2, "the READ and the probe: {reads:?}");
    // The READ's 16th packet: inside any responder's window, were the READ lost.
    assert_eq!(reads[1], reads[0] + 15);
    assert_eq!(
        read_responses(&p),
        64 + 1,
        "the READ once, the probe's one packet"
    );
}

#[test]
fn a_probe_of_a_read_under_way_asks_for_its_last_missing_packet_alone() {
    let mut p = late_read_responses(8);
    // The first eight responses measured a round trip of microseconds: probes at 0.2, 0.6
    // and 1.4 ms (doubling) before the rest arrives at 2.5 ms.
    let probes = p.counters(0).sel_probes as usize;
    assert_eq!(probes, 3);
    let reads: Vec<u32> = p.requests().iter().map(|r| r.psn.value()).collect();
    assert_eq!(
        reads.len(),
        1 + probes,
        "the READ and the probes: {reads:?}"
    );
    assert!(
        reads[1..].iter().all(|&r| r == reads[0] + 63),
        "each probe asks for the last packet: {reads:?}"
    );
    // Each probe cost one response; asking for every missing one, each cost 56.
    assert_eq!(read_responses(&p), 64 + probes);
}

/// A lost READ request: the probe's one packet is held by the responder (it lacks the
/// READ), and its report shows the READ request lost, which goes again whole.
#[test]
fn a_lost_long_read_request_is_found_by_the_probes_packet_and_sent_again() {
    let mut p = setup(selective());
    let bytes = data(64 * 1024, 11);
    p.sim.write_mem(1, p.b, &bytes);
    drop_nth_request(&mut p, Opcode::RC_RDMA_READ_REQUEST, 1);
    // Recovered a round trip after the probe (1 ms, before any round trip was measured),
    // long before the retransmit timeout.
    read_completes_within(&mut p, &bytes, 2 * MS);
    let a = p.counters(0);
    assert_eq!((a.sel_probes, a.completer_retry_err), (1, 0));
    let reads: Vec<u32> = p.requests().iter().map(|r| r.psn.value()).collect();
    assert_eq!(
        reads.len(),
        3,
        "lost, the probe's packet, the whole READ: {reads:?}"
    );
    assert_eq!((reads[1], reads[2]), (reads[0] + 15, reads[0]));
    // The held probe is dropped once the READ it lies in has run: the READ is answered once.
    assert_eq!(read_responses(&p), 64);
    p.sim.check();
}
