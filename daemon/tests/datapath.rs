//! The daemon's data path driven the way the shim drives it. Two clients (two control
//! connections of this process, so two engines) connect RC QPs over loopback and move bytes
//! with SEND/RECV, RDMA WRITE and RDMA READ; a wrong R_Key is refused; UD works through an
//! address handle; two daemons' traffic passes both packet checkers.

mod support;

use proto::ctl::{self, AhAttr, QpAttr, Request, Response};
use proto::ring::wqe::{self, SendData, SendWqe, WrOpcode};
use proto::Rkey;
use softroce_daemon::ctl::Client;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use support::capture::{Capture, Netns};
use support::client::*;

/// Connects `a` and `b` and checks SEND, RDMA WRITE, RDMA READ and a wrong R_Key.
fn exercise(a: &mut Side, b: &mut Side, gid_a: [u8; 16], gid_b: [u8; 16]) {
    let (qa, qb) = (a.qpn, b.qpn);
    a.connect(qb, gid_b);
    b.connect(qa, gid_a);

    // SEND of 5000 bytes: five packets at MTU 1024.
    for (i, x) in a.buf[..5000].iter_mut().enumerate() {
        *x = (i * 7 + 3) as u8;
    }
    b.post_recv(77, 0, 8192);
    let sge = a.sge(0, 5000);
    let w = send_wqe(1, WrOpcode::Send, &sge, 0, 0);
    a.post_send(&w);
    let ca = a.poll();
    assert_eq!(
        (ca.wr_id, ca.status, ca.opcode),
        (1, 0, 0),
        "send completion {ca:?}"
    );
    let cb = b.poll();
    assert_eq!(
        (cb.wr_id, cb.status, cb.opcode, cb.byte_len),
        (77, 0, 128, 5000),
        "{cb:?}"
    );
    assert_eq!(cb.qp_num, qb);
    assert_eq!(&b.buf[..5000], &a.buf[..5000]);

    // RDMA WRITE of 3000 bytes into B at offset 10000.
    for (i, x) in a.buf[20000..23000].iter_mut().enumerate() {
        *x = (i % 251) as u8;
    }
    let sge = a.sge(20000, 3000);
    let remote = b.buf.as_ptr() as u64 + 10000;
    let w = send_wqe(2, WrOpcode::RdmaWrite, &sge, remote, b.rkey);
    a.post_send(&w);
    let ca = a.poll();
    assert_eq!((ca.wr_id, ca.status, ca.opcode), (2, 0, 1), "{ca:?}");
    assert_eq!(&b.buf[10000..13000], &a.buf[20000..23000]);

    // RDMA READ of 4500 bytes from B into A at offset 40000.
    for (i, x) in b.buf[30000..34500].iter_mut().enumerate() {
        *x = (i % 13) as u8 ^ 0x5a;
    }
    let sge = a.sge(40000, 4500);
    let remote = b.buf.as_ptr() as u64 + 30000;
    let w = send_wqe(3, WrOpcode::RdmaRead, &sge, remote, b.rkey);
    a.post_send(&w);
    let ca = a.poll();
    assert_eq!(
        (ca.wr_id, ca.status, ca.opcode, ca.byte_len),
        (3, 0, 2, 4500),
        "{ca:?}"
    );
    assert_eq!(&a.buf[40000..44500], &b.buf[30000..34500]);

    // A wrong R_Key: the responder NAKs, the requester completes with REM_ACCESS_ERR (10).
    let sge = a.sge(0, 64);
    let w = send_wqe(4, WrOpcode::RdmaWrite, &sge, remote, b.rkey ^ 0x5500);
    a.post_send(&w);
    let ca = a.poll();
    assert_eq!((ca.wr_id, ca.status), (4, 10), "{ca:?}");
}

fn resources(socket: &Path) -> Vec<ctl::ClientResources> {
    let mut shower = Client::connect(socket, "res-show").unwrap();
    let Response::Resources { clients, .. } = shower.request(&Request::ResShow).unwrap() else {
        panic!()
    };
    clients
}

