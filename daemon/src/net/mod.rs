//! The daemon's packet I/O. A device reaches the network through a [`Link`] (the seam, in
//! [`link`]); [`UdpLink`] is RoCE v2 through UDP sockets on port 4791 (IPv4 and IPv6) driven
//! by io_uring, with ICRC building for sends and ICRC verification (with IPv4 Identification
//! recovery) for receives, built from the pieces below.
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
//!   compute from the headers the kernel adds; [`UdpTransport::push_packet`] seals packets
//!   the engine wrote and coalesces runs of equal ones into GSO sends (what the daemon uses).
//! - [`LocalFrames`] carries packets between QPs of one device from engine to engine, and
//!   [`AdaptiveSpin`] decides how long the device loop polls before it sleeps.
//! - [`l2::L2Link`] is the other link: the L2 device (`--tap`), whole Ethernet frames through
//!   a TAP interface ([`tap::TapIo`], io_uring), RoCE v1 and v2 framed, sealed and checked in
//!   full by the daemon itself, ARP and neighbour discovery by [`proto::iface`].
//!
//! The daemon's network thread would run it like this:
//!
//! ```no_run
//! use softroce_daemon::net::{NetConfig, PacketBuilder, RxDatagram, TxMeta, UdpTransport};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut net = UdpTransport::open(&NetConfig {
//!     ipv4: Some(std::net::Ipv4Addr::LOCALHOST),
//!     ..NetConfig::default() // port 4791, io_uring with fallback, ICRC verified
//! })?;
//! # let (repr, payload, peer): (proto::wire::TransportRepr, Vec<u8>, std::net::SocketAddr) = todo!();
//! // Per QP: the flow (addresses, rxe's UDP source port, the AV's traffic class and TTL).
//! let flow = PacketBuilder { tos: 0x02, ttl: 64, ..PacketBuilder::new(
//!     net.local_addr_v4().unwrap().ip(), peer.ip(), 0xc132) };
//! let meta = TxMeta { tos: flow.tos, ttl: Some(flow.ttl), ..TxMeta::to(peer) };
//! net.send_packet(&meta, &flow, &repr, &payload)?; // queued; submitted by poll/flush
//! net.poll(Some(std::time::Duration::from_millis(1)), &mut |d: &mut RxDatagram<'_>| {
//!     // d.bytes() is a verified BTH..ICRC; d.src/d.dst for the QP's address check (rxe
//!     // drops mismatches), d.tos & 3 == 3 is an ECN CE mark.
//! })?;
//! # Ok(()) }
//! ```

mod build;
mod cmsg;
pub mod interface;
pub mod kernel_neighbour;
pub mod l2;
mod layers;
pub mod link;
mod loopback;
mod multicast;
pub mod neighbour_board;
pub(crate) mod port_share;
mod socket;
mod spin;
mod syscall;
pub mod tap;
mod transport;
mod udp_link;
mod uring;
mod verify;

pub use build::PacketBuilder;
pub use layers::Layers;
pub use link::{Link, RxPacket, WireView};
pub use loopback::LocalFrames;
pub use multicast::MulticastGroup;
pub use spin::AdaptiveSpin;
pub use transport::{
    Backend, BackendChoice, NetConfig, NetCounters, NetError, RxDatagram, TxMeta, UdpTransport,
    MAX_GSO_SEGMENTS,
};
pub use udp_link::{UdpLink, UdpLinkConfig, GROUP_POLL};
pub use verify::{Ipv4Ident, RxVerdict, RxVerifier, MAX_ROCE_PACKET};
