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

/// The bytes a C struct of `family` takes (`sockaddr_in6` for AF_INET6, else `sockaddr_in`:
/// what [`read`] reads, or refuses).
pub fn family_len(family: libc::sa_family_t) -> usize {
    if i32::from(family) == libc::AF_INET6 {
        std::mem::size_of::<sockaddr_in6>()
    } else {
        std::mem::size_of::<sockaddr_in>()
    }
}

/// Checks a caller's address that comes with its length (`bind(2)`-style, or an
/// `rdma_addrinfo`'s `ai_*_len`): non-NULL and `len` covering the whole struct of its family,
/// so [`read`] never reads past the bytes the caller vouched for. EINVAL otherwise.
///
/// # Safety
/// `sa` is NULL or has `len` readable bytes.
pub unsafe fn check_len(sa: *const sockaddr, len: libc::socklen_t) -> Result<(), Errno> {
    if sa.is_null() {
        return Err(Errno::INVAL);
    }
    let len = len as usize;
    if len < std::mem::size_of::<libc::sa_family_t>() {
        return Err(Errno::INVAL);
    }
    // SAFETY: at least the family is readable (checked above).
    let family = unsafe { std::ptr::addr_of!((*sa).sa_family).read_unaligned() };
    if len < family_len(family) {
        return Err(Errno::INVAL);
    }
    Ok(())
}

/// [`read`] of an address that comes with its length ([`check_len`] first).
///
/// # Safety
/// As [`check_len`].
pub unsafe fn read_sized(sa: *const sockaddr, len: libc::socklen_t) -> Result<SocketAddr, Errno> {
    // SAFETY: per the contract.
    unsafe {
        check_len(sa, len)?;
        read(sa)
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
    fn sized_reads_need_the_whole_struct_of_the_family() {
        let a: SocketAddr = "[::1]:9".parse().unwrap();
        let ss = storage(a);
        let p = (&ss as *const sockaddr_storage).cast::<sockaddr>();
        // SAFETY: ss has 128 readable bytes; the lengths are what is tested.
        unsafe {
            assert_eq!(read_sized(p, 28), Ok(a));
            assert_eq!(read_sized(p, 16), Err(Errno::INVAL));
            assert_eq!(read_sized(p, 1), Err(Errno::INVAL));
            assert_eq!(read_sized(std::ptr::null(), 28), Err(Errno::INVAL));
        }
    }

    #[test]
    fn gids_are_v4_mapped() {
        let g = gid_of("192.168.1.2".parse().unwrap());
        assert_eq!(&g[10..], &[0xff, 0xff, 192, 168, 1, 2]);
    }
}
