//! The requester builds the MIDDLE packets of a long message from the headers of the first
//! one (`packet_io::SegmentTemplate`). Every frame it sends must still be exactly what the
//! general wire layer writes for the same headers and payload: checked here by parsing each
//! frame with `FrameRepr::parse_network` (ICRC verified) and emitting it again, for RC and
//! UC, RoCE v2 over IPv4 and IPv6 and RoCE v1, SEND and WRITE, payloads lent from one SGE
//! or gathered across several.

use proto::sim::{LinkModel, QpOptions, Sim};
use proto::transport::*;
use proto::types::Psn;
use proto::wire::{FrameRepr, Opcode};

const MTU: usize = 1024;

/// The framing of the pair's packets.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Net {
    V4,
    V6,
    V1,
}

impl Net {
    /// Where the BTH starts.
    fn transport_offset(self) -> usize {
        match self {
            Net::V4 => 28,
            Net::V6 => 48,
            Net::V1 => 40,
        }
    }
}

/// Sends one `len`-byte message from node 0 (split over SGEs of `sge_lens`) and returns
/// the frames it emitted, and the payload bytes.
fn frames(net: Net, qp_type: QpType, write: bool, sge_lens: &[u32]) -> (Vec<Vec<u8>>, Vec<u8>) {
    let mut sim = match net {
        Net::V6 => Sim::pair_v6(3, LinkModel::default()),
        Net::V4 => Sim::pair(3, LinkModel::default()),
        Net::V1 => Sim::pair_v1(3, LinkModel::default()),
    };
    let o = QpOptions {
        qp_type,
        mtu: Mtu::Mtu1024,
        ..Default::default()
    };
    let (qa, qb) = sim.connect(0, 1, &o);
    let len: u32 = sge_lens.iter().sum();
    let acc = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
    let (b, kb) = sim.alloc_mr(1, len as usize, acc);
    let mut sges = Vec::new();
    let mut data = Vec::new();
    for (i, &n) in sge_lens.iter().enumerate() {
        let (a, ka) = sim.alloc_mr(0, n as usize, acc);
        let bytes: Vec<u8> = (0..n).map(|j| (j as u8) ^ (i as u8 * 37)).collect();
        sim.write_mem(0, a, &bytes);
        data.extend_from_slice(&bytes);
        sges.push(Sge {
            addr: a,
            length: n,
            lkey: ka.lkey,
        });
    }
    let op = if write {
        SendOp::Write(RemoteAddr {
            va: b,
            rkey: kb.rkey,
        })
    } else {
        sim.dev(1)
            .post_recv(
                qb,
                RecvWr {
                    wr_id: 2,
                    sg_list: vec![Sge {
                        addr: b,
                        length: len,
                        lkey: kb.lkey,
                    }],
                },
            )
            .unwrap();
        SendOp::Send
    };
    let mut wr = SendWr::new(1, op, None);
    wr.sg_list = sges;
    sim.dev(0).post_send(qa, wr).unwrap();
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    let mut out = Vec::new();
    while let Some(t) = sim.dev(0).poll_transmit(0, &mut buf) {
        out.push(buf[..t.len].to_vec());
    }
    (out, data)
}

