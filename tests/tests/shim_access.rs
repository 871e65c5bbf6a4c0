//! Who may use a daemon: its control socket is its own user's (mode 0600) unless it is started
//! with `--allow-uid` / `--allow-group`, and it checks every client's credentials itself (a
//! root daemon too), so a socket made wider by hand lets nobody else in. A refused program
//! gets one clear line from the shim and no device. The other user here is `nobody` (65534),
//! run with `setpriv` (the tests run as root inside `inns`); an allowed one moves data.

mod shim_support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};

use shim_support::programs::{scratch, tcp_listening, Logged};
use shim_support::{require_program, shim_libs, Daemon};

const NOBODY: u32 = 65534;

/// `program args` as uid/gid `uid` with no supplementary groups (or `groups`), with the shim
/// preloaded and pointed at `daemon`.
fn as_user(daemon: &Daemon, uid: u32, groups: &[u32], program: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(require_program("setpriv"));
    cmd.arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"));
    if groups.is_empty() {
        cmd.arg("--clear-groups");
    } else {
        let list: Vec<String> = groups.iter().map(u32::to_string).collect();
        cmd.arg(format!("--groups={}", list.join(",")));
    }
    cmd.arg("--")
        .arg(program)
        .args(args)
        .env("LD_PRELOAD", &shim_libs().preload)
        .env("SOFTROCE_SOCKET", &daemon.socket);
    cmd
}

fn run(mut cmd: Command) -> Output {
    cmd.output().expect("run the program")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The shim's lines on stderr (each starts "softroce:").
fn shim_lines(out: &Output) -> Vec<String> {
    text(&out.stderr)
        .lines()
        .filter(|l| l.starts_with("softroce:"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_socket_is_the_daemons_users_and_others_are_refused_with_one_line() {
    let daemon = Daemon::start("access-closed", &[]);
    let meta = std::fs::metadata(&daemon.socket).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o600, "the control socket's mode");
    let devices = require_program("ibv_devices");

    // The file's mode keeps nobody out; the shim says why, once.
    let out = run(as_user(&daemon, NOBODY, &[], &devices, &[]));
    let lines = shim_lines(&out);
    assert_eq!(
        lines.len(),
        1,
        "one line from the shim:\n{}",
        text(&out.stderr)
    );
    assert!(
        lines[0].contains("refused this process: permission denied")
            && lines[0].contains("mode 600")
            && lines[0].contains("uid 65534")
            && lines[0].contains("--allow-uid"),
        "{}",
        lines[0]
    );
    assert!(
        !text(&out.stdout).contains("srxe0"),
        "{}",
        text(&out.stdout)
    );

    // Made wider by hand, the socket still serves only the daemon's user: the daemon (root
    // here) checks the credentials of every connection.
    std::fs::set_permissions(&daemon.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = run(as_user(&daemon, NOBODY, &[], &devices, &[]));
    let lines = shim_lines(&out);
    assert_eq!(
        lines.len(),
        1,
        "one line from the shim:\n{}",
        text(&out.stderr)
    );
    assert!(
        lines[0].contains("uid 65534 may not use this daemon: it serves uid 0 only"),
        "{}",
        lines[0]
    );
    assert!(!text(&out.stdout).contains("srxe0"));
    assert!(daemon.log().contains("client refused"), "{}", daemon.log());

    // The daemon's own user is served.
    let out = daemon.command(&devices).output().unwrap();
    assert!(text(&out.stdout).contains("srxe0"), "{}", text(&out.stderr));
}

#[test]
fn a_group_opens_the_socket_to_its_members_only() {
    let daemon = Daemon::start("access-group", &["--allow-group", "65533"]);
    let meta = std::fs::metadata(&daemon.socket).unwrap();
    assert_eq!((meta.mode() & 0o777, meta.gid()), (0o660, 65533));
    let devices = require_program("ibv_devices");
    let member = run(as_user(&daemon, NOBODY, &[65533], &devices, &[]));
    assert!(
        text(&member.stdout).contains("srxe0"),
        "a member of the group:\n{}",
        text(&member.stderr)
    );
    let other = run(as_user(&daemon, NOBODY, &[], &devices, &[]));
    assert!(!text(&other.stdout).contains("srxe0"));
    assert_eq!(shim_lines(&other).len(), 1, "{}", text(&other.stderr));
}

#[test]
fn an_allowed_user_moves_data_through_a_root_daemon() {
    let daemon = Daemon::start(
        "access-uid",
        &[
            "--allow-uid",
            "nobody",
            "--addr",
            "127.0.0.61",
            "--port",
            "4791",
        ],
    );
    let meta = std::fs::metadata(&daemon.socket).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o666);
    let pingpong = require_program("ibv_rc_pingpong");
    // (The logs are written by this process; only the programs run as nobody.)
    let dir = scratch("access", "uid");
    let port = "18661";
    let common = ["-d", "srxe0", "-g", "0", "-p", port, "-n", "50"];
    let mut server = Logged::spawn(
        as_user(&daemon, NOBODY, &[], &pingpong, &common),
        dir.join("server.log"),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !tcp_listening(18661) {
        assert!(
            std::time::Instant::now() < deadline
                && server.wait_for(std::time::Duration::ZERO).is_none(),
            "server never listened:\n{}\n{}",
            server.output(),
            daemon.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut args = common.to_vec();
    args.push("127.0.0.1");
    let mut client = Logged::spawn(
        as_user(&daemon, NOBODY, &[], &pingpong, &args),
        dir.join("client.log"),
    );
    let limit = std::time::Duration::from_secs(60);
    let (c, s) = (client.wait_for(limit), server.wait_for(limit));
    assert!(
        c.is_some_and(|s| s.success()) && s.is_some_and(|s| s.success()),
        "pingpong as nobody:\n--- server\n{}\n--- client\n{}\n--- daemon\n{}",
        server.output(),
        client.output(),
        daemon.log()
    );
    assert!(client.output().contains("bytes in"), "{}", client.output());
}
