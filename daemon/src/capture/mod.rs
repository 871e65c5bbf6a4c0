//! Live capture inside the daemon (`softroce capture`): every packet a device sends and
//! receives, as whole Ethernet frames in a pcapng stream, as smoltcp's `phy::PcapWriter`
//! wraps a device.
//!
//! - Each device thread holds a [`DeviceCapture`]: the captures listening to it. Off (no
//!   capture), each packet costs one test of an empty list. On, the packet I/O hands it every
//!   packet where it really crosses the device: UDP datagrams as sent (each GSO segment with
//!   the Identification it was sealed for) and as received (each GRO piece), the packets
//!   handed from engine to engine between two QPs of the device (which no socket ever sees),
//!   and whole frames on a TAP. [`frame`] rebuilds the headers the socket does not show.
//! - Frames matching a capture's filter become Enhanced Packet Blocks in the device's batch
//!   for it. A batch goes to the capture's writer thread through a bounded queue when it is
//!   full, when it has waited [`HOLD_NS`], or before the device sleeps; the writer polls the
//!   queue, so a hand-over wakes no thread (a wake per round of a busy device loop, which on
//!   a small machine takes a CPU from the pollers, was most of what a capture cost). Each
//!   frame is built straight into the batch, complete: the UDP checksums are summed by the
//!   device thread right after the copy, while the bytes are in its L1 cache ([`frame`]). A
//!   full queue (a reader that does not keep up) drops the batch and counts it: the device
//!   never waits for a capture.
//! - Packets between two QPs of the device are not copied at all. While one capture listens
//!   and keeps whole frames, the engines seal them (the ICRC computed by the pass that copies
//!   the payload out of the client's memory) and the device's queue of them
//!   ([`crate::net::LocalFrames`]) leaves room around each; the capture writes its
//!   Ethernet header and Enhanced Packet Block there ([`DeviceCapture::local_packet`]), and
//!   at the end of the round the queue's buffer itself goes to the writer with the ranges to
//!   write ([`DeviceCapture::local_round`]), the queue going on in one the writer gave back.
//!   On one daemon a copy of every packet was most of what a capture cost.
//! - The writer never reads a frame: one that read the batches (to finish them) pulled their
//!   cache lines to its CPU, and the device paid for it when it wrote them again.
//! - The writer ([`writer`]) writes the section header, one interface per device, the
//!   batches, and at the end one Interface Statistics Block per interface (packets captured
//!   and dropped), into the file, stdout or pipe the CLI gave.

pub mod frame;
pub mod pcapng;
pub mod writer;

pub use frame::{IpFields, UdpDatagram};
pub use pcapng::Direction;
pub use writer::CaptureShared;

use crate::net::LocalFrames;
use std::ops::Range;
use std::sync::Arc;

/// A batch is handed to the writer once it holds this much: small enough that the batches
/// in use stay in the device CPU's cache, now that a hand-over costs no wake (256 KiB
/// measured a few per cent slower).
const BATCH_BYTES: usize = 64 * 1024;
/// A batch's room: a full one and a frame of the largest MTU after it (a larger one grows
/// it). A batch is zeroed once, when it is made, and keeps its length for ever after (the
/// writer is told how much of it is used): frames are written into bytes that exist, never
/// appended to a `Vec` that would zero them first.
const BATCH_CAPACITY: usize = BATCH_BYTES + 8 * 1024;
/// How long a busy device keeps a batch that is not full: a live reader
/// (`tshark -i -`) sees packets this late at most, as libpcap's buffer timeout.
pub const HOLD_NS: u64 = 5_000_000;

/// The room a capture needs in front of a packet between two QPs of the device to lay its
/// block around it where it lies ([`DeviceCapture::local_packet`]): the Enhanced Packet
/// Block's header and the Ethernet header.
pub const ROOM_BEFORE: usize = pcapng::PACKET_BLOCK_HEAD + 14;

/// The length of the block around a network-layer packet of `len` bytes, completed in place.
pub const fn block_len_around(len: usize) -> usize {
    pcapng::packet_block_len(14 + len)
}

/// A device's end of one capture.
struct DeviceTap {
    shared: Arc<CaptureShared>,
    /// This device's interface number in the capture's stream.
    iface: u32,
    /// BTH destination QPNs to keep (empty: all): the QP asked for and, when it is
    /// connected, its peer (the destination of what it sends).
    qpns: Vec<u32>,
    /// The batch being filled: its first `batch_used` bytes are whole blocks.
    batch: Vec<u8>,
    batch_used: usize,
    batch_packets: u64,
    /// When the batch's first packet was captured (pcapng time, ns).
    batch_since: u64,
}

