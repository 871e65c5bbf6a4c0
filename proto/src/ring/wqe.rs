//! The entries that travel through the shared rings: send work requests, receive work
//! requests and completions. The shim encodes what the application posted; the daemon decodes
//! it from a copy of the slot and validates every field, since the application's process is not
//! trusted. Completions are laid out exactly as `struct ibv_wc` (48 bytes, rdma-core 44), so
//! the shim copies them straight into the application's array.

use crate::transport::{Access, RecvWr, RemoteAddr, SendFlags, SendOp, SendWr};
use crate::types::{Lkey, Qkey, Qpn, Rkey};

/// `enum ibv_wr_opcode` values (verbs.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WrOpcode {
    RdmaWrite = 0,
    RdmaWriteWithImm = 1,
    Send = 2,
    SendWithImm = 3,
    RdmaRead = 4,
    AtomicCmpAndSwp = 5,
    AtomicFetchAndAdd = 6,
    LocalInv = 7,
    BindMw = 8,
    SendWithInv = 9,
    Flush = 14,
    AtomicWrite = 15,
}

impl WrOpcode {
    pub fn from_u32(v: u32) -> Option<WrOpcode> {
        Some(match v {
            0 => WrOpcode::RdmaWrite,
            1 => WrOpcode::RdmaWriteWithImm,
            2 => WrOpcode::Send,
            3 => WrOpcode::SendWithImm,
            4 => WrOpcode::RdmaRead,
            5 => WrOpcode::AtomicCmpAndSwp,
            6 => WrOpcode::AtomicFetchAndAdd,
            7 => WrOpcode::LocalInv,
            8 => WrOpcode::BindMw,
            9 => WrOpcode::SendWithInv,
            14 => WrOpcode::Flush,
            15 => WrOpcode::AtomicWrite,
            _ => return None,
        })
    }
}

/// `enum ibv_send_flags`.
pub mod send_flags {
    pub const FENCE: u32 = 1;
    pub const SIGNALED: u32 = 2;
    pub const SOLICITED: u32 = 4;
    pub const INLINE: u32 = 8;
    pub const IP_CSUM: u32 = 16;
    pub const ALL: u32 = FENCE | SIGNALED | SOLICITED | INLINE | IP_CSUM;
}

/// The most scatter/gather elements any work request may carry (rxe's max_sge).
pub const MAX_SGE: usize = 32;
/// Bytes of a send slot before its SGEs or inline data.
pub const SEND_HEADER_LEN: usize = 64;
/// Bytes of a receive slot before its SGEs.
pub const RECV_HEADER_LEN: usize = 16;
pub const SGE_LEN: usize = 16;
/// Bytes of a completion slot; the first 48 are a `struct ibv_wc`.
pub const CQE_SLOT_LEN: usize = 64;
pub const IBV_WC_LEN: usize = 48;

/// Scatter/gather elements and UD destinations are the engine's own types: the daemon hands
/// decoded work requests to the engine without converting them. A `UdDest`'s `ah` is the
/// client-visible handle of the address handle.
pub use crate::transport::{Sge, UdDest};

/// A memory-window bind (`ibv_bind_mw` or an `IBV_WR_BIND_MW` work request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwBind {
    pub mw_rkey: Rkey,
    /// The key the window will answer to after the bind.
    pub new_rkey: Rkey,
    pub mr_lkey: Lkey,
    pub addr: u64,
    pub length: u64,
    pub access: u32,
}

