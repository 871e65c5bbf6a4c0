//! The same-host fast path, as the shim runs it (docs/architecture.md, "The same-host fast
//! path").
//!
//! When two QPs of one device belong to processes of the same user, the daemon offers each
//! process the *direction* that starts at its QP: the requester of its QP and the responder
//! of the peer QP, run here, inside `ibv_post_send`, by the same engine the daemon runs
//! ([`direction::DirectionRt`]). A message then costs no daemon pass and no ring hop: the
//! bytes go from this process's buffer into the peer's with one `process_vm_writev` (small
//! SENDs travel with their completion), and the completions are in this process at once and
//! in the peer's completion ring one store later.
//!
//! The daemon stays the device: it grants a direction only while both halves are idle and the
//! conditions hold (same uid, no capture or fault injection, no pacing, RC/UC, the peer's
//! receive queue its own or an SRQ that feeds it alone, no CQ armed for an event),
//! publishes the MR tables the engines check keys against, and can
//! revoke a direction at any time; anything the fast path does not do (an error, RNR, a
//! memory window, a state change) gives the direction back first, and the daemon's engine
//! carries on from the published sequence numbers.
//!
//! Completions: a CQ of this process is fed by its daemon ring, by the directions this
//! process runs (their requesters' completions), and by the rings of the directions other
//! processes run towards it (its QPs' receive completions). `ibv_poll_cq` reads them in that
//! order of age: what was moved aside when a source appeared (`stash`), then the fast
//! sources, then the daemon ring, so that each queue's completions come out in order across a
//! grant and a revoke.

pub mod backlog;
pub mod direction;
pub mod memory;

use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use proto::ctl::{FastRing, Request, Response};
use proto::ring::fast::{Direction, FastCqe};
use proto::ring::wqe::Cqe;
use proto::ring::SharedRing;
use proto::transport::{SendOp, SendWr};

use crate::ffi::Errno;
use crate::runtime::ShimContext;
use crate::shm::Mapping;
use direction::{DirectionRt, Outcome};

pub(crate) fn trace(what: std::fmt::Arguments<'_>) {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("SOFTROCE_FAST_DEBUG").is_some()) {
        eprintln!("[fast {}] {what}", std::process::id());
    }
}

/// How long a QP whose grant was refused or given back waits before it asks again.
const RETRY_AFTER: Duration = Duration::from_millis(5);
/// The same after a refusal while the daemon holds the QP's send ring for a take (EBUSY):
/// the hold lasts a few milliseconds, and the take must come within it.
const RETRY_HELD: Duration = Duration::from_micros(200);

/// Whether this process takes directions at all (`SOFTROCE_FAST_PATH=0` turns it off).
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("SOFTROCE_FAST_PATH").map_or(true, |v| v != "0"))
}

/// A ring another process's direction fills with this process's receive completions.
struct Inbound {
    control: Direction,
    ring: SharedRing,
    slot: Vec<u8>,
    _map: Mapping,
}

// SAFETY: used only under the context's fast-path lock; the pointers point into `_map`.
unsafe impl Send for Inbound {}

/// QPN-keyed tables with the engine's multiplicative hash (SipHash showed in the profile).
type IntMap<V> =
    HashMap<u32, V, std::hash::BuildHasherDefault<proto::transport::engine::IntHasher>>;

/// A CQ's fast sources.
struct CqFeed {
    cq: u32,
    /// The CQ ring's source count when its sources were last fetched.
    seen: u32,
    /// Completions moved out of the CQ's other sources before a new source was attached.
    stash: VecDeque<Cqe>,
    /// Rings other processes' directions fill with this CQ's receive completions.
    inbound: Vec<(u64, Inbound)>,
}

