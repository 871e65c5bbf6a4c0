//! The invariant CRC (IBTA Vol. 1 §7.8.1; Annex A16/A17 for RoCE).
//!
//! CRC-32 (the Ethernet/zlib polynomial) over 8 bytes of 0xFF standing in for the masked LRH,
//! then the network header with its variant fields set to ones, the UDP header with its
//! checksum set to ones (RoCE v2), the BTH with byte 4 set to ones, and everything after it up
//! to the ICRC. The result is appended least-significant byte first.
//!
//! The IPv4 Identification is *not* masked, and kernel rxe sends non-zero, varying IDs. A
//! receiver on a plain UDP socket never sees it, so [`recover_ipv4_ident`] solves for it using
//! the CRC's linearity (roce-rxe-facts.md §3.5).
//!
//! Entry points: [`v2_ipv4`], [`v2_ipv6`], [`v1`] over a whole packet; [`v2_copying_payload`]
//! for a sender (hash while copying the payload into the packet); [`v2_copying_out`] for a
//! receiver (hash while copying the payload out to registered memory).
//!
//! Speed (`cargo run --release -p softroce-proto --example icrc_bench`, AMD EPYC Zen 4 at
//! 2.6 GHz, ns per call, best of several runs; payload behind IPv4, UDP and a BTH). The
//! kernel below folds the masked prefix in parallel with the data and carries every block
//! straight to the end, so the fixed cost per call fell from about 30 ns to about 15:
//!
//! | payload | entry point                               | before | after |
//! |---------|-------------------------------------------|--------|-------|
//! | 0       | `v2_ipv4`                                 | 28.2   | 15.2  |
//! | 1024    | `v2_ipv4`                                 | 45.8   | 32.0  |
//! | 4096    | `v2_ipv4`                                 | 93.8   | 84.0  |
//! | 1021    | `v2_ipv4` (pad 3, odd tail)               | 75.0   | 38.4  |
//! | 1024    | `v2_copying_payload` (hot source)         | 53.5   | 36.4  |
//! | 4096    | `v2_copying_payload` (hot source)         | 105.2  | 88.2  |
//! | 1024    | `v2_copying_out` (cold destination)       | 47.1 * | 37.0  |
//! | 4096    | `v2_copying_out` (cold destination)       | 94.9 * | 91.2  |
//!
//! (*) Before `v2_copying_out` existed: `v2_ipv4`, then a copy. With the faster `v2_ipv4`
//! that sequence takes 48 and 140 ns (the hash no longer leaves room to hide a copy into
//! cold memory), so receivers should use `v2_copying_out`. Baselines on the same sizes:
//! `crc32fast::hash` 42.5 and 93.9 ns, a hot memcpy 11.2 and 44.5 ns.

use super::{bth, ipv4, ipv6, udp};

/// The masked-LRH stand-in that starts every ICRC.
const LRH_ONES: [u8; 8] = [0xff; 8];

/// The longest BTH plus extended headers of any opcode the ICRC entry points take: BTH (12)
/// and AtomicETH (28); a write with immediate has BTH, RETH (16) and ImmDt (4).
const MAX_HEADERS: usize = 40;

/// The masked headers in front of the transport's extension headers: a CRC-equivalent of
/// the 8 ones, an IPv6-sized network header, UDP and BTH, for the portable path.
///
/// The buffer is laid out for a CRC register that starts at 0 rather than at all ones: the
/// first 4 bytes of ones cancel the initial all-ones register exactly, leaving
/// `[0xff; 4] + headers` from a zero register, and leading zero bytes do not change a zero
/// register. So the masked headers are right-aligned after zero padding to a multiple of
/// 16 bytes.
const PREFIX_MAX: usize = 96;

/// Network header masking rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Net {
    V4,
    /// IPv6 for RoCE v2, and the GRH of RoCE v1 (same layout, same masks).
    V6,
}

impl Net {
    fn of_v2_header(ip: &[u8]) -> Net {
        if ip.len() == ipv6::HEADER_LEN {
            Net::V6
        } else {
            Net::V4
        }
    }

    fn header_len(self) -> usize {
        match self {
            Net::V4 => ipv4::HEADER_LEN,
            Net::V6 => ipv6::HEADER_LEN,
        }
    }
}

/// The masked prefix for a packet whose transport starts with `headers` (the BTH, and
/// possibly the extended headers after it), right-aligned in a zero-padded buffer; returns
/// the buffer and its used length (a multiple of 16).
fn masked_prefix(
    net: Net,
    ip: &[u8],
    udp_header: Option<&[u8]>,
    headers: &[u8],
) -> ([u8; PREFIX_MAX], usize) {
    let net_len = net.header_len();
    let udp_len = if udp_header.is_some() {
        udp::HEADER_LEN
    } else {
        0
    };
    let raw_len = 4 + net_len + udp_len + headers.len();
    let total = raw_len.next_multiple_of(16);
    let mut prefix = [0u8; PREFIX_MAX];
    let mut at = total - raw_len;
    prefix[at..at + 4].copy_from_slice(&LRH_ONES[..4]);
    at += 4;
    match net {
        Net::V4 => {
            let m = &mut prefix[at..at + ipv4::HEADER_LEN];
            m.copy_from_slice(&ip[..ipv4::HEADER_LEN]);
            m[1] = 0xff; // TOS (DSCP + ECN)
            m[8] = 0xff; // TTL
            m[10] = 0xff; // header checksum
            m[11] = 0xff;
        }
        Net::V6 => {
            let m = &mut prefix[at..at + ipv6::HEADER_LEN];
            m.copy_from_slice(&ip[..ipv6::HEADER_LEN]);
            m[0] |= 0x0f; // traffic class (high nibble) and flow label
            m[1] = 0xff;
            m[2] = 0xff;
            m[3] = 0xff;
            m[7] = 0xff; // hop limit
        }
    }
    at += net_len;
    if let Some(u) = udp_header {
        let m = &mut prefix[at..at + udp::HEADER_LEN];
        m.copy_from_slice(&u[..udp::HEADER_LEN]);
        m[6] = 0xff; // UDP checksum
        m[7] = 0xff;
        at += udp::HEADER_LEN;
    }
    let m = &mut prefix[at..at + headers.len()];
    m.copy_from_slice(headers);
    m[4] = 0xff; // BTH: FECN, BECN, Resv6
    (prefix, total)
}

/// Hashes the masked prefix and the rest of the transport packet.
fn icrc(net: Net, ip: &[u8], udp_header: Option<&[u8]>, transport: &[u8]) -> u32 {
    let (headers, rest) = transport.split_at(bth::HEADER_LEN);
    #[cfg(target_arch = "x86_64")]
    if let Some(crc) = fold::icrc::<false>(net, ip, udp_header, headers, rest, rest.len(), &mut [])
    {
        return crc;
    }
    let (prefix, len) = masked_prefix(net, ip, udp_header, headers);
    portable(&prefix[..len], rest)
}

/// Checks the header layout the copying entry points were given (their callers computed it,
/// so a wrong one is a bug, not bad input).
fn check_headers(headers: &[u8]) {
    assert!(
        (bth::HEADER_LEN..=MAX_HEADERS).contains(&headers.len()),
        "ICRC: {} bytes of BTH and extended headers",
        headers.len()
    );
}

/// The ICRC of a RoCE v2 packet being built, with the payload copied into the packet by the
/// same pass that hashes it (a transmit path reading registered memory: one trip through
/// the payload instead of a copy and then a hash).
///
/// `ip` is the IPv4 (20 bytes) or IPv6 (40 bytes) header, `udp` the UDP header, `headers`
/// the BTH and extended headers, already written. `out` is the payload's place in the
/// packet followed by its pad: `payload` is copied to its start and the pad (under 4 bytes)
/// is zeroed. Panics if `out` is shorter than `payload` or `headers` than a BTH, or if the
/// headers are longer than any opcode's (40 bytes): callers pass a layout they computed.
pub fn v2_copying_payload(
    ip: &[u8],
    udp: &[u8],
    headers: &[u8],
    payload: &[u8],
    out: &mut [u8],
) -> u32 {
    copying_payload(Net::of_v2_header(ip), ip, Some(udp), headers, payload, out)
}

/// [`v2_copying_payload`] for a RoCE v1 packet: `grh` is the 40-byte GRH, and there is no
/// UDP header.
pub fn v1_copying_payload(grh: &[u8], headers: &[u8], payload: &[u8], out: &mut [u8]) -> u32 {
    copying_payload(Net::V6, grh, None, headers, payload, out)
}

