//! IPv4 headers, as RoCE v2 uses them (RFC 791; IBTA Annex A17).

use super::{be, check_len, Error, Result};
use core::net::Ipv4Addr;

mod field {
    pub const VER_IHL: usize = 0;
    pub const TOS: usize = 1;
    pub const LENGTH: usize = 2;
    pub const IDENT: usize = 4;
    pub const FLAGS_FRAG: usize = 6;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: usize = 10;
    pub const SRC: usize = 12;
    pub const DST: usize = 16;
}

pub const HEADER_LEN: usize = 20;
pub const PROTOCOL_UDP: u8 = 17;
const FLAG_DF: u16 = 0x4000;
const FLAG_MF: u16 = 0x2000;

/// A zero-copy view of an IPv4 packet.
#[derive(Debug, Clone)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    pub fn new_unchecked(buffer: T) -> Self {
        Ipv4Packet { buffer }
    }

    /// Checks the version, that the whole header is present, and that the total length is no
    /// longer than the buffer (a capture may hold less; see [`Ipv4Packet::new_checked_header`]).
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_checked_header(buffer)?;
        let have = p.buffer.as_ref().len();
        let total = p.total_len() as usize;
        if total > have {
            return Err(Error::Truncated {
                layer: "IPv4 packet",
                need: total,
                have,
            });
        }
        Ok(p)
    }

    /// Checks only what the header accessors need: for captures cut short by a snaplen.
    pub fn new_checked_header(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        let b = p.buffer.as_ref();
        check_len("IPv4 header", b, HEADER_LEN)?;
        if p.version() != 4 {
            return Err(Error::BadVersion {
                layer: "IPv4",
                version: p.version(),
            });
        }
        let hl = p.header_len();
        if hl < HEADER_LEN {
            return Err(Error::Malformed("IPv4 header length below 20"));
        }
        check_len("IPv4 options", b, hl)?;
        if (p.total_len() as usize) < hl {
            return Err(Error::LengthMismatch {
                layer: "IPv4 total",
                claimed: p.total_len() as usize,
                actual: hl,
            });
        }
        Ok(p)
    }

    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_IHL] >> 4
    }
    #[inline]
    pub fn header_len(&self) -> usize {
        ((self.buffer.as_ref()[field::VER_IHL] & 0x0f) as usize) * 4
    }
    #[inline]
    pub fn tos(&self) -> u8 {
        self.buffer.as_ref()[field::TOS]
    }
    #[inline]
    pub fn total_len(&self) -> u16 {
        be::u16_at(self.buffer.as_ref(), field::LENGTH)
    }
    #[inline]
    pub fn ident(&self) -> u16 {
        be::u16_at(self.buffer.as_ref(), field::IDENT)
    }
    fn flags_frag(&self) -> u16 {
        be::u16_at(self.buffer.as_ref(), field::FLAGS_FRAG)
    }
    pub fn dont_frag(&self) -> bool {
        self.flags_frag() & FLAG_DF != 0
    }
    #[inline]
    pub fn is_fragment(&self) -> bool {
        self.flags_frag() & (FLAG_MF | 0x1fff) != 0
    }
    #[inline]
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }
    #[inline]
    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[field::PROTOCOL]
    }
    pub fn checksum(&self) -> u16 {
        be::u16_at(self.buffer.as_ref(), field::CHECKSUM)
    }
    #[inline]
    pub fn src_addr(&self) -> Ipv4Addr {
        let b = self.buffer.as_ref();
        Ipv4Addr::new(b[12], b[13], b[14], b[15])
    }
    #[inline]
    pub fn dst_addr(&self) -> Ipv4Addr {
        let b = self.buffer.as_ref();
        Ipv4Addr::new(b[16], b[17], b[18], b[19])
    }
    /// True when the one's-complement sum over the header is valid.
    #[inline]
    pub fn verify_checksum(&self) -> bool {
        header_checksum(&self.buffer.as_ref()[..self.header_len()]) == 0
    }
    /// The bytes after the header, up to the total length (or the end of a short capture).
    pub fn payload(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        let end = (self.total_len() as usize).min(b.len());
        &b[self.header_len()..end]
    }
}

/// The Internet checksum (RFC 1071) of `data`; 0 when `data` holds a valid checksum
/// ([`super::checksum::of`]: 32-bit words summed and folded afterwards, RFC 1071 §2, five for
/// an IPv4 header instead of ten 16-bit ones).
pub fn header_checksum(data: &[u8]) -> u16 {
    super::checksum::of(data)
}

