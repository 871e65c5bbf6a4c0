//! Building outgoing RoCE v2 packets whose ICRC matches the IP header the kernel will send.
//!
//! softroce hands the kernel only the UDP payload (BTH..ICRC); the kernel writes the IP and
//! UDP headers. The ICRC covers the IP addresses, lengths, flags and — for IPv4 — the
//! Identification (facts §3.1, §3.5), so the builder must predict them:
//! - IPv4: DF set, and Identification 0, because softroce sends on *unconnected* sockets with
//!   IP_PMTUDISC_DO (the kernel's `ip_select_ident_segs` then writes 0; a connected socket
//!   would use a per-socket counter). With UDP GSO the kernel's segmentation numbers the
//!   segments 0, 1, 2, ... (checked with captures on a loopback limited to one segment per
//!   skb), so segment `k` is built with Identification `k`.
//! - IPv6: flow label 0 (IPV6_AUTOFLOWLABEL off), though the ICRC masks it anyway.
//!
//! TOS/traffic class, TTL/hop limit and the UDP checksum are masked by the ICRC, so they do
//! not enter here; they are sent as control messages.

use proto::wire::{
    self, icrc, FrameRepr, Ipv4Repr, Ipv6Repr, LinkRepr, NetRepr, TransportRepr, UdpRepr,
    ROCE_V2_PORT,
};
use std::net::IpAddr;

/// The outer headers of a flow: everything about a packet except its transport part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketBuilder {
    pub local: IpAddr,
    pub remote: IpAddr,
    /// UDP source port (rxe derives it from the QPNs and flow label, facts §1.3).
    pub src_port: u16,
    /// UDP destination port: 4791 except in tests.
    pub dst_port: u16,
    /// IPv4 TOS / IPv6 traffic class to put on the wire (not covered by the ICRC).
    pub tos: u8,
    /// IPv4 TTL / IPv6 hop limit to put on the wire (not covered by the ICRC).
    pub ttl: u8,
}

impl PacketBuilder {
    /// A flow from `local` to `remote` on port 4791, TOS 0, TTL 64.
    pub fn new(local: IpAddr, remote: IpAddr, src_port: u16) -> PacketBuilder {
        PacketBuilder {
            local,
            remote,
            src_port,
            dst_port: ROCE_V2_PORT,
            tos: 0,
            ttl: 64,
        }
    }

