//! A switch egress port in front of one node: every packet to that node, from any sender,
//! waits in one FIFO drained at the port's rate. The port marks ECN CE by RED's rule on its
//! instantaneous depth (as DCQCN switches do, roce-rxe-facts.md §9.2): probability 0 up to
//! `min_bytes`, rising linearly to `max_probability` at `max_bytes`, 1 above. It marks as a
//! packet leaves, on the depth of the queue behind it (as shared-buffer switches do, so
//! that the mark tells of the queue as it is now, not as it was when the packet joined it:
//! otherwise the feedback is late by the queueing delay itself). It drops what does not fit
//! in `buffer_bytes` (tail drop). Packets that are not ECN-capable are
//! never marked, only tail-dropped, so that a sender without congestion control sees what a
//! lossy fabric does to it: the queue overflows.

use super::rng::SimRng;
use crate::transport::Nanos;
use std::net::IpAddr;

/// RED's marking thresholds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Red {
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub max_probability: f64,
}

impl Red {
    /// The marking probability at queue depth `q` bytes.
    pub fn probability(&self, q: u64) -> f64 {
        if q <= self.min_bytes {
            0.0
        } else if q > self.max_bytes {
            1.0
        } else {
            let span = (self.max_bytes - self.min_bytes).max(1) as f64;
            self.max_probability * (q - self.min_bytes) as f64 / span
        }
    }
}

/// The port: its rate, buffer, marking, and the delay from it to the node.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BottleneckModel {
    pub rate_bps: u64,
    pub buffer_bytes: u64,
    pub red: Option<Red>,
    pub delay: Nanos,
}

/// One packet the port forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forwarded {
    /// When it reached the port and when its last bit left.
    pub arrival: Nanos,
    pub departure: Nanos,
    pub src: IpAddr,
    /// IP packet length.
    pub len: u32,
    /// Queue depth in bytes it found on arrival.
    pub queue_bytes: u64,
    pub marked: bool,
}

/// What the port did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BottleneckStats {
    pub forwarded: Vec<Forwarded>,
    pub marked: u64,
    pub dropped: u64,
    pub max_queue_bytes: u64,
}

impl BottleneckStats {
    /// Bytes per source that left the port in `[from, to)`.
    pub fn bytes_by_source(&self, from: Nanos, to: Nanos) -> Vec<(IpAddr, u64)> {
        let mut out: Vec<(IpAddr, u64)> = Vec::new();
        for f in self
            .forwarded
            .iter()
            .filter(|f| f.departure >= from && f.departure < to)
        {
            match out.iter_mut().find(|(s, _)| *s == f.src) {
                Some((_, b)) => *b += u64::from(f.len),
                None => out.push((f.src, u64::from(f.len))),
            }
        }
        out
    }

