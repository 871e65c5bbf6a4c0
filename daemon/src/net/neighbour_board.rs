//! What the L2 device's neighbour cache tells the CM thread: the peers whose Ethernet address
//! the device knows. rdma_cm address resolution on the L2 device waits for the peer's address,
//! as the kernel's does on a netdev (`dst_fetch_ha`): the CM thread asks the device thread to
//! resolve the peer (a message, which wakes it) and reads the answer here; the device thread
//! publishes its cache's resolved peers whenever they change (rarely: answers, give-ups).

use proto::iface::IpCidr;
use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Mutex;

/// The resolved peers of one L2 device, as its thread last published them, and the prefixes
/// of its link.
#[derive(Debug, Default)]
pub struct NeighbourBoard {
    resolved: Mutex<HashSet<IpAddr>>,
    on_link: Vec<IpCidr>,
}

impl NeighbourBoard {
    /// The board of a device whose link carries `prefixes` (its addresses' prefixes).
    pub fn new(prefixes: Vec<IpCidr>) -> NeighbourBoard {
        NeighbourBoard {
            resolved: Mutex::default(),
            on_link: prefixes,
        }
    }

    /// Whether `peer` is on the device's link: the device has no router, so a peer
    /// elsewhere is one no route reaches (the kernel's `ENETUNREACH`).
    pub fn on_link(&self, peer: IpAddr) -> bool {
        self.on_link.iter().any(|c| c.contains(&peer))
    }

    /// Whether the device knows `peer`'s Ethernet address.
    pub fn is_resolved(&self, peer: IpAddr) -> bool {
        self.resolved.lock().is_ok_and(|r| r.contains(&peer))
    }

    /// The device thread's side: the resolved peers now.
    pub fn publish(&self, resolved: impl Iterator<Item = IpAddr>) {
        if let Ok(mut r) = self.resolved.lock() {
            r.clear();
            r.extend(resolved);
        }
    }
}
