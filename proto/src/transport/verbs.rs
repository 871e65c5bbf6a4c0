//! The verbs-level vocabulary of the engine: access flags, work requests, completions, async
//! events and errors. Numeric values follow libibverbs (rdma-core 44) so the shim can pass them
//! through unchanged.

use crate::types::{Lkey, Qkey, Qpn, Rkey};

/// An errno-style failure of a verb, as the kernel / rxe returns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum VerbsError {
    /// EINVAL: bad attribute, bad transition, bad work request.
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    /// ENOMEM: a queue or table is full.
    #[error("out of resources: {0}")]
    NoResources(&'static str),
    /// EBUSY: the resource is still in use (a PD with MRs, a CQ with QPs).
    #[error("resource busy: {0}")]
    Busy(&'static str),
    /// ENOENT / EINVAL on an unknown handle.
    #[error("no such {0}")]
    NotFound(&'static str),
}

impl VerbsError {
    /// The positive errno the C API returns.
    pub fn errno(self) -> i32 {
        match self {
            VerbsError::Invalid(_) => 22,     // EINVAL
            VerbsError::NoResources(_) => 12, // ENOMEM
            VerbsError::Busy(_) => 16,        // EBUSY
            VerbsError::NotFound(_) => 22,
        }
    }
}

pub type VerbsResult<T> = Result<T, VerbsError>;

/// `ibv_access_flags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Access(pub u32);

impl Access {
    pub const LOCAL_WRITE: Access = Access(1);
    pub const REMOTE_WRITE: Access = Access(1 << 1);
    pub const REMOTE_READ: Access = Access(1 << 2);
    pub const REMOTE_ATOMIC: Access = Access(1 << 3);
    pub const MW_BIND: Access = Access(1 << 4);
    pub const ZERO_BASED: Access = Access(1 << 5);
    pub const ON_DEMAND: Access = Access(1 << 6);
    pub const FLUSH_GLOBAL: Access = Access(1 << 8);
    pub const FLUSH_PERSISTENT: Access = Access(1 << 9);
    pub const NONE: Access = Access(0);
    pub const ALL_REMOTE: Access = Access(0b1111);

    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
    pub const fn union(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }
}

/// One scatter/gather element (`ibv_sge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: Lkey,
}

/// `ibv_send_flags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SendFlags(pub u32);

impl SendFlags {
    pub const FENCE: SendFlags = SendFlags(1);
    pub const SIGNALED: SendFlags = SendFlags(1 << 1);
    pub const SOLICITED: SendFlags = SendFlags(1 << 2);
    pub const INLINE: SendFlags = SendFlags(1 << 3);
    pub const NONE: SendFlags = SendFlags(0);

    pub const fn contains(self, other: SendFlags) -> bool {
        self.0 & other.0 == other.0
    }
    pub const fn union(self, other: SendFlags) -> SendFlags {
        SendFlags(self.0 | other.0)
    }
}

/// Where a remote operation lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteAddr {
    pub va: u64,
    pub rkey: Rkey,
}

/// The destination of a UD send (`wr.ud`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    pub ah: u32,
    pub remote_qpn: Qpn,
    pub remote_qkey: Qkey,
}

/// The operation of a send work request (`ibv_wr_opcode` plus its operands).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    Send,
    SendWithImm(u32),
    SendWithInv(Rkey),
    Write(RemoteAddr),
    WriteWithImm(RemoteAddr, u32),
    Read(RemoteAddr),
    CompareSwap {
        remote: RemoteAddr,
        compare: u64,
        swap: u64,
    },
    FetchAdd {
        remote: RemoteAddr,
        add: u64,
    },
    /// IBTA 1.5 ATOMIC_WRITE: an 8-byte write executed atomically at the responder.
    AtomicWrite {
        remote: RemoteAddr,
        value: u64,
    },
    /// IBTA 1.5 FLUSH of `len` bytes at `remote` (placement type bits, selectivity 0 = range).
    Flush {
        remote: RemoteAddr,
        len: u32,
        placement: u8,
    },
    /// Invalidate a local MR or MW key, in order with the send queue.
    LocalInv(Rkey),
    /// Bind a memory window (type 1 through `ibv_bind_mw`, type 2 as a work request) to a
    /// range of an MR. The window's new R_Key is its old one with the low byte `key`
    /// (`ibv_inc_rkey`).
    BindMw {
        mw_rkey: Rkey,
        mr_lkey: Lkey,
        addr: u64,
        length: u64,
        access: Access,
        key: u8,
    },
}

