//! softroce's capability exchange: a vendor-specific MAD on QP1 with which two softroce
//! devices learn that both do selective retransmission (`transport::selective`), and a
//! per-peer cache of the answers, free of I/O.
//!
//! **The MAD** (IBTA Vol. 1 §13.4.3, vendor class range 2, the form with an OUI): class
//! [`CLASS`], class version 1, method Get (the probe) or GetResp (the answer, same TID),
//! attribute [`ATTR_CAPS`]. Bytes 24..36 are the (unused) RMPP header, 37..40 the OUI
//! [`OUI`] (an IEEE 802 *administratively assigned* identifier, ZYXM = 0010: no registered
//! OUI is claimed), and the data from byte 40:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 40 | 4 | magic `SRCE` |
//! | 44 | 1 | version, [`VERSION`] |
//! | 45 | 1 | flags: bit 0 selective retransmission offered; bit 1 any IPv4 Identification accepted |
//! | 46 | 2 | reserved, 0 |
//! | 48 | 4 | the bandwidth-delay product (bytes) its selective window is capped at |
//!
//! Both the probe and the answer carry the sender's capabilities, so one exchange informs
//! both ends.
//!
//! **Any IPv4 Identification** (flag bit 1): the ICRC covers the IPv4 header's
//! Identification, which a UDP socket never shows; a device on one (`--addr`, `--netdev`)
//! solves for it, so it accepts any. A sender that knows this batches IPv4 packets to it with
//! UDP GSO on any path, however the segmentation numbers them; toward anyone else only on
//! loopback, whose numbering is known. A device that sees whole frames (the TAP device)
//! checks the Identification it sees, and does not set the bit. Flags a version does not
//! know are ignored, so a device that predates the bit simply gets no GSO over IPv4.
//!
//! **A peer that is not softroce.** Linux's MAD layer answers a Get of a class nobody
//! registered with a GetResp of status 0x000C ("unsupported method/attribute",
//! `generate_unmatched_resp`); that is a definite no. A peer that does not answer at all is
//! asked [`PROBE_TRIES`] times, then taken for a no. Until the answer, QPs toward it use
//! go-back-N, so nothing waits for it; the daemon switches them when a yes arrives.

use crate::wire::mad::{MadHeader, HEADER_LEN, MAD_LEN};
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;

use super::conn::Transmit;

/// Vendor-specific management class with OUI (range 2 is 0x30..0x4F).
pub const CLASS: u8 = 0x30;
pub const CLASS_VERSION: u8 = 1;
pub const METHOD_GET: u8 = 0x01;
pub const METHOD_GET_RESP: u8 = 0x81;
/// The capabilities attribute.
pub const ATTR_CAPS: u16 = 0x0010;
/// softroce's identifier in the OUI field: "SR" in the IEEE 802 AAI space (first octet
/// 0x02: locally administered, no registration).
pub const OUI: [u8; 3] = [0x02, 0x53, 0x52];
pub const MAGIC: [u8; 4] = *b"SRCE";
pub const VERSION: u8 = 1;
/// MAD status of Linux's answer to a class it does not serve.
pub const STATUS_UNSUPPORTED: u16 = 0x000c;

const FLAG_SELECTIVE: u8 = 1;
const FLAG_ANY_IDENT: u8 = 2;
const OUI_AT: usize = 37;
const DATA_AT: usize = 40;

/// Probes sent to a silent peer before it is taken for one that is not softroce.
pub const PROBE_TRIES: u32 = 4;
/// The first probe's wait for an answer; it doubles with each retry (10, 20, 40, 80 ms).
pub const PROBE_TIMEOUT_NS: u64 = 10_000_000;
/// How long an answer is believed: a peer address may change hands (a softroce daemon
/// restarted as kernel rxe, or with another setting).
pub const ANSWER_TTL_NS: u64 = 60_000_000_000;
/// How long "no answer" is believed before the next QP toward the peer asks again.
pub const SILENCE_TTL_NS: u64 = 10_000_000_000;
/// Peers a cache remembers from probes it did not ask for. Anyone can send a probe from any
/// address (QP1 takes UDP from everywhere): past this, answers expired are forgotten first,
/// and a probe from a new address is answered without being remembered. Peers this device
/// asks about itself (its own QPs' destinations) are always remembered.
pub const MAX_UNASKED_PEERS: usize = 4096;

/// What a softroce device offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    pub selective: bool,
    /// Its selective window's bandwidth-delay product.
    pub bdp_bytes: u32,
    /// It accepts packets whatever their IPv4 Identification (it solves for it).
    pub any_ident: bool,
}

