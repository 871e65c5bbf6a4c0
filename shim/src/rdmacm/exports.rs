//! Every `rdma_*` function librdmacm 44 exports (41), with librdmacm's return conventions:
//! 0 / -1 + `errno` for the int functions, NULL + `errno` for constructors. Panics never
//! cross the boundary (`crate::ffi` guards) and every pointer is checked against the
//! registries before use.

use std::ffi::c_char;
use std::ptr;

use libc::{c_int, c_void, sockaddr};
use proto::ctl::{CmConnParam, Request, Response};

use crate::abi::*;
use crate::ffi::{self, Errno};
use crate::rdmacm::abi::*;
use crate::rdmacm::events;
use crate::rdmacm::qp;
use crate::rdmacm::sockaddr as sa;
use crate::rdmacm::state::{
    self, call, call_done, channel_from_ptr, id_from_ptr, McastGroup, ShimChannel, ShimCmId,
    CHANNELS,
};

/// librdmacm's functions return -1 and set errno (`rdma_seterrno`).
fn rc(body: impl FnOnce() -> Result<(), Errno>) -> c_int {
    ffi::int_or_minus_one(|| body().map(|()| 0))
}

/// [`rc`] for the `rdma_create_{qp,srq}[_ex]` exports: the id checked against the registry
/// and the caller's attribute struct against NULL, then `make`.
///
/// # Safety
/// `attr` is NULL or the caller's valid, writable attributes.
unsafe fn rc_with_attr<A>(
    id: *mut RdmaCmId,
    attr: *mut A,
    make: impl FnOnce(&ShimCmId, &mut A) -> Result<(), Errno>,
) -> c_int {
    rc(|| {
        let id = id_from_ptr(id)?;
        let mut a = ffi::non_null(attr)?;
        // SAFETY: non-null, the caller's attributes (per the contract).
        make(id, unsafe { a.as_mut() })
    })
}

// ---- event channels ----

/// `rdma_create_event_channel`.
#[no_mangle]
pub extern "C" fn rdma_create_event_channel() -> *mut RdmaEventChannel {
    ffi::ptr_or_null(|| ShimChannel::create().map(|p| p.cast()))
}

/// `rdma_destroy_event_channel`.
///
/// # Safety
/// `channel` is NULL or any pointer (checked).
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut RdmaEventChannel) {
    ffi::infallible((), || {
        if !CHANNELS.remove(channel) {
            return Err(Errno::INVAL);
        }
        crate::rdmacm::state::destroyed(channel);
        // SAFETY: was registered, now ours alone.
        unsafe { ShimChannel::destroy(channel.cast()) };
        Ok(())
    })
}

/// `rdma_get_cm_event`: blocks (or `EAGAIN` on an `O_NONBLOCK` fd) for the next event.
///
/// # Safety
/// `event` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_cm_event(
    channel: *mut RdmaEventChannel,
    event: *mut *mut RdmaCmEvent,
) -> c_int {
    rc(|| {
        let out = ffi::non_null(event)?;
        let ch = match channel_from_ptr(channel) {
            Ok(ch) => ch,
            Err(_) if crate::rdmacm::state::was_destroyed(channel) => {
                events::wait_in_destroyed_channel()
            }
            Err(e) => return Err(e),
        };
        let ev = events::get_event(ch)?;
        // SAFETY: non-null, the caller's out pointer.
        unsafe { out.as_ptr().write(ev.cast()) };
        Ok(())
    })
}

/// `rdma_ack_cm_event`.
///
/// # Safety
/// `event` is NULL or any pointer (checked).
#[no_mangle]
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut RdmaCmEvent) -> c_int {
    rc(|| events::ack(event))
}

/// `rdma_event_str`.
#[no_mangle]
pub extern "C" fn rdma_event_str(event: c_int) -> *const c_char {
    event_name(event).as_ptr()
}

// ---- ids ----

/// `ucma_get_qp_type`: UD for the UDP and IPoIB port spaces, RC otherwise.
fn qp_type_of(ps: c_int) -> c_int {
    match ps {
        RDMA_PS_UDP | RDMA_PS_IPOIB => IBV_QPT_UD,
        _ => IBV_QPT_RC,
    }
}

