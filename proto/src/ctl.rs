//! The control protocol between a client process (the shim, or `softroce res show`) and the
//! daemon: one request and one response per message on a Unix `SOCK_SEQPACKET` socket, encoded
//! with postcard. File descriptors (ring memfds, doorbells, event pipes) travel beside a
//! message as `SCM_RIGHTS`; the message says how many to expect.
//!
//! The data path never uses this socket: work requests and completions go through the
//! shared-memory rings of [`crate::ring`].
//!
//! rdma_cm: the daemon runs the connection manager (CM MADs on QP1 over UDP 4791, with
//! [`crate::cm`]); the shim's librdmacm speaks the `Cm*` requests. Ids and channels are
//! handles of the client connection that created them: when it closes, the daemon destroys
//! them (DREQ or REJ to connected peers, as the kernel does for a dying process). Events do
//! not come back on this socket but on the channel's own socketpair, one [`CmEventMsg`]
//! datagram each, so the shim's `channel->fd` polls and blocks like the kernel's.

use crate::transport::{
    self, Access, AddressVector, AttrMask, Mtu, QpState, VerbsError, VerbsResult,
};
use crate::{Psn, Qkey, Qpn};
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, SocketAddr};

/// Bumped on any incompatible change; a client and daemon that disagree refuse each other
/// with a clear message instead of misreading.
pub const PROTOCOL_VERSION: u32 = 5;
/// What a client and a daemon that speak different protocols say: they come from different
/// softroce builds, and the fix is one build for both (the daemon started before an upgrade
/// is the usual case).
pub fn version_mismatch(client: u32, daemon: u32) -> String {
    format!(
        "the client speaks control protocol {client} and the daemon {daemon}: they are different \
         softroce builds; restart the daemon with the softroce that goes with the programs' \
         shim (`softroce daemon`, or `systemctl restart softroce`)"
    )
}

/// The largest control message either side sends or accepts.
pub const MAX_MESSAGE: usize = 64 * 1024;

/// Which RoCE encapsulation a device (or GID) speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RoceVersion {
    /// Ethertype 0x8915 with a GRH, one L2 domain (IBTA Annex A16).
    #[serde(alias = "v1")]
    V1,
    /// UDP port 4791 over IPv4 or IPv6 (IBTA Annex A17).
    #[serde(alias = "v2")]
    V2,
}

impl RoceVersion {
    /// `enum ibv_gid_type` (IBV_GID_TYPE_ROCE_V1 = 1, ROCE_V2 = 2).
    pub fn ibv_gid_type(self) -> u32 {
        match self {
            RoceVersion::V1 => 1,
            RoceVersion::V2 => 2,
        }
    }
}

impl core::fmt::Display for RoceVersion {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            RoceVersion::V1 => "v1",
            RoceVersion::V2 => "v2",
        })
    }
}

impl core::str::FromStr for RoceVersion {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "v1" | "1" | "ib/roce v1" => Ok(RoceVersion::V1),
            "v2" | "2" | "roce v2" => Ok(RoceVersion::V2),
            other => Err(format!(
                "unknown RoCE version {other:?} (expected v1 or v2)"
            )),
        }
    }
}

/// One GID table entry (`struct ibv_gid_entry`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GidEntry {
    pub index: u32,
    pub gid: [u8; 16],
    pub roce: RoceVersion,
}

/// What a client needs to present a device: enough for `ibv_devinfo -v`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub name: String,
    pub node_guid: u64,
    pub roce: RoceVersion,
    /// IB MTU enum values (1 = 256 .. 5 = 4096).
    pub max_mtu: u8,
    pub active_mtu: u8,
    pub port_active: bool,
    pub gids: Vec<GidEntry>,
    /// The network interfaces the device's addresses live on ("lo", ...).
    pub netdevs: Vec<String>,
    /// The deepest CQ the device creates (`ibv_device_attr.max_cqe`), configured per device.
    pub max_cqe: u32,
    /// The device's configured caps, which `ibv_query_device` reports.
    pub limits: DeviceLimits,
    /// The port's speed in Mb/s (ethtool's unit), which the shim reports as the port's
    /// active width and speed by kernel's `ib_get_eth_speed` rule.
    pub speed_mbps: u32,
}

/// What a device holds at most over all its clients (its configuration's `max_qp`, `max_mr`,
/// `max_cq`, `max_srq`), as `ibv_query_device` reports them. The defaults are kernel rxe's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceLimits {
    pub max_qp: u32,
    pub max_cq: u32,
    pub max_mr: u32,
    pub max_srq: u32,
}

impl Default for DeviceLimits {
    /// Kernel rxe's (rxe_param.h) as `ibv_devinfo -v` shows them on kernel 6.1: max_qp
    /// 1048560, max_cq 1048576, max_mr 524287, max_srq 917503.
    fn default() -> DeviceLimits {
        DeviceLimits {
            max_qp: 1_048_560,
            max_cq: 1_048_576,
            max_mr: 524_287,
            max_srq: 917_503,
        }
    }
}

/// `struct ibv_qp_cap`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_ah_attr` with its `ibv_global_route`. RoCE always has a GRH.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AhAttr {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub is_global: bool,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`, field for field (the alternate path is not supported on RoCE).
/// Values are carried as the application gave them; the daemon validates every one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpAttr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    /// `enum ibv_mtu` (1 = 256 .. 5 = 4096).
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub cap: QpCap,
    pub ah_attr: AhAttr,
    pub pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
}

/// `enum ibv_qp_type` values the device supports.
pub mod qp_type {
    pub const RC: u32 = 2;
    pub const UC: u32 = 3;
    pub const UD: u32 = 4;
}

/// Where a queue's ring lies in the memfd that comes with the response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingPlace {
    pub offset: u64,
    pub slot_size: u32,
    pub slot_count: u32,
}

