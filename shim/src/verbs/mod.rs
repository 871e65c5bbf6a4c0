//! The exported libibverbs API. Each file groups one family of verbs; `unsupported` holds every
//! remaining export as a documented-error stub.

pub mod ah;
pub mod context;
pub mod cq;
pub mod events;
pub mod helpers;
pub mod mw;
pub mod ops;
pub mod pd;
pub mod qp;
pub mod query;
pub mod srq;
pub mod unsupported;
pub mod wr;