/// Creates an id; a NULL channel makes a synchronous id with a private channel.
pub(crate) fn create_id(
    channel: *mut RdmaEventChannel,
    context: *mut c_void,
    ps: c_int,
    qp_type: c_int,
) -> Result<*mut ShimCmId, Errno> {
    let (ch_ptr, own) = if channel.is_null() {
        (ShimChannel::create()?, true)
    } else {
        (
            channel_from_ptr(channel)? as *const ShimChannel as *mut ShimChannel,
            false,
        )
    };
    // SAFETY: a live channel (checked or just created).
    let ch_handle = unsafe { (*ch_ptr).handle };
    let ps16 = u16::try_from(ps).map_err(|_| Errno::INVAL)?;
    let made = call(&Request::CmCreateId {
        channel: ch_handle,
        ps: ps16,
        qp_type: qp_type as u32,
    });
    let handle = match made {
        Ok((Response::CmId { id }, _)) => id,
        other => {
            if own {
                CHANNELS.remove(ch_ptr);
                // SAFETY: created above, just unregistered.
                unsafe { ShimChannel::destroy(ch_ptr) };
            }
            return Err(other.err().unwrap_or(Errno::PROTO));
        }
    };
    let p = ShimCmId::register(handle, ch_ptr.cast(), context, ps, qp_type, own);
    if own {
        // SAFETY: just registered.
        unsafe { &*p }.state().private_channel = ch_ptr as usize;
    }
    Ok(p)
}

/// `rdma_create_id`.
///
/// # Safety
/// `id` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut RdmaEventChannel,
    id: *mut *mut RdmaCmId,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    rc(|| {
        let out = ffi::non_null(id)?;
        let p = create_id(channel, context, ps, qp_type_of(ps))?;
        // SAFETY: non-null out pointer.
        unsafe { out.as_ptr().write(p.cast()) };
        Ok(())
    })
}

/// `rdma_destroy_id`: waits until every event of the id was acknowledged (librdmacm does),
/// then destroys it on the daemon (DREQ/REJ as needed) and frees it.
pub(crate) fn destroy_id(p: *mut RdmaCmId) -> Result<(), Errno> {
    let id = id_from_ptr(p)?;
    // SAFETY: live id.
    let held = unsafe { (*p).event };
    if !held.is_null() {
        let _ = events::ack(held);
        // SAFETY: as above.
        unsafe { (*p).event = ptr::null_mut() };
    }
    {
        let mut st = id.state();
        st.destroying = true;
        while st.events_out > 0 {
            st = id.acked.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }
    let sp = p.cast::<ShimCmId>();
    let exclusive = state::PROCESSING.write().unwrap_or_else(|e| e.into_inner());
    if !state::unregister_id(id) {
        return Err(Errno::INVAL);
    }
    drop(exclusive);
    let _ = call_done(&Request::CmDestroyId { id: id.handle });
    let private = id.state().private_channel;
    // SAFETY: unregistered (under PROCESSING exclusively, so no event processing still holds
    // it): ours alone now.
    let b = unsafe { Box::from_raw(sp) };
    drop(b);
    if private != 0 && CHANNELS.remove(private as *mut ShimChannel) {
        // SAFETY: the id's own channel, just unregistered.
        unsafe { ShimChannel::destroy(private as *mut ShimChannel) };
    }
    Ok(())
}

/// `rdma_destroy_id`.
///
/// # Safety
/// `id` is NULL or any pointer (checked).
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut RdmaCmId) -> c_int {
    rc(|| destroy_id(id))
}

fn apply_info_response(id: &ShimCmId, r: Response) -> Result<(), Errno> {
    match r {
        Response::CmIdInfo(info) => id.apply_info(&info),
        Response::Done => Ok(()),
        _ => Err(Errno::PROTO),
    }
}

/// `rdma_bind_addr`.
///
/// # Safety
/// `addr` is NULL or a valid socket address.
#[no_mangle]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut RdmaCmId, addr: *mut sockaddr) -> c_int {
    rc(|| {
        let id = id_from_ptr(id)?;
        // SAFETY: per the contract.
        let a = unsafe { sa::read(addr) }?;
        apply_info_response(
            id,
            call(&Request::CmBind {
                id: id.handle,
                addr: a,
            })?
            .0,
        )
    })
}

