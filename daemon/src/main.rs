//! `softroce`: the user-space RoCE device and its tools.

use softroce_daemon::cli::{self, capture, doctor, fault, link, res, stat};
use softroce_daemon::{config, ctl, pcap, server};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use config::{Config, DeviceConfig, RoceMode};
use proto::ctl::{Request, Response, RoceVersion};
use proto::iface::IpCidr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "softroce",
    version,
    about = "A software RoCE device in user space",
    after_help = "Every command but daemon, run and pcap talks to a running daemon over its control \
socket (--socket, else $SOFTROCE_SOCKET, else $XDG_RUNTIME_DIR/softroce/ctl.sock, else \
/run/softroce/ctl.sock); -j prints JSON. Exit status: 0 done, 1 refused or failed, 2 usage \
error or no daemon.

Examples:
  softroce daemon &
  softroce run -- ibv_rc_pingpong -g 0
  softroce link add srxe1 addr 127.0.0.2
  softroce link set srxe0 down
  softroce stat srxe0 -w 1
  softroce capture -w - | tshark -i -
  softroce fault srxe0 drop --rate 0.01
  softroce doctor"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: the daemon's flags being the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Run the device in the foreground (logs to stderr; stops on SIGINT or SIGTERM). With no
    /// arguments it serves srxe0, RoCE v2 on 127.0.0.1 and ::1.
    ///
    /// Examples:
    ///   softroce daemon
    ///   softroce daemon --config /etc/softroce/softroce.toml
    ///   softroce daemon --name srxe1 --addr 192.0.2.1 --mtu 1024 --log debug
    ///   softroce daemon --name srxe1 --tap tap0 --roce both --addr 10.0.0.1/24
    #[command(verbatim_doc_comment)]
    Daemon(Box<DaemonArgs>),
    /// Run a program with the softroce shim preloaded, so that its libibverbs and librdmacm
    /// calls reach the daemon.
    ///
    /// Examples:
    ///   softroce run -- ibv_devinfo -v
    ///   softroce run -- rping -s -a 127.0.0.1
    #[command(verbatim_doc_comment)]
    Run {
        /// The daemon's control socket (default: $SOFTROCE_SOCKET, then
        /// $XDG_RUNTIME_DIR/softroce/ctl.sock, then /run/softroce/ctl.sock).
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Print every variable set for the program (and why) on stderr.
        #[arg(short, long)]
        verbose: bool,
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Devices on the running daemon: add, delete, set up or down, show (as `rdma link`).
    Link {
        #[command(subcommand)]
        command: link::LinkCommand,
    },
    /// Counters, as `rdma statistic`: every rxe counter, the congestion counters, the ICRC
    /// and version-mismatch drops, the same-host fast path's; per QP with `qp QPN`; rates
    /// with -w.
    Stat(stat::StatArgs),
    /// Resources and who holds them, as `rdma resource show`.
    Res {
        #[command(subcommand)]
        command: res::ResCommand,
    },
    /// Capture every packet a device sends and receives, live, as pcapng.
    Capture(capture::CaptureArgs),
    /// Inject faults (drop, duplicate, delay, reorder, corrupt, RNR and access-error NAKs).
    Fault(fault::FaultArgs),
    /// Check what softroce needs on this machine and say how to fix what is missing.
    Doctor(doctor::DoctorArgs),
    /// Work with packet captures.
    Pcap {
        #[command(subcommand)]
        command: PcapCommand,
    },
}

