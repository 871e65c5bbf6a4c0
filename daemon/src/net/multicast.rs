//! IP multicast membership for UD multicast between hosts (rxe joins the group on the netdev
//! when a QP attaches, `rxe_mcast_add`).
//!
//! The device's RoCE socket is bound to its unicast address, and Linux never hands a socket
//! bound to a unicast address the datagrams sent to a group. So each joined group gets its own
//! socket, bound to `group:4791` (SO_REUSEADDR, so that every device on the host can have one)
//! with IP_MULTICAST_ALL off, so that it receives only the group it joined itself, on the
//! device's interface. Closing it (drop) leaves the group.

use super::socket::{check, set_int};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// One joined group: a non-blocking socket that receives the group's datagrams.
#[derive(Debug)]
pub struct MulticastGroup {
    fd: OwnedFd,
    group: SocketAddr,
}

impl MulticastGroup {
    /// Joins `group` on the interface that holds `local` and opens the socket that receives
    /// it on `port`. Only IPv4 groups: an IPv6 join needs the interface index, which the
    /// device does not know (its own multicast still reaches its own QPs).
    pub fn join(group: IpAddr, local: IpAddr, port: u16) -> io::Result<MulticastGroup> {
        let (IpAddr::V4(group), IpAddr::V4(local)) = (group, local) else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "IPv6 multicast groups are not joined on the network",
            ));
        };
        if !group.is_multicast() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a multicast address",
            ));
        }
        // SAFETY: plain syscall; the returned descriptor is owned right below.
        let raw = check(unsafe {
            libc::socket(
                libc::AF_INET,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
            )
        })?;
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let f = fd.as_raw_fd();
        set_int(f, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1, "SO_REUSEADDR")?;
        set_int(
            f,
            libc::IPPROTO_IP,
            libc::IP_MULTICAST_ALL,
            0,
            "IP_MULTICAST_ALL",
        )?;
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

    /// The group and port this socket receives.
    pub fn group(&self) -> SocketAddr {
        self.group
    }

    /// Takes one waiting datagram into `buf`: its source and length. `None` when nothing
    /// waits (the socket never blocks).
    pub fn recv(&self, buf: &mut [u8]) -> Option<(SocketAddr, usize)> {
        // SAFETY: zeroed sockaddr_in is a valid value; the kernel fills it.
        let mut from: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: `buf` and `from` are valid for the lengths passed for the whole call.
        let n = unsafe {
            libc::recvfrom(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                (&mut from as *mut libc::sockaddr_in).cast(),
                &mut len,
            )
        };
        // A datagram longer than the buffer is not a RoCE packet: reported as its full
        // length (MSG_TRUNC), which the caller's verification refuses.
        let n = usize::try_from(n).ok()?;
        let ip = Ipv4Addr::from(u32::from_be(from.sin_addr.s_addr));
        let src = SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(from.sin_port)));
        Some((src, n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_and_unicast_groups_are_refused() {
        let v6: IpAddr = "ff0e::1".parse().unwrap();
        assert_eq!(
            MulticastGroup::join(v6, "::1".parse().unwrap(), 4791)
                .unwrap_err()
                .kind(),
            io::ErrorKind::Unsupported
        );
        let uni: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(
            MulticastGroup::join(uni, uni, 0).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }
}
