//! The librdmacm C ABI of rdma-core 44 (`<rdma/rdma_cma.h>`): every `rdma_*` export, backed by
//! the daemon's connection manager through the `Cm*` control requests (`proto::ctl`).
//!
//! * [`abi`]: `#[repr(C)]` structs, layout-checked by `tests/abi_layout.rs`.
//! * [`state`]: channels, ids and events behind the C pointers; the shared `ibv_context` and
//!   default PD per device.
//! * [`events`]: `rdma_get_cm_event` (one datagram per event on the channel's socketpair, so
//!   `channel->fd` polls and honours `O_NONBLOCK`) and the librdmacm-side processing.
//! * [`qp`]: QPs/SRQs/CQs made for an id and the INIT/RTR/RTS transitions librdmacm drives.
//! * [`exports`], [`ep`], [`addrinfo`]: the exported functions; [`rsocket`]: ENOSYS stubs.

pub mod abi;
pub mod addrinfo;
pub mod ep;
pub mod events;
pub mod exports;
pub mod qp;
pub mod rsocket;
pub mod sockaddr;
pub mod state;
