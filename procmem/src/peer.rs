//! Who is at the other end of a control connection, pinned to the process itself rather than
//! to a pid.
//!
//! The daemon (often root) reads and writes a client's registered memory with
//! `process_vm_readv`/`writev`, which take a pid. A pid names a process only while that
//! process exists: once it exits and is reaped, the kernel hands the number to the next
//! process (cyclically; `kernel.pid_max` is 32768 on many machines, so a loop of forks gets
//! there in seconds), and the connection's descriptor can outlive the process that opened it
//! (fd passing, a fork child that keeps it). So at accept the daemon takes:
//!
//! - a **pidfd** of the peer: `SO_PEERPIDFD` (Linux 6.5), which the kernel takes for the
//!   process that called `connect`, so no pid is ever looked up; on older kernels
//!   `pidfd_open(SO_PEERCRED.pid)`, accepted only if that process still exists afterwards and
//!   runs as the socket's uid (the pid cannot have been recycled while the pidfd's process is
//!   alive, so a live, matching process after the open is the one that connected, short of a
//!   same-user process that exited and was replaced within the microseconds between the two
//!   calls);
//! - the peer's **address space**: `/proc/PID/mem` opened while the pidfd proves the process
//!   alive. That file refers to the memory descriptor (mm) itself, not to the pid: once the
//!   process exits, or execs another program (a set-uid one, say), reading it returns 0
//!   bytes instead of `EIO`, which is what [`ClientProcess::address_space_alive`] asks. The
//!   memory layer asks it before it uses the pid ([`crate::ProcessMemory`]), so a
//!   `process_vm_*` call never reaches a process that merely inherited the number.
//!
//! A connection whose process is already gone is refused, and the connection's thread closes
//! the connection when the pidfd reports the exit ([`ClientProcess::pidfd`] polls readable).

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// `SO_PEERPIDFD` (asm-generic/socket.h, Linux 6.5).
const SO_PEERPIDFD: libc::c_int = 77;
/// `SO_PEERGROUPS` (Linux 4.13): the peer's supplementary groups at connect time.
const SO_PEERGROUPS: libc::c_int = 59;

/// Why a peer process cannot be pinned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerError {
    #[error("the process that connected (pid {pid}) is gone")]
    Gone { pid: i32 },
    #[error("cannot identify the process that connected: {0}")]
    Unknown(String),
}

/// A client process, pinned (see the module documentation).
#[derive(Debug)]
pub struct ClientProcess {
    pid: i32,
    pidfd: OwnedFd,
    /// `/proc/PID/mem`, when the daemon may open it (the same right `process_vm_*` needs:
    /// same user or CAP_SYS_PTRACE). Without it liveness falls back to the pidfd alone.
    address_space: Option<File>,
    /// Where the liveness probe reads: an address on the process's stack (see
    /// [`probe_address`]), 0 when unknown.
    probe_at: u64,
    /// The last probe that found the address space alive, shared by everyone who holds
    /// this process (see [`ClientProcess::alive_within`]).
    checks: Checks,
}

/// When a process was last found alive, as nanoseconds after `epoch` (0: never), and
/// whether it was found gone (final).
#[derive(Debug)]
struct Checks {
    epoch: Instant,
    alive_at: AtomicU64,
    gone: AtomicBool,
    probes: AtomicU64,
}

impl Checks {
    fn new() -> Checks {
        Checks {
            epoch: Instant::now(),
            alive_at: AtomicU64::new(0),
            gone: AtomicBool::new(false),
            probes: AtomicU64::new(0),
        }
    }

    /// `now` as stored (at least 1, so that 0 keeps meaning "never").
    fn stamp(&self, now: Instant) -> u64 {
        (now.saturating_duration_since(self.epoch).as_nanos() as u64).max(1)
    }
}

impl ClientProcess {
    /// Pins the process at the other end of a connected Unix socket whose credentials
    /// (`SO_PEERCRED`) name `pid` and `uid`.
    pub fn of_peer(socket: BorrowedFd<'_>, pid: i32, uid: u32) -> Result<ClientProcess, PeerError> {
        let pidfd = match peer_pidfd(socket) {
            Some(fd) => fd,
            None => {
                // Older kernel: open by pid, then check that the pid still names a live
                // process of the socket's user (see the module documentation).
                let fd = pidfd_open(pid).ok_or(PeerError::Gone { pid })?;
                if process_uid(pid) != Some(uid) {
                    return Err(PeerError::Gone { pid });
                }
                fd
            }
        };
        let process = ClientProcess::pin(pid, pidfd);
        if process.exited() {
            return Err(PeerError::Gone { pid });
        }
        Ok(process)
    }

