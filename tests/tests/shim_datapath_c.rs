//! What the pingpongs do not exercise, driven by a C program compiled here against the system
//! `<infiniband/verbs.h>` and run under LD_PRELOAD: two RC QPs of one process connected to each
//! other through a private daemon (loopback address, real port 4791), then RDMA WRITE, WRITE
//! with immediate, READ, both atomics, inline SEND, memory windows of both types with SEND with
//! invalidate, completion channels, SRQ limit events, the extended CQ polling API, the
//! `ibv_wr_*` send API, a fork child kept off the parent's rings, a dead peer process
//! (`IBV_WC_RETRY_EXC_ERR` with a finite retry count), and the
//! error completions of a wrong R_Key and of an access past the end of a region. Every data
//! transfer is checked byte for byte, every completion's status/opcode/length/flags.

mod shim_support;

use shim_support::{check_output, compile_c, Daemon};

const PROGRAM: &str = r#"
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int failures, checks;
#define CHECK(cond, what) do { checks++; if (!(cond)) { failures++; \
    printf("FAIL line %d: %s (errno %d)\n", __LINE__, what, errno); fflush(stdout); } } while (0)

#define LEN 8192
static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_qp *qa, *qb;
static union ibv_gid gid;
static char *abuf, *bbuf;
static struct ibv_mr *amr, *bmr;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* One completion from `c`, waiting at most 10 s; 0 if none came. */
static int wait_wc(struct ibv_cq *c, struct ibv_wc *wc)
{
    double deadline = now() + 10;
    while (now() < deadline) {
        int n = ibv_poll_cq(c, 1, wc);
        if (n < 0)
            return 0;
        if (n == 1)
            return 1;
    }
    printf("no completion within 10 s\n");
    return 0;
}

/* retry_cnt for to_rts: 7 is rxe's "forever"; the peer-death test uses a finite one. */
static int retry_count = 7;

static int to_rts(struct ibv_qp *qp, uint32_t remote_qpn)
{
    struct ibv_qp_attr a = { .qp_state = IBV_QPS_RESET };
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
        return -1;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                        IBV_ACCESS_REMOTE_ATOMIC;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        return -1;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = remote_qpn;
    a.rq_psn = 0;
    a.max_dest_rd_atomic = 4;
    a.min_rnr_timer = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = gid;
    a.ah_attr.grh.sgid_index = 0;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                              IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        return -1;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 10;
    a.retry_cnt = retry_count;
    a.rnr_retry = 7;
    a.sq_psn = 0;
    a.max_rd_atomic = 4;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                 IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

/* (Re)connects A and B, e.g. after an error completion moved them to ERR, and drains the CQ. */
static void connect_pair(void)
{
    CHECK(to_rts(qa, qb->qp_num) == 0, "A to RTS");
    CHECK(to_rts(qb, qa->qp_num) == 0, "B to RTS");
    struct ibv_wc wc;
    while (ibv_poll_cq(cq, 1, &wc) > 0)
        ;
}

static struct ibv_qp *make_qp(struct ibv_cq *scq, struct ibv_cq *rcq, struct ibv_srq *srq)
{
    struct ibv_qp_init_attr ia = { .send_cq = scq, .recv_cq = rcq, .srq = srq,
                                   .qp_type = IBV_QPT_RC,
                                   .cap = { .max_send_wr = 16, .max_recv_wr = 16,
                                            .max_send_sge = 2, .max_recv_sge = 2,
                                            .max_inline_data = 64 } };
    return ibv_create_qp(pd, &ia);
}

static int post(struct ibv_qp *qp, struct ibv_send_wr *wr)
{
    struct ibv_send_wr *bad = NULL;
    return ibv_post_send(qp, wr, &bad);
}

static int post_recv(struct ibv_qp *qp, uint64_t wr_id, void *addr, uint32_t len, uint32_t lkey)
{
    struct ibv_sge s = { .addr = (uintptr_t)addr, .length = len, .lkey = lkey };
    struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &s, .num_sge = 1 }, *bad = NULL;
    return ibv_post_recv(qp, &wr, &bad);
}

static void fill(char *p, int n, int seed)
{
    for (int i = 0; i < n; i++)
        p[i] = (char)(i * 7 + seed);
}