impl DeviceTap {
    /// The next `len` bytes of the batch, to write a block into (the batch grows, zeroed,
    /// only for a block larger than its room).
    fn room(&mut self, len: usize) -> &mut [u8] {
        let end = self.batch_used + len;
        if self.batch.len() < end {
            self.batch.resize(end, 0);
        }
        &mut self.batch[self.batch_used..end]
    }

    /// A block of `len` bytes was written at the end of the batch, holding one more packet
    /// (captured at `ts`): a full batch goes to the writer at once.
    fn packet_added(&mut self, len: usize, ts: u64) {
        if self.batch_packets == 0 {
            self.batch_since = ts;
        }
        self.batch_used += len;
        self.batch_packets += 1;
        if self.batch_used >= BATCH_BYTES {
            self.hand_over();
        }
    }

    /// The batch goes to the writer (if it holds anything).
    fn hand_over(&mut self) {
        if self.batch_packets > 0 {
            let bytes = std::mem::replace(&mut self.batch, self.shared.spare_batch(BATCH_CAPACITY));
            self.shared.deliver(
                self.iface,
                bytes,
                std::mem::take(&mut self.batch_used),
                std::mem::take(&mut self.batch_packets),
            );
        }
    }

    fn wants(&self, bth: &[u8]) -> bool {
        let spec = self.shared.spec();
        if let Some(op) = spec.opcode {
            if bth.first() != Some(&op) {
                return false;
            }
        }
        if !self.qpns.is_empty() {
            let Some(q) = bth.get(5..8) else { return false };
            let dqpn = u32::from_be_bytes([0, q[0], q[1], q[2]]);
            if !self.qpns.contains(&dqpn) {
                return false;
            }
        }
        true
    }
}

/// The captures listening to one device.
#[derive(Default)]
pub struct DeviceCapture {
    taps: Vec<DeviceTap>,
    /// The device's MAC (from its node GUID), for its side of each frame.
    mac: [u8; 6],
    /// The frame being built, reused.
    frame: Vec<u8>,
    /// The time stamped on what is captured now (pcapng time, ns): read once per round of
    /// the device loop ([`DeviceCapture::tick`]), not per packet, as a NIC stamps a burst.
    now: u64,
    /// A round of packets between local QPs has blocks completed in place: the batch was
    /// handed over before the first, and what is copied into it from now on follows the
    /// round's buffer.
    round_open: bool,
}

impl DeviceCapture {
    pub fn new(node_guid: u64) -> DeviceCapture {
        DeviceCapture {
            taps: Vec::new(),
            mac: frame::guid_mac(node_guid),
            frame: Vec::new(),
            now: pcapng::timestamp_now(),
            round_open: false,
        }
    }

    /// A new round of the device loop: the clock is read for what it captures next.
    #[inline]
    pub fn tick(&mut self) {
        if self.is_on() {
            self.now = pcapng::timestamp_now().max(self.now);
        }
    }

    /// Whether any capture listens: the packet I/O asks before building anything.
    #[inline]
    pub fn is_on(&self) -> bool {
        !self.taps.is_empty()
    }

    /// Starts feeding `shared` as its interface `iface`; `qpns` are the BTH destination QPNs
    /// its QP filter means on this device.
    pub fn attach(&mut self, shared: Arc<CaptureShared>, iface: u32, qpns: Vec<u32>) {
        self.now = pcapng::timestamp_now().max(self.now);
        self.taps.push(DeviceTap {
            batch: shared.spare_batch(BATCH_CAPACITY),
            batch_used: 0,
            shared,
            iface,
            qpns,
            batch_packets: 0,
            batch_since: 0,
        });
    }

    /// A UDP datagram the device sent (`Outbound`) or received (`Inbound`).
    pub fn datagram(&mut self, direction: Direction, d: &UdpDatagram<'_>) {
        let (src_mac, dst_mac) = match direction {
            Direction::Outbound => (self.mac, frame::peer_mac(d.dst.ip())),
            Direction::Inbound => (frame::peer_mac(d.src.ip()), self.mac),
        };
        // The UDP checksum (the sockets send one with GSO on) is computed here, by the pass
        // that copies the bytes: left to the writer, it made the writer read every byte from
        // the other CPU, which cost more than the sum (two daemons, GSO on: 0.76 of the
        // uncaptured rate against 0.84, `bench/results/20261201T230736Z.md`).
        let Some(len) = frame::udp_frame_len(d) else {
            return;
        };
        self.record(direction, d.payload, len, |out| {
            frame::udp_frame(out, src_mac, dst_mac, d)
        });
    }

