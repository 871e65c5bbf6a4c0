//! IPv6 neighbour discovery (RFC 4861 §4.3, §4.4): neighbour solicitations and
//! advertisements with their link-layer address options, inside ICMPv6 (RFC 4443) with its
//! checksum over the IPv6 pseudo-header. What the L2 device needs to answer for its own
//! addresses and to resolve its peers'; other ICMPv6 messages are refused as unsupported.

use super::ethernet::EthernetAddress;
use super::{be, check_len, Error, Result};
use core::net::Ipv6Addr;

/// IPv6 next header of ICMPv6.
pub const NEXT_HEADER_ICMPV6: u8 = 58;
/// Neighbour discovery messages are sent, and accepted, only with hop limit 255 (RFC 4861
/// §7.1.1: proof that they were not forwarded by a router).
pub const HOP_LIMIT: u8 = 255;

const TYPE_NEIGHBOR_SOLICIT: u8 = 135;
const TYPE_NEIGHBOR_ADVERT: u8 = 136;
const OPT_SOURCE_LLADDR: u8 = 1;
const OPT_TARGET_LLADDR: u8 = 2;
/// Type, code, checksum, 4 bytes of flags/reserved, the 16-byte target.
const FIXED_LEN: usize = 24;
/// One link-layer address option for Ethernet: type, length (in 8-byte units), address.
const LLADDR_OPT_LEN: usize = 8;

const FLAG_ROUTER: u32 = 1 << 31;
const FLAG_SOLICITED: u32 = 1 << 30;
const FLAG_OVERRIDE: u32 = 1 << 29;

/// A zero-copy view of an ICMPv6 neighbour discovery message (the IPv6 payload).
#[derive(Debug, Clone)]
pub struct NdiscPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> NdiscPacket<T> {
    pub fn new_unchecked(buffer: T) -> Self {
        NdiscPacket { buffer }
    }

    /// Checks that the fixed part of a solicitation or advertisement is present.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        check_len("ICMPv6 neighbour discovery", p.buffer.as_ref(), FIXED_LEN)?;
        Ok(p)
    }

    pub fn msg_type(&self) -> u8 {
        self.buffer.as_ref()[0]
    }
    pub fn code(&self) -> u8 {
        self.buffer.as_ref()[1]
    }
    pub fn checksum(&self) -> u16 {
        be::u16_at(self.buffer.as_ref(), 2)
    }
    fn flags(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), 4)
    }
    pub fn target_addr(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buffer.as_ref()[8..24]);
        Ipv6Addr::from(a)
    }
    /// True when the ICMPv6 checksum over the pseudo-header of `src` → `dst` is right.
    pub fn verify_checksum(&self, src: &Ipv6Addr, dst: &Ipv6Addr) -> bool {
        checksum(src, dst, self.buffer.as_ref()) == 0
    }
    /// The link-layer address option of `kind` (the first one), checking every option's
    /// length on the way (RFC 4861 §4.6: a zero length invalidates the message).
    fn lladdr_option(&self, kind: u8) -> Result<Option<EthernetAddress>> {
        let mut rest = &self.buffer.as_ref()[FIXED_LEN..];
        let mut found = None;
        while !rest.is_empty() {
            check_len("ND option", rest, 2)?;
            let len = usize::from(rest[1]) * 8;
            if len == 0 {
                return Err(Error::Malformed("ND option of length 0"));
            }
            check_len("ND option", rest, len)?;
            if rest[0] == kind && found.is_none() && len >= LLADDR_OPT_LEN {
                let mut a = [0u8; 6];
                a.copy_from_slice(&rest[2..8]);
                found = Some(EthernetAddress(a));
            }
            rest = &rest[len..];
        }
        Ok(found)
    }
}

/// The ICMPv6 checksum (RFC 4443 §2.3) of `message` sent from `src` to `dst`: 0 when the
/// message carries a right one.
pub fn checksum(src: &Ipv6Addr, dst: &Ipv6Addr, message: &[u8]) -> u16 {
    super::ipv6::pseudo_header_checksum(src, dst, NEXT_HEADER_ICMPV6, message)
}

/// The flags of a neighbour advertisement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AdvertFlags {
    pub router: bool,
    pub solicited: bool,
    pub override_: bool,
}

