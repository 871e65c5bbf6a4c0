//! The engine: every resource of one softroce port, and the sans-I/O entry points that drive
//! it (quinn-proto style): `handle_packet`, `handle_timeout`, `poll_transmit`, `poll_timeout`,
//! `poll_event`, and the verbs (create/modify/destroy, post, poll CQ).

use super::congestion::{AnyController, CongestionConfig, QpCongestion};
use super::counters::{Counters, Dropped};
use super::memory::MemoryAccess;
use super::packet_io::{PendingIcrc, Route};
use super::qp::{udp_sport_for_flow, Qp, QpInit};
use super::qp_attr::{check_modify, AddressVector, AttrMask, Mtu, QpAttr, QpState, QpType};
use super::qpn_pool::QpnPool;
use super::resources::{Ah, Cq, KeyGen, KeyOwner, Mr, Mw, MwType, Pd, Srq, MW_INDEX_BASE};
use super::selective::LossRecovery;
use super::table::Table;
use super::timers::{Nanos, TimerQueue};
use super::verbs::*;
use crate::types::{Psn, Qkey, Qpn};
use crate::wire::{ipv4, ipv6, Ecn, FrameRepr, Ipv4Repr, Ipv6Repr, NetRepr, TransportRepr};
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::net::IpAddr;

/// Largest frame `poll_transmit` writes: IPv6 + UDP + BTH + the largest header set + 4096
/// bytes of payload + ICRC. Give it a buffer at least this long.
pub const MAX_FRAME_LEN: usize = 40 + 8 + 12 + 32 + 4096 + 4 + 4;

/// The type of a GID table entry (`enum ibv_gid_type`): the framing of every packet sent
/// from it (roce-rxe-facts.md §7.2: a device with both picks it by the SGID's type).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum GidType {
    /// RoCE v1 (IBTA Annex A16): a GRH (next header 0x1b) and the transport, for an
    /// Ethernet frame of Ethertype 0x8915.
    RoceV1,
    /// RoCE v2 (Annex A17): IPv4 or IPv6, UDP to port 4791, the transport.
    #[default]
    RoceV2,
}

/// Static configuration of a device.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The GID table by index: index 0 is the default source address of every AV; an empty
    /// slot is the unspecified address ([`EngineConfig::gid`]).
    pub gids: Vec<IpAddr>,
    /// The type of each entry of `gids`, by index; an entry without one is RoCE v2 (as
    /// every GID of rxe). With `--roce both` an address is listed twice, once per type.
    pub gid_types: Vec<GidType>,
    /// Seed of the random part of keys. The daemon seeds it from the OS; the engine reads no
    /// entropy itself.
    pub key_seed: u64,
    /// The key of the ChaCha20 stream keys (and random QPNs) are drawn from, with `key_seed`
    /// folded in ([`super::resources::KeyGen`]). The daemon fills it from `getrandom`; zero
    /// (the default) leaves `key_seed` as the only secret, which suits tests.
    pub key_entropy: [u8; 32],
    /// Hand out QPNs at random in the device's range instead of in order, so that a QPN cannot
    /// be guessed from another (ReDMArk). Off by default: tests and the simulator number QPs
    /// from 17 as rxe does.
    pub random_qpns: bool,
    /// `max_qp_wr`, `max_sge`, `max_cqe` etc. are kept modest; see [`EngineConfig::default`].
    pub max_cqe: usize,
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_inline_data: u32,
    /// The port's active MTU: the largest UD message (rxe's `get_mtu` uses the port MTU for UD,
    /// whose QPs have no path MTU).
    pub port_mtu: Mtu,
    /// Compute the ICRC of every packet `poll_transmit` writes (the default). A daemon that
    /// seals each packet itself for the headers its socket writes, or delivers it to an
    /// engine of its own with `handle_verified_packet`, turns it off to compute it once.
    pub seal_icrc: bool,
    /// With [`EngineConfig::seal_icrc`], the destinations whose packets are sealed; `None`
    /// (the default): every packet. A daemon that seals only what it hands between QPs of
    /// its own device (for a capture: its link seals the rest for the headers its socket
    /// writes) lists the device's addresses, so that no packet is sealed twice.
    pub seal_only_to: Option<Vec<IpAddr>>,
    /// Let a SEND or WRITE that another follows at once leave its AckReq bit clear, so that
    /// a burst costs one ACK (IBTA §9.7.5.1.2, coalesced acknowledgement). Off by default:
    /// rxe asks for an ACK on the last packet of every message, and on the wire softroce does
    /// as rxe. The shim's same-host fast path turns it on: its packets never leave the process.
    pub coalesce_acks: bool,
    /// Congestion control (none by default, as rxe; the daemon turns DCQCN on).
    pub congestion: CongestionConfig,
}

impl EngineConfig {
    /// Whether `poll_transmit` computes the ICRC of a packet to `dst`
    /// ([`EngineConfig::seal_icrc`], [`EngineConfig::seal_only_to`]).
    #[inline]
    pub fn seals(&self, dst: IpAddr) -> bool {
        self.seal_icrc
            && self
                .seal_only_to
                .as_ref()
                .is_none_or(|to| to.contains(&dst))
    }

    pub fn new(gid: IpAddr, key_seed: u64) -> EngineConfig {
        EngineConfig {
            gids: vec![gid],
            gid_types: Vec::new(),
            key_seed,
            key_entropy: [0; 32],
            random_qpns: false,
            max_cqe: 32767,
            max_qp_wr: 1 << 20,
            max_sge: 32,
            max_inline_data: 512,
            port_mtu: Mtu::Mtu4096,
            seal_icrc: true,
            seal_only_to: None,
            coalesce_acks: false,
            congestion: CongestionConfig::default(),
        }
    }

    /// The address of GID `index`, if that slot is filled (an empty one holds the
    /// unspecified address: its address went away, IBTA §17.2.4's table keeps the others'
    /// indices).
    #[inline]
    pub fn gid(&self, index: u8) -> Option<IpAddr> {
        self.gids
            .get(usize::from(index))
            .copied()
            .filter(|a| !a.is_unspecified())
    }

    /// The type of GID `index` ([`EngineConfig::gid_types`]).
    pub fn gid_type(&self, index: u8) -> GidType {
        self.gid_types
            .get(usize::from(index))
            .copied()
            .unwrap_or_default()
    }
}

/// A packet `poll_transmit` wrote: `buf[..len]` is a whole IPv4 or IPv6 packet (UDP to port
/// 4791, the transport packet, the ICRC computed over these very headers), or for a RoCE v1
/// SGID ([`GidType::RoceV1`]) a GRH and the transport packet, for an Ethernet frame of
/// Ethertype 0x8915 (`src_port` is then 0).
///
/// A daemon that sends through a UDP socket sends `buf[transport_offset..len]` to
/// `(dst, 4791)` from `src_port`; the kernel then builds its own IP header, and because the
/// IPv4 Identification is covered by the ICRC it must either send with Identification 0 (raw
/// socket / TAP, as the engine writes it) or recompute the ICRC (roce-rxe-facts.md §3.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    pub len: usize,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub src_port: u16,
    pub transport_offset: usize,
    /// The framing, from the type of the source GID.
    pub gid_type: GidType,
}

/// Keys and handle of a registered MR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrKeys {
    pub handle: u32,
    pub lkey: crate::types::Lkey,
    pub rkey: crate::types::Rkey,
}

/// A multiplicative hash for the small integer keys of the device's tables (QPNs, key
/// indexes, handles): SipHash showed up in the per-packet profile. Lookups by a key from the
/// wire never insert, so a chosen key cannot grow a table.
#[derive(Debug, Default, Clone, Copy)]
pub struct IntHasher(u64);

impl Hasher for IntHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

pub(crate) type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;

/// Everything but the QPs, so a QP can be borrowed mutably next to it.
#[derive(Debug)]
pub(crate) struct Ctx<M> {
    pub mem: M,
    pub keys: KeyGen,
    /// Live keys by tag (the upper 24 bits): what each names ([`KeyOwner`]).
    pub key_tags: IntMap<u32, KeyOwner>,
    pub config: EngineConfig,
    pub pds: Table<Pd>,
    pub mrs: Table<Mr>,
    pub mws: Table<Mw>,
    pub cqs: Table<Cq>,
    pub srqs: Table<Srq>,
    pub ahs: Table<Ah>,
    /// CQs that got completions since the owner last asked ([`Engine::take_touched_cqs`]).
    pub touched_cqs: Vec<u32>,
    pub counters: Counters,
    /// Fault injection: how the responder answers the next request it would execute
    /// (set and cleared around one packet by [`Engine::handle_verified_packet_forcing`]).
    pub forced_nak: Option<ForcedNak>,
    pub events: VecDeque<AsyncEvent>,
    /// Round-robin of QPs that may have a packet to send.
    pub ready: VecDeque<Qpn>,
}

