//! The two memories a direction's engines reach: this process's own (the requester's
//! buffers), and the peer process's (the responder's), through `process_vm_readv`/`writev`.
//!
//! Both engines check keys, access flags and bounds against the registered regions before
//! they call these, as the daemon's engines do; what is left here is the copy.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use procmem::peer::ClientProcess;
use procmem::{ProcessMemory, LIVENESS_TTL};
use proto::transport::{MemoryAccess, MemoryError};

/// This process's own registered memory, reached directly.
///
/// The addresses are those of regions this process registered (the engine found them inside
/// one), so they are mapped unless the application unmapped memory it had registered, which
/// is its own undefined behaviour (rxe would keep writing the pinned pages; here the copy
/// faults in the application, as its own `memcpy` into that memory would).
///
/// It leaves payloads in place ([`MemoryAccess::leave_in_place`]): the requester's packets
/// go only to the peer's responder in the same thread ([`super::direction`]), which takes
/// the bytes from here ([`PeerMemory::in_place`]) instead of from the packet.
#[derive(Debug, Default)]
pub struct LocalMemory {
    /// The payload the packet just built left out (address, length).
    lent: Cell<Option<(u64, usize)>>,
}

impl LocalMemory {
    /// The payload the packet just built left out (address, length), once.
    pub fn take_lent(&self) -> Option<(u64, usize)> {
        self.lent.take()
    }

    fn bytes(addr: u64, len: usize) -> Option<&'static [u8]> {
        if addr == 0 || addr.checked_add(len as u64).is_none() {
            return None;
        }
        // SAFETY: `[addr, addr + len)` lies in a region this process registered and has not
        // deregistered (checked by the engine's L_Key/R_Key checks against the regions the
        // daemon published); see the type's documentation for a region unmapped meanwhile.
        Some(unsafe { std::slice::from_raw_parts(addr as *const u8, len) })
    }

    #[allow(clippy::mut_from_ref)]
    fn bytes_mut(addr: u64, len: usize) -> Option<&'static mut [u8]> {
        if addr == 0 || addr.checked_add(len as u64).is_none() {
            return None;
        }
        // SAFETY: as `bytes`; the region has local write access (checked by the engine), and
        // the slice does not outlive the engine call that asked for it.
        Some(unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) })
    }
}

impl MemoryAccess for LocalMemory {
    fn read(&self, _space: u64, addr: u64, out: &mut [u8]) -> Result<(), MemoryError> {
        let src = LocalMemory::bytes(addr, out.len()).ok_or(MemoryError {
            addr,
            len: out.len(),
        })?;
        out.copy_from_slice(src);
        Ok(())
    }

    fn write(&mut self, _space: u64, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        let dst = LocalMemory::bytes_mut(addr, data.len()).ok_or(MemoryError {
            addr,
            len: data.len(),
        })?;
        dst.copy_from_slice(data);
        Ok(())
    }

    fn lend(&self, _space: u64, addr: u64, len: usize) -> Option<&[u8]> {
        LocalMemory::bytes(addr, len)
    }

    /// From [`IN_PLACE_MIN`] bytes on: a smaller payload costs less to copy than a piece
    /// of its own in the `process_vm_writev` (held copies of neighbouring small writes merge).
    fn leave_in_place(&self, addr: u64, len: usize) -> bool {
        let yes = len >= IN_PLACE_MIN;
        if yes {
            self.lent.set(Some((addr, len)));
        }
        yes
    }

    fn lend_mut(&mut self, _space: u64, addr: u64, len: usize) -> Option<&mut [u8]> {
        LocalMemory::bytes_mut(addr, len)
    }

    fn compare_swap(
        &mut self,
        _space: u64,
        addr: u64,
        compare: u64,
        swap: u64,
    ) -> Result<u64, MemoryError> {
        let word = LocalMemory::word(addr)?;
        Ok(match word.compare_exchange(compare, swap, SEQ, SEQ) {
            Ok(v) | Err(v) => v,
        })
    }

    fn fetch_add(&mut self, _space: u64, addr: u64, add: u64) -> Result<u64, MemoryError> {
        Ok(LocalMemory::word(addr)?.fetch_add(add, SEQ))
    }
}

