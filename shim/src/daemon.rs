//! The shim's connection to the daemon's control socket (Unix `SOCK_SEQPACKET`, one
//! postcard-encoded `proto::ctl` message per request and per response).
//!
//! * **One per process, opened on first use** ([`connection`]), never in a constructor: every
//!   child process inherits `LD_PRELOAD`, and most of them never touch a verb.
//! * **Kept for the process's life**: the daemon ties every resource to the connection that
//!   created it and frees them when it closes, like the kernel does with a uverbs file. All
//!   contexts share it; each context's `cmd_fd` is a `dup` of it (a real fd the app may poll or
//!   pass around, as with `/dev/infiniband/uverbsN`).
//! * **Loss is fatal, as device removal is**: a monitor thread waits for the socket to hang up
//!   and then posts `IBV_EVENT_DEVICE_FATAL` to every open context's `async_fd` (what the
//!   kernel's `ib_uverbs_remove_one` does); later `ibv_open_device` calls fail with `ENODEV`.
//! * **Fork**: the socket is `SOCK_CLOEXEC`, so exec'd programs never inherit it. A plain
//!   `fork()` child would share it with the parent (two processes interleaving requests on one
//!   connection, and the daemon unable to tell them apart), so a `pthread_atfork` child handler
//!   replaces the child's copy of the descriptor with an unconnected socket and forgets the
//!   connection: requests through contexts inherited from the parent fail (as rdma-core without
//!   `ibv_fork_init` leaves them unusable), and the child's own first verb opens its own
//!   connection, so the daemon sees it as a separate client. `cmd_fd` duplicates held by
//!   inherited contexts stay open in the child until it closes those contexts, exactly like the
//!   kernel's shared uverbs file.

use std::fmt;
use std::io::{IoSlice, IoSliceMut, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Mutex, Once};

use nix::sys::socket::{
    connect, recvmsg, sendmsg, setsockopt, socket, sockopt, AddressFamily, ControlMessage,
    ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr,
};
use nix::sys::time::TimeVal;
use proto::ctl::{self, DeviceInfo, Request, Response, MAX_MESSAGE, PROTOCOL_VERSION};

use crate::ffi::Errno;

/// The most descriptors one control message may carry (rings, doorbells, event fds).
const MAX_FDS_PER_MESSAGE: usize = 8;
/// How long the handshake waits for a daemon that accepted but does not answer, so a wedged
/// daemon makes `ibv_get_device_list` fail instead of hanging the application forever.
const HANDSHAKE_TIMEOUT_SECS: i64 = 10;

/// The control socket path: `$SOFTROCE_SOCKET`, else `$XDG_RUNTIME_DIR/softroce/ctl.sock`,
/// else `/run/softroce/ctl.sock` (the daemon's `config::socket_path` rule without a flag).
pub fn socket_path() -> PathBuf {
    if let Some(p) = std::env::var_os("SOFTROCE_SOCKET").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").filter(|p| !p.is_empty()) {
        return PathBuf::from(dir).join("softroce/ctl.sock");
    }
    PathBuf::from("/run/softroce/ctl.sock")
}

/// Why no connection could be made; its `Display` is the one line the shim prints on stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectError {
    /// Nothing listens at `path` (no socket file, or a stale one).
    NoDaemon { path: PathBuf, errno: i32 },
    /// The daemon answered with an error (wrong protocol version, other user, too many
    /// connections, ...), or the socket's permissions keep this user out. `errno` is what the
    /// verb reports (EACCES for a user who is not let in, EAGAIN for a full daemon).
    Refused {
        path: PathBuf,
        message: String,
        errno: i32,
    },
    /// The daemon closed the connection, timed out or sent something unexpected.
    Protocol { path: PathBuf, what: String },
}

impl ConnectError {
    /// The errno a verb reports for this failure.
    pub fn errno(&self) -> Errno {
        match self {
            ConnectError::NoDaemon { .. } => Errno(libc::ENODEV),
            ConnectError::Refused { errno, .. } => Errno(*errno),
            ConnectError::Protocol { .. } => Errno::PROTO,
        }
    }
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectError::NoDaemon { path, .. } => write!(
                f,
                "softroce: no daemon at {} (start one with: softroce daemon)",
                path.display()
            ),
            ConnectError::Refused { path, message, .. } => write!(
                f,
                "softroce: the daemon at {} refused this process: {message}",
                path.display()
            ),
            ConnectError::Protocol { path, what } => write!(
                f,
                "softroce: unexpected answer from the daemon at {}: {what}",
                path.display()
            ),
        }
    }
}

