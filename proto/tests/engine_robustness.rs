//! The engine never panics on what the network sends: random, well-framed (good ICRC)
//! packets of every opcode with random header fields and PSNs near the expected ones are fed
//! to devices with RC, UC and UD QPs in every state that receives, with receives posted;
//! RC QPs with either loss recovery (go-back-N, selective), SACKs well-formed or not.

use proptest::prelude::*;
use proto::sim::{LinkModel, QpOptions, Sim};
use proto::transport::*;
use proto::types::{Psn, Qkey, Qpn, Rkey};
use proto::wire::{self, HeaderSet, Opcode};

#[derive(Debug, Clone)]
struct RandomPacket {
    opcode: u8,
    dest: u8,
    psn_delta: i32,
    ack_req: bool,
    va: u64,
    rkey: u32,
    len: u32,
    syndrome: u8,
    payload_len: usize,
    ecn: bool,
}

fn packet() -> impl Strategy<Value = RandomPacket> {
    (
        prop::sample::select(Opcode::all().map(|o| o.0).collect::<Vec<_>>()),
        0u8..4,
        prop_oneof![-3i32..4, -3i32..40],
        any::<bool>(),
        prop_oneof![Just(0u64), any::<u64>(), 0x1000_0000u64..0x1001_0000],
        any::<u32>(),
        prop_oneof![Just(0u32), 0u32..5000, any::<u32>()],
        any::<u8>(),
        0usize..1100,
        any::<bool>(),
    )
        .prop_map(
            |(opcode, dest, psn_delta, ack_req, va, rkey, len, syndrome, payload_len, ecn)| {
                RandomPacket {
                    opcode,
                    dest,
                    psn_delta,
                    ack_req,
                    va,
                    rkey,
                    len,
                    syndrome,
                    payload_len,
                    ecn,
                }
            },
        )
}

