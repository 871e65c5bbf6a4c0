//! RoCE v1 in the engine: every transport over GRH framing between two simulated devices,
//! a device whose GID table lists an address once per type (`--roce both`) framing each QP's
//! packets by its SGID's type, and a mismatch (one side on a v1 GID, the other on v2) that
//! ends in RETRY_EXC_ERR, as between a dual-mode NIC and rxe (roce-rxe-facts.md §7.2).

use proto::sim::{LinkModel, QpOptions, Sim};
use proto::transport::*;
use proto::types::Qkey;
use proto::wire::{EtherType, FrameRepr};

fn sge(addr: u64, len: u32, keys: MrKeys) -> Sge {
    Sge {
        addr,
        length: len,
        lkey: keys.lkey,
    }
}

fn recv(sim: &mut Sim, node: usize, qpn: proto::Qpn, wr_id: u64, s: Sge) {
    sim.post_recv(
        node,
        qpn,
        RecvWr {
            wr_id,
            sg_list: vec![s],
        },
    )
    .unwrap();
}

/// Every frame of the simulator's capture is RoCE v1 (Ethertype 0x8915, a GRH with next
/// header 0x1b), parses and carries a right ICRC; returns how many there were.
fn check_capture_is_v1(sim: &Sim) -> usize {
    let pcap = sim.pcap_bytes().expect("capturing");
    let mut at = 24;
    let mut frames = 0;
    while at + 16 <= pcap.len() {
        let len = u32::from_le_bytes(pcap[at + 8..at + 12].try_into().unwrap()) as usize;
        let frame = &pcap[at + 16..at + 16 + len];
        assert_eq!(
            u16::from_be_bytes([frame[12], frame[13]]),
            EtherType::ROCE_V1
        );
        let parsed = FrameRepr::parse_ethernet(frame, len).unwrap();
        assert!(parsed.repr.net.is_v1() && parsed.repr.udp.is_none());
        parsed.verified().unwrap();
        frames += 1;
        at += 16 + len;
    }
    frames
}

