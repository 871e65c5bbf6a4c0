//! UDP headers (RFC 768). RoCE v2 runs on destination port 4791 with a zero checksum.

use super::{be, check_len, Error, Result};

pub const HEADER_LEN: usize = 8;

#[derive(Debug, Clone)]
pub struct UdpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
    pub fn new_unchecked(buffer: T) -> Self {
        UdpPacket { buffer }
    }

    /// Checks the header and that the UDP length is consistent with the buffer, which must
    /// hold exactly the datagram (the IP layer has already trimmed it).
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_checked_header(buffer)?;
        let have = p.buffer.as_ref().len();
        if p.len() as usize != have {
            return Err(Error::LengthMismatch {
                layer: "UDP",
                claimed: p.len() as usize,
                actual: have,
            });
        }
        Ok(p)
    }

    /// Checks only the header: for captures cut short by a snaplen.
    pub fn new_checked_header(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        check_len("UDP header", p.buffer.as_ref(), HEADER_LEN)?;
        if (p.len() as usize) < HEADER_LEN {
            return Err(Error::Malformed("UDP length below 8"));
        }
        Ok(p)
    }

    pub fn src_port(&self) -> u16 {
        be::u16_at(self.buffer.as_ref(), 0)
    }
    pub fn dst_port(&self) -> u16 {
        be::u16_at(self.buffer.as_ref(), 2)
    }
    pub fn len(&self) -> u16 {
        be::u16_at(self.buffer.as_ref(), 4)
    }
    pub fn is_empty(&self) -> bool {
        self.len() as usize <= HEADER_LEN
    }
    pub fn checksum(&self) -> u16 {
        be::u16_at(self.buffer.as_ref(), 6)
    }
    pub fn payload(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        let end = (self.len() as usize).min(b.len());
        &b[HEADER_LEN..end]
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpRepr {
    pub src_port: u16,
    pub dst_port: u16,
    /// Carried as-is: rxe sends 0 on IPv4 and IPv6 alike; hardware may fill it in. The ICRC
    /// masks it, so softroce neither relies on it nor computes it.
    pub checksum: u16,
    /// Bytes after the UDP header.
    pub payload_len: usize,
}

impl UdpRepr {
    pub fn parse<T: AsRef<[u8]>>(p: &UdpPacket<T>) -> Result<UdpRepr> {
        Ok(UdpRepr {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            checksum: p.checksum(),
            payload_len: p.len() as usize - HEADER_LEN,
        })
    }

    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    pub fn emit(&self, buf: &mut [u8]) {
        be::put_u16(buf, 0, self.src_port);
        be::put_u16(buf, 2, self.dst_port);
        be::put_u16(buf, 4, (HEADER_LEN + self.payload_len) as u16);
        be::put_u16(buf, 6, self.checksum);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_length_checks() {
        let repr = UdpRepr {
            src_port: 0xc132,
            dst_port: 4791,
            checksum: 0,
            payload_len: 4,
        };
        let mut buf = [0u8; 12];
        repr.emit(&mut buf);
        assert_eq!(&buf[..8], &[0xc1, 0x32, 0x12, 0xb7, 0x00, 0x0c, 0, 0]);
        let p = UdpPacket::new_checked(&buf[..]).unwrap();
        assert_eq!(UdpRepr::parse(&p).unwrap(), repr);
        assert!(UdpPacket::new_checked(&buf[..11]).is_err());
        buf[5] = 4;
        assert!(UdpPacket::new_checked_header(&buf[..]).is_err());
    }
}
