//! The engines' timers and packets out. Packets for another host go to the link; packets
//! between two QPs of this device go from engine to engine ([`crate::net::LocalFrames`], as rxe's
//! loopback: a UDP datagram costs ~5 µs of kernel time each way), unless `local_via_socket`
//! sends them through the link so a capture sees them.

use super::clients::contained;
use super::completions::deliver_completions;
use super::receive::{deliver_packet, Destination};
use super::work_requests::retry_pending;
use super::DeviceThread;
use crate::net::link::dest_qpn;
use crate::net::Link;

use proto::transport as tp;

/// Bytes of packets between local QPs taken from the engines before they are delivered.
const LOCAL_BATCH_BYTES: usize = 256 * 1024;
/// Transmit-and-deliver rounds per pump for packets between local QPs.
const LOCAL_ROUNDS: usize = 4;

impl DeviceThread {
    /// Runs the engines' due timers, takes every packet they have to send, and delivers the
    /// completions that result. Returns whether anything happened.
    ///
    /// A round stops taking packets once [`LOCAL_BATCH_BYTES`] of them wait for local QPs,
    /// delivers those, and goes again, so that the answers and completions they cause leave
    /// in the same pump.
    pub(super) fn transmit(&mut self, broken: &mut Vec<u64>) -> bool {
        let mut busy = false;
        let now = self.now();
        let index = self.index;
        // Multicast frames the engines sent, kept for the device's own attached QPs:
        // (frame, offset of its BTH).
        let mut local_mcast: Vec<(Vec<u8>, usize)> = Vec::new();
        let via_socket = self.local_via_socket;
        self.fast.prune_retired();
        // A capture that can lays its blocks around the packets between local QPs where the
        // engines write them (`capture::DeviceCapture::local_packet`), and the engines seal
        // those packets meanwhile: the ICRC a capture shows, which nothing else needs for
        // local packets, computed by the pass that copies the payload out of the client's
        // memory (`ProcMem::lend`) instead of a pass of its own. Packets to other hosts the
        // link seals for the headers its socket writes: the engines leave them alone.
        self.local
            .set_capture_room(self.link.capture.in_place() && !via_socket);
        let seal = self.local.capture_room();
        for round in 0..LOCAL_ROUNDS {
            let (link, gids, local, local_mcast, fast) = (
                &mut self.link,
                &self.gids,
                &mut self.local,
                &mut local_mcast,
                &self.fast,
            );
            for (&id, c) in self.clients.iter_mut() {
                let fenced = fast.fenced(id);
                let outcome = contained(|| {
                    let mut busy = false;
                    if round == 0 && c.engine.poll_timeout().is_some_and(|t| t <= now) {
                        c.engine.handle_timeout(now);
                        busy = true;
                    }
                    c.engine.set_seal_icrc(seal);
                    if seal {
                        c.engine.set_seal_only_to(Some(gids));
                    }
                    c.settle(true);
                    // Work that waited for room in the engine.
                    busy |= retry_pending(c);
                    // Frames are written straight into the local queue; the ones for other
                    // hosts are moved to the link from there.
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
                            link.send(room, &t);
                        }
                    }
                    c.settle(false);
                    busy | deliver_completions(c, index, &fenced)
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
            self.deliver_local(now, broken);
        }
        // The receivers' completions go out on the next round.
        busy |= !local_mcast.is_empty();
        for (frame, bth) in &local_mcast {
            if let Some(dqpn) = frame.get(*bth..).and_then(dest_qpn) {
                let (clients, blocks, naks) = (&mut self.clients, &self.blocks, &mut self.naks);
                let to = Destination {
                    dqpn,
                    bth: *bth,
                    way: crate::fault::Way::Local,
                };
                let _ = deliver_packet(clients, blocks, naks, now, to, frame, broken);
            }
        }
        busy
    }
}
