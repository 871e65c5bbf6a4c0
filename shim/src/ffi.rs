//! The C boundary, in the style of rustls-ffi: every exported verb runs its body through one of
//! the guards below, which
//!
//! * catch any panic (`catch_unwind`) so unwinding never crosses `extern "C"` (that would abort
//!   the host process, or worse, be undefined behaviour);
//! * turn a `Result<_, Errno>` into the return convention the verb documents in rdma-core 44:
//!   `NULL` + `errno`, `-1` + `errno`, the errno value itself, or `-errno`.
//!
//! Bodies return `Err(Errno)` for every failure; null and foreign pointers are rejected with
//! [`Errno::INVAL`] through [`non_null`] and the object registries.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::{self, NonNull};

use libc::c_int;

/// A positive errno value (`EINVAL`, `EOPNOTSUPP`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(pub c_int);

impl Errno {
    pub const INVAL: Errno = Errno(libc::EINVAL);
    pub const NOMEM: Errno = Errno(libc::ENOMEM);
    pub const NODATA: Errno = Errno(libc::ENODATA);
    pub const NOENT: Errno = Errno(libc::ENOENT);
    pub const BUSY: Errno = Errno(libc::EBUSY);
    pub const IO: Errno = Errno(libc::EIO);
    pub const PROTO: Errno = Errno(libc::EPROTO);
    pub const AGAIN: Errno = Errno(libc::EAGAIN);
    /// What every verb that is not implemented yet reports.
    pub const OPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);

    /// The calling thread's current `errno`, as left by a failed libc call.
    pub fn last() -> Errno {
        Errno(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        )
    }
}

/// What a caught panic is reported as: the verb failed for a reason the caller cannot fix.
const PANIC_ERRNO: Errno = Errno::IO;

/// Sets the calling thread's `errno`.
pub fn set_errno(errno: Errno) {
    // SAFETY: __errno_location always returns a valid pointer to this thread's errno.
    unsafe { *libc::__errno_location() = errno.0 };
}

/// Runs `body`, mapping a panic to `Err(PANIC_ERRNO)`.
fn guarded<T>(body: impl FnOnce() -> Result<T, Errno>) -> Result<T, Errno> {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(Err(PANIC_ERRNO))
}

/// Pointer-returning verbs (`ibv_open_device`, `ibv_alloc_pd`, ...): `NULL` with `errno` set.
pub fn ptr_or_null<T>(body: impl FnOnce() -> Result<*mut T, Errno>) -> *mut T {
    value_or(ptr::null_mut(), body)
}

/// Verbs that return `0`/a count on success and `-1` with `errno` on failure
/// (`ibv_query_gid`, `ibv_query_pkey`, `ibv_get_async_event`, ...).
pub fn int_or_minus_one(body: impl FnOnce() -> Result<c_int, Errno>) -> c_int {
    value_or(-1, body)
}

/// Functions that return a value, or `sentinel` with `errno` on failure (the two above; and
/// rsockets' `riomap`, an `off_t` -1, and `riowrite`, a `size_t` -1).
pub fn value_or<T>(sentinel: T, body: impl FnOnce() -> Result<T, Errno>) -> T {
    match guarded(body) {
        Ok(v) => v,
        Err(e) => {
            set_errno(e);
            sentinel
        }
    }
}

/// Verbs that return `0` on success and the errno value itself on failure (`ibv_query_device`,
/// `ibv_dealloc_pd`, `ibv_query_port`, ...). `errno` is set as well, as rdma-core does for most
/// of them, so callers that check either one see the failure.
pub fn zero_or_errno(body: impl FnOnce() -> Result<(), Errno>) -> c_int {
    match guarded(body) {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            e.0
        }
    }
}

/// Verbs that return a non-negative count or `-errno` (`_ibv_query_gid_table`).
pub fn count_or_neg_errno(body: impl FnOnce() -> Result<isize, Errno>) -> isize {
    match guarded(body) {
        Ok(v) => v,
        Err(e) => {
            set_errno(e);
            -(e.0 as isize)
        }
    }
}

