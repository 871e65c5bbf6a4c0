//! `softroce daemon`: the main thread accepts clients on the control socket; each client gets
//! a thread that reads its requests. Requests about devices and clients (hello, device list,
//! `res show`) go to the registry thread; rdma_cm requests (`Cm*`) to the CM thread
//! ([`crate::cm`]); requests about resources go straight to the thread of the device they
//! concern ([`crate::device`]), which owns the data path. When a client disconnects (or is
//! killed), every device destroys what it owned and the CM thread its rdma_cm ids.
//!
//! Devices come and go while the daemon runs (`softroce link add/del`, [`operator`], which
//! also serves the other operator's requests): the list every thread routes by is shared, and
//! a device's index (carried in its handles) is never reused.

mod operator;

use crate::access::{AccessPolicy, ConnectionSlot, ConnectionSlots};
use crate::cm::{self, CmMsg, CmService};
use crate::config::{self, Config, DeviceConfig};
use crate::ctl::{Conn, Listener};
use crate::device::{self, DevMsg, QpnBlocks};
use crate::peer::{self, ClientProcess};
use anyhow::{Context, Result};
use crossbeam_channel::{bounded, select, tick, unbounded, Receiver, Sender};
use proto::ctl::{
    self, ClientResources, DeviceInfo, Request, Response, MAX_MESSAGE, PROTOCOL_VERSION,
};
use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tracing::{debug, info, warn};

/// How often addresses of `--netdev` interfaces are re-read.
const NETDEV_RESCAN: Duration = Duration::from_secs(2);
/// Stack of a connection's thread: it decodes one request at a time and waits for answers,
/// so a small stack lets `max_connections` threads fit in little memory.
const CONNECTION_STACK: usize = 256 * 1024;

/// Messages to the registry thread.
enum RegMsg {
    Connect {
        pid: u32,
        uid: u32,
        program: String,
        reply: Sender<u64>,
    },
    Request {
        client: u64,
        request: Request,
        fds: Vec<OwnedFd>,
        reply: Sender<Response>,
    },
    Disconnect {
        client: u64,
    },
    Shutdown,
}

/// How a control thread reaches one device thread.
#[derive(Clone)]
struct DeviceLink {
    name: String,
    tx: Sender<DevMsg>,
    wake: Arc<OwnedFd>,
}

impl DeviceLink {
    fn send(&self, msg: DevMsg) -> bool {
        let ok = self.tx.send(msg).is_ok();
        // The device thread may be asleep in its packet poll: ring its doorbell.
        let _ = nix::unistd::write(&*self.wake, &1u64.to_ne_bytes());
        ok
    }
}

struct Device {
    config: DeviceConfig,
    /// What clients see, `port_active` included: the port is up while its configuration
    /// says so (addresses, a netdev up with carrier) and the operator has not set it down.
    info: DeviceInfo,
    /// `softroce link set NAME down`.
    admin_down: bool,
}

impl Device {
    fn new(config: DeviceConfig, info: DeviceInfo) -> Device {
        Device {
            config,
            info,
            admin_down: false,
        }
    }
}

/// Every device's link by device index (the index its handles carry); `None` once deleted.
/// Shared by the registry, which adds and deletes devices, and the client threads.
type Links = Arc<RwLock<Vec<Option<DeviceLink>>>>;

/// A device's new description goes to its thread (which tells its contexts of a port state
/// change) and the CM thread.
fn publish(cm: &Sender<CmMsg>, index: usize, d: &mut Device, link: &DeviceLink, info: DeviceInfo) {
    link.send(DevMsg::UpdateInfo(info.clone()));
    let _ = cm.send(CmMsg::UpdateInfo {
        device: index,
        info: info.clone(),
    });
    d.info = info;
}

/// The live device at `index`.
fn link_at(links: &Links, index: usize) -> Option<DeviceLink> {
    links.read().ok()?.get(index).cloned().flatten()
}

/// Every live device's link.
fn live_links(links: &Links) -> Vec<DeviceLink> {
    links
        .read()
        .map(|l| l.iter().flatten().cloned().collect())
        .unwrap_or_default()
}

