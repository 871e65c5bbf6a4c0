//! Creating the objects that share rings with the client (CQs, QPs, SRQs: each gets a sealed
//! memfd holding its rings, whose descriptor goes to the client), and the QP attribute verbs,
//! translated between the control protocol's ibverbs-level values and the engine's.

use super::arena::{RingArena, RingMemory};
use super::clients::{ClientDev, CqState, QpHost, SrqState};
use super::control::{err, errno};
use super::doorbells::Bell;
use crate::shm::SharedRegion;
use proto::ctl::{self, Response, RingPlace};
use proto::ring::wqe;
use proto::ring::{RingGeometry, SharedRing};
use proto::transport::{AddressVector, AttrMask, QpCap, QpInit, QpType};
use proto::Qpn;
use std::collections::VecDeque;
use std::net::IpAddr;
use std::os::fd::OwnedFd;

/// Allocates a sealed memfd holding `geometries` back to back; returns it and where each ring
/// is.
pub(super) fn rings(
    name: &str,
    geometries: &[RingGeometry],
    budget: u64,
) -> anyhow::Result<(SharedRegion, Vec<(SharedRing, RingPlace)>)> {
    let mut offsets = Vec::new();
    let mut at = 0usize;
    for g in geometries {
        offsets.push(at);
        at += g.byte_len().next_multiple_of(4096);
    }
    // Checked before anything is allocated (device::limits).
    if at.max(4096) as u64 > budget {
        anyhow::bail!(
            "the rings need {} bytes, past the ring memory limit (max_ring_bytes or \
             client_max_ring_bytes)",
            at.max(4096)
        );
    }
    let region = SharedRegion::create(name, at.max(4096))?;
    let mut out = Vec::new();
    for (g, off) in geometries.iter().zip(offsets) {
        let ring = region.init_ring(off, *g)?;
        out.push((
            ring,
            RingPlace {
                offset: off as u64,
                slot_size: g.slot_size,
                slot_count: g.slot_count,
            },
        ));
    }
    Ok((region, out))
}

/// The region's descriptor, for the client; the daemon keeps only its mapping.
pub(super) fn give_fd(region: &mut SharedRegion) -> Vec<OwnedFd> {
    region.take_fd().into_iter().collect()
}

