//! `softroce stat` and `softroce res show` with unmodified programs: the counters (rxe's
//! names) move as they should through a pingpong, under injected loss and duplication
//! (sequence errors, duplicates, retries) and on an R_Key violation (mlx5's access error
//! counters); `res show qp` lists a running pingpong's QPs with its pids and command, per-QP
//! counters are there while it runs, and nothing is listed once it has exited. Between two
//! daemons the counters move with the traffic, which each daemon's device thread receives
//! itself.

mod shim_support;

use shim_support::operator::{counters, delta, softroce, softroce_json, softroce_ok, ProgramPair};
use shim_support::programs::{gbn_loopback_daemon, loopback_daemon};
use shim_support::{check_output, compile_c, Daemon};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[test]
fn a_pingpong_moves_the_packet_and_message_counters() {
    let d = loopback_daemon("op-stat-pp", 110);
    let before = counters(&d, "srxe0");
    ProgramPair::start(
        &d,
        &d,
        "ibv_rc_pingpong",
        19510,
        &["-d", "srxe0", "-g", "0", "-n", "100"],
        "stat-pp",
    )
    .succeed(Duration::from_secs(60), &d);
    let after = counters(&d, "srxe0");
    let sent = delta(&before, &after, "sent_pkts");
    let rcvd = delta(&before, &after, "rcvd_pkts");
    // 100 iterations, a SEND each way each, every one acknowledged: 400 packets at least,
    // all between two QPs of this device, so each one sent is also received.
    assert!(sent >= 400, "{sent} packets sent: {after:?}");
    assert_eq!(sent, rcvd, "{after:?}");
    assert_eq!(delta(&before, &after, "rdma_sends"), 200);
    assert_eq!(delta(&before, &after, "rdma_recvs"), 200);
    assert!(delta(&before, &after, "sent_bytes") > 200 * 4096);
    for quiet in [
        "duplicate_request",
        "out_of_seq_request",
        "rcvd_seq_err",
        "completer_retry_err",
        "icrc_errors",
    ] {
        assert_eq!(delta(&before, &after, quiet), 0, "{quiet}: {after:?}");
    }
    // Every rxe counter is shown by its name, and the congestion and drop counters.
    for name in [
        "sent_pkts",
        "rcvd_pkts",
        "duplicate_request",
        "out_of_seq_request",
        "rcvd_rnr_err",
        "send_rnr_err",
        "rcvd_seq_err",
        "ack_deferred",
        "retry_exceeded_err",
        "retry_rnr_exceeded_err",
        "completer_retry_err",
        "send_err",
        "link_downed",
        "rdma_sends",
        "rdma_recvs",
        "icrc_errors",
        "net.rx_bad_icrc",
    ] {
        assert!(after.contains_key(name), "no counter {name}: {after:?}");
    }
    let text = softroce_ok(&d, &["stat"]);
    assert!(text.starts_with("link srxe0/1 sent_pkts "), "{text}");
    // -w: rates, then interrupted.
    let mut watch = std::process::Command::new(shim_support::softroce_bin())
        .args(["stat", "srxe0", "-w", "0.2"])
        .env("SOFTROCE_SOCKET", &d.socket)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    let _ = watch.kill();
    let out = watch.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.lines().count() >= 2 && out.lines().all(|l| l.starts_with("link srxe0/1 ")),
        "{out}"
    );
}

/// The voluntary context switches of a daemon's main thread (which only accepts clients).
fn main_thread_wakes(d: &shim_support::Daemon) -> u64 {
    let pid = d.pid();
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("voluntary_ctxt_switches of the daemon's main thread")
}

