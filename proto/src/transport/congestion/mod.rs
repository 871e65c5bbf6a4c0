//! Congestion control for RoCE, one algorithm per file behind one trait (the shape of
//! smoltcp's `socket/tcp/congestion/`):
//!
//! - [`none`]: kernel rxe's behaviour (roce-rxe-facts.md §9.1): never paces, never marks ECN,
//!   sends no CNPs and ignores the ones it gets;
//! - [`dcqcn`]: DCQCN (Zhu et al., "Congestion Control for Large-Scale RDMA Deployments",
//!   SIGCOMM 2015) as NVIDIA's ConnectX firmware runs it: the reaction point (RP) of every QP
//!   cuts its rate on a CNP and recovers it with timers and a byte counter; the notification
//!   point (NP) answers CE-marked packets with CNPs, at most one per QP per
//!   `min_time_between_cnps`.
//!
//! Every QP owns one [`AnyController`] (it is both the RP of what it sends and the NP of what
//! it receives) and one [`Pacer`], the token bucket that enforces the controller's rate on
//! the requester's transmit path. The device owns one [`CongestionConfig`]: the algorithm and
//! the [`Params`], under the names of NVIDIA's DOCA "DCQCN CC Parameters" (mlx5's debugfs
//! `cc_params` names, with their `rp_`/`np_` prefixes, are accepted too) and with their
//! defaults. `docs/congestion.md` puts the paper's equations beside the code.
//!
//! **Time.** Time is passed in (nanoseconds of the caller's monotonic clock), and no
//! algorithm needs to be woken by a timer of its own: the firmware's 1 µs alpha period and
//! 4 µs rate-reduction period are finer than what a daemon on a virtual machine can sleep
//! (tens of µs), so every periodic rule is evaluated when the QP is next looked at (a packet
//! to send, a CNP), with the periods that elapsed in between applied at once: alpha's decay in
//! closed form, `(1 - g)^n`, and the rate-increase timer's missed expiries one after the
//! other, each at the instant it was due. The result is the state the firmware would have at
//! that moment; only the rate a QP sends at between two such looks lags, by at most the
//! distance to the next packet it sends (which is when the rate matters).

pub mod dcqcn;
pub mod none;
mod pacer;

pub use dcqcn::Dcqcn;
pub use none::NoControl;
pub use pacer::Pacer;

use super::timers::Nanos;

/// One QP's congestion controller: the reaction point of the packets it sends and the
/// notification point of the packets it receives.
pub trait Controller {
    /// The rate the QP may send at, in bits per second of IP packet bytes, after the
    /// periodic rules were brought up to `now`.
    fn rate(&mut self, now: Nanos, p: &Params) -> u64;
    /// True while the rate is below the line rate: the QP's packets are then paced. Cheap: the
    /// requester asks before every packet.
    fn limited(&self) -> bool;
    /// A CNP for this QP arrived. Returns false if the algorithm ignores CNPs (the engine
    /// counts it as `rp_cnp_ignored`).
    fn on_cnp(&mut self, now: Nanos, p: &Params) -> bool;
    /// `bytes` of this QP's requests left at `now` (the byte counter). Only called while
    /// [`Controller::limited`].
    fn on_sent(&mut self, now: Nanos, bytes: usize, p: &Params);
    /// A CE-marked data packet for this QP arrived: true to send a CNP to the sender now.
    fn on_ce(&mut self, now: Nanos, p: &Params) -> bool;
    /// The next time the rate changes by itself (a timer), if any: a paced QP is looked at
    /// again then at the latest.
    fn next_change(&self, _p: &Params) -> Option<Nanos> {
        None
    }
    /// What the controller shows of itself (`softroce res show`).
    fn state(&self, p: &Params) -> QpCongestion;
}

/// The algorithm a device runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    /// No congestion control: kernel rxe on the wire.
    #[default]
    None,
    /// DCQCN with ECN marking, CNPs and per-QP pacing.
    Dcqcn,
}

