//! Posted work: send and receive WQEs taken from the shared rings, validated and translated
//! into the engine's work requests. The client is not trusted: every slot is copied out and
//! decoded with checked lengths, and a request the engine refuses still completes (in error),
//! as the program must get a completion for every signaled request it posted.

use super::clients::ClientDev;
use super::doorbells::Bell;
use super::DeviceThread;
use proto::ring::wqe::{self, RecvWqe, SendWqe};
use proto::transport::{self as tp, RecvWr, SendWr, VerbsError, WorkCompletion};
use proto::Qpn;
use tracing::debug;

impl DeviceThread {
    /// Moves posted work from the rings of every client that rang into its engine. Returns whether any was
    /// found; clients whose engine panicked are added to `broken`.
    pub(super) fn take_posted_work(&mut self, broken: &mut Vec<u64>) -> bool {
        let mut busy = false;
        for (&id, c) in self.clients.iter_mut() {
            match super::clients::contained(|| pump_rings(c, &mut self.slot)) {
                Some(b) => busy |= b,
                None => broken.push(id),
            }
        }
        busy
    }
}

/// Converts a decoded send WQE into the engine's work request (`SendWqe::work_request`, which
/// the ring fuzz target drives too), the AH named by the engine's handle.
fn send_wr(w: &SendWqe<'_>) -> Result<SendWr, &'static str> {
    let mut wr = w.work_request()?;
    if let Some(u) = wr.ud.as_mut() {
        // The shim names the AH by the handle it was given, which carries the device index.
        u.ah &= super::handles::HANDLE_MASK;
    }
    Ok(wr)
}

pub(super) fn recv_wr(w: &RecvWqe<'_>) -> RecvWr {
    w.work_request()
}

/// A completion with an error status for a work request the engine refused at post time, or
/// that could not be decoded (IBV_WC_LOC_QP_OP_ERR: "an internal QP consistency error was
/// detected while processing this work request").
fn refused(wr_id: u64, qpn: u32, opcode: tp::WcOpcode) -> WorkCompletion {
    WorkCompletion::new(wr_id, tp::WcStatus::LocQpOpErr, opcode, Qpn::new(qpn))
}

/// The `wr_id` a slot's first 8 bytes hold, whatever the rest says.
fn slot_wr_id(slot: &[u8]) -> u64 {
    u64::from_ne_bytes(
        slot.get(..8)
            .and_then(|b| b.try_into().ok())
            .unwrap_or([0; 8]),
    )
}

/// What to do once the rings of one client are read: error completions to push, and QPs
/// whose work queue held a WQE that could not be decoded (a corrupt queue: the QP goes to
/// ERR with IBV_EVENT_QP_FATAL, as an adapter does on a malformed WQE), and SRQs likewise.
#[derive(Default)]
struct Outcome {
    refusals: Vec<(u32, WorkCompletion)>,
    corrupt_qps: Vec<u32>,
    corrupt_srqs: Vec<u32>,
}

impl Outcome {
    /// A WQE that could not be decoded: completed in error, and its QP to ERR.
    fn malformed(&mut self, cq: u32, qpn: u32, slot: &[u8], opcode: tp::WcOpcode) {
        self.refusals
            .push((cq, refused(slot_wr_id(slot), qpn, opcode)));
        self.corrupt_qps.push(qpn);
    }
}

/// Moves posted work from the rings whose doorbell rang (and the ones to read again) into
/// the engine. Returns whether any was found. Rings nobody posted to are not looked at.
fn pump_rings(c: &mut ClientDev, slot: &mut [u8]) -> bool {
    let mut rung = std::mem::take(&mut c.revisit);
    if let Some(t) = &c.bells {
        t.take(&mut rung);
    }
    if rung.is_empty() {
        c.revisit = rung;
        return false;
    }
    // A QP rung twice (its two queues, or posted to again after a revisit) is read once.
    rung.sort_unstable();
    rung.dedup();
    let mut busy = false;
    let mut sges = [wqe::Sge::default(); wqe::MAX_SGE];
    let mut out = Outcome::default();
    for &bell in &rung {
        match bell {
            Bell::Qp(qpn) => {
                let Some(q) = c.qps.get_mut(&qpn) else {
                    continue;
                };
                busy |= pump_qp(&mut c.engine, qpn, q, slot, &mut sges, &mut out);
                if !q.pending_send.is_empty() || !q.pending_recv.is_empty() {
                    c.waiting.insert(bell);
                }
            }
            Bell::Srq(h) => {
                // An SRQ lent to the process that runs its QP's responder is its to read.
                let Some(s) = c.srqs.get_mut(&h).filter(|s| !s.lent) else {
                    continue;
                };
                busy |= pump_srq(&mut c.engine, h, s, slot, &mut sges, &mut out);
                if !s.pending.is_empty() {
                    c.waiting.insert(bell);
                }
            }
        }
    }
    rung.clear();
    c.revisit = rung;
    finish(c, out);
    busy
}

/// Reads one QP's send and receive rings.
fn pump_qp(
    engine: &mut super::clients::Engine,
    qpn: u32,
    q: &mut super::clients::QpHost,
    slot: &mut [u8],
    sges: &mut [wqe::Sge; wqe::MAX_SGE],
    out: &mut Outcome,
) -> bool {
    let mut busy = false;
    // A queue that held garbage is not read again: the QP is in ERR.
    if q.corrupt {
        return false;
    }
    // Stop taking from the ring while earlier work still waits for the engine, while the
    // requester runs in the client (the same-host fast path: the ring is read again once the
    // direction is back), and while the ring is held for the fast path to take over.
    while q.pending_send.is_empty() && !q.away && !q.held {
        match q.sq.pop(slot) {
            Ok(true) => {}
            Ok(false) => break,
            // Indices that make no sense: the client wrote into the ring's header.
            Err(e) => {
                debug!(qpn, "send ring corrupt ({e:?}): QP to ERR");
                out.corrupt_qps.push(qpn);
                q.corrupt = true;
                break;
            }
        }
        busy = true;
        let decoded = SendWqe::decode(
            slot,
            q.cap.max_send_sge as usize,
            q.cap.max_inline_data as usize,
            sges,
        );
        match decoded {
            Ok(w) => match send_wr(&w) {
                // The engine keeps the request itself (no copy) unless its queue is full.
                Ok(wr) if engine.sq_room(Qpn::new(qpn)) == Some(0) => q.pending_send.push_back(wr),
                Ok(wr) => {
                    let (wr_id, opcode) = (wr.wr_id, wr.op.wc_opcode());
                    if let Err(e) = engine.post_send(Qpn::new(qpn), wr) {
                        debug!(qpn, "send refused: {e}");
                        out.refusals.push((q.send_cq, refused(wr_id, qpn, opcode)));
                    }
                }
                // A well-formed request the device does not do: refused, as a verb
                // would refuse it at post time.
                Err(why) => {
                    debug!(qpn, "send WQE refused: {why}");
                    out.refusals
                        .push((q.send_cq, refused(w.wr_id, qpn, tp::WcOpcode::Send)));
                }
            },
            Err(e) => {
                debug!(qpn, "send WQE malformed ({e:?}): QP to ERR");
                out.malformed(q.send_cq, qpn, slot, tp::WcOpcode::Send);
                q.corrupt = true;
                break;
            }
        }
    }
    if q.corrupt {
        return busy;
    }
    // A receive ring lent to the process that runs this QP's responder is its to read.
    if let Some(rq) = q.rq.as_mut().filter(|_| !q.lent) {
        while q.pending_recv.is_empty() {
            match rq.pop(slot) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    debug!(qpn, "receive ring corrupt ({e:?}): QP to ERR");
                    out.corrupt_qps.push(qpn);
                    q.corrupt = true;
                    break;
                }
            }
            busy = true;
            let w = match RecvWqe::decode(slot, q.cap.max_recv_sge as usize, sges) {
                Ok(w) => w,
                Err(e) => {
                    // Never skipped: the program gets a completion for it, in error.
                    debug!(qpn, "receive WQE malformed ({e:?}): QP to ERR");
                    out.malformed(q.recv_cq, qpn, slot, tp::WcOpcode::Recv);
                    q.corrupt = true;
                    break;
                }
            };
            let wr = recv_wr(&w);
            match engine.post_recv(Qpn::new(qpn), wr.clone()) {
                Ok(()) => {}
                Err(VerbsError::NoResources(_)) => q.pending_recv.push_back(wr),
                Err(e) => {
                    debug!(qpn, "receive refused: {e}");
                    out.refusals
                        .push((q.recv_cq, refused(wr.wr_id, qpn, tp::WcOpcode::Recv)));
                }
            }
        }
    }
    busy
}

