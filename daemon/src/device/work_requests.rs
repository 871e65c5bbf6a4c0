//! Posted work: send and receive WQEs taken from the shared rings, validated and translated
//! into the engine's work requests. The client is not trusted: every slot is copied out and
//! decoded with checked lengths, and a request the engine refuses still completes (in error),
//! as the program must get a completion for every signaled request it posted.

use super::clients::ClientDev;
use super::DeviceThread;
use proto::ring::wqe::{self, Cqe, RecvWqe, SendData, SendWqe, WrOpcode};
use proto::transport::{
    self as tp, Access, RecvWr, RemoteAddr, SendFlags, SendOp, SendWr, UdDest, VerbsError,
};
use proto::{Qpn, Rkey};
use tracing::debug;

impl DeviceThread {
    /// Moves posted work from every client's rings into its engine. Returns whether any was
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

/// Converts a decoded send WQE into the engine's work request.
fn send_wr(w: &SendWqe<'_>) -> Result<SendWr, &'static str> {
    let remote = RemoteAddr {
        va: w.remote_addr,
        rkey: w.rkey,
    };
    let op = match w.opcode {
        WrOpcode::Send => SendOp::Send,
        // `ibv_send_wr.imm_data` is __be32: the slot holds the bytes the application stored,
        // which go on the wire as they are; the engine's immediate is the ImmDt field's
        // big-endian value. (Softroce to softroce the two swaps cancelled out; kernel rxe read
        // udaddy's QPN from the immediate swapped and answered the wrong QP.)
        WrOpcode::SendWithImm => SendOp::SendWithImm(u32::from_be(w.imm_or_inv)),
        WrOpcode::SendWithInv => SendOp::SendWithInv(Rkey(w.imm_or_inv)),
        WrOpcode::RdmaWrite => SendOp::Write(remote),
        WrOpcode::RdmaWriteWithImm => SendOp::WriteWithImm(remote, u32::from_be(w.imm_or_inv)),
        WrOpcode::RdmaRead => SendOp::Read(remote),
        WrOpcode::AtomicCmpAndSwp => SendOp::CompareSwap {
            remote,
            compare: w.compare_add,
            swap: w.swap,
        },
        WrOpcode::AtomicFetchAndAdd => SendOp::FetchAdd {
            remote,
            add: w.compare_add,
        },
        WrOpcode::AtomicWrite => SendOp::AtomicWrite {
            remote,
            value: w.compare_add,
        },
        WrOpcode::Flush => SendOp::Flush {
            remote,
            len: w.compare_add as u32,
            placement: w.swap as u8,
        },
        WrOpcode::LocalInv => SendOp::LocalInv(Rkey(w.imm_or_inv)),
        WrOpcode::BindMw => {
            let b = w.bind.ok_or("bind without its arguments")?;
            SendOp::BindMw {
                mw_rkey: b.mw_rkey,
                mr_lkey: b.mr_lkey,
                addr: b.addr,
                length: b.length,
                access: Access(b.access),
                // The low byte of the new R_Key is the consumer's key (ibv_inc_rkey).
                key: b.new_rkey.0 as u8,
            }
        }
    };
    let (sg_list, inline_data) = match w.data {
        SendData::Sges(s) => (s.to_vec(), Vec::new()),
        SendData::Inline(d) => (Vec::new(), d.to_vec()),
    };
    Ok(SendWr {
        wr_id: w.wr_id,
        op,
        sg_list,
        inline_data,
        flags: SendFlags(w.flags & wqe::send_flags::ALL),
        ud: w.ud.map(|u| UdDest {
            // The shim names the AH by the handle it was given, which carries the device index.
            ah: u.ah & super::handles::HANDLE_MASK,
            ..u
        }),
    })
}

fn recv_wr(w: &RecvWqe<'_>) -> RecvWr {
    RecvWr {
        wr_id: w.wr_id,
        sg_list: w.sges.to_vec(),
    }
}

/// A completion with an error status for a work request the engine refused at post time.
fn refused(wr_id: u64, qpn: u32, opcode: u32) -> Cqe {
    Cqe {
        wr_id,
        status: tp::WcStatus::LocQpOpErr as u32,
        opcode,
        qp_num: qpn,
        ..Cqe::default()
    }
}

/// Moves posted work from the rings into the engine. Returns whether any was found.
fn pump_rings(c: &mut ClientDev, slot: &mut [u8]) -> bool {
    let mut busy = false;
    let mut sges = [wqe::Sge::default(); wqe::MAX_SGE];
    let mut refusals: Vec<(u32, Cqe)> = Vec::new();
    for (&qpn, q) in c.qps.iter_mut() {
        // Stop taking from the ring while earlier work still waits for the engine.
        while q.pending_send.is_empty() {
            match q.sq.pop(slot) {
                Ok(true) => {}
                _ => break,
            }
            busy = true;
            let decoded = SendWqe::decode(
                slot,
                q.cap.max_send_sge as usize,
                q.cap.max_inline_data as usize,
                &mut sges,
            );
            match decoded
                .map_err(|_| "malformed")
                .and_then(|w| send_wr(&w).map_err(|_| "unsupported"))
            {
                // The engine keeps the request itself (no copy) unless its queue is full.
                Ok(wr) if c.engine.sq_room(Qpn::new(qpn)) == Some(0) => {
                    q.pending_send.push_back(wr)
                }
                Ok(wr) => {
                    let (wr_id, opcode) = (wr.wr_id, wr.op.wc_opcode() as u32);
                    if let Err(e) = c.engine.post_send(Qpn::new(qpn), wr) {
                        debug!(qpn, "send refused: {e}");
                        refusals.push((q.send_cq, refused(wr_id, qpn, opcode)));
                    }
                }
                Err(why) => {
                    let wr_id = u64::from_ne_bytes(slot[..8].try_into().unwrap_or([0; 8]));
                    debug!(qpn, "send WQE {why}");
                    refusals.push((q.send_cq, refused(wr_id, qpn, 0)));
                }
            }
        }
        if let Some(rq) = &mut q.rq {
            while q.pending_recv.is_empty() {
                match rq.pop(slot) {
                    Ok(true) => {}
                    _ => break,
                }
                busy = true;
                let Ok(w) = RecvWqe::decode(slot, q.cap.max_recv_sge as usize, &mut sges) else {
                    continue;
                };
                let wr = recv_wr(&w);
                match c.engine.post_recv(Qpn::new(qpn), wr.clone()) {
                    Ok(()) => {}
                    Err(VerbsError::NoResources(_)) => q.pending_recv.push_back(wr),
                    Err(e) => debug!(qpn, "receive refused: {e}"),
                }
            }
        }
    }
    for (&h, s) in c.srqs.iter_mut() {
        while s.pending.is_empty() {
            match s.ring.pop(slot) {
                Ok(true) => {}
                _ => break,
            }
            busy = true;
            let Ok(w) = RecvWqe::decode(slot, s.max_sge as usize, &mut sges) else {
                continue;
            };
            let wr = recv_wr(&w);
            match c.engine.post_srq_recv(h, wr.clone()) {
                Ok(()) => {}
                Err(VerbsError::NoResources(_)) => s.pending.push_back(wr),
                Err(e) => debug!(srq = h, "SRQ receive refused: {e}"),
            }
        }
    }
    push_refusals(c, refusals);
    busy
}

/// Completes refused send requests with an error in their CQ (`(cq, cqe)` pairs).
fn push_refusals(c: &mut ClientDev, refusals: Vec<(u32, Cqe)>) {
    for (cq, cqe) in refusals {
        if let Some(q) = c.cqs.get_mut(&cq) {
            let mut b = [0u8; wqe::CQE_SLOT_LEN];
            cqe.encode(&mut b);
            let _ = q.ring.push(&b);
        }
    }
}

pub(super) fn retry_pending(c: &mut ClientDev) -> bool {
    let mut busy = false;
    let mut refusals: Vec<(u32, Cqe)> = Vec::new();
    for (&qpn, q) in c.qps.iter_mut() {
        while c.engine.sq_room(Qpn::new(qpn)).is_some_and(|r| r > 0) {
            let Some(wr) = q.pending_send.pop_front() else {
                break;
            };
            busy = true;
            // Refused as it would have been had it found room at once (pump_rings): the
            // program must get a completion for it.
            let (wr_id, opcode) = (wr.wr_id, wr.op.wc_opcode() as u32);
            if let Err(e) = c.engine.post_send(Qpn::new(qpn), wr) {
                debug!(qpn, "send refused: {e}");
                refusals.push((q.send_cq, refused(wr_id, qpn, opcode)));
            }
        }
        while let Some(wr) = q.pending_recv.front() {
            match c.engine.post_recv(Qpn::new(qpn), wr.clone()) {
                Err(VerbsError::NoResources(_)) => break,
                _ => {
                    q.pending_recv.pop_front();
                    busy = true;
                }
            }
        }
    }
    for (&h, s) in c.srqs.iter_mut() {
        while let Some(wr) = s.pending.front() {
            match c.engine.post_srq_recv(h, wr.clone()) {
                Err(VerbsError::NoResources(_)) => break,
                _ => {
                    s.pending.pop_front();
                    busy = true;
                }
            }
        }
    }
    push_refusals(c, refusals);
    busy
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::completions::cqe_of;
    use proto::ring::wqe::SendData;
    use proto::transport::{self as tp, WorkCompletion};
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
        };
        assert_eq!(
            cqe_of(&wc).imm_or_inv.to_ne_bytes(),
            [0x01, 0x02, 0x03, 0x04]
        );
    }
}
