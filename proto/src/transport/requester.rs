//! The requester (rxe `rxe_req.c`): turns send WQEs into request packets, segmenting by path
//! MTU, assigning PSNs, setting AckReq, honouring the window, the `max_rd_atomic` depth and
//! fences, and going back N when the completer asks for a retry.

use super::engine::{complete, route_for, Ctx, Transmit};
use super::memory::MemoryAccess;
use super::packet_io::{Payload, SegmentTemplate};
use super::qp::{Qp, SendWqe};
use super::qp_attr::{QpState, QpType};
use super::timers::{ack_timeout, Nanos};
use super::verbs::*;
use crate::types::Psn;
use crate::wire::bth::DEFAULT_PKEY;
use crate::wire::{AtomicEthRepr, BthRepr, DethRepr, FethRepr, Opcode, RethRepr, TransportRepr};

/// rxe stops sending while `req.psn` is more than this far ahead of `comp.psn`.
pub const MAX_UNACKED_PSNS: i32 = 128;
/// rxe asks for an ACK at least every this many packets inside a long message.
pub const MAX_PKT_PER_ACK: u32 = 64;

/// How many request packets may follow one another without AckReq: rxe's
/// [`MAX_PKT_PER_ACK`], half its window of [`MAX_UNACKED_PSNS`]; on a selective QP, whose
/// window is the bandwidth-delay product in packets, half that window when it is smaller
/// (`--selective-bdp 131072` is 32 packets at MTU 4096; the default, 128). A requester whose
/// window fills before it asked for an ACK hears nothing until its retransmit timer sends a
/// probe: between two daemons, 1 MiB WRITEs (one AckReq per 64 packets against a window of
/// 32) ran at a quarter of the rate of 64 KiB ones, with one probe every 0.6 ms.
fn ack_interval(qp: &Qp, mtu: u32) -> u32 {
    match qp.selective.as_deref() {
        Some(sel) => (sel.params().window(mtu) / 2).clamp(1, MAX_PKT_PER_ACK),
        None => MAX_PKT_PER_ACK,
    }
}

/// Validates and queues a send WR (rxe `rxe_post_send` + `validate_send_wr`).
pub(crate) fn post_send<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    mut wr: SendWr,
) -> VerbsResult<()> {
    if matches!(qp.state, QpState::Reset | QpState::Init | QpState::Rtr) {
        return Err(VerbsError::Invalid("QP not ready to send"));
    }
    let cap = qp.init.cap;
    if qp.sq.len() >= cap.max_send_wr as usize {
        return Err(VerbsError::NoResources("SQ full"));
    }
    if wr.sg_list.len() > cap.max_send_sge as usize {
        return Err(VerbsError::Invalid("too many SGEs"));
    }
    let inline = wr.flags.contains(SendFlags::INLINE);
    if inline && wr.inline_data.len() > cap.max_inline_data as usize {
        return Err(VerbsError::Invalid("inline data above max_inline_data"));
    }
    match qp.ty {
        QpType::Ud | QpType::Gsi => {
            // SEND_WITH_INV is accepted and fails at execution (rxe quirk, facts §2.4).
            if !wr.op.is_send() {
                return Err(VerbsError::Invalid("UD QPs only send"));
            }
            if wr.ud.is_none() {
                return Err(VerbsError::Invalid("UD send without a destination"));
            }
        }
        QpType::Uc => {
            if wr.op.is_read_or_atomic() {
                return Err(VerbsError::Invalid("UC has no READ or atomics"));
            }
        }
        QpType::Rc => {}
    }
    let len = wr.total_len();
    if len > 0x8000_0000 {
        return Err(VerbsError::Invalid("message above max_msg_sz"));
    }
    let aligned = |va: u64| va.is_multiple_of(8);
    match wr.op {
        SendOp::CompareSwap { remote, .. } | SendOp::FetchAdd { remote, .. }
            if len != 8 || !aligned(remote.va) =>
        {
            return Err(VerbsError::Invalid(
                "atomics need 8 bytes at an aligned address",
            ));
        }
        SendOp::AtomicWrite { remote, .. } if !aligned(remote.va) => {
            return Err(VerbsError::Invalid("ATOMIC_WRITE needs an aligned address"));
        }
        _ => {}
    }
    if !inline {
        wr.inline_data.clear();
    }
    let len = match wr.op {
        SendOp::AtomicWrite { .. } => 8,
        SendOp::Flush { len, .. } => len,
        SendOp::LocalInv(_) | SendOp::BindMw { .. } => 0,
        _ => len as u32,
    };
    let qpn = qp.qpn;
    if qp.state == QpState::Err {
        let wc = WorkCompletion::new(wr.wr_id, WcStatus::WrFlushErr, wr.op.wc_opcode(), qpn);
        complete(ctx, qp.init.send_cq, wc, false);
        return Ok(());
    }
    qp.sq.push_back(SendWqe::new(wr, len));
    super::engine::schedule(qp, &mut ctx.ready);
    Ok(())
}

