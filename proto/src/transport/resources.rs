//! The device's resources other than QPs: protection domains, memory regions, completion
//! queues, shared receive queues and address handles (IBTA Vol. 1 §10.2, §10.6; rxe's pools).

use super::chacha::ChaCha20Rng;
use super::qp_attr::AddressVector;
use super::verbs::{Access, RecvWr, WorkCompletion};
use std::collections::VecDeque;

/// The random source of keys and QPNs: ChaCha20 ([`super::chacha`]) keyed by the device's
/// owner (the daemon with `getrandom`, tests with constants), because the engine reads no
/// entropy itself.
#[derive(Debug, Clone)]
pub struct KeyGen(ChaCha20Rng);

impl KeyGen {
    /// `entropy` is the ChaCha20 key, with `seed` folded into its first 8 bytes (so tests
    /// that give only a seed still get distinct streams).
    pub fn new(seed: u64, entropy: [u8; 32]) -> KeyGen {
        let mut key = entropy;
        for (b, s) in key.iter_mut().zip(seed.to_le_bytes()) {
            *b ^= s;
        }
        KeyGen(ChaCha20Rng::from_seed(key))
    }

    pub fn next_u32(&mut self) -> u32 {
        self.0.next_u32()
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
}

/// What a key's tag (its upper 24 bits) names: an MR or an MW, by handle.
///
/// rxe's keys are `pool index << 8 | 8 random bits` (roce-rxe-facts.md §6.1): 24 of their 32
/// bits are a small counter, so a key is guessed in a few hundred tries and a freed index comes
/// back with 1 chance in 256 of answering to an old key (ReDMArk, USENIX Security 2021). Here the
/// tag is drawn at random among the tags no live key uses, so every bit of a fresh key is
/// random (the low byte stays the consumer's for MWs, IBTA §10.6.7.2.4 `ibv_inc_rkey`), the
/// handle says nothing about the key, and a freed key names nothing until its tag is drawn
/// again (1 chance in 2^24 per new key, and then the low byte must match too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyOwner {
    Mr(u32),
    Mw(u32),
}

/// A protection domain.
#[derive(Debug, Clone, Default)]
pub struct Pd {
    /// MRs, MWs, AHs, QPs and SRQs that use it (destroy is refused while non-zero).
    pub users: u32,
    /// The address space its MRs live in (see [`super::memory::MemoryAccess`]).
    pub space: u64,
}

/// A memory region (`ibv_reg_mr`).
#[derive(Debug, Clone)]
pub struct Mr {
    pub pd: u32,
    /// The address space of `addr`, from the PD.
    pub space: u64,
    pub addr: u64,
    pub length: u64,
    pub access: Access,
    pub lkey: u32,
    pub rkey: u32,
    /// Cleared by LOCAL_INV or SEND_WITH_INV; a later access with the key fails.
    pub valid: bool,
    /// Memory windows bound to it: it cannot be deregistered while any is.
    pub windows: u32,
}

impl Mr {
    /// `[va, va + len)` lies inside the region. A zero length is always inside (IBTA C9-88
    /// lets RETH length 0 skip the checks; the callers skip them earlier).
    pub fn contains(&self, va: u64, len: u64) -> bool {
        va >= self.addr
            && va
                .checked_add(len)
                .is_some_and(|end| end <= self.addr.saturating_add(self.length))
    }
}

/// Memory window types (IBTA §10.6.7): type 1 is bound by `ibv_bind_mw` and lives in its
/// PD; type 2 (rxe implements 2B) is bound by a BIND_MW work request to one QP and can be
/// invalidated (LOCAL_INV, SEND_WITH_INV).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MwType {
    Type1,
    Type2,
}

/// What a bound window grants: a range of one MR with remote access flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwBinding {
    /// Pool index of the MR it windows.
    pub mr: u32,
    pub addr: u64,
    pub length: u64,
    pub access: Access,
}

/// A memory window.
#[derive(Debug, Clone)]
pub struct Mw {
    pub pd: u32,
    pub mw_type: MwType,
    pub rkey: u32,
    pub binding: Option<MwBinding>,
    /// The QP a type 2 window is bound through: only that QP may use it (type 2B).
    pub qpn: Option<crate::types::Qpn>,
}

/// MW handles start here, above every MR's, as rxe's MW pool indexes do (roce-rxe-facts.md
/// §6.1).
pub const MW_INDEX_BASE: u32 = (1 << 19) + 1;

/// A completion queue.
#[derive(Debug, Clone)]
pub struct Cq {
    pub capacity: usize,
    pub entries: VecDeque<WorkCompletion>,
    /// `ibv_req_notify_cq`: Some(solicited_only) while armed.
    pub armed: Option<bool>,
    /// Set on overflow: the CQ is in error and takes no more entries (IBTA §11.4.2.1).
    pub overflowed: bool,
    pub users: u32,
    /// Listed in the engine's CQs with news ([`super::Engine::take_touched_cqs`]).
    pub touched: bool,
}

impl Cq {
    pub fn new(capacity: usize) -> Cq {
        Cq {
            capacity,
            entries: VecDeque::new(),
            armed: None,
            overflowed: false,
            users: 0,
            touched: false,
        }
    }
}

/// A shared receive queue.
#[derive(Debug, Clone)]
pub struct Srq {
    pub pd: u32,
    pub max_wr: u32,
    pub max_sge: u32,
    pub queue: VecDeque<RecvWr>,
    /// Armed limit (`ibv_modify_srq` with SRQ_LIMIT); 0 = not armed. Fires once, then disarms.
    pub limit: u32,
    pub users: u32,
}

/// An address handle (`ibv_create_ah`).
#[derive(Debug, Clone, Copy)]
pub struct Ah {
    pub pd: u32,
    pub av: AddressVector,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_differ_across_seeds_and_entropy() {
        let draw = |g: &mut KeyGen| (0..50).map(|_| g.next_u32()).collect::<Vec<_>>();
        let a = draw(&mut KeyGen::new(1, [0; 32]));
        assert_eq!(
            a,
            draw(&mut KeyGen::new(1, [0; 32])),
            "seeded: reproducible"
        );
        assert_ne!(a, draw(&mut KeyGen::new(2, [0; 32])));
        assert_ne!(a, draw(&mut KeyGen::new(1, [9; 32])));
    }

    #[test]
    fn mr_bounds() {
        let mr = Mr {
            pd: 1,
            space: 0,
            addr: 0x1000,
            length: 0x100,
            access: Access::LOCAL_WRITE,
            lkey: 0x101,
            rkey: 0x101,
            valid: true,
            windows: 0,
        };
        assert!(mr.contains(0x1000, 0x100));
        assert!(mr.contains(0x10ff, 1));
        assert!(!mr.contains(0x10ff, 2));
        assert!(!mr.contains(0xfff, 1));
        assert!(!mr.contains(u64::MAX, 2));
    }
}
