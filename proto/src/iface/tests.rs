//! Two interfaces on one simulated broadcast domain: resolution both ways, answers, holding,
//! and what is handed on as RoCE.

use super::neighbor::{MAX_REQUESTS, RETRANS_TIME};
use super::*;
use crate::types::{Psn, Qpn};
use crate::wire::{
    BthRepr, FrameRepr, Ipv4Repr, LinkRepr, NetRepr, Opcode, TransportRepr, UdpRepr,
    GRH_NEXT_HEADER_IBA,
};

const MAC_A: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 0xa]);
const MAC_B: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 0xb]);

fn cidr(s: &str) -> IpCidr {
    s.parse().unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn pair() -> (EthernetInterface, EthernetInterface) {
    let a = EthernetInterface::new(
        MAC_A,
        vec![
            IpCidr::new(IpAddr::V6(MAC_A.link_local()), 64),
            cidr("10.0.0.1/24"),
            cidr("fd00::1/64"),
        ],
    );
    let b = EthernetInterface::new(
        MAC_B,
        vec![
            IpCidr::new(IpAddr::V6(MAC_B.link_local()), 64),
            cidr("10.0.0.2/24"),
            cidr("fd00::2/64"),
        ],
    );
    (a, b)
}

/// Carries every frame each side has to send to the other until both are quiet; returns
/// the RoCE packets each received.
fn exchange(
    a: &mut EthernetInterface,
    b: &mut EthernetInterface,
    now: Nanos,
) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let (mut to_a, mut to_b) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        let mut moved = false;
        while let Some(f) = a.poll_transmit(now) {
            moved = true;
            if let Inbound::Roce { packet, .. } = b.receive(&f, now) {
                to_b.push(packet.to_vec());
            }
        }
        while let Some(f) = b.poll_transmit(now) {
            moved = true;
            if let Inbound::Roce { packet, .. } = a.receive(&f, now) {
                to_a.push(packet.to_vec());
            }
        }
        if !moved {
            break;
        }
    }
    (to_a, to_b)
}

