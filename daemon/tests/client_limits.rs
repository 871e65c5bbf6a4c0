//! Resource caps (`[device.limits]`, `max_qp`, `max_mr`): a client past its own caps, or the
//! device past its caps over all clients, gets ENOMEM from the verb with the cap named, while
//! the daemon and the other clients go on; what a client held comes back when it goes.

mod support;

use proto::ctl::{self, QpCap, Request, Response};
use std::time::{Duration, Instant};
use support::client::*;

const CONFIG: &str = r#"
[[device]]
name = "srxe0"
addr = ["127.0.0.93"]
max_qp = 6
[device.limits]
client_max_qp = 4
client_max_cq = 3
client_max_mr = 4
client_max_mr_bytes = 4194304
client_max_ring_bytes = 1048576
"#;

fn create_qp(s: &mut Side) -> Response {
    let cq = s.cq_handle;
    s.client
        .request_fds(
            &Request::CreateQp {
                pd: s.pd,
                qp_type: ctl::qp_type::RC,
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: 4,
                    max_recv_wr: 4,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
            },
            &[],
        )
        .unwrap()
        .0
}

fn create_cq(s: &mut Side, cqe: u32) -> Response {
    let ctx = s.ctx;
    s.client
        .request_fds(
            &Request::CreateCq {
                ctx,
                cqe,
                channel: None,
                comp_vector: 0,
            },
            &[],
        )
        .unwrap()
        .0
}

fn reg_mr(s: &mut Side, buf: &[u8]) -> Response {
    let pd = s.pd;
    s.client
        .request(&Request::RegMr {
            pd,
            addr: buf.as_ptr() as u64,
            length: buf.len() as u64,
            iova: buf.as_ptr() as u64,
            access: 1,
        })
        .unwrap()
}

/// An ENOMEM naming `key`.
fn refused(r: Response, key: &str) {
    match r {
        Response::Error { errno, message } => {
            assert_eq!(errno, libc::ENOMEM, "{message}");
            assert!(message.contains(key), "{message}");
        }
        other => panic!("expected ENOMEM ({key}), got {other:?}"),
    }
}

#[test]
fn caps_per_client_and_per_device_give_enomem_and_come_back() {
    let dir = std::env::temp_dir().join(format!("softroce-limits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("limits.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let daemon = start_daemon_args(
        "limits",
        &["--config", config.to_str().unwrap(), "--port", "0"],
        &[],
    );
    // Each side holds one CQ, one QP and one MR already.
    let mut a = Side::new(&daemon.socket, 4096);
    for _ in 0..3 {
        ok(create_qp(&mut a));
    }
    refused(create_qp(&mut a), "client_max_qp");
    // Another client has its own caps, under the device's: 6 QPs over both.
    let mut b = Side::new(&daemon.socket, 4096);
    ok(create_qp(&mut b));
    refused(create_qp(&mut b), "max_qp = 6");

    // Registered bytes and MR count.
    let big = vec![0u8; 5 << 20];
    refused(reg_mr(&mut a, &big), "client_max_mr_bytes");
    let small = vec![0u8; 1 << 20];
    for _ in 0..3 {
        ok(reg_mr(&mut a, &small));
    }
    refused(reg_mr(&mut a, &small), "client_max_mr");

    // Ring memory: a CQ of 32,767 entries needs 2 MiB of ring.
    refused(create_cq(&mut a, 32_767), "ring memory limit");
    ok(create_cq(&mut a, 16));
    ok(create_cq(&mut a, 16));
    refused(create_cq(&mut a, 16), "client_max_cq");

    // The client goes: what it held is free for the others.
    drop(a);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match create_qp(&mut b) {
            Response::Qp { .. } => break,
            r => {
                assert!(Instant::now() < deadline, "{r:?}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    // And the daemon serves a new client as ever.
    let mut c = Side::new(&daemon.socket, 4096);
    ok(create_qp(&mut c));
}
