//! Shared receive queues: the shim produces receive WQEs into the SRQ's ring.

use std::ptr::{self, addr_of_mut};
use std::sync::atomic::AtomicU32;
use std::sync::Mutex;

use libc::c_int;
use proto::ctl::{Request, Response};

use crate::abi::*;
use crate::ffi::{self, Errno};
use crate::runtime::{self, SRQS};
use crate::shm::Mapping;
use crate::verbs::qp::{ack_events, lock, wait_async_events_acked, Producer};
use crate::verbs::{helpers, pd};

/// The SRQ's receive ring and the mapping it lives in (replaced together by a resize).
struct SrqRing {
    producer: Producer,
    /// Declared after `producer`, so the ring handle is gone before the memory is unmapped.
    _map: Mapping,
}

/// The allocation behind an `ibv_srq *`.
#[repr(C)]
pub struct ShimSrq {
    pub srq: IbvSrq,
    max_sge: u32,
    ring: Mutex<SrqRing>,
    /// Async events (limit reached, errors) handed out; destroy waits for their acks.
    pub events_reported: AtomicU32,
    /// Its doorbell in the context's table (kept by a resize).
    doorbell: u32,
}

/// Maps an `ibv_srq *` from a caller to our SRQ.
pub fn srq_from_ptr<'a>(srq: *mut IbvSrq) -> Result<&'a ShimSrq, Errno> {
    if !SRQS.contains(srq) {
        return Err(Errno::INVAL);
    }
    // SAFETY: registered, so the first member of a live Box<ShimSrq>.
    Ok(unsafe { &*srq.cast::<ShimSrq>() })
}

impl ShimSrq {
    pub fn as_srq(&self) -> *mut IbvSrq {
        (self as *const ShimSrq).cast_mut().cast()
    }
}

fn create(
    pd: *mut IbvPd,
    srq_context: *mut libc::c_void,
    attr: &mut IbvSrqAttr,
) -> Result<*mut ShimSrq, Errno> {
    let ctx = pd::pd_context(pd)?;
    if attr.max_wr == 0 {
        return Err(Errno::INVAL);
    }
    // SAFETY: live PD.
    let (context, pd_handle) = unsafe { ((*pd).context, (*pd).handle) };
    let (resp, mut fds) = ctx.call(
        &Request::CreateSrq {
            pd: pd_handle,
            max_wr: attr.max_wr,
            max_sge: attr.max_sge,
            srq_limit: attr.srq_limit,
        },
        &[],
    )?;
    let Response::Srq {
        srq: handle,
        max_wr,
        max_sge,
        ring,
        region_len,
        doorbell,
    } = resp
    else {
        return Err(Errno::PROTO);
    };
    let attached = (|| {
        let fd = fds.pop().ok_or(Errno::PROTO)?;
        let map = Mapping::map(&fd, region_len)?;
        let r = map.ring(&ring, true)?;
        Ok((map, r))
    })();
    let (map, ring) = match attached {
        Ok(x) => x,
        Err(e) => {
            let _ = ctx.call_done(&Request::DestroySrq { srq: handle });
            return Err(e);
        }
    };
    attr.max_wr = max_wr;
    attr.max_sge = max_sge;
    let p = Box::into_raw(Box::new(ShimSrq {
        srq: IbvSrq {
            context,
            srq_context,
            pd,
            handle,
            mutex: libc::PTHREAD_MUTEX_INITIALIZER,
            cond: libc::PTHREAD_COND_INITIALIZER,
            events_completed: 0,
        },
        max_sge,
        ring: Mutex::new(SrqRing {
            producer: Producer::new(ring),
            _map: map,
        }),
        events_reported: AtomicU32::new(0),
        doorbell,
    }));
    SRQS.insert(p);
    ctx.objects().srqs.insert(handle, p as usize);
    Ok(p)
}

