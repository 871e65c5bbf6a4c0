/* The librdmacm API driven directly under the shim (tests/tests/shim_rdmacm.rs
 * `c_program_drives_the_cm_api`): a non-blocking, pollable channel, the shared context, bind
 * and port checks, options, resolve, rdma_create_qp with default PD/CQs, private data, accept,
 * the QP attributes the CM gave, disconnect as ib_cm does it, destroy, and a thread that asks a
 * channel for an event as another destroys it. argv[1]: the address. */
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <sys/time.h>

#define CHECK(c, code) do { if (!(c)) { fprintf(stderr, "check failed line %d: %s (errno %d %s)\n", __LINE__, #c, errno, strerror(errno)); return code; } } while (0)

static int next_event(struct rdma_event_channel *ch, enum rdma_cm_event_type want, struct rdma_cm_event **out) {
    struct pollfd p = { .fd = ch->fd, .events = POLLIN };
    if (poll(&p, 1, 10000) != 1) return -1;
    if (rdma_get_cm_event(ch, out)) return -2;
    if ((*out)->event != want) { fprintf(stderr, "got %s want %s\n", rdma_event_str((*out)->event), rdma_event_str(want)); return -3; }
    return 0;
}

static int late_returned;

static void on_alarm(int sig) { (void)sig; }

/* Ends the program if a wait the alarm should have interrupted goes on. */
static void *watchdog(void *arg) {
    (void)arg;
    sleep(10);
    fprintf(stderr, "a blocked rdma_get_cm_event outlived the signal by 10 s\n");
    _exit(70);
}

static void *late_reader(void *arg) {
    struct rdma_cm_event *e;
    rdma_get_cm_event(arg, &e);
    __atomic_store_n(&late_returned, 1, __ATOMIC_RELEASE);
    return NULL;
}

