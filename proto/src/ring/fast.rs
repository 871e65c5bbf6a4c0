//! Shared memory of the same-host fast path (docs/architecture.md, "The same-host fast path").
//!
//! A *direction* is the requester of one QP and the responder of the QP it is connected to,
//! run by the process that owns the first (the *taker*) instead of by the daemon. Its memfd
//! holds a control block ([`Direction`]) and, after it, the ring through which the taker
//! delivers the peer's receive completions ([`FastCqe`] entries in a [`super::SharedRing`]).
//! Each client that is the peer of a direction also gets an [`MrTable`]: the daemon publishes
//! the client's memory regions there, so that the taker's copy of the responder checks R_Keys
//! and L_Keys against the same regions the daemon's engine would.
//!
//! The rules that keep the daemon the device:
//! - the taker runs the direction only between [`Direction::enter`] and [`Direction::leave`],
//!   and `enter` fails once the daemon revoked it ([`Direction::revoke`]). After a revoke the
//!   daemon waits until the taker is outside ([`Direction::busy`]), then reads what the taker
//!   published at its last `leave` ([`Direction::published`]) and runs the QPs itself again;
//! - the taker leaves only with both halves idle (nothing in flight, no timer), so that what
//!   it publishes (four sequence numbers and a count) is the whole transport state;
//! - MR changes reach the taker at its next `enter` (it reads the table's change log), and a
//!   deregistration waits until no taker is inside: after `ibv_dereg_mr` returns, no access
//!   through the region can start.
//!
//! As everywhere in [`super`], the daemon trusts nothing it reads back: the published numbers
//! are PSNs and counts it checks, and the processes sharing a direction are of one uid (each
//! may already write into the other's memory with `process_vm_writev`).

use core::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

pub const DIRECTION_MAGIC: u32 = 0x5352_4644; // "SRFD"
pub const MR_TABLE_MAGIC: u32 = 0x5352_4d54; // "SRMT"
/// The control block's length; the completion ring starts after it.
pub const CONTROL_LEN: usize = 4096;

const D_MAGIC: usize = 0;
const D_ID: usize = 8;
const D_REVOKED: usize = 64;
const D_BUSY: usize = 128;
const D_PUBLISHED: usize = 192;
const D_COUNTERS: usize = 256;
/// Counters kept per engine of a direction (the taker's and the peer's mirror).
pub const COUNTER_WORDS: usize = 64;
// Every counter an engine keeps has its word.
const _: () = assert!(crate::transport::counters::COUNTER_COUNT <= COUNTER_WORDS);

/// Published flag: the taker's engines ended in an error state (the daemon moves both QPs
/// to ERR when it takes them back).
pub const PUBLISHED_ERROR: u32 = 1;

/// What the taker publishes at each [`Direction::leave`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Published {
    /// The requester's next PSN and oldest unacknowledged PSN.
    pub req_psn: u32,
    pub comp_psn: u32,
    /// The peer responder's expected PSN and MSN.
    pub resp_psn: u32,
    pub msn: u32,
    /// How many of the receive WQEs the grant carried the responder has used.
    pub recvs_used: u32,
    pub flags: u32,
}

/// One end's handle on a direction's control block.
#[derive(Debug)]
pub struct Direction {
    base: *mut u8,
}

// SAFETY: a pointer into a mapping that outlives the handle (constructor contract); every
// access is atomic.
unsafe impl Send for Direction {}
// SAFETY: as above; all methods take &self and use atomics only.
unsafe impl Sync for Direction {}

impl Direction {
    /// Writes a fresh control block (the daemon).
    ///
    /// # Safety
    /// `mem` must point to at least [`CONTROL_LEN`] bytes, 64-byte aligned, that stay mapped
    /// for as long as the handle lives.
    pub unsafe fn init(mem: *mut u8, id: u64) -> Direction {
        // SAFETY: the caller guarantees the block lies inside the mapping.
        unsafe { core::ptr::write_bytes(mem, 0, CONTROL_LEN) };
        let d = Direction { base: mem };
        d.word(D_MAGIC).store(DIRECTION_MAGIC, Ordering::Relaxed);
        d.word64(D_ID).store(id, Ordering::Release);
        d
    }

