//! The doorbell table: which of a client's rings have work, so that the daemon's pass costs
//! the rings that do, not every ring the client has (issue 17: with 100,000 idle QPs, looking
//! at each ring on every pass made every control request and every wake-up cost O(QPs)).
//!
//! One table per client and device, in a sealed memfd of its own that both map. Every ring the
//! client posts to (a QP's send and receive queues share one doorbell, an SRQ has its own) gets
//! a doorbell index from the daemon. After publishing a WQE the client sets the index's bit,
//! and the bit of its word one level up, and so on (three levels: 2^20 doorbells in 64-bit
//! words, a word per 64 words above), then reads the table's `sleeping` flag and writes the
//! device's eventfd if it is set. The daemon takes the top level's words, then the words they
//! name, then the bits, clearing each as it takes it, and reads the rings named. A level is set
//! only when the word below was empty: whoever set the first bit of a word sets the word's bit
//! above, after it, and the daemon clears a level before it reads the one below, so a bit is
//! never left set without a path to it from the top.
//!
//! Layout (native byte order, offsets in bytes):
//!
//! | offset | field |
//! |---|---|
//! | 0 | magic `DOORBELL_MAGIC`, version, capacity (written once by the daemon) |
//! | 64 | `sleeping`: the daemon is about to block (Dekker with the client's bit, as the rings' flag) |
//! | 96 | `port`: port 1's state, active MTU and GID table generation, written by the daemon whenever they change ([`Doorbells::set_port`]), read by `ibv_query_port` |
//! | 128 | level 2: up to 4 words |
//! | 256 | level 1: up to 256 words |
//! | 4096 | level 0: `capacity / 64` words, one bit per doorbell |
//!
//! The client is not trusted: the daemon keeps the capacity itself, never reads it back, and
//! treats a bit that names no word or no ring of the client as nothing. A client that sets
//! every bit costs the daemon a look at each of its own rings (what posting to each would
//! cost), and one that clears bits only delays its own work.

use core::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

pub const DOORBELL_MAGIC: u32 = 0x5344_4242; // "SDBB"
pub const DOORBELL_VERSION: u32 = 2;
/// Most doorbells of one table.
pub const MAX_DOORBELLS: u32 = 1 << 20;
const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 4;
const OFF_CAPACITY: usize = 8;
const OFF_SLEEPING: usize = 64;
const OFF_PORT: usize = 96;
/// In the port word: written at least once (a table the daemon never wrote says nothing).
const PORT_KNOWN: u32 = 1 << 31;
/// In the port word, bits 16..31: the GID table's generation, modulo 2^15.
const GID_GENERATION_MASK: u32 = 0x7fff;

/// Port 1 as the port word says it ([`Doorbells::port`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PortState {
    pub active: bool,
    /// The IB MTU enum, 1..=5.
    pub active_mtu: u8,
    /// Changes (modulo 2^15) whenever the GID table does: a client whose copy of the table
    /// came with another generation asks the daemon for it again.
    pub gid_generation: u16,
}
const OFF_LEVEL2: usize = 128;
const OFF_LEVEL1: usize = 256;
const OFF_LEVEL0: usize = 4096;

