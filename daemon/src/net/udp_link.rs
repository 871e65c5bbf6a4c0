//! RoCE v2 through the kernel's UDP sockets: the [`Link`] of `--addr` and `--netdev` devices.
//!
//! The kernel writes the IP and UDP headers, so the link seals each engine packet's ICRC for
//! the headers the kernel will write (its own source port, the Identification an unconnected
//! DF socket sends), and on receive rebuilds the headers the packet had on the wire in front
//! of each verified datagram, where it lies in the receive buffer, because the engine wants
//! whole IP packets and the ICRC covers them ([`crate::net::RxVerifier`] recovered the IPv4
//! Identification).
//!
//! Multicast groups each get a socket of their own ([`MulticastGroup`]); those sockets are
//! read by polling, so an idle device that holds a group wakes every [`GROUP_POLL`].

use super::link::{Link, RxPacket, WireView};
use super::{
    MulticastGroup, NetConfig, NetCounters, PacketBuilder, RxDatagram, RxVerdict, RxVerifier,
    TxMeta, UdpTransport, MAX_ROCE_PACKET,
};
use proto::transport::Transmit;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::os::fd::RawFd;
use std::time::Duration;
use tracing::{debug, info, warn};

/// The longest an idle device sleeps while it has joined multicast groups: their sockets are
/// polled between waits (the packet driver waits on the main sockets only).
pub const GROUP_POLL: Duration = Duration::from_millis(2);
/// The receive buffer: in its front half, a received packet copied behind its rebuilt IP and
/// UDP headers when its own buffer had no room in front of it (the drivers leave room, so
/// this is a fallback); in its back half, what the multicast group sockets receive.
const RX_BUF_LEN: usize = 64 * 1024;

/// What a UDP link is opened with.
#[derive(Debug, Clone)]
pub struct UdpLinkConfig<'a> {
    /// The device's name, for logs.
    pub name: &'a str,
    /// The device's addresses (its GID table).
    pub addrs: &'a [IpAddr],
    /// Bind the wildcard addresses and serve whatever `addrs` holds at the time (a device
    /// that follows a network interface), instead of the first IPv4 and IPv6 address.
    pub follow_netdev: bool,
    pub port: u16,
    /// UDP GSO on send (one RoCE packet per segment).
    pub gso: bool,
    /// UDP GRO on receive.
    pub gro: bool,
    /// Wakes a blocking poll (the device's doorbell eventfd).
    pub wake_fd: RawFd,
}

/// RoCE v2 over the kernel's UDP sockets on port 4791.
#[derive(Debug)]
pub struct UdpLink {
    net: UdpTransport,
    addrs: Vec<IpAddr>,
    groups: HashMap<IpAddr, MulticastGroup>,
    /// Verifies the datagrams the group sockets receive (the main sockets verify their own).
    group_verifier: RxVerifier,
    rx_buf: Vec<u8>,
    /// The addresses, TOS and TTL of the last datagram queued (see [`Link::last_sent`]).
    last_sent: Option<(SocketAddr, SocketAddr, u8, u8)>,
    /// The link's own drops ([`NetCounters::rx_not_our_address`], `rx_group_refused`).
    not_our_address: u64,
    group_refused: u64,
    /// The interface of each of the device's link-local addresses: a datagram to a
    /// link-local peer names it (`sin6_scope_id`), which the kernel requires of an `fe80::`
    /// destination (EINVAL without), as rxe sends on its netdev.
    link_scopes: Vec<(Ipv6Addr, u32)>,
}

/// How long a device waits for its UDP port to be released before giving up (see `open`).
const ADDR_IN_USE_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

