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
//! conditions hold (same uid, no capture or fault injection, no pacing, RC/UC, no SRQ, no
//! completion channel), publishes the MR tables the engines check keys against, and can
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

pub mod direction;
pub mod memory;

use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use proto::ctl::{FastRing, Request, Response};
use proto::ring::fast::{Direction, FastCqe};
use proto::ring::wqe::{Cqe, SendWqe, WrOpcode};
use proto::ring::SharedRing;

use crate::ffi::Errno;
use crate::runtime::ShimContext;
use crate::shm::Mapping;
use direction::{DirectionRt, Outcome};

fn trace(what: std::fmt::Arguments<'_>) {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("SOFTROCE_FAST_DEBUG").is_some()) {
        eprintln!("[fast {}] {what}", std::process::id());
    }
}

/// How long a QP whose grant was refused or given back waits before it asks again.
const RETRY_AFTER: Duration = Duration::from_millis(5);

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

#[derive(Default)]
struct Inner {
    /// Directions this process runs, by requester QPN.
    directions: HashMap<u32, DirectionRt>,
    /// QPs that may not ask for a grant before the given time.
    backoff: HashMap<u32, Instant>,
    /// Completions moved out of a CQ's other sources before a new source was attached.
    stash: HashMap<u32, VecDeque<Cqe>>,
    /// Rings feeding a CQ (by the CQ's handle), and the source count last seen.
    inbound: HashMap<u32, Vec<(u64, Inbound)>>,
    sources_seen: HashMap<u32, u32>,
}

/// A context's fast-path state.
#[derive(Default)]
pub struct FastPath {
    inner: Mutex<Inner>,
    /// Set once this context ran a direction or read a fast source: until then
    /// `ibv_poll_cq` does not even take the lock.
    used: std::sync::atomic::AtomicBool,
}

/// What [`FastPath::post`] did with a work request list.
pub enum Posted {
    /// Not on the fast path: post through the ring.
    Ring,
    /// Posted (or refused at `bad`, with the errno).
    Done(Result<(), (Errno, usize)>),
}

impl FastPath {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `qpn`'s requester runs here.
    pub fn runs(&self, qpn: u32) -> bool {
        self.lock().directions.contains_key(&qpn)
    }

