//! Engine benchmark (not a test): RDMA WRITE between two devices in one thread, at path MTU
//! 4096 and 1024, printing bytes/s, packets/s, and the ratio to what memcpy plus crc32fast
//! alone achieve on the same bytes on this machine.
//!
//! Run: `cargo run --release -p softroce-proto --example engine_bench [MiB]`
//!
//! What the ratio means: per payload byte, the engine does one gather copy and one ICRC at
//! the sender, one ICRC and one scatter copy at the receiver; the baseline does one copy and
//! one CRC. A ratio of 0.5 is therefore "as fast as the copies and CRCs themselves", and the
//! rest is what the engine's own bookkeeping costs.

use proto::transport::*;
use std::time::Instant;

const MSG: u32 = 1 << 20;

fn device(ip: &str) -> Device<VecMemory> {
    Device::new(DeviceConfig::new(ip.parse().unwrap(), 1), VecMemory::new())
}

struct Side {
    dev: Device<VecMemory>,
    qpn: proto::types::Qpn,
    cq: u32,
    addr: u64,
    keys: MrKeys,
}

fn side(ip: &str, buf_len: usize) -> Side {
    let mut dev = device(ip);
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(4096).unwrap();
    let qpn = dev
        .create_qp(QpInit {
            pd,
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: false,
        })
        .unwrap();
    let addr = dev.memory_mut().alloc(buf_len);
    let keys = dev
        .reg_mr(
            pd,
            addr,
            buf_len as u64,
            Access::ALL_REMOTE.union(Access::LOCAL_WRITE),
        )
        .unwrap();
    Side {
        dev,
        qpn,
        cq,
        addr,
        keys,
    }
}

fn connect(s: &mut Side, remote_ip: &str, remote_qpn: proto::types::Qpn, mtu: Mtu) {
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: Access::ALL_REMOTE.union(Access::LOCAL_WRITE),
        ..Default::default()
    };
    let m = AttrMask::STATE
        .union(AttrMask::PKEY_INDEX)
        .union(AttrMask::PORT)
        .union(AttrMask::ACCESS_FLAGS);
    s.dev.modify_qp(s.qpn, &a, m).unwrap();
    a.qp_state = QpState::Rtr;
    a.ah_attr = Some(AddressVector::new(remote_ip.parse().unwrap()));
    a.path_mtu = mtu;
    a.dest_qp_num = remote_qpn;
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 1;
    let m = AttrMask::STATE
        .union(AttrMask::AV)
        .union(AttrMask::PATH_MTU)
        .union(AttrMask::DEST_QPN)
        .union(AttrMask::RQ_PSN)
        .union(AttrMask::MAX_DEST_RD_ATOMIC)
        .union(AttrMask::MIN_RNR_TIMER);
    s.dev.modify_qp(s.qpn, &a, m).unwrap();
    a.qp_state = QpState::Rts;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 16;
    let m = AttrMask::STATE
        .union(AttrMask::TIMEOUT)
        .union(AttrMask::RETRY_CNT)
        .union(AttrMask::RNR_RETRY)
        .union(AttrMask::SQ_PSN)
        .union(AttrMask::MAX_QP_RD_ATOMIC);
    s.dev.modify_qp(s.qpn, &a, m).unwrap();
}

