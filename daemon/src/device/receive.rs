//! Received packets into the engines: each verified packet from the link goes to the engine
//! that owns its destination QP (QPN blocks), multicast to every engine, and QP1's MADs to the
//! CM thread. The link checked the ICRC (recovering the IPv4 Identification where the socket
//! hides it), so the engines do not compute it again.

use super::clients::{contained, ClientDev, QPN_BLOCK};
use super::DeviceThread;
use crate::fault::{Decision, FaultInjector, Way};
use crate::gsi::{deliver_gsi, gsi_payload, GsiMad};
use crate::net::{Link, RxPacket};
use proto::cm::caps::{self, Classified};
use proto::transport as tp;
use proto::Qpn;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use tracing::debug;

impl DeviceThread {
    /// Takes what the link received, waiting up to `wait`, and the packets between local QPs
    /// a fault rule held back that are due. Returns whether anything came.
    pub(super) fn receive(&mut self, wait: Duration, broken: &mut Vec<u64>) -> bool {
        let now = self.now();
        let (clients, blocks, gsi, index, naks, gsi_rcvd, drops) = (
            &mut self.clients,
            &self.blocks,
            &self.gsi,
            self.index as usize,
            &mut self.naks,
            &mut self.gsi_rcvd,
            &mut self.drops,
        );
        // Capability MADs (and the peers of CM MADs), handled once the link is done.
        let mut qp1: Vec<(std::net::IpAddr, std::net::IpAddr, tp::GidType, Classified)> =
            Vec::new();
        let delivered = self.link.poll(wait, &mut |p: &RxPacket<'_>| {
            let Some(dqpn) = p.dest_qpn() else {
                drops.no_bth += 1;
                return;
            };
            if dqpn == proto::cm::GSI_QPN {
                *gsi_rcvd += 1;
                let mad = gsi_payload(p.transport());
                let kind = mad.map_or(Classified::Other, caps::classify);
                qp1.push((p.src, p.dst, p.gid_type, kind));
                if kind != Classified::Other {
                    // softroce's capability exchange stays in the device.
                    return;
                }
                // QP1 is the GSI: CM MADs go to the CM thread.
                let Some((sink, mad)) = gsi.as_ref().zip(mad) else {
                    drops.gsi_dropped += 1;
                    return;
                };
                let mad = GsiMad {
                    device: index,
                    src: p.src,
                    dst: p.dst,
                    mad: mad.to_vec(),
                    gid_type: p.gid_type,
                };
                if !deliver_gsi(sink, mad) {
                    drops.gsi_dropped += 1;
                    debug!(src = %p.src, "CM MAD dropped: the CM thread's queue is full");
                }
            } else {
                let to = Destination {
                    dqpn,
                    bth: p.bth,
                    way: Way::Rx,
                };
                if !deliver_packet(clients, blocks, naks, now, to, p.packet, broken) {
                    drops.unknown_qp += 1;
                }
            }
        });
        let (clients, blocks, naks, drops) = (
            &mut self.clients,
            &self.blocks,
            &mut self.naks,
            &mut self.drops,
        );
        let released = self.link.release_local(&mut |frame: &[u8], bth: usize| {
            let Some(dqpn) = frame.get(bth..).and_then(crate::net::link::dest_qpn) else {
                return;
            };
            let to = Destination {
                dqpn,
                bth,
                way: Way::Local,
            };
            if !deliver_packet(clients, blocks, naks, now, to, frame, broken) {
                drops.unknown_qp += 1;
            }
        });
        for (src, dst, ty, kind) in qp1 {
            match kind {
                Classified::Other => self.warm_loss_recovery(src, dst, ty),
                mad => self.caps_mad(src, dst, ty, mad),
            }
        }
        delivered > 0 || released
    }

    /// Hands the packets queued between QPs of this device, through the link's capture and
    /// fault layers, to the engines that own their destination QPs.
    pub(super) fn deliver_local(&mut self, now: tp::Nanos, broken: &mut Vec<u64>) {
        let (clients, blocks, naks, link, drops) = (
            &mut self.clients,
            &self.blocks,
            &mut self.naks,
            &mut self.link,
            &mut self.drops,
        );
        self.local.drain_blocks(|dqpn, block, frame, bth| {
            let to = Destination {
                dqpn,
                bth,
                way: Way::Local,
            };
            link.local(block, frame, bth, &mut |f: &[u8]| {
                if !deliver_packet(clients, blocks, naks, now, to, f, broken) {
                    drops.unknown_qp += 1;
                }
            })
        });
        // What a capture completed in the queue's buffer goes to its writer with the buffer.
        self.link.capture.local_round(&mut self.local);
    }
}

/// Where a packet goes: its destination QPN, where its BTH starts, and how it came.
#[derive(Debug, Clone, Copy)]
pub(super) struct Destination {
    pub dqpn: u32,
    pub bth: usize,
    pub way: Way,
}

/// Hands a verified packet (network header onward) to the engine that owns its destination
/// QP or, for the multicast QPN, to every engine (each delivers to its own QPs attached to the
/// group, as rxe_rcv_mcast_pkt). The responder's fault rules (`naks`) may have it answered
/// with a forced NAK. Clients whose engine panicked are added to `broken`. False when no
/// client holds the destination QP.
pub(super) fn deliver_packet(
    clients: &mut BTreeMap<u64, ClientDev>,
    blocks: &HashMap<u32, u64>,
    naks: &mut FaultInjector,
    now: tp::Nanos,
    to: Destination,
    packet: &[u8],
    broken: &mut Vec<u64>,
) -> bool {
    let dqpn = to.dqpn;
    if dqpn == Qpn::MULTICAST.value() {
        for (&id, c) in clients.iter_mut() {
            // What the engine places for this packet is the destination QP's (the multicast
            // QPN names no one QP).
            c.engine.memory_mut().placing_for(dqpn);
            if contained(|| c.engine.handle_verified_packet(now, packet)).is_none() {
                broken.push(id);
            }
        }
        return true;
    }
    let Some((&id, c)) = blocks
        .get(&(dqpn / QPN_BLOCK))
        .and_then(|id| clients.get_mut(id).map(|c| (id, c)))
    else {
        debug!(qpn = dqpn, "packet for an unknown QP dropped");
        return false;
    };
    let decision = if naks.is_on() {
        naks.decide(now, to.way, packet.get(to.bth..).unwrap_or(&[]))
    } else {
        Decision::Pass
    };
    c.engine.memory_mut().placing_for(dqpn);
    let handled = match decision {
        Decision::Nak { nak, rule } => {
            contained(|| c.engine.handle_verified_packet_forcing(now, packet, nak))
                .map(|given| naks.confirm_nak(rule, given))
        }
        _ => contained(|| c.engine.handle_verified_packet(now, packet)),
    };
    if handled.is_none() {
        broken.push(id);
    }
    true
}
