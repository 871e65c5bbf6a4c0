//! One device's data path, on its own thread: the transport engines, the shared rings of every
//! client, and the packet I/O.
//!
//! Each client process gets its own engine ([`proto::transport::Engine`]) on each device it
//! opens, with its own block of QP numbers. All of a client's resources (PDs, MRs, CQs, QPs)
//! live in that engine, and an R_Key is only ever honoured for a QP of the same PD, so
//! packets are demultiplexed by destination QPN and every memory access the engine makes
//! belongs to one process: the engine's [`MemoryAccess`] is that process's memory
//! (`process_vm_readv`/`writev`). Killing a client drops its engine and everything in it.
//!
//! The loop: control requests, then posted work from the rings into the engines, received
//! packets into the engines, timers, transmits out, completions and events back to the
//! clients. When nothing happened for a short spin, the thread tells every ring it sleeps and
//! blocks in the packet I/O's poll, which also wakes on the doorbell eventfd that clients (and
//! the control threads) write.
//!
//! Received packets for QP1 (CM MADs) go to the CM thread ([`crate::cm`]), which sends its
//! MADs back through here ([`DevMsg::SendGsi`]). Packets between two QPs of this device go
//! from engine to engine without the socket, as rxe's loopback ([`crate::net::LocalFrames`];
//! `local_via_socket` sends them through it), and the device joins the IP multicast groups
//! its QPs attach to ([`crate::net::MulticastGroup`]).

use crate::memory::ProcessMemory;
use crate::net::{
    AdaptiveSpin, LocalFrames, MulticastGroup, NetConfig, PacketBuilder, RxDatagram, RxVerdict,
    RxVerifier, TxMeta, UdpTransport,
};
use crate::shm::SharedRegion;
use crossbeam_channel::{Receiver, Sender};
use nix::sys::eventfd::{EfdFlags, EventFd};
use proto::ctl::{self, ClientResources, DeviceInfo, Request, Response, RingPlace};
use proto::ring::wqe::{self, Cqe, RecvWqe, SendData, SendWqe, WrOpcode};
use proto::ring::{RingGeometry, SharedRing};
use proto::transport::{
    self as tp, Access, AddressVector, AsyncEvent, AttrMask, MemoryAccess, MemoryError, Mtu, QpCap,
    QpInit, QpState, QpType, RecvWr, RemoteAddr, SendFlags, SendOp, SendWr, UdDest, VerbsError,
    WorkCompletion,
};
use proto::{Psn, Qkey, Qpn, Rkey};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// QPNs per client engine: client k gets `[k * BLOCK, (k + 1) * BLOCK)`; block 0 holds the
/// reserved QPNs 0 and 1.
const QPN_BLOCK: u32 = 1 << 16;
/// How long the loop keeps polling after the last piece of work before it sleeps: between
/// these, following the gaps between pieces of work (net::AdaptiveSpin).
const SPIN_MIN: Duration = Duration::from_micros(20);
const SPIN_MAX: Duration = Duration::from_micros(200);
/// Longest sleep when no timer is due. Every other reason to wake rings the doorbell (control
/// messages, posts to a sleeping ring) or completes on the io_uring (packets), and each
/// wake-up costs a pass over every ring: with 10,000 idle QPs, waking every 200 ms cost 2% of
/// a CPU. The cap only bounds the damage of a wake-up that was missed.
const MAX_SLEEP: Duration = Duration::from_secs(10);
/// The longest an idle device sleeps while it has joined multicast groups: their sockets are
/// polled between waits (the packet driver waits on the main sockets only).
const GROUP_POLL: Duration = Duration::from_millis(2);
/// The device's receive buffer: a received packet with its IP and UDP headers rebuilt in
/// front (and, for the multicast group sockets, the datagram as received).
const RX_BUF_LEN: usize = 64 * 1024;
/// Bytes of packets between local QPs taken from the engines before they are delivered.
const LOCAL_BATCH_BYTES: usize = 256 * 1024;
/// Transmit-and-deliver rounds per pump for packets between local QPs.
const LOCAL_ROUNDS: usize = 4;

/// Messages to a device thread.
pub enum DevMsg {
    Request {
        client: u64,
        pid: i32,
        request: Request,
        fds: Vec<OwnedFd>,
        reply: Sender<(Response, Vec<OwnedFd>)>,
    },
    ClientGone {
        client: u64,
    },
    Stats {
        reply: Sender<Vec<(u64, ClientResources)>>,
    },
    /// The device's addresses changed (`--netdev`): engines created from now on use the new
    /// GID table. (Engines of running clients keep theirs; their QPs' address vectors were
    /// resolved against it.)
    UpdateInfo(DeviceInfo),
    /// A CM MAD from the CM thread: `packet` is BTH..ICRC of a UD SEND_ONLY from QP1; its ICRC
    /// is computed here for the socket's addresses.
    SendGsi {
        src: IpAddr,
        dst: IpAddr,
        packet: Vec<u8>,
    },
    Shutdown,
}