/// Returns (bytes/s, packets/s).
fn run_engine(mtu: Mtu, total: u64) -> (f64, f64) {
    let mut a = side("10.0.0.1", MSG as usize);
    let mut b = side("10.0.0.2", MSG as usize);
    let (qa, qb) = (a.qpn, b.qpn);
    connect(&mut a, "10.0.0.2", qb, mtu);
    connect(&mut b, "10.0.0.1", qa, mtu);
    a.dev.memory_mut().fill(a.addr, &vec![0x5a; MSG as usize]);
    let msgs = total / u64::from(MSG);
    let mut posted = 0u64;
    let mut done = 0u64;
    let mut pkts = 0u64;
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    let start = Instant::now();
    let now = 0;
    while done < msgs {
        while posted < msgs && posted - done < 8 {
            let wr = SendWr::new(
                posted,
                SendOp::Write(RemoteAddr {
                    va: b.addr,
                    rkey: b.keys.rkey,
                }),
                Some(Sge {
                    addr: a.addr,
                    length: MSG,
                    lkey: a.keys.lkey,
                }),
            );
            a.dev.post_send(qa, wr).unwrap();
            posted += 1;
        }
        while let Some(tx) = a.dev.poll_transmit(now, &mut buf) {
            b.dev.handle_packet(now, &buf[..tx.len]);
            pkts += 1;
        }
        while let Some(tx) = b.dev.poll_transmit(now, &mut buf) {
            a.dev.handle_packet(now, &buf[..tx.len]);
        }
        while let Some(wc) = a.dev.poll_cq(a.cq) {
            assert_eq!(wc.status, WcStatus::Success);
            done += 1;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    assert!(b.dev.poll_cq(b.cq).is_none());
    assert_eq!(
        b.dev.memory().slice(b.addr + u64::from(MSG) - 1, 1),
        Some(&[0x5a][..])
    );
    ((msgs * u64::from(MSG)) as f64 / secs, pkts as f64 / secs)
}

/// memcpy + crc32fast over the same bytes, in MTU-sized pieces.
fn run_baseline(mtu: usize, total: u64) -> f64 {
    let src = vec![0x5au8; MSG as usize];
    let mut dst = vec![0u8; MSG as usize];
    let msgs = total / u64::from(MSG);
    let start = Instant::now();
    let mut acc = 0u32;
    for _ in 0..msgs {
        for (s, d) in src.chunks(mtu).zip(dst.chunks_mut(mtu)) {
            d.copy_from_slice(s);
            acc ^= crc32fast::hash(d);
        }
        std::hint::black_box(&mut dst);
    }
    std::hint::black_box(acc);
    (msgs * u64::from(MSG)) as f64 / start.elapsed().as_secs_f64()
}

fn main_orig() {
    let mib: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2048);
    let total = mib << 20;
    println!("RDMA WRITE, {mib} MiB in 1 MiB messages, two engines in one thread");
    for mtu in [Mtu::Mtu4096, Mtu::Mtu1024] {
        let (bps, pps) = run_engine(mtu, total);
        let base = run_baseline(mtu.bytes() as usize, total);
        println!(
            "MTU {:>4}: engine {:>8.1} MB/s {:>9.0} pkt/s | memcpy+crc32fast {:>8.1} MB/s | ratio {:.2}",
            mtu.bytes(),
            bps / 1e6,
            pps,
            base / 1e6,
            bps / base
        );
    }
}

fn main() {
    let _ = main_orig;
    if std::env::args().nth(2).as_deref() == Some("cg") {
        let mtu = if std::env::args().nth(1).as_deref() == Some("4096") {
            Mtu::Mtu4096
        } else {
            Mtu::Mtu1024
        };
        run_engine(
            mtu,
            std::env::args()
                .nth(3)
                .and_then(|a| a.parse::<u64>().ok())
                .unwrap_or(8)
                << 20,
        );
        return;
    }
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(15);
    let total = 64u64 << 20;
    for mtu in [Mtu::Mtu4096, Mtu::Mtu1024] {
        let (mut be, mut bp, mut bb) = (0f64, 0f64, 0f64);
        for _ in 0..rounds {
            let (e, p) = run_engine(mtu, total);
            let b = run_baseline(mtu.bytes() as usize, total);
            be = be.max(e);
            bp = bp.max(p);
            bb = bb.max(b);
        }
        println!("best-of-{rounds} MTU {}: engine {:.0} MB/s {:.0} pkt/s ({:.0} ns/pkt) base {:.0} MB/s ratio {:.3}",
            mtu.bytes(), be / 1e6, bp, 1e9 / bp, bb / 1e6, be / bb);
    }
}