    /// A network-layer packet as the engine speaks it, BTH at `bth`: one received from the
    /// link (`Inbound`, ICRC verified) or one handed between two QPs of this device
    /// (`Outbound`, shown once; its ICRC was never computed, so it is here). With `corrupt`,
    /// one bit is flipped after sealing, as a fault layer broke it.
    pub fn packet(&mut self, direction: Direction, packet: &[u8], bth: usize, corrupt: bool) {
        let Some(transport) = packet.get(bth..) else {
            return;
        };
        let Some(len) = frame::network_frame_len(packet) else {
            return;
        };
        let local = direction == Direction::Outbound;
        let (src_mac, dst_mac) = if local {
            (self.mac, self.mac)
        } else {
            (frame::peer_mac(src_of(packet)), self.mac)
        };
        self.record(direction, transport, len, |out| {
            frame::network_frame(out, src_mac, dst_mac, packet, local)?;
            if corrupt {
                crate::fault::corrupt(out.get_mut(14 + bth..)?);
            }
            Some(())
        });
    }

    /// Whether packets between two QPs of the device can be captured where they lie
    /// ([`DeviceCapture::local_packet`]): one capture listens, and it keeps whole frames.
    pub fn in_place(&self) -> bool {
        matches!(&self.taps[..], [t] if t.shared.spec().snaplen == 0 && !t.shared.is_finished())
    }

    /// A packet between two QPs of this device at `block[frame]` (BTH at `bth` in it), on
    /// its way to the receiving engine. When the frame has its block's room around it
    /// ([`ROOM_BEFORE`], [`block_len_around`]) and [`DeviceCapture::in_place`] holds, a
    /// capture that wants it completes the frame (its Ethernet header: the engine sealed the
    /// packet) and its block where they lie, and true says so: the block goes to the writer
    /// with the round's buffer ([`DeviceCapture::local_round`]), and the packet's bytes are
    /// never copied for the capture. Otherwise it is captured as [`DeviceCapture::packet`]
    /// does, copied.
    pub fn local_packet(&mut self, block: &mut [u8], frame: Range<usize>, bth: usize) -> bool {
        let len = frame.len();
        let room = frame.start == ROOM_BEFORE && block.len() == block_len_around(len);
        if !room || !self.in_place() {
            if let Some(f) = block.get(frame) {
                self.packet(Direction::Outbound, f, bth, false);
            }
            return false;
        }
        let (mac, ts) = (self.mac, self.now);
        let Some(t) = self.taps.first_mut() else {
            return false;
        };
        let Some(transport) = block.get(frame.start + bth..frame.end) else {
            return false;
        };
        if !t.wants(transport) || !t.shared.take_one() {
            return false;
        }
        if !self.round_open {
            // What the batch holds came before this packet, and goes to the writer before
            // the round's buffer; what is copied during the round (a duplicate's second
            // packet) comes after it, in the next batch, as it followed on the wire.
            t.hand_over();
            self.round_open = true;
        }
        // The engine sealed the packet as it wrote it (engines seal while a queue leaves room
        // for a capture: `DeviceThread::transmit`).
        let eth = &mut block[ROOM_BEFORE - 14..frame.end];
        if frame::complete_in_place(eth, mac, mac).is_none() {
            return false;
        }
        pcapng::packet_block(block, t.iface, ts, Direction::Outbound, 14 + len, 14 + len);
        true
    }

    /// The end of a round of packets between local QPs: when the capture completed blocks in
    /// the round's buffer, the buffer goes to the writer (after the batch that held what was
    /// captured before the round: [`DeviceCapture::local_packet`] handed it over), and
    /// `frames` goes on in a buffer the writer gave back.
    pub fn local_round(&mut self, frames: &mut LocalFrames) {
        self.round_open = false;
        if !frames.has_captured() {
            return;
        }
        let Some(t) = self.taps.first_mut() else {
            return;
        };
        if let Ok(round) = frames.take_captured(t.shared.spare_frames()) {
            t.shared
                .deliver_blocks(t.iface, round.data, round.blocks, round.packets);
        }
    }

