//! The writer thread of one capture: the pcapng stream into the pipe `softroce capture`
//! reads, fed by the devices' batches.

use super::pcapng;
use crossbeam_channel::{bounded, unbounded, Receiver, Sender, TryRecvError};
use proto::ctl::CaptureSpec;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use tracing::{debug, info};

/// Bytes of batches waiting for the writer, per capture; more are dropped (and counted). A
/// writer starved of CPU for a while (the machine busy with the very traffic it captures)
/// catches up from here.
const QUEUE_BYTES: usize = 64 << 20;

/// Written batches kept for the devices to fill again: a fresh batch faults in new pages for
/// every batch captured.
const SPARE_BATCHES: usize = 8;

/// How long the writer naps when it finds no batch: it polls, so that handing a batch over
/// never wakes a thread (a futex wake and a context switch per batch, taken from the
/// pollers on a small machine, were most of what a capture cost).
const WRITER_NAP: std::time::Duration = std::time::Duration::from_millis(1);

/// How long the writer waits at the end for the batches the devices still hold.
const FINAL_GRACE: std::time::Duration = std::time::Duration::from_millis(10);

enum WriterMsg {
    Packets {
        bytes: Vec<u8>,
        finish: Vec<Finish>,
        count: u64,
    },
    Stop,
}

/// A network frame in a batch that the writer completes before writing it (its ICRC, the
/// IPv6 UDP checksum, and a corruption the fault layer made): work of a pass over every byte,
/// taken off the device thread.
#[derive(Clone, Copy, Debug)]
pub struct Finish {
    /// Where the Ethernet frame starts in the batch, and its length.
    pub at: u32,
    pub len: u32,
    /// Whether to compute its ICRC (a packet between two QPs of one device was never sealed).
    pub seal: bool,
    /// Where its BTH starts in the frame, when a fault layer corrupted it: one bit flipped
    /// after sealing.
    pub corrupt_at: Option<u32>,
}

impl Finish {
    /// Completes the frame in `batch`.
    pub fn apply(&self, batch: &mut [u8]) {
        let at = self.at as usize;
        let Some(frame) = batch.get_mut(at..at + self.len as usize) else {
            return;
        };
        if super::frame::finish_network_frame(frame, self.seal).is_none() {
            return;
        }
        if let Some(t) = self.corrupt_at.and_then(|c| frame.get_mut(c as usize..)) {
            crate::fault::corrupt(t);
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
    /// Batches the writer has written, emptied, for the devices to reuse (with their lists of
    /// frames to finish: a batch that had to grow both anew cost the device thread more than
    /// the copy of its frames).
    spare_tx: Sender<(Vec<u8>, Vec<Finish>)>,
    spare_rx: Receiver<(Vec<u8>, Vec<Finish>)>,
}

impl CaptureShared {
    pub fn spec(&self) -> &CaptureSpec {
        &self.spec
    }

    /// An empty batch to fill and its empty list of frames to finish: a written one back
    /// from the writer, else a new one with room for `capacity` bytes.
    pub(super) fn spare_batch(&self, capacity: usize) -> (Vec<u8>, Vec<Finish>) {
        self.spare_rx
            .try_recv()
            .unwrap_or_else(|_| (Vec::with_capacity(capacity), Vec::with_capacity(64)))
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

    /// Queues a batch of `count` packets of interface `iface`, whose frames `finish` the
    /// writer completes, for the writer; a full queue drops it.
    pub(super) fn deliver(&self, iface: u32, bytes: Vec<u8>, finish: Vec<Finish>, count: u64) {
        let Some(stats) = self.ifaces.get(iface as usize) else {
            return;
        };
        let len = bytes.len();
        let room = self.queued.load(Ordering::Relaxed) + len <= QUEUE_BYTES;
        let msg = WriterMsg::Packets {
            bytes,
            finish,
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
    let (spare_tx, spare_rx) = bounded(SPARE_BATCHES);
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
        spare_tx,
        spare_rx,
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
    while ok && wanted.is_none_or(|w| written < w) {
        match rx.try_recv() {
            Ok(WriterMsg::Packets {
                mut bytes,
                mut finish,
                count,
            }) => {
                ok = write_batch(&mut out, &mut bytes, &finish);
                shared.queued.fetch_sub(bytes.len(), Ordering::Relaxed);
                written += count;
                bytes.clear();
                finish.clear();
                let _ = shared.spare_tx.try_send((bytes, finish));
            }
            Ok(WriterMsg::Stop) | Err(TryRecvError::Disconnected) => break,
            Err(TryRecvError::Empty) if shared.is_finished() => break,
            Err(TryRecvError::Empty) => std::thread::sleep(WRITER_NAP),
        }
    }
    shared.finished.store(true, Ordering::Relaxed);
    // A device hands over the batch it holds once it sees the end, at its next round (one
    // that sleeps handed it over before sleeping): that long, and they are written too.
    std::thread::sleep(FINAL_GRACE);
    // Batches still queued (taken before the end) are written too.
    while let Ok(WriterMsg::Packets {
        mut bytes,
        finish,
        count,
    }) = rx.try_recv()
    {
        if ok {
            ok = write_batch(&mut out, &mut bytes, &finish);
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

/// Completes the batch's frames and writes it; false when the reader is gone.
fn write_batch(out: &mut std::fs::File, bytes: &mut [u8], finish: &[Finish]) -> bool {
    for f in finish {
        f.apply(bytes);
    }
    out.write_all(bytes).is_ok()
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
    fn the_writer_seals_engine_packets_and_keeps_a_corruption() {
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
        assert_eq!(icrcs[0], IcrcStatus::Ok, "sealed by the writer");
        assert_ne!(icrcs[1], IcrcStatus::Ok, "corrupted after sealing");
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
        let sums: Vec<(u16, u16)> = captured_frames(r)
            .iter()
            .map(|frame| {
                let mut udp = frame[14 + 20..].to_vec();
                let sent = u16::from_be_bytes([udp[6], udp[7]]);
                udp[6..8].fill(0);
                let want = super::super::frame::udp_checksum(
                    "127.0.0.1".parse().unwrap(),
                    "127.0.0.2".parse().unwrap(),
                    &udp,
                );
                (sent, want)
            })
            .collect();
        assert_eq!(sums.len(), 2);
        assert_eq!(sums[0].0, sums[0].1, "the socket's checksum");
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
