//! The exported verbs called directly from Rust (through the rlib): async events over the real
//! `async_fd`, argument validation (null, foreign and stale pointers), and the size rules of
//! the extensible queries. The e2e tests in tests/tests/shim_*.rs cover the same library from
//! C and from unmodified programs.

mod fake_daemon;

use std::mem::{size_of, MaybeUninit};
use std::ptr;

use libc::{c_int, pollfd, POLLIN};
use softroce::abi::*;
use softroce::runtime::{context_from_ptr, AsyncEventRecord};
use softroce::verbs::context::*;
use softroce::verbs::events::*;
use softroce::verbs::pd::*;
use softroce::verbs::query::*;

/// Tests that use stale pointers must not run while another test allocates: the allocator may
/// hand a freed address to a new object, which the stale call would then hit.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Opens srxe0 (served by an in-process stand-in daemon) and returns its context.
fn open() -> *mut IbvContext {
    static DAEMON: std::sync::OnceLock<fake_daemon::FakeDaemon> = std::sync::OnceLock::new();
    DAEMON.get_or_init(|| fake_daemon::FakeDaemon::start("verbs-api"));
    let mut n = 0;
    // SAFETY: `n` is writable; the list is freed below and the device outlives it.
    unsafe {
        let list = ibv_get_device_list(&mut n);
        assert!(!list.is_null());
        assert_eq!(n, 1);
        let ctx = ibv_open_device(*list);
        ibv_free_device_list(list);
        assert!(!ctx.is_null());
        ctx
    }
}

fn readable(fd: c_int) -> bool {
    let mut p = pollfd {
        fd,
        events: POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

#[test]
fn async_port_event_travels_through_async_fd() {
    let _serial = serial();
    let ctx = open();
    // SAFETY: ctx is a live context from ibv_open_device.
    let fd = unsafe { (*ctx).async_fd };
    assert!(!readable(fd), "no event expected yet");
    context_from_ptr(ctx)
        .unwrap()
        .post_async_event(AsyncEventRecord {
            element: 1,
            event_type: IBV_EVENT_PORT_ACTIVE as u32,
        })
        .unwrap();
    assert!(
        readable(fd),
        "async_fd must poll readable once an event is queued"
    );
    let mut ev = MaybeUninit::<IbvAsyncEvent>::zeroed();
    // SAFETY: ev is a writable ibv_async_event.
    assert_eq!(unsafe { ibv_get_async_event(ctx, ev.as_mut_ptr()) }, 0);
    // SAFETY: written by the successful call above.
    let ev = unsafe { ev.assume_init() };
    assert_eq!(ev.event_type, IBV_EVENT_PORT_ACTIVE);
    // SAFETY: port events carry the port number in the union.
    assert_eq!(unsafe { ev.element.port_num }, 1);
    // SAFETY: an event filled in by ibv_get_async_event.
    unsafe { ibv_ack_async_event(&ev as *const IbvAsyncEvent as *mut IbvAsyncEvent) };
    assert!(!readable(fd));

    // An event of an object that does not exist (any more) is skipped, never decoded into a
    // garbage pointer: the next event is returned instead.
    for record in [
        AsyncEventRecord {
            element: 0xdead,
            event_type: IBV_EVENT_QP_FATAL as u32,
        },
        AsyncEventRecord {
            element: 1,
            event_type: IBV_EVENT_PORT_ERR as u32,
        },
    ] {
        context_from_ptr(ctx)
            .unwrap()
            .post_async_event(record)
            .unwrap();
    }
    let mut ev = MaybeUninit::<IbvAsyncEvent>::zeroed();
    // SAFETY: as above.
    assert_eq!(unsafe { ibv_get_async_event(ctx, ev.as_mut_ptr()) }, 0);
    // SAFETY: written by the successful call.
    assert_eq!(unsafe { ev.assume_init() }.event_type, IBV_EVENT_PORT_ERR);

    // Non-blocking mode is the app's choice and gives EAGAIN, like the kernel fd, also when
    // only a stale record was queued.
    // SAFETY: fd is open.
    assert_eq!(
        unsafe { libc::fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK) },
        0
    );
    context_from_ptr(ctx)
        .unwrap()
        .post_async_event(AsyncEventRecord {
            element: 0xbeef,
            event_type: IBV_EVENT_CQ_ERR as u32,
        })
        .unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { ibv_get_async_event(ctx, ev.as_mut_ptr()) }, -1);
    assert_eq!(errno(), libc::EAGAIN);
    // SAFETY: ctx is live.
    assert_eq!(unsafe { ibv_close_device(ctx) }, 0);
}

