//! The copy of a payload between two buffers, made in the order that does not meet 4 KiB
//! aliasing.
//!
//! A load whose address matches an earlier, still pending store's in its low 12 bits waits
//! for that store, whatever the rest of the address: the CPU checks only those bits first. A
//! forward copy whose destination lies 1 to 15 bytes after its source, modulo 4096, makes
//! nearly every load match a store it just issued. glibc's `memmove` (its `rep movsb` path,
//! taken for a 4 KiB packet) then ran 16 times slower here: 1,200 ns per 4096 bytes against
//! 73 (Zen 4, ad hoc, both buffers in the L2 cache). Whether a payload meets it depends only
//! on where its two buffers happen to lie, so it came and went with layout: a live capture
//! moves the device's frames by the room it leaves in front of each, and with it on (even
//! with a filter that matched no packet) the sending daemon of two spent 25-30 % of its time
//! in the engine's payload copy, against 3 % without (`perf`, 2026-12-06).
//!
//! Copied backward instead, from the end in 64-byte blocks (each loaded whole before it is
//! stored), every load reads below the stores still pending, and the copy runs at the speed
//! of any other (110 ns per 4 KiB). Every other placement keeps the plain forward copy.

/// Destination offsets after the source, modulo 4 KiB, whose forward copy is slow: 1 to
/// [`SLOW_AHEAD`] bytes. Measured: 1-15 slow, 16 and above at full speed.
const SLOW_AHEAD: usize = 15;

/// Copies `src` into `dst` (the lengths must be equal, as for `copy_from_slice`).
#[inline]
pub fn copy(dst: &mut [u8], src: &[u8]) {
    let ahead = (dst.as_ptr() as usize).wrapping_sub(src.as_ptr() as usize) & 4095;
    if (1..=SLOW_AHEAD).contains(&ahead) && dst.len() == src.len() && dst.len() >= 256 {
        copy_backward(dst, src);
    } else {
        dst.copy_from_slice(src);
    }
}

/// From the end, 64 bytes at a time, each block read whole before it is written.
#[cold]
fn copy_backward(dst: &mut [u8], src: &[u8]) {
    let mut end = dst.len();
    while end >= 64 {
        let mut block = [0u8; 64];
        block.copy_from_slice(&src[end - 64..end]);
        dst[end - 64..end].copy_from_slice(&block);
        end -= 64;
    }
    dst[..end].copy_from_slice(&src[..end]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_placement_and_length_copies_the_same_bytes() {
        let src: Vec<u8> = (0..9000u32).map(|i| (i * 31 + 7) as u8).collect();
        let mut dst = vec![0u8; 16384];
        for len in [0, 1, 63, 64, 65, 255, 256, 1000, 4096, 4097, 4160] {
            for at in 0..80 {
                dst.fill(0xee);
                let (from, to) = (3, 3 + len);
                copy(&mut dst[at..at + len], &src[from..to]);
                assert_eq!(&dst[at..at + len], &src[from..to], "len {len} at {at}");
                assert!(
                    dst[..at].iter().all(|&b| b == 0xee),
                    "before: len {len} at {at}"
                );
                assert!(
                    dst[at + len..].iter().all(|&b| b == 0xee),
                    "after: len {len} at {at}"
                );
            }
        }
    }

    #[test]
    fn a_destination_just_ahead_modulo_4_kib_is_copied_backward() {
        let src = vec![5u8; 8192];
        let mut dst = vec![0u8; 16384];
        let s = src.as_ptr() as usize;
        let d = dst.as_ptr() as usize;
        // The offset in `dst` that lies 8 bytes after `src` modulo 4096.
        let at = (s + 8).wrapping_sub(d) & 4095;
        let ahead = (dst[at..].as_ptr() as usize).wrapping_sub(s) & 4095;
        assert_eq!(ahead, 8);
        copy(&mut dst[at..at + 4096], &src[..4096]);
        assert!(dst[at..at + 4096].iter().all(|&b| b == 5));
    }
}