    /// The deepest queue a packet arriving in `[from, to)` found.
    pub fn max_queue_between(&self, from: Nanos, to: Nanos) -> u64 {
        self.forwarded
            .iter()
            .filter(|f| f.arrival >= from && f.arrival < to)
            .map(|f| f.queue_bytes)
            .max()
            .unwrap_or(0)
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Bottleneck {
    pub model: BottleneckModel,
    busy_until: Nanos,
    pub stats: BottleneckStats,
}

impl Bottleneck {
    pub fn new(model: BottleneckModel) -> Bottleneck {
        Bottleneck {
            model,
            busy_until: 0,
            stats: BottleneckStats::default(),
        }
    }

    /// A packet from `src` reaches the port at `now`: the time its last bit leaves, or None
    /// if it was dropped. Call [`Bottleneck::depart`] then.
    pub fn enqueue(&mut self, now: Nanos, src: IpAddr, len: usize) -> Option<Nanos> {
        let queue = self.depth(now);
        self.stats.max_queue_bytes = self.stats.max_queue_bytes.max(queue);
        let len = len as u64;
        if queue + len > self.model.buffer_bytes {
            self.stats.dropped += 1;
            return None;
        }
        let rate = self.model.rate_bps.max(1);
        let departure = self.busy_until.max(now) + (len * 8 * 1_000_000_000).div_ceil(rate);
        self.busy_until = departure;
        self.stats.forwarded.push(Forwarded {
            arrival: now,
            departure,
            src,
            len: len as u32,
            queue_bytes: queue,
            marked: false,
        });
        Some(departure)
    }

    /// The packet that left at `now` (its departure time): RED decides on the queue behind
    /// it whether to mark it CE. Returns when it reaches the node.
    pub fn depart(&mut self, now: Nanos, packet: &mut [u8], rng: &mut SimRng) -> Nanos {
        let queue = self.depth(now);
        let marked = self
            .model
            .red
            .is_some_and(|red| rng.chance(red.probability(queue)))
            && crate::wire::ecn::mark_ce(packet);
        if marked {
            self.stats.marked += 1;
            // Packets leave in order: the one leaving now is the oldest not yet marked.
            if let Some(f) = self
                .stats
                .forwarded
                .iter_mut()
                .rev()
                .take_while(|f| f.departure >= now)
                .find(|f| f.departure == now)
            {
                f.marked = true;
            }
        }
        now + self.model.delay
    }

    /// Bytes waiting at `now` (the one being sent included).
    fn depth(&self, now: Nanos) -> u64 {
        let rate = self.model.rate_bps.max(1);
        let behind = self.busy_until.saturating_sub(now);
        u64::try_from(u128::from(behind) * u128::from(rate) / 8_000_000_000).unwrap_or(u64::MAX)
    }
}

/// Jain's fairness index of `x`: `(Σx)² / (n·Σx²)`, 1 when all are equal, 1/n when one
/// has everything.
pub fn jain_index(x: &[f64]) -> f64 {
    let sum: f64 = x.iter().sum();
    let sq: f64 = x.iter().map(|v| v * v).sum();
    if x.is_empty() || sq == 0.0 {
        return 1.0;
    }
    sum * sum / (x.len() as f64 * sq)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn red_probability_is_linear_between_the_thresholds() {
        let red = Red {
            min_bytes: 1000,
            max_bytes: 3000,
            max_probability: 0.2,
        };
        assert_eq!(red.probability(1000), 0.0);
        assert!((red.probability(2000) - 0.1).abs() < 1e-12);
        assert!((red.probability(3000) - 0.2).abs() < 1e-12);
        assert_eq!(red.probability(3001), 1.0);
    }

    #[test]
    fn jain() {
        assert!((jain_index(&[1.0, 1.0, 1.0]) - 1.0).abs() < 1e-12);
        assert!((jain_index(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
    }

    #[test]
    fn the_queue_drains_at_the_port_rate_and_drops_what_does_not_fit() {
        let mut b = Bottleneck::new(BottleneckModel {
            rate_bps: 8_000_000_000, // one byte per ns
            buffer_bytes: 2500,
            red: Some(Red {
                min_bytes: 0,
                max_bytes: 999,
                max_probability: 1.0,
            }),
            delay: 100,
        });
        let src: IpAddr = "10.0.0.1".parse().unwrap();
        assert_eq!(b.enqueue(0, src, 1000), Some(1000));
        assert_eq!(b.enqueue(0, src, 1000), Some(2000));
        // 2000 queued + 1000 > 2500: dropped.
        assert_eq!(b.enqueue(0, src, 1000), None);
        assert_eq!(b.enqueue(1500, src, 1000), Some(3000));
        assert_eq!((b.stats.dropped, b.stats.max_queue_bytes), (1, 2000));
        // The first leaves with 2000 bytes behind it: marked (ECT(0) IPv4 header).
        let mut rng = SimRng::new(1);
        let mut p = [0u8; 20];
        p[0] = 0x45;
        p[1] = 0x02;
        assert_eq!(b.depart(1000, &mut p, &mut rng), 1100);
        assert_eq!(p[1] & 3, 3);
        assert!(b.stats.forwarded[0].marked && !b.stats.forwarded[1].marked);
        // The last leaves an empty queue: not marked.
        let mut q = [0u8; 20];
        q[0] = 0x45;
        q[1] = 0x02;
        b.depart(3000, &mut q, &mut rng);
        assert_eq!((q[1] & 3, b.stats.marked), (2, 1));
    }
}
