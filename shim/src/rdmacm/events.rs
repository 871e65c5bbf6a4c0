//! `rdma_get_cm_event` / `rdma_ack_cm_event`: one `CmEventMsg` datagram from the channel's
//! socket becomes one `struct rdma_cm_event`, processed as librdmacm's `rdma_get_cm_event`
//! processes the kernel's: a `CONNECT_REQUEST` creates the child id (with `verbs` set), a
//! `CONNECT_RESPONSE` on an id that has a QP moves it to RTR and RTS, sends the RTU and is
//! reported as `ESTABLISHED`, a `MULTICAST_JOIN` attaches the id's QP to the group.

use std::ptr;

use libc::c_int;
use proto::ctl::{self, CmEventMsg, Request};

use crate::abi::*;
use crate::ffi::{Errno, Zeroable};
use crate::rdmacm::abi::*;
use crate::rdmacm::qp;
use crate::rdmacm::state::{
    self, call_done, id_by_handle, ShimChannel, ShimCmId, ShimEvent, EVENTS,
};
use crate::runtime::read_record;
use crate::verbs;

/// The longest event datagram accepted (private data is at most 196 bytes; addresses and
/// the path add a few hundred).
const MAX_EVENT: usize = 8192;

/// Reads the next event of `ch` that still has a live id, processes it and hands it out.
/// Blocking or `EAGAIN` follows the fd's mode (`O_NONBLOCK` set by the application).
/// Another thread destroyed the channel while this one waited in it (rping's cm thread at
/// exit, while its main thread tears down). The kernel keeps such a reader blocked (it holds
/// the file); so does this, rather than report an error the program would print and exit on
/// (a full run saw rping's cm thread fail with EBADF there).
pub(crate) fn wait_in_destroyed_channel() -> ! {
    loop {
        std::thread::park();
    }
}

pub fn get_event(ch: &ShimChannel) -> Result<*mut ShimEvent, Errno> {
    let mut buf = vec![0u8; MAX_EVENT];
    let fd = ch.raw_fd();
    let ch_ptr = ch as *const ShimChannel;
    loop {
        let carried = lock_carried(ch).pop_front();
        let n = match carried {
            Some(record) => {
                let n = record.len().min(buf.len());
                buf[..n].copy_from_slice(&record[..n]);
                n
            }
            None => match read_record(fd, &mut buf) {
                Ok(n) => n,
                // Destroyed (its descriptor closed) between this thread's check of the
                // channel and its read: as below.
                Err(_) if !state::CHANNELS.contains(ch_ptr) => wait_in_destroyed_channel(),
                Err(e) => return Err(e),
            },
        };
        if n == 0 {
            if !state::CHANNELS.contains(ch_ptr) {
                wait_in_destroyed_channel();
            }
            // The daemon closed the channel (it is gone): as when the kernel removes the
            // device, every id of the channel that is on a device gets DEVICE_REMOVAL once;
            // after that, ENODEV.
            if let Some(ev) = device_removal(ch_ptr) {
                return Ok(ev);
            }
            return Err(Errno(libc::ENODEV));
        }
        let msg: CmEventMsg = match ctl::decode(&buf[..n]) {
            Ok(m) => m,
            Err(_) => return Err(Errno::PROTO),
        };
        // Processing holds PROCESSING shared: rdma_destroy_id frees an id only under it
        // exclusively, so an id found by its handle here stays alive until handed out.
        let processed = {
            let _shared = state::PROCESSING.read().unwrap_or_else(|e| e.into_inner());
            process(msg)
        };
        if let Some(ev) = processed? {
            return Ok(ev);
        }
    }
}

fn lock_carried(
    ch: &ShimChannel,
) -> std::sync::MutexGuard<'_, std::collections::VecDeque<Vec<u8>>> {
    ch.carried.lock().unwrap_or_else(|e| e.into_inner())
}

