//! Engine benchmark (not a test): RDMA WRITE between two devices in one thread, at path MTU
//! 4096 and 1024, printing bytes/s, packets/s, and the ratio to what memcpy plus crc32fast
//! alone achieve on the same bytes on this machine.
//!
//! Run: `cargo run --release -p softroce-proto --example engine_bench [MiB [trials [none|dcqcn]]]`
//!
//! Each trial runs the engine, then the baseline, on the same bytes; the figures printed are
//! medians over the trials (default 5), so that a noisy, shared machine skews both sides of
//! a ratio alike. The ratio by thread CPU time is printed as a cross-check.
//!
//! What the ratio means: per payload byte the engine makes two passes where the baseline
//! makes one. The sender copies the payload from registered memory (the source is cold,
//! 1 MiB) into the packet and computes the ICRC in one fused pass
//! (`wire::icrc::v2_copying_payload`); the receiver computes the ICRC over the packet while it
//! copies the payload out into registered memory (`wire::icrc::v2_copying_out`, 1 MiB, cold),
//! and only then lets the packet count. The baseline copies 1 MiB to 1 MiB in MTU-sized
//! pieces and hashes each piece once. Both sides really seal and verify every ICRC.
//!
//! The second line under each MTU, "the data work alone", runs just those two fused passes
//! per packet, with no engine around them: the ceiling of any engine that seals and
//! verifies every packet.
//!
//! # Results (AMD EPYC Zen 4 at 2.6 GHz, AVX-512 VPCLMULQDQ; 2 vCPUs; three runs of the
//! default 2048 MiB x 5 trials on an otherwise idle machine)
//!
//! | MTU  | engine                        | baseline  | ratio     | data work alone | target |
//! |------|-------------------------------|-----------|-----------|-----------------|--------|
//! | 4096 | 15.3-15.8 GB/s, 3.7-3.8 Mpkt/s | 19.7-20.1 GB/s | 0.76-0.80 | 1.03-1.11 | 0.7: met |
//! | 1024 | 7.3-7.5 GB/s, 7.1-7.3 Mpkt/s  | 16.4-16.6 GB/s | 0.44-0.45 | 0.82-0.83 | 0.7: not met |
//!
//! These figures predate the page-aligned buffers (`PageBuf`): the baseline's destination
//! sat wherever the heap put it (at MTU 1024, 16 bytes past a cache line in this build),
//! which slows the baseline there by about a quarter. Measured again with them, on a quiet
//! machine, at the end of the session that added them (median of 5 trials each):
//!
//! | MTU | engine | memcpy + crc32fast | ratio (trials) | data work alone |
//! |---|---|---|---|---|
//! | 4096 | 6.2 GB/s, 1.5 Mpkt/s | 16.8 GB/s | 0.37 (0.30-0.55) | 0.72 |
//! | 1024 | 4.9 GB/s, 4.7 Mpkt/s | 15.3 GB/s | 0.32 (0.21-0.35) | 0.67 |
//!
//! That run's engine rate (6.2 GB/s at MTU 4096) was far below the table above's 15.3-15.8;
//! the run below gave 12.0 GB/s with much the same engine, so the rate moves with the
//! machine's state more than with the code, and only ratios within one run compare.
//!
//! On 2026-12-06 (`scripts/bench engine`, `bench/results/20261206T134938Z.md`, a quieter
//! machine): 12.0 GB/s (2.94 Mpkt/s) and 5.82 GB/s (5.68 Mpkt/s) against 22.4 and 18.8 GB/s,
//! ratios 0.57 and 0.32, the data work alone 0.93 and 0.69. A bisection of the ratio at MTU
//! 4096 (0.77 before, 0.57 after) puts its whole fall at the page-aligned buffers: the aligned
//! baseline is faster, and the engine's payload, copied from a page-aligned registered
//! buffer to 40-56 bytes into a page-aligned frame, pays 4 KiB aliasing (loads that match a
//! pending store's address modulo 4 KiB wait for it): with the frame 2 KiB along the engine
//! ran about 7 % faster (ad hoc). `perf` of the engine alone at MTU 4096: 67 % of its time in
//! the two fused passes (`wire::icrc::fold::kernel`), the rest the engines' own work per
//! packet, about 100 ns for both, spread thin (`poll_transmit` 6 %, `emit_request` 4.5 %,
//! `gather` 4 %, `poll_request` 3 %, the predicted WRITE 2 %, the QP lookup 1.8 %, ...);
//! callgrind counts about 1,150 instructions per packet outside the ICRC and copies.
//!
//! Session 2 ended at 0.46 and 0.21; what moved it:
//! - the receiver places the payload of an RDMA WRITE's MIDDLE and LAST packets by the pass
//!   that verifies the ICRC (`transport::packet_io::PendingIcrc`): one trip through the
//!   payload instead of a hash and then a copy into cold memory;
//! - the ICRC kernel folds the masked headers in parallel with the data and carries every
//!   block straight to the end: about 15 ns of fixed cost per packet instead of 30-45;
//! - the requester builds each full-MTU MIDDLE packet from the previous one's headers
//!   (`packet_io::SegmentTemplate`: copy 40-60 bytes, patch the PSN and AckReq bit), and
//!   the responder predicts the next MIDDLE packet of the WRITE it is receiving
//!   (`responder::on_predicted_write_middle`, as TCP's header prediction), skipping the
//!   general parse and dispatch;
//! - smaller things the profile showed: the IPv4 header checksum summed over 32-bit words,
//!   `VecMemory` finding its region without a B-tree walk, a returned `Transmit` no longer
//!   stalling on store forwarding.
//!
//! Why MTU 1024 stays far below 0.7: the two fused passes alone, with no engine at all,
//! reach 0.82-0.83 of the baseline (each 1 KiB packet is hashed twice plus the headers and a
//! 96-to-32-bit reduction each time, where the baseline hashes 1 KiB once). For 0.7 the two
//! engines together would have to spend under about 12 ns per packet on everything that is
//! not data: requester, header emission, parse, responder, key and memory lookups, queues.
//! They spend about 60 ns (`perf record`: requester 17 ns, the L_Key check and gather 10,
//! the ICRC calls' own setup 10, receive parse and predicted path 10, QP lookups 6, the
//! rest in the ready queue and the bench loop). At MTU 4096 the same costs are spread over
//! four times the bytes.

