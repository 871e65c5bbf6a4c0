//! Property tests: for arbitrary consistent frames, `parse(emit(repr)) == repr` with a valid
//! ICRC; and no input, however mangled, makes the parser panic.

use proptest::prelude::*;
use proto::wire::ethernet::VlanTag;
use proto::wire::frame::IcrcStatus;
use proto::wire::*;
use proto::{Psn, Qkey, Qpn, Rkey};

fn arb_bth(opcode: Opcode) -> impl Strategy<Value = BthRepr> {
    (any::<[bool; 6]>(), any::<u16>(), any::<u32>(), any::<u32>()).prop_map(
        move |(f, pkey, qpn, psn)| BthRepr {
            opcode,
            solicited: f[0],
            mig_req: f[1],
            pkey,
            fecn: f[2],
            becn: f[3],
            dest_qpn: Qpn::new(qpn),
            ack_req: f[4],
            psn: Psn::new(psn),
        },
    )
}

prop_compose! {
    fn arb_reth()(va in any::<u64>(), rkey in any::<u32>(), len in any::<u32>()) -> RethRepr {
        RethRepr { va, rkey: Rkey(rkey), len }
    }
}

fn arb_transport() -> impl Strategy<Value = (TransportRepr, Vec<u8>)> {
    let opcodes: Vec<Opcode> = Opcode::all().collect();
    (proptest::sample::select(opcodes), 0usize..4200)
        .prop_flat_map(|(op, len)| {
            (
                arb_bth(op),
                arb_reth(),
                any::<(u64, u32, u64, u64)>(),
                any::<(u8, u32, u64, u32, u32, u32, u32)>(),
                Just(len),
            )
        })
        .prop_map(|(bth, reth, atomic, misc, len)| {
            let info = bth.opcode.info().unwrap();
            let h = info.headers;
            let mut t = TransportRepr::new(bth);
            if h.contains(HeaderSet::DETH) {
                t.deth = Some(DethRepr {
                    qkey: Qkey(misc.4),
                    src_qpn: Qpn::new(misc.5),
                });
            }
            if h.contains(HeaderSet::FETH) {
                t.feth = Some(FethRepr {
                    selectivity: misc.0 & 3,
                    placement: (misc.0 >> 2) & 0xf,
                });
            }
            if h.contains(HeaderSet::RETH) {
                t.reth = Some(reth);
            }
            if h.contains(HeaderSet::ATOMIC_ETH) {
                t.atomic_eth = Some(AtomicEthRepr {
                    va: atomic.0,
                    rkey: Rkey(atomic.1),
                    swap_add: atomic.2,
                    compare: atomic.3,
                });
            }
            if h.contains(HeaderSet::AETH) {
                t.aeth = Some(AethRepr {
                    syndrome: AethSyndrome::from_byte(misc.0),
                    msn: misc.1 & 0xff_ffff,
                });
            }
            if h.contains(HeaderSet::ATOMIC_ACK_ETH) {
                t.atomic_ack_eth = Some(AtomicAckEthRepr { orig: misc.2 });
            }
            if h.contains(HeaderSet::IMM) {
                t.imm = Some(misc.3);
            }
            if h.contains(HeaderSet::IETH) {
                t.ieth = Some(Rkey(misc.6));
            }
            t.payload_len = if info.has(OpInfo::ATOMIC_WRITE) {
                8
            } else if info.has(OpInfo::PAYLOAD) {
                len
            } else {
                0
            };
            let payload = (0..t.payload_len).map(|i| (i * 31 + 7) as u8).collect();
            (t, payload)
        })
}

