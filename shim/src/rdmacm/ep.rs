//! The endpoint helpers: `rdma_create_ep` (a synchronous id, bound or resolved from an
//! `rdma_addrinfo`, with a QP when asked), `rdma_destroy_ep`, and `rdma_get_request` (the
//! next connection request of a synchronous listener, with a QP like the endpoint's).

use libc::c_int;

use crate::abi::*;
use crate::ffi::{self, Errno};
use crate::rdmacm::abi::*;
use crate::rdmacm::exports::{create_id, destroy_id};
use crate::rdmacm::qp;
use crate::rdmacm::sockaddr as sa;
use crate::rdmacm::state::{call, id_from_ptr, ShimCmId};
use crate::rdmacm::{events, exports};
use proto::ctl::Request;

/// The timeout librdmacm's `rdma_create_ep` uses for resolution.
const EP_RESOLVE_TIMEOUT_MS: c_int = 2000;

fn create_ep(
    res: &RdmaAddrinfo,
    pd: *mut IbvPd,
    qp_init_attr: *mut IbvQpInitAttr,
) -> Result<*mut ShimCmId, Errno> {
    let qp_type = if res.ai_qp_type != 0 {
        res.ai_qp_type
    } else if res.ai_port_space == RDMA_PS_UDP {
        IBV_QPT_UD
    } else {
        IBV_QPT_RC
    };
    let p = create_id(
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        res.ai_port_space,
        qp_type,
    )?;
    // SAFETY: just created, live until destroyed below.
    let id = unsafe { &*p };
    let done = (|| {
        if res.ai_flags & RAI_PASSIVE != 0 {
            // SAFETY: the addrinfo's address (from rdma_getaddrinfo or the caller).
            let src = unsafe { sa::read(res.ai_src_addr) }?;
            let r = call(&Request::CmBind {
                id: id.handle,
                addr: src,
            })?;
            if let proto::ctl::Response::CmIdInfo(info) = r.0 {
                id.apply_info(&info)?;
            }
            if !qp_init_attr.is_null() {
                let mut st = id.state();
                // SAFETY: non-null, the caller's attributes.
                let mut a = qp::copy_init_attr(unsafe { &*qp_init_attr });
                a.qp_type = qp_type;
                st.ep_qp_init_attr = Some(Box::new(a));
                st.ep_pd = pd as usize;
            }
            if !pd.is_null() {
                // SAFETY: live id (ucma_passive_ep sets id->pd).
                unsafe { (*id.as_id_ptr()).pd = pd };
            }
            return Ok(());
        }
        // SAFETY: live id pointer.
        let idp = id.as_id_ptr();
        // SAFETY: addresses from the addrinfo (valid or NULL).
        if unsafe {
            exports::rdma_resolve_addr(idp, res.ai_src_addr, res.ai_dst_addr, EP_RESOLVE_TIMEOUT_MS)
        } != 0
        {
            return Err(Errno::last());
        }
        // SAFETY: live id.
        if unsafe { exports::rdma_resolve_route(idp, EP_RESOLVE_TIMEOUT_MS) } != 0 {
            return Err(Errno::last());
        }
        if !qp_init_attr.is_null() {
            // SAFETY: non-null, the caller's attributes.
            let a = unsafe { &mut *qp_init_attr };
            a.qp_type = qp_type;
            qp::create_qp(id, pd, a)?;
        }
        Ok(())
    })();
    if let Err(e) = done {
        let _ = destroy_id(p.cast());
        return Err(e);
    }
    Ok(p)
}

/// `rdma_create_ep`.
///
/// # Safety
/// `res` is NULL or a valid `rdma_addrinfo`; `qp_init_attr` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut RdmaCmId,
    res: *mut RdmaAddrinfo,
    pd: *mut IbvPd,
    qp_init_attr: *mut IbvQpInitAttr,
) -> c_int {
    ffi::int_or_minus_one(|| {
        let out = ffi::non_null(id)?;
        let res = ffi::non_null(res)?;
        // SAFETY: non-null, the caller's addrinfo.
        let p = create_ep(unsafe { res.as_ref() }, pd, qp_init_attr)?;
        // SAFETY: non-null out pointer.
        unsafe { out.as_ptr().write(p.cast()) };
        Ok(0)
    })
}

/// `rdma_destroy_ep`: QP, SRQ, then the id.
///
/// # Safety
/// `id` is NULL or any pointer (checked).
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut RdmaCmId) {
    ffi::infallible((), || {
        let shim = id_from_ptr(id)?;
        qp::destroy_qp(shim);
        qp::destroy_srq(shim);
        destroy_id(id)
    })
}

/// `rdma_get_request`.
///
/// # Safety
/// `id` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_request(listen: *mut RdmaCmId, id: *mut *mut RdmaCmId) -> c_int {
    ffi::int_or_minus_one(|| {
        let out = ffi::non_null(id)?;
        let l = id_from_ptr(listen)?;
        if !l.is_sync() {
            return Err(Errno::INVAL);
        }
        let ev = events::get_event(l.channel()?)?;
        // SAFETY: just handed out, live until acknowledged.
        let e = unsafe { &(*ev).ev };
        let fail = |err: Errno| {
            let _ = events::ack(ev.cast());
            Err(err)
        };
        if e.status != 0 {
            return fail(events::status_errno(e.status));
        }
        if e.event as u32 != RDMA_CM_EVENT_CONNECT_REQUEST {
            return fail(Errno::INVAL);
        }
        let child = id_from_ptr(e.id)?;
        let (attr, pd) = {
            let st = l.state();
            (
                st.ep_qp_init_attr.as_deref().map(qp::copy_init_attr),
                st.ep_pd,
            )
        };
        if let Some(mut a) = attr {
            if let Err(err) = qp::create_qp(child, pd as *mut IbvPd, &mut a) {
                let _ = events::ack(ev.cast());
                let _ = destroy_id(child.as_id_ptr());
                return Err(err);
            }
        }
        // SAFETY: live child id; it keeps the request event until its next operation.
        unsafe { (*child.as_id_ptr()).event = ev.cast() };
        // SAFETY: non-null out pointer.
        unsafe { out.as_ptr().write(child.as_id_ptr()) };
        Ok(0)
    })
}
