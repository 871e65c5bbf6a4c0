//! Running pairs of unmodified programs (pingpongs, perftest) against private daemons: a
//! daemon on its own loopback address, programs whose output goes to a log file and that are
//! killed if a test ends early, and the /proc/net check that a server listens.

use super::Daemon;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// `rping -c -a ADDR -C 1 -v` and `extra` on daemon `d`, started now: a client expected to
/// fail (see [`assert_fails_saying`]), logged to `log`.
pub fn rping_client(d: &Daemon, addr: &str, extra: &[&str], log: PathBuf) -> Logged {
    let mut cmd = d.command(&super::require_program("rping"));
    cmd.args(["-c", "-a", addr, "-C", "1", "-v"]).args(extra);
    Logged::spawn(cmd, log)
}

/// Waits (30 s at most) for a program that must fail, and checks that it exited non-zero
/// and printed `says`; `what` names it, `d` is its daemon (its log goes into the failure).
pub fn assert_fails_saying(c: &mut Logged, what: &str, says: &str, d: &Daemon) {
    let status = c.wait_for(Duration::from_secs(30));
    let out = c.output();
    assert!(
        status.is_some_and(|s| !s.success()),
        "{what}: {status:?}\n{out}"
    );
    assert!(out.contains(says), "{what}: {out}\n--- daemon\n{}", d.log());
}

/// A daemon serving srxe0 on `127.0.0.nn`, UDP port 4791 (each test picks its own `nn`).
pub fn loopback_daemon(name: &str, nn: u8) -> Daemon {
    let addr = format!("127.0.0.{nn}");
    Daemon::start(name, &["--addr", &addr, "--port", "4791"])
}

/// A loopback daemon whose RC QPs recover from loss as kernel rxe does (go-back-N), for tests
/// that read rxe's counters (`rcvd_seq_err`, `completer_retry_err`, ...) after injected
/// faults: between two softroce devices the default is selective retransmission, which
/// repairs the same faults under its own counters (`sel_retransmits`, `sack_sent`;
/// tests/tests/loss_recovery.rs covers it).
#[allow(dead_code)]
pub fn gbn_loopback_daemon(name: &str, nn: u8) -> Daemon {
    let addr = format!("127.0.0.{nn}");
    Daemon::start(
        name,
        &["--addr", &addr, "--port", "4791", "--loss-recovery", "gbn"],
    )
}

/// A loopback daemon whose traffic a capture on the host's `lo` is to check: without UDP GSO,
/// since lo shows each GSO send as one oversized datagram rather than the packets in it.
#[allow(dead_code)]
pub fn captured_loopback_daemon(name: &str, nn: u8) -> Daemon {
    let addr = format!("127.0.0.{nn}");
    Daemon::start(name, &["--addr", &addr, "--port", "4791", "--no-gso"])
}

/// A running program whose stdout and stderr go to a file (or one file each). Dropping it
/// kills the program.
pub struct Logged {
    pub child: Child,
    log: PathBuf,
    /// stderr's own file, when kept apart from stdout.
    err_log: Option<PathBuf>,
}

impl Logged {
    pub fn spawn(mut cmd: Command, log: PathBuf) -> Logged {
        let out = File::create(&log).expect("create log");
        let err = out.try_clone().expect("dup log");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn the program");
        Logged {
            child,
            log,
            err_log: None,
        }
    }

    /// stdout and stderr in separate files (rping's cm thread writes to stderr while its
    /// data lines sit in the stdout buffer: one file would interleave them mid-line).
    pub fn spawn_split(mut cmd: Command, out: PathBuf, err: PathBuf) -> Logged {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(File::create(&out).expect("create stdout log"))
            .stderr(File::create(&err).expect("create stderr log"))
            .spawn()
            .expect("spawn the program");
        Logged {
            child,
            log: out,
            err_log: Some(err),
        }
    }

    /// The log; for a split one, stdout then stderr.
    pub fn output(&self) -> String {
        let out = std::fs::read_to_string(&self.log).unwrap_or_default();
        let err = self
            .err_log
            .as_ref()
            .and_then(|e| std::fs::read_to_string(e).ok())
            .unwrap_or_default();
        if err.is_empty() {
            out
        } else {
            format!("{out}\n{err}")
        }
    }

    /// Waits until `deadline` at most for the program to exit.
    pub fn wait_until(&mut self, deadline: Instant) -> Option<ExitStatus> {
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits at most `limit` for the program to exit.
    pub fn wait_for(&mut self, limit: Duration) -> Option<ExitStatus> {
        self.wait_until(Instant::now() + limit)
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

/// A scratch directory `<target tmp>/<area>/<name>`.
pub fn scratch(area: &str, name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(area).join(name);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Starts a program's server (`cmd`, its output logged to `log`) and waits until it listens
/// on TCP `port`; fails the test if it exits first or does not listen within 30 s.
#[allow(dead_code)]
pub fn listening_server(daemon: &Daemon, cmd: Command, port: u16, log: PathBuf) -> Logged {
    let mut server = Logged::spawn(cmd, log);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !tcp_listening(port) {
        assert!(
            Instant::now() < deadline && server.wait_for(Duration::ZERO).is_none(),
            "server never listened on {port}:\n{}\n--- daemon\n{}",
            server.output(),
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    server
}

/// Whether something listens on TCP `port` (IPv4 or IPv6), from /proc/net: probing with a
/// connection would be taken by a pingpong or perftest server as its client.
pub fn tcp_listening(port: u16) -> bool {
    tcp_listening_in("/proc/net", port)
}

/// [`tcp_listening`] as the network namespace whose `/proc/.../net` directory is `net` sees it.
pub fn tcp_listening_in(net: &str, port: u16) -> bool {
    let needle = format!(":{port:04X} ");
    ["tcp", "tcp6"].iter().any(|f| {
        std::fs::read_to_string(format!("{net}/{f}"))
            .unwrap_or_default()
            .lines()
            .any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.get(1)
                    .is_some_and(|local| format!("{local} ").ends_with(&needle))
                    && cols.get(3) == Some(&"0A")
            })
    })
}
