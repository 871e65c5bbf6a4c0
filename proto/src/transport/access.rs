//! Key, protection-domain, access-flag and bounds checks in front of every memory access
//! (IBTA Vol. 1 §10.6.3 for L_Keys, §9.7.4.1.4 for R_Keys), then the copy itself.

use super::engine::Ctx;
use super::memory::MemoryAccess;
use super::packet_io::Payload;
use super::resources::{KeyOwner, Mr, MwBinding, MwType};
use super::verbs::{Access, Sge, WcStatus};
use crate::types::{Lkey, Qpn, Rkey};

/// The SGE holding byte `offset` of a message, and the offset inside it.
fn sge_at(sges: &[Sge], offset: u64) -> Option<(&Sge, u64)> {
    let mut skip = offset;
    for sge in sges {
        let len = u64::from(sge.length);
        if skip < len {
            return Some((sge, skip));
        }
        skip -= len;
    }
    None
}

impl<M: MemoryAccess> Ctx<M> {
    /// A fresh key for `owner`: a random tag that no live key uses (never 0, so that keys
    /// below 256 name nothing) and a random low byte ([`KeyOwner`]).
    pub(crate) fn new_key(&mut self, owner: KeyOwner) -> u32 {
        loop {
            let key = self.keys.next_u32();
            let tag = key >> 8;
            // At most 2^20 live keys among 2^24 tags: a draw succeeds 15 times in 16.
            if tag != 0 && !self.key_tags.contains_key(&tag) {
                self.key_tags.insert(tag, owner);
                return key;
            }
        }
    }

    /// What a key's tag names. The caller still compares the whole key.
    fn key_owner(&self, key: u32) -> Option<KeyOwner> {
        self.key_tags.get(&(key >> 8)).copied()
    }

    /// The MR an L_Key or R_Key names, by its tag (the caller compares the whole key).
    fn mr_by_key(&self, key: u32) -> Option<&Mr> {
        match self.key_owner(key)? {
            KeyOwner::Mr(index) => self.mrs.get(&index),
            KeyOwner::Mw(_) => None,
        }
    }

    /// An SGE's memory: a valid L_Key of the same PD, in bounds, with `need` access.
    fn check_local(
        &self,
        pd: u32,
        sge: &Sge,
        at: u64,
        len: u64,
        need: Access,
    ) -> Result<u64, WcStatus> {
        let mr = self.mr_by_key(sge.lkey.0).ok_or(WcStatus::LocProtErr)?;
        if mr.lkey != sge.lkey.0 || !mr.valid || mr.pd != pd || !mr.access.contains(need) {
            return Err(WcStatus::LocProtErr);
        }
        if !mr.contains(at, len) {
            return Err(WcStatus::LocProtErr);
        }
        Ok(mr.space)
    }

