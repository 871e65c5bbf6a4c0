//! Explicit Congestion Notification (RFC 3168 §5): the two low bits of the IPv4 TOS byte, the
//! IPv6 traffic class and the RoCE v1 GRH traffic class (IBTA Annex A17.9.1 uses the IP
//! field for RoCE v2; a v1 device carries the same byte in the GRH). Every place that reads
//! or writes the ECN bits goes through here, so that v2 over IPv4, v2 over IPv6 and v1 agree.

use super::frame::NetRepr;
use super::ipv4;

/// The ECN codepoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ecn {
    /// 00: the sender does not do ECN.
    NotEct,
    /// 01.
    Ect1,
    /// 10: what DCQCN senders (and softroce with congestion control on) put on data packets.
    Ect0,
    /// 11: a switch queue was congested ("congestion experienced").
    Ce,
}

impl Ecn {
    /// The codepoint in the low two bits of a TOS / traffic class byte.
    #[inline]
    pub const fn of(traffic_class: u8) -> Ecn {
        match traffic_class & 3 {
            0 => Ecn::NotEct,
            1 => Ecn::Ect1,
            2 => Ecn::Ect0,
            _ => Ecn::Ce,
        }
    }

    pub const fn bits(self) -> u8 {
        match self {
            Ecn::NotEct => 0,
            Ecn::Ect1 => 1,
            Ecn::Ect0 => 2,
            Ecn::Ce => 3,
        }
    }

    /// `traffic_class` with its ECN bits replaced by `self` (the DSCP bits are kept).
    #[inline]
    pub const fn apply(self, traffic_class: u8) -> u8 {
        (traffic_class & !3) | self.bits()
    }

    /// ECT(0) or ECT(1): a queue may mark this packet instead of dropping it.
    pub const fn is_capable(self) -> bool {
        matches!(self, Ecn::Ect0 | Ecn::Ect1)
    }
}

/// The TOS byte of a DSCP: `dscp << 2` with the ECN bits `ecn` (a CNP with DSCP 48 and ECT(0)
/// is 0xC2, as ConnectX NICs send it, roce-rxe-facts.md §1.2).
pub const fn tos_of_dscp(dscp: u8, ecn: Ecn) -> u8 {
    ecn.apply((dscp & 0x3f) << 2)
}

impl NetRepr {
    /// The traffic class: IPv4 TOS, IPv6 traffic class, GRH TClass.
    pub fn traffic_class(&self) -> u8 {
        match self {
            NetRepr::Ipv4(ip) => ip.tos,
            NetRepr::Ipv6(ip) | NetRepr::Grh(ip) => ip.traffic_class,
        }
    }

    pub fn set_traffic_class(&mut self, traffic_class: u8) {
        match self {
            NetRepr::Ipv4(ip) => ip.tos = traffic_class,
            NetRepr::Ipv6(ip) | NetRepr::Grh(ip) => ip.traffic_class = traffic_class,
        }
    }

    pub fn ecn(&self) -> Ecn {
        Ecn::of(self.traffic_class())
    }

    pub fn set_ecn(&mut self, ecn: Ecn) {
        self.set_traffic_class(ecn.apply(self.traffic_class()));
    }
}

/// The traffic class of a whole IP packet (IPv4 TOS or IPv6 traffic class), None when it is
/// neither.
pub fn packet_traffic_class(ip_packet: &[u8]) -> Option<u8> {
    match ip_packet.first().map(|v| v >> 4) {
        Some(4) if ip_packet.len() >= ipv4::HEADER_LEN => Some(ip_packet[1]),
        Some(6) if ip_packet.len() >= super::ipv6::HEADER_LEN => {
            Some(((ip_packet[0] & 0x0f) << 4) | (ip_packet[1] >> 4))
        }
        _ => None,
    }
}

