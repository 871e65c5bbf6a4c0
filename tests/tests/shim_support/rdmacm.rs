//! Running unmodified librdmacm programs (rdmacm-utils, perftest `-R`) in pairs under the
//! shim: a server and a client, each pointed at a daemon, both bounded in time (killed with a
//! clear failure after [`LIMIT`]), their output kept for the assertions.

use super::programs::{scratch, Logged};
use super::{require_program, Daemon};
use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long any one program may run before the test fails.
pub const LIMIT: Duration = Duration::from_secs(60);

/// One finished program.
pub struct Finished {
    pub status: ExitStatus,
    pub output: String,
}

impl Finished {
    pub fn ok(&self) -> bool {
        self.status.success()
    }

    /// Fails the test unless the program succeeded, with its output and `daemon`'s log.
    pub fn assert_ok(&self, what: &str, daemon: &Daemon) {
        assert!(
            self.ok(),
            "{what} failed ({}):\n{}\n--- daemon\n{}",
            self.status,
            self.output,
            daemon.log()
        );
    }
}

/// A started program of a pair.
pub struct Side<'a> {
    pub name: String,
    pub logged: Logged,
    pub daemon: &'a Daemon,
}

/// Starts `program args` under the shim against `daemon`; its output goes to a log file in
/// the test's scratch directory.
pub fn start<'a>(
    daemon: &'a Daemon,
    test: &str,
    role: &str,
    program: &str,
    args: &[&str],
) -> Side<'a> {
    start_exe(daemon, test, role, &require_program(program), args)
}

/// [`start`] for a program given by path (a compiled test program).
pub fn start_exe<'a>(
    daemon: &'a Daemon,
    test: &str,
    role: &str,
    exe: &std::path::Path,
    args: &[&str],
) -> Side<'a> {
    spawn(
        daemon,
        test,
        role,
        daemon.command(exe),
        &exe.display().to_string(),
        args,
    )
}

/// [`start`] with the replacement `librdmacm.so.1`/`libibverbs.so.1` found through
/// `LD_LIBRARY_PATH` instead of the preloaded shim.
pub fn start_replacement<'a>(
    daemon: &'a Daemon,
    test: &str,
    role: &str,
    program: &str,
    args: &[&str],
) -> Side<'a> {
    let mut cmd = Command::new(require_program(program));
    cmd.env("LD_LIBRARY_PATH", &super::shim_libs().replacement_dir)
        .env("SOFTROCE_SOCKET", &daemon.socket);
    spawn(daemon, test, role, cmd, program, args)
}

fn spawn<'a>(
    daemon: &'a Daemon,
    test: &str,
    role: &str,
    mut cmd: Command,
    program: &str,
    args: &[&str],
) -> Side<'a> {
    cmd.args(args);
    let dir = scratch("rdmacm", test);
    Side {
        name: format!("{role}: {program} {}", args.join(" ")),
        logged: Logged::spawn_split(
            cmd,
            dir.join(format!("{role}.out")),
            dir.join(format!("{role}.err")),
        ),
        daemon,
    }
}

impl Side<'_> {
    /// Waits for the program (at most [`LIMIT`] from `since`), failing the test with both
    /// the program's and its daemon's logs if it does not end.
    pub fn finish(mut self, since: Instant) -> Finished {
        match self.logged.wait_until(since + LIMIT) {
            Some(status) => Finished {
                status,
                output: self.logged.output(),
            },
            None => {
                self.logged.kill();
                panic!(
                    "{} did not finish within {LIMIT:?}; killed.\n--- output\n{}\n--- daemon\n{}",
                    self.name,
                    self.logged.output(),
                    self.daemon.log()
                );
            }
        }
    }

    /// Whether the program is still running (a server must be, before its client starts).
    pub fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.logged.child.try_wait() {
            panic!(
                "{} exited early ({status}):\n{}\n--- daemon\n{}",
                self.name,
                self.logged.output(),
                self.daemon.log()
            );
        }
    }
}

