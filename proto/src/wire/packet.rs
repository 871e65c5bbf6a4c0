//! A RoCE transport packet: the BTH, the extended headers its opcode calls for, the payload,
//! the pad and the ICRC (IBTA Vol. 1 §9.2-9.3, §7.8). The network headers in front of it
//! (IPv4, IPv6, GRH) live in [`super::frame`].

use super::bth::{self, Bth, BthRepr};
use super::ext::{AtomicAckEthRepr, AtomicEthRepr, DethRepr, FethRepr, RethRepr};
use super::opcode::{HeaderSet, OpInfo, Opcode};
use super::{aeth::AethRepr, be, check_len, Error, Result, ICRC_LEN};
use crate::types::Rkey;

/// Where the parts of a transport packet lie, derived from the opcode, the pad count and the
/// packet's length on the wire. Computing it validates every length, so nothing later can
/// index out of range or underflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub info: &'static OpInfo,
    /// BTH plus extended headers.
    pub header_len: usize,
    pub payload_len: usize,
    pub pad: u8,
    /// BTH through ICRC.
    pub total_len: usize,
}

impl Layout {
    /// Validates the lengths of a transport packet that is `wire_len` bytes long on the wire
    /// (BTH through ICRC) and whose first bytes (at least the BTH) are `head`.
    pub fn compute(head: &[u8], wire_len: usize) -> Result<Layout> {
        check_len("BTH", head, bth::HEADER_LEN)?;
        let bth = Bth::new_unchecked(head);
        let opcode = bth.opcode();
        let info = opcode.info().ok_or(Error::UnknownOpcode(opcode.0))?;
        let header_len = bth::HEADER_LEN + info.header_len();
        if wire_len < header_len + ICRC_LEN {
            return Err(Error::Truncated {
                layer: "transport headers",
                need: header_len + ICRC_LEN,
                have: wire_len,
            });
        }
        let available = wire_len - header_len - ICRC_LEN;
        let pad = bth.pad_count();
        if pad as usize > available {
            return Err(Error::BadPad { pad, available });
        }
        let payload_len = available - pad as usize;
        let allowed = if info.has(OpInfo::ATOMIC_WRITE) {
            // ATOMIC_WRITE carries exactly one 8-byte value.
            payload_len == 8 && pad == 0
        } else if info.has(OpInfo::PAYLOAD) {
            // IBTA §9.2.1: the pad brings the payload to a 4-byte multiple.
            (payload_len + pad as usize).is_multiple_of(4)
        } else {
            payload_len == 0 && pad == 0
        };
        if !allowed {
            return Err(Error::LengthMismatch {
                layer: "transport payload",
                claimed: payload_len,
                actual: available,
            });
        }
        Ok(Layout {
            info,
            header_len,
            payload_len,
            pad,
            total_len: wire_len,
        })
    }
}

/// A zero-copy view of a whole transport packet, BTH through ICRC.
#[derive(Debug, Clone)]
pub struct RocePacket<T: AsRef<[u8]>> {
    buffer: T,
    layout: Layout,
}

impl<T: AsRef<[u8]>> RocePacket<T> {
    /// Validates opcode, lengths and pad of the packet that fills `buffer`.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let len = buffer.as_ref().len();
        let layout = Layout::compute(buffer.as_ref(), len)?;
        Ok(RocePacket { buffer, layout })
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    pub fn bth(&self) -> Bth<&[u8]> {
        Bth::new_unchecked(&self.buffer.as_ref()[..bth::HEADER_LEN])
    }
    pub fn opcode(&self) -> Opcode {
        self.bth().opcode()
    }
    /// The extended headers between the BTH and the payload.
    pub fn ext_headers(&self) -> &[u8] {
        &self.buffer.as_ref()[bth::HEADER_LEN..self.layout.header_len]
    }
    pub fn payload(&self) -> &[u8] {
        let start = self.layout.header_len;
        &self.buffer.as_ref()[start..start + self.layout.payload_len]
    }
    /// Everything the ICRC covers after the network headers: BTH through pad.
    pub fn icrc_covered(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[..b.len() - ICRC_LEN]
    }
    /// The ICRC as carried, least-significant byte first on the wire.
    pub fn icrc(&self) -> u32 {
        let b = self.buffer.as_ref();
        let t = &b[b.len() - ICRC_LEN..];
        u32::from_le_bytes([t[0], t[1], t[2], t[3]])
    }
}

/// A parsed transport packet: the BTH and whichever extended headers its opcode carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransportRepr {
    pub bth: BthRepr,
    pub deth: Option<DethRepr>,
    pub feth: Option<FethRepr>,
    pub reth: Option<RethRepr>,
    pub atomic_eth: Option<AtomicEthRepr>,
    pub aeth: Option<AethRepr>,
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// Immediate data, opaque, in network order as carried.
    pub imm: Option<u32>,
    /// The R_Key a SEND_WITH_INVALIDATE asks the responder to invalidate.
    pub ieth: Option<Rkey>,
    pub payload_len: usize,
}

