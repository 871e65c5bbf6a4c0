//! A C program, compiled here against the system `<infiniband/verbs.h>` and linked with the
//! real `-libverbs`, run with LD_PRELOAD=libsoftroce.so: the implemented verbs give the right
//! answers, unsupported features and misuse (foreign objects, posting in RESET) fail with the
//! documented error instead of crashing, and the pure helpers match the real libibverbs byte
//! for byte. (Data movement is covered by shim_datapath_c.rs and shim_pingpong.rs.)

mod shim_support;

use shim_support::{check_output, compile_c, Daemon};

const PROGRAM: &str = r#"
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <dlfcn.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/time.h>

/* Private (IBVERBS_PRIVATE_34) but imported by ibv_devinfo; not in the public header. */
extern int ibv_query_gid_type(struct ibv_context *, uint8_t, unsigned int, int *);

static int failures, checks;
#define CHECK(cond, what) do { checks++; if (!(cond)) { failures++; \
    printf("FAIL line %d: %s (errno %d)\n", __LINE__, what, errno); } } while (0)

static void on_alarm(int sig) { (void)sig; }

/* Arms a one-shot SIGALRM in 50 ms, whose handler does not ask for SA_RESTART (as qperf's
 * timer): a blocking event read it interrupts ends with EINTR, as the kernel's does. */
static void alarm_soon(void)
{
    struct sigaction sa = { .sa_handler = on_alarm };
    sigemptyset(&sa.sa_mask);
    struct itimerval it = { .it_value = { 0, 50000 } };
    if (sigaction(SIGALRM, &sa, NULL) || setitimer(ITIMER_REAL, &it, NULL))
        printf("FAIL alarm (errno %d)\n", errno);
}

/* Ends the program if a wait the alarm should have interrupted goes on. */
static void *watchdog(void *what)
{
    sleep(10);
    printf("FAIL %s: still blocked 10 s after the signal\n", (const char *)what);
    fflush(stdout);
    _exit(1);
}

/* Runs `wait` (a blocking event read) with a watchdog; its result. */
#define INTERRUPTED(what, wait) ({ \
    pthread_t dog; \
    int dog_ok = pthread_create(&dog, NULL, watchdog, (void *)(what)) == 0; \
    alarm_soon(); \
    errno = 0; \
    int r = (wait); \
    int e = errno; \
    if (dog_ok) { pthread_cancel(dog); pthread_join(dog, NULL); } \
    errno = e; \
    r; })

static void compare_helpers(void)
{
    /* Under LD_PRELOAD, dlsym on libibverbs' own handle bypasses the shim (verbs-abi.md §3.4):
     * that gives the real implementation to compare with. */
    void *real = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
    CHECK(real != NULL, "real libibverbs loaded");
    if (!real)
        return;
    static const char *const str_fns[] = { "ibv_node_type_str", "ibv_port_state_str",
                                           "ibv_event_type_str", "ibv_wc_status_str" };
    for (unsigned f = 0; f < 4; f++) {
        const char *(*theirs)(int) = (const char *(*)(int))dlsym(real, str_fns[f]);
        const char *(*ours)(int) = (const char *(*)(int))dlsym(RTLD_DEFAULT, str_fns[f]);
        CHECK(theirs && ours && theirs != ours, "helper resolved in both libraries");
        if (!theirs || !ours || theirs == ours)
            continue;
        for (int v = -3; v < 40; v++)
            if (strcmp(theirs(v), ours(v)) != 0) {
                printf("FAIL %s(%d): real \"%s\", shim \"%s\"\n", str_fns[f], v, theirs(v), ours(v));
                failures++;
            }
        checks++;
    }
    static const char *const int_fns[] = { "ibv_rate_to_mult", "ibv_rate_to_mbps",
                                           "mult_to_ibv_rate", "mbps_to_ibv_rate" };
    for (unsigned f = 0; f < 4; f++) {
        int (*theirs)(int) = (int (*)(int))dlsym(real, int_fns[f]);
        int (*ours)(int) = (int (*)(int))dlsym(RTLD_DEFAULT, int_fns[f]);
        CHECK(theirs && ours && theirs != ours, "rate helper resolved in both libraries");
        if (!theirs || !ours || theirs == ours)
            continue;
        /* Every small value (enum values, multiples) and every Mb/s value rdma-core knows. */
        static const int mbps[] = { 2500, 5000, 10000, 14062, 20000, 25781, 28125, 30000,
                                    40000, 53125, 56250, 60000, 80000, 103125, 112500, 120000,
                                    168750, 206250, 309375, 425000, 637500, 850000, 1275000 };
        int values[600 + sizeof mbps / sizeof mbps[0]];
        unsigned nv = 0;
        for (int v = -2; v < 598; v++)
            values[nv++] = v;
        for (unsigned i = 0; i < sizeof mbps / sizeof mbps[0]; i++)
            values[nv++] = mbps[i];
        for (unsigned i = 0; i < nv; i++)
            if (theirs(values[i]) != ours(values[i])) {
                printf("FAIL %s(%d): real %d, shim %d\n", int_fns[f], values[i],
                       theirs(values[i]), ours(values[i]));
                failures++;
            }
        checks++;
    }
}

