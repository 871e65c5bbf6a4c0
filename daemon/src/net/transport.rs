//! [`UdpTransport`]: the sockets, the send-slot pool, receive verification and counters, over
//! one of two drivers (io_uring, or batched syscalls).

use super::build::PacketBuilder;
use super::cmsg::{self, ControlBuf, RxControl, SockAddrBuf};
use super::socket::{self, SocketOptions};
use super::syscall::SyscallDriver;
use super::uring::UringDriver;
use super::verify::{Ipv4Ident, RxVerdict, RxVerifier};
use proto::wire::TransportRepr;
use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// The kernel's limit on segments per GSO send is 64 on older kernels (128 on newer ones).
pub const MAX_GSO_SEGMENTS: usize = 64;

/// Largest UDP payload over IPv4 (65535 - 20 - 8); also the send buffer size with GSO.
const MAX_UDP_PAYLOAD: usize = 65507;

/// Which driver to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    /// io_uring, falling back to syscalls (with a logged reason) when it cannot be set up.
    Auto,
    IoUring,
    Syscalls,
}

/// The driver in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    IoUring,
    Syscalls,
}

/// How to open the transport.
#[derive(Debug, Clone)]
pub struct NetConfig {
    /// Local IPv4 address to bind (no IPv4 socket if `None`).
    pub ipv4: Option<Ipv4Addr>,
    /// Local IPv6 address to bind (no IPv6 socket if `None`).
    pub ipv6: Option<Ipv6Addr>,
    /// UDP port: 4791; 0 picks an ephemeral port per socket (tests).
    pub port: u16,
    pub backend: BackendChoice,
    /// Allow [`TxMeta::segment_size`] (UDP GSO). The kernel refuses GSO on sockets that send
    /// zero UDP checksums, so with `gso` the UDP checksum is computed (rxe sends 0; the ICRC
    /// masks it and receivers accept both). On IPv4 the kernel numbers the segments' IDs 0,
    /// 1, 2, ...: build segment `k` with [`super::PacketBuilder::emit`] ident `k` (or use
    /// [`UdpTransport::send_gso`]). Verified for the kernel's software segmentation (on
    /// loopback and any device without UDP segmentation offload); a NIC that segments in
    /// hardware must number the IDs the same way, or kernel-rxe and hardware receivers will
    /// see bad ICRCs on IPv4 (softroce receivers recover any ID). IPv6 has no such caveat.
    pub gso: bool,
    /// Enable UDP_GRO: the kernel may coalesce datagrams of one flow; they are split again by
    /// the reported segment size before verification. Needs 64 KiB receive buffers.
    pub gro: bool,
    /// Receive buffers in the provided-buffer ring (io_uring) or per receive batch
    /// (syscalls); rounded up to a power of two for io_uring.
    pub rx_buffers: u16,
    /// Send slots: transmits in flight at once.
    pub tx_slots: usize,
    /// Datagrams per `sendmmsg`/`recvmmsg` in the syscall driver (1 = a syscall per packet).
    pub syscall_batch: usize,
    /// Verify the ICRC of received datagrams and drop bad ones (rxe behaviour). When off,
    /// every datagram is delivered as received.
    pub verify_icrc: bool,
    /// Largest datagram to receive without GRO: a 4096-byte-MTU RoCE packet with every
    /// header fits in 4096 + 64; the default leaves room.
    pub max_datagram: usize,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            ipv4: None,
            ipv6: None,
            port: proto::wire::ROCE_V2_PORT,
            backend: BackendChoice::Auto,
            gso: false,
            gro: false,
            rx_buffers: 512,
            tx_slots: 256,
            syscall_batch: 64,
            verify_icrc: true,
            max_datagram: 8192,
        }
    }
}

/// Everything about a send except its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxMeta {
    pub dst: SocketAddr,
    /// Source address when the socket is bound to a wildcard; `None` uses the bound one. It
    /// must be the address the ICRC was computed with.
    pub src: Option<IpAddr>,
    /// IPv4 TOS / IPv6 traffic class, ECN bits included (rxe: the AV's traffic class).
    pub tos: u8,
    /// IPv4 TTL / IPv6 hop limit; `None` uses the route default.
    pub ttl: Option<u8>,
    /// With [`NetConfig::gso`]: the bytes are consecutive RoCE packets of this size (the
    /// last may be shorter), sent as one GSO datagram.
    pub segment_size: Option<u16>,
}

impl TxMeta {
    pub fn to(dst: SocketAddr) -> TxMeta {
        TxMeta {
            dst,
            src: None,
            tos: 0,
            ttl: None,
            segment_size: None,
        }
    }
}