impl SendOp {
    pub fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::Read(_)
                | SendOp::CompareSwap { .. }
                | SendOp::FetchAdd { .. }
                | SendOp::AtomicWrite { .. }
                | SendOp::Flush { .. }
        )
    }
    pub fn is_atomic(&self) -> bool {
        matches!(self, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }
    pub fn is_send(&self) -> bool {
        matches!(
            self,
            SendOp::Send | SendOp::SendWithImm(_) | SendOp::SendWithInv(_)
        )
    }
    pub fn is_write(&self) -> bool {
        matches!(self, SendOp::Write(_) | SendOp::WriteWithImm(..))
    }
    pub fn is_local(&self) -> bool {
        matches!(self, SendOp::LocalInv(_) | SendOp::BindMw { .. })
    }
    /// The completion opcode reported for it.
    pub fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendWithImm(_) | SendOp::SendWithInv(_) => WcOpcode::Send,
            SendOp::Write(_) | SendOp::WriteWithImm(..) => WcOpcode::RdmaWrite,
            SendOp::Read(_) => WcOpcode::RdmaRead,
            SendOp::CompareSwap { .. } => WcOpcode::CompSwap,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            SendOp::AtomicWrite { .. } => WcOpcode::AtomicWrite,
            SendOp::Flush { .. } => WcOpcode::Flush,
            SendOp::LocalInv(_) => WcOpcode::LocalInv,
            SendOp::BindMw { .. } => WcOpcode::BindMw,
        }
    }
}

/// A send work request (`ibv_send_wr`). With [`SendFlags::INLINE`] the data is `inline_data`,
/// copied at post time; otherwise it is gathered from `sg_list` when each packet is built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    pub wr_id: u64,
    pub op: SendOp,
    pub sg_list: Vec<Sge>,
    pub inline_data: Vec<u8>,
    pub flags: SendFlags,
    pub ud: Option<UdDest>,
}

impl SendWr {
    /// A signaled work request with one SGE.
    pub fn new(wr_id: u64, op: SendOp, sge: Option<Sge>) -> SendWr {
        SendWr {
            wr_id,
            op,
            sg_list: sge.into_iter().collect(),
            inline_data: Vec::new(),
            flags: SendFlags::SIGNALED,
            ud: None,
        }
    }

    /// Total message length in bytes.
    pub fn total_len(&self) -> u64 {
        if self.flags.contains(SendFlags::INLINE) {
            self.inline_data.len() as u64
        } else {
            self.sg_list.iter().map(|s| u64::from(s.length)).sum()
        }
    }
}

/// A receive work request (`ibv_recv_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    pub wr_id: u64,
    pub sg_list: Vec<Sge>,
}

/// `ibv_wc_status`, same numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcStatus {
    Success = 0,
    LocLenErr = 1,
    LocQpOpErr = 2,
    LocEecOpErr = 3,
    LocProtErr = 4,
    WrFlushErr = 5,
    MwBindErr = 6,
    BadRespErr = 7,
    LocAccessErr = 8,
    RemInvReqErr = 9,
    RemAccessErr = 10,
    RemOpErr = 11,
    RetryExcErr = 12,
    RnrRetryExcErr = 13,
    LocRddViolErr = 14,
    RemInvRdReqErr = 15,
    RemAbortErr = 16,
    InvEecnErr = 17,
    InvEecStateErr = 18,
    FatalErr = 19,
    RespTimeoutErr = 20,
    GeneralErr = 21,
}

