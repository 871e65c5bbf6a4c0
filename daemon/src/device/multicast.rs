//! UD multicast membership: which QPs of the device are attached to which IP multicast group.
//! The device joins a group on the network through its link for the first attachment and
//! leaves it with the last (rxe_mcast_add / rxe_mcast_del); packets to a group reach every
//! engine, each of which delivers to its own attached QPs (`receive::deliver_packet`).

use super::DeviceThread;
use std::collections::BTreeSet;
use std::net::IpAddr;
use tracing::{info, warn};

/// One multicast group of a device: whether the link joined it on the network (it may not:
/// an IPv6 group, or a device bound to the wildcard address; the device's own QPs still get
/// its own multicast sends) and the QPs attached to it.
pub(super) struct JoinedGroup {
    on_network: bool,
    members: BTreeSet<(u64, u32)>,
}

impl DeviceThread {
    /// Attaches QP `qpn` of `client` to `group`, joining it on the network for the device's
    /// first attachment to it.
    pub(super) fn group_attach(&mut self, client: u64, qpn: u32, group: IpAddr) {
        let (name, link) = (&self.info.name, &mut self.link);
        let joined = self.groups.entry(group).or_insert_with(|| {
            let on_network = match link.join_group(group) {
                Ok(()) => {
                    info!(device = %name, %group, "multicast group joined");
                    true
                }
                Err(e) => {
                    warn!(device = %name, %group, "multicast group not joined on the network: {e}");
                    false
                }
            };
            JoinedGroup {
                on_network,
                members: BTreeSet::new(),
            }
        });
        joined.members.insert((client, qpn));
    }

    /// Drops the attachments `gone` selects (of `group`, or of every group) and leaves the
    /// groups that have none left.
    pub(super) fn group_detach(
        &mut self,
        gone: impl Fn((u64, u32)) -> bool,
        group: Option<IpAddr>,
    ) {
        let (name, link) = (&self.info.name, &mut self.link);
        self.groups.retain(|g, joined| {
            if group.is_none_or(|only| only == *g) {
                joined.members.retain(|&m| !gone(m));
            }
            let keep = !joined.members.is_empty();
            if !keep && joined.on_network {
                link.leave_group(*g);
                info!(device = %name, group = %g, "multicast group left");
            }
            keep
        });
    }
}
