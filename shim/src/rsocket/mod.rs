//! rsockets (`<rdma/rsocket.h>`): stream sockets over RC QPs, wire-compatible with
//! librdmacm's `rsocket.c` of rdma-core v44, built on the shim's own rdma_cm and verbs.
//!
//! * [`wire`]: connection private data, SGL entries, immediate-data encoding.
//! * [`stream`]: one stream rsocket (buffers, credits, completions, send/recv, shutdown).
//! * this module: the socket table (an rsocket's number is its id's event-channel
//!   descriptor, as in librdmacm) and the exported `r*` functions.
//!
//! * `stream::iomap`: direct data placement (`riomap`, `riounmap`, `riowrite`).
//!
//! Not offered (`-1`/`ENOSYS`): datagram rsockets (`SOCK_DGRAM`): librdmacm gives their UD QPs
//! an address handle without a GRH, which no RoCE device accepts (kernel rxe fails them in
//! `rconnect`). Every export runs behind `catch_unwind` and returns `-1` with `errno`.

pub mod stream;
pub mod wire;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use libc::{c_int, c_long, c_void, nfds_t, pollfd, sockaddr, socklen_t, ssize_t};

use crate::ffi::{self, Errno};
use crate::rdmacm::abi::{RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR};
use crate::rdmacm::exports;
use crate::rdmacm::sockaddr as sa;
use stream::{st, Stream};

/// `SOL_RDMA` and its options (`<rdma/rsocket.h>`).
pub const SOL_RDMA: c_int = 0x10000;
pub const RDMA_SQSIZE: c_int = 0;
pub const RDMA_RQSIZE: c_int = 1;
pub const RDMA_INLINE: c_int = 2;
pub const RDMA_IOMAPSIZE: c_int = 3;
pub const RDMA_ROUTE: c_int = 4;

type Shared = Arc<Mutex<Stream>>;

fn table() -> &'static Mutex<HashMap<c_int, Shared>> {
    static T: OnceLock<Mutex<HashMap<c_int, Shared>>> = OnceLock::new();
    T.get_or_init(|| Mutex::new(HashMap::new()))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn lookup(fd: c_int) -> Option<Shared> {
    lock(table()).get(&fd).cloned()
}

fn get(fd: c_int) -> Result<Shared, Errno> {
    lookup(fd).ok_or(Errno(libc::EBADF))
}

fn insert(s: Stream) -> Result<c_int, Errno> {
    let fd = s.channel_fd();
    if fd < 0 {
        return Err(Errno::IO);
    }
    lock(table()).insert(fd, Arc::new(Mutex::new(s)));
    Ok(fd)
}

/// `ssize_t` verbs: the count, or `-1` with `errno` (no panic crosses the boundary).
fn count(body: impl FnOnce() -> Result<usize, Errno>) -> ssize_t {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).unwrap_or(Err(Errno::IO));
    match r {
        Ok(n) => n.min(isize::MAX as usize) as ssize_t,
        Err(e) => {
            ffi::set_errno(e);
            -1
        }
    }
}

/// `rs_copy_addr`: the address, truncated to `*len`; `*len` set to its full length.
///
/// # Safety
/// `addr` has `*len` writable bytes.
unsafe fn copy_addr(
    src: &libc::sockaddr_storage,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> Result<(), Errno> {
    if addr.is_null() || len.is_null() {
        return Err(Errno(libc::EFAULT));
    }
    let full = sa::family_len(src.ss_family);
    // SAFETY: per the contract.
    unsafe {
        let n = (*len as usize).min(full);
        std::ptr::copy_nonoverlapping(
            (src as *const libc::sockaddr_storage).cast::<u8>(),
            addr.cast::<u8>(),
            n,
        );
        *len = full as socklen_t;
    }
    Ok(())
}

/// `rsocket`.
#[no_mangle]
pub extern "C" fn rsocket(domain: c_int, kind: c_int, protocol: c_int) -> c_int {
    ffi::int_or_minus_one(|| {
        if domain != libc::AF_INET && domain != libc::AF_INET6 {
            return Err(Errno(libc::ENOTSUP));
        }
        if kind == libc::SOCK_DGRAM {
            // Datagram rsockets are not offered.
            return Err(Errno(libc::ENOSYS));
        }
        if kind != libc::SOCK_STREAM || (protocol != 0 && protocol != libc::IPPROTO_TCP) {
            return Err(Errno(libc::ENOTSUP));
        }
        insert(Stream::open(domain)?)
    })
}

/// `rbind`.
///
/// # Safety
/// `addr` has `addrlen` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn rbind(socket: c_int, addr: *const sockaddr, addrlen: socklen_t) -> c_int {
    ffi::int_or_minus_one(|| {
        // SAFETY: per the contract.
        unsafe { sa::check_len(addr, addrlen)? };
        let s = get(socket)?;
        lock(&s).bind(addr)?;
        Ok(0)
    })
}

