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

use proto::wire::checksum;
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

/// The one's-complement sum of `data` as 16-bit big-endian words, folded to 16 bits.
fn sum_words(data: &[u8]) -> u64 {
    checksum::fold_be(checksum::sum(0, data))
}

/// The sum of the UDP pseudo-header (RFC 768, RFC 8200 §8.1) for a datagram of `udp_len`
/// bytes; `None` for addresses of two IP versions.
fn pseudo_sum(src: IpAddr, dst: IpAddr, udp_len: usize) -> Option<u64> {
    let mut pseudo = [0u8; 40];
    let n = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            pseudo[..4].copy_from_slice(&s.octets());
            pseudo[4..8].copy_from_slice(&d.octets());
            pseudo[9] = 17;
            pseudo[10..12].copy_from_slice(&(udp_len as u16).to_be_bytes());
            12
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            pseudo[..16].copy_from_slice(&s.octets());
            pseudo[16..32].copy_from_slice(&d.octets());
            pseudo[32..36].copy_from_slice(&(udp_len as u32).to_be_bytes());
            pseudo[39] = 17;
            40
        }
        _ => return None,
    };
    Some(sum_words(&pseudo[..n]))
}

/// The checksum field for a datagram whose pseudo-header, header and payload sum to `sum`
/// (big-endian sums): a result of 0 is sent as 0xffff.
fn checksum_field(sum: u64) -> u16 {
    match checksum::complement(sum) {
        0 => 0xffff,
        c => c,
    }
}

fn ethernet_header(out: &mut [u8], src_mac: [u8; 6], dst_mac: [u8; 6], ethertype: u16) {
    out[..6].copy_from_slice(&dst_mac);
    out[6..12].copy_from_slice(&src_mac);
    out[12..14].copy_from_slice(&ethertype.to_be_bytes());
}

/// The length of the Ethernet frame of `d` ([`udp_frame`]); `None` when its addresses are of
/// two IP versions or it is too long for its IP header.
pub fn udp_frame_len(d: &UdpDatagram<'_>) -> Option<usize> {
    let ip_len = if d.src.is_ipv4() { 20 } else { 40 };
    let udp_len = 8 + d.payload.len();
    if udp_len + 40 > usize::from(u16::MAX) || d.src.is_ipv4() != d.dst.is_ipv4() {
        return None;
    }
    Some(14 + ip_len + udp_len)
}

/// Writes the Ethernet frame of `d` into `out`, which is [`udp_frame_len`] bytes long (`None`,
/// nothing written, otherwise). The payload is summed for the UDP checksum by the pass that
/// copies it: a captured datagram costs the device thread one pass over its bytes.
pub fn udp_frame(
    out: &mut [u8],
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    d: &UdpDatagram<'_>,
) -> Option<()> {
    use proto::wire::{Ipv4Repr, Ipv6Repr, UdpRepr};
    if udp_frame_len(d) != Some(out.len()) {
        return None;
    }
    let udp_len = 8 + d.payload.len();
    let (ethertype, ip_len) = match d.src.ip() {
        IpAddr::V4(_) => (0x0800u16, 20),
        IpAddr::V6(_) => (0x86dd, 40),
    };
    ethernet_header(out, src_mac, dst_mac, ethertype);
    let (ip, udp) = out[14..].split_at_mut(ip_len);
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
        .emit(ip),
        (IpAddr::V6(src), IpAddr::V6(dst)) => Ipv6Repr {
            src,
            dst,
            traffic_class: d.ip.tos,
            flow_label: 0,
            next_header: 17,
            hop_limit: d.ip.ttl,
            payload_len: udp_len,
        }
        .emit(ip),
        _ => return None,
    }
    let (header, payload) = udp.split_at_mut(8);
    UdpRepr {
        src_port: d.src.port(),
        dst_port: d.dst.port(),
        checksum: 0,
        payload_len: d.payload.len(),
    }
    .emit(header);
    if d.checksum {
        // The lengths are equal: `out` has `udp_frame_len`.
        let payload_sum = checksum::fold_be(checksum::copy_summing(0, payload, d.payload)?);
        let pseudo = pseudo_sum(d.src.ip(), d.dst.ip(), udp_len)?;
        let c = checksum_field(pseudo + sum_words(header) + payload_sum);
        header[6..8].copy_from_slice(&c.to_be_bytes());
    } else {
        payload.copy_from_slice(d.payload);
    }
    Some(())
}

/// The length of the Ethernet frame around a network-layer packet ([`network_frame`]);
/// `None` for a packet too short to hold its headers, a BTH and an ICRC.
pub fn network_frame_len(packet: &[u8]) -> Option<usize> {
    Shape::of_network(packet).map(|_| 14 + packet.len())
}

