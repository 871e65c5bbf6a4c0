//! Keys and QPNs are unpredictable (issue 16, ReDMArk): every bit of a fresh R_Key/L_Key is
//! random, a key says nothing about its handle or the keys before it, a freed key names nothing
//! afterwards (even when its handle's slot is reused), and with `random_qpns` QPNs are spread
//! over the device's range.

use proto::sim::{LinkModel, QpOptions, Sim};
use proto::transport::*;
use std::collections::HashSet;

fn engine(seed: u64, entropy: [u8; 32]) -> Engine<VecMemory> {
    let mut cfg = EngineConfig::new("10.0.0.1".parse().unwrap(), seed);
    cfg.key_entropy = entropy;
    Engine::new(cfg, VecMemory::new())
}

#[test]
fn every_bit_of_a_key_is_random_and_keys_are_not_sequential() {
    let mut e = engine(1, [7; 32]);
    let pd = e.alloc_pd();
    let addr = e.memory_mut().alloc(4096);
    let n = 4096;
    let keys: Vec<u32> = (0..n)
        .map(|_| {
            e.reg_mr(pd, addr, 4096, Access::LOCAL_WRITE)
                .unwrap()
                .rkey
                .0
        })
        .collect();
    assert_eq!(keys.iter().collect::<HashSet<_>>().len(), n, "unique");
    for bit in 0..32 {
        let ones = keys.iter().filter(|k| *k >> bit & 1 == 1).count();
        // Binomial(4096, 1/2): 6 standard deviations is 192.
        assert!(
            (1856..=2240).contains(&ones),
            "bit {bit} set in {ones} of {n} keys"
        );
    }
    // rxe's keys differ by 0x100 from one MR to the next: here the tags are spread.
    let close = keys
        .windows(2)
        .filter(|w| (w[1] >> 8).abs_diff(w[0] >> 8) < 1 << 16)
        .count();
    assert!(
        close < 64,
        "{close} consecutive keys with tags close together"
    );
    let tops: HashSet<u32> = keys.iter().map(|k| k >> 24).collect();
    assert!(tops.len() > 240, "top bytes: {}", tops.len());
    assert!(keys.iter().all(|k| k >> 8 != 0), "no key below 256");
}

#[test]
fn a_freed_key_names_nothing_even_when_its_handle_is_reused() {
    let mut sim = Sim::pair(2, LinkModel::default());
    let o = QpOptions::default();
    let (qa, _qb) = sim.connect(0, 1, &o);
    let all = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
    let (src, src_mr) = sim.alloc_mr(0, 64, all);
    let (old_dst, old) = sim.alloc_mr(1, 64, all);
    sim.dev(1).dereg_mr(old.handle).unwrap();
    // The MR that takes its place: rxe would give it the freed pool index, and the old key
    // would name it with probability 1/256.
    let (dst, new) = sim.alloc_mr(1, 64, all);
    let _ = old_dst;
    assert_eq!(new.handle, old.handle, "the handle is used again");
    assert_ne!(
        old.rkey.0 >> 8,
        new.rkey.0 >> 8,
        "a new tag, not the old index"
    );
    sim.write_mem(0, src, &[0xab; 64]);
    let write = |rkey| {
        SendWr::new(
            7,
            SendOp::Write(RemoteAddr { va: dst, rkey }),
            Some(Sge {
                addr: src,
                length: 64,
                lkey: src_mr.lkey,
            }),
        )
    };
    sim.post_send(0, qa, write(new.rkey)).unwrap();
    sim.run(1_000_000_000);
    assert_eq!(
        sim.read_mem(1, dst, 64),
        vec![0xab; 64],
        "the new key writes"
    );
    sim.write_mem(0, src, &[0xcd; 64]);
    sim.post_send(0, qa, write(old.rkey)).unwrap();
    sim.run(2_000_000_000);
    let last = sim.completions_of(0, qa).last().copied().unwrap();
    assert_eq!(
        last.status,
        WcStatus::RemAccessErr,
        "the old key is refused"
    );
    assert_eq!(
        sim.read_mem(1, dst, 64),
        vec![0xab; 64],
        "and writes nothing"
    );
}

#[test]
fn keys_differ_across_devices_seeded_alike_but_with_other_entropy() {
    let mut a = engine(3, [1; 32]);
    let mut b = engine(3, [2; 32]);
    let ka: Vec<u32> = {
        let pd = a.alloc_pd();
        let addr = a.memory_mut().alloc(64);
        (0..16)
            .map(|_| a.reg_mr(pd, addr, 64, Access::NONE).unwrap().lkey.0)
            .collect()
    };
    let kb: Vec<u32> = {
        let pd = b.alloc_pd();
        let addr = b.memory_mut().alloc(64);
        (0..16)
            .map(|_| b.reg_mr(pd, addr, 64, Access::NONE).unwrap().lkey.0)
            .collect()
    };
    assert!(ka.iter().all(|k| !kb.contains(k)));
}

