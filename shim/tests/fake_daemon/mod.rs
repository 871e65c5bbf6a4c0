//! A stand-in for `softroce daemon` inside the test process, speaking the real control
//! protocol (`proto::ctl`) on a real SEQPACKET socket, so the shim's daemon path runs
//! unchanged without building the daemon. It serves one device, `srxe0` on loopback, and can
//! hang up on every client to simulate the daemon dying.

#![allow(dead_code)]

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use nix::sys::socket::{
    accept, bind, listen, recv, sendmsg, socket, AddressFamily, Backlog, ControlMessage, MsgFlags,
    SockFlag, SockType, UnixAddr,
};
use proto::ctl::{self, gid_of, DeviceInfo, GidEntry, Request, Response, RoceVersion};

/// The rdma_cm side of the stand-in: each channel's daemon end (so a test can write events
/// on it) and the channel each id reports to.
#[derive(Default)]
pub struct CmState {
    pub channels: HashMap<u32, OwnedFd>,
    pub ids: HashMap<u32, u32>,
    /// Ids destroyed, in order.
    pub destroyed: Vec<u32>,
}

pub struct FakeDaemon {
    pub path: PathBuf,
    pub cm: Arc<Mutex<CmState>>,
    /// Every accepted client connection, so [`FakeDaemon::hang_up`] can close them.
    clients: Arc<Mutex<Vec<OwnedFd>>>,
    pub hellos: Arc<AtomicU64>,
}

/// The device the stand-in serves: like the real daemon's default `srxe0`.
pub fn srxe0() -> DeviceInfo {
    let guid = [0x00, 0x53, 0x52, 0xff, 0xfe, 0x58, 0x45, 0x00];
    let mut gid0 = [0u8; 16];
    gid0[0] = 0xfe;
    gid0[1] = 0x80;
    gid0[8..].copy_from_slice(&guid);
    let entry = |index, gid| GidEntry {
        index,
        gid,
        roce: RoceVersion::V2,
    };
    DeviceInfo {
        name: "srxe0".into(),
        node_guid: u64::from_be_bytes(guid),
        roce: RoceVersion::V2,
        max_mtu: 5,
        active_mtu: 5,
        port_active: true,
        gids: vec![
            entry(0, gid0),
            entry(1, gid_of("127.0.0.1".parse().unwrap())),
            entry(2, gid_of("::1".parse().unwrap())),
        ],
        netdevs: vec![],
        max_cqe: 32767,
        limits: Default::default(),
        speed_mbps: 100_000,
    }
}

