//! One direction this process runs: the requester of its QP and the responder of the peer QP,
//! each in an engine of its own (the same `proto::transport::Engine` the daemon runs), with
//! packets handed from one to the other in this thread, as the daemon hands packets between
//! two of its own engines.
//!
//! The peer's engine reaches the peer's memory with `process_vm_writev`/`readv` (deferred and
//! merged, as in the daemon), takes the peer's receive WQEs from its receive ring when a
//! request needs one, and delivers the peer's receive completions into the direction's ring,
//! which the peer's `ibv_poll_cq` reads. This process's own send completions stay here.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::time::Instant;

use proto::ctl::{self, FastEvent, FastGrant, FastQp};
use proto::ring::fast::{
    Direction, FastCqe, MrChanges, MrCursor, MrTable, Published, PUBLISHED_ERROR,
};
use proto::ring::wqe::{self, convert, Cqe, RecvWqe};
use proto::ring::SharedRing;
use proto::transport::{
    Access, AsyncEvent, Engine, EngineConfig, MemoryAccess, MrKeys, Mtu, QpCap, QpConfig, QpInit,
    QpSequence, QpState, QpType, SendWr, WcOpcode, WcStatus,
};
use proto::wire::{OpInfo, Opcode};
use proto::{Lkey, Psn, Qpn, Rkey};

use super::memory::{InPlace, LocalMemory, PeerMemory, Placed};
use crate::ffi::Errno;
use crate::shm::Mapping;

/// What a pump left behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Both halves idle, direction still ours.
    Idle,
    /// The daemon took it back: post through the ring from now on.
    Revoked,
    /// Something the fast path leaves to the daemon happened (an error, a state change, a
    /// timer): give it back.
    GiveBack,
}

/// The engine-level pieces of one QP made from its `FastQp`.
fn qp_config(fq: &FastQp, pd: u32, cq: u32) -> Result<(QpConfig, QpSequence), Errno> {
    let attr = ctl::transport_attr(&fq.attr).ok_or(Errno::PROTO)?;
    let qp_type = match fq.qp_type {
        ctl::qp_type::RC => QpType::Rc,
        ctl::qp_type::UC => QpType::Uc,
        _ => return Err(Errno::PROTO),
    };
    let state = QpState::from_u32(fq.state).ok_or(Errno::PROTO)?;
    let init = QpInit {
        pd,
        qp_type,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap: QpCap {
            max_send_wr: fq.cap.max_send_wr.max(1),
            max_recv_wr: fq.cap.max_recv_wr.max(1),
            max_send_sge: fq.cap.max_send_sge,
            max_recv_sge: fq.cap.max_recv_sge,
            max_inline_data: fq.cap.max_inline_data,
        },
        sq_sig_all: fq.sq_sig_all,
    };
    let seq = QpSequence {
        req_psn: attr.sq_psn,
        comp_psn: Psn::new(fq.comp_psn),
        resp_psn: attr.rq_psn,
        msn: fq.msn,
    };
    Ok((
        QpConfig {
            qpn: Qpn::new(fq.qpn),
            init,
            attr,
            state,
        },
        seq,
    ))
}

/// An engine configured as the daemon's engines of this device are.
fn engine<M: MemoryAccess>(g: &FastGrant, mem: M) -> Result<Engine<M>, Errno> {
    let gids: Vec<IpAddr> = g.gids.iter().map(|gid| ctl::ip_of_gid(*gid)).collect();
    let first = *gids.first().ok_or(Errno::PROTO)?;
    let mut config = EngineConfig::new(first, 0);
    config.gids = gids;
    config.port_mtu = Mtu::from_enum(u32::from(g.port_mtu)).unwrap_or(Mtu::Mtu1024);
    // Packets between the two engines never leave the process: never sealed, taken as
    // verified (as between two engines of the daemon).
    config.seal_icrc = false;
    // Nor is anything on a wire: a burst asks for one ACK.
    config.coalesce_acks = true;
    Ok(Engine::new(config, mem))
}

/// One side's view of a client's MR table, and the PD its engine mirrors.
struct MrMirror {
    table: MrTable,
    cursor: MrCursor,
    /// The client's PD handle whose regions the engine holds, and the engine's PD.
    client_pd: u32,
    engine_pd: u32,
    _map: Mapping,
}

