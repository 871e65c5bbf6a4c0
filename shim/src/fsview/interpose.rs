//! The libc functions through which UCX 1.13, libfabric 1.17 and Open MPI 4.1.4 reach
//! `/dev/infiniband` and `/sys/class/infiniband` (their dynamic imports, `nm -D --undefined-only`,
//! and `strace -f -e trace=%file` of `ucx_info -d`, `fi_info` and `mpirun`; docs/stacks.md):
//! the stat family under every name glibc 2.36 exports (`stat`/`stat64`/`lstat`/`lstat64`/
//! `fstatat`/`fstatat64`, `statx`, and the `__xstat`/`__lxstat`/`__fxstatat` names older
//! binaries bind to; `newfstatat` is the system call behind them, not a libc symbol), `access`/
//! `faccessat`/`euidaccess`/`eaccess`, `open`/`open64`/`openat`/`openat64` and their fortified
//! `__open_2` forms, `fopen`/`fopen64`, `opendir`/`readdir`/`readdir64`/`readdir_r`/
//! `readdir64_r`/`rewinddir`/`dirfd`/`closedir`, `readlink`/`readlinkat`/`__readlink_chk`, and
//! `realpath`/`__realpath_chk`/`canonicalize_file_name`.
//!
//! Each one first asks [`tree::may_be_owned`] (a substring test); any path that is not the
//! view's goes to the next definition (`dlsym(RTLD_NEXT)`, i.e. libc) with its arguments
//! untouched. A file of the view opens as a sealed-size memfd holding its text, so `read`,
//! `fstat`, `lseek` and `close` work unchanged; a directory opens (`opendir`) as a directory
//! stream of the shim's own, recognised by the `readdir` family.
//!
//! These run in every call of the process, from any thread and any library, so they never
//! panic and never allocate on the pass-through path.

// The `next!`/`pass!` macros are used inside and outside unsafe blocks alike.
#![allow(unused_unsafe)]

use std::cell::Cell;
use std::collections::BTreeSet;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use libc::{mode_t, size_t, ssize_t};

use super::tree::{self, Lookup, Node};

/// The next definition of a libc function (libc's own), looked up once.
macro_rules! next {
    ($name:literal, $ty:ty) => {{
        static ADDR: AtomicUsize = AtomicUsize::new(0);
        let mut addr = ADDR.load(Ordering::Relaxed);
        if addr == 0 {
            // SAFETY: a NUL-terminated symbol name; RTLD_NEXT is valid from a shared object.
            addr = unsafe { libc::dlsym(libc::RTLD_NEXT, concat!($name, "\0").as_ptr().cast()) }
                as usize;
            ADDR.store(addr, Ordering::Relaxed);
        }
        if addr == 0 {
            None
        } else {
            // SAFETY: the symbol is libc's function of that name, whose C type is `$ty`.
            Some(unsafe { std::mem::transmute::<usize, $ty>(addr) })
        }
    }};
}

/// Calls libc's `$name` with the original arguments, or fails with ENOSYS if there is none.
macro_rules! pass {
    ($name:literal, $ty:ty, $fail:expr, $($arg:expr),*) => {
        match next!($name, $ty) {
            // SAFETY: the caller's own arguments, passed on unchanged.
            Some(f) => unsafe { f($($arg),*) },
            None => {
                set_errno(libc::ENOSYS);
                $fail
            }
        }
    };
}

thread_local! {
    /// Set while this thread builds the view (the device table connects to the daemon), so
    /// the calls that build makes pass through instead of waiting for the view itself.
    static BUILDING: Cell<bool> = const { Cell::new(false) };
}

fn set_errno(e: c_int) {
    // SAFETY: errno is thread-local.
    unsafe { *libc::__errno_location() = e };
}

/// What the view says about `path`: `None` means libc answers.
///
/// # Safety
/// `path` is NULL or NUL-terminated.
unsafe fn lookup(
    path: *const c_char,
    follow_last: bool,
) -> Option<Result<(String, &'static Node), c_int>> {
    if path.is_null() {
        return None;
    }
    // SAFETY: NUL-terminated per the caller.
    let bytes = unsafe { CStr::from_ptr(path) }.to_bytes();
    if !tree::may_be_owned(bytes) || BUILDING.with(Cell::get) {
        return None;
    }
    let view = match std::panic::catch_unwind(|| {
        BUILDING.with(|b| b.set(true));
        let v = super::view();
        BUILDING.with(|b| b.set(false));
        v
    }) {
        Ok(v) => v,
        Err(_) => {
            BUILDING.with(|b| b.set(false));
            return None;
        }
    };
    let answer = match view.lookup(bytes, follow_last) {
        Lookup::Real => None,
        Lookup::Found(path, node) => Some(Ok((path, node))),
        Lookup::Missing(e) => Some(Err(e)),
    };
    if trace_enabled() {
        trace(bytes, &answer);
    }
    answer
}

/// `SOFTROCE_FSVIEW_TRACE=1`: one stderr line per path the view answers (what a stack looks
/// for: docs/stacks.md was written from these).
fn trace_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("SOFTROCE_FSVIEW_TRACE").is_some_and(|v| v == "1"))
}

fn trace(path: &[u8], answer: &Option<Result<(String, &Node), c_int>>) {
    let what = match answer {
        None => "real".to_owned(),
        Some(Ok((canon, Node::File(Err(e))))) => format!("{canon} (read fails, errno {e})"),
        Some(Ok((canon, _))) => canon.clone(),
        Some(Err(e)) => format!("errno {e}"),
    };
    eprintln!(
        "softroce: fsview {} -> {what}",
        String::from_utf8_lossy(path)
    );
}

