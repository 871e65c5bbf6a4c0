//! RoCE v2 through the kernel's UDP sockets: the [`Link`] of `--addr` and `--netdev` devices.
//!
//! The kernel writes the IP and UDP headers, so the link seals each engine packet's ICRC for
//! the headers the kernel will write (its own source port, the Identification an unconnected
//! DF socket sends), and on receive rebuilds the headers the packet had on the wire in front
//! of each verified datagram, because the engine wants whole IP packets and the ICRC covers
//! them ([`crate::net::RxVerifier`] recovered the IPv4 Identification).
//!
//! Multicast groups each get a socket of their own ([`MulticastGroup`]); those sockets are
//! read by polling, so an idle device that holds a group wakes every [`GROUP_POLL`].

use super::link::{Link, RxPacket};
use super::{
    MulticastGroup, NetConfig, NetCounters, PacketBuilder, RxDatagram, RxVerdict, RxVerifier,
    TxMeta, UdpTransport, MAX_ROCE_PACKET,
};
use proto::transport::Transmit;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::RawFd;
use std::time::Duration;
use tracing::{debug, info, warn};

/// The longest an idle device sleeps while it has joined multicast groups: their sockets are
/// polled between waits (the packet driver waits on the main sockets only).
pub const GROUP_POLL: Duration = Duration::from_millis(2);
/// The receive buffer: a received packet with its IP and UDP headers rebuilt in front (and,
/// for the multicast group sockets, the datagram as received, in the back half).
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
    /// The link's own drops ([`NetCounters::rx_not_our_address`], `rx_group_refused`).
    not_our_address: u64,
    group_refused: u64,
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
                        && std::time::Instant::now() < grace =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                r => break r,
            }
        }
        .map_err(|e| anyhow::anyhow!("device {}: opening UDP port {port}: {e}", cfg.name))?;
        if let Some(reason) = net.fallback_reason() {
            warn!(device = %cfg.name, "io_uring unavailable, using system calls: {reason}");
        }
        net.set_wake_fd(cfg.wake_fd);
        info!(device = %cfg.name, backend = ?net.backend(), ?ipv4, ?ipv6, "packet I/O ready");
        Ok(UdpLink {
            net,
            addrs: cfg.addrs.to_vec(),
            groups: HashMap::new(),
            group_verifier: RxVerifier::new(),
            rx_buf: vec![0u8; RX_BUF_LEN],
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

    /// Takes the datagrams the group sockets received from other devices and hands them on
    /// as the main sockets' are. The device's own sends, looped back by the kernel, are
    /// dropped: its QPs got them from the local path already.
    fn poll_groups(&mut self, deliver: &mut dyn FnMut(&RxPacket<'_>)) -> usize {
        let mut delivered = 0;
        // Datagrams land in the back half of the receive buffer and are rebuilt into its
        // front half. One byte beyond the longest RoCE packet, so that a longer datagram
        // shows as too long.
        let (front, back) = self.rx_buf.split_at_mut(RX_BUF_LEN / 2);
        let buf = &mut back[..MAX_ROCE_PACKET + 1];
        for socket in self.groups.values() {
            while let Some((src, n)) = socket.recv(buf) {
                if self.addrs.contains(&src.ip()) {
                    continue;
                }
                let Some(bytes) = buf.get(..n) else {
                    continue;
                };
                let dst = socket.group();
                let RxVerdict::Good { ipv4 } = self.group_verifier.verify(src, dst, bytes) else {
                    self.group_refused += 1;
                    debug!(%src, %dst, "multicast datagram refused by verification");
                    continue;
                };
                let d = RxDatagram {
                    src,
                    dst,
                    tos: 0,
                    bytes,
                    ipv4,
                };
                if let Some(p) = rebuild_ip(&d, front) {
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
        let _ = self.net.poll(Some(wait), &mut |d: &RxDatagram<'_>| {
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
        let (tos, ttl) = match t.src {
            IpAddr::V4(_) => (frame[1], frame[8]),
            IpAddr::V6(_) => (
                ((u16::from_be_bytes([frame[0], frame[1]]) >> 4) & 0xff) as u8,
                frame[7],
            ),
        };
        let builder = PacketBuilder::new(t.src, t.dst, self.local_port(t.src));
        let transport = &mut frame[t.transport_offset..];
        let meta = TxMeta {
            dst: SocketAddr::new(t.dst, proto::wire::ROCE_V2_PORT),
            src: Some(t.src),
            tos,
            ttl: Some(ttl),
            segment_size: None,
        };
        if let Err(e) = self.net.push_packet(&meta, &builder, transport) {
            debug!(src = %t.src, dst = %t.dst, "send failed: {e}");
        }
    }

    fn send_gsi(&mut self, src: IpAddr, dst: IpAddr, packet: &mut [u8]) {
        if PacketBuilder::new(src, dst, self.local_port(src))
            .seal(0, packet)
            .is_err()
        {
            return;
        }
        let meta = TxMeta {
            dst: SocketAddr::new(dst, proto::wire::ROCE_V2_PORT),
            src: Some(src),
            tos: 0,
            ttl: Some(64),
            segment_size: None,
        };
        if let Err(e) = self.net.send(&meta, packet) {
            debug!(%src, %dst, "CM MAD send failed: {e}");
        }
    }

    fn flush(&mut self) {
        let _ = self.net.flush();
    }

    fn set_addresses(&mut self, addrs: &[IpAddr]) {
        self.addrs = addrs.to_vec();
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

    fn counters(&self) -> NetCounters {
        NetCounters {
            rx_not_our_address: self.not_our_address,
            rx_group_refused: self.group_refused,
            ..self.net.counters()
        }
    }
}

/// Rebuilds the IPv4 or IPv6 and UDP headers of a verified datagram in front of its bytes, as
/// they were on the wire (the ICRC covers them), into `out`.
fn rebuild_ip<'a>(d: &RxDatagram<'_>, out: &'a mut [u8]) -> Option<RxPacket<'a>> {
    use proto::wire::{Ipv4Repr, Ipv6Repr, UdpRepr};
    let udp = UdpRepr {
        src_port: d.src.port(),
        dst_port: d.dst.port(),
        checksum: 0,
        payload_len: d.bytes.len(),
    };
    let (hl, total) = match (d.src.ip(), d.dst.ip()) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => {
            let id = d.ipv4?;
            let ip = Ipv4Repr {
                src,
                dst,
                tos: d.tos,
                ident: id.ident,
                dont_frag: id.dont_frag,
                ttl: 64,
                protocol: 17,
                payload_len: 8 + d.bytes.len(),
            };
            let total = 20 + 8 + d.bytes.len();
            if out.len() < total {
                return None;
            }
            ip.emit(&mut out[..20]);
            (20, total)
        }
        (IpAddr::V6(src), IpAddr::V6(dst)) => {
            let ip = Ipv6Repr {
                src,
                dst,
                traffic_class: d.tos,
                flow_label: 0,
                next_header: 17,
                hop_limit: 64,
                payload_len: 8 + d.bytes.len(),
            };
            let total = 40 + 8 + d.bytes.len();
            if out.len() < total {
                return None;
            }
            ip.emit(&mut out[..40]);
            (40, total)
        }
        _ => return None,
    };
    udp.emit(&mut out[hl..hl + 8]);
    out[hl + 8..total].copy_from_slice(d.bytes);
    Some(RxPacket {
        gid_type: proto::transport::GidType::RoceV2,
        src: d.src.ip(),
        dst: d.dst.ip(),
        packet: &out[..total],
        bth: hl + 8,
    })
}
