//! Broken and hostile clients hurt only themselves. Each test runs rdma-core's unmodified
//! `ibv_rc_pingpong` (two processes under the shim) on a private daemon alone, then again
//! while clients of the same device misbehave, and compares its latency; the misbehaving
//! clients speak the daemon's protocol themselves (`daemon/tests/support/client.rs`), so that
//! they can do what the shim never would:
//!
//! - never read their completion channel or their async event socket (the daemon used to
//!   write those records with a blocking `write` from the device thread: a full pipe stopped
//!   the device for everyone);
//! - write garbage into their rings, post bad L_Keys and SGEs outside their MR, overrun their
//!   CQ: each time only their own QP or CQ goes to error, with the error completion and the
//!   async event a device gives (IBV_WC_LOC_QP_OP_ERR + IBV_EVENT_QP_FATAL for a WQE it
//!   cannot decode, IBV_WC_LOC_PROT_ERR for a bad key, IBV_EVENT_CQ_ERR for a CQ overrun).
//!
//! The latencies are printed (`cargo test -- --nocapture`) and bounded loosely: the machine
//! may be loaded, and the point is that nothing stalls.

mod shim_support;

#[path = "../../daemon/tests/support/client.rs"]
#[allow(dead_code, clippy::all)]
mod raw;

use std::path::Path;
use std::time::{Duration, Instant};

use proto::ctl::{self, QpAttr, Request};
use proto::ring::wqe::WrOpcode;
use raw::{ok, send_wqe, Side};
use shim_support::programs::{listening_server, scratch, Logged};
use shim_support::{require_program, Daemon};

/// `enum ibv_event_type` and `enum ibv_wc_status` values (verbs.h).
const IBV_EVENT_CQ_ERR: u32 = 0;
const IBV_EVENT_QP_FATAL: u32 = 1;
const IBV_EVENT_SQ_DRAINED: u32 = 5;
const IBV_WC_LOC_QP_OP_ERR: u32 = 2;
const IBV_WC_LOC_PROT_ERR: u32 = 4;
const IBV_WC_RECV: u32 = 128;
const QP_ERR: u32 = 6;

/// A running `ibv_rc_pingpong` pair on `daemon` (TCP `port` for its exchange).
struct Pingpong {
    server: Logged,
    client: Logged,
    started: Instant,
}

impl Pingpong {
    fn start(daemon: &Daemon, port: u16, iters: u32, dir: &Path) -> Pingpong {
        let program = require_program("ibv_rc_pingpong");
        let args = |cmd: &mut std::process::Command| {
            cmd.args(["-d", "srxe0", "-g", "0", "-s", "64", "-p"])
                .arg(port.to_string())
                .args(["-n", &iters.to_string()]);
        };
        let mut cmd = daemon.command(&program);
        args(&mut cmd);
        let server = listening_server(daemon, cmd, port, dir.join(format!("server-{port}.log")));
        let mut cmd = daemon.command(&program);
        args(&mut cmd);
        cmd.arg("127.0.0.1");
        let client = Logged::spawn(cmd, dir.join(format!("client-{port}.log")));
        Pingpong {
            server,
            client,
            started: Instant::now(),
        }
    }

    fn running(&mut self) -> bool {
        self.client.wait_for(Duration::ZERO).is_none()
    }

