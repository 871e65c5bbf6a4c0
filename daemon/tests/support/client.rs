//! A raw client of the daemon's data path, speaking the shim's protocol: control requests with
//! file descriptors, work requests through the shared rings, completions back through them.
//! Used by `tests/datapath.rs` and `examples/datapath_bench.rs`.
#![allow(dead_code)]

use memmap2::MmapRaw;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use proto::ctl::{self, AhAttr, QpAttr, QpCap, Request, Response, RingPlace};
use proto::ring::doorbell::Doorbells;
use proto::ring::wqe::{self, Cqe, RecvWqe, SendData, SendWqe, Sge, WrOpcode};
use proto::ring::SharedRing;
use proto::{Lkey, Rkey};
use softroce_daemon::ctl::Client;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Daemon {
    pub child: Child,
    pub socket: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `softroce` binary: beside the test or example executable's directory (cargo puts
/// both under target/<profile>/).
pub fn softroce_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    for candidate in [dir.join("softroce"), dir.join("../softroce")] {
        if candidate.exists() {
            return candidate;
        }
    }
    panic!("softroce binary not found near {}", exe.display());
}

pub fn start_daemon(name: &str, addr: &str) -> Daemon {
    start_daemon_with(name, &["--addr", addr], &[])
}

/// Starts `[wrapper...] softroce daemon --name srxe0 ARGS --socket <dir>/ctl.sock`.
pub fn start_daemon_with(name: &str, args: &[&str], wrapper: &[&str]) -> Daemon {
    let mut all = vec!["--name", "srxe0"];
    all.extend_from_slice(args);
    start_daemon_args(name, &all, wrapper)
}

