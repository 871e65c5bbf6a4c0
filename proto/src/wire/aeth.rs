//! The ACK Extended Transport Header (IBTA Vol. 1 §9.3.5): syndrome and MSN.

use super::{be, Result};

pub const HEADER_LEN: usize = 4;

/// NAK codes (syndrome bits 4..0 when bits 6..5 are 11b), IBTA table 45.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    PsnSequenceError,
    InvalidRequest,
    RemoteAccessError,
    RemoteOperationalError,
    InvalidRdRequest,
    /// A reserved code (5..31): rxe treats it as an unexpected response.
    Reserved(u8),
}

impl NakCode {
    pub const fn code(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(c) => c & 0x1f,
        }
    }
    pub const fn from_code(c: u8) -> NakCode {
        match c & 0x1f {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            c => NakCode::Reserved(c),
        }
    }
}

/// The decoded AETH syndrome (IBTA table 43).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AethSyndrome {
    /// ACK with a credit count code (rxe always sends 31, "invalid").
    Ack {
        credits: u8,
    },
    /// RNR NAK with a timer code (IBTA table 46).
    RnrNak {
        timer: u8,
    },
    Nak(NakCode),
    /// Syndrome bits 6..5 = 10b, or bit 7 set: reserved.
    Reserved(u8),
}

impl AethSyndrome {
    /// The "no credit information" code rxe always advertises.
    pub const CREDITS_INVALID: u8 = 0x1f;
    pub const ACK: AethSyndrome = AethSyndrome::Ack {
        credits: Self::CREDITS_INVALID,
    };

    pub const fn from_byte(b: u8) -> AethSyndrome {
        if b & 0x80 != 0 {
            return AethSyndrome::Reserved(b);
        }
        match (b >> 5) & 3 {
            0 => AethSyndrome::Ack { credits: b & 0x1f },
            1 => AethSyndrome::RnrNak { timer: b & 0x1f },
            3 => AethSyndrome::Nak(NakCode::from_code(b)),
            _ => AethSyndrome::Reserved(b),
        }
    }

    pub const fn to_byte(self) -> u8 {
        match self {
            AethSyndrome::Ack { credits } => credits & 0x1f,
            AethSyndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            AethSyndrome::Nak(code) => 0x60 | code.code(),
            AethSyndrome::Reserved(b) => b,
        }
    }
}

impl core::fmt::Display for AethSyndrome {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            AethSyndrome::Ack { credits } => write!(f, "ACK credits={credits}"),
            AethSyndrome::RnrNak { timer } => write!(f, "RNR-NAK timer={timer}"),
            AethSyndrome::Nak(NakCode::PsnSequenceError) => f.write_str("NAK PSN-sequence-error"),
            AethSyndrome::Nak(NakCode::InvalidRequest) => f.write_str("NAK invalid-request"),
            AethSyndrome::Nak(NakCode::RemoteAccessError) => f.write_str("NAK remote-access-error"),
            AethSyndrome::Nak(NakCode::RemoteOperationalError) => {
                f.write_str("NAK remote-operational-error")
            }
            AethSyndrome::Nak(NakCode::InvalidRdRequest) => f.write_str("NAK invalid-RD-request"),
            AethSyndrome::Nak(NakCode::Reserved(c)) => write!(f, "NAK reserved({c})"),
            AethSyndrome::Reserved(b) => write!(f, "reserved({b:#04x})"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AethRepr {
    pub syndrome: AethSyndrome,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl AethRepr {
    /// `buf` holds at least the 4 header bytes (checked by the packet view).
    pub fn parse(buf: &[u8]) -> Result<AethRepr> {
        super::check_len("AETH", buf, HEADER_LEN)?;
        Ok(AethRepr {
            syndrome: AethSyndrome::from_byte(buf[0]),
            msn: be::u24_at(buf, 1),
        })
    }
    pub fn emit(&self, buf: &mut [u8]) {
        buf[0] = self.syndrome.to_byte();
        be::put_u24(buf, 1, self.msn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_syndrome_byte_round_trips() {
        for b in 0..=255u8 {
            assert_eq!(AethSyndrome::from_byte(b).to_byte(), b, "{b:#x}");
        }
        assert_eq!(AethSyndrome::from_byte(0x1f), AethSyndrome::ACK);
        assert_eq!(
            AethSyndrome::from_byte(0x2e),
            AethSyndrome::RnrNak { timer: 14 }
        );
        assert_eq!(
            AethSyndrome::from_byte(0x62),
            AethSyndrome::Nak(NakCode::RemoteAccessError)
        );
    }
}
