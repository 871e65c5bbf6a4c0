//! The connection manager's messages (IBTA Vol. 1 §12.6, tables 106–120) carried in a MAD
//! (§13.4): every field as a `Repr` value, decoded and encoded byte-exactly.
//!
//! Layout conventions, as in the kernel's `ibta_vol1_c12.h`: offsets count from the start of
//! the CM message (MAD offset 24); fields narrower than their bytes sit at the MSB end; 24-bit
//! fields sit at the MSB end of their 32-bit word. Reserved bits are ignored on receive
//! (IBTA §12.6 "reserved fields shall be ignored by the receiver") and sent as zero.
//!
//! Decoding never panics: every access is within the fixed 256-byte MAD whose length is
//! checked first, and malformed content (wrong class, unknown attribute, length fields past
//! their area) is a [`CmError`].

use crate::wire::mad::{MadHeader, CLASS_CM, HEADER_LEN, MAD_LEN};

/// MAD base version (IBTA §13.4.3).
pub const BASE_VERSION: u8 = 1;
/// CM class version sent by Linux (`IB_CM_CLASS_VERSION`).
pub const CM_CLASS_VERSION: u8 = 2;
/// The only method the CM uses for its messages: Send (§12.6.1).
pub const METHOD_SEND: u8 = 0x03;
/// Bytes of the CM message after the MAD header.
pub const CM_MSG_LEN: usize = MAD_LEN - HEADER_LEN;

/// CM attribute IDs (IBTA table 104).
pub mod attr {
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    pub const REQ: u16 = 0x0010;
    pub const MRA: u16 = 0x0011;
    pub const REJ: u16 = 0x0012;
    pub const REP: u16 = 0x0013;
    pub const RTU: u16 = 0x0014;
    pub const DREQ: u16 = 0x0015;
    pub const DREP: u16 = 0x0016;
    pub const SIDR_REQ: u16 = 0x0017;
    pub const SIDR_REP: u16 = 0x0018;
    pub const LAP: u16 = 0x0019;
    pub const APR: u16 = 0x001a;
}

/// Private data capacity of each message (the tables' Private Data field).
pub mod private_data_len {
    pub const REQ: usize = 92;
    pub const MRA: usize = 222;
    pub const REJ: usize = 148;
    pub const REP: usize = 196;
    pub const RTU: usize = 224;
    pub const DREQ: usize = 220;
    pub const DREP: usize = 224;
    pub const SIDR_REQ: usize = 216;
    pub const SIDR_REP: usize = 136;
    pub const LAP: usize = 168;
    pub const APR: usize = 148;
}

/// Capacity of REJ's ARI and of SIDR_REP's / APR's additional information.
pub const ARI_LEN: usize = 72;

/// Why a MAD is not a well-formed CM message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CmError {
    #[error("truncated MAD: need {need} bytes, have {have}")]
    Truncated { need: usize, have: usize },
    #[error("MAD base version {0} is not 1")]
    BadBaseVersion(u8),
    #[error("management class {0:#04x} is not the CM (0x07)")]
    NotCm(u8),
    #[error("CM method {0:#04x} is not Send")]
    BadMethod(u8),
    #[error("CM class version {0} is not 2")]
    BadClassVersion(u8),
    #[error("unknown CM attribute {0:#06x}")]
    UnknownAttribute(u16),
    #[error("{field} = {value} exceeds its {max}-byte area")]
    LengthField {
        field: &'static str,
        value: usize,
        max: usize,
    },
    #[error("{field} value {value} does not fit its bit field")]
    FieldRange { field: &'static str, value: u64 },
}

/// Message kinds named in REJ's "Message Rejected" and MRA's "Message MRAed" (2 bits).
pub mod msg_kind {
    pub const REQ: u8 = 0;
    pub const REP: u8 = 1;
    pub const OTHER: u8 = 2;
    pub const LAP: u8 = 2;
}

/// Transport service types of REQ byte 43 (table 106).
pub mod transport {
    pub const RC: u8 = 0;
    pub const UC: u8 = 1;
    pub const RD: u8 = 2;
    pub const XRC: u8 = 3;
}

/// REJ reason codes (IBTA table 112, `enum ib_cm_rej_reason`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RejReason(pub u16);

impl RejReason {
    pub const NO_QP: Self = Self(1);
    pub const NO_EEC: Self = Self(2);
    pub const NO_RESOURCES: Self = Self(3);
    pub const TIMEOUT: Self = Self(4);
    pub const UNSUPPORTED: Self = Self(5);
    pub const INVALID_COMM_ID: Self = Self(6);
    pub const INVALID_COMM_INSTANCE: Self = Self(7);
    pub const INVALID_SERVICE_ID: Self = Self(8);
    pub const INVALID_TRANSPORT_TYPE: Self = Self(9);
    pub const STALE_CONN: Self = Self(10);
    pub const RDC_NOT_EXIST: Self = Self(11);
    pub const INVALID_GID: Self = Self(12);
    pub const INVALID_LID: Self = Self(13);
    pub const INVALID_SL: Self = Self(14);
    pub const INVALID_TRAFFIC_CLASS: Self = Self(15);
    pub const INVALID_HOP_LIMIT: Self = Self(16);
    pub const INVALID_PACKET_RATE: Self = Self(17);
    pub const INVALID_MTU: Self = Self(26);
    pub const INSUFFICIENT_RESP_RESOURCES: Self = Self(27);
    pub const CONSUMER_DEFINED: Self = Self(28);
    pub const INVALID_RNR_RETRY: Self = Self(29);
    pub const DUPLICATE_LOCAL_COMM_ID: Self = Self(30);
    pub const INVALID_CLASS_VERSION: Self = Self(31);
    pub const INVALID_FLOW_LABEL: Self = Self(32);
    pub const INVALID_ALT_FLOW_LABEL: Self = Self(33);
    pub const VENDOR_OPTION_NOT_SUPPORTED: Self = Self(35);

