//! The control protocol between a client process (the shim, or `softroce res show`) and the
//! daemon: one request and one response per message on a Unix `SOCK_SEQPACKET` socket, encoded
//! with postcard. File descriptors (ring memfds, doorbells, event pipes) travel beside a
//! message as `SCM_RIGHTS`; the message says how many to expect.
//!
//! The data path never uses this socket: work requests and completions go through the
//! shared-memory rings of [`crate::ring`].

use serde::{Deserialize, Serialize};

/// Bumped on any incompatible change; a client and daemon that disagree refuse each other
/// with a clear message instead of misreading.
pub const PROTOCOL_VERSION: u32 = 1;
/// The largest control message either side sends or accepts.
pub const MAX_MESSAGE: usize = 64 * 1024;

/// Which RoCE encapsulation a device (or GID) speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RoceVersion {
    /// Ethertype 0x8915 with a GRH, one L2 domain (IBTA Annex A16).
    V1,
    /// UDP port 4791 over IPv4 or IPv6 (IBTA Annex A17).
    V2,
}

impl RoceVersion {
    /// `enum ibv_gid_type` (IBV_GID_TYPE_ROCE_V1 = 1, ROCE_V2 = 2).
    pub fn ibv_gid_type(self) -> u32 {
        match self {
            RoceVersion::V1 => 1,
            RoceVersion::V2 => 2,
        }
    }
}

impl core::fmt::Display for RoceVersion {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            RoceVersion::V1 => "v1",
            RoceVersion::V2 => "v2",
        })
    }
}

impl core::str::FromStr for RoceVersion {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "v1" | "1" | "ib/roce v1" => Ok(RoceVersion::V1),
            "v2" | "2" | "roce v2" => Ok(RoceVersion::V2),
            other => Err(format!(
                "unknown RoCE version {other:?} (expected v1 or v2)"
            )),
        }
    }
}

/// One GID table entry (`struct ibv_gid_entry`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GidEntry {
    pub index: u32,
    pub gid: [u8; 16],
    pub roce: RoceVersion,
}

/// What a client needs to present a device: enough for `ibv_devinfo -v`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub name: String,
    pub node_guid: u64,
    pub roce: RoceVersion,
    /// IB MTU enum values (1 = 256 .. 5 = 4096).
    pub max_mtu: u8,
    pub active_mtu: u8,
    pub port_active: bool,
    pub gids: Vec<GidEntry>,
    /// The network interfaces the device's addresses live on ("lo", ...).
    pub netdevs: Vec<String>,
}

/// `struct ibv_qp_cap`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_ah_attr` with its `ibv_global_route`. RoCE always has a GRH.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AhAttr {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub is_global: bool,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`, field for field (the alternate path is not supported on RoCE).
/// Values are carried as the application gave them; the daemon validates every one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpAttr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    /// `enum ibv_mtu` (1 = 256 .. 5 = 4096).
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub cap: QpCap,
    pub ah_attr: AhAttr,
    pub pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
}

/// `enum ibv_qp_type` values the device supports.
pub mod qp_type {
    pub const RC: u32 = 2;
    pub const UC: u32 = 3;
    pub const UD: u32 = 4;
}

/// Where a queue's ring lies in the memfd that comes with the response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingPlace {
    pub offset: u64,
    pub slot_size: u32,
    pub slot_count: u32,
}