    /// Attaches to a control block the daemon wrote (the shim), checking its magic and id.
    ///
    /// # Safety
    /// As for [`Direction::init`], with `len` mapped bytes.
    pub unsafe fn attach(mem: *mut u8, len: usize, id: u64) -> Option<Direction> {
        if len < CONTROL_LEN || !(mem as usize).is_multiple_of(64) {
            return None;
        }
        let d = Direction { base: mem };
        (d.word(D_MAGIC).load(Ordering::Acquire) == DIRECTION_MAGIC
            && d.word64(D_ID).load(Ordering::Acquire) == id)
            .then_some(d)
    }

    fn word(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: every offset passed is inside the control block, 4-byte aligned, and the
        // mapping outlives `self` (constructor contract).
        unsafe { &*(self.base.add(offset) as *const AtomicU32) }
    }

    fn word64(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: as `word`, 8-byte aligned offsets.
        unsafe { &*(self.base.add(offset) as *const AtomicU64) }
    }

    /// The daemon takes the direction back: the taker's next `enter` fails.
    pub fn revoke(&self) {
        self.word(D_REVOKED).store(1, Ordering::Relaxed);
        // Dekker with `enter`: our store of the flag and the taker's store of busy cannot both
        // be missed.
        fence(Ordering::SeqCst);
    }

    pub fn is_revoked(&self) -> bool {
        self.word(D_REVOKED).load(Ordering::Acquire) != 0
    }

    /// The taker is about to run the direction; false (and it must not) once revoked.
    pub fn enter(&self) -> bool {
        self.word(D_BUSY).store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if self.word(D_REVOKED).load(Ordering::Relaxed) != 0 {
            self.word(D_BUSY).store(0, Ordering::Release);
            return false;
        }
        true
    }

    /// The taker is done for now; everything it published before is visible to the daemon.
    pub fn leave(&self) {
        self.word(D_BUSY).store(0, Ordering::Release);
    }

    /// The taker is between `enter` and `leave`.
    pub fn busy(&self) -> bool {
        self.word(D_BUSY).load(Ordering::Acquire) != 0
    }

    /// Written by the taker before `leave`.
    pub fn publish(&self, p: &Published) {
        let at = D_PUBLISHED;
        for (i, v) in [
            p.req_psn,
            p.comp_psn,
            p.resp_psn,
            p.msn,
            p.recvs_used,
            p.flags,
        ]
        .into_iter()
        .enumerate()
        {
            self.word(at + 4 * i).store(v, Ordering::Relaxed);
        }
    }

    /// Read by the daemon once the taker is outside.
    pub fn published(&self) -> Published {
        let at = D_PUBLISHED;
        let w = |i: usize| self.word(at + 4 * i).load(Ordering::Acquire);
        Published {
            req_psn: w(0),
            comp_psn: w(1),
            resp_psn: w(2),
            msn: w(3),
            recvs_used: w(4),
            flags: w(5),
        }
    }

    /// The counters of engine `which` (0: the taker's, 1: the peer's mirror).
    pub fn write_counters(&self, which: usize, words: &[u64]) {
        let at = D_COUNTERS + which.min(1) * COUNTER_WORDS * 8;
        for (i, v) in words.iter().take(COUNTER_WORDS).enumerate() {
            self.word64(at + 8 * i).store(*v, Ordering::Relaxed);
        }
    }

    /// [`Direction::write_counters`] of only the words that differ from `published`, what
    /// this writer stored last (a pass changes a few counters of 64: storing all of them
    /// made the daemon's copy of 16 cache lines move to this CPU at every pass).
    /// The words past `words.len()` (at most [`COUNTER_WORDS`]) are left alone.
    pub fn write_changed_counters(
        &self,
        which: usize,
        words: &[u64],
        published: &mut [u64; COUNTER_WORDS],
    ) {
        let at = D_COUNTERS + which.min(1) * COUNTER_WORDS * 8;
        let n = words.len().min(COUNTER_WORDS);
        for (i, (v, p)) in words[..n].iter().zip(&mut published[..n]).enumerate() {
            if *v != *p {
                self.word64(at + 8 * i).store(*v, Ordering::Relaxed);
                *p = *v;
            }
        }
    }

    pub fn counters(&self, which: usize) -> [u64; COUNTER_WORDS] {
        let at = D_COUNTERS + which.min(1) * COUNTER_WORDS * 8;
        let mut out = [0u64; COUNTER_WORDS];
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.word64(at + 8 * i).load(Ordering::Relaxed);
        }
        out
    }
}

