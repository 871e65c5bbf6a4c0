//! Whole RoCE frames: link, network (IPv4, IPv6 or the v1 GRH), UDP for v2, and the transport
//! packet with its ICRC. Parsing accepts captures cut short by a snaplen: the headers are
//! decoded and the ICRC is reported as not captured.

use super::ethernet::{EtherType, EthernetFrame, EthernetRepr};
use super::ipv4::{self, Ipv4Packet, Ipv4Repr};
use super::ipv6::{self, Ipv6Packet, Ipv6Repr};
use super::packet::{Layout, TransportRepr};
use super::udp::{self, UdpPacket, UdpRepr};
use super::{icrc, Error, Result, GRH_NEXT_HEADER_IBA, ICRC_LEN, ROCE_V2_PORT};
use core::net::{IpAddr, Ipv6Addr};

/// What carries the network header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkRepr {
    Ethernet(EthernetRepr),
    /// No link header: a raw IP capture, or a socket that hands over IP packets.
    None,
}

impl LinkRepr {
    pub fn header_len(&self) -> usize {
        match self {
            LinkRepr::Ethernet(e) => e.header_len(),
            LinkRepr::None => 0,
        }
    }
}

/// The network header in front of the transport packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetRepr {
    /// RoCE v2 over IPv4.
    Ipv4(Ipv4Repr),
    /// RoCE v2 over IPv6.
    Ipv6(Ipv6Repr),
    /// RoCE v1: the GRH, directly after an Ethernet header with Ethertype 0x8915.
    Grh(Ipv6Repr),
}

impl NetRepr {
    pub fn header_len(&self) -> usize {
        match self {
            NetRepr::Ipv4(_) => ipv4::HEADER_LEN,
            NetRepr::Ipv6(_) | NetRepr::Grh(_) => ipv6::HEADER_LEN,
        }
    }
    pub fn is_v1(&self) -> bool {
        matches!(self, NetRepr::Grh(_))
    }

    /// The source address as softroce names GIDs: a v4-mapped GRH address (`::ffff:a.b.c.d`)
    /// is the IPv4 address.
    pub fn src_addr(&self) -> IpAddr {
        match self {
            NetRepr::Ipv4(ip) => IpAddr::V4(ip.src),
            NetRepr::Ipv6(ip) => IpAddr::V6(ip.src),
            NetRepr::Grh(grh) => gid_addr(grh.src),
        }
    }

    /// The destination address, as [`NetRepr::src_addr`].
    pub fn dst_addr(&self) -> IpAddr {
        match self {
            NetRepr::Ipv4(ip) => IpAddr::V4(ip.dst),
            NetRepr::Ipv6(ip) => IpAddr::V6(ip.dst),
            NetRepr::Grh(grh) => gid_addr(grh.dst),
        }
    }
}

/// A GID as an address: IPv4 for a v4-mapped GID (roce-rxe-facts.md §7.1), else IPv6.
pub fn gid_addr(gid: Ipv6Addr) -> IpAddr {
    match gid.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(gid),
    }
}

/// An address as a GID: `::ffff:a.b.c.d` for IPv4.
pub fn addr_gid(addr: IpAddr) -> Ipv6Addr {
    match addr {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

/// The ICRC verdict of a parsed frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IcrcStatus {
    Ok,
    Bad {
        computed: u32,
        carried: u32,
    },
    /// The capture's snaplen cut the packet short: nothing to verify.
    NotCaptured,
}

/// A frame parsed from captured bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedFrame<'a> {
    pub repr: FrameRepr,
    /// The payload bytes that were captured (all of them unless `icrc` is `NotCaptured`).
    pub payload: &'a [u8],
    pub icrc: IcrcStatus,
}

impl ParsedFrame<'_> {
    /// `Ok` only when the whole packet was present and its ICRC is right.
    pub fn verified(&self) -> Result<()> {
        match self.icrc {
            IcrcStatus::Ok => Ok(()),
            IcrcStatus::Bad { computed, carried } => Err(Error::BadIcrc { computed, carried }),
            IcrcStatus::NotCaptured => Err(Error::Truncated {
                layer: "captured packet",
                need: self.repr.buffer_len(),
                have: 0,
            }),
        }
    }
}

/// A whole RoCE frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameRepr {
    pub link: LinkRepr,
    pub net: NetRepr,
    /// Present for RoCE v2, absent for v1.
    pub udp: Option<UdpRepr>,
    pub transport: TransportRepr,
}

