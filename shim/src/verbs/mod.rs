//! The exported libibverbs API. Each file groups one family of verbs; `unsupported` holds every
//! remaining export as a documented-error stub.

pub mod ah;
pub mod context;
pub mod cq;
pub mod events;
pub mod helpers;
pub mod mw;
pub mod ops;
pub mod pd;
pub mod qp;
pub mod query;
pub mod srq;
pub mod unsupported;
pub mod wr;

use crate::ffi::Errno;

/// What a destroy verb makes of the daemon's answer: the object is released, or the error.
/// `ENODEV`: the daemon itself is gone, and with it everything it held: released. `EIO`: the
/// device was deleted (`softroce link del`), which the daemon answers as the kernel answers
/// every command after a device's removal: an error, as rdma-core reports it, unless the
/// program set `RDMAV_ALLOW_DISASSOC_DESTROY` (or the older `MLX4_DEVICE_FATAL_CLEANUP` to
/// other than 0), with which rdma-core calls it released, so that a program can free what it
/// holds after `IBV_EVENT_DEVICE_FATAL` (libibverbs' `verbs_is_destroy_err`).
pub fn released(answer: Result<(), Errno>) -> Result<(), Errno> {
    match answer {
        Ok(()) | Err(Errno(libc::ENODEV)) => Ok(()),
        Err(Errno(libc::EIO)) if allow_disassociate_destroy() => Ok(()),
        Err(e) => Err(e),
    }
}

/// rdma-core's `verbs_allow_disassociate_destroy`, read once from the environment.
fn allow_disassociate_destroy() -> bool {
    static ALLOW: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ALLOW.get_or_init(|| {
        let set = |v: &str| std::env::var_os(v).is_some_and(|x| x != "0");
        set("RDMAV_ALLOW_DISASSOC_DESTROY") || set("MLX4_DEVICE_FATAL_CLEANUP")
    })
}