/// The source address of a whole IP packet (IPv4 or IPv6).
pub fn packet_source(ip_packet: &[u8]) -> Option<std::net::IpAddr> {
    match ip_packet.first().map(|v| v >> 4) {
        Some(4) if ip_packet.len() >= ipv4::HEADER_LEN => {
            Some(<[u8; 4]>::try_from(&ip_packet[12..16]).ok()?.into())
        }
        Some(6) if ip_packet.len() >= super::ipv6::HEADER_LEN => {
            Some(<[u8; 16]>::try_from(&ip_packet[8..24]).ok()?.into())
        }
        _ => None,
    }
}

/// Rewrites the traffic class of a whole IP packet; an IPv4 header checksum is recomputed.
/// Returns false (and changes nothing) when the bytes are not an IPv4 or IPv6 header. The
/// ICRC masks these bits (IBTA A17.4.1.1), so the packet stays valid.
pub fn set_packet_traffic_class(ip_packet: &mut [u8], traffic_class: u8) -> bool {
    match ip_packet.first().map(|v| v >> 4) {
        Some(4) if ip_packet.len() >= ipv4::HEADER_LEN => {
            let ihl = usize::from(ip_packet[0] & 0x0f) * 4;
            if ihl < ipv4::HEADER_LEN || ip_packet.len() < ihl {
                return false;
            }
            ip_packet[1] = traffic_class;
            ip_packet[10] = 0;
            ip_packet[11] = 0;
            let sum = ipv4::header_checksum(&ip_packet[..ihl]);
            ip_packet[10..12].copy_from_slice(&sum.to_be_bytes());
            true
        }
        Some(6) if ip_packet.len() >= super::ipv6::HEADER_LEN => {
            ip_packet[0] = (ip_packet[0] & 0xf0) | (traffic_class >> 4);
            ip_packet[1] = (ip_packet[1] & 0x0f) | (traffic_class << 4);
            true
        }
        _ => false,
    }
}

/// What a RED/ECN queue does to a packet it decided to mark: CE on an ECN-capable packet.
/// Returns false for a packet that is not ECN-capable (the queue must drop it or pass it).
pub fn mark_ce(ip_packet: &mut [u8]) -> bool {
    match packet_traffic_class(ip_packet) {
        Some(tc) if Ecn::of(tc).is_capable() => {
            set_packet_traffic_class(ip_packet, Ecn::Ce.apply(tc))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codepoints_and_the_cnp_tos() {
        assert_eq!(Ecn::of(0xc2), Ecn::Ect0);
        assert_eq!(Ecn::of(0x03), Ecn::Ce);
        assert_eq!(Ecn::Ect0.apply(0xa1), 0xa2);
        assert_eq!(tos_of_dscp(48, Ecn::Ect0), 0xc2);
        assert!(Ecn::Ect1.is_capable() && !Ecn::Ce.is_capable() && !Ecn::NotEct.is_capable());
    }

    #[test]
    fn marking_ipv4_keeps_the_header_checksum_right() {
        let mut p = [0u8; 28];
        p[0] = 0x45;
        p[1] = 0x02;
        p[2..4].copy_from_slice(&28u16.to_be_bytes());
        p[8] = 64;
        p[9] = 17;
        let sum = ipv4::header_checksum(&p[..20]);
        p[10..12].copy_from_slice(&sum.to_be_bytes());
        assert!(mark_ce(&mut p));
        assert_eq!(packet_traffic_class(&p), Some(0x03));
        assert_eq!(
            ipv4::header_checksum(&p[..20]),
            0,
            "checksum over a valid header"
        );
        // Not ECN-capable: untouched.
        let mut q = p;
        q[1] = 0;
        assert!(!mark_ce(&mut q));
        assert_eq!(q[1], 0);
    }

    #[test]
    fn ipv6_traffic_class_straddles_two_bytes() {
        let mut p = [0u8; 40];
        p[0] = 0x60;
        assert!(set_packet_traffic_class(&mut p, 0xc2));
        assert_eq!((p[0], p[1]), (0x6c, 0x20));
        assert_eq!(packet_traffic_class(&p), Some(0xc2));
        assert!(mark_ce(&mut p));
        assert_eq!(packet_traffic_class(&p), Some(0xc3));
        assert!(!mark_ce(&mut [0u8; 3]));
    }
}
