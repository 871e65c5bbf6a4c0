//! The responder (rxe `rxe_resp.c`): checks each request's PSN, opcode sequence, access,
//! resources, length and R_Key, executes it, and queues the answer: ACKs (only for AckReq),
//! NAKs, read responses, atomic ACKs. Duplicates are answered from the replay resources,
//! never executed twice (IBTA §9.7.5.1).

use super::engine::{complete, flush_qp, route_for, schedule, Ctx, ForcedNak, RxPacket, Transmit};
use super::memory::MemoryAccess;
use super::packet_io::{Payload, PendingIcrc, WriteMiddle};
use super::qp::{npkts, InMessage, Qp, Resource, ResourceKind, RespOut};
use super::qp_attr::QpType;
use super::timers::Nanos;
use super::verbs::*;
use crate::types::{Psn, Qpn};
use crate::wire::bth::DEFAULT_PKEY;
use crate::wire::{
    AethRepr, AethSyndrome, AtomicAckEthRepr, BthRepr, NakCode, OpInfo, Opcode, TransportRepr,
};

/// Why a request is not executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fail {
    /// No receive WQE: RNR NAK on RC, drop on UC.
    Rnr,
    /// A class B/C/D error: NAK with this code on RC (the receive WQE in use, if any,
    /// completes with the status), drop on UC.
    Nak(NakCode, WcStatus),
    /// SEND_WITH_INV naming a key that cannot be invalidated (rxe's
    /// RESPST_ERR_INVALIDATE_RKEY, class J): unlike the other class J errors, rxe still ACKs
    /// the request positively (the requester's WQE succeeds), completes the receive with
    /// REM_INV_REQ_ERR and moves the QP to ERR. Seen live against kernel rxe (docs/interop.md).
    InvalidateRkey,
    /// The packet's ICRC, verified while its payload was placed, is wrong: drop it as if it
    /// had never arrived (the placed bytes are rewritten by the retransmission; see
    /// `packet_io::PendingIcrc`).
    Corrupt,
}

/// Queues an answer. Every AckReq packet gets its own ACK, as in rxe (no merging of queued
/// ACKs), so the wire looks the same.
fn queue(qp: &mut Qp, ctx_ready: &mut std::collections::VecDeque<Qpn>, out: RespOut) {
    qp.resp_out.push_back(out);
    schedule(qp, ctx_ready);
}

fn ack(qp: &mut Qp, ctx: &mut std::collections::VecDeque<Qpn>, syndrome: AethSyndrome, psn: Psn) {
    // Selective retransmission coalesces the positive ACKs of a pass into one report.
    if syndrome == AethSyndrome::ACK && super::selective::owe_ack(qp) {
        return;
    }
    ack_now(qp, ctx, syndrome, psn);
}

fn ack_now(
    qp: &mut Qp,
    ctx: &mut std::collections::VecDeque<Qpn>,
    syndrome: AethSyndrome,
    psn: Psn,
) {
    let msn = qp.msn;
    queue(qp, ctx, RespOut::Ack { syndrome, psn, msn });
}

fn has_recv<M>(qp: &Qp, ctx: &Ctx<M>) -> bool {
    match qp.init.srq {
        Some(s) => ctx.srqs.get(&s).is_some_and(|s| !s.queue.is_empty()),
        None => !qp.rq.is_empty(),
    }
}

/// Takes the next receive WQE, from the SRQ if the QP has one (raising the SRQ limit event
/// when it falls below the armed limit, IBTA §10.2.9.4).
fn take_recv<M>(qp: &mut Qp, ctx: &mut Ctx<M>) -> Option<(RecvWr, bool)> {
    match qp.init.srq {
        Some(id) => {
            let s = ctx.srqs.get_mut(&id)?;
            let wr = s.queue.pop_front()?;
            if s.limit > 0 && (s.queue.len() as u32) < s.limit {
                s.limit = 0;
                ctx.events
                    .push_back(AsyncEvent::SrqLimitReached { srq: id });
            }
            Some((wr, true))
        }
        None => qp.rq.pop_front().map(|w| (w, false)),
    }
}

/// Puts back a receive WQE a UC message abandoned half way (it was never completed).
fn return_recv<M>(qp: &mut Qp, ctx: &mut Ctx<M>, wr: RecvWr, from_srq: bool) {
    match (from_srq, qp.init.srq) {
        (true, Some(id)) => {
            if let Some(s) = ctx.srqs.get_mut(&id) {
                s.queue.push_front(wr);
            }
        }
        _ => qp.rq.push_front(wr),
    }
}

fn abandon_message<M>(qp: &mut Qp, ctx: &mut Ctx<M>) {
    if let Some(m) = qp.in_msg.take() {
        if let Some(r) = m.recv {
            return_recv(qp, ctx, r, m.recv_from_srq);
        }
    }
}

