//! `struct sockaddr` from C callers to `std::net::SocketAddr` and back. Only AF_INET and
//! AF_INET6 are spoken (RoCE addresses are IP addresses); AF_IB is refused with `EAFNOSUPPORT`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use libc::{sockaddr, sockaddr_in, sockaddr_in6, sockaddr_storage};

use crate::ffi::Errno;

/// Reads a caller's `struct sockaddr *`, by its family.
///
/// # Safety
/// `sa` is NULL or points to a socket address at least as long as its family's struct.
pub unsafe fn read(sa: *const sockaddr) -> Result<SocketAddr, Errno> {
    if sa.is_null() {
        return Err(Errno::INVAL);
    }
    // SAFETY: non-null; every sockaddr starts with sa_family.
    let family = unsafe { (*sa).sa_family } as i32;
    match family {
        libc::AF_INET => {
            // SAFETY: an AF_INET address is a sockaddr_in (caller's contract); unaligned read.
            let sin = unsafe { sa.cast::<sockaddr_in>().read_unaligned() };
            Ok(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 address is a sockaddr_in6 (caller's contract).
            let sin6 = unsafe { sa.cast::<sockaddr_in6>().read_unaligned() };
            Ok(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                u32::from_be(sin6.sin6_flowinfo),
                sin6.sin6_scope_id,
            )))
        }
        _ => Err(Errno(libc::EAFNOSUPPORT)),
    }
}

/// Reads an optional source address: NULL is `None`, an AF_UNSPEC family (as some callers
/// pass a zeroed storage) is `None` too.
///
/// # Safety
/// As [`read`].
pub unsafe fn read_optional(sa: *const sockaddr) -> Result<Option<SocketAddr>, Errno> {
    if sa.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null, every sockaddr starts with sa_family.
    if unsafe { (*sa).sa_family } as i32 == libc::AF_UNSPEC {
        return Ok(None);
    }
    // SAFETY: as the caller guarantees.
    unsafe { read(sa) }.map(Some)
}

/// A `sockaddr_storage` holding `addr`.
pub fn storage(addr: SocketAddr) -> sockaddr_storage {
    // SAFETY: sockaddr_storage is plain bytes; all-zero is a valid (AF_UNSPEC) value.
    let mut ss: sockaddr_storage = unsafe { std::mem::zeroed() };
    let p = (&mut ss as *mut sockaddr_storage).cast::<u8>();
    match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_in is plain bytes, all-zero valid.
            let mut sin: sockaddr_in = unsafe { std::mem::zeroed() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            // SAFETY: sockaddr_storage (128 bytes) holds a sockaddr_in (16 bytes).
            unsafe { p.cast::<sockaddr_in>().write_unaligned(sin) };
        }
        SocketAddr::V6(a) => {
            // SAFETY: sockaddr_in6 is plain bytes, all-zero valid.
            let mut sin6: sockaddr_in6 = unsafe { std::mem::zeroed() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_flowinfo = a.flowinfo().to_be();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_scope_id = a.scope_id();
            // SAFETY: sockaddr_storage (128 bytes) holds a sockaddr_in6 (28 bytes).
            unsafe { p.cast::<sockaddr_in6>().write_unaligned(sin6) };
        }
    }
    ss
}

/// The length of the C struct for `addr`'s family.
pub fn len(addr: &SocketAddr) -> libc::socklen_t {
    (match addr {
        SocketAddr::V4(_) => std::mem::size_of::<sockaddr_in>(),
        SocketAddr::V6(_) => std::mem::size_of::<sockaddr_in6>(),
    }) as libc::socklen_t
}

/// The port of a stored address in network byte order (what `rdma_get_src_port` returns);
/// 0 for an empty (AF_UNSPEC) storage.
pub fn port_be(ss: &sockaddr_storage) -> u16 {
    // SAFETY: reading a stored address of the shim's own making (or all-zero).
    match unsafe { read((ss as *const sockaddr_storage).cast()) } {
        Ok(a) => a.port().to_be(),
        Err(_) => 0,
    }
}

/// The IPv4-mapped or native IPv6 form of an address, as rdma_cm builds GIDs (`ip_to_gid`).
pub fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_v4_and_v6() {
        for s in ["127.0.0.180:7174", "[::1]:9", "[fe80::1%3]:1"] {
            let a: SocketAddr = s.parse().unwrap();
            let ss = storage(a);
            // SAFETY: ss is a valid storage.
            let back = unsafe { read((&ss as *const sockaddr_storage).cast()) }.unwrap();
            assert_eq!(back, a);
            assert_eq!(port_be(&ss), a.port().to_be());
        }
    }

    #[test]
    fn rejects_null_and_other_families() {
        // SAFETY: null is handled.
        assert_eq!(unsafe { read(std::ptr::null()) }, Err(Errno::INVAL));
        // SAFETY: as above.
        assert_eq!(unsafe { read_optional(std::ptr::null()) }, Ok(None));
        // SAFETY: zeroed storage is a valid sockaddr (AF_UNSPEC).
        let mut ss: sockaddr_storage = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        assert_eq!(
            unsafe { read_optional((&ss as *const sockaddr_storage).cast()) },
            Ok(None)
        );
        ss.ss_family = 27; // AF_IB
                           // SAFETY: as above.
        assert_eq!(
            unsafe { read((&ss as *const sockaddr_storage).cast()) },
            Err(Errno(libc::EAFNOSUPPORT))
        );
        assert_eq!(port_be(&ss), 0);
    }

    #[test]
    fn gids_are_v4_mapped() {
        let g = gid_of("192.168.1.2".parse().unwrap());
        assert_eq!(&g[10..], &[0xff, 0xff, 192, 168, 1, 2]);
    }
}