/// `rdma_resolve_addr`: `ADDR_RESOLVED` / `ADDR_ERROR` follow on the channel.
///
/// # Safety
/// `src_addr` is NULL or valid; `dst_addr` valid.
#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut RdmaCmId,
    src_addr: *mut sockaddr,
    dst_addr: *mut sockaddr,
    timeout_ms: c_int,
) -> c_int {
    rc(|| {
        let p = id;
        let id = id_from_ptr(id)?;
        // SAFETY: per the contract.
        let dst = unsafe { sa::read(dst_addr) }?;
        // SAFETY: per the contract.
        let src = unsafe { sa::read_optional(src_addr) }?;
        // librdmacm records the destination at once (rdma_get_peer_addr works meanwhile).
        // SAFETY: live id.
        unsafe { (*p).route.addr.dst_addr = sa::storage(dst) };
        call_done(&Request::CmResolveAddr {
            id: id.handle,
            src,
            dst,
            timeout_ms: timeout_ms.max(0) as u32,
        })?;
        events::complete(id)
    })
}

/// `rdma_resolve_route`: `ROUTE_RESOLVED` / `ROUTE_ERROR` follow.
///
/// # Safety
/// `id` is NULL or any pointer (checked).
#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut RdmaCmId, timeout_ms: c_int) -> c_int {
    rc(|| {
        let id = id_from_ptr(id)?;
        call_done(&Request::CmResolveRoute {
            id: id.handle,
            timeout_ms: timeout_ms.max(0) as u32,
        })?;
        events::complete(id)
    })
}

/// `rdma_listen`.
///
/// # Safety
/// `id` is NULL or any pointer (checked).
#[no_mangle]
pub unsafe extern "C" fn rdma_listen(id: *mut RdmaCmId, backlog: c_int) -> c_int {
    rc(|| {
        let id = id_from_ptr(id)?;
        call_done(&Request::CmListen {
            id: id.handle,
            backlog,
        })?;
        // librdmacm queries the bound address afterwards (an unbound listener got a port).
        id.refresh()
    })
}

/// Device limits on initiator depth / responder resources (`cma_device`'s).
fn device_rd_limits(id: &ShimCmId) -> (u8, u8) {
    let dev = id
        .state()
        .device
        .and_then(|i| crate::runtime::devices().get(i));
    match dev {
        Some(d) => {
            let a = &d.desc.attr.orig_attr;
            (
                a.max_qp_init_rd_atom.clamp(0, 255) as u8,
                a.max_qp_rd_atom.clamp(0, 255) as u8,
            )
        }
        None => (128, 128),
    }
}

/// librdmacm's choice of an initiator depth or responder resources (`rdma_connect`,
/// `rdma_accept`): the caller's `value`, unless it passed no `rdma_conn_param` (`given`
/// false) or the `RDMA_MAX_*` marker asking for the most available; then `fallback`.
fn rd_choice(given: bool, value: u8, max_marker: u8, fallback: u8) -> u8 {
    if given && value != max_marker {
        value
    } else {
        fallback
    }
}

/// The caller's `rdma_conn_param` (NULL allowed) as the protocol carries it, with the
/// QP's number when the id has one (`ucma_copy_conn_param_to_kern`).
fn read_conn_param(id: &ShimCmId, param: *const RdmaConnParam) -> Result<CmConnParam, Errno> {
    let mut c = CmConnParam::default();
    if !param.is_null() {
        // SAFETY: non-null, the caller's parameters.
        let p = unsafe { &*param };
        if p.private_data_len > 0 {
            if p.private_data.is_null() {
                return Err(Errno::INVAL);
            }
            // SAFETY: private_data has private_data_len readable bytes (the API contract).
            c.private_data = unsafe {
                std::slice::from_raw_parts(p.private_data.cast::<u8>(), p.private_data_len as usize)
            }
            .to_vec();
        }
        c.responder_resources = p.responder_resources;
        c.initiator_depth = p.initiator_depth;
        c.flow_control = p.flow_control;
        c.retry_count = p.retry_count;
        c.rnr_retry_count = p.rnr_retry_count;
        c.srq = p.srq;
        c.qp_num = p.qp_num;
    } else {
        // librdmacm's defaults for a NULL rdma_conn_param (ucma_copy_conn_param_to_kern).
        c.flow_control = 1;
        c.retry_count = 7;
        c.rnr_retry_count = 7;
    }
    let qpp = id.id.qp;
    if !qpp.is_null() {
        // SAFETY: the id's live QP.
        unsafe {
            c.qp_num = (*qpp).qp_num;
            c.srq = u8::from(!(*qpp).srq.is_null());
        }
    }
    Ok(c)
}

