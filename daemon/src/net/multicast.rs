//! IP multicast membership for UD multicast between hosts (rxe joins the group on the netdev
//! when a QP attaches, `rxe_mcast_add`).
//!
//! The device's RoCE socket is bound to its unicast address, and Linux never hands a socket
//! bound to a unicast address the datagrams sent to a group. So each joined group gets its own
//! socket, bound to `group:4791` (SO_REUSEADDR, so that every device on the host can have one)
//! with IP_MULTICAST_ALL (IPV6_MULTICAST_ALL) off, so that it receives only the group it
//! joined itself, on the device's interface: an IPv4 group by the interface's address, an
//! IPv6 group by the index of the interface holding the device's IPv6 address. Closing it
//! (drop) leaves the group.

use super::socket::{check, set_int};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// One joined group: a non-blocking socket that receives the group's datagrams.
#[derive(Debug)]
pub struct MulticastGroup {
    fd: OwnedFd,
    group: SocketAddr,
}

impl MulticastGroup {
    /// Joins `group` on the interface that holds `local` (of the group's family) and opens
    /// the socket that receives it on `port`.
    pub fn join(group: IpAddr, local: IpAddr, port: u16) -> io::Result<MulticastGroup> {
        if !group.is_multicast() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a multicast address",
            ));
        }
        match (group, local) {
            (IpAddr::V4(group), IpAddr::V4(local)) => MulticastGroup::join_v4(group, local, port),
            (IpAddr::V6(group), IpAddr::V6(local)) => MulticastGroup::join_v6(group, local, port),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the group and the local address are of different families",
            )),
        }
    }

    /// A fresh non-blocking UDP socket of `family` that receives only the groups it joins.
    fn group_socket(family: libc::c_int) -> io::Result<OwnedFd> {
        // SAFETY: plain syscall; the returned descriptor is owned right below.
        let raw = check(unsafe {
            libc::socket(
                family,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
            )
        })?;
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let f = fd.as_raw_fd();
        set_int(f, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1, "SO_REUSEADDR")?;
        if family == libc::AF_INET {
            set_int(
                f,
                libc::IPPROTO_IP,
                libc::IP_MULTICAST_ALL,
                0,
                "IP_MULTICAST_ALL",
            )?;
        } else {
            set_int(f, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1, "IPV6_V6ONLY")?;
            set_int(
                f,
                libc::IPPROTO_IPV6,
                IPV6_MULTICAST_ALL,
                0,
                "IPV6_MULTICAST_ALL",
            )?;
        }
        Ok(fd)
    }

    fn join_v4(group: Ipv4Addr, local: Ipv4Addr, port: u16) -> io::Result<MulticastGroup> {
        let fd = MulticastGroup::group_socket(libc::AF_INET)?;
        let f = fd.as_raw_fd();
        let name = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(group).to_be(),
            },
            sin_zero: [0; 8],
        };
        // SAFETY: `name` is a valid sockaddr_in for the duration of the call.
        check(unsafe {
            libc::bind(
                f,
                (&name as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        })
        .map_err(|e| io::Error::new(e.kind(), format!("bind {group}:{port}: {e}")))?;
        let mreq = libc::ip_mreq {
            imr_multiaddr: libc::in_addr {
                s_addr: u32::from(group).to_be(),
            },
            imr_interface: libc::in_addr {
                s_addr: u32::from(local).to_be(),
            },
        };
        // SAFETY: `mreq` outlives the call and its size is passed; the kernel only reads it.
        check(unsafe {
            libc::setsockopt(
                f,
                libc::IPPROTO_IP,
                libc::IP_ADD_MEMBERSHIP,
                (&mreq as *const libc::ip_mreq).cast(),
                std::mem::size_of::<libc::ip_mreq>() as libc::socklen_t,
            )
        })
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("IP_ADD_MEMBERSHIP {group} on {local}: {e}"),
            )
        })?;
        Ok(MulticastGroup {
            fd,
            group: SocketAddr::V4(SocketAddrV4::new(group, port)),
        })
    }

    /// An IPv6 group is joined by interface index: the one of the interface that holds
    /// `local` (IPV6_JOIN_GROUP, as rxe_mcast_add joins on its netdev).
    fn join_v6(group: Ipv6Addr, local: Ipv6Addr, port: u16) -> io::Result<MulticastGroup> {
        let ifindex = interface_of(IpAddr::V6(local))?;
        let fd = MulticastGroup::group_socket(libc::AF_INET6)?;
        let f = fd.as_raw_fd();
        let name = sockaddr_in6(group, port, ifindex);
        // SAFETY: `name` is a valid sockaddr_in6 for the duration of the call.
        check(unsafe {
            libc::bind(
                f,
                (&name as *const libc::sockaddr_in6).cast(),
                std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            )
        })
        .map_err(|e| io::Error::new(e.kind(), format!("bind [{group}]:{port}: {e}")))?;
        let mreq = libc::ipv6_mreq {
            ipv6mr_multiaddr: libc::in6_addr {
                s6_addr: group.octets(),
            },
            ipv6mr_interface: ifindex,
        };
        // SAFETY: `mreq` outlives the call and its size is passed; the kernel only reads it.
        check(unsafe {
            libc::setsockopt(
                f,
                libc::IPPROTO_IPV6,
                libc::IPV6_ADD_MEMBERSHIP,
                (&mreq as *const libc::ipv6_mreq).cast(),
                std::mem::size_of::<libc::ipv6_mreq>() as libc::socklen_t,
            )
        })
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("IPV6_JOIN_GROUP {group} on interface {ifindex} ({local}): {e}"),
            )
        })?;
        Ok(MulticastGroup {
            fd,
            group: SocketAddr::V6(SocketAddrV6::new(group, port, 0, ifindex)),
        })
    }

    /// The group and port this socket receives.
    pub fn group(&self) -> SocketAddr {
        self.group
    }

    /// Takes one waiting datagram into `buf`: its source and length. `None` when nothing
    /// waits (the socket never blocks).
    pub fn recv(&self, buf: &mut [u8]) -> Option<(SocketAddr, usize)> {
        // SAFETY: a zeroed sockaddr_storage is a valid value; the kernel fills it.
        let mut from: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: `buf` and `from` are valid for the lengths passed for the whole call.
        let n = unsafe {
            libc::recvfrom(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                (&mut from as *mut libc::sockaddr_storage).cast(),
                &mut len,
            )
        };
        // A datagram longer than the buffer is not a RoCE packet: reported as its full
        // length (MSG_TRUNC), which the caller's verification refuses.
        let n = usize::try_from(n).ok()?;
        let src = match libc::c_int::from(from.ss_family) {
            libc::AF_INET => {
                // SAFETY: the kernel filled a sockaddr_in, which fits in the storage.
                let a = unsafe {
                    *(&from as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>()
                };
                let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
                SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(a.sin_port)))
            }
            libc::AF_INET6 => {
                // SAFETY: the kernel filled a sockaddr_in6, which fits in the storage.
                let a = unsafe {
                    *(&from as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
                };
                let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
                SocketAddr::V6(SocketAddrV6::new(ip, u16::from_be(a.sin6_port), 0, 0))
            }
            _ => return None,
        };
        Some((src, n))
    }
}

