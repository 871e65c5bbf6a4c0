//! The engine's entry points for a daemon's fast path:
//! - `Engine::handle_verified_packet`: a packet whose ICRC the caller already checked is taken
//!   without computing the ICRC again (so even a wrong ICRC passes), while its headers are
//!   still checked; `handle_packet` keeps refusing the same bytes;
//! - `Engine::set_seal_icrc(false)`: frames without the ICRC, for a caller that seals them;
//!   `Engine::set_seal_only_to`: sealed only toward the listed destinations;
//! - `Engine::sq_room`: whether `post_send` would take one more request.

use proto::sim::{LinkModel, QpOptions, Sim};
use proto::transport::*;
use proto::types::Qpn;

fn setup(data: &[u8]) -> (Sim, Qpn, u64, Vec<Vec<u8>>) {
    setup_with(data, true, None)
}

/// Node 0 (sealing the ICRC or not; with `only_to`, sealing only packets to that node's
/// addresses) sends `data` on an RC QP; returns node 1's QP, its receive buffer and the
/// frames node 0 emitted.
fn setup_with(data: &[u8], seal: bool, only_to: Option<usize>) -> (Sim, Qpn, u64, Vec<Vec<u8>>) {
    let mut sim = Sim::pair(7, LinkModel::default());
    sim.dev(0).set_seal_icrc(seal);
    if let Some(node) = only_to {
        let gids = sim.dev(node).gids().to_vec();
        sim.dev(0).set_seal_only_to(Some(&gids));
    }
    let o = QpOptions {
        mtu: Mtu::Mtu1024,
        ..Default::default()
    };
    let (qa, qb) = sim.connect(0, 1, &o);
    let acc = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
    let (a, ka) = sim.alloc_mr(0, 8192, acc);
    let (b, kb) = sim.alloc_mr(1, 8192, acc);
    sim.write_mem(0, a, data);
    let sg = Sge {
        addr: b,
        length: 8192,
        lkey: kb.lkey,
    };
    sim.dev(1)
        .post_recv(
            qb,
            RecvWr {
                wr_id: 9,
                sg_list: vec![sg],
            },
        )
        .unwrap();
    let sg = Some(Sge {
        addr: a,
        length: data.len() as u32,
        lkey: ka.lkey,
    });
    sim.dev(0)
        .post_send(qa, SendWr::new(1, SendOp::Send, sg))
        .unwrap();
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    let mut frames = Vec::new();
    while let Some(t) = sim.dev(0).poll_transmit(0, &mut buf) {
        frames.push(buf[..t.len].to_vec());
    }
    (sim, qb, b, frames)
}

#[test]
fn a_verified_packet_skips_the_icrc_but_not_the_headers() {
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 13) as u8).collect();
    let (mut sim, _qb, b, frames) = setup(&data);
    assert_eq!(frames.len(), 3, "3000 bytes at MTU 1024");
    let cq = sim.nodes[1].cq;
    let mut spoiled: Vec<Vec<u8>> = frames.clone();
    for f in &mut spoiled {
        let n = f.len();
        f[n - 1] ^= 0xff; // a wrong ICRC
    }
    // The full check refuses every one of them.
    for f in &spoiled {
        sim.dev(1).handle_packet(10, f);
    }
    assert_eq!(sim.dev(1).counters().icrc_errors, 3);
    assert!(sim.dev(1).poll_cq(cq).is_none());
    // Broken headers are still refused by the verified path, without a panic.
    let mut bad_len = spoiled[0].clone();
    bad_len[3] ^= 0x40; // IPv4 total length
    for junk in [&bad_len[..], &spoiled[0][..3], &[][..]] {
        sim.dev(1).handle_verified_packet(10, junk);
    }
    assert_eq!(sim.dev(1).counters().dropped_pkts, 3);
    assert!(sim.dev(1).poll_cq(cq).is_none());
    // The caller vouches for the ICRC: the message is received, byte for byte.
    for f in &spoiled {
        sim.dev(1).handle_verified_packet(10, f);
    }
    let wc = sim.dev(1).poll_cq(cq).expect("receive completion");
    assert_eq!(wc.wr_id, 9);
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(wc.byte_len, 3000);
    assert_eq!(sim.read_mem(1, b, 3000), data);
    assert_eq!(sim.dev(1).counters().icrc_errors, 3);
}

/// With `seal_icrc` off the engine leaves the ICRC to its caller: the frames are the same
/// but for those 4 bytes, and the receiver takes them through `handle_verified_packet`.
#[test]
fn unsealed_frames_differ_only_in_the_icrc() {
    let data: Vec<u8> = (0..2500u32).map(|i| (i * 7) as u8).collect();
    let (_, _, _, sealed) = setup_with(&data, true, None);
    let (mut sim, _, b, unsealed) = setup_with(&data, false, None);
    assert_eq!(sealed.len(), unsealed.len());
    for (s, u) in sealed.iter().zip(&unsealed) {
        let n = s.len();
        assert_eq!(n, u.len());
        assert_eq!(&s[..n - 4], &u[..n - 4]);
        assert_ne!(&s[n - 4..], &u[n - 4..], "the ICRC was not computed");
    }
    let cq = sim.nodes[1].cq;
    for f in &unsealed {
        sim.dev(1).handle_verified_packet(10, f);
    }
    assert_eq!(
        sim.dev(1).poll_cq(cq).map(|w| w.status),
        Some(WcStatus::Success)
    );
    assert_eq!(sim.read_mem(1, b, 2500), data);
}

/// Sealing only toward listed destinations (a daemon's own addresses, while a capture takes
/// its local packets): packets to another address are left as without sealing, those to a
/// listed one are sealed as always.
#[test]
fn only_packets_to_the_listed_destinations_are_sealed() {
    let data: Vec<u8> = (0..2500u32).map(|i| (i * 5) as u8).collect();
    let (_, _, _, sealed) = setup_with(&data, true, None);
    let (_, _, _, unsealed) = setup_with(&data, false, None);
    let (_, _, _, to_self) = setup_with(&data, true, Some(0));
    let (_, _, _, to_peer) = setup_with(&data, true, Some(1));
    assert_eq!(sealed.len(), 3);
    assert_eq!(to_self, unsealed, "node 1 is not listed: nothing sealed");
    assert_eq!(to_peer, sealed, "node 1 is listed: every packet sealed");
}

/// `sq_room` counts down to the point where `post_send` refuses a request as "SQ full".
#[test]
fn sq_room_says_when_post_send_would_refuse() {
    let mut sim = Sim::pair(3, LinkModel::default());
    let (qa, _) = sim.connect(0, 1, &QpOptions::default());
    let acc = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
    let (a, ka) = sim.alloc_mr(0, 4096, acc);
    let room = sim.dev(0).sq_room(qa).unwrap();
    assert!(room > 0);
    let sg = || {
        Some(Sge {
            addr: a,
            length: 8,
            lkey: ka.lkey,
        })
    };
    for i in 0..room {
        assert_eq!(sim.dev(0).sq_room(qa), Some(room - i));
        sim.dev(0)
            .post_send(qa, SendWr::new(i as u64, SendOp::Send, sg()))
            .unwrap();
    }
    assert_eq!(sim.dev(0).sq_room(qa), Some(0));
    assert!(matches!(
        sim.dev(0)
            .post_send(qa, SendWr::new(99, SendOp::Send, sg())),
        Err(VerbsError::NoResources(_))
    ));
    assert_eq!(sim.dev(0).sq_room(Qpn::new(0xabcd)), None);
}