/// What starting a device needs beyond its config.
struct DeviceFactory {
    /// The RoCE v2 UDP port.
    port: u16,
    gsi: Sender<crate::gsi::GsiMad>,
    qpn_blocks: Arc<QpnBlocks>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// Owns the device descriptions and the list of clients.
struct Registry {
    /// By device index, as `links`.
    devices: Vec<Option<Device>>,
    links: Links,
    clients: BTreeMap<u64, ClientResources>,
    next_client: u64,
    /// The rdma_cm thread, told of address changes too.
    cm: Sender<CmMsg>,
    factory: DeviceFactory,
    /// The TOML file `--save` edits (the daemon's `--config`).
    config_path: Option<PathBuf>,
    /// Captures running, by the client connection that asked (they end with it).
    captures: HashMap<u64, Vec<Arc<crate::capture::CaptureShared>>>,
}

impl Registry {
    fn handle(&mut self, client: u64, request: Request, fds: Vec<OwnedFd>) -> Response {
        match request {
            // A second hello on the same connection is a protocol error.
            Request::Hello { .. } => Response::Error {
                errno: libc::EPROTO,
                message: "hello already received".into(),
            },
            Request::QueryDevices => Response::Devices(
                self.devices
                    .iter()
                    .flatten()
                    .map(|d| d.info.clone())
                    .collect(),
            ),
            Request::Counters => {
                let (tx, rx) = bounded(1);
                let cm = match self.cm.send(CmMsg::Counters { reply: tx }) {
                    Ok(()) => rx.recv_timeout(Duration::from_secs(2)).unwrap_or_default(),
                    Err(_) => Vec::new(),
                };
                let links: Vec<(usize, DeviceLink)> = self
                    .links
                    .read()
                    .map(|l| {
                        l.iter()
                            .enumerate()
                            .filter_map(|(i, d)| Some((i, d.clone()?)))
                            .collect()
                    })
                    .unwrap_or_default();
                Response::Counters(
                    links
                        .into_iter()
                        .filter_map(|(i, link)| {
                            let (tx, rx) = bounded(1);
                            link.send(DevMsg::Counters { reply: tx }).then_some(())?;
                            let mut c = rx.recv_timeout(Duration::from_secs(2)).ok()?;
                            let m = cm.get(i).copied().unwrap_or_default();
                            c.counters.extend([
                                ("cm_mads_rcvd".to_string(), m.mads_rcvd),
                                ("cm_mads_malformed".to_string(), m.mads_malformed),
                                ("cm_mads_ignored".to_string(), m.mads_ignored),
                            ]);
                            Some(c)
                        })
                        .collect(),
                )
            }
            Request::ResShow => {
                let mut clients: BTreeMap<u64, ClientResources> = self
                    .clients
                    .iter()
                    .filter(|(id, _)| **id != client)
                    .map(|(id, c)| (*id, c.clone()))
                    .collect();
                for link in &live_links(&self.links) {
                    let (tx, rx) = bounded(1);
                    if !link.send(DevMsg::Stats { reply: tx }) {
                        continue;
                    }
                    let Ok(stats) = rx.recv_timeout(Duration::from_secs(2)) else {
                        continue;
                    };
                    for (id, r) in stats {
                        if let Some(c) = clients.get_mut(&id) {
                            c.pds += r.pds;
                            c.mrs += r.mrs;
                            c.cqs += r.cqs;
                            c.qps += r.qps;
                            c.srqs += r.srqs;
                            c.ahs += r.ahs;
                            c.mws += r.mws;
                        }
                    }
                }
                Response::Resources {
                    devices: self
                        .devices
                        .iter()
                        .flatten()
                        .map(|d| d.info.name.clone())
                        .collect(),
                    clients: clients.into_values().collect(),
                }
            }
            Request::CongestionShow => {
                let links: Vec<DeviceLink> = self
                    .links
                    .read()
                    .map(|l| l.iter().flatten().cloned().collect())
                    .unwrap_or_default();
                Response::Congestion(
                    links
                        .iter()
                        .filter_map(|link| {
                            let (tx, rx) = bounded(1);
                            if !link.send(DevMsg::Congestion { reply: tx }) {
                                return None;
                            }
                            rx.recv_timeout(Duration::from_secs(2)).ok()
                        })
                        .collect(),
                )
            }
            r if operator::is_operator_request(&r) => self.operator(client, r, fds),
            _ => Response::Error {
                errno: libc::EINVAL,
                message: "not a registry request".into(),
            },
        }
    }