    /// Waits for both to finish; returns the client's µs per iteration.
    fn finish(mut self, daemon: &Daemon) -> f64 {
        let limit = Duration::from_secs(120);
        let (c, s) = (self.client.wait_for(limit), self.server.wait_for(limit));
        let out = self.client.output();
        assert!(
            c.is_some_and(|c| c.success()) && s.is_some_and(|s| s.success()),
            "the pingpong failed or stalled after {:?}:\n--- server\n{}\n--- client\n{out}\n--- daemon\n{}",
            self.started.elapsed(),
            self.server.output(),
            daemon.log()
        );
        // "1000 iters in 0.05 seconds = 50.00 usec/iter"
        out.lines()
            .find_map(|l| {
                l.strip_suffix(" usec/iter")?
                    .rsplit(' ')
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("no usec/iter in:\n{out}"))
    }
}

fn pingpong(daemon: &Daemon, port: u16, iters: u32, dir: &Path) -> f64 {
    Pingpong::start(daemon, port, iters, dir).finish(daemon)
}

/// The pingpong beside misbehaving clients stays within a loose bound of the one alone.
fn assert_not_stalled(alone: f64, beside: f64, what: &str) {
    println!("ibv_rc_pingpong alone: {alone:.1} µs/iter; beside {what}: {beside:.1} µs/iter");
    assert!(
        beside < alone * 20.0 + 500.0,
        "beside {what} the pingpong took {beside} µs/iter, alone {alone}"
    );
}

fn gid(addr: &str) -> [u8; 16] {
    ctl::gid_of(addr.parse().unwrap())
}

/// A connected pair of raw clients on `daemon`; `a`'s CQ asks for `cqe` entries and has a
/// completion channel with `channel`.
fn pair(daemon: &Daemon, addr: &str, cqe: u32, channel: bool) -> (Side, Side) {
    let mut a = Side::with_options(&daemon.socket, 1 << 16, ctl::qp_type::RC, cqe, channel);
    let mut b = Side::new(&daemon.socket, 1 << 16);
    a.connect(b.qpn, gid(addr));
    b.connect(a.qpn, gid(addr));
    (a, b)
}

/// A signaled RDMA WRITE of 64 bytes from `a` into `b`'s buffer.
fn write(a: &mut Side, b: &Side, wr_id: u64) {
    let sge = a.sge(0, 64);
    let w = send_wqe(
        wr_id,
        WrOpcode::RdmaWrite,
        &sge,
        b.buf.as_ptr() as u64,
        b.rkey,
    );
    a.post_send(&w);
}

/// Waits until `side` has an async event of type `ty` for `element`.
fn expect_event(side: &Side, seen: &mut Vec<(u64, u32)>, element: u64, ty: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !seen.contains(&(element, ty)) {
        seen.extend(side.async_events());
        assert!(
            Instant::now() < deadline,
            "no event {ty} for {element:#x}; saw {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_client_that_never_reads_its_events_stalls_nobody() {
    let addr = "127.0.0.81";
    let daemon = Daemon::start("hostile-events", &["--addr", addr, "--port", "4791"]);
    let dir = scratch("hostile", "events");
    let alone = pingpong(&daemon, 18681, 500, &dir);

    let (mut a, b) = pair(&daemon, addr, 64, true);
    // Completion events it never reads: its CQ armed before each of 8,600 completions (the
    // pipe holds 8,192 records). Its own completions keep coming all the while. (Each one is
    // a round trip through the device thread, so the count is kept just past the pipe's size:
    // on a loaded 2-CPU runner every round trip can cost a scheduling quantum.)
    const WRITES: u64 = 8_600;
    for i in 0..WRITES {
        a.arm_cq();
        write(&mut a, &b, i);
        let c = a.poll();
        assert_eq!((c.wr_id, c.status), (i, 0));
    }
    // Async events it never reads: SQ_DRAINED 200 times (a socketpair queues ten).
    let sqd = QpAttr {
        qp_state: 4,
        en_sqd_async_notify: 1,
        ..Default::default()
    };
    let rts = QpAttr {
        qp_state: 3,
        ..Default::default()
    };
    for _ in 0..200 {
        for (attr, mask) in [(sqd, 1 | 4), (rts, 1)] {
            ok(a.client
                .request(&Request::ModifyQp {
                    qpn: a.qpn,
                    attr,
                    mask,
                })
                .unwrap());
        }
    }
    let beside = pingpong(&daemon, 18682, 500, &dir);
    assert_not_stalled(alone, beside, "a client that reads no events");

    // What the client finds when it reads at last: the records that fit, then one more
    // per CQ (records of one CQ coalesce), and its async events.
    let mut records = a.channel_records();
    let deadline = Instant::now() + Duration::from_secs(5);
    while records.len() < 8193 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        records.extend(a.channel_records());
    }
    assert!(
        (8193..WRITES as usize).contains(&records.len()),
        "{} records",
        records.len()
    );
    assert!(records.iter().all(|&(cq, _)| cq == a.cq_handle));
    let events = a.async_events();
    assert!(
        events.len() >= 10
            && events
                .iter()
                .all(|&e| e == (u64::from(a.qpn), IBV_EVENT_SQ_DRAINED)),
        "{events:?}"
    );
    // Reading made room: a new event arrives at once.
    a.arm_cq();
    write(&mut a, &b, 7);
    a.poll();
    let deadline = Instant::now() + Duration::from_secs(5);
    while a.channel_records().is_empty() {
        assert!(Instant::now() < deadline, "no record after the client read");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// One round of abuse by fresh clients, checking each hurt only itself. Returns how many
/// clients it used.
fn abuse(daemon: &Daemon, addr: &str) -> usize {
    let mut used = 0;
    // Garbage in the send ring: an opcode that does not exist.
    {
        let (mut a, _b) = pair(daemon, addr, 64, false);
        let mut slot = vec![0xa5u8; 128];
        slot[..8].copy_from_slice(&0x1111u64.to_ne_bytes());
        a.post_raw_send(&slot);
        let c = a.poll();
        assert_eq!((c.wr_id, c.status), (0x1111, IBV_WC_LOC_QP_OP_ERR), "{c:?}");
        assert_eq!(a.qp_state(), QP_ERR);
        expect_event(&a, &mut Vec::new(), u64::from(a.qpn), IBV_EVENT_QP_FATAL);
        used += 2;
    }
    // Garbage in the receive ring: a billion SGEs. Completed in error, not skipped.
    {
        let (mut a, _b) = pair(daemon, addr, 64, false);
        let mut slot = vec![0u8; 64];
        slot[..8].copy_from_slice(&0x2222u64.to_ne_bytes());
        slot[8..12].copy_from_slice(&1_000_000_000u32.to_ne_bytes());
        a.post_raw_recv(&slot);
        let c = a.poll();
        assert_eq!(
            (c.wr_id, c.status, c.opcode),
            (0x2222, IBV_WC_LOC_QP_OP_ERR, IBV_WC_RECV),
            "{c:?}"
        );
        assert_eq!(a.qp_state(), QP_ERR);
        used += 2;
    }
    // A bad L_Key, and an SGE past the end of its MR.
    for (lkey_delta, offset) in [(0x5a5a_0000u32, 0usize), (0, (1 << 16) - 8)] {
        let (mut a, b) = pair(daemon, addr, 64, false);
        let mut sge = a.sge(offset, 64);
        sge[0].lkey = proto::Lkey(a.lkey ^ lkey_delta);
        let w = send_wqe(
            0x3333,
            WrOpcode::RdmaWrite,
            &sge,
            b.buf.as_ptr() as u64,
            b.rkey,
        );
        a.post_send(&w);
        let c = a.poll();
        assert_eq!((c.wr_id, c.status), (0x3333, IBV_WC_LOC_PROT_ERR), "{c:?}");
        assert_eq!(a.qp_state(), QP_ERR);
        used += 2;
    }
    // A CQ overrun: 7 entries granted, 30 signaled writes, never polled.
    {
        let (mut a, b) = pair(daemon, addr, 4, false);
        for i in 0..30 {
            write(&mut a, &b, i);
        }
        let mut seen = Vec::new();
        let cq = u64::from(a.cq_handle);
        expect_event(&a, &mut seen, cq, IBV_EVENT_CQ_ERR);
        expect_event(&a, &mut seen, u64::from(a.qpn), IBV_EVENT_QP_FATAL);
        assert_eq!(a.qp_state(), QP_ERR);
        // What the CQ held before it overran is still there to poll.
        let mut polled = 0;
        while a.poll_for(Duration::from_millis(50)).is_some() {
            polled += 1;
        }
        assert!((1..=7).contains(&polled), "{polled} completions");
        used += 2;
    }
    used
}

#[test]
fn garbage_bad_keys_and_overruns_hurt_only_their_client() {
    let addr = "127.0.0.82";
    let daemon = Daemon::start("hostile-rings", &["--addr", addr, "--port", "4791"]);
    let dir = scratch("hostile", "rings");
    let alone = pingpong(&daemon, 18683, 500, &dir);
    // Abuse while a pingpong runs, round after round, until it is done.
    let mut pp = Pingpong::start(&daemon, 18684, 2_000, &dir);
    let (mut rounds, mut clients) = (0, 0);
    while pp.running() || rounds == 0 {
        clients += abuse(&daemon, addr);
        rounds += 1;
    }
    let beside = pp.finish(&daemon);
    println!("{rounds} rounds of abuse by {clients} clients");
    assert_not_stalled(alone, beside, "clients writing garbage and overrunning CQs");
    // The daemon is still whole: a new pair moves data.
    let (mut a, b) = pair(&daemon, addr, 64, false);
    write(&mut a, &b, 9);
    assert_eq!(a.poll().status, 0);
}
