//! Where a client's event records go: the completion channel's pipe and the context's async
//! event socket, descriptors the client handed over. The device thread serves every client,
//! so it never waits on one: records are written without blocking, and a client that does not
//! read its channel hurts only itself.
//!
//! A blocking descriptor cannot be trusted to stay non-blocking: the flag lives on the open
//! file description, which the client shares and may change back at any time. So a socket is
//! written with `MSG_DONTWAIT` on every call, and a pipe is reopened through `/proc/self/fd`,
//! which gives the daemon a description of its own, opened `O_NONBLOCK`. Anything else is
//! refused when it is handed over.
//!
//! A record that does not fit waits in a small backlog, retried on every round of the device
//! (the device wakes at least every [`RETRY_INTERVAL`] while one waits). The backlog
//! coalesces: a completion-channel record per CQ, since a completion event is level-like
//! (it says "poll this CQ", and a second one for the same CQ adds nothing; the kernel only
//! bounds these records by the number of times the CQ was armed), and async events per
//! (element, type). Past [`MAX_BACKLOG`] records new ones are dropped and counted, as the
//! kernel's uverbs event queue, an unbounded list of `GFP_ATOMIC` allocations, drops an event
//! when the allocation fails (`ib_uverbs_async_handler`, `ib_uverbs_comp_handler`).

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// Most records one sink holds back.
pub(super) const MAX_BACKLOG: usize = 1024;
/// How often a device retries held-back records while it has nothing else to do.
pub(super) const RETRY_INTERVAL: Duration = Duration::from_millis(5);

/// One record: up to 16 bytes (a completion-channel record is 8, an async event 16).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Record {
    bytes: [u8; 16],
    len: u8,
    /// How many leading bytes say what the record is about (records with equal keys
    /// coalesce into the newest).
    key: u8,
}

impl Record {
    fn bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    fn key(&self) -> &[u8] {
        &self.bytes[..self.key as usize]
    }
}

/// What happened to one write.
enum Written {
    Done,
    /// No room now (EAGAIN).
    Full,
    /// The reader is gone or the descriptor is broken: the record is dropped.
    Broken,
}

/// A descriptor the daemon writes a client's records to, never blocking.
#[derive(Debug)]
pub(super) struct EventSink {
    fd: OwnedFd,
    socket: bool,
    backlog: VecDeque<Record>,
    /// Records dropped because the backlog was full.
    pub dropped: u64,
}

