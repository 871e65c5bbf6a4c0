// Baselines for scripts/bench: what this machine physically allows, measured in the same run as
// softroce. Every mode prints one line per figure, `baseline=NAME key=value ...`, which the
// script parses.
//
//   baseline memcpy SIZE...            memcpy of SIZE bytes, cache-hot source and destination
//   baseline pvm SIZE...               process_vm_writev of SIZE bytes into another process
//                                      (both buffers 4 KiB-aligned), one call per message
//   baseline pvm_pieces N STRIDE SIZE  the ceiling of small RDMA WRITEs between two processes:
//                                      process_vm_writev of N remote pieces of SIZE bytes, STRIDE
//                                      bytes apart, per call (perftest's `-s 8` writes sit 64
//                                      bytes apart, so no two merge), against the same pieces
//                                      stored into a mapping both processes share; pieces/s each
//   baseline udp ADDR PORT SEG MODE    a UDP stream over loopback of SEG-byte datagrams (a RoCE
//                                      packet: headers + payload + ICRC); MODE `pkt` is one
//                                      sendmsg/recvmsg per datagram, `gso` is UDP GSO on send
//                                      (up to 64 KiB per call) and GRO on receive, `gso_zc` is
//                                      `gso` sent with MSG_ZEROCOPY (issue 17 asks whether
//                                      zero-copy sends pay): the completions are reaped from the
//                                      error queue, and the line says how many of the sends the
//                                      kernel reported it copied after all
//   baseline tcp ADDR PORT             one TCP stream over loopback, 64 KiB writes
//   baseline pingpong ADDR PORT N      UDP ping-pong of 2-byte datagrams, both sides busy-poll;
//                                      one-way latency = RTT/2, percentiles over N round trips
//   baseline shmpingpong N             ping-pong of a counter through shared memory between two
//                                      processes, both busy-polling (the shortest hop one process
//                                      can make to another: a cache line moving between cores);
//                                      one way = RTT/2, percentiles over N round trips
//   baseline handoff                   why a live capture's writer never reads what a device
//                                      wrote: a thread copies 4 KiB packets into 128 KiB batches
//                                      that a second thread then reads whole, 8 batches in
//                                      rotation; ns per packet copy, with the reader reading and
//                                      (for comparison) without
//
// Each side is its own process (the receiver/server a forked child). With BASELINE_PIN set the
// sender runs on CPU 0 and the receiver on CPU 1; by default neither is pinned, like the
// perftest programs and daemons they are compared with (on a shared machine a pinned busy-poller
// waits behind whatever else runs on its CPU). Loopback only; the script passes addresses from
// 127.0.0.200..220.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <linux/errqueue.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <netinet/udp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif
#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif
#ifndef SO_EE_ORIGIN_ZEROCOPY
#define SO_EE_ORIGIN_ZEROCOPY 5
#endif
#ifndef SO_EE_CODE_ZEROCOPY_COPIED
#define SO_EE_CODE_ZEROCOPY_COPIED 1
#endif

// How long each streaming figure is measured for, seconds (BASELINE_SECONDS overrides).
static double run_seconds = 1.0;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Sets `best` to the best operations per second of three rounds (the machine is shared), each
// repeating `op` in batches of `reps` for a twelfth of the run time. A macro, not a function
// taking a callback, so that `op` is inlined: an indirect call per memcpy of a few bytes would
// be measured too.
#define BEST_RATE(best, reps, op)                      \
    do {                                               \
        (best) = 0;                                    \
        for (int round_ = 0; round_ < 3; round_++) {   \
            double t0_ = now(), t_;                    \
            long done_ = 0;                            \
            do {                                       \
                for (long r_ = 0; r_ < (reps); r_++) op \
                done_ += (reps);                       \
                t_ = now() - t0_;                      \
            } while (t_ < run_seconds / 12);           \
            if (done_ / t_ > (best)) (best) = done_ / t_; \
        }                                              \
    } while (0)

static void die(const char *what) {
    perror(what);
    exit(1);
}

// Forked children die with their parent (a killed or timed-out run leaves nothing behind).
static pid_t fork_child(void) {
    pid_t parent = getpid();
    pid_t child = fork();
    if (child < 0) die("fork");
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(1);
    }
    return child;
}