/// A client process's memory as the engine sees it.
pub struct ProcMem(RefCell<ProcessMemory>);

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
    fn settle(&mut self, begin: bool) {
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

type Engine = tp::Engine<ProcMem>;

struct CqState {
    _region: SharedRegion,
    ring: SharedRing,
    channel: Option<u32>,
    generation: u32,
    ctx: u32,
}

struct QpHost {
    _region: SharedRegion,
    sq: SharedRing,
    rq: Option<SharedRing>,
    cap: QpCap,
    send_cq: u32,
    sq_sig_all: bool,
    /// Work the engine could not take yet (its queue was full), in order.
    pending_send: VecDeque<SendWr>,
    pending_recv: VecDeque<RecvWr>,
    ctx: u32,
}

struct SrqState {
    _region: SharedRegion,
    ring: SharedRing,
    max_sge: u32,
    pending: VecDeque<RecvWr>,
    limit: u32,
    max_wr: u32,
    ctx: u32,
}

/// A client's presence on this device.
struct ClientDev {
    pid: i32,
    engine: Engine,
    block: u32,
    /// Context handle -> async event socket (write end).
    contexts: HashMap<u32, OwnedFd>,
    channels: HashMap<u32, OwnedFd>,
    /// PD handle -> (engine PD, the context that allocated it).
    pds: HashMap<u32, (u32, u32)>,
    mrs: HashMap<u32, u32>,
    cqs: HashMap<u32, CqState>,
    qps: HashMap<u32, QpHost>,
    srqs: HashMap<u32, SrqState>,
    ahs: HashMap<u32, u32>,
    mws: std::collections::HashSet<u32>,
    next_handle: u32,
}

impl ClientDev {
    fn handle(&mut self) -> u32 {
        self.next_handle += 1;
        self.next_handle
    }

    fn resources(&self) -> ClientResources {
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

/// Handles given to clients carry the device's index in their top 8 bits, so that the control
/// threads can route a request to the right device thread without a lookup.
pub const HANDLE_DEVICE_SHIFT: u32 = 24;
const HANDLE_MASK: u32 = (1 << HANDLE_DEVICE_SHIFT) - 1;

/// The device a client-visible handle belongs to.
pub fn handle_device(h: u32) -> usize {
    (h >> HANDLE_DEVICE_SHIFT) as usize
}

/// The device thread's state.
pub struct DeviceThread {
    index: u32,
    /// Most QPs and MRs the device holds, over all clients (`max_qp`, `max_mr` in the config).
    max_qp: usize,
    max_mr: usize,
    /// How many devices the daemon serves: device `i` takes the QPN blocks `b` with
    /// `b % devices == i`, so that QPNs are unique across devices (clients name QPs by QPN).
    devices: u32,
    info: DeviceInfo,
    gids: Vec<IpAddr>,
    net: UdpTransport,
    wake: EventFd,
    rx: Receiver<DevMsg>,
    clients: BTreeMap<u64, ClientDev>,
    /// QPN block -> client.
    blocks: HashMap<u32, u64>,
    /// The block handed out last: blocks go round-robin, so that a new client does not get
    /// the QPNs of one that just exited, whose connections may still be in CM timewait on a
    /// peer (a REQ from a QPN the peer still holds is refused as a stale connection, REJ 10;
    /// rxe likewise allocates QPNs cyclically).
    last_block: u32,
    start: Instant,
    rx_buf: Vec<u8>,
    slot: Vec<u8>,
    /// Where packets to QP1 (CM MADs) go: the CM thread ([`crate::cm`]).
    gsi: Option<Sender<crate::cm::GsiMad>>,
    /// Packets between QPs of this device, waiting for delivery.
    local: LocalFrames,
    /// Whether packets between QPs of this device go through the socket (visible to a
    /// capture) instead of `local` (`local_via_socket` in the config).
    local_via_socket: bool,
    /// The IP multicast groups the device's QPs are attached to, with the attachments
    /// (client, QPN): the group is joined while any remains (rxe_mcast_add/rxe_mcast_del).
    groups: HashMap<IpAddr, JoinedGroup>,
    /// Verifies the datagrams the group sockets receive (the main sockets verify their own).
    group_verifier: RxVerifier,
}

/// One multicast group of a device: its socket (`None` where it could not be joined: an IPv6
/// group, or a device bound to the wildcard address; the device's own QPs still get its own
/// multicast sends) and the QPs attached to it.
struct JoinedGroup {
    socket: Option<MulticastGroup>,
    members: BTreeSet<(u64, u32)>,
}

fn err(e: VerbsError) -> Response {
    Response::Error {
        errno: e.errno(),
        message: e.to_string(),
    }
}

fn errno(errno: i32, message: &str) -> Response {
    Response::Error {
        errno,
        message: message.to_string(),
    }
}

fn random_u64() -> u64 {
    // RandomState is seeded from the OS's entropy: keys must not be guessable.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x5352_5845);
    h.finish()
}

/// The GID table entries as addresses (`::ffff:a.b.c.d` becomes IPv4).
pub fn gid_addrs(info: &DeviceInfo) -> Vec<IpAddr> {
    info.gids
        .iter()
        .map(|g| {
            let v6 = Ipv6Addr::from(g.gid);
            match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(v6),
            }
        })
        .collect()
}

fn to_qp_state(v: u32) -> Option<QpState> {
    Some(match v {
        0 => QpState::Reset,
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        4 => QpState::Sqd,
        5 => QpState::Sqe,
        6 => QpState::Err,
        _ => return None,
    })
}

impl DeviceThread {
    /// Opens the device's packet I/O and returns the thread state and its wake descriptor's
    /// duplicate (given to clients as their doorbell).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        index: usize,
        devices: usize,
        cfg: &crate::config::DeviceConfig,
        info: DeviceInfo,
        rx: Receiver<DevMsg>,
        port: u16,
    ) -> anyhow::Result<DeviceThread> {
        let gids = gid_addrs(&info);
        // A device that follows a network interface binds the wildcard addresses, so that
        // addresses the interface gains later are served too; receive then keeps only packets
        // to the device's current GIDs (as rxe checks the destination, facts §4.8). A device of
        // fixed addresses binds its first IPv4 and IPv6 address, so that several daemons can
        // share a host on different loopback addresses.
        let follow = !info.netdevs.is_empty();
        let ipv4 = if follow {
            Some(std::net::Ipv4Addr::UNSPECIFIED)
        } else {
            gids.iter().find_map(|a| match a {
                IpAddr::V4(v4) => Some(*v4),
                _ => None,
            })
        };
        let ipv6 = if follow {
            Some(Ipv6Addr::UNSPECIFIED)
        } else {
            gids.iter().find_map(|a| match a {
                IpAddr::V6(v6) if !v6.is_unicast_link_local() => Some(*v6),
                _ => None,
            })
        };
        let mut net = UdpTransport::open(&NetConfig {
            ipv4,
            ipv6,
            port,
            // One GSO send per run of equal packets of a flow, GRO on receive: a system call
            // per packet caps UDP at ~150k packets/s here. GSO makes the kernel checksum UDP
            // (rxe sends 0; receivers accept both, the ICRC masks it).
            gso: cfg.gso && std::env::var_os("SOFTROCE_NO_GSO").is_none(),
            gro: std::env::var_os("SOFTROCE_NO_GRO").is_none(),
            rx_buffers: 256,
            ..NetConfig::default()
        })
        .map_err(|e| anyhow::anyhow!("device {}: opening UDP port {port}: {e}", info.name))?;
        if let Some(reason) = net.fallback_reason() {
            warn!(device = %info.name, "io_uring unavailable, using system calls: {reason}");
        }
        let wake =
            EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
        net.set_wake_fd(wake.as_raw_fd());
        info!(device = %info.name, backend = ?net.backend(), ?ipv4, ?ipv6, "packet I/O ready");
        Ok(DeviceThread {
            max_qp: cfg.max_qp as usize,
            max_mr: cfg.max_mr as usize,
            index: index as u32,
            devices: devices.max(1) as u32,
            info,
            gids,
            net,
            wake,
            rx,
            clients: BTreeMap::new(),
            blocks: HashMap::new(),
            last_block: 0,
            start: Instant::now(),
            rx_buf: vec![0u8; RX_BUF_LEN],
            slot: vec![0u8; 64 * 1024],
            gsi: None,
            local: LocalFrames::new(),
            local_via_socket: cfg.local_via_socket,
            groups: HashMap::new(),
            group_verifier: RxVerifier::new(),
        })
    }

    /// Hands received CM MADs (packets to QP1) to the CM thread.
    pub fn set_gsi_sink(&mut self, sink: Sender<crate::cm::GsiMad>) {
        self.gsi = Some(sink);
    }

    /// A descriptor that wakes the thread when written (for the doorbell and control).
    pub fn wake_fd(&self) -> std::io::Result<OwnedFd> {
        self.wake.as_fd().try_clone_to_owned()
    }

    fn now(&self) -> tp::Nanos {
        self.start.elapsed().as_nanos() as tp::Nanos
    }

    pub fn run(mut self) {
        raise_priority();
        let mut idle_since = Instant::now();
        let mut spin = AdaptiveSpin::new(SPIN_MIN, SPIN_MAX);
        // When the last piece of work ended, and whether the loop has been idle since.
        let mut last_work = Instant::now();
        let mut idle = true;
        loop {
            let mut busy = false;
            while let Ok(msg) = self.rx.try_recv() {
                busy = true;
                match msg {
                    DevMsg::Shutdown => {
                        info!(device = %self.info.name, counters = ?self.net.counters(), "device stopped");
                        return;
                    }
                    DevMsg::Request {
                        client,
                        pid,
                        request,
                        fds,
                        reply,
                    } => {
                        let (resp, fds) = self.request(client, pid, untag(request), fds);
                        let _ = reply.send((tag(resp, self.index), fds));
                    }
                    DevMsg::ClientGone { client } => self.client_gone(client),
                    DevMsg::SendGsi {
                        src,
                        dst,
                        mut packet,
                    } => {
                        send_gsi(&mut self.net, src, dst, &mut packet);
                        let _ = self.net.flush();
                    }
                    DevMsg::UpdateInfo(info) => {
                        self.gids = gid_addrs(&info);
                        self.info = info;
                    }
                    DevMsg::Stats { reply } => {
                        let _ = reply.send(
                            self.clients
                                .iter()
                                .map(|(id, c)| (*id, c.resources()))
                                .collect(),
                        );
                    }
                }
            }
            busy |= self.pump(Duration::ZERO);
            if busy {
                let now = Instant::now();
                if idle {
                    spin.on_work_after(now - last_work);
                    idle = false;
                }
                (idle_since, last_work) = (now, now);
                continue;
            }
            idle = true;
            if idle_since.elapsed() < spin.budget() {
                // Spinning, but not against the clients: on a small machine the processes
                // that will post the next work (or poll for this work's completion) may
                // share this CPU, and this thread's raised priority would starve them.
                // sched_yield lets them run first and returns at once if none waits.
                idle_yield();
                continue;
            }
            // Sleep: tell every ring, re-check, then block until a packet, a doorbell, a
            // control message or the next timer.
            if self.announce_sleep() || !self.rx.is_empty() {
                self.announce_awake();
                continue;
            }
            let now = self.now();
            let due = self
                .clients
                .values()
                .filter_map(|c| c.engine.poll_timeout())
                .min();
            let timeout = match due {
                Some(t) if t <= now => Duration::ZERO,
                Some(t) => Duration::from_nanos(t - now).min(MAX_SLEEP),
                None => MAX_SLEEP,
            };
            // The group sockets are read by polling, not by the packet driver's wait.
            let timeout = if self.groups.values().any(|g| g.socket.is_some()) {
                timeout.min(GROUP_POLL)
            } else {
                timeout
            };
            self.pump(timeout);
            let _ = self.wake.read();
            self.announce_awake();
            idle_since = Instant::now();
        }
    }

    /// Sets every consumer ring's sleeping flag; true if work slipped in meanwhile.
    fn announce_sleep(&self) -> bool {
        let mut work = false;
        for c in self.clients.values() {
            for q in c.qps.values() {
                work |= q.sq.consumer_prepare_sleep().unwrap_or(false);
                if let Some(rq) = &q.rq {
                    work |= rq.consumer_prepare_sleep().unwrap_or(false);
                }
            }
            for s in c.srqs.values() {
                work |= s.ring.consumer_prepare_sleep().unwrap_or(false);
            }
        }
        work
    }

    fn announce_awake(&self) {
        for c in self.clients.values() {
            for q in c.qps.values() {
                q.sq.consumer_awake();
                if let Some(rq) = &q.rq {
                    rq.consumer_awake();
                }
            }
            for s in c.srqs.values() {
                s.ring.consumer_awake();
            }
        }
    }

    /// One round of the data path; `wait` is how long packet I/O may block. Returns whether
    /// anything happened.
    fn pump(&mut self, wait: Duration) -> bool {
        let mut busy = false;
        let now = self.now();
        let mut broken: Vec<u64> = Vec::new();
        for (&id, c) in self.clients.iter_mut() {
            match contained(|| pump_rings(c, &mut self.slot)) {
                Some(b) => busy |= b,
                None => broken.push(id),
            }
        }
        // Received packets: rebuild the IP and UDP headers the engine wants in front of each
        // verified datagram and hand it to the engine that owns the destination QP. The net
        // layer checked the ICRC (recovering the IPv4 Identification), so the engine does not
        // compute it again.
        let (clients, blocks, rx_buf, gids, gsi, index) = (
            &mut self.clients,
            &self.blocks,
            &mut self.rx_buf,
            &self.gids,
            &self.gsi,
            self.index as usize,
        );
        let mut delivered = 0;
        let _ = self.net.poll(Some(wait), &mut |d: &RxDatagram<'_>| {
            delivered += 1;
            if !gids.contains(&d.dst.ip()) && !d.dst.ip().is_multicast() {
                debug!(dst = %d.dst, "packet for an address that is not one of our GIDs dropped");
                return;
            }
            let Some(len) = rebuild_ip(d, rx_buf) else {
                return;
            };
            let Some(dqpn) = dest_qpn(d.bytes) else {
                return;
            };
            let packet = &rx_buf[..len];
            if dqpn == proto::cm::GSI_QPN {
                // QP1 is the GSI: CM MADs go to the CM thread.
                if let (Some(sink), Some(mad)) = (gsi, crate::cm::gsi_payload(d.bytes)) {
                    let mad = crate::cm::GsiMad {
                        device: index,
                        src: d.src.ip(),
                        dst: d.dst.ip(),
                        mad: mad.to_vec(),
                    };
                    if !crate::cm::deliver_gsi(sink, mad) {
                        debug!(src = %d.src, "CM MAD dropped: the CM thread's queue is full");
                    }
                }
            } else {
                deliver_packet(clients, blocks, now, dqpn, packet, &mut broken);
            }
        });
        busy |= delivered > 0;
        if !self.groups.is_empty() {
            busy |= self.receive_groups(now, &mut broken);
        }
        let now = self.now();
        let index = self.index;
        // Packets between two QPs of this device go from engine to engine (net::LocalFrames,
        // as rxe's loopback). A round stops taking packets once LOCAL_BATCH_BYTES of them
        // wait, delivers them, and goes again, so that the answers and completions they cause
        // leave in the same pump.
        // (frame, offset of its BTH)
        let mut local_mcast: Vec<(Vec<u8>, usize)> = Vec::new();
        let via_socket = self.local_via_socket;
        for round in 0..LOCAL_ROUNDS {
            let (net, gids, local, local_mcast) =
                (&mut self.net, &self.gids, &mut self.local, &mut local_mcast);
            for (&id, c) in self.clients.iter_mut() {
                let outcome = contained(|| {
                    let mut busy = false;
                    if round == 0 && c.engine.poll_timeout().is_some_and(|t| t <= now) {
                        c.engine.handle_timeout(now);
                        busy = true;
                    }
                    c.engine.memory_mut().settle(true);
                    // Work that waited for room in the engine.
                    busy |= retry_pending(c);
                    // Frames are written straight into the local queue; the ones for other
                    // hosts are moved to the socket's send buffer from there.
                    while local.bytes() < LOCAL_BATCH_BYTES {
                        let room = local.reserve(tp::MAX_FRAME_LEN);
                        let Some(t) = c.engine.poll_transmit(now, room) else {
                            break;
                        };
                        busy = true;
                        if !via_socket && gids.contains(&t.dst) {
                            local.commit(t.len, t.transport_offset);
                        } else {
                            if t.dst.is_multicast() {
                                // Kept as the engine framed them for the device's own
                                // attached QPs: the socket bound to a unicast address never
                                // receives a group's datagrams back, while rxe's members on the
                                // sending host get them.
                                if let Some(frame) = room.get(..t.len) {
                                    local_mcast.push((frame.to_vec(), t.transport_offset));
                                }
                            }
                            send_frame(net, room, &t);
                        }
                    }
                    c.engine.memory_mut().settle(false);
                    busy | deliver_completions(c, index)
                });
                match outcome {
                    Some(b) => busy |= b,
                    None => broken.push(id),
                }
            }
            if self.local.is_empty() {
                break;
            }
            busy = true;
            self.deliver_local(now, &mut broken);
        }
        // The receivers' completions go out on the next round.
        busy |= !local_mcast.is_empty();
        for (frame, bth) in &local_mcast {
            if let Some(dqpn) = frame.get(*bth..).and_then(dest_qpn) {
                let (clients, blocks) = (&mut self.clients, &self.blocks);
                deliver_packet(clients, blocks, now, dqpn, frame, &mut broken);
            }
        }
        broken.sort_unstable();
        broken.dedup();
        for id in broken {
            self.client_gone(id);
        }
        if busy {
            let _ = self.net.flush();
        }
        busy
    }

    /// Hands the packets queued between QPs of this device to the engines that own their
    /// destination QPs.
    fn deliver_local(&mut self, now: tp::Nanos, broken: &mut Vec<u64>) {
        let (clients, blocks) = (&mut self.clients, &self.blocks);
        self.local.drain(|dqpn, frame| {
            deliver_packet(clients, blocks, now, dqpn, frame, broken);
        });
    }

    /// Joins `group` on the network for the device's first attachment to it.
    fn group_attach(&mut self, client: u64, qpn: u32, group: IpAddr) {
        // Senders address a group at the RoCE v2 port, whatever port this device serves.
        let port = proto::wire::ROCE_V2_PORT;
        let local = self.gids.iter().copied().find(IpAddr::is_ipv4);
        let name = &self.info.name;
        let joined = self.groups.entry(group).or_insert_with(|| {
            let socket = match local.map(|l| MulticastGroup::join(group, l, port)) {
                Some(Ok(s)) => {
                    info!(device = %name, %group, "multicast group joined");
                    Some(s)
                }
                Some(Err(e)) => {
                    warn!(device = %name, %group, "multicast group not joined on the network: {e}");
                    None
                }
                None => None,
            };
            JoinedGroup {
                socket,
                members: BTreeSet::new(),
            }
        });
        joined.members.insert((client, qpn));
    }

    /// Drops the attachments `gone` selects (of `group`, or of every group) and leaves the
    /// groups that have none left.
    fn group_detach(&mut self, gone: impl Fn((u64, u32)) -> bool, group: Option<IpAddr>) {
        let name = &self.info.name;
        self.groups.retain(|g, joined| {
            if group.is_none_or(|only| only == *g) {
                joined.members.retain(|&m| !gone(m));
            }
            let keep = !joined.members.is_empty();
            if !keep && joined.socket.is_some() {
                info!(device = %name, group = %g, "multicast group left");
            }
            keep
        });
    }

    /// Takes the datagrams the group sockets received from other devices and hands them on
    /// as the main sockets' ([`deliver_packet`]). The device's own sends,
    /// looped back by the kernel, are dropped: its QPs got them from the local path already.
    fn receive_groups(&mut self, now: tp::Nanos, broken: &mut Vec<u64>) -> bool {
        let mut busy = false;
        let (groups, verifier, gids, clients, blocks) = (
            &self.groups,
            &mut self.group_verifier,
            &self.gids,
            &mut self.clients,
            &self.blocks,
        );
        // Datagrams land in the back half of the device's receive buffer and are rebuilt into
        // its front half, rather than in a fresh zeroed buffer on every pump. One byte beyond
        // the longest RoCE packet, so that a longer datagram shows as too long.
        let (rx_buf, back) = self.rx_buf.split_at_mut(RX_BUF_LEN / 2);
        let buf = &mut back[..crate::net::MAX_ROCE_PACKET + 1];
        for socket in groups.values().filter_map(|g| g.socket.as_ref()) {
            while let Some((src, n)) = socket.recv(buf) {
                busy = true;
                if gids.contains(&src.ip()) {
                    continue;
                }
                let Some(bytes) = buf.get(..n) else {
                    continue;
                };
                let dst = socket.group();
                let RxVerdict::Good { ipv4 } = verifier.verify(src, dst, bytes) else {
                    debug!(%src, %dst, "multicast datagram refused by verification");
                    continue;
                };
                let d = RxDatagram {
                    src,
                    dst,
                    tos: 0,
                    bytes,
                    ipv4,
                };
                let (Some(len), Some(dqpn)) = (rebuild_ip(&d, rx_buf), dest_qpn(bytes)) else {
                    continue;
                };
                deliver_packet(clients, blocks, now, dqpn, &rx_buf[..len], broken);
            }
        }
        busy
    }

    fn client_gone(&mut self, client: u64) {
        self.group_detach(|(c, _)| c == client, None);
        if let Some(c) = self.clients.remove(&client) {
            self.blocks.remove(&c.block);
            info!(device = %self.info.name, client, qps = c.qps.len(), mrs = c.mrs.len(),
                  "client's engine destroyed");
            debug!(client, counters = ?c.engine.counters(), memory = ?c.engine.memory().0.borrow().stats(),
                   "engine counters");
        }
    }

    /// The client's engine on this device, created on first use. The error is an errno and a
    /// message for the client.
    fn client(&mut self, client: u64, pid: i32) -> Result<&mut ClientDev, (i32, &'static str)> {
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
            // The ICRC is computed once per packet: by the net layer for the headers the
            // socket writes (send_frame), and never for packets between local QPs, which the
            // receiving engine takes with handle_verified_packet.
            config.seal_icrc = false;
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
                    mws: Default::default(),
                    next_handle: 0,
                },
            );
        }
        self.clients
            .get_mut(&client)
            .ok_or((libc::EIO, "client state lost"))
    }

    fn request(
        &mut self,
        client: u64,
        pid: i32,
        request: Request,
        mut fds: Vec<OwnedFd>,
    ) -> (Response, Vec<OwnedFd>) {
        let name = self.info.name.clone();
        let qps: usize = self.clients.values().map(|c| c.qps.len()).sum();
        let mrs: usize = self.clients.values().map(|c| c.mrs.len()).sum();
        match request {
            Request::CreateQp { .. } if qps >= self.max_qp => {
                return (
                    errno(libc::ENOMEM, "the device's QP limit (max_qp) is reached"),
                    vec![],
                );
            }
            Request::RegMr { .. } if mrs >= self.max_mr => {
                return (
                    errno(libc::ENOMEM, "the device's MR limit (max_mr) is reached"),
                    vec![],
                );
            }
            _ => {}
        }
        let c = match self.client(client, pid) {
            Ok(c) => c,
            Err((code, why)) => return (errno(code, why), vec![]),
        };
        let none = Vec::new();
        let r = match request {
            Request::OpenContext { device } => {
                if device != name {
                    return (errno(libc::ENODEV, "no such device"), none);
                }
                let Some(fd) = fds.pop() else {
                    return (
                        errno(libc::EINVAL, "OpenContext needs the async event socket"),
                        none,
                    );
                };
                let h = c.handle();
                c.contexts.insert(h, fd);
                // The context's doorbell: the shim writes it after posting to a ring whose
                // consumer (this thread) said it sleeps.
                let doorbell = self.wake.as_fd().try_clone_to_owned();
                return match doorbell {
                    Ok(d) => (Response::Context { ctx: h }, vec![d]),
                    Err(e) => (errno(libc::EMFILE, &e.to_string()), none),
                };
            }
            Request::CloseContext { ctx } => match c.contexts.remove(&ctx) {
                Some(_) => Response::Done,
                None => errno(libc::EINVAL, "no such context"),
            },
            Request::AllocPd { ctx } => {
                if !c.contexts.contains_key(&ctx) {
                    return (errno(libc::EINVAL, "no such context"), none);
                }
                let pd = c.engine.alloc_pd();
                let h = c.handle();
                c.pds.insert(h, (pd, ctx));
                Response::Pd { pd: h }
            }
            Request::DeallocPd { pd } => match c.pds.get(&pd).map(|p| p.0) {
                Some(e) => match c.engine.dealloc_pd(e) {
                    Ok(()) => {
                        c.pds.remove(&pd);
                        Response::Done
                    }
                    Err(e) => err(e),
                },
                None => errno(libc::EINVAL, "no such PD"),
            },
            Request::RegMr {
                pd,
                addr,
                length,
                iova,
                access,
            } => {
                let Some(&(epd, _)) = c.pds.get(&pd) else {
                    return (errno(libc::EINVAL, "no such PD"), none);
                };
                if iova != addr {
                    return (
                        errno(
                            libc::EOPNOTSUPP,
                            "MRs with an IOVA other than their address",
                        ),
                        none,
                    );
                }
                if length > 0
                    && c.engine
                        .memory()
                        .0
                        .borrow()
                        .check_mapped(addr, length)
                        .is_err()
                {
                    return (errno(libc::EFAULT, "range not mapped in the process"), none);
                }
                match c.engine.reg_mr(epd, addr, length, Access(access)) {
                    Ok(keys) => {
                        let h = c.handle();
                        c.mrs.insert(h, keys.handle);
                        Response::Mr {
                            mr: h,
                            lkey: keys.lkey.0,
                            rkey: keys.rkey.0,
                        }
                    }
                    Err(e) => err(e),
                }
            }
            Request::DeregMr { mr } => match c.mrs.get(&mr).copied() {
                Some(e) => match c.engine.dereg_mr(e) {
                    Ok(()) => {
                        c.mrs.remove(&mr);
                        Response::Done
                    }
                    Err(e) => err(e),
                },
                None => errno(libc::EINVAL, "no such MR"),
            },
            Request::CreateCompChannel { ctx } => {
                if !c.contexts.contains_key(&ctx) {
                    return (errno(libc::EINVAL, "no such context"), none);
                }
                let Some(fd) = fds.pop() else {
                    return (
                        errno(libc::EINVAL, "a completion channel needs its pipe"),
                        none,
                    );
                };
                let h = c.handle();
                c.channels.insert(h, fd);
                Response::CompChannel { channel: h }
            }
            Request::DestroyCompChannel { channel } => {
                if c.cqs.values().any(|q| q.channel == Some(channel)) {
                    errno(libc::EBUSY, "CQs still use the channel")
                } else if c.channels.remove(&channel).is_some() {
                    Response::Done
                } else {
                    errno(libc::EINVAL, "no such channel")
                }
            }
            Request::CreateCq {
                ctx,
                cqe,
                channel,
                comp_vector: _,
            } => return create_cq(c, ctx, cqe, channel),
            Request::DestroyCq { cq } => {
                if c.qps.values().any(|q| q.send_cq == cq) {
                    return (errno(libc::EBUSY, "QPs still use the CQ"), none);
                }
                match c.engine.destroy_cq(cq) {
                    Ok(()) => {
                        c.cqs.remove(&cq);
                        Response::Done
                    }
                    Err(e) => err(e),
                }
            }
            Request::CreateQp {
                pd,
                qp_type,
                send_cq,
                recv_cq,
                srq,
                cap,
                sq_sig_all,
            } => return create_qp(c, pd, qp_type, send_cq, recv_cq, srq, cap, sq_sig_all),
            Request::ModifyQp { qpn, attr, mask } => modify_qp(c, qpn, &attr, mask),
            Request::QueryQp { qpn, mask: _ } => query_qp(c, qpn),
            Request::DestroyQp { qpn } => {
                if !c.qps.contains_key(&qpn) {
                    return (errno(libc::EINVAL, "no such QP"), none);
                }
                match c.engine.destroy_qp(Qpn::new(qpn)) {
                    Ok(()) => {
                        c.qps.remove(&qpn);
                        // A destroyed QP leaves its groups (rxe detaches it in rxe_qp_destroy).
                        self.group_detach(|m| m == (client, qpn), None);
                        Response::Done
                    }
                    Err(e) => err(e),
                }
            }
            Request::CreateSrq {
                pd,
                max_wr,
                max_sge,
                srq_limit,
            } => return create_srq(c, pd, max_wr, max_sge, srq_limit),
            Request::ModifySrq {
                srq,
                max_wr: _,
                srq_limit,
                mask,
            } => {
                // IBV_SRQ_MAX_WR (1): resizing is not supported; IBV_SRQ_LIMIT (2) arms.
                if mask & 1 != 0 {
                    errno(libc::EOPNOTSUPP, "SRQ resize")
                } else if mask & 2 != 0 {
                    match c.engine.arm_srq_limit(srq, srq_limit) {
                        Ok(()) => {
                            if let Some(s) = c.srqs.get_mut(&srq) {
                                s.limit = srq_limit;
                            }
                            Response::Done
                        }
                        Err(e) => err(e),
                    }
                } else {
                    Response::Done
                }
            }
            Request::QuerySrq { srq } => match c.srqs.get(&srq) {
                Some(s) => Response::SrqAttr {
                    max_wr: s.max_wr,
                    max_sge: s.max_sge,
                    srq_limit: s.limit,
                },
                None => errno(libc::EINVAL, "no such SRQ"),
            },
            Request::DestroySrq { srq } => match c.engine.destroy_srq(srq) {
                Ok(()) => {
                    c.srqs.remove(&srq);
                    Response::Done
                }
                Err(e) => err(e),
            },
            Request::CreateAh { pd, attr } => {
                let Some(&(epd, _)) = c.pds.get(&pd) else {
                    return (errno(libc::EINVAL, "no such PD"), none);
                };
                match c.engine.create_ah(epd, address_vector(&attr)) {
                    Ok(ah) => {
                        c.ahs.insert(ah, epd);
                        Response::Ah { ah }
                    }
                    Err(e) => err(e),
                }
            }
            Request::DestroyAh { ah } => match c.engine.destroy_ah(ah) {
                Ok(()) => {
                    c.ahs.remove(&ah);
                    Response::Done
                }
                Err(e) => err(e),
            },
            Request::AttachMcast { qpn, gid } => {
                match c.engine.attach_mcast(Qpn::new(qpn), gid_ip(gid)) {
                    Ok(()) => {
                        self.group_attach(client, qpn, gid_ip(gid));
                        Response::Done
                    }
                    Err(e) => err(e),
                }
            }
            Request::DetachMcast { qpn, gid } => {
                match c.engine.detach_mcast(Qpn::new(qpn), gid_ip(gid)) {
                    Ok(()) => {
                        self.group_detach(|m| m == (client, qpn), Some(gid_ip(gid)));
                        Response::Done
                    }
                    Err(e) => err(e),
                }
            }
            Request::AllocMw { pd, mw_type } => {
                let Some(&(epd, _)) = c.pds.get(&pd) else {
                    return (errno(libc::EINVAL, "no such PD"), none);
                };
                let ty = match mw_type {
                    1 => tp::MwType::Type1,
                    2 => tp::MwType::Type2,
                    _ => return (errno(libc::EINVAL, "memory window type"), none),
                };
                match c.engine.alloc_mw(epd, ty) {
                    Ok((mw, rkey)) => {
                        c.mws.insert(mw);
                        Response::Mw { mw, rkey: rkey.0 }
                    }
                    Err(e) => err(e),
                }
            }
            Request::DeallocMw { mw } => match c.engine.dealloc_mw(mw) {
                Ok(()) => {
                    c.mws.remove(&mw);
                    Response::Done
                }
                Err(e) => err(e),
            },
            _ => errno(libc::EINVAL, "not a device request"),
        };
        (r, none)
    }
}

