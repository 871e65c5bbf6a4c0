//! What the shim knows about each device: a plain description ([`DeviceDescription`]) produced
//! by a [`DeviceSource`].
//!
//! Today the only source is [`BuiltinSource`], a fixed `srxe0` that answers like kernel rxe
//! (values from `ibv_devinfo -v` on rxe, shared/captures/devinfo/rxe1-ibv_devinfo-v.txt, and
//! roce-rxe-facts.md §6.1) bound to loopback. The seam for the daemon is [`source_from_env`]:
//! once the control protocol exists, a `DaemonSource` that asks the daemon at
//! `$SOFTROCE_SOCKET` for its device list slots in there without touching the verbs code.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::abi::*;

/// One GID table entry (IBTA 4.1; RoCE: roce-rxe-facts.md §7.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidDescription {
    pub gid: [u8; 16],
    /// `enum ibv_gid_type` value (rxe: only [`IBV_GID_TYPE_ROCE_V2`]).
    pub gid_type: u32,
    /// Kernel ifindex of the netdev the GID came from.
    pub ndev_ifindex: u32,
}

impl GidDescription {
    /// RoCE v2 GID for an IPv4 address: the IPv4-mapped IPv6 address `::ffff:a.b.c.d`.
    pub fn roce_v2_ipv4(addr: Ipv4Addr, ndev_ifindex: u32) -> Self {
        Self {
            gid: addr.to_ipv6_mapped().octets(),
            gid_type: IBV_GID_TYPE_ROCE_V2,
            ndev_ifindex,
        }
    }

    /// RoCE v2 GID for an IPv6 address: the address itself.
    pub fn roce_v2_ipv6(addr: Ipv6Addr, ndev_ifindex: u32) -> Self {
        Self {
            gid: addr.octets(),
            gid_type: IBV_GID_TYPE_ROCE_V2,
            ndev_ifindex,
        }
    }

    /// The default GID (index 0): `fe80::` + the modified EUI-64 of the port's MAC.
    pub fn link_local_default(mac: [u8; 6], ndev_ifindex: u32) -> Self {
        let mut gid = [0u8; 16];
        gid[0] = 0xfe;
        gid[1] = 0x80;
        gid[8..].copy_from_slice(&eui64_from_mac(mac));
        Self {
            gid,
            gid_type: IBV_GID_TYPE_ROCE_V2,
            ndev_ifindex,
        }
    }
}

/// Modified EUI-64 of a MAC (RFC 4291 appendix A): flip the U/L bit, insert ff:fe. rxe derives
/// node_guid and the default GID this way from the netdev MAC.
pub fn eui64_from_mac(mac: [u8; 6]) -> [u8; 8] {
    [
        mac[0] ^ 0x02,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ]
}

/// One port of a device: the `ibv_port_attr` values plus its GID and P_Key tables.
#[derive(Clone, Debug)]
pub struct PortDescription {
    pub attr: IbvPortAttr,
    /// GID table, indexed by GID index. `None` is an empty slot; the table's advertised length is
    /// `attr.gid_tbl_len`, entries past this vector are empty too.
    pub gids: Vec<Option<GidDescription>>,
    /// P_Key table in host order (rxe: one entry, the default 0xffff).
    pub pkeys: Vec<u16>,
}

/// Everything the verbs need to list, open and query one device.
#[derive(Clone, Debug)]
pub struct DeviceDescription {
    /// `ibv_device.name`, e.g. `srxe0` (at most 63 bytes).
    pub name: String,
    /// Node GUID as it appears on the wire (big-endian byte order).
    pub node_guid: [u8; 8],
    /// Device attributes as `ibv_query_device_ex` reports them. `orig_attr.node_guid` and
    /// `phys_port_cnt` are filled in from the other fields when the device is built.
    pub attr: IbvDeviceAttrEx,
    /// Ports, numbered from 1.
    pub ports: Vec<PortDescription>,
    pub num_comp_vectors: i32,
}

/// Where device descriptions come from.
pub trait DeviceSource: Send + Sync {
    /// The devices this process should see, in `ibv_get_device_list` order.
    fn devices(&self) -> Vec<DeviceDescription>;
}

/// Picks the device source for this process. This is the seam for the daemon: when
/// `$SOFTROCE_SOCKET` names a control socket, devices will be read from the daemon there.
/// Until that protocol exists every process gets the built-in loopback device.
pub fn source_from_env() -> Box<dyn DeviceSource> {
    Box::new(BuiltinSource)
}

/// The built-in device: `srxe0`, a RoCE v2 port on loopback.
#[derive(Clone, Copy, Debug, Default)]
pub struct BuiltinSource;

/// Locally administered MAC the built-in device pretends to have ("SRXE" in the middle).
pub const BUILTIN_MAC: [u8; 6] = [0x02, 0x53, 0x52, 0x58, 0x45, 0x00];
/// ifindex of `lo`.
const LOOPBACK_IFINDEX: u32 = 1;