/// Completes the head WQE of the SQ with `status` (the completer's `do_complete`). Errors are
/// always reported; successes only when signaled.
pub(crate) fn complete_head<M>(qp: &mut Qp, ctx: &mut Ctx<M>, status: WcStatus) -> bool {
    let Some(w) = qp.sq.pop_front() else {
        return true;
    };
    qp.req_index = qp.req_index.saturating_sub(1);
    if w.holds_rd_atomic {
        qp.rd_atomic_in_flight = qp.rd_atomic_in_flight.saturating_sub(1);
    }
    if status == WcStatus::Success && w.wr.op.is_send() {
        ctx.counters.rdma_sends += 1;
        qp.counters.rdma_sends += 1;
    }
    let signaled = qp.init.sq_sig_all || w.wr.flags.contains(SendFlags::SIGNALED);
    if signaled || status != WcStatus::Success {
        let mut wc = WorkCompletion::new(w.wr.wr_id, status, w.wr.op.wc_opcode(), qp.qpn);
        wc.byte_len = if status == WcStatus::Success {
            w.len
        } else {
            0
        };
        return complete(ctx, qp.init.send_cq, wc, false);
    }
    true
}

/// Completes the head with an error and moves the QP to ERR, flushing the rest.
pub(crate) fn fail_head<M>(qp: &mut Qp, ctx: &mut Ctx<M>, status: WcStatus) {
    complete_head(qp, ctx, status);
    super::engine::flush_qp(qp, ctx, false);
    ctx.events.push_back(AsyncEvent::QpFatal { qpn: qp.qpn });
}

/// Go-back-N (rxe `req_retry`): resend from the oldest unacknowledged PSN. The head WQE
/// skips the packets already acknowledged; a READ restarts at the first byte not received.
fn go_back_n(qp: &mut Qp) {
    qp.need_retry = false;
    if let Some(sel) = qp.selective.as_mut() {
        // Everything from comp_psn goes again as new packets; what the peer reported
        // holding is re-learnt from its next report.
        sel.on_go_back_n();
    }
    qp.req_psn = qp.comp_psn;
    qp.req_index = 0;
    qp.noack_pkts = 0;
    qp.rd_atomic_in_flight = 0;
    let comp = qp.comp_psn;
    for w in qp.sq.iter_mut() {
        if !w.started {
            break;
        }
        let skip = comp.diff(w.first_psn).clamp(0, w.npkts as i32 - 1) as u32;
        let multi = !w.wr.op.is_atomic()
            && !matches!(w.wr.op, SendOp::AtomicWrite { .. } | SendOp::Flush { .. });
        w.next_psn = if multi {
            w.first_psn.add(skip)
        } else {
            w.first_psn
        };
        w.sent_all = false;
        w.holds_rd_atomic = false;
    }
}

fn opcode_for(ty: QpType, op: &SendOp, first: bool, last: bool) -> Option<Opcode> {
    let pick = |only: u8, f: u8, l: u8, m: u8| match (first, last) {
        (true, true) => only,
        (true, false) => f,
        (false, true) => l,
        (false, false) => m,
    };
    let rc = match op {
        SendOp::Send => pick(0x04, 0x00, 0x02, 0x01),
        SendOp::SendWithImm(_) => pick(0x05, 0x00, 0x03, 0x01),
        SendOp::SendWithInv(_) => pick(0x17, 0x00, 0x16, 0x01),
        SendOp::Write(_) => pick(0x0a, 0x06, 0x08, 0x07),
        SendOp::WriteWithImm(..) => pick(0x0b, 0x06, 0x09, 0x07),
        SendOp::Read(_) => 0x0c,
        SendOp::CompareSwap { .. } => 0x13,
        SendOp::FetchAdd { .. } => 0x14,
        SendOp::Flush { .. } => 0x1c,
        SendOp::AtomicWrite { .. } => 0x1d,
        SendOp::LocalInv(_) | SendOp::BindMw { .. } => return None,
    };
    match ty {
        QpType::Rc => Some(Opcode(rc)),
        QpType::Uc => match op {
            SendOp::Send | SendOp::SendWithImm(_) | SendOp::Write(_) | SendOp::WriteWithImm(..) => {
                Some(Opcode(rc + 0x20))
            }
            _ => None,
        },
        QpType::Ud | QpType::Gsi => match op {
            SendOp::Send => Some(Opcode::UD_SEND_ONLY),
            SendOp::SendWithImm(_) => Some(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE),
            _ => None,
        },
    }
}

