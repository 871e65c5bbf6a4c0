//! RoCE wire formats: zero-copy views over packet bytes plus plain `Repr` values, in the style
//! of smoltcp's `wire` module.
//!
//! The contract, for every header:
//! - `View::new_checked(buf)` validates the length once; after it returns `Ok`, no accessor
//!   panics. Use it on everything that came from the network.
//! - `View::new_unchecked(buf)` is for emitting into a buffer the caller has sized with
//!   `Repr::buffer_len()` / `header_len()`.
//! - `Repr::parse(&view)` turns a checked view into a validated value; `Repr::emit(&view)` writes
//!   it back. `emit(parse(x)) == x` for every packet that kernel rxe sends.
//!
//! Parsing never panics on any input: every failure is an [`Error`].

pub mod aeth;
pub mod arp;
pub mod bth;
pub mod checksum;
pub mod ecn;
pub mod ethernet;
pub mod ext;
pub mod frame;
pub mod icrc;
pub mod ipv4;
pub mod ipv6;
pub mod mad;
pub mod ndisc;
pub mod opcode;
pub mod packet;
pub mod payload_copy;
pub mod sack;
pub mod udp;

pub use aeth::{AethRepr, AethSyndrome, NakCode};
pub use arp::{ArpOperation, ArpPacket, ArpRepr};
pub use bth::{Bth, BthRepr};
pub use ecn::Ecn;
pub use ethernet::{EtherType, EthernetAddress, EthernetFrame, EthernetRepr};
pub use ext::{AtomicAckEthRepr, AtomicEthRepr, DethRepr, FethRepr, RethRepr};
pub use frame::{FrameRepr, LinkRepr, NetRepr, ParsedFrame};
pub use ipv4::{Ipv4Packet, Ipv4Repr};
pub use ipv6::{Ipv6Packet, Ipv6Repr};
pub use ndisc::{NdiscPacket, NdiscRepr};
pub use opcode::{HeaderSet, OpInfo, Opcode, Transport};
pub use packet::{RocePacket, TransportRepr};
pub use sack::SackRepr;
pub use udp::{UdpPacket, UdpRepr};

/// UDP destination port of RoCE v2 (IBTA Annex A17).
pub const ROCE_V2_PORT: u16 = 4791;
/// Ethertype of RoCE v1 (IBTA Annex A16).
pub const ETHERTYPE_ROCE_V1: u16 = 0x8915;
/// GRH next-header value for an IBA transport packet (IBTA §8.3.1).
pub const GRH_NEXT_HEADER_IBA: u8 = 0x1b;
/// Length of the invariant CRC trailer.
pub const ICRC_LEN: usize = 4;

/// Why a packet was rejected. Every variant says enough to log a useful line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("truncated {layer}: need {need} bytes, have {have}")]
    Truncated {
        layer: &'static str,
        need: usize,
        have: usize,
    },
    #[error("bad {layer} version {version}")]
    BadVersion { layer: &'static str, version: u8 },
    #[error("unknown opcode {0:#04x}")]
    UnknownOpcode(u8),
    #[error("bad pad count {pad} with {available} bytes after the headers")]
    BadPad { pad: u8, available: usize },
    #[error("{layer} length {claimed} does not match the {actual} bytes present")]
    LengthMismatch {
        layer: &'static str,
        claimed: usize,
        actual: usize,
    },
    #[error("bad ICRC: computed {computed:#010x}, packet carries {carried:#010x}")]
    BadIcrc { computed: u32, carried: u32 },
    #[error("bad {0} header checksum")]
    BadChecksum(&'static str),
    #[error("not RoCE: {0}")]
    NotRoce(&'static str),
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
    #[error("malformed {0}")]
    Malformed(&'static str),
}

pub type Result<T> = core::result::Result<T, Error>;

/// Checks that `buf` holds at least `need` bytes of `layer`.
#[inline]
pub(crate) fn check_len(layer: &'static str, buf: &[u8], need: usize) -> Result<()> {
    if buf.len() < need {
        Err(Error::Truncated {
            layer,
            need,
            have: buf.len(),
        })
    } else {
        Ok(())
    }
}

/// Big-endian field helpers. Callers have checked lengths, so indexing cannot fail; slices
/// with a fixed width make that visible to the optimiser.
pub(crate) mod be {
    #[inline]
    pub fn u16_at(b: &[u8], at: usize) -> u16 {
        u16::from_be_bytes([b[at], b[at + 1]])
    }
    #[inline]
    pub fn u24_at(b: &[u8], at: usize) -> u32 {
        u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]])
    }
    #[inline]
    pub fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }
    #[inline]
    pub fn u64_at(b: &[u8], at: usize) -> u64 {
        let mut x = [0u8; 8];
        x.copy_from_slice(&b[at..at + 8]);
        u64::from_be_bytes(x)
    }
    #[inline]
    pub fn put_u16(b: &mut [u8], at: usize, v: u16) {
        b[at..at + 2].copy_from_slice(&v.to_be_bytes());
    }
    #[inline]
    pub fn put_u24(b: &mut [u8], at: usize, v: u32) {
        b[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..]);
    }
    #[inline]
    pub fn put_u32(b: &mut [u8], at: usize, v: u32) {
        b[at..at + 4].copy_from_slice(&v.to_be_bytes());
    }
    #[inline]
    pub fn put_u64(b: &mut [u8], at: usize, v: u64) {
        b[at..at + 8].copy_from_slice(&v.to_be_bytes());
    }
}
