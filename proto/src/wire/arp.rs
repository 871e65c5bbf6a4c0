//! ARP for IPv4 over Ethernet (RFC 826): what the L2 device needs to answer for its own
//! addresses and to resolve its peers'. Other hardware or protocol types are refused.

use super::ethernet::{EtherType, EthernetAddress};
use super::{be, check_len, Error, Result};
use core::net::Ipv4Addr;

mod field {
    pub const HTYPE: usize = 0;
    pub const PTYPE: usize = 2;
    pub const HLEN: usize = 4;
    pub const PLEN: usize = 5;
    pub const OPER: usize = 6;
    pub const SHA: core::ops::Range<usize> = 8..14;
    pub const SPA: core::ops::Range<usize> = 14..18;
    pub const THA: core::ops::Range<usize> = 18..24;
    pub const TPA: core::ops::Range<usize> = 24..28;
}

/// Length of an Ethernet/IPv4 ARP packet.
pub const PACKET_LEN: usize = 28;
const HTYPE_ETHERNET: u16 = 1;

/// `ar_op`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArpOperation {
    Request,
    Reply,
}

/// A zero-copy view of an ARP packet.
#[derive(Debug, Clone)]
pub struct ArpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ArpPacket<T> {
    pub fn new_unchecked(buffer: T) -> Self {
        ArpPacket { buffer }
    }

    /// Checks that the fixed part and the addresses of an Ethernet/IPv4 packet are present.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        check_len("ARP", p.buffer.as_ref(), PACKET_LEN)?;
        Ok(p)
    }

    pub fn hardware_type(&self) -> u16 {
        be::u16_at(self.buffer.as_ref(), field::HTYPE)
    }
    pub fn protocol_type(&self) -> u16 {
        be::u16_at(self.buffer.as_ref(), field::PTYPE)
    }
    pub fn hardware_len(&self) -> u8 {
        self.buffer.as_ref()[field::HLEN]
    }
    pub fn protocol_len(&self) -> u8 {
        self.buffer.as_ref()[field::PLEN]
    }
    pub fn operation(&self) -> u16 {
        be::u16_at(self.buffer.as_ref(), field::OPER)
    }
    fn mac(&self, r: core::ops::Range<usize>) -> EthernetAddress {
        let mut a = [0; 6];
        a.copy_from_slice(&self.buffer.as_ref()[r]);
        EthernetAddress(a)
    }
    fn ip(&self, r: core::ops::Range<usize>) -> Ipv4Addr {
        let b = &self.buffer.as_ref()[r];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }
    pub fn sender_hardware_addr(&self) -> EthernetAddress {
        self.mac(field::SHA)
    }
    pub fn sender_protocol_addr(&self) -> Ipv4Addr {
        self.ip(field::SPA)
    }
    pub fn target_hardware_addr(&self) -> EthernetAddress {
        self.mac(field::THA)
    }
    pub fn target_protocol_addr(&self) -> Ipv4Addr {
        self.ip(field::TPA)
    }
}

/// An Ethernet/IPv4 ARP request or reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpRepr {
    pub operation: ArpOperation,
    pub source_hardware_addr: EthernetAddress,
    pub source_protocol_addr: Ipv4Addr,
    pub target_hardware_addr: EthernetAddress,
    pub target_protocol_addr: Ipv4Addr,
}

impl ArpRepr {
    pub fn parse<T: AsRef<[u8]>>(p: &ArpPacket<T>) -> Result<ArpRepr> {
        if p.hardware_type() != HTYPE_ETHERNET
            || p.protocol_type() != EtherType::IPV4
            || p.hardware_len() != 6
            || p.protocol_len() != 4
        {
            return Err(Error::Unsupported(
                "ARP for anything but IPv4 over Ethernet",
            ));
        }
        let operation = match p.operation() {
            1 => ArpOperation::Request,
            2 => ArpOperation::Reply,
            _ => return Err(Error::Malformed("ARP operation")),
        };
        Ok(ArpRepr {
            operation,
            source_hardware_addr: p.sender_hardware_addr(),
            source_protocol_addr: p.sender_protocol_addr(),
            target_hardware_addr: p.target_hardware_addr(),
            target_protocol_addr: p.target_protocol_addr(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        PACKET_LEN
    }

    /// Writes the packet into `buf[..28]`.
    pub fn emit(&self, buf: &mut [u8]) {
        let b = &mut buf[..PACKET_LEN];
        be::put_u16(b, field::HTYPE, HTYPE_ETHERNET);
        be::put_u16(b, field::PTYPE, EtherType::IPV4);
        b[field::HLEN] = 6;
        b[field::PLEN] = 4;
        let op = match self.operation {
            ArpOperation::Request => 1,
            ArpOperation::Reply => 2,
        };
        be::put_u16(b, field::OPER, op);
        b[field::SHA].copy_from_slice(&self.source_hardware_addr.0);
        b[field::SPA].copy_from_slice(&self.source_protocol_addr.octets());
        b[field::THA].copy_from_slice(&self.target_hardware_addr.0);
        b[field::TPA].copy_from_slice(&self.target_protocol_addr.octets());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request as Linux sends it (`arping`): who has 10.0.0.2? tell 10.0.0.1.
    const REQUEST: [u8; 28] = [
        0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 10, 0,
        0, 1, 0, 0, 0, 0, 0, 0, 10, 0, 0, 2,
    ];

    #[test]
    fn request_parses_and_round_trips() {
        let p = ArpPacket::new_checked(&REQUEST[..]).unwrap();
        let r = ArpRepr::parse(&p).unwrap();
        assert_eq!(r.operation, ArpOperation::Request);
        assert_eq!(r.source_protocol_addr, Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(r.target_protocol_addr, Ipv4Addr::new(10, 0, 0, 2));
        assert_eq!(r.source_hardware_addr, EthernetAddress([2, 0, 0, 0, 0, 1]));
        let mut out = [0u8; 28];
        r.emit(&mut out);
        assert_eq!(out, REQUEST);
    }

    #[test]
    fn short_and_foreign_packets_are_refused() {
        assert!(ArpPacket::new_checked(&REQUEST[..27]).is_err());
        let mut ipx = REQUEST;
        ipx[3] = 0x37;
        assert!(ArpRepr::parse(&ArpPacket::new_checked(&ipx[..]).unwrap()).is_err());
        let mut op = REQUEST;
        op[7] = 9;
        assert!(ArpRepr::parse(&ArpPacket::new_checked(&op[..]).unwrap()).is_err());
    }
}