    /// Pins process `pid` as it is now (the device thread's fallback, and tests).
    pub fn open(pid: i32) -> Result<ClientProcess, PeerError> {
        let pidfd = pidfd_open(pid).ok_or(PeerError::Gone { pid })?;
        let process = ClientProcess::pin(pid, pidfd);
        if process.exited() {
            return Err(PeerError::Gone { pid });
        }
        Ok(process)
    }

    fn pin(pid: i32, pidfd: OwnedFd) -> ClientProcess {
        let address_space = File::open(format!("/proc/{pid}/mem")).ok();
        let process = ClientProcess {
            pid,
            pidfd,
            address_space,
            probe_at: probe_address(pid).unwrap_or(0),
            checks: Checks::new(),
        };
        // Opened by pid: it is the pidfd's process's only if that one is still alive now.
        if process.exited() {
            return ClientProcess {
                address_space: None,
                ..process
            };
        }
        process
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The pidfd: it polls readable once the process has exited.
    pub fn pidfd(&self) -> BorrowedFd<'_> {
        self.pidfd.as_fd()
    }

    /// Whether the process has exited (its pidfd is readable).
    pub fn exited(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no timeout.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n != 0
    }

    /// Whether the address space the process had when it connected still exists: false
    /// after exit and after an exec. One system call: a read of one byte from
    /// `/proc/PID/mem`, which reads nothing once the address space is gone, and while it lives
    /// reads the byte (or fails with EIO, where nothing is mapped).
    pub fn address_space_alive(&self) -> bool {
        match &self.address_space {
            Some(mem) => {
                let mut byte = [0u8; 1];
                match mem.read_at(&mut byte, self.probe_at) {
                    Ok(0) => false,
                    Ok(_) => true,
                    Err(e) => e.raw_os_error() == Some(libc::EIO),
                }
            }
            None => !self.exited(),
        }
    }

    /// Whether the address space was found alive at most `ttl` before `now`: probed again
    /// ([`ClientProcess::address_space_alive`], one system call) only when the last probe
    /// that found it alive is older. The answer is shared by everyone who holds this
    /// process, so however many memories of it are in use (a device's QPs, the fast path's
    /// directions), it is probed at most once per `ttl`. Gone is final. `ttl` zero: a fresh
    /// probe.
    pub fn alive_within(&self, now: Instant, ttl: Duration) -> bool {
        let c = &self.checks;
        if c.gone.load(Ordering::Relaxed) {
            return false;
        }
        let at = c.alive_at.load(Ordering::Relaxed);
        let stamp = c.stamp(now);
        if at != 0 && !ttl.is_zero() && stamp.saturating_sub(at) < ttl.as_nanos() as u64 {
            return true;
        }
        c.probes.fetch_add(1, Ordering::Relaxed);
        if !self.address_space_alive() {
            c.gone.store(true, Ordering::Relaxed);
            return false;
        }
        // Concurrent probes may store out of order; an older stamp only means an earlier
        // probe next time.
        c.alive_at.store(stamp, Ordering::Relaxed);
        true
    }

    /// How many times [`ClientProcess::alive_within`] probed the address space.
    pub fn probes(&self) -> u64 {
        self.checks.probes.load(Ordering::Relaxed)
    }
}