impl UdpLink {
    pub fn open(cfg: &UdpLinkConfig<'_>) -> anyhow::Result<UdpLink> {
        // A device that follows a network interface binds the wildcard addresses, so that
        // addresses the interface gains later are served too; receive then keeps only packets
        // to the device's current GIDs (as rxe checks the destination, facts §4.8). A device of
        // fixed addresses binds its first IPv4 and IPv6 address, so that several daemons can
        // share a host on different loopback addresses.
        let ipv4 = if cfg.follow_netdev {
            Some(Ipv4Addr::UNSPECIFIED)
        } else {
            cfg.addrs.iter().find_map(|a| match a {
                IpAddr::V4(v4) => Some(*v4),
                _ => None,
            })
        };
        let ipv6 = if cfg.follow_netdev {
            Some(Ipv6Addr::UNSPECIFIED)
        } else {
            cfg.addrs.iter().find_map(|a| match a {
                IpAddr::V6(v6) if !v6.is_unicast_link_local() => Some(*v6),
                _ => None,
            })
        };
        let port = cfg.port;
        let net_cfg = NetConfig {
            ipv4,
            ipv6,
            port,
            // One GSO send per run of equal packets of a flow, GRO on receive: a system call
            // per packet caps UDP at ~150k packets/s here. GSO makes the kernel checksum UDP
            // (rxe sends 0; receivers accept both, the ICRC masks it).
            gso: cfg.gso,
            gro: cfg.gro,
            rx_buffers: 256,
            ..NetConfig::default()
        };
        // A daemon that was just killed still holds its port for a moment: the kernel tears a
        // dead process's io_uring (and the sockets its requests reference) down asynchronously.
        // A restart (systemd's, an operator's) waits that out instead of failing; another
        // program that really holds the port still fails, after the grace period.
        let grace = std::time::Instant::now() + ADDR_IN_USE_GRACE;
        let mut net = loop {
            match UdpTransport::open(&net_cfg) {
                Err(e)
                    if e.kind() == std::io::ErrorKind::AddrInUse
                        && !super::port_share::is_own_clash(&e)
                        && std::time::Instant::now() < grace =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                r => break r,
            }
        }
        .map_err(|e| {
            // (A clash with another device of this daemon says so itself.)
            let ours = super::port_share::is_own_clash(&e);
            let hint = if e.kind() == std::io::ErrorKind::AddrInUse && !ours {
                format!(
                    " (another softroce daemon or a kernel rdma_rxe device on this address? \
                     `softroce doctor --port {port}` names who holds it)"
                )
            } else {
                String::new()
            };
            // The kind stays readable (a `link add` answers EADDRINUSE for it).
            anyhow::Error::new(std::io::Error::new(e.kind(), format!("{e}{hint}")))
                .context(format!("device {}: opening UDP port {port}", cfg.name))
        })?;
        if let Some(reason) = net.fallback_reason() {
            warn!(device = %cfg.name, "io_uring unavailable, using system calls: {reason}");
        }
        net.set_wake_fd(cfg.wake_fd);
        info!(device = %cfg.name, backend = ?net.backend(), ?ipv4, ?ipv6, "packet I/O ready");
        Ok(UdpLink {
            net,
            link_scopes: link_scopes(cfg.addrs),
            addrs: cfg.addrs.to_vec(),
            groups: HashMap::new(),
            group_verifier: RxVerifier::new(),
            rx_buf: vec![0u8; RX_BUF_LEN],
            last_sent: None,
            not_our_address: 0,
            group_refused: 0,
        })
    }

    /// The UDP source port of what the device sends from `src` (its socket's; the ICRC
    /// covers it).
    fn local_port(&self, src: IpAddr) -> u16 {
        match src {
            IpAddr::V4(_) => self.net.local_addr_v4(),
            IpAddr::V6(_) => self.net.local_addr_v6(),
        }
        .map_or(proto::wire::ROCE_V2_PORT, |a| a.port())
    }

    /// The outer headers of what the device sends from `src` to `dst`, and where it goes.
    /// Peers listen on 4791; the device itself listens on its own port, which differs only in
    /// tests on one host (`--port`): what it sends to one of its own addresses (rdma_cm to
    /// itself; packets between its own QPs never reach the link) goes there, as kernel rxe
    /// loops a packet to its own GID back.
    fn flow(&self, src: IpAddr, dst: IpAddr) -> (PacketBuilder, SocketAddr) {
        let mut builder = PacketBuilder::new(src, dst, self.local_port(src));
        // (Only a device on another port looks: on 4791 its own addresses get 4791 anyway,
        // and the scan stays off the per-packet path.)
        if builder.src_port != proto::wire::ROCE_V2_PORT && self.addrs.contains(&dst) {
            builder.dst_port = self.local_port(dst);
        }
        let to = match dst {
            // A link-local peer is on the link of the source address (or, from another
            // source, of the device's first link-local address).
            IpAddr::V6(v6) if v6.is_unicast_link_local() => {
                let scope = self
                    .link_scopes
                    .iter()
                    .find(|(a, _)| IpAddr::V6(*a) == src)
                    .or(self.link_scopes.first())
                    .map_or(0, |(_, index)| *index);
                SocketAddr::V6(SocketAddrV6::new(v6, builder.dst_port, 0, scope))
            }
            _ => SocketAddr::new(dst, builder.dst_port),
        };
        (builder, to)
    }

