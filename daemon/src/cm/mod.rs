//! The daemon's rdma_cm: one thread that owns every rdma_cm id, event channel and bound port
//! of every client, and one [`CmEndpoint`] (the ib_cm state machine of `proto::cm`) per device.
//!
//! Why one thread and not one service per device thread: an rdma_cm id is not tied to a device
//! until it is bound or resolved, a wildcard listener serves every device, and ports are one
//! namespace per port space, as in the kernel. The device threads only carry MADs: a UD
//! SEND_ONLY to QP1 that they receive is handed here as a [`GsiMad`]; a MAD to send goes back as
//! [`GsiOut`] and leaves through the device's UDP socket like all its traffic (so
//! tcpdump and `softroce pcap check` see the CM exchange, even when the daemon talks to itself).
//!
//! Requests come from the client control threads ([`CmMsg::Request`]); events go straight to the
//! channel's socketpair as one postcard [`CmEventMsg`] datagram each, so the shim's
//! `channel->fd` behaves as the kernel's (poll, O_NONBLOCK). A client that disconnects loses
//! every id and channel it created; connected ids tell their peer (DREQ / REJ) as ib_cm does
//! when a process dies.
//!
//! The run loop ([`CmService::run`]) is the table of contents: the client threads' requests
//! and clients gone; devices added, changed and removed; received MADs and due timers into
//! the endpoints; address resolutions whose neighbour answered or whose time ran out; then
//! `drain` sends the MADs the endpoints want sent and turns what they report into rdma_cm
//! events, and the channels' waiting events are retried. Where things are:
//! - `requests`: a request's checks (the id it names is its client's) and the method that
//!   serves it; the replies' shapes; the id options (`rdma_set_option`);
//! - `ids`: what an id holds, the event channels, creating, listing and destroying them
//!   (all of a client that is gone), and the events sent to a channel's socket;
//! - `addressing`: bound ports, address and route resolution (the route and the neighbour
//!   the kernel's), listeners, multicast joins, and the address rules (which device serves an address, which listener takes a request);
//! - `handshake`: the program's side of a connection: `rdma_connect`, `rdma_accept`,
//!   `rdma_reject`, `rdma_establish` (the REQ, REP, REJ, RTU, SIDR_REQ and SIDR_REP we send);
//! - `endpoint_events`: what the endpoints report (a peer's REQ, REP, RTU, REJ, DREQ,
//!   SIDR_REQ and SIDR_REP; a connection unreachable or out of timewait) as rdma_cm events; a
//!   connection request becomes a new id, handed to the listener that takes it;
//! - `qp_attr`: `rdma_init_qp_attr`'s attributes and mask, and the AH toward an id's peer;
//! - `cm_device`: a device as the CM sees it: its addresses, its endpoint, the RoCE version of
//!   its MADs to each peer.
//!
//! Tests sit with the code they test; `test_support` holds what they share.
//!
//! [`CmEndpoint`]: proto::cm::CmEndpoint
//! [`CmEventMsg`]: proto::ctl::CmEventMsg

mod addressing;
mod cm_device;
mod endpoint_events;
mod handshake;
mod ids;
mod qp_attr;
mod requests;
#[cfg(test)]
mod test_support;

pub use cm_device::CmDeviceSetup;
pub use qp_attr::qp_mask;

use crate::gsi::{gsi_packet, DeviceSender, GsiMad, GsiOut, ToDevice};
use cm_device::CmDevice;
use crossbeam_channel::{select, Receiver, Sender};
use ids::{Channel, Id};
use proto::cm::ConnId;
use proto::ctl::{self, DeviceInfo, Request, Response, RoceVersion};
use proto::transport::GidType;
use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// Longest the thread sleeps when nothing is due (events waiting for room are retried).
const MAX_SLEEP: Duration = Duration::from_millis(200);

/// Messages to the CM thread.
pub enum CmMsg {
    Request {
        client: u64,
        request: Request,
        reply: Sender<(Response, Vec<OwnedFd>)>,
    },
    ClientGone {
        client: u64,
    },
    /// A device's addresses changed (`--netdev`).
    UpdateInfo {
        device: usize,
        info: DeviceInfo,
    },
    /// A device was added (`softroce link add`, and each configured device at start); its
    /// index is the next one.
    AddDevice {
        device: usize,
        setup: CmDeviceSetup,
        send: DeviceSender,
    },
    /// A device was deleted: it serves no address from now on.
    RemoveDevice {
        device: usize,
    },
    /// Every id, for `softroce res show cm_id`: (owning client, row).
    ListIds {
        reply: Sender<Vec<(u64, ctl::CmIdRes)>>,
    },
    /// What the received MADs did, per device (for [`Request::Counters`]).
    Counters {
        reply: Sender<Vec<proto::cm::conn::CmCounters>>,
    },
    Shutdown,
}

