//! The transport engine: RC, UC and UD queue pairs as kernel rxe runs them (IBTA Vol. 1
//! chapters 9-11), as a sans-I/O state machine.
//!
//! One [`Engine`] holds every resource of a port (PDs, MRs, CQs, SRQs, AHs, QPs) and the
//! requester, completer and responder of every QP, split as rxe splits them:
//! [`requester`] builds request packets, [`completer`] consumes responses and completes send
//! WQEs, [`responder`] executes requests and queues responses.
//!
//! Driving it (quinn-proto style): feed received packets to [`Engine::handle_packet`], call
//! [`Engine::handle_timeout`] when [`Engine::poll_timeout`] says so, and drain
//! [`Engine::poll_transmit`] after every call. Time is `now` in nanoseconds from any
//! monotonic origin. Registered memory is reached through [`MemoryAccess`].
//!
//! **Packets in and out are whole IP packets** (IPv4 or IPv6 header, UDP to 4791, BTH .. ICRC),
//! built with [`crate::wire::FrameRepr`] from the QP's address vector: the ICRC covers the IP
//! and UDP headers, so the engine must see them. A daemon on a TAP or raw socket adds the
//! Ethernet header; one on a UDP socket sends `buf[transport_offset..]` (see [`Transmit`]).

//! Counters: [`Engine::counters`] keeps every counter rxe keeps, under rxe's names
//! (`ack_deferred` and `link_downed` stay 0: the first is rxe's internal task scheduling, the
//! second belongs to the daemon's link).
//!
//! ```
//! use proto::transport::*;
//! // Two devices; in the daemon the "wire" is io_uring, here it is a function call.
//! let mut a = Engine::new(EngineConfig::new("10.0.0.1".parse().unwrap(), 1), VecMemory::new());
//! let mut b = Engine::new(EngineConfig::new("10.0.0.2".parse().unwrap(), 2), VecMemory::new());
//! let (pd_a, pd_b) = (a.alloc_pd(), b.alloc_pd());
//! let (cq_a, cq_b) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
//! let init = |pd, cq| QpInit { pd, qp_type: QpType::Ud, send_cq: cq, recv_cq: cq, srq: None,
//!                              cap: QpCap::default(), sq_sig_all: true };
//! let qa = a.create_qp(init(pd_a, cq_a)).unwrap();
//! let qb = b.create_qp(init(pd_b, cq_b)).unwrap();
//! for (dev, q) in [(&mut a, qa), (&mut b, qb)] {
//!     let mut attr = QpAttr { qp_state: QpState::Init, qkey: proto::Qkey(7), ..Default::default() };
//!     dev.modify_qp(q, &attr, AttrMask::STATE.union(AttrMask::PKEY_INDEX)
//!         .union(AttrMask::PORT).union(AttrMask::QKEY)).unwrap();
//!     attr.qp_state = QpState::Rtr;
//!     dev.modify_qp(q, &attr, AttrMask::STATE).unwrap();
//!     attr.qp_state = QpState::Rts;
//!     dev.modify_qp(q, &attr, AttrMask::STATE.union(AttrMask::SQ_PSN)).unwrap();
//! }
//! let buf_b = b.memory_mut().alloc(256);
//! let mr_b = b.reg_mr(pd_b, buf_b, 256, Access::LOCAL_WRITE).unwrap();
//! b.post_recv(qb, RecvWr { wr_id: 9, sg_list: vec![Sge { addr: buf_b, length: 256, lkey: mr_b.lkey }] }).unwrap();
//! let ah = a.create_ah(pd_a, AddressVector::new("10.0.0.2".parse().unwrap())).unwrap();
//! let mut wr = SendWr::new(1, SendOp::Send, None);
//! wr.flags = SendFlags::SIGNALED.union(SendFlags::INLINE);
//! wr.inline_data = b"hello".to_vec();
//! wr.ud = Some(UdDest { ah, remote_qpn: qb, remote_qkey: proto::Qkey(7) });
//! a.post_send(qa, wr).unwrap();
//!
//! let now = 0; // nanoseconds, from the caller's clock
//! let mut frame = vec![0u8; MAX_FRAME_LEN];
//! while let Some(tx) = a.poll_transmit(now, &mut frame) {
//!     b.handle_packet(now, &frame[..tx.len]); // a whole IPv4 packet, ICRC included
//! }
//! assert_eq!(a.poll_cq(cq_a).unwrap().status, WcStatus::Success);
//! let wc = b.poll_cq(cq_b).unwrap();
//! assert_eq!((wc.wr_id, wc.byte_len), (9, 40 + 5)); // the GRH area comes first
//! assert_eq!(b.memory().slice(buf_b + 40, 5), Some(&b"hello"[..]));
//! ```

pub mod access;
pub mod chacha;
pub mod completer;
pub mod congestion;
pub mod counters;
pub mod engine;
pub mod handoff;
pub mod inventory;
pub mod memory;
mod packet_io;
pub mod qp;
pub mod qp_attr;
mod qpn_pool;
pub mod requester;
pub mod resources;
pub mod responder;
pub mod selective;
pub mod table;
pub mod timers;
pub mod verbs;

pub use congestion::{Algorithm, CongestionConfig, Params as CcParams, QpCongestion};
pub use counters::Counters;
pub use engine::{
    Engine, EngineConfig, ForcedNak, GidType, MrKeys, Transmit, MAX_FRAME_LEN, TRANSMIT_QUANTUM,
};
pub use handoff::{QpConfig, QpSequence};
pub use inventory::{CqSummary, MrSummary, PdSummary, QpSummary, SrqSummary};
pub use memory::{MemoryAccess, MemoryError, VecMemory};
pub use qp::{QpCap, QpInit};
pub use qp_attr::{
    check_modify, transition_attrs, AddressVector, AttrMask, Mtu, QpAttr, QpState, QpType,
};
pub use resources::MwType;
pub use selective::{LossRecovery, SelectiveParams};
pub use timers::Nanos;
pub use verbs::*;
