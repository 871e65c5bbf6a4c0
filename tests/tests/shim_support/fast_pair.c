/* Two processes of one user on one device, each with its own context (so each its own daemon
 * client): the parent's QP talks to the child's. argv[1] picks a scenario; every completion
 * either side sees is printed ("side op status byte_len"), the data checked, so that a run on
 * the same-host fast path and one on the daemon's path can be compared line by line.
 *   ok      WRITE 4096 B, SEND 100 B, READ 4096 B: success, bytes compared
 *   big     messages of many packets at odd offsets: a WRITE of 150,001 B, a SEND of 70,001 B
 *           into a receive of two SGEs (the boundary inside a packet), a SEND of 150 B, and
 *           the WRITE again after the source changed (its completion returned the buffer);
 *           bytes compared, and nothing written past the ends
 *   access  a WRITE with a wrong R_Key: REM_ACCESS_ERR, then a WR posted after it flushed
 *   unpolled a WRITE posted and then left alone (the parent waits on a pipe, it does not poll):
 *           the bytes must still arrive, as on a device that runs on its own (on the fast
 *           path only the shim's backstop thread can run it)
 *   rnr     a SEND the child has no receive for (rnr_retry 1): RNR_RETRY_EXC_ERR
 *   many    8 more QPs a side; in each of 40 rounds the parent posts 64 WRITEs of 8 bytes at
 *           a stride of 64 on every QP (perftest's pattern for small messages) before it
 *           polls the 8 signaled completions, and queries one QP halfway through its 64
 *           (the daemon takes it back with work in flight; it is taken over again with what
 *           waited in its send ring); then the child checks every value of the round, and
 *           that nothing was written between them: a completion must mean the bytes are in
 *           place, however many directions one poll runs
 *   held    after a WRITE on the fast path, a query takes the QP back; a SEND the child has
 *           no receive for yet keeps the daemon's requester busy (RNR, retried for ever), and
 *           the WRITE posted after it finds the QP's send ring held for a take; from then on
 *           the parent only polls (once the child has posted its receive): the take must
 *           come from the poll, and the WRITE run on the fast path (the test counts grants)
 *   late    perftest's order of connection when the passive side is slow: the parent's QP
 *           reaches RTS before the child's has its destination, and the child's stops at RTR
 *           (a responder only); then a WRITE, bytes compared: the device must offer the
 *           parent's QP once the child's connects to it (the test counts grants) */
#include <infiniband/verbs.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LEN (512 * 1024)
struct side { struct ibv_context *ctx; struct ibv_pd *pd; struct ibv_cq *cq; struct ibv_qp *qp;
              struct ibv_mr *mr; char *buf; union ibv_gid gid; };
struct card { uint32_t qpn; uint32_t rkey; uint64_t addr; };

static void die(const char *what) { printf("FAIL %s\n", what); fflush(stdout); exit(1); }

static void open_side(struct side *s)
{
    struct ibv_device **l = ibv_get_device_list(NULL);
    if (!l || !l[0] || !(s->ctx = ibv_open_device(l[0]))) die("open device");
    if (ibv_query_gid(s->ctx, 1, 0, &s->gid)) die("query gid");
    s->pd = ibv_alloc_pd(s->ctx);
    s->cq = s->pd ? ibv_create_cq(s->ctx, 16, NULL, NULL, 0) : NULL;
    s->buf = aligned_alloc(4096, LEN);
    memset(s->buf, 0, LEN);
    s->mr = s->cq ? ibv_reg_mr(s->pd, s->buf, LEN, IBV_ACCESS_LOCAL_WRITE |
                               IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ) : NULL;
    struct ibv_qp_init_attr ia = { .send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
                                   .cap = { .max_send_wr = 8, .max_recv_wr = 8,
                                            .max_send_sge = 1, .max_recv_sge = 2 } };
    if (!s->mr || !(s->qp = ibv_create_qp(s->pd, &ia))) die("resources");
}

#define NQ 8      /* "many": the extra QPs of each side */
#define PER 64    /* "many": WRITEs per QP and round */
#define ROUNDS 40

