//! `softroce doctor`: checks what this machine needs for softroce and says, in plain words
//! and with the fix, what is wrong. Exit status 0 when every check passes (warnings are
//! fine), 1 otherwise.

use super::{print_json, CliResult, Failure};
use crate::{config, ctl};
use anyhow::anyhow;
use clap::Args;
use proto::ctl::{LinkInfo, Request, Response};
use serde_json::json;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[derive(Args, Debug)]
#[command(
    after_help = "Checks: a daemon at the control socket; io_uring; process_vm_readv (same user, \
ptrace scope or root); the memlock limit; an address to serve and UDP port 4791; whether rdma_cm \
can have the kernel resolve a neighbour (CAP_NET_ADMIN or ping sockets); the shim loadable \
with LD_PRELOAD and the verbs programs on PATH; the replacement libibverbs.so.1, which only a program \
that looks the verbs up with dlsym() on its own handle of the library needs.

Examples:
  softroce doctor
  softroce doctor --socket /run/softroce/ctl.sock -j"
)]
pub struct DoctorArgs {
    /// JSON, one line.
    #[arg(short, long)]
    json: bool,
    /// RoCE v2 UDP port the daemon should serve.
    #[arg(long, default_value_t = proto::wire::ROCE_V2_PORT)]
    port: u16,
    #[arg(long)]
    socket: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    /// Works, but something is worth knowing.
    Warn,
    Fail,
}

#[derive(Debug, Clone)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub what: String,
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: &'static str, what: impl Into<String>) -> Check {
        Check {
            name,
            status: Status::Ok,
            what: what.into(),
            fix: None,
        }
    }
    fn warn(name: &'static str, what: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            name,
            status: Status::Warn,
            what: what.into(),
            fix: Some(fix.into()),
        }
    }
    fn fail(name: &'static str, what: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            name,
            status: Status::Fail,
            what: what.into(),
            fix: Some(fix.into()),
        }
    }
}

/// What the daemon check learned, for the checks after it.
struct DaemonView {
    pid: i32,
    uid: u32,
    links: Vec<LinkInfo>,
}

pub fn run(args: DoctorArgs) -> CliResult {
    let socket = config::socket_path(args.socket.as_deref());
    let (daemon_check, daemon) = check_daemon(&socket);
    let mut checks = vec![daemon_check];
    checks.push(check_io_uring());
    checks.push(check_process_vm(daemon.as_ref()));
    checks.push(check_memlock());
    checks.push(check_address(daemon.as_ref()));
    checks.push(check_port(args.port, daemon.as_ref()));
    checks.extend(check_neighbours(daemon.as_ref()));
    checks.extend(check_shim(&socket, daemon.as_ref()));
    let failed = checks.iter().filter(|c| c.status == Status::Fail).count();
    if args.json {
        print_json(&serde_json::Value::Array(
            checks
                .iter()
                .map(|c| {
                    json!({
                        "check": c.name,
                        "status": match c.status { Status::Ok => "ok", Status::Warn => "warn", Status::Fail => "fail" },
                        "what": c.what,
                        "fix": c.fix,
                    })
                })
                .collect(),
        ));
    } else {
        for c in &checks {
            let tag = match c.status {
                Status::Ok => "ok  ",
                Status::Warn => "warn",
                Status::Fail => "FAIL",
            };
            println!("{tag}  {:<10} {}", c.name, c.what);
            if let Some(fix) = &c.fix {
                println!("      {:<10} fix: {fix}", "");
            }
        }
        if failed == 0 {
            println!("softroce doctor: all is well");
        }
    }
    // (The summary of a failure is the error line every command prints on stderr.)
    match failed {
        0 => Ok(()),
        1 => Err(Failure::failed(anyhow!("doctor: 1 problem (FAIL above)"))),
        n => Err(Failure::failed(anyhow!(
            "doctor: {n} problems (FAIL above)"
        ))),
    }
}

fn start_fix(socket: &Path) -> String {
    format!(
        "start one: `softroce daemon --socket {}` (or `systemctl start softroce`), or name yours with --socket / $SOFTROCE_SOCKET",
        socket.display()
    )
}

