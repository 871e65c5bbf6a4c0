//! The rdma_cm ids and event channels of the clients: what an id holds, creating channels,
//! listing and destroying ids (one by one, or all of a client that is gone), and the events
//! sent to a channel's socket (queued in order while it is full).

use super::addressing::ps_of;
use super::requests::{error, Reply};
use super::CmService;
use nix::sys::socket::{self, AddressFamily, MsgFlags, SockFlag, SockType};
use proto::cm::msg::ReqRepr;
use proto::cm::rdma_cm::{self as rc, Negotiated, RdmaCmEventType as Ev};
use proto::cm::{ConnId, ConnectParams};
use proto::ctl::{self, cm_ps, qp_type, CmEventMsg, CmIdInfo, CmPathInfo, Response, RoceVersion};
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use tracing::{debug, info};

/// What an id is for (what `res show cm_id` shows as its state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    Idle,
    Listen,
    /// Our REQ is out (or answered).
    Active,
    /// A REQ we received, handed to the program as a CONNECT_REQUEST child.
    Passive,
    SidrActive,
    SidrPassive,
}

/// An rdma_cm id.
pub(super) struct Id {
    pub(super) client: u64,
    pub(super) channel: u32,
    pub(super) ps: u16,
    pub(super) qp_type: u32,
    pub(super) device: Option<usize>,
    pub(super) src: Option<SocketAddr>,
    pub(super) dst: Option<SocketAddr>,
    /// The peer's address on the wire (a loopback destination that is not one of our device
    /// addresses is the device itself).
    pub(super) peer_ip: Option<IpAddr>,
    pub(super) port: Option<u16>,
    pub(super) path: Option<CmPathInfo>,
    pub(super) role: Role,
    pub(super) conn: Option<ConnId>,
    pub(super) local_psn: u32,
    pub(super) negotiated: Option<Negotiated>,
    pub(super) connect: Option<ConnectParams>,
    pub(super) req: Option<Box<ReqRepr>>,
    pub(super) qkey: u32,
    pub(super) tos: Option<u8>,
    pub(super) reuse: bool,
    pub(super) afonly: bool,
    pub(super) ack_timeout: Option<u8>,
    pub(super) min_rnr_timer: Option<u8>,
    /// A CONNECT_REQUEST child not yet accepted or rejected: the listener it came from.
    pub(super) pending_on: Option<u32>,
    /// The passive side's own address on the wire: the REQ path's remote GID.
    pub(super) wire_local: Option<IpAddr>,
    /// The GID type of the connection: the REQ's version on the passive side; `None`, the
    /// device's `default_roce_mode` (an active id).
    pub(super) gid_type: Option<RoceVersion>,
}

impl Id {
    pub(super) fn new(client: u64, channel: u32, ps: u16, qp_type: u32) -> Id {
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

    pub(super) fn is_ud(&self) -> bool {
        self.ps == cm_ps::UDP || self.qp_type == qp_type::UD
    }

    pub(super) fn with_overrides(&self, mut n: Negotiated) -> Negotiated {
        n.ack_timeout_override = self.ack_timeout;
        n.min_rnr_timer = self.min_rnr_timer;
        n
    }
}

/// An event channel: the CM thread's end of its socketpair.
pub(super) struct Channel {
    pub(super) client: u64,
    fd: OwnedFd,
    /// Events that found the socket full, in order.
    pub(super) backlog: VecDeque<Vec<u8>>,
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

impl CmService {
    // ---- events ----

    /// Sends id `handle`'s event (with the id's info, unless it carries some) to the id's
    /// channel.
    pub(super) fn emit(&mut self, handle: u32, mut msg: CmEventMsg) {
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

    /// Retries every channel's waiting events.
    pub(super) fn flush_channels(&mut self) {
        for c in self.channels.values_mut() {
            c.flush();
        }
    }

    /// An event of kind `event` and status `status`, the rest to fill in.
    pub(super) fn event(event: Ev, status: i32) -> CmEventMsg {
        CmEventMsg {
            event: event as u32,
            status,
            ..CmEventMsg::default()
        }
    }

    // ---- channels and ids ----

    pub(super) fn owns_channel(&self, client: u64, channel: u32) -> bool {
        self.channels
            .get(&channel)
            .is_some_and(|c| c.client == client)
    }

    pub(super) fn create_channel(&mut self, client: u64) -> Reply {
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

    /// Every id as `rdma resource show cm_id` shows it.
    pub(super) fn list_ids(&self) -> Vec<(u64, ctl::CmIdRes)> {
        self.ids
            .iter()
            .map(|(&id, x)| {
                let state = match x.role {
                    Role::Listen => "LISTEN",
                    Role::Active | Role::Passive | Role::SidrActive | Role::SidrPassive => {
                        "CONNECT"
                    }
                    Role::Idle if self.resolving_address(id) => "ADDR_QUERY",
                    Role::Idle if x.path.is_some() => "ROUTE_RESOLVED",
                    Role::Idle if x.dst.is_some() => "ADDR_RESOLVED",
                    Role::Idle if x.src.is_some() => "ADDR_BOUND",
                    Role::Idle => "IDLE",
                };
                let ps = match x.ps {
                    cm_ps::TCP => "TCP",
                    cm_ps::UDP => "UDP",
                    cm_ps::IB => "IB",
                    cm_ps::IPOIB => "IPOIB",
                    _ => "?",
                };
                let qp_type = match x.qp_type {
                    qp_type::RC => "RC",
                    qp_type::UC => "UC",
                    qp_type::UD => "UD",
                    _ => "?",
                };
                let owner = ctl::ResOwner {
                    device: x
                        .device
                        .and_then(|d| self.devices.get(d))
                        .map(|d| d.setup.info.name.clone())
                        .unwrap_or_default(),
                    pid: 0,
                    comm: String::new(),
                };
                let row = ctl::CmIdRes {
                    owner,
                    id,
                    ps: ps.into(),
                    qp_type: qp_type.into(),
                    state: state.into(),
                    qpn: x.connect.as_ref().map_or(0, |c| c.local_qpn),
                    src_addr: x.src,
                    dst_addr: x.dst,
                };
                (x.client, row)
            })
            .collect()
    }

    /// A client disconnected: its ids are destroyed (their peers told, [`Self::destroy_id`])
    /// and its channels closed.
    pub(super) fn client_gone(&mut self, client: u64) {
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

    /// Forgets an id: its connection (the endpoint tells the peer as ib_cm does) and its
    /// share of the listens on its service ID.
    pub(super) fn destroy_id(&mut self, now: u64, h: u32) {
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

    /// The device and comm ID of an id's connection.
    pub(super) fn conn_of(&self, h: u32) -> Option<(usize, ConnId)> {
        let x = self.ids.get(&h)?;
        Some((x.device?, x.conn?))
    }

    /// What the shim is told of an id.
    pub(super) fn info(&self, h: u32) -> CmIdInfo {
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
