//! The function pointers stored in `ctx->ops` and in the `verbs_context`.
//!
//! The data path (`ibv_post_send`, `ibv_poll_cq`, ...) is `static inline` in verbs.h and jumps
//! straight through these slots, so none may be NULL: until CQs, QPs and SRQs exist each one
//! reports the failure the inline verb's callers expect instead of crashing.

use libc::{c_int, c_void};

use crate::abi::*;
use crate::ffi::{self, Errno};

/// `ctx->ops` for a shim context.
pub fn context_ops() -> IbvContextOps {
    let null = std::ptr::null_mut();
    IbvContextOps {
        _compat_query_device: null,
        _compat_query_port: null,
        _compat_alloc_pd: null,
        _compat_dealloc_pd: null,
        _compat_reg_mr: null,
        _compat_rereg_mr: null,
        _compat_dereg_mr: null,
        alloc_mw: Some(alloc_mw),
        bind_mw: Some(bind_mw),
        dealloc_mw: Some(dealloc_mw),
        _compat_create_cq: null,
        poll_cq: Some(poll_cq),
        req_notify_cq: Some(req_notify_cq),
        _compat_cq_event: null,
        _compat_resize_cq: null,
        _compat_destroy_cq: null,
        _compat_create_srq: null,
        _compat_modify_srq: null,
        _compat_query_srq: null,
        _compat_destroy_srq: null,
        post_srq_recv: Some(post_srq_recv),
        _compat_create_qp: null,
        _compat_query_qp: null,
        _compat_modify_qp: null,
        _compat_destroy_qp: null,
        post_send: Some(post_send),
        post_recv: Some(post_recv),
        _compat_create_ah: null,
        _compat_destroy_ah: null,
        _compat_attach_mcast: null,
        _compat_detach_mcast: null,
        _compat_async_event: null,
    }
}

/// `ibv_poll_cq`: a negative value on error (no CQ can exist yet).
extern "C" fn poll_cq(_cq: *mut IbvCq, _n: c_int, _wc: *mut IbvWc) -> c_int {
    ffi::set_errno(Errno::OPNOTSUPP);
    -1
}

/// `ibv_req_notify_cq`: errno value on error.
extern "C" fn req_notify_cq(_cq: *mut IbvCq, _solicited_only: c_int) -> c_int {
    ffi::zero_or_errno(|| Err(Errno::OPNOTSUPP))
}

/// The post verbs return an errno value and point `*bad_wr` at the first WR not posted.
unsafe fn reject_post<W>(wr: *mut W, bad_wr: *mut *mut W) -> c_int {
    if !bad_wr.is_null() {
        // SAFETY: non-null; the inline verb passes the address of the caller's bad_wr.
        unsafe { *bad_wr = wr };
    }
    ffi::zero_or_errno(|| Err(Errno::OPNOTSUPP))
}

unsafe extern "C" fn post_send(
    _qp: *mut IbvQp,
    wr: *mut IbvSendWr,
    bad_wr: *mut *mut IbvSendWr,
) -> c_int {
    // SAFETY: forwarded from the inline verb's arguments.
    unsafe { reject_post(wr, bad_wr) }
}

unsafe extern "C" fn post_recv(
    _qp: *mut IbvQp,
    wr: *mut IbvRecvWr,
    bad_wr: *mut *mut IbvRecvWr,
) -> c_int {
    // SAFETY: forwarded from the inline verb's arguments.
    unsafe { reject_post(wr, bad_wr) }
}

unsafe extern "C" fn post_srq_recv(
    _srq: *mut IbvSrq,
    wr: *mut IbvRecvWr,
    bad_wr: *mut *mut IbvRecvWr,
) -> c_int {
    // SAFETY: forwarded from the inline verb's arguments.
    unsafe { reject_post(wr, bad_wr) }
}

/// `ibv_alloc_mw`: NULL + errno.
extern "C" fn alloc_mw(_pd: *mut IbvPd, _type: c_int) -> *mut c_void {
    ffi::ptr_or_null(|| Err(Errno::OPNOTSUPP))
}

extern "C" fn bind_mw(_qp: *mut IbvQp, _mw: *mut c_void, _bind: *mut c_void) -> c_int {
    ffi::zero_or_errno(|| Err(Errno::OPNOTSUPP))
}

extern "C" fn dealloc_mw(_mw: *mut c_void) -> c_int {
    ffi::zero_or_errno(|| Err(Errno::OPNOTSUPP))
}

pub extern "C" fn create_cq_ex(_ctx: *mut IbvContext, _attr: *mut IbvCqInitAttrEx) -> *mut IbvCqEx {
    ffi::ptr_or_null(|| Err(Errno::OPNOTSUPP))
}

pub extern "C" fn create_qp_ex(_ctx: *mut IbvContext, _attr: *mut IbvQpInitAttrEx) -> *mut IbvQp {
    ffi::ptr_or_null(|| Err(Errno::OPNOTSUPP))
}

pub extern "C" fn open_qp(_ctx: *mut IbvContext, _attr: *mut c_void) -> *mut IbvQp {
    ffi::ptr_or_null(|| Err(Errno::OPNOTSUPP))
}

pub extern "C" fn create_srq_ex(
    _ctx: *mut IbvContext,
    _attr: *mut IbvSrqInitAttrEx,
) -> *mut IbvSrq {
    ffi::ptr_or_null(|| Err(Errno::OPNOTSUPP))
}

pub extern "C" fn get_srq_num(_srq: *mut IbvSrq, _num: *mut u32) -> c_int {
    ffi::zero_or_errno(|| Err(Errno::OPNOTSUPP))
}

pub extern "C" fn open_xrcd(_ctx: *mut IbvContext, _attr: *mut IbvXrcdInitAttr) -> *mut IbvXrcd {
    ffi::ptr_or_null(|| Err(Errno::OPNOTSUPP))
}

pub extern "C" fn close_xrcd(_xrcd: *mut IbvXrcd) -> c_int {
    ffi::zero_or_errno(|| Err(Errno::OPNOTSUPP))
}