/// The body of a send work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendData<'a> {
    Sges(&'a [Sge]),
    Inline(&'a [u8]),
}

/// A decoded send work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWqe<'a> {
    pub wr_id: u64,
    pub opcode: WrOpcode,
    pub flags: u32,
    /// Immediate data as the application stored it (network order), or the R_Key to
    /// invalidate for SEND_WITH_INV and LOCAL_INV.
    pub imm_or_inv: u32,
    pub remote_addr: u64,
    pub rkey: Rkey,
    pub compare_add: u64,
    pub swap: u64,
    pub ud: Option<UdDest>,
    pub bind: Option<MwBind>,
    pub data: SendData<'a>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WqeError {
    #[error("slot too short")]
    Short,
    #[error("unknown work request opcode {0}")]
    Opcode(u32),
    #[error("{0} scatter/gather elements exceed the queue's limit")]
    TooManySges(usize),
    #[error("{0} bytes of inline data exceed the queue's limit")]
    InlineTooLong(usize),
    #[error("unknown send flags {0:#x}")]
    Flags(u32),
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(x)
}
fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}

/// Send slot layout. Bind-MW requests reuse the fields: `remote_addr` = window address,
/// `compare_add` = length, `rkey` = window R_Key, `imm_or_inv` = new R_Key, `swap` = MR L_Key
/// (low 32 bits) and access flags (high 32 bits).
mod send_slot {
    pub const WR_ID: usize = 0;
    pub const OPCODE: usize = 8;
    pub const NUM_SGE: usize = 9;
    pub const HAS_UD: usize = 10;
    pub const FLAGS: usize = 12;
    pub const IMM: usize = 16;
    pub const INLINE_LEN: usize = 20;
    pub const REMOTE_ADDR: usize = 24;
    pub const RKEY: usize = 32;
    pub const AH: usize = 36;
    pub const COMPARE_ADD: usize = 40;
    pub const SWAP: usize = 48;
    pub const REMOTE_QPN: usize = 56;
    pub const REMOTE_QKEY: usize = 60;
}

/// Decodes SGEs into `out` and returns how many.
fn decode_sges(body: &[u8], n: usize, out: &mut [Sge; MAX_SGE]) -> Result<usize, WqeError> {
    if n > MAX_SGE {
        return Err(WqeError::TooManySges(n));
    }
    if body.len() < n * SGE_LEN {
        return Err(WqeError::Short);
    }
    for (i, sge) in out.iter_mut().enumerate().take(n) {
        let b = &body[i * SGE_LEN..];
        *sge = Sge {
            addr: u64_at(b, 0),
            length: u32_at(b, 8),
            lkey: Lkey(u32_at(b, 12)),
        };
    }
    Ok(n)
}

fn encode_sges(body: &mut [u8], sges: &[Sge]) {
    for (i, s) in sges.iter().enumerate() {
        let b = &mut body[i * SGE_LEN..];
        put_u64(b, 0, s.addr);
        put_u32(b, 8, s.length);
        put_u32(b, 12, s.lkey.0);
    }
}

impl<'a> SendWqe<'a> {
    /// Bytes this request needs in a slot.
    pub fn encoded_len(&self) -> usize {
        SEND_HEADER_LEN
            + match self.data {
                SendData::Sges(s) => s.len() * SGE_LEN,
                SendData::Inline(d) => d.len(),
            }
    }

