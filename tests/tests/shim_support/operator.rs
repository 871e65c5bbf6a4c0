//! Helpers of the operator tests (`softroce link|stat|res|capture|fault|doctor` against a
//! private daemon): the command run against a daemon, its JSON, a device's counters, and
//! unmodified program pairs on a named device and address.

use super::programs::{scratch, tcp_listening, Logged};
use super::{require_program, softroce_bin, Daemon};
use std::collections::BTreeMap;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// `softroce ARGS` against `daemon` (through $SOFTROCE_SOCKET).
pub fn softroce(daemon: &Daemon, args: &[&str]) -> Output {
    Command::new(softroce_bin())
        .args(args)
        .env("SOFTROCE_SOCKET", &daemon.socket)
        .output()
        .expect("run softroce")
}

/// `softroce ARGS`, which must exit 0; its stdout.
pub fn softroce_ok(daemon: &Daemon, args: &[&str]) -> String {
    let out = softroce(daemon, args);
    assert!(
        out.status.success(),
        "softroce {args:?} failed ({}):\n{}{}\n--- daemon\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        daemon.log()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `softroce ARGS -j`, parsed.
pub fn softroce_json(daemon: &Daemon, args: &[&str]) -> serde_json::Value {
    let mut all = args.to_vec();
    all.push("-j");
    let text = softroce_ok(daemon, &all);
    serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("softroce {all:?} printed no JSON ({e}):\n{text}"))
}

/// A device's counters by name (`softroce stat NAME -j`): the transport's, and the packet
/// I/O's as `net.NAME`.
pub fn counters(daemon: &Daemon, device: &str) -> BTreeMap<String, u64> {
    let v = softroce_json(daemon, &["stat", device]);
    let d = &v.as_array().expect("an array")[0];
    let mut out = BTreeMap::new();
    for (k, v) in d.as_object().expect("an object") {
        if let Some(n) = v.as_u64() {
            out.insert(k.clone(), n);
        }
    }
    for (k, v) in d["net"].as_object().expect("net counters") {
        out.insert(format!("net.{k}"), v.as_u64().unwrap_or(0));
    }
    out
}

/// `after[name] - before[name]`.
pub fn delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>, name: &str) -> u64 {
    let b = before.get(name).copied().unwrap_or(0);
    let a = after
        .get(name)
        .copied()
        .unwrap_or_else(|| panic!("no counter {name} in {after:?}"));
    a - b
}

/// A server and a client of an unmodified program on device `device` (`-d`, `-g 0`), the
/// client reaching the server's TCP side at 127.0.0.1 and its RoCE side through GID 0.
pub struct ProgramPair {
    pub server: Logged,
    pub client: Logged,
    pub label: String,
}

impl ProgramPair {
    /// Starts the server on `sd` and, once it listens on `port`, the client on `cd`.
    /// `gid_args` name the device and GID (`-d srxe0 -g 0` for the pingpongs, `-d srxe0 -x 0`
    /// for perftest).
    pub fn start(
        sd: &Daemon,
        cd: &Daemon,
        program: &str,
        port: u16,
        args: &[&str],
        name: &str,
    ) -> ProgramPair {
        ProgramPair::start_with_env(sd, cd, program, port, args, name, &[])
    }

    /// [`ProgramPair::start`] with `env` set in both programs' environment.
    pub fn start_with_env(
        sd: &Daemon,
        cd: &Daemon,
        program: &str,
        port: u16,
        args: &[&str],
        name: &str,
        env: &[(&str, &str)],
    ) -> ProgramPair {
        let dir = scratch("operator", name);
        let path = require_program(program);
        let mut cmd = sd.command(&path);
        cmd.args(["-p", &port.to_string()])
            .args(args)
            .envs(env.iter().copied());
        let mut server = Logged::spawn(cmd, dir.join("server.log"));
        let deadline = Instant::now() + Duration::from_secs(30);
        while !tcp_listening(port) {
            if let Some(status) = server.wait_for(Duration::ZERO) {
                panic!(
                    "{program} server exited ({status}):\n{}\n--- daemon\n{}",
                    server.output(),
                    sd.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{program} server never listened:\n{}",
                server.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut cmd = cd.command(&path);
        cmd.args(["-p", &port.to_string()])
            .args(args)
            .arg("127.0.0.1")
            .envs(env.iter().copied());
        let client = Logged::spawn(cmd, dir.join("client.log"));
        ProgramPair {
            server,
            client,
            label: format!("{program} {args:?}"),
        }
    }

    /// Waits for both (at most `limit`); returns (server status ok, client status ok, report).
    pub fn finish(mut self, limit: Duration) -> (bool, bool, String) {
        let c = self.client.wait_for(limit);
        let s = self.server.wait_for(if c.is_some() {
            Duration::from_secs(20)
        } else {
            Duration::ZERO
        });
        let report = format!(
            "{}\n--- server ({s:?})\n{}\n--- client ({c:?})\n{}",
            self.label,
            self.server.output(),
            self.client.output()
        );
        (
            s.is_some_and(|s| s.success()),
            c.is_some_and(|c| c.success()),
            report,
        )
    }

    /// Both must exit 0.
    pub fn succeed(self, limit: Duration, daemon: &Daemon) -> String {
        let (s, c, report) = self.finish(limit);
        assert!(s && c, "{report}\n--- daemon\n{}", daemon.log());
        report
    }
}
