//! A device as the CM thread sees it: its addresses and GIDs, its ib_cm endpoint, the GSI QP's
//! PSN, the way its MADs leave, and the RoCE version of the MADs exchanged with each peer.

use super::random_u32;
use crate::gsi::DeviceSender;
use crate::net::neighbour_board::NeighbourBoard;
use proto::cm::{CmEndpoint, EndpointConfig};
use proto::ctl::{self, DeviceInfo, RoceVersion};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

/// A device as the CM sees it.
#[derive(Debug, Clone)]
pub struct CmDeviceSetup {
    pub info: DeviceInfo,
    /// The GID type rdma_cm uses on this device (configfs `default_roce_mode`).
    pub default_roce_mode: RoceVersion,
    /// `CMA_CM_RESPONSE_TIMEOUT` and `CMA_MAX_CM_RETRIES` of the REQs this device sends.
    pub cm_response_timeout: u8,
    pub cm_max_retries: u8,
    /// The kernel's routing table decides where the device's packets go (a UDP device, not
    /// the L2 device, which routes within its own stack): address resolution asks it for a
    /// route to the peer first, as the kernel's `addr_resolve` does.
    pub kernel_routes: bool,
    /// The L2 device's resolved peers: address resolution waits for the peer's Ethernet
    /// address there, as on a kernel netdev.
    pub neighbours: Option<Arc<NeighbourBoard>>,
}

/// A device's CM state.
pub(super) struct CmDevice {
    pub(super) setup: CmDeviceSetup,
    pub(super) addrs: Vec<IpAddr>,
    pub(super) endpoint: CmEndpoint,
    /// The GSI QP's next PSN.
    pub(super) psn: u32,
    pub(super) send: DeviceSender,
    /// The RoCE version of the MADs exchanged with each peer: what its last MAD came in (a
    /// passive side answers in the REQ's version, facts §7.2), or what our own connection to
    /// it uses (the id's GID type). Kept per peer address, so one peer's rdma_cm connections
    /// to this device share one version at a time.
    pub(super) peer_types: HashMap<IpAddr, RoceVersion>,
}

impl CmDevice {
    pub(super) fn new(setup: CmDeviceSetup, send: DeviceSender) -> CmDevice {
        let mut cfg = EndpointConfig::new(setup.info.node_guid, random_u32(), random_u32());
        cfg.first_id = random_u32();
        CmDevice {
            addrs: setup.info.gid_addrs(),
            setup,
            endpoint: CmEndpoint::new(cfg),
            psn: 0,
            send,
            peer_types: HashMap::new(),
        }
    }

    /// The device's address to use toward `peer`: the peer itself when it is ours (the device
    /// talks to itself), else the first address of the peer's family and scope (a link-local
    /// `fe80::` address only toward a link-local peer, as the kernel's source selection),
    /// else of its family.
    pub(super) fn local_for(&self, peer: IpAddr) -> Option<IpAddr> {
        if self.addrs.contains(&peer) {
            return Some(peer);
        }
        let link_local = |a: &IpAddr| matches!(a, IpAddr::V6(v6) if v6.is_unicast_link_local());
        let family = |a: &&IpAddr| a.is_ipv4() == peer.is_ipv4();
        self.addrs
            .iter()
            .filter(family)
            .find(|a| link_local(a) == link_local(&peer))
            .or_else(|| self.addrs.iter().find(family))
            .copied()
    }

    #[cfg(test)]
    pub(super) fn gid_index(&self, ip: IpAddr) -> u32 {
        self.gid_index_of(ip, self.setup.default_roce_mode)
    }

    /// The index of `ip`'s GID of type `roce` (a `--roce both` device lists every address
    /// once per type), else of any type.
    pub(super) fn gid_index_of(&self, ip: IpAddr, roce: RoceVersion) -> u32 {
        let gid = ctl::gid_of(ip);
        let entries = &self.setup.info.gids;
        entries
            .iter()
            .find(|g| g.gid == gid && g.roce == roce)
            .or_else(|| entries.iter().find(|g| g.gid == gid))
            .map_or(0, |g| g.index)
    }

    /// The version MADs to `peer` go in.
    pub(super) fn mad_version(&self, peer: IpAddr) -> RoceVersion {
        self.peer_types
            .get(&peer)
            .copied()
            .unwrap_or(self.setup.default_roce_mode)
    }
}
