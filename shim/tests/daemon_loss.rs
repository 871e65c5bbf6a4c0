//! The daemon connection's life cycle, in its own test process (the connection is
//! process-wide): contexts get a real `cmd_fd`, a `fork()` child gets its own connection, and
//! a hang-up of the daemon delivers `IBV_EVENT_DEVICE_FATAL` to every open context and makes
//! later opens fail with `ENODEV`.

mod fake_daemon;

use std::mem::MaybeUninit;
use std::sync::atomic::Ordering;

use libc::{c_int, pollfd, POLLIN};
use softroce::abi::*;
use softroce::daemon;
use softroce::verbs::context::*;
use softroce::verbs::events::*;

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Waits for `fd` to become readable; blocks without a bound, so a missing event hangs the test
/// (cargo test reports it) rather than making it depend on timing.
fn wait_readable(fd: c_int) {
    let mut p = pollfd {
        fd,
        events: POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, -1) };
    assert_eq!(n, 1);
    assert_ne!(p.revents & POLLIN, 0);
}

fn readable_now(fd: c_int) -> bool {
    let mut p = pollfd {
        fd,
        events: POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

/// One test, so no other test thread shares the process when it forks.
#[test]
fn cmd_fd_fork_and_device_fatal_on_daemon_loss() {
    let fake = fake_daemon::FakeDaemon::start("loss");
    let mut n = 0;
    // SAFETY: `n` is writable; list entries stay valid after the list is freed.
    let (a, b) = unsafe {
        let list = ibv_get_device_list(&mut n);
        assert!(!list.is_null());
        assert_eq!(n, 1);
        let a = ibv_open_device(*list);
        let b = ibv_open_device(*list);
        ibv_free_device_list(list);
        assert!(!a.is_null() && !b.is_null());
        (a, b)
    };
    assert_eq!(
        fake.hellos.load(Ordering::SeqCst),
        1,
        "one connection per process"
    );
    let parent_client = daemon::connection().unwrap().client_id();

    // SAFETY: a and b are live contexts.
    let (cmd_a, cmd_b, async_a, async_b) =
        unsafe { ((*a).cmd_fd, (*b).cmd_fd, (*a).async_fd, (*b).async_fd) };
    for fd in [cmd_a, cmd_b] {
        assert!(fd >= 0);
        // SAFETY: fcntl on a plain integer; fails with EBADF if it is not open.
        assert_ne!(
            unsafe { libc::fcntl(fd, libc::F_GETFD) },
            -1,
            "cmd_fd must be open"
        );
        // SAFETY: as above.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        assert_ne!(flags & libc::FD_CLOEXEC, 0, "cmd_fd must be close-on-exec");
    }
    assert_ne!(cmd_a, cmd_b);
    assert!(!readable_now(async_a) && !readable_now(async_b));

    // A fork child does not reuse the parent's connection: its first verb opens its own.
    // SAFETY: the child only calls the shim and then _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let ok = match daemon::connection() {
            Ok(c) => c.client_id() != parent_client && !c.is_lost(),
            Err(_) => false,
        };
        // SAFETY: ends the child without running the test harness's atexit state.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the fork child must get its own connection (status {status:#x})"
    );
    assert_eq!(
        fake.hellos.load(Ordering::SeqCst),
        2,
        "the child said hello itself"
    );
    assert!(
        !daemon::connection().unwrap().is_lost(),
        "the parent keeps its connection"
    );

    // The daemon dies: both contexts get DEVICE_FATAL.
    fake.hang_up();
    for (ctx, fd) in [(a, async_a), (b, async_b)] {
        wait_readable(fd);
        let mut ev = MaybeUninit::<IbvAsyncEvent>::zeroed();
        // SAFETY: ctx is live, ev writable.
        assert_eq!(unsafe { ibv_get_async_event(ctx, ev.as_mut_ptr()) }, 0);
        // SAFETY: written by the successful call.
        let ev = unsafe { ev.assume_init() };
        assert_eq!(ev.event_type, IBV_EVENT_DEVICE_FATAL);
        // SAFETY: an event filled in by ibv_get_async_event.
        unsafe { ibv_ack_async_event(&ev as *const _ as *mut _) };
        assert!(!readable_now(fd), "exactly one event per context");
    }
    assert!(daemon::connection().unwrap().is_lost());

    // The device is gone for new contexts; closing the old ones still works.
    // SAFETY: as above.
    unsafe {
        let list = ibv_get_device_list(&mut n);
        assert!(!list.is_null());
        assert!(ibv_open_device(*list).is_null());
        assert_eq!(errno(), libc::ENODEV);
        ibv_free_device_list(list);
        assert_eq!(ibv_close_device(a), 0);
        assert_eq!(ibv_close_device(b), 0);
    }
    // SAFETY: fcntl on a plain integer.
    assert_eq!(
        unsafe { libc::fcntl(cmd_a, libc::F_GETFD) },
        -1,
        "closed with its context"
    );
}
