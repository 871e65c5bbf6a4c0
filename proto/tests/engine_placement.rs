//! The responder verifies the ICRC of an RDMA WRITE's MIDDLE and LAST packets by the same pass
//! that copies their payload into memory (`packet_io::PendingIcrc`). These tests feed one
//! device the frames of another by hand, some of them corrupted, and check that:
//! - a corrupt packet that was placed did nothing else: no PSN advance, no ACK or NAK, counted
//!   as an ICRC error and not as received; the retransmission rewrites the same bytes;
//! - a corrupt packet that is not the next one of the WRITE in progress is verified before
//!   anything is done with it, so it never earns a NAK and is never placed.

use proto::sim::{LinkModel, QpOptions, Sim};
use proto::transport::*;
use proto::types::{Psn, Qpn};
use proto::wire::Opcode;

const LEN: usize = 3000;

struct Setup {
    sim: Sim,
    qb: Qpn,
    /// The target buffer on node 1.
    b: u64,
    /// The frames node 0 sent: WRITE FIRST, MIDDLE, LAST (3000 bytes at MTU 1024).
    frames: Vec<Vec<u8>>,
    data: Vec<u8>,
}

fn setup() -> Setup {
    let mut sim = Sim::pair(11, LinkModel::default());
    let o = QpOptions {
        mtu: Mtu::Mtu1024,
        ..Default::default()
    };
    let (qa, qb) = sim.connect(0, 1, &o);
    let acc = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
    let (a, ka) = sim.alloc_mr(0, LEN, acc);
    let (b, kb) = sim.alloc_mr(1, LEN, acc);
    let data: Vec<u8> = (0..LEN as u32).map(|i| (i * 7 + 1) as u8).collect();
    sim.write_mem(0, a, &data);
    let sg = Some(Sge {
        addr: a,
        length: LEN as u32,
        lkey: ka.lkey,
    });
    let remote = RemoteAddr {
        va: b,
        rkey: kb.rkey,
    };
    sim.dev(0)
        .post_send(qa, SendWr::new(1, SendOp::Write(remote), sg))
        .unwrap();
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    let mut frames = Vec::new();
    while let Some(t) = sim.dev(0).poll_transmit(0, &mut buf) {
        frames.push(buf[..t.len].to_vec());
    }
    assert_eq!(frames.len(), 3);
    let opcodes: Vec<u8> = frames.iter().map(|f| f[28]).collect();
    assert_eq!(
        opcodes,
        vec![
            Opcode::RC_RDMA_WRITE_FIRST.0,
            Opcode::RC_RDMA_WRITE_MIDDLE.0,
            Opcode::RC_RDMA_WRITE_LAST.0
        ]
    );
    Setup {
        sim,
        qb,
        b,
        frames,
        data,
    }
}

/// The frame with one payload byte flipped (IPv4 20 + UDP 8 + BTH 12, then the payload).
fn spoiled(frame: &[u8], payload_byte: usize) -> Vec<u8> {
    let mut f = frame.to_vec();
    f[40 + payload_byte] ^= 0x5a;
    f
}

fn expected_psn(s: &mut Setup) -> Psn {
    s.sim.dev(1).qp_psns(s.qb).unwrap().2
}

fn transmits(s: &mut Setup) -> Vec<Vec<u8>> {
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    let mut out = Vec::new();
    while let Some(t) = s.sim.dev(1).poll_transmit(0, &mut buf) {
        out.push(buf[..t.len].to_vec());
    }
    out
}

#[test]
fn a_corrupt_write_middle_is_placed_then_dropped_and_the_retransmission_rewrites_it() {
    let mut s = setup();
    let first = s.frames[0].clone();
    s.sim.dev(1).handle_packet(0, &first);
    let psn_after_first = expected_psn(&mut s);
    let rcvd = s.sim.dev(1).counters().rcvd_pkts;

    let bad = spoiled(&s.frames[1], 100);
    s.sim.dev(1).handle_packet(0, &bad);
    let c = *s.sim.dev(1).counters();
    assert_eq!(c.icrc_errors, 1);
    assert_eq!(
        c.rcvd_pkts, rcvd,
        "a corrupt packet is not counted as received"
    );
    assert_eq!(expected_psn(&mut s), psn_after_first, "no PSN advance");
    assert!(transmits(&mut s).is_empty(), "neither ACK nor NAK");
    // It was placed where the next MIDDLE goes (the undefined contents of a WRITE not yet
    // completed), which is what the retransmission rewrites.
    let placed = s.sim.read_mem(1, s.b + 1024 + 100, 1)[0];
    assert_eq!(placed, s.data[1024 + 100] ^ 0x5a);

    for f in &s.frames[1..] {
        s.sim.dev(1).handle_packet(0, f);
    }
    assert_eq!(s.sim.dev(1).counters().icrc_errors, 1);
    assert_eq!(s.sim.read_mem(1, s.b, LEN), s.data);
    assert_eq!(expected_psn(&mut s), psn_after_first.add(2));
    let acks = transmits(&mut s);
    assert_eq!(acks.len(), 1, "the LAST asks for an ACK");
    assert_eq!(acks[0][28], Opcode::RC_ACKNOWLEDGE.0);
}

