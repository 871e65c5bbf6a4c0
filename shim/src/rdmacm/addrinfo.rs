//! `rdma_getaddrinfo` / `rdma_freeaddrinfo`: name resolution through the system's
//! `getaddrinfo` (numeric and named hosts, services), converted as librdmacm's
//! `ucma_convert_to_rai` does: the first result only; `RAI_PASSIVE` puts the address in
//! `ai_src_addr`, otherwise in `ai_dst_addr` (with a hint's source address copied); the QP
//! type and port space follow the hints, else the socket type (stream: RC / RDMA_PS_TCP,
//! datagram: UD / RDMA_PS_UDP). With neither node nor service the answer is the hints
//! themselves, addresses included ([`from_hints`]), as in librdmacm.

use std::ffi::{CStr, CString};
use std::net::SocketAddr;
use std::ptr;

use libc::{addrinfo, c_char, c_int, sockaddr};

use crate::abi::*;
use crate::ffi::{self, Errno, Zeroable};
use crate::rdmacm::abi::*;
use crate::rdmacm::sockaddr as sa;

/// What the caller asked for (the parts of `struct rdma_addrinfo` hints that matter).
#[derive(Clone, Copy, Debug, Default)]
pub struct Hints {
    pub flags: c_int,
    pub family: c_int,
    pub qp_type: c_int,
    pub port_space: c_int,
    pub src: Option<SocketAddr>,
    pub dst: Option<SocketAddr>,
}

/// One resolved entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub flags: c_int,
    pub family: c_int,
    pub qp_type: c_int,
    pub port_space: c_int,
    pub src: Option<SocketAddr>,
    pub dst: Option<SocketAddr>,
    pub canonname: Option<String>,
}

/// The socket type and protocol `getaddrinfo` is asked for (`ucma_convert_to_ai`).
fn socket_kind(h: &Hints) -> (c_int, c_int) {
    if h.qp_type == IBV_QPT_RC || h.qp_type == IBV_QPT_UC || h.port_space == RDMA_PS_TCP {
        (libc::SOCK_STREAM, libc::IPPROTO_TCP)
    } else if h.qp_type == IBV_QPT_UD || h.port_space == RDMA_PS_UDP {
        (libc::SOCK_DGRAM, libc::IPPROTO_UDP)
    } else {
        (0, 0)
    }
}

/// Resolves `node`/`service` with the system resolver, as librdmacm does.
pub fn resolve(node: Option<&CStr>, service: Option<&CStr>, h: &Hints) -> Result<Resolved, c_int> {
    if node.is_none() && service.is_none() {
        return Err(libc::EAI_NONAME);
    }
    if h.family != 0 && h.family != libc::AF_INET && h.family != libc::AF_INET6 {
        return Err(libc::EAI_FAMILY);
    }
    // SAFETY: addrinfo is integers and pointers: all-zero is the empty hint.
    let mut ai: addrinfo = unsafe { std::mem::zeroed() };
    if h.flags & RAI_PASSIVE != 0 {
        ai.ai_flags |= libc::AI_PASSIVE;
    }
    if h.flags & RAI_NUMERICHOST != 0 {
        ai.ai_flags |= libc::AI_NUMERICHOST;
    }
    ai.ai_family = h.family;
    let (socktype, protocol) = socket_kind(h);
    ai.ai_socktype = socktype;
    ai.ai_protocol = protocol;
    let mut res: *mut addrinfo = ptr::null_mut();
    // SAFETY: valid C strings or NULL, a valid hint and out pointer.
    let rc = unsafe {
        libc::getaddrinfo(
            node.map_or(ptr::null(), CStr::as_ptr),
            service.map_or(ptr::null(), CStr::as_ptr),
            &ai,
            &mut res,
        )
    };
    if rc != 0 {
        return Err(rc);
    }
    // SAFETY: getaddrinfo succeeded: res is a non-empty list we free below.
    let first = unsafe { &*res };
    // SAFETY: the entry's address of ai_addrlen bytes.
    let addr = unsafe { sa::read(first.ai_addr) };
    let canon = if first.ai_canonname.is_null() {
        None
    } else {
        // SAFETY: a NUL-terminated string owned by the list.
        Some(
            unsafe { CStr::from_ptr(first.ai_canonname) }
                .to_string_lossy()
                .into_owned(),
        )
    };
    let (ai_socktype, ai_protocol) = (first.ai_socktype, first.ai_protocol);
    // SAFETY: from getaddrinfo, freed once.
    unsafe { libc::freeaddrinfo(res) };
    let addr = addr.map_err(|_| libc::EAI_FAMILY)?;
    let qp_type = if h.qp_type != 0 {
        h.qp_type
    } else if ai_socktype == libc::SOCK_DGRAM {
        IBV_QPT_UD
    } else {
        IBV_QPT_RC
    };
    let port_space = if h.port_space != 0 {
        h.port_space
    } else if ai_protocol == libc::IPPROTO_UDP || qp_type == IBV_QPT_UD {
        RDMA_PS_UDP
    } else {
        RDMA_PS_TCP
    };
    let family = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    let (src, dst) = if h.flags & RAI_PASSIVE != 0 {
        (Some(addr), None)
    } else {
        (h.src, Some(addr))
    };
    Ok(Resolved {
        flags: h.flags,
        family,
        qp_type,
        port_space,
        src,
        dst,
        canonname: canon,
    })
}

