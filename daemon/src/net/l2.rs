//! The L2 device (`softroce daemon --tap`): a host of its own on the Ethernet behind a TAP
//! interface. It writes and reads whole frames ([`super::tap`]), runs ARP and neighbour
//! discovery for its addresses ([`proto::iface::EthernetInterface`]), and frames the engine's
//! packets itself:
//!
//! - RoCE v1: Ethertype 0x8915, the GRH the engine wrote, the transport, the v1 ICRC;
//! - RoCE v2: IPv4 or IPv6 and UDP as the engine wrote them, with the IPv4 Identification
//!   rxe's kernel would give the packet ([`Ipv4Idents`]) and the ICRC sealed over exactly
//!   those headers. On receive the whole IP header is there, so the ICRC is checked in full
//!   (all 32 bits, the real Identification), unlike on a UDP socket.
//!
//! Which versions the device accepts is its mode (`--roce v1|v2|both`). A packet of the
//! other version is dropped and counted, and logged once per peer and minute with the
//! peer, what it sent and what the device accepts: a version mismatch is never silent.

use super::link::{Link, RxPacket, WireView};
use super::neighbour_board::NeighbourBoard;
use super::tap::{TapConfig, TapCounters, TapIo};
use super::{Backend, NetCounters};
use proto::iface::{EthernetInterface, Inbound, IpCidr, RoceFraming, Unreachable};
use proto::transport::{GidType, Transmit};
use proto::wire::{
    self, icrc, ipv4, ipv6, udp, EtherType, EthernetAddress, Ipv4Packet, Ipv6Packet, RocePacket,
    GRH_NEXT_HEADER_IBA, ROCE_V2_PORT,
};
use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// How often a version mismatch from one peer is logged.
const MISMATCH_LOG_INTERVAL: Duration = Duration::from_secs(60);
/// The kernel's `jiffies` tick for the Identification's random bump (HZ = 250).
const JIFFY: Duration = Duration::from_millis(4);
const ETH_HEADER_LEN: usize = 14;

/// The RoCE versions a device speaks (`--roce`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Versions {
    pub v1: bool,
    pub v2: bool,
}

impl Versions {
    fn accepts(self, f: RoceFraming) -> bool {
        match f {
            RoceFraming::V1 => self.v1,
            RoceFraming::V2 => self.v2,
        }
    }
    fn describe(self) -> &'static str {
        match (self.v1, self.v2) {
            (true, false) => "RoCE v1 only",
            (false, true) => "RoCE v2 only",
            _ => "RoCE v1 and v2",
        }
    }
}

/// How to open the L2 device.
#[derive(Debug, Clone)]
pub struct L2Config {
    /// The device's name, for logs.
    pub device: String,
    pub tap: TapConfig,
    /// The device's own Ethernet address (not the TAP interface's: that is the kernel's
    /// side of the link).
    pub mac: EthernetAddress,
    /// Its addresses with their prefixes, the `fe80::` one included.
    pub addrs: Vec<IpCidr>,
    pub versions: Versions,
}

/// Counters of the L2 device (beside the TAP's and the interface's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct L2Counters {
    pub rx_v1: u64,
    pub rx_v2: u64,
    /// RoCE v2 packets at a device that accepts only v1.
    pub rx_v2_refused: u64,
    /// RoCE v1 frames at a device that accepts only v2.
    pub rx_v1_refused: u64,
    pub rx_bad_icrc: u64,
    /// Headers that are not a RoCE packet (lengths, checksum, options, opcode).
    pub rx_malformed: u64,
    /// Packets to an address that is not one of the device's.
    pub rx_not_ours: u64,
    /// Packets for destinations outside every prefix of the device.
    pub tx_no_route: u64,
    /// Packets held while their destination was being resolved.
    pub tx_held: u64,
    /// Packets to the device itself dropped because [`LOOPED_MAX`] were waiting already.
    pub tx_looped_dropped: u64,
}

/// The IPv4 Identification as Linux gives it to rxe's packets (`ip_select_ident` with no
/// socket: `__ip_select_ident`): a counter per (source, destination, protocol), starting at
/// a random value, advanced by one per packet and by a random amount below the jiffies idle
/// since its last use (`ip_idents_reserve`). So consecutive packets of a flow carry
/// consecutive, non-zero-looking IDs, as in the rxe captures.
#[derive(Debug)]
pub struct Ipv4Idents {
    flows: HashMap<(u32, u32), (u16, Instant)>,
    rng: u64,
}