impl Inner {
    fn feed(&mut self, cq: u32) -> &mut CqFeed {
        let i = match self.feeds.iter().position(|f| f.cq == cq) {
            Some(i) => i,
            None => {
                self.feeds.push(CqFeed {
                    cq,
                    seen: 0,
                    stash: VecDeque::new(),
                    inbound: Vec::new(),
                });
                self.feeds.len() - 1
            }
        };
        &mut self.feeds[i]
    }
}

/// A direction this process runs. Each has a lock of its own, taken after the context's
/// (never the other way round), so that the backstop can run the work of directions the
/// application left while the application posts to others (with `-q 16`, perftest posts
/// to every QP for about a millisecond before it polls).
struct Running {
    send_cq: u32,
    rt: Arc<Mutex<DirectionRt>>,
}

impl Running {
    fn lock(&self) -> MutexGuard<'_, DirectionRt> {
        lock_rt(&self.rt)
    }
}

fn lock_rt(rt: &Mutex<DirectionRt>) -> MutexGuard<'_, DirectionRt> {
    rt.lock().unwrap_or_else(|e| e.into_inner())
}

/// Closes several directions in two rounds: the first runs each one's engines and hands
/// its writes into the peer to the copier, the second waits for them and lets the
/// completions out. The kernel's copies for one direction so run on the other CPU while
/// this thread runs the next (`ib_write_bw -q 16` closes 16 at a poll). Returns the
/// directions to give back.
fn close_each<'a>(rts: impl Iterator<Item = (u32, &'a Mutex<DirectionRt>)> + Clone) -> Vec<u32> {
    // One direction alone has nothing to overlap its copies with.
    if rts.clone().nth(1).is_some() {
        for (_, rt) in rts.clone() {
            lock_rt(rt).start_close();
        }
    }
    rts.filter(|(_, rt)| lock_rt(rt).close() == Outcome::GiveBack)
        .map(|(qpn, _)| qpn)
        .collect()
}

#[derive(Default)]
struct Inner {
    /// Directions this process runs, by requester QPN.
    directions: IntMap<Running>,
    /// Directions entered with queued work (their QPNs, and since when).
    open: Vec<(u32, Instant)>,
    /// Directions whose work ran outside a verb call (by the backstop) and that must be
    /// given back at the next call.
    give_back: Vec<u32>,
    /// QPs that may not ask for a grant before the given time.
    backoff: IntMap<Instant>,
    /// QPs whose send ring the daemon holds for a take (it answered EBUSY): the take is
    /// asked again at the next post or at the next poll of the QP's send CQ (the program
    /// may have a full send queue and only poll), with the ring it carries.
    awaiting: IntMap<backlog::SendRing>,
    /// What feeds each CQ of this context besides its daemon ring (a few CQs: a list).
    feeds: Vec<CqFeed>,
    /// The backstop thread: started with the first direction; parked (waiting without a
    /// timeout) when nothing was queued for a while.
    backstop: bool,
    backstop_parked: bool,
    /// Directions entered with queued work so far (the backstop parks only after none was
    /// for a while).
    entered: u64,
    shutdown: bool,
}

/// What [`FastPath::take_over`] came to.
enum Take {
    /// Granted and entered, with this many requests from the send ring queued.
    Taken(Arc<Mutex<DirectionRt>>, usize),
    /// The daemon holds the send ring until the work in flight drains: ask again soon.
    Held,
    /// Not asked: the QP's pause after its last refusal is not over.
    Paused,
    /// Not granted, or the ring holds work the fast path leaves to the daemon.
    Refused,
}

/// What the context and its backstop thread share.
#[derive(Default)]
struct Shared {
    inner: Mutex<Inner>,
    /// The backstop thread, once started (woken by an unpark).
    backstop: std::sync::OnceLock<std::thread::Thread>,
    /// Set once this context ran a direction or read a fast source: until then
    /// `ibv_poll_cq` does not even take the lock.
    used: AtomicBool,
    /// Some direction is entered with queued work (a check without the lock).
    open: AtomicBool,
}

