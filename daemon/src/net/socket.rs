//! Opening the RoCE v2 UDP sockets with the options that make them behave like rxe's.

use super::cmsg::{self, SockAddrBuf};
use super::port_share;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

pub(super) fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Sets an integer socket option, naming it in the error.
pub(super) fn set_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
    what: &str,
) -> io::Result<()> {
    // SAFETY: `value` outlives the call and its size is passed; the kernel only reads it.
    let ret = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    check(ret)
        .map(drop)
        .map_err(|e| io::Error::new(e.kind(), format!("setsockopt {what}: {e}")))
}

/// How the sockets are set up; the parts of [`super::NetConfig`] the socket layer needs.
#[derive(Debug, Clone, Copy)]
pub struct SocketOptions {
    /// Enable UDP_GRO on receive.
    pub gro: bool,
    /// Zero UDP checksums on send, as rxe. Incompatible with UDP GSO: the kernel refuses
    /// (EINVAL) a GSO send on a socket with SO_NO_CHECK / UDP_NO_CHECK6_TX.
    pub zero_checksum_tx: bool,
    pub rcvbuf: usize,
    pub sndbuf: usize,
}

/// Opens a UDP socket bound to `addr`, configured for RoCE v2:
/// - DF on every IPv4 packet (IP_PMTUDISC_DO), as rxe sets it; on an unconnected socket this
///   also makes the kernel send Identification 0, which the ICRC covers (facts §3.5);
/// - packet info and TOS/traffic class reported on receive (to rebuild the IP header for the
///   ICRC and to see ECN marks);
/// - IPv6: zero-checksum datagrams accepted (rxe sends them), flow label 0, v6 only;
/// - optionally UDP_GRO and zero checksums on send.
pub fn open(addr: SocketAddr, opts: &SocketOptions) -> io::Result<OwnedFd> {
    let family = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain syscall; the returned descriptor is owned right below.
    let raw = check(unsafe { libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let f = fd.as_raw_fd();
    if addr.is_ipv4() {
        set_int(
            f,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
            "IP_MTU_DISCOVER",
        )?;
        set_int(f, libc::IPPROTO_IP, libc::IP_PKTINFO, 1, "IP_PKTINFO")?;
        set_int(f, libc::IPPROTO_IP, libc::IP_RECVTOS, 1, "IP_RECVTOS")?;
        if opts.zero_checksum_tx {
            set_int(f, libc::SOL_SOCKET, cmsg::SO_NO_CHECK, 1, "SO_NO_CHECK")?;
        }
        // Group datagrams come in through the device's multicast::MulticastGroup sockets
        // only; a wildcard-bound socket would otherwise receive them too (twice delivered).
        let _ = set_int(
            f,
            libc::IPPROTO_IP,
            libc::IP_MULTICAST_ALL,
            0,
            "IP_MULTICAST_ALL",
        );
        if let std::net::IpAddr::V4(local) = addr.ip() {
            if !local.is_unspecified() {
                // UD multicast sends leave on the device's interface (as rxe's go out on its
                // netdev), loop back to the other devices of this host, one hop only.
                let ifaddr = libc::in_addr {
                    s_addr: u32::from(local).to_be(),
                };
                // SAFETY: `ifaddr` outlives the call and its size is passed.
                let ret = unsafe {
                    libc::setsockopt(
                        f,
                        libc::IPPROTO_IP,
                        libc::IP_MULTICAST_IF,
                        (&ifaddr as *const libc::in_addr).cast(),
                        std::mem::size_of::<libc::in_addr>() as libc::socklen_t,
                    )
                };
                if ret == 0 {
                    set_int(
                        f,
                        libc::IPPROTO_IP,
                        libc::IP_MULTICAST_LOOP,
                        1,
                        "IP_MULTICAST_LOOP",
                    )?;
                    set_int(
                        f,
                        libc::IPPROTO_IP,
                        libc::IP_MULTICAST_TTL,
                        1,
                        "IP_MULTICAST_TTL",
                    )?;
                }
            }
        }
    } else {
        set_int(f, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1, "IPV6_V6ONLY")?;
        // As for IPv4: group datagrams come in through the group sockets only.
        let _ = set_int(f, libc::IPPROTO_IPV6, 29, 0, "IPV6_MULTICAST_ALL");
        if let std::net::IpAddr::V6(local) = addr.ip() {
            // UD multicast sends leave on the interface that holds the device's address,
            // loop back to the other devices of this host, one hop only.
            let ifindex = (!local.is_unspecified())
                .then(|| super::multicast::interface_of(addr.ip()).ok())
                .flatten();
            if let Some(ifindex) = ifindex {
                let set = set_int(
                    f,
                    libc::IPPROTO_IPV6,
                    libc::IPV6_MULTICAST_IF,
                    ifindex as libc::c_int,
                    "IPV6_MULTICAST_IF",
                );
                if set.is_ok() {
                    set_int(
                        f,
                        libc::IPPROTO_IPV6,
                        libc::IPV6_MULTICAST_LOOP,
                        1,
                        "IPV6_MULTICAST_LOOP",
                    )?;
                    set_int(
                        f,
                        libc::IPPROTO_IPV6,
                        libc::IPV6_MULTICAST_HOPS,
                        1,
                        "IPV6_MULTICAST_HOPS",
                    )?;
                }
            }
        }
        set_int(
            f,
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
            "IPV6_MTU_DISCOVER",
        )?;
        set_int(
            f,
            libc::IPPROTO_IPV6,
            libc::IPV6_RECVPKTINFO,
            1,
            "IPV6_RECVPKTINFO",
        )?;
        set_int(
            f,
            libc::IPPROTO_IPV6,
            libc::IPV6_RECVTCLASS,
            1,
            "IPV6_RECVTCLASS",
        )?;
        set_int(
            f,
            libc::SOL_UDP,
            cmsg::UDP_NO_CHECK6_RX,
            1,
            "UDP_NO_CHECK6_RX",
        )?;
        // rxe sends flow label 0; the kernel would otherwise hash one per flow. Older kernels
        // lack the option; the label is masked by the ICRC, so that is not fatal.
        let _ = set_int(
            f,
            libc::IPPROTO_IPV6,
            cmsg::IPV6_AUTOFLOWLABEL,
            0,
            "IPV6_AUTOFLOWLABEL",
        );
        if opts.zero_checksum_tx {
            set_int(
                f,
                libc::SOL_UDP,
                cmsg::UDP_NO_CHECK6_TX,
                1,
                "UDP_NO_CHECK6_TX",
            )?;
        }
    }
    if opts.gro {
        set_int(f, libc::SOL_UDP, cmsg::UDP_GRO, 1, "UDP_GRO")?;
    }
    // Larger buffers absorb bursts; the kernel caps them at rmem_max/wmem_max silently.
    if opts.rcvbuf > 0 {
        set_int(
            f,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            opts.rcvbuf.min(i32::MAX as usize) as libc::c_int,
            "SO_RCVBUF",
        )?;
    }
    if opts.sndbuf > 0 {
        set_int(
            f,
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            opts.sndbuf.min(i32::MAX as usize) as libc::c_int,
            "SO_SNDBUF",
        )?;
    }
    // The devices of a daemon share the port (a `--netdev` device's wildcard beside the
    // addresses of others), and two sockets on one exact address are refused here: see
    // `port_share`. (Port 0, an ephemeral port, shares nothing.)
    let shared = addr.port() != 0;
    if shared {
        set_int(f, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1, "SO_REUSEADDR")?;
        let h = port_share::holders(addr);
        if h.total() > 0 {
            return Err(port_share::in_use(addr, h));
        }
    }
    let mut name = SockAddrBuf::default();
    let len = cmsg::encode_sockaddr(&addr, &mut name);
    // SAFETY: `name` holds a valid sockaddr of `len` bytes for the duration of the call.
    check(unsafe { libc::bind(f, name.0.as_ptr().cast(), len as libc::socklen_t) })
        .map_err(|e| io::Error::new(e.kind(), format!("bind {addr}: {e}")))?;
    if shared {
        // Another socket bound the same address between the look and the bind: both give up.
        let h = port_share::holders(addr);
        if h.total() > 1 {
            return Err(port_share::in_use(
                addr,
                port_share::Holders {
                    ours: h.ours.saturating_sub(1),
                    others: h.others,
                },
            ));
        }
    }
    Ok(fd)
}

/// The address a socket is bound to (to learn an ephemeral port).
pub fn local_addr(fd: RawFd) -> io::Result<SocketAddr> {
    let mut name = SockAddrBuf::default();
    let mut len = cmsg::SOCKADDR_LEN as libc::socklen_t;
    // SAFETY: `name` has room for `len` bytes; the kernel writes at most that and updates len.
    check(unsafe { libc::getsockname(fd, name.0.as_mut_ptr().cast(), &mut len) })?;
    cmsg::decode_sockaddr(&name.0[..(len as usize).min(cmsg::SOCKADDR_LEN)])
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unknown address family"))
}
