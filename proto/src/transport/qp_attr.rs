//! QP types, states, attributes, and the table of which attributes each state transition
//! requires and allows (IBTA Vol. 1 §10.3, table 91; the kernel's `ib_modify_qp_is_ok`).

use super::verbs::{Access, VerbsError, VerbsResult};
use crate::types::{Psn, Qkey, Qpn};
use std::net::IpAddr;

/// `ibv_qp_type` (the ones softroce implements).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    Rc,
    Uc,
    Ud,
    /// QP1, the general services interface: UD with a fixed Q_Key.
    Gsi,
}

impl QpType {
    pub fn is_ud(self) -> bool {
        matches!(self, QpType::Ud | QpType::Gsi)
    }
}

/// `ibv_qp_state`, same numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    Reset = 0,
    Init = 1,
    Rtr = 2,
    Rts = 3,
    Sqd = 4,
    Sqe = 5,
    Err = 6,
}

impl QpState {
    /// From `enum ibv_qp_state`.
    pub fn from_u32(v: u32) -> Option<QpState> {
        Some(match v {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            4 => QpState::Sqd,
            5 => QpState::Sqe,
            6 => QpState::Err,
            _ => return None,
        })
    }

    /// The responder processes requests in RTR and later (rxe: `qp->resp.state`).
    pub fn receives(self) -> bool {
        matches!(self, QpState::Rtr | QpState::Rts | QpState::Sqd)
    }
    /// The requester and completer run in RTS and SQD.
    pub fn sends(self) -> bool {
        matches!(self, QpState::Rts | QpState::Sqd)
    }
}

/// `ibv_qp_attr_mask` bits, same values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct AttrMask(pub u32);

impl AttrMask {
    pub const STATE: AttrMask = AttrMask(1);
    pub const CUR_STATE: AttrMask = AttrMask(1 << 1);
    pub const EN_SQD_ASYNC_NOTIFY: AttrMask = AttrMask(1 << 2);
    pub const ACCESS_FLAGS: AttrMask = AttrMask(1 << 3);
    pub const PKEY_INDEX: AttrMask = AttrMask(1 << 4);
    pub const PORT: AttrMask = AttrMask(1 << 5);
    pub const QKEY: AttrMask = AttrMask(1 << 6);
    pub const AV: AttrMask = AttrMask(1 << 7);
    pub const PATH_MTU: AttrMask = AttrMask(1 << 8);
    pub const TIMEOUT: AttrMask = AttrMask(1 << 9);
    pub const RETRY_CNT: AttrMask = AttrMask(1 << 10);
    pub const RNR_RETRY: AttrMask = AttrMask(1 << 11);
    pub const RQ_PSN: AttrMask = AttrMask(1 << 12);
    pub const MAX_QP_RD_ATOMIC: AttrMask = AttrMask(1 << 13);
    pub const ALT_PATH: AttrMask = AttrMask(1 << 14);
    pub const MIN_RNR_TIMER: AttrMask = AttrMask(1 << 15);
    pub const SQ_PSN: AttrMask = AttrMask(1 << 16);
    pub const MAX_DEST_RD_ATOMIC: AttrMask = AttrMask(1 << 17);
    pub const PATH_MIG_STATE: AttrMask = AttrMask(1 << 18);
    pub const CAP: AttrMask = AttrMask(1 << 19);
    pub const DEST_QPN: AttrMask = AttrMask(1 << 20);
    pub const NONE: AttrMask = AttrMask(0);

    pub const fn contains(self, other: AttrMask) -> bool {
        self.0 & other.0 == other.0
    }
    pub const fn union(self, other: AttrMask) -> AttrMask {
        AttrMask(self.0 | other.0)
    }
    pub const fn minus(self, other: AttrMask) -> AttrMask {
        AttrMask(self.0 & !other.0)
    }
    const fn of(bits: &[AttrMask]) -> AttrMask {
        let mut m = 0;
        let mut i = 0;
        while i < bits.len() {
            m |= bits[i].0;
            i += 1;
        }
        AttrMask(m)
    }
}

/// The path MTU (`ibv_mtu`: 1 = 256 .. 5 = 4096).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mtu {
    Mtu256 = 1,
    Mtu512 = 2,
    Mtu1024 = 3,
    Mtu2048 = 4,
    Mtu4096 = 5,
}