/// Whether a request belongs to the CM thread.
pub fn is_cm_request(r: &Request) -> bool {
    matches!(
        r,
        Request::CmCreateChannel
            | Request::CmDestroyChannel { .. }
            | Request::CmCreateId { .. }
            | Request::CmDestroyId { .. }
            | Request::CmBind { .. }
            | Request::CmResolveAddr { .. }
            | Request::CmResolveRoute { .. }
            | Request::CmListen { .. }
            | Request::CmConnect { .. }
            | Request::CmAccept { .. }
            | Request::CmReject { .. }
            | Request::CmEstablish { .. }
            | Request::CmDisconnect { .. }
            | Request::CmInitQpAttr { .. }
            | Request::CmSetOption { .. }
            | Request::CmJoinMcast { .. }
            | Request::CmLeaveMcast { .. }
            | Request::CmMigrateId { .. }
            | Request::CmQueryId { .. }
    )
}

/// The id a request names.
fn cm_id_of(r: &Request) -> Option<u32> {
    Some(match r {
        Request::CmDestroyId { id }
        | Request::CmBind { id, .. }
        | Request::CmResolveAddr { id, .. }
        | Request::CmResolveRoute { id, .. }
        | Request::CmListen { id, .. }
        | Request::CmConnect { id, .. }
        | Request::CmAccept { id, .. }
        | Request::CmReject { id, .. }
        | Request::CmEstablish { id }
        | Request::CmDisconnect { id, .. }
        | Request::CmInitQpAttr { id, .. }
        | Request::CmSetOption { id, .. }
        | Request::CmJoinMcast { id, .. }
        | Request::CmLeaveMcast { id, .. }
        | Request::CmMigrateId { id, .. }
        | Request::CmQueryId { id } => *id,
        _ => return None,
    })
}

/// Starting PSNs, comm IDs and TIDs: from the kernel's CSPRNG, so that an off-path sender
/// cannot guess a connection's PSN window (ReDMArk).
fn random_u32() -> u32 {
    crate::entropy::u32()
}

/// The CM thread's state.
pub struct CmService {
    devices: Vec<CmDevice>,
    channels: BTreeMap<u32, Channel>,
    ids: BTreeMap<u32, Id>,
    /// (device, comm ID) -> id.
    conns: HashMap<(usize, ConnId), u32>,
    /// (device, service ID) -> listeners on it.
    listens: HashMap<(usize, u64), usize>,
    next_handle: u32,
    start: Instant,
    /// Address resolutions waiting for a neighbour.
    resolving: Vec<addressing::Resolving>,
}