/// A neighbour solicitation or advertisement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NdiscRepr {
    NeighborSolicit {
        target: Ipv6Addr,
        /// Absent in duplicate address detection (sent from `::`).
        source_lladdr: Option<EthernetAddress>,
    },
    NeighborAdvert {
        flags: AdvertFlags,
        target: Ipv6Addr,
        target_lladdr: Option<EthernetAddress>,
    },
}

impl NdiscRepr {
    /// Parses and validates (checksum over `src` → `dst`, code 0, a unicast target, the
    /// options) the ICMPv6 message of a packet that arrived with hop limit `hop_limit`.
    pub fn parse<T: AsRef<[u8]>>(
        p: &NdiscPacket<T>,
        src: &Ipv6Addr,
        dst: &Ipv6Addr,
        hop_limit: u8,
    ) -> Result<NdiscRepr> {
        if !matches!(p.msg_type(), TYPE_NEIGHBOR_SOLICIT | TYPE_NEIGHBOR_ADVERT) {
            return Err(Error::Unsupported("ICMPv6 other than neighbour discovery"));
        }
        if hop_limit != HOP_LIMIT || p.code() != 0 {
            return Err(Error::Malformed("ND hop limit or code"));
        }
        if !p.verify_checksum(src, dst) {
            return Err(Error::BadChecksum("ICMPv6"));
        }
        let target = p.target_addr();
        if target.is_multicast() {
            return Err(Error::Malformed("ND target is multicast"));
        }
        Ok(match p.msg_type() {
            TYPE_NEIGHBOR_SOLICIT => NdiscRepr::NeighborSolicit {
                target,
                source_lladdr: p.lladdr_option(OPT_SOURCE_LLADDR)?,
            },
            _ => {
                let f = p.flags();
                NdiscRepr::NeighborAdvert {
                    flags: AdvertFlags {
                        router: f & FLAG_ROUTER != 0,
                        solicited: f & FLAG_SOLICITED != 0,
                        override_: f & FLAG_OVERRIDE != 0,
                    },
                    target,
                    target_lladdr: p.lladdr_option(OPT_TARGET_LLADDR)?,
                }
            }
        })
    }

    pub fn buffer_len(&self) -> usize {
        let lladdr = match self {
            NdiscRepr::NeighborSolicit { source_lladdr, .. } => source_lladdr.is_some(),
            NdiscRepr::NeighborAdvert { target_lladdr, .. } => target_lladdr.is_some(),
        };
        FIXED_LEN + if lladdr { LLADDR_OPT_LEN } else { 0 }
    }

    /// Writes the message, with its checksum for `src` → `dst`, into `buf[..buffer_len()]`.
    pub fn emit(&self, src: &Ipv6Addr, dst: &Ipv6Addr, buf: &mut [u8]) {
        let len = self.buffer_len();
        let b = &mut buf[..len];
        b.fill(0);
        let (ty, flags, target, opt) = match *self {
            NdiscRepr::NeighborSolicit {
                target,
                source_lladdr,
            } => (
                TYPE_NEIGHBOR_SOLICIT,
                0,
                target,
                source_lladdr.map(|a| (OPT_SOURCE_LLADDR, a)),
            ),
            NdiscRepr::NeighborAdvert {
                flags,
                target,
                target_lladdr,
            } => {
                let mut f = 0;
                if flags.router {
                    f |= FLAG_ROUTER;
                }
                if flags.solicited {
                    f |= FLAG_SOLICITED;
                }
                if flags.override_ {
                    f |= FLAG_OVERRIDE;
                }
                (
                    TYPE_NEIGHBOR_ADVERT,
                    f,
                    target,
                    target_lladdr.map(|a| (OPT_TARGET_LLADDR, a)),
                )
            }
        };
        b[0] = ty;
        be::put_u32(b, 4, flags);
        b[8..24].copy_from_slice(&target.octets());
        if let Some((kind, addr)) = opt {
            b[24] = kind;
            b[25] = 1;
            b[26..32].copy_from_slice(&addr.0);
        }
        let sum = checksum(src, dst, b);
        be::put_u16(b, 2, sum);
    }
}