/// Absolute paths only: `*at` calls with a relative path are left to libc.
///
/// # Safety
/// As [`lookup`].
unsafe fn lookup_at(
    path: *const c_char,
    follow_last: bool,
) -> Option<Result<(String, &'static Node), c_int>> {
    // SAFETY: as the caller's.
    if path.is_null() || unsafe { *path } != b'/' as c_char {
        return None;
    }
    // SAFETY: as the caller's.
    unsafe { lookup(path, follow_last) }
}

fn fail<T>(e: c_int, value: T) -> T {
    set_errno(e);
    value
}

// ---------------------------------------------------------------------------------------------
// stat family

/// The stat fields of a node: (mode, nlink, size, rdev major/minor, inode, device minor).
struct Meta {
    mode: u32,
    nlink: u64,
    size: i64,
    rdev: (u32, u32),
    ino: u64,
    dev: (u32, u32),
}

fn meta(path: &str, node: &Node) -> Meta {
    let ino = path.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    // sysfs and devtmpfs, as the lab's kernel numbered them.
    let dev = if path.starts_with("/dev/") {
        (0, 5)
    } else {
        (0, 22)
    };
    let (mode, nlink, size, rdev) = match node {
        Node::Dir(_) => (libc::S_IFDIR | 0o755, 2, 0, (0, 0)),
        Node::File(_) => (libc::S_IFREG | 0o444, 1, 4096, (0, 0)),
        Node::Link(_) => (libc::S_IFLNK | 0o777, 1, 0, (0, 0)),
        Node::CharDev(major, minor) => (libc::S_IFCHR | 0o666, 1, 0, (*major, *minor)),
    };
    Meta {
        mode,
        nlink,
        size,
        rdev,
        ino,
        dev,
    }
}

/// When the view was first looked at: the times every node shows.
fn birth() -> libc::timespec {
    static BIRTH: OnceLock<(i64, i64)> = OnceLock::new();
    let (s, ns) = *BIRTH.get_or_init(|| {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid out-pointer.
        unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
        (ts.tv_sec, ts.tv_nsec)
    });
    libc::timespec {
        tv_sec: s,
        tv_nsec: ns,
    }
}

/// Fills a `struct stat` (the same layout as `struct stat64` on 64-bit glibc).
///
/// # Safety
/// `buf` is NULL or points to a writable `struct stat`.
unsafe fn fill_stat(buf: *mut libc::stat, path: &str, node: &Node) -> c_int {
    if buf.is_null() {
        return fail(libc::EFAULT, -1);
    }
    let m = meta(path, node);
    let t = birth();
    // SAFETY: all-zero is a valid struct stat; buf is writable per the caller.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        st.st_dev = libc::makedev(m.dev.0, m.dev.1);
        st.st_ino = m.ino;
        st.st_mode = m.mode;
        st.st_nlink = m.nlink as _;
        st.st_rdev = libc::makedev(m.rdev.0, m.rdev.1);
        st.st_size = m.size;
        st.st_blksize = 4096;
        st.st_atime = t.tv_sec;
        st.st_atime_nsec = t.tv_nsec;
        st.st_mtime = t.tv_sec;
        st.st_mtime_nsec = t.tv_nsec;
        st.st_ctime = t.tv_sec;
        st.st_ctime_nsec = t.tv_nsec;
        buf.write(st);
    }
    0
}

/// # Safety
/// As [`fill_stat`]; `path` NULL or NUL-terminated.
unsafe fn stat_common(
    path: *const c_char,
    buf: *mut libc::stat,
    follow: bool,
    real: impl FnOnce() -> c_int,
) -> c_int {
    // SAFETY: as the caller's.
    match unsafe { lookup_at(path, follow) } {
        None => real(),
        // SAFETY: as the caller's.
        Some(Ok((p, node))) => unsafe { fill_stat(buf, &p, node) },
        Some(Err(e)) => fail(e, -1),
    }
}

type StatFn = unsafe extern "C" fn(*const c_char, *mut libc::stat) -> c_int;
type XstatFn = unsafe extern "C" fn(c_int, *const c_char, *mut libc::stat) -> c_int;
type FstatatFn = unsafe extern "C" fn(c_int, *const c_char, *mut libc::stat, c_int) -> c_int;
type FxstatatFn =
    unsafe extern "C" fn(c_int, c_int, *const c_char, *mut libc::stat, c_int) -> c_int;

/// # Safety
/// libc's contract for `stat`.
#[no_mangle]
pub unsafe extern "C" fn stat(path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: libc's contract, passed on.
    unsafe { stat_common(path, buf, true, || pass!("stat", StatFn, -1, path, buf)) }
}

/// # Safety
/// libc's contract for `stat64`.
#[no_mangle]
pub unsafe extern "C" fn stat64(path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: libc's contract, passed on.
    unsafe { stat_common(path, buf, true, || pass!("stat64", StatFn, -1, path, buf)) }
}

/// # Safety
/// libc's contract for `lstat`.
#[no_mangle]
pub unsafe extern "C" fn lstat(path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: libc's contract, passed on.
    unsafe { stat_common(path, buf, false, || pass!("lstat", StatFn, -1, path, buf)) }
}

/// # Safety
/// libc's contract for `lstat64`.
#[no_mangle]
pub unsafe extern "C" fn lstat64(path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: libc's contract, passed on.
    unsafe { stat_common(path, buf, false, || pass!("lstat64", StatFn, -1, path, buf)) }
}

