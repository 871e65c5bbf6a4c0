//! The QP numbers a device hands out: one or more ranges (a daemon gives each client process
//! blocks of its own, and another block when one is used up), drawn in order (as rxe numbers
//! them, for tests and the simulator) or at random among the free ones (so that a QPN cannot be
//! guessed from another, ReDMArk).
//!
//! A released QPN is not drawn again at once: it waits behind the [`QUARANTINE`] released
//! after it (or until nothing else is free). A connection keeps its QPNs in CM timewait for
//! a while after the QP is gone (2^(PLT+1-8) ms: half a second for the packet lifetime 16 of
//! softroce's routes, longer toward a peer whose path says more), and a new QP
//! drawn with a QPN still there is refused as a stale connection (REJ 10): a persistent
//! server (`rping -s -P`, about 70 connections a second) met one every few hundred
//! connections and exited. rxe and hardware allocate QPNs cyclically, so a QPN comes back
//! only after the whole space; the quarantine gives the random draws the same property for
//! any rate of churn below `QUARANTINE` QPs per timewait.
//!
//! Both draws and releases are O(1) whatever the QPs held: the random draw is a Fisher-Yates
//! shuffle done lazily. Each range keeps its free numbers as the first `free` positions of a
//! permutation of its offsets, of which only the positions that moved are stored; drawing picks
//! a random position below `free`, takes what it holds, and moves the last free one there.

use super::engine::IntMap;
use std::collections::VecDeque;

/// How many released QPNs wait before the oldest may be drawn again.
pub(crate) const QUARANTINE: usize = 16_384;

/// One range of QPNs, `first..first + len`.
#[derive(Debug, Clone)]
struct Range {
    first: u32,
    len: u32,
    /// Positions `0..free` hold the free offsets.
    free: u32,
    /// The permutation where it is not the identity (position -> offset).
    moved: IntMap<u32, u32>,
    /// In-order draws: the next offset never handed out (in-order QPNs are not reused).
    next: u32,
}

impl Range {
    fn holds(&self, qpn: u32) -> bool {
        qpn >= self.first && qpn - self.first < self.len
    }

    fn at(&self, position: u32) -> u32 {
        self.moved.get(&position).copied().unwrap_or(position)
    }

    /// Takes the offset at `position` (< free) out of the free ones.
    fn take(&mut self, position: u32) -> u32 {
        let offset = self.at(position);
        let last = self.free - 1;
        let last_offset = self.at(last);
        self.moved.remove(&last);
        if position != last {
            self.moved.insert(position, last_offset);
        }
        self.free -= 1;
        offset
    }

    fn give_back(&mut self, offset: u32) {
        if offset != self.free {
            self.moved.insert(self.free, offset);
        }
        self.free += 1;
    }
}

/// The QPNs of one device.
#[derive(Debug, Clone)]
pub(crate) struct QpnPool {
    ranges: Vec<Range>,
    random: bool,
    /// Free QPNs over all ranges (random draws).
    free: u64,
    /// Released QPNs not yet free again, oldest first (random draws).
    quarantine: VecDeque<u32>,
}

impl QpnPool {
    pub fn new(first: u32, end: u32, random: bool) -> QpnPool {
        let mut pool = QpnPool {
            ranges: Vec::new(),
            random,
            free: 0,
            quarantine: VecDeque::new(),
        };
        pool.add(first, end);
        pool
    }

    /// Adds the QPNs `first..end` (not overlapping any range the pool has).
    pub fn add(&mut self, first: u32, end: u32) {
        let len = end.saturating_sub(first);
        if len == 0 {
            return;
        }
        self.ranges.push(Range {
            first,
            len,
            free: len,
            moved: IntMap::default(),
            next: 0,
        });
        self.free += u64::from(len);
    }

    /// A free QPN: the next in order, or with `random` one at random among the free ones,
    /// `pick` being a uniformly random u64. `None` when every QPN is in use.
    pub fn draw(&mut self, pick: impl FnOnce() -> u64) -> Option<u32> {
        if !self.random {
            let r = self.ranges.iter_mut().find(|r| r.next < r.len)?;
            r.next += 1;
            return Some(r.first + r.next - 1);
        }
        if self.free == 0 {
            // Rather the oldest released QPN than none.
            let q = self.quarantine.pop_front()?;
            self.free_again(q);
        }
        if self.free == 0 {
            return None;
        }
        let mut position = pick() % self.free;
        for r in &mut self.ranges {
            if position < u64::from(r.free) {
                self.free -= 1;
                return Some(r.first + r.take(position as u32));
            }
            position -= u64::from(r.free);
        }
        None
    }