/// Whether the WQE after `idx` is one the requester sends right after this one's last packet
/// without waiting for anything: a SEND or RDMA WRITE, not fenced. Then (with
/// [`super::EngineConfig::coalesce_acks`]) the last packet of WQE `idx` need not ask for an ACK: the next message's ACK acknowledges both (IBTA
/// §9.7.5.1.2, coalesced acknowledgement), as rxe's every-64-packets AckReq already does
/// inside one long message, and a stream of small messages costs one ACK per 64 packets
/// instead of one per message. A message that ends what is queued (a latency test's every
/// message), or is followed by a READ, an atomic, a local operation or a fence, which may
/// wait for this one's completion, still asks for its ACK.
fn next_goes_at_once(qp: &Qp, idx: usize) -> bool {
    qp.sq.get(idx + 1).is_some_and(|next| {
        !next.wr.flags.contains(SendFlags::FENCE)
            && matches!(
                next.wr.op,
                SendOp::Send
                    | SendOp::SendWithImm(_)
                    | SendOp::SendWithInv(_)
                    | SendOp::Write(_)
                    | SendOp::WriteWithImm(..)
            )
    })
}

/// Builds the next request packet of `qp`, if the requester may send one now.
pub(crate) fn poll_request<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    now: Nanos,
    buf: &mut [u8],
) -> Option<Transmit> {
    if !qp.state.sends() || qp.paced_until.is_some() {
        return None;
    }
    if qp.ty == QpType::Rc {
        if qp.rnr_wait_until.is_some() {
            return None;
        }
        if qp.need_retry {
            go_back_n(qp);
        }
        if qp.selective.is_some() {
            // What the peer reported missing goes before anything new.
            if let Some(tx) = super::selective::poll_retransmit(qp, ctx, now, buf) {
                return Some(tx);
            }
            if qp.paced_until.is_some() {
                return None;
            }
        }
    }
    loop {
        let idx = qp.req_index;
        let w = qp.sq.get(idx)?;
        if w.error.is_some() {
            if idx == 0 {
                let status = w.error.unwrap_or(WcStatus::GeneralErr);
                fail_head(qp, ctx, status);
            }
            return None;
        }
        if let SendOp::LocalInv(key) = w.wr.op {
            // Local operations wait for everything before them (a mandatory fence, facts §2.4).
            if idx != 0 {
                return None;
            }
            if ctx.invalidate(qp.init.pd, qp.qpn, key) {
                complete_head(qp, ctx, WcStatus::Success);
                continue;
            }
            fail_head(qp, ctx, WcStatus::MwBindErr);
            return None;
        }
        if let SendOp::BindMw {
            mw_rkey,
            mr_lkey,
            addr,
            length,
            access,
            key,
        } = w.wr.op
        {
            if idx != 0 {
                return None;
            }
            let r = ctx.bind_mw(
                qp.init.pd,
                qp.qpn,
                mw_rkey,
                mr_lkey,
                (addr, length),
                access,
                key,
            );
            match r {
                Ok(()) => {
                    complete_head(qp, ctx, WcStatus::Success);
                    continue;
                }
                Err(status) => {
                    fail_head(qp, ctx, status);
                    return None;
                }
            }
        }
        if !w.started && qp.state == QpState::Sqd {
            // SQD finishes what was started and takes nothing new.
            return None;
        }
        if w.wr.flags.contains(SendFlags::FENCE)
            && qp.sq.iter().take(idx).any(|p| p.wr.op.is_read_or_atomic())
        {
            return None;
        }
        break;
    }
    // The rate limiter: a QP below the line rate sends its next request only when its pacer
    // lets it; the device serves other QPs meanwhile. At the line rate this is one test.
    if qp.cc.limited() && held_by_pacer(qp, ctx, now) {
        return None;
    }
    let idx = qp.req_index;
    let ty = qp.ty;
    // UD messages are one packet of at most the port MTU; RC and UC segment by the path MTU.
    let mtu = if ty.is_ud() {
        ctx.config.port_mtu.bytes()
    } else {
        qp.mtu()
    };
    let max_rd = u32::from(qp.attr.max_rd_atomic).max(1);
    let (rd_in_flight, req_psn, comp_psn) = (qp.rd_atomic_in_flight, qp.req_psn, qp.comp_psn);
    // Go-back-N: rxe's fixed 128 PSNs past the oldest unacknowledged one. Selective: the
    // window (the bandwidth-delay product in packets) past what the responder holds in order.
    let (window_base, window) = match qp.selective.as_deref() {
        Some(sel) => sel.send_window(comp_psn, mtu),
        None => (comp_psn, MAX_UNACKED_PSNS),
    };
    let w = qp.sq.get_mut(idx)?;
    if ty == QpType::Rc {
        if w.wr.op.is_read_or_atomic() && !w.holds_rd_atomic && rd_in_flight >= max_rd {
            return None;
        }
        if req_psn.diff(window_base) >= window {
            return None;
        }
    }
    if !w.started {
        w.started = true;
        w.first_psn = req_psn;
        w.npkts =
            if ty.is_ud() || (w.wr.op.is_read_or_atomic() && !matches!(w.wr.op, SendOp::Read(_))) {
                1
            } else {
                super::qp::npkts(w.len, qp.attr.path_mtu)
            };
        w.last_psn = req_psn.add(w.npkts - 1);
        w.next_psn = req_psn;
    }
    let psn = w.next_psn;
    emit_request(qp, ctx, now, idx, psn, Emit::New, buf)
}