#[test]
fn two_clients_move_bytes_with_send_write_and_read() {
    let addr = "127.0.0.61";
    let d = start_daemon("rc", addr);
    let gid = ctl::gid_of(addr.parse().unwrap());
    let mut a = Side::new(&d.socket, 1 << 16);
    let mut b = Side::new(&d.socket, 1 << 16);
    assert_ne!(a.qpn, b.qpn, "two clients, two QPN blocks");
    exercise(&mut a, &mut b, gid, gid);

    // res show sees both clients with their QPs; dropping them frees everything.
    let clients = resources(&d.socket);
    assert_eq!(
        clients.iter().filter(|c| c.qps == 1 && c.mrs == 1).count(),
        2,
        "{clients:?}"
    );
    drop(a);
    drop(b);
    let deadline = Instant::now() + Duration::from_secs(2);
    while !resources(&d.socket).is_empty() {
        assert!(Instant::now() < deadline, "clients not freed");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn ipv6_loopback() {
    let d = start_daemon("v6", "::1");
    let gid = ctl::gid_of("::1".parse().unwrap());
    let mut a = Side::new(&d.socket, 1 << 16);
    let mut b = Side::new(&d.socket, 1 << 16);
    exercise(&mut a, &mut b, gid, gid);
}

const EXERCISED_OPS: [&str; 6] = [
    "RC_SEND_FIRST",
    "RC_SEND_LAST",
    "RC_RDMA_WRITE_FIRST",
    "RC_RDMA_READ_REQUEST",
    "RC_RDMA_READ_RESPONSE_LAST",
    "RC_ACKNOWLEDGE",
];

/// Two daemons on two addresses, their traffic captured with tcpdump: every packet parses
/// and carries the right ICRC, by `softroce pcap check` and by the independent oracle. The
/// daemons send with UDP GSO, so they run in a namespace whose loopback segments in software
/// (see [`Netns`]) and the capture shows the segments, each sealed for its own IPv4
/// Identification.
#[test]
fn two_daemons_talk_and_their_packets_pass_both_checkers() {
    let (addr_a, addr_b) = ("127.0.0.62", "127.0.0.63");
    let ns = Netns::new("softroce-datapath");
    let capture = Capture::start(
        Some(&ns),
        "datapath",
        "two-daemons",
        &format!("host {addr_a}"),
    );
    let da = start_daemon_with("two-a", &["--addr", addr_a], &ns.exec());
    let db = start_daemon_with("two-b", &["--addr", addr_b], &ns.exec());
    let mut a = Side::new(&da.socket, 1 << 16);
    let mut b = Side::new(&db.socket, 1 << 16);
    exercise(
        &mut a,
        &mut b,
        ctl::gid_of(addr_a.parse().unwrap()),
        ctl::gid_of(addr_b.parse().unwrap()),
    );
    let text = capture.stop_and_check();
    for op in EXERCISED_OPS {
        assert!(text.contains(op), "{op} missing from the capture:\n{text}");
    }
}

/// Kernel rxe never shows traffic between two QPs of one device to tcpdump. softroce hands
/// it from engine to engine by default too (as fast as rxe's loopback), but with
/// `--local-via-socket --no-gso` it goes through the device's socket packet by packet, and a
/// capture on the host's own `lo` shows every packet, with ICRCs both checkers accept. By
/// default the same exchange leaves nothing in the capture.
#[test]
fn one_daemon_traffic_is_visible_to_tcpdump_when_asked() {
    for (addr, flags, visible) in [
        ("127.0.0.66", &["--local-via-socket", "--no-gso"][..], true),
        ("127.0.0.67", &[][..], false),
    ] {
        let capture = Capture::start(
            None,
            "datapath",
            &format!("one-daemon-{addr}"),
            &format!("host {addr}"),
        );
        let mut args = vec!["--addr", addr];
        args.extend_from_slice(flags);
        let d = start_daemon_with(&format!("local-{addr}"), &args, &[]);
        let gid = ctl::gid_of(addr.parse().unwrap());
        let mut a = Side::new(&d.socket, 1 << 16);
        let mut b = Side::new(&d.socket, 1 << 16);
        exercise(&mut a, &mut b, gid, gid);
        let text = capture.stop_and_check();
        for op in EXERCISED_OPS {
            assert_eq!(text.contains(op), visible, "{op}, {flags:?}:\n{text}");
        }
    }
}

/// UD: an address handle, a datagram with immediate data, the 40-byte GRH area in the receive
/// buffer, the source QPN in the completion; a wrong Q_Key is dropped.
#[test]
fn ud_datagrams_through_an_address_handle() {
    let addr = "127.0.0.64";
    let d = start_daemon("ud", addr);
    let gid = ctl::gid_of(addr.parse().unwrap());
    let mut a = Side::with_type(&d.socket, 1 << 14, ctl::qp_type::UD);
    let mut b = Side::with_type(&d.socket, 1 << 14, ctl::qp_type::UD);
    for s in [&mut a, &mut b] {
        let qpn = s.qpn;
        let mut attr = QpAttr {
            qp_state: 1,
            port_num: 1,
            qkey: 0x1111_1111,
            ..Default::default()
        };
        ok(s.client
            .request(&Request::ModifyQp {
                qpn,
                attr,
                mask: 1 | 16 | 32 | 64,
            })
            .unwrap());
        attr.qp_state = 2;
        ok(s.client
            .request(&Request::ModifyQp { qpn, attr, mask: 1 })
            .unwrap());
        attr.qp_state = 3;
        ok(s.client
            .request(&Request::ModifyQp {
                qpn,
                attr,
                mask: 1 | 65536,
            })
            .unwrap());
    }
    let Response::Ah { ah } = ok(a
        .client
        .request(&Request::CreateAh {
            pd: a.pd,
            attr: AhAttr {
                dgid: gid,
                is_global: true,
                hop_limit: 64,
                port_num: 1,
                ..Default::default()
            },
        })
        .unwrap())
    else {
        panic!()
    };
    b.post_recv(5, 0, 40 + 1024);
    b.post_recv(6, 2048, 40 + 1024);
    a.buf[..300].copy_from_slice(&[0xab; 300]);
    let sge = a.sge(0, 300);
    for (wr_id, qkey) in [(1, 0x2222_2222u32), (2, 0x1111_1111)] {
        let w = SendWqe {
            wr_id,
            opcode: WrOpcode::SendWithImm,
            flags: wqe::send_flags::SIGNALED,
            imm_or_inv: 0x0102_0304,
            remote_addr: 0,
            rkey: Rkey(0),
            compare_add: 0,
            swap: 0,
            ud: Some(wqe::UdDest {
                ah,
                remote_qpn: proto::Qpn::new(b.qpn),
                remote_qkey: proto::Qkey(qkey),
            }),
            bind: None,
            data: SendData::Sges(&sge),
        };
        a.post_send(&w);
        let ca = a.poll();
        assert_eq!((ca.wr_id, ca.status), (wr_id, 0), "{ca:?}");
    }
    // The first datagram carried the wrong Q_Key and was dropped: the second fills wr 5.
    let cb = b.poll();
    assert_eq!((cb.wr_id, cb.status, cb.byte_len), (5, 0, 340), "{cb:?}");
    assert_eq!(cb.src_qp, a.qpn);
    // The WQE carries the host value; the completion holds the `ibv_wc` image (`__be32`).
    assert_eq!(cb.imm_or_inv, 0x0102_0304, "the bytes as posted come back");
    assert_ne!(cb.wc_flags & 1, 0, "IBV_WC_GRH");
    assert_eq!(&b.buf[40..340], &[0xab; 300][..]);
    // The IPv4 header sits at offset 20 of the GRH area (rxe zeroes the first 20 bytes).
    assert_eq!(b.buf[20] >> 4, 4, "IPv4 header in the GRH area");
}

/// `--netdev`: the device serves every address of the interface, including one added while it
/// runs. The daemon runs in a network namespace of its own (its loopback is the interface), so
/// that adding an address touches nothing else; the clients need no network at all.
#[test]
fn netdev_addresses_are_followed_as_they_change() {
    let script = r#"ip link set lo up && exec "$0" "$@""#;
    let d = start_daemon_with(
        "netdev",
        &["--netdev", "lo"],
        &["unshare", "-n", "sh", "-c", script],
    );
    let pid = d.child.id().to_string();
    let added = Command::new("nsenter")
        .args([
            "-t",
            &pid,
            "-n",
            "ip",
            "addr",
            "add",
            "127.0.0.99/32",
            "dev",
            "lo",
        ])
        .status()
        .expect("nsenter");
    assert!(added.success());
    let new_gid = ctl::gid_of("127.0.0.99".parse().unwrap());
    let lo_gid = ctl::gid_of("127.0.0.1".parse().unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    let (new_index, lo_index) = loop {
        let mut c = Client::connect(&d.socket, "gid-watch").unwrap();
        let Response::Devices(devs) = c.request(&Request::QueryDevices).unwrap() else {
            panic!()
        };
        let find = |gid| {
            devs[0]
                .gids
                .iter()
                .find(|g| g.gid == gid)
                .map(|g| g.index as u8)
        };
        if let (Some(n), Some(l)) = (find(new_gid), find(lo_gid)) {
            break (n, l);
        }
        assert!(
            Instant::now() < deadline,
            "new address not followed: {devs:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    // New clients: A on the new address, B on 127.0.0.1.
    let mut a = Side::new(&d.socket, 1 << 16);
    let mut b = Side::new(&d.socket, 1 << 16);
    a.sgid_index = new_index;
    b.sgid_index = lo_index;
    exercise(&mut a, &mut b, new_gid, lo_gid);
}

/// Opens a context on srxe0 for `c` and allocates a PD and an 8-entry CQ in it: the PD, the CQ
/// and the context's event socket (which must stay open while the context is used).
fn pd_and_cq(c: &mut Client) -> (u32, u32, std::os::fd::OwnedFd) {
    let (a0, a1) = nix::sys::socket::socketpair(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::SeqPacket,
        None,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
    )
    .unwrap();
    use std::os::fd::AsRawFd;
    let (r, _fds) = c
        .request_fds(
            &Request::OpenContext {
                device: "srxe0".into(),
            },
            &[a1.as_raw_fd()],
        )
        .unwrap();
    let Response::Context { ctx, .. } = ok(r) else {
        panic!()
    };
    let Response::Pd { pd } = ok(c.request(&Request::AllocPd { ctx }).unwrap()) else {
        panic!()
    };
    let (r, _fds) = c
        .request_fds(
            &Request::CreateCq {
                ctx,
                cqe: 8,
                channel: None,
                comp_vector: 0,
            },
            &[],
        )
        .unwrap();
    let Response::Cq { cq, .. } = ok(r) else {
        panic!()
    };
    (pd, cq, a0)
}

fn rc_qp(pd: u32, cq: u32, cap: ctl::QpCap) -> Request {
    Request::CreateQp {
        pd,
        qp_type: ctl::qp_type::RC,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap,
        sq_sig_all: false,
    }
}

/// A client asking for absurd SGE counts (sized into ring slots as `sge * 16`) gets EINVAL,
/// and the device goes on serving it.
#[test]
fn huge_sge_counts_are_refused() {
    let d = start_daemon_with("sge", &["--addr", "127.0.0.65", "--port", "0"], &[]);
    let mut c = Client::connect(&d.socket, "huge-sge").unwrap();
    let (pd, cq, _events) = pd_and_cq(&mut c);
    let cap = ctl::QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    for huge in [
        ctl::QpCap {
            max_send_sge: u32::MAX / 8,
            ..cap
        },
        ctl::QpCap {
            max_recv_sge: u32::MAX,
            ..cap
        },
    ] {
        match c.request(&rc_qp(pd, cq, huge)).unwrap() {
            Response::Error { errno, .. } => assert_eq!(errno, libc::EINVAL),
            other => panic!("a QP with {huge:?} was granted: {other:?}"),
        }
    }
    let srq = Request::CreateSrq {
        pd,
        max_wr: 4,
        max_sge: u32::MAX / 8,
        srq_limit: 0,
    };
    match c.request(&srq).unwrap() {
        Response::Error { errno, .. } => assert_eq!(errno, libc::EINVAL),
        other => panic!("an SRQ with a huge SGE count was granted: {other:?}"),
    }
    assert!(
        matches!(c.request(&rc_qp(pd, cq, cap)).unwrap(), Response::Qp { .. }),
        "the device still creates a sane QP"
    );
}

/// `--max-qp`: the device's QP limit holds over all clients.
#[test]
fn the_qp_limit_holds_across_clients() {
    let d = start_daemon_with("limits", &["--addr", "127.0.0.65", "--max-qp", "1"], &[]);
    let _first = Side::new(&d.socket, 4096);
    let mut c = Client::connect(&d.socket, "over-the-limit").unwrap();
    let (pd, cq, a0) = pd_and_cq(&mut c);
    let r = c
        .request(&Request::CreateQp {
            pd,
            qp_type: ctl::qp_type::RC,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: ctl::QpCap {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        })
        .unwrap();
    match r {
        Response::Error { errno, message } => {
            assert_eq!(errno, libc::ENOMEM);
            assert!(message.contains("max_qp"), "{message}");
        }
        other => panic!("a second QP was granted: {other:?}"),
    }
    drop(a0);
}

/// A send request that waited in the daemon for room in a full send queue and is then refused
/// by the engine (here an atomic at an unaligned address) still completes, with an error, as
/// it would have had it found room at once: a program waits for every signaled completion.
#[test]
fn a_refused_request_that_waited_for_room_still_completes() {
    let addr = "127.0.0.65";
    let d = start_daemon_with("waited", &["--addr", addr, "--port", "0"], &[]);
    let mut a = Side::new(&d.socket, 4096);
    // Nobody has this QPN: nothing is ever acknowledged, so the send queue stays full
    // until the retries run out and the QP fails, which flushes it.
    a.connect(0x00ff_fff0, ctl::gid_of(addr.parse().unwrap()));
    let sge = a.sge(0, 8);
    let depth = 32; // Side's max_send_wr
    for i in 0..depth {
        a.post_send(&send_wqe(i, WrOpcode::Send, &sge, 0, 0));
    }
    let mut bad = send_wqe(999, WrOpcode::AtomicCmpAndSwp, &sge, 0x1001, a.rkey);
    bad.compare_add = 1;
    let n = bad.encode(&mut a.slot).unwrap();
    // The ring has as many slots as the send queue: wait until the daemon took the others.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match a.sq.ring.push(&a.slot[..n]) {
            Ok(_) => break,
            Err(proto::ring::RingError::Full) => {
                assert!(Instant::now() < deadline, "the daemon never took the sends");
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("{e}"),
        }
    }
    a.ring_doorbell();
    let completions: Vec<_> = (0..=depth).map(|_| a.poll()).collect();
    let refused = completions
        .iter()
        .find(|c| c.wr_id == 999)
        .expect("a completion for the refused atomic");
    assert_eq!(
        refused.status,
        proto::transport::WcStatus::LocQpOpErr as u32
    );
    assert!(
        completions
            .iter()
            .filter(|c| c.wr_id != 999)
            .all(|c| c.status != proto::transport::WcStatus::Success as u32),
        "the sends to nobody failed: {completions:?}"
    );
}

/// The device reads the rings whose doorbell rang and no others (issue 17: a pass costs what
/// was posted, not what exists). A WRITE published in the send ring without its doorbell stays
/// there, however long the device runs (the other client's traffic keeps it busy meanwhile);
/// the doorbell makes it go.
#[test]
fn a_ring_is_read_only_after_its_doorbell_rings() {
    let addr = "127.0.0.66";
    let d = start_daemon("doorbell", addr);
    let gid = ctl::gid_of(addr.parse().unwrap());
    let mut a = Side::new(&d.socket, 4096);
    let mut b = Side::new(&d.socket, 4096);
    let mut c = Side::new(&d.socket, 4096);
    a.connect(b.qpn, gid);
    b.connect(a.qpn, gid);
    c.connect(c.qpn, gid);
    a.buf[..8].copy_from_slice(b"rung-now");
    let sge = a.sge(0, 8);
    let w = send_wqe(5, WrOpcode::RdmaWrite, &sge, b.buf.as_ptr() as u64, b.rkey);
    let n = w.encode(&mut a.slot).unwrap();
    a.sq.ring.push(&a.slot[..n]).unwrap();
    // Meanwhile another client's QP (connected to itself) works, through its doorbell: the
    // device makes passes, and none of them reads a's ring.
    let csge = c.sge(0, 8);
    for i in 0..20 {
        c.post_send(&send_wqe(
            100 + i,
            WrOpcode::RdmaWrite,
            &csge,
            c.buf.as_ptr() as u64 + 64,
            c.rkey,
        ));
        assert_eq!(c.poll().status, 0);
    }
    assert!(
        a.poll_for(Duration::from_millis(300)).is_none(),
        "a ring whose doorbell did not ring was read"
    );
    assert_eq!(&b.buf[..8], &[0; 8]);
    a.ring_doorbell();
    let done = a.poll();
    assert_eq!((done.wr_id, done.status), (5, 0), "{done:?}");
    assert_eq!(&b.buf[..8], b"rung-now");
}