/// Applications busy-poll their completion queues, and on a small machine they compete with the
/// device thread for the CPUs: a device thread that waits a whole time slice behind a spinning
/// application adds milliseconds to every round trip. A higher scheduling weight lets it run as
/// soon as it wakes. Without the privilege to raise it (not root), nothing changes.
fn raise_priority() {
    // SAFETY: plain system calls on this thread's own id; no memory is passed.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, -10);
    }
}

/// Gives the CPU to whoever waits for it while the loop spins for more work (see `run`).
fn idle_yield() {
    // SAFETY: no arguments; sched_yield cannot fail on Linux.
    unsafe {
        libc::sched_yield();
    }
}

/// Runs one piece of a client's work, containing a panic (an engine bug met by some packet or
/// work request): the device thread serves every client and must not die with one. `None`
/// means it panicked; the caller then drops that client's engine, whose state can no longer be
/// trusted.
fn contained<T>(f: impl FnOnce() -> T) -> Option<T> {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).ok();
    if r.is_none() {
        tracing::error!("the engine panicked; that client's resources are dropped");
    }
    r
}

fn guarded(engine: &mut Engine, f: impl FnOnce(&mut Engine)) -> bool {
    contained(|| f(engine)).is_some()
}

/// The destination QPN in a BTH (bytes 5..8).
fn dest_qpn(bth: &[u8]) -> Option<u32> {
    bth.get(5..8)
        .map(|b| u32::from_be_bytes([0, b[0], b[1], b[2]]))
}