    pub fn name(self) -> &'static str {
        match self.0 {
            1 => "no QP",
            2 => "no EEC",
            3 => "no resources",
            4 => "timeout",
            5 => "unsupported request",
            6 => "invalid comm ID",
            7 => "invalid comm instance",
            8 => "invalid service ID",
            9 => "invalid transport type",
            10 => "stale connection",
            11 => "RDC does not exist",
            12 => "invalid GID",
            13 => "invalid LID",
            14 => "invalid SL",
            15 => "invalid traffic class",
            16 => "invalid hop limit",
            17 => "invalid packet rate",
            26 => "invalid MTU",
            27 => "insufficient responder resources",
            28 => "consumer defined",
            29 => "invalid RNR retry",
            30 => "duplicate local comm ID",
            31 => "invalid class version",
            32 => "invalid flow label",
            33 => "invalid alternate flow label",
            35 => "vendor option not supported",
            _ => "unknown",
        }
    }
}

impl core::fmt::Debug for RejReason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "RejReason({} {})", self.0, self.name())
    }
}

/// SIDR_REP status values (IBTA table 121, `enum ib_cm_sidr_status`).
pub mod sidr_status {
    pub const SUCCESS: u8 = 0;
    pub const UNSUPPORTED: u8 = 1;
    pub const REJECT: u8 = 2;
    pub const NO_QP: u8 = 3;
    pub const REDIRECT: u8 = 4;
    pub const UNSUPPORTED_VERSION: u8 = 5;
}

// ---- byte and bit access on the CM message (all indices below CM_MSG_LEN) ----

fn get16(m: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([m[at], m[at + 1]])
}
fn get24(m: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([0, m[at], m[at + 1], m[at + 2]])
}
fn get32(m: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([m[at], m[at + 1], m[at + 2], m[at + 3]])
}
fn get64(m: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&m[at..at + 8]);
    u64::from_be_bytes(x)
}
fn get_gid(m: &[u8], at: usize) -> [u8; 16] {
    let mut g = [0u8; 16];
    g.copy_from_slice(&m[at..at + 16]);
    g
}
/// `width` bits starting `msb_offset` bits below the MSB of byte `at`.
fn get_bits(m: &[u8], at: usize, msb_offset: u32, width: u32) -> u8 {
    (m[at] >> (8 - msb_offset - width)) & ((1u16 << width) - 1) as u8
}
fn put16(m: &mut [u8], at: usize, v: u16) {
    m[at..at + 2].copy_from_slice(&v.to_be_bytes());
}
fn put24(m: &mut [u8], at: usize, v: u32) {
    m[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}
fn put32(m: &mut [u8], at: usize, v: u32) {
    m[at..at + 4].copy_from_slice(&v.to_be_bytes());
}
fn put64(m: &mut [u8], at: usize, v: u64) {
    m[at..at + 8].copy_from_slice(&v.to_be_bytes());
}
fn put_bits(m: &mut [u8], at: usize, msb_offset: u32, width: u32, v: u8) {
    let mask = (((1u16 << width) - 1) as u8) << (8 - msb_offset - width);
    m[at] = (m[at] & !mask) | ((v << (8 - msb_offset - width)) & mask);
}

/// Checks that `value` fits `bits` bits, for encoding.
fn fits(field: &'static str, value: u64, bits: u32) -> Result<(), CmError> {
    if bits < 64 && value >> bits != 0 {
        Err(CmError::FieldRange { field, value })
    } else {
        Ok(())
    }
}

fn put_private(
    m: &mut [u8],
    at: usize,
    cap: usize,
    field: &'static str,
    data: &[u8],
) -> Result<(), CmError> {
    if data.len() > cap {
        return Err(CmError::LengthField {
            field,
            value: data.len(),
            max: cap,
        });
    }
    m[at..at + data.len()].copy_from_slice(data);
    Ok(())
}

/// One path as REQ (primary at 52, alternate at 96) and LAP carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmPath {
    pub local_lid: u16,
    pub remote_lid: u16,
    pub local_gid: [u8; 16],
    pub remote_gid: [u8; 16],
    /// 20 bits.
    pub flow_label: u32,
    /// 6 bits (IB static rate enum).
    pub packet_rate: u8,
    pub traffic_class: u8,
    pub hop_limit: u8,
    /// 4 bits.
    pub sl: u8,
    pub subnet_local: bool,
    /// 5 bits: 4.096 µs · 2^t.
    pub local_ack_timeout: u8,
}

impl CmPath {
    /// REQ layout (table 106): LIDs, GIDs, flow label | rate, TC, hop limit, SL | SL-local,
    /// ACK timeout, 44 bytes from `at`.
    fn parse_req(m: &[u8], at: usize) -> CmPath {
        CmPath {
            local_lid: get16(m, at),
            remote_lid: get16(m, at + 2),
            local_gid: get_gid(m, at + 4),
            remote_gid: get_gid(m, at + 20),
            flow_label: get32(m, at + 36) >> 12,
            packet_rate: get_bits(m, at + 39, 2, 6),
            traffic_class: m[at + 40],
            hop_limit: m[at + 41],
            sl: get_bits(m, at + 42, 0, 4),
            subnet_local: get_bits(m, at + 42, 4, 1) != 0,
            local_ack_timeout: get_bits(m, at + 43, 0, 5),
        }
    }

    fn check(&self) -> Result<(), CmError> {
        fits("flow label", self.flow_label.into(), 20)?;
        fits("packet rate", self.packet_rate.into(), 6)?;
        fits("SL", self.sl.into(), 4)?;
        fits("local ACK timeout", self.local_ack_timeout.into(), 5)
    }