fn copying_payload(
    net: Net,
    ip: &[u8],
    udp: Option<&[u8]>,
    headers: &[u8],
    payload: &[u8],
    out: &mut [u8],
) -> u32 {
    check_headers(headers);
    assert!(
        out.len() >= payload.len(),
        "ICRC: payload longer than its place"
    );
    #[cfg(target_arch = "x86_64")]
    if let Some(crc) = fold::icrc::<true>(net, ip, udp, headers, payload, out.len(), out) {
        return crc;
    }
    portable_copying_payload(net, ip, udp, headers, payload, out)
}

/// [`v2_copying_payload`] without the kernel: a copy, then crc32fast.
fn portable_copying_payload(
    net: Net,
    ip: &[u8],
    udp: Option<&[u8]>,
    headers: &[u8],
    payload: &[u8],
    out: &mut [u8],
) -> u32 {
    let (prefix, len) = masked_prefix(net, ip, udp, headers);
    let (data, pad) = out.split_at_mut(payload.len());
    data.copy_from_slice(payload);
    pad.fill(0);
    portable(&prefix[..len], out)
}

/// The ICRC of a received RoCE v2 packet, computed while its payload is copied out to
/// registered memory (one pass over the payload instead of a verify pass then a copy).
/// `ip` the IPv4 (20) or IPv6 (40) header, `udp` the UDP header, `headers` the BTH and
/// extended headers, `payload_and_pad` what follows them up to the ICRC; the first
/// `dst.len()` bytes of it (the payload) are copied to `dst`. Panics if `dst` is longer
/// than `payload_and_pad` or `headers` shorter than a BTH or longer than 40 bytes.
///
/// Returns what [`v2_ipv4`] or [`v2_ipv6`] returns for the same packet; the caller compares
/// it with the received ICRC (and discards what it copied if they differ). The pad is
/// hashed but not copied.
pub fn v2_copying_out(
    ip: &[u8],
    udp: &[u8],
    headers: &[u8],
    payload_and_pad: &[u8],
    dst: &mut [u8],
) -> u32 {
    check_headers(headers);
    assert!(
        dst.len() <= payload_and_pad.len(),
        "ICRC: destination longer than the payload"
    );
    let net = Net::of_v2_header(ip);
    let hashed = payload_and_pad.len();
    #[cfg(target_arch = "x86_64")]
    if let Some(crc) = fold::icrc::<true>(net, ip, Some(udp), headers, payload_and_pad, hashed, dst)
    {
        return crc;
    }
    portable_copying_out(net, ip, udp, headers, payload_and_pad, dst)
}

/// [`v2_copying_out`] without the kernel: crc32fast, then a copy.
fn portable_copying_out(
    net: Net,
    ip: &[u8],
    udp: &[u8],
    headers: &[u8],
    payload_and_pad: &[u8],
    dst: &mut [u8],
) -> u32 {
    dst.copy_from_slice(&payload_and_pad[..dst.len()]);
    let (prefix, len) = masked_prefix(net, ip, Some(udp), headers);
    portable(&prefix[..len], payload_and_pad)
}

/// The ICRC of `prefix` (hashed from a zero register) and `rest`, through crc32fast.
fn portable(prefix: &[u8], rest: &[u8]) -> u32 {
    // A crc32fast state of all ones is a zero register (it keeps the register inverted).
    let mut h = crc32fast::Hasher::new_with_initial(ZERO_REGISTER);
    h.update(prefix);
    h.update(rest);
    h.finalize()
}

/// The crc32fast state that stands for a CRC register of 0.
const ZERO_REGISTER: u32 = 0xffff_ffff;

/// The reflected CRC-32 polynomial (0x04C11DB7 with its bits reversed; x^32 implied).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the kernel's constants
const POLY_REFLECTED: u32 = 0xedb8_8320;

/// `v * x^n mod P` for `v` in the reflected representation (bit 31 - i holds the
/// coefficient of x^i), by shifting: multiplying by x moves every coefficient one bit down,
/// and a coefficient leaving x^31 for x^32 is replaced by P - x^32.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the kernel's constants
const fn times_x_pow(mut v: u32, n: usize) -> u32 {
    let mut i = 0;
    while i < n {
        v = if v & 1 != 0 {
            (v >> 1) ^ POLY_REFLECTED
        } else {
            v >> 1
        };
        i += 1;
    }
    v
}

/// `x^n mod P`, reflected.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the kernel's constants
const fn x_pow(n: usize) -> u32 {
    times_x_pow(1 << 31, n)
}

/// A fold multiplier as the carry-less multiply kernel wants it: the reflected 32-bit
/// remainder shifted left by one (the product of two reflected operands comes out one bit
/// low; the shift puts it back). The same form as crc32fast's and Intel's constants.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the kernel's constants
const fn multiplier(reflected: u32) -> u64 {
    (reflected as u64) << 1
}

/// CRC-32 by carry-less multiplication over the whole ICRC input in one pass (Gopal et al.,
/// "Fast CRC computation for generic polynomials using PCLMULQDQ", Intel 2009), shaped for
/// a short, fixed latency per call:
///
/// - The masked prefix is built in registers (masked loads of the IP, UDP and BTH headers,
///   shifted into place by whole words, ORed with the masks) and zero-padded *in front* to
///   whole 64-byte blocks, which a zero CRC register ignores. The stream is aligned so that
///   it *ends* on a block boundary: when the data is not a multiple of 64 bytes, its first
///   `len % 64` bytes join the prefix blocks (byte permutes place them) and every later
///   block is a whole one, so there is no tail to finish through another path.
/// - Every block is multiplied once, straight to the end of the stream, by per-distance
///   constants from a table (`x^(128 d + 96)` and `x^(128 d + 32)` mod P for the 128-bit
///   lane `d` lanes from the end), and the products XORed: the prefix blocks are folded
///   in parallel with the data instead of before it, and the four accumulators of the main
///   loop, their lanes and the last group of blocks need one multiply level instead of a
///   dependent tree.
/// - The sum, 96 bits, is reduced by one Barrett step (two multiplies deep).
///
/// Inputs longer than the table (not a RoCE packet: the MTU is at most 4096) take the
/// portable path.
///
/// The only unsafe code outside the shared-memory rings: SIMD intrinsics. The kernels are
/// safe `#[target_feature]` functions (so the compiler checks their bodies); `unsafe` is
/// confined to the calls into them, made only after the CPU features they need were
/// detected, and to the loads and stores, each bounds-checked through a slice first.
#[cfg(target_arch = "x86_64")]
mod fold {
    #![allow(unsafe_code)]

    use super::{bth, ipv4, multiplier, times_x_pow, x_pow, Net};
    use std::arch::x86_64::*;
    use std::sync::atomic::{AtomicU8, Ordering};

    /// The longest stream, in 64-byte blocks, the distance table covers: 5 KiB, above any
    /// RoCE packet (4096 bytes of payload, 40 of headers, 92 of prefix).
    pub(super) const MAX_BLOCKS: usize = 80;

    /// For each distance `D` (in 64-byte blocks) from a block to the end of the stream, the
    /// multipliers for its four 128-bit lanes, which are `d = 4 D + 3 - lane` lanes from the
    /// end: `x^(128 d + 96)` (for the lane's first 8 bytes) and `x^(128 d + 32)` (its last
    /// 8) mod P. That carries the lane over `128 d` bits and then 64 more, so every product
    /// lands in the same 96-bit place (the "128 to 96 bits" step of the reduction, for lane 0
    /// of the last block exactly that step).
    pub(super) static FOLD_TO_END: [[u64; 8]; MAX_BLOCKS] = fold_to_end_table();

    const fn fold_to_end_table() -> [[u64; 8]; MAX_BLOCKS] {
        let mut table = [[0u64; 8]; MAX_BLOCKS];
        let mut first = x_pow(96);
        let mut last = x_pow(32);
        let mut d = 0;
        while d < 4 * MAX_BLOCKS {
            let lane = 3 - d % 4;
            table[d / 4][2 * lane] = multiplier(first);
            table[d / 4][2 * lane + 1] = multiplier(last);
            first = times_x_pow(first, 128);
            last = times_x_pow(last, 128);
            d += 1;
        }
        table
    }

    /// The main loop's fold over four blocks (2048 bits): `x^(2048 + 32)` for each lane's
    /// first 8 bytes and `x^(2048 - 32)` for its last 8.
    pub(super) const FOLD_4_BLOCKS: (u64, u64) = (multiplier(x_pow(2080)), multiplier(x_pow(2016)));
    /// The Barrett constants: P (33 bits, reflected: P times x^31 in a 64-bit register)
    /// and the low 64 bits of mu = floor(x^96 / P) (its x^64 term is implied), reflected.
    pub(super) const P_X: u64 = 0x1DB710641;
    pub(super) const MU96_LOW: u64 = mu96_low();

