//! The writer thread of one capture: the pcapng stream into the file, stdout or pipe that
//! `softroce capture` handed the daemon, fed by the devices' batches and rounds.

use super::pcapng;
use crossbeam_channel::{unbounded, Receiver, Sender, TryRecvError};
use proto::ctl::CaptureSpec;
use std::io::{self, IoSlice, Write};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tracing::{debug, info};

/// Bytes of batches waiting for the writer, per capture; more are dropped (and counted). A
/// writer starved of CPU for a while (the machine busy with the very traffic it captures)
/// catches up from here.
const QUEUE_BYTES: usize = 64 << 20;

/// Written buffers of each kind kept for the devices to fill again: a new one is zeroed and
/// faults in fresh pages, which cost a busy device thread more than the copy of its frames.
/// More are freed. Between two daemons at 2 GB/s a device hands over about 30 batches of
/// 64 KiB per nap of the writer ([`NAP_IDLE`]): with 16 kept, the device thread of a captured
/// `ib_write_bw` spent 2.3-5.1 % of its time zeroing and faulting in new ones, with 64
/// 2.1-2.3 % (the rest is the kernel's own page work for the sockets; 1.7 % uncaptured; ad
/// hoc `perf`, two runs each). 64 of them are 4.6 MB per capture.
const SPARE_BATCHES: usize = 64;

/// How long the writer naps when it finds nothing to write: it polls, so that handing a
/// buffer over never wakes a thread (a futex wake and a context switch per batch, taken from
/// the pollers on a small machine, were most of what a capture cost). After a write it naps
/// [`NAP_LOCAL`] or [`NAP_IDLE`], by what it wrote, doubling up to [`NAP_IDLE`] while it
/// finds nothing.
///
/// After a round of packets between local QPs the nap is short ([`NAP_LOCAL`]), because it
/// bounds what the device has in flight: a round's buffer comes back to be filled again one
/// nap after it was handed over at most, and the device fills the one that came back last.
/// At 1 ms a busy device cycled through about 3 MB of them, which the next round found
/// evicted from its CPU's cache: the engines' frames cost more to write into them than the
/// capture itself cost. At 100 µs, about one round (256 KiB) is out at a time (ad hoc, one
/// daemon, `ib_write_bw` captured: on/off 0.64-0.71 with 1 ms against 0.74-0.83 with 50-200
/// µs, medians of five pairs). A device's batches (what it sent and received on the link)
/// are not written into again by the engines, and there the wake-ups of a short nap cost
/// more than they save (two daemons: 0.78 against 0.88): after them, [`NAP_IDLE`].
const NAP_LOCAL: std::time::Duration = std::time::Duration::from_micros(100);
const NAP_IDLE: std::time::Duration = std::time::Duration::from_millis(1);

/// How long the writer waits at the end for the batches the devices still hold.
const FINAL_GRACE: std::time::Duration = std::time::Duration::from_millis(10);

enum WriterMsg {
    /// A buffer holding `count` whole Enhanced Packet Blocks where `extent` says.
    Packets {
        bytes: Vec<u8>,
        extent: Extent,
        count: u64,
    },
    Stop,
}

/// Where a buffer's blocks are.
enum Extent {
    /// A device's batch: its first bytes, this many.
    Used(usize),
    /// A round of packets between local QPs that the capture completed in place: these
    /// ranges, in order (the frames it did not take lie between them).
    Blocks(Vec<(usize, usize)>),
}

impl Extent {
    fn bytes(&self) -> usize {
        match self {
            Extent::Used(n) => *n,
            Extent::Blocks(b) => b.iter().map(|(s, e)| e - s).sum(),
        }
    }
}

#[derive(Default)]
struct IfaceStats {
    captured: AtomicU64,
    dropped: AtomicU64,
}

/// What one capture shares between the devices it listens to and its writer.
pub struct CaptureShared {
    spec: CaptureSpec,
    /// Packets still to take (`-c COUNT`); `i64::MAX` without a count.
    budget: AtomicI64,
    finished: AtomicBool,
    ifaces: Vec<IfaceStats>,
    tx: Sender<WriterMsg>,
    /// Bytes queued for the writer and not yet written.
    queued: AtomicUsize,
    /// Batches the writer has written, for the devices to fill again: a stack, so that the
    /// batch filled next is the one written last, the likeliest to be in the device CPU's
    /// cache still (the writer never reads a batch).
    spares: Mutex<Vec<Vec<u8>>>,
    /// The same for the buffers of rounds of packets between local QPs (larger, and grown by
    /// the device as its queue needs).
    spare_frames: Mutex<Vec<Vec<u8>>>,
}

