//! The registry's side of the operator's commands: devices added and deleted while the
//! daemon runs (`softroce link`), and the requests it answers by asking the device threads and
//! the CM thread (`stat`, `res show KIND`, `capture`, `fault`).

use super::{ask, link_at, live_links, publish, Device, DeviceLink, Registry};
use crate::cm::{CmDeviceSetup, CmMsg};
use crate::config::{self, DeviceConfig};
use crate::device::{DevMsg, DeviceThread, OperatorMsg, HANDLE_DEVICE_SHIFT};
use crate::gsi::ToDevice;
use anyhow::{bail, Context, Result};
use crossbeam_channel::unbounded;
use proto::ctl::{DeviceFaults, DeviceStats, LinkInfo, Request, ResDetail, ResKind, Response};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;
use tracing::info;

/// How long the registry waits for a device thread's answer.
const DEVICE_ANSWER: Duration = Duration::from_secs(5);

/// The requests this module serves.
pub fn is_operator_request(r: &Request) -> bool {
    matches!(
        r,
        Request::LinkAdd { .. }
            | Request::LinkDel { .. }
            | Request::LinkSet { .. }
            | Request::LinkShow
            | Request::Stat { .. }
            | Request::ResDetail { .. }
            | Request::CaptureStart { .. }
            | Request::FaultAdd { .. }
            | Request::FaultClear { .. }
            | Request::FaultShow { .. }
    )
}

fn failure(errno: i32, message: impl Into<String>) -> Response {
    Response::Error {
        errno,
        message: message.into(),
    }
}

/// Asks a device thread and waits (boundedly) for its answer.
fn ask_device<R>(
    link: &DeviceLink,
    make: impl FnOnce(crossbeam_channel::Sender<R>) -> OperatorMsg,
) -> Option<R> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    if !link.send(DevMsg::Operator(make(tx))) {
        return None;
    }
    rx.recv_timeout(DEVICE_ANSWER).ok()
}

impl Registry {
    /// Starts a device's thread and tells the CM thread; its index is the next unused one.
    pub(super) fn start_device(&mut self, cfg: DeviceConfig) -> Result<()> {
        cfg.validate()?;
        let rules = cfg
            .fault
            .iter()
            .map(|f| f.rule())
            .collect::<Result<Vec<_>>>()
            .with_context(|| format!("device {}", cfg.name))?;
        let index = self.links.read().map(|l| l.len()).unwrap_or(usize::MAX);
        // The index rides in the top bits of every handle.
        if index >= 1 << (32 - HANDLE_DEVICE_SHIFT) {
            bail!("no device index left (a daemon serves at most 256 devices over its life)");
        }
        let info = config::device_info(&cfg)?;
        let (tx, rx) = unbounded();
        let mut thread = DeviceThread::new(
            index,
            Arc::clone(&self.factory.qpn_blocks),
            &cfg,
            info.clone(),
            rx,
            self.factory.port,
        )?;
        thread.set_gsi_sink(self.factory.gsi.clone());
        let neighbours = thread.neighbour_board();
        let wake = Arc::new(thread.wake_fd()?);
        info!(
            device = %cfg.name,
            roce = %cfg.roce,
            mtu = cfg.mtu,
            loss_recovery = %cfg.loss_recovery,
            addrs = ?cfg.addr,
            netdev = ?cfg.netdev,
            tap = ?cfg.tap,
            "device ready"
        );
        self.factory.threads.push(
            std::thread::Builder::new()
                .name(format!("dev-{}", cfg.name))
                .spawn(move || thread.run())?,
        );
        let link = DeviceLink {
            name: cfg.name.clone(),
            tx,
            wake,
        };
        for rule in rules {
            link.send(DevMsg::Operator(OperatorMsg::FaultAdd(rule)));
        }
        let gsi_link = link.clone();
        let send: crate::gsi::DeviceSender = Box::new(move |m| {
            gsi_link.send(match m {
                ToDevice::Mad(mad) => DevMsg::SendGsi(mad),
                ToDevice::Solicit(peer) => DevMsg::SolicitNeighbour(peer),
            })
        });
        let _ = self.cm.send(CmMsg::AddDevice {
            device: index,
            setup: CmDeviceSetup {
                info: info.clone(),
                default_roce_mode: cfg.cm_roce_mode(),
                cm_response_timeout: cfg.cm_response_timeout,
                cm_max_retries: cfg.cm_max_retries,
                kernel_routes: cfg.tap.is_none(),
                neighbours,
            },
            send,
        });
        if let Ok(mut l) = self.links.write() {
            l.push(Some(link));
        }
        self.devices.push(Some(Device::new(cfg, info)));
        Ok(())
    }

