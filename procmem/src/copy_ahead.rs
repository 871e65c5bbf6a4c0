//! A holder's share of the copier (module `copier`, the thread): handing held writes over
//! ([`ProcessMemory::copy_ahead`], [`ProcessMemory::hand_off`]), taking them back and waiting
//! for them at the flush.

use crate::copier::{self, Copier, Job};
use crate::write_behind::{WriteBehind, WriteOutcome};
use crate::writers::Writers;
use crate::{AccessError, MemoryStats, ProcessMemory};

/// Most jobs a [`ProcessMemory`] has with the copier at once (each holds up to
/// [`WRITE_BEHIND`](crate::WRITE_BEHIND) bytes and
/// [`MAX_WRITE_PIECES`](crate::MAX_WRITE_PIECES) pieces); one more waits for the oldest.
const MAX_IN_FLIGHT: usize = 3;

/// A [`ProcessMemory`]'s share of the copier (see `copier`).
#[derive(Debug)]
pub(crate) struct Ahead {
    copier: &'static Copier,
    /// Held writes go to the copier once this many bytes are held,
    from: usize,
    /// while the holder allows it ([`ProcessMemory::allow_copy_ahead`]).
    allowed: bool,
    reply: std::sync::mpsc::Sender<Job>,
    back: std::sync::mpsc::Receiver<Job>,
    pub(crate) in_flight: usize,
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

impl ProcessMemory {
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
    pub(crate) fn maybe_copy_ahead(&mut self) {
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
    pub(crate) fn make_room(&mut self) {
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
    pub(crate) fn join(&mut self) -> (usize, Option<AccessError>) {
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
    pub(crate) fn in_flight_overlaps(&self, addr: u64, len: usize) -> bool {
        self.ahead.as_ref().is_some_and(|a| {
            a.in_flight > 0 && addr < a.hi && addr.saturating_add(len as u64) > a.lo
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::me;

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
}