/// A client's request. Handles (`pd`, `cq`, ...) are the ones the daemon returned; the daemon
/// checks that each names a live object of the same client. Requests marked "+ fd" carry one
/// file descriptor beside the message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// First message of every connection. The response carries the client's doorbell eventfd:
    /// the shim writes to it after posting if the daemon said it sleeps.
    Hello {
        version: u32,
        program: String,
    },
    QueryDevices,
    /// Resources of every client, for `softroce res show`.
    ResShow,
    /// `ibv_open_device` + fd: the write end of the context's async event socket, on which the
    /// daemon writes 16-byte `{u64 element, u32 type, u32 reserved}` records.
    OpenContext {
        device: String,
    },
    CloseContext {
        ctx: u32,
    },
    AllocPd {
        ctx: u32,
    },
    DeallocPd {
        pd: u32,
    },
    /// `ibv_reg_mr`: the range must be mapped in the client (else EFAULT).
    RegMr {
        pd: u32,
        addr: u64,
        length: u64,
        iova: u64,
        access: u32,
    },
    DeregMr {
        mr: u32,
    },
    /// `ibv_create_comp_channel` + fd: the write end of the channel's pipe, on which the
    /// daemon writes one 8-byte `{u32 cq, u32 generation}` record per event.
    CreateCompChannel {
        ctx: u32,
    },
    DestroyCompChannel {
        channel: u32,
    },
    /// Response `Cq` + fd (the memfd holding the completion ring).
    CreateCq {
        ctx: u32,
        cqe: u32,
        channel: Option<u32>,
        comp_vector: u32,
    },
    DestroyCq {
        cq: u32,
    },
    /// Response `Qp` + fd (the memfd holding the send and receive rings).
    CreateQp {
        pd: u32,
        qp_type: u32,
        send_cq: u32,
        recv_cq: u32,
        srq: Option<u32>,
        cap: QpCap,
        sq_sig_all: bool,
    },
    ModifyQp {
        qpn: u32,
        attr: QpAttr,
        mask: u32,
    },
    QueryQp {
        qpn: u32,
        mask: u32,
    },
    DestroyQp {
        qpn: u32,
    },
    /// Response `Srq` + fd (the memfd holding the SRQ's receive ring).
    CreateSrq {
        pd: u32,
        max_wr: u32,
        max_sge: u32,
        srq_limit: u32,
    },
    ModifySrq {
        srq: u32,
        max_wr: u32,
        srq_limit: u32,
        mask: u32,
    },
    QuerySrq {
        srq: u32,
    },
    DestroySrq {
        srq: u32,
    },
    CreateAh {
        pd: u32,
        attr: AhAttr,
    },
    DestroyAh {
        ah: u32,
    },
    /// `ibv_alloc_mw`: type 1 or 2.
    AllocMw {
        pd: u32,
        mw_type: u32,
    },
    DeallocMw {
        mw: u32,
    },
    AttachMcast {
        qpn: u32,
        gid: [u8; 16],
    },
    DetachMcast {
        qpn: u32,
        gid: [u8; 16],
    },
}

/// Resources one client holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientResources {
    pub client: u64,
    pub pid: u32,
    pub uid: u32,
    pub program: String,
    pub pds: u32,
    pub mrs: u32,
    pub cqs: u32,
    pub qps: u32,
    pub srqs: u32,
    pub ahs: u32,
    pub mws: u32,
}

/// The daemon's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    Hello {
        version: u32,
        client: u64,
    },
    Devices(Vec<DeviceInfo>),
    Resources {
        devices: Vec<String>,
        clients: Vec<ClientResources>,
    },
    /// The request succeeded and has nothing to return.
    Done,
    Context {
        ctx: u32,
    },
    Pd {
        pd: u32,
    },
    Mr {
        mr: u32,
        lkey: u32,
        rkey: u32,
    },
    CompChannel {
        channel: u32,
    },
    /// + fd. `cqe` is the depth granted (at least the one asked for).
    Cq {
        cq: u32,
        cqe: u32,
        ring: RingPlace,
        region_len: u64,
    },
    /// + fd. `cap` is what was granted.
    Qp {
        qpn: u32,
        cap: QpCap,
        sq: RingPlace,
        rq: Option<RingPlace>,
        region_len: u64,
    },
    QpAttr {
        attr: QpAttr,
        cap: QpCap,
        sq_sig_all: bool,
    },
    /// + fd.
    Srq {
        srq: u32,
        max_wr: u32,
        max_sge: u32,
        ring: RingPlace,
        region_len: u64,
    },
    SrqAttr {
        max_wr: u32,
        max_sge: u32,
        srq_limit: u32,
    },
    Ah {
        ah: u32,
    },
    Mw {
        mw: u32,
        rkey: u32,
    },
    /// A failed request, with the errno the verb should return and a message for the log.
    Error {
        errno: i32,
        message: String,
    },
}

/// Encodes a message for the socket.
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, postcard::Error> {
    let bytes = postcard::to_stdvec(msg)?;
    if bytes.len() > MAX_MESSAGE {
        return Err(postcard::Error::SerializeBufferFull);
    }
    Ok(bytes)
}