/// A capabilities MAD, probe or answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapsMad {
    pub answer: bool,
    pub transaction_id: u64,
    pub caps: Caps,
}

/// What [`classify`] makes of a MAD on QP1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Classified {
    /// Not ours: it goes to the connection manager (or is dropped) as before.
    Other,
    /// A softroce capabilities probe or answer.
    Caps(CapsMad),
    /// An answer to a probe from a device that does not serve the class (kernel rxe).
    Refused { transaction_id: u64 },
}

impl CapsMad {
    pub fn emit(&self) -> [u8; MAD_LEN] {
        let mut b = [0u8; MAD_LEN];
        MadHeader {
            base_version: 1,
            mgmt_class: CLASS,
            class_version: CLASS_VERSION,
            method: if self.answer {
                METHOD_GET_RESP
            } else {
                METHOD_GET
            },
            status: 0,
            transaction_id: self.transaction_id,
            attribute_id: ATTR_CAPS,
            attribute_modifier: 0,
        }
        .emit(&mut b[..HEADER_LEN]);
        b[OUI_AT..DATA_AT].copy_from_slice(&OUI);
        let d = &mut b[DATA_AT..];
        d[..4].copy_from_slice(&MAGIC);
        d[4] = VERSION;
        d[5] = if self.caps.selective {
            FLAG_SELECTIVE
        } else {
            0
        } | if self.caps.any_ident {
            FLAG_ANY_IDENT
        } else {
            0
        };
        d[8..12].copy_from_slice(&self.caps.bdp_bytes.to_be_bytes());
        b
    }
}

/// Sorts a MAD received on QP1 (the whole 256-byte payload).
pub fn classify(mad: &[u8]) -> Classified {
    if mad.len() != MAD_LEN {
        return Classified::Other;
    }
    let Ok(h) = MadHeader::parse(mad) else {
        return Classified::Other;
    };
    if h.mgmt_class != CLASS || h.attribute_id != ATTR_CAPS {
        return Classified::Other;
    }
    let answer = match h.method {
        METHOD_GET => false,
        METHOD_GET_RESP => true,
        _ => return Classified::Other,
    };
    if answer && h.status != 0 {
        return Classified::Refused {
            transaction_id: h.transaction_id,
        };
    }
    let d = &mad[DATA_AT..];
    if h.class_version != CLASS_VERSION || mad[OUI_AT..DATA_AT] != OUI || d[..4] != MAGIC {
        return if answer {
            Classified::Refused {
                transaction_id: h.transaction_id,
            }
        } else {
            Classified::Other
        };
    }
    // A later version keeps the fields of this one; its flags beyond ours are ignored.
    if d[4] < VERSION {
        return Classified::Other;
    }
    Classified::Caps(CapsMad {
        answer,
        transaction_id: h.transaction_id,
        caps: Caps {
            selective: d[5] & FLAG_SELECTIVE != 0,
            bdp_bytes: u32::from_be_bytes([d[8], d[9], d[10], d[11]]),
            any_ident: d[5] & FLAG_ANY_IDENT != 0,
        },
    })
}

/// What is known of a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerCaps {
    /// Not known yet: a probe is out (QPs use go-back-N meanwhile).
    Asking,
    /// A softroce device with these capabilities.
    Softroce(Caps),
    /// Not a softroce device (refused or never answered).
    Other,
}

#[derive(Debug, Clone, Copy)]
enum Entry {
    Probing { tid: u64, tries: u32, next_at: u64 },
    Known { caps: Option<Caps>, until: u64 },
}

/// The per-device cache of peers' capabilities and the probes it sends (quinn-proto style:
/// `lookup`/`handle_mad`/`handle_timeout` in, `poll_transmit`/`poll_update`/`poll_timeout`
/// out). Time is nanoseconds from any monotonic origin.
#[derive(Debug)]
pub struct CapsCache {
    local: Caps,
    peers: HashMap<IpAddr, Entry>,
    next_tid: u64,
    transmits: VecDeque<Transmit>,
    updates: VecDeque<(IpAddr, PeerCaps)>,
}

impl CapsCache {
    /// `local`: what this device offers (a device on go-back-N answers probes with
    /// `selective: false`). `tid_seed` makes transaction IDs differ across daemons.
    pub fn new(local: Caps, tid_seed: u64) -> CapsCache {
        CapsCache {
            local,
            peers: HashMap::new(),
            next_tid: tid_seed | 1,
            transmits: VecDeque::new(),
            updates: VecDeque::new(),
        }
    }

    pub fn local(&self) -> Caps {
        self.local
    }

