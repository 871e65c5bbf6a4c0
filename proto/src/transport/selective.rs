//! Selective retransmission between softroce peers, in the spirit of IRN (Mittal et al.,
//! "Revisiting Network Support for RDMA", SIGCOMM 2018). Go-back-N, exactly as rxe, stays
//! every QP's default; a QP is switched to selective by [`super::Engine::set_loss_recovery`]
//! only when the daemon knows the peer is a softroce device that does the same
//! (`docs/loss-recovery.md`), so kernel rxe never sees any of this.
//!
//! - **Responder.** Request packets up to `window` PSNs past the expected one (ePSN) are held
//!   in a reorder buffer instead of being dropped; when the hole at ePSN fills, they are
//!   executed in PSN order by the ordinary in-order path (`responder::execute_in_order`), so
//!   placement, receive WQEs, MSNs, READ and atomic execution and completions are exactly
//!   those of an in-order arrival. What it holds is reported with a SACK
//!   ([`crate::wire::sack`]: ePSN plus a bitmap) whenever a gap opens, a packet asks for an
//!   ACK, and every [`SACK_EVERY`] held packets; ACKs are cumulative and coalesced.
//! - **Requester.** Keeps every request packet it sent and not yet known received, with the
//!   order it was (re)transmitted in. A packet is lost when the peer reported holding one
//!   transmitted after it (RACK's rule: transmission order, so a lost retransmission is
//!   found too); only lost packets are sent again, with AckReq, before anything new. Its
//!   window is the bandwidth-delay product in packets ([`SelectiveParams`]).
//! - **Responses** (READ data, atomic results) travel the other way: READ response packets
//!   are placed at their offset as they come, in any order; when a later response or an ACK
//!   past the request shows some went missing, a READ for just that run is sent (the
//!   responder answers it from its replay resources, IBTA §9.7.5.1.5, as any duplicate READ);
//!   a lost atomic ACK makes the requester send the atomic again (answered from the saved
//!   result, never executed twice).
//! - **Timeout.** On the retransmit timer the highest unreported packet is sent again as a
//!   probe (its answer reports every hole at once, where TCP sends a tail-loss probe), and
//!   missing responses are asked for again. retry_cnt counts these timeouts exactly as
//!   go-back-N counts its retries, so a dead peer still ends in RETRY_EXC_ERR after
//!   (retry_cnt + 1) timeouts; any progress restores it (IBTA C9-140, as rxe).
//! - **Completions** stay in order: a WQE completes when it is the oldest and all of it is
//!   acknowledged (SEND/WRITE) or its response has arrived (READ/atomic).
//!
//! The two halves do not need to switch together: a selective requester facing a go-back-N
//! responder receives plain sequence NAKs and goes back N; a go-back-N requester treats a
//! SACK as the sequence NAK its AETH says it is.

use super::completer::{progress, start_retry, use_retry};
use super::engine::{check_sq_drained, schedule, Ctx, RxPacket, Transmit};
use super::memory::MemoryAccess;
use super::qp::{Qp, RespOut, SendWqe};
use super::requester::{emit_request, fail_head, Emit};
use super::timers::{ack_timeout, rnr_delay, Nanos};
use super::verbs::{SendOp, WcStatus};
use crate::types::Psn;
use crate::wire::{sack, AethSyndrome, NakCode, OpInfo, Opcode, SackRepr, TransportRepr};
use std::collections::VecDeque;

/// How an RC QP recovers lost packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LossRecovery {
    /// Go back to the oldest unacknowledged PSN and resend everything from there: rxe's
    /// behaviour and the default.
    #[default]
    GoBackN,
    /// Selective retransmission (softroce peers only).
    Selective(SelectiveParams),
}

/// Selective retransmission's one parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SelectiveParams {
    /// The bandwidth-delay product the window is capped at, in bytes: the requester keeps at
    /// most this much (in path-MTU packets, [`MIN_WINDOW`]..[`MAX_WINDOW`]) unacknowledged,
    /// and the responder holds at most as many packets out of order.
    pub bdp_bytes: u32,
}

impl Default for SelectiveParams {
    fn default() -> Self {
        SelectiveParams {
            bdp_bytes: DEFAULT_BDP_BYTES,
        }
    }
}

/// Default bandwidth-delay product: 512 KiB, 128 packets at MTU 4096 (the daemon's default
/// path MTU), as many bytes as rxe's fixed window of 128 PSNs holds there; 512 at MTU 1024.
/// Until 2026-12-06 it was 128 KiB (32 packets at MTU 4096), because a larger window
/// overran the receiving daemon's receive buffers in bursts; since the device thread
/// receives for itself (`docs/architecture.md`, "The data path") 512 KiB costs nothing
/// lossless and holds far more at loss (`docs/loss-recovery.md` has the measurements).
pub const DEFAULT_BDP_BYTES: u32 = 512 * 1024;
/// The smallest window, whatever the BDP.
pub const MIN_WINDOW: u32 = 16;
/// The largest window: one SACK bitmap's worth of PSNs.
pub const MAX_WINDOW: u32 = sack::MAX_BITS as u32;
/// The responder reports at least after this many held packets.
pub const SACK_EVERY: u32 = 8;

impl SelectiveParams {
    /// The window in PSNs at path MTU `mtu`.
    pub fn window(&self, mtu: u32) -> u32 {
        self.bdp_bytes
            .div_ceil(mtu.max(1))
            .clamp(MIN_WINDOW, MAX_WINDOW)
    }
}

/// A request packet the requester sent and has not seen acknowledged cumulatively.
#[derive(Debug, Clone, Copy)]
struct SentPkt {
    psn: Psn,
    /// Its last (re)transmission's place in the QP's transmission order.
    tx: u64,
    /// The responder reported holding it.
    sacked: bool,
    /// Waiting in the retransmit queue.
    queued: bool,
    /// Queued as a timeout's probe: sent even though reported held.
    probe: bool,
    /// When it was last sent, and whether it ever was again (no round-trip sample then:
    /// Karn's rule).
    sent_at: Nanos,
    resent: bool,
}

