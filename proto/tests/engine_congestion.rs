//! Congestion control in the engine: ECN on the wire, the notification point's CNPs, the
//! reaction point's counters and rate, and the pacer on the requester's transmit path.

mod cc_support;

use cc_support::{drive, Flow, MS, US};
use proto::sim::{BottleneckModel, LinkModel, QpOptions, Sim};
use proto::transport::*;
use proto::types::Qpn;
use proto::wire::{self, Ecn, FrameRepr, Opcode};

fn dcqcn(f: impl FnOnce(&mut CcParams)) -> CongestionConfig {
    let mut c = CongestionConfig::dcqcn();
    f(&mut c.params);
    c
}

/// Two nodes, an RC pair, both devices with `cc`; a 64 KiB buffer on each side.
struct Setup {
    sim: Sim,
    qa: Qpn,
    qb: Qpn,
    a: (u64, MrKeys),
    b: (u64, MrKeys),
}

fn setup(cc: CongestionConfig, o: QpOptions) -> Setup {
    let mut sim = Sim::pair(3, LinkModel::default());
    sim.dev(0).set_congestion_control(cc);
    sim.dev(1).set_congestion_control(cc);
    let (qa, qb) = sim.connect(0, 1, &o);
    let acc = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
    let a = sim.alloc_mr(0, 65536, acc);
    let b = sim.alloc_mr(1, 65536, acc);
    Setup { sim, qa, qb, a, b }
}

impl Setup {
    fn write(&mut self, wr_id: u64, len: u32) {
        let wr = SendWr::new(
            wr_id,
            SendOp::Write(RemoteAddr {
                va: self.b.0,
                rkey: self.b.1.rkey,
            }),
            Some(Sge {
                addr: self.a.0,
                length: len,
                lkey: self.a.1.lkey,
            }),
        );
        self.sim.post_send(0, self.qa, wr).unwrap();
    }

    /// Everything node `from` has to send at `now`, as whole IP packets.
    fn transmit(&mut self, from: usize, now: Nanos) -> Vec<Vec<u8>> {
        let mut buf = vec![0u8; MAX_FRAME_LEN];
        let mut out = Vec::new();
        while let Some(tx) = self.sim.dev(from).poll_transmit(now, &mut buf) {
            out.push(buf[..tx.len].to_vec());
        }
        out
    }
}

fn parse(p: &[u8]) -> wire::ParsedFrame<'_> {
    let f = FrameRepr::parse_ip(p, p.len()).expect("a RoCE packet");
    assert!(f.verified().is_ok(), "ICRC");
    f
}

#[test]
fn with_dcqcn_data_packets_carry_ect0_and_acks_keep_the_av_traffic_class() {
    for cc in [CongestionConfig::default(), CongestionConfig::dcqcn()] {
        let o = QpOptions {
            traffic_class: 0x60, // DSCP 24
            ..QpOptions::default()
        };
        let mut s = setup(cc, o);
        s.write(1, 8192);
        s.sim.run(10 * MS);
        s.sim.check_all_sends_completed();
        let requests: Vec<_> = s.sim.trace.iter().filter(|i| i.from == 0).collect();
        let acks: Vec<_> = s.sim.trace.iter().filter(|i| i.from == 1).collect();
        assert_eq!(requests.len(), 8);
        assert!(!acks.is_empty());
        let want = if cc.marks_ect() { 0x62 } else { 0x60 };
        assert!(requests.iter().all(|i| i.traffic_class == want), "{cc:?}");
        assert!(acks.iter().all(|i| i.traffic_class == 0x60));
    }
}

