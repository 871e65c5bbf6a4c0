//! The operator's view of a device (`softroce stat`, `res show`, `capture`, `fault`,
//! `link del`): counters by name, summed over every client engine (those that have gone
//! included) and the link's; the resources each client holds; captures and fault rules
//! attached to the device's [`crate::net::Layers`] (the responder's forced NAKs kept here,
//! next to the engines that give them); and the device's removal, which is fatal to every
//! context open on it.

use super::DeviceThread;
use crate::capture::CaptureShared;
use crate::net::Link;
use proto::ctl::{
    CqRes, DeviceStats, FaultKind, FaultRule, FaultStatus, MrRes, PdRes, QpRes, QpStats, ResDetail,
    ResKind, ResOwner, SrqRes,
};
use proto::ring::doorbell::PortState;
use proto::transport::{self as tp, QpState, QpType};
use proto::Qpn;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;
use tracing::info;

/// `enum ibv_event_type` IBV_EVENT_DEVICE_FATAL.
const IBV_EVENT_DEVICE_FATAL: u32 = 8;
const IBV_EVENT_PORT_ACTIVE: u32 = 9;
const IBV_EVENT_PORT_ERR: u32 = 10;
const IBV_EVENT_GID_CHANGE: u32 = 18;

/// The kinds of object `res show` numbers.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Numbered {
    Pd,
    Cq,
    Mr,
    Srq,
}

/// The numbers `softroce res show` gives PDs, CQs, MRs and SRQs (`pdn`, `cqn`, `mrn`,
/// `srqn`): unique on the device, as the kernel's object pool indexes are, where an engine's
/// handles are its client's alone (two processes each have a first PD, with one handle). A
/// number is given the first time its object is shown, from 1 per kind, and kept while the
/// object lives, so that a QP's `pdn` and `send-cqn` name the rows of `res show pd` and `cq`.
#[derive(Default)]
pub(super) struct ResNumbers {
    /// Each object's number, and the listing that last showed it.
    given: HashMap<(u64, Numbered, u32), (u32, u64)>,
    last: HashMap<Numbered, u32>,
    listing: u64,
}

impl ResNumbers {
    fn number(&mut self, client: u64, kind: Numbered, handle: u32) -> u32 {
        let listing = self.listing;
        let last = &mut self.last;
        let e = self.given.entry((client, kind, handle)).or_insert_with(|| {
            let n = last.entry(kind).or_insert(0);
            *n = n.wrapping_add(1);
            (*n, listing)
        });
        e.1 = listing;
        e.0
    }

    /// Starts a listing.
    fn begin(&mut self) {
        self.listing += 1;
    }

    /// Ends a listing of every object of `kind`: those it did not show are gone, and so are
    /// their numbers (what `given` holds stays bounded by what the clients hold).
    fn end(&mut self, kind: Option<Numbered>) {
        let listing = self.listing;
        if let Some(kind) = kind {
            self.given.retain(|k, v| k.1 != kind || v.1 == listing);
        }
    }

    /// Forgets the numbers of a client that has gone.
    pub(super) fn client_gone(&mut self, client: u64) {
        self.given.retain(|(c, _, _), _| *c != client);
    }
}

/// Counters as (name, value) pairs, in their declaration order (rxe's names first for the
/// engine's): every numeric field of `c`, whatever fields it has.
pub fn named<T: Serialize>(c: &T) -> Vec<(String, u64)> {
    match serde_json::to_value(c) {
        Ok(serde_json::Value::Object(m)) => m
            .into_iter()
            .filter_map(|(k, v)| v.as_u64().map(|n| (k, n)))
            .collect(),
        _ => Vec::new(),
    }
}

/// Counters by name, owned (for the control protocol).
fn owned(named: &[(&'static str, u64)]) -> Vec<(String, u64)> {
    named.iter().map(|(n, v)| (n.to_string(), *v)).collect()
}

/// Adds `add` into `into`, name by name.
pub fn accumulate(into: &mut Vec<(String, u64)>, add: &[(String, u64)]) {
    for (k, v) in add {
        match into.iter_mut().find(|(n, _)| n == k) {
            Some(e) => e.1 += v,
            None => into.push((k.clone(), *v)),
        }
    }
}

fn bump(into: &mut [(String, u64)], name: &str, by: u64) {
    if let Some(e) = into.iter_mut().find(|(n, _)| n == name) {
        e.1 += by;
    }
}

pub fn qp_type_name(t: QpType) -> &'static str {
    match t {
        QpType::Rc => "RC",
        QpType::Uc => "UC",
        QpType::Ud => "UD",
        QpType::Gsi => "GSI",
    }
}

pub fn qp_state_name(s: QpState) -> &'static str {
    match s {
        QpState::Reset => "RESET",
        QpState::Init => "INIT",
        QpState::Rtr => "RTR",
        QpState::Rts => "RTS",
        QpState::Sqd => "SQD",
        QpState::Sqe => "SQE",
        QpState::Err => "ERR",
    }
}

