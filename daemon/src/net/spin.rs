//! How long the device loop keeps polling (rings and sockets) after its last piece of work
//! before it sleeps.
//!
//! Waking a sleeping thread costs 7-14 µs here, more than a whole packet's processing, so the
//! loop polls for a while first; but polling burns a CPU that two-CPU machines cannot spare.
//! The budget follows the gaps actually seen between pieces of work: when work comes back
//! within tens of µs (a ping-pong, a window of ACKs), the loop polls a little longer than the
//! usual gap; when it comes back later than any affordable spin, it polls only briefly and
//! sleeps. Sans-clock: the caller measures the gaps.

use std::time::Duration;

#[derive(Debug, Clone, Copy)]
pub struct AdaptiveSpin {
    min: Duration,
    max: Duration,
    /// Moving average of the gaps, in ns (weight 1/8 for the newest).
    gap_ns: u64,
}

impl AdaptiveSpin {
    /// Spins at least `min` and at most `max`; starts at `min`.
    pub fn new(min: Duration, max: Duration) -> AdaptiveSpin {
        AdaptiveSpin {
            min,
            max: max.max(min),
            gap_ns: u64::MAX / 16,
        }
    }

    /// Work arrived `gap` after the previous work ended (whether the loop was spinning or
    /// asleep meanwhile).
    pub fn on_work_after(&mut self, gap: Duration) {
        // Long gaps count as 4x the ceiling: a few of them are enough to stop spinning.
        let g = (gap.as_nanos() as u64).min(4 * self.max.as_nanos() as u64);
        if self.gap_ns >= u64::MAX / 16 {
            self.gap_ns = g;
        } else {
            self.gap_ns = self.gap_ns - self.gap_ns / 8 + g / 8;
        }
    }

    /// How long to poll after the last piece of work.
    pub fn budget(&self) -> Duration {
        let typical = Duration::from_nanos(self.gap_ns.min(u64::MAX / 16));
        if typical > self.max {
            self.min
        } else {
            (typical * 2).clamp(self.min, self.max)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn short_gaps_stretch_the_spin_and_long_ones_shrink_it() {
        let mut s = AdaptiveSpin::new(20 * US, 200 * US);
        assert_eq!(s.budget(), 20 * US, "no history: the minimum");
        for _ in 0..50 {
            s.on_work_after(60 * US);
        }
        let b = s.budget();
        assert!(b >= 110 * US && b <= 120 * US, "about twice the gap: {b:?}");
        for _ in 0..50 {
            s.on_work_after(5 * US);
        }
        assert_eq!(s.budget(), 20 * US, "never below the minimum");
        // Work that comes back after milliseconds: spinning would not catch it.
        for _ in 0..20 {
            s.on_work_after(Duration::from_millis(5));
        }
        assert_eq!(s.budget(), 20 * US);
        // A ping-pong at 150 µs: capped at the maximum.
        for _ in 0..80 {
            s.on_work_after(150 * US);
        }
        assert_eq!(s.budget(), 200 * US);
    }
}
