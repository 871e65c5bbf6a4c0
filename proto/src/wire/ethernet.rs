//! Ethernet II frames, with an optional 802.1Q (or 802.1ad) tag.

use super::{be, check_len, Result};
use core::fmt;
use core::net::Ipv6Addr;

#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EthernetAddress(pub [u8; 6]);

impl EthernetAddress {
    pub const BROADCAST: EthernetAddress = EthernetAddress([0xff; 6]);

    /// Group addresses have the I/G bit (the first byte's lowest) set.
    pub const fn is_multicast(&self) -> bool {
        self.0[0] & 1 != 0
    }

    pub const fn is_unicast(&self) -> bool {
        !self.is_multicast()
    }

    /// The modified EUI-64 interface identifier of this MAC (RFC 4291 appendix A): `ff:fe`
    /// in the middle and the universal/local bit flipped. rxe's node GUID is this too.
    pub const fn eui64(&self) -> [u8; 8] {
        let m = self.0;
        [m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]]
    }

    /// `fe80::` + [`EthernetAddress::eui64`]: the link-local address (and RoCE default GID)
    /// of an interface with this MAC.
    pub fn link_local(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a[0] = 0xfe;
        a[1] = 0x80;
        a[8..].copy_from_slice(&self.eui64());
        Ipv6Addr::from(a)
    }

    /// The MAC inside a link-local address formed by EUI-64, if `addr` is one (remove the
    /// `ff:fe`, flip the U/L bit back): how a RoCE v1 peer at a `fe80::` GID is found
    /// without neighbour discovery (roce-rxe-facts.md §1.1).
    pub fn from_link_local(addr: &Ipv6Addr) -> Option<EthernetAddress> {
        let o = addr.octets();
        let link_local = o[..8] == [0xfe, 0x80, 0, 0, 0, 0, 0, 0];
        if !link_local || o[11] != 0xff || o[12] != 0xfe {
            return None;
        }
        let mac = EthernetAddress([o[8] ^ 2, o[9], o[10], o[13], o[14], o[15]]);
        mac.is_unicast().then_some(mac)
    }
}

impl fmt::Debug for EthernetAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for EthernetAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

/// The Ethertypes softroce cares about.
#[derive(Debug)]
pub struct EtherType;

impl EtherType {
    pub const IPV4: u16 = 0x0800;
    pub const IPV6: u16 = 0x86dd;
    pub const ARP: u16 = 0x0806;
    pub const VLAN: u16 = 0x8100;
    pub const QINQ: u16 = 0x88a8;
    pub const ROCE_V1: u16 = super::ETHERTYPE_ROCE_V1;
}

mod field {
    pub const DST: core::ops::Range<usize> = 0..6;
    pub const SRC: core::ops::Range<usize> = 6..12;
    pub const TYPE: usize = 12;
    pub const HEADER_LEN: usize = 14;
    pub const TAG_LEN: usize = 4;
}

/// A zero-copy view of an Ethernet II frame.
#[derive(Debug, Clone)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    pub fn new_unchecked(buffer: T) -> Self {
        EthernetFrame { buffer }
    }

    /// Checks that the header, and the VLAN tag if the frame has one, are present.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let frame = Self::new_unchecked(buffer);
        let b = frame.buffer.as_ref();
        check_len("Ethernet", b, field::HEADER_LEN)?;
        if frame.is_tagged() {
            check_len("802.1Q tag", b, field::HEADER_LEN + field::TAG_LEN)?;
        }
        Ok(frame)
    }

    pub fn dst_addr(&self) -> EthernetAddress {
        let mut a = [0; 6];
        a.copy_from_slice(&self.buffer.as_ref()[field::DST]);
        EthernetAddress(a)
    }

    pub fn src_addr(&self) -> EthernetAddress {
        let mut a = [0; 6];
        a.copy_from_slice(&self.buffer.as_ref()[field::SRC]);
        EthernetAddress(a)
    }

    fn outer_type(&self) -> u16 {
        be::u16_at(self.buffer.as_ref(), field::TYPE)
    }

    pub fn is_tagged(&self) -> bool {
        matches!(self.outer_type(), EtherType::VLAN | EtherType::QINQ)
    }

    /// The tag's TPID and TCI (PCP, DEI, VLAN ID), if the frame is tagged.
    pub fn vlan(&self) -> Option<(u16, u16)> {
        self.is_tagged().then(|| {
            (
                self.outer_type(),
                be::u16_at(self.buffer.as_ref(), field::TYPE + 2),
            )
        })
    }

    pub fn ethertype(&self) -> u16 {
        if self.is_tagged() {
            be::u16_at(self.buffer.as_ref(), field::TYPE + field::TAG_LEN)
        } else {
            self.outer_type()
        }
    }

    pub fn header_len(&self) -> usize {
        field::HEADER_LEN + if self.is_tagged() { field::TAG_LEN } else { 0 }
    }

    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }
}