static void test_write_read_atomics(void)
{
    struct ibv_wc wc;
    /* RDMA WRITE, two SGEs gathered into one remote range. */
    fill(abuf, LEN, 1);
    memset(bbuf, 0, LEN);
    struct ibv_sge sg[2] = { { (uintptr_t)abuf, 3000, amr->lkey },
                             { (uintptr_t)abuf + 3000, 2000, amr->lkey } };
    struct ibv_send_wr w = { .wr_id = 10, .sg_list = sg, .num_sge = 2,
                             .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED };
    w.wr.rdma.remote_addr = (uintptr_t)bbuf + 100;
    w.wr.rdma.rkey = bmr->rkey;
    CHECK(post(qa, &w) == 0, "post RDMA WRITE");
    CHECK(wait_wc(cq, &wc) && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE &&
          wc.wr_id == 10 && wc.qp_num == qa->qp_num, "WRITE completion");
    CHECK(memcmp(bbuf + 100, abuf, 5000) == 0 && bbuf[99] == 0 && bbuf[5100] == 0,
          "WRITE placed exactly the gathered bytes");

    /* WRITE with immediate: data placed, and a receive completion carrying the immediate. */
    CHECK(post_recv(qb, 20, bbuf, 16, bmr->lkey) == 0, "post recv for WRITE_WITH_IMM");
    fill(abuf, 64, 9);
    struct ibv_sge s1 = { (uintptr_t)abuf, 64, amr->lkey };
    struct ibv_send_wr wi = { .wr_id = 21, .sg_list = &s1, .num_sge = 1,
                              .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
                              .send_flags = IBV_SEND_SIGNALED, .imm_data = htobe32(0x12345678) };
    wi.wr.rdma.remote_addr = (uintptr_t)bbuf + 4096;
    wi.wr.rdma.rkey = bmr->rkey;
    CHECK(post(qa, &wi) == 0, "post WRITE_WITH_IMM");
    int got_send = 0, got_recv = 0;
    for (int i = 0; i < 2 && wait_wc(cq, &wc); i++) {
        if (wc.wr_id == 21)
            got_send = wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE;
        if (wc.wr_id == 20)
            got_recv = wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
                       (wc.wc_flags & IBV_WC_WITH_IMM) && wc.imm_data == htobe32(0x12345678) &&
                       wc.qp_num == qb->qp_num;
    }
    CHECK(got_send && got_recv, "WRITE_WITH_IMM: both completions, immediate delivered");
    CHECK(memcmp(bbuf + 4096, abuf, 64) == 0, "WRITE_WITH_IMM data placed");

    /* RDMA READ of 6000 bytes (several response packets). */
    fill(bbuf, LEN, 3);
    memset(abuf, 0, LEN);
    struct ibv_sge s2 = { (uintptr_t)abuf, 6000, amr->lkey };
    struct ibv_send_wr r = { .wr_id = 30, .sg_list = &s2, .num_sge = 1,
                             .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED };
    r.wr.rdma.remote_addr = (uintptr_t)bbuf + 8;
    r.wr.rdma.rkey = bmr->rkey;
    CHECK(post(qa, &r) == 0, "post RDMA READ");
    CHECK(wait_wc(cq, &wc) && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_READ &&
          wc.byte_len == 6000, "READ completion");
    CHECK(memcmp(abuf, bbuf + 8, 6000) == 0, "READ data");

    /* Atomics on an 8-byte aligned word of B. */
    uint64_t *remote = (uint64_t *)(bbuf + 512), *local = (uint64_t *)abuf;
    *remote = 5;
    *local = 0;
    struct ibv_sge s3 = { (uintptr_t)abuf, 8, amr->lkey };
    struct ibv_send_wr cas = { .wr_id = 40, .sg_list = &s3, .num_sge = 1,
                               .opcode = IBV_WR_ATOMIC_CMP_AND_SWP,
                               .send_flags = IBV_SEND_SIGNALED };
    cas.wr.atomic.remote_addr = (uintptr_t)remote;
    cas.wr.atomic.rkey = bmr->rkey;
    cas.wr.atomic.compare_add = 5;
    cas.wr.atomic.swap = 9;
    CHECK(post(qa, &cas) == 0, "post CMP_AND_SWP");
    CHECK(wait_wc(cq, &wc) && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_COMP_SWAP,
          "CMP_AND_SWP completion");
    CHECK(*local == 5 && *remote == 9, "CMP_AND_SWP returned the old value and swapped");
    struct ibv_send_wr faa = cas;
    faa.wr_id = 41;
    faa.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
    faa.wr.atomic.compare_add = 3;
    CHECK(post(qa, &faa) == 0, "post FETCH_AND_ADD");
    CHECK(wait_wc(cq, &wc) && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_FETCH_ADD,
          "FETCH_AND_ADD completion");
    CHECK(*local == 9 && *remote == 12, "FETCH_AND_ADD returned the old value and added");
    cas.wr_id = 42;
    cas.wr.atomic.compare_add = 5; /* no longer matches: no swap */
    CHECK(post(qa, &cas) == 0 && wait_wc(cq, &wc) && wc.status == IBV_WC_SUCCESS &&
          *local == 12 && *remote == 12, "CMP_AND_SWP that does not match leaves the word");
}

