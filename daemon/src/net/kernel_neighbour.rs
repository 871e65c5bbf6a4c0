//! The kernel's neighbour table, asked over rtnetlink, for rdma_cm address resolution on a
//! device whose packets the kernel routes (a UDP device).
//!
//! Kernel rdma_cm resolves an address in full before it reports `ADDR_RESOLVED`: after the
//! route (`addr4_resolve`/`addr6_resolve`) it needs the next hop's link-layer address
//! (`addr_resolve_neigh` → `dst_fetch_ha`). A neighbour that is not valid yet is asked for
//! (`neigh_event_send`: ARP or neighbour solicitation) and the request waits until the
//! neighbour answers or the caller's `timeout_ms` runs out, which is an `ADDR_ERROR` of
//! `-ETIMEDOUT`. So `rping -c -a` to a host that is down fails in the two seconds rping
//! gives resolution, not a minute later when ib_cm's REQs run out of retries.
//!
//! A UDP device never sees the link-layer address (the kernel adds it to every datagram),
//! but it can ask the same questions: [`next_hop`] is `ip route get`, [`is_valid`] is
//! `ip neigh get`, and [`solicit`] is `neigh_event_send`: `ip neigh replace ... use` (the
//! `NTF_USE` flag: resolve, change nothing) where the daemon may (CAP_NET_ADMIN in its
//! namespace), else an ICMP echo request on an unprivileged ping socket, whose transmission
//! makes the kernel resolve the next hop first. Without either (no netlink, no ping socket),
//! resolution does not wait for the neighbour, as before.

use nix::sys::socket::{
    bind, recv, send, sendto, setsockopt, socket, sockopt::ReceiveTimeout, AddressFamily, MsgFlags,
    NetlinkAddr, SockFlag, SockProtocol, SockType, SockaddrIn, SockaddrIn6, SockaddrLike,
};
use nix::sys::time::TimeVal;
use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};

/// The neighbour a packet needs: on interface `ifindex`, the peer itself or the route's
/// gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NextHop {
    pub ifindex: u32,
    pub addr: IpAddr,
}

/// `NUD_VALID`: the states in which the kernel has a link-layer address it sends to.
const NUD_VALID: u16 = libc::NUD_PERMANENT
    | libc::NUD_NOARP
    | libc::NUD_REACHABLE
    | libc::NUD_PROBE
    | libc::NUD_STALE
    | libc::NUD_DELAY;
/// `RTA_VIA`: an IPv4 route's IPv6 gateway (family, then the address).
const RTA_VIA: u16 = 18;
const NLMSG_HDR: usize = 16;

/// The neighbour a packet from `local` to `peer` needs, or `None` when it needs none: the
/// peer is an address of this host (the kernel routes it through `lo`), or the interface
/// is a loopback or does no ARP (a TUN device, WireGuard), which `addr_resolve_neigh` skips
/// too. `Err` when the kernel has no route, or rtnetlink cannot be asked.
pub fn next_hop(local: IpAddr, peer: IpAddr) -> io::Result<Option<NextHop>> {
    let (family, len) = family_of(peer);
    let mut rtmsg = [0u8; 12];
    rtmsg[0] = family;
    rtmsg[1] = len; // rtm_dst_len
    rtmsg[2] = len; // rtm_src_len
    let (dst, src) = (octets(peer), octets(local));
    let reply = ask(
        libc::RTM_GETROUTE,
        0,
        &rtmsg,
        &[(libc::RTA_DST, &dst), (libc::RTA_SRC, &src)],
        libc::RTM_NEWROUTE,
    )?;
    let (body, attrs) = split(&reply, 12)?;
    if body[7] == libc::RTN_LOCAL {
        return Ok(None);
    }
    let mut ifindex = None;
    let mut gateway = None;
    for (kind, value) in attributes(attrs) {
        match kind {
            libc::RTA_OIF => ifindex = value.try_into().ok().map(u32::from_ne_bytes),
            libc::RTA_GATEWAY => gateway = ip_of(value),
            RTA_VIA if value.len() > 2 => gateway = ip_of(&value[2..]),
            _ => {}
        }
    }
    let ifindex = ifindex.ok_or_else(|| invalid("a route without an interface"))?;
    if !needs_neighbour(ifindex)? {
        return Ok(None);
    }
    Ok(Some(NextHop {
        ifindex,
        addr: gateway.unwrap_or(peer),
    }))
}