    /// floor(x^96 / P) by long division, without its x^64 term, bit-reflected.
    const fn mu96_low() -> u64 {
        let p = 0x1_04c1_1db7u128;
        let (mut rem, mut quotient) = (1u128 << 96, 0u128);
        let mut bit = 65;
        while bit > 0 {
            bit -= 1;
            if rem & (1 << (bit + 32)) != 0 {
                rem ^= p << bit;
                quotient |= 1 << bit;
            }
        }
        (quotient as u64).reverse_bits()
    }

    /// How far ahead of the stores the copying kernels prefetch the destination.
    const PREFETCH_AHEAD: usize = 1024;

    /// 0, 1, ..., 63: the identity byte permutation.
    static IOTA: [u8; 64] = {
        let mut t = [0u8; 64];
        let mut i = 0;
        while i < 64 {
            t[i] = i as u8;
            i += 1;
        }
        t
    };

    /// The masks of the prefix as laid out in the first register (4 bytes of ones, then the
    /// network header, the UDP header if any, the BTH): ones where a field is masked.
    const fn prefix_mask(net: Net, udp: bool) -> [u8; 64] {
        let mut m = [0u8; 64];
        m[0] = 0xff;
        m[1] = 0xff;
        m[2] = 0xff;
        m[3] = 0xff;
        let bth_at = match net {
            Net::V4 => {
                m[4 + 1] = 0xff; // TOS
                m[4 + 8] = 0xff; // TTL
                m[4 + 10] = 0xff; // header checksum
                m[4 + 11] = 0xff;
                4 + 20
            }
            Net::V6 => {
                m[4] = 0x0f; // traffic class and flow label
                m[4 + 1] = 0xff;
                m[4 + 2] = 0xff;
                m[4 + 3] = 0xff;
                m[4 + 7] = 0xff; // hop limit
                4 + 40
            }
        };
        let bth_at = if udp {
            m[bth_at + 6] = 0xff; // UDP checksum
            m[bth_at + 7] = 0xff;
            bth_at + 8
        } else {
            bth_at
        };
        m[bth_at + 4] = 0xff; // BTH: FECN, BECN, Resv6
        m
    }

    static MASK_V4_UDP: [u8; 64] = prefix_mask(Net::V4, true);
    static MASK_V6_UDP: [u8; 64] = prefix_mask(Net::V6, true);
    static MASK_V6: [u8; 64] = prefix_mask(Net::V6, false);
    /// [`MASK_V4_UDP`] moved to the end of the block, for a prefix of 44 bytes.
    static MASK_V4_UDP_LAST: [u8; 64] = {
        let m = prefix_mask(Net::V4, true);
        let mut last = [0u8; 64];
        let mut i = 0;
        while i < 44 {
            last[20 + i] = m[i];
            i += 1;
        }
        last
    };

    /// 0 = not probed yet, 1 = absent, 2 = present.
    static FEATURES: AtomicU8 = AtomicU8::new(0);

    /// Whether the CPU has the instructions of this kernel (one relaxed load once probed).
    #[inline]
    pub(super) fn available() -> bool {
        match FEATURES.load(Ordering::Relaxed) {
            2 => true,
            1 => false,
            _ => probe(),
        }
    }

    #[cold]
    fn probe() -> bool {
        let yes = is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vbmi")
            && is_x86_feature_detected!("vpclmulqdq")
            && is_x86_feature_detected!("pclmulqdq")
            && is_x86_feature_detected!("sse4.1");
        FEATURES.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
        yes
    }

    /// The ICRC of the masked prefix (`net`, `ip`, `udp`, `headers`) followed by `src` and
    /// zeros up to `hashed` bytes. With `COPY`, the first `dst.len()` bytes of that data are
    /// also stored to `dst`. None when the CPU lacks the instructions or the input is longer
    /// than the table (the caller takes the portable path; nothing was written then).
    ///
    /// Callers guarantee `src.len() <= hashed`, `dst.len() <= hashed` and a BTH-sized or
    /// longer `headers` of at most [`super::MAX_HEADERS`] bytes.
    pub(super) fn icrc<const COPY: bool>(
        net: Net,
        ip: &[u8],
        udp: Option<&[u8]>,
        headers: &[u8],
        src: &[u8],
        hashed: usize,
        dst: &mut [u8],
    ) -> Option<u32> {
        if !available() || headers.len() > super::MAX_HEADERS {
            return None;
        }
        assert!(src.len() <= hashed && dst.len() <= hashed);
        let prefix_len =
            4 + net.header_len() + udp.map_or(0, |_| super::udp::HEADER_LEN) + headers.len();
        let head_blocks = (prefix_len + hashed % 64).div_ceil(64);
        if hashed / 64 + head_blocks > MAX_BLOCKS {
            return None;
        }
        let ip = &ip[..net.header_len()];
        let udp = udp.map(|u| &u[..super::udp::HEADER_LEN]);
        if net == Net::V4 && udp.is_none() {
            return None; // no RoCE packet is IPv4 without UDP
        }
        let headers = Headers { ip, udp, headers };
        // SAFETY: the features the kernel needs were detected above.
        Some(unsafe { kernel::<COPY>(headers, prefix_len, src, hashed, dst) })
    }

