//! rdma_cm in the daemon, driven through the control socket as the shim's librdmacm drives it
//! (no shim): listen, connect, accept, REP/RTU, ESTABLISHED on both sides with the right QPNs,
//! PSNs and private data, data over the connected QPs, disconnect, reject, no listener, a dead
//! address, SIDR for UD, and a client that dies. The CM MADs cross the real UDP sockets:
//! between two daemons (127.0.0.170 and .171, captured and checked by both packet checkers),
//! within one daemon (127.0.0.172) and over IPv6 loopback.

mod support;

use proto::cm::rdma_cm::{RdmaCmEventType as Ev, RDMA_UDP_QKEY};
use proto::ctl::{self, cm_ps, qp_type, Request, Response};
use proto::ring::wqe::WrOpcode;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};
use support::capture::Capture;
use support::client::*;
use support::cm::*;

/// Both ends of one connection.
struct Pair {
    server: Side,
    client: Side,
    s_ch: Channel,
    c_ch: Channel,
    listener: u32,
    child: u32,
    cid: u32,
}

/// A listener on `listen` (server side), an active id connecting to `dst` (client side), up to
/// ESTABLISHED on both, checking what each side learns of the other.
fn establish(mut server: Side, mut client: Side, listen: SocketAddr, dst: SocketAddr) -> Pair {
    let s_ch = server.cm_channel();
    let listener = server.cm_id(&s_ch, cm_ps::TCP, qp_type::RC);
    let bound = server.cm_listen(listener, listen);
    assert_eq!(bound.src_addr, Some(listen));

    let c_ch = client.cm_channel();
    let cid = client.cm_id(&c_ch, cm_ps::TCP, qp_type::RC);
    let info = client.cm_resolve(&c_ch, cid, dst);
    assert_eq!(info.device.as_deref(), Some("srxe0"));
    assert_eq!(info.dst_addr, Some(dst));
    let src = info.src_addr.expect("a source address");
    assert!(
        (32768..=60999).contains(&src.port()),
        "ephemeral port {src}"
    );
    let path = info.path.expect("a route");
    assert_eq!((path.pkey, path.hop_limit), (0xffff, 64));
    client.cm_modify(cid, &[1]);
    let client_psn = 0x00ab_cdef;
    client.cm_ok(Request::CmConnect {
        id: cid,
        conn: conn_param(client.qpn, b"hello from the client"),
        psn: Some(client_psn),
    });

    let req = expect_event(&s_ch, Ev::ConnectRequest);
    assert_eq!(req.id, listener);
    assert_eq!(req.conn.qp_num, client.qpn, "the REQ's QPN");
    assert!(req.conn.private_data.starts_with(b"hello from the client"));
    assert_eq!(
        req.conn.private_data.len(),
        56,
        "92 bytes less the rdma_cm header"
    );
    assert_eq!((req.conn.retry_count, req.conn.rnr_retry_count), (7, 7));
    let child = req.child.expect("a new id for the request");
    assert_eq!(
        child.dst_addr,
        Some(src),
        "the peer's address from the rdma_cm header"
    );
    assert_eq!(child.src_addr.map(|a| a.port()), Some(listen.port()));
    let s_attrs = server.cm_modify(child.id, &[1, 2, 3]);
    assert_eq!(
        s_attrs[0].qp_access_flags, 0xf,
        "responder resources > 0: read/atomic"
    );
    assert_eq!(s_attrs[1].dest_qp_num, client.qpn);
    // Linux reads a REQ's or REP's Starting PSN as the PSN its sender receives at: the
    // server sends from the client's REQ PSN and receives at its own (docs/interop.md).
    assert_eq!(s_attrs[2].sq_psn, client_psn, "the REQ's starting PSN");
    assert_eq!(s_attrs[1].max_dest_rd_atomic, 1);
    assert_eq!(
        s_attrs[2].timeout, 17,
        "packet lifetime 16 + 1 (facts §5.2)"
    );
    let server_psn = s_attrs[1].rq_psn;
    let sq = server.qpn;
    server.cm_ok(Request::CmAccept {
        id: child.id,
        conn: conn_param(sq, b"welcome"),
    });

    let rep = expect_event(&c_ch, Ev::ConnectResponse);
    assert_eq!(rep.id, cid);
    assert_eq!(rep.conn.qp_num, server.qpn, "the REP's QPN");
    assert!(rep.conn.private_data.starts_with(b"welcome"));
    assert_eq!(rep.conn.private_data.len(), 196);
    let c_attrs = client.cm_modify(cid, &[1, 2, 3]);
    assert_eq!(c_attrs[1].dest_qp_num, server.qpn);
    assert_eq!(c_attrs[1].rq_psn, client_psn);
    assert_eq!(c_attrs[2].sq_psn, server_psn, "the REP's starting PSN");
    assert_eq!(
        c_attrs[1].ah_attr.dgid, path.dgid,
        "the AH leads to the resolved GID"
    );
    assert!(c_attrs[1].ah_attr.is_global && s_attrs[1].ah_attr.is_global);
    assert_eq!(s_attrs[1].ah_attr.dgid, child.path.unwrap().dgid);
    client.cm_ok(Request::CmEstablish { id: cid });

    let est = expect_event(&s_ch, Ev::Established);
    assert_eq!(est.id, child.id);
    Pair {
        server,
        client,
        s_ch,
        c_ch,
        listener,
        child: child.id,
        cid,
    }
}