static void test_inline_send(void)
{
    struct ibv_wc wc;
    memset(bbuf, 0, 64);
    CHECK(post_recv(qb, 50, bbuf, 64, bmr->lkey) == 0, "post recv for inline SEND");
    char msg[24];
    memcpy(msg, "inline data, not an MR!", 24);
    /* No lkey: inline data is copied at post time. */
    struct ibv_sge s = { (uintptr_t)msg, 24, 0 };
    struct ibv_send_wr w = { .wr_id = 51, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
                             .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE };
    CHECK(post(qa, &w) == 0, "post inline SEND");
    memset(msg, 'X', sizeof msg); /* the WR owns a copy */
    int ok_send = 0, ok_recv = 0;
    for (int i = 0; i < 2 && wait_wc(cq, &wc); i++) {
        if (wc.wr_id == 51)
            ok_send = wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND;
        if (wc.wr_id == 50)
            ok_recv = wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.byte_len == 24 &&
                      wc.src_qp == qa->qp_num;
    }
    CHECK(ok_send && ok_recv, "inline SEND completions");
    CHECK(memcmp(bbuf, "inline data, not an MR!", 24) == 0, "inline SEND data");
    char big[128] = { 0 };
    struct ibv_sge sb = { (uintptr_t)big, 128, 0 };
    struct ibv_send_wr wb = { .wr_id = 52, .sg_list = &sb, .num_sge = 1, .opcode = IBV_WR_SEND,
                              .send_flags = IBV_SEND_INLINE };
    struct ibv_send_wr *bad = NULL;
    CHECK(ibv_post_send(qa, &wb, &bad) == EINVAL && bad == &wb,
          "inline data above max_inline_data: EINVAL");
}

static void test_memory_windows(void)
{
    struct ibv_wc wc;
    /* Type 2: bound by a WR on B's QP, used by A, then invalidated by A's SEND_WITH_INV. */
    struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
    CHECK(mw != NULL, "alloc type 2 MW");
    if (!mw)
        return;
    uint32_t key = ibv_inc_rkey(mw->rkey);
    struct ibv_send_wr b = { .wr_id = 60, .opcode = IBV_WR_BIND_MW,
                             .send_flags = IBV_SEND_SIGNALED };
    b.bind_mw.mw = mw;
    b.bind_mw.rkey = key;
    b.bind_mw.bind_info.mr = bmr;
    b.bind_mw.bind_info.addr = (uintptr_t)bbuf;
    b.bind_mw.bind_info.length = 4096;
    b.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    CHECK(post(qb, &b) == 0, "post BIND_MW");
    CHECK(wait_wc(cq, &wc) && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW &&
          wc.wr_id == 60, "BIND_MW completion");
    fill(abuf, 256, 5);
    memset(bbuf, 0, 4096);
    struct ibv_sge s = { (uintptr_t)abuf, 256, amr->lkey };
    struct ibv_send_wr w = { .wr_id = 61, .sg_list = &s, .num_sge = 1,
                             .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED };
    w.wr.rdma.remote_addr = (uintptr_t)bbuf + 1024;
    w.wr.rdma.rkey = key;
    CHECK(post(qa, &w) == 0 && wait_wc(cq, &wc) && wc.status == IBV_WC_SUCCESS,
          "WRITE through the window");
    CHECK(memcmp(bbuf + 1024, abuf, 256) == 0, "window WRITE data");

    CHECK(post_recv(qb, 62, bbuf + 4096, 64, bmr->lkey) == 0, "post recv for SEND_WITH_INV");
    struct ibv_send_wr inv = { .wr_id = 63, .sg_list = &s, .num_sge = 1,
                               .opcode = IBV_WR_SEND_WITH_INV, .send_flags = IBV_SEND_SIGNALED,
                               .invalidate_rkey = key };
    s.length = 32;
    CHECK(post(qa, &inv) == 0, "post SEND_WITH_INV");
    int ok_send = 0, ok_recv = 0;
    for (int i = 0; i < 2 && wait_wc(cq, &wc); i++) {
        if (wc.wr_id == 63)
            ok_send = wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND;
        if (wc.wr_id == 62)
            ok_recv = wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV &&
                      (wc.wc_flags & IBV_WC_WITH_INV) && wc.invalidated_rkey == key &&
                      wc.byte_len == 32;
    }
    CHECK(ok_send && ok_recv, "SEND_WITH_INV: the responder reports the invalidated R_Key");
    w.wr_id = 64;
    CHECK(post(qa, &w) == 0 && wait_wc(cq, &wc) && wc.wr_id == 64 &&
          wc.status == IBV_WC_REM_ACCESS_ERR, "WRITE through the invalidated window: REM_ACCESS_ERR");
    connect_pair();
    CHECK(ibv_dealloc_mw(mw) == 0, "dealloc type 2 MW");

    /* Type 1: bound with ibv_bind_mw, which gives the window its new R_Key. */
    struct ibv_mw *mw1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
    CHECK(mw1 != NULL, "alloc type 1 MW");
    if (!mw1)
        return;
    uint32_t before = mw1->rkey;
    struct ibv_mw_bind mb = { .wr_id = 70, .send_flags = IBV_SEND_SIGNALED };
    mb.bind_info.mr = bmr;
    mb.bind_info.addr = (uintptr_t)bbuf;
    mb.bind_info.length = 2048;
    mb.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
    CHECK(ibv_bind_mw(qb, mw1, &mb) == 0 && mw1->rkey != before, "ibv_bind_mw");
    CHECK(wait_wc(cq, &wc) && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW &&
          wc.wr_id == 70, "type 1 bind completion");
    fill(bbuf, 2048, 11);
    memset(abuf, 0, 2048);
    struct ibv_sge rs = { (uintptr_t)abuf, 2048, amr->lkey };
    struct ibv_send_wr r = { .wr_id = 71, .sg_list = &rs, .num_sge = 1,
                             .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED };
    r.wr.rdma.remote_addr = (uintptr_t)bbuf;
    r.wr.rdma.rkey = mw1->rkey;
    CHECK(post(qa, &r) == 0 && wait_wc(cq, &wc) && wc.status == IBV_WC_SUCCESS &&
          memcmp(abuf, bbuf, 2048) == 0, "READ through a type 1 window");
    CHECK(ibv_dealloc_mw(mw1) == 0, "dealloc type 1 MW");
}

