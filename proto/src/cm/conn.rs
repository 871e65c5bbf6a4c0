//! The connection state machine of Linux's `ib_cm` (IBTA Vol. 1 §12.9), for many
//! connections and listeners of one port, sans-I/O in the manner of quinn-proto: MADs and
//! consumer calls go in (`handle_mad`, `connect`, `accept`, …), time goes in as nanoseconds
//! (`handle_timeout`), and MADs to send and events for the consumer come out
//! (`poll_transmit`, `poll_event`, `poll_timeout`).
//!
//! What follows ib_cm (and the rdma_cm on top of it) on purpose:
//! - Comm IDs: a cyclic counter XORed with a random operand, stored in CPU (little-endian)
//!   order, so the wire shows them byte-swapped; TIDs are `hi_tid << 32 | that CPU value`
//!   (`cm_form_tid`). REP/RTU/MRA/REJ reuse the REQ's TID, DREQ uses the sender's own TID,
//!   DREP reuses the DREQ's.
//! - Retransmission: REQ every `2·2^(PLT−8) + 2^(remote_cm_response_timeout−8)` ms, REP and
//!   DREQ on the passive side every `2^(REQ local_cm_response_timeout−8)` ms, each up to
//!   `max_cm_retries` times after the first send; then UNREACHABLE (REQ, REP, SIDR) or
//!   timewait (DREQ).
//! - Duplicates: rdma_cm arms a *delayed* MRA on every REQ and REP it receives, so the first
//!   duplicate REQ (before accept) or REP (before RTU) is answered with an MRA (service timeout
//!   24); a duplicate REP after RTU gets the RTU again; a duplicate REQ in timewait gets REJ
//!   "stale connection". A duplicate REQ while our REP is outstanding is dropped: the REP's
//!   own timer resends it.
//! - A lost RTU: the passive side keeps resending REP; the active side, ESTABLISHED, answers
//!   each duplicate REP with the RTU. The passive side also becomes ESTABLISHED when the
//!   daemon sees the first data on the QP (`notify_comm_established`, ib_cm's
//!   `IB_EVENT_COMM_EST` path). A DREQ arriving before either is accepted (DREQ_RCVD, no
//!   ESTABLISHED event), as in `cm_dreq_handler`.
//! - MRA received: the outstanding REQ/REP waits `2^(service_timeout−8) + 2^(av.timeout−8)`
//!   ms before its next retry (`cm_mra_handler`). A REJ naming a remote comm ID other than
//!   the one we know (e.g. for a REP we never received) is ignored (`cm_acquire_id`).
//! - No listener: REJ reason 8 "invalid service ID" with local comm ID 0 (as captured in
//!   `host_probe_cm_rej.pcap`); a REQ from a (CA GUID, QPN) already connected: REJ 10 "stale
//!   connection" and a DREQ on the old connection; an unknown DREQ: a DREP; a REP for an
//!   unknown comm ID: REJ 6 "invalid comm ID".
//! - Timewait lasts `2^(av.timeout−8)` ms (`cm_enter_timewait`), av.timeout being PLT + 1.

use super::msg::{
    msg_kind, sidr_status, CmError, CmMad, CmMessage, CmPath, DreqRepr, MraRepr, RejReason,
    RejRepr, RepRepr, ReqRepr, RtuRepr, SidrRepRepr, SidrReqRepr,
};
use super::rdma_cm;
use crate::wire::mad::MAD_LEN;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::IpAddr;

const NS_PER_MS: u64 = 1_000_000;

/// `cm_convert_to_ms`: 4.096 µs · 2^t, approximated as 2^(t−8) ms.
pub fn cm_convert_to_ms(iba_time: u8) -> u64 {
    1u64 << iba_time.saturating_sub(8).min(31)
}

/// The active side's REQ timeout (`ib_send_cm_req`): twice the packet lifetime plus the
/// peer's CM response time.
pub fn req_timeout_ms(packet_life_time: u8, remote_cm_response_timeout: u8) -> u64 {
    cm_convert_to_ms(packet_life_time) * 2 + cm_convert_to_ms(remote_cm_response_timeout)
}

/// A connection (or SIDR request), named by its local communication ID as sent on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId(pub u32);

/// One port's CM identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointConfig {
    /// Node GUID, sent as "local CA GUID".
    pub ca_guid: u64,
    /// The MAD agent's `hi_tid`, the upper half of every TID we originate.
    pub hi_tid: u32,
    /// `cm.random_id_operand`, XORed into every comm ID (pick it at random).
    pub random_id_operand: u32,
    /// Where the cyclic ID counter starts.
    pub first_id: u32,
    /// `local_ca_ack_delay`, sent in REP as the target ACK delay.
    pub ack_delay: u8,
    /// Service timeout of the MRAs we send.
    pub mra_service_timeout: u8,
}

impl EndpointConfig {
    pub fn new(ca_guid: u64, hi_tid: u32, random_id_operand: u32) -> EndpointConfig {
        EndpointConfig {
            ca_guid,
            hi_tid,
            random_id_operand,
            first_id: 0,
            ack_delay: rdma_cm::RXE_ACK_DELAY,
            mra_service_timeout: rdma_cm::CMA_CM_MRA_SETTING,
        }
    }
}

/// A MAD to send on QP1 to `peer` (reply to the address the request came from).
#[derive(Clone, PartialEq, Eq)]
pub struct Transmit {
    pub peer: IpAddr,
    pub mad: [u8; MAD_LEN],
}

impl core::fmt::Debug for Transmit {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let name =
            crate::wire::mad::cm_attribute_name(u16::from_be_bytes([self.mad[16], self.mad[17]]));
        write!(f, "Transmit({name} to {})", self.peer)
    }
}

/// Why a DISCONNECTED event was raised (all map to `RDMA_CM_EVENT_DISCONNECTED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DisconnectCause {
    /// The peer sent DREQ: answer with [`CmEndpoint::disconnect`], which sends the DREP.
    DreqReceived,
    /// Our DREQ was answered.
    DrepReceived,
    /// Our DREQ was never answered.
    DreqTimeout,
}