/// The requester's half.
#[derive(Debug, Default)]
struct ReqState {
    /// The responder's ePSN as last reported: everything before it arrived.
    cum_acked: Psn,
    /// The highest PSN ever sent plus one (a report beyond it is bogus).
    high_psn: Psn,
    sent: VecDeque<SentPkt>,
    /// PSNs to send again, oldest first.
    retx: VecDeque<Psn>,
    next_tx: u64,
    /// Transmission order of the latest-sent packet the responder reported holding.
    max_sacked_tx: u64,
    /// A NAK (or exhausted RNR retries) for a WQE behind the oldest: reported when that WQE
    /// becomes the oldest, so completions stay in order.
    error: Option<(Psn, WcStatus)>,
    /// The responder answered with a plain sequence NAK: it keeps nothing out of order (it
    /// is on go-back-N, for now), so timeouts go back N too. Cleared by its next SACK.
    peer_go_back_n: bool,
    /// Smoothed round trip and its variation (RFC 6298's gains), from packets acknowledged
    /// or reported held that were sent once.
    srtt: Option<Nanos>,
    rttvar: Nanos,
    /// When the newest such packet of the last report was sent.
    sample: Option<Nanos>,
    /// Probes sent since the last progress (each doubles the probe timeout).
    probe_backoff: u32,
    /// Response PSNs the last probe asked a READ for alone, one packet each
    /// ([`Selective::queue_one_response`]).
    one_packet: Vec<Psn>,
    /// Packets sent again that are not request packets of `sent` (READs asked from inside a
    /// READ's response range, by repairs and probes; an atomic asked again once acknowledged
    /// past), with their place in the transmission order: a responder that holds one lacks
    /// what was sent before it (RACK's rule, as for `sent`). The newest [`ASKED_KEPT`].
    asked_again: VecDeque<(Psn, u64)>,
}

/// How many packets `asked_again` remembers.
const ASKED_KEPT: usize = 64;

/// A request packet held out of order by the responder.
#[derive(Debug)]
struct Held {
    t: TransportRepr,
    payload: Vec<u8>,
    wire_len: usize,
    /// It came as RoCE v1 (a GRH): executed later, it must still match the QP's path.
    v1: bool,
}

/// The responder's half: the reorder buffer. `slots[i]` holds PSN `base + i`; `base` is the
/// QP's ePSN whenever nothing is being executed, so `slots[0]` is empty (it is the hole).
#[derive(Debug, Default)]
struct RespState {
    base: Psn,
    slots: VecDeque<Option<Held>>,
    held: usize,
    since_report: u32,
    /// An ACK is owed for a packet executed in this pass (sent as one report at its end).
    ack_owed: bool,
}

impl RespState {
    /// Moves `base` up to `epsn`, dropping what lay in between (PSNs a READ consumed).
    /// Returns how many held packets were dropped.
    fn align(&mut self, epsn: Psn) -> u64 {
        let mut dropped = 0;
        if self.slots.is_empty() || epsn.is_before(self.base) {
            dropped = self.held as u64;
            self.clear();
            self.base = epsn;
            return dropped;
        }
        while self.base != epsn {
            match self.slots.pop_front() {
                Some(Some(_)) => {
                    self.held -= 1;
                    dropped += 1;
                }
                Some(None) => {}
                None => {}
            }
            self.base = self.base.next();
            if self.slots.is_empty() {
                self.base = epsn;
            }
        }
        self.trim();
        dropped
    }

    fn trim(&mut self) {
        while matches!(self.slots.back(), Some(None)) {
            self.slots.pop_back();
        }
    }

    fn take_front(&mut self) -> Option<Held> {
        let h = self.slots.front_mut()?.take()?;
        self.held -= 1;
        Some(h)
    }

    fn clear(&mut self) {
        self.slots.clear();
        self.held = 0;
    }

    /// The SACK for `epsn` (at or before `base`): PSNs in between were executed, the rest
    /// is what the slots hold.
    fn bitmap(&self, epsn: Psn) -> SackRepr {
        let before = self.base.diff(epsn).max(0) as usize;
        let span = (before + self.slots.len()).saturating_sub(1);
        let mut s = SackRepr::with_len(span);
        for k in 0..s.len() {
            // Bit k is PSN epsn + 1 + k.
            let i = k + 1;
            let holds = if i < before {
                true
            } else {
                self.slots.get(i - before).is_some_and(Option::is_some)
            };
            if holds {
                s.set(k);
            }
        }
        s
    }
}

/// A QP's selective-retransmission state (`Qp::selective`).
#[derive(Debug)]
pub(crate) struct Selective {
    params: SelectiveParams,
    req: ReqState,
    resp: RespState,
}

impl Selective {
    /// The requester's window: (base, PSNs allowed past it).
    pub fn send_window(&self, comp_psn: Psn, mtu: u32) -> (Psn, i32) {
        let base = if comp_psn.is_after(self.req.cum_acked) {
            comp_psn
        } else {
            self.req.cum_acked
        };
        (base, self.params.window(mtu) as i32)
    }

    pub fn params(&self) -> SelectiveParams {
        self.params
    }

    /// A one-line summary for logs: what the requester waits for and the responder holds.
    pub fn summary(&self) -> String {
        let r = &self.req;
        let sacked = r.sent.iter().filter(|p| p.sacked).count();
        format!(
            "cum_acked {} high {} sent {} (sacked {sacked}, first {:?}) retx {:?} peer_gbn {} error {:?}; holds {} from {}",
            r.cum_acked,
            r.high_psn,
            r.sent.len(),
            r.sent.front().map(|p| (p.psn.value(), p.tx, p.sacked, p.queued)),
            r.retx.iter().take(4).map(|p| p.value()).collect::<Vec<_>>(),
            r.peer_go_back_n,
            r.error,
            self.resp.held,
            self.resp.base,
        )
    }

    /// How long a stall lasts before a probe: two smoothed round trips plus four times their
    /// variation (daemons share CPUs: round trips vary), at least 200 µs, 1 ms before the
    /// first measurement; doubled per probe without progress, at most the retransmit
    /// timeout (or 100 ms).
    pub fn probe_timeout(&self, timeout: u8) -> Nanos {
        let r = &self.req;
        let base = r
            .srtt
            .map_or(1_000_000, |s| 2 * s + 4 * r.rttvar)
            .max(200_000);
        let cap = ack_timeout(timeout).map_or(100_000_000, |t| t.min(100_000_000));
        (base << r.probe_backoff.min(8)).min(cap)
    }

    /// Folds the round trip of the last report's newest packet into the estimate.
    fn measure(&mut self, now: Nanos) {
        let r = &mut self.req;
        if let Some(sent) = r.sample.take() {
            let s = now.saturating_sub(sent);
            match r.srtt {
                None => {
                    r.srtt = Some(s);
                    r.rttvar = s / 2;
                }
                Some(old) => {
                    r.rttvar = r.rttvar - r.rttvar / 4 + old.abs_diff(s) / 4;
                    r.srtt = Some(old - old / 8 + s / 8);
                }
            }
        }
    }