/// Why `connect` to `path` was not permitted, naming whom the socket serves.
fn permission_message(path: &Path, e: nix::Error) -> String {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: getuid cannot fail.
    let me = unsafe { libc::getuid() };
    match std::fs::metadata(path) {
        Ok(m) => format!(
            "permission denied ({e}): its socket is mode {:o}, owner uid {} group {}, and this \
             process runs as uid {me} (the daemon lets other users in with --allow-uid or \
             --allow-group)",
            m.mode() & 0o777,
            m.uid(),
            m.gid()
        ),
        Err(_) => format!(
            "permission denied ({e}) to uid {me} (the daemon lets other users in with \
             --allow-uid or --allow-group)"
        ),
    }
}

/// Prints `err` as one line on stderr (never panics, even with stderr closed).
pub fn report(err: &ConnectError) {
    let _ = writeln!(std::io::stderr(), "{err}");
}

/// An established, introduced control connection.
#[derive(Debug)]
pub struct ControlConnection {
    fd: OwnedFd,
    client_id: u64,
    /// Descriptors that came with the `Hello` answer (the client's doorbell eventfd, once the
    /// daemon sends it), kept open for the verbs that will use them.
    hello_fds: Vec<OwnedFd>,
    path: PathBuf,
    /// One exchange at a time: SEQPACKET keeps each message whole, but two threads' requests
    /// would otherwise read each other's answers.
    exchange: Mutex<()>,
    /// Set once the daemon is gone (hang-up seen, or this is a fork child's stale copy).
    lost: AtomicBool,
}

