//! `softroce daemon`, `softroce res show` and the control socket, driven as a user would.

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_softroce")
}

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("daemon")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Drop for Daemon {
    /// A failing test must not leave its daemon behind.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    fn start(socket: &Path, args: &[&str]) -> Daemon {
        // Port 0: these tests exercise the control plane, and run side by side.
        Daemon::start_on_port(socket, 0, args)
    }

    fn start_on_port(socket: &Path, port: u16, args: &[&str]) -> Daemon {
        let child = Command::new(bin())
            .arg("daemon")
            .arg("--socket")
            .arg(socket)
            .args(["--port", &port.to_string()])
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let d = Daemon {
            child,
            socket: socket.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            assert!(
                Instant::now() < deadline,
                "daemon did not create its socket"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    fn res_show(&self) -> String {
        let out = Command::new(bin())
            .args(["res", "show", "--socket"])
            .arg(&self.socket)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Sends `sig` and waits for a clean exit; returns the log.
    fn stop(mut self, sig: Signal) -> String {
        kill(Pid::from_raw(self.child.id() as i32), sig).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "daemon exited with {status}");
                break;
            }
            assert!(Instant::now() < deadline, "daemon did not stop on {sig}");
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut log = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut log)
            .unwrap();
        assert!(!self.socket.exists(), "socket left behind");
        log
    }
}

fn run(args: &[&str]) -> Output {
    Command::new(bin()).args(args).output().unwrap()
}

#[test]
fn default_daemon_serves_srxe0_and_stops_on_sigterm_and_sigint() {
    let dir = scratch("default");
    let d = Daemon::start(&dir.join("ctl.sock"), &[]);
    let shown = d.res_show();
    assert!(shown.starts_with("devices: srxe0\n"), "{shown}");
    let log = d.stop(Signal::SIGTERM);
    assert!(log.contains("device ready"), "{log}");
    assert!(log.contains("roce=v2"), "{log}");
    assert!(log.contains("127.0.0.1") && log.contains("::1"), "{log}");

    let d = Daemon::start(&dir.join("ctl.sock"), &[]);
    let log = d.stop(Signal::SIGINT);
    assert!(log.contains("stopped"));
}

