//! Reaching registered memory inside another process (the daemon's clients; for the shim's
//! same-host fast path, the peer process) without changing their address space:
//! `process_vm_readv` and `process_vm_writev` (verbs-abi.md §5). Remapping pages onto shared
//! memory would be faster but loses concurrent writes, breaks fork and file-backed mappings, so
//! it is not done.
//!
//! One trap decides the shape of this module: glibc's memcpy, and the kernel's copy inside
//! process_vm_*, run 4-20x slower when the destination sits 1-63 bytes ahead of the source
//! modulo 64. So data is staged in a bounce buffer placed at the same offset modulo 64 as the
//! remote address, which makes the cross-process copy run at full speed.
//!
//! The second decides the rest: a `process_vm_readv`/`writev` call costs ~1-2 µs of fixed
//! work (finding and pinning the pages, the syscall itself) whatever its size, which was 63%
//! of the daemon's time when every 4 KiB packet made its own. So bulk data moves in large
//! calls:
//! - reads of [`BULK`] bytes or more fill a *read-ahead window* of up to [`READ_AHEAD`] bytes
//!   in one call, and later reads inside the window are served from it. The window holds a
//!   snapshot, so the daemon opens it only for one transmit pass ([`ProcessMemory::end_pass`]):
//!   every work request served in that pass was posted before it began, and its buffer must
//!   not change until its completion (IBTA §10.8.3.1, the consumer owns it again only then);
//! - writes are *deferred*: up to [`WRITE_BEHIND`] bytes in up to [`MAX_WRITE_PIECES`]
//!   pieces (contiguous writes merge into one piece) go to the process in one
//!   `process_vm_writev` with a remote iovec per piece, by [`ProcessMemory::flush`], which the
//!   daemon calls before it sends anything or delivers a completion (so nobody can learn that
//!   data arrived before it is in place); a read of pending bytes flushes first. A deferred
//!   write that fails (the client unmapped memory it had registered) is counted and dropped:
//!   rxe pins registered pages, so there too such a write succeeds, into pages the process
//!   no longer sees;
//! - a holder that goes on making writes while earlier ones could be written (the shim's
//!   fast path) hands held writes to the process's *copier* thread
//!   ([`ProcessMemory::copy_ahead`], module `copier`), which writes them in order on
//!   another CPU; the flush waits for them.
//!
//! The pid is only used while the process that connected still owns it: every call through
//! it is preceded, at most [`LIVENESS_TTL`] earlier (so at most a thousand checks a second
//! per process, however busy the data path and however many memories of the process are in
//! use: the last check is the [`ClientProcess`]'s), by a check that the process's address space is still the one
//! it connected with ([`ClientProcess::address_space_alive`], which
//! is false after exit and after exec). Once that fails the memory is gone for good and the
//! pid is never used again, so a pid the kernel recycles for another process is never read or
//! written. (Recycling a pid takes the process's exit, its reaping and a walk of the kernel's
//! whole pid space, which no process completes in a millisecond.)

use std::cell::Cell;
use std::io::{IoSlice, IoSliceMut};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::uio::{process_vm_readv, process_vm_writev, RemoteIoVec};
use nix::unistd::Pid;

mod copier;
pub mod peer;

use crate::copier::{Copier, Job};
use crate::peer::ClientProcess;

/// How long a liveness check of the client's address space vouches for its pid.
pub const LIVENESS_TTL: Duration = Duration::from_millis(1);

/// The largest range, in pages, that `check_mapped` probes directly.
const PROBE_PAGES: usize = 64;

/// Why client memory could not be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    #[error("{len} bytes at {addr:#x} are not mapped in process {pid}")]
    Unmapped { pid: i32, addr: u64, len: usize },
    #[error("process {pid} is gone")]
    Gone { pid: i32 },
    #[error("not permitted to reach process {pid}'s memory (same user or CAP_SYS_PTRACE needed)")]
    Denied { pid: i32 },
}

/// Accesses at least this long take the bulk paths (read-ahead, coalesced writes); shorter
/// ones (atomics, small messages) go straight to the process.
pub const BULK: usize = 512;
/// Longest read-ahead window.
pub const READ_AHEAD: usize = 64 * 1024;
/// Most bytes held for deferred writing.
pub const WRITE_BEHIND: usize = 256 * 1024;
/// Most pieces of a deferred write (the kernel's IOV_MAX is 1024).
pub const MAX_WRITE_PIECES: usize = 256;
/// Pages kept for small reads during a pass (a small message's buffer, read again by every
/// work request that reuses it).
const SMALL_READ_PAGES: usize = 32;
/// Read-ahead is split into page-sized remote pieces: the kernel transfers whole iovec
/// elements only, so an unmapped page past the requested bytes ends the window there
/// instead of failing the read.
const PAGE: usize = 4096;

/// A 64-byte aligned scratch buffer that can present a window at any offset modulo 64.
#[derive(Debug, Default)]
pub struct Bounce {
    buf: Vec<u8>,
}

impl Bounce {
    /// A `len`-byte window whose address is congruent to `remote` modulo 64.
    fn window(&mut self, remote: u64, len: usize) -> &mut [u8] {
        let skew = self.skew(remote, len);
        &mut self.buf[skew..skew + len]
    }

    /// Makes room for a `len`-byte window for `remote` and returns where it starts.
    fn skew(&mut self, remote: u64, len: usize) -> usize {
        let need = len + 128;
        if self.buf.len() < need {
            self.buf.resize(need.next_power_of_two(), 0);
        }
        let base = self.buf.as_ptr() as usize;
        ((remote as usize).wrapping_sub(base)) & 63
    }
}

/// Bytes of the client at `addr` held locally: the read-ahead window or a pending write.
#[derive(Debug, Default)]
struct Span {
    addr: u64,
    len: usize,
    /// Where the bytes start in the span's bounce buffer (congruent to `addr` modulo 64).
    skew: usize,
    bounce: Bounce,
}

impl Span {
    fn contains(&self, addr: u64, len: usize) -> bool {
        self.len > 0
            && addr >= self.addr
            && addr
                .checked_add(len as u64)
                .is_some_and(|end| end <= self.addr + self.len as u64)
    }

    fn overlaps(&self, addr: u64, len: usize) -> bool {
        self.len > 0
            && addr < self.addr + self.len as u64
            && addr.saturating_add(len as u64) > self.addr
    }

    /// The bytes held.
    fn bytes(&self) -> &[u8] {
        &self.bounce.buf[self.skew..self.skew + self.len]
    }
}

/// Whole pages read for small reads during one pass.
#[derive(Debug, Default)]
struct PageCache {
    /// Page addresses held, and their bytes at the same index of `data` (4 KiB each).
    pages: Vec<u64>,
    data: Vec<u8>,
    next: usize,
}

impl PageCache {
    fn find(&self, page: u64) -> Option<usize> {
        self.pages.iter().position(|&p| p == page)
    }

    fn bytes(&self, slot: usize) -> &[u8] {
        &self.data[slot * PAGE..(slot + 1) * PAGE]
    }

    /// A slot for `page`, replacing the oldest when all are taken; its bytes are unset.
    fn slot_for(&mut self, page: u64) -> usize {
        if self.data.is_empty() {
            self.data = vec![0u8; SMALL_READ_PAGES * PAGE];
        }
        if self.pages.len() < SMALL_READ_PAGES {
            self.pages.push(page);
            return self.pages.len() - 1;
        }
        let slot = self.next;
        self.next = (self.next + 1) % SMALL_READ_PAGES;
        self.pages[slot] = page;
        slot
    }

    fn forget_overlapping(&mut self, addr: u64, len: usize) {
        let end = addr.saturating_add(len as u64);
        for p in &mut self.pages {
            if *p < end && addr < *p + PAGE as u64 {
                *p = u64::MAX; // never a page address
            }
        }
    }

    fn clear(&mut self) {
        self.pages.clear();
        self.next = 0;
    }
}

/// Where the bytes of a held write are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// Copied into [`WriteBehind::buf`], at this offset.
    Held(usize),
    /// Still where they were in this process, at this address
    /// ([`ProcessMemory::write_in_place`]).
    InPlace(usize),
}

/// One held write: its bytes, the remote address and the length.
#[derive(Debug, Clone, Copy)]
struct Piece {
    src: Source,
    addr: u64,
    len: usize,
}

/// Writes held for one `process_vm_writev`: the bytes in `buf`, each piece placed at the
/// same offset modulo 64 as its remote address (the copy runs at full speed only then), or
/// left where they are in this process.
#[derive(Debug, Default)]
pub(crate) struct WriteBehind {
    buf: Vec<u8>,
    /// Where [`WriteBehind::compact`] rebuilds `buf` (then the two swap).
    spare: Vec<u8>,
    used: usize,
    pieces: Vec<Piece>,
    /// Bytes held in `buf`.
    bytes: usize,
    /// Bytes held either way (in `buf` and in place).
    queued: usize,
    /// The lowest and highest remote address held, for a quick overlap test.
    lo: u64,
    hi: u64,
}

