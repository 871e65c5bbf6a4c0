//! Crashes on either side of the control socket.
//!
//! - Clients killed with SIGKILL at random moments of a 1,000-transfer `ibv_rc_pingpong`
//!   (the client, the server or both) leak nothing in the daemon: `softroce res show` lists no
//!   client of theirs once they are gone, and the daemon's RSS comes back to where it was
//!   after a warm-up run (printed; the seed of the random moments too).
//! - The daemon killed while clients run: busy-polling and event-driven pingpongs and a C
//!   program blocked in `ibv_get_cq_event` all get errors from their verbs and exit (the C
//!   program also sees IBV_EVENT_DEVICE_FATAL), none hangs; once the daemon is back on the
//!   same socket a new process moves data.

mod shim_support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use shim_support::programs::{scratch, tcp_listening, Logged};
use shim_support::{check_output, compile_c, require_program, softroce_bin, Daemon};

/// Starts an `ibv_rc_pingpong` server and its client on `daemon`; `extra` are more flags.
fn pingpong_pair(daemon: &Daemon, port: u16, extra: &[&str], dir: &Path) -> (Logged, Logged) {
    let program = require_program("ibv_rc_pingpong");
    let port_s = port.to_string();
    let args: Vec<&str> = ["-d", "srxe0", "-g", "0", "-p", port_s.as_str()]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    let mut cmd = daemon.command(&program);
    cmd.args(&args);
    let mut server = Logged::spawn(cmd, dir.join(format!("server-{port}.log")));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !tcp_listening(port) {
        assert!(
            Instant::now() < deadline && server.wait_for(Duration::ZERO).is_none(),
            "server never listened:\n{}",
            server.output()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut cmd = daemon.command(&program);
    cmd.args(&args).arg("127.0.0.1");
    let client = Logged::spawn(cmd, dir.join(format!("client-{port}.log")));
    (server, client)
}

/// The rows of `softroce res show` for `program`: (pid, pd, mr, cq, qp).
fn clients_of(daemon: &Daemon, program: &str) -> Vec<Vec<String>> {
    let out = Command::new(softroce_bin())
        .args(["res", "show", "--socket"])
        .arg(&daemon.socket)
        .output()
        .expect("softroce res show");
    check_output("softroce res show", out)
        .lines()
        .filter(|l| l.split_whitespace().nth(3) == Some(program))
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

/// The daemon's resident set, in KiB.
fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS")
}

/// xorshift64*: the test's random moments, reproducible from the printed seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
    }
}

fn kill9(p: &mut Logged) {
    p.kill();
}

