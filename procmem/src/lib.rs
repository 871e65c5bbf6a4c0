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
//!
//! Where things are:
//! - this file: [`AccessError`], the public constants, [`MemoryStats`], [`ProcessMemory`]
//!   itself (its constructors, `Drop`) and the liveness check that comes before every use of
//!   the pid (`reachable`);
//! - `bounce`: `Bounce`, a buffer that presents a window at the remote address's offset
//!   modulo 64;
//! - `read_ahead`: the read side ([`ProcessMemory::read`], [`ProcessMemory::lend`]) and its
//!   snapshots, kept only within a transmit pass ([`ProcessMemory::begin_pass`]): the
//!   read-ahead window and whole pages kept for small reads;
//! - `write_behind`: the write side ([`ProcessMemory::write`],
//!   [`ProcessMemory::write_in_place`]): writes held for one call and how they are written
//!   out ([`ProcessMemory::flush`]; `write_out`, which the copier runs too);
//! - `writers`: whom each held write is for ([`ProcessMemory::set_writer`]), so that a write
//!   that fails is charged to the QPs whose data it was;
//! - `copy_ahead`: a holder's share of the copier ([`ProcessMemory::copy_ahead`]): handing
//!   held writes over and waiting for them;
//! - `copier`: the copier thread itself;
//! - `registration`: [`ProcessMemory::check_mapped`], the check `ibv_reg_mr` makes;
//! - `peer`: [`ClientProcess`], the process pinned when it connected.
//!
//! Tests sit with the code they test; `test_support` holds what they share.

use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::unistd::Pid;

mod bounce;
mod copier;
mod copy_ahead;
pub mod peer;
mod read_ahead;
mod registration;
#[cfg(test)]
mod test_support;
mod write_behind;
mod writers;

pub(crate) use crate::bounce::Bounce;
use crate::copy_ahead::Ahead;
use crate::peer::ClientProcess;
use crate::read_ahead::{PageCache, Span};
use crate::write_behind::WriteBehind;
use crate::writers::Writers;

/// How long a liveness check of the client's address space vouches for its pid.
pub const LIVENESS_TTL: Duration = Duration::from_millis(1);

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

/// What a failed `process_vm_*` call on the `len` bytes at `addr` in process `pid` means.
fn access_error(pid: Pid, e: nix::Error, addr: u64, len: usize) -> AccessError {
    let pid = pid.as_raw();
    match e {
        nix::Error::ESRCH => AccessError::Gone { pid },
        nix::Error::EPERM => AccessError::Denied { pid },
        _ => AccessError::Unmapped { pid, addr, len },
    }
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

/// No writer named (see [`ProcessMemory::set_writer`]).
pub const NO_WRITER: u32 = u32::MAX;

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

    /// Whether the process is known to be gone (exited or exec'd since it connected).
    pub fn is_gone(&self) -> bool {
        self.reachable().is_err()
    }

    /// What a `process_vm_readv`/`writev` of the `len` bytes at `addr` that returned `done`
    /// means: only a whole transfer is a success.
    fn transfer_result(
        &self,
        done: nix::Result<usize>,
        addr: u64,
        len: usize,
    ) -> Result<(), AccessError> {
        match done {
            Ok(n) if n == len => Ok(()),
            Ok(_) => Err(AccessError::Unmapped {
                pid: self.pid.as_raw(),
                addr,
                len,
            }),
            Err(e) => Err(access_error(self.pid, e, addr, len)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::me;

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
}
