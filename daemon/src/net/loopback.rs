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
#[derive(Debug, Default)]
pub struct LocalFrames {
    /// Grows to the largest batch and stays; `data[..used]` holds the queued frames.
    data: Vec<u8>,
    used: usize,
    /// (end offset in `data`, offset of the BTH inside the frame)
    frames: Vec<(usize, usize)>,
}

impl LocalFrames {
    pub fn new() -> LocalFrames {
        LocalFrames::default()
    }

    /// Queues a copy of `frame`, whose BTH starts at `transport_offset`.
    pub fn push(&mut self, frame: &[u8], transport_offset: usize) {
        self.reserve(frame.len()).copy_from_slice(frame);
        self.commit(frame.len(), transport_offset);
    }

    /// Room for the next frame, `len` bytes, to be written in place (no copy) and kept with
    /// [`LocalFrames::commit`]; anything not committed is overwritten by the next frame.
    pub fn reserve(&mut self, len: usize) -> &mut [u8] {
        if self.data.len() < self.used + len {
            self.data.resize(self.used + len, 0);
        }
        &mut self.data[self.used..self.used + len]
    }

    /// Keeps the first `len` bytes written into the last [`LocalFrames::reserve`] as a frame.
    pub fn commit(&mut self, len: usize, transport_offset: usize) {
        self.used = (self.used + len).min(self.data.len());
        self.frames.push((self.used, transport_offset));
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
        self.drain_with_offsets(|qpn, frame, _| deliver(qpn, frame));
    }

    /// [`LocalFrames::drain`], also giving where each frame's BTH starts.
    pub fn drain_with_offsets(&mut self, mut deliver: impl FnMut(u32, &[u8], usize)) {
        let mut start = 0;
        for &(end, offset) in &self.frames {
            let frame = &self.data[start..end];
            start = end;
            let Some(q) = frame.get(offset + 5..offset + 8) else {
                continue;
            };
            deliver(u32::from_be_bytes([0, q[0], q[1], q[2]]), frame, offset);
        }
        self.frames.clear();
        self.used = 0;
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
}
