//! A client process's presence on the device: its engine (all of its resources), the rings
//! and descriptors it shares with the daemon, and the device-side bookkeeping of each object.
//! A client's engine is created on its first request and dropped, with everything in it, when
//! the client goes (or when its engine panicked: see [`contained`]).

use super::arena::{RingArena, RingMemory};
use super::doorbells::{Bell, DoorbellTable};
use super::events::EventSink;
use super::DeviceThread;
use crate::memory::ProcessMemory;
use crate::peer::ClientProcess;
use crate::shm::SharedRegion;
use proto::ctl::ClientResources;
use proto::ring::SharedRing;
use proto::transport::{self as tp, MemoryAccess, MemoryError, Mtu, QpCap, RecvWr, SendWr};
use proto::Qpn;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use tracing::{debug, info};

/// QPNs per client engine: client k gets `[k * BLOCK, (k + 1) * BLOCK)`; block 0 holds the
/// reserved QPNs 0 and 1.
pub(super) const QPN_BLOCK: u32 = 1 << 16;

/// A client process's memory as the engine sees it.
pub struct ProcMem(pub(super) RefCell<ProcessMemory>);

impl std::fmt::Debug for ProcMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProcMem")
    }
}

/// One engine serves one client process, so the engine's address space tag is always 0.
impl MemoryAccess for ProcMem {
    fn read(&self, _space: u64, addr: u64, out: &mut [u8]) -> Result<(), MemoryError> {
        let len = out.len();
        self.0
            .borrow_mut()
            .read(addr, out)
            .map_err(|_| MemoryError { addr, len })
    }
    fn write(&mut self, _space: u64, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        self.0.get_mut().write(addr, data).map_err(|_| MemoryError {
            addr,
            len: data.len(),
        })
    }

    /// The payload as it lies in the read-ahead window, for the engine to copy into a sealed
    /// packet by the pass that computes the ICRC (while a capture takes the packets between
    /// local QPs, the engines seal them: `DeviceThread::transmit`). Unsealed packets take the
    /// same bytes by the same copy as [`ProcMem::read`] would make.
    fn lend(&self, _space: u64, addr: u64, len: usize) -> Option<&[u8]> {
        if !self.0.borrow_mut().lend(addr, len) {
            return None;
        }
        // SAFETY: `try_borrow_unguarded` hands out a shared reference to the memory without
        // marking it borrowed; that is sound while nothing borrows it mutably. The only
        // mutable borrows of the cell through `&self` are this method's, just above and
        // ended, and `read`'s; the engine copies a lent slice before it calls into its
        // memory again (`MemoryAccess::lend`'s contract: the two callers, the requester's
        // `gather` and the responder's READ response, copy it in `packet_io::emit` right
        // after). Everything else that changes the memory takes `&mut self`, which cannot
        // coexist with the `&self` the slice borrows from.
        let memory = unsafe { self.0.try_borrow_unguarded() }.ok()?;
        memory.lent(addr, len)
    }
}

impl ProcMem {
    /// Before the engine sends anything or completions are delivered, deferred writes land
    /// (memory::ProcessMemory); then a transmit pass starts (`begin`) or ends, and with it
    /// the reads served from snapshots. Returns the QPs whose placed data did not reach the
    /// process (it unmapped memory it had registered).
    pub(super) fn settle(&mut self, begin: bool) -> Vec<u32> {
        let m = self.0.get_mut();
        if let Err(e) = m.flush() {
            debug!("a deferred write into the client failed: {e}");
        }
        if begin {
            m.begin_pass();
        } else {
            m.end_pass();
        }
        m.take_failed_writers()
    }

    /// Names the QP whose packet the engine places next (see [`ProcMem::settle`]).
    pub(super) fn placing_for(&mut self, qpn: u32) {
        self.0.get_mut().set_writer(qpn);
    }
}

pub(super) type Engine = tp::Engine<ProcMem>;

