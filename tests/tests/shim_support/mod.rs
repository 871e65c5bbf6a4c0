//! Helpers shared by the `shim_*` end-to-end tests: build the shim (both forms) through
//! scripts/shim-build.sh and the daemon beside it, start a private `softroce daemon` per test
//! ([`Daemon`], stopped by its `Drop` even when the test fails), find the real programs,
//! compile small C programs.
//!
//! Missing programs or headers fail the test with a message to run scripts/test, which installs
//! them (scripts/install-deps); they never make a test pass silently.

#![allow(dead_code)]

pub mod captures;
pub mod netns;
pub mod operator;
pub mod programs;
pub mod rdmacm;
pub mod symbols;

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use proto::ctl::{self, DeviceInfo, Request, Response};

pub struct ShimLibs {
    /// The LD_PRELOAD library.
    pub preload: PathBuf,
    /// Directory holding the replacement `libibverbs.so.1` (for LD_LIBRARY_PATH).
    pub replacement_dir: PathBuf,
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn scratch_root() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
}

/// Builds the shim once per test binary (in its own target dir, so it never waits on the lock
/// the running `cargo test` holds).
pub fn shim_libs() -> &'static ShimLibs {
    static LIBS: OnceLock<ShimLibs> = OnceLock::new();
    LIBS.get_or_init(|| {
        let out = scratch_root().join("shim-e2e");
        let built = Command::new("bash")
            .arg(workspace_root().join("scripts/shim-build.sh"))
            .arg(&out)
            .env("CARGO", env!("CARGO"))
            .output()
            .expect("run scripts/shim-build.sh");
        check_output("scripts/shim-build.sh", built);
        let libs = ShimLibs {
            preload: out.join("libsoftroce.so"),
            replacement_dir: out.join("replacement"),
        };
        assert!(
            libs.preload.is_file(),
            "{} was not built",
            libs.preload.display()
        );
        assert!(libs.replacement_dir.join("libibverbs.so.1").is_file());
        libs
    })
}

/// The absolute path of an installed program, or a failure telling how to install it.
pub fn require_program(name: &str) -> PathBuf {
    for dir in ["/usr/bin", "/usr/local/bin", "/bin", "/usr/sbin"] {
        let p = Path::new(dir).join(name);
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "`{name}` is not installed. Run scripts/test, which installs the test prerequisites \
         (scripts/install-deps: ibverbs-utils, libibverbs-dev, gcc, binutils)"
    );
}

/// Fails with the program's output unless it exited 0.
pub fn check_output(what: &str, out: Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The `softroce` binary, built once per test binary into the shim's preload target dir (its
/// own cargo target dir, so no lock is shared with the running `cargo test`; the shim's
/// dependencies are reused, and `softroce run` finds the `libsoftroce.so` beside it).
pub fn softroce_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let libs = shim_libs();
        let target = libs
            .preload
            .parent()
            .expect("shim output dir")
            .join("build-preload");
        let built = Command::new(env!("CARGO"))
            .args(["build", "-q", "-p", "softroce-daemon", "--bin", "softroce"])
            .arg("--manifest-path")
            .arg(workspace_root().join("Cargo.toml"))
            .arg("--target-dir")
            .arg(&target)
            .output()
            .expect("run cargo build -p softroce-daemon");
        check_output("cargo build -p softroce-daemon", built);
        let bin = target.join("debug/softroce");
        assert!(bin.is_file(), "{} was not built", bin.display());
        bin
    })
}

/// A private `softroce daemon` on its own socket. Dropping it stops it (SIGTERM, then SIGKILL
/// if it does not exit), so a failing test never leaves a daemon behind.
pub struct Daemon {
    child: Option<Child>,
    pub socket: PathBuf,
    log: PathBuf,
    /// The network namespace the daemon (and the programs of [`Daemon::command`]) run in.
    netns: Option<OwnedFd>,
}