static void pin(int cpu) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 2 || !getenv("BASELINE_PIN")) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu % n, &set);
    sched_setaffinity(0, sizeof set, &set);
}

static void *aligned(size_t size) {
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) die("mmap");
    memset(p, 0x5a, size);  // fault every page in before timing
    return p;
}

// Repetitions between two clock reads: about `budget_bytes` worth, between 1 and 4096 (a tiny
// message must not run for seconds before the clock is looked at).
static long reps_for(size_t size, double budget_bytes) {
    long reps = (long)(budget_bytes / (double)size);
    return reps < 1 ? 1 : reps > 4096 ? 4096 : reps;
}

static void mode_memcpy(int argc, char **argv) {
    pin(0);
    for (int i = 0; i < argc; i++) {
        size_t size = strtoull(argv[i], NULL, 0);
        char *src = aligned(size), *dst = aligned(size);
        long reps = reps_for(size, 64e6);
        double best;
        BEST_RATE(best, reps, {
            memcpy(dst, src, size);
            __asm__ volatile("" ::"r"(dst) : "memory");
        });
        printf("baseline=memcpy size=%zu GBps=%.4g Mmsgps=%.4g\n", size, size * best / 1e9, best / 1e6);
        fflush(stdout);
        munmap(src, size);
        munmap(dst, size);
    }
}

// A child process (on CPU 1 with BASELINE_PIN) holding a buffer of `size` bytes, its pages
// faulted in: its pid, the buffer's address in it, and a descriptor to write a byte to when
// the parent is done with it (the child then exits; reap it with waitpid).
static pid_t buffer_child(size_t size, uintptr_t *remote, int *done) {
    int to_parent[2], to_child[2];
    if (pipe(to_parent) || pipe(to_child)) die("pipe");
    pid_t child = fork_child();
    if (child == 0) {
        pin(1);
        uintptr_t addr = (uintptr_t)aligned(size);
        if (write(to_parent[1], &addr, sizeof addr) != sizeof addr) _exit(1);
        char c;
        (void)!read(to_child[0], &c, 1);  // until the parent is done
        _exit(0);
    }
    pin(0);
    if (read(to_parent[0], remote, sizeof *remote) != sizeof *remote) die("read child address");
    *done = to_child[1];
    return child;
}

// The child holds one buffer of the largest size and tells the parent its address; the parent
// writes into it with process_vm_writev, one call per message, as a daemon moving a message
// into an application's registered memory would.
static void mode_pvm(int argc, char **argv) {
    size_t max = 0;
    for (int i = 0; i < argc; i++) {
        size_t s = strtoull(argv[i], NULL, 0);
        if (s > max) max = s;
    }
    uintptr_t remote;
    int done;
    pid_t child = buffer_child(max, &remote, &done);
    char *src = aligned(max);
    for (int i = 0; i < argc; i++) {
        size_t size = strtoull(argv[i], NULL, 0);
        struct iovec local = {src, size}, far = {(void *)remote, size};
        long reps = reps_for(size, 64e6);
        double best;
        BEST_RATE(best, reps, {
            if (process_vm_writev(child, &local, 1, &far, 1, 0) != (ssize_t)size)
                die("process_vm_writev");
        });
        printf("baseline=pvm_writev size=%zu GBps=%.4g Mmsgps=%.4g\n", size, size * best / 1e9, best / 1e6);
        fflush(stdout);
    }
    (void)!write(done, "x", 1);
    waitpid(child, NULL, 0);
}