/// Reads one SRQ's ring.
fn pump_srq(
    engine: &mut super::clients::Engine,
    h: u32,
    s: &mut super::clients::SrqState,
    slot: &mut [u8],
    sges: &mut [wqe::Sge; wqe::MAX_SGE],
    out: &mut Outcome,
) -> bool {
    let mut busy = false;
    while s.pending.is_empty() && !s.corrupt {
        match s.ring.pop(slot) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => {
                debug!(srq = h, "SRQ ring corrupt ({e:?}): SRQ in error");
                s.corrupt = true;
                out.corrupt_srqs.push(h);
                break;
            }
        }
        busy = true;
        let Ok(w) = RecvWqe::decode(slot, s.max_sge as usize, sges) else {
            // No CQ belongs to an SRQ: the SRQ is in error (IBV_EVENT_SRQ_ERR) and its
            // ring is not read again.
            debug!(srq = h, "SRQ receive WQE malformed: SRQ in error");
            s.corrupt = true;
            out.corrupt_srqs.push(h);
            break;
        };
        let wr = recv_wr(&w);
        match engine.post_srq_recv(h, wr.clone()) {
            Ok(()) => {}
            Err(VerbsError::NoResources(_)) => s.pending.push_back(wr),
            Err(e) => debug!(srq = h, "SRQ receive refused: {e}"),
        }
    }
    busy
}