int main(int argc, char **argv) {
    const char *addr = argv[1];
    struct rdma_event_channel *ch = rdma_create_event_channel();
    CHECK(ch, 1);
    /* Blocking, with nothing to come: a signal whose handler does not ask for SA_RESTART
     * (qperf's timer) ends the wait with EINTR, as the kernel's rdma_cm fd does. */
    struct sigaction alrm = { .sa_handler = on_alarm };
    sigemptyset(&alrm.sa_mask);
    CHECK(sigaction(SIGALRM, &alrm, NULL) == 0, 66);
    struct itimerval it = { .it_value = { 0, 50000 } };
    CHECK(setitimer(ITIMER_REAL, &it, NULL) == 0, 67);
    pthread_t dog;
    CHECK(pthread_create(&dog, NULL, watchdog, NULL) == 0, 68);
    struct rdma_cm_event *early;
    errno = 0;
    int got = rdma_get_cm_event(ch, &early);
    pthread_cancel(dog);
    pthread_join(dog, NULL);
    CHECK(got == -1 && errno == EINTR, 69);
    /* Non-blocking: nothing queued is EAGAIN, as with the kernel's rdma_cm fd. */
    CHECK(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK) == 0, 2);
    struct rdma_cm_event *ev;
    errno = 0;
    CHECK(rdma_get_cm_event(ch, &ev) == -1 && errno == EAGAIN, 3);

    int n = 0;
    struct ibv_context **devs = rdma_get_devices(&n);
    CHECK(devs && n >= 1 && devs[n] == NULL, 4);

    struct rdma_cm_id *listen_id, *client;
    CHECK(rdma_create_id(ch, &listen_id, (void *)0x1234, RDMA_PS_TCP) == 0, 5);
    CHECK(listen_id->context == (void *)0x1234 && listen_id->channel == ch, 6);
    struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(7999) };
    inet_pton(AF_INET, addr, &sin.sin_addr);
    CHECK(rdma_bind_addr(listen_id, (struct sockaddr *)&sin) == 0, 7);
    CHECK(rdma_get_src_port(listen_id) == htons(7999), 8);
    CHECK(listen_id->verbs == devs[0], 9);  /* one shared context per device */
    CHECK(rdma_listen(listen_id, 4) == 0, 10);
    /* A second bind of the same port fails. */
    struct rdma_cm_id *dup;
    CHECK(rdma_create_id(ch, &dup, NULL, RDMA_PS_TCP) == 0, 11);
    CHECK(rdma_bind_addr(dup, (struct sockaddr *)&sin) == -1 && errno == EADDRINUSE, 12);
    CHECK(rdma_destroy_id(dup) == 0, 13);

    uint8_t tos = 32;
    CHECK(rdma_create_id(ch, &client, NULL, RDMA_PS_TCP) == 0, 14);
    CHECK(rdma_set_option(client, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof tos) == 0, 15);
    CHECK(rdma_set_option(client, RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, &tos, sizeof tos) == -1 && errno == ENOSYS, 16);
    CHECK(rdma_resolve_addr(client, NULL, (struct sockaddr *)&sin, 2000) == 0, 17);
    CHECK(next_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED, &ev) == 0, 18);
    CHECK(ev->id == client && ev->status == 0, 19);
    CHECK(rdma_ack_cm_event(ev) == 0, 20);
    CHECK(client->verbs == devs[0], 21);
    CHECK(rdma_get_dst_port(client) == htons(7999), 22);
    CHECK(rdma_get_local_addr(client)->sa_family == AF_INET, 23);
    CHECK(rdma_resolve_route(client, 2000) == 0, 24);
    CHECK(next_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, &ev) == 0, 25);
    CHECK(rdma_ack_cm_event(ev) == 0, 26);

    struct ibv_qp_init_attr qa = { .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 }, .qp_type = IBV_QPT_RC };
    CHECK(rdma_create_qp(client, NULL, &qa) == 0, 27);  /* default PD and CQs */
    CHECK(client->qp && client->pd && client->send_cq && client->recv_cq, 28);
    CHECK(client->pd->context == client->verbs && client->qp->state == IBV_QPS_INIT, 29);

    const char hello[] = "private hello";
    struct rdma_conn_param cp = { .private_data = hello, .private_data_len = sizeof hello, .responder_resources = 1, .initiator_depth = 1, .retry_count = 7, .rnr_retry_count = 7 };
    CHECK(rdma_connect(client, &cp) == 0, 30);
    CHECK(next_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST, &ev) == 0, 31);
    CHECK(ev->listen_id == listen_id && ev->id != listen_id, 32);
    struct rdma_cm_id *child = ev->id;
    CHECK(child->verbs == devs[0] && child->context == (void *)0x1234, 33);
    CHECK(ev->param.conn.private_data_len >= sizeof hello && memcmp(ev->param.conn.private_data, hello, sizeof hello) == 0, 34);
    CHECK(rdma_ack_cm_event(ev) == 0, 35);
    /* An SRQ made for the id is used by the id's QP (rdma_create_qp_ex takes id->srq). */
    struct ibv_srq_init_attr sa = { .attr = { .max_wr = 8, .max_sge = 1 } };
    CHECK(rdma_create_srq(child, NULL, &sa) == 0 && child->srq && child->pd, 60);
    struct ibv_qp_init_attr qa2 = qa;
    CHECK(rdma_create_qp(child, NULL, &qa2) == 0, 36);
    CHECK(child->qp->srq == child->srq, 61);
    CHECK(rdma_accept(child, NULL) == 0, 37);
    /* Both sides see ESTABLISHED (the client's after its QP went to RTS). */
    for (int i = 0; i < 2; i++) {
        CHECK(next_event(ch, RDMA_CM_EVENT_ESTABLISHED, &ev) == 0, 38);
        CHECK(ev->id == child || ev->id == client, 39);
        rdma_ack_cm_event(ev);
    }
    CHECK(client->qp->state == IBV_QPS_RTS && child->qp->state == IBV_QPS_RTS, 40);
    struct ibv_qp_attr qattr; struct ibv_qp_init_attr qinit;
    CHECK(ibv_query_qp(client->qp, &qattr, IBV_QP_DEST_QPN | IBV_QP_AV, &qinit) == 0, 41);
    CHECK(qattr.dest_qp_num == child->qp->qp_num, 42);
    CHECK(qattr.ah_attr.grh.traffic_class == tos, 43);
    qattr.qp_state = IBV_QPS_RTR;
    int mask = 0;
    CHECK(rdma_init_qp_attr(child, &qattr, &mask) == 0 && (mask & IBV_QP_DEST_QPN) && qattr.dest_qp_num == client->qp->qp_num, 44);

    /* As with ib_cm: the peer reports DISCONNECTED on the DREQ and answers with its own
     * rdma_disconnect (DREP); then the active side reports DISCONNECTED. */
    CHECK(rdma_disconnect(client) == 0, 45);
    CHECK(next_event(ch, RDMA_CM_EVENT_DISCONNECTED, &ev) == 0 && ev->id == child, 46);
    rdma_ack_cm_event(ev);
    CHECK(rdma_disconnect(child) == 0, 47);
    CHECK(next_event(ch, RDMA_CM_EVENT_DISCONNECTED, &ev) == 0 && ev->id == client, 48);
    rdma_ack_cm_event(ev);
    rdma_destroy_qp(client);
    rdma_destroy_qp(child);
    rdma_destroy_srq(child);
    CHECK(child->srq == NULL, 62);
    CHECK(rdma_destroy_id(client) == 0 && rdma_destroy_id(child) == 0 && rdma_destroy_id(listen_id) == 0, 49);
    CHECK(rdma_destroy_id(client) == -1 && errno == EINVAL, 50);  /* already gone */
    rdma_free_devices(devs);
    rdma_destroy_event_channel(ch);

    /* rping's cm thread at exit: it asks the channel for the next event just as the main
     * thread destroys it. The kernel's reader that got there first stays blocked; so does one
     * that comes just after, instead of failing (rping exits on the error). */
    struct rdma_event_channel *gone = rdma_create_event_channel();
    CHECK(gone, 63);
    rdma_destroy_event_channel(gone);
    pthread_t late;
    CHECK(pthread_create(&late, NULL, late_reader, gone) == 0, 64);
    usleep(300 * 1000);
    CHECK(!__atomic_load_n(&late_returned, __ATOMIC_ACQUIRE), 65);
    puts("ok");
    return 0;  /* (the waiting thread ends with the process) */
}