fn check_daemon(socket: &Path) -> (Check, Option<DaemonView>) {
    const NAME: &str = "daemon";
    let me = nix::unistd::getuid().as_raw();
    if !socket.exists() {
        return (
            Check::fail(
                NAME,
                format!("no softroce daemon: {} does not exist", socket.display()),
                start_fix(socket),
            ),
            None,
        );
    }
    let conn = match ctl::Client::connect_raw(socket) {
        Ok(c) => c,
        Err(e) => {
            let why = e.root_cause().downcast_ref::<nix::errno::Errno>().copied();
            return (
                match why {
                    Some(nix::errno::Errno::ECONNREFUSED) => Check::fail(
                        NAME,
                        format!(
                            "no softroce daemon: nothing listens at {} (a daemon that died left it)",
                            socket.display()
                        ),
                        start_fix(socket),
                    ),
                    Some(nix::errno::Errno::EACCES) => Check::fail(
                        NAME,
                        {
                            use std::os::unix::fs::MetadataExt;
                            let owner = std::fs::metadata(socket)
                                .map(|m| format!("uid {}, mode {:o}", m.uid(), m.mode() & 0o777))
                                .unwrap_or_else(|_| "unknown owner".into());
                            format!(
                                "you (uid {me}) may not connect to {}: the socket belongs to another user ({owner})",
                                socket.display()
                            )
                        },
                        "run your own daemon on a socket of yours (`softroce daemon --socket $XDG_RUNTIME_DIR/softroce/ctl.sock`), or have that daemon allow you (allow_uid / allow_group in its config)",
                    ),
                    _ => Check::fail(
                        NAME,
                        format!("cannot connect to {}: {e:#}", socket.display()),
                        start_fix(socket),
                    ),
                },
                None,
            );
        }
    };
    let (pid, uid) = match conn.peer_credentials() {
        Ok(c) => (c.pid(), c.uid()),
        Err(_) => (0, u32::MAX),
    };
    if uid != me && uid != 0 {
        return (
            Check::fail(
                NAME,
                format!(
                    "the daemon at {} (pid {pid}) runs as uid {uid}, you are uid {me}: it can reach only its own user's memory, and refuses you",
                    socket.display()
                ),
                "run a daemon of your own (`softroce daemon --socket $XDG_RUNTIME_DIR/softroce/ctl.sock`), or run the shared one as root (softroce.service)",
            ),
            None,
        );
    }
    let mut client = match ctl::Client::from_conn(conn, "softroce doctor") {
        Ok(c) => c,
        Err(e) => {
            let other_build = format!("{e:#}").contains("restart the daemon");
            return (
                Check::fail(
                    NAME,
                    format!("the daemon at {} refused us: {e:#}", socket.display()),
                    if other_build {
                        "it is another softroce build than this one: restart it with this softroce (`softroce daemon`, or `systemctl restart softroce`)"
                    } else {
                        "run a daemon of your own user, or the shared one as root"
                    },
                ),
                None,
            );
        }
    };
    let links = match client.request(&Request::LinkShow) {
        Ok(Response::Links(l)) => l,
        _ => Vec::new(),
    };
    let names: Vec<&str> = links.iter().map(|l| l.info.name.as_str()).collect();
    (
        Check::ok(
            NAME,
            format!(
                "softroce daemon pid {pid} (uid {uid}) at {} serves {}",
                socket.display(),
                if names.is_empty() {
                    "no device".to_string()
                } else {
                    names.join(", ")
                }
            ),
        ),
        Some(DaemonView { pid, uid, links }),
    )
}

fn check_io_uring() -> Check {
    const NAME: &str = "io_uring";
    let disabled = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(0);
    match io_uring::IoUring::new(8) {
        Ok(_) => Check::ok(NAME, "io_uring works"),
        Err(e) => Check::warn(
            NAME,
            format!(
                "io_uring is not usable here ({e}{}): the daemon falls back to recvmmsg/sendmmsg, which is slower",
                if disabled > 0 {
                    format!("; kernel.io_uring_disabled = {disabled}")
                } else {
                    String::new()
                }
            ),
            "allow it: `sysctl kernel.io_uring_disabled=0`, or a container seccomp profile that permits io_uring_setup",
        ),
    }
}