    fn emit_req(&self, m: &mut [u8], at: usize) -> Result<(), CmError> {
        self.check()?;
        put16(m, at, self.local_lid);
        put16(m, at + 2, self.remote_lid);
        m[at + 4..at + 20].copy_from_slice(&self.local_gid);
        m[at + 20..at + 36].copy_from_slice(&self.remote_gid);
        put32(m, at + 36, self.flow_label << 12);
        put_bits(m, at + 39, 2, 6, self.packet_rate);
        m[at + 40] = self.traffic_class;
        m[at + 41] = self.hop_limit;
        put_bits(m, at + 42, 0, 4, self.sl);
        put_bits(m, at + 42, 4, 1, self.subnet_local as u8);
        put_bits(m, at + 43, 0, 5, self.local_ack_timeout);
        Ok(())
    }

    /// LAP layout (table 115) orders the second word differently: flow label | TC, hop
    /// limit, rate, SL | SL-local, ACK timeout.
    fn parse_lap(m: &[u8], at: usize) -> CmPath {
        CmPath {
            local_lid: get16(m, at),
            remote_lid: get16(m, at + 2),
            local_gid: get_gid(m, at + 4),
            remote_gid: get_gid(m, at + 20),
            flow_label: get32(m, at + 36) >> 12,
            traffic_class: m[at + 39],
            hop_limit: m[at + 40],
            packet_rate: get_bits(m, at + 41, 2, 6),
            sl: get_bits(m, at + 42, 0, 4),
            subnet_local: get_bits(m, at + 42, 4, 1) != 0,
            local_ack_timeout: get_bits(m, at + 43, 0, 5),
        }
    }

    fn emit_lap(&self, m: &mut [u8], at: usize) -> Result<(), CmError> {
        self.check()?;
        put16(m, at, self.local_lid);
        put16(m, at + 2, self.remote_lid);
        m[at + 4..at + 20].copy_from_slice(&self.local_gid);
        m[at + 20..at + 36].copy_from_slice(&self.remote_gid);
        put32(m, at + 36, self.flow_label << 12);
        m[at + 39] = self.traffic_class;
        m[at + 40] = self.hop_limit;
        put_bits(m, at + 41, 2, 6, self.packet_rate);
        put_bits(m, at + 42, 0, 4, self.sl);
        put_bits(m, at + 42, 4, 1, self.subnet_local as u8);
        put_bits(m, at + 43, 0, 5, self.local_ack_timeout);
        Ok(())
    }
}

/// REQ (table 106).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReqRepr {
    pub local_comm_id: u32,
    /// 24 bits (ECE vendor ID).
    pub vendor_id: u32,
    pub service_id: u64,
    pub local_ca_guid: u64,
    pub local_qkey: u32,
    /// 24 bits.
    pub local_qpn: u32,
    pub responder_resources: u8,
    /// 24 bits.
    pub local_eecn: u32,
    pub initiator_depth: u8,
    /// 24 bits.
    pub remote_eecn: u32,
    /// 5 bits.
    pub remote_cm_response_timeout: u8,
    /// 2 bits: [`transport`].
    pub transport_type: u8,
    pub end_to_end_flow_control: bool,
    /// 24 bits.
    pub starting_psn: u32,
    /// 5 bits.
    pub local_cm_response_timeout: u8,
    /// 3 bits.
    pub retry_count: u8,
    pub pkey: u16,
    /// 4 bits, IB MTU enum (1 = 256 … 5 = 4096).
    pub path_mtu: u8,
    pub rdc_exists: bool,
    /// 3 bits.
    pub rnr_retry_count: u8,
    /// 4 bits.
    pub max_cm_retries: u8,
    pub srq: bool,
    /// 3 bits (XRC: transport type 3 with extended type 1).
    pub extended_transport_type: u8,
    pub primary_path: CmPath,
    pub alternate_path: CmPath,
    pub sap_supported: bool,
    /// The whole 92-byte field on decode; at most 92 bytes on encode (zero padded).
    pub private_data: Vec<u8>,
}

impl ReqRepr {
    fn parse(m: &[u8]) -> ReqRepr {
        ReqRepr {
            local_comm_id: get32(m, 0),
            vendor_id: get24(m, 5),
            service_id: get64(m, 8),
            local_ca_guid: get64(m, 16),
            local_qkey: get32(m, 28),
            local_qpn: get24(m, 32),
            responder_resources: m[35],
            local_eecn: get24(m, 36),
            initiator_depth: m[39],
            remote_eecn: get24(m, 40),
            remote_cm_response_timeout: get_bits(m, 43, 0, 5),
            transport_type: get_bits(m, 43, 5, 2),
            end_to_end_flow_control: get_bits(m, 43, 7, 1) != 0,
            starting_psn: get24(m, 44),
            local_cm_response_timeout: get_bits(m, 47, 0, 5),
            retry_count: get_bits(m, 47, 5, 3),
            pkey: get16(m, 48),
            path_mtu: get_bits(m, 50, 0, 4),
            rdc_exists: get_bits(m, 50, 4, 1) != 0,
            rnr_retry_count: get_bits(m, 50, 5, 3),
            max_cm_retries: get_bits(m, 51, 0, 4),
            srq: get_bits(m, 51, 4, 1) != 0,
            extended_transport_type: get_bits(m, 51, 5, 3),
            primary_path: CmPath::parse_req(m, 52),
            alternate_path: CmPath::parse_req(m, 96),
            sap_supported: get_bits(m, 139, 5, 1) != 0,
            private_data: m[140..140 + private_data_len::REQ].to_vec(),
        }
    }