/// `rdma_connect`.
///
/// # Safety
/// `conn_param` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn rdma_connect(id: *mut RdmaCmId, conn_param: *mut RdmaConnParam) -> c_int {
    rc(|| {
        let id = id_from_ptr(id)?;
        let mut c = read_conn_param(id, conn_param)?;
        let (max_init, max_resp) = device_rd_limits(id);
        {
            let given = !conn_param.is_null();
            let mut st = id.state();
            st.initiator_depth = rd_choice(given, c.initiator_depth, RDMA_MAX_INIT_DEPTH, max_init);
            st.responder_resources =
                rd_choice(given, c.responder_resources, RDMA_MAX_RESP_RES, max_resp);
            if c.responder_resources != RDMA_MAX_RESP_RES && c.responder_resources > max_resp {
                return Err(Errno::INVAL);
            }
            c.initiator_depth = st.initiator_depth;
            c.responder_resources = st.responder_resources;
            st.connect_error = false;
        }
        call_done(&Request::CmConnect {
            id: id.handle,
            conn: c,
            psn: None,
        })?;
        events::complete(id)
    })
}

/// `rdma_accept`: for an id with a QP, RTR and RTS first (`ucma_modify_qp_rtr/rts`), then
/// REP (or SIDR_REP for UD).
///
/// # Safety
/// `conn_param` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn rdma_accept(id: *mut RdmaCmId, conn_param: *mut RdmaConnParam) -> c_int {
    rc(|| {
        let id = id_from_ptr(id)?;
        let mut c = read_conn_param(id, conn_param)?;
        let (max_init, max_resp) = device_rd_limits(id);
        let (ird, ord) = {
            let given = !conn_param.is_null();
            let mut st = id.state();
            // The passive side's fallback is what the request offered, capped by the device.
            st.initiator_depth = rd_choice(
                given,
                c.initiator_depth,
                RDMA_MAX_INIT_DEPTH,
                st.initiator_depth.min(max_init),
            );
            st.responder_resources = rd_choice(
                given,
                c.responder_resources,
                RDMA_MAX_RESP_RES,
                st.responder_resources.min(max_resp),
            );
            (st.responder_resources, st.initiator_depth)
        };
        c.initiator_depth = ord;
        c.responder_resources = ird;
        if qp::is_ud(id) {
            c.qkey = RDMA_UDP_QKEY;
        } else if !id.id.qp.is_null() {
            let moved = qp::modify_qp_rtr(id, ird).and_then(|_| qp::modify_qp_rts(id, ord));
            if let Err(e) = moved {
                let _ = qp::modify_qp_err(id);
                return Err(e);
            }
        }
        if let Err(e) = call_done(&Request::CmAccept {
            id: id.handle,
            conn: c,
        }) {
            let _ = qp::modify_qp_err(id);
            return Err(e);
        }
        // A synchronous id waits for ESTABLISHED (its held request event is acknowledged
        // first, as ucma_complete does).
        if id.is_sync() && !qp::is_ud(id) {
            return events::complete(id);
        }
        Ok(())
    })
}

fn reject(id: *mut RdmaCmId, private_data: *const c_void, len: u8) -> Result<(), Errno> {
    let id = id_from_ptr(id)?;
    let data = if len > 0 {
        if private_data.is_null() {
            return Err(Errno::INVAL);
        }
        // SAFETY: `len` readable bytes (the API contract).
        unsafe { std::slice::from_raw_parts(private_data.cast::<u8>(), len as usize) }.to_vec()
    } else {
        Vec::new()
    };
    call_done(&Request::CmReject {
        id: id.handle,
        private_data: data,
    })
}

