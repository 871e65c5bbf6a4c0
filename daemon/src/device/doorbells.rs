//! A client's doorbell table on this device ([`proto::ring::doorbell`]): which of its rings
//! have work, so that the device thread reads those and no others. The table lives in a
//! sealed memfd the client maps (sent with every `OpenContext` answer); each QP (its send and
//! receive queues share one) and each SRQ gets a doorbell index, handed out from a slab and
//! used again once its object is gone (a bit left over from the old owner only makes the
//! device look at the new owner's rings once).

use crate::shm::SharedRegion;
use anyhow::Result;
use proto::ring::doorbell::{table_len, Doorbells, MAX_DOORBELLS};
use slab::Slab;
use std::os::fd::OwnedFd;

/// A ring (or a QP's pair of rings) a doorbell stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Bell {
    Qp(u32),
    Srq(u32),
}

pub(super) struct DoorbellTable {
    region: SharedRegion,
    bells: Doorbells,
    owners: Slab<Bell>,
}

impl DoorbellTable {
    pub fn new() -> Result<DoorbellTable> {
        let region = SharedRegion::create("doorbells", table_len(MAX_DOORBELLS))?;
        // SAFETY: the region is page aligned, zeroed, holds table_len(MAX_DOORBELLS) bytes and
        // lives as long as the handle (both in this struct, the handle declared after it is
        // dropped after it: neither has a Drop that touches the other).
        let bells = unsafe { Doorbells::init(region.as_mut_ptr(), MAX_DOORBELLS) };
        Ok(DoorbellTable {
            region,
            bells,
            owners: Slab::new(),
        })
    }

    /// The table's descriptor for a context of the client, and the bytes to map.
    pub fn share(&self) -> Option<(OwnedFd, u64)> {
        self.region
            .dup_fd()
            .map(|fd| (fd, self.region.len() as u64))
    }

    /// A doorbell for `bell`, or `None` when every one is taken.
    pub fn add(&mut self, bell: Bell) -> Option<u32> {
        if self.owners.vacant_key() >= self.bells.capacity() as usize {
            return None;
        }
        Some(self.owners.insert(bell) as u32)
    }

    pub fn remove(&mut self, index: u32) {
        self.owners.try_remove(index as usize);
    }

    /// Appends the rings whose doorbell was rung to `out`, clearing the doorbells.
    pub fn take(&self, out: &mut Vec<Bell>) {
        self.bells.take(|i| {
            if let Some(b) = self.owners.get(i as usize) {
                out.push(*b);
            }
        });
    }

    /// The device is about to sleep: true if a doorbell rang meanwhile (then it must not).
    pub fn prepare_sleep(&self) -> bool {
        self.bells.prepare_sleep()
    }

    pub fn awake(&self) {
        self.bells.awake();
    }
}
