//! Direct data placement over a stream rsocket (`riomap`, `riounmap`, `riowrite`), as
//! librdmacm's `rsocket.c` of rdma-core v44 puts it on the wire.
//!
//! Each side's target buffer list (the two-entry SGL its peer writes buffer updates into) is
//! followed by `target_iomap_size` slots (`RDMA_IOMAPSIZE`, 0 by default), announced in the
//! connection data. `riomap(PROT_WRITE)` registers a buffer for remote writes and gives it a
//! slot of the *peer's* table; before its next transfer the side writes the slot (`struct
//! rs_iomap`: the offset, then the buffer's address, rkey and length) with an RDMA WRITE WITH
//! IMMEDIATE `RS_OP_IOMAP_SGL | slot`. `riowrite` looks the offset up in the slots its peer
//! wrote into *its* table and RDMA WRITEs (no immediate: the peer sees nothing but the bytes)
//! straight into the peer's buffer, through its own send ring as `rsend` does.

use std::ptr;

use libc::c_int;

use super::{wire, IovCursor, Stream, IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE};
use crate::abi::consts::IBV_WR_RDMA_WRITE;
use crate::abi::IbvMr;
use crate::ffi::Errno;
use crate::verbs;

/// `sizeof(struct rs_iomap)`: a u64 offset and an `rs_sge`.
pub const IOMAP_LEN: usize = 8 + wire::SGE_LEN;

/// `rs_value_to_scale`: a table size as the one byte of the connection data.
pub fn value_to_scale(value: u32, bits: u32) -> u32 {
    let half = 1 << (bits - 1);
    if value <= half {
        value
    } else {
        half | (value >> bits)
    }
}

/// `rs_scale_to_value`: the inverse, for the peer's byte.
pub fn scale_to_value(value: u32, bits: u32) -> u32 {
    let half = 1 << (bits - 1);
    if value <= half {
        value
    } else {
        (value & !half) << bits
    }
}

/// One buffer this side mapped (`struct rs_iomap_mr`).
pub(super) struct IoMapping {
    offset: u64,
    mr: *mut IbvMr,
    /// Its slot in the peer's table; `None` for a local-only (`PROT_NONE`) mapping.
    slot: Option<usize>,
    /// Written into the peer's slot yet (librdmacm's `iomap_list` rather than `iomap_queue`).
    sent: bool,
}

impl IoMapping {
    fn is(&self, addr: u64, len: u64) -> bool {
        // SAFETY: a live registration of ours.
        unsafe { (*self.mr).addr as u64 == addr && (*self.mr).length as u64 == len }
    }
}

impl Stream {
    /// `riomap`: registers `len` bytes at `buf`; with `PROT_WRITE` for the peer to write at
    /// `offset` (-1: the buffer's address). The offset, or EINVAL (no QP yet, other
    /// protections), ENOMEM (the peer's table is full), or the registration's errno.
    pub fn iomap(&mut self, buf: u64, len: usize, prot: c_int, offset: i64) -> Result<i64, Errno> {
        if self.id.is_null() || prot & !(libc::PROT_WRITE | libc::PROT_NONE) != 0 {
            return Err(Errno::INVAL);
        }
        // SAFETY: live id; its QP (and PD) exist once connected or accepted.
        let pd = unsafe {
            let qp = (*self.id).qp;
            if qp.is_null() {
                return Err(Errno::INVAL);
            }
            (*qp).pd
        };
        let writable = prot & libc::PROT_WRITE != 0;
        let slot = if writable {
            let taken: Vec<usize> = self.iomaps.iter().filter_map(|m| m.slot).collect();
            let free = (0..self.remote_iomap.length as usize).find(|s| !taken.contains(s));
            Some(free.ok_or(Errno(libc::ENOMEM))?)
        } else {
            None
        };
        let access = IBV_ACCESS_LOCAL_WRITE | if writable { IBV_ACCESS_REMOTE_WRITE } else { 0 };
        // SAFETY: the caller's buffer, registered as ibv_reg_mr registers any memory (the
        // caller keeps it mapped until riounmap, as with librdmacm).
        let mr = unsafe { verbs::pd::ibv_reg_mr(pd, buf as *mut libc::c_void, len, access) };
        if mr.is_null() {
            return Err(Errno::last());
        }
        let offset = if offset == -1 { buf as i64 } else { offset };
        self.iomaps.push(IoMapping {
            offset: offset as u64,
            mr,
            slot,
            sent: slot.is_none(),
        });
        Ok(offset)
    }