impl Algorithm {
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::None => "none",
            Algorithm::Dcqcn => "dcqcn",
        }
    }
}

impl core::str::FromStr for Algorithm {
    type Err = ParamError;
    fn from_str(s: &str) -> Result<Algorithm, ParamError> {
        match s.to_ascii_lowercase().as_str() {
            "none" | "off" => Ok(Algorithm::None),
            "dcqcn" | "on" => Ok(Algorithm::Dcqcn),
            _ => Err(ParamError::UnknownAlgorithm(s.to_owned())),
        }
    }
}

impl core::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// A device's congestion control: the algorithm and its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct CongestionConfig {
    pub algorithm: Algorithm,
    pub params: Params,
}

impl CongestionConfig {
    pub fn dcqcn() -> CongestionConfig {
        CongestionConfig {
            algorithm: Algorithm::Dcqcn,
            params: Params::default(),
        }
    }

    /// Whether data packets carry ECT(0).
    pub fn marks_ect(&self) -> bool {
        self.algorithm != Algorithm::None
    }
}

/// The parameters, with the units and defaults of NVIDIA's DOCA "DCQCN CC Parameters" (the
/// field names are DOCA's; [`Params::set`] takes mlx5's `rp_`/`np_` names too). Rates are in
/// Mbit/s, times in µs, as there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Params {
    // ----- reaction point -----
    /// Alpha's weight: `g = (1024 - dce_tcp_g) / 1024` in the paper's `α ← (1 - g)α + g`.
    pub dce_tcp_g: u32,
    /// Alpha's update period, µs (the paper's K).
    pub dce_tcp_rtt: u32,
    /// Alpha on the first CNP, in 1/1024.
    pub initial_alpha_value: u32,
    /// At most one rate decrease per this many µs.
    pub rate_reduce_monitor_period: u32,
    /// Mbit/s to set on the first CNP instead of cutting; 0 = cut as usual.
    pub rate_to_set_on_first_cnp: u32,
    /// A decrease is `RC·α >> rpg_gd` (α in 1/1024): 11 is the paper's `RC·α/2`.
    pub rpg_gd: u32,
    /// A single decrease leaves at least this percentage of the rate.
    pub rpg_min_dec_fac: u32,
    /// Mbit/s; no decrease goes below it.
    pub rpg_min_rate: u32,
    /// Mbit/s; the rate limiter's ceiling, 0 = the line rate.
    pub rpg_max_rate: u32,
    /// The rate-increase timer's period, µs (the paper's T); 0 = no timer.
    pub rpg_time_reset: u32,
    /// Bytes sent between two byte-counter increase events (the paper's B); 0 = none.
    pub rpg_byte_reset: u32,
    /// Increase events of fast recovery before additive increase (the paper's F).
    pub rpg_threshold: u32,
    /// Additive increase step, Mbit/s (R_AI).
    pub rpg_ai_rate: u32,
    /// Hyper increase step, Mbit/s (R_HAI).
    pub rpg_hai_rate: u32,
    /// On every decrease the target rate becomes the current rate (the paper's rule).
    pub clamp_tgt_rate: bool,
    /// On a decrease the target rate becomes the current rate if the timer raised the rate
    /// since the previous decrease.
    pub clamp_tgt_rate_after_time_inc: bool,
    // ----- notification point -----
    /// At most one CNP per QP per this many µs.
    pub min_time_between_cnps: u32,
    /// The DSCP of CNPs (their TOS is `cnp_dscp << 2 | ECT(0)`, 0xC2 for 48).
    pub cnp_dscp: u8,
    /// The 802.1p priority of CNPs, for a link layer that writes a VLAN tag (none does yet:
    /// the UDP device has no Ethernet header of its own).
    pub cnp_802p_prio: u8,
    // ----- softroce's own -----
    /// The device's line rate, Mbit/s: a QP at this rate is not paced at all. 100 Gbit/s by
    /// default, above what a software device sends, so an uncongested QP is never held back.
    pub line_rate: u32,
    /// How much lateness, in µs, a paced QP may make up with a burst: a daemon wakes later
    /// than the packet's time (timer resolution, a busy CPU) and then sends what it owes.
    /// The burst is at most this much of the QP's rate, or one full packet's time if that is
    /// more (then two packets can leave back to back).
    pub pacing_tolerance: u32,
}