    /// The headers the prefix is made of.
    struct Headers<'a> {
        ip: &'a [u8],
        udp: Option<&'a [u8]>,
        headers: &'a [u8],
    }

    /// `x` moved up (to higher addresses) by `N` 32-bit words, zeros shifted in: valignd of
    /// `x` over a zero register.
    macro_rules! shift_up_dwords {
        ($x:expr, $n:literal) => {
            _mm512_alignr_epi32::<{ 16 - $n }>($x, _mm512_setzero_si512())
        };
    }

    /// The words of `x` from the `N`th on, moved down to the start.
    macro_rules! shift_down_dwords {
        ($x:expr, $n:literal) => {
            _mm512_alignr_epi32::<$n>(_mm512_setzero_si512(), $x)
        };
    }

    /// The masked prefix of an IPv4 RoCE v2 packet, left-aligned in two registers:
    /// ones (4), IP (20), UDP (8), then the headers from byte 32.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn prefix_v4_udp(ip: &[u8], udp: &[u8], headers: &[u8]) -> [__m512i; 2] {
        let (ip, udp, h) = (load_masked(ip), load_masked(udp), load_masked(headers));
        let first = _mm512_ternarylogic_epi64::<0xfe>(
            shift_up_dwords!(ip, 1),
            shift_up_dwords!(udp, 6),
            shift_up_dwords!(h, 8),
        );
        [
            _mm512_or_si512(first, load_masked(&MASK_V4_UDP)),
            shift_down_dwords!(h, 8),
        ]
    }

    /// The prefix of an IPv4 RoCE v2 packet with a BTH only, right-aligned in one block:
    /// 20 zeros, ones (4), IP (20), UDP (8), BTH (12).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn prefix_v4_udp_bth_last(ip: &[u8], udp: &[u8], bth: &[u8]) -> __m512i {
        let (ip, udp, bth) = (load_masked(ip), load_masked(udp), load_masked(bth));
        let prefix = _mm512_ternarylogic_epi64::<0xfe>(
            shift_up_dwords!(ip, 6),
            shift_up_dwords!(udp, 11),
            shift_up_dwords!(bth, 13),
        );
        _mm512_or_si512(prefix, load_masked(&MASK_V4_UDP_LAST))
    }

    /// As [`prefix_v4_udp`] for IPv6: ones (4), IP (40), UDP (8), headers from byte 52.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn prefix_v6_udp(ip: &[u8], udp: &[u8], headers: &[u8]) -> [__m512i; 2] {
        let (ip, udp, h) = (load_masked(ip), load_masked(udp), load_masked(headers));
        let first = _mm512_ternarylogic_epi64::<0xfe>(
            shift_up_dwords!(ip, 1),
            shift_up_dwords!(udp, 11),
            shift_up_dwords!(h, 13),
        );
        [
            _mm512_or_si512(first, load_masked(&MASK_V6_UDP)),
            shift_down_dwords!(h, 3),
        ]
    }

    /// As [`prefix_v4_udp`] for RoCE v1: ones (4), GRH (40), headers from byte 44.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn prefix_v6(grh: &[u8], headers: &[u8]) -> [__m512i; 2] {
        let (grh, h) = (load_masked(grh), load_masked(headers));
        let first = _mm512_or_si512(shift_up_dwords!(grh, 1), shift_up_dwords!(h, 11));
        [
            _mm512_or_si512(first, load_masked(&MASK_V6)),
            shift_down_dwords!(h, 5),
        ]
    }

    /// The CRC of the masked prefix of `headers` (`prefix_len` bytes), `src` and zeros up to `hashed` bytes; with `COPY` the first `dst.len()` bytes of the
    /// data are stored to `dst`. The caller checked that the stream fits the table.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,vpclmulqdq,pclmulqdq,sse4.1")]
    fn kernel<const COPY: bool>(
        headers: Headers<'_>,
        prefix_len: usize,
        src: &[u8],
        hashed: usize,
        dst: &mut [u8],
    ) -> u32 {
        let zero = _mm512_setzero_si512();
        // The stream ends on a block boundary: the data's first `hashed % 64` bytes go
        // into the last head block, behind the prefix, and the rest is whole blocks.
        let head_data = hashed % 64;
        let head_len = prefix_len + head_data;
        let head_blocks = head_len.div_ceil(64);
        let body_blocks = hashed / 64;
        let (src_head, src) = src.split_at(head_data.min(src.len()));
        let data = load_masked(src_head);
        let dst = if COPY {
            let (dst_head, rest) = dst.split_at_mut(head_data.min(dst.len()));
            store_masked(dst_head, data);
            rest
        } else {
            dst
        };

        let mut distance = body_blocks + head_blocks;
        let mut sum;
        if let (0, bth::HEADER_LEN, Some(udp), ipv4::HEADER_LEN) = (
            head_data,
            headers.headers.len(),
            headers.udp,
            headers.ip.len(),
        ) {
            // The usual IPv4 packet (BTH only, whole blocks of payload): its 44-byte prefix
            // goes straight to the end of one block, with no permute.
            distance -= 1;
            let h0 = prefix_v4_udp_bth_last(headers.ip, udp, headers.headers);
            sum = fold_to_end(h0, distance, zero);
        } else {
            sum = head_to_end(headers, prefix_len, data, head_data, &mut distance);
        }
        debug_assert_eq!(distance, body_blocks);

        // Body: whole blocks, four at a time in the main loop as long as `src` (and `dst`)
        // hold them; the rest (under four, or a last block with the pad or the zeros) one
        // at a time, loaded and stored through masks.
        let available = if COPY {
            src.len().min(dst.len())
        } else {
            src.len()
        };
        let groups = (available / 64).min(body_blocks) / 4;
        let (mut src_groups, mut src_rest) = src.split_at(groups * 256);
        let (mut dst_groups, mut dst_rest) = if COPY {
            dst.split_at_mut(groups * 256)
        } else {
            (&mut [][..], dst)
        };
        let mut trail = body_blocks - groups * 4;
        while trail > 0 {
            trail -= 1;
            let (block, rest) = src_rest.split_at(src_rest.len().min(64));
            src_rest = rest;
            let v = load_masked(block);
            if COPY {
                let n = dst_rest.len().min(64);
                let (block, rest) = std::mem::take(&mut dst_rest).split_at_mut(n);
                store_masked(block, v);
                dst_rest = rest;
            }
            sum = fold_to_end(v, trail, sum);
        }
        if groups > 0 {
            let mut v0 = take512::<COPY>(&mut src_groups, &mut dst_groups);
            let mut v1 = take512::<COPY>(&mut src_groups, &mut dst_groups);
            let mut v2 = take512::<COPY>(&mut src_groups, &mut dst_groups);
            let mut v3 = take512::<COPY>(&mut src_groups, &mut dst_groups);
            let k = _mm512_set_epi64(
                FOLD_4_BLOCKS.1 as i64,
                FOLD_4_BLOCKS.0 as i64,
                FOLD_4_BLOCKS.1 as i64,
                FOLD_4_BLOCKS.0 as i64,
                FOLD_4_BLOCKS.1 as i64,
                FOLD_4_BLOCKS.0 as i64,
                FOLD_4_BLOCKS.1 as i64,
                FOLD_4_BLOCKS.0 as i64,
            );
            // The last group is not folded into the accumulators: it and they are carried
            // straight to the end side by side (one multiply level less on the way out).
            while src_groups.len() > 256 {
                if COPY {
                    // Ask for the destination lines a few groups ahead with intent to write:
                    // registered memory is usually cold, and the loop would otherwise wait
                    // for each line's read-for-ownership.
                    if let Some(ahead) = dst_groups.get(PREFETCH_AHEAD..) {
                        for line in 0..4 {
                            if let Some(l) = ahead.get(line * 64..) {
                                // A hint: it never faults, so it is a safe intrinsic.
                                _mm_prefetch::<_MM_HINT_ET0>(l.as_ptr().cast());
                            }
                        }
                    }
                }
                v0 = fold512(v0, take512::<COPY>(&mut src_groups, &mut dst_groups), k);
                v1 = fold512(v1, take512::<COPY>(&mut src_groups, &mut dst_groups), k);
                v2 = fold512(v2, take512::<COPY>(&mut src_groups, &mut dst_groups), k);
                v3 = fold512(v3, take512::<COPY>(&mut src_groups, &mut dst_groups), k);
            }
            // The trail blocks follow the last group.
            let d = body_blocks - groups * 4;
            if src_groups.is_empty() {
                sum = group_to_end([v0, v1, v2, v3], d, sum);
            } else {
                let w0 = take512::<COPY>(&mut src_groups, &mut dst_groups);
                let w1 = take512::<COPY>(&mut src_groups, &mut dst_groups);
                let w2 = take512::<COPY>(&mut src_groups, &mut dst_groups);
                let w3 = take512::<COPY>(&mut src_groups, &mut dst_groups);
                sum = group_to_end([v0, v1, v2, v3], d + 4, sum);
                sum = group_to_end([w0, w1, w2, w3], d, sum);
            }
        }
        reduce(sum)
    }

    /// The general head: zeros, the prefix, and the data's first `head_data` bytes (in
    /// `data`), each head block carried to the end; `distance` counts down past them. The
    /// prefix moves up by `lead` bytes (the zeros in front) with two-register byte
    /// permutes; the data moves to the end of the last head block.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,vpclmulqdq")]
    fn head_to_end(
        headers: Headers<'_>,
        prefix_len: usize,
        data: __m512i,
        head_data: usize,
        distance: &mut usize,
    ) -> __m512i {
        let zero = _mm512_setzero_si512();
        let head_len = prefix_len + head_data;
        let head_blocks = head_len.div_ceil(64);
        let lead = head_blocks * 64 - head_len;
        let iota = load_masked(&IOTA);
        let [q0, q1] = match headers.udp {
            Some(udp) if headers.ip.len() == ipv4::HEADER_LEN => {
                prefix_v4_udp(headers.ip, udp, headers.headers)
            }
            Some(udp) => prefix_v6_udp(headers.ip, udp, headers.headers),
            None => prefix_v6(headers.ip, headers.headers),
        };
        let data_up = if head_data == 0 {
            zero
        } else {
            // Byte i takes byte i - (64 - head_data) of `data`, the first 64 - head_data
            // bytes become zeros (vpermb uses the index modulo 64).
            let index = _mm512_add_epi8(iota, _mm512_set1_epi8(head_data as i8));
            _mm512_maskz_permutexvar_epi8(u64::MAX << (64 - head_data), index, data)
        };
        let [h0, h1, h2] = if lead == 0 {
            [q0, q1, zero]
        } else {
            let up = _mm512_add_epi8(iota, _mm512_set1_epi8((64 - lead) as i8));
            [
                _mm512_permutex2var_epi8(zero, up, q0),
                _mm512_permutex2var_epi8(q0, up, q1),
                _mm512_permutex2var_epi8(q1, up, zero),
            ]
        };
        let mut sum = zero;
        for (i, h) in [h0, h1, h2].into_iter().enumerate().take(head_blocks) {
            *distance -= 1;
            let h = if i + 1 == head_blocks {
                _mm512_or_si512(h, data_up)
            } else {
                h
            };
            sum = fold_to_end(h, *distance, sum);
        }
        sum
    }

    /// `sum` plus four consecutive blocks, the last `distance` blocks from the end, each
    /// carried to the end (one multiply level), XORed in a two-level ternary-logic tree.
    #[inline]
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    fn group_to_end(v: [__m512i; 4], distance: usize, sum: __m512i) -> __m512i {
        let t = [
            table(distance + 3),
            table(distance + 2),
            table(distance + 1),
            table(distance),
        ];
        let a = _mm512_ternarylogic_epi64::<0x96>(
            _mm512_clmulepi64_epi128::<0x00>(v[0], t[0]),
            _mm512_clmulepi64_epi128::<0x11>(v[0], t[0]),
            _mm512_clmulepi64_epi128::<0x00>(v[1], t[1]),
        );
        let b = _mm512_ternarylogic_epi64::<0x96>(
            _mm512_clmulepi64_epi128::<0x11>(v[1], t[1]),
            _mm512_clmulepi64_epi128::<0x00>(v[2], t[2]),
            _mm512_clmulepi64_epi128::<0x11>(v[2], t[2]),
        );
        let c = _mm512_ternarylogic_epi64::<0x96>(
            _mm512_clmulepi64_epi128::<0x00>(v[3], t[3]),
            _mm512_clmulepi64_epi128::<0x11>(v[3], t[3]),
            sum,
        );
        _mm512_ternarylogic_epi64::<0x96>(a, b, c)
    }

    /// The multipliers for a block `distance` blocks from the end.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn table(distance: usize) -> __m512i {
        let t = &FOLD_TO_END[distance];
        // SAFETY: `t` is 64 readable bytes; the load has no alignment requirement.
        unsafe { _mm512_loadu_si512(t.as_ptr().cast()) }
    }

    /// `sum` plus block `v`, `distance` blocks from the end, carried to the end.
    #[inline]
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    fn fold_to_end(v: __m512i, distance: usize, sum: __m512i) -> __m512i {
        let t = table(distance);
        let lo = _mm512_clmulepi64_epi128::<0x00>(v, t);
        let hi = _mm512_clmulepi64_epi128::<0x11>(v, t);
        _mm512_ternarylogic_epi64::<0x96>(sum, lo, hi)
    }

    /// Reduces the four 96-bit lane sums to the final CRC-32 (inverted, as transmitted):
    /// the lanes added, then one Barrett reduction from 96 bits (two multiplies deep
    /// instead of a 96 -> 64 fold followed by the 64-bit Barrett of Gopal et al.).
    ///
    /// In the bit-reflected layout (bit i of an n-bit register holds the coefficient of
    /// x^(n-1-i)) the sum S holds S' (degree < 96, congruent to the CRC) in bits 0..95, so
    /// its low 64 bits are X1 = floor(S' / x^32) and bits 64..95 are S' mod x^32. Barrett
    /// with mu = floor(x^96 / P) = x^64 + m: the quotient q = floor(X1 mu / x^64) = X1 +
    /// floor(X1 m / x^64); the product of two reflected registers comes out one bit low,
    /// hence the shift. The remainder is (S' + q P) mod x^32 = (S' mod x^32) + (q P mod
    /// x^32), which the multiply by `P_X` (P times x^31, reflected) leaves in bits 64..95.
    #[inline]
    #[target_feature(enable = "avx512f,pclmulqdq,sse4.1")]
    fn reduce(sum: __m512i) -> u32 {
        let half = _mm256_xor_si256(
            _mm512_castsi512_si256(sum),
            _mm512_extracti64x4_epi64::<1>(sum),
        );
        let s = _mm_xor_si128(
            _mm256_castsi256_si128(half),
            _mm256_extracti128_si256::<1>(half),
        );
        let k = _mm_set_epi64x(P_X as i64, MU96_LOW as i64);
        let t1 = _mm_clmulepi64_si128::<0x00>(s, k);
        let q = _mm_xor_si128(s, _mm_slli_epi64::<1>(t1));
        let t2 = _mm_clmulepi64_si128::<0x10>(q, k);
        !(_mm_extract_epi32::<2>(_mm_xor_si128(s, t2)) as u32)
    }

    #[inline]
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    fn fold512(a: __m512i, b: __m512i, k: __m512i) -> __m512i {
        let lo = _mm512_clmulepi64_epi128::<0x00>(a, k);
        let hi = _mm512_clmulepi64_epi128::<0x11>(a, k);
        // b ^ lo ^ hi in one instruction.
        _mm512_ternarylogic_epi64::<0x96>(b, lo, hi)
    }

    /// The first `bytes.len()` (at most 64) bytes as a register, zeros after them.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn load_masked(bytes: &[u8]) -> __m512i {
        let n = bytes.len().min(64);
        if n == 0 {
            // Not a masked load with an empty mask: AMD Zen 4 takes tens of nanoseconds
            // over those (and the pointer of an empty slice may be dangling).
            return _mm512_setzero_si512();
        }
        if n == 64 {
            // SAFETY: `bytes` is at least 64 readable bytes; no alignment requirement.
            return unsafe { _mm512_loadu_si512(bytes.as_ptr().cast()) };
        }
        let mask = u64::MAX.checked_shr(64 - n as u32).unwrap_or(0);
        // SAFETY: the mask selects the first `n` bytes, all inside `bytes`; the bytes it
        // leaves out are not accessed (masked loads do not fault on them).
        unsafe { _mm512_maskz_loadu_epi8(mask, bytes.as_ptr().cast()) }
    }

    /// Stores the first `dst.len()` (at most 64) bytes of `v` to `dst`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn store_masked(dst: &mut [u8], v: __m512i) {
        let n = dst.len().min(64);
        if n == 0 {
            // As in `load_masked`: an empty-mask store is slow on AMD Zen 4.
            return;
        }
        if n == 64 {
            // SAFETY: `dst` is at least 64 writable bytes; no alignment requirement.
            return unsafe { _mm512_storeu_si512(dst.as_mut_ptr().cast(), v) };
        }
        let mask = u64::MAX.checked_shr(64 - n as u32).unwrap_or(0);
        // SAFETY: the mask selects the first `n` bytes, all inside `dst`; the others are
        // not written.
        unsafe { _mm512_mask_storeu_epi8(dst.as_mut_ptr().cast(), mask, v) }
    }

    /// Loads the next 64 bytes of `src` (and with `COPY` stores them to the next 64 bytes
    /// of `dst`), advancing both; panics rather than over-reads or over-writes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn take512<const COPY: bool>(src: &mut &[u8], dst: &mut &mut [u8]) -> __m512i {
        let (bytes, rest) = src.split_at(64);
        // SAFETY: `bytes` is 64 readable bytes; the load has no alignment requirement.
        let v = unsafe { _mm512_loadu_si512(bytes.as_ptr().cast()) };
        *src = rest;
        if COPY {
            let (head, tail) = std::mem::take(dst).split_at_mut(64);
            // SAFETY: `head` is 64 writable bytes; the store has no alignment requirement.
            unsafe { _mm512_storeu_si512(head.as_mut_ptr().cast(), v) };
            *dst = tail;
        }
        v
    }
}

