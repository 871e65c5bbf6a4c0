// The scale goals of issues 5 and 17, through the plain libibverbs API (run it under
// libsoftroce.so, as an unmodified program):
//
//   scale NQP NMR [--mrs-first] [--churn N]
//
// creates NQP RC QPs, a pair at a time (2k and 2k+1 on the same device, each created and moved
// INIT -> RTR -> RTS, connected to each other), timing each QP's create + modify to RTS, and
// registers NMR memory regions of 4 KiB (in that order, or the MRs first with --mrs-first).
// With --churn N it then deregisters and registers again one of them N times in a loop (so a
// process registers NMR + N MRs in its life while holding NMR: past 2^19 = 524,288, where a
// device that never reuses an MR index runs out), and proves that the key of a deregistered MR
// no longer works. It then proves every QP and MR works: QP pair k posts RDMA WRITEs so that every
// QP and every MR's R_Key is used at least once, and every completion must be IBV_WC_SUCCESS
// (the responder checks the R_Key, the range and the access flags: a wrong one completes with
// REMOTE_ACCESS_ERROR); the last 8192 writes' bytes are compared. It prints `scale=ready`, waits
// for its stdin to close (scripts/bench measures the daemon's idle CPU meanwhile), then posts
// one WRITE on a single QP among all the idle ones (the device slept meanwhile: the shim's
// doorbell must wake it for that one ring), destroys everything and exits 0. Exit status 1 on
// any failure.
//
// Output lines, parsed by bench/matrix.py and tests/tests/shim_scale.rs:
//   scale=qps count=N seconds=T client_kib_per=K
//   scale=qp_cost at=I us=U              (median create + INIT + RTR + RTS of the 64 QPs up to
//                                         the I-th: I = 100, 1000, 10000, 100000 and NQP)
//   scale=mrs count=N seconds=T client_kib_per=K
//   scale=mr_cost at=I us=U              (median ibv_reg_mr of the 64 MRs up to the I-th)
//   scale=churn count=N registrations=R seconds=T first_us=U last_us=V stale_key=refused
//                                        (U, V: median dereg + reg of the first and last 1000)
//   scale=verify writes=N bytes_checked=B seconds=T
//   scale=ready
//   scale=single qp=I us=U              (one WRITE on QP I after the idle phase, completed)
//   scale=destroyed seconds=T
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

// Every MR covers one of these pages of one shared buffer: the figure is the cost of the MR
// itself, not of the memory under it.
#define MR_PAGES 16
#define PAGE 4096
// Per-operation figures are medians over this many consecutive operations.
#define WINDOW 64

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static long rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kib = atol(line + 6);
    if (f) fclose(f);
    return kib;
}

#define CHECK(cond, ...)                              \
    do {                                              \
        if (!(cond)) {                                \
            fprintf(stderr, "scale: " __VA_ARGS__);   \
            fprintf(stderr, "\n");                    \
            exit(1);                                  \
        }                                             \
    } while (0)

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// The median of `n` values (sorted in place).
static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Prints `scale=<what> at=I us=U` for the checkpoints I (100, 1000, ... and `count`) that the
// `count` timings in `t` (seconds) reach: the median of the WINDOW operations up to the I-th.
static void checkpoints(const char *what, double *t, int count) {
    static const int at[] = {100, 1000, 10000, 100000, 1000000};
    double w[WINDOW];
    int last = 0;
    for (unsigned k = 0; k < sizeof at / sizeof at[0] && at[k] <= count; k++) {
        memcpy(w, t + at[k] - WINDOW, sizeof w);
        printf("scale=%s at=%d us=%.1f\n", what, at[k], median(w, WINDOW) * 1e6);
        last = at[k];
    }
    if (count != last && count >= WINDOW) {
        memcpy(w, t + count - WINDOW, sizeof w);
        printf("scale=%s at=%d us=%.1f\n", what, count, median(w, WINDOW) * 1e6);
    }
}

static int nqp, nmr;
static long churn;
static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static union ibv_gid gid;
static struct ibv_qp **qps;
static struct ibv_mr **mrs, *src_mr;
static char *pages, *src;

static struct ibv_qp *create_qp(void) {
    struct ibv_qp_init_attr init = {
        .send_cq = cq,
        .recv_cq = cq,
        .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
    };
    return ibv_create_qp(pd, &init);
}