impl Default for Params {
    fn default() -> Params {
        Params {
            dce_tcp_g: 1019,
            dce_tcp_rtt: 1,
            initial_alpha_value: 1023,
            rate_reduce_monitor_period: 4,
            rate_to_set_on_first_cnp: 0,
            rpg_gd: 11,
            rpg_min_dec_fac: 50,
            rpg_min_rate: 1,
            rpg_max_rate: 0,
            rpg_time_reset: 300,
            rpg_byte_reset: 32767,
            rpg_threshold: 1,
            rpg_ai_rate: 5,
            rpg_hai_rate: 50,
            clamp_tgt_rate: false,
            clamp_tgt_rate_after_time_inc: true,
            min_time_between_cnps: 4,
            cnp_dscp: 48,
            cnp_802p_prio: 6,
            line_rate: 100_000,
            pacing_tolerance: 20,
        }
    }
}

/// One parameter: its name, mlx5's name, unit and meaning.
#[derive(Debug, Clone, Copy)]
pub struct ParamInfo {
    pub name: &'static str,
    /// The mlx5 debugfs `cc_params` name, if it differs.
    pub mlx5: Option<&'static str>,
    pub unit: &'static str,
    pub help: &'static str,
}

/// Every parameter, in the order [`Params::values`] lists them.
pub const PARAMS: [ParamInfo; 21] = {
    const fn p(
        name: &'static str,
        mlx5: Option<&'static str>,
        unit: &'static str,
        help: &'static str,
    ) -> ParamInfo {
        ParamInfo {
            name,
            mlx5,
            unit,
            help,
        }
    }
    [
        p(
            "dce_tcp_g",
            Some("rp_dce_tcp_g"),
            "1/1024",
            "alpha weight g = (1024 - value)/1024",
        ),
        p(
            "dce_tcp_rtt",
            Some("rp_dce_tcp_rtt"),
            "us",
            "alpha update period",
        ),
        p(
            "initial_alpha_value",
            Some("rp_initial_alpha_value"),
            "1/1024",
            "alpha on the first CNP",
        ),
        p(
            "rate_reduce_monitor_period",
            Some("rp_rate_reduce_monitor_period"),
            "us",
            "at most one decrease per period",
        ),
        p(
            "rate_to_set_on_first_cnp",
            Some("rp_rate_to_set_on_first_cnp"),
            "Mbit/s",
            "rate set on the first CNP (0: cut)",
        ),
        p(
            "rpg_gd",
            Some("rp_gd"),
            "shift",
            "decrease = rate * alpha >> gd",
        ),
        p(
            "rpg_min_dec_fac",
            Some("rp_min_dec_fac"),
            "%",
            "a decrease keeps at least this much",
        ),
        p("rpg_min_rate", Some("rp_min_rate"), "Mbit/s", "lowest rate"),
        p(
            "rpg_max_rate",
            Some("rp_max_rate"),
            "Mbit/s",
            "highest rate (0: line rate)",
        ),
        p(
            "rpg_time_reset",
            Some("rp_time_reset"),
            "us",
            "rate-increase timer period (0: off)",
        ),
        p(
            "rpg_byte_reset",
            Some("rp_byte_reset"),
            "bytes",
            "bytes per byte-counter increase (0: off)",
        ),
        p(
            "rpg_threshold",
            Some("rp_threshold"),
            "events",
            "fast-recovery events before additive increase",
        ),
        p(
            "rpg_ai_rate",
            Some("rp_ai_rate"),
            "Mbit/s",
            "additive increase step",
        ),
        p(
            "rpg_hai_rate",
            Some("rp_hai_rate"),
            "Mbit/s",
            "hyper increase step",
        ),
        p(
            "clamp_tgt_rate",
            Some("rp_clamp_tgt_rate"),
            "0/1",
            "target = current rate on every decrease",
        ),
        p(
            "clamp_tgt_rate_after_time_inc",
            Some("rp_clamp_tgt_rate_ati"),
            "0/1",
            "target = current rate on a decrease after a timer increase",
        ),
        p(
            "min_time_between_cnps",
            Some("np_min_time_between_cnps"),
            "us",
            "at most one CNP per QP per period",
        ),
        p("cnp_dscp", Some("np_cnp_dscp"), "0-63", "DSCP of CNPs"),
        p(
            "cnp_802p_prio",
            Some("np_cnp_prio"),
            "0-7",
            "802.1p priority of CNPs (VLAN-tagged links)",
        ),
        p(
            "line_rate",
            None,
            "Mbit/s",
            "the device's line rate: QPs at it are not paced",
        ),
        p(
            "pacing_tolerance",
            None,
            "us",
            "lateness a paced QP may make up in one burst",
        ),
    ]
};