    fn sampled(&mut self, p: SentPkt) {
        if !p.resent {
            let r = &mut self.req;
            r.sample = Some(r.sample.map_or(p.sent_at, |t| t.max(p.sent_at)));
        }
    }

    /// A new request packet `psn` went out at `now`; the next one is `next`.
    pub fn on_sent(&mut self, psn: Psn, next: Psn, now: Nanos) {
        let r = &mut self.req;
        if next.is_after(r.high_psn) {
            r.high_psn = next;
        }
        if psn.is_before(r.cum_acked) {
            return; // going back N over what the responder already has
        }
        if r.sent.back().is_some_and(|b| !psn.is_after(b.psn)) {
            return;
        }
        r.next_tx += 1;
        r.sent.push_back(SentPkt {
            psn,
            tx: r.next_tx,
            sacked: false,
            queued: false,
            probe: false,
            sent_at: now,
            resent: false,
        });
    }

    /// A go-back-N pass restarts: forget per-packet state.
    pub fn on_go_back_n(&mut self) {
        self.req.sent.clear();
        self.req.retx.clear();
        self.req.asked_again.clear();
    }

    fn sent_index(&self, psn: Psn) -> Option<usize> {
        let s = &self.req.sent;
        let i = s.partition_point(|e| e.psn.is_before(psn));
        (s.get(i)?.psn == psn).then_some(i)
    }

    /// Everything before `c` reached the responder. Returns true if that is news.
    fn advance_cum(&mut self, c: Psn) -> bool {
        let r = &mut self.req;
        if !c.is_after(r.cum_acked) || c.is_after(r.high_psn) {
            return false;
        }
        r.cum_acked = c;
        let mut newest = None;
        while r.sent.front().is_some_and(|e| e.psn.is_before(c)) {
            newest = r.sent.pop_front();
        }
        r.asked_again.retain(|(p, _)| !p.is_before(c));
        if let Some(p) = newest {
            self.sampled(p);
        }
        true
    }

    /// The responder said it lacks `epsn`: if it was reported held before, the responder has
    /// since refused it (an RNR NAK that was lost).
    fn lacks(&mut self, epsn: Psn) {
        if let Some(i) = self.sent_index(epsn) {
            self.req.sent[i].sacked = false;
        }
    }

    fn queue(&mut self, psn: Psn) {
        if let Some(i) = self.sent_index(psn) {
            let e = &mut self.req.sent[i];
            if e.queued {
                return;
            }
            e.queued = true;
        } else if self.req.retx.contains(&psn) {
            return;
        }
        self.req.retx.push_back(psn);
    }

    /// Queues a READ for the one response packet `psn` (a probe's ask: [`Repair::Probe`]),
    /// where a repair asks for the whole run of missing packets from `psn`.
    fn queue_one_response(&mut self, psn: Psn) {
        if !self.req.one_packet.contains(&psn) {
            self.req.one_packet.push(psn);
        }
        self.queue(psn);
    }

    /// Marks what `sack` (for ePSN `e`) reports held; queues what it shows lost. Returns
    /// (newly reported held, newly found lost).
    fn apply_sack(&mut self, e: Psn, sack: &SackRepr) -> (u32, u32) {
        let r = &mut self.req;
        let mut fresh = 0;
        let mut newest: Option<SentPkt> = None;
        for p in r.sent.iter_mut() {
            let k = p.psn.diff(e) - 1;
            if k >= 0 && sack.get(k as usize) && !p.sacked {
                p.sacked = true;
                fresh += 1;
                r.max_sacked_tx = r.max_sacked_tx.max(p.tx);
                if !p.resent && newest.is_none_or(|n| n.sent_at < p.sent_at) {
                    newest = Some(*p);
                }
            }
        }
        if let Some(p) = newest {
            self.sampled(p);
        }
        let r = &mut self.req;
        for &(psn, tx) in &r.asked_again {
            let k = psn.diff(e) - 1;
            if k >= 0 && sack.get(k as usize) {
                r.max_sacked_tx = r.max_sacked_tx.max(tx);
            }
        }
        let lost: Vec<Psn> = r
            .sent
            .iter()
            .filter(|p| !p.sacked && !p.queued && p.tx < r.max_sacked_tx)
            .map(|p| p.psn)
            .collect();
        for p in &lost {
            self.queue(*p);
        }
        (fresh, lost.len() as u32)
    }
}

fn is_send_or_write(op: &SendOp) -> bool {
    matches!(
        op,
        SendOp::Send
            | SendOp::SendWithImm(_)
            | SendOp::SendWithInv(_)
            | SendOp::Write(_)
            | SendOp::WriteWithImm(..)
    )
}

fn contains(w: &SendWqe, psn: Psn) -> bool {
    w.started && !psn.is_before(w.first_psn) && !psn.is_after(w.last_psn)
}

fn got(w: &SendWqe, psn: Psn) -> bool {
    let i = psn.diff(w.first_psn);
    i >= 0
        && w.got
            .get(i as usize / 64)
            .is_some_and(|b| b >> (i % 64) & 1 == 1)
}

fn mark_got(w: &mut SendWqe, psn: Psn) {
    let i = psn.diff(w.first_psn);
    if i < 0 || i as u32 >= w.npkts {
        return;
    }
    if w.got.is_empty() {
        w.got = vec![0; (w.npkts as usize).div_ceil(64)];
    }
    let (word, bit) = (i as usize / 64, 1u64 << (i % 64));
    if w.got[word] & bit == 0 {
        w.got[word] |= bit;
        w.got_count += 1;
    }
}

fn all_got(w: &SendWqe) -> bool {
    w.got_count >= w.npkts
}

/// Switches an RC QP to selective retransmission, at any time (the daemon may learn that the
/// peer is softroce after the first packets went out): what is outstanding is taken over.
pub(crate) fn enable(qp: &mut Qp, params: SelectiveParams) {
    if let Some(sel) = qp.selective.as_mut() {
        sel.params = params;
        return;
    }
    let mut sel = Selective {
        params,
        req: ReqState {
            cum_acked: qp.comp_psn,
            high_psn: qp.req_psn,
            ..Default::default()
        },
        resp: RespState {
            base: qp.resp_psn,
            ..Default::default()
        },
    };
    let comp = qp.comp_psn;
    for w in qp.sq.iter_mut() {
        if !w.started || w.wr.op.is_local() {
            break;
        }
        if is_send_or_write(&w.wr.op) {
            let mut p = if comp.is_after(w.first_psn) {
                comp
            } else {
                w.first_psn
            };
            while p.is_before(w.next_psn) && !p.is_after(w.last_psn) {
                sel.on_sent(p, p.next(), 0);
                p = p.next();
            }
        } else {
            if w.next_psn != w.first_psn {
                sel.on_sent(w.first_psn, w.last_psn.next(), 0);
            }
            if matches!(w.wr.op, SendOp::Read(_)) {
                // Go-back-N took READ responses in order: those before comp_psn are placed.
                let mut p = w.first_psn;
                while p.is_before(comp) && !p.is_after(w.last_psn) {
                    mark_got(w, p);
                    p = p.next();
                }
            }
            w.repair_upto = w.first_psn;
        }
    }
    for p in sel.req.sent.iter_mut() {
        p.resent = true; // sent before: no round-trip sample from them
    }
    sel.req.high_psn = qp.req_psn;
    qp.sent_psn_nak = false;
    qp.selective = Some(Box::new(sel));
}