#[test]
fn a_corrupt_write_last_is_dropped_without_an_ack() {
    let mut s = setup();
    for f in &s.frames[..2] {
        s.sim.dev(1).handle_packet(0, f);
    }
    let last = s.frames[2].clone();
    let bad = spoiled(&last, 7);
    s.sim.dev(1).handle_packet(0, &bad);
    assert_eq!(s.sim.dev(1).counters().icrc_errors, 1);
    assert!(transmits(&mut s).is_empty());
    s.sim.dev(1).handle_packet(0, &last);
    assert_eq!(s.sim.read_mem(1, s.b, LEN), s.data);
    assert_eq!(transmits(&mut s).len(), 1);
}

#[test]
fn a_corrupt_packet_out_of_sequence_is_checked_before_anything_else() {
    let mut s = setup();
    // No FIRST yet: a MIDDLE here would be an opcode-sequence error (NAK invalid request)
    // and a LAST one a PSN gap (NAK sequence error), but these are corrupt, so nothing.
    let middle = spoiled(&s.frames[1], 0);
    let last = spoiled(&s.frames[2], 0);
    s.sim.dev(1).handle_packet(0, &middle);
    s.sim.dev(1).handle_packet(0, &last);
    assert_eq!(s.sim.dev(1).counters().icrc_errors, 2);
    assert!(transmits(&mut s).is_empty(), "no NAK for corrupt packets");
    assert_eq!(s.sim.read_mem(1, s.b, LEN), vec![0; LEN], "nothing placed");
    // The same packets intact do earn the NAK (so the test above can fail).
    let gap = s.frames[2].clone();
    s.sim.dev(1).handle_packet(0, &gap);
    let naks = transmits(&mut s);
    assert_eq!(naks.len(), 1);
    assert_eq!(naks[0][28], Opcode::RC_ACKNOWLEDGE.0);
    assert_eq!(naks[0][40] >> 5, 3, "AETH syndrome: NAK");
}

/// `frame` parsed, changed by `edit`, and written again with a right ICRC.
fn rewritten(
    frame: &[u8],
    edit: impl FnOnce(&mut proto::wire::FrameRepr, &mut Vec<u8>),
) -> Vec<u8> {
    let parsed = proto::wire::FrameRepr::parse_ip(frame, frame.len()).unwrap();
    let mut repr = parsed.repr;
    let mut payload = parsed.payload.to_vec();
    edit(&mut repr, &mut payload);
    repr.transport.payload_len = payload.len();
    repr.fill_lengths();
    let mut out = vec![0u8; repr.buffer_len()];
    repr.emit(&mut out, &payload).unwrap();
    out
}

#[test]
fn a_corrupt_empty_write_last_does_not_complete_the_write() {
    // A FIRST that carries the whole DMA length, then a LAST with nothing to place: legal
    // on the wire, and the LAST must still be verified before it completes anything.
    let mut s = setup();
    let first = rewritten(&s.frames[0], |r, _| {
        if let Some(reth) = r.transport.reth.as_mut() {
            reth.len = 1024;
        }
    });
    let last = rewritten(&s.frames[2], |r, payload| {
        r.transport.bth.psn = r.transport.bth.psn.sub(1);
        payload.clear();
    });
    s.sim.dev(1).handle_packet(0, &first);
    let psn = expected_psn(&mut s);
    let mut bad = last.clone();
    let n = bad.len();
    bad[n - 1] ^= 0x01;
    s.sim.dev(1).handle_packet(0, &bad);
    assert_eq!(s.sim.dev(1).counters().icrc_errors, 1);
    assert_eq!(expected_psn(&mut s), psn);
    assert!(transmits(&mut s).is_empty(), "no ACK for a corrupt LAST");
    s.sim.dev(1).handle_packet(0, &last);
    assert_eq!(expected_psn(&mut s), psn.add(1));
    let acks = transmits(&mut s);
    assert_eq!(acks.len(), 1);
    assert_eq!(s.sim.read_mem(1, s.b, 1024), s.data[..1024].to_vec());
}