pub(super) struct CqState {
    pub region: SharedRegion,
    pub ring: SharedRing,
    pub channel: Option<u32>,
    pub generation: u32,
    pub ctx: u32,
    /// Overrun: the CQ is in error and its QPs were moved to ERR.
    pub in_error: bool,
    /// Times its client armed it for a channel event after fast-path directions had fed it,
    /// or might have (`Request::CqEventsWanted`); from the second on (`events_only`) no
    /// direction feeds it again and the shim stops asking: its client waits on events rather
    /// than polls, and every arm would otherwise cost a control request.
    pub arm_requests: u8,
    /// Events fired while an offer waited for them (`offer_waits`), since the last grant of a
    /// direction the CQ takes part in: from the second on (`events_only`) it stays with the
    /// device. Its program arms it again before it posts (qperf, `ibv_rc_pingpong -e`), so
    /// a take would find it armed after every event, each one a control request and each
    /// event a pass over its QPs' offers for nothing.
    pub event_waits: u8,
    pub events_only: bool,
    /// An offer was refused because the CQ was armed: when its event fires, the QPs that
    /// use it are looked at again (`DeviceThread::fast_events_fired`); no other fired event
    /// costs the device a pass over the client's QPs.
    pub offer_waits: std::cell::Cell<bool>,
}

pub(super) struct QpHost {
    /// Where its rings are: a region of one of the client's ring chunks ([`super::arena`]).
    pub memory: RingMemory,
    pub sq: SharedRing,
    pub rq: Option<SharedRing>,
    pub cap: QpCap,
    pub send_cq: u32,
    pub recv_cq: u32,
    pub sq_sig_all: bool,
    /// Work the engine could not take yet (its queue was full), in order.
    pub pending_send: VecDeque<SendWr>,
    pub pending_recv: VecDeque<RecvWr>,
    pub ctx: u32,
    /// The same-host fast path ([`super::fast`]), for the RC and UC QPs that may lend their
    /// receive ring to a peer process: a descriptor of the memory the rings are in (the QP's
    /// own region, or its chunk), where the receive ring lies in it, and the length the
    /// client maps. `away`: the requester runs in the client's process (the send ring is not
    /// read meanwhile); `lent`: the receive ring is the taker's to read.
    pub fast: Option<(OwnedFd, proto::ctl::RingPlace, u64)>,
    pub away: bool,
    pub lent: bool,
    /// The send ring is not read for a while, so that the work in flight drains and the
    /// fast path can take the QP over (`DeviceThread::hold_for_take`); `hold_ended`: when
    /// the last hold ended without a take.
    pub held: bool,
    pub hold_ended: Option<proto::transport::Nanos>,
    /// A ring held a WQE that could not be decoded: the QP is in ERR and its rings are not
    /// read again.
    pub corrupt: bool,
    /// Its doorbell in the client's table (both queues share it).
    pub doorbell: u32,
}

pub(super) struct SrqState {
    pub region: SharedRegion,
    pub ring: SharedRing,
    pub max_sge: u32,
    pub pending: VecDeque<RecvWr>,
    pub limit: u32,
    pub max_wr: u32,
    pub ctx: u32,
    /// Its ring held a WQE that could not be decoded: the SRQ is in error.
    pub corrupt: bool,
    pub doorbell: u32,
    /// The same-host fast path ([`super::fast`]) may lend the SRQ's ring to the process
    /// that runs the responder of the one QP it feeds: a descriptor of the ring's region,
    /// where the ring lies, and the region's length. `lent`: the ring is that process's to
    /// read.
    pub fast: Option<(OwnedFd, proto::ctl::RingPlace, u64)>,
    pub lent: bool,
}

