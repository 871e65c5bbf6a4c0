//! Pure helpers (enum strings, rate conversions), fork support and the sysfs helpers.
//!
//! The strings are byte-identical to rdma-core 44's (`tests/tests/shim_verbs_c.rs` compares
//! them with the real libibverbs for every value).

use std::ffi::{CStr, CString};
use std::sync::OnceLock;

use libc::{c_char, c_int, c_void, size_t};

use crate::abi::*;
use crate::ffi::{self, Errno};

fn lookup(table: &'static [&'static CStr], first: c_int, value: c_int) -> *const c_char {
    value
        .checked_sub(first)
        .and_then(|i| usize::try_from(i).ok())
        .and_then(|i| table.get(i))
        .unwrap_or(&c"unknown")
        .as_ptr()
}

/// `ibv_node_type_str`.
#[no_mangle]
pub extern "C" fn ibv_node_type_str(node_type: c_int) -> *const c_char {
    const T: &[&CStr] = &[
        c"InfiniBand channel adapter",
        c"InfiniBand switch",
        c"InfiniBand router",
        c"iWARP NIC",
        c"usNIC",
        c"usNIC UDP",
        c"unspecified",
    ];
    lookup(T, IBV_NODE_CA, node_type)
}

/// `ibv_port_state_str`.
#[no_mangle]
pub extern "C" fn ibv_port_state_str(port_state: c_int) -> *const c_char {
    const T: &[&CStr] = &[
        c"no state change (NOP)",
        c"down",
        c"init",
        c"armed",
        c"active",
        c"active defer",
    ];
    lookup(T, IBV_PORT_NOP, port_state)
}

/// `ibv_event_type_str`.
#[no_mangle]
pub extern "C" fn ibv_event_type_str(event: c_int) -> *const c_char {
    const T: &[&CStr] = &[
        c"CQ error",
        c"local work queue catastrophic error",
        c"invalid request local work queue error",
        c"local access violation work queue error",
        c"communication established",
        c"send queue drained",
        c"path migrated",
        c"path migration request error",
        c"local catastrophic error",
        c"port active",
        c"port error",
        c"LID change",
        c"P_Key change",
        c"SM change",
        c"SRQ catastrophic error",
        c"SRQ limit reached",
        c"last WQE reached",
        c"client reregistration",
        c"GID table change",
        c"WQ fatal",
    ];
    lookup(T, IBV_EVENT_CQ_ERR, event)
}

/// `ibv_wc_status_str`.
#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: c_int) -> *const c_char {
    const T: &[&CStr] = &[
        c"success",
        c"local length error",
        c"local QP operation error",
        c"local EE context operation error",
        c"local protection error",
        c"Work Request Flushed Error",
        c"memory management operation error",
        c"bad response error",
        c"local access error",
        c"remote invalid request error",
        c"remote access error",
        c"remote operation error",
        c"transport retry counter exceeded",
        c"RNR retry counter exceeded",
        c"local RDD violation error",
        c"remote invalid RD request",
        c"aborted error",
        c"invalid EE context number",
        c"invalid EE context state",
        c"fatal error",
        c"response timeout error",
        c"general error",
        c"TM error",
        c"TM software rendezvous",
    ];
    lookup(T, 0, status)
}

/// `ibv_rate_to_mult`: multiple of 2.5 Gb/s, -1 if not a multiple.
#[no_mangle]
pub extern "C" fn ibv_rate_to_mult(rate: c_int) -> c_int {
    RATE_TABLE.iter().find(|r| r.0 == rate).map_or(-1, |r| r.1)
}

/// `mult_to_ibv_rate`: `IBV_RATE_MAX` (0) when nothing matches.
#[no_mangle]
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
    RATE_TABLE
        .iter()
        .find(|r| r.1 == mult && mult > 0)
        .map_or(0, |r| r.0)
}

/// `ibv_rate_to_mbps`: -1 for an unknown rate.
#[no_mangle]
pub extern "C" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
    RATE_TABLE.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
}

/// `mbps_to_ibv_rate`: `IBV_RATE_MAX` (0) when nothing matches.
#[no_mangle]
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
    RATE_TABLE.iter().find(|r| r.2 == mbps).map_or(0, |r| r.0)
}