    fn rescan_netdevs(&mut self) {
        for (index, d) in self.devices.iter_mut().enumerate() {
            let Some(d) = d
                .as_mut()
                .filter(|d| d.config.netdev.is_some() || d.config.tap.is_some())
            else {
                continue;
            };
            let Some(link) = link_at(&self.links, index) else {
                continue;
            };
            match config::device_info(&d.config) {
                Ok(mut info) => {
                    info.port_active &= !d.admin_down;
                    proto::ctl::keep_gid_indices(&d.info.gids, &mut info.gids);
                    if info != d.info {
                        info!(device = %info.name, gids = info.gids.len(),
                              port_active = info.port_active, "netdev changed");
                        publish(&self.cm, index, d, &link, info);
                    }
                }
                Err(e) => warn!(device = %d.config.name, "cannot read addresses: {e:#}"),
            }
        }
    }

    /// Serves until shut down; returns the device threads, to be joined.
    fn run(mut self, rx: Receiver<RegMsg>) -> Vec<std::thread::JoinHandle<()>> {
        let rescan = tick(NETDEV_RESCAN);
        // Interface changes as they happen (rtnetlink); the tick stays as the backstop.
        let mut changed = crate::net::interface::watch_changes().unwrap_or_else(|e| {
            warn!("cannot watch interfaces ({e}): netdevs are re-read every 2 s");
            crossbeam_channel::never()
        });
        loop {
            select! {
                recv(rx) -> msg => match msg {
                    Ok(RegMsg::Connect { pid, uid, program, reply }) => {
                        self.next_client += 1;
                        let id = self.next_client;
                        info!(client = id, pid, uid, %program, "client connected");
                        self.clients.insert(id, ClientResources {
                            client: id, pid, uid, program, ..Default::default()
                        });
                        let _ = reply.send(id);
                    }
                    Ok(RegMsg::Request { client, request, fds, reply }) => {
                        debug!(client, ?request, "request");
                        let _ = reply.send(self.handle(client, request, fds));
                    }
                    Ok(RegMsg::Disconnect { client }) => {
                        for c in self.captures.remove(&client).unwrap_or_default() {
                            c.stop();
                        }
                        if let Some(c) = self.clients.remove(&client) {
                            info!(client, pid = c.pid, program = %c.program,
                                  "client gone; its resources are freed");
                        }
                    }
                    Ok(RegMsg::Shutdown) | Err(_) => break,
                },
                recv(rescan) -> _ => self.rescan_netdevs(),
                recv(changed) -> m => match m {
                    Ok(()) => self.rescan_netdevs(),
                    // The watch ended (it said why): the tick goes on.
                    Err(_) => changed = crossbeam_channel::never(),
                },
            }
        }
        for c in self.captures.values().flatten() {
            c.stop();
        }
        std::mem::take(&mut self.factory.threads)
    }
}

/// Which device thread a resource request concerns, or `None` for the registry.
fn route(request: &Request, links: &Links, qpns: &HashMap<u32, usize>) -> Option<usize> {
    let h = device::handle_device;
    Some(match request {
        Request::Hello { .. }
        | Request::QueryDevices
        | Request::ResShow
        | Request::Counters
        | Request::CongestionShow => return None,
        Request::OpenContext { device } => links
            .read()
            .ok()?
            .iter()
            .position(|l| l.as_ref().is_some_and(|l| &l.name == device))?,
        Request::CloseContext { ctx }
        | Request::AllocPd { ctx }
        | Request::CreateCompChannel { ctx }
        | Request::CreateCq { ctx, .. } => h(*ctx),
        Request::DeallocPd { pd }
        | Request::RegMr { pd, .. }
        | Request::CreateQp { pd, .. }
        | Request::CreateSrq { pd, .. }
        | Request::CreateAh { pd, .. }
        | Request::AllocMw { pd, .. } => h(*pd),
        Request::DeregMr { mr } | Request::ReregMr { mr, .. } => h(*mr),
        Request::DestroyCompChannel { channel } => h(*channel),
        Request::DestroyCq { cq } | Request::ResizeCq { cq, .. } => h(*cq),
        Request::ModifySrq { srq, .. }
        | Request::QuerySrq { srq }
        | Request::DestroySrq { srq } => h(*srq),
        Request::DestroyAh { ah } => h(*ah),
        Request::DeallocMw { mw } => h(*mw),
        Request::ModifyQp { qpn, .. }
        | Request::QueryQp { qpn, .. }
        | Request::DestroyQp { qpn }
        | Request::AttachMcast { qpn, .. }
        | Request::DetachMcast { qpn, .. }
        | Request::FastTake { qpn }
        | Request::FastReturn { qpn, .. } => *qpns.get(qpn)?,
        Request::FastSources { cq, .. } | Request::CqEventsWanted { cq } => h(*cq),
        // rdma_cm requests are served by the client's CM state, not by one device.
        _ => return None,
    })
}

fn send_response(conn: &Conn, response: &Response, fds: &[OwnedFd]) -> bool {
    let raw: Vec<_> = fds.iter().map(|f| f.as_raw_fd()).collect();
    ctl::encode(response)
        .ok()
        .is_some_and(|b| conn.send(&b, &raw).is_ok())
}

/// Answers a connection that will not be served with one error and closes it.
fn refuse(conn: &Conn, pid: i32, uid: u32, errno: i32, message: String) {
    warn!(pid, uid, "client refused: {message}");
    send_response(conn, &Response::Error { errno, message }, &[]);
}

/// What the connection's thread waits for next.
enum Wake {
    /// A request (or the peer's hang-up, which the read then sees).
    Request,
    /// The process that connected has exited: whoever holds the descriptor now is not it.
    ProcessExited,
}

/// Waits until the connection has something to read or its process exits.
fn wait_for_request(conn: &Conn, process: &ClientProcess) -> Wake {
    let mut fds = [
        libc::pollfd {
            fd: conn.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: process.pidfd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: two valid pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n > 0 {
            // A request that is already there is served first only if its process lives.
            return if fds[1].revents != 0 {
                Wake::ProcessExited
            } else {
                Wake::Request
            };
        }
        if n < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return Wake::Request;
        }
    }
}

/// Serves one client connection until it closes or its process exits. `_slot` holds the
/// connection's place under the caps until the thread ends.
fn serve_client(
    conn: Conn,
    creds: nix::sys::socket::UnixCredentials,
    _slot: ConnectionSlot,
    policy: &AccessPolicy,
    registry: Sender<RegMsg>,
    links: Links,
    cm: Sender<CmMsg>,
) {
    let (pid, uid) = (creds.pid(), creds.uid());
    // Every peer is checked, by a root daemon too: the socket's mode is only the first gate.
    if let Err(message) = policy.check(uid, creds.gid(), &peer::peer_groups(conn.as_fd())) {
        return refuse(&conn, pid, uid, libc::EACCES, message);
    }
    // Memory is reached through the process that connected, never through a pid alone
    // (crate::peer): one already gone is refused.
    let process = match ClientProcess::of_peer(conn.as_fd(), pid, uid) {
        Ok(p) => Arc::new(p),
        Err(e) => return refuse(&conn, pid, uid, libc::ESRCH, e.to_string()),
    };
    let mut buf = vec![0u8; MAX_MESSAGE];
    if let Wake::ProcessExited = wait_for_request(&conn, &process) {
        return refuse(
            &conn,
            pid,
            uid,
            libc::ESRCH,
            format!("the process that connected (pid {pid}) is gone"),
        );
    }
    let program = match conn.recv(&mut buf) {
        Ok((n, _)) if n > 0 => match ctl::decode::<Request>(&buf[..n]) {
            Ok(Request::Hello { version, program }) if version == PROTOCOL_VERSION => program,
            Ok(Request::Hello { version, .. }) => {
                return refuse(
                    &conn,
                    pid,
                    uid,
                    libc::EPROTO,
                    ctl::version_mismatch(version, PROTOCOL_VERSION),
                );
            }
            _ => {
                return refuse(
                    &conn,
                    pid,
                    uid,
                    libc::EPROTO,
                    "the first message must be hello".into(),
                )
            }
        },
        _ => return,
    };
    let span =
        tracing::info_span!("client", client = tracing::field::Empty, pid, program = %program);
    let _in_span = span.enter();
    let connected = ask(|reply| {
        registry
            .send(RegMsg::Connect {
                pid: pid as u32,
                uid,
                program,
                reply,
            })
            .is_ok()
    });
    let Some(client) = connected else { return };
    span.record("client", client);
    let hello = Response::Hello {
        version: PROTOCOL_VERSION,
        client,
    };
    let mut ok = send_response(&conn, &hello, &[]);
    // QPNs are not handles: remember which device each of this client's QPs lives on.
    let mut qpns: HashMap<u32, usize> = HashMap::new();
    while ok {
        if let Wake::ProcessExited = wait_for_request(&conn, &process) {
            info!(
                client,
                pid, "the client's process exited: its connection is closed"
            );
            break;
        }
        let (n, fds) = match conn.recv(&mut buf) {
            Ok((n, fds)) if n > 0 => (n, fds),
            _ => break,
        };
        let (response, out_fds) = match ctl::decode::<Request>(&buf[..n]) {
            Ok(request) if cm::is_cm_request(&request) => {
                let reply = ask(|reply| {
                    cm.send(CmMsg::Request {
                        client,
                        request,
                        reply,
                    })
                    .is_ok()
                });
                let Some(r) = reply else { break };
                r
            }
            Err(e) => (
                Response::Error {
                    errno: libc::EINVAL,
                    message: format!("undecodable request: {e}"),
                },
                Vec::new(),
            ),
            Ok(request) => match route(&request, &links, &qpns) {
                None if matches!(
                    request,
                    Request::Hello { .. }
                        | Request::QueryDevices
                        | Request::ResShow
                        | Request::Counters
                        | Request::CongestionShow
                ) || operator::is_operator_request(&request) =>
                {
                    let reply = ask(|reply| {
                        registry
                            .send(RegMsg::Request {
                                client,
                                request,
                                fds,
                                reply,
                            })
                            .is_ok()
                    });
                    let Some(r) = reply else { break };
                    (r, Vec::new())
                }
                Some(dev) => {
                    let Some(link) = link_at(&links, dev) else {
                        ok = send_response(&conn, &gone_device(), &[]);
                        continue;
                    };
                    let destroyed = match &request {
                        Request::DestroyQp { qpn } => Some(*qpn),
                        _ => None,
                    };
                    let reply = ask(|reply| {
                        link.send(DevMsg::Request {
                            client,
                            process: Arc::clone(&process),
                            request,
                            fds,
                            reply,
                        })
                    });
                    // The device was deleted meanwhile: this request fails, the connection
                    // and the client's other devices carry on.
                    let (r, out) = reply.unwrap_or_else(|| (gone_device(), Vec::new()));
                    match (&r, destroyed) {
                        (Response::Qp { qpn, .. }, _) => {
                            qpns.insert(*qpn, dev);
                        }
                        (Response::Done, Some(q)) => {
                            qpns.remove(&q);
                        }
                        _ => {}
                    }
                    (r, out)
                }
                _ => (
                    Response::Error {
                        errno: libc::EINVAL,
                        message: "unknown device, handle or QP".into(),
                    },
                    Vec::new(),
                ),
            },
        };
        ok = send_response(&conn, &response, &out_fds);
    }
    let _ = cm.send(CmMsg::ClientGone { client });
    for link in &live_links(&links) {
        link.send(DevMsg::ClientGone { client });
    }
    let _ = registry.send(RegMsg::Disconnect { client });
}

/// The answer to a request for a deleted device (as the kernel's EIO after removal).
fn gone_device() -> Response {
    Response::Error {
        errno: libc::EIO,
        message: "the device was deleted".into(),
    }
}

/// Sends a request with a one-shot reply channel (`send` returns whether the message was
/// taken) and waits for the answer; `None` when the other thread is gone.
fn ask<R>(send: impl FnOnce(Sender<R>) -> bool) -> Option<R> {
    let (reply, answer) = bounded(1);
    if !send(reply) {
        return None;
    }
    answer.recv().ok()
}

/// Runs the daemon until SIGINT or SIGTERM. `port` is the RoCE v2 UDP port (4791 but in
/// tests); `config_path` is the file `link add/del --save` edits.
pub fn run(config: Config, socket: PathBuf, port: u16) -> Result<()> {
    run_with(config, None, socket, port)
}

/// [`run`], knowing the TOML file the config came from.
pub fn run_with(
    config: Config,
    config_path: Option<PathBuf>,
    socket: PathBuf,
    port: u16,
) -> Result<()> {
    config.validate()?;
    crate::ctl::refuse_if_served(&socket)?;
    // The daemon writes completion-channel and async-event records into pipes and sockets
    // whose reading process may die at any moment (SIGKILL mid-run): that must be an EPIPE
    // for the write, not a SIGPIPE that kills the daemon (main restores the default
    // disposition for the command-line tools).
    // SAFETY: setting a disposition installs no handler; no other thread is running yet.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    let (gsi_tx, gsi_rx) = crate::gsi::gsi_queue();
    // The CM thread learns of each device as it starts.
    let cm_service = CmService::new(Vec::new());
    let (cm_tx, cm_rx) = unbounded();
    let cm_thread = std::thread::Builder::new()
        .name("rdma-cm".into())
        .spawn(move || cm_service.run(cm_rx, gsi_rx))?;
    let links: Links = Arc::new(RwLock::new(Vec::new()));
    let mut registry = Registry {
        devices: Vec::new(),
        links: Arc::clone(&links),
        clients: BTreeMap::new(),
        next_client: 0,
        cm: cm_tx.clone(),
        factory: DeviceFactory {
            port,
            gsi: gsi_tx,
            qpn_blocks: Arc::new(QpnBlocks::default()),
            threads: Vec::new(),
        },
        config_path,
        captures: HashMap::new(),
    };
    for d in &config.devices {
        registry.start_device(d.clone())?;
    }
    // Before the socket exists: whoever sees the socket may already send SIGINT or SIGTERM,
    // which must stop the daemon cleanly, not kill it.
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .context("installing signal handlers")?;
    let daemon_uid = nix::unistd::geteuid().as_raw();
    let policy = Arc::new(AccessPolicy::from_config(&config, daemon_uid)?);
    let (mode, group) = policy.socket_mode();
    if daemon_uid != 0 && (!policy.uids.is_empty() || !policy.gids.is_empty()) {
        warn!(
            "other users are allowed in, but a daemon that is not root reaches their memory \
             only with CAP_SYS_PTRACE"
        );
    }
    let listener = Arc::new(Listener::bind_with(&socket, mode, group)?);
    info!(socket = %socket.display(), mode = format!("{mode:o}"), ?group, "control socket ready");
    let slots = ConnectionSlots::new(config.max_connections, config.max_connections_per_uid);

    let (reg_tx, reg_rx) = unbounded();
    let registry_thread = std::thread::Builder::new()
        .name("registry".into())
        .spawn(move || registry.run(reg_rx))?;

    let stopping = Arc::new(AtomicBool::new(false));
    let stop_flag = Arc::clone(&stopping);
    let stop_registry = reg_tx.clone();
    let stop_listener = Arc::clone(&listener);
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                info!(signal = sig, "stopping");
                stop_flag.store(true, Ordering::SeqCst);
                let _ = stop_registry.send(RegMsg::Shutdown);
                stop_listener.shutdown();
            }
        })?;

    loop {
        match listener.accept() {
            Ok(conn) => {
                let creds = match conn.peer_credentials() {
                    Ok(c) => c,
                    Err(e) => {
                        warn!("client without credentials: {e:#}");
                        continue;
                    }
                };
                // Over a cap, or out of threads: EAGAIN to the client, never a daemon that
                // stops.
                let slot = match slots.take(creds.uid()) {
                    Ok(s) => s,
                    Err(why) => {
                        refuse(&conn, creds.pid(), creds.uid(), libc::EAGAIN, why);
                        continue;
                    }
                };
                let registry = reg_tx.clone();
                let links = Arc::clone(&links);
                let cm = cm_tx.clone();
                let policy = Arc::clone(&policy);
                // Kept to answer the client should the thread not start.
                let spare = conn.try_clone();
                let spawned = std::thread::Builder::new()
                    .name("client".into())
                    .stack_size(CONNECTION_STACK)
                    .spawn(move || serve_client(conn, creds, slot, &policy, registry, links, cm));
                match (spawned, spare) {
                    (Err(e), Ok(spare)) => refuse(
                        &spare,
                        creds.pid(),
                        creds.uid(),
                        libc::EAGAIN,
                        format!("the daemon cannot start a thread for the connection: {e}"),
                    ),
                    (Err(e), Err(_)) => warn!("cannot start a connection's thread: {e}"),
                    _ => {}
                }
            }
            Err(e) => {
                // After shutdown(2) on the listener, accept fails: that is our stop signal.
                if stopping.load(Ordering::SeqCst) || registry_thread.is_finished() {
                    break;
                }
                warn!("accept failed: {e:#}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    let _ = reg_tx.send(RegMsg::Shutdown);
    let device_threads = registry_thread.join().unwrap_or_default();
    let _ = cm_tx.send(CmMsg::Shutdown);
    let _ = cm_thread.join();
    for link in &live_links(&links) {
        link.send(DevMsg::Shutdown);
    }
    for t in device_threads {
        let _ = t.join();
    }
    // Not left to Drop: the signal thread may still hold a reference at exit.
    let _ = std::fs::remove_file(&socket);
    drop(listener);
    info!("stopped");
    Ok(())
}