static struct ibv_qp *more_qp(struct side *s)
{
    struct ibv_qp_init_attr ia = { .send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
                                   .cap = { .max_send_wr = PER, .max_recv_wr = 1,
                                            .max_send_sge = 1, .max_recv_sge = 1 } };
    struct ibv_qp *qp = ibv_create_qp(s->pd, &ia);
    if (!qp) die("more QPs");
    return qp;
}

static void qp_to_rts(struct side *s, struct ibv_qp *qp, uint32_t remote, int rnr_retry);

static void to_rts(struct side *s, uint32_t remote, int rnr_retry)
{
    qp_to_rts(s, s->qp, remote, rnr_retry);
}

/* The "many" QPs: created, their numbers exchanged over the pipes, moved to RTS. */
static void many_qps(struct side *s, struct ibv_qp **qps, int out, int in)
{
    uint32_t mine[NQ], theirs[NQ];
    for (int q = 0; q < NQ; q++) {
        qps[q] = more_qp(s);
        mine[q] = qps[q]->qp_num;
    }
    if (write(out, mine, sizeof mine) != sizeof mine || read(in, theirs, sizeof theirs) != sizeof theirs)
        die("many exchange");
    for (int q = 0; q < NQ; q++)
        qp_to_rts(s, qps[q], theirs[q], 7);
}

static uint64_t many_value(int round, int q, int i)
{
    return ((uint64_t)round << 32) | ((uint64_t)q << 16) | (uint64_t)(i + 1);
}

static void qp_to_rtr(struct side *s, struct ibv_qp *qp, uint32_t remote)
{
    struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
                             .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        die("INIT");
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = remote;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = s->gid;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                      IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        die("RTR");
}

