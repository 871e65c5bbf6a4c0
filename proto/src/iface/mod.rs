//! The L2 device's own host on the Ethernet, sans I/O: what a kernel's neighbour layer does
//! for an interface, for softroce's TAP device (`softroce daemon --tap`).
//!
//! [`EthernetInterface`] takes every frame the link receives ([`EthernetInterface::receive`]):
//! it answers ARP requests and IPv6 neighbour solicitations for its own addresses, learns
//! from them and from replies ([`neighbor::NeighborCache`]), and hands RoCE frames on,
//! classified: v1 (Ethertype 0x8915, a GRH) or v2 (IPv4/IPv6, UDP port 4791). For sending it
//! resolves the Ethernet address of a destination ([`EthernetInterface::resolve`]): multicast
//! by the IP mapping, link-local `fe80::` addresses formed by EUI-64 from the address itself
//! (as the kernel's `ib_resolve_eth_dmac` does for RoCE), anything else through the cache,
//! holding frames while it resolves ([`EthernetInterface::hold`]). Its requests, answers and
//! the frames released by a resolution come out of [`EthernetInterface::poll_transmit`].
//!
//! Destinations outside every prefix of the interface are unreachable (the device is one
//! host on one broadcast domain, with no router).

pub mod neighbor;

use crate::transport::Nanos;
use crate::wire::ethernet::{EtherType, EthernetFrame, EthernetRepr};
use crate::wire::{
    arp, ipv4, ipv6, ndisc, udp, ArpOperation, ArpPacket, ArpRepr, EthernetAddress, Ipv4Packet,
    Ipv6Packet, Ipv6Repr, NdiscPacket, NdiscRepr, ROCE_V2_PORT,
};
use neighbor::{Answer, NeighborCache};
use std::collections::VecDeque;
use std::net::{IpAddr, Ipv6Addr};

/// An address with its prefix length (`--addr 10.0.0.1/24`; in a TOML configuration the
/// same string).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
#[serde(try_from = "String", into = "String")]
pub struct IpCidr {
    pub addr: IpAddr,
    pub prefix_len: u8,
}

impl IpCidr {
    pub fn new(addr: IpAddr, prefix_len: u8) -> IpCidr {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        IpCidr {
            addr,
            prefix_len: prefix_len.min(max),
        }
    }

    /// Whether `other` lies in this prefix.
    pub fn contains(&self, other: &IpAddr) -> bool {
        match (self.addr, other) {
            (IpAddr::V4(a), IpAddr::V4(b)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix_len))
                    .unwrap_or(0);
                u32::from(a) & mask == u32::from(*b) & mask
            }
            (IpAddr::V6(a), IpAddr::V6(b)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix_len))
                    .unwrap_or(0);
                u128::from(a) & mask == u128::from(*b) & mask
            }
            _ => false,
        }
    }
}

impl core::fmt::Display for IpCidr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

impl core::str::FromStr for IpCidr {
    type Err = String;
    /// `ADDR/PREFIX`, or a bare address (a /32 or /128 host route).
    fn from_str(s: &str) -> Result<IpCidr, String> {
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = a.parse().map_err(|e| format!("{a:?}: {e}"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix_len = match p {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|&n| n <= max)
                .ok_or_else(|| format!("prefix length {p:?} is not 0..={max}"))?,
        };
        Ok(IpCidr { addr, prefix_len })
    }
}

impl TryFrom<String> for IpCidr {
    type Error = String;
    fn try_from(s: String) -> Result<IpCidr, String> {
        s.parse()
    }
}

impl From<IpCidr> for String {
    fn from(c: IpCidr) -> String {
        c.to_string()
    }
}

impl From<IpAddr> for IpCidr {
    /// A host address (/32, /128).
    fn from(addr: IpAddr) -> IpCidr {
        IpCidr::new(addr, 128)
    }
}

/// The framing of a RoCE packet on the Ethernet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RoceFraming {
    /// Ethertype 0x8915, GRH, BTH .. ICRC (IBTA Annex A16).
    V1,
    /// IPv4 or IPv6, UDP to port 4791, BTH .. ICRC (Annex A17).
    V2,
}

