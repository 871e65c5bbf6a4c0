//! The completer (rxe `rxe_comp.c`): matches responses to the oldest outstanding send WQE,
//! completes WQEs in order, turns NAKs into completion statuses, and starts go-back-N retries
//! on sequence NAKs, implied NAKs, RNR NAKs and the retransmit timer.

use super::engine::{check_sq_drained, schedule, Ctx, RxPacket};
use super::memory::MemoryAccess;
use super::qp::Qp;
use super::qp_attr::QpType;
use super::requester::{complete_head, fail_head};
use super::timers::{ack_timeout, rnr_delay, Nanos};
use super::verbs::{SendOp, WcStatus};
use crate::types::Psn;
use crate::wire::{AethSyndrome, NakCode, OpInfo, Opcode};

/// Starts a retry after a sequence NAK, an implied NAK or a timeout (rxe `COMPST_ERROR_RETRY`):
/// counts down retry_cnt; when exhausted the head WQE fails with RETRY_EXC_ERR and the QP goes
/// to ERR. Unlike rxe, 7 means seven retries, as IBTA C9-140 says, not "forever" (an rxe
/// quirk, facts §0.9/§10.1): with rxe's reading, a peer that dies leaves its partner
/// retransmitting for ever, and an application hangs instead of getting an error. Only
/// rnr_retry 7 is infinite (IBTA C9-141).
///
/// Like rxe (`comp.started_retry`), a retry already started and not yet rewarded by progress
/// is not started again by another NAK or stale response, only by the timer: otherwise every
/// duplicate ACK the go-back-N provokes would start yet another round.
pub(crate) fn start_retry<M>(qp: &mut Qp, ctx: &mut Ctx<M>, timeout: bool) {
    if qp.started_retry && !timeout {
        return;
    }
    if !use_retry(qp, ctx) {
        return;
    }
    qp.need_retry = true;
    qp.started_retry = true;
    schedule(qp, &mut ctx.ready);
}

/// Counts one retry against retry_cnt; when none is left, the head WQE fails with
/// RETRY_EXC_ERR and the QP goes to ERR (returns false).
pub(crate) fn use_retry<M>(qp: &mut Qp, ctx: &mut Ctx<M>) -> bool {
    if qp.retry_left == 0 {
        ctx.counters.retry_exceeded_err += 1;
        qp.counters.retry_exceeded_err += 1;
        fail_head(qp, ctx, WcStatus::RetryExcErr);
        return false;
    }
    qp.retry_left -= 1;
    ctx.counters.completer_retry_err += 1;
    qp.counters.completer_retry_err += 1;
    qp.retry_events += 1;
    true
}

/// The local ACK timer fired (rxe `rxe_retransmit_timer` + the completer's timeout path).
pub(crate) fn on_retransmit_timeout<M>(qp: &mut Qp, ctx: &mut Ctx<M>, now: Nanos) {
    if qp.ty != QpType::Rc || !qp.state.sends() || !qp.has_unacked() {
        return;
    }
    if qp.rnr_wait_until.is_some() {
        return;
    }
    if qp.selective.is_some() {
        super::selective::on_timeout(qp, ctx, now);
        return;
    }
    start_retry(qp, ctx, true);
    if qp.state.sends() {
        qp.retrans_deadline = ack_timeout(qp.attr.timeout).map(|d| now + d);
    }
}

pub(crate) fn progress(qp: &mut Qp) {
    qp.started_retry = false;
    qp.retry_left = qp.attr.retry_cnt;
    qp.rnr_retry_left = qp.attr.rnr_retry;
}

/// Handles one response packet (ACK, NAK, read response, atomic ACK).
pub(crate) fn on_response<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    now: Nanos,
    rx: &RxPacket<'_>,
) {
    if qp.ty != QpType::Rc || !qp.state.sends() {
        ctx.counters.drops.qp_state += 1;
        return;
    }
    if qp.selective.is_some() {
        super::selective::on_response(qp, ctx, now, rx);
        return;
    }
    // What a response can change: if none of it moved, the response is counted as ignored.
    let before = (
        qp.comp_psn,
        qp.sq.len(),
        qp.retry_events,
        qp.state,
        qp.rnr_wait_until,
        ctx.counters.rcvd_rnr_err,
        ctx.counters.rcvd_seq_err,
    );
    on_response_in_state(qp, ctx, now, rx);
    let after = (
        qp.comp_psn,
        qp.sq.len(),
        qp.retry_events,
        qp.state,
        qp.rnr_wait_until,
        ctx.counters.rcvd_rnr_err,
        ctx.counters.rcvd_seq_err,
    );
    if before == after {
        ctx.counters.drops.response_ignored += 1;
    }
}

