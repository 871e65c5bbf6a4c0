//! The control socket: a Unix `SOCK_SEQPACKET` socket, one message per request or response
//! (encoded by `proto::ctl`), with file descriptors passed as `SCM_RIGHTS`. Every client's
//! credentials are checked when it connects.

use anyhow::{anyhow, bail, Context, Result};
use nix::sys::socket::{
    self, accept4, bind, connect, getsockopt, listen, recvmsg, sendmsg, socket, sockopt,
    AddressFamily, Backlog, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType,
    UnixAddr, UnixCredentials,
};
use proto::ctl::{self, Request, Response, MAX_MESSAGE, PROTOCOL_VERSION};
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

/// A connected control socket, either end.
#[derive(Debug)]
pub struct Conn {
    fd: OwnedFd,
}

impl Conn {
    /// Sends one message, with `fds` attached.
    pub fn send(&self, bytes: &[u8], fds: &[RawFd]) -> Result<()> {
        let iov = [IoSlice::new(bytes)];
        let cmsg = [ControlMessage::ScmRights(fds)];
        let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
        sendmsg::<()>(
            self.fd.as_raw_fd(),
            &iov,
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .context("sending a control message")?;
        Ok(())
    }

    /// Receives one message into `buf`; returns its length (0 on orderly shutdown) and any
    /// file descriptors that came with it, now owned by the caller.
    pub fn recv(&self, buf: &mut [u8]) -> Result<(usize, Vec<OwnedFd>)> {
        self.recv_flags(buf, MsgFlags::empty())
    }

    /// [`Conn::recv`] of a message that is already there (EAGAIN otherwise).
    pub fn recv_nowait(&self, buf: &mut [u8]) -> Result<(usize, Vec<OwnedFd>)> {
        self.recv_flags(buf, MsgFlags::MSG_DONTWAIT)
    }

    fn recv_flags(&self, buf: &mut [u8], flags: MsgFlags) -> Result<(usize, Vec<OwnedFd>)> {
        let mut iov = [IoSliceMut::new(buf)];
        let mut space = nix::cmsg_space!([RawFd; 8]);
        let msg = recvmsg::<()>(
            self.fd.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC | flags,
        )
        .context("receiving a control message")?;
        let mut fds = Vec::new();
        for c in msg.cmsgs().context("reading control data")? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // SAFETY: the kernel just installed these descriptors in our table for us.
                fds.extend(
                    raw.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        if msg.flags.contains(MsgFlags::MSG_TRUNC) {
            bail!("control message larger than {} bytes", buf.len());
        }
        Ok((msg.bytes, fds))
    }

    /// The peer's pid, uid and gid, as the kernel saw them at connect time.
    pub fn peer_credentials(&self) -> Result<UnixCredentials> {
        Ok(getsockopt(&self.fd, sockopt::PeerCredentials)?)
    }

    /// A second handle on the same connection.
    pub fn try_clone(&self) -> Result<Conn> {
        Ok(Conn {
            fd: self.fd.try_clone()?,
        })
    }

    /// The socket, for the peer queries of [`crate::peer`] and for polling.
    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }
}

/// An error when a live daemon answers at `path`. The daemon asks this before anything else
/// (its devices' ports would be taken too, and "address in use" would hide the reason), and
/// again when it binds the path.
pub fn refuse_if_served(path: &Path) -> Result<()> {
    if path.exists() && Client::connect_raw(path).is_ok() {
        bail!(
            "another softroce daemon is already serving {} (give --socket to run a second one)",
            path.display()
        );
    }
    Ok(())
}

/// The daemon's listening socket; removes its path when dropped.
#[derive(Debug)]
pub struct Listener {
    fd: OwnedFd,
    path: PathBuf,
}

impl Listener {
    /// Binds `path` with the daemon's default mode, 0600 (its own user only).
    pub fn bind(path: &Path) -> Result<Listener> {
        Listener::bind_with(path, 0o600, None)
    }