/// What a received frame was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inbound<'a> {
    /// A RoCE packet for this host: `packet` is the network packet (the GRH or the IP
    /// header onwards, trimmed to its own length: Ethernet padding removed).
    Roce {
        framing: RoceFraming,
        packet: &'a [u8],
        src_mac: EthernetAddress,
    },
    /// ARP or neighbour discovery, handled here.
    Neighbor,
    /// Not for this host, not RoCE, or malformed.
    Ignored,
}

/// Why a destination has no Ethernet address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unreachable {
    /// Outside every prefix of the interface.
    NoRoute,
}

/// Counters of the interface.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InterfaceCounters {
    pub arp_replies_sent: u64,
    pub advertisements_sent: u64,
    /// Frames addressed to another host's MAC (a bridge floods unknown destinations).
    pub not_for_us: u64,
    /// ARP and neighbour discovery packets refused (bad checksum, hop limit, format).
    pub neighbor_malformed: u64,
    /// Frames of other protocols.
    pub other: u64,
}

/// The interface. See the module documentation.
#[derive(Debug)]
pub struct EthernetInterface {
    mac: EthernetAddress,
    addrs: Vec<IpCidr>,
    neighbors: NeighborCache,
    tx: VecDeque<Vec<u8>>,
    counters: InterfaceCounters,
}

impl EthernetInterface {
    /// An interface with Ethernet address `mac` and addresses `addrs` (include the
    /// link-local `fe80::` address if it should answer for it: [`EthernetAddress::link_local`]).
    pub fn new(mac: EthernetAddress, addrs: Vec<IpCidr>) -> EthernetInterface {
        EthernetInterface {
            mac,
            addrs,
            neighbors: NeighborCache::default(),
            tx: VecDeque::new(),
            counters: InterfaceCounters::default(),
        }
    }

    pub fn mac(&self) -> EthernetAddress {
        self.mac
    }
    pub fn addrs(&self) -> &[IpCidr] {
        &self.addrs
    }
    pub fn counters(&self) -> InterfaceCounters {
        self.counters
    }
    pub fn neighbors(&self) -> &NeighborCache {
        &self.neighbors
    }

    fn owns(&self, a: &IpAddr) -> bool {
        self.addrs.iter().any(|c| c.addr == *a)
    }

    /// The Ethernet header of a frame from this interface to `dst` carrying `ethertype`.
    pub fn header(&self, dst: EthernetAddress, ethertype: u16) -> EthernetRepr {
        EthernetRepr {
            dst,
            src: self.mac,
            vlan: None,
            ethertype,
        }
    }

