//! The hostile corpus (`proto::sim::hostile`) against the engine, one packet at a time into a
//! fresh device with an RC QP in RTS, a UD QP and registered memory: every packet ends under
//! a counted reason (dropped, NAKed, ignored), no registered memory changes, no receive
//! completes, and the counters add up (every packet in exactly one of rcvd_pkts, dropped_pkts,
//! icrc_errors, rp_cnp_handled, rp_cnp_ignored, drops.bad_pkey; every dropped_pkts under a reason).
//! Then: a flood of guessed R_Keys against a live MR writes nothing and is counted.

use proto::sim::hostile::{self, ipv4_udp, Icrc, Victim};
use proto::sim::{LinkModel, QpOptions, Sim};
use proto::transport::*;
use proto::Qpn;
use std::net::Ipv4Addr;

const A_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const MR_LEN: usize = 8192;

struct Device {
    sim: Sim,
    victim: Victim,
    /// (address, length) of every region whose bytes must not change.
    regions: Vec<(u64, usize)>,
    snapshot: Vec<Vec<u8>>,
}

fn device(qp_type: QpType) -> Device {
    device_with(qp_type, LossRecovery::GoBackN)
}

fn device_with(qp_type: QpType, loss_recovery: LossRecovery) -> Device {
    let mut sim = Sim::pair(11, LinkModel::default());
    let o = QpOptions {
        qp_type,
        rq_psn: 0x100,
        loss_recovery,
        ..QpOptions::default()
    };
    let (_, rc_b) = sim.connect(0, 1, &o);
    let ud = QpOptions {
        qp_type: QpType::Ud,
        ..QpOptions::default()
    };
    let (_, ud_b) = sim.connect(0, 1, &ud);
    let all = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
    let (mr_va, mr) = sim.alloc_mr(1, MR_LEN, all);
    let pattern: Vec<u8> = (0..MR_LEN).map(|i| (i * 31 + 7) as u8).collect();
    sim.write_mem(1, mr_va, &pattern);
    let b = sim.dev(1);
    let pd2 = b.alloc_pd();
    let foreign_va = b.memory_mut().alloc(MR_LEN);
    b.memory_mut().fill(foreign_va, &pattern);
    let foreign = b.reg_mr(pd2, foreign_va, MR_LEN as u64, all).unwrap();
    // Receives the SENDs could land in, to prove none does.
    for q in [rc_b, ud_b] {
        let wr = RecvWr {
            wr_id: 1,
            sg_list: vec![Sge {
                addr: mr_va,
                length: 4096,
                lkey: mr.lkey,
            }],
        };
        sim.dev(1).post_recv(q, wr).unwrap();
    }
    let rc_psn = sim.dev(1).query_qp(rc_b).unwrap().1.rq_psn.value();
    let victim = Victim {
        rc_qpn: rc_b.value(),
        rc_psn,
        ud_qpn: ud_b.value(),
        ud_qkey: 0x1111_1111,
        mr_va,
        mr_len: MR_LEN as u64,
        mr_rkey: mr.rkey.0,
        foreign_rkey: foreign.rkey.0,
        unknown_qpn: 0x00ab_cdef,
    };
    let regions = vec![(mr_va, MR_LEN), (foreign_va, MR_LEN)];
    let snapshot = regions
        .iter()
        .map(|&(a, l)| sim.read_mem(1, a, l))
        .collect();
    Device {
        sim,
        victim,
        regions,
        snapshot,
    }
}

/// Counters that say a packet was dropped, refused or ignored (or, for CNPs, taken).
fn outcomes(c: &Counters) -> u64 {
    let d = &c.drops;
    c.dropped_pkts
        + c.icrc_errors
        + (c.rp_cnp_handled + c.rp_cnp_ignored)
        + c.duplicate_request
        + c.out_of_seq_request
        + c.send_rnr_err
        + d.bad_pkey
        + d.no_group
        + d.qp_state
        + d.psn_gap
        + d.duplicate_ignored
        + d.response_ignored
        + d.uc_abandoned
        + d.ud_bad_qkey
        + d.ud_not_received
        + d.nak_remote_access
        + d.nak_invalid_request
        + d.nak_remote_operational
}

fn deliver(dev: &mut Device, bytes: &[u8], icrc: Icrc) {
    let packet = ipv4_udp(A_IP, B_IP, 0xc000, 0, bytes, icrc == Icrc::Valid);
    dev.sim.dev(1).handle_packet(1_000, &packet);
}

#[test]
fn every_hostile_packet_is_counted_under_a_reason_and_changes_nothing() {
    hostile_corpus_against(LossRecovery::GoBackN);
}