impl ControlConnection {
    /// Connects to `path` and introduces this process as `program` (the `Hello` exchange).
    pub fn open(path: &Path, program: &str) -> Result<ControlConnection, ConnectError> {
        let no_daemon = |e: nix::Error| ConnectError::NoDaemon {
            path: path.to_path_buf(),
            errno: e as i32,
        };
        let fd = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(no_daemon)?;
        let addr = UnixAddr::new(path).map_err(no_daemon)?;
        match connect(fd.as_raw_fd(), &addr) {
            Ok(()) => {}
            // The socket's mode keeps this user out (the daemon serves its own user unless
            // started with --allow-uid / --allow-group).
            Err(e @ (nix::Error::EACCES | nix::Error::EPERM)) => {
                return Err(ConnectError::Refused {
                    path: path.to_path_buf(),
                    message: permission_message(path, e),
                    errno: libc::EACCES,
                })
            }
            Err(e) => return Err(no_daemon(e)),
        }
        let protocol = |what: String| ConnectError::Protocol {
            path: path.to_path_buf(),
            what,
        };
        let timeout = TimeVal::new(HANDSHAKE_TIMEOUT_SECS, 0);
        setsockopt(&fd, sockopt::ReceiveTimeout, &timeout)
            .map_err(|e| protocol(format!("setting a receive timeout: {e}")))?;
        let hello = Request::Hello {
            version: PROTOCOL_VERSION,
            program: program.to_owned(),
        };
        let (client_id, hello_fds) = match exchange(fd.as_raw_fd(), &hello, &[]) {
            Ok((Response::Hello { version, client }, fds)) if version == PROTOCOL_VERSION => {
                (client, fds)
            }
            Ok((Response::Hello { version, .. }, _)) => {
                return Err(ConnectError::Refused {
                    path: path.to_path_buf(),
                    message: ctl::version_mismatch(PROTOCOL_VERSION, version),
                    errno: libc::EPROTO,
                })
            }
            Ok((Response::Error { message, errno }, _)) => {
                // A daemon older than `ctl::version_mismatch` says only the two versions.
                let message = if errno == libc::EPROTO && !message.contains("restart") {
                    format!(
                        "{message}; restart the daemon with the softroce that goes with this shim"
                    )
                } else {
                    message
                };
                return Err(ConnectError::Refused {
                    path: path.to_path_buf(),
                    message,
                    errno: if errno > 0 { errno } else { libc::EACCES },
                });
            }
            Ok((other, _)) => return Err(protocol(format!("{other:?} in answer to hello"))),
            Err(e) => return Err(protocol(e.to_string())),
        };
        // Later requests (resource creation) may legitimately take a while; only the
        // handshake is bounded.
        setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::new(0, 0))
            .map_err(|e| protocol(format!("clearing the receive timeout: {e}")))?;
        Ok(ControlConnection {
            fd,
            client_id,
            hello_fds,
            path: path.to_path_buf(),
            exchange: Mutex::new(()),
            lost: AtomicBool::new(false),
        })
    }

    /// The id the daemon gave this process in its `Hello` answer.
    pub fn client_id(&self) -> u64 {
        self.client_id
    }

    /// The descriptors the daemon attached to its `Hello` answer, in order.
    pub fn hello_fds(&self) -> &[OwnedFd] {
        &self.hello_fds
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the daemon is gone; every verb that needs it then fails with `ENODEV`.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Sends one request (with `fds` attached as `SCM_RIGHTS`) and waits for its answer and
    /// the descriptors that came with it. A daemon-side failure is `Ok(Response::Error)`;
    /// `Err` means the connection itself failed (`ENODEV` once the daemon is gone).
    pub fn request(
        &self,
        request: &Request,
        fds: &[RawFd],
    ) -> Result<(Response, Vec<OwnedFd>), Errno> {
        if self.is_lost() {
            return Err(Errno(libc::ENODEV));
        }
        // A panic while exchanging cannot leave the () guard inconsistent.
        let _one_at_a_time = self.exchange.lock().unwrap_or_else(|e| e.into_inner());
        match exchange(self.fd.as_raw_fd(), request, fds) {
            Ok(answer) => Ok(answer),
            Err(ExchangeError::Closed) => {
                self.lost.store(true, Ordering::Release);
                Err(Errno(libc::ENODEV))
            }
            Err(ExchangeError::Os(e)) => Err(e),
            Err(ExchangeError::Malformed(_)) => Err(Errno::PROTO),
        }
    }

    /// The daemon's devices, in its order.
    pub fn query_devices(&self) -> Result<Vec<DeviceInfo>, ConnectError> {
        let protocol = |what: String| ConnectError::Protocol {
            path: self.path.clone(),
            what,
        };
        match self.request(&Request::QueryDevices, &[]) {
            Ok((Response::Devices(devices), _)) => Ok(devices),
            Ok((Response::Error { message, errno }, _)) => Err(ConnectError::Refused {
                path: self.path.clone(),
                message,
                errno: if errno > 0 { errno } else { libc::EIO },
            }),
            Ok((other, _)) => Err(protocol(format!("{other:?} in answer to QueryDevices"))),
            Err(e) => Err(protocol(format!(
                "QueryDevices failed: {}",
                std::io::Error::from_raw_os_error(e.0)
            ))),
        }
    }

    /// A close-on-exec duplicate of the socket, for a context's `cmd_fd`.
    pub fn dup_fd(&self) -> Result<OwnedFd, Errno> {
        // SAFETY: fcntl on a descriptor we own; the result is a new descriptor or -1.
        let fd = unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
        if fd < 0 {
            return Err(Errno::last());
        }
        // SAFETY: fcntl just created `fd`; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Blocks until the daemon's end of the socket is closed (daemon exit, crash or kill).
    /// Only polls for hang-up, never reads, so it does not race [`Self::request`].
    fn wait_for_hangup(&self) {
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            // POLLHUP/POLLERR/POLLNVAL are always reported; POLLRDHUP is the peer's close.
            events: libc::POLLRDHUP,
            revents: 0,
        };
        loop {
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut p, 1, -1) };
            if n > 0 && p.revents != 0 {
                return;
            }
            if n < 0 && Errno::last().0 != libc::EINTR {
                return;
            }
        }
    }
}

/// How one exchange failed.
#[derive(Debug)]
enum ExchangeError {
    /// Orderly EOF or a reset: the daemon is gone.
    Closed,
    Os(Errno),
    Malformed(String),
}

impl fmt::Display for ExchangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExchangeError::Closed => f.write_str("the daemon closed the connection"),
            ExchangeError::Os(e) => write!(f, "{}", std::io::Error::from_raw_os_error(e.0)),
            ExchangeError::Malformed(what) => f.write_str(what),
        }
    }
}

fn os_error(e: nix::Error) -> ExchangeError {
    match e {
        nix::Error::EPIPE | nix::Error::ECONNRESET | nix::Error::ENOTCONN => ExchangeError::Closed,
        e => ExchangeError::Os(Errno(e as i32)),
    }
}