/// `rdma_getaddrinfo(NULL, NULL, hints)`: librdmacm builds the answer from the hints alone
/// (flags, family, QP type and port space as given, the hints' destination and source
/// addresses copied), which is how libfabric's verbs provider turns the addresses it already
/// has into an `rdma_addrinfo` for `rdma_create_ep`.
pub fn from_hints(h: &Hints) -> Resolved {
    Resolved {
        flags: h.flags,
        family: h.family,
        qp_type: h.qp_type,
        port_space: h.port_space,
        src: h.src,
        dst: h.dst,
        canonname: None,
    }
}

/// A `malloc`ed copy of a socket address (freed by `rdma_freeaddrinfo`).
fn malloc_sockaddr(a: SocketAddr) -> Result<(*mut sockaddr, libc::socklen_t), Errno> {
    let len = sa::len(&a);
    let ss = sa::storage(a);
    // SAFETY: malloc of len bytes, checked.
    let p = unsafe { libc::malloc(len as usize) }.cast::<u8>();
    if p.is_null() {
        return Err(Errno::NOMEM);
    }
    // SAFETY: len <= size_of(sockaddr_storage); p has len bytes.
    unsafe {
        ptr::copy_nonoverlapping(
            (&ss as *const libc::sockaddr_storage).cast::<u8>(),
            p,
            len as usize,
        )
    };
    Ok((p.cast(), len))
}

fn malloc_cstring(s: &str) -> *mut c_char {
    match CString::new(s) {
        // SAFETY: strdup copies a valid C string into malloc'ed memory (NULL on failure).
        Ok(c) => unsafe { libc::strdup(c.as_ptr()) },
        Err(_) => ptr::null_mut(),
    }
}

/// Builds the C `rdma_addrinfo` (calloc'ed, as everything `rdma_freeaddrinfo` frees).
fn to_c(r: &Resolved) -> Result<*mut RdmaAddrinfo, Errno> {
    // SAFETY: calloc of one struct, checked.
    let p = unsafe { libc::calloc(1, std::mem::size_of::<RdmaAddrinfo>()) }.cast::<RdmaAddrinfo>();
    if p.is_null() {
        return Err(Errno::NOMEM);
    }
    let mut ai = RdmaAddrinfo::zeroed();
    ai.ai_flags = r.flags;
    ai.ai_family = r.family;
    ai.ai_qp_type = r.qp_type;
    ai.ai_port_space = r.port_space;
    let fill = |ai: &mut RdmaAddrinfo| -> Result<(), Errno> {
        if let Some(a) = r.src {
            let (sp, l) = malloc_sockaddr(a)?;
            ai.ai_src_addr = sp;
            ai.ai_src_len = l;
        }
        if let Some(a) = r.dst {
            let (dp, l) = malloc_sockaddr(a)?;
            ai.ai_dst_addr = dp;
            ai.ai_dst_len = l;
        }
        if let Some(c) = &r.canonname {
            if r.flags & RAI_PASSIVE != 0 {
                ai.ai_src_canonname = malloc_cstring(c);
            } else {
                ai.ai_dst_canonname = malloc_cstring(c);
            }
        }
        Ok(())
    };
    let filled = fill(&mut ai);
    // SAFETY: p is a calloc'ed RdmaAddrinfo.
    unsafe { p.write(ai) };
    if let Err(e) = filled {
        // SAFETY: a partially filled entry of ours.
        unsafe { free_list(p) };
        return Err(e);
    }
    Ok(p)
}

