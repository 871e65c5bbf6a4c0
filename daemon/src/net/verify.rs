//! ICRC verification of datagrams received on a plain UDP socket.
//!
//! The socket hands over the UDP payload, the source address and (through IP_PKTINFO /
//! IPV6_PKTINFO) the destination address, never the IP header. What the ICRC covers of that
//! header is rebuilt:
//! - IPv6: version, payload length, next header and addresses; the rest is masked. Nothing is
//!   missing.
//! - IPv4: total length, flags, protocol and addresses are known (DF is assumed, as rxe and
//!   every RoCE NIC set it; DF clear is tried as a fallback), but the Identification is not:
//!   kernel rxe sends a varying non-zero one (facts §3.5). It is solved for from the carried
//!   ICRC by the CRC's linearity ([`IdentSolver`]), which leaves 16 bits of the check's
//!   strength; a corrupted packet passes with probability 2^-16.

use super::build::{ipv4_header, ipv6_header};
use proto::wire::{self, icrc, icrc::IdentSolver, RocePacket};
use std::net::{IpAddr, SocketAddr};

/// No RoCE packet is longer: a 4096-byte path MTU payload, the largest header set (BTH and
/// AtomicETH, 40 bytes) and the ICRC, with room to spare. Longer datagrams are rejected
/// before the ident solver builds (and caches) tables for their length.
pub const MAX_ROCE_PACKET: usize = 4096 + 64;

/// The verdict on one received datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxVerdict {
    /// The ICRC is right. For IPv4, the Identification that explains it (0 for softroce's own
    /// unsegmented sends) and whether DF was set; `None` for IPv6.
    Good { ipv4: Option<Ipv4Ident> },
    /// A well-formed transport packet whose ICRC nothing explains: rxe drops these silently.
    BadIcrc,
    /// Not a RoCE transport packet (unknown opcode, bad lengths or pad).
    Malformed(wire::Error),
}

/// What ident recovery found about an IPv4 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Ident {
    pub ident: u16,
    pub dont_frag: bool,
}

/// Verifies received datagrams; keeps the per-length tables of the ident solver.
#[derive(Debug, Default)]
pub struct RxVerifier {
    solver: IdentSolver,
}

impl RxVerifier {
    pub fn new() -> Self {
        Self::default()
    }

    /// Verifies `datagram` (the UDP payload, BTH..ICRC) received from `src` on `dst`.
    pub fn verify(&mut self, src: SocketAddr, dst: SocketAddr, datagram: &[u8]) -> RxVerdict {
        if datagram.len() > MAX_ROCE_PACKET {
            return RxVerdict::Malformed(wire::Error::Unsupported(
                "datagram longer than any RoCE packet",
            ));
        }
        let packet = match RocePacket::new_checked(datagram) {
            Ok(p) => p,
            Err(e) => return RxVerdict::Malformed(e),
        };
        let udp_len = wire::udp::HEADER_LEN + datagram.len();
        let mut udp = [0u8; wire::udp::HEADER_LEN];
        wire::UdpRepr {
            src_port: src.port(),
            dst_port: dst.port(),
            checksum: 0,
            payload_len: datagram.len(),
        }
        .emit(&mut udp);
        let covered = packet.icrc_covered();
        let carried = packet.icrc();
        match (src.ip(), dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let mut ip = [0u8; wire::ipv4::HEADER_LEN];
                for dont_frag in [true, false] {
                    ipv4_header(s, d, 0, dont_frag, udp_len, &mut ip);
                    if let Some(ident) = self.solver.recover(&ip, &udp, covered, carried) {
                        return RxVerdict::Good {
                            ipv4: Some(Ipv4Ident { ident, dont_frag }),
                        };
                    }
                }
                RxVerdict::BadIcrc
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                let mut ip = [0u8; wire::ipv6::HEADER_LEN];
                ipv6_header(s, d, udp_len, &mut ip);
                if icrc::v2_ipv6(&ip, &udp, covered) == carried {
                    RxVerdict::Good { ipv4: None }
                } else {
                    RxVerdict::BadIcrc
                }
            }
            _ => RxVerdict::Malformed(wire::Error::Unsupported("mixed IPv4/IPv6 addresses")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::PacketBuilder;
    use proto::wire::{BthRepr, Opcode, TransportRepr};
    use proto::{Psn, Qpn};

    fn repr(len: usize) -> TransportRepr {
        let mut t = TransportRepr::new(BthRepr {
            opcode: Opcode::RC_SEND_ONLY,
            solicited: false,
            mig_req: false,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qpn: Qpn::new(17),
            ack_req: true,
            psn: Psn::new(5),
        });
        t.payload_len = len;
        t
    }

    #[test]
    fn good_bad_and_recovered_on_both_families() {
        let mut v = RxVerifier::new();
        for (l, r) in [("127.0.0.1", "127.0.0.2"), ("::1", "::2")] {
            let src = SocketAddr::new(l.parse().unwrap(), 49152);
            let dst = SocketAddr::new(r.parse().unwrap(), 4791);
            let mut b = PacketBuilder::new(src.ip(), dst.ip(), src.port());
            b.dst_port = dst.port();
            let payload: Vec<u8> = (0..1024u32).map(|i| i as u8).collect();
            let mut buf = vec![0u8; 2048];
            for ident in [0u16, 1, 0x4321] {
                let n = b.emit(ident, &repr(1024), &payload, &mut buf).unwrap();
                let want = if src.is_ipv4() {
                    RxVerdict::Good {
                        ipv4: Some(Ipv4Ident {
                            ident,
                            dont_frag: true,
                        }),
                    }
                } else {
                    RxVerdict::Good { ipv4: None }
                };
                assert_eq!(v.verify(src, dst, &buf[..n]), want);
                buf[100] ^= 0x10;
                assert_eq!(v.verify(src, dst, &buf[..n]), RxVerdict::BadIcrc);
                buf[100] ^= 0x10;
                // Another source address changes what the ICRC covers.
                let other: SocketAddr = if src.is_ipv4() {
                    "127.0.0.3:49152".parse().unwrap()
                } else {
                    "[::3]:49152".parse().unwrap()
                };
                assert_eq!(v.verify(other, dst, &buf[..n]), RxVerdict::BadIcrc);
            }
            assert!(matches!(
                v.verify(src, dst, &buf[..7]),
                RxVerdict::Malformed(_)
            ));
            let huge = vec![0u8; MAX_ROCE_PACKET + 1];
            assert!(matches!(v.verify(src, dst, &huge), RxVerdict::Malformed(_)));
        }
    }
}
