//! Hostile packets: transport packets (BTH .. ICRC) with any opcode and any field, built
//! byte by byte so that nothing the wire layer would refuse to emit is out of reach. The fuzz
//! targets draw them from fuzzer input; the daemon's hostile-packet test sends
//! [`corpus`] at a live device.
//!
//! A packet is built against a [`Victim`]: the QPs and keys of the device under attack, so
//! that "an R_Key of another PD" or "bounds overflowing the MR" name real objects.

use crate::wire::{icrc, ipv4, HeaderSet, Opcode, ICRC_LEN};
use std::net::Ipv4Addr;

/// The device under attack, as the attacker would like to know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Victim {
    /// An RC QP in RTS and its next expected PSN.
    pub rc_qpn: u32,
    pub rc_psn: u32,
    /// A UD QP and its Q_Key.
    pub ud_qpn: u32,
    pub ud_qkey: u32,
    /// An MR the RC QP's PD may use remotely: its address, length and R_Key.
    pub mr_va: u64,
    pub mr_len: u64,
    pub mr_rkey: u32,
    /// The R_Key of an MR in another PD (or of another client).
    pub foreign_rkey: u32,
    /// A QPN that exists nowhere.
    pub unknown_qpn: u32,
}

/// The fields of the extended headers an opcode calls for; each header takes what it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExtFields {
    pub va: u64,
    pub rkey: u32,
    pub dma_len: u32,
    pub swap_add: u64,
    pub compare: u64,
    /// AETH: syndrome (top byte) and MSN (low 24 bits).
    pub aeth: u32,
    pub qkey: u32,
    pub src_qpn: u32,
    pub imm: u32,
    pub feth: u32,
}

/// One transport packet, field by field (IBTA Vol. 1 §9.2, roce-rxe-facts.md §1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawPacket {
    pub opcode: u8,
    pub solicited: bool,
    pub mig_req: bool,
    /// The pad count the BTH claims; `pad_bytes` is how many pad bytes are really appended.
    pub pad_count: u8,
    pub pad_bytes: usize,
    pub tver: u8,
    pub pkey: u16,
    pub fecn: bool,
    pub becn: bool,
    pub dest_qpn: u32,
    pub ack_req: bool,
    pub psn: u32,
    /// The extended headers as bytes (see [`ext_headers`]).
    pub ext: Vec<u8>,
    pub payload: Vec<u8>,
}

impl RawPacket {
    /// A packet of `opcode` with the headers it calls for filled from `f`, `payload_len`
    /// bytes of payload and the pad the length needs.
    pub fn new(opcode: u8, dest_qpn: u32, psn: u32, f: &ExtFields, payload_len: usize) -> Self {
        let pad = (4 - payload_len % 4) % 4;
        RawPacket {
            opcode,
            solicited: false,
            mig_req: true,
            pad_count: pad as u8,
            pad_bytes: pad,
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qpn,
            ack_req: false,
            psn,
            ext: ext_headers(Opcode(opcode), f),
            payload: (0..payload_len).map(|i| (i * 7 + 1) as u8).collect(),
        }
    }

    /// BTH, extended headers, payload, pad, and 4 ICRC bytes left zero for the sender to seal
    /// (or not).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(12 + self.ext.len() + self.payload.len() + 8);
        out.push(self.opcode);
        out.push(
            u8::from(self.solicited) << 7
                | u8::from(self.mig_req) << 6
                | (self.pad_count & 3) << 4
                | (self.tver & 0xf),
        );
        out.extend_from_slice(&self.pkey.to_be_bytes());
        out.push(u8::from(self.fecn) << 7 | u8::from(self.becn) << 6);
        out.extend_from_slice(&(self.dest_qpn & 0xff_ffff).to_be_bytes()[1..]);
        out.push(u8::from(self.ack_req) << 7);
        out.extend_from_slice(&(self.psn & 0xff_ffff).to_be_bytes()[1..]);
        out.extend_from_slice(&self.ext);
        out.extend_from_slice(&self.payload);
        out.resize(out.len() + self.pad_bytes, 0);
        out.resize(out.len() + ICRC_LEN, 0);
        out
    }
}

