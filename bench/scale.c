// The scale goal of issue 5, through the plain libibverbs API (run it under libsoftroce.so):
//
//   scale NQP NMR [--mrs-first]
//
// creates NQP RC QPs (moved INIT -> RTR -> RTS, connected in pairs 2k <-> 2k+1 on the same
// device) and registers NMR memory regions of 4 KiB (in that order, or the MRs first with
// --mrs-first: the daemon's cost per control request grows with the QPs it polls), then
// proves they all work: QP pair k posts RDMA WRITEs so that every QP and every MR's R_Key is
// used at least once, and every completion must be IBV_WC_SUCCESS (the responder checks the
// R_Key, the range and the access flags: a wrong one completes with REMOTE_ACCESS_ERROR); the
// last 8192 writes' bytes are compared. It then prints `scale=ready`, waits for its stdin to close (scripts/bench measures the daemon's
// idle CPU meanwhile), destroys everything and exits 0. Exit status 1 on any failure.
//
// Output lines, parsed by bench/matrix.py and tests/tests/shim_scale.rs:
//   scale=qps count=N seconds=T client_kib_per=K
//   scale=mrs count=N seconds=T client_kib_per=K
//   scale=verify writes=N bytes_checked=B seconds=T
//   scale=ready
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

static int nqp, nmr;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static union ibv_gid gid;
static struct ibv_qp **qps;
static struct ibv_mr **mrs, *src_mr;
static char *pages, *src;

static void create_qps(void) {
    qps = calloc(nqp, sizeof *qps);
    long rss0 = rss_kib();
    double t0 = now();
    for (int i = 0; i < nqp; i++) {
        struct ibv_qp_init_attr init = {
            .send_cq = cq,
            .recv_cq = cq,
            .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1},
            .qp_type = IBV_QPT_RC,
        };
        qps[i] = ibv_create_qp(pd, &init);
        CHECK(qps[i], "ibv_create_qp %d of %d failed: %m", i, nqp);
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
                                .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE};
        CHECK(!ibv_modify_qp(qps[i], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
              "INIT %d failed", i);
    }
    for (int i = 0; i < nqp; i++) {
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
    double t1 = now();
    printf("scale=qps count=%d seconds=%.3f client_kib_per=%.2f\n", nqp, t1 - t0,
           (double)(rss_kib() - rss0) / nqp);

}

static void register_mrs(void) {
    pages = mmap(NULL, MR_PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(pages != MAP_FAILED, "mmap failed");
    memset(pages, 0, MR_PAGES * PAGE);
    src = aligned_alloc(PAGE, PAGE);
    src_mr = ibv_reg_mr(pd, src, PAGE, IBV_ACCESS_LOCAL_WRITE);
    CHECK(src_mr, "ibv_reg_mr (source) failed");
    mrs = calloc(nmr, sizeof *mrs);
    long rss0 = rss_kib();
    double t0 = now();
    for (int i = 0; i < nmr; i++) {
        mrs[i] = ibv_reg_mr(pd, pages + (i % MR_PAGES) * PAGE, PAGE,
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        CHECK(mrs[i], "ibv_reg_mr %d of %d failed: %m", i, nmr);
    }
    double t1 = now();
    printf("scale=mrs count=%d seconds=%.3f client_kib_per=%.2f\n", nmr, t1 - t0,
           (double)(rss_kib() - rss0) / nmr);

}

int main(int argc, char **argv) {
    CHECK(argc == 3 || (argc == 4 && !strcmp(argv[3], "--mrs-first")), "usage: scale NQP NMR [--mrs-first]");
    nqp = atoi(argv[1]);
    nmr = atoi(argv[2]);
    int mrs_first = argc == 4;
    CHECK(nqp >= 2 && nqp % 2 == 0 && nmr >= MR_PAGES && nmr % MR_PAGES == 0,
          "NQP must be even and >= 2, NMR a multiple of 16");
    setvbuf(stdout, NULL, _IOLBF, 0);

    int ndev = 0;
    struct ibv_device **devs = ibv_get_device_list(&ndev);
    CHECK(devs && ndev > 0, "no device");
    struct ibv_context *ctx = ibv_open_device(devs[0]);
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

    // --- verify: write j goes out on QP 2*(j % pairs) (to its peer) into MR j % nmr, so every
    // pair and every MR is used; at most 8 writes per QP are outstanding.
    int pairs = nqp / 2;
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

    t0 = now();
    // QPs first: every request costs the daemon a pass over the rings it still polls.
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
