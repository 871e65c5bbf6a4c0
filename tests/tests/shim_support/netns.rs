//! Network namespaces a test creates for the L2 (`--tap`) device: a named namespace with a
//! Linux bridge and persistent TAP interfaces on it, programs and daemons started inside it
//! (`setns` in the child before `exec`, so no wrapper process sits between the test and the
//! program), and a capture on the bridge. Everything is deleted when the value is dropped.
//!
//! Creating namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN): a test that cannot
//! fails with a message saying so, it never passes silently.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether process `pid` (inside the namespace) sees something listening on TCP `port`.
pub fn listening(pid: u32, port: u16) -> bool {
    super::programs::tcp_listening_in(&format!("/proc/{pid}/net"), port)
}

/// A named network namespace, deleted on drop.
pub struct Netns {
    pub name: String,
    file: File,
}

/// Runs `ip ARGS`, failing the test with its output if it fails.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("run ip (iproute2)");
    assert!(
        out.status.success(),
        "ip {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Netns {
    /// Creates namespace `sr-<tag>-<pid>` with its loopback up.
    pub fn new(tag: &str) -> Netns {
        assert!(
            nix::unistd::geteuid().is_root(),
            "the L2 device tests create network namespaces, bridges and TAP interfaces: run \
             them as root (scripts/test in CI; `sudo unshare --net` locally)"
        );
        let name = format!("sr-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "delete", &name]).output();
        ip(&["netns", "add", &name]);
        let file = File::open(format!("/run/netns/{name}")).expect("open the namespace");
        let ns = Netns { name, file };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// The namespace's descriptor (for setns).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.file.as_fd()
    }

    /// `ip -n NS ARGS`.
    pub fn ip(&self, args: &[&str]) {
        let mut all = vec!["-n", &self.name];
        all.extend_from_slice(args);
        ip(&all);
    }

    /// Writes a sysctl inside the namespace (`/proc/sys` shows the caller's namespace, so
    /// through a child that joined it).
    pub fn sysctl(&self, key: &str, value: &str) {
        let out = self
            .command(Path::new("/usr/sbin/sysctl"))
            .args(["-qw", &format!("{key}={value}")])
            .output()
            .expect("run sysctl");
        assert!(
            out.status.success(),
            "sysctl {key}={value}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A bridge `br` with a persistent TAP interface per name in `taps`, all up, MTU `mtu`.
    /// IPv6 is off on the bridge and the TAPs (the kernel's own router solicitations and
    /// MLD reports would otherwise appear in captures; the daemons behind the TAPs run
    /// their own IPv6). `bridge_addr` gives the bridge itself an address (the host side).
    pub fn bridge(&self, br: &str, taps: &[&str], mtu: u32, bridge_addr: &[&str]) {
        let mtu = mtu.to_string();
        self.ip(&["link", "add", br, "type", "bridge"]);
        // Forward at once (no STP listening delay), and no multicast snooping: the bridge
        // would send IGMP reports of its own into captures.
        self.ip(&["link", "set", br, "type", "bridge", "forward_delay", "0"]);
        self.ip(&["link", "set", br, "type", "bridge", "mcast_snooping", "0"]);
        self.sysctl(&format!("net.ipv6.conf.{br}.disable_ipv6"), "1");
        for t in taps {
            self.ip(&["tuntap", "add", "dev", t, "mode", "tap"]);
            self.sysctl(&format!("net.ipv6.conf.{t}.disable_ipv6"), "1");
            self.ip(&["link", "set", t, "mtu", &mtu]);
            self.ip(&["link", "set", t, "master", br]);
            self.ip(&["link", "set", t, "up"]);
        }
        self.ip(&["link", "set", br, "mtu", &mtu]);
        for a in bridge_addr {
            if a.contains(':') {
                self.sysctl(&format!("net.ipv6.conf.{br}.disable_ipv6"), "0");
                self.ip(&["addr", "add", a, "dev", br, "nodad"]);
            } else {
                self.ip(&["addr", "add", a, "dev", br]);
            }
        }
        self.ip(&["link", "set", br, "up"]);
    }

    /// A command for `program` that runs inside the namespace.
    pub fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new(program);
        let fd = self.file.as_raw_fd();
        // SAFETY: setns(2) only, between fork and exec; the descriptor outlives the spawn.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd
    }

    /// Starts `tcpdump -i IFACE -w FILE` inside the namespace and waits until it captures.
    pub fn capture(&self, iface: &str, file: &Path) -> Capture {
        let tcpdump = super::require_program("tcpdump");
        let log = file.with_extension("tcpdump.log");
        let mut child = self
            .command(&tcpdump)
            // A 64 MiB ring: a bandwidth test's burst must not overflow it (tcpdump reports
            // drops on exit, and `Capture::stop` fails on any).
            .args(["-i", iface, "-U", "-B", "65536", "-s", "0", "-w"])
            .arg(file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).expect("tcpdump log"))
            .spawn()
            .expect("start tcpdump");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("listening on")
        {
            if let Ok(Some(s)) = child.try_wait() {
                panic!(
                    "tcpdump exited ({s}): {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            assert!(Instant::now() < deadline, "tcpdump never started");
            std::thread::sleep(Duration::from_millis(20));
        }
        Capture {
            child: Some(child),
            file: file.to_path_buf(),
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.name])
            .output();
    }
}

/// A running capture; [`Capture::stop`] ends it and returns the file.
pub struct Capture {
    child: Option<Child>,
    pub file: PathBuf,
}

impl Capture {
    /// Stops tcpdump (SIGINT, so it flushes) and returns the capture file; fails the test
    /// if the kernel dropped any frame before tcpdump read it (the capture would not hold
    /// every frame).
    pub fn stop(mut self) -> PathBuf {
        self.end();
        let log =
            std::fs::read_to_string(self.file.with_extension("tcpdump.log")).unwrap_or_default();
        assert!(
            log.lines()
                .any(|l| l.trim() == "0 packets dropped by kernel"),
            "{}: the capture is incomplete:\n{log}",
            self.file.display()
        );
        self.file.clone()
    }

    fn end(&mut self) {
        if let Some(mut c) = self.child.take() {
            // Let the last frames reach the file first: libpcap hands frames over a ring
            // block at a time, a partly filled block after its timeout (1 s).
            std::thread::sleep(Duration::from_millis(1500));
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGINT) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while c.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    let _ = c.kill();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.wait();
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.end();
    }
}

/// Two network namespaces joined by a veth pair (`mc6a`, `mc6b`), each end with an address
/// (IPv6 /64 without DAD, so usable at once, or IPv4 /24): two hosts of one link. Deleted when
/// dropped.
pub struct TwoHosts {
    pub names: [String; 2],
}

impl TwoHosts {
    pub fn new(tag: &str, addrs: [&str; 2]) -> TwoHosts {
        let id = std::process::id();
        let names = [
            format!("hclient-{id}-{tag}-a"),
            format!("hclient-{id}-{tag}-b"),
        ];
        let hosts = TwoHosts { names };
        let [a, b] = &hosts.names;
        ip(&["netns", "add", a]);
        ip(&["netns", "add", b]);
        ip(&[
            "link", "add", "mc6a", "netns", a, "type", "veth", "peer", "name", "mc6b", "netns", b,
        ]);
        for (ns, dev, addr) in [(a, "mc6a", addrs[0]), (b, "mc6b", addrs[1])] {
            ip(&["-n", ns, "link", "set", "lo", "up"]);
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{addr}/{}", if addr.contains(':') { 64 } else { 24 }),
                "dev",
                dev,
                "nodad",
            ]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
        }
        hosts
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}
