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

/// `ibv_rereg_mr`: 0, or libibverbs' codes: `IBV_REREG_MR_ERR_INPUT` (EINVAL) for what
/// libibverbs itself refuses (unknown flags, a new range without an address or length,
/// access given without `CHANGE_ACCESS`), `IBV_REREG_MR_ERR_CMD` with errno for what the
/// device refuses (no change asked for, a PD of another context, an unmapped range, a bound
/// memory window). The keys stay; `mr->pd`, `mr->addr` and `mr->length` follow the change.
/// (libibverbs also moves the fork protection of the range: softroce pins nothing.)
///
/// # Safety
/// `mr` and `pd` are NULL or any pointers; `addr` is only passed to the daemon.
#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut IbvMr,
    flags: c_int,
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: size_t,
    access: c_int,
) -> c_int {
    let (translation, change_pd, change_access) = (
        flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0,
        flags & IBV_REREG_MR_CHANGE_PD != 0,
        flags & IBV_REREG_MR_CHANGE_ACCESS != 0,
    );
    let known =
        IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS;
    let input_ok = MRS.contains(mr)
        && flags & !known == 0
        && (!translation || (length != 0 && !addr.is_null()))
        && (access == 0 || change_access);
    if !input_ok {
        ffi::set_errno(Errno::INVAL);
        return IBV_REREG_MR_ERR_INPUT;
    }
    ffi::value_or(IBV_REREG_MR_ERR_CMD, || {
        // SAFETY: registered, so a live IbvMr made by reg_mr.
        let (context, handle) = unsafe { ((*mr).context, (*mr).handle) };
        let ctx = runtime::context_from_ptr(context)?;
        let pd_handle = if change_pd {
            // A PD of this MR's context (the kernel looks it up in the same ucontext).
            if !std::ptr::eq(pd_context(pd)?, ctx) {
                return Err(Errno::INVAL);
            }
            // SAFETY: live (checked by pd_context).
            Some(unsafe { (*pd).handle })
        } else {
            None
        };
        ctx.call_done(&Request::ReregMr {
            mr: handle,
            pd: pd_handle,
            range: translation.then_some((addr as u64, length as u64)),
            access: change_access.then_some(access as u32),
        })?;
        // SAFETY: live MR (checked above); the caller does not use it concurrently.
        unsafe {
            if change_pd {
                (*mr).pd = pd;
            }
            if translation {
                ((*mr).addr, (*mr).length) = (addr, length);
            }
        }
        Ok(0)
    })
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