/// # Safety
/// libc's contract for `fstatat`.
#[no_mangle]
pub unsafe extern "C" fn fstatat(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
    flags: c_int,
) -> c_int {
    let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
    // SAFETY: libc's contract, passed on.
    unsafe {
        stat_common(path, buf, follow, || {
            pass!("fstatat", FstatatFn, -1, dirfd, path, buf, flags)
        })
    }
}

/// # Safety
/// libc's contract for `fstatat64`.
#[no_mangle]
pub unsafe extern "C" fn fstatat64(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
    flags: c_int,
) -> c_int {
    let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
    // SAFETY: libc's contract, passed on.
    unsafe {
        stat_common(path, buf, follow, || {
            pass!("fstatat64", FstatatFn, -1, dirfd, path, buf, flags)
        })
    }
}

/// # Safety
/// glibc's contract for `__xstat` (binaries built before glibc 2.33).
#[no_mangle]
pub unsafe extern "C" fn __xstat(ver: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: libc's contract, passed on.
    unsafe {
        stat_common(path, buf, true, || {
            pass!("__xstat", XstatFn, -1, ver, path, buf)
        })
    }
}

/// # Safety
/// glibc's contract for `__xstat64`.
#[no_mangle]
pub unsafe extern "C" fn __xstat64(ver: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: libc's contract, passed on.
    unsafe {
        stat_common(path, buf, true, || {
            pass!("__xstat64", XstatFn, -1, ver, path, buf)
        })
    }
}

/// # Safety
/// glibc's contract for `__lxstat`.
#[no_mangle]
pub unsafe extern "C" fn __lxstat(ver: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: libc's contract, passed on.
    unsafe {
        stat_common(path, buf, false, || {
            pass!("__lxstat", XstatFn, -1, ver, path, buf)
        })
    }
}

/// # Safety
/// glibc's contract for `__lxstat64`.
#[no_mangle]
pub unsafe extern "C" fn __lxstat64(
    ver: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
) -> c_int {
    // SAFETY: libc's contract, passed on.
    unsafe {
        stat_common(path, buf, false, || {
            pass!("__lxstat64", XstatFn, -1, ver, path, buf)
        })
    }
}

/// # Safety
/// glibc's contract for `__fxstatat`.
#[no_mangle]
pub unsafe extern "C" fn __fxstatat(
    ver: c_int,
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
    flags: c_int,
) -> c_int {
    let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
    // SAFETY: libc's contract, passed on.
    unsafe {
        stat_common(path, buf, follow, || {
            pass!("__fxstatat", FxstatatFn, -1, ver, dirfd, path, buf, flags)
        })
    }
}

/// # Safety
/// glibc's contract for `__fxstatat64`.
#[no_mangle]
pub unsafe extern "C" fn __fxstatat64(
    ver: c_int,
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
    flags: c_int,
) -> c_int {
    let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
    // SAFETY: libc's contract, passed on.
    unsafe {
        stat_common(path, buf, follow, || {
            pass!("__fxstatat64", FxstatatFn, -1, ver, dirfd, path, buf, flags)
        })
    }
}

type StatxFn = unsafe extern "C" fn(c_int, *const c_char, c_int, u32, *mut libc::statx) -> c_int;

/// # Safety
/// libc's contract for `statx`.
#[no_mangle]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: u32,
    buf: *mut libc::statx,
) -> c_int {
    let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
    // SAFETY: as the caller's.
    match unsafe { lookup_at(path, follow) } {
        None => pass!("statx", StatxFn, -1, dirfd, path, flags, mask, buf),
        Some(Err(e)) => fail(e, -1),
        Some(Ok(_)) if buf.is_null() => fail(libc::EFAULT, -1),
        Some(Ok((p, node))) => {
            let m = meta(&p, node);
            let t = birth();
            // SAFETY: all-zero is a valid struct statx; buf is writable per the caller.
            unsafe {
                let mut ts: libc::statx_timestamp = std::mem::zeroed();
                ts.tv_sec = t.tv_sec;
                ts.tv_nsec = t.tv_nsec as u32;
                let mut st: libc::statx = std::mem::zeroed();
                st.stx_mask = libc::STATX_BASIC_STATS;
                st.stx_blksize = 4096;
                st.stx_nlink = m.nlink as u32;
                st.stx_mode = m.mode as u16;
                st.stx_ino = m.ino;
                st.stx_size = m.size as u64;
                st.stx_atime = ts;
                st.stx_btime = ts;
                st.stx_ctime = ts;
                st.stx_mtime = ts;
                st.stx_rdev_major = m.rdev.0;
                st.stx_rdev_minor = m.rdev.1;
                st.stx_dev_major = m.dev.0;
                st.stx_dev_minor = m.dev.1;
                buf.write(st);
            }
            0
        }
    }
}

// ---------------------------------------------------------------------------------------------
// access

/// What `access(mode)` answers for a node: read-only sysfs files and directories, and
/// read-write character devices (udev's 0666 for uverbs and rdma_cm).
fn access_node(node: &Node, mode: c_int) -> c_int {
    let writable = matches!(node, Node::CharDev(..));
    let executable = matches!(node, Node::Dir(_));
    if (mode & libc::W_OK != 0 && !writable) || (mode & libc::X_OK != 0 && !executable) {
        return fail(libc::EACCES, -1);
    }
    0
}