static void test_access_errors(void)
{
    struct ibv_wc wc;
    struct ibv_sge s = { (uintptr_t)abuf, 64, amr->lkey };
    struct ibv_send_wr w = { .wr_id = 80, .sg_list = &s, .num_sge = 1,
                             .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED };
    w.wr.rdma.remote_addr = (uintptr_t)bbuf;
    w.wr.rdma.rkey = bmr->rkey ^ 0x80; /* another key */
    memset(bbuf, 0, 64);
    fill(abuf, 64, 2);
    CHECK(post(qa, &w) == 0 && wait_wc(cq, &wc) && wc.wr_id == 80 &&
          wc.status == IBV_WC_REM_ACCESS_ERR, "wrong R_Key: REM_ACCESS_ERR");
    CHECK(bbuf[1] == 0, "nothing written with a wrong R_Key");
    connect_pair();

    w.wr_id = 81;
    w.wr.rdma.rkey = bmr->rkey;
    w.wr.rdma.remote_addr = (uintptr_t)bbuf + LEN - 8; /* 56 bytes past the end */
    CHECK(post(qa, &w) == 0 && wait_wc(cq, &wc) && wc.wr_id == 81 &&
          wc.status == IBV_WC_REM_ACCESS_ERR, "WRITE past the region: REM_ACCESS_ERR");
    connect_pair();

    struct ibv_send_wr r = w;
    r.wr_id = 82;
    r.opcode = IBV_WR_RDMA_READ;
    r.wr.rdma.remote_addr = (uintptr_t)bbuf - 64; /* before the start */
    CHECK(post(qa, &r) == 0 && wait_wc(cq, &wc) && wc.wr_id == 82 &&
          wc.status == IBV_WC_REM_ACCESS_ERR, "READ before the region: REM_ACCESS_ERR");
    connect_pair();

    /* The pair works again after the errors. */
    w.wr_id = 83;
    w.wr.rdma.remote_addr = (uintptr_t)bbuf;
    CHECK(post(qa, &w) == 0 && wait_wc(cq, &wc) && wc.wr_id == 83 &&
          wc.status == IBV_WC_SUCCESS && memcmp(bbuf, abuf, 64) == 0, "WRITE after reconnecting");
}