/// Writes the Ethernet frame around a network-layer packet as the engine speaks it (IPv4 or
/// IPv6 + UDP + BTH..ICRC, or a RoCE v1 GRH + BTH..ICRC) into `out`, which is
/// [`network_frame_len`] bytes long (`None`, nothing meaningful written, otherwise), with the
/// UDP checksum computed for IPv6 (the engine, and a link rebuilding received headers, leave
/// it 0; IPv6 requires one) and, with `seal`, the ICRC too: packets between two QPs of one
/// device are never sealed (nothing on the way could corrupt them), but a capture shows them
/// as they would be on a wire.
///
/// All of it happens here, on the device thread, in the pass that copies the packet (the ICRC
/// by `icrc::v2_copying_payload`, the IPv6 sum by [`checksum::copy_summing`]): a capture's
/// writer that read the bytes again to finish them pulled every cache line of every batch to
/// the other CPU and back, and on this class of machine that crossing cost the device thread
/// more than the copy (`bench/baseline.c handoff`: 470-690 ns per 4 KiB packet, against 52-58
/// ns when nobody reads the batch).
pub fn network_frame(
    out: &mut [u8],
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    packet: &[u8],
    seal: bool,
) -> Option<()> {
    use proto::wire::{bth, icrc, ICRC_LEN};
    let shape = Shape::of_network(packet)?;
    if out.len() != 14 + packet.len() {
        return None;
    }
    ethernet_header(out, src_mac, dst_mac, shape.ethertype);
    let frame = &mut out[14..];
    let net_len = shape.net_len;
    // The headers the ICRC masks, copied as they are (checked by `Shape`: the BTH fits).
    let head = shape.bth + bth::HEADER_LEN;
    let covered_end = packet.len() - ICRC_LEN;
    frame[..head].copy_from_slice(&packet[..head]);
    if shape.udp {
        // IPv4 carries no UDP checksum here (0, as rxe sends; what was really on the wire is
        // unknown for a received packet, never was for a local one); IPv6's is computed below.
        frame[net_len + 6..net_len + 8].fill(0);
    }
    let checksummed = shape.udp && net_len == 40;
    let (headers, rest) = frame.split_at_mut(head);
    let mut rest_sum = 0;
    if seal {
        let (covered, icrc_field) = rest.split_at_mut(covered_end - head);
        let payload = &packet[head..covered_end];
        let bth_header = &headers[shape.bth..];
        let crc = if shape.udp {
            let (ip, udp) = headers[..shape.bth].split_at(net_len);
            icrc::v2_copying_payload(ip, udp, bth_header, payload, covered)
        } else {
            icrc::v1_copying_payload(&headers[..net_len], bth_header, payload, covered)
        };
        icrc_field.copy_from_slice(&crc.to_le_bytes());
        if checksummed {
            // The bytes are in this CPU's cache from the pass just made.
            rest_sum = checksum::sum(0, rest);
        }
    } else if checksummed {
        rest_sum = checksum::copy_summing(0, rest, &packet[head..])?;
    } else {
        rest.copy_from_slice(&packet[head..]);
    }
    if checksummed {
        let udp_sum = sum_words(&frame[net_len..head]) + checksum::fold_be(rest_sum);
        set_ipv6_udp_checksum(frame, udp_sum)?;
    }
    Some(())
}

/// Writes the UDP checksum of an IPv6 packet (`frame`, IPv6 header first) whose UDP header
/// (checksum field 0) and payload sum to `udp_sum` (big-endian sums).
fn set_ipv6_udp_checksum(frame: &mut [u8], udp_sum: u64) -> Option<()> {
    let src = std::net::Ipv6Addr::from(<[u8; 16]>::try_from(frame.get(8..24)?).ok()?);
    let dst = std::net::Ipv6Addr::from(<[u8; 16]>::try_from(frame.get(24..40)?).ok()?);
    let pseudo = pseudo_sum(src.into(), dst.into(), frame.len().checked_sub(40)?)?;
    let field = frame.get_mut(40 + 6..40 + 8)?;
    field.copy_from_slice(&checksum_field(pseudo + udp_sum).to_be_bytes());
    Some(())
}