/// The solicited-node multicast address of `addr` (RFC 4291 §2.7.1): `ff02::1:ffXX:XXXX`
/// with the low 24 bits of `addr`.
pub fn solicited_node(addr: &Ipv6Addr) -> Ipv6Addr {
    let o = addr.octets();
    Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(o[13]),
        u16::from_be_bytes([o[14], o[15]]),
    )
}

/// The Ethernet address an IPv6 multicast address maps to (RFC 2464 §7): `33:33` and its
/// low 32 bits.
pub fn multicast_mac(addr: &Ipv6Addr) -> EthernetAddress {
    let o = addr.octets();
    EthernetAddress([0x33, 0x33, o[12], o[13], o[14], o[15]])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A neighbour solicitation for fd00::2 from fd00::1 (02:00:00:00:00:01), the ICMPv6
    /// message with its checksum computed independently (Python, RFC 1071 over the
    /// pseudo-header).
    const NS: [u8; 32] = [
        0x87, 0x00, 0x7d, 0x97, 0, 0, 0, 0, 0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 1,
        1, 2, 0, 0, 0, 0, 1,
    ];

    fn addrs() -> (Ipv6Addr, Ipv6Addr) {
        let src: Ipv6Addr = "fd00::1".parse().unwrap();
        (src, solicited_node(&"fd00::2".parse().unwrap()))
    }

    #[test]
    fn solicitation_parses_and_round_trips() {
        let (src, dst) = addrs();
        assert_eq!(dst, "ff02::1:ff00:2".parse::<Ipv6Addr>().unwrap());
        let repr = NdiscRepr::NeighborSolicit {
            target: "fd00::2".parse().unwrap(),
            source_lladdr: Some(EthernetAddress([2, 0, 0, 0, 0, 1])),
        };
        let mut buf = [0u8; 32];
        repr.emit(&src, &dst, &mut buf);
        let p = NdiscPacket::new_checked(&buf[..]).unwrap();
        assert_eq!(NdiscRepr::parse(&p, &src, &dst, 255).unwrap(), repr);
        // The checksum is the one a pseudo-header sum by hand gives.
        assert_eq!(buf, NS);
        // Forwarded (hop limit below 255), a bad checksum, or a zero-length option: refused.
        assert!(NdiscRepr::parse(&p, &src, &dst, 64).is_err());
        let mut bad = buf;
        bad[20] ^= 1;
        let p = NdiscPacket::new_checked(&bad[..]).unwrap();
        assert_eq!(
            NdiscRepr::parse(&p, &src, &dst, 255),
            Err(Error::BadChecksum("ICMPv6"))
        );
        let mut zero = buf;
        zero[25] = 0;
        let sum = checksum(&src, &dst, &{
            let mut z = zero;
            z[2] = 0;
            z[3] = 0;
            z
        });
        zero[2..4].copy_from_slice(&sum.to_be_bytes());
        let p = NdiscPacket::new_checked(&zero[..]).unwrap();
        assert!(NdiscRepr::parse(&p, &src, &dst, 255).is_err());
    }

    #[test]
    fn advertisement_round_trips_with_its_flags() {
        let (src, dst) = ("fd00::2".parse().unwrap(), "fd00::1".parse().unwrap());
        let repr = NdiscRepr::NeighborAdvert {
            flags: AdvertFlags {
                router: false,
                solicited: true,
                override_: true,
            },
            target: "fd00::2".parse().unwrap(),
            target_lladdr: Some(EthernetAddress([2, 0, 0, 0, 0, 2])),
        };
        let mut buf = [0u8; 32];
        repr.emit(&src, &dst, &mut buf);
        assert_eq!(buf[4], 0x60);
        let p = NdiscPacket::new_checked(&buf[..]).unwrap();
        assert_eq!(NdiscRepr::parse(&p, &src, &dst, 255).unwrap(), repr);
        assert!(NdiscPacket::new_checked(&buf[..23]).is_err());
    }

    #[test]
    fn multicast_mapping() {
        let a: Ipv6Addr = "fe80::1234:56ff:fe78:9abc".parse().unwrap();
        let sn = solicited_node(&a);
        assert_eq!(sn, "ff02::1:ff78:9abc".parse::<Ipv6Addr>().unwrap());
        assert_eq!(
            multicast_mac(&sn),
            EthernetAddress([0x33, 0x33, 0xff, 0x78, 0x9a, 0xbc])
        );
    }
}
