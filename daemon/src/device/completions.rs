//! Completions and events back to the client: work completions from the engine's CQs into
//! the shared completion rings, completion-channel records for armed CQs, and async events to
//! the context's event socket.

use super::clients::ClientDev;
use proto::ring::wqe::{self, Cqe};
use proto::transport::{self as tp, AsyncEvent, WorkCompletion};
use proto::Qpn;

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
        sl: 0,
        dlid_path_bits: 0,
    }
}

/// Moves completions from the engine's CQs into the shared rings, fires completion events of
/// armed CQs, and forwards async events. Returns whether anything moved.
pub(super) fn deliver_completions(c: &mut ClientDev, index: u32) -> bool {
    let tag = |h: u32| super::handles::tag_handle(index, h);
    let mut busy = false;
    let mut b = [0u8; wqe::CQE_SLOT_LEN];
    for (&h, q) in c.cqs.iter_mut() {
        let mut fire = false;
        while q.ring.free().unwrap_or(0) > 0 {
            let Some(wc) = c.engine.poll_cq(h) else { break };
            busy = true;
            cqe_of(&wc).encode(&mut b);
            let _ = q.ring.push(&b);
            fire |= q
                .ring
                .take_arm(wc.solicited || wc.status != tp::WcStatus::Success);
        }
        if fire {
            if let Some(fd) = q.channel.and_then(|ch| c.channels.get(&ch)) {
                q.generation = q.generation.wrapping_add(1);
                let mut rec = [0u8; 8];
                rec[..4].copy_from_slice(&tag(h).to_ne_bytes());
                rec[4..].copy_from_slice(&q.generation.to_ne_bytes());
                let _ = nix::unistd::write(fd, &rec);
            }
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
            AsyncEvent::QpFatal { qpn } => qp_event(qpn, 1),
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
        if let Some(fd) = ctx.and_then(|x| c.contexts.get(&x)) {
            let mut rec = [0u8; 16];
            rec[..8].copy_from_slice(&element.to_ne_bytes());
            rec[8..12].copy_from_slice(&ty.to_ne_bytes());
            let _ = nix::unistd::write(fd, &rec);
        }
    }
    busy
}
