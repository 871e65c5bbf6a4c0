//! A client process's presence on the device: its engine (all of its resources), the rings
//! and descriptors it shares with the daemon, and the device-side bookkeeping of each object.
//! A client's engine is created on its first request and dropped, with everything in it, when
//! the client goes (or when its engine panicked: see [`contained`]).

use super::events::EventSink;
use super::DeviceThread;
use crate::memory::ProcessMemory;
use crate::peer::ClientProcess;
use crate::shm::SharedRegion;
use proto::ctl::{ClientResources, RoceVersion};
use proto::ring::SharedRing;
use proto::transport::{self as tp, MemoryAccess, MemoryError, Mtu, QpCap, RecvWr, SendWr};
use proto::Qpn;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use tracing::{debug, info};

/// QPNs per client engine: client k gets `[k * BLOCK, (k + 1) * BLOCK)`; block 0 holds the
/// reserved QPNs 0 and 1.
pub(super) const QPN_BLOCK: u32 = 1 << 16;

/// A client process's memory as the engine sees it.
pub struct ProcMem(pub(super) RefCell<ProcessMemory>);

impl std::fmt::Debug for ProcMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProcMem")
    }
}

/// One engine serves one client process, so the engine's address space tag is always 0.
impl MemoryAccess for ProcMem {
    fn read(&self, _space: u64, addr: u64, out: &mut [u8]) -> Result<(), MemoryError> {
        let len = out.len();
        self.0
            .borrow_mut()
            .read(addr, out)
            .map_err(|_| MemoryError { addr, len })
    }
    fn write(&mut self, _space: u64, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        self.0.get_mut().write(addr, data).map_err(|_| MemoryError {
            addr,
            len: data.len(),
        })
    }
}

impl ProcMem {
    /// Before the engine sends anything or completions are delivered, deferred writes land
    /// (memory::ProcessMemory); then a transmit pass starts (`begin`) or ends, and with it
    /// the reads served from snapshots. Returns the QPs whose placed data did not reach the
    /// process (it unmapped memory it had registered).
    pub(super) fn settle(&mut self, begin: bool) -> Vec<u32> {
        let m = self.0.get_mut();
        if let Err(e) = m.flush() {
            debug!("a deferred write into the client failed: {e}");
        }
        if begin {
            m.begin_pass();
        } else {
            m.end_pass();
        }
        m.take_failed_writers()
    }

    /// Names the QP whose packet the engine places next (see [`ProcMem::settle`]).
    pub(super) fn placing_for(&mut self, qpn: u32) {
        self.0.get_mut().set_writer(qpn);
    }
}

pub(super) type Engine = tp::Engine<ProcMem>;

pub(super) struct CqState {
    pub region: SharedRegion,
    pub ring: SharedRing,
    pub channel: Option<u32>,
    pub generation: u32,
    pub ctx: u32,
    /// Overrun: the CQ is in error and its QPs were moved to ERR.
    pub in_error: bool,
}

pub(super) struct QpHost {
    pub region: SharedRegion,
    pub sq: SharedRing,
    pub rq: Option<SharedRing>,
    pub cap: QpCap,
    pub send_cq: u32,
    pub recv_cq: u32,
    pub sq_sig_all: bool,
    /// Work the engine could not take yet (its queue was full), in order.
    pub pending_send: VecDeque<SendWr>,
    pub pending_recv: VecDeque<RecvWr>,
    pub ctx: u32,
    /// A ring held a WQE that could not be decoded: the QP is in ERR and its rings are not
    /// read again.
    pub corrupt: bool,
}

pub(super) struct SrqState {
    pub region: SharedRegion,
    pub ring: SharedRing,
    pub max_sge: u32,
    pub pending: VecDeque<RecvWr>,
    pub limit: u32,
    pub max_wr: u32,
    pub ctx: u32,
    /// Its ring held a WQE that could not be decoded: the SRQ is in error.
    pub corrupt: bool,
}

/// A client's presence on this device.
pub(super) struct ClientDev {
    pub pid: i32,
    /// The device's index (in the handles the client is given).
    pub device: u32,
    pub engine: Engine,
    pub block: u32,
    /// Context handle -> its async event socket (write end).
    pub contexts: HashMap<u32, EventSink>,
    /// Completion channel handle -> its pipe (write end).
    pub channels: HashMap<u32, EventSink>,
    /// PD handle -> (engine PD, the context that allocated it).
    pub pds: HashMap<u32, (u32, u32)>,
    /// MR handle -> (engine MR, its length).
    pub mrs: HashMap<u32, (u32, u64)>,
    /// Bytes registered in the MRs, and of the ring regions of the CQs, QPs and SRQs
    /// (what the caps of [`super::limits`] count).
    pub mr_bytes: u64,
    pub ring_bytes: u64,
    pub cqs: HashMap<u32, CqState>,
    pub qps: HashMap<u32, QpHost>,
    pub srqs: HashMap<u32, SrqState>,
    pub ahs: HashMap<u32, u32>,
    pub mws: HashSet<u32>,
    pub next_handle: u32,
}

impl ClientDev {
    pub fn handle(&mut self) -> u32 {
        self.next_handle += 1;
        self.next_handle
    }

    /// Lands the deferred writes (see [`ProcMem::settle`]); a QP whose data could not be
    /// placed goes to ERR with IBV_EVENT_QP_ACCESS_ERR before it sends anything, so the
    /// request is never acknowledged.
    pub fn settle(&mut self, begin: bool) {
        for qpn in self.engine.memory_mut().settle(begin) {
            if self.qps.contains_key(&qpn) {
                debug!(
                    qpn,
                    "data placed for the QP did not reach the process: QP to ERR"
                );
                let _ = self.engine.fail_qp(Qpn::new(qpn), true);
            }
        }
    }