    /// What is known of `peer`. Unknown or stale: a probe goes out and the answer arrives
    /// later through [`CapsCache::poll_update`]. A stale answer is still returned while the
    /// new probe is out.
    pub fn lookup(&mut self, now: u64, peer: IpAddr) -> PeerCaps {
        match self.peers.get(&peer).copied() {
            Some(Entry::Known { caps, until }) if until > now => known(caps),
            Some(Entry::Probing { .. }) => PeerCaps::Asking,
            stale => {
                self.probe(now, peer, 0);
                match stale {
                    Some(Entry::Known { caps, .. }) => known(caps),
                    _ => PeerCaps::Asking,
                }
            }
        }
    }

    /// Every peer asked about or heard from, and what is known of it, by address (for
    /// display: `softroce link show`). A stale answer is shown until the next lookup.
    pub fn peers(&self) -> Vec<(IpAddr, PeerCaps)> {
        let mut all: Vec<(IpAddr, PeerCaps)> = self
            .peers
            .iter()
            .map(|(a, e)| match e {
                Entry::Known { caps, .. } => (*a, known(*caps)),
                Entry::Probing { .. } => (*a, PeerCaps::Asking),
            })
            .collect();
        all.sort_by_key(|(a, _)| *a);
        all
    }

    fn probe(&mut self, now: u64, peer: IpAddr, tries: u32) {
        let tid = self.next_tid;
        self.next_tid = self.next_tid.wrapping_add(2);
        self.peers.insert(
            peer,
            Entry::Probing {
                tid,
                tries: tries + 1,
                next_at: now + (PROBE_TIMEOUT_NS << tries.min(16)),
            },
        );
        self.send(peer, false, tid);
    }

    fn send(&mut self, peer: IpAddr, answer: bool, tid: u64) {
        let mad = CapsMad {
            answer,
            transaction_id: tid,
            caps: self.local,
        }
        .emit();
        self.transmits.push_back(Transmit { peer, mad });
    }

    fn learn(&mut self, now: u64, peer: IpAddr, caps: Option<Caps>) {
        let ttl = if caps.is_some() {
            ANSWER_TTL_NS
        } else {
            SILENCE_TTL_NS
        };
        let before = self.peers.insert(
            peer,
            Entry::Known {
                caps,
                until: now + ttl,
            },
        );
        let changed = !matches!(before, Some(Entry::Known { caps: c, .. }) if c == caps);
        if changed {
            self.updates.push_back((peer, known(caps)));
        }
    }

    /// A MAD from `peer`'s QP1 that [`classify`] did not call [`Classified::Other`]. A probe
    /// is answered (and teaches us the prober's capabilities); an answer or refusal settles
    /// our probe.
    pub fn handle_mad(&mut self, now: u64, peer: IpAddr, mad: Classified) {
        match mad {
            Classified::Other => {}
            Classified::Caps(m) if !m.answer => {
                self.send(peer, true, m.transaction_id);
                if self.room_for(now, peer) {
                    self.learn(now, peer, Some(m.caps));
                }
            }
            Classified::Caps(m) => {
                if self.is_ours(peer, m.transaction_id) {
                    self.learn(now, peer, Some(m.caps));
                }
            }
            Classified::Refused { transaction_id } => {
                if self.is_ours(peer, transaction_id) {
                    self.learn(now, peer, None);
                }
            }
        }
    }

    /// Whether an unasked-for probe from `peer` may be remembered ([`MAX_UNASKED_PEERS`]).
    /// Expired answers are forgotten to make room; a forgotten softroce peer is reported as
    /// [`PeerCaps::Other`] (what the device assumes of a peer it knows nothing of), so that
    /// nothing the device keeps per peer outlives the cache's entry.
    fn room_for(&mut self, now: u64, peer: IpAddr) -> bool {
        if self.peers.len() < MAX_UNASKED_PEERS || self.peers.contains_key(&peer) {
            return true;
        }
        let updates = &mut self.updates;
        self.peers.retain(|p, e| match e {
            Entry::Known { caps, until } if *until <= now => {
                if caps.is_some() {
                    updates.push_back((*p, PeerCaps::Other));
                }
                false
            }
            _ => true,
        });
        self.peers.len() < MAX_UNASKED_PEERS
    }

    fn is_ours(&self, peer: IpAddr, tid: u64) -> bool {
        matches!(self.peers.get(&peer), Some(Entry::Probing { tid: t, .. }) if *t == tid)
    }