/// Which implementation computes ICRCs on this CPU: the carry-less multiply kernel (AVX-512
/// F, BW and VBMI with VPCLMULQDQ) or crc32fast. Benchmarks print it beside their figures,
/// which depend on it.
pub fn implementation() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    if fold::available() {
        return "AVX-512 VPCLMULQDQ kernel";
    }
    "crc32fast (this CPU lacks the AVX-512 kernel's instructions)"
}

/// ICRC of a RoCE v2 packet over IPv4. `ip` is the 20-byte header, `udp` the 8-byte header,
/// `transport` the BTH through the pad (without the ICRC). Panics if a header is shorter than
/// its fixed length or `transport` is shorter than a BTH: callers pass checked views.
pub fn v2_ipv4(ip: &[u8], udp: &[u8], transport: &[u8]) -> u32 {
    icrc(Net::V4, ip, Some(udp), transport)
}

/// ICRC of a RoCE v2 packet over IPv6.
pub fn v2_ipv6(ip: &[u8], udp: &[u8], transport: &[u8]) -> u32 {
    icrc(Net::V6, ip, Some(udp), transport)
}

/// ICRC of a RoCE v1 packet: GRH (masked like IPv6: TClass, FlowLabel, HopLmt) then the
/// transport. Derived from the IB global-packet rule; rxe has no v1 to compare with.
pub fn v1(grh: &[u8], transport: &[u8]) -> u32 {
    icrc(Net::V6, grh, None, transport)
}

/// Offset of the IPv4 Identification in the CRC's input (after the 8 bytes of ones).
const IDENT_OFFSET: usize = LRH_ONES.len() + 4;

/// Solves for the IPv4 Identification of a received RoCE v2 packet whose IP header the
/// receiver did not see (a plain UDP socket).
///
/// `ip_with_zero_ident` is the header rebuilt from what the socket does report (addresses,
/// lengths, DF) with Identification 0; `carried` is the ICRC in the packet. The CRC is affine
/// over GF(2), so `crc(ident = x) = crc(ident = 0) ^ L(x)` for a linear map `L` that depends
/// only on how many bytes follow the Identification. The function solves `L(x) = carried ^
/// crc(ident = 0)` and returns `x`, or `None` when no Identification explains the ICRC (a
/// corrupted packet: this happens with probability 1 - 2^-16, so the check keeps 16 of its 32
/// bits of strength).
pub fn recover_ipv4_ident(
    ip_with_zero_ident: &[u8],
    udp: &[u8],
    transport: &[u8],
    carried: u32,
) -> Option<u16> {
    let c0 = v2_ipv4(ip_with_zero_ident, udp, transport);
    let delta = c0 ^ carried;
    if delta == 0 {
        return Some(0);
    }
    let crc_input_len = LRH_ONES.len() + ipv4::HEADER_LEN + udp::HEADER_LEN + transport.len();
    IdentBasis::for_input_len(crc_input_len).solve(delta)
}

