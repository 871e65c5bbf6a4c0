//! The shared-memory rings between the shim (inside the application) and the daemon.
//!
//! Every queue the application sees (send queue, receive queue, SRQ, completion queue) is a
//! single-producer, single-consumer ring in a memfd that both processes map. Posting a work
//! request and polling a completion are a copy and an atomic store: no system call while the
//! daemon polls. When the consumer goes to sleep it says so in the ring header, and a producer
//! that sees it rings the doorbell (an eventfd) once.
//!
//! Layout of one ring (all offsets in bytes, native byte order: both ends run on one machine):
//!
//! | offset | field |
//! |---|---|
//! | 0 | magic `RING_MAGIC`, version, slot size, slot count (written once by the daemon) |
//! | 64 | producer index (free-running u32), on its own cache line |
//! | 128 | consumer index (free-running u32), on its own cache line |
//! | 192 | `consumer_sleeping` flag; `notify` word (CQ arming, see [`NOTIFY_NEXT`]); fast-path offer (send rings) and fast-source count (CQ rings), see [`fast`] |
//! | 256 | `slot_count` slots of `slot_size` bytes |
//!
//! The other process is not trusted: the daemon keeps its own copy of the geometry, never reads
//! it back from shared memory, masks every index, and reports an index that moved impossibly
//! as [`RingError::Corrupt`] instead of trusting it. Slot contents are copied out before they
//! are decoded, and decoding ([`crate::ring::wqe`]) validates every field.

#![allow(unsafe_code)]

pub mod doorbell;
pub mod fast;
pub mod wqe;

use core::sync::atomic::{fence, AtomicU32, Ordering};

pub const RING_MAGIC: u32 = 0x5352_5247; // "SRRG"
pub const RING_VERSION: u32 = 1;
pub const HEADER_LEN: usize = 256;
const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 4;
const OFF_SLOT_SIZE: usize = 8;
const OFF_SLOT_COUNT: usize = 12;
const OFF_PRODUCER: usize = 64;
const OFF_CONSUMER: usize = 128;
const OFF_SLEEPING: usize = 192;
const OFF_NOTIFY: usize = 196;
/// Send rings: the daemon offers the QP's requester to its process (the same-host fast path,
/// [`fast`]): nonzero = offered.
const OFF_FAST_OFFER: usize = 200;
/// Completion rings: how many times the set of fast rings feeding this CQ changed.
const OFF_FAST_SOURCES: usize = 204;
/// Receive rings (a QP's or an SRQ's): lent to the process that runs the responder of the
/// fast path: nonzero = lent, and a post needs no doorbell.
const OFF_FAST_LENT: usize = 208;

/// CQ arming (`ibv_req_notify_cq`): no event wanted.
pub const NOTIFY_NONE: u32 = 0;
/// Fire one completion event on the next completion.
pub const NOTIFY_NEXT: u32 = 1;
/// Fire one completion event on the next solicited (or error) completion.
pub const NOTIFY_SOLICITED: u32 = 2;

/// The shape of a ring, fixed at creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingGeometry {
    /// Bytes per slot: a multiple of 64 so slots never share a cache line.
    pub slot_size: u32,
    /// Number of slots: a power of two.
    pub slot_count: u32,
}

impl RingGeometry {
    /// The smallest geometry holding `entries` slots of at least `min_slot` bytes.
    pub fn new(entries: u32, min_slot: u32) -> Option<RingGeometry> {
        let slot_count = entries.max(1).checked_next_power_of_two()?;
        let slot_size = min_slot.max(64).checked_next_multiple_of(64)?;
        let g = RingGeometry {
            slot_size,
            slot_count,
        };
        (g.byte_len() <= 1 << 30).then_some(g)
    }

