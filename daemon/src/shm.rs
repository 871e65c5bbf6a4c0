//! Shared memory for the rings between the daemon and a client: a sealed memfd that the
//! daemon creates, maps, initialises, and hands to the client over the control socket.
//!
//! The client is not trusted, so the memfd is sealed against shrinking and growing before the
//! client ever sees it: a client that could truncate it would make the daemon's next access
//! raise SIGBUS. The daemon never re-reads the ring geometry from shared memory.

use anyhow::{Context, Result};
use memmap2::MmapRaw;
use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use proto::ring::{RingGeometry, SharedRing};
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};

/// A sealed, fixed-size memfd mapped into the daemon. The daemon gives its descriptor to the
/// client ([`SharedRegion::take_fd`]) and keeps only the mapping, so that a client with 10,000
/// QPs does not cost the daemon 10,000 open files.
#[derive(Debug)]
pub struct SharedRegion {
    file: Option<File>,
    map: MmapRaw,
}

impl SharedRegion {
    /// Creates a zeroed region of `len` bytes (rounded up to a page).
    pub fn create(name: &str, len: usize) -> Result<SharedRegion> {
        let page = 4096;
        let len = len.div_ceil(page) * page;
        let cname = CString::new(format!("softroce-{name}")).context("memfd name")?;
        let fd = memfd_create(
            &cname,
            MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING,
        )
        .context("memfd_create")?;
        let file = File::from(fd);
        file.set_len(len as u64).context("sizing the memfd")?;
        fcntl(
            file.as_raw_fd(),
            FcntlArg::F_ADD_SEALS(
                SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL,
            ),
        )
        .context("sealing the memfd")?;
        let map = MmapRaw::map_raw(&file).context("mapping the memfd")?;
        Ok(SharedRegion {
            file: Some(file),
            map,
        })
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Never true: regions are at least a page.
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// The descriptor, until it is taken.
    #[cfg(test)]
    pub fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.file.as_ref().map(std::os::fd::AsFd::as_fd)
    }

    /// A duplicate of the descriptor (for a region sent to the client more than once), while
    /// the region still has it.
    pub fn dup_fd(&self) -> Option<OwnedFd> {
        self.file
            .as_ref()
            .and_then(|f| f.try_clone().ok())
            .map(OwnedFd::from)
    }

    /// Gives the descriptor away (to be sent to the client); the mapping stays.
    pub fn take_fd(&mut self) -> Option<OwnedFd> {
        self.file.take().map(OwnedFd::from)
    }

    /// The mapping's first byte (page aligned), for tables laid out by the caller.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// Initialises a ring at `offset` and returns the daemon's handle on it.
    pub fn init_ring(&self, offset: usize, geometry: RingGeometry) -> Result<SharedRing> {
        anyhow::ensure!(
            offset.is_multiple_of(64) && offset + geometry.byte_len() <= self.len(),
            "ring does not fit the region"
        );
        // SAFETY: the range lies inside our mapping (checked above), which is 64-byte aligned
        // (page aligned) and lives as long as `self`; the caller keeps the region alive for
        // as long as the ring handle (both live in the same queue object).
        Ok(unsafe { SharedRing::init(self.map.as_mut_ptr().add(offset), geometry) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_mapping_sees_the_ring_and_cannot_shrink_it() {
        let g = RingGeometry::new(16, 128).unwrap();
        let region = SharedRegion::create("test", g.byte_len()).unwrap();
        let mut daemon_side = region.init_ring(0, g).unwrap();

        // The "client": its own mapping of the same memfd, as after SCM_RIGHTS.
        let client_file = File::from(region.fd().unwrap().try_clone_to_owned().unwrap());
        let client_map = MmapRaw::map_raw(&client_file).unwrap();
        // SAFETY: the mapping is page aligned, covers the ring and outlives the handle.
        let mut client =
            unsafe { SharedRing::attach(client_map.as_mut_ptr(), client_map.len(), true) }.unwrap();
        for i in 0..10u8 {
            client.push(&[i; 100]).unwrap();
        }
        let mut out = [0u8; 128];
        for i in 0..10u8 {
            assert!(daemon_side.pop(&mut out).unwrap());
            assert_eq!(out[..100], [i; 100]);
        }
        assert!(client_file.set_len(0).is_err(), "sealed against shrinking");
        assert!(
            client_file.set_len(1 << 30).is_err(),
            "sealed against growing"
        );
        assert!(region
            .init_ring(64, RingGeometry::new(1 << 20, 64).unwrap())
            .is_err());
    }
}
