//! The fixed-size extended transport headers (IBTA Vol. 1 §9.3): DETH, RETH, AtomicETH,
//! AtomicAckETH and FETH. ImmDt and IETH are single 32-bit words and are kept as plain values
//! in [`super::TransportRepr`]. Callers hand each `parse` a slice of at least the header's length
//! (the packet view checks that once).

use super::{be, check_len, Result};
use crate::types::{Qkey, Qpn, Rkey};

/// Datagram Extended Transport Header (§9.3.3), UD only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DethRepr {
    pub qkey: Qkey,
    pub src_qpn: Qpn,
}

impl DethRepr {
    pub const LEN: usize = 8;
    pub fn parse(b: &[u8]) -> Result<Self> {
        check_len("DETH", b, Self::LEN)?;
        Ok(DethRepr {
            qkey: Qkey(be::u32_at(b, 0)),
            src_qpn: Qpn::new(be::u24_at(b, 5)),
        })
    }
    pub fn emit(&self, b: &mut [u8]) {
        be::put_u32(b, 0, self.qkey.0);
        b[4] = 0;
        be::put_u24(b, 5, self.src_qpn.value());
    }
}

/// RDMA Extended Transport Header (§9.3.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RethRepr {
    pub va: u64,
    pub rkey: Rkey,
    /// DMA length in bytes; rxe accepts up to 2^31.
    pub len: u32,
}

impl RethRepr {
    pub const LEN: usize = 16;
    pub fn parse(b: &[u8]) -> Result<Self> {
        check_len("RETH", b, Self::LEN)?;
        Ok(RethRepr {
            va: be::u64_at(b, 0),
            rkey: Rkey(be::u32_at(b, 8)),
            len: be::u32_at(b, 12),
        })
    }
    pub fn emit(&self, b: &mut [u8]) {
        be::put_u64(b, 0, self.va);
        be::put_u32(b, 8, self.rkey.0);
        be::put_u32(b, 12, self.len);
    }
}

/// Atomic Extended Transport Header (§9.3.6). For FETCH_ADD the add value is `swap_add`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicEthRepr {
    pub va: u64,
    pub rkey: Rkey,
    pub swap_add: u64,
    pub compare: u64,
}

impl AtomicEthRepr {
    pub const LEN: usize = 28;
    pub fn parse(b: &[u8]) -> Result<Self> {
        check_len("AtomicETH", b, Self::LEN)?;
        Ok(AtomicEthRepr {
            va: be::u64_at(b, 0),
            rkey: Rkey(be::u32_at(b, 8)),
            swap_add: be::u64_at(b, 12),
            compare: be::u64_at(b, 20),
        })
    }
    pub fn emit(&self, b: &mut [u8]) {
        be::put_u64(b, 0, self.va);
        be::put_u32(b, 8, self.rkey.0);
        be::put_u64(b, 12, self.swap_add);
        be::put_u64(b, 20, self.compare);
    }
}

/// Atomic Acknowledge Extended Transport Header (§9.3.7): the original remote value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicAckEthRepr {
    pub orig: u64,
}

impl AtomicAckEthRepr {
    pub const LEN: usize = 8;
    pub fn parse(b: &[u8]) -> Result<Self> {
        check_len("AtomicAckETH", b, Self::LEN)?;
        Ok(AtomicAckEthRepr {
            orig: be::u64_at(b, 0),
        })
    }
    pub fn emit(&self, b: &mut [u8]) {
        be::put_u64(b, 0, self.orig);
    }
}

/// Flush Extended Transport Header (IBTA Vol. 1 1.5 §9.3.9, rxe 6.2+).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FethRepr {
    /// 0 = memory range, 1 = whole memory region.
    pub selectivity: u8,
    /// Bit 0 = global visibility, bit 1 = persistence.
    pub placement: u8,
}

impl FethRepr {
    pub const LEN: usize = 4;
    pub fn parse(b: &[u8]) -> Result<Self> {
        check_len("FETH", b, Self::LEN)?;
        let w = be::u32_at(b, 0);
        Ok(FethRepr {
            selectivity: ((w >> 4) & 3) as u8,
            placement: (w & 0xf) as u8,
        })
    }
    pub fn emit(&self, b: &mut [u8]) {
        be::put_u32(
            b,
            0,
            (((self.selectivity & 3) as u32) << 4) | (self.placement & 0xf) as u32,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_reject_short_input() {
        let deth = DethRepr {
            qkey: Qkey::GSI,
            src_qpn: Qpn::GSI,
        };
        let mut b = [0u8; 28];
        deth.emit(&mut b);
        assert_eq!(&b[..8], &[0x80, 0x01, 0, 0, 0, 0, 0, 1]);
        assert_eq!(DethRepr::parse(&b).unwrap(), deth);
        assert!(DethRepr::parse(&b[..7]).is_err());

        let atomic = AtomicEthRepr {
            va: 0x1122_3344_5566_7788,
            rkey: Rkey(0xabcd),
            swap_add: 5,
            compare: u64::MAX,
        };
        atomic.emit(&mut b);
        assert_eq!(AtomicEthRepr::parse(&b).unwrap(), atomic);
        assert!(AtomicEthRepr::parse(&b[..27]).is_err());

        let feth = FethRepr {
            selectivity: 1,
            placement: 3,
        };
        feth.emit(&mut b);
        assert_eq!(FethRepr::parse(&b).unwrap(), feth);
    }
}