/// Which packet [`emit_request`] builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Emit {
    /// The next packet of the WQE in the current pass (its `next_psn`).
    New,
    /// Selective retransmission of a packet sent before, always with AckReq. `read_len`:
    /// for a READ, the bytes to ask for again (a run of missing response packets).
    Retransmit { read_len: Option<u32> },
}

/// Builds packet `psn` of WQE `idx`: the request packets of SEND/WRITE/READ/atomics, by
/// path MTU, with rxe's opcodes and AckReq rule.
pub(crate) fn emit_request<M: MemoryAccess>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    now: Nanos,
    idx: usize,
    psn: Psn,
    emit: Emit,
    buf: &mut [u8],
) -> Option<Transmit> {
    let ty = qp.ty;
    let mtu = if ty.is_ud() {
        ctx.config.port_mtu.bytes()
    } else {
        qp.mtu()
    };
    let retransmit = emit != Emit::New;
    let ack_every = ack_interval(qp, mtu);
    let w = qp.sq.get_mut(idx)?;
    let index = psn.diff(w.first_psn).max(0) as u32;
    let offset = u64::from(index) * u64::from(mtu);
    let qpn = qp.qpn;

    // The next full-MTU MIDDLE packet of a SEND or WRITE whose previous MIDDLE packet was
    // built here: its headers are the kept ones with a new PSN and AckReq bit.
    if let Some(tpl) = qp.next_segment.as_ref().filter(|_| !retransmit) {
        let middle = index > 0
            && u64::from(w.len).saturating_sub(offset) > u64::from(mtu)
            && tpl.payload_len() == mtu as usize
            && matches!(
                w.wr.op,
                SendOp::Send | SendOp::SendWithImm(_) | SendOp::Write(_) | SendOp::WriteWithImm(..)
            )
            && !w.wr.flags.contains(SendFlags::INLINE);
        if middle && tpl.first_psn == w.first_psn && !ty.is_ud() {
            let ack_req = ty == QpType::Rc && qp.noack_pkts + 1 > ack_every;
            let pd = qp.init.pd;
            let sges = &w.wr.sg_list;
            let seal = ctx.config.seals(tpl.transmit().dst);
            let res = tpl.emit(psn, ack_req, buf, seal, |out| {
                ctx.gather(pd, sges, offset, out)
            });
            if ty == QpType::Rc {
                qp.noack_pkts += 1;
            }
            return match res {
                None => {
                    ctx.counters.send_err += 1;
                    qp.counters.send_err += 1;
                    None
                }
                Some(Err(status)) => {
                    let w = qp.sq.get_mut(idx)?;
                    w.error = Some(status);
                    poll_request(qp, ctx, now, buf)
                }
                Some(Ok(())) => {
                    let len = tpl.transmit().len;
                    sent(qp, ctx, now, idx, psn, false, false, ack_req, len)?;
                    qp.next_segment.as_ref().map(SegmentTemplate::transmit)
                }
            };
        }
    }

    // UD: the path is the AH's; a message above the MTU is silently not sent yet completes
    // with success (IBTA C10-93.1.1, rxe).
    let (av, dest_qpn, deth) = match (ty, w.wr.ud) {
        (QpType::Ud | QpType::Gsi, Some(ud)) => {
            let Some(ah) = ctx.ahs.get(&ud.ah).copied() else {
                w.error = Some(WcStatus::LocQpOpErr);
                return poll_request(qp, ctx, now, buf);
            };
            let qkey = if ty == QpType::Gsi {
                crate::types::Qkey::GSI
            } else {
                ud.remote_qkey
            };
            (ah.av, ud.remote_qpn, Some(DethRepr { qkey, src_qpn: qpn }))
        }
        _ => match qp.attr.ah_attr {
            Some(av) => (av, qp.attr.dest_qp_num, None),
            None => return None,
        },
    };
    if deth.is_some() && w.len > mtu {
        w.sent_all = true;
        complete_head(qp, ctx, WcStatus::Success);
        return poll_request(qp, ctx, now, buf);
    }

    let first = index == 0;
    let (last, payload_len) = match w.wr.op {
        SendOp::Read(_)
        | SendOp::CompareSwap { .. }
        | SendOp::FetchAdd { .. }
        | SendOp::Flush { .. } => (true, 0),
        SendOp::AtomicWrite { .. } => (true, 8),
        _ => {
            let rem = u64::from(w.len) - offset.min(u64::from(w.len));
            (rem <= u64::from(mtu), rem.min(u64::from(mtu)) as usize)
        }
    };
    let Some(opcode) = opcode_for(ty, &w.wr.op, first, last) else {
        // e.g. SEND_WITH_INV on UD/UC: accepted at post time, fails here (facts §2.4).
        w.error = Some(WcStatus::LocQpOpErr);
        return poll_request(qp, ctx, now, buf);
    };
    let is_read_atomic = ty == QpType::Rc && w.wr.op.is_read_or_atomic();
    let mut ack_req = false;
    if retransmit {
        // Every retransmission asks for the responder's news at once.
        ack_req = true;
    } else if ty == QpType::Rc {
        qp.noack_pkts += 1;
        let ends_burst = last && !(ctx.config.coalesce_acks && next_goes_at_once(qp, idx));
        if ends_burst || qp.noack_pkts > ack_every || is_read_atomic {
            ack_req = true;
        }
    }
    let w = qp.sq.get_mut(idx)?;
    let solicited = last
        && w.wr.flags.contains(SendFlags::SOLICITED)
        && matches!(
            w.wr.op,
            SendOp::Send
                | SendOp::SendWithImm(_)
                | SendOp::SendWithInv(_)
                | SendOp::WriteWithImm(..)
        );
    let mut t = TransportRepr::new(BthRepr {
        opcode,
        solicited,
        mig_req: false,
        pkey: DEFAULT_PKEY,
        fecn: false,
        becn: false,
        dest_qpn,
        ack_req,
        psn,
    });
    t.payload_len = payload_len;
    t.deth = deth;
    match w.wr.op {
        SendOp::SendWithImm(imm) if last => t.imm = Some(imm),
        SendOp::WriteWithImm(_, imm) if last => t.imm = Some(imm),
        SendOp::SendWithInv(k) if last => t.ieth = Some(k),
        _ => {}
    }
    match w.wr.op {
        SendOp::Write(r) | SendOp::WriteWithImm(r, _) if first => {
            t.reth = Some(RethRepr {
                va: r.va,
                rkey: r.rkey,
                len: w.len,
            });
        }
        SendOp::Read(r) => {
            // A partial retry asks only for the bytes not yet received (facts §4.3); a
            // selective repair only for the run of response packets that went missing.
            let rest = (u64::from(w.len) - offset.min(u64::from(w.len))) as u32;
            let len = match emit {
                Emit::Retransmit {
                    read_len: Some(len),
                } => len.min(rest),
                _ => rest,
            };
            t.reth = Some(RethRepr {
                va: r.va.wrapping_add(offset),
                rkey: r.rkey,
                len,
            });
        }
        SendOp::CompareSwap {
            remote,
            compare,
            swap,
        } => {
            t.atomic_eth = Some(AtomicEthRepr {
                va: remote.va,
                rkey: remote.rkey,
                swap_add: swap,
                compare,
            });
        }
        SendOp::FetchAdd { remote, add } => {
            t.atomic_eth = Some(AtomicEthRepr {
                va: remote.va,
                rkey: remote.rkey,
                swap_add: add,
                compare: 0,
            });
        }
        SendOp::AtomicWrite { remote, .. } => {
            t.reth = Some(RethRepr {
                va: remote.va,
                rkey: remote.rkey,
                len: 8,
            });
        }
        SendOp::Flush {
            remote,
            len,
            placement,
        } => {
            t.feth = Some(FethRepr {
                selectivity: 0,
                placement,
            });
            t.reth = Some(RethRepr {
                va: remote.va,
                rkey: remote.rkey,
                len,
            });
        }
        _ => {}
    }
    let Some(route) = route_for(ctx, &av, qp.src_port, true, &mut qp.route_cache) else {
        let w = qp.sq.get_mut(idx)?;
        w.error = Some(WcStatus::LocQpOpErr);
        return poll_request(qp, ctx, now, buf);
    };
    let pd = qp.init.pd;
    let w = qp.sq.get(idx)?;
    let seal = ctx.config.seals(route.net.dst_addr());
    let res = super::packet_io::emit(&route, &t, buf, seal, |out| {
        if let SendOp::AtomicWrite { value, .. } = w.wr.op {
            out.copy_from_slice(&value.to_ne_bytes());
            Ok(Payload::Written)
        } else if w.wr.flags.contains(SendFlags::INLINE) {
            let start = offset as usize;
            out.copy_from_slice(&w.wr.inline_data[start..start + out.len()]);
            Ok(Payload::Written)
        } else {
            ctx.gather(pd, &w.wr.sg_list, offset, out)
        }
    });
    let tx = match res {
        None => {
            ctx.counters.send_err += 1;
            qp.counters.send_err += 1;
            return None;
        }
        Some(Err(status)) => {
            let w = qp.sq.get_mut(idx)?;
            w.error = Some(status);
            return poll_request(qp, ctx, now, buf);
        }
        Some(Ok(tx)) => tx,
    };
    if retransmit {
        super::selective::resent(qp, ctx, now, psn, tx.len);
        return Some(tx);
    }
    if matches!(
        opcode,
        Opcode::RC_SEND_MIDDLE
            | Opcode::RC_RDMA_WRITE_MIDDLE
            | Opcode::UC_SEND_MIDDLE
            | Opcode::UC_RDMA_WRITE_MIDDLE
    ) {
        let first_psn = qp.sq.get(idx)?.first_psn;
        qp.next_segment = SegmentTemplate::capture(&buf[..tx.len], &tx, first_psn);
    }
    sent(
        qp,
        ctx,
        now,
        idx,
        psn,
        last,
        is_read_atomic,
        ack_req,
        tx.len,
    )?;
    Some(tx)
}

