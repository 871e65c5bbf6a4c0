//! One scenario per transport behaviour, named after it. Each drives two simulated devices
//! and asserts outcomes: statuses, bytes in memory, counters, and the packets on the wire.

use proto::sim::{Action, LinkModel, PacketInfo, QpOptions, Sim};
use proto::transport::*;
use proto::types::{Psn, Qkey, Qpn, Rkey};
use proto::wire::{self, Opcode};

const MS: u64 = 1_000_000;

struct Pair {
    sim: Sim,
    qa: Qpn,
    qb: Qpn,
    a: u64,
    ka: MrKeys,
    b: u64,
    kb: MrKeys,
}

fn setup(o: QpOptions) -> Pair {
    let mut sim = Sim::pair(7, LinkModel::default());
    let (qa, qb) = sim.connect(0, 1, &o);
    let acc = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
    let (a, ka) = sim.alloc_mr(0, 65536, acc);
    let (b, kb) = sim.alloc_mr(1, 65536, acc);
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

impl Pair {
    fn sge_a(&self, off: u64, len: u32) -> Option<Sge> {
        Some(Sge {
            addr: self.a + off,
            length: len,
            lkey: self.ka.lkey,
        })
    }
    fn sge_b(&self, off: u64, len: u32) -> Sge {
        Sge {
            addr: self.b + off,
            length: len,
            lkey: self.kb.lkey,
        }
    }
    fn remote_b(&self, off: u64) -> RemoteAddr {
        RemoteAddr {
            va: self.b + off,
            rkey: self.kb.rkey,
        }
    }
    fn send(&mut self, wr_id: u64, op: SendOp, off: u64, len: u32) {
        let wr = SendWr::new(wr_id, op, self.sge_a(off, len));
        self.sim.post_send(0, self.qa, wr).expect("post_send");
    }
    fn recv(&mut self, wr_id: u64, off: u64, len: u32) {
        let s = self.sge_b(off, len);
        self.sim
            .post_recv(
                1,
                self.qb,
                RecvWr {
                    wr_id,
                    sg_list: vec![s],
                },
            )
            .expect("post_recv");
    }
    fn statuses_a(&self) -> Vec<(u64, WcStatus)> {
        self.sim
            .completions_of(0, self.qa)
            .iter()
            .map(|w| (w.wr_id, w.status))
            .collect()
    }
    fn statuses_b(&self) -> Vec<(u64, WcStatus)> {
        self.sim
            .completions_of(1, self.qb)
            .iter()
            .map(|w| (w.wr_id, w.status))
            .collect()
    }
    fn sent(&self, op: Opcode) -> Vec<PacketInfo> {
        self.sim
            .trace
            .iter()
            .filter(|p| p.opcode == op)
            .copied()
            .collect()
    }
    fn counters(&mut self, node: usize) -> Counters {
        *self.sim.dev(node).counters()
    }
    fn fill_a(&mut self, off: u64, data: &[u8]) {
        self.sim.write_mem(0, self.a + off, data);
    }
}

fn data(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(salt))
        .collect()
}

fn events(sim: &mut Sim, node: usize) -> Vec<AsyncEvent> {
    std::iter::from_fn(|| sim.dev(node).poll_event()).collect()
}

#[test]
fn lost_ack_is_recovered_by_retransmission_and_a_duplicate_re_ack() {
    let mut p = setup(QpOptions::default());
    p.fill_a(0, &data(100, 1));
    p.recv(10, 0, 4096);
    p.send(1, SendOp::Send, 0, 100);
    p.sim.drop_once(|i| i.opcode == Opcode::RC_ACKNOWLEDGE);
    p.sim.run(100 * MS);
    p.sim.check_all_sends_completed();
    assert_eq!(p.statuses_a(), vec![(1, WcStatus::Success)]);
    assert_eq!(
        p.statuses_b(),
        vec![(10, WcStatus::Success)],
        "executed once"
    );
    assert_eq!(p.sim.read_mem(1, p.b, 100), data(100, 1));
    assert_eq!(p.sent(Opcode::RC_SEND_ONLY).len(), 2);
    assert_eq!(p.counters(1).duplicate_request, 1);
    assert_eq!(p.counters(0).completer_retry_err, 1);
    assert_eq!(p.sent(Opcode::RC_ACKNOWLEDGE).len(), 2);
}

