//! The UDP transport over loopback: many packets each way on IPv4 and IPv6, bytes compared
//! and ICRC verified, on the io_uring and the syscall drivers, with and without GSO/GRO.

mod net_util;

use net_util::*;
use softroce_daemon::net::{
    Backend, BackendChoice, NetConfig, NetError, RxDatagram, TxMeta, UdpTransport,
};
use std::collections::BTreeMap;
use std::net::{IpAddr, UdpSocket};
use std::time::Duration;

/// Sends `count` packets of assorted sizes from `a` to `b` over `family`, in bursts, and
/// checks that every one arrives intact with its ICRC verified.
fn exchange(a: &mut UdpTransport, b: &mut UdpTransport, family: IpAddr, count: u32) {
    let src = local(a, family);
    let dst = local(b, family);
    let pb = builder(src, dst);
    let mut sent = BTreeMap::new();
    let before = b.counters();
    let mut psn = 0;
    while psn < count {
        let burst = (count - psn).min(48);
        for _ in 0..burst {
            let len = [0usize, 1, 5, 256, 1024, 4096][psn as usize % 6];
            let pkt = build(&pb, 0, psn, len, false);
            a.send(&TxMeta::to(dst), &pkt).unwrap();
            sent.insert(psn, pkt);
            psn += 1;
        }
        a.flush().unwrap();
        let got = recv_n(b, burst as usize);
        assert_eq!(got.len(), burst as usize, "lost packets over {family}");
        for g in got {
            assert_eq!(g.src, src);
            assert_eq!(g.dst, dst);
            assert_eq!(g.tos, 0);
            let want = sent
                .remove(&psn_of(&g.bytes))
                .expect("unknown or duplicate PSN");
            assert_eq!(g.bytes, want);
            assert_eq!(g.ident, family.is_ipv4().then_some(0));
        }
        // Reap send completions so the slots come back.
        a.poll(Some(Duration::ZERO), &mut |_: &mut RxDatagram<'_>| {})
            .unwrap();
    }
    assert!(sent.is_empty());
    let c = b.counters();
    assert_eq!(c.rx_packets - before.rx_packets, count as u64);
    assert_eq!(c.rx_bad_icrc, before.rx_bad_icrc);
    assert_eq!(c.rx_ident_recovered, before.rx_ident_recovered);
}

fn drain_tx(t: &mut UdpTransport) {
    for _ in 0..100 {
        if t.tx_in_flight() == 0 {
            break;
        }
        t.poll(
            Some(Duration::from_millis(10)),
            &mut |_: &mut RxDatagram<'_>| {},
        )
        .unwrap();
    }
    assert_eq!(t.tx_in_flight(), 0);
}

fn both_ways(backend: BackendChoice) {
    let mut a = UdpTransport::open(&NetConfig { backend, ..cfg() }).unwrap();
    let mut b = UdpTransport::open(&NetConfig { backend, ..cfg() }).unwrap();
    for family in [IpAddr::V4(LO4), IpAddr::V6(LO6)] {
        exchange(&mut a, &mut b, family, 1000);
        exchange(&mut b, &mut a, family, 300);
    }
    drain_tx(&mut a);
    drain_tx(&mut b);
    assert_eq!(a.counters().tx_packets, 2000);
    assert_eq!(b.counters().tx_packets, 600);
    assert_eq!(a.counters().tx_errors + b.counters().tx_errors, 0);
}

#[test]
fn io_uring_many_packets_v4_and_v6() {
    let t = UdpTransport::open(&cfg()).unwrap();
    assert_eq!(
        t.backend(),
        Backend::IoUring,
        "io_uring expected on this host: {:?}",
        t.fallback_reason()
    );
    drop(t);
    both_ways(BackendChoice::IoUring);
}

#[test]
fn syscall_driver_many_packets_v4_and_v6() {
    both_ways(BackendChoice::Syscalls);
}

#[test]
fn syscall_driver_one_packet_per_call() {
    let cfg1 = || NetConfig {
        backend: BackendChoice::Syscalls,
        syscall_batch: 1,
        ..cfg()
    };
    let mut a = UdpTransport::open(&cfg1()).unwrap();
    let mut b = UdpTransport::open(&cfg1()).unwrap();
    exchange(&mut a, &mut b, IpAddr::V4(LO4), 100);
    exchange(&mut a, &mut b, IpAddr::V6(LO6), 100);
}

/// Bad ICRCs and non-RoCE datagrams are counted and dropped; good ones still pass.
#[test]
fn corrupted_and_malformed_datagrams_are_dropped_and_counted() {
    for backend in [BackendChoice::IoUring, BackendChoice::Syscalls] {
        let mut b = UdpTransport::open(&NetConfig { backend, ..cfg() }).unwrap();
        for (bind, family) in [
            ("127.0.0.1:0", IpAddr::V4(LO4)),
            ("[::1]:0", IpAddr::V6(LO6)),
        ] {
            let plain = UdpSocket::bind(bind).unwrap();
            let dst = local(&b, family);
            let pb = builder(plain.local_addr().unwrap(), dst);
            let before = b.counters();
            let good = build(&pb, 0, 7, 100, false);
            for flip in [0usize, 13, 50, good.len() - 1] {
                let mut bad = good.clone();
                bad[flip] ^= 0x40;
                plain.send_to(&bad, dst).unwrap();
            }
            plain.send_to(&[0xffu8; 3], dst).unwrap(); // too short for a BTH
            plain.send_to(&good, dst).unwrap();
            let got = recv_n(&mut b, 1);
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].bytes, good);
            assert_eq!(settle(&mut b), 0);
            let c = b.counters();
            // Byte 0 (opcode 0x04 -> 0x44) makes an unknown opcode: malformed, not bad ICRC.
            assert_eq!(
                c.rx_bad_icrc - before.rx_bad_icrc,
                3,
                "{family} {backend:?}"
            );
            assert_eq!(
                c.rx_malformed - before.rx_malformed,
                2,
                "{family} {backend:?}"
            );
            assert_eq!(c.rx_packets - before.rx_packets, 1);
        }
    }
}

