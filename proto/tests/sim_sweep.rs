//! The seed sweep: random RC workloads over links with 0-10 % loss, duplication and
//! reordering (plus some corruption), every invariant checked after each run.
//!
//! `SOFTROCE_SEEDS` sets the number of seeds (default 1000), `SOFTROCE_SEED_START` the first;
//! `scripts/soak` runs 100,000 in release. A failure names its seed: rerun with
//! `SOFTROCE_SEED_START=<seed> SOFTROCE_SEEDS=1`.

use proto::sim::{LinkModel, QpOptions, Sim, SimRng};
use proto::transport::*;
use proto::types::Psn;

const REGION: u64 = 2048;

#[derive(Debug)]
enum Op {
    Send { len: u32, recv_region: u64 },
    Write { len: u32 },
    Read { len: u32 },
    FetchAdd { add: u64 },
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pattern(seed: u64, i: u64, len: u32) -> Vec<u8> {
    (0..len as u64)
        .map(|k| (seed.wrapping_mul(31) ^ (i * 131 + k * 7)) as u8)
        .collect()
}

/// One random run; returns the virtual time it took.
pub fn run_seed(seed: u64) -> u64 {
    let mut r = SimRng::new(seed ^ 0x5eed);
    let pct = |r: &mut SimRng| r.below(11) as f64 / 100.0;
    let link = LinkModel {
        delay: 1_000 + r.below(5_000),
        jitter: if r.chance(0.5) { r.below(20_000) } else { 0 },
        loss: pct(&mut r),
        duplicate: pct(&mut r),
        corrupt: if r.chance(0.3) { 0.02 } else { 0.0 },
        ..Default::default()
    };
    let mut sim = Sim::pair(seed, link);
    let mtu = [Mtu::Mtu256, Mtu::Mtu512, Mtu::Mtu1024][r.below(3) as usize];
    let o = QpOptions {
        mtu,
        timeout: 8,
        max_rd_atomic: 1 << r.below(4),
        // Start near the top of the PSN space now and then, to cross the wrap.
        sq_psn: if r.chance(0.3) {
            0xff_fff0
        } else {
            r.below(1 << 24) as u32
        },
        rq_psn: r.below(1 << 24) as u32,
        min_rnr_timer: 1,
        ..Default::default()
    };
    let (qa, qb) = sim.connect(0, 1, &o);
    let acc = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
    let nops = 8 + r.below(24);
    let (a_mem, ka) = sim.alloc_mr(0, (REGION * nops) as usize, acc);
    let (b_mem, kb) = sim.alloc_mr(1, (REGION * nops + 8) as usize, acc);
    let counter = b_mem + REGION * nops;
    let mut ops = Vec::new();
    let mut recvs = 0u64;
    for i in 0..nops {
        let len = r.below(REGION) as u32;
        let op = match r.below(8) {
            0..=2 => {
                let op = Op::Send {
                    len,
                    recv_region: i,
                };
                recvs += 1;
                op
            }
            3..=4 => Op::Write { len },
            5..=6 => Op::Read { len },
            _ => Op::FetchAdd {
                add: 1 + r.below(1000),
            },
        };
        ops.push(op);
    }
    // Receives: most posted before, some only after a while (RNR NAKs, retried forever).
    let late = r.chance(0.2);
    let post_recvs = |sim: &mut Sim| {
        for (i, op) in ops.iter().enumerate() {
            if let Op::Send { recv_region, .. } = op {
                let addr = b_mem + recv_region * REGION;
                sim.post_recv(
                    1,
                    qb,
                    RecvWr {
                        wr_id: 1000 + i as u64,
                        sg_list: vec![Sge {
                            addr,
                            length: REGION as u32,
                            lkey: kb.lkey,
                        }],
                    },
                )
                .expect("post_recv");
            }
        }
    };
    if !late {
        post_recvs(&mut sim);
    }
    for (i, op) in ops.iter().enumerate() {
        let i = i as u64;
        let local = a_mem + i * REGION;
        let region_b = b_mem + i * REGION;
        let (sop, len) = match *op {
            Op::Send { len, .. } => {
                sim.write_mem(0, local, &pattern(seed, i, len));
                (SendOp::Send, len)
            }
            Op::Write { len } => {
                sim.write_mem(0, local, &pattern(seed, i, len));
                (
                    SendOp::Write(RemoteAddr {
                        va: region_b,
                        rkey: kb.rkey,
                    }),
                    len,
                )
            }
            Op::Read { len } => {
                sim.write_mem(1, region_b, &pattern(seed, i, len));
                (
                    SendOp::Read(RemoteAddr {
                        va: region_b,
                        rkey: kb.rkey,
                    }),
                    len,
                )
            }
            Op::FetchAdd { add } => (
                SendOp::FetchAdd {
                    remote: RemoteAddr {
                        va: counter,
                        rkey: kb.rkey,
                    },
                    add,
                },
                8,
            ),
        };
        let mut wr = SendWr::new(
            i,
            sop,
            Some(Sge {
                addr: local,
                length: len,
                lkey: ka.lkey,
            }),
        );
        if i + 1 < nops && r.chance(0.2) {
            wr.flags = SendFlags::NONE;
        }
        sim.post_send(0, qa, wr).expect("post_send");
    }
    if late {
        sim.run(200_000);
        post_recvs(&mut sim);
    }
    sim.run(60_000_000_000);
    let fail = |sim: &Sim, msg: String| -> ! {
        panic!(
            "seed {seed}: {msg}\n(link {link:?}, options {o:?}, ops {ops:?})\nviolations: {:?}",
            sim.violations
        )
    };
    sim.check_all_sends_completed();
    for (node, wc) in &sim.completions {
        if wc.status != WcStatus::Success {
            fail(&sim, format!("node {node}: {wc:?}"));
        }
    }
    let recv_done = sim.completions_of(1, qb).len() as u64;
    if recv_done != recvs {
        fail(
            &sim,
            format!("{recv_done} receives completed, {recvs} expected"),
        );
    }
    let mut sum = 0u64;
    for (i, op) in ops.iter().enumerate() {
        let iu = i as u64;
        match *op {
            Op::Send { len, recv_region } => {
                let got = sim.read_mem(1, b_mem + recv_region * REGION, len as usize);
                if got != pattern(seed, iu, len) {
                    fail(&sim, format!("SEND {i} landed wrong"));
                }
                let wc = sim
                    .completions_of(1, qb)
                    .into_iter()
                    .find(|w| w.wr_id == 1000 + iu);
                if wc.map(|w| w.byte_len) != Some(len) {
                    fail(&sim, format!("receive {i} has {wc:?}"));
                }
            }
            Op::Write { len } => {
                if sim.read_mem(1, b_mem + iu * REGION, len as usize) != pattern(seed, iu, len) {
                    fail(&sim, format!("WRITE {i} landed wrong"));
                }
            }
            Op::Read { len } => {
                if sim.read_mem(0, a_mem + iu * REGION, len as usize) != pattern(seed, iu, len) {
                    fail(&sim, format!("READ {i} returned wrong bytes"));
                }
            }
            Op::FetchAdd { add } => {
                // One requester, in order: each FETCH_ADD sees the sum of those before it,
                // which also proves none ran twice.
                let got = sim.read_mem(0, a_mem + iu * REGION, 8);
                if got != sum.to_ne_bytes() {
                    fail(
                        &sim,
                        format!("FETCH_ADD {i} returned {got:?}, expected {sum}"),
                    );
                }
                sum += add;
            }
        }
    }
    if sim.read_mem(1, counter, 8) != sum.to_ne_bytes() {
        fail(
            &sim,
            "atomic counter is wrong: an atomic ran twice or never".into(),
        );
    }
    let (req, comp, _) = sim.dev(0).qp_psns(qa).expect("qp");
    if req != comp {
        fail(
            &sim,
            format!("requester ended with unacked PSNs {comp}..{req}"),
        );
    }
    let _ = Psn::new(0);
    sim.check();
    sim.now
}

#[test]
fn sim_seed_sweep_rc_under_loss_duplication_reordering() {
    let start = env("SOFTROCE_SEED_START", 1);
    let n = env("SOFTROCE_SEEDS", 1000);
    for seed in start..start + n {
        run_seed(seed);
    }
}

#[test]
#[ignore]
fn sim_sweep_timing() {
    for seed in 1..21 {
        let t = std::time::Instant::now();
        let now = run_seed(seed);
        eprintln!("seed {seed}: virtual {now} ns, wall {:?}", t.elapsed());
    }
}