    /// Copies `out.len()` bytes of the message described by `sges`, starting `offset` bytes
    /// into it, into `out`; or, when they lie in one SGE and the memory lends them, returns
    /// them uncopied ([`Payload::Lent`]) for the caller to copy while it hashes them.
    pub(crate) fn gather<'a>(
        &'a self,
        pd: u32,
        sges: &[Sge],
        offset: u64,
        out: &mut [u8],
    ) -> Result<Payload<'a>, WcStatus> {
        if let Some((sge, skip)) = sge_at(sges, offset).filter(|_| !out.is_empty()) {
            if u64::from(sge.length) - skip >= out.len() as u64 {
                let at = sge.addr.wrapping_add(skip);
                let space = self.check_local(pd, sge, at, out.len() as u64, Access::NONE)?;
                if let Some(bytes) = self.mem.lend(space, at, out.len()) {
                    // Unsealed, to a consumer that reads the bytes where they are: no copy.
                    if !self.config.seal_icrc && self.mem.leave_in_place(at, out.len()) {
                        return Ok(Payload::InPlace);
                    }
                    return Ok(Payload::Lent(bytes));
                }
                // Memory that does not lend (the daemon's): copy, the key already checked.
                self.mem
                    .read(space, at, out)
                    .map_err(|_| WcStatus::LocProtErr)?;
                return Ok(Payload::Written);
            }
        }
        self.gather_copy(pd, sges, offset, out)?;
        Ok(Payload::Written)
    }

    fn gather_copy(
        &self,
        pd: u32,
        sges: &[Sge],
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), WcStatus> {
        let mut skip = offset;
        let mut done = 0usize;
        for sge in sges {
            if done == out.len() {
                break;
            }
            let len = u64::from(sge.length);
            if skip >= len {
                skip -= len;
                continue;
            }
            let n = ((len - skip) as usize).min(out.len() - done);
            let at = sge.addr.wrapping_add(skip);
            let space = self.check_local(pd, sge, at, n as u64, Access::NONE)?;
            self.mem
                .read(space, at, &mut out[done..done + n])
                .map_err(|_| WcStatus::LocProtErr)?;
            done += n;
            skip = 0;
        }
        if done == out.len() {
            Ok(())
        } else {
            Err(WcStatus::LocLenErr)
        }
    }

    /// Places `data` into the buffer described by `sges`, `offset` bytes into it. The
    /// buffers need LOCAL_WRITE. Too little room is a length error. These are receive
    /// buffers and a READ's or atomic's local buffers: what they hold is defined only at the
    /// work request's completion ([`MemoryAccess::write_for_completion`]).
    pub(crate) fn scatter(
        &mut self,
        pd: u32,
        sges: &[Sge],
        offset: u64,
        data: &[u8],
    ) -> Result<(), WcStatus> {
        let mut skip = offset;
        let mut done = 0usize;
        for sge in sges {
            if done == data.len() {
                break;
            }
            let len = u64::from(sge.length);
            if skip >= len {
                skip -= len;
                continue;
            }
            let n = ((len - skip) as usize).min(data.len() - done);
            let at = sge.addr.wrapping_add(skip);
            let space = self.check_local(pd, sge, at, n as u64, Access::LOCAL_WRITE)?;
            self.mem
                .write_for_completion(space, at, &data[done..done + n])
                .map_err(|_| WcStatus::LocProtErr)?;
            done += n;
            skip = 0;
        }
        if done == data.len() {
            Ok(())
        } else {
            Err(WcStatus::LocLenErr)
        }
    }

    /// An R_Key check at the responder: a valid key of the QP's PD (or a window bound
    /// through this QP, for type 2), `need` access, and `[va, va+len)` inside the region.
    /// Returns the address space of the memory, or None when access is refused.
    pub(crate) fn remote_space(
        &self,
        pd: u32,
        qpn: Qpn,
        rkey: Rkey,
        va: u64,
        len: u64,
        need: Access,
    ) -> Option<u64> {
        if let KeyOwner::Mw(index) = self.key_owner(rkey.0)? {
            let mw = self.mws.get(&index)?;
            let b = mw.binding?;
            let owner_ok = match mw.mw_type {
                MwType::Type1 => mw.pd == pd,
                MwType::Type2 => mw.qpn == Some(qpn),
            };
            let in_range = va >= b.addr
                && va
                    .checked_add(len)
                    .is_some_and(|e| e <= b.addr.saturating_add(b.length));
            let mr = self.mrs.get(&b.mr).filter(|m| m.valid)?;
            let ok = mw.rkey == rkey.0 && owner_ok && b.access.contains(need) && in_range;
            return ok.then_some(mr.space);
        }
        let mr = self.mr_by_key(rkey.0)?;
        let ok = mr.rkey == rkey.0
            && mr.valid
            && mr.pd == pd
            && mr.access.contains(need)
            && mr.contains(va, len);
        ok.then_some(mr.space)
    }

    /// [`Ctx::remote_space`] as a yes/no.
    pub(crate) fn check_remote(
        &self,
        pd: u32,
        qpn: Qpn,
        rkey: Rkey,
        va: u64,
        len: u64,
        need: Access,
    ) -> bool {
        self.remote_space(pd, qpn, rkey, va, len, need).is_some()
    }

    /// Invalidates an MR or a type 2 MW by key (LOCAL_INV, SEND_WITH_INV). Fails for an
    /// unknown key, a key of another PD, an MR already invalid, a type 1 window (those are
    /// only unbound by binding again), or a window bound through another QP.
    pub(crate) fn invalidate(&mut self, pd: u32, qpn: Qpn, key: Rkey) -> bool {
        let owner = self.key_owner(key.0);
        if let Some(KeyOwner::Mw(index)) = owner {
            return match self.mws.get_mut(&index) {
                Some(mw)
                    if mw.rkey == key.0
                        && mw.mw_type == MwType::Type2
                        && mw.binding.is_some()
                        && (mw.qpn == Some(qpn) || mw.pd == pd) =>
                {
                    let was = mw.binding.take();
                    mw.qpn = None;
                    if let Some(b) = was {
                        self.unbound(b.mr);
                    }
                    true
                }
                _ => false,
            };
        }
        let Some(KeyOwner::Mr(index)) = owner else {
            return false;
        };
        match self.mrs.get_mut(&index) {
            Some(mr) if mr.rkey == key.0 && mr.pd == pd && mr.valid => {
                mr.valid = false;
                true
            }
            _ => false,
        }
    }

    /// Invalidates a key named by a received SEND_WITH_INV. As in rxe, only a type 2 window
    /// qualifies: rxe invalidates an MR only if it is a fast-registration MR
    /// (IB_MR_TYPE_MEM_REG), which user space cannot create, so the R_Key of an `ibv_reg_mr`
    /// region fails (REM_INV_REQ_ERR at the responder; seen live against kernel rxe).
    pub(crate) fn invalidate_remote(&mut self, pd: u32, qpn: Qpn, key: Rkey) -> bool {
        matches!(self.key_owner(key.0), Some(KeyOwner::Mw(_))) && self.invalidate(pd, qpn, key)
    }

    /// Executes a BIND_MW (IBTA §10.6.7.2, rxe `rxe_bind_mw`): the window must belong to the
    /// QP's PD (and a type 2 one must be free), the MR must allow binding, be of the same PD
    /// and contain the range; remote write or atomic access needs local write on the MR.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn bind_mw(
        &mut self,
        pd: u32,
        qpn: Qpn,
        mw_rkey: Rkey,
        mr_lkey: Lkey,
        range: (u64, u64),
        access: Access,
        key: u8,
    ) -> Result<(), WcStatus> {
        let (addr, length) = range;
        let Some(KeyOwner::Mr(mr_index)) = self.key_owner(mr_lkey.0) else {
            return Err(WcStatus::MwBindErr);
        };
        let mr = self.mrs.get(&mr_index).ok_or(WcStatus::MwBindErr)?;
        let needs_lw =
            access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC);
        if mr.lkey != mr_lkey.0
            || !mr.valid
            || mr.pd != pd
            || !mr.access.contains(Access::MW_BIND)
            || (needs_lw && !mr.access.contains(Access::LOCAL_WRITE))
            || !mr.contains(addr, length)
        {
            return Err(WcStatus::MwBindErr);
        }
        let Some(KeyOwner::Mw(mw_index)) = self.key_owner(mw_rkey.0) else {
            return Err(WcStatus::MwBindErr);
        };
        let mw = self.mws.get_mut(&mw_index).ok_or(WcStatus::MwBindErr)?;
        if mw.rkey != mw_rkey.0 || mw.pd != pd {
            return Err(WcStatus::MwBindErr);
        }
        if mw.mw_type == MwType::Type2 && mw.binding.is_some() {
            return Err(WcStatus::MwBindErr);
        }
        mw.rkey = (mw.rkey & !0xff) | u32::from(key);
        let was = mw.binding.replace(MwBinding {
            mr: mr_index,
            addr,
            length,
            access,
        });
        mw.qpn = (mw.mw_type == MwType::Type2).then_some(qpn);
        if let Some(b) = was {
            self.unbound(b.mr);
        }
        if let Some(m) = self.mrs.get_mut(&mr_index) {
            m.windows += 1;
        }
        Ok(())
    }

    /// A window bound to MR `mr` was unbound (or freed).
    pub(crate) fn unbound(&mut self, mr: u32) {
        if let Some(m) = self.mrs.get_mut(&mr) {
            m.windows = m.windows.saturating_sub(1);
        }
    }
}
