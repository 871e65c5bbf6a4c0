//! Fault injection in the responder (`Engine::handle_verified_packet_forcing`, what
//! `softroce fault rnr|access-error` uses): a forced RNR NAK is retried after the RNR timer
//! and the message then completes, with the RNR counters up on both sides; a forced remote
//! access error completes the RDMA WRITE with REM_ACCESS_ERR, as an R_Key violation does;
//! requests that could not meet the condition are not touched.

use proto::sim::{LinkModel, QpOptions, Sim};
use proto::transport::*;
use proto::types::Qpn;

const NODE_A: usize = 0;
const NODE_B: usize = 1;

struct Pair {
    sim: Sim,
    qa: Qpn,
    qb: Qpn,
    a: (u64, MrKeys),
    b: (u64, MrKeys),
}

fn pair() -> Pair {
    let mut sim = Sim::pair(3, LinkModel::default());
    let o = QpOptions {
        rnr_retry: 7,
        min_rnr_timer: 1,
        ..QpOptions::default()
    };
    let (qa, qb) = sim.connect(NODE_A, NODE_B, &o);
    let acc = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
    let a = sim.alloc_mr(NODE_A, 4096, acc);
    let b = sim.alloc_mr(NODE_B, 4096, acc);
    Pair { sim, qa, qb, a, b }
}

/// Moves packets both ways by hand until nothing is left (timers run at `now`); the first
/// `force` requests that reach B are answered with `nak`. Returns how many were.
fn exchange(p: &mut Pair, mut now: u64, nak: ForcedNak, mut force: usize) -> usize {
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    let mut forced = 0;
    for _ in 0..200 {
        let mut moved = false;
        while let Some(t) = p.sim.dev(NODE_A).poll_transmit(now, &mut buf) {
            moved = true;
            let frame = buf[..t.len].to_vec();
            if force > 0
                && p.sim
                    .dev(NODE_B)
                    .handle_verified_packet_forcing(now, &frame, nak)
            {
                force -= 1;
                forced += 1;
            } else if force == 0 {
                p.sim.dev(NODE_B).handle_verified_packet(now, &frame);
            }
        }
        while let Some(t) = p.sim.dev(NODE_B).poll_transmit(now, &mut buf) {
            moved = true;
            let frame = buf[..t.len].to_vec();
            p.sim.dev(NODE_A).handle_verified_packet(now, &frame);
        }
        if !moved {
            let due = [NODE_A, NODE_B]
                .iter()
                .filter_map(|&n| p.sim.dev(n).poll_timeout())
                .min();
            let Some(t) = due else { break };
            now = now.max(t);
            for n in [NODE_A, NODE_B] {
                p.sim.dev(n).handle_timeout(now);
            }
        }
    }
    forced
}

#[test]
fn a_forced_rnr_nak_is_retried_and_the_send_completes() {
    let mut p = pair();
    let (b, kb) = p.b;
    let (a, ka) = p.a;
    let recv = RecvWr {
        wr_id: 7,
        sg_list: vec![Sge {
            addr: b,
            length: 64,
            lkey: kb.lkey,
        }],
    };
    p.sim.dev(NODE_B).post_recv(p.qb, recv).unwrap();
    p.sim.write_mem(NODE_A, a, b"hello");
    let sg = Some(Sge {
        addr: a,
        length: 5,
        lkey: ka.lkey,
    });
    let mut wr = SendWr::new(1, SendOp::Send, sg);
    wr.flags = SendFlags::SIGNALED;
    p.sim.dev(NODE_A).post_send(p.qa, wr).unwrap();
    assert_eq!(exchange(&mut p, 10, ForcedNak::Rnr, 2), 2);
    let cq_a = p.sim.nodes[NODE_A].cq;
    let cq_b = p.sim.nodes[NODE_B].cq;
    let wc = p.sim.dev(NODE_A).poll_cq(cq_a).expect("send completion");
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
    let wc = p.sim.dev(NODE_B).poll_cq(cq_b).expect("receive completion");
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (7, WcStatus::Success, 5)
    );
    assert_eq!(p.sim.read_mem(NODE_B, b, 5), b"hello");
    assert_eq!(p.sim.dev(NODE_A).counters().rcvd_rnr_err, 2);
    assert_eq!(p.sim.dev(NODE_B).counters().send_rnr_err, 2);
    let per_qp = *p.sim.dev(NODE_B).qp_counters(p.qb).unwrap();
    assert_eq!((per_qp.send_rnr_err, per_qp.rdma_recvs), (2, 1));
}

#[test]
fn a_forced_access_error_fails_the_write_as_a_bad_rkey_does() {
    let mut p = pair();
    let (b, kb) = p.b;
    let (a, ka) = p.a;
    let sg = Some(Sge {
        addr: a,
        length: 64,
        lkey: ka.lkey,
    });
    let remote = RemoteAddr {
        va: b,
        rkey: kb.rkey,
    };
    let mut wr = SendWr::new(2, SendOp::Write(remote), sg);
    wr.flags = SendFlags::SIGNALED;
    p.sim.dev(NODE_A).post_send(p.qa, wr).unwrap();
    assert_eq!(exchange(&mut p, 10, ForcedNak::AccessError, 1), 1);
    let cq_a = p.sim.nodes[NODE_A].cq;
    let wc = p.sim.dev(NODE_A).poll_cq(cq_a).expect("write completion");
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::RemAccessErr));
    assert_eq!(p.sim.dev(NODE_B).counters().rdma_recvs, 0);
    assert_eq!(p.sim.dev(NODE_A).counters().req_remote_access_errors, 1);
    assert_eq!(p.sim.dev(NODE_B).counters().resp_remote_access_errors, 1);
}

#[test]
fn requests_that_cannot_meet_the_condition_are_left_alone() {
    let mut p = pair();
    let (b, kb) = p.b;
    let (a, ka) = p.a;
    // An RDMA WRITE consumes no receive WQE: it is never RNR NAKed.
    let sg = Some(Sge {
        addr: a,
        length: 64,
        lkey: ka.lkey,
    });
    let remote = RemoteAddr {
        va: b,
        rkey: kb.rkey,
    };
    let mut wr = SendWr::new(3, SendOp::Write(remote), sg);
    wr.flags = SendFlags::SIGNALED;
    p.sim.dev(NODE_A).post_send(p.qa, wr).unwrap();
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    let t = p.sim.dev(NODE_A).poll_transmit(10, &mut buf).unwrap();
    let frame = buf[..t.len].to_vec();
    assert!(!p
        .sim
        .dev(NODE_B)
        .handle_verified_packet_forcing(10, &frame, ForcedNak::Rnr));
    assert_eq!(p.sim.dev(NODE_B).counters().send_rnr_err, 0);
    assert_eq!(exchange(&mut p, 10, ForcedNak::Rnr, 0), 0);
    let cq_a = p.sim.nodes[NODE_A].cq;
    let wc = p.sim.dev(NODE_A).poll_cq(cq_a).expect("write completion");
    assert_eq!((wc.wr_id, wc.status), (3, WcStatus::Success));
}
