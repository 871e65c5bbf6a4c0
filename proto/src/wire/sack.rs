//! softroce's selective acknowledgement (SACK) report: the payload of
//! [`Opcode::SOFTROCE_SACK`](super::Opcode::SOFTROCE_SACK).
//!
//! Only ever sent between two softroce devices that negotiated selective retransmission
//! (`docs/loss-recovery.md`); a kernel rxe peer never sees one. The packet is
//! BTH (PSN = the first PSN the responder lacks, its ePSN) + AETH (syndrome NAK PSN sequence
//! error, the responder's MSN) + this payload + ICRC. The opcode is one of the
//! manufacturer-specific ones (0xC0..0xFF, IBTA Vol. 1 §9.2.1 table 36), so no IBTA-conformant
//! receiver confuses it with a standard ACK; the AETH keeps its standard meaning, so a capture
//! reads it as "NAK: sequence error at ePSN" plus the bitmap.
//!
//! Payload layout (big-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | version, [`VERSION`] |
//! | 1 | 1 | reserved, 0 |
//! | 2 | 2 | `nbits`: bitmap length in bits, a multiple of 32, at most [`MAX_BITS`] |
//! | 4 | nbits / 8 | bitmap: bit `k` (byte `k / 8`, mask `0x80 >> (k % 8)`) set when the responder holds PSN ePSN + 1 + k |

use super::{Error, Result};

/// The format version this code writes and reads.
pub const VERSION: u8 = 1;
/// Bytes before the bitmap.
pub const HEADER_LEN: usize = 4;
/// The largest bitmap: one bit per PSN of the largest selective window.
pub const MAX_BITS: usize = 2048;

/// A parsed SACK bitmap.
#[derive(Clone, PartialEq, Eq)]
pub struct SackRepr {
    nbits: u16,
    bitmap: [u8; MAX_BITS / 8],
}

impl core::fmt::Debug for SackRepr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let held: Vec<usize> = (0..self.len()).filter(|&k| self.get(k)).collect();
        f.debug_struct("SackRepr")
            .field("nbits", &self.nbits)
            .field("held", &held)
            .finish()
    }
}

impl Default for SackRepr {
    fn default() -> Self {
        SackRepr {
            nbits: 0,
            bitmap: [0; MAX_BITS / 8],
        }
    }
}

impl SackRepr {
    /// A bitmap able to hold bits `0..nbits` (rounded up to a multiple of 32, at most
    /// [`MAX_BITS`]), all clear.
    pub fn with_len(nbits: usize) -> SackRepr {
        SackRepr {
            nbits: (nbits.min(MAX_BITS).div_ceil(32) * 32) as u16,
            ..Default::default()
        }
    }

    /// Number of bits carried.
    pub fn len(&self) -> usize {
        usize::from(self.nbits)
    }

    pub fn is_empty(&self) -> bool {
        self.nbits == 0
    }

    /// Whether bit `k` (PSN ePSN + 1 + k) is set; false beyond the bitmap.
    pub fn get(&self, k: usize) -> bool {
        k < self.len() && self.bitmap[k / 8] & (0x80 >> (k % 8)) != 0
    }

    /// Sets bit `k`; ignored beyond the bitmap.
    pub fn set(&mut self, k: usize) {
        if k < self.len() {
            self.bitmap[k / 8] |= 0x80 >> (k % 8);
        }
    }

    /// Parses a SACK payload. The length must be exactly the header plus the bitmap.
    pub fn parse(payload: &[u8]) -> Result<SackRepr> {
        if payload.len() < HEADER_LEN {
            return Err(Error::Truncated {
                layer: "SACK",
                need: HEADER_LEN,
                have: payload.len(),
            });
        }
        if payload[0] != VERSION {
            return Err(Error::BadVersion {
                layer: "SACK",
                version: payload[0],
            });
        }
        let nbits = usize::from(u16::from_be_bytes([payload[2], payload[3]]));
        if !nbits.is_multiple_of(32) || nbits > MAX_BITS {
            return Err(Error::Malformed("SACK bitmap length"));
        }
        if payload.len() != HEADER_LEN + nbits / 8 {
            return Err(Error::LengthMismatch {
                layer: "SACK bitmap",
                claimed: nbits / 8,
                actual: payload.len() - HEADER_LEN,
            });
        }
        let mut r = SackRepr {
            nbits: nbits as u16,
            ..Default::default()
        };
        r.bitmap[..nbits / 8].copy_from_slice(&payload[HEADER_LEN..]);
        Ok(r)
    }

    /// Bytes [`SackRepr::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.len() / 8
    }

    /// Writes the payload into `buf[..buffer_len()]`. Returns false if `buf` is too short.
    pub fn emit(&self, buf: &mut [u8]) -> bool {
        let n = self.buffer_len();
        let Some(out) = buf.get_mut(..n) else {
            return false;
        };
        out[0] = VERSION;
        out[1] = 0;
        out[2..4].copy_from_slice(&self.nbits.to_be_bytes());
        out[HEADER_LEN..].copy_from_slice(&self.bitmap[..self.len() / 8]);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_numbers_bits_from_the_most_significant() {
        let mut s = SackRepr::with_len(40);
        assert_eq!(s.len(), 64);
        for k in [0, 7, 8, 63] {
            s.set(k);
        }
        s.set(64); // beyond: ignored
        let mut buf = [0u8; 12];
        assert!(s.emit(&mut buf));
        assert_eq!(buf, [1, 0, 0, 64, 0x81, 0x80, 0, 0, 0, 0, 0, 0x01]);
        let p = SackRepr::parse(&buf).unwrap();
        assert_eq!(p, s);
        assert!(p.get(0) && p.get(7) && p.get(8) && p.get(63));
        assert!(!p.get(1) && !p.get(64) && !p.get(5000));
    }

    #[test]
    fn refuses_malformed_payloads() {
        assert!(SackRepr::parse(&[1, 0, 0]).is_err());
        assert!(SackRepr::parse(&[2, 0, 0, 0]).is_err(), "version");
        assert!(SackRepr::parse(&[1, 0, 0, 8, 0]).is_err(), "not 32-bit");
        assert!(SackRepr::parse(&[1, 0, 0, 32, 0, 0, 0]).is_err(), "short");
        assert!(SackRepr::parse(&[1, 0, 0x10, 0x20]).is_err(), "too long");
        let empty = SackRepr::parse(&[1, 0, 0, 0]).unwrap();
        assert!(empty.is_empty());
        assert!(!SackRepr::default().emit(&mut [0u8; 3]));
    }
}