/// A client's presence on this device.
pub(super) struct ClientDev {
    pub pid: i32,
    /// The process's real user id (the fast path joins only processes of one user).
    pub uid: Option<u32>,
    /// Its PID namespace and its number there (the fast path gives a taker its peer's pid
    /// as the taker sees it).
    pub pid_view: Option<super::fast::PidView>,
    /// QPs whose memfd is kept for the fast path (at most [`super::fast::FD_BUDGET`]).
    pub fast_fds: usize,
    /// The device's index (in the handles the client is given).
    pub device: u32,
    pub engine: Engine,
    /// Its QPN blocks (one more each time the QPs fill those it has: [`DeviceThread::grow_qpns`]).
    pub blocks: Vec<u32>,
    /// Context handle -> its async event socket (write end).
    pub contexts: HashMap<u32, EventSink>,
    /// Completion channel handle -> its pipe (write end).
    pub channels: HashMap<u32, EventSink>,
    /// PD handle -> (engine PD, the context that allocated it).
    pub pds: HashMap<u32, (u32, u32)>,
    /// MR handle -> (engine MR, its length).
    pub mrs: HashMap<u32, (u32, u64)>,
    /// Bytes registered in the MRs, and of the ring regions of the CQs, QPs and SRQs
    /// (what the caps of [`super::limits`] count).
    pub mr_bytes: u64,
    pub ring_bytes: u64,
    pub cqs: HashMap<u32, CqState>,
    pub qps: HashMap<u32, QpHost>,
    pub srqs: HashMap<u32, SrqState>,
    pub ahs: HashMap<u32, u32>,
    pub mws: HashSet<u32>,
    pub next_handle: u32,
    /// Which of the rings were posted to ([`super::doorbells`]), made at the first
    /// `OpenContext`: the device reads those rings and no others.
    pub bells: Option<DoorbellTable>,
    /// Rings to read on the next pass without a doorbell: work that waited for room in the
    /// engine went in, and the ring may hold more behind it.
    pub revisit: Vec<Bell>,
    /// QPs and SRQs with work waiting for room in the engine (`pending_*`).
    pub waiting: HashSet<Bell>,
    /// Scratch: the CQs with completions this pass (`Engine::take_touched_cqs`).
    pub touched_cqs: Vec<u32>,
    /// CQs whose channel event fired since the device last looked: disarmed, they may feed
    /// fast-path directions again (`DeviceThread::fast_events_fired`).
    pub fired_cqs: Vec<u32>,
    /// The memory of the QPs' rings: a few shared chunks instead of a memfd (and a mapping
    /// on each side) per QP.
    pub arena: RingArena,
}

impl ClientDev {
    /// A doorbell for `bell` (the table is made with the first context, before any QP).
    pub fn add_bell(&mut self, bell: Bell) -> Option<u32> {
        self.bells.as_mut()?.add(bell)
    }

    /// Forgets the doorbell of a QP or SRQ that is gone.
    pub fn remove_bell(&mut self, index: u32, bell: Bell) {
        if let Some(t) = self.bells.as_mut() {
            t.remove(index);
        }
        self.waiting.remove(&bell);
        self.revisit.retain(|b| *b != bell);
    }

    /// A handle for a new context, PD, MR or completion channel: cyclic over the 2^24 a
    /// device's handles have (as rxe's `xa_alloc_cyclic`), skipping live ones, so that a
    /// process creating and destroying in a loop never runs out and a freed handle comes back
    /// only after 2^24 others.
    pub fn handle(&mut self) -> u32 {
        let (contexts, pds, mrs, channels) = (&self.contexts, &self.pds, &self.mrs, &self.channels);
        self.next_handle = next_free_handle(self.next_handle, |h| {
            contexts.contains_key(&h)
                || pds.contains_key(&h)
                || mrs.contains_key(&h)
                || channels.contains_key(&h)
        });
        self.next_handle
    }

    /// Lands the deferred writes (see [`ProcMem::settle`]); a QP whose data could not be
    /// placed goes to ERR with IBV_EVENT_QP_ACCESS_ERR before it sends anything, so the
    /// request is never acknowledged.
    pub fn settle(&mut self, begin: bool) {
        for qpn in self.engine.memory_mut().settle(begin) {
            if self.qps.contains_key(&qpn) {
                debug!(
                    qpn,
                    "data placed for the QP did not reach the process: QP to ERR"
                );
                let _ = self.engine.fail_qp(Qpn::new(qpn), true);
            }
        }
    }

    /// Reports an SRQ in error (IBV_EVENT_SRQ_ERR, 14) to its context. The engine has no
    /// such event: only the device finds an SRQ's ring corrupt.
    pub fn srq_error(&mut self, srq: u32) {
        let Some(ctx) = self.srqs.get(&srq).map(|s| s.ctx) else {
            return;
        };
        if let Some(sink) = self.contexts.get_mut(&ctx) {
            let mut rec = [0u8; 16];
            let element = u64::from(super::handles::tag_handle(self.device, srq));
            rec[..8].copy_from_slice(&element.to_ne_bytes());
            rec[8..12].copy_from_slice(&14u32.to_ne_bytes());
            sink.send(&rec, 12);
        }
    }

