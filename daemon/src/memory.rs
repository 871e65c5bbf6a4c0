//! Reaching registered memory inside client processes without changing their address space:
//! `process_vm_readv` and `process_vm_writev` (verbs-abi.md §5). Remapping pages onto shared
//! memory would be faster but loses concurrent writes, breaks fork and file-backed mappings, so
//! it is not done.
//!
//! One trap decides the shape of this module: glibc's memcpy, and the kernel's copy inside
//! process_vm_*, run 4-20x slower when the destination sits 1-63 bytes ahead of the source
//! modulo 64. So data is staged in a bounce buffer placed at the same offset modulo 64 as the
//! remote address, which makes the cross-process copy run at full speed.

use std::io::{IoSlice, IoSliceMut};

use nix::sys::uio::{process_vm_readv, process_vm_writev, RemoteIoVec};
use nix::unistd::Pid;

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

/// A 64-byte aligned scratch buffer that can present a window at any offset modulo 64.
#[derive(Debug, Default)]
pub struct Bounce {
    buf: Vec<u8>,
}

impl Bounce {
    /// A `len`-byte window whose address is congruent to `remote` modulo 64.
    fn window(&mut self, remote: u64, len: usize) -> &mut [u8] {
        let need = len + 128;
        if self.buf.len() < need {
            self.buf.resize(need.next_power_of_two(), 0);
        }
        let base = self.buf.as_ptr() as usize;
        let skew = ((remote as usize).wrapping_sub(base)) & 63;
        &mut self.buf[skew..skew + len]
    }
}

/// One client process's memory.
#[derive(Debug)]
pub struct ProcessMemory {
    pid: Pid,
    bounce: Bounce,
}

impl ProcessMemory {
    pub fn new(pid: i32) -> ProcessMemory {
        ProcessMemory {
            pid: Pid::from_raw(pid),
            bounce: Bounce::default(),
        }
    }

    fn error(&self, e: nix::Error, addr: u64, len: usize) -> AccessError {
        let pid = self.pid.as_raw();
        match e {
            nix::Error::ESRCH => AccessError::Gone { pid },
            nix::Error::EPERM => AccessError::Denied { pid },
            _ => AccessError::Unmapped { pid, addr, len },
        }
    }

    /// Copies `out.len()` bytes from `addr` in the client into `out`.
    pub fn read(&mut self, addr: u64, out: &mut [u8]) -> Result<(), AccessError> {
        let len = out.len();
        if len == 0 {
            return Ok(());
        }
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

    /// Copies `data` to `addr` in the client.
    pub fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), AccessError> {
        let len = data.len();
        if len == 0 {
            return Ok(());
        }
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
            assert_eq!(&dst[skew..skew + len], &src[..len]);
            let mut back = vec![0u8; len + 3];
            m.read(dst[skew..].as_ptr() as u64, &mut back[3..]).unwrap();
            assert_eq!(&back[3..], &src[..len]);
            dst.fill(0);
        }
    }

    #[test]
    fn unmapped_memory_is_an_error_not_a_crash() {
        let mut m = me();
        let mut out = [0u8; 16];
        assert!(matches!(
            m.read(8, &mut out),
            Err(AccessError::Unmapped { .. })
        ));
        assert!(matches!(
            m.write(8, &out),
            Err(AccessError::Unmapped { .. })
        ));
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