/// `rdma_reject`.
///
/// # Safety
/// `private_data` has `private_data_len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn rdma_reject(
    id: *mut RdmaCmId,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    rc(|| reject(id, private_data, private_data_len))
}

/// `rdma_reject_ece`: ECE is not negotiated on softroce (as on rxe), so a plain reject.
///
/// # Safety
/// As [`rdma_reject`].
#[no_mangle]
pub unsafe extern "C" fn rdma_reject_ece(
    id: *mut RdmaCmId,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    rc(|| reject(id, private_data, private_data_len))
}

/// `rdma_establish`: the active side of an id without a QP (the program moved its own QP
/// after `CONNECT_RESPONSE`) sends the RTU. EINVAL when the id has a QP, as librdmacm.
///
/// # Safety
/// `id` is NULL or any pointer (checked).
#[no_mangle]
pub unsafe extern "C" fn rdma_establish(id: *mut RdmaCmId) -> c_int {
    rc(|| {
        let id = id_from_ptr(id)?;
        if !id.id.qp.is_null() {
            return Err(Errno::INVAL);
        }
        call_done(&Request::CmEstablish { id: id.handle })
    })
}

/// `rdma_notify`: `IBV_EVENT_COMM_EST` on the passive side establishes the connection
/// before the RTU arrives; other events need nothing.
///
/// # Safety
/// `id` is NULL or any pointer (checked).
#[no_mangle]
pub unsafe extern "C" fn rdma_notify(id: *mut RdmaCmId, event: c_int) -> c_int {
    rc(|| {
        let id = id_from_ptr(id)?;
        const IBV_EVENT_COMM_EST: c_int = 8;
        if event == IBV_EVENT_COMM_EST {
            call_done(&Request::CmEstablish { id: id.handle })
        } else {
            Ok(())
        }
    })
}

/// `rdma_disconnect`: the QP goes to ERR first (librdmacm does, for IB/RoCE), then DREQ.
///
/// # Safety
/// `id` is NULL or any pointer (checked).
#[no_mangle]
pub unsafe extern "C" fn rdma_disconnect(id: *mut RdmaCmId) -> c_int {
    rc(|| {
        let id = id_from_ptr(id)?;
        qp::modify_qp_err(id)?;
        call_done(&Request::CmDisconnect {
            id: id.handle,
            private_data: Vec::new(),
        })?;
        // A synchronous id waits for DISCONNECTED, as ucma_complete does.
        if id.is_sync() {
            return events::complete(id);
        }
        Ok(())
    })
}

/// `rdma_get_src_port`: the bound port, network byte order.
///
/// # Safety
/// `id` is NULL or any pointer (checked).
#[no_mangle]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut RdmaCmId) -> u16 {
    ffi::infallible(0, || {
        Ok(sa::port_be(&id_from_ptr(id)?.id.route.addr.src_addr))
    })
}

/// `rdma_get_dst_port`: the peer's port, network byte order.
///
/// # Safety
/// `id` is NULL or any pointer (checked).
#[no_mangle]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut RdmaCmId) -> u16 {
    ffi::infallible(0, || {
        Ok(sa::port_be(&id_from_ptr(id)?.id.route.addr.dst_addr))
    })
}

/// `rdma_set_option`: TOS (u8), REUSEADDR and AFONLY (int), ACK timeout and min RNR timer
/// (u8) are kept on the id and passed on to the daemon; `RDMA_OPTION_IB_PATH` is ENOSYS
/// (RoCE has no SA path records to set).
///
/// # Safety
/// `optval` has `optlen` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn rdma_set_option(
    id: *mut RdmaCmId,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    rc(|| {
        let id = id_from_ptr(id)?;
        if optval.is_null() || optlen == 0 {
            return Err(Errno::INVAL);
        }
        // SAFETY: optlen readable bytes (the API contract); bounded to a sane size.
        let value =
            unsafe { std::slice::from_raw_parts(optval.cast::<u8>(), optlen.min(4096)) }.to_vec();
        let as_int = || -> Result<i32, Errno> {
            let b: [u8; 4] = value
                .get(..4)
                .and_then(|s| s.try_into().ok())
                .ok_or(Errno::INVAL)?;
            Ok(i32::from_ne_bytes(b))
        };
        let mut opts = id.state().options;
        match (level, optname) {
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) => opts.tos = Some(value[0]),
            (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR) => opts.reuseaddr = Some(as_int()? != 0),
            (RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY) => opts.afonly = Some(as_int()? != 0),
            (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) => opts.ack_timeout = Some(value[0]),
            (RDMA_OPTION_ID, RDMA_OPTION_ID_RNR_RETRY_TIMER) => {
                if value[0] > 31 {
                    return Err(Errno::INVAL);
                }
                opts.min_rnr_timer = Some(value[0])
            }
            (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => return Err(Errno(libc::ENOSYS)),
            _ => return Err(Errno(libc::ENOSYS)),
        }
        call_done(&Request::CmSetOption {
            id: id.handle,
            level,
            name: optname,
            value,
        })?;
        id.state().options = opts;
        Ok(())
    })
}