// ---- the MR table ----

const T_MAGIC: usize = 0;
const T_CAPACITY: usize = 4;
const T_GENERATION: usize = 64;
const T_LOG_HEAD: usize = 128;
/// One past the highest index ever set: a rescan reads the entries below it only.
const T_HIGH: usize = 192;
/// Changes remembered for readers that resynchronise incrementally.
pub const MR_LOG_LEN: usize = 4096;
const T_LOG: usize = 4096;
const T_ENTRIES: usize = T_LOG + 4 * MR_LOG_LEN;
const ENTRY_LEN: usize = 48;

/// One published memory region (the engine's view: index, keys, PD, range, access).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MrEntry {
    pub index: u32,
    pub lkey: u32,
    pub rkey: u32,
    /// The client's PD handle.
    pub pd: u32,
    pub access: u32,
    pub addr: u64,
    pub length: u64,
}

/// A client's memory regions, published by the daemon for the processes whose directions
/// run this client's responders. Entries are indexed by the engine's MR index; each is
/// written under a sequence lock, and every change is appended to a change log that readers
/// follow from where they were (or rescan the table, if they fell more than
/// [`MR_LOG_LEN`] changes behind).
#[derive(Debug)]
pub struct MrTable {
    base: *mut u8,
    capacity: u32,
}

// SAFETY: as for Direction: a pointer into a mapping that outlives the handle.
unsafe impl Send for MrTable {}
// SAFETY: as above; shared accesses are atomic, entries are read under their sequence lock.
unsafe impl Sync for MrTable {}

/// Where a reader of an [`MrTable`] is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MrCursor {
    pub generation: u64,
    pub log_pos: u64,
}

/// What a reader must do to catch up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MrChanges {
    /// Nothing changed.
    None,
    /// These indexes changed (read each with [`MrTable::entry`]).
    Some(Vec<u32>),
    /// Too many changes: read every entry.
    Rescan,
}

impl MrTable {
    /// Bytes of shared memory a table of `capacity` entries needs (a memfd of that size is
    /// sparse: pages appear as entries are written).
    pub fn byte_len(capacity: u32) -> usize {
        T_ENTRIES + ENTRY_LEN * capacity as usize
    }

    /// Writes a fresh table header (the daemon).
    ///
    /// # Safety
    /// `mem` must point to `byte_len(capacity)` zeroed bytes, 64-byte aligned, that stay
    /// mapped for as long as the handle lives.
    pub unsafe fn init(mem: *mut u8, capacity: u32) -> MrTable {
        let t = MrTable {
            base: mem,
            capacity,
        };
        t.word(T_CAPACITY).store(capacity, Ordering::Relaxed);
        t.word(T_MAGIC).store(MR_TABLE_MAGIC, Ordering::Release);
        t
    }

    /// Attaches to a table (the shim).
    ///
    /// # Safety
    /// `mem` must point to `len` mapped bytes, 64-byte aligned, that stay mapped for as long
    /// as the handle lives.
    pub unsafe fn attach(mem: *mut u8, len: usize) -> Option<MrTable> {
        if len < T_ENTRIES || !(mem as usize).is_multiple_of(64) {
            return None;
        }
        let t = MrTable {
            base: mem,
            capacity: 0,
        };
        if t.word(T_MAGIC).load(Ordering::Acquire) != MR_TABLE_MAGIC {
            return None;
        }
        let capacity = t.word(T_CAPACITY).load(Ordering::Relaxed);
        (MrTable::byte_len(capacity) <= len).then_some(MrTable {
            base: mem,
            capacity,
        })
    }