    /// Writes the request into `slot` (at least `encoded_len()` bytes).
    pub fn encode(&self, slot: &mut [u8]) -> Result<usize, WqeError> {
        use send_slot::*;
        let len = self.encoded_len();
        if slot.len() < len {
            return Err(WqeError::Short);
        }
        slot[..SEND_HEADER_LEN].fill(0);
        put_u64(slot, WR_ID, self.wr_id);
        slot[OPCODE] = self.opcode as u8;
        put_u32(slot, FLAGS, self.flags);
        put_u32(slot, IMM, self.imm_or_inv);
        put_u64(slot, REMOTE_ADDR, self.remote_addr);
        put_u32(slot, RKEY, self.rkey.0);
        put_u64(slot, COMPARE_ADD, self.compare_add);
        put_u64(slot, SWAP, self.swap);
        if let Some(ud) = self.ud {
            slot[HAS_UD] = 1;
            put_u32(slot, AH, ud.ah);
            put_u32(slot, REMOTE_QPN, ud.remote_qpn.value());
            put_u32(slot, REMOTE_QKEY, ud.remote_qkey.0);
        }
        if let Some(b) = self.bind {
            put_u64(slot, REMOTE_ADDR, b.addr);
            put_u64(slot, COMPARE_ADD, b.length);
            put_u32(slot, RKEY, b.mw_rkey.0);
            put_u32(slot, IMM, b.new_rkey.0);
            put_u64(
                slot,
                SWAP,
                u64::from(b.mr_lkey.0) | (u64::from(b.access) << 32),
            );
        }
        match self.data {
            SendData::Sges(s) => {
                if s.len() > MAX_SGE {
                    return Err(WqeError::TooManySges(s.len()));
                }
                slot[NUM_SGE] = s.len() as u8;
                encode_sges(&mut slot[SEND_HEADER_LEN..], s);
            }
            SendData::Inline(d) => {
                put_u32(slot, INLINE_LEN, d.len() as u32);
                slot[SEND_HEADER_LEN..SEND_HEADER_LEN + d.len()].copy_from_slice(d);
            }
        }
        Ok(len)
    }

    /// Decodes a copied slot. `max_sge` and `max_inline` are the queue's limits as the daemon
    /// recorded them at creation; `sges` receives the scatter/gather list.
    pub fn decode(
        slot: &'a [u8],
        max_sge: usize,
        max_inline: usize,
        sges: &'a mut [Sge; MAX_SGE],
    ) -> Result<SendWqe<'a>, WqeError> {
        use send_slot::*;
        if slot.len() < SEND_HEADER_LEN {
            return Err(WqeError::Short);
        }
        let opcode =
            WrOpcode::from_u32(slot[OPCODE] as u32).ok_or(WqeError::Opcode(slot[OPCODE] as u32))?;
        let flags = u32_at(slot, FLAGS);
        if flags & !send_flags::ALL != 0 {
            return Err(WqeError::Flags(flags));
        }
        let body = &slot[SEND_HEADER_LEN..];
        let data = if flags & send_flags::INLINE != 0 {
            let n = u32_at(slot, INLINE_LEN) as usize;
            if n > max_inline {
                return Err(WqeError::InlineTooLong(n));
            }
            SendData::Inline(body.get(..n).ok_or(WqeError::Short)?)
        } else {
            let n = slot[NUM_SGE] as usize;
            if n > max_sge {
                return Err(WqeError::TooManySges(n));
            }
            let n = decode_sges(body, n, sges)?;
            SendData::Sges(&sges[..n])
        };
        let ud = (slot[HAS_UD] != 0).then(|| UdDest {
            ah: u32_at(slot, AH),
            remote_qpn: Qpn::new(u32_at(slot, REMOTE_QPN)),
            remote_qkey: Qkey(u32_at(slot, REMOTE_QKEY)),
        });
        let swap = u64_at(slot, SWAP);
        let bind = (opcode == WrOpcode::BindMw).then(|| MwBind {
            mw_rkey: Rkey(u32_at(slot, RKEY)),
            new_rkey: Rkey(u32_at(slot, IMM)),
            mr_lkey: Lkey(swap as u32),
            addr: u64_at(slot, REMOTE_ADDR),
            length: u64_at(slot, COMPARE_ADD),
            access: (swap >> 32) as u32,
        });
        Ok(SendWqe {
            wr_id: u64_at(slot, WR_ID),
            opcode,
            flags,
            imm_or_inv: u32_at(slot, IMM),
            remote_addr: u64_at(slot, REMOTE_ADDR),
            rkey: Rkey(u32_at(slot, RKEY)),
            compare_add: u64_at(slot, COMPARE_ADD),
            swap,
            ud,
            bind,
            data,
        })
    }
}