impl WriteBehind {
    fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    fn overlaps(&self, addr: u64, len: usize) -> bool {
        let end = addr.saturating_add(len as u64);
        !self.is_empty()
            && addr < self.hi
            && end > self.lo
            && self
                .pieces
                .iter()
                .any(|p| addr < p.addr + p.len as u64 && end > p.addr)
    }

    /// Whether `len` more bytes (possibly in a new piece) fit.
    fn fits(&self, len: usize) -> bool {
        self.bytes + len <= WRITE_BEHIND && self.pieces.len() < MAX_WRITE_PIECES
    }

    fn push(&mut self, addr: u64, data: &[u8]) {
        if self.buf.is_empty() {
            // Room for every byte plus the alignment padding of every piece; never grows
            // again, so the offsets stay valid.
            self.buf = vec![0u8; WRITE_BEHIND + 64 * (MAX_WRITE_PIECES + 1)];
        }
        let len = data.len();
        // The same bytes written again (a small message to one buffer, over and over): the
        // newest data replaces the held piece, unless a piece after it overlaps.
        let end = addr + len as u64;
        for p in self.pieces.iter().rev().take(16) {
            if let (Source::Held(at), true) = (p.src, p.addr == addr && p.len == len) {
                self.buf[at..at + len].copy_from_slice(data);
                return;
            }
            if p.addr < end && addr < p.addr + p.len as u64 {
                break;
            }
        }
        match self.pieces.last_mut() {
            Some(p) if matches!(p.src, Source::Held(_)) && p.addr + p.len as u64 == addr => {
                p.len += len
            }
            _ => {
                let base = self.buf.as_ptr() as usize;
                self.used += (addr as usize).wrapping_sub(base + self.used) & 63;
                self.pieces.push(Piece {
                    src: Source::Held(self.used),
                    addr,
                    len,
                });
            }
        }
        self.buf[self.used..self.used + len].copy_from_slice(data);
        self.used += len;
        self.bytes += len;
        self.queued += len;
        self.bound(addr, len);
    }

    /// Holds a write of the `len` bytes at `local` in this process, left where they are.
    fn push_in_place(&mut self, addr: u64, local: usize, len: usize) {
        match self.pieces.last_mut() {
            Some(Piece {
                src: Source::InPlace(at),
                addr: a,
                len: l,
            }) if *a + *l as u64 == addr && at.wrapping_add(*l) == local => *l += len,
            _ => self.pieces.push(Piece {
                src: Source::InPlace(local),
                addr,
                len,
            }),
        }
        self.queued += len;
        self.bound(addr, len);
    }

    /// Widens the range of remote addresses held for a write of `len` bytes at `addr`
    /// (just added to the pieces).
    fn bound(&mut self, addr: u64, len: usize) {
        let end = addr + len as u64;
        if self.pieces.len() == 1 && self.pieces[0].len == len {
            (self.lo, self.hi) = (addr, end);
        } else {
            self.lo = self.lo.min(addr);
            self.hi = self.hi.max(end);
        }
    }

    fn clear(&mut self) {
        self.pieces.clear();
        self.used = 0;
        self.bytes = 0;
        self.queued = 0;
    }

    /// Merges pieces that are adjacent in the client (small messages of several QPs, each
    /// stream contiguous, arrive interleaved): the kernel pins the pages of every remote
    /// iovec separately, so fewer, longer pieces cost less. Only when no two pieces overlap,
    /// so the order of the writes does not matter.
    fn compact(&mut self) {
        let mut order = self.pieces.clone();
        order.sort_unstable_by_key(|p| p.addr);
        if order
            .windows(2)
            .any(|w| w[0].addr + w[0].len as u64 > w[1].addr)
        {
            return;
        }
        if self.spare.len() < self.buf.len() {
            self.spare = vec![0u8; self.buf.len()];
        }
        let base = self.spare.as_ptr() as usize;
        let mut used = 0;
        let mut pieces: Vec<Piece> = Vec::with_capacity(order.len());
        for p in order {
            let at = match p.src {
                Source::Held(at) => at,
                Source::InPlace(local) => {
                    match pieces.last_mut() {
                        Some(Piece {
                            src: Source::InPlace(l0),
                            addr: a,
                            len: l,
                        }) if *a + *l as u64 == p.addr && l0.wrapping_add(*l) == local => {
                            *l += p.len
                        }
                        _ => pieces.push(p),
                    }
                    continue;
                }
            };
            match pieces.last_mut() {
                Some(Piece {
                    src: Source::Held(_),
                    addr: a,
                    len: l,
                }) if *a + *l as u64 == p.addr => *l += p.len,
                _ => {
                    used += (p.addr as usize).wrapping_sub(base + used) & 63;
                    pieces.push(Piece {
                        src: Source::Held(used),
                        ..p
                    });
                }
            }
            self.spare[used..used + p.len].copy_from_slice(&self.buf[at..at + p.len]);
            used += p.len;
        }
        std::mem::swap(&mut self.buf, &mut self.spare);
        self.pieces = pieces;
        self.used = used;
    }
}

/// No writer named (see [`ProcessMemory::set_writer`]).
pub const NO_WRITER: u32 = u32::MAX;
/// Most distinct spans of writers remembered between two flushes; past it a failed flush
/// blames every writer since the last one.
const MAX_WRITER_SPANS: usize = 4096;

/// Who the bytes held for writing came for: spans of remote addresses with the writer's tag
/// (the device names the QP whose packet is being placed), so that a deferred write that
/// fails is charged to the QPs whose data it was.
#[derive(Debug, Default)]
struct Writers {
    /// (start, end, tag), in the order written; contiguous writes of one tag merge.
    spans: Vec<(u64, u64, u32)>,
    /// Every tag seen since the last flush.
    tags: Vec<u32>,
    overflow: bool,
    /// Tags whose writes failed, not taken yet.
    failed: Vec<u32>,
}

impl Writers {
    fn record(&mut self, addr: u64, len: usize, tag: u32) {
        if tag == NO_WRITER {
            return;
        }
        let end = addr.saturating_add(len as u64);
        let room = self.spans.len() < MAX_WRITER_SPANS;
        match self.spans.last_mut() {
            Some((_, e, t)) if *t == tag && *e == addr => *e = end,
            _ if room => self.spans.push((addr, end, tag)),
            _ => self.overflow = true,
        }
        if !self.tags.contains(&tag) {
            self.tags.push(tag);
        }
    }

    /// Charges a failed write of `[addr, addr + len)` to its writers.
    fn fail(&mut self, addr: u64, len: usize) {
        let end = addr.saturating_add(len as u64);
        let Writers {
            spans,
            tags,
            overflow,
            failed,
        } = self;
        let blamed: Vec<u32> = if *overflow {
            tags.clone()
        } else {
            spans
                .iter()
                .filter(|&&(a, e, _)| a < end && addr < e)
                .map(|&(_, _, t)| t)
                .collect()
        };
        for t in blamed {
            if !failed.contains(&t) {
                failed.push(t);
            }
        }
    }

    fn fail_all(&mut self) {
        for t in std::mem::take(&mut self.tags) {
            if !self.failed.contains(&t) {
                self.failed.push(t);
            }
        }
    }

    fn clear(&mut self) {
        self.spans.clear();
        self.tags.clear();
        self.overflow = false;
    }
}

/// Counts of the bulk paths (for `res show`-style diagnostics and the tests).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MemoryStats {
    /// process_vm_readv / process_vm_writev calls made.
    pub read_calls: u64,
    pub write_calls: u64,
    /// Reads served from the read-ahead window without a call.
    pub reads_from_window: u64,
    /// Writes appended to a pending coalesced write.
    pub writes_coalesced: u64,
    /// Coalesced writes that failed when flushed (the client unmapped registered memory).
    pub deferred_write_errors: u64,
}

/// One client process's memory.
#[derive(Debug)]
pub struct ProcessMemory {
    pid: Pid,
    /// The process pinned at connect time (`None`: it did not exist).
    process: Option<Arc<ClientProcess>>,
    /// Set once the process is found gone: final.
    gone: Cell<bool>,
    bounce: Bounce,
    window: Span,
    pages: PageCache,
    /// Inside a transmit pass (see [`ProcessMemory::begin_pass`]): snapshots may be used.
    in_pass: bool,
    pending: WriteBehind,
    stats: MemoryStats,
    /// Who the next writes are for ([`ProcessMemory::set_writer`]).
    writer: u32,
    writers: Writers,
    /// Held writes being written by the copier ([`ProcessMemory::copy_ahead`]).
    ahead: Option<Ahead>,
}