#[test]
fn every_transport_runs_over_roce_v1() {
    let mut sim = Sim::pair_v1(7, LinkModel::default());
    sim.capture();
    let acc = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
    let (src, ks) = sim.alloc_mr(0, 16384, acc);
    let (dst, kd) = sim.alloc_mr(1, 16384, acc);
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 13 + 1) as u8).collect();
    sim.write_mem(0, src, &data);

    // RC: SEND with immediate, WRITE, READ, both atomics.
    let (qa, qb) = sim.connect(0, 1, &QpOptions::default());
    recv(&mut sim, 1, qb, 10, sge(dst, 8192, kd));
    let op = SendOp::SendWithImm(0xfeed);
    sim.post_send(0, qa, SendWr::new(1, op, Some(sge(src, 5000, ks))))
        .unwrap();
    let remote = RemoteAddr {
        va: dst + 8192,
        rkey: kd.rkey,
    };
    let write = SendOp::Write(remote);
    sim.post_send(0, qa, SendWr::new(2, write, Some(sge(src, 3000, ks))))
        .unwrap();
    let read = SendOp::Read(remote);
    sim.post_send(0, qa, SendWr::new(3, read, Some(sge(src + 8192, 3000, ks))))
        .unwrap();
    let ar = RemoteAddr {
        va: dst + 16000,
        rkey: kd.rkey,
    };
    let fadd = SendOp::FetchAdd { remote: ar, add: 9 };
    sim.post_send(0, qa, SendWr::new(4, fadd, Some(sge(src + 12000, 8, ks))))
        .unwrap();
    let cas = SendOp::CompareSwap {
        remote: ar,
        compare: 9,
        swap: 77,
    };
    sim.post_send(0, qa, SendWr::new(5, cas, Some(sge(src + 12008, 8, ks))))
        .unwrap();

    // UC: one SEND.
    let uc = QpOptions {
        qp_type: QpType::Uc,
        ..Default::default()
    };
    let (ua, ub) = sim.connect(0, 1, &uc);
    recv(&mut sim, 1, ub, 20, sge(dst + 12000, 2000, kd));
    let op = SendOp::Send;
    sim.post_send(0, ua, SendWr::new(6, op, Some(sge(src, 1500, ks))))
        .unwrap();

    // UD: one datagram through an AH on the v1 GID.
    let ud = QpOptions {
        qp_type: QpType::Ud,
        ..Default::default()
    };
    let da = sim.create_qp(0, &ud);
    let db = sim.create_qp(1, &ud);
    sim.bring_up(0, da, 1, db, &ud);
    sim.bring_up(1, db, 0, da, &ud);
    let pd = sim.nodes[0].pd;
    let peer = sim.nodes[1].ip;
    let ah = sim.dev(0).create_ah(pd, AddressVector::new(peer)).unwrap();
    recv(&mut sim, 1, db, 30, sge(dst + 14100, 40 + 512, kd));
    let mut wr = SendWr::new(7, SendOp::Send, Some(sge(src, 512, ks)));
    wr.ud = Some(UdDest {
        ah,
        remote_qpn: db,
        remote_qkey: Qkey(0x1111_1111),
    });
    sim.post_send(0, da, wr).unwrap();

    sim.run(1_000_000_000);
    sim.check_all_sends_completed();
    for (node, wc) in &sim.completions {
        assert_eq!(wc.status, WcStatus::Success, "node {node}: {wc:?}");
    }
    assert_eq!(sim.completions_of(0, qa).len(), 5);
    assert_eq!(sim.read_mem(1, dst, 5000), data);
    assert_eq!(sim.read_mem(1, dst + 8192, 3000), data[..3000]);
    assert_eq!(sim.read_mem(0, src + 8192, 3000), data[..3000]);
    assert_eq!(sim.read_mem(0, src + 12000, 8), 0u64.to_ne_bytes());
    assert_eq!(sim.read_mem(0, src + 12008, 8), 9u64.to_ne_bytes());
    assert_eq!(sim.read_mem(1, dst + 16000, 8), 77u64.to_ne_bytes());
    assert_eq!(sim.read_mem(1, dst + 12000, 1500), data[..1500]);
    // The UD receive buffer starts with the GRH as received: version 6, next header 0x1b,
    // the sender's v4-mapped GID.
    let grh = sim.read_mem(1, dst + 14100, 40);
    assert_eq!((grh[0] >> 4, grh[6]), (6, 0x1b));
    assert_eq!(
        grh[8..24],
        "::ffff:10.0.0.1"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets()
    );
    assert_eq!(sim.read_mem(1, dst + 14140, 512), data[..512]);
    let ud_wc = sim.completions_of(1, db);
    assert_eq!(ud_wc[0].byte_len, 40 + 512);

    assert!(sim.trace.iter().all(|p| p.roce_v1));
    assert_eq!(check_capture_is_v1(&sim), sim.trace.len());
    // tests/data/sim-roce-v1.pcap is this capture: scripts/test runs `softroce pcap check`
    // and the independent oracle (../shared/tools/roce-pcap-check) on it.
    if let Some(path) = std::env::var_os("SOFTROCE_WRITE_V1_CAPTURE") {
        std::fs::write(path, sim.pcap_bytes().unwrap()).unwrap();
    }
    for n in 0..2 {
        let c = sim.dev(n).counters();
        assert_eq!((c.icrc_errors, c.dropped_pkts), (0, 0), "node {n}: {c:?}");
    }
}

#[test]
fn a_lossy_v1_link_recovers_like_v2() {
    let link = LinkModel {
        loss: 0.05,
        duplicate: 0.02,
        corrupt: 0.02,
        jitter: 10_000,
        ..Default::default()
    };
    let mut sim = Sim::pair_v1(11, link);
    let o = QpOptions {
        timeout: 8,
        ..Default::default()
    };
    let (qa, _) = sim.connect(0, 1, &o);
    let acc = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
    let len = 200_000;
    let (a, ka) = sim.alloc_mr(0, len, acc);
    let (b, kb) = sim.alloc_mr(1, len, acc);
    let data: Vec<u8> = (0..len).map(|i| (i * 31 + 7) as u8).collect();
    sim.write_mem(0, a, &data);
    let remote = RemoteAddr {
        va: b,
        rkey: kb.rkey,
    };
    let wr = SendWr::new(1, SendOp::Write(remote), Some(sge(a, len as u32, ka)));
    sim.post_send(0, qa, wr).unwrap();
    sim.run(30_000_000_000);
    sim.check_all_sends_completed();
    assert_eq!(sim.completions_of(0, qa)[0].status, WcStatus::Success);
    assert_eq!(sim.read_mem(1, b, len), data);
    // Corrupted frames were caught by the v1 ICRC.
    assert!(sim.dev(1).counters().icrc_errors + sim.dev(0).counters().icrc_errors > 0);
}