/// Between two daemons the receive counters move with the packets, and each daemon's packet
/// I/O is its device thread's: the main thread, which built the device and only accepts
/// clients, is not woken for the datagrams. (io_uring runs a multishot receive's work on
/// the thread that submitted it; when the main thread armed the receives, it was woken for
/// every batch.)
#[test]
fn two_daemons_count_the_traffic_and_receive_it_on_their_device_threads() {
    let a = loopback_daemon("op-stat-two-a", 117);
    let b = loopback_daemon("op-stat-two-b", 118);
    let (before_a, before_b) = (counters(&a, "srxe0"), counters(&b, "srxe0"));
    let (wakes_a, wakes_b) = (main_thread_wakes(&a), main_thread_wakes(&b));
    ProgramPair::start(
        &b,
        &a,
        "ib_write_bw",
        19515,
        &["-d", "srxe0", "-x", "0", "-F", "-s", "65536", "-n", "500"],
        "stat-two",
    )
    .succeed(Duration::from_secs(120), &a);
    let (after_a, after_b) = (counters(&a, "srxe0"), counters(&b, "srxe0"));
    let sent = delta(&before_a, &after_a, "sent_pkts");
    let rcvd = delta(&before_b, &after_b, "rcvd_pkts");
    assert!(sent >= 500 * 16, "16 packets per 64 KiB message: {sent}");
    assert!(rcvd >= 500 * 16, "{rcvd}");
    assert!(delta(&before_b, &after_b, "net.rx_packets") >= rcvd);
    // A client connects to each daemon for its context (and its CM, if any): a few wakes of
    // the main thread. Thousands of datagram batches arrived meanwhile.
    let (woken_a, woken_b) = (
        main_thread_wakes(&a) - wakes_a,
        main_thread_wakes(&b) - wakes_b,
    );
    assert!(
        woken_a <= 20 && woken_b <= 20,
        "the main threads were woken {woken_a} (sender) and {woken_b} (receiver) times for \
         {rcvd} packets received"
    );
}

/// `PROGRAM -s SIZE -n ITERS` between `server` and `client` (two daemons that switch to
/// selective retransmission with each other); the client's daemon's counters before and
/// after.
fn selective_run(
    server: &Daemon,
    client: &Daemon,
    program: &str,
    port: u16,
    size: &str,
    iters: &str,
) -> (BTreeMap<String, u64>, BTreeMap<String, u64>) {
    let before = counters(client, "srxe0");
    ProgramPair::start(
        server,
        client,
        program,
        port,
        &["-d", "srxe0", "-x", "0", "-F", "-s", size, "-n", iters],
        &format!("stat-{program}-{port}"),
    )
    .succeed(Duration::from_secs(120), client);
    let after = counters(client, "srxe0");
    assert!(
        client.log().contains("QP uses selective retransmission"),
        "the daemons did not switch to selective retransmission:\n{}",
        client.log()
    );
    (before, after)
}

/// Between two daemons (which use selective retransmission with each other) an unmodified
/// `ib_write_bw -s 1048576` does not wait for the probe timer: the requester asks for an ACK
/// at least every half window. The daemons run with `--selective-bdp 131072` (the default
/// until 2026-12-06), a window of 32 packets at MTU 4096: when the requester asked only
/// every 64 packets, each 1 MiB message filled that window unasked and waited for probes,
/// about 8 per message (`sel_probes`), all answered by duplicates.
#[test]
fn two_daemons_move_long_messages_without_probing() {
    let small_window = |name: &str, addr: &str| {
        Daemon::start(
            name,
            &[
                "--addr",
                addr,
                "--port",
                "4791",
                "--selective-bdp",
                "131072",
            ],
        )
    };
    let a = small_window("op-stat-long-a", "127.0.0.125");
    let b = small_window("op-stat-long-b", "127.0.0.126");
    let (before, after) = selective_run(&b, &a, "ib_write_bw", 19516, "1048576", "100");
    let sent = delta(&before, &after, "sent_pkts");
    assert!(sent >= 100 * 256, "256 packets per 1 MiB message: {sent}");
    // Lossless: a probe now and then (a round trip longer than the probe timer on a busy
    // machine: 0.6-0.7 per message here), not one per window (7-8 per message).
    let (probes, messages) = (delta(&before, &after, "sel_probes"), sent / 256);
    assert!(
        probes <= 2 * messages,
        "{probes} probes for {messages} messages"
    );
}