    /// Takes the datagrams the group sockets received from other devices and hands them on
    /// as the main sockets' are. The device's own sends, looped back by the kernel, are
    /// dropped: its QPs got them from the local path already.
    fn poll_groups(&mut self, deliver: &mut dyn FnMut(&RxPacket<'_>)) -> usize {
        let mut delivered = 0;
        // Datagrams land in the back half of the receive buffer, behind room for the headers
        // that are rebuilt in front of them. One byte beyond the longest RoCE packet, so that
        // a longer datagram shows as too long.
        const ROOM: usize = 64;
        let (front, back) = self.rx_buf.split_at_mut(RX_BUF_LEN / 2);
        let buf = &mut back[..ROOM + MAX_ROCE_PACKET + 1];
        for socket in self.groups.values() {
            while let Some((src, n)) = socket.recv(&mut buf[ROOM..]) {
                if self.addrs.contains(&src.ip()) {
                    continue;
                }
                let Some(bytes) = buf.get(ROOM..ROOM + n) else {
                    continue;
                };
                let dst = socket.group();
                let RxVerdict::Good { ipv4 } = self.group_verifier.verify(src, dst, bytes) else {
                    self.group_refused += 1;
                    debug!(%src, %dst, "multicast datagram refused by verification");
                    continue;
                };
                let mut d = RxDatagram::new(src, dst, 0, ipv4, &mut buf[..ROOM + n], ROOM);
                if let Some(p) = rebuild_ip(&mut d, front) {
                    delivered += 1;
                    deliver(&p);
                }
            }
        }
        delivered
    }
}

impl Link for UdpLink {
    fn poll(&mut self, wait: Duration, deliver: &mut dyn FnMut(&RxPacket<'_>)) -> usize {
        let (addrs, rx_buf, not_ours) = (&self.addrs, &mut self.rx_buf, &mut self.not_our_address);
        let mut delivered = 0;
        let _ = self.net.poll(Some(wait), &mut |d: &mut RxDatagram<'_>| {
            if !addrs.contains(&d.dst.ip()) && !d.dst.ip().is_multicast() {
                *not_ours += 1;
                debug!(dst = %d.dst, "packet for an address that is not one of our GIDs dropped");
                return;
            }
            if let Some(p) = rebuild_ip(d, rx_buf) {
                delivered += 1;
                deliver(&p);
            }
        });
        if !self.groups.is_empty() {
            delivered += self.poll_groups(deliver);
        }
        delivered
    }

    /// The socket's source port is 4791 (rxe picks a per-QP port; receivers accept any), and
    /// the ICRC covers the ports, so it is recomputed for the headers the kernel will write.
    fn send(&mut self, buf: &mut [u8], t: &Transmit) {
        let Some(frame) = buf.get_mut(..t.len) else {
            return;
        };
        let (tos, ttl) = outer_fields(frame, t.src);
        let (builder, dst) = self.flow(t.src, t.dst);
        let transport = &mut frame[t.transport_offset..];
        let meta = TxMeta {
            dst,
            src: Some(t.src),
            tos,
            ttl: Some(ttl),
            segment_size: None,
        };
        self.last_sent = None;
        match self.net.push_packet(&meta, &builder, transport) {
            Ok(()) => self.last_sent = Some(flow_of(&meta, &builder)),
            Err(e) => debug!(src = %t.src, dst = %t.dst, "send failed: {e}"),
        }
    }

    fn send_corrupted(&mut self, buf: &mut [u8], t: &Transmit) -> bool {
        let Some(frame) = buf.get(..t.len) else {
            return false;
        };
        let (tos, ttl) = outer_fields(frame, t.src);
        let (builder, dst) = self.flow(t.src, t.dst);
        let mut packet = frame[t.transport_offset..].to_vec();
        // Sent alone (Identification 0), sealed, then one bit flipped.
        if builder.seal(0, &mut packet).is_err() {
            return false;
        }
        crate::fault::corrupt(&mut packet);
        let meta = TxMeta {
            dst,
            src: Some(t.src),
            tos,
            ttl: Some(ttl),
            segment_size: None,
        };
        self.last_sent = None;
        if self.net.send(&meta, &packet).is_ok() {
            self.last_sent = Some(flow_of(&meta, &builder));
        }
        true
    }

    fn last_sent(&self) -> Option<WireView<'_>> {
        let (src, dst, tos, ttl) = self.last_sent?;
        let (payload, ident) = self.net.last_queued()?;
        Some(WireView::Udp(crate::capture::UdpDatagram {
            src,
            dst,
            ip: crate::capture::IpFields {
                tos,
                ttl,
                ident,
                dont_frag: true,
            },
            checksum: self.net.udp_checksums(),
            payload,
        }))
    }