/// The extended headers of `opcode` in wire order, filled from `f`. An opcode the spec does
/// not define gets none.
pub fn ext_headers(opcode: Opcode, f: &ExtFields) -> Vec<u8> {
    let Some(info) = opcode.info() else {
        return Vec::new();
    };
    let h = info.headers;
    let mut out = Vec::with_capacity(h.len());
    for (set, _) in HeaderSet::ORDER {
        if !h.contains(set) {
            continue;
        }
        match set {
            s if s == HeaderSet::DETH => {
                out.extend_from_slice(&f.qkey.to_be_bytes());
                out.extend_from_slice(&(f.src_qpn & 0xff_ffff).to_be_bytes());
            }
            s if s == HeaderSet::FETH => out.extend_from_slice(&f.feth.to_be_bytes()),
            s if s == HeaderSet::RETH => {
                out.extend_from_slice(&f.va.to_be_bytes());
                out.extend_from_slice(&f.rkey.to_be_bytes());
                out.extend_from_slice(&f.dma_len.to_be_bytes());
            }
            s if s == HeaderSet::ATOMIC_ETH => {
                out.extend_from_slice(&f.va.to_be_bytes());
                out.extend_from_slice(&f.rkey.to_be_bytes());
                out.extend_from_slice(&f.swap_add.to_be_bytes());
                out.extend_from_slice(&f.compare.to_be_bytes());
            }
            s if s == HeaderSet::AETH => out.extend_from_slice(&f.aeth.to_be_bytes()),
            s if s == HeaderSet::ATOMIC_ACK_ETH => out.extend_from_slice(&f.swap_add.to_be_bytes()),
            s if s == HeaderSet::IMM || s == HeaderSet::IETH => {
                out.extend_from_slice(&f.imm.to_be_bytes())
            }
            _ => out.resize(out.len() + 16, 0), // CNP reserved
        }
    }
    out
}

/// A whole IPv4 packet (DF, TTL 64, Identification 0, UDP to 4791 from `sport`) around
/// `transport` (BTH .. 4 ICRC bytes), as the engine takes it; `ecn` goes in the TOS. With
/// `seal` the ICRC is computed for these headers, otherwise the last 4 bytes stay as given.
/// A `transport` shorter than a BTH and an ICRC is wrapped as it is, unsealed.
pub fn ipv4_udp(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
    ecn: u8,
    transport: &[u8],
    seal: bool,
) -> Vec<u8> {
    let udp_len = 8 + transport.len();
    let total = ipv4::HEADER_LEN + udp_len;
    let mut p = Vec::with_capacity(total);
    p.extend_from_slice(&[0x45, ecn & 3]);
    p.extend_from_slice(&(total as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0, 0x40, 0, 64, ipv4::PROTOCOL_UDP, 0, 0]);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    let csum = ipv4::header_checksum(&p[..ipv4::HEADER_LEN]);
    p[10..12].copy_from_slice(&csum.to_be_bytes());
    p.extend_from_slice(&sport.to_be_bytes());
    p.extend_from_slice(&crate::wire::ROCE_V2_PORT.to_be_bytes());
    p.extend_from_slice(&(udp_len as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(transport);
    if seal && transport.len() >= crate::wire::bth::HEADER_LEN + ICRC_LEN {
        let n = p.len();
        let crc = icrc::v2_ipv4(&p[..20], &p[20..28], &p[28..n - ICRC_LEN]);
        p[n - ICRC_LEN..].copy_from_slice(&crc.to_le_bytes());
    }
    p
}

/// Whether the sender seals a packet with a correct ICRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Icrc {
    /// Computed for the headers the packet travels with.
    Valid,
    /// Left wrong (zero, or a correct one with a bit flipped).
    Bad,
}

/// One packet of the hostile corpus: what it tries, its bytes (BTH .. 4 ICRC bytes), and how
/// the sender seals it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hostile {
    pub what: &'static str,
    pub bytes: Vec<u8>,
    pub icrc: Icrc,
}