/// # Safety
/// `path` NULL or NUL-terminated.
unsafe fn access_common(
    path: *const c_char,
    mode: c_int,
    follow: bool,
    real: impl FnOnce() -> c_int,
) -> c_int {
    // SAFETY: as the caller's.
    match unsafe { lookup_at(path, follow) } {
        None => real(),
        Some(Ok((_, node))) => access_node(node, mode),
        Some(Err(e)) => fail(e, -1),
    }
}

type AccessFn = unsafe extern "C" fn(*const c_char, c_int) -> c_int;
type FaccessatFn = unsafe extern "C" fn(c_int, *const c_char, c_int, c_int) -> c_int;

/// # Safety
/// libc's contract for `access`.
#[no_mangle]
pub unsafe extern "C" fn access(path: *const c_char, mode: c_int) -> c_int {
    // SAFETY: libc's contract, passed on.
    unsafe {
        access_common(path, mode, true, || {
            pass!("access", AccessFn, -1, path, mode)
        })
    }
}

/// # Safety
/// libc's contract for `euidaccess`.
#[no_mangle]
pub unsafe extern "C" fn euidaccess(path: *const c_char, mode: c_int) -> c_int {
    // SAFETY: libc's contract, passed on.
    unsafe {
        access_common(path, mode, true, || {
            pass!("euidaccess", AccessFn, -1, path, mode)
        })
    }
}

/// # Safety
/// libc's contract for `eaccess`.
#[no_mangle]
pub unsafe extern "C" fn eaccess(path: *const c_char, mode: c_int) -> c_int {
    // SAFETY: libc's contract, passed on.
    unsafe {
        access_common(path, mode, true, || {
            pass!("eaccess", AccessFn, -1, path, mode)
        })
    }
}

/// # Safety
/// libc's contract for `faccessat`.
#[no_mangle]
pub unsafe extern "C" fn faccessat(
    dirfd: c_int,
    path: *const c_char,
    mode: c_int,
    flags: c_int,
) -> c_int {
    let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
    // SAFETY: libc's contract, passed on.
    unsafe {
        access_common(path, mode, follow, || {
            pass!("faccessat", FaccessatFn, -1, dirfd, path, mode, flags)
        })
    }
}

// ---------------------------------------------------------------------------------------------
// open, fopen

/// A descriptor reading `text`: a memfd written and rewound (sysfs attributes are small).
fn text_fd(text: &str, cloexec: bool) -> c_int {
    let flags = if cloexec { libc::MFD_CLOEXEC } else { 0 };
    // SAFETY: a NUL-terminated name.
    let fd = unsafe { libc::memfd_create(c"softroce-sysfs".as_ptr(), flags) };
    if fd < 0 {
        return -1;
    }
    let mut done = 0;
    while done < text.len() {
        // SAFETY: the slice's bytes from `done` are readable.
        let n = unsafe { libc::write(fd, text.as_ptr().add(done).cast(), text.len() - done) };
        if n <= 0 {
            let e = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
            // SAFETY: our own descriptor.
            unsafe { libc::close(fd) };
            return fail(e, -1);
        }
        done += n as usize;
    }
    // SAFETY: our own descriptor.
    unsafe { libc::lseek(fd, 0, libc::SEEK_SET) };
    fd
}

/// `open(2)` of a node of the view.
fn open_node(node: &Node, flags: c_int) -> c_int {
    if flags & libc::O_CREAT != 0 && flags & libc::O_EXCL != 0 {
        return fail(libc::EEXIST, -1);
    }
    match node {
        Node::File(Ok(text)) => {
            if flags & libc::O_ACCMODE != libc::O_RDONLY {
                return fail(libc::EACCES, -1);
            }
            if flags & libc::O_DIRECTORY != 0 {
                return fail(libc::ENOTDIR, -1);
            }
            text_fd(text, flags & libc::O_CLOEXEC != 0)
        }
        // An empty GID slot's attributes: sysfs opens them and fails the read; failing the
        // open with the same errno is what every reader sees first.
        Node::File(Err(e)) => fail(*e, -1),
        // Directories are listed through opendir (below); a descriptor on one is not offered.
        Node::Dir(_) => fail(libc::EACCES, -1),
        Node::Link(_) => fail(libc::ELOOP, -1),
        // No driver behind the node: what a character device without one answers.
        Node::CharDev(..) => fail(libc::ENXIO, -1),
    }
}

/// # Safety
/// `path` NULL or NUL-terminated.
unsafe fn open_common(path: *const c_char, flags: c_int, real: impl FnOnce() -> c_int) -> c_int {
    let follow = flags & libc::O_NOFOLLOW == 0;
    // SAFETY: as the caller's.
    match unsafe { lookup_at(path, follow) } {
        None => real(),
        Some(Ok((_, node))) => open_node(node, flags),
        Some(Err(libc::ENOENT)) if flags & libc::O_CREAT != 0 => fail(libc::EACCES, -1),
        Some(Err(e)) => fail(e, -1),
    }
}

type OpenFn = unsafe extern "C" fn(*const c_char, c_int, mode_t) -> c_int;
type Open2Fn = unsafe extern "C" fn(*const c_char, c_int) -> c_int;
type OpenatFn = unsafe extern "C" fn(c_int, *const c_char, c_int, mode_t) -> c_int;
type Openat2Fn = unsafe extern "C" fn(c_int, *const c_char, c_int) -> c_int;

// `open` is variadic in C; on the Linux ABIs Rust targets (x86-64 SysV, AArch64 AAPCS64) a
// variadic integer argument travels in the same register as a fixed one, so the optional
// `mode` is declared as a fixed third argument. It is only meaningful (and only passed on as
// the caller meant it) with O_CREAT or O_TMPFILE; otherwise libc ignores it too.