    /// Bytes of shared memory the ring needs.
    pub fn byte_len(&self) -> usize {
        HEADER_LEN + self.slot_size as usize * self.slot_count as usize
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    #[error("ring full")]
    Full,
    #[error("the peer corrupted the ring (index moved by {0})")]
    Corrupt(u32),
    #[error("entry of {len} bytes does not fit a {slot}-byte slot")]
    TooLarge { len: usize, slot: u32 },
    #[error("ring memory is too small, misaligned or not initialised")]
    BadMemory,
}

/// One end's handle on a ring in shared memory.
///
/// It holds a raw pointer because the memory is shared with another process: Rust references
/// to it would promise an exclusivity that does not exist. All accesses to the index words go
/// through atomics; slot bytes are copied with `copy_nonoverlapping` while the protocol gives
/// this end ownership of the slot.
#[derive(Debug)]
pub struct SharedRing {
    base: *mut u8,
    geometry: RingGeometry,
    /// Our private copy of the index we own (producer or consumer), so that the peer writing
    /// into it cannot make us misbehave.
    local: u32,
}

// SAFETY: the ring is designed to be used from one thread at a time on each side; moving the
// handle to another thread is fine (it is just a pointer into a mapping that outlives it).
unsafe impl Send for SharedRing {}

impl SharedRing {
    /// Writes a fresh header for `geometry` into `mem` and returns the producer-side or
    /// consumer-side handle (both start at index 0).
    ///
    /// # Safety
    /// `mem` must point to at least `geometry.byte_len()` bytes, 64-byte aligned, that stay
    /// mapped for as long as any handle on this ring lives.
    pub unsafe fn init(mem: *mut u8, geometry: RingGeometry) -> SharedRing {
        // SAFETY: the caller guarantees the header lies inside the mapping.
        unsafe {
            core::ptr::write_bytes(mem, 0, HEADER_LEN);
            (mem.add(OFF_MAGIC) as *mut u32).write(RING_MAGIC);
            (mem.add(OFF_VERSION) as *mut u32).write(RING_VERSION);
            (mem.add(OFF_SLOT_SIZE) as *mut u32).write(geometry.slot_size);
            (mem.add(OFF_SLOT_COUNT) as *mut u32).write(geometry.slot_count);
        }
        fence(Ordering::Release);
        SharedRing {
            base: mem,
            geometry,
            local: 0,
        }
    }

    /// Attaches to a ring that the other side initialised, reading and checking its geometry
    /// (for the shim, which trusts the daemon's header). The daemon uses [`SharedRing::init`].
    ///
    /// # Safety
    /// `mem` must point to `len` mapped bytes, 64-byte aligned, that stay mapped for as long as
    /// the handle lives.
    pub unsafe fn attach(
        mem: *mut u8,
        len: usize,
        producer: bool,
    ) -> Result<SharedRing, RingError> {
        if len < HEADER_LEN || !(mem as usize).is_multiple_of(64) {
            return Err(RingError::BadMemory);
        }
        // SAFETY: the header lies inside the mapping (checked above).
        let (magic, version, slot_size, slot_count) = unsafe {
            (
                (mem.add(OFF_MAGIC) as *const u32).read_volatile(),
                (mem.add(OFF_VERSION) as *const u32).read_volatile(),
                (mem.add(OFF_SLOT_SIZE) as *const u32).read_volatile(),
                (mem.add(OFF_SLOT_COUNT) as *const u32).read_volatile(),
            )
        };
        let geometry = RingGeometry {
            slot_size,
            slot_count,
        };
        let sane = magic == RING_MAGIC
            && version == RING_VERSION
            && slot_count.is_power_of_two()
            && slot_size >= 64
            && slot_size.is_multiple_of(64)
            && geometry.byte_len() <= len;
        if !sane {
            return Err(RingError::BadMemory);
        }
        let mut ring = SharedRing {
            base: mem,
            geometry,
            local: 0,
        };
        ring.local = if producer {
            ring.word(OFF_PRODUCER).load(Ordering::Acquire)
        } else {
            ring.word(OFF_CONSUMER).load(Ordering::Acquire)
        };
        Ok(ring)
    }

    pub fn geometry(&self) -> RingGeometry {
        self.geometry
    }

    fn word(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: every offset passed is inside the header, 4-byte aligned, and the mapping
        // outlives `self` (constructor contract). AtomicU32 has the layout of u32.
        unsafe { &*(self.base.add(offset) as *const AtomicU32) }
    }

    fn slot_ptr(&self, index: u32) -> *mut u8 {
        let i = (index & (self.geometry.slot_count - 1)) as usize;
        // SAFETY: `i < slot_count`, so the slot lies inside the mapping.
        unsafe {
            self.base
                .add(HEADER_LEN + i * self.geometry.slot_size as usize)
        }
    }

    /// Entries the consumer has not taken yet, as the producer sees it.
    fn used(&self, producer: u32, consumer: u32) -> Result<u32, RingError> {
        let used = producer.wrapping_sub(consumer);
        if used > self.geometry.slot_count {
            Err(RingError::Corrupt(used))
        } else {
            Ok(used)
        }
    }