impl Ipv4Idents {
    pub fn new(seed: u64) -> Ipv4Idents {
        Ipv4Idents {
            flows: HashMap::new(),
            rng: seed | 1,
        }
    }

    fn random(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// The Identification of the next packet from `src` to `dst`.
    pub fn next(&mut self, src: u32, dst: u32, now: Instant) -> u16 {
        if self.flows.len() > 4096 {
            self.flows.clear();
        }
        let fresh = self.random() as u16;
        let bump = self.random();
        let (id, last) = self.flows.entry((src, dst)).or_insert((fresh, now));
        let idle = (now.saturating_duration_since(*last).as_nanos() / JIFFY.as_nanos()) as u64;
        if idle > 0 {
            *id = id.wrapping_add((bump % idle) as u16);
        }
        let out = *id;
        *id = id.wrapping_add(1);
        *last = now;
        out
    }
}

/// Remembers when a mismatch from each peer was last logged.
#[derive(Debug, Default)]
struct MismatchLog {
    last: HashMap<IpAddr, Instant>,
}

impl MismatchLog {
    /// True when a line about `peer` is due.
    fn due(&mut self, peer: IpAddr, now: Instant) -> bool {
        if self.last.len() > 4096 {
            self.last.clear();
        }
        match self.last.get(&peer) {
            Some(t) if now.saturating_duration_since(*t) < MISMATCH_LOG_INTERVAL => false,
            _ => {
                self.last.insert(peer, now);
                true
            }
        }
    }
}

/// The L2 device. See the module documentation.
#[derive(Debug)]
pub struct L2Link {
    device: String,
    tap: TapIo,
    iface: EthernetInterface,
    versions: Versions,
    idents: Ipv4Idents,
    mismatch: MismatchLog,
    counters: L2Counters,
    start: Instant,
    /// The device's addresses: packets to others (and not to a multicast group) are not
    /// ours.
    addrs: Vec<IpAddr>,
    /// What the last send framed, kept while a capture listens ([`Link::keep_last_sent`]):
    /// the frame (its BTH at the offset), or nothing when it was not sent.
    last_sent: Option<(Vec<u8>, usize)>,
    keep_last_sent: bool,
    /// The next frame framed gets one bit flipped after sealing ([`Link::send_corrupted`]).
    corrupt_next: bool,
    /// The resolved peers, for the CM thread's address resolution, and the neighbour
    /// cache's change count when they were last published there.
    board: Arc<NeighbourBoard>,
    published: u64,
    /// Packets the device sent to one of its own addresses (rdma_cm to itself): never on the
    /// TAP, received at the next poll, as rxe's `rxe_loopback` hands them to its own receive
    /// path. At most [`LOOPED_MAX`] wait.
    looped: Vec<(RoceFraming, Vec<u8>)>,
}

/// Packets to itself that may wait for the next poll: the CM's MADs and the odd packet a QP
/// addresses to its own device's GID off the local path; more are dropped (`tx_errors`).
const LOOPED_MAX: usize = 256;

/// rxe's UDP source port of QP1 (`0xC000 + hash_32(1, 14)`, facts §1.3): the CM MADs' on v2.
const GSI_SRC_PORT: u16 = 0xd872;

impl L2Link {
    /// Opens the TAP interface. The second value says why io_uring is not used, if so.
    pub fn open(cfg: &L2Config, seed: u64) -> io::Result<(L2Link, Option<String>)> {
        let (tap, why) = TapIo::open(&cfg.tap)?;
        let link = L2Link {
            device: cfg.device.clone(),
            tap,
            iface: EthernetInterface::new(cfg.mac, cfg.addrs.clone()),
            versions: cfg.versions,
            idents: Ipv4Idents::new(seed),
            mismatch: MismatchLog::default(),
            counters: L2Counters::default(),
            start: Instant::now(),
            addrs: cfg.addrs.iter().map(|c| c.addr).collect(),
            last_sent: None,
            keep_last_sent: false,
            corrupt_next: false,
            board: Arc::new(NeighbourBoard::new(cfg.addrs.clone())),
            published: 0,
            looped: Vec::new(),
        };
        Ok((link, why))
    }

    /// Where the device's resolved peers are published for the CM thread.
    pub fn neighbour_board(&self) -> Arc<NeighbourBoard> {
        Arc::clone(&self.board)
    }