// The kernel pins the remote page of every piece of a process_vm_writev anew (no two pieces
// of perftest's small writes share a call's iovec), which bounds how many small writes per
// second any writer through it can place, whatever it does around the call. Stores into a
// shared mapping are the other way one process can place bytes in another: what that costs
// per piece, with one release store per call's worth of pieces (a consumer's flag).
static void mode_pvm_pieces(int n, size_t stride, size_t size) {
    size_t span = 1 << 22;  // 4 MiB of targets, walked through as perftest walks its buffer
    if (n < 1 || n > 1024 || size < 1 || size > stride || (size_t)n * stride > span) {
        fprintf(stderr, "pvm_pieces: N in 1..1024, SIZE in 1..STRIDE, N x STRIDE at most 4 MiB\n");
        exit(2);
    }
    char *shared = mmap(NULL, span + 64, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) die("mmap shared");
    memset(shared, 0, span + 64);
    uintptr_t remote;
    int done;
    pid_t child = buffer_child(span, &remote, &done);
    char *src = aligned((size_t)n * size);
    struct iovec local = {src, (size_t)n * size}, far[1024];
    size_t calls = span / ((size_t)n * stride), call = 0;
    if (calls == 0) calls = 1;
    double best;
    BEST_RATE(best, 1, {
        size_t base = (call++ % calls) * (size_t)n * stride;
        for (int i = 0; i < n; i++) {
            far[i].iov_base = (void *)(remote + base + i * stride);
            far[i].iov_len = size;
        }
        if (process_vm_writev(child, &local, 1, far, n, 0) != (ssize_t)(n * size))
            die("process_vm_writev");
    });
    double pvm = best * n;
    call = 0;
    volatile uint64_t *flag = (volatile uint64_t *)(shared + span);
    BEST_RATE(best, 64, {
        size_t base = (call++ % calls) * (size_t)n * stride;
        for (int i = 0; i < n; i++) memcpy(shared + base + i * stride, src + i * size, size);
        __atomic_store_n(flag, call, __ATOMIC_RELEASE);
    });
    double stores = best * n;
    printf("baseline=pvm_pieces pieces=%d stride=%zu size=%zu pvm_Mpieces=%.4g pvm_ns_per_piece=%.1f "
           "shared_Mpieces=%.4g\n",
           n, stride, size, pvm / 1e6, 1e9 / pvm, stores / 1e6);
    fflush(stdout);
    (void)!write(done, "x", 1);
    waitpid(child, NULL, 0);
}

static struct sockaddr_in address(const char *ip, int port) {
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, ip, &sa.sin_addr) != 1) {
        fprintf(stderr, "bad address %s\n", ip);
        exit(2);
    }
    return sa;
}

static void big_buffers(int fd) {
    int size = 8 << 20;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof size);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof size);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
}

// The receiver counts datagrams (GRO hands several in one read; the cmsg gives the segment
// size) from the first one until the stream has been quiet for 200 ms; the rate is taken over
// first-to-last arrival, so the sender's start-up and the quiet tail do not count.
static void udp_receiver(int fd, int seg, int gro, int ready_fd) {
    if (gro) {
        int one = 1;
        if (setsockopt(fd, IPPROTO_UDP, UDP_GRO, &one, sizeof one)) die("UDP_GRO");
    }
    struct timeval tv = {0, 200000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    (void)!write(ready_fd, "r", 1);
    static char buf[65536];
    char control[64];
    long datagrams = 0, calls = 0;
    double first = 0, last = 0;
    for (;;) {
        struct iovec iov = {buf, sizeof buf};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                             .msg_controllen = sizeof control};
        ssize_t n = recvmsg(fd, &msg, 0);
        if (n < 0) {
            if ((errno == EAGAIN || errno == EWOULDBLOCK) && datagrams > 0) break;
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
            die("recvmsg");
        }
        if (datagrams == 0) first = now();
        last = now();
        calls++;
        int segment = (int)n;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
            if (c->cmsg_level == IPPROTO_UDP && c->cmsg_type == UDP_GRO) segment = *(int *)CMSG_DATA(c);
        datagrams += segment > 0 ? (n + segment - 1) / segment : 1;
    }
    double t = last - first;
    // The payload figure counts the RoCE payload only (SEG minus 16 bytes of BTH + ICRC), so it
    // compares with perftest's message bandwidth.
    printf("baseline=udp_%s seg=%d datagrams_per_s=%.0f wire_GBps=%.3f payload_GBps=%.3f datagrams_per_read=%.1f\n",
           gro == 2 ? "gso_zc_gro" : gro ? "gso_gro" : "per_packet", seg, datagrams / t, datagrams * (double)seg / t / 1e9,
           datagrams * (double)(seg - 16) / t / 1e9, (double)datagrams / calls);
    fflush(stdout);
}