    /// Takes one received frame. ARP and neighbour discovery are handled (their answers wait
    /// in [`EthernetInterface::poll_transmit`]); RoCE packets for this host are returned.
    pub fn receive<'a>(&mut self, frame: &'a [u8], now: Nanos) -> Inbound<'a> {
        let Ok(eth) = EthernetFrame::new_checked(frame) else {
            self.counters.other += 1;
            return Inbound::Ignored;
        };
        let dst = eth.dst_addr();
        let src_mac = eth.src_addr();
        if (dst != self.mac && dst.is_unicast()) || src_mac == self.mac {
            self.counters.not_for_us += 1;
            return Inbound::Ignored;
        }
        if eth.is_tagged() {
            self.counters.other += 1;
            return Inbound::Ignored;
        }
        let payload = &frame[eth.header_len()..];
        match eth.ethertype() {
            EtherType::ROCE_V1 => match grh_packet(payload) {
                Some(packet) => Inbound::Roce {
                    framing: RoceFraming::V1,
                    packet,
                    src_mac,
                },
                None => {
                    self.counters.other += 1;
                    Inbound::Ignored
                }
            },
            EtherType::ARP => {
                self.receive_arp(payload, src_mac, now);
                Inbound::Neighbor
            }
            EtherType::IPV4 => match roce_v2_ipv4(payload) {
                Some(packet) => Inbound::Roce {
                    framing: RoceFraming::V2,
                    packet,
                    src_mac,
                },
                None => {
                    self.counters.other += 1;
                    Inbound::Ignored
                }
            },
            EtherType::IPV6 => self.receive_ipv6(payload, src_mac, now),
            _ => {
                self.counters.other += 1;
                Inbound::Ignored
            }
        }
    }

    fn receive_arp(&mut self, payload: &[u8], src_mac: EthernetAddress, now: Nanos) {
        let Some(r) = ArpPacket::new_checked(payload)
            .and_then(|p| ArpRepr::parse(&p))
            .ok()
        else {
            self.counters.neighbor_malformed += 1;
            return;
        };
        let sender = IpAddr::V4(r.source_protocol_addr);
        let for_us = self.owns(&IpAddr::V4(r.target_protocol_addr));
        if r.source_hardware_addr.is_multicast() || r.source_protocol_addr.is_unspecified() {
            // An ARP probe (RFC 5227) or nonsense: nothing to learn.
        } else if for_us {
            let released = self.neighbors.fill(sender, r.source_hardware_addr, now);
            self.tx.extend(released);
        } else {
            let released = self.neighbors.update(sender, r.source_hardware_addr, now);
            self.tx.extend(released);
        }
        if for_us && r.operation == ArpOperation::Request {
            let reply = ArpRepr {
                operation: ArpOperation::Reply,
                source_hardware_addr: self.mac,
                source_protocol_addr: r.target_protocol_addr,
                target_hardware_addr: r.source_hardware_addr,
                target_protocol_addr: r.source_protocol_addr,
            };
            let to = if r.source_hardware_addr.is_unicast() {
                r.source_hardware_addr
            } else {
                src_mac
            };
            self.tx.push_back(self.arp_frame(to, &reply));
            self.counters.arp_replies_sent += 1;
        }
    }

    fn receive_ipv6<'a>(
        &mut self,
        payload: &'a [u8],
        src_mac: EthernetAddress,
        now: Nanos,
    ) -> Inbound<'a> {
        let Ok(p) = Ipv6Packet::new_checked(payload) else {
            self.counters.other += 1;
            return Inbound::Ignored;
        };
        let packet = &payload[..ipv6::HEADER_LEN + p.payload_len() as usize];
        match p.next_header() {
            ndisc::NEXT_HEADER_ICMPV6 => {
                self.receive_ndisc(&p, src_mac, now);
                Inbound::Neighbor
            }
            ipv6::NEXT_HEADER_UDP if udp_dst_port(p.payload()) == Some(ROCE_V2_PORT) => {
                Inbound::Roce {
                    framing: RoceFraming::V2,
                    packet,
                    src_mac,
                }
            }
            _ => {
                self.counters.other += 1;
                Inbound::Ignored
            }
        }
    }

    fn receive_ndisc(&mut self, p: &Ipv6Packet<&[u8]>, src_mac: EthernetAddress, now: Nanos) {
        let (src, dst) = (p.src_addr(), p.dst_addr());
        let repr = match NdiscPacket::new_checked(p.payload())
            .and_then(|n| NdiscRepr::parse(&n, &src, &dst, p.hop_limit()))
        {
            Ok(r) => r,
            // Other ICMPv6 (router solicitations, MLD reports of the bridge's host) is not
            // ours to answer.
            Err(crate::wire::Error::Unsupported(_)) => return,
            Err(_) => {
                self.counters.neighbor_malformed += 1;
                return;
            }
        };
        match repr {
            NdiscRepr::NeighborSolicit {
                target,
                source_lladdr,
            } => {
                let dad = src.is_unspecified();
                if let (false, Some(mac)) = (dad, source_lladdr) {
                    // RFC 4861 §7.2.3: the solicitation's sender is a neighbour.
                    let released = if self.owns(&IpAddr::V6(target)) {
                        self.neighbors.fill(IpAddr::V6(src), mac, now)
                    } else {
                        self.neighbors.update(IpAddr::V6(src), mac, now)
                    };
                    self.tx.extend(released);
                }
                if !self.owns(&IpAddr::V6(target)) {
                    return;
                }
                // Answer to the sender, or to all nodes for duplicate address detection
                // (RFC 4861 §7.2.4), with our address as the target's link-layer address.
                let (to_ip, to_mac) = if dad {
                    let all_nodes = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
                    (all_nodes, ndisc::multicast_mac(&all_nodes))
                } else {
                    (src, source_lladdr.unwrap_or(src_mac))
                };
                let na = NdiscRepr::NeighborAdvert {
                    flags: ndisc::AdvertFlags {
                        router: false,
                        solicited: !dad,
                        override_: true,
                    },
                    target,
                    target_lladdr: Some(self.mac),
                };
                self.tx
                    .push_back(self.ndisc_frame(to_mac, target, to_ip, &na));
                self.counters.advertisements_sent += 1;
            }
            NdiscRepr::NeighborAdvert {
                target,
                target_lladdr,
                ..
            } => {
                let mac = target_lladdr.unwrap_or(src_mac);
                let released = self.neighbors.update(IpAddr::V6(target), mac, now);
                self.tx.extend(released);
            }
        }
    }

    /// The Ethernet address to send to `dst` at, if known now (the interface's own for its
    /// own addresses). `Ok(None)`: being resolved; hold the frame with
    /// [`EthernetInterface::hold`].
    pub fn resolve(
        &mut self,
        dst: IpAddr,
        now: Nanos,
    ) -> Result<Option<EthernetAddress>, Unreachable> {
        // One of the interface's own addresses is at its own MAC: nobody is asked (a frame
        // to it is the device's to loop back, as rxe's `rxe_loopback`).
        if self.addrs.iter().any(|c| c.addr == dst) {
            return Ok(Some(self.mac));
        }
        match dst {
            IpAddr::V4(v4) if v4.is_broadcast() => return Ok(Some(EthernetAddress::BROADCAST)),
            IpAddr::V4(v4) if v4.is_multicast() => {
                // RFC 1112 §6.4: 01:00:5e and the low 23 bits.
                let o = v4.octets();
                return Ok(Some(EthernetAddress([
                    0x01,
                    0x00,
                    0x5e,
                    o[1] & 0x7f,
                    o[2],
                    o[3],
                ])));
            }
            IpAddr::V6(v6) if v6.is_multicast() => return Ok(Some(ndisc::multicast_mac(&v6))),
            IpAddr::V6(v6) if v6.is_unicast_link_local() => {
                if let Some(mac) = EthernetAddress::from_link_local(&v6) {
                    return Ok(Some(mac));
                }
            }
            _ => {
                if !self.addrs.iter().any(|c| c.contains(&dst)) {
                    return Err(Unreachable::NoRoute);
                }
            }
        }
        Ok(match self.neighbors.lookup(dst, now) {
            Answer::Found(mac) => Some(mac),
            Answer::NotFound => None,
        })
    }

    /// Starts resolving `dst` with no frame for it (rdma_cm's address resolution): nothing
    /// when it needs no resolution (a group, a link-local peer, one known or under way) or
    /// is not on the device's link.
    pub fn solicit(&mut self, dst: IpAddr, now: Nanos) {
        if let Ok(None) = self.resolve(dst, now) {
            self.neighbors.solicit(dst, now);
        }
    }

    /// Holds `frame` (a whole frame; its destination address is written on resolution)
    /// until `dst` resolves: see [`neighbor::NeighborCache::hold`].
    pub fn hold(&mut self, dst: IpAddr, frame: Vec<u8>, now: Nanos) {
        self.neighbors.hold(dst, frame, now);
    }

    /// The next frame to send: answers, frames released by a resolution, then a due ARP
    /// request or neighbour solicitation.
    pub fn poll_transmit(&mut self, now: Nanos) -> Option<Vec<u8>> {
        if let Some(f) = self.tx.pop_front() {
            return Some(f);
        }
        while let Some(req) = self.neighbors.poll_request(now) {
            if let Some(f) = self.request_frame(req) {
                return Some(f);
            }
        }
        None
    }

    /// When [`EthernetInterface::poll_transmit`] next has something to send by itself.
    pub fn poll_at(&self) -> Option<Nanos> {
        if !self.tx.is_empty() {
            return Some(0);
        }
        self.neighbors.poll_at()
    }

    fn request_frame(&self, req: neighbor::Request) -> Option<Vec<u8>> {
        match req.addr {
            IpAddr::V4(target) => {
                let src = self.source_for(&req.addr).and_then(|a| match a {
                    IpAddr::V4(v4) => Some(v4),
                    _ => None,
                })?;
                let r = ArpRepr {
                    operation: ArpOperation::Request,
                    source_hardware_addr: self.mac,
                    source_protocol_addr: src,
                    target_hardware_addr: req.unicast.unwrap_or_default(),
                    target_protocol_addr: target,
                };
                Some(self.arp_frame(req.unicast.unwrap_or(EthernetAddress::BROADCAST), &r))
            }
            IpAddr::V6(target) => {
                let src = match self.source_for(&req.addr) {
                    Some(IpAddr::V6(v6)) => v6,
                    _ => return None,
                };
                let (dst_ip, dst_mac) = match req.unicast {
                    Some(mac) => (target, mac),
                    None => {
                        let sn = ndisc::solicited_node(&target);
                        (sn, ndisc::multicast_mac(&sn))
                    }
                };
                let ns = NdiscRepr::NeighborSolicit {
                    target,
                    source_lladdr: Some(self.mac),
                };
                Some(self.ndisc_frame(dst_mac, src, dst_ip, &ns))
            }
        }
    }

    /// The address a request to `target` is sent from: one in the target's prefix, else a
    /// link-local one (IPv6), else any of its family.
    fn source_for(&self, target: &IpAddr) -> Option<IpAddr> {
        let same_family = |c: &&IpCidr| c.addr.is_ipv4() == target.is_ipv4();
        let link_local =
            |c: &&IpCidr| matches!(c.addr, IpAddr::V6(v6) if v6.is_unicast_link_local());
        self.addrs
            .iter()
            .filter(same_family)
            .find(|c| c.contains(target))
            .or_else(|| self.addrs.iter().find(link_local))
            .or_else(|| self.addrs.iter().find(same_family))
            .map(|c| c.addr)
    }

    fn arp_frame(&self, to: EthernetAddress, r: &ArpRepr) -> Vec<u8> {
        let eth = self.header(to, EtherType::ARP);
        let mut f = vec![0u8; eth.header_len() + arp::PACKET_LEN];
        eth.emit(&mut f);
        r.emit(&mut f[eth.header_len()..]);
        f
    }

    fn ndisc_frame(
        &self,
        to: EthernetAddress,
        src: Ipv6Addr,
        dst: Ipv6Addr,
        r: &NdiscRepr,
    ) -> Vec<u8> {
        let eth = self.header(to, EtherType::IPV6);
        let ip = Ipv6Repr {
            src,
            dst,
            traffic_class: 0,
            flow_label: 0,
            next_header: ndisc::NEXT_HEADER_ICMPV6,
            hop_limit: ndisc::HOP_LIMIT,
            payload_len: r.buffer_len(),
        };
        let hl = eth.header_len();
        let mut f = vec![0u8; hl + ipv6::HEADER_LEN + r.buffer_len()];
        eth.emit(&mut f);
        ip.emit(&mut f[hl..]);
        r.emit(&src, &dst, &mut f[hl + ipv6::HEADER_LEN..]);
        f
    }
}

/// The GRH packet at the start of a v1 frame's payload, trimmed to the GRH's PayLen.
fn grh_packet(payload: &[u8]) -> Option<&[u8]> {
    let p = Ipv6Packet::new_checked(payload).ok()?;
    (p.next_header() == crate::wire::GRH_NEXT_HEADER_IBA)
        .then(|| &payload[..ipv6::HEADER_LEN + p.payload_len() as usize])
}

/// The IPv4 packet of a frame, if it is a whole UDP datagram to the RoCE v2 port.
fn roce_v2_ipv4(payload: &[u8]) -> Option<&[u8]> {
    let p = Ipv4Packet::new_checked(payload).ok()?;
    if p.protocol() != ipv4::PROTOCOL_UDP || p.is_fragment() {
        return None;
    }
    (udp_dst_port(p.payload()) == Some(ROCE_V2_PORT)).then(|| &payload[..p.total_len() as usize])
}

fn udp_dst_port(datagram: &[u8]) -> Option<u16> {
    (datagram.len() >= udp::HEADER_LEN).then(|| u16::from_be_bytes([datagram[2], datagram[3]]))
}

#[cfg(test)]
mod tests;
