//! The daemon's ring memfds, mapped into the application.

use std::os::fd::{AsRawFd, OwnedFd};

use proto::ctl::RingPlace;
use proto::ring::doorbell::Doorbells;
use proto::ring::SharedRing;

use crate::ffi::Errno;

/// A `MAP_SHARED` mapping of a memfd the daemon sent; unmapped on drop. Rings attached to it
/// must be dropped first (the owners below keep them in the same struct, declared earlier).
#[derive(Debug)]
pub struct Mapping {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; every access to it goes through SharedRing,
// whose users serialise per ring with a Mutex.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` read/write, shared with the daemon.
    pub fn map(fd: &OwnedFd, len: u64) -> Result<Mapping, Errno> {
        let len = usize::try_from(len).map_err(|_| Errno::PROTO)?;
        if len == 0 {
            return Err(Errno::PROTO);
        }
        // SAFETY: a fresh mapping chosen by the kernel; the result is checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(Errno::last());
        }
        Ok(Mapping {
            base: base.cast(),
            len,
        })
    }

    /// Attaches to the doorbell table the daemon wrote at the start of the mapping, checking
    /// its header.
    pub fn doorbells(&self) -> Result<Doorbells, Errno> {
        // SAFETY: `base` is page aligned and `len` bytes are mapped for as long as `self`
        // lives; the caller keeps the mapping beside the handle and drops the handle first.
        unsafe { Doorbells::attach(self.base, self.len) }.map_err(|_| Errno::PROTO)
    }

    /// Attaches to the ring the daemon placed at `place`, checking that it lies inside the
    /// mapping and has the geometry the daemon announced.
    pub fn ring(&self, place: &RingPlace, producer: bool) -> Result<SharedRing, Errno> {
        let offset = usize::try_from(place.offset).map_err(|_| Errno::PROTO)?;
        if offset >= self.len || !offset.is_multiple_of(64) {
            return Err(Errno::PROTO);
        }
        // SAFETY: `offset < len`, so the pointer is inside the mapping, which outlives the
        // ring (see the type's doc); page-aligned base + 64-multiple offset is 64-aligned.
        let ring =
            unsafe { SharedRing::attach(self.base.add(offset), self.len - offset, producer) }
                .map_err(|_| Errno::PROTO)?;
        let g = ring.geometry();
        if g.slot_size != place.slot_size || g.slot_count != place.slot_count {
            return Err(Errno::PROTO);
        }
        Ok(ring)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `map` mapped, once.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// A memfd holding one initialised ring at offset 0, as the daemon sends it (for unit tests).
#[cfg(test)]
pub(crate) fn test_region(g: proto::ring::RingGeometry) -> (OwnedFd, u64) {
    use std::os::fd::FromRawFd;
    let len = 4096 * 4;
    // SAFETY: memfd_create with a valid NUL-terminated name; checked below.
    let fd = unsafe { libc::memfd_create(c"test-ring".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate on our own memfd.
    assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), len) }, 0);
    let m = Mapping::map(&fd, len as u64).unwrap();
    // SAFETY: the mapping is 16 KiB, page aligned, and outlives the handle.
    let _header_written = unsafe { SharedRing::init(m.base, g) };
    (fd, len as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::ring::RingGeometry;

    #[test]
    fn rings_are_checked_against_the_announced_place() {
        let g = RingGeometry::new(8, 64).unwrap();
        let (fd, len) = test_region(g);
        let m = Mapping::map(&fd, len).unwrap();
        let place = RingPlace {
            offset: 0,
            slot_size: g.slot_size,
            slot_count: g.slot_count,
        };
        let mut producer = m.ring(&place, true).unwrap();
        let mut consumer = m.ring(&place, false).unwrap();
        assert_eq!(producer.push(&[7; 10]), Ok(false));
        let mut out = [0u8; 64];
        assert_eq!(consumer.pop(&mut out), Ok(true));
        assert_eq!(out[..10], [7; 10]);

        let wrong_geometry = RingPlace {
            slot_count: 16,
            ..place
        };
        assert_eq!(m.ring(&wrong_geometry, true).err(), Some(Errno::PROTO));
        let outside = RingPlace {
            offset: len,
            ..place
        };
        assert_eq!(m.ring(&outside, true).err(), Some(Errno::PROTO));
        let misaligned = RingPlace { offset: 8, ..place };
        assert_eq!(m.ring(&misaligned, true).err(), Some(Errno::PROTO));
        // No ring header there: refused, not trusted.
        let empty = RingPlace {
            offset: 8192,
            ..place
        };
        assert_eq!(m.ring(&empty, true).err(), Some(Errno::PROTO));
        assert!(Mapping::map(&fd, 0).is_err());
    }
}
