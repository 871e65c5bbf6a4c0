//! An emulated network for the end-to-end tests: hosts in network namespaces the test creates,
//! each joined by a veth pair to a router namespace whose forwarding goes through
//! `netem-router` (a TUN device; src/bin/netem-router.rs), which is the bottleneck (rate,
//! FIFO, RED ECN marking, tail drop) and can drop, duplicate, delay and reorder. One
//! `softroce daemon` per host; real programs run on the hosts through the shim.
//!
//! ```text
//!  host 1  10.77.1.2 ──veth── r1 10.77.1.1 ┐
//!  host 2  10.77.2.2 ──veth── r2 10.77.2.1 ┤ router: everything that arrives on an r*
//!  ...                                      ├ is routed into tun0 (policy table 100);
//!  host 100 10.77.100.2 ─veth─ r100         ┘ netem-router writes it back, the main
//!                                             table forwards it on
//! ```
//!
//! Namespaces are named `srcc<pid>-<n>-...` (pid and a counter: unique per test), and
//! everything is torn down on drop, failing test or not: processes by their pid, then the
//! namespaces (which takes the veths and the TUN device with them).

#![allow(dead_code)]

use super::shim_support::{check_output, daemon_request, require_program};
use proto::ctl::{DeviceCongestion, Request, Response};
use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The receiver's host number (its address is 10.77.100.2).
pub const RECEIVER: u8 = 100;

/// How the router treats packets (netem-router's flags).
#[derive(Debug, Clone)]
pub struct RouterConfig {
    /// Bottleneck towards the receiver, Mbit/s (0: none).
    pub rate_mbps: u32,
    pub buffer: u64,
    /// RED: (min bytes, max bytes, max probability).
    pub red: Option<(u64, u64, f64)>,
    /// Extra netem-router flags (impairments).
    pub extra: Vec<String>,
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            rate_mbps: 0,
            buffer: 1 << 20,
            red: None,
            extra: Vec::new(),
        }
    }
}

pub struct Host {
    pub id: u8,
    pub ns: String,
    pub addr: Ipv4Addr,
    pub socket: PathBuf,
    daemon: Option<Child>,
}

pub struct Network {
    prefix: String,
    pub dir: PathBuf,
    router_ns: String,
    router: Option<Child>,
    pub hosts: Vec<Host>,
    /// Programs started on the hosts, stopped on drop.
    programs: Vec<Child>,
    namespaces: Vec<String>,
}

fn ip(args: &[&str]) {
    let out = Command::new(require_program("ip"))
        .args(args)
        .output()
        .expect("run ip");
    check_output(&format!("ip {}", args.join(" ")), out);
}

fn netns_exec(ns: &str, args: &[&str]) {
    let mut all = vec!["netns", "exec", ns];
    all.extend_from_slice(args);
    ip(&all);
}

/// The `softroce` binary, the shim and netem-router, release builds: five daemons, eight
/// perftest programs and the router share two CPUs here, and a debug daemon that falls
/// behind is a network that misbehaves. Built once per test binary in a target dir of their
/// own (so no lock is shared with the running `cargo test`); `$SOFTROCE_E2E_DIR` names
/// builds made elsewhere (scripts/bench).
fn binaries() -> &'static (PathBuf, PathBuf, PathBuf) {
    static BINS: OnceLock<(PathBuf, PathBuf, PathBuf)> = OnceLock::new();
    BINS.get_or_init(|| {
        let dir = match std::env::var_os("SOFTROCE_E2E_DIR") {
            Some(d) => PathBuf::from(d),
            None => {
                let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("emulated-release");
                let root = Path::new(env!("CARGO_MANIFEST_DIR"))
                    .parent()
                    .expect("root");
                let built = Command::new(env!("CARGO"))
                    .args(["build", "-q", "--release", "-p", "softroce-shim", "--lib"])
                    .args(["-p", "softroce-daemon", "--bin", "softroce"])
                    .args(["-p", "softroce-e2e", "--bin", "netem-router"])
                    .arg("--manifest-path")
                    .arg(root.join("Cargo.toml"))
                    .arg("--target-dir")
                    .arg(&target)
                    .output()
                    .expect("run cargo build --release");
                check_output("cargo build --release (shim, daemon, netem-router)", built);
                target.join("release")
            }
        };
        let bins = (
            dir.join("softroce"),
            dir.join("libsoftroce.so"),
            dir.join("netem-router"),
        );
        for b in [&bins.0, &bins.1, &bins.2] {
            assert!(b.is_file(), "{} is missing", b.display());
        }
        bins
    })
}