static void to_init(int i) {
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
                            .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE};
    CHECK(!ibv_modify_qp(qps[i], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
          "INIT %d failed", i);
}

static void to_rts(int i) {
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTR,
        .path_mtu = IBV_MTU_1024,
        .dest_qp_num = qps[i ^ 1]->qp_num,
        .rq_psn = 0,
        .max_dest_rd_atomic = 1,
        .min_rnr_timer = 12,
        .ah_attr = {.is_global = 1, .port_num = 1,
                    .grh = {.dgid = gid, .sgid_index = 0, .hop_limit = 64}},
    };
    CHECK(!ibv_modify_qp(qps[i], &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                         IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
          "RTR %d failed", i);
    struct ibv_qp_attr r = {.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7,
                            .sq_psn = 0, .max_rd_atomic = 1};
    CHECK(!ibv_modify_qp(qps[i], &r, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                         IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC),
          "RTS %d failed", i);
}

static void create_qps(void) {
    qps = calloc(nqp, sizeof *qps);
    double *cost = calloc(nqp, sizeof *cost);
    long rss0 = rss_kib();
    double t0 = now();
    // A pair at a time: each QP's RTR names its peer's QPN. A QP's cost is its create and its
    // three modifies (the pair's INITs and RTR/RTS each timed for their own QP).
    for (int i = 0; i < nqp; i += 2) {
        for (int j = i; j < i + 2; j++) {
            double a = now();
            qps[j] = create_qp();
            CHECK(qps[j], "ibv_create_qp %d of %d failed: %m", j, nqp);
            to_init(j);
            cost[j] = now() - a;
        }
        for (int j = i; j < i + 2; j++) {
            double a = now();
            to_rts(j);
            cost[j] += now() - a;
        }
    }
    double t1 = now();
    printf("scale=qps count=%d seconds=%.3f client_kib_per=%.2f\n", nqp, t1 - t0,
           (double)(rss_kib() - rss0) / nqp);
    checkpoints("qp_cost", cost, nqp);
    free(cost);
}

