//! Completions and events back to the client: work completions from the engine's CQs into
//! the shared completion rings, completion-channel records for armed CQs, and async events to
//! the context's event socket.

use super::clients::ClientDev;
use proto::ring::wqe::{self, Cqe};
use proto::transport::{self as tp, AsyncEvent, WorkCompletion};
use proto::Qpn;

/// Writes the completion event of CQ `h` (whose arm was consumed) to its channel.
pub(super) fn send_cq_event(c: &mut ClientDev, h: u32, index: u32) {
    let Some(q) = c.cqs.get_mut(&h) else {
        return;
    };
    if let Some(sink) = q.channel.and_then(|ch| c.channels.get_mut(&ch)) {
        q.generation = q.generation.wrapping_add(1);
        let mut rec = [0u8; 8];
        rec[..4].copy_from_slice(&super::handles::tag_handle(index, h).to_ne_bytes());
        rec[4..].copy_from_slice(&q.generation.to_ne_bytes());
        // Never blocks; records of one CQ coalesce (events::EventSink).
        sink.send(&rec, 4);
    }
}

pub(super) fn cqe_of(wc: &WorkCompletion) -> Cqe {
    Cqe {
        wr_id: wc.wr_id,
        status: wc.status as u32,
        opcode: wc.opcode as u32,
        vendor_err: 0,
        byte_len: wc.byte_len,
        // `ibv_wc.imm_data` is `__be32`: the wire's ImmDt bytes as they arrived (the
        // engine holds them as a host value), as rxe copies them.
        imm_or_inv: if wc.wc_flags.contains(tp::WcFlags::WITH_INV) {
            wc.invalidated_rkey
        } else {
            // Back to the wire's byte order: `ibv_wc.imm_data` is __be32.
            wc.imm_data.to_be()
        },
        qp_num: wc.qp_num.value(),
        src_qp: wc.src_qp.value(),
        wc_flags: wc.wc_flags.0,
        pkey_index: 0,
        slid: 0,
        // UD receives: the RoCE packet type, as mlx5 reports it (WorkCompletion::sl).
        sl: wc.sl,
        dlid_path_bits: 0,
    }
}

/// Moves completions from the engine's CQs into the shared rings, fires completion events of
/// armed CQs, and forwards async events. Returns whether anything moved. `fenced`: CQs whose
/// completions wait in the engine, because a fast-path ring with older ones of the same
/// queue has not been read yet (`super::fast`).
pub(super) fn deliver_completions(c: &mut ClientDev, index: u32, fenced: &[u32]) -> bool {
    let tag = |h: u32| super::handles::tag_handle(index, h);
    let mut busy = false;
    let mut b = [0u8; wqe::CQE_SLOT_LEN];
    // Records held back since the client last made room go first.
    for sink in c.contexts.values_mut().chain(c.channels.values_mut()) {
        if sink.has_backlog() {
            busy |= sink.retry();
        }
    }
    let mut overrun: Vec<u32> = Vec::new();
    // Only the CQs that got completions since the last pass: an idle CQ costs nothing.
    let mut touched = std::mem::take(&mut c.touched_cqs);
    c.engine.take_touched_cqs(&mut touched);
    let mut held: Vec<u32> = Vec::new();
    for &h in &touched {
        // A CQ fed by a fast-path ring its consumer has not drained yet takes nothing
        // newer from the engine (it stays listed for the next pass).
        if fenced.contains(&h) {
            held.push(h);
            continue;
        }
        let Some(q) = c.cqs.get_mut(&h) else {
            continue;
        };
        let mut fire = false;
        // The ring has one slot more than the CQ's depth (`cqe`, what the client was
        // granted): the CQ holds `cqe` completions the client has not polled. A consumer
        // index that makes no sense (a client that wrote into its ring's header) reads as a
        // full ring.
        while q.ring.free().unwrap_or(0) > 1 {
            let Some(wc) = c.engine.poll_cq(h) else { break };
            busy = true;
            cqe_of(&wc).encode(&mut b);
            let _ = q.ring.push(&b);
            fire |= q
                .ring
                .take_arm(wc.solicited || wc.status != tp::WcStatus::Success);
        }
        // More completions than the CQ holds (or the engine's own queue overflowed, the same
        // event): CQ overrun. What did not fit is lost; the ring keeps what it holds.
        if !q.in_error && (c.engine.cq_len(h).unwrap_or(0) > 0 || c.engine.cq_in_error(h)) {
            let _ = c.engine.cq_overrun(h);
            q.in_error = true;
            overrun.push(h);
        }
        if fire {
            send_cq_event(c, h, index);
            if let Some(q) = c.cqs.get_mut(&h).filter(|q| q.offer_waits.replace(false)) {
                q.event_waits = q.event_waits.saturating_add(1);
                q.events_only |= q.event_waits >= 2;
                c.fired_cqs.push(h);
            }
        }
    }
    touched.clear();
    touched.extend(held);
    c.touched_cqs = touched;
    // An overrun CQ takes its QPs to ERR (IBTA §11.4.2.1: the QPs associated with it can no
    // longer report their work): each with IBV_EVENT_QP_FATAL, after the CQ's CQ_ERR.
    for h in overrun {
        busy = true;
        let qps: Vec<u32> = c
            .qps
            .iter()
            .filter(|(_, q)| q.send_cq == h || q.recv_cq == h)
            .map(|(&n, _)| n)
            .collect();
        tracing::debug!(
            cq = h,
            qps = qps.len(),
            "CQ overrun: the CQ and its QPs in error"
        );
        for qpn in qps {
            let _ = c.engine.fail_qp(Qpn::new(qpn), false);
        }
    }
    while let Some(ev) = c.engine.poll_event() {
        busy = true;
        // `enum ibv_event_type` values (verbs.h: SQ_DRAINED 5, SRQ_LIMIT_REACHED 15,
        // QP_LAST_WQE_REACHED 16).
        // A QP event names the QP by its number; CQ and SRQ events by the client's handle.
        let qp_event = |qpn: Qpn, ty: u32| {
            let ctx = c.qps.get(&qpn.value()).map(|q| q.ctx);
            (u64::from(qpn.value()), ty, ctx)
        };
        let (element, ty, ctx) = match ev {
            AsyncEvent::CqError { cq } => (u64::from(tag(cq)), 0u32, c.cqs.get(&cq).map(|q| q.ctx)),
            AsyncEvent::QpFatal { qpn } => {
                if let Some(state) = c.engine.selective_summary(qpn) {
                    tracing::debug!(qpn = qpn.value(), %state, "QP fatal error under selective retransmission");
                }
                qp_event(qpn, 1)
            }
            AsyncEvent::QpRequestError { qpn } => qp_event(qpn, 2),
            AsyncEvent::QpAccessError { qpn } => qp_event(qpn, 3),
            AsyncEvent::SqDrained { qpn } => qp_event(qpn, 5),
            AsyncEvent::LastWqeReached { qpn } => qp_event(qpn, 16),
            AsyncEvent::SrqLimitReached { srq } => {
                (u64::from(tag(srq)), 15, c.srqs.get(&srq).map(|s| s.ctx))
            }
            // Completion notifications travel through the rings' arm word instead.
            AsyncEvent::CqNotify { .. } => continue,
        };
        if let Some(sink) = ctx.and_then(|x| c.contexts.get_mut(&x)) {
            let mut rec = [0u8; 16];
            rec[..8].copy_from_slice(&element.to_ne_bytes());
            rec[8..12].copy_from_slice(&ty.to_ne_bytes());
            sink.send(&rec, 12);
        }
    }
    busy
}
