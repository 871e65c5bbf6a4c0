//! rdma_cm connection setup measured through the control socket (no shim): `rdma_connect` to
//! the active side's CONNECT_RESPONSE (REQ + REP), and to the passive side's ESTABLISHED (+ RTU),
//! sequentially, then connections per second with many in flight; on one daemon and across two
//! over loopback. `cargo build --release -p softroce-daemon --bins --examples &&
//! target/release/examples/cm_bench`. The QPNs are made up: the CM does not look at the QPs.

#[path = "../tests/support/client.rs"]
mod client;
#[path = "../tests/support/cm.rs"]
mod cm;

use client::*;
use cm::*;
use proto::cm::rdma_cm::RdmaCmEventType as Ev;
use proto::ctl::{cm_ps, qp_type, Request};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const SEQUENTIAL: u32 = 200;

/// The next event of kind `want`, skipping the DISCONNECTED / TIMEWAIT_EXIT of connections
/// already torn down.
fn next(ch: &Channel, want: Ev) -> proto::ctl::CmEventMsg {
    loop {
        let e = try_event(ch, Duration::from_secs(10)).expect("an event");
        if e.event == want as u32 {
            return e;
        }
        assert!(
            e.event == Ev::Disconnected as u32 || e.event == Ev::TimewaitExit as u32,
            "{e:?}"
        );
    }
}
const BURST: u32 = 100;

fn run(tag: &str, server_addr: &str, client_addr: &str) {
    let ds = start_daemon(&format!("cmb-{tag}-s"), server_addr);
    let dc =
        (server_addr != client_addr).then(|| start_daemon(&format!("cmb-{tag}-c"), client_addr));
    let mut server = Side::new(&ds.socket, 1 << 12);
    let mut client = Side::new(dc.as_ref().map_or(&ds.socket, |d| &d.socket), 1 << 12);
    let s_ch = server.cm_channel();
    let c_ch = client.cm_channel();
    let listen: SocketAddr = format!("{server_addr}:7600").parse().unwrap();
    let l = server.cm_id(&s_ch, cm_ps::TCP, qp_type::RC);
    server.cm_listen(l, listen);
    let mut qpn = 0x80_0000;

    // One at a time.
    let (mut to_rep, mut to_est) = (Vec::new(), Vec::new());
    for _ in 0..SEQUENTIAL {
        let id = client.cm_id(&c_ch, cm_ps::TCP, qp_type::RC);
        client.cm_resolve(&c_ch, id, listen);
        qpn += 1;
        let start = Instant::now();
        client.cm_connect(id, qpn, b"");
        let req = next(&s_ch, Ev::ConnectRequest);
        let child = req.child.unwrap().id;
        server.cm_ok(Request::CmAccept {
            id: child,
            conn: conn_param(qpn + 0x10_0000, b""),
        });
        next(&c_ch, Ev::ConnectResponse);
        to_rep.push(start.elapsed());
        client.cm_ok(Request::CmEstablish { id });
        next(&s_ch, Ev::Established);
        to_est.push(start.elapsed());
        client.cm_ok(Request::CmDestroyId { id });
        server.cm_ok(Request::CmDestroyId { id: child });
    }
    // Many in flight: BURST connects, then answer every request as it comes.
    let start = Instant::now();
    let mut ids = Vec::new();
    for _ in 0..BURST {
        let id = client.cm_id(&c_ch, cm_ps::TCP, qp_type::RC);
        client.cm_resolve(&c_ch, id, listen);
        qpn += 1;
        client.cm_connect(id, qpn, b"");
        ids.push(id);
    }
    let mut established = 0;
    let mut responses = 0;
    while established < BURST || responses < BURST {
        let mut idle = true;
        while let Some(e) = poll_event(&s_ch) {
            idle = false;
            if e.event == Ev::ConnectRequest as u32 {
                qpn += 1;
                let child = e.child.unwrap().id;
                server.cm_ok(Request::CmAccept {
                    id: child,
                    conn: conn_param(qpn + 0x10_0000, b""),
                });
            } else if e.event == Ev::Established as u32 {
                established += 1;
            }
        }
        while let Some(e) = poll_event(&c_ch) {
            idle = false;
            if e.event == Ev::ConnectResponse as u32 {
                responses += 1;
                client.cm_ok(Request::CmEstablish { id: e.id });
            }
        }
        if idle {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
    let burst = start.elapsed();
    let stats = |v: &mut Vec<Duration>| {
        v.sort();
        (v[v.len() / 2], v[v.len() * 99 / 100])
    };
    let (rep50, rep99) = stats(&mut to_rep);
    let (est50, est99) = stats(&mut to_est);
    println!(
        "{tag:>6}: connect->CONNECT_RESPONSE median {:>7.1} us (p99 {:>7.1}), connect->ESTABLISHED median {:>7.1} us (p99 {:>7.1}); {BURST} in flight: {:>7.0} connections/s",
        rep50.as_secs_f64() * 1e6,
        rep99.as_secs_f64() * 1e6,
        est50.as_secs_f64() * 1e6,
        est99.as_secs_f64() * 1e6,
        f64::from(BURST) / burst.as_secs_f64()
    );
}

fn main() {
    run("one", "127.0.0.178", "127.0.0.178");
    run("two", "127.0.0.178", "127.0.0.179");
}
