//! Whole Ethernet frames for a capture, around what the device really sent and received.
//!
//! A UDP socket hands the daemon only the UDP payload (BTH..ICRC); the kernel writes the IP
//! and UDP headers. A capture must show the packet as it was on the wire, so these headers
//! are rebuilt with the values that were really used: the addresses and ports, the TOS and
//! TTL the send asked for, the IPv4 Identification the ICRC was sealed for (0, or `k` for the
//! `k`-th segment of a GSO send) or recovered on receive, DF, and the UDP checksum the kernel
//! computes on a socket that sends checksums (0 on one that does not). The ICRC then
//! verifies in any checker, and each GSO segment or GRO piece is a frame of its own.
//!
//! MAC addresses: the device's own (from its node GUID) for its side; a peer's is unknown
//! to a UDP socket, so the frames carry a locally administered address derived from the
//! peer's IP address.

use std::net::{IpAddr, SocketAddr};

/// Ethernet + the largest IP header + UDP.
pub const MAX_HEADERS: usize = 14 + 40 + 8;

/// The IP-level fields of one datagram that the socket does not show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpFields {
    pub tos: u8,
    pub ttl: u8,
    /// IPv4 only.
    pub ident: u16,
    pub dont_frag: bool,
}

/// One UDP datagram carrying a RoCE v2 packet.
#[derive(Debug, Clone, Copy)]
pub struct UdpDatagram<'a> {
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub ip: IpFields,
    /// Whether the UDP checksum is computed (else 0, as rxe and `SO_NO_CHECK` send).
    pub checksum: bool,
    /// BTH..ICRC.
    pub payload: &'a [u8],
}

/// A locally administered MAC for an IP address the device does not own.
pub fn peer_mac(ip: IpAddr) -> [u8; 6] {
    let bytes = match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    };
    let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    });
    let b = h.to_be_bytes();
    [0x06, b[3], b[4], b[5], b[6], b[7]]
}

/// The MAC a node GUID was made from (EUI-64 with ff:fe inserted and the U/L bit flipped).
pub fn guid_mac(node_guid: u64) -> [u8; 6] {
    let g = node_guid.to_be_bytes();
    [g[0] ^ 2, g[1], g[2], g[5], g[6], g[7]]
}

/// The one's-complement sum of `data` as 16-bit big-endian words, folded to 16 bits. The sum
/// does not depend on byte order (RFC 1071 §2(B): sum native words, swap the result) and
/// wider words with their carries folded back give the same sum (§2(C)): 32-bit native words
/// into a 64-bit accumulator, which the compiler vectorises (a captured datagram's checksum
/// is a pass over every byte on the device thread).
fn sum_words(data: &[u8]) -> u64 {
    let mut acc: u64 = 0;
    let mut words = data.chunks_exact(4);
    for w in &mut words {
        acc += u64::from(u32::from_ne_bytes(
            <[u8; 4]>::try_from(w).unwrap_or_default(),
        ));
    }
    let rest = words.remainder();
    let mut tail = [0u8; 4];
    tail[..rest.len()].copy_from_slice(rest);
    acc += u64::from(u32::from_ne_bytes(tail));
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    u64::from(u16::from_be(acc as u16))
}

fn fold(mut sum: u64) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The UDP checksum (RFC 768, RFC 8200 §8.1) of a datagram whose UDP header (checksum field
/// 0) and payload are `udp`; a result of 0 is sent as 0xffff.
pub fn udp_checksum(src: IpAddr, dst: IpAddr, udp: &[u8]) -> u16 {
    let mut pseudo = [0u8; 40];
    let n = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            pseudo[..4].copy_from_slice(&s.octets());
            pseudo[4..8].copy_from_slice(&d.octets());
            pseudo[9] = 17;
            pseudo[10..12].copy_from_slice(&(udp.len() as u16).to_be_bytes());
            12
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            pseudo[..16].copy_from_slice(&s.octets());
            pseudo[16..32].copy_from_slice(&d.octets());
            pseudo[32..36].copy_from_slice(&(udp.len() as u32).to_be_bytes());
            pseudo[39] = 17;
            40
        }
        _ => return 0,
    };
    match fold(sum_words(&pseudo[..n]) + sum_words(udp)) {
        0 => 0xffff,
        c => c,
    }
}