/// Requests from the registry about the device as a whole.
pub enum OperatorMsg {
    /// Counters; with `qpn`, also that QP's (if it lives here).
    Stats {
        qpn: Option<u32>,
        reply: crossbeam_channel::Sender<DeviceStats>,
    },
    Resources {
        kind: ResKind,
        reply: crossbeam_channel::Sender<ResDetail>,
    },
    /// Feed a capture as its interface `iface`.
    Capture {
        shared: Arc<CaptureShared>,
        iface: u32,
    },
    FaultAdd(FaultRule),
    FaultClear,
    FaultShow {
        reply: crossbeam_channel::Sender<Vec<FaultStatus>>,
    },
}

impl DeviceThread {
    /// Handles one [`OperatorMsg`].
    pub(super) fn operator(&mut self, msg: OperatorMsg) {
        match msg {
            OperatorMsg::Stats { qpn, reply } => {
                let _ = reply.send(self.stats(qpn));
            }
            OperatorMsg::Resources { kind, reply } => {
                let _ = reply.send(self.resources(kind));
            }
            OperatorMsg::Capture { shared, iface } => {
                let qpns = shared
                    .spec()
                    .qpn
                    .map_or_else(Vec::new, |q| self.qp_and_peer(q));
                self.link.capture.attach(shared, iface, qpns);
                // The packets between local QPs must exist for the capture: the same-host
                // fast path's directions come back, and none is offered while it runs.
                self.fast_through_layers(true);
            }
            OperatorMsg::FaultAdd(rule) => {
                let qpns = rule.qpn.map_or_else(Vec::new, |q| self.qp_and_peer(q));
                info!(device = %self.info.name, ?rule, "fault rule added");
                if matches!(rule.kind, FaultKind::Rnr | FaultKind::AccessError) {
                    self.naks.add(rule, qpns);
                } else {
                    self.link.faults.add(rule, qpns);
                }
                self.fast_through_layers(true);
            }
            OperatorMsg::FaultClear => {
                info!(device = %self.info.name, "fault rules cleared");
                self.link.faults.clear();
                self.naks.clear();
                // Offered again where the conditions hold (a capture may still run).
                self.fast_through_layers(false);
            }
            OperatorMsg::FaultShow { reply } => {
                let mut all = self.link.faults.status();
                all.extend(self.naks.status());
                let _ = reply.send(all);
            }
        }
    }

    /// The BTH destination QPNs that mean "QP `qpn`" on this device: the QP itself and,
    /// once connected, its peer (where what it sends goes).
    fn qp_and_peer(&self, qpn: u32) -> Vec<u32> {
        let mut out = vec![qpn];
        for c in self.clients.values() {
            if let Some(q) = c
                .engine
                .qp_summaries()
                .into_iter()
                .find(|q| q.qpn.value() == qpn)
            {
                if q.dest_qpn.value() != 0 {
                    out.push(q.dest_qpn.value());
                }
            }
        }
        out
    }

    /// Every engine's counters summed (the clients gone included, and what the same-host
    /// fast path's engines counted and the device has not taken back), with the device's own
    /// `link_downed`.
    pub(super) fn engine_totals(&self) -> tp::Counters {
        let mut engines = self.departed;
        for c in self.clients.values() {
            engines.accumulate(c.engine.counters());
        }
        engines.accumulate(&self.fast.counters_unabsorbed());
        engines.link_downed += self.link_downs;
        engines
    }

    fn stats(&self, qpn: Option<u32>) -> DeviceStats {
        let engines = self.engine_totals();
        let mut counters = owned(&engines.named());
        // QP1's packets are the CM's, sent and received here: rxe counts them too.
        bump(&mut counters, "sent_pkts", self.gsi_sent);
        bump(&mut counters, "rcvd_pkts", self.gsi_rcvd);
        // As an engine counts a packet for a QP it does not have.
        bump(&mut counters, "dropped_pkts", self.drops.unknown_qp);
        // How much the same-host fast path is used, and how often a take was asked for in
        // vain (a program the fast path does not suit, as one that waits on events).
        counters.extend(self.fast.named());
        let mut qps = Vec::new();
        if let Some(q) = qpn {
            for (id, c) in &self.clients {
                if let Some(k) = c.engine.qp_counters(Qpn::new(q)) {
                    let mut k = *k;
                    k.accumulate(&self.fast.qp_counters_unabsorbed(*id, q));
                    qps.push(QpStats {
                        qpn: q,
                        pid: c.pid as u32,
                        comm: String::new(),
                        counters: owned(&k.named()),
                    });
                }
            }
        }
        DeviceStats {
            device: self.info.name.clone(),
            counters,
            net: named(&self.link.counters()),
            qps,
        }
    }