/// Decodes a message from the socket; any malformed input is an error, never a panic.
pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, postcard::Error> {
    postcard::from_bytes(bytes)
}

/// The IB MTU enum for a byte count (IBTA §9.2: 256 << (enum - 1)); `None` if not a valid MTU.
pub fn mtu_enum(bytes: u32) -> Option<u8> {
    match bytes {
        256 => Some(1),
        512 => Some(2),
        1024 => Some(3),
        2048 => Some(4),
        4096 => Some(5),
        _ => None,
    }
}

/// The largest IB MTU that fits a link MTU, as rxe derives active_mtu: the link MTU minus the
/// largest RoCE v2 headers (80 bytes, IPv6 + UDP + BTH + ... + ICRC).
pub fn active_mtu_for_link(link_mtu: u32) -> u8 {
    let usable = link_mtu.saturating_sub(80);
    [4096u32, 2048, 1024, 512, 256]
        .iter()
        .find(|&&m| m <= usable)
        .and_then(|&m| mtu_enum(m))
        .unwrap_or(1)
}

/// The RoCE v2 GID of an IP address: IPv4 as `::ffff:a.b.c.d`, IPv6 as itself (§7.1).
pub fn gid_of(addr: std::net::IpAddr) -> [u8; 16] {
    match addr {
        std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        std::net::IpAddr::V6(v6) => v6.octets(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_garbage_is_an_error() {
        let req = Request::Hello {
            version: PROTOCOL_VERSION,
            program: "ibv_devinfo".into(),
        };
        let bytes = encode(&req).unwrap();
        assert_eq!(decode::<Request>(&bytes).unwrap(), req);
        let resp = Response::Devices(vec![DeviceInfo {
            name: "srxe0".into(),
            node_guid: 0x0200_00ff_fe00_0001,
            roce: RoceVersion::V2,
            max_mtu: 5,
            active_mtu: 5,
            port_active: true,
            gids: vec![GidEntry {
                index: 1,
                gid: gid_of("127.0.0.1".parse().unwrap()),
                roce: RoceVersion::V2,
            }],
            netdevs: vec!["lo".into()],
        }]);
        let bytes = encode(&resp).unwrap();
        assert_eq!(decode::<Response>(&bytes).unwrap(), resp);
        for cut in 0..bytes.len() {
            assert!(decode::<Response>(&bytes[..cut]).is_err());
        }
        assert!(decode::<Request>(&[0xff; 40]).is_err());
    }

    #[test]
    fn resource_requests_round_trip() {
        let reqs = [
            Request::RegMr {
                pd: 1,
                addr: 0x7fff_0000_1000,
                length: 1 << 20,
                iova: 0x7fff_0000_1000,
                access: 7,
            },
            Request::CreateQp {
                pd: 1,
                qp_type: qp_type::RC,
                send_cq: 2,
                recv_cq: 2,
                srq: None,
                cap: QpCap {
                    max_send_wr: 128,
                    max_recv_wr: 128,
                    max_send_sge: 4,
                    max_recv_sge: 4,
                    max_inline_data: 64,
                },
                sq_sig_all: false,
            },
            Request::ModifyQp {
                qpn: 0x11,
                attr: QpAttr {
                    qp_state: 3,
                    path_mtu: 5,
                    dest_qp_num: 0x12,
                    ah_attr: AhAttr {
                        dgid: gid_of("::1".parse().unwrap()),
                        is_global: true,
                        hop_limit: 64,
                        ..AhAttr::default()
                    },
                    ..QpAttr::default()
                },
                mask: 0x1 | 0x80 | 0x100 | 0x1000 | 0x10_0000,
            },
        ];
        for r in reqs {
            assert_eq!(decode::<Request>(&encode(&r).unwrap()).unwrap(), r);
        }
    }

    #[test]
    fn mtu_and_gid_rules() {
        assert_eq!(active_mtu_for_link(1500), 3, "1500 gives 1024, as rxe");
        assert_eq!(active_mtu_for_link(9000), 5);
        assert_eq!(active_mtu_for_link(65536), 5);
        assert_eq!(
            gid_of("10.0.0.1".parse().unwrap()),
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1]
        );
        assert_eq!("V1".parse::<RoceVersion>(), Ok(RoceVersion::V1));
        assert!("v3".parse::<RoceVersion>().is_err());
    }
}