/// `ibv_fork_init`: nothing to do. The daemon reaches MR memory with process_vm_readv/writev,
/// never through pinned pages, so fork() needs no MADV_DONTFORK.
#[no_mangle]
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `ibv_is_fork_initialized`: `IBV_FORK_UNNEEDED`, for the reason given at [`ibv_fork_init`]
/// (the kernel answers the same when it supports copy-on-fork for pinned pages).
#[no_mangle]
pub extern "C" fn ibv_is_fork_initialized() -> c_int {
    IBV_FORK_UNNEEDED
}

/// `ibv_dontfork_range`: 0, see [`ibv_fork_init`].
#[no_mangle]
pub extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: size_t) -> c_int {
    0
}

/// `ibv_dofork_range`: 0, see [`ibv_fork_init`].
#[no_mangle]
pub extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: size_t) -> c_int {
    0
}

static SYSFS_PATH: OnceLock<CString> = OnceLock::new();

/// `ibv_get_sysfs_path`: `$SYSFS_PATH` without trailing slashes (only when not setuid),
/// else "/sys", as rdma-core does.
#[no_mangle]
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    SYSFS_PATH
        .get_or_init(|| {
            // SAFETY: getuid/geteuid have no preconditions.
            let trusted = unsafe { libc::getuid() == libc::geteuid() };
            let from_env = trusted
                .then(|| std::env::var_os("SYSFS_PATH"))
                .flatten()
                .and_then(|v| {
                    use std::os::unix::ffi::OsStrExt;
                    let bytes = v.as_bytes();
                    let bytes = &bytes[..bytes.len().min(IBV_SYSFS_PATH_MAX)];
                    let end = bytes.iter().rposition(|&b| b != b'/').map_or(0, |i| i + 1);
                    CString::new(&bytes[..end]).ok()
                });
            from_env.unwrap_or_else(|| c"/sys".to_owned())
        })
        .as_ptr()
}

/// `ibv_read_sysfs_file(dir, file, buf, size)`: reads "dir/file" into `buf`, strips one
/// trailing newline and NUL-terminates; returns the length, or -1 with errno. Implemented here
/// rather than forwarded, so it also works when this library *is* libibverbs.so.1 (librdmacm
/// reads `/sys/class/misc/rdma_cm/abi_version` with it). The shim's own devices' files come
/// from its view (`fsview`), which has no `board_id`, so `ibv_devinfo` prints none, as for
/// kernel rxe.
///
/// # Safety
/// `dir` and `file` are NULL or NUL-terminated; `buf` is NULL or valid for `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: size_t,
) -> c_int {
    ffi::int_or_minus_one(|| {
        let dir = ffi::non_null_const(dir)?;
        let file = ffi::non_null_const(file)?;
        let buf = ffi::non_null(buf)?;
        // SAFETY: non-null NUL-terminated strings per the caller.
        let (dir, file) = unsafe { (CStr::from_ptr(dir.as_ptr()), CStr::from_ptr(file.as_ptr())) };
        let mut path = dir.to_bytes().to_vec();
        path.push(b'/');
        path.extend_from_slice(file.to_bytes());
        // The shim's own devices' files come from its view of sysfs, also when no libc call
        // is interposed (the shim loaded through a replacement library).
        if let Some(text) = crate::fsview::interpose::read_view_file(&path) {
            let text = text.map_err(Errno)?;
            let len = text.len().min(size);
            // SAFETY: len <= size bytes of the caller's buffer.
            unsafe { std::ptr::copy_nonoverlapping(text.as_ptr(), buf.as_ptr().cast(), len) };
            // SAFETY: the caller's buffer of `size` bytes, `len` of them read.
            return unsafe { terminate_sysfs_read(buf.as_ptr(), len, size) };
        }
        let path = CString::new(path).map_err(|_| Errno::INVAL)?;
        // SAFETY: path is NUL-terminated.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(Errno::last());
        }
        // SAFETY: buf has `size` writable bytes per the caller.
        let len = unsafe { libc::read(fd, buf.as_ptr().cast(), size) };
        let read_errno = Errno::last();
        // SAFETY: fd is open and ours.
        unsafe { libc::close(fd) };
        if len < 0 {
            return Err(read_errno);
        }
        // SAFETY: the caller's buffer of `size` bytes, `len` of them read.
        unsafe { terminate_sysfs_read(buf.as_ptr(), len as usize, size) }
    })
}