/// Hands a verified packet (IP header onward) to the engine that owns its destination QP or,
/// for the multicast QPN, to every engine (each delivers to its own QPs attached to the
/// group, as rxe_rcv_mcast_pkt). Clients whose engine panicked are added to `broken`.
fn deliver_packet(
    clients: &mut BTreeMap<u64, ClientDev>,
    blocks: &HashMap<u32, u64>,
    now: tp::Nanos,
    dqpn: u32,
    packet: &[u8],
    broken: &mut Vec<u64>,
) {
    let mut handle = |id: u64, c: &mut ClientDev| {
        if !guarded(&mut c.engine, |e| e.handle_verified_packet(now, packet)) {
            broken.push(id);
        }
    };
    if dqpn == Qpn::MULTICAST.value() {
        for (&id, c) in clients.iter_mut() {
            handle(id, c);
        }
    } else if let Some((&id, c)) = blocks
        .get(&(dqpn / QPN_BLOCK))
        .and_then(|id| clients.get_mut(id).map(|c| (id, c)))
    {
        handle(id, c);
    } else {
        debug!(qpn = dqpn, "packet for an unknown QP dropped");
    }
}

/// Strips the device index from every handle in a request.
fn untag(r: Request) -> Request {
    let m = |h: u32| h & HANDLE_MASK;
    match r {
        Request::CloseContext { ctx } => Request::CloseContext { ctx: m(ctx) },
        Request::AllocPd { ctx } => Request::AllocPd { ctx: m(ctx) },
        Request::DeallocPd { pd } => Request::DeallocPd { pd: m(pd) },
        Request::RegMr {
            pd,
            addr,
            length,
            iova,
            access,
        } => Request::RegMr {
            pd: m(pd),
            addr,
            length,
            iova,
            access,
        },
        Request::DeregMr { mr } => Request::DeregMr { mr: m(mr) },
        Request::CreateCompChannel { ctx } => Request::CreateCompChannel { ctx: m(ctx) },
        Request::DestroyCompChannel { channel } => Request::DestroyCompChannel {
            channel: m(channel),
        },
        Request::CreateCq {
            ctx,
            cqe,
            channel,
            comp_vector,
        } => Request::CreateCq {
            ctx: m(ctx),
            cqe,
            channel: channel.map(m),
            comp_vector,
        },
        Request::DestroyCq { cq } => Request::DestroyCq { cq: m(cq) },
        Request::CreateQp {
            pd,
            qp_type,
            send_cq,
            recv_cq,
            srq,
            cap,
            sq_sig_all,
        } => Request::CreateQp {
            pd: m(pd),
            qp_type,
            send_cq: m(send_cq),
            recv_cq: m(recv_cq),
            srq: srq.map(m),
            cap,
            sq_sig_all,
        },
        Request::CreateSrq {
            pd,
            max_wr,
            max_sge,
            srq_limit,
        } => Request::CreateSrq {
            pd: m(pd),
            max_wr,
            max_sge,
            srq_limit,
        },
        Request::ModifySrq {
            srq,
            max_wr,
            srq_limit,
            mask,
        } => Request::ModifySrq {
            srq: m(srq),
            max_wr,
            srq_limit,
            mask,
        },
        Request::QuerySrq { srq } => Request::QuerySrq { srq: m(srq) },
        Request::DestroySrq { srq } => Request::DestroySrq { srq: m(srq) },
        Request::CreateAh { pd, attr } => Request::CreateAh { pd: m(pd), attr },
        Request::DestroyAh { ah } => Request::DestroyAh { ah: m(ah) },
        Request::AllocMw { pd, mw_type } => Request::AllocMw { pd: m(pd), mw_type },
        Request::DeallocMw { mw } => Request::DeallocMw { mw: m(mw) },
        other => other,
    }
}