    fn emit(&self, m: &mut [u8]) -> Result<(), CmError> {
        fits("vendor ID", self.vendor_id.into(), 24)?;
        fits("local QPN", self.local_qpn.into(), 24)?;
        fits("local EECN", self.local_eecn.into(), 24)?;
        fits("remote EECN", self.remote_eecn.into(), 24)?;
        fits("starting PSN", self.starting_psn.into(), 24)?;
        fits(
            "remote CM response timeout",
            self.remote_cm_response_timeout.into(),
            5,
        )?;
        fits(
            "local CM response timeout",
            self.local_cm_response_timeout.into(),
            5,
        )?;
        fits("transport type", self.transport_type.into(), 2)?;
        fits("retry count", self.retry_count.into(), 3)?;
        fits("path MTU", self.path_mtu.into(), 4)?;
        fits("RNR retry count", self.rnr_retry_count.into(), 3)?;
        fits("max CM retries", self.max_cm_retries.into(), 4)?;
        fits(
            "extended transport type",
            self.extended_transport_type.into(),
            3,
        )?;
        put32(m, 0, self.local_comm_id);
        put24(m, 5, self.vendor_id);
        put64(m, 8, self.service_id);
        put64(m, 16, self.local_ca_guid);
        put32(m, 28, self.local_qkey);
        put24(m, 32, self.local_qpn);
        m[35] = self.responder_resources;
        put24(m, 36, self.local_eecn);
        m[39] = self.initiator_depth;
        put24(m, 40, self.remote_eecn);
        put_bits(m, 43, 0, 5, self.remote_cm_response_timeout);
        put_bits(m, 43, 5, 2, self.transport_type);
        put_bits(m, 43, 7, 1, self.end_to_end_flow_control as u8);
        put24(m, 44, self.starting_psn);
        put_bits(m, 47, 0, 5, self.local_cm_response_timeout);
        put_bits(m, 47, 5, 3, self.retry_count);
        put16(m, 48, self.pkey);
        put_bits(m, 50, 0, 4, self.path_mtu);
        put_bits(m, 50, 4, 1, self.rdc_exists as u8);
        put_bits(m, 50, 5, 3, self.rnr_retry_count);
        put_bits(m, 51, 0, 4, self.max_cm_retries);
        put_bits(m, 51, 4, 1, self.srq as u8);
        put_bits(m, 51, 5, 3, self.extended_transport_type);
        self.primary_path.emit_req(m, 52)?;
        self.alternate_path.emit_req(m, 96)?;
        put_bits(m, 139, 5, 1, self.sap_supported as u8);
        put_private(
            m,
            140,
            private_data_len::REQ,
            "REQ private data",
            &self.private_data,
        )
    }
}

/// MRA (table 107).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MraRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// 2 bits: [`msg_kind`].
    pub message_mraed: u8,
    /// 5 bits: 4.096 µs · 2^t.
    pub service_timeout: u8,
    pub private_data: Vec<u8>,
}

impl MraRepr {
    fn parse(m: &[u8]) -> MraRepr {
        MraRepr {
            local_comm_id: get32(m, 0),
            remote_comm_id: get32(m, 4),
            message_mraed: get_bits(m, 8, 0, 2),
            service_timeout: get_bits(m, 9, 0, 5),
            private_data: m[10..10 + private_data_len::MRA].to_vec(),
        }
    }
    fn emit(&self, m: &mut [u8]) -> Result<(), CmError> {
        fits("message MRAed", self.message_mraed.into(), 2)?;
        fits("service timeout", self.service_timeout.into(), 5)?;
        put32(m, 0, self.local_comm_id);
        put32(m, 4, self.remote_comm_id);
        put_bits(m, 8, 0, 2, self.message_mraed);
        put_bits(m, 9, 0, 5, self.service_timeout);
        put_private(
            m,
            10,
            private_data_len::MRA,
            "MRA private data",
            &self.private_data,
        )
    }
}

/// REJ (table 108).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// 2 bits: [`msg_kind`].
    pub message_rejected: u8,
    pub reason: RejReason,
    /// Additional rejection information; its length is the 7-bit "Reject Info Length".
    pub ari: Vec<u8>,
    pub private_data: Vec<u8>,
}

impl RejRepr {
    fn parse(m: &[u8]) -> Result<RejRepr, CmError> {
        let ari_len = get_bits(m, 9, 0, 7) as usize;
        if ari_len > ARI_LEN {
            return Err(CmError::LengthField {
                field: "REJ reject info length",
                value: ari_len,
                max: ARI_LEN,
            });
        }
        Ok(RejRepr {
            local_comm_id: get32(m, 0),
            remote_comm_id: get32(m, 4),
            message_rejected: get_bits(m, 8, 0, 2),
            reason: RejReason(get16(m, 10)),
            ari: m[12..12 + ari_len].to_vec(),
            private_data: m[84..84 + private_data_len::REJ].to_vec(),
        })
    }
    fn emit(&self, m: &mut [u8]) -> Result<(), CmError> {
        fits("message rejected", self.message_rejected.into(), 2)?;
        put32(m, 0, self.local_comm_id);
        put32(m, 4, self.remote_comm_id);
        put_bits(m, 8, 0, 2, self.message_rejected);
        put_private(m, 12, ARI_LEN, "REJ ARI", &self.ari)?;
        put_bits(m, 9, 0, 7, self.ari.len() as u8);
        put16(m, 10, self.reason.0);
        put_private(
            m,
            84,
            private_data_len::REJ,
            "REJ private data",
            &self.private_data,
        )
    }
}

/// REP (table 110).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub local_qkey: u32,
    /// 24 bits.
    pub local_qpn: u32,
    /// 24 bits, split over bytes 15, 19 and 23 (ECE).
    pub vendor_id: u32,
    /// 24 bits.
    pub local_eecn: u32,
    /// 24 bits.
    pub starting_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    /// 5 bits.
    pub target_ack_delay: u8,
    /// 2 bits.
    pub failover_accepted: u8,
    pub end_to_end_flow_control: bool,
    /// 3 bits.
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub local_ca_guid: u64,
    pub private_data: Vec<u8>,
}