fn check(net: Net, qp_type: QpType, write: bool, sge_lens: &[u32]) {
    let what = format!("{net:?} {qp_type:?} write {write} sges {sge_lens:?}");
    let (frames, data) = frames(net, qp_type, write, sge_lens);
    let n = data.len().div_ceil(MTU);
    assert!(n >= 4, "{what}: long enough to have several MIDDLE packets");
    assert_eq!(frames.len(), n, "{what}");
    let mut payload = Vec::new();
    let mut first_psn = None;
    for (i, f) in frames.iter().enumerate() {
        let parsed = FrameRepr::parse_network(f, f.len()).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(parsed.repr.net.is_v1(), net == Net::V1, "{what}");
        parsed
            .verified()
            .unwrap_or_else(|e| panic!("{what} frame {i}: {e}"));
        let mut again = vec![0u8; f.len()];
        let mut repr = parsed.repr;
        repr.fill_lengths();
        repr.emit(&mut again, parsed.payload).unwrap();
        assert_eq!(&again, f, "{what}: frame {i} is what the wire layer writes");
        let bth = repr.transport.bth;
        let psn0 = *first_psn.get_or_insert(bth.psn);
        assert_eq!(bth.psn, psn0.add(i as u32), "{what}: consecutive PSNs");
        let name = bth.opcode.info().unwrap().name;
        let expected = if i == 0 {
            "FIRST"
        } else if i + 1 == n {
            "LAST"
        } else {
            "MIDDLE"
        };
        assert!(name.contains(expected), "{what}: frame {i} is {name}");
        let rc = qp_type == QpType::Rc;
        assert_eq!(
            bth.ack_req,
            rc && i + 1 == n,
            "{what}: AckReq only on the last (the message is under 64 packets)"
        );
        payload.extend_from_slice(parsed.payload);
    }
    assert_eq!(payload, data, "{what}: the payload, in order");
    let middle = [
        Opcode::RC_RDMA_WRITE_MIDDLE,
        Opcode::RC_SEND_MIDDLE,
        Opcode::UC_RDMA_WRITE_MIDDLE,
        Opcode::UC_SEND_MIDDLE,
    ];
    assert!(middle
        .iter()
        .any(|o| o.0 == frames[2][net.transport_offset()]));
}

#[test]
fn every_segment_is_what_the_wire_layer_writes() {
    for net in [Net::V4, Net::V6, Net::V1] {
        for qp_type in [QpType::Rc, QpType::Uc] {
            for write in [false, true] {
                // One SGE (the payload is lent and copied while hashed), then SGEs that
                // packets straddle (gathered by copies, then hashed).
                check(net, qp_type, write, &[7 * MTU as u32 + 100]);
                check(net, qp_type, write, &[1000, 3000, 2500, 444]);
            }
        }
    }
}

#[test]
fn a_retry_rebuilds_the_middle_packets_with_their_own_psns() {
    // Go-back-N resends from an earlier PSN: the kept headers must not leak the PSNs or
    // AckReq bits of the first pass.
    let mut sim = Sim::pair(5, LinkModel::default());
    let o = QpOptions {
        mtu: Mtu::Mtu1024,
        timeout: 8,
        ..Default::default()
    };
    let (qa, _qb) = sim.connect(0, 1, &o);
    let acc = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
    let len = 10 * MTU;
    let (a, ka) = sim.alloc_mr(0, len, acc);
    let (b, kb) = sim.alloc_mr(1, len, acc);
    let data: Vec<u8> = (0..len).map(|i| (i * 3) as u8).collect();
    sim.write_mem(0, a, &data);
    let wr = SendWr::new(
        1,
        SendOp::Write(RemoteAddr {
            va: b,
            rkey: kb.rkey,
        }),
        Some(Sge {
            addr: a,
            length: len as u32,
            lkey: ka.lkey,
        }),
    );
    sim.dev(0).post_send(qa, wr).unwrap();
    // Lose the 4th and 5th packets once: the responder NAKs the gap, the requester goes
    // back to PSN 3 and sends MIDDLE packets again.
    sim.on_packet(2, proto::sim::Action::Drop, |i| {
        i.from == 0 && (i.psn == Psn::new(3) || i.psn == Psn::new(4))
    });
    sim.capture();
    sim.run(100_000_000);
    assert_eq!(sim.read_mem(1, b, len), data);
    let c = sim.completions_of(0, qa);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].status, WcStatus::Success);
    let sent: Vec<(u32, bool)> = sim
        .trace
        .iter()
        .filter(|i| i.from == 0)
        .map(|i| (i.psn.value(), i.ack_req))
        .collect();
    let resent_from = sent.iter().skip(5).position(|(p, _)| *p == 3);
    assert!(resent_from.is_some(), "PSN 3 was sent again: {sent:?}");
    let psns: Vec<u32> = sent.iter().map(|(p, _)| *p).collect();
    assert_eq!(psns.iter().filter(|p| **p == 3).count(), 2, "{psns:?}");
    // Each carried packet's ICRC is right (the simulator drops bad ones as the receiver
    // counts them): nothing was corrupt.
    assert_eq!(sim.dev(1).counters().icrc_errors, 0);
}
