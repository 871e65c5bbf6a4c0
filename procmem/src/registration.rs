//! What a memory registration checks: that the range is mapped in the client, as
//! `ibv_reg_mr` must.

use std::io::IoSliceMut;
use std::time::Duration;

use nix::sys::uio::{process_vm_readv, RemoteIoVec};

use crate::{AccessError, ProcessMemory};

/// The largest range, in pages, that `check_mapped` probes directly.
const PROBE_PAGES: usize = 64;

impl ProcessMemory {
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
        const PAGE: u64 = crate::read_ahead::PAGE as u64;
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
    use crate::test_support::me;

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