impl RepRepr {
    fn parse(m: &[u8]) -> RepRepr {
        RepRepr {
            local_comm_id: get32(m, 0),
            remote_comm_id: get32(m, 4),
            local_qkey: get32(m, 8),
            local_qpn: get24(m, 12),
            vendor_id: u32::from_be_bytes([0, m[15], m[19], m[23]]),
            local_eecn: get24(m, 16),
            starting_psn: get24(m, 20),
            responder_resources: m[24],
            initiator_depth: m[25],
            target_ack_delay: get_bits(m, 26, 0, 5),
            failover_accepted: get_bits(m, 26, 5, 2),
            end_to_end_flow_control: get_bits(m, 26, 7, 1) != 0,
            rnr_retry_count: get_bits(m, 27, 0, 3),
            srq: get_bits(m, 27, 3, 1) != 0,
            local_ca_guid: get64(m, 28),
            private_data: m[36..36 + private_data_len::REP].to_vec(),
        }
    }
    fn emit(&self, m: &mut [u8]) -> Result<(), CmError> {
        fits("local QPN", self.local_qpn.into(), 24)?;
        fits("vendor ID", self.vendor_id.into(), 24)?;
        fits("local EECN", self.local_eecn.into(), 24)?;
        fits("starting PSN", self.starting_psn.into(), 24)?;
        fits("target ACK delay", self.target_ack_delay.into(), 5)?;
        fits("failover accepted", self.failover_accepted.into(), 2)?;
        fits("RNR retry count", self.rnr_retry_count.into(), 3)?;
        put32(m, 0, self.local_comm_id);
        put32(m, 4, self.remote_comm_id);
        put32(m, 8, self.local_qkey);
        put24(m, 12, self.local_qpn);
        put24(m, 16, self.local_eecn);
        put24(m, 20, self.starting_psn);
        let v = self.vendor_id.to_be_bytes();
        m[15] = v[1];
        m[19] = v[2];
        m[23] = v[3];
        m[24] = self.responder_resources;
        m[25] = self.initiator_depth;
        put_bits(m, 26, 0, 5, self.target_ack_delay);
        put_bits(m, 26, 5, 2, self.failover_accepted);
        put_bits(m, 26, 7, 1, self.end_to_end_flow_control as u8);
        put_bits(m, 27, 0, 3, self.rnr_retry_count);
        put_bits(m, 27, 3, 1, self.srq as u8);
        put64(m, 28, self.local_ca_guid);
        put_private(
            m,
            36,
            private_data_len::REP,
            "REP private data",
            &self.private_data,
        )
    }
}

/// RTU (table 111) and DREP (table 113) share a layout: two comm IDs and private data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RtuRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub private_data: Vec<u8>,
}

/// DREP (table 113).
pub type DrepRepr = RtuRepr;

impl RtuRepr {
    fn parse(m: &[u8]) -> RtuRepr {
        RtuRepr {
            local_comm_id: get32(m, 0),
            remote_comm_id: get32(m, 4),
            private_data: m[8..8 + private_data_len::RTU].to_vec(),
        }
    }
    fn emit(&self, m: &mut [u8], what: &'static str) -> Result<(), CmError> {
        put32(m, 0, self.local_comm_id);
        put32(m, 4, self.remote_comm_id);
        put_private(m, 8, private_data_len::RTU, what, &self.private_data)
    }
}

/// DREQ (table 112).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DreqRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// 24 bits: the QPN of the receiver of this DREQ.
    pub remote_qpn_eecn: u32,
    pub private_data: Vec<u8>,
}

impl DreqRepr {
    fn parse(m: &[u8]) -> DreqRepr {
        DreqRepr {
            local_comm_id: get32(m, 0),
            remote_comm_id: get32(m, 4),
            remote_qpn_eecn: get24(m, 8),
            private_data: m[12..12 + private_data_len::DREQ].to_vec(),
        }
    }
    fn emit(&self, m: &mut [u8]) -> Result<(), CmError> {
        fits("remote QPN/EECN", self.remote_qpn_eecn.into(), 24)?;
        put32(m, 0, self.local_comm_id);
        put32(m, 4, self.remote_comm_id);
        put24(m, 8, self.remote_qpn_eecn);
        put_private(
            m,
            12,
            private_data_len::DREQ,
            "DREQ private data",
            &self.private_data,
        )
    }
}

/// SIDR_REQ (table 119).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrReqRepr {
    pub request_id: u32,
    pub pkey: u16,
    pub service_id: u64,
    pub private_data: Vec<u8>,
}

impl SidrReqRepr {
    fn parse(m: &[u8]) -> SidrReqRepr {
        SidrReqRepr {
            request_id: get32(m, 0),
            pkey: get16(m, 4),
            service_id: get64(m, 8),
            private_data: m[16..16 + private_data_len::SIDR_REQ].to_vec(),
        }
    }
    fn emit(&self, m: &mut [u8]) -> Result<(), CmError> {
        put32(m, 0, self.request_id);
        put16(m, 4, self.pkey);
        put64(m, 8, self.service_id);
        put_private(
            m,
            16,
            private_data_len::SIDR_REQ,
            "SIDR_REQ private data",
            &self.private_data,
        )
    }
}

/// SIDR_REP (table 120).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrRepRepr {
    pub request_id: u32,
    /// [`sidr_status`].
    pub status: u8,
    /// 24 bits, split over bytes 6–7 and 11 (ECE).
    pub vendor_id: u32,
    /// 24 bits.
    pub qpn: u32,
    pub service_id: u64,
    pub qkey: u32,
    /// Its length is the "Additional Information Length" byte.
    pub additional_info: Vec<u8>,
    pub private_data: Vec<u8>,
}

