//! The same-host fast path, the device's side (docs/architecture.md, "The same-host fast
//! path"; the shim's side is `shim/src/fast`).
//!
//! Between two QPs of this device whose processes belong to one user, the device lets the
//! process that sends run the transport itself: the requester of its QP and the responder of
//! the peer QP run in that process (a *direction*), in the same engine code, and the device
//! does nothing per message. The device stays the device:
//! - it **offers** a direction (`SharedRing::set_fast_offer` on the QP's send ring) only
//!   while the conditions hold: RC or UC, both QPs connected to each other on this device,
//!   the peer in RTR or RTS without memory windows, its receive queue its own ring or an SRQ
//!   that feeds it alone, no CQ involved armed for a completion event (only the device
//!   raises those), the same uid, a taker that can name its peer's process (the same PID
//!   namespace, or the daemon's: [`peer_pid_seen_by`]), packets between local QPs not sent
//!   through the link (which is where capture and fault injection sit);
//! - it **grants** one ([`Request::FastTake`]) only while both halves are idle in its own
//!   engines, handing over the configuration, the sequence numbers, the peer's receive queue
//!   (its ring, and the WQEs the device already took from it, in a ring of the direction's
//!   memfd), and the MR tables it publishes for both clients (updated at every registration;
//!   a deregistration is answered only once no direction is using the table); what waits
//!   unread in the QP's send ring goes with it (the taker reads it first), and a take that
//!   finds work in flight holds the send ring until that work drains
//!   ([`DeviceThread::hold_for_take`]), so that a stream is taken over too;
//! - it **takes it back** ([`DeviceThread::reclaim`]) whenever it needs the QPs itself (a
//!   modify, a query, a destroy, a memory window, a client gone, a second QP on its SRQ, an
//!   arm of a CQ it feeds) or the taker gives it back
//!   ([`Request::FastReturn`], after an error or before work the fast path leaves to the
//!   daemon): it revokes the direction, waits until the taker is outside it, and carries on
//!   from the sequence numbers and counters the taker published.

use super::clients::{ClientDev, CqState};
use super::handles::tag_handle;
use super::DeviceThread;
use crate::shm::SharedRegion;
use proto::ctl::{self, FastEvent, FastGrant, FastQp, FastRing, Request, Response};
use proto::ring::fast::{Direction, MrEntry, MrTable, CONTROL_LEN, PUBLISHED_ERROR};
use proto::ring::{wqe, RingGeometry};
use proto::transport::{AttrMask, Counters, Nanos, QpAttr, QpState, QpType, RecvWr};
use proto::{Psn, Qpn};
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use tracing::{debug, info};

/// QPs per client whose memfd the device keeps for the fast path (each costs an open file).
pub(super) const FD_BUDGET: usize = 256;
/// Bytes per slot of a direction's receive-completion ring (room for small SENDs' data).
const RING_SLOT: u32 = 256;
/// Entries of a client's MR table: the engine's MR indexes are below 2^19.
const MR_TABLE_CAPACITY: u32 = 1 << 19;

/// Whether a CQ may feed a direction now: not armed for a channel event, and not one whose
/// client waits on events rather than polls.
fn unarmed(q: &CqState) -> bool {
    !q.events_only && q.ring.armed().is_none()
}

/// [`unarmed`], and if only the arm is in the way, the offer waits for the event.
fn unarmed_or_wait(q: &CqState) -> bool {
    let ok = unarmed(q);
    if !ok && !q.events_only {
        q.offer_waits.set(true);
    }
    ok
}

/// Where a client process sits among PID namespaces: the taker of a direction writes into
/// its peer with `process_vm_writev`, which names the peer by a pid of the *taker's* PID
/// namespace, and a client in a container (its own PID namespace, the daemon on the host)
/// knows its peer by another number than the daemon does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PidView {
    /// The inode of its PID namespace (`/proc/PID/ns/pid`).
    pub ns: u64,
    /// Its pid in that namespace: the last of `/proc/PID/status`'s `NSpid` (the daemon's
    /// number first, then one per nested namespace).
    pub own: i32,
}

/// What the fast path needs to know of client process `pid` (a pid of the daemon's
/// namespace), read once when it first uses the device: its real uid (directions join only
/// processes of one user) and its [`PidView`]. None where it cannot be read (the process is
/// gone, or is not the daemon's to inspect): no direction for it then.
pub(super) fn process_identity(pid: i32) -> (Option<u32>, Option<PidView>) {
    use std::os::unix::fs::MetadataExt;
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return (None, None);
    };
    let view = || {
        Some(PidView {
            ns: std::fs::metadata(format!("/proc/{pid}/ns/pid")).ok()?.ino(),
            own: status_field(&status, "NSpid:")?.last()?.parse().ok()?,
        })
    };
    let uid = status_field(&status, "Uid:").and_then(|mut f| f.next()?.parse().ok());
    (uid, view())
}

/// The numbers of one line of a `/proc/PID/status` text (`Uid:` real, effective, ...;
/// `NSpid:` the daemon's pid first, then one per nested PID namespace).
fn status_field<'a>(status: &'a str, key: &str) -> Option<std::str::SplitWhitespace<'a>> {
    let line = status.lines().find_map(|l| l.strip_prefix(key))?;
    Some(line.split_whitespace())
}

/// The daemon's own PID namespace.
fn daemon_pid_ns() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    static NS: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *NS.get_or_init(|| Some(std::fs::metadata("/proc/self/ns/pid").ok()?.ino()))
}

/// The peer's pid as a taker sees it: its own number when both share a PID namespace (two
/// processes of one container), the daemon's number when the taker is in the daemon's
/// namespace (which sees every namespace below it by the daemon's numbers); None otherwise
/// (processes of two containers, or an unknown view): no direction then, the daemon's path
/// serves them, as it serves processes of two users.
pub(super) fn peer_pid_seen_by(
    taker: Option<PidView>,
    peer: Option<PidView>,
    peer_daemon_pid: i32,
) -> Option<i32> {
    peer_pid_in(taker?, peer?, peer_daemon_pid, daemon_pid_ns()?)
}

fn peer_pid_in(taker: PidView, peer: PidView, peer_daemon_pid: i32, daemon_ns: u64) -> Option<i32> {
    if taker.ns == peer.ns {
        Some(peer.own)
    } else if taker.ns == daemon_ns {
        Some(peer_daemon_pid)
    } else {
        None
    }
}

/// One direction the device granted.
pub(super) struct DirectionHost {
    pub taker: u64,
    pub taker_qpn: u32,
    pub peer: u64,
    pub peer_qpn: u32,
    /// The engine's handle of the peer QP's receive CQ (the ring feeds it), and of the
    /// taker QP's send CQ.
    pub peer_recv_cq: u32,
    pub taker_send_cq: u32,
    /// The SRQ lent as the peer QP's receive queue (None: its own receive ring).
    pub peer_srq: Option<u32>,
    region: SharedRegion,
    control: Direction,
    ring: RingPlace,
    /// The receive WQEs the grant carried (those not used come back).
    recvs: Vec<RecvWr>,
}