/// One received, verified datagram (one GRO segment), borrowed from a receive buffer, with
/// the bytes in front of it in that buffer, which are free to write: what the kernel put
/// before the payload (the receive metadata, read already) or, for a later segment of a GRO
/// aggregate, the segments before it, handed on already. A link rebuilds the packet's IP and
/// UDP headers there ([`RxDatagram::with_room`]) instead of copying the datagram behind
/// headers of its own.
#[derive(Debug)]
pub struct RxDatagram<'a> {
    pub src: SocketAddr,
    /// The datagram's destination: the IP header's address and the socket's port.
    pub dst: SocketAddr,
    /// IPv4 TOS / IPv6 traffic class, ECN bits included (0 if the kernel did not report it).
    pub tos: u8,
    /// For IPv4 with verification on: the Identification and DF that explain the ICRC.
    pub ipv4: Option<Ipv4Ident>,
    /// The buffer up to the datagram's end; the datagram starts at `at`.
    buf: &'a mut [u8],
    at: usize,
}

impl<'a> RxDatagram<'a> {
    /// `buf[at..]` is the datagram; `buf[..at]` may be written over.
    pub fn new(
        src: SocketAddr,
        dst: SocketAddr,
        tos: u8,
        ipv4: Option<Ipv4Ident>,
        buf: &'a mut [u8],
        at: usize,
    ) -> RxDatagram<'a> {
        let at = at.min(buf.len());
        RxDatagram {
            src,
            dst,
            tos,
            ipv4,
            buf,
            at,
        }
    }

    /// The UDP payload: BTH..ICRC.
    pub fn bytes(&self) -> &[u8] {
        &self.buf[self.at..]
    }

    /// How many bytes lie free in front of the datagram.
    pub fn room(&self) -> usize {
        self.at
    }

    /// The datagram with `room` bytes in front of it to write (headers), if the buffer has
    /// them: `None` when it has less.
    pub fn with_room(&mut self, room: usize) -> Option<&mut [u8]> {
        let start = self.at.checked_sub(room)?;
        self.buf.get_mut(start..)
    }
}

/// What a received datagram's metadata says, read before its bytes are handed on (the
/// metadata lies in the buffer in front of them, where headers may then be written).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RxHead {
    src: SocketAddr,
    dst: SocketAddr,
    tos: u8,
    /// The GRO segment size, when the kernel aggregated several.
    segment: Option<usize>,
}

/// Packet counters (cumulative). `softroce stat` shows every field by name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct NetCounters {
    /// Datagrams delivered (after verification).
    pub rx_packets: u64,
    pub rx_bytes: u64,
    /// Dropped: well-formed transport packets with a wrong ICRC.
    pub rx_bad_icrc: u64,
    /// Dropped: not a RoCE transport packet, or no usable addresses.
    pub rx_malformed: u64,
    /// Delivered IPv4 packets whose ICRC needed a non-zero Identification (kernel rxe, GSO
    /// segments) or DF clear.
    pub rx_ident_recovered: u64,
    /// Dropped: longer than the receive buffer.
    pub rx_truncated: u64,
    /// Receives that the kernel had coalesced with UDP GRO (each split into segments).
    pub rx_gro_batches: u64,
    /// Times the receive ring ran out of buffers (the kernel dropped datagrams meanwhile).
    pub rx_no_buffers: u64,
    pub rx_errors: u64,
    /// Datagrams (GSO segments) the kernel accepted.
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// Datagrams (GSO segments) the kernel refused.
    pub tx_errors: u64,
    /// Sends of several segments at once (UDP GSO), as queued by the drivers.
    pub tx_gso_sends: u64,
    /// Of `tx_errors`: refused because the socket's send buffer was full (io_uring driver;
    /// sends never wait, to stay in order). A sign to send less per poll.
    pub tx_would_block: u64,
    /// Dropped by the link: verified, but addressed to none of the device's addresses.
    pub rx_not_our_address: u64,
    /// Dropped by the link: a multicast group's datagram that failed verification.
    pub rx_group_refused: u64,
    /// L2 device: RoCE v2 packets refused by a RoCE v1-only device, and v1 frames by a
    /// v2-only one (`--roce`); each logged once per peer and minute.
    pub rx_v2_refused: u64,
    pub rx_v1_refused: u64,
    /// L2 device: packets for a destination outside every prefix of the device (no route),
    /// and packets held while their destination was being resolved.
    pub tx_no_route: u64,
    pub tx_held: u64,
    /// Dropped because the device's port was down (sent, received, or between its own QPs;
    /// [`crate::net::Layers`]).
    pub port_down_dropped: u64,
}