impl CaptureShared {
    pub fn spec(&self) -> &CaptureSpec {
        &self.spec
    }

    /// A batch to fill from its start: a written one back from the writer, else a new one of
    /// `capacity` zeroed bytes.
    pub(super) fn spare_batch(&self, capacity: usize) -> Vec<u8> {
        let spare = self.spares.lock().ok().and_then(|mut s| s.pop());
        spare.unwrap_or_else(|| vec![0; capacity])
    }

    /// A buffer for a device's queue of packets between local QPs: one a round used before,
    /// written and given back, else an empty one (the queue makes it as large as its last).
    pub(super) fn spare_frames(&self) -> Vec<u8> {
        let spare = self.spare_frames.lock().ok().and_then(|mut s| s.pop());
        spare.unwrap_or_default()
    }

    /// Keeps a written buffer for the devices (unless enough are kept).
    fn give_back(&self, bytes: Vec<u8>, extent: &Extent) {
        let spares = match extent {
            Extent::Used(_) => &self.spares,
            Extent::Blocks(_) => &self.spare_frames,
        };
        if let Ok(mut spares) = spares.lock() {
            if spares.len() < SPARE_BATCHES {
                spares.push(bytes);
            }
        }
    }

    /// Claims one packet of the budget; false once it is spent (or the capture ended).
    pub(super) fn take_one(&self) -> bool {
        !self.is_finished() && self.budget.fetch_sub(1, Ordering::Relaxed) > 0
    }

    /// Whether `-c COUNT` packets have been taken: what the devices hold is the end of the
    /// capture, and goes to the writer without waiting.
    pub(super) fn budget_spent(&self) -> bool {
        self.budget.load(Ordering::Relaxed) <= 0
    }

    /// Queues a batch of `count` packets of interface `iface` (its first `used` bytes) for
    /// the writer; a full queue drops it.
    pub(super) fn deliver(&self, iface: u32, bytes: Vec<u8>, used: usize, count: u64) {
        self.queue(iface, bytes, Extent::Used(used), count);
    }

    /// Queues the buffer of a round of packets between local QPs, whose `blocks` hold the
    /// `count` packets the capture completed in place, for the writer; a full queue drops it.
    pub(super) fn deliver_blocks(
        &self,
        iface: u32,
        bytes: Vec<u8>,
        blocks: Vec<(usize, usize)>,
        count: u64,
    ) {
        self.queue(iface, bytes, Extent::Blocks(blocks), count);
    }

    fn queue(&self, iface: u32, bytes: Vec<u8>, extent: Extent, count: u64) {
        let Some(stats) = self.ifaces.get(iface as usize) else {
            return;
        };
        let len = extent.bytes();
        let room = self.queued.load(Ordering::Relaxed) + len <= QUEUE_BYTES;
        let msg = WriterMsg::Packets {
            bytes,
            extent,
            count,
        };
        if room && self.tx.send(msg).is_ok() {
            self.queued.fetch_add(len, Ordering::Relaxed);
            stats.captured.fetch_add(count, Ordering::Relaxed);
        } else {
            stats.dropped.fetch_add(count, Ordering::Relaxed);
        }
    }

    /// Whether the capture is over (its count reached, its reader gone, or stopped).
    pub fn is_finished(&self) -> bool {
        self.finished.load(Ordering::Relaxed)
    }

    /// Ends the capture: the writer writes what it holds and the statistics, then closes.
    pub fn stop(&self) {
        self.finished.store(true, Ordering::Relaxed);
        let _ = self.tx.send(WriterMsg::Stop);
    }
}

