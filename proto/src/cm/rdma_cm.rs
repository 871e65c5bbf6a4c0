//! What the rdma_cm layer (Linux `drivers/infiniband/core/cma.c`) puts into CM messages on
//! RoCE and what it derives from them: service IDs, the 36-byte private-data header, the
//! private-data limits, the QP attributes it programs and the RoCE v2 flow label.

use super::msg::{private_data_len, transport, CmPath};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// rdma_cm port spaces (`enum rdma_ucm_port_space`), the "protocol" byte pair of the
/// service ID (IBTA Annex A11 "RDMA IP CM Service").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum PortSpace {
    Ipoib = 0x0002,
    /// RDMA_PS_TCP: connected (RC) ids.
    Tcp = 0x0106,
    /// RDMA_PS_UDP: UD ids, resolved with SIDR.
    Udp = 0x0111,
    /// RDMA_PS_IB: either, chosen by QP type.
    Ib = 0x013f,
}

impl PortSpace {
    pub fn from_u16(v: u16) -> Option<PortSpace> {
        match v {
            0x0002 => Some(PortSpace::Ipoib),
            0x0106 => Some(PortSpace::Tcp),
            0x0111 => Some(PortSpace::Udp),
            0x013f => Some(PortSpace::Ib),
            _ => None,
        }
    }
}

/// `rdma_get_service_id`: `(port_space << 16) + port`, e.g. rping's TCP port 7174 gives
/// 0x0000_0000_0106_1c06.
pub fn service_id(ps: PortSpace, port: u16) -> u64 {
    ((ps as u64) << 16) | u64::from(port)
}

/// The port space and port of an RDMA IP CM service ID, or `None` for any other ID.
pub fn parse_service_id(sid: u64) -> Option<(PortSpace, u16)> {
    if sid >> 32 != 0 {
        return None;
    }
    let ps = PortSpace::from_u16((sid >> 16) as u16)?;
    Some((ps, sid as u16))
}

/// Q_Key of rdma_cm UD QPs (`RDMA_UDP_QKEY`), carried in SIDR_REP.
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;
/// rdma_cm's CM response timeout (`CMA_CM_RESPONSE_TIMEOUT`), 4.096 µs · 2^20 ≈ 4.3 s.
pub const CMA_CM_RESPONSE_TIMEOUT: u8 = 20;
/// rdma_cm's CM retries (`CMA_MAX_CM_RETRIES`).
pub const CMA_MAX_CM_RETRIES: u8 = 15;
/// Service timeout of the MRA rdma_cm sends for a duplicate REQ/REP (`CMA_CM_MRA_SETTING`).
pub const CMA_CM_MRA_SETTING: u8 = 24;
/// The RoCE path's default packet lifetime (`CMA_IBOE_PACKET_LIFETIME`; kernels before ~2020
/// used 18, as the lab captures show).
pub const CMA_IBOE_PACKET_LIFETIME: u8 = 16;
/// rxe's `local_ca_ack_delay`.
pub const RXE_ACK_DELAY: u8 = 15;

/// Length of the rdma_cm header at the front of REQ and SIDR_REQ private data.
pub const CMA_HDR_LEN: usize = 36;

/// User private data rdma_cm lets through per message (`rdma_conn_param.private_data_len`
/// limits): REQ and SIDR_REQ lose the 36-byte header, the others carry user data only.
pub mod user_private_data_max {
    use super::{private_data_len as p, CMA_HDR_LEN};
    pub const REQ: usize = p::REQ - CMA_HDR_LEN;
    pub const SIDR_REQ: usize = p::SIDR_REQ - CMA_HDR_LEN;
    pub const REP: usize = p::REP;
    pub const REJ: usize = p::REJ;
    pub const RTU: usize = p::RTU;
    pub const DREQ: usize = p::DREQ;
    pub const DREP: usize = p::DREP;
    pub const SIDR_REP: usize = p::SIDR_REP;
    pub const MRA: usize = p::MRA;
}

/// Why rdma_cm private data is unusable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CmaHdrError {
    #[error("private data of {0} bytes is shorter than the 36-byte rdma_cm header")]
    Truncated(usize),
    #[error("rdma_cm header version {0:#04x} is not 0")]
    BadVersion(u8),
    #[error("rdma_cm header IP version {0} is neither 4 nor 6")]
    BadIpVersion(u8),
    #[error("user private data of {len} bytes exceeds {max}")]
    TooLong { len: usize, max: usize },
    #[error("source and destination address families differ")]
    MixedFamilies,
}

