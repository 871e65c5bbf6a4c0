//! No congestion control, as kernel rxe (roce-rxe-facts.md §9.1): the rate is the line rate
//! for ever, CE marks are counted by the engine but never answered, CNPs are ignored.

use super::{Controller, Params, QpCongestion};
use crate::transport::timers::Nanos;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct NoControl;

impl Controller for NoControl {
    fn rate(&mut self, _now: Nanos, p: &Params) -> u64 {
        p.line_rate_bps()
    }
    fn limited(&self) -> bool {
        false
    }
    fn on_cnp(&mut self, _now: Nanos, _p: &Params) -> bool {
        false
    }
    fn on_sent(&mut self, _now: Nanos, _bytes: usize, _p: &Params) {}
    fn on_ce(&mut self, _now: Nanos, _p: &Params) -> bool {
        false
    }
    fn state(&self, p: &Params) -> QpCongestion {
        QpCongestion {
            rate_bps: p.line_rate_bps(),
            target_bps: p.line_rate_bps(),
            alpha: 0.0,
            limited: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_limits_never_answers() {
        let p = Params::default();
        let mut c = NoControl;
        assert!(!c.on_cnp(0, &p));
        assert!(!c.on_ce(0, &p));
        assert!(!c.limited());
        assert_eq!(c.rate(1_000_000, &p), p.line_rate_bps());
    }
}