    fn resources(&mut self, kind: ResKind) -> ResDetail {
        let mut d = ResDetail::default();
        let numbers = &mut self.res_numbers;
        numbers.begin();
        for (&id, c) in &self.clients {
            let owner = ResOwner {
                device: self.info.name.clone(),
                pid: c.pid as u32,
                comm: String::new(),
            };
            let mut n = |kind: Numbered, handle: u32| numbers.number(id, kind, handle);
            let e = &c.engine;
            match kind {
                ResKind::Qp => d.qps.extend(e.qp_summaries().into_iter().map(|q| QpRes {
                    owner: owner.clone(),
                    qpn: q.qpn.value(),
                    qp_type: qp_type_name(q.qp_type).into(),
                    state: qp_state_name(q.state).into(),
                    sq_psn: q.sq_psn.value(),
                    rq_psn: q.rq_psn.value(),
                    dest_qpn: q.dest_qpn.value(),
                    path_mtu: q.path_mtu,
                    pd: n(Numbered::Pd, q.pd),
                    send_cq: n(Numbered::Cq, q.send_cq),
                    recv_cq: n(Numbered::Cq, q.recv_cq),
                    srq: q.srq.map(|s| n(Numbered::Srq, s)),
                })),
                ResKind::Cq => d.cqs.extend(e.cq_summaries().into_iter().map(|q| CqRes {
                    owner: owner.clone(),
                    cqn: n(Numbered::Cq, q.handle),
                    cqe: q.cqe as u32,
                    users: q.users,
                })),
                ResKind::Mr => d.mrs.extend(e.mr_summaries().into_iter().map(|m| MrRes {
                    owner: owner.clone(),
                    mrn: n(Numbered::Mr, m.handle),
                    pd: n(Numbered::Pd, m.pd),
                    lkey: m.lkey,
                    rkey: m.rkey,
                    iova: m.addr,
                    length: m.length,
                    access: m.access,
                })),
                ResKind::Pd => d.pds.extend(e.pd_summaries().into_iter().map(|p| PdRes {
                    owner: owner.clone(),
                    pdn: n(Numbered::Pd, p.handle),
                    users: p.users,
                })),
                ResKind::Srq => d.srqs.extend(e.srq_summaries().into_iter().map(|s| SrqRes {
                    owner: owner.clone(),
                    srqn: n(Numbered::Srq, s.handle),
                    pd: n(Numbered::Pd, s.pd),
                    max_wr: s.max_wr,
                    posted: s.posted as u32,
                })),
                // The CM thread's.
                ResKind::CmId => {}
            }
        }
        numbers.end(match kind {
            ResKind::Pd => Some(Numbered::Pd),
            ResKind::Cq => Some(Numbered::Cq),
            ResKind::Mr => Some(Numbered::Mr),
            ResKind::Srq => Some(Numbered::Srq),
            ResKind::Qp | ResKind::CmId => None,
        });
        d
    }

    /// The port went down or came up (`softroce link set`, or the netdev it follows): every
    /// context open on the device gets `IBV_EVENT_PORT_ERR` or `IBV_EVENT_PORT_ACTIVE` for
    /// port 1 (the kernel's `ib_dispatch_event`, from rxe's `rxe_port_down`/`rxe_port_up`),
    /// a port going down counts in `link_downed`, and while it is down the link's layers drop
    /// every packet, the ones between the device's own QPs included: the same-host fast
    /// path's directions come back to the device, which offers none until the port is up.
    pub(super) fn port_changed(&mut self, up: bool) {
        self.link.set_port_up(up);
        self.publish_port();
        let event = if up {
            IBV_EVENT_PORT_ACTIVE
        } else {
            self.link_downs += 1;
            self.fast_through_layers(true);
            IBV_EVENT_PORT_ERR
        };
        self.port_event(event);
        info!(device = %self.info.name, up, "port {}", if up { "up" } else { "down" });
    }