// Reaps MSG_ZEROCOPY completions from the error queue without waiting: each notification
// covers a range of sends; `copied` counts those the kernel says it copied after all.
static void reap_zerocopy(int fd, long *done, long *copied) {
    for (;;) {
        char control[128];
        struct msghdr msg = {.msg_control = control, .msg_controllen = sizeof control};
        if (recvmsg(fd, &msg, MSG_ERRQUEUE | MSG_DONTWAIT) < 0) return;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
            struct sock_extended_err *e = (struct sock_extended_err *)CMSG_DATA(c);
            if (e->ee_errno != 0 || e->ee_origin != SO_EE_ORIGIN_ZEROCOPY) continue;
            long n = (long)(e->ee_data - e->ee_info) + 1;
            *done += n;
            if (e->ee_code & SO_EE_CODE_ZEROCOPY_COPIED) *copied += n;
        }
    }
}

// gso: 0 one datagram per call, 1 UDP GSO, 2 UDP GSO with MSG_ZEROCOPY.
static void mode_udp(const char *ip, int port, int seg, int gso) {
    struct sockaddr_in sa = address(ip, port);
    int rx = socket(AF_INET, SOCK_DGRAM, 0);
    if (rx < 0) die("socket");
    big_buffers(rx);
    if (bind(rx, (struct sockaddr *)&sa, sizeof sa)) die("bind udp");
    int ready[2];
    if (pipe(ready)) die("pipe");
    pid_t child = fork_child();
    if (child == 0) {
        pin(1);
        udp_receiver(rx, seg, gso, ready[1]);
        _exit(0);
    }
    close(rx);
    pin(0);
    char c;
    (void)!read(ready[0], &c, 1);
    int tx = socket(AF_INET, SOCK_DGRAM, 0);
    big_buffers(tx);
    if (connect(tx, (struct sockaddr *)&sa, sizeof sa)) die("connect udp");
    // At most 64 segments and 65507 bytes per GSO send.
    int per_call = 1;
    if (gso) {
        per_call = 65000 / seg;
        if (per_call > 64) per_call = 64;
        if (setsockopt(tx, IPPROTO_UDP, UDP_SEGMENT, &seg, sizeof seg)) die("UDP_SEGMENT");
    }
    int flags = 0;
    if (gso == 2) {
        int one = 1;
        if (setsockopt(tx, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof one)) die("SO_ZEROCOPY");
        flags = MSG_ZEROCOPY;
    }
    // Page aligned, as a zero-copy sender's buffers would be (the kernel pins its pages). Its
    // bytes never change, so a send may reuse it before its completion arrives.
    static char buf[65536] __attribute__((aligned(4096)));
    memset(buf, 0xa5, sizeof buf);
    size_t len = (size_t)seg * per_call;
    long sends = 0, zc_done = 0, zc_copied = 0;
    double t0 = now();
    while (now() - t0 < run_seconds) {
        for (int i = 0; i < 16; i++) {
            struct iovec iov = {buf, len};
            struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
            if (sendmsg(tx, &msg, flags) >= 0) sends++;
            else if (errno != ENOBUFS && errno != EAGAIN && errno != ECONNREFUSED) die("sendmsg");
        }
        if (gso == 2) reap_zerocopy(tx, &zc_done, &zc_copied);
    }
    if (gso == 2) {
        for (double t_end = now() + 0.5; zc_done < sends && now() < t_end;)
            reap_zerocopy(tx, &zc_done, &zc_copied);
        printf("baseline=udp_zerocopy sends=%ld completed=%ld copied=%ld\n", sends, zc_done, zc_copied);
        fflush(stdout);
    }
    waitpid(child, NULL, 0);
}

