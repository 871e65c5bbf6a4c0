//! The machine's own limits, measured beside softroce in the same run (`scripts/perftest-bench`):
//! - memcpy of 64 KiB, and the cross-process copy of 64 KiB (`process_vm_writev` from an
//!   aligned buffer into another process), the floor of any data path that moves bytes from
//!   one address space to another;
//! - the one-way latency of a busy-polled UDP ping-pong over loopback (two processes, 2-byte
//!   datagrams), the floor of a packet between two daemons.
//!
//! `cargo run --release -p softroce-daemon --example baselines [seconds]`. A benchmark, not a
//! test: prints `name value unit` lines.

use std::io::IoSlice;
use std::net::UdpSocket;
use std::time::{Duration, Instant};

use nix::sys::uio::{process_vm_writev, RemoteIoVec};
use nix::unistd::{fork, ForkResult, Pid};

const CHUNK: usize = 64 * 1024;

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let span = Duration::from_secs_f64(secs);

    // memcpy, cache-cold-ish: 64 MiB of source cycled in 64 KiB steps.
    let src: Vec<u8> = (0..64 << 20).map(|i: usize| i as u8).collect();
    let mut dst = vec![0u8; 64 << 20];
    let (mut bytes, t0) = (0usize, Instant::now());
    while t0.elapsed() < span {
        for off in (0..src.len()).step_by(CHUNK) {
            dst[off..off + CHUNK].copy_from_slice(&src[off..off + CHUNK]);
        }
        bytes += src.len();
    }
    println!(
        "memcpy_64k {:.2} GB/s",
        bytes as f64 / t0.elapsed().as_secs_f64() / 1e9
    );

    // Cross-process copy: the child keeps `dst` (same address after fork) and waits.
    // SAFETY: the child only sleeps until it is killed; it touches no locks or threads.
    match unsafe { fork() }.expect("fork") {
        ForkResult::Child => loop {
            std::thread::sleep(Duration::from_secs(1));
        },
        ForkResult::Parent { child } => {
            let (mut bytes, t0) = (0usize, Instant::now());
            while t0.elapsed() < span {
                for off in (0..src.len()).step_by(CHUNK) {
                    let remote = [RemoteIoVec {
                        base: dst.as_ptr() as usize + off,
                        len: CHUNK,
                    }];
                    let n =
                        process_vm_writev(child, &[IoSlice::new(&src[off..off + CHUNK])], &remote)
                            .expect("process_vm_writev");
                    bytes += n;
                }
            }
            println!(
                "cross_process_copy_64k {:.2} GB/s",
                bytes as f64 / t0.elapsed().as_secs_f64() / 1e9
            );
            kill_child(child);
        }
    }

    // UDP ping-pong, both ends busy-polling non-blocking sockets (127.0.0.118/119).
    let a = UdpSocket::bind("127.0.0.118:0").expect("bind");
    let b = UdpSocket::bind("127.0.0.119:0").expect("bind");
    let (a_addr, b_addr) = (a.local_addr().unwrap(), b.local_addr().unwrap());
    a.set_nonblocking(true).unwrap();
    b.set_nonblocking(true).unwrap();
    // SAFETY: as above; the child echoes until killed.
    match unsafe { fork() }.expect("fork") {
        ForkResult::Child => {
            let mut buf = [0u8; 64];
            loop {
                if let Ok((n, _)) = b.recv_from(&mut buf) {
                    let _ = b.send_to(&buf[..n], a_addr);
                }
            }
        }
        ForkResult::Parent { child } => {
            let mut buf = [0u8; 64];
            let mut rtts = Vec::new();
            let t0 = Instant::now();
            while t0.elapsed() < span {
                let t = Instant::now();
                a.send_to(b"hi", b_addr).unwrap();
                loop {
                    if a.recv_from(&mut buf).is_ok() {
                        break;
                    }
                    if t.elapsed() > Duration::from_millis(100) {
                        break;
                    }
                }
                rtts.push(t.elapsed());
            }
            rtts.sort_unstable();
            let median = rtts[rtts.len() / 2];
            println!(
                "udp_pingpong_one_way_median {:.2} us",
                median.as_secs_f64() * 1e6 / 2.0
            );
            kill_child(child);
        }
    }
}

fn kill_child(child: Pid) {
    let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
    let _ = nix::sys::wait::waitpid(child, None);
}
