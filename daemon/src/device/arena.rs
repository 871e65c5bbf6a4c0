//! Where a client's rings live: small ring regions (a QP's two rings, a CQ's, an SRQ's) are
//! carved out of a few shared memfds per client and device ("chunks") instead of a memfd each.
//!
//! A mapping per object would cost every process one VMA per QP, and the kernel allows 65,530
//! per process (`vm.max_map_count`): the daemon, which maps every client's rings, could not hold
//! 100,000 QPs, nor could one client. Chunks of 4 MiB hold regions of one size class each (4 KiB
//! to 256 KiB, powers of two), handed out and taken back in O(1) from a free list; a region
//! larger than that gets a memfd of its own, as before (its memory outweighs its mapping). The
//! client maps each chunk once: a response names the chunk (`region`) and sends its descriptor
//! again each time, and the shim keeps the mapping it already has.
//!
//! A chunk belongs to one client, so a region used again holds only that client's old ring
//! bytes; every ring's header is written afresh ([`SharedRing::init`]) and its slots are read
//! only once the client published them. A client may write anywhere in its chunks (as in its
//! own rings before): it can only disturb its own queues, which the daemon reads as untrusted.

use crate::shm::SharedRegion;
use anyhow::Result;
use proto::ring::{RingGeometry, SharedRing};
use std::os::fd::OwnedFd;

/// Bytes of one chunk.
const CHUNK_LEN: usize = 4 << 20;
/// The smallest size class, and the number of classes (4 KiB .. 256 KiB).
const MIN_CLASS_LEN: usize = 4096;
const CLASSES: usize = 7;

/// Where one object's rings are.
#[derive(Debug)]
pub(super) enum RingMemory {
    /// A memfd of its own (larger than the largest class).
    Own(SharedRegion),
    /// Class `class`'s region at `offset` in chunk `chunk`.
    Shared {
        chunk: u32,
        offset: usize,
        class: u8,
    },
}

#[derive(Debug, Default)]
struct Class {
    /// Regions given back: (chunk, offset).
    free: Vec<(u32, usize)>,
    /// The chunk being filled, and the regions of it handed out so far.
    filling: Option<(u32, usize)>,
}

/// One client's ring memory on one device.
#[derive(Debug, Default)]
pub(super) struct RingArena {
    chunks: Vec<SharedRegion>,
    classes: [Class; CLASSES],
}

fn class_of(len: usize) -> Option<usize> {
    let class_len = len.max(MIN_CLASS_LEN).checked_next_power_of_two()?;
    let class = (class_len / MIN_CLASS_LEN).trailing_zeros() as usize;
    (class < CLASSES).then_some(class)
}

fn class_len(class: usize) -> usize {
    MIN_CLASS_LEN << class
}

impl RingArena {
    /// Memory for `len` bytes of rings.
    pub fn alloc(&mut self, name: &str, len: usize) -> Result<RingMemory> {
        let Some(class) = class_of(len) else {
            return Ok(RingMemory::Own(SharedRegion::create(name, len)?));
        };
        let c = &mut self.classes[class];
        if let Some((chunk, offset)) = c.free.pop() {
            return Ok(RingMemory::Shared {
                chunk,
                offset,
                class: class as u8,
            });
        }
        let per_chunk = CHUNK_LEN / class_len(class);
        let (chunk, used) = match c.filling {
            Some((chunk, used)) if used < per_chunk => (chunk, used),
            _ => {
                let chunk = u32::try_from(self.chunks.len())?;
                self.chunks.push(SharedRegion::create("rings", CHUNK_LEN)?);
                (chunk, 0)
            }
        };
        self.classes[class].filling = Some((chunk, used + 1));
        Ok(RingMemory::Shared {
            chunk,
            offset: used * class_len(class),
            class: class as u8,
        })
    }

    /// Takes back what [`RingArena::alloc`] gave (a region of its own is unmapped).
    pub fn free(&mut self, memory: RingMemory) {
        if let RingMemory::Shared {
            chunk,
            offset,
            class,
        } = memory
        {
            self.classes[usize::from(class)].free.push((chunk, offset));
        }
    }