/// `rdma_migrate_id`, as librdmacm 44 does it: events of the id go to `channel`; with a NULL
/// channel the id gets a new private channel and becomes synchronous (a synchronous id cannot
/// migrate to NULL: EINVAL). Leaving a synchronous mode, the event the id retained
/// (`id->event`) is acknowledged first and its private channel destroyed, its events in flight
/// carried to the new channel; then the call waits until every event of the id handed out
/// was acknowledged, so none is processed on the old channel after it returns.
///
/// # Safety
/// Pointers are NULL or anything (checked).
#[no_mangle]
pub unsafe extern "C" fn rdma_migrate_id(
    id: *mut RdmaCmId,
    channel: *mut RdmaEventChannel,
) -> c_int {
    rc(|| {
        let p = id;
        let id = id_from_ptr(id)?;
        let was_sync = id.is_sync();
        if was_sync && channel.is_null() {
            return Err(Errno::INVAL);
        }
        let (ch, created) = if channel.is_null() {
            (ShimChannel::create()?, true)
        } else {
            (
                channel_from_ptr(channel)? as *const ShimChannel as *mut ShimChannel,
                false,
            )
        };
        // SAFETY: live channel.
        let handle = unsafe { (*ch).handle };
        if let Err(e) = call_done(&Request::CmMigrateId {
            id: id.handle,
            channel: handle,
        }) {
            if created && CHANNELS.remove(ch) {
                // SAFETY: created above, just unregistered.
                unsafe { ShimChannel::destroy(ch) };
            }
            return Err(e);
        }
        if was_sync {
            // SAFETY: live id; a synchronous id's retained event is ours to acknowledge.
            let retained = unsafe { (*p).event };
            if !retained.is_null() {
                let _ = events::ack(retained);
                // SAFETY: as above.
                unsafe { (*p).event = std::ptr::null_mut() };
            }
        }
        let old = std::mem::replace(
            &mut id.state().private_channel,
            if created { ch as usize } else { 0 },
        );
        if old != 0 && CHANNELS.remove(old as *mut ShimChannel) {
            // SAFETY: the id's previous own channel, unregistered: only this id's events
            // were on it; those in flight move with the id.
            unsafe {
                events::carry_events(&*(old as *const ShimChannel), &*ch);
                ShimChannel::destroy(old as *mut ShimChannel);
            }
        }
        let mut st = id.state();
        id.sync.store(created, std::sync::atomic::Ordering::Release);
        // SAFETY: live id.
        unsafe { (*p).channel = ch.cast() };
        while st.events_out > 0 {
            st = id.acked.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        Ok(())
    })
}

// ---- QPs ----

/// `rdma_init_qp_attr`.
///
/// # Safety
/// `qp_attr` and `qp_attr_mask` are NULL or writable; `qp_attr->qp_state` is read.
#[no_mangle]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut RdmaCmId,
    qp_attr: *mut IbvQpAttr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    rc(|| {
        let id = id_from_ptr(id)?;
        let a = ffi::non_null(qp_attr)?;
        let m = ffi::non_null(qp_attr_mask)?;
        // SAFETY: non-null, the caller's struct.
        let state = unsafe { (*a.as_ptr()).qp_state };
        let (attr, mask) = qp::init_qp_attr(id, state)?;
        // SAFETY: non-null, writable per the contract.
        unsafe {
            a.as_ptr().write(attr);
            m.as_ptr().write(mask);
        }
        Ok(())
    })
}