/// The handle spaces of the resource tables ([`Table`]): disjoint, so that a handle names one
/// kind of object, and all below 2^24 (a daemon puts its device index above). MR and MW
/// numbers are rxe's (`RXE_MAX_MR`, MW pool indexes from [`MW_INDEX_BASE`]).
const MR_BASE: u32 = 1;
const MR_CAPACITY: usize = (1 << 19) - 1;
const MW_CAPACITY: usize = 524_287;
const PD_BASE: u32 = 1 << 20;
const PD_CAPACITY: usize = 1 << 20;
const CQ_BASE: u32 = 1 << 21;
const SRQ_BASE: u32 = 1 << 22;
const AH_BASE: u32 = 3 << 22;
/// Freed handles of objects a program may still see in late records (a CQ's completion event,
/// an SRQ's limit event) are held back this many removals before they are used again.
const HANDLE_HOLD: usize = 256;
/// An answer the responder is made to give (fault injection, see
/// [`Engine::handle_verified_packet_forcing`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForcedNak {
    /// An RNR NAK, as when no receive WQE is posted.
    Rnr,
    /// A remote access error NAK, as for an R_Key violation.
    AccessError,
}

impl ForcedNak {
    /// Whether a request of this opcode could meet the condition on real hardware.
    pub fn applies_to(self, info: &crate::wire::OpInfo) -> bool {
        use crate::wire::OpInfo;
        match self {
            ForcedNak::Rnr => info.has(OpInfo::RWR),
            ForcedNak::AccessError => {
                info.has(OpInfo::START)
                    && (info.has(OpInfo::WRITE)
                        || info.has(OpInfo::READ)
                        || info.has(OpInfo::ATOMIC)
                        || info.has(OpInfo::ATOMIC_WRITE)
                        || info.has(OpInfo::FLUSH))
            }
        }
    }
}

/// One softroce device (port 1): its resources and its transport engine.
#[derive(Debug)]
pub struct Engine<M: MemoryAccess> {
    pub(crate) ctx: Ctx<M>,
    pub(crate) qps: IntMap<Qpn, Qp>,
    /// The QPNs this device hands out (a daemon gives each client process blocks of its own,
    /// see [`Engine::set_qpn_range`] and [`Engine::add_qpn_range`]).
    qpns: QpnPool,
    /// The QPs' deadlines in time order.
    timers: TimerQueue,
    /// The QP whose turn it is in [`Engine::poll_transmit`] and the bytes it has sent in
    /// this turn (a turn lasts up to [`TRANSMIT_QUANTUM`]).
    turn: (Qpn, usize),
    /// Scratch list of the QPs whose timer came due (kept for its allocation).
    due: Vec<Qpn>,
    /// Multicast group (destination IP) -> attached UD QPs.
    mcast: HashMap<IpAddr, Vec<Qpn>>,
    /// MRs another engine gave ([`Engine::insert_mr`]): their index there -> their handle
    /// here (the fast path's mirrors of a peer's MRs).
    pub(crate) imported_mrs: IntMap<u32, u32>,
}

impl<M: MemoryAccess> Engine<M> {
    pub fn new(config: EngineConfig, mem: M) -> Engine<M> {
        let random_qpns = config.random_qpns;
        Engine {
            ctx: Ctx {
                mem,
                keys: KeyGen::new(config.key_seed, config.key_entropy),
                key_tags: IntMap::default(),
                pds: Table::new(PD_BASE, PD_CAPACITY, 0),
                mrs: Table::new(MR_BASE, MR_CAPACITY, 0),
                mws: Table::new(MW_INDEX_BASE, MW_CAPACITY, HANDLE_HOLD),
                cqs: Table::new(CQ_BASE, 1 << 21, HANDLE_HOLD),
                srqs: Table::new(SRQ_BASE, 1 << 21, HANDLE_HOLD),
                ahs: Table::new(AH_BASE, 1 << 22, HANDLE_HOLD),
                touched_cqs: Vec::new(),
                counters: Counters::default(),
                forced_nak: None,
                events: VecDeque::new(),
                ready: VecDeque::new(),
                config,
            },
            qps: IntMap::default(),
            // rxe numbers QPs from 16 (roce-rxe-facts.md §6.1); 1 is the GSI QP.
            qpns: QpnPool::new(17, Qpn::MULTICAST.value(), random_qpns),
            timers: TimerQueue::default(),
            turn: (Qpn::new(0), 0),
            due: Vec::new(),
            mcast: HashMap::new(),
            imported_mrs: IntMap::default(),
        }
    }

    /// Sets the congestion control of the device ([`EngineConfig::congestion`]). Every QP
    /// starts over with a fresh controller (at the maximum rate) and unpaced.
    pub fn set_congestion_control(&mut self, config: CongestionConfig) {
        self.ctx.config.congestion = config;
        for qp in self.qps.values_mut() {
            qp.cc = AnyController::new(&config);
            qp.pacer.reset();
            // The ECN bits of the kept headers change.
            qp.route_cache = None;
            qp.next_segment = None;
            if qp.paced_until.take().is_some() {
                schedule(qp, &mut self.ctx.ready);
            }
        }
    }

    pub fn congestion_control(&self) -> &CongestionConfig {
        &self.ctx.config.congestion
    }

    /// The congestion state of a QP: its current and target rate, DCQCN's alpha (as last
    /// evaluated, at the QP's last packet or CNP).
    pub fn qp_congestion(&self, qpn: Qpn) -> Option<QpCongestion> {
        let q = self.qps.get(&qpn)?;
        Some(q.cc.inner().state(&self.ctx.config.congestion.params))
    }

    pub fn memory(&self) -> &M {
        &self.ctx.mem
    }
    pub fn memory_mut(&mut self) -> &mut M {
        &mut self.ctx.mem
    }
    pub fn counters(&self) -> &Counters {
        &self.ctx.counters
    }
    pub fn gids(&self) -> &[IpAddr] {
        &self.ctx.config.gids
    }

    /// The device's GID table changed (an address came or went; the entries that stayed
    /// kept their indices, [`EngineConfig::gid`]): new AVs may name the new entries, and
    /// paths through an emptied slot send nothing more.
    pub fn set_gids(&mut self, gids: Vec<IpAddr>, types: Vec<GidType>) {
        self.ctx.config.gids = gids;
        self.ctx.config.gid_types = types;
    }

    // ----- protection domains, memory regions -------------------------------------------

    /// Whether `poll_transmit` computes the ICRC ([`EngineConfig::seal_icrc`]).
    pub fn set_seal_icrc(&mut self, on: bool) {
        self.ctx.config.seal_icrc = on;
    }

    /// Which destinations' packets `poll_transmit` seals ([`EngineConfig::seal_only_to`]);
    /// the list is replaced only when it differs.
    pub fn set_seal_only_to(&mut self, to: Option<&[IpAddr]>) {
        if self.ctx.config.seal_only_to.as_deref() != to {
            self.ctx.config.seal_only_to = to.map(<[IpAddr]>::to_vec);
        }
    }

    /// `ibv_alloc_pd` in address space 0 (one-process use, tests).
    /// Restricts the QPNs this device hands out to `first..end`, so that several devices
    /// (one per client process in the daemon) can share one QPN space without collisions.
    pub fn set_qpn_range(&mut self, first: u32, end: u32) {
        self.qpns = QpnPool::new(
            first.max(2),
            end.min(Qpn::MULTICAST.value()),
            self.ctx.config.random_qpns,
        );
    }

    /// Adds `first..end` to the QPNs this device may hand out (a range no other device uses,
    /// not overlapping its own): a daemon's client that used up its block gets another.
    pub fn add_qpn_range(&mut self, first: u32, end: u32) {
        self.qpns.add(first.max(2), end.min(Qpn::MULTICAST.value()));
    }

    pub fn alloc_pd(&mut self) -> u32 {
        self.alloc_pd_in(0)
    }

    /// `ibv_alloc_pd` for a client whose memory is address space `space`: every memory access
    /// through an MR of this PD passes `space` to [`MemoryAccess`].
    ///
    /// # Panics
    /// When the device holds 2^20 PDs (the daemon's caps stop a client long before).
    pub fn alloc_pd_in(&mut self, space: u64) -> u32 {
        self.ctx
            .pds
            .insert(Pd { users: 0, space })
            .expect("PD table full")
    }

    pub fn dealloc_pd(&mut self, pd: u32) -> VerbsResult<()> {
        match self.ctx.pds.get(&pd) {
            None => Err(VerbsError::NotFound("PD")),
            Some(p) if p.users > 0 => Err(VerbsError::Busy("PD still in use")),
            Some(_) => {
                self.ctx.pds.remove(&pd);
                Ok(())
            }
        }
    }

    fn pd_use(&mut self, pd: u32, delta: i32) -> VerbsResult<()> {
        let p = self
            .ctx
            .pds
            .get_mut(&pd)
            .ok_or(VerbsError::NotFound("PD"))?;
        p.users = p.users.saturating_add_signed(delta);
        Ok(())
    }

