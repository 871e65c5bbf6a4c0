//! Resizing a CQ (`ibv_resize_cq`) or an SRQ (`ibv_modify_srq` with `IBV_SRQ_MAX_WR`), as
//! kernel rxe does both (`rxe_resize_cq`, `rxe_srq_from_attr`): the object gets a new ring of
//! the new size, in a new memfd, and the old one is dropped.
//!
//! A ring has one producer and one consumer, so the switch is ordered by the side that
//! owns the contents: for an SRQ the daemon (the consumer) takes every WQE of the old ring
//! before it answers, and the client posts only to the new one once it has the answer; for a
//! CQ the daemon (the producer) writes only to the new ring from the answer on, and the client
//! takes what the old ring still holds before the new ring's entries. The client holds its
//! side's lock for the whole request. As in rxe, the new size must hold what the queue holds
//! (EINVAL otherwise).

use super::clients::ClientDev;
use super::control::{err, errno};
use super::doorbells::Bell;
use super::objects::{give_fd, rings};
use super::work_requests::recv_wr;
use proto::ctl::Response;
use proto::ring::wqe::{self, RecvWqe};
use proto::ring::RingGeometry;
use std::os::fd::OwnedFd;

/// `ibv_resize_cq` of the client's CQ `cq` to at least `cqe` entries.
pub(super) fn resize_cq(
    c: &mut ClientDev,
    cq: u32,
    cqe: u32,
    ring_budget: u64,
) -> (Response, Vec<OwnedFd>) {
    let Some(q) = c.cqs.get(&cq) else {
        return (errno(libc::EINVAL, "no such CQ"), vec![]);
    };
    if q.in_error {
        return (errno(libc::EINVAL, "the CQ is in error (overrun)"), vec![]);
    }
    let Some(g) = (1..=1 << 20)
        .contains(&cqe)
        .then(|| RingGeometry::new(cqe + 1, wqe::CQE_SLOT_LEN as u32))
        .flatten()
    else {
        return (errno(libc::EINVAL, "cqe out of range"), vec![]);
    };
    let granted = g.slot_count - 1;
    // What the CQ holds: the old ring's entries not yet polled, and the engine's.
    let in_ring = q
        .ring
        .free()
        .map_or(u32::MAX, |free| q.ring.geometry().slot_count - free);
    let waiting = c.engine.cq_len(cq).unwrap_or(0) as u64 + u64::from(in_ring);
    if u64::from(granted) < waiting {
        return (
            errno(libc::EINVAL, "cqe below the completions the CQ holds"),
            vec![],
        );
    }
    let budget = ring_budget + q.region.len() as u64;
    let (mut region, mut made) = match rings("cq", &[g], budget) {
        Ok(r) => r,
        Err(e) => return (errno(libc::ENOMEM, &format!("{e:#}")), vec![]),
    };
    if let Err(e) = c.engine.resize_cq(cq, granted as usize) {
        return (err(e), vec![]);
    }
    let (ring, place) = made.remove(0);
    // The arming moves with the CQ.
    if let Some(solicited_only) = q.ring.armed() {
        ring.arm(solicited_only);
    }
    let fds = give_fd(&mut region);
    let region_len = region.len() as u64;
    let Some(q) = c.cqs.get_mut(&cq) else {
        return (errno(libc::EINVAL, "no such CQ"), vec![]);
    };
    c.ring_bytes = c.ring_bytes - q.region.len() as u64 + region_len;
    q.ring = ring;
    q.region = region;
    (
        Response::Cq {
            cq,
            cqe: granted,
            ring: place,
            region_len,
        },
        fds,
    )
}

/// `ibv_modify_srq` with `IBV_SRQ_MAX_WR`: the client's SRQ `srq` gets a ring of at least
/// `max_wr` WQEs.
pub(super) fn resize_srq(
    c: &mut ClientDev,
    srq: u32,
    max_wr: u32,
    ring_budget: u64,
) -> (Response, Vec<OwnedFd>) {
    let Some(s) = c.srqs.get_mut(&srq) else {
        return (errno(libc::EINVAL, "no such SRQ"), vec![]);
    };
    if s.corrupt {
        return (errno(libc::EINVAL, "the SRQ is in error"), vec![]);
    }
    let Some(g) = RingGeometry::new(max_wr.max(1), wqe::RECV_HEADER_LEN as u32 + s.max_sge * 16)
    else {
        return (errno(libc::EINVAL, "SRQ capacity"), vec![]);
    };
    // Every WQE the client posted to the old ring is taken first (into `pending`, for the
    // engine as it has room): none may stay behind in a ring that is about to go.
    let mut slot = vec![0u8; s.ring.geometry().slot_size as usize];
    let mut sges = [wqe::Sge::default(); wqe::MAX_SGE];
    while let Ok(true) = s.ring.pop(&mut slot) {
        match RecvWqe::decode(&slot, s.max_sge as usize, &mut sges) {
            Ok(w) => s.pending.push_back(recv_wr(&w)),
            Err(_) => {
                s.corrupt = true;
                c.srq_error(srq);
                return (errno(libc::EINVAL, "the SRQ is in error"), vec![]);
            }
        }
    }
    let held = c.engine.srq_len(srq).unwrap_or(0) + s.pending.len();
    if (g.slot_count as usize) < held {
        return (
            errno(libc::EINVAL, "max_wr below the WQEs the SRQ holds"),
            vec![],
        );
    }
    let budget = ring_budget + s.region.len() as u64;
    let (mut region, mut made) = match rings("srq", &[g], budget) {
        Ok(r) => r,
        Err(e) => return (errno(libc::ENOMEM, &format!("{e:#}")), vec![]),
    };
    if let Err(e) = c.engine.resize_srq(srq, g.slot_count) {
        return (err(e), vec![]);
    }
    let (ring, place) = made.remove(0);
    // The fast path's descriptor follows the ring into its new region.
    if c.srqs.get_mut(&srq).and_then(|s| s.fast.take()).is_some() {
        c.fast_fds -= 1;
    }
    let fast = super::objects::srq_fast_fd(c, &region, place);
    let fds = give_fd(&mut region);
    let region_len = region.len() as u64;
    let Some(s) = c.srqs.get_mut(&srq) else {
        return (errno(libc::EINVAL, "no such SRQ"), vec![]);
    };
    s.fast = fast;
    c.ring_bytes = c.ring_bytes - s.region.len() as u64 + region_len;
    s.ring = ring;
    s.region = region;
    s.max_wr = g.slot_count;
    let doorbell = s.doorbell;
    // What was taken from the old ring waits for the engine ([`ClientDev::waiting`]).
    if !s.pending.is_empty() {
        c.waiting.insert(Bell::Srq(srq));
    }
    (
        Response::Srq {
            srq,
            max_wr: g.slot_count,
            max_sge: s.max_sge,
            ring: place,
            region_len,
            doorbell,
        },
        fds,
    )
}