    /// Whether records wait for room in any of the client's event descriptors.
    pub fn events_held_back(&self) -> bool {
        self.contexts
            .values()
            .chain(self.channels.values())
            .any(EventSink::has_backlog)
    }

    pub fn resources(&self) -> ClientResources {
        ClientResources {
            pid: self.pid as u32,
            pds: self.pds.len() as u32,
            mrs: self.mrs.len() as u32,
            cqs: self.cqs.len() as u32,
            qps: self.qps.len() as u32,
            srqs: self.srqs.len() as u32,
            ahs: self.ahs.len() as u32,
            mws: self.mws.len() as u32,
            ..Default::default()
        }
    }
}

/// The QPN blocks of every device of the daemon, taken round-robin: a new client does not
/// get the QPNs of one that just exited, whose connections may still be in CM timewait on a
/// peer (a REQ from a QPN the peer still holds is refused as a stale connection, REJ 10;
/// rxe likewise allocates QPNs cyclically).
#[derive(Debug, Default)]
pub struct QpnBlocks(std::sync::Mutex<(HashSet<u32>, u32)>);

impl QpnBlocks {
    /// The next free block after the last one handed out (block 0 holds QPNs 0 and 1).
    fn take(&self) -> Option<u32> {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (used, last) = &mut *g;
        let end = Qpn::MASK / QPN_BLOCK;
        let block = (1..end)
            .map(|i| (*last + i - 1) % (end - 1) + 1)
            .find(|b| !used.contains(b))?;
        used.insert(block);
        *last = block;
        Some(block)
    }

    fn give_back(&self, block: u32) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .remove(&block);
    }
}

/// A seed for the fault injectors' generators.
pub(super) fn random_seed() -> u64 {
    crate::entropy::u64()
}

impl DeviceThread {
    /// The client's engine on this device, created on first use. The error is an errno and a
    /// message for the client.
    pub(super) fn client(
        &mut self,
        client: u64,
        process: &Arc<ClientProcess>,
    ) -> Result<&mut ClientDev, (i32, &'static str)> {
        if !self.clients.contains_key(&client) {
            let Some(&first) = self.gids.iter().find(|a| !a.is_unspecified()) else {
                return Err((libc::ENETDOWN, "the device has no address (port down)"));
            };
            let Some(block) = self.qpn_blocks.take() else {
                return Err((libc::ENOMEM, "no QP number block left"));
            };
            // Keys and QPNs from a ChaCha20 stream keyed by the kernel's CSPRNG: nothing
            // about them can be guessed from another client's, or this client's own.
            let mut config = tp::EngineConfig::new(first, crate::entropy::u64());
            config.key_entropy = crate::entropy::bytes();
            config.random_qpns = true;
            config.gids = self.gids.clone();
            // The device's configured CQ depth (`DeviceConfig::max_cqe`), which the shim
            // reports as `max_cqe`.
            config.max_cqe = self.info.max_cqe as usize;
            // The framing of each GID's packets (`--roce both` lists an address twice).
            config.gid_types = self.gid_types();
            config.port_mtu =
                Mtu::from_enum(u32::from(self.info.active_mtu)).unwrap_or(Mtu::Mtu1024);
            // The ICRC is computed once per packet: by the link for the headers it sends,
            // and never for packets between local QPs, which the receiving engine takes with
            // handle_verified_packet.
            config.seal_icrc = false;
            config.congestion = self.congestion;
            let memory = ProcessMemory::of(Arc::clone(process));
            let (uid, pid_view) = super::fast::process_identity(process.pid());
            let mut engine = tp::Engine::new(config, ProcMem(RefCell::new(memory)));
            engine.set_qpn_range(block * QPN_BLOCK, (block + 1) * QPN_BLOCK);
            self.blocks.insert(block, client);
            self.clients.insert(
                client,
                ClientDev {
                    pid: process.pid(),
                    uid,
                    pid_view,
                    fast_fds: 0,
                    device: self.index,
                    engine,
                    blocks: vec![block],
                    contexts: HashMap::new(),
                    channels: HashMap::new(),
                    pds: HashMap::new(),
                    mrs: HashMap::new(),
                    mr_bytes: 0,
                    ring_bytes: 0,
                    cqs: HashMap::new(),
                    qps: HashMap::new(),
                    srqs: HashMap::new(),
                    ahs: HashMap::new(),
                    mws: HashSet::new(),
                    next_handle: 0,
                    bells: None,
                    revisit: Vec::new(),
                    waiting: HashSet::new(),
                    touched_cqs: Vec::new(),
                    fired_cqs: Vec::new(),
                    arena: RingArena::default(),
                },
            );
        }
        self.clients
            .get_mut(&client)
            .ok_or((libc::EIO, "client state lost"))
    }

