//! Completion channels and async events: real file descriptors, so apps can block on them,
//! make them non-blocking, and poll/epoll/select them exactly as with the kernel's uverbs fds
//! (verbs-abi.md §4).

use std::os::fd::{AsRawFd, OwnedFd};

use std::sync::atomic::Ordering;

use libc::c_int;
use proto::ctl::{Request, Response};

use crate::abi::*;
use crate::ffi::{self, Errno};
use crate::runtime::{self, AsyncEventRecord, ShimContext, COMP_CHANNELS};
use crate::verbs::{cq, qp, srq};

/// A completion channel: the public struct followed by the pipe's write end, which the daemon
/// will receive (SCM_RIGHTS) and write one 8-byte record to per CQ notification.
#[repr(C)]
pub struct ShimCompChannel {
    pub channel: IbvCompChannel,
    /// The daemon's handle for the channel.
    pub handle: u32,
    pub read_end: OwnedFd,
    pub write_end: OwnedFd,
}

/// `ibv_create_comp_channel`: NULL + errno on failure.
///
/// # Safety
/// `context` is NULL or any pointer (only used if it is a live context of ours).
#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(context: *mut IbvContext) -> *mut IbvCompChannel {
    ffi::ptr_or_null(|| {
        let ctx = runtime::context_from_ptr(context)?;
        let (read_end, write_end) = runtime::pipe()?;
        let handle = match ctx
            .call(
                &Request::CreateCompChannel { ctx: ctx.handle },
                &[write_end.as_raw_fd()],
            )?
            .0
        {
            Response::CompChannel { channel } => channel,
            _ => return Err(Errno::PROTO),
        };
        let shim = Box::new(ShimCompChannel {
            channel: IbvCompChannel {
                context,
                fd: read_end.as_raw_fd(),
                refcnt: 0,
            },
            handle,
            read_end,
            write_end,
        });
        let ch = Box::into_raw(shim).cast::<IbvCompChannel>();
        COMP_CHANNELS.insert(ch);
        Ok(ch)
    })
}

/// `ibv_destroy_comp_channel`: 0, `EBUSY` while CQs still use it, `EINVAL` if not ours; 0
/// after the device's deletion too, with or without `RDMAV_ALLOW_DISASSOC_DESTROY`.
///
/// # Safety
/// `channel` is NULL or any pointer (only freed if it is a live channel of ours).
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut IbvCompChannel) -> c_int {
    ffi::zero_or_errno(|| {
        if !COMP_CHANNELS.contains(channel) {
            return Err(Errno::INVAL);
        }
        // SAFETY: registered, so it is the first member of a live Box<ShimCompChannel>.
        let refcnt = unsafe { (*channel).refcnt };
        if refcnt > 0 {
            return Err(Errno::BUSY);
        }
        // SAFETY: registered, as above.
        let (context, handle) = unsafe {
            let shim = &*channel.cast::<ShimCompChannel>();
            (shim.channel.context, shim.handle)
        };
        // rdma-core closes the channel's descriptor and never fails here (but with EBUSY
        // above), whatever became of the device: the daemon's answer is not waited on for
        // the result. A deleted device or a lost daemon has freed its side already.
        if let Ok(ctx) = runtime::context_from_ptr(context) {
            let _ = ctx.call_done(&Request::DestroyCompChannel { channel: handle });
        }
        if !COMP_CHANNELS.remove(channel) {
            return Err(Errno::INVAL);
        }
        // SAFETY: as above; unregistered now, so this is the only owner. Dropping closes both
        // pipe ends.
        drop(unsafe { Box::from_raw(channel.cast::<ShimCompChannel>()) });
        Ok(())
    })
}

/// The CQ handle of the record [`wake_for_device_loss`] writes: no CQ has it.
pub const DEVICE_LOST: u32 = u32::MAX;

/// Writes a [`DEVICE_LOST`] record into the channel registered at `addr`, so that a reader
/// blocked in `ibv_get_cq_event` wakes (and fails with EIO, as a read of the kernel's
/// completion event file of a disassociated device does). Never blocks: a full pipe already
/// wakes its reader.
pub fn wake_for_device_loss(addr: usize) {
    // SAFETY: `addr` is a registered channel, the first member of a live ShimCompChannel
    // (the registry lock held by the caller keeps it from being freed).
    let shim = unsafe { &*(addr as *const ShimCompChannel) };
    let mut rec = [0u8; 8];
    rec[..4].copy_from_slice(&DEVICE_LOST.to_ne_bytes());
    // SAFETY: the write end is ours (the daemon writes through its own description of the
    // pipe), so making it non-blocking affects nobody else; the record is a valid buffer.
    unsafe {
        libc::fcntl(shim.write_end.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK);
        libc::write(shim.write_end.as_raw_fd(), rec.as_ptr().cast(), rec.len());
    }
}

