//! softroce's protocol core, free of I/O: RoCE wire formats with the ICRC, and (in later
//! modules) the transport state machines, congestion control, CM messages and the ring layout
//! shared between daemon and shim.
//!
//! Nothing here opens a socket, spawns a thread or reads a clock: time is passed in, packets go
//! in and out as bytes. That keeps every behaviour testable deterministically.
//!
//! The crate denies `unsafe` with three documented exceptions: [`ring`], the shared-memory
//! rings between the shim and the daemon, which must touch memory another process shares; the
//! SIMD kernel of [`wire::icrc`] (carry-less multiply intrinsics, used after the CPU features
//! are detected); and the calls into [`wire::checksum`]'s loop compiled for AVX-512 and AVX2,
//! made after the CPU was found to have them.

#![deny(unsafe_code)]
#![warn(missing_debug_implementations)]

pub mod cm;
pub mod ctl;
pub mod iface;
pub mod ring;
#[cfg(any(test, feature = "testing"))]
pub mod sim;
pub mod transport;
pub mod types;
pub mod wire;

pub use types::{Lkey, Psn, Qkey, Qpn, Rkey};