const SEQ: std::sync::atomic::Ordering = std::sync::atomic::Ordering::SeqCst;

impl LocalMemory {
    /// The 8-byte aligned word at `addr` (the engine checked the alignment of atomics).
    fn word(addr: u64) -> Result<&'static std::sync::atomic::AtomicU64, MemoryError> {
        if addr == 0 || !addr.is_multiple_of(8) {
            return Err(MemoryError { addr, len: 8 });
        }
        // SAFETY: an aligned word inside a registered region with atomic access (checked by
        // the engine); the application's own threads may touch it concurrently, which is why
        // this is a real atomic.
        Ok(unsafe { &*(addr as *const std::sync::atomic::AtomicU64) })
    }
}

/// Payloads from this long on stay in the sender's buffer until they are written into the
/// peer ([`LocalMemory::leave_in_place`]).
pub const IN_PLACE_MIN: usize = 1024;

/// Receive-buffer writes up to this long travel with their completion instead of by a system
/// call (see [`PeerMemory::write_for_completion`]); a completion slot holds about this much.
pub const CARRIED_MAX: usize = 176;

/// One receive-buffer write, in the order the engine made them.
#[derive(Debug, Clone, Copy)]
pub enum Placed {
    /// Held back: where they go, and where the bytes are in [`PeerMemory::arena`].
    Carried { addr: u64, at: usize, len: usize },
    /// Written into the peer (deferred with the other writes) already.
    Written(usize),
}

impl Placed {
    /// Bytes it placed.
    pub fn bytes(&self) -> usize {
        match self {
            Placed::Carried { len, .. } => *len,
            Placed::Written(n) => *n,
        }
    }
}

/// From how many held bytes the peer's memory is written by the copier thread while the
/// engines go on (`procmem::ProcessMemory::copy_ahead`; `SOFTROCE_COPY_AHEAD=0` turns it off,
/// another number of bytes replaces the default).
fn copy_ahead_from() -> Option<usize> {
    static FROM: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *FROM.get_or_init(|| match std::env::var("SOFTROCE_COPY_AHEAD") {
        Ok(v) => v.parse().ok().filter(|&n| n > 0),
        Err(_) => Some(COPY_AHEAD_FROM),
    })
}

/// The default of [`copy_ahead_from`].
const COPY_AHEAD_FROM: usize = 128 * 1024;

/// Where the payload of the packet being handled really is: the packet's payload bytes (at
/// `frame_at`, `len` long, in the direction's frame) were left out, and are at `local` in
/// this process (the sender's registered buffer, [`LocalMemory`]).
#[derive(Debug, Clone, Copy)]
pub struct InPlace {
    pub frame_at: usize,
    pub len: usize,
    pub local: u64,
}

/// The peer process's memory: [`ProcessMemory`] (large, aligned, deferred calls, as the
/// daemon uses it), plus the small receive-buffer writes held back to travel with their
/// completions ([`proto::ring::fast::FastCqe`]).
#[derive(Debug)]
pub struct PeerMemory {
    process: RefCell<ProcessMemory>,
    /// The payload of the packet the responder handles now, when it was left in place.
    pub in_place: Option<InPlace>,
    /// Every receive-buffer write since the completions were last forwarded: a receive
    /// completion of `byte_len` bytes owns the first ones that add up to it.
    pub placed: std::collections::VecDeque<Placed>,
    /// The held-back bytes (emptied when the completions are forwarded).
    pub arena: Vec<u8>,
}

/// The peer process `pid`, pinned once for every direction that writes into it: its
/// liveness is then probed once per [`LIVENESS_TTL`] for all of them (`ib_write_bw -q 16` has
/// sixteen directions into one peer, each of which probed on its own: 16,000 reads of
/// `/proc/PID/mem` a second). A pinned process found gone (it exited, or exec'd, and the pid
/// may name another process now) is pinned afresh. None: the process does not exist.
fn peer_process(pid: i32) -> Option<Arc<ClientProcess>> {
    static PEERS: Mutex<Option<HashMap<i32, Weak<ClientProcess>>>> = Mutex::new(None);
    let mut peers = PEERS.lock().unwrap_or_else(|e| e.into_inner());
    let peers = peers.get_or_insert_with(HashMap::new);
    if let Some(p) = peers.get(&pid).and_then(Weak::upgrade) {
        if p.alive_within(Instant::now(), LIVENESS_TTL) {
            return Some(p);
        }
    }
    peers.retain(|_, p| p.strong_count() > 0);
    let p = Arc::new(ClientProcess::open(pid).ok()?);
    peers.insert(pid, Arc::downgrade(&p));
    Some(p)
}

