//! What the shim knows about each device: a plain description ([`DeviceDescription`]) produced
//! by a [`DeviceSource`].
//!
//! The source is [`DaemonSource`]: the daemon at `$SOFTROCE_SOCKET` lists its devices (name,
//! node GUID, GID table, MTUs, port state) and the shim fills in everything else the way kernel
//! rxe answers (values from `ibv_devinfo -v` on rxe, shared/captures/devinfo/
//! rxe1-ibv_devinfo-v.txt, and roce-rxe-facts.md §6.1). The trait stays a seam so the verbs code
//! never depends on where descriptions come from.

use std::net::{Ipv4Addr, Ipv6Addr};

use libc::c_int;
use proto::ctl::DeviceInfo;

use crate::abi::*;
use crate::daemon;

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

/// The device source of a process: the daemon at [`daemon::socket_path`].
pub fn source_from_env() -> Box<dyn DeviceSource> {
    Box::new(DaemonSource)
}

/// Devices as the daemon describes them (`QueryDevices` on the process's control connection).
///
/// With no daemon reachable there are no devices: a built-in device that cannot carry traffic
/// would only mislead. The reason is printed once on stderr (the device table is built once
/// per process), e.g. `softroce: no daemon at PATH (start one with: softroce daemon)`.
#[derive(Clone, Copy, Debug, Default)]
pub struct DaemonSource;

impl DeviceSource for DaemonSource {
    fn devices(&self) -> Vec<DeviceDescription> {
        match daemon::connection().and_then(|c| c.query_devices()) {
            Ok(infos) => infos.iter().map(description_from_daemon).collect(),
            Err(e) => {
                daemon::report(&e);
                Vec::new()
            }
        }
    }
}

/// kernel rxe's `phys_state` values (IBTA 14.2.5.6 PortPhysicalState): rxe reports LINK_UP
/// with netdev carrier and DISABLED without (rxe_verbs.c `rxe_query_port`).
const PHYS_STATE_DISABLED: u8 = 3;
const PHYS_STATE_LINK_UP: u8 = 5;

/// A port's `state` and `phys_state` as rxe reports them for a netdev up with carrier
/// (`active`) or not.
fn set_port_state(attr: &mut IbvPortAttr, active: bool) {
    if active {
        attr.state = IBV_PORT_ACTIVE;
        attr.phys_state = PHYS_STATE_LINK_UP;
    } else {
        attr.state = IBV_PORT_DOWN;
        attr.phys_state = PHYS_STATE_DISABLED;
    }
}

/// `attr` with the port's state and active MTU as the daemon last published them (in the
/// context's doorbell table: [`proto::ring::doorbell::Doorbells::port`]); an MTU outside the
/// IB enum, or above the port's maximum, is not taken.
pub fn apply_port(attr: &mut IbvPortAttr, active: bool, active_mtu: u8) {
    set_port_state(attr, active);
    if let m @ IBV_MTU_256..=IBV_MTU_4096 = i32::from(active_mtu) {
        attr.active_mtu = m.min(attr.max_mtu);
    }
}

/// A daemon `DeviceInfo` combined with the rxe constants the daemon does not send.
pub fn description_from_daemon(info: &DeviceInfo) -> DeviceDescription {
    let mut attr = rxe_port_attr();
    // Anything outside the IB MTU enum (1..=5) from the daemon is treated as the smallest
    // MTU rather than trusted: these values go straight to applications.
    let mtu = |v: u8| match i32::from(v) {
        m @ IBV_MTU_256..=IBV_MTU_4096 => m,
        _ => IBV_MTU_256,
    };
    attr.max_mtu = mtu(info.max_mtu);
    attr.active_mtu = mtu(info.active_mtu).min(attr.max_mtu);
    (attr.active_width, attr.active_speed) = width_and_speed(info.speed_mbps);
    set_port_state(&mut attr, info.port_active);
    let ifindex = info
        .netdevs
        .first()
        .map(|n| interface_index(n))
        .unwrap_or(0);
    let table_len = usize::try_from(attr.gid_tbl_len).unwrap_or(0);
    let mut gids: Vec<Option<GidDescription>> = Vec::new();
    for entry in &info.gids {
        let Ok(index) = usize::try_from(entry.index) else {
            continue;
        };
        if index >= table_len {
            continue; // past the advertised table: unreachable by any query
        }
        if gids.len() <= index {
            gids.resize(index + 1, None);
        }
        let addr = Ipv6Addr::from(entry.gid);
        // Devices without a netdev (--addr only) serve loopback addresses: their GIDs belong
        // to `lo`, as they would on an rxe device bound to it.
        let ndev_ifindex = if ifindex == 0 && is_loopback_gid(&addr) {
            interface_index("lo")
        } else {
            ifindex
        };
        gids[index] = Some(GidDescription {
            gid: entry.gid,
            gid_type: entry.roce.ibv_gid_type(),
            ndev_ifindex,
        });
    }
    let mut device = rxe_like_device(
        &info.name,
        info.node_guid.to_be_bytes(),
        PortDescription {
            attr,
            gids,
            pkeys: vec![0xffff],
        },
    );
    // The CQ depth is the daemon's, configured per device (deeper than rxe's by default:
    // the stacks ask for more); 0 from an older daemon keeps rxe's.
    if let Ok(max_cqe) = i32::try_from(info.max_cqe) {
        if max_cqe > 0 {
            device.attr.orig_attr.max_cqe = max_cqe;
        }
    }
    // What the daemon will hold, not rxe's constants (a verb past these fails with ENOMEM).
    let cap = |v: u32| c_int::try_from(v).unwrap_or(c_int::MAX);
    let a = &mut device.attr.orig_attr;
    a.max_qp = cap(info.limits.max_qp);
    a.max_cq = cap(info.limits.max_cq);
    a.max_mr = cap(info.limits.max_mr);
    a.max_srq = cap(info.limits.max_srq);
    device
}

