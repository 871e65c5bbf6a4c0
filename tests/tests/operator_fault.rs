//! `softroce fault`: each kind observed by an unmodified program as it would be on hardware.
//! Lost, duplicated, delayed, reordered and corrupted packets: the program completes
//! correctly and the retransmission counters show what the transport did. An RNR NAK: the
//! requester waits and retries (RNR counters). A remote access error NAK: `ib_write_bw`
//! reports the error completion. Rules also come from the config.

mod shim_support;

use shim_support::operator::{counters, delta, softroce_json, softroce_ok, ProgramPair};
use shim_support::programs::{gbn_loopback_daemon, scratch};
use shim_support::Daemon;
use std::collections::BTreeMap;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

/// `ibv_rc_pingpong -n ITERS` on one daemon (engine to engine), with `fault` added first;
/// returns the counters' deltas, checking that the pingpong succeeded.
fn pingpong_under(
    d: &Daemon,
    fault: &[&str],
    port: u16,
    iters: &str,
    name: &str,
) -> BTreeMap<String, u64> {
    let mut args = vec!["fault", "srxe0"];
    args.extend_from_slice(fault);
    softroce_ok(d, &args);
    let before = counters(d, "srxe0");
    ProgramPair::start(
        d,
        d,
        "ibv_rc_pingpong",
        port,
        &["-d", "srxe0", "-g", "0", "-n", iters],
        name,
    )
    .succeed(LIMIT, d);
    let after = counters(d, "srxe0");
    let injected = softroce_json(d, &["fault", "show", "srxe0"])[0]["rules"][0]["injected"]
        .as_u64()
        .unwrap();
    assert!(injected > 0, "the rule took no packet");
    softroce_ok(d, &["fault", "srxe0", "clear"]);
    let mut out: BTreeMap<String, u64> = after
        .keys()
        .map(|k| (k.clone(), delta(&before, &after, k)))
        .collect();
    out.insert("injected".into(), injected);
    out
}

/// `ib_write_bw` from daemon A to daemon B with `fault` on A; returns A's and B's deltas.
fn write_bw_under(
    a: &Daemon,
    b: &Daemon,
    fault: &[&str],
    port: u16,
    name: &str,
) -> (BTreeMap<String, u64>, BTreeMap<String, u64>) {
    let mut args = vec!["fault", "srxe0"];
    args.extend_from_slice(fault);
    softroce_ok(a, &args);
    let (ba, bb) = (counters(a, "srxe0"), counters(b, "srxe0"));
    ProgramPair::start(
        b,
        a,
        "ib_write_bw",
        port,
        &["-d", "srxe0", "-x", "0", "-F", "-s", "65536", "-n", "200"],
        name,
    )
    .succeed(LIMIT, a);
    let (aa, ab) = (counters(a, "srxe0"), counters(b, "srxe0"));
    softroce_ok(a, &["fault", "srxe0", "clear"]);
    let d = |x: &BTreeMap<String, u64>, y: &BTreeMap<String, u64>| -> BTreeMap<String, u64> {
        y.keys().map(|k| (k.clone(), delta(x, y, k))).collect()
    };
    (d(&ba, &aa), d(&bb, &ab))
}

#[test]
fn dropped_packets_are_retransmitted() {
    let d = gbn_loopback_daemon("op-fault-drop", 130);
    let c = pingpong_under(&d, &["drop", "--next", "4"], 19530, "50", "fault-drop");
    assert_eq!(c["injected"], 4);
    // Each loss is repaired by the requester's timer: a retry, and for a lost ACK a
    // duplicate at the responder.
    assert!(c["completer_retry_err"] >= 1, "{c:?}");
    assert!(
        c["sent_pkts"] > c["rcvd_pkts"],
        "lost packets were sent, not received: {c:?}"
    );
}

#[test]
fn duplicated_packets_are_answered_not_executed_twice() {
    let d = gbn_loopback_daemon("op-fault-dup", 131);
    let c = pingpong_under(&d, &["duplicate", "--next", "20"], 19531, "50", "fault-dup");
    assert_eq!(c["injected"], 20);
    assert!(c["duplicate_request"] >= 1, "{c:?}");
    assert!(c["rcvd_pkts"] > c["sent_pkts"], "{c:?}");
    assert_eq!(c["rdma_recvs"], 100, "every message received once: {c:?}");
}

#[test]
fn delayed_packets_beyond_the_ack_timeout_are_retried() {
    let d = gbn_loopback_daemon("op-fault-delay", 132);
    // rc_pingpong's ACK timeout is 14 (67 ms): a 150 ms delay outlives it, and the run
    // (5000 round trips) outlives the delay, so the late originals arrive while it goes on.
    let c = pingpong_under(
        &d,
        &["delay", "150", "--next", "2"],
        19532,
        "5000",
        "fault-delay",
    );
    assert_eq!(c["injected"], 2);
    assert!(c["completer_retry_err"] >= 1, "{c:?}");
    assert!(
        c["duplicate_request"] >= 1,
        "the late original arrives after its retry: {c:?}"
    );
}