/// An XOR basis of the 16 vectors `L(1 << i)`, kept in echelon form so that solving for `x` is
/// 16 conditional XORs.
#[derive(Debug, Clone, Copy)]
pub struct IdentBasis {
    /// (pivot bit, vector, the combination of Identification bits it stands for)
    rows: [(u32, u32, u16); 16],
    len: usize,
}

impl IdentBasis {
    /// Builds the basis for a CRC input of `input_len` bytes. It costs 17 CRCs over that
    /// length, so callers that see many packets cache it per length ([`IdentSolver`]).
    pub fn for_input_len(input_len: usize) -> IdentBasis {
        let mut zeros = vec![0u8; input_len.max(IDENT_OFFSET + 2)];
        let base = crc32fast::hash(&zeros);
        let mut basis = IdentBasis {
            rows: [(0, 0, 0); 16],
            len: 0,
        };
        for bit in 0..16u32 {
            let x = 1u16 << bit;
            zeros[IDENT_OFFSET..IDENT_OFFSET + 2].copy_from_slice(&x.to_be_bytes());
            let v = crc32fast::hash(&zeros) ^ base;
            zeros[IDENT_OFFSET] = 0;
            zeros[IDENT_OFFSET + 1] = 0;
            basis.insert(v, x);
        }
        basis
    }

    fn insert(&mut self, mut v: u32, mut combo: u16) {
        for &(pivot, row, row_combo) in &self.rows[..self.len] {
            if v & pivot != 0 {
                v ^= row;
                combo ^= row_combo;
            }
        }
        if v != 0 && self.len < self.rows.len() {
            let pivot = 1u32 << (31 - v.leading_zeros());
            // Keep the basis reduced: clear the new pivot from earlier rows.
            for row in &mut self.rows[..self.len] {
                if row.1 & pivot != 0 {
                    row.1 ^= v;
                    row.2 ^= combo;
                }
            }
            self.rows[self.len] = (pivot, v, combo);
            self.len += 1;
        }
    }

    /// The Identification `x` with `L(x) == delta`, if there is one.
    pub fn solve(&self, mut delta: u32) -> Option<u16> {
        let mut x = 0u16;
        for &(pivot, row, combo) in &self.rows[..self.len] {
            if delta & pivot != 0 {
                delta ^= row;
                x ^= combo;
            }
        }
        (delta == 0).then_some(x)
    }
}

/// A per-length cache of [`IdentBasis`] for a receive path that verifies every packet.
#[derive(Debug, Default)]
pub struct IdentSolver {
    cache: Vec<Option<IdentBasis>>,
}

impl IdentSolver {
    pub fn new() -> Self {
        Self::default()
    }

    /// As [`recover_ipv4_ident`], with the basis for each packet length built once.
    pub fn recover(
        &mut self,
        ip_with_zero_ident: &[u8],
        udp: &[u8],
        transport: &[u8],
        carried: u32,
    ) -> Option<u16> {
        let c0 = v2_ipv4(ip_with_zero_ident, udp, transport);
        let delta = c0 ^ carried;
        if delta == 0 {
            return Some(0);
        }
        let len = transport.len();
        if len >= 1 << 16 {
            return None;
        }
        if self.cache.len() <= len {
            self.cache.resize(len + 1, None);
        }
        let input_len = LRH_ONES.len() + ipv4::HEADER_LEN + udp::HEADER_LEN + len;
        self.cache[len]
            .get_or_insert_with(|| IdentBasis::for_input_len(input_len))
            .solve(delta)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    // roce-rxe-facts.md §3.3: RC SEND_ONLY "hello", 192.168.1.10 -> .20.
    const IP: &str = "45000034000040004011b74ac0a8010ac0a80114";
    const UDP: &str = "c13212b700200000";
    const TRANSPORT: &str = "0430ffff0000001280000100 68656c6c6f000000";

    /// The ICRC by its definition (IBTA §7.8.1 with the RoCE v2 masks): one crc32fast call
    /// over the whole masked input, built byte by byte.
    fn reference(ip: &[u8], udp: Option<&[u8]>, transport: &[u8]) -> u32 {
        let mut input = vec![0xffu8; 8];
        let mut net = ip.to_vec();
        if ip.len() == 20 {
            net[1] = 0xff;
            net[8] = 0xff;
            net[10] = 0xff;
            net[11] = 0xff;
        } else {
            net[0] |= 0x0f;
            net[1] = 0xff;
            net[2] = 0xff;
            net[3] = 0xff;
            net[7] = 0xff;
        }
        input.extend_from_slice(&net);
        if let Some(u) = udp {
            input.extend_from_slice(&u[..6]);
            input.extend_from_slice(&[0xff, 0xff]);
        }
        let mut t = transport.to_vec();
        t[4] = 0xff;
        input.extend_from_slice(&t);
        crc32fast::hash(&input)
    }

    #[test]
    fn every_length_matches_the_definition() {
        // Pseudo-random bytes so that no block repeats.
        let mut seed = 0x1234_5678_9abc_def0u64;
        let bytes: Vec<u8> = (0..4200 + 64)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        let ip4 = &bytes[..20];
        let ip6 = &bytes[20..60];
        let udp_h = &bytes[60..68];
        let lens = (12..700).chain((700..4200).step_by(61)).chain([
            1024 + 12,
            1024 + 28,
            4096 + 12,
            4096 + 28,
            4096 + 44,
            4096 + 40,
            255,
            256,
            257,
            268,
            271,
            272,
            4200,
        ]);
        for len in lens {
            // Several alignments of the transport within its buffer.
            for skew in [0usize, 1, 3, 8] {
                let t = &bytes[64 + skew..][..len.min(4200 - skew)];
                assert_eq!(
                    v2_ipv4(ip4, udp_h, t),
                    reference(ip4, Some(udp_h), t),
                    "v4 {len}"
                );
                assert_eq!(
                    v2_ipv6(ip6, udp_h, t),
                    reference(ip6, Some(udp_h), t),
                    "v6 {len}"
                );
                assert_eq!(v1(ip6, t), reference(ip6, None, t), "v1 {len}");
            }
        }
    }

    /// x^n mod P by plain (not reflected) polynomial arithmetic, then reflected: an
    /// independent check of `x_pow` and of every constant built from it.
    fn x_pow_plain(n: usize) -> u32 {
        let mut r = 1u64;
        for _ in 0..n {
            r <<= 1;
            if r & (1 << 32) != 0 {
                r ^= 0x1_04c1_1db7;
            }
        }
        (r as u32).reverse_bits()
    }

    #[test]
    fn fold_constants_are_powers_of_x_mod_p() {
        for n in [0, 1, 31, 32, 33, 64, 96, 160, 1000, 2016, 2080] {
            assert_eq!(x_pow(n), x_pow_plain(n), "x^{n}");
        }
        // The values crc32fast and Intel's paper use for the same folds.
        assert_eq!(multiplier(x_pow(160)), 0x1751997d0);
        assert_eq!(multiplier(x_pow(96)), 0x0ccaa009e);
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(fold::FOLD_4_BLOCKS, (0x11542778a, 0x1322d1430));
            for (block, row) in fold::FOLD_TO_END.iter().enumerate() {
                for lane in 0..4 {
                    let d = 4 * block + 3 - lane;
                    let first = u64::from(x_pow_plain(128 * d + 96)) << 1;
                    let last = u64::from(x_pow_plain(128 * d + 32)) << 1;
                    assert_eq!(row[2 * lane], first, "block {block} lane {lane}");
                    assert_eq!(row[2 * lane + 1], last, "block {block} lane {lane}");
                }
            }
            // Barrett: P (33 bits, reflected) and mu = floor(x^96 / P) (65 bits; its top
            // bit implied), by shift-and-subtract division of plain polynomials.
            let p = 0x1_04c1_1db7u128;
            let (mut rem, mut mu) = (1u128 << 96, 0u128);
            for bit in (0..=64).rev() {
                if rem & (1 << (bit + 32)) != 0 {
                    rem ^= p << bit;
                    mu |= 1 << bit;
                }
            }
            assert_eq!(mu >> 64, 1);
            assert!(rem < 1 << 32);
            assert_eq!(fold::P_X, (p as u64).reverse_bits() >> 31);
            assert_eq!(fold::MU96_LOW, (mu as u64).reverse_bits());
        }
    }