/// What the consumer (rdma_cm emulation in the daemon) learns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ for a service we listen on: answer with `accept` or `reject`.
    ConnectRequest {
        id: ConnId,
        service_id: u64,
        peer: IpAddr,
        req: Box<ReqRepr>,
    },
    /// A REP for our REQ: move the QP to RTR/RTS, then `send_rtu`.
    ConnectResponse {
        id: ConnId,
        rep: Box<RepRepr>,
    },
    Established {
        id: ConnId,
    },
    /// The peer rejected (REJ), or answered a request we never made.
    Rejected {
        id: ConnId,
        reason: RejReason,
        ari: Vec<u8>,
        private_data: Vec<u8>,
    },
    /// REQ, REP or SIDR_REQ went unanswered through all retries (`-ETIMEDOUT`).
    Unreachable {
        id: ConnId,
    },
    Disconnected {
        id: ConnId,
        cause: DisconnectCause,
        private_data: Vec<u8>,
    },
    /// Timewait is over; the comm ID and the QP may be reused.
    TimewaitExit {
        id: ConnId,
    },
    /// A SIDR_REQ for a service we listen on: answer with `sidr_reply`.
    SidrRequest {
        id: ConnId,
        service_id: u64,
        peer: IpAddr,
        req: Box<SidrReqRepr>,
    },
    /// The SIDR_REP for our SIDR_REQ (its status may be a failure).
    SidrResponse {
        id: ConnId,
        rep: Box<SidrRepRepr>,
    },
}

impl CmEvent {
    /// The connection the event is about.
    pub fn id(&self) -> ConnId {
        match self {
            CmEvent::ConnectRequest { id, .. }
            | CmEvent::ConnectResponse { id, .. }
            | CmEvent::Established { id }
            | CmEvent::Rejected { id, .. }
            | CmEvent::Unreachable { id }
            | CmEvent::Disconnected { id, .. }
            | CmEvent::TimewaitExit { id }
            | CmEvent::SidrRequest { id, .. }
            | CmEvent::SidrResponse { id, .. } => *id,
        }
    }

    /// The rdma_cm event and status `cma_ib_handler` / `cma_sidr_rep_handler` derive from it.
    /// A REP maps to CONNECT_RESPONSE, which rdma_cm only shows to ids without a QP; with a
    /// QP it moves the QP to RTS, sends the RTU and reports the ESTABLISHED that follows.
    pub fn rdma_cm_event(&self) -> (rdma_cm::RdmaCmEventType, i32) {
        use rdma_cm::RdmaCmEventType as T;
        match self {
            CmEvent::ConnectRequest { .. } | CmEvent::SidrRequest { .. } => (T::ConnectRequest, 0),
            CmEvent::ConnectResponse { .. } => (T::ConnectResponse, 0),
            CmEvent::Established { .. } => (T::Established, 0),
            CmEvent::Rejected { reason, .. } => (T::Rejected, i32::from(reason.0)),
            CmEvent::Unreachable { .. } => (T::Unreachable, rdma_cm::ETIMEDOUT_STATUS),
            CmEvent::Disconnected { .. } => (T::Disconnected, 0),
            CmEvent::TimewaitExit { .. } => (T::TimewaitExit, 0),
            CmEvent::SidrResponse { rep, .. } if rep.status == sidr_status::SUCCESS => {
                (T::Established, 0)
            }
            CmEvent::SidrResponse { rep, .. } => (T::Unreachable, i32::from(rep.status)),
        }
    }
}

/// The QP attributes of the active side once the REP arrived (`ib_cm_init_qp_attr` after
/// `cm_rep_handler`: the peer's responder resources bound our initiator depth and vice
/// versa; its RNR retry count is ours to use).
pub fn negotiated_active(p: &ConnectParams, rep: &RepRepr) -> rdma_cm::Negotiated {
    rdma_cm::Negotiated {
        path_mtu: p.path_mtu,
        packet_life_time: p.packet_life_time,
        remote_qpn: rep.local_qpn,
        remote_starting_psn: rep.starting_psn,
        local_starting_psn: p.starting_psn,
        responder_resources: rep.initiator_depth,
        initiator_depth: rep.responder_resources,
        retry_count: p.retry_count,
        rnr_retry_count: rep.rnr_retry_count,
        ack_timeout_override: None,
        min_rnr_timer: None,
    }
}

/// The QP attributes of the passive side from the REQ and its own accept parameters
/// (`cm_req_handler` + `ib_send_cm_rep`). The path lifetime is the REQ's ACK timeout − 1
/// (`cm_format_paths_from_req`), so the QP timeout equals that ACK timeout.
pub fn negotiated_passive(req: &ReqRepr, a: &AcceptParams) -> rdma_cm::Negotiated {
    rdma_cm::Negotiated {
        path_mtu: req.path_mtu,
        packet_life_time: req.primary_path.local_ack_timeout.saturating_sub(1),
        remote_qpn: req.local_qpn,
        remote_starting_psn: req.starting_psn,
        local_starting_psn: a.starting_psn,
        responder_resources: a.responder_resources,
        initiator_depth: a.initiator_depth,
        retry_count: req.retry_count,
        rnr_retry_count: req.rnr_retry_count,
        ack_timeout_override: None,
        min_rnr_timer: None,
    }
}

/// Misuse of the consumer API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CmApiError {
    #[error("no connection {0:#010x}")]
    UnknownConn(u32),
    #[error("not allowed in state {0:?}")]
    InvalidState(State),
    #[error("service ID {0:#018x} already has a listener")]
    AddrInUse(u64),
    #[error("cannot encode: {0}")]
    Encode(#[from] CmError),
}

/// The ib_cm states (`enum ib_cm_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    ReqSent,
    MraReqRcvd,
    /// REQ handed to the consumer; a delayed MRA is armed (rdma_cm's MRA_REQ_SENT).
    ReqRcvd,
    /// A duplicate REQ was answered with MRA.
    MraReqSent,
    RepSent,
    MraRepRcvd,
    /// REP handed to the consumer; a delayed MRA is armed.
    RepRcvd,
    MraRepSent,
    Established,
    DreqSent,
    DreqRcvd,
    Timewait,
    SidrReqSent,
    SidrReqRcvd,
}

/// A snapshot of one connection, for the consumer and for `softroce res show`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnInfo {
    pub state: State,
    pub peer: IpAddr,
    pub service_id: u64,
    /// 0 until the peer's REQ/REP named it.
    pub remote_comm_id: u32,
    pub remote_ca_guid: u64,
    pub remote_qpn: u32,
    pub local_qpn: u32,
}

/// What parameters `connect` sends in the REQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectParams {
    pub peer: IpAddr,
    pub service_id: u64,
    /// [`super::msg::transport`].
    pub transport_type: u8,
    pub local_qpn: u32,
    /// Random 24-bit PSN, chosen by the caller (no randomness in here).
    pub starting_psn: u32,
    pub primary_path: CmPath,
    /// IB MTU enum.
    pub path_mtu: u8,
    pub packet_life_time: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: bool,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub remote_cm_response_timeout: u8,
    pub local_cm_response_timeout: u8,
    pub max_cm_retries: u8,
    /// Including the rdma_cm header.
    pub private_data: Vec<u8>,
}

