//! The softroce device: the daemon's control plane, client memory access, shared rings,
//! packet I/O, and the capture tools. The `softroce` binary (`main.rs`) is a thin CLI over it.

pub mod access;
pub mod capture;
pub mod cli;
pub mod cm;
pub mod config;
pub mod ctl;
pub mod device;
pub mod entropy;
pub mod fault;
pub mod gsi;
/// Client memory access: the `softroce-procmem` crate (shared with the shim's fast path).
pub use procmem as memory;
pub mod net;
pub mod pcap;
/// Client processes pinned at connect: in `softroce-procmem`, beside the memory access.
pub use procmem::peer;
pub mod server;
pub mod shm;
pub mod stack_env;