    /// Resends probes that went unanswered; gives up on a peer after [`PROBE_TRIES`].
    pub fn handle_timeout(&mut self, now: u64) {
        let due: Vec<(IpAddr, u32)> = self
            .peers
            .iter()
            .filter_map(|(p, e)| match e {
                Entry::Probing { tries, next_at, .. } if *next_at <= now => Some((*p, *tries)),
                _ => None,
            })
            .collect();
        for (peer, tries) in due {
            if tries >= PROBE_TRIES {
                self.learn(now, peer, None);
            } else {
                self.probe(now, peer, tries);
            }
        }
    }

    pub fn poll_timeout(&self) -> Option<u64> {
        self.peers
            .values()
            .filter_map(|e| match e {
                Entry::Probing { next_at, .. } => Some(*next_at),
                Entry::Known { .. } => None,
            })
            .min()
    }

    /// The next MAD to send: a UD SEND_ONLY from QP1 to QP1 of `peer` with the GSI Q_Key.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The next change in what is known of a peer.
    pub fn poll_update(&mut self) -> Option<(IpAddr, PeerCaps)> {
        self.updates.pop_front()
    }
}

fn known(caps: Option<Caps>) -> PeerCaps {
    match caps {
        Some(c) => PeerCaps::Softroce(c),
        None => PeerCaps::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn caps(selective: bool) -> Caps {
        Caps {
            selective,
            bdp_bytes: 512 * 1024,
            any_ident: true,
        }
    }

    #[test]
    fn the_mad_round_trips_and_has_the_documented_layout() {
        let m = CapsMad {
            answer: false,
            transaction_id: 0x1122_3344_5566_7788,
            caps: caps(true),
        };
        let b = m.emit();
        assert_eq!(&b[..4], &[1, 0x30, 1, 0x01]);
        assert_eq!(&b[16..18], &[0, 0x10]);
        assert_eq!(&b[37..40], &[0x02, 0x53, 0x52]);
        assert_eq!(&b[40..46], b"SRCE\x01\x03");
        assert_eq!(&b[48..52], &[0, 8, 0, 0]);
        assert_eq!(classify(&b), Classified::Caps(m));
        let a = CapsMad { answer: true, ..m };
        assert_eq!(a.emit()[3], 0x81);
        assert_eq!(classify(&a.emit()), Classified::Caps(a));
        // The two flags apart; a device that predates bit 1 accepts only the Identification
        // it was sent with.
        let tap = CapsMad {
            caps: Caps {
                any_ident: false,
                ..caps(true)
            },
            ..m
        };
        assert_eq!(tap.emit()[45], 0x01);
        assert_eq!(classify(&tap.emit()), Classified::Caps(tap));
        let gbn = CapsMad {
            caps: caps(false),
            ..m
        };
        assert_eq!(gbn.emit()[45], 0x02);
        assert_eq!(classify(&gbn.emit()), Classified::Caps(gbn));
    }

    #[test]
    fn linux_refusals_and_foreign_mads_are_told_apart() {
        let mut b = CapsMad {
            answer: true,
            transaction_id: 5,
            caps: caps(true),
        }
        .emit();
        // What Linux's generate_unmatched_resp sends back: our MAD, GetResp, status 0x000C.
        b[4..6].copy_from_slice(&STATUS_UNSUPPORTED.to_be_bytes());
        assert_eq!(classify(&b), Classified::Refused { transaction_id: 5 });
        // A CM MAD, a short one, another vendor's probe (other OUI): not ours.
        let mut cm = [0u8; MAD_LEN];
        cm[..4].copy_from_slice(&[1, 0x07, 2, 3]);
        assert_eq!(classify(&cm), Classified::Other);
        assert_eq!(classify(&b[..100]), Classified::Other);
        let mut other = CapsMad {
            answer: false,
            transaction_id: 1,
            caps: caps(true),
        }
        .emit();
        other[37] = 0x00;
        assert_eq!(classify(&other), Classified::Other);
    }

    #[test]
    fn a_probe_is_answered_and_both_ends_learn() {
        let (a_ip, b_ip): (IpAddr, IpAddr) =
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let mut a = CapsCache::new(caps(true), 100);
        let mut b = CapsCache::new(caps(false), 200);
        assert_eq!(a.lookup(0, b_ip), PeerCaps::Asking);
        assert_eq!(a.lookup(0, b_ip), PeerCaps::Asking, "one probe at a time");
        let probe = a.poll_transmit().unwrap();
        assert!(a.poll_transmit().is_none());
        assert_eq!(probe.peer, b_ip);
        b.handle_mad(MS, a_ip, classify(&probe.mad));
        assert_eq!(
            b.poll_update(),
            Some((a_ip, PeerCaps::Softroce(caps(true))))
        );
        let answer = b.poll_transmit().unwrap();
        assert_eq!(answer.peer, a_ip);
        a.handle_mad(2 * MS, b_ip, classify(&answer.mad));
        assert_eq!(
            a.poll_update(),
            Some((b_ip, PeerCaps::Softroce(caps(false))))
        );
        assert_eq!(a.lookup(3 * MS, b_ip), PeerCaps::Softroce(caps(false)));
        assert_eq!(a.poll_timeout(), None);
        // An answer nobody asked for (a stale TID) changes nothing.
        a.handle_mad(4 * MS, b_ip, classify(&answer.mad));
        assert!(a.poll_update().is_none());
        // After the TTL the next lookup asks again, still answering from the old entry.
        assert_eq!(
            a.lookup(ANSWER_TTL_NS + 5 * MS, b_ip),
            PeerCaps::Softroce(caps(false))
        );
        assert!(a.poll_transmit().is_some());
    }

    #[test]
    fn a_refusal_is_a_no_at_once_and_silence_a_no_after_the_retries() {
        let peer: IpAddr = "10.0.0.9".parse().unwrap();
        let mut a = CapsCache::new(caps(true), 7);
        a.lookup(0, peer);
        let probe = a.poll_transmit().unwrap();
        let mut refusal = probe.mad;
        refusal[3] = METHOD_GET_RESP;
        refusal[4..6].copy_from_slice(&STATUS_UNSUPPORTED.to_be_bytes());
        a.handle_mad(MS, peer, classify(&refusal));
        assert_eq!(a.poll_update(), Some((peer, PeerCaps::Other)));
        assert_eq!(a.lookup(2 * MS, peer), PeerCaps::Other);

        let silent: IpAddr = "10.0.0.10".parse().unwrap();
        a.lookup(0, silent);
        let mut sent = 0;
        let mut now = 0;
        while let Some(t) = a.poll_timeout() {
            while a.poll_transmit().is_some() {
                sent += 1;
            }
            now = t;
            a.handle_timeout(now);
        }
        assert_eq!(sent, PROBE_TRIES);
        assert_eq!(now, (10 + 20 + 40 + 80) * MS, "10, 20, 40, 80 ms");
        assert_eq!(a.poll_update(), Some((silent, PeerCaps::Other)));
        assert_eq!(a.lookup(now + MS, silent), PeerCaps::Other);
        assert_eq!(a.lookup(now + SILENCE_TTL_NS, silent), PeerCaps::Other);
        assert!(a.poll_transmit().is_some(), "asked again after the TTL");
    }

    /// Probes from ever new addresses (spoofed: QP1 takes UDP from anywhere) are all
    /// answered, but the cache remembers a bounded number, and forgets expired answers first.
    #[test]
    fn unasked_probes_from_new_addresses_fill_a_bounded_cache() {
        let mut a = CapsCache::new(caps(true), 7);
        let probe = |i: u32| {
            let m = CapsMad {
                answer: false,
                transaction_id: u64::from(i),
                caps: caps(true),
            };
            classify(&m.emit())
        };
        let addr = |i: u32| IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
        let n = MAX_UNASKED_PEERS as u32 + 100;
        for i in 0..n {
            a.handle_mad(MS, addr(i), probe(i));
        }
        let mut answered = 0;
        while a.poll_transmit().is_some() {
            answered += 1;
        }
        assert_eq!(answered, n);
        assert_eq!(a.peers().len(), MAX_UNASKED_PEERS);
        // Every update reached the device: the ones not remembered gave none.
        let mut updates = 0;
        while a.poll_update().is_some() {
            updates += 1;
        }
        assert_eq!(updates, MAX_UNASKED_PEERS);
        // Once the answers expire, new probers take their places, and the device hears
        // that the forgotten ones are softroce no longer.
        a.handle_mad(MS + ANSWER_TTL_NS, addr(n), probe(n));
        assert_eq!(a.peers().len(), 1);
        let forgotten: Vec<_> = std::iter::from_fn(|| a.poll_update()).collect();
        assert_eq!(forgotten.len(), MAX_UNASKED_PEERS + 1);
        assert!(forgotten[..MAX_UNASKED_PEERS]
            .iter()
            .all(|(_, k)| *k == PeerCaps::Other));
        assert_eq!(forgotten[MAX_UNASKED_PEERS].0, addr(n));
        // A peer this device asks about itself is remembered whatever the count.
        for i in 0..n {
            a.handle_mad(2 * MS + ANSWER_TTL_NS, addr(i), probe(i));
        }
        let own: IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!(a.lookup(3 * MS + ANSWER_TTL_NS, own), PeerCaps::Asking);
        assert!(a.peers().iter().any(|(p, _)| *p == own));
    }
}
