//! Protection domains and memory regions: daemon objects, named by the daemon's handles.

use libc::{c_int, c_uint, c_void, size_t};
use proto::ctl::{Request, Response};

use crate::abi::*;
use crate::ffi::{self, Errno};
use crate::runtime::{self, ShimContext, MRS, PDS};

/// The context a live PD belongs to.
pub(crate) fn pd_context<'a>(pd: *mut IbvPd) -> Result<&'a ShimContext, Errno> {
    if !PDS.contains(pd) {
        return Err(Errno::INVAL);
    }
    // SAFETY: registered, so it is a live IbvPd made by ibv_alloc_pd.
    runtime::context_from_ptr(unsafe { (*pd).context })
}

/// `ibv_alloc_pd`: NULL + errno on failure.
///
/// # Safety
/// `context` is NULL or any pointer (only used if it is a live context of ours).
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut IbvContext) -> *mut IbvPd {
    ffi::ptr_or_null(|| {
        let ctx = runtime::context_from_ptr(context)?;
        let handle = match ctx.call(&Request::AllocPd { ctx: ctx.handle }, &[])?.0 {
            Response::Pd { pd } => pd,
            _ => return Err(Errno::PROTO),
        };
        let pd = Box::into_raw(Box::new(IbvPd { context, handle }));
        PDS.insert(pd);
        Ok(pd)
    })
}

/// `ibv_dealloc_pd`: 0, `EBUSY` while objects use it, or `EINVAL` for a PD that is not live.
///
/// # Safety
/// `pd` is NULL or any pointer (only freed if it is a live PD of ours).
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut IbvPd) -> c_int {
    ffi::zero_or_errno(|| {
        let ctx = pd_context(pd)?;
        // SAFETY: live (checked by pd_context).
        let handle = unsafe { (*pd).handle };
        super::released(ctx.call_done(&Request::DeallocPd { pd: handle }))?;
        if !PDS.remove(pd) {
            return Err(Errno::INVAL);
        }
        // SAFETY: it came from Box::into_raw in ibv_alloc_pd, and it has just been
        // unregistered so nothing else frees it.
        drop(unsafe { Box::from_raw(pd) });
        Ok(())
    })
}

fn reg_mr(
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: size_t,
    iova: u64,
    access: c_uint,
) -> Result<*mut IbvMr, Errno> {
    let ctx = pd_context(pd)?;
    if length == 0 {
        return Err(Errno::INVAL);
    }
    // SAFETY: live PD.
    let pd_handle = unsafe { (*pd).handle };
    let (mr, lkey, rkey) = match ctx
        .call(
            &Request::RegMr {
                pd: pd_handle,
                addr: addr as u64,
                length: length as u64,
                iova,
                access,
            },
            &[],
        )?
        .0
    {
        Response::Mr { mr, lkey, rkey } => (mr, lkey, rkey),
        _ => return Err(Errno::PROTO),
    };
    // SAFETY: live PD.
    let context = unsafe { (*pd).context };
    let p = Box::into_raw(Box::new(IbvMr {
        context,
        pd,
        addr,
        length,
        handle: mr,
        lkey,
        rkey,
    }));
    MRS.insert(p);
    Ok(p)
}

/// `ibv_reg_mr`: NULL + errno (`EFAULT` if the range is not mapped).
///
/// # Safety
/// `pd` is NULL or any pointer; `addr` is only passed to the daemon, never dereferenced here.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: size_t,
    access: c_int,
) -> *mut IbvMr {
    ffi::ptr_or_null(|| reg_mr(pd, addr, length, addr as u64, access as c_uint))
}

/// `ibv_reg_mr_iova`.
///
/// # Safety
/// As [`ibv_reg_mr`].
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: size_t,
    iova: u64,
    access: c_int,
) -> *mut IbvMr {
    ffi::ptr_or_null(|| reg_mr(pd, addr, length, iova, access as c_uint))
}

/// `ibv_reg_mr_iova2` (what the `ibv_reg_mr` macro calls for non-constant access flags).
///
/// # Safety
/// As [`ibv_reg_mr`].
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: size_t,
    iova: u64,
    access: c_uint,
) -> *mut IbvMr {
    ffi::ptr_or_null(|| reg_mr(pd, addr, length, iova, access))
}

/// `ibv_dereg_mr`: 0 or an errno value.
///
/// # Safety
/// `mr` is NULL or any pointer (only freed if it is a live MR of ours).
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut IbvMr) -> c_int {
    ffi::zero_or_errno(|| {
        if !MRS.contains(mr) {
            return Err(Errno::INVAL);
        }
        // SAFETY: registered, so a live IbvMr made by reg_mr.
        let (context, handle) = unsafe { ((*mr).context, (*mr).handle) };
        let ctx = runtime::context_from_ptr(context)?;
        super::released(ctx.call_done(&Request::DeregMr { mr: handle }))?;
        if !MRS.remove(mr) {
            return Err(Errno::INVAL);
        }
        // SAFETY: from Box::into_raw in reg_mr; unregistered just now.
        drop(unsafe { Box::from_raw(mr) });
        Ok(())
    })
}
