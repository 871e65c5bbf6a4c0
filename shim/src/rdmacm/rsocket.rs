//! The rsocket family librdmacm exports (`rsocket`, `rbind`, ... 28 functions). rsockets run
//! on librdmacm internals (`ucma_*`) that a replaced CM does not have, so every one fails with
//! `-1` / `errno = ENOSYS`, the answer of a kernel without the call. They must exist: a name
//! the shim lacks would bind (BIND_NOW) to the real librdmacm, which would then be handed
//! nothing of its own and fail less clearly.
//!
//! Declared without parameters (x86-64 SysV lets a callee ignore its arguments) and returning
//! `c_long`: -1 reads as -1 whether the C prototype returns `int`, `ssize_t` or `off_t`.

use libc::c_long;

use crate::ffi::{self, Errno};

macro_rules! enosys {
    ($($name:ident),* $(,)?) => {
        $(
            #[doc = concat!("`", stringify!($name), "`: rsockets are not offered (-1, ENOSYS).")]
            #[no_mangle]
            pub extern "C" fn $name() -> c_long {
                ffi::set_errno(Errno(libc::ENOSYS));
                -1
            }
        )*
        /// The names, for tests.
        pub const RSOCKET_NAMES: &[&str] = &[$(stringify!($name)),*];
    };
}

enosys!(
    raccept,
    rbind,
    rclose,
    rconnect,
    rfcntl,
    rgetpeername,
    rgetsockname,
    rgetsockopt,
    riomap,
    riounmap,
    riowrite,
    rlisten,
    rpoll,
    rread,
    rreadv,
    rrecv,
    rrecvfrom,
    rrecvmsg,
    rselect,
    rsend,
    rsendmsg,
    rsendto,
    rsetsockopt,
    rshutdown,
    rsocket,
    rwrite,
    rwritev,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stubs_fail_with_enosys() {
        assert_eq!(rsocket(), -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::ENOSYS)
        );
        assert_eq!(RSOCKET_NAMES.len(), 27);
    }
}