/// `ibv_create_srq`: NULL + errno; `attr->attr` gets the granted sizes.
///
/// # Safety
/// `attr` is NULL or a valid `ibv_srq_init_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(pd: *mut IbvPd, attr: *mut IbvSrqInitAttr) -> *mut IbvSrq {
    ffi::ptr_or_null(|| {
        let mut a = ffi::non_null(attr)?;
        // SAFETY: non-null, the caller's attributes.
        let a = unsafe { a.as_mut() };
        create(pd, a.srq_context, &mut a.attr).map(|p| p.cast::<IbvSrq>())
    })
}

// IBV_SRQ_INIT_ATTR_* and enum ibv_srq_type.
const SRQ_INIT_ATTR_TYPE: u32 = 1 << 0;
const SRQ_INIT_ATTR_PD: u32 = 1 << 1;
const SRQT_BASIC: c_int = 0;

/// `verbs_context.create_srq_ex`: basic SRQs only (no XRC, no tag matching).
///
/// # Safety
/// Called by libibverbs' inline verbs with the application's arguments; pointers are only
/// dereferenced after they are found to be live objects of ours (or, for WR lists and
/// output arrays, as the verb's contract makes them valid).
pub unsafe extern "C" fn create_srq_ex(
    context: *mut IbvContext,
    attr: *mut IbvSrqInitAttrEx,
) -> *mut IbvSrq {
    ffi::ptr_or_null(|| {
        runtime::context_from_ptr(context)?;
        let mut a = ffi::non_null(attr)?;
        // SAFETY: non-null, the caller's attributes.
        let a = unsafe { a.as_mut() };
        if a.comp_mask & !(SRQ_INIT_ATTR_TYPE | SRQ_INIT_ATTR_PD) != 0
            || (a.comp_mask & SRQ_INIT_ATTR_TYPE != 0 && a.srq_type != SRQT_BASIC)
        {
            return Err(Errno::OPNOTSUPP);
        }
        if a.comp_mask & SRQ_INIT_ATTR_PD == 0 {
            return Err(Errno::INVAL);
        }
        create(a.pd, a.srq_context, &mut a.attr).map(|p| p.cast::<IbvSrq>())
    })
}

/// `IBV_SRQ_MAX_WR` of `enum ibv_srq_attr_mask`.
const SRQ_MAX_WR: c_int = 1;

/// `ibv_modify_srq`: resize (`IBV_SRQ_MAX_WR`: the SRQ gets a new ring from the daemon, which
/// took every WQE of the old one) and/or arm the limit. 0 or errno.
///
/// # Safety
/// `attr` is NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut IbvSrq,
    attr: *mut IbvSrqAttr,
    mask: c_int,
) -> c_int {
    ffi::zero_or_errno(|| {
        let shim = srq_from_ptr(srq)?;
        let a = ffi::non_null(attr)?;
        // SAFETY: non-null, the caller's attributes.
        let a = unsafe { a.as_ref() };
        let ctx = runtime::context_from_ptr(shim.srq.context)?;
        let request = Request::ModifySrq {
            srq: shim.srq.handle,
            max_wr: a.max_wr,
            srq_limit: a.srq_limit,
            mask: mask as u32,
        };
        if mask & SRQ_MAX_WR == 0 {
            return ctx.call_done(&request);
        }
        if a.max_wr == 0 {
            return Err(Errno::INVAL);
        }
        // No post may reach the old ring once the daemon has emptied it: the ring's lock is
        // held until the new one is in place.
        let mut ring = lock(&shim.ring);
        let (resp, mut fds) = ctx.call(&request, &[])?;
        let Response::Srq {
            ring: place,
            region_len,
            ..
        } = resp
        else {
            return Err(Errno::PROTO);
        };
        let fd = fds.pop().ok_or(Errno::PROTO)?;
        let map = Mapping::map(&fd, region_len)?;
        let new = map.ring(&place, true)?;
        *ring = SrqRing {
            producer: Producer::new(new),
            _map: map,
        };
        Ok(())
    })
}