/// A responder whose packets are late (here every one it sends held back 20 ms, as a peer
/// daemon waiting for a CPU behind a long READ): the requester's probe timer fires while
/// the READ responses are on their way. Each probe may cost a duplicate packet, not a
/// second copy of the READ: asking for every missing response made the responder send the
/// rest of a long READ again (between two daemons, MPICH's 1 MiB rendezvous READs drew
/// 20,000 duplicate responses in 100 round trips, `drop_response_ignored`).
#[test]
fn two_daemons_answer_a_late_read_once() {
    let a = loopback_daemon("op-stat-lateread-a", 170);
    let b = loopback_daemon("op-stat-lateread-b", 171);
    // The server (b) is the READs' responder.
    softroce_ok(&b, &["fault", "srxe0", "delay", "20", "--direction", "tx"]);
    let (before, after) = selective_run(&b, &a, "ib_read_bw", 19517, "262144", "40");
    let probes = delta(&before, &after, "sel_probes");
    let ignored = delta(&before, &after, "drop_response_ignored");
    let rcvd = delta(&before, &after, "rcvd_pkts");
    // The delay is longer than any probe timeout before a round trip was measured (1 ms):
    // the READs' first round of responses is probed for.
    assert!(probes >= 1, "no probe: the test shows nothing");
    assert!(rcvd >= 40 * 64, "64 responses per 256 KiB READ: {rcvd}");
    // Before: one probe asked again for every READ outstanding (perftest keeps 16), each
    // answered whole (64 packets).
    assert!(
        ignored <= 4 * probes,
        "{ignored} duplicate responses for {probes} probes"
    );
}

