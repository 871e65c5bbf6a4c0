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

use super::{bth, ipv4, ipv6, udp};

/// The masked-LRH stand-in that starts every ICRC.
const LRH_ONES: [u8; 8] = [0xff; 8];

/// The masked headers in front of the payload: 8 ones, an IPv6-sized network header, UDP and
/// BTH. They are assembled in one buffer and hashed in one update, because crc32fast's
/// per-call cost dominates for the small pieces (about 9 % of the engine's time otherwise).
const PREFIX_MAX: usize = LRH_ONES.len() + ipv6::HEADER_LEN + udp::HEADER_LEN + bth::HEADER_LEN;

/// Network header masking rules.
#[derive(Clone, Copy)]
enum Net {
    V4,
    /// IPv6 for RoCE v2, and the GRH of RoCE v1 (same layout, same masks).
    V6,
}

/// Hashes the masked prefix and the rest of the transport packet.
fn icrc(net: Net, ip: &[u8], udp_header: Option<&[u8]>, transport: &[u8]) -> u32 {
    let mut prefix = [0u8; PREFIX_MAX];
    prefix[..8].copy_from_slice(&LRH_ONES);
    let mut at = 8;
    match net {
        Net::V4 => {
            let m = &mut prefix[at..at + ipv4::HEADER_LEN];
            m.copy_from_slice(&ip[..ipv4::HEADER_LEN]);
            m[1] = 0xff; // TOS (DSCP + ECN)
            m[8] = 0xff; // TTL
            m[10] = 0xff; // header checksum
            m[11] = 0xff;
            at += ipv4::HEADER_LEN;
        }
        Net::V6 => {
            let m = &mut prefix[at..at + ipv6::HEADER_LEN];
            m.copy_from_slice(&ip[..ipv6::HEADER_LEN]);
            m[0] |= 0x0f; // traffic class (high nibble) and flow label
            m[1] = 0xff;
            m[2] = 0xff;
            m[3] = 0xff;
            m[7] = 0xff; // hop limit
            at += ipv6::HEADER_LEN;
        }
    }
    if let Some(u) = udp_header {
        let m = &mut prefix[at..at + udp::HEADER_LEN];
        m.copy_from_slice(&u[..udp::HEADER_LEN]);
        m[6] = 0xff; // UDP checksum
        m[7] = 0xff;
        at += udp::HEADER_LEN;
    }
    let m = &mut prefix[at..at + bth::HEADER_LEN];
    m.copy_from_slice(&transport[..bth::HEADER_LEN]);
    m[4] = 0xff; // FECN, BECN, Resv6
    at += bth::HEADER_LEN;
    let mut h = crc32fast::Hasher::new();
    h.update(&prefix[..at]);
    h.update(&transport[bth::HEADER_LEN..]);
    h.finalize()
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
mod tests {
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
