//! The neighbour cache of the L2 device: IP address → Ethernet address, as a kernel's ARP and
//! ND tables keep it (in the shape of smoltcp's `iface/neighbor.rs`), plus the frames waiting
//! for an address being resolved.
//!
//! - An entry learnt from a reply or a solicitation is fresh for [`REACHABLE_TIME`]; after
//!   that it is still used, and the next use sends a new request (Linux's STALE → PROBE).
//!   A refresh that gets no answer in [`MAX_REQUESTS`] tries removes the entry.
//! - A frame for a peer not yet resolved is held, at most [`HOLD_BYTES`] per peer (the
//!   kernel's `unres_qlen_bytes`; the oldest are dropped first), and a request goes out at
//!   once, then every [`RETRANS_TIME`], at most [`MAX_REQUESTS`] times (`mcast_solicit`);
//!   then the held frames are dropped, counted, and the peer is marked failed until the next
//!   frame for it starts over.
//! - The table holds at most `capacity` peers: a new one replaces the entry that expires
//!   first (never one with frames waiting, which are bounded separately).
//!
//! Time is passed in (nanoseconds of any monotonic clock); nothing here reads a clock.

use crate::transport::Nanos;
use crate::wire::EthernetAddress;
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;

const SECOND: Nanos = 1_000_000_000;
/// How long an answer is trusted without a refresh (Linux's `base_reachable_time`, 30 s).
pub const REACHABLE_TIME: Nanos = 30 * SECOND;
/// Time between two requests for one peer (`retrans_time`, 1 s).
pub const RETRANS_TIME: Nanos = SECOND;
/// Requests sent for one peer before it is given up (`mcast_solicit`, 3).
pub const MAX_REQUESTS: u32 = 3;
/// Bytes of frames held per peer being resolved (`unres_qlen_bytes`, 212992).
pub const HOLD_BYTES: usize = 212_992;
/// Peers the table holds by default (Linux's `gc_thresh3` is 1024).
pub const DEFAULT_CAPACITY: usize = 1024;

/// What [`NeighborCache::lookup`] knows of a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Its address: send now.
    Found(EthernetAddress),
    /// Not known (or being resolved): hold the frame and resolve.
    NotFound,
}

/// What a caller of [`NeighborCache::poll_request`] must send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub addr: IpAddr,
    /// A refresh of a known entry: RFC 4861 §7.3.3 probes it by unicast, to this address.
    pub unicast: Option<EthernetAddress>,
}

#[derive(Debug, Clone)]
struct Entry {
    mac: Option<EthernetAddress>,
    /// When the answer stops being fresh.
    expires_at: Nanos,
    /// A resolution or refresh in progress: requests sent, and when the next is due.
    requests: u32,
    next_request: Option<Nanos>,
    /// Frames waiting for the address, with their total length.
    held: VecDeque<Vec<u8>>,
    held_bytes: usize,
}

impl Entry {
    fn unresolved() -> Entry {
        Entry {
            mac: None,
            expires_at: 0,
            requests: 0,
            next_request: None,
            held: VecDeque::new(),
            held_bytes: 0,
        }
    }
}

/// Counters of the cache, for the daemon's logs and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NeighborCounters {
    pub requests_sent: u64,
    /// Resolutions given up after [`MAX_REQUESTS`].
    pub failed: u64,
    /// Held frames dropped: over [`HOLD_BYTES`], or their peer failed to resolve.
    pub held_dropped: u64,
    /// Held frames sent once their peer resolved.
    pub held_sent: u64,
}

/// The neighbour table. See the module documentation.
#[derive(Debug)]
pub struct NeighborCache {
    entries: HashMap<IpAddr, Entry>,
    capacity: usize,
    counters: NeighborCounters,
    /// Bumped whenever the set of resolved peers may have changed ([`NeighborCache::changes`]).
    changes: u64,
}

impl Default for NeighborCache {
    fn default() -> Self {
        NeighborCache::new(DEFAULT_CAPACITY)
    }
}

impl NeighborCache {
    pub fn new(capacity: usize) -> NeighborCache {
        NeighborCache {
            entries: HashMap::new(),
            capacity: capacity.max(1),
            counters: NeighborCounters::default(),
            changes: 0,
        }
    }