/// Waits until the server's output contains `marker` (it is listening), or fails.
pub fn wait_for_output(side: &mut Side<'_>, marker: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    while !side.logged.output().contains(marker) {
        side.assert_running();
        assert!(
            Instant::now() < deadline,
            "{} never printed {marker:?}:\n{}",
            side.name,
            side.logged.output()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs a server and then a client; the client is started after `server_ready` (a short
/// pause for programs that print nothing when listening) and re-run while it is refused
/// because the server is not listening yet (REJECTED: no such service), at most until
/// [`LIMIT`].
pub fn run_pair(
    test: &str,
    server: (&Daemon, &str, &[&str]),
    client: (&Daemon, &str, &[&str]),
    refused_markers: &[&str],
) -> (Finished, Finished) {
    let since = Instant::now();
    let mut s = start(server.0, test, "server", server.1, server.2);
    std::thread::sleep(Duration::from_millis(300));
    let mut attempt = 0;
    let c = loop {
        s.assert_running();
        attempt += 1;
        let role = format!("client{attempt}");
        let c = start(client.0, test, &role, client.1, client.2).finish(since);
        let refused = !c.ok() && refused_markers.iter().any(|m| c.output.contains(m));
        if !refused || Instant::now() > since + LIMIT / 2 {
            break c;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let s = s.finish(since);
    (s, c)
}

/// The `-v` data lines of rping, without the "server " prefix the server adds.
pub fn rping_data(output: &str) -> Vec<String> {
    output
        .lines()
        .filter_map(|l| {
            let l = l.trim_start_matches("server ");
            l.starts_with("ping data: ").then(|| l.to_owned())
        })
        .collect()
}

/// The line rping's `-v` prints for ping `i` with the default 64-byte buffer (rping.c: the
/// text "rdma-ping-%d: ", then characters from `start` = 'A' + i mod 58 counting up and
/// wrapping from 'z' back to 'A', up to `size - 1` bytes).
pub fn rping_expected(i: usize) -> String {
    let size = 64;
    let mut s = format!("rdma-ping-{i}: ");
    let mut c = 65 + (i % 58) as u8;
    while s.len() < size - 1 {
        s.push(c as char);
        c += 1;
        if c > 122 {
            c = 65;
        }
    }
    format!("ping data: {s}")
}

/// A tcpdump capture of loopback UDP 4791 traffic matching a filter, stopped by [`Capture::check`].
pub struct Capture {
    child: Child,
    pub pcap: PathBuf,
}

impl Capture {
    pub fn start(name: &str, filter: &str) -> Capture {
        let dir = scratch("rdmacm", name);
        let pcap = dir.join("capture.pcap");
        let _ = std::fs::remove_file(&pcap);
        let errlog = dir.join("tcpdump.err");
        let mut child = Command::new(require_program("tcpdump"))
            .args([
                "-i",
                "lo",
                "--immediate-mode",
                "-U",
                // A 16 MiB capture buffer: bursts on loopback while the CPUs are busy would
                // otherwise be dropped by the kernel before tcpdump reads them.
                "-B",
                "16384",
                "-s",
                "0",
                "-Z",
                "root",
                "-w",
            ])
            .arg(&pcap)
            .arg(filter)
            .stdout(Stdio::null())
            .stderr(File::create(&errlog).expect("tcpdump log"))
            .spawn()
            .expect("start tcpdump (scripts/install-deps installs it)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(&errlog)
            .unwrap_or_default()
            .contains("listening on")
        {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "tcpdump exited with {status}: {}",
                    std::fs::read_to_string(&errlog).unwrap_or_default()
                );
            }
            assert!(Instant::now() < deadline, "tcpdump did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Capture { child, pcap }
    }

    /// Stops the capture (SIGINT, so the file is complete) and runs `softroce pcap check -v`
    /// and the independent `roce-pcap-check` on it; both must find no bad packet. Returns
    /// softroce's decoding.
    pub fn check(mut self) -> String {
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
        let _ = self.child.wait();
        let ours = Command::new(super::softroce_bin())
            .args(["pcap", "check", "-v"])
            .arg(&self.pcap)
            .output()
            .expect("run softroce pcap check");
        let text = String::from_utf8_lossy(&ours.stdout).into_owned();
        assert!(ours.status.success(), "softroce pcap check:\n{text}");
        assert!(text.contains("bad 0"), "{text}");
        let oracle = Command::new(require_program("python3"))
            .arg(super::workspace_root().join("../shared/tools/roce-pcap-check"))
            .arg(&self.pcap)
            .output()
            .expect("run roce-pcap-check");
        let otext = String::from_utf8_lossy(&oracle.stdout);
        assert!(oracle.status.success(), "roce-pcap-check:\n{otext}");
        assert!(otext.contains("icrc_bad=0"), "{otext}");
        text
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