#[derive(Clone, Copy)]
struct RingPlace(ctl::RingPlace);

/// The receive-completion ring of a direction that came back, kept until its consumer has
/// read it: until then the CQ it feeds takes no completion from the device's engine (they are
/// newer), and `FastSources` still lists it (its consumer may not have attached yet).
struct Retired {
    id: u64,
    peer: u64,
    peer_recv_cq: u32,
    region: SharedRegion,
    ring: ctl::RingPlace,
}

impl Retired {
    /// Whether the consumer has read every entry.
    fn drained(&self) -> bool {
        let at = self.ring.offset as usize;
        // SAFETY: the ring lies inside the region at `at` (it was initialised there); a
        // consumer handle only reads the indices.
        let ring = unsafe {
            proto::ring::SharedRing::attach(
                self.region.as_mut_ptr().add(at),
                self.region.len() - at,
                false,
            )
        };
        ring.is_ok_and(|r| r.available().unwrap_or(0) == 0)
    }
}

/// A client's published MR table.
pub(super) struct TableHost {
    region: SharedRegion,
    table: MrTable,
}

/// The device's fast-path state.
pub(super) struct FastPaths {
    /// Off with `SOFTROCE_NO_FAST_PATH`, or when packets between local QPs go through the
    /// link (`local_via_socket`: a capture must see them).
    pub enabled: bool,
    pub directions: HashMap<u64, DirectionHost>,
    next_id: u64,
    pub tables: HashMap<u64, TableHost>,
    retired: Vec<Retired>,
    /// Directions granted and taken back, and takes refused (not offered any more, or held
    /// for work in flight), over the device's life (`device_fast_grants`,
    /// `device_fast_returns`, `device_fast_refused` in its counters).
    pub grants: u64,
    pub returns: u64,
    pub refused: u64,
    /// Send rings held for a take ([`DeviceThread::hold_for_take`]), with when each hold ends.
    pub holds: Vec<Hold>,
}

/// A QP's send ring held for a take (device time): since when, and since when what was in
/// flight has drained.
pub(super) struct Hold {
    client: u64,
    qpn: u32,
    since: Nanos,
    drained_at: Option<Nanos>,
}

impl Hold {
    /// When the hold ends if nothing changes.
    pub fn until(&self) -> Nanos {
        match self.drained_at {
            Some(t) => t + HOLD_DRAINED_NS,
            None => self.since + HOLD_MAX_NS,
        }
    }
}

/// The longest a send ring is held while its work drains: a full send queue of large
/// messages takes a few milliseconds (perftest's 128 WRITEs of 64 KiB are 8 MiB, about 2 ms
/// on the device's path here; a debug build is ten times slower).
const HOLD_MAX_NS: Nanos = 100_000_000;
/// How long a drained, held ring waits for the take: the program asks again every 200 µs
/// while it posts or polls (`shim::fast`, `RETRY_HELD`), when it gets a CPU (on a busy
/// machine, milliseconds later).
const HOLD_DRAINED_NS: Nanos = 20_000_000;
/// After a hold that ended without a take, the QP is not held again for this long: a QP the
/// fast path cannot take for another reason loses little.
const HOLD_AGAIN_NS: Nanos = 1_000_000_000;

impl FastPaths {
    pub fn new(enabled: bool) -> FastPaths {
        FastPaths {
            enabled: enabled && std::env::var_os("SOFTROCE_NO_FAST_PATH").is_none(),
            directions: HashMap::new(),
            next_id: 1,
            tables: HashMap::new(),
            retired: Vec::new(),
            grants: 0,
            returns: 0,
            refused: 0,
            holds: Vec::new(),
        }
    }

    /// The CQs of `client` that wait for a retired ring's consumer.
    pub fn fenced(&self, client: u64) -> Vec<u32> {
        self.retired
            .iter()
            .filter(|r| r.peer == client)
            .map(|r| r.peer_recv_cq)
            .collect()
    }

    /// Forgets the retired rings their consumers have read.
    pub fn prune_retired(&mut self) {
        if !self.retired.is_empty() {
            self.retired.retain(|r| !r.drained());
        }
    }

    /// Directions in which (client, QP) is the requester or the responder.
    pub fn involving(&self, client: u64, qpn: u32) -> Vec<u64> {
        self.directions
            .iter()
            .filter(|(_, d)| {
                (d.taker == client && d.taker_qpn == qpn) || (d.peer == client && d.peer_qpn == qpn)
            })
            .map(|(id, _)| *id)
            .collect()
    }

