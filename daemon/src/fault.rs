//! Fault injection (`softroce fault`), sans-I/O, as smoltcp's `phy::FaultInjector`: rules
//! decide, packet by packet, whether a packet passes, is lost, duplicated, delayed, reordered
//! or corrupted, or whether the responder must answer it with an RNR NAK or a remote access
//! error NAK. The device's packet I/O asks [`FaultInjector::decide`] for each packet (only
//! while a rule exists: [`FaultInjector::is_on`]) and carries the decision out; delayed and
//! reordered packets wait in a [`HeldPackets`]. Randomness comes from a seeded generator and
//! time is passed in, so a run is reproducible.

use proto::ctl::{FaultDirection, FaultKind, FaultRule, FaultStatus, FaultTrigger};
use proto::transport::{ForcedNak, Nanos};
use proto::wire::Opcode;

/// How long a reordered packet waits at most for a packet to overtake it.
pub const REORDER_WAIT: Nanos = 5_000_000;

/// Which way a packet crosses the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// Sent to another host.
    Tx,
    /// Received from another host.
    Rx,
    /// Between two QPs of the device: sent and received by it.
    Local,
}

/// What to do with one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Pass,
    Drop,
    /// Deliver it, then once more.
    Duplicate,
    /// Hold it until this time.
    Delay(Nanos),
    /// Hold it until the next packet the same way has passed (at most [`REORDER_WAIT`]).
    Reorder,
    /// Break its ICRC: flip a payload bit after sealing (sent), or drop it as the receiver's
    /// ICRC check would (received), counting it as an ICRC error.
    Corrupt,
    /// Hand it to the engine with this forced answer, then report with
    /// [`FaultInjector::confirm_nak`] whether the engine gave it.
    Nak {
        nak: ForcedNak,
        rule: usize,
    },
}

struct Rule {
    rule: FaultRule,
    /// BTH destination QPNs the rule takes (its QP and that QP's peer); empty: all.
    qpns: Vec<u32>,
    injected: u64,
    /// `--next N`: how many are left.
    left: Option<u32>,
}

/// The xorshift64* generator: small, fast, seeded.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// One device's fault rules.
pub struct FaultInjector {
    rules: Vec<Rule>,
    rng: Rng,
}

impl FaultInjector {
    pub fn new(seed: u64) -> FaultInjector {
        FaultInjector {
            rules: Vec::new(),
            rng: Rng(seed | 1),
        }
    }

    /// Whether any rule is in force: the packet I/O asks before anything else.
    #[inline]
    pub fn is_on(&self) -> bool {
        !self.rules.is_empty()
    }

    /// Adds a rule; `qpns` are the destination QPNs its `--qp` means on this device.
    pub fn add(&mut self, rule: FaultRule, qpns: Vec<u32>) {
        let left = match rule.trigger {
            FaultTrigger::Next { count } => Some(count),
            FaultTrigger::Rate { .. } => None,
        };
        self.rules.push(Rule {
            rule,
            qpns,
            injected: 0,
            left,
        });
    }

    pub fn clear(&mut self) {
        self.rules.clear();
    }

    /// The rules in force and what each has done (spent `--next` rules included until
    /// cleared).
    pub fn status(&self) -> Vec<FaultStatus> {
        self.rules
            .iter()
            .map(|r| FaultStatus {
                rule: r.rule,
                injected: r.injected,
            })
            .collect()
    }

    /// Decides for one packet (`bth`: its BTH and what follows) crossing the device `way`.
    /// The first rule that takes the packet decides.
    pub fn decide(&mut self, now: Nanos, way: Way, bth: &[u8]) -> Decision {
        let (Some(&opcode), Some(q)) = (bth.first(), bth.get(5..8)) else {
            return Decision::Pass;
        };
        let dqpn = u32::from_be_bytes([0, q[0], q[1], q[2]]);
        let info = Opcode(opcode).info();
        for (index, r) in self.rules.iter_mut().enumerate() {
            if r.left == Some(0) || (!r.qpns.is_empty() && !r.qpns.contains(&dqpn)) {
                continue;
            }
            let direction_ok = match (r.rule.direction, way) {
                (FaultDirection::Both, _) | (_, Way::Local) => true,
                (FaultDirection::Tx, w) => w == Way::Tx,
                (FaultDirection::Rx, w) => w == Way::Rx,
            };
            if !direction_ok {
                continue;
            }
            let nak = match r.rule.kind {
                FaultKind::Rnr => Some(ForcedNak::Rnr),
                FaultKind::AccessError => Some(ForcedNak::AccessError),
                _ => None,
            };
            if let Some(nak) = nak {
                // The responder's answer: only requests this device receives, and only those
                // that could meet the condition.
                if way == Way::Tx || !info.is_some_and(|i| nak.applies_to(i)) {
                    continue;
                }
            }
            let fires = match r.rule.trigger {
                FaultTrigger::Next { .. } => true,
                FaultTrigger::Rate { ppm } => self.rng.next() % 1_000_000 < u64::from(ppm),
            };
            if !fires {
                continue;
            }
            if let Some(nak) = nak {
                // Counted once the engine says it gave the answer.
                return Decision::Nak { nak, rule: index };
            }
            r.injected += 1;
            if let Some(left) = &mut r.left {
                *left -= 1;
            }
            return match r.rule.kind {
                FaultKind::Drop => Decision::Drop,
                FaultKind::Duplicate => Decision::Duplicate,
                FaultKind::Delay { ms } => Decision::Delay(now + u64::from(ms) * 1_000_000),
                FaultKind::Reorder => Decision::Reorder,
                FaultKind::Corrupt => Decision::Corrupt,
                FaultKind::Rnr | FaultKind::AccessError => unreachable!("handled above"),
            };
        }
        Decision::Pass
    }

