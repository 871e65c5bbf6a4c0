//! Device discovery and contexts: `ibv_get_device_list` .. `ibv_close_device`.

use std::os::fd::AsRawFd;
use std::ptr;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

use proto::ctl::{Request, Response};

use libc::{c_char, c_int, c_void};

use crate::abi::*;
use crate::daemon;
use crate::ffi::{self, Errno};
use crate::runtime::{self, ObjectTable, ShimContext, CONTEXTS};
use crate::shm::Mapping;
use crate::verbs::{cq, ops, qp, query, srq};

/// `ibv_get_device_list`: a NULL-terminated, `malloc`ed array; free with `ibv_free_device_list`.
///
/// # Safety
/// `num_devices` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut IbvDevice {
    ffi::ptr_or_null(|| {
        let devs = runtime::devices();
        // calloc so the list can never be read past its terminating NULL, and so a C caller
        // that (wrongly) free()s it directly does not corrupt the heap.
        // SAFETY: plain allocation; checked for NULL below.
        let list = unsafe { libc::calloc(devs.len() + 1, std::mem::size_of::<*mut IbvDevice>()) }
            .cast::<*mut IbvDevice>();
        if list.is_null() {
            return Err(Errno::NOMEM);
        }
        for (i, d) in devs.iter().enumerate() {
            // SAFETY: `list` has devs.len() + 1 slots.
            unsafe { *list.add(i) = d.as_ptr() };
        }
        if !num_devices.is_null() {
            // SAFETY: non-null, and the caller guarantees it is writable.
            unsafe { *num_devices = devs.len() as c_int };
        }
        Ok(list)
    })
}

/// `ibv_free_device_list`. The devices themselves stay valid (rdma-core keeps them while the
/// process lives, and apps use `ibv_device *` after freeing the list).
///
/// # Safety
/// `list` is NULL or came from `ibv_get_device_list`.
#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut IbvDevice) {
    // SAFETY: the caller passes what ibv_get_device_list returned (calloc), or NULL.
    unsafe { libc::free(list.cast()) };
}

/// `ibv_get_device_name`: `dev->name`, or NULL with `EINVAL` for a device that is not ours.
///
/// # Safety
/// `device` is NULL or any pointer (it is only compared, not read, unless it is ours).
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(device: *mut IbvDevice) -> *const c_char {
    ffi::ptr_or_null(|| {
        let d = runtime::device_from_ptr(device)?;
        Ok(d.dev.name.as_ptr().cast_mut())
    })
}

/// `ibv_get_device_guid`: the node GUID in network byte order (`__be64`); 0 on error.
///
/// # Safety
/// As [`ibv_get_device_name`].
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(device: *mut IbvDevice) -> u64 {
    ffi::infallible(0, || {
        let d = runtime::device_from_ptr(device).inspect_err(|e| ffi::set_errno(*e))?;
        Ok(u64::from_ne_bytes(d.desc.node_guid))
    })
}

/// `ibv_get_device_index`: the device's index, or -1.
///
/// # Safety
/// As [`ibv_get_device_name`].
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(device: *mut IbvDevice) -> c_int {
    ffi::int_or_minus_one(|| Ok(runtime::device_from_ptr(device)?.index as c_int))
}