#[test]
fn clients_killed_mid_transfer_leak_nothing() {
    let daemon = Daemon::start("crash-kill", &["--addr", "127.0.0.51", "--port", "4791"]);
    let dir = scratch("crashes", "kill");
    let seed = std::env::var("SOFTROCE_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    println!("SOFTROCE_CRASH_SEED={seed}");
    let mut rng = Rng(seed);
    let iters = ["-n", "1000"];

    // Warm-up: one whole run, to time it and to let the daemon reach its working size.
    let started = Instant::now();
    let (mut s, mut c) = pingpong_pair(&daemon, 18650, &iters, &dir);
    let ok = c
        .wait_for(Duration::from_secs(120))
        .is_some_and(|x| x.success())
        && s.wait_for(Duration::from_secs(30))
            .is_some_and(|x| x.success());
    assert!(ok, "warm-up run:\n{}\n{}", s.output(), c.output());
    let run = started.elapsed();
    let gone = |daemon: &Daemon| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = clients_of(daemon, "ibv_rc_pingpong");
            if left.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "killed clients still hold resources:\n{left:?}\n{}",
                daemon.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    gone(&daemon);
    std::thread::sleep(Duration::from_millis(300));
    let baseline = rss_kib(daemon.pid());

    const ROUNDS: u16 = 24;
    let mut halfway = 0;
    for round in 0..ROUNDS {
        let (mut s, mut c) = pingpong_pair(&daemon, 18651 + round, &iters, &dir);
        std::thread::sleep(Duration::from_micros(rng.below(run.as_micros() as u64)));
        match round % 3 {
            0 => kill9(&mut c),
            1 => kill9(&mut s),
            _ => {
                kill9(&mut c);
                kill9(&mut s);
            }
        }
        // The survivor fails on its own (its peer's QP is gone) or is killed too: either way
        // the daemon frees a client, which is what the rounds are for. (A server whose client
        // was killed waits for receives for ever: five seconds each cost the suite 40 s.)
        for p in [&mut s, &mut c] {
            if p.wait_for(Duration::from_millis(1500)).is_none() {
                kill9(p);
            }
        }
        gone(&daemon);
        if round == ROUNDS / 2 {
            std::thread::sleep(Duration::from_millis(300));
            halfway = rss_kib(daemon.pid());
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let end = rss_kib(daemon.pid());
    println!(
        "daemon RSS: {baseline} KiB after the warm-up, {halfway} KiB after {} kills, {end} KiB after {ROUNDS}",
        ROUNDS / 2 + 1
    );
    assert!(
        end <= baseline + 4096 && end <= halfway + 2048,
        "the daemon's RSS grew: {baseline} -> {halfway} -> {end} KiB"
    );
    // And it still serves.
    let (mut s, mut c) = pingpong_pair(&daemon, 18680, &iters, &dir);
    assert!(
        c.wait_for(Duration::from_secs(120))
            .is_some_and(|x| x.success())
            && s.wait_for(Duration::from_secs(30))
                .is_some_and(|x| x.success()),
        "after the kills:\n{}\n{}",
        s.output(),
        c.output()
    );
}

/// Sends to itself 100 times, waiting for each completion in `ibv_get_cq_event`, then blocks
/// there with nothing outstanding (so the daemon's death always finds it in the wait: while
/// it ran the loop, the kill could also meet it in `ibv_poll_cq`, which answers ENODEV), with
/// a thread waiting for async events; reports what it sees when the daemon goes.
const BLOCKED: &str = r#"
#include <infiniband/verbs.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static struct ibv_context *ctx;

static void *async_thread(void *arg)
{
    (void)arg;
    struct ibv_async_event ev;
    if (ibv_get_async_event(ctx, &ev) == 0) {
        printf("async event %d\n", (int)ev.event_type);
        fflush(stdout);
        ibv_ack_async_event(&ev);
    }
    return NULL;
}

static int to_rts(struct ibv_qp *qp, uint32_t remote, union ibv_gid gid)
{
    struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        return -1;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR; a.path_mtu = IBV_MTU_1024; a.dest_qp_num = remote;
    a.max_dest_rd_atomic = 1; a.min_rnr_timer = 1;
    a.ah_attr.is_global = 1; a.ah_attr.grh.dgid = gid; a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                              IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        return -1;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS; a.timeout = 14; a.retry_cnt = 7; a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                 IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

int main(void)
{
    int n;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list || n != 1 || !(ctx = ibv_open_device(list[0])))
        return 2;
    union ibv_gid gid;
    ibv_query_gid(ctx, 1, 0, &gid);
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    static char buf[4096];
    struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
    struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, ch, 0);
    struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
        .cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 } };
    struct ibv_qp *qa = ibv_create_qp(pd, &ia), *qb = ibv_create_qp(pd, &ia);
    if (!mr || !cq || !qa || !qb || to_rts(qa, qb->qp_num, gid) || to_rts(qb, qa->qp_num, gid))
        return 3;
    pthread_t t;
    pthread_create(&t, NULL, async_thread, NULL);
    printf("ready\n");
    fflush(stdout);
    for (uint64_t i = 0; i < 100; i++) {
        struct ibv_sge s = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey };
        struct ibv_recv_wr rw = { .wr_id = i, .sg_list = &s, .num_sge = 1 }, *rbad;
        struct ibv_send_wr sw = { .wr_id = i, .sg_list = &s, .num_sge = 1,
                                  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *sbad;
        if (ibv_post_recv(qb, &rw, &rbad)) { printf("post_recv failed errno %d\n", errno); break; }
        if (ibv_req_notify_cq(cq, 0)) { printf("req_notify failed\n"); break; }
        if (ibv_post_send(qa, &sw, &sbad)) { printf("post_send failed errno %d\n", errno); break; }
        int done = 0;
        while (done < 2) {
            struct ibv_cq *ev_cq; void *ev_ctx;
            struct ibv_wc wc[2];
            int k = ibv_poll_cq(cq, 2, wc);
            if (k < 0) { printf("poll_cq failed errno %d\n", errno); goto out; }
            done += k;
            if (done >= 2)
                break;
            if (ibv_get_cq_event(ch, &ev_cq, &ev_ctx)) {
                printf("get_cq_event failed errno %d\n", errno);
                goto out;
            }
            ibv_ack_cq_events(ev_cq, 1);
            if (ibv_req_notify_cq(cq, 0)) { printf("req_notify failed\n"); goto out; }
        }
    }
    {
        struct ibv_cq *ev_cq; void *ev_ctx;
        if (ibv_req_notify_cq(cq, 0) || ibv_get_cq_event(ch, &ev_cq, &ev_ctx))
            printf("get_cq_event failed errno %d\n", errno);
        else
            printf("an event with nothing outstanding\n");
    }
out:
    pthread_join(t, NULL);
    fflush(stdout);
    return 1;
}
"#;