/// Starts `[wrapper...] softroce daemon ARGS --socket <dir>/ctl.sock`.
pub fn start_daemon_args(name: &str, args: &[&str], wrapper: &[&str]) -> Daemon {
    // Beside the binary: target/<profile>/softroce-datapath/<name>.
    let dir = softroce_bin()
        .parent()
        .unwrap()
        .join("softroce-datapath")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("ctl.sock");
    let mut cmd = match wrapper.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(softroce_bin());
            c
        }
        None => Command::new(softroce_bin()),
    };
    let child = cmd
        .arg("daemon")
        .args(args)
        .arg("--socket")
        .arg(&socket)
        .stderr(File::create(dir.join("daemon.log")).unwrap())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut d = Daemon { child, socket };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d.socket.exists() {
        if let Ok(Some(status)) = d.child.try_wait() {
            panic!(
                "daemon exited with {status}: {}",
                std::fs::read_to_string(dir.join("daemon.log")).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "daemon did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    d
}

/// A ring inside a memfd mapping handed over by the daemon.
pub struct MappedRing {
    _map: MmapRaw,
    pub ring: SharedRing,
}

/// The client's doorbell table (proto::ring::doorbell), as the shim maps it.
pub struct MappedBells {
    pub bells: Doorbells,
    _map: MmapRaw,
}

pub fn map_bells(fd: OwnedFd, len: u64) -> MappedBells {
    let map = MmapRaw::map_raw(&File::from(fd)).unwrap();
    assert!(map.len() as u64 >= len);
    let bells = unsafe { Doorbells::attach(map.as_mut_ptr(), map.len()) }.unwrap();
    MappedBells { bells, _map: map }
}

pub fn map_ring(fd: OwnedFd, len: u64, place: RingPlace, producer: bool) -> MappedRing {
    let file = File::from(fd);
    let map = MmapRaw::map_raw(&file).unwrap();
    assert!(map.len() as u64 >= len);
    // SAFETY: the ring lies inside the mapping, which lives as long as the handle (same struct).
    let ring = unsafe {
        SharedRing::attach(
            map.as_mut_ptr().add(place.offset as usize),
            map.len() - place.offset as usize,
            producer,
        )
    }
    .unwrap();
    MappedRing { _map: map, ring }
}

/// One client: a context, a PD, one MR over `buf`, a CQ and an RC QP.
pub struct Side {
    /// The GID index packets leave from (0 unless a test says otherwise).
    pub sgid_index: u8,
    pub pd: u32,
    pub client: Client,
    pub doorbell: OwnedFd,
    /// The doorbell table, and the QP's doorbell in it.
    pub bells: MappedBells,
    pub qp_doorbell: u32,
    /// The context's async event socket: (our end, the end the daemon writes).
    pub async_events: (OwnedFd, OwnedFd),
    /// The completion channel's pipe (read end, write end) when the CQ has one.
    pub channel: Option<(OwnedFd, OwnedFd)>,
    pub cq_handle: u32,
    pub ctx: u32,
    pub buf: Vec<u8>,
    pub lkey: u32,
    pub rkey: u32,
    pub cq: MappedRing,
    pub sq: MappedRing,
    pub rq: MappedRing,
    pub qpn: u32,
    pub slot: Vec<u8>,
    /// `ctl::qp_type` of the QP (RC unless made `with_type`).
    pub qp_type: u32,
    /// The local ACK timeout `connect` gives the QP (IB enum: 4.096 µs · 2^t; 14 ≈ 67 ms).
    pub ack_timeout: u8,
}

pub fn ok(r: Response) -> Response {
    if let Response::Error { errno, message } = &r {
        panic!("daemon said errno {errno}: {message}");
    }
    r
}

impl Side {
    pub fn new(socket: &Path, len: usize) -> Side {
        Side::with_type(socket, len, ctl::qp_type::RC)
    }

    pub fn with_type(socket: &Path, len: usize, qp_type: u32) -> Side {
        Side::with_options(socket, len, qp_type, 64, false)
    }

    /// A side whose CQ asks for `cqe` entries and, with `channel`, has a completion channel.
    pub fn with_options(socket: &Path, len: usize, qp_type: u32, cqe: u32, channel: bool) -> Side {
        let mut client = Client::connect(socket, "datapath-test").unwrap();
        let (a0, a1) = nix::sys::socket::socketpair(
            nix::sys::socket::AddressFamily::Unix,
            nix::sys::socket::SockType::SeqPacket,
            None,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let (r, mut fds) = client
            .request_fds(
                &Request::OpenContext {
                    device: "srxe0".into(),
                },
                &[a1.as_raw_fd()],
            )
            .unwrap();
        let Response::Context { ctx, doorbells_len } = ok(r) else {
            panic!()
        };
        let bells = map_bells(fds.pop().expect("doorbell table"), doorbells_len);
        let doorbell = fds.pop().expect("doorbell fd");
        let Response::Pd { pd } = ok(client.request(&Request::AllocPd { ctx }).unwrap()) else {
            panic!()
        };
        let pd_handle = pd;
        let buf: Vec<u8> = vec![0u8; len];
        let Response::Mr { lkey, rkey, .. } = ok(client
            .request(&Request::RegMr {
                pd,
                addr: buf.as_ptr() as u64,
                length: len as u64,
                iova: buf.as_ptr() as u64,
                access: 0xf,
            })
            .unwrap())
        else {
            panic!()
        };
        let (channel, channel_handle) = if channel {
            let (r, w) = nix::unistd::pipe().unwrap();
            let (resp, _) = client
                .request_fds(&Request::CreateCompChannel { ctx }, &[w.as_raw_fd()])
                .unwrap();
            let Response::CompChannel { channel } = ok(resp) else {
                panic!()
            };
            (Some((r, w)), Some(channel))
        } else {
            (None, None)
        };
        let (r, mut fds) = client
            .request_fds(
                &Request::CreateCq {
                    ctx,
                    cqe,
                    channel: channel_handle,
                    comp_vector: 0,
                },
                &[],
            )
            .unwrap();
        let Response::Cq {
            cq,
            ring,
            region_len,
            ..
        } = ok(r)
        else {
            panic!()
        };
        let cq_ring = map_ring(fds.pop().unwrap(), region_len, ring, false);
        let (r, mut fds) = client
            .request_fds(
                &Request::CreateQp {
                    pd,
                    qp_type,
                    send_cq: cq,
                    recv_cq: cq,
                    srq: None,
                    cap: QpCap {
                        max_send_wr: 32,
                        max_recv_wr: 32,
                        max_send_sge: 2,
                        max_recv_sge: 2,
                        max_inline_data: 64,
                    },
                    sq_sig_all: false,
                },
                &[],
            )
            .unwrap();
        let Response::Qp {
            qpn,
            sq,
            rq,
            region_len,
            doorbell: qp_doorbell,
            ..
        } = ok(r)
        else {
            panic!()
        };
        let fd = fds.pop().unwrap();
        let fd2 = fd.try_clone().unwrap();
        let sq = map_ring(fd, region_len, sq, true);
        let rq = map_ring(fd2, region_len, rq.unwrap(), true);
        Side {
            sgid_index: 0,
            pd: pd_handle,
            client,
            doorbell,
            bells,
            qp_doorbell,
            async_events: (a0, a1),
            channel,
            cq_handle: cq,
            ctx,
            buf,
            lkey,
            rkey,
            cq: cq_ring,
            sq,
            rq,
            qpn,
            slot: vec![0u8; 4096],
            qp_type,
            ack_timeout: 14,
        }
    }

    pub fn connect(&mut self, remote_qpn: u32, gid: [u8; 16]) {
        self.connect_mtu(remote_qpn, gid, 3);
    }

    /// `mtu` is the IB enum: 3 = 1024 bytes, 5 = 4096.
    pub fn connect_mtu(&mut self, remote_qpn: u32, gid: [u8; 16], mtu: u32) {
        let qpn = self.qpn;
        let mut a = QpAttr {
            qp_state: 1,
            port_num: 1,
            qp_access_flags: 0xf,
            ..Default::default()
        };
        ok(self
            .client
            .request(&Request::ModifyQp {
                qpn,
                attr: a,
                mask: 1 | 8 | 16 | 32,
            })
            .unwrap());
        a.qp_state = 2;
        a.path_mtu = mtu;
        a.dest_qp_num = remote_qpn;
        a.max_dest_rd_atomic = 4;
        a.min_rnr_timer = 12;
        a.ah_attr = AhAttr {
            dgid: gid,
            sgid_index: self.sgid_index,
            is_global: true,
            hop_limit: 64,
            port_num: 1,
            ..Default::default()
        };
        ok(self
            .client
            .request(&Request::ModifyQp {
                qpn,
                attr: a,
                // UC has no RDMA READ/atomic resources and no RNR (IBTA §11.2.4.2 table).
                mask: if self.qp_type == ctl::qp_type::UC {
                    1 | 128 | 256 | 4096 | 1 << 20
                } else {
                    1 | 128 | 256 | 4096 | 1 << 20 | 1 << 17 | 1 << 15
                },
            })
            .unwrap());
        a.qp_state = 3;
        a.timeout = self.ack_timeout;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        a.max_rd_atomic = 4;
        ok(self
            .client
            .request(&Request::ModifyQp {
                qpn,
                attr: a,
                mask: if self.qp_type == ctl::qp_type::UC {
                    1 | 65536
                } else {
                    1 | 512 | 1024 | 2048 | 65536 | 8192
                },
            })
            .unwrap());
    }

    /// Arms the CQ for its next completion (`ibv_req_notify_cq`).
    pub fn arm_cq(&self) {
        self.cq.ring.arm(false);
    }

    /// The completion-channel records waiting: (CQ handle, generation) each.
    pub fn channel_records(&self) -> Vec<(u32, u32)> {
        let fd = &self.channel.as_ref().expect("a CQ with a channel").0;
        read_available(fd, 8)
            .iter()
            .map(|r| {
                (
                    u32::from_ne_bytes(r[..4].try_into().unwrap()),
                    u32::from_ne_bytes(r[4..8].try_into().unwrap()),
                )
            })
            .collect()
    }

    /// The async events waiting: (element, `enum ibv_event_type`) each.
    pub fn async_events(&self) -> Vec<(u64, u32)> {
        read_available(&self.async_events.0, 16)
            .iter()
            .map(|r| {
                (
                    u64::from_ne_bytes(r[..8].try_into().unwrap()),
                    u32::from_ne_bytes(r[8..12].try_into().unwrap()),
                )
            })
            .collect()
    }

    /// The QP's state (`enum ibv_qp_state`).
    pub fn qp_state(&mut self) -> u32 {
        match ok(self
            .client
            .request(&Request::QueryQp {
                qpn: self.qpn,
                mask: 0,
            })
            .unwrap())
        {
            Response::QpAttr { attr, .. } => attr.qp_state,
            other => panic!("{other:?}"),
        }
    }

    /// Writes `bytes` into the next send slot as they are (a broken or hostile client).
    pub fn post_raw_send(&mut self, bytes: &[u8]) {
        self.sq.ring.push(bytes).unwrap();
        self.ring_doorbell();
    }

    /// Writes `bytes` into the next receive slot as they are.
    pub fn post_raw_recv(&mut self, bytes: &[u8]) {
        self.rq.ring.push(bytes).unwrap();
        self.ring_doorbell();
    }

    /// Polls for a completion for at most `limit`.
    pub fn poll_for(&mut self, limit: Duration) -> Option<Cqe> {
        let start = Instant::now();
        let mut out = [0u8; wqe::CQE_SLOT_LEN];
        loop {
            if self.cq.ring.pop(&mut out).unwrap() {
                return Some(Cqe::decode(&out).unwrap());
            }
            if start.elapsed() > limit {
                return None;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Rings the QP's doorbell, and wakes the device thread if it said it sleeps.
    pub fn ring_doorbell(&self) {
        if self.bells.bells.ring(self.qp_doorbell) {
            nix::unistd::write(&self.doorbell, &1u64.to_ne_bytes()).unwrap();
        }
    }

    pub fn post_send(&mut self, w: &SendWqe<'_>) {
        let n = w.encode(&mut self.slot).unwrap();
        self.sq.ring.push(&self.slot[..n]).unwrap();
        self.ring_doorbell();
    }

    pub fn post_recv(&mut self, wr_id: u64, addr_off: usize, len: u32) {
        let sge = [Sge {
            addr: self.buf.as_ptr() as u64 + addr_off as u64,
            length: len,
            lkey: Lkey(self.lkey),
        }];
        let r = RecvWqe { wr_id, sges: &sge };
        let n = r.encode(&mut self.slot).unwrap();
        self.rq.ring.push(&self.slot[..n]).unwrap();
        self.ring_doorbell();
    }

    /// Busy-polls the completion ring as an application does (briefly, then with naps).
    pub fn poll(&mut self) -> Cqe {
        let start = Instant::now();
        let mut out = [0u8; wqe::CQE_SLOT_LEN];
        loop {
            if self.cq.ring.pop(&mut out).unwrap() {
                return Cqe::decode(&out).unwrap();
            }
            let waited = start.elapsed();
            assert!(
                waited < Duration::from_secs(10),
                "no completion within 10 s"
            );
            if waited < Duration::from_millis(1) {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    pub fn sge(&self, off: usize, len: u32) -> [Sge; 1] {
        [Sge {
            addr: self.buf.as_ptr() as u64 + off as u64,
            length: len,
            lkey: Lkey(self.lkey),
        }]
    }
}

/// Every `len`-byte record readable now from a datagram socket or a pipe.
pub fn read_available(fd: &OwnedFd, len: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 65536];
    loop {
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no timeout.
        if unsafe { libc::poll(&mut p, 1, 0) } != 1 {
            return out;
        }
        // SAFETY: reads into a valid buffer of its length.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            return out;
        }
        out.extend(buf[..n as usize].chunks(len).map(<[u8]>::to_vec));
    }
}

pub fn send_wqe(wr_id: u64, opcode: WrOpcode, sges: &[Sge], remote: u64, rkey: u32) -> SendWqe<'_> {
    SendWqe {
        wr_id,
        opcode,
        flags: wqe::send_flags::SIGNALED,
        imm_or_inv: 0,
        remote_addr: remote,
        rkey: Rkey(rkey),
        compare_add: 0,
        swap: 0,
        ud: None,
        bind: None,
        data: SendData::Sges(sges),
    }
}
