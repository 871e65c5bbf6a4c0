//! One device on its own thread: the transport engines of its clients, their shared rings, and
//! the device's [`Link`] to the network.
//!
//! Each client process gets its own engine ([`proto::transport::Engine`]) on each device it
//! opens, with its own block of QP numbers. All of a client's resources (PDs, MRs, CQs, QPs)
//! live in that engine, and an R_Key is only ever honoured for a QP of the same PD, so
//! packets are demultiplexed by destination QPN and every memory access the engine makes
//! belongs to one process: the engine's `MemoryAccess` is that process's memory
//! (`process_vm_readv`/`writev`). Killing a client drops its engine and everything in it.
//!
//! The loop ([`DeviceThread::run`]) is the table of contents:
//! - control messages: requests from the client threads ([`control`], creating objects in
//!   [`objects`]), clients gone ([`clients`]), MADs from the CM thread;
//! - posted work from the rings into the engines ([`work_requests`]);
//! - received packets from the link into the engines ([`receive`]; QP1's MADs go to the CM
//!   thread, [`crate::gsi`]);
//! - timers, and the engines' packets out: to the link, or from engine to engine for QPs of
//!   this device, as rxe's loopback ([`transmit`]);
//! - completions and events back to the clients ([`completions`]);
//! - when nothing happened for a short spin, every client's doorbell table is told the device
//!   sleeps and the thread blocks in the link's poll, which also wakes on the eventfd that
//!   clients (and the control threads) write.
//!
//! A pass costs what happened, not what exists ([`doorbells`]): the rings read are the ones
//! whose doorbell rang, the timers run are the due ones (the engine's timer queue), the CQs
//! copied are the ones with completions (`Engine::take_touched_cqs`). 100,000 idle QPs cost
//! nothing per pass and no CPU while the device sleeps.
//!
//! Handles given to clients carry the device index ([`handles`]); the device joins the IP
//! multicast groups its QPs attach to ([`multicast`]); every engine runs the device's
//! congestion control, whose counters and per-QP rates [`congestion`] reports.

mod arena;
mod clients;
mod completions;
mod congestion;
mod control;
mod doorbells;
mod events;
mod fast;
mod handles;
mod limits;
mod loss_recovery;
mod multicast;
mod objects;
pub mod operator;
mod receive;
mod resize;
mod transmit;
mod work_requests;

pub use clients::QpnBlocks;
pub use handles::{handle_device, HANDLE_DEVICE_SHIFT};
pub use operator::OperatorMsg;

use crate::fault::FaultInjector;
use crate::gsi::{GsiMad, GsiOut};
use crate::net::l2::{L2Config, L2Link, Versions};
use crate::net::neighbour_board::NeighbourBoard;
use crate::net::tap::TapConfig;
use crate::net::{AdaptiveSpin, Layers, Link, LocalFrames, UdpLink, UdpLinkConfig};
use crate::peer::ClientProcess;
use clients::ClientDev;
use crossbeam_channel::{Receiver, Sender};
use multicast::JoinedGroup;
use nix::sys::eventfd::{EfdFlags, EventFd};
use proto::ctl::{ClientResources, DeviceCounters, DeviceInfo, Request, Response};
use proto::transport as tp;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::info;

/// How long the loop keeps polling after the last piece of work before it sleeps: between
/// these, following the gaps between pieces of work (net::AdaptiveSpin).
const SPIN_MIN: Duration = Duration::from_micros(20);
const SPIN_MAX: Duration = Duration::from_micros(200);
/// Longest sleep when no timer is due. Every other reason to wake rings the doorbell (control
/// messages, posts to a sleeping ring) or completes on the io_uring (packets), and each
/// wake-up costs a pass over every ring: with 10,000 idle QPs, waking every 200 ms cost 2% of
/// a CPU. The cap only bounds the damage of a wake-up that was missed.
const MAX_SLEEP: Duration = Duration::from_secs(10);