/// modify_qp set the send or receive PSN: start over from it.
pub(crate) fn on_psns_set(qp: &mut Qp) {
    if let Some(sel) = qp.selective.as_mut() {
        sel.req = ReqState {
            cum_acked: qp.comp_psn,
            high_psn: qp.req_psn,
            ..Default::default()
        };
        sel.resp.clear();
        sel.resp.base = qp.resp_psn;
    }
}

/// The QP went to ERR: what the responder held is dropped (nothing more executes).
pub(crate) fn on_error(qp: &mut Qp) {
    if let Some(sel) = qp.selective.as_mut() {
        sel.resp.clear();
        sel.req.retx.clear();
    }
}

// ----- requester ------------------------------------------------------------------------

/// The next packet the peer's reports (or a timeout) asked for, if any.
pub(crate) fn poll_retransmit<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    now: Nanos,
    buf: &mut [u8],
) -> Option<Transmit> {
    loop {
        let sel = qp.selective.as_mut()?;
        let psn = sel.req.retx.pop_front()?;
        if let Some(i) = sel.sent_index(psn) {
            let e = &mut sel.req.sent[i];
            e.queued = false;
            if e.sacked && !std::mem::take(&mut e.probe) {
                continue;
            }
        }
        let cum = sel.req.cum_acked;
        let Some(idx) = qp.sq.iter().position(|w| contains(w, psn)) else {
            continue;
        };
        let w = &qp.sq[idx];
        if w.error.is_some() || w.wr.op.is_local() {
            continue;
        }
        let read_len = match w.wr.op {
            _ if is_send_or_write(&w.wr.op) => {
                // Acknowledged since, or not sent yet in this pass.
                if psn.is_before(cum) || (!w.sent_all && !psn.is_before(w.next_psn)) {
                    continue;
                }
                None
            }
            SendOp::Read(_) => {
                if w.resp_done || got(w, psn) || (w.next_psn == w.first_psn) {
                    continue;
                }
                // Ask again for the run of missing response packets starting here, or for its
                // one packet (a probe's ask).
                let one = qp.selective.as_mut().is_some_and(|s| {
                    let before = s.req.one_packet.len();
                    s.req.one_packet.retain(|t| *t != psn);
                    s.req.one_packet.len() != before
                });
                let most = if one { 1 } else { u32::MAX };
                let mut run = 0u32;
                let mut p = psn;
                while run < most && !p.is_after(w.last_psn) && !got(w, p) {
                    run += 1;
                    p = p.next();
                }
                Some(run.saturating_mul(qp.mtu()))
            }
            _ => {
                if w.resp_done || psn != w.first_psn || w.next_psn == w.first_psn {
                    continue;
                }
                None
            }
        };
        match emit_request(qp, ctx, now, idx, psn, Emit::Retransmit { read_len }, buf) {
            Some(tx) => return Some(tx),
            None => {
                if qp.paced_until.is_some() {
                    // Paced: it goes first when the pacer allows.
                    if let Some(sel) = qp.selective.as_mut() {
                        sel.req.retx.push_front(psn);
                        if let Some(i) = sel.sent_index(psn) {
                            sel.req.sent[i].queued = true;
                        }
                    }
                }
                return None;
            }
        }
    }
}

/// Packet `psn` was sent again.
pub(crate) fn resent<M>(qp: &mut Qp, ctx: &mut Ctx<M>, now: Nanos, psn: Psn, len: usize) {
    // Not held by the pacer (what the peer lacks goes first), but charged to it and to the
    // rate increase's byte counter, as every packet sent.
    if qp.cc.limited() {
        qp.cc
            .inner_mut()
            .on_sent(now, len, &ctx.config.congestion.params);
        qp.pacer.on_sent(now, len);
    }
    ctx.counters.sel_retransmits += 1;
    // Each one deliberately moves the PSN sent backward (the simulator's invariant).
    qp.retry_events += 1;
    if qp.retrans_deadline.is_none() {
        qp.retrans_deadline = ack_timeout(qp.attr.timeout).map(|d| now + d);
    }
    if let Some(sel) = qp.selective.as_mut() {
        sel.req.next_tx += 1;
        let tx = sel.req.next_tx;
        if let Some(i) = sel.sent_index(psn) {
            let e = &mut sel.req.sent[i];
            e.tx = tx;
            e.sent_at = now;
            e.resent = true;
        } else {
            let asked = &mut sel.req.asked_again;
            if asked.len() == ASKED_KEPT {
                asked.pop_front();
            }
            asked.push_back((psn, tx));
        }
        if qp.probe_deadline.is_none() {
            qp.probe_deadline = Some(now + sel.probe_timeout(qp.attr.timeout));
        }
    }
}

/// Why the requester asks again for responses (see [`repair_responses`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Repair {
    /// A response, ACK or SACK at or past this PSN arrived after every response before it
    /// was sent (the responder answers in PSN order): what is missing before it was lost.
    Evidence(Psn),
    /// The retransmit timer fired: ask again for every missing response.
    Timeout,
    /// The probe timer fired: a stall, perhaps only a slow peer. For a READ already
    /// answering, ask for its last missing response alone.
    Probe,
}

