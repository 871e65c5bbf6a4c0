//! The simulator's packets written as a classic pcap pass both our own parser and the
//! independent oracle `../shared/tools/roce-pcap-check`.

use proto::sim::{Action, LinkModel, QpOptions, Sim};
use proto::transport::*;
use proto::wire::{FrameRepr, Opcode};
use std::path::PathBuf;

fn traffic(sim: &mut Sim) {
    let o = QpOptions {
        mtu: Mtu::Mtu256,
        timeout: 8,
        ..Default::default()
    };
    let (qa, qb) = sim.connect(0, 1, &o);
    let acc = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
    let (a, ka) = sim.alloc_mr(0, 8192, acc);
    let (b, kb) = sim.alloc_mr(1, 8192, acc);
    sim.write_mem(0, a, &[7u8; 1000]);
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
    sim.post_recv(
        1,
        qb,
        RecvWr {
            wr_id: 9,
            sg_list: vec![Sge {
                addr: b + 4096,
                length: 4096,
                lkey: kb.lkey,
            }],
        },
    )
    .unwrap();
    sim.post_send(0, qa, SendWr::new(1, SendOp::SendWithImm(5), sge(1000)))
        .unwrap();
    sim.post_send(0, qa, SendWr::new(2, SendOp::Write(remote), sge(999)))
        .unwrap();
    sim.post_send(0, qa, SendWr::new(3, SendOp::Read(remote), sge(700)))
        .unwrap();
    sim.post_send(
        0,
        qa,
        SendWr::new(4, SendOp::FetchAdd { remote, add: 1 }, sge(8)),
    )
    .unwrap();
    // A lost packet adds a NAK and retransmissions to the capture.
    sim.drop_once(|i| i.opcode == Opcode::RC_RDMA_WRITE_MIDDLE);
    sim.run(1_000_000_000);
    sim.check_all_sends_completed();
}

fn check_file(sim: &Sim, name: &str) -> usize {
    let bytes = sim.pcap_bytes().expect("capturing").to_vec();
    // Our own reading of it: every record is an Ethernet frame with a good ICRC.
    let mut at = 24;
    let mut n = 0;
    while at + 16 <= bytes.len() {
        let incl = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        let frame = &bytes[at + 16..at + 16 + incl];
        let parsed = FrameRepr::parse_ethernet(frame, incl).expect("parse");
        parsed.verified().expect("ICRC");
        at += 16 + incl;
        n += 1;
    }
    assert_eq!(at, bytes.len());
    let path: PathBuf =
        std::env::temp_dir().join(format!("softroce-{name}-{}.pcap", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let tool = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/tools/roce-pcap-check");
    let tool = if tool.exists() {
        tool
    } else {
        PathBuf::from("/work/shared/tools/roce-pcap-check")
    };
    assert!(
        tool.exists(),
        "precondition missing: roce-pcap-check, expected in ../shared/tools beside the project"
    );
    let out = std::process::Command::new(&tool)
        .arg(&path)
        .output()
        .expect("run roce-pcap-check");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "roce-pcap-check failed: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(&format!("{n}")), "{text}");
    let _ = std::fs::remove_file(&path);
    n
}

#[test]
fn sim_pcap_of_ipv4_traffic_passes_roce_pcap_check() {
    let mut sim = Sim::pair(11, LinkModel::default());
    sim.capture();
    traffic(&mut sim);
    let n = check_file(&sim, "v4");
    assert!(n > 20, "{n} packets");
}

#[test]
fn sim_pcap_of_ipv6_traffic_passes_roce_pcap_check() {
    let mut sim = Sim::new(12);
    sim.add_node("fd00::1".parse().unwrap(), LinkModel::default());
    sim.add_node("fd00::2".parse().unwrap(), LinkModel::default());
    sim.capture();
    traffic(&mut sim);
    assert!(check_file(&sim, "v6") > 20);
}

#[test]
fn sim_pcap_records_what_was_sent_even_when_the_link_corrupts_it() {
    let mut sim = Sim::pair(13, LinkModel::default());
    sim.capture();
    sim.on_packet(3, Action::Corrupt, |i| i.from == 0);
    traffic(&mut sim);
    check_file(&sim, "corrupt");
    assert!(sim.nodes[1].dev.counters().icrc_errors >= 3);
}
