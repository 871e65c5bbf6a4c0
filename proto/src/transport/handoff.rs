//! Handing a QP's transport from one engine to another: what the same-host fast path needs
//! (docs/architecture.md, "The same-host fast path").
//!
//! Between two QPs of one device the daemon lets the sending process run the transport
//! itself: the requester of its QP and the responder of the peer QP move into engines inside
//! that process, and come back when the daemon revokes them. Nothing of the transport is
//! re-implemented for that: the same [`Engine`] runs on both sides, and this module only moves
//! a QP's configuration and sequence numbers between engines.
//!
//! A half is only ever moved while it is *idle* ([`Engine::requester_idle`],
//! [`Engine::responder_idle`]): nothing sent and unacknowledged, no message half received, no
//! answer queued, no timer armed. Then a QP's whole transport state is its configuration, its
//! four sequence numbers ([`QpSequence`]) and the receive WQEs its responder holds, which is
//! all this module carries.

use super::engine::Engine;
use super::memory::MemoryAccess;
use super::qp::QpInit;
use super::qp_attr::{QpAttr, QpState};
use super::resources::Mr;
use super::verbs::{Access, RecvWr, VerbsError, VerbsResult};
use super::MrKeys;
use crate::types::{Psn, Qpn};

/// The sequence state of an idle QP: requester (next PSN, oldest unacknowledged PSN, which
/// are equal when idle) and responder (expected PSN, MSN).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpSequence {
    pub req_psn: Psn,
    pub comp_psn: Psn,
    pub resp_psn: Psn,
    pub msn: u32,
}

/// What a QP is, apart from its queues: enough to make the same QP in another engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpConfig {
    pub qpn: Qpn,
    pub init: QpInit,
    pub attr: QpAttr,
    pub state: QpState,
}

impl<M: MemoryAccess> Engine<M> {
    /// The QP's configuration (its `init` names this engine's PD and CQs).
    pub fn qp_config(&self, qpn: Qpn) -> Option<QpConfig> {
        let qp = self.qps.get(&qpn)?;
        Some(QpConfig {
            qpn,
            init: qp.init,
            attr: qp.attr,
            state: qp.state,
        })
    }