impl SendWqe<'_> {
    /// The engine's work request for this WQE. A UD destination's `ah` stays the handle the
    /// client gave (the daemon maps it to its own). Fails only for a bind without its
    /// arguments, which [`SendWqe::decode`] never produces.
    pub fn work_request(&self) -> Result<SendWr, &'static str> {
        let remote = RemoteAddr {
            va: self.remote_addr,
            rkey: self.rkey,
        };
        let op = match self.opcode {
            WrOpcode::Send => SendOp::Send,
            // `ibv_send_wr.imm_data` is __be32: the slot holds the bytes the application
            // stored, which go on the wire as they are; the engine's immediate is the ImmDt
            // field's big-endian value. (Softroce to softroce the two swaps cancelled out;
            // kernel rxe read udaddy's QPN from the immediate swapped and answered the wrong
            // QP.)
            WrOpcode::SendWithImm => SendOp::SendWithImm(u32::from_be(self.imm_or_inv)),
            WrOpcode::SendWithInv => SendOp::SendWithInv(Rkey(self.imm_or_inv)),
            WrOpcode::RdmaWrite => SendOp::Write(remote),
            WrOpcode::RdmaWriteWithImm => {
                SendOp::WriteWithImm(remote, u32::from_be(self.imm_or_inv))
            }
            WrOpcode::RdmaRead => SendOp::Read(remote),
            WrOpcode::AtomicCmpAndSwp => SendOp::CompareSwap {
                remote,
                compare: self.compare_add,
                swap: self.swap,
            },
            WrOpcode::AtomicFetchAndAdd => SendOp::FetchAdd {
                remote,
                add: self.compare_add,
            },
            WrOpcode::AtomicWrite => SendOp::AtomicWrite {
                remote,
                value: self.compare_add,
            },
            WrOpcode::Flush => SendOp::Flush {
                remote,
                len: self.compare_add as u32,
                placement: self.swap as u8,
            },
            WrOpcode::LocalInv => SendOp::LocalInv(Rkey(self.imm_or_inv)),
            WrOpcode::BindMw => {
                let b = self.bind.ok_or("bind without its arguments")?;
                SendOp::BindMw {
                    mw_rkey: b.mw_rkey,
                    mr_lkey: b.mr_lkey,
                    addr: b.addr,
                    length: b.length,
                    access: Access(b.access),
                    // The low byte of the new R_Key is the consumer's key (ibv_inc_rkey).
                    key: b.new_rkey.0 as u8,
                }
            }
        };
        let (sg_list, inline_data) = match self.data {
            SendData::Sges(s) => (s.to_vec(), Vec::new()),
            SendData::Inline(d) => (Vec::new(), d.to_vec()),
        };
        Ok(SendWr {
            wr_id: self.wr_id,
            op,
            sg_list,
            inline_data,
            flags: SendFlags(self.flags & send_flags::ALL),
            ud: self.ud,
        })
    }
}

/// A receive work request (`ibv_post_recv`, `ibv_post_srq_recv`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvWqe<'a> {
    pub wr_id: u64,
    pub sges: &'a [Sge],
}

impl<'a> RecvWqe<'a> {
    pub fn encoded_len(&self) -> usize {
        RECV_HEADER_LEN + self.sges.len() * SGE_LEN
    }

    pub fn encode(&self, slot: &mut [u8]) -> Result<usize, WqeError> {
        let len = self.encoded_len();
        if self.sges.len() > MAX_SGE {
            return Err(WqeError::TooManySges(self.sges.len()));
        }
        if slot.len() < len {
            return Err(WqeError::Short);
        }
        put_u64(slot, 0, self.wr_id);
        put_u32(slot, 8, self.sges.len() as u32);
        put_u32(slot, 12, 0);
        encode_sges(&mut slot[RECV_HEADER_LEN..], self.sges);
        Ok(len)
    }