/// A client's request. Handles (`pd`, `cq`, ...) are the ones the daemon returned; the daemon
/// checks that each names a live object of the same client. Requests marked "+ fd" carry one
/// file descriptor beside the message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// First message of every connection. The response carries the client's doorbell eventfd:
    /// the shim writes to it after posting if the daemon said it sleeps.
    Hello {
        version: u32,
        program: String,
    },
    QueryDevices,
    /// Resources of every client, for `softroce res show`.
    ResShow,
    /// `ibv_open_device` + fd: the write end of the context's async event socket, on which the
    /// daemon writes 16-byte `{u64 element, u32 type, u32 reserved}` records.
    OpenContext {
        device: String,
    },
    CloseContext {
        ctx: u32,
    },
    AllocPd {
        ctx: u32,
    },
    DeallocPd {
        pd: u32,
    },
    /// `ibv_reg_mr`: the range must be mapped in the client (else EFAULT).
    RegMr {
        pd: u32,
        addr: u64,
        length: u64,
        iova: u64,
        access: u32,
    },
    DeregMr {
        mr: u32,
    },
    /// `ibv_rereg_mr`: what is given changes (`IBV_REREG_MR_CHANGE_PD`, `_TRANSLATION`: a
    /// range `(addr, length)` that must be mapped, else EFAULT; `_ACCESS`), nothing given is
    /// EINVAL. The keys stay.
    ReregMr {
        mr: u32,
        pd: Option<u32>,
        range: Option<(u64, u64)>,
        access: Option<u32>,
    },
    /// `ibv_create_comp_channel` + fd: the write end of the channel's pipe, on which the
    /// daemon writes one 8-byte `{u32 cq, u32 generation}` record per event.
    CreateCompChannel {
        ctx: u32,
    },
    DestroyCompChannel {
        channel: u32,
    },
    /// Response `Cq` + fd (the memfd holding the completion ring).
    CreateCq {
        ctx: u32,
        cqe: u32,
        channel: Option<u32>,
        comp_vector: u32,
    },
    DestroyCq {
        cq: u32,
    },
    /// Response `Qp` + fd (the memfd holding the send and receive rings).
    CreateQp {
        pd: u32,
        qp_type: u32,
        send_cq: u32,
        recv_cq: u32,
        srq: Option<u32>,
        cap: QpCap,
        sq_sig_all: bool,
    },
    ModifyQp {
        qpn: u32,
        attr: QpAttr,
        mask: u32,
    },
    QueryQp {
        qpn: u32,
        mask: u32,
    },
    DestroyQp {
        qpn: u32,
    },
    /// Response `Srq` + fd (the memfd holding the SRQ's receive ring).
    CreateSrq {
        pd: u32,
        max_wr: u32,
        max_sge: u32,
        srq_limit: u32,
    },
    /// `ibv_modify_srq`. With `IBV_SRQ_MAX_WR` (mask 1) the SRQ gets a new ring of the new
    /// size: the response is [`Response::Srq`] + fd, and the client posts to the new ring from
    /// then on (the daemon took every WQE of the old one first, so the client must not post
    /// while the request is out). Otherwise [`Response::Done`].
    ModifySrq {
        srq: u32,
        max_wr: u32,
        srq_limit: u32,
        mask: u32,
    },
    QuerySrq {
        srq: u32,
    },
    DestroySrq {
        srq: u32,
    },
    CreateAh {
        pd: u32,
        attr: AhAttr,
    },
    DestroyAh {
        ah: u32,
    },
    /// `ibv_alloc_mw`: type 1 or 2.
    AllocMw {
        pd: u32,
        mw_type: u32,
    },
    DeallocMw {
        mw: u32,
    },
    AttachMcast {
        qpn: u32,
        gid: [u8; 16],
    },
    DetachMcast {
        qpn: u32,
        gid: [u8; 16],
    },

    // ---- rdma_cm (see the "rdma_cm" section below and `docs/architecture.md`) ----
    /// `rdma_create_event_channel`. Response [`Response::CmChannel`] + fd: the client's end of
    /// a `SOCK_SEQPACKET` socketpair on which every event of the ids on this channel arrives
    /// as one postcard-encoded [`CmEventMsg`] datagram.
    CmCreateChannel,
    /// `rdma_destroy_event_channel` (after the client closed its fd). Fails with EBUSY while
    /// ids still use the channel.
    CmDestroyChannel {
        channel: u32,
    },
    /// `rdma_create_id`. `ps` is `enum rdma_port_space` (RDMA_PS_TCP 0x0106, RDMA_PS_UDP
    /// 0x0111, RDMA_PS_IB 0x013F; [`cm_ps`]); `qp_type` is `enum ibv_qp_type` ([`qp_type`]).
    /// Response [`Response::CmId`].
    CmCreateId {
        channel: u32,
        ps: u16,
        qp_type: u32,
    },
    /// `rdma_destroy_id`: as the kernel does, a connected id sends DREQ (or REJ before it was
    /// established) and the connection waits out timewait in the daemon. No event follows.
    CmDestroyId {
        id: u32,
    },
    /// `rdma_bind_addr`. Port 0 = the daemon picks an ephemeral port of the id's port space;
    /// a wildcard address (0.0.0.0, ::) binds no device until listen / connect. Response
    /// [`Response::CmIdInfo`]. EADDRINUSE if the port of that port space is taken,
    /// EADDRNOTAVAIL if no device owns the address.
    CmBind {
        id: u32,
        addr: SocketAddr,
    },
    /// `rdma_resolve_addr`: picks the device (an exact device address first; 127.0.0.0/8 and
    /// ::1 to a device of that family; else the first device of the family), the source
    /// address (`src`, or the device's address of the destination's family) and binds an
    /// ephemeral port if the id has none. Response [`Response::Done`]; then on the channel
    /// `RDMA_CM_EVENT_ADDR_RESOLVED` (status 0) or `ADDR_ERROR` (status -errno), each carrying
    /// the id's new [`CmIdInfo`].
    CmResolveAddr {
        id: u32,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout_ms: u32,
    },
    /// `rdma_resolve_route` (RoCE builds the path locally, facts §7.2). Response `Done`; then
    /// `ROUTE_RESOLVED` carrying the id's [`CmIdInfo`] with its path, or `ROUTE_ERROR`.
    CmResolveRoute {
        id: u32,
        timeout_ms: u32,
    },
    /// `rdma_listen`. A REQ (or SIDR_REQ for RDMA_PS_UDP) for the id's port, whose rdma_cm
    /// header names the bound address (or any address if the bind was a wildcard), raises
    /// `CONNECT_REQUEST` on the listener's channel with a new id in [`CmEventMsg::child`].
    /// An unbound id is first bound to 0.0.0.0 with an ephemeral port, as the kernel does.
    /// Listeners are matched on port space, port and address (an exact address before a
    /// wildcard; an IPv6 wildcard takes IPv4 requests unless AFONLY); a REQ whose service ID
    /// nobody listens on is answered with REJ 8 by the daemon's ib_cm, one whose service ID
    /// is listened on but whose address no listener takes with REJ 28.
    CmListen {
        id: u32,
        backlog: i32,
    },
    /// `rdma_connect`. RC/UC ids send a REQ (QPN `conn.qp_num`, starting PSN `psn` or a
    /// random one the daemon picks; the daemon adds the 36-byte rdma_cm header in front of
    /// `conn.private_data`). Events that follow on the id:
    /// - `CONNECT_RESPONSE` when the REP arrives (carrying the peer's [`CmConnParam`]). As
    ///   librdmacm does in `ucma_process_conn_resp`, a shim whose id has a QP then moves it to
    ///   RTR and RTS ([`Request::CmInitQpAttr`]), sends [`Request::CmEstablish`] (the daemon
    ///   sends the RTU) and reports `ESTABLISHED` to the program itself; without a QP it
    ///   reports `CONNECT_RESPONSE` and the program calls `rdma_establish`.
    /// - `REJECTED` (status = REJ reason: 8 "invalid service ID" when nobody listens, 28
    ///   "consumer defined" from `rdma_reject`, private data the peer's),
    /// - `UNREACHABLE` (status -110 after ib_cm's REQ retries).
    ///
    /// UD ids (RDMA_PS_UDP) send a SIDR_REQ; the answer is `ESTABLISHED` carrying
    /// [`CmEventMsg::ud`] (the remote QPN, Q_Key and AH) or `UNREACHABLE` (status -110 on
    /// timeout, or the SIDR_REP status: 1 no such service, 2 rejected).
    CmConnect {
        id: u32,
        conn: CmConnParam,
        psn: Option<u32>,
    },
    /// `rdma_accept` of a `CONNECT_REQUEST` child id (after the shim moved its QP to RTR and
    /// RTS, as librdmacm does): sends REP (RC/UC; `ESTABLISHED` follows when the RTU
    /// arrives) or SIDR_REP (UD: QPN `conn.qp_num`, Q_Key `conn.qkey` or RDMA_UDP_QKEY when
    /// 0; no event follows). The REP's starting PSN is the one `CmInitQpAttr` gave as sq_psn.
    CmAccept {
        id: u32,
        conn: CmConnParam,
    },
    /// `rdma_reject`: REJ with reason 28 "consumer defined" (or SIDR_REP status "rejected"
    /// for UD) carrying `private_data`.
    CmReject {
        id: u32,
        private_data: Vec<u8>,
    },
    /// The active side after `CONNECT_RESPONSE` (`rdma_establish`, or the shim itself when
    /// the id has a QP): sends the RTU; no event follows (the shim reports `ESTABLISHED`).
    /// On the passive side (`rdma_notify(IBV_EVENT_COMM_EST)`: data arrived before the RTU):
    /// the connection becomes established and `ESTABLISHED` follows.
    CmEstablish {
        id: u32,
    },
    /// `rdma_disconnect`: DREQ (or DREP if the peer's DREQ came first). `DISCONNECTED`
    /// follows on this id when the DREP arrives or the DREQ times out (a DREQ from the peer
    /// raises `DISCONNECTED` by itself, before any `CmDisconnect`). EINVAL if not connected.
    /// After timewait (2^(ACK timeout − 8) ms) `TIMEWAIT_EXIT` follows, as with the kernel.
    CmDisconnect {
        id: u32,
        private_data: Vec<u8>,
    },
    /// `rdma_init_qp_attr`: the attributes and `ibv_qp_attr_mask` for moving the id's QP to
    /// `qp_state` (INIT: port, pkey index, access flags [and Q_Key for UD]; RTR: path MTU,
    /// dest QPN, rq_psn, AH with the peer's GID, max_dest_rd_atomic, min_rnr_timer; RTS:
    /// sq_psn, timeout, retry_cnt, rnr_retry, max_rd_atomic). Response [`Response::CmQpAttr`].
    CmInitQpAttr {
        id: u32,
        qp_state: u32,
    },
    /// `rdma_set_option(id, level, optname, optval)`; `value` is the option's bytes in host
    /// order (e.g. a u8 TOS, an int REUSEADDR/AFONLY, a u8 ACK timeout or min RNR timer).
    /// Levels and names: [`cm_option`]. ENOSYS for unsupported options.
    CmSetOption {
        id: u32,
        level: i32,
        name: i32,
        value: Vec<u8>,
    },
    /// `rdma_join_multicast`: `MULTICAST_JOIN` (with [`CmEventMsg::ud`]: the group's GID as
    /// the AH's dgid, QPN 0xFFFFFF and the Q_Key) or `MULTICAST_ERROR` follows. The shim
    /// attaches its QP to the group itself.
    CmJoinMcast {
        id: u32,
        addr: SocketAddr,
        join_state: u8,
    },
    CmLeaveMcast {
        id: u32,
        addr: SocketAddr,
    },
    /// `rdma_migrate_id`: events of the id go to `channel` from now on.
    CmMigrateId {
        id: u32,
        channel: u32,
    },
    /// Addresses, device, port, GIDs and path of an id. Response [`Response::CmIdInfo`].
    CmQueryId {
        id: u32,
    },

    /// `ibv_resize_cq`: response [`Response::Cq`] + fd, a new ring of the granted depth. The
    /// daemon writes completions to the new ring only, from the moment it answers; those
    /// still in the old ring are the client's to take first (it must not poll while the
    /// request is out). EINVAL when more completions wait than the new depth.
    ResizeCq {
        cq: u32,
        cqe: u32,
    },
    /// Every device's counters (`softroce` tools, tests). Response [`Response::Counters`].
    Counters,

    // ---- the operator's commands (`softroce link|stat|res|capture|fault`) ----
    /// `softroce link add`: a new device, at once usable by clients (`ibv_devices` lists
    /// it). With `save`, also written into the daemon's TOML config. Response `Done`.
    LinkAdd {
        spec: LinkSpec,
        save: bool,
    },
    /// `softroce link del`: the device stops; every context open on it gets
    /// `IBV_EVENT_DEVICE_FATAL`, the other devices carry on. Response `Done`.
    LinkDel {
        name: String,
        save: bool,
    },
    /// `softroce link set NAME down|up`: the port goes down (as a pulled cable: every
    /// context gets `IBV_EVENT_PORT_ERR`, `ibv_query_port` says `PORT_DOWN`, nothing is sent
    /// or received, `link_downed` counts it) or comes back (`IBV_EVENT_PORT_ACTIVE`). A
    /// device following a netdev is also down while the netdev is. Response `Done`.
    LinkSet {
        name: String,
        up: bool,
    },
    /// `softroce link show`. Response [`Response::Links`].
    LinkShow,
    /// `softroce stat [NAME] [qp QPN]`. Response [`Response::Stats`].
    Stat {
        device: Option<String>,
        qpn: Option<u32>,
    },
    /// `softroce res show KIND`. Response [`Response::ResDetail`].
    ResDetail {
        kind: ResKind,
    },
    /// `softroce capture` + 2 fds: where the daemon writes a pcapng stream (the command's
    /// file, its stdout, or a pipe it reads: section header, one interface per device, then
    /// one Enhanced Packet Block per RoCE packet) until `spec.count` packets were written, the
    /// device is deleted, the reader goes away or this control connection closes (then one
    /// Interface Statistics Block per interface ends it); and the write end of a pipe on
    /// which the daemon then writes `"PACKETS DROPPED\n"` and which it closes, so the command
    /// knows the stream is whole. Response [`Response::CaptureStarted`].
    CaptureStart {
        spec: CaptureSpec,
    },
    /// `softroce fault NAME KIND ...`: adds a rule to the device's fault injector.
    /// Response `Done`.
    FaultAdd {
        device: String,
        rule: FaultRule,
    },
    /// `softroce fault NAME clear`: removes every rule of the device. Response `Done`.
    FaultClear {
        device: String,
    },
    /// The rules in force and what they did. Response [`Response::Faults`].
    FaultShow {
        device: Option<String>,
    },

    // ---- the same-host fast path (see the "fast path" section below) ----
    /// Takes the transport of the requester of `qpn` (and of the responder of the peer QP it
    /// is connected to) into this process, after the daemon offered it
    /// ([`crate::ring::SharedRing::fast_offered`] on the QP's send ring). Sent while the send
    /// queue is empty. Response [`Response::FastGrant`] + 4 fds (the direction's memfd, the
    /// peer QP's ring memfd, the peer client's and the taker's MR table memfds), or an error
    /// (EAGAIN: not now, post through the ring).
    FastTake {
        qpn: u32,
    },
    /// Gives back what [`Request::FastTake`] granted, after the direction's state was
    /// published in its control block ([`crate::ring::fast::Direction::publish`]). `events`:
    /// async events the engines raised meanwhile.
    FastReturn {
        qpn: u32,
        events: Vec<FastEvent>,
    },
    /// The fast rings that feed completion queue `cq` of this client (other processes'
    /// directions deliver its receive completions there), after the CQ ring's source count
    /// changed ([`crate::ring::SharedRing::fast_sources`]). Response
    /// [`Response::FastSources`] + one fd per ring: the rings not in `known` (direction
    /// ids), at most [`FAST_SOURCES_PER_MESSAGE`] of them (the shim asks again while `more`).
    FastSources {
        cq: u32,
        known: Vec<u64>,
    },
    /// The client armed CQ `cq` (`ibv_req_notify_cq`, a CQ with a completion channel) after
    /// fast-path directions had fed it: until the event fires only the daemon, which raises
    /// it, may add completions. Answered ([`Response::CqEvents`]) once the directions that
    /// fed it are back.
    CqEventsWanted {
        cq: u32,
    },
    /// Congestion control of every device (algorithm, parameters, mlx5's counters, the rate
    /// of every QP), for `softroce res show`. Response [`Response::Congestion`].
    CongestionShow,
}