impl FrameRepr {
    /// Parses an Ethernet frame. `wire_len` is the frame's length on the wire (a capture may
    /// hold fewer bytes than that).
    pub fn parse_ethernet(frame: &[u8], wire_len: usize) -> Result<ParsedFrame<'_>> {
        let eth = EthernetFrame::new_checked(frame)?;
        let repr = EthernetRepr::parse(&eth)?;
        let hl = eth.header_len();
        let wire_rest = wire_len.saturating_sub(hl);
        let rest = &frame[hl..];
        match repr.ethertype {
            EtherType::IPV4 => parse_ipv4(LinkRepr::Ethernet(repr), rest, wire_rest),
            EtherType::IPV6 => parse_ipv6(LinkRepr::Ethernet(repr), rest, wire_rest),
            EtherType::ROCE_V1 => parse_grh(LinkRepr::Ethernet(repr), rest, wire_rest),
            _ => Err(Error::NotRoce("Ethertype is not IPv4, IPv6 or RoCE v1")),
        }
    }

    /// Parses what follows a link header that announced `ethertype` (Linux cooked captures,
    /// TAP devices).
    pub fn parse_ethertype(
        ethertype: u16,
        bytes: &[u8],
        wire_len: usize,
    ) -> Result<ParsedFrame<'_>> {
        match ethertype {
            EtherType::IPV4 => parse_ipv4(LinkRepr::None, bytes, wire_len),
            EtherType::IPV6 => parse_ipv6(LinkRepr::None, bytes, wire_len),
            EtherType::ROCE_V1 => parse_grh(LinkRepr::None, bytes, wire_len),
            _ => Err(Error::NotRoce("Ethertype is not IPv4, IPv6 or RoCE v1")),
        }
    }

    /// Parses a raw IPv4 or IPv6 packet (chosen by the version nibble).
    pub fn parse_ip(packet: &[u8], wire_len: usize) -> Result<ParsedFrame<'_>> {
        match packet.first().map(|b| b >> 4) {
            Some(4) => parse_ipv4(LinkRepr::None, packet, wire_len),
            Some(6) => parse_ipv6(LinkRepr::None, packet, wire_len),
            Some(v) => Err(Error::BadVersion {
                layer: "IP",
                version: v,
            }),
            None => Err(Error::Truncated {
                layer: "IP header",
                need: 1,
                have: 0,
            }),
        }
    }

    /// Parses a network-layer RoCE packet without a link header: IPv4 or IPv6 (RoCE v2), or
    /// a GRH (RoCE v1), told apart by the version nibble and, for version 6, the next
    /// header (UDP 17 or IBA transport 0x1b). What the engine sends and receives.
    pub fn parse_network(packet: &[u8], wire_len: usize) -> Result<ParsedFrame<'_>> {
        match (packet.first().map(|b| b >> 4), packet.get(6)) {
            (Some(6), Some(&GRH_NEXT_HEADER_IBA)) => parse_grh(LinkRepr::None, packet, wire_len),
            _ => Self::parse_ip(packet, wire_len),
        }
    }

    /// Total length of the frame: link header through ICRC.
    pub fn buffer_len(&self) -> usize {
        self.link.header_len()
            + self.net.header_len()
            + self.udp.map_or(0, |u| u.header_len())
            + self.transport.buffer_len()
    }

    /// Sets every length field of the outer headers from the transport packet, so that
    /// `emit` and `parse` agree.
    pub fn fill_lengths(&mut self) {
        let transport_len = self.transport.buffer_len();
        let after_net = transport_len + self.udp.map_or(0, |u| u.header_len());
        if let Some(u) = &mut self.udp {
            u.payload_len = transport_len;
        }
        match &mut self.net {
            NetRepr::Ipv4(ip) => ip.payload_len = after_net,
            NetRepr::Ipv6(ip) | NetRepr::Grh(ip) => ip.payload_len = after_net,
        }
    }

    /// Writes the whole frame, ICRC included, into `buf[..buffer_len()]`. Length fields are
    /// written as the repr holds them (see [`FrameRepr::fill_lengths`]).
    pub fn emit(&self, buf: &mut [u8], payload: &[u8]) -> Result<()> {
        super::check_len("output buffer", buf, self.buffer_len())?;
        if payload.len() != self.transport.payload_len {
            return Err(Error::LengthMismatch {
                layer: "payload",
                claimed: self.transport.payload_len,
                actual: payload.len(),
            });
        }
        let at = self.payload_offset();
        buf[at..at + payload.len()].copy_from_slice(payload);
        self.emit_in_place(buf)
    }

    /// Offset of the transport payload in the emitted frame.
    pub fn payload_offset(&self) -> usize {
        self.link.header_len()
            + self.net.header_len()
            + self.udp.map_or(0, |u| u.header_len())
            + self.transport.header_len()
    }

    /// Like [`FrameRepr::emit`], for a payload the caller already placed at
    /// `buf[payload_offset()..]`: the transmit path reads registered memory straight into the
    /// frame, so the payload is copied once.
    pub fn emit_in_place(&self, buf: &mut [u8]) -> Result<()> {
        self.emit_in_place_with(buf, true)
    }

    /// Like [`FrameRepr::emit_in_place`] without computing the ICRC (its 4 bytes are left as
    /// they are): for a sender that seals the packet itself, for the headers its socket
    /// writes (a daemon sending through UDP GSO, whose segments carry different IPv4
    /// Identifications), or that hands it to a receiver that does not check it.
    pub fn emit_in_place_unsealed(&self, buf: &mut [u8]) -> Result<()> {
        self.emit_in_place_with(buf, false)
    }

    fn emit_in_place_with(&self, buf: &mut [u8], seal: bool) -> Result<()> {
        super::check_len("output buffer", buf, self.buffer_len())?;
        let buf = &mut buf[..self.buffer_len()];
        let (link, rest) = buf.split_at_mut(self.link.header_len());
        if let LinkRepr::Ethernet(e) = &self.link {
            e.emit(link);
        }
        let (net, rest) = rest.split_at_mut(self.net.header_len());
        match &self.net {
            NetRepr::Ipv4(ip) => ip.emit(net),
            NetRepr::Ipv6(ip) | NetRepr::Grh(ip) => ip.emit(net),
        }
        let (udp_hdr, transport) = rest.split_at_mut(self.udp.map_or(0, |u| u.header_len()));
        if let Some(u) = &self.udp {
            u.emit(udp_hdr);
        }
        self.transport.emit_in_place(transport)?;
        if !seal {
            return Ok(());
        }
        let covered = transport.len() - ICRC_LEN;
        let (body, trailer) = transport.split_at_mut(covered);
        let crc = match &self.net {
            NetRepr::Ipv4(_) => icrc::v2_ipv4(net, udp_hdr, body),
            NetRepr::Ipv6(_) => icrc::v2_ipv6(net, udp_hdr, body),
            NetRepr::Grh(_) => icrc::v1(net, body),
        };
        trailer.copy_from_slice(&crc.to_le_bytes());
        Ok(())
    }
}