    // ---- producer side ----

    /// Free slots, as the producer sees them.
    pub fn free(&self) -> Result<u32, RingError> {
        let consumer = self.word(OFF_CONSUMER).load(Ordering::Acquire);
        Ok(self.geometry.slot_count - self.used(self.local, consumer)?)
    }

    /// Copies `entry` into the next slot and publishes it. Returns whether the consumer said
    /// it is asleep, in which case the caller rings the doorbell.
    pub fn push(&mut self, entry: &[u8]) -> Result<bool, RingError> {
        if entry.len() > self.geometry.slot_size as usize {
            return Err(RingError::TooLarge {
                len: entry.len(),
                slot: self.geometry.slot_size,
            });
        }
        if self.free()? == 0 {
            return Err(RingError::Full);
        }
        // SAFETY: the slot at `local` is owned by the producer until it publishes `local + 1`;
        // `entry` fits the slot (checked above).
        unsafe {
            core::ptr::copy_nonoverlapping(entry.as_ptr(), self.slot_ptr(self.local), entry.len())
        };
        self.local = self.local.wrapping_add(1);
        self.word(OFF_PRODUCER).store(self.local, Ordering::Release);
        // Dekker with `consumer_prepare_sleep`: our store of the index and their store of the
        // flag cannot both be missed.
        fence(Ordering::SeqCst);
        Ok(self.word(OFF_SLEEPING).load(Ordering::Relaxed) != 0)
    }

    // ---- consumer side ----

    /// Entries waiting, as the consumer sees them.
    pub fn available(&self) -> Result<u32, RingError> {
        let producer = self.word(OFF_PRODUCER).load(Ordering::Acquire);
        self.used(producer, self.local)
    }

    /// Copies the next entry into `out` (which must hold a whole slot) and frees its slot.
    /// Returns `Ok(false)` when the ring is empty.
    pub fn pop(&mut self, out: &mut [u8]) -> Result<bool, RingError> {
        self.next_entry(out, true)
    }

    /// Copies the next entry into `out` as [`SharedRing::pop`] does, but leaves its slot
    /// taken: this handle moves on, the ring's consumer index does not (a look at what
    /// waits, through a [`SharedRing::consumer_handle`]).
    pub fn peek(&mut self, out: &mut [u8]) -> Result<bool, RingError> {
        self.next_entry(out, false)
    }

    fn next_entry(&mut self, out: &mut [u8], free: bool) -> Result<bool, RingError> {
        if out.len() < self.geometry.slot_size as usize {
            return Err(RingError::TooLarge {
                len: self.geometry.slot_size as usize,
                slot: out.len() as u32,
            });
        }
        if self.available()? == 0 {
            return Ok(false);
        }
        // SAFETY: the producer published this slot (Acquire above) and will not touch it until
        // we publish the new consumer index; `out` holds at least one slot.
        unsafe {
            core::ptr::copy_nonoverlapping(
                self.slot_ptr(self.local),
                out.as_mut_ptr(),
                self.geometry.slot_size as usize,
            )
        };
        self.local = self.local.wrapping_add(1);
        if free {
            self.word(OFF_CONSUMER).store(self.local, Ordering::Release);
        }
        Ok(true)
    }

    /// Announces that the consumer is about to sleep. Returns `true` if entries arrived in the
    /// meantime, in which case the caller must not sleep (and the flag is cleared again).
    pub fn consumer_prepare_sleep(&self) -> Result<bool, RingError> {
        self.word(OFF_SLEEPING).store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if self.available()? > 0 {
            self.consumer_awake();
            return Ok(true);
        }
        Ok(false)
    }

    /// Clears the sleeping flag after a wake-up.
    pub fn consumer_awake(&self) {
        self.word(OFF_SLEEPING).store(0, Ordering::Relaxed);
    }

    /// The consumer takes over a ring another process consumed meanwhile (the same-host fast
    /// path lends a receive ring to the process that runs its responder): reads the shared
    /// consumer index, which must leave at most a full ring unread before the producer's
    /// (the other consumer may have taken any number of entries meanwhile).
    pub fn resync_consumer(&mut self) -> Result<(), RingError> {
        let shared = self.word(OFF_CONSUMER).load(Ordering::Acquire);
        let producer = self.word(OFF_PRODUCER).load(Ordering::Acquire);
        self.used(producer, shared)?;
        self.local = shared;
        Ok(())
    }

