//! Addresses, ports and routes: which device serves an address, binding a port (one namespace
//! per port space), address and route resolution, listening, and multicast joins; the rules
//! by which a listener takes a request and two bindings overlap.

use super::ids::{Id, Role};
use super::requests::{done, error, Reply};
use super::{random_u32, CmService};
use crate::gsi::ToDevice;
use crate::net::kernel_neighbour::{self, NextHop};
use proto::cm::rdma_cm::{self as rc, PortSpace, RdmaCmEventType as Ev};
use proto::ctl::{self, CmPathInfo, CmUdParam, RoceVersion};
use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// Ephemeral rdma_cm ports, Linux's default `ip_local_port_range`.
const EPHEMERAL: std::ops::RangeInclusive<u16> = 32768..=60999;
/// The hop limit of a RoCE route (the route's default, facts §7.2).
pub(super) const ROUTE_HOP_LIMIT: u8 = 64;

/// The port space an id was created in (`RDMA_PS_*`).
pub(super) fn ps_of(ps: u16) -> Option<PortSpace> {
    PortSpace::from_u16(ps)
}

/// The IP address of a RoCE v2 GID (`::ffff:a.b.c.d` is IPv4).
pub(super) fn gid_ip(gid: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(gid);
    v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
}

/// 127.0.0.1 and ::1, "this host": a device that does not serve them itself takes them as its
/// own address. (Other 127.x.y.z addresses may be other daemons on the same host.)
fn is_this_host(ip: IpAddr) -> bool {
    ip == IpAddr::V4(Ipv4Addr::LOCALHOST) || ip == IpAddr::V6(Ipv6Addr::LOCALHOST)
}

/// Whether the kernel routes from `local` to `peer`: a UDP socket bound to `local` connects
/// to the peer, which looks the route up and sends nothing. The kernel's `addr_resolve` asks
/// the routing table before anything else, so that a peer no route reaches fails
/// `rdma_resolve_addr` itself (ENETUNREACH; EHOSTUNREACH or EACCES for an unreachable or
/// prohibit route), not a connection whose REQs go nowhere until the CM's retries run out,
/// a minute later.
/// A link-local peer (its route is the interface's, named by a scope the GID does not carry),
/// a multicast group (`mckey` resolves the group's address: the daemon joins it on the
/// device's own sockets, and a namespace's multicast route can trail its address by a
/// moment) and a source the kernel does not have here (nothing to ask with) pass.
fn route_reaches(local: IpAddr, peer: IpAddr) -> Result<(), (i32, String)> {
    if group_or_link_local(peer) {
        return Ok(());
    }
    let Ok(socket) = std::net::UdpSocket::bind(SocketAddr::new(local, 0)) else {
        return Ok(());
    };
    socket
        .connect(SocketAddr::new(peer, proto::wire::ROCE_V2_PORT))
        .map_err(|e| {
            (
                e.raw_os_error().unwrap_or(libc::ENETUNREACH),
                format!("no route from {local} to {peer}: {e}"),
            )
        })
}

/// A multicast group or a link-local peer: address resolution asks neither a route nor a
/// neighbour for it ([`route_reaches`]).
fn group_or_link_local(peer: IpAddr) -> bool {
    peer.is_multicast() || matches!(peer, IpAddr::V6(v6) if v6.is_unicast_link_local())
}

/// How often a resolution that waits for its neighbour looks at the kernel's table again
/// (the kernel's rdma_cm hears of the neighbour's change at once; an answering neighbour
/// takes well under a millisecond on one link).
const NEIGHBOUR_POLL: Duration = Duration::from_millis(5);

/// An id's addressing (device, source, destination, wire peer), kept to put back when a
/// resolution fails.
type Addressing = (
    Option<usize>,
    Option<SocketAddr>,
    Option<SocketAddr>,
    Option<IpAddr>,
);

/// The neighbour a resolution waits for.
#[derive(Debug, Clone, Copy)]
enum Awaited {
    /// The next hop in the kernel's neighbour table (a device whose packets it routes).
    Kernel(NextHop),
    /// The peer in the L2 device's own neighbour cache.
    Device { device: usize, peer: IpAddr },
}

/// An address resolution waiting for its next hop's neighbour (`dst_fetch_ha`'s
/// `-ENODATA`), until `deadline` (the call's `timeout_ms`).
pub(super) struct Resolving {
    h: u32,
    dst: SocketAddr,
    awaited: Awaited,
    before: Option<Addressing>,
    deadline: Instant,
    next_check: Instant,
}