fn parse_ipv4(link: LinkRepr, bytes: &[u8], wire_len: usize) -> Result<ParsedFrame<'_>> {
    let p = Ipv4Packet::new_checked_header(bytes)?;
    if p.protocol() != ipv4::PROTOCOL_UDP {
        return Err(Error::NotRoce("IPv4 protocol is not UDP"));
    }
    if p.is_fragment() || !is_roce_v2_port(&bytes[p.header_len()..]) {
        return Err(Error::NotRoce("not a whole datagram to UDP port 4791"));
    }
    let total = p.total_len() as usize;
    check_wire_len("IPv4", total, wire_len)?;
    let ip = Ipv4Repr::parse(&p)?;
    let header = &bytes[..ipv4::HEADER_LEN];
    let payload = &bytes[ipv4::HEADER_LEN..total.min(bytes.len())];
    parse_udp(link, NetRepr::Ipv4(ip), header, payload, ip.payload_len)
}

fn parse_ipv6(link: LinkRepr, bytes: &[u8], wire_len: usize) -> Result<ParsedFrame<'_>> {
    let p = Ipv6Packet::new_checked_header(bytes)?;
    if p.next_header() != ipv6::NEXT_HEADER_UDP || !is_roce_v2_port(&bytes[ipv6::HEADER_LEN..]) {
        return Err(Error::NotRoce("not a datagram to UDP port 4791"));
    }
    let ip = Ipv6Repr::parse(&p)?;
    check_wire_len("IPv6", ipv6::HEADER_LEN + ip.payload_len, wire_len)?;
    let header = &bytes[..ipv6::HEADER_LEN];
    let end = (ipv6::HEADER_LEN + ip.payload_len).min(bytes.len());
    parse_udp(
        link,
        NetRepr::Ipv6(ip),
        header,
        &bytes[ipv6::HEADER_LEN..end],
        ip.payload_len,
    )
}