/// A SEND and an RDMA WRITE over the connected QPs.
fn transfer(p: &mut Pair) {
    let (a, b) = (&mut p.client, &mut p.server);
    for (i, x) in a.buf[..3000].iter_mut().enumerate() {
        *x = (i * 13 + 1) as u8;
    }
    b.post_recv(5, 0, 4096);
    let sge = a.sge(0, 3000);
    a.post_send(&send_wqe(1, WrOpcode::Send, &sge, 0, 0));
    let ca = a.poll();
    assert_eq!((ca.wr_id, ca.status), (1, 0), "{ca:?}");
    let cb = b.poll();
    assert_eq!((cb.wr_id, cb.status, cb.byte_len), (5, 0, 3000), "{cb:?}");
    assert_eq!(&b.buf[..3000], &a.buf[..3000]);

    for (i, x) in a.buf[8000..10000].iter_mut().enumerate() {
        *x = (i % 241) as u8;
    }
    let sge = a.sge(8000, 2000);
    let remote = b.buf.as_ptr() as u64 + 12000;
    a.post_send(&send_wqe(2, WrOpcode::RdmaWrite, &sge, remote, b.rkey));
    let ca = a.poll();
    assert_eq!((ca.wr_id, ca.status), (2, 0), "{ca:?}");
    assert_eq!(&b.buf[12000..14000], &a.buf[8000..10000]);
}

/// The client disconnects: DREQ, the server answers with DREP; both see DISCONNECTED.
fn disconnect(p: &mut Pair) {
    p.client.cm_ok(Request::CmDisconnect {
        id: p.cid,
        private_data: vec![],
    });
    let e = expect_event(&p.s_ch, Ev::Disconnected);
    assert_eq!(e.id, p.child);
    p.server.cm_ok(Request::CmDisconnect {
        id: p.child,
        private_data: vec![],
    });
    let e = expect_event(&p.c_ch, Ev::Disconnected);
    assert_eq!(e.id, p.cid);
    // A second disconnect is refused: the id is no longer connected.
    let r = p.client.cm(Request::CmDisconnect {
        id: p.cid,
        private_data: vec![],
    });
    assert!(matches!(r, Response::Error { .. }), "{r:?}");
    for (side, id) in [(&mut p.client, p.cid), (&mut p.server, p.child)] {
        side.cm_ok(Request::CmDestroyId { id });
    }
}

/// One connection's whole life between a new server program of the daemon at `server`
/// (listening on `listen`) and a new client program of the daemon at `client` (connecting to
/// `dst`): established, data both ways, disconnected. The pair is returned for later checks
/// and to keep its programs alive.
fn connect_use_and_disconnect(
    server: &Path,
    client: &Path,
    listen: SocketAddr,
    dst: SocketAddr,
) -> Pair {
    let mut p = establish(
        Side::new(server, 1 << 16),
        Side::new(client, 1 << 16),
        listen,
        dst,
    );
    transfer(&mut p);
    disconnect(&mut p);
    p
}