static void test_channel_and_extended_poll(void)
{
    struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
    CHECK(ch != NULL, "create_comp_channel");
    struct ibv_cq_init_attr_ex ca = { .cqe = 8, .channel = ch, .cq_context = (void *)0x5eed,
                                      .wc_flags = IBV_WC_STANDARD_FLAGS };
    struct ibv_cq_ex *rcq = ibv_create_cq_ex(ctx, &ca);
    CHECK(rcq != NULL, "create_cq_ex on a channel");
    if (!ch || !rcq)
        return;
    struct ibv_cq *rc = ibv_cq_ex_to_cq(rcq);
    struct ibv_qp *qc = make_qp(cq, rc, NULL), *qd = make_qp(cq, cq, NULL);
    CHECK(qc && qd, "QPs for the channel test");
    if (!qc || !qd)
        return;
    CHECK(to_rts(qc, qd->qp_num) == 0 && to_rts(qd, qc->qp_num) == 0, "C/D to RTS");
    CHECK(ibv_destroy_comp_channel(ch) == EBUSY, "channel busy while a CQ uses it");
    CHECK(ibv_req_notify_cq(rc, 0) == 0, "arm");
    CHECK(post_recv(qc, 90, bbuf, 64, bmr->lkey) == 0, "post recv on C");
    struct ibv_sge s = { (uintptr_t)abuf, 40, amr->lkey };
    struct ibv_send_wr w = { .wr_id = 91, .sg_list = &s, .num_sge = 1,
                             .opcode = IBV_WR_SEND_WITH_IMM, .imm_data = htobe32(77) };
    CHECK(post(qd, &w) == 0, "unsignaled send from D");
    struct pollfd p = { .fd = ch->fd, .events = POLLIN };
    CHECK(poll(&p, 1, 10000) == 1, "the channel fd becomes readable");
    struct ibv_cq *ev_cq = NULL;
    void *ev_ctx = NULL;
    CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0 && ev_cq == rc && ev_ctx == (void *)0x5eed,
          "get_cq_event names the CQ and its context");
    struct ibv_poll_cq_attr pa = { 0 };
    int rc_ = ibv_start_poll(rcq, &pa);
    CHECK(rc_ == 0 && rcq->status == IBV_WC_SUCCESS && rcq->wr_id == 90 &&
          ibv_wc_read_opcode(rcq) == IBV_WC_RECV && ibv_wc_read_byte_len(rcq) == 40 &&
          (ibv_wc_read_wc_flags(rcq) & IBV_WC_WITH_IMM) && ibv_wc_read_imm_data(rcq) == htobe32(77) &&
          ibv_wc_read_qp_num(rcq) == qc->qp_num && ibv_wc_read_src_qp(rcq) == qd->qp_num,
          "extended poll reads the receive completion");
    if (rc_ == 0) {
        CHECK(ibv_next_poll(rcq) == ENOENT, "one completion only");
        ibv_end_poll(rcq);
    }
    ibv_ack_cq_events(rc, 1);
    CHECK(ibv_destroy_qp(qc) == 0 && ibv_destroy_qp(qd) == 0, "destroy C/D");
    CHECK(ibv_destroy_cq(rc) == 0, "destroy the acknowledged CQ");
    CHECK(ibv_destroy_comp_channel(ch) == 0, "destroy the channel");
}

/* One RC message from a fresh pair whose receive side completes on `rcq`. */
static int message_to(struct ibv_cq *rcq)
{
    struct ibv_qp *r = make_qp(cq, rcq, NULL), *t = make_qp(cq, cq, NULL);
    int ok = r && t && to_rts(r, t->qp_num) == 0 && to_rts(t, r->qp_num) == 0 &&
             post_recv(r, 130, bbuf, 64, bmr->lkey) == 0;
    struct ibv_sge s = { (uintptr_t)abuf, 8, amr->lkey };
    struct ibv_send_wr w = { .wr_id = 131, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND };
    ok = ok && post(t, &w) == 0;
    struct ibv_wc wc;
    ok = ok && wait_wc(rcq, &wc) && wc.wr_id == 130 && wc.status == IBV_WC_SUCCESS;
    ok = ok && ibv_destroy_qp(r) == 0 && ibv_destroy_qp(t) == 0;
    return ok;
}

/* A completion event queued for a CQ destroyed before the event was read is skipped: the
 * next ibv_get_cq_event returns the live CQ's event. */
static void test_stale_channel_record(void)
{
    struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
    struct ibv_cq *x = ch ? ibv_create_cq(ctx, 8, (void *)1, ch, 0) : NULL;
    CHECK(x != NULL, "CQ X on a channel");
    if (!x)
        return;
    CHECK(ibv_req_notify_cq(x, 0) == 0 && message_to(x), "X armed and completed");
    struct pollfd p = { .fd = ch->fd, .events = POLLIN };
    CHECK(poll(&p, 1, 10000) == 1, "X's event is queued");
    CHECK(ibv_destroy_cq(x) == 0, "destroy X without reading its event");
    struct ibv_cq *y = ibv_create_cq(ctx, 8, (void *)2, ch, 0);
    CHECK(y != NULL, "CQ Y on the same channel");
    if (!y)
        return;
    CHECK(ibv_req_notify_cq(y, 0) == 0 && message_to(y), "Y armed and completed");
    struct ibv_cq *ev_cq = NULL;
    void *ev_ctx = NULL;
    CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0 && ev_cq == y && ev_ctx == (void *)2,
          "the stale record of X is skipped, Y's event returned");
    ibv_ack_cq_events(y, 1);
    CHECK(ibv_destroy_cq(y) == 0 && ibv_destroy_comp_channel(ch) == 0, "destroy Y and channel");
}

