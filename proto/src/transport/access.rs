//! Key, protection-domain, access-flag and bounds checks in front of every memory access
//! (IBTA Vol. 1 §10.6.3 for L_Keys, §9.7.4.1.4 / C9-... for R_Keys), then the copy itself.

use super::device::Ctx;
use super::memory::MemoryAccess;
use super::resources::Mr;
use super::verbs::{Access, Sge, WcStatus};
use crate::types::Rkey;

impl<M: MemoryAccess> Ctx<M> {
    /// The MR an L_Key or R_Key names (the pool index is the key without its random byte).
    fn mr_by_key(&self, key: u32) -> Option<&Mr> {
        self.mrs.get(&(key >> 8))
    }

    /// An SGE's memory: a valid L_Key of the same PD, in bounds, with `need` access.
    fn check_local(
        &self,
        pd: u32,
        sge: &Sge,
        at: u64,
        len: u64,
        need: Access,
    ) -> Result<(), WcStatus> {
        let mr = self.mr_by_key(sge.lkey.0).ok_or(WcStatus::LocProtErr)?;
        if mr.lkey != sge.lkey.0 || !mr.valid || mr.pd != pd || !mr.access.contains(need) {
            return Err(WcStatus::LocProtErr);
        }
        if !mr.contains(at, len) {
            return Err(WcStatus::LocProtErr);
        }
        Ok(())
    }

    /// Copies `out.len()` bytes of the message described by `sges`, starting `offset` bytes
    /// into it, into `out`.
    pub(crate) fn gather(
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
            self.check_local(pd, sge, at, n as u64, Access::NONE)?;
            self.mem
                .read(at, &mut out[done..done + n])
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
    /// buffers need LOCAL_WRITE. Too little room is a length error.
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
            self.check_local(pd, sge, at, n as u64, Access::LOCAL_WRITE)?;
            self.mem
                .write(at, &data[done..done + n])
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

    /// An R_Key check at the responder: valid key of the QP's PD, `need` access, and
    /// `[va, va+len)` inside the region.
    pub(crate) fn check_remote(
        &self,
        pd: u32,
        rkey: Rkey,
        va: u64,
        len: u64,
        need: Access,
    ) -> bool {
        let Some(mr) = self.mr_by_key(rkey.0) else {
            return false;
        };
        mr.rkey == rkey.0
            && mr.valid
            && mr.pd == pd
            && mr.access.contains(need)
            && mr.contains(va, len)
    }

    /// Invalidates an MR by key (LOCAL_INV, SEND_WITH_INV). Fails for an unknown key, a key of
    /// another PD, or an MR already invalid.
    pub(crate) fn invalidate(&mut self, pd: u32, key: Rkey) -> bool {
        match self.mrs.get_mut(&(key.0 >> 8)) {
            Some(mr) if mr.rkey == key.0 && mr.pd == pd && mr.valid => {
                mr.valid = false;
                true
            }
            _ => false,
        }
    }
}