fn recv_complete<M>(qp: &mut Qp, ctx: &mut Ctx<M>, mut wc: WorkCompletion, solicited: bool) {
    if wc.status == WcStatus::Success {
        ctx.counters.rdma_recvs += 1;
        qp.counters.rdma_recvs += 1;
        // rxe's do_complete() starts every successful user-CQ receive completion with
        // IB_WC_GRH, on RC and UC too (RoCE always carries the GRH's information); seen live
        // against kernel rxe, where RC receives report wc_flags 0x1 and 0x3 (docs/interop.md).
        wc.wc_flags.0 |= WcFlags::GRH.0;
    }
    if !complete(ctx, qp.init.recv_cq, wc, solicited) {
        // CQ overflow: the QP goes to ERR (rxe class G).
        flush_qp(qp, ctx, false);
        ctx.events.push_back(AsyncEvent::QpFatal { qpn: qp.qpn });
    }
}

/// An RC or UC request. With `placing`, the packet's ICRC is not verified yet: it is
/// verified while the payload is placed, or before anything else is done with the packet.
/// Returns false when it was wrong (then the packet did nothing).
pub(crate) fn on_request<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    _now: Nanos,
    rx: &RxPacket<'_>,
    placing: Option<&PendingIcrc<'_>>,
) -> bool {
    if !qp.state.receives() {
        let genuine = placing.is_none_or(|p| p.verify());
        if genuine {
            ctx.counters.drops.qp_state += 1;
        }
        return genuine;
    }
    let psn = rx.t.bth.psn;
    let Some(info) = rx.t.bth.opcode.info() else {
        return placing.is_none_or(|p| p.verify());
    };
    if qp.ty == QpType::Uc {
        if psn != qp.resp_psn {
            // UC: a lost packet drops the rest of its message; resynchronise on the next
            // packet that starts one (IBTA §9.7.6.1.1, facts §2.2).
            abandon_message(qp, ctx);
            if !info.has(OpInfo::START) {
                ctx.counters.drops.uc_abandoned += 1;
                qp.resp_psn = psn.next();
                return true;
            }
        }
        qp.resp_psn = psn.next();
        if execute(qp, ctx, rx, info, None).is_err() {
            ctx.counters.drops.uc_abandoned += 1;
            abandon_message(qp, ctx);
        }
        return true;
    }

    if qp.selective.is_some() {
        return super::selective::on_request(qp, ctx, rx, info, placing);
    }
    let d = psn.diff(qp.resp_psn);
    if d > 0 {
        // A gap: NAK once with the expected PSN, then drop silently until it arrives.
        if qp.sent_psn_nak {
            ctx.counters.drops.psn_gap += 1;
        } else {
            qp.sent_psn_nak = true;
            ctx.counters.out_of_seq_request += 1;
            qp.counters.out_of_seq_request += 1;
            let epsn = qp.resp_psn;
            ack(
                qp,
                &mut ctx.ready,
                AethSyndrome::Nak(NakCode::PsnSequenceError),
                epsn,
            );
        }
        return true;
    }
    if d < 0 {
        ctx.counters.duplicate_request += 1;
        qp.counters.duplicate_request += 1;
        duplicate(qp, ctx, rx, info);
        return true;
    }
    execute_in_order(qp, ctx, rx, info, placing)
}

