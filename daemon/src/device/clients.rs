//! A client process's presence on the device: its engine (all of its resources), the rings
//! and descriptors it shares with the daemon, and the device-side bookkeeping of each object.
//! A client's engine is created on its first request and dropped, with everything in it, when
//! the client goes (or when its engine panicked: see [`contained`]).

use super::DeviceThread;
use crate::memory::ProcessMemory;
use crate::shm::SharedRegion;
use proto::ctl::ClientResources;
use proto::ring::SharedRing;
use proto::transport::{self as tp, MemoryAccess, MemoryError, Mtu, QpCap, RecvWr, SendWr};
use proto::Qpn;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::os::fd::OwnedFd;
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
    /// the reads served from snapshots.
    pub(super) fn settle(&mut self, begin: bool) {
        let m = self.0.get_mut();
        if let Err(e) = m.flush() {
            debug!("a deferred write into the client failed: {e}");
        }
        if begin {
            m.begin_pass();
        } else {
            m.end_pass();
        }
    }
}

pub(super) type Engine = tp::Engine<ProcMem>;

pub(super) struct CqState {
    pub _region: SharedRegion,
    pub ring: SharedRing,
    pub channel: Option<u32>,
    pub generation: u32,
    pub ctx: u32,
}

pub(super) struct QpHost {
    pub _region: SharedRegion,
    pub sq: SharedRing,
    pub rq: Option<SharedRing>,
    pub cap: QpCap,
    pub send_cq: u32,
    pub sq_sig_all: bool,
    /// Work the engine could not take yet (its queue was full), in order.
    pub pending_send: VecDeque<SendWr>,
    pub pending_recv: VecDeque<RecvWr>,
    pub ctx: u32,
}

pub(super) struct SrqState {
    pub _region: SharedRegion,
    pub ring: SharedRing,
    pub max_sge: u32,
    pub pending: VecDeque<RecvWr>,
    pub limit: u32,
    pub max_wr: u32,
    pub ctx: u32,
}

/// A client's presence on this device.
pub(super) struct ClientDev {
    pub pid: i32,
    pub engine: Engine,
    pub block: u32,
    /// Context handle -> async event socket (write end).
    pub contexts: HashMap<u32, OwnedFd>,
    pub channels: HashMap<u32, OwnedFd>,
    /// PD handle -> (engine PD, the context that allocated it).
    pub pds: HashMap<u32, (u32, u32)>,
    pub mrs: HashMap<u32, u32>,
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

fn random_u64() -> u64 {
    // RandomState is seeded from the OS's entropy: keys must not be guessable.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x5352_5845);
    h.finish()
}

impl DeviceThread {
    /// The client's engine on this device, created on first use. The error is an errno and a
    /// message for the client.
    pub(super) fn client(
        &mut self,
        client: u64,
        pid: i32,
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
            let mut config = tp::EngineConfig::new(first, random_u64());
            config.gids = self.gids.clone();
            config.port_mtu =
                Mtu::from_enum(u32::from(self.info.active_mtu)).unwrap_or(Mtu::Mtu1024);
            // The ICRC is computed once per packet: by the link for the headers it sends,
            // and never for packets between local QPs, which the receiving engine takes with
            // handle_verified_packet.
            config.seal_icrc = false;
            config.congestion = self.congestion;
            let mut engine =
                tp::Engine::new(config, ProcMem(RefCell::new(ProcessMemory::new(pid))));
            engine.set_qpn_range(block * QPN_BLOCK, (block + 1) * QPN_BLOCK);
            self.blocks.insert(block, client);
            self.clients.insert(
                client,
                ClientDev {
                    pid,
                    engine,
                    block,
                    contexts: HashMap::new(),
                    channels: HashMap::new(),
                    pds: HashMap::new(),
                    mrs: HashMap::new(),
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
            self.count_departed(c.engine.counters());
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