#[test]
fn a_daemon_restart_fails_running_clients_and_serves_new_ones() {
    let exe = compile_c("shim_blocked", BLOCKED, &["ibverbs", "pthread"]);
    let args = ["--addr", "127.0.0.52", "--port", "4791"];
    let mut daemon = Daemon::start("crash-restart", &args);
    let dir = scratch("crashes", "restart");
    let long = ["-n", "100000000"];
    let (mut s1, mut c1) = pingpong_pair(&daemon, 18690, &long, &dir);
    let events: Vec<&str> = ["-e"].into_iter().chain(long).collect();
    let (mut s2, mut c2) = pingpong_pair(&daemon, 18691, &events, &dir);
    let mut blocked = Logged::spawn(daemon.command(&exe), dir.join("blocked.log"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !blocked.output().contains("ready") {
        assert!(
            Instant::now() < deadline && blocked.wait_for(Duration::ZERO).is_none(),
            "the C program did not get ready:\n{}",
            blocked.output()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    for p in [&mut s1, &mut c1, &mut s2, &mut c2] {
        assert!(p.wait_for(Duration::ZERO).is_none(), "{}", p.output());
    }

    let killed = Instant::now();
    daemon.stop_with(libc::SIGKILL);
    let mut outcomes = Vec::new();
    for (name, p) in [
        ("busy-poll server", &mut s1),
        ("busy-poll client", &mut c1),
        ("event server", &mut s2),
        ("event client", &mut c2),
        ("blocked C program", &mut blocked),
    ] {
        let status = p.wait_for(Duration::from_secs(20));
        assert!(
            status.is_some(),
            "{name} still runs 20 s after the daemon died:\n{}",
            p.output()
        );
        assert!(
            !status.unwrap().success(),
            "{name} exited 0 without its device:\n{}",
            p.output()
        );
        outcomes.push(format!("{name}: {:?}", killed.elapsed()));
    }
    println!("exited after the daemon's SIGKILL: {}", outcomes.join(", "));
    let out = blocked.output();
    assert!(
        out.contains("async event 8") && out.contains("get_cq_event failed errno 5"),
        "IBV_EVENT_DEVICE_FATAL and EIO from ibv_get_cq_event:\n{out}"
    );

    // Back on the same socket: a new process works.
    let daemon = Daemon::start("crash-restart", &args);
    let (mut s, mut c) = pingpong_pair(&daemon, 18692, &["-n", "100"], &dir);
    assert!(
        c.wait_for(Duration::from_secs(60))
            .is_some_and(|x| x.success())
            && s.wait_for(Duration::from_secs(30))
                .is_some_and(|x| x.success()),
        "after the restart:\n{}\n{}",
        s.output(),
        c.output()
    );
}