static void mode_tcp(const char *ip, int port) {
    struct sockaddr_in sa = address(ip, port);
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(ls, (struct sockaddr *)&sa, sizeof sa) || listen(ls, 1)) die("tcp listen");
    pid_t child = fork_child();
    if (child == 0) {
        pin(1);
        int fd = accept(ls, NULL, NULL);
        if (fd < 0) die("accept");
        static char buf[1 << 16];
        long bytes = 0;
        double first = 0;
        for (;;) {
            ssize_t n = read(fd, buf, sizeof buf);
            if (n <= 0) break;
            if (bytes == 0) first = now();
            bytes += n;
        }
        double t = now() - first;
        printf("baseline=tcp_stream GBps=%.3f\n", bytes / t / 1e9);
        fflush(stdout);
        _exit(0);
    }
    close(ls);
    pin(0);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) die("tcp connect");
    static char buf[1 << 16];
    memset(buf, 0x3c, sizeof buf);
    double t0 = now();
    while (now() - t0 < run_seconds)
        if (write(fd, buf, sizeof buf) < 0) die("tcp write");
    close(fd);
    waitpid(child, NULL, 0);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report_rtt(const char *name, double *rtt, long iters) {
    qsort(rtt, iters, sizeof(double), cmp_double);
    double sum = 0;
    for (long i = 0; i < iters; i++) sum += rtt[i];
    // One way = RTT / 2, in µs, reported as perftest's latency programs do.
    double k = 1e6 / 2;
    printf("baseline=%s iters=%ld oneway_us_min=%.3f oneway_us_median=%.3f oneway_us_avg=%.3f "
           "oneway_us_p99=%.3f oneway_us_p999=%.3f oneway_us_max=%.3f\n",
           name, iters, rtt[0] * k, rtt[iters / 2] * k, sum / iters * k, rtt[(long)(iters * 0.99)] * k,
           rtt[(long)(iters * 0.999)] * k, rtt[iters - 1] * k);
    fflush(stdout);
}

// Both ends spin on non-blocking recv (no thread is ever woken), the shortest path a datagram
// can take through the kernel's loopback.
static void mode_pingpong(const char *ip, int port, long iters) {
    struct sockaddr_in server = address(ip, port), client = address(ip, port + 1);
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    int c = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    if (bind(s, (struct sockaddr *)&server, sizeof server) || bind(c, (struct sockaddr *)&client, sizeof client))
        die("bind pingpong");
    if (connect(s, (struct sockaddr *)&client, sizeof client) || connect(c, (struct sockaddr *)&server, sizeof server))
        die("connect pingpong");
    long warmup = iters / 10;
    pid_t child = fork_child();
    if (child == 0) {
        pin(1);
        char b[2];
        for (long i = 0; i < iters + warmup; i++) {
            while (recv(s, b, sizeof b, 0) < 0)
                if (errno != EAGAIN) die("server recv");
            if (send(s, b, sizeof b, 0) < 0) die("server send");
        }
        _exit(0);
    }
    pin(0);
    double *rtt = malloc(sizeof(double) * iters);
    char b[2] = {1, 2};
    for (long i = 0; i < iters + warmup; i++) {
        double t0 = now();
        if (send(c, b, sizeof b, 0) < 0) die("client send");
        while (recv(c, b, sizeof b, 0) < 0)
            if (errno != EAGAIN) die("client recv");
        if (i >= warmup) rtt[i - warmup] = now() - t0;
    }
    waitpid(child, NULL, 0);
    report_rtt("udp_pingpong", rtt, iters);
}

// A counter on its own cache line in a MAP_SHARED mapping inherited by a forked child: the
// parent writes 2k+1 and spins until it reads 2k+2, the child answers every odd value with the
// next one. Neither side makes a system call or sleeps.
static void mode_shm_pingpong(long iters) {
    volatile uint64_t *line = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (line == MAP_FAILED) die("mmap");
    *line = 0;
    long warmup = iters / 10, total = iters + warmup;
    pid_t child = fork_child();
    if (child == 0) {
        pin(1);
        for (uint64_t k = 0; k < (uint64_t)total; k++) {
            while (__atomic_load_n(line, __ATOMIC_ACQUIRE) != 2 * k + 1) __builtin_ia32_pause();
            __atomic_store_n(line, 2 * k + 2, __ATOMIC_RELEASE);
        }
        _exit(0);
    }
    pin(0);
    double *rtt = malloc(sizeof(double) * iters);
    for (uint64_t k = 0; k < (uint64_t)total; k++) {
        double t0 = now();
        __atomic_store_n(line, 2 * k + 1, __ATOMIC_RELEASE);
        while (__atomic_load_n(line, __ATOMIC_ACQUIRE) != 2 * k + 2) __builtin_ia32_pause();
        if ((long)k >= warmup) rtt[k - warmup] = now() - t0;
    }
    waitpid(child, NULL, 0);
    report_rtt("shm_pingpong", rtt, iters);
}