/// Whether an async event type names a port (or the device) rather than a CQ/QP/SRQ/WQ; the
/// same split libibverbs' `ibv_get_async_event` makes when it decodes `element`.
fn is_port_event(event_type: c_int) -> bool {
    !matches!(
        event_type,
        IBV_EVENT_CQ_ERR
            | IBV_EVENT_QP_FATAL
            | IBV_EVENT_QP_REQ_ERR
            | IBV_EVENT_QP_ACCESS_ERR
            | IBV_EVENT_COMM_EST
            | IBV_EVENT_SQ_DRAINED
            | IBV_EVENT_PATH_MIG
            | IBV_EVENT_PATH_MIG_ERR
            | IBV_EVENT_QP_LAST_WQE_REACHED
            | IBV_EVENT_SRQ_ERR
            | IBV_EVENT_SRQ_LIMIT_REACHED
            | IBV_EVENT_WQ_FATAL
    )
}

/// `ibv_get_async_event`: reads one 16-byte record from `ctx->async_fd` (blocking unless the
/// app made the fd non-blocking, then -1/EAGAIN). 0 or -1 + errno.
///
/// # Safety
/// `event` is NULL or valid for a write of `struct ibv_async_event`.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(
    context: *mut IbvContext,
    event: *mut IbvAsyncEvent,
) -> c_int {
    ffi::int_or_minus_one(|| {
        let ctx = runtime::context_from_ptr(context)?;
        let out = ffi::non_null(event)?;
        // Object events for an object destroyed after the daemon queued them are skipped
        // (a destroyed object's events are never reported, as with the kernel).
        let (element, event_type) = loop {
            let mut buf = [0u8; AsyncEventRecord::LEN];
            let n = runtime::read_record(ctx.async_rx.as_raw_fd(), &mut buf)?;
            let record = AsyncEventRecord::from_bytes(&buf[..n]).ok_or(Errno::IO)?;
            let event_type = c_int::try_from(record.event_type).map_err(|_| Errno::PROTO)?;
            if is_port_event(event_type) {
                let port_num = c_int::try_from(record.element).map_err(|_| Errno::PROTO)?;
                break (IbvAsyncEventElement { port_num }, event_type);
            }
            if let Some(element) = object_element(ctx, event_type, record.element) {
                break (element, event_type);
            }
        };
        // SAFETY: non-null, writable per the caller.
        unsafe {
            out.as_ptr().write(IbvAsyncEvent {
                element,
                event_type,
            })
        };
        Ok(0)
    })
}

/// Maps an object event's `element` (QPN for QP events, the daemon's CQ/SRQ handle for CQ and
/// SRQ events) to the live object, counting it as reported so destroy waits for its ack;
/// `None` when the object is gone.
fn object_element(
    ctx: &ShimContext,
    event_type: c_int,
    element: u64,
) -> Option<IbvAsyncEventElement> {
    let key = u32::try_from(element).ok()?;
    let objects = ctx.objects();
    match event_type {
        IBV_EVENT_CQ_ERR => {
            let addr = *objects.cqs.get(&key)?;
            let cq = cq::cq_from_ptr(addr as *mut IbvCq).ok()?;
            cq.async_events_reported.fetch_add(1, Ordering::AcqRel);
            Some(IbvAsyncEventElement { cq: cq.as_cq() })
        }
        IBV_EVENT_SRQ_ERR | IBV_EVENT_SRQ_LIMIT_REACHED => {
            let addr = *objects.srqs.get(&key)?;
            let srq = srq::srq_from_ptr(addr as *mut IbvSrq).ok()?;
            srq.events_reported.fetch_add(1, Ordering::AcqRel);
            Some(IbvAsyncEventElement { srq: srq.as_srq() })
        }
        _ => {
            let addr = *objects.qps.get(&key)?;
            let qp = qp::qp_from_ptr(addr as *mut IbvQp).ok()?;
            qp.events_reported.fetch_add(1, Ordering::AcqRel);
            Some(IbvAsyncEventElement { qp: qp.as_qp() })
        }
    }
}

/// `ibv_ack_async_event`: port events need no acknowledgement; object events bump the
/// object's `events_completed`, which its destroy waits for.
///
/// # Safety
/// `event` is NULL or an event filled in by `ibv_get_async_event`.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut IbvAsyncEvent) {
    if event.is_null() {
        return;
    }
    // SAFETY: non-null; the caller passes an event ibv_get_async_event filled in.
    let ev = unsafe { *event };
    if is_port_event(ev.event_type) {
        return;
    }
    // SAFETY: for object events the union holds a pointer; each ack checks it is live.
    unsafe {
        match ev.event_type {
            IBV_EVENT_CQ_ERR => cq::ack_async_event(ev.element.cq),
            IBV_EVENT_SRQ_ERR | IBV_EVENT_SRQ_LIMIT_REACHED => srq::ack_async_event(ev.element.srq),
            _ => qp::ack_async_event(ev.element.qp),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_and_object_events_are_split_like_libibverbs() {
        assert!(is_port_event(IBV_EVENT_PORT_ACTIVE));
        assert!(is_port_event(IBV_EVENT_DEVICE_FATAL));
        assert!(is_port_event(IBV_EVENT_GID_CHANGE));
        assert!(!is_port_event(IBV_EVENT_QP_FATAL));
        assert!(!is_port_event(IBV_EVENT_CQ_ERR));
        assert!(!is_port_event(IBV_EVENT_SRQ_LIMIT_REACHED));
    }
}