impl Mtu {
    pub const fn bytes(self) -> u32 {
        128 << (self as u32)
    }
    pub fn from_enum(v: u32) -> Option<Mtu> {
        Some(match v {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            4 => Mtu::Mtu2048,
            5 => Mtu::Mtu4096,
            _ => return None,
        })
    }
}

/// The address vector of a connected QP or an AH (RoCE v2: the GID is an IP address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddressVector {
    /// The remote GID as an IP address (IPv4 for `::ffff:a.b.c.d` GIDs).
    pub dgid: IpAddr,
    /// Index into the device's GID table: the local address packets leave from.
    pub sgid_index: u8,
    pub hop_limit: u8,
    /// Copied verbatim into the IPv4 TOS / IPv6 traffic class, ECN bits included (rxe).
    pub traffic_class: u8,
    pub flow_label: u32,
}

impl AddressVector {
    pub fn new(dgid: IpAddr) -> AddressVector {
        AddressVector {
            dgid,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
        }
    }
}

/// `ibv_qp_attr`: the values modify_qp may set; which ones count is given by the mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    pub qp_state: QpState,
    pub cur_qp_state: QpState,
    pub path_mtu: Mtu,
    pub qkey: Qkey,
    pub rq_psn: Psn,
    pub sq_psn: Psn,
    pub dest_qp_num: Qpn,
    pub qp_access_flags: Access,
    pub ah_attr: Option<AddressVector>,
    pub pkey_index: u16,
    pub en_sqd_async_notify: bool,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
}

impl Default for QpAttr {
    fn default() -> Self {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: Mtu::Mtu1024,
            qkey: Qkey(0),
            rq_psn: Psn::new(0),
            sq_psn: Psn::new(0),
            dest_qp_num: Qpn::new(0),
            qp_access_flags: Access::NONE,
            ah_attr: None,
            pkey_index: 0,
            en_sqd_async_notify: false,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            port_num: 1,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
        }
    }
}

use AttrMask as M;

