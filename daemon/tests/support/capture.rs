//! tcpdump captures of RoCE v2 traffic for the daemon's integration tests, checked by
//! `softroce pcap check` and by the independent oracle, and network namespaces to capture in.

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A network namespace of its own, removed on drop, whose loopback segments every UDP GSO
/// send in software before the capture point (`gso_max_segs 1`, like a NIC without UDP
/// segmentation offload). On the host's loopback tcpdump would see each GSO send as one
/// oversized datagram, since lo defers segmentation until delivery; here it sees the packets
/// as a wire would carry them.
pub struct Netns(pub String);

impl Netns {
    pub fn new(name: &str) -> Netns {
        let name = format!("{name}-{}", std::process::id());
        let ip = |args: &[&str]| {
            let st = Command::new("ip").args(args).status().unwrap();
            assert!(st.success(), "ip {args:?}");
        };
        let _ = Command::new("ip").args(["netns", "del", &name]).status();
        ip(&["netns", "add", &name]);
        ip(&["-n", &name, "link", "set", "dev", "lo", "up"]);
        ip(&["-n", &name, "link", "set", "dev", "lo", "gso_max_segs", "1"]);
        Netns(name)
    }

    /// The command prefix that runs a program inside.
    pub fn exec(&self) -> [&str; 4] {
        ["ip", "netns", "exec", &self.0]
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// A tcpdump capture on `lo` (of a namespace, or the host's); a failing test never leaves
/// tcpdump running.
pub struct Capture {
    tcpdump: Child,
    pcap: PathBuf,
}

impl Capture {
    /// Starts capturing `udp port 4791 and FILTER` into `<tmp>/<suite>/<name>.pcap` and
    /// returns once tcpdump says the capture is live.
    pub fn start(ns: Option<&Netns>, suite: &str, name: &str, filter: &str) -> Capture {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(suite);
        std::fs::create_dir_all(&dir).unwrap();
        let pcap = dir.join(format!("{name}.pcap"));
        let _ = std::fs::remove_file(&pcap);
        let errlog = dir.join(format!("{name}.tcpdump.err"));
        let mut cmd = match ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &ns.0, "tcpdump"]);
                c
            }
            None => Command::new("tcpdump"),
        };
        let tcpdump = cmd
            .args([
                "-i",
                "lo",
                "-B",
                "32768",
                "--immediate-mode",
                "-U",
                "-s",
                "0",
                "-Z",
                "root",
                "-w",
            ])
            .arg(&pcap)
            .arg(format!("udp port 4791 and {filter}"))
            .stdout(Stdio::null())
            .stderr(File::create(&errlog).unwrap())
            .spawn();
        let mut tcpdump = match tcpdump {
            Ok(t) => t,
            Err(e) => panic!("tcpdump is needed (scripts/install-deps installs it): {e}"),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(&errlog)
            .unwrap_or_default()
            .contains("listening on")
        {
            if let Ok(Some(status)) = tcpdump.try_wait() {
                panic!(
                    "tcpdump exited with {status}: {}",
                    std::fs::read_to_string(&errlog).unwrap_or_default()
                );
            }
            assert!(Instant::now() < deadline, "tcpdump did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Capture { tcpdump, pcap }
    }

    /// Stops the capture and runs both checkers on it; returns `softroce pcap check -v`'s
    /// output, after asserting that every packet verified.
    pub fn stop_and_check(mut self) -> String {
        std::thread::sleep(Duration::from_millis(300));
        self.stop();
        let ours = Command::new(env!("CARGO_BIN_EXE_softroce"))
            .args(["pcap", "check", "-v"])
            .arg(&self.pcap)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&ours.stdout).into_owned();
        assert!(ours.status.success(), "{text}");
        assert!(text.contains("bad 0"), "{text}");
        let oracle = Command::new("python3")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/tools/roce-pcap-check"))
            .arg(&self.pcap)
            .output()
            .unwrap();
        let otext = String::from_utf8_lossy(&oracle.stdout);
        assert!(oracle.status.success(), "{otext}");
        assert!(otext.contains("icrc_bad=0"), "{otext}");
        text
    }

    fn stop(&mut self) {
        let _ = kill(Pid::from_raw(self.tcpdump.id() as i32), Signal::SIGINT);
        let _ = self.tcpdump.wait();
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.stop();
    }
}