/// Whether a process may read the memory of an unrelated process of its user: a forked
/// child reads its parent (not its descendant, as the daemon and its clients are).
fn process_vm_works() -> Result<(), nix::errno::Errno> {
    static PROBE: [u8; 8] = *b"softroce";
    use nix::sys::wait::{waitpid, WaitStatus};
    use nix::unistd::{fork, ForkResult};
    let parent = nix::unistd::getpid();
    // SAFETY: the child only calls async-signal-safe functions (process_vm_readv, _exit).
    match unsafe { fork() }? {
        ForkResult::Child => {
            let mut buf = [0u8; 8];
            let mut local = [std::io::IoSliceMut::new(&mut buf)];
            let remote = [nix::sys::uio::RemoteIoVec {
                base: PROBE.as_ptr() as usize,
                len: 8,
            }];
            let code = match nix::sys::uio::process_vm_readv(parent, &mut local, &remote) {
                Ok(8) if buf == PROBE => 0,
                Ok(_) => 1,
                Err(e) => 10 + (e as i32).min(200),
            };
            // SAFETY: ends the forked child at once, without running the parent's atexit.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => match waitpid(child, None)? {
            WaitStatus::Exited(_, 0) => Ok(()),
            WaitStatus::Exited(_, c) if c >= 10 => Err(nix::errno::Errno::from_raw(c - 10)),
            _ => Err(nix::errno::Errno::EIO),
        },
    }
}

fn check_process_vm(daemon: Option<&DaemonView>) -> Check {
    const NAME: &str = "memory";
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    let scope_text = scope.map_or(String::new(), |s| {
        format!(", kernel.yama.ptrace_scope = {s}")
    });
    let root_daemon = daemon.is_some_and(|d| d.uid == 0);
    match process_vm_works() {
        Ok(()) => Check::ok(
            NAME,
            format!("process_vm_readv reaches other processes of your user{scope_text}"),
        ),
        Err(e) if root_daemon => Check::warn(
            NAME,
            format!("process_vm_readv between your processes fails ({}){scope_text}; the daemon runs as root, which may", e.desc()),
            "nothing to do for a root daemon; a daemon of your own needs `sysctl kernel.yama.ptrace_scope=0` or CAP_SYS_PTRACE",
        ),
        Err(e) => Check::fail(
            NAME,
            format!(
                "the daemon cannot reach its clients' memory: process_vm_readv fails ({}){scope_text}",
                e.desc()
            ),
            "allow it: `sysctl kernel.yama.ptrace_scope=0`, or give the daemon CAP_SYS_PTRACE (`setcap cap_sys_ptrace+ep $(command -v softroce)`), or run it as root; in a container, a seccomp profile that permits process_vm_readv",
        ),
    }
}

fn check_memlock() -> Check {
    const NAME: &str = "memlock";
    let Ok((soft, _)) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK)
    else {
        return Check::warn(NAME, "cannot read the memlock limit", "check `ulimit -l`");
    };
    let text = if soft == nix::sys::resource::RLIM_INFINITY {
        "unlimited".to_string()
    } else {
        format!("{} KiB", soft / 1024)
    };
    if soft == nix::sys::resource::RLIM_INFINITY || soft >= 64 << 20 {
        Check::ok(NAME, format!("memlock limit {text}"))
    } else {
        Check::warn(
            NAME,
            format!("memlock limit {text}: softroce pins nothing, but UCX, Open MPI and other stacks warn or refuse below their needs"),
            "raise it: `ulimit -l unlimited`, LimitMEMLOCK=infinity in a systemd unit, or memlock in /etc/security/limits.conf",
        )
    }
}

