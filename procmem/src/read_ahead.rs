//! The read side: reads, and the snapshots that serve them within a transmit pass (see the
//! crate documentation): the read-ahead window, filled by one `process_vm_readv` of up to
//! [`READ_AHEAD`] bytes for a read of [`BULK`] bytes or more, and whole pages kept for small
//! reads. Outside a pass, and for what the snapshots cannot serve, a read goes to the process
//! itself (through the bounce buffer where the alignment calls for it).

use std::io::IoSliceMut;

use nix::sys::uio::{process_vm_readv, RemoteIoVec};

use crate::bounce::Bounce;
use crate::{AccessError, ProcessMemory, BULK, READ_AHEAD};

/// Pages kept for small reads during a pass (a small message's buffer, read again by every
/// work request that reuses it).
const SMALL_READ_PAGES: usize = 32;
/// Read-ahead is split into page-sized remote pieces: the kernel transfers whole iovec
/// elements only, so an unmapped page past the requested bytes ends the window there
/// instead of failing the read.
pub(crate) const PAGE: usize = 4096;

/// Bytes of the client at `addr` held locally: the read-ahead window (held writes are in
/// [`crate::write_behind::WriteBehind`]).
#[derive(Debug, Default)]
pub(crate) struct Span {
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
pub(crate) struct PageCache {
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

impl ProcessMemory {
    /// Starts a transmit pass: until [`ProcessMemory::end_pass`], reads may be served from
    /// snapshots taken during the pass (the read-ahead window, whole pages for small reads).
    /// Outside passes every read goes to the process.
    pub fn begin_pass(&mut self) {
        self.end_pass();
        self.in_pass = true;
    }

    /// Forgets what the snapshots hold of `[addr, addr + len)`, which is about to be
    /// written: a later read in the pass must see the write.
    pub(crate) fn forget_snapshots(&mut self, addr: u64, len: usize) {
        if self.window.overlaps(addr, len) {
            self.window.len = 0;
        }
        self.pages.forget_overlapping(addr, len);
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
        self.transfer_result(done, addr, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::me;

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
}
