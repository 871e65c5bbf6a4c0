//! Memory windows: allocated by the daemon; binds travel as send WQEs (`WrOpcode::BindMw`).

use libc::{c_int, c_uint, c_void};
use proto::ctl::{Request, Response};

use crate::abi::*;
use crate::ffi::{self, Errno};
use crate::runtime::{self, MWS};
use crate::verbs::{pd, qp};

/// `struct ibv_mw`.
#[repr(C)]
pub struct IbvMw {
    pub context: *mut IbvContext,
    pub pd: *mut IbvPd,
    pub rkey: u32,
    pub handle: u32,
    /// `enum ibv_mw_type`.
    pub mw_type: c_int,
}

/// `struct ibv_mw_bind` (what the inline `ibv_bind_mw` passes to `ops.bind_mw`).
#[repr(C)]
pub struct IbvMwBind {
    pub wr_id: u64,
    pub send_flags: c_uint,
    pub bind_info: IbvMwBindInfo,
}

/// The current R_Key of a live window of ours.
pub fn mw_rkey(mw: *mut c_void) -> Option<u32> {
    // SAFETY: dereferenced only when registered, i.e. a live IbvMw.
    MWS.contains(mw)
        .then(|| unsafe { (*mw.cast::<IbvMw>()).rkey })
}

/// `ibv_inc_rkey`: a new consumer key (low byte) for the next bind.
fn inc_rkey(rkey: u32) -> u32 {
    (rkey & 0xffff_ff00) | (rkey.wrapping_add(1) & 0xff)
}

/// `ctx->ops.alloc_mw`: NULL + errno.
///
/// # Safety
/// Called by libibverbs' inline verbs with the application's arguments; pointers are only
/// dereferenced after they are found to be live objects of ours (or, for WR lists and
/// output arrays, as the verb's contract makes them valid).
pub unsafe extern "C" fn alloc_mw(pd: *mut IbvPd, mw_type: c_int) -> *mut c_void {
    ffi::ptr_or_null(|| {
        let ctx = pd::pd_context(pd)?;
        if mw_type != IBV_MW_TYPE_1 && mw_type != IBV_MW_TYPE_2 {
            return Err(Errno::INVAL);
        }
        // SAFETY: live PD.
        let (context, pd_handle) = unsafe { ((*pd).context, (*pd).handle) };
        let (mw, rkey) = match ctx
            .call(
                &Request::AllocMw {
                    pd: pd_handle,
                    mw_type: mw_type as u32,
                },
                &[],
            )?
            .0
        {
            Response::Mw { mw, rkey } => (mw, rkey),
            _ => return Err(Errno::PROTO),
        };
        let p = Box::into_raw(Box::new(IbvMw {
            context,
            pd,
            rkey,
            handle: mw,
            mw_type,
        }));
        MWS.insert(p);
        Ok(p.cast::<c_void>())
    })
}

/// `ctx->ops.dealloc_mw`: 0 or errno.
///
/// # Safety
/// Called by libibverbs' inline verbs with the application's arguments; pointers are only
/// dereferenced after they are found to be live objects of ours (or, for WR lists and
/// output arrays, as the verb's contract makes them valid).
pub unsafe extern "C" fn dealloc_mw(mw: *mut c_void) -> c_int {
    ffi::zero_or_errno(|| {
        if !MWS.contains(mw) {
            return Err(Errno::INVAL);
        }
        let p = mw.cast::<IbvMw>();
        // SAFETY: registered, a live IbvMw.
        let (context, handle) = unsafe { ((*p).context, (*p).handle) };
        let ctx = runtime::context_from_ptr(context)?;
        super::released(ctx.call_done(&Request::DeallocMw { mw: handle }))?;
        if !MWS.remove(mw) {
            return Err(Errno::INVAL);
        }
        // SAFETY: from Box::into_raw in alloc_mw, unregistered just now.
        drop(unsafe { Box::from_raw(p) });
        Ok(())
    })
}

/// `ctx->ops.bind_mw` (type 1 windows): posts a bind WQE with the next R_Key and, once
/// posted, gives the window that key (as rxe's provider does).
///
/// # Safety
/// Called by libibverbs' inline verbs with the application's arguments; pointers are only
/// dereferenced after they are found to be live objects of ours (or, for WR lists and
/// output arrays, as the verb's contract makes them valid).
pub unsafe extern "C" fn bind_mw(qp: *mut IbvQp, mw: *mut c_void, bind: *mut c_void) -> c_int {
    ffi::zero_or_errno(|| {
        let rkey = mw_rkey(mw).ok_or(Errno::INVAL)?;
        let b = ffi::non_null(bind.cast::<IbvMwBind>())?;
        // SAFETY: non-null, the caller's ibv_mw_bind.
        let b = unsafe { b.as_ref() };
        let new_rkey = inc_rkey(rkey);
        let mut wr = IbvSendWr {
            wr_id: b.wr_id,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
            opcode: IBV_WR_BIND_MW,
            send_flags: b.send_flags,
            imm_data: 0,
            // SAFETY: an all-zero union of plain data is valid.
            wr: unsafe { std::mem::zeroed() },
            qp_type: 0,
            ext: IbvSendWrExt {
                bind_mw: IbvSendWrBindMw {
                    mw,
                    rkey: new_rkey,
                    bind_info: b.bind_info,
                },
            },
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: a valid single WR and bad_wr slot.
        let rc = unsafe { qp::post_send(qp, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(Errno(rc));
        }
        // SAFETY: live window (checked by mw_rkey above).
        unsafe { (*mw.cast::<IbvMw>()).rkey = new_rkey };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn inc_rkey_wraps_the_consumer_byte_only() {
        assert_eq!(super::inc_rkey(0x1234_56ff), 0x1234_5600);
        assert_eq!(super::inc_rkey(0x1234_5601), 0x1234_5602);
    }
}
