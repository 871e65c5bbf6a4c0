//! What `softroce run` sets in the environment, besides `LD_PRELOAD` and `SOFTROCE_SOCKET`,
//! so that the RDMA stacks people run pick the softroce devices without being told
//! (docs/stacks.md has the reason for each):
//!
//! * `UCX_NET_DEVICES=<dev>:1,...`: UCX uses every network device it finds, TCP on each
//!   interface included, and would move bulk data over TCP beside the device; naming the
//!   softroce ports keeps its network traffic on them (shared memory within a host stays).
//! * `OMPI_MCA_pml_ucx_devices=<dev>:1,...`: Open MPI 4.1's `pml ucx` disqualifies itself unless
//!   a device matches this list, which defaults to `mlx*` (Mellanox only), so `mpirun` fell
//!   back to ob1/TCP.
//! * `OMPI_MCA_btl_openib_allow_ib=1` is *not* set: `btl openib` is deprecated in 4.1 and
//!   `pml ucx` is the path Open MPI takes to verbs.
//!
//! A variable the user set already is left as it is.

use proto::ctl::DeviceInfo;

/// One variable `softroce run` sets, and why (printed by `softroce run -v`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvSetting {
    pub name: &'static str,
    pub value: String,
    pub why: &'static str,
}

/// The variables for `devices`, leaving out those `is_set` says the user chose already.
pub fn stack_env(devices: &[DeviceInfo], is_set: &dyn Fn(&str) -> bool) -> Vec<EnvSetting> {
    if devices.is_empty() {
        return Vec::new();
    }
    let ports = devices
        .iter()
        .map(|d| format!("{}:1", d.name))
        .collect::<Vec<_>>()
        .join(",");
    [
        EnvSetting {
            name: "UCX_NET_DEVICES",
            value: ports.clone(),
            why: "UCX: use the softroce ports for network traffic (not TCP beside them)",
        },
        EnvSetting {
            name: "OMPI_MCA_pml_ucx_devices",
            value: ports,
            why: "Open MPI: pml ucx only runs on devices in this list (default mlx*)",
        },
    ]
    .into_iter()
    .filter(|s| !is_set(s.name))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::ctl::RoceVersion;

    fn dev(name: &str) -> DeviceInfo {
        DeviceInfo {
            name: name.into(),
            node_guid: 1,
            roce: RoceVersion::V2,
            max_mtu: 5,
            active_mtu: 5,
            port_active: true,
            gids: vec![],
            netdevs: vec![],
            max_cqe: 1,
            limits: Default::default(),
            speed_mbps: 100_000,
        }
    }

    #[test]
    fn every_device_port_is_named_and_user_settings_win() {
        let devices = [dev("srxe0"), dev("srxe1")];
        let all = stack_env(&devices, &|_| false);
        assert_eq!(all.len(), 2);
        assert!(all
            .iter()
            .all(|s| s.value == "srxe0:1,srxe1:1" && !s.why.is_empty()));
        let kept = stack_env(&devices, &|n| n == "UCX_NET_DEVICES");
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].name, "OMPI_MCA_pml_ucx_devices");
        assert!(stack_env(&[], &|_| false).is_empty());
    }
}