    /// Directions that use the MRs of `client` (as the taker's or the peer's).
    pub fn of_client(&self, client: u64) -> Vec<u64> {
        self.directions
            .iter()
            .filter(|(_, d)| d.taker == client || d.peer == client)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Whether every direction in `ids` is revoked and its taker outside it.
    pub fn quiet(&self, ids: &[u64]) -> bool {
        ids.iter()
            .all(|id| self.directions.get(id).is_none_or(|d| !d.control.busy()))
    }

    /// The counters the takers of `client`'s directions published and the device has not
    /// absorbed yet: add them to its engine's for a live view.
    pub fn counters_of(&self, client: u64) -> Counters {
        let mut sum = Counters::default();
        for d in self.directions.values() {
            if d.taker == client {
                sum.accumulate(&Counters::from_words(&d.control.counters(0)));
            }
            if d.peer == client {
                sum.accumulate(&Counters::from_words(&d.control.counters(1)));
            }
        }
        sum
    }

    /// The counters the takers published for QP `qpn` of `client` and the device has not
    /// absorbed yet (its per-QP counters include them).
    pub fn qp_counters_unabsorbed(&self, client: u64, qpn: u32) -> Counters {
        let mut sum = Counters::default();
        for d in self.directions.values() {
            if d.taker == client && d.taker_qpn == qpn {
                sum.accumulate(&Counters::from_words(&d.control.counters(0)));
            }
            if d.peer == client && d.peer_qpn == qpn {
                sum.accumulate(&Counters::from_words(&d.control.counters(1)));
            }
        }
        sum
    }

    /// `device_fast_grants`, `device_fast_returns`, `device_fast_refused`, by name (the
    /// device's counters and `softroce stat` both list them).
    pub fn named(&self) -> Vec<(String, u64)> {
        [
            ("device_fast_grants", self.grants),
            ("device_fast_returns", self.returns),
            ("device_fast_refused", self.refused),
        ]
        .map(|(n, v)| (n.to_string(), v))
        .into()
    }

    /// The counters every direction's takers published and the device has not absorbed yet
    /// (the device's totals include them, as if its own engines had counted).
    pub fn counters_unabsorbed(&self) -> Counters {
        let mut sum = Counters::default();
        for d in self.directions.values() {
            sum.accumulate(&Counters::from_words(&d.control.counters(0)));
            sum.accumulate(&Counters::from_words(&d.control.counters(1)));
        }
        sum
    }
}

/// The [`FastQp`] of a QP of `c` (handles tagged as the client knows them).
fn fast_qp(c: &ClientDev, qpn: u32, index: u32) -> Option<FastQp> {
    let q = c.qps.get(&qpn)?;
    let config = c.engine.qp_config(Qpn::new(qpn))?;
    let (state, attr) = c.engine.query_qp(Qpn::new(qpn)).ok()?;
    let seq = c.engine.qp_sequence(Qpn::new(qpn))?;
    Some(FastQp {
        qpn,
        qp_type: match config.init.qp_type {
            QpType::Rc => ctl::qp_type::RC,
            QpType::Uc => ctl::qp_type::UC,
            _ => return None,
        },
        state: state as u32,
        attr: ctl::ctl_attr(state, &attr),
        cap: ctl::QpCap {
            max_send_wr: q.cap.max_send_wr,
            max_recv_wr: q.cap.max_recv_wr,
            max_send_sge: q.cap.max_send_sge,
            max_recv_sge: q.cap.max_recv_sge,
            max_inline_data: q.cap.max_inline_data,
        },
        sq_sig_all: q.sq_sig_all,
        pd: config.init.pd,
        send_cq: tag_handle(index, config.init.send_cq),
        recv_cq: tag_handle(index, config.init.recv_cq),
        comp_psn: seq.comp_psn.value(),
        msn: seq.msn,
    })
}

fn mr_entry(c: &ClientDev, index: u32) -> Option<MrEntry> {
    let (pd, keys, addr, length, access) = c.engine.mr_info(index)?;
    Some(MrEntry {
        index,
        lkey: keys.lkey.0,
        rkey: keys.rkey.0,
        pd,
        access: access.0,
        addr,
        length,
    })
}

fn again(why: &str) -> (Response, Vec<OwnedFd>) {
    refused(libc::EAGAIN, why)
}

/// A take refused with `errno` (EAGAIN: ask again later; EBUSY: soon, the send ring is held).
fn refused(errno: i32, why: &str) -> (Response, Vec<OwnedFd>) {
    debug!("fast path: not granted: {why}");
    (
        Response::Error {
            errno,
            message: why.to_string(),
        },
        vec![],
    )
}

impl DeviceThread {
    /// The peer (client, QPN) of `(client, qpn)`'s requester if the device may offer its
    /// direction now.
    fn fast_eligible(&self, client: u64, qpn: u32) -> Option<(u64, u32)> {
        // A capture or a fault rule sees or alters the packets between local QPs: those
        // packets must exist (they go through the link's layers).
        if !self.fast.enabled || self.local_packets_in_layers() || self.local_via_socket {
            return None;
        }
        let c = self.clients.get(&client)?;
        let q = c.qps.get(&qpn)?;
        let config = c.engine.qp_config(Qpn::new(qpn))?;
        // Selective retransmission's state does not move between engines: such a QP (an
        // explicit `--loss-recovery selective`) stays with the device.
        let go_back_n = |e: &super::clients::Engine, n: u32| {
            e.loss_recovery(Qpn::new(n)) == Some(proto::transport::LossRecovery::GoBackN)
        };
        if !go_back_n(&c.engine, qpn) {
            return None;
        }
        if q.away
            || config.state != QpState::Rts
            || !matches!(config.init.qp_type, QpType::Rc | QpType::Uc)
        {
            return None;
        }
        let av = config.attr.ah_attr?;
        // The engines a taker runs frame as RoCE v2 (their packets never leave the process,
        // but their byte counts follow the framing): a QP on a v1 GID stays with the device.
        let v2 = |index: u8| {
            self.info
                .gid_entry(usize::from(index))
                .is_some_and(|g| g.roce == proto::ctl::RoceVersion::V2)
        };
        if !self.gids.contains(&av.dgid) || !v2(av.sgid_index) {
            return None;
        }
        let dest = config.attr.dest_qp_num.value();
        let peer = *self.blocks.get(&(dest / super::clients::QPN_BLOCK))?;
        if peer == client {
            return None;
        }
        let p = self.clients.get(&peer)?;
        let pq = p.qps.get(&dest)?;
        let pc = p.engine.qp_config(Qpn::new(dest))?;
        if !go_back_n(&p.engine, dest) {
            return None;
        }
        let paired = pc.attr.dest_qp_num.value() == qpn
            && pc
                .attr
                .ah_attr
                .is_some_and(|a| self.gids.contains(&a.dgid) && v2(a.sgid_index))
            && pc.init.qp_type == config.init.qp_type
            && matches!(pc.state, QpState::Rtr | QpState::Rts);
        // Only the device raises channel events: a CQ armed for one gets its completions
        // from the device until the event fired (`Request::CqEventsWanted`).
        let no_events = c.cqs.get(&config.init.send_cq).is_some_and(unarmed_or_wait)
            && p.cqs.get(&pc.init.recv_cq).is_some_and(unarmed_or_wait);
        // The peer's receive queue is lent whole: its own ring, or an SRQ that feeds this
        // QP alone and has no limit armed (the limit event is the device's to raise).
        let receive_queue = match pc.init.srq {
            Some(s) => {
                p.srqs
                    .get(&s)
                    .is_some_and(|s| s.fast.is_some() && !s.lent && !s.corrupt)
                    && p.engine.srq_lendable(s)
            }
            None => pq.fast.is_some() && pq.rq.is_some(),
        };
        let ok = paired
            && no_events
            && receive_queue
            && !pq.lent
            && p.mws.is_empty()
            && c.uid.is_some()
            && c.uid == p.uid
            && peer_pid_seen_by(c.pid_view, p.pid_view, p.pid).is_some();
        if !ok {
            tracing::trace!(
                qpn,
                paired,
                no_events,
                receive_queue,
                lent = pq.lent,
                mws = p.mws.len(),
                same_uid = c.uid.is_some() && c.uid == p.uid,
                peer_visible = peer_pid_seen_by(c.pid_view, p.pid_view, p.pid).is_some(),
                "fast path: not eligible"
            );
        }
        ok.then_some((peer, dest))
    }

    /// A take of a QP with work in flight. A requester that is never idle (a stream that
    /// keeps its send queue full, as perftest does) would never be granted, and a QP taken
    /// back once (a capture, a query) would stay on the device's path for the rest of its
    /// life: so the device stops reading the QP's send ring until what is in flight has
    /// completed (at most [`HOLD_MAX_NS`]). What the program posts meanwhile waits in the
    /// ring, its next posts ask again soon (EBUSY), and the taker reads the ring's entries
    /// first. A drained ring waits [`HOLD_DRAINED_NS`] for the take; a hold that ends without
    /// one is not tried again for [`HOLD_AGAIN_NS`].
    fn hold_for_take(&mut self, client: u64, qpn: u32) -> (Response, Vec<OwnedFd>) {
        let now = self.now();
        let Some(q) = self
            .clients
            .get_mut(&client)
            .and_then(|c| c.qps.get_mut(&qpn))
        else {
            return again("client gone");
        };
        if !q.held {
            if q.hold_ended
                .is_some_and(|t| now.saturating_sub(t) < HOLD_AGAIN_NS)
            {
                return again("work in flight");
            }
            q.held = true;
            self.fast.holds.push(Hold {
                client,
                qpn,
                since: now,
                drained_at: None,
            });
            debug!(
                client,
                qpn, "fast path: send ring held until the work in flight drains"
            );
        }
        refused(
            libc::EBUSY,
            "work in flight: the send ring is held until it drains",
        )
    }

