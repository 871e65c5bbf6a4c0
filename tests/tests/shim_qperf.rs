//! Debian's unmodified qperf through softroce: one persistent server and, one after the
//! other, a client for every RC test qperf has, each of which must end with its figure.
//!
//! qperf addresses its QPs by LID unless told to use the RDMA CM (`-cm1`), and a RoCE port
//! refuses an address without a GRH (kernel rxe answers EINVAL too), so its RC tests run with
//! `-cm1`, and its UC and UD tests (which have no CM mode) do not run on RoCE at all.
//!
//! qperf waits for completions on a completion channel (`ibv_get_cq_event`) and ends a test
//! with its own interval timer, whose SIGALRM handler does not ask for `SA_RESTART`: the
//! server's last wait, for a message the client no longer sends, ends only because the
//! signal interrupts the read with EINTR, as the kernel's event file does. A shim that read
//! again after EINTR left the server waiting for ever, and the client reported "failed to
//! receive results: timed out" (about one latency test in eight). `ver_rc_*` check the
//! atomics' results. The device's counters say whether the same-host fast path was used, and
//! that it is not asked for in vain by a program that waits on events.

mod shim_support;

use std::time::Duration;

use shim_support::operator::{counters, delta};
use shim_support::programs::{listening_server, loopback_daemon, scratch, Logged};
use shim_support::require_program;

/// qperf's own TCP port for the server (its default, 19765, is left to users).
const PORT: &str = "19590";

/// The number after `name  =` in qperf's output, if any.
fn figure(out: &str, name: &str) -> Option<f64> {
    out.lines().find_map(|l| {
        let rest = l
            .trim()
            .strip_prefix(name)?
            .trim_start()
            .strip_prefix('=')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

#[test]
fn every_rc_test_of_qperf_ends_with_its_figure() {
    let d = loopback_daemon("qperf", 163);
    let qperf = require_program("qperf");
    let dir = scratch("qperf", "rc");
    let mut cmd = d.command(&qperf);
    cmd.args(["-lp", PORT]);
    let mut server = listening_server(&d, cmd, PORT.parse().unwrap(), dir.join("server.log"));
    for (test, name) in [
        ("rc_bw", "bw"),
        ("rc_bi_bw", "bw"),
        ("rc_lat", "latency"),
        ("rc_rdma_read_bw", "bw"),
        ("rc_rdma_read_lat", "latency"),
        ("rc_rdma_write_bw", "bw"),
        ("rc_rdma_write_lat", "latency"),
        ("rc_rdma_write_poll_lat", "latency"),
        ("rc_compare_swap_mr", "msg_rate"),
        ("rc_fetch_add_mr", "msg_rate"),
        ("ver_rc_compare_swap", "msg_rate"),
        ("ver_rc_fetch_add", "msg_rate"),
    ] {
        let before = counters(&d, "srxe0");
        let mut cmd = d.command(&qperf);
        // The latency tests whose takes used to be refused run longer, so that those show.
        let secs = if test.ends_with("_lat") { "2" } else { "1" };
        cmd.args(["-lp", PORT, "-cm1", "-t", secs, "127.0.0.163", test]);
        let mut client = Logged::spawn(cmd, dir.join(format!("{test}.log")));
        let status = client.wait_for(Duration::from_secs(40));
        let out = client.output();
        let after = counters(&d, "srxe0");
        let (grants, refused) = (
            delta(&before, &after, "device_fast_grants"),
            delta(&before, &after, "device_fast_refused"),
        );
        assert!(
            status.is_some_and(|s| s.success()) && figure(&out, name).is_some_and(|v| v > 0.0),
            "qperf {test} ({status:?}; None: killed after 40 s):\n{out}\n--- server\n{}\n--- \
             daemon\n{}",
            server.output(),
            d.log()
        );
        // Waiting on events (every test but the one that polls), qperf arms its CQ again
        // before it posts: the fast path does not suit it, and once its CQ is seen to wait on
        // events (the second event an offer waited for) nothing is offered to it any more.
        // Offered after every event, each post asked for a take in vain: 15-30 refusals in
        // a debug run of rc_lat (every 5 ms a QP may ask), 600 a second in a release one,
        // and its latency 22 us against 15-18 us with SOFTROCE_FAST_PATH=0.
        if test.contains("poll") {
            assert!(grants >= 1, "{test} polls and was not granted a direction");
        } else {
            assert!(
                refused <= 6,
                "{test}: {refused} takes refused, {grants} granted\n{}",
                d.log()
            );
        }
    }
    assert!(
        server.wait_for(Duration::ZERO).is_none(),
        "the qperf server exited:\n{}",
        server.output()
    );
}