/// Whether the kernel has the neighbour's link-layer address (`NUD_VALID`); an entry it
/// does not have at all is not valid.
pub fn is_valid(hop: NextHop) -> io::Result<bool> {
    match ask(
        libc::RTM_GETNEIGH,
        0,
        &ndmsg(hop, 0, 0),
        &[(libc::NDA_DST, &octets(hop.addr))],
        libc::RTM_NEWNEIGH,
    ) {
        Ok(reply) => {
            let (body, _) = split(&reply, 12)?;
            Ok(u16::from_ne_bytes([body[8], body[9]]) & NUD_VALID != 0)
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Every neighbour the kernel has a valid link-layer address for (one dump of its tables,
/// whatever the number of resolutions waiting: what they cost the CM thread does not grow
/// with them).
pub fn valid_neighbours() -> io::Result<HashSet<NextHop>> {
    let mut valid = HashSet::new();
    exchange(
        libc::RTM_GETNEIGH,
        libc::NLM_F_DUMP as u16,
        &[0u8; 12],
        &[],
        |kind, payload| {
            if kind != libc::RTM_NEWNEIGH || payload.len() < 12 {
                return None::<()>;
            }
            let state = u16::from_ne_bytes([payload[8], payload[9]]);
            let ifindex = u32::from_ne_bytes([payload[4], payload[5], payload[6], payload[7]]);
            let dst = attributes(&payload[12..]).find(|(t, _)| *t == libc::NDA_DST);
            if let Some(addr) = dst.and_then(|(_, v)| ip_of(v)) {
                if state & NUD_VALID != 0 {
                    valid.insert(NextHop { ifindex, addr });
                }
            }
            None
        },
    )?;
    Ok(valid)
}

/// Asks the kernel to resolve the neighbour, as `neigh_event_send` does for its rdma_cm:
/// `NTF_USE` where the daemon may change the neighbour table, else an ICMP echo request to
/// the peer from `local` (sending it resolves the next hop first; whatever answers, or
/// nothing, is not read).
pub fn solicit(hop: NextHop, local: IpAddr, peer: IpAddr) -> io::Result<()> {
    let flags = (libc::NLM_F_CREATE | libc::NLM_F_REPLACE) as u16;
    let used = ask(
        libc::RTM_NEWNEIGH,
        flags,
        &ndmsg(hop, 0, libc::NTF_USE),
        &[(libc::NDA_DST, &octets(hop.addr))],
        libc::NLMSG_ERROR as u16,
    );
    match used {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => ping(local, peer),
        Err(e) => Err(e),
    }
}

/// One ICMP echo request through an unprivileged ping socket (`net.ipv4.ping_group_range`);
/// the kernel fills in the identifier and checksum.
fn ping(local: IpAddr, peer: IpAddr) -> io::Result<()> {
    let (family, protocol, kind) = match peer {
        IpAddr::V4(_) => (AddressFamily::Inet, SockProtocol::Icmp, 8),
        IpAddr::V6(_) => (AddressFamily::Inet6, SockProtocol::IcmpV6, 128),
    };
    let fd = socket(
        family,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        protocol,
    )?;
    let echo = [kind, 0, 0, 0, 0, 0, 0, 1];
    let send_from = |l: &dyn SockaddrLike, p: &dyn SockaddrLike| -> io::Result<()> {
        bind(fd.as_raw_fd(), l)?;
        sendto(fd.as_raw_fd(), &echo, p, MsgFlags::empty())?;
        Ok(())
    };
    match (SocketAddr::new(local, 0), SocketAddr::new(peer, 0)) {
        (SocketAddr::V4(l), SocketAddr::V4(p)) => {
            send_from(&SockaddrIn::from(l), &SockaddrIn::from(p))?
        }
        (SocketAddr::V6(l), SocketAddr::V6(p)) => {
            send_from(&SockaddrIn6::from(l), &SockaddrIn6::from(p))?
        }
        _ => return Err(invalid("a source of another family")),
    }
    Ok(())
}

/// Whether packets through the interface need a neighbour: not through a loopback, nor
/// through an interface that does no ARP.
fn needs_neighbour(ifindex: u32) -> io::Result<bool> {
    let mut ifinfomsg = [0u8; 16];
    ifinfomsg[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    let reply = ask(libc::RTM_GETLINK, 0, &ifinfomsg, &[], libc::RTM_NEWLINK)?;
    let (body, _) = split(&reply, 16)?;
    let flags = u32::from_ne_bytes([body[8], body[9], body[10], body[11]]);
    let arp_less = (libc::IFF_LOOPBACK | libc::IFF_NOARP) as u32;
    Ok(flags & arp_less == 0)
}

fn ndmsg(hop: NextHop, state: u16, flags: u8) -> [u8; 12] {
    let mut m = [0u8; 12];
    m[0] = family_of(hop.addr).0;
    m[4..8].copy_from_slice(&hop.ifindex.to_ne_bytes());
    m[8..10].copy_from_slice(&state.to_ne_bytes());
    m[10] = flags;
    m
}

fn family_of(ip: IpAddr) -> (u8, u8) {
    match ip {
        IpAddr::V4(_) => (libc::AF_INET as u8, 32),
        IpAddr::V6(_) => (libc::AF_INET6 as u8, 128),
    }
}

fn octets(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

fn ip_of(b: &[u8]) -> Option<IpAddr> {
    match b.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(b).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(b).ok()?)),
        _ => None,
    }
}

fn invalid(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.to_string())
}

/// One rtnetlink request and its answer: the payload of the reply of type `want` (for an
/// acknowledged request, `NLMSG_ERROR`, the acknowledgement's), or the kernel's error.
fn ask(
    kind: u16,
    flags: u16,
    body: &[u8],
    attrs: &[(u16, &[u8])],
    want: u16,
) -> io::Result<Vec<u8>> {
    let ack = if want == libc::NLMSG_ERROR as u16 {
        libc::NLM_F_ACK as u16
    } else {
        0
    };
    exchange(kind, ack | flags, body, attrs, |k, payload| {
        (k == want).then(|| payload.to_vec())
    })?
    .ok_or_else(|| invalid("no answer from rtnetlink"))
}

/// Sends one request on a new rtnetlink socket and hands each message of the answer (type,
/// payload) to `each` until it returns something, or the answer ends (`NLMSG_DONE`, `None`);
/// an error the kernel returns is `Err`.
fn exchange<T>(
    kind: u16,
    flags: u16,
    body: &[u8],
    attrs: &[(u16, &[u8])],
    mut each: impl FnMut(u16, &[u8]) -> Option<T>,
) -> io::Result<Option<T>> {
    let fd: OwnedFd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkRoute,
    )?;
    bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))?;
    // The kernel answers at once; a bound keeps the CM thread from ever waiting on it.
    setsockopt(&fd, ReceiveTimeout, &TimeVal::new(1, 0))?;
    let message = encode(kind, libc::NLM_F_REQUEST as u16 | flags, body, attrs);
    send(fd.as_raw_fd(), &message, MsgFlags::empty())?;
    // A dump comes in parts of at most a page or two each.
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty())?;
        let mut rest = &buf[..n];
        while rest.len() >= NLMSG_HDR {
            let len = u32::from_ne_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
            if len < NLMSG_HDR || len > rest.len() {
                return Err(invalid("a truncated netlink message"));
            }
            let kind = u16::from_ne_bytes([rest[4], rest[5]]);
            let payload = &rest[NLMSG_HDR..len];
            if kind == libc::NLMSG_DONE as u16 {
                return Ok(None);
            }
            if kind == libc::NLMSG_ERROR as u16 {
                let code = payload
                    .get(..4)
                    .map_or(0, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                if code != 0 {
                    return Err(io::Error::from_raw_os_error(-code));
                }
            }
            if let Some(found) = each(kind, payload) {
                return Ok(Some(found));
            }
            rest = &rest[align(len).min(rest.len())..];
        }
    }
}

