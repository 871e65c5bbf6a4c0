//! Errors a client causes are reported to it, never lost: a WRITE whose data cannot be placed
//! (the target unmapped memory it had registered) is not acknowledged and its QP goes to ERR
//! with IBV_EVENT_QP_ACCESS_ERR; a receive WQE the daemon cannot decode completes in error.

mod support;

use proto::ctl::{self, Request, Response};
use proto::ring::wqe::WrOpcode;
use std::time::{Duration, Instant};
use support::client::*;

const IBV_EVENT_QP_ACCESS_ERR: u32 = 3;
const QP_ERR: u32 = 6;

fn gid(addr: &str) -> [u8; 16] {
    ctl::gid_of(addr.parse().unwrap())
}

#[test]
fn a_write_that_cannot_be_placed_is_not_acknowledged() {
    let addr = "127.0.0.91";
    let daemon = start_daemon_with("unplaced", &["--addr", addr, "--port", "4791"], &[]);
    let mut a = Side::new(&daemon.socket, 4096);
    let mut b = Side::new(&daemon.socket, 4096);
    a.connect(b.qpn, gid(addr));
    b.connect(a.qpn, gid(addr));

    // `a` registers fresh pages, then unmaps them (rxe would have pinned them; a process
    // that does this here has nowhere for the data to go).
    const LEN: usize = 16 * 4096;
    // SAFETY: a fresh anonymous mapping, unmapped again below; nothing else uses it.
    let region = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(region, libc::MAP_FAILED);
    let Response::Mr { rkey, .. } = ok(a
        .client
        .request(&Request::RegMr {
            pd: a.pd,
            addr: region as u64,
            length: LEN as u64,
            iova: region as u64,
            access: 0xf,
        })
        .unwrap())
    else {
        panic!()
    };
    // SAFETY: the mapping made above.
    assert_eq!(unsafe { libc::munmap(region, LEN) }, 0);

    let sge = b.sge(0, 4096);
    b.post_send(&send_wqe(
        5,
        WrOpcode::RdmaWrite,
        &sge,
        region as u64 + 4096,
        rkey,
    ));
    let c = b.poll();
    assert_eq!(c.wr_id, 5);
    // Never acknowledged: the requester retries into a QP in ERR until it gives up
    // (IBV_WC_RETRY_EXC_ERR, 12), as against a responder that went away.
    assert_eq!(c.status, 12, "a WRITE that was never placed: {c:?}");
    assert_eq!(a.qp_state(), QP_ERR);
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut events = Vec::new();
    while !events.contains(&(u64::from(a.qpn), IBV_EVENT_QP_ACCESS_ERR)) {
        events.extend(a.async_events());
        assert!(Instant::now() < deadline, "no QP_ACCESS_ERR: {events:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_receive_wqe_that_cannot_be_decoded_completes_in_error() {
    let addr = "127.0.0.92";
    let daemon = start_daemon_with("bad-recv", &["--addr", addr, "--port", "0"], &[]);
    let mut a = Side::new(&daemon.socket, 4096);
    let mut b = Side::new(&daemon.socket, 4096);
    a.connect(b.qpn, gid(addr));
    b.connect(a.qpn, gid(addr));
    a.post_recv(1, 0, 64);
    // Three SGEs on a QP made for two.
    let mut slot = vec![0u8; 64];
    slot[..8].copy_from_slice(&2u64.to_ne_bytes());
    slot[8..12].copy_from_slice(&3u32.to_ne_bytes());
    a.post_raw_recv(&slot);
    // The one before it is flushed when the QP goes to ERR; the bad one completes in error.
    let mut seen = [a.poll(), a.poll()];
    seen.sort_by_key(|c| c.wr_id);
    let got: Vec<(u64, u32, u32)> = seen.iter().map(|c| (c.wr_id, c.status, c.opcode)).collect();
    // IBV_WC_WR_FLUSH_ERR 5, IBV_WC_LOC_QP_OP_ERR 2, IBV_WC_RECV 128.
    assert_eq!(got, [(1, 5, 128), (2, 2, 128)]);
    assert_eq!(a.qp_state(), QP_ERR);
}