/// Strips one trailing newline from the `len` bytes read into `buf` (of `size` bytes) and
/// NUL-terminates them, as `ibv_read_sysfs_file` does; returns the length.
///
/// # Safety
/// `buf` is writable for `size` bytes and `len <= size`.
unsafe fn terminate_sysfs_read(
    buf: *mut c_char,
    mut len: usize,
    size: usize,
) -> Result<c_int, Errno> {
    if len > 0 {
        // SAFETY: 0 < len <= size, all within the caller's buffer.
        unsafe {
            if *buf.add(len - 1) == b'\n' as c_char {
                len -= 1;
                *buf.add(len) = 0;
            } else if len < size {
                *buf.add(len) = 0;
            } else {
                // No room for the terminator: fail now rather than hand out an
                // unterminated string (rdma-core does the same).
                return Err(Errno::INVAL);
            }
        }
    }
    c_int::try_from(len).map_err(|_| Errno::INVAL)
}

/// A work request in a caller's list linked through `next` (`ibv_send_wr`, `ibv_recv_wr`).
pub(crate) trait LinkedWr {
    fn next_wr(&self) -> *mut Self;
}

impl LinkedWr for IbvSendWr {
    fn next_wr(&self) -> *mut Self {
        self.next
    }
}

impl LinkedWr for IbvRecvWr {
    fn next_wr(&self) -> *mut Self {
        self.next
    }
}

/// Posts the work requests of the list that starts at `first`, in order, until one fails, as
/// the post verbs do. Returns whether any post asked for the doorbell (the daemon sleeps), and
/// on failure the errno with the work request it stopped at (for `*bad_wr`).
///
/// # Safety
/// `first` is null or heads a list of valid work requests linked through `next`: the post
/// verbs' contract with the application.
pub(crate) unsafe fn post_each<W: LinkedWr>(
    first: *mut W,
    mut post_one: impl FnMut(&W) -> Result<bool, Errno>,
) -> (bool, Result<(), (Errno, *mut W)>) {
    let mut ring_bell = false;
    let mut cur = first;
    while !cur.is_null() {
        // SAFETY: non-null and part of the caller's list (contract above).
        let w = unsafe { &*cur };
        match post_one(w) {
            Ok(bell) => ring_bell |= bell,
            Err(e) => return (ring_bell, Err((e, cur))),
        }
        cur = w.next_wr();
    }
    (ring_bell, Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(p: *const c_char) -> String {
        // SAFETY: the helpers return static NUL-terminated strings.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    #[test]
    fn strings_cover_bounds() {
        assert_eq!(s(ibv_node_type_str(1)), "InfiniBand channel adapter");
        assert_eq!(s(ibv_node_type_str(0)), "unknown");
        assert_eq!(s(ibv_node_type_str(8)), "unknown");
        assert_eq!(s(ibv_port_state_str(4)), "active");
        assert_eq!(s(ibv_port_state_str(-1)), "unknown");
        assert_eq!(s(ibv_event_type_str(19)), "WQ fatal");
        assert_eq!(s(ibv_event_type_str(20)), "unknown");
        assert_eq!(s(ibv_wc_status_str(5)), "Work Request Flushed Error");
        assert_eq!(s(ibv_wc_status_str(c_int::MIN)), "unknown");
    }

    #[test]
    fn rates_roundtrip() {
        assert_eq!(ibv_rate_to_mbps(3), 10000);
        assert_eq!(mbps_to_ibv_rate(10000), 3);
        assert_eq!(ibv_rate_to_mult(11), -1);
        assert_eq!(mult_to_ibv_rate(-1), 0);
        assert_eq!(mult_to_ibv_rate(4), 3);
    }

    #[test]
    fn read_sysfs_file_strips_newline() {
        let dir = std::env::temp_dir().join(format!("shim-sysfs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("abi_version"), "4\n").unwrap();
        let cdir = CString::new(dir.to_str().unwrap()).unwrap();
        let mut buf = [0x55 as c_char; 8];
        // SAFETY: valid strings and an 8-byte buffer.
        let n = unsafe {
            ibv_read_sysfs_file(cdir.as_ptr(), c"abi_version".as_ptr(), buf.as_mut_ptr(), 8)
        };
        assert_eq!(n, 1);
        assert_eq!(buf[0], b'4' as c_char);
        assert_eq!(buf[1], 0);
        // SAFETY: as above; the file does not exist.
        let n = unsafe {
            ibv_read_sysfs_file(cdir.as_ptr(), c"board_id".as_ptr(), buf.as_mut_ptr(), 8)
        };
        assert_eq!(n, -1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