/// Asks again for the READ responses and atomic ACKs still missing, as `why` says.
///
/// A probe asks a READ that has started to answer for its last missing packet only, as
/// TCP's tail-loss probe resends one segment: the responder queues that answer behind
/// whatever it still owes, so if earlier responses were lost, its arrival is the
/// [`Repair::Evidence`] that asks for exactly those; if they were only late (a peer whose
/// device thread waited for a CPU), the probe cost one packet. Asking for every missing
/// response instead made the responder send the rest of a long READ twice: between two
/// daemons on two busy CPUs, MPICH's 1 MiB rendezvous READs were answered with 20,000
/// duplicate responses in 100 round trips (docs/loss-recovery.md, "Timers").
fn repair_responses(qp: &mut Qp, why: Repair) -> bool {
    let Some(sel) = qp.selective.as_mut() else {
        return false;
    };
    // A timer asks for every WQE whose responses have begun; evidence for those before it.
    let all = matches!(why, Repair::Timeout | Repair::Probe);
    let x = match why {
        Repair::Evidence(x) => x,
        _ => sel.req.cum_acked,
    };
    let mut queued = false;
    for w in qp.sq.iter_mut() {
        if !w.started || w.wr.op.is_local() {
            break;
        }
        let executed = w.first_psn.is_before(x) || (all && !w.got.is_empty());
        if !executed {
            if all {
                continue;
            }
            break;
        }
        if is_send_or_write(&w.wr.op) || w.resp_done || w.next_psn == w.first_psn {
            continue;
        }
        let end = if all || x.is_after(w.last_psn) {
            w.last_psn.next()
        } else {
            x
        };
        let mut p = if w.repair_upto.is_after(w.first_psn) {
            w.repair_upto
        } else {
            w.first_psn
        };
        if matches!(w.wr.op, SendOp::Read(_)) {
            if why == Repair::Probe && w.got_count > 0 {
                // The last missing response alone.
                let mut last = None;
                while p.is_before(end) {
                    if !got(w, p) {
                        last = Some(p);
                    }
                    p = p.next();
                }
                if let Some(l) = last {
                    sel.queue_one_response(l);
                    queued = true;
                }
            } else {
                // One READ per run of missing response packets.
                let mut in_run = false;
                while p.is_before(end) {
                    let missing = !got(w, p);
                    if missing && !in_run {
                        sel.queue(p);
                        queued = true;
                    }
                    in_run = missing;
                    p = p.next();
                }
            }
        } else if p == w.first_psn {
            sel.queue(p);
            queued = true;
        }
        if why == Repair::Probe && matches!(w.wr.op, SendOp::Read(_)) {
            // What the probe's answer reveals is asked for from the start of the READ.
            continue;
        }
        if end.is_after(w.repair_upto) {
            w.repair_upto = end;
        }
    }
    queued
}

/// Completes, in order, the WQEs whose acknowledgement or response is in. Returns true if
/// any did.
fn complete_in_order<M: MemoryAccess>(qp: &mut Qp, ctx: &mut Ctx<M>) -> bool {
    let mut done_any = false;
    loop {
        let Some(sel) = qp.selective.as_ref() else {
            return done_any;
        };
        let (cum, error) = (sel.req.cum_acked, sel.req.error);
        let Some(w) = qp.sq.front() else { break };
        if !w.started || w.wr.op.is_local() {
            break;
        }
        if let Some(status) = w.error {
            fail_head(qp, ctx, status);
            return done_any;
        }
        if let Some((p, status)) = error.filter(|(p, _)| contains(w, *p)) {
            let _ = p;
            fail_head(qp, ctx, status);
            return done_any;
        }
        let done = if is_send_or_write(&w.wr.op) {
            w.sent_all && w.last_psn.is_before(cum)
        } else {
            w.resp_done
        };
        if !done {
            // comp_psn: the oldest PSN of the oldest WQE not yet acknowledged or answered.
            qp.comp_psn = if is_send_or_write(&w.wr.op) {
                if cum.is_after(w.first_psn) {
                    cum
                } else {
                    w.first_psn
                }
            } else if matches!(w.wr.op, SendOp::Read(_)) {
                // The first response missing; comp_psn only moves forward within the WQE.
                let c = qp.comp_psn;
                let mut p = if c.is_after(w.first_psn) && !c.is_after(w.last_psn) {
                    c
                } else {
                    w.first_psn
                };
                while p.is_before(w.last_psn) && got(w, p) {
                    p = p.next();
                }
                p
            } else {
                w.first_psn
            };
            break;
        }
        qp.comp_psn = w.last_psn.next();
        super::requester::complete_head(qp, ctx, WcStatus::Success);
        done_any = true;
    }
    done_any
}

/// A response to the request ending at `psn` arrived: the responder executed everything up
/// to it.
fn executed_through(qp: &mut Qp, psn: Psn) {
    if let Some(sel) = qp.selective.as_mut() {
        sel.advance_cum(psn.next());
    }
}

/// A response that matched nothing outstanding, or repeated one: counted, no effect (as the
/// go-back-N completer's `drops.response_ignored`).
fn ignored<M>(ctx: &mut Ctx<M>) {
    ctx.counters.drops.response_ignored += 1;
}