/// Computes the ICRC of a network-layer packet as the engine speaks it (IPv4 or IPv6 + UDP +
/// BTH..ICRC, or a RoCE v1 GRH + BTH..ICRC) and writes it into its last 4 bytes, as an engine
/// with `seal_icrc` does: the tests' stand-in for the engines that seal the packets a capture
/// takes in place.
#[cfg(test)]
pub(crate) fn seal(packet: &mut [u8]) -> Option<()> {
    use proto::wire::{icrc, ICRC_LEN};
    let shape = Shape::of_network(packet)?;
    let covered_end = packet.len() - ICRC_LEN;
    let (headers, rest) = packet.split_at(shape.bth);
    let transport = &rest[..covered_end - shape.bth];
    let crc = match (shape.udp, shape.net_len) {
        (false, _) => icrc::v1(headers, transport),
        (true, 20) => icrc::v2_ipv4(&headers[..20], &headers[20..], transport),
        (true, _) => icrc::v2_ipv6(&headers[..40], &headers[40..], transport),
    };
    packet[covered_end..].copy_from_slice(&crc.to_le_bytes());
    Some(())
}

/// Completes, in place, the Ethernet frame around a network-layer packet already at
/// `eth_frame[14..]`, sealed by its engine: what [`network_frame`] makes of it, without
/// copying it. The Ethernet header goes into the first 14 bytes and the IPv4 UDP checksum is
/// zeroed (IPv6's computed over the packet as it is). `None` (nothing changed) for a packet
/// too short to hold its headers, a BTH and an ICRC.
///
/// For packets between two QPs of one device, which a capture lays its blocks around while
/// they wait in the device's own buffer ([`crate::net::LocalFrames`]): their bytes are
/// never copied for the capture.
pub fn complete_in_place(eth_frame: &mut [u8], src_mac: [u8; 6], dst_mac: [u8; 6]) -> Option<()> {
    let shape = Shape::of_network(eth_frame.get(14..)?)?;
    ethernet_header(eth_frame, src_mac, dst_mac, shape.ethertype);
    let frame = &mut eth_frame[14..];
    let net_len = shape.net_len;
    if shape.udp {
        // The ICRC masks the UDP checksum: zeroing it after sealing changes nothing.
        frame[net_len + 6..net_len + 8].fill(0);
    }
    if shape.udp && net_len == 40 {
        let udp_sum = sum_words(&frame[net_len..]);
        set_ipv6_udp_checksum(frame, udp_sum)?;
    }
    Some(())
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
pub(crate) mod tests {
    use super::*;
    use crate::net::PacketBuilder;
    use proto::wire::frame::IcrcStatus;
    use proto::wire::FrameRepr;

    /// Whether the UDP datagram `udp` (header and payload, its checksum field as sent) carries
    /// a right checksum, by proto's Internet checksum (an implementation other than this
    /// file's): 0 over the pseudo-header and the datagram.
    pub(crate) fn udp_checksum_right(src: IpAddr, dst: IpAddr, udp: &[u8]) -> bool {
        use proto::wire::{ipv4, ipv6};
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let mut all = Vec::with_capacity(12 + udp.len());
                all.extend_from_slice(&s.octets());
                all.extend_from_slice(&d.octets());
                all.extend_from_slice(&[0, 17]);
                all.extend_from_slice(&(udp.len() as u16).to_be_bytes());
                all.extend_from_slice(udp);
                ipv4::header_checksum(&all) == 0
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => ipv6::pseudo_header_checksum(&s, &d, 17, udp) == 0,
            _ => false,
        }
    }

    /// [`udp_frame`] into a buffer of its own.
    pub(crate) fn udp_frame_vec(
        src_mac: [u8; 6],
        dst_mac: [u8; 6],
        d: &UdpDatagram<'_>,
    ) -> Vec<u8> {
        let mut out = vec![0u8; udp_frame_len(d).unwrap()];
        udp_frame(&mut out, src_mac, dst_mac, d).unwrap();
        out
    }

    /// [`network_frame`] into a buffer of its own.
    fn network_frame_vec(mac: [u8; 6], packet: &[u8], seal: bool) -> Option<Vec<u8>> {
        let mut out = vec![0u8; network_frame_len(packet)?];
        network_frame(&mut out, mac, mac, packet, seal)?;
        Some(out)
    }

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
                let out = udp_frame_vec([2; 6], peer_mac(dst.ip()), &d);
                let mut short = vec![0u8; out.len() - 1];
                assert!(udp_frame(&mut short, [2; 6], [4; 6], &d).is_none());
                let parsed = FrameRepr::parse_ethernet(&out, out.len()).unwrap();
                assert_eq!(parsed.icrc, IcrcStatus::Ok, "{src} -> {dst} ident {ident}");
                // The UDP checksum sums to zero over pseudo-header and datagram.
                let ip_len = if src.is_ipv4() { 20 } else { 40 };
                let udp = &out[14 + ip_len..];
                assert!(udp_checksum_right(src.ip(), dst.ip(), udp));
                assert_ne!(u16::from_be_bytes([udp[6], udp[7]]), 0);
            }
        }
    }

    /// An IPv6 RoCE v2 frame as a socket sent it, UDP checksum and ICRC computed.
    fn ipv6_wire_frame() -> Vec<u8> {
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
        udp_frame_vec([2; 6], [4; 6], &d)
    }

    #[test]
    fn an_ipv6_network_packet_gets_its_udp_checksum() {
        let wire = ipv6_wire_frame();
        let mut packet = wire[14..].to_vec();
        packet[46..48].fill(0); // as a link rebuilds received headers
        let mut out = vec![0u8; network_frame_len(&packet).unwrap()];
        network_frame(&mut out, [4; 6], [2; 6], &packet, false).unwrap();
        assert_eq!(&out[14..], &wire[14..], "checksum restored, ICRC kept");
        // Between two local QPs: neither the ICRC nor the checksum was ever computed.
        let n = packet.len();
        packet[n - 4..].fill(0);
        network_frame(&mut out, [4; 6], [2; 6], &packet, true).unwrap();
        assert_eq!(
            &out[14..],
            &wire[14..],
            "sealed, then checksummed over the ICRC"
        );
    }

    #[test]
    fn an_engine_packet_gets_its_icrc() {
        let ip_packet = engine_ipv4_packet();
        let mac = guid_mac(0x0211_22ff_fe33_4455);
        let out = network_frame_vec(mac, &ip_packet, true).unwrap();
        assert_eq!(&out[..6], &[0x00, 0x11, 0x22, 0x33, 0x44, 0x55]);
        let parsed = FrameRepr::parse_ethernet(&out, out.len()).unwrap();
        assert_eq!(parsed.icrc, IcrcStatus::Ok);
        let c = u16::from_be_bytes([out[14 + 26], out[14 + 27]]);
        assert_eq!(c, 0, "IPv4: no UDP checksum, as rxe sends");
        assert_eq!(
            &out[14 + 28..out.len() - 4],
            &ip_packet[28..ip_packet.len() - 4]
        );
        // Unsealed, the ICRC stays as it was.
        let plain = network_frame_vec(mac, &ip_packet, false).unwrap();
        assert_eq!(&plain[plain.len() - 4..], &[0, 0, 0, 0]);
        assert!(network_frame_vec(mac, &ip_packet[..30], true).is_none());
        let mut short = vec![0u8; out.len() - 1];
        assert!(network_frame(&mut short, mac, mac, &ip_packet, true).is_none());
    }

    #[test]
    fn a_frame_completed_in_place_is_the_copied_one() {
        let v4 = engine_ipv4_packet();
        let mut v6 = ipv6_wire_frame()[14..].to_vec();
        let n = v6.len();
        v6[46..48].fill(0);
        v6[n - 4..].fill(0);
        let mac = guid_mac(0x0211_22ff_fe33_4455);
        for packet in [v4, v6] {
            // Sealed by its engine, then completed where it lies.
            let mut sealed = packet.clone();
            seal(&mut sealed).unwrap();
            let mut in_place = vec![0xeeu8; 14];
            in_place.extend_from_slice(&sealed);
            complete_in_place(&mut in_place, mac, mac).unwrap();
            assert_eq!(in_place, network_frame_vec(mac, &packet, true).unwrap());
        }
        let mut short = vec![0u8; 14 + 30];
        assert!(complete_in_place(&mut short, mac, mac).is_none());
    }

    #[test]
    fn a_roce_v1_packet_gets_its_icrc() {
        let b = PacketBuilder::new("::1".parse().unwrap(), "::1".parse().unwrap(), 0xc000);
        let transport = transport_packet(&b, 0);
        let mut packet = vec![0u8; 40];
        packet[0] = 0x60;
        packet[4..6].copy_from_slice(&(transport.len() as u16).to_be_bytes());
        packet[6] = 0x1b; // next header: BTH
        packet[7] = 64;
        packet[23] = 1;
        packet[39] = 2;
        packet.extend_from_slice(&transport);
        let n = packet.len();
        packet[n - 4..].fill(0);
        let want = proto::wire::icrc::v1(&packet[..40], &packet[40..n - 4]);
        let out = network_frame_vec([2; 6], &packet, true).unwrap();
        assert_eq!(u16::from_be_bytes([out[12], out[13]]), 0x8915);
        assert_eq!(&out[14..out.len() - 4], &packet[..n - 4]);
        assert_eq!(&out[out.len() - 4..], &want.to_le_bytes());
        let mut in_place = vec![0u8; 14];
        in_place.extend_from_slice(&packet);
        seal(&mut in_place[14..]).unwrap();
        complete_in_place(&mut in_place, [2; 6], [2; 6]).unwrap();
        assert_eq!(in_place, out);
    }
}