/// Executes the request at the expected PSN and answers as its outcome requires (NAKs,
/// RNR NAK, QP to ERR). Returns false when its ICRC, verified while placing, was wrong.
pub(crate) fn execute_in_order<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    rx: &RxPacket<'_>,
    info: &OpInfo,
    placing: Option<&PendingIcrc<'_>>,
) -> bool {
    let psn = rx.t.bth.psn;
    let forced = ctx.forced_nak.filter(|f| f.applies_to(info));
    let result = match forced {
        // Fault injection: answered as the real condition would be, nothing executed.
        Some(f) => {
            ctx.forced_nak = None;
            Err(match f {
                ForcedNak::Rnr => Fail::Rnr,
                ForcedNak::AccessError => {
                    Fail::Nak(NakCode::RemoteAccessError, WcStatus::RemAccessErr)
                }
            })
        }
        None => execute(qp, ctx, rx, info, placing),
    };
    // A request refused before its payload was placed did nothing yet: its ICRC decides
    // whether it is answered at all.
    if matches!(result, Err(Fail::Corrupt))
        || (result.is_err() && placing.is_some_and(|p| !p.verify()))
    {
        return false;
    }
    qp.sent_psn_nak = false;
    match result {
        Ok(()) | Err(Fail::Corrupt) => {}
        Err(Fail::Rnr) => {
            // Nothing consumed: the requester retries this PSN after the RNR timer.
            ctx.counters.send_rnr_err += 1;
            qp.counters.send_rnr_err += 1;
            let timer = qp.attr.min_rnr_timer;
            ack(qp, &mut ctx.ready, AethSyndrome::RnrNak { timer }, psn);
        }
        Err(Fail::InvalidateRkey) => {
            // rxe: the ACK is the ordinary one (its AETH syndrome was never set to a NAK), the
            // receive WQE completes with REM_INV_REQ_ERR, then rxe_qp_error() moves the QP to
            // ERR without an affiliated event.
            if rx.t.bth.ack_req {
                ack(qp, &mut ctx.ready, AethSyndrome::ACK, psn);
            }
            if let Some(m) = qp.in_msg.take() {
                if let Some(r) = m.recv {
                    let wc = WorkCompletion::new(
                        r.wr_id,
                        WcStatus::RemInvReqErr,
                        WcOpcode::Recv,
                        qp.qpn,
                    );
                    recv_complete(qp, ctx, wc, false);
                }
            }
            flush_qp(qp, ctx, false);
        }
        Err(Fail::Nak(code, status)) => {
            let d = &mut ctx.counters.drops;
            *match code {
                NakCode::RemoteAccessError => &mut d.nak_remote_access,
                NakCode::RemoteOperationalError => &mut d.nak_remote_operational,
                _ => &mut d.nak_invalid_request,
            } += 1;
            // Class C/J errors: NAK, report on the receive WQE in use, QP to ERR.
            if code == NakCode::RemoteAccessError {
                ctx.counters.resp_remote_access_errors += 1;
                qp.counters.resp_remote_access_errors += 1;
            }
            ack(qp, &mut ctx.ready, AethSyndrome::Nak(code), psn);
            if let Some(m) = qp.in_msg.take() {
                if let Some(r) = m.recv {
                    let wc = WorkCompletion::new(r.wr_id, status, WcOpcode::Recv, qp.qpn);
                    recv_complete(qp, ctx, wc, false);
                }
            }
            flush_qp(qp, ctx, false);
            let ev = if code == NakCode::RemoteAccessError {
                AsyncEvent::QpAccessError { qpn: qp.qpn }
            } else {
                AsyncEvent::QpRequestError { qpn: qp.qpn }
            };
            ctx.events.push_back(ev);
        }
    }
    true
}

/// The predicted case of [`on_request`]: `w` is the next packet of the RDMA WRITE this RC
/// QP is receiving, a full-MTU MIDDLE from the QP's path with no ECN mark, into memory that
/// lends itself. Then the checks `dispatch`, `on_request` and `execute` would make all pass
/// and this does what they would do, placing the payload by the pass that verifies the
/// ICRC. Returns false, having done nothing, when `w` is anything else: then the general
/// path handles it.
pub(crate) fn on_predicted_write_middle<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    w: &WriteMiddle<'_>,
) -> bool {
    let plen = w.payload_len;
    let predicted = qp.ty == QpType::Rc
        && qp.state.receives()
        && !super::selective::holds_packets(qp)
        && !w.ecn_ce
        && w.psn == qp.resp_psn
        && plen == qp.mtu() as usize
        && qp.attr.qp_access_flags.contains(Access::REMOTE_WRITE);
    if !predicted {
        return false;
    }
    // rxe checks that RC packets come from and go to the QP's path.
    let Some(av) = qp.attr.ah_attr else {
        return false;
    };
    let local = ctx.config.gid(av.sgid_index);
    if av.dgid != std::net::IpAddr::V4(w.src) || local != Some(std::net::IpAddr::V4(w.dst)) {
        return false;
    }
    let Some(m) = qp
        .in_msg
        .as_mut()
        .filter(|m| !m.is_send && m.resid as usize >= plen)
    else {
        return false;
    };
    let at = m.va.wrapping_add(u64::from(m.offset));
    let Some(dst) = ctx.mem.lend_mut(m.space, at, plen) else {
        return false;
    };
    if !w.icrc.copy_out(dst) {
        // Placed where the retransmission of this PSN will write (see `PendingIcrc`).
        ctx.counters.icrc_errors += 1;
        return true;
    }
    m.offset += plen as u32;
    m.resid -= plen as u32;
    ctx.counters.rcvd_pkts += 1;
    ctx.counters.rcvd_bytes += w.wire_len as u64;
    qp.counters.rcvd_pkts += 1;
    qp.counters.rcvd_bytes += w.wire_len as u64;
    qp.sent_psn_nak = false;
    qp.resp_psn = w.psn.next();
    if w.ack_req {
        // Nothing is held out of order (checked above): the ACK is the in-order one.
        ack_now(qp, &mut ctx.ready, AethSyndrome::ACK, w.psn);
    }
    true
}