/// `SO_PEERPIDFD`, or `None` where the kernel lacks it.
fn peer_pidfd(socket: BorrowedFd<'_>) -> Option<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `fd`.
    let r = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    // SAFETY: on success the kernel installed a new descriptor for us.
    (r == 0 && fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: a plain system call; it returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: a new descriptor nothing else owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// The real uid of process `pid` (`/proc/PID/status`).
fn process_uid(pid: i32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// An address that stays mapped while the process lives: where its arguments start on its
/// stack (`arg_start`, field 48 of `/proc/PID/stat`, readable with the same right as
/// `/proc/PID/mem`). The liveness probe reads there because a read where nothing is mapped
/// is not free for the process: the kernel then tries to grow a stack down to the address
/// (`expand_stack`), which takes the process's mmap lock for writing, so every
/// `process_vm_*` call on the process waits behind each probe. Probing address 0 that way
/// cost a fast-path sender of `ib_write_bw -s 8 -q 16` about a tenth of its time (the lock's
/// slow path, the wake-ups and the stack walk in `perf`, at 12,000 probes a second).
fn probe_address(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let arg_start = after_name.split_whitespace().nth(48 - 3)?.parse().ok()?;
    (arg_start != 0).then_some(arg_start)
}

/// The peer's supplementary groups at connect time (`SO_PEERGROUPS`); empty if unknown.
pub fn peer_groups(socket: BorrowedFd<'_>) -> Vec<u32> {
    let mut groups = vec![0 as libc::gid_t; 64];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into the buffer.
        let r = unsafe {
            libc::getsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = len as usize / std::mem::size_of::<libc::gid_t>();
        if r == 0 {
            groups.truncate(n);
            return groups;
        }
        // ERANGE: `len` says how much room is needed.
        if std::io::Error::last_os_error().raw_os_error() == Some(libc::ERANGE)
            && n > groups.len()
            && n <= 1 << 16
        {
            groups.resize(n, 0);
            continue;
        }
        return Vec::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;
    use std::process::Command;

    #[test]
    fn the_peer_of_a_socket_is_pinned_with_its_groups() {
        let (a, _b) = UnixStream::pair().unwrap();
        let me = std::process::id() as i32;
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        let p = ClientProcess::of_peer(a.as_fd(), me, uid).unwrap();
        assert_eq!(p.pid(), me);
        assert!(!p.exited());
        assert!(p.address_space_alive());
        let mut mine = nix::unistd::getgroups()
            .unwrap()
            .into_iter()
            .map(|g| g.as_raw())
            .collect::<Vec<_>>();
        let mut theirs = peer_groups(a.as_fd());
        mine.sort_unstable();
        theirs.sort_unstable();
        assert_eq!(theirs, mine);
    }

    #[test]
    fn the_liveness_probe_reads_a_mapped_byte_of_the_process() {
        // Where nothing is mapped the probe would cost the process its mmap lock (see
        // `probe_address`): it must find a byte, for this process and for a child.
        let mut child = Command::new("sleep").arg("5").spawn().unwrap();
        for pid in [std::process::id() as i32, child.id() as i32] {
            let p = ClientProcess::open(pid).unwrap();
            assert_ne!(p.probe_at, 0, "no stack address found for pid {pid}");
            let mem = p.address_space.as_ref().expect("/proc/PID/mem opened");
            let mut byte = [0u8; 1];
            assert_eq!(mem.read_at(&mut byte, p.probe_at).unwrap(), 1);
            assert!(p.address_space_alive());
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn liveness_is_probed_once_per_ttl_and_gone_is_final() {
        let mut child = Command::new("sleep").arg("5").spawn().unwrap();
        let p = ClientProcess::open(child.id() as i32).unwrap();
        let t0 = Instant::now();
        let ttl = Duration::from_millis(1);
        assert!(p.alive_within(t0, ttl));
        assert_eq!(p.probes(), 1);
        for us in [0, 10, 999] {
            assert!(p.alive_within(t0 + Duration::from_micros(us), ttl));
        }
        assert_eq!(p.probes(), 1, "within the ttl: the last probe holds");
        assert!(p.alive_within(t0 + Duration::from_micros(1001), ttl));
        assert_eq!(p.probes(), 2, "older than the ttl: probed again");
        assert!(p.alive_within(t0 + Duration::from_micros(1001), Duration::ZERO));
        assert_eq!(p.probes(), 3, "a zero ttl always probes");
        child.kill().unwrap();
        child.wait().unwrap();
        // Within the ttl of the last probe the death is not seen yet (that is the bound the
        // pid's reuse needs, see `crate::LIVENESS_TTL`); past it, it is, and for good.
        assert!(!p.alive_within(Instant::now() + Duration::from_millis(2), ttl));
        assert!(!p.alive_within(Instant::now(), Duration::from_secs(3600)));
        assert_eq!(p.probes(), 4, "gone needs no more probes");
    }

    #[test]
    fn an_exited_process_is_seen_gone_and_an_exec_ends_the_address_space() {
        let mut child = Command::new("sleep").arg("0.3").spawn().unwrap();
        let p = ClientProcess::open(child.id() as i32).unwrap();
        assert!(!p.exited() && p.address_space_alive());
        child.wait().unwrap();
        assert!(p.exited());
        assert!(!p.address_space_alive());
        assert!(matches!(
            ClientProcess::open(child.id() as i32),
            Err(PeerError::Gone { .. })
        ));

        // The same pid after exec is another address space: a shell that execs sleep.
        let mut child = Command::new("sh")
            .args(["-c", "read x; exec sleep 5"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let p = ClientProcess::open(child.id() as i32).unwrap();
        assert!(p.address_space_alive());
        use std::io::Write;
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while p.address_space_alive() {
            assert!(std::time::Instant::now() < deadline, "exec not seen");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!p.exited(), "the process lives on under another program");
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
