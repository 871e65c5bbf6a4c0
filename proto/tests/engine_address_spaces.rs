//! A daemon serves several processes whose registered buffers may sit at the same virtual
//! address: every memory access carries the address space of the MR's PD.

use proto::transport::*;
use proto::types::Qpn;
use std::collections::HashMap;

/// One `VecMemory` per address space, allocations mirrored so equal addresses exist in each.
#[derive(Debug, Default)]
struct Spaces(HashMap<u64, VecMemory>);

impl Spaces {
    fn space(&mut self, s: u64) -> &mut VecMemory {
        self.0.entry(s).or_default()
    }
}

impl MemoryAccess for Spaces {
    fn read(&self, space: u64, addr: u64, out: &mut [u8]) -> Result<(), MemoryError> {
        let m = self.0.get(&space).ok_or(MemoryError {
            addr,
            len: out.len(),
        })?;
        m.read(0, addr, out)
    }
    fn write(&mut self, space: u64, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        let len = data.len();
        let m = self.0.get_mut(&space).ok_or(MemoryError { addr, len })?;
        m.write(0, addr, data)
    }
}

fn rc_up(dev: &mut Engine<Spaces>, qpn: Qpn, remote: &str, dest: Qpn) {
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: Access::ALL_REMOTE.union(Access::LOCAL_WRITE),
        ..Default::default()
    };
    let m = AttrMask::STATE
        .union(AttrMask::PKEY_INDEX)
        .union(AttrMask::PORT)
        .union(AttrMask::ACCESS_FLAGS);
    dev.modify_qp(qpn, &a, m).unwrap();
    a.qp_state = QpState::Rtr;
    a.ah_attr = Some(AddressVector::new(remote.parse().unwrap()));
    a.dest_qp_num = dest;
    a.max_dest_rd_atomic = 4;
    let m = AttrMask::STATE
        .union(AttrMask::AV)
        .union(AttrMask::PATH_MTU)
        .union(AttrMask::DEST_QPN)
        .union(AttrMask::RQ_PSN)
        .union(AttrMask::MAX_DEST_RD_ATOMIC)
        .union(AttrMask::MIN_RNR_TIMER);
    dev.modify_qp(qpn, &a, m).unwrap();
    a.qp_state = QpState::Rts;
    a.timeout = 14;
    a.max_rd_atomic = 4;
    let m = AttrMask::STATE
        .union(AttrMask::TIMEOUT)
        .union(AttrMask::RETRY_CNT)
        .union(AttrMask::RNR_RETRY)
        .union(AttrMask::SQ_PSN)
        .union(AttrMask::MAX_QP_RD_ATOMIC);
    dev.modify_qp(qpn, &a, m).unwrap();
}

#[test]
fn memory_accesses_carry_the_address_space_of_the_pd() {
    let mut a = Engine::new(
        EngineConfig::new("10.0.0.1".parse().unwrap(), 1),
        Spaces::default(),
    );
    let mut b = Engine::new(
        EngineConfig::new("10.0.0.2".parse().unwrap(), 2),
        Spaces::default(),
    );
    let pa = a.alloc_pd_in(7);
    let src = a.memory_mut().space(7).alloc(64);
    a.memory_mut().space(7).fill(src, b"from process seven");
    let ka = a.reg_mr(pa, src, 64, Access::LOCAL_WRITE).unwrap();
    // Two processes on b, the same virtual address in each.
    let (p1, p2) = (b.alloc_pd_in(1), b.alloc_pd_in(2));
    let va = b.memory_mut().space(1).alloc(64);
    assert_eq!(b.memory_mut().space(2).alloc(64), va);
    let acc = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
    let k1 = b.reg_mr(p1, va, 64, acc).unwrap();
    let k2 = b.reg_mr(p2, va, 64, acc).unwrap();
    let cqa = a.create_cq(16).unwrap();
    let cqb = b.create_cq(16).unwrap();
    let init = |pd, cq| QpInit {
        pd,
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap: QpCap::default(),
        sq_sig_all: true,
    };
    let qa1 = a.create_qp(init(pa, cqa)).unwrap();
    let qa2 = a.create_qp(init(pa, cqa)).unwrap();
    let qb1 = b.create_qp(init(p1, cqb)).unwrap();
    let qb2 = b.create_qp(init(p2, cqb)).unwrap();
    rc_up(&mut a, qa1, "10.0.0.2", qb1);
    rc_up(&mut a, qa2, "10.0.0.2", qb2);
    rc_up(&mut b, qb1, "10.0.0.1", qa1);
    rc_up(&mut b, qb2, "10.0.0.1", qa2);
    let sge = |len| {
        Some(Sge {
            addr: src,
            length: len,
            lkey: ka.lkey,
        })
    };
    a.post_send(
        qa1,
        SendWr::new(1, SendOp::Write(RemoteAddr { va, rkey: k1.rkey }), sge(18)),
    )
    .unwrap();
    a.post_send(
        qa2,
        SendWr::new(2, SendOp::Write(RemoteAddr { va, rkey: k2.rkey }), sge(4)),
    )
    .unwrap();
    // The key of process 1 is no good through process 2's QP (another PD).
    a.post_send(
        qa2,
        SendWr::new(3, SendOp::Write(RemoteAddr { va, rkey: k1.rkey }), sge(4)),
    )
    .unwrap();
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    for _ in 0..10 {
        while let Some(t) = a.poll_transmit(0, &mut buf) {
            b.handle_packet(0, &buf[..t.len]);
        }
        while let Some(t) = b.poll_transmit(0, &mut buf) {
            a.handle_packet(0, &buf[..t.len]);
        }
    }
    let mut st: Vec<(u64, WcStatus)> = std::iter::from_fn(|| a.poll_cq(cqa))
        .map(|w| (w.wr_id, w.status))
        .collect();
    st.sort_by_key(|s| s.0);
    assert_eq!(
        st,
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::RemAccessErr)
        ]
    );
    assert_eq!(
        b.memory_mut().space(1).slice(va, 18),
        Some(&b"from process seven"[..])
    );
    assert_eq!(b.memory_mut().space(2).slice(va, 6), Some(&b"from\0\0"[..]));
}