fn arb_frame() -> impl Strategy<Value = (FrameRepr, Vec<u8>)> {
    (
        arb_transport(),
        0u8..3,
        any::<bool>(),
        any::<bool>(),
        any::<([u8; 16], [u8; 16], u8, u8, u16, u32)>(),
        any::<(u16, u16, bool, u16)>(),
    )
        .prop_map(|((transport, payload), kind, ethernet, vlan, addr, misc)| {
            let (src, dst, tc, hop, ident, flow) = addr;
            let v6 = Ipv6Repr {
                src: src.into(),
                dst: dst.into(),
                traffic_class: tc,
                flow_label: flow & 0xfffff,
                next_header: 17,
                hop_limit: hop,
                payload_len: 0,
            };
            let (net, ethertype) = match kind {
                0 => (
                    NetRepr::Ipv4(Ipv4Repr {
                        src: [src[0], src[1], src[2], src[3]].into(),
                        dst: [dst[0], dst[1], dst[2], dst[3]].into(),
                        tos: tc,
                        ident,
                        dont_frag: misc.2,
                        ttl: hop,
                        protocol: 17,
                        payload_len: 0,
                    }),
                    EtherType::IPV4,
                ),
                1 => (NetRepr::Ipv6(v6), EtherType::IPV6),
                _ => (
                    NetRepr::Grh(Ipv6Repr {
                        next_header: GRH_NEXT_HEADER_IBA,
                        ..v6
                    }),
                    EtherType::ROCE_V1,
                ),
            };
            // A GRH needs Ethernet in front of it; IP may come raw.
            let link = if ethernet || net.is_v1() {
                LinkRepr::Ethernet(EthernetRepr {
                    dst: EthernetAddress([2, 0, 0, 0, 0, 1]),
                    src: EthernetAddress([2, 0, 0, 0, 0, 2]),
                    vlan: vlan.then_some(VlanTag {
                        tpid: EtherType::VLAN,
                        tci: misc.3,
                    }),
                    ethertype,
                })
            } else {
                LinkRepr::None
            };
            let udp = (!net.is_v1()).then_some(UdpRepr {
                src_port: misc.0,
                dst_port: ROCE_V2_PORT,
                checksum: misc.1,
                payload_len: 0,
            });
            let mut frame = FrameRepr {
                link,
                net,
                udp,
                transport,
            };
            frame.fill_lengths();
            (frame, payload)
        })
}

fn parse<'a>(bytes: &'a [u8], link: &LinkRepr) -> Result<frame::ParsedFrame<'a>> {
    match link {
        LinkRepr::Ethernet(_) => FrameRepr::parse_ethernet(bytes, bytes.len()),
        LinkRepr::None => FrameRepr::parse_ip(bytes, bytes.len()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn emit_then_parse_gives_back_the_repr((frame, payload) in arb_frame()) {
        let mut buf = vec![0u8; frame.buffer_len()];
        frame.emit(&mut buf, &payload).unwrap();
        let parsed = parse(&buf, &frame.link).unwrap();
        prop_assert_eq!(parsed.icrc, IcrcStatus::Ok);
        prop_assert_eq!(parsed.repr, frame);
        prop_assert_eq!(parsed.payload, &payload[..]);
    }

    #[test]
    fn mangled_frames_never_panic(
        (frame, payload) in arb_frame(),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        cut in any::<usize>(),
        claimed in any::<usize>(),
    ) {
        let mut buf = vec![0u8; frame.buffer_len()];
        frame.emit(&mut buf, &payload).unwrap();
        for (at, x) in flips {
            let i = at % buf.len();
            buf[i] ^= x;
        }
        let cut = cut % (buf.len() + 1);
        let _ = FrameRepr::parse_ethernet(&buf[..cut], claimed % 10_000);
        let _ = FrameRepr::parse_ip(&buf[..cut], claimed % 10_000);
        let _ = RocePacket::new_checked(&buf[..cut]);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = FrameRepr::parse_ethernet(&bytes, bytes.len());
        let _ = FrameRepr::parse_ip(&bytes, bytes.len());
        if let Ok(p) = RocePacket::new_checked(&bytes[..]) {
            let _ = TransportRepr::parse(&p);
        }
        let _ = mad::cm_summary(&bytes);
    }
}