use proto::transport::*;
use std::time::Instant;

const MSG: u32 = 1 << 20;

/// The congestion control the engines run: the third argument (`none`, the default, or
/// `dcqcn`: an uncongested QP at the line rate, which must cost nothing measurable).
fn congestion() -> CongestionConfig {
    let algorithm = std::env::args()
        .nth(3)
        .map(|a| a.parse().expect("none or dcqcn"))
        .unwrap_or(Algorithm::None);
    CongestionConfig {
        algorithm,
        params: CcParams::default(),
    }
}

fn device(ip: &str) -> Engine<VecMemory> {
    let mut config = EngineConfig::new(ip.parse().unwrap(), 1);
    config.congestion = congestion();
    Engine::new(config, VecMemory::new())
}

struct Side {
    dev: Engine<VecMemory>,
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

/// `len` bytes of `fill` starting on a page boundary, for every buffer of the benchmark
/// (registered memory is page aligned too: `VecMemory`). A plain `Vec` of 1 MiB starts at
/// whatever 16-byte offset the heap's history gives it, and that history is what the engines
/// allocated and freed before: the baseline's memcpy and crc32fast over 1 KiB pieces run
/// about 30 % faster into a destination that starts on a cache line than into one 16 or 48
/// bytes off, so the ratio moved by up to a quarter with changes to the engine that did not
/// change its speed (selective retransmission, 4e2e27f, moved it onto a line at MTU 1024).
struct PageBuf {
    /// One allocation: `VecMemory` places its bytes on a page boundary.
    mem: VecMemory,
    addr: u64,
    len: usize,
}

impl PageBuf {
    fn new(len: usize, fill: u8) -> PageBuf {
        let mut mem = VecMemory::new();
        let addr = mem.alloc(len);
        mem.fill(addr, &vec![fill; len]);
        PageBuf { mem, addr, len }
    }