    /// A number that moves whenever a peer is resolved, changes address or is forgotten: a
    /// reader of [`NeighborCache::resolved`] reads it again only when this moved.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// The peers whose address is known (fresh or stale: still used, as the kernel's
    /// `NUD_VALID` states are).
    pub fn resolved(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.entries
            .iter()
            .filter(|(_, e)| e.mac.is_some())
            .map(|(a, _)| *a)
    }

    /// Starts resolving `addr` with no frame to send (rdma_cm's address resolution asks
    /// for the peer before any packet goes to it, as the kernel's `neigh_event_send`): a
    /// peer known or being resolved is left as it is.
    pub fn solicit(&mut self, addr: IpAddr, now: Nanos) {
        if !self.entries.contains_key(&addr) {
            self.make_room(now);
        }
        let e = self.entries.entry(addr).or_insert_with(Entry::unresolved);
        if e.mac.is_none() && e.next_request.is_none() {
            e.requests = 0;
            e.next_request = Some(now);
        }
    }

    pub fn counters(&self) -> NeighborCounters {
        self.counters
    }

    /// The address of `addr`, if known. A stale answer is still given, and starts a refresh.
    pub fn lookup(&mut self, addr: IpAddr, now: Nanos) -> Answer {
        let Some(e) = self.entries.get_mut(&addr) else {
            return Answer::NotFound;
        };
        let Some(mac) = e.mac else {
            return Answer::NotFound;
        };
        if now >= e.expires_at && e.next_request.is_none() {
            e.requests = 0;
            e.next_request = Some(now);
        }
        Answer::Found(mac)
    }

    /// Records that `addr` is at `mac` (a reply, or a request from it); returns the frames
    /// that were waiting for it, their destination address patched, to be sent now.
    pub fn fill(&mut self, addr: IpAddr, mac: EthernetAddress, now: Nanos) -> Vec<Vec<u8>> {
        if !self.entries.contains_key(&addr) {
            self.make_room(now);
        }
        let e = self.entries.entry(addr).or_insert_with(Entry::unresolved);
        if e.mac != Some(mac) {
            self.changes += 1;
        }
        e.mac = Some(mac);
        e.expires_at = now.saturating_add(REACHABLE_TIME);
        e.requests = 0;
        e.next_request = None;
        e.held_bytes = 0;
        let mut out: Vec<Vec<u8>> = e.held.drain(..).collect();
        for f in &mut out {
            if let Some(dst) = f.get_mut(..6) {
                dst.copy_from_slice(&mac.0);
            }
        }
        self.counters.held_sent += out.len() as u64;
        out
    }

    /// Updates an entry that exists, without creating one (an unsolicited advertisement,
    /// RFC 4861 §7.2.5, or a gratuitous ARP): frames waiting for it are returned as by
    /// [`NeighborCache::fill`].
    pub fn update(&mut self, addr: IpAddr, mac: EthernetAddress, now: Nanos) -> Vec<Vec<u8>> {
        if self.entries.contains_key(&addr) {
            self.fill(addr, mac, now)
        } else {
            Vec::new()
        }
    }

    /// Holds `frame` (a whole Ethernet frame whose destination address is filled in on
    /// resolution) until `addr` resolves, and starts resolving it if nothing is under way.
    pub fn hold(&mut self, addr: IpAddr, frame: Vec<u8>, now: Nanos) {
        if !self.entries.contains_key(&addr) {
            self.make_room(now);
        }
        let e = self.entries.entry(addr).or_insert_with(Entry::unresolved);
        if e.next_request.is_none() {
            e.requests = 0;
            e.next_request = Some(now);
        }
        e.held_bytes += frame.len();
        e.held.push_back(frame);
        while e.held_bytes > HOLD_BYTES {
            let Some(old) = e.held.pop_front() else { break };
            e.held_bytes -= old.len();
            self.counters.held_dropped += 1;
        }
    }

    /// Bytes held for `addr`.
    pub fn held_bytes(&self, addr: IpAddr) -> usize {
        self.entries.get(&addr).map_or(0, |e| e.held_bytes)
    }