impl DeviceSource for BuiltinSource {
    fn devices(&self) -> Vec<DeviceDescription> {
        vec![rxe_like_device("srxe0", BUILTIN_MAC, loopback_port())]
    }
}

/// kernel rxe's `active_mtu`: the IB MTU enum for (netdev MTU - RoCE headers), capped at 4096
/// (rxe_net.c: `eth_mtu_int(ndev->mtu)` via `ib_mtu_int_to_enum`).
pub fn rxe_active_mtu(netdev_mtu: u32) -> i32 {
    // rxe keeps 80 bytes of the netdev MTU for the IP/UDP/BTH/extended headers and ICRC
    // (roce-rxe-facts.md §6.1: 1500 -> 1024, 9000 -> 4096).
    let payload = netdev_mtu.saturating_sub(80);
    match payload {
        p if p >= 4096 => IBV_MTU_4096,
        p if p >= 2048 => IBV_MTU_2048,
        p if p >= 1024 => IBV_MTU_1024,
        p if p >= 512 => IBV_MTU_512,
        _ => IBV_MTU_256,
    }
}

/// The loopback port: `lo` has MTU 65536 (so active_mtu 4096), addresses 127.0.0.1 and ::1.
fn loopback_port() -> PortDescription {
    let mut attr = rxe_port_attr();
    attr.active_mtu = rxe_active_mtu(65536);
    PortDescription {
        attr,
        gids: vec![
            Some(GidDescription::link_local_default(
                BUILTIN_MAC,
                LOOPBACK_IFINDEX,
            )),
            Some(GidDescription::roce_v2_ipv4(
                Ipv4Addr::LOCALHOST,
                LOOPBACK_IFINDEX,
            )),
            Some(GidDescription::roce_v2_ipv6(
                Ipv6Addr::LOCALHOST,
                LOOPBACK_IFINDEX,
            )),
        ],
        pkeys: vec![0xffff],
    }
}

/// Port attributes of an rxe port whose netdev is up (capture rxe1, facts §6.1).
pub fn rxe_port_attr() -> IbvPortAttr {
    IbvPortAttr {
        state: IBV_PORT_ACTIVE,
        max_mtu: IBV_MTU_4096,
        active_mtu: IBV_MTU_1024,
        gid_tbl_len: 1024,
        port_cap_flags: IBV_PORT_CM_SUP,
        // The rdma-core 44 / kernel 6.1 capture shows 0x800000 (newer kernels: 0x80000000).
        max_msg_sz: 0x80_0000,
        bad_pkey_cntr: 0,
        qkey_viol_cntr: 0,
        pkey_tbl_len: 1,
        lid: 0,
        sm_lid: 0,
        lmc: 0,
        max_vl_num: 1,
        sm_sl: 0,
        subnet_timeout: 0,
        init_type_reply: 0,
        active_width: 1, // 1X
        active_speed: 1, // 2.5 Gbps (SDR)
        phys_state: 5,   // LINK_UP
        link_layer: IBV_LINK_LAYER_ETHERNET,
        flags: 0,
        port_cap_flags2: 0,
    }
}

/// rxe's device_cap_flags as rdma-core 44 reports them on kernel 6.1 (0x01223c76).
pub const RXE_DEVICE_CAP_FLAGS: u32 = IBV_DEVICE_BAD_PKEY_CNTR
    | IBV_DEVICE_BAD_QKEY_CNTR
    | IBV_DEVICE_AUTO_PATH_MIG
    | IBV_DEVICE_CHANGE_PHY_PORT
    | IBV_DEVICE_UD_AV_PORT_ENFORCE
    | IBV_DEVICE_PORT_ACTIVE_EVENT
    | IBV_DEVICE_SYS_IMAGE_GUID
    | IBV_DEVICE_RC_RNR_NAK_GEN
    | IBV_DEVICE_SRQ_RESIZE
    | IBV_DEVICE_MEM_WINDOW
    | IBV_DEVICE_MEM_MGT_EXTENSIONS
    | IBV_DEVICE_MEM_WINDOW_TYPE_2B;