/// Whether a listener bound to `bound` takes a request for `dst` (cma's address match).
pub(super) fn listener_takes(bound: IpAddr, afonly: bool, dst: IpAddr) -> bool {
    if bound.is_unspecified() {
        return match bound {
            IpAddr::V4(_) => dst.is_ipv4(),
            IpAddr::V6(_) => dst.is_ipv6() || !afonly,
        };
    }
    bound == dst
}

/// Whether two bindings of one port overlap: the same address, or a wildcard that covers the
/// other (the IPv6 wildcard covers IPv4 too).
fn overlaps(a: IpAddr, b: IpAddr) -> bool {
    let covers = |w: IpAddr, x: IpAddr| w.is_unspecified() && (w.is_ipv6() || x.is_ipv4());
    a == b || covers(a, b) || covers(b, a)
}

impl CmService {
    /// The devices a listener bound to `device` listens on: that one, or every device when
    /// it is bound to none (a wildcard).
    pub(super) fn listen_devices(&self, device: Option<usize>) -> Vec<usize> {
        match device {
            Some(d) => vec![d],
            None => (0..self.devices.len()).collect(),
        }
    }

    /// The device that serves `ip`: the device owning it; for loopback the first device with
    /// an address of that family; else the first device of the family.
    fn device_for(&self, ip: IpAddr) -> Option<usize> {
        if let Some(d) = self.devices.iter().position(|d| d.addrs.contains(&ip)) {
            return Some(d);
        }
        self.devices
            .iter()
            .position(|d| d.addrs.iter().any(|a| a.is_ipv4() == ip.is_ipv4()))
    }

    /// The GID type of an id's connection: the REQ's on the passive side, else its device's
    /// `default_roce_mode`.
    pub(super) fn id_version(&self, x: &Id) -> RoceVersion {
        x.gid_type.unwrap_or_else(|| {
            x.device
                .and_then(|d| self.devices.get(d))
                .map_or(RoceVersion::V2, |d| d.setup.default_roce_mode)
        })
    }

    /// The device address an id's traffic leaves from: its bound address when the device owns
    /// it (a device of several addresses answers from the one that was asked: rxe checks an RC
    /// packet's source against the QP's path), else the device's address toward the peer.
    pub(super) fn local_ip(&self, x: &Id) -> Option<IpAddr> {
        if x.wire_local.is_some() {
            return x.wire_local;
        }
        let dev = &self.devices[x.device?];
        if let Some(s) = x.src {
            let same_family = x.peer_ip.is_none_or(|p| p.is_ipv4() == s.ip().is_ipv4());
            if dev.addrs.contains(&s.ip()) && same_family {
                return Some(s.ip());
            }
        }
        match (x.peer_ip, x.src) {
            (Some(p), _) => dev.local_for(p),
            (None, Some(s)) => dev.local_for(s.ip()),
            _ => None,
        }
    }

    /// Reserves `addr` (port 0: an ephemeral port) in the id's port space.
    pub(super) fn bind(&mut self, h: u32, addr: SocketAddr) -> Result<(), (i32, String)> {
        let Some(x) = self.ids.get(&h) else {
            return Err((libc::EINVAL, "no such id".into()));
        };
        if x.port.is_some() {
            return Err((libc::EINVAL, "the id is already bound".into()));
        }
        let device = if addr.ip().is_unspecified() {
            None
        } else {
            match self.device_for(addr.ip()) {
                Some(d) if self.devices[d].addrs.contains(&addr.ip()) => Some(d),
                // "This host" binds to a device serving loopback addresses. Without one, the
                // id is bound to no device, as a wildcard bind (and as librdmacm reports it
                // on a kernel whose RDMA devices sit on network interfaces: `id->verbs` stays
                // NULL): libfabric's verbs provider binds "localhost" to find its listening
                // address and, given no device, takes the device's interface addresses
                // instead. Binding it to the device made every libfabric server listen on
                // 127.0.0.1, which no other host can reach.
                Some(d)
                    if is_this_host(addr.ip())
                        && self.devices[d].addrs.iter().any(|a| a.is_loopback()) =>
                {
                    Some(d)
                }
                _ if is_this_host(addr.ip()) => None,
                _ => {
                    return Err((
                        libc::EADDRNOTAVAIL,
                        format!("no device has the address {}", addr.ip()),
                    ))
                }
            }
        };
        let (ps, reuse) = (x.ps, x.reuse);
        let taken = |port: u16| {
            self.ids.iter().any(|(oh, o)| {
                *oh != h
                    && o.ps == ps
                    && o.port == Some(port)
                    && o.src.is_some_and(|s| overlaps(s.ip(), addr.ip()))
                    && !(reuse && o.reuse && o.role != Role::Listen)
            })
        };
        let port = if addr.port() == 0 {
            let span = u32::from(EPHEMERAL.end() - EPHEMERAL.start()) + 1;
            let first = random_u32() % span;
            let Some(p) = (0..span)
                .map(|i| EPHEMERAL.start() + ((first + i) % span) as u16)
                .find(|p| !taken(*p))
            else {
                return Err((libc::EADDRNOTAVAIL, "no ephemeral port left".into()));
            };
            p
        } else if taken(addr.port()) {
            return Err((libc::EADDRINUSE, format!("port {} is in use", addr.port())));
        } else {
            addr.port()
        };
        if let Some(x) = self.ids.get_mut(&h) {
            x.port = Some(port);
            x.src = Some(SocketAddr::new(addr.ip(), port));
            x.device = device;
        }
        Ok(())
    }