/// `ibv_open_device`: allocates the `verbs_context` + private state, with `abi_compat` and `sz`
/// set so the inline verbs use the extended ops (verbs-abi.md §2.1).
///
/// # Safety
/// As [`ibv_get_device_name`].
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(device: *mut IbvDevice) -> *mut IbvContext {
    ffi::ptr_or_null(|| {
        let dev = runtime::device_from_ptr(device)?;
        // A device in the table implies the daemon answered once; after it went away (or in a
        // fork child that cannot reach it) the device is gone, as after a kernel hot-unplug.
        let control = daemon::connection().map_err(|e| e.errno())?;
        if control.is_lost() {
            return Err(Errno(libc::ENODEV));
        }
        let cmd_fd = control.dup_fd()?;
        let (async_rx, async_tx) = runtime::seqpacket_pair()?;
        // The daemon gets a duplicate of the event socket's write end for this context's
        // async events, and answers with the device thread's doorbell.
        // It answers with the device thread's doorbell eventfd and the client's doorbell table.
        let (handle, doorbell, bells) = match control.request(
            &Request::OpenContext {
                device: dev.desc.name.clone(),
            },
            &[async_tx.as_raw_fd()],
        )? {
            (Response::Context { ctx, doorbells_len }, mut fds) if fds.len() == 2 => {
                let table = fds.pop().ok_or(Errno::PROTO)?;
                let map = Mapping::map(&table, doorbells_len)?;
                let bells = map.doorbells()?;
                (ctx, fds.remove(0), Some((bells, map)))
            }
            (Response::Error { errno, .. }, _) => return Err(Errno(errno)),
            _ => return Err(Errno::PROTO),
        };
        let shim = Box::new(ShimContext {
            vctx: VerbsContext {
                query_port: Some(query::vctx_query_port),
                advise_mr: ptr::null_mut(),
                alloc_null_mr: ptr::null_mut(),
                read_counters: ptr::null_mut(),
                attach_counters_point_flow: ptr::null_mut(),
                create_counters: ptr::null_mut(),
                destroy_counters: ptr::null_mut(),
                reg_dm_mr: ptr::null_mut(),
                alloc_dm: ptr::null_mut(),
                free_dm: ptr::null_mut(),
                modify_flow_action_esp: ptr::null_mut(),
                destroy_flow_action: ptr::null_mut(),
                create_flow_action_esp: ptr::null_mut(),
                modify_qp_rate_limit: ptr::null_mut(),
                alloc_parent_domain: ptr::null_mut(),
                dealloc_td: ptr::null_mut(),
                alloc_td: ptr::null_mut(),
                modify_cq: ptr::null_mut(),
                post_srq_ops: ptr::null_mut(),
                destroy_rwq_ind_table: ptr::null_mut(),
                create_rwq_ind_table: ptr::null_mut(),
                destroy_wq: ptr::null_mut(),
                modify_wq: ptr::null_mut(),
                create_wq: ptr::null_mut(),
                query_rt_values: ptr::null_mut(),
                create_cq_ex: Some(cq::create_cq_ex),
                priv_: ptr::null_mut(),
                query_device_ex: Some(query::vctx_query_device_ex),
                ibv_destroy_flow: ptr::null_mut(),
                ABI_placeholder2: ptr::null_mut(),
                ibv_create_flow: ptr::null_mut(),
                ABI_placeholder1: ptr::null_mut(),
                open_qp: Some(ops::open_qp),
                create_qp_ex: Some(qp::create_qp_ex),
                get_srq_num: Some(ops::get_srq_num),
                create_srq_ex: Some(srq::create_srq_ex),
                open_xrcd: Some(ops::open_xrcd),
                // ibv_close_xrcd calls this without checking it (verbs-abi.md §2.1), so it must
                // be set whenever open_xrcd is.
                close_xrcd: Some(ops::close_xrcd),
                _ABI_placeholder3: 0,
                sz: std::mem::size_of::<VerbsContext>(),
                context: IbvContext {
                    device,
                    ops: ops::context_ops(),
                    cmd_fd: cmd_fd.as_raw_fd(),
                    async_fd: async_rx.as_raw_fd(),
                    num_comp_vectors: dev.desc.num_comp_vectors,
                    mutex: libc::PTHREAD_MUTEX_INITIALIZER,
                    abi_compat: VERBS_ABI_IS_EXTENDED as *mut c_void,
                },
            },
            device: dev,
            control,
            cmd_fd,
            async_tx,
            async_rx,
            fatal_posted: AtomicBool::new(false),
            handle,
            doorbell,
            bells,
            ring_chunks: Mutex::new(Default::default()),
            objects: Mutex::new(ObjectTable::default()),
        });
        let raw = Box::into_raw(shim);
        // SAFETY: `raw` is a fresh, valid allocation; take the address of its context member.
        let ctx = unsafe { ptr::addr_of_mut!((*raw).vctx.context) };
        CONTEXTS.insert(ctx);
        // The daemon may have gone between the check above and the insert, after the monitor
        // thread walked the registry: this context must still learn about it.
        if control.is_lost() {
            // SAFETY: `raw` is live; it was just registered and not yet returned to anyone.
            unsafe { (*raw).post_device_fatal() };
        }
        Ok(ctx)
    })
}

/// `ibv_close_device`: 0, or `EINVAL` for a context that is not ours (or already closed).
///
/// # Safety
/// `context` is NULL or any pointer (only dereferenced when it is a live context of ours).
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(context: *mut IbvContext) -> c_int {
    ffi::zero_or_errno(|| {
        if !CONTEXTS.remove(context) {
            return Err(Errno::INVAL);
        }
        // SAFETY: it was registered, so it is the context member of a Box<ShimContext> made by
        // ibv_open_device, now unregistered so no other call can reach it.
        let shim = unsafe {
            Box::from_raw(
                context
                    .cast::<u8>()
                    .sub(runtime::CONTEXT_OFFSET)
                    .cast::<ShimContext>(),
            )
        };
        // The daemon drops the context's event socket; a daemon that is gone has nothing to
        // release, so its failure does not fail the close (as with a removed kernel device).
        let _ = shim.call_done(&Request::CloseContext { ctx: shim.handle });
        drop(shim); // closes cmd_fd and both ends of the async socket
        Ok(())
    })
}

/// `ibv_import_device(cmd_fd)`: sharing a context across processes needs the daemon.
#[no_mangle]
pub extern "C" fn ibv_import_device(_cmd_fd: c_int) -> *mut IbvContext {
    ffi::ptr_or_null(|| Err(Errno::OPNOTSUPP))
}