fn check_address(daemon: Option<&DaemonView>) -> Check {
    const NAME: &str = "address";
    match daemon {
        Some(d) if !d.links.is_empty() => {
            let down: Vec<String> = d
                .links
                .iter()
                .filter(|l| l.state != "ACTIVE")
                .map(|l| {
                    format!(
                        "{}: {}",
                        l.info.name,
                        l.down_because.as_deref().unwrap_or("DOWN")
                    )
                })
                .collect();
            if down.is_empty() {
                let all: Vec<String> = d
                    .links
                    .iter()
                    .map(|l| {
                        format!(
                            "{} on {}",
                            l.info.name,
                            l.addrs
                                .iter()
                                .map(|a| a.to_string())
                                .collect::<Vec<_>>()
                                .join(" ")
                        )
                    })
                    .collect();
                Check::ok(NAME, all.join("; "))
            } else {
                Check::fail(
                    NAME,
                    format!("port DOWN: {}", down.join("; ")),
                    "as said for each device: its programs get IBV_EVENT_PORT_ERR and their RC requests fail with retry-exceeded errors until it is up",
                )
            }
        }
        Some(_) => Check::fail(
            NAME,
            "the daemon serves no device",
            "add one: `softroce link add srxe0 addr 127.0.0.1 ::1`",
        ),
        None => match UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)) {
            Ok(_) => Check::ok(
                NAME,
                "127.0.0.1 can be bound (the default device's address)",
            ),
            Err(e) => Check::fail(
                NAME,
                format!("cannot bind a UDP socket on 127.0.0.1: {e}"),
                "bring up the loopback interface: `ip link set lo up`",
            ),
        },
    }
}

/// Whether the daemon's rdma_cm can have the kernel resolve a peer's link-layer address
/// before it reports the address resolved, as the kernel's rdma_cm waits for it (`NTF_USE`
/// with CAP_NET_ADMIN, else an ICMP echo on a ping socket, `net::kernel_neighbour`). Without
/// either, a program resolving an address on the link that nobody answers waits out ib_cm's
/// retries, not its own timeout. Only for devices whose packets the kernel routes (the L2
/// device resolves in its own stack); nothing to say without a daemon.
fn check_neighbours(daemon: Option<&DaemonView>) -> Option<Check> {
    const NAME: &str = "neighbours";
    let d = daemon?;
    if d.links
        .iter()
        .all(|l| l.transport.iter().all(|t| t.starts_with("tap")))
    {
        return None;
    }
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.pid)).ok()?;
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(str::trim)
    };
    let cap_eff = field("CapEff:").and_then(|v| u64::from_str_radix(v, 16).ok())?;
    const CAP_NET_ADMIN: u32 = 12;
    if cap_eff & (1 << CAP_NET_ADMIN) != 0 {
        return Some(Check::ok(
            NAME,
            "rdma_cm waits for a peer to answer ARP or neighbour discovery, as the kernel's (the daemon has CAP_NET_ADMIN)",
        ));
    }
    // The daemon's effective group and its supplementary groups, as ping sockets check them.
    let mut groups: Vec<u32> = field("Groups:")
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|g| g.parse().ok())
        .collect();
    groups.extend(field("Gid:").and_then(|g| g.split_whitespace().nth(1)?.parse::<u32>().ok()));
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ping_group_range").unwrap_or_default();
    let bounds: Vec<u32> = range
        .split_whitespace()
        .filter_map(|g| g.parse().ok())
        .collect();
    let allowed = match bounds[..] {
        [lo, hi] => groups.iter().any(|g| (lo..=hi).contains(g)),
        _ => false,
    };
    Some(if allowed {
        Check::ok(
            NAME,
            "rdma_cm waits for a peer to answer ARP or neighbour discovery, as the kernel's (the daemon's group may open ping sockets)",
        )
    } else {
        Check::warn(
            NAME,
            format!(
                "rdma_cm cannot have the kernel resolve a peer (no CAP_NET_ADMIN; ping sockets are for groups {}): an address on the link that nobody answers fails only when ib_cm's retries run out, about a minute, not in the program's resolve timeout",
                range.trim()
            ),
            "give the daemon CAP_NET_ADMIN (AmbientCapabilities=CAP_NET_ADMIN in its unit), or let its group open ping sockets: `sysctl net.ipv4.ping_group_range=\"0 2147483647\"`",
        )
    })
}

