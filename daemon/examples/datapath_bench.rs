//! The daemon's data path measured with a raw client (no shim): RDMA WRITE bandwidth and
//! SEND round-trip latency between two client processes' engines, on one daemon and across
//! two daemons over loopback. `cargo build --release -p softroce-daemon --bins --examples &&
//! target/release/examples/datapath_bench` (run by `scripts/bench datapath`).

#[path = "../tests/support/client.rs"]
mod client;

use client::*;
use proto::ctl;
use proto::ring::wqe::{self, SendData, SendWqe, WrOpcode};
use proto::Rkey;
use std::time::Instant;

fn pair(a_addr: &str, b_addr: &str, tag: &str) -> (Daemon, Option<Daemon>, Side, Side) {
    let da = start_daemon(&format!("{tag}-a"), a_addr);
    let db = (a_addr != b_addr).then(|| start_daemon(&format!("{tag}-b"), b_addr));
    let mut a = Side::new(&da.socket, 1 << 22);
    let mut b = Side::new(db.as_ref().map_or(&da.socket, |d| &d.socket), 1 << 22);
    let (ga, gb) = (
        ctl::gid_of(a_addr.parse().unwrap()),
        ctl::gid_of(b_addr.parse().unwrap()),
    );
    let (qa, qb) = (a.qpn, b.qpn);
    // Loopback's MTU allows the largest RoCE MTU.
    a.connect_mtu(qb, gb, 5);
    b.connect_mtu(qa, ga, 5);
    (da, db, a, b)
}

fn write_bw(a: &mut Side, b: &Side, size: u32, total: u64) -> f64 {
    let n = total / u64::from(size);
    let window = 16u64;
    let start = Instant::now();
    let mut posted = 0u64;
    let mut done = 0u64;
    while done < n {
        while posted < n && posted - done < window {
            let off = (posted % 32) as usize * size as usize % (a.buf.len() - size as usize);
            let sge = a.sge(off, size);
            let remote = b.buf.as_ptr() as u64 + off as u64;
            let w = send_wqe(posted, WrOpcode::RdmaWrite, &sge, remote, b.rkey);
            a.post_send(&w);
            posted += 1;
        }
        let c = a.poll();
        assert_eq!(c.status, 0, "{c:?}");
        done += 1;
    }
    (n * u64::from(size)) as f64 / start.elapsed().as_secs_f64()
}

fn send_rtt(a: &mut Side, b: &mut Side, iters: u32) -> f64 {
    let sge_a = a.sge(0, 2);
    let sge_b = b.sge(0, 2);
    for i in 0..8 {
        a.post_recv(i, 4096, 64);
        b.post_recv(i, 4096, 64);
    }
    let start = Instant::now();
    for i in 0..iters {
        let w = SendWqe {
            wr_id: u64::from(i),
            opcode: WrOpcode::Send,
            flags: wqe::send_flags::SIGNALED,
            imm_or_inv: 0,
            remote_addr: 0,
            rkey: Rkey(0),
            compare_add: 0,
            swap: 0,
            ud: None,
            bind: None,
            data: SendData::Sges(&sge_a),
        };
        a.post_send(&w);
        let _ = a.poll();
        let r = b.poll();
        assert_eq!(r.status, 0);
        b.post_recv(u64::from(i) + 8, 4096, 64);
        let w = SendWqe {
            data: SendData::Sges(&sge_b),
            ..w
        };
        b.post_send(&w);
        let _ = b.poll();
        let r = a.poll();
        assert_eq!(r.status, 0);
        a.post_recv(u64::from(i) + 8, 4096, 64);
    }
    start.elapsed().as_secs_f64() * 1e6 / f64::from(iters)
}

fn main() {
    println!(
        "| setup | RDMA WRITE 64 KiB (GB/s) | RDMA WRITE 4 KiB (GB/s) | SEND 2 B round trip (µs) |"
    );
    println!("|---|---|---|---|");
    for (label, a, b) in [
        ("one daemon", "127.0.0.211", "127.0.0.211"),
        ("two daemons", "127.0.0.212", "127.0.0.213"),
    ] {
        let (_da, _db, mut qa, mut qb) = pair(a, b, label.split(' ').next().unwrap());
        let bw64 = write_bw(&mut qa, &qb, 65536, 1 << 30);
        let bw4 = write_bw(&mut qa, &qb, 4096, 256 << 20);
        let rtt = send_rtt(&mut qa, &mut qb, 2000);
        println!(
            "| {label} | {:.2} | {:.2} | {rtt:.1} |",
            bw64 / 1e9,
            bw4 / 1e9
        );
    }
}