/// Most jobs a [`ProcessMemory`] has with the copier at once (each holds up to
/// [`WRITE_BEHIND`] bytes and [`MAX_WRITE_PIECES`] pieces); one more waits for the oldest.
const MAX_IN_FLIGHT: usize = 3;

/// A [`ProcessMemory`]'s share of the copier (see `copier`).
#[derive(Debug)]
struct Ahead {
    copier: &'static Copier,
    /// Held writes go to the copier once this many bytes are held,
    from: usize,
    /// while the holder allows it ([`ProcessMemory::allow_copy_ahead`]).
    allowed: bool,
    reply: std::sync::mpsc::Sender<Job>,
    back: std::sync::mpsc::Receiver<Job>,
    in_flight: usize,
    /// The lowest and highest remote address in flight (for a read's overlap test).
    lo: u64,
    hi: u64,
    /// Emptied write-behind buffers, come back from the copier.
    spares: Vec<WriteBehind>,
    /// The first error of a job that came back before the flush that reports it.
    first_error: Option<AccessError>,
}

impl Ahead {
    /// A job come back from the copier: its outcome counted and blamed (its first error
    /// returned), its buffers kept for the next job.
    fn take_back(
        &mut self,
        mut job: Job,
        stats: &mut MemoryStats,
        writers: &mut Writers,
    ) -> Option<AccessError> {
        self.in_flight -= 1;
        self.spares.push(std::mem::take(&mut job.pending));
        job.outcome.absorb(stats, writers)
    }
}

/// What writing held writes out gave (see [`write_out`]).
#[derive(Debug, Default)]
pub(crate) struct WriteOutcome {
    calls: u64,
    /// Pieces dropped because they could not be written (`deferred_write_errors`).
    dropped: u64,
    /// Remote ranges that were not written, to charge to their writers.
    failed: Vec<(u64, usize)>,
    first_error: Option<AccessError>,
}

impl WriteOutcome {
    /// Nothing of `pending` written: the process is gone.
    pub(crate) fn all_failed(pid: Pid, pending: &WriteBehind) -> WriteOutcome {
        WriteOutcome {
            calls: 0,
            dropped: pending.pieces.len() as u64,
            failed: pending.pieces.iter().map(|p| (p.addr, p.len)).collect(),
            first_error: Some(AccessError::Gone { pid: pid.as_raw() }),
        }
    }

    /// Adds the outcome to the holder's counts and blames; returns its first error.
    fn absorb(self, stats: &mut MemoryStats, writers: &mut Writers) -> Option<AccessError> {
        stats.write_calls += self.calls;
        stats.deferred_write_errors += self.dropped;
        for (addr, len) in self.failed {
            writers.fail(addr, len);
        }
        self.first_error
    }
}

/// Writes `pending` into process `pid`, in one call when nothing fails, and empties it. A
/// piece that cannot be written (the client unmapped memory it had registered) is dropped and
/// reported; the others are written. Run by the holder ([`ProcessMemory::flush`]) or by the
/// copier.
pub(crate) fn write_out(pid: Pid, pending: &mut WriteBehind) -> WriteOutcome {
    let mut out = WriteOutcome::default();
    if pending.pieces.len() > 4 {
        pending.compact();
    }
    let mut from = 0;
    while from < pending.pieces.len() {
        let pieces = &pending.pieces[from..];
        let local: Vec<IoSlice<'_>> = pieces
            .iter()
            .map(|p| match p.src {
                Source::Held(at) => IoSlice::new(&pending.buf[at..at + p.len]),
                // SAFETY: `write_in_place`'s caller keeps these bytes mapped and in place
                // until the holder's next flush returns, which waits for this; only the
                // kernel reads them.
                Source::InPlace(local) => {
                    IoSlice::new(unsafe { std::slice::from_raw_parts(local as *const u8, p.len) })
                }
            })
            .collect();
        let remote: Vec<RemoteIoVec> = pieces
            .iter()
            .map(|p| RemoteIoVec {
                base: p.addr as usize,
                len: p.len,
            })
            .collect();
        let want: usize = pieces.iter().map(|p| p.len).sum();
        out.calls += 1;
        let done = process_vm_writev(pid, &local, &remote);
        let written = match done {
            Ok(n) if n == want => break,
            Ok(n) => n,
            Err(e) => {
                // Nothing was written: the first piece is the bad one.
                let Piece { addr, len, .. } = pieces[0];
                out.first_error
                    .get_or_insert(access_error(pid, e, addr, len));
                if matches!(e, nix::Error::ESRCH | nix::Error::EPERM) {
                    out.failed.extend(pieces.iter().map(|p| (p.addr, p.len)));
                    break;
                }
                0
            }
        };
        // The kernel stops at the first piece it cannot write whole: skip that one.
        let mut skip = 0;
        let mut sum = 0;
        for &Piece { len, .. } in pieces {
            if sum + len > written {
                break;
            }
            sum += len;
            skip += 1;
        }
        let Piece { addr, len, .. } = pieces[skip.min(pieces.len() - 1)];
        out.failed.push((addr, len));
        out.first_error.get_or_insert(AccessError::Unmapped {
            pid: pid.as_raw(),
            addr,
            len,
        });
        out.dropped += 1;
        from += skip + 1;
    }
    pending.clear();
    out
}

fn access_error(pid: Pid, e: nix::Error, addr: u64, len: usize) -> AccessError {
    let pid = pid.as_raw();
    match e {
        nix::Error::ESRCH => AccessError::Gone { pid },
        nix::Error::EPERM => AccessError::Denied { pid },
        _ => AccessError::Unmapped { pid, addr, len },
    }
}

impl Drop for ProcessMemory {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

impl ProcessMemory {
    /// The memory of process `pid` as it is now (pinned by [`ClientProcess::open`]; a
    /// process that does not exist is gone from the start).
    pub fn new(pid: i32) -> ProcessMemory {
        let process = ClientProcess::open(pid).ok().map(Arc::new);
        ProcessMemory::with_process(pid, process)
    }

    /// The memory of a process pinned when it connected.
    pub fn of(process: Arc<ClientProcess>) -> ProcessMemory {
        ProcessMemory::with_process(process.pid(), Some(process))
    }

    fn with_process(pid: i32, process: Option<Arc<ClientProcess>>) -> ProcessMemory {
        ProcessMemory {
            pid: Pid::from_raw(pid),
            gone: Cell::new(process.is_none()),
            process,
            bounce: Bounce::default(),
            window: Span::default(),
            pages: PageCache::default(),
            in_pass: false,
            pending: WriteBehind::default(),
            writer: NO_WRITER,
            writers: Writers::default(),
            stats: MemoryStats::default(),
            ahead: None,
        }
    }

    /// Lets the process's copier (a thread, see `copier`) write held writes while this
    /// holder goes on, once `from` bytes are held; [`ProcessMemory::flush`] waits for them.
    /// For a holder that makes more held writes while earlier ones could be written (the
    /// shim's fast path, which runs the engines on the application's thread). Without a
    /// thread to start it changes nothing.
    pub fn copy_ahead(&mut self, from: usize) {
        let Some(copier) = Copier::get() else {
            return;
        };
        let (reply, back) = std::sync::mpsc::channel();
        self.ahead = Some(Ahead {
            copier,
            from: from.max(1),
            allowed: true,
            reply,
            back,
            in_flight: 0,
            lo: u64::MAX,
            hi: 0,
            spares: Vec::new(),
            first_error: None,
        });
    }

    /// Whether the writes held from now on may go to the copier (with
    /// [`ProcessMemory::copy_ahead`]; until called again). The holder says no for writes
    /// that someone waits for by polling: a third busy thread on two CPUs slows all three.
    pub fn allow_copy_ahead(&mut self, yes: bool) {
        if let Some(a) = self.ahead.as_mut() {
            a.allowed = yes;
        }
    }

    /// Hands every held write to the copier now, however little is held, where the holder
    /// allows it (as [`ProcessMemory::allow_copy_ahead`] said for the last writes): for a
    /// holder with other work to do before it must wait for them, which
    /// [`ProcessMemory::flush`] does. The fast path's close of several directions hands each
    /// one's writes over and flushes them only after it has run the others, so that the
    /// kernel's copies (a page pinned per piece: small writes are mostly that) run on the
    /// other CPU meanwhile.
    pub fn hand_off(&mut self) {
        if self.ahead.as_ref().is_some_and(|a| a.allowed) {
            self.make_room();
        }
    }

    /// Once enough is held, hands it to the copier (with [`ProcessMemory::copy_ahead`]).
    fn maybe_copy_ahead(&mut self) {
        if self
            .ahead
            .as_ref()
            .is_some_and(|a| a.allowed && self.pending.queued >= a.from)
        {
            self.make_room();
        }
    }