/// The same corpus against an RC QP on selective retransmission: its reorder buffer may
/// also hold a well-formed request ahead of ePSN (counted `ooo_held`), which executes
/// nothing until the hole before it fills, so memory and receives stay untouched too.
#[test]
fn every_hostile_packet_into_a_selective_qp_is_counted_and_changes_nothing() {
    hostile_corpus_against(LossRecovery::Selective(SelectiveParams::default()));
}

fn hostile_corpus_against(loss_recovery: LossRecovery) {
    // (RC only: a UC QP resynchronises on any packet that starts a message, at any PSN, so
    // a well-formed UC SEND is accepted from anyone who knows the QPN, as on every RNIC.)
    let qp_type = QpType::Rc;
    let corpus = hostile::corpus(&device_with(qp_type, loss_recovery).victim);
    assert!(corpus.len() > 900, "{} packets", corpus.len());
    let held = |c: &Counters| outcomes(c) + c.ooo_held;
    for (i, h) in corpus.iter().enumerate() {
        let mut dev = device_with(qp_type, loss_recovery);
        let before = *dev.sim.dev(1).counters();
        deliver(&mut dev, &h.bytes, h.icrc);
        let now = 2_000;
        let mut buf = vec![0u8; MAX_FRAME_LEN];
        while dev.sim.dev(1).poll_transmit(now, &mut buf).is_some() {}
        let c = *dev.sim.dev(1).counters();
        let why = format!(
            "{qp_type:?} {loss_recovery:?} packet {i} ({}): {:02x?}",
            h.what,
            &h.bytes[..h.bytes.len().min(32)]
        );
        assert!(
            held(&c) > held(&before),
            "not counted under any reason: {why}\n{c:#?}"
        );
        // Exactly one of the top-level fates.
        let fates = |c: &Counters| {
            c.rcvd_pkts
                + c.dropped_pkts
                + c.icrc_errors
                + (c.rp_cnp_handled + c.rp_cnp_ignored)
                + c.drops.bad_pkey
        };
        assert_eq!(fates(&c), fates(&before) + 1, "{why}");
        assert_eq!(c.dropped_pkts, c.drops.dropped_total(), "{why}");
        for (k, &(addr, len)) in dev.regions.iter().enumerate() {
            assert!(
                dev.sim.read_mem(1, addr, len) == dev.snapshot[k],
                "memory changed: {why}"
            );
        }
        dev.sim.drain_completions();
        let ok_recv = dev
            .sim
            .completions_of(1, Qpn::new(dev.victim.rc_qpn))
            .into_iter()
            .chain(dev.sim.completions_of(1, Qpn::new(dev.victim.ud_qpn)))
            .filter(|wc| wc.status == WcStatus::Success)
            .count();
        assert_eq!(ok_recv, 0, "a receive completed: {why}");
    }
}

#[test]
fn a_flood_of_guessed_rkeys_writes_nothing_and_is_counted() {
    // UC: a refused WRITE abandons the message but leaves the QP up, so every guess is
    // tried against a live QP at the expected PSN with bounds inside the MR.
    let mut dev = device(QpType::Uc);
    let v = dev.victim;
    let mut rng = proto::transport::chacha::ChaCha20Rng::from_seed([42; 32]);
    let guesses = 20_000u32;
    let before = *dev.sim.dev(1).counters();
    let mut psn = v.rc_psn;
    for _ in 0..guesses {
        let mut rkey = rng.next_u32();
        if rkey == v.mr_rkey {
            rkey ^= 1;
        }
        let f = hostile::ExtFields {
            va: v.mr_va,
            rkey,
            dma_len: 64,
            ..Default::default()
        };
        let p = hostile::RawPacket::new(
            proto::wire::Opcode::UC_RDMA_WRITE_ONLY.0,
            v.rc_qpn,
            psn,
            &f,
            64,
        );
        psn = (psn + 1) & 0xff_ffff;
        deliver(&mut dev, &p.to_bytes(), Icrc::Valid);
    }
    let c = *dev.sim.dev(1).counters();
    assert_eq!(
        c.drops.uc_abandoned - before.drops.uc_abandoned,
        u64::from(guesses)
    );
    for (k, &(addr, len)) in dev.regions.iter().enumerate() {
        assert!(
            dev.sim.read_mem(1, addr, len) == dev.snapshot[k],
            "memory changed"
        );
    }
    // The QP is still up: the real key writes.
    let f = hostile::ExtFields {
        va: v.mr_va,
        rkey: v.mr_rkey,
        dma_len: 64,
        ..Default::default()
    };
    let p = hostile::RawPacket::new(
        proto::wire::Opcode::UC_RDMA_WRITE_ONLY.0,
        v.rc_qpn,
        psn,
        &f,
        64,
    );
    deliver(&mut dev, &p.to_bytes(), Icrc::Valid);
    assert_ne!(
        dev.sim.read_mem(1, v.mr_va, 64),
        dev.snapshot[0][..64],
        "the real key writes"
    );
}