/* A fork child shares the parent's ring memory but must not post to or poll its rings. */
static void test_fork_child_keeps_off_the_rings(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        struct ibv_sge s = { (uintptr_t)abuf, 8, amr->lkey };
        struct ibv_send_wr w = { .wr_id = 140, .sg_list = &s, .num_sge = 1,
                                 .opcode = IBV_WR_SEND }, *bad = NULL;
        struct ibv_wc wc;
        int ok = ibv_post_send(qa, &w, &bad) == ENODEV && bad == &w &&
                 ibv_poll_cq(cq, 1, &wc) < 0;
        _exit(ok ? 0 : 1);
    }
    int status = -1;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
          WEXITSTATUS(status) == 0, "fork child: post_send ENODEV, poll_cq fails");
    /* The parent's pair is untouched. */
    struct ibv_wc wc;
    struct ibv_sge s = { (uintptr_t)abuf, 8, amr->lkey };
    struct ibv_send_wr w = { .wr_id = 141, .sg_list = &s, .num_sge = 1,
                             .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED };
    w.wr.rdma.remote_addr = (uintptr_t)bbuf;
    w.wr.rdma.rkey = bmr->rkey;
    CHECK(post(qa, &w) == 0 && wait_wc(cq, &wc) && wc.wr_id == 141 &&
          wc.status == IBV_WC_SUCCESS, "parent still posts and polls after the fork");
}

/* A peer process dies: with a finite retry count, the survivor's next send fails with
 * IBV_WC_RETRY_EXC_ERR (nobody acknowledges for a QP that no longer exists) instead of
 * hanging. The peer is a fork child with its own context (so its own daemon client). */
static void test_peer_death_is_a_retry_error(void)
{
    int to_child[2], to_parent[2];
    CHECK(pipe(to_child) == 0 && pipe(to_parent) == 0, "pipes");
    pid_t pid = fork();
    if (pid == 0) {
        struct ibv_device **l = ibv_get_device_list(NULL);
        struct ibv_context *c = l ? ibv_open_device(l[0]) : NULL;
        struct ibv_pd *p = c ? ibv_alloc_pd(c) : NULL;
        static char cbuf[4096];
        struct ibv_mr *m = p ? ibv_reg_mr(p, cbuf, sizeof cbuf, IBV_ACCESS_LOCAL_WRITE) : NULL;
        struct ibv_cq *q = c ? ibv_create_cq(c, 8, NULL, NULL, 0) : NULL;
        struct ibv_qp_init_attr ia = { .send_cq = q, .recv_cq = q, .qp_type = IBV_QPT_RC,
                                       .cap = { .max_send_wr = 4, .max_recv_wr = 4,
                                                .max_send_sge = 1, .max_recv_sge = 1 } };
        struct ibv_qp *qp = (p && q) ? ibv_create_qp(p, &ia) : NULL;
        uint32_t mine = qp ? qp->qp_num : 0, theirs = 0;
        if (write(to_parent[1], &mine, 4) != 4 || read(to_child[0], &theirs, 4) != 4 || !qp || !m)
            _exit(1);
        struct ibv_sge s = { (uintptr_t)cbuf, 64, m->lkey };
        struct ibv_recv_wr r = { .wr_id = 1, .sg_list = &s, .num_sge = 1 }, *bad;
        if (to_rts(qp, theirs) || ibv_post_recv(qp, &r, &bad))
            _exit(1);
        char ready = 1;
        if (write(to_parent[1], &ready, 1) != 1)
            _exit(1);
        for (;;)
            pause(); /* until SIGKILL */
    }
    CHECK(pid > 0, "fork the peer");
    if (pid <= 0)
        return;
    retry_count = 2;
    struct ibv_qp *qk = make_qp(cq, cq, NULL);
    uint32_t child_qpn = 0, mine = qk ? qk->qp_num : 0;
    char ready = 0;
    CHECK(qk && read(to_parent[0], &child_qpn, 4) == 4 && child_qpn != 0 &&
          write(to_child[1], &mine, 4) == 4 && to_rts(qk, child_qpn) == 0 &&
          read(to_parent[0], &ready, 1) == 1 && ready == 1, "the peer is connected");
    struct ibv_wc wc;
    struct ibv_sge s = { (uintptr_t)abuf, 16, amr->lkey };
    struct ibv_send_wr w = { .wr_id = 150, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
                             .send_flags = IBV_SEND_SIGNALED };
    CHECK(qk && post(qk, &w) == 0 && wait_wc(cq, &wc) && wc.wr_id == 150 &&
          wc.status == IBV_WC_SUCCESS, "a message to the live peer");
    kill(pid, SIGKILL);
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFSIGNALED(status), "the peer is dead");
    w.wr_id = 151;
    CHECK(qk && post(qk, &w) == 0 && wait_wc(cq, &wc) && wc.wr_id == 151 &&
          wc.status == IBV_WC_RETRY_EXC_ERR, "a message to the dead peer: RETRY_EXC_ERR");
    CHECK(qk && ibv_destroy_qp(qk) == 0, "destroy the survivor's QP");
    retry_count = 7;
    close(to_child[0]); close(to_child[1]); close(to_parent[0]); close(to_parent[1]);
}

