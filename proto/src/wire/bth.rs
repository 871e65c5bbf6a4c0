//! The Base Transport Header (IBTA Vol. 1 §9.2), 12 bytes at the start of every RoCE transport
//! packet.

use super::opcode::Opcode;
use super::{be, check_len, Error, Result};
use crate::types::{Psn, Qpn};

pub const HEADER_LEN: usize = 12;

mod field {
    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1; // SE | M | PadCnt(2) | TVer(4)
    pub const PKEY: usize = 2;
    pub const RESV8A: usize = 4; // FECN | BECN | Resv6
    pub const DEST_QP: usize = 5;
    pub const ACKREQ: usize = 8; // AckReq | Resv7
    pub const PSN: usize = 9;
}

/// The P_Key rxe always sends: the default partition, full membership (IBTA §10.9.1).
pub const DEFAULT_PKEY: u16 = 0xffff;

/// A zero-copy view of a BTH.
#[derive(Debug, Clone)]
pub struct Bth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Bth<T> {
    pub fn new_unchecked(buffer: T) -> Self {
        Bth { buffer }
    }
    pub fn new_checked(buffer: T) -> Result<Self> {
        check_len("BTH", buffer.as_ref(), HEADER_LEN)?;
        Ok(Bth { buffer })
    }
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    #[inline]
    pub fn opcode(&self) -> Opcode {
        Opcode(self.b()[field::OPCODE])
    }
    #[inline]
    pub fn solicited(&self) -> bool {
        self.b()[field::FLAGS] & 0x80 != 0
    }
    #[inline]
    pub fn mig_req(&self) -> bool {
        self.b()[field::FLAGS] & 0x40 != 0
    }
    #[inline]
    pub fn pad_count(&self) -> u8 {
        (self.b()[field::FLAGS] >> 4) & 3
    }
    #[inline]
    pub fn tver(&self) -> u8 {
        self.b()[field::FLAGS] & 0x0f
    }
    #[inline]
    pub fn pkey(&self) -> u16 {
        be::u16_at(self.b(), field::PKEY)
    }
    #[inline]
    pub fn fecn(&self) -> bool {
        self.b()[field::RESV8A] & 0x80 != 0
    }
    #[inline]
    pub fn becn(&self) -> bool {
        self.b()[field::RESV8A] & 0x40 != 0
    }
    #[inline]
    pub fn dest_qpn(&self) -> Qpn {
        Qpn::new(be::u24_at(self.b(), field::DEST_QP))
    }
    #[inline]
    pub fn ack_req(&self) -> bool {
        self.b()[field::ACKREQ] & 0x80 != 0
    }
    #[inline]
    pub fn psn(&self) -> Psn {
        Psn::new(be::u24_at(self.b(), field::PSN))
    }
}

/// A parsed BTH. Reserved bits are not kept: they are sent as zero and ignored on receipt,
/// as IBTA §9.2 asks. The pad count is not kept either: it follows from the payload length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BthRepr {
    pub opcode: Opcode,
    pub solicited: bool,
    pub mig_req: bool,
    pub pkey: u16,
    pub fecn: bool,
    pub becn: bool,
    pub dest_qpn: Qpn,
    pub ack_req: bool,
    pub psn: Psn,
}

impl BthRepr {
    /// Parses the header. A non-zero transport version is rejected, as rxe does.
    pub fn parse<T: AsRef<[u8]>>(bth: &Bth<T>) -> Result<BthRepr> {
        if bth.tver() != 0 {
            return Err(Error::BadVersion {
                layer: "BTH transport",
                version: bth.tver(),
            });
        }
        Ok(BthRepr {
            opcode: bth.opcode(),
            solicited: bth.solicited(),
            mig_req: bth.mig_req(),
            pkey: bth.pkey(),
            fecn: bth.fecn(),
            becn: bth.becn(),
            dest_qpn: bth.dest_qpn(),
            ack_req: bth.ack_req(),
            psn: bth.psn(),
        })
    }

    /// Writes the header into `buf[..12]` with the given pad count.
    pub fn emit(&self, buf: &mut [u8], pad_count: u8) {
        let b = &mut buf[..HEADER_LEN];
        b[field::OPCODE] = self.opcode.0;
        b[field::FLAGS] = (u8::from(self.solicited) << 7)
            | (u8::from(self.mig_req) << 6)
            | ((pad_count & 3) << 4);
        be::put_u16(b, field::PKEY, self.pkey);
        b[field::RESV8A] = (u8::from(self.fecn) << 7) | (u8::from(self.becn) << 6);
        be::put_u24(b, field::DEST_QP, self.dest_qpn.value());
        b[field::ACKREQ] = u8::from(self.ack_req) << 7;
        be::put_u24(b, field::PSN, self.psn.value());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // From roce-rxe-facts.md §3.3: SEND_ONLY, pad 3, DestQP 0x12, AckReq, PSN 0x100.
    const BTH: [u8; 12] = [
        0x04, 0x30, 0xff, 0xff, 0x00, 0x00, 0x00, 0x12, 0x80, 0x00, 0x01, 0x00,
    ];

    #[test]
    fn reference_bth() {
        let v = Bth::new_checked(&BTH[..]).unwrap();
        assert_eq!(v.pad_count(), 3);
        let r = BthRepr::parse(&v).unwrap();
        assert_eq!(r.opcode, Opcode::RC_SEND_ONLY);
        assert_eq!(r.dest_qpn, Qpn::new(0x12));
        assert_eq!(r.psn, Psn::new(0x100));
        assert!(r.ack_req);
        let mut out = [0u8; 12];
        r.emit(&mut out, 3);
        assert_eq!(out, BTH);
    }

    #[test]
    fn rejects_tver_and_short() {
        let mut b = BTH;
        b[1] |= 1;
        let v = Bth::new_checked(&b[..]).unwrap();
        assert!(BthRepr::parse(&v).is_err());
        assert!(Bth::new_checked(&BTH[..11]).is_err());
    }
}
