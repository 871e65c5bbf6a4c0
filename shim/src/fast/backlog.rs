//! What waits in a QP's send ring when the fast path takes the QP over.
//!
//! A program that keeps its send queue full (perftest, any stream) never leaves the daemon's
//! engine idle, and the daemon grants a direction only while it is: so when a take finds
//! work in flight, the daemon stops reading the QP's send ring until that work has drained
//! (`DeviceThread::hold_for_take`) and answers EBUSY. What the program posts meanwhile waits
//! in the ring; the take that follows carries it, and this process, the ring's producer,
//! reads it out as the ring's consumer once the direction is entered (the daemon reads the
//! ring no more while the QP is away, and resynchronises when it comes back). The requests
//! are decoded as the daemon decodes them, and run first, in order.

use proto::ring::wqe::{self, SendWqe};
use proto::ring::SharedRing;
use proto::transport::SendWr;

/// A QP's send ring, as a consumer sees it, with the limits its WQEs were encoded for.
#[derive(Debug)]
pub struct SendRing {
    /// A handle on the ring's memory (which lives as long as the QP: the QP's direction
    /// and this handle are dropped before it is destroyed). Each read starts from the
    /// consumer index the ring holds then.
    ring: SharedRing,
    max_sge: usize,
    max_inline: usize,
    /// The handle of the CQ the QP's send completions go to.
    pub send_cq: u32,
}

impl SendRing {
    /// The send ring whose producer is `producer`, of a QP with these limits and send CQ.
    pub fn of(
        producer: &SharedRing,
        max_sge: usize,
        max_inline: usize,
        send_cq: u32,
    ) -> Option<SendRing> {
        Some(SendRing {
            ring: producer.consumer_handle().ok()?,
            max_sge,
            max_inline,
            send_cq,
        })
    }

    /// Whether a take may carry what waits in the ring (an empty ring may): every request
    /// must be one the fast path runs without the daemon ([`super::takeable_from_ring`]).
    /// The ring is only looked at.
    pub fn takeable(&self) -> bool {
        self.read(false)
            .is_some_and(|wrs| wrs.iter().all(super::takeable_from_ring))
    }

    /// Takes what waits in the ring out of it, oldest first (once the direction is
    /// entered: nobody else reads the ring then).
    pub fn take_all(&self) -> Vec<SendWr> {
        self.read(true).unwrap_or_default()
    }

    fn read(&self, take: bool) -> Option<Vec<SendWr>> {
        let mut ring = self.ring.consumer_handle().ok()?;
        let mut slot = vec![0u8; ring.geometry().slot_size as usize];
        let mut sges = [wqe::Sge::default(); wqe::MAX_SGE];
        let mut wrs = Vec::new();
        loop {
            let next = if take {
                ring.pop(&mut slot)
            } else {
                ring.peek(&mut slot)
            };
            if !next.ok()? {
                return Some(wrs);
            }
            // Only a program that wrote into the ring's memory makes an entry that does not
            // decode: it is skipped, as the daemon skips a malformed receive WQE.
            if let Some(wr) = decode(&slot, self.max_sge, self.max_inline, &mut sges) {
                wrs.push(wr);
            }
        }
    }
}

/// A send WQE of this process's encoding (`verbs::qp`), as the fast path runs it: decoded
/// with the QP's limits, as the daemon decodes its ring, into the engine's work request.
pub fn decode(
    slot: &[u8],
    max_sge: usize,
    max_inline: usize,
    sges: &mut [wqe::Sge; wqe::MAX_SGE],
) -> Option<SendWr> {
    let d = SendWqe::decode(slot, max_sge, max_inline, sges).ok()?;
    wqe::convert::send_wr(&d, |ah| ah).ok()
}