impl ConnectParams {
    /// What `rdma_connect` sends over a resolved RoCE route (`cma_connect_ib`).
    pub fn rdma_cm(
        route: &rdma_cm::RoceRoute,
        port_space: rdma_cm::PortSpace,
        param: &rdma_cm::RdmaConnParam,
        qp_type: rdma_cm::QpType,
        starting_psn: u32,
        ca_ack_delay: u8,
    ) -> Result<ConnectParams, rdma_cm::CmaHdrError> {
        let hdr = rdma_cm::CmaHdr {
            src_port: route.src_port,
            src_addr: route.src_addr,
            dst_addr: route.dst_addr,
        };
        Ok(ConnectParams {
            peer: route.dst_addr,
            service_id: rdma_cm::service_id(port_space, route.dst_port),
            transport_type: qp_type.cm_transport(),
            local_qpn: param.qp_num,
            starting_psn: starting_psn & 0xff_ffff,
            primary_path: route.cm_path(ca_ack_delay),
            path_mtu: route.path_mtu,
            packet_life_time: route.packet_life_time,
            responder_resources: param.responder_resources,
            initiator_depth: param.initiator_depth,
            flow_control: param.flow_control,
            retry_count: param.retry_count.min(7),
            rnr_retry_count: param.rnr_retry_count.min(7),
            srq: param.srq,
            remote_cm_response_timeout: rdma_cm::CMA_CM_RESPONSE_TIMEOUT,
            local_cm_response_timeout: rdma_cm::CMA_CM_RESPONSE_TIMEOUT,
            max_cm_retries: rdma_cm::CMA_MAX_CM_RETRIES,
            private_data: rdma_cm::req_private_data(
                &hdr,
                &param.private_data,
                rdma_cm::user_private_data_max::REQ,
            )?,
        })
    }
}

/// What `accept` sends in the REP.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AcceptParams {
    pub local_qpn: u32,
    pub starting_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: bool,
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub private_data: Vec<u8>,
}

/// What `sidr_resolve` sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrParams {
    pub peer: IpAddr,
    pub service_id: u64,
    pub pkey: u16,
    /// Including the rdma_cm header.
    pub private_data: Vec<u8>,
    pub timeout_ms: u64,
    pub max_cm_retries: u8,
}

/// A message under retransmission.
#[derive(Debug, Clone)]
struct Outstanding {
    mad: [u8; MAD_LEN],
    timeout_ms: u64,
    retries_left: u8,
}

#[derive(Debug, Clone)]
struct Conn {
    id: u32,
    state: State,
    peer: IpAddr,
    /// TID of the REQ (ours or the peer's): REP, RTU, MRA and REJ carry it.
    tid: u64,
    service_id: u64,
    local_qpn: u32,
    remote_comm_id: u32,
    remote_ca_guid: u64,
    remote_qpn: u32,
    /// REQ/REP/DREQ retransmission period.
    timeout_ms: u64,
    max_cm_retries: u8,
    /// `av.timeout` (PLT + 1): MRA wait and timewait.
    av_timeout: u8,
    outstanding: Option<Outstanding>,
    /// Deadline of the outstanding message or of timewait.
    timer: Option<u64>,
    /// The last MRA / RTU we sent, resent for duplicates.
    last_mra: Option<[u8; MAD_LEN]>,
    last_rtu: Option<[u8; MAD_LEN]>,
    /// TID of the DREQ we are to answer.
    dreq_tid: u64,
    /// The consumer destroyed the id: finish timewait silently.
    destroyed: bool,
}

/// The CM of one port: connections, listeners, comm ID and TID allocation, demultiplexing.
#[derive(Debug)]
pub struct CmEndpoint {
    cfg: EndpointConfig,
    next_id: u32,
    conns: BTreeMap<u32, Conn>,
    /// (remote CA GUID, remote comm ID) → local comm ID: duplicate REQ/REP detection.
    remote_ids: BTreeMap<(u64, u32), u32>,
    /// (remote CA GUID, remote QPN) → local comm ID: stale connection detection.
    remote_qpns: BTreeMap<(u64, u32), u32>,
    /// (peer, request ID) → local ID of SIDR requests being served.
    sidr_remote: BTreeMap<(IpAddr, u32), u32>,
    listeners: BTreeSet<u64>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<CmEvent>,
    counters: CmCounters,
}

/// What became of the MADs [`CmEndpoint::handle_mad`] was given: each received MAD is either
/// malformed, or acted on (it changed a connection, or was answered), or ignored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmCounters {
    pub mads_rcvd: u64,
    /// Not a CM MAD this CM takes: truncated, a wrong base or class version or method, an
    /// unknown attribute, a field out of range (ib_mad drops them).
    pub mads_malformed: u64,
    /// Well-formed, and changed nothing: for no connection here, a late duplicate, a message
    /// the connection's state does not take, LAP/APR (no alternate paths on RoCE).
    pub mads_ignored: u64,
}

impl CmEndpoint {
    pub fn new(cfg: EndpointConfig) -> CmEndpoint {
        CmEndpoint {
            cfg,
            next_id: cfg.first_id,
            conns: BTreeMap::new(),
            remote_ids: BTreeMap::new(),
            remote_qpns: BTreeMap::new(),
            sidr_remote: BTreeMap::new(),
            listeners: BTreeSet::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            counters: CmCounters::default(),
        }
    }

    pub fn config(&self) -> &EndpointConfig {
        &self.cfg
    }

    /// `ib_cm_listen` on an exact service ID (REQ and SIDR_REQ alike).
    pub fn listen(&mut self, service_id: u64) -> Result<(), CmApiError> {
        if !self.listeners.insert(service_id) {
            return Err(CmApiError::AddrInUse(service_id));
        }
        Ok(())
    }

    pub fn unlisten(&mut self, service_id: u64) -> bool {
        self.listeners.remove(&service_id)
    }

    pub fn state(&self, id: ConnId) -> Option<State> {
        self.conns.get(&id.0).map(|c| c.state)
    }

    /// What the endpoint knows of a connection.
    pub fn conn_info(&self, id: ConnId) -> Option<ConnInfo> {
        self.conns.get(&id.0).map(|c| ConnInfo {
            state: c.state,
            peer: c.peer,
            service_id: c.service_id,
            remote_comm_id: c.remote_comm_id,
            remote_ca_guid: c.remote_ca_guid,
            remote_qpn: c.remote_qpn,
            local_qpn: c.local_qpn,
        })
    }