    /// Publishes the resolved peers if they changed since last time.
    fn publish_neighbours(&mut self) {
        let cache = self.iface.neighbors();
        if cache.changes() != self.published {
            self.published = cache.changes();
            self.board.publish(cache.resolved());
        }
    }

    pub fn backend(&self) -> Backend {
        self.tap.backend()
    }
    pub fn tap_name(&self) -> &str {
        self.tap.name()
    }
    /// The TAP interface's MTU.
    pub fn mtu(&self) -> usize {
        self.tap.mtu()
    }
    pub fn mac(&self) -> EthernetAddress {
        self.iface.mac()
    }
    pub fn counters(&self) -> L2Counters {
        self.counters
    }
    pub fn tap_counters(&self) -> TapCounters {
        self.tap.counters()
    }
    pub fn interface(&self) -> &EthernetInterface {
        &self.iface
    }

    pub fn set_wake_fd(&mut self, fd: RawFd) {
        self.tap.set_wake_fd(fd);
    }

    fn now(&self) -> proto::transport::Nanos {
        self.start.elapsed().as_nanos() as proto::transport::Nanos
    }

    /// When the neighbour layer next has work of its own (a request to repeat or give up).
    pub fn poll_at(&self) -> Option<Instant> {
        self.iface
            .poll_at()
            .map(|ns| self.start + Duration::from_nanos(ns))
    }

    /// Sends a packet the engine wrote (`packet` is `buf[..t.len]`: the GRH or the IP
    /// header onwards, its ICRC not computed): framed, sealed and resolved here.
    pub fn send_packet(&mut self, packet: &[u8], t: &Transmit) {
        let ethertype = match (t.gid_type, t.dst) {
            (GidType::RoceV1, _) => EtherType::ROCE_V1,
            (GidType::RoceV2, IpAddr::V4(_)) => EtherType::IPV4,
            (GidType::RoceV2, IpAddr::V6(_)) => EtherType::IPV6,
        };
        self.send_network(packet, t.dst, ethertype, t.transport_offset);
    }

    /// Sends a transport packet (BTH .. ICRC) built elsewhere (a CM MAD from the CM thread)
    /// from `src` to `dst`, in the framing of `gid_type`, from UDP port `src_port` for v2.
    pub fn send_transport(
        &mut self,
        src: IpAddr,
        dst: IpAddr,
        gid_type: GidType,
        src_port: u16,
        transport: &[u8],
    ) {
        let mut buf = vec![0u8; ipv6::HEADER_LEN + udp::HEADER_LEN + transport.len()];
        let (net, ethertype) = match (gid_type, src, dst) {
            (GidType::RoceV1, s, d) => (
                wire::NetRepr::Grh(wire::Ipv6Repr {
                    src: wire::frame::addr_gid(s),
                    dst: wire::frame::addr_gid(d),
                    traffic_class: 0,
                    flow_label: 0,
                    next_header: GRH_NEXT_HEADER_IBA,
                    hop_limit: 64,
                    payload_len: transport.len(),
                }),
                EtherType::ROCE_V1,
            ),
            (GidType::RoceV2, IpAddr::V4(s), IpAddr::V4(d)) => (
                wire::NetRepr::Ipv4(wire::Ipv4Repr {
                    src: s,
                    dst: d,
                    tos: 0,
                    ident: 0,
                    dont_frag: true,
                    ttl: 64,
                    protocol: ipv4::PROTOCOL_UDP,
                    payload_len: udp::HEADER_LEN + transport.len(),
                }),
                EtherType::IPV4,
            ),
            (GidType::RoceV2, IpAddr::V6(s), IpAddr::V6(d)) => (
                wire::NetRepr::Ipv6(wire::Ipv6Repr {
                    src: s,
                    dst: d,
                    traffic_class: 0,
                    flow_label: 0,
                    next_header: ipv6::NEXT_HEADER_UDP,
                    hop_limit: 64,
                    payload_len: udp::HEADER_LEN + transport.len(),
                }),
                EtherType::IPV6,
            ),
            _ => return,
        };
        let hl = net.header_len();
        match &net {
            wire::NetRepr::Ipv4(ip) => ip.emit(&mut buf),
            wire::NetRepr::Ipv6(ip) | wire::NetRepr::Grh(ip) => ip.emit(&mut buf),
        }
        let mut at = hl;
        if gid_type == GidType::RoceV2 {
            wire::UdpRepr {
                src_port,
                dst_port: ROCE_V2_PORT,
                checksum: 0,
                payload_len: transport.len(),
            }
            .emit(&mut buf[hl..]);
            at += udp::HEADER_LEN;
        }
        buf[at..at + transport.len()].copy_from_slice(transport);
        buf.truncate(at + transport.len());
        self.send_network(&buf, dst, ethertype, at);
    }