/// `rlisten`.
#[no_mangle]
pub extern "C" fn rlisten(socket: c_int, backlog: c_int) -> c_int {
    ffi::int_or_minus_one(|| {
        let s = get(socket)?;
        lock(&s).listen(backlog)?;
        Ok(0)
    })
}

/// `raccept`: blocks until a connection is established (or `EAGAIN` on a non-blocking
/// listener without a pending request).
///
/// # Safety
/// `addr`/`addrlen` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn raccept(
    socket: c_int,
    addr: *mut sockaddr,
    addrlen: *mut socklen_t,
) -> c_int {
    ffi::int_or_minus_one(|| {
        let l = get(socket)?;
        let child = lock(&l).accept()?;
        let peer = child.peer_addr();
        let fd = insert(child)?;
        if !addr.is_null() && !addrlen.is_null() {
            // SAFETY: the caller's buffer of *addrlen bytes.
            unsafe { copy_addr(&peer, addr, addrlen)? };
        }
        Ok(fd)
    })
}

/// `rconnect` (completes before returning).
///
/// # Safety
/// `addr` has `addrlen` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn rconnect(
    socket: c_int,
    addr: *const sockaddr,
    addrlen: socklen_t,
) -> c_int {
    ffi::int_or_minus_one(|| {
        // SAFETY: per the contract.
        unsafe { sa::check_len(addr, addrlen)? };
        let s = get(socket)?;
        lock(&s).connect(addr, addrlen as usize)?;
        Ok(0)
    })
}

/// `rshutdown`.
#[no_mangle]
pub extern "C" fn rshutdown(socket: c_int, how: c_int) -> c_int {
    ffi::int_or_minus_one(|| {
        let s = get(socket)?;
        lock(&s).shutdown(how)?;
        Ok(0)
    })
}

/// `rclose`: a graceful disconnect when connected, then every resource freed.
#[no_mangle]
pub extern "C" fn rclose(socket: c_int) -> c_int {
    ffi::int_or_minus_one(|| {
        let s = lock(table()).remove(&socket).ok_or(Errno(libc::EBADF))?;
        {
            let mut g = lock(&s);
            if g.state & st::CONNECTED != 0 {
                let _ = g.shutdown(libc::SHUT_RDWR);
            }
        }
        drop(s);
        Ok(0)
    })
}

/// A caller's byte count that can name one Rust slice: `slice::from_raw_parts` requires at
/// most `isize::MAX` bytes (a larger one is undefined behaviour, and debug builds abort, which
/// no `catch_unwind` stops). The kernel answers such a `send`/`recv`/`writev` with EINVAL.
fn check_len(len: usize) -> Result<(), Errno> {
    if len > isize::MAX as usize {
        return Err(Errno::INVAL);
    }
    Ok(())
}

fn recv_into(socket: c_int, buf: *mut c_void, len: usize, flags: c_int) -> Result<usize, Errno> {
    if buf.is_null() && len > 0 {
        return Err(Errno(libc::EFAULT));
    }
    check_len(len)?;
    let s = get(socket)?;
    let mut g = lock(&s);
    if len == 0 {
        return Ok(0);
    }
    // SAFETY: the caller's writable buffer of `len` bytes.
    let b = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
    g.recv(b, flags)
}

fn send_from(socket: c_int, iov: &[&[u8]], flags: c_int) -> Result<usize, Errno> {
    let s = get(socket)?;
    let mut g = lock(&s);
    if iov.iter().all(|b| b.is_empty()) {
        return Ok(0);
    }
    g.send(iov, flags)
}

/// The iovec list of `rwritev`/`rsendmsg` as slices. At most `UIO_MAXIOV` entries, as the
/// kernel's `writev(2)` (EINVAL): a larger count from a caller is refused before anything is
/// read or allocated for it (`Vec::with_capacity(INT_MAX)` would abort on allocation).
///
/// # Safety
/// `iov` has `n` valid entries whose buffers are readable.
unsafe fn iov_slices<'a>(iov: *const libc::iovec, n: usize) -> Result<Vec<&'a [u8]>, Errno> {
    if n > libc::UIO_MAXIOV as usize || (iov.is_null() && n > 0) {
        return Err(Errno::INVAL);
    }
    let mut v = Vec::with_capacity(n);
    // The total must fit an ssize_t as well (writev(2): EINVAL otherwise); `send` sums it.
    let mut total = 0usize;
    for i in 0..n {
        // SAFETY: per the contract.
        let e = unsafe { &*iov.add(i) };
        if e.iov_len == 0 {
            continue;
        }
        if e.iov_base.is_null() {
            return Err(Errno(libc::EFAULT));
        }
        total = total.checked_add(e.iov_len).ok_or(Errno::INVAL)?;
        check_len(total)?;
        // SAFETY: per the contract.
        v.push(unsafe { std::slice::from_raw_parts(e.iov_base.cast::<u8>(), e.iov_len) });
    }
    Ok(v)
}