/// Why a `NAME=VALUE` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamError {
    #[error("unknown congestion control parameter {0:?} (known: {known})", known = known_names())]
    Unknown(String),
    #[error("congestion control parameter {name}: {value:?} is not {expected}")]
    BadValue {
        name: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("expected NAME=VALUE, got {0:?}")]
    Syntax(String),
    #[error("unknown congestion control algorithm {0:?} (dcqcn or none)")]
    UnknownAlgorithm(String),
}

fn known_names() -> String {
    PARAMS.iter().map(|p| p.name).collect::<Vec<_>>().join(", ")
}

impl Params {
    /// The canonical name of `name` (a DOCA or mlx5 name, any case).
    pub fn canonical(name: &str) -> Option<&'static str> {
        let n = name.trim().to_ascii_lowercase();
        PARAMS
            .iter()
            .find(|p| p.name == n || p.mlx5 == Some(n.as_str()))
            .map(|p| p.name)
    }

    /// Sets one parameter from its text form. Booleans take 0/1, true/false, on/off.
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), ParamError> {
        let Some(name) = Params::canonical(name) else {
            return Err(ParamError::Unknown(name.to_owned()));
        };
        let v = value.trim();
        let bad = |expected| ParamError::BadValue {
            name,
            value: v.to_owned(),
            expected,
        };
        let num = |lo: u32, hi: u32, expected| {
            v.parse::<u32>()
                .ok()
                .filter(|x| (lo..=hi).contains(x))
                .ok_or_else(|| bad(expected))
        };
        let flag = || match v.to_ascii_lowercase().as_str() {
            "1" | "true" | "on" | "yes" => Ok(true),
            "0" | "false" | "off" | "no" => Ok(false),
            _ => Err(bad("0 or 1")),
        };
        const ANY: u32 = u32::MAX;
        match name {
            "dce_tcp_g" => self.dce_tcp_g = num(0, 1024, "0..=1024")?,
            "dce_tcp_rtt" => self.dce_tcp_rtt = num(1, ANY, "a period of at least 1 us")?,
            "initial_alpha_value" => self.initial_alpha_value = num(0, 1023, "0..=1023")?,
            "rate_reduce_monitor_period" => {
                self.rate_reduce_monitor_period = num(0, ANY, "a number of us")?
            }
            "rate_to_set_on_first_cnp" => {
                self.rate_to_set_on_first_cnp = num(0, ANY, "a rate in Mbit/s")?
            }
            "rpg_gd" => self.rpg_gd = num(0, 31, "0..=31")?,
            "rpg_min_dec_fac" => self.rpg_min_dec_fac = num(1, 100, "a percentage 1..=100")?,
            "rpg_min_rate" => self.rpg_min_rate = num(1, ANY, "a rate of at least 1 Mbit/s")?,
            "rpg_max_rate" => self.rpg_max_rate = num(0, ANY, "a rate in Mbit/s (0: line)")?,
            "rpg_time_reset" => self.rpg_time_reset = num(0, ANY, "a number of us")?,
            "rpg_byte_reset" => self.rpg_byte_reset = num(0, ANY, "a number of bytes")?,
            "rpg_threshold" => self.rpg_threshold = num(0, 1000, "0..=1000")?,
            "rpg_ai_rate" => self.rpg_ai_rate = num(0, ANY, "a rate in Mbit/s")?,
            "rpg_hai_rate" => self.rpg_hai_rate = num(0, ANY, "a rate in Mbit/s")?,
            "clamp_tgt_rate" => self.clamp_tgt_rate = flag()?,
            "clamp_tgt_rate_after_time_inc" => self.clamp_tgt_rate_after_time_inc = flag()?,
            "min_time_between_cnps" => self.min_time_between_cnps = num(0, ANY, "a number of us")?,
            "cnp_dscp" => self.cnp_dscp = num(0, 63, "a DSCP 0..=63")? as u8,
            "cnp_802p_prio" => self.cnp_802p_prio = num(0, 7, "a priority 0..=7")? as u8,
            "line_rate" => self.line_rate = num(1, ANY, "a rate of at least 1 Mbit/s")?,
            "pacing_tolerance" => self.pacing_tolerance = num(0, ANY, "a number of us")?,
            _ => unreachable!("every name in PARAMS is handled"),
        }
        Ok(())
    }

    /// Applies one `NAME=VALUE` (the form of `--cc-param`).
    pub fn apply(&mut self, assignment: &str) -> Result<(), ParamError> {
        let (name, value) = assignment
            .split_once('=')
            .ok_or_else(|| ParamError::Syntax(assignment.to_owned()))?;
        self.set(name, value)
    }

    /// Every parameter's name and value, in [`PARAMS`] order.
    pub fn values(&self) -> [(&'static str, u64); 21] {
        let b = u64::from;
        let v = [
            b(self.dce_tcp_g),
            b(self.dce_tcp_rtt),
            b(self.initial_alpha_value),
            b(self.rate_reduce_monitor_period),
            b(self.rate_to_set_on_first_cnp),
            b(self.rpg_gd),
            b(self.rpg_min_dec_fac),
            b(self.rpg_min_rate),
            b(self.rpg_max_rate),
            b(self.rpg_time_reset),
            b(self.rpg_byte_reset),
            b(self.rpg_threshold),
            b(self.rpg_ai_rate),
            b(self.rpg_hai_rate),
            u64::from(self.clamp_tgt_rate),
            u64::from(self.clamp_tgt_rate_after_time_inc),
            b(self.min_time_between_cnps),
            u64::from(self.cnp_dscp),
            u64::from(self.cnp_802p_prio),
            b(self.line_rate),
            b(self.pacing_tolerance),
        ];
        core::array::from_fn(|i| (PARAMS[i].name, v[i]))
    }

    /// The line rate in bits per second.
    pub fn line_rate_bps(&self) -> u64 {
        mbps(self.line_rate)
    }

    /// The highest rate a QP sends at, bits per second: `rpg_max_rate`, or the line rate.
    pub fn max_rate_bps(&self) -> u64 {
        let line = self.line_rate_bps();
        match self.rpg_max_rate {
            0 => line,
            m => mbps(m).min(line),
        }
    }
}