#[test]
fn random_qpns_are_spread_over_the_range_and_unique() {
    let mut cfg = EngineConfig::new("10.0.0.1".parse().unwrap(), 4);
    cfg.key_entropy = [5; 32];
    cfg.random_qpns = true;
    let mut e = Engine::new(cfg, VecMemory::new());
    e.set_qpn_range(0x3_0000, 0x4_0000);
    let pd = e.alloc_pd();
    let cq = e.create_cq(16).unwrap();
    let init = QpInit {
        pd,
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap: QpCap::default(),
        sq_sig_all: false,
    };
    let qpns: Vec<u32> = (0..1000)
        .map(|_| e.create_qp(init).unwrap().value())
        .collect();
    assert_eq!(qpns.iter().collect::<HashSet<_>>().len(), 1000);
    assert!(qpns.iter().all(|q| (0x3_0000..0x4_0000).contains(q)));
    let sequential = qpns.windows(2).filter(|w| w[1] == w[0] + 1).count();
    assert!(sequential < 5, "{sequential} QPNs follow their predecessor");
    // A small range fills up completely, then refuses.
    let mut small = Engine::new(
        EngineConfig {
            random_qpns: true,
            ..EngineConfig::new("10.0.0.1".parse().unwrap(), 5)
        },
        VecMemory::new(),
    );
    small.set_qpn_range(0x100, 0x140);
    let pd = small.alloc_pd();
    let cq = small.create_cq(16).unwrap();
    let init = QpInit {
        pd,
        send_cq: cq,
        recv_cq: cq,
        ..init
    };
    let got: HashSet<u32> = (0..0x40)
        .map(|_| small.create_qp(init).unwrap().value())
        .collect();
    assert_eq!(got, (0x100..0x140).collect());
    assert!(small.create_qp(init).is_err());
}

/// Issue 17: MR handles come from a slab, so a process that registers and deregisters in a loop
/// never runs out (rxe's limit is 2^19 live MRs, not 2^19 in a life), and every key drawn is
/// new although the handles are used again at once (the test above proves the old key of a
/// reused handle is refused on the wire).
#[test]
fn a_register_deregister_loop_past_two_to_the_nineteen_reuses_handles_with_fresh_keys() {
    let mut e = engine(11, [3; 32]);
    let pd = e.alloc_pd();
    let addr = e.memory_mut().alloc(4096);
    let held = e.reg_mr(pd, addr, 4096, Access::LOCAL_WRITE).unwrap();
    let mut keys = HashSet::from([held.lkey.0]);
    let mut handles = HashSet::new();
    let mut repeated = 0;
    for i in 0..(1u32 << 19) + 1000 {
        let mr = e
            .reg_mr(pd, addr, 64, Access::LOCAL_WRITE)
            .unwrap_or_else(|err| panic!("registration {i}: {err}"));
        handles.insert(mr.handle);
        repeated += usize::from(!keys.insert(mr.lkey.0));
        e.dereg_mr(mr.handle).unwrap();
    }
    assert_eq!(handles.len(), 1, "the freed handle is used again");
    assert!(!handles.contains(&held.handle));
    // 2^19 draws of 32-bit keys whose tag is new among the live ones: a repeat of a dead key
    // needs its tag and its low byte to come up again (about 2^19 * 2^19 / 2^32 = 64 times).
    assert!(repeated < 200, "{repeated} keys repeated");
    assert!(e.dereg_mr(held.handle).is_ok());
    assert!(e.dereg_mr(held.handle).is_err(), "freed once");
}

/// `ibv_rereg_mr`: each change alone moves the MR (PD counted on the new one, range, access),
/// the keys stay, and a change the access rules forbid leaves it as it was.
#[test]
fn a_reregistration_moves_the_mr_and_keeps_its_keys() {
    let mut e = engine(12, [4; 32]);
    let (pd, pd2) = (e.alloc_pd(), e.alloc_pd());
    let addr = e.memory_mut().alloc(8192);
    let mr = e.reg_mr(pd, addr, 4096, Access::LOCAL_WRITE).unwrap();
    e.rereg_mr(mr.handle, Some(pd2), None, None).unwrap();
    assert!(e.dealloc_pd(pd).is_ok(), "the old PD is free");
    assert!(e.dealloc_pd(pd2).is_err(), "the new PD holds the MR");
    e.rereg_mr(mr.handle, None, Some((addr + 4096, 4096)), None)
        .unwrap();
    let remote = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);
    e.rereg_mr(mr.handle, None, None, Some(remote)).unwrap();
    let (p, keys, a, len, access) = e.mr_info(mr.handle).unwrap();
    assert_eq!((p, a, len, access), (pd2, addr + 4096, 4096, remote));
    assert_eq!((keys.lkey, keys.rkey), (mr.lkey, mr.rkey), "the keys stay");
    assert!(
        e.rereg_mr(mr.handle, None, None, Some(Access::REMOTE_WRITE))
            .is_err(),
        "remote write without local write"
    );
    assert!(
        e.rereg_mr(mr.handle, Some(pd), None, None).is_err(),
        "a freed PD"
    );
    assert_eq!(
        e.mr_info(mr.handle).unwrap().4,
        remote,
        "unchanged by the refusals"
    );
    assert!(
        e.rereg_mr(mr.handle + 1, None, None, None).is_err(),
        "no such MR"
    );
}