/// `rrecv`.
///
/// # Safety
/// `buf` has `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn rrecv(
    socket: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
) -> ssize_t {
    count(|| recv_into(socket, buf, len, flags))
}

/// `rread`.
///
/// # Safety
/// As [`rrecv`].
#[no_mangle]
pub unsafe extern "C" fn rread(socket: c_int, buf: *mut c_void, len: usize) -> ssize_t {
    count(|| recv_into(socket, buf, len, 0))
}

/// `rrecvfrom` (stream: the peer's address).
///
/// # Safety
/// As [`rrecv`]; `src`/`srclen` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn rrecvfrom(
    socket: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    src: *mut sockaddr,
    srclen: *mut socklen_t,
) -> ssize_t {
    count(|| {
        let n = recv_into(socket, buf, len, flags)?;
        if n > 0 && !src.is_null() && !srclen.is_null() {
            let peer = lock(&*get(socket)?).peer_addr();
            // SAFETY: the caller's buffer.
            unsafe { copy_addr(&peer, src, srclen)? };
        }
        Ok(n)
    })
}

/// `rreadv`: like librdmacm, fills the first vector only.
///
/// # Safety
/// `iov` has `iovcnt` valid entries.
#[no_mangle]
pub unsafe extern "C" fn rreadv(socket: c_int, iov: *const libc::iovec, iovcnt: c_int) -> ssize_t {
    count(|| {
        if iov.is_null() || iovcnt <= 0 {
            return Err(Errno::INVAL);
        }
        // SAFETY: at least one entry.
        let e = unsafe { &*iov };
        recv_into(socket, e.iov_base, e.iov_len, 0)
    })
}

/// `rrecvmsg`: no control data; the first vector only (as librdmacm).
///
/// # Safety
/// `msg` valid.
#[no_mangle]
pub unsafe extern "C" fn rrecvmsg(socket: c_int, msg: *mut libc::msghdr, flags: c_int) -> ssize_t {
    count(|| {
        let m = ffi::non_null(msg)?;
        // SAFETY: non-null caller's msghdr.
        let m = unsafe { m.as_ref() };
        if !m.msg_control.is_null() && m.msg_controllen > 0 {
            return Err(Errno(libc::ENOTSUP));
        }
        if m.msg_iov.is_null() || m.msg_iovlen == 0 {
            return Err(Errno::INVAL);
        }
        // SAFETY: at least one entry.
        let e = unsafe { &*m.msg_iov };
        recv_into(socket, e.iov_base, e.iov_len, flags)
    })
}

/// `rsend`.
///
/// # Safety
/// `buf` has `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn rsend(
    socket: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
) -> ssize_t {
    count(|| {
        if buf.is_null() && len > 0 {
            return Err(Errno(libc::EFAULT));
        }
        check_len(len)?;
        let b: &[u8] = if len == 0 {
            &[]
        } else {
            // SAFETY: the caller's readable buffer.
            unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) }
        };
        send_from(socket, &[b], flags)
    })
}

/// `rwrite`.
///
/// # Safety
/// As [`rsend`].
#[no_mangle]
pub unsafe extern "C" fn rwrite(socket: c_int, buf: *const c_void, len: usize) -> ssize_t {
    // SAFETY: same contract.
    unsafe { rsend(socket, buf, len, 0) }
}

/// `rsendto`: a stream socket refuses a destination (`EISCONN`).
///
/// # Safety
/// As [`rsend`].
#[no_mangle]
pub unsafe extern "C" fn rsendto(
    socket: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
    dest: *const sockaddr,
    destlen: socklen_t,
) -> ssize_t {
    if !dest.is_null() || destlen != 0 {
        ffi::set_errno(Errno(libc::EISCONN));
        return -1;
    }
    // SAFETY: same contract.
    unsafe { rsend(socket, buf, len, flags) }
}

/// `rwritev`.
///
/// # Safety
/// `iov` has `iovcnt` valid entries.
#[no_mangle]
pub unsafe extern "C" fn rwritev(socket: c_int, iov: *const libc::iovec, iovcnt: c_int) -> ssize_t {
    count(|| {
        let n = usize::try_from(iovcnt).map_err(|_| Errno::INVAL)?;
        // SAFETY: per the contract.
        let v = unsafe { iov_slices(iov, n)? };
        send_from(socket, &v, 0)
    })
}

/// `rsendmsg` (no control data).
///
/// # Safety
/// `msg` valid.
#[no_mangle]
pub unsafe extern "C" fn rsendmsg(
    socket: c_int,
    msg: *const libc::msghdr,
    flags: c_int,
) -> ssize_t {
    count(|| {
        let m = ffi::non_null(msg as *mut libc::msghdr)?;
        // SAFETY: non-null caller's msghdr.
        let m = unsafe { m.as_ref() };
        if !m.msg_control.is_null() && m.msg_controllen > 0 {
            return Err(Errno(libc::ENOTSUP));
        }
        // sendmsg(2): EMSGSIZE past UIO_MAXIOV entries (the count was cast to an int before,
        // so 2^32 + 1 entries read as one).
        if m.msg_iovlen > libc::UIO_MAXIOV as usize {
            return Err(Errno(libc::EMSGSIZE));
        }
        // SAFETY: the caller's iovec list.
        let v = unsafe { iov_slices(m.msg_iov, m.msg_iovlen)? };
        send_from(socket, &v, flags)
    })
}