    fn bytes(&self) -> &[u8] {
        self.mem.slice(self.addr, self.len).expect("allocated")
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        self.mem
            .lend_mut(0, self.addr, self.len)
            .expect("allocated")
    }
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
    let mut frame = PageBuf::new(MAX_FRAME_LEN, 0);
    let buf = frame.bytes_mut();
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
        while let Some(tx) = a.dev.poll_transmit(now, buf) {
            b.dev.handle_packet(now, &buf[..tx.len]);
            pkts += 1;
        }
        while let Some(tx) = b.dev.poll_transmit(now, buf) {
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
    let src = PageBuf::new(MSG as usize, 0x5a);
    let mut dst = PageBuf::new(MSG as usize, 0);
    let (src, dst) = (src.bytes(), dst.bytes_mut());
    let msgs = total / u64::from(MSG);
    let start = Instant::now();
    let mut acc = 0u32;
    for _ in 0..msgs {
        for (s, d) in src.chunks(mtu).zip(dst.chunks_mut(mtu)) {
            d.copy_from_slice(s);
            acc ^= crc32fast::hash(d);
        }
        std::hint::black_box(&mut *dst);
    }
    std::hint::black_box(acc);
    (msgs * u64::from(MSG)) as f64 / start.elapsed().as_secs_f64()
}

/// The data work alone, as any engine that seals and verifies every packet must do it, with
/// no engine around it: per MTU-sized piece, the sender's pass (the payload copied from the
/// 1 MiB source into a packet while its ICRC is computed) and the receiver's (the ICRC
/// computed over the packet while the payload is copied out to the 1 MiB destination, then
/// compared). Its ratio to the baseline is the ceiling of the engine's.
fn run_data_only(mtu: usize, total: u64) -> f64 {
    use proto::wire::icrc;
    let src = PageBuf::new(MSG as usize, 0x5a);
    let mut dst = PageBuf::new(MSG as usize, 0);
    let (src, dst) = (src.bytes(), dst.bytes_mut());
    // An IPv4 + UDP + BTH header of a WRITE MIDDLE packet (the values do not matter here).
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[9] = 17;
    let udp = [0x12, 0xb7, 0x12, 0xb7, 0, 0, 0, 0];
    let bth = [0x07, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 1];
    let mut packet = PageBuf::new(mtu, 0);
    let packet = packet.bytes_mut();
    let msgs = total / u64::from(MSG);
    let mut bad = 0u32;
    let start = Instant::now();
    for _ in 0..msgs {
        for (s, d) in src.chunks(mtu).zip(dst.chunks_mut(mtu)) {
            let sealed = icrc::v2_copying_payload(&ip, &udp, &bth, s, packet);
            let verified = icrc::v2_copying_out(&ip, &udp, &bth, packet, d);
            bad += u32::from(sealed != verified);
        }
        std::hint::black_box(&mut *dst);
    }
    assert_eq!(bad, 0);
    (msgs * u64::from(MSG)) as f64 / start.elapsed().as_secs_f64()
}

/// This thread's CPU time (user + system) in seconds, from `/proc/thread-self/stat` (Linux;
/// clock ticks of 10 ms), or None where that is not available. On a shared machine the wall
/// clock also counts time the thread waited for a CPU; the CPU time does not.
fn thread_cpu_secs() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / 100.0)
}

/// The median of `v` (sorted in place).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mib: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(2048);
    let trials: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5).max(1);
    let total = mib << 20;
    println!(
        "RDMA WRITE, {mib} MiB in 1 MiB messages, two engines in one thread; \
         median of {trials} trials, each the engine then the baseline on the same bytes; \
         ICRC by the {}; congestion control {}",
        proto::wire::icrc::implementation(),
        congestion().algorithm
    );
    for mtu in [Mtu::Mtu4096, Mtu::Mtu1024] {
        // Each trial measures the engine and the baseline back to back, so that a ratio
        // compares runs under the same load (the machine may be shared and noisy).
        let (mut bps, mut pps, mut base, mut ratio) = (vec![], vec![], vec![], vec![]);
        let (mut cpu_ratio, mut ceiling) = (vec![], vec![]);
        for _ in 0..trials {
            let c0 = thread_cpu_secs();
            let (b, p) = run_engine(mtu, total);
            let c1 = thread_cpu_secs();
            let c = run_baseline(mtu.bytes() as usize, total);
            let c2 = thread_cpu_secs();
            let d = run_data_only(mtu.bytes() as usize, total);
            bps.push(b);
            pps.push(p);
            base.push(c);
            ratio.push(b / c);
            ceiling.push(d / c);
            if let (Some(c0), Some(c1), Some(c2)) = (c0, c1, c2) {
                if c1 > c0 && c2 > c1 {
                    // Same bytes: the ratio of throughputs is the inverse ratio of times.
                    cpu_ratio.push((c2 - c1) / (c1 - c0));
                }
            }
        }
        let (lo, hi) = (
            ratio.iter().copied().fold(f64::MAX, f64::min),
            ratio.iter().copied().fold(0.0, f64::max),
        );
        println!(
            "MTU {:>4}: engine {:>8.1} MB/s {:>9.0} pkt/s | memcpy+crc32fast {:>8.1} MB/s | \
             ratio {:.2} (trials {lo:.2}..{hi:.2})",
            mtu.bytes(),
            median(&mut bps) / 1e6,
            median(&mut pps),
            median(&mut base) / 1e6,
            median(&mut ratio),
        );
        println!(
            "          the data work alone (seal while copying in, verify while copying out, \
             no engine): ratio {:.2}, the engine's ceiling",
            median(&mut ceiling)
        );
        if cpu_ratio.len() == trials {
            println!(
                "          by CPU time instead of wall time (ticks of 10 ms): ratio {:.2}",
                median(&mut cpu_ratio)
            );
        }
    }
}
