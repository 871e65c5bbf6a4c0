//! The function pointers stored in `ctx->ops` and in the `verbs_context`.
//!
//! The data path (`ibv_post_send`, `ibv_poll_cq`, ...) is `static inline` in verbs.h and jumps
//! straight through these slots, so none may be NULL; they live beside their objects
//! (`cq`, `qp`, `srq`, `mw`). The remaining stubs report `EOPNOTSUPP` (XRC).

use libc::{c_int, c_void};

use crate::verbs::{cq, mw, qp, srq};

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
        alloc_mw: Some(mw::alloc_mw),
        bind_mw: Some(mw::bind_mw),
        dealloc_mw: Some(mw::dealloc_mw),
        _compat_create_cq: null,
        poll_cq: Some(cq::poll_cq),
        req_notify_cq: Some(cq::req_notify_cq),
        _compat_cq_event: null,
        _compat_resize_cq: null,
        _compat_destroy_cq: null,
        _compat_create_srq: null,
        _compat_modify_srq: null,
        _compat_query_srq: null,
        _compat_destroy_srq: null,
        post_srq_recv: Some(srq::post_srq_recv),
        _compat_create_qp: null,
        _compat_query_qp: null,
        _compat_modify_qp: null,
        _compat_destroy_qp: null,
        post_send: Some(qp::post_send),
        post_recv: Some(qp::post_recv),
        _compat_create_ah: null,
        _compat_destroy_ah: null,
        _compat_attach_mcast: null,
        _compat_detach_mcast: null,
        _compat_async_event: null,
    }
}

pub extern "C" fn open_qp(_ctx: *mut IbvContext, _attr: *mut c_void) -> *mut IbvQp {
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
