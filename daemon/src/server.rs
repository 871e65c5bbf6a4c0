//! `softroce daemon`: the control plane. The main thread accepts clients on the control socket;
//! each client gets a thread that reads its requests and hands them to the core thread, which
//! owns every device and every resource, so that no lock guards protocol state. When a client
//! disconnects (or is killed), the core destroys everything it owned.

use crate::config::{self, Config, DeviceConfig};
use crate::ctl::{Conn, Listener};
use anyhow::{Context, Result};
use crossbeam_channel::{bounded, select, tick, unbounded, Receiver, Sender};
use proto::ctl::{
    self, ClientResources, DeviceInfo, Request, Response, MAX_MESSAGE, PROTOCOL_VERSION,
};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, info, warn};

/// How often addresses of `--netdev` interfaces are re-read.
const NETDEV_RESCAN: Duration = Duration::from_secs(2);

/// Messages to the core thread.
enum CoreMsg {
    Connect {
        pid: u32,
        uid: u32,
        program: String,
        reply: Sender<u64>,
    },
    Request {
        client: u64,
        request: Request,
        reply: Sender<Response>,
    },
    Disconnect {
        client: u64,
    },
    Shutdown,
}

struct Device {
    config: DeviceConfig,
    info: DeviceInfo,
}

/// Owns devices and the resources of every client.
struct Core {
    devices: Vec<Device>,
    clients: BTreeMap<u64, ClientResources>,
    next_client: u64,
}

impl Core {
    fn handle(&mut self, client: u64, request: Request) -> Response {
        match request {
            // A second hello on the same connection is a protocol error.
            Request::Hello { .. } => Response::Error {
                errno: libc::EPROTO,
                message: "hello already received".into(),
            },
            Request::QueryDevices => {
                Response::Devices(self.devices.iter().map(|d| d.info.clone()).collect())
            }
            Request::ResShow => Response::Resources {
                devices: self.devices.iter().map(|d| d.info.name.clone()).collect(),
                clients: self
                    .clients
                    .values()
                    .filter(|c| c.client != client)
                    .cloned()
                    .collect(),
            },
            // The data path (engine, rings, packet I/O) is not wired in yet.
            _ => Response::Error {
                errno: libc::EOPNOTSUPP,
                message: "not implemented by this daemon yet".into(),
            },
        }
    }

    fn rescan_netdevs(&mut self) {
        for d in &mut self.devices {
            if d.config.netdev.is_none() {
                continue;
            }
            match config::device_info(&d.config) {
                Ok(info) if info != d.info => {
                    info!(device = %info.name, gids = info.gids.len(), "addresses changed");
                    d.info = info;
                }
                Ok(_) => {}
                Err(e) => warn!(device = %d.config.name, "cannot read addresses: {e:#}"),
            }
        }
    }

    fn run(mut self, rx: Receiver<CoreMsg>) {
        let rescan = tick(NETDEV_RESCAN);
        loop {
            select! {
                recv(rx) -> msg => match msg {
                    Ok(CoreMsg::Connect { pid, uid, program, reply }) => {
                        self.next_client += 1;
                        let id = self.next_client;
                        info!(client = id, pid, uid, %program, "client connected");
                        self.clients.insert(id, ClientResources {
                            client: id, pid, uid, program, ..Default::default()
                        });
                        let _ = reply.send(id);
                    }
                    Ok(CoreMsg::Request { client, request, reply }) => {
                        debug!(client, ?request, "request");
                        let _ = reply.send(self.handle(client, request));
                    }
                    Ok(CoreMsg::Disconnect { client }) => {
                        if let Some(c) = self.clients.remove(&client) {
                            info!(client, pid = c.pid, program = %c.program,
                                  qps = c.qps, mrs = c.mrs, "client gone; its resources are freed");
                        }
                    }
                    Ok(CoreMsg::Shutdown) | Err(_) => break,
                },
                recv(rescan) -> _ => self.rescan_netdevs(),
            }
        }
    }
}