/// A request with a PSN before the expected one (IBTA §9.7.5.1.5, facts §4.5).
pub(crate) fn duplicate<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    rx: &RxPacket<'_>,
    info: &OpInfo,
) {
    let psn = rx.t.bth.psn;
    if info.has(OpInfo::SEND) || info.has(OpInfo::WRITE) {
        // Not executed again: ACK the last PSN executed (C9-105).
        let last = qp.resp_psn.sub(1);
        ack(qp, &mut ctx.ready, AethSyndrome::ACK, last);
        return;
    }
    let Some(res) = qp.find_resource(psn) else {
        ctx.counters.drops.duplicate_ignored += 1;
        return; // class D: silently dropped
    };
    let msn = qp.msn;
    match (res.kind, rx.t.reth, rx.t.bth.opcode) {
        (ResourceKind::Read { va, rkey, len }, Some(reth), Opcode::RC_RDMA_READ_REQUEST) => {
            let inside = reth.rkey == rkey
                && reth.va >= va
                && reth
                    .va
                    .checked_add(u64::from(reth.len))
                    .is_some_and(|e| e <= va + u64::from(len));
            if !inside {
                ctx.counters.drops.duplicate_ignored += 1;
                return; // rxe drops a duplicate READ with other parameters
            }
            queue(
                qp,
                &mut ctx.ready,
                RespOut::Read {
                    psn,
                    va: reth.va,
                    rkey,
                    remaining: reth.len,
                    first: true,
                    msn,
                },
            );
        }
        (ResourceKind::Atomic { orig }, _, _) if res.first_psn == psn => {
            queue(qp, &mut ctx.ready, RespOut::AtomicAck { psn, orig, msn });
        }
        (ResourceKind::EmptyRead, _, _) if res.first_psn == psn => {
            queue(qp, &mut ctx.ready, RespOut::EmptyRead { psn, msn });
        }
        _ => {}
    }
}