    /// Posts `wqes` (validated and decoded from the QP's own encoding, see `verbs::qp`) on
    /// the direction of `qpn`, taking it first if the daemon offers it. `offered`: the
    /// QP's send ring says so; `sq_empty`: nothing waits in that ring (a grant needs it).
    pub fn post(
        &self,
        ctx: &ShimContext,
        qpn: u32,
        offered: bool,
        sq_empty: bool,
        wqes: &[SendWqe<'_>],
    ) -> Posted {
        let mut inner = self.lock();
        if !inner.directions.contains_key(&qpn) {
            if !offered || !sq_empty {
                return Posted::Ring;
            }
            if inner.backoff.get(&qpn).is_some_and(|t| Instant::now() < *t) {
                return Posted::Ring;
            }
            let taken = take(ctx, qpn);
            trace(format_args!("take qpn={qpn}: {}", taken.is_ok()));
            match taken {
                Ok(d) => {
                    self.used.store(true, std::sync::atomic::Ordering::Relaxed);
                    inner.directions.insert(qpn, d);
                }
                Err(_) => {
                    inner.backoff.insert(qpn, Instant::now() + RETRY_AFTER);
                    return Posted::Ring;
                }
            }
        }
        // Work the fast path leaves to the daemon: memory windows and invalidation change
        // the daemon's key tables; a receive the peer has not posted is an RNR, whose
        // waiting and retrying the daemon does.
        let recvs_needed = wqes
            .iter()
            .filter(|w| {
                matches!(
                    w.opcode,
                    WrOpcode::Send
                        | WrOpcode::SendWithImm
                        | WrOpcode::SendWithInv
                        | WrOpcode::RdmaWriteWithImm
                )
            })
            .count() as u32;
        let daemon_only = wqes.iter().any(|w| {
            matches!(
                w.opcode,
                WrOpcode::BindMw | WrOpcode::LocalInv | WrOpcode::SendWithInv
            ) || w.ud.is_some()
        });
        let Some(d) = inner.directions.get_mut(&qpn) else {
            return Posted::Ring;
        };
        if daemon_only || !d.receives_available(recvs_needed) {
            trace(format_args!(
                "qpn={qpn} to the daemon: daemon_only={daemon_only} recvs_needed={recvs_needed}"
            ));
            drop(inner);
            self.give_back(ctx, qpn);
            return Posted::Ring;
        }
        let mut wrs = Vec::with_capacity(wqes.len());
        for w in wqes {
            match proto::ring::wqe::convert::send_wr(w, |ah| ah) {
                Ok(wr) => wrs.push(wr),
                // Not possible for the opcodes that get here (a bind without its arguments
                // went to the daemon above).
                Err(_) => return Posted::Ring,
            }
        }
        let outcome = d.run(wrs);
        if outcome != Outcome::Idle {
            trace(format_args!("qpn={qpn} ran {} -> {outcome:?}", wqes.len()));
        }
        match outcome {
            Outcome::Idle => Posted::Done(Ok(())),
            Outcome::GiveBack => {
                drop(inner);
                self.give_back(ctx, qpn);
                Posted::Done(Ok(()))
            }
            Outcome::Revoked => {
                // The daemon took it back first: nothing ran; post through the ring.
                let d = inner.directions.remove(&qpn);
                retire(&mut inner, d);
                Posted::Ring
            }
        }
    }

    /// Ends the direction of `qpn` (before the QP is modified, destroyed, or used for work
    /// the fast path leaves to the daemon). Its completions stay in this process, ahead of
    /// what the daemon delivers later.
    pub fn give_back(&self, ctx: &ShimContext, qpn: u32) {
        let mut inner = self.lock();
        let Some(mut d) = inner.directions.remove(&qpn) else {
            return;
        };
        trace(format_args!("give back qpn={qpn}"));
        if d.publish_now() {
            let events = std::mem::take(&mut d.events);
            let _ = ctx.call_done(&Request::FastReturn { qpn, events });
        }
        inner.backoff.insert(qpn, Instant::now() + RETRY_AFTER);
        retire(&mut inner, Some(d));
    }

    /// Copies up to `out.len()` completions of CQ `cq` from the fast sources (and first from
    /// what was moved aside). `daemon_ring`: the CQ's ring, whose source count says when to
    /// attach new sources (its entries are moved aside first, being older).
    pub fn poll(
        &self,
        ctx: &ShimContext,
        cq: u32,
        daemon_ring: &mut SharedRing,
        out: &mut Vec<Cqe>,
        max: usize,
    ) {
        let mut inner = self.lock();
        let sources = daemon_ring.fast_sources();
        if inner.sources_seen.get(&cq).copied().unwrap_or(0) != sources {
            attach(ctx, &mut inner, cq, sources, daemon_ring);
        }
        if let Some(s) = inner.stash.get_mut(&cq) {
            while out.len() < max {
                let Some(c) = s.pop_front() else { break };
                out.push(c);
            }
        }
        for d in inner.directions.values_mut().filter(|d| d.send_cq == cq) {
            while out.len() < max {
                let Some(c) = d.completions.pop_front() else {
                    break;
                };
                out.push(c);
            }
        }
        if let Some(rings) = inner.inbound.get_mut(&cq) {
            for (_, r) in rings.iter_mut() {
                while out.len() < max {
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
                    out.push(entry.cqe);
                }
            }
            // A revoked direction's ring is dropped once its taker is out of it for good
            // (revoked, then not inside) and it is empty, in that order.
            rings.retain(|(_, r)| {
                !(r.control.is_revoked()
                    && !r.control.busy()
                    && r.ring.available().unwrap_or(0) == 0)
            });
        }
    }

    /// Whether CQ `daemon_ring` may have fast sources to read (a check without the lock).
    pub fn may_feed(&self, daemon_ring: &SharedRing) -> bool {
        if self.used.load(std::sync::atomic::Ordering::Relaxed) {
            return true;
        }
        if daemon_ring.fast_sources() != 0 {
            self.used.store(true, std::sync::atomic::Ordering::Relaxed);
            return true;
        }
        false
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
fn retire(inner: &mut Inner, d: Option<DirectionRt>) {
    if let Some(mut d) = d {
        let cq = d.send_cq;
        inner
            .stash
            .entry(cq)
            .or_default()
            .extend(d.completions.drain(..));
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
    let stash = inner.stash.entry(cq).or_default();
    let mut slot = vec![0u8; daemon_ring.geometry().slot_size as usize];
    while let Ok(true) = daemon_ring.pop(&mut slot) {
        if let Some(c) = Cqe::decode(&slot) {
            stash.push_back(c);
        }
    }
    let got = ctx.call(&Request::FastSources { cq }, &[]);
    let Ok((Response::FastSources { rings }, fds)) = got else {
        trace(format_args!("attach cq={cq:#x}: {:?}", got.err()));
        return;
    };
    inner.sources_seen.insert(cq, sources);
    trace(format_args!(
        "attach cq={cq:#x} sources={sources} rings={:?}",
        rings.iter().map(|r| r.direction).collect::<Vec<_>>()
    ));
    let known = inner.inbound.entry(cq).or_default();
    for (r, fd) in rings.iter().zip(fds) {
        if known.iter().any(|(id, _)| *id == r.direction) {
            continue;
        }
        if let Ok(i) = inbound(r, fd) {
            known.push((r.direction, i));
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