/// One device's counters by name: its link's (`link_*`), the device's own drops (`device_*`),
/// and its engines' summed over every client it served (rxe's `hw_counters` names, the
/// engine's and its drop reasons, `drop_*` and `nak_*`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceCounters {
    pub device: String,
    pub counters: Vec<(String, u64)>,
}

impl DeviceCounters {
    /// The value of counter `name` (0 if the device does not keep it).
    pub fn get(&self, name: &str) -> u64 {
        self.counters
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, v)| *v)
    }
}

/// The most rings one [`Response::FastSources`] carries (each comes with a descriptor).
pub const FAST_SOURCES_PER_MESSAGE: usize = 8;

/// Resources one client holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientResources {
    pub client: u64,
    pub pid: u32,
    pub uid: u32,
    pub program: String,
    pub pds: u32,
    pub mrs: u32,
    pub cqs: u32,
    pub qps: u32,
    pub srqs: u32,
    pub ahs: u32,
    pub mws: u32,
}

/// The daemon's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    Hello {
        version: u32,
        client: u64,
    },
    Devices(Vec<DeviceInfo>),
    Resources {
        devices: Vec<String>,
        clients: Vec<ClientResources>,
    },
    /// The request succeeded and has nothing to return.
    Done,
    /// Two fds beside it: the device thread's wake-up eventfd, then the client's doorbell
    /// table ([`crate::ring::doorbell`], `doorbells_len` bytes to map).
    Context {
        ctx: u32,
        doorbells_len: u64,
    },
    Pd {
        pd: u32,
    },
    Mr {
        mr: u32,
        lkey: u32,
        rkey: u32,
    },
    CompChannel {
        channel: u32,
    },
    /// + fd. `cqe` is the depth granted (at least the one asked for).
    Cq {
        cq: u32,
        cqe: u32,
        ring: RingPlace,
        region_len: u64,
    },
    /// + fd. `cap` is what was granted.
    Qp {
        qpn: u32,
        cap: QpCap,
        sq: RingPlace,
        rq: Option<RingPlace>,
        region_len: u64,
        /// The QP's doorbell in the context's doorbell table ([`crate::ring::doorbell`]),
        /// rung after posting to either of its queues.
        doorbell: u32,
        /// Which memory the fd is: 0 for a region of the QP's own, else one of the client's
        /// ring chunks on this device (the same number, the same memory: a client maps each
        /// once and keeps it while any QP lives in it). `region_len` is what to map, `sq`/`rq`
        /// offsets are inside it.
        region: u32,
    },
    QpAttr {
        attr: QpAttr,
        cap: QpCap,
        sq_sig_all: bool,
    },
    /// + fd.
    Srq {
        srq: u32,
        max_wr: u32,
        max_sge: u32,
        ring: RingPlace,
        region_len: u64,
        /// The SRQ's doorbell, as a QP's.
        doorbell: u32,
    },
    SrqAttr {
        max_wr: u32,
        max_sge: u32,
        srq_limit: u32,
    },
    Ah {
        ah: u32,
    },
    Mw {
        mw: u32,
        rkey: u32,
    },
    /// A failed request, with the errno the verb should return and a message for the log.
    Error {
        errno: i32,
        message: String,
    },
    /// + fd (the client's end of the event socketpair).
    CmChannel {
        channel: u32,
    },
    CmId {
        id: u32,
    },
    CmIdInfo(CmIdInfo),
    /// What `rdma_init_qp_attr` returns: the attributes and the `ibv_qp_attr_mask` to pass to
    /// `ibv_modify_qp`.
    CmQpAttr {
        attr: QpAttr,
        mask: u32,
    },
    Counters(Vec<DeviceCounters>),
    Links(Vec<LinkInfo>),
    Stats(Vec<DeviceStats>),
    ResDetail(ResDetail),
    /// The capture runs; `interfaces` are the devices captured, in the order of the
    /// stream's interface descriptions.
    CaptureStarted {
        interfaces: Vec<String>,
    },
    Faults(Vec<DeviceFaults>),
    /// + 4 fds: see [`Request::FastTake`].
    FastGrant(Box<FastGrant>),
    /// With one fd per ring (the memfd of the direction that produces into it). With
    /// `more`, there are others: ask again.
    FastSources {
        rings: Vec<FastRing>,
        more: bool,
    },
    Congestion(Vec<DeviceCongestion>),
    /// To [`Request::CqEventsWanted`]. `events_only`: no direction will feed this CQ again
    /// (its client waits on events rather than polls), so later arms need not ask.
    CqEvents {
        events_only: bool,
    },
}

