//! The seam for congestion control. rxe has none (roce-rxe-facts.md §9.1): the default
//! [`NoCongestionControl`] never paces, never sends CNPs and ignores them, which is exactly
//! rxe on the wire. DCQCN plugs in here later.
//!
//! The engine calls the hooks at the four places RoCE congestion control needs them:
//! - before a request packet leaves ([`CongestionControl::pacing`]): the reaction point's rate
//!   limiter may hold it back until a later time;
//! - when a packet arrives with ECN CE set ([`CongestionControl::on_ecn_marked`]): the
//!   notification point decides whether to send a CNP back to the sender's QP;
//! - when a CNP (opcode 0x81) arrives ([`CongestionControl::on_cnp`]): the reaction point cuts
//!   the rate of that QP;
//! - after a packet was sent ([`CongestionControl::on_sent`]): byte counting for rate increase.

use super::timers::Nanos;
use crate::types::Qpn;

pub trait CongestionControl: core::fmt::Debug {
    /// May `qpn` send a `len`-byte packet at `now`? `None` = yes; `Some(t)` = not before `t`.
    fn pacing(&mut self, _qpn: Qpn, _now: Nanos, _len: usize) -> Option<Nanos> {
        None
    }
    /// Called for each transmitted request packet.
    fn on_sent(&mut self, _qpn: Qpn, _now: Nanos, _len: usize) {}
    /// A packet for local QP `qpn` arrived marked CE. Return true to send a CNP to the remote
    /// QP of that flow (the NP usually rate-limits CNPs to one per 50 µs per QP).
    fn on_ecn_marked(&mut self, _qpn: Qpn, _now: Nanos) -> bool {
        false
    }
    /// A CNP arrived for local QP `qpn`.
    fn on_cnp(&mut self, _qpn: Qpn, _now: Nanos) {}
    /// The ECN bits data packets of `qpn` carry; `None` keeps the AV traffic class verbatim
    /// (rxe). A DCQCN RP returns ECT(0) = 0b10.
    fn ecn_codepoint(&mut self, _qpn: Qpn) -> Option<u8> {
        None
    }
}

/// rxe's behaviour: no congestion control at all.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoCongestionControl;

impl CongestionControl for NoCongestionControl {}