    /// Binds `path` with file mode `mode`, owned by `group` if given (see
    /// [`crate::access::AccessPolicy::socket_mode`]). A live daemon already there is an error;
    /// a stale socket file left by a crashed one is replaced.
    pub fn bind_with(path: &Path, mode: u32, group: Option<u32>) -> Result<Listener> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        if path.exists() {
            refuse_if_served(path)?;
            std::fs::remove_file(path)
                .with_context(|| format!("removing stale socket {}", path.display()))?;
        }
        let fd = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )?;
        // Bind under a temporary name and rename into place once listening, so that a client
        // never finds the path before connections are accepted.
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".{}.tmp", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let _ = std::fs::remove_file(&tmp);
        let addr = UnixAddr::new(&tmp)?;
        // (Until the mode is set the file has the umask's; a peer that connects meanwhile is
        // still checked by the daemon, and the path is only placed once the mode is right.)
        bind(fd.as_raw_fd(), &addr).with_context(|| format!("binding {}", tmp.display()))?;
        if let Some(gid) = group {
            std::os::unix::fs::chown(&tmp, None, Some(gid))
                .with_context(|| format!("giving {} to group {gid}", tmp.display()))?;
        }
        // Connecting needs write permission on the file; the daemon checks each client's
        // credentials too (crate::access).
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))?;
        listen(&fd, Backlog::new(128)?)?;
        std::fs::rename(&tmp, path).with_context(|| format!("placing {}", path.display()))?;
        Ok(Listener {
            fd,
            path: path.to_path_buf(),
        })
    }

    pub fn accept(&self) -> Result<Conn> {
        let fd = accept4(self.fd.as_raw_fd(), SockFlag::SOCK_CLOEXEC)?;
        // SAFETY: accept4 returned a new descriptor that nothing else owns.
        Ok(Conn {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Makes a blocked `accept` return, for shutdown.
    pub fn shutdown(&self) {
        let _ = socket::shutdown(self.fd.as_raw_fd(), socket::Shutdown::Both);
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The client side, for `softroce res show` and tests. (The shim has its own, inside the
/// application process.)
#[derive(Debug)]
pub struct Client {
    conn: Conn,
    pub client_id: u64,
}

impl Client {
    /// Connects without introducing itself (`doctor` looks at the peer's credentials first).
    pub fn connect_raw(path: &Path) -> Result<Conn> {
        let fd = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )?;
        connect(fd.as_raw_fd(), &UnixAddr::new(path)?)?;
        Ok(Conn { fd })
    }

    /// Connects and introduces itself.
    pub fn connect(path: &Path, program: &str) -> Result<Client> {
        let conn = Client::connect_raw(path).with_context(|| {
            format!(
                "cannot reach the softroce daemon at {} (is `softroce daemon` running?)",
                path.display()
            )
        })?;
        Client::from_conn(conn, program)
    }

    /// Introduces itself on a connection made with [`Client::connect_raw`].
    pub fn from_conn(conn: Conn, program: &str) -> Result<Client> {
        let mut c = Client { conn, client_id: 0 };
        match c.request(&Request::Hello {
            version: PROTOCOL_VERSION,
            program: program.to_string(),
        })? {
            Response::Hello { client, .. } => c.client_id = client,
            // A daemon older than `ctl::version_mismatch` says only the two versions.
            Response::Error { message, errno }
                if errno == libc::EPROTO && !message.contains("restart") =>
            {
                bail!("daemon refused us: {message}; restart the daemon with this softroce build")
            }
            Response::Error { message, .. } => bail!("daemon refused us: {message}"),
            other => bail!("unexpected answer to hello: {other:?}"),
        }
        Ok(c)
    }

    pub fn request(&mut self, req: &Request) -> Result<Response> {
        Ok(self.request_fds(req, &[])?.0)
    }

    /// A request with file descriptors attached; returns the response and the descriptors
    /// that came with it.
    pub fn request_fds(
        &mut self,
        req: &Request,
        fds: &[RawFd],
    ) -> Result<(Response, Vec<OwnedFd>)> {
        let sent = self.conn.send(&ctl::encode(req)?, fds);
        let mut buf = vec![0u8; MAX_MESSAGE];
        // A daemon that refuses a connection answers and closes before it reads the hello:
        // its answer is still there to say why.
        // (Closed with our message unread, the socket reports ECONNRESET once before the
        // answer queued ahead of it.)
        let received = match sent {
            Ok(()) => self
                .conn
                .recv(&mut buf)
                .or_else(|e| self.conn.recv_nowait(&mut buf).map_err(|_| e)),
            Err(e) => self.conn.recv_nowait(&mut buf).map_err(|_| e),
        };
        let (n, fds) = received?;
        if n == 0 {
            return Err(anyhow!("the daemon closed the connection"));
        }
        Ok((ctl::decode(&buf[..n])?, fds))
    }
}
