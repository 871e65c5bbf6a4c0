//! The bounce buffer: where data is staged at the same offset modulo 64 as the remote
//! address, so that the copy across processes runs at full speed (the trap of the crate
//! documentation).

/// A 64-byte aligned scratch buffer that can present a window at any offset modulo 64.
#[derive(Debug, Default)]
pub(crate) struct Bounce {
    pub(crate) buf: Vec<u8>,
}

impl Bounce {
    /// A `len`-byte window whose address is congruent to `remote` modulo 64.
    pub(crate) fn window(&mut self, remote: u64, len: usize) -> &mut [u8] {
        let skew = self.skew(remote, len);
        &mut self.buf[skew..skew + len]
    }

    /// Makes room for a `len`-byte window for `remote` and returns where it starts.
    pub(crate) fn skew(&mut self, remote: u64, len: usize) -> usize {
        let need = len + 128;
        if self.buf.len() < need {
            self.buf.resize(need.next_power_of_two(), 0);
        }
        let base = self.buf.as_ptr() as usize;
        ((remote as usize).wrapping_sub(base)) & 63
    }
}
