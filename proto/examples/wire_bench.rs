//! Throughput of the wire layer alone, beside its baselines on the same bytes and machine:
//! `cargo run --release -p softroce-proto --example wire_bench`.
//!
//! Prints Markdown rows: ICRC computation over whole 4 KiB RoCE v2 packets (IPv4 and IPv6),
//! ICRC verification of received packets including IPv4 Identification recovery, full
//! parse+verify, and the baselines crc32fast alone and memcpy.

use proto::wire::*;
use proto::{Psn, Qpn};
use std::hint::black_box;
use std::time::{Duration, Instant};

const ROUNDS: usize = 200_000;

fn frame(payload_len: usize, v6: bool) -> (FrameRepr, Vec<u8>) {
    let bth = BthRepr {
        opcode: Opcode::RC_RDMA_WRITE_MIDDLE,
        solicited: false,
        mig_req: false,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qpn: Qpn::new(0x11),
        ack_req: false,
        psn: Psn::new(7),
    };
    let mut t = TransportRepr::new(bth);
    t.payload_len = payload_len;
    let net = if v6 {
        NetRepr::Ipv6(Ipv6Repr {
            src: "::1".parse().unwrap(),
            dst: "::1".parse().unwrap(),
            traffic_class: 0,
            flow_label: 0,
            next_header: 17,
            hop_limit: 64,
            payload_len: 0,
        })
    } else {
        NetRepr::Ipv4(Ipv4Repr {
            src: [127, 0, 0, 1].into(),
            dst: [127, 0, 0, 1].into(),
            tos: 0,
            ident: 0x1234,
            dont_frag: true,
            ttl: 64,
            protocol: 17,
            payload_len: 0,
        })
    };
    let mut f = FrameRepr {
        link: LinkRepr::None,
        net,
        udp: Some(UdpRepr {
            src_port: 0xc000,
            dst_port: ROCE_V2_PORT,
            checksum: 0,
            payload_len: 0,
        }),
        transport: t,
    };
    f.fill_lengths();
    let payload: Vec<u8> = (0..payload_len).map(|i| i as u8).collect();
    let mut buf = vec![0u8; f.buffer_len()];
    f.emit(&mut buf, &payload).unwrap();
    (f, buf)
}

fn measure(name: &str, bytes_per_op: usize, mut op: impl FnMut()) -> f64 {
    for _ in 0..1000 {
        op();
    }
    let start = Instant::now();
    let mut n = 0;
    while n < ROUNDS || start.elapsed() < Duration::from_millis(300) {
        op();
        n += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    let gbs = (n * bytes_per_op) as f64 / secs / 1e9;
    println!(
        "| {name} | {bytes_per_op} | {:.2} | {:.2} |",
        gbs,
        n as f64 / secs / 1e6
    );
    gbs
}

fn main() {
    println!("| operation | bytes per op | GB/s | Mops/s |");
    println!("|---|---|---|---|");
    let (_, pkt4) = frame(4096, false);
    let (_, pkt6) = frame(4096, true);
    let covered = pkt4.len() - 28 - ICRC_LEN;
    let crc_only = measure(
        "baseline: crc32fast over the same bytes",
        pkt4.len(),
        || {
            black_box(crc32fast::hash(black_box(&pkt4)));
        },
    );
    let mut dst = vec![0u8; pkt4.len()];
    measure("baseline: memcpy of the same bytes", pkt4.len(), || {
        dst.copy_from_slice(black_box(&pkt4));
        black_box(&dst);
    });
    let icrc4 = measure("ICRC v2/IPv4, 4 KiB payload", pkt4.len(), || {
        black_box(icrc::v2_ipv4(
            &pkt4[..20],
            &pkt4[20..28],
            &pkt4[28..28 + covered],
        ));
    });
    measure("ICRC v2/IPv6, 4 KiB payload", pkt6.len(), || {
        black_box(icrc::v2_ipv6(
            &pkt6[..40],
            &pkt6[40..48],
            &pkt6[48..pkt6.len() - 4],
        ));
    });
    // A receiver on a UDP socket: Identification unknown, recovered from the ICRC.
    let mut zero_ident = pkt4[..20].to_vec();
    zero_ident[4] = 0;
    zero_ident[5] = 0;
    let carried = u32::from_le_bytes(pkt4[pkt4.len() - 4..].try_into().unwrap());
    let mut solver = icrc::IdentSolver::new();
    measure(
        "ICRC verify + IPv4 Identification recovery",
        pkt4.len(),
        || {
            let id = solver.recover(&zero_ident, &pkt4[20..28], &pkt4[28..28 + covered], carried);
            assert_eq!(id, Some(0x1234));
        },
    );
    measure("full parse + ICRC verify (IPv4)", pkt4.len(), || {
        let p = FrameRepr::parse_ip(black_box(&pkt4), pkt4.len()).unwrap();
        black_box(p.icrc);
    });
    println!();
    println!(
        "ICRC over 4 KiB packets: {icrc4:.2} GB/s, {:.2} of crc32fast alone (ICRC by the {})",
        icrc4 / crc_only,
        proto::wire::icrc::implementation()
    );
}