    /// The whole packet as the kernel will put it on the wire, for a transport packet of
    /// `repr` sent as the IPv4 segment numbered `ident` (0 unless sent with GSO).
    pub fn frame_repr(&self, ident: u16, repr: &TransportRepr) -> wire::Result<FrameRepr> {
        let net = match (self.local, self.remote) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => NetRepr::Ipv4(Ipv4Repr {
                src,
                dst,
                tos: self.tos,
                ident,
                dont_frag: true,
                ttl: self.ttl,
                protocol: wire::ipv4::PROTOCOL_UDP,
                payload_len: 0,
            }),
            (IpAddr::V6(src), IpAddr::V6(dst)) => NetRepr::Ipv6(Ipv6Repr {
                src,
                dst,
                traffic_class: self.tos,
                flow_label: 0,
                next_header: wire::ipv6::NEXT_HEADER_UDP,
                hop_limit: self.ttl,
                payload_len: 0,
            }),
            _ => {
                return Err(wire::Error::Unsupported(
                    "local and remote of different IP versions",
                ))
            }
        };
        let mut frame = FrameRepr {
            link: LinkRepr::None,
            net,
            udp: Some(UdpRepr {
                src_port: self.src_port,
                dst_port: self.dst_port,
                checksum: 0,
                payload_len: 0,
            }),
            transport: *repr,
        };
        frame.fill_lengths();
        Ok(frame)
    }

    /// Writes the UDP payload (BTH..ICRC) of `repr` with `payload` into `out` and returns its
    /// length. `ident` is the IPv4 Identification the packet will carry: 0 for a packet sent
    /// alone, `k` for the `k`-th segment of a GSO send; ignored for IPv6.
    pub fn emit(
        &self,
        ident: u16,
        repr: &TransportRepr,
        payload: &[u8],
        out: &mut [u8],
    ) -> wire::Result<usize> {
        let len = repr.buffer_len();
        let have = out.len();
        let out = out.get_mut(..len).ok_or(wire::Error::Truncated {
            layer: "output buffer",
            need: len,
            have,
        })?;
        repr.emit(out, payload)?;
        self.seal(ident, out)?;
        Ok(len)
    }

    /// Recomputes the ICRC of a whole transport packet (BTH..ICRC) in place, for the IPv4
    /// Identification `ident`.
    pub fn seal(&self, ident: u16, packet: &mut [u8]) -> wire::Result<()> {
        let len = packet.len();
        if len < wire::bth::HEADER_LEN + wire::ICRC_LEN {
            return Err(wire::Error::Truncated {
                layer: "transport packet",
                need: wire::bth::HEADER_LEN + wire::ICRC_LEN,
                have: len,
            });
        }
        let crc = self.icrc(ident, &packet[..len - wire::ICRC_LEN])?;
        packet[len - wire::ICRC_LEN..].copy_from_slice(&crc.to_le_bytes());
        Ok(())
    }

    /// Copies a whole transport packet (BTH..ICRC) into `out` (its length) and seals the
    /// copy for the IPv4 Identification `ident`: [`PacketBuilder::seal`] computed by the pass
    /// that copies (the fused kernel of `icrc::v2_copying_payload`), where a copy and then a
    /// seal went over the bytes twice.
    pub fn seal_copying(&self, ident: u16, packet: &[u8], out: &mut [u8]) -> wire::Result<()> {
        let len = packet.len();
        let need = wire::bth::HEADER_LEN + wire::ICRC_LEN;
        if len < need || out.len() != len {
            return Err(wire::Error::Truncated {
                layer: "transport packet",
                need: need.max(len),
                have: len.min(out.len()),
            });
        }
        let covered_end = len - wire::ICRC_LEN;
        let (bth, rest) = packet[..covered_end].split_at(wire::bth::HEADER_LEN);
        let (ip, udp) = self.headers(ident, len)?;
        out[..wire::bth::HEADER_LEN].copy_from_slice(bth);
        let crc = icrc::v2_copying_payload(
            ip.as_slice(),
            &udp,
            bth,
            rest,
            &mut out[wire::bth::HEADER_LEN..covered_end],
        );
        out[covered_end..].copy_from_slice(&crc.to_le_bytes());
        Ok(())
    }

    /// The IP header (as far as the ICRC sees it) and UDP header of a datagram of
    /// `transport_len` bytes (BTH..ICRC) in this flow, with Identification `ident`.
    fn headers(&self, ident: u16, transport_len: usize) -> wire::Result<(IpHeader, [u8; 8])> {
        let udp_len = wire::udp::HEADER_LEN + transport_len;
        if udp_len > u16::MAX as usize {
            return Err(wire::Error::Unsupported("datagram longer than 65535 bytes"));
        }
        let mut udp = [0u8; wire::udp::HEADER_LEN];
        UdpRepr {
            src_port: self.src_port,
            dst_port: self.dst_port,
            checksum: 0,
            payload_len: transport_len,
        }
        .emit(&mut udp);
        match (self.local, self.remote) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => {
                let mut ip = [0u8; wire::ipv4::HEADER_LEN];
                ipv4_header(src, dst, ident, true, udp_len, &mut ip);
                Ok((IpHeader::V4(ip), udp))
            }
            (IpAddr::V6(src), IpAddr::V6(dst)) => {
                let mut ip = [0u8; wire::ipv6::HEADER_LEN];
                ipv6_header(src, dst, udp_len, &mut ip);
                Ok((IpHeader::V6(ip), udp))
            }
            _ => Err(wire::Error::Unsupported(
                "local and remote of different IP versions",
            )),
        }
    }

    /// The ICRC of `covered` (BTH through pad) sent in this flow with Identification `ident`.
    pub fn icrc(&self, ident: u16, covered: &[u8]) -> wire::Result<u32> {
        let (ip, udp) = self.headers(ident, covered.len() + wire::ICRC_LEN)?;
        Ok(match ip {
            IpHeader::V4(ip) => icrc::v2_ipv4(&ip, &udp, covered),
            IpHeader::V6(ip) => icrc::v2_ipv6(&ip, &udp, covered),
        })
    }
}

/// An IPv4 or IPv6 header, on the stack.
enum IpHeader {
    V4([u8; wire::ipv4::HEADER_LEN]),
    V6([u8; wire::ipv6::HEADER_LEN]),
}

impl IpHeader {
    fn as_slice(&self) -> &[u8] {
        match self {
            IpHeader::V4(h) => h,
            IpHeader::V6(h) => h,
        }
    }
}

/// An IPv4 header as the kernel writes it for a UDP datagram of `udp_len` bytes; TOS, TTL and
/// checksum are left for the ICRC mask.
pub(crate) fn ipv4_header(
    src: std::net::Ipv4Addr,
    dst: std::net::Ipv4Addr,
    ident: u16,
    dont_frag: bool,
    udp_len: usize,
    out: &mut [u8; wire::ipv4::HEADER_LEN],
) {
    Ipv4Repr {
        src,
        dst,
        tos: 0,
        ident,
        dont_frag,
        ttl: 0,
        protocol: wire::ipv4::PROTOCOL_UDP,
        payload_len: udp_len,
    }
    .emit(out);
}