    /// Notes the holds whose work has drained, and ends those whose time is up without a
    /// take, or whose QP may no longer be taken (it changed state, a capture started): their
    /// rings are read again.
    pub(super) fn fast_expire_holds(&mut self) {
        if self.fast.holds.is_empty() {
            return;
        }
        let now = self.now();
        let mut i = 0;
        while i < self.fast.holds.len() {
            let h = &self.fast.holds[i];
            if h.drained_at.is_none() && self.requester_drained(h.client, h.qpn) {
                self.fast.holds[i].drained_at = Some(now);
            }
            let h = &self.fast.holds[i];
            let still_offered = self.fast_eligible(h.client, h.qpn).is_some();
            if still_offered && self.fast.holds[i].until() > now {
                i += 1;
                continue;
            }
            let h = self.fast.holds.swap_remove(i);
            if let Some(c) = self.clients.get_mut(&h.client) {
                if let Some(q) = c.qps.get_mut(&h.qpn) {
                    q.held = false;
                    q.hold_ended = Some(now);
                }
                c.revisit.push(super::doorbells::Bell::Qp(h.qpn));
            }
        }
    }

    /// Whether nothing the QP's requester was given is left to complete (or the QP is gone).
    fn requester_drained(&self, client: u64, qpn: u32) -> bool {
        self.clients.get(&client).is_none_or(|c| {
            c.engine.requester_idle(Qpn::new(qpn))
                && c.qps.get(&qpn).is_none_or(|q| q.pending_send.is_empty())
        })
    }

    /// Sets the offer on `(client, qpn)`'s send ring as the conditions say now.
    pub(super) fn fast_refresh(&self, client: u64, qpn: u32) {
        let offer = self.fast_eligible(client, qpn).is_some();
        debug!(client, qpn, offer, "fast path: offer");
        if let Some(q) = self.clients.get(&client).and_then(|c| c.qps.get(&qpn)) {
            q.sq.set_fast_offer(offer);
        }
    }

    /// The client's MR table, created (and filled) on first use; a duplicate of its fd.
    fn mr_table_fd(&mut self, client: u64) -> Option<(OwnedFd, u64)> {
        if !self.fast.tables.contains_key(&client) {
            let c = self.clients.get(&client)?;
            let len = MrTable::byte_len(MR_TABLE_CAPACITY);
            let region = SharedRegion::create("mrs", len).ok()?;
            // SAFETY: the region is `len` zeroed bytes, page aligned, and lives beside the
            // table in TableHost.
            let table = unsafe { MrTable::init(region.as_mut_ptr(), MR_TABLE_CAPACITY) };
            for index in c.engine.mr_indexes() {
                table.set(index, mr_entry(c, index).as_ref());
            }
            self.fast.tables.insert(client, TableHost { region, table });
        }
        let t = self.fast.tables.get(&client)?;
        Some((t.region.dup_fd()?, t.region.len() as u64))
    }

    /// Publishes the MR `index` of `client` as its engine now holds it (or its absence).
    pub(super) fn fast_mr_changed(&self, client: u64, index: u32) {
        let (Some(t), Some(c)) = (self.fast.tables.get(&client), self.clients.get(&client)) else {
            return;
        };
        t.table.set(index, mr_entry(c, index).as_ref());
    }