fn execute<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    rx: &RxPacket<'_>,
    info: &OpInfo,
    placing: Option<&PendingIcrc<'_>>,
) -> Result<(), Fail> {
    let t = &rx.t;
    let psn = t.bth.psn;
    let inv_req = Fail::Nak(NakCode::InvalidRequest, WcStatus::RemInvReqErr);
    let access_err = Fail::Nak(NakCode::RemoteAccessError, WcStatus::RemAccessErr);
    let starts = info.has(OpInfo::START);
    let ends = info.has(OpInfo::END);
    let is_send = info.has(OpInfo::SEND);
    let is_write = info.has(OpInfo::WRITE);

    // Opcode sequence (rxe check_op_seq): inside a message only its MIDDLE/LAST may come.
    match &qp.in_msg {
        Some(m) => {
            if starts || !(is_send || is_write) || m.is_send != is_send {
                return Err(inv_req);
            }
        }
        None => {
            if !starts {
                return Err(inv_req);
            }
        }
    }
    // Operation allowed by the QP's access flags (rxe check_op_valid).
    let acc = qp.attr.qp_access_flags;
    let allowed = if is_write || info.has(OpInfo::ATOMIC_WRITE) {
        acc.contains(Access::REMOTE_WRITE)
    } else if info.has(OpInfo::READ) {
        acc.contains(Access::REMOTE_READ)
    } else if info.has(OpInfo::ATOMIC) {
        acc.contains(Access::REMOTE_ATOMIC)
    } else {
        true
    };
    if !allowed {
        return Err(inv_req);
    }
    // Resources (rxe check_resource).
    let needs_recv = info.has(OpInfo::RWR) || (is_send && starts);
    let have_recv = qp.in_msg.as_ref().is_some_and(|m| m.recv.is_some());
    if needs_recv && !have_recv && !has_recv(qp, ctx) {
        return Err(Fail::Rnr);
    }
    let rd_atomic = info.has(OpInfo::READ)
        || info.has(OpInfo::ATOMIC)
        || info.has(OpInfo::ATOMIC_WRITE)
        || info.has(OpInfo::FLUSH);
    if rd_atomic && qp.attr.max_dest_rd_atomic == 0 {
        return Err(inv_req);
    }
    // Lengths (rxe check_length): FIRST/MIDDLE exactly one MTU, nothing above an MTU.
    let mtu = qp.mtu() as usize;
    let plen = rx.payload.len();
    if plen > mtu || (!ends && plen != mtu && (is_send || is_write)) {
        return Err(inv_req);
    }
    let pd = qp.init.pd;
    let qpn = qp.qpn;

    if is_send {
        if starts {
            let (recv, from_srq) = take_recv(qp, ctx).ok_or(Fail::Rnr)?;
            qp.in_msg = Some(InMessage {
                is_send: true,
                recv: Some(recv),
                recv_from_srq: from_srq,
                offset: 0,
                va: 0,
                space: 0,
                resid: 0,
            });
        }
        let m = qp.in_msg.as_mut().ok_or(inv_req)?;
        let recv = m.recv.as_ref().ok_or(inv_req)?;
        // A message above 2^31 bytes (the write limit above, rxe's max_msg_sz) fails as one
        // too long for the receive buffer; it also keeps the u32 offset from overflowing
        // on a peer's endless MIDDLE packets.
        let offset = m.offset;
        if u64::from(offset) + plen as u64 > 0x8000_0000 {
            return Err(Fail::Nak(NakCode::InvalidRequest, WcStatus::LocLenErr));
        }
        // `recv` borrows the QP, `scatter` the context: no copy of the SGE list per packet.
        match ctx.scatter(pd, &recv.sg_list, u64::from(offset), rx.payload) {
            Ok(()) => {}
            Err(WcStatus::LocLenErr) => {
                return Err(Fail::Nak(NakCode::InvalidRequest, WcStatus::LocLenErr))
            }
            Err(s) => return Err(Fail::Nak(NakCode::RemoteOperationalError, s)),
        }
        let m = qp.in_msg.as_mut().ok_or(inv_req)?;
        m.offset += plen as u32;
        if ends {
            let m = qp.in_msg.take().ok_or(inv_req)?;
            let recv = m.recv.ok_or(inv_req)?;
            let mut wc = WorkCompletion::new(recv.wr_id, WcStatus::Success, WcOpcode::Recv, qp.qpn);
            wc.byte_len = m.offset;
            wc.src_qp = qp.attr.dest_qp_num;
            wc.solicited = t.bth.solicited;
            if let Some(imm) = t.imm {
                wc.imm_data = imm;
                wc.wc_flags.0 |= WcFlags::WITH_IMM.0;
            }
            if let Some(key) = t.ieth {
                if !ctx.invalidate_remote(pd, qpn, key) {
                    // Class J: the bad R_Key fails the receive; the QP goes to ERR.
                    qp.in_msg = Some(InMessage {
                        recv: Some(recv),
                        ..m
                    });
                    return Err(Fail::InvalidateRkey);
                }
                wc.invalidated_rkey = key.0;
                wc.wc_flags.0 |= WcFlags::WITH_INV.0;
            }
            qp.msn = (qp.msn + 1) & 0xff_ffff;
            recv_complete(qp, ctx, wc, t.bth.solicited);
        }
    } else if is_write {
        if starts {
            let reth = t.reth.ok_or(inv_req)?;
            if reth.len > 0x8000_0000 {
                return Err(inv_req);
            }
            // A zero-length WRITE checks nothing (IBTA C9-88).
            let space = if reth.len > 0 {
                let access = ctx.remote_space(
                    pd,
                    qpn,
                    reth.rkey,
                    reth.va,
                    u64::from(reth.len),
                    Access::REMOTE_WRITE,
                );
                access.ok_or(access_err)?
            } else {
                0
            };
            qp.in_msg = Some(InMessage {
                is_send: false,
                recv: None,
                recv_from_srq: false,
                offset: 0,
                va: reth.va,
                space,
                resid: reth.len,
            });
        }
        let m = qp.in_msg.as_mut().ok_or(inv_req)?;
        if plen as u32 > m.resid || (ends && plen as u32 != m.resid) {
            return Err(inv_req);
        }
        let at = m.va.wrapping_add(u64::from(m.offset));
        if plen > 0 {
            let lent = match placing {
                Some(_) => ctx.mem.lend_mut(m.space, at, plen),
                None => None,
            };
            match (placing, lent) {
                // Copied out by the pass that verifies the ICRC.
                (Some(p), Some(dst)) => {
                    if !p.copy_out(dst) {
                        return Err(Fail::Corrupt);
                    }
                }
                (placing, _) => {
                    if placing.is_some_and(|p| !p.verify()) {
                        return Err(Fail::Corrupt);
                    }
                    ctx.mem.write(m.space, at, rx.payload).map_err(|_| {
                        Fail::Nak(NakCode::RemoteOperationalError, WcStatus::LocProtErr)
                    })?;
                }
            }
        } else if placing.is_some_and(|p| !p.verify()) {
            // Nothing to place (a LAST after a FIRST that carried it all): still verified
            // before the message completes.
            return Err(Fail::Corrupt);
        }
        let m = qp.in_msg.as_mut().ok_or(inv_req)?;
        m.offset += plen as u32;
        m.resid -= plen as u32;
        if ends {
            let m = qp.in_msg.take().ok_or(inv_req)?;
            qp.msn = (qp.msn + 1) & 0xff_ffff;
            if info.has(OpInfo::RWR) {
                let (recv, _) = take_recv(qp, ctx).ok_or(Fail::Rnr)?;
                let mut wc = WorkCompletion::new(
                    recv.wr_id,
                    WcStatus::Success,
                    WcOpcode::RecvRdmaWithImm,
                    qp.qpn,
                );
                wc.byte_len = m.offset;
                wc.src_qp = qp.attr.dest_qp_num;
                wc.imm_data = t.imm.unwrap_or(0);
                wc.wc_flags = WcFlags::WITH_IMM;
                wc.solicited = t.bth.solicited;
                recv_complete(qp, ctx, wc, t.bth.solicited);
            }
        }
    } else if info.has(OpInfo::READ) {
        let reth = t.reth.ok_or(inv_req)?;
        if reth.len > 0x8000_0000 {
            return Err(inv_req);
        }
        if reth.len > 0
            && !ctx.check_remote(
                pd,
                qpn,
                reth.rkey,
                reth.va,
                u64::from(reth.len),
                Access::REMOTE_READ,
            )
        {
            return Err(access_err);
        }
        // A read consumes one PSN per response packet (facts §4.1).
        let n = npkts(reth.len, qp.attr.path_mtu);
        qp.push_resource(Resource {
            kind: ResourceKind::Read {
                va: reth.va,
                rkey: reth.rkey,
                len: reth.len,
            },
            first_psn: psn,
            last_psn: psn.add(n - 1),
        });
        qp.msn = (qp.msn + 1) & 0xff_ffff;
        qp.resp_psn = psn.add(n);
        let msn = qp.msn;
        queue(
            qp,
            &mut ctx.ready,
            RespOut::Read {
                psn,
                va: reth.va,
                rkey: reth.rkey,
                remaining: reth.len,
                first: true,
                msn,
            },
        );
        return Ok(());
    } else if info.has(OpInfo::ATOMIC) {
        let a = t.atomic_eth.ok_or(inv_req)?;
        if a.va % 8 != 0 {
            return Err(inv_req);
        }
        let space = ctx
            .remote_space(pd, qpn, a.rkey, a.va, 8, Access::REMOTE_ATOMIC)
            .ok_or(access_err)?;
        let r = if t.bth.opcode == Opcode::RC_COMPARE_SWAP {
            ctx.mem.compare_swap(space, a.va, a.compare, a.swap_add)
        } else {
            ctx.mem.fetch_add(space, a.va, a.swap_add)
        };
        let orig =
            r.map_err(|_| Fail::Nak(NakCode::RemoteOperationalError, WcStatus::LocProtErr))?;
        qp.push_resource(Resource {
            kind: ResourceKind::Atomic { orig },
            first_psn: psn,
            last_psn: psn,
        });
        qp.msn = (qp.msn + 1) & 0xff_ffff;
        let msn = qp.msn;
        queue(qp, &mut ctx.ready, RespOut::AtomicAck { psn, orig, msn });
    } else if info.has(OpInfo::ATOMIC_WRITE) || info.has(OpInfo::FLUSH) {
        let reth = t.reth.ok_or(inv_req)?;
        if info.has(OpInfo::ATOMIC_WRITE) {
            if reth.va % 8 != 0 {
                return Err(inv_req);
            }
            let space = ctx
                .remote_space(pd, qpn, reth.rkey, reth.va, 8, Access::REMOTE_WRITE)
                .ok_or(access_err)?;
            ctx.mem
                .write(space, reth.va, rx.payload)
                .map_err(|_| Fail::Nak(NakCode::RemoteOperationalError, WcStatus::LocProtErr))?;
        } else if reth.len > 0
            && !ctx.check_remote(
                pd,
                qpn,
                reth.rkey,
                reth.va,
                u64::from(reth.len),
                Access::NONE,
            )
        {
            return Err(access_err);
        }
        qp.push_resource(Resource {
            kind: ResourceKind::EmptyRead,
            first_psn: psn,
            last_psn: psn,
        });
        qp.msn = (qp.msn + 1) & 0xff_ffff;
        let msn = qp.msn;
        queue(qp, &mut ctx.ready, RespOut::EmptyRead { psn, msn });
    } else {
        return Err(inv_req);
    }
    if qp.ty == QpType::Rc {
        qp.resp_psn = psn.next();
        if t.bth.ack_req && (is_send || is_write) {
            ack(qp, &mut ctx.ready, AethSyndrome::ACK, psn);
        }
    }
    Ok(())
}