    /// Writes the async event `event` for port 1 (`element.port_num`, the record's first
    /// word) into every context open on the device.
    fn port_event(&mut self, event: u32) {
        let mut rec = [0u8; 16];
        rec[0..8].copy_from_slice(&1u64.to_ne_bytes());
        rec[8..12].copy_from_slice(&event.to_ne_bytes());
        for c in self.clients.values_mut() {
            for sink in c.contexts.values_mut() {
                sink.send(&rec, 12);
            }
        }
    }

    /// Writes port 1's state, active MTU and GID table generation into every client's
    /// table, where the shim's `ibv_query_port` and `ibv_query_gid` read them.
    pub(super) fn publish_port(&self) {
        let port = self.port_state();
        for c in self.clients.values() {
            if let Some(t) = &c.bells {
                t.set_port(port);
            }
        }
    }

    pub(super) fn port_state(&self) -> PortState {
        PortState {
            active: self.info.port_active,
            active_mtu: self.info.active_mtu,
            gid_generation: self.gid_generation,
        }
    }

    /// The GID table changed (an address of the netdev came or went; the entries that
    /// stayed kept their indices, `proto::ctl::keep_gid_indices`): every client's engine
    /// takes the new table, the shim's copies are marked old (the generation, published
    /// with the port before the event, so that a program reading the table on the event
    /// reads the new one), and every context open on the device gets
    /// `IBV_EVENT_GID_CHANGE` for port 1, as the kernel's GID cache dispatches it
    /// (`dispatch_gid_change_event`) to uverbs.
    pub(super) fn gids_changed(&mut self) {
        self.gid_generation = self.gid_generation.wrapping_add(1);
        let types = self.gid_types();
        for c in self.clients.values_mut() {
            c.engine.set_gids(self.gids.clone(), types.clone());
        }
        self.publish_port();
        self.port_event(IBV_EVENT_GID_CHANGE);
        info!(device = %self.info.name, gids = self.info.gids.len(), "GID table changed");
    }

    /// The framing of each GID of the table by index (`--roce both` lists an address
    /// twice; an empty slot is RoCE v2, as any).
    pub(super) fn gid_types(&self) -> Vec<tp::GidType> {
        (0..self.gids.len())
            .map(|i| super::loss_recovery::gid_type_at(&self.info, i))
            .collect()
    }

    /// `softroce link del`: every context open on the device gets IBV_EVENT_DEVICE_FATAL
    /// (what the kernel's `ib_uverbs_remove_one` queues on each uverbs file), captures that
    /// listen end, and the clients' state here is freed.
    pub(super) fn remove(&mut self) {
        let mut rec = [0u8; 16];
        rec[8..12].copy_from_slice(&IBV_EVENT_DEVICE_FATAL.to_ne_bytes());
        let mut contexts = 0;
        for c in self.clients.values_mut() {
            for sink in c.contexts.values_mut() {
                contexts += 1;
                sink.send(&rec, 12);
            }
        }
        info!(device = %self.info.name, contexts, "device deleted: its contexts get IBV_EVENT_DEVICE_FATAL");
        self.link.flush();
        self.link.close();
        let ids: Vec<u64> = self.clients.keys().copied().collect();
        for id in ids {
            self.client_gone(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Numbered, ResNumbers};

    #[test]
    fn res_numbers_are_the_devices_not_the_clients() {
        let mut n = ResNumbers::default();
        // Two clients' first CQs share a handle; the device numbers them apart, per kind.
        assert_eq!(n.number(1, Numbered::Cq, 7), 1);
        assert_eq!(n.number(2, Numbered::Cq, 7), 2);
        assert_eq!(n.number(1, Numbered::Pd, 7), 1);
        // Shown again: the same number.
        assert_eq!(n.number(1, Numbered::Cq, 7), 1);
        n.client_gone(1);
        assert_eq!(n.number(2, Numbered::Cq, 7), 2);
        assert_eq!(n.number(1, Numbered::Cq, 7), 3);
        // A listing of every CQ that no longer shows client 2's (destroyed): its number is
        // forgotten; one of another kind is kept through it.
        assert_eq!(n.number(2, Numbered::Pd, 7), 2);
        n.begin();
        assert_eq!(n.number(1, Numbered::Cq, 7), 3);
        n.end(Some(Numbered::Cq));
        assert_eq!(n.given.len(), 2);
        assert_eq!(n.number(2, Numbered::Pd, 7), 2);
        assert_eq!(n.number(2, Numbered::Cq, 7), 4);
    }
}
