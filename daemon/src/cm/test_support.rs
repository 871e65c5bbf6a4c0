//! What the CM thread's tests share: a service of one device whose MADs loop back to it, and
//! short ways to make requests and read events.

use super::{CmDeviceSetup, CmService};
use crate::config::{device_info, DeviceConfig};
use crate::gsi::{gsi_payload, DeviceSender, ToDevice};
use crate::net::neighbour_board::NeighbourBoard;
use nix::sys::socket::{self, MsgFlags};
use proto::ctl::{self, cm_ps, qp_type, CmEventMsg, QpAttr, Request, Response, RoceVersion};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

pub(super) type Wire = Arc<Mutex<Vec<(IpAddr, IpAddr, Vec<u8>)>>>;

/// A CM service of one device whose MADs loop back to it when addressed to one of its
/// addresses (and are dropped otherwise): the daemon talking to itself, without sockets.
pub(super) fn service(addrs: &[&str], mode: RoceVersion) -> (CmService, Wire) {
    let (svc, wire, _) = service_with_board(addrs, mode, None);
    (svc, wire)
}

/// [`service`] on a device that resolves its neighbours itself (the L2 device) with
/// `board`; the peers the CM thread asked it to resolve go to the list returned.
pub(super) fn service_with_board(
    addrs: &[&str],
    mode: RoceVersion,
    board: Option<Arc<NeighbourBoard>>,
) -> (CmService, Wire, Arc<Mutex<Vec<IpAddr>>>) {
    let mut cfg = DeviceConfig::new("srxe0");
    cfg.addr = addrs.iter().map(|a| a.parse().unwrap()).collect();
    let wire: Wire = Arc::default();
    let solicited: Arc<Mutex<Vec<IpAddr>>> = Arc::default();
    let (w, s) = (Arc::clone(&wire), Arc::clone(&solicited));
    let send: DeviceSender = Box::new(move |m| {
        match m {
            ToDevice::Mad(m) => w.lock().unwrap().push((m.src, m.dst, m.packet)),
            ToDevice::Solicit(peer) => s.lock().unwrap().push(peer),
        }
        true
    });
    let setup = CmDeviceSetup {
        info: device_info(&cfg).unwrap(),
        default_roce_mode: mode,
        cm_response_timeout: 20,
        cm_max_retries: 15,
        // The tests' addresses need no route of the machine's.
        kernel_routes: false,
        neighbours: board,
    };
    (CmService::new(vec![(setup, send)]), wire, solicited)
}

/// Delivers MADs until the wire is quiet; returns how many went to a foreign address.
pub(super) fn settle(svc: &mut CmService, wire: &Wire) -> usize {
    let mut lost = 0;
    loop {
        svc.drain();
        let sent: Vec<_> = std::mem::take(&mut *wire.lock().unwrap());
        if sent.is_empty() {
            return lost;
        }
        for (src, dst, packet) in sent {
            if !svc.devices[0].addrs.contains(&dst) {
                lost += 1;
                continue;
            }
            let mad = gsi_payload(&packet).expect("a GSI packet").to_vec();
            let now = svc.now();
            svc.devices[0].endpoint.handle_mad(now, src, &mad).unwrap();
        }
    }
}

pub(super) fn call(svc: &mut CmService, client: u64, r: Request) -> Response {
    svc.request(client, r).0
}

pub(super) fn ok(svc: &mut CmService, client: u64, r: Request) -> Response {
    let resp = call(svc, client, r);
    assert!(!matches!(resp, Response::Error { .. }), "{resp:?}");
    resp
}

pub(super) fn errno_of(r: Response) -> i32 {
    match r {
        Response::Error { errno, .. } => errno,
        other => panic!("expected an error, got {other:?}"),
    }
}

/// A channel: its handle and the client's end.
pub(super) fn channel(svc: &mut CmService, client: u64) -> (u32, OwnedFd) {
    let (r, mut fds) = svc.request(client, Request::CmCreateChannel);
    let Response::CmChannel { channel } = r else {
        panic!("{r:?}")
    };
    (channel, fds.pop().unwrap())
}

pub(super) fn id(svc: &mut CmService, client: u64, ch: u32, ps: u16, qpt: u32) -> u32 {
    let Response::CmId { id } = ok(
        svc,
        client,
        Request::CmCreateId {
            channel: ch,
            ps,
            qp_type: qpt,
        },
    ) else {
        panic!()
    };
    id
}

pub(super) fn events(fd: &OwnedFd) -> Vec<CmEventMsg> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 4096];
    while let Ok(n) = socket::recv(fd.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
        out.push(ctl::decode(&buf[..n]).unwrap());
    }
    out
}

pub(super) fn kinds(evs: &[CmEventMsg]) -> Vec<u32> {
    evs.iter().map(|e| e.event).collect()
}

pub(super) fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

pub(super) fn bind_to(id: u32, addr: &str) -> Request {
    Request::CmBind { id, addr: sa(addr) }
}

pub(super) fn resolve_addr_to(id: u32, dst: SocketAddr) -> Request {
    Request::CmResolveAddr {
        id,
        src: None,
        dst,
        timeout_ms: 1000,
    }
}

pub(super) fn resolve_route(id: u32) -> Request {
    Request::CmResolveRoute {
        id,
        timeout_ms: 1000,
    }
}

/// An RC id of `client` in the TCP port space on channel `ch`, bound to `addr` and
/// listening (backlog 1).
pub(super) fn listener(svc: &mut CmService, client: u64, ch: u32, addr: &str) -> u32 {
    let l = id(svc, client, ch, cm_ps::TCP, qp_type::RC);
    ok(svc, client, bind_to(l, addr));
    ok(svc, client, Request::CmListen { id: l, backlog: 1 });
    l
}

/// What `rdma_init_qp_attr` gives id `h` of `client` for QP state `state`: the attributes
/// and their mask.
pub(super) fn qp_attr(svc: &mut CmService, client: u64, h: u32, state: u32) -> (QpAttr, u32) {
    match ok(
        svc,
        client,
        Request::CmInitQpAttr {
            id: h,
            qp_state: state,
        },
    ) {
        Response::CmQpAttr { attr, mask } => (attr, mask),
        r => panic!("not QP attributes: {r:?}"),
    }
}