pub(super) fn create_cq(
    c: &mut ClientDev,
    ctx: u32,
    cqe: u32,
    channel: Option<u32>,
    ring_budget: u64,
) -> (Response, Vec<OwnedFd>) {
    if !c.contexts.contains_key(&ctx) {
        return (errno(libc::EINVAL, "no such context"), vec![]);
    }
    if channel.is_some_and(|ch| !c.channels.contains_key(&ch)) {
        return (errno(libc::EINVAL, "no such completion channel"), vec![]);
    }
    if cqe == 0 || cqe > 1 << 20 {
        return (errno(libc::EINVAL, "cqe out of range"), vec![]);
    }
    let Some(g) = RingGeometry::new(cqe + 1, wqe::CQE_SLOT_LEN as u32) else {
        return (errno(libc::EINVAL, "cqe out of range"), vec![]);
    };
    // The engine's depth is the granted one (`slot_count - 1`, reported as `cqe`): asking
    // for the ring's power-of-two slot count would exceed max_cqe (2^k - 1, config.rs) for
    // cqe = max_cqe.
    let cq = match c.engine.create_cq(g.slot_count as usize - 1) {
        Ok(h) => h,
        Err(e) => return (err(e), vec![]),
    };
    match rings("cq", &[g], ring_budget) {
        Ok((mut region, mut r)) => {
            let (ring, place) = r.remove(0);
            let fds = give_fd(&mut region);
            let region_len = region.len() as u64;
            c.ring_bytes += region_len;
            c.cqs.insert(
                cq,
                CqState {
                    region,
                    ring,
                    channel,
                    generation: 0,
                    ctx,
                    in_error: false,
                    arm_requests: 0,
                    event_waits: 0,
                    events_only: false,
                    offer_waits: std::cell::Cell::new(false),
                },
            );
            (
                Response::Cq {
                    cq,
                    cqe: g.slot_count - 1,
                    ring: place,
                    region_len,
                },
                fds,
            )
        }
        Err(e) => {
            let _ = c.engine.destroy_cq(cq);
            (errno(libc::ENOMEM, &format!("{e:#}")), vec![])
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn create_qp(
    c: &mut ClientDev,
    pd: u32,
    qp_type: u32,
    send_cq: u32,
    recv_cq: u32,
    srq: Option<u32>,
    cap: ctl::QpCap,
    sq_sig_all: bool,
    ring_budget: u64,
) -> (Response, Vec<OwnedFd>) {
    let Some(&(epd, _)) = c.pds.get(&pd) else {
        return (errno(libc::EINVAL, "no such PD"), vec![]);
    };
    let qp_type = match qp_type {
        ctl::qp_type::RC => QpType::Rc,
        ctl::qp_type::UC => QpType::Uc,
        ctl::qp_type::UD => QpType::Ud,
        _ => {
            return (
                errno(libc::EOPNOTSUPP, "QP type not supported (XRC, raw packet)"),
                vec![],
            )
        }
    };
    let Some(ctx) = c.cqs.get(&send_cq).map(|q| q.ctx) else {
        return (errno(libc::EINVAL, "no such send CQ"), vec![]);
    };
    if !c.cqs.contains_key(&recv_cq) || srq.is_some_and(|s| !c.srqs.contains_key(&s)) {
        return (errno(libc::EINVAL, "no such CQ or SRQ"), vec![]);
    }
    // Grant at least what was asked, rounded to the rings' power-of-two depth.
    if cap.max_inline_data > 512 {
        return (errno(libc::EINVAL, "max_inline_data above 512"), vec![]);
    }
    let max_inline = cap.max_inline_data.clamp(64, 512);
    // Checked before the slot sizes are computed from them: a client's huge SGE count would
    // overflow `sge * 16`.
    if cap.max_send_sge > wqe::MAX_SGE as u32 || cap.max_recv_sge > wqe::MAX_SGE as u32 {
        return (errno(libc::EINVAL, "too many SGEs"), vec![]);
    }
    let send_slot = wqe::SEND_HEADER_LEN as u32 + (cap.max_send_sge.max(1) * 16).max(max_inline);
    let recv_slot = wqe::RECV_HEADER_LEN as u32 + cap.max_recv_sge.max(1) * 16;
    let (Some(sg), Some(rg)) = (
        RingGeometry::new(cap.max_send_wr.max(1), send_slot),
        RingGeometry::new(cap.max_recv_wr.max(1), recv_slot),
    ) else {
        return (errno(libc::EINVAL, "QP capacity"), vec![]);
    };
    let granted = ctl::QpCap {
        max_send_wr: sg.slot_count,
        max_recv_wr: if srq.is_some() { 0 } else { rg.slot_count },
        max_send_sge: cap.max_send_sge.max(1),
        max_recv_sge: cap.max_recv_sge.max(1),
        max_inline_data: max_inline,
    };
    if granted.max_send_sge > wqe::MAX_SGE as u32 || granted.max_recv_sge > wqe::MAX_SGE as u32 {
        return (errno(libc::EINVAL, "too many SGEs"), vec![]);
    }
    let init = QpInit {
        pd: epd,
        qp_type,
        send_cq,
        recv_cq,
        srq,
        cap: QpCap {
            max_send_wr: granted.max_send_wr,
            max_recv_wr: granted.max_recv_wr.max(1),
            max_send_sge: granted.max_send_sge,
            max_recv_sge: granted.max_recv_sge,
            max_inline_data: granted.max_inline_data,
        },
        sq_sig_all,
    };
    let qpn = match c.engine.create_qp(init) {
        Ok(q) => q,
        Err(e) => return (err(e), vec![]),
    };
    let Some(doorbell) = c.add_bell(Bell::Qp(qpn.value())) else {
        let _ = c.engine.destroy_qp(qpn);
        return (errno(libc::ENOMEM, "no doorbell left"), vec![]);
    };
    let geometries: Vec<RingGeometry> = if srq.is_some() {
        vec![sg]
    } else {
        vec![sg, rg]
    };
    match qp_rings(c, &geometries, ring_budget) {
        Ok((mut memory, mut r)) => {
            let (sq, sq_place) = r.remove(0);
            let (rq, rq_place) = match r.pop() {
                Some((ring, place)) => (Some(ring), Some(place)),
                None => (None, None),
            };
            // RC and UC QPs with a receive ring may go on the same-host fast path, which
            // lends that ring to another process: keep a descriptor of the memory that holds
            // it (the QP's own region, or its chunk), where it lies, and the mapping's length.
            let fast = (matches!(qp_type, QpType::Rc | QpType::Uc)
                && srq.is_none()
                && c.fast_fds < super::fast::FD_BUDGET)
                .then(|| match &mut memory {
                    RingMemory::Own(r) => r.dup_fd(),
                    shared => c.arena.fd_for(shared).pop(),
                })
                .flatten()
                .zip(rq_place)
                .map(|(fd, place)| (fd, place, c.arena.placement(&memory).0));
            c.fast_fds += usize::from(fast.is_some());
            let fds = c.arena.fd_for(&mut memory);
            let (region_len, _) = c.arena.placement(&memory);
            let region = RingArena::region_id(&memory);
            c.ring_bytes += RingArena::charged(&memory);
            c.qps.insert(
                qpn.value(),
                QpHost {
                    memory,
                    sq,
                    rq,
                    cap: init.cap,
                    send_cq,
                    recv_cq,
                    sq_sig_all,
                    pending_send: VecDeque::new(),
                    pending_recv: VecDeque::new(),
                    ctx,
                    fast,
                    away: false,
                    lent: false,
                    held: false,
                    hold_ended: None,
                    corrupt: false,
                    doorbell,
                },
            );
            (
                Response::Qp {
                    qpn: qpn.value(),
                    cap: granted,
                    sq: sq_place,
                    rq: rq_place,
                    region_len,
                    doorbell,
                    region,
                },
                fds,
            )
        }
        Err(e) => {
            c.remove_bell(doorbell, Bell::Qp(qpn.value()));
            let _ = c.engine.destroy_qp(qpn);
            (errno(libc::ENOMEM, &format!("{e:#}")), vec![])
        }
    }
}

/// A QP's rings, back to back (64-byte aligned) in a region of the client's ring arena; where
/// each is, as offsets in what the client maps (the chunk, or the region of its own).
fn qp_rings(
    c: &mut ClientDev,
    geometries: &[RingGeometry],
    budget: u64,
) -> anyhow::Result<(RingMemory, Vec<(SharedRing, RingPlace)>)> {
    let mut offsets = Vec::new();
    let mut at = 0usize;
    for g in geometries {
        offsets.push(at);
        at += g.byte_len().next_multiple_of(64);
    }
    let memory = c.arena.alloc("qp", at)?;
    // Checked before the region is used (device::limits).
    if RingArena::charged(&memory) > budget {
        let need = RingArena::charged(&memory);
        c.arena.free(memory);
        anyhow::bail!(
            "the rings need {need} bytes, past the ring memory limit (max_ring_bytes or \
             client_max_ring_bytes)"
        );
    }
    let (_, base) = c.arena.placement(&memory);
    let mut out = Vec::new();
    for (g, off) in geometries.iter().zip(offsets) {
        match c.arena.init_ring(&memory, off, *g) {
            Ok(ring) => out.push((
                ring,
                RingPlace {
                    offset: (base + off) as u64,
                    slot_size: g.slot_size,
                    slot_count: g.slot_count,
                },
            )),
            Err(e) => {
                drop(out);
                c.arena.free(memory);
                return Err(e);
            }
        }
    }
    Ok((memory, out))
}

pub(super) fn create_srq(
    c: &mut ClientDev,
    pd: u32,
    max_wr: u32,
    max_sge: u32,
    limit: u32,
    ring_budget: u64,
) -> (Response, Vec<OwnedFd>) {
    let Some(&(epd, pd_ctx)) = c.pds.get(&pd) else {
        return (errno(libc::EINVAL, "no such PD"), vec![]);
    };
    // SRQ events go to the context the SRQ was made in: its PD's.
    let ctx = pd_ctx;
    let max_sge = max_sge.max(1);
    // Checked first: a client's huge SGE count would overflow `max_sge * 16`.
    if max_sge > wqe::MAX_SGE as u32 {
        return (errno(libc::EINVAL, "too many SGEs"), vec![]);
    }
    let Some(g) = RingGeometry::new(max_wr.max(1), wqe::RECV_HEADER_LEN as u32 + max_sge * 16)
    else {
        return (errno(libc::EINVAL, "SRQ capacity"), vec![]);
    };
    let srq = match c.engine.create_srq(epd, g.slot_count, max_sge) {
        Ok(s) => s,
        Err(e) => return (err(e), vec![]),
    };
    let Some(doorbell) = c.add_bell(Bell::Srq(srq)) else {
        let _ = c.engine.destroy_srq(srq);
        return (errno(libc::ENOMEM, "no doorbell left"), vec![]);
    };
    if limit > 0 {
        let _ = c.engine.arm_srq_limit(srq, limit);
    }
    match rings("srq", &[g], ring_budget) {
        Ok((mut region, mut r)) => {
            let (ring, place) = r.remove(0);
            let fast = srq_fast_fd(c, &region, place);
            let fds = give_fd(&mut region);
            let region_len = region.len() as u64;
            c.ring_bytes += region_len;
            c.srqs.insert(
                srq,
                SrqState {
                    region,
                    ring,
                    max_sge,
                    pending: VecDeque::new(),
                    limit,
                    max_wr: g.slot_count,
                    ctx,
                    corrupt: false,
                    doorbell,
                    fast,
                    lent: false,
                },
            );
            (
                Response::Srq {
                    srq,
                    max_wr: g.slot_count,
                    max_sge,
                    ring: place,
                    region_len,
                    doorbell,
                },
                fds,
            )
        }
        Err(e) => {
            c.remove_bell(doorbell, Bell::Srq(srq));
            let _ = c.engine.destroy_srq(srq);
            (errno(libc::ENOMEM, &format!("{e:#}")), vec![])
        }
    }
}

/// A descriptor of an SRQ's ring region kept for the fast path, which may lend the ring
/// (within the client's [`super::fast::FD_BUDGET`]).
pub(super) fn srq_fast_fd(
    c: &mut ClientDev,
    region: &SharedRegion,
    place: RingPlace,
) -> Option<(OwnedFd, RingPlace, u64)> {
    if c.fast_fds >= super::fast::FD_BUDGET {
        return None;
    }
    let fd = region.dup_fd()?;
    c.fast_fds += 1;
    Some((fd, place, region.len() as u64))
}

pub(super) fn modify_qp(c: &mut ClientDev, qpn: u32, a: &ctl::QpAttr, mask: u32) -> Response {
    if !c.qps.contains_key(&qpn) {
        return errno(libc::EINVAL, "no such QP");
    }
    let m = AttrMask(mask);
    let attr = a.engine_attr(m);
    match attr.and_then(|attr| c.engine.modify_qp(Qpn::new(qpn), &attr, m)) {
        Ok(()) => Response::Done,
        Err(e) => err(e),
    }
}

pub(super) fn query_qp(c: &mut ClientDev, qpn: u32) -> Response {
    let Some(q) = c.qps.get(&qpn) else {
        return errno(libc::EINVAL, "no such QP");
    };
    let (cap, sq_sig_all) = (q.cap, q.sq_sig_all);
    match c.engine.query_qp(Qpn::new(qpn)) {
        Ok((state, a)) => {
            let av = a
                .ah_attr
                .unwrap_or(AddressVector::new(IpAddr::V4([0, 0, 0, 0].into())));
            Response::QpAttr {
                attr: ctl::QpAttr {
                    qp_state: state as u32,
                    cur_qp_state: state as u32,
                    path_mtu: a.path_mtu as u32,
                    qkey: a.qkey.0,
                    rq_psn: a.rq_psn.value(),
                    sq_psn: a.sq_psn.value(),
                    dest_qp_num: a.dest_qp_num.value(),
                    qp_access_flags: a.qp_access_flags.0,
                    ah_attr: ctl::AhAttr {
                        dgid: ctl::gid_of(av.dgid),
                        flow_label: av.flow_label,
                        sgid_index: av.sgid_index,
                        hop_limit: av.hop_limit,
                        traffic_class: av.traffic_class,
                        is_global: a.ah_attr.is_some(),
                        port_num: 1,
                        ..Default::default()
                    },
                    max_rd_atomic: a.max_rd_atomic,
                    max_dest_rd_atomic: a.max_dest_rd_atomic,
                    min_rnr_timer: a.min_rnr_timer,
                    port_num: 1,
                    timeout: a.timeout,
                    retry_cnt: a.retry_cnt,
                    rnr_retry: a.rnr_retry,
                    ..Default::default()
                },
                cap: ctl::QpCap {
                    max_send_wr: cap.max_send_wr,
                    max_recv_wr: cap.max_recv_wr,
                    max_send_sge: cap.max_send_sge,
                    max_recv_sge: cap.max_recv_sge,
                    max_inline_data: cap.max_inline_data,
                },
                sq_sig_all,
            }
        }
        Err(e) => err(e),
    }
}
