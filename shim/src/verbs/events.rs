//! Completion channels and async events: real file descriptors, so apps can block on them,
//! make them non-blocking, and poll/epoll/select them exactly as with the kernel's uverbs fds
//! (verbs-abi.md §4).

use std::os::fd::{AsRawFd, OwnedFd};

use libc::{c_int, c_uint, c_void};

use crate::abi::*;
use crate::ffi::{self, Errno};
use crate::runtime::{self, AsyncEventRecord, COMP_CHANNELS};

/// A completion channel: the public struct followed by the pipe's write end, which the daemon
/// will receive (SCM_RIGHTS) and write one 8-byte record to per CQ notification.
#[repr(C)]
pub struct ShimCompChannel {
    pub channel: IbvCompChannel,
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
        runtime::context_from_ptr(context)?;
        let (read_end, write_end) = runtime::pipe()?;
        let shim = Box::new(ShimCompChannel {
            channel: IbvCompChannel {
                context,
                fd: read_end.as_raw_fd(),
                refcnt: 0,
            },
            read_end,
            write_end,
        });
        let ch = Box::into_raw(shim).cast::<IbvCompChannel>();
        COMP_CHANNELS.insert(ch);
        Ok(ch)
    })
}

/// `ibv_destroy_comp_channel`: 0, `EBUSY` while CQs still use it, `EINVAL` if not ours.
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
        if !COMP_CHANNELS.remove(channel) {
            return Err(Errno::INVAL);
        }
        // SAFETY: as above; unregistered now, so this is the only owner. Dropping closes both
        // pipe ends.
        drop(unsafe { Box::from_raw(channel.cast::<ShimCompChannel>()) });
        Ok(())
    })
}

/// `ibv_get_cq_event`: -1 + errno. No CQ can be created yet, so no event can ever be queued.
#[no_mangle]
pub extern "C" fn ibv_get_cq_event(
    _channel: *mut IbvCompChannel,
    _cq: *mut *mut IbvCq,
    _cq_context: *mut *mut c_void,
) -> c_int {
    ffi::int_or_minus_one(|| Err(Errno::OPNOTSUPP))
}

/// `ibv_ack_cq_events`: nothing to acknowledge until CQs exist.
#[no_mangle]
pub extern "C" fn ibv_ack_cq_events(_cq: *mut IbvCq, _nevents: c_uint) {}

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
        let mut buf = [0u8; AsyncEventRecord::LEN];
        let n = runtime::read_record(ctx.async_rx.as_raw_fd(), &mut buf)?;
        let record = AsyncEventRecord::from_bytes(&buf[..n]).ok_or(Errno::IO)?;
        let event_type = c_int::try_from(record.event_type).map_err(|_| Errno::PROTO)?;
        if !is_port_event(event_type) {
            // Object events need the CQ/QP/SRQ token table, which comes with those objects.
            return Err(Errno::PROTO);
        }
        let port_num = c_int::try_from(record.element).map_err(|_| Errno::PROTO)?;
        // SAFETY: non-null, writable per the caller.
        unsafe {
            out.as_ptr().write(IbvAsyncEvent {
                element: IbvAsyncEventElement { port_num },
                event_type,
            })
        };
        Ok(0)
    })
}

/// `ibv_ack_async_event`: port events need no acknowledgement; object events (not produced
/// yet) will bump the object's `events_completed` here.
#[no_mangle]
pub extern "C" fn ibv_ack_async_event(_event: *mut IbvAsyncEvent) {}

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