fn parse_grh(link: LinkRepr, bytes: &[u8], wire_len: usize) -> Result<ParsedFrame<'_>> {
    let p = Ipv6Packet::new_checked_header(bytes)?;
    let grh = Ipv6Repr::parse(&p)?;
    if grh.next_header != GRH_NEXT_HEADER_IBA {
        return Err(Error::Malformed(
            "GRH next header is not IBA transport (0x1b)",
        ));
    }
    check_wire_len("GRH", ipv6::HEADER_LEN + grh.payload_len, wire_len)?;
    let header = &bytes[..ipv6::HEADER_LEN];
    let end = (ipv6::HEADER_LEN + grh.payload_len).min(bytes.len());
    parse_transport(
        link,
        NetRepr::Grh(grh),
        header,
        None,
        &bytes[ipv6::HEADER_LEN..end],
        grh.payload_len,
    )
}

/// Decides early whether a UDP datagram is RoCE at all, so that other traffic is classified as
/// such rather than as a malformed RoCE packet. A header cut short counts as RoCE (and fails later).
fn is_roce_v2_port(udp: &[u8]) -> bool {
    udp.get(2..4)
        .is_none_or(|p| u16::from_be_bytes([p[0], p[1]]) == ROCE_V2_PORT)
}

/// The network layer must not claim more than the wire carried (a capture's own length).
fn check_wire_len(layer: &'static str, claimed: usize, wire_len: usize) -> Result<()> {
    if claimed > wire_len {
        return Err(Error::LengthMismatch {
            layer,
            claimed,
            actual: wire_len,
        });
    }
    Ok(())
}

fn parse_udp<'a>(
    link: LinkRepr,
    net: NetRepr,
    net_header: &[u8],
    bytes: &'a [u8],
    wire_len: usize,
) -> Result<ParsedFrame<'a>> {
    let u = UdpPacket::new_checked_header(bytes)?;
    if u.dst_port() != ROCE_V2_PORT {
        return Err(Error::NotRoce("UDP destination port is not 4791"));
    }
    let repr = UdpRepr::parse(&u)?;
    if u.len() as usize != wire_len {
        return Err(Error::LengthMismatch {
            layer: "UDP",
            claimed: u.len() as usize,
            actual: wire_len,
        });
    }
    let header = &bytes[..udp::HEADER_LEN];
    parse_transport(
        link,
        net,
        net_header,
        Some((repr, header)),
        &bytes[udp::HEADER_LEN..(u.len() as usize).min(bytes.len())],
        repr.payload_len,
    )
}

fn parse_transport<'a>(
    link: LinkRepr,
    net: NetRepr,
    net_header: &[u8],
    udp: Option<(UdpRepr, &[u8])>,
    bytes: &'a [u8],
    wire_len: usize,
) -> Result<ParsedFrame<'a>> {
    let layout = Layout::compute(bytes, wire_len)?;
    let transport = TransportRepr::parse_headers(bytes, &layout)?;
    let repr = FrameRepr {
        link,
        net,
        udp: udp.map(|(u, _)| u),
        transport,
    };
    let payload_start = layout.header_len;
    let payload_end = (payload_start + layout.payload_len).min(bytes.len());
    let payload = bytes.get(payload_start..payload_end).unwrap_or(&[]);
    if bytes.len() < wire_len {
        return Ok(ParsedFrame {
            repr,
            payload,
            icrc: IcrcStatus::NotCaptured,
        });
    }
    let covered = &bytes[..wire_len - ICRC_LEN];
    let t = &bytes[wire_len - ICRC_LEN..wire_len];
    let carried = u32::from_le_bytes([t[0], t[1], t[2], t[3]]);
    let computed = match (&net, udp) {
        (NetRepr::Ipv4(_), Some((_, u))) => icrc::v2_ipv4(net_header, u, covered),
        (NetRepr::Ipv6(_), Some((_, u))) => icrc::v2_ipv6(net_header, u, covered),
        _ => icrc::v1(net_header, covered),
    };
    let icrc = if computed == carried || cfg!(fuzzing) {
        IcrcStatus::Ok
    } else {
        IcrcStatus::Bad { computed, carried }
    };
    Ok(ParsedFrame {
        repr,
        payload,
        icrc,
    })
}
