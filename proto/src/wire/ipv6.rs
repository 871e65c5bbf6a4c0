//! IPv6 headers (RFC 8200) and the RoCE v1 Global Route Header, which has the same layout
//! (IBTA Vol. 1 §8.3; Annex A16).

use super::{be, check_len, Error, Result};
use core::net::Ipv6Addr;

mod field {
    pub const VER_TC_FL: usize = 0;
    pub const PAYLOAD_LEN: usize = 4;
    pub const NEXT_HEADER: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC: core::ops::Range<usize> = 8..24;
    pub const DST: core::ops::Range<usize> = 24..40;
}

pub const HEADER_LEN: usize = 40;
pub const NEXT_HEADER_UDP: u8 = 17;

/// A zero-copy view of an IPv6 packet or a GRH-headed RoCE v1 packet.
#[derive(Debug, Clone)]
pub struct Ipv6Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    pub fn new_unchecked(buffer: T) -> Self {
        Ipv6Packet { buffer }
    }

    /// Checks the header and that the payload length fits the buffer.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_checked_header(buffer)?;
        let have = p.buffer.as_ref().len();
        let total = HEADER_LEN + p.payload_len() as usize;
        if total > have {
            return Err(Error::Truncated {
                layer: "IPv6 packet",
                need: total,
                have,
            });
        }
        Ok(p)
    }

    /// Checks only the fixed header: for captures cut short by a snaplen.
    pub fn new_checked_header(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        check_len("IPv6 header", p.buffer.as_ref(), HEADER_LEN)?;
        if p.version() != 6 {
            return Err(Error::BadVersion {
                layer: "IPv6/GRH",
                version: p.version(),
            });
        }
        Ok(p)
    }

    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_TC_FL] >> 4
    }
    pub fn traffic_class(&self) -> u8 {
        (be::u16_at(self.buffer.as_ref(), 0) >> 4) as u8
    }
    pub fn flow_label(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), 0) & 0x000f_ffff
    }
    pub fn payload_len(&self) -> u16 {
        be::u16_at(self.buffer.as_ref(), field::PAYLOAD_LEN)
    }
    pub fn next_header(&self) -> u8 {
        self.buffer.as_ref()[field::NEXT_HEADER]
    }
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_LIMIT]
    }
    pub fn src_addr(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buffer.as_ref()[field::SRC]);
        Ipv6Addr::from(a)
    }
    pub fn dst_addr(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buffer.as_ref()[field::DST]);
        Ipv6Addr::from(a)
    }
    /// The bytes after the header, up to the payload length (or the end of a short capture).
    pub fn payload(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        let end = (HEADER_LEN + self.payload_len() as usize).min(b.len());
        &b[HEADER_LEN..end]
    }
}

/// The checksum of an upper-layer message (UDP, ICMPv6) over the IPv6 pseudo-header of `src`
/// → `dst` (RFC 8200 §8.1): 0 when `message` carries a right one. A UDP sender that gets 0
/// sends 0xffff (0 means "no checksum", which IPv6 does not allow).
pub fn pseudo_header_checksum(
    src: &Ipv6Addr,
    dst: &Ipv6Addr,
    next_header: u8,
    message: &[u8],
) -> u16 {
    let mut pseudo = [0u8; 40];
    pseudo[..16].copy_from_slice(&src.octets());
    pseudo[16..32].copy_from_slice(&dst.octets());
    pseudo[32..36].copy_from_slice(&(message.len() as u32).to_be_bytes());
    pseudo[39] = next_header;
    // The one's-complement sum of the two parts is the complement of the sum of their
    // complements (the pseudo-header has an even length).
    let a = !super::ipv4::header_checksum(&pseudo);
    let b = !super::ipv4::header_checksum(message);
    let mut sum = u32::from(a) + u32::from(b);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

/// An IPv6 header without extension headers, or a GRH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Repr {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub traffic_class: u8,
    /// rxe always sends 0 here on RoCE v2 (the label only feeds the UDP source port).
    pub flow_label: u32,
    pub next_header: u8,
    pub hop_limit: u8,
    /// Bytes after this header. For a GRH: up to and including the ICRC.
    pub payload_len: usize,
}

impl Ipv6Repr {
    pub fn parse<T: AsRef<[u8]>>(p: &Ipv6Packet<T>) -> Result<Ipv6Repr> {
        Ok(Ipv6Repr {
            src: p.src_addr(),
            dst: p.dst_addr(),
            traffic_class: p.traffic_class(),
            flow_label: p.flow_label(),
            next_header: p.next_header(),
            hop_limit: p.hop_limit(),
            payload_len: p.payload_len() as usize,
        })
    }

    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    pub fn emit(&self, buf: &mut [u8]) {
        let b = &mut buf[..HEADER_LEN];
        let word0 =
            (6u32 << 28) | ((self.traffic_class as u32) << 20) | (self.flow_label & 0xfffff);
        be::put_u32(b, field::VER_TC_FL, word0);
        be::put_u16(b, field::PAYLOAD_LEN, self.payload_len as u16);
        b[field::NEXT_HEADER] = self.next_header;
        b[field::HOP_LIMIT] = self.hop_limit;
        b[field::SRC].copy_from_slice(&self.src.octets());
        b[field::DST].copy_from_slice(&self.dst.octets());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let repr = Ipv6Repr {
            src: "fe80::1".parse().unwrap(),
            dst: "fe80::2".parse().unwrap(),
            traffic_class: 0xa5,
            flow_label: 0x12345,
            next_header: NEXT_HEADER_UDP,
            hop_limit: 64,
            payload_len: 8,
        };
        let mut buf = [0u8; 48];
        repr.emit(&mut buf);
        let p = Ipv6Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(Ipv6Repr::parse(&p).unwrap(), repr);
        assert!(Ipv6Packet::new_checked(&buf[..47]).is_err());
        buf[0] = 0x45;
        assert!(Ipv6Packet::new_checked(&buf[..]).is_err());
    }
}