/// Adds the device index to every handle in a response.
fn tag(r: Response, index: u32) -> Response {
    let t = |h: u32| (index << HANDLE_DEVICE_SHIFT) | h;
    match r {
        Response::Context { ctx } => Response::Context { ctx: t(ctx) },
        Response::Pd { pd } => Response::Pd { pd: t(pd) },
        Response::Mr { mr, lkey, rkey } => Response::Mr {
            mr: t(mr),
            lkey,
            rkey,
        },
        Response::CompChannel { channel } => Response::CompChannel {
            channel: t(channel),
        },
        Response::Cq {
            cq,
            cqe,
            ring,
            region_len,
        } => Response::Cq {
            cq: t(cq),
            cqe,
            ring,
            region_len,
        },
        Response::Srq {
            srq,
            max_wr,
            max_sge,
            ring,
            region_len,
        } => Response::Srq {
            srq: t(srq),
            max_wr,
            max_sge,
            ring,
            region_len,
        },
        Response::Ah { ah } => Response::Ah { ah: t(ah) },
        Response::Mw { mw, rkey } => Response::Mw { mw: t(mw), rkey },
        other => other,
    }
}

fn gid_ip(gid: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(gid);
    v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
}

fn address_vector(a: &ctl::AhAttr) -> AddressVector {
    AddressVector {
        dgid: gid_ip(a.dgid),
        sgid_index: a.sgid_index,
        hop_limit: a.hop_limit,
        traffic_class: a.traffic_class,
        flow_label: a.flow_label,
    }
}

/// Allocates a sealed memfd holding `geometries` back to back; returns it and where each ring
/// is.
fn rings(
    name: &str,
    geometries: &[RingGeometry],
) -> anyhow::Result<(SharedRegion, Vec<(SharedRing, RingPlace)>)> {
    let mut offsets = Vec::new();
    let mut at = 0usize;
    for g in geometries {
        offsets.push(at);
        at += g.byte_len().next_multiple_of(4096);
    }
    let region = SharedRegion::create(name, at.max(4096))?;
    let mut out = Vec::new();
    for (g, off) in geometries.iter().zip(offsets) {
        let ring = region.init_ring(off, *g)?;
        out.push((
            ring,
            RingPlace {
                offset: off as u64,
                slot_size: g.slot_size,
                slot_count: g.slot_count,
            },
        ));
    }
    Ok((region, out))
}

/// The region's descriptor, for the client; the daemon keeps only its mapping.
fn give_fd(region: &mut SharedRegion) -> Vec<OwnedFd> {
    region.take_fd().into_iter().collect()
}