    /// `FastTake`: grants the direction of `(client, qpn)` if it is offered and both halves
    /// are idle.
    pub(super) fn fast_take(&mut self, client: u64, qpn: u32) -> (Response, Vec<OwnedFd>) {
        let Some((peer, pqpn)) = self.fast_eligible(client, qpn) else {
            return again("the fast path is not offered for this QP");
        };
        let index = self.index;
        // What waits in the send ring unread goes with the direction: the taker reads it
        // first (`shim::fast`), and this thread reads the ring no more once the QP is away.
        let idle = {
            let (Some(c), Some(p)) = (self.clients.get(&client), self.clients.get(&peer)) else {
                return again("client gone");
            };
            let q = &c.qps[&qpn];
            let pq = &p.qps[&pqpn];
            c.engine.requester_idle(Qpn::new(qpn))
                && q.pending_send.is_empty()
                && p.engine.responder_idle(Qpn::new(pqpn))
                && pq.pending_recv.is_empty()
        };
        if !idle {
            return self.hold_for_take(client, qpn);
        }
        // Everything older than the direction is in the completion rings before it starts.
        for id in [client, peer] {
            if let Some(c) = self.clients.get_mut(&id) {
                super::completions::deliver_completions(c, index, &[]);
            }
        }
        let (Some((own_table, own_len)), Some((peer_table, peer_len))) =
            (self.mr_table_fd(client), self.mr_table_fd(peer))
        else {
            return again("no MR table");
        };
        let (Some(requester), Some(mut responder)) = (
            fast_qp(&self.clients[&client], qpn, index),
            fast_qp(&self.clients[&peer], pqpn, index),
        ) else {
            return again("QP state");
        };
        // The peer as the taker's process names it (checked by the eligibility above).
        let Some(peer_pid) = peer_pid_seen_by(
            self.clients[&client].pid_view,
            self.clients[&peer].pid_view,
            self.clients[&peer].pid,
        ) else {
            return again("the peer is not in the taker's PID namespace");
        };
        let p = &self.clients[&peer];
        let pc = p.engine.qp_config(Qpn::new(pqpn)).expect("checked above");
        let srq = pc.init.srq;
        let depth = p
            .cqs
            .get(&pc.init.recv_cq)
            .map_or(64, |x| x.ring.geometry().slot_count);
        let Some(g) = RingGeometry::new((2 * depth).clamp(64, 1 << 16), RING_SLOT) else {
            return again("ring");
        };
        // The receive WQEs the device holds for the peer QP (its engine's and those waiting
        // for room) go to the taker in a second ring of the block, sized for all of them.
        let (held, max_sge) = match srq.and_then(|s| p.srqs.get(&s).map(|st| (s, st))) {
            Some((s, st)) => (
                p.engine.srq_len(s).unwrap_or(0) + st.pending.len(),
                st.max_sge,
            ),
            None => (
                p.engine.rq_len(Qpn::new(pqpn)).unwrap_or(0)
                    + p.qps.get(&pqpn).map_or(0, |q| q.pending_recv.len()),
                pc.init.cap.max_recv_sge,
            ),
        };
        let recv_slot = wqe::RECV_HEADER_LEN + max_sge.max(1) as usize * wqe::SGE_LEN;
        let Some(rg) = RingGeometry::new((held as u32).max(1), recv_slot as u32) else {
            return again("ring");
        };
        if let Some(st) = srq.and_then(|s| p.srqs.get(&s)) {
            // The responder's receive queue is the SRQ: its limits are the SRQ's.
            responder.cap.max_recv_wr = st.max_wr;
            responder.cap.max_recv_sge = st.max_sge;
        }
        let recvs_at = (CONTROL_LEN + g.byte_len()).next_multiple_of(64);
        let Ok(region) = SharedRegion::create("fast", recvs_at + rg.byte_len()) else {
            return again("memfd");
        };
        let id = self.fast.next_id;
        self.fast.next_id += 1;
        // SAFETY: the region holds CONTROL_LEN bytes and more, page aligned, and lives beside
        // the handle in DirectionHost.
        let control = unsafe { Direction::init(region.as_mut_ptr(), id) };
        if region.init_ring(CONTROL_LEN, g).is_err() {
            return again("ring");
        }
        let Ok(mut recv_ring) = region.init_ring(recvs_at, rg) else {
            return again("ring");
        };
        let ring = ctl::RingPlace {
            offset: CONTROL_LEN as u64,
            slot_size: g.slot_size,
            slot_count: g.slot_count,
        };
        let recvs_place = ctl::RingPlace {
            offset: recvs_at as u64,
            slot_size: rg.slot_size,
            slot_count: rg.slot_count,
        };
        // The CQs the direction feeds say so (their consumers look for new sources) before
        // their arms are checked once more: an arm that the check misses saw the count move
        // (the shim arms, then reads it: `Request::CqEventsWanted`).
        let send_cq = self.clients[&client]
            .engine
            .qp_config(Qpn::new(qpn))
            .map(|x| x.init.send_cq);
        let fed = [(peer, Some(pc.init.recv_cq)), (client, send_cq)];
        for (id, cq) in fed {
            if let Some(q) = cq.and_then(|cq| self.clients.get(&id)?.cqs.get(&cq)) {
                q.ring.bump_fast_sources();
            }
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        let armed = fed.iter().any(|&(id, cq)| {
            cq.and_then(|cq| self.clients.get(&id)?.cqs.get(&cq))
                .is_some_and(|q| !unarmed(q))
        });
        if armed {
            return again("a CQ is armed for events");
        }
        let p = self.clients.get_mut(&peer).expect("checked above");
        // Everything that can still refuse is checked before the peer's receive WQEs leave
        // its engine: a refusal after that would lose them. The queue lent: where its ring
        // lies in the memory the peer maps (the QP's region or chunk, or the SRQ's region),
        // and that memory.
        let lent = match srq {
            Some(s) => p.srqs.get(&s).and_then(|st| {
                let (fd, place, len) = st.fast.as_ref()?;
                Some((fd.try_clone().ok()?, st.ring.geometry(), *place, *len))
            }),
            None => p.qps.get(&pqpn).and_then(|q| {
                let (fd, place, len) = q.fast.as_ref()?;
                Some((
                    fd.try_clone().ok()?,
                    q.rq.as_ref()?.geometry(),
                    *place,
                    *len,
                ))
            }),
        };
        let (Some(block_fd), Some((peer_fd, rq_g, rq_place, peer_region_len))) =
            (region.dup_fd(), lent)
        else {
            return again("fds, or no receive ring or fast memory");
        };
        debug_assert_eq!(
            (rq_place.slot_size, rq_place.slot_count),
            (rq_g.slot_size, rq_g.slot_count)
        );
        let recvs = match srq {
            Some(s) => {
                let mut recvs = p.engine.take_srq_recvs(s);
                if let Some(st) = p.srqs.get_mut(&s) {
                    recvs.extend(st.pending.drain(..));
                    st.lent = true;
                    // The taker never sleeps on it: a post must not ring the device's doorbell.
                    st.ring.consumer_awake();
                    st.ring.set_fast_lent(true);
                }
                recvs
            }
            None => {
                let mut recvs = p.engine.take_recvs(Qpn::new(pqpn));
                if let Some(q) = p.qps.get_mut(&pqpn) {
                    recvs.extend(q.pending_recv.drain(..));
                    if let Some(rq) = &q.rq {
                        rq.consumer_awake();
                        rq.set_fast_lent(true);
                    }
                }
                recvs
            }
        };
        let mut slot = vec![0u8; rg.slot_size as usize];
        for r in &recvs {
            let w = wqe::RecvWqe {
                wr_id: r.wr_id,
                sges: &r.sg_list,
            };
            // Sized for every one of them above, each within the queue's SGE limit; one that
            // did not fit would come back unused when the direction does (not a panic: the
            // WQEs are the client's).
            if !w
                .encode(&mut slot)
                .is_ok_and(|n| recv_ring.push(&slot[..n]).is_ok())
            {
                tracing::warn!(
                    qpn = pqpn,
                    "fast path: a receive WQE did not fit the grant's ring"
                );
            }
        }
        if let Some(q) = p.qps.get_mut(&pqpn) {
            q.lent = true;
        }
        // The peer's receive CQ and the taker's send CQ feed a direction: their events are
        // waited for anew (`CqState::event_waits`).
        if let Some(q) = p.cqs.get_mut(&pc.init.recv_cq) {
            q.event_waits = 0;
        }
        let c = self.clients.get_mut(&client).expect("checked above");
        let config = c.engine.qp_config(Qpn::new(qpn)).expect("checked above");
        if let Some(q) = c.cqs.get_mut(&config.init.send_cq) {
            q.event_waits = 0;
        }
        let q = c.qps.get_mut(&qpn).expect("checked above");
        q.away = true;
        q.held = false;
        q.sq.set_fast_offer(false);
        self.fast
            .holds
            .retain(|h| (h.client, h.qpn) != (client, qpn));
        let grant = FastGrant {
            direction: id,
            block_len: region.len() as u64,
            ring,
            requester,
            responder,
            peer_pid,
            peer_rq: rq_place,
            peer_region_len,
            recvs: recvs_place,
            mr_table_len: peer_len,
            own_mr_table_len: own_len,
            gids: self.gids.iter().map(|a| ctl::gid_of(*a)).collect(),
            port_mtu: self.info.active_mtu,
        };
        info!(device = %self.info.name, direction = id, taker = client, qpn, peer, peer_qpn = pqpn,
              recvs = recvs.len(), "fast path: direction granted");
        self.fast.grants += 1;
        self.fast.directions.insert(
            id,
            DirectionHost {
                taker: client,
                taker_qpn: qpn,
                peer,
                peer_qpn: pqpn,
                peer_recv_cq: pc.init.recv_cq,
                taker_send_cq: config.init.send_cq,
                peer_srq: srq,
                region,
                control,
                ring: RingPlace(ring),
                recvs,
            },
        );
        (
            Response::FastGrant(Box::new(grant)),
            vec![block_fd, peer_fd, peer_table, own_table],
        )
    }

    /// `FastSources`: the rings of the directions that feed `cq` of `client`.
    pub(super) fn fast_sources(
        &self,
        client: u64,
        cq: u32,
        known: &[u64],
    ) -> (Response, Vec<OwnedFd>) {
        let mut rings = Vec::new();
        let mut fds = Vec::new();
        let live = self
            .fast
            .directions
            .iter()
            .filter(|(_, d)| d.peer == client && d.peer_recv_cq == cq)
            .map(|(id, d)| (*id, &d.region, d.ring.0));
        let retired = self
            .fast
            .retired
            .iter()
            .filter(|r| r.peer == client && r.peer_recv_cq == cq)
            .map(|r| (r.id, &r.region, r.ring));
        let mut more = false;
        for (direction, region, ring) in live.chain(retired) {
            if known.contains(&direction) {
                continue;
            }
            if rings.len() == ctl::FAST_SOURCES_PER_MESSAGE {
                more = true;
                break;
            }
            if let Some(fd) = region.dup_fd() {
                rings.push(FastRing {
                    direction,
                    block_len: region.len() as u64,
                    ring,
                });
                fds.push(fd);
            }
        }
        (Response::FastSources { rings, more }, fds)
    }

    /// `FastReturn`: the taker gives the direction of `qpn` back (it is outside it).
    pub(super) fn fast_return(&mut self, client: u64, qpn: u32, events: &[FastEvent]) -> Response {
        let ids: Vec<u64> = self
            .fast
            .directions
            .iter()
            .filter(|(_, d)| d.taker == client && d.taker_qpn == qpn)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            let peer = self.fast.directions[&id].peer;
            self.reclaim(id, true);
            for ev in events {
                let owner = if ev.qpn == qpn { client } else { peer };
                self.fast_event(owner, ev);
            }
        }
        Response::Done
    }

