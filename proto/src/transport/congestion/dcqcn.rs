//! DCQCN (Zhu et al., SIGCOMM 2015, §3 and Figure 7), with the timers, byte counter and
//! clamps of NVIDIA's firmware (DOCA "DCQCN CC Parameters", roce-rxe-facts.md §9.3-9.4).
//!
//! **Reaction point** (the QP as a sender). The current rate `RC` starts at the maximum
//! rate. The paper's rules, as the firmware applies them:
//!
//! - *alpha*: every `dce_tcp_rtt` µs, `α ← (1 − g)·α + g` if a CNP arrived in that period,
//!   else `α ← (1 − g)·α`, with `g = (1024 − dce_tcp_g)/1024`; the first CNP ever sets
//!   `α = initial_alpha_value/1024`;
//! - *rate decrease* on a CNP, at most once per `rate_reduce_monitor_period` (a CNP inside
//!   the period is applied at its end): `RC ← RC·(1 − α/2)` (the firmware's `RC·α >> rpg_gd`
//!   with α in 1/1024, so `rpg_gd = 11` is the paper's `/2`), never cutting more than
//!   `100 − rpg_min_dec_fac` % and never below `rpg_min_rate`. The target rate `RT ← RC`
//!   (before the cut) if `clamp_tgt_rate`, or if `clamp_tgt_rate_after_time_inc` and the
//!   timer raised the rate since the last cut; otherwise `RT` stays (the firmware's default:
//!   recovery aims at the rate before the congestion episode). The cut resets the increase
//!   timer, the byte counter and both stage counters;
//! - *rate increase* events come from a timer (every `rpg_time_reset` µs, counted in `iT`)
//!   and from a byte counter (every `rpg_byte_reset` bytes sent, counted in `iB`). With
//!   `F = rpg_threshold`: if `max(iT, iB) < F` fast recovery `RC ← (RT + RC)/2`; else if
//!   `min(iT, iB) > F` hyper increase `RT ← RT + i·R_HAI` with `i = min(iT, iB) − F`, then
//!   `RC ← (RT + RC)/2`; else additive increase `RT ← RT + R_AI`, then `RC ← (RT + RC)/2`.
//!   Rates are clamped to `[rpg_min_rate, max]`. When `RC` is back at the maximum rate the
//!   timers stop and the QP is no longer paced (alpha keeps decaying, as in the firmware).
//!
//! **Notification point** (the QP as a receiver): a CE-marked packet asks for a CNP unless
//! one was sent for this QP less than `min_time_between_cnps` µs ago.
//!
//! Everything periodic is evaluated when the QP is next looked at, with the elapsed periods
//! applied at once (see the module docs of [`super`]).

use super::{mbps, us, Controller, Params, QpCongestion};
use crate::transport::timers::Nanos;

/// The largest alpha the firmware holds: 1023/1024.
const ALPHA_MAX: f64 = 1023.0 / 1024.0;

/// After this many increase events owed at once (a QP looked at again after a very long
/// time with small timer periods) the QP is taken as recovered: by then even the additive
/// steps alone have raised the target by 10,000 × `rpg_ai_rate`.
const MAX_CATCH_UP: u32 = 10_000;

/// Where a rate-increase event came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Timer,
    Bytes,
}

/// DCQCN state of one QP.
#[derive(Debug, Clone, PartialEq)]
pub struct Dcqcn {
    /// Current rate (the paper's R_C), bits per second.
    rc: u64,
    /// Target rate (R_T), bits per second.
    rt: u64,
    /// `rc` is below the line rate: packets are paced.
    limited: bool,
    /// A congestion episode is under way (rate below the maximum): the increase timer runs.
    congested: bool,
    /// α in 0..=1023/1024, valid once the first CNP arrived.
    alpha: f64,
    alpha_started: bool,
    /// End of the current alpha period.
    alpha_due: Nanos,
    /// A CNP arrived in the current alpha period.
    alpha_cnp: bool,
    /// No decrease before this time (the monitor period of the last one).
    cut_allowed_at: Nanos,
    /// A CNP arrived inside the monitor period: decrease at `cut_allowed_at`.
    cut_pending: bool,
    /// The increase timer's next expiry.
    timer_due: Nanos,
    /// Bytes counted towards the next byte-counter event.
    bytes: u64,
    /// Increase events since the last cut: by the timer (iT) and by the byte counter (iB).
    i_t: u32,
    i_b: u32,
    /// The timer raised the rate since the last cut (`clamp_tgt_rate_after_time_inc`).
    timer_increased: bool,
    /// NP: when this QP last asked for a CNP.
    last_cnp: Option<Nanos>,
}