/// `ibv_query_srq`.
///
/// # Safety
/// `attr` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut IbvSrq, attr: *mut IbvSrqAttr) -> c_int {
    ffi::zero_or_errno(|| {
        let shim = srq_from_ptr(srq)?;
        let out = ffi::non_null(attr)?;
        let ctx = runtime::context_from_ptr(shim.srq.context)?;
        match ctx
            .call(
                &Request::QuerySrq {
                    srq: shim.srq.handle,
                },
                &[],
            )?
            .0
        {
            Response::SrqAttr {
                max_wr,
                max_sge,
                srq_limit,
            } => {
                // SAFETY: non-null and writable per the caller.
                unsafe {
                    out.as_ptr().write(IbvSrqAttr {
                        max_wr,
                        max_sge,
                        srq_limit,
                    })
                };
                Ok(())
            }
            _ => Err(Errno::PROTO),
        }
    })
}

/// `ibv_destroy_srq`: 0 or errno (`EBUSY` while QPs use it).
///
/// # Safety
/// `srq` is NULL or any pointer.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut IbvSrq) -> c_int {
    ffi::zero_or_errno(|| {
        let shim = srq_from_ptr(srq)?;
        let ctx = runtime::context_from_ptr(shim.srq.context)?;
        let handle = shim.srq.handle;
        super::released(ctx.call_done(&Request::DestroySrq { srq: handle }))?;
        ctx.objects().srqs.remove(&handle);
        // SAFETY: live SRQ; mutex/cond initialised statically.
        unsafe {
            wait_async_events_acked(
                addr_of_mut!((*srq).mutex),
                addr_of_mut!((*srq).cond),
                addr_of_mut!((*srq).events_completed),
                &shim.events_reported,
            )
        };
        if !SRQS.remove(srq) {
            return Err(Errno::INVAL);
        }
        // SAFETY: from Box::into_raw in `create`, unregistered just now.
        drop(unsafe { Box::from_raw(srq.cast::<ShimSrq>()) });
        Ok(())
    })
}

/// Acknowledges one async event of `srq`.
pub(crate) fn ack_async_event(srq: *mut IbvSrq) {
    if !SRQS.contains(srq) {
        return;
    }
    // SAFETY: live SRQ; its mutex/cond are initialised.
    unsafe {
        ack_events(
            addr_of_mut!((*srq).mutex),
            addr_of_mut!((*srq).cond),
            addr_of_mut!((*srq).events_completed),
            1,
        )
    };
}

/// `ctx->ops.post_srq_recv`.
///
/// # Safety
/// Called by libibverbs' inline verbs with the application's arguments; pointers are only
/// dereferenced after they are found to be live objects of ours (or, for WR lists and
/// output arrays, as the verb's contract makes them valid).
pub unsafe extern "C" fn post_srq_recv(
    srq: *mut IbvSrq,
    wr: *mut IbvRecvWr,
    bad_wr: *mut *mut IbvRecvWr,
) -> c_int {
    let mut failed: *mut IbvRecvWr = ptr::null_mut();
    let rc = ffi::zero_or_errno(|| {
        let shim = srq_from_ptr(srq)?;
        let ctx = runtime::context_from_ptr(shim.srq.context)?;
        ctx.data_path_ok()?;
        let (ring_bell, result, lent) = {
            let mut ring = lock(&shim.ring);
            // SAFETY: `wr` heads the caller's list of valid WRs (the verb's contract).
            let (bell, result) =
                unsafe { helpers::post_each(wr, |w| ring.producer.post_recv(w, shim.max_sge)) };
            (bell, result, ring.producer.lent())
        };
        // Lent to the process that runs its QP's responder (the fast path): no doorbell.
        if !lent {
            ctx.rang(shim.doorbell, ring_bell);
        }
        result.map_err(|(e, at)| {
            failed = at;
            e
        })
    });
    if rc != 0 && !bad_wr.is_null() {
        // SAFETY: non-null, the caller's bad_wr.
        unsafe { *bad_wr = if failed.is_null() { wr } else { failed } };
    }
    rc
}
