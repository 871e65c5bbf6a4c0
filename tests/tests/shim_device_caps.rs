//! The device advertises what it does, and does what it advertises. A C program against the
//! real `<infiniband/verbs.h>`, under LD_PRELOAD, on a daemon started with small caps:
//! `ibv_query_device` reports the daemon's `--max-qp` / `--max-mr` (not constants of the
//! shim) and the verbs fail with ENOMEM past them; `IBV_ACCESS_ON_DEMAND` is refused with
//! EOPNOTSUPP and no ODP capability is reported; `IBV_DEVICE_SRQ_RESIZE` is advertised and
//! `ibv_modify_srq(IBV_SRQ_MAX_WR)` grows an SRQ that then holds and delivers more receives;
//! `ibv_resize_cq` grows a CQ holding completions, keeps them in order, and refuses to shrink
//! below what it holds (EINVAL, as rxe).

mod shim_support;

use shim_support::{compile_c, Daemon};

const PROGRAM: &str = r#"
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int failures, checks;
#define CHECK(cond, what) do { checks++; if (!(cond)) { failures++; \
    printf("FAIL line %d: %s (errno %d)\n", __LINE__, what, errno); fflush(stdout); } } while (0)

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* `n` completions from `c` within 10 s into `wc`; returns how many came. */
static int wait_n(struct ibv_cq *c, int n, struct ibv_wc *wc)
{
    int got = 0;
    double deadline = now() + 10;
    while (got < n && now() < deadline) {
        int k = ibv_poll_cq(c, n - got, wc + got);
        if (k < 0)
            return got;
        got += k;
    }
    return got;
}