    /// After a [`Decision::Nak`]: whether the engine answered the packet so (it does only
    /// for a request it would have executed).
    pub fn confirm_nak(&mut self, rule: usize, given: bool) {
        if let Some(r) = self.rules.get_mut(rule).filter(|_| given) {
            r.injected += 1;
            if let Some(left) = &mut r.left {
                *left = left.saturating_sub(1);
            }
        }
    }
}

/// Packets held back by [`Decision::Delay`] and [`Decision::Reorder`], released in order of
/// their time (a reordered packet: as soon as another has passed the same way).
pub struct HeldPackets<P> {
    /// (due, way it goes, packet), in arrival order.
    held: Vec<(Nanos, Way, bool, P)>,
}

impl<P> Default for HeldPackets<P> {
    fn default() -> Self {
        HeldPackets { held: Vec::new() }
    }
}

impl<P> HeldPackets<P> {
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn delay(&mut self, due: Nanos, way: Way, packet: P) {
        self.held.push((due, way, false, packet));
    }

    pub fn reorder(&mut self, now: Nanos, way: Way, packet: P) {
        self.held.push((now + REORDER_WAIT, way, true, packet));
    }

    /// A packet passed `way`: the reordered packets waiting for that are due now.
    pub fn passed(&mut self, now: Nanos, way: Way) {
        for h in &mut self.held {
            if h.2 && h.1 == way {
                h.0 = h.0.min(now);
                h.2 = false;
            }
        }
    }

    /// The next packet due at `now`, earliest first.
    pub fn pop_due(&mut self, now: Nanos) -> Option<(Way, P)> {
        let i = self
            .held
            .iter()
            .enumerate()
            .filter(|(_, h)| h.0 <= now)
            .min_by_key(|(i, h)| (h.0, *i))
            .map(|(i, _)| i)?;
        let (_, way, _, p) = self.held.remove(i);
        Some((way, p))
    }

    /// When the next held packet is due.
    pub fn poll_at(&self) -> Option<Nanos> {
        self.held.iter().map(|h| h.0).min()
    }
}