fn align(n: usize) -> usize {
    (n + 3) & !3
}

fn encode(kind: u16, flags: u16, body: &[u8], attrs: &[(u16, &[u8])]) -> Vec<u8> {
    let mut m = vec![0u8; NLMSG_HDR];
    m.extend_from_slice(body);
    m.resize(align(m.len()), 0);
    for (t, v) in attrs {
        m.extend_from_slice(&((4 + v.len()) as u16).to_ne_bytes());
        m.extend_from_slice(&t.to_ne_bytes());
        m.extend_from_slice(v);
        m.resize(align(m.len()), 0);
    }
    let len = m.len() as u32;
    m[0..4].copy_from_slice(&len.to_ne_bytes());
    m[4..6].copy_from_slice(&kind.to_ne_bytes());
    m[6..8].copy_from_slice(&flags.to_ne_bytes());
    m[8..12].copy_from_slice(&1u32.to_ne_bytes()); // nlmsg_seq
    m
}

/// A message's fixed header (`fixed` bytes) and its attributes.
fn split(payload: &[u8], fixed: usize) -> io::Result<(&[u8], &[u8])> {
    if payload.len() < fixed {
        return Err(invalid("a short netlink reply"));
    }
    Ok(payload.split_at(align(fixed).min(payload.len())))
}

/// The (type, value) of each attribute, up to the first malformed one.
fn attributes(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let kind = u16::from_ne_bytes([b[2], b[3]]) & 0x3fff; // NLA_TYPE_MASK
        if len < 4 || len > b.len() {
            return None;
        }
        let value = &b[4..len];
        b = &b[align(len).min(b.len())..];
        Some((kind, value))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_hosts_addresses_need_no_neighbour() {
        let lo = IpAddr::from([127, 0, 0, 1]);
        assert_eq!(next_hop(lo, IpAddr::from([127, 0, 0, 9])).unwrap(), None);
    }

    #[test]
    fn attributes_stop_at_a_malformed_one() {
        let m = encode(
            1,
            0,
            &[0u8; 12],
            &[(4, &7u32.to_ne_bytes()), (1, &[10, 0, 0, 1])],
        );
        let attrs: Vec<_> = attributes(&m[NLMSG_HDR + 12..]).collect();
        assert_eq!(
            attrs,
            vec![(4, &7u32.to_ne_bytes()[..]), (1, &[10, 0, 0, 1][..])]
        );
        let mut bad = m[NLMSG_HDR + 12..].to_vec();
        bad[0] = 200; // longer than the buffer
        assert_eq!(attributes(&bad).count(), 0);
        assert_eq!(attributes(&[1, 0]).count(), 0);
    }
}