    /// Writes an event the taker's engines raised to the context of the QP's owner.
    fn fast_event(&mut self, client: u64, ev: &FastEvent) {
        let Some(c) = self.clients.get_mut(&client) else {
            return;
        };
        let Some(ctx) = c.qps.get(&ev.qpn).map(|q| q.ctx) else {
            return;
        };
        let Some(sink) = c.contexts.get_mut(&ctx) else {
            return;
        };
        let mut rec = [0u8; 16];
        rec[..8].copy_from_slice(&u64::from(ev.qpn).to_ne_bytes());
        rec[8..12].copy_from_slice(&ev.event_type.to_ne_bytes());
        sink.send(&rec, 12);
    }

    /// Revokes the directions `ids`; true once every one of them is back (its taker was
    /// outside it, or `force`: the taker is gone).
    pub(super) fn revoke_all(&mut self, ids: &[u64], force: bool) -> bool {
        let mut done = true;
        for id in ids {
            done &= self.reclaim(*id, force);
        }
        done
    }

    /// Takes direction `id` back: revokes it and, once its taker is outside it (or `force`),
    /// carries on from what the taker published. Returns whether it is back.
    pub(super) fn reclaim(&mut self, id: u64, force: bool) -> bool {
        let Some(d) = self.fast.directions.get(&id) else {
            return true;
        };
        d.control.revoke();
        if d.control.busy() && !force {
            return false;
        }
        let d = self.fast.directions.remove(&id).expect("present");
        self.fast.returns += 1;
        let p = d.control.published();
        let failed = p.flags & PUBLISHED_ERROR != 0;
        if let Some(c) = self.clients.get_mut(&d.taker) {
            let q = Qpn::new(d.taker_qpn);
            c.engine
                .set_requester_sequence(q, Psn::new(p.req_psn), Psn::new(p.comp_psn));
            c.engine
                .absorb_counters(q, &Counters::from_words(&d.control.counters(0)));
            if let Some(h) = c.qps.get_mut(&d.taker_qpn) {
                h.away = false;
                // The taker read what its send ring held when it took the direction.
                if h.sq.resync_consumer().is_err() {
                    debug!(
                        qpn = d.taker_qpn,
                        "the fast path's send ring came back corrupt"
                    );
                }
            }
            // Its send ring's doorbell may have rung while the ring was not read: read it.
            c.revisit.push(super::doorbells::Bell::Qp(d.taker_qpn));
            if failed {
                to_error(c, d.taker_qpn);
            }
        }
        if let Some(pc) = self.clients.get_mut(&d.peer) {
            let q = Qpn::new(d.peer_qpn);
            pc.engine
                .set_responder_sequence(q, Psn::new(p.resp_psn), p.msn);
            pc.engine
                .absorb_counters(q, &Counters::from_words(&d.control.counters(1)));
            let used = (p.recvs_used as usize).min(d.recvs.len());
            let mut recvs = d.recvs;
            let unused = recvs.split_off(used);
            // What the peer posted to the receive ring the taker did not take: read it.
            let ring = match d.peer_srq {
                Some(s) => {
                    pc.engine.return_srq_recvs(s, unused);
                    pc.revisit.push(super::doorbells::Bell::Srq(s));
                    pc.srqs.get_mut(&s).map(|st| {
                        st.lent = false;
                        // Then read again (the revisit): see `SharedRing::set_fast_lent`.
                        st.ring.set_fast_lent(false);
                        &mut st.ring
                    })
                }
                None => {
                    pc.engine.return_recvs(q, unused);
                    pc.revisit.push(super::doorbells::Bell::Qp(d.peer_qpn));
                    None
                }
            };
            if ring.is_some_and(|r| r.resync_consumer().is_err()) {
                debug!(
                    qpn = d.peer_qpn,
                    "the fast path's SRQ ring came back corrupt"
                );
            }
            if let Some(h) = pc.qps.get_mut(&d.peer_qpn) {
                h.lent = false;
                if let Some(rq) = h.rq.as_mut().filter(|_| d.peer_srq.is_none()) {
                    // Then read again (the revisit): see `SharedRing::set_fast_lent`.
                    rq.set_fast_lent(false);
                    if rq.resync_consumer().is_err() {
                        debug!(
                            qpn = d.peer_qpn,
                            "the fast path's receive ring came back corrupt"
                        );
                    }
                }
            }
            if failed {
                to_error(pc, d.peer_qpn);
            }
        }
        info!(device = %self.info.name, direction = id, failed, used = p.recvs_used,
              req_psn = p.req_psn, comp_psn = p.comp_psn, resp_psn = p.resp_psn, "fast path: direction back");
        self.fast.retired.push(Retired {
            id,
            peer: d.peer,
            peer_recv_cq: d.peer_recv_cq,
            region: d.region,
            ring: d.ring.0,
        });
        // Offered again (the taker asks after a pause) if the conditions still hold.
        self.fast_refresh(d.taker, d.taker_qpn);
        true
    }