/// Starts a capture of the devices `interfaces` (interface `i` of the stream is
/// `interfaces[i]`), written into `out` (the file, stdout or pipe the command gave). When it
/// ends, the writer writes `"PACKETS DROPPED\n"` into `done`, if given, and closes both: the
/// command waits for that to know the stream is whole.
pub fn start(
    spec: CaptureSpec,
    interfaces: Vec<String>,
    out: OwnedFd,
    done: Option<OwnedFd>,
) -> Arc<CaptureShared> {
    let (tx, rx) = unbounded();
    let budget = spec
        .count
        .map_or(i64::MAX, |c| c.min(i64::MAX as u64) as i64);
    let shared = Arc::new(CaptureShared {
        spec,
        budget: AtomicI64::new(budget),
        finished: AtomicBool::new(false),
        ifaces: interfaces.iter().map(|_| IfaceStats::default()).collect(),
        tx,
        queued: AtomicUsize::new(0),
        spares: Mutex::new(Vec::with_capacity(SPARE_BATCHES)),
        spare_frames: Mutex::new(Vec::with_capacity(SPARE_BATCHES)),
    });
    let writer = Arc::clone(&shared);
    let spawned = std::thread::Builder::new()
        .name("softroce-capture".into())
        .spawn(move || {
            let (written, dropped) = run(writer, interfaces, std::fs::File::from(out), rx);
            if let Some(done) = done {
                let _ = std::fs::File::from(done)
                    .write_all(format!("{written} {dropped}\n").as_bytes());
            }
        });
    if spawned.is_err() {
        shared.finished.store(true, Ordering::Relaxed);
    }
    shared
}

/// Writes the stream until the capture ends; returns the packets written and dropped.
fn run(
    shared: Arc<CaptureShared>,
    interfaces: Vec<String>,
    mut out: std::fs::File,
    rx: Receiver<WriterMsg>,
) -> (u64, u64) {
    let started = pcapng::timestamp_now();
    let snaplen = match shared.spec.snaplen {
        0 => 262_144,
        n => n,
    };
    let mut head = Vec::new();
    pcapng::section_header(&mut head, concat!("softroce ", env!("CARGO_PKG_VERSION")));
    for name in &interfaces {
        pcapng::interface_description(&mut head, name, &format!("softroce device {name}"), snaplen);
    }
    let mut written: u64 = 0;
    let mut ok = out.write_all(&head).is_ok();
    info!(devices = ?interfaces, spec = ?shared.spec, "capture started");
    let wanted = shared.spec.count;
    let mut nap = NAP_IDLE;
    while ok && wanted.is_none_or(|w| written < w) {
        match rx.try_recv() {
            Ok(WriterMsg::Packets {
                bytes,
                extent,
                count,
            }) => {
                ok = write_batch(&mut out, &bytes, &extent);
                shared.queued.fetch_sub(extent.bytes(), Ordering::Relaxed);
                written += count;
                nap = match extent {
                    Extent::Blocks(_) => NAP_LOCAL,
                    Extent::Used(_) => NAP_IDLE,
                };
                shared.give_back(bytes, &extent);
            }
            Ok(WriterMsg::Stop) | Err(TryRecvError::Disconnected) => break,
            Err(TryRecvError::Empty) if shared.is_finished() => break,
            Err(TryRecvError::Empty) => {
                std::thread::sleep(nap);
                nap = (nap * 2).min(NAP_IDLE);
                continue;
            }
        }
    }
    shared.finished.store(true, Ordering::Relaxed);
    // A device hands over the batch it holds once it sees the end, at its next round (one
    // that sleeps handed it over before sleeping): that long, and they are written too.
    std::thread::sleep(FINAL_GRACE);
    // Batches still queued (taken before the end) are written too.
    while let Ok(WriterMsg::Packets {
        bytes,
        extent,
        count,
    }) = rx.try_recv()
    {
        if ok {
            ok = write_batch(&mut out, &bytes, &extent);
            written += count;
        }
    }
    if ok {
        let mut tail = Vec::new();
        let now = pcapng::timestamp_now();
        for (i, s) in shared.ifaces.iter().enumerate() {
            pcapng::interface_statistics(
                &mut tail,
                i as u32,
                started,
                now,
                s.captured.load(Ordering::Relaxed),
                s.dropped.load(Ordering::Relaxed),
            );
        }
        let _ = out.write_all(&tail);
    } else {
        debug!("capture reader gone");
    }
    let dropped: u64 = shared
        .ifaces
        .iter()
        .map(|s| s.dropped.load(Ordering::Relaxed))
        .sum();
    info!(packets = written, dropped, "capture ended");
    (written, dropped)
}

