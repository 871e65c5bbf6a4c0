//! The librdmacm exports called from Rust against the in-process stand-in daemon, which
//! writes the events itself: the channel fd's kernel-like behaviour (poll, `O_NONBLOCK` →
//! `EAGAIN`), event processing (a request's child id, private data, UD parameters, events of
//! unknown ids dropped), acknowledgement rules, and `rdma_destroy_id` waiting for its events.
//! The e2e tests (tests/tests/shim_rdmacm*.rs) run the same code against the real daemon.

mod fake_daemon;

use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use libc::{c_int, c_void};
use proto::ctl::{CmConnParam, CmEventMsg, CmUdParam};
use softroce::rdmacm::abi::*;
use softroce::rdmacm::ep::rdma_get_request;
use softroce::rdmacm::exports::*;

fn daemon() -> &'static fake_daemon::FakeDaemon {
    static DAEMON: OnceLock<fake_daemon::FakeDaemon> = OnceLock::new();
    DAEMON.get_or_init(|| fake_daemon::FakeDaemon::start("rdmacm-api"))
}

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The daemon's handle of an id (the first member of the shim's allocation is the id).
fn handle_of(id: *mut RdmaCmId) -> u32 {
    softroce::rdmacm::state::id_from_ptr(id).unwrap().handle
}

fn channel_handle(ch: *mut RdmaEventChannel) -> u32 {
    softroce::rdmacm::state::channel_from_ptr(ch)
        .unwrap()
        .handle
}

fn new_id(ch: *mut RdmaEventChannel, ps: c_int) -> *mut RdmaCmId {
    let mut id = ptr::null_mut();
    // SAFETY: a live channel and a writable out pointer.
    assert_eq!(
        unsafe { rdma_create_id(ch, &mut id, 0x77 as *mut c_void, ps) },
        0
    );
    id
}

/// 127.0.0.1:`port` (0: any port) as a C caller passes it to `rdma_bind_addr`.
fn localhost(port: u16) -> libc::sockaddr_in {
    // SAFETY: plain bytes; all-zero is a valid sockaddr_in.
    let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    sin.sin_family = libc::AF_INET as libc::sa_family_t;
    sin.sin_port = port.to_be();
    sin.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
    sin
}

fn event(id: u32, event: u32) -> CmEventMsg {
    CmEventMsg {
        id,
        event,
        ..CmEventMsg::default()
    }
}

fn get(ch: *mut RdmaEventChannel) -> *mut RdmaCmEvent {
    let mut ev = ptr::null_mut();
    // SAFETY: live channel, writable out pointer.
    assert_eq!(
        unsafe { rdma_get_cm_event(ch, &mut ev) },
        0,
        "errno {}",
        errno()
    );
    ev
}