// ---- the operator's commands ----

/// A device to create (`softroce link add`), as a `[[device]]` table of the config.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkSpec {
    pub name: String,
    /// Addresses served; on a TAP device with their prefix (the peers on its link).
    pub addr: Vec<crate::iface::IpCidr>,
    pub netdev: Option<String>,
    /// A TAP interface: the L2 device, whole frames, RoCE v1 (Ethertype 0x8915) and v2.
    pub tap: Option<String>,
    /// The TAP device's Ethernet address (default: derived from the name).
    pub mac: Option<String>,
    /// "v1", "v2" or "both"; `None` = v2.
    pub roce: Option<String>,
    /// Largest path MTU in bytes; `None` = 4096.
    pub mtu: Option<u32>,
}

/// One device as `softroce link show` presents it (the look of `rdma link show`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkInfo {
    /// Name, GUID, GID table (with types), MTUs, netdevs.
    pub info: DeviceInfo,
    /// "ACTIVE" when the device has an address to serve, its netdev (if it follows one) is
    /// up with carrier and the operator has not set it down; else "DOWN".
    pub state: String,
    /// Why the port is DOWN, in words with the fix (`None` while ACTIVE).
    pub down_because: Option<String>,
    /// The addresses served (`--addr` and the netdev's).
    pub addrs: Vec<IpAddr>,
    /// The RoCE modes offered: "v2", "v1", or both.
    pub modes: Vec<RoceVersion>,
    /// The GID type rdma_cm uses (configfs `default_roce_mode`).
    pub default_roce_mode: RoceVersion,
    /// Largest path MTU in bytes.
    pub mtu: u32,
    /// "none" (rxe's behaviour) or the algorithm (e.g. "dcqcn").
    pub congestion_control: String,
    /// Where the packets go: "udp 127.0.0.1:4791", "tap tap0", ...
    pub transport: Vec<String>,
    pub gso: bool,
    pub local_via_socket: bool,
    /// Client processes with a context open on the device.
    pub clients: u32,
    /// What the device learnt of its peers in the capability exchange on QP1.
    pub peers: Vec<PeerInfo>,
}

/// A peer of a device as the capability exchange left it (`proto::cm::caps`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerInfo {
    pub addr: IpAddr,
    /// "softroce", "other" (kernel rxe, hardware, or silent) or "asking" (a probe is out).
    pub kind: String,
    /// A softroce peer offering selective retransmission (`docs/loss-recovery.md`).
    pub selective: bool,
    /// A softroce peer that accepts any IPv4 Identification: IPv4 sends to it go in UDP GSO
    /// batches on any path.
    pub any_ident: bool,
}

/// A device's counters (`softroce stat`), every one by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceStats {
    pub device: String,
    /// The transport's counters, rxe's names first (`rdma statistic show`), summed over
    /// every client engine, clients that have gone included.
    pub counters: Vec<(String, u64)>,
    /// The packet I/O's counters (the ICRC and version-mismatch drops, GSO/GRO, errors).
    pub net: Vec<(String, u64)>,
    /// The QP asked for (`qp QPN`), when it lives on this device.
    pub qps: Vec<QpStats>,
}

/// One QP's counters (`rdma statistic qp show`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpStats {
    pub qpn: u32,
    pub pid: u32,
    pub comm: String,
    pub counters: Vec<(String, u64)>,
}

/// What `softroce res show` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ResKind {
    Qp,
    Cq,
    Mr,
    Pd,
    Srq,
    CmId,
}

impl core::str::FromStr for ResKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "qp" => ResKind::Qp,
            "cq" => ResKind::Cq,
            "mr" => ResKind::Mr,
            "pd" => ResKind::Pd,
            "srq" => ResKind::Srq,
            "cm_id" | "cm-id" | "cmid" => ResKind::CmId,
            other => {
                return Err(format!(
                    "unknown resource {other:?} (expected qp, cq, mr, pd, srq or cm_id)"
                ))
            }
        })
    }
}

/// Who holds a resource: the device and the client process (its pid and command name).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResOwner {
    pub device: String,
    pub pid: u32,
    pub comm: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpRes {
    pub owner: ResOwner,
    pub qpn: u32,
    /// "RC", "UC", "UD".
    pub qp_type: String,
    /// "RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR".
    pub state: String,
    pub sq_psn: u32,
    pub rq_psn: u32,
    pub dest_qpn: u32,
    pub path_mtu: u32,
    pub pd: u32,
    pub send_cq: u32,
    pub recv_cq: u32,
    pub srq: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CqRes {
    pub owner: ResOwner,
    pub cqn: u32,
    pub cqe: u32,
    pub users: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MrRes {
    pub owner: ResOwner,
    pub mrn: u32,
    pub pd: u32,
    pub lkey: u32,
    pub rkey: u32,
    pub iova: u64,
    pub length: u64,
    pub access: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PdRes {
    pub owner: ResOwner,
    pub pdn: u32,
    pub users: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SrqRes {
    pub owner: ResOwner,
    pub srqn: u32,
    pub pd: u32,
    pub max_wr: u32,
    pub posted: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmIdRes {
    /// The device is empty while the id is not bound to one.
    pub owner: ResOwner,
    pub id: u32,
    /// "TCP", "UDP", "IB", "IPOIB".
    pub ps: String,
    pub qp_type: String,
    /// The connection state ("LISTEN", "ESTABLISHED", "ADDR_RESOLVED", ...).
    pub state: String,
    pub qpn: u32,
    pub src_addr: Option<SocketAddr>,
    pub dst_addr: Option<SocketAddr>,
}

/// `softroce res show KIND`: the rows of that kind (the other lists are empty).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResDetail {
    pub qps: Vec<QpRes>,
    pub cqs: Vec<CqRes>,
    pub mrs: Vec<MrRes>,
    pub pds: Vec<PdRes>,
    pub srqs: Vec<SrqRes>,
    pub cm_ids: Vec<CmIdRes>,
}

/// What `softroce capture` asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureSpec {
    /// One device, or every device (one pcapng interface each).
    pub device: Option<String>,
    /// Only packets to or from this QP (BTH destination QPN; for ACKs, the requester's).
    pub qpn: Option<u32>,
    /// Only packets with this BTH opcode.
    pub opcode: Option<u8>,
    /// Stop after this many packets.
    pub count: Option<u64>,
    /// Bytes kept of each frame (0 = all of it).
    pub snaplen: u32,
}

/// A fault to inject (`softroce fault`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FaultKind {
    /// The packet is lost.
    Drop,
    /// The packet arrives twice.
    Duplicate,
    /// The packet is held back this long.
    Delay { ms: u32 },
    /// The packet arrives after the one that follows it.
    Reorder,
    /// A payload bit flips: the receiver's ICRC check drops it.
    Corrupt,
    /// The responder answers with an RNR NAK, as without a receive WQE.
    Rnr,
    /// The responder answers with a remote access error NAK, as for a bad R_Key.
    AccessError,
}

impl core::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            FaultKind::Drop => f.write_str("drop"),
            FaultKind::Duplicate => f.write_str("duplicate"),
            FaultKind::Delay { ms } => write!(f, "delay {ms}"),
            FaultKind::Reorder => f.write_str("reorder"),
            FaultKind::Corrupt => f.write_str("corrupt"),
            FaultKind::Rnr => f.write_str("rnr"),
            FaultKind::AccessError => f.write_str("access-error"),
        }
    }
}