    /// Gives a client about to create a QP another QPN block when its QPs fill the ones it
    /// has (65,536 QPNs each), so that one process may hold up to the device's `max_qp`.
    pub(super) fn grow_qpns(&mut self, client: u64) {
        let full = self.clients.get(&client).is_some_and(|c| {
            // A margin for the reserved and multicast QPNs a block may hold.
            c.qps.len() + 16 >= c.blocks.len() * QPN_BLOCK as usize
        });
        if !full {
            return;
        }
        let Some(block) = self.qpn_blocks.take() else {
            return;
        };
        if let Some(c) = self.clients.get_mut(&client) {
            c.engine
                .add_qpn_range(block * QPN_BLOCK, (block + 1) * QPN_BLOCK);
            c.blocks.push(block);
            self.blocks.insert(block, client);
        }
    }

    /// Forgets a client (it disconnected, or its engine broke): its multicast attachments,
    /// its QPN block and its engine, with everything in it.
    pub(super) fn client_gone(&mut self, client: u64) {
        self.group_detach(|(c, _)| c == client, None);
        self.fast_client_gone(client);
        self.res_numbers.client_gone(client);
        if let Some(c) = self.clients.remove(&client) {
            for &b in &c.blocks {
                self.blocks.remove(&b);
                self.qpn_blocks.give_back(b);
            }
            // Its counters stay the device's.
            self.departed.accumulate(c.engine.counters());
            info!(device = %self.info.name, client, qps = c.qps.len(), mrs = c.mrs.len(),
                  "client's engine destroyed");
            let mut counters = *c.engine.counters();
            counters.accumulate(&self.fast.counters_of(client));
            debug!(client, ?counters, memory = ?c.engine.memory().0.borrow().stats(),
                   "engine counters");
            for qpn in c.qps.keys() {
                if let Some(state) = c.engine.selective_summary(proto::Qpn::new(*qpn)) {
                    debug!(client, qpn, %state, "selective retransmission state at exit");
                }
            }
            let k = c.engine.counters();
            if k.sack_sent + k.sack_rcvd > 0 {
                info!(
                    client,
                    sack_sent = k.sack_sent,
                    sack_rcvd = k.sack_rcvd,
                    ooo_held = k.ooo_held,
                    sel_retransmits = k.sel_retransmits,
                    probes = k.sel_probes,
                    timeouts = k.completer_retry_err,
                    "selective retransmission counters"
                );
            }
        }
    }
}

/// The handle after `last` in `1..=HANDLE_MASK`, cyclically, that `live` does not hold (the
/// caps keep far fewer than 2^24 objects live, so one is always found).
fn next_free_handle(last: u32, live: impl Fn(u32) -> bool) -> u32 {
    let mut h = last;
    loop {
        h = h % super::handles::HANDLE_MASK + 1;
        if !live(h) {
            return h;
        }
    }
}

/// Runs one piece of a client's work, containing a panic (an engine bug met by some packet or
/// work request): the device thread serves every client and must not die with one. `None`
/// means it panicked; the caller then drops that client's engine, whose state can no longer be
/// trusted.
pub(super) fn contained<T>(f: impl FnOnce() -> T) -> Option<T> {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).ok();
    if r.is_none() {
        tracing::error!("the engine panicked; that client's resources are dropped");
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_wrap_around_and_skip_live_ones() {
        let mask = crate::device::handles::HANDLE_MASK;
        assert_eq!(next_free_handle(0, |_| false), 1);
        assert_eq!(next_free_handle(41, |h| h == 42 || h == 43), 44);
        // Past the last handle: back to 1 (0 is never given), skipping live ones.
        assert_eq!(next_free_handle(mask - 1, |_| false), mask);
        assert_eq!(next_free_handle(mask, |_| false), 1);
        assert_eq!(next_free_handle(mask, |h| h <= 3), 4);
    }
}