/// Moves the event records waiting on channel `from` (read without blocking, and those carried
/// to it before) to channel `to`, where `rdma_get_cm_event` reads them first: the events in
/// flight of an id that `rdma_migrate_id` moves off its private channel, which holds only that
/// id's events. (The kernel moves them between its files; here the daemon has already written
/// them into the old channel's socket.)
pub fn carry_events(from: &ShimChannel, to: &ShimChannel) {
    let mut moved: Vec<Vec<u8>> = lock_carried(from).drain(..).collect();
    let mut buf = vec![0u8; MAX_EVENT];
    loop {
        // SAFETY: our own descriptor and buffer.
        let n = unsafe {
            libc::recv(
                from.raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n <= 0 {
            break;
        }
        moved.push(buf[..n as usize].to_vec());
    }
    lock_carried(to).extend(moved);
}

/// The next `DEVICE_REMOVAL` for an id of channel `ch` not told yet, if any.
fn device_removal(ch: *const ShimChannel) -> Option<*mut ShimEvent> {
    let mut target = 0usize;
    state::IDS.for_each_live(|addr| {
        if target != 0 {
            return;
        }
        // SAFETY: registered (the registry lock is held), so a live ShimCmId.
        let id = unsafe { &*(addr as *const ShimCmId) };
        if std::ptr::eq(id.id.channel.cast::<ShimChannel>(), ch) && !id.id.verbs.is_null() {
            let mut st = id.state();
            if !st.removal_reported && !st.destroying {
                st.removal_reported = true;
                target = addr;
            }
        }
    });
    if target == 0 {
        return None;
    }
    let _shared = state::PROCESSING.read().unwrap_or_else(|e| e.into_inner());
    let id = state::id_from_ptr(target as *mut RdmaCmId).ok()?;
    let mut ev = Box::new(ShimEvent {
        ev: RdmaCmEvent::zeroed(),
        private_data: Vec::new(),
        owner: ptr::null_mut(),
    });
    ev.ev.id = id.as_id_ptr();
    ev.ev.event = RDMA_CM_EVENT_DEVICE_REMOVAL as c_int;
    Some(hand_out(ev, id))
}

/// Turns one message into a handed-out event, or `None` when it is consumed here (its id is
/// gone, or librdmacm would swallow it).
fn process(msg: CmEventMsg) -> Result<Option<*mut ShimEvent>, Errno> {
    let Some(id) = id_by_handle(msg.id) else {
        // The id was destroyed meanwhile: a request for it is refused on the daemon by
        // destroying the new id (REJ), anything else is dropped.
        if let Some(child) = &msg.child {
            let _ = call_done(&Request::CmDestroyId { id: child.id });
        }
        return Ok(None);
    };
    if id.state().destroying {
        if let Some(child) = &msg.child {
            let _ = call_done(&Request::CmDestroyId { id: child.id });
        }
        return Ok(None);
    }
    if let Some(info) = &msg.info {
        id.apply_info(info)?;
    }
    let mut ev = Box::new(ShimEvent {
        ev: RdmaCmEvent::zeroed(),
        private_data: msg.conn.private_data.clone(),
        owner: ptr::null_mut(),
    });
    ev.ev.id = id.as_id_ptr();
    ev.ev.event = msg.event as c_int;
    ev.ev.status = msg.status;
    let mut owner: &ShimCmId = id;
    match msg.event {
        RDMA_CM_EVENT_CONNECT_REQUEST => {
            let Some(child_info) = &msg.child else {
                return Err(Errno::PROTO);
            };
            let child = new_child(id, child_info)?;
            {
                let mut st = child.state();
                st.initiator_depth = msg.conn.initiator_depth;
                st.responder_resources = msg.conn.responder_resources;
            }
            ev.ev.listen_id = id.as_id_ptr();
            ev.ev.id = child.as_id_ptr();
            owner = child;
        }
        RDMA_CM_EVENT_CONNECT_RESPONSE if !id.id.qp.is_null() => {
            // ucma_process_conn_resp: the QP to RTR/RTS, then the RTU, then ESTABLISHED.
            let (ird, ord) = {
                let st = id.state();
                (st.responder_resources, st.initiator_depth)
            };
            let done = qp::modify_qp_rtr(id, ird)
                .and_then(|_| qp::modify_qp_rts(id, ord))
                .and_then(|_| call_done(&Request::CmEstablish { id: id.handle }));
            match done {
                Ok(()) => ev.ev.event = RDMA_CM_EVENT_ESTABLISHED as c_int,
                Err(e) => {
                    let _ = qp::modify_qp_err(id);
                    id.state().connect_error = true;
                    ev.ev.event = RDMA_CM_EVENT_CONNECT_ERROR as c_int;
                    ev.ev.status = -e.0;
                }
            }
        }
        RDMA_CM_EVENT_REJECTED => {
            if id.state().connect_error {
                return Ok(None);
            }
            let _ = qp::modify_qp_err(id);
        }
        RDMA_CM_EVENT_DISCONNECTED if id.state().connect_error => return Ok(None),
        RDMA_CM_EVENT_MULTICAST_JOIN | RDMA_CM_EVENT_MULTICAST_ERROR => {
            return Ok(Some(multicast_event(id, ev, &msg)?));
        }
        _ => {}
    }
    fill_params(&mut ev, owner, &msg);
    Ok(Some(hand_out(ev, owner)))
}

/// `param.conn` (connected port spaces) or `param.ud` (UD ids), pointing at the event's own
/// copy of the private data.
fn fill_params(ev: &mut ShimEvent, id: &ShimCmId, msg: &CmEventMsg) {
    let pd_ptr = if ev.private_data.is_empty() {
        ptr::null()
    } else {
        ev.private_data.as_ptr().cast()
    };
    let pd_len = ev.private_data.len().min(255) as u8;
    if qp::is_ud(id) || msg.ud.is_some() {
        let ud = msg.ud.unwrap_or_default();
        ev.ev.param.ud = RdmaUdParam {
            private_data: pd_ptr,
            private_data_len: pd_len,
            ah_attr: verbs::qp::from_ctl_ah(&ud.ah_attr),
            qp_num: ud.qp_num,
            qkey: ud.qkey,
        };
    } else {
        let c = &msg.conn;
        ev.ev.param.conn = RdmaConnParam {
            private_data: pd_ptr,
            private_data_len: pd_len,
            responder_resources: c.responder_resources,
            initiator_depth: c.initiator_depth,
            flow_control: c.flow_control,
            retry_count: c.retry_count,
            rnr_retry_count: c.rnr_retry_count,
            srq: c.srq,
            qp_num: c.qp_num,
        };
    }
}

/// `MULTICAST_JOIN` / `MULTICAST_ERROR`: `param.ud.private_data` is the context given to
/// `rdma_join_multicast` (librdmacm's `mc->context`); on a join the id's QP is attached to
/// the group, as `ucma_process_join` does.
fn multicast_event(
    id: &ShimCmId,
    mut ev: Box<ShimEvent>,
    msg: &CmEventMsg,
) -> Result<*mut ShimEvent, Errno> {
    let ud = msg.ud.unwrap_or_default();
    let mgid = ud.ah_attr.dgid;
    let mut context = 0usize;
    {
        let mut st = id.state();
        // The group is named by its GID; the first group still waiting for its answer is it
        // when the daemon's GID does not match (a join error has no GID).
        let idx = st
            .mcast
            .iter()
            .position(|g| g.mgid == Some(mgid))
            .or_else(|| st.mcast.iter().position(|g| g.mgid.is_none()));
        if let Some(i) = idx {
            let g = &mut st.mcast[i];
            context = g.context;
            if msg.event == RDMA_CM_EVENT_MULTICAST_JOIN {
                g.mgid = Some(mgid);
            }
        }
    }
    if msg.event == RDMA_CM_EVENT_MULTICAST_JOIN && !id.id.qp.is_null() {
        let gid = IbvGid { raw: mgid };
        // SAFETY: the id's live QP and a valid GID.
        let rc = unsafe { verbs::qp::ibv_attach_mcast(id.id.qp, &gid, 0) };
        if rc != 0 {
            ev.ev.event = RDMA_CM_EVENT_MULTICAST_ERROR as c_int;
            ev.ev.status = -rc;
        } else if let Some(g) = id.state().mcast.iter_mut().find(|g| g.mgid == Some(mgid)) {
            g.attached_qp = id.id.qp as usize;
        }
    }
    ev.ev.param.ud = RdmaUdParam {
        private_data: context as *const libc::c_void,
        private_data_len: 0,
        ah_attr: verbs::qp::from_ctl_ah(&ud.ah_attr),
        qp_num: ud.qp_num,
        qkey: ud.qkey,
    };
    Ok(hand_out(ev, id))
}

/// Registers the event and counts it against `owner` (destroy waits for its ack).
fn hand_out(mut ev: Box<ShimEvent>, owner: &ShimCmId) -> *mut ShimEvent {
    owner.state().events_out += 1;
    ev.owner = (owner as *const ShimCmId).cast_mut();
    let p = Box::into_raw(ev);
    EVENTS.insert(p);
    p
}

/// The new id of a `CONNECT_REQUEST`: on the listener's channel with the listener's context
/// (as the kernel's `ucma_event_handler` makes it), its device's shared `verbs`. A child of a
/// synchronous listener (`rdma_create_ep` + `rdma_get_request`) is moved to a channel of its
/// own, as librdmacm's `ucma_process_conn_req` does.
fn new_child<'a>(listen: &ShimCmId, info: &ctl::CmIdInfo) -> Result<&'a ShimCmId, Errno> {
    let p = ShimCmId::register(
        info.id,
        listen.id.channel,
        listen.id.context,
        listen.id.ps,
        listen.id.qp_type,
        listen.is_sync(),
    );
    // SAFETY: just registered, live.
    let child = unsafe { &*p };
    let setup = (|| {
        child.apply_info(info)?;
        if listen.is_sync() {
            let ch = ShimChannel::create()?;
            // SAFETY: just created, live.
            let handle = unsafe { (*ch).handle };
            if let Err(e) = call_done(&Request::CmMigrateId {
                id: child.handle,
                channel: handle,
            }) {
                state::CHANNELS.remove(ch);
                // SAFETY: created above and just unregistered.
                unsafe { ShimChannel::destroy(ch) };
                return Err(e);
            }
            // SAFETY: p is the live child.
            unsafe { (*p).id.channel = ch.cast() };
            child.state().private_channel = ch as usize;
        }
        Ok(())
    })();
    if let Err(e) = setup {
        state::unregister_id(child);
        let _ = call_done(&Request::CmDestroyId { id: info.id });
        // SAFETY: unregistered; nobody else holds it.
        drop(unsafe { Box::from_raw(p) });
        return Err(e);
    }
    Ok(child)
}

/// `rdma_ack_cm_event`.
pub fn ack(p: *mut RdmaCmEvent) -> Result<(), Errno> {
    if !EVENTS.remove(p) {
        return Err(Errno::INVAL);
    }
    // SAFETY: was registered: a live Box<ShimEvent> (first member at the same address).
    let ev = unsafe { Box::from_raw(p.cast::<ShimEvent>()) };
    if state::IDS.contains(ev.owner) {
        // SAFETY: registered, live.
        let owner = unsafe { &*ev.owner };
        let mut st = owner.state();
        st.events_out = st.events_out.saturating_sub(1);
        // Notified under the lock: rdma_destroy_id, woken by this, may free the id as soon as
        // it gets the lock, so nothing of the id is touched after the guard is dropped.
        owner.acked.notify_all();
        drop(st);
    }
    Ok(())
}

/// What librdmacm's `ucma_complete` makes of a synchronous id's event: 0, or the errno.
fn complete_status(ev: &RdmaCmEvent) -> Result<(), Errno> {
    if ev.status == 0 {
        return match ev.event as u32 {
            RDMA_CM_EVENT_ADDR_ERROR
            | RDMA_CM_EVENT_ROUTE_ERROR
            | RDMA_CM_EVENT_CONNECT_ERROR
            | RDMA_CM_EVENT_UNREACHABLE => Err(Errno(libc::EHOSTUNREACH)),
            RDMA_CM_EVENT_REJECTED => Err(Errno(libc::ECONNREFUSED)),
            _ => Ok(()),
        };
    }
    if ev.event as u32 == RDMA_CM_EVENT_REJECTED {
        Err(Errno(libc::ECONNREFUSED))
    } else {
        Err(status_errno(ev.status))
    }
}

/// The errno a non-zero event `status` stands for: librdmacm's statuses are `-errno` (some
/// are positive, a REJ reason). The status comes from the daemon; `i32::MIN` has no positive
/// form (negating it overflowed, a panic that left the event unacknowledged): EIO.
pub fn status_errno(status: c_int) -> Errno {
    Errno(status.checked_abs().unwrap_or(libc::EIO))
}

/// librdmacm's `ucma_complete`: a synchronous id waits for the event its operation raises
/// and keeps it in `id->event` (acknowledged by the next operation or `rdma_destroy_id`).
pub fn complete(id: &ShimCmId) -> Result<(), Errno> {
    if !id.is_sync() {
        return Ok(());
    }
    let p = id.as_id_ptr();
    // SAFETY: p is the live id.
    let prev = unsafe { (*p).event };
    if !prev.is_null() {
        let _ = ack(prev);
        // SAFETY: as above.
        unsafe { (*p).event = ptr::null_mut() };
    }
    let ch = id.channel()?;
    let ev = get_event(ch)?;
    // SAFETY: p is live; ev was just handed out.
    unsafe { (*p).event = ev.cast() };
    // SAFETY: ev is live until acknowledged.
    complete_status(unsafe { &(*ev).ev })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(event: u32, status: c_int) -> RdmaCmEvent {
        let mut e = RdmaCmEvent::zeroed();
        e.event = event as c_int;
        e.status = status;
        e
    }

    #[test]
    fn sync_completion_status_is_librdmacms() {
        assert_eq!(complete_status(&ev(RDMA_CM_EVENT_ESTABLISHED, 0)), Ok(()));
        assert_eq!(
            complete_status(&ev(RDMA_CM_EVENT_REJECTED, 8)),
            Err(Errno(libc::ECONNREFUSED))
        );
        assert_eq!(
            complete_status(&ev(RDMA_CM_EVENT_UNREACHABLE, -110)),
            Err(Errno(libc::ETIMEDOUT))
        );
        assert_eq!(
            complete_status(&ev(RDMA_CM_EVENT_ADDR_ERROR, 0)),
            Err(Errno(libc::EHOSTUNREACH))
        );
        assert_eq!(
            complete_status(&ev(RDMA_CM_EVENT_ADDR_ERROR, c_int::MIN)),
            Err(Errno::IO)
        );
        assert_eq!(
            complete_status(&ev(RDMA_CM_EVENT_CONNECT_ERROR, 110)),
            Err(Errno(libc::ETIMEDOUT))
        );
    }

    #[test]
    fn ack_refuses_foreign_pointers() {
        let mut e = RdmaCmEvent::zeroed();
        assert_eq!(ack(&mut e), Err(Errno::INVAL));
        assert_eq!(ack(ptr::null_mut()), Err(Errno::INVAL));
    }
}