/// # Safety
/// libc's contract for `open`.
#[no_mangle]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // SAFETY: libc's contract, passed on.
    unsafe { open_common(path, flags, || pass!("open", OpenFn, -1, path, flags, mode)) }
}

/// # Safety
/// libc's contract for `open64`.
#[no_mangle]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // SAFETY: libc's contract, passed on.
    unsafe {
        open_common(path, flags, || {
            pass!("open64", OpenFn, -1, path, flags, mode)
        })
    }
}

/// # Safety
/// glibc's contract for `__open_2` (`open` under _FORTIFY_SOURCE without O_CREAT).
#[no_mangle]
pub unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: libc's contract, passed on.
    unsafe { open_common(path, flags, || pass!("__open_2", Open2Fn, -1, path, flags)) }
}

/// # Safety
/// glibc's contract for `__open64_2`.
#[no_mangle]
pub unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: libc's contract, passed on.
    unsafe {
        open_common(path, flags, || {
            pass!("__open64_2", Open2Fn, -1, path, flags)
        })
    }
}

/// # Safety
/// libc's contract for `openat`.
#[no_mangle]
pub unsafe extern "C" fn openat(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: mode_t,
) -> c_int {
    // SAFETY: libc's contract, passed on.
    unsafe {
        open_common(path, flags, || {
            pass!("openat", OpenatFn, -1, dirfd, path, flags, mode)
        })
    }
}

/// # Safety
/// libc's contract for `openat64`.
#[no_mangle]
pub unsafe extern "C" fn openat64(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: mode_t,
) -> c_int {
    // SAFETY: libc's contract, passed on.
    unsafe {
        open_common(path, flags, || {
            pass!("openat64", OpenatFn, -1, dirfd, path, flags, mode)
        })
    }
}

/// # Safety
/// glibc's contract for `__openat_2`.
#[no_mangle]
pub unsafe extern "C" fn __openat_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: libc's contract, passed on.
    unsafe {
        open_common(path, flags, || {
            pass!("__openat_2", Openat2Fn, -1, dirfd, path, flags)
        })
    }
}

/// # Safety
/// glibc's contract for `__openat64_2`.
#[no_mangle]
pub unsafe extern "C" fn __openat64_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: libc's contract, passed on.
    unsafe {
        open_common(path, flags, || {
            pass!("__openat64_2", Openat2Fn, -1, dirfd, path, flags)
        })
    }
}

type FopenFn = unsafe extern "C" fn(*const c_char, *const c_char) -> *mut libc::FILE;

/// # Safety
/// `path` and `mode` NULL or NUL-terminated.
unsafe fn fopen_common(
    path: *const c_char,
    mode: *const c_char,
    real: impl FnOnce() -> *mut libc::FILE,
) -> *mut libc::FILE {
    // SAFETY: as the caller's.
    let found = match unsafe { lookup_at(path, true) } {
        None => return real(),
        Some(found) => found,
    };
    let node = match found {
        Ok((_, node)) => node,
        Err(e) => return fail(e, std::ptr::null_mut()),
    };
    if mode.is_null() {
        return fail(libc::EINVAL, std::ptr::null_mut());
    }
    // SAFETY: NUL-terminated per the caller.
    let m = unsafe { CStr::from_ptr(mode) }.to_bytes();
    let read_only = m.first() == Some(&b'r') && !m.contains(&b'+');
    let flags = if read_only {
        libc::O_RDONLY
    } else {
        libc::O_RDWR
    };
    let cloexec = if m.contains(&b'e') {
        libc::O_CLOEXEC
    } else {
        0
    };
    let fd = open_node(node, flags | cloexec);
    if fd < 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: our own descriptor and the caller's mode string.
    let file = unsafe { libc::fdopen(fd, mode) };
    if file.is_null() {
        // SAFETY: our own descriptor, not handed out.
        unsafe { libc::close(fd) };
    }
    file
}

/// # Safety
/// libc's contract for `fopen`.
#[no_mangle]
pub unsafe extern "C" fn fopen(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: libc's contract, passed on.
    unsafe {
        fopen_common(path, mode, || {
            pass!("fopen", FopenFn, std::ptr::null_mut(), path, mode)
        })
    }
}

/// # Safety
/// libc's contract for `fopen64`.
#[no_mangle]
pub unsafe extern "C" fn fopen64(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: libc's contract, passed on.
    unsafe {
        fopen_common(path, mode, || {
            pass!("fopen64", FopenFn, std::ptr::null_mut(), path, mode)
        })
    }
}

// ---------------------------------------------------------------------------------------------
// directories

/// A directory stream of the view. The `DIR *` handed out is the address of one of these,
/// known by [`FAKE_DIRS`]; libc never sees it.
struct FakeDir {
    entries: Vec<(Vec<u8>, u8)>,
    pos: usize,
    ent: libc::dirent64,
}

/// Open streams of the view, and their count (so `readdir` on a real stream pays one load).
static FAKE_DIRS: Mutex<BTreeSet<usize>> = Mutex::new(BTreeSet::new());
static FAKE_DIR_COUNT: AtomicUsize = AtomicUsize::new(0);

fn fake_dir(dir: *mut libc::DIR) -> Option<*mut FakeDir> {
    if FAKE_DIR_COUNT.load(Ordering::Acquire) == 0 {
        return None;
    }
    let set = FAKE_DIRS.lock().unwrap_or_else(|e| e.into_inner());
    set.contains(&(dir as usize)).then_some(dir.cast())
}

type OpendirFn = unsafe extern "C" fn(*const c_char) -> *mut libc::DIR;

