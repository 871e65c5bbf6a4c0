//! A client's doorbell table on this device ([`proto::ring::doorbell`]): which of its rings
//! have work, so that the device thread reads those and no others. The table lives in a
//! sealed memfd the client maps (sent with every `OpenContext` answer); each QP (its send and
//! receive queues share one) and each SRQ gets a doorbell index, handed out from a slab and
//! used again once its object is gone (a bit left over from the old owner only makes the
//! device look at the new owner's rings once).

use crate::shm::SharedRegion;
use anyhow::Result;
use proto::ring::doorbell::{table_len, Doorbells, PortState, MAX_DOORBELLS};
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

    /// Publishes port 1's state, active MTU and GID table generation to the client's
    /// contexts (`ibv_query_port`, `ibv_query_gid`).
    pub fn set_port(&self, port: PortState) {
        self.bells.set_port(port);
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

#[cfg(test)]
mod tests {
    use super::*;
    use memmap2::MmapRaw;

    /// The client's side of the table, mapped from the descriptor the daemon shares.
    fn client_side(t: &DoorbellTable) -> (Doorbells, MmapRaw) {
        let (fd, len) = t.share().expect("a descriptor");
        let map = MmapRaw::map_raw(&std::fs::File::from(fd)).unwrap();
        assert!(map.len() as u64 >= len);
        // SAFETY: the mapping is page aligned and outlives the handle (returned together,
        // the handle dropped first by the callers' declaration order).
        let bells = unsafe { Doorbells::attach(map.as_mut_ptr(), map.len()) }.unwrap();
        (bells, map)
    }

    #[test]
    fn rung_doorbells_name_their_rings_and_freed_ones_are_used_again() {
        let mut t = DoorbellTable::new().unwrap();
        let (client, _map) = client_side(&t);
        let a = t.add(Bell::Qp(0x10002)).unwrap();
        let b = t.add(Bell::Srq(7)).unwrap();
        let c = t.add(Bell::Qp(0x10003)).unwrap();
        let mut out = Vec::new();
        t.take(&mut out);
        assert!(out.is_empty(), "nothing rang");
        client.ring(c);
        client.ring(b);
        client.ring(c);
        t.take(&mut out);
        out.sort();
        assert_eq!(out, [Bell::Qp(0x10003), Bell::Srq(7)]);
        out.clear();
        // A QP gone: its doorbell names nothing, then the next QP's.
        client.ring(a);
        t.remove(a);
        t.take(&mut out);
        assert!(out.is_empty(), "a removed doorbell names nothing");
        assert_eq!(t.add(Bell::Qp(0x10004)), Some(a), "the slot is used again");
        client.ring(a);
        t.take(&mut out);
        assert_eq!(out, [Bell::Qp(0x10004)]);
        // Asleep: the client is told to write the eventfd; awake: not.
        assert!(!t.prepare_sleep());
        assert!(client.ring(b), "the device sleeps");
        t.awake();
        assert!(!client.ring(b));
        assert!(t.prepare_sleep(), "a doorbell rang: do not sleep");
    }
}