/// The header `cma_format_hdr` writes at the front of REQ / SIDR_REQ private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmaHdr {
    /// The active side's rdma_cm port.
    pub src_port: u16,
    pub src_addr: IpAddr,
    pub dst_addr: IpAddr,
}

fn addr_bytes(a: IpAddr) -> [u8; 16] {
    match a {
        // IPv4 sits in the last four bytes with the first twelve zero (not v4-mapped): the
        // kernel writes `dst_addr.ip4.addr` of a union whose IPv6 view is otherwise zero.
        IpAddr::V4(v4) => {
            let mut b = [0u8; 16];
            b[12..].copy_from_slice(&v4.octets());
            b
        }
        IpAddr::V6(v6) => v6.octets(),
    }
}

impl CmaHdr {
    pub fn ip_version(&self) -> u8 {
        if self.src_addr.is_ipv4() {
            4
        } else {
            6
        }
    }

    pub fn emit(&self) -> Result<[u8; CMA_HDR_LEN], CmaHdrError> {
        if self.src_addr.is_ipv4() != self.dst_addr.is_ipv4() {
            return Err(CmaHdrError::MixedFamilies);
        }
        let mut b = [0u8; CMA_HDR_LEN];
        b[0] = 0; // cma_version 0.0
        b[1] = self.ip_version() << 4;
        b[2..4].copy_from_slice(&self.src_port.to_be_bytes());
        b[4..20].copy_from_slice(&addr_bytes(self.src_addr));
        b[20..36].copy_from_slice(&addr_bytes(self.dst_addr));
        Ok(b)
    }

    pub fn parse(pd: &[u8]) -> Result<CmaHdr, CmaHdrError> {
        if pd.len() < CMA_HDR_LEN {
            return Err(CmaHdrError::Truncated(pd.len()));
        }
        if pd[0] != 0 {
            return Err(CmaHdrError::BadVersion(pd[0]));
        }
        let mut src = [0u8; 16];
        let mut dst = [0u8; 16];
        src.copy_from_slice(&pd[4..20]);
        dst.copy_from_slice(&pd[20..36]);
        let (src_addr, dst_addr) = match pd[1] >> 4 {
            4 => (
                IpAddr::V4(Ipv4Addr::new(src[12], src[13], src[14], src[15])),
                IpAddr::V4(Ipv4Addr::new(dst[12], dst[13], dst[14], dst[15])),
            ),
            6 => (
                IpAddr::V6(Ipv6Addr::from(src)),
                IpAddr::V6(Ipv6Addr::from(dst)),
            ),
            v => return Err(CmaHdrError::BadIpVersion(v)),
        };
        Ok(CmaHdr {
            src_port: u16::from_be_bytes([pd[2], pd[3]]),
            src_addr,
            dst_addr,
        })
    }
}

/// REQ (or SIDR_REQ) private data: the header followed by the user's bytes.
pub fn req_private_data(
    hdr: &CmaHdr,
    user: &[u8],
    max_user: usize,
) -> Result<Vec<u8>, CmaHdrError> {
    if user.len() > max_user {
        return Err(CmaHdrError::TooLong {
            len: user.len(),
            max: max_user,
        });
    }
    let mut pd = hdr.emit()?.to_vec();
    pd.extend_from_slice(user);
    Ok(pd)
}