    /// Reports an SRQ in error (IBV_EVENT_SRQ_ERR, 14) to its context. The engine has no
    /// such event: only the device finds an SRQ's ring corrupt.
    pub fn srq_error(&mut self, srq: u32) {
        let Some(ctx) = self.srqs.get(&srq).map(|s| s.ctx) else {
            return;
        };
        if let Some(sink) = self.contexts.get_mut(&ctx) {
            let mut rec = [0u8; 16];
            let element = u64::from(super::handles::tag_handle(self.device, srq));
            rec[..8].copy_from_slice(&element.to_ne_bytes());
            rec[8..12].copy_from_slice(&14u32.to_ne_bytes());
            sink.send(&rec, 12);
        }
    }

    /// Whether records wait for room in any of the client's event descriptors.
    pub fn events_held_back(&self) -> bool {
        self.contexts
            .values()
            .chain(self.channels.values())
            .any(EventSink::has_backlog)
    }

    pub fn resources(&self) -> ClientResources {
        ClientResources {
            pid: self.pid as u32,
            pds: self.pds.len() as u32,
            mrs: self.mrs.len() as u32,
            cqs: self.cqs.len() as u32,
            qps: self.qps.len() as u32,
            srqs: self.srqs.len() as u32,
            ahs: self.ahs.len() as u32,
            mws: self.mws.len() as u32,
            ..Default::default()
        }
    }
}

impl DeviceThread {
    /// The client's engine on this device, created on first use. The error is an errno and a
    /// message for the client.
    pub(super) fn client(
        &mut self,
        client: u64,
        process: &Arc<ClientProcess>,
    ) -> Result<&mut ClientDev, (i32, &'static str)> {
        if !self.clients.contains_key(&client) {
            let Some(&first) = self.gids.first() else {
                return Err((libc::ENETDOWN, "the device has no address (port down)"));
            };
            let last = Qpn::MASK / QPN_BLOCK;
            let Some(block) = (1..last)
                .map(|i| (self.last_block + i - 1) % (last - 1) + 1)
                .filter(|b| b % self.devices == self.index)
                .find(|b| !self.blocks.contains_key(b))
            else {
                return Err((libc::ENOMEM, "no QP number block left"));
            };
            self.last_block = block;
            // Keys and QPNs from a ChaCha20 stream keyed by the kernel's CSPRNG: nothing
            // about them can be guessed from another client's, or this client's own.
            let mut config = tp::EngineConfig::new(first, crate::entropy::u64());
            config.key_entropy = crate::entropy::bytes();
            config.random_qpns = true;
            config.gids = self.gids.clone();
            // The device's configured CQ depth (`DeviceConfig::max_cqe`), which the shim
            // reports as `max_cqe`.
            config.max_cqe = self.info.max_cqe as usize;
            // The framing of each GID's packets (`--roce both` lists an address twice).
            config.gid_types = self
                .info
                .gids
                .iter()
                .map(|g| match g.roce {
                    RoceVersion::V1 => tp::GidType::RoceV1,
                    RoceVersion::V2 => tp::GidType::RoceV2,
                })
                .collect();
            config.port_mtu =
                Mtu::from_enum(u32::from(self.info.active_mtu)).unwrap_or(Mtu::Mtu1024);
            // The ICRC is computed once per packet: by the link for the headers it sends,
            // and never for packets between local QPs, which the receiving engine takes with
            // handle_verified_packet.
            config.seal_icrc = false;
            config.congestion = self.congestion;
            let memory = ProcessMemory::of(Arc::clone(process));
            let mut engine = tp::Engine::new(config, ProcMem(RefCell::new(memory)));
            engine.set_qpn_range(block * QPN_BLOCK, (block + 1) * QPN_BLOCK);
            self.blocks.insert(block, client);
            self.clients.insert(
                client,
                ClientDev {
                    pid: process.pid(),
                    device: self.index,
                    engine,
                    block,
                    contexts: HashMap::new(),
                    channels: HashMap::new(),
                    pds: HashMap::new(),
                    mrs: HashMap::new(),
                    mr_bytes: 0,
                    ring_bytes: 0,
                    cqs: HashMap::new(),
                    qps: HashMap::new(),
                    srqs: HashMap::new(),
                    ahs: HashMap::new(),
                    mws: HashSet::new(),
                    next_handle: 0,
                },
            );
        }
        self.clients
            .get_mut(&client)
            .ok_or((libc::EIO, "client state lost"))
    }

    /// Forgets a client (it disconnected, or its engine broke): its multicast attachments,
    /// its QPN block and its engine, with everything in it.
    pub(super) fn client_gone(&mut self, client: u64) {
        self.group_detach(|(c, _)| c == client, None);
        if let Some(c) = self.clients.remove(&client) {
            self.blocks.remove(&c.block);
            self.departed.accumulate(c.engine.counters());
            info!(device = %self.info.name, client, qps = c.qps.len(), mrs = c.mrs.len(),
                  "client's engine destroyed");
            debug!(client, counters = ?c.engine.counters(), memory = ?c.engine.memory().0.borrow().stats(),
                   "engine counters");
        }
    }
}

/// Runs one piece of a client's work, containing a panic (an engine bug met by some packet or
/// work request): the device thread serves every client and must not die with one. `None`
/// means it panicked; the caller then drops that client's engine, whose state can no longer be
/// trusted.
pub(super) fn contained<T>(f: impl FnOnce() -> T) -> Option<T> {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).ok();
    if r.is_none() {
        tracing::error!("the engine panicked; that client's resources are dropped");
    }
    r
}