    /// Number of connections the endpoint tracks (timewait included).
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// The earliest time `handle_timeout` has work to do.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.conns.values().filter_map(|c| c.timer).min()
    }

    // ---- identifiers ----

    /// `cm_alloc_id_priv`: the next free cyclic ID XOR the random operand, as the CPU stores
    /// it; the wire value is its byte swap.
    fn alloc_id(&mut self) -> u32 {
        loop {
            let cpu = self.next_id ^ self.cfg.random_id_operand;
            self.next_id = self.next_id.wrapping_add(1);
            let wire = cpu.swap_bytes();
            // 0 means "no comm ID" in REJ; never hand it out.
            if wire != 0 && !self.conns.contains_key(&wire) {
                return wire;
            }
        }
    }

    /// `cm_form_tid`.
    fn own_tid(&self, local_comm_id: u32) -> u64 {
        (u64::from(self.cfg.hi_tid) << 32) | u64::from(local_comm_id.swap_bytes())
    }

    // ---- sending ----

    fn push(&mut self, peer: IpAddr, mad: [u8; MAD_LEN]) {
        self.transmits.push_back(Transmit { peer, mad });
    }

    fn encode(tid: u64, msg: CmMessage) -> Result<[u8; MAD_LEN], CmError> {
        CmMad::new(tid, msg).emit()
    }

    /// Sends `mad` and arms its retransmission on `conn`.
    fn send_with_retry(
        &mut self,
        now: u64,
        id: u32,
        mad: [u8; MAD_LEN],
        timeout_ms: u64,
        retries: u8,
    ) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.outstanding = Some(Outstanding {
                mad,
                timeout_ms,
                retries_left: retries,
            });
            c.timer = Some(now.saturating_add(timeout_ms.saturating_mul(NS_PER_MS)));
            let peer = c.peer;
            self.push(peer, mad);
        }
    }

    fn cancel(&mut self, id: u32) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.outstanding = None;
            c.timer = None;
        }
    }

    fn remove(&mut self, id: u32) {
        if let Some(c) = self.conns.remove(&id) {
            if self.remote_ids.get(&(c.remote_ca_guid, c.remote_comm_id)) == Some(&id) {
                self.remote_ids
                    .remove(&(c.remote_ca_guid, c.remote_comm_id));
            }
            if self.remote_qpns.get(&(c.remote_ca_guid, c.remote_qpn)) == Some(&id) {
                self.remote_qpns.remove(&(c.remote_ca_guid, c.remote_qpn));
            }
            self.sidr_remote.retain(|_, v| *v != id);
        }
    }

    fn enter_timewait(&mut self, now: u64, id: u32) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = State::Timewait;
            c.outstanding = None;
            c.timer =
                Some(now.saturating_add(cm_convert_to_ms(c.av_timeout).saturating_mul(NS_PER_MS)));
        }
    }

    fn event(&mut self, id: u32, ev: CmEvent) {
        if self.conns.get(&id).is_some_and(|c| c.destroyed) {
            return;
        }
        self.events.push_back(ev);
    }

    fn conn_mut(&mut self, id: ConnId) -> Result<&mut Conn, CmApiError> {
        self.conns
            .get_mut(&id.0)
            .ok_or(CmApiError::UnknownConn(id.0))
    }

    // ---- consumer calls ----

    /// `ib_send_cm_req`: sends a REQ and starts its retransmission.
    pub fn connect(&mut self, now: u64, p: ConnectParams) -> Result<ConnId, CmApiError> {
        let id = self.alloc_id();
        let tid = self.own_tid(id);
        let req = ReqRepr {
            local_comm_id: id,
            vendor_id: 0,
            service_id: p.service_id,
            local_ca_guid: self.cfg.ca_guid,
            local_qkey: 0,
            local_qpn: p.local_qpn,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: p.remote_cm_response_timeout,
            transport_type: p.transport_type,
            end_to_end_flow_control: p.flow_control,
            starting_psn: p.starting_psn,
            local_cm_response_timeout: p.local_cm_response_timeout,
            retry_count: p.retry_count,
            pkey: 0xffff,
            path_mtu: p.path_mtu,
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count,
            max_cm_retries: p.max_cm_retries,
            srq: p.srq,
            extended_transport_type: 0,
            primary_path: p.primary_path,
            alternate_path: CmPath::default(),
            sap_supported: false,
            private_data: p.private_data,
        };
        let mad = Self::encode(tid, CmMessage::Req(req))?;
        let timeout_ms = req_timeout_ms(p.packet_life_time, p.remote_cm_response_timeout);
        self.conns.insert(
            id,
            Conn {
                id,
                state: State::ReqSent,
                peer: p.peer,
                tid,
                service_id: p.service_id,
                local_qpn: p.local_qpn,
                remote_comm_id: 0,
                remote_ca_guid: 0,
                remote_qpn: 0,
                timeout_ms,
                max_cm_retries: p.max_cm_retries,
                av_timeout: p.packet_life_time.saturating_add(1).min(31),
                outstanding: None,
                timer: None,
                last_mra: None,
                last_rtu: None,
                dreq_tid: 0,
                destroyed: false,
            },
        );
        self.send_with_retry(now, id, mad, timeout_ms, p.max_cm_retries);
        Ok(ConnId(id))
    }

    /// `ib_send_cm_rep`: accepts a connection request.
    pub fn accept(&mut self, now: u64, id: ConnId, p: AcceptParams) -> Result<(), CmApiError> {
        let ca_guid = self.cfg.ca_guid;
        let ack_delay = self.cfg.ack_delay;
        let c = self.conn_mut(id)?;
        if !matches!(c.state, State::ReqRcvd | State::MraReqSent) {
            return Err(CmApiError::InvalidState(c.state));
        }
        let rep = RepRepr {
            local_comm_id: c.id,
            remote_comm_id: c.remote_comm_id,
            local_qkey: 0,
            local_qpn: p.local_qpn,
            vendor_id: 0,
            local_eecn: 0,
            starting_psn: p.starting_psn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: ack_delay,
            failover_accepted: 0,
            end_to_end_flow_control: p.flow_control,
            rnr_retry_count: p.rnr_retry_count.min(7),
            srq: p.srq,
            local_ca_guid: ca_guid,
            private_data: p.private_data,
        };
        let mad = Self::encode(c.tid, CmMessage::Rep(rep))?;
        c.state = State::RepSent;
        c.local_qpn = p.local_qpn;
        let (timeout_ms, retries) = (c.timeout_ms, c.max_cm_retries);
        self.send_with_retry(now, id.0, mad, timeout_ms, retries);
        Ok(())
    }

    /// `ib_send_cm_rtu`: completes an active connection after the consumer moved its QP to
    /// RTS; raises ESTABLISHED.
    pub fn send_rtu(
        &mut self,
        _now: u64,
        id: ConnId,
        private_data: &[u8],
    ) -> Result<(), CmApiError> {
        let c = self.conn_mut(id)?;
        if !matches!(c.state, State::RepRcvd | State::MraRepSent) {
            return Err(CmApiError::InvalidState(c.state));
        }
        let rtu = RtuRepr {
            local_comm_id: c.id,
            remote_comm_id: c.remote_comm_id,
            private_data: private_data.to_vec(),
        };
        let mad = Self::encode(c.tid, CmMessage::Rtu(rtu))?;
        c.state = State::Established;
        c.last_rtu = Some(mad);
        let peer = c.peer;
        self.push(peer, mad);
        self.event(id.0, CmEvent::Established { id });
        Ok(())
    }

    /// `ib_cm_notify(IB_EVENT_COMM_EST)`: the QP received data before the RTU (lost RTU).
    pub fn notify_comm_established(&mut self, _now: u64, id: ConnId) -> Result<(), CmApiError> {
        let c = self.conn_mut(id)?;
        match c.state {
            State::RepSent | State::MraRepRcvd => {
                c.state = State::Established;
                self.cancel(id.0);
                self.event(id.0, CmEvent::Established { id });
                Ok(())
            }
            State::Established => Ok(()),
            s => Err(CmApiError::InvalidState(s)),
        }
    }

    /// `ib_send_cm_rej`: refuses a REQ (before accept) or a REP (before RTU).
    pub fn reject(
        &mut self,
        now: u64,
        id: ConnId,
        reason: RejReason,
        ari: &[u8],
        private_data: &[u8],
    ) -> Result<(), CmApiError> {
        let c = self.conn_mut(id)?;
        let kind = match c.state {
            State::ReqRcvd | State::MraReqSent => msg_kind::REQ,
            State::RepRcvd | State::MraRepSent => msg_kind::REP,
            State::ReqSent | State::MraReqRcvd | State::RepSent | State::MraRepRcvd => {
                msg_kind::OTHER
            }
            s => return Err(CmApiError::InvalidState(s)),
        };
        let rej = RejRepr {
            local_comm_id: c.id,
            remote_comm_id: c.remote_comm_id,
            message_rejected: kind,
            reason,
            ari: ari.to_vec(),
            private_data: private_data.to_vec(),
        };
        let mad = Self::encode(c.tid, CmMessage::Rej(rej))?;
        let (peer, state) = (c.peer, c.state);
        self.push(peer, mad);
        // ib_send_cm_rej: after our REP went out the peer may have an active QP, so wait out
        // timewait; before that the ID simply goes back to idle.
        if matches!(state, State::RepSent | State::MraRepRcvd) {
            self.enter_timewait(now, id.0);
        } else {
            self.remove(id.0);
        }
        Ok(())
    }

    /// `rdma_disconnect`: DREQ from ESTABLISHED, or DREP when the peer's DREQ came first.
    pub fn disconnect(
        &mut self,
        now: u64,
        id: ConnId,
        private_data: &[u8],
    ) -> Result<(), CmApiError> {
        let own_tid = self.own_tid(id.0);
        let c = self.conn_mut(id)?;
        match c.state {
            State::Established => {
                let dreq = DreqRepr {
                    local_comm_id: c.id,
                    remote_comm_id: c.remote_comm_id,
                    remote_qpn_eecn: c.remote_qpn,
                    private_data: private_data.to_vec(),
                };
                let mad = Self::encode(own_tid, CmMessage::Dreq(dreq))?;
                c.state = State::DreqSent;
                let (t, r) = (c.timeout_ms, c.max_cm_retries);
                self.send_with_retry(now, id.0, mad, t, r);
                Ok(())
            }
            State::DreqRcvd => {
                let drep = RtuRepr {
                    local_comm_id: c.id,
                    remote_comm_id: c.remote_comm_id,
                    private_data: private_data.to_vec(),
                };
                let mad = Self::encode(c.dreq_tid, CmMessage::Drep(drep))?;
                let peer = c.peer;
                self.push(peer, mad);
                self.enter_timewait(now, id.0);
                Ok(())
            }
            s => Err(CmApiError::InvalidState(s)),
        }
    }

    /// `ib_destroy_cm_id`: the consumer is gone. Tells the peer as ib_cm does (REJ, DREQ or
    /// DREP by state) and keeps a connected ID in timewait, silently, so its QPN is not reused
    /// too early.
    pub fn destroy(&mut self, now: u64, id: ConnId) {
        let Some(c) = self.conns.get_mut(&id.0) else {
            return;
        };
        c.destroyed = true;
        let state = c.state;
        match state {
            State::ReqSent | State::MraReqRcvd => {
                let guid = self.cfg.ca_guid.to_be_bytes();
                let _ = self.reject(now, id, RejReason::TIMEOUT, &guid, &[]);
            }
            State::ReqRcvd
            | State::MraReqSent
            | State::RepRcvd
            | State::MraRepSent
            | State::RepSent
            | State::MraRepRcvd => {
                let _ = self.reject(now, id, RejReason::CONSUMER_DEFINED, &[], &[]);
            }
            State::Established => {
                // One DREQ, no retries: the ID goes straight to timewait.
                let _ = self.disconnect(now, id, &[]);
                self.enter_timewait(now, id.0);
            }
            State::DreqSent => self.enter_timewait(now, id.0),
            State::DreqRcvd => {
                let _ = self.disconnect(now, id, &[]);
            }
            State::Timewait => {}
            State::SidrReqSent | State::SidrReqRcvd => self.remove(id.0),
        }
    }

    /// `ib_send_cm_sidr_req`: resolves a UD service to a QPN and Q_Key.
    pub fn sidr_resolve(&mut self, now: u64, p: SidrParams) -> Result<ConnId, CmApiError> {
        let id = self.alloc_id();
        let tid = self.own_tid(id);
        let req = SidrReqRepr {
            request_id: id,
            pkey: p.pkey,
            service_id: p.service_id,
            private_data: p.private_data,
        };
        let mad = Self::encode(tid, CmMessage::SidrReq(req))?;
        self.conns.insert(
            id,
            Conn {
                id,
                state: State::SidrReqSent,
                peer: p.peer,
                tid,
                service_id: p.service_id,
                local_qpn: 0,
                remote_comm_id: 0,
                remote_ca_guid: 0,
                remote_qpn: 0,
                timeout_ms: p.timeout_ms,
                max_cm_retries: p.max_cm_retries,
                av_timeout: 0,
                outstanding: None,
                timer: None,
                last_mra: None,
                last_rtu: None,
                dreq_tid: 0,
                destroyed: false,
            },
        );
        self.send_with_retry(now, id, mad, p.timeout_ms, p.max_cm_retries);
        Ok(ConnId(id))
    }

    /// `ib_send_cm_sidr_rep`: answers a SIDR_REQ (status [`sidr_status`]).
    pub fn sidr_reply(
        &mut self,
        _now: u64,
        id: ConnId,
        status: u8,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<(), CmApiError> {
        let c = self.conn_mut(id)?;
        if c.state != State::SidrReqRcvd {
            return Err(CmApiError::InvalidState(c.state));
        }
        let rep = SidrRepRepr {
            request_id: c.remote_comm_id,
            status,
            vendor_id: 0,
            qpn,
            service_id: c.service_id,
            qkey,
            additional_info: Vec::new(),
            private_data: private_data.to_vec(),
        };
        let mad = Self::encode(c.tid, CmMessage::SidrRep(rep))?;
        let peer = c.peer;
        self.push(peer, mad);
        self.remove(id.0);
        Ok(())
    }

    // ---- time ----

    /// Retransmits what is due, gives up on what ran out of retries, ends timewaits.
    pub fn handle_timeout(&mut self, now: u64) {
        let due: Vec<u32> = self
            .conns
            .values()
            .filter(|c| c.timer.is_some_and(|t| t <= now))
            .map(|c| c.id)
            .collect();
        for id in due {
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            if c.state == State::Timewait {
                self.event(id, CmEvent::TimewaitExit { id: ConnId(id) });
                self.remove(id);
                continue;
            }
            match c.outstanding.as_mut() {
                Some(o) if o.retries_left > 0 => {
                    o.retries_left -= 1;
                    let (mad, t) = (o.mad, o.timeout_ms);
                    c.timer = Some(now.saturating_add(t.saturating_mul(NS_PER_MS)));
                    let peer = c.peer;
                    self.push(peer, mad);
                }
                _ => self.give_up(now, id),
            }
        }
    }

    /// `cm_process_send_error` after the last retry.
    fn give_up(&mut self, now: u64, id: u32) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        match c.state {
            State::ReqSent
            | State::MraReqRcvd
            | State::RepSent
            | State::MraRepRcvd
            | State::SidrReqSent => {
                self.event(id, CmEvent::Unreachable { id: ConnId(id) });
                self.remove(id);
            }
            State::DreqSent => {
                self.event(
                    id,
                    CmEvent::Disconnected {
                        id: ConnId(id),
                        cause: DisconnectCause::DreqTimeout,
                        private_data: Vec::new(),
                    },
                );
                self.enter_timewait(now, id);
            }
            _ => self.cancel(id),
        }
    }

    // ---- receiving ----

    /// Handles one received CM MAD from `peer` (the source address of its packet).
    /// Malformed MADs are returned as errors and otherwise ignored, as ib_mad drops them.
    pub fn handle_mad(&mut self, now: u64, peer: IpAddr, bytes: &[u8]) -> Result<(), CmError> {
        self.counters.mads_rcvd += 1;
        let before = self.footprint();
        let r = self.handle_mad_counted(now, peer, bytes);
        if r.is_err() {
            self.counters.mads_malformed += 1;
        } else if self.footprint() == before {
            self.counters.mads_ignored += 1;
        }
        r
    }

    /// What the MADs received so far did.
    pub fn counters(&self) -> CmCounters {
        self.counters
    }

    /// Everything a received MAD can change: queued MADs and events, connections and their
    /// states, timers.
    fn footprint(&self) -> (usize, usize, usize, u64) {
        let states = self.conns.values().fold(0u64, |h, c| {
            (h ^ u64::from(c.id) ^ (c.state as u64) << 32 ^ c.timer.unwrap_or(0))
                .wrapping_mul(0x100_0000_01b3)
        });
        (
            self.transmits.len(),
            self.events.len(),
            self.conns.len(),
            states,
        )
    }

    fn handle_mad_counted(&mut self, now: u64, peer: IpAddr, bytes: &[u8]) -> Result<(), CmError> {
        let mad = CmMad::parse(bytes)?;
        // ib_cm registers its MAD agent for class version 2 only; ib_mad drops the rest.
        if mad.header.class_version != super::msg::CM_CLASS_VERSION {
            return Err(CmError::BadClassVersion(mad.header.class_version));
        }
        let tid = mad.header.transaction_id;
        match mad.message {
            CmMessage::Req(req) => self.on_req(now, peer, tid, bytes, req),
            CmMessage::Mra(mra) => self.on_mra(now, mra),
            CmMessage::Rej(rej) => self.on_rej(now, rej),
            CmMessage::Rep(rep) => self.on_rep(peer, tid, bytes, rep),
            CmMessage::Rtu(rtu) => self.on_rtu(rtu),
            CmMessage::Dreq(dreq) => self.on_dreq(peer, tid, dreq),
            CmMessage::Drep(drep) => self.on_drep(now, drep),
            CmMessage::SidrReq(req) => self.on_sidr_req(peer, tid, req),
            CmMessage::SidrRep(rep) => self.on_sidr_rep(rep),
            // rxe has no alternate paths: LAP/APR are logged by the caller, not acted on.
            CmMessage::Lap(_) | CmMessage::Apr(_) => {}
        }
        Ok(())
    }

    /// `cm_issue_rej`: a REJ for a message no ID owns. Like ib_cm, the comm IDs are the
    /// received message's bytes 4..8 and 0..4, swapped.
    fn issue_rej(&mut self, peer: IpAddr, tid: u64, rcvd: &[u8], reason: RejReason, kind: u8) {
        let m = &rcvd[24..];
        let rej = RejRepr {
            local_comm_id: u32::from_be_bytes([m[4], m[5], m[6], m[7]]),
            remote_comm_id: u32::from_be_bytes([m[0], m[1], m[2], m[3]]),
            message_rejected: kind,
            reason,
            ari: Vec::new(),
            private_data: Vec::new(),
        };
        if let Ok(mad) = Self::encode(tid, CmMessage::Rej(rej)) {
            self.push(peer, mad);
        }
    }

    fn mra_for(&self, c: &Conn, kind: u8) -> Option<[u8; MAD_LEN]> {
        let mra = MraRepr {
            local_comm_id: c.id,
            remote_comm_id: c.remote_comm_id,
            message_mraed: kind,
            service_timeout: self.cfg.mra_service_timeout,
            private_data: Vec::new(),
        };
        Self::encode(c.tid, CmMessage::Mra(mra)).ok()
    }

    fn on_req(&mut self, now: u64, peer: IpAddr, tid: u64, bytes: &[u8], req: ReqRepr) {
        // Duplicate REQ (cm_dup_req_handler).
        if let Some(&id) = self.remote_ids.get(&(req.local_ca_guid, req.local_comm_id)) {
            self.on_dup_req(id);
            return;
        }
        // Stale connection: that remote QP is still connected here (cm_match_req).
        if let Some(&old) = self.remote_qpns.get(&(req.local_ca_guid, req.local_qpn)) {
            self.issue_rej(peer, tid, bytes, RejReason::STALE_CONN, msg_kind::REQ);
            if self.state(ConnId(old)) == Some(State::Established) {
                let _ = self.disconnect(now, ConnId(old), &[]);
            }
            return;
        }
        if !self.listeners.contains(&req.service_id) {
            self.issue_rej(
                peer,
                tid,
                bytes,
                RejReason::INVALID_SERVICE_ID,
                msg_kind::REQ,
            );
            return;
        }
        let id = self.alloc_id();
        // cm_format_paths_from_req: the path lifetime is the REQ's ACK timeout minus one, so
        // av.timeout is the ACK timeout itself.
        let av_timeout = req.primary_path.local_ack_timeout;
        self.conns.insert(
            id,
            Conn {
                id,
                state: State::ReqRcvd,
                peer,
                tid,
                service_id: req.service_id,
                local_qpn: 0,
                remote_comm_id: req.local_comm_id,
                remote_ca_guid: req.local_ca_guid,
                remote_qpn: req.local_qpn,
                timeout_ms: cm_convert_to_ms(req.local_cm_response_timeout),
                max_cm_retries: req.max_cm_retries,
                av_timeout,
                outstanding: None,
                timer: None,
                last_mra: None,
                last_rtu: None,
                dreq_tid: 0,
                destroyed: false,
            },
        );
        self.remote_ids
            .insert((req.local_ca_guid, req.local_comm_id), id);
        self.remote_qpns
            .insert((req.local_ca_guid, req.local_qpn), id);
        self.events.push_back(CmEvent::ConnectRequest {
            id: ConnId(id),
            service_id: req.service_id,
            peer,
            req: Box::new(req),
        });
    }

    fn on_dup_req(&mut self, id: u32) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let peer = c.peer;
        match c.state {
            // The delayed MRA rdma_cm armed goes out now.
            State::ReqRcvd | State::MraReqSent => {
                let mra = c.last_mra.or_else(|| self.mra_for(c, msg_kind::REQ));
                if let Some(mad) = mra {
                    self.push(peer, mad);
                    if let Some(c) = self.conns.get_mut(&id) {
                        c.state = State::MraReqSent;
                        c.last_mra = Some(mad);
                    }
                }
            }
            State::Timewait => {
                let rej = RejRepr {
                    local_comm_id: c.id,
                    remote_comm_id: c.remote_comm_id,
                    message_rejected: msg_kind::OTHER,
                    reason: RejReason::STALE_CONN,
                    ari: Vec::new(),
                    private_data: Vec::new(),
                };
                if let Ok(mad) = Self::encode(c.tid, CmMessage::Rej(rej)) {
                    self.push(peer, mad);
                }
            }
            _ => {}
        }
    }

    fn on_rep(&mut self, peer: IpAddr, tid: u64, bytes: &[u8], rep: RepRepr) {
        let Some(c) = self.conns.get(&rep.remote_comm_id) else {
            self.issue_rej(peer, tid, bytes, RejReason::INVALID_COMM_ID, msg_kind::REP);
            return;
        };
        let id = c.id;
        match c.state {
            State::ReqSent | State::MraReqRcvd => {
                // cm_rep_handler: the replying QP is still connected to us under another ID.
                // Tell the peer; our REQ stays outstanding.
                if self
                    .remote_qpns
                    .get(&(rep.local_ca_guid, rep.local_qpn))
                    .is_some_and(|&other| other != id)
                {
                    self.issue_rej(peer, tid, bytes, RejReason::STALE_CONN, msg_kind::REP);
                    return;
                }
                self.cancel(id);
                if let Some(c) = self.conns.get_mut(&id) {
                    c.state = State::RepRcvd;
                    c.remote_comm_id = rep.local_comm_id;
                    c.remote_ca_guid = rep.local_ca_guid;
                    c.remote_qpn = rep.local_qpn;
                }
                self.remote_ids
                    .insert((rep.local_ca_guid, rep.local_comm_id), id);
                self.remote_qpns
                    .insert((rep.local_ca_guid, rep.local_qpn), id);
                self.event(
                    id,
                    CmEvent::ConnectResponse {
                        id: ConnId(id),
                        rep: Box::new(rep),
                    },
                );
            }
            // cm_dup_rep_handler.
            _ if c.remote_comm_id != rep.local_comm_id => {}
            State::RepRcvd | State::MraRepSent => {
                let mra = c.last_mra.or_else(|| self.mra_for(c, msg_kind::REP));
                if let Some(mad) = mra {
                    let peer = c.peer;
                    self.push(peer, mad);
                    if let Some(c) = self.conns.get_mut(&id) {
                        c.state = State::MraRepSent;
                        c.last_mra = Some(mad);
                    }
                }
            }
            State::Established => {
                if let Some(mad) = c.last_rtu {
                    let peer = c.peer;
                    self.push(peer, mad);
                }
            }
            _ => {}
        }
    }

    /// Finds the connection a reply names: its remote comm ID is ours, its local comm ID the
    /// peer's (`cm_acquire_id(local, remote)`).
    fn acquire(&self, ours: u32, theirs: u32) -> Option<u32> {
        self.conns
            .get(&ours)
            .filter(|c| c.remote_comm_id == theirs)
            .map(|c| c.id)
    }

    fn on_rtu(&mut self, rtu: RtuRepr) {
        let Some(id) = self.acquire(rtu.remote_comm_id, rtu.local_comm_id) else {
            return;
        };
        if matches!(
            self.conns.get(&id).map(|c| c.state),
            Some(State::RepSent | State::MraRepRcvd)
        ) {
            self.cancel(id);
            if let Some(c) = self.conns.get_mut(&id) {
                c.state = State::Established;
            }
            self.event(id, CmEvent::Established { id: ConnId(id) });
        }
    }

    fn on_mra(&mut self, now: u64, mra: MraRepr) {
        let Some(c) = self.conns.get_mut(&mra.remote_comm_id) else {
            return;
        };
        let next = match (c.state, mra.message_mraed) {
            (State::ReqSent, msg_kind::REQ) => State::MraReqRcvd,
            (State::RepSent, msg_kind::REP) if c.remote_comm_id == mra.local_comm_id => {
                State::MraRepRcvd
            }
            _ => return,
        };
        // cm_mra_handler: the outstanding message now waits the peer's service timeout plus
        // the path's lifetime before its next retry.
        let wait = cm_convert_to_ms(mra.service_timeout) + cm_convert_to_ms(c.av_timeout);
        c.state = next;
        if let Some(o) = c.outstanding.as_mut() {
            o.timeout_ms = wait;
        }
        c.timer = Some(now.saturating_add(wait.saturating_mul(NS_PER_MS)));
    }

    fn on_rej(&mut self, now: u64, rej: RejRepr) {
        let Some(c) = self.conns.get(&rej.remote_comm_id) else {
            return;
        };
        // A REJ of our REQ comes before we know the peer's comm ID (it may be 0).
        if rej.message_rejected != msg_kind::REQ && c.remote_comm_id != rej.local_comm_id {
            return;
        }
        let id = c.id;
        let state = c.state;
        let ev = CmEvent::Rejected {
            id: ConnId(id),
            reason: rej.reason,
            ari: rej.ari,
            private_data: rej.private_data,
        };
        match state {
            State::ReqSent | State::MraReqRcvd | State::RepSent | State::MraRepRcvd => {
                self.event(id, ev);
                if rej.reason == RejReason::STALE_CONN {
                    self.enter_timewait(now, id);
                } else {
                    self.remove(id);
                }
            }
            State::RepRcvd | State::MraRepSent | State::Established => {
                self.event(id, ev);
                self.enter_timewait(now, id);
            }
            _ => {}
        }
    }

    fn on_dreq(&mut self, peer: IpAddr, tid: u64, dreq: DreqRepr) {
        let Some(id) = self.acquire(dreq.remote_comm_id, dreq.local_comm_id) else {
            // cm_issue_drep: answer a DREQ for a connection we forgot.
            let drep = RtuRepr {
                local_comm_id: dreq.remote_comm_id,
                remote_comm_id: dreq.local_comm_id,
                private_data: Vec::new(),
            };
            if let Ok(mad) = Self::encode(tid, CmMessage::Drep(drep)) {
                self.push(peer, mad);
            }
            return;
        };
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if dreq.remote_qpn_eecn != c.local_qpn {
            return;
        }
        match c.state {
            State::RepSent | State::MraRepRcvd | State::Established | State::DreqSent => {
                c.state = State::DreqRcvd;
                c.dreq_tid = tid;
                self.cancel(id);
                self.event(
                    id,
                    CmEvent::Disconnected {
                        id: ConnId(id),
                        cause: DisconnectCause::DreqReceived,
                        private_data: dreq.private_data,
                    },
                );
            }
            // Our DREP was lost: send it again.
            State::Timewait => {
                let drep = RtuRepr {
                    local_comm_id: c.id,
                    remote_comm_id: c.remote_comm_id,
                    private_data: Vec::new(),
                };
                let peer = c.peer;
                if let Ok(mad) = Self::encode(tid, CmMessage::Drep(drep)) {
                    self.push(peer, mad);
                }
            }
            _ => {}
        }
    }

    fn on_drep(&mut self, now: u64, drep: RtuRepr) {
        let Some(id) = self.acquire(drep.remote_comm_id, drep.local_comm_id) else {
            return;
        };
        if self.state(ConnId(id)) == Some(State::DreqSent) {
            self.event(
                id,
                CmEvent::Disconnected {
                    id: ConnId(id),
                    cause: DisconnectCause::DrepReceived,
                    private_data: drep.private_data,
                },
            );
            self.enter_timewait(now, id);
        }
    }

    fn on_sidr_req(&mut self, peer: IpAddr, tid: u64, req: SidrReqRepr) {
        if self.sidr_remote.contains_key(&(peer, req.request_id)) {
            return; // a retransmission of a request the consumer is still answering
        }
        if !self.listeners.contains(&req.service_id) {
            // cm_reject_sidr_req(IB_SIDR_UNSUPPORTED).
            let rep = SidrRepRepr {
                request_id: req.request_id,
                status: sidr_status::UNSUPPORTED,
                vendor_id: 0,
                qpn: 0,
                service_id: req.service_id,
                qkey: 0,
                additional_info: Vec::new(),
                private_data: Vec::new(),
            };
            if let Ok(mad) = Self::encode(tid, CmMessage::SidrRep(rep)) {
                self.push(peer, mad);
            }
            return;
        }
        let id = self.alloc_id();
        self.conns.insert(
            id,
            Conn {
                id,
                state: State::SidrReqRcvd,
                peer,
                tid,
                service_id: req.service_id,
                local_qpn: 0,
                remote_comm_id: req.request_id,
                remote_ca_guid: 0,
                remote_qpn: 0,
                timeout_ms: 0,
                max_cm_retries: 0,
                av_timeout: 0,
                outstanding: None,
                timer: None,
                last_mra: None,
                last_rtu: None,
                dreq_tid: 0,
                destroyed: false,
            },
        );
        self.sidr_remote.insert((peer, req.request_id), id);
        self.events.push_back(CmEvent::SidrRequest {
            id: ConnId(id),
            service_id: req.service_id,
            peer,
            req: Box::new(req),
        });
    }

    fn on_sidr_rep(&mut self, rep: SidrRepRepr) {
        let id = rep.request_id;
        if self.state(ConnId(id)) != Some(State::SidrReqSent) {
            return;
        }
        self.event(
            id,
            CmEvent::SidrResponse {
                id: ConnId(id),
                rep: Box::new(rep),
            },
        );
        self.remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comm_ids_and_tids_follow_linux() {
        // rping.pcap: hi_tid 2, first REQ comm ID on the wire 74 ba c2 8e, TID 0x2_8ec2ba74;
        // the next IDs (ucmatose, ib_send_bw -R) were 75…, 76…, 77… in the first byte.
        let mut ep = CmEndpoint::new(EndpointConfig::new(1, 2, 0x8ec2_ba74));
        let a = ep.alloc_id();
        assert_eq!(a, 0x74ba_c28e);
        assert_eq!(ep.own_tid(a), 0x0000_0002_8ec2_ba74);
        assert_eq!(ep.alloc_id(), 0x75ba_c28e);
    }

    #[test]
    fn timeouts_follow_ib_cm() {
        assert_eq!(cm_convert_to_ms(20), 4096);
        assert_eq!(cm_convert_to_ms(3), 1);
        assert_eq!(req_timeout_ms(16, 20), 4608);
        assert_eq!(req_timeout_ms(18, 20), 6144);
    }
}
