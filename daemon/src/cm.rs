//! The daemon's rdma_cm: one thread that owns every rdma_cm id, event channel and bound port
//! of every client, and one [`CmEndpoint`] (the ib_cm state machine of `proto::cm`) per device.
//!
//! Why one thread and not one service per device thread: an rdma_cm id is not tied to a device
//! until it is bound or resolved, a wildcard listener serves every device, and ports are one
//! namespace per port space, as in the kernel. The device threads only carry MADs: a UD
//! SEND_ONLY to QP1 that they receive is handed here as a [`GsiMad`]; a MAD to send goes back as
//! [`GsiOut`] and leaves through the device's UDP socket like all its traffic (so
//! tcpdump and `softroce pcap check` see the CM exchange, even when the daemon talks to itself).
//!
//! Requests come from the client control threads ([`CmMsg::Request`]); events go straight to the
//! channel's socketpair as one postcard [`CmEventMsg`] datagram each, so the shim's
//! `channel->fd` behaves as the kernel's (poll, O_NONBLOCK). A client that disconnects loses
//! every id and channel it created; connected ids tell their peer (DREQ / REJ) as ib_cm does
//! when a process dies.

use crate::gsi::{gsi_packet, GsiMad, GsiOut, GsiSender};
use crossbeam_channel::{select, Receiver, Sender};
use nix::sys::socket::{self, AddressFamily, MsgFlags, SockFlag, SockType};
use proto::cm::msg::{sidr_status, ReqRepr};
use proto::cm::rdma_cm::{
    self as rc, CmaHdr, Negotiated, PortSpace, RdmaCmEventType as Ev, RoceRoute,
};
use proto::cm::{
    AcceptParams, CmEndpoint, CmEvent, ConnId, ConnectParams, EndpointConfig, RejReason, SidrParams,
};
use proto::ctl::{
    self, cm_option, cm_ps, qp_type, AhAttr, CmConnParam, CmEventMsg, CmIdInfo, CmPathInfo,
    CmUdParam, DeviceInfo, QpAttr, Request, Response, RoceVersion,
};
use proto::transport::GidType;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// Ephemeral rdma_cm ports, Linux's default `ip_local_port_range`.
const EPHEMERAL: std::ops::RangeInclusive<u16> = 32768..=60999;
/// The hop limit of a RoCE route (the route's default, facts §7.2).
const ROUTE_HOP_LIMIT: u8 = 64;
/// Most connection requests a listener holds unanswered (ucma's `max_backlog`); more are
/// refused as the kernel does when the backlog is exhausted (REJ 28).
const MAX_BACKLOG: usize = 1024;
/// Longest the thread sleeps when nothing is due (events waiting for room are retried).
const MAX_SLEEP: Duration = Duration::from_millis(200);

/// `enum ibv_qp_attr_mask` bits.
pub mod qp_mask {
    pub const STATE: u32 = 1;
    pub const ACCESS_FLAGS: u32 = 1 << 3;
    pub const PKEY_INDEX: u32 = 1 << 4;
    pub const PORT: u32 = 1 << 5;
    pub const QKEY: u32 = 1 << 6;
    pub const AV: u32 = 1 << 7;
    pub const PATH_MTU: u32 = 1 << 8;
    pub const TIMEOUT: u32 = 1 << 9;
    pub const RETRY_CNT: u32 = 1 << 10;
    pub const RNR_RETRY: u32 = 1 << 11;
    pub const RQ_PSN: u32 = 1 << 12;
    pub const MAX_QP_RD_ATOMIC: u32 = 1 << 13;
    pub const MIN_RNR_TIMER: u32 = 1 << 15;
    pub const SQ_PSN: u32 = 1 << 16;
    pub const MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
    pub const DEST_QPN: u32 = 1 << 20;
}

/// `enum ibv_access_flags` bits rdma_cm grants.
mod access {
    pub const LOCAL_WRITE: u32 = 1;
    pub const REMOTE_WRITE: u32 = 2;
    pub const REMOTE_READ: u32 = 4;
    pub const REMOTE_ATOMIC: u32 = 8;
}

/// Messages to the CM thread.
pub enum CmMsg {
    Request {
        client: u64,
        request: Request,
        reply: Sender<(Response, Vec<OwnedFd>)>,
    },
    ClientGone {
        client: u64,
    },
    /// A device's addresses changed (`--netdev`).
    UpdateInfo {
        device: usize,
        info: DeviceInfo,
    },
    /// What the received MADs did, per device (for [`Request::Counters`]).
    Counters {
        reply: Sender<Vec<proto::cm::conn::CmCounters>>,
    },
    Shutdown,
}

/// Whether a request belongs to the CM thread.
pub fn is_cm_request(r: &Request) -> bool {
    matches!(
        r,
        Request::CmCreateChannel
            | Request::CmDestroyChannel { .. }
            | Request::CmCreateId { .. }
            | Request::CmDestroyId { .. }
            | Request::CmBind { .. }
            | Request::CmResolveAddr { .. }
            | Request::CmResolveRoute { .. }
            | Request::CmListen { .. }
            | Request::CmConnect { .. }
            | Request::CmAccept { .. }
            | Request::CmReject { .. }
            | Request::CmEstablish { .. }
            | Request::CmDisconnect { .. }
            | Request::CmInitQpAttr { .. }
            | Request::CmSetOption { .. }
            | Request::CmJoinMcast { .. }
            | Request::CmLeaveMcast { .. }
            | Request::CmMigrateId { .. }
            | Request::CmQueryId { .. }
    )
}

/// A device as the CM sees it.
#[derive(Debug, Clone)]
pub struct CmDeviceSetup {
    pub info: DeviceInfo,
    /// The GID type rdma_cm uses on this device (configfs `default_roce_mode`).
    pub default_roce_mode: RoceVersion,
    /// `CMA_CM_RESPONSE_TIMEOUT` and `CMA_MAX_CM_RETRIES` of the REQs this device sends.
    pub cm_response_timeout: u8,
    pub cm_max_retries: u8,
}

struct CmDevice {
    setup: CmDeviceSetup,
    addrs: Vec<IpAddr>,
    endpoint: CmEndpoint,
    /// The GSI QP's next PSN.
    psn: u32,
    send: GsiSender,
    /// The RoCE version of the MADs exchanged with each peer: what its last MAD came in (a
    /// passive side answers in the REQ's version, facts §7.2), or what our own connection to
    /// it uses (the id's GID type). Kept per peer address, so one peer's rdma_cm connections
    /// to this device share one version at a time.
    peer_types: HashMap<IpAddr, RoceVersion>,
}

impl CmDevice {
    /// The device's address to use toward `peer`: the peer itself when it is ours (the device
    /// talks to itself), else the first address of the peer's family and scope (a link-local
    /// `fe80::` address only toward a link-local peer, as the kernel's source selection),
    /// else of its family.
    fn local_for(&self, peer: IpAddr) -> Option<IpAddr> {
        if self.addrs.contains(&peer) {
            return Some(peer);
        }
        let link_local = |a: &IpAddr| matches!(a, IpAddr::V6(v6) if v6.is_unicast_link_local());
        let family = |a: &&IpAddr| a.is_ipv4() == peer.is_ipv4();
        self.addrs
            .iter()
            .filter(family)
            .find(|a| link_local(a) == link_local(&peer))
            .or_else(|| self.addrs.iter().find(family))
            .copied()
    }

    #[cfg(test)]
    fn gid_index(&self, ip: IpAddr) -> u32 {
        self.gid_index_of(ip, self.setup.default_roce_mode)
    }

    /// The index of `ip`'s GID of type `roce` (a `--roce both` device lists every address
    /// once per type), else of any type.
    fn gid_index_of(&self, ip: IpAddr, roce: RoceVersion) -> u32 {
        let gid = ctl::gid_of(ip);
        let entries = &self.setup.info.gids;
        entries
            .iter()
            .find(|g| g.gid == gid && g.roce == roce)
            .or_else(|| entries.iter().find(|g| g.gid == gid))
            .map_or(0, |g| g.index)
    }

    /// The version MADs to `peer` go in.
    fn mad_version(&self, peer: IpAddr) -> RoceVersion {
        self.peer_types
            .get(&peer)
            .copied()
            .unwrap_or(self.setup.default_roce_mode)
    }
}

struct Channel {
    client: u64,
    fd: OwnedFd,
    /// Events that found the socket full, in order.
    backlog: VecDeque<Vec<u8>>,
}