    /// Frames `packet` for `dst`: resolves the next hop, writes the frame into a TAP slot and
    /// seals it there, or holds it while the neighbour layer resolves.
    fn send_network(&mut self, packet: &[u8], dst: IpAddr, ethertype: u16, transport_at: usize) {
        let now = self.now();
        let corrupt = std::mem::take(&mut self.corrupt_next);
        if let Some((frame, _)) = &mut self.last_sent {
            frame.clear();
        }
        let mac = match self.iface.resolve(dst, now) {
            Ok(m) => m,
            Err(Unreachable::NoRoute) => {
                self.counters.tx_no_route += 1;
                debug!(device = %self.device, %dst, "no route: outside every prefix of the device");
                return;
            }
        };
        // At the device's own MAC: one of its own addresses, nothing goes on the wire.
        let own = mac == Some(self.iface.mac());
        let len = ETH_HEADER_LEN + packet.len();
        let header = self.iface.header(mac.unwrap_or_default(), ethertype);
        let (idents, instant) = (&mut self.idents, Instant::now());
        let keep = self.keep_last_sent;
        let last_sent = &mut self.last_sent;
        let mut build = |buf: &mut [u8]| -> usize {
            let Some(frame) = buf.get_mut(..len) else {
                return 0;
            };
            header.emit(frame);
            frame[ETH_HEADER_LEN..].copy_from_slice(packet);
            seal(
                &mut frame[ETH_HEADER_LEN..],
                ethertype,
                transport_at,
                idents,
                instant,
            );
            if corrupt {
                // After sealing, so that the receiver's ICRC check drops it (fault injection).
                crate::fault::corrupt(&mut frame[ETH_HEADER_LEN + transport_at..]);
            }
            if keep {
                let (kept, bth) = last_sent.get_or_insert_with(|| (Vec::new(), 0));
                kept.clear();
                kept.extend_from_slice(frame);
                *bth = ETH_HEADER_LEN + transport_at;
            }
            len
        };
        match mac {
            Some(_) if own => {
                let mut frame = vec![0u8; len];
                if build(&mut frame) == len && self.looped.len() < LOOPED_MAX {
                    let framing = match ethertype {
                        EtherType::ROCE_V1 => RoceFraming::V1,
                        _ => RoceFraming::V2,
                    };
                    frame.drain(..ETH_HEADER_LEN);
                    self.looped.push((framing, frame));
                } else {
                    self.counters.tx_looped_dropped += 1;
                }
            }
            Some(_) => {
                if len > self.tap.max_frame_len() {
                    return;
                }
                if let Err(e) = self.tap.send_with(build) {
                    debug!(device = %self.device, "TAP send failed: {e}");
                }
            }
            None => {
                let mut frame = vec![0u8; len];
                if build(&mut frame) == len {
                    self.counters.tx_held += 1;
                    self.iface.hold(dst, frame, now);
                }
            }
        }
        self.drain_interface(now);
    }

    /// Sends what the neighbour layer has to send (answers, requests, released frames).
    fn drain_interface(&mut self, now: proto::transport::Nanos) {
        while let Some(f) = self.iface.poll_transmit(now) {
            let _ = self.tap.send(&f);
        }
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.tap.flush()
    }

