//! What an engine holds, for the operator (`softroce res show`, `softroce stat qp`), in the
//! shape of `rdma resource show`: one summary per PD, MR, CQ, SRQ and QP. Read-only views
//! built on demand; nothing on the data path.

use super::counters::Counters;
use super::engine::Engine;
use super::memory::MemoryAccess;
use super::qp_attr::{QpState, QpType};
use crate::types::{Psn, Qpn};

/// A QP (`rdma resource show qp`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpSummary {
    pub qpn: Qpn,
    pub qp_type: QpType,
    pub state: QpState,
    pub pd: u32,
    pub send_cq: u32,
    pub recv_cq: u32,
    pub srq: Option<u32>,
    /// The next PSN the requester sends and the one the responder expects.
    pub sq_psn: Psn,
    pub rq_psn: Psn,
    /// The connected peer QP (RC/UC after RTR), else 0.
    pub dest_qpn: Qpn,
    /// The path MTU in bytes (0 before RTR).
    pub path_mtu: u32,
    /// Work requests posted and not yet completed.
    pub sq_outstanding: usize,
    pub rq_posted: usize,
}

/// A memory region (`rdma resource show mr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrSummary {
    pub handle: u32,
    pub pd: u32,
    pub lkey: u32,
    pub rkey: u32,
    pub addr: u64,
    pub length: u64,
    /// `ibv_access_flags` bits.
    pub access: u32,
}

/// A completion queue (`rdma resource show cq`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqSummary {
    pub handle: u32,
    pub cqe: usize,
    /// QPs that use it.
    pub users: u32,
}

/// A protection domain (`rdma resource show pd`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PdSummary {
    pub handle: u32,
    /// MRs, MWs, AHs, QPs and SRQs that use it.
    pub users: u32,
}

/// A shared receive queue (`rdma resource show srq`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqSummary {
    pub handle: u32,
    pub pd: u32,
    pub max_wr: u32,
    pub posted: usize,
    pub limit: u32,
}

impl<M: MemoryAccess> Engine<M> {
    /// Every QP, in QPN order.
    pub fn qp_summaries(&self) -> Vec<QpSummary> {
        let mut out: Vec<QpSummary> = self
            .qps
            .values()
            .map(|q| QpSummary {
                qpn: q.qpn,
                qp_type: q.ty,
                state: q.state,
                pd: q.init.pd,
                send_cq: q.init.send_cq,
                recv_cq: q.init.recv_cq,
                srq: q.init.srq,
                sq_psn: q.req_psn,
                rq_psn: q.resp_psn,
                dest_qpn: q.attr.dest_qp_num,
                path_mtu: if q.state == QpState::Reset || q.state == QpState::Init {
                    0
                } else {
                    q.mtu()
                },
                sq_outstanding: q.sq.len(),
                rq_posted: q.rq.len(),
            })
            .collect();
        out.sort_by_key(|q| q.qpn.value());
        out
    }

    /// One QP's counters (its share of [`Engine::counters`]).
    pub fn qp_counters(&self, qpn: Qpn) -> Option<&Counters> {
        self.qps.get(&qpn).map(|q| &q.counters)
    }

    /// Every QP's counters, in QPN order.
    pub fn all_qp_counters(&self) -> Vec<(Qpn, Counters)> {
        let mut out: Vec<(Qpn, Counters)> =
            self.qps.values().map(|q| (q.qpn, q.counters)).collect();
        out.sort_by_key(|(q, _)| q.value());
        out
    }

    pub fn mr_summaries(&self) -> Vec<MrSummary> {
        let mut out: Vec<MrSummary> = self
            .ctx
            .mrs
            .iter()
            .map(|(handle, m)| MrSummary {
                handle,
                pd: m.pd,
                lkey: m.lkey,
                rkey: m.rkey,
                addr: m.addr,
                length: m.length,
                access: m.access.0,
            })
            .collect();
        out.sort_by_key(|m| m.handle);
        out
    }

    pub fn cq_summaries(&self) -> Vec<CqSummary> {
        let mut out: Vec<CqSummary> = self
            .ctx
            .cqs
            .iter()
            .map(|(handle, c)| CqSummary {
                handle,
                cqe: c.capacity,
                users: c.users,
            })
            .collect();
        out.sort_by_key(|c| c.handle);
        out
    }

    pub fn pd_summaries(&self) -> Vec<PdSummary> {
        let mut out: Vec<PdSummary> = self
            .ctx
            .pds
            .iter()
            .map(|(handle, p)| PdSummary {
                handle,
                users: p.users,
            })
            .collect();
        out.sort_by_key(|p| p.handle);
        out
    }

    pub fn srq_summaries(&self) -> Vec<SrqSummary> {
        let mut out: Vec<SrqSummary> = self
            .ctx
            .srqs
            .iter()
            .map(|(handle, s)| SrqSummary {
                handle,
                pd: s.pd,
                max_wr: s.max_wr,
                posted: s.queue.len(),
                limit: s.limit,
            })
            .collect();
        out.sort_by_key(|s| s.handle);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use std::net::{IpAddr, Ipv4Addr};

    #[test]
    fn summaries_list_what_was_created() {
        let gid = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let mut e = Engine::new(EngineConfig::new(gid, 7), VecMemory::new());
        let pd = e.alloc_pd();
        let cq = e.create_cq(16).unwrap();
        let mr = e
            .reg_mr(
                pd,
                0x1000,
                4096,
                Access::LOCAL_WRITE.union(Access::REMOTE_WRITE),
            )
            .unwrap();
        let qpn = e
            .create_qp(QpInit {
                pd,
                qp_type: QpType::Rc,
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
            })
            .unwrap();
        let qps = e.qp_summaries();
        assert_eq!(qps.len(), 1);
        assert_eq!(
            (qps[0].qpn, qps[0].qp_type, qps[0].state),
            (qpn, QpType::Rc, QpState::Reset)
        );
        assert_eq!((qps[0].pd, qps[0].send_cq, qps[0].path_mtu), (pd, cq, 0));
        let mrs = e.mr_summaries();
        assert_eq!(mrs.len(), 1);
        assert_eq!((mrs[0].lkey, mrs[0].length), (mr.lkey.value(), 4096));
        assert_eq!(e.cq_summaries()[0].handle, cq);
        assert_eq!(e.pd_summaries()[0].users, 2, "the MR and the QP");
        assert_eq!(e.qp_counters(qpn), Some(&Counters::default()));
        assert!(e.srq_summaries().is_empty());
    }
}
