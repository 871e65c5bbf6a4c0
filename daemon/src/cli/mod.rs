//! The operator's commands (`softroce link|stat|res|capture|fault|doctor`): each talks to a
//! running daemon over its control socket (`--socket`, `$SOFTROCE_SOCKET`, ...), prints what
//! it learns in the look of the kernel's `rdma` tool, or JSON with `-j`.
//!
//! Exit status: 0 when the command did what it was asked; 1 when the daemon refused or the
//! operation failed (and for `doctor`, when a check failed); 2 for a usage error or when no
//! daemon answers at the socket.

pub mod capture;
pub mod doctor;
pub mod fault;
pub mod link;
pub mod res;
pub mod stat;

use crate::{config, ctl};
use anyhow::{anyhow, bail, Result};
use proto::ctl::{Request, Response};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// A command's failure and the exit status it means.
#[derive(Debug)]
pub struct Failure {
    pub status: u8,
    pub error: anyhow::Error,
}

impl Failure {
    /// The request was refused or failed: exit status 1.
    pub fn failed(error: impl Into<anyhow::Error>) -> Failure {
        Failure {
            status: 1,
            error: error.into(),
        }
    }

    /// A usage error, or no daemon to talk to: exit status 2.
    pub fn usage(error: impl Into<anyhow::Error>) -> Failure {
        Failure {
            status: 2,
            error: error.into(),
        }
    }
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(e: E) -> Failure {
        Failure::failed(e)
    }
}

pub type CliResult = Result<(), Failure>;

/// Prints the failure and turns it into the exit status.
pub fn finish(result: CliResult) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("softroce: {:#}", f.error);
            ExitCode::from(f.status)
        }
    }
}

/// A connection to the daemon for one command.
pub struct Session {
    client: ctl::Client,
    pub socket: PathBuf,
}

impl Session {
    /// Connects to the daemon at `--socket` (else `$SOFTROCE_SOCKET`, ...); no daemon there
    /// is exit status 2.
    pub fn open(socket: Option<&Path>, command: &str) -> Result<Session, Failure> {
        let socket = config::socket_path(socket);
        let client = ctl::Client::connect(&socket, &format!("softroce {command}"))
            .map_err(Failure::usage)?;
        Ok(Session { client, socket })
    }

    /// One request; an error answer is exit status 1 with the daemon's message.
    pub fn ask(&mut self, request: &Request) -> Result<Response, Failure> {
        self.ask_fds(request, &[]).map(|(r, _)| r)
    }

    pub fn ask_fds(
        &mut self,
        request: &Request,
        fds: &[std::os::fd::RawFd],
    ) -> Result<(Response, Vec<std::os::fd::OwnedFd>), Failure> {
        match self.client.request_fds(request, fds)? {
            (Response::Error { errno, message }, _) => Err(Failure::failed(anyhow!(
                "{message} ({})",
                nix::errno::Errno::from_raw(errno).desc()
            ))),
            other => Ok(other),
        }
    }

    /// The control connection itself (`capture` closes it to stop).
    pub fn into_client(self) -> ctl::Client {
        self.client
    }
}

/// Prints `value` as JSON on one line (what `rdma -j` does).
pub fn print_json(value: &serde_json::Value) {
    println!("{value}");
}

/// A daemon answer that is not the one the request calls for.
pub fn unexpected(r: Response) -> Failure {
    Failure::failed(anyhow!("unexpected answer from the daemon: {r:?}"))
}

/// A GID as `rdma`/`ibv_devinfo` print it: eight groups of four hex digits.
pub fn gid_string(gid: &[u8; 16]) -> String {
    gid.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// The IP address a RoCE v2 GID stands for.
pub fn gid_addr(gid: &[u8; 16]) -> std::net::IpAddr {
    let v6 = std::net::Ipv6Addr::from(*gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => v4.into(),
        None => v6.into(),
    }
}

/// Finds libsoftroce.so: $SOFTROCE_SHIM, else beside this executable (cargo puts both in
/// `target/<profile>/`), else the system library path.
pub fn shim_path() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("SOFTROCE_SHIM").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    let beside = exe.with_file_name("libsoftroce.so");
    if beside.exists() {
        return Ok(beside);
    }
    for dir in ["/usr/local/lib", "/usr/lib"] {
        let p = Path::new(dir).join("libsoftroce.so");
        if p.exists() {
            return Ok(p);
        }
    }
    bail!(
        "libsoftroce.so not found beside {} (build it with `cargo build -p softroce-shim`, or set SOFTROCE_SHIM)",
        exe.display()
    )
}