/// Mbit/s to bit/s.
pub(crate) fn mbps(v: u32) -> u64 {
    u64::from(v) * 1_000_000
}

/// µs to ns.
pub(crate) fn us(v: u32) -> Nanos {
    u64::from(v) * 1_000
}

/// What a QP's controller shows: its rates and, for DCQCN, alpha.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct QpCongestion {
    /// The rate the QP sends at (RC), bits per second.
    pub rate_bps: u64,
    /// The rate it recovers towards (RT), bits per second.
    pub target_bps: u64,
    /// DCQCN's alpha, 0..=1 (0 for other algorithms).
    pub alpha: f64,
    /// Whether its packets are paced (its rate is below the line rate).
    pub limited: bool,
}

/// The controller of one QP: one variant per algorithm, dispatched without a vtable (as
/// smoltcp's `AnyController`).
#[derive(Debug, Clone)]
pub enum AnyController {
    None(NoControl),
    Dcqcn(Dcqcn),
}

impl AnyController {
    pub fn new(config: &CongestionConfig) -> AnyController {
        match config.algorithm {
            Algorithm::None => AnyController::None(NoControl),
            Algorithm::Dcqcn => AnyController::Dcqcn(Dcqcn::new(&config.params)),
        }
    }

    #[inline]
    pub fn inner(&self) -> &dyn Controller {
        match self {
            AnyController::None(c) => c,
            AnyController::Dcqcn(c) => c,
        }
    }