/// Appends the Ethernet frame of `d` to `out`; `None` (nothing appended) when the addresses
/// are of two IP versions or the datagram is too long for its IP header.
pub fn udp_frame(
    out: &mut Vec<u8>,
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    d: &UdpDatagram<'_>,
) -> Option<usize> {
    use proto::wire::{Ipv4Repr, Ipv6Repr, UdpRepr};
    let udp_len = 8 + d.payload.len();
    let start = out.len();
    let (ethertype, ip_len) = match d.src.ip() {
        IpAddr::V4(_) => (0x0800u16, 20),
        IpAddr::V6(_) => (0x86dd, 40),
    };
    if udp_len + 40 > usize::from(u16::MAX) || d.src.is_ipv4() != d.dst.is_ipv4() {
        return None;
    }
    out.extend_from_slice(&dst_mac);
    out.extend_from_slice(&src_mac);
    out.extend_from_slice(&ethertype.to_be_bytes());
    let ip_at = out.len();
    out.resize(ip_at + ip_len + 8, 0);
    match (d.src.ip(), d.dst.ip()) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => Ipv4Repr {
            src,
            dst,
            tos: d.ip.tos,
            ident: d.ip.ident,
            dont_frag: d.ip.dont_frag,
            ttl: d.ip.ttl,
            protocol: 17,
            payload_len: udp_len,
        }
        .emit(&mut out[ip_at..ip_at + 20]),
        (IpAddr::V6(src), IpAddr::V6(dst)) => Ipv6Repr {
            src,
            dst,
            traffic_class: d.ip.tos,
            flow_label: 0,
            next_header: 17,
            hop_limit: d.ip.ttl,
            payload_len: udp_len,
        }
        .emit(&mut out[ip_at..ip_at + 40]),
        _ => unreachable!("checked above"),
    }
    let udp_at = ip_at + ip_len;
    UdpRepr {
        src_port: d.src.port(),
        dst_port: d.dst.port(),
        checksum: 0,
        payload_len: d.payload.len(),
    }
    .emit(&mut out[udp_at..udp_at + 8]);
    out.extend_from_slice(d.payload);
    if d.checksum {
        let c = udp_checksum(d.src.ip(), d.dst.ip(), &out[udp_at..]);
        out[udp_at + 6..udp_at + 8].copy_from_slice(&c.to_be_bytes());
    }
    Some(out.len() - start)
}

/// Appends the Ethernet frame around a network-layer packet as the engine speaks it (IPv4 or
/// IPv6 + UDP + BTH..ICRC, or a RoCE v1 GRH + BTH..ICRC), with the UDP checksum computed for
/// IPv6 (the engine, and a link rebuilding received headers, leave it 0; IPv6 requires one)
/// and, with `seal`, the ICRC too: packets between two QPs of one device are never sealed
/// (nothing on the way could corrupt them), but a capture shows them as they would be on a
/// wire. [`copy_network_frame`] and [`finish_network_frame`] are its two halves.
pub fn network_frame(
    out: &mut Vec<u8>,
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    packet: &[u8],
    seal: bool,
) -> Option<usize> {
    let start = out.len();
    let n = copy_network_frame(out, src_mac, dst_mac, packet)?;
    finish_network_frame(&mut out[start..], seal)?;
    Some(n)
}

/// The first half of [`network_frame`], the part that must happen while the packet is at
/// hand: the Ethernet header and the packet appended, its UDP checksum zeroed. `None`
/// (nothing appended) for a packet too short to hold a BTH and an ICRC.
pub fn copy_network_frame(
    out: &mut Vec<u8>,
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    packet: &[u8],
) -> Option<usize> {
    let shape = Shape::of_network(packet)?;
    let start = out.len();
    out.extend_from_slice(&dst_mac);
    out.extend_from_slice(&src_mac);
    out.extend_from_slice(&shape.ethertype.to_be_bytes());
    let net_at = out.len();
    out.extend_from_slice(packet);
    if shape.udp {
        out[net_at + shape.net_len + 6..net_at + shape.net_len + 8].fill(0);
    }
    Some(out.len() - start)
}

/// The second half of [`network_frame`], on a frame [`copy_network_frame`] made: the ICRC
/// (with `seal`), then the IPv6 UDP checksum, which covers it. A capture's writer thread
/// does this for the device thread: it is a pass over every byte.
pub fn finish_network_frame(eth_frame: &mut [u8], seal: bool) -> Option<()> {
    use proto::wire::icrc;
    let frame = eth_frame.get_mut(14..)?;
    let shape = Shape::of_network(frame)?;
    let net_len = shape.net_len;
    let covered_end = frame.len() - proto::wire::ICRC_LEN;
    if seal {
        let (head, rest) = frame.split_at(net_len);
        let crc = if !shape.udp {
            icrc::v1(head, &rest[..covered_end - net_len])
        } else {
            let (udp_hdr, transport) = rest.split_at(8);
            let covered = &transport[..covered_end - shape.bth];
            if net_len == 20 {
                icrc::v2_ipv4(head, udp_hdr, covered)
            } else {
                icrc::v2_ipv6(head, udp_hdr, covered)
            }
        };
        frame[covered_end..].copy_from_slice(&crc.to_le_bytes());
    }
    // IPv4 carries no UDP checksum here (0, as rxe sends; what was really on the wire is
    // unknown for a received packet, never was for a local one); IPv6 must have one.
    if shape.udp && net_len == 40 {
        let src = std::net::Ipv6Addr::from(<[u8; 16]>::try_from(&frame[8..24]).ok()?);
        let dst = std::net::Ipv6Addr::from(<[u8; 16]>::try_from(&frame[24..40]).ok()?);
        let c = udp_checksum(src.into(), dst.into(), &frame[net_len..]);
        frame[net_len + 6..net_len + 8].copy_from_slice(&c.to_be_bytes());
    }
    Some(())
}