/// Makes `cmd` run in the network namespace `ns` (setns in the child, before exec: no
/// wrapper process between the test and the program, and nothing else preloaded).
fn enter_netns(cmd: &mut Command, ns: Option<&OwnedFd>) {
    if let Some(ns) = ns {
        let fd = ns.as_raw_fd();
        // SAFETY: setns(2) only, between fork and exec; the descriptor outlives the spawn.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
}

impl Daemon {
    /// Starts `softroce daemon --socket <scratch>/<name>/ctl.sock ARGS` and returns once the
    /// socket accepts connections.
    pub fn start(name: &str, args: &[&str]) -> Daemon {
        Daemon::start_in(name, None, args)
    }

    /// [`Daemon::start`] inside the named network namespace `netns` (`ip netns add`), whose
    /// programs run there too.
    pub fn start_in(name: &str, netns: Option<&str>, args: &[&str]) -> Daemon {
        Daemon::start_wrapped(name, netns, &[], args)
    }

    /// [`Daemon::start_in`] through a `wrapper` command (`setpriv ...`), which runs the
    /// daemon with its arguments.
    pub fn start_wrapped(
        name: &str,
        netns: Option<&str>,
        wrapper: &[&str],
        args: &[&str],
    ) -> Daemon {
        let dir = scratch_root().join("daemons").join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("daemon scratch dir");
        let socket = dir.join("ctl.sock");
        let log = dir.join("daemon.log");
        // These daemons serve the control plane to one test each and run side by side: unless
        // the test picks a port, let each bind ephemeral UDP ports instead of 4791.
        let port: &[&str] = if args.contains(&"--port") {
            &[]
        } else {
            &["--port", "0"]
        };
        let netns = netns.map(|n| {
            OwnedFd::from(
                std::fs::File::open(format!("/run/netns/{n}"))
                    .unwrap_or_else(|e| panic!("network namespace {n}: {e}")),
            )
        });
        let mut cmd = match wrapper.split_first() {
            Some((program, wrapper_args)) => {
                let mut c = Command::new(program);
                c.args(wrapper_args).arg(softroce_bin());
                c
            }
            None => Command::new(softroce_bin()),
        };
        enter_netns(&mut cmd, netns.as_ref());
        let child = cmd
            .arg("daemon")
            .arg("--socket")
            .arg(&socket)
            .args(port)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("daemon log"))
            .spawn()
            .expect("start softroce daemon");
        let mut d = Daemon {
            child: Some(child),
            socket,
            log,
            netns,
        };
        d.wait_until_serving();
        d
    }

    /// The daemon binds before it listens, so the socket file alone does not mean it serves:
    /// wait until a connection is accepted (or the daemon exits, which fails the test).
    fn wait_until_serving(&mut self) {
        use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("softroce daemon exited ({status}):\n{}", self.log());
            }
            let fd = socket(
                AddressFamily::Unix,
                SockType::SeqPacket,
                SockFlag::SOCK_CLOEXEC,
                None,
            )
            .expect("socket");
            if let Ok(addr) = UnixAddr::new(&self.socket) {
                if connect(fd.as_raw_fd(), &addr).is_ok() {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "softroce daemon never served {}:\n{}",
                self.socket.display(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(-1)
    }

    /// What the daemon logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `signal` and waits for the daemon to exit; returns its exit status.
    pub fn stop_with(&mut self, signal: libc::c_int) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return child.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The daemon's own answer to `QueryDevices`, straight from the control protocol: the
    /// truth the shim's view is compared with.
    pub fn query_devices(&self) -> Vec<DeviceInfo> {
        match daemon_request(&self.socket, "shim-e2e", &Request::QueryDevices) {
            Some(Response::Devices(d)) => d,
            other => panic!("QueryDevices answered {other:?}"),
        }
    }

    /// A command for `program` with the shim preloaded and pointed at this daemon.
    pub fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new(program);
        enter_netns(&mut cmd, self.netns.as_ref());
        cmd.env("LD_PRELOAD", &shim_libs().preload)
            .env("SOFTROCE_SOCKET", &self.socket);
        cmd
    }

    /// Runs `program args` with the shim preloaded against this daemon; returns its stdout
    /// (asserting success).
    pub fn run_preloaded(&self, program: &Path, args: &[&str]) -> String {
        let out = self
            .command(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", program.display()));
        check_output(
            &format!("LD_PRELOAD=libsoftroce.so {}", program.display()),
            out,
        )
    }
}

/// One request to the daemon at control socket `path`, after the hello (as `program`); None
/// if it cannot be reached or does not answer.
pub fn daemon_request(path: &Path, program: &str, req: &Request) -> Option<Response> {
    use nix::sys::socket::{
        connect, recv, send, socket, AddressFamily, MsgFlags, SockFlag, SockType, UnixAddr,
    };
    let fd = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .ok()?;
    connect(fd.as_raw_fd(), &UnixAddr::new(path).ok()?).ok()?;
    let mut buf = vec![0u8; ctl::MAX_MESSAGE];
    let mut ask = |req: &Request| -> Option<Response> {
        send(fd.as_raw_fd(), &ctl::encode(req).ok()?, MsgFlags::empty()).ok()?;
        let n = recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()).ok()?;
        ctl::decode(&buf[..n]).ok()
    };
    let hello = ask(&Request::Hello {
        version: ctl::PROTOCOL_VERSION,
        program: program.into(),
    })?;
    matches!(hello, Response::Hello { .. }).then_some(())?;
    ask(req)
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop_with(libc::SIGTERM);
    }
}

/// Compiles a C test program against the system headers; `libs` are extra `-l` flags. Each
/// test process builds its own copy: two tests of one binary compiling the same program side
/// by side (nextest runs each in a process of its own) had one run the file while the other's
/// `cc` was writing it, and fail with ETXTBSY ("Text file busy"). The directories are left
/// in the scratch tree with the rest of the tests' files.
pub fn compile_c(name: &str, source: &str, libs: &[&str]) -> PathBuf {
    let cc = require_program("cc");
    assert!(
        Path::new("/usr/include/infiniband/verbs.h").is_file(),
        "<infiniband/verbs.h> is missing: run scripts/test (installs libibverbs-dev)"
    );
    // A directory per process: the program keeps its name, which tests look for (`comm`).
    let dir = scratch_root()
        .join("shim-c")
        .join(std::process::id().to_string());
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    let src = dir.join(format!("{name}.c"));
    let exe = dir.join(name);
    std::fs::write(&src, source).expect("write C source");
    let out = Command::new(cc)
        .args(["-std=gnu11", "-Wall", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(libs.iter().map(|l| format!("-l{l}")))
        .output()
        .expect("run cc");
    check_output(&format!("cc {name}.c"), out);
    exe
}