/// Completes refused work requests with an error in their CQ (through the engine, so that a
/// full CQ overruns as for any completion), moves QPs whose queue was corrupt to ERR, and
/// reports SRQs in error.
fn finish(c: &mut ClientDev, out: Outcome) {
    for (cq, wc) in out.refusals {
        c.engine.push_completion(cq, wc);
    }
    for qpn in out.corrupt_qps {
        let _ = c.engine.fail_qp(Qpn::new(qpn), false);
    }
    for srq in out.corrupt_srqs {
        c.srq_error(srq);
    }
}

/// Gives the engine the work that waited for room in it, for the QPs and SRQs that have
/// some (`ClientDev::waiting`): one whose wait is over has its ring read again on the next pass.
pub(super) fn retry_pending(c: &mut ClientDev) -> bool {
    if c.waiting.is_empty() {
        return false;
    }
    let mut busy = false;
    let mut out = Outcome::default();
    let waiting: Vec<Bell> = c.waiting.iter().copied().collect();
    for bell in waiting {
        let drained = match bell {
            Bell::Qp(qpn) => match c.qps.get_mut(&qpn) {
                Some(q) => {
                    busy |= retry_qp(&mut c.engine, qpn, q, &mut out);
                    q.pending_send.is_empty() && q.pending_recv.is_empty()
                }
                None => true,
            },
            Bell::Srq(h) => match c.srqs.get_mut(&h) {
                Some(s) => {
                    while let Some(wr) = s.pending.front() {
                        match c.engine.post_srq_recv(h, wr.clone()) {
                            Err(VerbsError::NoResources(_)) => break,
                            _ => {
                                s.pending.pop_front();
                                busy = true;
                            }
                        }
                    }
                    s.pending.is_empty()
                }
                None => true,
            },
        };
        if drained {
            c.waiting.remove(&bell);
            c.revisit.push(bell);
        }
    }
    finish(c, out);
    busy
}

fn retry_qp(
    engine: &mut super::clients::Engine,
    qpn: u32,
    q: &mut super::clients::QpHost,
    out: &mut Outcome,
) -> bool {
    let mut busy = false;
    while engine.sq_room(Qpn::new(qpn)).is_some_and(|r| r > 0) {
        let Some(wr) = q.pending_send.pop_front() else {
            break;
        };
        busy = true;
        // Refused as it would have been had it found room at once (pump_qp): the program
        // must get a completion for it.
        let (wr_id, opcode) = (wr.wr_id, wr.op.wc_opcode());
        if let Err(e) = engine.post_send(Qpn::new(qpn), wr) {
            debug!(qpn, "send refused: {e}");
            out.refusals.push((q.send_cq, refused(wr_id, qpn, opcode)));
        }
    }
    while let Some(wr) = q.pending_recv.front() {
        match engine.post_recv(Qpn::new(qpn), wr.clone()) {
            Err(VerbsError::NoResources(_)) => break,
            done => {
                if let Err(e) = done {
                    debug!(qpn, "receive refused: {e}");
                    out.refusals
                        .push((q.recv_cq, refused(wr.wr_id, qpn, tp::WcOpcode::Recv)));
                }
                q.pending_recv.pop_front();
                busy = true;
            }
        }
    }
    busy
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::completions::cqe_of;
    use proto::ring::wqe::{SendData, WrOpcode};
    use proto::transport::{self as tp, SendOp, WorkCompletion};
    use proto::{Qpn, Rkey};

    /// `imm_data` is __be32 in `ibv_send_wr` and `ibv_wc`: the bytes the application stores
    /// are the bytes on the wire, and the bytes on the wire are the bytes it reads back. Two
    /// softroce daemons cannot tell a swap on both ends apart, kernel rxe can (udaddy).
    #[test]
    fn immediate_data_keeps_the_applications_byte_order() {
        let stored = u32::from_ne_bytes([0x01, 0x02, 0x03, 0x04]); // htobe32(0x01020304)
        let w = SendWqe {
            wr_id: 1,
            opcode: WrOpcode::SendWithImm,
            flags: 0,
            imm_or_inv: stored,
            remote_addr: 0,
            rkey: Rkey(0),
            compare_add: 0,
            swap: 0,
            ud: None,
            bind: None,
            data: SendData::Sges(&[]),
        };
        let wr = send_wr(&w).expect("a valid WQE");
        // The engine's immediate is the ImmDt field's big-endian value: 01 02 03 04 on the wire.
        assert_eq!(wr.op, SendOp::SendWithImm(0x0102_0304));
        let wc = WorkCompletion {
            wr_id: 1,
            status: tp::WcStatus::Success,
            opcode: tp::WcOpcode::Recv,
            byte_len: 0,
            imm_data: 0x0102_0304,
            invalidated_rkey: 0,
            qp_num: Qpn::new(1),
            src_qp: Qpn::new(2),
            wc_flags: tp::WcFlags::WITH_IMM,
            solicited: false,
            sl: 0,
        };
        assert_eq!(
            cqe_of(&wc).imm_or_inv.to_ne_bytes(),
            [0x01, 0x02, 0x03, 0x04]
        );
    }
}