/// An IPv6 header for a UDP datagram of `udp_len` bytes; traffic class, flow label and hop
/// limit are left for the ICRC mask.
pub(crate) fn ipv6_header(
    src: std::net::Ipv6Addr,
    dst: std::net::Ipv6Addr,
    udp_len: usize,
    out: &mut [u8; wire::ipv6::HEADER_LEN],
) {
    Ipv6Repr {
        src,
        dst,
        traffic_class: 0,
        flow_label: 0,
        next_header: wire::ipv6::NEXT_HEADER_UDP,
        hop_limit: 0,
        payload_len: udp_len,
    }
    .emit(out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::wire::{BthRepr, Opcode};
    use proto::{Psn, Qpn};

    fn send_only_hello() -> TransportRepr {
        let mut t = TransportRepr::new(BthRepr {
            opcode: Opcode(0x04),
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
    fn worked_example_of_facts_3_3() {
        // 192.168.1.10 -> .20, sport 0xC132, RC SEND_ONLY "hello", ID 0: ICRC 63 e4 83 9a.
        let b = PacketBuilder::new(
            "192.168.1.10".parse().unwrap(),
            "192.168.1.20".parse().unwrap(),
            0xc132,
        );
        let mut out = [0u8; 64];
        let n = b.emit(0, &send_only_hello(), b"hello", &mut out).unwrap();
        assert_eq!(n, 24);
        assert_eq!(&out[20..24], &[0x63, 0xe4, 0x83, 0x9a]);

        // The same over IPv6 fe80::1 -> fe80::2: 02 e7 ea c3.
        let b6 = PacketBuilder::new(
            "fe80::1".parse().unwrap(),
            "fe80::2".parse().unwrap(),
            0xc132,
        );
        let n = b6.emit(0, &send_only_hello(), b"hello", &mut out).unwrap();
        assert_eq!(&out[n - 4..n], &[0x02, 0xe7, 0xea, 0xc3]);
    }

    #[test]
    fn matches_a_whole_frame_emitted_by_the_wire_layer() {
        let b = PacketBuilder::new(
            "127.0.0.1".parse().unwrap(),
            "127.0.0.2".parse().unwrap(),
            0xd000,
        );
        let repr = send_only_hello();
        for ident in [0u16, 1, 7, 0xbeef] {
            let frame = b.frame_repr(ident, &repr).unwrap();
            let mut whole = vec![0u8; frame.buffer_len()];
            frame.emit(&mut whole, b"hello").unwrap();
            let mut udp_payload = [0u8; 24];
            b.emit(ident, &repr, b"hello", &mut udp_payload).unwrap();
            assert_eq!(&whole[28..], &udp_payload[..]);
            let parsed = FrameRepr::parse_ip(&whole, whole.len()).unwrap();
            assert!(parsed.verified().is_ok());
        }
    }

    #[test]
    fn refuses_mixed_families_and_short_buffers() {
        let b = PacketBuilder::new("127.0.0.1".parse().unwrap(), "::1".parse().unwrap(), 1);
        let mut out = [0u8; 64];
        assert!(b.emit(0, &send_only_hello(), b"hello", &mut out).is_err());
        let b = PacketBuilder::new("::1".parse().unwrap(), "::1".parse().unwrap(), 1);
        assert!(b
            .emit(0, &send_only_hello(), b"hello", &mut out[..10])
            .is_err());
        assert!(b.seal(0, &mut out[..8]).is_err());
    }

    /// The copy sealed by the pass that copies is the packet a copy and then a seal give,
    /// for both IP versions, every GSO segment's Identification, any length and extended
    /// headers (a WRITE's RETH) alike; a short packet or a wrong output length is refused.
    #[test]
    fn seal_copying_is_a_copy_then_a_seal() {
        let flows = [("192.168.1.10", "192.168.1.20"), ("fd00::1", "fd00::2")];
        for (src, dst) in flows {
            let b = PacketBuilder::new(src.parse().unwrap(), dst.parse().unwrap(), 0xc132);
            for len in [16, 17, 24, 28 + 13, 300, 1024 + 28 + 4, 4096 + 12 + 4] {
                let packet: Vec<u8> = (0..len).map(|i| (i * 31 + 7) as u8).collect();
                for ident in [0u16, 1, 43] {
                    let mut want = packet.clone();
                    b.seal(ident, &mut want).unwrap();
                    let mut got = vec![0u8; len];
                    b.seal_copying(ident, &packet, &mut got).unwrap();
                    assert_eq!(got, want, "{src} len {len} ident {ident}");
                }
            }
            let mut out = [0u8; 15];
            assert!(
                b.seal_copying(0, &[0u8; 15], &mut out).is_err(),
                "shorter than a BTH + ICRC"
            );
            let mut out = [0u8; 40];
            assert!(
                b.seal_copying(0, &[0u8; 41], &mut out).is_err(),
                "output of another length"
            );
        }
    }
}