    /// The address space of PD `pd` (the client whose memory its MRs name).
    pub(crate) fn pd_space(&self, pd: u32) -> VerbsResult<u64> {
        self.ctx
            .pds
            .get(&pd)
            .map(|p| p.space)
            .ok_or(VerbsError::NotFound("PD"))
    }

    /// `ibv_reg_mr`. Remote write or atomic access needs local write too (IBTA §10.6.3.1,
    /// checked by ib_core).
    pub fn reg_mr(
        &mut self,
        pd: u32,
        addr: u64,
        length: u64,
        access: Access,
    ) -> VerbsResult<MrKeys> {
        check_mr(access, addr, length)?;
        if self.ctx.mrs.len() >= MR_CAPACITY {
            return Err(VerbsError::NoResources("MR table full"));
        }
        self.pd_use(pd, 1)?;
        let space = self.ctx.pds.get(&pd).map_or(0, |p| p.space);
        let mr = Mr {
            pd,
            space,
            addr,
            length,
            access,
            lkey: 0,
            rkey: 0,
            valid: true,
            windows: 0,
        };
        let Some(index) = self.ctx.mrs.insert(mr) else {
            self.pd_use(pd, -1)?;
            return Err(VerbsError::NoResources("MR table full"));
        };
        // Newer rxe gives rkey == lkey (roce-rxe-facts.md §6.1). The key is drawn for this
        // index now: whatever key an earlier MR at the index had names nothing any more.
        let key = self.ctx.new_key(KeyOwner::Mr(index));
        if let Some(m) = self.ctx.mrs.get_mut(&index) {
            (m.lkey, m.rkey) = (key, key);
        }
        Ok(MrKeys {
            handle: index,
            lkey: crate::types::Lkey(key),
            rkey: crate::types::Rkey(key),
        })
    }

    /// `ibv_dereg_mr`; refused while a memory window is bound to the MR.
    pub fn dereg_mr(&mut self, handle: u32) -> VerbsResult<()> {
        if self.ctx.mrs.get(&handle).is_some_and(|m| m.windows > 0) {
            return Err(VerbsError::Busy("a memory window is bound to the MR"));
        }
        let mr = self
            .ctx
            .mrs
            .remove(&handle)
            .ok_or(VerbsError::NotFound("MR"))?;
        self.ctx.key_tags.remove(&(mr.lkey >> 8));
        self.pd_use(mr.pd, -1)
    }

    /// `ibv_rereg_mr`: moves the MR to PD `pd`, onto `range` (address, length), or to
    /// `access`, each when given, keeping its keys (libibverbs lets them change; keeping
    /// them is what a program that already sent them to its peer hopes for). Refused while a
    /// memory window is bound to it, as deregistration is.
    pub fn rereg_mr(
        &mut self,
        handle: u32,
        pd: Option<u32>,
        range: Option<(u64, u64)>,
        access: Option<Access>,
    ) -> VerbsResult<()> {
        let mr = self
            .ctx
            .mrs
            .get(&handle)
            .ok_or(VerbsError::NotFound("MR"))?;
        if mr.windows > 0 {
            return Err(VerbsError::Busy("a memory window is bound to the MR"));
        }
        let new_access = access.unwrap_or(mr.access);
        let (addr, length) = range.unwrap_or((mr.addr, mr.length));
        check_mr(new_access, addr, length)?;
        let old_pd = mr.pd;
        let space = match pd {
            Some(p) => {
                let space = self.pd_space(p)?;
                self.pd_use(p, 1)?;
                self.pd_use(old_pd, -1)?;
                Some(space)
            }
            None => None,
        };
        let mr = self
            .ctx
            .mrs
            .get_mut(&handle)
            .ok_or(VerbsError::NotFound("MR"))?;
        if let (Some(p), Some(space)) = (pd, space) {
            (mr.pd, mr.space) = (p, space);
        }
        if let Some((addr, length)) = range {
            (mr.addr, mr.length) = (addr, length);
        }
        mr.access = new_access;
        Ok(())
    }

    /// `ibv_alloc_mw`: an unbound window; returns its handle and initial R_Key. Bind it with a
    /// [`SendOp::BindMw`] work request (the shim's `ibv_bind_mw` posts one for type 1).
    pub fn alloc_mw(&mut self, pd: u32, mw_type: MwType) -> VerbsResult<(u32, crate::types::Rkey)> {
        if self.ctx.mws.len() >= MW_CAPACITY {
            return Err(VerbsError::NoResources("MW table full"));
        }
        self.pd_use(pd, 1)?;
        let mw = Mw {
            pd,
            mw_type,
            rkey: 0,
            binding: None,
            qpn: None,
        };
        let Some(index) = self.ctx.mws.insert(mw) else {
            self.pd_use(pd, -1)?;
            return Err(VerbsError::NoResources("MW table full"));
        };
        let rkey = self.ctx.new_key(KeyOwner::Mw(index));
        if let Some(w) = self.ctx.mws.get_mut(&index) {
            w.rkey = rkey;
        }
        Ok((index, crate::types::Rkey(rkey)))
    }

    /// `ibv_dealloc_mw`.
    pub fn dealloc_mw(&mut self, handle: u32) -> VerbsResult<()> {
        let mw = self
            .ctx
            .mws
            .remove(&handle)
            .ok_or(VerbsError::NotFound("MW"))?;
        self.ctx.key_tags.remove(&(mw.rkey >> 8));
        if let Some(b) = mw.binding {
            self.ctx.unbound(b.mr);
        }
        self.pd_use(mw.pd, -1)
    }

    // ----- completion queues --------------------------------------------------------------

    pub fn create_cq(&mut self, cqe: usize) -> VerbsResult<u32> {
        if cqe == 0 || cqe > self.ctx.config.max_cqe {
            return Err(VerbsError::Invalid("cqe out of range"));
        }
        self.ctx
            .cqs
            .insert(Cq::new(cqe))
            .ok_or(VerbsError::NoResources("CQ table full"))
    }

    pub fn destroy_cq(&mut self, cq: u32) -> VerbsResult<()> {
        match self.ctx.cqs.get(&cq) {
            None => Err(VerbsError::NotFound("CQ")),
            Some(c) if c.users > 0 => Err(VerbsError::Busy("CQ still used by a QP")),
            Some(_) => {
                self.ctx.cqs.remove(&cq);
                Ok(())
            }
        }
    }

    /// `ibv_poll_cq` for one entry.
    pub fn poll_cq(&mut self, cq: u32) -> Option<WorkCompletion> {
        self.ctx.cqs.get_mut(&cq)?.entries.pop_front()
    }

    /// `ibv_resize_cq`: the CQ's depth becomes `cqe`; EINVAL when more completions wait
    /// than that (rxe_cq_chk_attr / rxe_queue_resize).
    pub fn resize_cq(&mut self, cq: u32, cqe: usize) -> VerbsResult<()> {
        if cqe == 0 || cqe > self.ctx.config.max_cqe {
            return Err(VerbsError::Invalid("cqe out of range"));
        }
        let c = self
            .ctx
            .cqs
            .get_mut(&cq)
            .ok_or(VerbsError::NotFound("CQ"))?;
        if c.entries.len() > cqe {
            return Err(VerbsError::Invalid("cqe below the completions waiting"));
        }
        c.capacity = cqe;
        Ok(())
    }

    /// Moves the handles of the CQs that got completions (or overflowed) since the last call
    /// into `out`, so that an owner copying completions out visits only those.
    pub fn take_touched_cqs(&mut self, out: &mut Vec<u32>) {
        for cq in self.ctx.touched_cqs.drain(..) {
            if let Some(c) = self.ctx.cqs.get_mut(&cq) {
                c.touched = false;
                out.push(cq);
            }
        }
    }

    /// Completions waiting in a CQ (`None`: no such CQ).
    pub fn cq_len(&self, cq: u32) -> Option<usize> {
        self.ctx.cqs.get(&cq).map(|c| c.entries.len())
    }

    /// Adds a completion the engine did not produce (a work request refused before it reached
    /// the engine) to a CQ, with the engine's own overflow rule: false when the CQ is
    /// overrun (then it is in error and [`AsyncEvent::CqError`] was raised).
    pub fn push_completion(&mut self, cq: u32, wc: WorkCompletion) -> bool {
        complete(&mut self.ctx, cq, wc, wc.status != WcStatus::Success)
    }

    /// The consumer's view of a CQ overflowed (the host's copy of it is full and more
    /// completions wait), or the engine's own queue overflowed: CQ overrun. The CQ goes to
    /// error and takes no more completions, those waiting here are lost (the host's copy
    /// keeps what it holds), and [`AsyncEvent::CqError`] is raised once (IBTA §11.4.2.1,
    /// rxe's `rxe_cq_post` on a full queue). The QPs that complete into it go to ERR as they
    /// try (or at once, by the caller, with [`Engine::fail_qp`]).
    pub fn cq_overrun(&mut self, cq: u32) -> VerbsResult<()> {
        let c = self
            .ctx
            .cqs
            .get_mut(&cq)
            .ok_or(VerbsError::NotFound("CQ"))?;
        c.entries.clear();
        if !c.overflowed {
            c.overflowed = true;
            self.ctx.events.push_back(AsyncEvent::CqError { cq });
        }
        Ok(())
    }