impl EventSink {
    /// Takes over a descriptor from the client: a socket, or a pipe (reopened non-blocking).
    pub fn new(fd: OwnedFd) -> Result<EventSink, &'static str> {
        // SAFETY: fstat fills a plain struct for a descriptor we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err("the event descriptor cannot be examined");
        }
        match st.st_mode & libc::S_IFMT {
            libc::S_IFSOCK => Ok(EventSink::of(fd, true)),
            libc::S_IFIFO => {
                let path = format!("/proc/self/fd/{}\0", fd.as_raw_fd());
                // SAFETY: a NUL-terminated path; open returns a new descriptor or -1.
                let own = unsafe {
                    libc::open(
                        path.as_ptr().cast(),
                        libc::O_WRONLY | libc::O_NONBLOCK | libc::O_CLOEXEC,
                    )
                };
                if own < 0 {
                    return Err("the event pipe cannot be opened for writing");
                }
                // SAFETY: a new descriptor nothing else owns.
                Ok(EventSink::of(unsafe { OwnedFd::from_raw_fd(own) }, false))
            }
            _ => Err("an event descriptor must be a pipe or a socket"),
        }
    }

    fn of(fd: OwnedFd, socket: bool) -> EventSink {
        EventSink {
            fd,
            socket,
            backlog: VecDeque::new(),
            dropped: 0,
        }
    }

    fn write(&self, bytes: &[u8]) -> Written {
        loop {
            // SAFETY: writes from a valid buffer to a descriptor we own; neither call blocks
            // (MSG_DONTWAIT, or our own O_NONBLOCK description).
            let n = unsafe {
                if self.socket {
                    libc::send(
                        self.fd.as_raw_fd(),
                        bytes.as_ptr().cast(),
                        bytes.len(),
                        libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                    )
                } else {
                    libc::write(self.fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len())
                }
            };
            if n == bytes.len() as isize {
                return Written::Done;
            }
            match std::io::Error::last_os_error().raw_os_error() {
                _ if n >= 0 => return Written::Broken,
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) | Some(libc::ENOBUFS) => return Written::Full,
                _ => return Written::Broken,
            }
        }
    }

    /// Sends a record, or holds it back; `key` leading bytes say what it is about.
    pub fn send(&mut self, bytes: &[u8], key: usize) {
        debug_assert!(bytes.len() <= 16 && key <= bytes.len());
        let mut rec = Record {
            bytes: [0; 16],
            len: bytes.len() as u8,
            key: key as u8,
        };
        rec.bytes[..bytes.len()].copy_from_slice(bytes);
        // Behind held-back records, in order (a retry first).
        if !self.backlog.is_empty() {
            self.retry();
        }
        if self.backlog.is_empty() {
            match self.write(rec.bytes()) {
                Written::Done | Written::Broken => return,
                Written::Full => {}
            }
        }
        if let Some(held) = self.backlog.iter_mut().find(|r| r.key() == rec.key()) {
            *held = rec;
        } else if self.backlog.len() < MAX_BACKLOG {
            self.backlog.push_back(rec);
        } else {
            self.dropped += 1;
        }
    }

    /// Writes held-back records while they fit. Returns whether any went.
    pub fn retry(&mut self) -> bool {
        let mut sent = false;
        while let Some(rec) = self.backlog.front() {
            match self.write(rec.bytes()) {
                Written::Full => break,
                Written::Done => sent = true,
                Written::Broken => {}
            }
            self.backlog.pop_front();
        }
        sent
    }

    pub fn has_backlog(&self) -> bool {
        !self.backlog.is_empty()
    }

    #[cfg(test)]
    pub fn backlog_len(&self) -> usize {
        self.backlog.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipe() -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: a valid array for pipe2 to fill.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: pipe2 made both.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    fn read_all(fd: &OwnedFd) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: reads into a valid buffer; the descriptor is non-blocking below.
            let n = unsafe {
                libc::recv(
                    fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            let n = if n < 0
                && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOTSOCK)
            {
                // SAFETY: as above, for a pipe made non-blocking.
                unsafe {
                    libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK);
                    libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len())
                }
            } else {
                n
            };
            if n <= 0 {
                return out;
            }
            out.extend_from_slice(&buf[..n as usize]);
        }
    }

    #[test]
    fn a_full_pipe_never_blocks_and_records_of_one_cq_coalesce() {
        let (r, w) = pipe();
        let mut sink = EventSink::new(w.try_clone().unwrap()).unwrap();
        // The client makes its own end blocking again: the daemon's description stays
        // non-blocking.
        // SAFETY: fcntl on a descriptor we own.
        unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETFL, 0) };
        // 64 KiB of pipe is 8192 records; far more go without blocking.
        let start = std::time::Instant::now();
        for i in 0..20_000u32 {
            let cq = i % 3;
            let mut rec = [0u8; 8];
            rec[..4].copy_from_slice(&cq.to_ne_bytes());
            rec[4..].copy_from_slice(&i.to_ne_bytes());
            sink.send(&rec, 4);
        }
        assert!(start.elapsed() < std::time::Duration::from_secs(5));
        // One held-back record per CQ, the newest of each.
        assert_eq!(sink.backlog_len(), 3);
        let first = read_all(&r);
        assert_eq!(first.len() % 8, 0);
        assert!(sink.retry());
        assert!(!sink.has_backlog());
        let rest = read_all(&r);
        let gens: Vec<u32> = rest
            .chunks(8)
            .map(|c| u32::from_ne_bytes(c[4..8].try_into().unwrap()))
            .collect();
        assert_eq!(gens, [19_997, 19_998, 19_999]);
        assert_eq!(sink.dropped, 0);
    }

    #[test]
    fn an_async_socket_holds_back_distinct_events_up_to_the_cap_then_counts_drops() {
        let (a, b) = std::os::unix::net::UnixDatagram::pair().unwrap();
        let mut sink = EventSink::new(OwnedFd::from(b)).unwrap();
        let mut sent = 0u64;
        for qpn in 0..100_000u64 {
            let mut rec = [0u8; 16];
            rec[..8].copy_from_slice(&qpn.to_ne_bytes());
            rec[8..12].copy_from_slice(&1u32.to_ne_bytes());
            sink.send(&rec, 12);
            sent += 1;
        }
        assert_eq!(sink.backlog_len(), MAX_BACKLOG);
        assert!(sink.dropped > 0);
        let delivered = read_all(&OwnedFd::from(a)).len() as u64 / 16;
        assert_eq!(delivered + MAX_BACKLOG as u64 + sink.dropped, sent);
    }

    #[test]
    fn only_pipes_and_sockets_are_taken() {
        let file = std::fs::File::open("/proc/self/status").unwrap();
        assert!(EventSink::new(OwnedFd::from(file)).is_err());
        // A pipe whose reader is gone takes records and drops them (EPIPE).
        let (r, w) = pipe();
        drop(r);
        if let Ok(mut sink) = EventSink::new(w) {
            sink.send(&[1u8; 8], 4);
            assert!(!sink.has_backlog());
        }
    }
}