/// Frees a list built by [`to_c`].
///
/// # Safety
/// `p` is NULL or from `rdma_getaddrinfo`, not freed before.
unsafe fn free_list(mut p: *mut RdmaAddrinfo) {
    while !p.is_null() {
        // SAFETY: an entry of ours; every pointer inside is malloc'ed or NULL.
        unsafe {
            let next = (*p).ai_next;
            libc::free((*p).ai_src_addr.cast());
            libc::free((*p).ai_dst_addr.cast());
            libc::free((*p).ai_src_canonname.cast());
            libc::free((*p).ai_dst_canonname.cast());
            libc::free((*p).ai_route);
            libc::free((*p).ai_connect);
            libc::free(p.cast());
            p = next;
        }
    }
}

/// `rdma_getaddrinfo`: 0, or a `getaddrinfo` error code (`EAI_*`, negative) with errno set
/// as librdmacm leaves it.
///
/// # Safety
/// `node`/`service` NULL or C strings; `hints` NULL or valid; `res` writable.
#[no_mangle]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const RdmaAddrinfo,
    res: *mut *mut RdmaAddrinfo,
) -> c_int {
    let r = std::panic::catch_unwind(|| -> Result<*mut RdmaAddrinfo, c_int> {
        if res.is_null() {
            return Err(libc::EAI_SYSTEM);
        }
        let mut h = Hints::default();
        if !hints.is_null() {
            // SAFETY: non-null, the caller's hints.
            let hi = unsafe { &*hints };
            h.flags = hi.ai_flags;
            h.family = hi.ai_family;
            h.qp_type = hi.ai_qp_type;
            h.port_space = hi.ai_port_space;
            if !hi.ai_src_addr.is_null() && hi.ai_src_len != 0 {
                // SAFETY: the hint's source address of ai_src_len bytes.
                h.src = unsafe { sa::read_sized(hi.ai_src_addr, hi.ai_src_len) }.ok();
            }
            if !hi.ai_dst_addr.is_null() && hi.ai_dst_len != 0 {
                // SAFETY: the hint's destination address of ai_dst_len bytes.
                h.dst = unsafe { sa::read_sized(hi.ai_dst_addr, hi.ai_dst_len) }.ok();
            }
        }
        // SAFETY: NULL or C strings per the contract.
        let node = (!node.is_null()).then(|| unsafe { CStr::from_ptr(node) });
        // SAFETY: as above.
        let service = (!service.is_null()).then(|| unsafe { CStr::from_ptr(service) });
        let r = if node.is_none() && service.is_none() {
            from_hints(&h)
        } else {
            resolve(node, service, &h)?
        };
        to_c(&r).map_err(|_| libc::EAI_MEMORY)
    });
    match r {
        Ok(Ok(p)) => {
            // SAFETY: res checked non-null.
            unsafe { res.write(p) };
            0
        }
        Ok(Err(code)) => {
            ffi::set_errno(Errno(if code == libc::EAI_SYSTEM {
                libc::EINVAL
            } else {
                libc::ENODEV
            }));
            code
        }
        Err(_) => {
            ffi::set_errno(Errno::IO);
            libc::EAI_SYSTEM
        }
    }
}