fn poll_one(fd: &mut pollfd, nonblock: bool, test: fn(&mut Stream) -> bool) -> bool {
    match lookup(fd.fd) {
        Some(s) => {
            fd.revents = lock(&s).poll_events(fd.events, nonblock, test);
        }
        None => {
            fd.revents = 0;
            // SAFETY: one pollfd.
            unsafe { libc::poll(fd, 1, 0) };
        }
    }
    fd.revents != 0
}

/// `rpoll`: rsockets and ordinary descriptors together.
///
/// # Safety
/// `fds` has `nfds` valid entries.
#[no_mangle]
pub unsafe extern "C" fn rpoll(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> c_int {
    ffi::int_or_minus_one(|| {
        if fds.is_null() && nfds > 0 {
            return Err(Errno(libc::EFAULT));
        }
        // poll(2) answers EINVAL past RLIMIT_NOFILE; here at least the slice must be valid.
        let slice_bytes = usize::try_from(nfds)
            .ok()
            .and_then(|n| n.checked_mul(std::mem::size_of::<pollfd>()));
        if slice_bytes.is_none_or(|b| b > isize::MAX as usize) {
            return Err(Errno::INVAL);
        }
        let fds: &mut [pollfd] = if nfds == 0 {
            &mut []
        } else {
            // SAFETY: per the contract.
            unsafe { std::slice::from_raw_parts_mut(fds, nfds as usize) }
        };
        let mut cnt = 0;
        for f in fds.iter_mut() {
            if poll_one(f, true, Stream::poll_all) {
                cnt += 1;
            }
        }
        if cnt > 0 || timeout == 0 {
            return Ok(cnt);
        }
        let mut rfds: Vec<pollfd> = fds.to_vec();
        loop {
            // rs_poll_arm: arm every rsocket's CQ, or report one that became ready.
            for (i, f) in fds.iter_mut().enumerate() {
                match lookup(f.fd) {
                    Some(s) => {
                        let mut g = lock(&s);
                        f.revents = g.poll_events(f.events, false, Stream::is_cq_armed);
                        if f.revents != 0 {
                            return Ok(1);
                        }
                        rfds[i] = pollfd {
                            fd: g.wait_fd(),
                            events: libc::POLLIN,
                            revents: 0,
                        };
                    }
                    None => {
                        rfds[i] = pollfd {
                            fd: f.fd,
                            events: f.events,
                            revents: 0,
                        };
                    }
                }
            }
            // SAFETY: rfds has nfds entries.
            let r = unsafe { libc::poll(rfds.as_mut_ptr(), rfds.len() as nfds_t, timeout) };
            if r < 0 {
                return Err(Errno::last());
            }
            if r == 0 {
                return Ok(0);
            }
            let mut cnt = 0;
            for (i, f) in fds.iter_mut().enumerate() {
                if rfds[i].revents == 0 {
                    continue;
                }
                match lookup(f.fd) {
                    Some(s) => {
                        let mut g = lock(&s);
                        g.consume_wakeup();
                        f.revents = g.poll_events(f.events, true, Stream::poll_all);
                    }
                    None => f.revents = rfds[i].revents,
                }
                if f.revents != 0 {
                    cnt += 1;
                }
            }
            if cnt > 0 {
                return Ok(cnt);
            }
        }
    })
}

/// `select(2)`'s timeout as `poll(2)`'s milliseconds. Saturating: a caller may pass any
/// `tv_sec` (LONG_MAX as "forever"), and an overflow panic here, outside any
/// `catch_unwind`, would abort the host program.
fn timeval_ms(t: &libc::timeval) -> c_int {
    let ms = t
        .tv_sec
        .saturating_mul(1000)
        .saturating_add(t.tv_usec / 1000);
    ms.clamp(0, libc::time_t::from(c_int::MAX)) as c_int
}

/// `rselect`, through [`rpoll`].
///
/// # Safety
/// The sets are NULL or valid `fd_set`s; `timeout` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn rselect(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    let nfds = nfds.clamp(0, libc::FD_SETSIZE as c_int);
    let mut fds = Vec::new();
    // SAFETY: the caller's sets (or NULL).
    unsafe {
        for fd in 0..nfds {
            let mut events = 0;
            let r = !readfds.is_null() && libc::FD_ISSET(fd, readfds);
            let w = !writefds.is_null() && libc::FD_ISSET(fd, writefds);
            let e = !exceptfds.is_null() && libc::FD_ISSET(fd, exceptfds);
            if r {
                events |= libc::POLLIN;
            }
            if w {
                events |= libc::POLLOUT;
            }
            if r || w || e {
                fds.push(pollfd {
                    fd,
                    events,
                    revents: 0,
                });
            }
        }
    }
    let to = if timeout.is_null() {
        -1
    } else {
        // SAFETY: non-null caller's timeval.
        timeval_ms(unsafe { &*timeout })
    };
    // SAFETY: fds has fds.len() entries.
    let ret = unsafe { rpoll(fds.as_mut_ptr(), fds.len() as nfds_t, to) };
    // SAFETY: as above.
    unsafe {
        for set in [readfds, writefds, exceptfds] {
            if !set.is_null() {
                libc::FD_ZERO(set);
            }
        }
    }
    if ret <= 0 {
        return ret;
    }
    let mut cnt = 0;
    // SAFETY: as above.
    unsafe {
        for f in &fds {
            if !readfds.is_null() && f.revents & (libc::POLLIN | libc::POLLHUP) != 0 {
                libc::FD_SET(f.fd, readfds);
                cnt += 1;
            }
            if !writefds.is_null() && f.revents & libc::POLLOUT != 0 {
                libc::FD_SET(f.fd, writefds);
                cnt += 1;
            }
            if !exceptfds.is_null() && f.revents & !(libc::POLLIN | libc::POLLOUT) != 0 {
                libc::FD_SET(f.fd, exceptfds);
                cnt += 1;
            }
        }
    }
    cnt
}