    /// `riounmap`: the mapping of exactly `buf` and `len`, deregistered; EINVAL if none. (The
    /// peer keeps the slot's old contents, as with librdmacm.)
    pub fn iounmap(&mut self, buf: u64, len: usize) -> Result<(), Errno> {
        let i = self
            .iomaps
            .iter()
            .position(|m| m.is(buf, len as u64))
            .ok_or(Errno::INVAL)?;
        let m = self.iomaps.remove(i);
        // SAFETY: our registration, dropped from the list.
        unsafe { verbs::pd::ibv_dereg_mr(m.mr) };
        Ok(())
    }

    /// Every mapping deregistered (`rs_free_iomappings`), before the QP and its PD go.
    pub(super) fn free_iomaps(&mut self) {
        for m in self.iomaps.drain(..) {
            // SAFETY: our registrations.
            unsafe { verbs::pd::ibv_dereg_mr(m.mr) };
        }
    }

    /// `rs_send_iomaps`: writes the slots not yet written into the peer's table.
    pub(super) fn send_iomaps(&mut self, flags: c_int) -> Result<(), Errno> {
        while let Some(i) = self.iomaps.iter().position(|m| !m.sent) {
            self.wait_to_send(flags)?;
            let m = &self.iomaps[i];
            let slot = m.slot.unwrap_or(0);
            // SAFETY: a live registration of ours.
            let (addr, rkey, length) =
                unsafe { ((*m.mr).addr as u64, (*m.mr).rkey, (*m.mr).length as u32) };
            let mut entry = [0u8; IOMAP_LEN];
            let offset = if self.swap_sgl {
                m.offset.swap_bytes()
            } else {
                m.offset
            };
            entry[..8].copy_from_slice(&offset.to_ne_bytes());
            let sge = wire::RsSge {
                addr,
                key: rkey,
                length,
            };
            entry[8..].copy_from_slice(&sge.to_host_bytes(self.swap_sgl));
            self.iomaps[i].sent = true;
            let remote = self
                .remote_iomap
                .addr
                .wrapping_add((slot * IOMAP_LEN) as u64);
            let key = self.remote_iomap.key;
            self.sseq_no = self.sseq_no.wrapping_add(1);
            let msg = wire::msg_set(wire::RS_OP_IOMAP_SGL, slot as u32);
            let slices = [&entry[..]];
            let mut cursor = IovCursor::new(&slices);
            self.stage(&mut cursor, IOMAP_LEN as u32, |s, sges, inline| {
                s.sqe_avail -= 1;
                s.sbuf_bytes_avail = s.sbuf_bytes_avail.saturating_sub(IOMAP_LEN as u32);
                s.post_write(sges, msg, inline, remote, key)
            })?;
        }
        Ok(())
    }

