//! The InfiniBand connection manager (IBTA Vol. 1 ch. 12) as Linux's `ib_cm` and `rdma_cm`
//! put it on the wire, free of I/O.
//!
//! - [`msg`]: every CM message as a `Repr`, decoded and encoded byte-exactly;
//! - [`rdma_cm`]: what the rdma_cm layer puts in and derives from those messages (service
//!   IDs, the private-data header, QP attributes, the RoCE v2 flow label);
//! - [`conn`]: the ib_cm state machine for many connections and listeners, driven by MADs
//!   and virtual time (quinn-proto style: `handle_*` in, `poll_*` out).

pub mod conn;
pub mod msg;
pub mod rdma_cm;

pub use conn::{
    AcceptParams, CmEndpoint, CmEvent, ConnId, ConnInfo, ConnectParams, DisconnectCause,
    EndpointConfig, SidrParams, State, Transmit,
};
pub use msg::{CmError, CmMad, CmMessage, RejReason};