/// Messages to a device thread.
pub enum DevMsg {
    Request {
        client: u64,
        /// The client's process, pinned when it connected ([`crate::peer`]): its memory is
        /// only reached through it.
        process: Arc<ClientProcess>,
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
    /// The device's congestion control, counters and QP rates (`softroce res show`).
    Congestion {
        reply: Sender<proto::ctl::DeviceCongestion>,
    },
    /// The device's counters ([`proto::ctl::Request::Counters`]).
    Counters {
        reply: Sender<DeviceCounters>,
    },
    /// What the capability exchange learnt of the device's peers (`softroce link show`).
    Peers {
        reply: Sender<Vec<proto::ctl::PeerInfo>>,
    },
    /// The device's addresses changed (`--netdev`): engines created from now on use the new
    /// GID table. (Engines of running clients keep theirs; their QPs' address vectors were
    /// resolved against it.)
    UpdateInfo(DeviceInfo),
    /// A CM MAD from the CM thread, to leave through this device's link.
    SendGsi(GsiOut),
    /// rdma_cm address resolution wants the peer's link-layer address (the L2 device
    /// resolves it and publishes it on its [`NeighbourBoard`]).
    SolicitNeighbour(IpAddr),
    /// The operator's requests: counters, resources, captures, fault rules.
    Operator(OperatorMsg),
    /// `softroce link set NAME up|down`: the link's carrier follows (the L2 device's TAP);
    /// the port state itself comes with the next [`DevMsg::UpdateInfo`].
    Carrier(bool),
    /// `softroce link del`: fatal to the device's contexts; the thread ends.
    Remove,
    Shutdown,
}

/// The device thread's state.
pub struct DeviceThread {
    index: u32,
    /// Most QPs and MRs the device holds, over all clients (`max_qp`, `max_mr` in the config),
    /// and the other caps ([`limits`]).
    max_qp: usize,
    max_mr: usize,
    limits: crate::config::ResourceLimits,
    /// The QPN blocks of every device of the daemon: QPNs are unique across devices (clients
    /// name QPs by QPN), and devices come and go (`softroce link add/del`).
    qpn_blocks: Arc<QpnBlocks>,
    info: DeviceInfo,
    /// The GID table by index ([`DeviceInfo::gid_table`]: an empty slot is
    /// [`proto::ctl::NO_GID`]).
    gids: Vec<IpAddr>,
    /// Bumped at every change of the GID table, and published with the port
    /// ([`operator`]'s `publish_port`): a context whose copy is older asks for the new one.
    gid_generation: u16,
    /// The link, inside its capture and fault layers.
    link: Layers,
    /// The L2 device's resolved peers, for the CM thread ([`DeviceThread::neighbour_board`]).
    neighbour_board: Option<Arc<NeighbourBoard>>,
    /// Fault rules the responder carries out (forced RNR and access error NAKs).
    naks: FaultInjector,
    /// QP1 packets (CM MADs) sent and received.
    gsi_sent: u64,
    gsi_rcvd: u64,
    wake: EventFd,
    rx: Receiver<DevMsg>,
    clients: BTreeMap<u64, ClientDev>,
    /// QPN block -> client.
    blocks: HashMap<u32, u64>,
    start: Instant,
    slot: Vec<u8>,
    /// Where packets to QP1 (CM MADs) go: the CM thread ([`crate::cm`]).
    gsi: Option<Sender<GsiMad>>,
    /// Packets between QPs of this device, waiting for delivery.
    local: LocalFrames,
    /// Whether packets between QPs of this device go through the link (visible to a
    /// capture) instead of `local` (`local_via_socket` in the config).
    local_via_socket: bool,
    /// The IP multicast groups the device's QPs are attached to, with the attachments
    /// (client, QPN): the group is joined while any remains (rxe_mcast_add/rxe_mcast_del).
    groups: HashMap<IpAddr, JoinedGroup>,
    /// The same-host fast path's directions and MR tables ([`fast`]).
    fast: fast::FastPaths,
    /// Requests, replies and revocations waiting for directions to come back.
    fast_waiting: Vec<Waiting>,
    /// Packets between local QPs had to pass the link's layers at the end of the last round
    /// (a capture, a fault rule, the port down): the same-host fast path is offered again
    /// once none holds ([`DeviceThread::fast_through_layers`]).
    through_layers: bool,
    /// Which peers are softroce devices, and the QPs waiting to know ([`loss_recovery`]).
    negotiation: loss_recovery::Negotiation,
    /// What every engine of the device runs (`--cc`, `--cc-param`).
    congestion: tp::CongestionConfig,
    /// Packets the device itself dropped (after the link, before any engine).
    drops: DeviceDrops,
    /// The engine counters of the clients that are gone, so that the device's totals do not
    /// shrink when a client exits.
    departed: tp::Counters,
    /// Times the port went down (`link_downed`, rxe's `rxe_port_down`).
    link_downs: u64,
    /// The numbers `res show` gives the clients' objects ([`operator::ResNumbers`]).
    res_numbers: operator::ResNumbers,
}

/// Something waiting until fast-path directions are back (or their takers outside them).
struct Waiting {
    directions: Vec<u64>,
    /// Revoke them (a request that changes their QPs), or only wait until no taker is inside
    /// (a deregistration: the MR tables already say it).
    revoke: bool,
    then: Then,
}

/// A reply held back, with where it goes.
type HeldReply = (Response, Vec<OwnedFd>, Sender<(Response, Vec<OwnedFd>)>);

enum Then {
    Request(Box<DevMsg>),
    Reply(Box<HeldReply>),
    Nothing,
}

/// Why the device dropped a packet the link delivered.
#[derive(Debug, Clone, Copy, Default)]
struct DeviceDrops {
    /// The destination QPN lies in no client's block (counted as `dropped_pkts` too).
    unknown_qp: u64,
    /// A packet to QP1 that is no CM MAD, or the CM thread's queue was full.
    gsi_dropped: u64,
    /// Too short to carry a BTH.
    no_bth: u64,
}

impl DeviceThread {
    /// Opens the device's link and returns the thread state.
    pub fn new(
        index: usize,
        qpn_blocks: Arc<QpnBlocks>,
        cfg: &crate::config::DeviceConfig,
        info: DeviceInfo,
        rx: Receiver<DevMsg>,
        port: u16,
    ) -> anyhow::Result<DeviceThread> {
        let gids = info.gid_table();
        let congestion = cfg.congestion()?;
        let wake =
            EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
        let mut neighbour_board = None;
        let link: Box<dyn Link + Send> = match &cfg.tap {
            Some(tap) => {
                let l2 = open_tap(cfg, tap, &info, wake.as_raw_fd())?;
                neighbour_board = Some(l2.neighbour_board());
                Box::new(l2)
            }
            None => Box::new(UdpLink::open(&UdpLinkConfig {
                name: &info.name,
                addrs: &info.gid_addrs(),
                follow_netdev: !info.netdevs.is_empty(),
                port,
                gso: cfg.gso && std::env::var_os("SOFTROCE_NO_GSO").is_none(),
                gro: std::env::var_os("SOFTROCE_NO_GRO").is_none(),
                wake_fd: wake.as_raw_fd(),
            })?),
        };
        Ok(DeviceThread {
            max_qp: cfg.max_qp as usize,
            max_mr: cfg.max_mr as usize,
            limits: cfg.limits,
            index: index as u32,
            qpn_blocks,
            link: {
                let mut layers = Layers::new(link, info.node_guid, clients::random_seed());
                // A device may start with its port down (its netdev without carrier): it
                // carries nothing until the port comes up, as after a `link set down`.
                layers.set_port_up(info.port_active);
                layers
            },
            neighbour_board,
            naks: FaultInjector::new(clients::random_seed()),
            gsi_sent: 0,
            gsi_rcvd: 0,
            info,
            gids,
            gid_generation: 0,
            wake,
            rx,
            clients: BTreeMap::new(),
            blocks: HashMap::new(),
            start: Instant::now(),
            slot: vec![0u8; 64 * 1024],
            gsi: None,
            local: LocalFrames::new(),
            local_via_socket: cfg.local_via_socket,
            groups: HashMap::new(),
            fast: fast::FastPaths::new(true),
            fast_waiting: Vec::new(),
            through_layers: false,
            congestion,
            drops: DeviceDrops::default(),
            departed: tp::Counters::default(),
            link_downs: 0,
            res_numbers: operator::ResNumbers::default(),
            negotiation: loss_recovery::Negotiation::new(
                cfg.loss_recovery,
                cfg.selective_bdp,
                // A UDP socket hides the Identification and the device solves for it; the
                // TAP device sees it and checks it.
                cfg.tap.is_none(),
                crate::entropy::u64(),
            ),
        })
    }