#[test]
fn channel_is_pollable_and_nonblocking_like_the_kernels() {
    daemon();
    let ch = rdma_create_event_channel();
    assert!(!ch.is_null(), "errno {}", errno());
    // SAFETY: ch is live; fd is its socket.
    let fd = unsafe { (*ch).fd };
    // SAFETY: fcntl on our own descriptor.
    unsafe {
        libc::fcntl(
            fd,
            libc::F_SETFL,
            libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK,
        )
    };
    let mut ev = ptr::null_mut();
    // SAFETY: as above.
    assert_eq!(unsafe { rdma_get_cm_event(ch, &mut ev) }, -1);
    assert_eq!(errno(), libc::EAGAIN);
    let id = new_id(ch, RDMA_PS_TCP);
    daemon().send_event(&event(handle_of(id), RDMA_CM_EVENT_ADDR_RESOLVED));
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    assert_eq!(unsafe { libc::poll(&mut p, 1, 5000) }, 1);
    let ev = get(ch);
    // SAFETY: a live event.
    unsafe {
        assert_eq!((*ev).id, id);
        assert_eq!((*ev).event, RDMA_CM_EVENT_ADDR_RESOLVED as c_int);
        assert_eq!(rdma_ack_cm_event(ev), 0);
        // A second ack of the same event is refused, not a double free.
        assert_eq!(rdma_ack_cm_event(ev), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(rdma_destroy_id(id), 0);
        rdma_destroy_event_channel(ch);
    }
}

#[test]
fn connect_request_makes_a_child_with_the_shared_context_and_private_data() {
    daemon();
    let ch = rdma_create_event_channel();
    let listen = new_id(ch, RDMA_PS_TCP);
    let mut sin = localhost(7471);
    // SAFETY: live id, a valid sockaddr_in.
    unsafe {
        assert_eq!(
            rdma_bind_addr(listen, (&mut sin as *mut libc::sockaddr_in).cast()),
            0
        );
        assert!(!(*listen).verbs.is_null(), "bound to srxe0: verbs set");
        assert_eq!(rdma_get_src_port(listen), 7471u16.to_be());
        assert_eq!(rdma_listen(listen, 8), 0);
    }
    let child_handle = 9000;
    let mut msg = event(handle_of(listen), RDMA_CM_EVENT_CONNECT_REQUEST);
    msg.child = Some(fake_daemon::cm_info(
        child_handle,
        "127.0.0.1:7471".parse().unwrap(),
    ));
    msg.conn = CmConnParam {
        private_data: b"hello from the peer".to_vec(),
        responder_resources: 1,
        initiator_depth: 2,
        qp_num: 0x11,
        ..CmConnParam::default()
    };
    daemon().send_event(&msg);
    let ev = get(ch);
    // SAFETY: a live event and ids of ours.
    unsafe {
        assert_eq!((*ev).event, RDMA_CM_EVENT_CONNECT_REQUEST as c_int);
        assert_eq!((*ev).listen_id, listen);
        let child = (*ev).id;
        assert_ne!(child, listen);
        assert_eq!(handle_of(child), child_handle);
        assert_eq!(
            (*child).verbs,
            (*listen).verbs,
            "one shared context per device"
        );
        assert_eq!(
            (*child).context,
            0x77 as *mut c_void,
            "the listener's context"
        );
        assert_eq!((*child).channel, ch);
        let conn = (*ev).param.conn;
        let data = std::slice::from_raw_parts(
            conn.private_data.cast::<u8>(),
            conn.private_data_len as usize,
        );
        assert_eq!(data, b"hello from the peer");
        assert_eq!(
            (conn.responder_resources, conn.initiator_depth, conn.qp_num),
            (1, 2, 0x11)
        );
        assert_eq!(rdma_ack_cm_event(ev), 0);
        assert_eq!(rdma_reject(child, ptr::null(), 0), 0);
        assert_eq!(rdma_destroy_id(child), 0);
        assert_eq!(rdma_destroy_id(listen), 0);
        rdma_destroy_event_channel(ch);
    }
}

#[test]
fn events_of_unknown_ids_are_dropped_and_requests_for_them_refused() {
    daemon();
    let ch = rdma_create_event_channel();
    let id = new_id(ch, RDMA_PS_TCP);
    // An event for an id nobody has, and a request for a listener that is gone: both are
    // consumed; the request's new id is destroyed on the daemon (it sends the REJ).
    let mut stale = event(424242, RDMA_CM_EVENT_CONNECT_REQUEST);
    stale.child = Some(fake_daemon::cm_info(777, "127.0.0.1:1".parse().unwrap()));
    daemon().send_event_to(channel_handle(ch), &stale);
    daemon().send_event(&event(handle_of(id), RDMA_CM_EVENT_ROUTE_RESOLVED));
    let ev = get(ch);
    // SAFETY: a live event.
    unsafe {
        assert_eq!((*ev).event, RDMA_CM_EVENT_ROUTE_RESOLVED as c_int);
        assert_eq!((*ev).id, id);
        rdma_ack_cm_event(ev);
    }
    assert!(daemon().cm.lock().unwrap().destroyed.contains(&777));
    // SAFETY: live objects.
    unsafe {
        assert_eq!(rdma_destroy_id(id), 0);
        rdma_destroy_event_channel(ch);
    }
}

#[test]
fn ud_events_carry_the_peer_qpn_qkey_and_address() {
    daemon();
    let ch = rdma_create_event_channel();
    let id = new_id(ch, RDMA_PS_UDP);
    let mut msg = event(handle_of(id), RDMA_CM_EVENT_ESTABLISHED);
    let mut ud = CmUdParam {
        qp_num: 0x1234,
        qkey: RDMA_UDP_QKEY,
        ..CmUdParam::default()
    };
    ud.ah_attr.dgid = proto::ctl::gid_of("127.0.0.1".parse().unwrap());
    ud.ah_attr.is_global = true;
    msg.ud = Some(ud);
    daemon().send_event(&msg);
    let ev = get(ch);
    // SAFETY: a live event.
    unsafe {
        let p = (*ev).param.ud;
        assert_eq!((p.qp_num, p.qkey), (0x1234, RDMA_UDP_QKEY));
        assert_eq!(p.ah_attr.is_global, 1);
        assert_eq!(p.ah_attr.grh.dgid.raw, ud.ah_attr.dgid);
        rdma_ack_cm_event(ev);
        assert_eq!(rdma_destroy_id(id), 0);
        rdma_destroy_event_channel(ch);
    }
}

#[test]
fn destroy_id_waits_until_its_events_are_acknowledged() {
    daemon();
    let ch = rdma_create_event_channel();
    let id = new_id(ch, RDMA_PS_TCP);
    daemon().send_event(&event(handle_of(id), RDMA_CM_EVENT_ADDR_RESOLVED));
    let ev = get(ch);
    let done = Arc::new(AtomicBool::new(false));
    let (d, id_addr) = (done.clone(), id as usize);
    let destroyer = std::thread::spawn(move || {
        // SAFETY: a live id (destroyed exactly once, here).
        let rc = unsafe { rdma_destroy_id(id_addr as *mut RdmaCmId) };
        d.store(true, Ordering::SeqCst);
        rc
    });
    // It must still be waiting for the ack (whatever the scheduling, it cannot be done).
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !done.load(Ordering::SeqCst),
        "rdma_destroy_id returned with an event unacknowledged"
    );
    // SAFETY: the live event.
    assert_eq!(unsafe { rdma_ack_cm_event(ev) }, 0);
    assert_eq!(destroyer.join().unwrap(), 0);
    // SAFETY: live channel.
    unsafe { rdma_destroy_event_channel(ch) };
}