/// A batch of queued work requests runs at once when it reaches this size.
const BATCH: usize = 256;
/// The backstop runs queued work the application left for this long without calling
/// `ibv_poll_cq` (an application that posts and then waits on memory, or elsewhere).
const BACKSTOP_AFTER: Duration = Duration::from_micros(200);
/// The backstop's sleeps grow up to this while the application runs its own work (it
/// enters directions and closes them before they are old): each wake preempts a spinner on
/// a small machine. Work left alone after such a stretch waits at most this long once.
const BACKSTOP_LONGEST: Duration = Duration::from_micros(1600);
/// The backstop parks (waits without a timeout, woken by the next post) after this long
/// without queued work.
const BACKSTOP_PARK_AFTER: Duration = Duration::from_millis(100);

/// A context's fast-path state.
#[derive(Default)]
pub struct FastPath {
    shared: std::sync::Arc<Shared>,
}

impl Drop for FastPath {
    fn drop(&mut self) {
        let mut inner = self.lock();
        inner.shutdown = true;
        drop(inner);
        if let Some(t) = self.shared.backstop.get() {
            t.unpark();
        }
    }
}

/// What [`FastPath::post`] did with a work request list.
pub enum Posted {
    /// Not on the fast path: post through the ring.
    Ring,
    /// Queued on the fast path.
    Done,
}

/// Why a work request list goes to the daemon: a memory window or an invalidation (they
/// change the daemon's key tables), a UD destination, or (counted by the caller) receives
/// the peer has not posted: an RNR, whose waiting and retrying the daemon does.
fn daemon_only(wr: &SendWr) -> bool {
    matches!(
        wr.op,
        SendOp::BindMw { .. } | SendOp::LocalInv(_) | SendOp::SendWithInv(_)
    ) || wr.ud.is_some()
}

/// Whether a work request that waited in the send ring may go with a take: the program's
/// newer requests are checked against the receives the peer has after the take, but these
/// would have to run before that check could send them back to the daemon.
pub fn takeable_from_ring(wr: &SendWr) -> bool {
    !daemon_only(wr) && !takes_receive(wr)
}

fn takes_receive(wr: &SendWr) -> bool {
    matches!(
        wr.op,
        SendOp::Send | SendOp::SendWithImm(_) | SendOp::SendWithInv(_) | SendOp::WriteWithImm(..)
    )
}

impl FastPath {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.shared.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `qpn`'s requester runs here.
    pub fn runs(&self, qpn: u32) -> bool {
        self.lock().directions.contains_key(&qpn)
    }