/// Serves one client connection until it closes.
fn serve_client(conn: Conn, core: Sender<CoreMsg>, daemon_uid: u32) {
    let creds = match conn.peer_credentials() {
        Ok(c) => c,
        Err(e) => {
            warn!("client without credentials: {e:#}");
            return;
        }
    };
    let (pid, uid) = (creds.pid() as u32, creds.uid());
    let refuse = |errno: i32, message: String| {
        warn!(pid, uid, "{message}");
        if let Ok(b) = ctl::encode(&Response::Error { errno, message }) {
            let _ = conn.send(&b, &[]);
        }
    };
    // The daemon reaches client memory with process_vm_readv/writev, which the kernel allows
    // only for the same user (or a privileged daemon): refuse anyone else up front.
    if daemon_uid != 0 && uid != daemon_uid {
        refuse(
            libc::EACCES,
            format!("uid {uid} may not use a daemon running as uid {daemon_uid}"),
        );
        return;
    }
    let mut buf = vec![0u8; MAX_MESSAGE];
    let program = match conn.recv(&mut buf) {
        Ok((n, _)) if n > 0 => match ctl::decode::<Request>(&buf[..n]) {
            Ok(Request::Hello { version, program }) if version == PROTOCOL_VERSION => program,
            Ok(Request::Hello { version, .. }) => {
                return refuse(
                    libc::EPROTO,
                    format!("client speaks protocol {version}, daemon speaks {PROTOCOL_VERSION}"),
                );
            }
            _ => return refuse(libc::EPROTO, "the first message must be hello".into()),
        },
        _ => return,
    };
    let (reply_tx, reply_rx) = bounded(1);
    if core
        .send(CoreMsg::Connect {
            pid,
            uid,
            program,
            reply: reply_tx,
        })
        .is_err()
    {
        return;
    }
    let Ok(client) = reply_rx.recv() else { return };
    let hello = Response::Hello {
        version: PROTOCOL_VERSION,
        client,
    };
    let mut ok = ctl::encode(&hello)
        .ok()
        .is_some_and(|b| conn.send(&b, &[]).is_ok());
    while ok {
        let n = match conn.recv(&mut buf) {
            Ok((n, _fds)) if n > 0 => n,
            _ => break,
        };
        let response = match ctl::decode::<Request>(&buf[..n]) {
            Ok(request) => {
                let (tx, rx) = bounded(1);
                if core
                    .send(CoreMsg::Request {
                        client,
                        request,
                        reply: tx,
                    })
                    .is_err()
                {
                    break;
                }
                match rx.recv() {
                    Ok(r) => r,
                    Err(_) => break,
                }
            }
            Err(e) => Response::Error {
                errno: libc::EINVAL,
                message: format!("undecodable request: {e}"),
            },
        };
        ok = ctl::encode(&response)
            .ok()
            .is_some_and(|b| conn.send(&b, &[]).is_ok());
    }
    let _ = core.send(CoreMsg::Disconnect { client });
}

/// Runs the daemon until SIGINT or SIGTERM.
pub fn run(config: Config, socket: PathBuf) -> Result<()> {
    config.validate()?;
    let mut devices = Vec::new();
    for d in &config.devices {
        let info = config::device_info(d)?;
        info!(
            device = %d.name,
            roce = %d.roce,
            mtu = d.mtu,
            addrs = ?d.addr,
            netdev = ?d.netdev,
            "device ready"
        );
        devices.push(Device {
            config: d.clone(),
            info,
        });
    }
    let listener = Arc::new(Listener::bind(&socket)?);
    info!(socket = %socket.display(), "control socket ready");

    let (core_tx, core_rx) = unbounded();
    let core = Core {
        devices,
        clients: BTreeMap::new(),
        next_client: 0,
    };
    let core_thread = std::thread::Builder::new()
        .name("core".into())
        .spawn(move || core.run(core_rx))?;

    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .context("installing signal handlers")?;
    let stopping = Arc::new(AtomicBool::new(false));
    let stop_flag = Arc::clone(&stopping);
    let stop_core = core_tx.clone();
    let stop_listener = Arc::clone(&listener);
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                info!(signal = sig, "stopping");
                stop_flag.store(true, Ordering::SeqCst);
                let _ = stop_core.send(CoreMsg::Shutdown);
                stop_listener.shutdown();
            }
        })?;

    let daemon_uid = nix::unistd::geteuid().as_raw();
    loop {
        match listener.accept() {
            Ok(conn) => {
                let core = core_tx.clone();
                std::thread::Builder::new()
                    .name("client".into())
                    .spawn(move || serve_client(conn, core, daemon_uid))?;
            }
            Err(e) => {
                // After shutdown(2) on the listener, accept fails: that is our stop signal.
                if stopping.load(Ordering::SeqCst) || core_thread.is_finished() {
                    break;
                }
                warn!("accept failed: {e:#}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    let _ = core_tx.send(CoreMsg::Shutdown);
    let _ = core_thread.join();
    // Not left to Drop: the signal thread may still hold a reference at exit.
    let _ = std::fs::remove_file(&socket);
    drop(listener);
    info!("stopped");
    Ok(())
}