/// The device sockets are SO_REUSEADDR, so that a daemon's `--netdev` device (the wildcard
/// address) and its devices of fixed addresses share port 4791: the same address bound twice
/// is still refused, by the daemon itself, naming the address and who to ask.
#[test]
fn a_second_daemon_on_the_same_address_and_port_is_refused() {
    let dir = scratch("same-address");
    let a = Daemon::start_on_port(&dir.join("a.sock"), 4791, &["--addr", "127.0.0.7"]);
    let mut b = Command::new(bin())
        .args([
            "daemon",
            "--addr",
            "127.0.0.7",
            "--port",
            "4791",
            "--socket",
        ])
        .arg(dir.join("b.sock"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = b.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = b.kill();
            let _ = b.wait();
            panic!("a second daemon on 127.0.0.7:4791 is running beside the first");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    b.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(!status.success(), "{err}");
    assert!(
        err.contains("bind 127.0.0.7:4791: address already bound by another program")
            && err.contains("softroce doctor --port 4791"),
        "{err}"
    );
    assert!(a.res_show().starts_with("devices: srxe0"));
    a.stop(Signal::SIGTERM);
}

#[test]
fn a_second_daemon_on_the_same_socket_is_refused_and_two_sockets_coexist() {
    let dir = scratch("two");
    let a = Daemon::start(&dir.join("a.sock"), &["--addr", "127.0.0.1"]);
    let out = run(&[
        "daemon",
        "--port",
        "0",
        "--socket",
        a.socket.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already serving"));
    // Run twice as it stands, the second would also find the first's UDP port taken: the
    // socket is what names the problem.
    let c = Daemon::start_on_port(&dir.join("c.sock"), 4799, &["--addr", "127.0.0.3"]);
    let out = run(&[
        "daemon",
        "--addr",
        "127.0.0.3",
        "--port",
        "4799",
        "--socket",
        c.socket.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("already serving"), "{err}");
    assert!(!err.contains("Address already in use"), "{err}");
    c.stop(Signal::SIGTERM);
    let b = Daemon::start(
        &dir.join("b.sock"),
        &["--name", "srxe1", "--addr", "127.0.0.2"],
    );
    assert!(a.res_show().starts_with("devices: srxe0"));
    assert!(b.res_show().starts_with("devices: srxe1"));
    b.stop(Signal::SIGTERM);
    a.stop(Signal::SIGTERM);
}

#[test]
fn config_file_and_bad_flags() {
    let dir = scratch("config");
    let cfg = dir.join("softroce.toml");
    std::fs::write(
        &cfg,
        "[[device]]\nname = \"alpha\"\naddr = [\"127.0.0.1\"]\n\n[[device]]\nname = \"beta\"\nnetdev = \"lo\"\nmtu = 1024\n",
    )
    .unwrap();
    let d = Daemon::start(&dir.join("ctl.sock"), &["--config", cfg.to_str().unwrap()]);
    assert!(d.res_show().starts_with("devices: alpha beta\n"));
    d.stop(Signal::SIGTERM);

    let sock = dir.join("bad.sock");
    for (args, why) in [
        (vec!["--mtu", "1500"], "MTU 1500"),
        (vec!["--roce", "v3"], "unknown RoCE mode"),
        // v1 on a UDP-socket device is refused, pointing to --tap.
        (vec!["--roce", "v1", "--addr", "127.0.0.1"], "add --tap TAP"),
        (vec!["--roce", "both", "--netdev", "lo"], "add --tap TAP"),
        (
            vec!["--tap", "srt0", "--netdev", "lo"],
            "exclude each other",
        ),
        (
            vec!["--tap", "srt0", "--mac", "01:00:5e:00:00:01"],
            "not a unicast address",
        ),
        (vec!["--netdev", "no-such-if0"], "no network interface"),
    ] {
        let mut all = vec!["daemon", "--port", "0", "--socket", sock.to_str().unwrap()];
        all.extend(args);
        let out = run(&all);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "expected {why:?} in {err}");
    }
    std::fs::write(&cfg, "[[device]]\nname = \"x\"\nunknown_key = 1\n").unwrap();
    let out = run(&[
        "daemon",
        "--socket",
        sock.to_str().unwrap(),
        "--config",
        cfg.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown field"));
}

#[test]
fn congestion_control_flags_and_what_res_show_reports() {
    let dir = scratch("cc");
    // The default: DCQCN with NVIDIA's parameters, the four mlx5 counters at 0.
    let d = Daemon::start(&dir.join("a.sock"), &["--addr", "127.0.0.1"]);
    let shown = d.res_show();
    assert!(
        shown.contains(
            "congestion control on srxe0: dcqcn; np_ecn_marked_roce_packets 0, np_cnp_sent 0, \
             rp_cnp_handled 0, rp_cnp_ignored 0"
        ),
        "{shown}"
    );
    d.stop(Signal::SIGTERM);
    let d = Daemon::start(
        &dir.join("b.sock"),
        &[
            "--addr",
            "127.0.0.1",
            "--cc",
            "none",
            "--cc-param",
            "rpg_time_reset=55",
            "--cc-param",
            "np_cnp_dscp=46",
        ],
    );
    assert!(d.res_show().contains("congestion control on srxe0: none;"));
    use proto::ctl::{self, Request, Response, PROTOCOL_VERSION};
    let c = raw_client(&d.socket);
    let hello = Request::Hello {
        version: PROTOCOL_VERSION,
        program: "cc-test".into(),
    };
    send(&c, &ctl::encode(&hello).unwrap());
    assert!(matches!(
        ctl::decode(&recv(&c)).unwrap(),
        Response::Hello { .. }
    ));
    send(&c, &ctl::encode(&Request::CongestionShow).unwrap());
    let Response::Congestion(devices) = ctl::decode(&recv(&c)).unwrap() else {
        panic!("not a congestion report");
    };
    assert_eq!((devices.len(), devices[0].algorithm.as_str()), (1, "none"));
    let p = |name: &str| devices[0].params.iter().find(|(n, _)| n == name).unwrap().1;
    assert_eq!(
        (p("rpg_time_reset"), p("cnp_dscp"), p("rpg_ai_rate")),
        (55, 46, 5)
    );
    d.stop(Signal::SIGTERM);

    let sock = dir.join("bad.sock");
    for (args, why) in [
        (vec!["--cc", "reno"], "unknown congestion control algorithm"),
        (
            vec!["--cc-param", "rpg_bogus=1"],
            "unknown congestion control parameter",
        ),
        (vec!["--cc-param", "cnp_dscp=99"], "is not a DSCP"),
        (vec!["--cc-param", "rpg_gd"], "NAME=VALUE"),
    ] {
        let mut all = vec!["daemon", "--port", "0", "--socket", sock.to_str().unwrap()];
        all.extend(args);
        let out = run(&all);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "expected {why:?} in {err}");
    }
}

/// A client speaking the control protocol directly, as the shim does.
fn raw_client(path: &Path) -> std::os::fd::OwnedFd {
    use nix::sys::socket::*;
    use std::os::fd::AsRawFd;
    let fd = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    connect(fd.as_raw_fd(), &UnixAddr::new(path).unwrap()).unwrap();
    fd
}

fn send(fd: &std::os::fd::OwnedFd, bytes: &[u8]) {
    use std::os::fd::AsRawFd;
    nix::sys::socket::send(fd.as_raw_fd(), bytes, nix::sys::socket::MsgFlags::empty()).unwrap();
}

fn recv(fd: &std::os::fd::OwnedFd) -> Vec<u8> {
    use std::os::fd::AsRawFd;
    let mut buf = vec![0u8; 65536];
    let n = nix::sys::socket::recv(
        fd.as_raw_fd(),
        &mut buf,
        nix::sys::socket::MsgFlags::empty(),
    )
    .unwrap();
    buf.truncate(n);
    buf
}

#[test]
fn clients_are_tracked_and_forgotten_when_they_go_and_garbage_is_refused() {
    use proto::ctl::{self, Request, Response, PROTOCOL_VERSION};
    let dir = scratch("clients");
    let d = Daemon::start(&dir.join("ctl.sock"), &[]);

    let c = raw_client(&d.socket);
    send(
        &c,
        &ctl::encode(&Request::Hello {
            version: PROTOCOL_VERSION,
            program: "pingpong-test".into(),
        })
        .unwrap(),
    );
    let Response::Hello { client, .. } = ctl::decode(&recv(&c)).unwrap() else {
        panic!("no hello")
    };
    send(&c, &ctl::encode(&Request::QueryDevices).unwrap());
    let Response::Devices(devs) = ctl::decode(&recv(&c)).unwrap() else {
        panic!("no devices")
    };
    assert_eq!(devs[0].name, "srxe0");
    assert_eq!(devs[0].gids.len(), 2);
    // Garbage after hello: an error answer, and the connection lives on.
    send(&c, &[0xff; 17]);
    assert!(matches!(
        ctl::decode(&recv(&c)).unwrap(),
        Response::Error { errno, .. } if errno == libc::EINVAL
    ));
    let shown = d.res_show();
    assert!(
        shown.lines().any(|l| l.contains("pingpong-test") && l.trim_start().starts_with(&client.to_string())),
        "{shown}"
    );
    drop(c);
    let deadline = Instant::now() + Duration::from_secs(1);
    while d.res_show().contains("pingpong-test") {
        assert!(
            Instant::now() < deadline,
            "client not forgotten within a second"
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    // A client whose first message is not hello, or speaks another version, is refused.
    let c = raw_client(&d.socket);
    send(&c, &ctl::encode(&Request::QueryDevices).unwrap());
    assert!(matches!(
        ctl::decode(&recv(&c)).unwrap(),
        Response::Error { .. }
    ));
    let c = raw_client(&d.socket);
    send(
        &c,
        &ctl::encode(&Request::Hello {
            version: PROTOCOL_VERSION + 1,
            program: "future".into(),
        })
        .unwrap(),
    );
    match ctl::decode(&recv(&c)).unwrap() {
        Response::Error { message, errno } => {
            assert_eq!(errno, libc::EPROTO);
            assert_eq!(
                message,
                ctl::version_mismatch(PROTOCOL_VERSION + 1, PROTOCOL_VERSION)
            );
            assert!(message.contains("restart the daemon"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let log = d.stop(Signal::SIGTERM);
    assert!(log.contains("client gone"));
}

#[test]
fn res_show_without_a_daemon_says_so() {
    let dir = scratch("nodaemon");
    let out = run(&[
        "res",
        "show",
        "--socket",
        dir.join("none.sock").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is `softroce daemon` running?"));
}