#[test]
fn null_foreign_and_stale_pointers_are_rejected() {
    let _serial = serial();
    // The stand-in daemon must be in place before the first verb of the process (nextest runs
    // each test in a process of its own): the shim reads $SOFTROCE_SOCKET once.
    let ctx0 = open();
    // SAFETY: every call below passes NULL or pointers the shim must recognise as foreign;
    // none of them may be dereferenced.
    unsafe {
        ibv_close_device(ctx0);
        assert!(ibv_get_device_name(ptr::null_mut()).is_null());
        assert_eq!(errno(), libc::EINVAL);
        let mut bogus = MaybeUninit::<IbvDevice>::zeroed();
        assert!(ibv_open_device(bogus.as_mut_ptr()).is_null());
        assert_eq!(ibv_get_device_guid(bogus.as_mut_ptr()), 0);
        assert_eq!(ibv_get_device_index(ptr::null_mut()), -1);
        assert_eq!(ibv_close_device(ptr::null_mut()), libc::EINVAL);
        assert!(ibv_alloc_pd(ptr::null_mut()).is_null());
        assert_eq!(ibv_dealloc_pd(ptr::null_mut()), libc::EINVAL);
        assert!(ibv_create_comp_channel(ptr::null_mut()).is_null());
        assert_eq!(ibv_destroy_comp_channel(ptr::null_mut()), libc::EINVAL);

        let ctx = open();
        assert_eq!(ibv_query_device(ctx, ptr::null_mut()), libc::EINVAL);
        assert_eq!(ibv_query_port(ctx, 1, ptr::null_mut()), libc::EINVAL);
        assert_eq!(ibv_query_port(ctx, 0, ptr::null_mut()), libc::EINVAL);
        assert_eq!(ibv_query_gid(ctx, 1, -1, ptr::null_mut()), -1);
        assert_eq!(ibv_query_gid(ctx, 1, 0, ptr::null_mut()), -1);
        assert_eq!(ibv_query_pkey(ctx, 1, -5, ptr::null_mut()), -1);
        assert_eq!(
            _ibv_query_gid_ex(ctx, 1, 0, ptr::null_mut(), 0, 32),
            libc::EINVAL
        );
        assert_eq!(
            _ibv_query_gid_table(ctx, ptr::null_mut(), 8, 0, 32),
            -(libc::EINVAL as isize)
        );
        assert_eq!(ibv_get_async_event(ctx, ptr::null_mut()), -1);

        // A context is dead after close: every later use is EINVAL, not a use-after-free.
        assert_eq!(ibv_close_device(ctx), 0);
        assert_eq!(ibv_close_device(ctx), libc::EINVAL);
        let mut attr = MaybeUninit::<IbvDeviceAttr>::zeroed();
        assert_eq!(ibv_query_device(ctx, attr.as_mut_ptr()), libc::EINVAL);
        assert!(ibv_alloc_pd(ctx).is_null());
    }
}