fn build(p: &RandomPacket, dest: Qpn, psn: Psn, rkey: Rkey) -> Option<Vec<u8>> {
    let opcode = Opcode(p.opcode);
    let info = opcode.info()?;
    let h = info.headers;
    let mut t = wire::TransportRepr::new(wire::BthRepr {
        opcode,
        solicited: false,
        mig_req: false,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qpn: dest,
        ack_req: p.ack_req,
        psn: if p.psn_delta >= 0 {
            psn.add(p.psn_delta as u32)
        } else {
            psn.sub((-p.psn_delta) as u32)
        },
    });
    // Use the real R_Key half the time, so requests get past the key check.
    let key = if p.rkey & 1 == 0 { rkey } else { Rkey(p.rkey) };
    if h.contains(HeaderSet::RETH) {
        t.reth = Some(wire::RethRepr {
            va: p.va,
            rkey: key,
            len: p.len,
        });
    }
    if h.contains(HeaderSet::DETH) {
        t.deth = Some(wire::DethRepr {
            qkey: Qkey(0x1111_1111),
            src_qpn: Qpn::new(17),
        });
    }
    if h.contains(HeaderSet::FETH) {
        t.feth = Some(wire::FethRepr {
            selectivity: 0,
            placement: 1,
        });
    }
    if h.contains(HeaderSet::ATOMIC_ETH) {
        t.atomic_eth = Some(wire::AtomicEthRepr {
            va: p.va,
            rkey: key,
            swap_add: 1,
            compare: 0,
        });
    }
    if h.contains(HeaderSet::AETH) {
        t.aeth = Some(wire::AethRepr {
            syndrome: wire::AethSyndrome::from_byte(p.syndrome & 0x7f),
            msn: 0,
        });
    }
    if h.contains(HeaderSet::ATOMIC_ACK_ETH) {
        t.atomic_ack_eth = Some(wire::AtomicAckEthRepr { orig: p.va });
    }
    if h.contains(HeaderSet::IMM) {
        t.imm = Some(7);
    }
    if h.contains(HeaderSet::IETH) {
        t.ieth = Some(key);
    }
    t.payload_len = if info.has(wire::OpInfo::ATOMIC_WRITE) {
        8
    } else if info.has(wire::OpInfo::PAYLOAD) {
        p.payload_len
    } else {
        0
    };
    let mut f = wire::FrameRepr {
        link: wire::LinkRepr::None,
        net: wire::NetRepr::Ipv4(wire::Ipv4Repr {
            src: "10.0.0.1".parse().ok()?,
            dst: "10.0.0.2".parse().ok()?,
            tos: if p.ecn { 3 } else { 0 },
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
    let mut payload = vec![0xabu8; f.transport.payload_len];
    if opcode == Opcode::SOFTROCE_SACK && p.len & 1 == 0 {
        // A well-formed SACK bitmap half the time, with bits from the VA.
        let mut sack = wire::SackRepr::with_len((p.len as usize >> 1) % 2100);
        for k in 0..64 {
            if p.va >> k & 1 == 1 {
                sack.set(k * sack.len() / 64);
            }
        }
        payload = vec![0; sack.buffer_len()];
        sack.emit(&mut payload);
        f.transport.payload_len = payload.len();
        f.fill_lengths();
    }
    let mut buf = vec![0u8; f.buffer_len()];
    f.emit(&mut buf, &payload).ok()?;
    Some(buf)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn engine_survives_random_well_framed_packets(
        packets in prop::collection::vec(packet(), 1..24),
        ty in prop::sample::select(vec![QpType::Rc, QpType::Uc, QpType::Ud]),
        post_send in any::<bool>(),
        selective in any::<bool>(),
    ) {
        let mut sim = Sim::pair(1, LinkModel::default());
        // RC QPs with selective retransmission too: its reorder buffer, SACKs and repairs.
        let loss_recovery = if selective {
            LossRecovery::Selective(SelectiveParams { bdp_bytes: 8192 })
        } else {
            LossRecovery::GoBackN
        };
        let o = QpOptions { qp_type: ty, mtu: Mtu::Mtu256, timeout: 8, loss_recovery, ..Default::default() };
        let (qa, qb) = if ty == QpType::Ud {
            let qa = sim.create_qp(0, &o);
            let qb = sim.create_qp(1, &o);
            sim.bring_up(0, qa, 1, qb, &o);
            sim.bring_up(1, qb, 0, qa, &o);
            (qa, qb)
        } else {
            sim.connect(0, 1, &o)
        };
        let acc = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
        let (b, kb) = sim.alloc_mr(1, 65536, acc);
        let (a, ka) = sim.alloc_mr(0, 65536, acc);
        for i in 0..4u64 {
            let sg = Sge { addr: b + i * 4096, length: 4096, lkey: kb.lkey };
            sim.dev(1).post_recv(qb, RecvWr { wr_id: i, sg_list: vec![sg] }).unwrap();
        }
        if post_send && ty == QpType::Rc {
            // Something outstanding at node 1 so that responses find a WQE to act on.
            let r = RemoteAddr { va: a, rkey: ka.rkey };
            let sg = Some(Sge { addr: b, length: 600, lkey: kb.lkey });
            sim.dev(1).post_send(qb, SendWr::new(1, SendOp::Read(r), sg)).unwrap();
            sim.dev(1).post_send(qb, SendWr::new(2, SendOp::FetchAdd { remote: r, add: 1 }, Some(Sge { addr: b, length: 8, lkey: kb.lkey }))).unwrap();
        }
        let mut buf = vec![0u8; MAX_FRAME_LEN];
        let mut now = 0;
        let cq = sim.nodes[1].cq;
        for p in &packets {
            let dest = match p.dest { 0 => qb, 1 => Qpn::new(0), 2 => Qpn::MULTICAST, _ => Qpn::new(qb.value() + 1) };
            let (_, _, epsn) = sim.dev(1).qp_psns(qb).unwrap();
            if let Some(bytes) = build(p, dest, epsn, kb.rkey) {
                now += 1_000;
                let d = sim.dev(1);
                d.handle_packet(now, &bytes);
                // Truncated and bit-flipped copies are refused without a panic.
                d.handle_packet(now, &bytes[..bytes.len() / 2]);
                let mut flipped = bytes.clone();
                let at = (p.va as usize) % flipped.len();
                flipped[at] ^= 0x10;
                d.handle_packet(now, &flipped);
                while d.poll_transmit(now, &mut buf).is_some() {}
                d.handle_timeout(now + 100_000_000);
                while d.poll_transmit(now, &mut buf).is_some() {}
                while d.poll_cq(cq).is_some() {}
            }
        }
        let _ = qa;
    }
}