fn create_cq(
    c: &mut ClientDev,
    ctx: u32,
    cqe: u32,
    channel: Option<u32>,
) -> (Response, Vec<OwnedFd>) {
    if !c.contexts.contains_key(&ctx) {
        return (errno(libc::EINVAL, "no such context"), vec![]);
    }
    if channel.is_some_and(|ch| !c.channels.contains_key(&ch)) {
        return (errno(libc::EINVAL, "no such completion channel"), vec![]);
    }
    if cqe == 0 || cqe > 1 << 20 {
        return (errno(libc::EINVAL, "cqe out of range"), vec![]);
    }
    let Some(g) = RingGeometry::new(cqe + 1, wqe::CQE_SLOT_LEN as u32) else {
        return (errno(libc::EINVAL, "cqe out of range"), vec![]);
    };
    // The engine's depth is the granted one (`slot_count - 1`, reported as `cqe`): asking
    // for the ring's power-of-two slot count would exceed max_cqe (32767) for cqe = max_cqe.
    let cq = match c.engine.create_cq(g.slot_count as usize - 1) {
        Ok(h) => h,
        Err(e) => return (err(e), vec![]),
    };
    match rings("cq", &[g]) {
        Ok((mut region, mut r)) => {
            let (ring, place) = r.remove(0);
            let fds = give_fd(&mut region);
            let region_len = region.len() as u64;
            c.cqs.insert(
                cq,
                CqState {
                    _region: region,
                    ring,
                    channel,
                    generation: 0,
                    ctx,
                },
            );
            (
                Response::Cq {
                    cq,
                    cqe: g.slot_count - 1,
                    ring: place,
                    region_len,
                },
                fds,
            )
        }
        Err(e) => {
            let _ = c.engine.destroy_cq(cq);
            (errno(libc::ENOMEM, &format!("{e:#}")), vec![])
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn create_qp(
    c: &mut ClientDev,
    pd: u32,
    qp_type: u32,
    send_cq: u32,
    recv_cq: u32,
    srq: Option<u32>,
    cap: ctl::QpCap,
    sq_sig_all: bool,
) -> (Response, Vec<OwnedFd>) {
    let Some(&(epd, _)) = c.pds.get(&pd) else {
        return (errno(libc::EINVAL, "no such PD"), vec![]);
    };
    let qp_type = match qp_type {
        ctl::qp_type::RC => QpType::Rc,
        ctl::qp_type::UC => QpType::Uc,
        ctl::qp_type::UD => QpType::Ud,
        _ => {
            return (
                errno(libc::EOPNOTSUPP, "QP type not supported (XRC, raw packet)"),
                vec![],
            )
        }
    };
    let Some(ctx) = c.cqs.get(&send_cq).map(|q| q.ctx) else {
        return (errno(libc::EINVAL, "no such send CQ"), vec![]);
    };
    if !c.cqs.contains_key(&recv_cq) || srq.is_some_and(|s| !c.srqs.contains_key(&s)) {
        return (errno(libc::EINVAL, "no such CQ or SRQ"), vec![]);
    }
    // Grant at least what was asked, rounded to the rings' power-of-two depth.
    if cap.max_inline_data > 512 {
        return (errno(libc::EINVAL, "max_inline_data above 512"), vec![]);
    }
    let max_inline = cap.max_inline_data.clamp(64, 512);
    // Checked before the slot sizes are computed from them: a client's huge SGE count would
    // overflow `sge * 16`.
    if cap.max_send_sge > wqe::MAX_SGE as u32 || cap.max_recv_sge > wqe::MAX_SGE as u32 {
        return (errno(libc::EINVAL, "too many SGEs"), vec![]);
    }
    let send_slot = wqe::SEND_HEADER_LEN as u32 + (cap.max_send_sge.max(1) * 16).max(max_inline);
    let recv_slot = wqe::RECV_HEADER_LEN as u32 + cap.max_recv_sge.max(1) * 16;
    let (Some(sg), Some(rg)) = (
        RingGeometry::new(cap.max_send_wr.max(1), send_slot),
        RingGeometry::new(cap.max_recv_wr.max(1), recv_slot),
    ) else {
        return (errno(libc::EINVAL, "QP capacity"), vec![]);
    };
    let granted = ctl::QpCap {
        max_send_wr: sg.slot_count,
        max_recv_wr: if srq.is_some() { 0 } else { rg.slot_count },
        max_send_sge: cap.max_send_sge.max(1),
        max_recv_sge: cap.max_recv_sge.max(1),
        max_inline_data: max_inline,
    };
    if granted.max_send_sge > wqe::MAX_SGE as u32 || granted.max_recv_sge > wqe::MAX_SGE as u32 {
        return (errno(libc::EINVAL, "too many SGEs"), vec![]);
    }
    let init = QpInit {
        pd: epd,
        qp_type,
        send_cq,
        recv_cq,
        srq,
        cap: QpCap {
            max_send_wr: granted.max_send_wr,
            max_recv_wr: granted.max_recv_wr.max(1),
            max_send_sge: granted.max_send_sge,
            max_recv_sge: granted.max_recv_sge,
            max_inline_data: granted.max_inline_data,
        },
        sq_sig_all,
    };
    let qpn = match c.engine.create_qp(init) {
        Ok(q) => q,
        Err(e) => return (err(e), vec![]),
    };
    let geometries: Vec<RingGeometry> = if srq.is_some() {
        vec![sg]
    } else {
        vec![sg, rg]
    };
    match rings("qp", &geometries) {
        Ok((mut region, mut r)) => {
            let (sq, sq_place) = r.remove(0);
            let (rq, rq_place) = match r.pop() {
                Some((ring, place)) => (Some(ring), Some(place)),
                None => (None, None),
            };
            let fds = give_fd(&mut region);
            let region_len = region.len() as u64;
            c.qps.insert(
                qpn.value(),
                QpHost {
                    _region: region,
                    sq,
                    rq,
                    cap: init.cap,
                    send_cq,
                    sq_sig_all,
                    pending_send: VecDeque::new(),
                    pending_recv: VecDeque::new(),
                    ctx,
                },
            );
            (
                Response::Qp {
                    qpn: qpn.value(),
                    cap: granted,
                    sq: sq_place,
                    rq: rq_place,
                    region_len,
                },
                fds,
            )
        }
        Err(e) => {
            let _ = c.engine.destroy_qp(qpn);
            (errno(libc::ENOMEM, &format!("{e:#}")), vec![])
        }
    }
}

fn create_srq(
    c: &mut ClientDev,
    pd: u32,
    max_wr: u32,
    max_sge: u32,
    limit: u32,
) -> (Response, Vec<OwnedFd>) {
    let Some(&(epd, pd_ctx)) = c.pds.get(&pd) else {
        return (errno(libc::EINVAL, "no such PD"), vec![]);
    };
    // SRQ events go to the context the SRQ was made in: its PD's.
    let ctx = pd_ctx;
    let max_sge = max_sge.max(1);
    // Checked first: a client's huge SGE count would overflow `max_sge * 16`.
    if max_sge > wqe::MAX_SGE as u32 {
        return (errno(libc::EINVAL, "too many SGEs"), vec![]);
    }
    let Some(g) = RingGeometry::new(max_wr.max(1), wqe::RECV_HEADER_LEN as u32 + max_sge * 16)
    else {
        return (errno(libc::EINVAL, "SRQ capacity"), vec![]);
    };
    let srq = match c.engine.create_srq(epd, g.slot_count, max_sge) {
        Ok(s) => s,
        Err(e) => return (err(e), vec![]),
    };
    if limit > 0 {
        let _ = c.engine.arm_srq_limit(srq, limit);
    }
    match rings("srq", &[g]) {
        Ok((mut region, mut r)) => {
            let (ring, place) = r.remove(0);
            let fds = give_fd(&mut region);
            let region_len = region.len() as u64;
            c.srqs.insert(
                srq,
                SrqState {
                    _region: region,
                    ring,
                    max_sge,
                    pending: VecDeque::new(),
                    limit,
                    max_wr: g.slot_count,
                    ctx,
                },
            );
            (
                Response::Srq {
                    srq,
                    max_wr: g.slot_count,
                    max_sge,
                    ring: place,
                    region_len,
                },
                fds,
            )
        }
        Err(e) => {
            let _ = c.engine.destroy_srq(srq);
            (errno(libc::ENOMEM, &format!("{e:#}")), vec![])
        }
    }
}

fn modify_qp(c: &mut ClientDev, qpn: u32, a: &ctl::QpAttr, mask: u32) -> Response {
    if !c.qps.contains_key(&qpn) {
        return errno(libc::EINVAL, "no such QP");
    }
    let state = |v| to_qp_state(v).ok_or(VerbsError::Invalid("QP state"));
    let m = AttrMask(mask);
    let attr = (|| -> Result<tp::QpAttr, VerbsError> {
        Ok(tp::QpAttr {
            qp_state: if m.contains(AttrMask::STATE) {
                state(a.qp_state)?
            } else {
                QpState::Reset
            },
            cur_qp_state: if m.contains(AttrMask::CUR_STATE) {
                state(a.cur_qp_state)?
            } else {
                QpState::Reset
            },
            path_mtu: if m.contains(AttrMask::PATH_MTU) {
                Mtu::from_enum(a.path_mtu).ok_or(VerbsError::Invalid("path MTU"))?
            } else {
                Mtu::Mtu1024
            },
            qkey: Qkey(a.qkey),
            rq_psn: Psn::new(a.rq_psn),
            sq_psn: Psn::new(a.sq_psn),
            dest_qp_num: Qpn::new(a.dest_qp_num),
            qp_access_flags: Access(a.qp_access_flags),
            ah_attr: if m.contains(AttrMask::AV) {
                if !a.ah_attr.is_global {
                    // RoCE needs a GRH: the GID is the IP address (IBTA A17.4).
                    return Err(VerbsError::Invalid(
                        "RoCE address vectors need a GRH (is_global)",
                    ));
                }
                Some(address_vector(&a.ah_attr))
            } else {
                None
            },
            pkey_index: a.pkey_index,
            en_sqd_async_notify: a.en_sqd_async_notify != 0,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            port_num: a.port_num,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
        })
    })();
    match attr.and_then(|attr| c.engine.modify_qp(Qpn::new(qpn), &attr, m)) {
        Ok(()) => Response::Done,
        Err(e) => err(e),
    }
}

fn query_qp(c: &mut ClientDev, qpn: u32) -> Response {
    let Some(q) = c.qps.get(&qpn) else {
        return errno(libc::EINVAL, "no such QP");
    };
    let (cap, sq_sig_all) = (q.cap, q.sq_sig_all);
    match c.engine.query_qp(Qpn::new(qpn)) {
        Ok((state, a)) => {
            let av = a
                .ah_attr
                .unwrap_or(AddressVector::new(IpAddr::V4([0, 0, 0, 0].into())));
            Response::QpAttr {
                attr: ctl::QpAttr {
                    qp_state: state as u32,
                    cur_qp_state: state as u32,
                    path_mtu: a.path_mtu as u32,
                    qkey: a.qkey.0,
                    rq_psn: a.rq_psn.value(),
                    sq_psn: a.sq_psn.value(),
                    dest_qp_num: a.dest_qp_num.value(),
                    qp_access_flags: a.qp_access_flags.0,
                    ah_attr: ctl::AhAttr {
                        dgid: ctl::gid_of(av.dgid),
                        flow_label: av.flow_label,
                        sgid_index: av.sgid_index,
                        hop_limit: av.hop_limit,
                        traffic_class: av.traffic_class,
                        is_global: a.ah_attr.is_some(),
                        port_num: 1,
                        ..Default::default()
                    },
                    max_rd_atomic: a.max_rd_atomic,
                    max_dest_rd_atomic: a.max_dest_rd_atomic,
                    min_rnr_timer: a.min_rnr_timer,
                    port_num: 1,
                    timeout: a.timeout,
                    retry_cnt: a.retry_cnt,
                    rnr_retry: a.rnr_retry,
                    ..Default::default()
                },
                cap: ctl::QpCap {
                    max_send_wr: cap.max_send_wr,
                    max_recv_wr: cap.max_recv_wr,
                    max_send_sge: cap.max_send_sge,
                    max_recv_sge: cap.max_recv_sge,
                    max_inline_data: cap.max_inline_data,
                },
                sq_sig_all,
            }
        }
        Err(e) => err(e),
    }
}

/// Converts a decoded send WQE into the engine's work request.
fn send_wr(w: &SendWqe<'_>) -> Result<SendWr, &'static str> {
    let remote = RemoteAddr {
        va: w.remote_addr,
        rkey: w.rkey,
    };
    let op = match w.opcode {
        WrOpcode::Send => SendOp::Send,
        // `ibv_send_wr.imm_data` is __be32: the slot holds the bytes the application stored,
        // which go on the wire as they are; the engine's immediate is the ImmDt field's
        // big-endian value. (Softroce to softroce the two swaps cancelled out; kernel rxe read
        // udaddy's QPN from the immediate swapped and answered the wrong QP.)
        WrOpcode::SendWithImm => SendOp::SendWithImm(u32::from_be(w.imm_or_inv)),
        WrOpcode::SendWithInv => SendOp::SendWithInv(Rkey(w.imm_or_inv)),
        WrOpcode::RdmaWrite => SendOp::Write(remote),
        WrOpcode::RdmaWriteWithImm => SendOp::WriteWithImm(remote, u32::from_be(w.imm_or_inv)),
        WrOpcode::RdmaRead => SendOp::Read(remote),
        WrOpcode::AtomicCmpAndSwp => SendOp::CompareSwap {
            remote,
            compare: w.compare_add,
            swap: w.swap,
        },
        WrOpcode::AtomicFetchAndAdd => SendOp::FetchAdd {
            remote,
            add: w.compare_add,
        },
        WrOpcode::AtomicWrite => SendOp::AtomicWrite {
            remote,
            value: w.compare_add,
        },
        WrOpcode::Flush => SendOp::Flush {
            remote,
            len: w.compare_add as u32,
            placement: w.swap as u8,
        },
        WrOpcode::LocalInv => SendOp::LocalInv(Rkey(w.imm_or_inv)),
        WrOpcode::BindMw => {
            let b = w.bind.ok_or("bind without its arguments")?;
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
    let (sg_list, inline_data) = match w.data {
        SendData::Sges(s) => (s.to_vec(), Vec::new()),
        SendData::Inline(d) => (Vec::new(), d.to_vec()),
    };
    Ok(SendWr {
        wr_id: w.wr_id,
        op,
        sg_list,
        inline_data,
        flags: SendFlags(w.flags & wqe::send_flags::ALL),
        ud: w.ud.map(|u| UdDest {
            // The shim names the AH by the handle it was given, which carries the device index.
            ah: u.ah & HANDLE_MASK,
            ..u
        }),
    })
}

fn recv_wr(w: &RecvWqe<'_>) -> RecvWr {
    RecvWr {
        wr_id: w.wr_id,
        sg_list: w.sges.to_vec(),
    }
}

/// A completion with an error status for a work request the engine refused at post time.
fn refused(wr_id: u64, qpn: u32, opcode: u32) -> Cqe {
    Cqe {
        wr_id,
        status: tp::WcStatus::LocQpOpErr as u32,
        opcode,
        qp_num: qpn,
        ..Cqe::default()
    }
}

/// Moves posted work from the rings into the engine. Returns whether any was found.
fn pump_rings(c: &mut ClientDev, slot: &mut [u8]) -> bool {
    let mut busy = false;
    let mut sges = [wqe::Sge::default(); wqe::MAX_SGE];
    let mut refusals: Vec<(u32, Cqe)> = Vec::new();
    for (&qpn, q) in c.qps.iter_mut() {
        // Stop taking from the ring while earlier work still waits for the engine.
        while q.pending_send.is_empty() {
            match q.sq.pop(slot) {
                Ok(true) => {}
                _ => break,
            }
            busy = true;
            let decoded = SendWqe::decode(
                slot,
                q.cap.max_send_sge as usize,
                q.cap.max_inline_data as usize,
                &mut sges,
            );
            match decoded
                .map_err(|_| "malformed")
                .and_then(|w| send_wr(&w).map_err(|_| "unsupported"))
            {
                // The engine keeps the request itself (no copy) unless its queue is full.
                Ok(wr) if c.engine.sq_room(Qpn::new(qpn)) == Some(0) => {
                    q.pending_send.push_back(wr)
                }
                Ok(wr) => {
                    let (wr_id, opcode) = (wr.wr_id, wr.op.wc_opcode() as u32);
                    if let Err(e) = c.engine.post_send(Qpn::new(qpn), wr) {
                        debug!(qpn, "send refused: {e}");
                        refusals.push((q.send_cq, refused(wr_id, qpn, opcode)));
                    }
                }
                Err(why) => {
                    let wr_id = u64::from_ne_bytes(slot[..8].try_into().unwrap_or([0; 8]));
                    debug!(qpn, "send WQE {why}");
                    refusals.push((q.send_cq, refused(wr_id, qpn, 0)));
                }
            }
        }
        if let Some(rq) = &mut q.rq {
            while q.pending_recv.is_empty() {
                match rq.pop(slot) {
                    Ok(true) => {}
                    _ => break,
                }
                busy = true;
                let Ok(w) = RecvWqe::decode(slot, q.cap.max_recv_sge as usize, &mut sges) else {
                    continue;
                };
                let wr = recv_wr(&w);
                match c.engine.post_recv(Qpn::new(qpn), wr.clone()) {
                    Ok(()) => {}
                    Err(VerbsError::NoResources(_)) => q.pending_recv.push_back(wr),
                    Err(e) => debug!(qpn, "receive refused: {e}"),
                }
            }
        }
    }
    for (&h, s) in c.srqs.iter_mut() {
        while s.pending.is_empty() {
            match s.ring.pop(slot) {
                Ok(true) => {}
                _ => break,
            }
            busy = true;
            let Ok(w) = RecvWqe::decode(slot, s.max_sge as usize, &mut sges) else {
                continue;
            };
            let wr = recv_wr(&w);
            match c.engine.post_srq_recv(h, wr.clone()) {
                Ok(()) => {}
                Err(VerbsError::NoResources(_)) => s.pending.push_back(wr),
                Err(e) => debug!(srq = h, "SRQ receive refused: {e}"),
            }
        }
    }
    push_refusals(c, refusals);
    busy
}

/// Completes refused send requests with an error in their CQ (`(cq, cqe)` pairs).
fn push_refusals(c: &mut ClientDev, refusals: Vec<(u32, Cqe)>) {
    for (cq, cqe) in refusals {
        if let Some(q) = c.cqs.get_mut(&cq) {
            let mut b = [0u8; wqe::CQE_SLOT_LEN];
            cqe.encode(&mut b);
            let _ = q.ring.push(&b);
        }
    }
}

fn retry_pending(c: &mut ClientDev) -> bool {
    let mut busy = false;
    let mut refusals: Vec<(u32, Cqe)> = Vec::new();
    for (&qpn, q) in c.qps.iter_mut() {
        while c.engine.sq_room(Qpn::new(qpn)).is_some_and(|r| r > 0) {
            let Some(wr) = q.pending_send.pop_front() else {
                break;
            };
            busy = true;
            // Refused as it would have been had it found room at once (pump_rings): the
            // program must get a completion for it.
            let (wr_id, opcode) = (wr.wr_id, wr.op.wc_opcode() as u32);
            if let Err(e) = c.engine.post_send(Qpn::new(qpn), wr) {
                debug!(qpn, "send refused: {e}");
                refusals.push((q.send_cq, refused(wr_id, qpn, opcode)));
            }
        }
        while let Some(wr) = q.pending_recv.front() {
            match c.engine.post_recv(Qpn::new(qpn), wr.clone()) {
                Err(VerbsError::NoResources(_)) => break,
                _ => {
                    q.pending_recv.pop_front();
                    busy = true;
                }
            }
        }
    }
    for (&h, s) in c.srqs.iter_mut() {
        while let Some(wr) = s.pending.front() {
            match c.engine.post_srq_recv(h, wr.clone()) {
                Err(VerbsError::NoResources(_)) => break,
                _ => {
                    s.pending.pop_front();
                    busy = true;
                }
            }
        }
    }
    push_refusals(c, refusals);
    busy
}

fn cqe_of(wc: &WorkCompletion) -> Cqe {
    Cqe {
        wr_id: wc.wr_id,
        status: wc.status as u32,
        opcode: wc.opcode as u32,
        vendor_err: 0,
        byte_len: wc.byte_len,
        // `ibv_wc.imm_data` is `__be32`: the wire's ImmDt bytes as they arrived (the
        // engine holds them as a host value), as rxe copies them.
        imm_or_inv: if wc.wc_flags.contains(tp::WcFlags::WITH_INV) {
            wc.invalidated_rkey
        } else {
            // Back to the wire's byte order: `ibv_wc.imm_data` is __be32.
            wc.imm_data.to_be()
        },
        qp_num: wc.qp_num.value(),
        src_qp: wc.src_qp.value(),
        wc_flags: wc.wc_flags.0,
        pkey_index: 0,
        slid: 0,
        sl: 0,
        dlid_path_bits: 0,
    }
}

/// Moves completions from the engine's CQs into the shared rings, fires completion events of
/// armed CQs, and forwards async events. Returns whether anything moved.
fn deliver_completions(c: &mut ClientDev, index: u32) -> bool {
    let tag = |h: u32| (index << HANDLE_DEVICE_SHIFT) | h;
    let mut busy = false;
    let mut b = [0u8; wqe::CQE_SLOT_LEN];
    for (&h, q) in c.cqs.iter_mut() {
        let mut fire = false;
        while q.ring.free().unwrap_or(0) > 0 {
            let Some(wc) = c.engine.poll_cq(h) else { break };
            busy = true;
            cqe_of(&wc).encode(&mut b);
            let _ = q.ring.push(&b);
            fire |= q
                .ring
                .take_arm(wc.solicited || wc.status != tp::WcStatus::Success);
        }
        if fire {
            if let Some(fd) = q.channel.and_then(|ch| c.channels.get(&ch)) {
                q.generation = q.generation.wrapping_add(1);
                let mut rec = [0u8; 8];
                rec[..4].copy_from_slice(&tag(h).to_ne_bytes());
                rec[4..].copy_from_slice(&q.generation.to_ne_bytes());
                let _ = nix::unistd::write(fd, &rec);
            }
        }
    }
    while let Some(ev) = c.engine.poll_event() {
        busy = true;
        // `enum ibv_event_type` values (verbs.h: SQ_DRAINED 5, SRQ_LIMIT_REACHED 15,
        // QP_LAST_WQE_REACHED 16).
        // A QP event names the QP by its number; CQ and SRQ events by the client's handle.
        let qp_event = |qpn: Qpn, ty: u32| {
            let ctx = c.qps.get(&qpn.value()).map(|q| q.ctx);
            (u64::from(qpn.value()), ty, ctx)
        };
        let (element, ty, ctx) = match ev {
            AsyncEvent::CqError { cq } => (u64::from(tag(cq)), 0u32, c.cqs.get(&cq).map(|q| q.ctx)),
            AsyncEvent::QpFatal { qpn } => qp_event(qpn, 1),
            AsyncEvent::QpRequestError { qpn } => qp_event(qpn, 2),
            AsyncEvent::QpAccessError { qpn } => qp_event(qpn, 3),
            AsyncEvent::SqDrained { qpn } => qp_event(qpn, 5),
            AsyncEvent::LastWqeReached { qpn } => qp_event(qpn, 16),
            AsyncEvent::SrqLimitReached { srq } => {
                (u64::from(tag(srq)), 15, c.srqs.get(&srq).map(|s| s.ctx))
            }
            // Completion notifications travel through the rings' arm word instead.
            AsyncEvent::CqNotify { .. } => continue,
        };
        if let Some(fd) = ctx.and_then(|x| c.contexts.get(&x)) {
            let mut rec = [0u8; 16];
            rec[..8].copy_from_slice(&element.to_ne_bytes());
            rec[8..12].copy_from_slice(&ty.to_ne_bytes());
            let _ = nix::unistd::write(fd, &rec);
        }
    }
    busy
}

/// Rebuilds the IPv4 or IPv6 and UDP headers of a verified datagram in front of its bytes, as
/// they were on the wire (the ICRC covers them), into `out`. Returns the packet's length.
fn rebuild_ip(d: &RxDatagram<'_>, out: &mut [u8]) -> Option<usize> {
    use proto::wire::{Ipv4Repr, Ipv6Repr, UdpRepr};
    let udp = UdpRepr {
        src_port: d.src.port(),
        dst_port: d.dst.port(),
        checksum: 0,
        payload_len: d.bytes.len(),
    };
    let (hl, total) = match (d.src.ip(), d.dst.ip()) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => {
            let id = d.ipv4?;
            let ip = Ipv4Repr {
                src,
                dst,
                tos: d.tos,
                ident: id.ident,
                dont_frag: id.dont_frag,
                ttl: 64,
                protocol: 17,
                payload_len: 8 + d.bytes.len(),
            };
            let total = 20 + 8 + d.bytes.len();
            if out.len() < total {
                return None;
            }
            ip.emit(&mut out[..20]);
            (20, total)
        }
        (IpAddr::V6(src), IpAddr::V6(dst)) => {
            let ip = Ipv6Repr {
                src,
                dst,
                traffic_class: d.tos,
                flow_label: 0,
                next_header: 17,
                hop_limit: 64,
                payload_len: 8 + d.bytes.len(),
            };
            let total = 40 + 8 + d.bytes.len();
            if out.len() < total {
                return None;
            }
            ip.emit(&mut out[..40]);
            (40, total)
        }
        _ => return None,
    };
    udp.emit(&mut out[hl..hl + 8]);
    out[hl + 8..total].copy_from_slice(d.bytes);
    Some(total)
}

/// The UDP source port of what the device sends from `src` (its socket's; the ICRC covers it).
fn local_port(net: &UdpTransport, src: IpAddr) -> u16 {
    match src {
        IpAddr::V4(_) => net.local_addr_v4(),
        IpAddr::V6(_) => net.local_addr_v6(),
    }
    .map_or(proto::wire::ROCE_V2_PORT, |a| a.port())
}

/// Sends a GSI packet (BTH..ICRC) built by the CM thread, sealing its ICRC for the socket's
/// addresses as [`send_frame`] does.
fn send_gsi(net: &mut UdpTransport, src: IpAddr, dst: IpAddr, packet: &mut [u8]) {
    if PacketBuilder::new(src, dst, local_port(net, src))
        .seal(0, packet)
        .is_err()
    {
        return;
    }
    let meta = TxMeta {
        dst: SocketAddr::new(dst, proto::wire::ROCE_V2_PORT),
        src: Some(src),
        tos: 0,
        ttl: Some(64),
        segment_size: None,
    };
    if let Err(e) = net.send(&meta, packet) {
        debug!(%src, %dst, "CM MAD send failed: {e}");
    }
}

/// Sends one engine frame through the UDP socket. The socket's source port is 4791 (rxe picks a
/// per-QP port; receivers accept any), and the ICRC covers the ports, so it is recomputed for
/// the headers the kernel will write.
fn send_frame(net: &mut UdpTransport, buf: &mut [u8], t: &tp::Transmit) {
    let Some(frame) = buf.get_mut(..t.len) else {
        return;
    };
    let (tos, ttl) = match t.src {
        IpAddr::V4(_) => (frame[1], frame[8]),
        IpAddr::V6(_) => (
            ((u16::from_be_bytes([frame[0], frame[1]]) >> 4) & 0xff) as u8,
            frame[7],
        ),
    };
    let transport = &mut frame[t.transport_offset..];
    let builder = PacketBuilder::new(t.src, t.dst, local_port(net, t.src));
    let meta = TxMeta {
        dst: SocketAddr::new(t.dst, proto::wire::ROCE_V2_PORT),
        src: Some(t.src),
        tos,
        ttl: Some(ttl),
        segment_size: None,
    };
    if let Err(e) = net.push_packet(&meta, &builder, transport) {
        debug!(src = %t.src, dst = %t.dst, "send failed: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `imm_data` is __be32 in `ibv_send_wr` and `ibv_wc`: the bytes the application stores
    /// are the bytes on the wire, and the bytes on the wire are the bytes it reads back. Two
    /// softroce daemons cannot tell a swap on both ends apart, kernel rxe can (udaddy).
    #[test]
    fn immediate_data_keeps_the_applications_byte_order() {
        let stored = u32::from_ne_bytes([0x01, 0x02, 0x03, 0x04]); // htobe32(0x01020304)
        let w = SendWqe {
            wr_id: 1,
            opcode: WrOpcode::SendWithImm,
            flags: 0,
            imm_or_inv: stored,
            remote_addr: 0,
            rkey: Rkey(0),
            compare_add: 0,
            swap: 0,
            ud: None,
            bind: None,
            data: SendData::Sges(&[]),
        };
        let wr = send_wr(&w).expect("a valid WQE");
        // The engine's immediate is the ImmDt field's big-endian value: 01 02 03 04 on the wire.
        assert_eq!(wr.op, SendOp::SendWithImm(0x0102_0304));
        let wc = WorkCompletion {
            wr_id: 1,
            status: tp::WcStatus::Success,
            opcode: tp::WcOpcode::Recv,
            byte_len: 0,
            imm_data: 0x0102_0304,
            invalidated_rkey: 0,
            qp_num: Qpn::new(1),
            src_qp: Qpn::new(2),
            wc_flags: tp::WcFlags::WITH_IMM,
            solicited: false,
        };
        assert_eq!(
            cqe_of(&wc).imm_or_inv.to_ne_bytes(),
            [0x01, 0x02, 0x03, 0x04]
        );
    }
}