#[test]
fn extensible_queries_respect_the_callers_size() {
    let _serial = serial();
    let ctx = open();
    // SAFETY: buffers are sized as passed; ctx is live until closed at the end.
    unsafe {
        // An older/smaller port_attr (48 bytes): the 4 bytes after it stay untouched.
        let mut buf = [0xabu8; 56];
        let rc = (context_from_ptr(ctx).unwrap().vctx.query_port.unwrap())(
            ctx,
            1,
            buf.as_mut_ptr().cast(),
            48,
        );
        assert_eq!(rc, 0);
        assert_eq!(&buf[48..], &[0xab; 8]);
        assert_eq!(buf[46], IBV_LINK_LAYER_ETHERNET);
        // A newer/larger one: our 52 bytes, then zeroes.
        let mut buf = [0xabu8; 60];
        let rc = (context_from_ptr(ctx).unwrap().vctx.query_port.unwrap())(
            ctx,
            1,
            buf.as_mut_ptr().cast(),
            60,
        );
        assert_eq!(rc, 0);
        assert_eq!(&buf[52..], &[0; 8]);

        // query_device_ex refuses a buffer smaller than the legacy struct.
        let q = context_from_ptr(ctx).unwrap().vctx.query_device_ex.unwrap();
        let mut ax = MaybeUninit::<IbvDeviceAttrEx>::zeroed();
        assert_eq!(q(ctx, ptr::null(), ax.as_mut_ptr(), 100), libc::EINVAL);
        assert_eq!(
            q(
                ctx,
                ptr::null(),
                ax.as_mut_ptr(),
                size_of::<IbvDeviceAttrEx>()
            ),
            0
        );
        assert_eq!(ax.assume_init().orig_attr.max_qp_rd_atom, 128);

        // gid table with a larger (future) entry stride: entries land at that stride.
        let stride = 40;
        let mut raw = vec![0xffu8; stride * 4];
        let n = _ibv_query_gid_table(ctx, raw.as_mut_ptr().cast(), 4, 0, stride);
        assert_eq!(n, 3);
        assert_eq!(raw[stride + 16], 1, "gid_index of the second entry");
        assert_eq!(&raw[32..40], &[0; 8], "tail of each entry is zeroed");
        assert_eq!(&raw[3 * stride..], &[0xff; 40], "fourth slot untouched");
        assert_eq!(
            _ibv_query_gid_table(ctx, raw.as_mut_ptr().cast(), 4, 0, 16),
            -(libc::EINVAL as isize)
        );

        assert_eq!(ibv_close_device(ctx), 0);
    }
}

#[test]
fn comp_channel_is_a_real_fd_and_busy_while_referenced() {
    let _serial = serial();
    let ctx = open();
    // SAFETY: ctx is live; the channel pointer is only used while it is live.
    unsafe {
        let ch = ibv_create_comp_channel(ctx);
        assert!(!ch.is_null());
        let fd = (*ch).fd;
        assert!(libc::fcntl(fd, libc::F_GETFD) >= 0);
        assert!(!readable(fd));
        (*ch).refcnt = 1; // as a CQ using the channel will do
        assert_eq!(ibv_destroy_comp_channel(ch), libc::EBUSY);
        (*ch).refcnt = 0;
        assert_eq!(ibv_destroy_comp_channel(ch), 0);
        assert_eq!(ibv_destroy_comp_channel(ch), libc::EINVAL);
        assert_eq!(ibv_close_device(ctx), 0);
    }
}

#[test]
fn concurrent_open_alloc_and_close_keep_registries_consistent() {
    let _serial = serial();
    let threads: Vec<_> = (0..8)
        .map(|_| {
            std::thread::spawn(|| {
                for _ in 0..50 {
                    let ctx = open();
                    // SAFETY: ctx is live until closed below; PDs are freed before that.
                    unsafe {
                        let pds: Vec<*mut IbvPd> = (0..4).map(|_| ibv_alloc_pd(ctx)).collect();
                        assert!(pds.iter().all(|pd| !pd.is_null() && (**pd).context == ctx));
                        for pd in pds {
                            assert_eq!(ibv_dealloc_pd(pd), 0);
                        }
                        assert_eq!(ibv_close_device(ctx), 0);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("worker panicked");
    }
}
