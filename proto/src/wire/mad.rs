//! Management datagrams on QP1 (IBTA Vol. 1 §13.4) and a summary of the connection manager's
//! messages (§12.6), enough for `pcap check -v` and for logging. The full CM state machine
//! belongs to the rdma_cm work; this module only decodes.

use super::{be, check_len, Result};
use crate::types::{Psn, Qpn};

pub const MAD_LEN: usize = 256;
pub const HEADER_LEN: usize = 24;
/// Management class of the communication manager.
pub const CLASS_CM: u8 = 0x07;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MadHeader {
    pub base_version: u8,
    pub mgmt_class: u8,
    pub class_version: u8,
    /// Method with the response bit (bit 7).
    pub method: u8,
    pub status: u16,
    pub transaction_id: u64,
    pub attribute_id: u16,
    pub attribute_modifier: u32,
}

impl MadHeader {
    pub fn parse(b: &[u8]) -> Result<MadHeader> {
        check_len("MAD header", b, HEADER_LEN)?;
        Ok(MadHeader {
            base_version: b[0],
            mgmt_class: b[1],
            class_version: b[2],
            method: b[3],
            status: be::u16_at(b, 4),
            transaction_id: be::u64_at(b, 8),
            attribute_id: be::u16_at(b, 16),
            attribute_modifier: be::u32_at(b, 20),
        })
    }

    pub fn emit(&self, b: &mut [u8]) {
        b[0] = self.base_version;
        b[1] = self.mgmt_class;
        b[2] = self.class_version;
        b[3] = self.method;
        be::put_u16(b, 4, self.status);
        be::put_u16(b, 6, 0);
        be::put_u64(b, 8, self.transaction_id);
        be::put_u16(b, 16, self.attribute_id);
        be::put_u16(b, 18, 0);
        be::put_u32(b, 20, self.attribute_modifier);
    }
}

/// CM attribute IDs (IBTA table 104).
pub fn cm_attribute_name(id: u16) -> &'static str {
    match id {
        0x0001 => "ClassPortInfo",
        0x0010 => "REQ",
        0x0011 => "MRA",
        0x0012 => "REJ",
        0x0013 => "REP",
        0x0014 => "RTU",
        0x0015 => "DREQ",
        0x0016 => "DREP",
        0x0017 => "SIDR_REQ",
        0x0018 => "SIDR_REP",
        0x0019 => "LAP",
        0x001a => "APR",
        _ => "unknown",
    }
}

/// The fields of a CM message that identify a connection, for display.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmSummary {
    pub name: &'static str,
    pub local_comm_id: u32,
    pub remote_comm_id: Option<u32>,
    pub service_id: Option<u64>,
    pub qpn: Option<Qpn>,
    pub starting_psn: Option<Psn>,
    /// REJ reason or SIDR_REP status.
    pub reason: Option<u16>,
}

/// Decodes the identifying fields of a CM message (`mad` is the whole 256-byte MAD).
pub fn cm_summary(mad: &[u8]) -> Result<CmSummary> {
    check_len("CM MAD", mad, MAD_LEN)?;
    let h = MadHeader::parse(mad)?;
    let m = &mad[HEADER_LEN..];
    let mut s = CmSummary {
        name: cm_attribute_name(h.attribute_id),
        local_comm_id: be::u32_at(m, 0),
        remote_comm_id: None,
        service_id: None,
        qpn: None,
        starting_psn: None,
        reason: None,
    };
    match h.attribute_id {
        // REQ (table 106)
        0x0010 => {
            s.service_id = Some(be::u64_at(m, 8));
            s.qpn = Some(Qpn::new(be::u24_at(m, 32)));
            s.starting_psn = Some(Psn::new(be::u24_at(m, 44)));
        }
        // REP (table 107)
        0x0013 => {
            s.remote_comm_id = Some(be::u32_at(m, 4));
            s.qpn = Some(Qpn::new(be::u24_at(m, 12)));
            s.starting_psn = Some(Psn::new(be::u24_at(m, 20)));
        }
        // REJ (table 108)
        0x0012 => {
            s.remote_comm_id = Some(be::u32_at(m, 4));
            s.reason = Some(be::u16_at(m, 10));
        }
        // MRA, RTU, DREQ, DREP, LAP, APR
        0x0011 | 0x0014 | 0x0015 | 0x0016 | 0x0019 | 0x001a => {
            s.remote_comm_id = Some(be::u32_at(m, 4));
            if h.attribute_id == 0x0015 {
                s.qpn = Some(Qpn::new(be::u24_at(m, 8)));
            }
        }
        // SIDR_REQ (table 119): request ID, P_Key, service ID
        0x0017 => s.service_id = Some(be::u64_at(m, 8)),
        // SIDR_REP (table 120): request ID, status, QPN, service ID, Q_Key
        0x0018 => {
            s.reason = Some(m[4] as u16);
            s.qpn = Some(Qpn::new(be::u24_at(m, 8)));
            s.service_id = Some(be::u64_at(m, 12));
        }
        _ => {}
    }
    Ok(s)
}