    pub(super) fn resolve_addr(
        &mut self,
        h: u32,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout_ms: u32,
    ) -> Reply {
        let bound = self.ids.get(&h).and_then(|x| x.src);
        if bound.is_none() {
            let any = match dst.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            };
            let want = src.unwrap_or(SocketAddr::new(any, 0));
            if let Err((errno, why)) = self.bind(h, want) {
                return error(errno, why);
            }
        }
        let before = self
            .ids
            .get(&h)
            .map(|x| (x.device, x.src, x.dst, x.peer_ip));
        let mut m = Self::event(Ev::AddrResolved, 0);
        match self.pick_route(h, dst) {
            Ok(()) => {
                // No route is the call's own error, as `rdma_resolve_ip` returns it before
                // queueing anything (what fails later, the device, is an ADDR_ERROR event):
                // the id stays bound, unresolved.
                if let Err((errno, why)) = self.check_route(h) {
                    self.restore(h, before);
                    warn!(id = h, %dst, "address resolution failed: {why}");
                    return error(errno, why);
                }
                // The next hop's link-layer address, as the kernel's `dst_fetch_ha` wants
                // it: ADDR_RESOLVED when the neighbour answers (`poll_resolutions`).
                self.resolving.retain(|r| r.h != h);
                if let Some(awaited) = self.neighbour_to_wait_for(h) {
                    let now = Instant::now();
                    self.resolving.push(Resolving {
                        h,
                        dst,
                        awaited,
                        before,
                        deadline: now + Duration::from_millis(timeout_ms.into()),
                        next_check: now + NEIGHBOUR_POLL,
                    });
                    return done();
                }
            }
            Err((errno, why)) => {
                warn!(id = h, %dst, "address resolution failed: {why}");
                m = Self::event(Ev::AddrError, -errno);
            }
        }
        self.emit(h, m);
        done()
    }

    /// Puts an id's addressing back as it was before a resolution that failed: the id stays
    /// bound, unresolved.
    fn restore(&mut self, h: u32, before: Option<Addressing>) {
        if let (Some(x), Some(b)) = (self.ids.get_mut(&h), before) {
            (x.device, x.src, x.dst, x.peer_ip) = b;
        }
    }

    /// The neighbour an id's resolution waits for (`addr_resolve_neigh`): none when the
    /// peer is the device's own, a multicast group or link-local ([`route_reaches`] leaves
    /// those alone too), or its address is known already; none either when the kernel
    /// routes the device's packets and its packets need no neighbour or the kernel cannot
    /// be asked (then the resolution does not wait, as before). Otherwise the device (the
    /// L2 device's thread) or the kernel has been asked to resolve it.
    fn neighbour_to_wait_for(&self, h: u32) -> Option<Awaited> {
        let (d, peer) = self.remote_peer(h)?;
        if group_or_link_local(peer) {
            return None;
        }
        let dev = &self.devices[d];
        if let Some(board) = &dev.setup.neighbours {
            if board.is_resolved(peer) {
                return None;
            }
            // A device gone answers nothing: the call times out, as on a kernel whose
            // netdev went.
            (dev.send)(ToDevice::Solicit(peer));
            return Some(Awaited::Device { device: d, peer });
        }
        let (local, peer) = self.kernel_routed_path(h)?;
        let asked = kernel_neighbour::next_hop(local, peer).and_then(|hop| match hop {
            Some(hop) if !kernel_neighbour::is_valid(hop)? => {
                kernel_neighbour::solicit(hop, local, peer)?;
                Ok(Some(Awaited::Kernel(hop)))
            }
            _ => Ok(None),
        });
        asked.unwrap_or_else(|e| {
            if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)) {
                // Said once: the operator can fix it, and it holds for every resolution.
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    warn!(
                        "rdma_cm cannot ask the kernel to resolve a neighbour ({e}): an \
                         address on the link that nobody answers fails only when ib_cm's \
                         retries run out. Give the daemon CAP_NET_ADMIN, or allow it ping \
                         sockets (sysctl net.ipv4.ping_group_range)"
                    )
                });
            }
            debug!(id = h, %peer, "no neighbour check ({e}): resolved without it");
            None
        })
    }

    /// Resolutions whose neighbour answered (`ADDR_RESOLVED`) or whose time ran out
    /// (`ADDR_ERROR`, `-ETIMEDOUT`, the id bound again, as `process_one_req` reports it).
    /// A resolution of an id that was destroyed or resolved anew is forgotten.
    pub(super) fn poll_resolutions(&mut self) {
        let now = Instant::now();
        if self.resolving.iter().all(|r| r.next_check > now) {
            return;
        }
        // Read once for all the resolutions due, when one waits for the kernel; a table that
        // cannot be read any more does not hold the ids back.
        let mut kernel: Option<Option<HashSet<NextHop>>> = None;
        let mut i = 0;
        while i < self.resolving.len() {
            let r = &self.resolving[i];
            if r.next_check > now {
                i += 1;
                continue;
            }
            if self.ids.get(&r.h).is_none_or(|x| x.dst != Some(r.dst)) {
                self.resolving.swap_remove(i);
                continue;
            }
            let valid = match r.awaited {
                Awaited::Kernel(hop) => kernel
                    .get_or_insert_with(|| kernel_neighbour::valid_neighbours().ok())
                    .as_ref()
                    .is_none_or(|v| v.contains(&hop)),
                Awaited::Device { device, peer } => self
                    .devices
                    .get(device)
                    .and_then(|d| d.setup.neighbours.as_ref())
                    .is_none_or(|b| b.is_resolved(peer)),
            };
            if !valid && now < r.deadline {
                self.resolving[i].next_check = (now + NEIGHBOUR_POLL).min(r.deadline);
                i += 1;
                continue;
            }
            let r = self.resolving.swap_remove(i);
            let m = if valid {
                Self::event(Ev::AddrResolved, 0)
            } else {
                warn!(
                    id = r.h,
                    dst = %r.dst,
                    awaited = ?r.awaited,
                    "address resolution failed: the neighbour did not answer in time"
                );
                self.restore(r.h, r.before);
                Self::event(Ev::AddrError, -libc::ETIMEDOUT)
            };
            self.emit(r.h, m);
        }
    }

    /// Whether the id's address resolution waits for its neighbour (the kernel's
    /// `RDMA_CM_ADDR_QUERY` state).
    pub(super) fn resolving_address(&self, h: u32) -> bool {
        self.resolving.iter().any(|r| r.h == h)
    }

    /// When [`poll_resolutions`](Self::poll_resolutions) has something to check next.
    pub(super) fn next_resolution_check(&self) -> Option<Instant> {
        self.resolving.iter().map(|r| r.next_check).min()
    }

    /// Address resolution proper: the device, the source address, the wire peer.
    fn pick_route(&mut self, h: u32, dst: SocketAddr) -> Result<(), (i32, String)> {
        let x = self
            .ids
            .get(&h)
            .ok_or((libc::EINVAL, "no id".to_string()))?;
        let d = match x.device {
            Some(d) => d,
            None => self
                .device_for(dst.ip())
                .ok_or((libc::ENETUNREACH, format!("no device reaches {}", dst.ip())))?,
        };
        let dev = &self.devices[d];
        if !dev
            .setup
            .info
            .gids
            .iter()
            .any(|g| g.roce == dev.setup.default_roce_mode)
        {
            return Err((
                libc::EINVAL,
                format!(
                    "device {} has no RoCE {} GID (default_roce_mode)",
                    dev.setup.info.name, dev.setup.default_roce_mode
                ),
            ));
        }
        let peer = if is_this_host(dst.ip()) && !dev.addrs.contains(&dst.ip()) {
            // Loopback is the device itself: its own address carries the traffic.
            dev.local_for(dst.ip())
                .ok_or((libc::ENETUNREACH, "no address of that family".to_string()))?
        } else {
            dst.ip()
        };
        let local = dev
            .local_for(peer)
            .ok_or((libc::ENETUNREACH, "no address of that family".to_string()))?;
        let x = self
            .ids
            .get_mut(&h)
            .ok_or((libc::EINVAL, "no id".to_string()))?;
        let port = x.port.unwrap_or(0);
        let src_ip = match x.src {
            Some(s) if !s.ip().is_unspecified() => s.ip(),
            _ if is_this_host(dst.ip()) && peer != dst.ip() => dst.ip(),
            _ => local,
        };
        x.device = Some(d);
        x.src = Some(SocketAddr::new(src_ip, port));
        x.dst = Some(dst);
        x.peer_ip = Some(peer);
        Ok(())
    }

    /// That a route reaches the resolved peer: on a device whose packets the kernel routes,
    /// from the address the id's traffic leaves ([`route_reaches`]); on the L2 device, which
    /// has no router, the peer is on its link.
    fn check_route(&self, h: u32) -> Result<(), (i32, String)> {
        if let Some((local, peer)) = self.kernel_routed_path(h) {
            return route_reaches(local, peer);
        }
        let Some((d, peer)) = self.remote_peer(h) else {
            return Ok(());
        };
        let dev = &self.devices[d];
        match &dev.setup.neighbours {
            Some(board) if !board.on_link(peer) && !group_or_link_local(peer) => Err((
                libc::ENETUNREACH,
                format!(
                    "{peer} is not on the link of {} (no router)",
                    dev.setup.info.name
                ),
            )),
            _ => Ok(()),
        }
    }

    /// The device of a resolved id and its wire peer, when the peer is another host (not
    /// an address of the device). An IPv4 peer may come as `::ffff:a.b.c.d` (a program's
    /// IPv6 socket address): it is compared and asked for as IPv4.
    fn remote_peer(&self, h: u32) -> Option<(usize, IpAddr)> {
        let x = self.ids.get(&h)?;
        let (d, peer) = (x.device?, x.peer_ip?.to_canonical());
        (!self.devices[d].addrs.contains(&peer)).then_some((d, peer))
    }

    /// The (source, peer) of a resolved id whose packets the kernel routes to another host:
    /// on a device with `kernel_routes`, toward a peer that is not the device's own.
    fn kernel_routed_path(&self, h: u32) -> Option<(IpAddr, IpAddr)> {
        let (d, peer) = self.remote_peer(h)?;
        let x = self.ids.get(&h)?;
        let local = self.local_ip(x).or(x.src.map(|s| s.ip()))?.to_canonical();
        self.devices[d].setup.kernel_routes.then_some((local, peer))
    }

    pub(super) fn resolve_route(&mut self, h: u32) -> Reply {
        let Some(x) = self.ids.get(&h) else {
            return error(libc::EINVAL, "no such id");
        };
        // As the kernel's: the route comes after ADDR_RESOLVED, not during the query.
        if self.resolving_address(h) {
            return error(libc::EINVAL, "the address is being resolved");
        }
        let (Some(d), Some(src), Some(dst), Some(peer)) = (x.device, x.src, x.dst, x.peer_ip)
        else {
            return error(libc::EINVAL, "the address is not resolved");
        };
        let local = self.local_ip(x).unwrap_or(src.ip());
        let dev = &self.devices[d];
        let flow_label = match dst {
            SocketAddr::V6(v6) if v6.flowinfo() & 0xfffff != 0 => v6.flowinfo() & 0xfffff,
            _ => rc::rdma_flow_label(src.port(), dst.port()),
        };
        let path = CmPathInfo {
            sgid: ctl::gid_of(local),
            dgid: ctl::gid_of(peer),
            flow_label,
            hop_limit: ROUTE_HOP_LIMIT,
            traffic_class: x.tos.unwrap_or(0),
            sl: 0,
            pkey: 0xffff,
            mtu: dev.setup.info.active_mtu,
            rate: 0,
            packet_life_time: x
                .ack_timeout
                .map_or(rc::CMA_IBOE_PACKET_LIFETIME, |t| t.saturating_sub(1)),
        };
        if let Some(x) = self.ids.get_mut(&h) {
            x.path = Some(path);
        }
        self.emit(h, Self::event(Ev::RouteResolved, 0));
        done()
    }

    pub(super) fn listen(&mut self, h: u32) -> Reply {
        if self.ids.get(&h).is_some_and(|x| x.port.is_none()) {
            if let Err((errno, why)) =
                self.bind(h, SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0))
            {
                return error(errno, why);
            }
        }
        let Some(x) = self.ids.get(&h) else {
            return error(libc::EINVAL, "no such id");
        };
        if x.role != Role::Idle {
            return error(libc::EINVAL, "the id is not idle");
        }
        let (Some(ps), Some(port)) = (ps_of(x.ps), x.port) else {
            return error(libc::EINVAL, "unsupported port space");
        };
        let sid = rc::service_id(ps, port);
        for d in self.listen_devices(x.device) {
            let n = self.listens.entry((d, sid)).or_insert(0);
            if *n == 0 {
                let _ = self.devices[d].endpoint.listen(sid);
            }
            *n += 1;
        }
        if let Some(x) = self.ids.get_mut(&h) {
            x.role = Role::Listen;
        }
        done()
    }

    /// RoCE multicast needs no SA: the group's GID is its address (v4-mapped for IPv4), the
    /// Q_Key rdma_cm's. The shim attaches its QP itself.
    pub(super) fn join_mcast(&mut self, h: u32, addr: SocketAddr) -> Reply {
        if !addr.ip().is_multicast() {
            return error(libc::EINVAL, "not a multicast address");
        }
        if self.ids.get(&h).is_some_and(|x| x.device.is_none()) {
            if let Err((errno, why)) = self.pick_route(h, addr) {
                return error(errno, why);
            }
        }
        let mut ah = self.ah_of(h);
        ah.dgid = ctl::gid_of(addr.ip());
        let mut m = Self::event(Ev::MulticastJoin, 0);
        m.ud = Some(CmUdParam {
            ah_attr: ah,
            qp_num: 0xff_ffff,
            qkey: rc::RDMA_UDP_QKEY,
        });
        self.emit(h, m);
        done()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::test_support::*;
    use proto::ctl::{cm_ps, qp_type, CmConnParam, Request, Response};

    /// On a device that resolves its neighbours itself (the L2 device) the resolution
    /// waits for its answer: the id is in ADDR_QUERY meanwhile (its route refused, as the
    /// kernel's), ADDR_RESOLVED once the device publishes the peer; a peer that never
    /// answers is ADDR_ERROR -ETIMEDOUT at the call's deadline; one off the device's link is
    /// refused at once.
    #[test]
    fn resolution_waits_for_the_devices_neighbour() {
        use crate::net::neighbour_board::NeighbourBoard;
        use proto::iface::IpCidr;
        use std::sync::Arc;
        let board = Arc::new(NeighbourBoard::new(vec![IpCidr::new(
            "10.9.0.1".parse().unwrap(),
            24,
        )]));
        let (mut svc, _wire, solicited) =
            service_with_board(&["10.9.0.1"], RoceVersion::V2, Some(Arc::clone(&board)));
        let (ch, fd) = channel(&mut svc, 1);
        let state = |svc: &CmService, h: u32| {
            let ids = svc.list_ids();
            ids.iter()
                .find(|(_, r)| r.id == h)
                .map(|(_, r)| r.state.clone())
        };
        let a = id(&mut svc, 1, ch, cm_ps::TCP, qp_type::RC);
        ok(&mut svc, 1, resolve_addr_to(a, sa("10.9.0.2:7174")));
        let peer: IpAddr = "10.9.0.2".parse().unwrap();
        assert_eq!(*solicited.lock().unwrap(), vec![peer]);
        svc.poll_resolutions();
        assert!(events(&fd).is_empty());
        assert_eq!(state(&svc, a).as_deref(), Some("ADDR_QUERY"));
        assert_eq!(errno_of(call(&mut svc, 1, resolve_route(a))), libc::EINVAL);
        board.publish([peer].into_iter());
        std::thread::sleep(NEIGHBOUR_POLL * 2);
        svc.poll_resolutions();
        assert_eq!(kinds(&events(&fd)), vec![Ev::AddrResolved as u32]);
        ok(&mut svc, 1, resolve_route(a));
        assert_eq!(kinds(&events(&fd)), vec![Ev::RouteResolved as u32]);

        let b = id(&mut svc, 1, ch, cm_ps::TCP, qp_type::RC);
        let quick = Request::CmResolveAddr {
            id: b,
            src: None,
            dst: sa("10.9.0.3:7174"),
            timeout_ms: 1,
        };
        ok(&mut svc, 1, quick);
        std::thread::sleep(NEIGHBOUR_POLL * 2);
        svc.poll_resolutions();
        let evs = events(&fd);
        assert_eq!(kinds(&evs), vec![Ev::AddrError as u32]);
        assert_eq!(evs[0].status, -libc::ETIMEDOUT);
        assert_eq!(state(&svc, b).as_deref(), Some("ADDR_BOUND"));

        let c = id(&mut svc, 1, ch, cm_ps::TCP, qp_type::RC);
        let off_link = call(&mut svc, 1, resolve_addr_to(c, sa("10.99.0.1:7174")));
        assert_eq!(errno_of(off_link), libc::ENETUNREACH);
        assert_eq!(solicited.lock().unwrap().len(), 2);
    }

    #[test]
    fn ports_are_one_namespace_per_port_space() {
        let (mut svc, _) = service(&["127.0.0.1", "::1"], RoceVersion::V2);
        let (ch, _fd) = channel(&mut svc, 1);
        let a = id(&mut svc, 1, ch, cm_ps::TCP, qp_type::RC);
        let b = id(&mut svc, 1, ch, cm_ps::TCP, qp_type::RC);
        let u = id(&mut svc, 1, ch, cm_ps::UDP, qp_type::UD);
        let e = id(&mut svc, 1, ch, cm_ps::TCP, qp_type::RC);
        ok(&mut svc, 1, bind_to(a, "0.0.0.0:7000"));
        let r = call(&mut svc, 1, bind_to(b, "127.0.0.1:7000"));
        assert_eq!(
            errno_of(r),
            libc::EADDRINUSE,
            "a wildcard covers every address"
        );
        ok(&mut svc, 1, bind_to(b, "[::1]:7000"));
        ok(&mut svc, 1, bind_to(u, "127.0.0.1:7000"));
        let Response::CmIdInfo(info) = ok(&mut svc, 1, bind_to(e, "127.0.0.1:0")) else {
            panic!()
        };
        let port = info.src_addr.unwrap().port();
        assert!(EPHEMERAL.contains(&port) && port != 7000, "{port}");
        assert_eq!(info.device.as_deref(), Some("srxe0"));
        assert_eq!(info.gid_type, Some(RoceVersion::V2));
        let f = id(&mut svc, 1, ch, cm_ps::TCP, qp_type::RC);
        let r = call(&mut svc, 1, bind_to(f, "10.9.9.9:1"));
        assert_eq!(errno_of(r), libc::EADDRNOTAVAIL);
        // Ids are their client's: another client cannot use or destroy them.
        assert_eq!(
            errno_of(call(&mut svc, 9, Request::CmDestroyId { id: a })),
            libc::EINVAL
        );
        assert_eq!(
            errno_of(call(&mut svc, 1, Request::CmDestroyChannel { channel: ch })),
            libc::EBUSY
        );
        // Its client gone, the port is free again.
        svc.client_gone(1);
        let (ch2, _fd2) = channel(&mut svc, 3);
        let g = id(&mut svc, 3, ch2, cm_ps::TCP, qp_type::RC);
        ok(&mut svc, 3, bind_to(g, "127.0.0.1:7000"));
    }

    #[test]
    fn a_mode_the_device_lacks_is_an_address_error() {
        let (mut svc, _) = service(&["127.0.0.1"], RoceVersion::V1);
        let (ch, fd) = channel(&mut svc, 1);
        let a = id(&mut svc, 1, ch, cm_ps::TCP, qp_type::RC);
        ok(&mut svc, 1, resolve_addr_to(a, sa("127.0.0.1:1")));
        let evs = events(&fd);
        assert_eq!(
            (evs[0].event, evs[0].status),
            (Ev::AddrError as u32, -libc::EINVAL)
        );
    }

    #[test]
    fn multicast_join_names_the_group_gid() {
        let (mut svc, _) = service(&["127.0.0.1"], RoceVersion::V2);
        let (ch, fd) = channel(&mut svc, 1);
        let a = id(&mut svc, 1, ch, cm_ps::UDP, qp_type::UD);
        let r = call(
            &mut svc,
            1,
            Request::CmJoinMcast {
                id: a,
                addr: sa("127.0.0.1:0"),
                join_state: 1,
            },
        );
        assert_eq!(errno_of(r), libc::EINVAL);
        ok(
            &mut svc,
            1,
            Request::CmJoinMcast {
                id: a,
                addr: sa("239.1.2.3:0"),
                join_state: 1,
            },
        );
        let evs = events(&fd);
        let ud = evs[0].ud.unwrap();
        assert_eq!(evs[0].event, Ev::MulticastJoin as u32);
        assert_eq!(ud.ah_attr.dgid, ctl::gid_of("239.1.2.3".parse().unwrap()));
        assert_eq!((ud.qp_num, ud.qkey), (0xff_ffff, rc::RDMA_UDP_QKEY));
    }

    /// A device of two addresses: each side's QP talks from the address of the connection
    /// (rxe checks an RC packet's source against the QP's path), not the device's first one.
    #[test]
    fn a_device_of_several_addresses_keeps_each_connection_on_its_own() {
        let (mut svc, wire) = service(&["127.0.0.1", "127.0.0.2"], RoceVersion::V2);
        let (ch, fd) = channel(&mut svc, 1);
        listener(&mut svc, 1, ch, "0.0.0.0:7300");
        let (cch, cfd) = channel(&mut svc, 2);
        let a = id(&mut svc, 2, cch, cm_ps::TCP, qp_type::RC);
        // The active side binds .1 and connects to .2.
        ok(&mut svc, 2, bind_to(a, "127.0.0.1:0"));
        ok(&mut svc, 2, resolve_addr_to(a, sa("127.0.0.2:7300")));
        ok(&mut svc, 2, resolve_route(a));
        ok(
            &mut svc,
            2,
            Request::CmConnect {
                id: a,
                conn: CmConnParam {
                    qp_num: 0x10011,
                    ..CmConnParam::default()
                },
                psn: None,
            },
        );
        settle(&mut svc, &wire);
        let evs = events(&fd);
        let child = evs[0].child.clone().unwrap();
        let (g1, g2) = (
            ctl::gid_of("127.0.0.1".parse().unwrap()),
            ctl::gid_of("127.0.0.2".parse().unwrap()),
        );
        assert_eq!((child.src_gid, child.dst_gid), (g2, g1), "{child:?}");
        let (attr, _) = qp_attr(&mut svc, 1, child.id, 2);
        assert_eq!(attr.ah_attr.dgid, g1);
        assert_eq!(
            u32::from(attr.ah_attr.sgid_index),
            svc.devices[0].gid_index("127.0.0.2".parse().unwrap())
        );
        ok(
            &mut svc,
            1,
            Request::CmAccept {
                id: child.id,
                conn: CmConnParam {
                    qp_num: 0x20011,
                    ..CmConnParam::default()
                },
            },
        );
        settle(&mut svc, &wire);
        assert_eq!(kinds(&events(&cfd)[2..]), vec![Ev::ConnectResponse as u32]);
        let (attr, _) = qp_attr(&mut svc, 2, a, 2);
        assert_eq!(attr.ah_attr.dgid, g2);
        assert_eq!(
            u32::from(attr.ah_attr.sgid_index),
            svc.devices[0].gid_index("127.0.0.1".parse().unwrap())
        );
        assert_ne!(
            svc.devices[0].gid_index("127.0.0.1".parse().unwrap()),
            svc.devices[0].gid_index("127.0.0.2".parse().unwrap())
        );
    }

    #[test]
    fn listener_address_rules() {
        let any4: IpAddr = Ipv4Addr::UNSPECIFIED.into();
        let any6: IpAddr = Ipv6Addr::UNSPECIFIED.into();
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let lo6: IpAddr = "::1".parse().unwrap();
        assert!(listener_takes(any4, false, lo));
        assert!(!listener_takes(any4, false, lo6));
        assert!(listener_takes(any6, false, lo));
        assert!(!listener_takes(any6, true, lo));
        assert!(listener_takes(lo, false, lo));
        assert!(!listener_takes(lo, false, "127.0.0.2".parse().unwrap()));
        assert!(overlaps(any4, lo) && overlaps(lo, lo) && !overlaps(lo, lo6));
        assert!(overlaps(any6, lo) && !overlaps(any4, lo6));
    }
}