impl SidrRepRepr {
    fn parse(m: &[u8]) -> Result<SidrRepRepr, CmError> {
        let info_len = m[5] as usize;
        if info_len > ARI_LEN {
            return Err(CmError::LengthField {
                field: "SIDR_REP additional information length",
                value: info_len,
                max: ARI_LEN,
            });
        }
        Ok(SidrRepRepr {
            request_id: get32(m, 0),
            status: m[4],
            vendor_id: u32::from_be_bytes([0, m[6], m[7], m[11]]),
            qpn: get24(m, 8),
            service_id: get64(m, 12),
            qkey: get32(m, 20),
            additional_info: m[24..24 + info_len].to_vec(),
            private_data: m[96..96 + private_data_len::SIDR_REP].to_vec(),
        })
    }
    fn emit(&self, m: &mut [u8]) -> Result<(), CmError> {
        fits("QPN", self.qpn.into(), 24)?;
        fits("vendor ID", self.vendor_id.into(), 24)?;
        put32(m, 0, self.request_id);
        m[4] = self.status;
        put_private(
            m,
            24,
            ARI_LEN,
            "SIDR_REP additional information",
            &self.additional_info,
        )?;
        m[5] = self.additional_info.len() as u8;
        put24(m, 8, self.qpn);
        let v = self.vendor_id.to_be_bytes();
        m[6] = v[1];
        m[7] = v[2];
        m[11] = v[3];
        put64(m, 12, self.service_id);
        put32(m, 20, self.qkey);
        put_private(
            m,
            96,
            private_data_len::SIDR_REP,
            "SIDR_REP private data",
            &self.private_data,
        )
    }
}

/// LAP (table 115): load alternate path. softroce never sends it (rxe has no APM) but
/// decodes it to answer and to log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LapRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// 24 bits.
    pub remote_qpn_eecn: u32,
    /// 5 bits.
    pub remote_cm_response_timeout: u8,
    pub alternate_path: CmPath,
    pub private_data: Vec<u8>,
}

impl LapRepr {
    fn parse(m: &[u8]) -> LapRepr {
        LapRepr {
            local_comm_id: get32(m, 0),
            remote_comm_id: get32(m, 4),
            remote_qpn_eecn: get24(m, 12),
            remote_cm_response_timeout: get_bits(m, 15, 0, 5),
            alternate_path: CmPath::parse_lap(m, 20),
            private_data: m[64..64 + private_data_len::LAP].to_vec(),
        }
    }
    fn emit(&self, m: &mut [u8]) -> Result<(), CmError> {
        fits("remote QPN/EECN", self.remote_qpn_eecn.into(), 24)?;
        fits(
            "remote CM response timeout",
            self.remote_cm_response_timeout.into(),
            5,
        )?;
        put32(m, 0, self.local_comm_id);
        put32(m, 4, self.remote_comm_id);
        put24(m, 12, self.remote_qpn_eecn);
        put_bits(m, 15, 0, 5, self.remote_cm_response_timeout);
        self.alternate_path.emit_lap(m, 20)?;
        put_private(
            m,
            64,
            private_data_len::LAP,
            "LAP private data",
            &self.private_data,
        )
    }
}

/// APR (table 116): alternate path response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AprRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub ap_status: u8,
    pub additional_info: Vec<u8>,
    pub private_data: Vec<u8>,
}

impl AprRepr {
    fn parse(m: &[u8]) -> Result<AprRepr, CmError> {
        let info_len = m[8] as usize;
        if info_len > ARI_LEN {
            return Err(CmError::LengthField {
                field: "APR additional information length",
                value: info_len,
                max: ARI_LEN,
            });
        }
        Ok(AprRepr {
            local_comm_id: get32(m, 0),
            remote_comm_id: get32(m, 4),
            ap_status: m[9],
            additional_info: m[12..12 + info_len].to_vec(),
            private_data: m[84..84 + private_data_len::APR].to_vec(),
        })
    }
    fn emit(&self, m: &mut [u8]) -> Result<(), CmError> {
        put32(m, 0, self.local_comm_id);
        put32(m, 4, self.remote_comm_id);
        put_private(
            m,
            12,
            ARI_LEN,
            "APR additional information",
            &self.additional_info,
        )?;
        m[8] = self.additional_info.len() as u8;
        m[9] = self.ap_status;
        put_private(
            m,
            84,
            private_data_len::APR,
            "APR private data",
            &self.private_data,
        )
    }
}

/// Any CM message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmMessage {
    Req(ReqRepr),
    Mra(MraRepr),
    Rej(RejRepr),
    Rep(RepRepr),
    Rtu(RtuRepr),
    Dreq(DreqRepr),
    Drep(DrepRepr),
    SidrReq(SidrReqRepr),
    SidrRep(SidrRepRepr),
    Lap(LapRepr),
    Apr(AprRepr),
}

impl CmMessage {
    pub fn attribute_id(&self) -> u16 {
        match self {
            CmMessage::Req(_) => attr::REQ,
            CmMessage::Mra(_) => attr::MRA,
            CmMessage::Rej(_) => attr::REJ,
            CmMessage::Rep(_) => attr::REP,
            CmMessage::Rtu(_) => attr::RTU,
            CmMessage::Dreq(_) => attr::DREQ,
            CmMessage::Drep(_) => attr::DREP,
            CmMessage::SidrReq(_) => attr::SIDR_REQ,
            CmMessage::SidrRep(_) => attr::SIDR_REP,
            CmMessage::Lap(_) => attr::LAP,
            CmMessage::Apr(_) => attr::APR,
        }
    }

    pub fn name(&self) -> &'static str {
        crate::wire::mad::cm_attribute_name(self.attribute_id())
    }

    /// The sender's communication ID (SIDR: the request ID).
    pub fn local_comm_id(&self) -> u32 {
        match self {
            CmMessage::Req(r) => r.local_comm_id,
            CmMessage::Mra(r) => r.local_comm_id,
            CmMessage::Rej(r) => r.local_comm_id,
            CmMessage::Rep(r) => r.local_comm_id,
            CmMessage::Rtu(r) | CmMessage::Drep(r) => r.local_comm_id,
            CmMessage::Dreq(r) => r.local_comm_id,
            CmMessage::SidrReq(r) => r.request_id,
            CmMessage::SidrRep(r) => r.request_id,
            CmMessage::Lap(r) => r.local_comm_id,
            CmMessage::Apr(r) => r.local_comm_id,
        }
    }
}

/// A whole CM MAD: the common header and the message its attribute ID names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmMad {
    pub header: MadHeader,
    pub message: CmMessage,
}

