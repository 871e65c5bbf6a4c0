//! Basic RC operations between two simulated devices over a perfect link.

use proto::sim::{LinkModel, QpOptions, Sim};
use proto::transport::*;

fn sge(addr: u64, len: u32, keys: MrKeys) -> Sge {
    Sge {
        addr,
        length: len,
        lkey: keys.lkey,
    }
}

#[test]
fn rc_send_write_read_atomics_complete_with_data() {
    let mut sim = Sim::pair(1, LinkModel::default());
    let o = QpOptions::default();
    let (qa, qb) = sim.connect(0, 1, &o);
    let acc = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
    let (src, ks) = sim.alloc_mr(0, 8192, acc);
    let (dst, kd) = sim.alloc_mr(1, 8192, acc);
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
    sim.write_mem(0, src, &data);
    // SEND of 3000 bytes into a posted receive.
    sim.post_recv(
        1,
        qb,
        RecvWr {
            wr_id: 100,
            sg_list: vec![sge(dst, 4096, kd)],
        },
    )
    .unwrap();
    sim.post_send(
        0,
        qa,
        SendWr::new(1, SendOp::SendWithImm(0xdead), Some(sge(src, 3000, ks))),
    )
    .unwrap();
    // WRITE of 3000 bytes at dst+4096.
    let remote = RemoteAddr {
        va: dst + 4096,
        rkey: kd.rkey,
    };
    sim.post_send(
        0,
        qa,
        SendWr::new(2, SendOp::Write(remote), Some(sge(src, 3000, ks))),
    )
    .unwrap();
    // READ them back into src+4096.
    sim.post_send(
        0,
        qa,
        SendWr::new(3, SendOp::Read(remote), Some(sge(src + 4096, 3000, ks))),
    )
    .unwrap();
    // Atomics on dst+8000.
    let ar = RemoteAddr {
        va: dst + 8000,
        rkey: kd.rkey,
    };
    sim.post_send(
        0,
        qa,
        SendWr::new(
            4,
            SendOp::FetchAdd { remote: ar, add: 5 },
            Some(sge(src + 8000, 8, ks)),
        ),
    )
    .unwrap();
    sim.post_send(
        0,
        qa,
        SendWr::new(
            5,
            SendOp::CompareSwap {
                remote: ar,
                compare: 5,
                swap: 99,
            },
            Some(sge(src + 8008, 8, ks)),
        ),
    )
    .unwrap();
    sim.run(1_000_000_000);
    sim.check_all_sends_completed();
    let a = sim.completions_of(0, qa);
    assert_eq!(
        a.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        (1..=5).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    let b = sim.completions_of(1, qb);
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].wr_id, 100);
    assert_eq!(b[0].byte_len, 3000);
    assert_eq!(b[0].imm_data, 0xdead);
    assert!(b[0].wc_flags.contains(WcFlags::WITH_IMM));
    // As rxe: every successful receive completion carries IBV_WC_GRH, RC included.
    assert!(b[0].wc_flags.contains(WcFlags::GRH));
    assert_eq!(sim.read_mem(1, dst, 3000), data);
    assert_eq!(sim.read_mem(1, dst + 4096, 3000), data);
    assert_eq!(sim.read_mem(0, src + 4096, 3000), data);
    assert_eq!(sim.read_mem(0, src + 8000, 8), 0u64.to_ne_bytes());
    assert_eq!(sim.read_mem(0, src + 8008, 8), 5u64.to_ne_bytes());
    assert_eq!(sim.read_mem(1, dst + 8000, 8), 99u64.to_ne_bytes());
    let c = *sim.dev(1).counters();
    assert_eq!(c.rdma_recvs, 1);
    assert_eq!(c.duplicate_request, 0);
    assert_eq!(sim.dev(0).counters().rdma_sends, 1);
    sim.check();
}

/// Two QPs that each send a long message take turns of [`TRANSMIT_QUANTUM`] bytes (16
/// packets of 4 KiB), not of one packet: each turn's payload is one stretch of the sender's
/// memory, which the daemon reads in one call (with turns of one packet, `ib_write_bw -q 2`
/// ran at a tenth of `-q 1`). Each QP's own packets stay in PSN order.
#[test]
fn qps_sending_side_by_side_take_turns_of_a_quantum() {
    let mut sim = Sim::pair(3, LinkModel::default());
    let o = QpOptions {
        mtu: Mtu::Mtu4096,
        ..Default::default()
    };
    let acc = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
    let len = 128 * 1024;
    let mut dests = Vec::new();
    for _ in 0..2 {
        let (qa, qb) = sim.connect(0, 1, &o);
        let (src, ks) = sim.alloc_mr(0, len, acc);
        let (dst, kd) = sim.alloc_mr(1, len, acc);
        let remote = RemoteAddr {
            va: dst,
            rkey: kd.rkey,
        };
        let sg = Some(sge(src, len as u32, ks));
        let wr = SendWr::new(1, SendOp::Write(remote), sg);
        sim.dev(0).post_send(qa, wr).unwrap();
        dests.push(qb.value());
    }
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    let mut order = Vec::new();
    while let Some(t) = sim.dev(0).poll_transmit(0, &mut buf) {
        // IPv4 (20 bytes) and UDP (8) before the BTH, whose bytes 5..8 are the destination QP.
        let bth = &buf[28..t.len];
        order.push(u32::from_be_bytes([0, bth[5], bth[6], bth[7]]));
    }
    // A packet of 4 KiB payload is 4,140 bytes (4,156 with the RETH): 15 of them stay
    // below the quantum, the 16th ends the turn.
    assert_eq!(TRANSMIT_QUANTUM, 64 * 1024);
    let per_turn = 16;
    let expected: Vec<u32> = [0, 1, 0, 1]
        .iter()
        .flat_map(|&q| std::iter::repeat_n(dests[q], per_turn))
        .collect();
    assert_eq!(order, expected);
}