impl PeerMemory {
    pub fn new(pid: i32) -> PeerMemory {
        let mut process = match peer_process(pid) {
            Some(p) => ProcessMemory::of(p),
            None => ProcessMemory::new(pid),
        };
        if let Some(from) = copy_ahead_from() {
            process.copy_ahead(from);
        }
        PeerMemory {
            process: RefCell::new(process),
            in_place: None,
            placed: Default::default(),
            arena: Vec::new(),
        }
    }

    /// Writes everything held for writing into the peer (before any completion is
    /// published, so that nobody learns of data that is not in place).
    pub fn flush(&mut self) {
        let _ = self.process.get_mut().flush();
    }

    /// Writes carried bytes the normal way (they did not fit their completion).
    pub fn write_now(&mut self, addr: u64, data: &[u8]) {
        let _ = self.process.get_mut().write(addr, data);
    }

    /// Whether the writes of the packet handled next may be written by the copier thread
    /// (see [`copy_ahead_from`]).
    pub fn allow_copy_ahead(&mut self, yes: bool) {
        self.process.get_mut().allow_copy_ahead(yes);
    }

    /// Hands the held writes to the copier now, where allowed ([`ProcessMemory::hand_off`]).
    pub fn hand_off(&mut self) {
        self.process.get_mut().hand_off();
    }

    pub fn begin_pass(&mut self) {
        self.process.get_mut().begin_pass();
    }

    pub fn end_pass(&mut self) {
        self.process.get_mut().end_pass();
    }

    /// Where the bytes of `data`, a slice of the packet being handled, really are, when
    /// that packet's payload was left in place and `data` lies in it.
    fn source_of(&self, data: &[u8]) -> Option<u64> {
        let w = self.in_place?;
        let at = data.as_ptr() as usize;
        let off = at.checked_sub(w.frame_at)?;
        (off + data.len() <= w.len).then_some(w.local + off as u64)
    }
}

impl MemoryAccess for PeerMemory {
    fn read(&self, _space: u64, addr: u64, out: &mut [u8]) -> Result<(), MemoryError> {
        let len = out.len();
        self.process
            .borrow_mut()
            .read(addr, out)
            .map_err(|_| MemoryError { addr, len })
    }

    fn write(&mut self, _space: u64, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        let err = |_| MemoryError {
            addr,
            len: data.len(),
        };
        if let Some(local) = self.source_of(data) {
            // SAFETY: `[local, local + len)` is the sender's registered buffer, which the
            // requester's engine lent for this packet (its key, bounds and access checked).
            // The flush comes in the same `DirectionRt::close`, before any completion leaves
            // it, the sender's included, and a sender may not change a buffer before its
            // work request completes (IBTA §10.8.3.1).
            return unsafe {
                self.process
                    .get_mut()
                    .write_in_place(addr, local as usize, data.len())
            }
            .map_err(err);
        }
        self.process.get_mut().write(addr, data).map_err(err)
    }

    /// A receive buffer's bytes are defined only at the receive's completion: small writes
    /// are kept to travel with it, and the peer copies them into its buffer when it polls
    /// that completion (no system call into the peer for a small SEND).
    fn write_for_completion(
        &mut self,
        space: u64,
        addr: u64,
        data: &[u8],
    ) -> Result<(), MemoryError> {
        if data.len() <= CARRIED_MAX {
            let at = self.arena.len();
            let bytes = match self.source_of(data) {
                Some(local) => LocalMemory::bytes(local, data.len()).ok_or(MemoryError {
                    addr,
                    len: data.len(),
                })?,
                None => data,
            };
            self.arena.extend_from_slice(bytes);
            self.placed.push_back(Placed::Carried {
                addr,
                at,
                len: data.len(),
            });
            return Ok(());
        }
        self.write(space, addr, data)?;
        self.placed.push_back(Placed::Written(data.len()));
        Ok(())
    }
}
