//! Address handles (UD destinations), held by the daemon.

use libc::c_int;
use proto::ctl::{Request, Response};

use crate::abi::*;
use crate::ffi::{self, Errno};
use crate::runtime::{self, AHS};
use crate::verbs::{pd, qp};

/// The daemon's handle of a live AH of ours, for UD send WQEs.
pub(crate) fn ah_handle(ah: *mut IbvAh) -> Option<u32> {
    // SAFETY: dereferenced only when registered, i.e. a live IbvAh.
    AHS.contains(ah).then(|| unsafe { (*ah).handle })
}

/// `ibv_create_ah`: NULL + errno. RoCE needs a GRH (`is_global`), as on rxe.
///
/// # Safety
/// `attr` is NULL or a readable `ibv_ah_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut IbvPd, attr: *mut IbvAhAttr) -> *mut IbvAh {
    ffi::ptr_or_null(|| {
        let ctx = pd::pd_context(pd)?;
        let a = ffi::non_null(attr)?;
        // SAFETY: non-null, the caller's attributes.
        let a = unsafe { a.as_ref() };
        // RoCE addresses are GIDs: the kernel's rdma_check_ah_attr refuses an AH without a
        // GRH on a RoCE port with EINVAL.
        if a.is_global == 0 {
            return Err(Errno::INVAL);
        }
        // SAFETY: live PD.
        let (context, pd_handle) = unsafe { ((*pd).context, (*pd).handle) };
        let handle = match ctx
            .call(
                &Request::CreateAh {
                    pd: pd_handle,
                    attr: qp::to_ctl_ah(a),
                },
                &[],
            )?
            .0
        {
            Response::Ah { ah } => ah,
            _ => return Err(Errno::PROTO),
        };
        let p = Box::into_raw(Box::new(IbvAh {
            context,
            pd,
            handle,
        }));
        AHS.insert(p);
        Ok(p)
    })
}

/// `ibv_destroy_ah`: 0 or errno.
///
/// # Safety
/// `ah` is NULL or any pointer.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut IbvAh) -> c_int {
    ffi::zero_or_errno(|| {
        let handle = ah_handle(ah).ok_or(Errno::INVAL)?;
        // SAFETY: live AH (checked above).
        let ctx = runtime::context_from_ptr(unsafe { (*ah).context })?;
        match ctx.call_done(&Request::DestroyAh { ah: handle }) {
            Ok(()) | Err(Errno(libc::ENODEV)) => {}
            Err(e) => return Err(e),
        }
        if !AHS.remove(ah) {
            return Err(Errno::INVAL);
        }
        // SAFETY: from Box::into_raw in ibv_create_ah, unregistered just now.
        drop(unsafe { Box::from_raw(ah) });
        Ok(())
    })
}