/// IPv6 + UDP + BTH + RETH + ICRC: what a full packet carries besides its payload, at most.
const PACKET_OVERHEAD: u32 = 40 + 8 + 12 + 16 + 4;

/// Whether the pacer holds the QP's next packet at `now`; if so the QP waits in
/// `paced_until` for the packet's time, or for the controller's next change of rate if that
/// comes first (a rate that recovers is used at once, not after an interval computed at the
/// old rate).
fn held_by_pacer<M>(qp: &mut Qp, ctx: &Ctx<M>, now: Nanos) -> bool {
    let p = &ctx.config.congestion.params;
    let rate = qp.cc.inner_mut().rate(now, p);
    if !qp.cc.limited() {
        return false;
    }
    // Lateness the pacer forgives: the configured time, and at least one full packet's time,
    // so that at low rates a wake-up late by a fraction of a packet time costs no rate (the
    // burst after an idle moment is then two packets).
    let packet_bits = u64::from(qp.mtu() + PACKET_OVERHEAD) * 8;
    let one_packet = (packet_bits * 1_000_000_000).checked_div(rate).unwrap_or(0);
    let tolerance = (u64::from(p.pacing_tolerance) * 1_000).max(one_packet);
    let Some(at) = qp.pacer.release_time(now, rate, tolerance) else {
        return false;
    };
    let wake = qp.cc.inner().next_change(p).map_or(at, |c| c.min(at));
    qp.paced_until = Some(wake.max(now + 1));
    true
}