fn is_loopback_gid(addr: &Ipv6Addr) -> bool {
    addr.is_loopback()
        || addr.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        || addr.segments()[0] == 0xfe80
}

/// The kernel ifindex of a network interface, 0 if it does not exist.
fn interface_index(name: &str) -> u32 {
    std::ffi::CString::new(name)
        // SAFETY: a valid NUL-terminated string; if_nametoindex only reads it.
        .map(|c| unsafe { libc::if_nametoindex(c.as_ptr()) })
        .unwrap_or(0)
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

/// `ibv_port_attr`'s (active_width, active_speed) for an Ethernet link of `mbps`: the table
/// kernel 6.1's `ib_get_eth_speed` applies to RoCE ports (what rxe reports), up to 40 Gb/s
/// as 4X FDR10 and above it 4X EDR.
pub fn width_and_speed(mbps: u32) -> (u8, u8) {
    match mbps {
        0..=1_000 => (IB_WIDTH_1X, IB_SPEED_SDR),
        1_001..=10_000 => (IB_WIDTH_1X, IB_SPEED_FDR10),
        10_001..=20_000 => (IB_WIDTH_4X, IB_SPEED_DDR),
        20_001..=25_000 => (IB_WIDTH_1X, IB_SPEED_EDR),
        25_001..=40_000 => (IB_WIDTH_4X, IB_SPEED_FDR10),
        _ => (IB_WIDTH_4X, IB_SPEED_EDR),
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
        active_width: IB_WIDTH_1X,
        active_speed: IB_SPEED_SDR, // 2.5 Gbps
        phys_state: 5,              // LINK_UP
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
pub fn rxe_like_device(name: &str, node_guid: [u8; 8], port: PortDescription) -> DeviceDescription {
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
    fn port_speeds_map_as_the_kernels_table() {
        // (Mb/s, width, speed): ib_get_eth_speed's rows and their edges.
        for (mbps, w, sp) in [
            (0, 1, 1),
            (1_000, 1, 1),
            (1_001, 1, 8),
            (10_000, 1, 8),
            (20_000, 2, 2),
            (25_000, 1, 32),
            (40_000, 2, 8),
            (100_000, 2, 32),
            (400_000, 2, 32),
        ] {
            assert_eq!(width_and_speed(mbps), (w, sp), "{mbps} Mb/s");
        }
    }

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
        let mut a = rxe_port_attr();
        apply_port(&mut a, false, 3);
        assert_eq!(
            (a.state, a.phys_state, a.active_mtu),
            (IBV_PORT_DOWN, 3, IBV_MTU_1024)
        );
        apply_port(&mut a, true, 9); // not an MTU: kept
        assert_eq!(
            (a.state, a.phys_state, a.active_mtu),
            (IBV_PORT_ACTIVE, 5, IBV_MTU_1024)
        );
        apply_port(&mut a, true, 5);
        assert_eq!(a.active_mtu, IBV_MTU_4096);
        assert_eq!(rxe_active_mtu(1500), IBV_MTU_1024);
        assert_eq!(rxe_active_mtu(9000), IBV_MTU_4096);
        assert_eq!(rxe_active_mtu(65536), IBV_MTU_4096);
        assert_eq!(rxe_active_mtu(0), IBV_MTU_256);
    }

    fn daemon_info() -> DeviceInfo {
        use proto::ctl::{gid_of, GidEntry, RoceVersion};
        DeviceInfo {
            name: "srxe7".into(),
            node_guid: 0x0253_52ff_fe58_4507,
            roce: RoceVersion::V2,
            max_mtu: 5,
            active_mtu: 3,
            port_active: true,
            gids: vec![
                GidEntry {
                    index: 0,
                    gid: GidDescription::link_local_default([2, 0x53, 0x52, 0x58, 0x45, 7], 0).gid,
                    roce: RoceVersion::V2,
                },
                GidEntry {
                    index: 1,
                    gid: gid_of("127.0.0.2".parse().unwrap()),
                    roce: RoceVersion::V2,
                },
                GidEntry {
                    index: 3,
                    gid: gid_of("::1".parse().unwrap()),
                    roce: RoceVersion::V1,
                },
                // Past gid_tbl_len: dropped, never an out-of-bounds slot.
                GidEntry {
                    index: 5000,
                    gid: [9; 16],
                    roce: RoceVersion::V2,
                },
            ],
            netdevs: vec![],
            max_cqe: 32767,
            limits: proto::ctl::DeviceLimits {
                max_qp: 1000,
                max_cq: 2000,
                max_mr: 3000,
                max_srq: 4000,
            },
            speed_mbps: 25_000,
        }
    }

    #[test]
    fn daemon_device_is_rxe_with_the_daemons_identity() {
        let d = description_from_daemon(&daemon_info());
        assert_eq!(d.name, "srxe7");
        // 25 Gb/s from the daemon: 1X EDR on the port.
        assert_eq!(
            (d.ports[0].attr.active_width, d.ports[0].attr.active_speed),
            (1, 32)
        );
        // The daemon's caps, not rxe's constants.
        let a = &d.attr.orig_attr;
        assert_eq!(
            (a.max_qp, a.max_cq, a.max_mr, a.max_srq),
            (1000, 2000, 3000, 4000)
        );
        assert_eq!(
            d.node_guid,
            [0x02, 0x53, 0x52, 0xff, 0xfe, 0x58, 0x45, 0x07]
        );
        assert_eq!(d.attr.orig_attr.node_guid, u64::from_ne_bytes(d.node_guid));
        assert_eq!(d.attr.orig_attr.device_cap_flags, 0x0122_3c76);
        assert_eq!(d.attr.orig_attr.vendor_id, 0xff_ffff);
        assert_eq!(d.attr.orig_attr.max_qp_rd_atom, 128);
        let p = &d.ports[0];
        assert_eq!(p.attr.state, IBV_PORT_ACTIVE);
        assert_eq!(p.attr.phys_state, PHYS_STATE_LINK_UP);
        assert_eq!(p.attr.active_mtu, IBV_MTU_1024);
        assert_eq!(p.attr.max_mtu, IBV_MTU_4096);
        assert_eq!(p.attr.link_layer, IBV_LINK_LAYER_ETHERNET);
        assert_eq!(p.gids.len(), 4, "slots up to the highest index, hole at 2");
        assert!(p.gids[2].is_none());
        let v4 = p.gids[1].unwrap();
        assert_eq!(Ipv6Addr::from(v4.gid).to_string(), "::ffff:127.0.0.2");
        assert_eq!(v4.gid_type, IBV_GID_TYPE_ROCE_V2);
        assert_eq!(p.gids[3].unwrap().gid_type, IBV_GID_TYPE_ROCE_V1);
        // Loopback GIDs of a device without netdev belong to `lo`.
        assert_eq!(v4.ndev_ifindex, interface_index("lo"));
        assert_ne!(v4.ndev_ifindex, 0);
    }

    #[test]
    fn down_port_and_bad_mtus_from_the_daemon() {
        let mut info = daemon_info();
        info.port_active = false;
        info.active_mtu = 9;
        info.max_mtu = 0;
        let p = &description_from_daemon(&info).ports[0];
        assert_eq!(p.attr.state, IBV_PORT_DOWN);
        assert_eq!(p.attr.phys_state, PHYS_STATE_DISABLED);
        assert_eq!(p.attr.active_mtu, IBV_MTU_256);
        assert_eq!(p.attr.max_mtu, IBV_MTU_256);
    }
}