/// A v1 frame (GRH between `src` and `dst`, v4-mapped) of a small RC SEND.
fn v1_frame(src_mac: EthernetAddress, dst_mac: EthernetAddress, src: &str, dst: &str) -> Vec<u8> {
    let map = |s: &str| match ip(s) {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    let mut f = FrameRepr {
        link: LinkRepr::Ethernet(EthernetRepr {
            dst: dst_mac,
            src: src_mac,
            vlan: None,
            ethertype: EtherType::ROCE_V1,
        }),
        net: NetRepr::Grh(Ipv6Repr {
            src: map(src),
            dst: map(dst),
            traffic_class: 0,
            flow_label: 0,
            next_header: GRH_NEXT_HEADER_IBA,
            hop_limit: 64,
            payload_len: 0,
        }),
        udp: None,
        transport: send_only(),
    };
    f.fill_lengths();
    let mut buf = vec![0u8; f.buffer_len()];
    f.emit(&mut buf, b"hello").unwrap();
    buf
}

fn send_only() -> TransportRepr {
    let mut t = TransportRepr::new(BthRepr {
        opcode: Opcode::RC_SEND_ONLY,
        solicited: false,
        mig_req: false,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qpn: Qpn::new(0x12),
        ack_req: true,
        psn: Psn::new(0x100),
    });
    t.payload_len = 5;
    t
}

#[test]
fn arp_resolves_holds_and_releases() {
    let (mut a, mut b) = pair();
    let peer = ip("10.0.0.2");
    assert_eq!(a.resolve(peer, 0), Ok(None));
    let frame = v1_frame(MAC_A, EthernetAddress::default(), "10.0.0.1", "10.0.0.2");
    a.hold(peer, frame.clone(), 0);
    let (_, to_b) = exchange(&mut a, &mut b, 0);
    // The held frame arrived, addressed to B, and both sides learnt each other.
    assert_eq!(to_b.len(), 1);
    assert_eq!(to_b[0], frame[14..]);
    assert_eq!(a.resolve(peer, 1), Ok(Some(MAC_B)));
    assert_eq!(b.resolve(ip("10.0.0.1"), 1), Ok(Some(MAC_A)));
    assert_eq!(b.counters().arp_replies_sent, 1);
    assert_eq!(a.neighbors().counters().held_sent, 1);
}

#[test]
fn neighbour_discovery_resolves_ipv6() {
    let (mut a, mut b) = pair();
    let peer = ip("fd00::2");
    assert_eq!(a.resolve(peer, 0), Ok(None));
    a.hold(peer, vec![0u8; 80], 0);
    let f = a.poll_transmit(0).unwrap();
    // A solicitation to B's solicited-node group, hop limit 255, from A's address.
    assert_eq!(&f[..6], &[0x33, 0x33, 0xff, 0, 0, 2]);
    assert_eq!(f[12..14], [0x86, 0xdd]);
    assert_eq!(f[14 + 7], 255);
    assert_eq!(b.receive(&f, 0), Inbound::Neighbor);
    let na = b.poll_transmit(0).unwrap();
    assert_eq!(&na[..6], &MAC_A.0);
    assert_eq!(a.receive(&na, 0), Inbound::Neighbor);
    assert_eq!(a.resolve(peer, 0), Ok(Some(MAC_B)));
    let released = a.poll_transmit(0).unwrap();
    assert_eq!(&released[..6], &MAC_B.0);
    assert_eq!(b.counters().advertisements_sent, 1);
}

#[test]
fn link_local_eui64_needs_no_solicitation_and_other_prefixes_are_unreachable() {
    let (mut a, _) = pair();
    assert_eq!(
        a.resolve(IpAddr::V6(MAC_B.link_local()), 0),
        Ok(Some(MAC_B))
    );
    assert_eq!(a.resolve(ip("192.168.7.7"), 0), Err(Unreachable::NoRoute));
    assert_eq!(a.resolve(ip("fd01::7"), 0), Err(Unreachable::NoRoute));
    assert_eq!(
        a.resolve(ip("ff0e::1"), 0),
        Ok(Some(EthernetAddress([0x33, 0x33, 0, 0, 0, 1])))
    );
    assert_eq!(
        a.resolve(ip("239.129.1.2"), 0),
        Ok(Some(EthernetAddress([1, 0, 0x5e, 1, 1, 2])))
    );
    assert!(a.poll_transmit(0).is_none());
}

#[test]
fn the_interfaces_own_addresses_are_at_its_own_mac_unasked() {
    let (mut a, _) = pair();
    for own in ["10.0.0.1", "fd00::1"] {
        assert_eq!(a.resolve(ip(own), 0), Ok(Some(MAC_A)), "{own}");
        a.solicit(ip(own), 0);
    }
    assert!(
        a.poll_transmit(0).is_none(),
        "nobody is asked for its own address"
    );
}

#[test]
fn an_unanswered_peer_is_solicited_three_times() {
    let (mut a, _) = pair();
    a.hold(ip("10.0.0.9"), vec![0u8; 64], 0);
    let mut requests = 0;
    let mut t = 0;
    while t < 10 * RETRANS_TIME {
        while let Some(f) = a.poll_transmit(t) {
            assert_eq!(&f[..6], &[0xff; 6]);
            requests += 1;
        }
        t += RETRANS_TIME / 2;
    }
    assert_eq!(requests, MAX_REQUESTS);
    assert_eq!(a.neighbors().counters().held_dropped, 1);
}

#[test]
fn roce_frames_are_classified_and_trimmed() {
    let (mut a, _) = pair();
    let v1 = v1_frame(MAC_B, MAC_A, "10.0.0.2", "10.0.0.1");
    match a.receive(&v1, 0) {
        Inbound::Roce {
            framing,
            packet,
            src_mac,
        } => {
            assert_eq!((framing, src_mac), (RoceFraming::V1, MAC_B));
            assert_eq!(packet, &v1[14..]);
        }
        other => panic!("{other:?}"),
    }
    // A v2 IPv4 frame padded past its IP length: the padding is cut off.
    let mut f = FrameRepr {
        link: LinkRepr::Ethernet(a.header(MAC_A, EtherType::IPV4)),
        net: NetRepr::Ipv4(Ipv4Repr {
            src: "10.0.0.2".parse().unwrap(),
            dst: "10.0.0.1".parse().unwrap(),
            tos: 0,
            ident: 7,
            dont_frag: true,
            ttl: 64,
            protocol: 17,
            payload_len: 0,
        }),
        udp: Some(UdpRepr {
            src_port: 0xc000,
            dst_port: ROCE_V2_PORT,
            checksum: 0,
            payload_len: 0,
        }),
        transport: send_only(),
    };
    f.link = LinkRepr::Ethernet(EthernetRepr {
        src: MAC_B,
        ..a.header(MAC_A, EtherType::IPV4)
    });
    f.fill_lengths();
    let mut buf = vec![0u8; f.buffer_len() + 6];
    f.emit(&mut buf, b"hello").unwrap();
    match a.receive(&buf, 0) {
        Inbound::Roce {
            framing, packet, ..
        } => {
            assert_eq!(framing, RoceFraming::V2);
            assert_eq!(packet.len(), f.buffer_len() - 14);
        }
        other => panic!("{other:?}"),
    }
    // Another host's unicast, and our own frames echoed back, are not ours.
    let other = v1_frame(
        MAC_B,
        EthernetAddress([2, 0, 0, 0, 0, 0xc]),
        "10.0.0.2",
        "10.0.0.3",
    );
    assert_eq!(a.receive(&other, 0), Inbound::Ignored);
    let echo = v1_frame(MAC_A, MAC_A, "10.0.0.1", "10.0.0.1");
    assert_eq!(a.receive(&echo, 0), Inbound::Ignored);
    assert_eq!(a.counters().not_for_us, 2);
    assert_eq!(a.receive(&buf[..10], 0), Inbound::Ignored);
}

#[test]
fn duplicate_address_detection_is_answered_to_all_nodes() {
    let (_, mut b) = pair();
    let target: Ipv6Addr = "fd00::2".parse().unwrap();
    let ns = NdiscRepr::NeighborSolicit {
        target,
        source_lladdr: None,
    };
    let sn = ndisc::solicited_node(&target);
    let a = EthernetInterface::new(MAC_A, vec![]);
    let f = a.ndisc_frame(ndisc::multicast_mac(&sn), Ipv6Addr::UNSPECIFIED, sn, &ns);
    assert_eq!(b.receive(&f, 0), Inbound::Neighbor);
    let na = b.poll_transmit(0).unwrap();
    assert_eq!(&na[..6], &[0x33, 0x33, 0, 0, 0, 1]);
    // A corrupted solicitation is refused and counted.
    let mut bad = f.clone();
    let last = bad.len() - 1;
    bad[last] ^= 0x40;
    assert_eq!(b.receive(&bad, 0), Inbound::Neighbor);
    assert_eq!(b.counters().neighbor_malformed, 1);
    assert!(b.poll_transmit(0).is_none());
}

#[test]
fn cidr_parsing_and_containment() {
    let c = cidr("10.1.2.3/16");
    assert!(c.contains(&ip("10.1.200.1")) && !c.contains(&ip("10.2.0.1")));
    assert_eq!(cidr("10.0.0.1").prefix_len, 32);
    assert!(cidr("fd00::1/0").contains(&ip("2001::1")));
    assert!("10.0.0.1/33".parse::<IpCidr>().is_err());
    assert!("nonsense/8".parse::<IpCidr>().is_err());
    assert_eq!(cidr("fd00::1/64").to_string(), "fd00::1/64");
}
