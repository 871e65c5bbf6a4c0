//! Transport timer values (IBTA Vol. 1 §9.7.6.1.3 and table 46), in nanoseconds of the
//! caller's clock.

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
}