    /// Whether a CQ is in error (overrun).
    pub fn cq_in_error(&self, cq: u32) -> bool {
        self.ctx.cqs.get(&cq).is_some_and(|c| c.overflowed)
    }

    /// Moves a QP to ERR because of a local error the transport did not see: work it cannot
    /// decode (a corrupt work queue), or a placement into the host that failed after the
    /// engine took the packet. Its work requests are flushed, answers it has not sent yet are
    /// dropped (so nothing it could not do is acknowledged), and an async event is raised:
    /// [`AsyncEvent::QpAccessError`] with `access_error` (IBV_EVENT_QP_ACCESS_ERR, "local
    /// access violation"), else [`AsyncEvent::QpFatal`] (IBV_EVENT_QP_FATAL, "local work
    /// queue catastrophic error"). A QP already in ERR only loses its pending answers.
    pub fn fail_qp(&mut self, qpn: Qpn, access_error: bool) -> VerbsResult<()> {
        let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::NotFound("QP"))?;
        if qp.state == QpState::Err {
            qp.resp_out.clear();
            return Ok(());
        }
        flush_qp(qp, &mut self.ctx, true);
        self.ctx.events.push_back(if access_error {
            AsyncEvent::QpAccessError { qpn }
        } else {
            AsyncEvent::QpFatal { qpn }
        });
        Ok(())
    }

    /// `ibv_req_notify_cq`: the next completion (or next solicited one) raises
    /// [`AsyncEvent::CqNotify`].
    pub fn req_notify_cq(&mut self, cq: u32, solicited_only: bool) -> VerbsResult<()> {
        let c = self
            .ctx
            .cqs
            .get_mut(&cq)
            .ok_or(VerbsError::NotFound("CQ"))?;
        c.armed = Some(solicited_only);
        Ok(())
    }

    // ----- shared receive queues ----------------------------------------------------------

    pub fn create_srq(&mut self, pd: u32, max_wr: u32, max_sge: u32) -> VerbsResult<u32> {
        if max_wr == 0 || max_wr > self.ctx.config.max_qp_wr || max_sge > 27 {
            return Err(VerbsError::Invalid("SRQ capacity"));
        }
        let srq = Srq {
            pd,
            max_wr,
            max_sge,
            queue: VecDeque::new(),
            limit: 0,
            users: 0,
        };
        self.pd_use(pd, 1)?;
        match self.ctx.srqs.insert(srq) {
            Some(h) => Ok(h),
            None => {
                self.pd_use(pd, -1)?;
                Err(VerbsError::NoResources("SRQ table full"))
            }
        }
    }

    /// `ibv_modify_srq` with IBV_SRQ_MAX_WR: the SRQ holds `max_wr` WQEs from now on. EINVAL
    /// below the WQEs it holds or below its armed limit (rxe_srq_chk_attr).
    pub fn resize_srq(&mut self, srq: u32, max_wr: u32) -> VerbsResult<()> {
        let max_qp_wr = self.ctx.config.max_qp_wr;
        let s = self
            .ctx
            .srqs
            .get_mut(&srq)
            .ok_or(VerbsError::NotFound("SRQ"))?;
        if max_wr == 0 || max_wr > max_qp_wr {
            return Err(VerbsError::Invalid("SRQ capacity"));
        }
        if (max_wr as usize) < s.queue.len() || (s.limit > 0 && max_wr < s.limit) {
            return Err(VerbsError::Invalid(
                "max_wr below the WQEs held or the armed limit",
            ));
        }
        s.max_wr = max_wr;
        Ok(())
    }

    /// WQEs an SRQ holds (`None`: no such SRQ).
    pub fn srq_len(&self, srq: u32) -> Option<usize> {
        self.ctx.srqs.get(&srq).map(|s| s.queue.len())
    }

    /// `ibv_modify_srq` with IBV_SRQ_LIMIT: arm the limit event (0 disarms).
    pub fn arm_srq_limit(&mut self, srq: u32, limit: u32) -> VerbsResult<()> {
        let s = self
            .ctx
            .srqs
            .get_mut(&srq)
            .ok_or(VerbsError::NotFound("SRQ"))?;
        if limit > s.max_wr {
            return Err(VerbsError::Invalid("SRQ limit above max_wr"));
        }
        s.limit = limit;
        Ok(())
    }

    pub fn post_srq_recv(&mut self, srq: u32, wr: RecvWr) -> VerbsResult<()> {
        let s = self
            .ctx
            .srqs
            .get_mut(&srq)
            .ok_or(VerbsError::NotFound("SRQ"))?;
        if wr.sg_list.len() > s.max_sge as usize {
            return Err(VerbsError::Invalid("too many SGEs"));
        }
        if s.queue.len() >= s.max_wr as usize {
            return Err(VerbsError::NoResources("SRQ full"));
        }
        s.queue.push_back(wr);
        Ok(())
    }

    pub fn destroy_srq(&mut self, srq: u32) -> VerbsResult<()> {
        match self.ctx.srqs.get(&srq) {
            None => Err(VerbsError::NotFound("SRQ")),
            Some(s) if s.users > 0 => Err(VerbsError::Busy("SRQ still used by a QP")),
            Some(s) => {
                let pd = s.pd;
                self.ctx.srqs.remove(&srq);
                self.pd_use(pd, -1)
            }
        }
    }

    // ----- address handles ----------------------------------------------------------------

    pub fn create_ah(&mut self, pd: u32, av: AddressVector) -> VerbsResult<u32> {
        if self.ctx.config.gid(av.sgid_index).is_none() {
            return Err(VerbsError::Invalid("sgid_index"));
        }
        self.pd_use(pd, 1)?;
        match self.ctx.ahs.insert(Ah { pd, av }) {
            Some(h) => Ok(h),
            None => {
                self.pd_use(pd, -1)?;
                Err(VerbsError::NoResources("AH table full"))
            }
        }
    }

    pub fn destroy_ah(&mut self, ah: u32) -> VerbsResult<()> {
        let a = self.ctx.ahs.remove(&ah).ok_or(VerbsError::NotFound("AH"))?;
        self.pd_use(a.pd, -1)
    }

    // ----- queue pairs --------------------------------------------------------------------

    pub fn create_qp(&mut self, init: QpInit) -> VerbsResult<Qpn> {
        self.create_qp_numbered(init, None)
    }

    /// `create_qp`, with QPN `number` instead of a fresh one when given (a QP whose halves
    /// come from another engine, [`Engine::import_qp`]).
    pub(crate) fn create_qp_numbered(
        &mut self,
        init: QpInit,
        number: Option<Qpn>,
    ) -> VerbsResult<Qpn> {
        let cfg = &self.ctx.config;
        let c = init.cap;
        if c.max_send_wr > cfg.max_qp_wr
            || c.max_recv_wr > cfg.max_qp_wr
            || c.max_send_sge > cfg.max_sge
            || c.max_recv_sge > cfg.max_sge
            || c.max_inline_data > cfg.max_inline_data
        {
            return Err(VerbsError::Invalid("QP capacity above the device limits"));
        }
        if !self.ctx.cqs.contains_key(&init.send_cq) || !self.ctx.cqs.contains_key(&init.recv_cq) {
            return Err(VerbsError::NotFound("CQ"));
        }
        if let Some(s) = init.srq {
            if !self.ctx.srqs.contains_key(&s) {
                return Err(VerbsError::NotFound("SRQ"));
            }
        }
        self.pd_use(init.pd, 1)?;
        let qpn = if init.qp_type == QpType::Gsi {
            if self.qps.contains_key(&Qpn::GSI) {
                return Err(VerbsError::Busy("GSI QP exists"));
            }
            Qpn::GSI
        } else if let Some(q) = number {
            q
        } else {
            match self.fresh_qpn() {
                Some(q) => q,
                None => {
                    self.pd_use(init.pd, -1)?;
                    return Err(VerbsError::NoResources("QP numbers"));
                }
            }
        };
        for cq in [init.send_cq, init.recv_cq] {
            if let Some(c) = self.ctx.cqs.get_mut(&cq) {
                c.users += 1;
            }
        }
        if let Some(s) = init.srq.and_then(|s| self.ctx.srqs.get_mut(&s)) {
            s.users += 1;
        }
        let mut qp = Qp::new(qpn, init);
        qp.cc = AnyController::new(&self.ctx.config.congestion);
        self.qps.insert(qpn, qp);
        Ok(qpn)
    }

    /// The QPN for a new QP: the next one in order, or with [`EngineConfig::random_qpns`] one
    /// drawn at random among the free ones of the ranges (O(1), [`QpnPool`]).
    fn fresh_qpn(&mut self) -> Option<Qpn> {
        // A pool replaced under live QPs (set_qpn_range again) may offer a QPN in use.
        for _ in 0..64 {
            let keys = &mut self.ctx.keys;
            let q = Qpn::new(self.qpns.draw(|| keys.next_u64())?);
            if !self.qps.contains_key(&q) {
                return Some(q);
            }
        }
        None
    }

    /// `ibv_destroy_qp`: the QP disappears with its queues, without completions.
    pub fn destroy_qp(&mut self, qpn: Qpn) -> VerbsResult<()> {
        let qp = self.qps.remove(&qpn).ok_or(VerbsError::NotFound("QP"))?;
        if qpn != Qpn::GSI {
            self.qpns.release(qpn.value());
        }
        for cq in [qp.init.send_cq, qp.init.recv_cq] {
            if let Some(c) = self.ctx.cqs.get_mut(&cq) {
                c.users = c.users.saturating_sub(1);
            }
        }
        if let Some(s) = qp.init.srq.and_then(|s| self.ctx.srqs.get_mut(&s)) {
            s.users = s.users.saturating_sub(1);
        }
        for members in self.mcast.values_mut() {
            members.retain(|q| *q != qpn);
        }
        self.ctx.ready.retain(|q| *q != qpn);
        self.pd_use(qp.init.pd, -1)
    }

    pub fn query_qp(&self, qpn: Qpn) -> VerbsResult<(QpState, QpAttr)> {
        let qp = self.qps.get(&qpn).ok_or(VerbsError::NotFound("QP"))?;
        let mut attr = qp.attr;
        attr.qp_state = qp.state;
        attr.cur_qp_state = qp.state;
        attr.sq_psn = qp.req_psn;
        attr.rq_psn = qp.resp_psn;
        Ok((qp.state, attr))
    }

    /// `ibv_modify_qp`, with the attribute table of [`check_modify`].
    pub fn modify_qp(&mut self, qpn: Qpn, attr: &QpAttr, mask: AttrMask) -> VerbsResult<()> {
        let config = &self.ctx.config;
        let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::NotFound("QP"))?;
        let next = check_modify(qp.state, qp.ty, attr, mask)?;
        qp.next_segment = None;
        if qp.state == QpState::Sqd
            && next != QpState::Err
            && next != QpState::Reset
            && qp.has_unacked()
        {
            // rxe refuses to leave SQD (except to ERR/RESET) while still draining.
            return Err(VerbsError::Busy("SQ still draining"));
        }
        if let Some(av) = attr.ah_attr.filter(|_| mask.contains(AttrMask::AV)) {
            if config.gid(av.sgid_index).is_none() {
                return Err(VerbsError::Invalid("sgid_index"));
            }
        }
        let a = &mut qp.attr;
        if mask.contains(AttrMask::ACCESS_FLAGS) {
            a.qp_access_flags = attr.qp_access_flags;
        }
        if mask.contains(AttrMask::QKEY) {
            a.qkey = attr.qkey;
        }
        if mask.contains(AttrMask::PATH_MTU) {
            a.path_mtu = attr.path_mtu;
        }
        if mask.contains(AttrMask::DEST_QPN) {
            a.dest_qp_num = attr.dest_qp_num;
        }
        if mask.contains(AttrMask::AV) {
            a.ah_attr = attr.ah_attr;
        }
        if mask.contains(AttrMask::TIMEOUT) {
            a.timeout = attr.timeout;
        }
        if mask.contains(AttrMask::RETRY_CNT) {
            a.retry_cnt = attr.retry_cnt;
            qp.retry_left = attr.retry_cnt;
        }
        if mask.contains(AttrMask::RNR_RETRY) {
            a.rnr_retry = attr.rnr_retry;
            qp.rnr_retry_left = attr.rnr_retry;
        }
        if mask.contains(AttrMask::MIN_RNR_TIMER) {
            a.min_rnr_timer = attr.min_rnr_timer;
        }
        if mask.contains(AttrMask::MAX_QP_RD_ATOMIC) {
            // rxe rounds both depths up to a power of two.
            a.max_rd_atomic = round_pow2(attr.max_rd_atomic);
        }
        if mask.contains(AttrMask::MAX_DEST_RD_ATOMIC) {
            a.max_dest_rd_atomic = round_pow2(attr.max_dest_rd_atomic);
        }
        if mask.contains(AttrMask::EN_SQD_ASYNC_NOTIFY) {
            a.en_sqd_async_notify = attr.en_sqd_async_notify;
        }
        if mask.contains(AttrMask::RQ_PSN) {
            qp.resp_psn = attr.rq_psn;
        }
        if mask.contains(AttrMask::SQ_PSN) {
            qp.req_psn = attr.sq_psn;
            qp.comp_psn = attr.sq_psn;
        }
        if mask.contains(AttrMask::MAX_DEST_RD_ATOMIC) {
            qp.resize_resources();
        }
        if mask.contains(AttrMask::RQ_PSN) || mask.contains(AttrMask::SQ_PSN) {
            super::selective::on_psns_set(qp);
        }
        if qp.ty == QpType::Gsi {
            qp.attr.qkey = Qkey::GSI;
        }
        if mask.contains(AttrMask::AV) || mask.contains(AttrMask::DEST_QPN) {
            if let (Some(av), false) = (qp.attr.ah_attr, qp.ty.is_ud()) {
                qp.src_port = udp_sport_for_flow(av.flow_label, qp.qpn, qp.attr.dest_qp_num);
            }
        }
        let prev = qp.state;
        match next {
            QpState::Reset => {
                qp.reset();
                qp.cc = AnyController::new(&self.ctx.config.congestion);
            }
            QpState::Err if prev != QpState::Err => {
                qp.state = QpState::Err;
                flush_qp(qp, &mut self.ctx, true);
            }
            QpState::Sqd => {
                qp.state = next;
                qp.sqd_notified = false;
                check_sq_drained(qp, &mut self.ctx);
            }
            _ => qp.state = next,
        }
        if next == QpState::Rts {
            schedule(qp, &mut self.ctx.ready);
        }
        Ok(())
    }

    /// Chooses how an RC QP recovers lost packets ([`LossRecovery`]). Every QP starts with
    /// go-back-N, exactly as rxe; selective retransmission is for a peer known to be a
    /// softroce device doing the same (the daemon negotiates it, `docs/loss-recovery.md`).
    /// The switch may happen at any time, with packets outstanding; it is one way: a QP
    /// goes back to go-back-N only through RESET (the peer may hold packets it reported).
    pub fn set_loss_recovery(&mut self, qpn: Qpn, mode: LossRecovery) -> VerbsResult<()> {
        let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::NotFound("QP"))?;
        match mode {
            LossRecovery::GoBackN if qp.selective.is_some() => Err(VerbsError::Invalid(
                "selective retransmission ends only with RESET",
            )),
            LossRecovery::GoBackN => Ok(()),
            LossRecovery::Selective(_) if qp.ty != QpType::Rc => Err(VerbsError::Invalid(
                "selective retransmission needs an RC QP",
            )),
            LossRecovery::Selective(params) => {
                super::selective::enable(qp, params);
                schedule(qp, &mut self.ctx.ready);
                Ok(())
            }
        }
    }

    /// A summary of a selective QP's recovery state, for logs (None: go-back-N or no QP).
    pub fn selective_summary(&self, qpn: Qpn) -> Option<String> {
        let qp = self.qps.get(&qpn)?;
        let sel = qp.selective.as_deref()?;
        Some(format!(
            "{}; state {:?} comp_psn {} req_psn {} retry_left {} sq {}; resp_psn {} in_msg {:?} resp_out {}",
            sel.summary(),
            qp.state,
            qp.comp_psn,
            qp.req_psn,
            qp.retry_left,
            qp.sq.len(),
            qp.resp_psn,
            qp.in_msg.as_ref().map(|m| (m.is_send, m.offset, m.resid)),
            qp.resp_out.len()
        ))
    }

    /// A QP's transport type.
    pub fn qp_type(&self, qpn: Qpn) -> Option<QpType> {
        self.qps.get(&qpn).map(|q| q.ty)
    }

    /// The loss recovery an RC QP uses now.
    pub fn loss_recovery(&self, qpn: Qpn) -> Option<LossRecovery> {
        let qp = self.qps.get(&qpn)?;
        Some(match qp.selective.as_deref() {
            Some(sel) => LossRecovery::Selective(sel.params()),
            None => LossRecovery::GoBackN,
        })
    }

    /// `ibv_attach_mcast` (UD only).
    pub fn attach_mcast(&mut self, qpn: Qpn, group: IpAddr) -> VerbsResult<()> {
        let qp = self.qps.get(&qpn).ok_or(VerbsError::NotFound("QP"))?;
        if !qp.ty.is_ud() {
            return Err(VerbsError::Invalid("multicast needs a UD QP"));
        }
        let members = self.mcast.entry(group).or_default();
        if !members.contains(&qpn) {
            members.push(qpn);
        }
        Ok(())
    }

    pub fn detach_mcast(&mut self, qpn: Qpn, group: IpAddr) -> VerbsResult<()> {
        let members = self
            .mcast
            .get_mut(&group)
            .ok_or(VerbsError::NotFound("group"))?;
        let before = members.len();
        members.retain(|q| *q != qpn);
        if members.len() == before {
            return Err(VerbsError::NotFound("attachment"));
        }
        Ok(())
    }

    // ----- posting work -------------------------------------------------------------------

    /// `ibv_post_send` of one work request.
    pub fn post_send(&mut self, qpn: Qpn, wr: SendWr) -> VerbsResult<()> {
        let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::NotFound("QP"))?;
        super::requester::post_send(qp, &mut self.ctx, wr)
    }

    /// `ibv_post_recv` of one work request.
    pub fn post_recv(&mut self, qpn: Qpn, wr: RecvWr) -> VerbsResult<()> {
        let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::NotFound("QP"))?;
        if qp.init.srq.is_some() {
            return Err(VerbsError::Invalid("QP uses an SRQ"));
        }
        if qp.state == QpState::Reset {
            return Err(VerbsError::Invalid("QP in RESET"));
        }
        if wr.sg_list.len() > qp.init.cap.max_recv_sge as usize {
            return Err(VerbsError::Invalid("too many SGEs"));
        }
        if qp.rq.len() >= qp.init.cap.max_recv_wr as usize {
            return Err(VerbsError::NoResources("RQ full"));
        }
        if qp.state == QpState::Err {
            // Posting to a QP in ERR completes at once with a flush status (rxe flushes it too).
            let wc = WorkCompletion::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, qpn);
            complete(&mut self.ctx, qp.init.recv_cq, wc, false);
            return Ok(());
        }
        qp.rq.push_back(wr);
        Ok(())
    }

    // ----- the sans-I/O engine ------------------------------------------------------------

    /// Feeds one received RoCE packet: a whole IPv4 or IPv6 packet (UDP, BTH .. ICRC: RoCE
    /// v2), or a GRH and BTH .. ICRC (RoCE v1, the Ethernet header removed). Headers are
    /// checked, then the ICRC; a bad packet is counted and dropped.
    pub fn handle_packet(&mut self, now: Nanos, packet: &[u8]) {
        // The next packet of a long WRITE, predicted from the QP's state (as TCP's header
        // prediction does); anything unexpected takes the general path below.
        if let Some(w) = super::packet_io::parse_write_middle(packet) {
            if let Some(qp) = self.qps.get_mut(&w.dest_qpn) {
                if super::responder::on_predicted_write_middle(qp, &mut self.ctx, &w) {
                    return;
                }
            }
        }
        // The common case (a well-formed IPv4 packet with a good ICRC) without the general
        // frame parser; anything else goes through it and is judged and counted there.
        if let Some((rx, pending)) =
            super::packet_io::parse_ipv4_with(packet, super::packet_io::IcrcCheck::DeferPlacement)
        {
            self.dispatch(now, &rx, pending.as_ref());
            return;
        }
        let parsed = match FrameRepr::parse_network(packet, packet.len()) {
            Ok(p) => p,
            Err(_) => {
                self.ctx.counters.dropped(Dropped::Malformed);
                return;
            }
        };
        if parsed.verified().is_err() {
            self.ctx.counters.icrc_errors += 1;
            return;
        }
        self.handle_parsed(now, parsed, packet);
    }

    /// Like [`Engine::handle_packet`] for a packet whose ICRC the caller has already checked
    /// (a daemon verifies it on receive, where it also recovers the IPv4 Identification) or
    /// that never left the host (packets between two QPs of one device, as rxe's loopback):
    /// the headers are checked as usual, the ICRC is not computed again.
    pub fn handle_verified_packet(&mut self, now: Nanos, packet: &[u8]) {
        if let Some(rx) = super::packet_io::parse_ipv4(packet, false) {
            self.dispatch(now, &rx, None);
            return;
        }
        // Parsed without its last 4 bytes against the whole length: the wire layer's "ICRC
        // not captured" case, which checks everything but the CRC.
        let parsed = match packet
            .len()
            .checked_sub(crate::wire::ICRC_LEN)
            .map(|covered| FrameRepr::parse_network(&packet[..covered], packet.len()))
        {
            Some(Ok(p)) if !matches!(p.icrc, crate::wire::frame::IcrcStatus::Bad { .. }) => p,
            _ => {
                self.ctx.counters.dropped(Dropped::Malformed);
                return;
            }
        };
        self.handle_parsed(now, parsed, packet);
    }

    /// Fault injection (`softroce fault rnr|access-error`): handles a verified packet as
    /// [`Engine::handle_verified_packet`] does, except that a request the RC responder would
    /// execute (the expected PSN, a state that receives) is answered with `nak` instead, as a
    /// responder without a receive WQE (RNR NAK, IBTA §9.7.5.2.8) or with a bad R_Key
    /// (remote access error NAK, §9.7.5.2.4) answers: nothing is executed, and the QP
    /// follows through exactly as for the real condition. Only requests that could meet it
    /// qualify: [`ForcedNak::Rnr`] those that consume a receive WQE, [`ForcedNak::AccessError`]
    /// those that carry a RETH or AtomicETH. Returns whether the packet was so answered.
    pub fn handle_verified_packet_forcing(
        &mut self,
        now: Nanos,
        packet: &[u8],
        nak: ForcedNak,
    ) -> bool {
        self.ctx.forced_nak = Some(nak);
        self.handle_verified_packet(now, packet);
        self.ctx.forced_nak.take().is_none()
    }

    fn handle_parsed(&mut self, now: Nanos, parsed: crate::wire::ParsedFrame<'_>, packet: &[u8]) {
        let net = parsed.repr.net;
        let (ecn, net_len) = match net {
            NetRepr::Ipv4(ip) => (ip.tos & 3, ipv4::HEADER_LEN),
            // The GRH's TClass carries ECN as the IPv6 traffic class does.
            NetRepr::Ipv6(ip) | NetRepr::Grh(ip) => (ip.traffic_class & 3, ipv6::HEADER_LEN),
        };
        let rx = RxPacket {
            t: parsed.repr.transport,
            payload: parsed.payload,
            src: net.src_addr(),
            dst: net.dst_addr(),
            ecn_ce: ecn == 3,
            net_header: &packet[..net_len],
            wire_len: packet.len(),
            v1: net.is_v1(),
        };
        self.dispatch(now, &rx, None);
    }

    // Inlined into both receive paths so that the freshly parsed packet's fields stay in
    // registers (read back from memory, they stalled on store forwarding).
    //
    // `pending`: the packet's ICRC is not verified yet (see `packet_io::PendingIcrc`). It is
    // verified before anything at all is done with the packet, unless the packet is the next
    // one of the RDMA WRITE its RC QP is receiving: then the responder verifies it while it
    // places the payload.
    #[inline(always)]
    fn dispatch(&mut self, now: Nanos, rx: &RxPacket<'_>, pending: Option<&PendingIcrc<'_>>) {
        // Drops the packet, counted as corrupt, unless its ICRC is right (or was checked).
        macro_rules! verified_or_drop {
            () => {
                if pending.is_some_and(|p| !p.verify()) {
                    self.ctx.counters.icrc_errors += 1;
                    return;
                }
            };
        }
        let t = &rx.t;
        let Some(info) = t.bth.opcode.info() else {
            verified_or_drop!();
            self.ctx.counters.dropped(Dropped::UnknownOpcode);
            return;
        };
        // rxe: P_Key must match the default 0xFFFF in its low 15 bits.
        if t.bth.pkey & 0x7fff != 0x7fff {
            verified_or_drop!();
            self.ctx.counters.bad_pkey();
            return;
        }
        let dest = t.bth.dest_qpn;
        if dest == Qpn::MULTICAST {
            verified_or_drop!();
            self.ctx.counters.rcvd_pkts += 1;
            self.ctx.counters.rcvd_bytes += rx.wire_len as u64;
            // Borrowed field by field rather than cloned: no allocation per datagram.
            let Some(members) = self.mcast.get(&rx.dst) else {
                self.ctx.counters.drops.no_group += 1;
                return;
            };
            for q in members {
                if let Some(qp) = self.qps.get_mut(q) {
                    super::responder::on_ud_request(qp, &mut self.ctx, rx);
                }
            }
            return;
        }
        let Some(qp) = self.qps.get_mut(&dest) else {
            verified_or_drop!();
            if info.has(crate::wire::OpInfo::CNP) {
                self.ctx.counters.rp_cnp_ignored += 1;
            } else {
                self.ctx.counters.dropped(Dropped::UnknownQp);
            }
            return;
        };
        if info.has(crate::wire::OpInfo::CNP) {
            // A CNP (RoCE v2 Annex A17.9.2) throttles the QP it names: the reaction point.
            verified_or_drop!();
            let params = &self.ctx.config.congestion.params;
            if !qp.ty.is_ud() && qp.cc.inner_mut().on_cnp(now, params) {
                self.ctx.counters.rp_cnp_handled += 1;
            } else {
                self.ctx.counters.rp_cnp_ignored += 1;
            }
            return;
        }
        let transport_ok = match qp.ty {
            QpType::Rc => {
                t.bth.opcode.0 < 0x20 || t.bth.opcode == crate::wire::Opcode::SOFTROCE_SACK
            }
            QpType::Uc => (0x20..0x40).contains(&t.bth.opcode.0),
            QpType::Ud | QpType::Gsi => (0x60..0x80).contains(&t.bth.opcode.0),
        };
        if !transport_ok {
            verified_or_drop!();
            self.ctx.counters.dropped(Dropped::WrongTransport);
            return;
        }
        // rxe checks that RC/UC packets come from and go to the QP's path.
        if !qp.ty.is_ud() {
            let Some(av) = qp.av() else {
                verified_or_drop!();
                self.ctx.counters.dropped(Dropped::WrongPath);
                return;
            };
            let local = self.ctx.config.gid(av.sgid_index);
            // ... and in the framing of its source GID's type (a v2 packet to a QP on a v1
            // GID is not on its path, as for a dual-mode NIC).
            let v1_path = self.ctx.config.gid_type(av.sgid_index) == GidType::RoceV1;
            if rx.src != av.dgid || Some(rx.dst) != local || rx.v1 != v1_path {
                verified_or_drop!();
                self.ctx.counters.dropped(Dropped::WrongPath);
                return;
            }
        }
        // Placement while verifying only for the next packet of the WRITE in progress, with
        // no ECN mark to act on first; everything else is verified here.
        let placing = pending.filter(|_| {
            qp.ty == QpType::Rc
                && !rx.ecn_ce
                && t.bth.psn == qp.resp_psn
                && qp.in_msg.as_ref().is_some_and(|m| !m.is_send)
        });
        if placing.is_none() {
            verified_or_drop!();
        }
        self.ctx.counters.rcvd_pkts += 1;
        self.ctx.counters.rcvd_bytes += rx.wire_len as u64;
        qp.counters.rcvd_pkts += 1;
        qp.counters.rcvd_bytes += rx.wire_len as u64;
        if rx.ecn_ce {
            // The notification point: a CE-marked request, or a READ response carrying data,
            // asks the peer QP to slow down (at most one CNP per QP per
            // min_time_between_cnps). The CNP goes before anything else the QP owes.
            self.ctx.counters.np_ecn_marked_roce_packets += 1;
            let data = info.has(crate::wire::OpInfo::REQUEST) || !rx.payload.is_empty();
            if data
                && !qp.ty.is_ud()
                && qp
                    .cc
                    .inner_mut()
                    .on_ce(now, &self.ctx.config.congestion.params)
            {
                qp.resp_out.push_front(super::qp::RespOut::Cnp);
                schedule(qp, &mut self.ctx.ready);
            }
        }
        if info.has(crate::wire::OpInfo::RESPONSE) {
            super::completer::on_response(qp, &mut self.ctx, now, rx);
            self.timers
                .arm(qp.qpn, qp.next_deadline(), &mut qp.timer_at);
        } else if qp.ty.is_ud() {
            super::responder::on_ud_request(qp, &mut self.ctx, rx);
        } else if !super::responder::on_request(qp, &mut self.ctx, now, rx, placing) {
            // Its ICRC was wrong after all: it did nothing, and is counted as corrupt only.
            self.ctx.counters.rcvd_pkts -= 1;
            self.ctx.counters.rcvd_bytes -= rx.wire_len as u64;
            self.ctx.counters.icrc_errors += 1;
            qp.counters.rcvd_pkts -= 1;
            qp.counters.rcvd_bytes -= rx.wire_len as u64;
        }
        if qp.selective.is_some() {
            // Selective retransmission's responder side may move the QP's deadlines too.
            self.timers
                .arm(qp.qpn, qp.next_deadline(), &mut qp.timer_at);
        }
    }

    /// Runs the timers that are due at `now`: retransmission, RNR wait, pacing. Only the QPs
    /// whose deadline came are visited ([`TimerQueue`]).
    pub fn handle_timeout(&mut self, now: Nanos) {
        let mut due = std::mem::take(&mut self.due);
        let qps = &mut self.qps;
        self.timers.pop_due(now, |qpn, t| {
            // Only the QP's live entry counts: older ones were re-armed since.
            if let Some(qp) = qps.get_mut(&qpn).filter(|q| q.timer_at == Some(t)) {
                qp.timer_at = None;
                due.push(qpn);
            }
        });
        for qpn in due.drain(..) {
            let Some(qp) = self.qps.get_mut(&qpn) else {
                continue;
            };
            if qp.paced_until.is_some_and(|t| t <= now) {
                qp.paced_until = None;
                schedule(qp, &mut self.ctx.ready);
            }
            if qp.rnr_wait_until.is_some_and(|t| t <= now) {
                qp.rnr_wait_until = None;
                schedule(qp, &mut self.ctx.ready);
                if qp.selective.is_some() && qp.retrans_deadline.is_none() && qp.has_unacked() {
                    // Whatever the wait ends with, the timer watches what is outstanding.
                    qp.retrans_deadline =
                        super::timers::ack_timeout(qp.attr.timeout).map(|d| now + d);
                }
            }
            if qp.retrans_deadline.is_some_and(|t| t <= now) {
                qp.retrans_deadline = None;
                super::completer::on_retransmit_timeout(qp, &mut self.ctx, now);
            }
            if qp.probe_deadline.is_some_and(|t| t <= now) {
                qp.probe_deadline = None;
                super::selective::on_probe(qp, &mut self.ctx, now);
            }
            self.timers
                .arm(qp.qpn, qp.next_deadline(), &mut qp.timer_at);
        }
        self.due = due;
    }

    /// The earliest time `handle_timeout` has work to do (or may find none: a deadline that
    /// went away is dropped only when its time comes).
    pub fn poll_timeout(&self) -> Option<Nanos> {
        self.timers.next()
    }

    /// Writes the next packet to send into `buf` (at least [`MAX_FRAME_LEN`] bytes). QPs take
    /// turns; within a QP, the responder's answers go before new requests.
    pub fn poll_transmit(&mut self, now: Nanos, buf: &mut [u8]) -> Option<Transmit> {
        while let Some(qpn) = self.ctx.ready.pop_front() {
            let Some(qp) = self.qps.get_mut(&qpn) else {
                continue;
            };
            qp.scheduled = false;
            let out = if !qp.resp_out.is_empty() {
                super::responder::poll_response(qp, &mut self.ctx, buf)
            } else {
                None
            };
            let out = match out {
                Some(t) => Some(t),
                None => {
                    let t = super::requester::poll_request(qp, &mut self.ctx, now, buf);
                    self.timers
                        .arm(qp.qpn, qp.next_deadline(), &mut qp.timer_at);
                    t
                }
            };
            if let Some(t) = out {
                // It may have more: it goes on until its turn's quantum is spent, then to
                // the back of the line.
                let sent = if self.turn.0 == qpn { self.turn.1 } else { 0 } + t.len;
                if sent < TRANSMIT_QUANTUM {
                    self.turn = (qpn, sent);
                    qp.scheduled = true;
                    self.ctx.ready.push_front(qpn);
                } else {
                    self.turn = (qpn, 0);
                    schedule(qp, &mut self.ctx.ready);
                }
                self.ctx.counters.sent_pkts += 1;
                self.ctx.counters.sent_bytes += t.len as u64;
                qp.counters.sent_pkts += 1;
                qp.counters.sent_bytes += t.len as u64;
                return Some(t);
            }
        }
        None
    }

    /// The next asynchronous event, if any.
    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        self.ctx.events.pop_front()
    }

    /// Test and simulator view of a QP's sequence numbers: (next request PSN, oldest unacked
    /// PSN, expected request PSN at the responder).
    pub fn qp_psns(&self, qpn: Qpn) -> Option<(Psn, Psn, Psn)> {
        self.qps
            .get(&qpn)
            .map(|q| (q.req_psn, q.comp_psn, q.resp_psn))
    }

    /// Go-back-N retries the requester of `qpn` has started, plus its selective
    /// retransmissions (simulator invariant: a PSN moves backward only after one).
    pub fn qp_retry_events(&self, qpn: Qpn) -> Option<u64> {
        self.qps.get(&qpn).map(|q| q.retry_events)
    }

    /// The connected QP whose path leads to `dgid` and remote QP `dest` (RC/UC).
    pub fn qp_towards(&self, dgid: IpAddr, dest: Qpn) -> Option<Qpn> {
        self.qps
            .values()
            .find(|q| {
                !q.ty.is_ud()
                    && q.attr.dest_qp_num == dest
                    && q.av().is_some_and(|a| a.dgid == dgid)
            })
            .map(|q| q.qpn)
    }

    /// Number of receive WQEs still posted on a QP's own RQ.
    pub fn rq_len(&self, qpn: Qpn) -> Option<usize> {
        self.qps.get(&qpn).map(|q| q.rq.len())
    }

    /// How many more send work requests `post_send` would take before refusing one as "SQ
    /// full" (`None`: no such QP). A caller that keeps refused requests for later checks
    /// first, instead of posting a copy.
    pub fn sq_room(&self, qpn: Qpn) -> Option<usize> {
        self.qps
            .get(&qpn)
            .map(|q| (q.init.cap.max_send_wr as usize).saturating_sub(q.sq.len()))
    }
}