impl NetCounters {
    /// Every counter as (name, value), prefixed `link_`, for `counters` listings.
    pub fn named(&self) -> [(&'static str, u64); 22] {
        [
            ("link_rx_packets", self.rx_packets),
            ("link_rx_bytes", self.rx_bytes),
            ("link_rx_bad_icrc", self.rx_bad_icrc),
            ("link_rx_malformed", self.rx_malformed),
            ("link_rx_ident_recovered", self.rx_ident_recovered),
            ("link_rx_truncated", self.rx_truncated),
            ("link_rx_gro_batches", self.rx_gro_batches),
            ("link_rx_no_buffers", self.rx_no_buffers),
            ("link_rx_errors", self.rx_errors),
            ("link_rx_not_our_address", self.rx_not_our_address),
            ("link_rx_group_refused", self.rx_group_refused),
            ("link_tx_packets", self.tx_packets),
            ("link_tx_bytes", self.tx_bytes),
            ("link_tx_errors", self.tx_errors),
            ("link_tx_gso_sends", self.tx_gso_sends),
            ("link_tx_would_block", self.tx_would_block),
            ("link_rx_v2_refused", self.rx_v2_refused),
            ("link_rx_v1_refused", self.rx_v1_refused),
            ("link_tx_no_route", self.tx_no_route),
            ("link_tx_held", self.tx_held),
            ("link_port_down_dropped", self.port_down_dropped),
            (
                "link_rx_dropped",
                self.rx_bad_icrc + self.rx_malformed + self.rx_truncated,
            ),
        ]
    }
}

/// Why a send could not be queued.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("no {0} socket is open")]
    NoSocket(&'static str),
    #[error("datagram of {len} bytes does not fit a send buffer of {max}")]
    TooLong { len: usize, max: usize },
    #[error("GSO send refused: {0}")]
    Gso(&'static str),
    #[error("cannot build the packet: {0}")]
    Wire(#[from] proto::wire::Error),
    #[error("I/O: {0}")]
    Io(#[from] io::Error),
}

/// Index of a socket: 0 for IPv4, 1 for IPv6.
pub(crate) type SockIdx = usize;

pub(crate) struct Sock {
    pub fd: OwnedFd,
    pub local: SocketAddr,
}

/// One send in flight: the buffer and the `msghdr` the kernel reads, kept at a stable heap
/// address until the send completes.
pub(crate) struct TxSlot {
    pub msg: libc::msghdr,
    pub iov: libc::iovec,
    pub name: SockAddrBuf,
    pub control: ControlBuf,
    pub buf: Box<[u8]>,
    pub len: usize,
    /// Datagrams on the wire: segments of a GSO send, else 1.
    pub segments: u32,
    pub sock: SockIdx,
}

/// The fixed pool of send slots.
pub(crate) struct TxPool {
    pub slots: Box<[TxSlot]>,
    pub free: Vec<u32>,
}

impl TxPool {
    fn new(count: usize, buf_len: usize) -> TxPool {
        let slots: Box<[TxSlot]> = (0..count.max(1))
            .map(|_| TxSlot {
                // SAFETY: msghdr is plain old data for which all-zero is a valid value.
                msg: unsafe { std::mem::zeroed() },
                iov: libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                },
                name: SockAddrBuf::default(),
                control: ControlBuf::default(),
                buf: vec![0u8; buf_len].into_boxed_slice(),
                len: 0,
                segments: 0,
                sock: 0,
            })
            .collect();
        let free = (0..slots.len() as u32).rev().collect();
        TxPool { slots, free }
    }

    /// Points the slot's `msghdr` at its own buffer, address and control messages. The slots
    /// live in a boxed slice that is never resized, so the pointers stay valid.
    fn prepare(&mut self, idx: u32, meta: &TxMeta, gso: Option<u16>) {
        let s = &mut self.slots[idx as usize];
        let name_len = cmsg::encode_sockaddr(&meta.dst, &mut s.name);
        let control_len = cmsg::encode_tx_control(
            &mut s.control,
            meta.dst.is_ipv6(),
            meta.src,
            Some(meta.tos),
            meta.ttl,
            gso,
        );
        s.iov.iov_base = s.buf.as_mut_ptr().cast();
        s.iov.iov_len = s.len;
        s.msg.msg_name = s.name.0.as_mut_ptr().cast();
        s.msg.msg_namelen = name_len as libc::socklen_t;
        s.msg.msg_iov = &mut s.iov;
        s.msg.msg_iovlen = 1;
        s.msg.msg_control = s.control.0.as_mut_ptr().cast();
        s.msg.msg_controllen = control_len as _;
        s.msg.msg_flags = 0;
    }
}

/// Receive-side state shared by the drivers: verification and counters.
pub(crate) struct RxState {
    pub verifier: RxVerifier,
    pub verify: bool,
    pub counters: NetCounters,
}

impl RxState {
    /// Reads one received datagram's metadata: `name` is the sender's sockaddr, `control`
    /// the control messages, `payload_len` the datagram's length (possibly a GRO aggregate).
    /// `None` (counted) for a datagram to drop.
    pub fn head(
        &mut self,
        local: SocketAddr,
        name: &[u8],
        control: &[u8],
        payload_len: usize,
        truncated: bool,
    ) -> Option<RxHead> {
        if truncated {
            self.counters.rx_truncated += 1;
            return None;
        }
        let Some(src) = cmsg::decode_sockaddr(name) else {
            self.counters.rx_malformed += 1;
            return None;
        };
        let ctl = RxControl::parse(control);
        let dst = SocketAddr::new(ctl.dst.unwrap_or(local.ip()), local.port());
        if dst.ip().is_unspecified() {
            // Without IP_PKTINFO the ICRC cannot be checked on a wildcard socket.
            self.counters.rx_malformed += 1;
            return None;
        }
        let segment = match ctl.gro_segment {
            Some(s) if s > 0 && (s as usize) < payload_len => {
                self.counters.rx_gro_batches += 1;
                Some(s as usize)
            }
            _ => None,
        };
        Some(RxHead {
            src,
            dst,
            tos: ctl.tos.unwrap_or(0),
            segment,
        })
    }

    /// Splits, verifies, counts and delivers the datagram at `buf[at..]` that `head`
    /// describes. Each segment goes to `on_rx` with the bytes in front of it, which are free
    /// by then (`buf[..at]`, then the segments before it): [`RxDatagram::with_room`].
    pub fn deliver(
        &mut self,
        head: RxHead,
        buf: &mut [u8],
        at: usize,
        on_rx: &mut dyn FnMut(&mut RxDatagram<'_>),
    ) -> usize {
        let end = buf.len();
        let seg = head.segment.unwrap_or(end.saturating_sub(at)).max(1);
        let mut delivered = 0;
        let mut start = at;
        while start < end {
            // This segment is `buf[this..stop]`; what lies before it goes along as its room.
            let (this, stop) = (start, end.min(start + seg));
            start = stop;
            let upto = &mut buf[..stop];
            let bytes = &upto[this..];
            let ipv4 = if self.verify {
                match self.verifier.verify(head.src, head.dst, bytes) {
                    RxVerdict::Good { ipv4 } => {
                        if ipv4.is_some_and(|i| i.ident != 0 || !i.dont_frag) {
                            self.counters.rx_ident_recovered += 1;
                        }
                        ipv4
                    }
                    RxVerdict::BadIcrc => {
                        self.counters.rx_bad_icrc += 1;
                        continue;
                    }
                    RxVerdict::Malformed(_) => {
                        self.counters.rx_malformed += 1;
                        continue;
                    }
                }
            } else {
                None
            };
            self.counters.rx_packets += 1;
            self.counters.rx_bytes += bytes.len() as u64;
            on_rx(&mut RxDatagram::new(
                head.src, head.dst, head.tos, ipv4, upto, this,
            ));
            delivered += 1;
        }
        delivered
    }
}

fn into_io(e: NetError) -> io::Error {
    match e {
        NetError::Io(e) => e,
        e => io::Error::other(e.to_string()),
    }
}

enum Driver {
    Uring(Box<UringDriver>),
    Syscalls(Box<SyscallDriver>),
}

/// The RoCE v2 UDP endpoint: sockets, send slots, receive buffers, a driver, counters.
pub struct UdpTransport {
    // Drop order: the driver (and its io_uring) before the send slots and sockets.
    driver: Driver,
    tx: TxPool,
    socks: [Option<Sock>; 2],
    rx: RxState,
    gso: bool,
    fallback_reason: Option<String>,
    /// IPv4 peers that recover any Identification from the ICRC (softroce devices,
    /// `verify.rs`): GSO goes to them whatever path numbers the segments.
    ident_solvers: HashSet<Ipv4Addr>,
    /// The GSO send being filled by [`UdpTransport::push_packet`], if any.
    batch: Option<OpenBatch>,
    /// Where the last queued datagram lies: (slot, offset, length, IPv4 Identification it was
    /// sealed for), for a capture that looks at it at once ([`UdpTransport::last_queued`]).
    last_queued: Option<(u32, usize, usize, u16)>,
}

/// A GSO send being filled packet by packet: every segment has the length of the first (the
/// last may be shorter), and all go to one flow with the same IP header fields.
#[derive(Debug, Clone, Copy)]
struct OpenBatch {
    slot: u32,
    meta: TxMeta,
    flow: (IpAddr, IpAddr, u16, u16),
    seg: usize,
    count: usize,
    len: usize,
    /// A segment shorter than `seg` was appended: nothing may follow it.
    ended: bool,
}

impl std::fmt::Debug for UdpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpTransport")
            .field("v4", &self.local_addr_v4())
            .field("v6", &self.local_addr_v6())
            .field("backend", &self.backend())
            .field("counters", &self.rx.counters)
            .finish()
    }
}

impl Drop for UdpTransport {
    fn drop(&mut self) {
        // The kernel may still read send slots or write receive buffers of requests in
        // flight: cancel them and wait for their completions before the memory goes.
        if let Driver::Uring(d) = &mut self.driver {
            d.shutdown(&mut self.tx, &mut self.rx.counters);
        }
    }
}

// SAFETY: the raw pointers inside (msghdrs of the send slots and receive requests) point only
// into heap memory owned by this value and move with it; no other thread can reach them.
unsafe impl Send for UdpTransport {}

impl UdpTransport {
    /// Opens the sockets and the driver.
    pub fn open(cfg: &NetConfig) -> io::Result<UdpTransport> {
        if cfg.ipv4.is_none() && cfg.ipv6.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "neither an IPv4 nor an IPv6 address to bind",
            ));
        }
        let opts = SocketOptions {
            gro: cfg.gro,
            zero_checksum_tx: !cfg.gso,
            rcvbuf: 8 << 20,
            sndbuf: 8 << 20,
        };
        let open_one = |ip: IpAddr| -> io::Result<Sock> {
            let fd = socket::open(SocketAddr::new(ip, cfg.port), &opts)?;
            let local = socket::local_addr(fd.as_raw_fd())?;
            Ok(Sock { fd, local })
        };
        let socks = [
            cfg.ipv4.map(|a| open_one(IpAddr::V4(a))).transpose()?,
            cfg.ipv6.map(|a| open_one(IpAddr::V6(a))).transpose()?,
        ];
        let rx_buf_len = if cfg.gro {
            MAX_UDP_PAYLOAD + 1
        } else {
            cfg.max_datagram.max(256)
        };
        let tx_buf_len = if cfg.gso {
            MAX_UDP_PAYLOAD
        } else {
            cfg.max_datagram.max(256)
        };
        let mut fallback_reason = None;
        let driver = match cfg.backend {
            BackendChoice::Syscalls => Driver::Syscalls(Box::new(SyscallDriver::new(
                cfg.rx_buffers.max(1) as usize,
                rx_buf_len,
                cfg.syscall_batch,
            ))),
            BackendChoice::IoUring => Driver::Uring(Box::new(UringDriver::new(
                cfg.rx_buffers,
                rx_buf_len,
                cfg.tx_slots,
            )?)),
            BackendChoice::Auto => {
                match UringDriver::new(cfg.rx_buffers, rx_buf_len, cfg.tx_slots) {
                    Ok(d) => Driver::Uring(Box::new(d)),
                    Err(e) => {
                        let why = format!("io_uring unavailable ({e}); using recvmmsg/sendmmsg");
                        tracing::warn!("{why}");
                        fallback_reason = Some(why);
                        Driver::Syscalls(Box::new(SyscallDriver::new(
                            cfg.rx_buffers.max(1) as usize,
                            rx_buf_len,
                            cfg.syscall_batch,
                        )))
                    }
                }
            }
        };
        Ok(UdpTransport {
            socks,
            tx: TxPool::new(cfg.tx_slots, tx_buf_len),
            rx: RxState {
                verifier: RxVerifier::new(),
                verify: cfg.verify_icrc,
                counters: NetCounters::default(),
            },
            driver,
            gso: cfg.gso,
            fallback_reason,
            ident_solvers: HashSet::new(),
            batch: None,
            last_queued: None,
        })
    }

    pub fn backend(&self) -> Backend {
        match self.driver {
            Driver::Uring(_) => Backend::IoUring,
            Driver::Syscalls(_) => Backend::Syscalls,
        }
    }

    /// Why [`BackendChoice::Auto`] fell back to syscalls, if it did.
    pub fn fallback_reason(&self) -> Option<&str> {
        self.fallback_reason.as_deref()
    }

    pub fn local_addr_v4(&self) -> Option<SocketAddr> {
        self.socks[0].as_ref().map(|s| s.local)
    }

    pub fn local_addr_v6(&self) -> Option<SocketAddr> {
        self.socks[1].as_ref().map(|s| s.local)
    }

    pub fn counters(&self) -> NetCounters {
        self.rx.counters
    }

    /// Largest datagram (or GSO aggregate) one send can carry.
    pub fn max_send_len(&self) -> usize {
        self.tx.slots.first().map_or(0, |s| s.buf.len())
    }

    /// Queues a copy of `bytes` for sending to `meta.dst`. Blocks only while every send slot
    /// is in flight; the send is submitted by the next [`UdpTransport::poll`] or
    /// [`UdpTransport::flush`] (or earlier, when a batch fills).
    pub fn send(&mut self, meta: &TxMeta, bytes: &[u8]) -> Result<(), NetError> {
        let max = self.max_send_len();
        if bytes.len() > max {
            return Err(NetError::TooLong {
                len: bytes.len(),
                max,
            });
        }
        self.send_with(meta, |buf| {
            buf[..bytes.len()].copy_from_slice(bytes);
            bytes.len()
        })
    }

    /// Queues a send whose bytes `build` writes straight into the send buffer (no copy);
    /// `build` returns the length written, 0 to cancel.
    pub fn send_with(
        &mut self,
        meta: &TxMeta,
        build: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<(), NetError> {
        // Whatever was queued before goes out before this send.
        self.close_batch()?;
        let sock = if meta.dst.is_ipv4() { 0 } else { 1 };
        if self.socks[sock].is_none() {
            return Err(NetError::NoSocket(if sock == 0 { "IPv4" } else { "IPv6" }));
        }
        let idx = self.free_slot()?;
        let slot = &mut self.tx.slots[idx as usize];
        let len = build(&mut slot.buf).min(slot.buf.len());
        if len == 0 {
            self.tx.free.push(idx);
            return Ok(());
        }
        let segments = match meta.segment_size {
            None => 1,
            Some(seg) => {
                let err = if !self.gso {
                    Some("GSO is not enabled in NetConfig")
                } else if seg == 0 {
                    Some("segment size 0")
                } else if len.div_ceil(seg as usize) > MAX_GSO_SEGMENTS {
                    Some("more than MAX_GSO_SEGMENTS segments")
                } else {
                    None
                };
                if let Some(e) = err {
                    self.tx.free.push(idx);
                    return Err(NetError::Gso(e));
                }
                len.div_ceil(seg as usize) as u32
            }
        };
        // A single segment goes without the control message: the kernel would send it alike.
        let gso = meta.segment_size.filter(|_| segments > 1);
        slot.len = len;
        slot.segments = segments;
        slot.sock = sock;
        self.last_queued = Some((idx, 0, len, 0));
        self.tx.prepare(idx, meta, gso);
        let fds = self.fds();
        match &mut self.driver {
            Driver::Uring(d) => d.queue_send(&mut self.tx, idx, fds)?,
            Driver::Syscalls(d) => d.queue_send(&mut self.tx, idx, fds, &mut self.rx.counters),
        }
        Ok(())
    }

    /// Builds one RoCE packet (BTH..ICRC, ICRC for IPv4 Identification 0) straight into a
    /// send slot and queues it. `builder` names the flow; `meta.dst` must match it.
    pub fn send_packet(
        &mut self,
        meta: &TxMeta,
        builder: &PacketBuilder,
        repr: &TransportRepr,
        payload: &[u8],
    ) -> Result<(), NetError> {
        let mut err = None;
        self.send_with(meta, |buf| match builder.emit(0, repr, payload, buf) {
            Ok(n) => n,
            Err(e) => {
                err = Some(e);
                0
            }
        })?;
        err.map_or(Ok(()), |e| Err(e.into()))
    }

    /// Builds consecutive packets of one flow into one UDP GSO send (needs
    /// [`NetConfig::gso`]; a single packet goes without GSO). Every packet but the last must
    /// have the same length, the segment size; packet `k` gets the ICRC for IPv4
    /// Identification `k`, which the kernel's segmentation writes.
    pub fn send_gso(
        &mut self,
        meta: &TxMeta,
        builder: &PacketBuilder,
        packets: &[(TransportRepr, &[u8])],
    ) -> Result<(), NetError> {
        let Some((first, _)) = packets.first() else {
            return Ok(());
        };
        let seg = first.buffer_len();
        if packets.len() > MAX_GSO_SEGMENTS {
            return Err(NetError::Gso("more than MAX_GSO_SEGMENTS segments"));
        }
        let (last, body) = packets.split_last().unwrap_or((&packets[0], &[]));
        if body.iter().any(|(r, _)| r.buffer_len() != seg) || last.0.buffer_len() > seg {
            return Err(NetError::Gso("packets before the last differ in length"));
        }
        let seg16 = u16::try_from(seg).map_err(|_| NetError::Gso("segment too long"))?;
        let meta = TxMeta {
            segment_size: (packets.len() > 1).then_some(seg16),
            ..*meta
        };
        let mut err = None;
        self.send_with(&meta, |buf| {
            let mut at = 0;
            for (k, (repr, payload)) in packets.iter().enumerate() {
                match builder.emit(
                    k as u16,
                    repr,
                    payload,
                    buf.get_mut(at..).unwrap_or(&mut []),
                ) {
                    Ok(n) => at += n,
                    Err(e) => {
                        err = Some(e);
                        return 0;
                    }
                }
            }
            at
        })?;
        err.map_or(Ok(()), |e| Err(e.into()))
    }

    fn fds(&self) -> [Option<RawFd>; 2] {
        [
            self.socks[0].as_ref().map(|s| s.fd.as_raw_fd()),
            self.socks[1].as_ref().map(|s| s.fd.as_raw_fd()),
        ]
    }

    fn free_slot(&mut self) -> Result<u32, NetError> {
        loop {
            if let Some(i) = self.tx.free.pop() {
                return Ok(i);
            }
            let fds = self.fds();
            match &mut self.driver {
                Driver::Uring(d) => d.wait_tx_slot(&mut self.tx, &mut self.rx.counters)?,
                Driver::Syscalls(d) => d.flush(&mut self.tx, fds, &mut self.rx.counters),
            }
        }
    }

    /// Queues one whole RoCE packet (`packet` is BTH..ICRC; its ICRC is recomputed here) for
    /// the flow `builder` to `meta.dst`, coalescing it with the packets queued just before it
    /// into one UDP GSO send when [`NetConfig::gso`] is on: consecutive packets of one flow,
    /// the same IP header fields and the same length (a shorter one ends the batch) become the
    /// segments of one `sendmsg`, and segment `k` is sealed for IPv4 Identification `k`, which
    /// the kernel's segmentation writes (see [`NetConfig::gso`]). The batch is sent by the next
    /// [`UdpTransport::flush`], [`UdpTransport::poll`] or other send, or when it is full.
    /// Without GSO every packet is its own datagram, sealed for Identification 0.
    pub fn push_packet(
        &mut self,
        meta: &TxMeta,
        builder: &PacketBuilder,
        packet: &[u8],
    ) -> Result<(), NetError> {
        let meta = TxMeta {
            segment_size: None,
            ..*meta
        };
        let len = packet.len();
        // The ICRC covers the IPv4 Identification, and segment `k` is sealed for `k`: what
        // the kernel's software segmentation writes (0, 1, 2, ... from an unconnected DF
        // socket), verified on loopback. A NIC's segmentation offload may number them
        // otherwise, and kernel rxe and hardware check every bit; a softroce peer solves for
        // the Identification, so any numbering reaches it. IPv6 has no such field. (A batch
        // open to the same destination already passed: no lookup per packet.)
        let gso = self.gso
            && (self.batch.as_ref().is_some_and(|b| b.meta.dst == meta.dst)
                || match meta.dst.ip() {
                    IpAddr::V6(_) => true,
                    IpAddr::V4(a) => a.is_loopback() || self.ident_solvers.contains(&a),
                });
        if !gso {
            if self.batch.is_some() {
                // Packets leave in the order they were pushed.
                self.close_batch()?;
            }
            let mut err = None;
            self.send_with(&meta, |buf| {
                let Some(out) = buf.get_mut(..len) else {
                    return 0;
                };
                match builder.seal_copying(0, packet, out) {
                    Ok(()) => len,
                    Err(e) => {
                        err = Some(e);
                        0
                    }
                }
            })?;
            return err.map_or(Ok(()), |e| Err(e.into()));
        }
        let flow = (
            builder.local,
            builder.remote,
            builder.src_port,
            builder.dst_port,
        );
        let room = self.max_send_len();
        if len > room || len > u16::MAX as usize {
            return Err(NetError::TooLong { len, max: room });
        }
        if let Some(b) = &self.batch {
            let joins = !b.ended
                && b.meta == meta
                && b.flow == flow
                && len <= b.seg
                && b.count < MAX_GSO_SEGMENTS
                && b.len + len <= room;
            if !joins {
                self.close_batch()?;
            }
        }
        let batch = match self.batch {
            Some(b) => b,
            None => {
                let sock = if meta.dst.is_ipv4() { 0 } else { 1 };
                if self.socks[sock].is_none() {
                    return Err(NetError::NoSocket(if sock == 0 { "IPv4" } else { "IPv6" }));
                }
                let slot = self.free_slot()?;
                OpenBatch {
                    slot,
                    meta,
                    flow,
                    seg: len,
                    count: 0,
                    len: 0,
                    ended: false,
                }
            }
        };
        let out = &mut self.tx.slots[batch.slot as usize].buf[batch.len..batch.len + len];
        let sealed = builder.seal_copying(batch.count as u16, packet, out);
        if sealed.is_ok() {
            self.last_queued = Some((batch.slot, batch.len, len, batch.count as u16));
        }
        self.batch = Some(OpenBatch {
            count: batch.count + usize::from(sealed.is_ok()),
            len: batch.len + if sealed.is_ok() { len } else { 0 },
            ended: batch.ended || (sealed.is_ok() && len < batch.seg),
            ..batch
        });
        sealed.map_err(NetError::from)
    }

    /// Whether `peer` recovers any IPv4 Identification (a softroce device: the capability
    /// exchange said so), so that GSO sends reach it on any path. Forgotten with `false`.
    pub fn set_peer_solves_ident(&mut self, peer: Ipv4Addr, solves: bool) {
        if solves {
            self.ident_solvers.insert(peer);
        } else {
            self.ident_solvers.remove(&peer);
        }
    }

    /// The UDP payload (BTH..ICRC, sealed) of the datagram the last `send`, `send_with` or
    /// `push_packet` queued, and the IPv4 Identification the kernel gives it (0, or `k` for the
    /// `k`-th segment of a GSO send). Valid until the next send is queued: a capture or a
    /// fault layer looks at it right away.
    pub fn last_queued(&self) -> Option<(&[u8], u16)> {
        let (slot, at, len, ident) = self.last_queued?;
        let buf = &self.tx.slots.get(slot as usize)?.buf;
        Some((buf.get(at..at + len)?, ident))
    }

    /// [`UdpTransport::last_queued`], to change it before it leaves (fault injection breaking
    /// its ICRC).
    pub fn last_queued_mut(&mut self) -> Option<&mut [u8]> {
        let (slot, at, len, _) = self.last_queued?;
        self.tx
            .slots
            .get_mut(slot as usize)?
            .buf
            .get_mut(at..at + len)
    }

    /// Whether the sockets send UDP checksums (they must for GSO; else 0, as rxe).
    pub fn udp_checksums(&self) -> bool {
        self.gso
    }

    /// Queues the GSO send [`UdpTransport::push_packet`] was filling.
    fn close_batch(&mut self) -> Result<(), NetError> {
        let Some(b) = self.batch.take() else {
            return Ok(());
        };
        if b.count == 0 {
            self.tx.free.push(b.slot);
            return Ok(());
        }
        let sock = if b.meta.dst.is_ipv4() { 0 } else { 1 };
        let slot = &mut self.tx.slots[b.slot as usize];
        slot.len = b.len;
        slot.segments = b.count as u32;
        slot.sock = sock;
        // A single segment goes without the control message: the kernel would send it alike.
        let gso = (b.count > 1).then_some(b.seg as u16);
        self.rx.counters.tx_gso_sends += u64::from(b.count > 1);
        self.tx.prepare(b.slot, &b.meta, gso);
        let fds = self.fds();
        match &mut self.driver {
            Driver::Uring(d) => d.queue_send(&mut self.tx, b.slot, fds)?,
            Driver::Syscalls(d) => d.queue_send(&mut self.tx, b.slot, fds, &mut self.rx.counters),
        }
        Ok(())
    }

    /// Submits queued sends without waiting.
    pub fn flush(&mut self) -> io::Result<()> {
        self.close_batch().map_err(into_io)?;
        let fds = self.fds();
        match &mut self.driver {
            Driver::Uring(d) => d.submit(),
            Driver::Syscalls(d) => {
                d.flush(&mut self.tx, fds, &mut self.rx.counters);
                Ok(())
            }
        }
    }

    /// Submits queued sends, waits up to `timeout` (`None`: until something completes) for
    /// received datagrams or send completions, and hands each verified datagram to `on_rx`.
    /// Returns the number delivered.
    pub fn poll(
        &mut self,
        timeout: Option<Duration>,
        on_rx: &mut dyn FnMut(&mut RxDatagram<'_>),
    ) -> io::Result<usize> {
        self.close_batch().map_err(into_io)?;
        let locals = [
            self.socks[0].as_ref().map(|s| s.local),
            self.socks[1].as_ref().map(|s| s.local),
        ];
        let fds = self.fds();
        match &mut self.driver {
            Driver::Uring(d) => d.poll(timeout, &mut self.tx, &mut self.rx, locals, fds, on_rx),
            Driver::Syscalls(d) => d.poll(timeout, &mut self.tx, &mut self.rx, locals, fds, on_rx),
        }
    }

    /// Makes a blocking [`UdpTransport::poll`] also return when `fd` becomes readable (the
    /// daemon's doorbell eventfd). The caller drains `fd` and keeps it open.
    pub fn set_wake_fd(&mut self, fd: RawFd) {
        match &mut self.driver {
            Driver::Uring(d) => d.set_wake_fd(fd),
            Driver::Syscalls(d) => d.wake = Some(fd),
        }
    }

    /// Sends still in flight (queued or submitted, not completed).
    pub fn tx_in_flight(&self) -> usize {
        self.tx.slots.len() - self.tx.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each segment of a GRO aggregate is handed on with the segments before it as its room,
    /// and what a receiver writes there (the headers it rebuilds) never reaches a later one.
    #[test]
    fn gro_segments_are_handed_on_with_the_bytes_before_them_free() {
        let mut rx = RxState {
            verifier: RxVerifier::new(),
            verify: false,
            counters: NetCounters::default(),
        };
        let src: SocketAddr = "127.0.0.1:4791".parse().unwrap();
        let head = RxHead {
            src,
            dst: src,
            tos: 0,
            segment: Some(100),
        };
        let payload: Vec<u8> = (0..250u32).map(|i| i as u8).collect();
        let mut buf = vec![0xeeu8; 40];
        buf.extend_from_slice(&payload);
        let mut seen = Vec::new();
        let n = rx.deliver(head, &mut buf, 40, &mut |d: &mut RxDatagram<'_>| {
            seen.push((d.room(), d.bytes().to_vec()));
            // What a link does: headers written over the room in front.
            d.with_room(40).unwrap()[..40].fill(0xaa);
        });
        assert_eq!(n, 3);
        let rooms: Vec<usize> = seen.iter().map(|s| s.0).collect();
        assert_eq!(
            rooms,
            [40, 140, 240],
            "the metadata, then the segments before"
        );
        for (k, (_, bytes)) in seen.iter().enumerate() {
            let want = &payload[k * 100..(k * 100 + 100).min(250)];
            assert_eq!(&bytes[..], want, "segment {k} intact");
        }
        assert_eq!(rx.counters.rx_packets, 3);
        assert_eq!(rx.counters.rx_bytes, 250);
    }

    /// A datagram whose room is too small for the headers gets none.
    #[test]
    fn with_room_refuses_more_than_lies_in_front() {
        let mut buf = [1u8, 2, 3, 4, 5];
        let src: SocketAddr = "[::1]:4791".parse().unwrap();
        let mut d = RxDatagram::new(src, src, 0, None, &mut buf, 3);
        assert_eq!(d.bytes(), [4, 5]);
        assert_eq!(d.room(), 3);
        assert!(d.with_room(4).is_none());
        assert_eq!(d.with_room(2).unwrap(), [2, 3, 4, 5]);
    }
}