    /// The next request to send at `now`, if one is due; gives up on peers that did not
    /// answer [`MAX_REQUESTS`] requests (their held frames are dropped).
    pub fn poll_request(&mut self, now: Nanos) -> Option<Request> {
        let mut failed = Vec::new();
        let mut due = None;
        for (addr, e) in self.entries.iter_mut() {
            let Some(at) = e.next_request.filter(|&at| at <= now) else {
                continue;
            };
            if e.requests >= MAX_REQUESTS {
                failed.push(*addr);
                continue;
            }
            if due.is_none() {
                e.requests += 1;
                e.next_request = Some(at.max(now).saturating_add(RETRANS_TIME));
                due = Some(Request {
                    addr: *addr,
                    unicast: e.mac,
                });
            }
        }
        for addr in failed {
            if let Some(e) = self.entries.remove(&addr) {
                self.changes += 1;
                self.counters.failed += 1;
                self.counters.held_dropped += e.held.len() as u64;
            }
        }
        if due.is_some() {
            self.counters.requests_sent += 1;
        }
        due
    }

    /// When [`NeighborCache::poll_request`] next has something to do.
    pub fn poll_at(&self) -> Option<Nanos> {
        self.entries.values().filter_map(|e| e.next_request).min()
    }

    /// Forgets every entry and drops every held frame.
    pub fn flush(&mut self) {
        for e in self.entries.values() {
            self.counters.held_dropped += e.held.len() as u64;
        }
        self.entries.clear();
        self.changes += 1;
    }