#[test]
fn coalesced_ack_completes_every_earlier_unsignaled_and_signaled_wqe() {
    let mut p = setup(QpOptions::default());
    for i in 0..4 {
        p.recv(10 + i, i * 1024, 1024);
    }
    for i in 0..4 {
        // Each on the wire before the next is posted: each ends what is queued, so each
        // asks for its own ACK.
        p.send(i, SendOp::Send, 0, 10);
        p.sim.run(1);
    }
    // Lose the ACKs of the first three: the fourth's ACK acknowledges them all.
    p.sim
        .on_packet(3, Action::Drop, |i| i.opcode == Opcode::RC_ACKNOWLEDGE);
    p.sim.run(MS);
    assert_eq!(
        p.statuses_a(),
        (0..4).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    assert_eq!(p.counters(0).completer_retry_err, 0, "no retry needed");
    assert!(p.sim.now < MS);
}

#[test]
fn a_burst_of_messages_asks_for_one_ack_that_completes_them_all() {
    // rxe asks for an ACK at the end of every message (the default, on the wire); with
    // coalesced acknowledgement (the shim's same-host fast path) a burst asks for one.
    for (coalesce, acks) in [(false, 8), (true, 1)] {
        let mut p = setup(QpOptions::default());
        p.sim.dev(0).set_coalesce_acks(coalesce);
        for i in 0..8 {
            p.recv(10 + i, i * 1024, 1024);
        }
        // Queued together: with coalescing, only the last one's last packet asks for an ACK
        // (the requester knows the next message follows at once), and that ACK completes all
        // eight.
        for i in 0..8 {
            p.send(i, SendOp::Send, 0, 10);
        }
        p.sim.run(MS);
        assert_eq!(
            p.statuses_a(),
            (0..8).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
        );
        assert_eq!(p.statuses_b().len(), 8);
        assert_eq!(
            p.sent(Opcode::RC_ACKNOWLEDGE).len(),
            acks,
            "coalesce {coalesce}"
        );
    }
}

#[test]
fn implied_nak_retries_a_read_before_the_timer_fires() {
    let mut p = setup(QpOptions {
        timeout: 20,
        ..Default::default()
    }); // 4.3 s timer
    p.sim.write_mem(1, p.b, &data(64, 2));
    p.recv(10, 1024, 1024);
    let r = p.remote_b(0);
    p.send(1, SendOp::Read(r), 0, 64);
    p.send(2, SendOp::Send, 100, 8);
    p.sim
        .drop_once(|i| i.opcode == Opcode::RC_RDMA_READ_RESPONSE_ONLY);
    p.sim.run(10_000 * MS);
    p.sim.check_all_sends_completed();
    assert_eq!(
        p.statuses_a(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(p.sim.read_mem(0, p.a, 64), data(64, 2));
    assert_eq!(p.counters(0).completer_retry_err, 1);
    // The ACK of the SEND implied the loss: the READ went again long before 4.3 s.
    let reads = p.sent(Opcode::RC_RDMA_READ_REQUEST);
    assert_eq!(reads.len(), 2);
    assert!(reads[1].time < MS, "retried at {}", reads[1].time);
    assert_eq!(p.statuses_b(), vec![(10, WcStatus::Success)]);
}

#[test]
fn local_ack_timeout_retransmits_after_4096ns_times_2_pow_timeout() {
    let mut p = setup(QpOptions {
        timeout: 10,
        ..Default::default()
    });
    p.recv(10, 0, 64);
    p.send(1, SendOp::Send, 0, 64);
    p.sim.drop_once(|i| i.opcode == Opcode::RC_SEND_ONLY);
    p.sim.run(100 * MS);
    let sends = p.sent(Opcode::RC_SEND_ONLY);
    assert_eq!(sends.len(), 2);
    assert_eq!(sends[0].psn, sends[1].psn);
    assert_eq!(sends[1].time - sends[0].time, 4096 << 10);
    assert_eq!(p.statuses_a(), vec![(1, WcStatus::Success)]);
}

#[test]
fn retry_limit_exceeded_fails_the_head_with_retry_exc_err_and_flushes_the_rest() {
    let mut p = setup(QpOptions {
        retry_cnt: 2,
        timeout: 8,
        ..Default::default()
    });
    p.sim.set_link(
        0,
        1,
        LinkModel {
            loss: 1.0,
            ..Default::default()
        },
    );
    p.send(1, SendOp::Write(p.remote_b(0)), 0, 8);
    p.send(2, SendOp::Write(p.remote_b(8)), 0, 8);
    p.sim.run(1000 * MS);
    assert_eq!(
        p.statuses_a(),
        vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    let c = p.counters(0);
    assert_eq!(c.retry_exceeded_err, 1);
    assert_eq!(c.completer_retry_err, 2);
    // First transmission plus retry_cnt retries.
    let first = p
        .sent(Opcode::RC_RDMA_WRITE_ONLY)
        .iter()
        .filter(|i| i.psn == Psn::new(0))
        .count();
    assert_eq!(first, 3);
    assert_eq!(p.sim.dev(0).query_qp(p.qa).unwrap().0, QpState::Err);
    assert!(events(&mut p.sim, 0).contains(&AsyncEvent::QpFatal { qpn: p.qa }));
}

#[test]
fn rkey_violation_naks_remote_access_error_and_both_qps_enter_err() {
    let mut p = setup(QpOptions::default());
    let bad = RemoteAddr {
        va: p.b,
        rkey: Rkey(p.kb.rkey.0 ^ 0x5a),
    };
    p.send(1, SendOp::Write(bad), 0, 16);
    p.send(2, SendOp::Send, 0, 16);
    p.recv(10, 0, 64);
    p.sim.run(100 * MS);
    assert_eq!(
        p.statuses_a(),
        vec![(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(p.statuses_b(), vec![(10, WcStatus::WrFlushErr)]);
    let naks: Vec<_> = p
        .sim
        .trace
        .iter()
        .filter(|i| i.syndrome == Some(0x62))
        .collect();
    assert_eq!(naks.len(), 1);
    assert_eq!(p.sim.dev(1).query_qp(p.qb).unwrap().0, QpState::Err);
    assert!(events(&mut p.sim, 1).contains(&AsyncEvent::QpAccessError { qpn: p.qb }));
    // Out of bounds with the right key is refused too.
    let mut p = setup(QpOptions::default());
    p.send(1, SendOp::Write(p.remote_b(65536 - 8)), 0, 16);
    p.sim.run(100 * MS);
    assert_eq!(p.statuses_a(), vec![(1, WcStatus::RemAccessErr)]);
}

#[test]
fn rnr_retry_waits_the_rnr_timer_then_succeeds_once_a_receive_is_posted() {
    let mut p = setup(QpOptions {
        min_rnr_timer: 14,
        rnr_retry: 7,
        ..Default::default()
    }); // 1.28 ms
    p.fill_a(0, &data(32, 3));
    p.send(1, SendOp::Send, 0, 32);
    p.sim.run(3 * MS); // two or three RNR NAKs
    assert!(p.statuses_a().is_empty());
    p.recv(10, 0, 64);
    p.sim.run(100 * MS);
    assert_eq!(p.statuses_a(), vec![(1, WcStatus::Success)]);
    assert_eq!(p.statuses_b(), vec![(10, WcStatus::Success)]);
    assert_eq!(p.sim.read_mem(1, p.b, 32), data(32, 3));
    let rnr: Vec<_> = p
        .sim
        .trace
        .iter()
        .filter(|i| i.syndrome == Some(0x20 | 14))
        .copied()
        .collect();
    assert!(rnr.len() >= 2);
    assert_eq!(p.counters(0).rcvd_rnr_err, rnr.len() as u64);
    assert_eq!(p.counters(1).send_rnr_err, rnr.len() as u64);
    // Each resend waits the 1.28 ms of code 14 after the RNR NAK.
    let sends = p.sent(Opcode::RC_SEND_ONLY);
    for (nak, resend) in rnr.iter().zip(sends.iter().skip(1)) {
        assert!(
            resend.time >= nak.time + 1_280_000,
            "{resend:?} after {nak:?}"
        );
    }
}

#[test]
fn rnr_exhaustion_fails_with_rnr_retry_exc_err() {
    let mut p = setup(QpOptions {
        min_rnr_timer: 1,
        rnr_retry: 2,
        ..Default::default()
    });
    p.send(1, SendOp::Send, 0, 32);
    p.send(2, SendOp::Send, 0, 32);
    p.sim.run(100 * MS);
    assert_eq!(
        p.statuses_a(),
        vec![(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    let c = p.counters(0);
    assert_eq!(c.rcvd_rnr_err, 3);
    assert_eq!(c.retry_rnr_exceeded_err, 1);
}

#[test]
fn partial_retry_of_a_long_read_asks_only_for_the_missing_bytes() {
    let mut p = setup(QpOptions {
        mtu: Mtu::Mtu256,
        timeout: 8,
        ..Default::default()
    });
    let d = data(2560, 4);
    p.sim.write_mem(1, p.b, &d);
    p.send(1, SendOp::Read(p.remote_b(0)), 0, 2560);
    p.sim
        .drop_once(|i| i.opcode == Opcode::RC_RDMA_READ_RESPONSE_MIDDLE && i.psn == Psn::new(4));
    p.sim.run(100 * MS);
    assert_eq!(p.statuses_a(), vec![(1, WcStatus::Success)]);
    assert_eq!(p.sim.read_mem(0, p.a, 2560), d);
    let reads = p.sent(Opcode::RC_RDMA_READ_REQUEST);
    assert_eq!(
        reads.iter().map(|r| r.psn.value()).collect::<Vec<_>>(),
        vec![0, 4]
    );
    // The replay starts with a FIRST at PSN 4 and covers PSNs 4..=9 only.
    let firsts = p.sent(Opcode::RC_RDMA_READ_RESPONSE_FIRST);
    assert_eq!(
        firsts.iter().map(|r| r.psn.value()).collect::<Vec<_>>(),
        vec![0, 4]
    );
    assert_eq!(p.counters(1).duplicate_request, 1);
    let (req, comp, _) = p.sim.dev(0).qp_psns(p.qa).unwrap();
    assert_eq!((req.value(), comp.value()), (10, 10));
}

/// A hand-made RC packet from node 0 to node 1.
fn craft(opcode: Opcode, dest: Qpn, psn: Psn, payload: &[u8]) -> Vec<u8> {
    craft_from("10.0.0.1", 0xffff, opcode, dest, psn, payload)
}

fn craft_from(
    src: &str,
    pkey: u16,
    opcode: Opcode,
    dest: Qpn,
    psn: Psn,
    payload: &[u8],
) -> Vec<u8> {
    let mut t = wire::TransportRepr::new(wire::BthRepr {
        opcode,
        solicited: false,
        mig_req: false,
        pkey,
        fecn: false,
        becn: false,
        dest_qpn: dest,
        ack_req: true,
        psn,
    });
    t.payload_len = payload.len();
    let mut f = wire::FrameRepr {
        link: wire::LinkRepr::None,
        net: wire::NetRepr::Ipv4(wire::Ipv4Repr {
            src: src.parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
            tos: 0,
            ident: 0,
            dont_frag: true,
            ttl: 64,
            protocol: 17,
            payload_len: 0,
        }),
        udp: Some(wire::UdpRepr {
            src_port: 0xc000,
            dst_port: 4791,
            checksum: 0,
            payload_len: 0,
        }),
        transport: t,
    };
    f.fill_lengths();
    let mut buf = vec![0u8; f.buffer_len()];
    f.emit(&mut buf, payload).unwrap();
    buf
}

#[test]
fn unexpected_opcode_is_naked_invalid_request_and_fails_with_rem_inv_req_err() {
    let mut p = setup(QpOptions::default());
    p.recv(10, 0, 4096);
    p.send(1, SendOp::Send, 0, 64);
    // The real SEND_ONLY is lost; in its place arrives a SEND_MIDDLE with no FIRST before it.
    p.sim.drop_once(|i| i.opcode == Opcode::RC_SEND_ONLY);
    p.sim.inject(
        1,
        1_000,
        craft(Opcode::RC_SEND_MIDDLE, p.qb, Psn::new(0), &[0u8; 1024]),
    );
    p.sim.run(100 * MS);
    assert_eq!(p.statuses_a(), vec![(1, WcStatus::RemInvReqErr)]);
    assert_eq!(p.statuses_b(), vec![(10, WcStatus::WrFlushErr)]);
    assert!(p.sim.trace.iter().any(|i| i.syndrome == Some(0x61)));
    assert_eq!(p.sim.dev(1).query_qp(p.qb).unwrap().0, QpState::Err);
    assert!(events(&mut p.sim, 1).contains(&AsyncEvent::QpRequestError { qpn: p.qb }));
}

#[test]
fn remote_operational_error_from_a_malformed_receive_wqe() {
    let mut p = setup(QpOptions::default());
    let bad = Sge {
        addr: p.b,
        length: 64,
        lkey: proto::types::Lkey(0xdead_be00),
    };
    p.sim
        .post_recv(
            1,
            p.qb,
            RecvWr {
                wr_id: 10,
                sg_list: vec![bad],
            },
        )
        .unwrap();
    p.send(1, SendOp::Send, 0, 32);
    p.sim.run(100 * MS);
    assert_eq!(p.statuses_a(), vec![(1, WcStatus::RemOpErr)]);
    assert_eq!(p.statuses_b(), vec![(10, WcStatus::LocProtErr)]);
    assert!(p.sim.trace.iter().any(|i| i.syndrome == Some(0x63)));
}

#[test]
fn receive_buffer_too_small_is_a_length_error() {
    let mut p = setup(QpOptions::default());
    p.recv(10, 0, 16);
    p.send(1, SendOp::Send, 0, 32);
    p.sim.run(100 * MS);
    assert_eq!(p.statuses_a(), vec![(1, WcStatus::RemInvReqErr)]);
    assert_eq!(p.statuses_b(), vec![(10, WcStatus::LocLenErr)]);
}

#[test]
fn duplicate_atomic_is_answered_from_the_reply_cache_not_executed_twice() {
    let mut p = setup(QpOptions {
        timeout: 8,
        ..Default::default()
    });
    p.sim.write_mem(1, p.b, &40u64.to_ne_bytes());
    p.send(
        1,
        SendOp::FetchAdd {
            remote: p.remote_b(0),
            add: 2,
        },
        0,
        8,
    );
    p.send(
        2,
        SendOp::CompareSwap {
            remote: p.remote_b(0),
            compare: 42,
            swap: 7,
        },
        8,
        8,
    );
    // Lose the first atomic ACK (timeout resend) and duplicate the second request on the wire.
    p.sim
        .drop_once(|i| i.opcode == Opcode::RC_ATOMIC_ACKNOWLEDGE);
    p.sim.on_packet(1, Action::Duplicate, |i| {
        i.opcode == Opcode::RC_COMPARE_SWAP
    });
    p.sim.run(100 * MS);
    assert_eq!(
        p.statuses_a(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(p.sim.read_mem(0, p.a, 8), 40u64.to_ne_bytes());
    assert_eq!(p.sim.read_mem(0, p.a + 8, 8), 42u64.to_ne_bytes());
    assert_eq!(
        p.sim.read_mem(1, p.b, 8),
        7u64.to_ne_bytes(),
        "add once, swap once"
    );
    assert!(p.counters(1).duplicate_request >= 2);
}

#[test]
fn psn_sequence_error_nak_goes_back_n_from_the_missing_packet() {
    let mut p = setup(QpOptions {
        mtu: Mtu::Mtu256,
        timeout: 20,
        ..Default::default()
    });
    let d = data(768, 5);
    p.fill_a(0, &d);
    p.send(1, SendOp::Write(p.remote_b(0)), 0, 768);
    p.sim
        .drop_once(|i| i.opcode == Opcode::RC_RDMA_WRITE_MIDDLE);
    p.sim.run(100 * MS);
    assert_eq!(p.statuses_a(), vec![(1, WcStatus::Success)]);
    assert_eq!(p.sim.read_mem(1, p.b, 768), d);
    assert_eq!(p.sent(Opcode::RC_RDMA_WRITE_FIRST).len(), 1);
    assert_eq!(p.sent(Opcode::RC_RDMA_WRITE_MIDDLE).len(), 2);
    assert_eq!(p.counters(1).out_of_seq_request, 1);
    assert_eq!(p.counters(0).rcvd_seq_err, 1);
    assert!(p
        .sim
        .trace
        .iter()
        .any(|i| i.syndrome == Some(0x60) && i.psn == Psn::new(1)));
    assert!(
        p.sim.now < 10 * MS,
        "recovered by the NAK, not the 4 s timer"
    );
}

#[test]
fn corrupted_packet_is_caught_by_the_icrc_and_retransmitted() {
    let mut p = setup(QpOptions {
        timeout: 8,
        ..Default::default()
    });
    let d = data(500, 6);
    p.fill_a(0, &d);
    p.send(1, SendOp::Write(p.remote_b(0)), 0, 500);
    p.sim.on_packet(1, Action::Corrupt, |i| {
        i.opcode == Opcode::RC_RDMA_WRITE_ONLY
    });
    p.sim.run(100 * MS);
    assert_eq!(p.counters(1).icrc_errors, 1);
    assert_eq!(p.statuses_a(), vec![(1, WcStatus::Success)]);
    assert_eq!(p.sim.read_mem(1, p.b, 500), d);
}

#[test]
fn ack_request_is_set_on_message_ends_and_every_65th_packet() {
    let mut p = setup(QpOptions {
        mtu: Mtu::Mtu256,
        ..Default::default()
    });
    p.send(1, SendOp::Write(p.remote_b(0)), 0, 256 * 150);
    p.sim.run(100 * MS);
    assert_eq!(p.statuses_a(), vec![(1, WcStatus::Success)]);
    let acked: Vec<u32> = p
        .sim
        .trace
        .iter()
        .filter(|i| i.from == 0 && i.ack_req)
        .map(|i| i.psn.value())
        .collect();
    assert_eq!(acked, vec![64, 129, 149]);
    let acks: Vec<u32> = p
        .sent(Opcode::RC_ACKNOWLEDGE)
        .iter()
        .map(|i| i.psn.value())
        .collect();
    assert_eq!(
        acks,
        vec![64, 129, 149],
        "the responder ACKs only AckReq packets"
    );
}

#[test]
fn max_rd_atomic_limits_reads_in_flight() {
    let mut p = setup(QpOptions {
        max_rd_atomic: 1,
        ..Default::default()
    });
    for i in 0..3 {
        p.send(i, SendOp::Read(p.remote_b(i * 64)), i * 64, 64);
    }
    p.sim.run(100 * MS);
    assert_eq!(p.statuses_a().len(), 3);
    let reqs = p.sent(Opcode::RC_RDMA_READ_REQUEST);
    let resps = p.sent(Opcode::RC_RDMA_READ_RESPONSE_ONLY);
    assert_eq!((reqs.len(), resps.len()), (3, 3));
    for k in 1..3 {
        assert!(
            reqs[k].time > resps[k - 1].time,
            "read {k} waited for the previous response"
        );
    }
}

#[test]
fn uc_lost_packet_drops_the_rest_of_its_message() {
    let mut p = setup(QpOptions {
        qp_type: QpType::Uc,
        mtu: Mtu::Mtu256,
        ..Default::default()
    });
    p.recv(10, 0, 1024);
    p.recv(11, 1024, 1024);
    p.fill_a(0, &data(768, 7));
    p.fill_a(1024, &data(100, 8));
    p.send(1, SendOp::Send, 0, 768);
    p.send(2, SendOp::Send, 1024, 100);
    p.sim.drop_once(|i| i.opcode == Opcode::UC_SEND_MIDDLE);
    p.sim.run(100 * MS);
    assert_eq!(
        p.statuses_a(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    let b = p.sim.completions_of(1, p.qb);
    assert_eq!(b.len(), 1, "the broken message completes nothing");
    assert_eq!(
        (b[0].wr_id, b[0].byte_len),
        (10, 100),
        "its receive WQE serves the next message"
    );
    assert_eq!(p.sim.read_mem(1, p.b, 100), data(100, 8));
    assert!(
        p.sent(Opcode::RC_ACKNOWLEDGE).is_empty(),
        "UC is never acknowledged"
    );
}

fn ud_pair() -> (Sim, Qpn, Qpn, u32) {
    let mut sim = Sim::pair(3, LinkModel::default());
    let o = QpOptions {
        qp_type: QpType::Ud,
        ..Default::default()
    };
    let qa = sim.create_qp(0, &o);
    let qb = sim.create_qp(1, &o);
    sim.bring_up(0, qa, 1, qb, &o);
    sim.bring_up(1, qb, 0, qa, &o);
    let pd = sim.nodes[0].pd;
    let ah = sim
        .dev(0)
        .create_ah(pd, AddressVector::new("10.0.0.2".parse().unwrap()))
        .unwrap();
    (sim, qa, qb, ah)
}

#[test]
fn ud_receive_gets_the_grh_area_and_a_wrong_qkey_is_dropped() {
    let (mut sim, qa, qb, ah) = ud_pair();
    let acc = Access::LOCAL_WRITE;
    let (a, ka) = sim.alloc_mr(0, 8192, acc);
    let (b, kb) = sim.alloc_mr(1, 4096, acc);
    sim.write_mem(0, a, &data(100, 9));
    for i in 0..2 {
        sim.post_recv(
            1,
            qb,
            RecvWr {
                wr_id: 10 + i,
                sg_list: vec![Sge {
                    addr: b + i * 1024,
                    length: 1024,
                    lkey: kb.lkey,
                }],
            },
        )
        .unwrap();
    }
    let send = |qkey: u32, wr_id: u64, len: u32| SendWr {
        ud: Some(UdDest {
            ah,
            remote_qpn: qb,
            remote_qkey: Qkey(qkey),
        }),
        ..SendWr::new(
            wr_id,
            SendOp::SendWithImm(0x1234_5678),
            Some(Sge {
                addr: a,
                length: len,
                lkey: ka.lkey,
            }),
        )
    };
    sim.post_send(0, qa, send(0x1111_1111, 1, 100)).unwrap();
    sim.post_send(0, qa, send(0x2222_2222, 2, 100)).unwrap();
    // Above the port's 4096-byte MTU: not sent, yet successful (IBTA C10-93.1.1).
    sim.post_send(0, qa, send(0x1111_1111, 3, 5000)).unwrap();
    sim.run(100 * MS);
    let a_st: Vec<_> = sim
        .completions_of(0, qa)
        .iter()
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(
        a_st,
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success)
        ]
    );
    assert_eq!(
        sim.trace
            .iter()
            .filter(|i| i.opcode == Opcode::UD_SEND_ONLY_WITH_IMMEDIATE)
            .count(),
        2
    );
    let got = sim.completions_of(1, qb);
    assert_eq!(got.len(), 1);
    let wc = got[0];
    assert_eq!(
        (wc.wr_id, wc.byte_len, wc.src_qp, wc.imm_data),
        (10, 140, qa, 0x1234_5678)
    );
    assert!(wc.wc_flags.contains(WcFlags::GRH) && wc.wc_flags.contains(WcFlags::WITH_IMM));
    let grh = sim.read_mem(1, b, 40);
    assert_eq!(&grh[..20], &[0u8; 20]);
    assert_eq!(grh[20], 0x45, "the IPv4 header sits in the last 20 bytes");
    assert_eq!(&grh[32..36], &[10, 0, 0, 1]);
    assert_eq!(sim.read_mem(1, b + 40, 100), data(100, 9));
    assert_eq!(sim.dev(1).counters().qkey_viol_cntr, 1);
}

#[test]
fn ud_multicast_reaches_every_attached_qp() {
    let (mut sim, qa, qb, _) = ud_pair();
    let o = QpOptions {
        qp_type: QpType::Ud,
        ..Default::default()
    };
    let qc = sim.create_qp(1, &o);
    sim.bring_up(1, qc, 0, qa, &o);
    let group: std::net::IpAddr = "239.1.1.1".parse().unwrap();
    sim.dev(1).attach_mcast(qb, group).unwrap();
    sim.dev(1).attach_mcast(qc, group).unwrap();
    let pd = sim.nodes[0].pd;
    let ah = sim.dev(0).create_ah(pd, AddressVector::new(group)).unwrap();
    let (a, ka) = sim.alloc_mr(0, 4096, Access::LOCAL_WRITE);
    let (b, kb) = sim.alloc_mr(1, 4096, Access::LOCAL_WRITE);
    for (i, q) in [qb, qc].into_iter().enumerate() {
        sim.post_recv(
            1,
            q,
            RecvWr {
                wr_id: 10 + i as u64,
                sg_list: vec![Sge {
                    addr: b + i as u64 * 1024,
                    length: 1024,
                    lkey: kb.lkey,
                }],
            },
        )
        .unwrap();
    }
    let wr = SendWr {
        ud: Some(UdDest {
            ah,
            remote_qpn: Qpn::MULTICAST,
            remote_qkey: Qkey(0x1111_1111),
        }),
        ..SendWr::new(
            1,
            SendOp::Send,
            Some(Sge {
                addr: a,
                length: 10,
                lkey: ka.lkey,
            }),
        )
    };
    sim.post_send(0, qa, wr).unwrap();
    sim.run(MS);
    assert_eq!(sim.completions_of(1, qb).len(), 1);
    assert_eq!(sim.completions_of(1, qc).len(), 1);
    sim.dev(1).detach_mcast(qc, group).unwrap();
    assert!(sim.dev(1).detach_mcast(qc, group).is_err());
}

#[test]
fn srq_limit_event_fires_once_when_the_queue_drops_below_the_limit() {
    let mut sim = Sim::pair(5, LinkModel::default());
    let pd = sim.nodes[1].pd;
    let srq = sim.dev(1).create_srq(pd, 16, 2).unwrap();
    let o = QpOptions::default();
    let qa = sim.create_qp(0, &o);
    let qb = sim.create_qp(
        1,
        &QpOptions {
            srq: Some(srq),
            ..o
        },
    );
    sim.bring_up(0, qa, 1, qb, &o);
    sim.bring_up(1, qb, 0, qa, &o);
    let (a, ka) = sim.alloc_mr(0, 4096, Access::LOCAL_WRITE);
    let (b, kb) = sim.alloc_mr(1, 4096, Access::LOCAL_WRITE);
    for i in 0..3u64 {
        sim.dev(1)
            .post_srq_recv(
                srq,
                RecvWr {
                    wr_id: 10 + i,
                    sg_list: vec![Sge {
                        addr: b + i * 64,
                        length: 64,
                        lkey: kb.lkey,
                    }],
                },
            )
            .unwrap();
    }
    assert!(
        sim.dev(1)
            .post_recv(
                qb,
                RecvWr {
                    wr_id: 0,
                    sg_list: vec![]
                }
            )
            .is_err(),
        "QP uses an SRQ"
    );
    sim.dev(1).arm_srq_limit(srq, 2).unwrap();
    sim.post_send(
        0,
        qa,
        SendWr::new(
            1,
            SendOp::Send,
            Some(Sge {
                addr: a,
                length: 8,
                lkey: ka.lkey,
            }),
        ),
    )
    .unwrap();
    sim.run(MS);
    assert!(
        events(&mut sim, 1).is_empty(),
        "two left: not below the limit"
    );
    sim.post_send(
        0,
        qa,
        SendWr::new(
            2,
            SendOp::Send,
            Some(Sge {
                addr: a,
                length: 8,
                lkey: ka.lkey,
            }),
        ),
    )
    .unwrap();
    sim.post_send(
        0,
        qa,
        SendWr::new(
            3,
            SendOp::Send,
            Some(Sge {
                addr: a,
                length: 8,
                lkey: ka.lkey,
            }),
        ),
    )
    .unwrap();
    sim.run(MS);
    assert_eq!(
        events(&mut sim, 1),
        vec![AsyncEvent::SrqLimitReached { srq }]
    );
    let ids: Vec<u64> = sim.completions_of(1, qb).iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, vec![10, 11, 12]);
}

#[test]
fn entering_err_flushes_every_outstanding_wr_in_order() {
    let mut p = setup(QpOptions::default());
    p.sim.set_link(
        0,
        1,
        LinkModel {
            loss: 1.0,
            ..Default::default()
        },
    );
    for i in 1..=3 {
        p.send(i, SendOp::Write(p.remote_b(0)), 0, 8);
    }
    p.recv(10, 0, 8);
    p.recv(11, 0, 8);
    p.sim.run(MS / 10);
    let err = QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    p.sim.dev(0).modify_qp(p.qa, &err, AttrMask::STATE).unwrap();
    p.sim.dev(1).modify_qp(p.qb, &err, AttrMask::STATE).unwrap();
    p.sim.run(100 * MS);
    assert_eq!(
        p.statuses_a(),
        (1..=3)
            .map(|i| (i, WcStatus::WrFlushErr))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        p.statuses_b(),
        vec![(10, WcStatus::WrFlushErr), (11, WcStatus::WrFlushErr)]
    );
    // Posting in ERR completes at once with a flush.
    p.send(4, SendOp::Send, 0, 8);
    p.sim.drain_completions();
    assert_eq!(p.statuses_a().last(), Some(&(4, WcStatus::WrFlushErr)));
    // RESET clears everything without completions; RESET -> RTS is not a transition.
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..Default::default()
    };
    p.sim
        .dev(0)
        .modify_qp(p.qa, &reset, AttrMask::STATE)
        .unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..Default::default()
    };
    assert!(matches!(
        p.sim.dev(0).modify_qp(p.qa, &rts, AttrMask::STATE),
        Err(VerbsError::Invalid(_))
    ));
}

#[test]
fn sqd_drains_then_raises_sq_drained() {
    let mut p = setup(QpOptions::default());
    p.send(1, SendOp::Write(p.remote_b(0)), 0, 8);
    p.sim.run(100); // sent, not yet acknowledged
    let sqd = QpAttr {
        qp_state: QpState::Sqd,
        en_sqd_async_notify: true,
        ..Default::default()
    };
    p.sim
        .dev(0)
        .modify_qp(
            p.qa,
            &sqd,
            AttrMask::STATE.union(AttrMask::EN_SQD_ASYNC_NOTIFY),
        )
        .unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..Default::default()
    };
    assert!(matches!(
        p.sim.dev(0).modify_qp(p.qa, &rts, AttrMask::STATE),
        Err(VerbsError::Busy(_))
    ));
    // New work waits in SQD.
    p.send(2, SendOp::Write(p.remote_b(8)), 0, 8);
    p.sim.run(MS);
    assert_eq!(p.statuses_a(), vec![(1, WcStatus::Success)]);
    assert_eq!(
        events(&mut p.sim, 0),
        vec![AsyncEvent::SqDrained { qpn: p.qa }]
    );
    p.sim.dev(0).modify_qp(p.qa, &rts, AttrMask::STATE).unwrap();
    p.sim.run(MS);
    assert_eq!(
        p.statuses_a(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
}

#[test]
fn send_with_invalidate_of_a_registered_mr_fails_at_the_responder_only() {
    // Kernel rxe (seen live, docs/interop.md): an ibv_reg_mr region cannot be invalidated
    // remotely; the SEND is still ACKed (the requester succeeds), the receive completes with
    // REM_INV_REQ_ERR, the responder's QP goes to ERR (its other receive is flushed).
    let mut p = setup(QpOptions::default());
    p.recv(10, 0, 64);
    p.recv(11, 0, 64);
    p.send(1, SendOp::SendWithInv(p.kb.rkey), 0, 8);
    p.sim.run(MS);
    assert_eq!(p.statuses_a(), vec![(1, WcStatus::Success)]);
    assert_eq!(
        p.statuses_b(),
        vec![(10, WcStatus::RemInvReqErr), (11, WcStatus::WrFlushErr)]
    );
}

#[test]
fn local_invalidate_revokes_rkeys() {
    // LOCAL_INV on the responder's own MR, ordered with its send queue.
    let mut p = setup(QpOptions::default());
    let inv = SendWr::new(7, SendOp::LocalInv(p.kb.rkey), None);
    p.sim.post_send(1, p.qb, inv).unwrap();
    p.sim.run(MS);
    assert_eq!(p.statuses_b(), vec![(7, WcStatus::Success)]);
    p.send(1, SendOp::Write(p.remote_b(0)), 0, 8);
    p.sim.run(MS);
    assert_eq!(p.statuses_a(), vec![(1, WcStatus::RemAccessErr)]);
}

#[test]
fn atomic_write_and_flush_are_answered_with_empty_read_responses() {
    let mut p = setup(QpOptions::default());
    p.send(
        1,
        SendOp::AtomicWrite {
            remote: p.remote_b(16),
            value: 0x0102_0304_0506_0708,
        },
        0,
        0,
    );
    p.send(
        2,
        SendOp::Flush {
            remote: p.remote_b(0),
            len: 64,
            placement: 1,
        },
        0,
        0,
    );
    p.sim.run(MS);
    assert_eq!(
        p.statuses_a(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(
        p.sim.read_mem(1, p.b + 16, 8),
        0x0102_0304_0506_0708u64.to_ne_bytes()
    );
    let empty: Vec<_> = p
        .sent(Opcode::RC_RDMA_READ_RESPONSE_ONLY)
        .iter()
        .map(|i| i.psn.value())
        .collect();
    assert_eq!(empty, vec![0, 1]);
}

#[test]
fn solicited_event_notifies_an_armed_cq_only_for_solicited_messages() {
    let mut p = setup(QpOptions::default());
    p.recv(10, 0, 64);
    p.recv(11, 64, 64);
    let cq = p.sim.nodes[1].cq;
    p.sim.dev(1).req_notify_cq(cq, true).unwrap();
    p.send(1, SendOp::Send, 0, 8);
    p.sim.run(MS);
    assert!(events(&mut p.sim, 1).is_empty());
    let mut wr = SendWr::new(2, SendOp::Send, p.sge_a(0, 8));
    wr.flags = SendFlags::SIGNALED.union(SendFlags::SOLICITED);
    p.sim.post_send(0, p.qa, wr).unwrap();
    p.sim.run(MS);
    assert_eq!(events(&mut p.sim, 1), vec![AsyncEvent::CqNotify { cq }]);
    assert!(p.sim.completions_of(1, p.qb)[1].solicited);
}

#[test]
fn no_completion_after_destroy() {
    let mut p = setup(QpOptions::default());
    p.send(1, SendOp::Write(p.remote_b(0)), 0, 8);
    p.sim.destroy_qp(0, p.qa);
    p.sim.run(100 * MS);
    assert!(p.sim.completions_of(0, p.qa).is_empty());
    p.sim.check();
}

#[test]
fn post_send_before_rts_is_refused_and_bad_work_requests_are_einval() {
    let mut sim = Sim::pair(1, LinkModel::default());
    let o = QpOptions::default();
    let q = sim.create_qp(0, &o);
    let wr = SendWr::new(1, SendOp::Send, None);
    assert_eq!(sim.dev(0).post_send(q, wr.clone()).unwrap_err().errno(), 22);
    let (qa, _) = sim.connect(0, 1, &o);
    let misaligned = SendOp::FetchAdd {
        remote: RemoteAddr {
            va: 4,
            rkey: Rkey(1),
        },
        add: 1,
    };
    let one = Sge {
        addr: 0,
        length: 8,
        lkey: proto::types::Lkey(1),
    };
    let sge = Some(one);
    assert!(sim
        .dev(0)
        .post_send(qa, SendWr::new(1, misaligned, sge))
        .is_err());
    let too_many = SendWr {
        sg_list: vec![one; 5],
        ..wr
    };
    assert!(sim.dev(0).post_send(qa, too_many).is_err());
}

#[test]
fn packets_leave_with_rxe_headers() {
    let mut p = setup(QpOptions::default());
    p.send(1, SendOp::Write(p.remote_b(0)), 0, 5);
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    let tx = p.sim.dev(0).poll_transmit(0, &mut buf).unwrap();
    let f = wire::FrameRepr::parse_ip(&buf[..tx.len], tx.len).unwrap();
    f.verified().unwrap();
    let wire::NetRepr::Ipv4(ip) = f.repr.net else {
        panic!("not IPv4")
    };
    assert!(ip.dont_frag);
    assert_eq!(ip.ttl, 64);
    let udp = f.repr.udp.unwrap();
    assert_eq!(udp.dst_port, 4791);
    assert_eq!(udp.checksum, 0);
    assert!(udp.src_port >= 0xc000);
    let t = f.repr.transport;
    assert_eq!(t.bth.pkey, 0xffff);
    assert!(t.bth.ack_req);
    assert_eq!(t.bth.dest_qpn, p.qb);
    assert_eq!(t.bth.opcode, Opcode::RC_RDMA_WRITE_ONLY);
    assert_eq!(t.reth.unwrap().len, 5);
    assert_eq!(t.pad_count(), 3);
    assert_eq!(tx.transport_offset, 28);
}

#[test]
fn memory_windows_bind_grant_a_range_and_type2_is_invalidated_by_send_with_invalidate() {
    let mut p = setup(QpOptions::default());
    let acc = Access::ALL_REMOTE
        .union(Access::LOCAL_WRITE)
        .union(Access::MW_BIND);
    let (w, kw) = p.sim.alloc_mr(1, 8192, acc);
    let pd = p.sim.nodes[1].pd;
    let (_, mw2) = p.sim.dev(1).alloc_mw(pd, MwType::Type2).unwrap();
    let (_, mw1) = p.sim.dev(1).alloc_mw(pd, MwType::Type1).unwrap();
    assert!(
        mw2.0 >> 8 > 1 << 19,
        "window keys have their own index range"
    );
    let bind = |mw: Rkey, key: u8, access: Access| SendOp::BindMw {
        mw_rkey: mw,
        mr_lkey: kw.lkey,
        addr: w + 1024,
        length: 1024,
        access,
        key,
    };
    let rw = Access::REMOTE_WRITE.union(Access::REMOTE_READ);
    p.sim
        .post_send(1, p.qb, SendWr::new(20, bind(mw2, 0x42, rw), None))
        .unwrap();
    p.sim
        .post_send(
            1,
            p.qb,
            SendWr::new(21, bind(mw1, 0x43, Access::REMOTE_READ), None),
        )
        .unwrap();
    // Binding a type 2 window that is already bound fails.
    p.sim.run(MS);
    assert_eq!(
        p.statuses_b(),
        vec![(20, WcStatus::Success), (21, WcStatus::Success)]
    );
    let mw2 = Rkey((mw2.0 & !0xff) | 0x42);
    let mw1 = Rkey((mw1.0 & !0xff) | 0x43);
    p.fill_a(0, &data(64, 11));
    // Inside the window: allowed. Through the type 1 window (read only), a READ works.
    p.send(
        1,
        SendOp::Write(RemoteAddr {
            va: w + 1024,
            rkey: mw2,
        }),
        0,
        64,
    );
    p.send(
        2,
        SendOp::Read(RemoteAddr {
            va: w + 1024,
            rkey: mw1,
        }),
        4096,
        64,
    );
    p.sim.run(MS);
    assert_eq!(
        p.statuses_a(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(p.sim.read_mem(1, w + 1024, 64), data(64, 11));
    assert_eq!(p.sim.read_mem(0, p.a + 4096, 64), data(64, 11));
    assert!(
        p.sim.dev(1).dereg_mr(kw.handle).is_err(),
        "a window is bound to it"
    );
    // SEND_WITH_INV of the type 2 window, then the window no longer grants anything.
    p.recv(10, 0, 64);
    p.send(3, SendOp::SendWithInv(mw2), 0, 8);
    p.sim.run(MS);
    p.send(
        4,
        SendOp::Write(RemoteAddr {
            va: w + 1024,
            rkey: mw2,
        }),
        0,
        8,
    );
    p.sim.run(MS);
    assert_eq!(
        &p.statuses_a()[2..],
        &[(3, WcStatus::Success), (4, WcStatus::RemAccessErr)]
    );

    // Outside the window (but inside the MR) is an access error, and so is the old key.
    let mut p = setup(QpOptions::default());
    let (w, kw) = p.sim.alloc_mr(1, 8192, acc);
    let pd = p.sim.nodes[1].pd;
    let (_, mw) = p.sim.dev(1).alloc_mw(pd, MwType::Type2).unwrap();
    let op = SendOp::BindMw {
        mw_rkey: mw,
        mr_lkey: kw.lkey,
        addr: w,
        length: 1024,
        access: rw,
        key: 7,
    };
    p.sim.post_send(1, p.qb, SendWr::new(20, op, None)).unwrap();
    p.sim.run(MS);
    let new = Rkey((mw.0 & !0xff) | 7);
    p.send(
        1,
        SendOp::Write(RemoteAddr {
            va: w + 1000,
            rkey: new,
        }),
        0,
        64,
    );
    p.sim.run(MS);
    assert_eq!(p.statuses_a(), vec![(1, WcStatus::RemAccessErr)]);
}

#[test]
fn binding_a_window_needs_mw_bind_access_on_the_mr() {
    let mut p = setup(QpOptions::default());
    let pd = p.sim.nodes[1].pd;
    let (_, mw) = p.sim.dev(1).alloc_mw(pd, MwType::Type2).unwrap();
    // kb has no MW_BIND.
    let op = SendOp::BindMw {
        mw_rkey: mw,
        mr_lkey: p.kb.lkey,
        addr: p.b,
        length: 64,
        access: Access::REMOTE_READ,
        key: 1,
    };
    p.sim.post_send(1, p.qb, SendWr::new(20, op, None)).unwrap();
    p.sim.run(MS);
    assert_eq!(p.statuses_b(), vec![(20, WcStatus::MwBindErr)]);
}

#[test]
fn fence_holds_a_request_until_earlier_reads_complete() {
    let mut p = setup(QpOptions::default());
    p.recv(10, 0, 64);
    p.send(1, SendOp::Read(p.remote_b(0)), 0, 64);
    let mut wr = SendWr::new(2, SendOp::Send, p.sge_a(0, 8));
    wr.flags = SendFlags::SIGNALED.union(SendFlags::FENCE);
    p.sim.post_send(0, p.qa, wr).unwrap();
    p.send(3, SendOp::Read(p.remote_b(64)), 64, 8);
    p.sim.run(MS);
    assert_eq!(p.statuses_a().len(), 3);
    let resp = p.sent(Opcode::RC_RDMA_READ_RESPONSE_ONLY)[0];
    let send = p.sent(Opcode::RC_SEND_ONLY)[0];
    assert!(
        send.time > resp.time,
        "the fenced SEND waited for the READ response"
    );
    // Without a fence the SEND goes straight behind the READ request.
    let mut p = setup(QpOptions::default());
    p.recv(10, 0, 64);
    p.send(1, SendOp::Read(p.remote_b(0)), 0, 64);
    p.send(2, SendOp::Send, 0, 8);
    p.sim.run(MS);
    let resp = p.sent(Opcode::RC_RDMA_READ_RESPONSE_ONLY)[0];
    let send = p.sent(Opcode::RC_SEND_ONLY)[0];
    assert!(send.time < resp.time);
}

#[test]
fn inline_data_and_scatter_gather_lists() {
    let mut p = setup(QpOptions {
        mtu: Mtu::Mtu256,
        ..Default::default()
    });
    // Receive into three SGEs; send from two SGEs plus an inline message.
    let sg = vec![p.sge_b(0, 100), p.sge_b(1000, 200), p.sge_b(2000, 300)];
    p.sim
        .post_recv(
            1,
            p.qb,
            RecvWr {
                wr_id: 10,
                sg_list: sg,
            },
        )
        .unwrap();
    p.recv(11, 4000, 64);
    let d = data(550, 12);
    p.fill_a(0, &d[..300]);
    p.fill_a(5000, &d[300..]);
    let wr = SendWr {
        sg_list: vec![
            Sge {
                addr: p.a,
                length: 300,
                lkey: p.ka.lkey,
            },
            Sge {
                addr: p.a + 5000,
                length: 250,
                lkey: p.ka.lkey,
            },
        ],
        ..SendWr::new(1, SendOp::Send, None)
    };
    p.sim.post_send(0, p.qa, wr).unwrap();
    let inline = SendWr {
        inline_data: b"inline bytes".to_vec(),
        flags: SendFlags::SIGNALED.union(SendFlags::INLINE),
        ..SendWr::new(2, SendOp::Send, None)
    };
    p.sim.post_send(0, p.qa, inline).unwrap();
    p.sim.run(MS);
    assert_eq!(
        p.statuses_a(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    let got = [
        p.sim.read_mem(1, p.b, 100),
        p.sim.read_mem(1, p.b + 1000, 200),
        p.sim.read_mem(1, p.b + 2000, 250),
    ]
    .concat();
    assert_eq!(got, d);
    assert_eq!(p.sim.read_mem(1, p.b + 4000, 12), b"inline bytes");
    let b = p.sim.completions_of(1, p.qb);
    assert_eq!((b[0].byte_len, b[1].byte_len), (550, 12));
}

#[test]
fn gsi_qp_is_qp1_and_uses_the_well_known_qkey() {
    let mut sim = Sim::pair(4, LinkModel::default());
    let o = QpOptions {
        qp_type: QpType::Gsi,
        ..Default::default()
    };
    let g0 = sim.create_qp(0, &o);
    let g1 = sim.create_qp(1, &o);
    assert_eq!((g0, g1), (Qpn::GSI, Qpn::GSI));
    let init = QpAttr {
        qp_state: QpState::Init,
        ..Default::default()
    };
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ..Default::default()
    };
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..Default::default()
    };
    for n in 0..2 {
        let d = sim.dev(n);
        d.modify_qp(
            Qpn::GSI,
            &init,
            AttrMask::STATE
                .union(AttrMask::PKEY_INDEX)
                .union(AttrMask::QKEY),
        )
        .unwrap();
        d.modify_qp(Qpn::GSI, &rtr, AttrMask::STATE).unwrap();
        d.modify_qp(Qpn::GSI, &rts, AttrMask::STATE.union(AttrMask::SQ_PSN))
            .unwrap();
    }
    let (a, ka) = sim.alloc_mr(0, 4096, Access::LOCAL_WRITE);
    let (b, kb) = sim.alloc_mr(1, 4096, Access::LOCAL_WRITE);
    sim.post_recv(
        1,
        Qpn::GSI,
        RecvWr {
            wr_id: 5,
            sg_list: vec![Sge {
                addr: b,
                length: 4096,
                lkey: kb.lkey,
            }],
        },
    )
    .unwrap();
    let pd = sim.nodes[0].pd;
    let ah = sim
        .dev(0)
        .create_ah(pd, AddressVector::new("10.0.0.2".parse().unwrap()))
        .unwrap();
    let wr = SendWr {
        // The WR's Q_Key is ignored: QP1 always sends 0x80010000.
        ud: Some(UdDest {
            ah,
            remote_qpn: Qpn::GSI,
            remote_qkey: Qkey(7),
        }),
        ..SendWr::new(
            1,
            SendOp::Send,
            Some(Sge {
                addr: a,
                length: 256,
                lkey: ka.lkey,
            }),
        )
    };
    sim.post_send(0, Qpn::GSI, wr).unwrap();
    sim.run(MS);
    let got = sim.completions_of(1, Qpn::GSI);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].byte_len, got[0].src_qp), (296, Qpn::GSI));
}

#[test]
fn packets_from_outside_the_qp_path_or_with_a_foreign_pkey_are_dropped() {
    let mut p = setup(QpOptions::default());
    p.recv(10, 0, 64);
    // Right QP and PSN, wrong source address (rxe checks the AV) or wrong P_Key.
    p.sim.inject(
        1,
        100,
        craft_from(
            "10.0.0.9",
            0xffff,
            Opcode::RC_SEND_ONLY,
            p.qb,
            Psn::new(0),
            b"evil",
        ),
    );
    p.sim.inject(
        1,
        100,
        craft_from(
            "10.0.0.1",
            0x1234,
            Opcode::RC_SEND_ONLY,
            p.qb,
            Psn::new(0),
            b"evil",
        ),
    );
    // No such QP.
    p.sim.inject(
        1,
        100,
        craft(Opcode::RC_SEND_ONLY, Qpn::new(0x999), Psn::new(0), b"evil"),
    );
    p.sim.run(MS);
    assert!(p.statuses_b().is_empty());
    let c = p.counters(1);
    assert_eq!(c.dropped_pkts, 2);
    assert_eq!(c.bad_pkey_cntr, 1);
    assert_eq!(c.rcvd_pkts, 0);
    assert!(p.sim.trace.is_empty(), "nothing answered");
    // A good copy is then accepted at the same PSN.
    p.sim.inject(
        1,
        100,
        craft(Opcode::RC_SEND_ONLY, p.qb, Psn::new(0), b"good"),
    );
    p.sim.run(MS);
    assert_eq!(p.statuses_b(), vec![(10, WcStatus::Success)]);
    assert_eq!(p.sim.read_mem(1, p.b, 4), b"good");
}

#[test]
fn reordered_packets_cause_one_sequence_nak_and_a_go_back_n() {
    let mut p = setup(QpOptions {
        mtu: Mtu::Mtu256,
        timeout: 20,
        ..Default::default()
    });
    let d = data(1024, 13);
    p.fill_a(0, &d);
    p.send(1, SendOp::Write(p.remote_b(0)), 0, 1024);
    // The FIRST packet is overtaken by the three after it.
    p.sim.on_packet(1, Action::Delay(50_000), |i| {
        i.opcode == Opcode::RC_RDMA_WRITE_FIRST
    });
    p.sim.run(100 * MS);
    assert_eq!(p.statuses_a(), vec![(1, WcStatus::Success)]);
    assert_eq!(p.sim.read_mem(1, p.b, 1024), d);
    assert_eq!(p.counters(1).out_of_seq_request, 1, "one NAK per gap");
    let naks = p
        .sim
        .trace
        .iter()
        .filter(|i| i.syndrome == Some(0x60))
        .count();
    assert_eq!(naks, 1);
    assert!(
        p.counters(1).duplicate_request >= 1,
        "the late FIRST is a duplicate"
    );
}

#[test]
fn the_requester_stops_128_psns_ahead_of_the_oldest_unacknowledged() {
    let mut p = setup(QpOptions {
        mtu: Mtu::Mtu256,
        timeout: 14,
        ..Default::default()
    });
    p.send(1, SendOp::Write(p.remote_b(0)), 0, 256 * 200);
    // Lose every ACK for a while: only the window's worth of packets goes out.
    p.sim.on_packet(usize::MAX, Action::Drop, |i| {
        i.opcode == Opcode::RC_ACKNOWLEDGE
    });
    p.sim.run(MS);
    let sent =
        p.sent(Opcode::RC_RDMA_WRITE_FIRST).len() + p.sent(Opcode::RC_RDMA_WRITE_MIDDLE).len();
    assert_eq!(sent, 128);
}

#[test]
fn three_nodes_one_requester_two_responders() {
    let mut sim = Sim::new(21);
    for ip in ["10.0.0.1", "10.0.0.2", "10.0.0.3"] {
        sim.add_node(
            ip.parse().unwrap(),
            LinkModel {
                loss: 0.05,
                jitter: 3_000,
                ..Default::default()
            },
        );
    }
    let o = QpOptions {
        timeout: 8,
        ..Default::default()
    };
    let (q1, _) = sim.connect(0, 1, &o);
    let (q2, _) = sim.connect(0, 2, &o);
    let acc = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
    let (a, ka) = sim.alloc_mr(0, 8192, acc);
    let (b1, k1) = sim.alloc_mr(1, 8192, acc);
    let (b2, k2) = sim.alloc_mr(2, 8192, acc);
    sim.write_mem(0, a, &data(8192, 14));
    for i in 0..8u64 {
        let sge = Some(Sge {
            addr: a + i * 1024,
            length: 1024,
            lkey: ka.lkey,
        });
        let w1 = SendOp::Write(RemoteAddr {
            va: b1 + i * 1024,
            rkey: k1.rkey,
        });
        let w2 = SendOp::Write(RemoteAddr {
            va: b2 + (7 - i) * 1024,
            rkey: k2.rkey,
        });
        sim.post_send(0, q1, SendWr::new(i, w1, sge)).unwrap();
        sim.post_send(0, q2, SendWr::new(100 + i, w2, sge)).unwrap();
    }
    sim.run(1_000 * MS);
    sim.check_all_sends_completed();
    assert_eq!(sim.read_mem(1, b1, 8192), data(8192, 14));
    let mut mirrored = Vec::new();
    for i in (0..8).rev() {
        mirrored.extend_from_slice(&data(8192, 14)[i * 1024..(i + 1) * 1024]);
    }
    assert_eq!(sim.read_mem(2, b2, 8192), mirrored);
    assert!(sim
        .completions
        .iter()
        .all(|(_, w)| w.status == WcStatus::Success));
}

#[test]
fn read_without_responder_resources_is_an_invalid_request() {
    let mut p = setup(QpOptions {
        max_rd_atomic: 0,
        ..Default::default()
    });
    p.send(1, SendOp::Read(p.remote_b(0)), 0, 8);
    p.sim.run(MS);
    assert_eq!(p.statuses_a(), vec![(1, WcStatus::RemInvReqErr)]);
}

#[test]
fn cq_overflow_raises_cq_error_and_moves_the_qp_to_err() {
    let mut sim = Sim::pair(2, LinkModel::default());
    let o = QpOptions::default();
    let (qa, qb) = sim.connect(0, 1, &o);
    // A tiny receive CQ on node 1 for a second QP pair.
    let small = sim.dev(1).create_cq(2).unwrap();
    let pd1 = sim.nodes[1].pd;
    let init = QpInit {
        pd: pd1,
        qp_type: QpType::Rc,
        send_cq: small,
        recv_cq: small,
        srq: None,
        cap: QpCap::default(),
        sq_sig_all: false,
    };
    let qc = sim.dev(1).create_qp(init).unwrap();
    let qd = sim.create_qp(0, &o);
    sim.bring_up(1, qc, 0, qd, &o);
    sim.bring_up(0, qd, 1, qc, &o);
    let (b, kb) = sim.alloc_mr(1, 4096, Access::LOCAL_WRITE);
    let (a, ka) = sim.alloc_mr(0, 4096, Access::LOCAL_WRITE);
    for i in 0..4u64 {
        let sg = Sge {
            addr: b + i * 64,
            length: 64,
            lkey: kb.lkey,
        };
        sim.dev(1)
            .post_recv(
                qc,
                RecvWr {
                    wr_id: i,
                    sg_list: vec![sg],
                },
            )
            .unwrap();
    }
    for i in 0..3u64 {
        let sge = Some(Sge {
            addr: a,
            length: 8,
            lkey: ka.lkey,
        });
        sim.post_send(0, qd, SendWr::new(i, SendOp::Send, sge))
            .unwrap();
    }
    sim.run(100 * MS);
    assert!(events(&mut sim, 1).contains(&AsyncEvent::CqError { cq: small }));
    assert_eq!(sim.dev(1).query_qp(qc).unwrap().0, QpState::Err);
    let _ = (qa, qb);
}

#[test]
fn sim_psn_invariant_flags_a_psn_that_moves_back_without_a_retry() {
    let mut p = setup(QpOptions::default());
    p.send(1, SendOp::Write(p.remote_b(0)), 0, 8);
    p.send(2, SendOp::Write(p.remote_b(0)), 0, 8);
    p.sim.run(MS);
    assert!(p.sim.violations.is_empty());
    // Reconnect both QPs from PSN 0: the requester's PSN goes back with no NAK or timeout
    // behind it, which the simulator must notice.
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..Default::default()
    };
    p.sim
        .dev(0)
        .modify_qp(p.qa, &reset, AttrMask::STATE)
        .unwrap();
    p.sim
        .dev(1)
        .modify_qp(p.qb, &reset, AttrMask::STATE)
        .unwrap();
    let o = QpOptions::default();
    let (qa, qb) = (p.qa, p.qb);
    p.sim.bring_up(0, qa, 1, qb, &o);
    p.sim.bring_up(1, qb, 0, qa, &o);
    p.send(3, SendOp::Write(p.remote_b(0)), 0, 8);
    p.sim.run(MS);
    assert_eq!(p.statuses_a().last(), Some(&(3, WcStatus::Success)));
    assert_eq!(p.sim.violations.len(), 1, "{:?}", p.sim.violations);
    assert!(p.sim.violations[0].contains("PSN moved back"));
}

#[test]
fn a_link_mtu_below_the_path_mtu_drops_full_packets_until_retries_run_out() {
    let mut p = setup(QpOptions {
        mtu: Mtu::Mtu1024,
        retry_cnt: 1,
        timeout: 6,
        ..Default::default()
    });
    p.sim.set_link(
        0,
        1,
        LinkModel {
            mtu: 600,
            ..Default::default()
        },
    );
    // Small messages pass, a full 1024-byte packet never does (rxe checks path_mtu only
    // against 4096, facts §10.1.6).
    p.send(1, SendOp::Write(p.remote_b(0)), 0, 500);
    p.send(2, SendOp::Write(p.remote_b(0)), 0, 1024);
    p.sim.run(100 * MS);
    assert_eq!(
        p.statuses_a(),
        vec![(1, WcStatus::Success), (2, WcStatus::RetryExcErr)]
    );
}