fn round_pow2(v: u8) -> u8 {
    if v == 0 {
        0
    } else {
        (u32::from(v).next_power_of_two()).min(128) as u8
    }
}

/// A received packet, already parsed and ICRC-checked.
#[derive(Debug)]
pub(crate) struct RxPacket<'a> {
    pub t: TransportRepr,
    pub payload: &'a [u8],
    pub src: IpAddr,
    pub dst: IpAddr,
    pub ecn_ce: bool,
    /// The IP header (or the v1 GRH) as received: UD receive buffers get it in their GRH
    /// area.
    pub net_header: &'a [u8],
    pub wire_len: usize,
    /// RoCE v1: it came with a GRH, not IP/UDP.
    pub v1: bool,
}

/// How many bytes a QP sends in one turn of [`Engine::poll_transmit`] before the next ready
/// QP's turn. rxe runs a QP's requester task for up to `RXE_MAX_ITERATIONS` packets before it
/// yields, a NIC schedules a QP's work requests in bursts; a turn of one packet made QPs that
/// send long messages side by side alternate packet by packet, so every packet read its
/// payload from another buffer than the one before (the daemon's read-ahead window of one
/// message, `procmem::READ_AHEAD`, was refilled for each: `ib_write_bw -q 2 -s 65536` ran at
/// a tenth of `-q 1`). 64 KiB, the read-ahead window, keeps a message's packets together and
/// holds another QP back for at most 16 packets of 4 KiB.
pub const TRANSMIT_QUANTUM: usize = 64 * 1024;