    /// Empties the held writes: to the copier if there is one and it is allowed, else
    /// written now.
    fn make_room(&mut self) {
        if !self.ahead.as_ref().is_some_and(|a| a.allowed) || self.reachable().is_err() {
            // (A process found gone: the flush drops and reports what is held.)
            let _ = self.flush();
            return;
        }
        if self.pending.is_empty() {
            return;
        }
        if !self.ahead.as_ref().is_some_and(|a| a.copier.runs_here()) {
            // A forked child: its parent's copier is not here.
            self.ahead = None;
            let _ = self.flush();
            return;
        }
        let ahead = self.ahead.as_mut().expect("checked");
        // Take back what the copier finished meanwhile; wait for the oldest at the limit.
        while ahead.in_flight > 0 {
            let job = if ahead.in_flight >= MAX_IN_FLIGHT {
                copier::recv_spinning(&ahead.back)
            } else {
                ahead.back.try_recv().ok()
            };
            let Some(job) = job else {
                break;
            };
            let error = ahead.take_back(job, &mut self.stats, &mut self.writers);
            ahead.first_error = ahead.first_error.or(error);
        }
        ahead.lo = ahead.lo.min(self.pending.lo);
        ahead.hi = ahead.hi.max(self.pending.hi);
        let spare = ahead.spares.pop().unwrap_or_default();
        let job = Job {
            pid: self.pid,
            process: self.process.clone(),
            pending: std::mem::replace(&mut self.pending, spare),
            outcome: WriteOutcome::default(),
            reply: ahead.reply.clone(),
        };
        match ahead.copier.send(job) {
            Ok(()) => ahead.in_flight += 1,
            Err(pending) => {
                // Never (the copier lives as long as the process): written here instead.
                let spare = std::mem::replace(&mut self.pending, pending);
                self.ahead.as_mut().expect("checked").spares.push(spare);
                let _ = self.flush();
            }
        }
    }

    /// Waits for every job with the copier; returns how many there were and the first error.
    fn join(&mut self) -> (usize, Option<AccessError>) {
        let Some(ahead) = self.ahead.as_mut() else {
            return (0, None);
        };
        if ahead.in_flight > 0 && !ahead.copier.runs_here() {
            // A child forked while its parent's copier had jobs: they are the parent's.
            self.ahead = None;
            return (0, None);
        }
        let mut first_error = ahead.first_error.take();
        let joined = ahead.in_flight;
        while ahead.in_flight > 0 {
            let Some(job) = copier::recv_spinning(&ahead.back) else {
                break;
            };
            let error = ahead.take_back(job, &mut self.stats, &mut self.writers);
            first_error = first_error.or(error);
        }
        (ahead.lo, ahead.hi) = (u64::MAX, 0);
        (joined, first_error)
    }

    /// Whether a held write the copier has not finished may overlap `[addr, addr + len)`.
    fn in_flight_overlaps(&self, addr: u64, len: usize) -> bool {
        self.ahead.as_ref().is_some_and(|a| {
            a.in_flight > 0 && addr < a.hi && addr.saturating_add(len as u64) > a.lo
        })
    }

    pub fn stats(&self) -> MemoryStats {
        self.stats
    }

    /// Whether the pid may be used now: the pinned process's address space was found alive
    /// within [`LIVENESS_TTL`] (checked again when older; a registration always checks).
    /// `Gone` is final.
    fn reachable(&self) -> Result<(), AccessError> {
        self.reachable_within(LIVENESS_TTL)
    }

    /// [`ProcessMemory::reachable`] with a check at most `ttl` old (zero: a fresh one). The
    /// last check is the process's, shared with every other memory of it.
    fn reachable_within(&self, ttl: Duration) -> Result<(), AccessError> {
        if self.gone.get()
            || !self
                .process
                .as_ref()
                .is_some_and(|p| p.alive_within(Instant::now(), ttl))
        {
            self.gone.set(true);
            return Err(AccessError::Gone {
                pid: self.pid.as_raw(),
            });
        }
        Ok(())
    }

    /// What every write does first: a range past the end of the address space is refused
    /// (never mapped; refused here, as `read` refuses it, because the deferred path computes
    /// the range's end, `addr + len`), and what was read of the range is forgotten.
    fn before_write(&mut self, addr: u64, len: usize) -> Result<(), AccessError> {
        if addr.checked_add(len as u64).is_none() {
            return Err(AccessError::Unmapped {
                pid: self.pid.as_raw(),
                addr,
                len,
            });
        }
        if self.window.overlaps(addr, len) {
            self.window.len = 0;
        }
        self.pages.forget_overlapping(addr, len);
        Ok(())
    }

    /// [`ProcessMemory::reachable`] for a write to be held: checked for the first one held
    /// since the last flush; the flush checks again before its call, so the ones after it
    /// need no clock read (one per packet was 5 % of the same-host fast path's time).
    fn reachable_for_held_write(&self) -> Result<(), AccessError> {
        if self.pending.is_empty() {
            return self.reachable();
        }
        if self.gone.get() {
            return Err(AccessError::Gone {
                pid: self.pid.as_raw(),
            });
        }
        Ok(())
    }

    /// Names whom the next writes are for (the device: the QP whose packet it hands to the
    /// engine), until named again; [`NO_WRITER`] for nobody.
    pub fn set_writer(&mut self, tag: u32) {
        self.writer = tag;
    }

    /// The writers (see [`ProcessMemory::set_writer`]) of deferred writes that failed since
    /// the last call: their data never reached the process.
    pub fn take_failed_writers(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.writers.failed)
    }

    /// Whether the process is known to be gone (exited or exec'd since it connected).
    pub fn is_gone(&self) -> bool {
        self.reachable().is_err()
    }

    /// Starts a transmit pass: until [`ProcessMemory::end_pass`], reads may be served from
    /// snapshots taken during the pass (the read-ahead window, whole pages for small reads).
    /// Outside passes every read goes to the process.
    pub fn begin_pass(&mut self) {
        self.end_pass();
        self.in_pass = true;
    }

    /// Ends a transmit pass: the snapshots may be stale from now on.
    pub fn end_pass(&mut self) {
        self.window.len = 0;
        self.pages.clear();
        self.in_pass = false;
    }

    /// A small read inside one page, during a pass: served from that page, read whole once.
    fn read_small(&mut self, addr: u64, out: &mut [u8]) -> bool {
        let page = addr & !(PAGE as u64 - 1);
        // Checked: the address comes from a work request or a packet (false = read it the
        // ordinary way, which reports a bad address).
        let fits = addr
            .checked_add(out.len() as u64)
            .zip(page.checked_add(PAGE as u64))
            .is_some_and(|(end, page_end)| end <= page_end);
        if !fits {
            return false;
        }
        let at = (addr - page) as usize;
        if let Some(slot) = self.pages.find(page) {
            out.copy_from_slice(&self.pages.bytes(slot)[at..at + out.len()]);
            self.stats.reads_from_window += 1;
            return true;
        }
        if self.reachable().is_err() {
            return false;
        }
        let slot = self.pages.slot_for(page);
        let buf = &mut self.pages.data[slot * PAGE..(slot + 1) * PAGE];
        self.stats.read_calls += 1;
        let remote = [RemoteIoVec {
            base: page as usize,
            len: PAGE,
        }];
        if process_vm_readv(self.pid, &mut [IoSliceMut::new(buf)], &remote) == Ok(PAGE) {
            out.copy_from_slice(&buf[at..at + out.len()]);
            true
        } else {
            self.pages.pages[slot] = u64::MAX;
            false
        }
    }

    /// Writes what is held for writing, in one call when nothing fails, after what the
    /// copier has of it ([`ProcessMemory::copy_ahead`]). An error means the client unmapped
    /// memory it had registered; those pieces are dropped (counted in
    /// `deferred_write_errors`), the others are written.
    pub fn flush(&mut self) -> Result<(), AccessError> {
        let (joined, mut first_error) = self.join();
        if self.pending.is_empty() && joined == 0 {
            return Ok(());
        }
        if !self.pending.is_empty() {
            if let Err(gone) = self.reachable() {
                self.stats.deferred_write_errors += self.pending.pieces.len() as u64;
                self.pending.clear();
                self.writers.fail_all();
                self.writers.clear();
                return Err(first_error.unwrap_or(gone));
            }
            let out = write_out(self.pid, &mut self.pending);
            let error = out.absorb(&mut self.stats, &mut self.writers);
            first_error = first_error.or(error);
        }
        self.writers.clear();
        first_error.map_or(Ok(()), Err)
    }