    /// Gives back a QPN drawn from the pool (random draws; in-order QPNs are not reused): it
    /// is free again after [`QUARANTINE`] later releases.
    pub fn release(&mut self, qpn: u32) {
        if !self.random || !self.ranges.iter().any(|r| r.holds(qpn)) {
            return;
        }
        self.quarantine.push_back(qpn);
        if self.quarantine.len() > QUARANTINE {
            if let Some(q) = self.quarantine.pop_front() {
                self.free_again(q);
            }
        }
    }

    /// Puts a released QPN back among the free ones.
    fn free_again(&mut self, qpn: u32) {
        if let Some(r) = self.ranges.iter_mut().find(|r| r.holds(qpn)) {
            if r.free < r.len {
                r.give_back(qpn - r.first);
                self.free += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// A small deterministic generator for the draws.
    fn rng(seed: &mut u64) -> u64 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    }

    #[test]
    fn in_order_draws_walk_the_ranges_and_end() {
        let mut p = QpnPool::new(17, 20, false);
        p.add(100, 102);
        let got: Vec<u32> = std::iter::from_fn(|| p.draw(|| 0)).collect();
        assert_eq!(got, [17, 18, 19, 100, 101]);
        p.release(18);
        assert_eq!(p.draw(|| 0), None, "in-order QPNs are not reused");
    }

    #[test]
    fn random_draws_are_unique_cover_every_range_and_come_back_when_released() {
        let mut seed = 0x1234_5678_9abc_def1;
        let mut p = QpnPool::new(1000, 1100, true);
        p.add(5000, 5050);
        let mut got = HashSet::new();
        while let Some(q) = p.draw(|| rng(&mut seed)) {
            assert!((1000..1100).contains(&q) || (5000..5050).contains(&q));
            assert!(got.insert(q), "{q} drawn twice");
        }
        assert_eq!(got.len(), 150);
        for q in [1000, 1057, 5049] {
            p.release(q);
        }
        let again: HashSet<u32> = std::iter::from_fn(|| p.draw(|| rng(&mut seed))).collect();
        assert_eq!(again, HashSet::from([1000, 1057, 5049]));
        // A QPN that was never drawn (or from no range) is not taken in twice.
        p.release(7);
        assert_eq!(p.draw(|| rng(&mut seed)), None);
    }

    #[test]
    fn random_draws_are_spread_and_the_table_stays_small() {
        let mut seed = 99;
        let mut p = QpnPool::new(0x1_0000, 0x2_0000, true);
        let drawn: Vec<u32> = (0..4096)
            .map(|_| p.draw(|| rng(&mut seed)).unwrap())
            .collect();
        let low = drawn.iter().filter(|q| **q < 0x1_8000).count();
        assert!(
            (1800..2300).contains(&low),
            "{low} of 4096 in the lower half"
        );
        assert!(p.ranges[0].moved.len() <= 4096);
        for q in &drawn {
            p.release(*q);
        }
        assert_eq!(p.free as usize + p.quarantine.len(), 0x1_0000);
    }

    /// A persistent server's churn: one QP at a time, created and destroyed. No QPN comes
    /// back before `QUARANTINE` others were released (a QPN in CM timewait would be refused
    /// as stale), and the quarantine never makes a draw fail while some QPN is not in use.
    #[test]
    fn a_released_qpn_waits_for_the_quarantine_before_it_is_drawn_again() {
        let mut seed = 7;
        let mut p = QpnPool::new(0x1_0000, 0x2_0000, true);
        let mut last_seen = std::collections::HashMap::new();
        for i in 0..(3 * QUARANTINE) {
            let q = p.draw(|| rng(&mut seed)).unwrap();
            if let Some(before) = last_seen.insert(q, i) {
                assert!(i - before > QUARANTINE, "{q:#x} again after {}", i - before);
            }
            p.release(q);
        }
        let mut small = QpnPool::new(100, 104, true);
        let all: Vec<u32> = std::iter::from_fn(|| small.draw(|| rng(&mut seed))).collect();
        assert_eq!(all.len(), 4);
        small.release(all[2]);
        assert_eq!(small.draw(|| rng(&mut seed)), Some(all[2]));
    }
}
