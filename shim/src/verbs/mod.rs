//! The exported libibverbs API. Each file groups one family of verbs; `unsupported` holds every
//! remaining export as a documented-error stub.

pub mod device;
pub mod events;
pub mod helpers;
pub mod ops;
pub mod pd;
pub mod query;
pub mod unsupported;
