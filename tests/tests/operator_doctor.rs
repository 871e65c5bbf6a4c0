//! `softroce doctor`: passes here with a daemon serving its port and the shim built, and in
//! each of three broken set-ups names the problem in plain words and exits 1: no daemon, a
//! daemon of another user on the socket, the RoCE port taken by another program; and warns
//! when the daemon's rdma_cm cannot ask the kernel for neighbours.

mod shim_support;

use shim_support::netns::Netns;
use shim_support::{require_program, shim_libs, softroce_bin, Daemon};
use std::process::{Command, Output};

fn doctor(socket: &std::path::Path, port: u16) -> (Output, String) {
    let out = Command::new(softroce_bin())
        .args(["doctor", "--port", &port.to_string(), "--socket"])
        .arg(socket)
        .env("SOFTROCE_SHIM", &shim_libs().preload)
        .output()
        .expect("run softroce doctor");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out, text)
}

#[test]
fn doctor_passes_with_a_daemon_serving_its_port() {
    let d = Daemon::start("op-doctor-ok", &["--addr", "127.0.0.142", "--port", "4793"]);
    let (out, text) = doctor(&d.socket, 4793);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("all is well"), "{text}");
    assert!(
        text.contains(&format!("softroce daemon pid {}", d.pid())),
        "{text}"
    );
    assert!(
        text.contains("UDP port 4793 is served by the daemon"),
        "{text}"
    );
    assert!(
        text.contains("ibv_devices lists the daemon's devices"),
        "{text}"
    );
    // The tests run as root: the daemon may ask the kernel to resolve neighbours.
    assert!(
        text.contains("ok    neighbours rdma_cm waits for a peer to answer ARP")
            && text.contains("(the daemon has CAP_NET_ADMIN)"),
        "{text}"
    );
    let json = Command::new(softroce_bin())
        .args(["doctor", "-j", "--port", "4793", "--socket"])
        .arg(&d.socket)
        .env("SOFTROCE_SHIM", &shim_libs().preload)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).expect("doctor -j prints JSON");
    assert!(
        v.as_array().unwrap().iter().all(|c| c["status"] != "fail"),
        "{v}"
    );
}

#[test]
fn doctor_passes_beside_another_daemon_on_the_same_port() {
    // Two daemons on one host (the README's "More than one host"): each binds its own
    // addresses on the port, and neither takes the other's packets.
    let a = Daemon::start("op-doctor-a", &["--addr", "127.0.0.145", "--port", "4797"]);
    let b = Daemon::start("op-doctor-b", &["--addr", "127.0.0.146", "--port", "4797"]);
    let (out, text) = doctor(&a.socket, 4797);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains(&format!(
            "UDP port 4797 is served by the daemon (also bound by pid {}",
            b.pid()
        )),
        "{text}"
    );
}

#[test]
fn doctor_says_the_stacks_need_no_replacement_library() {
    // The stacks run under `softroce run` with the preloaded shim alone (scripts/stacks-test):
    // without the replacement libibverbs.so.1 beside the shim, nothing is wrong for them.
    for stack in ["ucx_info", "fi_info", "mpirun"] {
        shim_support::require_program(stack);
    }
    let d = Daemon::start(
        "op-doctor-dlopen",
        &["--addr", "127.0.0.147", "--port", "4798"],
    );
    let dir = shim_support::programs::scratch("operator", "doctor-dlopen");
    let alone = dir.join("libsoftroce.so");
    std::fs::copy(&shim_libs().preload, &alone).expect("copy the shim");
    assert!(!dir.join("replacement").exists());
    let out = Command::new(softroce_bin())
        .args(["doctor", "--port", "4798", "--socket"])
        .arg(&d.socket)
        .env("SOFTROCE_SHIM", &alone)
        .output()
        .expect("run softroce doctor");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let line = text
        .lines()
        .find(|l| l.contains(" dlopen "))
        .unwrap_or_else(|| panic!("no dlopen check: {text}"));
    assert!(line.starts_with("ok"), "{line}");
    assert!(
        line.contains("UCX, libfabric and Open MPI reach the shim under `softroce run`"),
        "{line}"
    );
}

#[test]
fn doctor_names_a_missing_daemon() {
    let dir = shim_support::programs::scratch("operator", "doctor-none");
    let (out, text) = doctor(&dir.join("nobody-here.sock"), 4794);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("FAIL  daemon     no softroce daemon"),
        "{text}"
    );
    assert!(text.contains("fix: start one: `softroce daemon"), "{text}");
}

#[test]
fn doctor_names_a_daemon_of_another_user() {
    // A daemon running as nobody, on a socket in a directory nobody may write.
    let dir = shim_support::programs::scratch("operator", "doctor-other-user");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let socket = dir.join("ctl.sock");
    let _ = std::fs::remove_file(&socket);
    let mut daemon = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(softroce_bin())
        .args(["daemon", "--addr", "127.0.0.143", "--port", "0", "--socket"])
        .arg(&socket)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start a daemon as nobody (setpriv)");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !socket.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the nobody daemon never served"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (out, text) = doctor(&socket, 4795);
    let _ = daemon.kill();
    let _ = daemon.wait();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("runs as uid 65534, you are uid 0"), "{text}");
    assert!(text.contains("fix: run a daemon of your own"), "{text}");
}

#[test]
fn doctor_names_the_program_that_holds_the_port() {
    let d = Daemon::start("op-doctor-port", &["--addr", "127.0.0.144"]);
    let _squatter = std::net::UdpSocket::bind("0.0.0.0:4796").expect("bind UDP 4796");
    let (out, text) = doctor(&d.socket, 4796);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!(
            "UDP port 4796 is taken by pid {}",
            std::process::id()
        )),
        "{text}"
    );
}

/// A daemon without CAP_NET_ADMIN, in a namespace whose ping sockets nobody may open: doctor
/// warns that rdma_cm cannot wait for a peer's ARP answer and says how to allow it; once its
/// group may open ping sockets, all is well on that line.
#[test]
fn doctor_says_when_rdma_cm_cannot_ask_for_neighbours() {
    let ns = Netns::new("doctor-neigh");
    let setpriv = require_program("setpriv");
    let d = Daemon::start_wrapped(
        "op-doctor-neigh",
        Some(&ns.name),
        &[
            setpriv.to_str().unwrap(),
            "--bounding-set=-net_admin",
            "--inh-caps=-net_admin",
        ],
        &["--addr", "127.0.0.1", "--port", "4791"],
    );
    let neighbours_line = || {
        let out = ns
            .command(softroce_bin())
            .args(["doctor", "--port", "4791", "--socket"])
            .arg(&d.socket)
            .output()
            .expect("run softroce doctor");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let line = text
            .lines()
            .skip_while(|l| !l.contains(" neighbours "))
            .take(2);
        line.collect::<Vec<_>>().join("\n")
    };
    ns.sysctl("net.ipv4.ping_group_range", "1 0");
    let warned = neighbours_line();
    assert!(
        warned.starts_with("warn  neighbours rdma_cm cannot have the kernel resolve a peer"),
        "{warned}"
    );
    assert!(
        warned.contains("fix: give the daemon CAP_NET_ADMIN"),
        "{warned}"
    );
    ns.sysctl("net.ipv4.ping_group_range", "0 2147483647");
    let allowed = neighbours_line();
    assert!(
        allowed.starts_with("ok    neighbours rdma_cm waits for a peer")
            && allowed.contains("may open ping sockets"),
        "{allowed}"
    );
}