/// One response packet on a selective QP (the completer's role).
pub(crate) fn on_response<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    now: Nanos,
    rx: &RxPacket<'_>,
) {
    let t = &rx.t;
    let psn = t.bth.psn;
    let syndrome = t.aeth.map(|a| a.syndrome);
    let mut news = false;
    // Past this PSN the responder has sent every response before it.
    let mut evidence: Option<Psn> = None;
    let mut lost = 0;
    match t.bth.opcode {
        Opcode::SOFTROCE_SACK => {
            let Ok(sack) = SackRepr::parse(rx.payload) else {
                // Accepted by the engine (in rcvd_pkts), then of no use.
                ctx.counters.drops.response_ignored += 1;
                return;
            };
            ctx.counters.sack_rcvd += 1;
            let Some(sel) = qp.selective.as_mut() else {
                return ignored(ctx);
            };
            sel.req.peer_go_back_n = false;
            if psn.is_after(sel.req.high_psn) {
                return ignored(ctx);
            }
            // A report overtaken by a newer one may claim a packet the responder has since
            // refused (RNR): only the latest reports' bitmaps count.
            if !psn.is_before(sel.req.cum_acked) {
                news |= sel.advance_cum(psn);
                sel.lacks(psn);
                let (fresh, found) = sel.apply_sack(psn, &sack);
                news |= fresh > 0;
                lost += found;
            }
            evidence = Some(psn);
        }
        Opcode::RC_ACKNOWLEDGE => match syndrome {
            Some(AethSyndrome::Ack { .. }) => {
                let c = psn.next();
                if let Some(sel) = qp.selective.as_mut() {
                    news |= sel.advance_cum(c);
                    if c == sel.req.cum_acked {
                        sel.lacks(c);
                    }
                }
                evidence = Some(c);
            }
            Some(AethSyndrome::RnrNak { timer }) => {
                ctx.counters.rcvd_rnr_err += 1;
                qp.counters.rcvd_rnr_err += 1;
                if qp
                    .selective
                    .as_ref()
                    .is_some_and(|s| psn.is_before(s.req.cum_acked))
                {
                    return; // a stale duplicate: that packet was accepted since
                }
                let head_has_it = qp.sq.front().is_some_and(|w| contains(w, psn));
                if qp.rnr_retry_left == 0 {
                    ctx.counters.retry_rnr_exceeded_err += 1;
                    qp.counters.retry_rnr_exceeded_err += 1;
                    if head_has_it {
                        fail_head(qp, ctx, WcStatus::RnrRetryExcErr);
                        return;
                    }
                    if let Some(sel) = qp.selective.as_mut() {
                        sel.req.error = Some((psn, WcStatus::RnrRetryExcErr));
                        sel.advance_cum(psn);
                    }
                } else {
                    if qp.attr.rnr_retry != 7 {
                        qp.rnr_retry_left -= 1;
                    }
                    // The responder keeps what it holds past the refused packet: only that
                    // one goes again, after the RNR timer (IBTA §9.7.5.2.8).
                    if let Some(sel) = qp.selective.as_mut() {
                        news |= sel.advance_cum(psn);
                        // It may have been reported held before the responder reached it.
                        sel.lacks(psn);
                        sel.queue(psn);
                        // A responder on go-back-N dropped everything after it.
                        qp.need_retry |= sel.req.peer_go_back_n;
                    }
                    qp.retry_events += 1;
                    qp.rnr_wait_until = Some(now + rnr_delay(timer).max(1));
                    qp.retrans_deadline = None;
                }
                evidence = Some(psn);
            }
            Some(AethSyndrome::Nak(NakCode::PsnSequenceError)) => {
                // A plain sequence NAK: this responder keeps nothing out of order (go-back-N
                // on its side, or switching): go back N from it.
                ctx.counters.rcvd_seq_err += 1;
                qp.counters.rcvd_seq_err += 1;
                if let Some(sel) = qp.selective.as_mut() {
                    // Everything before it arrived: progress, as for go-back-N's comp_psn.
                    news |= sel.advance_cum(psn);
                    sel.req.peer_go_back_n = true;
                }
                complete_in_order(qp, ctx);
                start_retry(qp, ctx, false);
                evidence = Some(psn);
            }
            Some(AethSyndrome::Nak(code)) => {
                let status = super::completer::nak_status(qp, ctx, code);
                if qp.sq.front().is_some_and(|w| contains(w, psn)) {
                    fail_head(qp, ctx, status);
                    return;
                }
                if let Some(sel) = qp.selective.as_mut() {
                    sel.req.error = Some((psn, status));
                    sel.advance_cum(psn);
                }
                news = true;
            }
            _ => return ignored(ctx),
        },
        Opcode::RC_RDMA_READ_RESPONSE_FIRST
        | Opcode::RC_RDMA_READ_RESPONSE_MIDDLE
        | Opcode::RC_RDMA_READ_RESPONSE_LAST
        | Opcode::RC_RDMA_READ_RESPONSE_ONLY => {
            if syndrome.is_some_and(|s| !matches!(s, AethSyndrome::Ack { .. })) {
                return ignored(ctx);
            }
            let Some(idx) = qp.sq.iter().position(|w| contains(w, psn)) else {
                return ignored(ctx); // stale: its WQE completed
            };
            let mtu = u64::from(qp.mtu());
            let pd = qp.init.pd;
            let w = &mut qp.sq[idx];
            match w.wr.op {
                SendOp::Read(_) => {
                    if w.resp_done || got(w, psn) {
                        return ignored(ctx);
                    }
                    let offset = psn.diff(w.first_psn) as u64 * mtu;
                    let expect =
                        (u64::from(w.len) - offset.min(u64::from(w.len))).min(mtu) as usize;
                    if rx.payload.len() != expect {
                        return ignored(ctx);
                    }
                    if let Err(status) = ctx.scatter(pd, &w.wr.sg_list, offset, rx.payload) {
                        w.error = Some(status);
                    } else {
                        mark_got(w, psn);
                        w.resp_done = all_got(w);
                    }
                    let last = w.last_psn;
                    executed_through(qp, last);
                    news = true;
                    evidence = Some(psn);
                }
                SendOp::Flush { .. } | SendOp::AtomicWrite { .. }
                    if t.bth.opcode == Opcode::RC_RDMA_READ_RESPONSE_ONLY
                        && rx.payload.is_empty()
                        && psn == w.first_psn
                        && !w.resp_done =>
                {
                    w.resp_done = true;
                    executed_through(qp, psn);
                    news = true;
                    evidence = Some(psn);
                }
                // Another packet for a FLUSH or ATOMIC WRITE, or a READ response for a WQE
                // that is no READ.
                _ => return ignored(ctx),
            }
        }
        Opcode::RC_ATOMIC_ACKNOWLEDGE => {
            if !matches!(syndrome, Some(AethSyndrome::Ack { .. })) {
                return ignored(ctx);
            }
            let Some(orig) = t.atomic_ack_eth.map(|a| a.orig) else {
                return ignored(ctx);
            };
            let pd = qp.init.pd;
            let Some(w) = qp
                .sq
                .iter_mut()
                .find(|w| w.started && w.wr.op.is_atomic() && w.first_psn == psn)
            else {
                return ignored(ctx);
            };
            if w.resp_done {
                return ignored(ctx);
            }
            if let Err(status) = ctx.scatter(pd, &w.wr.sg_list, 0, &orig.to_ne_bytes()) {
                w.error = Some(status);
            }
            w.resp_done = true;
            executed_through(qp, psn);
            news = true;
            evidence = Some(psn);
        }
        _ => return ignored(ctx),
    }
    if let Some(x) = evidence {
        if repair_responses(qp, Repair::Evidence(x)) {
            lost += 1;
        }
    }
    if lost > 0 {
        schedule(qp, &mut ctx.ready);
    }
    let completed = complete_in_order(qp, ctx);
    if news || completed {
        progress(qp);
    }
    let unacked = qp.has_unacked();
    let timeout = qp.attr.timeout;
    if let Some(sel) = qp.selective.as_mut() {
        sel.measure(now);
        if !unacked {
            qp.probe_deadline = None;
        } else if news || completed {
            sel.req.probe_backoff = 0;
            qp.probe_deadline = Some(now + sel.probe_timeout(timeout));
        }
    }
    if qp.state.sends() {
        // Pushed forward only by progress: a stream of reports that changes nothing must
        // not keep a lost retransmission from timing out.
        if !qp.has_unacked() || qp.rnr_wait_until.is_some() {
            qp.retrans_deadline = None;
        } else if news || completed || qp.retrans_deadline.is_none() {
            qp.retrans_deadline = ack_timeout(qp.attr.timeout).map(|d| now + d);
        }
        if completed || news {
            schedule(qp, &mut ctx.ready);
        }
        check_sq_drained(qp, ctx);
    }
}