    /// Reads up to [`READ_AHEAD`] bytes from `addr` into the window, in page-sized remote
    /// pieces. Returns whether at least `need` bytes arrived.
    fn fill_window(&mut self, addr: u64, need: usize) -> bool {
        let want = READ_AHEAD.max(need);
        let mut remote: [RemoteIoVec; READ_AHEAD / PAGE + 2] =
            [RemoteIoVec { base: 0, len: 0 }; READ_AHEAD / PAGE + 2];
        // The first piece ends at a page boundary, later ones are whole pages; a read longer
        // than the window is one piece (it must arrive whole anyway).
        let mut pieces = 0;
        let mut at = addr;
        let end = addr.saturating_add(want as u64);
        while at < end && pieces < remote.len() {
            let page_end = (at | (PAGE as u64 - 1)).saturating_add(1);
            let piece_end = if pieces == remote.len() - 1 {
                end
            } else {
                page_end.min(end)
            };
            remote[pieces] = RemoteIoVec {
                base: at as usize,
                len: (piece_end - at) as usize,
            };
            pieces += 1;
            at = piece_end;
        }
        if self.reachable().is_err() {
            self.window.len = 0;
            return false;
        }
        let total = (at - addr) as usize;
        let skew = self.window.bounce.skew(addr, total);
        let window = &mut self.window.bounce.buf[skew..skew + total];
        self.stats.read_calls += 1;
        let got = process_vm_readv(self.pid, &mut [IoSliceMut::new(window)], &remote[..pieces]);
        match got {
            Ok(n) if n >= need => {
                self.window.addr = addr;
                self.window.len = n;
                self.window.skew = skew;
                true
            }
            _ => {
                self.window.len = 0;
                false
            }
        }
    }

    fn error(&self, e: nix::Error, addr: u64, len: usize) -> AccessError {
        access_error(self.pid, e, addr, len)
    }

    /// Makes the `len` bytes at `addr` lie in the read-ahead window, for a caller that copies
    /// them itself ([`ProcessMemory::lent`]): what [`ProcessMemory::read`] does for a read the
    /// window serves (flushing held writes that overlap them first, filling the window when
    /// the read is long enough). False when the window cannot serve them (outside a pass, a
    /// read shorter than [`BULK`] and not in the window, or one the process does not map):
    /// then `read` is the way.
    pub fn lend(&mut self, addr: u64, len: usize) -> bool {
        if !self.in_pass || len == 0 {
            return false;
        }
        if self.pending.overlaps(addr, len) || self.in_flight_overlaps(addr, len) {
            let _ = self.flush();
        }
        if self.window.contains(addr, len) {
            self.stats.reads_from_window += 1;
            return true;
        }
        (BULK..=READ_AHEAD).contains(&len) && self.fill_window(addr, len)
    }

    /// The `len` bytes at `addr` where [`ProcessMemory::lend`] put them, while nothing else
    /// has been read or written since.
    pub fn lent(&self, addr: u64, len: usize) -> Option<&[u8]> {
        if !self.in_pass || !self.window.contains(addr, len) {
            return None;
        }
        let at = (addr - self.window.addr) as usize;
        self.window.bytes().get(at..at + len)
    }

    /// Copies `out.len()` bytes from `addr` in the client into `out`.
    pub fn read(&mut self, addr: u64, out: &mut [u8]) -> Result<(), AccessError> {
        let len = out.len();
        if len == 0 {
            return Ok(());
        }
        // What this process reads must include what the daemon wrote before.
        if self.pending.overlaps(addr, len) || self.in_flight_overlaps(addr, len) {
            let _ = self.flush();
        }
        if self.in_pass && self.window.contains(addr, len) {
            let at = (addr - self.window.addr) as usize;
            out.copy_from_slice(&self.window.bytes()[at..at + len]);
            self.stats.reads_from_window += 1;
            return Ok(());
        }
        if self.in_pass && (BULK..=READ_AHEAD).contains(&len) && self.fill_window(addr, len) {
            out.copy_from_slice(&self.window.bytes()[..len]);
            return Ok(());
        }
        if self.in_pass && len < BULK && self.read_small(addr, out) {
            return Ok(());
        }
        self.reachable()?;
        self.stats.read_calls += 1;
        // Aligned bounce, then a local copy whose source and destination alignment glibc
        // handles well in either order except "dst slightly ahead": use the bounce only when
        // the direct copy would hit that case.
        let direct = ((out.as_ptr() as u64).wrapping_sub(addr) & 63) == 0;
        let remote = [RemoteIoVec {
            base: addr as usize,
            len,
        }];
        let done = if direct {
            process_vm_readv(self.pid, &mut [IoSliceMut::new(out)], &remote)
        } else {
            let window = self.bounce.window(addr, len);
            let r = process_vm_readv(self.pid, &mut [IoSliceMut::new(window)], &remote);
            if r == Ok(len) {
                out.copy_from_slice(window);
            }
            r
        };
        match done {
            Ok(n) if n == len => Ok(()),
            Ok(_) => Err(AccessError::Unmapped {
                pid: self.pid.as_raw(),
                addr,
                len,
            }),
            Err(e) => Err(self.error(e, addr, len)),
        }
    }

    /// Writes the `len` bytes at `local` in this process to `addr` in the client, deferred
    /// as [`ProcessMemory::write`] is, but without copying them first: the one copy is the
    /// kernel's, at the next [`ProcessMemory::flush`]. For a sender's registered buffer,
    /// which the sender may not touch until its work request completes (IBTA §10.8.3.1), so
    /// the bytes are still there when the flush, which comes before any completion, reads
    /// them.
    ///
    /// # Safety
    ///
    /// `[local, local + len)` is memory of this process that stays mapped and unchanged until
    /// the next `flush` (or the drop of this `ProcessMemory`). Only the kernel reads it.
    pub unsafe fn write_in_place(
        &mut self,
        addr: u64,
        local: usize,
        len: usize,
    ) -> Result<(), AccessError> {
        if len == 0 {
            return Ok(());
        }
        self.reachable_for_held_write()?;
        if local.checked_add(len).is_none() {
            return Err(AccessError::Unmapped {
                pid: self.pid.as_raw(),
                addr,
                len,
            });
        }
        self.before_write(addr, len)?;
        // Pieces are written in the order they were held (the kernel walks the iovecs in
        // order), so a piece held here after an overlapping one still lands last.
        if self.pending.pieces.len() >= MAX_WRITE_PIECES {
            self.pending.compact();
        }
        if self.pending.pieces.len() >= MAX_WRITE_PIECES {
            self.make_room();
        }
        if !self.pending.is_empty() {
            self.stats.writes_coalesced += 1;
        }
        self.pending.push_in_place(addr, local, len);
        self.writers.record(addr, len, self.writer);
        self.maybe_copy_ahead();
        Ok(())
    }