/// A UD request: Q_Key check, one receive WQE, the 40-byte GRH area, then the payload
/// (IBTA §11.4.1.1, facts §0.19).
pub(crate) fn on_ud_request<M: MemoryAccess>(qp: &mut Qp, ctx: &mut Ctx<M>, rx: &RxPacket<'_>) {
    if !qp.state.receives() {
        ctx.counters.drops.qp_state += 1;
        return;
    }
    let Some(deth) = rx.t.deth else {
        ctx.counters.drops.ud_not_received += 1;
        return;
    };
    if deth.qkey != qp.attr.qkey {
        ctx.counters.qkey_violation();
        return;
    }
    // Too small a buffer: rxe drops the datagram and keeps the WQE, except on an SRQ, where
    // the WQE completes in error (roce-rxe-facts.md §4.8).
    let fits = |r: &RecvWr| {
        let room: u64 = r.sg_list.iter().map(|s| u64::from(s.length)).sum();
        room >= 40 + rx.payload.len() as u64
    };
    let next_fits = match qp.init.srq {
        Some(id) => ctx.srqs.get(&id).and_then(|s| s.queue.front()).map(fits),
        None => qp.rq.front().map(fits),
    };
    match next_fits {
        // UD drops when no receive WQE is posted, or (without an SRQ) when it is too small.
        None => {
            ctx.counters.drops.ud_not_received += 1;
            return;
        }
        Some(false) if qp.init.srq.is_none() => {
            ctx.counters.drops.ud_not_received += 1;
            return;
        }
        _ => {}
    }
    let Some((recv, _)) = take_recv(qp, ctx) else {
        ctx.counters.drops.ud_not_received += 1;
        return;
    };
    let mut grh = [0u8; 40];
    if rx.net_header.len() == 20 {
        // IPv4: the header sits in the last 20 bytes, the first 20 are zero (rxe).
        grh[20..].copy_from_slice(rx.net_header);
    } else if rx.net_header.len() == 40 {
        grh.copy_from_slice(rx.net_header);
    }
    let pd = qp.init.pd;
    let status = if fits(&recv) {
        ctx.scatter(pd, &recv.sg_list, 0, &grh)
            .and_then(|_| ctx.scatter(pd, &recv.sg_list, 40, rx.payload))
    } else {
        Err(WcStatus::RemInvReqErr)
    };
    let mut wc = WorkCompletion::new(
        recv.wr_id,
        status.err().unwrap_or(WcStatus::Success),
        WcOpcode::Recv,
        qp.qpn,
    );
    if wc.status == WcStatus::Success {
        wc.byte_len = 40 + rx.payload.len() as u32;
        wc.src_qp = deth.src_qpn;
        wc.wc_flags = WcFlags::GRH;
        wc.sl = ud_packet_type(rx.net_header);
        if let Some(imm) = rx.t.imm {
            wc.imm_data = imm;
            wc.wc_flags.0 |= WcFlags::WITH_IMM.0;
        }
        wc.solicited = rx.t.bth.solicited;
    }
    let solicited = wc.solicited;
    recv_complete(qp, ctx, wc, solicited);
}