/// An IPv4 header without options, which is all RoCE v2 sends (rxe hashes exactly 20 bytes
/// into the ICRC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Repr {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    /// DSCP in bits 7..2, ECN in bits 1..0: the AV's traffic class, verbatim.
    pub tos: u8,
    pub ident: u16,
    pub dont_frag: bool,
    pub ttl: u8,
    pub protocol: u8,
    /// Bytes after the IPv4 header.
    pub payload_len: usize,
}

impl Ipv4Repr {
    pub fn parse<T: AsRef<[u8]>>(p: &Ipv4Packet<T>) -> Result<Ipv4Repr> {
        if p.header_len() != HEADER_LEN {
            return Err(Error::Unsupported("IPv4 options"));
        }
        if p.is_fragment() {
            return Err(Error::Unsupported("IPv4 fragments"));
        }
        if !p.verify_checksum() {
            return Err(Error::BadChecksum("IPv4"));
        }
        Ok(Ipv4Repr {
            src: p.src_addr(),
            dst: p.dst_addr(),
            tos: p.tos(),
            ident: p.ident(),
            dont_frag: p.dont_frag(),
            ttl: p.ttl(),
            protocol: p.protocol(),
            payload_len: p.total_len() as usize - HEADER_LEN,
        })
    }

    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the 20-byte header, checksum included, into `buf[..20]`.
    pub fn emit(&self, buf: &mut [u8]) {
        let b = &mut buf[..HEADER_LEN];
        b[field::VER_IHL] = 0x45;
        b[field::TOS] = self.tos;
        be::put_u16(b, field::LENGTH, (HEADER_LEN + self.payload_len) as u16);
        be::put_u16(b, field::IDENT, self.ident);
        be::put_u16(
            b,
            field::FLAGS_FRAG,
            if self.dont_frag { FLAG_DF } else { 0 },
        );
        b[field::TTL] = self.ttl;
        b[field::PROTOCOL] = self.protocol;
        be::put_u16(b, field::CHECKSUM, 0);
        b[field::SRC..field::SRC + 4].copy_from_slice(&self.src.octets());
        b[field::DST..field::DST + 4].copy_from_slice(&self.dst.octets());
        let sum = header_checksum(b);
        be::put_u16(b, field::CHECKSUM, sum);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 791's definition, 16 bits at a time, to check the wider sum against.
    fn checksum_by_16_bit_words(data: &[u8]) -> u16 {
        let mut sum: u32 = 0;
        for c in data.chunks(2) {
            sum += u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)]));
        }
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    #[test]
    fn checksum_by_32_bit_words_is_rfc_791s() {
        let mut x = 0x1234_5678u32;
        for len in 0..64 {
            for _ in 0..50 {
                let data: Vec<u8> = (0..len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 17;
                        x ^= x << 5;
                        x as u8
                    })
                    .collect();
                assert_eq!(
                    header_checksum(&data),
                    checksum_by_16_bit_words(&data),
                    "{data:?}"
                );
            }
            let ones = vec![0xffu8; len];
            assert_eq!(header_checksum(&ones), checksum_by_16_bit_words(&ones));
            let zeros = vec![0u8; len];
            assert_eq!(header_checksum(&zeros), checksum_by_16_bit_words(&zeros));
        }
    }

    // The worked example of roce-rxe-facts.md §3.3.
    const HEADER: [u8; 20] = [
        0x45, 0x00, 0x00, 0x34, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb7, 0x4a, 0xc0, 0xa8, 0x01,
        0x0a, 0xc0, 0xa8, 0x01, 0x14,
    ];

    #[test]
    fn parses_and_emits_reference_header() {
        let mut pkt = HEADER.to_vec();
        pkt.resize(0x34, 0);
        let p = Ipv4Packet::new_checked(&pkt[..]).unwrap();
        let repr = Ipv4Repr::parse(&p).unwrap();
        assert_eq!(repr.src, Ipv4Addr::new(192, 168, 1, 10));
        assert!(repr.dont_frag);
        assert_eq!(repr.payload_len, 0x34 - 20);
        let mut out = [0u8; 20];
        repr.emit(&mut out);
        assert_eq!(out, HEADER);
    }

    #[test]
    fn rejects_bad_checksum_and_short_buffers() {
        let mut pkt = HEADER.to_vec();
        pkt.resize(0x34, 0);
        pkt[10] ^= 1;
        let p = Ipv4Packet::new_checked(&pkt[..]).unwrap();
        assert_eq!(Ipv4Repr::parse(&p), Err(Error::BadChecksum("IPv4")));
        assert!(Ipv4Packet::new_checked(&HEADER[..]).is_err());
        assert!(Ipv4Packet::new_checked(&HEADER[..19]).is_err());
        assert!(Ipv4Packet::new_checked_header(&HEADER[..]).is_ok());
    }
}
