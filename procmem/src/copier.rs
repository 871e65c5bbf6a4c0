//! Writing held writes out on another CPU while their holder goes on: the *copier*, for
//! [`ProcessMemory::copy_ahead`](crate::ProcessMemory::copy_ahead).
//!
//! Why: on the shim's same-host fast path one thread runs both engines and then makes the
//! kernel copy every payload into the peer, so a bulk transfer costs the engines' time *plus*
//! the copy's (about half each in a profile of `ib_write_bw -s 65536`). A NIC's DMA engine
//! copies while its CPU goes on; the copier is that DMA engine. While the engines handle the
//! next packets, the held writes so far are written by `process_vm_writev` on this thread,
//! in the order they were held; the holder waits for all of them at its next
//! [`flush`](crate::ProcessMemory::flush), before anything is completed, so nobody learns of
//! data that is not in place yet.
//!
//! One copier serves a whole process, and it is a thread only while there is work: it spins
//! (yielding the CPU, see [`recv_spinning`]) for [`SPIN`] after a job (the next one usually
//! comes within microseconds in a bulk transfer, and waking a sleeping thread costs 7-14 µs),
//! then sleeps until the next job.

use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use nix::unistd::Pid;

use crate::peer::ClientProcess;
use crate::write_behind::{write_out, WriteBehind, WriteOutcome};
use crate::LIVENESS_TTL;

/// How long the copier spins for the next job before it sleeps.
const SPIN: Duration = Duration::from_micros(50);

/// Held writes handed to the copier, and, on the way back, what writing them gave.
#[derive(Debug)]
pub(crate) struct Job {
    pub pid: Pid,
    /// The process whose liveness vouches for the pid (None: the pid is not used).
    pub process: Option<Arc<ClientProcess>>,
    pub pending: WriteBehind,
    pub outcome: WriteOutcome,
    pub reply: Sender<Job>,
}

/// The process's copier thread (see the module documentation).
#[derive(Debug)]
pub(crate) struct Copier {
    jobs: Sender<Job>,
    /// The process the thread runs in: a child forked from it has no such thread.
    pid: u32,
}

impl Copier {
    /// The process's copier, started on first use (None: no thread could be started, or
    /// this is a child forked after it started; the holders then write inline, as without
    /// one).
    pub fn get() -> Option<&'static Copier> {
        static COPIER: OnceLock<Option<Copier>> = OnceLock::new();
        COPIER
            .get_or_init(|| {
                let (jobs, rx) = mpsc::channel();
                std::thread::Builder::new()
                    .name("softroce-copy".into())
                    .spawn(move || run(rx))
                    .ok()
                    .map(|_| Copier {
                        jobs,
                        pid: std::process::id(),
                    })
            })
            .as_ref()
            .filter(|c| c.runs_here())
    }

    /// Whether the copier's thread is in this process (not so in a forked child, which
    /// must not wait for jobs its parent's thread has).
    pub fn runs_here(&self) -> bool {
        self.pid == std::process::id()
    }

    /// Queues `job` (its outcome unset); it comes back, with its outcome, on its `reply`
    /// channel. Err: the copier is gone (never, once started), with the writes back.
    pub fn send(&self, job: Job) -> Result<(), WriteBehind> {
        self.jobs.send(job).map_err(|e| e.0.pending)
    }
}

fn run(jobs: Receiver<Job>) {
    loop {
        let mut job = match recv_spinning(&jobs) {
            Some(job) => job,
            None => return,
        };
        // The pid is used only while the process that connected still owns it (the module
        // documentation of `procmem`): the holder checked within LIVENESS_TTL of handing the
        // job over, which is usually microseconds ago; checked again when it is not.
        let alive = job
            .process
            .as_ref()
            .is_some_and(|p| p.alive_within(Instant::now(), LIVENESS_TTL));
        job.outcome = if alive {
            // A panic here would leave the holder waiting for its job: it comes back failed.
            let (pid, pending) = (job.pid, &mut job.pending);
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| write_out(pid, pending)))
                .unwrap_or_else(|_| WriteOutcome::all_failed(pid, pending))
        } else {
            WriteOutcome::all_failed(job.pid, &job.pending)
        };
        let reply = job.reply.clone();
        let _ = reply.send(job);
    }
}

/// The next job on `rx`: spun for up to [`SPIN`] (the next one usually comes within
/// microseconds in a bulk transfer), then slept for. None: every sender is gone (for the
/// copier's queue, every holder; a holder's reply channel never, it keeps a sender itself).
///
/// The spin yields the CPU at every turn (`sched_yield`): a sending process has three threads
/// that want a CPU (the application's, the copier, the backstop) beside the peer and the
/// daemon, and on two CPUs a copier that spun plainly took, for its whole spin, the CPU the
/// application's thread needed to post the next writes (it spun for a third of the sender's
/// CPU time in `perf` of `ib_write_bw -s 8 -q 16`). A yield returns at once when no other
/// thread waits for this CPU, so an idle machine loses only the system call (~0.2 µs, short
/// beside a hand-off). Measured ad hoc, builds alternated in four rounds on 2 vCPUs:
/// `ib_write_bw -s 65536` 7.2-7.5 → 7.5-7.9 GB/s; `-s 8 -q 16` and `ib_send_lat -s 2`
/// unchanged within the noise (0.91-1.03 against 0.88-1.07 M msg/s). A holder waiting for its
/// jobs (`join`) yields the same way, to the copier.
pub(crate) fn recv_spinning(rx: &Receiver<Job>) -> Option<Job> {
    let until = Instant::now() + SPIN;
    loop {
        match rx.try_recv() {
            Ok(job) => return Some(job),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) if Instant::now() < until => std::thread::yield_now(),
            Err(TryRecvError::Empty) => return rx.recv().ok(),
        }
    }
}