/// # Safety
/// libc's contract for `opendir`.
#[no_mangle]
pub unsafe extern "C" fn opendir(path: *const c_char) -> *mut libc::DIR {
    // SAFETY: as the caller's.
    let found = match unsafe { lookup_at(path, true) } {
        None => return pass!("opendir", OpendirFn, std::ptr::null_mut(), path),
        Some(found) => found,
    };
    let (canon, node) = match found {
        Ok(f) => f,
        Err(e) => return fail(e, std::ptr::null_mut()),
    };
    let Node::Dir(names) = node else {
        return fail(libc::ENOTDIR, std::ptr::null_mut());
    };
    let view = super::view();
    let mut entries = vec![
        (b".".to_vec(), libc::DT_DIR),
        (b"..".to_vec(), libc::DT_DIR),
    ];
    for name in names {
        let child = format!("{canon}/{name}");
        let d_type = match view.lookup(child.as_bytes(), false) {
            Lookup::Found(_, Node::Dir(_)) => libc::DT_DIR,
            Lookup::Found(_, Node::Link(_)) => libc::DT_LNK,
            Lookup::Found(_, Node::CharDev(..)) => libc::DT_CHR,
            _ => libc::DT_REG,
        };
        entries.push((name.as_bytes().to_vec(), d_type));
    }
    // SAFETY: all-zero is a valid dirent64.
    let ent: libc::dirent64 = unsafe { std::mem::zeroed() };
    let dir = Box::into_raw(Box::new(FakeDir {
        entries,
        pos: 0,
        ent,
    }));
    FAKE_DIRS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(dir as usize);
    FAKE_DIR_COUNT.fetch_add(1, Ordering::AcqRel);
    dir.cast()
}

/// The next entry of a stream of the view, in its own `dirent64` (valid until the next call
/// on the stream, as POSIX allows); NULL at the end.
///
/// # Safety
/// `dir` is one of [`FAKE_DIRS`].
unsafe fn fake_next(dir: *mut FakeDir) -> *mut libc::dirent64 {
    // SAFETY: a live FakeDir per the caller; streams are not shared between threads without
    // the caller's own locking (POSIX).
    let d = unsafe { &mut *dir };
    let Some((name, d_type)) = d.entries.get(d.pos) else {
        return std::ptr::null_mut();
    };
    d.pos += 1;
    let ent = &mut d.ent;
    ent.d_ino = name.iter().fold(1469598103934665603u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(1099511628211)
    });
    ent.d_off = d.pos as i64;
    ent.d_reclen = std::mem::size_of::<libc::dirent64>() as u16;
    ent.d_type = *d_type;
    let n = name.len().min(ent.d_name.len() - 1);
    for (dst, src) in ent.d_name.iter_mut().zip(&name[..n]) {
        *dst = *src as c_char;
    }
    ent.d_name[n] = 0;
    ent
}

type ReaddirFn = unsafe extern "C" fn(*mut libc::DIR) -> *mut c_void;
type ReaddirRFn = unsafe extern "C" fn(*mut libc::DIR, *mut c_void, *mut *mut c_void) -> c_int;

/// # Safety
/// libc's contract for `readdir` (`struct dirent` is `struct dirent64` on 64-bit glibc).
#[no_mangle]
pub unsafe extern "C" fn readdir(dir: *mut libc::DIR) -> *mut c_void {
    match fake_dir(dir) {
        // SAFETY: known to be ours.
        Some(d) => unsafe { fake_next(d) }.cast(),
        None => pass!("readdir", ReaddirFn, std::ptr::null_mut(), dir),
    }
}

/// # Safety
/// libc's contract for `readdir64`.
#[no_mangle]
pub unsafe extern "C" fn readdir64(dir: *mut libc::DIR) -> *mut c_void {
    match fake_dir(dir) {
        // SAFETY: known to be ours.
        Some(d) => unsafe { fake_next(d) }.cast(),
        None => pass!("readdir64", ReaddirFn, std::ptr::null_mut(), dir),
    }
}

/// # Safety
/// `entry` and `result` writable, `dir` ours.
unsafe fn fake_next_r(d: *mut FakeDir, entry: *mut c_void, result: *mut *mut c_void) -> c_int {
    if entry.is_null() || result.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: as the caller's.
    unsafe {
        let next = fake_next(d);
        if next.is_null() {
            *result = std::ptr::null_mut();
        } else {
            entry.cast::<libc::dirent64>().write(*next);
            *result = entry;
        }
    }
    0
}

/// # Safety
/// libc's contract for `readdir_r`.
#[no_mangle]
pub unsafe extern "C" fn readdir_r(
    dir: *mut libc::DIR,
    entry: *mut c_void,
    result: *mut *mut c_void,
) -> c_int {
    match fake_dir(dir) {
        // SAFETY: known to be ours; the caller's buffers.
        Some(d) => unsafe { fake_next_r(d, entry, result) },
        None => pass!("readdir_r", ReaddirRFn, libc::ENOSYS, dir, entry, result),
    }
}

/// # Safety
/// libc's contract for `readdir64_r`.
#[no_mangle]
pub unsafe extern "C" fn readdir64_r(
    dir: *mut libc::DIR,
    entry: *mut c_void,
    result: *mut *mut c_void,
) -> c_int {
    match fake_dir(dir) {
        // SAFETY: known to be ours; the caller's buffers.
        Some(d) => unsafe { fake_next_r(d, entry, result) },
        None => pass!("readdir64_r", ReaddirRFn, libc::ENOSYS, dir, entry, result),
    }
}