fn on_response_in_state<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    now: Nanos,
    rx: &RxPacket<'_>,
) {
    let t = &rx.t;
    let psn = t.bth.psn;
    let op = t.bth.opcode;
    let Some(info) = op.info() else { return };
    let mut progressed = false;
    // Any response that moves comp_psn forward is progress, not only one that completes a
    // WQE: the packets of a long READ arrive one by one (facts §4.2, rxe resets its retry
    // counters on every ACK, read response or atomic ACK that advances).
    let comp_psn_before = qp.comp_psn;
    while let Some(w) = qp.sq.front() {
        if !w.started || w.wr.op.is_local() {
            break;
        }
        let read_atomic = w.wr.op.is_read_or_atomic();
        // check_psn (facts §4.7).
        if psn.is_after(w.last_psn) {
            if !read_atomic && w.sent_all {
                // A response beyond this SEND/WRITE acknowledges it implicitly (coalescing).
                qp.comp_psn = w.last_psn.next();
                complete_head(qp, ctx, WcStatus::Success);
                progressed = true;
                continue;
            }
            if read_atomic {
                // Implied NAK: the responder answered later requests, so a read response or
                // atomic ACK was lost (IBTA §9.7.5.1.2).
                start_retry(qp, ctx, false);
            }
            break;
        }
        if psn.is_before(qp.comp_psn) {
            // A stale duplicate.
            break;
        }
        if psn.is_after(qp.comp_psn) && read_atomic {
            // A later read response overtook an earlier one: wait for it (or the timer).
            break;
        }
        check_ack(qp, ctx, now, rx, info, op, psn, &mut progressed);
        break;
    }
    if progressed || qp.comp_psn.is_after(comp_psn_before) {
        progress(qp);
    }
    if qp.state.sends() {
        // rxe pushes the timer forward while anything is unacknowledged.
        qp.retrans_deadline = if qp.has_unacked() && qp.rnr_wait_until.is_none() {
            ack_timeout(qp.attr.timeout).map(|d| now + d)
        } else {
            None
        };
        if progressed {
            schedule(qp, &mut ctx.ready);
        }
        check_sq_drained(qp, ctx);
    }
}