    /// Receives frames (waiting up to `timeout`), answers ARP and neighbour discovery, and
    /// hands every verified RoCE packet of an accepted version, to one of the device's
    /// addresses or a multicast group, to `deliver`. Returns how many frames arrived.
    pub fn receive(
        &mut self,
        timeout: Option<Duration>,
        deliver: &mut dyn FnMut(&RxPacket<'_>),
    ) -> io::Result<usize> {
        let (tap, iface) = (&mut self.tap, &mut self.iface);
        let (counters, mismatch, versions, device, addrs) = (
            &mut self.counters,
            &mut self.mismatch,
            self.versions,
            self.device.as_str(),
            &self.addrs,
        );
        let now = self.start.elapsed().as_nanos() as proto::transport::Nanos;
        let wall = Instant::now();
        let mut accept = |packet: &[u8], framing: RoceFraming| {
            let Some(p) = verify(packet, framing, counters) else {
                return;
            };
            let framing = match p.gid_type {
                GidType::RoceV1 => RoceFraming::V1,
                GidType::RoceV2 => RoceFraming::V2,
            };
            if !versions.accepts(framing) {
                match framing {
                    RoceFraming::V1 => counters.rx_v1_refused += 1,
                    RoceFraming::V2 => counters.rx_v2_refused += 1,
                }
                if mismatch.due(p.src, wall) {
                    let sent = match framing {
                        RoceFraming::V1 => "RoCE v1 frame",
                        RoceFraming::V2 => "RoCE v2 packet",
                    };
                    warn!(
                        "{sent} from {} dropped: {device} is {} (see --roce)",
                        p.src,
                        versions.describe()
                    );
                }
                return;
            }
            if !addrs.contains(&p.dst) && !p.dst.is_multicast() {
                counters.rx_not_ours += 1;
                return;
            }
            match framing {
                RoceFraming::V1 => counters.rx_v1 += 1,
                RoceFraming::V2 => counters.rx_v2 += 1,
            }
            deliver(&p);
        };
        // What the device sent to itself first, as received: no wait while any is here.
        let looped = std::mem::take(&mut self.looped);
        for (framing, packet) in &looped {
            accept(packet, *framing);
        }
        let timeout = if looped.is_empty() {
            timeout
        } else {
            Some(Duration::ZERO)
        };
        let n = tap.poll(timeout, &mut |frame| {
            if let Inbound::Roce {
                framing, packet, ..
            } = iface.receive(frame, now)
            {
                accept(packet, framing);
            }
        })?;
        self.drain_interface(self.now());
        Ok(n + looped.len())
    }
}

/// Seals a packet being sent (`packet`: the network packet inside its frame): the IPv4
/// Identification and header checksum, then the ICRC over the headers as they go out.
fn seal(
    packet: &mut [u8],
    ethertype: u16,
    transport_at: usize,
    idents: &mut Ipv4Idents,
    now: Instant,
) {
    if packet.len() < transport_at + wire::ICRC_LEN {
        return;
    }
    let (headers, transport) = packet.split_at_mut(transport_at);
    let covered = transport.len() - wire::ICRC_LEN;
    let (body, trailer) = transport.split_at_mut(covered);
    let crc = match ethertype {
        EtherType::ROCE_V1 => icrc::v1(&headers[..ipv6::HEADER_LEN], body),
        EtherType::IPV4 => {
            let (ip, udp_hdr) = headers.split_at_mut(ipv4::HEADER_LEN);
            let src = u32::from_be_bytes([ip[12], ip[13], ip[14], ip[15]]);
            let dst = u32::from_be_bytes([ip[16], ip[17], ip[18], ip[19]]);
            ip[4..6].copy_from_slice(&idents.next(src, dst, now).to_be_bytes());
            ip[10..12].fill(0);
            let sum = ipv4::header_checksum(ip);
            ip[10..12].copy_from_slice(&sum.to_be_bytes());
            icrc::v2_ipv4(ip, udp_hdr, body)
        }
        _ => {
            let (ip, udp_hdr) = headers.split_at(ipv6::HEADER_LEN);
            icrc::v2_ipv6(ip, udp_hdr, body)
        }
    };
    trailer.copy_from_slice(&crc.to_le_bytes());
    if ethertype == EtherType::IPV6 {
        // IPv6 forbids a zero UDP checksum (RFC 8200 §8.1; rxe sends one anyway, and a
        // plain UDPv6 socket drops it, tshark calls it an error): computed over the sealed
        // datagram, which the ICRC does not depend on (it masks the field).
        let mut src = [0u8; 16];
        let mut dst = [0u8; 16];
        src.copy_from_slice(&packet[8..24]);
        dst.copy_from_slice(&packet[24..40]);
        let datagram = &mut packet[ipv6::HEADER_LEN..];
        datagram[6..8].fill(0);
        let sum =
            ipv6::pseudo_header_checksum(&src.into(), &dst.into(), ipv6::NEXT_HEADER_UDP, datagram);
        let sum = if sum == 0 { 0xffff } else { sum };
        datagram[6..8].copy_from_slice(&sum.to_be_bytes());
    }
}

/// Checks a received network packet (trimmed to its own length by the interface) and its
/// ICRC over the headers exactly as received.
fn verify<'a>(
    packet: &'a [u8],
    framing: RoceFraming,
    counters: &mut L2Counters,
) -> Option<RxPacket<'a>> {
    let parsed = match framing {
        RoceFraming::V1 => {
            let grh = Ipv6Packet::new_checked(packet).ok()?;
            let (s, d) = (grh.src_addr(), grh.dst_addr());
            Some((
                wire::frame::gid_addr(s),
                wire::frame::gid_addr(d),
                ipv6::HEADER_LEN,
            ))
        }
        RoceFraming::V2 => match packet.first().map(|b| b >> 4) {
            Some(4) => Ipv4Packet::new_checked(packet).ok().and_then(|ip| {
                let ok = ip.header_len() == ipv4::HEADER_LEN
                    && ip.verify_checksum()
                    && !ip.is_fragment()
                    && udp_len_ok(&packet[ipv4::HEADER_LEN..]);
                ok.then(|| {
                    (
                        IpAddr::V4(ip.src_addr()),
                        IpAddr::V4(ip.dst_addr()),
                        ipv4::HEADER_LEN + udp::HEADER_LEN,
                    )
                })
            }),
            Some(6) => Ipv6Packet::new_checked(packet).ok().and_then(|ip| {
                udp_len_ok(&packet[ipv6::HEADER_LEN..]).then(|| {
                    (
                        IpAddr::V6(ip.src_addr()),
                        IpAddr::V6(ip.dst_addr()),
                        ipv6::HEADER_LEN + udp::HEADER_LEN,
                    )
                })
            }),
            _ => None,
        },
    };
    let Some((src, dst, transport_offset)) = parsed else {
        counters.rx_malformed += 1;
        return None;
    };
    let Ok(roce) = RocePacket::new_checked(&packet[transport_offset..]) else {
        counters.rx_malformed += 1;
        return None;
    };
    let covered = roce.icrc_covered();
    let computed = match (framing, transport_offset) {
        (RoceFraming::V1, _) => icrc::v1(&packet[..ipv6::HEADER_LEN], covered),
        (_, 28) => icrc::v2_ipv4(&packet[..20], &packet[20..28], covered),
        _ => icrc::v2_ipv6(&packet[..40], &packet[40..48], covered),
    };
    if computed != roce.icrc() {
        counters.rx_bad_icrc += 1;
        return None;
    }
    Some(RxPacket {
        packet,
        src,
        dst,
        bth: transport_offset,
        gid_type: match framing {
            RoceFraming::V1 => GidType::RoceV1,
            RoceFraming::V2 => GidType::RoceV2,
        },
    })
}

