use proto::transport::*;
use std::time::Instant;
fn device(ip: &str) -> Engine<VecMemory> {
    let mut c = EngineConfig::new(ip.parse().unwrap(), 1);
    c.seal_icrc = false;
    Engine::new(c, VecMemory::new())
}
fn main() {
    let mut a = device("10.0.0.1");
    let mut b = device("10.0.0.2");
    let mk = |d: &mut Engine<VecMemory>| {
        let pd = d.alloc_pd();
        let cq = d.create_cq(4096).unwrap();
        let q = d
            .create_qp(QpInit {
                pd,
                qp_type: QpType::Rc,
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                cap: QpCap::default(),
                sq_sig_all: false,
            })
            .unwrap();
        let addr = d.memory_mut().alloc(4096);
        let k = d
            .reg_mr(
                pd,
                addr,
                4096,
                Access::ALL_REMOTE.union(Access::LOCAL_WRITE),
            )
            .unwrap();
        (pd, cq, q, addr, k)
    };
    let (_, cqa, qa, adda, ka) = mk(&mut a);
    let (_, cqb, qb, addb, kb) = mk(&mut b);
    for (d, q, rip, rq) in [(&mut a, qa, "10.0.0.2", qb), (&mut b, qb, "10.0.0.1", qa)] {
        let mut at = QpAttr {
            qp_state: QpState::Init,
            qp_access_flags: Access::ALL_REMOTE.union(Access::LOCAL_WRITE),
            ..Default::default()
        };
        d.modify_qp(
            q,
            &at,
            AttrMask::STATE
                .union(AttrMask::PKEY_INDEX)
                .union(AttrMask::PORT)
                .union(AttrMask::ACCESS_FLAGS),
        )
        .unwrap();
        at.qp_state = QpState::Rtr;
        at.ah_attr = Some(AddressVector::new(rip.parse().unwrap()));
        at.path_mtu = Mtu::Mtu4096;
        at.dest_qp_num = rq;
        at.max_dest_rd_atomic = 16;
        at.min_rnr_timer = 1;
        d.modify_qp(
            q,
            &at,
            AttrMask::STATE
                .union(AttrMask::AV)
                .union(AttrMask::PATH_MTU)
                .union(AttrMask::DEST_QPN)
                .union(AttrMask::RQ_PSN)
                .union(AttrMask::MAX_DEST_RD_ATOMIC)
                .union(AttrMask::MIN_RNR_TIMER),
        )
        .unwrap();
        at.qp_state = QpState::Rts;
        at.timeout = 14;
        at.retry_cnt = 7;
        at.rnr_retry = 7;
        at.max_rd_atomic = 16;
        d.modify_qp(
            q,
            &at,
            AttrMask::STATE
                .union(AttrMask::TIMEOUT)
                .union(AttrMask::RETRY_CNT)
                .union(AttrMask::RNR_RETRY)
                .union(AttrMask::SQ_PSN)
                .union(AttrMask::MAX_QP_RD_ATOMIC),
        )
        .unwrap();
    }
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    let n: u64 = std::env::args()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let op = std::env::args().nth(1).unwrap_or("send".into());
    let t = Instant::now();
    for i in 0..n {
        let wr = if op == "send" {
            b.post_recv(
                qb,
                RecvWr {
                    wr_id: i,
                    sg_list: vec![Sge {
                        addr: addb,
                        length: 64,
                        lkey: kb.lkey,
                    }],
                },
            )
            .unwrap();
            let mut wr = SendWr::new(i, SendOp::Send, None);
            wr.flags = SendFlags::INLINE;
            wr.inline_data = vec![1, 2];
            wr
        } else {
            SendWr::new(
                i,
                SendOp::Write(RemoteAddr {
                    va: addb,
                    rkey: kb.rkey,
                }),
                Some(Sge {
                    addr: adda,
                    length: 8,
                    lkey: ka.lkey,
                }),
            )
        };
        let mut wr = wr;
        if i % 100 == 99 {
            wr.flags = wr.flags.union(SendFlags::SIGNALED);
        }
        a.post_send(qa, wr).unwrap();
        while let Some(tx) = a.poll_transmit(0, &mut buf) {
            b.handle_verified_packet(0, &buf[..tx.len]);
        }
        while let Some(tx) = b.poll_transmit(0, &mut buf) {
            a.handle_verified_packet(0, &buf[..tx.len]);
        }
        while a.poll_cq(cqa).is_some() {}
        while b.poll_cq(cqb).is_some() {}
    }
    let dt = t.elapsed();
    println!(
        "{op}: {:.0} ns per message",
        dt.as_nanos() as f64 / n as f64
    );
}
