//! A control connection belongs to the process that opened it: once that process exits, the
//! connection is closed by the daemon even when another process holds its descriptor (passed
//! with SCM_RIGHTS), and its resources are freed; a connection whose process is already gone
//! is never served. Control connections are bounded, per user and in all, with EAGAIN.

mod support;

use proto::ctl::{self, Request, Response, MAX_MESSAGE, PROTOCOL_VERSION};
use softroce_daemon::ctl::Client;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::client::*;

/// A Python program (the system's) that connects to the daemon, optionally introduces
/// itself with the hello bytes given in hex, hands the connection to its parent over fd 3 and
/// exits when told to (a line on stdin).
const HANDOVER: &str = r#"
import socket, sys
path, hello = sys.argv[1], bytes.fromhex(sys.argv[2])
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(path)
if hello:
    s.send(hello)
    s.recv(65536)
parent = socket.socket(fileno=3)
socket.send_fds(parent, [b"x"], [s.fileno()])
print("handed over", flush=True)
sys.stdin.readline()
"#;

/// Runs [`HANDOVER`]; returns the connection it opened, once it has exited.
fn connection_of_an_exited_process(socket: &std::path::Path, hello: &[u8]) -> OwnedFd {
    let (ours, theirs) = nix::sys::socket::socketpair(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::Datagram,
        None,
        nix::sys::socket::SockFlag::empty(),
    )
    .unwrap();
    let theirs_raw = theirs.as_raw_fd();
    let mut cmd = Command::new("/usr/bin/python3");
    cmd.arg("-c")
        .arg(HANDOVER)
        .arg(socket)
        .arg(hello.iter().map(|b| format!("{b:02x}")).collect::<String>())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    // SAFETY: only dup2 (async-signal-safe) between fork and exec.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            if libc::dup2(theirs_raw, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("/usr/bin/python3");
    drop(theirs);
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "handed over\n");
    let mut buf = [0u8; 8];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let msg = nix::sys::socket::recvmsg::<()>(
        ours.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        nix::sys::socket::MsgFlags::empty(),
    )
    .unwrap();
    let fd = msg
        .cmsgs()
        .unwrap()
        .find_map(|c| match c {
            nix::sys::socket::ControlMessageOwned::ScmRights(fds) => fds.first().copied(),
            _ => None,
        })
        .expect("the connection's descriptor");
    child.stdin.take().unwrap().write_all(b"exit\n").unwrap();
    child.wait().unwrap();
    // SAFETY: the kernel installed this descriptor for us.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Sends `req` on a raw connection; the answer, or `None` when the daemon closed it.
fn ask(fd: &OwnedFd, req: &Request) -> Option<Response> {
    let sent = nix::sys::socket::send(
        fd.as_raw_fd(),
        &ctl::encode(req).unwrap(),
        nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
    );
    if sent.is_err() {
        return None;
    }
    let mut buf = vec![0u8; MAX_MESSAGE];
    match nix::sys::socket::recv(
        fd.as_raw_fd(),
        &mut buf,
        nix::sys::socket::MsgFlags::empty(),
    ) {
        Ok(n) if n > 0 => Some(ctl::decode(&buf[..n]).unwrap()),
        _ => None,
    }
}

fn hello() -> Request {
    Request::Hello {
        version: PROTOCOL_VERSION,
        program: "handover".into(),
    }
}

fn clients(socket: &std::path::Path) -> Vec<ctl::ClientResources> {
    let mut c = Client::connect(socket, "res-show").unwrap();
    match c.request(&Request::ResShow).unwrap() {
        Response::Resources { clients, .. } => clients,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_connection_dies_with_its_process_even_when_passed_on() {
    let daemon = start_daemon_with("handover", &["--addr", "127.0.0.71", "--port", "0"], &[]);
    // Introduced, then handed over: the daemon closes it when the process exits.
    let conn = connection_of_an_exited_process(&daemon.socket, &ctl::encode(&hello()).unwrap());
    let answer = ask(&conn, &Request::QueryDevices);
    assert!(
        answer.is_none(),
        "the connection of an exited process was served: {answer:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while clients(&daemon.socket)
        .iter()
        .any(|c| c.program == "handover")
    {
        assert!(
            Instant::now() < deadline,
            "the exited client is still listed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // Never introduced: its hello, sent by another process, is not served either.
    let conn = connection_of_an_exited_process(&daemon.socket, &[]);
    match ask(&conn, &hello()) {
        None => {}
        Some(Response::Error { errno, .. }) => assert_eq!(errno, libc::ESRCH),
        Some(other) => panic!("a connection whose process is gone was served: {other:?}"),
    }
    assert!(!clients(&daemon.socket)
        .iter()
        .any(|c| c.program == "handover"));
}

#[test]
fn control_connections_are_capped_per_user_and_in_all() {
    let daemon = start_daemon_with(
        "conn-caps",
        &[
            "--addr",
            "127.0.0.72",
            "--port",
            "0",
            "--max-connections",
            "5",
            "--max-connections-per-uid",
            "3",
        ],
        &[],
    );
    let mut held: Vec<Client> = (0..3)
        .map(|i| Client::connect(&daemon.socket, &format!("c{i}")).unwrap())
        .collect();
    let why = Client::connect(&daemon.socket, "one too many")
        .unwrap_err()
        .to_string();
    assert!(why.contains("max_connections_per_uid"), "{why}");
    // A slot comes back when a connection closes.
    held.pop();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match Client::connect(&daemon.socket, "again") {
            Ok(c) => {
                held.push(c);
                break;
            }
            Err(e) => {
                assert!(Instant::now() < deadline, "no slot came back: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    // Hundreds of attempts beyond the cap leave the daemon serving.
    for _ in 0..300 {
        assert!(Client::connect(&daemon.socket, "flood").is_err());
    }
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Ok(mut c) = Client::connect(&daemon.socket, "after") {
            assert!(matches!(
                c.request(&Request::QueryDevices).unwrap(),
                Response::Devices(_)
            ));
            break;
        }
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
}