/// `rdma_create_qp`.
///
/// # Safety
/// `qp_init_attr` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut RdmaCmId,
    pd: *mut IbvPd,
    qp_init_attr: *mut IbvQpInitAttr,
) -> c_int {
    // SAFETY: the export's own contract on `attr`.
    unsafe { rc_with_attr(id, qp_init_attr, |id, a| qp::create_qp(id, pd, a)) }
}

/// `rdma_create_qp_ex`.
///
/// # Safety
/// `qp_init_attr` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut RdmaCmId,
    qp_init_attr: *mut IbvQpInitAttrEx,
) -> c_int {
    // SAFETY: the export's own contract on `attr`.
    unsafe { rc_with_attr(id, qp_init_attr, qp::create_qp_ex) }
}

/// `rdma_destroy_qp`.
///
/// # Safety
/// `id` is NULL or any pointer (checked).
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut RdmaCmId) {
    ffi::infallible((), || {
        qp::destroy_qp(id_from_ptr(id)?);
        Ok(())
    })
}

/// `rdma_create_srq`.
///
/// # Safety
/// `attr` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq(
    id: *mut RdmaCmId,
    pd: *mut IbvPd,
    attr: *mut IbvSrqInitAttr,
) -> c_int {
    // SAFETY: the export's own contract on `attr`.
    unsafe { rc_with_attr(id, attr, |id, a| qp::create_srq(id, pd, a)) }
}

/// `rdma_create_srq_ex`.
///
/// # Safety
/// `attr` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq_ex(
    id: *mut RdmaCmId,
    attr: *mut IbvSrqInitAttrEx,
) -> c_int {
    // SAFETY: the export's own contract on `attr`.
    unsafe { rc_with_attr(id, attr, qp::create_srq_ex) }
}

/// `rdma_destroy_srq`.
///
/// # Safety
/// `id` is NULL or any pointer (checked).
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_srq(id: *mut RdmaCmId) {
    ffi::infallible((), || {
        qp::destroy_srq(id_from_ptr(id)?);
        Ok(())
    })
}

// ---- multicast ----

fn join(
    id: *mut RdmaCmId,
    addr: *const sockaddr,
    flags: u32,
    context: *mut c_void,
) -> Result<(), Errno> {
    let id = id_from_ptr(id)?;
    // SAFETY: per the contract of the callers.
    let a = unsafe { sa::read(addr) }?;
    id.state().mcast.push(McastGroup {
        addr: a,
        context: context as usize,
        mgid: None,
        attached_qp: 0,
    });
    let r = call_done(&Request::CmJoinMcast {
        id: id.handle,
        addr: a,
        join_state: flags as u8,
    });
    if r.is_err() {
        let mut st = id.state();
        if let Some(i) = st
            .mcast
            .iter()
            .rposition(|g| g.addr == a && g.mgid.is_none())
        {
            st.mcast.remove(i);
        }
    }
    r
}

/// `rdma_join_multicast`: `MULTICAST_JOIN` follows; the id's QP is attached then.
///
/// # Safety
/// `addr` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast(
    id: *mut RdmaCmId,
    addr: *mut sockaddr,
    context: *mut c_void,
) -> c_int {
    rc(|| join(id, addr, RDMA_MC_JOIN_FLAG_FULLMEMBER, context))
}

/// `rdma_join_multicast_ex`.
///
/// # Safety
/// `mc_join_attr` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast_ex(
    id: *mut RdmaCmId,
    mc_join_attr: *mut RdmaCmJoinMcAttrEx,
    context: *mut c_void,
) -> c_int {
    rc(|| {
        let a = ffi::non_null(mc_join_attr)?;
        // SAFETY: non-null, the caller's attributes.
        let a = unsafe { a.as_ref() };
        if a.comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS == 0 {
            return Err(Errno::INVAL);
        }
        let flags = if a.comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS != 0 {
            a.join_flags
        } else {
            RDMA_MC_JOIN_FLAG_FULLMEMBER
        };
        if flags > RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER {
            return Err(Errno::INVAL);
        }
        join(id, a.addr, flags, context)
    })
}

