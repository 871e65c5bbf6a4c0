//! Robustness of the drivers: io_uring forbidden by a seccomp filter (the transport falls back
//! to recvmmsg/sendmmsg and says why), and a receive buffer ring that runs dry (the multishot
//! receive is re-armed and nothing queued in the socket is lost).

mod net_util;

use net_util::*;
use softroce_daemon::net::{Backend, BackendChoice, NetConfig, TxMeta, UdpTransport};
use std::net::IpAddr;

/// Makes io_uring_setup fail with EPERM in the calling thread only (seccomp filters are
/// per thread unless synchronised), as a container runtime's default profile does.
fn forbid_io_uring_in_this_thread() -> Result<(), std::io::Error> {
    const NR_IO_URING_SETUP: u32 = 425; // the same number on every architecture
    const RET_ERRNO_EPERM: u32 = 0x0005_0000 | libc::EPERM as u32;
    const RET_ALLOW: u32 = 0x7fff_0000;
    let filter = [
        // A = seccomp_data.nr
        libc::sock_filter {
            code: 0x20,
            jt: 0,
            jf: 0,
            k: 0,
        },
        // if A == io_uring_setup: next, else skip one
        libc::sock_filter {
            code: 0x15,
            jt: 0,
            jf: 1,
            k: NR_IO_URING_SETUP,
        },
        libc::sock_filter {
            code: 0x06,
            jt: 0,
            jf: 0,
            k: RET_ERRNO_EPERM,
        },
        libc::sock_filter {
            code: 0x06,
            jt: 0,
            jf: 0,
            k: RET_ALLOW,
        },
    ];
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: prctl with valid arguments; `prog` and `filter` outlive the call, which copies
    // the program into the kernel.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            || libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const libc::sock_fprog,
            ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[test]
fn falls_back_to_syscalls_when_io_uring_is_forbidden() {
    std::thread::spawn(|| {
        // Unprivileged processes may install a filter once NO_NEW_PRIVS is set: a kernel
        // without seccomp filters is a missing precondition, and fails the test.
        forbid_io_uring_in_this_thread()
            .unwrap_or_else(|e| panic!("precondition missing: a seccomp filter: {e}"));
        let forced = UdpTransport::open(&NetConfig {
            backend: BackendChoice::IoUring,
            ..cfg()
        });
        let err = forced.expect_err("io_uring must fail under the filter");
        assert!(err.to_string().contains("io_uring_setup"), "{err}");

        let mut a = UdpTransport::open(&cfg()).unwrap();
        let mut b = UdpTransport::open(&cfg()).unwrap();
        assert_eq!(a.backend(), Backend::Syscalls);
        assert!(a.fallback_reason().unwrap().contains("io_uring"));
        for family in [IpAddr::V4(LO4), IpAddr::V6(LO6)] {
            let dst = local(&b, family);
            let pb = builder(local(&a, family), dst);
            let sent: Vec<_> = (0..50).map(|psn| build(&pb, 0, psn, 512, false)).collect();
            for p in &sent {
                a.send(&TxMeta::to(dst), p).unwrap();
            }
            a.flush().unwrap();
            let got = recv_n(&mut b, sent.len());
            let got: Vec<_> = got.into_iter().map(|g| g.bytes).collect();
            assert_eq!(got, sent, "{family}: in order, intact");
        }
    })
    .join()
    .unwrap();
}

#[test]
fn exhausted_buffer_ring_is_rearmed_without_loss() {
    let mut a = UdpTransport::open(&cfg()).unwrap();
    let mut b = UdpTransport::open(&NetConfig {
        rx_buffers: 2,
        backend: BackendChoice::IoUring,
        ..cfg()
    })
    .unwrap();
    let dst = local(&b, IpAddr::V4(LO4));
    let pb = builder(local(&a, IpAddr::V4(LO4)), dst);
    let sent: Vec<_> = (0..100).map(|psn| build(&pb, 0, psn, 64, false)).collect();
    for p in &sent {
        a.send(&TxMeta::to(dst), p).unwrap();
    }
    a.flush().unwrap();
    let got: Vec<_> = recv_n(&mut b, sent.len())
        .into_iter()
        .map(|g| g.bytes)
        .collect();
    assert_eq!(got.len(), sent.len());
    assert_eq!(got, sent);
    assert!(b.counters().rx_no_buffers > 0, "{:?}", b.counters());
    assert_eq!(b.counters().rx_packets, 100);
}