/// The packet type a UD receive reports in `wc.sl`, as mlx5 does (see [`WorkCompletion::sl`]):
/// RoCE v2 over IPv4 (a 20-byte IP header), over IPv6 (an IPv6 header whose next header is
/// UDP), else a RoCE v1 GRH (0). UCX 1.13's ud_verbs takes an IPv4 packet's destination GID
/// from the last 4 bytes of the GRH area only when `sl` says IPv4; with rxe's 0 it reads the
/// zeros before the IPv4 header, drops every packet and its connection never establishes.
/// Nothing else reads `sl` on RoCE: it is not on the wire (rxe ignores an AH's SL), so an AH
/// made from such a completion (`ibv_create_ah_from_wc`) behaves as before.
fn ud_packet_type(net_header: &[u8]) -> u8 {
    match net_header.len() {
        20 => crate::transport::verbs::WC_SL_ROCE_V2_IPV4,
        40 if net_header[6] == 17 => crate::transport::verbs::WC_SL_ROCE_V2_IPV6,
        _ => 0,
    }
}

/// Builds the next packet the responder owes (or a CNP), if any.
pub(crate) fn poll_response<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    buf: &mut [u8],
) -> Option<Transmit> {
    loop {
        let item = *qp.resp_out.front()?;
        let mut sack_payload = None;
        let Some(av) = qp.attr.ah_attr else {
            qp.resp_out.clear();
            return None;
        };
        let bth = |opcode: Opcode, psn: Psn| BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qpn: qp.attr.dest_qp_num,
            ack_req: false,
            psn,
        };
        let aeth = |syndrome: AethSyndrome, msn: u32| Some(AethRepr { syndrome, msn });
        let (t, read) = match item {
            RespOut::Ack { syndrome, psn, msn } => {
                let mut t = TransportRepr::new(bth(Opcode::RC_ACKNOWLEDGE, psn));
                t.aeth = aeth(syndrome, msn);
                (t, None)
            }
            RespOut::AtomicAck { psn, orig, msn } => {
                let mut t = TransportRepr::new(bth(Opcode::RC_ATOMIC_ACKNOWLEDGE, psn));
                t.aeth = aeth(AethSyndrome::ACK, msn);
                t.atomic_ack_eth = Some(AtomicAckEthRepr { orig });
                (t, None)
            }
            RespOut::EmptyRead { psn, msn } => {
                let mut t = TransportRepr::new(bth(Opcode::RC_RDMA_READ_RESPONSE_ONLY, psn));
                t.aeth = aeth(AethSyndrome::ACK, msn);
                (t, None)
            }
            RespOut::Cnp => {
                let mut b = bth(Opcode::CNP, Psn::new(0));
                b.becn = true;
                (TransportRepr::new(b), None)
            }
            RespOut::Sack { epsn, msn } => {
                let mut t = TransportRepr::new(bth(Opcode::SOFTROCE_SACK, epsn));
                t.aeth = aeth(AethSyndrome::Nak(NakCode::PsnSequenceError), msn);
                let sack = super::selective::sack_for(qp, epsn);
                t.payload_len = sack.buffer_len();
                sack_payload = Some(sack);
                (t, None)
            }
            RespOut::Read {
                psn,
                va,
                rkey,
                remaining,
                first,
                msn,
            } => {
                let plen = remaining.min(qp.mtu());
                let last = plen == remaining;
                let opcode = match (first, last) {
                    (true, true) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                    (true, false) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                    (false, true) => Opcode::RC_RDMA_READ_RESPONSE_LAST,
                    (false, false) => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                };
                let mut t = TransportRepr::new(bth(opcode, psn));
                if first || last {
                    t.aeth = aeth(AethSyndrome::ACK, msn);
                }
                t.payload_len = plen as usize;
                (t, Some((va, rkey, plen, last)))
            }
        };
        let mut route = route_for(ctx, &av, qp.src_port, read.is_some(), &mut qp.route_cache)?;
        if matches!(item, RespOut::Cnp) {
            // CNPs go out with their own DSCP (and ECT(0), as ConnectX NICs send them: TOS
            // 0xC2 for DSCP 48, roce-rxe-facts.md §1.2).
            let dscp = ctx.config.congestion.params.cnp_dscp;
            route
                .net
                .set_traffic_class(crate::wire::ecn::tos_of_dscp(dscp, crate::wire::Ecn::Ect0));
        }
        let (pd, qpn) = (qp.init.pd, qp.qpn);
        let seal = ctx.config.seals(route.net.dst_addr());
        let res = super::packet_io::emit(&route, &t, buf, seal, |out| match read {
            Some((va, rkey, plen, _)) if plen > 0 => {
                // The MR is validated again for each packet: it may have been invalidated
                // since the request (and replays re-check it, facts §4.5).
                let space = ctx
                    .remote_space(pd, qpn, rkey, va, u64::from(plen), Access::REMOTE_READ)
                    .ok_or(())?;
                if let Some(bytes) = ctx.mem.lend(space, va, out.len()) {
                    return Ok(Payload::Lent(bytes));
                }
                ctx.mem.read(space, va, out).map_err(|_| ())?;
                Ok(Payload::Written)
            }
            _ => {
                if let Some(sack) = &sack_payload {
                    sack.emit(out);
                }
                Ok(Payload::Written)
            }
        });
        match res {
            None => {
                ctx.counters.send_err += 1;
                qp.counters.send_err += 1;
                qp.resp_out.pop_front();
                return None;
            }
            Some(Err(())) => {
                ctx.counters.resp_remote_access_errors += 1;
                qp.counters.resp_remote_access_errors += 1;
                if let Some(RespOut::Read { psn, msn, .. }) = qp.resp_out.pop_front() {
                    qp.resp_out.push_front(RespOut::Ack {
                        syndrome: AethSyndrome::Nak(NakCode::RemoteAccessError),
                        psn,
                        msn,
                    });
                }
                continue;
            }
            Some(Ok(tx)) => {
                match item {
                    RespOut::Cnp => ctx.counters.np_cnp_sent += 1,
                    RespOut::Sack { .. } => ctx.counters.sack_sent += 1,
                    _ => {}
                }
                match (qp.resp_out.front_mut(), read) {
                    (
                        Some(RespOut::Read {
                            psn,
                            va,
                            remaining,
                            first,
                            ..
                        }),
                        Some((_, _, plen, false)),
                    ) => {
                        *psn = psn.next();
                        *va = va.wrapping_add(u64::from(plen));
                        *remaining -= plen;
                        *first = false;
                    }
                    _ => {
                        qp.resp_out.pop_front();
                    }
                }
                return Some(tx);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ud_packet_type;
    use crate::transport::{WC_SL_ROCE_V2_IPV4, WC_SL_ROCE_V2_IPV6};

    #[test]
    fn ud_receives_report_the_roce_packet_type_as_mlx5() {
        assert_eq!(ud_packet_type(&[0x45; 20]), WC_SL_ROCE_V2_IPV4);
        let mut ipv6 = [0u8; 40];
        ipv6[0] = 0x60;
        ipv6[6] = 17; // next header: UDP
        assert_eq!(ud_packet_type(&ipv6), WC_SL_ROCE_V2_IPV6);
        ipv6[6] = 0x1b; // a RoCE v1 GRH: next header BTH
        assert_eq!(ud_packet_type(&ipv6), 0);
        assert_eq!(ud_packet_type(&[]), 0);
    }
}