#[test]
fn a_ce_marked_request_is_answered_by_a_cnp_as_connectx_sends_it() {
    let mut s = setup(CongestionConfig::dcqcn(), QpOptions::default());
    s.write(1, 8192);
    let packets = s.transmit(0, 0);
    assert_eq!(packets.len(), 8);
    for mut p in packets {
        assert_eq!(parse(&p).repr.net.ecn(), Ecn::Ect0);
        assert!(wire::ecn::mark_ce(&mut p));
        s.sim.dev(1).handle_packet(0, &p);
    }
    let out = s.transmit(1, 0);
    // Eight marks within min_time_between_cnps (4 µs): one CNP, before the ACK.
    let cnp = parse(&out[0]);
    let t = cnp.repr.transport;
    assert_eq!(t.bth.opcode, Opcode::CNP);
    assert!(t.bth.becn && !t.bth.fecn && !t.bth.ack_req && !t.bth.solicited);
    assert_eq!(t.bth.dest_qpn, s.qa, "DestQP is the sender's QP");
    assert_eq!((t.bth.psn.value(), t.bth.pkey), (0, 0xffff));
    assert_eq!(
        out[0].len(),
        60,
        "IPv4 20 + UDP 8 + BTH 12 + 16 reserved + ICRC 4"
    );
    assert_eq!(&out[0][40..56], &[0u8; 16]);
    assert_eq!(cnp.repr.net.traffic_class(), 0xc2, "DSCP 48, ECT(0)");
    assert!(out[1..]
        .iter()
        .all(|p| parse(p).repr.transport.bth.opcode == Opcode::RC_ACKNOWLEDGE));
    let c = *s.sim.nodes[1].dev.counters();
    assert_eq!((c.np_ecn_marked_roce_packets, c.np_cnp_sent), (8, 1));

    // 4 µs later another mark gets another CNP; 3 µs after that, none.
    s.write(2, 2048);
    let more = s.transmit(0, 4 * US);
    for (k, mut p) in more.into_iter().enumerate() {
        wire::ecn::mark_ce(&mut p);
        s.sim.dev(1).handle_packet(4 * US + 3 * US * k as u64, &p);
    }
    let cnps = s
        .transmit(1, 7 * US)
        .iter()
        .filter(|p| parse(p).repr.transport.bth.opcode == Opcode::CNP)
        .count();
    assert_eq!(cnps, 1);
    assert_eq!(s.sim.nodes[1].dev.counters().np_cnp_sent, 2);

    // The CNP cuts the sender's rate: RC·(1 − α/2) with α = 1023/1024, from the line rate.
    let before = s.sim.dev(0).qp_congestion(s.qa).unwrap();
    assert!(!before.limited);
    s.sim.dev(0).handle_packet(8 * US, &out[0]);
    let c = *s.sim.nodes[0].dev.counters();
    assert_eq!((c.rp_cnp_handled, c.rp_cnp_ignored), (1, 0));
    let after = s.sim.dev(0).qp_congestion(s.qa).unwrap();
    let want = before.rate_bps as f64 * (1.0 - 1023.0 / 2048.0);
    assert!((after.rate_bps as f64 - want).abs() < 2.0, "{after:?}");
    assert!(after.limited && (after.alpha - 1023.0 / 1024.0).abs() < 1e-12);
}

#[test]
fn cnps_are_ignored_without_congestion_control_and_for_unknown_qps() {
    let mut on = setup(CongestionConfig::dcqcn(), QpOptions::default());
    on.write(1, 1024);
    let mut p = on.transmit(0, 0).remove(0);
    wire::ecn::mark_ce(&mut p);
    on.sim.dev(1).handle_packet(0, &p);
    let cnp = on
        .transmit(1, 0)
        .into_iter()
        .find(|p| parse(p).repr.transport.bth.opcode == Opcode::CNP)
        .unwrap();

    // The same CNP to a device without congestion control, and to a QP that does not exist.
    let mut off = setup(CongestionConfig::default(), QpOptions::default());
    assert_eq!(off.qa, on.qa);
    off.sim.dev(0).handle_packet(0, &cnp);
    let mut unknown = cnp.clone();
    unknown[28 + 5..28 + 8].copy_from_slice(&[0, 0x7f, 0x7f]);
    let mut f = FrameRepr::parse_ip(&unknown, unknown.len()).unwrap().repr;
    f.fill_lengths();
    let mut resealed = vec![0u8; f.buffer_len()];
    f.emit(&mut resealed, &[]).unwrap();
    off.sim.dev(0).handle_packet(0, &resealed);
    let c = *off.sim.nodes[0].dev.counters();
    assert_eq!((c.rp_cnp_handled, c.rp_cnp_ignored), (0, 2));
    assert_eq!(c.dropped_pkts, 0);
    let q = off.sim.dev(0).qp_congestion(off.qa).unwrap();
    assert!(!q.limited);

    // A device without congestion control counts CE marks but never answers them.
    off.write(1, 1024);
    let mut p = off.transmit(0, 0).remove(0);
    assert_eq!(parse(&p).repr.net.ecn(), Ecn::NotEct);
    // A CE mark on a Not-ECT packet, as a misconfigured switch might set it.
    assert!(wire::ecn::set_packet_traffic_class(&mut p, 3));
    off.sim.dev(1).handle_packet(0, &p);
    assert!(off
        .transmit(1, 0)
        .iter()
        .all(|p| parse(p).repr.transport.bth.opcode != Opcode::CNP));
    let c = *off.sim.nodes[1].dev.counters();
    assert_eq!((c.np_ecn_marked_roce_packets, c.np_cnp_sent), (1, 0));
}