impl TransportRepr {
    /// An empty repr for `opcode`; the caller fills in the headers it calls for.
    pub fn new(bth: BthRepr) -> TransportRepr {
        TransportRepr {
            bth,
            deth: None,
            feth: None,
            reth: None,
            atomic_eth: None,
            aeth: None,
            atomic_ack_eth: None,
            imm: None,
            ieth: None,
            payload_len: 0,
        }
    }

    /// Parses a whole, length-checked packet.
    pub fn parse<T: AsRef<[u8]>>(p: &RocePacket<T>) -> Result<TransportRepr> {
        Self::parse_headers(p.buffer.as_ref(), &p.layout)
    }

    /// Parses the BTH and extended headers from `head`, the first bytes of a packet whose
    /// [`Layout`] is known (for captures that kept only the headers).
    pub fn parse_headers(head: &[u8], layout: &Layout) -> Result<TransportRepr> {
        check_len("transport headers", head, layout.header_len)?;
        let bth = BthRepr::parse(&Bth::new_unchecked(head))?;
        let headers = layout.info.headers;
        let ext = &head[bth::HEADER_LEN..layout.header_len];
        let at = |h: HeaderSet| headers.offset_of(h).map(|o| &ext[o..]);
        Ok(TransportRepr {
            bth,
            deth: at(HeaderSet::DETH).map(DethRepr::parse).transpose()?,
            feth: at(HeaderSet::FETH).map(FethRepr::parse).transpose()?,
            reth: at(HeaderSet::RETH).map(RethRepr::parse).transpose()?,
            atomic_eth: at(HeaderSet::ATOMIC_ETH)
                .map(AtomicEthRepr::parse)
                .transpose()?,
            aeth: at(HeaderSet::AETH).map(AethRepr::parse).transpose()?,
            atomic_ack_eth: at(HeaderSet::ATOMIC_ACK_ETH)
                .map(AtomicAckEthRepr::parse)
                .transpose()?,
            imm: at(HeaderSet::IMM).map(|b| be::u32_at(b, 0)),
            ieth: at(HeaderSet::IETH).map(|b| Rkey(be::u32_at(b, 0))),
            payload_len: layout.payload_len,
        })
    }

    /// The headers present in this repr.
    pub fn header_set(&self) -> HeaderSet {
        let mut s = HeaderSet::NONE;
        let mut add = |present: bool, h: HeaderSet| {
            if present {
                s = s.union(h);
            }
        };
        add(self.deth.is_some(), HeaderSet::DETH);
        add(self.feth.is_some(), HeaderSet::FETH);
        add(self.reth.is_some(), HeaderSet::RETH);
        add(self.atomic_eth.is_some(), HeaderSet::ATOMIC_ETH);
        add(self.aeth.is_some(), HeaderSet::AETH);
        add(self.atomic_ack_eth.is_some(), HeaderSet::ATOMIC_ACK_ETH);
        add(self.imm.is_some(), HeaderSet::IMM);
        add(self.ieth.is_some(), HeaderSet::IETH);
        s
    }