impl MrMirror {
    fn new(fd: &OwnedFd, len: u64, client_pd: u32, engine_pd: u32) -> Result<MrMirror, Errno> {
        let map = Mapping::map(fd, len)?;
        // SAFETY: the mapping is `len` bytes, page aligned, and lives in the struct beside
        // the table (declared after it, so dropped after).
        let table = unsafe { MrTable::attach(map.base(), map.len()) }.ok_or(Errno::PROTO)?;
        Ok(MrMirror {
            table,
            cursor: MrCursor::default(),
            client_pd,
            engine_pd,
            _map: map,
        })
    }

    /// Brings the engine's copy of the regions up to date with the table.
    fn sync<M: MemoryAccess>(&mut self, engine: &mut Engine<M>) {
        let indexes: Vec<u32> = match self.table.changes(&mut self.cursor) {
            MrChanges::None => return,
            MrChanges::Some(v) => v,
            MrChanges::Rescan => (0..self.table.high()).collect(),
        };
        for index in indexes {
            match self.table.entry(index).filter(|e| e.pd == self.client_pd) {
                Some(e) => {
                    let keys = MrKeys {
                        handle: e.index,
                        lkey: Lkey(e.lkey),
                        rkey: Rkey(e.rkey),
                    };
                    let _ =
                        engine.insert_mr(self.engine_pd, keys, e.addr, e.length, Access(e.access));
                }
                None => engine.remove_mr(index),
            }
        }
    }
}

pub struct DirectionRt {
    pub id: u64,
    /// This process's QP (its requester runs here) and the peer's (its responder).
    pub requester: Qpn,
    pub responder: Qpn,
    /// The client's handle of the CQ that gets the requester's completions.
    pub send_cq: u32,
    own: Engine<LocalMemory>,
    mirror: Engine<PeerMemory>,
    own_cq: u32,
    mirror_cq: u32,
    own_mrs: MrMirror,
    peer_mrs: MrMirror,
    control: Direction,
    /// The peer's receive completions go here (we produce, the peer consumes).
    ring: SharedRing,
    ring_slot: Vec<u8>,
    /// Completions the ring had no room for yet, oldest first.
    held: VecDeque<Vec<u8>>,
    /// The counter words last stored into `control` (both engines'), as it holds them.
    published: [[u64; proto::ring::fast::COUNTER_WORDS]; 2],
    /// Scratch of `deliver`: the peer's completions of one pass, with the range of
    /// `pieces` (address, offset in the carried bytes, length) each carries.
    ready: Vec<(Cqe, usize, usize)>,
    pieces: Vec<(u64, usize, usize)>,
    /// The peer QP's receive queue (its own ring, or its SRQ's): we consume it while the
    /// direction is ours.
    peer_rq: SharedRing,
    peer_max_recv_sge: usize,
    rq_slot: Vec<u8>,
    /// The receive WQEs the daemon held for the peer QP (they go before `peer_rq`'s), and
    /// how many of them were used.
    given: SharedRing,
    given_slot: Vec<u8>,
    recvs_used: u32,
    /// The WQE last fed to the responder came from `given`.
    last_from_given: bool,
    /// The requester's completions, for this process's `ibv_poll_cq` of `send_cq`.
    pub completions: VecDeque<Cqe>,
    /// Events for the daemon to deliver when the direction is given back.
    pub events: Vec<FastEvent>,
    /// States at the grant: a change means the daemon must take over.
    own_state: QpState,
    mirror_state: QpState,
    frame: Vec<u8>,
    start: Instant,
    /// Entered, with queued work not run yet (see [`DirectionRt::queue`]).
    open: bool,
    opened_at: Instant,
    queued: usize,
    receives_queued: u32,
    _block: Mapping,
    _peer_region: Mapping,
}

// SAFETY: the engines and rings are only used under the owning context's fast-path lock;
// their raw pointers point into mappings owned by the same struct.
unsafe impl Send for DirectionRt {}