    /// Whether packets between the device's QPs must pass the link's layers, where the fast
    /// path has none: a capture or a fault rule watches them, or the port is down and drops
    /// them.
    pub(super) fn local_packets_in_layers(&self) -> bool {
        self.link.capture.is_on()
            || self.link.faults.is_on()
            || self.naks.is_on()
            || self.link.port_down()
    }

    /// Once the last capture has ended (a capture ends on its own: its reader went away or
    /// took its count), no fault rule is left and the port is up, the QPs are offered again:
    /// a capture of a few seconds must not leave the programs that ran through it on the
    /// device's path for the rest of their lives. Each round; four tests when nothing changed.
    pub(super) fn notice_layers_clear(&mut self) {
        let now = self.local_packets_in_layers();
        if self.through_layers && !now {
            self.fast_through_layers(false);
        }
        self.through_layers = now;
    }

    /// A capture or a fault rule starts, or the port goes down (`needed`), or the last of
    /// them ends on this device. While any holds, the packets between local QPs must go
    /// through the link's layers, where the fast path has none: every direction is revoked
    /// (they come back as their takers leave them, the loop retries) and nothing is offered
    /// until none holds any more.
    pub(super) fn fast_through_layers(&mut self, needed: bool) {
        let all: Vec<u64> = self.fast.directions.keys().copied().collect();
        if needed && !self.revoke_all(&all, false) {
            self.fast_waiting.push(super::Waiting {
                directions: all,
                revoke: true,
                then: super::Then::Nothing,
            });
        }
        let qps: Vec<(u64, u32)> = self
            .clients
            .iter()
            .flat_map(|(id, c)| c.qps.keys().map(move |q| (*id, *q)))
            .collect();
        for (client, qpn) in qps {
            self.fast_refresh(client, qpn);
        }
    }

    /// A client is gone: the directions it took come back at once (their taker is gone), the
    /// ones whose peer it was once their takers are outside them (later, in the loop).
    pub(super) fn fast_client_gone(&mut self, client: u64) {
        let taken: Vec<u64> = self
            .fast
            .directions
            .iter()
            .filter(|(_, d)| d.taker == client)
            .map(|(id, _)| *id)
            .collect();
        self.revoke_all(&taken, true);
        let as_peer: Vec<u64> = self
            .fast
            .directions
            .iter()
            .filter(|(_, d)| d.peer == client)
            .map(|(id, _)| *id)
            .collect();
        if !self.revoke_all(&as_peer, false) {
            self.fast_waiting.push(super::Waiting {
                directions: as_peer,
                revoke: true,
                then: super::Then::Nothing,
            });
        }
        self.fast.tables.remove(&client);
    }

    /// The directions a request must wait for: those whose QPs it changes or reads (they are
    /// revoked now), or, for a deregistration, those reading the client's MR table.
    pub(super) fn fast_blockers(&mut self, client: u64, request: &Request) -> Vec<u64> {
        if self.fast.directions.is_empty() {
            return Vec::new();
        }
        let ids = match request {
            Request::ModifyQp { qpn, .. }
            | Request::QueryQp { qpn, .. }
            | Request::DestroyQp { qpn } => self.fast.involving(client, *qpn),
            // A second QP on a lent SRQ, or a change to it, needs the SRQ back.
            Request::CreateQp { srq: Some(s), .. }
            | Request::ModifySrq { srq: s, .. }
            | Request::DestroySrq { srq: s } => self
                .fast
                .directions
                .iter()
                .filter(|(_, d)| d.peer == client && d.peer_srq == Some(*s))
                .map(|(id, _)| *id)
                .collect(),
            // Armed: only the device may add completions to it now (it raises the event).
            // It stays armed, so nothing is offered meanwhile.
            Request::CqEventsWanted { cq } => self
                .fast
                .directions
                .iter()
                .filter(|(_, d)| {
                    (d.taker == client && d.taker_send_cq == *cq)
                        || (d.peer == client && d.peer_recv_cq == *cq)
                })
                .map(|(id, _)| *id)
                .collect(),
            Request::AllocMw { .. } | Request::CloseContext { .. } => self
                .fast
                .directions
                .iter()
                .filter(|(_, d)| d.peer == client || d.taker == client)
                .map(|(id, _)| *id)
                .collect(),
            _ => return Vec::new(),
        };
        self.revoke_all(&ids, false);
        ids
    }

    /// Retries the requests, replies and revocations that wait for directions; whether any
    /// is left.
    pub(super) fn fast_retry_waiting(&mut self) -> bool {
        if self.fast_waiting.is_empty() {
            return false;
        }
        let waiting = std::mem::take(&mut self.fast_waiting);
        for w in waiting {
            let ready = if w.revoke {
                self.revoke_all(&w.directions, false)
            } else {
                self.fast.quiet(&w.directions)
            };
            if !ready {
                self.fast_waiting.push(w);
                continue;
            }
            match w.then {
                super::Then::Request(msg) => {
                    self.message(*msg);
                }
                super::Then::Reply(r) => {
                    let (resp, fds, reply) = *r;
                    let _ = reply.send((resp, fds));
                }
                super::Then::Nothing => {}
            }
        }
        !self.fast_waiting.is_empty()
    }
}

/// What a request's fast-path bookkeeping needs to know from before it ran.
pub(super) enum Before {
    Nothing,
    RegMr,
    /// The engine index of the MR being deregistered.
    DeregMr(Option<u32>),
    /// A QP being modified or destroyed, and the QP it was connected to.
    Qp(u32, Option<(u64, u32)>),
    /// A memory window: the client can no longer be the peer of a direction.
    Mw,
    /// A QP created on an SRQ (which then feeds more than one QP) or an SRQ modified (its
    /// limit armed), or a CQ armed for events: the QPs that use them may no longer be
    /// offered (or may again).
    Srq(u32),
    Cq(u32),
}

impl DeviceThread {
    /// The QPs of `client` whose creation attributes match.
    fn qps_where(&self, client: u64, f: impl Fn(&proto::transport::QpInit) -> bool) -> Vec<u32> {
        let Some(c) = self.clients.get(&client) else {
            return Vec::new();
        };
        c.qps
            .keys()
            .copied()
            .filter(|&q| c.engine.qp_config(Qpn::new(q)).is_some_and(|x| f(&x.init)))
            .collect()
    }

    /// Sets the offers of `qpns` of `client` and of the QPs they are connected to as the
    /// conditions say now.
    fn refresh_both(&self, client: u64, qpns: &[u32]) {
        for &qpn in qpns {
            self.fast_refresh(client, qpn);
            if let Some((p, pq)) = self.connected_to(client, qpn) {
                self.fast_refresh(p, pq);
            }
        }
    }

