//! A C program linked with the real `-libverbs`, under LD_PRELOAD against a private
//! `softroce daemon`: it is a client of that daemon (`softroce res show` lists it by name),
//! its contexts have real `cmd_fd`s, and when the daemon is killed every open context gets
//! `IBV_EVENT_DEVICE_FATAL` on its async fd within a second, as on kernel device removal;
//! opening the device again then fails with ENODEV. A `fork()` child is a client of its own.

mod shim_support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use shim_support::{check_output, compile_c, softroce_bin, Daemon};

const PROGRAM: &str = r#"
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <infiniband/verbs.h>

static int fail(const char *what) { printf("FAIL %s (errno %d)\n", what, errno); return 1; }

int main(void) {
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list || n != 1) return fail("device list");
    struct ibv_context *ctx[2] = { ibv_open_device(list[0]), ibv_open_device(list[0]) };
    ibv_free_device_list(list);
    if (!ctx[0] || !ctx[1]) return fail("open");
    for (int i = 0; i < 2; i++) {
        int flags = fcntl(ctx[i]->cmd_fd, F_GETFD);
        if (ctx[i]->cmd_fd < 0 || flags < 0 || !(flags & FD_CLOEXEC)) return fail("cmd_fd");
        struct pollfd p = { .fd = ctx[i]->async_fd, .events = POLLIN };
        if (poll(&p, 1, 0) != 0) return fail("event before the daemon died");
    }
    if (ctx[0]->cmd_fd == ctx[1]->cmd_fd) return fail("cmd_fd shared");
    printf("ready\n");
    fflush(stdout);

    char line[16];
    if (!fgets(line, sizeof line, stdin)) return fail("stdin");
    /* The daemon has been killed now. */
    for (int i = 0; i < 2; i++) {
        struct pollfd p = { .fd = ctx[i]->async_fd, .events = POLLIN };
        int r = poll(&p, 1, 1000);
        if (r != 1) { printf("FAIL no async event within a second (poll %d)\n", r); return 1; }
        struct ibv_async_event ev;
        if (ibv_get_async_event(ctx[i], &ev)) return fail("ibv_get_async_event");
        printf("context %d event %d %s\n", i, (int)ev.event_type, ibv_event_type_str(ev.event_type));
        ibv_ack_async_event(&ev);
    }
    list = ibv_get_device_list(&n);
    if (!list) return fail("device list after loss");
    struct ibv_context *late = n > 0 ? ibv_open_device(list[0]) : NULL;
    printf("reopen %s errno %d\n", late ? "succeeded" : "failed", late ? 0 : errno);
    ibv_free_device_list(list);
    printf("close %d %d\n", ibv_close_device(ctx[0]), ibv_close_device(ctx[1]));
    return 0;
}
"#;

#[test]
fn killing_the_daemon_delivers_device_fatal_to_open_contexts() {
    let exe = compile_c("shim_fatal", PROGRAM, &["ibverbs"]);
    let mut daemon = Daemon::start("fatal", &[]);
    let mut child = daemon
        .command(&exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start shim_fatal");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    if first != "ready\n" {
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        panic!(
            "shim_fatal did not get ready: {first}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // The daemon knows the program as a client, by its name (comm).
    let shown = Command::new(softroce_bin())
        .args(["res", "show", "--socket"])
        .arg(&daemon.socket)
        .output()
        .expect("softroce res show");
    let shown = check_output("softroce res show", shown);
    assert!(
        shown
            .lines()
            .any(|l| l.split_whitespace().nth(3) == Some("shim_fatal")),
        "shim_fatal is not a client of the daemon:\n{shown}"
    );

    // SIGKILL: no goodbye from the daemon, only the kernel closing its sockets.
    let status = daemon.stop_with(libc::SIGKILL);
    assert!(status.is_some(), "daemon did not exit");
    child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "shim_fatal failed:\n{rest}\n{stderr}");
    let expect = [
        "context 0 event 8 local catastrophic error",
        "context 1 event 8 local catastrophic error",
        &format!("reopen failed errno {}", libc::ENODEV),
        "close 0 0",
    ];
    let lines: Vec<&str> = rest.lines().collect();
    assert_eq!(lines, expect, "stderr:\n{stderr}");
    // And the program's user is told why every verb fails from now on, once.
    assert_eq!(
        stderr.matches("closed this process's connection").count(),
        1,
        "stderr:\n{stderr}"
    );
}

const FORK_PROGRAM: &str = r#"
#include <errno.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <infiniband/verbs.h>

static int fail(const char *what) { printf("FAIL %s (errno %d)\n", what, errno); return 1; }

int main(void) {
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list || n != 1) return fail("device list");
    struct ibv_device *dev = list[0];
    ibv_free_device_list(list);
    struct ibv_context *parent_ctx = ibv_open_device(dev);
    if (!parent_ctx) return fail("parent open");
    int ready[2];
    if (pipe(ready)) return fail("pipe");
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return fail("fork");
    if (pid == 0) {
        /* The child's own context: a connection of its own, not the parent's. */
        struct ibv_context *ctx = ibv_open_device(dev);
        char ok = ctx && ctx->cmd_fd != parent_ctx->cmd_fd ? 'y' : 'n';
        if (write(ready[1], &ok, 1) != 1) _exit(2);
        char line[16];
        if (!fgets(line, sizeof line, stdin)) _exit(3);
        _exit(ctx && ibv_close_device(ctx) == 0 ? 0 : 4);
    }
    char ok = 0;
    if (read(ready[0], &ok, 1) != 1 || ok != 'y') return fail("child open");
    printf("ready %d %d\n", (int)getpid(), (int)pid);
    fflush(stdout);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return fail("waitpid");
    printf("child exit %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    printf("parent close %d\n", ibv_close_device(parent_ctx));
    return 0;
}
"#;

/// After `fork()`, the child's verbs use a connection of its own: the daemon lists parent and
/// child as two clients with their own pids.
#[test]
fn a_fork_child_is_its_own_client_of_the_daemon() {
    let exe = compile_c("shim_fork", FORK_PROGRAM, &["ibverbs"]);
    let daemon = Daemon::start("fork", &[]);
    let mut child = daemon
        .command(&exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start shim_fork");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    let pids: Vec<String> = first
        .strip_prefix("ready ")
        .unwrap_or_else(|| {
            let _ = child.kill();
            panic!("shim_fork did not get ready: {first:?}")
        })
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let shown = Command::new(softroce_bin())
        .args(["res", "show", "--socket"])
        .arg(&daemon.socket)
        .output()
        .expect("softroce res show");
    let shown = check_output("softroce res show", shown);
    // Rows: client pid uid program ...
    let mut client_pids: Vec<String> = shown
        .lines()
        .filter(|l| l.split_whitespace().nth(3) == Some("shim_fork"))
        .filter_map(|l| l.split_whitespace().nth(1).map(str::to_owned))
        .collect();
    client_pids.sort();
    let mut expect = pids.clone();
    expect.sort();
    assert_eq!(
        client_pids, expect,
        "parent and child as two clients:\n{shown}"
    );

    child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert!(
        out.status.success(),
        "{rest}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(rest, "child exit 0\nparent close 0\n");
}