impl FakeDaemon {
    /// Listens on a fresh socket and points `$SOFTROCE_SOCKET` at it. Call before the first
    /// verb of the process (the shim reads the variable once).
    pub fn start(name: &str) -> FakeDaemon {
        let dir = std::env::temp_dir().join(format!("softroce-fake-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ctl.sock");
        let listener = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        bind(listener.as_raw_fd(), &UnixAddr::new(&path).unwrap()).unwrap();
        listen(&listener, Backlog::new(16).unwrap()).unwrap();
        std::env::set_var("SOFTROCE_SOCKET", &path);
        let clients = Arc::new(Mutex::new(Vec::new()));
        let hellos = Arc::new(AtomicU64::new(0));
        let cm = Arc::new(Mutex::new(CmState::default()));
        let (c, h, state) = (clients.clone(), hellos.clone(), cm.clone());
        std::thread::spawn(move || loop {
            let Ok(fd) = accept(listener.as_raw_fd()) else {
                return;
            };
            // SAFETY: accept returned a new descriptor.
            let conn = unsafe { OwnedFd::from_raw_fd(fd) };
            let raw = conn.as_raw_fd();
            c.lock().unwrap().push(conn);
            let h = h.clone();
            let state = state.clone();
            std::thread::spawn(move || serve(raw, &h, &state));
        });
        FakeDaemon {
            path,
            cm,
            clients,
            hellos,
        }
    }

    /// Writes one rdma_cm event on the channel of `msg.id` (the listener's for a request).
    pub fn send_event(&self, msg: &ctl::CmEventMsg) {
        let st = self.cm.lock().unwrap();
        let channel = st.ids.get(&msg.id).copied().unwrap_or(0);
        self.send_event_on(&st, channel, msg);
    }

    /// Writes one rdma_cm event on channel `channel`, whatever id it names.
    pub fn send_event_to(&self, channel: u32, msg: &ctl::CmEventMsg) {
        let st = self.cm.lock().unwrap();
        self.send_event_on(&st, channel, msg);
    }

    fn send_event_on(&self, st: &CmState, channel: u32, msg: &ctl::CmEventMsg) {
        let fd = st
            .channels
            .get(&channel)
            .expect("no such channel")
            .as_raw_fd();
        let bytes = ctl::encode(msg).unwrap();
        nix::sys::socket::send(fd, &bytes, MsgFlags::empty()).unwrap();
    }

    /// Closes the daemon's end of rdma_cm channel `channel`, as a dying daemon does.
    pub fn close_channel(&self, channel: u32) {
        self.cm.lock().unwrap().channels.remove(&channel);
    }

    /// Closes every client connection, as the kernel does when the daemon process dies.
    pub fn hang_up(&self) {
        for conn in self.clients.lock().unwrap().drain(..) {
            // shutdown, not just close: a serving thread blocked in recv keeps the socket
            // alive past close(), and the client would never see the hang-up.
            let _ = nix::sys::socket::shutdown(conn.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        }
    }
}

fn serve(fd: RawFd, hellos: &AtomicU64, cm: &Mutex<CmState>) {
    let mut buf = vec![0u8; ctl::MAX_MESSAGE];
    let mut next_handle = 0u32;
    loop {
        // Descriptors that come with a request (event sockets, pipes) are dropped by recv:
        // the stand-in never writes events.
        let n = match recv(fd, &mut buf, MsgFlags::empty()) {
            Ok(n) if n > 0 => n,
            _ => return, // EOF, or the descriptor was closed by hang_up
        };
        let mut handle = || {
            next_handle += 1;
            next_handle
        };
        let mut fds: Vec<OwnedFd> = Vec::new();
        let response = match ctl::decode::<Request>(&buf[..n]) {
            Ok(Request::Hello { .. }) => Response::Hello {
                version: ctl::PROTOCOL_VERSION,
                client: hellos.fetch_add(1, Ordering::SeqCst) + 1,
            },
            Ok(Request::QueryDevices) => Response::Devices(vec![srxe0()]),
            // Contexts, PDs and channels are bookkeeping only: enough for the verbs that
            // need no data path.
            Ok(Request::OpenContext { .. }) => {
                // SAFETY: eventfd creates a new descriptor (checked) that nothing else owns.
                let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
                assert!(efd >= 0, "eventfd");
                // SAFETY: as above.
                fds.push(unsafe { OwnedFd::from_raw_fd(efd) });
                let (table, doorbells_len) = doorbell_table();
                fds.push(table);
                Response::Context {
                    ctx: handle(),
                    doorbells_len,
                }
            }
            Ok(Request::AllocPd { .. }) => Response::Pd { pd: handle() },
            Ok(Request::CreateCompChannel { .. }) => Response::CompChannel { channel: handle() },
            // rdma_cm: channels are real socketpairs (the test writes events through
            // FakeDaemon::send_event), ids are bookkeeping, addresses are srxe0's.
            Ok(Request::CmCreateChannel) => {
                let mut pair = [-1; 2];
                // SAFETY: pair is a valid 2-element array.
                let rc = unsafe {
                    libc::socketpair(
                        libc::AF_UNIX,
                        libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                        0,
                        pair.as_mut_ptr(),
                    )
                };
                assert_eq!(rc, 0, "socketpair");
                let channel = handle();
                // SAFETY: both descriptors are new and owned by nobody else.
                unsafe {
                    cm.lock()
                        .unwrap()
                        .channels
                        .insert(channel, OwnedFd::from_raw_fd(pair[0]));
                    fds.push(OwnedFd::from_raw_fd(pair[1]));
                }
                Response::CmChannel { channel }
            }
            Ok(Request::CmCreateId { channel, .. }) => {
                let id = handle();
                cm.lock().unwrap().ids.insert(id, channel);
                Response::CmId { id }
            }
            Ok(Request::CmMigrateId { id, channel }) => {
                cm.lock().unwrap().ids.insert(id, channel);
                Response::Done
            }
            Ok(Request::CmDestroyId { id }) => {
                let mut st = cm.lock().unwrap();
                st.ids.remove(&id);
                st.destroyed.push(id);
                Response::Done
            }
            Ok(Request::CmBind { id, addr } | Request::CmResolveAddr { id, dst: addr, .. }) => {
                let info = cm_info(id, addr);
                if matches!(
                    ctl::decode::<Request>(&buf[..n]),
                    Ok(Request::CmBind { .. })
                ) {
                    Response::CmIdInfo(info)
                } else {
                    Response::Done
                }
            }
            Ok(Request::CmQueryId { id }) => {
                Response::CmIdInfo(cm_info(id, "127.0.0.1:7471".parse().unwrap()))
            }
            Ok(
                Request::CmDestroyChannel { .. }
                | Request::CmListen { .. }
                | Request::CmSetOption { .. }
                | Request::CmReject { .. },
            ) => Response::Done,
            Ok(
                Request::CloseContext { .. }
                | Request::DeallocPd { .. }
                | Request::DestroyCompChannel { .. },
            ) => Response::Done,
            _ => Response::Error {
                errno: libc::EOPNOTSUPP,
                message: "not served by the stand-in daemon".into(),
            },
        };
        let bytes = ctl::encode(&response).unwrap();
        let iov = [std::io::IoSlice::new(&bytes)];
        let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let cmsg = [ControlMessage::ScmRights(&raw)];
        let cmsgs: &[ControlMessage] = if raw.is_empty() { &[] } else { &cmsg };
        if sendmsg::<()>(fd, &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None).is_err() {
            return;
        }
    }
}

/// What the stand-in says of an id: bound on srxe0 at `addr`.
pub fn cm_info(id: u32, addr: std::net::SocketAddr) -> ctl::CmIdInfo {
    ctl::CmIdInfo {
        id,
        device: Some("srxe0".into()),
        port_num: 1,
        gid_index: 1,
        src_addr: Some(addr),
        src_gid: gid_of(addr.ip()),
        ..ctl::CmIdInfo::default()
    }
}

/// A doorbell table as the daemon makes one (proto::ring::doorbell), in a memfd of its own.
fn doorbell_table() -> (OwnedFd, u64) {
    use proto::ring::doorbell::{table_len, Doorbells};
    let len = table_len(64);
    // SAFETY: memfd_create with a NUL-terminated name; checked below.
    let fd = unsafe { libc::memfd_create(c"doorbells".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create");
    // SAFETY: a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: our own memfd; a fresh shared mapping of it, checked, unmapped below.
    unsafe {
        assert_eq!(libc::ftruncate(fd.as_raw_fd(), len as i64), 0);
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        let _ = Doorbells::init(p.cast(), 64);
        libc::munmap(p, len);
    }
    (fd, len as u64)
}