/// `rdma_leave_multicast`: detaches the QP, then leaves.
///
/// # Safety
/// `addr` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn rdma_leave_multicast(id: *mut RdmaCmId, addr: *mut sockaddr) -> c_int {
    rc(|| {
        let id = id_from_ptr(id)?;
        // SAFETY: per the contract.
        let a = unsafe { sa::read(addr) }?;
        let group = {
            let mut st = id.state();
            let i = st
                .mcast
                .iter()
                .position(|g| g.addr == a)
                .ok_or(Errno(libc::EADDRNOTAVAIL))?;
            st.mcast.remove(i)
        };
        if let (Some(mgid), true) = (group.mgid, group.attached_qp != 0) {
            let gid = IbvGid { raw: mgid };
            // SAFETY: the QP it was attached to (refused harmlessly if destroyed since).
            unsafe { crate::verbs::qp::ibv_detach_mcast(group.attached_qp as *mut IbvQp, &gid, 0) };
        }
        call_done(&Request::CmLeaveMcast {
            id: id.handle,
            addr: a,
        })
    })
}

// ---- devices ----

/// `rdma_get_devices`: the shared contexts of every device, NULL-terminated, `malloc`ed.
///
/// # Safety
/// `num_devices` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut IbvContext {
    ffi::ptr_or_null(|| {
        let ctxs = state::all_shared_contexts()?;
        // SAFETY: calloc of n+1 pointers; checked for NULL.
        let list = unsafe { libc::calloc(ctxs.len() + 1, std::mem::size_of::<*mut IbvContext>()) }
            .cast::<*mut IbvContext>();
        if list.is_null() {
            return Err(Errno::NOMEM);
        }
        for (i, c) in ctxs.iter().enumerate() {
            // SAFETY: i < n, within the allocation.
            unsafe { list.add(i).write(*c) };
        }
        if !num_devices.is_null() {
            // SAFETY: non-null, writable per the contract.
            unsafe { num_devices.write(ctxs.len() as c_int) };
        }
        Ok(list)
    })
}

/// `rdma_free_devices`: the list only; the contexts stay open (shared, as in librdmacm).
///
/// # Safety
/// `list` is NULL or from `rdma_get_devices`.
#[no_mangle]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut IbvContext) {
    // SAFETY: per the contract, malloc'ed by rdma_get_devices (free(NULL) is fine).
    unsafe { libc::free(list.cast()) };
}

// ---- ECE: not negotiated (as rxe) ----

/// `rdma_set_local_ece`: accepted and ignored? No: librdmacm returns EINVAL for a NULL
/// `ece`, and otherwise stores it for the REQ/REP; softroce has no ECE options, so a zero
/// `ece` is fine and anything else is EOPNOTSUPP.
///
/// # Safety
/// `ece` is NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn rdma_set_local_ece(id: *mut RdmaCmId, ece: *mut IbvEce) -> c_int {
    rc(|| {
        id_from_ptr(id)?;
        let e = ffi::non_null(ece)?;
        // SAFETY: non-null, readable.
        let e = unsafe { e.as_ref() };
        if e.vendor_id == 0 && e.options == 0 {
            Ok(())
        } else {
            Err(Errno::OPNOTSUPP)
        }
    })
}

/// `rdma_get_remote_ece`: the peer offered nothing (zero).
///
/// # Safety
/// `ece` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_remote_ece(id: *mut RdmaCmId, ece: *mut IbvEce) -> c_int {
    rc(|| {
        id_from_ptr(id)?;
        let e = ffi::non_null(ece)?;
        // SAFETY: non-null, writable.
        unsafe { e.as_ptr().write(IbvEce::default()) };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rd_choice_takes_the_callers_value_unless_absent_or_the_max_marker() {
        assert_eq!(rd_choice(true, 4, RDMA_MAX_INIT_DEPTH, 128), 4);
        assert_eq!(rd_choice(true, 0, RDMA_MAX_INIT_DEPTH, 128), 0);
        assert_eq!(
            rd_choice(true, RDMA_MAX_INIT_DEPTH, RDMA_MAX_INIT_DEPTH, 128),
            128
        );
        assert_eq!(rd_choice(false, 4, RDMA_MAX_RESP_RES, 16), 16);
    }
}