/// The GID of an IP address on RoCE (facts §7.1): IPv4 becomes `::ffff:a.b.c.d`.
pub fn ip_to_gid(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The RoCE v2 flow label rdma_cm sets on the path of an IPv4 (or flowinfo-less IPv6)
/// connection: `(sport * 31 + dport) & 0xFFFFF` over the rdma_cm ports (facts §1.3 step 3,
/// `rdma_calc_flow_label`).
pub fn rdma_flow_label(src_port: u16, dst_port: u16) -> u32 {
    (u32::from(src_port) * 31 + u32::from(dst_port)) & 0xFFFFF
}

/// `rdma_get_udp_sport`: the UDP source port of a RoCE v2 QP from its path's flow label; a
/// zero label is first replaced by the symmetric `rdma_calc_flow_label(lqpn, rqpn)`
/// (facts §1.3 step 2).
pub fn udp_sport(flow_label: u32, local_qpn: u32, remote_qpn: u32) -> u16 {
    let fl = if flow_label == 0 {
        let mut v = u64::from(local_qpn) * u64::from(remote_qpn);
        v ^= v >> 20;
        v ^= v >> 40;
        (v & 0xFFFFF) as u32
    } else {
        flow_label & 0xFFFFF
    };
    (0xC000 | ((fl & 0x3FFF) ^ ((fl & 0xFC000) >> 14))) as u16
}

/// `cm_ack_timeout`: the REQ's "primary local ACK timeout" from the CA's ACK delay and the
/// path's packet lifetime (IBTA §12.7.34, facts §8.4).
pub fn cm_ack_timeout(ca_ack_delay: u8, packet_life_time: u8) -> u8 {
    let mut t = u32::from(packet_life_time) + 1;
    let d = u32::from(ca_ack_delay);
    if t >= d {
        t += u32::from(d >= t - 1);
    } else if t + 1 >= d {
        t = d + 1;
    } else {
        t = d;
    }
    t.min(31) as u8
}

/// `iboe_get_mtu(netdev_mtu - 96)`: the IB MTU enum (1 = 256 … 5 = 4096) of a RoCE path over a
/// netdev with this MTU; `None` below 256 bytes of payload.
pub fn iboe_path_mtu(netdev_mtu: u32) -> Option<u8> {
    let room = netdev_mtu.checked_sub(96)?;
    [(4096, 5), (2048, 4), (1024, 3), (512, 2), (256, 1)]
        .into_iter()
        .find(|(bytes, _)| room >= *bytes)
        .map(|(_, e)| e)
}

/// The route rdma_cm resolved (facts §7.2), what the REQ's primary path is built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceRoute {
    pub src_addr: IpAddr,
    pub dst_addr: IpAddr,
    /// The rdma_cm ports (the active side's bound port, the listener's port).
    pub src_port: u16,
    pub dst_port: u16,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub sl: u8,
    /// IB MTU enum.
    pub path_mtu: u8,
    pub packet_life_time: u8,
    /// IB static-rate enum; the lab kernel sent 0.
    pub rate: u8,
}

impl RoceRoute {
    /// The CM path of this route as `cm_format_req` writes it: permissive LIDs off-subnet,
    /// the v2 flow label from the rdma_cm ports, the ACK timeout from `cm_ack_timeout`.
    pub fn cm_path(&self, ca_ack_delay: u8) -> CmPath {
        let lid = if self.hop_limit > 1 { 0xffff } else { 0 };
        CmPath {
            local_lid: lid,
            remote_lid: lid,
            local_gid: ip_to_gid(self.src_addr),
            remote_gid: ip_to_gid(self.dst_addr),
            flow_label: rdma_flow_label(self.src_port, self.dst_port),
            packet_rate: self.rate,
            traffic_class: self.traffic_class,
            hop_limit: self.hop_limit,
            sl: self.sl,
            subnet_local: self.hop_limit <= 1,
            local_ack_timeout: cm_ack_timeout(ca_ack_delay, self.packet_life_time),
        }
    }
}

/// `struct rdma_conn_param` as rdma_connect / rdma_accept receive it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RdmaConnParam {
    pub private_data: Vec<u8>,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: bool,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub qp_num: u32,
}

/// Transport of the QP behind a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpType {
    Rc,
    Uc,
}

impl QpType {
    pub fn cm_transport(self) -> u8 {
        match self {
            QpType::Rc => transport::RC,
            QpType::Uc => transport::UC,
        }
    }
}

/// The QP attributes rdma_cm programs (`rdma_init_qp_attr` → `ib_cm_init_qp_attr`), facts §5.2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmQpAttrs {
    pub path_mtu: u8,
    pub dest_qpn: u32,
    /// INIT→RTR: the peer's starting PSN.
    pub rq_psn: u32,
    /// RTR→RTS: our starting PSN.
    pub sq_psn: u32,
    pub max_dest_rd_atomic: u8,
    pub max_rd_atomic: u8,
    pub min_rnr_timer: u8,
    /// Local ACK timeout: packet lifetime + 1 (rdma_cm overrides ib_cm's value on RoCE).
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub access_remote_write: bool,
    pub access_remote_read_atomic: bool,
}