pub(crate) fn schedule(qp: &mut Qp, ready: &mut VecDeque<Qpn>) {
    if !qp.scheduled {
        qp.scheduled = true;
        ready.push_back(qp.qpn);
    }
}

/// Adds a completion to a CQ. Returns false when the CQ overflowed (the caller moves the QP
/// to ERR, IBTA §11.4.2.1 / rxe class G).
pub(crate) fn complete<M>(ctx: &mut Ctx<M>, cq: u32, wc: WorkCompletion, solicited: bool) -> bool {
    let Some(c) = ctx.cqs.get_mut(&cq) else {
        return false;
    };
    if c.overflowed {
        return false;
    }
    if !c.touched {
        c.touched = true;
        ctx.touched_cqs.push(cq);
    }
    if c.entries.len() >= c.capacity {
        c.overflowed = true;
        ctx.events.push_back(AsyncEvent::CqError { cq });
        return false;
    }
    c.entries.push_back(wc);
    if let Some(solicited_only) = c.armed {
        if !solicited_only || solicited || wc.status != WcStatus::Success {
            c.armed = None;
            ctx.events.push_back(AsyncEvent::CqNotify { cq });
        }
    }
    true
}

/// Moves a QP's queues into the flushed state of ERR: every SQ WQE and every RQ WQE (not the
/// SRQ's) completes with WR_FLUSH_ERR, in order (IBTA §10.3.1, rxe). `drop_output` also
/// discards the responder's queued answers (a consumer-requested transition); after a
/// transport error the NAK that reports it is still sent.
pub(crate) fn flush_qp<M>(qp: &mut Qp, ctx: &mut Ctx<M>, drop_output: bool) {
    qp.state = QpState::Err;
    super::selective::on_error(qp);
    qp.retrans_deadline = None;
    qp.probe_deadline = None;
    qp.rnr_wait_until = None;
    qp.paced_until = None;
    qp.need_retry = false;
    while let Some(w) = qp.sq.pop_front() {
        let mut wc = WorkCompletion::new(
            w.wr.wr_id,
            WcStatus::WrFlushErr,
            w.wr.op.wc_opcode(),
            qp.qpn,
        );
        wc.byte_len = 0;
        complete(ctx, qp.init.send_cq, wc, false);
    }
    qp.req_index = 0;
    if let Some(m) = qp.in_msg.take() {
        if let Some(r) = m.recv {
            // A receive WQE taken for a message that never finished is flushed too.
            let wc = WorkCompletion::new(r.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, qp.qpn);
            complete(ctx, qp.init.recv_cq, wc, false);
        }
    }
    while let Some(r) = qp.rq.pop_front() {
        let wc = WorkCompletion::new(r.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, qp.qpn);
        complete(ctx, qp.init.recv_cq, wc, false);
    }
    if qp.init.srq.is_some() {
        ctx.events
            .push_back(AsyncEvent::LastWqeReached { qpn: qp.qpn });
    }
    if drop_output {
        qp.resp_out.clear();
    }
}