fn sock(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A connection request that the listener rejects and one to a port with no listener. (Fresh
/// QPs: a QP whose last connection is in timewait would be refused as a stale connection.)
fn refusals(server: &Path, client: &Path, listen: SocketAddr, free_port: SocketAddr) {
    let (server, client) = (
        &mut Side::new(server, 1 << 12),
        &mut Side::new(client, 1 << 12),
    );
    let s_ch = server.cm_channel();
    let l = server.cm_id(&s_ch, cm_ps::TCP, qp_type::RC);
    server.cm_listen(l, listen);
    let c_ch = client.cm_channel();

    // rdma_reject: REJ reason 28 (consumer defined) with the listener's private data.
    let id = client.cm_id(&c_ch, cm_ps::TCP, qp_type::RC);
    client.cm_resolve(&c_ch, id, listen);
    let qpn = client.qpn;
    client.cm_connect(id, qpn, b"let me in");
    let req = expect_event(&s_ch, Ev::ConnectRequest);
    let child = req.child.unwrap().id;
    server.cm_ok(Request::CmReject {
        id: child,
        private_data: b"go away".to_vec(),
    });
    let rej = expect_event(&c_ch, Ev::Rejected);
    assert_eq!((rej.id, rej.status), (id, 28), "{rej:?}");
    assert!(rej.conn.private_data.starts_with(b"go away"));
    client.cm_ok(Request::CmDestroyId { id });

    // Nobody listens: the passive CM answers REJ 8 "invalid service ID" at once.
    let id = client.cm_id(&c_ch, cm_ps::TCP, qp_type::RC);
    client.cm_resolve(&c_ch, id, free_port);
    client.cm_connect(id, qpn, b"");
    let rej = expect_event(&c_ch, Ev::Rejected);
    assert_eq!((rej.id, rej.status), (id, 8), "{rej:?}");
    client.cm_ok(Request::CmDestroyId { id });
    assert!(
        try_event(&s_ch, Duration::from_millis(100)).is_none(),
        "the listener saw nothing"
    );
    server.cm_ok(Request::CmDestroyId { id: l });
}

/// SIDR for the UDP port space: the UD QPN and Q_Key of the listener's side.
fn sidr(server: &mut Side, client: &mut Side, listen: SocketAddr, server_gid: [u8; 16]) {
    let s_ch = server.cm_channel();
    let l = server.cm_id(&s_ch, cm_ps::UDP, qp_type::UD);
    server.cm_listen(l, listen);
    let c_ch = client.cm_channel();
    let id = client.cm_id(&c_ch, cm_ps::UDP, qp_type::UD);
    client.cm_resolve(&c_ch, id, listen);
    let (init, mask) = client.cm_qp_attr(id, 1);
    assert_eq!(init.qkey, RDMA_UDP_QKEY);
    assert_ne!(mask & 64, 0, "INIT of a UD QP sets the Q_Key");
    let qpn = client.qpn;
    client.cm_connect(id, qpn, b"udp?");
    let req = expect_event(&s_ch, Ev::ConnectRequest);
    assert!(req.conn.private_data.starts_with(b"udp?"));
    assert!(req.ud.is_some());
    let child = req.child.unwrap().id;
    let sq = server.qpn;
    server.cm_ok(Request::CmAccept {
        id: child,
        conn: conn_param(sq, b"udp!"),
    });
    let est = expect_event(&c_ch, Ev::Established);
    let ud = est.ud.expect("UD parameters");
    assert_eq!((ud.qp_num, ud.qkey), (server.qpn, RDMA_UDP_QKEY));
    assert_eq!(ud.ah_attr.dgid, server_gid);
    assert!(ud.ah_attr.is_global);
    assert!(est.conn.private_data.starts_with(b"udp!"));
}

/// A client that dies: its connected id sends DREQ (the peer sees DISCONNECTED), its listener's
/// port is free again.
fn client_death(server_socket: &Path, client_socket: &Path, listen: SocketAddr) {
    let mut owner = Side::new(server_socket, 1 << 12);
    let ch = owner.cm_channel();
    let l = owner.cm_id(&ch, cm_ps::TCP, qp_type::RC);
    owner.cm_listen(l, sock_with_port(listen, listen.port() + 50));
    drop(owner);
    let mut reuse = Side::new(server_socket, 1 << 12);
    let ch = reuse.cm_channel();
    let l = reuse.cm_id(&ch, cm_ps::TCP, qp_type::RC);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match reuse.cm(Request::CmBind {
            id: l,
            addr: sock_with_port(listen, listen.port() + 50),
        }) {
            Response::CmIdInfo(_) => break,
            r => assert!(Instant::now() < deadline, "port never freed: {r:?}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }

    let mut p = establish(
        Side::new(server_socket, 1 << 16),
        Side::new(client_socket, 1 << 16),
        listen,
        listen,
    );
    let Pair {
        client,
        s_ch,
        child,
        ..
    } = &mut p;
    let client = std::mem::replace(client, Side::new(client_socket, 1 << 12));
    drop(client);
    let e = expect_event(s_ch, Ev::Disconnected);
    assert_eq!(e.id, *child);
}

/// The refusals (listening on port 7472, nobody on 7473) and a SIDR exchange (port 7474)
/// between clients of the daemons at `server` and `client`; the server's device is at
/// `server_ip`.
fn refusals_and_sidr(server: &Path, client: &Path, server_ip: &str) {
    let ip = server_ip.parse().unwrap();
    refusals(
        server,
        client,
        SocketAddr::new(ip, 7472),
        SocketAddr::new(ip, 7473),
    );
    let mut us = Side::with_type(server, 1 << 12, qp_type::UD);
    let mut uc = Side::with_type(client, 1 << 12, qp_type::UD);
    sidr(&mut us, &mut uc, SocketAddr::new(ip, 7474), ctl::gid_of(ip));
}

fn sock_with_port(a: SocketAddr, port: u16) -> SocketAddr {
    SocketAddr::new(a.ip(), port)
}

/// Starts a daemon, waiting (up to two minutes) for its address to be free: port 4791 on a
/// loopback address is shared with every other suite on the host.
fn daemon_when_free(name: &str, args: &[&str]) -> Daemon {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match std::panic::catch_unwind(|| start_daemon_with(name, args, &[])) {
            Ok(d) => return d,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(200)),
            Err(e) => std::panic::resume_unwind(e),
        }
    }
}

#[test]
fn two_daemons_connect_through_the_cm_on_the_wire() {
    let (addr_s, addr_c) = ("127.0.0.170", "127.0.0.171");
    let cap = Capture::start(None, "cm", "two-daemons", &format!("host {addr_s}"));
    // Packet by packet: tcpdump on the host's `lo` shows a GSO send as one oversized
    // datagram (two ACKs of a resent SEND went out as one, once, and failed the check).
    let ds = daemon_when_free("cm-170", &["--addr", addr_s, "--no-gso"]);
    let dc = daemon_when_free("cm-171", &["--addr", addr_c, "--no-gso"]);
    let listen = sock("127.0.0.170:7471");
    let p = connect_use_and_disconnect(&ds.socket, &dc.socket, listen, listen);
    let (cq, sq) = (p.client.qpn, p.server.qpn);
    let _ = p.listener;
    refusals_and_sidr(&ds.socket, &dc.socket, addr_s);
    client_death(&ds.socket, &dc.socket, sock("127.0.0.170:7475"));

    let text = cap.stop_and_check();
    for m in [
        "REQ", "REP", "RTU", "DREQ", "DREP", "REJ", "SIDR_REQ", "SIDR_REP",
    ] {
        assert!(
            text.contains(&format!("CM   {m} ")),
            "no {m} in the capture:\n{text}"
        );
    }
    assert!(text.contains("UD_SEND_ONLY"), "{text}");
    let has = |msg: &str, fields: &[String]| {
        text.lines()
            .any(|l| l.contains(&format!("CM {msg} ")) && fields.iter().all(|f| l.contains(f)))
    };
    assert!(
        has("REQ", &[format!("qpn={cq:#x}"), "spsn=11259375".into()]),
        "a REQ with the client's QPN {cq:#x} and PSN 0xabcdef:\n{text}"
    );
    assert!(
        has("REP", &[format!("qpn={sq:#x}")]),
        "a REP with the server's QPN {sq:#x}:\n{text}"
    );
    assert!(has("REJ", &["reason=8".into()]), "{text}");
    assert!(has("REJ", &["reason=28".into()]), "{text}");
}

#[test]
fn one_daemon_talks_to_itself_and_finds_dead_addresses() {
    let addr = "127.0.0.172";
    // Short CM timeouts (4.096 µs · 2^12 ≈ 16 ms, 3 retries): a REQ to a dead address gives
    // up after 4 × (2 · 2^(16-8) + 2^(12-8)) ms ≈ 2.1 s.
    let d = daemon_when_free(
        "cm-172",
        &[
            "--addr",
            addr,
            "--cm-response-timeout",
            "12",
            "--cm-max-retries",
            "3",
        ],
    );
    let listen = sock("127.0.0.172:7471");
    let p = connect_use_and_disconnect(&d.socket, &d.socket, listen, listen);
    // Both programs exit and run again at once, while their connection is in timewait: the
    // new ones get other QPNs, so the REQ is not refused as a stale connection (REJ 10).
    drop(p);
    let _again = connect_use_and_disconnect(&d.socket, &d.socket, listen, listen);
    refusals_and_sidr(&d.socket, &d.socket, addr);

    // Loopback other than the device's address is the device itself.
    let _q = connect_use_and_disconnect(
        &d.socket,
        &d.socket,
        sock("0.0.0.0:7480"),
        sock("127.0.0.1:7480"),
    );

    // Nobody at 127.0.0.173: the REQ is retried, then UNREACHABLE (-ETIMEDOUT).
    let c = &mut Side::new(&d.socket, 1 << 12);
    let ch = c.cm_channel();
    let id = c.cm_id(&ch, cm_ps::TCP, qp_type::RC);
    c.cm_resolve(&ch, id, sock("127.0.0.173:7471"));
    let qpn = c.qpn;
    c.cm_connect(id, qpn, b"");
    let e = expect_event(&ch, Ev::Unreachable);
    assert_eq!((e.id, e.status), (id, -110), "{e:?}");

    client_death(&d.socket, &d.socket, sock("127.0.0.172:7490"));
}

#[test]
fn ipv6_loopback_connection() {
    let d = daemon_when_free("cm-v6", &["--addr", "::1"]);
    let listen = sock("[::1]:7471");
    connect_use_and_disconnect(&d.socket, &d.socket, listen, listen);
}