fn read_int(optval: *const c_void, optlen: socklen_t) -> Result<c_int, Errno> {
    if optval.is_null() || (optlen as usize) < std::mem::size_of::<c_int>() {
        return Err(Errno::INVAL);
    }
    // SAFETY: at least an int readable (checked length); unaligned-safe read.
    Ok(unsafe { optval.cast::<c_int>().read_unaligned() })
}

/// `rsetsockopt`: the options rcopy and rstream use, accepted and stored (sizes apply to
/// the buffers and queues made at connect/accept time).
///
/// # Safety
/// `optval` has `optlen` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn rsetsockopt(
    socket: c_int,
    level: c_int,
    optname: c_int,
    optval: *const c_void,
    optlen: socklen_t,
) -> c_int {
    ffi::int_or_minus_one(|| {
        let s = get(socket)?;
        let mut g = lock(&s);
        let v = read_int(optval, optlen)?;
        let unset = g.state < st::CONNECTED;
        match (level, optname) {
            (libc::SOL_SOCKET, libc::SO_REUSEADDR) => {
                // SAFETY: live id; optval checked readable.
                let r = unsafe {
                    exports::rdma_set_option(
                        g.id,
                        RDMA_OPTION_ID,
                        RDMA_OPTION_ID_REUSEADDR,
                        optval as *mut c_void,
                        optlen as usize,
                    )
                };
                if r != 0 {
                    return Err(Errno::last());
                }
                g.opts.reuseaddr = v;
            }
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => {
                if unset {
                    g.rbuf_size = (v.max(1) as u32).saturating_mul(2).min(1 << 28);
                }
            }
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => {
                if unset {
                    let sz = (v.max(0) as u32).saturating_mul(2).min(1 << 28);
                    g.sbuf_size = if sz < stream::RS_SNDLOWAT {
                        stream::RS_SNDLOWAT << 1
                    } else {
                        sz
                    };
                }
            }
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => g.opts.keepalive = v,
            (libc::SOL_SOCKET, libc::SO_OOBINLINE) => g.opts.oobinline = v,
            (libc::SOL_SOCKET, libc::SO_LINGER) => {
                if (optlen as usize) < std::mem::size_of::<libc::linger>() {
                    return Err(Errno::INVAL);
                }
                // SAFETY: a linger readable (checked length).
                let l = unsafe { optval.cast::<libc::linger>().read_unaligned() };
                g.opts.linger = (l.l_onoff, l.l_linger);
            }
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => g.opts.nodelay = v,
            (libc::IPPROTO_TCP, libc::TCP_MAXSEG)
            | (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE)
            | (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL)
            | (libc::IPPROTO_TCP, libc::TCP_KEEPCNT) => {}
            (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => {}
            (SOL_RDMA, RDMA_SQSIZE) if unset => {
                g.sq_size = (v.max(0) as u32).min(u32::from(stream::RS_QP_MAX_SIZE)) as u16
            }
            (SOL_RDMA, RDMA_RQSIZE) if unset => {
                g.rq_size = (v.max(0) as u32).min(u32::from(stream::RS_QP_MAX_SIZE)) as u16
            }
            (SOL_RDMA, RDMA_INLINE) if unset => {
                g.sq_inline = (v.max(0) as u32).min(u32::from(stream::RS_QP_MAX_SIZE)) as u16
            }
            // Rounded as the connection data carries it (librdmacm's rule).
            (SOL_RDMA, RDMA_IOMAPSIZE) if unset => g.target_iomap_size = stream::iomap_size(v),
            (SOL_RDMA, RDMA_ROUTE) if unset => {}
            (SOL_RDMA, _) => return Err(Errno::INVAL),
            _ => return Err(Errno(libc::ENOTSUP)),
        }
        Ok(0)
    })
}

/// `rgetsockopt`.
///
/// # Safety
/// `optval` has `*optlen` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn rgetsockopt(
    socket: c_int,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: *mut socklen_t,
) -> c_int {
    ffi::int_or_minus_one(|| {
        if optval.is_null() || optlen.is_null() {
            return Err(Errno(libc::EFAULT));
        }
        let s = get(socket)?;
        let mut g = lock(&s);
        let v: c_int = match (level, optname) {
            (libc::SOL_SOCKET, libc::SO_REUSEADDR) => g.opts.reuseaddr,
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => g.opts.keepalive,
            (libc::SOL_SOCKET, libc::SO_OOBINLINE) => g.opts.oobinline,
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => g.rbuf_size as c_int,
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => g.sbuf_size as c_int,
            (libc::SOL_SOCKET, libc::SO_ERROR) => std::mem::replace(&mut g.err, 0),
            (libc::SOL_SOCKET, libc::SO_LINGER) => {
                // SAFETY: checked pointers; the caller's buffer of *optlen bytes.
                unsafe {
                    if (*optlen as usize) < std::mem::size_of::<libc::linger>() {
                        return Err(Errno::INVAL);
                    }
                    optval.cast::<libc::linger>().write_unaligned(libc::linger {
                        l_onoff: g.opts.linger.0,
                        l_linger: g.opts.linger.1,
                    });
                    *optlen = std::mem::size_of::<libc::linger>() as socklen_t;
                }
                return Ok(0);
            }
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => g.opts.nodelay,
            (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => 2048,
            (SOL_RDMA, RDMA_SQSIZE) => c_int::from(g.sq_size),
            (SOL_RDMA, RDMA_RQSIZE) => c_int::from(g.rq_size),
            (SOL_RDMA, RDMA_INLINE) => c_int::from(g.sq_inline),
            (SOL_RDMA, RDMA_IOMAPSIZE) => c_int::from(g.target_iomap_size),
            _ => return Err(Errno(libc::ENOTSUP)),
        };
        // SAFETY: checked pointers; the caller's buffer of *optlen bytes.
        unsafe {
            if (*optlen as usize) < std::mem::size_of::<c_int>() {
                return Err(Errno::INVAL);
            }
            optval.cast::<c_int>().write_unaligned(v);
            *optlen = std::mem::size_of::<c_int>() as socklen_t;
        }
        Ok(0)
    })
}

/// `rfcntl(socket, F_GETFL)` / `rfcntl(socket, F_SETFL, flags)` (the variadic argument is
/// read as the `long` register it arrives in on x86-64 and aarch64).
#[no_mangle]
pub extern "C" fn rfcntl(socket: c_int, cmd: c_int, arg: c_long) -> c_int {
    ffi::int_or_minus_one(|| {
        let s = get(socket)?;
        let mut g = lock(&s);
        match cmd {
            libc::F_GETFL => Ok(g.fd_flags),
            libc::F_SETFL => {
                let flags = arg as c_int;
                if (flags ^ g.fd_flags) & libc::O_NONBLOCK != 0 {
                    g.set_nonblocking(flags & libc::O_NONBLOCK);
                }
                g.fd_flags = flags;
                Ok(0)
            }
            _ => Err(Errno(libc::ENOTSUP)),
        }
    })
}

/// `rgetpeername`.
///
/// # Safety
/// `addr` has `*addrlen` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn rgetpeername(
    socket: c_int,
    addr: *mut sockaddr,
    addrlen: *mut socklen_t,
) -> c_int {
    ffi::int_or_minus_one(|| {
        let a = lock(&*get(socket)?).peer_addr();
        // SAFETY: per the contract.
        unsafe { copy_addr(&a, addr, addrlen)? };
        Ok(0)
    })
}