/// The UDP header's length is the datagram's (the IP layer trimmed it already).
fn udp_len_ok(datagram: &[u8]) -> bool {
    datagram.len() >= udp::HEADER_LEN
        && usize::from(u16::from_be_bytes([datagram[4], datagram[5]])) == datagram.len()
}

impl Link for L2Link {
    fn poll(&mut self, wait: Duration, deliver: &mut dyn FnMut(&RxPacket<'_>)) -> usize {
        let n = match self.receive(Some(wait), deliver) {
            Ok(n) => n,
            Err(e) => {
                debug!(device = %self.device, "TAP poll failed: {e}");
                0
            }
        };
        self.publish_neighbours();
        n
    }

    fn solicit_neighbour(&mut self, peer: IpAddr) {
        let now = self.now();
        self.iface.solicit(peer, now);
        self.drain_interface(now);
        self.publish_neighbours();
    }

    fn send(&mut self, frame: &mut [u8], t: &Transmit) {
        if let Some(packet) = frame.get(..t.len) {
            self.send_packet(packet, t);
        }
    }

    fn send_gsi(&mut self, src: IpAddr, dst: IpAddr, packet: &mut [u8]) {
        self.send_gsi_as(GidType::RoceV2, src, dst, packet);
    }

    /// Sends like [`Link::send`] with one bit of the transport flipped after sealing.
    fn send_corrupted(&mut self, frame: &mut [u8], t: &Transmit) -> bool {
        self.corrupt_next = true;
        self.send(frame, t);
        self.corrupt_next = false;
        true
    }

    fn set_carrier(&mut self, on: bool) {
        if let Err(e) = self.tap.set_carrier(on) {
            tracing::warn!(device = %self.device, "cannot set the TAP's carrier: {e}");
        }
    }

    fn keep_last_sent(&mut self, on: bool) {
        self.keep_last_sent = on;
        if !on {
            self.last_sent = None;
        }
    }

    /// The frame as it went to the TAP (or was held for neighbour resolution).
    fn last_sent(&self) -> Option<WireView<'_>> {
        match &self.last_sent {
            Some((frame, bth)) if !frame.is_empty() => {
                Some(WireView::Ethernet { frame, bth: *bth })
            }
            _ => None,
        }
    }

