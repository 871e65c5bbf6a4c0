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
//!   a small machine takes a CPU from the pollers, was most of what a capture cost). What
//!   takes a pass over every byte of a frame (an ICRC the engines never computed, the IPv6
//!   UDP checksum) the writer does ([`writer::Finish`]). A full queue (a reader that does
//!   not keep up) drops the batch and counts it: the device never waits for a capture.
//! - The writer ([`writer`]) writes the section header, one interface per device, the
//!   batches, and at the end one Interface Statistics Block per interface (packets captured
//!   and dropped), into the pipe the CLI gave.

pub mod frame;
pub mod pcapng;
pub mod writer;

pub use frame::{IpFields, UdpDatagram};
pub use pcapng::Direction;
pub use writer::CaptureShared;
use writer::Finish;

use std::sync::Arc;

/// A batch is handed to the writer once it holds this much: small enough that the batches
/// in use stay in the CPUs' caches (the device writes each frame once, the writer reads it
/// once), now that a hand-over costs no wake (256 KiB measured a few per cent slower).
const BATCH_BYTES: usize = 64 * 1024;
/// A batch's room: a full one and the largest frame after it (no reallocation).
const BATCH_CAPACITY: usize = BATCH_BYTES + 64 * 1024;
/// How long a busy device keeps a batch that is not full: a live reader
/// (`tshark -i -`) sees packets this late at most, as libpcap's buffer timeout.
pub const HOLD_NS: u64 = 5_000_000;

/// A device's end of one capture.
struct DeviceTap {
    shared: Arc<CaptureShared>,
    /// This device's interface number in the capture's stream.
    iface: u32,
    /// BTH destination QPNs to keep (empty: all): the QP asked for and, when it is
    /// connected, its peer (the destination of what it sends).
    qpns: Vec<u32>,
    batch: Vec<u8>,
    batch_packets: u64,
    /// When the batch's first packet was captured (pcapng time, ns).
    batch_since: u64,
    /// The batch's frames the writer finishes (their ICRC and checksum).
    batch_finish: Vec<Finish>,
}

impl DeviceTap {
    /// One more packet (captured at `ts`) in the batch: a full batch goes to the writer at
    /// once.
    fn packet_added(&mut self, ts: u64) {
        if self.batch_packets == 0 {
            self.batch_since = ts;
        }
        self.batch_packets += 1;
        if self.batch.len() >= BATCH_BYTES {
            self.hand_over();
        }
    }

    /// The batch goes to the writer (if it holds anything).
    fn hand_over(&mut self) {
        if self.batch_packets > 0 {
            let (bytes, finish) = self.shared.spare_batch(BATCH_CAPACITY);
            let bytes = std::mem::replace(&mut self.batch, bytes);
            let finish = std::mem::replace(&mut self.batch_finish, finish);
            self.shared.deliver(
                self.iface,
                bytes,
                finish,
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
}

impl DeviceCapture {
    pub fn new(node_guid: u64) -> DeviceCapture {
        DeviceCapture {
            taps: Vec::new(),
            mac: frame::guid_mac(node_guid),
            frame: Vec::new(),
            now: pcapng::timestamp_now(),
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
        let (batch, batch_finish) = shared.spare_batch(BATCH_CAPACITY);
        self.taps.push(DeviceTap {
            batch,
            batch_finish,
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
        // The UDP checksum (the sockets send one with GSO on) is computed here, while the
        // bytes are in this CPU's cache: left to the writer, it made the writer read every
        // byte from the other CPU, which cost more than the sum (two daemons, GSO on:
        // 0.76 of the uncaptured rate against 0.84, `bench/results/20261201T230736Z.md`).
        // The writer then never reads a datagram's bytes.
        self.record(direction, d.payload, None, |out| {
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
        let local = direction == Direction::Outbound;
        let (src_mac, dst_mac) = if local {
            (self.mac, self.mac)
        } else {
            (frame::peer_mac(src_of(packet)), self.mac)
        };
        // Most received frames need nothing more (IPv4 carries no UDP checksum here): no
        // work is queued for them.
        let finish = (local || corrupt || frame::needs_udp_checksum(packet)).then(|| Finish {
            at: 0,
            len: 0,
            seal: local,
            corrupt_at: corrupt.then_some(14 + bth as u32),
        });
        self.record(direction, transport, finish, |out| {
            frame::copy_network_frame(out, src_mac, dst_mac, packet)
        });
    }

    /// A whole Ethernet frame (a TAP device's); `bth_offset` is where its BTH starts.
    pub fn ethernet(&mut self, direction: Direction, eth_frame: &[u8], bth_offset: usize) {
        let Some(bth) = eth_frame.get(bth_offset..) else {
            return;
        };
        self.record(direction, bth, None, |out| {
            out.extend_from_slice(eth_frame);
            Some(eth_frame.len())
        });
    }

    /// Appends the frame `build` writes (whose BTH and what follows is `bth`) to every
    /// capture that wants it, to be completed by `finish` (a network frame's ICRC and
    /// checksum). With one capture, the frame is built straight into its batch and finished by
    /// the writer; with several, built once, finished and copied.
    fn record(
        &mut self,
        direction: Direction,
        bth: &[u8],
        finish: Option<Finish>,
        build: impl FnOnce(&mut Vec<u8>) -> Option<usize>,
    ) {
        let wanting = self.taps.iter().filter(|t| t.wants(bth)).count();
        if wanting == 0 {
            return;
        }
        let ts = self.now;
        if wanting == 1 {
            let Some(t) = self.taps.iter_mut().find(|t| t.wants(bth)) else {
                return;
            };
            if !t.shared.take_one() {
                return;
            }
            let snaplen = t.shared.spec().snaplen;
            let start = pcapng::begin_packet(&mut t.batch, t.iface, ts);
            let at = t.batch.len();
            let Some(len) = build(&mut t.batch) else {
                t.batch.truncate(start);
                return;
            };
            if let Some(mut f) = finish {
                (f.at, f.len) = (at as u32, len as u32);
                if snaplen != 0 && len > snaplen as usize {
                    // The snapshot cuts the frame: its end is needed now or never.
                    f.apply(&mut t.batch);
                } else {
                    t.batch_finish.push(f);
                }
            }
            pcapng::end_packet(&mut t.batch, start, direction, snaplen);
            t.packet_added(ts);
            return;
        }
        self.frame.clear();
        let Some(len) = build(&mut self.frame) else {
            return;
        };
        if let Some(mut f) = finish {
            (f.at, f.len) = (0, len as u32);
            f.apply(&mut self.frame);
        }
        for t in &mut self.taps {
            if !t.wants(bth) || !t.shared.take_one() {
                continue;
            }
            let snaplen = t.shared.spec().snaplen;
            pcapng::enhanced_packet(
                &mut t.batch,
                t.iface,
                ts,
                direction,
                &self.frame,
                snaplen,
                None,
            );
            t.packet_added(ts);
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