#[test]
fn reordered_packets_are_sequence_errors_that_are_repaired() {
    let a = gbn_loopback_daemon("op-fault-reorder-a", 133);
    let b = gbn_loopback_daemon("op-fault-reorder-b", 134);
    let (ca, cb) = write_bw_under(
        &a,
        &b,
        &["reorder", "--rate", "0.02", "--direction", "tx"],
        19533,
        "fault-reorder",
    );
    assert!(cb["out_of_seq_request"] >= 1, "B: {cb:?}");
    assert!(ca["rcvd_seq_err"] >= 1, "A: {ca:?}");
}

#[test]
fn corrupted_packets_fail_the_icrc_and_are_retransmitted() {
    let a = gbn_loopback_daemon("op-fault-corrupt-a", 135);
    let b = gbn_loopback_daemon("op-fault-corrupt-b", 136);
    let (ca, cb) = write_bw_under(
        &a,
        &b,
        &["corrupt", "--next", "5", "--direction", "tx"],
        19534,
        "fault-corrupt",
    );
    assert_eq!(
        cb["net.rx_bad_icrc"], 5,
        "B's ICRC check dropped them: {cb:?}"
    );
    assert!(
        ca["rcvd_seq_err"] + ca["completer_retry_err"] >= 1,
        "A: {ca:?}"
    );
    // On the same host the receiving engine drops them the same way.
    let d = gbn_loopback_daemon("op-fault-corrupt-local", 137);
    let c = pingpong_under(
        &d,
        &["corrupt", "--next", "3"],
        19535,
        "20",
        "fault-corrupt-local",
    );
    assert_eq!(c["net.rx_bad_icrc"], 3, "{c:?}");
    assert!(c["completer_retry_err"] >= 1, "{c:?}");
}

#[test]
fn forced_rnr_naks_make_the_requester_wait_and_retry() {
    let d = gbn_loopback_daemon("op-fault-rnr", 138);
    let c = pingpong_under(&d, &["rnr", "--next", "3"], 19536, "20", "fault-rnr");
    assert_eq!(c["injected"], 3);
    assert_eq!(c["send_rnr_err"], 3, "{c:?}");
    assert_eq!(c["rcvd_rnr_err"], 3, "{c:?}");
    assert_eq!(c["rdma_recvs"], 40, "{c:?}");
}

#[test]
fn a_forced_access_error_fails_ib_write_bw_as_a_bad_rkey_would() {
    let a = gbn_loopback_daemon("op-fault-access-a", 139);
    let b = gbn_loopback_daemon("op-fault-access-b", 140);
    // B's responder refuses A's first RDMA WRITE.
    softroce_ok(&b, &["fault", "srxe0", "access-error", "--next", "1"]);
    let pair = ProgramPair::start(
        &b,
        &a,
        "ib_write_bw",
        19537,
        &["-d", "srxe0", "-x", "0", "-F", "-s", "4096", "-n", "100"],
        "fault-access",
    );
    let (_, client_ok, report) = pair.finish(LIMIT);
    assert!(
        !client_ok,
        "ib_write_bw succeeded despite the access error:\n{report}"
    );
    // perftest: "Failed status 10: wr_id ... syndrom ..." (IBV_WC_REM_ACCESS_ERR = 10).
    assert!(report.contains("status 10"), "{report}");
    let ca = counters(&a, "srxe0");
    let cb = counters(&b, "srxe0");
    assert_eq!(ca["req_remote_access_errors"], 1, "{ca:?}");
    assert_eq!(cb["resp_remote_access_errors"], 1, "{cb:?}");
}

#[test]
fn fault_rules_can_come_from_the_config() {
    let dir = scratch("operator", "fault-config");
    let config = dir.join("softroce.toml");
    std::fs::write(
        &config,
        "[[device]]\nname = \"srxe0\"\naddr = [\"127.0.0.141\"]\n[[device.fault]]\nkind = \"rnr\"\nnext = 2\n",
    )
    .unwrap();
    let d = Daemon::start(
        "op-fault-config",
        &["--config", config.to_str().unwrap(), "--port", "4791"],
    );
    let shown = softroce_json(&d, &["fault", "show"]);
    assert_eq!(shown[0]["rules"][0]["kind"], "rnr", "{shown}");
    let before = counters(&d, "srxe0");
    ProgramPair::start(
        &d,
        &d,
        "ibv_rc_pingpong",
        19538,
        &["-d", "srxe0", "-g", "0", "-n", "10"],
        "fault-config",
    )
    .succeed(LIMIT, &d);
    let after = counters(&d, "srxe0");
    assert_eq!(delta(&before, &after, "rcvd_rnr_err"), 2, "{after:?}");
}