/// An 802.1Q/802.1ad tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VlanTag {
    pub tpid: u16,
    /// Priority code point (3 bits), drop eligible (1 bit), VLAN ID (12 bits).
    pub tci: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthernetRepr {
    pub dst: EthernetAddress,
    pub src: EthernetAddress,
    pub vlan: Option<VlanTag>,
    pub ethertype: u16,
}

impl EthernetRepr {
    pub fn parse<T: AsRef<[u8]>>(frame: &EthernetFrame<T>) -> Result<EthernetRepr> {
        Ok(EthernetRepr {
            dst: frame.dst_addr(),
            src: frame.src_addr(),
            vlan: frame.vlan().map(|(tpid, tci)| VlanTag { tpid, tci }),
            ethertype: frame.ethertype(),
        })
    }

    pub fn header_len(&self) -> usize {
        field::HEADER_LEN
            + if self.vlan.is_some() {
                field::TAG_LEN
            } else {
                0
            }
    }

    /// Writes the header into the first `header_len()` bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) {
        buf[field::DST].copy_from_slice(&self.dst.0);
        buf[field::SRC].copy_from_slice(&self.src.0);
        let mut at = field::TYPE;
        if let Some(tag) = self.vlan {
            be::put_u16(buf, at, tag.tpid);
            be::put_u16(buf, at + 2, tag.tci);
            at += field::TAG_LEN;
        }
        be::put_u16(buf, at, self.ethertype);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagged_frame_round_trips() {
        let repr = EthernetRepr {
            dst: EthernetAddress([2, 0, 0, 0, 0, 1]),
            src: EthernetAddress([2, 0, 0, 0, 0, 2]),
            vlan: Some(VlanTag {
                tpid: EtherType::VLAN,
                tci: 0x6005,
            }),
            ethertype: EtherType::IPV4,
        };
        let mut buf = [0u8; 18];
        repr.emit(&mut buf);
        let frame = EthernetFrame::new_checked(&buf[..]).unwrap();
        assert_eq!(EthernetRepr::parse(&frame).unwrap(), repr);
        assert!(EthernetFrame::new_checked(&buf[..17]).is_err());
        assert!(EthernetFrame::new_checked(&buf[..3]).is_err());
    }

    #[test]
    fn link_local_by_eui64_round_trips() {
        let mac = EthernetAddress([0x52, 0x54, 0x00, 0x4c, 0xab, 0x01]);
        let ll = mac.link_local();
        assert_eq!(ll, "fe80::5054:ff:fe4c:ab01".parse::<Ipv6Addr>().unwrap());
        assert_eq!(EthernetAddress::from_link_local(&ll), Some(mac));
        // Not formed by EUI-64, or not link-local: no MAC to recover.
        assert_eq!(
            EthernetAddress::from_link_local(&"fe80::1".parse().unwrap()),
            None
        );
        let global = "fd00::5054:ff:fe4c:ab01".parse().unwrap();
        assert_eq!(EthernetAddress::from_link_local(&global), None);
        assert!(EthernetAddress::BROADCAST.is_multicast() && mac.is_unicast());
    }
}