/// Whether the frame of a network-layer packet needs a UDP checksum [`finish_network_frame`]
/// computes: RoCE v2 over IPv6.
pub fn needs_udp_checksum(packet: &[u8]) -> bool {
    Shape::of_network(packet).is_some_and(|s| s.udp && s.net_len == 40)
}

/// Where the headers of a network-layer packet end, and what it is.
struct Shape {
    ethertype: u16,
    /// The IP header's or the GRH's length.
    net_len: usize,
    /// RoCE v2 (a UDP header follows), not v1.
    udp: bool,
    /// Where the BTH starts.
    bth: usize,
}

impl Shape {
    /// `None` for a packet too short to hold its headers, a BTH and an ICRC.
    fn of_network(packet: &[u8]) -> Option<Shape> {
        const GRH_NEXT_HEADER_BTH: u8 = 0x1b;
        let (ethertype, net_len, udp) = match packet.first()? >> 4 {
            4 => (0x0800u16, 20, true),
            6 if *packet.get(6)? == GRH_NEXT_HEADER_BTH => (0x8915, 40, false),
            6 => (0x86dd, 40, true),
            _ => return None,
        };
        let bth = net_len + if udp { 8 } else { 0 };
        let covered_end = packet.len().checked_sub(proto::wire::ICRC_LEN)?;
        if covered_end < bth + proto::wire::bth::HEADER_LEN {
            return None;
        }
        Some(Shape {
            ethertype,
            net_len,
            udp,
            bth,
        })
    }
}