/// Writes the blocks of a buffer; false when the reader is gone. The writer never reads a
/// buffer's bytes itself: the devices wrote every frame whole (a writer that read the
/// batches pulled their cache lines to its CPU, and the device paid for it when it wrote
/// them again).
fn write_batch(out: &mut std::fs::File, bytes: &[u8], extent: &Extent) -> bool {
    match extent {
        Extent::Used(used) => out.write_all(bytes.get(..*used).unwrap_or(bytes)).is_ok(),
        Extent::Blocks(blocks) => {
            let mut slices: Vec<IoSlice<'_>> = blocks
                .iter()
                .filter_map(|&(s, e)| bytes.get(s..e))
                .map(IoSlice::new)
                .collect();
            write_all_vectored(out, &mut slices).is_ok()
        }
    }
}

/// `Write::write_all` for several slices (one `writev` for all of them, unless the file
/// takes less).
fn write_all_vectored(out: &mut std::fs::File, mut slices: &mut [IoSlice<'_>]) -> io::Result<()> {
    IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        match out.write_vectored(slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{DeviceCapture, Direction, IpFields, UdpDatagram};
    use super::*;
    use std::io::Read;

    fn pipe() -> (std::fs::File, OwnedFd) {
        let (r, w) = nix::unistd::pipe().unwrap();
        (std::fs::File::from(r), w)
    }

    fn bth(opcode: u8, dqpn: u32) -> Vec<u8> {
        let mut b = vec![0u8; 12 + 4];
        b[0] = opcode;
        b[5..8].copy_from_slice(&dqpn.to_be_bytes()[1..]);
        b
    }

    fn datagram(payload: &[u8]) -> UdpDatagram<'_> {
        UdpDatagram {
            src: "127.0.0.1:4791".parse().unwrap(),
            dst: "127.0.0.2:4791".parse().unwrap(),
            ip: IpFields {
                tos: 0,
                ttl: 64,
                ident: 0,
                dont_frag: true,
            },
            checksum: false,
            payload,
        }
    }

    /// Reads the stream to its end: the frame of each Enhanced Packet Block.
    fn captured_frames(mut r: std::fs::File) -> Vec<Vec<u8>> {
        let mut bytes = Vec::new();
        r.read_to_end(&mut bytes).unwrap();
        let (blocks, _) = pcapng::complete_blocks(&bytes);
        blocks
            .iter()
            .filter(|b| b.0 == pcapng::BLOCK_EPB)
            .map(|(_, b)| {
                let len = u32::from_ne_bytes(b[20..24].try_into().unwrap()) as usize;
                b[28..28 + len].to_vec()
            })
            .collect()
    }

    /// Reads the stream to its end: (interfaces, EPB count, ISB dropped counts).
    fn read_all(mut r: std::fs::File) -> (usize, usize, Vec<u64>) {
        let mut bytes = Vec::new();
        r.read_to_end(&mut bytes).unwrap();
        let (blocks, used) = pcapng::complete_blocks(&bytes);
        assert_eq!(used, bytes.len(), "the stream ends with a whole block");
        let idbs = blocks.iter().filter(|b| b.0 == 1).count();
        let epbs = blocks.iter().filter(|b| b.0 == pcapng::BLOCK_EPB).count();
        let drops = blocks
            .iter()
            .filter(|b| b.0 == pcapng::BLOCK_ISB)
            .filter_map(|b| pcapng::isb_dropped(b.1))
            .collect();
        (idbs, epbs, drops)
    }

    #[test]
    fn a_count_and_filters_end_the_stream_with_whole_blocks_and_statistics() {
        let (r, w) = pipe();
        let spec = CaptureSpec {
            opcode: Some(0x04),
            count: Some(3),
            ..CaptureSpec::default()
        };
        let shared = start(spec, vec!["srxe0".into()], w, None);
        let mut dev = DeviceCapture::new(0x0200_00ff_fe00_0001);
        assert!(!dev.is_on());
        dev.attach(Arc::clone(&shared), 0, Vec::new());
        assert!(dev.is_on());
        let send = bth(0x04, 0x11);
        let ack = bth(0x11, 0x11);
        for _ in 0..5 {
            dev.datagram(Direction::Outbound, &datagram(&send));
            dev.datagram(Direction::Inbound, &datagram(&ack));
        }
        dev.flush();
        let (idbs, epbs, drops) = read_all(r);
        assert_eq!((idbs, epbs), (1, 3), "SEND_ONLY only, three of them");
        assert_eq!(drops, vec![0]);
        dev.flush();
        assert!(!dev.is_on(), "the finished capture is forgotten");
    }

    #[test]
    fn engine_packets_are_sealed_and_a_corruption_kept() {
        use proto::wire::frame::IcrcStatus;
        use proto::wire::FrameRepr;
        let (r, w) = pipe();
        let shared = start(CaptureSpec::default(), vec!["srxe0".into()], w, None);
        let mut dev = DeviceCapture::new(0x0211_22ff_fe33_4455);
        dev.attach(Arc::clone(&shared), 0, Vec::new());
        let packet = super::super::frame::engine_ipv4_packet();
        dev.packet(Direction::Outbound, &packet, 28, false);
        dev.packet(Direction::Outbound, &packet, 28, true);
        dev.flush();
        assert_eq!(
            shared.queued.load(Ordering::Relaxed),
            0,
            "a young batch stays with the device"
        );
        dev.close();
        let icrcs: Vec<IcrcStatus> = captured_frames(r)
            .iter()
            .map(|frame| FrameRepr::parse_ethernet(frame, frame.len()).unwrap().icrc)
            .collect();
        assert_eq!(icrcs.len(), 2);
        assert_eq!(icrcs[0], IcrcStatus::Ok, "sealed on the way into the batch");
        assert_ne!(icrcs[1], IcrcStatus::Ok, "corrupted after sealing");
    }

    /// Runs one round of packets between local QPs through `dev` as the device does: queued
    /// (with room when a capture can take them in place, and then sealed as the engines
    /// seal them meanwhile), delivered, and the round ended.
    fn local_round(dev: &mut DeviceCapture, packets: &[Vec<u8>]) -> Vec<bool> {
        local_round_duplicating(dev, packets, usize::MAX)
    }

    /// [`local_round`], where the packet at `dup` is delivered twice, the second a copy (as
    /// `Layers::local` does for a `duplicate` fault).
    fn local_round_duplicating(
        dev: &mut DeviceCapture,
        packets: &[Vec<u8>],
        dup: usize,
    ) -> Vec<bool> {
        let mut q = crate::net::LocalFrames::new();
        q.set_capture_room(dev.in_place());
        for p in packets {
            let mut p = p.clone();
            if q.capture_room() {
                super::super::frame::seal(&mut p).unwrap();
            }
            q.push(&p, 28);
        }
        let mut in_place = Vec::new();
        q.drain_blocks(|_, block, frame, bth| {
            let taken = dev.local_packet(block, frame.clone(), bth);
            if in_place.len() == dup {
                dev.packet(Direction::Outbound, &block[frame], bth, false);
            }
            in_place.push(taken);
            taken
        });
        dev.local_round(&mut q);
        in_place
    }

    #[test]
    fn local_packets_are_captured_where_they_lie_after_what_the_batch_holds() {
        use proto::wire::frame::IcrcStatus;
        use proto::wire::FrameRepr;
        let (r, w) = pipe();
        let shared = start(CaptureSpec::default(), vec!["srxe0".into()], w, None);
        let mut dev = DeviceCapture::new(0x0211_22ff_fe33_4455);
        dev.attach(Arc::clone(&shared), 0, vec![0x11]);
        assert!(dev.in_place());
        let to_11 = super::super::frame::engine_ipv4_packet();
        let mut to_12 = to_11.clone();
        to_12[28 + 7] = 0x12; // another QP: the filter leaves it out
        let mut longer = to_11.clone();
        longer.splice(40..40, [0x5a; 64]); // 64 bytes more payload...
        let n = longer.len();
        longer[2..4].copy_from_slice(&(n as u16).to_be_bytes()); // ...in the IP
        longer[24..26].copy_from_slice(&(n as u16 - 20).to_be_bytes()); // and UDP lengths
        longer[10..12].fill(0);
        let sum = longer[..20]
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum::<u32>();
        let sum = (sum & 0xffff) + (sum >> 16);
        longer[10..12].copy_from_slice(&(!((sum & 0xffff) + (sum >> 16)) as u16).to_be_bytes());
        dev.datagram(Direction::Inbound, &datagram(&bth(0x04, 0x11)));
        // The first packet is duplicated: its second goes by copy, into the batch.
        let taken = local_round_duplicating(&mut dev, &[to_11.clone(), to_12, longer.clone()], 0);
        assert_eq!(taken, [true, false, true]);
        dev.close();
        let frames = captured_frames(r);
        assert_eq!(frames.len(), 4, "the datagram, two local packets, the copy");
        assert_eq!(
            frames[0].len(),
            14 + 20 + 8 + 16,
            "what the batch held comes first"
        );
        for (frame, packet) in frames[1..].iter().zip([&to_11, &longer, &to_11]) {
            let parsed = FrameRepr::parse_ethernet(frame, frame.len()).unwrap();
            assert_eq!(parsed.icrc, IcrcStatus::Ok, "sealed where it lay");
            assert_eq!(&frame[14..frame.len() - 4], &packet[..packet.len() - 4]);
        }
        assert_eq!(
            frames[1], frames[3],
            "in place and copied alike, the duplicate after its original"
        );
    }

    #[test]
    fn with_a_snapshot_length_or_two_captures_local_packets_are_copied() {
        use proto::wire::frame::IcrcStatus;
        use proto::wire::FrameRepr;
        let packet = super::super::frame::engine_ipv4_packet();
        let cut = CaptureSpec {
            snaplen: 60,
            ..CaptureSpec::default()
        };
        for specs in [vec![cut], vec![CaptureSpec::default(); 2]] {
            let mut dev = DeviceCapture::new(1);
            let mut readers = Vec::new();
            for spec in specs {
                let (r, w) = pipe();
                dev.attach(start(spec, vec!["srxe0".into()], w, None), 0, Vec::new());
                readers.push(r);
            }
            assert!(!dev.in_place());
            assert_eq!(
                local_round(&mut dev, std::slice::from_ref(&packet)),
                [false]
            );
            dev.close();
            for r in readers {
                let frames = captured_frames(r);
                assert_eq!(frames.len(), 1);
                let f = &frames[0];
                if f.len() == 14 + packet.len() {
                    let parsed = FrameRepr::parse_ethernet(f, f.len()).unwrap();
                    assert_eq!(parsed.icrc, IcrcStatus::Ok);
                } else {
                    assert_eq!(f.len(), 60, "cut");
                }
            }
        }
    }

    #[test]
    fn a_captured_datagram_has_the_udp_checksum_its_socket_sent() {
        let (r, w) = pipe();
        let shared = start(CaptureSpec::default(), vec!["srxe0".into()], w, None);
        let mut dev = DeviceCapture::new(1);
        dev.attach(Arc::clone(&shared), 0, Vec::new());
        let payload = bth(0x04, 0x11);
        for checksum in [true, false] {
            dev.datagram(
                Direction::Outbound,
                &UdpDatagram {
                    checksum,
                    ..datagram(&payload)
                },
            );
        }
        dev.close();
        let sums: Vec<(u16, bool)> = captured_frames(r)
            .iter()
            .map(|frame| {
                let udp = &frame[14 + 20..];
                let right = super::super::frame::tests::udp_checksum_right(
                    "127.0.0.1".parse().unwrap(),
                    "127.0.0.2".parse().unwrap(),
                    udp,
                );
                (u16::from_be_bytes([udp[6], udp[7]]), right)
            })
            .collect();
        assert_eq!(sums.len(), 2);
        assert!(sums[0].1, "the socket's checksum");
        assert_ne!(sums[0].0, 0);
        assert_eq!(sums[1].0, 0, "no checksum sent, none shown");
    }

    #[test]
    fn a_qp_filter_and_stop() {
        let (r, w) = pipe();
        let shared = start(
            CaptureSpec::default(),
            vec!["a".into(), "b".into()],
            w,
            None,
        );
        let mut dev = DeviceCapture::new(1);
        dev.attach(Arc::clone(&shared), 1, vec![0x11, 0x12]);
        for q in [0x11, 0x12, 0x13] {
            dev.datagram(Direction::Outbound, &datagram(&bth(0x04, q)));
        }
        dev.close();
        assert!(!dev.is_on());
        let (idbs, epbs, drops) = read_all(r);
        assert_eq!((idbs, epbs), (2, 2));
        assert_eq!(drops, vec![0, 0]);
    }
}