/// Raises SQ_DRAINED once a QP in SQD has nothing outstanding.
pub(crate) fn check_sq_drained<M>(qp: &mut Qp, ctx: &mut Ctx<M>) {
    if qp.state == QpState::Sqd && !qp.sqd_notified && !qp.has_unacked() {
        qp.sqd_notified = true;
        if qp.attr.en_sqd_async_notify {
            ctx.events.push_back(AsyncEvent::SqDrained { qpn: qp.qpn });
        }
    }
}

/// The route of a packet from `src_port` to `av`, or None if the AV's source GID does not
/// exist or the address families differ. `data` packets carry ECT(0) when congestion control
/// is on (the AV's traffic class otherwise, verbatim, as rxe). The route is kept in `cache` for the next packet to the same place: built
/// afresh each time, copying it out of the function stalled on store forwarding (its fields
/// are written one by one, then read back as whole blocks).
#[inline(always)]
pub(crate) fn route_for<M>(
    ctx: &Ctx<M>,
    av: &AddressVector,
    src_port: u16,
    data: bool,
    cache: &mut Option<(AddressVector, u16, Route)>,
) -> Option<Route> {
    let mut route = match cache {
        Some((a, p, r)) if a == av && *p == src_port => *r,
        _ => {
            let r = new_route(ctx, av, src_port)?;
            *cache = Some((*av, src_port, r));
            r
        }
    };
    if data && ctx.config.congestion.marks_ect() {
        route.net.set_ecn(Ecn::Ect0);
    }
    Some(route)
}

