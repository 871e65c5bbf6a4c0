//! A deterministic network simulator for the transport engine (feature `testing`), in the
//! spirit of s2n-quic's: devices joined by links with seeded, per-direction models of delay,
//! jitter (hence reordering), loss, duplication, corruption and a bottleneck queue that marks
//! ECN; virtual time; a scenario API to drop, duplicate, delay or corrupt one chosen packet;
//! invariant checks; and a pcap of everything carried.
//!
//! Every random choice comes from one seeded generator, so a run is replayed exactly from its
//! seed, which every failure message prints.

mod bottleneck;
pub mod hostile;
mod pcap;
mod rng;

pub use bottleneck::{jain_index, BottleneckModel, BottleneckStats, Forwarded, Red};
pub use pcap::PcapWriter;
pub use rng::SimRng;

use bottleneck::Bottleneck;

use crate::transport::*;
use crate::types::{Psn, Qpn};
use crate::wire::{FrameRepr, OpInfo, Opcode};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::IpAddr;

/// Where a packet in flight goes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hop {
    /// To the node.
    Deliver,
    /// Into the switch port in front of the node.
    Bottleneck,
    /// Out of that port (its last bit leaves).
    Depart,
}

/// One direction of a link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkModel {
    pub delay: Nanos,
    /// Extra delay drawn uniformly from [0, jitter): packets overtake each other.
    pub jitter: Nanos,
    pub loss: f64,
    pub duplicate: f64,
    /// Probability of flipping one bit the ICRC covers.
    pub corrupt: f64,
    /// The link's rate in bits per second (None = infinitely fast). A node sends onto
    /// rate-limited links as a NIC does: it hands over its next packet only when its links
    /// are free, so that a rate limiter in the engine decides what goes next (not a deep
    /// queue in front of the wire). Duplicates still queue behind their original.
    pub rate_bps: Option<u64>,
    /// Mark CE on ECN-capable packets when the bottleneck queue holds more bytes than this.
    pub ecn_threshold: Option<u64>,
    /// Packets longer than this (IP packet length) are dropped, like a link MTU with DF.
    pub mtu: usize,
}

impl Default for LinkModel {
    fn default() -> Self {
        LinkModel {
            delay: 2_000,
            jitter: 0,
            loss: 0.0,
            duplicate: 0.0,
            corrupt: 0.0,
            rate_bps: None,
            ecn_threshold: None,
            mtu: 9000,
        }
    }
}

/// What the scenario API sees of a packet when it is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketInfo {
    pub from: usize,
    pub to: usize,
    pub opcode: Opcode,
    pub psn: Psn,
    pub dest_qpn: Qpn,
    pub ack_req: bool,
    /// Syndrome byte of the AETH, if the packet has one.
    pub syndrome: Option<u8>,
    pub len: usize,
    /// How many packets the simulator carried before this one.
    pub index: u64,
    /// Virtual time it was sent.
    pub time: Nanos,
    /// The IPv4 TOS / IPv6 traffic class it was sent with (ECN in the low two bits).
    pub traffic_class: u8,
    /// Framed as RoCE v1 (a GRH) rather than v2 (IP/UDP).
    pub roce_v1: bool,
}

/// What a scenario rule does to the packet it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Drop,
    Duplicate,
    Delay(Nanos),
    Corrupt,
}

type Matcher = Box<dyn FnMut(&PacketInfo) -> bool>;

struct Rule {
    matcher: Matcher,
    action: Action,
    remaining: usize,
}

/// A node: a device, its memory, and a default PD and CQ.
#[derive(Debug)]
pub struct Node {
    pub dev: Engine<VecMemory>,
    pub pd: u32,
    pub cq: u32,
    pub ip: IpAddr,
}

/// Per-QP setup of [`Sim::connect`].
#[derive(Debug, Clone, Copy)]
pub struct QpOptions {
    pub qp_type: QpType,
    pub mtu: Mtu,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    pub access: Access,
    pub sq_psn: u32,
    pub rq_psn: u32,
    pub traffic_class: u8,
    pub srq: Option<u32>,
    /// The local GID the QP's path leaves from (its type sets the framing).
    pub sgid_index: u8,
    /// How RC QPs recover losses (go-back-N, as rxe, unless a test says otherwise).
    pub loss_recovery: LossRecovery,
}