/// The processes that hold a UDP socket bound to `port` (from /proc/net/udp{,6} and the
/// processes' fds): (pid, command). A socket no process holds is the kernel's (rdma_rxe).
pub fn udp_port_holders(port: u16) -> (bool, Vec<(i32, String)>) {
    use crate::net::port_share::{socket_inodes, table_inodes};
    let needle = format!(":{port:04X}");
    let inodes: Vec<u64> = ["/proc/net/udp", "/proc/net/udp6"]
        .iter()
        .flat_map(|f| {
            let table = std::fs::read_to_string(f).unwrap_or_default();
            table_inodes(&table, |local| local.ends_with(&needle))
        })
        .collect();
    let bound = !inodes.is_empty();
    let mut holders = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let holds = socket_inodes(&entry.path().join("fd"))
            .iter()
            .any(|i| inodes.contains(i));
        if holds {
            let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            holders.push((pid, comm.trim().to_string()));
        }
    }
    (bound, holders)
}

fn check_port(port: u16, daemon: Option<&DaemonView>) -> Check {
    let name = "port";
    // One at a time: the IPv6 wildcard also takes IPv4, so it would collide with our own.
    let in_use = |a: SocketAddr| matches!(UdpSocket::bind(a), Err(e) if e.kind() == std::io::ErrorKind::AddrInUse);
    let taken = in_use(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))
        || in_use(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)));
    if !taken {
        return match daemon {
            Some(_) => Check::ok(
                name,
                format!("UDP port {port} is free (the daemon serves other ports)"),
            ),
            None => Check::ok(name, format!("UDP port {port} is free")),
        };
    }
    let (_, holders) = udp_port_holders(port);
    let others: Vec<&(i32, String)> = holders
        .iter()
        .filter(|(pid, _)| daemon.is_none_or(|d| d.pid != *pid))
        .collect();
    let served = daemon.is_some_and(|d| holders.iter().any(|(pid, _)| *pid == d.pid));
    if served {
        // The daemon binds its own addresses, and the kernel hands a datagram to the socket
        // bound to its destination address before any wildcard one: programs bound to the
        // port elsewhere (another daemon's addresses, as two daemons on one host have) take
        // none of its packets.
        if others.is_empty() {
            return Check::ok(name, format!("UDP port {port} is served by the daemon"));
        }
        return Check::ok(
            name,
            format!(
                "UDP port {port} is served by the daemon (also bound by {}, on other addresses: none of the daemon's packets go there)",
                holder_list(&others)
            ),
        );
    }
    let who = if others.is_empty() {
        "the kernel (a kernel rdma_rxe device? `rdma link show`)".to_string()
    } else {
        holder_list(&others)
    };
    Check::fail(
        name,
        format!("UDP port {port} is taken by {who}: RoCE v2 peers send to port {port} only"),
        if others.is_empty() {
            "remove the kernel's soft-RoCE device (`rdma link delete rxe0`) or run softroce in another network namespace".to_string()
        } else {
            "stop that program, or run softroce in another network namespace (peers always send to 4791)".to_string()
        },
    )
}