/// Which packets a rule takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FaultTrigger {
    /// Each eligible packet with this probability, in parts per million.
    Rate { ppm: u32 },
    /// The next `count` eligible packets, then the rule is spent.
    Next { count: u32 },
}

/// Which way a rule looks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum FaultDirection {
    /// Packets the device sends.
    Tx,
    /// Packets the device receives.
    Rx,
    /// Both (for rnr and access-error: the requests the device's responders receive).
    #[default]
    Both,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultRule {
    pub kind: FaultKind,
    pub trigger: FaultTrigger,
    /// Only packets of this QP (as destination, or as the requester an ACK answers).
    pub qpn: Option<u32>,
    pub direction: FaultDirection,
}

/// A rule in force and what it has done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultStatus {
    pub rule: FaultRule,
    pub injected: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceFaults {
    pub device: String,
    pub rules: Vec<FaultStatus>,
}

/// A device's congestion control as it runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceCongestion {
    pub device: String,
    /// `dcqcn` or `none`.
    pub algorithm: String,
    /// Every parameter's name and value (`transport::congestion::PARAMS` order and units).
    pub params: Vec<(String, u64)>,
    /// mlx5's counters (`np_ecn_marked_roce_packets`, `np_cnp_sent`, `rp_cnp_handled`,
    /// `rp_cnp_ignored`), over every client the device served since it started.
    pub counters: Vec<(String, u64)>,
    /// The device's QPs, paced ones first, at most [`MAX_QP_RATES`] (a message is at most
    /// [`MAX_MESSAGE`] bytes); `qps_not_shown` counts the rest.
    pub qps: Vec<QpRate>,
    pub qps_not_shown: u32,
}

/// Most QPs a [`DeviceCongestion`] lists.
pub const MAX_QP_RATES: usize = 1024;

/// The congestion state of one QP.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpRate {
    pub client: u64,
    pub qpn: u32,
    /// The rate it sends at (DCQCN's RC) and recovers towards (RT), bits per second.
    pub rate_bps: u64,
    pub target_bps: u64,
    /// DCQCN's alpha in 1/1024 (the firmware's unit).
    pub alpha_1024: u32,
    /// Its packets are paced (its rate is below the line rate).
    pub paced: bool,
}

// ---- rdma_cm ----

/// `enum rdma_port_space` values.
pub mod cm_ps {
    pub const IPOIB: u16 = 0x0002;
    pub const TCP: u16 = 0x0106;
    pub const UDP: u16 = 0x0111;
    pub const IB: u16 = 0x013f;
}

/// `rdma_set_option` levels and names (librdmacm `rdma_cma.h`).
pub mod cm_option {
    pub const LEVEL_ID: i32 = 0;
    pub const LEVEL_IB: i32 = 1;
    /// u8: the type of service of the id's traffic (the AH's traffic class).
    pub const ID_TOS: i32 = 0;
    /// int: allow reuse of the bound port.
    pub const ID_REUSEADDR: i32 = 1;
    /// int: an IPv6 wildcard listener does not take IPv4 requests.
    pub const ID_AFONLY: i32 = 2;
    /// u8: the QP's local ACK timeout (overrides packet lifetime + 1).
    pub const ID_ACK_TIMEOUT: i32 = 3;
    /// u8: the QP's min RNR timer (`rdma_set_min_rnr_timer` in the kernel).
    pub const ID_MIN_RNR_TIMER: i32 = 4;
    /// `struct ibv_path_data[]`: not supported on RoCE (ENOSYS).
    pub const IB_PATH: i32 = 1;
}

/// `struct rdma_conn_param` as `rdma_connect` / `rdma_accept` give it, and as events report
/// the peer's values (`CONNECT_REQUEST`: from the REQ; `CONNECT_RESPONSE` / `ESTABLISHED`
/// on the active side: from the REP). `private_data` is the user's bytes only: the daemon
/// adds and strips the 36-byte rdma_cm header of REQ / SIDR_REQ.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmConnParam {
    pub private_data: Vec<u8>,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
    /// UD only (SIDR_REP): 0 = RDMA_UDP_QKEY.
    pub qkey: u32,
}

/// `struct rdma_ud_param` without the private data: where a UD peer (or a multicast group)
/// is reached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmUdParam {
    pub ah_attr: AhAttr,
    pub qp_num: u32,
    pub qkey: u32,
}

/// The route of an id (`struct ibv_sa_path_rec` fields that RoCE fills, facts §7.2).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmPathInfo {
    pub sgid: [u8; 16],
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub sl: u8,
    pub pkey: u16,
    /// IB MTU enum.
    pub mtu: u8,
    pub rate: u8,
    pub packet_life_time: u8,
}

/// What the daemon knows of an id: enough to fill `struct rdma_cm_id` (`verbs` from `device`,
/// `route.addr`, `route.path_rec`, `port_num`, `ps`, `qp_type`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmIdInfo {
    pub id: u32,
    pub channel: u32,
    pub ps: u16,
    pub qp_type: u32,
    /// The device the id is bound to (`None` while unbound or wildcard-bound).
    pub device: Option<String>,
    /// 1 once bound to a device, else 0.
    pub port_num: u8,
    /// The GID table index of `src_gid`, of the device's `default_roce_mode`.
    pub gid_index: u32,
    /// The GID type rdma_cm uses on that device (its `default_roce_mode`).
    pub gid_type: Option<RoceVersion>,
    pub src_addr: Option<SocketAddr>,
    pub dst_addr: Option<SocketAddr>,
    pub src_gid: [u8; 16],
    pub dst_gid: [u8; 16],
    /// Set once the route is resolved (active side) or the REQ arrived (passive side).
    pub path: Option<CmPathInfo>,
}

/// One rdma_cm event, one datagram on the channel's socket (`struct rdma_cm_event`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmEventMsg {
    /// The id the event is for (the listener for `CONNECT_REQUEST`).
    pub id: u32,
    /// `enum rdma_cm_event_type` ([`crate::cm::rdma_cm::RdmaCmEventType`]).
    pub event: u32,
    /// 0, a REJ reason (`REJECTED`), or -errno (`UNREACHABLE`: -110; `ADDR_ERROR`, ...).
    pub status: i32,
    /// The id's state after the event (addresses and route after `ADDR_RESOLVED` /
    /// `ROUTE_RESOLVED`).
    pub info: Option<CmIdInfo>,
    /// `CONNECT_REQUEST`: the new id, already bound to the listener's device and carrying
    /// the peer's addresses (from the REQ's rdma_cm header) and path.
    pub child: Option<CmIdInfo>,
    /// The peer's connection parameters (and its private data, without the 36-byte header).
    pub conn: CmConnParam,
    /// UD events (`CONNECT_REQUEST` / `ESTABLISHED` of RDMA_PS_UDP, `MULTICAST_JOIN`).
    pub ud: Option<CmUdParam>,
}