    /// A whole Ethernet frame (a TAP device's); `bth_offset` is where its BTH starts.
    pub fn ethernet(&mut self, direction: Direction, eth_frame: &[u8], bth_offset: usize) {
        let Some(bth) = eth_frame.get(bth_offset..) else {
            return;
        };
        self.record(direction, bth, eth_frame.len(), |out| {
            out.copy_from_slice(eth_frame);
            Some(())
        });
    }

    /// Writes the frame of `len` bytes that `build` makes (whose BTH and what follows is
    /// `bth`; `None` from `build` keeps nothing) into every capture that wants it. With one
    /// capture, the frame is built straight into its batch, inside its Enhanced Packet Block;
    /// with several, built once and copied.
    fn record(
        &mut self,
        direction: Direction,
        bth: &[u8],
        len: usize,
        build: impl FnOnce(&mut [u8]) -> Option<()>,
    ) {
        let wanting = self.taps.iter().filter(|t| t.wants(bth)).count();
        if wanting == 0 {
            return;
        }
        let ts = self.now;
        let cut = |snaplen: u32| match snaplen as usize {
            0 => len,
            n => len.min(n),
        };
        if wanting == 1 {
            let Some(t) = self.taps.iter_mut().find(|t| t.wants(bth)) else {
                return;
            };
            if !t.shared.take_one() {
                return;
            }
            let (iface, captured) = (t.iface, cut(t.shared.spec().snaplen));
            let block_len = pcapng::packet_block_len(captured);
            // The whole frame is built, then the block's end is laid over what a snapshot
            // length cuts off.
            let head = pcapng::PACKET_BLOCK_HEAD;
            let room = t.room(block_len.max(head + len));
            if build(&mut room[head..head + len]).is_none() {
                return;
            }
            pcapng::packet_block(&mut room[..block_len], iface, ts, direction, captured, len);
            t.packet_added(block_len, ts);
            return;
        }
        self.frame.resize(len, 0);
        if build(&mut self.frame).is_none() {
            return;
        }
        for t in &mut self.taps {
            if !t.wants(bth) || !t.shared.take_one() {
                continue;
            }
            let (iface, captured) = (t.iface, cut(t.shared.spec().snaplen));
            let block_len = pcapng::packet_block_len(captured);
            let room = t.room(block_len);
            let head = pcapng::PACKET_BLOCK_HEAD;
            room[head..head + captured].copy_from_slice(&self.frame[..captured]);
            pcapng::packet_block(room, iface, ts, direction, captured, len);
            t.packet_added(block_len, ts);
        }
    }

    /// Hands the batches that have waited [`HOLD_NS`] (or whose capture ended or took its
    /// count) to their writers and forgets the captures that ended. Called at the end of
    /// each busy round of the device loop.
    pub fn flush(&mut self) {
        if self.taps.iter().any(|t| t.batch_packets > 0) {
            let now = pcapng::timestamp_now();
            self.now = now.max(self.now);
            for t in &mut self.taps {
                let ended = t.shared.is_finished() || t.shared.budget_spent();
                if ended || now.saturating_sub(t.batch_since) >= HOLD_NS {
                    t.hand_over();
                }
            }
        }
        self.taps.retain(|t| !t.shared.is_finished());
    }

    /// Hands every batch to its writer: the device is about to sleep (or to go away), and a
    /// reader must not wait for its next packet to see this one.
    pub fn hand_over(&mut self) {
        for t in &mut self.taps {
            t.hand_over();
        }
        self.taps.retain(|t| !t.shared.is_finished());
    }

    /// The device goes away: what it captured is handed over, and each capture that listened
    /// to it ends.
    pub fn close(&mut self) {
        for t in &mut self.taps {
            t.hand_over();
        }
        for t in self.taps.drain(..) {
            t.shared.stop();
        }
    }
}

/// The source address of a network-layer packet (IPv4, IPv6 or GRH).
fn src_of(packet: &[u8]) -> std::net::IpAddr {
    match packet.first().map(|b| b >> 4) {
        Some(4) if packet.len() >= 20 => {
            std::net::Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15]).into()
        }
        _ if packet.len() >= 40 => {
            let mut a = [0u8; 16];
            a.copy_from_slice(&packet[8..24]);
            std::net::Ipv6Addr::from(a).into()
        }
        _ => std::net::Ipv4Addr::UNSPECIFIED.into(),
    }
}
