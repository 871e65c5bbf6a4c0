//! ChaCha20 (RFC 8439 §2.3) as a random-number generator: the source of every R_Key, L_Key,
//! QPN and starting PSN the engine chooses. The engine reads no entropy itself: its owner seeds
//! it (the daemon with 32 bytes from `getrandom`, tests with constants), and the keystream of a
//! secret key is unpredictable, so keys drawn from it cannot be guessed from other keys
//! (ReDMArk, USENIX Security 2021, guessed rxe's keys and QPNs from their structure).

/// A ChaCha20 keystream, consumed 32 bits at a time.
#[derive(Clone)]
pub struct ChaCha20Rng {
    key: [u32; 8],
    nonce: [u32; 3],
    counter: u32,
    block: [u32; 16],
    /// Words of `block` already handed out.
    used: usize,
}

impl core::fmt::Debug for ChaCha20Rng {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // Never print the key: it would make every key it produced predictable.
        f.write_str("ChaCha20Rng")
    }
}

const SIGMA: [u32; 4] = [0x6170_7865, 0x3320_646e, 0x7962_2d32, 0x6b20_6574];

fn quarter_round(s: &mut [u32; 16], a: usize, b: usize, c: usize, d: usize) {
    s[a] = s[a].wrapping_add(s[b]);
    s[d] = (s[d] ^ s[a]).rotate_left(16);
    s[c] = s[c].wrapping_add(s[d]);
    s[b] = (s[b] ^ s[c]).rotate_left(12);
    s[a] = s[a].wrapping_add(s[b]);
    s[d] = (s[d] ^ s[a]).rotate_left(8);
    s[c] = s[c].wrapping_add(s[d]);
    s[b] = (s[b] ^ s[c]).rotate_left(7);
}

/// The ChaCha20 block function (RFC 8439 §2.3.1).
fn block(key: &[u32; 8], counter: u32, nonce: &[u32; 3]) -> [u32; 16] {
    let mut init = [0u32; 16];
    init[..4].copy_from_slice(&SIGMA);
    init[4..12].copy_from_slice(key);
    init[12] = counter;
    init[13..].copy_from_slice(nonce);
    let mut s = init;
    for _ in 0..10 {
        quarter_round(&mut s, 0, 4, 8, 12);
        quarter_round(&mut s, 1, 5, 9, 13);
        quarter_round(&mut s, 2, 6, 10, 14);
        quarter_round(&mut s, 3, 7, 11, 15);
        quarter_round(&mut s, 0, 5, 10, 15);
        quarter_round(&mut s, 1, 6, 11, 12);
        quarter_round(&mut s, 2, 7, 8, 13);
        quarter_round(&mut s, 3, 4, 9, 14);
    }
    for (w, i) in s.iter_mut().zip(init) {
        *w = w.wrapping_add(i);
    }
    s
}

impl ChaCha20Rng {
    /// The keystream of `key` with nonce 0, from block 0.
    pub fn from_seed(key: [u8; 32]) -> ChaCha20Rng {
        let mut k = [0u32; 8];
        for (w, c) in k.iter_mut().zip(key.chunks_exact(4)) {
            *w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        ChaCha20Rng {
            key: k,
            nonce: [0; 3],
            counter: 0,
            block: [0; 16],
            used: 16,
        }
    }

    pub fn next_u32(&mut self) -> u32 {
        if self.used == 16 {
            self.block = block(&self.key, self.counter, &self.nonce);
            // 2^32 blocks (256 GiB of keys) before the counter would repeat: move to the
            // next nonce then, so the stream never cycles.
            self.counter = self.counter.wrapping_add(1);
            if self.counter == 0 {
                self.nonce[0] = self.nonce[0].wrapping_add(1);
            }
            self.used = 0;
        }
        let w = self.block[self.used];
        self.used += 1;
        w
    }

    pub fn next_u64(&mut self) -> u64 {
        u64::from(self.next_u32()) | u64::from(self.next_u32()) << 32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 8439 §2.3.2: key 00..1f, counter 1, nonce 00:00:00:09:00:00:00:4a:00:00:00:00.
    #[test]
    fn block_function_matches_rfc_8439() {
        let mut key = [0u32; 8];
        for (i, w) in key.iter_mut().enumerate() {
            let b = (i * 4) as u8;
            *w = u32::from_le_bytes([b, b + 1, b + 2, b + 3]);
        }
        let out = block(&key, 1, &[0x0900_0000, 0x4a00_0000, 0]);
        assert_eq!(
            out,
            [
                0xe4e7_f110,
                0x1559_3bd1,
                0x1fdd_0f50,
                0xc471_20a3,
                0xc7f4_d1c7,
                0x0368_c033,
                0x9aaa_2204,
                0x4e6c_d4c3,
                0x4664_82d2,
                0x09aa_9f07,
                0x05d7_c214,
                0xa202_8bd9,
                0xd19c_12b5,
                0xb94e_16de,
                0xe883_d0cb,
                0x4e3c_50a2,
            ]
        );
    }

    /// RFC 8439 §2.4.2's keystream starts at counter 1: block 0 of key 0 is §A.1 test vector 1.
    #[test]
    fn keystream_of_the_zero_key_matches_rfc_8439_appendix_a() {
        let mut r = ChaCha20Rng::from_seed([0; 32]);
        let first: Vec<u8> = (0..4).flat_map(|_| r.next_u32().to_le_bytes()).collect();
        assert_eq!(
            first,
            [
                0x76, 0xb8, 0xe0, 0xad, 0xa0, 0xf1, 0x3d, 0x90, 0x40, 0x5d, 0x6a, 0xe5, 0x53, 0x86,
                0xbd, 0x28
            ]
        );
    }
}