/// An IPv4 RoCE v2 packet as an engine hands it between two QPs of one device: headers
/// built, the ICRC left 0 (for the capture tests).
#[cfg(test)]
pub(crate) fn engine_ipv4_packet() -> Vec<u8> {
    use crate::net::PacketBuilder;
    let (src, dst): (IpAddr, IpAddr) = ("127.0.0.1".parse().unwrap(), "127.0.0.1".parse().unwrap());
    let b = PacketBuilder::new(src, dst, 0xc000);
    let mut transport = tests::transport_packet(&b, 0);
    let n = transport.len();
    transport[n - 4..].fill(0); // as the engine leaves it
    let mut ip_packet = vec![0u8; 28];
    proto::wire::Ipv4Repr {
        src: "127.0.0.1".parse().unwrap(),
        dst: "127.0.0.1".parse().unwrap(),
        tos: 0,
        ident: 0,
        dont_frag: true,
        ttl: 64,
        protocol: 17,
        payload_len: 8 + n,
    }
    .emit(&mut ip_packet[..20]);
    proto::wire::UdpRepr {
        src_port: 0xc000,
        dst_port: 4791,
        checksum: 0,
        payload_len: n,
    }
    .emit(&mut ip_packet[20..28]);
    ip_packet.extend_from_slice(&transport);
    ip_packet
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::PacketBuilder;
    use proto::wire::frame::IcrcStatus;
    use proto::wire::FrameRepr;

    pub(super) fn transport_packet(b: &PacketBuilder, ident: u16) -> Vec<u8> {
        let mut repr = proto::wire::TransportRepr::new(proto::wire::BthRepr {
            opcode: proto::wire::Opcode(0x04), // RC SEND_ONLY
            solicited: false,
            mig_req: false,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qpn: proto::Qpn::new(0x11),
            ack_req: true,
            psn: proto::Psn::new(7),
        });
        repr.payload_len = 100;
        let payload = [0xabu8; 100];
        let mut out = vec![0u8; 200];
        let n = b.emit(ident, &repr, &payload, &mut out).unwrap();
        out.truncate(n);
        out
    }

    #[test]
    fn frames_around_socket_payloads_verify_their_icrc_and_udp_checksum() {
        for (src, dst) in [
            ("127.0.0.1:4791", "127.0.0.2:4791"),
            ("[::1]:4791", "[fe80::1]:4791"),
        ] {
            let (src, dst): (SocketAddr, SocketAddr) = (src.parse().unwrap(), dst.parse().unwrap());
            for ident in [0u16, 3] {
                let b = PacketBuilder::new(src.ip(), dst.ip(), src.port());
                let payload = transport_packet(&b, ident);
                let mut out = Vec::new();
                let d = UdpDatagram {
                    src,
                    dst,
                    ip: IpFields {
                        tos: 2,
                        ttl: 64,
                        ident,
                        dont_frag: true,
                    },
                    checksum: true,
                    payload: &payload,
                };
                let n = udp_frame(&mut out, [2; 6], peer_mac(dst.ip()), &d).unwrap();
                assert_eq!(n, out.len());
                let parsed = FrameRepr::parse_ethernet(&out, out.len()).unwrap();
                assert_eq!(parsed.icrc, IcrcStatus::Ok, "{src} -> {dst} ident {ident}");
                // The UDP checksum sums to zero over pseudo-header and datagram.
                let ip_len = if src.is_ipv4() { 20 } else { 40 };
                let mut udp = out[14 + ip_len..].to_vec();
                let sent = u16::from_be_bytes([udp[6], udp[7]]);
                udp[6..8].fill(0);
                assert_eq!(udp_checksum(src.ip(), dst.ip(), &udp), sent);
                assert_ne!(sent, 0);
            }
        }
    }

    #[test]
    fn the_word_sum_is_rfc_1071s_for_every_length() {
        // The textbook sum, 16 bits at a time, an odd byte padded with zero.
        let naive = |d: &[u8]| -> u16 {
            let mut sum: u64 = 0;
            for c in d.chunks(2) {
                sum += u64::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
            }
            fold(sum)
        };
        let data: Vec<u8> = (0..4200u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 | 0x80)
            .collect();
        for len in (0..64).chain([1023, 1024, 1025, 4095, 4096, 4097, 4200]) {
            let d = &data[..len];
            assert_eq!(fold(sum_words(d)), naive(d), "length {len}");
        }
        let ones = vec![0xffu8; 4096];
        assert_eq!(fold(sum_words(&ones)), naive(&ones));
    }

    #[test]
    fn an_ipv6_network_packet_gets_its_udp_checksum() {
        let (src, dst): (SocketAddr, SocketAddr) = (
            "[::1]:4791".parse().unwrap(),
            "[fe80::2]:4791".parse().unwrap(),
        );
        let b = PacketBuilder::new(src.ip(), dst.ip(), src.port());
        let payload = transport_packet(&b, 0);
        let d = UdpDatagram {
            src,
            dst,
            ip: IpFields {
                tos: 0,
                ttl: 64,
                ident: 0,
                dont_frag: true,
            },
            checksum: true,
            payload: &payload,
        };
        let mut wire = Vec::new();
        udp_frame(&mut wire, [2; 6], [4; 6], &d).unwrap();
        let mut packet = wire[14..].to_vec();
        packet[46..48].fill(0); // as a link rebuilds received headers
        let mut out = Vec::new();
        assert!(needs_udp_checksum(&packet), "IPv6: the writer computes it");
        network_frame(&mut out, [4; 6], [2; 6], &packet, false).unwrap();
        assert_eq!(&out[14..], &wire[14..], "checksum restored, ICRC kept");
    }

    #[test]
    fn an_engine_packet_gets_its_icrc() {
        let ip_packet = engine_ipv4_packet();
        assert!(!needs_udp_checksum(&ip_packet), "IPv4: none");
        let mut out = Vec::new();
        let mac = guid_mac(0x0211_22ff_fe33_4455);
        network_frame(&mut out, mac, mac, &ip_packet, true).unwrap();
        assert_eq!(&out[..6], &[0x00, 0x11, 0x22, 0x33, 0x44, 0x55]);
        let parsed = FrameRepr::parse_ethernet(&out, out.len()).unwrap();
        assert_eq!(parsed.icrc, IcrcStatus::Ok);
        let c = u16::from_be_bytes([out[14 + 26], out[14 + 27]]);
        assert_eq!(c, 0, "IPv4: no UDP checksum, as rxe sends");
        // Unsealed, the ICRC stays as it was.
        let mut plain = Vec::new();
        network_frame(&mut plain, mac, mac, &ip_packet, false).unwrap();
        assert_eq!(&plain[plain.len() - 4..], &[0, 0, 0, 0]);
        assert!(network_frame(&mut out, [0; 6], [0; 6], &ip_packet[..30], true).is_none());
    }
}