/// Parameters negotiated between both sides, from whose view the attributes are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    pub path_mtu: u8,
    pub packet_life_time: u8,
    pub remote_qpn: u32,
    pub remote_starting_psn: u32,
    pub local_starting_psn: u32,
    /// Reads/atomics we accept from the peer (our responder resources).
    pub responder_resources: u8,
    /// Reads/atomics we issue to the peer.
    pub initiator_depth: u8,
    /// Retry count the peer asked for (REQ) / we use.
    pub retry_count: u8,
    /// RNR retry count we use when sending (REQ's on the active side, REP's on the passive).
    pub rnr_retry_count: u8,
    /// `rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT)` if set.
    pub ack_timeout_override: Option<u8>,
    /// `rdma_set_min_rnr_timer` if set.
    pub min_rnr_timer: Option<u8>,
}

pub fn qp_attrs(n: &Negotiated) -> CmQpAttrs {
    CmQpAttrs {
        path_mtu: n.path_mtu,
        dest_qpn: n.remote_qpn,
        // Linux (ib_cm + rdma_cm) reads a REQ's or REP's Starting PSN as the PSN its *sender*
        // receives at: the active side sends from the REP's Starting PSN and receives at its
        // REQ's, the passive side the other way round. Seen in every kernel-rxe rdma_cm capture
        // (rping, ucmatose, ib_send_bw -R) and live against kernel rxe (docs/interop.md).
        rq_psn: n.local_starting_psn,
        sq_psn: n.remote_starting_psn,
        max_dest_rd_atomic: n.responder_resources,
        max_rd_atomic: n.initiator_depth,
        min_rnr_timer: n.min_rnr_timer.unwrap_or(0),
        timeout: n
            .ack_timeout_override
            .unwrap_or_else(|| (n.packet_life_time + 1).min(31)),
        retry_cnt: n.retry_count.min(7),
        rnr_retry: n.rnr_retry_count.min(7),
        access_remote_write: true,
        access_remote_read_atomic: n.responder_resources > 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_ids_match_the_captures() {
        assert_eq!(service_id(PortSpace::Tcp, 7174), 0x0000_0000_0106_1c06);
        assert_eq!(service_id(PortSpace::Udp, 7174), 0x0000_0000_0111_1c06);
        assert_eq!(
            parse_service_id(0x0000_0000_0106_4853),
            Some((PortSpace::Tcp, 18515))
        );
        assert_eq!(parse_service_id(0x1_0106_1c06), None);
        assert_eq!(parse_service_id(0x0107_1c06), None);
    }

    #[test]
    fn header_bytes_match_rping() {
        // rping.pcap REQ private data: 00 40 82 28, then 12 zero bytes and 10.77.0.11, then
        // 12 zero bytes and 10.77.0.12.
        let hdr = CmaHdr {
            src_port: 0x8228,
            src_addr: IpAddr::V4(Ipv4Addr::new(10, 77, 0, 11)),
            dst_addr: IpAddr::V4(Ipv4Addr::new(10, 77, 0, 12)),
        };
        let b = hdr.emit().unwrap();
        let mut want = [0u8; 36];
        want[..4].copy_from_slice(&[0x00, 0x40, 0x82, 0x28]);
        want[16..20].copy_from_slice(&[10, 77, 0, 11]);
        want[32..36].copy_from_slice(&[10, 77, 0, 12]);
        assert_eq!(b, want);
        assert_eq!(CmaHdr::parse(&b).unwrap(), hdr);
        let v6 = CmaHdr {
            src_port: 1,
            src_addr: "fe80::1".parse().unwrap(),
            dst_addr: "fe80::2".parse().unwrap(),
        };
        let b6 = v6.emit().unwrap();
        assert_eq!(b6[1], 0x60);
        assert_eq!(CmaHdr::parse(&b6).unwrap(), v6);
        assert_eq!(CmaHdr::parse(&b[..35]), Err(CmaHdrError::Truncated(35)));
        let mut bad = b;
        bad[1] = 0x50;
        assert_eq!(CmaHdr::parse(&bad), Err(CmaHdrError::BadIpVersion(5)));
        let mixed = CmaHdr {
            dst_addr: "::1".parse().unwrap(),
            ..hdr
        };
        assert_eq!(mixed.emit(), Err(CmaHdrError::MixedFamilies));
    }

    #[test]
    fn private_data_limits() {
        assert_eq!(user_private_data_max::REQ, 56);
        assert_eq!(user_private_data_max::SIDR_REQ, 180);
        assert_eq!(user_private_data_max::REP, 196);
        assert_eq!(user_private_data_max::REJ, 148);
        assert_eq!(user_private_data_max::RTU, 224);
        assert_eq!(user_private_data_max::DREQ, 220);
        assert_eq!(user_private_data_max::DREP, 224);
        let hdr = CmaHdr {
            src_port: 1,
            src_addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
            dst_addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
        };
        assert_eq!(req_private_data(&hdr, &[1; 56], 56).unwrap().len(), 92);
        assert_eq!(
            req_private_data(&hdr, &[1; 57], 56),
            Err(CmaHdrError::TooLong { len: 57, max: 56 })
        );
    }

    #[test]
    fn flow_label_and_udp_source_port() {
        // facts §1.3: cm ports 40000 -> 7471 give label 0x308EF and UDP sport 0xC8E3.
        assert_eq!(rdma_flow_label(40000, 7471), 0x308EF);
        assert_eq!(udp_sport(0x308EF, 17, 18), 0xC8E3);
        // rping.pcap: rdma_cm ports 0x8228 -> 7174, REQ flow label 0xfdede.
        assert_eq!(rdma_flow_label(0x8228, 7174), 0xfdede);
        // A zero label: symmetric in the QPNs (QPNs 17, 18 -> 0xC132).
        assert_eq!(udp_sport(0, 17, 18), 0xC132);
        assert_eq!(udp_sport(0, 18, 17), 0xC132);
    }

    #[test]
    fn ack_timeout_and_mtu() {
        assert_eq!(cm_ack_timeout(RXE_ACK_DELAY, 16), 17);
        // The lab kernel's PLT 18 gives the 19 seen in every captured REQ.
        assert_eq!(cm_ack_timeout(RXE_ACK_DELAY, 18), 19);
        assert_eq!(cm_ack_timeout(20, 16), 20);
        assert_eq!(cm_ack_timeout(18, 16), 19);
        assert_eq!(cm_ack_timeout(0, 31), 31);
        assert_eq!(iboe_path_mtu(1500), Some(3));
        assert_eq!(iboe_path_mtu(9000), Some(5));
        assert_eq!(iboe_path_mtu(300), None);
    }

    #[test]
    fn qp_attributes_rdma_cm_programs() {
        let n = Negotiated {
            path_mtu: 3,
            packet_life_time: 16,
            remote_qpn: 0x21,
            remote_starting_psn: 0xc455a2,
            local_starting_psn: 0x26124f,
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 9,
            rnr_retry_count: 7,
            ack_timeout_override: None,
            min_rnr_timer: None,
        };
        let a = qp_attrs(&n);
        assert_eq!(a.timeout, 17);
        assert_eq!(a.min_rnr_timer, 0);
        assert_eq!(a.retry_cnt, 7);
        assert_eq!((a.max_rd_atomic, a.max_dest_rd_atomic), (1, 1));
        assert!(a.access_remote_write && a.access_remote_read_atomic);
        let b = qp_attrs(&Negotiated {
            responder_resources: 0,
            ack_timeout_override: Some(14),
            min_rnr_timer: Some(12),
            ..n
        });
        assert_eq!((b.timeout, b.min_rnr_timer), (14, 12));
        assert!(!b.access_remote_read_atomic);
    }
}

/// `enum rdma_cm_event_type` (librdmacm `rdma_cma.h`), what the shim hands to programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum RdmaCmEventType {
    AddrResolved = 0,
    AddrError = 1,
    RouteResolved = 2,
    RouteError = 3,
    ConnectRequest = 4,
    ConnectResponse = 5,
    ConnectError = 6,
    Unreachable = 7,
    Rejected = 8,
    Established = 9,
    Disconnected = 10,
    DeviceRemoval = 11,
    MulticastJoin = 12,
    MulticastError = 13,
    AddrChange = 14,
    TimewaitExit = 15,
}

/// `-ETIMEDOUT`, the status of UNREACHABLE after CM timeouts.
pub const ETIMEDOUT_STATUS: i32 = -110;