/// `rdma_freeaddrinfo`.
///
/// # Safety
/// `res` is NULL or from `rdma_getaddrinfo`.
#[no_mangle]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut RdmaAddrinfo) {
    // SAFETY: per the contract.
    unsafe { free_list(res) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_active_address_goes_to_dst_with_tcp_defaults() {
        let h = Hints {
            port_space: RDMA_PS_TCP,
            ..Hints::default()
        };
        let r = resolve(Some(c"127.0.0.180"), Some(c"7471"), &h).unwrap();
        assert_eq!(r.dst, Some("127.0.0.180:7471".parse().unwrap()));
        assert_eq!(r.src, None);
        assert_eq!(
            (r.qp_type, r.port_space, r.family),
            (IBV_QPT_RC, RDMA_PS_TCP, libc::AF_INET)
        );
    }

    #[test]
    fn passive_wildcard_and_udp() {
        let h = Hints {
            flags: RAI_PASSIVE,
            family: libc::AF_INET,
            port_space: RDMA_PS_UDP,
            ..Hints::default()
        };
        let r = resolve(None, Some(c"7174"), &h).unwrap();
        assert_eq!(r.src, Some("0.0.0.0:7174".parse().unwrap()));
        assert_eq!((r.qp_type, r.port_space), (IBV_QPT_UD, RDMA_PS_UDP));
    }

    #[test]
    fn names_and_ipv6_resolve() {
        let r = resolve(
            Some(c"localhost"),
            Some(c"1"),
            &Hints {
                family: libc::AF_INET,
                ..Hints::default()
            },
        )
        .unwrap();
        assert_eq!(r.dst, Some("127.0.0.1:1".parse().unwrap()));
        let r = resolve(Some(c"::1"), None, &Hints::default()).unwrap();
        assert_eq!(r.family, libc::AF_INET6);
    }

    #[test]
    fn hints_alone_are_the_answer_addresses_included() {
        let h = Hints {
            flags: RAI_PASSIVE,
            family: libc::AF_INET,
            qp_type: IBV_QPT_RC,
            port_space: RDMA_PS_TCP,
            src: Some("10.0.0.1:0".parse().unwrap()),
            dst: Some("10.0.0.2:7471".parse().unwrap()),
        };
        let r = from_hints(&h);
        assert_eq!(r.src, h.src);
        assert_eq!(r.dst, h.dst);
        assert_eq!(
            (r.flags, r.family, r.qp_type, r.port_space),
            (RAI_PASSIVE, libc::AF_INET, IBV_QPT_RC, RDMA_PS_TCP)
        );
        let p = to_c(&r).unwrap();
        // SAFETY: our own list, freed once.
        unsafe {
            assert!(!(*p).ai_src_addr.is_null() && !(*p).ai_dst_addr.is_null());
            free_list(p);
        }
    }

    #[test]
    fn errors_are_eai_codes() {
        assert_eq!(
            resolve(None, None, &Hints::default()),
            Err(libc::EAI_NONAME)
        );
        let numeric = Hints {
            flags: RAI_NUMERICHOST,
            ..Hints::default()
        };
        assert!(resolve(Some(c"not-a-number.invalid"), None, &numeric).is_err());
    }

    #[test]
    fn a_hint_source_shorter_than_its_family_is_not_read() {
        let src = sa::storage("[::1]:7".parse().unwrap());
        let mut hints = RdmaAddrinfo::zeroed();
        hints.ai_src_addr = (&src as *const libc::sockaddr_storage)
            .cast::<sockaddr>()
            .cast_mut();
        let mut res = ptr::null_mut();
        for (len, kept) in [(28, true), (16, false)] {
            hints.ai_src_len = len;
            // SAFETY: valid strings and hints (src has 128 readable bytes); writable out.
            let rc =
                unsafe { rdma_getaddrinfo(c"127.0.0.181".as_ptr(), ptr::null(), &hints, &mut res) };
            assert_eq!(rc, 0);
            // SAFETY: rdma_getaddrinfo succeeded.
            assert_eq!(unsafe { !(*res).ai_src_addr.is_null() }, kept, "len {len}");
            // SAFETY: from rdma_getaddrinfo.
            unsafe { rdma_freeaddrinfo(res) };
        }
    }

    #[test]
    fn c_round_trip_frees_cleanly() {
        let mut res = ptr::null_mut();
        // SAFETY: valid strings, hint NULL, writable out pointer.
        let rc = unsafe {
            rdma_getaddrinfo(
                c"127.0.0.181".as_ptr(),
                c"20079".as_ptr(),
                ptr::null(),
                &mut res,
            )
        };
        assert_eq!(rc, 0);
        // SAFETY: rdma_getaddrinfo succeeded.
        let ai = unsafe { &*res };
        // SAFETY: set by rdma_getaddrinfo.
        let dst = unsafe { sa::read(ai.ai_dst_addr) }.unwrap();
        assert_eq!(dst, "127.0.0.181:20079".parse().unwrap());
        assert_eq!(
            ai.ai_dst_len as usize,
            std::mem::size_of::<libc::sockaddr_in>()
        );
        // SAFETY: from rdma_getaddrinfo.
        unsafe { rdma_freeaddrinfo(res) };
    }
}