    /// Checks that the headers present are exactly those the opcode calls for, and that the
    /// payload length suits the opcode. `emit` relies on it.
    pub fn check(&self) -> Result<&'static OpInfo> {
        let info = self
            .bth
            .opcode
            .info()
            .ok_or(Error::UnknownOpcode(self.bth.opcode.0))?;
        let wanted = info.headers;
        let cnp = HeaderSet::CNP_RESERVED;
        let have = if wanted.contains(cnp) {
            self.header_set().union(cnp)
        } else {
            self.header_set()
        };
        if have != wanted {
            return Err(Error::Malformed("headers do not match the opcode"));
        }
        let payload_ok = if info.has(OpInfo::ATOMIC_WRITE) {
            self.payload_len == 8
        } else {
            info.has(OpInfo::PAYLOAD) || self.payload_len == 0
        };
        if !payload_ok {
            return Err(Error::Malformed("payload length does not suit the opcode"));
        }
        Ok(info)
    }

    /// Pad bytes after the payload (IBTA §9.2.1: to a 4-byte multiple).
    pub fn pad_count(&self) -> u8 {
        (self.payload_len.wrapping_neg() & 3) as u8
    }

    /// BTH plus extended headers.
    pub fn header_len(&self) -> usize {
        bth::HEADER_LEN + self.bth.opcode.info().map_or(0, |i| i.header_len())
    }

    /// BTH through ICRC.
    pub fn buffer_len(&self) -> usize {
        self.header_len() + self.payload_len + self.pad_count() as usize + ICRC_LEN
    }

    /// Writes BTH, headers, `payload` and pad into `buf[..buffer_len() - 4]`. The ICRC needs
    /// the network headers too; [`super::FrameRepr::emit`] or [`super::icrc`] fills it in.
    ///
    /// Fails if the repr is inconsistent ([`TransportRepr::check`]) or `payload` does not
    /// have `payload_len` bytes, or `buf` is too short.
    pub fn emit(&self, buf: &mut [u8], payload: &[u8]) -> Result<()> {
        if payload.len() != self.payload_len {
            return Err(Error::LengthMismatch {
                layer: "payload",
                claimed: self.payload_len,
                actual: payload.len(),
            });
        }
        check_len("output buffer", buf, self.buffer_len())?;
        let start = self.header_len();
        buf[start..start + payload.len()].copy_from_slice(payload);
        self.emit_in_place(buf)
    }

    /// Like [`TransportRepr::emit`], for a payload the caller already placed at
    /// `buf[header_len()..header_len() + payload_len]` (a transmit path that reads registered
    /// memory straight into the frame, saving a copy). Writes BTH, headers and pad.
    pub fn emit_in_place(&self, buf: &mut [u8]) -> Result<()> {
        let info = self.check()?;
        check_len("output buffer", buf, self.buffer_len())?;
        let pad = self.pad_count();
        self.bth.emit(buf, pad);
        let headers = info.headers;
        let ext = &mut buf[bth::HEADER_LEN..];
        let mut put = |h: HeaderSet, f: &mut dyn FnMut(&mut [u8])| {
            if let Some(o) = headers.offset_of(h) {
                f(&mut ext[o..]);
            }
        };
        put(HeaderSet::DETH, &mut |b| {
            self.deth.inspect(|d| d.emit(b));
        });
        put(HeaderSet::FETH, &mut |b| {
            self.feth.inspect(|d| d.emit(b));
        });
        put(HeaderSet::RETH, &mut |b| {
            self.reth.inspect(|d| d.emit(b));
        });
        put(HeaderSet::ATOMIC_ETH, &mut |b| {
            self.atomic_eth.inspect(|d| d.emit(b));
        });
        put(HeaderSet::AETH, &mut |b| {
            self.aeth.inspect(|d| d.emit(b));
        });
        put(HeaderSet::ATOMIC_ACK_ETH, &mut |b| {
            self.atomic_ack_eth.inspect(|d| d.emit(b));
        });
        put(HeaderSet::IMM, &mut |b| {
            self.imm.inspect(|v| be::put_u32(b, 0, *v));
        });
        put(HeaderSet::IETH, &mut |b| {
            self.ieth.inspect(|k| be::put_u32(b, 0, k.0));
        });
        put(HeaderSet::CNP_RESERVED, &mut |b| b[..16].fill(0));
        let pad_at = self.header_len() + self.payload_len;
        buf[pad_at..pad_at + pad as usize].fill(0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Psn, Qpn};

    fn bth(opcode: Opcode) -> BthRepr {
        BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pkey: bth::DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qpn: Qpn::new(0x12),
            ack_req: true,
            psn: Psn::new(0x100),
        }
    }

    #[test]
    fn send_only_with_pad() {
        let mut repr = TransportRepr::new(bth(Opcode::RC_SEND_ONLY));
        repr.payload_len = 5;
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut buf, b"hello").unwrap();
        assert_eq!(
            &buf[..20],
            &[
                4, 0x30, 0xff, 0xff, 0, 0, 0, 0x12, 0x80, 0, 1, 0, b'h', b'e', b'l', b'l', b'o', 0,
                0, 0
            ]
        );
        let p = RocePacket::new_checked(&buf[..]).unwrap();
        assert_eq!(p.payload(), b"hello");
        assert_eq!(TransportRepr::parse(&p).unwrap(), repr);
    }

    #[test]
    fn rejects_inconsistent_lengths() {
        // Unknown opcode 0xff must be refused before any length arithmetic.
        let mut buf = [0u8; 16];
        buf[0] = 0xff;
        assert_eq!(
            RocePacket::new_checked(&buf[..]).unwrap_err(),
            Error::UnknownOpcode(0xff)
        );
        // An ACK whose pad count exceeds the bytes present.
        buf[0] = 0x11;
        buf[1] = 0x30;
        assert!(matches!(
            RocePacket::new_checked(&buf[..]).unwrap_err(),
            Error::Truncated { .. }
        ));
        let mut ack = [0u8; 20];
        ack[0] = 0x11;
        ack[1] = 0x30;
        assert!(matches!(
            RocePacket::new_checked(&ack[..]).unwrap_err(),
            Error::BadPad { .. }
        ));
        // A READ request must carry no payload.
        let mut read = [0u8; 12 + 16 + 4 + 4];
        read[0] = 0x0c;
        assert!(matches!(
            RocePacket::new_checked(&read[..]).unwrap_err(),
            Error::LengthMismatch { .. }
        ));
    }

    #[test]
    fn emit_refuses_headers_that_do_not_match_the_opcode() {
        let repr = TransportRepr::new(bth(Opcode::RC_RDMA_WRITE_ONLY)); // RETH missing
        let mut buf = [0u8; 64];
        assert!(repr.emit(&mut buf, &[]).is_err());
    }
}