    /// Queues `wrs` (validated and decoded from the QP's own encoding, see `verbs::qp`) on
    /// the direction of `qpn`, taking it first if the daemon offers it. `offered`: the
    /// QP's send ring says so; `ring`: that send ring, whose waiting requests a take carries
    /// (`None` while the direction runs here).
    pub fn post(
        &self,
        ctx: &ShimContext,
        qpn: u32,
        offered: bool,
        ring: Option<backlog::SendRing>,
        wrs: &mut Vec<SendWr>,
    ) -> Posted {
        let mut inner = self.lock();
        self.give_back_pending(ctx, &mut inner);
        let mut carried = 0;
        if !inner.directions.contains_key(&qpn) {
            let Some(ring) = ring.filter(|_| offered) else {
                return Posted::Ring;
            };
            match self.take_over(ctx, &mut inner, qpn, &ring) {
                Take::Taken(_, n) => {
                    inner.awaiting.remove(&qpn);
                    carried = n;
                }
                Take::Held => {
                    inner.awaiting.insert(qpn, ring);
                    // (`ibv_poll_cq` looks for fast sources only once this is set.)
                    self.shared.used.store(true, Ordering::Relaxed);
                    return Posted::Ring;
                }
                Take::Paused => return Posted::Ring,
                Take::Refused => {
                    inner.awaiting.remove(&qpn);
                    return Posted::Ring;
                }
            }
        }
        let recvs_needed = wrs.iter().filter(|w| takes_receive(w)).count() as u32;
        let to_daemon = wrs.iter().any(daemon_only);
        let Some(rt) = inner.directions.get(&qpn).map(|r| r.rt.clone()) else {
            return Posted::Ring;
        };
        // (Waits while the backstop runs this direction's earlier work.)
        let mut d = lock_rt(&rt);
        // The receives queued but not run yet count too.
        if to_daemon || !d.receives_available(recvs_needed + d.receives_queued()) {
            trace(format_args!(
                "qpn={qpn} to the daemon: daemon_only={to_daemon} recvs_needed={recvs_needed}"
            ));
            drop(d);
            drop(inner);
            self.give_back(ctx, qpn);
            return Posted::Ring;
        }
        let n = wrs.len();
        if !d.queue(wrs) {
            // The daemon took it back first: nothing was queued; post through the ring.
            drop(d);
            let r = inner.directions.remove(&qpn);
            retire(&mut inner, r);
            return Posted::Ring;
        }
        if d.queued() >= BATCH {
            let outcome = d.close();
            drop(d);
            inner.open.retain(|(q, _)| *q != qpn);
            if outcome == Outcome::GiveBack {
                drop(inner);
                self.give_back(ctx, qpn);
            }
            return Posted::Done;
        }
        if d.queued() == n + carried {
            // Newly entered: the backstop runs it if nobody polls.
            let since = d.open_since().unwrap_or_else(Instant::now);
            drop(d);
            inner.open.push((qpn, since));
            inner.entered = inner.entered.wrapping_add(1);
            self.shared.open.store(true, Ordering::Release);
            if inner.backstop_parked {
                inner.backstop_parked = false;
                if let Some(t) = self.shared.backstop.get() {
                    t.unpark();
                }
            }
        }
        Posted::Done
    }

    /// Asks for the direction of `qpn` whose send ring is `ring` (if the QP's pause is over),
    /// enters it and queues what waited in the ring. What waits there must all be work the
    /// fast path runs ([`takeable_from_ring`]); if not, the QP pauses as after a refusal, so
    /// that the ring is looked at once in [`RETRY_AFTER`] and not at every post.
    fn take_over(
        &self,
        ctx: &ShimContext,
        inner: &mut Inner,
        qpn: u32,
        ring: &backlog::SendRing,
    ) -> Take {
        if inner.backoff.get(&qpn).is_some_and(|t| Instant::now() < *t) {
            return Take::Paused;
        }
        if !ring.takeable() {
            inner.backoff.insert(qpn, Instant::now() + RETRY_AFTER);
            return Take::Refused;
        }
        let taken = take(ctx, qpn);
        trace(format_args!("take qpn={qpn}: {:?}", taken.as_ref().err()));
        let d = match taken {
            Ok(d) => d,
            Err(e) => {
                // EBUSY: work was in flight, and the daemon holds the QP's send ring until
                // it drains (`hold_for_take`): ask again soon.
                let held = e == Errno::BUSY;
                let pause = if held { RETRY_HELD } else { RETRY_AFTER };
                inner.backoff.insert(qpn, Instant::now() + pause);
                return if held { Take::Held } else { Take::Refused };
            }
        };
        self.shared.used.store(true, Ordering::Relaxed);
        let send_cq = d.send_cq;
        let rt = Arc::new(Mutex::new(d));
        inner.directions.insert(
            qpn,
            Running {
                send_cq,
                rt: rt.clone(),
            },
        );
        if !inner.backstop {
            inner.backstop = true;
            spawn_backstop(self.shared.clone());
        }
        // Entered before the ring is read: a revoke now waits for this process, and one
        // that came first leaves the ring unread, for the daemon.
        let mut d = lock_rt(&rt);
        if !d.enter() {
            drop(d);
            let r = inner.directions.remove(&qpn);
            retire(inner, r);
            return Take::Refused;
        }
        let mut older = ring.take_all();
        let carried = older.len();
        if carried > 0 {
            trace(format_args!(
                "qpn={qpn}: took {carried} WRs from the send ring"
            ));
            d.queue(&mut older);
        }
        drop(d);
        Take::Taken(rt, carried)
    }