/// One request and its response on a connected SEQPACKET socket.
fn exchange(
    fd: RawFd,
    request: &Request,
    fds: &[RawFd],
) -> Result<(Response, Vec<OwnedFd>), ExchangeError> {
    let bytes = ctl::encode(request)
        .map_err(|e| ExchangeError::Malformed(format!("encoding the request: {e}")))?;
    let iov = [IoSlice::new(&bytes)];
    let rights = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &rights };
    // MSG_NOSIGNAL: a vanished daemon must be an error here, not a SIGPIPE that kills the app.
    let mut recv_flags = MsgFlags::MSG_CMSG_CLOEXEC;
    loop {
        match sendmsg::<()>(fd, &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
            Ok(_) => break,
            Err(nix::Error::EINTR) => continue,
            // A daemon that refuses a connection answers and closes before it reads: the
            // answer may still be waiting (then it says why), else the daemon is gone.
            Err(e @ (nix::Error::EPIPE | nix::Error::ECONNRESET)) => {
                recv_flags |= MsgFlags::MSG_DONTWAIT;
                if !matches!(request, Request::Hello { .. }) {
                    return Err(os_error(e));
                }
                break;
            }
            Err(e) => return Err(os_error(e)),
        }
    }
    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut received = Vec::new();
    let (len, truncated) = loop {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let mut space = nix::cmsg_space!([RawFd; MAX_FDS_PER_MESSAGE]);
        let msg = match recvmsg::<()>(fd, &mut iov, Some(&mut space), recv_flags) {
            Ok(msg) => msg,
            Err(nix::Error::EINTR) => continue,
            // Closed with our message unread, the socket reports ECONNRESET once, before
            // the answer the daemon queued ahead of it (a refusal says why).
            Err(nix::Error::ECONNRESET) if !recv_flags.contains(MsgFlags::MSG_DONTWAIT) => {
                recv_flags |= MsgFlags::MSG_DONTWAIT;
                continue;
            }
            Err(nix::Error::ECONNRESET) => return Err(ExchangeError::Closed),
            Err(nix::Error::EAGAIN) if recv_flags.contains(MsgFlags::MSG_DONTWAIT) => {
                return Err(ExchangeError::Closed)
            }
            Err(nix::Error::EAGAIN) => {
                return Err(ExchangeError::Malformed(
                    "no answer within the handshake timeout".into(),
                ))
            }
            Err(e) => return Err(os_error(e)),
        };
        for c in msg
            .cmsgs()
            .map_err(|e| ExchangeError::Malformed(format!("control data: {e}")))?
        {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // SAFETY: the kernel just installed these descriptors in our table for us.
                received.extend(raw.into_iter().map(|f| unsafe { OwnedFd::from_raw_fd(f) }));
            }
        }
        let truncated = msg
            .flags
            .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC);
        break (msg.bytes, truncated);
    };
    if len == 0 {
        return Err(ExchangeError::Closed);
    }
    if truncated {
        return Err(ExchangeError::Malformed(format!(
            "answer larger than {MAX_MESSAGE} bytes or with more than {MAX_FDS_PER_MESSAGE} descriptors"
        )));
    }
    let response = ctl::decode::<Response>(&buf[..len])
        .map_err(|e| ExchangeError::Malformed(format!("undecodable answer: {e}")))?;
    Ok((response, received))
}

