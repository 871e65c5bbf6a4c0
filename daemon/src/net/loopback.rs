//! Packets between two QPs of the same device: delivered from one engine to another inside
//! the daemon, without a socket.
//!
//! Kernel rxe does the same (`rxe_loopback()` when the destination is one of the device's own
//! addresses): such packets never reach a wire, so nothing but the two engines can see them.
//! Skipping the socket saves two system calls and two kernel UDP passes (~5 µs each here) per
//! packet, and the re-sealing of the ICRC for the socket's headers: the engine's frame already
//! carries the ICRC for its own headers, which the receiving engine verifies.

/// Whole IP frames (as `poll_transmit` writes them) waiting for local delivery, in one
/// reused buffer: nothing is allocated or cleared per packet once the queue has grown.
///
/// While a capture listens, each frame is written, sealed by its engine, with room around it
/// for the capture's block (`capture::ROOM_BEFORE` bytes in front, the rest of
/// `capture::block_len_around` after): the capture then completes each frame and its pcapng
/// block where it lies, and takes the whole buffer for its writer at the end of the round
/// ([`LocalFrames::take_captured`]) instead of copying every packet.
#[derive(Debug, Default)]
pub struct LocalFrames {
    /// Grows to the largest batch and stays; `data[..used]` holds the queued frames.
    data: Vec<u8>,
    used: usize,
    /// (start, end) of each frame in `data`, and the offset of the BTH inside the frame.
    frames: Vec<(usize, usize, usize)>,
    /// Whether frames get room for a capture's block around them.
    capture_room: bool,
    /// The blocks a capture completed in place this round (adjacent ones merged), and how
    /// many packets they hold.
    captured: Vec<(usize, usize)>,
    captured_packets: u64,
}

/// A round's buffer whose blocks a capture completed in place, for its writer.
#[derive(Debug)]
pub struct CapturedFrames {
    pub data: Vec<u8>,
    /// The ranges of `data` to write, in order.
    pub blocks: Vec<(usize, usize)>,
    pub packets: u64,
}

impl LocalFrames {
    pub fn new() -> LocalFrames {
        LocalFrames::default()
    }

    /// Whether the frames queued from now on get room for a capture's block; only between
    /// rounds (the queue is empty then).
    pub fn set_capture_room(&mut self, on: bool) {
        if self.frames.is_empty() {
            self.capture_room = on;
        }
    }

    /// Whether frames get room for a capture's block (the engines that write them then
    /// seal them: `DeviceThread::transmit`).
    pub fn capture_room(&self) -> bool {
        self.capture_room
    }

    fn room_before(&self) -> usize {
        if self.capture_room {
            crate::capture::ROOM_BEFORE
        } else {
            0
        }
    }

    /// Queues a copy of `frame`, whose BTH starts at `transport_offset`.
    pub fn push(&mut self, frame: &[u8], transport_offset: usize) {
        self.reserve(frame.len()).copy_from_slice(frame);
        self.commit(frame.len(), transport_offset);
    }

    /// Room for the next frame, `len` bytes, to be written in place (no copy) and kept with
    /// [`LocalFrames::commit`]; anything not committed is overwritten by the next frame.
    pub fn reserve(&mut self, len: usize) -> &mut [u8] {
        let start = self.used + self.room_before();
        if self.data.len() < start + len {
            self.data.resize(start + len, 0);
        }
        &mut self.data[start..start + len]
    }

    /// Keeps the first `len` bytes written into the last [`LocalFrames::reserve`] as a frame.
    pub fn commit(&mut self, len: usize, transport_offset: usize) {
        let start = self.used + self.room_before();
        let end = (start + len).min(self.data.len()).max(start);
        self.used = if self.capture_room {
            let block_end = self.used + crate::capture::block_len_around(end - start);
            if self.data.len() < block_end {
                self.data.resize(block_end, 0);
            }
            block_end
        } else {
            end
        };
        self.frames.push((start, end, transport_offset));
    }