static void qp_to_rts(struct side *s, struct ibv_qp *qp, uint32_t remote, int rnr_retry)
{
    qp_to_rtr(s, qp, remote);
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = rnr_retry;
    a.max_rd_atomic = 1;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                      IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
        die("RTS");
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* One completion, printed; dies after 20 s without one. */
static struct ibv_wc one(struct side *s, const char *who)
{
    struct ibv_wc wc;
    double deadline = now() + 20;
    int n;
    while ((n = ibv_poll_cq(s->cq, 1, &wc)) == 0)
        if (now() > deadline) die("no completion within 20 s");
    if (n < 0) die("poll_cq");
    printf("%s wr_id=%llu opcode=%d status=%d byte_len=%u\n", who, (unsigned long long)wc.wr_id,
           wc.opcode, wc.status, wc.status == IBV_WC_SUCCESS ? wc.byte_len : 0);
    fflush(stdout);
    return wc;
}

static void post(struct side *s, uint64_t id, enum ibv_wr_opcode op, uint32_t off, uint32_t len,
                 uint64_t raddr, uint32_t rkey)
{
    struct ibv_sge g = { (uintptr_t)(s->buf + off), len, s->mr->lkey };
    struct ibv_send_wr w = { .wr_id = id, .sg_list = &g, .num_sge = 1, .opcode = op,
                             .send_flags = IBV_SEND_SIGNALED }, *bad;
    w.wr.rdma.remote_addr = raddr;
    w.wr.rdma.rkey = rkey;
    if (ibv_post_send(s->qp, &w, &bad)) die("post_send");
}

int main(int argc, char **argv)
{
    const char *scenario = argc > 1 ? argv[1] : "ok";
    int rnr = !strcmp(scenario, "rnr");
    int held = !strcmp(scenario, "held");
    int late = !strcmp(scenario, "late");
    int up[2], down[2];
    if (pipe(up) || pipe(down)) die("pipes");
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        struct side c;
        open_side(&c);
        struct card mine = { c.qp->qp_num, c.mr->rkey, (uintptr_t)c.buf }, theirs;
        if (write(up[1], &mine, sizeof mine) != sizeof mine ||
            read(down[0], &theirs, sizeof theirs) != sizeof theirs)
            die("child exchange");
        char go;
        if (!late)
            to_rts(&c, theirs.qpn, 7);
        else if (read(down[0], &go, 1) != 1)
            die("child go");
        else
            qp_to_rtr(&c, c.qp, theirs.qpn);
        struct ibv_qp *cq_many[NQ];
        int many_round = 0, many_ok = 0;
        if (!strcmp(scenario, "many"))
            many_qps(&c, cq_many, up[1], down[0]);
        if (!strcmp(scenario, "big")) {
            struct ibv_sge two[2] = { { (uintptr_t)(c.buf + 200000), 1000, c.mr->lkey },
                                      { (uintptr_t)(c.buf + 300001), 70000, c.mr->lkey } };
            struct ibv_sge small = { (uintptr_t)(c.buf + 400000), 200, c.mr->lkey };
            struct ibv_recv_wr r2 = { .wr_id = 9, .sg_list = &small, .num_sge = 1 };
            struct ibv_recv_wr r = { .wr_id = 8, .sg_list = two, .num_sge = 2, .next = &r2 }, *bad;
            if (ibv_post_recv(c.qp, &r, &bad)) die("post_recv");
        } else if (!rnr && !held) {
            struct ibv_sge g = { (uintptr_t)(c.buf + 4096), 4096, c.mr->lkey };
            struct ibv_recv_wr r = { .wr_id = 7, .sg_list = &g, .num_sge = 1 }, *bad;
            if (ibv_post_recv(c.qp, &r, &bad)) die("post_recv");
        }
        char b = 1;
        if (write(up[1], &b, 1) != 1) die("child ready");
        /* 'w': the WRITE's bytes; 'r': the SEND's completion and bytes; 'x': done. */
        while (read(down[0], &b, 1) == 1 && b != 'x') {
            int ok = 1;
            if (b == 'w') {
                for (int i = 0; i < 4096; i++)
                    ok &= c.buf[i] == (char)(i * 7 + 1);
                printf("child WRITE bytes %s\n", ok ? "match" : "DIFFER");
            } else if (b == 'r') {
                struct ibv_wc wc = one(&c, "child");
                for (int i = 0; i < 100 && wc.status == IBV_WC_SUCCESS; i++)
                    ok &= c.buf[4096 + i] == (char)(i * 3 + 5);
                printf("child SEND bytes %s\n", ok ? "match" : "DIFFER");
            } else if (b == 'W' || b == 'V') {
                char x = b == 'V' ? 0x55 : 0;
                for (int i = 0; i < 150001; i++)
                    ok &= c.buf[5 + i] == (char)((i * 13 + 7) ^ x);
                ok &= c.buf[4] == 0 && c.buf[5 + 150001] == 0;
                printf("child big WRITE%s bytes %s\n", x ? " again" : "", ok ? "match" : "DIFFER");
            } else if (b == 'S') {
                struct ibv_wc wc = one(&c, "child");
                for (int i = 0; i < 70001 && wc.status == IBV_WC_SUCCESS; i++)
                    ok &= c.buf[i < 1000 ? 200000 + i : 300001 + i - 1000] == (char)(i * 5 + 3);
                ok &= c.buf[200000 + 1000] == 0 && c.buf[300001 + 69001] == 0;
                printf("child big SEND bytes %s\n", ok ? "match" : "DIFFER");
            } else if (b == 'u') {
                volatile char *v = c.buf + 8192;
                double deadline = now() + 5;
                do {
                    ok = 1;
                    for (int i = 0; i < 4096 && ok; i++)
                        ok &= v[i] == (char)(i * 7 + 1);
                } while (!ok && now() < deadline);
                printf("child unpolled WRITE bytes %s\n", ok ? "arrived" : "MISSING");
            } else if (b == 'm') {
                many_round++;
                for (int q = 0; q < NQ; q++)
                    for (int i = 0; i < PER; i++) {
                        const char *at = c.buf + (q * PER + i) * 64;
                        uint64_t v;
                        memcpy(&v, at, 8);
                        ok &= v == many_value(many_round, q, i);
                        for (int g = 8; g < 64; g++)
                            ok &= at[g] == 0;
                    }
                if (ok)
                    many_ok++;
                else
                    printf("child many round %d DIFFERS\n", many_round);
            } else if (b == 'p') {
                struct ibv_sge g = { (uintptr_t)(c.buf + 4096), 4096, c.mr->lkey };
                struct ibv_recv_wr r = { .wr_id = 7, .sg_list = &g, .num_sge = 1 }, *bad;
                if (ibv_post_recv(c.qp, &r, &bad)) die("post_recv");
            } else if (b == 'M') {
                printf("child many WRITEs: %d of %d rounds matched\n", many_ok, many_round);
            } else if (b == 's') {
                struct ibv_wc wc = one(&c, "child");
                for (int i = 0; i < 150 && wc.status == IBV_WC_SUCCESS; i++)
                    ok &= c.buf[400000 + i] == (char)(i * 9 + 1);
                ok &= c.buf[400000 + 150] == 0;
                printf("child small SEND bytes %s\n", ok ? "match" : "DIFFER");
            }
            fflush(stdout);
            if (write(up[1], &b, 1) != 1) die("child answer");
        }
        _exit(0);
    }
    struct side p;
    open_side(&p);
    struct card theirs, mine;
    if (read(up[0], &theirs, sizeof theirs) != sizeof theirs) die("parent exchange");
    mine = (struct card){ p.qp->qp_num, p.mr->rkey, (uintptr_t)p.buf };
    if (write(down[1], &mine, sizeof mine) != sizeof mine) die("parent exchange");
    to_rts(&p, theirs.qpn, rnr ? 1 : 7);
    char b = 'g';
    if (late && write(down[1], &b, 1) != 1)
        die("parent go");
    struct ibv_qp *pq_many[NQ];
    if (!strcmp(scenario, "many"))
        many_qps(&p, pq_many, down[1], up[0]);
    if (read(up[0], &b, 1) != 1) die("child not ready");
#define ASK(c) do { b = c; if (write(down[1], &b, 1) != 1 || read(up[0], &b, 1) != 1) die("ask"); } while (0)
    for (int i = 0; i < 4096; i++)
        p.buf[i] = (char)(i * 7 + 1);
    for (int i = 0; i < 100; i++)
        p.buf[4096 + i] = (char)(i * 3 + 5);
    if (!strcmp(scenario, "ok")) {
        post(&p, 1, IBV_WR_RDMA_WRITE, 0, 4096, theirs.addr, theirs.rkey);
        one(&p, "parent");
        ASK('w');
        post(&p, 2, IBV_WR_SEND, 4096, 100, 0, 0);
        one(&p, "parent");
        ASK('r');
        memset(p.buf, 0, 4096);
        post(&p, 3, IBV_WR_RDMA_READ, 0, 4096, theirs.addr, theirs.rkey);
        one(&p, "parent");
        int ok = 1;
        for (int i = 0; i < 4096; i++)
            ok &= p.buf[i] == (char)(i * 7 + 1);
        printf("parent READ bytes %s\n", ok ? "match" : "DIFFER");
        fflush(stdout);
    } else if (!strcmp(scenario, "big")) {
        for (int i = 0; i < 150001; i++)
            p.buf[3 + i] = (char)(i * 13 + 7);
        for (int i = 0; i < 70001; i++)
            p.buf[160000 + i] = (char)(i * 5 + 3);
        for (int i = 0; i < 150; i++)
            p.buf[240000 + i] = (char)(i * 9 + 1);
        post(&p, 11, IBV_WR_RDMA_WRITE, 3, 150001, theirs.addr + 5, theirs.rkey);
        one(&p, "parent");
        ASK('W');
        post(&p, 12, IBV_WR_SEND, 160000, 70001, 0, 0);
        one(&p, "parent");
        ASK('S');
        post(&p, 13, IBV_WR_SEND, 240000, 150, 0, 0);
        one(&p, "parent");
        ASK('s');
        for (int i = 0; i < 150001; i++)
            p.buf[3 + i] ^= 0x55;
        post(&p, 14, IBV_WR_RDMA_WRITE, 3, 150001, theirs.addr + 5, theirs.rkey);
        one(&p, "parent");
        ASK('V');
    } else if (!strcmp(scenario, "many")) {
        int failed = 0;
        for (int round = 1; round <= ROUNDS; round++) {
            for (int q = 0; q < NQ; q++)
                for (int i = 0; i < PER; i++) {
                    int k = q * PER + i;
                    char *src = p.buf + 262144 + k * 8;
                    uint64_t v = many_value(round, q, i);
                    memcpy(src, &v, 8);
                    struct ibv_sge g = { (uintptr_t)src, 8, p.mr->lkey };
                    struct ibv_send_wr w = { .wr_id = 1000 + k, .sg_list = &g, .num_sge = 1,
                                             .opcode = IBV_WR_RDMA_WRITE,
                                             .send_flags = i == PER - 1 ? IBV_SEND_SIGNALED : 0 },
                                       *bad;
                    w.wr.rdma.remote_addr = theirs.addr + (uint64_t)k * 64;
                    w.wr.rdma.rkey = theirs.rkey;
                    if (ibv_post_send(pq_many[q], &w, &bad)) die("post_send many");
                    if (i == PER / 2 && q == round % NQ) {
                        /* A query takes the QP back to the daemon with work in flight: the
                         * rest of the round waits in its send ring, and the fast path takes
                         * the QP over again with what waits there. */
                        struct ibv_qp_attr qa;
                        struct ibv_qp_init_attr qi;
                        if (ibv_query_qp(pq_many[q], &qa, IBV_QP_STATE, &qi) || qa.qp_state != IBV_QPS_RTS)
                            die("query_qp many");
                    }
                }
            struct ibv_wc wcs[16];
            double deadline = now() + 20;
            for (int got = 0; got < NQ;) {
                int n = ibv_poll_cq(p.cq, 16, wcs);
                if (n < 0) die("poll_cq");
                for (int j = 0; j < n; j++)
                    failed += wcs[j].status != IBV_WC_SUCCESS;
                got += n;
                if (!n && now() > deadline) die("no completion within 20 s");
            }
            ASK('m');
        }
        printf("parent many WRITEs: %d failed\n", failed);
        fflush(stdout);
        ASK('M');
    } else if (held) {
        post(&p, 31, IBV_WR_RDMA_WRITE, 0, 4096, theirs.addr, theirs.rkey);
        one(&p, "parent");
        ASK('w');
        struct ibv_qp_attr qa;
        struct ibv_qp_init_attr qi;
        if (ibv_query_qp(p.qp, &qa, IBV_QP_STATE, &qi) || qa.qp_state != IBV_QPS_RTS)
            die("query_qp held");
        /* The query gave the QP back (the shim waits 5 ms before it asks again): the SEND
         * goes to the daemon, which meets RNR NAKs until the child posts its receive. */
        post(&p, 32, IBV_WR_SEND, 4096, 100, 0, 0);
        for (double until = now() + 0.02; now() < until;)
            ;
        /* Asks for a take while the daemon's requester is busy: the daemon holds the send
         * ring, and this WRITE waits in it. */
        post(&p, 33, IBV_WR_RDMA_WRITE, 0, 4096, theirs.addr + 8192, theirs.rkey);
        ASK('p');
        one(&p, "parent");
        one(&p, "parent");
        ASK('r');
        ASK('u');
    } else if (late) {
        post(&p, 41, IBV_WR_RDMA_WRITE, 0, 4096, theirs.addr, theirs.rkey);
        one(&p, "parent");
        ASK('w');
    } else if (!strcmp(scenario, "unpolled")) {
        post(&p, 21, IBV_WR_RDMA_WRITE, 0, 4096, theirs.addr + 8192, theirs.rkey);
        ASK('u');
        one(&p, "parent");
    } else if (!strcmp(scenario, "access")) {
        /* WR 5 is posted once WR 4 has failed, so that it is flushed without reaching the
         * wire: posted together, it would reach the errored responder (one more
         * drop_qp_state) or not, depending on whether the NAK came first. */
        post(&p, 4, IBV_WR_RDMA_WRITE, 0, 4096, theirs.addr, theirs.rkey ^ 0x5a);
        one(&p, "parent");
        post(&p, 5, IBV_WR_RDMA_WRITE, 0, 64, theirs.addr, theirs.rkey);
        one(&p, "parent");
    } else {
        post(&p, 6, IBV_WR_SEND, 4096, 100, 0, 0);
        one(&p, "parent");
    }
    b = 'x';
    if (write(down[1], &b, 1) != 1)
        die("tell the child");
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
        die("child");
    printf("done\n");
    return 0;
}