/// Verbs that cannot report failure (`void` functions, string helpers): a panic or an error
/// yields `fallback`.
pub fn infallible<T>(fallback: T, body: impl FnOnce() -> Result<T, Errno>) -> T {
    guarded(body).unwrap_or(fallback)
}

/// Rejects a null pointer from a C caller with `EINVAL`.
pub fn non_null<T>(p: *mut T) -> Result<NonNull<T>, Errno> {
    NonNull::new(p).ok_or(Errno::INVAL)
}

/// Like [`non_null`] for `const` pointers.
pub fn non_null_const<T>(p: *const T) -> Result<NonNull<T>, Errno> {
    NonNull::new(p.cast_mut()).ok_or(Errno::INVAL)
}

/// Plain-old-data C structs that are valid when all-zero (integers, raw pointers, `Option` of
/// function pointers, arrays of those).
///
/// # Safety
/// Implement only for `#[repr(C)]` types whose every field is valid as all-zero bytes.
pub unsafe trait Zeroable: Sized {
    fn zeroed() -> Self {
        // SAFETY: guaranteed by the trait's contract.
        unsafe { std::mem::zeroed() }
    }
}

/// Copies `min(len, size_of::<T>())` bytes of `value` to the caller's buffer and zeroes the rest
/// of it: the rule for the size-carrying extensible verbs (`query_device_ex`, `query_port`,
/// `_ibv_query_gid_ex`), so an older caller's shorter struct is never overrun and a newer
/// caller's longer one has defined tail bytes.
///
/// # Safety
/// `dst` must be valid for writes of `len` bytes.
pub unsafe fn copy_sized<T>(value: &T, dst: *mut u8, len: usize) {
    let n = len.min(std::mem::size_of::<T>());
    // SAFETY: the caller guarantees `dst` has `len` writable bytes; `value` has size_of::<T>().
    unsafe {
        ptr::copy_nonoverlapping((value as *const T).cast::<u8>(), dst, n);
        if len > n {
            ptr::write_bytes(dst.add(n), 0, len - n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errno() -> c_int {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    #[test]
    fn panic_becomes_errno_not_unwind() {
        let p: *mut u8 = ptr_or_null(|| panic!("boom"));
        assert!(p.is_null());
        assert_eq!(errno(), libc::EIO);
        assert_eq!(zero_or_errno(|| panic!("boom")), libc::EIO);
        assert_eq!(int_or_minus_one(|| panic!("boom")), -1);
        assert_eq!(count_or_neg_errno(|| panic!("boom")), -(libc::EIO as isize));
        assert_eq!(infallible(7, || panic!("boom")), 7);
    }

    #[test]
    fn conventions_map_errors() {
        assert_eq!(zero_or_errno(|| Err(Errno::OPNOTSUPP)), libc::EOPNOTSUPP);
        assert_eq!(errno(), libc::EOPNOTSUPP);
        assert_eq!(int_or_minus_one(|| Err(Errno::INVAL)), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(
            count_or_neg_errno(|| Err(Errno::INVAL)),
            -(libc::EINVAL as isize)
        );
        assert_eq!(int_or_minus_one(|| Ok(5)), 5);
        assert_eq!(count_or_neg_errno(|| Ok(3)), 3);
        assert!(non_null::<u8>(ptr::null_mut()).is_err());
    }

    #[test]
    fn copy_sized_truncates_and_zero_fills() {
        let v: u32 = 0x0403_0201;
        let mut buf = [0xffu8; 6];
        // SAFETY: buf has 6 bytes.
        unsafe { copy_sized(&v, buf.as_mut_ptr(), 6) };
        assert_eq!(buf, [1, 2, 3, 4, 0, 0]);
        let mut short = [0xffu8; 3];
        // SAFETY: short has 2 (<3) bytes used.
        unsafe { copy_sized(&v, short.as_mut_ptr(), 2) };
        assert_eq!(short, [1, 2, 0xff]);
    }
}