/// The hostile corpus against `v` (issue 16): every opcode 0x00-0xff, truncation at every
/// length, wrong pad counts, bad and valid ICRCs, lengths that disagree, PSNs far outside the
/// window, unknown and foreign QPNs, R_Keys of other PDs, bounds overflowing the MR,
/// misaligned atomics, a READ response nobody asked for, CNPs for unknown QPs. None of it may
/// change memory: the valid R_Key only ever comes with a PSN outside the window, bounds
/// outside the MR, or a header that does not parse. (CM MADs with nonsense fields are
/// [`cm_corpus`].)
pub fn corpus(v: &Victim) -> Vec<Hostile> {
    let mut out = Vec::new();
    let far = v.rc_psn.wrapping_add(1 << 23) & 0xff_ffff;
    let fields = ExtFields {
        va: v.mr_va,
        rkey: v.foreign_rkey,
        dma_len: 64,
        qkey: v.ud_qkey ^ 1,
        src_qpn: 0x77,
        ..ExtFields::default()
    };
    // Every opcode, valid ICRC, to the RC QP at a PSN half the space away (outside every
    // window), with another PD's R_Key: parsed, judged, dropped or NAKed, never executed.
    for op in 0..=255u8 {
        push(
            &mut out,
            "opcode sweep",
            &RawPacket::new(op, v.rc_qpn, far, &fields, 64),
            Icrc::Valid,
        );
    }
    // The same to the UD QP with a wrong Q_Key, and to a QPN that does not exist.
    for op in 0..=255u8 {
        push(
            &mut out,
            "opcode sweep, UD QP",
            &RawPacket::new(op, v.ud_qpn, 0, &fields, 32),
            Icrc::Valid,
        );
        push(
            &mut out,
            "opcode sweep, unknown QPN",
            &RawPacket::new(op, v.unknown_qpn, v.rc_psn, &fields, 32),
            Icrc::Valid,
        );
    }
    // Truncation at every length of a WRITE_ONLY with the right key at the expected PSN: cut
    // short, no length it claims is there, so nothing may be written.
    let write = |va: u64, len: u32, psn: u32, rkey: u32| {
        let f = ExtFields {
            va,
            rkey,
            dma_len: len,
            ..ExtFields::default()
        };
        RawPacket::new(
            Opcode::RC_RDMA_WRITE_ONLY.0,
            v.rc_qpn,
            psn,
            &f,
            len as usize,
        )
    };
    let full = write(v.mr_va, 64, v.rc_psn, v.mr_rkey).to_bytes();
    for cut in 0..full.len() {
        out.push(Hostile {
            what: "truncated WRITE (bad ICRC)",
            bytes: full[..cut].to_vec(),
            icrc: Icrc::Bad,
        });
    }
    // Truncated, resealed: the ICRC is right for what arrived, the headers and lengths are not
    // (the first 12 + 16 + 64 bytes are a WRITE of 64 bytes; shorter ones lack payload).
    for cut in (12 + 4)..(full.len() - 4) {
        let mut b = full[..cut].to_vec();
        b.extend_from_slice(&[0; ICRC_LEN]);
        out.push(Hostile {
            what: "truncated WRITE, resealed",
            bytes: b,
            icrc: Icrc::Valid,
        });
    }
    // The right key, wrong everything else.
    push(
        &mut out,
        "bad ICRC on a valid WRITE",
        &write(v.mr_va, 64, v.rc_psn, v.mr_rkey),
        Icrc::Bad,
    );
    for pad in 0..4u8 {
        let mut p = write(v.mr_va, 61, far, v.mr_rkey);
        p.pad_count = pad;
        push(&mut out, "wrong pad count", &p, Icrc::Valid);
        let mut p = write(v.mr_va, 64, v.rc_psn, v.foreign_rkey);
        p.pad_count = pad;
        p.pad_bytes = usize::from(pad);
        push(
            &mut out,
            "pad count with pad bytes, foreign R_Key",
            &p,
            Icrc::Valid,
        );
    }
    // DMA length that disagrees with the payload (RETH says 4096, 64 bytes carried; RETH
    // says 8, 64 carried), with a foreign key so a mistake still cannot land.
    for dma_len in [0u32, 8, 63, 65, 4096, u32::MAX] {
        let mut p = write(v.mr_va, 64, v.rc_psn, v.foreign_rkey);
        p.ext = ext_headers(
            Opcode::RC_RDMA_WRITE_ONLY,
            &ExtFields {
                va: v.mr_va,
                rkey: v.foreign_rkey,
                dma_len,
                ..ExtFields::default()
            },
        );
        push(
            &mut out,
            "RETH length disagrees with the payload",
            &p,
            Icrc::Valid,
        );
    }
    // PSNs far outside the window, in both directions, with the valid key.
    for delta in [1u32 << 22, (1 << 23) - 1, 1 << 23, (1 << 23) + 1, 0xff_fff0] {
        push(
            &mut out,
            "PSN outside the window",
            &write(v.mr_va, 64, v.rc_psn.wrapping_add(delta), v.mr_rkey),
            Icrc::Valid,
        );
    }
    // R_Keys of other PDs, guessed keys, and bounds overflowing the MR (at the expected PSN:
    // each must be NAKed with a remote access error, never written).
    for rkey in [
        v.foreign_rkey,
        v.mr_rkey ^ 1,
        v.mr_rkey ^ 0x100,
        0,
        u32::MAX,
    ] {
        push(
            &mut out,
            "R_Key of another PD or guessed",
            &write(v.mr_va, 64, v.rc_psn, rkey),
            Icrc::Valid,
        );
    }
    for (va, len) in [
        (v.mr_va + v.mr_len - 32, 64u32),
        (v.mr_va.wrapping_sub(1), 64),
        (v.mr_va + v.mr_len, 4),
        (u64::MAX - 15, 64),
    ] {
        let mut f = ExtFields {
            va,
            rkey: v.mr_rkey,
            dma_len: len,
            ..ExtFields::default()
        };
        push(
            &mut out,
            "bounds overflowing the MR",
            &RawPacket::new(
                Opcode::RC_RDMA_WRITE_ONLY.0,
                v.rc_qpn,
                v.rc_psn,
                &f,
                len as usize,
            ),
            Icrc::Valid,
        );
        f.dma_len = 1 << 20;
        push(
            &mut out,
            "READ beyond the MR",
            &RawPacket::new(Opcode::RC_RDMA_READ_REQUEST.0, v.rc_qpn, v.rc_psn, &f, 0),
            Icrc::Valid,
        );
    }
    // Misaligned atomics (IBTA C9-183: a misaligned VA is an invalid request), with the
    // right key at the expected PSN.
    for op in [Opcode::RC_COMPARE_SWAP, Opcode::RC_FETCH_ADD] {
        for off in [1u64, 2, 4, 7] {
            let f = ExtFields {
                va: v.mr_va + off,
                rkey: v.mr_rkey,
                swap_add: 0xdead_beef,
                compare: 0,
                ..ExtFields::default()
            };
            push(
                &mut out,
                "misaligned atomic",
                &RawPacket::new(op.0, v.rc_qpn, v.rc_psn, &f, 0),
                Icrc::Valid,
            );
        }
    }
    // Responses nobody asked for: READ responses, ACKs and atomic ACKs at every PSN class.
    for op in [
        Opcode::RC_RDMA_READ_RESPONSE_ONLY,
        Opcode::RC_RDMA_READ_RESPONSE_FIRST,
        Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
        Opcode::RC_RDMA_READ_RESPONSE_LAST,
        Opcode::RC_ACKNOWLEDGE,
        Opcode::RC_ATOMIC_ACKNOWLEDGE,
    ] {
        for psn in [0, v.rc_psn, far] {
            let f = ExtFields {
                aeth: 0x1f << 24,
                ..ExtFields::default()
            };
            push(
                &mut out,
                "response nobody asked for",
                &RawPacket::new(op.0, v.rc_qpn, psn, &f, 256),
                Icrc::Valid,
            );
        }
    }
    // CNPs for unknown QPs, and for the real one (which may slow it down, nothing more).
    for qpn in [v.unknown_qpn, 0, 0xff_ffff, v.rc_qpn] {
        let mut p = RawPacket::new(Opcode::CNP.0, qpn, 0, &ExtFields::default(), 0);
        p.becn = true;
        push(&mut out, "CNP", &p, Icrc::Valid);
    }
    // A wrong P_Key, a wrong transport version, and a multicast QPN on an RC opcode.
    let mut p = write(v.mr_va, 64, v.rc_psn, v.mr_rkey);
    p.pkey = 0x8001; // 0x7fff would be the default partition, limited member: accepted
    push(&mut out, "wrong P_Key", &p, Icrc::Valid);
    let mut p = write(v.mr_va, 64, v.rc_psn, v.mr_rkey);
    p.tver = 1;
    push(&mut out, "wrong transport version", &p, Icrc::Valid);
    push(
        &mut out,
        "RC opcode to the multicast QPN",
        &RawPacket::new(Opcode::RC_SEND_ONLY.0, 0xff_ffff, 0, &fields, 16),
        Icrc::Valid,
    );
    out
}

