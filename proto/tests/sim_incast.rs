//! Incast in the simulator: N senders at line rate into one receiver behind one switch port
//! of the same rate that marks ECN by RED's rule. With DCQCN the port stays busy, its queue
//! stays within the marking range, the flows share it fairly and nothing is dropped; without
//! congestion control the queue fills to what rxe's window lets in and, with 16 senders,
//! overflows and drops.
//!
//! The network: 25 Gbit/s everywhere (a ConnectX-4 Lx port), 1 µs per hop, path MTU 1024
//! (what rdma_cm picks on a 1500-byte Ethernet), a 1 MB port buffer, RED from 5 KB to
//! 100 KB (probability 0 to 1). DCQCN: NVIDIA's defaults at a 25 Gbit/s line rate, except
//! `clamp_tgt_rate = 1`, the paper's `R_T ← R_C` on every cut: with the firmware's default (0)
//! the target stays at the line rate through a congestion episode, and every 32 KiB byte
//! counter event takes the rate half way back to it, so synchronised senders keep
//! overshooting (docs/congestion.md shows the numbers).

mod cc_support;

use cc_support::{drive, Flow, MS, US};
use proto::sim::{jain_index, BottleneckModel, LinkModel, QpOptions, Red, Sim};
use proto::transport::*;
use std::net::IpAddr;

const LINE: u64 = 25_000_000_000;
const BUFFER: u64 = 1_000_000;
const RED: Red = Red {
    min_bytes: 5_000,
    max_bytes: 100_000,
    max_probability: 1.0,
};

struct Scenario {
    senders: usize,
    cc: Algorithm,
    duration: Nanos,
    /// The last sender starts then (the others at 0).
    late_start: Option<Nanos>,
    seed: u64,
}

struct Outcome {
    /// Bytes per sender that left the port in the last half of the run.
    last_half: Vec<f64>,
    utilisation_last_half: f64,
    jain_last_half: f64,
    max_queue: u64,
    max_queue_last_half: u64,
    dropped: u64,
    marked: u64,
    cnps_sent: u64,
    cnps_handled: u64,
    /// Per sender, bits per second in each 1 ms of the run.
    per_ms: Vec<Vec<f64>>,
}

fn sender_ip(i: usize) -> IpAddr {
    format!("10.0.1.{}", i + 1).parse().unwrap()
}

fn dcqcn_params() -> CcParams {
    CcParams {
        line_rate: (LINE / 1_000_000) as u32,
        clamp_tgt_rate: true,
        ..CcParams::default()
    }
}

fn run(s: &Scenario) -> Outcome {
    let mut sim = Sim::new(s.seed);
    let link = LinkModel {
        rate_bps: Some(LINE),
        delay: US,
        ..LinkModel::default()
    };
    let receiver = sim.add_node("10.0.0.100".parse().unwrap(), link);
    for i in 0..s.senders {
        sim.add_node(sender_ip(i), link);
    }
    sim.set_bottleneck(
        receiver,
        BottleneckModel {
            rate_bps: LINE,
            buffer_bytes: BUFFER,
            red: Some(RED),
            delay: US,
        },
    );
    let cc = CongestionConfig {
        algorithm: s.cc,
        params: dcqcn_params(),
    };
    for n in 0..sim.nodes.len() {
        sim.dev(n).set_congestion_control(cc);
    }
    let o = QpOptions {
        mtu: Mtu::Mtu1024,
        timeout: 14,
        ..QpOptions::default()
    };
    let mut flows: Vec<Flow> = (0..s.senders)
        .map(|i| Flow::new(&mut sim, receiver + 1 + i, receiver, &o, 1 << 20, 2))
        .collect();
    if let Some(t) = s.late_start {
        flows.last_mut().unwrap().start = t;
    }
    drive(&mut sim, &mut flows, s.duration, |_| {});

    let port = sim.bottleneck(receiver).unwrap();
    let half = s.duration / 2;
    let bytes_of = |from, to, i| {
        port.bytes_by_source(from, to)
            .iter()
            .find(|(src, _)| *src == sender_ip(i))
            .map_or(0, |(_, b)| *b)
    };
    let last_half: Vec<f64> = (0..s.senders)
        .map(|i| bytes_of(half, s.duration, i) as f64)
        .collect();
    let total: f64 = last_half.iter().sum();
    let per_ms = (0..s.senders)
        .map(|i| {
            (0..s.duration / MS)
                .map(|k| bytes_of(k * MS, (k + 1) * MS, i) as f64 * 8.0 * 1e3)
                .collect()
        })
        .collect();
    let counters =
        |f: fn(&Counters) -> u64| -> u64 { sim.nodes.iter().map(|n| f(n.dev.counters())).sum() };
    Outcome {
        utilisation_last_half: total * 8.0 / (LINE as f64 * (s.duration - half) as f64 / 1e9),
        jain_last_half: jain_index(&last_half),
        last_half,
        max_queue: port.max_queue_bytes,
        max_queue_last_half: port.max_queue_between(half, s.duration),
        dropped: port.dropped,
        marked: port.marked,
        cnps_sent: counters(|c| c.np_cnp_sent),
        cnps_handled: counters(|c| c.rp_cnp_handled),
        per_ms,
    }
}