impl CmMad {
    /// A MAD as Linux's CM sends it: base version 1, class 0x07 version 2, method Send,
    /// status 0, attribute modifier 0 (no ECE options).
    pub fn new(transaction_id: u64, message: CmMessage) -> CmMad {
        CmMad {
            header: MadHeader {
                base_version: BASE_VERSION,
                mgmt_class: CLASS_CM,
                class_version: CM_CLASS_VERSION,
                method: METHOD_SEND,
                status: 0,
                transaction_id,
                attribute_id: message.attribute_id(),
                attribute_modifier: 0,
            },
            message,
        }
    }

    /// Decodes a CM MAD. `mad` holds at least the 256 bytes of the MAD; more (a receive
    /// buffer's slack) is ignored. The class version is returned, not checked: the CM answers
    /// an unknown version with REJ "invalid class version" (reason 31), which needs the message.
    pub fn parse(mad: &[u8]) -> Result<CmMad, CmError> {
        if mad.len() < MAD_LEN {
            return Err(CmError::Truncated {
                need: MAD_LEN,
                have: mad.len(),
            });
        }
        let header = MadHeader::parse(mad).map_err(|_| CmError::Truncated {
            need: HEADER_LEN,
            have: mad.len(),
        })?;
        if header.base_version != BASE_VERSION {
            return Err(CmError::BadBaseVersion(header.base_version));
        }
        if header.mgmt_class != CLASS_CM {
            return Err(CmError::NotCm(header.mgmt_class));
        }
        if header.method != METHOD_SEND {
            return Err(CmError::BadMethod(header.method));
        }
        let m = &mad[HEADER_LEN..MAD_LEN];
        let message = match header.attribute_id {
            attr::REQ => CmMessage::Req(ReqRepr::parse(m)),
            attr::MRA => CmMessage::Mra(MraRepr::parse(m)),
            attr::REJ => CmMessage::Rej(RejRepr::parse(m)?),
            attr::REP => CmMessage::Rep(RepRepr::parse(m)),
            attr::RTU => CmMessage::Rtu(RtuRepr::parse(m)),
            attr::DREQ => CmMessage::Dreq(DreqRepr::parse(m)),
            attr::DREP => CmMessage::Drep(RtuRepr::parse(m)),
            attr::SIDR_REQ => CmMessage::SidrReq(SidrReqRepr::parse(m)),
            attr::SIDR_REP => CmMessage::SidrRep(SidrRepRepr::parse(m)?),
            attr::LAP => CmMessage::Lap(LapRepr::parse(m)),
            attr::APR => CmMessage::Apr(AprRepr::parse(m)?),
            other => return Err(CmError::UnknownAttribute(other)),
        };
        Ok(CmMad { header, message })
    }