    /// Asks again for the takes of the QPs that feed CQ `cq` whose send rings the daemon
    /// holds (their program polls and may not post: its send queue is full, the rest of it
    /// in the held ring), and runs what each carried.
    fn take_awaiting(&self, ctx: &ShimContext, inner: &mut Inner, cq: u32) {
        let qpns: Vec<u32> = inner
            .awaiting
            .iter()
            .filter(|(_, ring)| ring.send_cq == cq)
            .map(|(q, _)| *q)
            .collect();
        for qpn in qpns {
            let Some(ring) = inner.awaiting.remove(&qpn) else {
                continue;
            };
            if inner.directions.contains_key(&qpn) {
                continue;
            }
            match self.take_over(ctx, inner, qpn, &ring) {
                Take::Taken(rt, _) => {
                    if lock_rt(&rt).close() == Outcome::GiveBack {
                        inner.give_back.push(qpn);
                    }
                }
                Take::Held | Take::Paused => {
                    inner.awaiting.insert(qpn, ring);
                }
                Take::Refused => {}
            }
        }
    }

    /// Runs the work queued on every direction of this context (before completions are
    /// read). Returns the directions to give back.
    fn close_all(inner: &mut Inner, shared: &Shared) -> Vec<u32> {
        let mut open = std::mem::take(&mut inner.open);
        let rts = open
            .iter()
            .filter_map(|(qpn, _)| inner.directions.get(qpn).map(|r| (*qpn, &*r.rt)));
        let back = close_each(rts);
        shared.open.store(false, Ordering::Release);
        // The list's room is kept for the next posts (an allocation per message otherwise).
        open.clear();
        if inner.open.is_empty() {
            inner.open = open;
        }
        back
    }

    /// The directions entered longer than `age` ago, taken out of the open list (for the
    /// backstop, which runs them without the context's lock).
    fn take_old(
        inner: &mut Inner,
        shared: &Shared,
        age: Duration,
    ) -> Vec<(u32, Arc<Mutex<DirectionRt>>)> {
        let now = Instant::now();
        let mut old = Vec::new();
        let Inner {
            open, directions, ..
        } = inner;
        open.retain(|&(qpn, since)| {
            if now.duration_since(since) < age {
                return true;
            }
            if let Some(r) = directions.get(&qpn) {
                old.push((qpn, r.rt.clone()));
            }
            false
        });
        shared.open.store(!open.is_empty(), Ordering::Release);
        old
    }

    /// Gives back what the backstop could not (it makes no daemon calls).
    fn give_back_pending(&self, ctx: &ShimContext, inner: &mut MutexGuard<'_, Inner>) {
        if inner.give_back.is_empty() {
            return;
        }
        let qpns = std::mem::take(&mut inner.give_back);
        for qpn in qpns {
            give_back_locked(ctx, inner, qpn);
        }
    }

    /// Ends the direction of `qpn` (before the QP is modified, destroyed, or used for work
    /// the fast path leaves to the daemon). Its completions stay in this process, ahead of
    /// what the daemon delivers later.
    pub fn give_back(&self, ctx: &ShimContext, qpn: u32) {
        let mut inner = self.lock();
        give_back_locked(ctx, &mut inner, qpn);
    }

    /// Ends the directions whose requester's completions go to CQ `cq` (after an arm of it:
    /// until its event fires only the daemon, which raises it, adds its completions).
    pub fn give_back_cq(&self, ctx: &ShimContext, cq: u32) {
        let mut inner = self.lock();
        let qpns: Vec<u32> = inner
            .directions
            .iter()
            .filter(|(_, r)| r.send_cq == cq)
            .map(|(q, _)| *q)
            .collect();
        for qpn in qpns {
            give_back_locked(ctx, &mut inner, qpn);
        }
    }