    /// Makes QP `config.qpn` here with `config`'s attributes and state, as the engine it
    /// came from holds it, without walking the state transitions again (they were checked
    /// there). `init`'s PD and CQs must be this engine's. Returns the QPN.
    pub fn import_qp(&mut self, config: &QpConfig, seq: &QpSequence) -> VerbsResult<Qpn> {
        if self.qps.contains_key(&config.qpn) {
            return Err(VerbsError::Busy("QPN in use"));
        }
        let qpn = self.create_qp_numbered(config.init, Some(config.qpn))?;
        let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::NotFound("QP"))?;
        qp.attr = config.attr;
        qp.retry_left = config.attr.retry_cnt;
        qp.rnr_retry_left = config.attr.rnr_retry;
        qp.resize_resources();
        if let (Some(av), false) = (qp.attr.ah_attr, qp.ty.is_ud()) {
            qp.src_port = super::qp::udp_sport_for_flow(av.flow_label, qp.qpn, qp.attr.dest_qp_num);
        }
        qp.state = config.state;
        self.set_qp_sequence(qpn, seq);
        Ok(qpn)
    }

    /// The QP's sequence numbers.
    pub fn qp_sequence(&self, qpn: Qpn) -> Option<QpSequence> {
        let qp = self.qps.get(&qpn)?;
        Some(QpSequence {
            req_psn: qp.req_psn,
            comp_psn: qp.comp_psn,
            resp_psn: qp.resp_psn,
            msn: qp.msn,
        })
    }

    /// Sets the QP's sequence numbers (to those of the engine its halves come back from).
    pub fn set_qp_sequence(&mut self, qpn: Qpn, seq: &QpSequence) {
        if let Some(qp) = self.qps.get_mut(&qpn) {
            qp.req_psn = seq.req_psn;
            qp.comp_psn = seq.comp_psn;
            qp.resp_psn = seq.resp_psn;
            qp.msn = seq.msn;
            qp.next_segment = None;
        }
    }

    /// Sets only the requester's sequence numbers.
    pub fn set_requester_sequence(&mut self, qpn: Qpn, req_psn: Psn, comp_psn: Psn) {
        if let Some(qp) = self.qps.get_mut(&qpn) {
            qp.req_psn = req_psn;
            qp.comp_psn = comp_psn;
            qp.next_segment = None;
        }
    }

    /// Sets only the responder's sequence numbers.
    pub fn set_responder_sequence(&mut self, qpn: Qpn, resp_psn: Psn, msn: u32) {
        if let Some(qp) = self.qps.get_mut(&qpn) {
            qp.resp_psn = resp_psn;
            qp.msn = msn;
        }
    }

    /// The requester and completer have nothing in flight: no WQE queued, no retry pending,
    /// no timer armed. (A QP not in a sending state is idle too.)
    pub fn requester_idle(&self, qpn: Qpn) -> bool {
        self.qps.get(&qpn).is_some_and(|q| {
            q.sq.is_empty()
                && !q.need_retry
                && q.retrans_deadline.is_none()
                && q.rnr_wait_until.is_none()
                && q.paced_until.is_none()
        })
    }

    /// The responder is between messages and owes no answer (the receive WQEs it holds are
    /// moved with [`Engine::take_recvs`]).
    pub fn responder_idle(&self, qpn: Qpn) -> bool {
        self.qps
            .get(&qpn)
            .is_some_and(|q| q.in_msg.is_none() && q.resp_out.is_empty())
    }

    /// Takes the receive WQEs posted to the QP's own receive queue, oldest first.
    pub fn take_recvs(&mut self, qpn: Qpn) -> Vec<RecvWr> {
        self.qps
            .get_mut(&qpn)
            .map(|q| q.rq.drain(..).collect())
            .unwrap_or_default()
    }

    /// Puts receive WQEs back in front of the QP's receive queue, in their order (those
    /// another engine took and did not use).
    pub fn return_recvs(&mut self, qpn: Qpn, recvs: Vec<RecvWr>) {
        if let Some(q) = self.qps.get_mut(&qpn) {
            for r in recvs.into_iter().rev() {
                q.rq.push_front(r);
            }
        }
    }

    /// Whether the SRQ may be lent to another engine as one QP's receive queue: exactly one
    /// QP uses it and no limit is armed (the limit event is the daemon's to raise).
    pub fn srq_lendable(&self, srq: u32) -> bool {
        self.ctx
            .srqs
            .get(&srq)
            .is_some_and(|s| s.users == 1 && s.limit == 0)
    }

    /// Takes the receive WQEs the SRQ holds, oldest first.
    pub fn take_srq_recvs(&mut self, srq: u32) -> Vec<RecvWr> {
        self.ctx
            .srqs
            .get_mut(&srq)
            .map(|s| s.queue.drain(..).collect())
            .unwrap_or_default()
    }

    /// Puts receive WQEs back in front of the SRQ, in their order (those another engine
    /// took and did not use).
    pub fn return_srq_recvs(&mut self, srq: u32, recvs: Vec<RecvWr>) {
        if let Some(s) = self.ctx.srqs.get_mut(&srq) {
            for r in recvs.into_iter().rev() {
                s.queue.push_front(r);
            }
        }
    }

    /// Registers an MR under the index and keys another engine gave it (a mirror of a peer
    /// process's MR). Replaces an MR of the same index.
    pub fn insert_mr(
        &mut self,
        pd: u32,
        keys: MrKeys,
        addr: u64,
        length: u64,
        access: Access,
    ) -> VerbsResult<()> {
        let space = self.pd_space(pd)?;
        let mr = Mr {
            pd,
            space,
            addr,
            length,
            access,
            lkey: keys.lkey.0,
            rkey: keys.rkey.0,
            valid: true,
            windows: 0,
        };
        // The MR keeps its index from the other engine only in `imported_mrs`: here it has a
        // handle of this engine's table. Its key's tag names it, as for one this engine
        // registered (a replaced MR's old tag goes).
        let (handle, old) = match self.imported_mrs.get(&keys.handle).copied() {
            Some(h) => {
                let slot = self.ctx.mrs.get_mut(&h).ok_or(VerbsError::NotFound("MR"))?;
                (h, Some(std::mem::replace(slot, mr)))
            }
            None => {
                let h = self
                    .ctx
                    .mrs
                    .insert(mr)
                    .ok_or(VerbsError::NoResources("MRs"))?;
                self.imported_mrs.insert(keys.handle, h);
                (h, None)
            }
        };
        if let Some(old) = &old {
            if old.lkey >> 8 != keys.lkey.0 >> 8 {
                self.ctx.key_tags.remove(&(old.lkey >> 8));
            }
        }
        self.ctx
            .key_tags
            .insert(keys.lkey.0 >> 8, super::resources::KeyOwner::Mr(handle));
        match old {
            Some(old) if old.pd != pd => {
                self.pd_users(old.pd, -1);
                self.pd_users(pd, 1);
            }
            Some(_) => {}
            None => self.pd_users(pd, 1),
        }
        Ok(())
    }

    /// Removes an MR [`Engine::insert_mr`] made (by its index in the engine it came from).
    pub fn remove_mr(&mut self, index: u32) {
        let Some(handle) = self.imported_mrs.remove(&index) else {
            return;
        };
        if let Some(mr) = self.ctx.mrs.remove(&handle) {
            if self.ctx.key_tags.get(&(mr.lkey >> 8))
                == Some(&super::resources::KeyOwner::Mr(handle))
            {
                self.ctx.key_tags.remove(&(mr.lkey >> 8));
            }
            self.pd_users(mr.pd, -1);
        }
    }

    /// An MR as [`Engine::insert_mr`] takes it: (PD, keys, address, length, access).
    pub fn mr_info(&self, index: u32) -> Option<(u32, MrKeys, u64, u64, Access)> {
        let mr = self.ctx.mrs.get(&index)?;
        Some((
            mr.pd,
            MrKeys {
                handle: index,
                lkey: crate::types::Lkey(mr.lkey),
                rkey: crate::types::Rkey(mr.rkey),
            },
            mr.addr,
            mr.length,
            mr.access,
        ))
    }

    /// The indexes of every registered MR.
    pub fn mr_indexes(&self) -> Vec<u32> {
        self.ctx.mrs.iter().map(|(h, _)| h).collect()
    }

    /// Turns [`super::EngineConfig::coalesce_acks`] on or off (the shim's direction engines
    /// set it in their config; tests here).
    pub fn set_coalesce_acks(&mut self, on: bool) {
        self.ctx.config.coalesce_acks = on;
    }

    /// Adds counters another engine kept for QP `qpn` of this engine's client (the engines of
    /// a fast path direction, when it comes back), to the engine's and the QP's.
    pub fn absorb_counters(&mut self, qpn: Qpn, c: &super::Counters) {
        self.ctx.counters.accumulate(c);
        // The other engine ran this one QP: its share is this QP's too.
        if let Some(q) = self.qps.get_mut(&qpn) {
            q.counters.accumulate(c);
        }
    }

    fn pd_users(&mut self, pd: u32, delta: i32) {
        if let Some(p) = self.ctx.pds.get_mut(&pd) {
            p.users = p.users.saturating_add_signed(delta);
        }
    }
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;
    use crate::sim::{LinkModel, QpOptions, Sim};
    use crate::transport::*;

    /// The requester half of a QP moves to another engine while idle, sends there, and comes
    /// back with its sequence numbers: the peer sees one uninterrupted stream of PSNs.
    #[test]
    fn an_idle_requester_moves_to_another_engine_and_back() {
        let mut sim = Sim::pair(3, LinkModel::default());
        let o = QpOptions::default();
        let (qa, qb) = sim.connect(0, 1, &o);
        let acc = Access::ALL_REMOTE.union(Access::LOCAL_WRITE);
        let (src, ks) = sim.alloc_mr(0, 4096, acc);
        let (dst, kd) = sim.alloc_mr(1, 4096, acc);
        let write = |wr_id| {
            SendWr::new(
                wr_id,
                SendOp::Write(RemoteAddr {
                    va: dst,
                    rkey: kd.rkey,
                }),
                Some(Sge {
                    addr: src,
                    length: 100,
                    lkey: ks.lkey,
                }),
            )
        };
        sim.post_send(0, qa, write(1)).unwrap();
        sim.run(1_000_000);
        assert!(sim.dev(0).requester_idle(qa));
        assert!(sim.dev(1).responder_idle(qb));
        let config = sim.dev(0).qp_config(qa).unwrap();
        let seq = sim.dev(0).qp_sequence(qa).unwrap();
        assert_eq!(seq.req_psn, seq.comp_psn);

        // Another engine with the same address (a second process on the host), the same PD,
        // CQ and MR, takes the requester.
        let mut other = Engine::new(
            EngineConfig::new(sim.dev(0).gids()[0], 9),
            sim.dev(0).memory().clone(),
        );
        let pd = other.alloc_pd();
        let cq = other.create_cq(64).unwrap();
        other
            .insert_mr(pd, ks, src, 4096, Access::LOCAL_WRITE)
            .unwrap();
        let mut c = config;
        c.init.pd = pd;
        c.init.send_cq = cq;
        c.init.recv_cq = cq;
        assert_eq!(other.import_qp(&c, &seq).unwrap(), qa);
        other.post_send(qa, write(2)).unwrap();
        let mut buf = vec![0u8; MAX_FRAME_LEN];
        while let Some(tx) = other.poll_transmit(0, &mut buf) {
            let packet = buf[..tx.len].to_vec();
            sim.dev(1).handle_packet(0, &packet);
            while let Some(tx) = sim.dev(1).poll_transmit(0, &mut buf) {
                other.handle_packet(0, &buf[..tx.len]);
            }
        }
        let wc = other
            .poll_cq(cq)
            .expect("the WRITE completed in the other engine");
        assert_eq!((wc.wr_id, wc.status), (2, WcStatus::Success));
        assert!(other.requester_idle(qa));

        // Back: the first engine continues from the other's sequence numbers.
        let back = other.qp_sequence(qa).unwrap();
        assert_eq!(back.req_psn, seq.req_psn.add(1));
        sim.dev(0)
            .set_requester_sequence(qa, back.req_psn, back.comp_psn);
        sim.post_send(0, qa, write(3)).unwrap();
        sim.run(1_000_000);
        sim.check_all_sends_completed();
        assert_eq!(sim.dev(1).counters().out_of_seq_request, 0);
        assert_eq!(sim.dev(1).counters().duplicate_request, 0);
        assert_eq!(
            sim.dev(1).qp_sequence(qb).unwrap().resp_psn,
            back.req_psn.add(1)
        );
    }

    #[test]
    fn receive_wqes_move_and_come_back_in_order() {
        let mut sim = Sim::pair(4, LinkModel::default());
        let (_, qb) = sim.connect(0, 1, &QpOptions::default());
        let (dst, kd) = sim.alloc_mr(1, 4096, Access::LOCAL_WRITE);
        for i in 0..3 {
            sim.post_recv(
                1,
                qb,
                RecvWr {
                    wr_id: i,
                    sg_list: vec![Sge {
                        addr: dst,
                        length: 64,
                        lkey: kd.lkey,
                    }],
                },
            )
            .unwrap();
        }
        let mut taken = sim.dev(1).take_recvs(qb);
        assert_eq!(taken.iter().map(|r| r.wr_id).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(sim.dev(1).rq_len(qb), Some(0));
        taken.remove(0);
        sim.dev(1).return_recvs(qb, taken);
        assert_eq!(
            sim.dev(1)
                .take_recvs(qb)
                .iter()
                .map(|r| r.wr_id)
                .collect::<Vec<_>>(),
            [1, 2]
        );
    }

    /// An SRQ is lendable while exactly one QP uses it and no limit is armed; its WQEs move
    /// out and the unused ones come back in front, in order.
    #[test]
    fn an_srq_feeding_one_qp_is_lent_with_its_wqes() {
        let mut e = Engine::new(
            EngineConfig::new("127.0.0.1".parse().unwrap(), 1),
            VecMemory::new(),
        );
        let pd = e.alloc_pd();
        let cq = e.create_cq(64).unwrap();
        let srq = e.create_srq(pd, 16, 1).unwrap();
        let init = QpInit {
            pd,
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq: Some(srq),
            cap: QpCap {
                max_send_wr: 4,
                max_recv_wr: 0,
                max_send_sge: 1,
                max_recv_sge: 0,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        };
        assert!(!e.srq_lendable(srq), "no QP uses it yet");
        let q1 = e.create_qp(init).unwrap();
        assert!(e.srq_lendable(srq));
        for i in 0..3 {
            e.post_srq_recv(
                srq,
                RecvWr {
                    wr_id: i,
                    sg_list: vec![],
                },
            )
            .unwrap();
        }
        let mut taken = e.take_srq_recvs(srq);
        assert_eq!(taken.iter().map(|r| r.wr_id).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(e.srq_len(srq), Some(0));
        taken.remove(0);
        e.return_srq_recvs(srq, taken);
        let back: Vec<u64> = e.take_srq_recvs(srq).iter().map(|r| r.wr_id).collect();
        assert_eq!(back, [1, 2]);
        e.arm_srq_limit(srq, 1).unwrap();
        assert!(!e.srq_lendable(srq), "its limit is armed");
        e.arm_srq_limit(srq, 0).unwrap();
        let q2 = e.create_qp(init).unwrap();
        assert!(!e.srq_lendable(srq), "two QPs use it");
        e.destroy_qp(q2).unwrap();
        assert!(e.srq_lendable(srq));
        let _ = q1;
    }
}