/// `enum ibv_qp_state` as the engine's state; `None` for a value verbs.h does not define.
pub fn qp_state(v: u32) -> Option<QpState> {
    Some(match v {
        0 => QpState::Reset,
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        4 => QpState::Sqd,
        5 => QpState::Sqe,
        6 => QpState::Err,
        _ => return None,
    })
}

impl AhAttr {
    /// The engine's address vector (RoCE: the GID is the IP address).
    pub fn address_vector(&self) -> AddressVector {
        AddressVector {
            dgid: ip_of_gid(self.dgid),
            sgid_index: self.sgid_index,
            hop_limit: self.hop_limit,
            traffic_class: self.traffic_class,
            flow_label: self.flow_label,
        }
    }
}

impl QpAttr {
    /// The engine's attributes for `ibv_modify_qp` with `mask`: the fields the mask names are
    /// checked here (states, MTU, a GRH on the address vector), the rest by the engine's
    /// [`crate::transport::check_modify`]. The client is not trusted: any value is an error or
    /// an attribute, never a panic (the `ctl` fuzz target drives it).
    pub fn engine_attr(&self, mask: AttrMask) -> VerbsResult<transport::QpAttr> {
        let a = self;
        let state = |v| qp_state(v).ok_or(VerbsError::Invalid("QP state"));
        Ok(transport::QpAttr {
            qp_state: if mask.contains(AttrMask::STATE) {
                state(a.qp_state)?
            } else {
                QpState::Reset
            },
            cur_qp_state: if mask.contains(AttrMask::CUR_STATE) {
                state(a.cur_qp_state)?
            } else {
                QpState::Reset
            },
            path_mtu: if mask.contains(AttrMask::PATH_MTU) {
                Mtu::from_enum(a.path_mtu).ok_or(VerbsError::Invalid("path MTU"))?
            } else {
                Mtu::Mtu1024
            },
            qkey: Qkey(a.qkey),
            rq_psn: Psn::new(a.rq_psn),
            sq_psn: Psn::new(a.sq_psn),
            dest_qp_num: Qpn::new(a.dest_qp_num),
            qp_access_flags: Access(a.qp_access_flags),
            ah_attr: if mask.contains(AttrMask::AV) {
                if !a.ah_attr.is_global {
                    // RoCE needs a GRH: the GID is the IP address (IBTA A17.4).
                    return Err(VerbsError::Invalid(
                        "RoCE address vectors need a GRH (is_global)",
                    ));
                }
                Some(a.ah_attr.address_vector())
            } else {
                None
            },
            pkey_index: a.pkey_index,
            en_sqd_async_notify: a.en_sqd_async_notify != 0,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            port_num: a.port_num,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
        })
    }
}

/// Encodes a message for the socket.
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, postcard::Error> {
    let bytes = postcard::to_stdvec(msg)?;
    if bytes.len() > MAX_MESSAGE {
        return Err(postcard::Error::SerializeBufferFull);
    }
    Ok(bytes)
}

/// Decodes a message from the socket; any malformed input is an error, never a panic.
pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, postcard::Error> {
    postcard::from_bytes(bytes)
}

/// The IB MTU enum for a byte count (IBTA §9.2: 256 << (enum - 1)); `None` if not a valid MTU.
pub fn mtu_enum(bytes: u32) -> Option<u8> {
    match bytes {
        256 => Some(1),
        512 => Some(2),
        1024 => Some(3),
        2048 => Some(4),
        4096 => Some(5),
        _ => None,
    }
}

/// The largest IB MTU that fits a link MTU, as rxe derives active_mtu: the link MTU minus the
/// largest RoCE v2 headers (80 bytes, IPv6 + UDP + BTH + ... + ICRC).
pub fn active_mtu_for_link(link_mtu: u32) -> u8 {
    let usable = link_mtu.saturating_sub(80);
    [4096u32, 2048, 1024, 512, 256]
        .iter()
        .find(|&&m| m <= usable)
        .and_then(|&m| mtu_enum(m))
        .unwrap_or(1)
}

/// The RoCE v2 GID of an IP address: IPv4 as `::ffff:a.b.c.d`, IPv6 as itself (§7.1).
pub fn gid_of(addr: std::net::IpAddr) -> [u8; 16] {
    match addr {
        std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        std::net::IpAddr::V6(v6) => v6.octets(),
    }
}

/// The address a RoCE GID stands for: `::ffff:a.b.c.d` is IPv4, anything else IPv6 (the
/// inverse of [`gid_of`]).
pub fn ip_of_gid(gid: [u8; 16]) -> std::net::IpAddr {
    let v6 = std::net::Ipv6Addr::from(gid);
    v6.to_ipv4_mapped()
        .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4)
}

// ---- the same-host fast path ----
//
// Between two QPs of one device whose processes have the same uid, the daemon lets the process
// that sends run the transport: the requester of its QP and the responder of the peer QP move
// into engines inside that process (a *direction*: docs/architecture.md, "The same-host fast
// path"). The daemon offers it, the shim takes it with `FastTake`, and either side ends it.

/// One QP as the daemon's engine holds it, for the engine that takes it over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FastQp {
    pub qpn: u32,
    /// [`qp_type`].
    pub qp_type: u32,
    /// `enum ibv_qp_state`.
    pub state: u32,
    /// Every attribute, as `ibv_query_qp` returns them (`sq_psn` and `rq_psn` are the QP's
    /// current PSNs).
    pub attr: QpAttr,
    pub cap: QpCap,
    pub sq_sig_all: bool,
    /// The client's handles (of the QP's owner).
    pub pd: u32,
    pub send_cq: u32,
    pub recv_cq: u32,
    /// The requester's oldest unacknowledged PSN (equal to `attr.sq_psn` when idle) and the
    /// responder's MSN.
    pub comp_psn: u32,
    pub msn: u32,
}

/// What [`Request::FastTake`] grants.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FastGrant {
    /// The direction's id (also in its control block).
    pub direction: u64,
    /// The direction memfd's length; the receive-completion ring it holds for the peer.
    pub block_len: u64,
    pub ring: RingPlace,
    /// The taker's QP (its requester runs here) and the peer QP (its responder runs here).
    pub requester: FastQp,
    pub responder: FastQp,
    /// The peer QP's process, whose memory the responder reaches.
    pub peer_pid: i32,
    /// The peer QP's receive ring in the second fd (this process becomes its consumer).
    pub peer_rq: RingPlace,
    pub peer_region_len: u64,
    /// Receive WQEs the daemon had already taken from that queue (the QP's receive ring or
    /// its SRQ's), oldest first, as [`crate::ring::wqe::RecvWqe`]s in a ring of the
    /// direction's memfd that the daemon filled: they go before the peer's ring. A ring in
    /// shared memory and not a list in this message: an SRQ may hold thousands.
    pub recvs: RingPlace,
    /// The peer client's MR table (the third fd) and the taker's own (the fourth),
    /// [`crate::ring::fast::MrTable`].
    pub mr_table_len: u64,
    pub own_mr_table_len: u64,
    /// The device's GID table as its engines hold it, and its port MTU (`enum ibv_mtu`).
    pub gids: Vec<[u8; 16]>,
    pub port_mtu: u8,
}

/// One ring feeding a CQ: a direction's receive-completion ring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FastRing {
    pub direction: u64,
    pub block_len: u64,
    pub ring: RingPlace,
}

/// An async event an engine of a direction raised (`enum ibv_event_type`), for the QP's
/// owner.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FastEvent {
    pub qpn: u32,
    pub event_type: u32,
}