    fn word(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: offsets are inside the mapping (the header, the log, or an entry below
        // `capacity`, checked by the callers), 4-byte aligned.
        unsafe { &*(self.base.add(offset) as *const AtomicU32) }
    }

    fn word64(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: as `word`, 8-byte aligned.
        unsafe { &*(self.base.add(offset) as *const AtomicU64) }
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// One past the highest index ever published (what a rescan reads).
    pub fn high(&self) -> u32 {
        self.word(T_HIGH).load(Ordering::Acquire).min(self.capacity)
    }

    /// The current generation (bumped by every change).
    pub fn generation(&self) -> u64 {
        self.word64(T_GENERATION).load(Ordering::Acquire)
    }

    /// Publishes `entry` (the daemon; `valid` false removes it). Indexes at or above the
    /// capacity are ignored.
    pub fn set(&self, index: u32, entry: Option<&MrEntry>) {
        if index >= self.capacity {
            return;
        }
        let at = T_ENTRIES + ENTRY_LEN * index as usize;
        let seq = self.word(at);
        let s = seq.load(Ordering::Relaxed);
        seq.store(s.wrapping_add(1) | 1, Ordering::Relaxed);
        fence(Ordering::Release);
        let e = entry.copied().unwrap_or_default();
        self.word(at + 4)
            .store(u32::from(entry.is_some()), Ordering::Relaxed);
        self.word(at + 8).store(e.index, Ordering::Relaxed);
        self.word(at + 12).store(e.lkey, Ordering::Relaxed);
        self.word(at + 16).store(e.rkey, Ordering::Relaxed);
        self.word(at + 20).store(e.pd, Ordering::Relaxed);
        self.word(at + 24).store(e.access, Ordering::Relaxed);
        self.word64(at + 32).store(e.addr, Ordering::Relaxed);
        self.word64(at + 40).store(e.length, Ordering::Relaxed);
        seq.store((s | 1).wrapping_add(1), Ordering::Release);
        let high = self.word(T_HIGH);
        if high.load(Ordering::Relaxed) <= index {
            high.store(index + 1, Ordering::Relaxed);
        }
        let head = self.word64(T_LOG_HEAD).load(Ordering::Relaxed);
        self.word(T_LOG + 4 * (head as usize % MR_LOG_LEN))
            .store(index, Ordering::Relaxed);
        self.word64(T_LOG_HEAD)
            .store(head.wrapping_add(1), Ordering::Release);
        let g = self.word64(T_GENERATION).load(Ordering::Relaxed);
        self.word64(T_GENERATION)
            .store(g.wrapping_add(1), Ordering::Release);
        // Ordered before the daemon's look at the readers' busy flags (see the module doc).
        fence(Ordering::SeqCst);
    }

    /// The entry at `index`, read consistently; None if absent.
    pub fn entry(&self, index: u32) -> Option<MrEntry> {
        if index >= self.capacity {
            return None;
        }
        let at = T_ENTRIES + ENTRY_LEN * index as usize;
        loop {
            let s1 = self.word(at).load(Ordering::Acquire);
            if s1 & 1 != 0 {
                core::hint::spin_loop();
                continue;
            }
            let valid = self.word(at + 4).load(Ordering::Relaxed) != 0;
            let e = MrEntry {
                index: self.word(at + 8).load(Ordering::Relaxed),
                lkey: self.word(at + 12).load(Ordering::Relaxed),
                rkey: self.word(at + 16).load(Ordering::Relaxed),
                pd: self.word(at + 20).load(Ordering::Relaxed),
                access: self.word(at + 24).load(Ordering::Relaxed),
                addr: self.word64(at + 32).load(Ordering::Relaxed),
                length: self.word64(at + 40).load(Ordering::Relaxed),
            };
            fence(Ordering::Acquire);
            if self.word(at).load(Ordering::Relaxed) == s1 {
                return (valid && e.index == index).then_some(e);
            }
        }
    }

    /// What changed since `cursor`, which is moved to now.
    pub fn changes(&self, cursor: &mut MrCursor) -> MrChanges {
        let generation = self.generation();
        if generation == cursor.generation {
            return MrChanges::None;
        }
        let head = self.word64(T_LOG_HEAD).load(Ordering::Acquire);
        let behind = head.wrapping_sub(cursor.log_pos);
        let out = if cursor.generation == 0 || behind > MR_LOG_LEN as u64 {
            MrChanges::Rescan
        } else {
            MrChanges::Some(
                (cursor.log_pos..head)
                    .map(|p| {
                        self.word(T_LOG + 4 * (p as usize % MR_LOG_LEN))
                            .load(Ordering::Relaxed)
                    })
                    .collect(),
            )
        };
        *cursor = MrCursor {
            generation,
            log_pos: head,
        };
        out
    }
}

// ---- receive completions with their data ----

/// Bytes of the CQE header of a [`FastCqe`] slot (the `struct ibv_wc` image and the piece
/// count).
pub const FAST_CQE_HEADER: usize = 64;
const PIECE_HEADER: usize = 16;

/// A completion as a direction delivers it to the peer's CQ: the `struct ibv_wc` image, and
/// the received bytes the consumer copies into its own receive buffer before it returns the
/// completion (small SENDs travel with their completion instead of by a system call into the
/// peer's memory: a receive buffer's contents are defined only at the completion, IBTA
/// §10.8.3.1). Larger data is written into the peer's memory before the completion is
/// published, and the entry then carries no pieces.
#[derive(Debug)]
pub struct FastCqe<'a> {
    pub cqe: super::wqe::Cqe,
    /// (address in the consumer, bytes).
    pub pieces: Vec<(u64, &'a [u8])>,
}

/// Room a slot of `slot_size` bytes leaves for the data of `pieces` pieces.
pub fn fast_cqe_room(slot_size: usize, pieces: usize) -> usize {
    slot_size.saturating_sub(FAST_CQE_HEADER + PIECE_HEADER * pieces)
}

impl FastCqe<'_> {
    /// Bytes the entry needs.
    pub fn encoded_len(cqe_pieces: &[(u64, &[u8])]) -> usize {
        FastCqe::encoded_len_of(cqe_pieces.iter().map(|(_, d)| d.len()))
    }

    /// Bytes an entry whose pieces are this long needs.
    pub fn encoded_len_of(piece_lens: impl IntoIterator<Item = usize>) -> usize {
        FAST_CQE_HEADER
            + piece_lens
                .into_iter()
                .map(|n| PIECE_HEADER + n.next_multiple_of(8))
                .sum::<usize>()
    }

    /// Writes the entry into `slot`; returns its length, or None if it does not fit.
    pub fn encode(
        cqe: &super::wqe::Cqe,
        pieces: &[(u64, &[u8])],
        slot: &mut [u8],
    ) -> Option<usize> {
        FastCqe::encode_from(cqe, pieces.iter().copied(), slot)
    }

    /// [`FastCqe::encode`] with the pieces from an iterator.
    pub fn encode_from<'p>(
        cqe: &super::wqe::Cqe,
        pieces: impl Iterator<Item = (u64, &'p [u8])> + Clone,
        slot: &mut [u8],
    ) -> Option<usize> {
        let len = FastCqe::encoded_len_of(pieces.clone().map(|(_, d)| d.len()));
        let count = pieces.clone().count();
        if len > slot.len() || count > u16::MAX as usize {
            return None;
        }
        cqe.encode(&mut slot[..super::wqe::IBV_WC_LEN]);
        slot[48..50].copy_from_slice(&(count as u16).to_ne_bytes());
        let mut at = FAST_CQE_HEADER;
        for (addr, data) in pieces {
            slot[at..at + 8].copy_from_slice(&addr.to_ne_bytes());
            slot[at + 8..at + 12].copy_from_slice(&(data.len() as u32).to_ne_bytes());
            slot[at + 12..at + 16].fill(0);
            at += PIECE_HEADER;
            slot[at..at + data.len()].copy_from_slice(data);
            at += data.len().next_multiple_of(8);
        }
        Some(at)
    }

    /// Reads an entry from a slot (copied out of the ring first), or None if malformed.
    pub fn decode(slot: &[u8]) -> Option<FastCqe<'_>> {
        let cqe = super::wqe::Cqe::decode(slot.get(..super::wqe::IBV_WC_LEN)?)?;
        let n = u16::from_ne_bytes(slot.get(48..50)?.try_into().ok()?) as usize;
        let mut pieces = Vec::with_capacity(n);
        let mut at = FAST_CQE_HEADER;
        for _ in 0..n {
            let addr = u64::from_ne_bytes(slot.get(at..at + 8)?.try_into().ok()?);
            let len = u32::from_ne_bytes(slot.get(at + 8..at + 12)?.try_into().ok()?) as usize;
            at += PIECE_HEADER;
            pieces.push((addr, slot.get(at..at.checked_add(len)?)?));
            at += len.next_multiple_of(8);
        }
        Some(FastCqe { cqe, pieces })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy)]
    #[repr(align(64))]
    struct Line(#[allow(dead_code)] [u8; 64]);

    fn mem(len: usize) -> Vec<Line> {
        vec![Line([0; 64]); len.div_ceil(64)]
    }

    #[test]
    fn enter_fails_once_revoked_and_leave_clears_busy() {
        let mut m = mem(CONTROL_LEN);
        let p = m.as_mut_ptr() as *mut u8;
        let daemon = unsafe { Direction::init(p, 7) };
        assert!(unsafe { Direction::attach(p, CONTROL_LEN, 8) }.is_none());
        let shim = unsafe { Direction::attach(p, CONTROL_LEN, 7) }.unwrap();
        assert!(shim.enter());
        assert!(daemon.busy());
        let pub_ = Published {
            req_psn: 5,
            comp_psn: 5,
            resp_psn: 9,
            msn: 3,
            recvs_used: 1,
            flags: 0,
        };
        shim.publish(&pub_);
        shim.leave();
        assert!(!daemon.busy());
        assert_eq!(daemon.published(), pub_);
        daemon.revoke();
        assert!(!shim.enter(), "revoked: the taker must not run it");
        assert!(!daemon.busy());
        shim.write_counters(1, &[1, 2, 3]);
        assert_eq!(&daemon.counters(1)[..4], &[1, 2, 3, 0]);
        // Only changed words are stored; what the daemon reads is the whole set all the same.
        let mut published = shim.counters(1);
        let mut words = published;
        words[1] = 20;
        words[63] = 7;
        shim.write_changed_counters(1, &words, &mut published);
        assert_eq!(daemon.counters(1), words);
        assert_eq!(published, words);
        // A word another writer changed behind the cache stays as that writer left it.
        daemon.write_counters(1, &[1, 2, 99]);
        shim.write_changed_counters(1, &words, &mut published);
        assert_eq!(
            daemon.counters(1)[2],
            99,
            "unchanged for this writer: not stored"
        );
    }

    #[test]
    fn mr_table_readers_follow_changes_and_rescan_when_far_behind() {
        let cap = 64;
        let mut m = mem(MrTable::byte_len(cap));
        let p = m.as_mut_ptr() as *mut u8;
        let daemon = unsafe { MrTable::init(p, cap) };
        let shim = unsafe { MrTable::attach(p, MrTable::byte_len(cap)) }.unwrap();
        let mut cur = MrCursor::default();
        assert_eq!(shim.changes(&mut cur), MrChanges::None);
        let e = MrEntry {
            index: 3,
            lkey: 0x301,
            rkey: 0x301,
            pd: 1,
            access: 7,
            addr: 0x1000,
            length: 4096,
        };
        daemon.set(3, Some(&e));
        // A fresh reader reads everything.
        assert_eq!(shim.changes(&mut cur), MrChanges::Rescan);
        assert_eq!(shim.entry(3), Some(e));
        daemon.set(3, None);
        daemon.set(5, Some(&MrEntry { index: 5, ..e }));
        assert_eq!(shim.changes(&mut cur), MrChanges::Some(vec![3, 5]));
        assert_eq!(shim.entry(3), None);
        assert_eq!(shim.entry(5).map(|e| e.index), Some(5));
        for _ in 0..MR_LOG_LEN + 1 {
            daemon.set(6, Some(&MrEntry { index: 6, ..e }));
        }
        assert_eq!(shim.changes(&mut cur), MrChanges::Rescan);
        daemon.set(cap, Some(&e));
        assert_eq!(
            shim.changes(&mut cur),
            MrChanges::None,
            "out of range: ignored"
        );
    }

    #[test]
    fn fast_cqes_carry_their_pieces() {
        let cqe = super::super::wqe::Cqe {
            wr_id: 9,
            byte_len: 5,
            ..Default::default()
        };
        let mut slot = [0u8; 256];
        let pieces: [(u64, &[u8]); 2] = [(0x10, b"hel"), (0x20, b"lo")];
        let n = FastCqe::encode(&cqe, &pieces, &mut slot).unwrap();
        assert_eq!(n, FastCqe::encoded_len(&pieces));
        let back = FastCqe::decode(&slot).unwrap();
        assert_eq!(back.cqe, cqe);
        assert_eq!(back.pieces, pieces.to_vec());
        assert!(FastCqe::encode(&cqe, &[(0, &[0u8; 300])], &mut slot).is_none());
        assert!(fast_cqe_room(256, 1) >= 176);
    }
}
