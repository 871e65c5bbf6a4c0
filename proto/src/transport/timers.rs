//! Transport timer values (IBTA Vol. 1 §9.7.6.1.3 and table 46), in nanoseconds of the
//! caller's clock, and the queue of the QPs' deadlines.

use crate::types::Qpn;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Nanoseconds. The engine reads no clock: every entry point takes `now` in this unit.
pub type Nanos = u64;

/// Local ACK timeout: 4.096 µs × 2^timeout; 0 disables the timer (rxe, IBTA C9-140).
pub fn ack_timeout(timeout: u8) -> Option<Nanos> {
    if timeout == 0 {
        None
    } else {
        Some(4096u64 << timeout.min(31))
    }
}

/// The RNR NAK timer table in microseconds, code 0..31, including rxe's typo for code 25
/// (61410 instead of 61440; roce-rxe-facts.md §4.6), which the wire peer cannot see anyway.
const RNR_TIMER_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_410, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

/// How long a requester waits after an RNR NAK carrying `code`.
pub fn rnr_delay(code: u8) -> Nanos {
    u64::from(RNR_TIMER_US[(code & 0x1f) as usize]) * 1_000
}

/// The QPs' deadlines (retransmission, RNR wait, pacing) in time order, so that finding the
/// next one and running the due ones do not visit every QP: an idle device with 100,000 QPs
/// has nothing to look at.
///
/// A QP has at most one live entry, at the time of its earliest deadline when it was armed
/// (`Qp::timer_at`); its deadlines themselves stay in the QP, where the requester and the
/// completer set and clear them. Arming again only adds an entry when a deadline moved
/// earlier, so the retransmission timer restarted by every ACK costs nothing here: its old
/// entry comes due, finds the deadline later, and is re-armed once. Entries of QPs whose
/// deadline went away (or that were destroyed) are dropped when they come due.
#[derive(Debug, Clone, Default)]
pub(crate) struct TimerQueue {
    heap: BinaryHeap<Reverse<(Nanos, Qpn)>>,
}

impl TimerQueue {
    /// Makes sure the QP's earliest deadline `next` has an entry; `armed` is the QP's
    /// `timer_at`, updated.
    #[inline]
    pub fn arm(&mut self, qpn: Qpn, next: Option<Nanos>, armed: &mut Option<Nanos>) {
        if let Some(t) = next {
            if armed.is_none_or(|a| t < a) {
                self.heap.push(Reverse((t, qpn)));
                *armed = Some(t);
            }
        }
    }

    /// The earliest entry's time (it may find nothing due when it comes).
    pub fn next(&self) -> Option<Nanos> {
        self.heap.peek().map(|Reverse((t, _))| *t)
    }

    /// Takes the entries due at `now`, calling `due(qpn, time)` for each.
    pub fn pop_due(&mut self, now: Nanos, mut due: impl FnMut(Qpn, Nanos)) {
        while let Some(&Reverse((t, qpn))) = self.heap.peek() {
            if t > now {
                break;
            }
            self.heap.pop();
            due(qpn, t);
        }
    }

    /// Entries queued (live and stale).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_values() {
        assert_eq!(ack_timeout(0), None);
        assert_eq!(ack_timeout(1), Some(8192));
        // timeout 14 is about 67 ms.
        assert_eq!(ack_timeout(14), Some(4096 << 14));
        assert_eq!(rnr_delay(0), 655_360_000);
        assert_eq!(rnr_delay(1), 10_000);
        assert_eq!(rnr_delay(25), 61_410_000);
        assert_eq!(rnr_delay(31), 491_520_000);
    }

    #[test]
    fn a_later_deadline_adds_nothing_an_earlier_one_an_entry() {
        let mut q = TimerQueue::default();
        let (a, b) = (Qpn::new(20), Qpn::new(21));
        let (mut at_a, mut at_b) = (None, None);
        q.arm(a, Some(100), &mut at_a);
        // Restarted later (an ACK): nothing new.
        q.arm(a, Some(150), &mut at_a);
        q.arm(b, Some(50), &mut at_b);
        q.arm(b, Some(40), &mut at_b);
        assert_eq!((q.len(), at_a, at_b), (3, Some(100), Some(40)));
        assert_eq!(q.next(), Some(40));
        let mut seen = Vec::new();
        q.pop_due(100, |qpn, t| seen.push((qpn, t)));
        assert_eq!(seen, [(b, 40), (b, 50), (a, 100)]);
        assert_eq!(q.next(), None);
    }
}