/// The transport's attributes from their `ibv_qp_attr` form (every field, as
/// [`Response::QpAttr`] carries them), or None when one is out of range.
pub fn transport_attr(a: &QpAttr) -> Option<crate::transport::QpAttr> {
    use crate::transport::{Access, AddressVector, Mtu};
    let state = crate::transport::QpState::from_u32(a.qp_state)?;
    Some(crate::transport::QpAttr {
        qp_state: state,
        cur_qp_state: crate::transport::QpState::from_u32(a.cur_qp_state).unwrap_or(state),
        path_mtu: Mtu::from_enum(a.path_mtu).unwrap_or(Mtu::Mtu1024),
        qkey: crate::Qkey(a.qkey),
        rq_psn: crate::Psn::new(a.rq_psn),
        sq_psn: crate::Psn::new(a.sq_psn),
        dest_qp_num: crate::Qpn::new(a.dest_qp_num),
        qp_access_flags: Access(a.qp_access_flags),
        ah_attr: a.ah_attr.is_global.then(|| AddressVector {
            dgid: ip_of_gid(a.ah_attr.dgid),
            sgid_index: a.ah_attr.sgid_index,
            hop_limit: a.ah_attr.hop_limit,
            traffic_class: a.ah_attr.traffic_class,
            flow_label: a.ah_attr.flow_label,
        }),
        pkey_index: a.pkey_index,
        en_sqd_async_notify: a.en_sqd_async_notify != 0,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
    })
}

/// The `ibv_qp_attr` form of a QP's transport attributes in state `state`.
pub fn ctl_attr(state: crate::transport::QpState, a: &crate::transport::QpAttr) -> QpAttr {
    let av = a.ah_attr;
    QpAttr {
        qp_state: state as u32,
        cur_qp_state: state as u32,
        path_mtu: a.path_mtu as u32,
        qkey: a.qkey.0,
        rq_psn: a.rq_psn.value(),
        sq_psn: a.sq_psn.value(),
        dest_qp_num: a.dest_qp_num.value(),
        qp_access_flags: a.qp_access_flags.0,
        ah_attr: AhAttr {
            dgid: av.map_or([0; 16], |v| gid_of(v.dgid)),
            flow_label: av.map_or(0, |v| v.flow_label),
            sgid_index: av.map_or(0, |v| v.sgid_index),
            hop_limit: av.map_or(0, |v| v.hop_limit),
            traffic_class: av.map_or(0, |v| v.traffic_class),
            is_global: av.is_some(),
            port_num: 1,
            ..Default::default()
        },
        pkey_index: a.pkey_index,
        en_sqd_async_notify: u8::from(a.en_sqd_async_notify),
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: 1,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        ..Default::default()
    }
}

/// What an empty slot of a GID table holds where a table is a list of addresses by index
/// ([`DeviceInfo::gid_table`]): the unspecified address, which no packet carries.
pub const NO_GID: std::net::IpAddr = std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED);

impl DeviceInfo {
    /// The addresses of the GID table's entries, in table order (a `--roce both` device's
    /// addresses once per type).
    pub fn gid_addrs(&self) -> Vec<std::net::IpAddr> {
        self.gids.iter().map(|g| ip_of_gid(g.gid)).collect()
    }

    /// The GID table by index: entry `i` is GID index `i`'s address, [`NO_GID`] where the
    /// slot is empty (an address went away and its index is not reused until another comes).
    pub fn gid_table(&self) -> Vec<std::net::IpAddr> {
        let len = self.gids.iter().map(|g| g.index as usize + 1).max();
        let mut table = vec![NO_GID; len.unwrap_or(0).min(MAX_GID_TABLE)];
        for g in &self.gids {
            if let Some(slot) = table.get_mut(g.index as usize) {
                *slot = ip_of_gid(g.gid);
            }
        }
        table
    }

    /// The entry at GID index `index`, if the slot is filled.
    pub fn gid_entry(&self, index: usize) -> Option<&GidEntry> {
        self.gids.iter().find(|g| g.index as usize == index)
    }
}

/// The GID table's length (rxe's `RXE_PORT_GID_TBL_LEN`, the port's `gid_tbl_len`): no
/// entry has an index past it.
pub const MAX_GID_TABLE: usize = 1024;