    /// Bytes of ring memory `memory` counts for (the caps of `limits`).
    pub fn charged(memory: &RingMemory) -> u64 {
        match memory {
            RingMemory::Own(r) => r.len() as u64,
            RingMemory::Shared { class, .. } => class_len(usize::from(*class)) as u64,
        }
    }

    /// Bytes the client maps for `memory` (the chunk's, or its own region's), and the offset
    /// of `memory` in it.
    pub fn placement(&self, memory: &RingMemory) -> (u64, usize) {
        match memory {
            RingMemory::Own(r) => (r.len() as u64, 0),
            RingMemory::Shared { offset, .. } => (CHUNK_LEN as u64, *offset),
        }
    }

    /// How a response names the memory: 0 for a region of its own, else the chunk's number + 1.
    pub fn region_id(memory: &RingMemory) -> u32 {
        match memory {
            RingMemory::Own(_) => 0,
            RingMemory::Shared { chunk, .. } => chunk + 1,
        }
    }

    /// Initialises a ring at `offset` inside `memory`, of at most `room` bytes from there.
    pub fn init_ring(
        &self,
        memory: &RingMemory,
        offset: usize,
        geometry: RingGeometry,
    ) -> Result<SharedRing> {
        let (region, base, room) = match memory {
            RingMemory::Own(r) => (r, 0, r.len()),
            RingMemory::Shared {
                chunk,
                offset,
                class,
            } => (
                self.chunks
                    .get(*chunk as usize)
                    .ok_or_else(|| anyhow::anyhow!("no such chunk"))?,
                *offset,
                class_len(usize::from(*class)),
            ),
        };
        anyhow::ensure!(
            offset + geometry.byte_len() <= room,
            "ring does not fit its region"
        );
        region.init_ring(base + offset, geometry)
    }

    /// The descriptor to send with the response: a region of its own gives its own away (the
    /// daemon keeps the mapping); a chunk's is duplicated, the daemon keeps it for the next.
    pub fn fd_for(&self, memory: &mut RingMemory) -> Vec<OwnedFd> {
        match memory {
            RingMemory::Own(r) => r.take_fd().into_iter().collect(),
            RingMemory::Shared { chunk, .. } => self
                .chunks
                .get(*chunk as usize)
                .and_then(SharedRegion::dup_fd)
                .into_iter()
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_regions_share_chunks_and_are_used_again() {
        let mut a = RingArena::default();
        let m1 = a.alloc("t", 3584).unwrap();
        let m2 = a.alloc("t", 4096).unwrap();
        let big = a.alloc("t", 300 * 1024).unwrap();
        assert!(matches!(big, RingMemory::Own(_)));
        assert_eq!(RingArena::region_id(&big), 0);
        let (
            RingMemory::Shared {
                chunk: c1,
                offset: o1,
                ..
            },
            RingMemory::Shared {
                chunk: c2,
                offset: o2,
                ..
            },
        ) = (&m1, &m2)
        else {
            panic!("small regions are carved");
        };
        assert_eq!((c1, c2, *o1, *o2), (&0, &0, 0, 4096));
        assert_eq!(RingArena::charged(&m1), 4096);
        // A ring fits its region and no further.
        let g = RingGeometry::new(16, 128).unwrap();
        assert!(a.init_ring(&m1, 0, g).is_ok());
        assert!(a.init_ring(&m1, 4096 - 64, g).is_err());
        let mut m1 = m1;
        assert_eq!(a.fd_for(&mut m1).len(), 1, "the chunk's descriptor, again");
        a.free(m1);
        let m3 = a.alloc("t", 1000).unwrap();
        assert!(matches!(
            m3,
            RingMemory::Shared {
                chunk: 0,
                offset: 0,
                ..
            }
        ));
        // 1,024 regions of 4 KiB per chunk: the next ones go to a new chunk.
        let more: Vec<_> = (0..1023).map(|_| a.alloc("t", 4096).unwrap()).collect();
        assert!(matches!(
            more.last(),
            Some(RingMemory::Shared { chunk: 1, .. })
        ));
        assert_eq!(a.chunks.len(), 2);
        // A 64 KiB class gets chunks of its own.
        let m = a.alloc("t", 40_000).unwrap();
        assert!(matches!(
            m,
            RingMemory::Shared {
                chunk: 2,
                offset: 0,
                class: 4
            }
        ));
    }
}
