//! `Device::handle_verified_packet`: a packet whose ICRC the caller already checked is taken
//! without computing the ICRC again (so even a wrong ICRC passes), while its headers are
//! still checked; `handle_packet` keeps refusing the same bytes.

use proto::sim::{LinkModel, QpOptions, Sim};
use proto::transport::*;
use proto::types::Qpn;

/// Node 0 sends `data` on an RC QP; returns node 1's QP and the frames node 0 emitted.
fn setup(data: &[u8]) -> (Sim, Qpn, u64, Vec<Vec<u8>>) {
    let mut sim = Sim::pair(7, LinkModel::default());
    let o = QpOptions {
        mtu: Mtu::Mtu1024,
        ..Default::default()
    };
    let (qa, qb) = sim.connect(0, 1, &o);
    let acc = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
    let (a, ka) = sim.alloc_mr(0, 8192, acc);
    let (b, kb) = sim.alloc_mr(1, 8192, acc);
    sim.write_mem(0, a, data);
    let sg = Sge {
        addr: b,
        length: 8192,
        lkey: kb.lkey,
    };
    sim.dev(1)
        .post_recv(
            qb,
            RecvWr {
                wr_id: 9,
                sg_list: vec![sg],
            },
        )
        .unwrap();
    let sg = Some(Sge {
        addr: a,
        length: data.len() as u32,
        lkey: ka.lkey,
    });
    sim.dev(0)
        .post_send(qa, SendWr::new(1, SendOp::Send, sg))
        .unwrap();
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    let mut frames = Vec::new();
    while let Some(t) = sim.dev(0).poll_transmit(0, &mut buf) {
        frames.push(buf[..t.len].to_vec());
    }
    (sim, qb, b, frames)
}

#[test]
fn a_verified_packet_skips_the_icrc_but_not_the_headers() {
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 13) as u8).collect();
    let (mut sim, _qb, b, frames) = setup(&data);
    assert_eq!(frames.len(), 3, "3000 bytes at MTU 1024");
    let cq = sim.nodes[1].cq;
    let mut spoiled: Vec<Vec<u8>> = frames.clone();
    for f in &mut spoiled {
        let n = f.len();
        f[n - 1] ^= 0xff; // a wrong ICRC
    }
    // The full check refuses every one of them.
    for f in &spoiled {
        sim.dev(1).handle_packet(10, f);
    }
    assert_eq!(sim.dev(1).counters().icrc_errors, 3);
    assert!(sim.dev(1).poll_cq(cq).is_none());
    // Broken headers are still refused by the verified path, without a panic.
    let mut bad_len = spoiled[0].clone();
    bad_len[3] ^= 0x40; // IPv4 total length
    for junk in [&bad_len[..], &spoiled[0][..3], &[][..]] {
        sim.dev(1).handle_verified_packet(10, junk);
    }
    assert_eq!(sim.dev(1).counters().dropped_pkts, 3);
    assert!(sim.dev(1).poll_cq(cq).is_none());
    // The caller vouches for the ICRC: the message is received, byte for byte.
    for f in &spoiled {
        sim.dev(1).handle_verified_packet(10, f);
    }
    let wc = sim.dev(1).poll_cq(cq).expect("receive completion");
    assert_eq!(wc.wr_id, 9);
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(wc.byte_len, 3000);
    assert_eq!(sim.read_mem(1, b, 3000), data);
    assert_eq!(sim.dev(1).counters().icrc_errors, 3);
}