static void test_wr_api(void)
{
    struct ibv_qp_init_attr_ex ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .pd = pd,
                                      .comp_mask = IBV_QP_INIT_ATTR_PD |
                                                   IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
                                      .send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE |
                                                        IBV_QP_EX_WITH_SEND_WITH_IMM,
                                      .cap = { .max_send_wr = 8, .max_recv_wr = 8,
                                               .max_send_sge = 2, .max_recv_sge = 1,
                                               .max_inline_data = 64 } };
    struct ibv_qp *qe = ibv_create_qp_ex(ctx, &ia);
    struct ibv_qp *qf = make_qp(cq, cq, NULL);
    CHECK(qe && qf, "QPs for the ibv_wr_* test");
    if (!qe || !qf)
        return;
    CHECK(to_rts(qe, qf->qp_num) == 0 && to_rts(qf, qe->qp_num) == 0, "E/F to RTS");
    struct ibv_qp_ex *x = ibv_qp_to_qp_ex(qe);
    CHECK(x != NULL, "ibv_qp_to_qp_ex");
    if (!x)
        return;
    fill(abuf, 1000, 13);
    memset(bbuf, 0, 2048);
    CHECK(post_recv(qf, 120, bbuf + 1024, 64, bmr->lkey) == 0, "post recv on F");
    ibv_wr_start(x);
    x->wr_id = 121;
    x->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_write(x, bmr->rkey, (uintptr_t)bbuf);
    ibv_wr_set_sge(x, amr->lkey, (uintptr_t)abuf, 1000);
    x->wr_id = 122;
    ibv_wr_send_imm(x, htobe32(4242));
    char msg[] = "batched inline";
    ibv_wr_set_inline_data(x, msg, sizeof msg);
    CHECK(ibv_wr_complete(x) == 0, "ibv_wr_complete");
    memset(msg, 0, sizeof msg);
    struct ibv_wc wc;
    int write_ok = 0, send_ok = 0, recv_ok = 0;
    for (int i = 0; i < 3 && wait_wc(cq, &wc); i++) {
        if (wc.wr_id == 121)
            write_ok = wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE;
        if (wc.wr_id == 122)
            send_ok = wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND;
        if (wc.wr_id == 120)
            recv_ok = wc.status == IBV_WC_SUCCESS && wc.byte_len == sizeof msg &&
                      (wc.wc_flags & IBV_WC_WITH_IMM) && wc.imm_data == htobe32(4242);
    }
    CHECK(write_ok && send_ok && recv_ok, "the batch's three completions");
    CHECK(memcmp(bbuf, abuf, 1000) == 0 && memcmp(bbuf + 1024, "batched inline", 15) == 0,
          "the batch's data");
    ibv_wr_start(x);
    ibv_wr_rdma_read(x, bmr->rkey, (uintptr_t)bbuf); /* not among the QP's send ops */
    ibv_wr_set_sge(x, amr->lkey, (uintptr_t)abuf, 8);
    CHECK(ibv_wr_complete(x) == EINVAL, "an op the QP was not created for fails the batch");
    CHECK(ibv_destroy_qp(qe) == 0 && ibv_destroy_qp(qf) == 0, "destroy E/F");
}

