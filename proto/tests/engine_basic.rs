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