/// The TOS/traffic class byte (ECN included) travels and is reported on receive.
#[test]
fn tos_and_ecn_marks_are_reported() {
    let mut a = UdpTransport::open(&cfg()).unwrap();
    let mut b = UdpTransport::open(&cfg()).unwrap();
    for family in [IpAddr::V4(LO4), IpAddr::V6(LO6)] {
        let dst = local(&b, family);
        let pb = builder(local(&a, family), dst);
        for (psn, tos) in [(1u32, 0x03u8), (2, 0x02), (3, 0xc1)] {
            let meta = TxMeta {
                tos,
                ttl: Some(7),
                ..TxMeta::to(dst)
            };
            a.send(&meta, &build(&pb, 0, psn, 64, false)).unwrap();
            a.flush().unwrap();
            let got = recv_n(&mut b, 1);
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].tos, tos, "{family}");
            assert_eq!(psn_of(&got[0].bytes), psn);
        }
    }
}

/// GSO sends of full RoCE packets, received with and without GRO. On IPv4 segment k
/// carries Identification k, so it is built with ident k and verified by ident recovery.
#[test]
fn gso_segments_arrive_verified_with_and_without_gro() {
    for gro in [false, true] {
        for backend in [BackendChoice::IoUring, BackendChoice::Syscalls] {
            let mut a = UdpTransport::open(&NetConfig {
                gso: true,
                backend,
                ..cfg()
            })
            .unwrap();
            let mut b = UdpTransport::open(&NetConfig {
                gro,
                backend,
                ..cfg()
            })
            .unwrap();
            for family in [IpAddr::V4(LO4), IpAddr::V6(LO6)] {
                let dst = local(&b, family);
                let pb = builder(local(&a, family), dst);
                let before = b.counters();
                let mut sent = BTreeMap::new();
                let mut psn = 0u32;
                for batch in 0..20u32 {
                    // 1..=40 full 1024-byte SEND_MIDDLEs, then a shorter SEND_ONLY.
                    let full = 1 + (batch * 7) % 40;
                    let mut agg = Vec::new();
                    for k in 0..=full {
                        let len = if k == full { 100 } else { 1024 };
                        let pkt = build(&pb, k as u16, psn, len, k != full);
                        agg.extend_from_slice(&pkt);
                        sent.insert(psn, pkt);
                        psn += 1;
                    }
                    let meta = TxMeta {
                        segment_size: Some(1040),
                        ..TxMeta::to(dst)
                    };
                    a.send(&meta, &agg).unwrap();
                    a.flush().unwrap();
                    let got = recv_n(&mut b, full as usize + 1);
                    assert_eq!(got.len(), full as usize + 1, "gro={gro} {family}");
                    for g in got {
                        let want = sent.remove(&psn_of(&g.bytes)).unwrap();
                        assert_eq!(g.bytes, want);
                        // Every segment, the first of an aggregate included, comes with
                        // room for IPv6 and UDP headers in front: the link rebuilds them
                        // there, without a copy.
                        assert!(g.room >= 48, "{backend:?} gro={gro}: room {}", g.room);
                    }
                    a.poll(Some(Duration::ZERO), &mut |_: &mut RxDatagram<'_>| {})
                        .unwrap();
                }
                let c = b.counters();
                assert_eq!(c.rx_bad_icrc, before.rx_bad_icrc);
                // On loopback the GSO datagram reaches a GRO socket whole.
                assert_eq!(c.rx_gro_batches > before.rx_gro_batches, gro, "{family}");
                let recovered = c.rx_ident_recovered - before.rx_ident_recovered;
                if family.is_ipv4() {
                    // Every segment but the first of each send needed its Identification.
                    let segments_after_first: u64 = (0..20u64).map(|b| 1 + (b * 7) % 40).sum();
                    assert_eq!(recovered, segments_after_first, "gro={gro}");
                } else {
                    assert_eq!(recovered, 0);
                }
            }
            drain_tx(&mut a);
            assert_eq!(a.counters().tx_errors, 0);
        }
    }
}

#[test]
fn send_errors_are_reported_not_panicked() {
    let mut a = UdpTransport::open(&NetConfig {
        ipv6: None,
        ..cfg()
    })
    .unwrap();
    let v6 = "[::1]:9".parse().unwrap();
    assert!(matches!(
        a.send(&TxMeta::to(v6), &[0u8; 16]),
        Err(NetError::NoSocket(_))
    ));
    let v4 = local(&a, IpAddr::V4(LO4));
    let huge = vec![0u8; a.max_send_len() + 1];
    assert!(matches!(
        a.send(&TxMeta::to(v4), &huge),
        Err(NetError::TooLong { .. })
    ));
    let gso = TxMeta {
        segment_size: Some(1000),
        ..TxMeta::to(v4)
    };
    assert!(matches!(a.send(&gso, &[0u8; 3000]), Err(NetError::Gso(_))));
    assert!(UdpTransport::open(&NetConfig {
        ipv4: None,
        ipv6: None,
        ..cfg()
    })
    .is_err());
    // A failed send releases its slot.
    assert_eq!(a.tx_in_flight(), 0);
}

/// The convenience senders build straight into the send slots: one packet, and a GSO run.
#[test]
fn send_packet_and_send_gso_build_in_place() {
    let mut a = UdpTransport::open(&NetConfig { gso: true, ..cfg() }).unwrap();
    let mut b = UdpTransport::open(&cfg()).unwrap();
    for family in [IpAddr::V4(LO4), IpAddr::V6(LO6)] {
        let dst = local(&b, family);
        let pb = builder(local(&a, family), dst);
        let before = b.counters();
        let r = repr(proto::wire::Opcode::RC_SEND_ONLY, 9, 33);
        a.send_packet(&TxMeta::to(dst), &pb, &r, &payload(9, 33))
            .unwrap();
        let payloads: Vec<Vec<u8>> = (10..20).map(|p| payload(p, 512)).collect();
        let mut run: Vec<_> = (10..20u32)
            .map(|p| {
                let op = if p == 19 { 0x02 } else { 0x01 }; // SEND_MIDDLE..., SEND_LAST
                (
                    repr(proto::wire::Opcode(op), p, 512),
                    &payloads[(p - 10) as usize][..],
                )
            })
            .collect();
        a.send_gso(&TxMeta::to(dst), &pb, &run).unwrap();
        a.flush().unwrap();
        let got = recv_n(&mut b, 11);
        assert_eq!(got.len(), 11);
        assert_eq!(got[0].bytes, build(&pb, 0, 9, 33, false));
        for (k, g) in got[1..].iter().enumerate() {
            assert_eq!(psn_of(&g.bytes), 10 + k as u32);
            assert_eq!(&g.bytes[12..12 + 512], &payloads[k][..]);
            if family.is_ipv4() {
                assert_eq!(
                    g.ident,
                    Some(k as u16),
                    "segment k carries Identification k"
                );
            }
        }
        assert_eq!(b.counters().rx_bad_icrc, before.rx_bad_icrc);
        // A run whose middle packet differs in length is refused before anything is sent.
        run[3].0.payload_len = 100;
        let short = payload(13, 100);
        run[3].1 = &short;
        assert!(matches!(
            a.send_gso(&TxMeta::to(dst), &pb, &run),
            Err(NetError::Gso(_))
        ));
        // A repr that does not match its payload is a wire error, not a panic.
        let bad = repr(proto::wire::Opcode::RC_SEND_ONLY, 1, 40);
        assert!(matches!(
            a.send_packet(&TxMeta::to(dst), &pb, &bad, &[0u8; 39]),
            Err(NetError::Wire(_))
        ));
    }
    // Refused sends gave their slots back; the rest complete.
    drain_tx(&mut a);
    assert_eq!(a.counters().tx_packets, 22);
}

/// Sockets bound to the wildcard address: the receiver learns the destination address from
/// IP_PKTINFO / IPV6_PKTINFO (the ICRC covers it), and the sender picks its source address
/// per packet with the same control messages (the ICRC covers that too).
#[test]
fn wildcard_sockets_use_packet_info_both_ways() {
    let wild = || NetConfig {
        ipv4: Some(std::net::Ipv4Addr::UNSPECIFIED),
        ipv6: Some(std::net::Ipv6Addr::UNSPECIFIED),
        ..cfg()
    };
    for backend in [BackendChoice::IoUring, BackendChoice::Syscalls] {
        let mut a = UdpTransport::open(&NetConfig { backend, ..wild() }).unwrap();
        let mut b = UdpTransport::open(&NetConfig { backend, ..wild() }).unwrap();
        for (src_ip, dst_ip) in [
            (
                "127.0.0.2".parse::<IpAddr>().unwrap(),
                "127.0.0.3".parse().unwrap(),
            ),
            (IpAddr::V6(LO6), IpAddr::V6(LO6)),
        ] {
            let src = std::net::SocketAddr::new(src_ip, local(&a, src_ip).port());
            let dst = std::net::SocketAddr::new(dst_ip, local(&b, dst_ip).port());
            let pb = builder(src, dst);
            let meta = TxMeta {
                src: Some(src_ip),
                ..TxMeta::to(dst)
            };
            let pkt = build(&pb, 0, 77, 300, false);
            a.send(&meta, &pkt).unwrap();
            a.flush().unwrap();
            let got = recv_n(&mut b, 1);
            assert_eq!(got.len(), 1, "{backend:?} {src_ip}");
            assert_eq!(got[0].src, src);
            assert_eq!(got[0].dst, dst);
            assert_eq!(got[0].bytes, pkt);
        }
        assert_eq!(b.counters().rx_bad_icrc, 0);
    }
}

/// A blocking poll returns when the wake descriptor (the daemon's doorbell) is written, on
/// both drivers, well before its timeout.
#[test]
fn a_write_to_the_wake_fd_ends_a_blocking_poll() {
    use nix::sys::eventfd::{EfdFlags, EventFd};
    use std::os::fd::AsRawFd;
    for backend in [BackendChoice::IoUring, BackendChoice::Syscalls] {
        let mut t = UdpTransport::open(&NetConfig { backend, ..cfg() }).unwrap();
        let efd = EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .unwrap();
        t.set_wake_fd(efd.as_raw_fd());
        // Nothing pending: a short poll times out.
        let start = std::time::Instant::now();
        t.poll(
            Some(Duration::from_millis(50)),
            &mut |_: &mut RxDatagram<'_>| {},
        )
        .unwrap();
        assert!(
            start.elapsed() >= Duration::from_millis(40),
            "{backend:?} returned early"
        );
        for round in 0..3 {
            let writer = {
                let fd = efd.as_raw_fd();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(30));
                    // SAFETY: fd stays open until the thread is joined below.
                    let one = 1u64.to_ne_bytes();
                    unsafe { libc::write(fd, one.as_ptr().cast(), 8) };
                })
            };
            let start = std::time::Instant::now();
            while start.elapsed() < Duration::from_secs(5) {
                t.poll(Some(Duration::from_secs(10)), &mut |_: &mut RxDatagram<
                    '_,
                >| {})
                    .unwrap();
                if efd.read().is_ok() {
                    break;
                }
            }
            writer.join().unwrap();
            assert!(
                start.elapsed() < Duration::from_secs(2),
                "{backend:?} round {round}: the wake fd did not end the poll"
            );
        }
    }
}