impl Network {
    /// Creates the router and `senders` sender hosts (1..=senders) plus the receiver, starts
    /// netem-router with `router`, and a daemon on every host with `daemon_args`.
    pub fn new(name: &str, senders: u8, router: &RouterConfig, daemon_args: &[String]) -> Network {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        assert!(
            nix::unistd::geteuid().is_root(),
            "the emulated network needs root (network namespaces): run as root under `unshare --net`, or scripts/test"
        );
        assert!(
            Path::new("/dev/net/tun").exists(),
            "/dev/net/tun is missing"
        );
        let prefix = format!(
            "srcc{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        );
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join("emulated")
            .join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        let mut net = Network {
            router_ns: format!("{prefix}-r"),
            prefix,
            dir,
            router: None,
            hosts: Vec::new(),
            programs: Vec::new(),
            namespaces: Vec::new(),
        };
        net.add_ns(&net.router_ns.clone());
        let r = net.router_ns.clone();
        netns_exec(
            &r,
            &[
                "sysctl",
                "-qw",
                "net.ipv4.ip_forward=1",
                "net.ipv4.conf.all.rp_filter=0",
                "net.ipv4.conf.default.rp_filter=0",
            ],
        );
        let ids: Vec<u8> = (1..=senders).chain([RECEIVER]).collect();
        for &id in &ids {
            let ns = format!("{}-h{id}", net.prefix);
            net.add_ns(&ns);
            let veth = format!("r{id}");
            ip(&[
                "link", "add", &veth, "netns", &r, "type", "veth", "peer", "name", "eth0", "netns",
                &ns,
            ]);
            netns_exec(
                &r,
                &[
                    "ip",
                    "addr",
                    "add",
                    &format!("10.77.{id}.1/24"),
                    "dev",
                    &veth,
                ],
            );
            netns_exec(&r, &["ip", "link", "set", &veth, "up"]);
            netns_exec(
                &ns,
                &[
                    "ip",
                    "addr",
                    "add",
                    &format!("10.77.{id}.2/24"),
                    "dev",
                    "eth0",
                ],
            );
            netns_exec(&ns, &["ip", "link", "set", "eth0", "up"]);
            netns_exec(
                &ns,
                &[
                    "ip",
                    "route",
                    "add",
                    "default",
                    "via",
                    &format!("10.77.{id}.1"),
                ],
            );
            // Everything that arrives from a host goes to the TUN device.
            netns_exec(&r, &["ip", "rule", "add", "iif", &veth, "lookup", "100"]);
            net.hosts.push(Host {
                id,
                addr: Ipv4Addr::new(10, 77, id, 2),
                socket: net.dir.join(format!("h{id}.sock")),
                ns,
                daemon: None,
            });
        }
        net.start_router(router);
        let daemon = &binaries().0;
        for i in 0..net.hosts.len() {
            let h = &net.hosts[i];
            let log = std::fs::File::create(net.dir.join(format!("daemon-h{}.log", h.id)))
                .expect("daemon log");
            let child = Command::new(require_program("ip"))
                .args(["netns", "exec", &h.ns])
                .arg(daemon)
                .args(["daemon", "--socket"])
                .arg(&h.socket)
                .args(["--addr", &h.addr.to_string(), "--mtu", "1024"])
                .args(daemon_args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("start softroce daemon");
            net.hosts[i].daemon = Some(child);
        }
        for i in 0..net.hosts.len() {
            net.wait_for_daemon(i);
        }
        net
    }

    fn add_ns(&mut self, ns: &str) {
        ip(&["netns", "add", ns]);
        self.namespaces.push(ns.to_string());
        netns_exec(ns, &["ip", "link", "set", "lo", "up"]);
    }

    fn start_router(&mut self, c: &RouterConfig) {
        let mut args: Vec<String> = vec![
            "--tun".into(),
            "tun0".into(),
            "--stats".into(),
            self.dir.join("router.stats").display().to_string(),
            "--series".into(),
            self.dir.join("router.series").display().to_string(),
            "--realtime".into(),
        ];
        if c.rate_mbps > 0 {
            args.extend([
                "--bottleneck-dst".into(),
                format!("10.77.{RECEIVER}.2"),
                "--rate".into(),
                c.rate_mbps.to_string(),
                "--buffer".into(),
                c.buffer.to_string(),
            ]);
        }
        if let Some((min, max, p)) = c.red {
            args.extend(["--red".into(), format!("{min},{max},{p}")]);
        }
        args.extend(c.extra.iter().cloned());
        let log = std::fs::File::create(self.dir.join("router.log")).expect("router log");
        let child = Command::new(require_program("ip"))
            .args(["netns", "exec", &self.router_ns])
            .arg(&binaries().2)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start netem-router");
        self.router = Some(child);
        let r = self.router_ns.clone();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !Command::new(require_program("ip"))
            .args(["netns", "exec", &r, "ip", "link", "show", "tun0"])
            .output()
            .is_ok_and(|o| o.status.success())
        {
            assert!(Instant::now() < deadline, "netem-router never made tun0");
            std::thread::sleep(Duration::from_millis(20));
        }
        netns_exec(&r, &["sysctl", "-qw", "net.ipv4.conf.tun0.rp_filter=0"]);
        netns_exec(&r, &["ip", "link", "set", "tun0", "up"]);
        netns_exec(
            &r,
            &[
                "ip", "route", "add", "default", "dev", "tun0", "table", "100",
            ],
        );
    }

    fn wait_for_daemon(&mut self, i: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.hosts[i]
                .daemon
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "the daemon of host {} exited ({status}):\n{}",
                    self.hosts[i].id,
                    self.daemon_log(self.hosts[i].id)
                );
            }
            if self
                .request(self.hosts[i].id, Request::QueryDevices)
                .is_some()
            {
                return;
            }
            assert!(Instant::now() < deadline, "a daemon never served");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn host(&self, id: u8) -> &Host {
        self.hosts
            .iter()
            .find(|h| h.id == id)
            .expect("no such host")
    }

    pub fn daemon_log(&self, id: u8) -> String {
        std::fs::read_to_string(self.dir.join(format!("daemon-h{id}.log"))).unwrap_or_default()
    }

    /// One request to host `id`'s daemon over its control socket; None if it does not answer.
    pub fn request(&self, id: u8, req: Request) -> Option<Response> {
        daemon_request(&self.host(id).socket, "emulated-network", &req)
    }

    /// Host `id`'s congestion control: its counters and QP rates.
    pub fn congestion(&self, id: u8) -> DeviceCongestion {
        match self.request(id, Request::CongestionShow) {
            Some(Response::Congestion(mut d)) if !d.is_empty() => d.remove(0),
            other => panic!("host {id}: no congestion report: {other:?}"),
        }
    }

    /// A counter of host `id` by its mlx5 name.
    pub fn counter(&self, id: u8, name: &str) -> u64 {
        self.congestion(id)
            .counters
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, v)| *v)
    }

    /// A command running `program` on host `id` under the shim, logging to `log`.
    pub fn command(&self, id: u8, program: &str) -> Command {
        let shim = &binaries().1;
        let h = self.host(id);
        let mut cmd = Command::new(require_program("ip"));
        cmd.args(["netns", "exec", &h.ns, "env"])
            .arg(format!("LD_PRELOAD={}", shim.display()))
            .arg(format!("SOFTROCE_SOCKET={}", h.socket.display()))
            .arg(require_program(program));
        cmd
    }

    /// Starts `cmd` with its output in `<dir>/<log>`; kept so that it is stopped on drop.
    pub fn spawn(&mut self, mut cmd: Command, log: &str) -> usize {
        let out = std::fs::File::create(self.dir.join(log)).expect("program log");
        let err = out.try_clone().expect("log");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("start a program on a host");
        self.programs.push(child);
        self.programs.len() - 1
    }

    /// Waits up to `limit` for program `i`; its exit status, or None if it still runs.
    pub fn wait(&mut self, i: usize, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(s)) = self.programs[i].try_wait() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).unwrap_or_default()
    }

    /// Sends `signal` to netem-router (SIGUSR1: black hole on, SIGUSR2: off).
    pub fn signal_router(&self, signal: libc::c_int) {
        if let Some(c) = &self.router {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(c.id() as libc::pid_t, signal) };
        }
    }

    /// netem-router's statistics as it last wrote them (every 200 ms), `key=value`.
    pub fn router_stats(&self) -> BTreeMap<String, u64> {
        self.log("router.stats")
            .lines()
            .filter_map(|l| l.split_once('='))
            .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
            .collect()
    }

    /// Stops netem-router and returns its final statistics.
    pub fn stop_router(&mut self) -> BTreeMap<String, u64> {
        if let Some(mut c) = self.router.take() {
            stop_child(&mut c);
        }
        self.router_stats()
    }

    /// The bottleneck's rate over time: per 10 ms, the bytes that left it per source, and
    /// the deepest queue (`netem-router --series`).
    pub fn series(&self) -> Series {
        let mut s = Series::default();
        for line in self.log("router.series").lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(ms), Some(b)) = (
                f.first().and_then(|v| v.parse::<u64>().ok()),
                f.get(2).and_then(|v| v.parse::<u64>().ok()),
            ) else {
                continue;
            };
            match f[1] {
                "queue" => s.queue.push((ms, b)),
                src => {
                    *s.bytes
                        .entry(src.to_string())
                        .or_default()
                        .entry(ms)
                        .or_default() += b
                }
            }
        }
        s
    }
}