impl Default for QpOptions {
    fn default() -> Self {
        QpOptions {
            qp_type: QpType::Rc,
            mtu: Mtu::Mtu1024,
            timeout: 10, // 4.2 ms
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 4,
            access: Access::ALL_REMOTE.union(Access::LOCAL_WRITE),
            sq_psn: 0,
            rq_psn: 0,
            traffic_class: 0,
            srq: None,
            sgid_index: 0,
            loss_recovery: LossRecovery::GoBackN,
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct FlowPsn {
    last: Option<Psn>,
    retries_seen: u64,
}

/// A work request the simulator saw posted, waiting for its completion.
#[derive(Debug, Clone, Copy)]
struct Posted {
    wr_id: u64,
    signaled: bool,
}

/// The simulated network.
pub struct Sim {
    pub seed: u64,
    pub now: Nanos,
    pub nodes: Vec<Node>,
    links: Vec<Vec<LinkModel>>,
    busy_until: Vec<Vec<Nanos>>,
    /// When each node's rate-limited links are all free again.
    nic_busy_until: Vec<Nanos>,
    rng: SimRng,
    in_flight: BinaryHeap<Reverse<(Nanos, u64)>>,
    payloads: HashMap<u64, (usize, Vec<u8>, Hop)>,
    /// Switch ports in front of nodes ([`Sim::set_bottleneck`]).
    bottlenecks: HashMap<usize, Bottleneck>,
    next_seq: u64,
    carried: u64,
    rules: Vec<Rule>,
    pcap: Option<PcapWriter>,
    flows: HashMap<(usize, IpAddr, Qpn), FlowPsn>,
    posted: HashMap<(usize, Qpn, bool), VecDeque<Posted>>,
    destroyed: Vec<(usize, Qpn)>,
    /// Every completion seen, per node, in the order the CQs gave them.
    pub completions: Vec<(usize, WorkCompletion)>,
    /// Invariant violations; [`Sim::check`] panics with them and the seed.
    pub violations: Vec<String>,
    /// Every packet's info, in send order (for scenario assertions).
    pub trace: Vec<PacketInfo>,
}

impl core::fmt::Debug for Sim {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Sim")
            .field("seed", &self.seed)
            .field("now", &self.now)
            .finish()
    }
}

impl Sim {
    pub fn new(seed: u64) -> Sim {
        Sim {
            seed,
            now: 0,
            nodes: Vec::new(),
            links: Vec::new(),
            busy_until: Vec::new(),
            nic_busy_until: Vec::new(),
            rng: SimRng::new(seed),
            in_flight: BinaryHeap::new(),
            payloads: HashMap::new(),
            bottlenecks: HashMap::new(),
            next_seq: 0,
            carried: 0,
            rules: Vec::new(),
            pcap: None,
            flows: HashMap::new(),
            posted: HashMap::new(),
            destroyed: Vec::new(),
            completions: Vec::new(),
            violations: Vec::new(),
            trace: Vec::new(),
        }
    }

    /// Adds a node with address `ip` (its GID 0, RoCE v2); every link to and from it gets
    /// `link`.
    pub fn add_node(&mut self, ip: IpAddr, link: LinkModel) -> usize {
        self.add_node_of(ip, GidType::RoceV2, link)
    }

    /// [`Sim::add_node`] with a GID 0 of type `gid_type`: a RoCE v1 node sends and receives
    /// GRH-framed packets (the links carry them as they carry IP packets).
    pub fn add_node_of(&mut self, ip: IpAddr, gid_type: GidType, link: LinkModel) -> usize {
        self.add_node_with_gids(ip, &[gid_type], link)
    }

    /// [`Sim::add_node`] with the GID table `ip` once per entry of `types` (as a device of
    /// `--roce both` lists each address once as RoCE v1 and once as v2).
    pub fn add_node_with_gids(&mut self, ip: IpAddr, types: &[GidType], link: LinkModel) -> usize {
        let idx = self.nodes.len();
        let mut config = EngineConfig::new(ip, self.seed ^ ((idx as u64 + 1) * 0x1234_5678));
        config.gids = vec![ip; types.len().max(1)];
        config.gid_types = types.to_vec();
        let mut dev = Engine::new(config, VecMemory::new());
        let pd = dev.alloc_pd();
        let cq = dev.create_cq(4096).expect("create CQ");
        self.nodes.push(Node { dev, pd, cq, ip });
        for row in &mut self.links {
            row.push(link);
        }
        self.links.push(vec![link; idx + 1]);
        for row in &mut self.busy_until {
            row.push(0);
        }
        self.busy_until.push(vec![0; idx + 1]);
        self.nic_busy_until.push(0);
        idx
    }

    /// Two nodes at 10.0.0.1 and 10.0.0.2 joined by `link` both ways.
    pub fn pair(seed: u64, link: LinkModel) -> Sim {
        let mut s = Sim::new(seed);
        s.add_node("10.0.0.1".parse().expect("ip"), link);
        s.add_node("10.0.0.2".parse().expect("ip"), link);
        s
    }

    /// Two RoCE v1 nodes with GIDs ::ffff:10.0.0.1 and ::ffff:10.0.0.2 joined by `link`.
    pub fn pair_v1(seed: u64, link: LinkModel) -> Sim {
        let mut s = Sim::new(seed);
        s.add_node_of("10.0.0.1".parse().expect("ip"), GidType::RoceV1, link);
        s.add_node_of("10.0.0.2".parse().expect("ip"), GidType::RoceV1, link);
        s
    }

    /// Two nodes at fd00::1 and fd00::2 (RoCE v2 over IPv6) joined by `link` both ways.
    pub fn pair_v6(seed: u64, link: LinkModel) -> Sim {
        let mut s = Sim::new(seed);
        s.add_node("fd00::1".parse().expect("ip"), link);
        s.add_node("fd00::2".parse().expect("ip"), link);
        s
    }

    pub fn set_link(&mut self, from: usize, to: usize, link: LinkModel) {
        self.links[from][to] = link;
    }

    /// Puts a switch port in front of `node`: every packet to it, from any sender, queues
    /// there after its own link (see [`BottleneckModel`]).
    pub fn set_bottleneck(&mut self, node: usize, model: BottleneckModel) {
        self.bottlenecks.insert(node, Bottleneck::new(model));
    }

    /// What the port in front of `node` did so far.
    pub fn bottleneck(&self, node: usize) -> Option<&BottleneckStats> {
        self.bottlenecks.get(&node).map(|b| &b.stats)
    }

    /// Records every carried packet from now on.
    pub fn capture(&mut self) {
        self.pcap = Some(PcapWriter::new());
    }

    pub fn pcap_bytes(&self) -> Option<&[u8]> {
        self.pcap.as_ref().map(|p| p.bytes())
    }

    /// Applies `action` to the next `count` packets `matcher` accepts.
    pub fn on_packet(
        &mut self,
        count: usize,
        action: Action,
        matcher: impl FnMut(&PacketInfo) -> bool + 'static,
    ) {
        self.rules.push(Rule {
            matcher: Box::new(matcher),
            action,
            remaining: count,
        });
    }

    /// Drops the next packet `matcher` accepts.
    pub fn drop_once(&mut self, matcher: impl FnMut(&PacketInfo) -> bool + 'static) {
        self.on_packet(1, Action::Drop, matcher);
    }

    pub fn dev(&mut self, node: usize) -> &mut Engine<VecMemory> {
        &mut self.nodes[node].dev
    }

    /// Allocates `len` bytes on `node` and registers them; returns (address, keys).
    pub fn alloc_mr(&mut self, node: usize, len: usize, access: Access) -> (u64, MrKeys) {
        let n = &mut self.nodes[node];
        let addr = n.dev.memory_mut().alloc(len);
        let keys = n
            .dev
            .reg_mr(n.pd, addr, len as u64, access)
            .expect("reg_mr");
        (addr, keys)
    }

    pub fn write_mem(&mut self, node: usize, addr: u64, data: &[u8]) {
        self.nodes[node].dev.memory_mut().fill(addr, data);
    }

    pub fn read_mem(&self, node: usize, addr: u64, len: usize) -> Vec<u8> {
        self.nodes[node]
            .dev
            .memory()
            .slice(addr, len)
            .map(<[u8]>::to_vec)
            .unwrap_or_default()
    }

    /// Creates a QP on `node` with the node's PD and CQ.
    pub fn create_qp(&mut self, node: usize, o: &QpOptions) -> Qpn {
        let n = &mut self.nodes[node];
        n.dev
            .create_qp(QpInit {
                pd: n.pd,
                qp_type: o.qp_type,
                send_cq: n.cq,
                recv_cq: n.cq,
                srq: o.srq,
                cap: QpCap::default(),
                sq_sig_all: false,
            })
            .expect("create_qp")
    }

    /// Brings a QP through INIT, RTR and RTS towards `remote` (RC/UC) with the attributes
    /// rdma_cm would use.
    pub fn bring_up(
        &mut self,
        node: usize,
        qpn: Qpn,
        remote_node: usize,
        remote_qpn: Qpn,
        o: &QpOptions,
    ) {
        let ip = self.nodes[remote_node].ip;
        let dev = &mut self.nodes[node].dev;
        let mut a = QpAttr {
            qp_state: QpState::Init,
            qp_access_flags: o.access,
            qkey: crate::types::Qkey(0x1111_1111),
            ..Default::default()
        };
        let ud = o.qp_type == QpType::Ud;
        let init_mask = if ud {
            AttrMask::STATE
                .union(AttrMask::PKEY_INDEX)
                .union(AttrMask::PORT)
                .union(AttrMask::QKEY)
        } else {
            AttrMask::STATE
                .union(AttrMask::PKEY_INDEX)
                .union(AttrMask::PORT)
                .union(AttrMask::ACCESS_FLAGS)
        };
        dev.modify_qp(qpn, &a, init_mask).expect("to INIT");
        a.qp_state = QpState::Rtr;
        a.path_mtu = o.mtu;
        a.dest_qp_num = remote_qpn;
        a.rq_psn = Psn::new(o.rq_psn);
        a.max_dest_rd_atomic = o.max_rd_atomic;
        a.min_rnr_timer = o.min_rnr_timer;
        let mut av = AddressVector::new(ip);
        av.traffic_class = o.traffic_class;
        av.sgid_index = o.sgid_index;
        a.ah_attr = Some(av);
        let rtr = match o.qp_type {
            QpType::Ud | QpType::Gsi => AttrMask::STATE,
            QpType::Uc => AttrMask::STATE
                .union(AttrMask::AV)
                .union(AttrMask::PATH_MTU)
                .union(AttrMask::DEST_QPN)
                .union(AttrMask::RQ_PSN),
            QpType::Rc => AttrMask::STATE
                .union(AttrMask::AV)
                .union(AttrMask::PATH_MTU)
                .union(AttrMask::DEST_QPN)
                .union(AttrMask::RQ_PSN)
                .union(AttrMask::MAX_DEST_RD_ATOMIC)
                .union(AttrMask::MIN_RNR_TIMER),
        };
        dev.modify_qp(qpn, &a, rtr).expect("to RTR");
        // At RTR, where the daemon chooses it (then RTS sets the send PSN).
        if o.qp_type == QpType::Rc {
            dev.set_loss_recovery(qpn, o.loss_recovery)
                .expect("loss recovery");
        }
        a.qp_state = QpState::Rts;
        a.sq_psn = Psn::new(o.sq_psn);
        a.timeout = o.timeout;
        a.retry_cnt = o.retry_cnt;
        a.rnr_retry = o.rnr_retry;
        a.max_rd_atomic = o.max_rd_atomic;
        let rts = if o.qp_type == QpType::Rc {
            AttrMask::STATE
                .union(AttrMask::TIMEOUT)
                .union(AttrMask::RETRY_CNT)
                .union(AttrMask::RNR_RETRY)
                .union(AttrMask::SQ_PSN)
                .union(AttrMask::MAX_QP_RD_ATOMIC)
        } else {
            AttrMask::STATE.union(AttrMask::SQ_PSN)
        };
        dev.modify_qp(qpn, &a, rts).expect("to RTS");
    }

    /// Creates and connects a QP pair between `a` and `b`; PSNs of each direction match.
    pub fn connect(&mut self, a: usize, b: usize, o: &QpOptions) -> (Qpn, Qpn) {
        let qa = self.create_qp(a, o);
        let qb = self.create_qp(b, o);
        let ob = QpOptions {
            sq_psn: o.rq_psn,
            rq_psn: o.sq_psn,
            ..*o
        };
        self.bring_up(a, qa, b, qb, o);
        self.bring_up(b, qb, a, qa, &ob);
        (qa, qb)
    }

    /// Posts a send WR and remembers it for the completion invariants.
    pub fn post_send(&mut self, node: usize, qpn: Qpn, wr: SendWr) -> VerbsResult<()> {
        let signaled = wr.flags.contains(SendFlags::SIGNALED);
        let id = wr.wr_id;
        self.nodes[node].dev.post_send(qpn, wr)?;
        self.posted
            .entry((node, qpn, false))
            .or_default()
            .push_back(Posted {
                wr_id: id,
                signaled,
            });
        Ok(())
    }

    /// Posts a receive WR and remembers it.
    pub fn post_recv(&mut self, node: usize, qpn: Qpn, wr: RecvWr) -> VerbsResult<()> {
        let id = wr.wr_id;
        self.nodes[node].dev.post_recv(qpn, wr)?;
        self.posted
            .entry((node, qpn, true))
            .or_default()
            .push_back(Posted {
                wr_id: id,
                signaled: true,
            });
        Ok(())
    }

    /// Destroys a QP; a completion for it after this is a violation.
    pub fn destroy_qp(&mut self, node: usize, qpn: Qpn) {
        self.drain_completions();
        self.nodes[node].dev.destroy_qp(qpn).expect("destroy_qp");
        self.destroyed.push((node, qpn));
        self.posted.remove(&(node, qpn, false));
        self.posted.remove(&(node, qpn, true));
    }

    fn violation(&mut self, msg: String) {
        self.violations.push(msg);
    }

    /// Moves every CQ entry into `completions`, checking exactly-once and in-order.
    pub fn drain_completions(&mut self) {
        for i in 0..self.nodes.len() {
            let cq = self.nodes[i].cq;
            while let Some(wc) = self.nodes[i].dev.poll_cq(cq) {
                self.account(i, wc);
                self.completions.push((i, wc));
            }
        }
    }

    fn account(&mut self, node: usize, wc: WorkCompletion) {
        if self.destroyed.contains(&(node, wc.qp_num)) {
            self.violation(format!("node {node}: completion {wc:?} after destroy"));
            return;
        }
        let is_recv = matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
        let Some(q) = self.posted.get_mut(&(node, wc.qp_num, is_recv)) else {
            // Not posted through the simulator (an SRQ, say): nothing to check.
            return;
        };
        // Unsignaled successes before it complete silently (IBTA §10.8.3.4).
        loop {
            match q.front().copied() {
                Some(p) if p.wr_id == wc.wr_id => {
                    q.pop_front();
                    return;
                }
                Some(p) if !p.signaled && !is_recv => {
                    q.pop_front();
                }
                _ => break,
            }
        }
        let expected = q.front().map(|p| p.wr_id);
        self.violation(format!(
            "node {node} QP {}: completion for wr {} ({:?}) out of order or twice, expected {expected:?}",
            wc.qp_num, wc.wr_id, wc.status
        ));
    }

    /// Send WRs still waiting for a completion on `node`/`qpn` (signaled ones).
    pub fn outstanding(&self, node: usize, qpn: Qpn) -> usize {
        self.posted
            .get(&(node, qpn, false))
            .map_or(0, |q| q.iter().filter(|p| p.signaled).count())
    }

    /// Panics, with the seed, if any invariant was violated.
    pub fn check(&self) {
        if !self.violations.is_empty() {
            panic!(
                "simulation seed {} violated invariants:\n{}",
                self.seed,
                self.violations.join("\n")
            );
        }
    }

    /// Checks that every signaled send WR got its completion.
    pub fn check_all_sends_completed(&mut self) {
        self.drain_completions();
        let mut missing = Vec::new();
        for ((node, qpn, recv), q) in &self.posted {
            if !recv && q.iter().any(|p| p.signaled) {
                missing.push(format!(
                    "node {node} QP {qpn}: {} send WRs never completed",
                    q.len()
                ));
            }
        }
        self.violations.extend(missing);
        self.check();
    }

    fn route(&self, dst: IpAddr) -> Option<usize> {
        self.nodes.iter().position(|n| n.ip == dst)
    }

    /// Carries one packet sent by `from` onto the link towards its destination.
    fn carry(&mut self, from: usize, bytes: &[u8]) {
        let Ok(parsed) = FrameRepr::parse_network(bytes, bytes.len()) else {
            self.violation(format!("node {from} sent an unparsable packet"));
            return;
        };
        if parsed.verified().is_err() {
            self.violation(format!("node {from} sent a packet with a bad ICRC"));
        }
        let dst = parsed.repr.net.dst_addr();
        let t = parsed.repr.transport;
        if let Some(p) = &mut self.pcap {
            p.record(self.now, from, bytes);
        }
        let targets: Vec<usize> = if dst.is_multicast() {
            (0..self.nodes.len()).filter(|&i| i != from).collect()
        } else {
            self.route(dst).into_iter().collect()
        };
        // PSN invariant: an RC request PSN moves backward only after a retry was started.
        let info = t.bth.opcode.info();
        if t.bth.opcode.0 < 0x20 && info.is_some_and(|i| i.has(OpInfo::REQUEST)) {
            // Retries of the sending QP itself (found by its path), so that one QP's retry
            // cannot excuse another's PSN going backward.
            let dev = &self.nodes[from].dev;
            let retries = dev
                .qp_towards(dst, t.bth.dest_qpn)
                .and_then(|q| dev.qp_retry_events(q))
                .unwrap_or(0);
            let flow = self.flows.entry((from, dst, t.bth.dest_qpn)).or_default();
            if let Some(last) = flow.last {
                if !t.bth.psn.is_after(last) {
                    if retries <= flow.retries_seen {
                        let msg = format!(
                            "node {from}: PSN moved back from {last} to {} to QP {} without a NAK or timeout",
                            t.bth.psn, t.bth.dest_qpn
                        );
                        self.violations.push(msg);
                    }
                    let flow = self.flows.entry((from, dst, t.bth.dest_qpn)).or_default();
                    flow.retries_seen = retries;
                }
            }
            let flow = self.flows.entry((from, dst, t.bth.dest_qpn)).or_default();
            flow.last = Some(t.bth.psn);
        }
        for to in targets {
            let pi = PacketInfo {
                from,
                to,
                opcode: t.bth.opcode,
                psn: t.bth.psn,
                dest_qpn: t.bth.dest_qpn,
                ack_req: t.bth.ack_req,
                syndrome: t.aeth.map(|a| a.syndrome.to_byte()),
                len: bytes.len(),
                index: self.carried,
                time: self.now,
                traffic_class: parsed.repr.net.traffic_class(),
                roce_v1: parsed.repr.net.is_v1(),
            };
            self.carried += 1;
            self.trace.push(pi);
            let mut action = None;
            for r in &mut self.rules {
                if r.remaining > 0 && (r.matcher)(&pi) {
                    r.remaining -= 1;
                    action = Some(r.action);
                    break;
                }
            }
            let link = self.links[from][to];
            let mut copies = 1;
            let mut extra_delay = 0;
            let mut corrupt = false;
            match action {
                Some(Action::Drop) => continue,
                Some(Action::Duplicate) => copies = 2,
                Some(Action::Delay(d)) => extra_delay = d,
                Some(Action::Corrupt) => corrupt = true,
                None => {}
            }
            if bytes.len() > link.mtu || self.rng.chance(link.loss) {
                continue;
            }
            if self.rng.chance(link.duplicate) {
                copies += 1;
            }
            for _ in 0..copies {
                let mut b = bytes.to_vec();
                if corrupt || self.rng.chance(link.corrupt) {
                    corrupt_covered_bit(&mut b, &mut self.rng);
                }
                let mut at = self.now;
                if let Some(rate) = link.rate_bps {
                    let tx = (b.len() as u64 * 8 * 1_000_000_000) / rate.max(1);
                    let start = self.busy_until[from][to].max(self.now);
                    let queued_bytes = (start - self.now) * rate / 8 / 1_000_000_000;
                    self.busy_until[from][to] = start + tx;
                    self.nic_busy_until[from] = self.nic_busy_until[from].max(start + tx);
                    at = start + tx;
                    if link.ecn_threshold.is_some_and(|th| queued_bytes > th) {
                        crate::wire::ecn::mark_ce(&mut b);
                    }
                }
                let jitter = if link.jitter > 0 {
                    self.rng.below(link.jitter)
                } else {
                    0
                };
                at += link.delay + jitter + extra_delay;
                let hop = if self.bottlenecks.contains_key(&to) {
                    Hop::Bottleneck
                } else {
                    Hop::Deliver
                };
                self.schedule(at, to, b, hop);
            }
        }
    }

    /// Delivers a hand-made IP packet to node `to` after `delay` (bypassing links and rules):
    /// for scenarios that need a packet no correct engine would send.
    pub fn inject(&mut self, to: usize, delay: Nanos, ip_packet: Vec<u8>) {
        self.schedule(self.now + delay, to, ip_packet, Hop::Deliver);
    }

    fn schedule(&mut self, at: Nanos, to: usize, packet: Vec<u8>, hop: Hop) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.payloads.insert(seq, (to, packet, hop));
        self.in_flight.push(Reverse((at, seq)));
    }

    /// Lets every node transmit what it has, at the current time.
    fn transmit_all(&mut self) {
        let mut buf = vec![0u8; MAX_FRAME_LEN];
        for i in 0..self.nodes.len() {
            while self.nic_busy_until[i] <= self.now {
                let Some(tx) = self.nodes[i].dev.poll_transmit(self.now, &mut buf) else {
                    break;
                };
                let pkt = buf[..tx.len].to_vec();
                self.carry(i, &pkt);
            }
        }
    }

    /// Advances to the next event and processes it. Returns false when nothing is left to do
    /// or the next event is after `deadline`.
    pub fn step(&mut self, deadline: Nanos) -> bool {
        self.transmit_all();
        let next_packet = self.in_flight.peek().map(|Reverse((t, _))| *t);
        let timers: Vec<Option<Nanos>> = self.nodes.iter().map(|n| n.dev.poll_timeout()).collect();
        let next_timer = timers.iter().flatten().copied().min();
        // A node held back by its busy links may send again when they are free.
        let next_free = self
            .nic_busy_until
            .iter()
            .copied()
            .filter(|&t| t > self.now)
            .min();
        let Some(next) = [next_packet, next_timer, next_free]
            .into_iter()
            .flatten()
            .min()
        else {
            return false;
        };
        if next > deadline {
            return false;
        }
        self.now = self.now.max(next);
        while let Some(Reverse((t, seq))) = self.in_flight.peek().copied() {
            if t > self.now {
                break;
            }
            self.in_flight.pop();
            match self.payloads.remove(&seq) {
                Some((to, bytes, Hop::Deliver)) => {
                    let now = self.now;
                    self.nodes[to].dev.handle_packet(now, &bytes);
                }
                Some((to, bytes, Hop::Bottleneck)) => {
                    let Some(src) = crate::wire::ecn::packet_source(&bytes) else {
                        continue;
                    };
                    let Some(port) = self.bottlenecks.get_mut(&to) else {
                        continue;
                    };
                    if let Some(at) = port.enqueue(t, src, bytes.len()) {
                        self.schedule(at, to, bytes, Hop::Depart);
                    }
                }
                Some((to, mut bytes, Hop::Depart)) => {
                    let Some(port) = self.bottlenecks.get_mut(&to) else {
                        continue;
                    };
                    let at = port.depart(t, &mut bytes, &mut self.rng);
                    self.schedule(at, to, bytes, Hop::Deliver);
                }
                None => {}
            }
        }
        // A timer can only have come due by itself: delivered packets arm timers later than
        // now, and those that fire now were in the list already.
        let now = self.now;
        for (node, due) in self.nodes.iter_mut().zip(&timers) {
            if due.is_some_and(|t| t <= now) {
                node.dev.handle_timeout(now);
            }
        }
        self.drain_completions();
        true
    }

    /// Runs until nothing is in flight and no timer is armed, or until `limit` ns of virtual
    /// time from now.
    pub fn run(&mut self, limit: Nanos) {
        let deadline = self.now.saturating_add(limit);
        while self.step(deadline) {}
        self.transmit_all();
        self.drain_completions();
    }

    /// Completions of `node` with the given QP.
    pub fn completions_of(&self, node: usize, qpn: Qpn) -> Vec<WorkCompletion> {
        self.completions
            .iter()
            .filter(|(n, wc)| *n == node && wc.qp_num == qpn)
            .map(|(_, wc)| *wc)
            .collect()
    }
}

/// Flips one bit the ICRC covers: somewhere in the transport packet, except BTH byte 4
/// (FECN/BECN/reserved, masked).
fn corrupt_covered_bit(b: &mut [u8], rng: &mut SimRng) {
    // The transport's start: after IPv4 + UDP, the GRH (RoCE v1), or IPv6 + UDP.
    let start = match (b.first().map(|v| v >> 4), b.get(6)) {
        (Some(4), _) => 28,
        (Some(6), Some(&crate::wire::GRH_NEXT_HEADER_IBA)) => 40,
        (Some(6), _) => 48,
        _ => return,
    };
    if b.len() <= start + 12 {
        return;
    }
    let mut at = start + rng.below((b.len() - start) as u64) as usize;
    if at == start + 4 {
        at += 1;
    }
    let bit = rng.below(8) as u8;
    b[at] ^= 1 << bit;
}
