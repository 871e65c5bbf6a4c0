//! Protection domains. Local objects for now: the daemon will learn about a PD when the first
//! MR or QP that uses it is created.

use std::sync::atomic::{AtomicU32, Ordering};

use libc::c_int;

use crate::abi::*;
use crate::ffi::{self, Errno};
use crate::runtime::{self, PDS};

/// PD handles as the kernel hands them out: small, unique per process.
static NEXT_PD_HANDLE: AtomicU32 = AtomicU32::new(1);

/// `ibv_alloc_pd`: NULL + errno on failure.
///
/// # Safety
/// `context` is NULL or any pointer (only used if it is a live context of ours).
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut IbvContext) -> *mut IbvPd {
    ffi::ptr_or_null(|| {
        runtime::context_from_ptr(context)?;
        let pd = Box::into_raw(Box::new(IbvPd {
            context,
            handle: NEXT_PD_HANDLE.fetch_add(1, Ordering::Relaxed),
        }));
        PDS.insert(pd);
        Ok(pd)
    })
}

/// `ibv_dealloc_pd`: 0, or `EINVAL` (as an errno value) for a PD that is not live.
///
/// # Safety
/// `pd` is NULL or any pointer (only freed if it is a live PD of ours).
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut IbvPd) -> c_int {
    ffi::zero_or_errno(|| {
        if !PDS.remove(pd) {
            return Err(Errno::INVAL);
        }
        // SAFETY: it was registered, so it came from Box::into_raw in ibv_alloc_pd, and it has
        // just been unregistered so nothing else frees it.
        drop(unsafe { Box::from_raw(pd) });
        Ok(())
    })
}