/// `ibv_wc_opcode`, same numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcOpcode {
    Send = 0,
    RdmaWrite = 1,
    RdmaRead = 2,
    CompSwap = 3,
    FetchAdd = 4,
    BindMw = 5,
    LocalInv = 6,
    Tso = 7,
    Flush = 8,
    AtomicWrite = 9,
    Recv = 128,
    RecvRdmaWithImm = 129,
}

/// `ibv_wc_flags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WcFlags(pub u32);

impl WcFlags {
    pub const GRH: WcFlags = WcFlags(1);
    pub const WITH_IMM: WcFlags = WcFlags(1 << 1);
    pub const WITH_INV: WcFlags = WcFlags(1 << 3);

    pub const fn contains(self, other: WcFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

/// One work completion (`ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    pub byte_len: u32,
    /// Immediate data in network order, as carried (valid with `WITH_IMM`).
    pub imm_data: u32,
    /// The invalidated R_Key (valid with `WITH_INV`).
    pub invalidated_rkey: u32,
    pub qp_num: Qpn,
    pub src_qp: Qpn,
    pub wc_flags: WcFlags,
    /// The request carried the solicited-event bit.
    pub solicited: bool,
    /// `ibv_wc.sl`. RoCE has no service level on the wire; for UD receives it carries the
    /// packet type as mlx5 reports it (PRM, responder UD over RoCE: bit 3 set when the frame
    /// has a UDP header, i.e. RoCE v2; bits 2:0 the L3 header type, 0 GRH, 1 IPv6, 2 IPv4),
    /// which UCX's ud_verbs reads to find the destination GID of an IPv4 packet. 0 otherwise,
    /// as rxe.
    pub sl: u8,
}

/// `ibv_wc.sl` of a UD receive over RoCE v2 / IPv4 (mlx5's packet type 0x8 | 0x2).
pub const WC_SL_ROCE_V2_IPV4: u8 = 0xa;
/// `ibv_wc.sl` of a UD receive over RoCE v2 / IPv6 (0x8 | 0x1).
pub const WC_SL_ROCE_V2_IPV6: u8 = 0x9;

impl WorkCompletion {
    pub fn new(wr_id: u64, status: WcStatus, opcode: WcOpcode, qp_num: Qpn) -> Self {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            byte_len: 0,
            imm_data: 0,
            invalidated_rkey: 0,
            qp_num,
            src_qp: Qpn::new(0),
            wc_flags: WcFlags::default(),
            solicited: false,
            sl: 0,
        }
    }
}

/// Asynchronous events (`ibv_event_type`) the device raises; drain them with
/// [`super::Engine::poll_event`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEvent {
    /// A completion queue overflowed (IBV_EVENT_CQ_ERR).
    CqError { cq: u32 },
    /// The QP went to ERR because of a transport error (IBV_EVENT_QP_FATAL).
    QpFatal { qpn: Qpn },
    /// A request violated the QP's rules (IBV_EVENT_QP_REQ_ERR).
    QpRequestError { qpn: Qpn },
    /// Remote access error seen at this responder (IBV_EVENT_QP_ACCESS_ERR).
    QpAccessError { qpn: Qpn },
    /// The SQ of a QP in SQD has drained (IBV_EVENT_SQ_DRAINED).
    SqDrained { qpn: Qpn },
    /// The QP entered ERR and its last WQE was reaped (IBV_EVENT_QP_LAST_WQE_REACHED, SRQ).
    LastWqeReached { qpn: Qpn },
    /// An SRQ fell below its armed limit (IBV_EVENT_SRQ_LIMIT_REACHED).
    SrqLimitReached { srq: u32 },
    /// A CQ got a completion while armed (the completion channel's notification).
    CqNotify { cq: u32 },
}