static struct ibv_mr *reg(int i) {
    return ibv_reg_mr(pd, pages + (i % MR_PAGES) * PAGE, PAGE, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
}

static void register_mrs(void) {
    pages = mmap(NULL, MR_PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(pages != MAP_FAILED, "mmap failed");
    memset(pages, 0, MR_PAGES * PAGE);
    src = aligned_alloc(PAGE, PAGE);
    src_mr = ibv_reg_mr(pd, src, PAGE, IBV_ACCESS_LOCAL_WRITE);
    CHECK(src_mr, "ibv_reg_mr (source) failed");
    mrs = calloc(nmr, sizeof *mrs);
    double *cost = calloc(nmr, sizeof *cost);
    long rss0 = rss_kib();
    double t0 = now();
    for (int i = 0; i < nmr; i++) {
        double a = now();
        mrs[i] = reg(i);
        cost[i] = now() - a;
        CHECK(mrs[i], "ibv_reg_mr %d of %d failed: %m", i, nmr);
    }
    double t1 = now();
    printf("scale=mrs count=%d seconds=%.3f client_kib_per=%.2f\n", nmr, t1 - t0,
           (double)(rss_kib() - rss0) / nmr);
    checkpoints("mr_cost", cost, nmr);
    free(cost);
}

// Writes 8 bytes through QP `qp` into MR `mr` at `offset` with `rkey`; returns the status.
static enum ibv_wc_status write_once(int qp, struct ibv_mr *mr, uint32_t rkey, uint64_t offset, uint64_t value) {
    memcpy(src, &value, 8);
    struct ibv_sge sge = {.addr = (uintptr_t)src, .length = 8, .lkey = src_mr->lkey};
    struct ibv_send_wr wr = {.wr_id = value, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
                             .send_flags = IBV_SEND_SIGNALED,
                             .wr.rdma = {.remote_addr = (uintptr_t)mr->addr + offset, .rkey = rkey}};
    struct ibv_send_wr *bad;
    CHECK(!ibv_post_send(qps[qp], &wr, &bad), "post_send on QP %d failed", qp);
    double deadline = now() + 60;
    struct ibv_wc wc;
    int n;
    while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
        CHECK(now() < deadline, "the write on QP %d did not complete", qp);
    CHECK(n == 1 && wc.wr_id == value, "ibv_poll_cq failed");
    return wc.status;
}

// Deregisters and registers again MR j % NMR, `churn` times: the device must reuse what a
// deregistration frees. Then the key of a deregistered MR must name nothing.
static void churn_mrs(void) {
    double *cost = calloc(churn, sizeof *cost);
    double t0 = now();
    for (long j = 0; j < churn; j++) {
        int i = (int)(j % nmr);
        double a = now();
        CHECK(!ibv_dereg_mr(mrs[i]), "ibv_dereg_mr in the churn (%ld) failed", j);
        mrs[i] = reg(i);
        cost[j] = now() - a;
        CHECK(mrs[i], "ibv_reg_mr failed after %ld registrations in this process: %m", nmr + 1 + j);
    }
    double seconds = now() - t0;
    long w = churn < 1000 ? churn : 1000;
    double first = median(cost, (int)w), last = median(cost + churn - w, (int)w);
    // A stale key: the MR is deregistered (its slot free to be reused), its R_Key kept.
    struct ibv_mr *old = mrs[0];
    uint32_t stale = old->rkey;
    CHECK(!ibv_dereg_mr(old), "ibv_dereg_mr (stale) failed");
    mrs[0] = reg(0);
    CHECK(mrs[0], "ibv_reg_mr after the stale key failed");
    CHECK(mrs[0]->rkey != stale, "a new MR got the deregistered MR's key");
    // The last pair: its QP goes to ERR with the error completion, so it is not used again
    // (the verify phase uses the others; NQP >= 4 with --churn).
    enum ibv_wc_status st = write_once(nqp - 2, mrs[0], stale, 0, 0x57a1e);
    CHECK(st == IBV_WC_REM_ACCESS_ERR, "a WRITE with a deregistered MR's key completed with %s",
          ibv_wc_status_str(st));
    printf("scale=churn count=%ld registrations=%ld seconds=%.3f first_us=%.1f last_us=%.1f stale_key=refused\n",
           churn, nmr + 2 + churn, seconds, first * 1e6, last * 1e6);
    free(cost);
}

int main(int argc, char **argv) {
    int mrs_first = 0;
    for (int a = 3; a < argc; a++) {
        if (!strcmp(argv[a], "--mrs-first"))
            mrs_first = 1;
        else if (!strcmp(argv[a], "--churn") && a + 1 < argc)
            churn = atol(argv[++a]);
        else
            CHECK(0, "usage: scale NQP NMR [--mrs-first] [--churn N]");
    }
    CHECK(argc >= 3, "usage: scale NQP NMR [--mrs-first] [--churn N]");
    nqp = atoi(argv[1]);
    nmr = atoi(argv[2]);
    CHECK(nqp >= 2 && nqp % 2 == 0 && nmr >= MR_PAGES && nmr % MR_PAGES == 0,
          "NQP must be even and >= 2, NMR a multiple of 16");
    CHECK(!churn || nqp >= 4, "--churn needs NQP >= 4 (a pair to test the stale key on)");
    setvbuf(stdout, NULL, _IOLBF, 0);

    int ndev = 0;
    struct ibv_device **devs = ibv_get_device_list(&ndev);
    CHECK(devs && ndev > 0, "no device");
    ctx = ibv_open_device(devs[0]);
    CHECK(ctx, "ibv_open_device failed");
    struct ibv_port_attr port;
    CHECK(!ibv_query_port(ctx, 1, &port), "ibv_query_port failed");
    CHECK(!ibv_query_gid(ctx, 1, 0, &gid), "ibv_query_gid failed");
    pd = ibv_alloc_pd(ctx);
    CHECK(pd, "ibv_alloc_pd failed");
    // One CQ for every QP: the writes of the verify phase are posted in bounded batches.
    cq = ibv_create_cq(ctx, 4096, NULL, NULL, 0);
    CHECK(cq, "ibv_create_cq failed");

    if (mrs_first) {
        register_mrs();
        create_qps();
    } else {
        create_qps();
        register_mrs();
    }
    if (churn) churn_mrs();

    // --- verify: write j goes out on QP 2*(j % pairs) (to its peer) into MR j % nmr, so every
    // pair and every MR is used; at most 8 writes per QP are outstanding. With --churn the last
    // pair is in ERR (the stale key) and sits out.
    int pairs = nqp / 2 - (churn ? 1 : 0);
    long writes = nmr > pairs ? nmr : pairs;
    double t0 = now();
    long posted = 0, completed = 0;
    while (completed < writes) {
        // One round: at most 8 writes per pair and 512 in all in flight (each has its own
        // source slot, and the CQ holds them all), signalled, then drained.
        long round = 8L * pairs < PAGE / 8 ? 8L * pairs : PAGE / 8;
        long round_end = posted + round;
        if (round_end > writes) round_end = writes;
        for (long j = posted; j < round_end; j++) {
            int mr = (int)(j % nmr), pair = (int)(j % pairs);
            uint64_t value = 0x5ca1e00000000000ull | (uint64_t)j;
            // Write j lands in page j % 16 (MR j % NMR covers it, NMR being a multiple of
            // 16), slot (j / 16) % 512: any 8192 consecutive writes have their own slots.
            uint64_t offset = (uint64_t)((j / MR_PAGES) % (PAGE / 8)) * 8;
            memcpy(src + (j % (PAGE / 8)) * 8, &value, 8);
            struct ibv_sge sge = {.addr = (uintptr_t)(src + (j % (PAGE / 8)) * 8), .length = 8,
                                  .lkey = src_mr->lkey};
            struct ibv_send_wr wr = {.wr_id = (uint64_t)j, .sg_list = &sge, .num_sge = 1,
                                     .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
                                     .wr.rdma = {.remote_addr = (uintptr_t)mrs[mr]->addr + offset,
                                                 .rkey = mrs[mr]->rkey}};
            struct ibv_send_wr *bad;
            CHECK(!ibv_post_send(qps[2 * pair], &wr, &bad), "post_send %ld failed", j);
        }
        long target = round_end;
        posted = round_end;
        double deadline = now() + 60;
        while (completed < target) {
            struct ibv_wc wc[64];
            int n = ibv_poll_cq(cq, 64, wc);
            CHECK(n >= 0, "ibv_poll_cq failed");
            for (int k = 0; k < n; k++)
                CHECK(wc[k].status == IBV_WC_SUCCESS, "write %llu completed with %s",
                      (unsigned long long)wc[k].wr_id, ibv_wc_status_str(wc[k].status));
            completed += n;
            CHECK(now() < deadline, "writes did not complete: %ld of %ld", completed, target);
        }
    }
    // The last 8192 writes' bytes are in their slots (earlier ones were overwritten, in no
    // defined order: they came over different QPs).
    long checked = writes < MR_PAGES * (PAGE / 8) ? writes : MR_PAGES * (PAGE / 8);
    for (long j = writes - checked; j < writes; j++) {
        uint64_t want = 0x5ca1e00000000000ull | (uint64_t)j, got;
        memcpy(&got, pages + (j % MR_PAGES) * PAGE + ((j / MR_PAGES) % (PAGE / 8)) * 8, 8);
        CHECK(got == want, "write %ld's bytes: got %#llx, want %#llx", j, (unsigned long long)got,
              (unsigned long long)want);
    }
    printf("scale=verify writes=%ld bytes_checked=%ld seconds=%.3f\n", writes, checked * 8, now() - t0);

    printf("scale=ready\n");
    char buf[64];
    while (read(0, buf, sizeof buf) > 0) {
    }

    // One QP among the idle ones, after the device had nothing to do: the pair in the middle
    // writes once into MR 1 (page 1 is not compared above any more).
    int one = 2 * (pairs / 2);
    uint64_t value = 0x0e1e0e1e0e1eull;
    t0 = now();
    enum ibv_wc_status st = write_once(one, mrs[1], mrs[1]->rkey, PAGE - 8, value);
    double single = now() - t0;
    uint64_t got;
    memcpy(&got, (char *)mrs[1]->addr + PAGE - 8, 8);
    CHECK(st == IBV_WC_SUCCESS && got == value, "the single write on QP %d: %s, bytes %#llx", one,
          ibv_wc_status_str(st), (unsigned long long)got);
    printf("scale=single qp=%d us=%.1f\n", one, single * 1e6);

    t0 = now();
    for (int i = 0; i < nqp; i++) CHECK(!ibv_destroy_qp(qps[i]), "destroy_qp %d failed", i);
    for (int i = 0; i < nmr; i++) CHECK(!ibv_dereg_mr(mrs[i]), "dereg_mr %d failed", i);
    printf("scale=destroyed seconds=%.3f\n", now() - t0);
    ibv_dereg_mr(src_mr);
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    ibv_free_device_list(devs);
    return 0;
}