    pub fn len(&self) -> usize {
        self.frames.len()
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Bytes queued.
    pub fn bytes(&self) -> usize {
        self.used
    }

    /// Hands every queued frame, in order, to `deliver` with the destination QPN from its BTH
    /// (frames too short to hold a BTH are skipped), and empties the queue.
    pub fn drain(&mut self, mut deliver: impl FnMut(u32, &[u8])) {
        self.drain_blocks(|qpn, block, frame, _| {
            deliver(qpn, &block[frame]);
            false
        });
    }

    /// [`LocalFrames::drain`] for a capture: each frame is handed inside its block (the frame
    /// alone without capture room) with its range in the block and where its BTH starts;
    /// `deliver` returns whether a capture completed the block in place, to be written by
    /// its writer ([`LocalFrames::take_captured`]).
    pub fn drain_blocks(
        &mut self,
        mut deliver: impl FnMut(u32, &mut [u8], std::ops::Range<usize>, usize) -> bool,
    ) {
        let before = self.room_before();
        // What a capture took in an earlier round and nobody took away is not this round's.
        self.captured.clear();
        self.captured_packets = 0;
        for &(start, end, offset) in &self.frames {
            let block_start = start - before;
            let block_end = if self.capture_room {
                block_start + crate::capture::block_len_around(end - start)
            } else {
                end
            };
            let Some(block) = self.data.get_mut(block_start..block_end) else {
                continue;
            };
            let frame = before..before + (end - start);
            let Some(q) = block.get(before + offset + 5..before + offset + 8) else {
                continue;
            };
            let qpn = u32::from_be_bytes([0, q[0], q[1], q[2]]);
            if deliver(qpn, block, frame, offset) && self.capture_room {
                self.captured_packets += 1;
                match self.captured.last_mut() {
                    Some(last) if last.1 == block_start => last.1 = block_end,
                    _ => self.captured.push((block_start, block_end)),
                }
            }
        }
        self.frames.clear();
        self.used = 0;
    }

    /// The buffer of the round just drained, when a capture completed blocks in it; the queue
    /// goes on in `spare` (an empty one is replaced by a new buffer as large as the one taken,
    /// so that the queue does not grow it again step by step, copying at each step).
    pub fn take_captured(&mut self, mut spare: Vec<u8>) -> Result<CapturedFrames, Vec<u8>> {
        if self.captured.is_empty() {
            return Err(spare);
        }
        if spare.is_empty() {
            spare = vec![0; self.data.len()];
        }
        Ok(CapturedFrames {
            data: std::mem::replace(&mut self.data, spare),
            blocks: std::mem::take(&mut self.captured),
            packets: std::mem::take(&mut self.captured_packets),
        })
    }

    /// Whether a capture completed blocks in this round's buffer.
    pub fn has_captured(&self) -> bool {
        !self.captured.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_come_out_in_order_with_their_destination_qpn() {
        let mut q = LocalFrames::new();
        let mut a = vec![0u8; 28 + 12 + 4];
        a[28 + 5..28 + 8].copy_from_slice(&[0x01, 0x02, 0x03]);
        let mut b = vec![0xffu8; 48 + 12 + 4];
        b[48 + 5..48 + 8].copy_from_slice(&[0, 0, 7]);
        q.push(&a, 28);
        q.push(&b, 48);
        q.push(&[1, 2, 3], 28); // too short for a BTH: skipped
        assert_eq!((q.len(), q.bytes()), (3, a.len() + b.len() + 3));
        let mut got = Vec::new();
        q.drain(|qpn, f| got.push((qpn, f.to_vec())));
        assert_eq!(got, vec![(0x010203, a), (7, b)]);
        assert!(q.is_empty());
        assert_eq!(q.bytes(), 0);
    }

    #[test]
    fn frames_written_in_place_keep_only_what_was_committed() {
        let mut q = LocalFrames::new();
        let room = q.reserve(100);
        room[..44].fill(0xaa);
        room[28 + 7] = 9;
        q.commit(44, 28);
        q.reserve(100)[0] = 0x55; // not committed: overwritten
        q.push(&[0xbb; 44], 28);
        assert_eq!((q.len(), q.bytes()), (2, 88));
        let mut got = Vec::new();
        q.drain(|qpn, f| got.push((qpn, f.len(), f[0])));
        assert_eq!(got, vec![(0xaaaa09, 44, 0xaa), (0xbbbbbb, 44, 0xbb)]);
    }

    #[test]
    fn with_capture_room_each_frame_lies_inside_its_block() {
        let mut q = LocalFrames::new();
        q.set_capture_room(true);
        let mut a = vec![0xa1u8; 28 + 12 + 5];
        a[28 + 5..28 + 8].copy_from_slice(&[0, 0, 1]);
        let mut b = vec![0xb2u8; 28 + 12 + 8];
        b[28 + 5..28 + 8].copy_from_slice(&[0, 0, 2]);
        let mut c = b.clone();
        c[28 + 7] = 3;
        q.push(&a, 28);
        q.push(&b, 28);
        q.push(&c, 28);
        let blocks: Vec<usize> = [&a, &b, &c]
            .iter()
            .map(|f| crate::capture::block_len_around(f.len()))
            .collect();
        assert_eq!(q.bytes(), blocks.iter().sum::<usize>());
        let mut got = Vec::new();
        q.drain_blocks(|qpn, block, frame, bth| {
            assert_eq!(frame.start, crate::capture::ROOM_BEFORE);
            got.push((qpn, block.len(), block[frame].to_vec(), bth));
            qpn != 2 // the capture takes the first and the last
        });
        let sizes: Vec<usize> = got.iter().map(|g| g.1).collect();
        assert_eq!(sizes, blocks);
        assert_eq!(got[0].2, a);
        assert_eq!(got[1].2, b);
        assert_eq!(got[2].2, c);
        let taken = q.take_captured(Vec::new()).unwrap();
        let (ab, abc) = (blocks[0] + blocks[1], blocks.iter().sum::<usize>());
        assert_eq!(
            taken.blocks,
            vec![(0, blocks[0]), (ab, abc)],
            "the second skipped"
        );
        assert_eq!(taken.packets, 2);
        assert!(!q.has_captured());
        assert!(q.take_captured(Vec::new()).is_err(), "nothing more");
        // Without room, frames follow one another and nothing is taken.
        q.set_capture_room(false);
        q.push(&a, 28);
        q.drain_blocks(|_, block, frame, _| {
            assert_eq!((frame.start, block.len()), (0, a.len()));
            true
        });
        assert!(q.take_captured(Vec::new()).is_err());
    }
}
