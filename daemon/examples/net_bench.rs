//! Loopback throughput of the RoCE UDP transport: packets/s and GB/s at 1024- and 4096-byte
//! RoCE payloads, one syscall per packet vs batched syscalls vs io_uring vs io_uring with
//! UDP GSO/GRO. Every received packet has its ICRC verified, as in the daemon.
//!
//! `cargo run --release -p softroce-daemon --example net_bench [seconds-per-case]`
//!
//! A benchmark, not a test: numbers depend on the machine. Sender and receiver run on two
//! threads over 127.0.0.1 on ephemeral ports; loss is what the receiver did not see.

use proto::wire::{BthRepr, Opcode, TransportRepr};
use proto::{Psn, Qpn};
use softroce_daemon::net::{
    BackendChoice, NetConfig, PacketBuilder, RxDatagram, TxMeta, UdpTransport,
};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Copy)]
struct Mode {
    name: &'static str,
    backend: BackendChoice,
    batch: usize,
    gso: bool,
}

const MODES: [Mode; 4] = [
    Mode {
        name: "per-packet syscalls",
        backend: BackendChoice::Syscalls,
        batch: 1,
        gso: false,
    },
    Mode {
        name: "sendmmsg/recvmmsg x64",
        backend: BackendChoice::Syscalls,
        batch: 64,
        gso: false,
    },
    Mode {
        name: "io_uring batched",
        backend: BackendChoice::IoUring,
        batch: 64,
        gso: false,
    },
    Mode {
        name: "io_uring + GSO/GRO",
        backend: BackendChoice::IoUring,
        batch: 64,
        gso: true,
    },
];

struct Result {
    tx_pkts: u64,
    rx_pkts: u64,
    rx_bytes: u64,
    bad: u64,
    secs: f64,
}

fn config(mode: &Mode) -> NetConfig {
    NetConfig {
        ipv4: Some(Ipv4Addr::LOCALHOST),
        ipv6: None,
        port: 0,
        backend: mode.backend,
        syscall_batch: mode.batch,
        gso: mode.gso,
        gro: mode.gso,
        rx_buffers: 1024,
        tx_slots: 256,
        ..NetConfig::default()
    }
}

fn run(mode: &Mode, payload_len: usize, secs: f64) -> std::io::Result<Result> {
    let mut rx = UdpTransport::open(&config(mode))?;
    let mut tx = UdpTransport::open(&config(mode))?;
    let dst = rx.local_addr_v4().unwrap();
    let src = tx.local_addr_v4().unwrap();
    let mut pb = PacketBuilder::new(src.ip(), dst.ip(), src.port());
    pb.dst_port = dst.port();

    // Full-MTU RC SEND_MIDDLE packets: BTH + payload + ICRC.
    let mut repr = TransportRepr::new(BthRepr {
        opcode: Opcode(0x01),
        solicited: false,
        mig_req: false,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qpn: Qpn::new(0x11),
        ack_req: false,
        psn: Psn::new(0),
    });
    repr.payload_len = payload_len;
    let pkt_len = repr.buffer_len();
    let payload: Vec<u8> = (0..payload_len).map(|i| i as u8).collect();
    // One send: a packet, or with GSO as many segments as fit in a datagram, segment k
    // built with IPv4 Identification k (what the kernel's segmentation writes).
    let segs = if mode.gso {
        (tx.max_send_len() / pkt_len).clamp(1, 32)
    } else {
        1
    };
    let mut send_buf = vec![0u8; pkt_len * segs];
    for k in 0..segs {
        repr.bth.psn = Psn::new(k as u32);
        pb.emit(k as u16, &repr, &payload, &mut send_buf[k * pkt_len..])
            .map_err(|e| std::io::Error::other(e.to_string()))?;
    }
    let meta = TxMeta {
        segment_size: mode.gso.then_some(pkt_len as u16),
        ..TxMeta::to(dst)
    };

    let stop = Arc::new(AtomicBool::new(false));
    let stop_rx = stop.clone();
    let receiver = std::thread::spawn(move || {
        let (mut pkts, mut bytes) = (0u64, 0u64);
        let mut idle = 0;
        while idle < 5 {
            let n = rx
                .poll(
                    Some(Duration::from_millis(20)),
                    &mut |d: &mut RxDatagram<'_>| {
                        pkts += 1;
                        bytes += d.bytes().len() as u64;
                    },
                )
                .unwrap_or(0);
            if stop_rx.load(Ordering::Relaxed) && n == 0 {
                idle += 1;
            }
        }
        (pkts, bytes, rx.counters().rx_bad_icrc)
    });

    let start = Instant::now();
    let mut sends = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        for _ in 0..64 {
            tx.send(&meta, &send_buf)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            sends += 1;
        }
        tx.poll(Some(Duration::ZERO), &mut |_: &mut RxDatagram<'_>| {})?;
    }
    tx.flush()?;
    while tx.tx_in_flight() > 0 {
        tx.poll(
            Some(Duration::from_millis(10)),
            &mut |_: &mut RxDatagram<'_>| {},
        )?;
    }
    let elapsed = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let (rx_pkts, rx_bytes, bad) = receiver.join().expect("receiver thread");
    let _ = sends;
    Ok(Result {
        tx_pkts: tx.counters().tx_packets,
        rx_pkts,
        rx_bytes,
        bad,
        secs: elapsed,
    })
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    println!(
        "{:<24} {:>6} {:>12} {:>12} {:>9} {:>7} {:>6}",
        "mode", "MTU", "tx pkt/s", "rx pkt/s", "rx GB/s", "loss%", "bad"
    );
    for payload in [1024usize, 4096] {
        for mode in &MODES {
            match run(mode, payload, secs) {
                Ok(r) => {
                    let loss = if r.tx_pkts > 0 {
                        100.0 * (r.tx_pkts.saturating_sub(r.rx_pkts)) as f64 / r.tx_pkts as f64
                    } else {
                        0.0
                    };
                    println!(
                        "{:<24} {:>6} {:>12.0} {:>12.0} {:>9.3} {:>7.2} {:>6}",
                        mode.name,
                        payload,
                        r.tx_pkts as f64 / r.secs,
                        r.rx_pkts as f64 / r.secs,
                        r.rx_bytes as f64 / r.secs / 1e9,
                        loss,
                        r.bad
                    );
                }
                Err(e) => println!("{:<24} {:>6} failed: {e}", mode.name, payload),
            }
        }
    }
}