/// `push_packet` coalesces a run of equal packets of one flow into one GSO send, and starts a
/// new send when the length grows, the IP fields change or a shorter packet ended the run.
/// Segment k of a send is sealed for IPv4 Identification k: the receiver (with and without
/// GRO) verifies every packet, and on IPv4 recovers exactly that Identification, which shows
/// both where the kernel split the sends and which IDs it wrote.
#[test]
fn push_packet_coalesces_equal_packets_into_gso_sends() {
    for gro in [true, false] {
        let mut a = UdpTransport::open(&NetConfig { gso: true, ..cfg() }).unwrap();
        let mut b = UdpTransport::open(&NetConfig { gro, ..cfg() }).unwrap();
        for family in [IpAddr::V4(LO4), IpAddr::V6(LO6)] {
            let dst = local(&b, family);
            let pb = builder(local(&a, family), dst);
            let before = (a.counters(), b.counters());
            // (payload length, TOS, expected segment index k within its GSO send)
            let mut plan: Vec<(usize, u8, u16)> = Vec::new();
            plan.extend((0..20).map(|k| (1024, 0, k))); // one send of 21: 20 full ...
            plan.push((100, 0, 20)); // ... and a shorter last segment, which ends it
            plan.extend((0..5).map(|k| (1024, 0, k))); // a new send of 5
            plan.push((2048, 0, 0)); // longer: alone (and it would start a send)
            plan.push((1024, 4, 0)); // another TOS: alone
            plan.extend((0..3).map(|k| (1024, 0, k))); // a send of 3
            let mut expected = BTreeMap::new();
            for (psn, &(len, tos, k)) in plan.iter().enumerate() {
                let psn = psn as u32;
                // The engine's frame carries some ICRC; push_packet reseals it.
                let unsealed = build(&pb, 0x7777, psn, len, true);
                let meta = TxMeta {
                    tos,
                    ..TxMeta::to(dst)
                };
                a.push_packet(&meta, &pb, &unsealed).unwrap();
                expected.insert(psn, (build(&pb, k, psn, len, true), tos, k));
            }
            a.flush().unwrap();
            let got = recv_n(&mut b, plan.len());
            assert_eq!(got.len(), plan.len(), "gro={gro} {family}");
            for g in got {
                let (want, tos, k) = expected.remove(&psn_of(&g.bytes)).unwrap();
                assert_eq!(g.tos, tos);
                // IPv6 has no Identification: the ICRC is the same for every k there.
                assert_eq!(g.bytes, want, "sealed for Identification {k}");
                if family.is_ipv4() {
                    assert_eq!(g.ident, Some(k), "segment {k} of its send");
                }
            }
            drain_tx(&mut a);
            let (ca, cb) = (a.counters(), b.counters());
            assert_eq!(cb.rx_bad_icrc, before.1.rx_bad_icrc);
            assert_eq!(
                ca.tx_gso_sends - before.0.tx_gso_sends,
                3,
                "21 + 5 + 3 segments"
            );
            assert_eq!(ca.tx_packets - before.0.tx_packets, plan.len() as u64);
            if gro {
                assert!(cb.rx_gro_batches > before.1.rx_gro_batches);
            }
        }
        drain_tx(&mut a);
        assert_eq!(a.counters().tx_errors, 0);
    }
}