    /// Pseudo-random bytes, so that no block repeats.
    pub(crate) fn noise(len: usize, mut seed: u64) -> Vec<u8> {
        (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect()
    }

    /// The payload lengths to try: every one up to 300, and the engine's sizes and their
    /// neighbours.
    fn payload_lengths() -> impl Iterator<Item = usize> {
        (0..=300).chain([
            319, 320, 321, 511, 512, 513, 1000, 1023, 1024, 1025, 2047, 2048, 2049, 4031, 4032,
            4033, 4095, 4096, 4097, 4099,
        ])
    }

    const GUARD: u8 = 0x5a;

    /// Runs `v2_copying_out` into a guarded buffer at `align`; checks it copied exactly
    /// `payload` and returns its result.
    fn copying_out_checked(
        ip: &[u8],
        udp: &[u8],
        headers: &[u8],
        payload_and_pad: &[u8],
        payload_len: usize,
        align: usize,
    ) -> u32 {
        let mut buf = vec![GUARD; payload_len + 192];
        let dst = &mut buf[align..align + payload_len];
        let got = v2_copying_out(ip, udp, headers, payload_and_pad, dst);
        assert_eq!(
            &buf[align..align + payload_len],
            &payload_and_pad[..payload_len]
        );
        assert!(buf[..align].iter().all(|&b| b == GUARD), "wrote before dst");
        assert!(
            buf[align + payload_len..].iter().all(|&b| b == GUARD),
            "wrote after dst ({payload_len})"
        );
        got
    }

    /// Runs `v2_copying_payload` into a guarded buffer at `align`; checks the payload and
    /// the zeroed pad and returns its result.
    fn copying_payload_checked(
        ip: &[u8],
        udp: &[u8],
        headers: &[u8],
        payload: &[u8],
        pad: usize,
        align: usize,
    ) -> u32 {
        let len = payload.len() + pad;
        let mut buf = vec![GUARD; len + 192];
        let got = v2_copying_payload(ip, udp, headers, payload, &mut buf[align..align + len]);
        assert_eq!(&buf[align..align + payload.len()], payload);
        assert!(buf[align + payload.len()..align + len]
            .iter()
            .all(|&b| b == 0));
        assert!(buf[..align].iter().all(|&b| b == GUARD), "wrote before out");
        assert!(
            buf[align + len..].iter().all(|&b| b == GUARD),
            "wrote after out"
        );
        got
    }

    #[test]
    fn every_entry_point_matches_the_definition() {
        let bytes = noise(9000, 0x0123_4567_89ab_cdef);
        let ip4 = &bytes[..20];
        let ip6 = &bytes[20..60];
        let udp_h = &bytes[60..68];
        for payload_len in payload_lengths() {
            for ext in [0usize, 4, 16, 28] {
                let headers = &bytes[100..112 + ext];
                for pad in 0..4 {
                    // A nonzero pad (what a receiver may see) and a payload at an odd place.
                    let payload_and_pad = &bytes[200 + payload_len % 61..][..payload_len + pad];
                    let payload = &payload_and_pad[..payload_len];
                    let mut transport = headers.to_vec();
                    transport.extend_from_slice(payload_and_pad);
                    let mut sealed = headers.to_vec();
                    sealed.extend_from_slice(payload);
                    sealed.resize(headers.len() + payload_len + pad, 0);
                    for ip in [ip4, ip6] {
                        let what = format!("ip {} len {payload_len} ext {ext} pad {pad}", ip.len());
                        let want = reference(ip, Some(udp_h), &transport);
                        let whole = if ip.len() == 20 {
                            v2_ipv4(ip, udp_h, &transport)
                        } else {
                            v2_ipv6(ip, udp_h, &transport)
                        };
                        assert_eq!(whole, want, "whole {what}");
                        let align = (payload_len * 7 + pad) % 64;
                        let out = copying_out_checked(
                            ip,
                            udp_h,
                            headers,
                            payload_and_pad,
                            payload_len,
                            align,
                        );
                        assert_eq!(out, want, "copying out {what}");
                        let sealing =
                            copying_payload_checked(ip, udp_h, headers, payload, pad, align);
                        assert_eq!(
                            sealing,
                            reference(ip, Some(udp_h), &sealed),
                            "sealing {what}"
                        );
                    }
                }
            }
            // RoCE v1 (no UDP) over the same lengths.
            let t = &bytes[100..112 + payload_len];
            assert_eq!(v1(ip6, t), reference(ip6, None, t), "v1 {payload_len}");
        }
    }

    #[test]
    fn every_alignment_of_source_and_destination() {
        let bytes = noise(4096 + 256, 42);
        let ip4 = &bytes[..20];
        let ip6 = &bytes[20..60];
        let udp_h = &bytes[60..68];
        let headers = &bytes[68..84];
        for (payload_len, pad) in [
            (0, 0),
            (1, 3),
            (63, 1),
            (64, 0),
            (65, 3),
            (200, 0),
            (256, 0),
            (1027, 1),
        ] {
            for ip in [ip4, ip6] {
                let mut transport = headers.to_vec();
                transport.extend_from_slice(&bytes[100..100 + payload_len + pad]);
                let want = reference(ip, Some(udp_h), &transport);
                let mut sealed = transport[..headers.len() + payload_len].to_vec();
                sealed.resize(transport.len(), 0);
                let want_sealed = reference(ip, Some(udp_h), &sealed);
                for src_align in 0..64 {
                    let src = &bytes[100 + src_align..][..payload_len + pad];
                    // The same bytes at another address.
                    let mut moved = vec![0u8; src.len() + 64];
                    moved[src_align..][..src.len()].copy_from_slice(&transport[headers.len()..]);
                    let src = &moved[src_align..][..src.len()];
                    let mut whole = vec![0u8; 64 + transport.len()];
                    whole[src_align..][..transport.len()].copy_from_slice(&transport);
                    let t = &whole[src_align..][..transport.len()];
                    let got = if ip.len() == 20 {
                        v2_ipv4(ip, udp_h, t)
                    } else {
                        v2_ipv6(ip, udp_h, t)
                    };
                    assert_eq!(got, want);
                    for dst_align in 0..64 {
                        let got =
                            copying_out_checked(ip, udp_h, headers, src, payload_len, dst_align);
                        assert_eq!(
                            got, want,
                            "len {payload_len} src {src_align} dst {dst_align}"
                        );
                        let got = copying_payload_checked(
                            ip,
                            udp_h,
                            headers,
                            &src[..payload_len],
                            pad,
                            dst_align,
                        );
                        assert_eq!(
                            got, want_sealed,
                            "sealing {payload_len} {src_align} {dst_align}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn inputs_beyond_the_table_take_the_portable_path() {
        let bytes = noise(12_000, 7);
        let (ip, udp_h) = (&bytes[..20], &bytes[20..28]);
        for len in [4900, 5000, 5100, 11_000] {
            let t = &bytes[100..100 + len];
            assert_eq!(
                v2_ipv4(ip, udp_h, t),
                reference(ip, Some(udp_h), t),
                "{len}"
            );
            let mut dst = vec![0u8; len - 12 - 2];
            let got = v2_copying_out(ip, udp_h, &t[..12], &t[12..], &mut dst);
            assert_eq!(got, reference(ip, Some(udp_h), t));
            assert_eq!(dst, &t[12..len - 2]);
        }
    }

    #[test]
    fn the_portable_copying_paths_agree() {
        // What a CPU without the kernel's instructions runs, on every kind of input.
        let bytes = noise(6000, 11);
        let udp_h = &bytes[60..68];
        for (net, ip) in [(Net::V4, &bytes[..20]), (Net::V6, &bytes[20..60])] {
            for len in (0..200usize).chain([1024, 4093, 4096]) {
                for ext in [0usize, 16] {
                    let headers = &bytes[100..112 + ext];
                    let pad = len.wrapping_neg() & 3;
                    let payload_and_pad = &bytes[300..300 + len + pad];
                    let mut transport = headers.to_vec();
                    transport.extend_from_slice(payload_and_pad);
                    let mut dst = vec![0u8; len];
                    let got =
                        portable_copying_out(net, ip, udp_h, headers, payload_and_pad, &mut dst);
                    assert_eq!(got, reference(ip, Some(udp_h), &transport));
                    assert_eq!(dst, &payload_and_pad[..len]);
                    let mut out = vec![0xa5u8; len + pad];
                    let got = portable_copying_payload(
                        net,
                        ip,
                        Some(udp_h),
                        headers,
                        &payload_and_pad[..len],
                        &mut out,
                    );
                    transport.truncate(headers.len() + len);
                    transport.resize(headers.len() + len + pad, 0);
                    assert_eq!(got, reference(ip, Some(udp_h), &transport));
                    assert_eq!(out, &transport[headers.len()..]);
                }
            }
        }
    }

    #[test]
    fn v1_copying_payload_is_v1_over_the_copied_packet() {
        let bytes = noise(6000, 23);
        let grh = &bytes[..40];
        for len in (0..200usize).chain([1020, 1024, 4093, 4096]) {
            for ext in [0usize, 4, 16, 28] {
                let headers = &bytes[100..112 + ext];
                let pad = len.wrapping_neg() & 3;
                let payload = &bytes[300..300 + len];
                let mut out = vec![0x5au8; len + pad];
                let got = v1_copying_payload(grh, headers, payload, &mut out);
                let mut transport = headers.to_vec();
                transport.extend_from_slice(payload);
                transport.resize(headers.len() + len + pad, 0);
                assert_eq!(got, v1(grh, &transport), "len {len} ext {ext}");
                assert_eq!(got, reference(grh, None, &transport));
                assert_eq!(out, &transport[headers.len()..]);
                let mut portable = vec![0x5au8; len + pad];
                let got =
                    portable_copying_payload(Net::V6, grh, None, headers, payload, &mut portable);
                assert_eq!(got, v1(grh, &transport));
            }
        }
    }

    /// The entry-point tests check the kernel only where the CPU has it; say which ran, and
    /// check that the kernel takes every RoCE-sized packet and declines longer ones.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_kernel_takes_every_roce_packet_where_available() {
        let bytes = noise(6000, 5);
        let (ip, udp_h, headers) = (&bytes[..40], &bytes[40..48], &bytes[48..88]);
        let run = |len: usize| {
            let src = &bytes[100..100 + len];
            fold::icrc::<false>(Net::V6, ip, Some(udp_h), headers, src, len, &mut [])
        };
        if fold::available() {
            eprintln!("the carry-less multiply kernel is under test");
            assert!(run(4096 + 3).is_some());
            assert_eq!(
                run(4096 + 3),
                Some(v2_ipv6(ip, udp_h, &[headers, &bytes[100..4199]].concat()))
            );
            assert!(run(fold::MAX_BLOCKS * 64).is_none());
        } else {
            eprintln!("no AVX-512 VPCLMULQDQ and VBMI here: only the portable path is under test");
            assert!(run(64).is_none());
        }
    }

    #[test]
    fn the_portable_path_agrees() {
        let bytes = noise(2000, 9);
        let (ip, udp_h, headers) = (&bytes[..40], &bytes[40..48], &bytes[48..76]);
        for len in [0usize, 5, 64, 100, 1024] {
            let rest = &bytes[100..100 + len];
            let (prefix, plen) = masked_prefix(Net::V6, ip, Some(udp_h), headers);
            let mut t = headers.to_vec();
            t.extend_from_slice(rest);
            assert_eq!(
                portable(&prefix[..plen], rest),
                reference(ip, Some(udp_h), &t)
            );
        }
    }

    #[test]
    #[should_panic(expected = "destination longer")]
    fn copying_out_refuses_a_destination_longer_than_the_payload() {
        let b = [0u8; 100];
        v2_copying_out(&b[..20], &b[..8], &b[..12], &b[..10], &mut [0u8; 11]);
    }

    #[test]
    #[should_panic(expected = "extended headers")]
    fn copying_out_refuses_headers_longer_than_any_opcode() {
        let b = [0u8; 100];
        v2_copying_out(&b[..20], &b[..8], &b[..44], &b[..10], &mut [0u8; 1]);
    }

    #[test]
    fn copying_payload_writes_the_packet_and_its_icrc() {
        let bytes: Vec<u8> = (0..9000u32).map(|i| (i * 151 + i / 3) as u8).collect();
        let ip4 = &bytes[..20];
        let ip6 = &bytes[20..60];
        let udp_h = &bytes[60..68];
        let lens = (0..600).chain([1020, 1021, 1024, 2048, 4093, 4096, 4100]);
        for payload_len in lens {
            for ext in [0usize, 4, 8, 16, 20, 28] {
                let headers = &bytes[100..112 + ext];
                let payload = &bytes[300 + (payload_len % 5)..][..payload_len];
                let pad = payload_len.wrapping_neg() & 3;
                for ip in [ip4, ip6] {
                    let mut out = vec![0xa5u8; payload_len + pad];
                    let got = v2_copying_payload(ip, udp_h, headers, payload, &mut out);
                    assert_eq!(&out[..payload_len], payload, "len {payload_len}");
                    assert!(out[payload_len..].iter().all(|&b| b == 0));
                    let mut transport = headers.to_vec();
                    transport.extend_from_slice(&out);
                    let want = if ip.len() == 20 {
                        v2_ipv4(ip, udp_h, &transport)
                    } else {
                        v2_ipv6(ip, udp_h, &transport)
                    };
                    assert_eq!(got, want, "len {payload_len} ext {ext}");
                }
            }
        }
    }

    #[test]
    fn worked_example_v2_ipv4() {
        let icrc = v2_ipv4(&hex(IP), &hex(UDP), &hex(TRANSPORT));
        assert_eq!(icrc.to_le_bytes(), [0x63, 0xe4, 0x83, 0x9a]);
    }

    #[test]
    fn worked_example_v2_ipv6_and_v1() {
        // fe80::1 -> fe80::2, TC 0, FL 0, HL 64; payload length = UDP length 0x20.
        let ip6 = hex(
            "60000000 0020 11 40 fe800000000000000000000000000001 fe800000000000000000000000000002",
        );
        let icrc = v2_ipv6(&ip6, &hex(UDP), &hex(TRANSPORT));
        assert_eq!(icrc.to_le_bytes(), [0x02, 0xe7, 0xea, 0xc3]);
        // RoCE v1 between the v4-mapped GIDs: GRH payload = BTH..ICRC = 24 bytes.
        let grh = hex(
            "60000000 0018 1b 40 00000000000000000000ffffc0a8010a 00000000000000000000ffffc0a80114",
        );
        assert_eq!(
            v1(&grh, &hex(TRANSPORT)).to_le_bytes(),
            [0xf0, 0xb2, 0xeb, 0xfb]
        );
    }

    #[test]
    fn connectx4_cnp_capture() {
        // roce-rxe-facts.md §3.4: a real CNP with TOS 0xC2 and Identification 0x718c.
        let ip = hex("45c2003c718c400040119161 0a001101 0a001201");
        let udp = hex("000012b700280000");
        let transport = hex("8100ffff400001180000000000000000000000000000000000000000");
        let icrc = v2_ipv4(&ip, &udp, &transport);
        assert_eq!(icrc.to_le_bytes(), [0x82, 0xfd, 0x00, 0x2a]);

        // The receiver of a plain UDP socket sees neither the Identification nor the TOS/TTL;
        // it rebuilds the header with Identification 0 and solves for it.
        let mut zero_ident = ip.clone();
        zero_ident[4] = 0;
        zero_ident[5] = 0;
        assert_eq!(
            recover_ipv4_ident(&zero_ident, &udp, &transport, icrc),
            Some(0x718c)
        );
        let mut solver = IdentSolver::new();
        assert_eq!(
            solver.recover(&zero_ident, &udp, &transport, icrc),
            Some(0x718c)
        );
        assert_eq!(
            solver.recover(&zero_ident, &udp, &transport, icrc),
            Some(0x718c)
        );
    }

    #[test]
    fn ident_recovery_for_every_length_and_many_idents() {
        let ip0 = hex(IP);
        let udp = hex(UDP);
        let mut solver = IdentSolver::new();
        for len in [12usize, 16, 13 * 4, 1024 + 12, 4096 + 28] {
            let mut transport = vec![0u8; len];
            transport[0] = 0x04;
            for (i, b) in transport.iter_mut().enumerate().skip(12) {
                *b = (i * 7) as u8;
            }
            for ident in [1u16, 0x8000, 0x1234, 0xffff, 0x00ff] {
                let mut ip = ip0.clone();
                ip[4..6].copy_from_slice(&ident.to_be_bytes());
                let carried = v2_ipv4(&ip, &udp, &transport);
                assert_eq!(solver.recover(&ip0, &udp, &transport, carried), Some(ident));
            }
        }
    }

    #[test]
    fn corrupted_packets_are_mostly_not_explained_by_an_ident() {
        let ip0 = hex(IP);
        let udp = hex(UDP);
        let transport = hex(TRANSPORT);
        let good = v2_ipv4(&ip0, &udp, &transport);
        let mut explained = 0;
        for bit in 0..(transport.len() * 8) {
            let mut t = transport.clone();
            t[bit / 8] ^= 1 << (bit % 8);
            if bit / 8 == 4 {
                continue; // BTH byte 4 is masked: flipping it changes nothing
            }
            if recover_ipv4_ident(&ip0, &udp, &t, good).is_some() {
                explained += 1;
            }
        }
        assert_eq!(
            explained, 0,
            "a single bit flip never looks like an Identification"
        );
    }
}