    /// The next completion of CQ `cq` from the fast sources (and first from what was moved
    /// aside). `daemon_ring`: the CQ's ring, whose source count says when to attach new
    /// sources (its entries are moved aside first, being older). Work queued on this
    /// context's directions runs first.
    pub fn poll_one(
        &self,
        ctx: &ShimContext,
        cq: u32,
        daemon_ring: &mut SharedRing,
    ) -> Option<Cqe> {
        let mut inner = self.lock();
        if self.shared.open.load(Ordering::Acquire) {
            let back = FastPath::close_all(&mut inner, &self.shared);
            inner.give_back.extend(back);
        }
        self.give_back_pending(ctx, &mut inner);
        // Before the sources are counted: a direction granted now adds one, and the older
        // completions of the daemon's ring are moved aside first.
        if !inner.awaiting.is_empty() {
            self.take_awaiting(ctx, &mut inner, cq);
        }
        let sources = daemon_ring.fast_sources();
        if inner.feed(cq).seen != sources {
            attach(ctx, &mut inner, cq, sources, daemon_ring);
        }
        if let Some(c) = inner.feed(cq).stash.pop_front() {
            return Some(c);
        }
        for r in inner.directions.values().filter(|r| r.send_cq == cq) {
            // Waits for one the backstop is running (sleeping in the lock rather than
            // polling again: that would make a third busy thread beside the backstop and
            // the copier).
            if let Some(c) = r.lock().completions.pop_front() {
                return Some(c);
            }
        }
        let feed = inner.feed(cq);
        let mut found = None;
        for (_, r) in feed.inbound.iter_mut() {
            while found.is_none() {
                match r.ring.pop(&mut r.slot) {
                    Ok(true) => {}
                    _ => break,
                }
                let Some(entry) = FastCqe::decode(&r.slot) else {
                    continue;
                };
                for (addr, data) in &entry.pieces {
                    place(*addr, data);
                }
                found = Some(entry.cqe);
            }
            if found.is_some() {
                return found;
            }
        }
        // A revoked direction's ring is dropped once its taker is out of it for good
        // (revoked, then not inside) and it is empty, in that order.
        if !feed.inbound.is_empty() {
            feed.inbound.retain(|(_, r)| {
                !(r.control.is_revoked()
                    && !r.control.busy()
                    && r.ring.available().unwrap_or(0) == 0)
            });
        }
        None
    }

    /// Whether CQ `daemon_ring` may have fast sources to read (a check without the lock).
    pub fn may_feed(&self, daemon_ring: &SharedRing) -> bool {
        if self.shared.used.load(Ordering::Relaxed) {
            return true;
        }
        if daemon_ring.fast_sources() != 0 {
            self.shared.used.store(true, Ordering::Relaxed);
            return true;
        }
        false
    }
}

/// [`FastPath::give_back`] under the lock.
fn give_back_locked(ctx: &ShimContext, inner: &mut MutexGuard<'_, Inner>, qpn: u32) {
    inner.open.retain(|(q, _)| *q != qpn);
    // (Its send ring lives only as long as the QP.)
    inner.awaiting.remove(&qpn);
    let Some(r) = inner.directions.remove(&qpn) else {
        return;
    };
    trace(format_args!("give back qpn={qpn}"));
    {
        let mut d = r.lock();
        if d.publish_now() {
            let events = std::mem::take(&mut d.events);
            let _ = ctx.call_done(&Request::FastReturn { qpn, events });
        }
    }
    inner.backoff.insert(qpn, Instant::now() + RETRY_AFTER);
    retire(inner, Some(r));
}