/// This process's name for the daemon's logs and `softroce res show`: `/proc/self/comm`, else
/// the base name of `argv[0]`.
pub fn program_name() -> String {
    std::fs::read_to_string("/proc/self/comm")
        .ok()
        .map(|s| s.trim_end().to_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| {
            std::env::args_os().next().and_then(|a| {
                Path::new(&a)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
            })
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The process's connection. Leaked on purpose: contexts and the monitor thread hold
/// `&'static` references for the life of the process. A fork child swaps it for null.
static CURRENT: AtomicPtr<ControlConnection> = AtomicPtr::new(ptr::null_mut());

/// The process's control connection, opened (and introduced) on first use.
pub fn connection() -> Result<&'static ControlConnection, ConnectError> {
    let existing = CURRENT.load(Ordering::Acquire);
    if !existing.is_null() {
        // SAFETY: non-null values of CURRENT are leaked boxes, never freed.
        return Ok(unsafe { &*existing });
    }
    let fresh = Box::into_raw(Box::new(ControlConnection::open(
        &socket_path(),
        &program_name(),
    )?));
    // Two threads may race to connect; the loser closes its (already introduced) connection,
    // which the daemon sees as a client that came and went.
    match CURRENT.compare_exchange(ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            install_fork_handler();
            // SAFETY: `fresh` is now owned by CURRENT and never freed.
            let conn: &'static ControlConnection = unsafe { &*fresh };
            spawn_monitor(conn);
            Ok(conn)
        }
        Err(winner) => {
            // SAFETY: `fresh` lost the race and was never shared; reclaim and drop it.
            drop(unsafe { Box::from_raw(fresh) });
            // SAFETY: as above, non-null values of CURRENT are never freed.
            Ok(unsafe { &*winner })
        }
    }
}

/// Starts the thread that turns a hang-up of `conn` into `IBV_EVENT_DEVICE_FATAL` on every open
/// context. If the thread cannot be started the shim still works, only without that event.
fn spawn_monitor(conn: &'static ControlConnection) {
    let _ = std::thread::Builder::new()
        .name("softroce-ctl".into())
        .spawn(move || {
            conn.wait_for_hangup();
            conn.lost.store(true, Ordering::Release);
            // One line, so that a program that only reports "a verb failed" (UCX: "failed to
            // poll receive CQ -1") can be told apart from a bug: every verb from now on fails
            // with ENODEV, as after the removal of a kernel device.
            let _ = writeln!(
                std::io::stderr(),
                "softroce: the daemon at {} closed this process's connection: its devices are \
                 gone (IBV_EVENT_DEVICE_FATAL)",
                conn.path.display()
            );
            crate::runtime::post_device_fatal_to_all_contexts();
        });
}

fn install_fork_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a plain extern "C" function that only makes async-signal-safe
        // calls (see `forget_connection_in_child`).
        unsafe { libc::pthread_atfork(None, None, Some(forget_connection_in_child)) };
    });
}

