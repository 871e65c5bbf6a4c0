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

/// A client's request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// First message of every connection.
    Hello {
        version: u32,
        program: String,
    },
    QueryDevices,
    /// Resources of every client, for `softroce res show`.
    ResShow,
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