/// The requester's state after packet `psn` of WQE `idx` went out, `len` bytes long.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn sent<M>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    now: Nanos,
    idx: usize,
    psn: Psn,
    last: bool,
    is_read_atomic: bool,
    ack_req: bool,
    len: usize,
) -> Option<()> {
    let ty = qp.ty;
    if ack_req {
        qp.noack_pkts = 0;
    }
    if qp.cc.limited() {
        // The byte counter of the rate increase, and the pacer's charge for this packet.
        qp.cc
            .inner_mut()
            .on_sent(now, len, &ctx.config.congestion.params);
        qp.pacer.on_sent(now, len);
    }
    let w = qp.sq.get_mut(idx)?;
    let next = if matches!(w.wr.op, SendOp::Read(_)) {
        w.last_psn.next()
    } else {
        psn.next()
    };
    w.next_psn = next;
    if is_read_atomic {
        w.holds_rd_atomic = true;
        w.read_req_psn = psn;
        qp.rd_atomic_in_flight += 1;
    }
    if last {
        w.sent_all = true;
        qp.req_index += 1;
        // The kept MIDDLE headers belong to this message only.
        qp.next_segment = None;
    }
    // UD and UC do not consume PSN space with retries; they advance one per packet anyway.
    qp.req_psn = next;
    if let Some(sel) = qp.selective.as_mut() {
        sel.on_sent(psn, next, now);
        if qp.probe_deadline.is_none() {
            qp.probe_deadline = Some(now + sel.probe_timeout(qp.attr.timeout));
        }
    }
    match ty {
        QpType::Rc => {
            if qp.retrans_deadline.is_none() {
                qp.retrans_deadline = ack_timeout(qp.attr.timeout).map(|d| now + d);
            }
        }
        _ => {
            // UC and UD complete as soon as the last packet is out (no ACKs).
            if last {
                complete_head(qp, ctx, WcStatus::Success);
            }
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Rkey;

    #[test]
    fn opcode_selection_follows_rxe() {
        let r = RemoteAddr {
            va: 0,
            rkey: Rkey(1),
        };
        let rc = |op: SendOp, f, l| opcode_for(QpType::Rc, &op, f, l).map(|o| o.0);
        assert_eq!(rc(SendOp::Send, true, true), Some(0x04));
        assert_eq!(rc(SendOp::Send, true, false), Some(0x00));
        assert_eq!(rc(SendOp::Send, false, false), Some(0x01));
        assert_eq!(rc(SendOp::SendWithImm(1), false, true), Some(0x03));
        assert_eq!(rc(SendOp::SendWithInv(Rkey(1)), true, true), Some(0x17));
        assert_eq!(rc(SendOp::Write(r), true, false), Some(0x06));
        assert_eq!(rc(SendOp::WriteWithImm(r, 1), false, true), Some(0x09));
        assert_eq!(rc(SendOp::Read(r), true, true), Some(0x0c));
        assert_eq!(
            rc(SendOp::FetchAdd { remote: r, add: 1 }, true, true),
            Some(0x14)
        );
        // UC: the RC opcodes plus 0x20, no invalidate; UD: SEND_ONLY (with immediate) only.
        let uc = |op: SendOp| opcode_for(QpType::Uc, &op, true, true).map(|o| o.0);
        assert_eq!(uc(SendOp::WriteWithImm(r, 1)), Some(0x2b));
        assert_eq!(uc(SendOp::SendWithInv(Rkey(1))), None);
        let ud = |op: SendOp| opcode_for(QpType::Ud, &op, true, true).map(|o| o.0);
        assert_eq!(ud(SendOp::SendWithImm(1)), Some(0x65));
        assert_eq!(ud(SendOp::Write(r)), None);
    }
}