    fn send_gsi(&mut self, src: IpAddr, dst: IpAddr, packet: &mut [u8]) {
        let (builder, to) = self.flow(src, dst);
        if builder.seal(0, packet).is_err() {
            return;
        }
        let meta = TxMeta {
            dst: to,
            src: Some(src),
            tos: 0,
            ttl: Some(64),
            segment_size: None,
        };
        self.last_sent = None;
        match self.net.send(&meta, packet) {
            Ok(()) => self.last_sent = Some(flow_of(&meta, &builder)),
            Err(e) => debug!(%src, %dst, "CM MAD send failed: {e}"),
        }
    }

    fn flush(&mut self) {
        let _ = self.net.flush();
    }

    fn set_addresses(&mut self, addrs: &[IpAddr]) {
        self.addrs = addrs.to_vec();
        self.link_scopes = link_scopes(addrs);
    }

    fn join_group(&mut self, group: IpAddr) -> io::Result<()> {
        // Senders address a group at the RoCE v2 port, whatever port this device serves.
        let port = proto::wire::ROCE_V2_PORT;
        // The device's address of the group's family (for IPv6 one that is not link-local
        // first: its interface is where the group's traffic comes in).
        let same_family = |a: &IpAddr| a.is_ipv4() == group.is_ipv4();
        let Some(local) = self
            .addrs
            .iter()
            .copied()
            .filter(same_family)
            .min_by_key(|a| matches!(a, IpAddr::V6(v6) if v6.is_unicast_link_local()))
        else {
            return Err(io::Error::new(
                io::ErrorKind::AddrNotAvailable,
                "the device has no address of the group's family to join it on",
            ));
        };
        let socket = MulticastGroup::join(group, local, port)?;
        self.groups.insert(group, socket);
        Ok(())
    }

    fn leave_group(&mut self, group: IpAddr) {
        // Closing the socket leaves the group.
        self.groups.remove(&group);
    }

    fn max_sleep(&self) -> Option<Duration> {
        (!self.groups.is_empty()).then_some(GROUP_POLL)
    }

    fn peer_solves_ident(&mut self, peer: IpAddr, yes: bool) {
        // An IPv4 GID may come as an IPv4-mapped IPv6 address.
        if let IpAddr::V4(a) = peer.to_canonical() {
            self.net.set_peer_solves_ident(a, yes);
        }
    }

    fn counters(&self) -> NetCounters {
        NetCounters {
            rx_not_our_address: self.not_our_address,
            rx_group_refused: self.group_refused,
            ..self.net.counters()
        }
    }
}

/// The TOS (traffic class) and TTL (hop limit) of an engine's IP packet.
fn outer_fields(frame: &[u8], src: IpAddr) -> (u8, u8) {
    match src {
        IpAddr::V4(_) => (frame[1], frame[8]),
        IpAddr::V6(_) => (
            ((u16::from_be_bytes([frame[0], frame[1]]) >> 4) & 0xff) as u8,
            frame[7],
        ),
    }
}

/// The interface index of each link-local address among `addrs` that an interface holds.
fn link_scopes(addrs: &[IpAddr]) -> Vec<(Ipv6Addr, u32)> {
    addrs
        .iter()
        .filter_map(|a| match a {
            IpAddr::V6(v6) if v6.is_unicast_link_local() => {
                Some((*v6, super::multicast::interface_of(*a).ok()?))
            }
            _ => None,
        })
        .collect()
}

/// The (source, destination, TOS, TTL) a send goes out with.
fn flow_of(meta: &TxMeta, builder: &PacketBuilder) -> (SocketAddr, SocketAddr, u8, u8) {
    (
        SocketAddr::new(builder.local, builder.src_port),
        meta.dst,
        meta.tos,
        meta.ttl.unwrap_or(64),
    )
}