/// `rgetsockname`.
///
/// # Safety
/// `addr` has `*addrlen` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn rgetsockname(
    socket: c_int,
    addr: *mut sockaddr,
    addrlen: *mut socklen_t,
) -> c_int {
    ffi::int_or_minus_one(|| {
        let a = lock(&*get(socket)?).local_addr();
        // SAFETY: per the contract.
        unsafe { copy_addr(&a, addr, addrlen)? };
        Ok(0)
    })
}

/// `riomap`: registers `len` bytes at `buf` with the rsocket, for the peer to write at
/// `offset` (-1: the buffer's address) with `PROT_WRITE`; the offset, or -1 and errno.
///
/// # Safety
/// `buf` is `len` bytes the caller keeps mapped until `riounmap` or `rclose`.
#[no_mangle]
pub unsafe extern "C" fn riomap(
    socket: c_int,
    buf: *mut c_void,
    len: libc::size_t,
    prot: c_int,
    _flags: c_int,
    offset: libc::off_t,
) -> libc::off_t {
    ffi::value_or(-1, || {
        let s = get(socket)?;
        let mut g = lock(&s);
        g.iomap(buf as u64, len, prot, offset)
    })
}

/// `riounmap`: the mapping of exactly `buf` and `len` removed; 0, or -1 and EINVAL.
#[no_mangle]
pub extern "C" fn riounmap(socket: c_int, buf: *mut c_void, len: libc::size_t) -> c_int {
    ffi::int_or_minus_one(|| {
        let s = get(socket)?;
        let mut g = lock(&s);
        g.iounmap(buf as u64, len).map(|()| 0)
    })
}