    /// Copies `data` to `addr` in the client.
    pub fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), AccessError> {
        let len = data.len();
        if len == 0 {
            return Ok(());
        }
        // Refused now rather than at the flush: a write into a process that is gone must
        // fail where the engine can still answer for it.
        if len <= WRITE_BEHIND {
            self.reachable_for_held_write()?;
        } else {
            self.reachable()?;
        }
        self.before_write(addr, len)?;
        if len <= WRITE_BEHIND {
            if !self.pending.fits(len) {
                self.pending.compact();
            }
            if !self.pending.fits(len) {
                // A failed earlier write is the client's own doing (it unmapped registered
                // memory); it must not fail this one.
                self.make_room();
            }
            if !self.pending.is_empty() {
                self.stats.writes_coalesced += 1;
            }
            self.pending.push(addr, data);
            self.writers.record(addr, len, self.writer);
            self.maybe_copy_ahead();
            return Ok(());
        }
        if !self.pending.is_empty() || self.ahead.as_ref().is_some_and(|a| a.in_flight > 0) {
            let _ = self.flush();
        }
        self.stats.write_calls += 1;
        let remote = [RemoteIoVec {
            base: addr as usize,
            len,
        }];
        let direct = ((addr).wrapping_sub(data.as_ptr() as u64) & 63) == 0;
        let done = if direct {
            process_vm_writev(self.pid, &[IoSlice::new(data)], &remote)
        } else {
            let window = self.bounce.window(addr, len);
            window.copy_from_slice(data);
            process_vm_writev(self.pid, &[IoSlice::new(window)], &remote)
        };
        match done {
            Ok(n) if n == len => Ok(()),
            Ok(_) => Err(AccessError::Unmapped {
                pid: self.pid.as_raw(),
                addr,
                len,
            }),
            Err(e) => Err(self.error(e, addr, len)),
        }
    }

    /// Checks that `[addr, addr + len)` is mapped in the client, as `ibv_reg_mr` must (EFAULT
    /// otherwise). A range of a few pages is probed with one `process_vm_readv` of one byte per
    /// page; a larger one, or one the probe could not read, by reading /proc/PID/maps rather
    /// than touching every page. The probe matters at scale: the maps file grows with every
    /// ring mapping, so reading it for each of 100,000 small MRs of a client that holds
    /// 10,000 QPs made registration quadratic.
    pub fn check_mapped(&self, addr: u64, len: u64) -> Result<(), AccessError> {
        let pid = self.pid.as_raw();
        let unmapped = AccessError::Unmapped {
            pid,
            addr,
            len: len as usize,
        };
        let end = addr.checked_add(len).ok_or(unmapped)?;
        // A registration is rare and decides what the pid may be used for later: always a
        // fresh check.
        self.reachable_within(Duration::ZERO)?;
        if len > 0 && self.probe_pages(addr, end) {
            return Ok(());
        }
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .map_err(|_| AccessError::Gone { pid })?;
        let mut ranges: Vec<(u64, u64)> = maps
            .lines()
            .filter_map(|l| {
                let (range, _) = l.split_once(' ')?;
                let (a, b) = range.split_once('-')?;
                Some((
                    u64::from_str_radix(a, 16).ok()?,
                    u64::from_str_radix(b, 16).ok()?,
                ))
            })
            .collect();
        ranges.sort_unstable();
        let mut covered = addr;
        for (a, b) in ranges {
            if a > covered {
                break;
            }
            if b > covered {
                covered = b;
            }
            if covered >= end {
                return Ok(());
            }
        }
        if len == 0 || covered >= end {
            Ok(())
        } else {
            Err(unmapped)
        }
    }

    /// True if one byte of every page of `[addr, end)` could be read, for ranges of at most
    /// [`PROBE_PAGES`] pages. False says nothing (too large, or some page unreadable: the
    /// maps check decides, so a mapped but unreadable page keeps its old answer).
    fn probe_pages(&self, addr: u64, end: u64) -> bool {
        const PAGE: u64 = 4096;
        let first = addr / PAGE;
        let last = (end - 1) / PAGE;
        let pages = (last - first + 1) as usize;
        if pages > PROBE_PAGES {
            return false;
        }
        let mut remote = [RemoteIoVec { base: 0, len: 1 }; PROBE_PAGES];
        for (i, r) in remote.iter_mut().take(pages).enumerate() {
            r.base = ((first + i as u64) * PAGE).max(addr) as usize;
        }
        let mut sink = [0u8; PROBE_PAGES];
        process_vm_readv(
            self.pid,
            &mut [IoSliceMut::new(&mut sink[..pages])],
            &remote[..pages],
        ) == Ok(pages)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> ProcessMemory {
        ProcessMemory::new(std::process::id() as i32)
    }

    #[test]
    fn reads_and_writes_our_own_memory_at_every_alignment() {
        let mut m = me();
        let src: Vec<u8> = (0..70_000u32).map(|i| (i * 7) as u8).collect();
        let mut dst = vec![0u8; 70_100];
        for skew in [0usize, 1, 13, 31, 63] {
            let len = 65_536;
            m.write(dst[skew..].as_ptr() as u64, &src[..len]).unwrap();
            m.flush().unwrap();
            assert_eq!(&dst[skew..skew + len], &src[..len]);
            let mut back = vec![0u8; len + 3];
            m.read(dst[skew..].as_ptr() as u64, &mut back[3..]).unwrap();
            assert_eq!(&back[3..], &src[..len]);
            dst.fill(0);
        }
    }

    #[test]
    fn memories_of_one_process_share_its_liveness_probe() {
        let process = Arc::new(ClientProcess::open(std::process::id() as i32).unwrap());
        let mut memories: Vec<ProcessMemory> = (0..16)
            .map(|_| ProcessMemory::of(Arc::clone(&process)))
            .collect();
        let src = [7u8; 64];
        let mut dst = [0u8; 64];
        let before = process.probes();
        for m in &mut memories {
            m.write(dst.as_mut_ptr() as u64, &src).unwrap();
            m.flush().unwrap();
        }
        assert_eq!(dst, src);
        // Sixteen memories within a millisecond (or two, on a slow machine): one probe each
        // millisecond, not one per memory.
        assert!(
            process.probes() - before <= 2,
            "{} probes",
            process.probes() - before
        );
    }

    #[test]
    fn unmapped_memory_is_an_error_not_a_crash() {
        let mut m = me();
        let mut out = [0u8; 16];
        assert!(matches!(
            m.read(8, &mut out),
            Err(AccessError::Unmapped { .. })
        ));
        // Writes are deferred: the error shows when they are flushed.
        m.write(8, &out).unwrap();
        assert!(matches!(m.flush(), Err(AccessError::Unmapped { .. })));
        assert!(m.check_mapped(8, 16).is_err());
        let v = vec![0u8; 1 << 20];
        m.check_mapped(v.as_ptr() as u64, v.len() as u64).unwrap();
        assert!(m.check_mapped(u64::MAX - 4, 16).is_err());
        let gone = ProcessMemory::new(i32::MAX - 1);
        assert!(matches!(
            gone.check_mapped(v.as_ptr() as u64, 1),
            Err(AccessError::Gone { .. })
        ));
    }

    /// A copy of this process with pid `pid` (clone3 with `set_tid`: root only). The copy
    /// shares nothing but starts with our memory, so a write meant for the process that had
    /// `pid` before would land in it at the same addresses. It waits to be killed.
    fn clone_with_pid(pid: i32) -> std::io::Result<i32> {
        #[repr(C)]
        struct CloneArgs {
            flags: u64,
            pidfd: u64,
            child_tid: u64,
            parent_tid: u64,
            exit_signal: u64,
            stack: u64,
            stack_size: u64,
            tls: u64,
            set_tid: u64,
            set_tid_size: u64,
            cgroup: u64,
        }
        let tid = [pid as libc::pid_t];
        let args = CloneArgs {
            flags: 0,
            pidfd: 0,
            child_tid: 0,
            parent_tid: 0,
            exit_signal: libc::SIGCHLD as u64,
            stack: 0,
            stack_size: 0,
            tls: 0,
            set_tid: tid.as_ptr() as u64,
            set_tid_size: 1,
            cgroup: 0,
        };
        // SAFETY: clone3 without CLONE_VM makes a copy of this process; the copy only calls
        // pause(2), which is async-signal-safe, until it is killed.
        let r = unsafe {
            libc::syscall(
                libc::SYS_clone3,
                &args as *const CloneArgs,
                std::mem::size_of::<CloneArgs>(),
            )
        };
        match r {
            0 => loop {
                // SAFETY: see above.
                unsafe { libc::pause() };
            },
            r if r > 0 => Ok(r as i32),
            _ => Err(std::io::Error::last_os_error()),
        }
    }

    #[test]
    fn a_recycled_pid_is_never_read_or_written() {
        let victim = vec![0x5au8; 4096];
        let addr = victim.as_ptr() as u64;
        // The client, its memory pinned, exits and is reaped; another process then gets its
        // pid (made so here; the kernel does it by itself once pids wrap).
        /// Kills the copy however the test ends.
        struct Recycled(i32);
        impl Drop for Recycled {
            fn drop(&mut self) {
                let pid = Pid::from_raw(self.0);
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                let _ = nix::sys::wait::waitpid(pid, None);
            }
        }
        let (mut m, recycled) = loop {
            let mut client = std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .unwrap();
            let pid = client.id() as i32;
            let m = ProcessMemory::new(pid);
            client.kill().unwrap();
            client.wait().unwrap();
            match clone_with_pid(pid) {
                Ok(p) => break (m, Recycled(p)),
                // Someone else took the pid meanwhile: try another.
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
                Err(e) => panic!("clone3 with set_tid (this test runs as root): {e}"),
            }
        };
        let gone = |r: Result<(), AccessError>| matches!(r, Err(AccessError::Gone { .. }));
        let calls = (m.stats().read_calls, m.stats().write_calls);
        assert!(gone(m.write(addr, &[1u8; 16])));
        assert!(gone(m.write(addr, &[2u8; 4096])));
        m.flush().unwrap(); // nothing was held
        let mut out = [0u8; 16];
        assert!(gone(m.read(addr, &mut out)));
        m.begin_pass();
        assert!(gone(m.read(addr, &mut out)));
        assert!(gone(m.read(addr, &mut vec![0u8; 4096])));
        m.end_pass();
        assert!(gone(m.check_mapped(addr, 16)));
        assert!(m.is_gone());
        assert_eq!(
            (m.stats().read_calls, m.stats().write_calls),
            calls,
            "no process_vm_* call through the recycled pid"
        );
        // The process now holding the pid still has its copy of the buffer untouched.
        let mut now = ProcessMemory::new(recycled.0);
        let mut seen = vec![0u8; 4096];
        now.read(addr, &mut seen).unwrap();
        assert_eq!(seen, victim);
    }

    #[test]
    fn a_range_past_the_end_of_the_address_space_is_refused() {
        let mut m = me();
        let mut out = [0u8; 16];
        for addr in [u64::MAX - 3, u64::MAX] {
            assert!(matches!(
                m.write(addr, &[7u8; 16]),
                Err(AccessError::Unmapped { .. })
            ));
            assert!(matches!(
                m.read(addr, &mut out),
                Err(AccessError::Unmapped { .. })
            ));
            m.begin_pass();
            assert!(matches!(
                m.read(addr, &mut out),
                Err(AccessError::Unmapped { .. })
            ));
            m.end_pass();
        }
        // Nothing was held for writing.
        m.flush().unwrap();
        assert_eq!(m.stats().deferred_write_errors, 0);
    }

    #[test]
    fn bulk_reads_come_from_one_window_until_the_pass_ends() {
        let mut m = me();
        let mut src: Vec<u8> = (0..200_000u32).map(|i| (i * 3) as u8).collect();
        let base = src.as_ptr() as u64 + 5;
        let mut out = vec![0u8; 4096];
        m.begin_pass();
        for k in 0..16u64 {
            m.read(base + k * 4096, &mut out).unwrap();
            assert_eq!(&out[..], &src[5 + k as usize * 4096..][..4096]);
        }
        let s = m.stats();
        assert_eq!(s.read_calls, 1, "64 KiB in one process_vm_readv");
        assert_eq!(s.reads_from_window, 15);
        // The window is a snapshot: a change shows only in the next pass.
        src[5] ^= 0xff;
        let want = src[5];
        let mut one = vec![0u8; 1024];
        m.read(base, &mut one).unwrap();
        assert_ne!(one[0], want);
        m.begin_pass();
        m.read(base, &mut one).unwrap();
        assert_eq!(one[0], want);
        // Small reads in a pass: their page is read whole once.
        // (outside the 64 KiB window)
        let page = ((base + 100_000) & !(PAGE as u64 - 1)) + 100;
        let at = (page - base) as usize + 5;
        let before = m.stats().read_calls;
        let mut eight = [0u8; 8];
        m.read(page, &mut eight).unwrap();
        assert_eq!(&eight, &src[at..at + 8]);
        m.read(page + 8, &mut eight).unwrap();
        assert_eq!(&eight, &src[at + 8..at + 16]);
        assert_eq!(m.stats().read_calls, before + 1);
        // A write of ours replaces what was snapshotted.
        m.write(page + 8, &[0xee; 8]).unwrap();
        m.read(page + 8, &mut eight).unwrap();
        assert_eq!(eight, [0xee; 8]);
        // Outside a pass every read goes to the process.
        m.end_pass();
        let before = m.stats().read_calls;
        m.read(page, &mut eight).unwrap();
        m.read(base, &mut one).unwrap();
        assert_eq!(m.stats().read_calls, before + 2);
    }

    #[test]
    fn lent_bytes_are_the_windows_and_a_held_write_lands_first() {
        let mut m = me();
        let src: Vec<u8> = (0..100_000u32).map(|i| (i * 11) as u8).collect();
        let base = src.as_ptr() as u64 + 3;
        assert!(!m.lend(base, 4096), "outside a pass nothing is lent");
        m.begin_pass();
        assert!(!m.lend(base, BULK - 1), "too short to open the window");
        for k in 0..4u64 {
            assert!(m.lend(base + k * 4096, 4096));
            let lent = m.lent(base + k * 4096, 4096).unwrap();
            assert_eq!(lent, &src[3 + k as usize * 4096..][..4096]);
        }
        assert_eq!(m.stats().read_calls, 1, "one window for all four");
        assert!(m.lend(base + 8, 16), "a short one the window holds");
        // A write held for the same bytes is flushed before they are lent (it lands in the
        // process; the window, a snapshot, is refilled by the next pass).
        let dst = vec![0u8; 8192];
        let to = dst.as_ptr() as u64;
        m.write(to, &[0x77; 4096]).unwrap();
        assert!(m.lend(to, 4096));
        assert_eq!(m.lent(to, 4096).unwrap(), &[0x77; 4096][..]);
        m.end_pass();
        assert!(m.lent(to, 4096).is_none(), "nothing outlives the pass");
        drop(dst);
    }

    #[test]
    fn read_ahead_stops_at_an_unmapped_page() {
        let mut m = me();
        m.begin_pass();
        // SAFETY: a private anonymous mapping of two pages, the second unmapped again.
        let p = unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                2 * PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            libc::munmap(p.cast::<u8>().add(PAGE).cast(), PAGE);
            std::slice::from_raw_parts_mut(p.cast::<u8>(), PAGE)
        };
        p.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
        let mut out = vec![0u8; 1000];
        m.read(p.as_ptr() as u64 + 3000, &mut out).unwrap();
        assert_eq!(&out[..], &p[3000..4000]);
        // Past the end is still refused.
        let mut over = vec![0u8; 1200];
        assert!(m.read(p.as_ptr() as u64 + 3000, &mut over).is_err());
        // SAFETY: the first page is still ours.
        unsafe { libc::munmap(p.as_mut_ptr().cast(), PAGE) };
    }

    #[test]
    fn writes_in_place_are_read_at_the_flush_in_order_with_held_ones() {
        let mut m = me();
        let dst = vec![0u8; 100_000];
        let base = dst.as_ptr() as u64 + 3;
        let mut src: Vec<u8> = (0..70_000u32).map(|i| (i * 11 + 3) as u8).collect();
        let local = src.as_ptr() as usize + 1;
        // A message in sixteen packets, each left in place: one piece, one call.
        for k in 0..16usize {
            // SAFETY: `src` outlives the flush below and is not changed before it.
            unsafe { m.write_in_place(base + k as u64 * 4096, local + k * 4096, 4096) }.unwrap();
        }
        assert_eq!(
            m.pending.pieces.len(),
            1,
            "contiguous on both sides: merged"
        );
        // A held write after it, overlapping its end, lands after it.
        m.write(base + 65_000, &[0xabu8; 1000]).unwrap();
        assert_eq!(dst[3], 0, "not written before the flush");
        let calls = m.stats().write_calls;
        m.flush().unwrap();
        assert_eq!(m.stats().write_calls, calls + 1);
        assert_eq!(&dst[3..3 + 65_000], &src[1..1 + 65_000]);
        assert!(dst[3 + 65_000..3 + 66_000].iter().all(|&b| b == 0xab));
        // The bytes are read at the flush, not when the write was held.
        // SAFETY: as above.
        unsafe { m.write_in_place(base + 80_000, local, 100) }.unwrap();
        src[1] ^= 0xff;
        let want = src[1];
        // And an in-place write after an overlapping held one lands last.
        m.write(base + 90_000, &[7u8; 64]).unwrap();
        // SAFETY: as above.
        unsafe { m.write_in_place(base + 90_010, local + 10, 20) }.unwrap();
        m.flush().unwrap();
        assert_eq!(dst[3 + 80_000], want);
        assert_eq!(&dst[3 + 80_001..3 + 80_100], &src[2..101]);
        assert!(dst[3 + 90_000..3 + 90_010].iter().all(|&b| b == 7));
        assert_eq!(&dst[3 + 90_010..3 + 90_030], &src[11..31]);
        assert!(dst[3 + 90_030..3 + 90_064].iter().all(|&b| b == 7));
        // Many pieces, held and in place, compacted by address: the same bytes.
        for k in (0..40usize).rev() {
            if k % 2 == 0 {
                // SAFETY: as above.
                unsafe { m.write_in_place(base + k as u64 * 500, local + k * 500, 500) }.unwrap();
            } else {
                m.write(base + k as u64 * 500, &[k as u8; 500]).unwrap();
            }
        }
        m.flush().unwrap();
        for k in 0..40usize {
            let got = &dst[3 + k * 500..][..500];
            if k % 2 == 0 {
                assert_eq!(got, &src[1 + k * 500..][..500], "piece {k}");
            } else {
                assert!(got.iter().all(|&b| b == k as u8), "piece {k}");
            }
        }
    }

    #[test]
    fn the_copier_writes_in_order_and_the_flush_waits_for_it() {
        let mut m = me();
        m.copy_ahead(8192);
        assert!(m.ahead.is_some(), "this test needs the copier thread");
        let dst = vec![0u8; 1 << 20];
        let base = dst.as_ptr() as u64 + 5;
        let src: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + 1) as u8).collect();
        let local = src.as_ptr() as usize + 3;
        // Forty writes of 4 KiB to one place, each from another source: every 8 KiB held go
        // to the copier; the last one must win, and the flush waits for all of them.
        for k in 0..40usize {
            // SAFETY: `src` outlives the flush below and is not changed before it.
            unsafe { m.write_in_place(base, local + k * 4096, 4096) }.unwrap();
        }
        assert!(
            m.ahead.as_ref().unwrap().in_flight > 0,
            "handed to the copier"
        );
        // Held writes overlapping what the copier has land after it.
        m.write(base + 100, &[0xeeu8; 600]).unwrap();
        m.flush().unwrap();
        assert_eq!(m.ahead.as_ref().unwrap().in_flight, 0);
        assert_eq!(&dst[5..105], &src[3 + 39 * 4096..][..100]);
        assert!(dst[105..705].iter().all(|&b| b == 0xee));
        assert_eq!(
            &dst[705..5 + 4096],
            &src[3 + 39 * 4096 + 700..][..4096 - 700]
        );
        // A read of bytes the copier has in flight waits for them.
        for k in 0..4usize {
            // SAFETY: as above.
            unsafe { m.write_in_place(base + 8192 + k as u64 * 4096, local + k * 4096, 4096) }
                .unwrap();
        }
        let mut out = vec![0u8; 4096];
        m.read(base + 8192 + 4096, &mut out).unwrap();
        assert_eq!(&out[..], &src[3 + 4096..][..4096]);
        assert_eq!(m.ahead.as_ref().unwrap().in_flight, 0, "the read waited");
        // An unmapped destination is reported by the flush, whoever wrote it.
        let good = m.stats().deferred_write_errors;
        for k in 0..4u64 {
            m.write(8 + k * 4096, &[1u8; 4096]).unwrap();
        }
        assert!(matches!(m.flush(), Err(AccessError::Unmapped { .. })));
        assert!(m.stats().deferred_write_errors > good);
        // The buffers come back for reuse: a long run holds only a few.
        for _ in 0..200 {
            m.write(base, &src[..9000]).unwrap();
        }
        m.flush().unwrap();
        assert_eq!(&dst[5..9005], &src[..9000]);
        assert!(m.ahead.as_ref().unwrap().spares.len() <= MAX_IN_FLIGHT + 1);
        // Not allowed: written here at the flush, as without a copier.
        m.allow_copy_ahead(false);
        for _ in 0..8 {
            m.write(base, &[3u8; 4096]).unwrap();
        }
        assert_eq!(m.ahead.as_ref().unwrap().in_flight, 0);
        m.flush().unwrap();
        assert!(dst[5..4101].iter().all(|&b| b == 3));
    }

    #[test]
    fn contiguous_bulk_writes_land_in_one_call_on_flush() {
        let mut m = me();
        let dst = vec![0u8; 100_000];
        let base = dst.as_ptr() as u64 + 7;
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 5 + 1) as u8).collect();
        for k in 0..10u64 {
            m.write(base + k * 4096, &data).unwrap();
        }
        assert_eq!(dst[7], 0, "not written before the flush");
        m.flush().unwrap();
        for k in 0..10 {
            assert_eq!(&dst[7 + k * 4096..][..4096], &data[..]);
        }
        let s = m.stats();
        assert_eq!((s.write_calls, s.writes_coalesced), (1, 9));
        // A read of pending bytes sees them (the write is flushed first).
        m.write(base + 50_000, &data).unwrap();
        let mut back = vec![0u8; 600];
        m.read(base + 50_100, &mut back).unwrap();
        assert_eq!(&back[..], &data[100..700]);
        // Writes anywhere, small ones too, are held and go in one call, a piece each.
        m.write(base + 60_000, &data).unwrap();
        m.write(base + 80_000, &data).unwrap();
        m.write(base + 90_000, &[9u8; 8]).unwrap();
        let calls = m.stats().write_calls;
        m.flush().unwrap();
        assert_eq!(m.stats().write_calls, calls + 1, "three pieces, one call");
        assert_eq!(&dst[7 + 60_000..][..4096], &data[..]);
        assert_eq!(&dst[7 + 80_000..][..4096], &data[..]);
        assert_eq!(&dst[7 + 90_000..][..8], &[9u8; 8]);
        // The same buffer written again and again: one piece, the last data.
        for v in 0..50u8 {
            m.write(base + 70_000, &[v; 8]).unwrap();
            m.write(base + 70_100, &[v; 16]).unwrap();
        }
        m.write(base + 70_004, &[0xaa; 2]).unwrap(); // overlaps: after the last value
        m.write(base + 70_000, &[0xbb; 8]).unwrap(); // not merged past the overlap
        assert_eq!(m.pending.pieces.len(), 4);
        m.flush().unwrap();
        assert_eq!(&dst[7 + 70_000..][..8], &[0xbb; 8]);
        assert_eq!(&dst[7 + 70_100..][..16], &[49; 16]);
        // Interleaved streams of small writes become one piece per stream.
        let calls = m.stats().write_calls;
        for i in 0..64u64 {
            for q in 0..4u64 {
                m.write(base + 20_000 + q * 1_000 + i * 8, &[(q * 64 + i) as u8; 8])
                    .unwrap();
            }
        }
        assert_eq!(m.pending.pieces.len(), 256);
        m.pending.compact();
        assert_eq!(m.pending.pieces.len(), 4);
        // (Full of pieces, the next write compacts instead of flushing.)
        m.flush().unwrap();
        assert_eq!(m.stats().write_calls, calls + 1);
        for q in 0..4usize {
            for i in 0..64usize {
                let at = 7 + 20_000 + q * 1_000 + i * 8;
                assert_eq!(&dst[at..at + 8], &[(q * 64 + i) as u8; 8]);
            }
        }
        // Overlapping pieces keep their order (no compaction).
        m.write(base + 30_000, &[1; 16]).unwrap();
        m.write(base + 40_000, &[2; 16]).unwrap();
        m.write(base + 30_008, &[3; 16]).unwrap();
        m.pending.compact();
        assert_eq!(m.pending.pieces.len(), 3);
        m.flush().unwrap();
        assert_eq!(
            &dst[7 + 30_000..][..24],
            &[[1u8; 8], [3; 8], [3; 8]].concat()[..]
        );
        // More than WRITE_BEHIND bytes: flushed on the way, nothing lost.
        let wide = vec![0u8; 3 * WRITE_BEHIND];
        let piece: Vec<u8> = (0..40_000u32).map(|i| (i % 251) as u8).collect();
        let calls = m.stats().write_calls;
        for k in 0..18u64 {
            // 720 KB of contiguous writes: flushed whenever WRITE_BEHIND bytes are held.
            m.write(wide.as_ptr() as u64 + k * 40_000, &piece).unwrap();
        }
        m.flush().unwrap();
        assert!(m.stats().write_calls >= calls + 3);
        for k in 0..18 {
            assert_eq!(&wide[k * 40_000..][..40_000], &piece[..]);
        }
        drop(m);
        // A piece in memory the process unmapped fails at the flush, counted; the pieces
        // around it are still written.
        let mut m = me();
        m.write(base, &[1u8; 100]).unwrap();
        m.write(8, &data).unwrap();
        m.write(base + 200, &[2u8; 100]).unwrap();
        assert!(m.flush().is_err());
        assert_eq!(m.stats().deferred_write_errors, 1);
        assert_eq!(&dst[7..107], &[1u8; 100][..]);
        assert_eq!(&dst[207..307], &[2u8; 100][..]);
        // Each write named its writer: only the one whose piece failed is blamed.
        m.set_writer(10);
        m.write(base, &[3u8; 100]).unwrap();
        m.set_writer(11);
        m.write(8, &data).unwrap();
        m.write(16 + data.len() as u64, &data).unwrap();
        m.set_writer(12);
        m.write(base + 200, &[4u8; 100]).unwrap();
        assert!(m.flush().is_err());
        assert_eq!(m.take_failed_writers(), [11]);
        assert!(m.take_failed_writers().is_empty());
        assert_eq!(&dst[207..307], &[4u8; 100][..]);
    }

    #[test]
    fn a_hole_inside_a_small_range_is_found_by_the_probe_and_by_the_maps() {
        let m = me();
        // Three pages, the middle one unmapped: small enough for the probe path.
        // SAFETY: a fresh anonymous mapping, partly unmapped and then fully unmapped below;
        // only this test uses it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                3 * 4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let a = base as u64;
        // SAFETY: the middle page of the mapping made above.
        assert_eq!(unsafe { libc::munmap((a + 4096) as *mut _, 4096) }, 0);
        m.check_mapped(a, 4096).unwrap();
        m.check_mapped(a + 100, 8).unwrap();
        m.check_mapped(a + 2 * 4096, 4096).unwrap();
        assert!(m.check_mapped(a, 3 * 4096).is_err());
        assert!(m.check_mapped(a + 4000, 200).is_err());
        // Mapped but unreadable: the probe fails, the maps check answers as before (mapped).
        // SAFETY: the first page of the mapping made above.
        assert_eq!(unsafe { libc::mprotect(base, 4096, libc::PROT_NONE) }, 0);
        m.check_mapped(a, 4096).unwrap();
        // SAFETY: the two pages still mapped.
        unsafe {
            libc::munmap(base, 4096);
            libc::munmap((a + 2 * 4096) as *mut _, 4096);
        }
    }
}