    /// Hands received CM MADs (packets to QP1) to the CM thread.
    pub fn set_gsi_sink(&mut self, sink: Sender<GsiMad>) {
        self.gsi = Some(sink);
    }

    /// Where the L2 device publishes the peers it has resolved, for rdma_cm address
    /// resolution (`None` for a UDP device: the kernel resolves its neighbours).
    pub fn neighbour_board(&self) -> Option<Arc<NeighbourBoard>> {
        self.neighbour_board.clone()
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
        exact_timers();
        let mut idle_since = Instant::now();
        let mut spin = AdaptiveSpin::new(SPIN_MIN, SPIN_MAX);
        // When the last piece of work ended, and whether the loop has been idle since.
        let mut last_work = Instant::now();
        let mut idle = true;
        loop {
            let mut busy = false;
            let waiting = self.fast_retry_waiting();
            while let Ok(msg) = self.rx.try_recv() {
                busy = true;
                if !self.message(msg) {
                    info!(device = %self.info.name, counters = ?self.link.counters(), "device stopped");
                    return;
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
            if waiting {
                // Requests wait for fast-path directions to come back (their takers are
                // inside them for microseconds): no sleep meanwhile, but no hogging either.
                idle_yield();
                continue;
            }
            // Sleep: tell every ring, re-check, then block until a packet, a doorbell, a
            // control message or the next timer.
            if self.announce_sleep() || !self.rx.is_empty() {
                self.announce_awake();
                continue;
            }
            let timeout = self.sleep_time();
            self.pump(timeout);
            let _ = self.wake.read();
            self.announce_awake();
            idle_since = Instant::now();
        }
    }

    /// Handles one control message; false when the device is to stop.
    fn message(&mut self, msg: DevMsg) -> bool {
        match msg {
            DevMsg::Shutdown => return false,
            DevMsg::Request {
                client,
                process,
                request,
                fds,
                reply,
            } => {
                let request = handles::untag(request);
                // One span per client, and per QP for the requests about one.
                let _client = tracing::info_span!("client", client, pid = process.pid()).entered();
                let qpn = match &request {
                    Request::ModifyQp { qpn, .. }
                    | Request::QueryQp { qpn, .. }
                    | Request::DestroyQp { qpn }
                    | Request::AttachMcast { qpn, .. }
                    | Request::DetachMcast { qpn, .. } => Some(*qpn),
                    _ => None,
                };
                let _qp = qpn.map(|qpn| tracing::info_span!("qp", qpn).entered());
                tracing::trace!(client, ?request, "request");
                // A request about QPs that run in a process (the fast path) waits until they
                // are back.
                let blockers = self.fast_blockers(client, &request);
                if blockers
                    .iter()
                    .any(|id| self.fast.directions.contains_key(id))
                {
                    self.fast_waiting.push(Waiting {
                        directions: blockers,
                        revoke: true,
                        then: Then::Request(Box::new(DevMsg::Request {
                            client,
                            process,
                            request,
                            fds,
                            reply,
                        })),
                    });
                    return true;
                }
                // A resize counts what the queue holds: the work the client posted before it
                // asked is taken and completed first, as an adapter would have by then.
                if matches!(request, Request::ResizeCq { .. }) {
                    self.pump(Duration::ZERO);
                }
                let before = self.fast_before(client, &request);
                let (resp, fds) = self.request(client, &process, request, fds);
                if let Response::Qp { qpn, .. } = &resp {
                    tracing::info_span!("qp", qpn).in_scope(|| tracing::debug!("QP created"));
                }
                let resp = handles::tag(resp, self.index);
                tracing::trace!(
                    client,
                    ok = !matches!(resp, Response::Error { .. }),
                    "response"
                );
                match self.fast_after(client, before, &resp) {
                    Some(directions) => self.fast_waiting.push(Waiting {
                        directions,
                        revoke: false,
                        then: Then::Reply(Box::new((resp, fds, reply))),
                    }),
                    None => {
                        let _ = reply.send((resp, fds));
                    }
                }
            }
            DevMsg::ClientGone { client } => self.client_gone(client),
            DevMsg::SendGsi(mut mad) => {
                self.gsi_sent += 1;
                self.warm_loss_recovery(mad.dst, mad.src, mad.gid_type);
                self.link
                    .send_gsi_as(mad.gid_type, mad.src, mad.dst, &mut mad.packet);
                self.link.flush();
            }
            DevMsg::SolicitNeighbour(peer) => {
                self.link.solicit_neighbour(peer);
                self.link.flush();
            }
            DevMsg::Operator(m) => self.operator(m),
            DevMsg::Carrier(on) => self.link.set_carrier(on),
            DevMsg::Remove => {
                self.remove();
                return false;
            }
            DevMsg::UpdateInfo(info) => {
                let was_active = self.info.port_active;
                let gids_changed = info.gids != self.info.gids;
                self.gids = info.gid_table();
                self.link.set_addresses(&info.gid_addrs());
                self.info = info;
                // Each of these publishes the port word (state, MTU, GID generation).
                if gids_changed {
                    self.gids_changed();
                }
                if self.info.port_active != was_active {
                    self.port_changed(self.info.port_active);
                } else if !gids_changed {
                    // The active MTU may have followed the netdev's.
                    self.publish_port();
                }
            }
            DevMsg::Congestion { reply } => {
                let _ = reply.send(self.congestion_report());
            }
            DevMsg::Counters { reply } => {
                let _ = reply.send(self.counters());
            }
            DevMsg::Peers { reply } => {
                let _ = reply.send(self.negotiation.peers());
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
        true
    }

    /// The link's counters, the device's drops, and its engines' counters summed over every
    /// client it served.
    fn counters(&self) -> DeviceCounters {
        let engines = self.engine_totals();
        let d = self.drops;
        let mut counters: Vec<(String, u64)> = self
            .link
            .counters()
            .named()
            .iter()
            .map(|(n, v)| (n.to_string(), *v))
            .collect();
        counters.extend([
            ("device_drop_unknown_qp".to_string(), d.unknown_qp),
            ("device_drop_gsi".to_string(), d.gsi_dropped),
            ("device_drop_no_bth".to_string(), d.no_bth),
        ]);
        counters.extend(self.fast.named());
        counters.extend(engines.named().into_iter().map(|(n, v)| (n.to_string(), v)));
        DeviceCounters {
            device: self.info.name.clone(),
            counters,
        }
    }

    /// One round of the data path; `wait` is how long the link may block. Returns whether
    /// anything happened.
    fn pump(&mut self, wait: Duration) -> bool {
        // Clients whose engine panicked on the way: dropped at the end of the round.
        let mut broken: Vec<u64> = Vec::new();
        self.fast_expire_holds();
        let mut busy = self.take_posted_work(&mut broken);
        busy |= self.receive(wait, &mut broken);
        busy |= self.negotiation_timers();
        busy |= self.transmit(&mut broken);
        if busy && self.fast.enabled {
            self.fast_events_fired();
        }
        broken.sort_unstable();
        broken.dedup();
        for id in broken {
            self.client_gone(id);
        }
        if busy {
            self.link.flush();
        }
        self.notice_layers_clear();
        busy
    }

    /// How long an idle device may block: until the next engine timer, at most
    /// [`MAX_SLEEP`], and no longer than the link allows.
    fn sleep_time(&self) -> Duration {
        let now = self.now();
        let due = self
            .clients
            .values()
            .filter_map(|c| c.engine.poll_timeout())
            .chain(self.negotiation.poll_timeout())
            .chain(self.fast.holds.iter().map(|h| h.until()))
            .min();
        let timeout = match due {
            Some(t) if t <= now => Duration::ZERO,
            Some(t) => Duration::from_nanos(t - now).min(MAX_SLEEP),
            None => MAX_SLEEP,
        };
        // Event records held back for a client that did not read are retried by polling.
        let timeout = if self.clients.values().any(ClientDev::events_held_back) {
            timeout.min(events::RETRY_INTERVAL)
        } else {
            timeout
        };
        self.link.max_sleep().map_or(timeout, |m| timeout.min(m))
    }

    /// Tells every client's doorbell table that the device sleeps; true if work slipped in
    /// meanwhile (a doorbell rang, or a ring is to be read again). The cost is per client,
    /// not per ring: a table's top level says whether any of its doorbells rang.
    fn announce_sleep(&self) -> bool {
        let mut work = false;
        for c in self.clients.values() {
            work |= !c.revisit.is_empty();
            if let Some(t) = &c.bells {
                work |= t.prepare_sleep();
            }
        }
        work
    }

    fn announce_awake(&self) {
        for c in self.clients.values() {
            if let Some(t) = &c.bells {
                t.awake();
            }
        }
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

/// The loop sleeps until the engines' next timer, and a paced QP's next packet is such a
/// timer: the default timer slack (50 µs) would make every paced packet that late, a tenth
/// of the time between packets at 1 Gbit/s. A 1 µs slack costs nothing measurable while the
/// device sleeps longer.
fn exact_timers() {
    // SAFETY: prctl with integer arguments, on this thread.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong);
    }
}

/// Gives the CPU to whoever waits for it while the loop spins for more work (see `run`).
fn idle_yield() {
    // SAFETY: no arguments; sched_yield cannot fail on Linux.
    unsafe {
        libc::sched_yield();
    }
}

/// The L2 device's link: the TAP interface `tap`, the device's own MAC and addresses, the
/// RoCE versions of `--roce`.
fn open_tap(
    cfg: &crate::config::DeviceConfig,
    tap: &str,
    info: &DeviceInfo,
    wake_fd: std::os::fd::RawFd,
) -> anyhow::Result<L2Link> {
    use crate::config::RoceMode;
    let l2 = L2Config {
        device: info.name.clone(),
        tap: TapConfig::new(tap),
        mac: crate::config::tap_mac(cfg),
        addrs: crate::config::tap_addrs(cfg),
        versions: Versions {
            v1: cfg.roce != RoceMode::V2,
            v2: cfg.roce != RoceMode::V1,
        },
    };
    let (mut link, why) = L2Link::open(&l2, crate::entropy::u64())
        .map_err(|e| anyhow::anyhow!("device {}: {e}", info.name))?;
    if let Some(why) = why {
        tracing::warn!(device = %info.name, "io_uring unavailable for the TAP, using system calls: {why}");
    }
    link.set_wake_fd(wake_fd);
    info!(
        device = %info.name,
        tap = link.tap_name(),
        mac = %link.mac(),
        mtu = link.mtu(),
        backend = ?link.backend(),
        roce = %cfg.roce,
        "L2 device ready"
    );
    Ok(link)
}