    /// A consumer's handle on the ring this producer fills, at the consumer index the ring
    /// holds now: for a producer that takes over its own ring's unread entries while the
    /// usual consumer does not read it (the same-host fast path's taker reads what waited in
    /// its QP's send ring; the daemon resynchronises when the direction comes back). It is
    /// one more handle on the same memory: the contract of [`SharedRing::init`] and
    /// [`SharedRing::attach`] (mapped for as long as any handle lives) covers it.
    pub fn consumer_handle(&self) -> Result<SharedRing, RingError> {
        let mut ring = SharedRing {
            base: self.base,
            geometry: self.geometry,
            local: 0,
        };
        ring.resync_consumer()?;
        Ok(ring)
    }

    // ---- the same-host fast path (see [`fast`]) ----

    /// The daemon offers (or withdraws) the fast path for the QP whose send ring this is.
    pub fn set_fast_offer(&self, offered: bool) {
        self.word(OFF_FAST_OFFER)
            .store(u32::from(offered), Ordering::Release);
    }

    /// Whether the daemon offers the fast path (read by the shim before it posts).
    pub fn fast_offered(&self) -> bool {
        self.word(OFF_FAST_OFFER).load(Ordering::Relaxed) != 0
    }

    /// The daemon lends this receive ring to another process (the fast path), or takes it
    /// back. Taking it back is followed by a fence and a read of the ring: a producer that
    /// read "lent" after its post (and rang no doorbell) posted before that read.
    pub fn set_fast_lent(&self, lent: bool) {
        self.word(OFF_FAST_LENT)
            .store(u32::from(lent), Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Whether the ring is lent: read by the producer after a post (whose `push` ends with a
    /// fence), which then rings no doorbell: the device is not the consumer.
    pub fn fast_lent(&self) -> bool {
        self.word(OFF_FAST_LENT).load(Ordering::SeqCst) != 0
    }

    /// The daemon changed the fast rings that feed this CQ.
    pub fn bump_fast_sources(&self) {
        self.word(OFF_FAST_SOURCES).fetch_add(1, Ordering::Release);
    }

    /// How many times the daemon changed them (the shim asks again when this moves).
    pub fn fast_sources(&self) -> u32 {
        self.word(OFF_FAST_SOURCES).load(Ordering::Acquire)
    }

    // ---- CQ notification ----

    /// The application arms the CQ (`ibv_req_notify_cq`).
    pub fn arm(&self, solicited_only: bool) {
        let v = if solicited_only {
            NOTIFY_SOLICITED
        } else {
            NOTIFY_NEXT
        };
        // A pending NEXT must not be narrowed to SOLICITED.
        let _ = self
            .word(OFF_NOTIFY)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                Some(if cur == NOTIFY_NEXT { cur } else { v })
            });
    }

    /// How the CQ is armed: `Some(solicited_only)`, or `None` (for moving the arm to a new
    /// ring when the CQ is resized).
    pub fn armed(&self) -> Option<bool> {
        match self.word(OFF_NOTIFY).load(Ordering::Acquire) {
            NOTIFY_NEXT => Some(false),
            NOTIFY_SOLICITED => Some(true),
            _ => None,
        }
    }

    /// The daemon, after adding a completion: consumes the arm if this completion fires it
    /// (IBTA §11.4.2.2: one event per arming). Returns whether to send the event.
    pub fn take_arm(&self, solicited_or_error: bool) -> bool {
        let word = self.word(OFF_NOTIFY);
        let cur = word.load(Ordering::Acquire);
        let fires = cur == NOTIFY_NEXT || (cur == NOTIFY_SOLICITED && solicited_or_error);
        fires
            && word
                .compare_exchange(cur, NOTIFY_NONE, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 64-byte aligned, zeroed memory standing in for a memfd mapping.
    #[derive(Clone, Copy)]
    #[repr(align(64))]
    struct Line(#[allow(dead_code)] [u8; 64]);
    struct Mem(Vec<Line>);
    impl Mem {
        fn new(len: usize) -> Mem {
            Mem(vec![Line([0; 64]); len.div_ceil(64)])
        }
        fn ptr(&mut self) -> *mut u8 {
            self.0.as_mut_ptr() as *mut u8
        }
        fn len(&self) -> usize {
            self.0.len() * 64
        }
    }

    #[test]
    fn geometry_rounds_up() {
        let g = RingGeometry::new(100, 80).unwrap();
        assert_eq!(g.slot_count, 128);
        assert_eq!(g.slot_size, 128);
        assert_eq!(g.byte_len(), 256 + 128 * 128);
        assert!(RingGeometry::new(u32::MAX, 64).is_none());
    }

    #[test]
    fn push_pop_in_order_and_full() {
        let g = RingGeometry::new(4, 64).unwrap();
        let mut mem = Mem::new(g.byte_len());
        let mut prod = unsafe { SharedRing::init(mem.ptr(), g) };
        let mut cons = unsafe { SharedRing::attach(mem.ptr(), mem.len(), false) }.unwrap();
        let mut out = [0u8; 64];
        assert!(!cons.pop(&mut out).unwrap());
        for round in 0..10u8 {
            for i in 0..4u8 {
                prod.push(&[round, i]).unwrap();
            }
            assert_eq!(prod.push(&[9]), Err(RingError::Full));
            for i in 0..4u8 {
                assert!(cons.pop(&mut out).unwrap());
                assert_eq!(&out[..2], &[round, i]);
            }
        }
        assert_eq!(
            prod.push(&[0u8; 65]),
            Err(RingError::TooLarge { len: 65, slot: 64 })
        );
    }

    #[test]
    fn a_corrupt_index_is_an_error_not_a_wild_read() {
        let g = RingGeometry::new(8, 64).unwrap();
        let mut mem = Mem::new(g.byte_len());
        let _prod = unsafe { SharedRing::init(mem.ptr(), g) };
        let mut cons = unsafe { SharedRing::attach(mem.ptr(), mem.len(), false) }.unwrap();
        // A hostile producer writes a wild index.
        unsafe { (mem.ptr().add(OFF_PRODUCER) as *mut u32).write(12345) };
        let mut out = [0u8; 64];
        assert_eq!(cons.pop(&mut out), Err(RingError::Corrupt(12345)));
        // And a garbage header is refused on attach.
        unsafe { (mem.ptr().add(OFF_SLOT_COUNT) as *mut u32).write(3) };
        assert!(unsafe { SharedRing::attach(mem.ptr(), mem.len(), false) }.is_err());
    }

    #[test]
    fn sleeping_consumer_is_woken_exactly_when_needed() {
        let g = RingGeometry::new(8, 64).unwrap();
        let mut mem = Mem::new(g.byte_len());
        let mut prod = unsafe { SharedRing::init(mem.ptr(), g) };
        let cons = unsafe { SharedRing::attach(mem.ptr(), mem.len(), false) }.unwrap();
        assert!(!prod.push(&[1]).unwrap(), "consumer awake: no doorbell");
        assert!(
            cons.consumer_prepare_sleep().unwrap(),
            "work pending: do not sleep"
        );
        let mut cons = cons;
        let mut out = [0u8; 64];
        cons.pop(&mut out).unwrap();
        assert!(!cons.consumer_prepare_sleep().unwrap());
        assert!(
            prod.push(&[2]).unwrap(),
            "consumer asleep: ring the doorbell"
        );
        cons.consumer_awake();
        assert!(!prod.push(&[3]).unwrap());
    }

    #[test]
    fn a_producer_reads_its_own_ring_from_where_the_consumer_stopped() {
        let g = RingGeometry::new(8, 64).unwrap();
        let mut mem = Mem::new(g.byte_len());
        let mut prod = unsafe { SharedRing::init(mem.ptr(), g) };
        let mut daemon = unsafe { SharedRing::attach(mem.ptr(), mem.len(), false) }.unwrap();
        let mut out = [0u8; 64];
        for i in 0..5u8 {
            prod.push(&[i]).unwrap();
        }
        daemon.pop(&mut out).unwrap();
        // A look leaves the slots taken.
        let mut look = prod.consumer_handle().unwrap();
        for want in 1..5u8 {
            assert!(look.peek(&mut out).unwrap());
            assert_eq!(out[0], want);
        }
        assert!(!look.peek(&mut out).unwrap());
        assert_eq!(prod.free().unwrap(), 4);
        // The producer takes over what the daemon left, in order, and frees the slots.
        let mut own = prod.consumer_handle().unwrap();
        for want in 1..5u8 {
            assert!(own.pop(&mut out).unwrap());
            assert_eq!(out[0], want);
        }
        assert!(!own.pop(&mut out).unwrap());
        assert_eq!(prod.free().unwrap(), 8);
        // Then the daemon comes back where the producer stopped.
        prod.push(&[9]).unwrap();
        daemon.resync_consumer().unwrap();
        assert!(daemon.pop(&mut out).unwrap());
        assert_eq!(out[0], 9);
        // A consumer index moved past the producer is refused.
        unsafe { (mem.ptr().add(OFF_CONSUMER) as *mut u32).write(100) };
        assert!(prod.consumer_handle().is_err());
    }

    #[test]
    fn a_lent_ring_is_taken_back_where_the_other_consumer_left_it() {
        let g = RingGeometry::new(8, 64).unwrap();
        let mut mem = Mem::new(g.byte_len());
        let mut prod = unsafe { SharedRing::init(mem.ptr(), g) };
        let mut daemon = unsafe { SharedRing::attach(mem.ptr(), mem.len(), false) }.unwrap();
        let mut other = unsafe { SharedRing::attach(mem.ptr(), mem.len(), false) }.unwrap();
        let mut out = [0u8; 64];
        for i in 0..3u8 {
            prod.push(&[i]).unwrap();
        }
        other.pop(&mut out).unwrap();
        other.pop(&mut out).unwrap();
        daemon.resync_consumer().unwrap();
        assert!(daemon.pop(&mut out).unwrap());
        assert_eq!(out[0], 2);
        assert!(!daemon.pop(&mut out).unwrap());
        // The other consumer may take more than a ring's worth meanwhile (the producer
        // refilled it).
        for i in 0..8u8 {
            prod.push(&[i]).unwrap();
        }
        other.resync_consumer().unwrap();
        for _ in 0..8 {
            assert!(other.pop(&mut out).unwrap());
        }
        prod.push(&[42]).unwrap();
        daemon.resync_consumer().unwrap();
        assert!(daemon.pop(&mut out).unwrap());
        assert_eq!(out[0], 42);
        // A consumer index moved past the producer is refused.
        unsafe { (mem.ptr().add(OFF_CONSUMER) as *mut u32).write(100) };
        assert!(daemon.resync_consumer().is_err());
    }

    #[test]
    fn cq_arming_fires_once() {
        let g = RingGeometry::new(8, 64).unwrap();
        let mut mem = Mem::new(g.byte_len());
        let ring = unsafe { SharedRing::init(mem.ptr(), g) };
        assert!(!ring.take_arm(false));
        ring.arm(true);
        assert!(
            !ring.take_arm(false),
            "solicited-only ignores plain completions"
        );
        assert!(ring.take_arm(true));
        assert!(!ring.take_arm(true), "one event per arming");
        ring.arm(false);
        ring.arm(true);
        assert!(
            ring.take_arm(false),
            "NEXT is not narrowed by a later SOLICITED"
        );
    }

    #[test]
    fn two_threads_pass_a_million_entries() {
        // Under Miri (which checks every access of the two threads for races) a few laps of
        // the ring are enough and a million would take hours.
        let total: u64 = if cfg!(miri) { 300 } else { 1_000_000 };
        /// The ring's address, handed to the consumer thread with its provenance.
        struct Shared(*mut u8);
        // SAFETY: `mem` outlives the consumer (dropped after the join); the ring's indices are
        // atomics and each slot is owned by one side at a time.
        unsafe impl Send for Shared {}
        let g = RingGeometry::new(64, 64).unwrap();
        let mut mem = Mem::new(g.byte_len());
        let shared = Shared(mem.ptr());
        let len = mem.len();
        let mut prod = unsafe { SharedRing::init(shared.0, g) };
        let consumer = std::thread::spawn(move || {
            let shared = shared;
            let mut cons = unsafe { SharedRing::attach(shared.0, len, false) }.unwrap();
            let mut out = [0u8; 64];
            let mut expect = 0u64;
            while expect < total {
                if cons.pop(&mut out).unwrap() {
                    assert_eq!(u64::from_le_bytes(out[..8].try_into().unwrap()), expect);
                    expect += 1;
                } else {
                    std::hint::spin_loop();
                }
            }
        });
        let mut i = 0u64;
        while i < total {
            match prod.push(&i.to_le_bytes()) {
                Ok(_) => i += 1,
                Err(RingError::Full) => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
        consumer.join().unwrap();
        drop(mem);
    }
}