/// Required and optional attributes of one transition for one QP type, or `None` when the
/// transition does not exist. Mirrors IBTA table 91 as the kernel's `qp_state_table` encodes
/// it (roce-rxe-facts.md §5.2). `STATE` itself is implied.
pub fn transition_attrs(cur: QpState, next: QpState, ty: QpType) -> Option<(AttrMask, AttrMask)> {
    use QpState::*;
    use QpType::*;
    let none = M::NONE;
    let uc_rc_init_opt = M::of(&[M::PKEY_INDEX, M::PORT, M::ACCESS_FLAGS]);
    let ud_init_opt = M::of(&[M::PKEY_INDEX, M::PORT, M::QKEY]);
    let gsi_init_opt = M::of(&[M::PKEY_INDEX, M::QKEY]);
    let uc_rts_opt = M::of(&[
        M::CUR_STATE,
        M::ALT_PATH,
        M::ACCESS_FLAGS,
        M::PATH_MIG_STATE,
    ]);
    let ud_rts_opt = M::of(&[M::CUR_STATE, M::QKEY]);
    Some(match (cur, next) {
        (_, Reset) | (_, Err) => (none, none),
        (Reset, Init) => match ty {
            Ud => (ud_init_opt, none),
            Gsi => (gsi_init_opt, none),
            Uc | Rc => (uc_rc_init_opt, none),
        },
        (Init, Init) => match ty {
            Ud => (none, ud_init_opt),
            Gsi => (none, gsi_init_opt),
            Uc | Rc => (none, uc_rc_init_opt),
        },
        (Init, Rtr) => match ty {
            Ud | Gsi => (none, M::of(&[M::PKEY_INDEX, M::QKEY])),
            Uc => (
                M::of(&[M::AV, M::PATH_MTU, M::DEST_QPN, M::RQ_PSN]),
                M::of(&[M::ALT_PATH, M::ACCESS_FLAGS, M::PKEY_INDEX]),
            ),
            Rc => (
                M::of(&[
                    M::AV,
                    M::PATH_MTU,
                    M::DEST_QPN,
                    M::RQ_PSN,
                    M::MAX_DEST_RD_ATOMIC,
                    M::MIN_RNR_TIMER,
                ]),
                M::of(&[M::ALT_PATH, M::ACCESS_FLAGS, M::PKEY_INDEX]),
            ),
        },
        (Rtr, Rts) => match ty {
            Ud | Gsi => (M::SQ_PSN, ud_rts_opt),
            Uc => (M::SQ_PSN, uc_rts_opt),
            Rc => (
                M::of(&[
                    M::TIMEOUT,
                    M::RETRY_CNT,
                    M::RNR_RETRY,
                    M::SQ_PSN,
                    M::MAX_QP_RD_ATOMIC,
                ]),
                uc_rts_opt.union(M::MIN_RNR_TIMER),
            ),
        },
        (Rts, Rts) | (Sqd, Rts) => match ty {
            Ud | Gsi => (none, ud_rts_opt),
            Uc => (none, uc_rts_opt),
            Rc => (none, uc_rts_opt.union(M::MIN_RNR_TIMER)),
        },
        (Rts, Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => match ty {
            Ud | Gsi => (none, M::of(&[M::PKEY_INDEX, M::QKEY])),
            Uc => (
                none,
                M::of(&[
                    M::AV,
                    M::ALT_PATH,
                    M::ACCESS_FLAGS,
                    M::PKEY_INDEX,
                    M::PATH_MIG_STATE,
                ]),
            ),
            Rc => (
                none,
                M::of(&[
                    M::PORT,
                    M::AV,
                    M::TIMEOUT,
                    M::RETRY_CNT,
                    M::RNR_RETRY,
                    M::MAX_QP_RD_ATOMIC,
                    M::MAX_DEST_RD_ATOMIC,
                    M::ALT_PATH,
                    M::ACCESS_FLAGS,
                    M::PKEY_INDEX,
                    M::MIN_RNR_TIMER,
                    M::PATH_MIG_STATE,
                ]),
            ),
        },
        (Sqe, Rts) => match ty {
            Ud | Gsi => (none, M::of(&[M::CUR_STATE, M::QKEY])),
            Uc => (none, M::of(&[M::CUR_STATE, M::ACCESS_FLAGS])),
            Rc => return None,
        },
        _ => return None,
    })
}

/// Validates a modify_qp call the way `ib_modify_qp_is_ok` and rxe's `rxe_qp_chk_attr` do:
/// the transition must exist, every required attribute must be present, nothing outside
/// required ∪ optional ∪ STATE may be set, CUR_STATE only from RTR/RTS/SQD/SQE, and the
/// values must be in range. Returns the target state.
pub fn check_modify(
    cur: QpState,
    ty: QpType,
    attr: &QpAttr,
    mask: AttrMask,
) -> VerbsResult<QpState> {
    let next = if mask.contains(M::STATE) {
        attr.qp_state
    } else {
        cur
    };
    if mask.contains(M::CUR_STATE) {
        if !matches!(
            cur,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) {
            return Err(VerbsError::Invalid("CUR_STATE only from RTR/RTS/SQD/SQE"));
        }
        if attr.cur_qp_state != cur {
            return Err(VerbsError::Invalid("cur_qp_state does not match"));
        }
    }
    if next == QpState::Sqe && cur != QpState::Sqe {
        // rxe only warns; the spec does not let a consumer enter SQE.
        return Err(VerbsError::Invalid("SQE cannot be entered by modify_qp"));
    }
    let (req, opt) = transition_attrs(cur, next, ty)
        .ok_or(VerbsError::Invalid("no such QP state transition"))?;
    if !mask.contains(req) {
        return Err(VerbsError::Invalid("a required attribute is missing"));
    }
    let allowed = req.union(opt).union(M::STATE);
    if mask.minus(allowed) != M::NONE {
        return Err(VerbsError::Invalid(
            "an attribute not allowed in this transition",
        ));
    }
    if mask.contains(M::PORT) && attr.port_num != 1 {
        return Err(VerbsError::Invalid("port must be 1"));
    }
    if mask.contains(M::TIMEOUT) && attr.timeout > 31 {
        return Err(VerbsError::Invalid("timeout above 31"));
    }
    if mask.contains(M::MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > 128 {
        return Err(VerbsError::Invalid("max_rd_atomic above 128"));
    }
    if mask.contains(M::MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic > 128 {
        return Err(VerbsError::Invalid("max_dest_rd_atomic above 128"));
    }
    if mask.contains(M::RETRY_CNT) && attr.retry_cnt > 7 {
        return Err(VerbsError::Invalid("retry_cnt above 7"));
    }
    if mask.contains(M::RNR_RETRY) && attr.rnr_retry > 7 {
        return Err(VerbsError::Invalid("rnr_retry above 7"));
    }
    if mask.contains(M::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
        return Err(VerbsError::Invalid("min_rnr_timer above 31"));
    }
    if mask.contains(M::AV) && attr.ah_attr.is_none() {
        return Err(VerbsError::Invalid("AV mask without an address vector"));
    }
    if mask.contains(M::PKEY_INDEX) && attr.pkey_index != 0 {
        // rxe's P_Key table has one entry.
        return Err(VerbsError::Invalid("pkey_index out of range"));
    }
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rc_init_mask() -> AttrMask {
        M::of(&[M::STATE, M::PKEY_INDEX, M::PORT, M::ACCESS_FLAGS])
    }

    #[test]
    fn rc_reset_to_init_needs_access_flags() {
        let attr = QpAttr {
            qp_state: QpState::Init,
            ..Default::default()
        };
        assert_eq!(
            check_modify(QpState::Reset, QpType::Rc, &attr, rc_init_mask()),
            Ok(QpState::Init)
        );
        let missing = rc_init_mask().minus(M::ACCESS_FLAGS);
        assert!(check_modify(QpState::Reset, QpType::Rc, &attr, missing).is_err());
        // QKEY is a UD attribute: extra bits are refused.
        assert!(check_modify(
            QpState::Reset,
            QpType::Rc,
            &attr,
            rc_init_mask().union(M::QKEY)
        )
        .is_err());
        // UD needs QKEY instead of ACCESS_FLAGS.
        let ud = M::of(&[M::STATE, M::PKEY_INDEX, M::PORT, M::QKEY]);
        assert!(check_modify(QpState::Reset, QpType::Ud, &attr, ud).is_ok());
        assert!(check_modify(QpState::Reset, QpType::Ud, &attr, rc_init_mask()).is_err());
    }

    #[test]
    fn rc_rtr_requires_rd_atomic_and_rnr_timer_but_uc_refuses_them() {
        let attr = QpAttr {
            qp_state: QpState::Rtr,
            ah_attr: Some(AddressVector::new("10.0.0.2".parse().unwrap())),
            ..Default::default()
        };
        let uc = M::of(&[M::STATE, M::AV, M::PATH_MTU, M::DEST_QPN, M::RQ_PSN]);
        let rc = uc.union(M::MAX_DEST_RD_ATOMIC).union(M::MIN_RNR_TIMER);
        assert!(check_modify(QpState::Init, QpType::Rc, &attr, uc).is_err());
        assert!(check_modify(QpState::Init, QpType::Rc, &attr, rc).is_ok());
        assert!(check_modify(QpState::Init, QpType::Uc, &attr, uc).is_ok());
        assert!(check_modify(QpState::Init, QpType::Uc, &attr, rc).is_err());
    }

    #[test]
    fn illegal_transitions_and_values() {
        let mut attr = QpAttr {
            qp_state: QpState::Rts,
            ..Default::default()
        };
        // RESET -> RTS skips states.
        assert!(check_modify(QpState::Reset, QpType::Rc, &attr, M::STATE).is_err());
        // Anything -> ERR / RESET needs nothing.
        attr.qp_state = QpState::Err;
        assert_eq!(
            check_modify(QpState::Rts, QpType::Rc, &attr, M::STATE),
            Ok(QpState::Err)
        );
        attr.qp_state = QpState::Reset;
        assert_eq!(
            check_modify(QpState::Err, QpType::Uc, &attr, M::STATE),
            Ok(QpState::Reset)
        );
        // CUR_STATE is refused from INIT.
        attr.qp_state = QpState::Init;
        assert!(check_modify(
            QpState::Init,
            QpType::Rc,
            &attr,
            M::STATE.union(M::CUR_STATE)
        )
        .is_err());
        // timeout 32 is out of range.
        attr.qp_state = QpState::Rts;
        attr.timeout = 32;
        let rts = M::of(&[
            M::STATE,
            M::TIMEOUT,
            M::RETRY_CNT,
            M::RNR_RETRY,
            M::SQ_PSN,
            M::MAX_QP_RD_ATOMIC,
        ]);
        assert!(check_modify(QpState::Rtr, QpType::Rc, &attr, rts).is_err());
        attr.timeout = 14;
        assert!(check_modify(QpState::Rtr, QpType::Rc, &attr, rts).is_ok());
        // SQE -> RTS exists for UC/UD but not RC.
        assert!(check_modify(QpState::Sqe, QpType::Rc, &attr, M::STATE).is_err());
        assert!(check_modify(QpState::Sqe, QpType::Uc, &attr, M::STATE).is_ok());
    }
}