/// `IPV6_MULTICAST_ALL` (linux/in6.h, Linux 4.20).
const IPV6_MULTICAST_ALL: libc::c_int = 29;

fn sockaddr_in6(ip: Ipv6Addr, port: u16, scope: u32) -> libc::sockaddr_in6 {
    libc::sockaddr_in6 {
        sin6_family: libc::AF_INET6 as libc::sa_family_t,
        sin6_port: port.to_be(),
        sin6_flowinfo: 0,
        sin6_addr: libc::in6_addr {
            s6_addr: ip.octets(),
        },
        sin6_scope_id: scope,
    }
}

/// The index of the interface that holds `addr`.
pub fn interface_of(addr: IpAddr) -> io::Result<u32> {
    let name = nix::ifaddrs::getifaddrs()?
        .find(|ifa| {
            ifa.address.as_ref().is_some_and(|a| match addr {
                IpAddr::V4(v4) => a.as_sockaddr_in().is_some_and(|s| s.ip() == v4),
                IpAddr::V6(v6) => a.as_sockaddr_in6().is_some_and(|s| s.ip() == v6),
            })
        })
        .map(|ifa| ifa.interface_name)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::AddrNotAvailable,
                format!("no interface holds {addr}"),
            )
        })?;
    Ok(nix::net::if_::if_nametoindex(name.as_str())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unicast_groups_and_mixed_families_are_refused() {
        let v6: IpAddr = "ff0e::1".parse().unwrap();
        assert_eq!(
            MulticastGroup::join(v6, "127.0.0.1".parse().unwrap(), 4791)
                .unwrap_err()
                .kind(),
            io::ErrorKind::InvalidInput
        );
        let uni: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(
            MulticastGroup::join(uni, uni, 0).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        // An IPv6 group is joined on the interface of the local address: lo holds ::1.
        assert_eq!(interface_of("::1".parse().unwrap()).unwrap(), 1);
        assert!(interface_of("2001:db8::77".parse().unwrap()).is_err());
    }
}