    /// Encodes the 256-byte MAD. The header's attribute ID is taken from the message, so a
    /// header and message cannot disagree. Fails if a field does not fit its bit width or
    /// private data exceeds its area.
    pub fn emit(&self) -> Result<[u8; MAD_LEN], CmError> {
        let mut mad = [0u8; MAD_LEN];
        let mut header = self.header;
        header.attribute_id = self.message.attribute_id();
        header.emit(&mut mad[..HEADER_LEN]);
        let m = &mut mad[HEADER_LEN..];
        match &self.message {
            CmMessage::Req(r) => r.emit(m)?,
            CmMessage::Mra(r) => r.emit(m)?,
            CmMessage::Rej(r) => r.emit(m)?,
            CmMessage::Rep(r) => r.emit(m)?,
            CmMessage::Rtu(r) => r.emit(m, "RTU private data")?,
            CmMessage::Dreq(r) => r.emit(m)?,
            CmMessage::Drep(r) => r.emit(m, "DREP private data")?,
            CmMessage::SidrReq(r) => r.emit(m)?,
            CmMessage::SidrRep(r) => r.emit(m)?,
            CmMessage::Lap(r) => r.emit(m)?,
            CmMessage::Apr(r) => r.emit(m)?,
        }
        Ok(mad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_req() -> ReqRepr {
        ReqRepr {
            local_comm_id: 0x74bac28e,
            vendor_id: 0x123456,
            service_id: 0x0000_0000_0106_1c06,
            local_ca_guid: 0x5054_00ff_fe4c_ab01,
            local_qkey: 0,
            local_qpn: 0x21,
            responder_resources: 1,
            local_eecn: 0,
            initiator_depth: 1,
            remote_eecn: 0,
            remote_cm_response_timeout: 20,
            transport_type: transport::RC,
            end_to_end_flow_control: true,
            starting_psn: 0xc455a2,
            local_cm_response_timeout: 20,
            retry_count: 7,
            pkey: 0xffff,
            path_mtu: 3,
            rdc_exists: false,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            srq: true,
            extended_transport_type: 0,
            primary_path: CmPath {
                local_lid: 0xffff,
                remote_lid: 0xffff,
                local_gid: [1; 16],
                remote_gid: [2; 16],
                flow_label: 0xfdede,
                packet_rate: 0x2a,
                traffic_class: 0x10,
                hop_limit: 64,
                sl: 5,
                subnet_local: true,
                local_ack_timeout: 19,
            },
            alternate_path: CmPath::default(),
            sap_supported: true,
            private_data: vec![0xab; 92],
        }
    }

    #[test]
    fn req_round_trips_and_places_bit_fields_at_the_msb_end() {
        let mad = CmMad::new(0x2_8ec2_ba74, CmMessage::Req(sample_req()));
        let bytes = mad.emit().unwrap();
        let m = &bytes[HEADER_LEN..];
        assert_eq!(&bytes[..4], &[1, 7, 2, 3]);
        assert_eq!(&bytes[16..18], &[0x00, 0x10]);
        assert_eq!(m[43], (20 << 3) | 1, "timeout 20, RC, flow control");
        assert_eq!(m[47], (20 << 3) | 7);
        assert_eq!(m[50], (3 << 4) | 7);
        assert_eq!(m[51], (15 << 4) | (1 << 3));
        assert_eq!(&m[88..92], &[0xfd, 0xed, 0xe0, 0x2a]);
        assert_eq!(m[94], (5 << 4) | (1 << 3));
        assert_eq!(m[95], 19 << 3);
        assert_eq!(m[139], 1 << 2, "SAP supported is bit 5 from the MSB");
        assert_eq!(CmMad::parse(&bytes).unwrap(), mad);
    }

    #[test]
    fn every_message_round_trips() {
        let msgs = vec![
            CmMessage::Mra(MraRepr {
                local_comm_id: 1,
                remote_comm_id: 2,
                message_mraed: msg_kind::REP,
                service_timeout: 24,
                private_data: vec![7; 222],
            }),
            CmMessage::Rej(RejRepr {
                local_comm_id: 1,
                remote_comm_id: 2,
                message_rejected: msg_kind::OTHER,
                reason: RejReason::TIMEOUT,
                ari: vec![9; 8],
                private_data: vec![3; 148],
            }),
            CmMessage::Rep(RepRepr {
                local_comm_id: 1,
                remote_comm_id: 2,
                local_qkey: 3,
                local_qpn: 0xabcdef,
                vendor_id: 0x010203,
                local_eecn: 0x1234,
                starting_psn: 0xfedcba,
                responder_resources: 4,
                initiator_depth: 5,
                target_ack_delay: 15,
                failover_accepted: 2,
                end_to_end_flow_control: true,
                rnr_retry_count: 6,
                srq: true,
                local_ca_guid: 0x1122334455667788,
                private_data: vec![1; 196],
            }),
            CmMessage::Rtu(RtuRepr {
                local_comm_id: 1,
                remote_comm_id: 2,
                private_data: vec![2; 224],
            }),
            CmMessage::Dreq(DreqRepr {
                local_comm_id: 1,
                remote_comm_id: 2,
                remote_qpn_eecn: 0x22,
                private_data: vec![4; 220],
            }),
            CmMessage::Drep(RtuRepr {
                local_comm_id: 1,
                remote_comm_id: 2,
                private_data: vec![5; 224],
            }),
            CmMessage::SidrReq(SidrReqRepr {
                request_id: 9,
                pkey: 0xffff,
                service_id: 0x0111_1c06,
                private_data: vec![6; 216],
            }),
            CmMessage::SidrRep(SidrRepRepr {
                request_id: 9,
                status: sidr_status::SUCCESS,
                vendor_id: 0xa0b0c0,
                qpn: 0x23,
                service_id: 0x0111_1c06,
                qkey: 0x0123_4567,
                additional_info: vec![1, 2, 3],
                private_data: vec![8; 136],
            }),
            CmMessage::Lap(LapRepr {
                local_comm_id: 1,
                remote_comm_id: 2,
                remote_qpn_eecn: 0x33,
                remote_cm_response_timeout: 20,
                alternate_path: sample_req().primary_path,
                private_data: vec![9; 168],
            }),
            CmMessage::Apr(AprRepr {
                local_comm_id: 1,
                remote_comm_id: 2,
                ap_status: 3,
                additional_info: vec![4; 72],
                private_data: vec![5; 148],
            }),
        ];
        for msg in msgs {
            let mad = CmMad::new(42, msg);
            let bytes = mad.emit().unwrap();
            assert_eq!(CmMad::parse(&bytes).unwrap(), mad, "{}", mad.message.name());
        }
    }

    #[test]
    fn malformed_input_is_a_typed_error() {
        let good = CmMad::new(1, CmMessage::Req(sample_req())).emit().unwrap();
        assert_eq!(
            CmMad::parse(&good[..255]),
            Err(CmError::Truncated {
                need: 256,
                have: 255
            })
        );
        let mut b = good;
        b[1] = 0x04;
        assert_eq!(CmMad::parse(&b), Err(CmError::NotCm(0x04)));
        let mut b = good;
        b[0] = 2;
        assert_eq!(CmMad::parse(&b), Err(CmError::BadBaseVersion(2)));
        let mut b = good;
        b[3] = 0x81;
        assert_eq!(CmMad::parse(&b), Err(CmError::BadMethod(0x81)));
        let mut b = good;
        b[17] = 0x1b;
        assert_eq!(CmMad::parse(&b), Err(CmError::UnknownAttribute(0x1b)));
        let mut b = good;
        b[17] = 0x12;
        b[HEADER_LEN + 9] = 73 << 1;
        assert!(matches!(
            CmMad::parse(&b),
            Err(CmError::LengthField { value: 73, .. })
        ));
        let mut b = good;
        b[17] = 0x18;
        b[HEADER_LEN + 5] = 200;
        assert!(matches!(
            CmMad::parse(&b),
            Err(CmError::LengthField { value: 200, .. })
        ));
    }

    #[test]
    fn encoding_rejects_values_wider_than_their_fields() {
        let mut req = sample_req();
        req.starting_psn = 1 << 24;
        assert!(matches!(
            CmMad::new(1, CmMessage::Req(req)).emit(),
            Err(CmError::FieldRange {
                field: "starting PSN",
                ..
            })
        ));
        let mut req = sample_req();
        req.private_data = vec![0; 93];
        assert!(matches!(
            CmMad::new(1, CmMessage::Req(req)).emit(),
            Err(CmError::LengthField {
                value: 93,
                max: 92,
                ..
            })
        ));
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // A cheap deterministic sweep (the proptest in tests/ covers more): every attribute ID
        // with every byte pattern in the length fields.
        let mut b = [0u8; MAD_LEN];
        b[0] = 1;
        b[1] = CLASS_CM;
        b[3] = METHOD_SEND;
        for attr in 0u16..0x20 {
            for fill in [0x00u8, 0x5a, 0xff] {
                b[HEADER_LEN..].fill(fill);
                b[16..18].copy_from_slice(&attr.to_be_bytes());
                let _ = CmMad::parse(&b);
            }
        }
    }
}
