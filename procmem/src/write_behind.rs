//! The write side: writes held for one `process_vm_writev` (see the crate documentation), the
//! writes that are not held, and the flush that writes the held ones out ([`write_out`], run
//! by the holder and by the copier).

use std::io::IoSlice;

use nix::sys::uio::{process_vm_writev, RemoteIoVec};
use nix::unistd::Pid;

use crate::writers::Writers;
use crate::{
    access_error, AccessError, MemoryStats, ProcessMemory, MAX_WRITE_PIECES, WRITE_BEHIND,
};

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
    pub(crate) queued: usize,
    /// The lowest and highest remote address held, for a quick overlap test.
    pub(crate) lo: u64,
    pub(crate) hi: u64,
}

impl WriteBehind {
    pub(crate) fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    pub(crate) fn overlaps(&self, addr: u64, len: usize) -> bool {
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
    pub(crate) fn absorb(
        self,
        stats: &mut MemoryStats,
        writers: &mut Writers,
    ) -> Option<AccessError> {
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

impl ProcessMemory {
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
        self.forget_snapshots(addr, len);
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
        self.transfer_result(done, addr, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::me;

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
}