#[derive(Args, Debug)]
struct DaemonArgs {
    /// A TOML file describing devices (see the README); flags below add one more device.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The control socket (default: $SOFTROCE_SOCKET, then $XDG_RUNTIME_DIR/softroce/ctl.sock,
    /// then /run/softroce/ctl.sock).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Device name.
    #[arg(long)]
    name: Option<String>,
    /// An address to serve, IPv4 or IPv6 (repeatable); ADDR/PREFIX on a --tap device (the
    /// peers in the prefix are on its link).
    #[arg(long = "addr")]
    addrs: Vec<IpCidr>,
    /// Serve all addresses of this network interface, following them as they change.
    #[arg(long)]
    netdev: Option<String>,
    /// Be a host of its own on the Ethernet behind this TAP interface (created, or opened if
    /// it exists, e.g. made by `ip tuntap add mode tap`): the L2 device, which sends and
    /// receives whole frames and speaks RoCE v1 (Ethertype 0x8915) as well as v2.
    #[arg(long)]
    tap: Option<String>,
    /// The --tap device's Ethernet address (default: derived from the device name).
    #[arg(long)]
    mac: Option<String>,
    /// RoCE versions: v2 (UDP 4791, the default), v1 (Ethertype 0x8915) or both (each
    /// address listed once as a RoCE v1 and once as a RoCE v2 GID, as mlx5). v1 and both
    /// need --tap.
    #[arg(long)]
    roce: Option<RoceMode>,
    /// Largest path MTU: 256, 512, 1024, 2048 or 4096.
    #[arg(long)]
    mtu: Option<u32>,
    /// Most QPs the device holds, over all clients.
    #[arg(long)]
    max_qp: Option<u32>,
    /// Most memory regions the device holds, over all clients.
    #[arg(long)]
    max_mr: Option<u32>,
    /// Deepest CQ a client may create (default 1,048,575: libfabric's ofi_rxm asks for
    /// 262,144 entries, more than rxe's 32,767).
    #[arg(long)]
    max_cqe: Option<u32>,
    /// The port's speed in Mb/s, reported as ibv_query_port's active width and speed (by
    /// the kernel's rule for RoCE). Default: the --netdev's speed when the kernel knows it,
    /// else 100000 (4X EDR). Stacks such as UCX size their protocols by it.
    #[arg(long, value_name = "MBIT")]
    speed: Option<u32>,
    /// The GID type rdma_cm uses (configfs default_roce_mode): v1 or v2; by default v2 where
    /// the device offers it, else v1. A mode the device does not offer is refused at start.
    #[arg(long)]
    default_roce_mode: Option<RoceVersion>,
    /// rdma_cm's CM response timeout exponent (4.096 µs · 2^t, default 20 as the kernel).
    #[arg(long)]
    cm_response_timeout: Option<u8>,
    /// rdma_cm's CM retries (default 15 as the kernel).
    #[arg(long)]
    cm_max_retries: Option<u8>,
    /// Send packets between QPs of the device through its UDP socket, so that tcpdump on the
    /// interface sees them (kernel rxe never shows them); by default they go engine to
    /// engine inside the daemon.
    #[arg(long)]
    local_via_socket: bool,
    /// No UDP GSO on send: one datagram per packet, so that a capture on the host's own `lo`
    /// (or on a veth or bridge toward another softroce device, which gets GSO over IPv4 too)
    /// shows RoCE packets rather than GSO super-datagrams (with --local-via-socket, a
    /// capture of one daemon's traffic that both pcap checkers accept).
    #[arg(long)]
    no_gso: bool,
    /// How RC QPs recover lost packets: gbn (go-back-N, as kernel rxe), selective
    /// (selective retransmission on every RC QP, for networks of softroce devices only) or
    /// auto (the default: selective with peers that are softroce, go-back-N otherwise).
    #[arg(long)]
    loss_recovery: Option<config::LossRecoveryMode>,
    /// The bandwidth-delay product, in bytes, that selective retransmission's window is
    /// capped at (default 524288: 128 packets at MTU 4096, 512 at MTU 1024).
    #[arg(long)]
    selective_bdp: Option<u32>,
    /// Congestion control: dcqcn (the default: data packets ECT(0), CNPs for CE marks,
    /// DCQCN rate control and per-QP pacing) or none (kernel rxe's behaviour on the wire).
    #[arg(long)]
    cc: Option<proto::transport::Algorithm>,
    /// A congestion-control parameter, NAME=VALUE (repeatable): NVIDIA's DOCA names or mlx5's
    /// (rpg_time_reset=300, np_min_time_between_cnps=4, ...; docs/congestion.md lists them).
    #[arg(long = "cc-param", value_name = "NAME=VALUE")]
    cc_params: Vec<String>,
    /// Let this user (uid or name) use the daemon besides the daemon's own user (repeatable).
    /// The control socket is then mode 0666; the daemon checks every client's uid.
    #[arg(long = "allow-uid")]
    allow_uid: Vec<config::UserOrId>,
    /// Let members of this group (gid or name) use the daemon (repeatable); the first one
    /// owns the control socket, which is then mode 0660. Without --allow-uid/--allow-group
    /// the socket is 0600: the daemon's user only.
    #[arg(long = "allow-group")]
    allow_group: Vec<config::UserOrId>,
    /// Most control connections at once (default 1024).
    #[arg(long)]
    max_connections: Option<u32>,
    /// Most control connections of one user at once (default 256).
    #[arg(long)]
    max_connections_per_uid: Option<u32>,
    /// RoCE v2 UDP port (4791; another value only for tests on one host).
    #[arg(long, default_value_t = proto::wire::ROCE_V2_PORT)]
    port: u16,
    /// Log filter, as RUST_LOG (default: info): levels error, warn, info, debug, trace, per
    /// module too (`info,softroce_daemon::cm=debug`).
    #[arg(long, default_value = "info")]
    log: String,
    /// Log lines as text (key=value fields, the spans of the client and QP they concern) or
    /// as JSON objects, one per line (for journald and log collectors).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum PcapCommand {
    /// Parse every RoCE packet (v2 over UDP 4791 on IPv4 and IPv6, v1 on Ethertype 0x8915) in
    /// pcap or pcapng files and verify every ICRC. Exit status: 0 when every whole RoCE packet
    /// parses and carries the right ICRC, 1 otherwise, 2 when a file cannot be read.
    ///
    /// Example: softroce pcap check -v capture.pcapng
    #[command(verbatim_doc_comment)]
    Check {
        /// One line per packet: opcode, QPN, PSN, flags and extended headers.
        #[arg(short, long)]
        verbose: bool,
        /// Capture files (pcap or pcapng; Ethernet, Linux cooked v1/v2 or raw IP).
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

fn main() -> ExitCode {
    restore_default_sigpipe();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Pcap {
            command: PcapCommand::Check { verbose, files },
        } => return pcap_check(&files, verbose),
        Command::Link { command } => return cli::finish(link::run(command)),
        Command::Stat(args) => return cli::finish(stat::run(args)),
        Command::Res { command } => return cli::finish(res::run(command)),
        Command::Capture(args) => return cli::finish(capture::run(args)),
        Command::Fault(args) => return cli::finish(fault::run(args)),
        Command::Doctor(args) => return cli::finish(doctor::run(args)),
        Command::Daemon(args) => daemon(*args),
        Command::Run {
            socket,
            verbose,
            command,
        } => run(socket.as_deref(), verbose, &command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("softroce: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn daemon(args: DaemonArgs) -> Result<()> {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&args.log))?;
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    match args.log_format {
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => logs
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .init(),
    }
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    let from_flags = args.name.is_some()
        || !args.addrs.is_empty()
        || args.netdev.is_some()
        || args.tap.is_some()
        || args.mac.is_some()
        || args.roce.is_some()
        || args.mtu.is_some()
        || args.max_qp.is_some()
        || args.max_mr.is_some()
        || args.max_cqe.is_some()
        || args.speed.is_some()
        || args.default_roce_mode.is_some()
        || args.cm_response_timeout.is_some()
        || args.cm_max_retries.is_some()
        || args.local_via_socket
        || args.no_gso
        || args.loss_recovery.is_some()
        || args.selective_bdp.is_some()
        || args.cc.is_some()
        || !args.cc_params.is_empty();
    if from_flags || config.devices.is_empty() {
        let mut d = if args.addrs.is_empty() && args.netdev.is_none() && args.tap.is_none() {
            DeviceConfig::loopback_default()
        } else {
            DeviceConfig::new(config::DEFAULT_DEVICE)
        };
        if let Some(n) = args.name {
            d.name = n;
        }
        d.addr.extend(args.addrs);
        d.netdev = args.netdev;
        d.tap = args.tap;
        d.mac = args.mac;
        if let Some(r) = args.roce {
            d.roce = r;
        }
        if let Some(m) = args.mtu {
            d.mtu = m;
        }
        if let Some(m) = args.max_qp {
            d.max_qp = m;
        }
        if let Some(m) = args.max_mr {
            d.max_mr = m;
        }
        if let Some(m) = args.max_cqe {
            d.max_cqe = m;
        }
        if args.speed.is_some() {
            d.speed = args.speed;
        }
        if let Some(m) = args.default_roce_mode {
            d.default_roce_mode = Some(m);
        }
        if let Some(t) = args.cm_response_timeout {
            d.cm_response_timeout = t;
        }
        if let Some(r) = args.cm_max_retries {
            d.cm_max_retries = r;
        }
        if let Some(m) = args.loss_recovery {
            d.loss_recovery = m;
        }
        if let Some(b) = args.selective_bdp {
            d.selective_bdp = b;
        }
        d.local_via_socket |= args.local_via_socket;
        d.gso &= !args.no_gso;
        if let Some(cc) = args.cc {
            d.cc = cc;
        }
        for p in &args.cc_params {
            d.add_cc_param(p)?;
        }
        config.devices.push(d);
    }
    config.allow_uid.extend(args.allow_uid);
    config.allow_group.extend(args.allow_group);
    if let Some(n) = args.max_connections {
        config.max_connections = n;
    }
    if let Some(n) = args.max_connections_per_uid {
        config.max_connections_per_uid = n;
    }
    let socket = config::socket_path(args.socket.as_deref().or(config.socket.as_deref()));
    server::run_with(config, args.config.clone(), socket, args.port)
}

fn run(socket: Option<&Path>, verbose: bool, command: &[String]) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let shim = cli::shim_path()?;
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(old) if !old.is_empty() => format!("{}:{old}", shim.display()),
        _ => shim.display().to_string(),
    };
    let socket_path = config::socket_path(socket);
    let mut cmd = std::process::Command::new(&command[0]);
    cmd.args(&command[1..])
        .env("LD_PRELOAD", &preload)
        .env("SOFTROCE_SOCKET", &socket_path);
    let say = |line: String| {
        if verbose {
            eprintln!("softroce run: {line}");
        }
    };
    say(format!("LD_PRELOAD={preload}"));
    say(format!("SOFTROCE_SOCKET={}", socket_path.display()));
    // The stacks' variables name the daemon's devices; without a daemon there is nothing to
    // name (the shim itself then says so on the program's first verb).
    let devices = ctl::Client::connect(&socket_path, "softroce run").and_then(|mut c| {
        match c.request(&Request::QueryDevices)? {
            Response::Devices(d) => Ok(d),
            other => bail!("unexpected answer to QueryDevices: {other:?}"),
        }
    });
    match devices {
        Ok(devices) => {
            let is_set = |name: &str| std::env::var_os(name).is_some();
            for s in softroce_daemon::stack_env::stack_env(&devices, &is_set) {
                say(format!("{}={} ({})", s.name, s.value, s.why));
                cmd.env(s.name, &s.value);
            }
            for name in ["UCX_NET_DEVICES", "OMPI_MCA_pml_ucx_devices"] {
                if let Ok(v) = std::env::var(name) {
                    say(format!("{name}={v} (kept: set by you)"));
                }
            }
        }
        Err(e) => say(format!("no stack variables set: {e:#}")),
    }
    let err = cmd.exec();
    Err(err).with_context(|| format!("cannot run {}", command[0]))
}

fn pcap_check(files: &[PathBuf], verbose: bool) -> ExitCode {
    let mut unreadable = false;
    let mut bad = false;
    for path in files {
        let mut print = |line: String| println!("{line}");
        let sink: Option<&mut dyn FnMut(String)> = if verbose { Some(&mut print) } else { None };
        // A capture library bug must not take the whole run down: treat a panic as unreadable.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pcap::check::check_file(path, sink)
        }));
        match result {
            Ok(Ok(report)) => {
                print!(
                    "{}",
                    pcap::check::summary(&path.display().to_string(), &report)
                );
                bad |= !report.is_clean();
            }
            Ok(Err(e)) => {
                eprintln!("softroce: cannot read {}: {e}", path.display());
                unreadable = true;
            }
            Err(_) => {
                eprintln!(
                    "softroce: cannot read {}: the capture reader failed",
                    path.display()
                );
                unreadable = true;
            }
        }
    }
    if unreadable {
        ExitCode::from(2)
    } else if bad {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Rust ignores SIGPIPE, so `softroce pcap check -v | head` would fail on a closed pipe. A
/// command-line tool should simply stop, as C tools do.
fn restore_default_sigpipe() {
    // SAFETY: setting a signal's disposition to SIG_DFL installs no handler and touches no
    // memory; it happens before any thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