/// The retransmit timer fired on a selective QP: count it as a retry (RETRY_EXC_ERR when
/// none are left), send again the lowest packet not reported held (most likely the one lost)
/// and the highest sent (whose answer reports every hole at once, as TCP's tail-loss probe,
/// or is the report that was lost), and
/// ask again for every missing response. Against a responder that showed it keeps nothing
/// out of order, a timeout goes back N as rxe's does.
pub(crate) fn on_timeout<M>(qp: &mut Qp, ctx: &mut Ctx<M>, now: Nanos) {
    if qp.selective.as_ref().is_some_and(|s| s.req.peer_go_back_n) {
        start_retry(qp, ctx, true);
        qp.retrans_deadline = ack_timeout(qp.attr.timeout).map(|d| now + d);
        return;
    }
    if !use_retry(qp, ctx) {
        return;
    }
    for w in qp.sq.iter_mut() {
        w.repair_upto = w.first_psn;
    }
    if !queue_probes(qp, Repair::Timeout) {
        return;
    }
    repair_responses(qp, Repair::Timeout);
    schedule(qp, &mut ctx.ready);
    qp.retrans_deadline = ack_timeout(qp.attr.timeout).map(|d| now + d);
}

/// The probe timer fired: nothing progressed for about two round trips (a report, the
/// answer to the last packets, or a READ's last responses were lost, and nothing follows to
/// reveal it). As a timeout would, but without counting against retry_cnt and long before
/// the IBTA timeout: send again the lowest packet not reported held and the highest sent,
/// and ask again for missing atomic ACKs and for each READ's last missing response (TCP's
/// tail-loss probe, IRN's short timeout; see [`Repair::Probe`]).
pub(crate) fn on_probe<M>(qp: &mut Qp, ctx: &mut Ctx<M>, now: Nanos) {
    if !qp.state.sends() || !qp.has_unacked() || qp.rnr_wait_until.is_some() {
        return;
    }
    ctx.counters.sel_probes += 1;
    for w in qp.sq.iter_mut() {
        w.repair_upto = w.first_psn;
    }
    if !queue_probes(qp, Repair::Probe) {
        return;
    }
    repair_responses(qp, Repair::Probe);
    schedule(qp, &mut ctx.ready);
    if let Some(sel) = qp.selective.as_mut() {
        sel.req.probe_backoff += 1;
        qp.probe_deadline = Some(now + sel.probe_timeout(qp.attr.timeout));
    }
}

/// Queues the lowest packet not reported held and the highest sent (even if reported held:
/// its answer is the report that was lost, when that is all that is missing). False on a
/// QP that is not selective.
///
/// On a probe (`why` is [`Repair::Probe`]) a READ request whose READ has had no response
/// yet is not sent again whole: the responder may only be late (a long READ queued behind
/// others, a peer's device thread waiting for a CPU), and a second copy of a 1 MiB READ
/// doubles what it sends. The probe asks instead for one response packet, the READ's 16th
/// ([`MIN_WINDOW`]: inside any responder's window) or its last if shorter. A responder that
/// has the READ answers that packet after everything it owes; one that lost the READ holds
/// the packet and reports it, and the report shows the READ request lost as it would any
/// request sent before a packet held (`asked_again`): it goes again, whole, a round trip
/// after the probe.
fn queue_probes(qp: &mut Qp, why: Repair) -> bool {
    let mut candidates = {
        let Some(sel) = qp.selective.as_ref() else {
            return false;
        };
        let lowest = sel.req.sent.iter().find(|p| !p.sacked).map(|p| p.psn);
        let highest = sel.req.sent.back().map(|p| p.psn);
        [highest, lowest]
    };
    let mut tails = [None, None];
    if why == Repair::Probe {
        for (c, tail) in candidates.iter_mut().zip(tails.iter_mut()) {
            let Some(p) = *c else { continue };
            let unanswered_read = qp.sq.iter().find(|w| {
                w.started
                    && w.first_psn == p
                    && matches!(w.wr.op, SendOp::Read(_))
                    && w.got_count == 0
                    && w.npkts > 1
            });
            if let Some(w) = unanswered_read {
                *tail = Some(w.first_psn.add(w.npkts.min(MIN_WINDOW) - 1));
                *c = None;
            }
        }
    }
    let Some(sel) = qp.selective.as_mut() else {
        return false;
    };
    // An ask of the last probe not sent by now is stale; a timeout asks for whole runs.
    sel.req.one_packet.clear();
    for p in candidates.into_iter().flatten() {
        sel.req.retx.retain(|q| *q != p);
        sel.req.retx.push_front(p);
        if let Some(i) = sel.sent_index(p) {
            sel.req.sent[i].queued = true;
            sel.req.sent[i].probe = true;
        }
    }
    for t in tails.into_iter().flatten() {
        sel.queue_one_response(t);
    }
    true
}

// ----- responder ------------------------------------------------------------------------

/// An RC request on a selective QP (after the checks `on_request` makes for every RC
/// packet). Returns false when the packet's ICRC, verified while placing, was wrong.
pub(crate) fn on_request<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    rx: &RxPacket<'_>,
    info: &OpInfo,
    placing: Option<&super::packet_io::PendingIcrc<'_>>,
) -> bool {
    let psn = rx.t.bth.psn;
    let ack_req = rx.t.bth.ack_req;
    let d = psn.diff(qp.resp_psn);
    if d == 0 {
        if !super::responder::execute_in_order(qp, ctx, rx, info, placing) {
            return false;
        }
        drain(qp, ctx);
        finish(qp, ctx, false);
        return true;
    }
    if d < 0 {
        ctx.counters.duplicate_request += 1;
        qp.counters.duplicate_request += 1;
        super::responder::duplicate(qp, ctx, rx, info);
        finish(qp, ctx, ack_req);
        return true;
    }
    // Ahead of the hole: the dispatcher verified its ICRC (it defers only at ePSN).
    let mtu = qp.mtu();
    let epsn = qp.resp_psn;
    let Some(sel) = qp.selective.as_mut() else {
        return true;
    };
    ctx.counters.drops.psn_gap += sel.resp.align(epsn);
    let d = d as usize;
    let r = &mut sel.resp;
    if d >= sel.params.window(mtu) as usize {
        // Past the window: the requester does not send there; drop.
        ctx.counters.out_of_seq_request += 1;
        qp.counters.out_of_seq_request += 1;
        finish(qp, ctx, ack_req);
        return true;
    }
    if r.slots.get(d).is_some_and(Option::is_some) {
        ctx.counters.duplicate_request += 1;
        qp.counters.duplicate_request += 1;
        finish(qp, ctx, ack_req);
        return true;
    }
    if rx.payload.len() > mtu as usize {
        // Refused when executed anyway; never held (what is held stays below window x MTU).
        ctx.counters.drops.psn_gap += 1;
        return true;
    }
    let new_gap = r.slots.is_empty() || d > r.slots.len();
    if r.slots.len() <= d {
        r.slots.resize_with(d + 1, || None);
    }
    r.slots[d] = Some(Held {
        t: rx.t,
        payload: rx.payload.to_vec(),
        wire_len: rx.wire_len,
        v1: rx.v1,
    });
    r.held += 1;
    r.since_report += 1;
    ctx.counters.ooo_held += 1;
    let due = new_gap || ack_req || r.since_report >= SACK_EVERY;
    if new_gap {
        ctx.counters.out_of_seq_request += 1;
        qp.counters.out_of_seq_request += 1;
    }
    finish(qp, ctx, due);
    true
}