/// Rebuilds the IPv4 or IPv6 and UDP headers of a verified datagram in front of its bytes, as
/// they were on the wire (the ICRC covers them): in the receive buffer itself when it has the
/// room there ([`RxDatagram::with_room`]: the metadata the kernel wrote before the datagram,
/// or the GRO segment before it, both read already), else in `spare`, behind a copy.
fn rebuild_ip<'a>(d: &'a mut RxDatagram<'_>, spare: &'a mut [u8]) -> Option<RxPacket<'a>> {
    use proto::wire::{Ipv4Repr, Ipv6Repr, UdpRepr};
    let (src, dst, len) = (d.src, d.dst, d.bytes().len());
    // The headers first, on the stack (48 bytes at most), then into place.
    let mut head = [0u8; 48];
    let hl = match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(t)) => {
            let id = d.ipv4?;
            Ipv4Repr {
                src: s,
                dst: t,
                tos: d.tos,
                ident: id.ident,
                dont_frag: id.dont_frag,
                ttl: 64,
                protocol: 17,
                payload_len: 8 + len,
            }
            .emit(&mut head[..20]);
            20
        }
        (IpAddr::V6(s), IpAddr::V6(t)) => {
            Ipv6Repr {
                src: s,
                dst: t,
                traffic_class: d.tos,
                flow_label: 0,
                next_header: 17,
                hop_limit: 64,
                payload_len: 8 + len,
            }
            .emit(&mut head[..40]);
            40
        }
        _ => return None,
    };
    UdpRepr {
        src_port: src.port(),
        dst_port: dst.port(),
        checksum: 0,
        payload_len: len,
    }
    .emit(&mut head[hl..hl + 8]);
    let headers = &head[..hl + 8];
    let out = if d.room() >= headers.len() {
        d.with_room(headers.len())?
    } else {
        let out = spare.get_mut(..headers.len() + len)?;
        out[headers.len()..].copy_from_slice(d.bytes());
        out
    };
    out[..headers.len()].copy_from_slice(headers);
    Some(RxPacket {
        gid_type: proto::transport::GidType::RoceV2,
        src: src.ip(),
        dst: dst.ip(),
        packet: out,
        bth: hl + 8,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::Ipv4Ident;
    use proto::wire::{Ipv4Packet, Ipv6Packet};

    fn datagram(room: usize) -> (Vec<u8>, Vec<u8>) {
        let bytes: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
        let mut buf = vec![0x55u8; room];
        buf.extend_from_slice(&bytes);
        (buf, bytes)
    }

    /// The headers go into the room in front of the datagram, in the receive buffer itself:
    /// the packet the engine gets is the buffer, no copy (and, without the room, a copy in
    /// the spare buffer with the same bytes).
    #[test]
    fn headers_are_rebuilt_in_front_of_the_datagram_where_it_lies() {
        let src: SocketAddr = "10.1.0.1:49152".parse().unwrap();
        let dst: SocketAddr = "10.1.0.2:4791".parse().unwrap();
        let ident = Some(Ipv4Ident {
            ident: 7,
            dont_frag: true,
        });
        let mut spare = vec![0u8; RX_BUF_LEN];
        let mut packets = Vec::new();
        for room in [64, 28, 27, 0] {
            let (mut buf, bytes) = datagram(room);
            let inside = buf.as_ptr_range();
            let mut d = RxDatagram::new(src, dst, 0x02, ident, &mut buf, room);
            let p = rebuild_ip(&mut d, &mut spare).unwrap();
            let in_place = inside.contains(&p.packet.as_ptr());
            assert_eq!(in_place, room >= 28, "room {room}");
            assert_eq!(p.bth, 28);
            assert_eq!(&p.packet[28..], &bytes[..]);
            let ip = Ipv4Packet::new_checked(p.packet).unwrap();
            assert_eq!(ip.ident(), 7);
            assert_eq!(usize::from(ip.total_len()), 28 + bytes.len());
            assert!(ip.verify_checksum());
            packets.push(p.packet.to_vec());
        }
        assert!(
            packets.windows(2).all(|w| w[0] == w[1]),
            "in place or copied alike"
        );
    }

    #[test]
    fn ipv6_headers_are_rebuilt_in_front_too() {
        let src: SocketAddr = "[fd00::1]:49152".parse().unwrap();
        let dst: SocketAddr = "[fd00::2]:4791".parse().unwrap();
        let mut spare = vec![0u8; RX_BUF_LEN];
        let (mut buf, bytes) = datagram(48);
        let inside = buf.as_ptr_range();
        let mut d = RxDatagram::new(src, dst, 0x02, None, &mut buf, 48);
        let p = rebuild_ip(&mut d, &mut spare).unwrap();
        assert!(inside.contains(&p.packet.as_ptr()));
        assert_eq!(p.bth, 48);
        assert_eq!(&p.packet[48..], &bytes[..]);
        let ip = Ipv6Packet::new_checked(p.packet).unwrap();
        assert_eq!(usize::from(ip.payload_len()), 8 + bytes.len());
    }
}