static void test_srq_limit(void)
{
    struct ibv_srq_init_attr sa = { .attr = { .max_wr = 8, .max_sge = 1 } };
    struct ibv_srq *srq = ibv_create_srq(pd, &sa);
    CHECK(srq != NULL, "create_srq");
    if (!srq)
        return;
    struct ibv_qp *qs = make_qp(cq, cq, srq), *qt = make_qp(cq, cq, NULL);
    CHECK(qs && qt, "QPs for the SRQ test");
    if (!qs || !qt)
        return;
    CHECK(to_rts(qs, qt->qp_num) == 0 && to_rts(qt, qs->qp_num) == 0, "S/T to RTS");
    for (int i = 0; i < 4; i++) {
        struct ibv_sge s = { (uintptr_t)bbuf + 64 * i, 64, bmr->lkey };
        struct ibv_recv_wr r = { .wr_id = 100 + i, .sg_list = &s, .num_sge = 1 }, *bad = NULL;
        CHECK(ibv_post_srq_recv(srq, &r, &bad) == 0, "post_srq_recv");
    }
    struct ibv_srq_attr lim = { .srq_limit = 2 };
    CHECK(ibv_modify_srq(srq, &lim, IBV_SRQ_LIMIT) == 0, "arm the SRQ limit");
    struct ibv_srq_attr q;
    CHECK(ibv_query_srq(srq, &q) == 0 && q.srq_limit == 2 && q.max_wr >= 8, "query_srq");
    struct ibv_wc wc;
    for (int i = 0; i < 3; i++) {
        struct ibv_sge s = { (uintptr_t)abuf, 16, amr->lkey };
        struct ibv_send_wr w = { .wr_id = 110 + i, .sg_list = &s, .num_sge = 1,
                                 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
        CHECK(post(qt, &w) == 0, "send to the SRQ QP");
        int send_ok = 0, recv_ok = 0;
        for (int k = 0; k < 2 && wait_wc(cq, &wc); k++) {
            if (wc.wr_id == (uint64_t)(110 + i))
                send_ok = wc.status == IBV_WC_SUCCESS;
            if (wc.wr_id == (uint64_t)(100 + i))
                recv_ok = wc.status == IBV_WC_SUCCESS && wc.qp_num == qs->qp_num;
        }
        CHECK(send_ok && recv_ok, "SRQ receive completes in order");
    }
    /* Earlier tests' error completions queued QP events first (access errors): skip those. */
    struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
    int limit_seen = 0;
    for (int i = 0; i < 16 && !limit_seen && poll(&p, 1, 10000) == 1; i++) {
        struct ibv_async_event ev;
        if (ibv_get_async_event(ctx, &ev) != 0)
            break;
        printf("async event %s\n", ibv_event_type_str(ev.event_type));
        if (ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED)
            limit_seen = ev.element.srq == srq;
        ibv_ack_async_event(&ev);
    }
    CHECK(limit_seen, "SRQ_LIMIT_REACHED names the SRQ");
    CHECK(ibv_destroy_qp(qs) == 0 && ibv_destroy_qp(qt) == 0, "destroy S/T");
    CHECK(ibv_destroy_srq(srq) == 0, "destroy_srq after the ack");
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    CHECK(list && n == 1, "one device");
    if (!list || n < 1)
        return 1;
    ctx = ibv_open_device(list[0]);
    CHECK(ctx != NULL, "open_device");
    if (!ctx)
        return 1;
    CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "GID 0");
    pd = ibv_alloc_pd(ctx);
    abuf = aligned_alloc(4096, LEN);
    bbuf = aligned_alloc(4096, LEN);
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                 IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND;
    amr = ibv_reg_mr(pd, abuf, LEN, access);
    bmr = ibv_reg_mr(pd, bbuf, LEN, access);
    cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
    CHECK(pd && amr && bmr && cq, "PD, MRs, CQ");
    if (!pd || !amr || !bmr || !cq)
        return 1;
    qa = make_qp(cq, cq, NULL);
    qb = make_qp(cq, cq, NULL);
    CHECK(qa && qb, "create A and B");
    if (!qa || !qb)
        return 1;
    connect_pair();
    struct ibv_qp_attr qattr;
    struct ibv_qp_init_attr qinit;
    CHECK(ibv_query_qp(qa, &qattr, IBV_QP_STATE | IBV_QP_CAP, &qinit) == 0 &&
          qattr.qp_state == IBV_QPS_RTS && qinit.cap.max_inline_data >= 64 &&
          qinit.send_cq == cq, "query_qp");

    test_write_read_atomics();
    test_inline_send();
    test_memory_windows();
    test_access_errors();
    test_channel_and_extended_poll();
    test_wr_api();
    test_stale_channel_record();
    test_fork_child_keeps_off_the_rings();
    test_peer_death_is_a_retry_error();
    test_srq_limit();

    CHECK(ibv_destroy_qp(qa) == 0 && ibv_destroy_qp(qb) == 0, "destroy A and B");
    CHECK(ibv_destroy_cq(cq) == 0, "destroy_cq");
    CHECK(ibv_dereg_mr(amr) == 0 && ibv_dereg_mr(bmr) == 0, "dereg_mr");
    CHECK(ibv_dealloc_pd(pd) == 0, "dealloc_pd");
    CHECK(ibv_close_device(ctx) == 0, "close_device");
    ibv_free_device_list(list);
    printf("%d checks, %d failures\n", checks, failures);
    return failures != 0;
}
"#;

#[test]
fn c_program_moves_data_with_every_operation_and_sees_the_right_errors() {
    let exe = compile_c("shim_datapath", PROGRAM, &["ibverbs"]);
    let daemon = Daemon::start("datapath-c", &["--addr", "127.0.0.40", "--port", "4791"]);
    let out = daemon.command(&exe).output().expect("run shim_datapath");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stdout = if out.status.success() {
        check_output("shim_datapath (C) under LD_PRELOAD", out)
    } else {
        panic!(
            "shim_datapath failed ({}):\n{stdout}\n--- stderr\n{}\n--- daemon\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            daemon.log()
        );
    };
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.ends_with(" checks, 0 failures"),
        "unexpected summary: {stdout}"
    );
    let checks: usize = last.split_whitespace().next().unwrap().parse().unwrap();
    assert!(
        checks >= 70,
        "the C program ran only {checks} checks:\n{stdout}"
    );
}
