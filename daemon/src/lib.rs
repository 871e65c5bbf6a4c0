//! The softroce device: the daemon's control plane, client memory access, shared rings,
//! packet I/O, and the capture tools. The `softroce` binary (`main.rs`) is a thin CLI over it.

pub mod access;
pub mod cm;
pub mod config;
pub mod ctl;
pub mod device;
pub mod entropy;
pub mod gsi;
pub mod memory;
pub mod net;
pub mod pcap;
pub mod peer;
pub mod server;
pub mod shm;
pub mod stack_env;