// handoff: batches go from the copier to the reader and back through a state word each.
#define HANDOFF_BATCHES 8
#define HANDOFF_BATCH (128 * 1024)
#define HANDOFF_FILL (64 * 1024)
static char *handoff_buf[HANDOFF_BATCHES];
static int handoff_full[HANDOFF_BATCHES]; // 0: the copier's, 1: the reader's
static int handoff_stop, handoff_read;
static volatile uint64_t handoff_sink;

static void *handoff_reader(void *arg) {
    (void)arg;
    for (int i = 0; !__atomic_load_n(&handoff_stop, __ATOMIC_ACQUIRE);) {
        if (!__atomic_load_n(&handoff_full[i], __ATOMIC_ACQUIRE)) {
            __builtin_ia32_pause();
            continue;
        }
        uint64_t sum = 0;
        if (handoff_read)
            for (size_t k = 0; k < HANDOFF_FILL; k += 8) sum += *(uint64_t *)(handoff_buf[i] + k);
        handoff_sink += sum;
        __atomic_store_n(&handoff_full[i], 0, __ATOMIC_RELEASE);
        i = (i + 1) % HANDOFF_BATCHES;
    }
    return NULL;
}

static void mode_handoff(void) {
    char *packet = aligned(4096);
    memset(packet, 0x5a, 4096);
    for (int i = 0; i < HANDOFF_BATCHES; i++) {
        handoff_buf[i] = aligned(HANDOFF_BATCH);
        memset(handoff_buf[i], 0, HANDOFF_BATCH);
    }
    for (handoff_read = 0; handoff_read < 2; handoff_read++) {
        __atomic_store_n(&handoff_stop, 0, __ATOMIC_RELEASE);
        pthread_t t;
        if (pthread_create(&t, NULL, handoff_reader, NULL)) die("pthread_create");
        double copying = 0, t_end = now() + run_seconds;
        long packets = 0;
        for (int i = 0; now() < t_end; i = (i + 1) % HANDOFF_BATCHES) {
            while (__atomic_load_n(&handoff_full[i], __ATOMIC_ACQUIRE)) __builtin_ia32_pause();
            double t0 = now();
            for (size_t at = 0; at < HANDOFF_FILL; at += 4096, packets++)
                memcpy(handoff_buf[i] + at, packet, 4096);
            copying += now() - t0;
            __atomic_store_n(&handoff_full[i], 1, __ATOMIC_RELEASE);
        }
        __atomic_store_n(&handoff_stop, 1, __ATOMIC_RELEASE);
        pthread_join(t, NULL);
        for (int i = 0; i < HANDOFF_BATCHES; i++) handoff_full[i] = 0;
        printf("baseline=handoff reader=%d ns_per_4k=%.1f\n", handoff_read, copying / packets * 1e9);
    }
}

int main(int argc, char **argv) {
    if (getenv("BASELINE_SECONDS")) run_seconds = atof(getenv("BASELINE_SECONDS"));
    if (argc >= 3 && !strcmp(argv[1], "memcpy")) mode_memcpy(argc - 2, argv + 2);
    else if (argc >= 3 && !strcmp(argv[1], "pvm")) mode_pvm(argc - 2, argv + 2);
    else if (argc == 5 && !strcmp(argv[1], "pvm_pieces"))
        mode_pvm_pieces(atoi(argv[2]), strtoull(argv[3], NULL, 0), strtoull(argv[4], NULL, 0));
    else if (argc == 6 && !strcmp(argv[1], "udp"))
        mode_udp(argv[2], atoi(argv[3]), atoi(argv[4]),
                 !strcmp(argv[5], "gso") ? 1 : !strcmp(argv[5], "gso_zc") ? 2 : 0);
    else if (argc == 4 && !strcmp(argv[1], "tcp")) mode_tcp(argv[2], atoi(argv[3]));
    else if (argc == 5 && !strcmp(argv[1], "pingpong")) mode_pingpong(argv[2], atoi(argv[3]), atol(argv[4]));
    else if (argc == 3 && !strcmp(argv[1], "shmpingpong")) mode_shm_pingpong(atol(argv[2]));
    else if (argc == 2 && !strcmp(argv[1], "handoff")) mode_handoff();
    else {
        fprintf(stderr, "usage: see the comment at the top of bench/baseline.c\n");
        return 2;
    }
    return 0;
}