fn holder_list(holders: &[&(i32, String)]) -> String {
    holders
        .iter()
        .map(|(pid, comm)| format!("pid {pid} ({comm})"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The replacement `libibverbs.so.1` (scripts/shim-build.sh's `replacement/`) beside the
/// preload library, if built.
fn replacement_dir(shim: &Path) -> Option<PathBuf> {
    let dir = shim.parent()?.join("replacement");
    dir.join("libibverbs.so.1").is_file().then_some(dir)
}

fn on_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_string_lossy()
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}

fn check_shim(socket: &Path, daemon: Option<&DaemonView>) -> Vec<Check> {
    let mut out = Vec::new();
    let shim = match super::shim_path() {
        Ok(s) => s,
        Err(e) => {
            out.push(Check::fail(
                "shim",
                format!("{e:#}"),
                "build it: `cargo build --release -p softroce-shim` (or scripts/shim-build.sh), or set SOFTROCE_SHIM",
            ));
            return out;
        }
    };
    // The dynamic loader says why a preload fails on stderr and runs the program anyway.
    let probe = Command::new("/bin/sh")
        .args(["-c", "exit 0"])
        .env("LD_PRELOAD", &shim)
        .stdin(Stdio::null())
        .output();
    match probe {
        Ok(o) if o.stderr.is_empty() && o.status.success() => {}
        Ok(o) => {
            out.push(Check::fail(
                "shim",
                format!(
                    "{} cannot be preloaded: {}",
                    shim.display(),
                    String::from_utf8_lossy(&o.stderr).trim()
                ),
                "rebuild it for this machine: `cargo build --release -p softroce-shim`",
            ));
            return out;
        }
        Err(e) => {
            out.push(Check::warn(
                "shim",
                format!("cannot run /bin/sh to try the shim: {e}"),
                "check /bin/sh",
            ));
            return out;
        }
    }
    // The real test: an unmodified verbs program, preloaded, lists the daemon's devices.
    match (on_path("ibv_devices"), daemon) {
        (Some(prog), Some(d)) if !d.links.is_empty() => {
            let listed = Command::new(&prog)
                .env("LD_PRELOAD", &shim)
                .env("SOFTROCE_SOCKET", socket)
                .stdin(Stdio::null())
                .output();
            let text = listed
                .as_ref()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            let missing: Vec<&str> = d
                .links
                .iter()
                .map(|l| l.info.name.as_str())
                .filter(|n| !text.split_whitespace().any(|w| w == *n))
                .collect();
            if missing.is_empty() {
                out.push(Check::ok(
                    "shim",
                    format!(
                        "{} preloads, and ibv_devices lists the daemon's devices",
                        shim.display()
                    ),
                ));
            } else {
                out.push(Check::fail(
                    "shim",
                    format!("ibv_devices with {} does not list {}", shim.display(), missing.join(", ")),
                    "run programs with `softroce run -- PROGRAM` (it sets LD_PRELOAD and SOFTROCE_SOCKET)",
                ));
            }
        }
        _ => out.push(Check::ok("shim", format!("{} preloads", shim.display()))),
    }
    let programs = [
        "ibv_devices",
        "ibv_devinfo",
        "ibv_rc_pingpong",
        "ib_write_bw",
        "rping",
    ];
    let found: Vec<&str> = programs
        .iter()
        .copied()
        .filter(|p| on_path(p).is_some())
        .collect();
    if found.is_empty() {
        out.push(Check::warn(
            "programs",
            "no verbs programs on PATH (ibv_devices, ibv_rc_pingpong, ib_write_bw, rping)",
            "install them: `apt-get install ibverbs-utils perftest rdmacm-utils`",
        ));
    } else {
        out.push(Check::ok(
            "programs",
            format!("on PATH: {}", found.join(" ")),
        ));
    }
    // The stacks (UCX, libfabric, Open MPI) load libibverbs.so.1 by their own dependencies or
    // dlopen, and call it by name: the preloaded shim comes first in the lookup, so
    // `softroce run` reaches them (scripts/stacks-test runs them so). Only a program that
    // looks the verbs up with dlsym() on its own handle of libibverbs.so.1 finds the real
    // library: that one needs the replacement (shim/README.md).
    match replacement_dir(&shim) {
        Some(dir) => out.push(Check::ok(
            "dlopen",
            format!(
                "a program that looks the verbs up with dlsym() on its own handle of libibverbs.so.1 gets the replacement with LD_LIBRARY_PATH={}",
                dir.display()
            ),
        )),
        None => out.push(Check::ok(
            "dlopen",
            "UCX, libfabric and Open MPI reach the shim under `softroce run`; a program that looks the verbs up with dlsym() on its own handle of libibverbs.so.1 needs the replacement: `scripts/shim-build.sh OUT --release`, then LD_LIBRARY_PATH=OUT/replacement",
        )),
    }
    out
}