/// The backstop: runs work the application queued and then left alone (it posted and did
/// not poll) after [`BACKSTOP_AFTER`], so that a posted request always completes, as on a
/// device that runs on its own. It sleeps in timed sleeps while the application posts, and
/// parks after [`BACKSTOP_PARK_AFTER`] without work: an application that polls never makes
/// it do anything, and never makes a system call for it.
///
/// It sleeps without the context's lock and never waits for it: an application that spins
/// on `ibv_poll_cq` holds that lock most of the time, and a backstop that woke into it
/// slept on the lock and had the application wake it at the unlock, a system call and a
/// preemption of the spinner three times per tick (`ib_send_lat` on the fast path: its
/// median moved between 1.45 and 2.2-2.8 µs with how often that happened). An application
/// inside a verb call runs its own work: the tick is skipped.
fn spawn_backstop(shared: std::sync::Arc<Shared>) {
    let thread = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("softroce-fast".into())
            .spawn(move || backstop(&shared))
    };
    if let Ok(t) = thread {
        // (Set under the context's lock, which the caller holds: before the thread can
        // park, which it decides under that lock.)
        let _ = shared.backstop.set(t.thread().clone());
    }
}

fn backstop(shared: &Shared) {
    let mut idle_since = Instant::now();
    let mut entered = 0;
    let mut parked = false;
    let mut sleep = BACKSTOP_AFTER;
    loop {
        if parked {
            std::thread::park();
        } else {
            std::thread::park_timeout(sleep);
        }
        let mut inner = match shared.inner.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                parked = false;
                continue;
            }
        };
        if inner.shutdown {
            return;
        }
        // Idle is no direction entered since the last look, not an empty list at the look:
        // a ping-pong enters and leaves between two looks, and a backstop that parked
        // then was woken by every post (a system call each, and a preemption of a spinner).
        let active = inner.entered != entered;
        if !inner.open.is_empty() || active {
            entered = inner.entered;
            idle_since = Instant::now();
        }
        sleep = next_sleep(sleep, !inner.open.is_empty(), active);
        if !inner.open.is_empty() {
            let old = FastPath::take_old(&mut inner, shared, BACKSTOP_AFTER);
            if !old.is_empty() {
                // Run without the context's lock: the application may post to its other
                // directions meanwhile (each direction's own lock orders the rest; this
                // thread never takes the context's lock while holding one).
                drop(inner);
                let back = close_each(old.iter().map(|(qpn, rt)| (*qpn, &**rt)));
                inner = shared.inner.lock().unwrap_or_else(|e| e.into_inner());
                inner.give_back.extend(back);
            }
        }
        parked = inner.open.is_empty() && idle_since.elapsed() > BACKSTOP_PARK_AFTER;
        inner.backstop_parked = parked;
    }
}

/// How long the backstop sleeps after a look that found directions `open` (entered with
/// work not run yet) or none, and the application `active` (it entered some since the last
/// look) or not. Entered and closed again between two looks: the application runs its own
/// work, so it looks half as often each time, down to once per [`BACKSTOP_LONGEST`];
/// anything open: again once it may be old.
fn next_sleep(last: Duration, open: bool, active: bool) -> Duration {
    if !open && active {
        (last * 2).min(BACKSTOP_LONGEST)
    } else {
        BACKSTOP_AFTER
    }
}

/// Asks the daemon for the direction of `qpn` and builds it.
fn take(ctx: &ShimContext, qpn: u32) -> Result<DirectionRt, Errno> {
    let (resp, fds) = ctx.call(&Request::FastTake { qpn }, &[])?;
    let Response::FastGrant(g) = resp else {
        return Err(Errno::PROTO);
    };
    match DirectionRt::new(&g, &fds) {
        Ok(d) => Ok(d),
        Err(e) => {
            // Nothing ran: the published state is still the daemon's own.
            let _ = ctx.call_done(&Request::FastReturn {
                qpn,
                events: Vec::new(),
            });
            Err(e)
        }
    }
}