    /// `rs_find_iomap`: the slot of our table (the peer wrote it) that holds `offset`.
    fn find_iomap(&mut self, offset: u64) -> Option<(u64, wire::RsSge)> {
        let target = self.target.as_mut()?;
        // The slots the region was made with (the option cannot change once it exists; the
        // bound holds whatever it says).
        let slots = (target
            .len()
            .saturating_sub(wire::SGE_LEN * wire::RS_SGL_SIZE)
            / IOMAP_LEN)
            .min(usize::from(self.target_iomap_size));
        let base = target.ptr();
        (0..slots).find_map(|i| {
            let p = base.wrapping_add(wire::SGE_LEN * wire::RS_SGL_SIZE + i * IOMAP_LEN);
            // SAFETY: slot i lies inside the target region (sized for the table); the peer
            // RDMA-writes it whenever it likes: read volatile.
            let (off, sge) = unsafe {
                (
                    ptr::read_volatile(p.cast::<u64>()),
                    wire::RsSge {
                        addr: ptr::read_volatile(p.add(8).cast::<u64>()),
                        key: ptr::read_volatile(p.add(16).cast::<u32>()),
                        length: ptr::read_volatile(p.add(20).cast::<u32>()),
                    },
                )
            };
            (offset >= off && offset - off < u64::from(sge.length)).then_some((off, sge))
        })
    }

    /// `riowrite`: `buf` into the peer's mapping at `offset`, in transfers growing from 2 KiB
    /// to 64 KiB; what was written, or the error if nothing was. Stops short at an offset no
    /// slot of the peer covers.
    pub fn iowrite(&mut self, buf: &[u8], offset: u64, flags: c_int) -> Result<usize, Errno> {
        let count = buf.len();
        if let Err(e) = self.send_iomaps(flags) {
            return if count == 0 { Ok(0) } else { Err(e) };
        }
        let slices = [buf];
        let mut cursor = IovCursor::new(&slices);
        let (mut left, mut offset) = (count, offset);
        let mut olen = super::RS_OLAP_START_SIZE;
        let mut ret = Ok(());
        while left > 0 {
            let Some((base, sge)) = self.find_iomap(offset) else {
                break;
            };
            if let Err(e) = self.wait_to_send(flags) {
                ret = Err(e);
                break;
            }
            let mut xfer = if (olen as usize) < left {
                let x = olen;
                if olen < super::RS_MAX_TRANSFER {
                    olen <<= 1;
                }
                x
            } else {
                left as u32
            };
            xfer = xfer
                .min(self.sbuf_bytes_avail)
                .min((u64::from(sge.length) - (offset - base)).min(u64::from(u32::MAX)) as u32);
            let remote = sge.addr.wrapping_add(offset - base);
            let msg = wire::msg_set(wire::RS_OP_WRITE, xfer);
            if let Err(e) = self.stage(&mut cursor, xfer, |s, sges, inline| {
                s.sqe_avail -= 1;
                s.sbuf_bytes_avail = s.sbuf_bytes_avail.saturating_sub(xfer);
                s.post(IBV_WR_RDMA_WRITE, sges, msg, inline, remote, sge.key)
            }) {
                ret = Err(e);
                break;
            }
            left -= xfer as usize;
            offset = offset.wrapping_add(u64::from(xfer));
        }
        match ret {
            Err(e) if left == count => Err(e),
            _ => Ok(count - left),
        }
    }

    /// Waits (unless non-blocking) until a transfer may be posted; ECONNRESET once the
    /// stream no longer writes.
    fn wait_to_send(&mut self, flags: c_int) -> Result<(), Errno> {
        if !self.can_send() {
            self.process_cq_polling(self.nonblocking(flags), Self::conn_can_send)?;
            if self.state & super::st::WRITABLE == 0 {
                return Err(Errno(libc::ECONNRESET));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{scale_to_value, value_to_scale, IOMAP_LEN};

    #[test]
    fn the_table_size_byte_is_librdmacms() {
        assert_eq!(IOMAP_LEN, 24);
        // Up to 128 as is; above, the high bit and the value / 256 (rounded down to it).
        for (v, s) in [(0, 0), (1, 1), (128, 128), (256, 129), (1024, 132)] {
            assert_eq!(value_to_scale(v, 8), s);
            assert_eq!(scale_to_value(s, 8), v);
        }
    }
}
