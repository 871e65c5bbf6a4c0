//! Seed sweeps of the unreliable transports under 0-10 % loss, duplication and reordering.
//! UC: every send completes with success in order; a receive holds exactly one whole message
//! (a lost packet drops the rest of its message, never splices two). Like rxe, a UC responder
//! takes any packet that starts a message, so a late duplicate is delivered again: order is
//! not checked. UD: every datagram that arrives is whole, behind its GRH area.
//! `SOFTROCE_SEEDS` (default 1000) and `SOFTROCE_SEED_START` as in `sim_sweep`.

use proto::sim::{LinkModel, QpOptions, Sim, SimRng};
use proto::transport::*;
use proto::types::Qkey;

const REGION: u64 = 4096;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pattern(seed: u64, i: u64, len: u32) -> Vec<u8> {
    (0..len as u64)
        .map(|k| (seed ^ (i * 131 + k * 7)) as u8)
        .collect()
}

fn lossy(r: &mut SimRng) -> LinkModel {
    let pct = |r: &mut SimRng| r.below(11) as f64 / 100.0;
    LinkModel {
        delay: 1_000 + r.below(5_000),
        jitter: if r.chance(0.5) { r.below(20_000) } else { 0 },
        loss: pct(r),
        duplicate: pct(r),
        corrupt: if r.chance(0.3) { 0.02 } else { 0.0 },
        ..Default::default()
    }
}

fn run(seed: u64, ty: QpType) {
    let mut r = SimRng::new(seed ^ 0x0c0d);
    let link = lossy(&mut r);
    // A quarter of the runs over IPv6, an eighth over RoCE v1.
    let mut sim = match r.below(8) {
        0 | 1 => Sim::pair_v6(seed, link),
        2 => Sim::pair_v1(seed, link),
        _ => Sim::pair(seed, link),
    };
    let o = QpOptions {
        qp_type: ty,
        mtu: [Mtu::Mtu256, Mtu::Mtu1024][r.below(2) as usize],
        sq_psn: r.below(1 << 24) as u32,
        ..Default::default()
    };
    let (qa, qb) = if ty == QpType::Ud {
        let qa = sim.create_qp(0, &o);
        let qb = sim.create_qp(1, &o);
        sim.bring_up(0, qa, 1, qb, &o);
        sim.bring_up(1, qb, 0, qa, &o);
        (qa, qb)
    } else {
        sim.connect(0, 1, &o)
    };
    let ah = {
        let pd = sim.nodes[0].pd;
        let ip = sim.nodes[1].ip;
        sim.dev(0)
            .create_ah(pd, AddressVector::new(ip))
            .expect("AH")
    };
    let n = 4 + r.below(20);
    let acc = Access::LOCAL_WRITE;
    let (a, ka) = sim.alloc_mr(0, (REGION * n) as usize, acc);
    let (b, kb) = sim.alloc_mr(1, (REGION * n * 2) as usize, acc);
    let max = if ty == QpType::Ud {
        o.mtu.bytes() as u64
    } else {
        3000
    };
    let mut lens = Vec::new();
    // UD may deliver a datagram twice (duplication): give it room for both copies.
    for i in 0..n * 2 {
        let sg = Sge {
            addr: b + i * REGION,
            length: REGION as u32,
            lkey: kb.lkey,
        };
        sim.dev(1)
            .post_recv(
                qb,
                RecvWr {
                    wr_id: 1000 + i,
                    sg_list: vec![sg],
                },
            )
            .expect("post_recv");
    }
    for i in 0..n {
        let len = 1 + r.below(max) as u32;
        lens.push(len);
        sim.write_mem(0, a + i * REGION, &pattern(seed, i, len));
        let mut wr = SendWr::new(
            i,
            SendOp::SendWithImm(i as u32),
            Some(Sge {
                addr: a + i * REGION,
                length: len,
                lkey: ka.lkey,
            }),
        );
        if ty == QpType::Ud {
            wr.ud = Some(UdDest {
                ah,
                remote_qpn: qb,
                remote_qkey: Qkey(0x1111_1111),
            });
        }
        sim.post_send(0, qa, wr).expect("post_send");
    }
    sim.run(10_000_000_000);
    sim.check_all_sends_completed();
    let sends = sim.completions_of(0, qa);
    assert_eq!(sends.len() as u64, n, "seed {seed}");
    assert!(
        sends.iter().all(|w| w.status == WcStatus::Success),
        "seed {seed}: {sends:?}"
    );
    let grh = if ty == QpType::Ud { 40 } else { 0 };
    for (slot, wc) in sim.completions_of(1, qb).iter().enumerate() {
        assert_eq!(wc.status, WcStatus::Success, "seed {seed}: {wc:?}");
        let k = wc.imm_data;
        let len = *lens
            .get(k as usize)
            .unwrap_or_else(|| panic!("seed {seed}: unknown message {k}"));
        assert_eq!(wc.byte_len, len + grh, "seed {seed}: message {k} size");
        assert_eq!(
            wc.wr_id,
            1000 + slot as u64,
            "seed {seed}: receives complete in order"
        );
        let got = sim.read_mem(1, b + slot as u64 * REGION + u64::from(grh), len as usize);
        assert_eq!(
            got,
            pattern(seed, u64::from(k), len),
            "seed {seed}: message {k} bytes"
        );
    }
    sim.check();
}

#[test]
fn sim_seed_sweep_uc_drops_whole_messages_only() {
    let start = env("SOFTROCE_SEED_START", 1);
    for seed in start..start + env("SOFTROCE_SEEDS", 1000) {
        run(seed, QpType::Uc);
    }
}

#[test]
fn sim_seed_sweep_ud_delivers_whole_datagrams() {
    let start = env("SOFTROCE_SEED_START", 1);
    for seed in start..start + env("SOFTROCE_SEEDS", 1000) {
        run(seed, QpType::Ud);
    }
}