/// Without GSO, `push_packet` sends every packet alone, sealed for Identification 0.
#[test]
fn push_packet_without_gso_sends_each_packet_alone() {
    let mut a = UdpTransport::open(&cfg()).unwrap();
    let mut b = UdpTransport::open(&cfg()).unwrap();
    let dst = local(&b, IpAddr::V4(LO4));
    let pb = builder(local(&a, IpAddr::V4(LO4)), dst);
    for psn in 0..6u32 {
        let unsealed = build(&pb, 9, psn, 1024, true);
        a.push_packet(&TxMeta::to(dst), &pb, &unsealed).unwrap();
    }
    a.flush().unwrap();
    let got = recv_n(&mut b, 6);
    assert_eq!(got.len(), 6);
    for g in got {
        assert_eq!(g.ident, Some(0));
        assert_eq!(g.bytes, build(&pb, 0, psn_of(&g.bytes), 1024, true));
    }
    assert_eq!(a.counters().tx_gso_sends, 0);
    drain_tx(&mut a);
    assert_eq!(a.counters().tx_packets, 6);
}

/// The voluntary context switches of the calling thread so far.
fn voluntary_switches() -> u64 {
    std::fs::read_to_string("/proc/thread-self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("voluntary_ctxt_switches in /proc/thread-self/status")
}

/// The thread that opens a transport (the daemon's main or control thread) is not the one
/// that polls it (the device thread), and it must not do the receiving: io_uring runs a
/// multishot receive's work as task work of the thread that submitted it, which is woken for
/// every batch of datagrams if that thread armed it. Here the opening thread blocks while
/// another polls 2,000 datagrams sent in 200 bursts; it is woken only to be told the others
/// are done.
#[test]
fn the_thread_that_polls_does_the_receiving_not_the_one_that_opened() {
    let mut rx = UdpTransport::open(&NetConfig {
        backend: BackendChoice::IoUring,
        ..cfg()
    })
    .unwrap();
    let mut tx = UdpTransport::open(&NetConfig {
        backend: BackendChoice::IoUring,
        ..cfg()
    })
    .unwrap();
    assert_eq!(rx.backend(), Backend::IoUring);
    let (src, dst) = (local(&tx, IpAddr::V4(LO4)), local(&rx, IpAddr::V4(LO4)));
    let (bursts, per_burst) = (200u32, 10u32);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let poller = std::thread::spawn(move || {
        // The first poll arms the receives, on this thread.
        rx.poll(Some(Duration::ZERO), &mut |_: &mut RxDatagram<'_>| {})
            .unwrap();
        ready_tx.send(()).unwrap();
        let got = recv_n(&mut rx, (bursts * per_burst) as usize).len();
        (got, rx.counters().rx_packets)
    });
    let sender = std::thread::spawn(move || {
        ready_rx.recv().unwrap();
        let pb = builder(src, dst);
        for b in 0..bursts {
            for i in 0..per_burst {
                let pkt = build(&pb, 0, b * per_burst + i, 256, false);
                tx.send(&TxMeta::to(dst), &pkt).unwrap();
            }
            tx.flush().unwrap();
            // A gap, so that each burst wakes the receive again.
            std::thread::sleep(Duration::from_micros(300));
            tx.poll(Some(Duration::ZERO), &mut |_: &mut RxDatagram<'_>| {})
                .unwrap();
        }
    });
    let before = voluntary_switches();
    sender.join().unwrap();
    let (got, counted) = poller.join().unwrap();
    let woken = voluntary_switches() - before;
    assert_eq!(got as u32, bursts * per_burst);
    assert_eq!(counted, u64::from(bursts * per_burst));
    // Two joins block at most twice each; a receive armed by this thread woke it about once
    // per burst (200 times).
    assert!(
        woken <= 8,
        "the opening thread was woken {woken} times while others sent and received"
    );
}