/// Executes, in order, the held packets the hole's filling made next.
fn drain<M: MemoryAccess>(qp: &mut Qp, ctx: &mut Ctx<M>) {
    loop {
        let epsn = qp.resp_psn;
        let receives = qp.state.receives();
        let Some(sel) = qp.selective.as_mut() else {
            return;
        };
        if !receives {
            sel.resp.clear();
            return;
        }
        ctx.counters.drops.psn_gap += sel.resp.align(epsn);
        let Some(h) = sel.resp.take_front() else {
            return;
        };
        let Some(info) = h.t.bth.opcode.info() else {
            continue;
        };
        let (src, dst) = match qp.attr.ah_attr {
            Some(av) => (av.dgid, ctx.config.gid(av.sgid_index).unwrap_or(av.dgid)),
            None => return,
        };
        let rx = RxPacket {
            t: h.t,
            payload: &h.payload,
            src,
            dst,
            ecn_ce: false,
            net_header: &[],
            wire_len: h.wire_len,
            v1: h.v1,
        };
        super::responder::execute_in_order(qp, ctx, &rx, info, None);
        if qp.resp_psn == epsn {
            // Refused (RNR) or failed: the requester sends it again; the rest stays held.
            if let Some(sel) = qp.selective.as_mut() {
                sel.resp.trim();
            }
            return;
        }
    }
}

/// Ends the handling of a request: reports if one is owed (or `force`): a SACK while
/// something is held, else a cumulative ACK.
fn finish<M>(qp: &mut Qp, ctx: &mut Ctx<M>, force: bool) {
    let (epsn, msn) = (qp.resp_psn, qp.msn);
    if !qp.state.receives() {
        return;
    }
    let Some(sel) = qp.selective.as_mut() else {
        return;
    };
    let r = &mut sel.resp;
    if !(force || r.ack_owed) {
        return;
    }
    r.ack_owed = false;
    r.since_report = 0;
    let report = if r.held > 0 {
        RespOut::Sack { epsn, msn }
    } else {
        RespOut::Ack {
            syndrome: AethSyndrome::ACK,
            psn: epsn.sub(1),
            msn,
        }
    };
    // A newer report replaces one still queued at the back (nothing was queued after it).
    match qp.resp_out.back_mut() {
        Some(
            slot @ (RespOut::Sack { .. }
            | RespOut::Ack {
                syndrome: AethSyndrome::Ack { .. },
                ..
            }),
        ) => *slot = report,
        _ => qp.resp_out.push_back(report),
    }
    schedule(qp, &mut ctx.ready);
}

/// The ACK an in-order SEND or WRITE asked for: owed, sent once at the end of the pass.
/// Returns false on a go-back-N QP (the caller queues it itself).
pub(crate) fn owe_ack(qp: &mut Qp) -> bool {
    match qp.selective.as_mut() {
        Some(sel) => {
            sel.resp.ack_owed = true;
            true
        }
        None => false,
    }
}

/// Whether the responder holds packets out of order (the predicted-WRITE path then stands
/// aside: the next in-order packet must also drain them).
pub(crate) fn holds_packets(qp: &Qp) -> bool {
    qp.selective.as_ref().is_some_and(|s| s.resp.held > 0)
}

/// The SACK bitmap for a report of `epsn`, built when the packet is.
pub(crate) fn sack_for(qp: &Qp, epsn: Psn) -> SackRepr {
    match qp.selective.as_ref() {
        Some(sel) => sel.resp.bitmap(epsn),
        None => SackRepr::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held() -> Option<Held> {
        Some(Held {
            t: TransportRepr::new(crate::wire::BthRepr {
                opcode: Opcode::RC_SEND_ONLY,
                solicited: false,
                mig_req: false,
                pkey: 0xffff,
                fecn: false,
                becn: false,
                dest_qpn: crate::types::Qpn::new(17),
                ack_req: false,
                psn: Psn::new(0),
            }),
            payload: Vec::new(),
            wire_len: 0,
            v1: false,
        })
    }

    #[test]
    fn windows_follow_the_bdp_within_bounds() {
        let p = SelectiveParams::default();
        assert_eq!(p.window(4096), 128);
        assert_eq!(p.window(1024), 512);
        assert_eq!(p.window(256), 2048);
        assert_eq!(SelectiveParams { bdp_bytes: 1 }.window(4096), MIN_WINDOW);
        assert_eq!(
            SelectiveParams {
                bdp_bytes: u32::MAX
            }
            .window(256),
            MAX_WINDOW
        );
    }

    #[test]
    fn the_bitmap_reports_executed_and_held_psns() {
        let mut r = RespState {
            base: Psn::new(10),
            ..Default::default()
        };
        // Holds 12 and 13 past the hole at 10; 11 missing.
        r.slots = [None, None, held(), held()].into_iter().collect();
        r.held = 2;
        let s = r.bitmap(Psn::new(10));
        assert_eq!(s.len(), 32);
        assert!(!s.get(0) && s.get(1) && s.get(2) && !s.get(3));
        // Reported for an older ePSN (7): 8 and 9 were executed since.
        let s = r.bitmap(Psn::new(7));
        assert!(s.get(0) && s.get(1) && !s.get(2) && !s.get(3) && s.get(4) && s.get(5));
        // Moving past 10 and 11 (as after a READ that consumed them) keeps 12, 13.
        assert_eq!(r.align(Psn::new(12)), 0);
        assert_eq!(r.slots.len(), 2);
        assert!(r.take_front().is_some());
        assert_eq!(r.align(Psn::new(20)), 1);
        assert!(r.slots.is_empty() && r.held == 0);
    }
}