impl CmService {
    /// The CM of the devices in `setups`, each with the sender of its MADs to its device
    /// thread (device `i` of the service is `setups[i]`).
    pub fn new(setups: Vec<(CmDeviceSetup, DeviceSender)>) -> CmService {
        let devices = setups
            .into_iter()
            .map(|(setup, send)| CmDevice::new(setup, send))
            .collect();
        CmService {
            devices,
            channels: BTreeMap::new(),
            ids: BTreeMap::new(),
            conns: HashMap::new(),
            listens: HashMap::new(),
            next_handle: 0,
            start: Instant::now(),
            resolving: Vec::new(),
        }
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Runs until [`CmMsg::Shutdown`].
    pub fn run(mut self, rx: Receiver<CmMsg>, mads: Receiver<GsiMad>) {
        loop {
            let now = self.now();
            let due = self
                .devices
                .iter()
                .filter_map(|d| d.endpoint.poll_timeout())
                .min();
            let mut wait = match due {
                Some(t) if t <= now => Duration::ZERO,
                Some(t) => Duration::from_nanos(t - now).min(MAX_SLEEP),
                None => MAX_SLEEP,
            };
            if self.channels.values().any(|c| !c.backlog.is_empty()) {
                wait = wait.min(Duration::from_millis(5));
            }
            if let Some(t) = self.next_resolution_check() {
                wait = wait.min(t.saturating_duration_since(Instant::now()));
            }
            select! {
                recv(rx) -> msg => match msg {
                    Ok(CmMsg::Request { client, request, reply }) => {
                        let r = self.request(client, request);
                        let _ = reply.send(r);
                    }
                    Ok(CmMsg::ClientGone { client }) => self.client_gone(client),
                    Ok(CmMsg::UpdateInfo { device, info }) => {
                        if let Some(d) = self.devices.get_mut(device) {
                            d.addrs = info.gid_addrs();
                            d.setup.info = info;
                        }
                    }
                    Ok(CmMsg::AddDevice { device, setup, send }) => {
                        if device == self.devices.len() {
                            self.devices.push(CmDevice::new(setup, send));
                        } else {
                            warn!(device, "device added out of order: ignored");
                        }
                    }
                    Ok(CmMsg::RemoveDevice { device }) => {
                        if let Some(d) = self.devices.get_mut(device) {
                            // No address: no id binds, resolves or listens on it any more,
                            // and what it would send goes nowhere.
                            d.addrs.clear();
                            d.setup.info.gids.clear();
                            d.send = Box::new(|_| false);
                        }
                    }
                    Ok(CmMsg::ListIds { reply }) => {
                        let _ = reply.send(self.list_ids());
                    }
                    Ok(CmMsg::Counters { reply }) => {
                        let _ = reply.send(self.devices.iter().map(|d| d.endpoint.counters()).collect());
                    }
                    Ok(CmMsg::Shutdown) | Err(_) => return,
                },
                recv(mads) -> m => if let Ok(m) = m {
                    let now = self.now();
                    if let Some(d) = self.devices.get_mut(m.device) {
                        let version = match m.gid_type {
                            GidType::RoceV1 => RoceVersion::V1,
                            GidType::RoceV2 => RoceVersion::V2,
                        };
                        d.peer_types.insert(m.src, version);
                        if let Err(e) = d.endpoint.handle_mad(now, m.src, &m.mad) {
                            debug!(src = %m.src, "CM MAD dropped: {e}");
                        }
                    }
                },
                default(wait) => {}
            }
            let now = self.now();
            for d in &mut self.devices {
                if d.endpoint.poll_timeout().is_some_and(|t| t <= now) {
                    d.endpoint.handle_timeout(now);
                }
            }
            self.poll_resolutions();
            self.drain();
            self.flush_channels();
        }
    }

    /// Sends what the endpoints want sent and turns their events into rdma_cm events, until
    /// neither is left (handling an event may send: a REJ for a request nobody takes).
    fn drain(&mut self) {
        while self.drain_once() {}
    }

    fn drain_once(&mut self) -> bool {
        let mut any = false;
        for index in 0..self.devices.len() {
            loop {
                let d = &mut self.devices[index];
                let Some(t) = d.endpoint.poll_transmit() else {
                    break;
                };
                any = true;
                let Some(src) = d.local_for(t.peer) else {
                    warn!(peer = %t.peer, "no address of the peer's family to send a MAD from");
                    continue;
                };
                let psn = d.psn;
                d.psn = (d.psn + 1) & 0xff_ffff;
                if let Some(packet) = gsi_packet(psn, &t.mad) {
                    let gid_type = match d.mad_version(t.peer) {
                        RoceVersion::V1 => GidType::RoceV1,
                        RoceVersion::V2 => GidType::RoceV2,
                    };
                    debug!(?t, ?gid_type, "CM MAD out");
                    (d.send)(ToDevice::Mad(GsiOut {
                        src,
                        dst: t.peer,
                        packet,
                        gid_type,
                    }));
                }
            }
            while let Some(ev) = self.devices[index].endpoint.poll_event() {
                any = true;
                self.on_event(index, ev);
            }
        }
        any
    }
}

#[cfg(test)]
mod tests {
    use super::endpoint_events::MAX_BACKLOG;
    use super::test_support::*;
    use super::*;
    use proto::cm::rdma_cm::{self as rc, PortSpace};
    use proto::ctl::{cm_ps, qp_type};
    use std::net::IpAddr;

    /// Random CM MADs (valid header, random attribute and body) from the wire never panic the
    /// service, whatever listeners and connections exist.
    #[test]
    fn garbage_mads_are_survived() {
        let (mut svc, wire) = service(&["127.0.0.1"], RoceVersion::V2);
        let (ch, _fd) = channel(&mut svc, 1);
        listener(&mut svc, 1, ch, "0.0.0.0:7174");
        let u = id(&mut svc, 1, ch, cm_ps::UDP, qp_type::UD);
        ok(&mut svc, 1, bind_to(u, "0.0.0.0:7174"));
        ok(&mut svc, 1, Request::CmListen { id: u, backlog: 1 });
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let peer: IpAddr = "127.0.0.9".parse().unwrap();
        for i in 0..20_000u32 {
            let mut mad = [0u8; proto::wire::mad::MAD_LEN];
            for b in mad.iter_mut() {
                *b = next() as u8;
            }
            mad[..4].copy_from_slice(&[1, 7, 2, 3]);
            mad[16..18].copy_from_slice(&(0x10 + (i % 10) as u16).to_be_bytes());
            if i % 3 == 0 {
                // Often name the listeners' service IDs, so requests reach them.
                let sid = rc::service_id(PortSpace::Tcp, 7174).to_be_bytes();
                mad[24 + 8..24 + 16].copy_from_slice(&sid);
                // ...in REQs with an IPv4 rdma_cm header in their private data.
                mad[16..18].copy_from_slice(&0x10u16.to_be_bytes());
                mad[24 + 140] = 0;
                mad[24 + 141] = 0x40;
            }
            let now = svc.now();
            let _ = svc.devices[0].endpoint.handle_mad(now, peer, &mad);
            svc.drain();
            wire.lock().unwrap().clear();
        }
        // Unanswered requests are bounded by the listeners' backlog.
        assert!(
            svc.ids.len() > MAX_BACKLOG,
            "the flood reached the listener"
        );
        assert!(
            svc.ids.len() <= 2 * MAX_BACKLOG + 2,
            "{} ids",
            svc.ids.len()
        );
    }
}