impl Dcqcn {
    pub fn new(p: &Params) -> Dcqcn {
        let max = p.max_rate_bps();
        Dcqcn {
            rc: max,
            rt: max,
            limited: max < p.line_rate_bps(),
            congested: false,
            alpha: 0.0,
            alpha_started: false,
            alpha_due: 0,
            alpha_cnp: false,
            cut_allowed_at: 0,
            cut_pending: false,
            timer_due: 0,
            bytes: 0,
            i_t: 0,
            i_b: 0,
            timer_increased: false,
            last_cnp: None,
        }
    }

    /// The current rate R_C, bits per second (as last evaluated).
    pub fn current_rate(&self) -> u64 {
        self.rc
    }

    /// The target rate R_T, bits per second.
    pub fn target_rate(&self) -> u64 {
        self.rt
    }

    /// α, 0..=1 (0 before the first CNP).
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// The increase stages (iT, iB) since the last cut.
    pub fn stages(&self) -> (u32, u32) {
        (self.i_t, self.i_b)
    }

    /// Applies the alpha periods that ended by `t`: the first with the CNP flag of that
    /// period, the others (no CNP can have arrived in them unseen) in closed form.
    fn update_alpha(&mut self, t: Nanos, p: &Params) {
        if !self.alpha_started || t < self.alpha_due {
            return;
        }
        let period = us(p.dce_tcp_rtt).max(1);
        let n = (t - self.alpha_due) / period + 1;
        let g = f64::from(1024 - p.dce_tcp_g.min(1024)) / 1024.0;
        self.alpha = if self.alpha_cnp {
            (1.0 - g) * self.alpha + g
        } else {
            (1.0 - g) * self.alpha
        };
        if n > 1 {
            // Beyond 2^20 periods (1 s at 1 µs) any g > 0 has taken α to 0.
            self.alpha *= (1.0 - g).powi((n - 1).min(1 << 20) as i32);
        }
        self.alpha = self.alpha.min(ALPHA_MAX);
        self.alpha_cnp = false;
        self.alpha_due += n * period;
    }

    /// Runs the events due by `now` in time order: deferred decreases and timer expiries.
    fn advance(&mut self, now: Nanos, p: &Params) {
        let mut budget = MAX_CATCH_UP;
        while self.congested {
            let timer = (p.rpg_time_reset > 0).then_some(self.timer_due);
            let cut = self.cut_pending.then_some(self.cut_allowed_at);
            let at = match (cut, timer) {
                (Some(c), Some(t)) => c.min(t),
                (c, t) => match c.or(t) {
                    Some(x) => x,
                    None => break,
                },
            };
            if at > now {
                break;
            }
            if cut == Some(at) {
                self.cut(at, p);
            } else {
                self.timer_due = at + us(p.rpg_time_reset);
                self.increase(Source::Timer, p);
            }
            budget -= 1;
            if budget == 0 {
                self.recovered(p);
            }
        }
    }

    /// The rate decrease at time `at`.
    fn cut(&mut self, at: Nanos, p: &Params) {
        self.update_alpha(at, p);
        if p.clamp_tgt_rate || (p.clamp_tgt_rate_after_time_inc && self.timer_increased) {
            self.rt = self.rc;
        }
        // RC·α >> gd with α in 1/1024 units: RC·α·2^(10 − gd); 11 gives the paper's RC·α/2.
        let scale = 2f64.powi(10 - p.rpg_gd.min(31) as i32);
        let dec = (self.rc as f64 * self.alpha * scale) as u64;
        let most = self.rc / 100 * u64::from(100 - p.rpg_min_dec_fac.clamp(1, 100));
        let max = p.max_rate_bps();
        self.rc = (self.rc - dec.min(most)).max(mbps(p.rpg_min_rate)).min(max);
        self.rt = self.rt.min(max);
        self.cut_pending = false;
        self.cut_allowed_at = at + us(p.rate_reduce_monitor_period);
        self.restart_increase(at, p);
        self.limited = self.rc < p.line_rate_bps();
    }