#[test]
fn a_paced_qp_waits_for_its_time_and_poll_timeout_says_when() {
    // Every QP limited to 10 Mbit/s (MTU 1024).
    let cc = dcqcn(|p| p.rpg_max_rate = 10);
    let mut s = setup(cc, QpOptions::default());
    s.write(1, 4096);
    let first = s.transmit(0, 0);
    // The pacer forgives one full packet's lateness (1024 + 80 bytes at 10 Mbit/s, 883.2 µs),
    // so two packets leave at once, then it holds the QP.
    assert_eq!(first.len(), 2);
    assert_eq!(
        first[0].len(),
        1084,
        "IPv4, UDP, BTH, RETH, 1024 bytes, ICRC"
    );
    assert_eq!(first[1].len(), 1068, "a MIDDLE packet");
    let due = s.sim.dev(0).poll_timeout().expect("the pacer's time");
    // 1084 + 1068 bytes at 10 Mbit/s is 1721.6 µs, less the tolerance.
    assert_eq!(due, 1_721_600 - 883_200);
    assert!(s.transmit(0, due - 1).is_empty());
    s.sim.dev(0).handle_timeout(due);
    assert_eq!(s.transmit(0, due).len(), 1);
    let q = s.sim.dev(0).qp_congestion(s.qa).unwrap();
    assert_eq!((q.rate_bps, q.limited), (10_000_000, true));
}

#[test]
fn a_paced_qp_does_not_hold_back_another_qp() {
    // QP A is cut to the minimum rate by CNPs (no increase timer or byte counter, so it
    // stays there); QP B of the same device is not congested and writes at full speed.
    let cc = dcqcn(|p| {
        p.rpg_time_reset = 0;
        p.rpg_byte_reset = 0;
    });
    let mut s = setup(cc, QpOptions::default());
    let slow = s.qa;
    // A CNP for A from B's notification point (a marked packet of A's), delivered 30 times,
    // once per monitor period.
    s.write(1, 1024);
    let mut p = s.transmit(0, 0).remove(0);
    wire::ecn::mark_ce(&mut p);
    s.sim.dev(1).handle_packet(0, &p);
    let (cnp, ack): (Vec<_>, Vec<_>) = s
        .transmit(1, 0)
        .into_iter()
        .partition(|p| parse(p).repr.transport.bth.opcode == Opcode::CNP);
    let cnp = cnp.into_iter().next().unwrap();
    for p in ack {
        s.sim.dev(0).handle_packet(0, &p);
    }
    for k in 0..30u64 {
        s.sim.dev(0).handle_packet(k * 4 * US, &cnp);
    }
    assert_eq!(s.sim.nodes[0].dev.counters().rp_cnp_handled, 30);
    let q = s.sim.dev(0).qp_congestion(slow).unwrap();
    assert_eq!(q.rate_bps, 1_000_000, "rpg_min_rate");
    s.sim.now = 200 * US;

    let (fast, _) = s.sim.connect(0, 1, &QpOptions::default());
    s.write(2, 65536);
    let wr = SendWr::new(
        3,
        SendOp::Write(RemoteAddr {
            va: s.b.0,
            rkey: s.b.1.rkey,
        }),
        Some(Sge {
            addr: s.a.0,
            length: 65536,
            lkey: s.a.1.lkey,
        }),
    );
    s.sim.post_send(0, fast, wr).unwrap();
    s.sim.run(5 * MS);
    let done = s.sim.completions_of(0, fast);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].status, WcStatus::Success);
    let slow_done: Vec<u64> = s
        .sim
        .completions_of(0, slow)
        .iter()
        .map(|wc| wc.wr_id)
        .collect();
    assert!(
        !slow_done.contains(&2),
        "the slow QP is still at its 64 KiB write"
    );
    // 5 ms at 1 Mbit/s is 625 bytes: A sent its first two packets only (the burst the pacer
    // allows after an idle moment).
    let from_slow = s
        .sim
        .trace
        .iter()
        .filter(|i| i.from == 0 && i.dest_qpn == s.qb && i.opcode.0 < 0x0c)
        .count();
    assert_eq!(from_slow, 2);
}