/// What `netem-router --series` recorded.
#[derive(Debug, Default)]
pub struct Series {
    /// Source address -> (ms -> bytes in that 10 ms).
    pub bytes: BTreeMap<String, BTreeMap<u64, u64>>,
    pub queue: Vec<(u64, u64)>,
}

impl Series {
    /// The window in which every source sent: from a second after the last one started to
    /// half a second before the first one stopped (ms).
    pub fn common_window(&self) -> (u64, u64) {
        let first = self.bytes.values().filter_map(|m| m.keys().next()).max();
        let last = self
            .bytes
            .values()
            .filter_map(|m| m.keys().next_back())
            .min();
        match (first, last) {
            (Some(&a), Some(&b)) => (a + 1000, b.saturating_sub(500)),
            _ => (0, 0),
        }
    }

    /// Bytes per source in `[from, to)` ms.
    pub fn bytes_between(&self, from: u64, to: u64) -> Vec<(String, u64)> {
        self.bytes
            .iter()
            .map(|(src, m)| (src.clone(), m.range(from..to).map(|(_, b)| b).sum()))
            .collect()
    }

    /// The deepest queue in `[from, to)` ms.
    pub fn max_queue_between(&self, from: u64, to: u64) -> u64 {
        self.queue
            .iter()
            .filter(|(t, _)| *t >= from && *t < to)
            .map(|(_, q)| *q)
            .max()
            .unwrap_or(0)
    }
}