    fn send_gsi_as(&mut self, gid_type: GidType, src: IpAddr, dst: IpAddr, packet: &mut [u8]) {
        self.send_transport(src, dst, gid_type, GSI_SRC_PORT, packet);
    }

    fn flush(&mut self) {
        if let Err(e) = self.tap.flush() {
            debug!(device = %self.device, "TAP flush failed: {e}");
        }
    }

    fn set_addresses(&mut self, addrs: &[IpAddr]) {
        self.addrs = addrs.to_vec();
    }

    /// Frames to a group's MAC are taken already (the interface accepts every multicast
    /// address; the engines keep what is for their attached QPs).
    fn join_group(&mut self, _group: IpAddr) -> io::Result<()> {
        Ok(())
    }

    fn leave_group(&mut self, _group: IpAddr) {}

    /// The neighbour layer's timers (a request to repeat, a peer to give up on) do not wake
    /// the device: sleep no longer than the next one.
    fn max_sleep(&self) -> Option<Duration> {
        if !self.looped.is_empty() {
            // Packets to itself wait to be received: no nap before the next poll.
            return Some(Duration::ZERO);
        }
        self.poll_at()
            .map(|at| at.saturating_duration_since(Instant::now()))
    }

    fn counters(&self) -> NetCounters {
        let (t, c) = (self.tap.counters(), self.counters);
        NetCounters {
            rx_packets: c.rx_v1 + c.rx_v2,
            rx_bytes: t.rx_bytes,
            rx_bad_icrc: c.rx_bad_icrc,
            rx_malformed: c.rx_malformed,
            rx_no_buffers: t.rx_no_buffers,
            rx_errors: t.rx_errors,
            tx_packets: t.tx_frames,
            tx_bytes: t.tx_bytes,
            tx_errors: t.tx_errors + t.tx_too_long + c.tx_looped_dropped,
            rx_v2_refused: c.rx_v2_refused,
            rx_v1_refused: c.rx_v1_refused,
            tx_no_route: c.tx_no_route,
            tx_held: c.tx_held,
            ..NetCounters::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifications_advance_per_flow_like_the_kernels() {
        let mut ids = Ipv4Idents::new(0x1234_5678);
        let t0 = Instant::now();
        let a: Vec<u16> = (0..4).map(|_| ids.next(1, 2, t0)).collect();
        // Back to back: consecutive.
        for w in a.windows(2) {
            assert_eq!(w[1], w[0].wrapping_add(1));
        }
        // Another flow has its own counter.
        let b = ids.next(1, 3, t0);
        assert_eq!(ids.next(1, 3, t0), b.wrapping_add(1));
        // After an idle second, a random jump of less than 250 jiffies.
        let later = ids.next(1, 2, t0 + Duration::from_secs(1));
        let jump = later.wrapping_sub(a[3].wrapping_add(1));
        assert!(jump < 250, "{jump}");
    }

    use proto::wire::{BthRepr, FrameRepr, Ipv4Repr, Ipv6Repr, LinkRepr, NetRepr, Opcode};
    use proto::wire::{TransportRepr, UdpRepr};
    use proto::{Psn, Qpn};

    /// An unsealed network packet as the engine writes it (ICRC zero), in `kind`'s framing.
    fn engine_packet(kind: RoceFraming, v6: bool) -> (Vec<u8>, usize, u16) {
        let mut t = TransportRepr::new(BthRepr {
            opcode: Opcode::RC_SEND_ONLY,
            solicited: false,
            mig_req: false,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qpn: Qpn::new(0x11),
            ack_req: true,
            psn: Psn::new(7),
        });
        t.payload_len = 33;
        let v6net = |next_header| Ipv6Repr {
            src: "fd09::1".parse().unwrap(),
            dst: "fd09::2".parse().unwrap(),
            traffic_class: 0,
            flow_label: 0,
            next_header,
            hop_limit: 64,
            payload_len: 0,
        };
        let (net, udp, ethertype) = match (kind, v6) {
            (RoceFraming::V1, _) => (
                NetRepr::Grh(v6net(GRH_NEXT_HEADER_IBA)),
                None,
                EtherType::ROCE_V1,
            ),
            (RoceFraming::V2, true) => (NetRepr::Ipv6(v6net(17)), Some(()), EtherType::IPV6),
            (RoceFraming::V2, false) => (
                NetRepr::Ipv4(Ipv4Repr {
                    src: "10.9.0.1".parse().unwrap(),
                    dst: "10.9.0.2".parse().unwrap(),
                    tos: 0,
                    ident: 0,
                    dont_frag: true,
                    ttl: 64,
                    protocol: 17,
                    payload_len: 0,
                }),
                Some(()),
                EtherType::IPV4,
            ),
        };
        let mut f = FrameRepr {
            link: LinkRepr::None,
            net,
            udp: udp.map(|_| UdpRepr {
                src_port: 0xc132,
                dst_port: ROCE_V2_PORT,
                checksum: 0,
                payload_len: 0,
            }),
            transport: t,
        };
        f.fill_lengths();
        let mut buf = vec![0u8; f.buffer_len()];
        f.emit(&mut buf, &[0x5a; 33]).unwrap();
        let at = f.payload_offset() - 12;
        let n = buf.len();
        buf[n - 4..].fill(0);
        (buf, at, ethertype)
    }

    #[test]
    fn sealed_packets_verify_in_full_and_corruption_is_caught() {
        let t0 = Instant::now();
        for (kind, v6) in [
            (RoceFraming::V1, true),
            (RoceFraming::V2, false),
            (RoceFraming::V2, true),
        ] {
            let (mut p, at, ethertype) = engine_packet(kind, v6);
            let mut ids = Ipv4Idents::new(99);
            seal(&mut p, ethertype, at, &mut ids, t0);
            let mut c = L2Counters::default();
            let rx = verify(&p, kind, &mut c).expect("verifies");
            assert_eq!(rx.bth, at);
            let parsed = FrameRepr::parse_network(&p, p.len()).unwrap();
            parsed.verified().unwrap();
            match parsed.repr.net {
                NetRepr::Ipv4(ip) => assert!(ip.ident != 0 || ids.next(0, 0, t0) != 1),
                NetRepr::Ipv6(_) => {
                    // A UDP checksum, and a right one.
                    assert_ne!(parsed.repr.udp.unwrap().checksum, 0);
                    let (s, d) = (parsed.repr.net.src_addr(), parsed.repr.net.dst_addr());
                    let (IpAddr::V6(s), IpAddr::V6(d)) = (s, d) else {
                        panic!()
                    };
                    assert_eq!(ipv6::pseudo_header_checksum(&s, &d, 17, &p[40..]), 0);
                }
                NetRepr::Grh(_) => {}
            }
            // Every bit the ICRC covers is checked, the IPv4 Identification included.
            let v4 = kind == RoceFraming::V2 && !v6;
            let covered: Vec<usize> = if v4 {
                vec![4, 5, 14, at + 9, p.len() - 5]
            } else {
                vec![8, 30, at + 9, p.len() - 5]
            };
            for byte in covered {
                let mut bad = p.clone();
                bad[byte] ^= 0x01;
                if v4 && byte < 20 {
                    // A consistent IPv4 header with another Identification or address: only
                    // the ICRC can tell.
                    bad[10..12].fill(0);
                    let sum = ipv4::header_checksum(&bad[..20]);
                    bad[10..12].copy_from_slice(&sum.to_be_bytes());
                }
                let mut c = L2Counters::default();
                assert!(
                    verify(&bad, kind, &mut c).is_none(),
                    "{kind:?} v6 {v6} byte {byte}"
                );
                assert_eq!(c.rx_bad_icrc, 1, "{kind:?} v6 {v6} byte {byte}");
            }
        }
    }

    #[test]
    fn mismatches_are_logged_once_per_peer_per_minute() {
        let mut log = MismatchLog::default();
        let t = Instant::now();
        let p: IpAddr = "10.0.0.2".parse().unwrap();
        let q: IpAddr = "10.0.0.3".parse().unwrap();
        assert!(log.due(p, t));
        assert!(!log.due(p, t + Duration::from_secs(59)));
        assert!(log.due(q, t + Duration::from_secs(1)));
        assert!(log.due(p, t + Duration::from_secs(61)));
    }
}