fn push(out: &mut Vec<Hostile>, what: &'static str, p: &RawPacket, icrc: Icrc) {
    out.push(Hostile {
        what,
        bytes: p.to_bytes(),
        icrc,
    });
}

/// CM MADs with nonsense fields, as UD SEND_ONLY payloads for QP1 (256 bytes each): every
/// attribute ID the CM knows and some it does not, wrong base and class versions, methods,
/// status bits, comm IDs that name nothing, and the REQ's fields at their extremes.
pub fn cm_corpus() -> Vec<[u8; 256]> {
    let mut out = Vec::new();
    let header = |attr: u16, base: u8, class: u8, version: u8, method: u8| {
        let mut m = [0u8; 256];
        m[0] = base;
        m[1] = class;
        m[2] = version;
        m[3] = method;
        m[8..16].copy_from_slice(&0x1234_5678_9abc_def0u64.to_be_bytes());
        m[16..18].copy_from_slice(&attr.to_be_bytes());
        m
    };
    for attr in [
        0x0000u16, 0x0010, 0x0011, 0x0012, 0x0013, 0x0014, 0x0015, 0x0016, 0x0017, 0x0018, 0x0019,
        0x001a, 0x00ff, 0xffff,
    ] {
        for (base, class, version, method) in [
            (1u8, 7u8, 2u8, 3u8),
            (2, 7, 2, 3),
            (1, 7, 9, 3),
            (1, 7, 2, 0x81),
            (1, 0x81, 2, 3),
            (0, 0, 0, 0),
        ] {
            let mut m = header(attr, base, class, version, method);
            // A body of 0xff: every length, count, timeout and QPN at its maximum.
            m[24..].fill(0xff);
            out.push(m);
            let mut m = header(attr, base, class, version, method);
            m[24..]
                .iter_mut()
                .enumerate()
                .for_each(|(i, b)| *b = (i * 37) as u8);
            out.push(m);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The engine_ingress fuzz target's first finding (in this helper, not the engine): a
    /// transport shorter than a BTH was sealed, and `icrc::v2_ipv4` requires a whole BTH.
    #[test]
    fn short_transports_are_wrapped_unsealed() {
        let (a, b) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        for len in 0..16 {
            let t = vec![0xabu8; len];
            let p = ipv4_udp(a, b, 0xc000, 0, &t, true);
            assert_eq!(&p[28..], &t[..], "{len} bytes kept as they are");
        }
        let t = RawPacket::new(Opcode::RC_SEND_ONLY.0, 0x11, 0, &ExtFields::default(), 4);
        let p = ipv4_udp(a, b, 0xc000, 0, &t.to_bytes(), true);
        let parsed = crate::wire::FrameRepr::parse_ip(&p, p.len()).unwrap();
        assert!(parsed.verified().is_ok(), "a whole packet is sealed");
    }
}