    /// Frees a place for a new peer when the table is full: the resolved entry that expires
    /// first goes (entries waiting with frames are kept; they end by themselves).
    fn make_room(&mut self, _now: Nanos) {
        if self.entries.len() < self.capacity {
            return;
        }
        let victim = self
            .entries
            .iter()
            .filter(|(_, e)| e.held.is_empty())
            .min_by_key(|(_, e)| e.expires_at)
            .map(|(a, _)| *a);
        if let Some(a) = victim {
            self.entries.remove(&a);
            self.changes += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 0xa]);
    const B: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 0xb]);

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn frame(n: usize) -> Vec<u8> {
        let mut f = vec![0u8; n.max(14)];
        f[6..12].copy_from_slice(&B.0);
        f
    }

    #[test]
    fn held_frames_leave_when_the_peer_answers() {
        let mut c = NeighborCache::default();
        let peer = ip("10.0.0.2");
        assert_eq!(c.lookup(peer, 0), Answer::NotFound);
        c.hold(peer, frame(100), 0);
        c.hold(peer, frame(60), 10);
        assert_eq!(
            c.poll_request(10),
            Some(Request {
                addr: peer,
                unicast: None
            })
        );
        // One request per RETRANS_TIME, not one per frame.
        assert_eq!(c.poll_request(20), None);
        assert_eq!(c.poll_at(), Some(10 + RETRANS_TIME));
        let out = c.fill(peer, A, 500);
        assert_eq!(out.len(), 2);
        assert!(out.iter().all(|f| f[..6] == A.0 && f[6..12] == B.0));
        assert_eq!(out[1].len(), 60);
        assert_eq!(c.lookup(peer, 600), Answer::Found(A));
        assert_eq!(c.poll_at(), None);
        assert_eq!(c.counters().held_sent, 2);
    }

    /// A solicitation with no frame asks as a held frame does, and the resolved set and its
    /// change count follow the answers and the give-ups.
    #[test]
    fn a_solicited_peer_resolves_or_is_given_up_and_the_changes_say_so() {
        let mut c = NeighborCache::new(8);
        let (p, q) = (ip("10.0.0.2"), ip("10.0.0.3"));
        c.solicit(p, 0);
        c.solicit(q, 0);
        c.solicit(q, 10); // under way: no second request
        let mut asked = vec![];
        while let Some(r) = c.poll_request(0) {
            asked.push(r.addr);
        }
        asked.sort();
        assert_eq!(asked, vec![p, q]);
        assert_eq!(c.resolved().count(), 0);
        let before = c.changes();
        c.fill(p, A, 5);
        assert_eq!(c.resolved().collect::<Vec<_>>(), vec![p]);
        assert!(c.changes() > before);
        let seen = c.changes();
        c.fill(p, A, 6); // the same answer again
        assert_eq!(c.changes(), seen);
        c.solicit(p, 7); // known: nothing asked
        for t in 1..=MAX_REQUESTS as u64 {
            let r = c.poll_request(t * RETRANS_TIME);
            assert_eq!(r.map(|r| r.addr), (t < MAX_REQUESTS as u64).then_some(q));
        }
        assert!(c.changes() > seen, "q given up");
        assert_eq!(c.resolved().collect::<Vec<_>>(), vec![p]);
        assert_eq!(c.counters().failed, 1);
    }

    #[test]
    fn an_unanswered_peer_fails_after_three_requests_and_its_frames_are_dropped() {
        let mut c = NeighborCache::default();
        let peer = ip("fd00::9");
        c.hold(peer, frame(100), 0);
        let mut sent = 0;
        let mut now = 0;
        while now <= 10 * RETRANS_TIME {
            while c.poll_request(now).is_some() {
                sent += 1;
            }
            now += RETRANS_TIME / 4;
        }
        assert_eq!(sent, MAX_REQUESTS);
        assert_eq!(c.counters().failed, 1);
        assert_eq!(c.counters().held_dropped, 1);
        assert_eq!(c.poll_at(), None);
        // The next frame starts over.
        c.hold(peer, frame(100), now);
        assert!(c.poll_request(now).is_some());
    }

    #[test]
    fn held_bytes_are_bounded_oldest_first() {
        let mut c = NeighborCache::default();
        let peer = ip("10.0.0.3");
        let n = HOLD_BYTES / 4000 + 5;
        for i in 0..n {
            let mut f = frame(4000);
            f[20] = i as u8;
            c.hold(peer, f, 0);
        }
        assert!(c.held_bytes(peer) <= HOLD_BYTES);
        let out = c.fill(peer, A, 1);
        assert_eq!(out.len() as u64 + c.counters().held_dropped, n as u64);
        // The newest survive.
        assert_eq!(out.last().unwrap()[20], (n - 1) as u8);
    }

    #[test]
    fn a_stale_entry_is_used_while_it_is_refreshed_by_unicast() {
        let mut c = NeighborCache::default();
        let peer = ip("10.0.0.4");
        c.fill(peer, A, 0);
        assert_eq!(c.poll_request(1), None);
        let later = REACHABLE_TIME + 1;
        assert_eq!(c.lookup(peer, later), Answer::Found(A));
        assert_eq!(
            c.poll_request(later),
            Some(Request {
                addr: peer,
                unicast: Some(A)
            })
        );
        // Answered: fresh again, nothing more to send.
        c.fill(peer, B, later + 5);
        assert_eq!(c.lookup(peer, later + 6), Answer::Found(B));
        assert_eq!(c.poll_at(), None);
        // Not answered: the entry goes after MAX_REQUESTS.
        let stale = later + 5 + REACHABLE_TIME;
        assert_eq!(c.lookup(peer, stale), Answer::Found(B));
        let mut t = stale;
        for _ in 0..=MAX_REQUESTS {
            let _ = c.poll_request(t);
            t += RETRANS_TIME;
        }
        assert_eq!(c.lookup(peer, t), Answer::NotFound);
    }

    #[test]
    fn updates_never_create_entries_and_a_full_table_evicts_the_oldest() {
        let mut c = NeighborCache::new(2);
        assert!(c.update(ip("10.0.0.5"), A, 0).is_empty());
        assert_eq!(c.lookup(ip("10.0.0.5"), 0), Answer::NotFound);
        c.fill(ip("10.0.0.6"), A, 0);
        c.fill(ip("10.0.0.7"), A, 5);
        c.fill(ip("10.0.0.8"), B, 6);
        assert_eq!(c.lookup(ip("10.0.0.6"), 7), Answer::NotFound);
        assert_eq!(c.lookup(ip("10.0.0.7"), 7), Answer::Found(A));
        assert_eq!(c.lookup(ip("10.0.0.8"), 7), Answer::Found(B));
    }
}
