//! Captures of the engine running in the simulator, under loss (so with NAKs and
//! retransmissions), pass `softroce pcap check`: what softroce emits, its own checker accepts.

use proto::sim::{LinkModel, QpOptions, Sim};
use proto::transport::*;
use std::process::Command;

#[test]
fn simulated_traffic_under_loss_passes_pcap_check() {
    let mut sim = Sim::pair(
        0x5eed,
        LinkModel {
            loss: 0.05,
            jitter: 3_000,
            ..LinkModel::default()
        },
    );
    sim.capture();
    let o = QpOptions {
        mtu: Mtu::Mtu1024,
        timeout: 8,
        ..Default::default()
    };
    let (qa, qb) = sim.connect(0, 1, &o);
    let acc = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
    let (a, ka) = sim.alloc_mr(0, 1 << 16, acc);
    let (b, kb) = sim.alloc_mr(1, 1 << 16, acc);
    sim.write_mem(0, a, &[0x42u8; 1 << 15]);
    let sge = |len| {
        Some(Sge {
            addr: a,
            length: len,
            lkey: ka.lkey,
        })
    };
    let remote = RemoteAddr {
        va: b,
        rkey: kb.rkey,
    };
    for i in 0..8u64 {
        sim.post_recv(
            1,
            qb,
            RecvWr {
                wr_id: 100 + i,
                sg_list: vec![Sge {
                    addr: b + 0x8000,
                    length: 0x4000,
                    lkey: kb.lkey,
                }],
            },
        )
        .unwrap();
        sim.post_send(0, qa, SendWr::new(i, SendOp::Send, sge(5000)))
            .unwrap();
        sim.post_send(0, qa, SendWr::new(10 + i, SendOp::Write(remote), sge(9000)))
            .unwrap();
        sim.post_send(0, qa, SendWr::new(20 + i, SendOp::Read(remote), sge(3000)))
            .unwrap();
    }
    sim.run(10_000_000_000);
    sim.check_all_sends_completed();
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("sim-loss.pcap");
    std::fs::write(&path, sim.pcap_bytes().unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_softroce"))
        .args(["pcap", "check"])
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for op in [
        "RC_SEND_FIRST",
        "RC_RDMA_WRITE_MIDDLE",
        "RC_RDMA_READ_RESPONSE_LAST",
        "RC_ACKNOWLEDGE",
    ] {
        assert!(text.contains(op), "{op} missing:\n{text}");
    }
    assert!(text.contains("bad 0"), "{text}");
}