/// A device with kernel rxe's limits (rxe_param.h; capture rxe1-ibv_devinfo-v.txt).
pub fn rxe_like_device(name: &str, mac: [u8; 6], port: PortDescription) -> DeviceDescription {
    let node_guid = eui64_from_mac(mac);
    let mut fw_ver = [0 as libc::c_char; 64];
    for (dst, src) in fw_ver.iter_mut().zip(b"0.0.0") {
        *dst = *src as libc::c_char;
    }
    let orig_attr = IbvDeviceAttr {
        fw_ver,
        node_guid: u64::from_ne_bytes(node_guid),
        sys_image_guid: u64::from_ne_bytes(node_guid),
        max_mr_size: u64::MAX,
        page_size_cap: 0xffff_f000,
        vendor_id: 0xff_ffff,
        vendor_part_id: 0,
        hw_ver: 0,
        max_qp: 1_048_560,
        max_qp_wr: 1_048_576,
        device_cap_flags: RXE_DEVICE_CAP_FLAGS,
        max_sge: 32,
        max_sge_rd: 32,
        max_cq: 1_048_576,
        max_cqe: 32767,
        max_mr: 524_287,
        max_pd: 1_048_576,
        max_qp_rd_atom: 128,
        max_ee_rd_atom: 0,
        max_res_rd_atom: 258_048,
        max_qp_init_rd_atom: 128,
        max_ee_init_rd_atom: 0,
        atomic_cap: IBV_ATOMIC_HCA,
        max_ee: 0,
        max_rdd: 0,
        max_mw: 524_287,
        max_raw_ipv6_qp: 0,
        max_raw_ethy_qp: 0,
        max_mcast_grp: 8192,
        max_mcast_qp_attach: 56,
        max_total_mcast_qp_attach: 458_752,
        max_ah: 32767,
        max_fmr: 0,
        max_map_per_fmr: 0,
        max_srq: 917_503,
        max_srq_wr: 1_048_576,
        max_srq_sge: 27,
        max_pkeys: 64,
        local_ca_ack_delay: 15,
        phys_port_cnt: 1,
    };
    let attr = IbvDeviceAttrEx {
        orig_attr,
        comp_mask: 0,
        odp_caps: IbvOdpCaps::default(),
        completion_timestamp_mask: 0,
        hca_core_clock: 0,
        device_cap_flags_ex: u64::from(RXE_DEVICE_CAP_FLAGS),
        tso_caps: IbvTsoCaps::default(),
        rss_caps: IbvRssCaps::default(),
        max_wq_type_rq: 0,
        packet_pacing_caps: IbvPacketPacingCaps::default(),
        raw_packet_caps: 0,
        tm_caps: IbvTmCaps::default(),
        cq_mod_caps: IbvCqModerationCaps::default(),
        max_dm_size: 0,
        pci_atomic_caps: IbvPciAtomicCaps::default(),
        xrc_odp_caps: 0,
        phys_port_cnt_ex: 1,
    };
    DeviceDescription {
        name: name.to_owned(),
        node_guid,
        attr,
        ports: vec![port],
        num_comp_vectors: 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eui64_matches_rxe_capture() {
        // capture: MAC 52:54:00:4c:ab:01 -> node_guid 5054:00ff:fe4c:ab01
        assert_eq!(
            eui64_from_mac([0x52, 0x54, 0x00, 0x4c, 0xab, 0x01]),
            [0x50, 0x54, 0x00, 0xff, 0xfe, 0x4c, 0xab, 0x01]
        );
        let gid = GidDescription::link_local_default([0x52, 0x54, 0x00, 0x4c, 0xab, 0x01], 2);
        assert_eq!(
            std::net::Ipv6Addr::from(gid.gid).to_string(),
            "fe80::5054:ff:fe4c:ab01"
        );
    }

    #[test]
    fn ipv4_gid_is_v4_mapped() {
        let gid = GidDescription::roce_v2_ipv4(Ipv4Addr::new(10, 77, 0, 11), 2);
        assert_eq!(
            gid.gid,
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 11]
        );
        assert_eq!(gid.gid_type, IBV_GID_TYPE_ROCE_V2);
    }

    #[test]
    fn active_mtu_follows_rxe() {
        assert_eq!(rxe_active_mtu(1500), IBV_MTU_1024);
        assert_eq!(rxe_active_mtu(9000), IBV_MTU_4096);
        assert_eq!(rxe_active_mtu(65536), IBV_MTU_4096);
        assert_eq!(rxe_active_mtu(0), IBV_MTU_256);
    }

    #[test]
    fn builtin_device_matches_rxe_capture() {
        let devs = BuiltinSource.devices();
        assert_eq!(devs.len(), 1);
        let d = &devs[0];
        assert_eq!(d.name, "srxe0");
        assert_eq!(d.attr.orig_attr.device_cap_flags, 0x0122_3c76);
        assert_eq!(d.attr.orig_attr.vendor_id, 0xff_ffff);
        assert_eq!(d.attr.orig_attr.max_qp_rd_atom, 128);
        let p = &d.ports[0];
        assert_eq!(p.attr.state, IBV_PORT_ACTIVE);
        assert_eq!(p.attr.active_mtu, IBV_MTU_4096);
        assert_eq!(p.attr.link_layer, IBV_LINK_LAYER_ETHERNET);
        assert_eq!(p.gids.len(), 3);
        assert!(p
            .gids
            .iter()
            .flatten()
            .all(|g| g.gid_type == IBV_GID_TYPE_ROCE_V2));
    }
}