fn report(name: &str, o: &Outcome) {
    println!(
        "{name}: utilisation {:.3} (last half), Jain {:.4}, queue max {} B (last half {} B), \
         marked {}, dropped {}, CNPs sent {} handled {}, shares {:?} MB",
        o.utilisation_last_half,
        o.jain_last_half,
        o.max_queue,
        o.max_queue_last_half,
        o.marked,
        o.dropped,
        o.cnps_sent,
        o.cnps_handled,
        o.last_half
            .iter()
            .map(|b| (b / 1e6).round())
            .collect::<Vec<_>>()
    );
}

/// What DCQCN must achieve in an incast.
fn assert_controlled(o: &Outcome) {
    assert!(o.utilisation_last_half >= 0.90, "utilisation");
    assert!(o.jain_last_half >= 0.95, "fairness");
    assert_eq!(o.dropped, 0, "no drops");
    assert!(o.max_queue < BUFFER, "the queue stays below the buffer");
    assert!(
        o.max_queue_last_half < RED.max_bytes,
        "in the last half the queue stays within the marking range"
    );
    assert!(o.marked > 0 && o.cnps_sent > 0);
    assert_eq!(o.cnps_sent, o.cnps_handled, "every CNP reached its QP");
}

#[test]
fn incast_of_4_with_dcqcn_is_fast_fair_and_lossless() {
    let o = run(&Scenario {
        senders: 4,
        cc: Algorithm::Dcqcn,
        duration: 60 * MS,
        late_start: None,
        seed: 1,
    });
    report("4 senders, DCQCN", &o);
    assert_controlled(&o);
}

#[test]
fn incast_of_16_with_dcqcn_is_fast_fair_and_lossless() {
    let o = run(&Scenario {
        senders: 16,
        cc: Algorithm::Dcqcn,
        duration: 30 * MS,
        late_start: None,
        seed: 1,
    });
    report("16 senders, DCQCN", &o);
    assert_controlled(&o);
}

#[test]
fn incast_without_congestion_control_fills_the_queue_and_16_senders_overflow_it() {
    let four = run(&Scenario {
        senders: 4,
        cc: Algorithm::None,
        duration: 4 * MS,
        late_start: None,
        seed: 1,
    });
    report("4 senders, no congestion control", &four);
    // Nothing holds the senders back but rxe's window of 128 packets: that much of each
    // stands in the queue, four times the top of the marking range. No mark, no CNP.
    let window = 128 * 1024;
    assert!(four.max_queue_last_half > 3 * window, "a standing queue");
    assert!(four.max_queue_last_half > 4 * RED.max_bytes);
    assert_eq!((four.marked, four.cnps_sent), (0, 0));

    let sixteen = run(&Scenario {
        senders: 16,
        cc: Algorithm::None,
        duration: 4 * MS,
        late_start: None,
        seed: 1,
    });
    report("16 senders, no congestion control", &sixteen);
    // 16 windows do not fit in the buffer.
    assert!(sixteen.dropped > 100, "the queue overflows");
    assert!(sixteen.max_queue + 1100 >= BUFFER);
}

#[test]
fn a_flow_that_joins_late_gets_its_fair_share_within_30_ms() {
    let join = 20 * MS;
    let o = run(&Scenario {
        senders: 5,
        cc: Algorithm::Dcqcn,
        duration: 60 * MS,
        late_start: Some(join),
        seed: 1,
    });
    report("4 senders and one joining at 20 ms, DCQCN", &o);
    let fair = LINE as f64 / 5.0;
    let late = &o.per_ms[4];
    // The first millisecond from which on the newcomer's rate stays within 30 % of the
    // fair share (each millisecond's average).
    let k_join = (join / MS) as usize;
    let converged = (k_join..late.len())
        .find(|&k| late[k..].iter().all(|r| (r / fair - 1.0).abs() <= 0.3))
        .expect("the late flow converges");
    let took = converged - k_join;
    println!(
        "late flow: within 30 % of its fair share {took} ms after joining; per ms (Gbit/s): {:?}",
        late[k_join..]
            .iter()
            .map(|r| (r / 1e8).round() / 10.0)
            .collect::<Vec<_>>()
    );
    // DCQCN converges slowly after a join (its additive step is 5 Mbit/s): 20-26 ms here
    // over seeds 1-5 (docs/congestion.md).
    assert!(took <= 30, "converged after {took} ms");
    assert_eq!(o.dropped, 0);
    assert!(o.utilisation_last_half >= 0.90);
}
