//! Received packets into the engines: each verified packet from the link goes to the engine
//! that owns its destination QP (QPN blocks), multicast to every engine, and QP1's MADs to the
//! CM thread. The link checked the ICRC (recovering the IPv4 Identification where the socket
//! hides it), so the engines do not compute it again.

use super::clients::{contained, ClientDev, QPN_BLOCK};
use super::DeviceThread;
use crate::gsi::{deliver_gsi, gsi_payload, GsiMad};
use crate::net::RxPacket;
use proto::transport as tp;
use proto::Qpn;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use tracing::debug;

impl DeviceThread {
    /// Takes what the link received, waiting up to `wait`. Returns whether anything came.
    pub(super) fn receive(&mut self, wait: Duration, broken: &mut Vec<u64>) -> bool {
        let now = self.now();
        let (clients, blocks, gsi, index, drops) = (
            &mut self.clients,
            &self.blocks,
            &self.gsi,
            self.index as usize,
            &mut self.drops,
        );
        let delivered = self.link.poll(wait, &mut |p: &RxPacket<'_>| {
            let Some(dqpn) = p.dest_qpn() else {
                drops.no_bth += 1;
                return;
            };
            if dqpn == proto::cm::GSI_QPN {
                // QP1 is the GSI: CM MADs go to the CM thread.
                let Some((sink, mad)) = gsi.as_ref().zip(gsi_payload(p.transport())) else {
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
            } else if !deliver_packet(clients, blocks, now, dqpn, p.packet, broken) {
                drops.unknown_qp += 1;
            }
        });
        delivered > 0
    }

    /// Hands the packets queued between QPs of this device to the engines that own their
    /// destination QPs.
    pub(super) fn deliver_local(&mut self, now: tp::Nanos, broken: &mut Vec<u64>) {
        let (clients, blocks) = (&mut self.clients, &self.blocks);
        self.local.drain(|dqpn, frame| {
            deliver_packet(clients, blocks, now, dqpn, frame, broken);
        });
    }
}

/// Hands a verified packet (IP header onward) to the engine that owns its destination QP or,
/// for the multicast QPN, to every engine (each delivers to its own QPs attached to the
/// group, as rxe_rcv_mcast_pkt). Clients whose engine panicked are added to `broken`.
/// Returns false when no client owns the destination QPN.
pub(super) fn deliver_packet(
    clients: &mut BTreeMap<u64, ClientDev>,
    blocks: &HashMap<u32, u64>,
    now: tp::Nanos,
    dqpn: u32,
    packet: &[u8],
    broken: &mut Vec<u64>,
) -> bool {
    let mut handle = |id: u64, c: &mut ClientDev| {
        // What the engine places for this packet is the destination QP's (the multicast
        // QPN names no one QP).
        c.engine.memory_mut().placing_for(dqpn);
        if contained(|| c.engine.handle_verified_packet(now, packet)).is_none() {
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
        return false;
    }
    true
}