/// `pthread_atfork` child handler: the child must not talk on the parent's connection. It runs
/// in a process with one thread and possibly locked mutexes, so it only swaps an atomic, makes
/// raw syscalls and stores an atomic flag.
extern "C" fn forget_connection_in_child() {
    let inherited = CURRENT.swap(ptr::null_mut(), Ordering::AcqRel);
    if inherited.is_null() {
        return;
    }
    // SAFETY: non-null values of CURRENT are leaked boxes, never freed; the child keeps it
    // leaked too, because inherited contexts may still point at it.
    let conn = unsafe { &*inherited };
    conn.lost.store(true, Ordering::Release);
    // Replace (not just close) the descriptor, so its number cannot be reused for some other
    // file that a stale request would then write into.
    // SAFETY: plain syscalls on descriptors of this process.
    unsafe {
        let dead = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0);
        if dead >= 0 {
            libc::dup3(dead, conn.fd.as_raw_fd(), libc::O_CLOEXEC);
            // The parent's doorbell too: the child must not wake the daemon for the parent.
            for fd in &conn.hello_fds {
                libc::dup3(dead, fd.as_raw_fd(), libc::O_CLOEXEC);
            }
            libc::close(dead);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::ctl::{GidEntry, RoceVersion};
    use std::os::unix::net::UnixListener;

    /// A daemon stand-in on a fresh socket path that answers hello and one more request
    /// with `second`, then closes.
    fn serve_once(name: &str, first: Response, second: Option<Response>) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("softroce-shim-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ctl.sock");
        let listener = seqpacket_listener(&path);
        std::thread::spawn(move || {
            let conn = accept(&listener);
            let mut buf = vec![0u8; MAX_MESSAGE];
            // SAFETY: conn is a connected socket; buf is writable.
            let n = unsafe { libc::recv(conn.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            let req: Request = ctl::decode(&buf[..n as usize]).unwrap();
            assert!(matches!(
                req,
                Request::Hello {
                    version: PROTOCOL_VERSION,
                    ..
                }
            ));
            send(&conn, &first);
            if let Some(second) = second {
                // SAFETY: as above.
                let n =
                    unsafe { libc::recv(conn.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
                assert_eq!(
                    ctl::decode::<Request>(&buf[..n as usize]).unwrap(),
                    Request::QueryDevices
                );
                send(&conn, &second);
            }
        });
        path
    }

    fn seqpacket_listener(path: &Path) -> OwnedFd {
        let fd = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        nix::sys::socket::bind(fd.as_raw_fd(), &UnixAddr::new(path).unwrap()).unwrap();
        nix::sys::socket::listen(&fd, nix::sys::socket::Backlog::new(4).unwrap()).unwrap();
        fd
    }

    fn accept(l: &OwnedFd) -> OwnedFd {
        let fd = nix::sys::socket::accept(l.as_raw_fd()).unwrap();
        // SAFETY: accept returned a new descriptor.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }

    fn send(fd: &OwnedFd, r: &Response) {
        let b = ctl::encode(r).unwrap();
        nix::sys::socket::send(fd.as_raw_fd(), &b, MsgFlags::empty()).unwrap();
    }

    #[test]
    fn hello_then_devices() {
        let info = DeviceInfo {
            name: "srxe3".into(),
            node_guid: 0x0211_22ff_fe33_4455,
            roce: RoceVersion::V2,
            max_mtu: 5,
            active_mtu: 3,
            port_active: true,
            gids: vec![GidEntry {
                index: 1,
                gid: ctl::gid_of("127.0.0.3".parse().unwrap()),
                roce: RoceVersion::V2,
            }],
            netdevs: vec![],
            max_cqe: 32767,
            limits: Default::default(),
            speed_mbps: 100_000,
        };
        let path = serve_once(
            "ok",
            Response::Hello {
                version: PROTOCOL_VERSION,
                client: 42,
            },
            Some(Response::Devices(vec![info.clone()])),
        );
        let conn = ControlConnection::open(&path, "unit-test").unwrap();
        assert_eq!(conn.client_id(), 42);
        assert_eq!(conn.query_devices().unwrap(), vec![info]);
        assert!(!conn.is_lost());
        // The stand-in closes after two answers: the next request sees the daemon gone.
        let e = conn.request(&Request::QueryDevices, &[]).unwrap_err();
        assert_eq!(e.0, libc::ENODEV);
        assert!(conn.is_lost());
        conn.wait_for_hangup(); // returns at once: the peer is closed
        let dup = conn.dup_fd().unwrap();
        assert_ne!(dup.as_raw_fd(), conn.fd.as_raw_fd());
    }

    #[test]
    fn refusal_and_version_mismatch_are_reported() {
        let path = serve_once(
            "refused",
            Response::Error {
                errno: libc::EACCES,
                message: "uid 7 may not use a daemon running as uid 8".into(),
            },
            None,
        );
        let e = ControlConnection::open(&path, "t").unwrap_err();
        assert!(matches!(&e, ConnectError::Refused { message, .. } if message.contains("uid 7")));
        assert_eq!(e.errno().0, libc::EACCES);

        let path = serve_once(
            "version",
            Response::Hello {
                version: PROTOCOL_VERSION + 1,
                client: 1,
            },
            None,
        );
        let e = ControlConnection::open(&path, "t").unwrap_err();
        assert!(
            e.to_string().contains(&format!(
                "the client speaks control protocol {PROTOCOL_VERSION} and the daemon {}",
                PROTOCOL_VERSION + 1
            )) && e.to_string().contains("restart the daemon"),
            "{e}"
        );
        // What a daemon of before the fix was named says: the fix is added.
        let path = serve_once(
            "old",
            Response::Error {
                errno: libc::EPROTO,
                message: "client speaks protocol 5, daemon speaks 4".into(),
            },
            None,
        );
        let e = ControlConnection::open(&path, "t").unwrap_err();
        assert!(
            e.to_string().ends_with(
                "daemon speaks 4; restart the daemon with the softroce that goes with this shim"
            ),
            "{e}"
        );
    }

    #[test]
    fn no_daemon_gives_the_one_clear_line() {
        let path = std::env::temp_dir().join("softroce-shim-no-such-dir/ctl.sock");
        let e = ControlConnection::open(&path, "t").unwrap_err();
        assert!(matches!(e, ConnectError::NoDaemon { .. }));
        assert_eq!(
            e.to_string(),
            format!(
                "softroce: no daemon at {} (start one with: softroce daemon)",
                path.display()
            )
        );
        // A socket file nobody listens on (a crashed daemon's leftover) is the same case.
        let dir = std::env::temp_dir().join(format!("softroce-shim-{}-stale", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let stale = dir.join("ctl.sock");
        drop(UnixListener::bind(&stale).unwrap());
        let e = ControlConnection::open(&stale, "t").unwrap_err();
        assert!(matches!(e, ConnectError::NoDaemon { .. }), "{e:?}");
    }

    #[test]
    fn program_name_is_not_empty() {
        assert!(!program_name().is_empty());
    }
}