    /// `softroce link set NAME up|down`: the operator's side of the port state; the port is
    /// up only while the configuration's side (addresses, the netdev's carrier) is up too.
    pub(super) fn set_link(&mut self, name: &str, up: bool) -> Response {
        let Some(index) = self.index_of(name) else {
            return failure(libc::ENODEV, format!("no device named {name}"));
        };
        let (Some(d), Some(link)) = (
            self.devices.get_mut(index).and_then(Option::as_mut),
            link_at(&self.links, index),
        ) else {
            return failure(libc::ENODEV, format!("no device named {name}"));
        };
        // A netdev that cannot be read now (gone) leaves the last description; down works
        // whatever the netdev does.
        if d.config.tap.is_some() {
            link.send(DevMsg::Carrier(up));
        }
        let mut info = config::device_info(&d.config).unwrap_or_else(|_| d.info.clone());
        proto::ctl::keep_gid_indices(&d.info.gids, &mut info.gids);
        d.admin_down = !up;
        info.port_active &= up;
        if info != d.info {
            info!(device = %name, port_active = info.port_active, "link set {}",
                  if up { "up" } else { "down" });
            publish(&self.cm, index, d, &link, info);
        }
        Response::Done
    }

    fn index_of(&self, name: &str) -> Option<usize> {
        self.devices
            .iter()
            .position(|d| d.as_ref().is_some_and(|d| d.info.name == name))
    }

    /// The live devices a request names (`None`: all); an unknown name is an error.
    fn selected(&self, name: Option<&str>) -> Result<Vec<(usize, DeviceLink)>, String> {
        let all: Vec<(usize, DeviceLink)> = (0..self.devices.len())
            .filter_map(|i| link_at(&self.links, i).map(|l| (i, l)))
            .collect();
        match name {
            None => Ok(all),
            Some(n) => {
                let one: Vec<_> = all.into_iter().filter(|(_, l)| l.name == n).collect();
                if one.is_empty() {
                    Err(format!("no device named {n}"))
                } else {
                    Ok(one)
                }
            }
        }
    }

    fn comm_of(&self, pid: u32) -> String {
        self.clients
            .values()
            .find(|c| c.pid == pid)
            .map(|c| c.program.clone())
            .unwrap_or_default()
    }