    /// CQs whose channel event fired are disarmed: the QPs that use them may be offered
    /// again.
    pub(super) fn fast_events_fired(&mut self) {
        let fired: Vec<(u64, Vec<u32>)> = self
            .clients
            .iter_mut()
            .filter(|(_, c)| !c.fired_cqs.is_empty())
            .map(|(id, c)| (*id, std::mem::take(&mut c.fired_cqs)))
            .collect();
        for (client, cqs) in fired {
            let qps = self.qps_where(client, |init| {
                cqs.contains(&init.send_cq) || cqs.contains(&init.recv_cq)
            });
            self.refresh_both(client, &qps);
        }
    }

    /// The QP `(client, qpn)` is connected to, if it is on this device.
    fn connected_to(&self, client: u64, qpn: u32) -> Option<(u64, u32)> {
        let dest = self
            .clients
            .get(&client)?
            .engine
            .qp_config(Qpn::new(qpn))?
            .attr
            .dest_qp_num
            .value();
        let peer = *self.blocks.get(&(dest / super::clients::QPN_BLOCK))?;
        Some((peer, dest))
    }

    pub(super) fn fast_before(&self, client: u64, request: &Request) -> Before {
        if !self.fast.enabled {
            return Before::Nothing;
        }
        match request {
            Request::RegMr { .. } => Before::RegMr,
            // A re-registration changes the MR under the tables takers read, as a
            // deregistration does: answered once no taker is inside them.
            Request::DeregMr { mr } | Request::ReregMr { mr, .. } => Before::DeregMr(
                self.clients
                    .get(&client)
                    .and_then(|c| c.mrs.get(mr).map(|m| m.0)),
            ),
            Request::ModifyQp { qpn, .. } | Request::DestroyQp { qpn } => {
                Before::Qp(*qpn, self.connected_to(client, *qpn))
            }
            Request::AllocMw { .. } => Before::Mw,
            Request::CreateQp { srq: Some(s), .. } | Request::ModifySrq { srq: s, .. } => {
                Before::Srq(*s)
            }
            Request::CqEventsWanted { cq } => Before::Cq(*cq),
            _ => Before::Nothing,
        }
    }

    /// The fast-path bookkeeping after a request ran: offers, MR tables. Returns the
    /// directions the reply must wait for (a deregistration is answered once no taker can
    /// still be using the region).
    pub(super) fn fast_after(
        &mut self,
        client: u64,
        before: Before,
        resp: &Response,
    ) -> Option<Vec<u64>> {
        match before {
            Before::Nothing => None,
            Before::RegMr => {
                if let Response::Mr { mr, .. } = resp {
                    let index = self
                        .clients
                        .get(&client)
                        .and_then(|c| c.mrs.get(&super::handles::untag_handle(*mr)).map(|m| m.0));
                    if let Some(index) = index {
                        self.fast_mr_changed(client, index);
                    }
                }
                None
            }
            Before::DeregMr(index) => {
                let index = index.filter(|_| matches!(resp, Response::Done))?;
                self.fast_mr_changed(client, index);
                let ids = self.fast.of_client(client);
                (!self.fast.quiet(&ids)).then_some(ids)
            }
            Before::Qp(qpn, was) => {
                self.fast_refresh(client, qpn);
                // The QP it was connected to, and the one it is connected to now: a modify to
                // RTR gives it its destination, and a peer already in RTS (perftest's sender
                // when the passive side connects last) may be offered only from now on.
                let now = self.connected_to(client, qpn);
                for (p, pq) in was.into_iter().chain(now.filter(|n| Some(*n) != was)) {
                    self.fast_refresh(p, pq);
                }
                None
            }
            Before::Srq(srq) => {
                let qps = self.qps_where(client, |init| init.srq == Some(srq));
                self.refresh_both(client, &qps);
                None
            }
            Before::Cq(cq) => {
                // Completions a direction added after the arm and before it came back are
                // the CQ's newest: they fire the event the device would have raised.
                let unread = self
                    .fast
                    .retired
                    .iter()
                    .any(|r| r.peer == client && r.peer_recv_cq == cq && !r.drained());
                let index = self.index;
                if let Some(c) = self.clients.get_mut(&client) {
                    if unread && c.cqs.get(&cq).is_some_and(|q| q.ring.take_arm(true)) {
                        super::completions::send_cq_event(c, cq, index);
                    }
                }
                let qps = self.qps_where(client, |init| init.send_cq == cq || init.recv_cq == cq);
                self.refresh_both(client, &qps);
                None
            }
            Before::Mw => {
                // Every QP connected to one of this client's: no longer offered.
                let towards: Vec<(u64, u32)> = self
                    .clients
                    .iter()
                    .flat_map(|(&id, c)| c.qps.keys().map(move |&q| (id, q)))
                    .filter(|&(id, q)| self.connected_to(id, q).is_some_and(|(p, _)| p == client))
                    .collect();
                for (id, q) in towards {
                    self.fast_refresh(id, q);
                }
                None
            }
        }
    }
}

/// Moves a QP of `c` to ERR (its halves came back from a direction that ended in an error).
fn to_error(c: &mut ClientDev, qpn: u32) {
    let attr = QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    let _ = c.engine.modify_qp(Qpn::new(qpn), &attr, AttrMask::STATE);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taker_names_its_peer_in_its_own_pid_namespace_or_not_at_all() {
        let (host, pod, other_pod) = (1, 2, 3);
        let in_pod = |own| PidView { ns: pod, own };
        // Two processes of one container: the peer's own number.
        assert_eq!(peer_pid_in(in_pod(7), in_pod(9), 48211, host), Some(9));
        // A taker in the daemon's namespace sees the container's process by the daemon's
        // number.
        let on_host = PidView {
            ns: host,
            own: 5000,
        };
        assert_eq!(peer_pid_in(on_host, in_pod(9), 48211, host), Some(48211));
        // A taker in a container cannot name a process outside it, nor one of another
        // container.
        assert_eq!(peer_pid_in(in_pod(7), on_host, 5000, host), None);
        let elsewhere = PidView {
            ns: other_pod,
            own: 9,
        };
        assert_eq!(peer_pid_in(in_pod(7), elsewhere, 48212, host), None);
    }

    #[test]
    fn the_innermost_nspid_is_the_process_own_number() {
        let status = "Name:\tib_write_bw\nPid:\t48211\nNSpid:\t48211\t12\t7\nUid:\t1000\t0\t0\t0\n";
        let last = |s, key| status_field(s, key).and_then(|f| f.last());
        assert_eq!(last(status, "NSpid:"), Some("7"));
        assert_eq!(
            status_field(status, "Uid:").and_then(|mut f| f.next()),
            Some("1000")
        );
        assert_eq!(last("NSpid:\t4\n", "NSpid:"), Some("4"));
        assert!(status_field("Pid:\t4\n", "NSpid:").is_none());
        // This process, as the daemon reads a client.
        let (uid, view) = process_identity(std::process::id() as i32);
        let me = view.expect("own view");
        assert_eq!(Some(me.ns), daemon_pid_ns());
        assert_eq!(me.own, std::process::id() as i32);
        assert_eq!(uid, Some(nix::unistd::getuid().as_raw()));
    }
}
