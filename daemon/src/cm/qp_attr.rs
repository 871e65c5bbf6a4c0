//! The QP attributes rdma_cm hands a program: `rdma_init_qp_attr`'s attributes and mask for
//! INIT, RTR and RTS (the QP stays the shim's, which modifies it as librdmacm does), and the
//! AH toward an id's peer.

use super::addressing::ROUTE_HOP_LIMIT;
use super::requests::{error, Reply};
use super::CmService;
use proto::cm::rdma_cm as rc;
use proto::ctl::{self, qp_type, AhAttr, QpAttr, Response};

/// `enum ibv_qp_attr_mask` bits.
pub mod qp_mask {
    pub const STATE: u32 = 1;
    pub const ACCESS_FLAGS: u32 = 1 << 3;
    pub const PKEY_INDEX: u32 = 1 << 4;
    pub const PORT: u32 = 1 << 5;
    pub const QKEY: u32 = 1 << 6;
    pub const AV: u32 = 1 << 7;
    pub const PATH_MTU: u32 = 1 << 8;
    pub const TIMEOUT: u32 = 1 << 9;
    pub const RETRY_CNT: u32 = 1 << 10;
    pub const RNR_RETRY: u32 = 1 << 11;
    pub const RQ_PSN: u32 = 1 << 12;
    pub const MAX_QP_RD_ATOMIC: u32 = 1 << 13;
    pub const MIN_RNR_TIMER: u32 = 1 << 15;
    pub const SQ_PSN: u32 = 1 << 16;
    pub const MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
    pub const DEST_QPN: u32 = 1 << 20;
}

/// `enum ibv_access_flags` bits rdma_cm grants.
mod access {
    pub const LOCAL_WRITE: u32 = 1;
    pub const REMOTE_WRITE: u32 = 2;
    pub const REMOTE_READ: u32 = 4;
    pub const REMOTE_ATOMIC: u32 = 8;
}

impl CmService {
    /// The AH toward the id's peer.
    pub(super) fn ah_of(&self, h: u32) -> AhAttr {
        let Some(x) = self.ids.get(&h) else {
            return AhAttr::default();
        };
        let path = x.path.unwrap_or_default();
        let gid_index = match (x.device, self.local_ip(x)) {
            (Some(d), Some(l)) => self.devices[d].gid_index_of(l, self.id_version(x)),
            _ => 0,
        };
        AhAttr {
            dgid: x.peer_ip.map_or(path.dgid, ctl::gid_of),
            flow_label: path.flow_label,
            sgid_index: gid_index as u8,
            hop_limit: if path.hop_limit == 0 {
                ROUTE_HOP_LIMIT
            } else {
                path.hop_limit
            },
            traffic_class: path.traffic_class,
            is_global: true,
            dlid: 0,
            sl: path.sl,
            src_path_bits: 0,
            static_rate: path.rate,
            port_num: 1,
        }
    }

    /// `rdma_init_qp_attr` (`cma_ib_init_qp_attr` / `ib_cm_init_qp_attr`, facts §5.2).
    pub(super) fn init_qp_attr(&self, h: u32, state: u32) -> Reply {
        use qp_mask as m;
        let Some(x) = self.ids.get(&h) else {
            return error(libc::EINVAL, "no such id");
        };
        let mut a = QpAttr {
            qp_state: state,
            ..QpAttr::default()
        };
        let mut mask = m::STATE;
        let ud = x.is_ud();
        let n = x.negotiated.map(|n| rc::qp_attrs(&n));
        match (state, ud) {
            (1, true) => {
                a.port_num = 1;
                a.qkey = x.qkey;
                mask |= m::PKEY_INDEX | m::PORT | m::QKEY;
            }
            (1, false) => {
                a.port_num = 1;
                a.qp_access_flags = match &n {
                    Some(q) => {
                        let mut f = access::LOCAL_WRITE | access::REMOTE_WRITE;
                        if q.access_remote_read_atomic {
                            f |= access::REMOTE_READ | access::REMOTE_ATOMIC;
                        }
                        f
                    }
                    None => 0,
                };
                mask |= m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS;
            }
            (2, true) => {}
            (3, true) => {
                a.sq_psn = x.local_psn;
                mask |= m::SQ_PSN;
            }
            (2, false) => {
                let Some(q) = n else {
                    return error(libc::EINVAL, "the connection parameters are not known yet");
                };
                a.path_mtu = u32::from(q.path_mtu);
                a.dest_qp_num = q.dest_qpn;
                a.rq_psn = q.rq_psn;
                a.ah_attr = self.ah_of(h);
                mask |= m::AV | m::PATH_MTU | m::DEST_QPN | m::RQ_PSN;
                if x.qp_type == qp_type::RC {
                    a.max_dest_rd_atomic = q.max_dest_rd_atomic;
                    a.min_rnr_timer = q.min_rnr_timer;
                    mask |= m::MAX_DEST_RD_ATOMIC | m::MIN_RNR_TIMER;
                }
            }
            (3, false) => {
                let Some(q) = n else {
                    return error(libc::EINVAL, "the connection parameters are not known yet");
                };
                a.sq_psn = q.sq_psn;
                mask |= m::SQ_PSN;
                if x.qp_type == qp_type::RC {
                    a.timeout = q.timeout;
                    a.retry_cnt = q.retry_cnt;
                    a.rnr_retry = q.rnr_retry;
                    a.max_rd_atomic = q.max_rd_atomic;
                    mask |= m::TIMEOUT | m::RETRY_CNT | m::RNR_RETRY | m::MAX_QP_RD_ATOMIC;
                }
            }
            _ => return error(libc::EINVAL, "rdma_init_qp_attr serves INIT, RTR and RTS"),
        }
        (Response::CmQpAttr { attr: a, mask }, Vec::new())
    }
}