/// Flips one bit of the payload of a sealed transport packet (BTH..ICRC), so that its ICRC
/// no longer matches: after the 12-byte BTH, before the ICRC, or in the ICRC itself for a
/// packet without payload.
pub fn corrupt(packet: &mut [u8]) {
    let n = packet.len();
    if n > 12 + 4 {
        packet[12 + (n - 16) / 2] ^= 0x10;
    } else if let Some(b) = packet.last_mut() {
        *b ^= 0x10;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bth(opcode: u8, dqpn: u32) -> Vec<u8> {
        let mut b = vec![0u8; 12 + 16 + 4];
        b[0] = opcode;
        b[5..8].copy_from_slice(&dqpn.to_be_bytes()[1..]);
        b
    }

    fn rule(kind: FaultKind, trigger: FaultTrigger) -> FaultRule {
        FaultRule {
            kind,
            trigger,
            qpn: None,
            direction: FaultDirection::Both,
        }
    }

    const SEND_ONLY: u8 = 0x04;
    const WRITE_ONLY: u8 = 0x0a;
    const ACK: u8 = 0x11;

    #[test]
    fn next_n_takes_exactly_n_packets_then_is_spent() {
        let mut f = FaultInjector::new(1);
        assert!(!f.is_on());
        f.add(
            rule(FaultKind::Drop, FaultTrigger::Next { count: 2 }),
            Vec::new(),
        );
        let p = bth(SEND_ONLY, 0x11);
        let got: Vec<Decision> = (0..4).map(|_| f.decide(0, Way::Tx, &p)).collect();
        assert_eq!(
            got,
            [
                Decision::Drop,
                Decision::Drop,
                Decision::Pass,
                Decision::Pass
            ]
        );
        assert_eq!(f.status()[0].injected, 2);
        f.clear();
        assert!(!f.is_on());
    }

    #[test]
    fn a_rate_is_about_right_and_the_same_for_the_same_seed() {
        let run = |seed| {
            let mut f = FaultInjector::new(seed);
            f.add(
                rule(FaultKind::Duplicate, FaultTrigger::Rate { ppm: 100_000 }),
                Vec::new(),
            );
            let p = bth(SEND_ONLY, 0x11);
            (0..10_000)
                .map(|_| f.decide(0, Way::Rx, &p) == Decision::Duplicate)
                .collect::<Vec<bool>>()
        };
        let a = run(7);
        let hits = a.iter().filter(|x| **x).count();
        assert!((800..1200).contains(&hits), "{hits} of 10000 at 10%");
        assert_eq!(a, run(7));
        assert_ne!(a, run(8));
    }

    #[test]
    fn direction_qp_and_kind_decide_what_a_rule_takes() {
        let mut f = FaultInjector::new(3);
        f.add(
            FaultRule {
                direction: FaultDirection::Rx,
                ..rule(FaultKind::Delay { ms: 5 }, FaultTrigger::Next { count: 10 })
            },
            vec![0x11],
        );
        assert_eq!(f.decide(0, Way::Tx, &bth(SEND_ONLY, 0x11)), Decision::Pass);
        assert_eq!(f.decide(0, Way::Rx, &bth(SEND_ONLY, 0x12)), Decision::Pass);
        assert_eq!(
            f.decide(1_000, Way::Rx, &bth(SEND_ONLY, 0x11)),
            Decision::Delay(5_001_000)
        );
        assert_eq!(
            f.decide(0, Way::Local, &bth(ACK, 0x11)),
            Decision::Delay(5_000_000)
        );
    }

    #[test]
    fn forced_naks_only_for_requests_that_could_meet_them_and_count_when_given() {
        let mut f = FaultInjector::new(3);
        f.add(
            rule(FaultKind::Rnr, FaultTrigger::Next { count: 1 }),
            Vec::new(),
        );
        f.add(
            rule(FaultKind::AccessError, FaultTrigger::Next { count: 1 }),
            Vec::new(),
        );
        // An ACK, and anything sent, is never NAKed by this device's responder.
        assert_eq!(f.decide(0, Way::Rx, &bth(ACK, 0x11)), Decision::Pass);
        assert_eq!(f.decide(0, Way::Tx, &bth(SEND_ONLY, 0x11)), Decision::Pass);
        let d = f.decide(0, Way::Rx, &bth(SEND_ONLY, 0x11));
        assert_eq!(
            d,
            Decision::Nak {
                nak: ForcedNak::Rnr,
                rule: 0
            }
        );
        // The engine did not give it (a duplicate, say): still pending.
        f.confirm_nak(0, false);
        assert!(matches!(
            f.decide(0, Way::Local, &bth(SEND_ONLY, 0x11)),
            Decision::Nak { rule: 0, .. }
        ));
        f.confirm_nak(0, true);
        assert_eq!(f.status()[0].injected, 1);
        // A WRITE needs no receive WQE: the RNR rule is spent anyway, the access error takes it.
        assert_eq!(
            f.decide(0, Way::Rx, &bth(WRITE_ONLY, 0x11)),
            Decision::Nak {
                nak: ForcedNak::AccessError,
                rule: 1
            }
        );
    }

    #[test]
    fn held_packets_come_out_when_due_and_reordered_ones_after_the_next() {
        let mut h: HeldPackets<&str> = HeldPackets::default();
        h.delay(100, Way::Tx, "late");
        h.reorder(0, Way::Tx, "swapped");
        assert_eq!(h.poll_at(), Some(100));
        assert_eq!(h.pop_due(50), None);
        h.passed(60, Way::Rx);
        assert_eq!(
            h.pop_due(60),
            None,
            "a packet the other way does not overtake"
        );
        h.passed(60, Way::Tx);
        assert_eq!(h.pop_due(60), Some((Way::Tx, "swapped")));
        assert_eq!(h.pop_due(99), None);
        assert_eq!(h.pop_due(100), Some((Way::Tx, "late")));
        assert!(h.is_empty());
        h.reorder(0, Way::Rx, "alone");
        assert_eq!(h.pop_due(REORDER_WAIT), Some((Way::Rx, "alone")));
    }

    #[test]
    fn corruption_changes_one_bit() {
        let mut p = bth(SEND_ONLY, 1);
        let before = p.clone();
        corrupt(&mut p);
        let diff: u32 = p
            .iter()
            .zip(&before)
            .map(|(a, b)| (a ^ b).count_ones())
            .sum();
        assert_eq!(diff, 1);
        assert_eq!(
            &p[..12],
            &before[..12],
            "the BTH is kept: the packet still parses"
        );
    }
}
