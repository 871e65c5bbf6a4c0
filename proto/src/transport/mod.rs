//! The transport engine: RC, UC and UD queue pairs as kernel rxe runs them (IBTA Vol. 1
//! chapters 9-11), as a sans-I/O state machine.
//!
//! One [`Device`] holds every resource of a port (PDs, MRs, CQs, SRQs, AHs, QPs) and the
//! requester, completer and responder of every QP, split as rxe splits them:
//! [`requester`] builds request packets, [`completer`] consumes responses and completes send
//! WQEs, [`responder`] executes requests and queues responses.
//!
//! Driving it (quinn-proto style): feed received packets to [`Device::handle_packet`], call
//! [`Device::handle_timeout`] when [`Device::poll_timeout`] says so, and drain
//! [`Device::poll_transmit`] after every call. Time is `now` in nanoseconds from any
//! monotonic origin. Registered memory is reached through [`MemoryAccess`].
//!
//! **Packets in and out are whole IP packets** (IPv4 or IPv6 header, UDP to 4791, BTH .. ICRC),
//! built with [`crate::wire::FrameRepr`] from the QP's address vector: the ICRC covers the IP
//! and UDP headers, so the engine must see them. A daemon on a TAP or raw socket adds the
//! Ethernet header; one on a UDP socket sends `buf[transport_offset..]` (see [`Transmit`]).

pub mod access;
pub mod cc;
pub mod completer;
pub mod counters;
pub mod device;
pub mod memory;
pub mod qp;
pub mod qp_attr;
pub mod requester;
pub mod resources;
pub mod responder;
pub mod timers;
pub mod verbs;

pub use cc::{CongestionControl, NoCongestionControl};
pub use counters::Counters;
pub use device::{Device, DeviceConfig, MrKeys, Transmit, MAX_FRAME_LEN};
pub use memory::{MemoryAccess, MemoryError, VecMemory};
pub use qp::{QpCap, QpInit};
pub use qp_attr::{
    check_modify, transition_attrs, AddressVector, AttrMask, Mtu, QpAttr, QpState, QpType,
};
pub use resources::MwType;
pub use timers::Nanos;
pub use verbs::*;