    fn restart_increase(&mut self, at: Nanos, p: &Params) {
        self.i_t = 0;
        self.i_b = 0;
        self.bytes = 0;
        self.timer_increased = false;
        self.timer_due = at + us(p.rpg_time_reset);
    }

    /// One rate-increase event (Figure 7's fast recovery, additive or hyper increase).
    fn increase(&mut self, source: Source, p: &Params) {
        let f = p.rpg_threshold;
        let (lo, hi) = (self.i_t.min(self.i_b), self.i_t.max(self.i_b));
        let max = p.max_rate_bps();
        if hi < f {
            // Fast recovery: only RC moves, half way to RT.
        } else if lo > f {
            let i = u64::from(lo - f);
            self.rt = self
                .rt
                .saturating_add(i.saturating_mul(mbps(p.rpg_hai_rate)))
                .min(max);
        } else {
            self.rt = self.rt.saturating_add(mbps(p.rpg_ai_rate)).min(max);
        }
        // Rounded up, so that RC reaches RT instead of stopping one bit/s below it.
        self.rc = (self.rt / 2 + self.rc / 2 + (self.rt % 2 + self.rc % 2).div_ceil(2)).min(max);
        match source {
            Source::Timer => {
                self.i_t = self.i_t.saturating_add(1);
                self.timer_increased = true;
            }
            Source::Bytes => self.i_b = self.i_b.saturating_add(1),
        }
        if self.rc >= max && !self.cut_pending {
            self.recovered(p);
        }
        self.limited = self.rc < p.line_rate_bps();
    }

    /// Back at the maximum rate: the episode is over, the timers stop.
    fn recovered(&mut self, p: &Params) {
        let max = p.max_rate_bps();
        self.rc = max;
        self.rt = max;
        self.congested = false;
        self.cut_pending = false;
        self.bytes = 0;
        self.i_t = 0;
        self.i_b = 0;
        self.limited = max < p.line_rate_bps();
    }
}

impl Controller for Dcqcn {
    #[inline]
    fn rate(&mut self, now: Nanos, p: &Params) -> u64 {
        if self.congested {
            self.advance(now, p);
        }
        self.rc
    }

    #[inline]
    fn limited(&self) -> bool {
        self.limited
    }

    fn on_cnp(&mut self, now: Nanos, p: &Params) -> bool {
        if self.congested {
            self.advance(now, p);
        }
        let first = !self.alpha_started;
        if first {
            self.alpha_started = true;
            self.alpha = f64::from(p.initial_alpha_value.min(1023)) / 1024.0;
            self.alpha_due = now + us(p.dce_tcp_rtt).max(1);
            self.alpha_cnp = false;
        } else {
            self.update_alpha(now, p);
            self.alpha_cnp = true;
        }
        if !self.congested {
            self.congested = true;
            self.restart_increase(now, p);
            if first && p.rate_to_set_on_first_cnp > 0 {
                let max = p.max_rate_bps();
                let r = mbps(p.rate_to_set_on_first_cnp)
                    .max(mbps(p.rpg_min_rate))
                    .min(max);
                self.rc = r;
                self.rt = r;
                self.cut_allowed_at = now + us(p.rate_reduce_monitor_period);
                self.limited = self.rc < p.line_rate_bps();
                if self.rc >= max {
                    self.recovered(p);
                }
                return true;
            }
        }
        if now >= self.cut_allowed_at {
            self.cut(now, p);
        } else {
            self.cut_pending = true;
        }
        true
    }

    fn on_sent(&mut self, _now: Nanos, bytes: usize, p: &Params) {
        if !self.congested || p.rpg_byte_reset == 0 {
            return;
        }
        self.bytes += bytes as u64;
        let b = u64::from(p.rpg_byte_reset);
        while self.congested && self.bytes >= b {
            self.bytes -= b;
            self.increase(Source::Bytes, p);
        }
    }

    fn on_ce(&mut self, now: Nanos, p: &Params) -> bool {
        let gap = us(p.min_time_between_cnps);
        match self.last_cnp {
            Some(t) if now.saturating_sub(t) < gap => false,
            _ => {
                self.last_cnp = Some(now);
                true
            }
        }
    }