/// Keeps the completions of a direction that ended, ahead of the daemon's later ones.
fn retire(inner: &mut Inner, r: Option<Running>) {
    if let Some(r) = r {
        let completions: Vec<Cqe> = r.lock().completions.drain(..).collect();
        inner.feed(r.send_cq).stash.extend(completions);
    }
}

/// Attaches the rings the daemon lists for `cq`, after moving the CQ's older completions
/// aside (its daemon ring's, and its fast sources').
fn attach(
    ctx: &ShimContext,
    inner: &mut Inner,
    cq: u32,
    sources: u32,
    daemon_ring: &mut SharedRing,
) {
    let stash = &mut inner.feed(cq).stash;
    let mut slot = vec![0u8; daemon_ring.geometry().slot_size as usize];
    while let Ok(true) = daemon_ring.pop(&mut slot) {
        if let Some(c) = Cqe::decode(&slot) {
            stash.push_back(c);
        }
    }
    // Bounded: a ring that cannot be mapped is asked for again, at most this many times.
    for _ in 0..64 {
        let known: Vec<u64> = inner.feed(cq).inbound.iter().map(|(id, _)| *id).collect();
        let got = ctx.call(&Request::FastSources { cq, known }, &[]);
        let Ok((Response::FastSources { rings, more }, fds)) = got else {
            trace(format_args!("attach cq={cq:#x}: {:?}", got.err()));
            return;
        };
        trace(format_args!(
            "attach cq={cq:#x} sources={sources} rings={:?}",
            rings.iter().map(|r| r.direction).collect::<Vec<_>>()
        ));
        let feed = inner.feed(cq);
        for (r, fd) in rings.iter().zip(fds) {
            if let Ok(i) = inbound(r, fd) {
                feed.inbound.push((r.direction, i));
            }
        }
        if !more {
            feed.seen = sources;
            return;
        }
    }
}

fn inbound(r: &FastRing, fd: OwnedFd) -> Result<Inbound, Errno> {
    let map = Mapping::map(&fd, r.block_len)?;
    // SAFETY: the mapping is block_len bytes, page aligned, kept beside the handle.
    let control =
        unsafe { Direction::attach(map.base(), map.len(), r.direction) }.ok_or(Errno::PROTO)?;
    let ring = map.ring(&r.ring, false)?;
    Ok(Inbound {
        control,
        slot: vec![0u8; r.ring.slot_size as usize],
        ring,
        _map: map,
    })
}

/// Copies received bytes that travelled with their completion into this process's receive
/// buffer. The taker placed them within a receive WQE this process posted (its engine
/// checked the L_Key against this process's MR table, as the daemon's would).
fn place(addr: u64, data: &[u8]) {
    if addr == 0 || addr.checked_add(data.len() as u64).is_none() {
        return;
    }
    // SAFETY: `[addr, addr + len)` lies in a receive buffer of this process, inside a region
    // it registered with local write access (checked by the engine that placed it); the
    // application gave that buffer to the device until this completion.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, data.len()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backstop_looks_less_often_while_the_application_runs_its_own_work() {
        let mut sleep = BACKSTOP_AFTER;
        let mut seen = Vec::new();
        // A ping-pong: the application enters and closes its directions between two looks.
        for _ in 0..6 {
            sleep = next_sleep(sleep, false, true);
            seen.push(sleep.as_micros());
        }
        assert_eq!(seen, [400, 800, 1600, 1600, 1600, 1600]);
        // Something left open: looked at again within BACKSTOP_AFTER, so that it runs once
        // it is that old.
        assert_eq!(next_sleep(sleep, true, true), BACKSTOP_AFTER);
        assert_eq!(next_sleep(sleep, true, false), BACKSTOP_AFTER);
        // Nothing entered since the last look: the application may have stopped: the short
        // look again (it parks after BACKSTOP_PARK_AFTER of this).
        assert_eq!(next_sleep(sleep, false, false), BACKSTOP_AFTER);
    }
}