fn new_route<M>(ctx: &Ctx<M>, av: &AddressVector, src_port: u16) -> Option<Route> {
    let src = ctx.config.gid(av.sgid_index)?;
    let tos = av.traffic_class;
    if ctx.config.gid_type(av.sgid_index) == GidType::RoceV1 {
        // IBTA §8.3: the GRH carries the GIDs themselves, the AV's traffic class (the one
        // place the congestion controller's ECN bits go, as for IP) and flow label.
        let net = NetRepr::Grh(Ipv6Repr {
            src: crate::wire::frame::addr_gid(src),
            dst: crate::wire::frame::addr_gid(av.dgid),
            traffic_class: tos,
            flow_label: av.flow_label & 0xf_ffff,
            next_header: crate::wire::GRH_NEXT_HEADER_IBA,
            hop_limit: av.hop_limit,
            payload_len: 0,
        });
        return Some(Route { net, src_port: 0 });
    }
    let net = match (src, av.dgid) {
        (IpAddr::V4(s), IpAddr::V4(d)) => NetRepr::Ipv4(Ipv4Repr {
            src: s,
            dst: d,
            tos,
            ident: 0,
            dont_frag: true,
            ttl: av.hop_limit,
            protocol: ipv4::PROTOCOL_UDP,
            payload_len: 0,
        }),
        (IpAddr::V6(s), IpAddr::V6(d)) => NetRepr::Ipv6(Ipv6Repr {
            src: s,
            dst: d,
            traffic_class: tos,
            // rxe always sends flow label 0 (roce-rxe-facts.md §10.1).
            flow_label: 0,
            next_header: ipv6::NEXT_HEADER_UDP,
            hop_limit: av.hop_limit,
            payload_len: 0,
        }),
        _ => return None,
    };
    Some(Route { net, src_port })
}

/// What every registration obeys: remote write or atomic access needs local write too (IBTA
/// §10.6.3.1, checked by ib_core), and the range may not wrap around the address space.
fn check_mr(access: Access, addr: u64, length: u64) -> VerbsResult<()> {
    let needs_local_write = Access::REMOTE_WRITE.union(Access::REMOTE_ATOMIC);
    if access.0 & needs_local_write.0 != 0 && !access.contains(Access::LOCAL_WRITE) {
        return Err(VerbsError::Invalid("remote write/atomic needs LOCAL_WRITE"));
    }
    if addr.checked_add(length).is_none() {
        return Err(VerbsError::Invalid("MR wraps around the address space"));
    }
    Ok(())
}