/// `riowrite`: `count` bytes of `buf` into the peer's mapping at `offset`; the count
/// written, or `(size_t)-1` and errno if nothing was.
///
/// # Safety
/// `buf` has `count` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn riowrite(
    socket: c_int,
    buf: *const c_void,
    count: libc::size_t,
    offset: libc::off_t,
    flags: c_int,
) -> libc::size_t {
    ffi::value_or(usize::MAX, || {
        let s = get(socket)?;
        let bytes: &[u8] = if count == 0 {
            &[]
        } else if buf.is_null() {
            return Err(Errno(libc::EFAULT));
        } else {
            // SAFETY: `count` readable bytes per the caller.
            unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), count) }
        };
        let mut g = lock(&s);
        g.iowrite(bytes, offset as u64, flags)
    })
}

/// Every rsocket name the shim exports (27).
pub const RSOCKET_NAMES: &[&str] = &[
    "raccept",
    "rbind",
    "rclose",
    "rconnect",
    "rfcntl",
    "rgetpeername",
    "rgetsockname",
    "rgetsockopt",
    "riomap",
    "riounmap",
    "riowrite",
    "rlisten",
    "rpoll",
    "rread",
    "rreadv",
    "rrecv",
    "rrecvfrom",
    "rrecvmsg",
    "rselect",
    "rsend",
    "rsendmsg",
    "rsendto",
    "rsetsockopt",
    "rshutdown",
    "rsocket",
    "rwrite",
    "rwritev",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn errno() -> i32 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    #[test]
    fn unknown_sockets_are_ebadf() {
        assert_eq!(rlisten(123_456, 1), -1);
        assert_eq!(errno(), libc::EBADF);
        assert_eq!(rclose(123_456), -1);
        assert_eq!(errno(), libc::EBADF);
        let mut b = [0u8; 4];
        // SAFETY: a valid buffer.
        assert_eq!(unsafe { rrecv(123_456, b.as_mut_ptr().cast(), 4, 0) }, -1);
        assert_eq!(errno(), libc::EBADF);
        assert_eq!(rfcntl(123_456, libc::F_GETFL, 0), -1);
    }

    #[test]
    fn lengths_no_slice_can_hold_are_einval() {
        // Never dereferenced: every call must fail on the length before touching memory
        // (a slice longer than isize::MAX would be undefined behaviour).
        let mut b = [0u8; 4];
        let huge = isize::MAX as usize + 1;
        // SAFETY: the buffer is valid; the length is the point of the test.
        assert_eq!(
            unsafe { rrecv(123_456, b.as_mut_ptr().cast(), huge, 0) },
            -1
        );
        assert_eq!(errno(), libc::EINVAL);
        // SAFETY: as above.
        assert_eq!(
            unsafe { rsend(123_456, b.as_ptr().cast(), usize::MAX, 0) },
            -1
        );
        assert_eq!(errno(), libc::EINVAL);
        let half = libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: isize::MAX as usize / 2 + 1,
        };
        let iov = [half, half];
        // SAFETY: two entries; their sum overflows isize.
        assert_eq!(unsafe { rwritev(123_456, iov.as_ptr(), 2) }, -1);
        assert_eq!(errno(), libc::EINVAL);
        let mut fds = [pollfd {
            fd: -1,
            events: 0,
            revents: 0,
        }];
        // SAFETY: the count is the point of the test; nothing is read.
        assert_eq!(unsafe { rpoll(fds.as_mut_ptr(), nfds_t::MAX, 0) }, -1);
        assert_eq!(errno(), libc::EINVAL);
    }

    #[test]
    fn iovec_counts_past_uio_maxiov_are_refused_before_use() {
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        let iov = vec![empty; libc::UIO_MAXIOV as usize + 1];
        // SAFETY: the count matches the list; every entry is empty.
        assert_eq!(
            unsafe { rwritev(123_456, iov.as_ptr(), iov.len() as c_int) },
            -1
        );
        assert_eq!(errno(), libc::EINVAL);
        // SAFETY: as above.
        assert_eq!(unsafe { rwritev(123_456, iov.as_ptr(), -1) }, -1);
        assert_eq!(errno(), libc::EINVAL);
        // SAFETY: msghdr is integers and pointers; all-zero is valid.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_ptr().cast_mut();
        // Truncated to an int this read as one entry; nothing may be read for it.
        msg.msg_iovlen = (1usize << 32) + 1;
        // SAFETY: the count is the point of the test; nothing is read.
        assert_eq!(unsafe { rsendmsg(123_456, &msg, 0) }, -1);
        assert_eq!(errno(), libc::EMSGSIZE);
    }

    #[test]
    fn addresses_shorter_than_their_family_are_einval() {
        // SAFETY: plain bytes.
        let mut sin6: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
        sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
        let a = (&sin6 as *const libc::sockaddr_in6).cast::<sockaddr>();
        let v4_len = std::mem::size_of::<libc::sockaddr_in>() as socklen_t;
        // SAFETY: 28 readable bytes, of which the call is told 16 (or 1).
        unsafe {
            assert_eq!(rbind(123_456, a, v4_len), -1);
            assert_eq!(errno(), libc::EINVAL);
            assert_eq!(rconnect(123_456, a, v4_len), -1);
            assert_eq!(errno(), libc::EINVAL);
            assert_eq!(rbind(123_456, a, 1), -1);
            assert_eq!(errno(), libc::EINVAL);
            assert_eq!(rconnect(123_456, std::ptr::null(), 28), -1);
            assert_eq!(errno(), libc::EINVAL);
            // A long enough address passes the check (the socket is then unknown).
            assert_eq!(rbind(123_456, a, 28), -1);
            assert_eq!(errno(), libc::EBADF);
        }
    }

    #[test]
    fn unsupported_kinds_and_calls() {
        assert_eq!(rsocket(libc::AF_INET, libc::SOCK_DGRAM, 0), -1);
        assert_eq!(errno(), libc::ENOSYS);
        assert_eq!(rsocket(libc::AF_UNIX, libc::SOCK_STREAM, 0), -1);
        assert_eq!(errno(), libc::ENOTSUP);
        // SAFETY: an unknown socket is looked up before anything is touched.
        assert_eq!(
            unsafe { riomap(123_456, std::ptr::null_mut(), 0, libc::PROT_WRITE, 0, -1) },
            -1
        );
        assert_eq!(errno(), libc::EBADF);
        assert_eq!(RSOCKET_NAMES.len(), 27);
    }

    #[test]
    fn rselect_takes_any_timeout() {
        let t = |tv_sec, tv_usec| libc::timeval { tv_sec, tv_usec };
        assert_eq!(timeval_ms(&t(1, 500_000)), 1500);
        assert_eq!(timeval_ms(&t(-5, 0)), 0);
        assert_eq!(timeval_ms(&t(libc::time_t::MAX, 999_999)), c_int::MAX);
        // Through the export: a ready descriptor, and a timeout that overflowed the
        // millisecond product (a panic across `extern "C"`, aborting the process).
        let mut p = [0 as c_int; 2];
        // SAFETY: a two-int array.
        assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
        // SAFETY: writing one byte to our pipe.
        assert_eq!(unsafe { libc::write(p[1], b"x".as_ptr().cast(), 1) }, 1);
        // SAFETY: fd_set is plain bytes; FD_ZERO/FD_SET on our own set.
        let mut readfds: libc::fd_set = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        unsafe {
            libc::FD_ZERO(&mut readfds);
            libc::FD_SET(p[0], &mut readfds);
        }
        let mut forever = t(libc::time_t::MAX, 0);
        // SAFETY: valid sets and timeval.
        let n = unsafe {
            rselect(
                p[0] + 1,
                &mut readfds,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut forever,
            )
        };
        assert_eq!(n, 1);
        // SAFETY: our set.
        assert!(unsafe { libc::FD_ISSET(p[0], &readfds) });
        // SAFETY: our descriptors.
        unsafe {
            libc::close(p[0]);
            libc::close(p[1]);
        }
    }

    #[test]
    fn rpoll_passes_plain_descriptors_through() {
        let mut p = [0 as c_int; 2];
        // SAFETY: a two-int array.
        assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
        let mut fds = [pollfd {
            fd: p[0],
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: one valid entry.
        assert_eq!(unsafe { rpoll(fds.as_mut_ptr(), 1, 0) }, 0);
        // SAFETY: writing one byte to our pipe.
        assert_eq!(unsafe { libc::write(p[1], b"x".as_ptr().cast(), 1) }, 1);
        // SAFETY: as above.
        assert_eq!(unsafe { rpoll(fds.as_mut_ptr(), 1, 1000) }, 1);
        assert_ne!(fds[0].revents & libc::POLLIN, 0);
        // SAFETY: our descriptors.
        unsafe {
            libc::close(p[0]);
            libc::close(p[1]);
        }
    }
}