/// Bytes a table of `capacity` doorbells needs (`capacity` a multiple of 64, at most
/// [`MAX_DOORBELLS`]).
pub const fn table_len(capacity: u32) -> usize {
    OFF_LEVEL0 + capacity as usize / 8
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DoorbellError {
    #[error("doorbell table memory is too small, misaligned or not initialised")]
    BadMemory,
}

/// One end's handle on a doorbell table in shared memory (a raw pointer, as
/// [`super::SharedRing`]: the memory is shared with another process).
#[derive(Debug)]
pub struct Doorbells {
    base: *mut u8,
    capacity: u32,
}

// SAFETY: a pointer into a mapping that outlives the handle; every access is atomic.
unsafe impl Send for Doorbells {}
// SAFETY: as above: concurrent use from several threads only makes atomic accesses.
unsafe impl Sync for Doorbells {}

impl Doorbells {
    /// Writes a fresh table of `capacity` doorbells (rounded up to a multiple of 64, at most
    /// [`MAX_DOORBELLS`]) into `mem`, all clear (the daemon's side).
    ///
    /// # Safety
    /// `mem` must point to at least `table_len(capacity)` bytes (with `capacity` rounded),
    /// 64-byte aligned and zeroed, that stay mapped for as long as the handle lives.
    pub unsafe fn init(mem: *mut u8, capacity: u32) -> Doorbells {
        let capacity = capacity.clamp(64, MAX_DOORBELLS).next_multiple_of(64);
        // SAFETY: the header lies inside the mapping (caller's contract).
        unsafe {
            (mem.add(OFF_MAGIC) as *mut u32).write(DOORBELL_MAGIC);
            (mem.add(OFF_VERSION) as *mut u32).write(DOORBELL_VERSION);
            (mem.add(OFF_CAPACITY) as *mut u32).write(capacity);
        }
        fence(Ordering::Release);
        Doorbells {
            base: mem,
            capacity,
        }
    }

    /// Attaches to a table the daemon initialised (the client's side), checking its header.
    ///
    /// # Safety
    /// `mem` must point to `len` mapped bytes, 64-byte aligned, that stay mapped for as long as
    /// the handle lives.
    pub unsafe fn attach(mem: *mut u8, len: usize) -> Result<Doorbells, DoorbellError> {
        if len < OFF_LEVEL0 || !(mem as usize).is_multiple_of(64) {
            return Err(DoorbellError::BadMemory);
        }
        // SAFETY: the header lies inside the mapping (checked above).
        let (magic, version, capacity) = unsafe {
            (
                (mem.add(OFF_MAGIC) as *const u32).read_volatile(),
                (mem.add(OFF_VERSION) as *const u32).read_volatile(),
                (mem.add(OFF_CAPACITY) as *const u32).read_volatile(),
            )
        };
        let sane = magic == DOORBELL_MAGIC
            && version == DOORBELL_VERSION
            && capacity > 0
            && capacity <= MAX_DOORBELLS
            && capacity.is_multiple_of(64)
            && table_len(capacity) <= len;
        if !sane {
            return Err(DoorbellError::BadMemory);
        }
        Ok(Doorbells {
            base: mem,
            capacity,
        })
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    fn words(&self) -> (usize, usize, usize) {
        let l0 = self.capacity as usize / 64;
        let l1 = l0.div_ceil(64);
        (l0, l1, l1.div_ceil(64))
    }

    fn word(&self, offset: usize, index: usize) -> &AtomicU64 {
        // SAFETY: callers pass an index below the level's word count for `capacity`, so the
        // word lies inside the table (constructor contract); 8-byte aligned.
        unsafe { &*(self.base.add(offset + index * 8) as *const AtomicU64) }
    }

    fn sleeping(&self) -> &AtomicU32 {
        // SAFETY: inside the header, 4-byte aligned, mapping outlives `self`.
        unsafe { &*(self.base.add(OFF_SLEEPING) as *const AtomicU32) }
    }

    fn port_word(&self) -> &AtomicU32 {
        // SAFETY: inside the header, 4-byte aligned, mapping outlives `self`.
        unsafe { &*(self.base.add(OFF_PORT) as *const AtomicU32) }
    }

    /// The port's state as the daemon last wrote it, or `None` before it wrote any. The
    /// kernel's port query reads the port each time; this is its shared-memory form (the
    /// port goes down and up, its MTU follows a netdev's, and its GID table the netdev's
    /// addresses, while a context is open). The client does not trust the MTU: the caller
    /// checks its range.
    pub fn port(&self) -> Option<PortState> {
        let w = self.port_word().load(Ordering::Acquire);
        (w & PORT_KNOWN != 0).then_some(PortState {
            active: w & 1 != 0,
            active_mtu: (w >> 8) as u8,
            gid_generation: ((w >> 16) & GID_GENERATION_MASK) as u16,
        })
    }

    /// Publishes the port's state (the daemon's side, at the table's making and at every
    /// change).
    pub fn set_port(&self, port: PortState) {
        let w = PORT_KNOWN
            | u32::from(port.active)
            | u32::from(port.active_mtu) << 8
            | (u32::from(port.gid_generation) & GID_GENERATION_MASK) << 16;
        self.port_word().store(w, Ordering::Release);
    }

    // ---- the client ----

    /// Marks doorbell `index` after the WQE it stands for was published. Returns whether the
    /// daemon said it sleeps, in which case the caller writes the device's eventfd. An index
    /// past the capacity does nothing.
    pub fn ring(&self, index: u32) -> bool {
        if index >= self.capacity {
            return false;
        }
        let w0 = index as usize / 64;
        // Release: whoever takes the bit sees the ring's published WQE.
        let old = self
            .word(OFF_LEVEL0, w0)
            .fetch_or(1 << (index % 64), Ordering::AcqRel);
        if old == 0 {
            let w1 = w0 / 64;
            let old = self
                .word(OFF_LEVEL1, w1)
                .fetch_or(1 << (w0 % 64), Ordering::AcqRel);
            if old == 0 {
                self.word(OFF_LEVEL2, w1 / 64)
                    .fetch_or(1 << (w1 % 64), Ordering::AcqRel);
            }
        }
        // Dekker with `prepare_sleep`: our bit and their flag cannot both be missed.
        fence(Ordering::SeqCst);
        self.sleeping().load(Ordering::Relaxed) != 0
    }

    // ---- the daemon ----

    /// Calls `f` with every marked doorbell, clearing them. Bits that name no doorbell of the
    /// table (written by a client into words it has no business in) are cleared and ignored.
    pub fn take(&self, mut f: impl FnMut(u32)) {
        let (n0, n1, n2) = self.words();
        for w2 in 0..n2 {
            let top = self.word(OFF_LEVEL2, w2);
            if top.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let mut bits2 = top.swap(0, Ordering::AcqRel);
            while bits2 != 0 {
                let w1 = w2 * 64 + bits2.trailing_zeros() as usize;
                bits2 &= bits2 - 1;
                if w1 >= n1 {
                    continue;
                }
                let mut bits1 = self.word(OFF_LEVEL1, w1).swap(0, Ordering::AcqRel);
                while bits1 != 0 {
                    let w0 = w1 * 64 + bits1.trailing_zeros() as usize;
                    bits1 &= bits1 - 1;
                    if w0 >= n0 {
                        continue;
                    }
                    let mut bits0 = self.word(OFF_LEVEL0, w0).swap(0, Ordering::AcqRel);
                    while bits0 != 0 {
                        f((w0 * 64) as u32 + bits0.trailing_zeros());
                        bits0 &= bits0 - 1;
                    }
                }
            }
        }
    }

    /// Whether any doorbell may be marked (a top-level word is not empty).
    pub fn any(&self) -> bool {
        let (_, _, n2) = self.words();
        (0..n2).any(|w| self.word(OFF_LEVEL2, w).load(Ordering::Acquire) != 0)
    }

    /// Announces that the daemon is about to sleep. Returns `true` if a doorbell was marked
    /// meanwhile, in which case the caller must not sleep (and the flag is cleared again).
    pub fn prepare_sleep(&self) -> bool {
        self.sleeping().store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if self.any() {
            self.awake();
            return true;
        }
        false
    }

    /// Clears the sleeping flag after a wake-up.
    pub fn awake(&self) {
        self.sleeping().store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Zeroed, 64-byte aligned memory standing in for the memfd.
    #[repr(align(64))]
    #[derive(Clone, Copy)]
    #[allow(dead_code)] // only its size and alignment matter
    struct Line([u8; 64]);
    fn mem(capacity: u32) -> Vec<Line> {
        vec![Line([0; 64]); table_len(capacity).div_ceil(64)]
    }

    /// The daemon's and the client's handles on a fresh table of `capacity` in `m`
    /// (`mem(capacity)`, which outlives both).
    fn both_ends(m: &mut [Line], capacity: u32) -> (Doorbells, Doorbells) {
        let p = m.as_mut_ptr().cast::<u8>();
        // SAFETY: `m` is zeroed, 64-byte aligned, table_len(capacity) bytes long and outlives
        // the handles (the tests keep it until their end).
        let daemon = unsafe { Doorbells::init(p, capacity) };
        // SAFETY: as above; the daemon's end has just initialised the header.
        let client = unsafe { Doorbells::attach(p, m.len() * 64) }.unwrap();
        (daemon, client)
    }

    fn taken(d: &Doorbells) -> BTreeSet<u32> {
        let mut out = BTreeSet::new();
        d.take(|i| {
            out.insert(i);
        });
        out
    }

    #[test]
    fn the_port_word_says_nothing_until_written_then_the_last_state() {
        let mut m = mem(64);
        let (daemon, client) = both_ends(&mut m, 64);
        assert_eq!(client.port(), None);
        let up = PortState {
            active: true,
            active_mtu: 5,
            gid_generation: 0,
        };
        daemon.set_port(up);
        assert_eq!(client.port(), Some(up));
        let down = PortState {
            active: false,
            active_mtu: 3,
            gid_generation: 0x7fff,
        };
        daemon.set_port(down);
        assert_eq!(client.port(), Some(down));
        // Ringing doorbells leaves it alone.
        client.ring(63);
        assert_eq!(client.port(), Some(down));
        // The generation wraps within its bits, leaving the others alone.
        daemon.set_port(PortState {
            gid_generation: 0x8001,
            ..up
        });
        assert_eq!(
            client.port(),
            Some(PortState {
                gid_generation: 1,
                ..up
            })
        );
    }

    #[test]
    fn marked_doorbells_are_taken_once_across_every_level() {
        let mut m = mem(MAX_DOORBELLS);
        let (daemon, client) = both_ends(&mut m, MAX_DOORBELLS);
        assert!(taken(&daemon).is_empty());
        let marks = [
            0,
            1,
            63,
            64,
            4095,
            4096,
            262_143,
            262_144,
            MAX_DOORBELLS - 1,
        ];
        for i in marks {
            assert!(!client.ring(i), "the daemon is awake");
        }
        assert!(!client.ring(MAX_DOORBELLS), "past the capacity: nothing");
        assert!(daemon.any());
        assert_eq!(taken(&daemon), marks.into_iter().collect());
        assert!(!daemon.any());
        assert!(taken(&daemon).is_empty());
        // A bit set again after its word was taken is found again.
        client.ring(4096);
        client.ring(4097);
        assert_eq!(taken(&daemon), BTreeSet::from([4096, 4097]));
    }

    #[test]
    fn a_sleeping_daemon_is_woken_exactly_when_needed() {
        let mut m = mem(128);
        let (daemon, client) = both_ends(&mut m, 128);
        client.ring(5);
        assert!(daemon.prepare_sleep(), "work pending: do not sleep");
        assert_eq!(taken(&daemon), BTreeSet::from([5]));
        assert!(!daemon.prepare_sleep());
        assert!(client.ring(7), "asleep: ring the eventfd");
        daemon.awake();
        assert!(!client.ring(8));
    }

    #[test]
    fn scribbled_words_name_nothing_and_a_bad_header_is_refused() {
        let mut m = mem(128);
        let p = m.as_mut_ptr().cast::<u8>();
        let daemon = unsafe { Doorbells::init(p, 128) };
        // A hostile client sets every bit of every level word it can reach.
        for w in 0..4 {
            unsafe { (p.add(OFF_LEVEL2 + 8 * w) as *mut u64).write(u64::MAX) };
        }
        for w in 0..256 {
            unsafe { (p.add(OFF_LEVEL1 + 8 * w) as *mut u64).write(u64::MAX) };
        }
        for w in 0..2 {
            unsafe { (p.add(OFF_LEVEL0 + 8 * w) as *mut u64).write(u64::MAX) };
        }
        let got = taken(&daemon);
        assert_eq!(got, (0..128).collect(), "only the table's own doorbells");
        // The capacity written in the header is the client's to scribble on, never read back.
        unsafe { (p.add(OFF_CAPACITY) as *mut u32).write(u32::MAX) };
        assert!(taken(&daemon).is_empty());
        assert!(unsafe { Doorbells::attach(p, m.len() * 64) }.is_err());
    }

    #[test]
    fn two_threads_never_lose_a_doorbell() {
        // Miri interprets every atomic: a smaller table and fewer rounds still cross every
        // level word from two threads, in a minute instead of half an hour.
        let (capacity, rounds) = if cfg!(miri) {
            (320u32, 3u32)
        } else {
            (4096, 200)
        };
        /// The shared memory's address, handed to the other thread with its provenance
        /// (a `usize` would lose it, and Miri rightly warns about the cast back).
        struct Shared(*mut u8);
        // SAFETY: the memory outlives both threads (`m` is dropped after the join) and every
        // access to it goes through the doorbells' atomics.
        unsafe impl Send for Shared {}
        let mut m = mem(capacity);
        let len = m.len() * 64;
        let shared = Shared(m.as_mut_ptr().cast::<u8>());
        let daemon = unsafe { Doorbells::init(shared.0, capacity) };
        let posted: Vec<AtomicU32> = (0..capacity).map(|_| AtomicU32::new(0)).collect();
        let posted = std::sync::Arc::new(posted);
        let producer = {
            let posted = std::sync::Arc::clone(&posted);
            std::thread::spawn(move || {
                let shared = shared;
                let client = unsafe { Doorbells::attach(shared.0, len) }.unwrap();
                for round in 0..rounds {
                    for i in (round % 7..capacity).step_by(7) {
                        posted[i as usize].fetch_add(1, Ordering::Release);
                        client.ring(i);
                    }
                }
            })
        };
        // Every count the producer made is seen through a doorbell taken after it.
        let mut seen = vec![0u32; capacity as usize];
        let mut done = false;
        while !done {
            done = producer.is_finished();
            daemon.take(|i| seen[i as usize] = posted[i as usize].load(Ordering::Acquire));
        }
        producer.join().unwrap();
        daemon.take(|i| seen[i as usize] = posted[i as usize].load(Ordering::Acquire));
        for (i, s) in seen.iter().enumerate() {
            assert_eq!(*s, posted[i].load(Ordering::Relaxed), "doorbell {i}");
        }
    }
}