impl Channel {
    /// Sends the waiting events, in order, until the socket is full.
    fn flush(&mut self) {
        while let Some(b) = self.backlog.front() {
            match socket::send(
                self.fd.as_raw_fd(),
                b,
                MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
            ) {
                Ok(_) => {
                    self.backlog.pop_front();
                }
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(e) => {
                    // The client closed its end: nobody will read these events.
                    debug!(client = self.client, "event channel closed: {e}");
                    self.backlog.clear();
                }
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Idle,
    Listen,
    /// Our REQ is out (or answered).
    Active,
    /// A REQ we received, handed to the program as a CONNECT_REQUEST child.
    Passive,
    SidrActive,
    SidrPassive,
}

struct Id {
    client: u64,
    channel: u32,
    ps: u16,
    qp_type: u32,
    device: Option<usize>,
    src: Option<SocketAddr>,
    dst: Option<SocketAddr>,
    /// The peer's address on the wire (a loopback destination that is not one of our device
    /// addresses is the device itself).
    peer_ip: Option<IpAddr>,
    port: Option<u16>,
    path: Option<CmPathInfo>,
    role: Role,
    conn: Option<ConnId>,
    local_psn: u32,
    negotiated: Option<Negotiated>,
    connect: Option<ConnectParams>,
    req: Option<Box<ReqRepr>>,
    qkey: u32,
    tos: Option<u8>,
    reuse: bool,
    afonly: bool,
    ack_timeout: Option<u8>,
    min_rnr_timer: Option<u8>,
    /// A CONNECT_REQUEST child not yet accepted or rejected: the listener it came from.
    pending_on: Option<u32>,
    /// The passive side's own address on the wire: the REQ path's remote GID.
    wire_local: Option<IpAddr>,
    /// The GID type of the connection: the REQ's version on the passive side; `None`, the
    /// device's `default_roce_mode` (an active id).
    gid_type: Option<RoceVersion>,
}

impl Id {
    fn new(client: u64, channel: u32, ps: u16, qp_type: u32) -> Id {
        Id {
            client,
            channel,
            ps,
            qp_type,
            device: None,
            src: None,
            dst: None,
            peer_ip: None,
            port: None,
            path: None,
            role: Role::Idle,
            conn: None,
            local_psn: 0,
            negotiated: None,
            connect: None,
            req: None,
            qkey: rc::RDMA_UDP_QKEY,
            tos: None,
            reuse: false,
            afonly: false,
            ack_timeout: None,
            min_rnr_timer: None,
            pending_on: None,
            wire_local: None,
            gid_type: None,
        }
    }

    fn is_ud(&self) -> bool {
        self.ps == cm_ps::UDP || self.qp_type == qp_type::UD
    }

    fn with_overrides(&self, mut n: Negotiated) -> Negotiated {
        n.ack_timeout_override = self.ack_timeout;
        n.min_rnr_timer = self.min_rnr_timer;
        n
    }
}

type Reply = (Response, Vec<OwnedFd>);

fn error(errno: i32, message: impl Into<String>) -> Reply {
    (
        Response::Error {
            errno,
            message: message.into(),
        },
        Vec::new(),
    )
}

fn done() -> Reply {
    (Response::Done, Vec::new())
}

/// Starting PSNs, comm IDs and TIDs: from the kernel's CSPRNG, so that an off-path sender
/// cannot guess a connection's PSN window (ReDMArk).
fn random_u32() -> u32 {
    crate::entropy::u32()
}

fn ps_of(ps: u16) -> Option<PortSpace> {
    PortSpace::from_u16(ps)
}

/// The IP address of a RoCE v2 GID (`::ffff:a.b.c.d` is IPv4).
fn gid_ip(gid: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(gid);
    v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
}

/// 127.0.0.1 and ::1, "this host": a device that does not serve them itself takes them as its
/// own address. (Other 127.x.y.z addresses may be other daemons on the same host.)
fn is_this_host(ip: IpAddr) -> bool {
    ip == IpAddr::V4(Ipv4Addr::LOCALHOST) || ip == IpAddr::V6(Ipv6Addr::LOCALHOST)
}

/// Whether a listener bound to `bound` takes a request for `dst` (cma's address match).
fn listener_takes(bound: IpAddr, afonly: bool, dst: IpAddr) -> bool {
    if bound.is_unspecified() {
        return match bound {
            IpAddr::V4(_) => dst.is_ipv4(),
            IpAddr::V6(_) => dst.is_ipv6() || !afonly,
        };
    }
    bound == dst
}

/// Whether two bindings of one port overlap: the same address, or a wildcard that covers the
/// other (the IPv6 wildcard covers IPv4 too).
fn overlaps(a: IpAddr, b: IpAddr) -> bool {
    let covers = |w: IpAddr, x: IpAddr| w.is_unspecified() && (w.is_ipv6() || x.is_ipv4());
    a == b || covers(a, b) || covers(b, a)
}

/// The CM thread's state.
pub struct CmService {
    devices: Vec<CmDevice>,
    channels: BTreeMap<u32, Channel>,
    ids: BTreeMap<u32, Id>,
    /// (device, comm ID) -> id.
    conns: HashMap<(usize, ConnId), u32>,
    /// (device, service ID) -> listeners on it.
    listens: HashMap<(usize, u64), usize>,
    next_handle: u32,
    start: Instant,
}

impl CmService {
    /// `senders[i]` hands a message to device thread `i`.
    pub fn new(setups: Vec<(CmDeviceSetup, GsiSender)>) -> CmService {
        let devices = setups
            .into_iter()
            .map(|(setup, send)| {
                let mut cfg = EndpointConfig::new(setup.info.node_guid, random_u32(), random_u32());
                cfg.first_id = random_u32();
                CmDevice {
                    addrs: setup.info.gid_addrs(),
                    setup,
                    endpoint: CmEndpoint::new(cfg),
                    psn: 0,
                    send,
                    peer_types: HashMap::new(),
                }
            })
            .collect();
        CmService {
            devices,
            channels: BTreeMap::new(),
            ids: BTreeMap::new(),
            conns: HashMap::new(),
            listens: HashMap::new(),
            next_handle: 0,
            start: Instant::now(),
        }
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Runs until [`CmMsg::Shutdown`].
    pub fn run(mut self, rx: Receiver<CmMsg>, mads: Receiver<GsiMad>) {
        loop {
            let now = self.now();
            let due = self
                .devices
                .iter()
                .filter_map(|d| d.endpoint.poll_timeout())
                .min();
            let mut wait = match due {
                Some(t) if t <= now => Duration::ZERO,
                Some(t) => Duration::from_nanos(t - now).min(MAX_SLEEP),
                None => MAX_SLEEP,
            };
            if self.channels.values().any(|c| !c.backlog.is_empty()) {
                wait = wait.min(Duration::from_millis(5));
            }
            select! {
                recv(rx) -> msg => match msg {
                    Ok(CmMsg::Request { client, request, reply }) => {
                        let r = self.request(client, request);
                        let _ = reply.send(r);
                    }
                    Ok(CmMsg::ClientGone { client }) => self.client_gone(client),
                    Ok(CmMsg::UpdateInfo { device, info }) => {
                        if let Some(d) = self.devices.get_mut(device) {
                            d.addrs = info.gid_addrs();
                            d.setup.info = info;
                        }
                    }
                    Ok(CmMsg::Counters { reply }) => {
                        let _ = reply.send(self.devices.iter().map(|d| d.endpoint.counters()).collect());
                    }
                    Ok(CmMsg::Shutdown) | Err(_) => return,
                },
                recv(mads) -> m => if let Ok(m) = m {
                    let now = self.now();
                    if let Some(d) = self.devices.get_mut(m.device) {
                        let version = match m.gid_type {
                            GidType::RoceV1 => RoceVersion::V1,
                            GidType::RoceV2 => RoceVersion::V2,
                        };
                        d.peer_types.insert(m.src, version);
                        if let Err(e) = d.endpoint.handle_mad(now, m.src, &m.mad) {
                            debug!(src = %m.src, "CM MAD dropped: {e}");
                        }
                    }
                },
                default(wait) => {}
            }
            let now = self.now();
            for d in &mut self.devices {
                if d.endpoint.poll_timeout().is_some_and(|t| t <= now) {
                    d.endpoint.handle_timeout(now);
                }
            }
            self.drain();
            self.flush_channels();
        }
    }

    /// Sends what the endpoints want sent and turns their events into rdma_cm events, until
    /// neither is left (handling an event may send: a REJ for a request nobody takes).
    fn drain(&mut self) {
        while self.drain_once() {}
    }

    fn drain_once(&mut self) -> bool {
        let mut any = false;
        for index in 0..self.devices.len() {
            loop {
                let d = &mut self.devices[index];
                let Some(t) = d.endpoint.poll_transmit() else {
                    break;
                };
                any = true;
                let Some(src) = d.local_for(t.peer) else {
                    warn!(peer = %t.peer, "no address of the peer's family to send a MAD from");
                    continue;
                };
                let psn = d.psn;
                d.psn = (d.psn + 1) & 0xff_ffff;
                if let Some(packet) = gsi_packet(psn, &t.mad) {
                    let gid_type = match d.mad_version(t.peer) {
                        RoceVersion::V1 => GidType::RoceV1,
                        RoceVersion::V2 => GidType::RoceV2,
                    };
                    debug!(?t, ?gid_type, "CM MAD out");
                    (d.send)(GsiOut {
                        src,
                        dst: t.peer,
                        packet,
                        gid_type,
                    });
                }
            }
            while let Some(ev) = self.devices[index].endpoint.poll_event() {
                any = true;
                self.on_event(index, ev);
            }
        }
        any
    }

    // ---- events ----

    fn emit(&mut self, handle: u32, mut msg: CmEventMsg) {
        let Some(id) = self.ids.get(&handle) else {
            return;
        };
        msg.id = handle;
        if msg.info.is_none() {
            msg.info = Some(self.info(handle));
        }
        let channel = id.channel;
        let Ok(bytes) = ctl::encode(&msg) else {
            return;
        };
        debug!(
            id = handle,
            event = msg.event,
            status = msg.status,
            "rdma_cm event"
        );
        // Only this channel: the others' waiting events are retried by the run loop, and
        // going over every channel for every event made a burst of N connections cost N².
        if let Some(c) = self.channels.get_mut(&channel) {
            c.backlog.push_back(bytes);
            c.flush();
        }
    }

    fn flush_channels(&mut self) {
        for c in self.channels.values_mut() {
            c.flush();
        }
    }

    fn event(event: Ev, status: i32) -> CmEventMsg {
        CmEventMsg {
            event: event as u32,
            status,
            ..CmEventMsg::default()
        }
    }

    fn on_event(&mut self, device: usize, ev: CmEvent) {
        let (kind, status) = ev.rdma_cm_event();
        match ev {
            CmEvent::ConnectRequest {
                id,
                peer,
                req,
                service_id,
            } => {
                let pd = req.private_data.clone();
                self.on_connect_request(device, id, peer, service_id, pd, Some(req))
            }
            CmEvent::SidrRequest {
                id,
                peer,
                req,
                service_id,
            } => self.on_connect_request(device, id, peer, service_id, req.private_data, None),
            CmEvent::ConnectResponse { id, rep } => {
                let Some(&h) = self.conns.get(&(device, id)) else {
                    return;
                };
                let Some(x) = self.ids.get_mut(&h) else {
                    return;
                };
                if let Some(p) = &x.connect {
                    x.negotiated =
                        Some(x.with_overrides(proto::cm::conn::negotiated_active(p, &rep)));
                }
                let mut m = Self::event(kind, status);
                m.conn = CmConnParam {
                    private_data: rep.private_data.clone(),
                    responder_resources: rep.responder_resources,
                    initiator_depth: rep.initiator_depth,
                    flow_control: u8::from(rep.end_to_end_flow_control),
                    retry_count: 0,
                    rnr_retry_count: rep.rnr_retry_count,
                    srq: u8::from(rep.srq),
                    qp_num: rep.local_qpn,
                    qkey: 0,
                };
                self.emit(h, m);
            }
            CmEvent::Established { id } => {
                let Some(&h) = self.conns.get(&(device, id)) else {
                    return;
                };
                // The active side's ESTABLISHED is reported by the shim after CmEstablish
                // (librdmacm's ucma_process_conn_resp).
                if self.ids.get(&h).is_some_and(|x| x.role == Role::Active) {
                    return;
                }
                self.emit(h, Self::event(kind, status));
            }
            CmEvent::Rejected {
                id, private_data, ..
            } => {
                let Some(h) = self.forget_conn(device, id) else {
                    return;
                };
                let mut m = Self::event(kind, status);
                m.conn.private_data = private_data;
                self.emit(h, m);
            }
            CmEvent::Unreachable { id } => {
                let Some(h) = self.forget_conn(device, id) else {
                    return;
                };
                self.emit(h, Self::event(kind, status));
            }
            CmEvent::Disconnected {
                id, private_data, ..
            } => {
                let Some(&h) = self.conns.get(&(device, id)) else {
                    return;
                };
                let mut m = Self::event(kind, status);
                m.conn.private_data = private_data;
                self.emit(h, m);
            }
            CmEvent::TimewaitExit { id } => {
                let Some(h) = self.forget_conn(device, id) else {
                    return;
                };
                self.emit(h, Self::event(kind, status));
            }
            CmEvent::SidrResponse { id, rep } => {
                let Some(h) = self.forget_conn(device, id) else {
                    return;
                };
                let ah = self.ah_of(h);
                let mut m = Self::event(kind, status);
                if rep.status == sidr_status::SUCCESS {
                    m.ud = Some(CmUdParam {
                        ah_attr: ah,
                        qp_num: rep.qpn,
                        qkey: rep.qkey,
                    });
                    m.conn.qp_num = rep.qpn;
                    m.conn.qkey = rep.qkey;
                }
                m.conn.private_data = rep.private_data.clone();
                self.emit(h, m);
            }
        }
    }

    /// The id of a connection the endpoint has finished with (rejected, unreachable, out of
    /// timewait, SIDR answered), which no longer has it (nor is a request waiting on its
    /// listener).
    fn forget_conn(&mut self, device: usize, conn: ConnId) -> Option<u32> {
        let h = self.conns.remove(&(device, conn))?;
        if let Some(x) = self.ids.get_mut(&h) {
            x.conn = None;
            x.pending_on = None;
        }
        Some(h)
    }

    /// A REQ (`req`), or a SIDR_REQ when `req` is `None`, for a service we listen on: find the
    /// listener by port space, port and the destination address of the rdma_cm header; give
    /// the program a new id for it.
    fn on_connect_request(
        &mut self,
        device: usize,
        conn: ConnId,
        peer: IpAddr,
        service_id: u64,
        private_data: Vec<u8>,
        req: Option<Box<ReqRepr>>,
    ) {
        let now = self.now();
        let sidr = req.is_none();
        let parsed = rc::parse_service_id(service_id);
        let hdr = CmaHdr::parse(&private_data).ok();
        let listener = match (parsed, hdr) {
            (Some((ps, port)), Some(hdr)) => self
                .ids
                .iter()
                .filter(|(_, x)| {
                    x.role == Role::Listen
                        && x.port == Some(port)
                        && (x.ps == ps as u16 || x.ps == cm_ps::IB)
                        && x.device.is_none_or(|d| d == device)
                        && x.src
                            .is_some_and(|s| listener_takes(s.ip(), x.afonly, hdr.dst_addr))
                })
                // An exact address wins over a wildcard.
                .min_by_key(|(_, x)| x.src.is_some_and(|s| s.ip().is_unspecified()))
                .map(|(h, _)| (*h, hdr)),
            _ => None,
        };
        let d = &mut self.devices[device];
        // ib_cm / rdma_cm's refusal: REJ "consumer defined" (28), or the SIDR status.
        let mut refuse = |sidr_status: u8| {
            let _ = if sidr {
                d.endpoint.sidr_reply(now, conn, sidr_status, 0, 0, &[])
            } else {
                d.endpoint
                    .reject(now, conn, RejReason::CONSUMER_DEFINED, &[], &[])
            };
        };
        let Some((lh, hdr)) = listener else {
            debug!(
                service = service_id,
                "REQ for no matching listener: rejected"
            );
            refuse(sidr_status::UNSUPPORTED);
            return;
        };
        let waiting = self
            .ids
            .values()
            .filter(|x| x.pending_on == Some(lh))
            .count();
        if waiting >= MAX_BACKLOG {
            debug!(listener = lh, "connection request refused: backlog full");
            refuse(sidr_status::REJECT);
            return;
        }
        let Some(l) = self.ids.get(&lh) else { return };
        // The child answers from the address the peer asked for, when it is ours.
        let local_ip = if d.addrs.contains(&hdr.dst_addr) {
            hdr.dst_addr
        } else {
            d.local_for(peer).unwrap_or(hdr.dst_addr)
        };
        let mut child = Id::new(l.client, l.channel, l.ps, l.qp_type);
        child.device = Some(device);
        // Answered, and connected, in the version the request came in.
        child.gid_type = Some(d.mad_version(peer));
        child.pending_on = Some(lh);
        child.src = Some(SocketAddr::new(hdr.dst_addr, l.port.unwrap_or(0)));
        child.dst = Some(SocketAddr::new(hdr.src_addr, hdr.src_port));
        child.peer_ip = Some(peer);
        child.conn = Some(conn);
        child.local_psn = random_u32() & 0xff_ffff;
        child.tos = l.tos;
        child.ack_timeout = l.ack_timeout;
        child.min_rnr_timer = l.min_rnr_timer;
        let user_pd = private_data
            .get(rc::CMA_HDR_LEN..)
            .unwrap_or_default()
            .to_vec();
        let mut m = Self::event(Ev::ConnectRequest, 0);
        match req {
            None => {
                child.role = Role::SidrPassive;
                child.qp_type = qp_type::UD;
                child.path = Some(CmPathInfo {
                    sgid: ctl::gid_of(local_ip),
                    dgid: ctl::gid_of(peer),
                    hop_limit: ROUTE_HOP_LIMIT,
                    pkey: 0xffff,
                    mtu: d.setup.info.active_mtu,
                    packet_life_time: rc::CMA_IBOE_PACKET_LIFETIME,
                    ..CmPathInfo::default()
                });
                m.conn.private_data = user_pd;
            }
            Some(req) => {
                child.role = Role::Passive;
                let p = &req.primary_path;
                // cm_format_paths_from_req: the connection's path is the REQ's, seen from
                // this side (its local GID is the peer's QP address, its remote GID ours).
                let (their, ours) = (gid_ip(p.local_gid), gid_ip(p.remote_gid));
                if d.addrs.contains(&ours) && !their.is_unspecified() {
                    child.peer_ip = Some(their);
                    child.wire_local = Some(ours);
                }
                child.path = Some(CmPathInfo {
                    sgid: ctl::gid_of(child.wire_local.unwrap_or(local_ip)),
                    dgid: ctl::gid_of(child.peer_ip.unwrap_or(peer)),
                    flow_label: p.flow_label,
                    hop_limit: p.hop_limit,
                    traffic_class: p.traffic_class,
                    sl: p.sl,
                    pkey: req.pkey,
                    mtu: req.path_mtu,
                    rate: p.packet_rate,
                    packet_life_time: p.local_ack_timeout.saturating_sub(1),
                });
                // ib_cm's passive side: our responder resources are the peer's initiator
                // depth and the other way round, until rdma_accept says otherwise.
                let a = AcceptParams {
                    local_qpn: 0,
                    starting_psn: child.local_psn,
                    responder_resources: req.initiator_depth,
                    initiator_depth: req.responder_resources,
                    flow_control: req.end_to_end_flow_control,
                    rnr_retry_count: req.rnr_retry_count,
                    srq: req.srq,
                    private_data: Vec::new(),
                };
                child.negotiated =
                    Some(child.with_overrides(proto::cm::conn::negotiated_passive(&req, &a)));
                m.conn = CmConnParam {
                    private_data: user_pd,
                    responder_resources: req.responder_resources,
                    initiator_depth: req.initiator_depth,
                    flow_control: u8::from(req.end_to_end_flow_control),
                    retry_count: req.retry_count,
                    rnr_retry_count: req.rnr_retry_count,
                    srq: u8::from(req.srq),
                    qp_num: req.local_qpn,
                    qkey: 0,
                };
                child.req = Some(req);
            }
        }
        self.next_handle += 1;
        let ch = self.next_handle;
        self.ids.insert(ch, child);
        self.conns.insert((device, conn), ch);
        if sidr {
            m.ud = Some(CmUdParam {
                ah_attr: self.ah_of(ch),
                qp_num: 0,
                qkey: 0,
            });
        }
        m.child = Some(self.info(ch));
        self.emit(lh, m);
    }

    // ---- requests ----

    fn request(&mut self, client: u64, request: Request) -> Reply {
        let now = self.now();
        let r = match request {
            Request::CmCreateChannel => return self.create_channel(client),
            Request::CmDestroyChannel { channel } => {
                match self.channels.get(&channel) {
                    Some(c) if c.client == client => {}
                    _ => return error(libc::EINVAL, "no such event channel"),
                }
                if self.ids.values().any(|x| x.channel == channel) {
                    return error(libc::EBUSY, "ids still use the event channel");
                }
                self.channels.remove(&channel);
                return done();
            }
            Request::CmCreateId {
                channel,
                ps,
                qp_type: qpt,
            } => {
                if !self.owns_channel(client, channel) {
                    return error(libc::EINVAL, "no such event channel");
                }
                if ps_of(ps).is_none() || ps == cm_ps::IPOIB {
                    return error(libc::EPROTONOSUPPORT, "unsupported port space");
                }
                if ![qp_type::RC, qp_type::UC, qp_type::UD].contains(&qpt) {
                    return error(libc::EINVAL, "unsupported QP type");
                }
                self.next_handle += 1;
                let h = self.next_handle;
                self.ids.insert(h, Id::new(client, channel, ps, qpt));
                return (Response::CmId { id: h }, Vec::new());
            }
            other => other,
        };
        let Some(handle) = cm_id_of(&r) else {
            return error(libc::EINVAL, "not an rdma_cm request");
        };
        if self.ids.get(&handle).is_none_or(|x| x.client != client) {
            return error(libc::EINVAL, "no such rdma_cm id");
        }
        match r {
            Request::CmDestroyId { id } => {
                self.destroy_id(now, id);
                done()
            }
            Request::CmBind { id, addr } => match self.bind(id, addr) {
                Ok(()) => (Response::CmIdInfo(self.info(id)), Vec::new()),
                Err((errno, why)) => error(errno, why),
            },
            Request::CmResolveAddr { id, src, dst, .. } => self.resolve_addr(id, src, dst),
            Request::CmResolveRoute { id, .. } => self.resolve_route(id),
            Request::CmListen { id, .. } => self.listen(id),
            Request::CmConnect { id, conn, psn } => self.connect(now, id, conn, psn),
            Request::CmAccept { id, conn } => self.accept(now, id, conn),
            Request::CmReject { id, private_data } => self.reject(now, id, &private_data),
            Request::CmEstablish { id } => self.establish(now, id),
            Request::CmDisconnect { id, private_data } => {
                let Some((d, conn)) = self.conn_of(id) else {
                    return error(libc::EINVAL, "the id is not connected");
                };
                match self.devices[d]
                    .endpoint
                    .disconnect(now, conn, &private_data)
                {
                    Ok(()) => done(),
                    Err(e) => error(libc::EINVAL, e.to_string()),
                }
            }
            Request::CmInitQpAttr { id, qp_state } => self.init_qp_attr(id, qp_state),
            Request::CmSetOption {
                id,
                level,
                name,
                value,
            } => self.set_option(id, level, name, &value),
            Request::CmJoinMcast { id, addr, .. } => self.join_mcast(id, addr),
            Request::CmLeaveMcast { .. } => done(),
            Request::CmMigrateId { id, channel } => {
                if !self.owns_channel(client, channel) {
                    return error(libc::EINVAL, "no such event channel");
                }
                if let Some(x) = self.ids.get_mut(&id) {
                    x.channel = channel;
                }
                done()
            }
            Request::CmQueryId { id } => (Response::CmIdInfo(self.info(id)), Vec::new()),
            _ => error(libc::EINVAL, "not an rdma_cm request"),
        }
    }

    fn owns_channel(&self, client: u64, channel: u32) -> bool {
        self.channels
            .get(&channel)
            .is_some_and(|c| c.client == client)
    }

    fn create_channel(&mut self, client: u64) -> Reply {
        let pair = socket::socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        );
        let (ours, theirs) = match pair {
            Ok(p) => p,
            Err(e) => return error(e as i32, format!("socketpair: {e}")),
        };
        self.next_handle += 1;
        let h = self.next_handle;
        self.channels.insert(
            h,
            Channel {
                client,
                fd: ours,
                backlog: VecDeque::new(),
            },
        );
        (Response::CmChannel { channel: h }, vec![theirs])
    }

    fn client_gone(&mut self, client: u64) {
        let now = self.now();
        let mine: Vec<u32> = self
            .ids
            .iter()
            .filter(|(_, x)| x.client == client)
            .map(|(h, _)| *h)
            .collect();
        if !mine.is_empty() {
            info!(
                client,
                ids = mine.len(),
                "client gone: its rdma_cm ids are destroyed"
            );
        }
        for h in mine {
            self.destroy_id(now, h);
        }
        self.channels.retain(|_, c| c.client != client);
        self.drain();
    }

    fn destroy_id(&mut self, now: u64, h: u32) {
        let Some(x) = self.ids.remove(&h) else {
            return;
        };
        if let (Some(d), Some(conn)) = (x.device, x.conn) {
            self.devices[d].endpoint.destroy(now, conn);
            self.conns.remove(&(d, conn));
        }
        if x.role == Role::Listen {
            if let (Some(ps), Some(port)) = (ps_of(x.ps), x.port) {
                let sid = rc::service_id(ps, port);
                for d in self.listen_devices(x.device) {
                    let key = (d, sid);
                    if let Some(n) = self.listens.get_mut(&key) {
                        *n -= 1;
                        if *n == 0 {
                            self.listens.remove(&key);
                            self.devices[d].endpoint.unlisten(sid);
                        }
                    }
                }
            }
        }
    }

    fn listen_devices(&self, device: Option<usize>) -> Vec<usize> {
        match device {
            Some(d) => vec![d],
            None => (0..self.devices.len()).collect(),
        }
    }

    /// The device that serves `ip`: the device owning it; for loopback the first device with
    /// an address of that family; else the first device of the family.
    fn device_for(&self, ip: IpAddr) -> Option<usize> {
        if let Some(d) = self.devices.iter().position(|d| d.addrs.contains(&ip)) {
            return Some(d);
        }
        self.devices
            .iter()
            .position(|d| d.addrs.iter().any(|a| a.is_ipv4() == ip.is_ipv4()))
    }

    /// The GID type of an id's connection: the REQ's on the passive side, else its device's
    /// `default_roce_mode`.
    fn id_version(&self, x: &Id) -> RoceVersion {
        x.gid_type.unwrap_or_else(|| {
            x.device
                .and_then(|d| self.devices.get(d))
                .map_or(RoceVersion::V2, |d| d.setup.default_roce_mode)
        })
    }

    /// The device address an id's traffic leaves from: its bound address when the device owns
    /// it (a device of several addresses answers from the one that was asked: rxe checks an RC
    /// packet's source against the QP's path), else the device's address toward the peer.
    fn local_ip(&self, x: &Id) -> Option<IpAddr> {
        if x.wire_local.is_some() {
            return x.wire_local;
        }
        let dev = &self.devices[x.device?];
        if let Some(s) = x.src {
            let same_family = x.peer_ip.is_none_or(|p| p.is_ipv4() == s.ip().is_ipv4());
            if dev.addrs.contains(&s.ip()) && same_family {
                return Some(s.ip());
            }
        }
        match (x.peer_ip, x.src) {
            (Some(p), _) => dev.local_for(p),
            (None, Some(s)) => dev.local_for(s.ip()),
            _ => None,
        }
    }

    fn conn_of(&self, h: u32) -> Option<(usize, ConnId)> {
        let x = self.ids.get(&h)?;
        Some((x.device?, x.conn?))
    }

    /// Reserves `addr` (port 0: an ephemeral port) in the id's port space.
    fn bind(&mut self, h: u32, addr: SocketAddr) -> Result<(), (i32, String)> {
        let Some(x) = self.ids.get(&h) else {
            return Err((libc::EINVAL, "no such id".into()));
        };
        if x.port.is_some() {
            return Err((libc::EINVAL, "the id is already bound".into()));
        }
        let device = if addr.ip().is_unspecified() {
            None
        } else {
            match self.device_for(addr.ip()) {
                Some(d) if self.devices[d].addrs.contains(&addr.ip()) => Some(d),
                // "This host" binds to a device serving loopback addresses. Without one, the
                // id is bound to no device, as a wildcard bind (and as librdmacm reports it
                // on a kernel whose RDMA devices sit on network interfaces: `id->verbs` stays
                // NULL): libfabric's verbs provider binds "localhost" to find its listening
                // address and, given no device, takes the device's interface addresses
                // instead. Binding it to the device made every libfabric server listen on
                // 127.0.0.1, which no other host can reach.
                Some(d)
                    if is_this_host(addr.ip())
                        && self.devices[d].addrs.iter().any(|a| a.is_loopback()) =>
                {
                    Some(d)
                }
                _ if is_this_host(addr.ip()) => None,
                _ => {
                    return Err((
                        libc::EADDRNOTAVAIL,
                        format!("no device has the address {}", addr.ip()),
                    ))
                }
            }
        };
        let (ps, reuse) = (x.ps, x.reuse);
        let taken = |port: u16| {
            self.ids.iter().any(|(oh, o)| {
                *oh != h
                    && o.ps == ps
                    && o.port == Some(port)
                    && o.src.is_some_and(|s| overlaps(s.ip(), addr.ip()))
                    && !(reuse && o.reuse && o.role != Role::Listen)
            })
        };
        let port = if addr.port() == 0 {
            let span = u32::from(EPHEMERAL.end() - EPHEMERAL.start()) + 1;
            let first = random_u32() % span;
            let Some(p) = (0..span)
                .map(|i| EPHEMERAL.start() + ((first + i) % span) as u16)
                .find(|p| !taken(*p))
            else {
                return Err((libc::EADDRNOTAVAIL, "no ephemeral port left".into()));
            };
            p
        } else if taken(addr.port()) {
            return Err((libc::EADDRINUSE, format!("port {} is in use", addr.port())));
        } else {
            addr.port()
        };
        if let Some(x) = self.ids.get_mut(&h) {
            x.port = Some(port);
            x.src = Some(SocketAddr::new(addr.ip(), port));
            x.device = device;
        }
        Ok(())
    }

    fn resolve_addr(&mut self, h: u32, src: Option<SocketAddr>, dst: SocketAddr) -> Reply {
        let bound = self.ids.get(&h).and_then(|x| x.src);
        if bound.is_none() {
            let any = match dst.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            };
            let want = src.unwrap_or(SocketAddr::new(any, 0));
            if let Err((errno, why)) = self.bind(h, want) {
                return error(errno, why);
            }
        }
        let mut m = Self::event(Ev::AddrResolved, 0);
        match self.pick_route(h, dst) {
            Ok(()) => {}
            Err((errno, why)) => {
                warn!(id = h, %dst, "address resolution failed: {why}");
                m = Self::event(Ev::AddrError, -errno);
            }
        }
        self.emit(h, m);
        done()
    }

    /// Address resolution proper: the device, the source address, the wire peer.
    fn pick_route(&mut self, h: u32, dst: SocketAddr) -> Result<(), (i32, String)> {
        let x = self
            .ids
            .get(&h)
            .ok_or((libc::EINVAL, "no id".to_string()))?;
        let d = match x.device {
            Some(d) => d,
            None => self
                .device_for(dst.ip())
                .ok_or((libc::ENETUNREACH, format!("no device reaches {}", dst.ip())))?,
        };
        let dev = &self.devices[d];
        if !dev
            .setup
            .info
            .gids
            .iter()
            .any(|g| g.roce == dev.setup.default_roce_mode)
        {
            return Err((
                libc::EINVAL,
                format!(
                    "device {} has no RoCE {} GID (default_roce_mode)",
                    dev.setup.info.name, dev.setup.default_roce_mode
                ),
            ));
        }
        let peer = if is_this_host(dst.ip()) && !dev.addrs.contains(&dst.ip()) {
            // Loopback is the device itself: its own address carries the traffic.
            dev.local_for(dst.ip())
                .ok_or((libc::ENETUNREACH, "no address of that family".to_string()))?
        } else {
            dst.ip()
        };
        let local = dev
            .local_for(peer)
            .ok_or((libc::ENETUNREACH, "no address of that family".to_string()))?;
        let x = self
            .ids
            .get_mut(&h)
            .ok_or((libc::EINVAL, "no id".to_string()))?;
        let port = x.port.unwrap_or(0);
        let src_ip = match x.src {
            Some(s) if !s.ip().is_unspecified() => s.ip(),
            _ if is_this_host(dst.ip()) && peer != dst.ip() => dst.ip(),
            _ => local,
        };
        x.device = Some(d);
        x.src = Some(SocketAddr::new(src_ip, port));
        x.dst = Some(dst);
        x.peer_ip = Some(peer);
        Ok(())
    }

    fn resolve_route(&mut self, h: u32) -> Reply {
        let Some(x) = self.ids.get(&h) else {
            return error(libc::EINVAL, "no such id");
        };
        let (Some(d), Some(src), Some(dst), Some(peer)) = (x.device, x.src, x.dst, x.peer_ip)
        else {
            return error(libc::EINVAL, "the address is not resolved");
        };
        let local = self.local_ip(x).unwrap_or(src.ip());
        let dev = &self.devices[d];
        let flow_label = match dst {
            SocketAddr::V6(v6) if v6.flowinfo() & 0xfffff != 0 => v6.flowinfo() & 0xfffff,
            _ => rc::rdma_flow_label(src.port(), dst.port()),
        };
        let path = CmPathInfo {
            sgid: ctl::gid_of(local),
            dgid: ctl::gid_of(peer),
            flow_label,
            hop_limit: ROUTE_HOP_LIMIT,
            traffic_class: x.tos.unwrap_or(0),
            sl: 0,
            pkey: 0xffff,
            mtu: dev.setup.info.active_mtu,
            rate: 0,
            packet_life_time: x
                .ack_timeout
                .map_or(rc::CMA_IBOE_PACKET_LIFETIME, |t| t.saturating_sub(1)),
        };
        if let Some(x) = self.ids.get_mut(&h) {
            x.path = Some(path);
        }
        self.emit(h, Self::event(Ev::RouteResolved, 0));
        done()
    }

    fn listen(&mut self, h: u32) -> Reply {
        if self.ids.get(&h).is_some_and(|x| x.port.is_none()) {
            if let Err((errno, why)) =
                self.bind(h, SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0))
            {
                return error(errno, why);
            }
        }
        let Some(x) = self.ids.get(&h) else {
            return error(libc::EINVAL, "no such id");
        };
        if x.role != Role::Idle {
            return error(libc::EINVAL, "the id is not idle");
        }
        let (Some(ps), Some(port)) = (ps_of(x.ps), x.port) else {
            return error(libc::EINVAL, "unsupported port space");
        };
        let sid = rc::service_id(ps, port);
        for d in self.listen_devices(x.device) {
            let n = self.listens.entry((d, sid)).or_insert(0);
            if *n == 0 {
                let _ = self.devices[d].endpoint.listen(sid);
            }
            *n += 1;
        }
        if let Some(x) = self.ids.get_mut(&h) {
            x.role = Role::Listen;
        }
        done()
    }

    fn connect(&mut self, now: u64, h: u32, conn: CmConnParam, psn: Option<u32>) -> Reply {
        let Some(x) = self.ids.get(&h) else {
            return error(libc::EINVAL, "no such id");
        };
        if x.role != Role::Idle {
            return error(libc::EINVAL, "the id is already connecting or listening");
        }
        let (Some(d), Some(src), Some(dst), Some(peer)) = (x.device, x.src, x.dst, x.peer_ip)
        else {
            return error(libc::EINVAL, "the address is not resolved");
        };
        if x.path.is_none() {
            let r = self.resolve_route(h);
            if !matches!(r.0, Response::Done) {
                return r;
            }
        }
        let Some(x) = self.ids.get(&h) else {
            return error(libc::EINVAL, "no such id");
        };
        let Some(path) = x.path else {
            return error(libc::EINVAL, "no route");
        };
        let Some(ps) = ps_of(x.ps) else {
            return error(libc::EINVAL, "unsupported port space");
        };
        let local = self.local_ip(x).unwrap_or(src.ip());
        let dev = &self.devices[d];
        // The rdma_cm header names the addresses the program used; the path the wire ones.
        let hdr = CmaHdr {
            src_port: src.port(),
            src_addr: src.ip(),
            dst_addr: dst.ip(),
        };
        let (timeout, retries) = (dev.setup.cm_response_timeout, dev.setup.cm_max_retries);
        if x.is_ud() {
            let pd = match rc::req_private_data(
                &hdr,
                &conn.private_data,
                rc::user_private_data_max::SIDR_REQ,
            ) {
                Ok(pd) => pd,
                Err(e) => return error(libc::EINVAL, e.to_string()),
            };
            let p = SidrParams {
                peer,
                service_id: rc::service_id(ps, dst.port()),
                pkey: 0xffff,
                private_data: pd,
                timeout_ms: proto::cm::conn::cm_convert_to_ms(timeout),
                max_cm_retries: retries,
            };
            let version = self.id_version(x);
            self.devices[d].peer_types.insert(peer, version);
            return match self.devices[d].endpoint.sidr_resolve(now, p) {
                Ok(c) => {
                    self.conns.insert((d, c), h);
                    if let Some(x) = self.ids.get_mut(&h) {
                        x.conn = Some(c);
                        x.role = Role::SidrActive;
                    }
                    done()
                }
                Err(e) => error(libc::EINVAL, e.to_string()),
            };
        }
        let route = RoceRoute {
            src_addr: local,
            dst_addr: peer,
            src_port: src.port(),
            dst_port: dst.port(),
            hop_limit: path.hop_limit,
            traffic_class: path.traffic_class,
            sl: path.sl,
            path_mtu: path.mtu,
            packet_life_time: path.packet_life_time,
            rate: path.rate,
        };
        let param = rc::RdmaConnParam {
            private_data: conn.private_data.clone(),
            responder_resources: conn.responder_resources,
            initiator_depth: conn.initiator_depth,
            flow_control: conn.flow_control != 0,
            retry_count: conn.retry_count,
            rnr_retry_count: conn.rnr_retry_count,
            srq: conn.srq != 0,
            qp_num: conn.qp_num,
        };
        let qpt = if x.qp_type == qp_type::UC {
            rc::QpType::Uc
        } else {
            rc::QpType::Rc
        };
        let starting_psn = psn.unwrap_or_else(random_u32) & 0xff_ffff;
        let mut p = match ConnectParams::rdma_cm(
            &route,
            ps,
            &param,
            qpt,
            starting_psn,
            rc::RXE_ACK_DELAY,
        ) {
            Ok(p) => p,
            Err(e) => return error(libc::EINVAL, e.to_string()),
        };
        match rc::req_private_data(&hdr, &conn.private_data, rc::user_private_data_max::REQ) {
            Ok(pd) => p.private_data = pd,
            Err(e) => return error(libc::EINVAL, e.to_string()),
        }
        p.remote_cm_response_timeout = timeout;
        p.local_cm_response_timeout = timeout;
        p.max_cm_retries = retries;
        let version = self.id_version(x);
        self.devices[d].peer_types.insert(peer, version);
        match self.devices[d].endpoint.connect(now, p.clone()) {
            Ok(c) => {
                self.conns.insert((d, c), h);
                if let Some(x) = self.ids.get_mut(&h) {
                    x.conn = Some(c);
                    x.role = Role::Active;
                    x.local_psn = starting_psn;
                    x.connect = Some(p);
                }
                done()
            }
            Err(e) => error(libc::EINVAL, e.to_string()),
        }
    }

    fn accept(&mut self, now: u64, h: u32, conn: CmConnParam) -> Reply {
        let Some(x) = self.ids.get_mut(&h) else {
            return error(libc::EINVAL, "no such id");
        };
        x.pending_on = None;
        let (Some(d), Some(c)) = (x.device, x.conn) else {
            return error(libc::EINVAL, "the id has no connection request");
        };
        match x.role {
            Role::SidrPassive => {
                let qkey = if conn.qkey == 0 {
                    rc::RDMA_UDP_QKEY
                } else {
                    conn.qkey
                };
                x.qkey = qkey;
                match self.devices[d].endpoint.sidr_reply(
                    now,
                    c,
                    sidr_status::SUCCESS,
                    conn.qp_num,
                    qkey,
                    &conn.private_data,
                ) {
                    Ok(()) => {
                        // Answered: the endpoint has forgotten the request. A refused answer
                        // (private data too long) leaves it waiting, as the kernel's id
                        // stays in SIDR_REQ_RCVD, for another accept or a reject.
                        x.conn = None;
                        self.conns.remove(&(d, c));
                        done()
                    }
                    Err(e) => error(libc::EINVAL, e.to_string()),
                }
            }
            Role::Passive => {
                let a = AcceptParams {
                    local_qpn: conn.qp_num,
                    starting_psn: x.local_psn,
                    responder_resources: conn.responder_resources,
                    initiator_depth: conn.initiator_depth,
                    flow_control: conn.flow_control != 0,
                    rnr_retry_count: conn.rnr_retry_count,
                    srq: conn.srq != 0,
                    private_data: conn.private_data,
                };
                if let Some(req) = &x.req {
                    x.negotiated =
                        Some(x.with_overrides(proto::cm::conn::negotiated_passive(req, &a)));
                }
                match self.devices[d].endpoint.accept(now, c, a) {
                    Ok(()) => done(),
                    Err(e) => error(libc::EINVAL, e.to_string()),
                }
            }
            _ => error(libc::EINVAL, "only a connection request can be accepted"),
        }
    }

    fn reject(&mut self, now: u64, h: u32, private_data: &[u8]) -> Reply {
        let Some(x) = self.ids.get_mut(&h) else {
            return error(libc::EINVAL, "no such id");
        };
        x.pending_on = None;
        let (Some(d), Some(c)) = (x.device, x.conn) else {
            return error(libc::EINVAL, "nothing to reject");
        };
        let ep = &mut self.devices[d].endpoint;
        let r = if x.role == Role::SidrPassive {
            ep.sidr_reply(now, c, sidr_status::REJECT, 0, 0, private_data)
        } else {
            ep.reject(now, c, RejReason::CONSUMER_DEFINED, &[], private_data)
        };
        // A rejected request is forgotten at once; a rejected REP waits out timewait.
        if ep.state(c).is_none() {
            x.conn = None;
            self.conns.remove(&(d, c));
        }
        match r {
            Ok(()) => done(),
            Err(e) => error(libc::EINVAL, e.to_string()),
        }
    }

    fn establish(&mut self, now: u64, h: u32) -> Reply {
        let Some((d, c)) = self.conn_of(h) else {
            return error(libc::EINVAL, "the id is not connecting");
        };
        let role = self.ids.get(&h).map(|x| x.role);
        let ep = &mut self.devices[d].endpoint;
        let r = if role == Some(Role::Active) {
            ep.send_rtu(now, ConnId(c.0), &[])
        } else {
            ep.notify_comm_established(now, c)
        };
        match r {
            Ok(()) => done(),
            Err(e) => error(libc::EINVAL, e.to_string()),
        }
    }

    /// The AH toward the id's peer.
    fn ah_of(&self, h: u32) -> AhAttr {
        let Some(x) = self.ids.get(&h) else {
            return AhAttr::default();
        };
        let path = x.path.unwrap_or_default();
        let gid_index = match (x.device, self.local_ip(x)) {
            (Some(d), Some(l)) => self.devices[d].gid_index_of(l, self.id_version(x)),
            _ => 0,
        };
        AhAttr {
            dgid: x.peer_ip.map_or(path.dgid, ctl::gid_of),
            flow_label: path.flow_label,
            sgid_index: gid_index as u8,
            hop_limit: if path.hop_limit == 0 {
                ROUTE_HOP_LIMIT
            } else {
                path.hop_limit
            },
            traffic_class: path.traffic_class,
            is_global: true,
            dlid: 0,
            sl: path.sl,
            src_path_bits: 0,
            static_rate: path.rate,
            port_num: 1,
        }
    }

    /// `rdma_init_qp_attr` (`cma_ib_init_qp_attr` / `ib_cm_init_qp_attr`, facts §5.2).
    fn init_qp_attr(&self, h: u32, state: u32) -> Reply {
        use qp_mask as m;
        let Some(x) = self.ids.get(&h) else {
            return error(libc::EINVAL, "no such id");
        };
        let mut a = QpAttr {
            qp_state: state,
            ..QpAttr::default()
        };
        let mut mask = m::STATE;
        let ud = x.is_ud();
        let n = x.negotiated.map(|n| rc::qp_attrs(&n));
        match (state, ud) {
            (1, true) => {
                a.port_num = 1;
                a.qkey = x.qkey;
                mask |= m::PKEY_INDEX | m::PORT | m::QKEY;
            }
            (1, false) => {
                a.port_num = 1;
                a.qp_access_flags = match &n {
                    Some(q) => {
                        let mut f = access::LOCAL_WRITE | access::REMOTE_WRITE;
                        if q.access_remote_read_atomic {
                            f |= access::REMOTE_READ | access::REMOTE_ATOMIC;
                        }
                        f
                    }
                    None => 0,
                };
                mask |= m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS;
            }
            (2, true) => {}
            (3, true) => {
                a.sq_psn = x.local_psn;
                mask |= m::SQ_PSN;
            }
            (2, false) => {
                let Some(q) = n else {
                    return error(libc::EINVAL, "the connection parameters are not known yet");
                };
                a.path_mtu = u32::from(q.path_mtu);
                a.dest_qp_num = q.dest_qpn;
                a.rq_psn = q.rq_psn;
                a.ah_attr = self.ah_of(h);
                mask |= m::AV | m::PATH_MTU | m::DEST_QPN | m::RQ_PSN;
                if x.qp_type == qp_type::RC {
                    a.max_dest_rd_atomic = q.max_dest_rd_atomic;
                    a.min_rnr_timer = q.min_rnr_timer;
                    mask |= m::MAX_DEST_RD_ATOMIC | m::MIN_RNR_TIMER;
                }
            }
            (3, false) => {
                let Some(q) = n else {
                    return error(libc::EINVAL, "the connection parameters are not known yet");
                };
                a.sq_psn = q.sq_psn;
                mask |= m::SQ_PSN;
                if x.qp_type == qp_type::RC {
                    a.timeout = q.timeout;
                    a.retry_cnt = q.retry_cnt;
                    a.rnr_retry = q.rnr_retry;
                    a.max_rd_atomic = q.max_rd_atomic;
                    mask |= m::TIMEOUT | m::RETRY_CNT | m::RNR_RETRY | m::MAX_QP_RD_ATOMIC;
                }
            }
            _ => return error(libc::EINVAL, "rdma_init_qp_attr serves INIT, RTR and RTS"),
        }
        (Response::CmQpAttr { attr: a, mask }, Vec::new())
    }

    fn set_option(&mut self, h: u32, level: i32, name: i32, value: &[u8]) -> Reply {
        let Some(x) = self.ids.get_mut(&h) else {
            return error(libc::EINVAL, "no such id");
        };
        let byte = value.first().copied();
        let int = value
            .get(..4)
            .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
        match (level, name) {
            (cm_option::LEVEL_ID, cm_option::ID_TOS) => {
                let Some(v) = byte else {
                    return error(libc::EINVAL, "TOS is one byte");
                };
                x.tos = Some(v);
            }
            (cm_option::LEVEL_ID, cm_option::ID_REUSEADDR) => {
                let Some(v) = int else {
                    return error(libc::EINVAL, "REUSEADDR is an int");
                };
                x.reuse = v != 0;
            }
            (cm_option::LEVEL_ID, cm_option::ID_AFONLY) => {
                let Some(v) = int else {
                    return error(libc::EINVAL, "AFONLY is an int");
                };
                x.afonly = v != 0;
            }
            (cm_option::LEVEL_ID, cm_option::ID_ACK_TIMEOUT) => {
                let Some(v) = byte.filter(|v| *v <= 31) else {
                    return error(libc::EINVAL, "ACK timeout is one byte, at most 31");
                };
                x.ack_timeout = Some(v);
            }
            (cm_option::LEVEL_ID, cm_option::ID_MIN_RNR_TIMER) => {
                let Some(v) = byte.filter(|v| *v <= 31) else {
                    return error(libc::EINVAL, "min RNR timer is one byte, at most 31");
                };
                x.min_rnr_timer = Some(v);
            }
            _ => return error(libc::ENOSYS, "option not supported"),
        }
        if let Some(n) = x.negotiated {
            x.negotiated = Some(x.with_overrides(n));
        }
        done()
    }

    /// RoCE multicast needs no SA: the group's GID is its address (v4-mapped for IPv4), the
    /// Q_Key rdma_cm's. The shim attaches its QP itself.
    fn join_mcast(&mut self, h: u32, addr: SocketAddr) -> Reply {
        if !addr.ip().is_multicast() {
            return error(libc::EINVAL, "not a multicast address");
        }
        if self.ids.get(&h).is_some_and(|x| x.device.is_none()) {
            if let Err((errno, why)) = self.pick_route(h, addr) {
                return error(errno, why);
            }
        }
        let mut ah = self.ah_of(h);
        ah.dgid = ctl::gid_of(addr.ip());
        let mut m = Self::event(Ev::MulticastJoin, 0);
        m.ud = Some(CmUdParam {
            ah_attr: ah,
            qp_num: 0xff_ffff,
            qkey: rc::RDMA_UDP_QKEY,
        });
        self.emit(h, m);
        done()
    }

    fn info(&self, h: u32) -> CmIdInfo {
        let Some(x) = self.ids.get(&h) else {
            return CmIdInfo::default();
        };
        let dev = x.device.map(|d| &self.devices[d]);
        let local = self.local_ip(x);
        CmIdInfo {
            id: h,
            channel: x.channel,
            ps: x.ps,
            qp_type: x.qp_type,
            device: dev.map(|d| d.setup.info.name.clone()),
            port_num: u8::from(dev.is_some()),
            gid_index: match (dev, local) {
                (Some(d), Some(l)) => d.gid_index_of(l, self.id_version(x)),
                _ => 0,
            },
            gid_type: dev.map(|_| self.id_version(x)),
            src_addr: x.src,
            dst_addr: x.dst,
            src_gid: local.map(ctl::gid_of).unwrap_or_default(),
            dst_gid: x.peer_ip.map(ctl::gid_of).unwrap_or_default(),
            path: x.path,
        }
    }
}

/// The id a request names.
fn cm_id_of(r: &Request) -> Option<u32> {
    Some(match r {
        Request::CmDestroyId { id }
        | Request::CmBind { id, .. }
        | Request::CmResolveAddr { id, .. }
        | Request::CmResolveRoute { id, .. }
        | Request::CmListen { id, .. }
        | Request::CmConnect { id, .. }
        | Request::CmAccept { id, .. }
        | Request::CmReject { id, .. }
        | Request::CmEstablish { id }
        | Request::CmDisconnect { id, .. }
        | Request::CmInitQpAttr { id, .. }
        | Request::CmSetOption { id, .. }
        | Request::CmJoinMcast { id, .. }
        | Request::CmLeaveMcast { id, .. }
        | Request::CmMigrateId { id, .. }
        | Request::CmQueryId { id } => *id,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gsi::gsi_payload;
    use proto::cm::GSI_QPN;

    use crate::config::{device_info, DeviceConfig};
    use std::path::Path;
    use std::sync::{Arc, Mutex};

    type Wire = Arc<Mutex<Vec<(IpAddr, IpAddr, Vec<u8>)>>>;

    /// A CM service of one device whose MADs loop back to it when addressed to one of its
    /// addresses (and are dropped otherwise): the daemon talking to itself, without sockets.
    fn service(addrs: &[&str], mode: RoceVersion) -> (CmService, Wire) {
        let mut cfg = DeviceConfig::new("srxe0");
        cfg.addr = addrs.iter().map(|a| a.parse().unwrap()).collect();
        let wire: Wire = Arc::default();
        let w = Arc::clone(&wire);
        let send: GsiSender = Box::new(move |m: GsiOut| {
            w.lock().unwrap().push((m.src, m.dst, m.packet));
            true
        });
        let setup = CmDeviceSetup {
            info: device_info(&cfg).unwrap(),
            default_roce_mode: mode,
            cm_response_timeout: 20,
            cm_max_retries: 15,
        };
        (CmService::new(vec![(setup, send)]), wire)
    }

    /// Delivers MADs until the wire is quiet; returns how many went to a foreign address.
    fn settle(svc: &mut CmService, wire: &Wire) -> usize {
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

    fn call(svc: &mut CmService, client: u64, r: Request) -> Response {
        svc.request(client, r).0
    }

    fn ok(svc: &mut CmService, client: u64, r: Request) -> Response {
        let resp = call(svc, client, r);
        assert!(!matches!(resp, Response::Error { .. }), "{resp:?}");
        resp
    }

    fn errno_of(r: Response) -> i32 {
        match r {
            Response::Error { errno, .. } => errno,
            other => panic!("expected an error, got {other:?}"),
        }
    }

    /// A channel: its handle and the client's end.
    fn channel(svc: &mut CmService, client: u64) -> (u32, OwnedFd) {
        let (r, mut fds) = svc.request(client, Request::CmCreateChannel);
        let Response::CmChannel { channel } = r else {
            panic!("{r:?}")
        };
        (channel, fds.pop().unwrap())
    }

    fn id(svc: &mut CmService, client: u64, ch: u32, ps: u16, qpt: u32) -> u32 {
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

    fn events(fd: &OwnedFd) -> Vec<CmEventMsg> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 4096];
        while let Ok(n) = socket::recv(fd.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
            out.push(ctl::decode(&buf[..n]).unwrap());
        }
        out
    }

    fn kinds(evs: &[CmEventMsg]) -> Vec<u32> {
        evs.iter().map(|e| e.event).collect()
    }

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn bind_to(id: u32, addr: &str) -> Request {
        Request::CmBind { id, addr: sa(addr) }
    }

    fn resolve_addr_to(id: u32, dst: SocketAddr) -> Request {
        Request::CmResolveAddr {
            id,
            src: None,
            dst,
            timeout_ms: 1000,
        }
    }

    fn resolve_route(id: u32) -> Request {
        Request::CmResolveRoute {
            id,
            timeout_ms: 1000,
        }
    }

    /// Listener `l` on `listen`, an active id resolved to `dst` and connecting; returns the
    /// active id and the CONNECT_REQUEST (or whatever the listener's channel got).
    fn start_connect(
        svc: &mut CmService,
        wire: &Wire,
        ch: (u32, &OwnedFd),
        dst: SocketAddr,
        qpn: u32,
    ) -> u32 {
        let a = id(svc, 2, ch.0, cm_ps::TCP, qp_type::RC);
        ok(svc, 2, resolve_addr_to(a, dst));
        ok(svc, 2, resolve_route(a));
        assert_eq!(
            kinds(&events(ch.1)),
            vec![Ev::AddrResolved as u32, Ev::RouteResolved as u32]
        );
        ok(
            svc,
            2,
            Request::CmConnect {
                id: a,
                conn: CmConnParam {
                    qp_num: qpn,
                    responder_resources: 2,
                    initiator_depth: 3,
                    retry_count: 6,
                    rnr_retry_count: 5,
                    ..CmConnParam::default()
                },
                psn: Some(0x42),
            },
        );
        settle(svc, wire);
        a
    }

    #[test]
    fn ports_are_one_namespace_per_port_space() {
        let (mut svc, _) = service(&["127.0.0.1", "::1"], RoceVersion::V2);
        let (ch, _fd) = channel(&mut svc, 1);
        let a = id(&mut svc, 1, ch, cm_ps::TCP, qp_type::RC);
        let b = id(&mut svc, 1, ch, cm_ps::TCP, qp_type::RC);
        let u = id(&mut svc, 1, ch, cm_ps::UDP, qp_type::UD);
        let e = id(&mut svc, 1, ch, cm_ps::TCP, qp_type::RC);
        ok(&mut svc, 1, bind_to(a, "0.0.0.0:7000"));
        let r = call(&mut svc, 1, bind_to(b, "127.0.0.1:7000"));
        assert_eq!(
            errno_of(r),
            libc::EADDRINUSE,
            "a wildcard covers every address"
        );
        ok(&mut svc, 1, bind_to(b, "[::1]:7000"));
        ok(&mut svc, 1, bind_to(u, "127.0.0.1:7000"));
        let Response::CmIdInfo(info) = ok(&mut svc, 1, bind_to(e, "127.0.0.1:0")) else {
            panic!()
        };
        let port = info.src_addr.unwrap().port();
        assert!(EPHEMERAL.contains(&port) && port != 7000, "{port}");
        assert_eq!(info.device.as_deref(), Some("srxe0"));
        assert_eq!(info.gid_type, Some(RoceVersion::V2));
        let f = id(&mut svc, 1, ch, cm_ps::TCP, qp_type::RC);
        let r = call(&mut svc, 1, bind_to(f, "10.9.9.9:1"));
        assert_eq!(errno_of(r), libc::EADDRNOTAVAIL);
        // Ids are their client's: another client cannot use or destroy them.
        assert_eq!(
            errno_of(call(&mut svc, 9, Request::CmDestroyId { id: a })),
            libc::EINVAL
        );
        assert_eq!(
            errno_of(call(&mut svc, 1, Request::CmDestroyChannel { channel: ch })),
            libc::EBUSY
        );
        // Its client gone, the port is free again.
        svc.client_gone(1);
        let (ch2, _fd2) = channel(&mut svc, 3);
        let g = id(&mut svc, 3, ch2, cm_ps::TCP, qp_type::RC);
        ok(&mut svc, 3, bind_to(g, "127.0.0.1:7000"));
    }

    #[test]
    fn an_ipv6_wildcard_listener_takes_ipv4_unless_afonly() {
        let (mut svc, wire) = service(&["127.0.0.1", "::1"], RoceVersion::V2);
        let (ch, fd) = channel(&mut svc, 1);
        let l = id(&mut svc, 1, ch, cm_ps::TCP, qp_type::RC);
        ok(&mut svc, 1, bind_to(l, "[::]:7100"));
        ok(&mut svc, 1, Request::CmListen { id: l, backlog: 1 });
        let (cch, cfd) = channel(&mut svc, 2);
        let a = start_connect(&mut svc, &wire, (cch, &cfd), sa("127.0.0.1:7100"), 0x10011);
        let evs = events(&fd);
        assert_eq!(kinds(&evs), vec![Ev::ConnectRequest as u32]);
        let req = &evs[0];
        assert_eq!(req.id, l);
        assert_eq!(
            (
                req.conn.qp_num,
                req.conn.responder_resources,
                req.conn.initiator_depth
            ),
            (0x10011, 2, 3)
        );
        let child = req.child.clone().unwrap();
        assert_eq!(child.src_addr, Some(sa("127.0.0.1:7100")));
        assert_eq!(
            child.dst_addr.map(|d| d.ip()),
            Some("127.0.0.1".parse().unwrap())
        );
        // The child's QP attributes come from the REQ: our rd_atomic bounds are the peer's
        // initiator depth and responder resources.
        let Response::CmQpAttr { attr, mask } = ok(
            &mut svc,
            1,
            Request::CmInitQpAttr {
                id: child.id,
                qp_state: 2,
            },
        ) else {
            panic!()
        };
        assert_eq!(attr.dest_qp_num, 0x10011);
        assert_ne!(
            attr.rq_psn, 0x42,
            "the passive side receives at its own PSN (the REP's)"
        );
        assert_eq!(attr.max_dest_rd_atomic, 3);
        assert_eq!(attr.min_rnr_timer, 0, "rdma_cm's default (facts §5.2)");
        assert_eq!(
            mask,
            qp_mask::STATE
                | qp_mask::AV
                | qp_mask::PATH_MTU
                | qp_mask::DEST_QPN
                | qp_mask::RQ_PSN
                | qp_mask::MAX_DEST_RD_ATOMIC
                | qp_mask::MIN_RNR_TIMER
        );
        // Destroying the child before accepting it rejects the request (consumer defined).
        ok(&mut svc, 1, Request::CmDestroyId { id: child.id });
        settle(&mut svc, &wire);
        let evs = events(&cfd);
        assert_eq!(kinds(&evs), vec![Ev::Rejected as u32]);
        assert_eq!((evs[0].id, evs[0].status), (a, 28));

        // AFONLY: the IPv6 wildcard no longer takes IPv4; nobody else listens on that port,
        // yet the service ID is listened on, so the answer is REJ 28 from rdma_cm.
        ok(
            &mut svc,
            1,
            Request::CmSetOption {
                id: l,
                level: cm_option::LEVEL_ID,
                name: cm_option::ID_AFONLY,
                value: 1i32.to_ne_bytes().to_vec(),
            },
        );
        let b = start_connect(&mut svc, &wire, (cch, &cfd), sa("127.0.0.1:7100"), 0x10012);
        assert!(events(&fd).is_empty());
        let evs = events(&cfd);
        assert_eq!((evs[0].id, evs[0].event), (b, Ev::Rejected as u32));
    }

    #[test]
    fn options_shape_the_qp_attributes_and_migrate_moves_events() {
        let (mut svc, wire) = service(&["127.0.0.1"], RoceVersion::V2);
        let (ch, fd) = channel(&mut svc, 1);
        let (ch_b, fd_b) = channel(&mut svc, 1);
        let l = id(&mut svc, 1, ch, cm_ps::TCP, qp_type::RC);
        ok(&mut svc, 1, bind_to(l, "127.0.0.1:7200"));
        ok(&mut svc, 1, Request::CmListen { id: l, backlog: 1 });
        ok(
            &mut svc,
            1,
            Request::CmMigrateId {
                id: l,
                channel: ch_b,
            },
        );
        let (cch, cfd) = channel(&mut svc, 2);
        let a = id(&mut svc, 2, cch, cm_ps::TCP, qp_type::RC);
        for (name, v) in [(cm_option::ID_TOS, 0x20u8), (cm_option::ID_ACK_TIMEOUT, 14)] {
            ok(
                &mut svc,
                2,
                Request::CmSetOption {
                    id: a,
                    level: cm_option::LEVEL_ID,
                    name,
                    value: vec![v],
                },
            );
        }
        let r = call(
            &mut svc,
            2,
            Request::CmSetOption {
                id: a,
                level: cm_option::LEVEL_IB,
                name: cm_option::IB_PATH,
                value: vec![0; 64],
            },
        );
        assert_eq!(errno_of(r), libc::ENOSYS);
        ok(&mut svc, 2, resolve_addr_to(a, sa("127.0.0.1:7200")));
        ok(&mut svc, 2, resolve_route(a));
        let evs = events(&cfd);
        let path = evs[1].info.as_ref().unwrap().path.unwrap();
        assert_eq!((path.traffic_class, path.packet_life_time), (0x20, 13));
        assert_eq!(
            path.flow_label,
            rc::rdma_flow_label(evs[1].info.as_ref().unwrap().src_addr.unwrap().port(), 7200)
        );
        let r = call(&mut svc, 2, Request::CmInitQpAttr { id: a, qp_state: 2 });
        assert_eq!(errno_of(r), libc::EINVAL, "RTR needs the peer's REP");
        ok(
            &mut svc,
            2,
            Request::CmConnect {
                id: a,
                conn: CmConnParam {
                    qp_num: 0x20011,
                    ..CmConnParam::default()
                },
                psn: Some(7),
            },
        );
        settle(&mut svc, &wire);
        assert!(events(&fd).is_empty(), "the listener's events moved");
        let evs = events(&fd_b);
        let child = evs[0].child.clone().unwrap().id;
        ok(
            &mut svc,
            1,
            Request::CmAccept {
                id: child,
                conn: CmConnParam {
                    qp_num: 0x30011,
                    rnr_retry_count: 6,
                    private_data: b"ok".to_vec(),
                    ..CmConnParam::default()
                },
            },
        );
        settle(&mut svc, &wire);
        let evs = events(&cfd);
        assert_eq!(kinds(&evs), vec![Ev::ConnectResponse as u32]);
        assert_eq!(evs[0].conn.qp_num, 0x30011);
        let Response::CmQpAttr { attr, .. } =
            ok(&mut svc, 2, Request::CmInitQpAttr { id: a, qp_state: 3 })
        else {
            panic!()
        };
        assert_eq!(attr.timeout, 14, "the ACK timeout option");
        assert_eq!(attr.rnr_retry, 6, "RNR retry from the REP");
        // Linux: the active side sends from the REP's Starting PSN, not its own REQ's (7).
        assert_ne!(attr.sq_psn, 7);
        let Response::CmQpAttr { attr, .. } =
            ok(&mut svc, 2, Request::CmInitQpAttr { id: a, qp_state: 2 })
        else {
            panic!()
        };
        assert_eq!(attr.ah_attr.traffic_class, 0x20);
        assert_eq!(attr.ah_attr.dgid, ctl::gid_of("127.0.0.1".parse().unwrap()));
        ok(&mut svc, 2, Request::CmEstablish { id: a });
        settle(&mut svc, &wire);
        assert!(
            events(&cfd).is_empty(),
            "the shim reports the active ESTABLISHED"
        );
        assert_eq!(kinds(&events(&fd_b)), vec![Ev::Established as u32]);
        // The active client dies: its connection sends DREQ; the passive side hears it.
        svc.client_gone(2);
        settle(&mut svc, &wire);
        let evs = events(&fd_b);
        assert_eq!((evs[0].id, evs[0].event), (child, Ev::Disconnected as u32));
    }

    #[test]
    fn a_mode_the_device_lacks_is_an_address_error() {
        let (mut svc, _) = service(&["127.0.0.1"], RoceVersion::V1);
        let (ch, fd) = channel(&mut svc, 1);
        let a = id(&mut svc, 1, ch, cm_ps::TCP, qp_type::RC);
        ok(&mut svc, 1, resolve_addr_to(a, sa("127.0.0.1:1")));
        let evs = events(&fd);
        assert_eq!(
            (evs[0].event, evs[0].status),
            (Ev::AddrError as u32, -libc::EINVAL)
        );
    }

    #[test]
    fn multicast_join_names_the_group_gid() {
        let (mut svc, _) = service(&["127.0.0.1"], RoceVersion::V2);
        let (ch, fd) = channel(&mut svc, 1);
        let a = id(&mut svc, 1, ch, cm_ps::UDP, qp_type::UD);
        let r = call(
            &mut svc,
            1,
            Request::CmJoinMcast {
                id: a,
                addr: sa("127.0.0.1:0"),
                join_state: 1,
            },
        );
        assert_eq!(errno_of(r), libc::EINVAL);
        ok(
            &mut svc,
            1,
            Request::CmJoinMcast {
                id: a,
                addr: sa("239.1.2.3:0"),
                join_state: 1,
            },
        );
        let evs = events(&fd);
        let ud = evs[0].ud.unwrap();
        assert_eq!(evs[0].event, Ev::MulticastJoin as u32);
        assert_eq!(ud.ah_attr.dgid, ctl::gid_of("239.1.2.3".parse().unwrap()));
        assert_eq!((ud.qp_num, ud.qkey), (0xff_ffff, rc::RDMA_UDP_QKEY));
    }

    /// The CM MADs of a kernel capture: (source address, MAD) in order.
    fn captured_mads(name: &str) -> Vec<(IpAddr, Vec<u8>)> {
        use crate::pcap::{parse_record, CaptureReader};
        use proto::wire::NetRepr;
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/captures")
            .join(name);
        let mut r = CaptureReader::from_bytes(std::fs::read(&path).unwrap()).unwrap();
        let mut out = Vec::new();
        while let Some(rec) = r.next_record() {
            let rec = rec.unwrap();
            let Ok(f) = parse_record(&rec) else { continue };
            if f.repr.transport.bth.dest_qpn.value() != GSI_QPN {
                continue;
            }
            let src = match f.repr.net {
                NetRepr::Ipv4(ip) => IpAddr::V4(ip.src),
                NetRepr::Ipv6(ip) | NetRepr::Grh(ip) => IpAddr::V6(ip.src),
            };
            out.push((src, f.payload.to_vec()));
        }
        out
    }

    /// A listener (port space `ps`, QP type `qpt`) bound to `bind` on a device at 10.77.0.12,
    /// handed the first MAD of the kernel rxe capture `pcap` (its client's request), which it
    /// must report as one connect request: the service, its wire, the listener's events and
    /// the request (source, MAD). The listener's channel stays open while the caller holds
    /// its descriptor.
    fn kernel_request_to_listener(
        ps: u16,
        qpt: u32,
        bind: &str,
        pcap: &str,
    ) -> (CmService, Wire, OwnedFd, Vec<CmEventMsg>, (IpAddr, Vec<u8>)) {
        let (mut svc, wire) = service(&["10.77.0.12"], RoceVersion::V2);
        let (ch, fd) = channel(&mut svc, 1);
        let l = id(&mut svc, 1, ch, ps, qpt);
        ok(
            &mut svc,
            1,
            Request::CmBind {
                id: l,
                addr: sa(bind),
            },
        );
        ok(&mut svc, 1, Request::CmListen { id: l, backlog: 1 });
        let (src, req_mad) = captured_mads(pcap).swap_remove(0);
        let now = svc.now();
        svc.devices[0]
            .endpoint
            .handle_mad(now, src, &req_mad)
            .unwrap();
        svc.drain();
        let evs = events(&fd);
        assert_eq!(kinds(&evs), vec![Ev::ConnectRequest as u32]);
        (svc, wire, fd, evs, (src, req_mad))
    }

    /// A kernel rxe client's REQ (rping's, from the lab capture) reaches a softroce listener,
    /// which answers with a REP naming the kernel's comm ID, TID and PSN as ib_cm would.
    #[test]
    fn a_kernel_rxe_request_is_answered() {
        use proto::cm::{CmMad, CmMessage};
        let (mut svc, wire, _channel, evs, (src, req_mad)) =
            kernel_request_to_listener(cm_ps::TCP, qp_type::RC, "10.77.0.12:7174", "rping.pcap");
        let src = &src;
        let req = CmMad::parse(&req_mad).unwrap();
        let CmMessage::Req(kreq) = &req.message else {
            panic!("the capture starts with the REQ")
        };
        let child = evs[0].child.clone().unwrap();
        assert_eq!(evs[0].conn.qp_num, 0x21);
        assert_eq!(child.src_addr, Some(sa("10.77.0.12:7174")));
        assert_eq!(child.dst_addr.map(|a| a.ip()), Some(*src));
        let Response::CmQpAttr { attr, .. } = ok(
            &mut svc,
            1,
            Request::CmInitQpAttr {
                id: child.id,
                qp_state: 2,
            },
        ) else {
            panic!()
        };
        // Linux reads a REQ's Starting PSN as the PSN its sender receives at: the passive
        // side sends from it (RTS) and receives at its own REP's (docs/interop.md).
        assert_eq!(attr.dest_qp_num, 0x21);
        assert_ne!(attr.rq_psn, kreq.starting_psn);
        assert_eq!(
            attr.path_mtu, 3,
            "the kernel's path MTU (1024 on a 1500-byte link)"
        );
        assert_eq!(attr.ah_attr.dgid, ctl::gid_of(*src));
        assert_eq!(attr.ah_attr.flow_label, kreq.primary_path.flow_label);
        let Response::CmQpAttr { attr: rts, .. } = ok(
            &mut svc,
            1,
            Request::CmInitQpAttr {
                id: child.id,
                qp_state: 3,
            },
        ) else {
            panic!()
        };
        assert_eq!(
            rts.timeout, kreq.primary_path.local_ack_timeout,
            "PLT 18 + 1"
        );
        ok(
            &mut svc,
            1,
            Request::CmAccept {
                id: child.id,
                conn: CmConnParam {
                    qp_num: 0x10011,
                    responder_resources: 1,
                    initiator_depth: 1,
                    rnr_retry_count: 7,
                    ..CmConnParam::default()
                },
            },
        );
        svc.drain();
        let sent = std::mem::take(&mut *wire.lock().unwrap());
        assert_eq!(sent.len(), 1);
        let (from, to, packet) = &sent[0];
        assert_eq!((*from, *to), ("10.77.0.12".parse().unwrap(), *src));
        let rep = CmMad::parse(gsi_payload(packet).unwrap()).unwrap();
        assert_eq!(rep.header.transaction_id, req.header.transaction_id);
        let CmMessage::Rep(r) = rep.message else {
            panic!("{rep:?}")
        };
        assert_eq!(r.remote_comm_id, kreq.local_comm_id);
        // Our REP carries the PSN we receive at; we send from the kernel's REQ PSN.
        assert_eq!((r.local_qpn, r.starting_psn), (0x10011, attr.rq_psn));
        assert_eq!(rts.sq_psn, kreq.starting_psn);
        assert_eq!(r.target_ack_delay, rc::RXE_ACK_DELAY);
    }

    /// udaddy's SIDR_REQ from the lab capture gets a SIDR_REP with our QPN and Q_Key.
    #[test]
    fn a_kernel_rxe_sidr_request_is_answered() {
        use proto::cm::{CmMad, CmMessage};
        let (mut svc, wire, _channel, evs, _) =
            kernel_request_to_listener(cm_ps::UDP, qp_type::UD, "0.0.0.0:7174", "udaddy.pcap");
        let child = evs[0].child.clone().unwrap().id;
        ok(
            &mut svc,
            1,
            Request::CmAccept {
                id: child,
                conn: CmConnParam {
                    qp_num: 0x10012,
                    ..CmConnParam::default()
                },
            },
        );
        svc.drain();
        let sent = std::mem::take(&mut *wire.lock().unwrap());
        let rep = CmMad::parse(gsi_payload(&sent[0].2).unwrap()).unwrap();
        let CmMessage::SidrRep(r) = rep.message else {
            panic!("{rep:?}")
        };
        assert_eq!((r.status, r.qpn, r.qkey), (0, 0x10012, rc::RDMA_UDP_QKEY));
        assert_eq!(r.service_id, rc::service_id(PortSpace::Udp, 7174));
    }

    /// An accept whose private data a SIDR_REP cannot carry fails, and leaves the request
    /// to be answered (as the kernel's ib_send_cm_sidr_rep, which fails with EINVAL then).
    #[test]
    fn a_refused_sidr_accept_leaves_the_request_answerable() {
        use proto::cm::{CmMad, CmMessage};
        let (mut svc, wire, _channel, evs, _) =
            kernel_request_to_listener(cm_ps::UDP, qp_type::UD, "0.0.0.0:7174", "udaddy.pcap");
        let child = evs[0].child.clone().unwrap().id;
        let too_long = CmConnParam {
            qp_num: 0x10012,
            private_data: vec![0xab; proto::cm::msg::private_data_len::SIDR_REP + 1],
            ..CmConnParam::default()
        };
        let r = call(
            &mut svc,
            1,
            Request::CmAccept {
                id: child,
                conn: too_long,
            },
        );
        assert_eq!(errno_of(r), libc::EINVAL);
        svc.drain();
        assert!(wire.lock().unwrap().is_empty(), "nothing was sent");
        let fits = CmConnParam {
            qp_num: 0x10012,
            private_data: b"ok".to_vec(),
            ..CmConnParam::default()
        };
        ok(
            &mut svc,
            1,
            Request::CmAccept {
                id: child,
                conn: fits,
            },
        );
        svc.drain();
        let sent = std::mem::take(&mut *wire.lock().unwrap());
        let rep = CmMad::parse(gsi_payload(&sent[0].2).unwrap()).unwrap();
        let CmMessage::SidrRep(r) = rep.message else {
            panic!("{rep:?}")
        };
        assert_eq!((r.status, r.qpn), (sidr_status::SUCCESS, 0x10012));
        assert!(r.private_data.starts_with(b"ok"));
    }

    /// Random CM MADs (valid header, random attribute and body) from the wire never panic the
    /// service, whatever listeners and connections exist.
    #[test]
    fn garbage_mads_are_survived() {
        let (mut svc, wire) = service(&["127.0.0.1"], RoceVersion::V2);
        let (ch, _fd) = channel(&mut svc, 1);
        let l = id(&mut svc, 1, ch, cm_ps::TCP, qp_type::RC);
        ok(&mut svc, 1, bind_to(l, "0.0.0.0:7174"));
        ok(&mut svc, 1, Request::CmListen { id: l, backlog: 1 });
        let u = id(&mut svc, 1, ch, cm_ps::UDP, qp_type::UD);
        ok(&mut svc, 1, bind_to(u, "0.0.0.0:7174"));
        ok(&mut svc, 1, Request::CmListen { id: u, backlog: 1 });
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let peer: IpAddr = "127.0.0.9".parse().unwrap();
        for i in 0..20_000u32 {
            let mut mad = [0u8; proto::wire::mad::MAD_LEN];
            for b in mad.iter_mut() {
                *b = next() as u8;
            }
            mad[..4].copy_from_slice(&[1, 7, 2, 3]);
            mad[16..18].copy_from_slice(&(0x10 + (i % 10) as u16).to_be_bytes());
            if i % 3 == 0 {
                // Often name the listeners' service IDs, so requests reach them.
                let sid = rc::service_id(PortSpace::Tcp, 7174).to_be_bytes();
                mad[24 + 8..24 + 16].copy_from_slice(&sid);
                // ...in REQs with an IPv4 rdma_cm header in their private data.
                mad[16..18].copy_from_slice(&0x10u16.to_be_bytes());
                mad[24 + 140] = 0;
                mad[24 + 141] = 0x40;
            }
            let now = svc.now();
            let _ = svc.devices[0].endpoint.handle_mad(now, peer, &mad);
            svc.drain();
            wire.lock().unwrap().clear();
        }
        // Unanswered requests are bounded by the listeners' backlog.
        assert!(
            svc.ids.len() > MAX_BACKLOG,
            "the flood reached the listener"
        );
        assert!(
            svc.ids.len() <= 2 * MAX_BACKLOG + 2,
            "{} ids",
            svc.ids.len()
        );
    }

    /// A device of two addresses: each side's QP talks from the address of the connection
    /// (rxe checks an RC packet's source against the QP's path), not the device's first one.
    #[test]
    fn a_device_of_several_addresses_keeps_each_connection_on_its_own() {
        let (mut svc, wire) = service(&["127.0.0.1", "127.0.0.2"], RoceVersion::V2);
        let (ch, fd) = channel(&mut svc, 1);
        let l = id(&mut svc, 1, ch, cm_ps::TCP, qp_type::RC);
        ok(&mut svc, 1, bind_to(l, "0.0.0.0:7300"));
        ok(&mut svc, 1, Request::CmListen { id: l, backlog: 1 });
        let (cch, cfd) = channel(&mut svc, 2);
        let a = id(&mut svc, 2, cch, cm_ps::TCP, qp_type::RC);
        // The active side binds .1 and connects to .2.
        ok(&mut svc, 2, bind_to(a, "127.0.0.1:0"));
        ok(&mut svc, 2, resolve_addr_to(a, sa("127.0.0.2:7300")));
        ok(&mut svc, 2, resolve_route(a));
        ok(
            &mut svc,
            2,
            Request::CmConnect {
                id: a,
                conn: CmConnParam {
                    qp_num: 0x10011,
                    ..CmConnParam::default()
                },
                psn: None,
            },
        );
        settle(&mut svc, &wire);
        let evs = events(&fd);
        let child = evs[0].child.clone().unwrap();
        let (g1, g2) = (
            ctl::gid_of("127.0.0.1".parse().unwrap()),
            ctl::gid_of("127.0.0.2".parse().unwrap()),
        );
        assert_eq!((child.src_gid, child.dst_gid), (g2, g1), "{child:?}");
        let Response::CmQpAttr { attr, .. } = ok(
            &mut svc,
            1,
            Request::CmInitQpAttr {
                id: child.id,
                qp_state: 2,
            },
        ) else {
            panic!()
        };
        assert_eq!(attr.ah_attr.dgid, g1);
        assert_eq!(
            u32::from(attr.ah_attr.sgid_index),
            svc.devices[0].gid_index("127.0.0.2".parse().unwrap())
        );
        ok(
            &mut svc,
            1,
            Request::CmAccept {
                id: child.id,
                conn: CmConnParam {
                    qp_num: 0x20011,
                    ..CmConnParam::default()
                },
            },
        );
        settle(&mut svc, &wire);
        assert_eq!(kinds(&events(&cfd)[2..]), vec![Ev::ConnectResponse as u32]);
        let Response::CmQpAttr { attr, .. } =
            ok(&mut svc, 2, Request::CmInitQpAttr { id: a, qp_state: 2 })
        else {
            panic!()
        };
        assert_eq!(attr.ah_attr.dgid, g2);
        assert_eq!(
            u32::from(attr.ah_attr.sgid_index),
            svc.devices[0].gid_index("127.0.0.1".parse().unwrap())
        );
        assert_ne!(
            svc.devices[0].gid_index("127.0.0.1".parse().unwrap()),
            svc.devices[0].gid_index("127.0.0.2".parse().unwrap())
        );
    }

    #[test]
    fn listener_address_rules() {
        let any4: IpAddr = Ipv4Addr::UNSPECIFIED.into();
        let any6: IpAddr = Ipv6Addr::UNSPECIFIED.into();
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let lo6: IpAddr = "::1".parse().unwrap();
        assert!(listener_takes(any4, false, lo));
        assert!(!listener_takes(any4, false, lo6));
        assert!(listener_takes(any6, false, lo));
        assert!(!listener_takes(any6, true, lo));
        assert!(listener_takes(lo, false, lo));
        assert!(!listener_takes(lo, false, "127.0.0.2".parse().unwrap()));
        assert!(overlaps(any4, lo) && overlaps(lo, lo) && !overlaps(lo, lo6));
        assert!(overlaps(any6, lo) && !overlaps(any4, lo6));
    }
}