static int to_rts(struct ibv_qp *qp, uint32_t remote_qpn)
{
    struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        return -1;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = remote_qpn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = gid;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                              IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        return -1;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                 IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static struct ibv_qp *make_qp(struct ibv_cq *scq, struct ibv_cq *rcq, struct ibv_srq *srq)
{
    struct ibv_qp_init_attr ia = { .send_cq = scq, .recv_cq = rcq, .srq = srq,
                                   .qp_type = IBV_QPT_RC,
                                   .cap = { .max_send_wr = 64, .max_recv_wr = 16,
                                            .max_send_sge = 1, .max_recv_sge = 1 } };
    return ibv_create_qp(pd, &ia);
}

static int send(struct ibv_qp *qp, uint64_t wr_id, char *buf, uint32_t lkey)
{
    struct ibv_sge s = { .addr = (uintptr_t)buf, .length = 8, .lkey = lkey };
    struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &s, .num_sge = 1,
                              .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;
    memcpy(buf, &wr_id, 8);
    return ibv_post_send(qp, &wr, &bad);
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    int max_qp = atoi(argv[1]), max_mr = atoi(argv[2]);
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    CHECK(list && n == 1, "one device");
    if (!list || n != 1)
        return 1;
    ctx = ibv_open_device(list[0]);
    CHECK(ctx != NULL, "open");
    if (!ctx)
        return 1;
    CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "GID 0");

    /* The daemon's caps. */
    struct ibv_device_attr_ex ax;
    CHECK(ibv_query_device_ex(ctx, NULL, &ax) == 0, "query_device_ex");
    CHECK(ax.orig_attr.max_qp == max_qp && ax.orig_attr.max_mr == max_mr,
          "max_qp and max_mr are the daemon's");
    CHECK(ax.orig_attr.device_cap_flags & IBV_DEVICE_SRQ_RESIZE, "SRQ resize advertised");
    CHECK(ax.odp_caps.general_caps == 0 && ax.odp_caps.per_transport_caps.rc_odp_caps == 0,
          "no ODP advertised");

    pd = ibv_alloc_pd(ctx);
    char *buf = calloc(1, 1 << 16);
    struct ibv_mr *mr = ibv_reg_mr(pd, buf, 1 << 16, IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr != NULL, "reg_mr");
    errno = 0;
    struct ibv_mr *odp = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
    CHECK(odp == NULL && errno == EOPNOTSUPP, "ODP registration refused with EOPNOTSUPP");
    /* MRs up to the cap, then ENOMEM. */
    struct ibv_mr *extra[64];
    int mrs = 1;
    while (mrs < 64 && (extra[mrs] = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE)))
        mrs++;
    CHECK(mrs == max_mr && errno == ENOMEM, "MRs stop at max_mr with ENOMEM");
    for (int i = 1; i < mrs; i++)
        ibv_dereg_mr(extra[i]);

    /* CQ resize: 6 completions held, then grown to 64; order kept; shrinking below what it
     * holds is EINVAL. */
    struct ibv_cq *scq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
    struct ibv_cq *rcq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
    CHECK(scq && rcq, "create CQs");
    struct ibv_srq_init_attr si = { .attr = { .max_wr = 16, .max_sge = 1 } };
    struct ibv_srq *srq = ibv_create_srq(pd, &si);
    CHECK(srq != NULL, "create SRQ");
    struct ibv_qp *qa = make_qp(scq, rcq, NULL), *qb = make_qp(scq, rcq, srq);
    CHECK(qa && qb, "create QPs");
    CHECK(to_rts(qa, qb->qp_num) == 0 && to_rts(qb, qa->qp_num) == 0, "connect");
    /* QPs up to the cap, then ENOMEM. */
    struct ibv_qp *more[64];
    int qps = 2;
    while (qps < 64 && (more[qps] = make_qp(scq, rcq, NULL)))
        qps++;
    CHECK(qps == max_qp && errno == ENOMEM, "QPs stop at max_qp with ENOMEM");
    for (int i = 2; i < qps; i++)
        ibv_destroy_qp(more[i]);

    /* The SRQ holds 16; 10 posted, then grown to 64 and 40 more posted. */
    uint64_t id = 0;
    char *rbuf = buf + 4096;
    for (; id < 10; id++) {
        struct ibv_sge s = { .addr = (uintptr_t)(rbuf + 8 * id), .length = 8, .lkey = mr->lkey };
        struct ibv_recv_wr wr = { .wr_id = 1000 + id, .sg_list = &s, .num_sge = 1 }, *bad;
        CHECK(ibv_post_srq_recv(srq, &wr, &bad) == 0, "post to the SRQ");
    }
    struct ibv_srq_attr sa = { .max_wr = 64 };
    CHECK(ibv_modify_srq(srq, &sa, IBV_SRQ_MAX_WR) == 0, "grow the SRQ");
    memset(&sa, 0, sizeof sa);
    CHECK(ibv_query_srq(srq, &sa) == 0 && sa.max_wr >= 64, "the SRQ's new size");
    for (; id < 50; id++) {
        struct ibv_sge s = { .addr = (uintptr_t)(rbuf + 8 * id), .length = 8, .lkey = mr->lkey };
        struct ibv_recv_wr wr = { .wr_id = 1000 + id, .sg_list = &s, .num_sge = 1 }, *bad;
        CHECK(ibv_post_srq_recv(srq, &wr, &bad) == 0, "post past the old size");
    }
    sa.max_wr = 4;
    errno = 0;
    CHECK(ibv_modify_srq(srq, &sa, IBV_SRQ_MAX_WR) == EINVAL, "no shrinking below what it holds");

    /* 6 sends: their completions wait in the 8-deep send CQ. */
    for (uint64_t i = 0; i < 6; i++)
        CHECK(send(qa, i, buf + 16 * i, mr->lkey) == 0, "send");
    struct ibv_wc wc[64];
    CHECK(wait_n(rcq, 6, wc) == 6, "six receives through the SRQ");
    CHECK(ibv_resize_cq(scq, 2) == EINVAL, "no shrinking below the completions held");
    CHECK(ibv_resize_cq(scq, 64) == 0 && scq->cqe >= 64, "grow the CQ holding completions");
    for (uint64_t i = 6; i < 50; i++)
        CHECK(send(qa, i, buf + 16 * (i % 64), mr->lkey) == 0, "send into the grown CQ");
    int got = wait_n(scq, 50, wc);
    CHECK(got == 50, "all 50 send completions");
    int in_order = 1;
    for (int i = 0; i < got; i++)
        in_order &= wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == (uint64_t)i;
    CHECK(in_order, "completions from the old ring first, in order");
    got = wait_n(rcq, 44, wc);
    CHECK(got == 44, "the other 44 receives");
    uint64_t seen = 0;
    for (int i = 0; i < got; i++)
        seen += wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id >= 1006 && wc[i].wr_id < 1050;
    CHECK(seen == 44, "receives posted before and after the SRQ grew all completed");

    CHECK(ibv_destroy_qp(qa) == 0 && ibv_destroy_qp(qb) == 0, "destroy QPs");
    CHECK(ibv_destroy_srq(srq) == 0, "destroy SRQ");
    CHECK(ibv_destroy_cq(scq) == 0 && ibv_destroy_cq(rcq) == 0, "destroy CQs");
    CHECK(ibv_dereg_mr(mr) == 0 && ibv_dealloc_pd(pd) == 0, "dereg, dealloc");
    CHECK(ibv_close_device(ctx) == 0, "close");
    ibv_free_device_list(list);
    printf("%d checks, %d failures\n", checks, failures);
    return failures != 0;
}
"#;

#[test]
fn the_device_advertises_exactly_what_it_does() {
    let exe = compile_c("shim_device_caps", PROGRAM, &["ibverbs"]);
    let daemon = Daemon::start(
        "device-caps",
        &[
            "--addr",
            "127.0.0.45",
            "--port",
            "4791",
            "--max-qp",
            "5",
            "--max-mr",
            "7",
        ],
    );
    let out = daemon
        .command(&exe)
        .args(["5", "7"])
        .output()
        .expect("run shim_device_caps");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && stdout.trim_end().ends_with(" checks, 0 failures"),
        "shim_device_caps ({}):\n{stdout}\n--- stderr\n{}\n--- daemon\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        daemon.log()
    );
}