/// Two nodes whose GID 0 is RoCE v1 and GID 1 RoCE v2, the same address (`--roce both`).
fn both_pair() -> Sim {
    let mut sim = Sim::new(5);
    let types = [GidType::RoceV1, GidType::RoceV2];
    sim.add_node_with_gids("10.0.0.1".parse().unwrap(), &types, LinkModel::default());
    sim.add_node_with_gids("10.0.0.2".parse().unwrap(), &types, LinkModel::default());
    sim
}

#[test]
fn each_qp_is_framed_by_the_type_of_its_sgid() {
    let mut sim = both_pair();
    let acc = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
    let (src, ks) = sim.alloc_mr(0, 8192, acc);
    let (dst, kd) = sim.alloc_mr(1, 8192, acc);
    sim.write_mem(0, src, &[0x5a; 8192]);
    let on = |sgid_index| QpOptions {
        sgid_index,
        ..Default::default()
    };
    let (v1a, v1b) = sim.connect(0, 1, &on(0));
    let (v2a, v2b) = sim.connect(0, 1, &on(1));
    for (i, (qa, qb)) in [(v1a, v1b), (v2a, v2b)].into_iter().enumerate() {
        let off = i as u64 * 4096;
        recv(&mut sim, 1, qb, 100 + i as u64, sge(dst + off, 4096, kd));
        let wr = SendWr::new(i as u64, SendOp::Send, Some(sge(src, 3000, ks)));
        sim.post_send(0, qa, wr).unwrap();
    }
    sim.run(1_000_000_000);
    sim.check_all_sends_completed();
    assert_eq!(sim.completions.len(), 4);
    assert!(sim
        .completions
        .iter()
        .all(|(_, w)| w.status == WcStatus::Success));
    // Requests and ACKs alike follow the QP's path: v1 QPs only v1, v2 QPs only v2.
    let (mut v1, mut v2) = (0, 0);
    for p in &sim.trace {
        let to_v1_qp = [v1a, v1b].contains(&p.dest_qpn);
        assert_eq!(p.roce_v1, to_v1_qp, "{p:?}");
        if p.roce_v1 {
            v1 += 1;
        } else {
            v2 += 1;
        }
    }
    assert!(v1 >= 4 && v2 >= 4, "v1 {v1} v2 {v2}");
}

#[test]
fn a_v1_sender_to_a_v2_qp_is_dropped_and_the_sender_gets_retry_exceeded() {
    let mut sim = both_pair();
    let sender = QpOptions {
        sgid_index: 0, // RoCE v1
        timeout: 8,    // 1 ms
        retry_cnt: 2,
        ..Default::default()
    };
    let receiver = QpOptions {
        sgid_index: 1, // RoCE v2
        ..sender
    };
    let qa = sim.create_qp(0, &sender);
    let qb = sim.create_qp(1, &receiver);
    sim.bring_up(0, qa, 1, qb, &sender);
    sim.bring_up(1, qb, 0, qa, &receiver);
    let acc = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
    let (src, ks) = sim.alloc_mr(0, 4096, acc);
    let (dst, kd) = sim.alloc_mr(1, 4096, acc);
    recv(&mut sim, 1, qb, 1, sge(dst, 4096, kd));
    sim.post_send(0, qa, SendWr::new(9, SendOp::Send, Some(sge(src, 100, ks))))
        .unwrap();
    let start = sim.now;
    sim.run(10_000_000_000);
    let wc = sim.completions_of(0, qa);
    assert_eq!(wc.len(), 1);
    assert_eq!(wc[0].status, WcStatus::RetryExcErr);
    // The first send and retry_cnt retries, each after the 4.096 µs · 2^8 timeout.
    let sent = sim.trace.iter().filter(|p| p.from == 0).count();
    assert_eq!(sent, 3);
    let elapsed = sim.now - start;
    assert!((3_000_000..20_000_000).contains(&elapsed), "{elapsed} ns");
    assert_eq!(sim.dev(1).counters().dropped_pkts, 3);
    assert!(sim.completions_of(1, qb).is_empty());
}