    pub(super) fn operator(
        &mut self,
        client: u64,
        request: Request,
        mut fds: Vec<OwnedFd>,
    ) -> Response {
        match request {
            Request::LinkAdd { spec, save } => {
                if self.index_of(&spec.name).is_some() {
                    return failure(libc::EEXIST, format!("a device named {} exists", spec.name));
                }
                if save && self.config_path.is_none() {
                    return failure(
                        libc::EINVAL,
                        "--save: the daemon was started without --config",
                    );
                }
                let started = DeviceConfig::from_spec(&spec).and_then(|cfg| self.start_device(cfg));
                if let Err(e) = started {
                    let in_use = e.chain().any(|c| {
                        c.downcast_ref::<std::io::Error>()
                            .is_some_and(|io| io.kind() == std::io::ErrorKind::AddrInUse)
                    });
                    let errno = if in_use {
                        libc::EADDRINUSE
                    } else {
                        libc::EINVAL
                    };
                    return failure(errno, format!("{e:#}"));
                }
                info!(device = %spec.name, "device added");
                match (save, &self.config_path) {
                    (true, Some(path)) => match config::save_added(path, &spec) {
                        Ok(()) => Response::Done,
                        Err(e) => failure(
                            libc::EIO,
                            format!("the device runs, but saving failed: {e:#}"),
                        ),
                    },
                    _ => Response::Done,
                }
            }
            Request::LinkDel { name, save } => {
                let Some(index) = self.index_of(&name) else {
                    return failure(libc::ENODEV, format!("no device named {name}"));
                };
                if save && self.config_path.is_none() {
                    return failure(
                        libc::EINVAL,
                        "--save: the daemon was started without --config",
                    );
                }
                if let Some(link) = link_at(&self.links, index) {
                    link.send(DevMsg::Remove);
                }
                if let Ok(mut l) = self.links.write() {
                    l[index] = None;
                }
                self.devices[index] = None;
                let _ = self.cm.send(CmMsg::RemoveDevice { device: index });
                info!(device = %name, "device deleted");
                match (save, &self.config_path) {
                    (true, Some(path)) => match config::save_removed(path, &name) {
                        Ok(()) => Response::Done,
                        Err(e) => failure(
                            libc::EIO,
                            format!("the device is gone, but saving failed: {e:#}"),
                        ),
                    },
                    _ => Response::Done,
                }
            }
            Request::LinkSet { name, up } => self.set_link(&name, up),
            Request::LinkShow => Response::Links(self.link_infos()),
            Request::Stat { device, qpn } => {
                let selected = match self.selected(device.as_deref()) {
                    Ok(s) => s,
                    Err(e) => return failure(libc::ENODEV, e),
                };
                let mut out: Vec<DeviceStats> = Vec::new();
                for (_, link) in selected {
                    if let Some(mut st) =
                        ask_device(&link, |reply| OperatorMsg::Stats { qpn, reply })
                    {
                        for q in &mut st.qps {
                            q.comm = self.comm_of(q.pid);
                        }
                        out.push(st);
                    }
                }
                Response::Stats(out)
            }
            Request::ResDetail { kind } => {
                let mut all = ResDetail::default();
                if kind == ResKind::CmId {
                    if let Some(ids) = ask(|reply| self.cm.send(CmMsg::ListIds { reply }).is_ok()) {
                        for (owner, mut row) in ids {
                            if let Some(c) = self.clients.get(&owner) {
                                row.owner.pid = c.pid;
                                row.owner.comm = c.program.clone();
                            }
                            all.cm_ids.push(row);
                        }
                    }
                    return Response::ResDetail(all);
                }
                for link in live_links(&self.links) {
                    let Some(d) = ask_device(&link, |reply| OperatorMsg::Resources { kind, reply })
                    else {
                        continue;
                    };
                    all.qps.extend(d.qps);
                    all.cqs.extend(d.cqs);
                    all.mrs.extend(d.mrs);
                    all.pds.extend(d.pds);
                    all.srqs.extend(d.srqs);
                }
                let comm = |pid: u32| self.comm_of(pid);
                all.qps
                    .iter_mut()
                    .for_each(|r| r.owner.comm = comm(r.owner.pid));
                all.cqs
                    .iter_mut()
                    .for_each(|r| r.owner.comm = comm(r.owner.pid));
                all.mrs
                    .iter_mut()
                    .for_each(|r| r.owner.comm = comm(r.owner.pid));
                all.pds
                    .iter_mut()
                    .for_each(|r| r.owner.comm = comm(r.owner.pid));
                all.srqs
                    .iter_mut()
                    .for_each(|r| r.owner.comm = comm(r.owner.pid));
                Response::ResDetail(all)
            }
            Request::CaptureStart { spec } => {
                // The stream's descriptor, then the one its end is reported on.
                let mut given = std::mem::take(&mut fds).into_iter();
                let (Some(out), done) = (given.next(), given.next()) else {
                    return failure(
                        libc::EINVAL,
                        "CaptureStart needs the descriptor to write into",
                    );
                };
                let selected = match self.selected(spec.device.as_deref()) {
                    Ok(s) if !s.is_empty() => s,
                    Ok(_) => return failure(libc::ENODEV, "the daemon serves no device"),
                    Err(e) => return failure(libc::ENODEV, e),
                };
                let names: Vec<String> = selected.iter().map(|(_, l)| l.name.clone()).collect();
                let shared = crate::capture::writer::start(spec, names.clone(), out, done);
                for (iface, (_, link)) in selected.iter().enumerate() {
                    link.send(DevMsg::Operator(OperatorMsg::Capture {
                        shared: Arc::clone(&shared),
                        iface: iface as u32,
                    }));
                }
                self.captures.entry(client).or_default().push(shared);
                Response::CaptureStarted { interfaces: names }
            }
            Request::FaultAdd { device, rule } => match self.selected(Some(&device)) {
                Ok(s) => {
                    for (_, link) in s {
                        link.send(DevMsg::Operator(OperatorMsg::FaultAdd(rule)));
                    }
                    Response::Done
                }
                Err(e) => failure(libc::ENODEV, e),
            },
            Request::FaultClear { device } => match self.selected(Some(&device)) {
                Ok(s) => {
                    for (_, link) in s {
                        link.send(DevMsg::Operator(OperatorMsg::FaultClear));
                    }
                    Response::Done
                }
                Err(e) => failure(libc::ENODEV, e),
            },
            Request::FaultShow { device } => match self.selected(device.as_deref()) {
                Ok(s) => Response::Faults(
                    s.into_iter()
                        .filter_map(|(_, link)| {
                            let rules =
                                ask_device(&link, |reply| OperatorMsg::FaultShow { reply })?;
                            Some(DeviceFaults {
                                device: link.name.clone(),
                                rules,
                            })
                        })
                        .collect(),
                ),
                Err(e) => failure(libc::ENODEV, e),
            },
            _ => failure(libc::EINVAL, "not an operator request"),
        }
    }