int main(int argc, char **argv)
{
    /* The node GUID the daemon reports for srxe0 (hex), from the test. */
    unsigned long long daemon_guid = argc > 1 ? strtoull(argv[1], NULL, 16) : 0;
    int n = -1;
    struct ibv_device **list = ibv_get_device_list(&n);
    CHECK(list && n == 1, "one device");
    if (!list || n < 1)
        return 1;
    CHECK(strcmp(ibv_get_device_name(list[0]), "srxe0") == 0, "device name");
    CHECK(list[0]->transport_type == IBV_TRANSPORT_IB && list[0]->node_type == IBV_NODE_CA,
          "node and transport type");
    CHECK(list[1] == NULL, "list is NULL-terminated");
    CHECK(be64toh(ibv_get_device_guid(list[0])) == daemon_guid, "node GUID from the daemon");
    struct ibv_device *dev = list[0];
    ibv_free_device_list(list);
    CHECK(strcmp(dev->name, "srxe0") == 0, "device outlives its list");
    CHECK(ibv_get_device_index(dev) == 0, "device index");

    struct ibv_context *ctx = ibv_open_device(dev);
    CHECK(ctx != NULL, "open device");
    if (!ctx)
        return 1;
    CHECK(ctx->device == dev && ctx->num_comp_vectors == 1, "context fields");

    struct ibv_device_attr attr;
    CHECK(ibv_query_device(ctx, &attr) == 0, "query_device");
    CHECK(attr.max_qp_rd_atom == 128 && attr.vendor_id == 0xffffff && attr.phys_port_cnt == 1 &&
          attr.atomic_cap == IBV_ATOMIC_HCA && attr.max_cqe == 1048575, "device attributes");
    struct ibv_device_attr_ex ax;
    memset(&ax, 0xee, sizeof ax);
    CHECK(ibv_query_device_ex(ctx, NULL, &ax) == 0, "query_device_ex via verbs_context");
    CHECK(ax.orig_attr.max_qp == 1048560 && ax.device_cap_flags_ex == 0x1223C76 &&
          ax.phys_port_cnt_ex == 1 && ax.odp_caps.general_caps == 0, "extended attributes");
    struct ibv_query_device_ex_input in = { .comp_mask = 1 };
    CHECK(ibv_query_device_ex(ctx, &in, &ax) == EINVAL, "unknown input comp_mask rejected");

    struct ibv_port_attr pa;
    CHECK(ibv_query_port(ctx, 1, &pa) == 0, "query_port via verbs_context");
    CHECK(pa.state == IBV_PORT_ACTIVE && pa.link_layer == IBV_LINK_LAYER_ETHERNET &&
          pa.active_mtu == IBV_MTU_4096 && pa.max_mtu == IBV_MTU_4096 &&
          pa.gid_tbl_len == 1024 && pa.lid == 0 && pa.pkey_tbl_len == 1, "port attributes");
    CHECK(ibv_query_port(ctx, 2, &pa) == EINVAL, "port 2 does not exist");
    {
        /* The exported symbol takes the 48-byte _compat_ibv_port_attr. */
        int (*compat)(struct ibv_context *, uint8_t, void *) =
            (int (*)(struct ibv_context *, uint8_t, void *))dlsym(RTLD_DEFAULT, "ibv_query_port");
        unsigned char buf[64];
        memset(buf, 0xab, sizeof buf);
        CHECK(compat && compat(ctx, 1, buf) == 0, "exported ibv_query_port");
        CHECK(buf[48] == 0xab && buf[49] == 0xab, "exported ibv_query_port stays within 48 bytes");
        CHECK(buf[46] == IBV_LINK_LAYER_ETHERNET, "compat link_layer");
    }

    union ibv_gid gid;
    static const uint8_t v4[16] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1 };
    static const uint8_t v6[16] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1 };
    CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0 && memcmp(gid.raw, v4, 16) == 0,
          "GID 0 is ::ffff:127.0.0.1 (loopback has no link-local address)");
    CHECK(ibv_query_gid(ctx, 1, 1, &gid) == 0 && memcmp(gid.raw, v6, 16) == 0, "GID 1 is ::1");
    CHECK(ibv_query_gid(ctx, 1, 5, &gid) == 0 && gid.global.subnet_prefix == 0 &&
          gid.global.interface_id == 0, "an empty GID reads as zero");
    errno = 0;
    CHECK(ibv_query_gid(ctx, 1, 1024, &gid) == -1 && errno == EINVAL, "GID past the table");
    struct ibv_gid_entry ge;
    CHECK(ibv_query_gid_ex(ctx, 1, 1, &ge, 0) == 0, "query_gid_ex");
    CHECK(ge.gid_type == IBV_GID_TYPE_ROCE_V2 && ge.gid_index == 1 && ge.port_num == 1 &&
          ge.gid.raw[15] == 1 && ge.gid.raw[0] == 0, "GID 1 is ::1, RoCE v2");
    CHECK(ibv_query_gid_ex(ctx, 1, 7, &ge, 0) == ENODATA, "empty slot: ENODATA");
    CHECK(ibv_query_gid_ex(ctx, 1, 0, &ge, 1) == EINVAL, "flags rejected");
    struct ibv_gid_entry tbl[8];
    CHECK(ibv_query_gid_table(ctx, tbl, 8, 0) == 2, "GID table has two entries");
    CHECK(tbl[0].gid.raw[10] == 0xff && tbl[0].gid.raw[12] == 127 && tbl[1].gid_index == 1 &&
          tbl[1].gid.raw[15] == 1 && tbl[1].gid_type == IBV_GID_TYPE_ROCE_V2, "GID table contents");
    CHECK(ibv_query_gid_table(ctx, tbl, 1, 0) == -EINVAL, "GID table buffer too small: -EINVAL");
    int gt = -1;
    CHECK(ibv_query_gid_type(ctx, 1, 1, &gt) == 0 && gt == 1, "sysfs GID type: RoCE v2");

    __be16 pkey = 0;
    CHECK(ibv_query_pkey(ctx, 1, 0, &pkey) == 0 && pkey == htobe16(0xffff), "P_Key 0 is 0xffff");
    CHECK(ibv_query_pkey(ctx, 1, 1, &pkey) == -1, "P_Key past the table");
    CHECK(ibv_get_pkey_index(ctx, 1, htobe16(0xffff)) == 0, "P_Key index");
    CHECK(ibv_get_pkey_index(ctx, 1, htobe16(0x8001)) == -1, "unknown P_Key");

    CHECK(ibv_fork_init() == 0 && ibv_is_fork_initialized() == IBV_FORK_UNNEEDED, "fork support");

    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    CHECK(pd && pd->context == ctx, "alloc_pd");
    CHECK(ibv_dealloc_pd(pd) == 0, "dealloc_pd");
    CHECK(ibv_dealloc_pd(pd) == EINVAL, "second dealloc_pd rejected, not a crash");
    pd = ibv_alloc_pd(ctx);
    CHECK(pd != NULL, "alloc_pd again");

    struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
    CHECK(ch && ch->fd >= 0 && ch->context == ctx, "create_comp_channel");
    if (ch) {
        CHECK(fcntl(ch->fd, F_GETFD) >= 0, "channel fd is a real fd");
        struct pollfd p = { .fd = ch->fd, .events = POLLIN };
        CHECK(poll(&p, 1, 0) == 0, "no completion event pending");
        struct ibv_cq *ev_cq;
        void *ev_ctx;
        CHECK(INTERRUPTED("get_cq_event", ibv_get_cq_event(ch, &ev_cq, &ev_ctx)) == -1 &&
                  errno == EINTR,
              "a signal ends a wait in get_cq_event with EINTR");
        CHECK(ibv_destroy_comp_channel(ch) == 0, "destroy_comp_channel");
    }

    struct ibv_async_event ev;
    CHECK(INTERRUPTED("get_async_event", ibv_get_async_event(ctx, &ev)) == -1 && errno == EINTR,
          "a signal ends a wait in get_async_event with EINTR");
    CHECK(fcntl(ctx->async_fd, F_SETFL, O_NONBLOCK) == 0, "async fd accepts O_NONBLOCK");
    errno = 0;
    CHECK(ibv_get_async_event(ctx, &ev) == -1 && errno == EAGAIN, "no async event: EAGAIN");

    /* Resources: created by the daemon, with the granted sizes reported back. */
    static char buf[4096];
    struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr && mr->addr == buf && mr->length == sizeof buf && mr->pd == pd, "reg_mr");
    volatile int access = IBV_ACCESS_LOCAL_WRITE; /* non-constant: the ibv_reg_mr_iova2 path */
    struct ibv_mr *mr2 = ibv_reg_mr(pd, buf, sizeof buf, access);
    CHECK(mr2 && mr2->lkey != (mr ? mr->lkey : 0), "reg_mr_iova2: a second MR, its own key");
    errno = 0;
    CHECK(ibv_reg_mr(pd, (void *)0x1000, 4096, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EFAULT,
          "reg_mr of unmapped memory: EFAULT");
    /* ibv_rereg_mr: libibverbs' input checks, then the device's; the keys stay. */
    static char buf2[8192];
    uint32_t key = mr2 ? mr2->lkey : 0;
    errno = 0;
    CHECK(mr2 && ibv_rereg_mr(mr2, 1 << 3, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT && errno == EINVAL,
          "rereg_mr with an unknown flag: IBV_REREG_MR_ERR_INPUT");
    CHECK(mr2 && ibv_rereg_mr(mr2, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT,
          "rereg_mr to no range: IBV_REREG_MR_ERR_INPUT");
    errno = 0;
    CHECK(mr2 && ibv_rereg_mr(mr2, 0, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_CMD && errno == EINVAL,
          "rereg_mr asking no change: the device's EINVAL");
    errno = 0;
    CHECK(mr2 && ibv_rereg_mr(mr2, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, (void *)0x1000, 4096, 0) ==
                     IBV_REREG_MR_ERR_CMD && errno == EFAULT && mr2->addr == buf,
          "rereg_mr onto unmapped memory: EFAULT, the MR unchanged");
    CHECK(mr2 && ibv_rereg_mr(mr2, IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS, NULL,
                              buf2, sizeof buf2, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ) == 0 &&
              mr2->addr == buf2 && mr2->length == sizeof buf2 && mr2->lkey == key,
          "rereg_mr to a new range and access: the MR follows, its key stays");
    struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
    CHECK(pd2 && mr2 && ibv_rereg_mr(mr2, IBV_REREG_MR_CHANGE_PD, pd2, NULL, 0, 0) == 0 && mr2->pd == pd2 &&
              ibv_dealloc_pd(pd2) == EBUSY,
          "rereg_mr to another PD: the MR holds it (dealloc_pd EBUSY)");
    CHECK(pd2 && mr2 && ibv_rereg_mr(mr2, IBV_REREG_MR_CHANGE_PD, pd, NULL, 0, 0) == 0 &&
              ibv_dealloc_pd(pd2) == 0,
          "rereg_mr back: the other PD is free again");
    struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    CHECK(cq && cq->cqe >= 16 && cq->context == ctx, "create_cq");
    struct ibv_wc wc;
    CHECK(cq && ibv_poll_cq(cq, 1, &wc) == 0, "empty CQ polls 0");
    CHECK(cq && ibv_req_notify_cq(cq, 0) == 0, "req_notify_cq");
    struct ibv_cq_init_attr_ex cqa = { .cqe = 16, .wc_flags = IBV_WC_STANDARD_FLAGS };
    struct ibv_cq_ex *cqx = ibv_create_cq_ex(ctx, &cqa);
    CHECK(cqx != NULL, "create_cq_ex");
    struct ibv_poll_cq_attr pca = { 0 };
    CHECK(cqx && ibv_start_poll(cqx, &pca) == ENOENT, "extended poll of an empty CQ: ENOENT");
    cqa.wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
    errno = 0;
    CHECK(ibv_create_cq_ex(ctx, &cqa) == NULL && errno == EOPNOTSUPP, "no completion timestamps");
    struct ibv_xrcd_init_attr xa = { .comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
                                     .fd = -1, .oflags = O_CREAT };
    errno = 0;
    CHECK(ibv_open_xrcd(ctx, &xa) == NULL && errno == EOPNOTSUPP, "open_xrcd");
    struct ibv_qp_init_attr qia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                    .cap = { .max_send_wr = 5, .max_recv_wr = 5,
                                             .max_send_sge = 1, .max_recv_sge = 1 } };
    struct ibv_qp *qp = ibv_create_qp(pd, &qia);
    CHECK(qp && qp->qp_num != 0 && qp->state == IBV_QPS_RESET && qia.cap.max_send_wr >= 5 &&
          qia.cap.max_inline_data > 0, "create_qp (granted caps written back)");
    struct ibv_send_wr swr = { .wr_id = 1, .opcode = IBV_WR_SEND }, *bad = NULL;
    CHECK(qp && ibv_post_send(qp, &swr, &bad) == EINVAL && bad == &swr, "post_send in RESET: EINVAL");
    struct ibv_recv_wr rwr = { .wr_id = 2 }, *rbad = NULL;
    CHECK(qp && ibv_post_recv(qp, &rwr, &rbad) == EINVAL && rbad == &rwr, "post_recv in RESET: EINVAL");
    CHECK(ibv_destroy_cq(cq) == EBUSY, "destroy_cq while a QP uses it: EBUSY");
    struct ibv_qp_init_attr_ex qx = { .qp_type = IBV_QPT_RC, .pd = pd, .send_cq = cq, .recv_cq = cq,
                                      .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
                                      .send_ops_flags = IBV_QP_EX_WITH_SEND,
                                      .cap = { .max_send_wr = 1, .max_recv_wr = 1,
                                               .max_send_sge = 1, .max_recv_sge = 1 } };
    struct ibv_qp *qpx = ibv_create_qp_ex(ctx, &qx);
    CHECK(qpx && ibv_qp_to_qp_ex(qpx) == (struct ibv_qp_ex *)qpx, "create_qp_ex with ibv_wr_*");
    CHECK(qp && ibv_qp_to_qp_ex(qp) == NULL, "a plain QP has no ibv_qp_ex API");
    CHECK(qpx && ibv_destroy_qp(qpx) == 0, "destroy the ibv_wr_* QP");
    qx.send_ops_flags = IBV_QP_EX_WITH_TSO;
    errno = 0;
    CHECK(ibv_create_qp_ex(ctx, &qx) == NULL && errno == EOPNOTSUPP, "no TSO send op (as rxe)");
    qx.send_ops_flags = IBV_QP_EX_WITH_ATOMIC_WRITE | IBV_QP_EX_WITH_RDMA_READ;
    qpx = ibv_create_qp_ex(ctx, &qx);
    CHECK(qpx && ibv_destroy_qp(qpx) == 0, "RC with atomic write and read (as rxe)");
    qx.qp_type = IBV_QPT_UC;
    errno = 0;
    CHECK(ibv_create_qp_ex(ctx, &qx) == NULL && errno == EOPNOTSUPP, "no atomic write or read on UC (as rxe)");
    qx.qp_type = IBV_QPT_UD;
    qx.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE;
    errno = 0;
    CHECK(ibv_create_qp_ex(ctx, &qx) == NULL && errno == EOPNOTSUPP, "sends only on UD (as rxe)");
    qx.qp_type = IBV_QPT_RC;
    struct ibv_srq_init_attr sia = { .attr = { .max_wr = 4, .max_sge = 1 } };
    struct ibv_srq *srq = ibv_create_srq(pd, &sia);
    CHECK(srq && sia.attr.max_wr >= 4, "create_srq");
    struct ibv_ah_attr aha = { .is_global = 1, .port_num = 1,
                               .grh = { .sgid_index = 0, .hop_limit = 64 } };
    aha.grh.dgid.raw[10] = aha.grh.dgid.raw[11] = 0xff;
    aha.grh.dgid.raw[12] = 127; aha.grh.dgid.raw[15] = 1;
    struct ibv_ah *ah = ibv_create_ah(pd, &aha);
    CHECK(ah != NULL, "create_ah");
    struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
    CHECK(mw && mw->type == IBV_MW_TYPE_2, "alloc_mw");

    /* The inline data path jumps through ctx->ops: foreign objects are refused, not crashed on. */
    struct ibv_qp fake_qp = { .context = ctx };
    bad = NULL;
    CHECK(ibv_post_send(&fake_qp, &swr, &bad) == EINVAL && bad == &swr, "post_send on a foreign QP");
    rbad = NULL;
    CHECK(ibv_post_recv(&fake_qp, &rwr, &rbad) == EINVAL && rbad == &rwr, "post_recv on a foreign QP");
    struct ibv_cq fake_cq = { .context = ctx };
    CHECK(ibv_poll_cq(&fake_cq, 1, &wc) < 0, "poll_cq on a foreign CQ");
    CHECK(ibv_req_notify_cq(&fake_cq, 0) == EINVAL, "req_notify_cq on a foreign CQ");

    CHECK(mw && ibv_dealloc_mw(mw) == 0, "dealloc_mw");
    CHECK(ah && ibv_destroy_ah(ah) == 0, "destroy_ah");
    CHECK(srq && ibv_destroy_srq(srq) == 0, "destroy_srq");
    CHECK(qp && ibv_destroy_qp(qp) == 0, "destroy_qp");
    CHECK(cq && ibv_destroy_cq(cq) == 0, "destroy_cq");
    CHECK(cqx && ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)) == 0, "destroy extended CQ");
    CHECK(ibv_dereg_mr(mr2) == 0 && ibv_dereg_mr(mr) == 0, "dereg_mr");
    CHECK(ibv_dereg_mr(mr) == EINVAL, "second dereg_mr rejected");

    CHECK(ibv_dealloc_pd(pd) == 0, "dealloc_pd");
    CHECK(ibv_close_device(ctx) == 0, "close_device");

    compare_helpers();

    printf("%d checks, %d failures\n", checks, failures);
    return failures != 0;
}
"#;

#[test]
fn c_program_sees_working_and_failing_verbs_without_crashing() {
    let exe = compile_c("shim_verbs", PROGRAM, &["ibverbs", "dl", "pthread"]);
    let daemon = Daemon::start("verbs-c", &[]);
    let guid = daemon.query_devices()[0].node_guid;
    let out = daemon
        .command(&exe)
        .arg(format!("{guid:016x}"))
        .output()
        .expect("run shim_verbs");
    let stdout = check_output("shim_verbs (C) under LD_PRELOAD", out);
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.ends_with(" checks, 0 failures"),
        "unexpected summary: {stdout}"
    );
    let checks: usize = last.split_whitespace().next().unwrap().parse().unwrap();
    assert!(
        checks >= 60,
        "the C program ran only {checks} checks:\n{stdout}"
    );
}