#[test]
fn injected_loss_shows_as_sequence_errors_duplicates_and_retries() {
    let a = gbn_loopback_daemon("op-stat-loss-a", 111);
    let b = gbn_loopback_daemon("op-stat-loss-b", 112);
    softroce_ok(
        &a,
        &[
            "fault",
            "srxe0",
            "drop",
            "--rate",
            "0.02",
            "--direction",
            "tx",
        ],
    );
    softroce_ok(
        &a,
        &[
            "fault",
            "srxe0",
            "duplicate",
            "--rate",
            "2%",
            "--direction",
            "tx",
        ],
    );
    let (ba, bb) = (counters(&a, "srxe0"), counters(&b, "srxe0"));
    // The server on B, the client (the sender of the WRITEs) on A.
    ProgramPair::start(
        &b,
        &a,
        "ib_write_bw",
        19511,
        &["-d", "srxe0", "-x", "0", "-F", "-s", "65536", "-n", "300"],
        "stat-loss",
    )
    .succeed(Duration::from_secs(120), &a);
    let (aa, ab) = (counters(&a, "srxe0"), counters(&b, "srxe0"));
    assert!(delta(&bb, &ab, "out_of_seq_request") > 0, "B: {ab:?}");
    assert!(delta(&bb, &ab, "duplicate_request") > 0, "B: {ab:?}");
    assert!(delta(&ba, &aa, "rcvd_seq_err") > 0, "A: {aa:?}");
    // Go-back-N: A sent more than B took in order.
    assert!(delta(&ba, &aa, "sent_pkts") > 300 * 16, "A: {aa:?}");
    let faults = softroce_json(&a, &["fault", "show"]);
    let rules = faults[0]["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 2);
    assert!(
        rules.iter().all(|r| r["injected"].as_u64() > Some(0)),
        "{faults}"
    );
    softroce_ok(&a, &["fault", "srxe0", "clear"]);
    assert_eq!(
        softroce_json(&a, &["fault", "show", "srxe0"])[0]["rules"],
        serde_json::json!([])
    );
}

/// Two RC QPs of one process connected to each other; an RDMA WRITE with a wrong R_Key.
const RKEY_VIOLATION: &str = r#"
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static union ibv_gid gid;

static int to_rts(struct ibv_qp *qp, uint32_t remote) {
    struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
                             .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        return -1;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR; a.path_mtu = IBV_MTU_1024; a.dest_qp_num = remote;
    a.min_rnr_timer = 1; a.ah_attr.is_global = 1; a.ah_attr.grh.dgid = gid;
    a.ah_attr.grh.hop_limit = 64; a.ah_attr.port_num = 1;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                      IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        return -1;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS; a.timeout = 10; a.retry_cnt = 7; a.rnr_retry = 7;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                         IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

int main(void) {
    struct ibv_device **list = ibv_get_device_list(NULL);
    struct ibv_context *ctx = list ? ibv_open_device(list[0]) : NULL;
    if (!ctx || ibv_query_gid(ctx, 1, 0, &gid)) { printf("FAIL open\n"); return 1; }
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    char *a = calloc(1, 4096), *b = calloc(1, 4096);
    struct ibv_mr *am = ibv_reg_mr(pd, a, 4096, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mr *bm = ibv_reg_mr(pd, b, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
        .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
    struct ibv_qp *qa = ibv_create_qp(pd, &ia), *qb = ibv_create_qp(pd, &ia);
    if (!am || !bm || !qa || !qb || to_rts(qa, qb->qp_num) || to_rts(qb, qa->qp_num)) {
        printf("FAIL setup\n"); return 1;
    }
    struct ibv_sge s = { .addr = (uintptr_t)a, .length = 64, .lkey = am->lkey };
    struct ibv_send_wr w = { .wr_id = 1, .sg_list = &s, .num_sge = 1,
        .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED }, *bad;
    w.wr.rdma.remote_addr = (uintptr_t)b;
    w.wr.rdma.rkey = bm->rkey ^ 0x100;
    if (ibv_post_send(qa, &w, &bad)) { printf("FAIL post\n"); return 1; }
    struct ibv_wc wc;
    time_t end = time(NULL) + 10;
    int n = 0;
    while (n == 0 && time(NULL) < end) n = ibv_poll_cq(cq, 1, &wc);
    if (n != 1) { printf("FAIL no completion\n"); return 1; }
    printf("status %s\n", ibv_wc_status_str(wc.status));
    return 0;
}
"#;

#[test]
fn an_rkey_violation_counts_remote_access_errors() {
    let exe = compile_c("op_rkey_violation", RKEY_VIOLATION, &["ibverbs"]);
    let d = loopback_daemon("op-stat-rkey", 113);
    let before = counters(&d, "srxe0");
    let out = d.run_preloaded(&exe, &[]);
    assert_eq!(out.trim(), "status remote access error", "{}", d.log());
    let after = counters(&d, "srxe0");
    assert_eq!(
        delta(&before, &after, "req_remote_access_errors"),
        1,
        "{after:?}"
    );
    assert_eq!(
        delta(&before, &after, "resp_remote_access_errors"),
        1,
        "{after:?}"
    );
    assert_eq!(delta(&before, &after, "rdma_recvs"), 0);
}

fn qp_rows(d: &shim_support::Daemon) -> Vec<serde_json::Value> {
    softroce_json(d, &["res", "show", "qp"])
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn res_show_lists_a_running_pingpongs_qps_with_its_pids_and_not_after() {
    let d = loopback_daemon("op-res-pp", 114);
    assert!(qp_rows(&d).is_empty());
    let mut pair = ProgramPair::start(
        &d,
        &d,
        "ibv_rc_pingpong",
        19512,
        &["-d", "srxe0", "-g", "0", "-n", "1000000"],
        "res-pp",
    );
    let pids = [pair.server.child.id(), pair.client.child.id()];
    let deadline = Instant::now() + Duration::from_secs(20);
    let rows = loop {
        let rows = qp_rows(&d);
        if rows.len() == 2 && rows.iter().all(|r| r["state"] == "RTS") {
            break rows;
        }
        assert!(
            Instant::now() < deadline,
            "the pingpong's QPs never showed: {rows:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut shown: Vec<u64> = rows.iter().map(|r| r["pid"].as_u64().unwrap()).collect();
    shown.sort();
    let mut expect: Vec<u64> = pids.iter().map(|p| u64::from(*p)).collect();
    expect.sort();
    assert_eq!(shown, expect, "{rows:?}");
    for r in &rows {
        assert_eq!(r["comm"], "ibv_rc_pingpong");
        assert_eq!(r["type"], "RC");
        assert_eq!(r["ifname"], "srxe0");
    }
    // Each QP's peer is the other one.
    assert_eq!(rows[0]["rqpn"], rows[1]["lqpn"]);
    assert_eq!(rows[1]["rqpn"], rows[0]["lqpn"]);
    // Per-QP counters, while it runs.
    let qpn = rows[0]["lqpn"].as_u64().unwrap().to_string();
    let per_qp = softroce_json(&d, &["stat", "srxe0", "qp", &qpn]);
    assert_eq!(
        per_qp[0]["lqpn"].as_u64().map(|q| q.to_string()),
        Some(qpn.clone())
    );
    assert!(per_qp[0]["rcvd_pkts"].as_u64() > Some(0), "{per_qp}");
    assert!(per_qp[0]["sent_pkts"].as_u64() > Some(0), "{per_qp}");
    // The other kinds, with their owners, each numbered once on the device (two processes
    // each have a first PD, CQ and MR, as on a kernel device), and the QPs' `pdn` and CQ
    // numbers name rows of those lists, of the same process.
    let mut numbered = std::collections::BTreeMap::new();
    for (kind, field) in [("cq", "cqn"), ("mr", "mrn"), ("pd", "pdn")] {
        let rows = softroce_json(&d, &["res", "show", kind]);
        let rows = rows.as_array().unwrap();
        assert!(rows.len() >= 2, "res show {kind}: {rows:?}");
        assert!(
            rows.iter()
                .all(|r| expect.contains(&r["pid"].as_u64().unwrap())),
            "{rows:?}"
        );
        let mut numbers: Vec<(u64, u64)> = rows
            .iter()
            .map(|r| (r[field].as_u64().unwrap(), r["pid"].as_u64().unwrap()))
            .collect();
        numbers.sort();
        numbers.dedup_by_key(|(n, _)| *n);
        assert_eq!(numbers.len(), rows.len(), "{field} repeated: {rows:?}");
        numbered.insert(field, numbers);
    }
    for r in &rows {
        let pid = r["pid"].as_u64().unwrap();
        for (field, list) in [("pdn", "pdn"), ("send-cqn", "cqn"), ("recv-cqn", "cqn")] {
            let n = r[field].as_u64().unwrap();
            assert!(
                numbered[list].contains(&(n, pid)),
                "the QP's {field} {n} is no {list} of pid {pid}: {r} {numbered:?}"
            );
        }
    }
    let text = softroce_ok(&d, &["res", "show", "qp"]);
    assert!(
        text.lines()
            .all(|l| l.starts_with("link srxe0/1 lqpn ") && l.contains(" comm ibv_rc_pingpong")),
        "{text}"
    );
    // The summary keeps its columns (other tests read them).
    let summary = check_output("res show", softroce(&d, &["res", "show"]));
    assert!(
        summary
            .lines()
            .filter(|l| l.contains("ibv_rc_pingpong"))
            .count()
            == 2,
        "{summary}"
    );

    pair.client.kill();
    pair.server.kill();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !qp_rows(&d).is_empty() {
        assert!(
            Instant::now() < deadline,
            "QPs still listed after the pingpong ended: {:?}",
            qp_rows(&d)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        softroce(&d, &["stat", "srxe0", "qp", &qpn]).status.code(),
        Some(1)
    );
}

#[test]
fn res_show_cm_id_lists_a_listening_rping_with_its_pid() {
    let d = loopback_daemon("op-res-cmid", 116);
    let dir = shim_support::programs::scratch("operator", "res-cmid");
    let mut cmd = d.command(&shim_support::require_program("rping"));
    cmd.args(["-s", "-a", "127.0.0.116", "-p", "19514", "-C", "1"]);
    let mut rping = shim_support::programs::Logged::spawn(cmd, dir.join("rping.log"));
    let pid = u64::from(rping.child.id());
    let deadline = Instant::now() + Duration::from_secs(20);
    let row = loop {
        let rows = softroce_json(&d, &["res", "show", "cm_id"]);
        if let Some(r) = rows
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["state"] == "LISTEN")
        {
            break r.clone();
        }
        assert!(
            Instant::now() < deadline,
            "rping's listener never showed: {rows}\n{}",
            rping.output()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(row["pid"].as_u64(), Some(pid), "{row}");
    assert_eq!(row["comm"], "rping");
    assert_eq!(row["ps"], "TCP");
    assert_eq!(row["src-addr"], "127.0.0.116:19514");
    rping.kill();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !softroce_json(&d, &["res", "show", "cm_id"])
        .as_array()
        .unwrap()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "the id outlived rping");
        std::thread::sleep(Duration::from_millis(50));
    }
}