impl DirectionRt {
    /// Builds the direction the daemon granted. `fds`: the direction's memfd, the peer QP's
    /// ring memfd, the peer's MR table, our own MR table.
    pub fn new(g: &FastGrant, fds: &[OwnedFd]) -> Result<DirectionRt, Errno> {
        let [block_fd, peer_fd, peer_mr_fd, own_mr_fd] = fds else {
            return Err(Errno::PROTO);
        };
        let block = Mapping::map(block_fd, g.block_len)?;
        // SAFETY: the mapping is at least block_len bytes, page aligned, and lives in the
        // struct beside the handle.
        let control = unsafe { Direction::attach(block.base(), block.len(), g.direction) }
            .ok_or(Errno::PROTO)?;
        let published = [control.counters(0), control.counters(1)];
        let ring = block.ring(&g.ring, true)?;
        let mut given = block.ring(&g.recvs, false)?;
        given.resync_consumer().map_err(|_| Errno::PROTO)?;
        let peer_region = Mapping::map(peer_fd, g.peer_region_len)?;
        let mut peer_rq = peer_region.ring(&g.peer_rq, false)?;
        peer_rq.resync_consumer().map_err(|_| Errno::PROTO)?;

        let mut own = engine(g, LocalMemory::default())?;
        let own_pd = own.alloc_pd();
        let own_cq = own.create_cq(32767).map_err(|_| Errno::PROTO)?;
        let (oc, os) = qp_config(&g.requester, own_pd, own_cq)?;
        own.import_qp(&oc, &os).map_err(|_| Errno::PROTO)?;
        let mut own_mrs = MrMirror::new(own_mr_fd, g.own_mr_table_len, g.requester.pd, own_pd)?;
        own_mrs.sync(&mut own);

        let mut mirror = engine(g, PeerMemory::new(g.peer_pid))?;
        let mirror_pd = mirror.alloc_pd();
        let mirror_cq = mirror.create_cq(32767).map_err(|_| Errno::PROTO)?;
        let (mc, ms) = qp_config(&g.responder, mirror_pd, mirror_cq)?;
        mirror.import_qp(&mc, &ms).map_err(|_| Errno::PROTO)?;
        let mut peer_mrs = MrMirror::new(peer_mr_fd, g.mr_table_len, g.responder.pd, mirror_pd)?;
        peer_mrs.sync(&mut mirror);
        let slot_size = g.ring.slot_size as usize;
        let peer_slot = g.peer_rq.slot_size as usize;
        Ok(DirectionRt {
            id: g.direction,
            requester: oc.qpn,
            responder: mc.qpn,
            send_cq: g.requester.send_cq,
            own,
            mirror,
            own_cq,
            mirror_cq,
            own_mrs,
            peer_mrs,
            control,
            ring,
            ring_slot: vec![0u8; slot_size],
            held: VecDeque::new(),
            published,
            ready: Vec::new(),
            pieces: Vec::new(),
            peer_rq,
            peer_max_recv_sge: g.responder.cap.max_recv_sge as usize,
            rq_slot: vec![0u8; peer_slot],
            given_slot: vec![0u8; g.recvs.slot_size as usize],
            given,
            recvs_used: 0,
            last_from_given: false,
            completions: VecDeque::new(),
            events: Vec::new(),
            own_state: oc.state,
            mirror_state: mc.state,
            frame: vec![0u8; proto::transport::MAX_FRAME_LEN],
            start: Instant::now(),
            open: false,
            opened_at: Instant::now(),
            queued: 0,
            receives_queued: 0,
            _block: block,
            _peer_region: peer_region,
        })
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Whether `extra` more messages that each consume a receive WQE of the peer would find
    /// one now (the peer's queue only grows meanwhile: we are its only consumer). A message
    /// that would not is left to the daemon, which has the RNR machinery and its timers.
    pub fn receives_available(&self, extra: u32) -> bool {
        let queued = self.mirror.rq_len(self.responder).unwrap_or(0) as u64;
        let given = u64::from(self.given.available().unwrap_or(0));
        let in_ring = u64::from(self.peer_rq.available().unwrap_or(0));
        queued + given + in_ring >= u64::from(extra)
    }

    /// Queues `wrs` on the requester, entering the direction first if this process is
    /// outside it (false: the daemon revoked it; nothing was queued). A request the engine
    /// refuses completes with an error, as the daemon completes one it refuses. The work
    /// runs at [`DirectionRt::close`]: the next `ibv_poll_cq`, a full batch, or the
    /// backstop (`super::Backstop`), so that a burst of posts costs one pass, one ACK and one
    /// `process_vm_writev`; the direction stays entered meanwhile (a revoke waits for it).
    pub fn queue(&mut self, wrs: &mut Vec<SendWr>) -> bool {
        if !self.enter() {
            return false;
        }
        for wr in wrs.drain(..) {
            self.queued += 1;
            if matches!(
                wr.op,
                proto::transport::SendOp::Send
                    | proto::transport::SendOp::SendWithImm(_)
                    | proto::transport::SendOp::SendWithInv(_)
                    | proto::transport::SendOp::WriteWithImm(..)
            ) {
                self.receives_queued += 1;
            }
            let (wr_id, opcode) = (wr.wr_id, wr.op.wc_opcode() as u32);
            if self.own.post_send(self.requester, wr).is_err() {
                self.completions.push_back(Cqe {
                    wr_id,
                    status: WcStatus::LocQpOpErr as u32,
                    opcode,
                    qp_num: self.requester.value(),
                    ..Cqe::default()
                });
            }
        }
        true
    }

    /// Enters the direction if this process is outside it (false: the daemon revoked it).
    /// Inside, the daemon waits for this process before it takes the QPs back.
    pub fn enter(&mut self) -> bool {
        if !self.open {
            if !self.control.enter() {
                return false;
            }
            self.open = true;
            self.opened_at = Instant::now();
            self.own_mrs.sync(&mut self.own);
            self.peer_mrs.sync(&mut self.mirror);
        }
        true
    }

    /// Work requests queued and not run yet that take a receive WQE of the peer.
    pub fn receives_queued(&self) -> u32 {
        self.receives_queued
    }

    /// Work requests queued since the direction was entered.
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// Since when the direction is entered with work not run yet (None: outside).
    pub fn open_since(&self) -> Option<Instant> {
        self.open.then_some(self.opened_at)
    }

    /// The first half of a close, for a caller about to close several directions: runs the
    /// engines and hands what they wrote for the peer to the copier, which copies while the
    /// caller starts the others. [`DirectionRt::close`] then waits for those copies before
    /// any completion leaves (it runs the engines again first, in case work was queued in
    /// between, which costs a poll of each when there is none).
    pub fn start_close(&mut self) {
        if !self.open {
            return;
        }
        self.pump();
        self.mirror.memory_mut().hand_off();
    }

    /// Runs what was queued: both engines until neither has anything to send, then the
    /// completions out and the state published, and leaves the direction.
    pub fn close(&mut self) -> Outcome {
        if !self.open {
            return Outcome::Idle;
        }
        self.pump();
        self.deliver();
        let outcome = self.settle();
        self.open = false;
        self.queued = 0;
        self.receives_queued = 0;
        self.control.leave();
        outcome
    }

    /// Runs both engines until neither has anything to send (inside `enter`/`leave`).
    fn pump(&mut self) {
        let now = self.now();
        self.mirror.memory_mut().begin_pass();
        loop {
            let mut moved = false;
            loop {
                let _ = self.own.memory().take_lent();
                let Some(tx) = self.own.poll_transmit(now, &mut self.frame) else {
                    break;
                };
                moved = true;
                let info = self
                    .frame
                    .get(tx.transport_offset)
                    .and_then(|&op| Opcode(op).info().map(|i| (op, i)));
                if let Some((op, _)) = info {
                    self.feed_receive(op);
                }
                // The copier writes the peer's memory while this thread goes on only for an
                // RDMA WRITE that completes nothing there: a message the peer's poller waits
                // for would make three busy threads on two CPUs.
                let bulk_write =
                    info.is_some_and(|(_, i)| i.has(OpInfo::WRITE) && !i.has(OpInfo::RWR));
                self.mirror.memory_mut().allow_copy_ahead(bulk_write);
                // A payload the requester lent stayed out of the packet: the responder
                // writes it into the peer from the sender's buffer (the one copy).
                let in_place = match self.own.memory().take_lent() {
                    None => None,
                    Some(lent) => {
                        let at = in_place(&self.frame[..tx.len], tx.transport_offset, lent);
                        if at.is_none() {
                            // Never (the engine lends exactly the payload): lost rather than
                            // placed from stale bytes, so the requester's retry shows it.
                            super::trace(format_args!("payload left out of place: {lent:?}"));
                            continue;
                        }
                        at
                    }
                };
                self.mirror.memory_mut().in_place = in_place;
                self.mirror
                    .handle_verified_packet(now, &self.frame[..tx.len]);
                self.mirror.memory_mut().in_place = None;
            }
            while let Some(tx) = self.mirror.poll_transmit(now, &mut self.frame) {
                moved = true;
                self.own.handle_verified_packet(now, &self.frame[..tx.len]);
            }
            for due in [self.own.poll_timeout(), self.mirror.poll_timeout()] {
                if due.is_some_and(|t| t <= now) {
                    self.own.handle_timeout(now);
                    self.mirror.handle_timeout(now);
                    moved = true;
                }
            }
            if !moved {
                break;
            }
        }
        self.mirror.memory_mut().end_pass();
    }

    /// Before a request packet that takes a receive WQE reaches the peer's responder, gives
    /// the responder one from the peer's ring if it has none (only then: a WQE taken is
    /// used in the same pump, so none is left over when the direction goes back).
    fn feed_receive(&mut self, opcode: u8) {
        let Some(info) = Opcode(opcode).info() else {
            return;
        };
        let takes = info.has(OpInfo::RWR)
            && (info.has(OpInfo::START) || info.has(OpInfo::WRITE))
            && info.has(OpInfo::REQUEST);
        if !takes || self.mirror.rq_len(self.responder) != Some(0) {
            return;
        }
        let mut sges = [wqe::Sge::default(); wqe::MAX_SGE];
        // Those the daemon held first: they are older.
        while let Ok(true) = self.given.pop(&mut self.given_slot) {
            self.recvs_used += 1;
            self.last_from_given = true;
            let Ok(w) = RecvWqe::decode(&self.given_slot, wqe::MAX_SGE, &mut sges) else {
                continue;
            };
            let _ = self.mirror.post_recv(self.responder, convert::recv_wr(&w));
            return;
        }
        self.last_from_given = false;
        while let Ok(true) = self.peer_rq.pop(&mut self.rq_slot) {
            let Ok(w) = RecvWqe::decode(&self.rq_slot, self.peer_max_recv_sge, &mut sges) else {
                // As the daemon does with a malformed receive WQE: skipped.
                continue;
            };
            let _ = self.mirror.post_recv(self.responder, convert::recv_wr(&w));
            return;
        }
    }

    /// Moves the completions out: the requester's to `completions`, the peer's receive
    /// completions into the ring, each with the small receive data it owns; everything
    /// else written into the peer lands first.
    fn deliver(&mut self) {
        while let Some(wc) = self.own.poll_cq(self.own_cq) {
            self.completions.push_back(convert::cqe(&wc));
        }
        // (completion, range of `pieces` it carries)
        self.ready.clear();
        self.pieces.clear();
        while let Some(wc) = self.mirror.poll_cq(self.mirror_cq) {
            let cqe = convert::cqe(&wc);
            let mem = self.mirror.memory_mut();
            let first = self.pieces.len();
            if wc.status != WcStatus::Success {
                // What a failed receive placed is undefined; the QP is going to ERR, so
                // nothing placed after it belongs to a later completion either.
                mem.placed.clear();
            } else if wc.opcode == WcOpcode::Recv {
                let mut owed = wc.byte_len as usize;
                let mut all_carried = true;
                while owed > 0 {
                    let Some(p) = mem.placed.pop_front() else {
                        break;
                    };
                    owed = owed.saturating_sub(p.bytes());
                    match p {
                        Placed::Carried { addr, at, len } => self.pieces.push((addr, at, len)),
                        Placed::Written(_) => all_carried = false,
                    }
                }
                let fits = FastCqe::encoded_len_of(self.pieces[first..].iter().map(|p| p.2))
                    <= self.ring_slot.len();
                if !all_carried || !fits {
                    for &(addr, at, len) in &self.pieces[first..] {
                        let data = mem.arena[at..at + len].to_vec();
                        mem.write_now(addr, &data);
                    }
                    self.pieces.truncate(first);
                }
            }
            self.ready.push((cqe, first, self.pieces.len()));
        }
        self.mirror.memory_mut().flush();
        let arena = &self.mirror.memory().arena;
        for &(cqe, from, to) in &self.ready {
            let pieces = self.pieces[from..to]
                .iter()
                .map(|&(addr, at, len)| (addr, &arena[at..at + len]));
            let Some(n) = FastCqe::encode_from(&cqe, pieces, &mut self.ring_slot) else {
                continue;
            };
            if self.held.is_empty() && self.ring.push(&self.ring_slot[..n]).is_ok() {
                continue;
            }
            self.held.push_back(self.ring_slot[..n].to_vec());
        }
        self.mirror.memory_mut().arena.clear();
        while let Some(entry) = self.held.front() {
            match self.ring.push(entry) {
                Ok(_) => {
                    self.held.pop_front();
                }
                Err(_) => break,
            }
        }
    }

    /// Whether the responder holds a WQE of `given` it did not use (after an error): it goes
    /// back to the daemon, which flushes it.
    fn given_unused(&self) -> bool {
        self.recvs_used > 0
            && self.last_from_given
            && self.mirror.rq_len(self.responder).unwrap_or(0) > 0
    }

    /// Publishes the state, collects events, and says whether the daemon must take over.
    fn settle(&mut self) -> Outcome {
        let (r, p) = (self.requester, self.responder);
        let own_seq = self.own.qp_sequence(r).unwrap_or_default();
        let peer_seq = self.mirror.qp_sequence(p).unwrap_or_default();
        let own_state = self.own.qp_config(r).map(|c| c.state);
        let peer_state = self.mirror.qp_config(p).map(|c| c.state);
        let failed = own_state != Some(self.own_state) || peer_state != Some(self.mirror_state);
        let mut events = false;
        for (qpn, ev) in std::iter::from_fn(|| self.own.poll_event().map(|e| (r, e)))
            .chain(std::iter::from_fn(|| {
                self.mirror.poll_event().map(|e| (p, e))
            }))
            .collect::<Vec<_>>()
        {
            if let Some(event_type) = event_type(&ev) {
                events = true;
                self.events.push(FastEvent {
                    qpn: event_qpn(&ev).unwrap_or(qpn).value(),
                    event_type,
                });
            }
        }
        let idle = self.own.requester_idle(r) && self.mirror.responder_idle(p);
        let held = !self.held.is_empty();
        self.control.publish(&Published {
            req_psn: own_seq.req_psn.value(),
            comp_psn: own_seq.comp_psn.value(),
            resp_psn: peer_seq.resp_psn.value(),
            msn: peer_seq.msn,
            recvs_used: self.recvs_used - u32::from(self.given_unused()),
            flags: if failed { PUBLISHED_ERROR } else { 0 },
        });
        let words = self.own.counters().words();
        self.control
            .write_changed_counters(0, &words, &mut self.published[0]);
        let words = self.mirror.counters().words();
        self.control
            .write_changed_counters(1, &words, &mut self.published[1]);
        if failed || events || !idle || held {
            super::trace(format_args!(
                "give back: failed={failed} events={events} idle={idle} held={held} {:?}",
                self.events
            ));
            Outcome::GiveBack
        } else {
            Outcome::Idle
        }
    }

    /// Runs what is queued and publishes the state once more (before giving it back);
    /// false if the daemon took the direction back already.
    pub fn publish_now(&mut self) -> bool {
        if self.open {
            let _ = self.close();
            return true;
        }
        if !self.control.enter() {
            return false;
        }
        let _ = self.settle();
        self.control.leave();
        true
    }

    pub fn is_revoked(&self) -> bool {
        self.control.is_revoked()
    }
}

/// Where, in `packet` (whose BTH is at `bth`), the payload of `lent` (its address and length
/// in this process) belongs: it ends before the pad bytes and the ICRC (IBTA §9.2, PadCnt in
/// BTH byte 1).
fn in_place(packet: &[u8], bth: usize, (local, len): (u64, usize)) -> Option<InPlace> {
    let pad = usize::from(packet.get(bth + 1)? >> 4 & 3);
    let end = packet.len().checked_sub(proto::wire::ICRC_LEN + pad)?;
    let start = end.checked_sub(len)?;
    // The BTH comes first.
    (start >= bth + 12).then(|| InPlace {
        frame_at: packet.as_ptr() as usize + start,
        len,
        local,
    })
}

/// `enum ibv_event_type` of an engine event (None for completion notifications, which the
/// fast path does not arm).
fn event_type(ev: &AsyncEvent) -> Option<u32> {
    Some(match ev {
        AsyncEvent::CqError { .. } => 0,
        AsyncEvent::QpFatal { .. } => 1,
        AsyncEvent::QpRequestError { .. } => 2,
        AsyncEvent::QpAccessError { .. } => 3,
        AsyncEvent::SqDrained { .. } => 5,
        AsyncEvent::SrqLimitReached { .. } => 15,
        AsyncEvent::LastWqeReached { .. } => 16,
        AsyncEvent::CqNotify { .. } => return None,
    })
}

fn event_qpn(ev: &AsyncEvent) -> Option<Qpn> {
    match ev {
        AsyncEvent::QpFatal { qpn }
        | AsyncEvent::QpRequestError { qpn }
        | AsyncEvent::QpAccessError { qpn }
        | AsyncEvent::SqDrained { qpn }
        | AsyncEvent::LastWqeReached { qpn } => Some(*qpn),
        _ => None,
    }
}