    #[inline]
    pub fn inner_mut(&mut self) -> &mut dyn Controller {
        match self {
            AnyController::None(c) => c,
            AnyController::Dcqcn(c) => c,
        }
    }

    /// [`Controller::limited`] without an indirect call (asked before every packet).
    #[inline(always)]
    pub fn limited(&self) -> bool {
        match self {
            AnyController::None(_) => false,
            AnyController::Dcqcn(c) => c.limited(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_nvidias() {
        let p = Params::default();
        assert_eq!(p.dce_tcp_g, 1019);
        assert_eq!(p.dce_tcp_rtt, 1);
        assert_eq!(p.initial_alpha_value, 1023);
        assert_eq!(p.rate_reduce_monitor_period, 4);
        assert_eq!((p.rpg_gd, p.rpg_min_dec_fac, p.rpg_min_rate), (11, 50, 1));
        assert_eq!(
            (p.rpg_time_reset, p.rpg_byte_reset, p.rpg_threshold),
            (300, 32767, 1)
        );
        assert_eq!((p.rpg_ai_rate, p.rpg_hai_rate), (5, 50));
        assert!(!p.clamp_tgt_rate && p.clamp_tgt_rate_after_time_inc);
        assert_eq!(
            (p.min_time_between_cnps, p.cnp_dscp, p.cnp_802p_prio),
            (4, 48, 6)
        );
        assert_eq!(p.max_rate_bps(), 100_000_000_000);
    }

    #[test]
    fn name_value_parsing_takes_doca_and_mlx5_names() {
        let mut p = Params::default();
        p.apply("rpg_time_reset=55").unwrap();
        p.apply("RP_AI_RATE = 10").unwrap();
        p.apply("np_min_time_between_cnps=50").unwrap();
        p.apply("rp_clamp_tgt_rate_ati=off").unwrap();
        p.apply("clamp_tgt_rate=1").unwrap();
        p.apply("rpg_max_rate=10").unwrap();
        assert_eq!(
            (p.rpg_time_reset, p.rpg_ai_rate, p.min_time_between_cnps),
            (55, 10, 50)
        );
        assert!(p.clamp_tgt_rate && !p.clamp_tgt_rate_after_time_inc);
        assert_eq!(p.max_rate_bps(), 10_000_000);
        assert!(matches!(p.apply("nonsense=1"), Err(ParamError::Unknown(_))));
        assert!(matches!(
            p.apply("cnp_dscp=64"),
            Err(ParamError::BadValue { .. })
        ));
        assert!(matches!(
            p.apply("dce_tcp_rtt=0"),
            Err(ParamError::BadValue { .. })
        ));
        assert!(matches!(p.apply("rpg_gd"), Err(ParamError::Syntax(_))));
        assert!(p.apply("rpg_min_dec_fac=x").is_err());
        let listed = p.values();
        assert_eq!(listed[9], ("rpg_time_reset", 55));
        assert!(PARAMS
            .iter()
            .all(|i| Params::canonical(i.name) == Some(i.name)));
        assert_eq!("DCQCN".parse::<Algorithm>().unwrap(), Algorithm::Dcqcn);
        assert!("reno".parse::<Algorithm>().is_err());
    }
}
