//! The per-QP rate limiter: a token bucket in its GCRA form (the "virtual scheduling"
//! algorithm of ITU-T I.371), which needs one timestamp instead of a token count refilled
//! by a clock.
//!
//! `tat` is the theoretical time the next packet would leave if the QP had sent every
//! packet exactly at its rate. A packet may leave at `now` if `now >= tat - tolerance`;
//! sending `len` bytes moves `tat` to `max(tat, now) + len·8/rate`. So a QP never sends
//! faster than its rate over any interval, except for a burst worth `tolerance` (at least
//! one packet), which is exactly what lets a daemon that wakes up late (timer resolution,
//! a busy CPU) send what it owes and keep the long-run rate.

use crate::transport::timers::Nanos;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pacer {
    /// Theoretical departure time of the next packet.
    tat: Nanos,
    /// The rate `tat` was computed with, bits per second (0: never sent).
    rate: u64,
    /// What is left of the last interval below one nanosecond, in bit·ns units of `rate`
    /// (so that the long-run rate is exact).
    carry: u64,
}

impl Pacer {
    /// When the next packet may leave at `rate` bits/s, or None if it may leave at `now`.
    /// A rate that changed since the last packet rescales what is still owed: a QP whose rate
    /// recovered does not wait out an interval computed at the lower rate.
    #[inline]
    pub fn release_time(&mut self, now: Nanos, rate: u64, tolerance: Nanos) -> Option<Nanos> {
        if rate != self.rate && self.rate != 0 && rate != 0 && self.tat > now {
            let owed = u128::from(self.tat - now) * u128::from(self.rate) / u128::from(rate);
            self.tat = now + owed.min(u128::from(u64::MAX - now)) as u64;
            self.carry = 0;
        }
        self.rate = rate;
        let at = self.tat.saturating_sub(tolerance);
        (at > now).then_some(at)
    }

    /// Charges a packet of `bytes` sent at `now` at the rate of the last
    /// [`Pacer::release_time`].
    #[inline]
    pub fn on_sent(&mut self, now: Nanos, bytes: usize) {
        if self.rate == 0 {
            return;
        }
        let bit_ns = bytes as u128 * 8 * 1_000_000_000 + u128::from(self.carry);
        let rate = u128::from(self.rate);
        self.carry = (bit_ns % rate) as u64;
        let interval = (bit_ns / rate).min(u128::from(u64::MAX / 2)) as u64;
        self.tat = self.tat.max(now).saturating_add(interval);
    }

    /// Forgets the past (the QP is not paced any more).
    pub fn reset(&mut self) {
        *self = Pacer::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends as fast as the pacer allows for `duration` with `len`-byte packets, asking at
    /// the release time, `late` ns after it; returns the rate achieved (bits/s).
    fn run(rate: u64, len: usize, tolerance: Nanos, late: Nanos, duration: Nanos) -> f64 {
        let mut p = Pacer::default();
        let (mut now, mut bytes) = (1_000u64, 0u64);
        let start = now;
        while now < start + duration {
            match p.release_time(now, rate, tolerance) {
                None => {
                    p.on_sent(now, len);
                    bytes += len as u64;
                }
                Some(at) => now = at + late,
            }
        }
        bytes as f64 * 8.0 / ((now - start) as f64 / 1e9)
    }

    #[test]
    fn long_run_rate_is_the_set_rate_from_10_mbits_to_100_gbits() {
        for rate in [
            10_000_000u64,
            100_000_000,
            1_000_000_000,
            10_000_000_000,
            100_000_000_000,
        ] {
            let got = run(rate, 4136, 0, 0, 1_000_000_000);
            assert!((got / rate as f64 - 1.0).abs() < 0.01, "{rate}: {got}");
        }
    }

    #[test]
    fn lateness_within_the_tolerance_is_made_up() {
        // 1 Gbit/s with 1 KB packets (8.5 µs apart), woken 15 µs late each time: with a
        // 20 µs tolerance the rate holds; with none it falls by 15/(15 + 8.5).
        let rate = 1_000_000_000;
        let good = run(rate, 1066, 20_000, 15_000, 100_000_000);
        assert!((good / rate as f64 - 1.0).abs() < 0.01, "{good}");
        let bad = run(rate, 1066, 0, 15_000, 100_000_000);
        assert!(bad < rate as f64 * 0.5, "{bad}");
    }

    #[test]
    fn a_rate_increase_shortens_the_wait() {
        let mut p = Pacer::default();
        assert_eq!(p.release_time(0, 1_000_000, 0), None);
        p.on_sent(0, 1250); // 10 ms at 1 Mbit/s
        assert_eq!(p.release_time(0, 1_000_000, 0), Some(10_000_000));
        // At 1 ms the rate is 10 Mbit/s: the 9 ms still owed become 0.9 ms.
        assert_eq!(p.release_time(1_000_000, 10_000_000, 0), Some(1_900_000));
        // A burst after idling is bounded by the tolerance.
        let mut p = Pacer::default();
        p.release_time(0, 8_000_000_000, 1_000);
        let mut sent = 0;
        while p.release_time(0, 8_000_000_000, 1_000).is_none() {
            p.on_sent(0, 1000);
            sent += 1;
        }
        assert_eq!(
            sent, 2,
            "1 µs at 8 Gbit/s is one 1000-byte packet, plus the first"
        );
    }
}