    pub fn decode(
        slot: &'a [u8],
        max_sge: usize,
        sges: &'a mut [Sge; MAX_SGE],
    ) -> Result<RecvWqe<'a>, WqeError> {
        if slot.len() < RECV_HEADER_LEN {
            return Err(WqeError::Short);
        }
        let n = u32_at(slot, 8) as usize;
        if n > max_sge {
            return Err(WqeError::TooManySges(n));
        }
        let n = decode_sges(&slot[RECV_HEADER_LEN..], n, sges)?;
        Ok(RecvWqe {
            wr_id: u64_at(slot, 0),
            sges: &sges[..n],
        })
    }
}

impl RecvWqe<'_> {
    /// The engine's work request for this WQE.
    pub fn work_request(&self) -> RecvWr {
        RecvWr {
            wr_id: self.wr_id,
            sg_list: self.sges.to_vec(),
        }
    }
}

/// A completion, field for field `struct ibv_wc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cqe {
    pub wr_id: u64,
    /// `enum ibv_wc_status`.
    pub status: u32,
    /// `enum ibv_wc_opcode`.
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Immediate data (network order) or the invalidated R_Key.
    pub imm_or_inv: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    /// `enum ibv_wc_flags`.
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

impl Cqe {
    /// Writes the `struct ibv_wc` image into `out[..48]`.
    pub fn encode(&self, out: &mut [u8]) {
        put_u64(out, 0, self.wr_id);
        put_u32(out, 8, self.status);
        put_u32(out, 12, self.opcode);
        put_u32(out, 16, self.vendor_err);
        put_u32(out, 20, self.byte_len);
        put_u32(out, 24, self.imm_or_inv);
        put_u32(out, 28, self.qp_num);
        put_u32(out, 32, self.src_qp);
        put_u32(out, 36, self.wc_flags);
        out[40..42].copy_from_slice(&self.pkey_index.to_ne_bytes());
        out[42..44].copy_from_slice(&self.slid.to_ne_bytes());
        out[44] = self.sl;
        out[45] = self.dlid_path_bits;
        out[46] = 0;
        out[47] = 0;
    }