    /// The next increase timer expiry or deferred decrease, while an episode is under way.
    fn next_change(&self, p: &Params) -> Option<Nanos> {
        if !self.congested {
            return None;
        }
        let timer = (p.rpg_time_reset > 0).then_some(self.timer_due);
        let cut = self.cut_pending.then_some(self.cut_allowed_at);
        match (timer, cut) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn state(&self, _p: &Params) -> QpCongestion {
        QpCongestion {
            rate_bps: self.rc,
            target_bps: self.rt,
            alpha: self.alpha,
            limited: self.limited,
        }
    }
}

#[cfg(test)]
mod tests {
    //! Each rule against the paper's equation (Zhu et al. 2015, §3.1 and Figure 7), computed
    //! here independently in floating point from the parameters.
    use super::*;

    const US: Nanos = 1_000;
    const G10: u64 = 10_000_000_000;

    /// 10 Gbit/s line rate, NVIDIA's defaults otherwise.
    fn params() -> Params {
        Params {
            line_rate: 10_000,
            ..Params::default()
        }
    }

    fn g(p: &Params) -> f64 {
        f64::from(1024 - p.dce_tcp_g) / 1024.0
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn before_any_cnp_the_qp_runs_at_line_rate_unpaced() {
        let p = params();
        let mut c = Dcqcn::new(&p);
        assert_eq!(c.rate(1_000_000, &p), G10);
        assert!(!c.limited());
        // rpg_max_rate below the line rate: paced at it from the start.
        let p = Params {
            rpg_max_rate: 100,
            ..params()
        };
        let mut c = Dcqcn::new(&p);
        assert_eq!(c.rate(0, &p), 100_000_000);
        assert!(c.limited());
    }

    #[test]
    fn first_cnp_sets_initial_alpha_and_cuts_by_half_alpha() {
        let p = params();
        let mut c = Dcqcn::new(&p);
        assert!(c.on_cnp(0, &p));
        let alpha = 1023.0 / 1024.0;
        assert!(close(c.alpha(), alpha));
        // RC ← RC·(1 − α/2).
        let want = (G10 as f64 * (1.0 - alpha / 2.0)) as u64;
        assert!(
            c.current_rate().abs_diff(want) <= 1,
            "{} vs {want}",
            c.current_rate()
        );
        // clamp_tgt_rate off and no timer increase yet: RT stays at the rate before.
        assert_eq!(c.target_rate(), G10);
        assert!(c.limited());
    }

    #[test]
    fn alpha_update_with_and_without_cnps() {
        let p = params();
        let mut c = Dcqcn::new(&p);
        c.on_cnp(0, &p);
        let mut alpha = 1023.0 / 1024.0;
        // A CNP inside the first period: at its end α ← (1 − g)α + g.
        c.on_cnp(US / 2, &p);
        c.update_alpha(US, &p);
        alpha = (1.0 - g(&p)) * alpha + g(&p);
        assert!(close(c.alpha(), alpha.min(ALPHA_MAX)));
        let alpha = c.alpha();
        // 37 periods with no CNP, applied in closed form when looked at late: α(1 − g)^37.
        c.update_alpha(38 * US, &p);
        let want = alpha * (1.0 - g(&p)).powi(37);
        assert!(close(c.alpha(), want), "{} vs {want}", c.alpha());
        // Same result as 37 single steps.
        let mut d = Dcqcn::new(&p);
        d.on_cnp(0, &p);
        d.on_cnp(US / 2, &p);
        for t in 1..=38 {
            d.update_alpha(t * US, &p);
        }
        assert!(close(c.alpha(), d.alpha()));
        // The paper's g = 1/256 at K = 55 µs, with the same formula.
        let p = Params {
            dce_tcp_g: 1020,
            dce_tcp_rtt: 55,
            ..params()
        };
        let mut c = Dcqcn::new(&p);
        c.on_cnp(0, &p);
        c.update_alpha(55 * US * 3, &p);
        let want = ALPHA_MAX * (1.0 - 1.0 / 256.0f64).powi(3);
        assert!(close(c.alpha(), want));
    }

    #[test]
    fn at_most_one_decrease_per_monitor_period_the_next_at_its_end() {
        let p = params();
        let mut c = Dcqcn::new(&p);
        c.on_cnp(0, &p);
        let after_first = c.current_rate();
        // A CNP 1 µs later: no second cut yet.
        c.on_cnp(US, &p);
        assert_eq!(c.rate(3 * US, &p), after_first);
        // At the end of the 4 µs period it is applied, with α as it is then.
        let r = c.rate(4 * US, &p);
        // α: period 0-1 µs had no CNP flag (the first CNP only initialises α), period 1-2 µs
        // has the second CNP's, 2-4 µs none.
        let mut a = 1023.0 / 1024.0 * (1.0 - g(&p));
        a = ((1.0 - g(&p)) * a + g(&p)).min(ALPHA_MAX);
        a *= (1.0 - g(&p)).powi(2);
        let want = (after_first as f64 * (1.0 - a / 2.0)) as u64;
        assert!(r.abs_diff(want) <= 2, "{r} vs {want}");
        assert!(close(c.alpha(), a));
    }

    #[test]
    fn decrease_clamps_min_dec_fac_and_min_rate() {
        // rpg_gd 10: RC·α, nearly everything; rpg_min_dec_fac 50 keeps half.
        let p = Params {
            rpg_gd: 10,
            ..params()
        };
        let mut c = Dcqcn::new(&p);
        c.on_cnp(0, &p);
        assert_eq!(c.current_rate(), G10 / 2);
        // Repeated cuts stop at rpg_min_rate (1 Mbit/s).
        let mut t = 0;
        for _ in 0..40 {
            t += 4 * US;
            c.on_cnp(t, &p);
        }
        assert_eq!(c.current_rate(), 1_000_000);
    }

    #[test]
    fn clamp_tgt_rate_is_the_papers_rule() {
        let p = Params {
            clamp_tgt_rate: true,
            ..params()
        };
        let mut c = Dcqcn::new(&p);
        c.on_cnp(0, &p);
        let rc1 = c.current_rate();
        c.on_cnp(10 * US, &p);
        // RT ← RC (the rate before this cut).
        assert_eq!(c.target_rate(), rc1);
    }

    #[test]
    fn clamp_after_time_increase_sets_target_only_after_a_timer_event() {
        let p = params();
        let mut c = Dcqcn::new(&p);
        c.on_cnp(0, &p);
        // A cut without a timer increase in between: RT stays at line rate.
        c.on_cnp(10 * US, &p);
        assert_eq!(c.target_rate(), G10);
        // The timer fires at 310 µs; a CNP after it clamps RT to the RC of that moment.
        let rc = c.rate(311 * US, &p);
        assert_eq!(c.stages().0, 1);
        c.on_cnp(312 * US, &p);
        assert_eq!(c.target_rate(), rc);
    }

    /// A controller after CNPs at 0 and 4 µs, with its RC and RT.
    fn two_cuts(p: &Params) -> (Dcqcn, f64, f64) {
        let mut c = Dcqcn::new(p);
        c.on_cnp(0, p);
        c.on_cnp(4 * US, p);
        let (rc, rt) = (c.current_rate() as f64, c.target_rate() as f64);
        (c, rc, rt)
    }

    #[test]
    fn fast_recovery_then_additive_then_hyper_increase() {
        // F = 3 to see each phase; clamp_tgt_rate so that RT (the rate before the second
        // cut) is below the maximum and the increases show. Byte counter off: iB stays 0,
        // so after F fast-recovery events the timer alone gives additive increase for ever.
        let p = Params {
            rpg_threshold: 3,
            rpg_byte_reset: 0,
            clamp_tgt_rate: true,
            ..params()
        };
        let (mut c, mut rc, mut rt) = two_cuts(&p);
        assert!(rt < G10 as f64 * 0.6);
        for k in 0..6u64 {
            let r = c.rate(4 * US + (k + 1) * 300 * US, &p) as f64;
            if k >= 3 {
                // max(iT, iB) ≥ F, min(iT, iB) = 0 ≤ F: additive increase, RT + R_AI.
                rt += 5e6;
            }
            // Fast recovery and both increases: RC ← (RT + RC)/2.
            rc = (rt + rc) / 2.0;
            assert!((r - rc).abs() <= 2.0, "event {k}: {r} vs {rc}");
            assert!((c.target_rate() as f64 - rt).abs() <= 2.0);
        }
        assert_eq!(c.stages(), (6, 0));

        // With the byte counter too: both counters past F gives hyper increase.
        let p = Params {
            rpg_threshold: 1,
            rpg_byte_reset: 1000,
            clamp_tgt_rate: true,
            ..params()
        };
        let (mut c, mut rc, mut rt) = two_cuts(&p);
        // Two timer events: iT = 0 (fast recovery), iT = 1 = F (additive).
        for k in 1..=2u64 {
            c.rate(4 * US + k * 300 * US, &p);
            if k == 2 {
                rt += 5e6;
            }
            rc = (rt + rc) / 2.0;
        }
        assert!((c.current_rate() as f64 - rc).abs() <= 2.0);
        // Then byte events with iT = 2: iB = 0 and 1 are additive; at iB = 2 both counters
        // exceed F: hyper increase by i = min(iT, iB) − F = 1 times R_HAI; at iB = 3, i = 1.
        for ib in 0..4u32 {
            c.on_sent(700 * US, 1000, &p);
            let lo = ib.min(2);
            if lo > 1 {
                rt += f64::from(lo - 1) * 50e6;
            } else {
                rt += 5e6;
            }
            rc = (rt + rc) / 2.0;
            assert!(
                (c.current_rate() as f64 - rc).abs() <= 2.0,
                "byte event {ib}: {} vs {rc}",
                c.current_rate()
            );
            assert!((c.target_rate() as f64 - rt).abs() <= 2.0);
        }
        assert_eq!(c.stages(), (2, 4));
    }

    #[test]
    fn byte_counter_fires_every_byte_reset_bytes() {
        let p = Params {
            rpg_time_reset: 0,
            ..params()
        };
        let mut c = Dcqcn::new(&p);
        c.on_cnp(0, &p);
        let (rc, rt) = (c.current_rate(), c.target_rate());
        // 32766 bytes: nothing; one more: one fast-recovery event.
        c.on_sent(US, 32766, &p);
        assert_eq!((c.current_rate(), c.stages()), (rc, (0, 0)));
        c.on_sent(US, 1, &p);
        assert_eq!(c.stages(), (0, 1));
        assert!(c.current_rate().abs_diff((rc + rt) / 2) <= 1);
        // Several thresholds in one call: one event each.
        c.on_sent(2 * US, 3 * 32767, &p);
        assert_eq!(c.stages(), (0, 4));
    }

    #[test]
    fn timer_expiries_missed_while_not_looked_at_are_all_applied() {
        let p = params();
        let mut late = Dcqcn::new(&p);
        let mut step = Dcqcn::new(&p);
        late.on_cnp(0, &p);
        step.on_cnp(0, &p);
        for k in 1..=7 {
            step.rate(k * 300 * US, &p);
        }
        late.rate(7 * 300 * US + 10 * US, &p);
        assert_eq!(late.current_rate(), step.current_rate());
        assert_eq!(late.target_rate(), step.target_rate());
        assert_eq!(late.stages(), (7, 0));
        // Long enough and the QP is back at line rate: unpaced, timers stopped.
        assert_eq!(late.rate(10_000_000_000, &p), G10);
        assert!(!late.limited());
        assert_eq!(late.next_change(&p), None);
    }

    #[test]
    fn rate_to_set_on_first_cnp_replaces_the_first_cut() {
        let p = Params {
            rate_to_set_on_first_cnp: 2000,
            ..params()
        };
        let mut c = Dcqcn::new(&p);
        c.on_cnp(0, &p);
        assert_eq!(
            (c.current_rate(), c.target_rate()),
            (2 * G10 / 10, 2 * G10 / 10)
        );
    }

    #[test]
    fn notification_point_sends_at_most_one_cnp_per_interval() {
        let p = params();
        let mut c = Dcqcn::new(&p);
        assert!(c.on_ce(0, &p));
        assert!(!c.on_ce(3 * US, &p));
        assert!(c.on_ce(4 * US, &p));
        let p = Params {
            min_time_between_cnps: 0,
            ..params()
        };
        assert!(c.on_ce(4 * US, &p), "0: a CNP for every mark");
    }
}
