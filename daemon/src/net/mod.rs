//! The daemon's RoCE v2 packet I/O: UDP sockets on port 4791 (IPv4 and IPv6) driven by
//! io_uring, with ICRC building for sends and ICRC verification (with IPv4 Identification
//! recovery) for receives.
//!
//! - [`UdpTransport`] owns the sockets and a driver. Sends are queued with
//!   [`UdpTransport::send`] / [`UdpTransport::send_with`] and submitted in batches;
//!   [`UdpTransport::poll`] submits, waits, and hands every verified datagram to a callback
//!   as an [`RxDatagram`] borrowed from a provided buffer. Nothing is allocated per packet.
//! - The io_uring driver ([`Backend::IoUring`]) uses one multishot `RecvMsg` per socket with a
//!   provided buffer ring, and `SendMsg` submissions from a fixed pool of send slots. Where
//!   io_uring is unavailable (old kernel, seccomp, `io_uring_disabled`), the
//!   `recvmmsg`/`sendmmsg` driver ([`Backend::Syscalls`]) takes over.
//! - UDP GSO (one full RoCE packet, ICRC included, per segment) and UDP GRO are optional; see
//!   [`NetConfig::gso`] for the ICRC consequences on IPv4.
//! - [`PacketBuilder`] writes outgoing transport packets with the ICRC the receiver will
//!   compute from the headers the kernel adds.

mod build;
mod cmsg;
mod socket;
mod syscall;
mod transport;
mod uring;
mod verify;

pub use build::PacketBuilder;
pub use transport::{
    Backend, BackendChoice, NetConfig, NetCounters, NetError, RxDatagram, TxMeta, UdpTransport,
    MAX_GSO_SEGMENTS,
};
pub use verify::{Ipv4Ident, RxVerdict, RxVerifier};