#[allow(clippy::too_many_arguments)]
fn check_ack<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    now: Nanos,
    rx: &RxPacket<'_>,
    info: &OpInfo,
    op: Opcode,
    psn: Psn,
    progressed: &mut bool,
) {
    let Some(w) = qp.sq.front() else { return };
    let t = &rx.t;
    let syndrome = t.aeth.map(|a| a.syndrome);
    match op {
        Opcode::RC_RDMA_READ_RESPONSE_FIRST
        | Opcode::RC_RDMA_READ_RESPONSE_MIDDLE
        | Opcode::RC_RDMA_READ_RESPONSE_LAST
        | Opcode::RC_RDMA_READ_RESPONSE_ONLY => {
            if let Some(s) = syndrome {
                if !matches!(s, AethSyndrome::Ack { .. }) {
                    return;
                }
            }
            match w.wr.op {
                SendOp::Read(_) => {}
                SendOp::Flush { .. } | SendOp::AtomicWrite { .. } => {
                    // Their answer is an empty READ_RESPONSE_ONLY with the request PSN.
                    if op == Opcode::RC_RDMA_READ_RESPONSE_ONLY
                        && rx.payload.is_empty()
                        && psn == w.first_psn
                    {
                        qp.comp_psn = psn.next();
                        complete_head(qp, ctx, WcStatus::Success);
                        *progressed = true;
                    }
                    return;
                }
                _ => {
                    // A read response for a WQE that is not a read (rxe: fatal).
                    fail_head(qp, ctx, WcStatus::BadRespErr);
                    return;
                }
            }
            if psn.is_before(w.first_psn) {
                return;
            }
            let starts = info.has(OpInfo::START);
            let ends = info.has(OpInfo::END);
            // Sequence: FIRST/ONLY only where the current read request started, LAST/ONLY only
            // at the last PSN.
            if starts != (psn == w.read_req_psn) || ends != (psn == w.last_psn) {
                return;
            }
            let mtu = u64::from(qp.mtu());
            let offset = psn.diff(w.first_psn) as u64 * mtu;
            let expect = (u64::from(w.len) - offset.min(u64::from(w.len))).min(mtu) as usize;
            if rx.payload.len() != expect {
                return;
            }
            if let Err(status) = ctx.scatter(qp.init.pd, &w.wr.sg_list, offset, rx.payload) {
                fail_head(qp, ctx, status);
                return;
            }
            qp.comp_psn = psn.next();
            *progressed = true;
            if ends {
                complete_head(qp, ctx, WcStatus::Success);
            }
        }
        Opcode::RC_ATOMIC_ACKNOWLEDGE => {
            if !w.wr.op.is_atomic() || psn != w.first_psn {
                return;
            }
            if !matches!(syndrome, Some(AethSyndrome::Ack { .. })) {
                return;
            }
            let Some(orig) = t.atomic_ack_eth.map(|a| a.orig) else {
                return;
            };
            let sges = w.wr.sg_list.clone();
            if let Err(status) = ctx.scatter(qp.init.pd, &sges, 0, &orig.to_ne_bytes()) {
                fail_head(qp, ctx, status);
                return;
            }
            qp.comp_psn = psn.next();
            complete_head(qp, ctx, WcStatus::Success);
            *progressed = true;
        }
        // A SACK reaching a go-back-N QP (its peer forced selective on) is what its AETH
        // says: a PSN sequence NAK.
        Opcode::RC_ACKNOWLEDGE | Opcode::SOFTROCE_SACK => match syndrome {
            Some(AethSyndrome::Ack { .. }) => {
                if w.wr.op.is_read_or_atomic() {
                    return;
                }
                qp.comp_psn = psn.next();
                *progressed = true;
                if psn == w.last_psn && w.sent_all {
                    complete_head(qp, ctx, WcStatus::Success);
                }
            }
            Some(AethSyndrome::RnrNak { timer }) => {
                ctx.counters.rcvd_rnr_err += 1;
                qp.counters.rcvd_rnr_err += 1;
                if qp.rnr_retry_left == 0 {
                    ctx.counters.retry_rnr_exceeded_err += 1;
                    qp.counters.retry_rnr_exceeded_err += 1;
                    fail_head(qp, ctx, WcStatus::RnrRetryExcErr);
                    return;
                }
                // rnr_retry 7 means retry for ever (IBTA §9.7.5.2.8).
                if qp.attr.rnr_retry != 7 {
                    qp.rnr_retry_left -= 1;
                }
                // Everything before the refused request was accepted.
                qp.comp_psn = psn;
                qp.retry_events += 1;
                qp.need_retry = true;
                qp.rnr_wait_until = Some(now + rnr_delay(timer).max(1));
                qp.retrans_deadline = None;
            }
            Some(AethSyndrome::Nak(NakCode::PsnSequenceError)) => {
                if psn.is_after(qp.comp_psn) {
                    ctx.counters.rcvd_seq_err += 1;
                    qp.counters.rcvd_seq_err += 1;
                    qp.comp_psn = psn;
                }
                start_retry(qp, ctx, false);
            }
            Some(AethSyndrome::Nak(code)) => {
                let status = nak_status(qp, ctx, code);
                fail_head(qp, ctx, status);
            }
            _ => {}
        },
        _ => {}
    }
}

/// The completion status a NAK other than RNR and PSN sequence error gives the request it
/// names (IBTA §9.7.5.2.3: invalid request, remote access error, remote operational error),
/// counted under mlx5's names.
pub(crate) fn nak_status<M>(qp: &mut Qp, ctx: &mut Ctx<M>, code: NakCode) -> WcStatus {
    match code {
        NakCode::InvalidRequest => {
            ctx.counters.req_remote_invalid_request += 1;
            qp.counters.req_remote_invalid_request += 1;
            WcStatus::RemInvReqErr
        }
        NakCode::RemoteAccessError => {
            ctx.counters.req_remote_access_errors += 1;
            qp.counters.req_remote_access_errors += 1;
            WcStatus::RemAccessErr
        }
        _ => WcStatus::RemOpErr,
    }
}
