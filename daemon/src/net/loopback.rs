//! Packets between two QPs of the same device: delivered from one engine to another inside
//! the daemon, without a socket.
//!
//! Kernel rxe does the same (`rxe_loopback()` when the destination is one of the device's own
//! addresses): such packets never reach a wire, so nothing but the two engines can see them.
//! Skipping the socket saves two system calls and two kernel UDP passes (~5 µs each here) per
//! packet, and the re-sealing of the ICRC for the socket's headers: the engine's frame already
//! carries the ICRC for its own headers, which the receiving engine verifies.

/// Whole IP frames (as `poll_transmit` writes them) waiting for local delivery, in one
/// reused buffer: nothing is allocated per packet once the queue has grown.
#[derive(Debug, Default)]
pub struct LocalFrames {
    data: Vec<u8>,
    /// (end offset in `data`, offset of the BTH inside the frame)
    frames: Vec<(usize, usize)>,
}

impl LocalFrames {
    pub fn new() -> LocalFrames {
        LocalFrames::default()
    }

    /// Queues a copy of `frame`, whose BTH starts at `transport_offset`.
    pub fn push(&mut self, frame: &[u8], transport_offset: usize) {
        self.data.extend_from_slice(frame);
        self.frames.push((self.data.len(), transport_offset));
    }

    pub fn len(&self) -> usize {
        self.frames.len()
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Bytes queued.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Hands every queued frame, in order, to `deliver` with the destination QPN from its BTH
    /// (frames too short to hold a BTH are skipped), and empties the queue.
    pub fn drain(&mut self, mut deliver: impl FnMut(u32, &[u8])) {
        let mut start = 0;
        for &(end, offset) in &self.frames {
            let frame = &self.data[start..end];
            start = end;
            let Some(q) = frame.get(offset + 5..offset + 8) else {
                continue;
            };
            deliver(u32::from_be_bytes([0, q[0], q[1], q[2]]), frame);
        }
        self.frames.clear();
        self.data.clear();
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
}
