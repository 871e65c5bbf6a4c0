//! The raw frame rate of TAP devices, by the way frames are handed to and taken from the
//! kernel: the baseline for the L2 device's rows in `scripts/bench`, and the measurement
//! behind its choice of batching (docs/architecture.md, "The L2 device").
//!
//! Run as root in a network namespace of its own (`sudo unshare --net cargo run --release -p
//! softroce-daemon --example tap_bench`): it creates two TAPs on a bridge, writes frames into
//! one and reads them from the other, and prints one row per method:
//!
//! - `write`: one `write(2)` per frame (the TAP driver takes exactly one frame per call);
//! - `writev-8`: one `writev(2)` of 8 frames: the TAP driver joins the iovecs into ONE frame
//!   (it is not a batch; the row shows how many frames arrive per call);
//! - `io_uring-N`: N `IORING_OP_WRITE` requests per `io_uring_enter`, and on the receiving
//!   side a multishot `IORING_OP_READ_MULTISHOT` into provided buffers, reaped in batches.
//!
//! Every row uses the same frame (RoCE v1-sized: 14 + 40 + 12 + 1024 + 4 bytes by default;
//! `--len N`) and reports frames/s sent and received, and the sender's CPU time per frame.

use softroce_daemon::net::tap::{TapConfig, TapIo};
use softroce_daemon::net::BackendChoice;
use std::io::Write;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const DURATION: Duration = Duration::from_millis(1500);

fn sh(args: &[&str]) {
    let ok = Command::new("ip")
        .args(args)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "ip {}", args.join(" "));
}

fn cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[derive(Clone, Copy)]
enum Method {
    Write,
    Writev(usize),
    Uring(usize),
}

impl Method {
    fn name(self) -> String {
        match self {
            Method::Write => "write(2) each".into(),
            Method::Writev(n) => format!("writev(2) of {n}"),
            Method::Uring(n) => format!("io_uring, {n} writes per enter"),
        }
    }
}

/// Counts frames read from `b` until `stop`.
fn receiver(mut b: TapIo, stop: Arc<AtomicBool>, frames: Arc<AtomicU64>) -> TapIo {
    while !stop.load(Ordering::Relaxed) {
        let mut n = 0;
        let _ = b.poll(Some(Duration::from_millis(20)), &mut |_| n += 1);
        frames.fetch_add(n, Ordering::Relaxed);
    }
    b
}

/// Sends as many frames as it can for DURATION; returns (system calls, frames, CPU time).
fn sender(a: &mut TapIo, method: Method, frame: &[u8]) -> (u64, u64, Duration) {
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    let before = a.counters();
    let (mut calls, mut sent) = (0u64, 0u64);
    match method {
        Method::Write | Method::Uring(_) => {
            let batch = match method {
                Method::Uring(n) => n,
                _ => 1,
            };
            while t0.elapsed() < DURATION {
                for _ in 0..batch {
                    a.send(frame).unwrap();
                }
                a.flush().unwrap();
            }
            let _ = a.poll(Some(Duration::ZERO), &mut |_| {});
            let c = a.counters();
            calls = c.tx_calls - before.tx_calls;
            sent = c.tx_frames - before.tx_frames;
        }
        Method::Writev(n) => {
            let iov: Vec<libc::iovec> = (0..n)
                .map(|_| libc::iovec {
                    iov_base: frame.as_ptr() as *mut _,
                    iov_len: frame.len(),
                })
                .collect();
            let fd = a.raw_fd();
            while t0.elapsed() < DURATION {
                for _ in 0..64 {
                    // SAFETY: iovecs of a live buffer.
                    let r = unsafe { libc::writev(fd, iov.as_ptr(), n as i32) };
                    calls += 1;
                    if r > 0 {
                        sent += 1;
                    }
                }
            }
        }
    }
    (calls, sent, cpu_time() - cpu0)
}

fn open(name: &str, backend: BackendChoice) -> TapIo {
    let mut cfg = TapConfig::new(name);
    cfg.backend = backend;
    let (tap, why) = TapIo::open(&cfg)
        .unwrap_or_else(|e| panic!("TAP {name}: {e} (run as root, in a namespace: inns)"));
    if let Some(why) = why {
        eprintln!("tap_bench: {name}: io_uring unavailable: {why}");
    }
    tap
}

fn main() {
    let mut len = 14 + 40 + 12 + 1024 + 4;
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--len") {
        len = args[i + 1].parse().expect("--len N");
    }
    let quick = args.iter().any(|a| a == "--quick");
    let id = std::process::id() % 10000;
    let (a_name, b_name, br) = (
        format!("srbA{id}"),
        format!("srbB{id}"),
        format!("srbr{id}"),
    );
    sh(&["link", "add", &br, "type", "bridge"]);
    sh(&["link", "set", &br, "up"]);
    // A RoCE v1 frame: broadcast, so the bridge floods it to B without learning anything.
    let mut frame = vec![0u8; len];
    frame[..6].copy_from_slice(&[0xff; 6]);
    frame[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 0x5a]);
    frame[12..14].copy_from_slice(&0x8915u16.to_be_bytes());
    let mut methods = vec![
        Method::Write,
        Method::Writev(8),
        Method::Uring(8),
        Method::Uring(32),
    ];
    if quick {
        methods = vec![Method::Write, Method::Uring(32)];
    }
    println!("| send / receive | frame bytes | sent frames/s | received frames/s | send system calls per frame | sender CPU per frame |");
    println!("|---|---|---|---|---|---|");
    for method in methods {
        let backend = match method {
            Method::Uring(_) => BackendChoice::IoUring,
            _ => BackendChoice::Syscalls,
        };
        let mut a = open(&a_name, backend);
        let b = open(&b_name, backend);
        for t in [&a_name, &b_name] {
            sh(&["link", "set", t, "mtu", "9000"]);
            sh(&["link", "set", t, "master", &br]);
        }
        // Let the bridge ports settle.
        std::thread::sleep(Duration::from_millis(200));
        let stop = Arc::new(AtomicBool::new(false));
        let frames = Arc::new(AtomicU64::new(0));
        let (s, f) = (stop.clone(), frames.clone());
        let rx = std::thread::spawn(move || receiver(b, s, f));
        std::thread::sleep(Duration::from_millis(50));
        let t0 = Instant::now();
        let (calls, sent, cpu) = sender(&mut a, method, &frame);
        let secs = t0.elapsed().as_secs_f64();
        std::thread::sleep(Duration::from_millis(100));
        stop.store(true, Ordering::Relaxed);
        let b = rx.join().unwrap();
        let got = frames.load(Ordering::Relaxed);
        let rx_name = match method {
            Method::Uring(_) => "multishot read",
            _ => "read",
        };
        println!(
            "| {} / {rx_name} | {len} | {:.0} | {:.0} | {:.3} | {:.2} µs |",
            method.name(),
            sent as f64 / secs,
            got as f64 / secs,
            calls as f64 / sent.max(1) as f64,
            cpu.as_secs_f64() * 1e6 / sent.max(1) as f64,
        );
        let _ = std::io::stdout().flush();
        drop((a, b));
    }
    sh(&["link", "del", &br]);
}