#[test]
fn null_and_foreign_pointers_fail_cleanly() {
    daemon();
    let mut fake = [0u8; 512];
    let foreign = fake.as_mut_ptr().cast::<RdmaCmId>();
    // SAFETY: every call must reject these without dereferencing them.
    unsafe {
        assert_eq!(rdma_destroy_id(ptr::null_mut()), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(rdma_destroy_id(foreign), -1);
        assert_eq!(rdma_listen(foreign, 1), -1);
        assert_eq!(rdma_connect(foreign, ptr::null_mut()), -1);
        assert_eq!(rdma_accept(ptr::null_mut(), ptr::null_mut()), -1);
        assert_eq!(rdma_disconnect(foreign), -1);
        assert_eq!(rdma_get_src_port(foreign), 0);
        assert_eq!(rdma_resolve_route(foreign, 10), -1);
        assert_eq!(rdma_get_cm_event(ptr::null_mut(), ptr::null_mut()), -1);
        rdma_destroy_qp(foreign);
        rdma_destroy_event_channel(ptr::null_mut());
        rdma_destroy_event_channel(fake.as_mut_ptr().cast());
        assert_eq!(
            rdma_create_qp(foreign, ptr::null_mut(), ptr::null_mut()),
            -1
        );
    }
}

#[test]
fn create_qp_refuses_a_pd_that_is_not_a_live_one_of_ours() {
    daemon();
    let ch = rdma_create_event_channel();
    let id = new_id(ch, RDMA_PS_TCP);
    let mut sin = localhost(0);
    // A pointer no PD was ever allocated at (a freed PD looks the same to the shim): it must
    // be refused without being read.
    let dangling = ptr::NonNull::<softroce::abi::IbvPd>::dangling().as_ptr();
    // SAFETY: live id, a valid sockaddr_in; a zeroed init attr (integers and NULLs).
    unsafe {
        assert_eq!(
            rdma_bind_addr(id, (&mut sin as *mut libc::sockaddr_in).cast()),
            0
        );
        assert!(!(*id).verbs.is_null());
        let mut attr: softroce::abi::IbvQpInitAttr = std::mem::zeroed();
        attr.qp_type = softroce::abi::consts::IBV_QPT_RC;
        assert_eq!(rdma_create_qp(id, dangling, &mut attr), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert!((*id).qp.is_null());
        assert_eq!(rdma_destroy_id(id), 0);
        rdma_destroy_event_channel(ch);
    }
}

#[test]
fn an_event_status_without_a_positive_errno_is_eio_and_the_event_is_acknowledged() {
    daemon();
    // A synchronous id (NULL channel): rdma_get_request reads its private channel.
    let listen = new_id(ptr::null_mut(), RDMA_PS_TCP);
    let mut msg = event(handle_of(listen), RDMA_CM_EVENT_ADDR_ERROR);
    msg.status = c_int::MIN;
    daemon().send_event(&msg);
    let mut child = ptr::null_mut();
    // SAFETY: a live id and a writable out pointer.
    unsafe {
        assert_eq!(rdma_get_request(listen, &mut child), -1);
        assert_eq!(errno(), libc::EIO);
        // The failed request's event was acknowledged: destroy does not wait for it forever.
        assert_eq!(rdma_destroy_id(listen), 0);
    }
}

#[test]
fn a_channel_the_daemon_closes_reports_device_removal_then_enodev() {
    daemon();
    let ch = rdma_create_event_channel();
    let on_device = new_id(ch, RDMA_PS_TCP);
    let unbound = new_id(ch, RDMA_PS_TCP);
    let mut sin = localhost(0);
    // SAFETY: live id, a valid sockaddr_in.
    assert_eq!(
        unsafe { rdma_bind_addr(on_device, (&mut sin as *mut libc::sockaddr_in).cast()) },
        0
    );
    daemon().close_channel(channel_handle(ch));
    // As the kernel on device removal: the id on the device hears of it once, the unbound
    // one does not; then the channel is dead.
    let ev = get(ch);
    // SAFETY: live event, ids and channel.
    unsafe {
        assert_eq!((*ev).event, RDMA_CM_EVENT_DEVICE_REMOVAL as c_int);
        assert_eq!((*ev).id, on_device);
        rdma_ack_cm_event(ev);
        let mut ev = ptr::null_mut();
        assert_eq!(rdma_get_cm_event(ch, &mut ev), -1);
        assert_eq!(errno(), libc::ENODEV);
        assert_eq!(rdma_destroy_id(on_device), 0);
        assert_eq!(rdma_destroy_id(unbound), 0);
        rdma_destroy_event_channel(ch);
    }
}