type DirIntFn = unsafe extern "C" fn(*mut libc::DIR) -> c_int;
type DirVoidFn = unsafe extern "C" fn(*mut libc::DIR);

/// # Safety
/// libc's contract for `closedir`.
#[no_mangle]
pub unsafe extern "C" fn closedir(dir: *mut libc::DIR) -> c_int {
    if fake_dir(dir).is_some() {
        let removed = FAKE_DIRS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(dir as usize));
        if removed {
            FAKE_DIR_COUNT.fetch_sub(1, Ordering::AcqRel);
            // SAFETY: made by Box::into_raw in opendir and now forgotten by the registry.
            drop(unsafe { Box::from_raw(dir.cast::<FakeDir>()) });
        }
        return 0;
    }
    pass!("closedir", DirIntFn, -1, dir)
}

/// # Safety
/// libc's contract for `dirfd`.
#[no_mangle]
pub unsafe extern "C" fn dirfd(dir: *mut libc::DIR) -> c_int {
    if fake_dir(dir).is_some() {
        // No descriptor stands behind a directory of the view.
        return fail(libc::ENOTSUP, -1);
    }
    pass!("dirfd", DirIntFn, -1, dir)
}

/// # Safety
/// libc's contract for `rewinddir`.
#[no_mangle]
pub unsafe extern "C" fn rewinddir(dir: *mut libc::DIR) {
    match fake_dir(dir) {
        // SAFETY: known to be ours.
        Some(d) => unsafe { (*d).pos = 0 },
        None => {
            if let Some(f) = next!("rewinddir", DirVoidFn) {
                // SAFETY: the caller's stream.
                unsafe { f(dir) }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// readlink, realpath

/// # Safety
/// `buf` writable for `size` bytes.
unsafe fn readlink_node(
    found: Result<(String, &Node), c_int>,
    buf: *mut c_char,
    size: size_t,
) -> ssize_t {
    match found {
        Err(e) => fail(e, -1),
        Ok((_, Node::Link(target))) => {
            if buf.is_null() {
                return fail(libc::EFAULT, -1);
            }
            let n = target.len().min(size);
            // SAFETY: n <= size bytes of the caller's buffer.
            unsafe { std::ptr::copy_nonoverlapping(target.as_ptr(), buf.cast(), n) };
            n as ssize_t
        }
        Ok(_) => fail(libc::EINVAL, -1),
    }
}

type ReadlinkFn = unsafe extern "C" fn(*const c_char, *mut c_char, size_t) -> ssize_t;
type ReadlinkChkFn = unsafe extern "C" fn(*const c_char, *mut c_char, size_t, size_t) -> ssize_t;
type ReadlinkatFn = unsafe extern "C" fn(c_int, *const c_char, *mut c_char, size_t) -> ssize_t;

/// # Safety
/// libc's contract for `readlink`.
#[no_mangle]
pub unsafe extern "C" fn readlink(path: *const c_char, buf: *mut c_char, size: size_t) -> ssize_t {
    // SAFETY: as the caller's.
    match unsafe { lookup_at(path, false) } {
        None => pass!("readlink", ReadlinkFn, -1, path, buf, size),
        // SAFETY: the caller's buffer.
        Some(found) => unsafe { readlink_node(found, buf, size) },
    }
}

/// # Safety
/// glibc's contract for `__readlink_chk` (fortified `readlink`).
#[no_mangle]
pub unsafe extern "C" fn __readlink_chk(
    path: *const c_char,
    buf: *mut c_char,
    size: size_t,
    buflen: size_t,
) -> ssize_t {
    // SAFETY: as the caller's.
    match unsafe { lookup_at(path, false) } {
        None => pass!("__readlink_chk", ReadlinkChkFn, -1, path, buf, size, buflen),
        // SAFETY: the caller's buffer, never past its real length.
        Some(found) => unsafe { readlink_node(found, buf, size.min(buflen)) },
    }
}

/// # Safety
/// libc's contract for `readlinkat`.
#[no_mangle]
pub unsafe extern "C" fn readlinkat(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut c_char,
    size: size_t,
) -> ssize_t {
    // SAFETY: as the caller's.
    match unsafe { lookup_at(path, false) } {
        None => pass!("readlinkat", ReadlinkatFn, -1, dirfd, path, buf, size),
        // SAFETY: the caller's buffer.
        Some(found) => unsafe { readlink_node(found, buf, size) },
    }
}

/// `realpath`'s answer for a path of the view: its canonical path, in `resolved` (PATH_MAX
/// bytes) or a malloc'd copy.
///
/// # Safety
/// `resolved` NULL or writable for `room` bytes.
unsafe fn realpath_node(
    found: Result<(String, &Node), c_int>,
    resolved: *mut c_char,
    room: usize,
) -> *mut c_char {
    let canon = match found {
        Ok((canon, _)) => canon,
        Err(e) => return fail(e, std::ptr::null_mut()),
    };
    let bytes = canon.as_bytes();
    let out = if resolved.is_null() {
        // SAFETY: malloc of the length plus the terminator; the caller frees it.
        let p = unsafe { libc::malloc(bytes.len() + 1) }.cast::<c_char>();
        if p.is_null() {
            return fail(libc::ENOMEM, std::ptr::null_mut());
        }
        p
    } else if bytes.len() + 1 > room {
        return fail(libc::ENAMETOOLONG, std::ptr::null_mut());
    } else {
        resolved
    };
    // SAFETY: `out` has room for the bytes and the NUL.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.cast(), bytes.len());
        *out.add(bytes.len()) = 0;
    }
    out
}

type RealpathFn = unsafe extern "C" fn(*const c_char, *mut c_char) -> *mut c_char;
type RealpathChkFn = unsafe extern "C" fn(*const c_char, *mut c_char, size_t) -> *mut c_char;
type CanonFn = unsafe extern "C" fn(*const c_char) -> *mut c_char;

/// # Safety
/// libc's contract for `realpath`.
#[no_mangle]
pub unsafe extern "C" fn realpath(path: *const c_char, resolved: *mut c_char) -> *mut c_char {
    // SAFETY: as the caller's.
    match unsafe { lookup_at(path, true) } {
        None => pass!("realpath", RealpathFn, std::ptr::null_mut(), path, resolved),
        // SAFETY: realpath's `resolved` holds PATH_MAX bytes.
        Some(found) => unsafe { realpath_node(found, resolved, libc::PATH_MAX as usize) },
    }
}

/// # Safety
/// glibc's contract for `__realpath_chk` (fortified `realpath`).
#[no_mangle]
pub unsafe extern "C" fn __realpath_chk(
    path: *const c_char,
    resolved: *mut c_char,
    resolvedlen: size_t,
) -> *mut c_char {
    // SAFETY: as the caller's.
    match unsafe { lookup_at(path, true) } {
        None => pass!(
            "__realpath_chk",
            RealpathChkFn,
            std::ptr::null_mut(),
            path,
            resolved,
            resolvedlen
        ),
        // SAFETY: the caller's buffer and its real length.
        Some(found) => unsafe { realpath_node(found, resolved, resolvedlen) },
    }
}

/// # Safety
/// libc's contract for `canonicalize_file_name`.
#[no_mangle]
pub unsafe extern "C" fn canonicalize_file_name(path: *const c_char) -> *mut c_char {
    // SAFETY: as the caller's.
    match unsafe { lookup_at(path, true) } {
        None => pass!(
            "canonicalize_file_name",
            CanonFn,
            std::ptr::null_mut(),
            path
        ),
        // SAFETY: NULL: a malloc'd answer.
        Some(found) => unsafe { realpath_node(found, std::ptr::null_mut(), 0) },
    }
}

// ---------------------------------------------------------------------------------------------
// extended attributes: sysfs has none, and `ls -l` asks for ACLs on every entry

type GetxattrFn =
    unsafe extern "C" fn(*const c_char, *const c_char, *mut c_void, size_t) -> ssize_t;
type ListxattrFn = unsafe extern "C" fn(*const c_char, *mut c_char, size_t) -> ssize_t;

/// # Safety
/// `path` NULL or NUL-terminated.
unsafe fn xattr_common(
    path: *const c_char,
    follow: bool,
    real: impl FnOnce() -> ssize_t,
) -> ssize_t {
    // SAFETY: as the caller's.
    match unsafe { lookup_at(path, follow) } {
        None => real(),
        Some(Ok(_)) => fail(libc::ENOTSUP, -1),
        Some(Err(e)) => fail(e, -1),
    }
}

/// # Safety
/// libc's contract for `getxattr`.
#[no_mangle]
pub unsafe extern "C" fn getxattr(
    path: *const c_char,
    name: *const c_char,
    value: *mut c_void,
    size: size_t,
) -> ssize_t {
    // SAFETY: libc's contract, passed on.
    unsafe {
        xattr_common(path, true, || {
            pass!("getxattr", GetxattrFn, -1, path, name, value, size)
        })
    }
}

/// # Safety
/// libc's contract for `lgetxattr`.
#[no_mangle]
pub unsafe extern "C" fn lgetxattr(
    path: *const c_char,
    name: *const c_char,
    value: *mut c_void,
    size: size_t,
) -> ssize_t {
    // SAFETY: libc's contract, passed on.
    unsafe {
        xattr_common(path, false, || {
            pass!("lgetxattr", GetxattrFn, -1, path, name, value, size)
        })
    }
}

/// # Safety
/// libc's contract for `listxattr`.
#[no_mangle]
pub unsafe extern "C" fn listxattr(
    path: *const c_char,
    list: *mut c_char,
    size: size_t,
) -> ssize_t {
    // SAFETY: libc's contract, passed on.
    unsafe {
        xattr_common(path, true, || {
            pass!("listxattr", ListxattrFn, -1, path, list, size)
        })
    }
}

/// # Safety
/// libc's contract for `llistxattr`.
#[no_mangle]
pub unsafe extern "C" fn llistxattr(
    path: *const c_char,
    list: *mut c_char,
    size: size_t,
) -> ssize_t {
    // SAFETY: libc's contract, passed on.
    unsafe {
        xattr_common(path, false, || {
            pass!("llistxattr", ListxattrFn, -1, path, list, size)
        })
    }
}

/// Reads a file of the view whole, for [`crate::verbs::helpers::ibv_read_sysfs_file`], which
/// must see the view also when the shim was loaded as a replacement (no interposition).
/// `None` when `path` is not the view's.
pub fn read_view_file(path: &[u8]) -> Option<Result<String, c_int>> {
    if !tree::may_be_owned(path) {
        return None;
    }
    match super::view().lookup(path, true) {
        Lookup::Real => None,
        Lookup::Found(_, Node::File(text)) => Some(text.clone()),
        Lookup::Found(_, Node::Dir(_)) => Some(Err(libc::EISDIR)),
        Lookup::Found(_, _) => Some(Err(libc::EINVAL)),
        Lookup::Missing(e) => Some(Err(e)),
    }
}