    /// Every live device as `softroce link show` presents it.
    fn link_infos(&self) -> Vec<LinkInfo> {
        let mut out = Vec::new();
        for (index, d) in self.devices.iter().enumerate() {
            let Some(d) = d else { continue };
            let Some(link) = link_at(&self.links, index) else {
                continue;
            };
            let clients = {
                let (tx, rx) = crossbeam_channel::bounded(1);
                if link.send(DevMsg::Stats { reply: tx }) {
                    rx.recv_timeout(DEVICE_ANSWER).map_or(0, |s| s.len() as u32)
                } else {
                    0
                }
            };
            let peers = {
                let (tx, rx) = crossbeam_channel::bounded(1);
                if link.send(DevMsg::Peers { reply: tx }) {
                    rx.recv_timeout(DEVICE_ANSWER).unwrap_or_default()
                } else {
                    Vec::new()
                }
            };
            let addrs = d.info.gid_addrs();
            let port = self.factory.port;
            let transport = if let Some(tap) = &d.config.tap {
                // The L2 device: whole frames on its TAP, RoCE v1 (Ethertype 0x8915) and/or
                // v2 framed by the daemon itself.
                vec![format!(
                    "tap {tap} (ethernet {}, roce {})",
                    crate::config::tap_mac(&d.config),
                    d.config.roce
                )]
            } else if d.config.netdev.is_some() {
                vec![format!(
                    "udp *:{port} (following {})",
                    d.info.netdevs.join(", ")
                )]
            } else {
                let mut t: Vec<String> = addrs
                    .iter()
                    .filter(|a| a.is_ipv4())
                    .take(1)
                    .chain(addrs.iter().filter(|a| a.is_ipv6()).take(1))
                    .map(|a| format!("udp {}", std::net::SocketAddr::new(*a, port)))
                    .collect();
                if t.is_empty() {
                    t.push("none".into());
                }
                t
            };
            let name = &d.info.name;
            let follows = d.config.netdev.as_ref().or(d.config.tap.as_ref());
            let down_because = match (follows, d.info.port_active) {
                (_, true) => None,
                _ if d.admin_down => Some(format!(
                    "set down by the operator (`softroce link set {name} up` brings it back)"
                )),
                (Some(n), _) if !config::netdev_running(n) => Some(format!(
                    "its netdev {n} is down or has no carrier (`ip link set {n} up`, and a cable or peer)"
                )),
                _ => Some(format!(
                    "it has no address to serve (give it one: `softroce link add {name} addr ADDR`, or an address on its netdev)"
                )),
            };
            out.push(LinkInfo {
                state: if d.info.port_active { "ACTIVE" } else { "DOWN" }.into(),
                down_because,
                addrs,
                modes: d.config.roce.gid_types().to_vec(),
                default_roce_mode: d.config.cm_roce_mode(),
                mtu: d.config.mtu,
                congestion_control: d.config.cc.name().into(),
                transport,
                gso: d.config.gso,
                local_via_socket: d.config.local_via_socket,
                clients,
                peers,
                info: d.info.clone(),
            });
        }
        out
    }
}