/// The rate a paced QP sends at with `rpg_max_rate` = `mbps` (0: the line rate, 25 Gbit/s):
/// IP bytes leaving the receiver's switch port (25 Gbit/s, so that at the line rate the
/// unpaced QP is limited by the wire), between the first and last packet after a tenth of
/// the run.
fn paced_rate(mbps: u32, duration: Nanos) -> f64 {
    let link = LinkModel {
        rate_bps: Some(25_000_000_000),
        delay: 2 * US,
        ..LinkModel::default()
    };
    let mut sim = Sim::pair(5, link);
    sim.set_bottleneck(
        1,
        BottleneckModel {
            rate_bps: 25_000_000_000,
            buffer_bytes: 1 << 30,
            red: None,
            delay: 0,
        },
    );
    let cc = dcqcn(|p| {
        p.line_rate = 25_000;
        p.rpg_max_rate = mbps;
    });
    sim.dev(0).set_congestion_control(cc);
    sim.dev(1).set_congestion_control(cc);
    let o = QpOptions {
        mtu: Mtu::Mtu4096,
        ..QpOptions::default()
    };
    let mut flows = [Flow::new(&mut sim, 0, 1, &o, 262_144, 4)];
    drive(&mut sim, &mut flows, duration, |_| {});
    let port = sim.bottleneck(1).unwrap();
    let data: Vec<_> = port
        .forwarded
        .iter()
        .filter(|f| f.departure >= duration / 10)
        .collect();
    assert!(data.len() > 20, "{} packets at {mbps} Mbit/s", data.len());
    let (first, last) = (data[0], data[data.len() - 1]);
    let bytes: u64 = data[1..].iter().map(|f| u64::from(f.len)).sum();
    bytes as f64 * 8.0 / ((last.departure - first.departure) as f64 / 1e9)
}

#[test]
fn pacing_holds_a_qp_within_5_percent_of_its_rate_from_10_mbits_to_line_rate() {
    for (mbps, duration) in [
        (10u32, 400 * MS),
        (100, 40 * MS),
        (1_000, 10 * MS),
        (10_000, 2 * MS),
        (20_000, 2 * MS),
        (0, 2 * MS),
    ] {
        let want = if mbps == 0 {
            25e9
        } else {
            f64::from(mbps) * 1e6
        };
        let got = paced_rate(mbps, duration);
        let err = got / want - 1.0;
        println!(
            "set {want:.3e} bit/s, sent {got:.4e} bit/s, error {:+.2} %",
            err * 100.0
        );
        assert!(err.abs() < 0.05, "set {want}, sent {got}");
    }
}

#[test]
fn roce_v1_carries_ecn_in_the_grh_and_answers_a_ce_mark_with_a_v1_cnp() {
    // Both devices on RoCE v1 GIDs (the L2 device's `--roce v1`): the GRH's traffic class
    // is the IP TOS of v2 (IBTA Annex A16), ECN bits included.
    let mut sim = Sim::pair_v1(3, LinkModel::default());
    sim.dev(0).set_congestion_control(CongestionConfig::dcqcn());
    sim.dev(1).set_congestion_control(CongestionConfig::dcqcn());
    let (qa, qb) = sim.connect(0, 1, &QpOptions::default());
    let acc = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
    let a = sim.alloc_mr(0, 65536, acc);
    let b = sim.alloc_mr(1, 65536, acc);
    let mut s = Setup { sim, qa, qb, a, b };
    s.write(1, 4096);
    let v1 = |p: &[u8]| {
        let f = FrameRepr::parse_network(p, p.len()).expect("a RoCE v1 packet");
        assert!(f.repr.net.is_v1() && f.repr.udp.is_none());
        assert!(f.verified().is_ok(), "v1 ICRC");
        (
            f.repr.net.ecn(),
            f.repr.net.traffic_class(),
            f.repr.transport,
        )
    };
    let packets = s.transmit(0, 0);
    assert_eq!(packets.len(), 4);
    for mut p in packets {
        assert_eq!(v1(&p).0, Ecn::Ect0, "data packets are ECN-capable");
        assert!(
            wire::ecn::mark_ce(&mut p),
            "the GRH's traffic class takes CE"
        );
        // The ICRC masks the traffic class: the marked packet still verifies.
        assert_eq!(v1(&p).0, Ecn::Ce);
        s.sim.dev(1).handle_packet(0, &p);
    }
    let out = s.transmit(1, 0);
    let (_, tclass, t) = v1(&out[0]);
    assert_eq!(t.bth.opcode, Opcode::CNP);
    assert!(t.bth.becn);
    assert_eq!(t.bth.dest_qpn, s.qa);
    assert_eq!(tclass, 0xc2, "DSCP 48, ECT(0), in the GRH");
    assert_eq!(
        out[0].len(),
        40 + 12 + 16 + 4,
        "GRH + BTH + 16 reserved + ICRC"
    );
    let c = *s.sim.nodes[1].dev.counters();
    assert_eq!((c.np_ecn_marked_roce_packets, c.np_cnp_sent), (4, 1));
    s.sim.dev(0).handle_packet(US, &out[0]);
    let c = *s.sim.nodes[0].dev.counters();
    assert_eq!((c.rp_cnp_handled, c.rp_cnp_ignored), (1, 0));
    assert!(s.sim.dev(0).qp_congestion(s.qa).unwrap().limited);
}