/// Jain's fairness index.
pub fn jain(x: &[f64]) -> f64 {
    let sum: f64 = x.iter().sum();
    let sq: f64 = x.iter().map(|v| v * v).sum();
    if sq == 0.0 {
        return 0.0;
    }
    sum * sum / (x.len() as f64 * sq)
}

fn stop_child(c: &mut Child) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = c.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = c.kill();
    let _ = c.wait();
}

impl Drop for Network {
    fn drop(&mut self) {
        for c in &mut self.programs {
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
        for h in &mut self.hosts {
            if let Some(mut d) = h.daemon.take() {
                stop_child(&mut d);
            }
        }
        if let Some(mut c) = self.router.take() {
            stop_child(&mut c);
        }
        for ns in self.namespaces.iter().rev() {
            let _ = Command::new("ip").args(["netns", "delete", ns]).output();
        }
    }
}

/// DCQCN for a 100 Mbit/s network, from the parameters the simulator proves at 25 Gbit/s
/// (proto/tests/sim_incast.rs) slowed down 250-fold: the alpha period 250 µs, one decrease
/// and one CNP per QP per ms, the additive and hyper steps at the parameters' floor of
/// 1 Mbit/s, the queue thresholds in bytes unchanged. Two departures: the increase timer is
/// 10 ms (not 75) and the byte counter is off. At 25 Mbit/s a 32 KiB byte counter fires every
/// 10 ms for a flow at its share but eight times as often for one at eight times the rate,
/// and with the timer slowed down it is the faster flows' increases that win: shares stayed
/// 6 and 40 Mbit/s for many seconds. Timer increases do not depend on the rate, which makes
/// the shares converge (the paper's B is 10 MB, rarely reached, for the same reason). Each
/// QP is a 100 Mbit/s NIC (`rpg_max_rate`); a daemon woken late makes up to 5 ms of pacing
/// at once.
pub fn dcqcn_100mbit() -> Vec<String> {
    let mut a = vec!["--cc".to_string(), "dcqcn".to_string()];
    for p in [
        "rpg_max_rate=100",
        "dce_tcp_rtt=250",
        "rate_reduce_monitor_period=1000",
        "min_time_between_cnps=1000",
        "rpg_time_reset=10000",
        "rpg_byte_reset=0",
        "rpg_ai_rate=1",
        "rpg_hai_rate=1",
        "clamp_tgt_rate=1",
        "pacing_tolerance=5000",
    ] {
        a.push("--cc-param".into());
        a.push(p.into());
    }
    a
}

/// The bottleneck of the incast tests: 100 Mbit/s towards the receiver, a 400 KB buffer
/// (less than four of rxe's windows of 128 packets of 1 KB), RED from 5 KB to 100 KB.
pub fn incast_router() -> RouterConfig {
    RouterConfig {
        rate_mbps: 100,
        buffer: 400_000,
        red: Some((5_000, 100_000, 1.0)),
        extra: Vec::new(),
    }
}

/// One incast run: `senders` ib_write_bw clients for `secs` seconds into one server each on
/// the receiver. Returns (per-client ib_write_bw report lines, router stats, series).
pub struct Incast {
    pub router: BTreeMap<String, u64>,
    pub series: Series,
    /// Congestion reports of every host (after the run), by host id.
    pub congestion: BTreeMap<u8, DeviceCongestion>,
    /// ib_write_bw's own average per client, Gbit/s.
    pub reported_gbps: Vec<f64>,
}

pub fn run_incast(net: &mut Network, senders: u8, secs: u32) -> Incast {
    require_program("ib_write_bw");
    let common = |port: u16| -> Vec<String> {
        [
            "-d",
            "srxe0",
            "-x",
            "0",
            "-F",
            "--report_gbits",
            "-s",
            "65536",
            "-p",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([port.to_string(), "-D".into(), secs.to_string()])
        .collect()
    };
    let mut servers = Vec::new();
    for h in 1..=senders {
        let mut cmd = net.command(RECEIVER, "ib_write_bw");
        cmd.args(common(18500 + u16::from(h)));
        servers.push(net.spawn(cmd, &format!("server-{h}.log")));
    }
    // The servers listen before the clients connect.
    std::thread::sleep(Duration::from_millis(500));
    let mut clients = Vec::new();
    for h in 1..=senders {
        let mut cmd = net.command(h, "ib_write_bw");
        cmd.args(common(18500 + u16::from(h)))
            .arg(format!("10.77.{RECEIVER}.2"));
        clients.push(net.spawn(cmd, &format!("client-{h}.log")));
    }
    let limit = Duration::from_secs(u64::from(secs) + 60);
    for (h, &c) in clients.iter().enumerate() {
        let status = net.wait(c, limit);
        assert!(
            status.is_some_and(|s| s.success()),
            "ib_write_bw client {} failed ({status:?}):\n{}",
            h + 1,
            net.log(&format!("client-{}.log", h + 1))
        );
    }
    for &s in &servers {
        net.wait(s, Duration::from_secs(20));
    }
    let reported_gbps = (1..=senders)
        .map(|h| {
            net.log(&format!("client-{h}.log"))
                .lines()
                .find_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    (f.len() >= 4 && f[0] == "65536")
                        .then(|| f[3].parse().ok())
                        .flatten()
                })
                .unwrap_or(0.0)
        })
        .collect();
    let congestion = net
        .hosts
        .iter()
        .map(|h| h.id)
        .collect::<Vec<_>>()
        .into_iter()
        .map(|id| (id, net.congestion(id)))
        .collect();
    let router = net.stop_router();
    Incast {
        router,
        series: net.series(),
        congestion,
        reported_gbps,
    }
}

impl Incast {
    pub fn counter(&self, id: u8, name: &str) -> u64 {
        self.congestion[&id]
            .counters
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, v)| *v)
    }

    /// CNPs the senders' reaction points handled.
    pub fn cnps_handled(&self) -> u64 {
        self.congestion
            .keys()
            .filter(|&&id| id != RECEIVER)
            .map(|&id| self.counter(id, "rp_cnp_handled"))
            .sum()
    }

    /// Goodput per sender (Mbit/s at the bottleneck) and Jain's index over the last half of
    /// the window where every sender sent (DCQCN converges over seconds at these rates).
    pub fn shares(&self) -> (Vec<f64>, f64, (u64, u64)) {
        let (start, to) = self.series.common_window();
        let from = (start + to) / 2;
        let secs = (to.saturating_sub(from)) as f64 / 1000.0;
        let mbps: Vec<f64> = self
            .series
            .bytes_between(from, to)
            .iter()
            .map(|(_, b)| *b as f64 * 8.0 / 1e6 / secs.max(1e-3))
            .collect();
        let j = jain(&mbps);
        (mbps, j, (from, to))
    }
}