/// `next` (a device's GID entries freshly read, indices in the order found) renumbered as the
/// kernel's GID cache keeps its table (`ib_cache_gid_add`): an entry that was in `prev` keeps
/// its index, so the QPs and AHs that name it go on naming it; a new one takes the lowest
/// index free; the slot of one that went away stays empty until a new entry fills it. (A
/// table renumbered from scratch at each change moved a running program's source GID under
/// it when an address came before it in the interface's list.)
pub fn keep_gid_indices(prev: &[GidEntry], next: &mut [GidEntry]) {
    let same = |a: &GidEntry, b: &GidEntry| a.gid == b.gid && a.roce == b.roce;
    let mut used = std::collections::BTreeSet::new();
    let mut kept = vec![false; next.len()];
    for (i, n) in next.iter_mut().enumerate() {
        if let Some(p) = prev.iter().find(|p| same(p, n)) {
            if used.insert(p.index) {
                n.index = p.index;
                kept[i] = true;
            }
        }
    }
    let mut free = (0u32..).filter(|i| !used.contains(i));
    for (n, kept) in next.iter_mut().zip(kept) {
        if !kept {
            n.index = free.next().unwrap_or(u32::MAX);
        }
    }
    next.sort_by_key(|g| g.index);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_garbage_is_an_error() {
        let req = Request::Hello {
            version: PROTOCOL_VERSION,
            program: "ibv_devinfo".into(),
        };
        let bytes = encode(&req).unwrap();
        assert_eq!(decode::<Request>(&bytes).unwrap(), req);
        let resp = Response::Devices(vec![DeviceInfo {
            name: "srxe0".into(),
            node_guid: 0x0200_00ff_fe00_0001,
            roce: RoceVersion::V2,
            max_mtu: 5,
            active_mtu: 5,
            port_active: true,
            gids: vec![GidEntry {
                index: 1,
                gid: gid_of("127.0.0.1".parse().unwrap()),
                roce: RoceVersion::V2,
            }],
            netdevs: vec!["lo".into()],
            max_cqe: 32767,
            speed_mbps: 100_000,
            limits: DeviceLimits::default(),
        }]);
        let bytes = encode(&resp).unwrap();
        assert_eq!(decode::<Response>(&bytes).unwrap(), resp);
        let cc = Response::Congestion(vec![DeviceCongestion {
            device: "srxe0".into(),
            algorithm: "dcqcn".into(),
            params: vec![("rpg_time_reset".into(), 300)],
            counters: vec![("np_cnp_sent".into(), 3)],
            qps: vec![QpRate {
                client: 2,
                qpn: 0x10011,
                rate_bps: 5_000_000_000,
                target_bps: 10_000_000_000,
                alpha_1024: 1023,
                paced: true,
            }],
            qps_not_shown: 7,
        }]);
        assert_eq!(decode::<Response>(&encode(&cc).unwrap()).unwrap(), cc);
        for cut in 0..bytes.len() {
            assert!(decode::<Response>(&bytes[..cut]).is_err());
        }
        assert!(decode::<Request>(&[0xff; 40]).is_err());
    }

    #[test]
    fn resource_requests_round_trip() {
        let reqs = [
            Request::RegMr {
                pd: 1,
                addr: 0x7fff_0000_1000,
                length: 1 << 20,
                iova: 0x7fff_0000_1000,
                access: 7,
            },
            Request::ReregMr {
                mr: 3,
                pd: Some(2),
                range: Some((0x7fff_0000_2000, 4096)),
                access: None,
            },
            Request::CreateQp {
                pd: 1,
                qp_type: qp_type::RC,
                send_cq: 2,
                recv_cq: 2,
                srq: None,
                cap: QpCap {
                    max_send_wr: 128,
                    max_recv_wr: 128,
                    max_send_sge: 4,
                    max_recv_sge: 4,
                    max_inline_data: 64,
                },
                sq_sig_all: false,
            },
            Request::ModifyQp {
                qpn: 0x11,
                attr: QpAttr {
                    qp_state: 3,
                    path_mtu: 5,
                    dest_qp_num: 0x12,
                    ah_attr: AhAttr {
                        dgid: gid_of("::1".parse().unwrap()),
                        is_global: true,
                        hop_limit: 64,
                        ..AhAttr::default()
                    },
                    ..QpAttr::default()
                },
                mask: 0x1 | 0x80 | 0x100 | 0x1000 | 0x10_0000,
            },
        ];
        for r in reqs {
            assert_eq!(decode::<Request>(&encode(&r).unwrap()).unwrap(), r);
        }
    }

    #[test]
    fn cm_messages_round_trip() {
        let info = CmIdInfo {
            id: 0x0100_0003,
            channel: 2,
            ps: cm_ps::TCP,
            qp_type: qp_type::RC,
            device: Some("srxe0".into()),
            port_num: 1,
            gid_index: 1,
            gid_type: Some(RoceVersion::V2),
            src_addr: Some("127.0.0.1:40000".parse().unwrap()),
            dst_addr: Some("[::1]:7174".parse().unwrap()),
            src_gid: gid_of("127.0.0.1".parse().unwrap()),
            dst_gid: gid_of("::1".parse().unwrap()),
            path: Some(CmPathInfo {
                hop_limit: 64,
                mtu: 3,
                pkey: 0xffff,
                packet_life_time: 16,
                flow_label: 0x308ef,
                ..CmPathInfo::default()
            }),
        };
        let reqs = [
            Request::CmCreateChannel,
            Request::CmCreateId {
                channel: 1,
                ps: cm_ps::UDP,
                qp_type: qp_type::UD,
            },
            Request::CmBind {
                id: 3,
                addr: "0.0.0.0:0".parse().unwrap(),
            },
            Request::CmResolveAddr {
                id: 3,
                src: None,
                dst: "[::1]:7174".parse().unwrap(),
                timeout_ms: 2000,
            },
            Request::CmConnect {
                id: 3,
                conn: CmConnParam {
                    private_data: b"hello".to_vec(),
                    responder_resources: 1,
                    initiator_depth: 1,
                    retry_count: 7,
                    rnr_retry_count: 7,
                    qp_num: 0x1_0011,
                    ..CmConnParam::default()
                },
                psn: Some(0xabcdef),
            },
            Request::CmSetOption {
                id: 3,
                level: cm_option::LEVEL_ID,
                name: cm_option::ID_TOS,
                value: vec![32],
            },
            Request::CmInitQpAttr { id: 3, qp_state: 2 },
        ];
        for r in reqs {
            assert_eq!(decode::<Request>(&encode(&r).unwrap()).unwrap(), r);
        }
        let resps = [
            Response::CmChannel { channel: 7 },
            Response::CmId { id: 9 },
            Response::CmIdInfo(info.clone()),
            Response::CmQpAttr {
                attr: QpAttr {
                    qp_state: 2,
                    dest_qp_num: 0x11,
                    rq_psn: 0x123456,
                    ..QpAttr::default()
                },
                mask: 0x1 | 0x80 | 0x100,
            },
        ];
        for r in resps {
            assert_eq!(decode::<Response>(&encode(&r).unwrap()).unwrap(), r);
        }
        let ev = CmEventMsg {
            id: 4,
            event: crate::cm::rdma_cm::RdmaCmEventType::ConnectRequest as u32,
            status: 0,
            info: None,
            child: Some(info),
            conn: CmConnParam {
                private_data: vec![1, 2, 3],
                qp_num: 0x11,
                ..CmConnParam::default()
            },
            ud: Some(CmUdParam {
                qp_num: 0x12,
                qkey: crate::cm::rdma_cm::RDMA_UDP_QKEY,
                ah_attr: AhAttr {
                    is_global: true,
                    hop_limit: 64,
                    ..AhAttr::default()
                },
            }),
        };
        let bytes = encode(&ev).unwrap();
        assert_eq!(decode::<CmEventMsg>(&bytes).unwrap(), ev);
        for cut in 0..bytes.len() {
            assert!(decode::<CmEventMsg>(&bytes[..cut]).is_err());
        }
    }

    #[test]
    fn operator_messages_round_trip() {
        let reqs = [
            Request::LinkAdd {
                spec: LinkSpec {
                    name: "srxe9".into(),
                    addr: vec!["127.0.0.9".parse().unwrap()],
                    mtu: Some(1024),
                    ..LinkSpec::default()
                },
                save: true,
            },
            Request::Stat {
                device: Some("srxe9".into()),
                qpn: Some(0x11),
            },
            Request::ResDetail {
                kind: ResKind::CmId,
            },
            Request::CaptureStart {
                spec: CaptureSpec {
                    opcode: Some(0x0a),
                    count: Some(10),
                    ..CaptureSpec::default()
                },
            },
            Request::FaultAdd {
                device: "srxe0".into(),
                rule: FaultRule {
                    kind: FaultKind::Delay { ms: 5 },
                    trigger: FaultTrigger::Rate { ppm: 10_000 },
                    qpn: None,
                    direction: FaultDirection::Tx,
                },
            },
        ];
        for r in reqs {
            assert_eq!(decode::<Request>(&encode(&r).unwrap()).unwrap(), r);
        }
        let r = Response::Stats(vec![DeviceStats {
            device: "srxe0".into(),
            counters: vec![("sent_pkts".into(), 3)],
            net: vec![("rx_bad_icrc".into(), 1)],
            qps: vec![QpStats {
                qpn: 0x11,
                pid: 42,
                comm: "ibv_rc_pingpong".into(),
                counters: vec![("rcvd_pkts".into(), 2)],
            }],
        }]);
        assert_eq!(decode::<Response>(&encode(&r).unwrap()).unwrap(), r);
        assert_eq!("cm_id".parse::<ResKind>(), Ok(ResKind::CmId));
        assert!("mw".parse::<ResKind>().is_err());
    }

    #[test]
    fn mtu_and_gid_rules() {
        assert_eq!(active_mtu_for_link(1500), 3, "1500 gives 1024, as rxe");
        assert_eq!(active_mtu_for_link(9000), 5);
        assert_eq!(active_mtu_for_link(65536), 5);
        assert_eq!(
            gid_of("10.0.0.1".parse().unwrap()),
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1]
        );
        assert_eq!("V1".parse::<RoceVersion>(), Ok(RoceVersion::V1));
        assert!("v3".parse::<RoceVersion>().is_err());
    }

    /// The kernel's GID cache keeps an entry's index while it lives: a new address takes the
    /// lowest free index, one gone leaves its slot empty (and `gid_table` shows the hole).
    #[test]
    fn gid_indices_stay_put_across_changes() {
        let e = |index, last: u8, roce| GidEntry {
            index,
            gid: gid_of(std::net::Ipv4Addr::new(10, 0, 0, last).into()),
            roce,
        };
        let v2 = RoceVersion::V2;
        let prev = [e(0, 1, v2), e(1, 2, v2), e(2, 3, v2)];
        // .2 went away; .9 came before the others in the interface's list.
        let mut next = [e(0, 9, v2), e(1, 1, v2), e(2, 3, v2)];
        keep_gid_indices(&prev, &mut next);
        assert_eq!(next, [e(0, 1, v2), e(1, 9, v2), e(2, 3, v2)]);
        // A hole stays a hole until an entry fills it.
        let mut next = [e(0, 1, v2), e(1, 3, v2)];
        keep_gid_indices(&prev, &mut next);
        assert_eq!(next, [e(0, 1, v2), e(2, 3, v2)]);
        let info = DeviceInfo {
            name: "srxe0".into(),
            node_guid: 1,
            roce: RoceVersion::V2,
            max_mtu: 5,
            active_mtu: 5,
            port_active: true,
            gids: next.to_vec(),
            netdevs: Vec::new(),
            max_cqe: 1,
            speed_mbps: 1,
            limits: DeviceLimits::default(),
        };
        let a = |last| std::net::IpAddr::from(std::net::Ipv4Addr::new(10, 0, 0, last));
        assert_eq!(info.gid_table(), [a(1), NO_GID, a(3)]);
        assert_eq!(info.gid_entry(2).map(|g| g.gid), Some(gid_of(a(3))));
        assert!(info.gid_entry(1).is_none());
        // The same address once per type keeps both entries.
        let prev = [e(0, 1, RoceVersion::V1), e(1, 1, v2)];
        let mut next = [e(0, 1, v2), e(1, 1, RoceVersion::V1)];
        keep_gid_indices(&prev, &mut next);
        assert_eq!(next, prev);
    }
}