    pub fn decode(b: &[u8]) -> Option<Cqe> {
        if b.len() < IBV_WC_LEN {
            return None;
        }
        Some(Cqe {
            wr_id: u64_at(b, 0),
            status: u32_at(b, 8),
            opcode: u32_at(b, 12),
            vendor_err: u32_at(b, 16),
            byte_len: u32_at(b, 20),
            imm_or_inv: u32_at(b, 24),
            qp_num: u32_at(b, 28),
            src_qp: u32_at(b, 32),
            wc_flags: u32_at(b, 36),
            pkey_index: u16::from_ne_bytes([b[40], b[41]]),
            slid: u16::from_ne_bytes([b[42], b[43]]),
            sl: b[44],
            dlid_path_bits: b[45],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_wqe_round_trips_with_sges_inline_ud_and_bind() {
        let sges = [
            Sge {
                addr: 0x1000,
                length: 64,
                lkey: Lkey(7),
            },
            Sge {
                addr: 0x2000,
                length: 4096,
                lkey: Lkey(8),
            },
        ];
        let mut wqe = SendWqe {
            wr_id: 42,
            opcode: WrOpcode::SendWithImm,
            flags: send_flags::SIGNALED | send_flags::SOLICITED,
            imm_or_inv: 0xdead_beef,
            remote_addr: 0,
            rkey: Rkey(0),
            compare_add: 0,
            swap: 0,
            ud: Some(UdDest {
                ah: 3,
                remote_qpn: Qpn::new(0x11),
                remote_qkey: Qkey(0x1111_1111),
            }),
            bind: None,
            data: SendData::Sges(&sges),
        };
        let mut slot = [0u8; 640];
        wqe.encode(&mut slot).unwrap();
        let mut out = [Sge::default(); MAX_SGE];
        assert_eq!(SendWqe::decode(&slot, 32, 512, &mut out).unwrap(), wqe);
        assert_eq!(
            SendWqe::decode(&slot, 1, 512, &mut out),
            Err(WqeError::TooManySges(2))
        );

        wqe.flags |= send_flags::INLINE;
        wqe.data = SendData::Inline(b"hello, inline");
        wqe.ud = None;
        wqe.encode(&mut slot).unwrap();
        assert_eq!(SendWqe::decode(&slot, 32, 512, &mut out).unwrap(), wqe);
        assert_eq!(
            SendWqe::decode(&slot, 32, 4, &mut out),
            Err(WqeError::InlineTooLong(13))
        );

        let bind = MwBind {
            mw_rkey: Rkey(0x8000_0101),
            new_rkey: Rkey(0x8000_0102),
            mr_lkey: Lkey(0x105),
            addr: 0x7f00_0000_1000,
            length: 1 << 33,
            access: 0xf,
        };
        let wqe = SendWqe {
            wr_id: 1,
            opcode: WrOpcode::BindMw,
            flags: 0,
            imm_or_inv: bind.new_rkey.0,
            remote_addr: bind.addr,
            rkey: bind.mw_rkey,
            compare_add: bind.length,
            swap: u64::from(bind.mr_lkey.0) | (u64::from(bind.access) << 32),
            ud: None,
            bind: Some(bind),
            data: SendData::Sges(&[]),
        };
        wqe.encode(&mut slot).unwrap();
        assert_eq!(SendWqe::decode(&slot, 32, 512, &mut out).unwrap(), wqe);
    }

    #[test]
    fn garbage_slots_decode_to_errors() {
        let mut out = [Sge::default(); MAX_SGE];
        let mut slot = [0xffu8; 128];
        assert!(SendWqe::decode(&slot, 32, 512, &mut out).is_err());
        slot[8] = 2; // SEND
        assert!(matches!(
            SendWqe::decode(&slot, 32, 512, &mut out),
            Err(WqeError::Flags(_))
        ));
        slot[12..16].copy_from_slice(&0u32.to_ne_bytes());
        assert!(matches!(
            SendWqe::decode(&slot, 255, 512, &mut out),
            Err(WqeError::TooManySges(255))
        ));
        assert!(SendWqe::decode(&slot[..10], 32, 512, &mut out).is_err());
        assert!(RecvWqe::decode(&slot, 32, &mut out).is_err());
        // Every prefix of a valid slot either decodes or errors; nothing panics.
        let sges = [Sge {
            addr: 1,
            length: 2,
            lkey: Lkey(3),
        }; 4];
        let r = RecvWqe {
            wr_id: 9,
            sges: &sges,
        };
        r.encode(&mut slot).unwrap();
        for cut in 0..slot.len() {
            let _ = RecvWqe::decode(&slot[..cut], 32, &mut out);
            let _ = SendWqe::decode(&slot[..cut], 32, 512, &mut out);
        }
        assert_eq!(RecvWqe::decode(&slot, 32, &mut out).unwrap(), r);
    }

    #[test]
    fn cqe_matches_ibv_wc_layout() {
        let c = Cqe {
            wr_id: 0x0102_0304_0506_0708,
            status: 12,
            opcode: 128,
            vendor_err: 0,
            byte_len: 4096,
            imm_or_inv: 0xaabb_ccdd,
            qp_num: 0x11,
            src_qp: 0x12,
            wc_flags: 3,
            pkey_index: 0,
            slid: 0,
            sl: 0,
            dlid_path_bits: 0,
        };
        let mut b = [0u8; IBV_WC_LEN];
        c.encode(&mut b);
        assert_eq!(&b[8..12], &12u32.to_ne_bytes(), "status at offset 8");
        assert_eq!(&b[20..24], &4096u32.to_ne_bytes(), "byte_len at offset 20");
        assert_eq!(&b[36..40], &3u32.to_ne_bytes(), "wc_flags at offset 36");
        assert_eq!(Cqe::decode(&b), Some(c));
    }
}
