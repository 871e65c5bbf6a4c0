//! The io_uring driver: one multishot `RecvMsg` per socket reading into a provided-buffer
//! ring, and `SendMsg` requests from the fixed send-slot pool, submitted in batches.
//!
//! Why this shape: a UDP datagram costs ~5 us of kernel CPU here and one syscall per packet
//! caps the rate at ~150k pkt/s. A multishot receive keeps producing completions without new
//! submissions, the buffer ring lets the kernel pick a free buffer without an allocation or a
//! syscall per packet, and sends share one `io_uring_enter` per batch.

use super::cmsg::{self, CONTROL_LEN};
use super::transport::{NetCounters, RxDatagram, RxState, TxPool};
use io_uring::{cqueue, opcode, types, IoUring};
use memmap2::MmapMut;
use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

const TAG_SHIFT: u32 = 32;
const TAG_RECV: u64 = 1 << TAG_SHIFT;
const TAG_SEND: u64 = 2 << TAG_SHIFT;
const TAG_CANCEL: u64 = 3 << TAG_SHIFT;
/// A one-shot poll on the wake descriptor (see [`UringDriver::set_wake_fd`]).
const TAG_WAKE: u64 = 4 << TAG_SHIFT;
/// Buffer group id of the receive ring (one group serves both sockets).
const BGID: u16 = 0x5152;
/// Size of `struct io_uring_recvmsg_out`, which starts every multishot receive buffer.
const RECVMSG_OUT_LEN: usize = 16;

/// The provided-buffer ring: `entries` descriptors the kernel consumes, and the buffers they
/// describe, both in anonymous mappings owned here. (Also the TAP driver's, `net::tap`.)
pub(super) struct BufRing {
    pub(super) ring: MmapMut,
    data: MmapMut,
    pub(super) entries: u16,
    buf_len: usize,
    /// Our copy of the tail; published to the kernel by [`BufRing::publish`].
    tail: u16,
}

impl BufRing {
    pub(super) fn new(entries: u16, buf_len: usize) -> io::Result<BufRing> {
        let ring =
            MmapMut::map_anon(entries as usize * std::mem::size_of::<types::BufRingEntry>())?;
        let data = MmapMut::map_anon(entries as usize * buf_len)?;
        let mut r = BufRing {
            ring,
            data,
            entries,
            buf_len,
            tail: 0,
        };
        for bid in 0..entries {
            r.push(bid);
        }
        r.publish();
        Ok(r)
    }

    fn entry_ptr(&mut self, i: u16) -> *mut types::BufRingEntry {
        let base = self.ring.as_mut_ptr().cast::<types::BufRingEntry>();
        // SAFETY: `i & (entries - 1)` is below `entries`, the mapping's length in entries.
        unsafe { base.add((i & (self.entries - 1)) as usize) }
    }

    /// Hands buffer `bid` back to the kernel (visible after the next `publish`).
    pub(super) fn push(&mut self, bid: u16) {
        let addr = self.data.as_mut_ptr() as u64 + bid as u64 * self.buf_len as u64;
        let len = self.buf_len as u32;
        let e = self.entry_ptr(self.tail);
        // SAFETY: the entry lies in our mapping; the kernel reads entries only between its
        // head and the published tail, and this one is past the published tail. The setters
        // leave the `resv` field (the tail, in entry 0) untouched.
        unsafe {
            (*e).set_addr(addr);
            (*e).set_len(len);
            (*e).set_bid(bid);
        }
        self.tail = self.tail.wrapping_add(1);
    }

    /// Publishes the tail with release ordering, so the kernel sees the entries first.
    pub(super) fn publish(&mut self) {
        let base = self.ring.as_ptr().cast::<types::BufRingEntry>();
        // SAFETY: the tail is a naturally aligned u16 inside the mapping that only we write
        // and the kernel reads: an atomic store is the documented protocol.
        unsafe {
            let tail = types::BufRingEntry::tail(base) as *const AtomicU16;
            (*tail).store(self.tail, Ordering::Release);
        }
    }

    /// The first `len` bytes of buffer `bid`, which the kernel has filled and handed to us.
    pub(super) fn buffer(&self, bid: u16, len: usize) -> Option<&[u8]> {
        if bid >= self.entries {
            return None;
        }
        let start = bid as usize * self.buf_len;
        self.data.get(start..start + len.min(self.buf_len))
    }

    /// [`BufRing::buffer`], to write in (until it is pushed back to the kernel).
    pub(super) fn buffer_mut(&mut self, bid: u16, len: usize) -> Option<&mut [u8]> {
        if bid >= self.entries {
            return None;
        }
        let start = bid as usize * self.buf_len;
        self.data.get_mut(start..start + len.min(self.buf_len))
    }
}

/// A completion kept aside while waiting for a send slot, processed by the next poll.
type StashedCqe = (u64, i32, u32);

pub(crate) struct UringDriver {
    // Field order is drop order: the ring goes first, so the kernel lets go of the buffers
    // and msghdrs before they are freed (UdpTransport also cancels everything first).
    ring: IoUring,
    bufs: BufRing,
    /// The msghdr template of each socket's multishot receive: only the name and control
    /// lengths matter to the kernel; they fix the layout of every receive buffer.
    recv_msg: Box<[libc::msghdr; 2]>,
    armed: [bool; 2],
    /// A descriptor whose readability ends a blocking poll (the daemon's doorbell eventfd),
    /// and whether a poll request on it is in flight.
    wake: Option<RawFd>,
    wake_armed: bool,
    stash: VecDeque<StashedCqe>,
    /// SQEs pushed but not yet submitted.
    unsubmitted: usize,
}

impl UringDriver {
    pub fn new(rx_buffers: u16, rx_buf_len: usize, tx_slots: usize) -> io::Result<UringDriver> {
        let entries = rx_buffers.clamp(2, 1 << 15).next_power_of_two();
        let sq = (tx_slots.clamp(8, 4096) as u32).next_power_of_two();
        // Multishot receives post one completion per datagram without a submission: size the
        // completion queue for a full buffer ring plus every send.
        let cq = (entries as u32 * 2 + sq * 2).next_power_of_two();
        // COOP_TASKRUN (5.19+): completions are processed when we enter the kernel anyway,
        // not by interrupting the thread; retried without it on older kernels.
        // With COOP_TASKRUN, receive completions are deferred task work that only an entry into
        // the kernel runs; TASKRUN_FLAG makes the kernel say so in the SQ ring, so that a busy
        // poll enters the kernel exactly when completions are waiting (see `submit_pushed`).
        let ring = IoUring::builder()
            .setup_cqsize(cq)
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .build(sq)
            .or_else(|_| IoUring::builder().setup_cqsize(cq).build(sq))
            .map_err(|e| io::Error::new(e.kind(), format!("io_uring_setup: {e}")))?;
        let buf_len = rx_buf_len + RECVMSG_OUT_LEN + cmsg::SOCKADDR_LEN + CONTROL_LEN;
        let bufs = BufRing::new(entries, buf_len)?;
        // SAFETY: the ring mapping is page aligned, holds `entries` entries, and stays alive
        // (and in place) until the ring is dropped.
        unsafe {
            ring.submitter()
                .register_buf_ring_with_flags(bufs.ring.as_ptr() as u64, entries, BGID, 0)
                .map_err(|e| io::Error::new(e.kind(), format!("io_uring buffer ring: {e}")))?;
        }
        // SAFETY: all-zero is a valid msghdr.
        let mut recv_msg: Box<[libc::msghdr; 2]> = Box::new(unsafe { std::mem::zeroed() });
        for m in recv_msg.iter_mut() {
            m.msg_namelen = cmsg::SOCKADDR_LEN as libc::socklen_t;
            m.msg_controllen = CONTROL_LEN as _;
        }
        // The receives are armed by the first poll, not here. io_uring runs a multishot
        // receive's work (the copy of each datagram, on every wake-up of the socket) as task
        // work of the thread that submitted it, and this driver is built by the thread that
        // creates the device (the main thread, or the control thread for `link add`). Armed
        // here, that thread did every receive copy, woken for each batch: 28 % of a CPU at
        // two daemons' `ib_write_bw`, taken from the pollers.
        Ok(UringDriver {
            ring,
            bufs,
            recv_msg,
            armed: [false; 2],
            wake: None,
            wake_armed: false,
            stash: VecDeque::with_capacity(entries as usize * 2 + 16),
            unsubmitted: 0,
        })
    }

    /// Pushes a request, submitting first if the queue is full.
    fn push(&mut self, sqe: &io_uring::squeue::Entry) -> io::Result<()> {
        self.push_raw(sqe)
    }

    fn push_raw(&mut self, sqe: &io_uring::squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: every SQE built here points at memory that outlives the request: the
            // send slots are held until their completion, the receive msghdrs and buffer ring
            // until the ring is dropped.
            let pushed = unsafe { self.ring.submission().push(sqe).is_ok() };
            if pushed {
                self.unsubmitted += 1;
                return Ok(());
            }
            let before = self.unsubmitted;
            self.submit_pushed()?;
            if self.unsubmitted == before {
                // The kernel took nothing (a completion queue in overflow): let the caller
                // poll and drain it instead of spinning here.
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    "io_uring submission queue full",
                ));
            }
        }
    }

    /// Makes a blocking poll also return when `fd` becomes readable. The caller drains `fd`.
    pub fn set_wake_fd(&mut self, fd: RawFd) {
        self.wake = Some(fd);
    }

    /// (Re)starts the multishot receive of every socket that has none running, and the poll
    /// on the wake descriptor.
    fn arm(&mut self, fds: [Option<RawFd>; 2]) -> io::Result<()> {
        if let (Some(fd), false) = (self.wake, self.wake_armed) {
            let sqe = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
                .build()
                .user_data(TAG_WAKE);
            self.push(&sqe)?;
            self.wake_armed = true;
        }
        for (i, fd) in fds.iter().enumerate() {
            if let (Some(fd), false) = (fd, self.armed[i]) {
                let sqe = opcode::RecvMsgMulti::new(types::Fd(*fd), &self.recv_msg[i], BGID)
                    .build()
                    .user_data(TAG_RECV | i as u64);
                self.push(&sqe)?;
                self.armed[i] = true;
            }
        }
        Ok(())
    }

    pub fn submit(&mut self) -> io::Result<()> {
        self.submit_pushed()
    }

    fn submit_pushed(&mut self) -> io::Result<()> {
        // Nothing to submit and no deferred completions waiting: no system call.
        if self.unsubmitted == 0 && !self.ring.submission().taskrun() {
            return Ok(());
        }
        match self.ring.submit() {
            Ok(_) => {
                self.unsubmitted = 0;
                Ok(())
            }
            // EBUSY: the completion queue is overflowing; the caller drains it and retries.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY) | Some(libc::EINTR)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn submit_and_wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        let res = match timeout {
            None => self.ring.submit_and_wait(1),
            Some(t) => {
                let ts = types::Timespec::from(t);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            }
        };
        match res {
            Ok(_) => {
                self.unsubmitted = 0;
                Ok(())
            }
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY)
                ) =>
            {
                // ETIME still submitted everything queued.
                if e.raw_os_error() == Some(libc::ETIME) {
                    self.unsubmitted = 0;
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    pub fn queue_send(
        &mut self,
        tx: &mut TxPool,
        idx: u32,
        fds: [Option<RawFd>; 2],
    ) -> io::Result<()> {
        let slot = &tx.slots[idx as usize];
        let Some(fd) = fds[slot.sock] else {
            tx.free.push(idx);
            return Err(io::Error::new(io::ErrorKind::NotConnected, "no socket"));
        };
        // MSG_DONTWAIT keeps the sends in order. RoCE wants a QP's packets to leave in order;
        // io_uring issues SQEs in order, but a send that meets a full socket buffer would
        // otherwise be parked on a poll and retried after later sends went out. With
        // MSG_DONTWAIT it completes with EAGAIN instead (counted in tx_would_block), a loss
        // the RC transport recovers from like a full NIC queue. Linking the sends
        // (IO_HARDLINK) also keeps order without the loss, but halved the send rate here.
        let sqe = opcode::SendMsg::new(types::Fd(fd), &slot.msg)
            .flags(libc::MSG_DONTWAIT as u32)
            .build()
            .user_data(TAG_SEND | idx as u64);
        self.push(&sqe)
    }

    /// Waits until at least one send completes; receive completions seen meanwhile are kept
    /// for the next poll.
    pub fn wait_tx_slot(&mut self, tx: &mut TxPool, counters: &mut NetCounters) -> io::Result<()> {
        self.submit_and_wait(None)?;
        for cqe in self.ring.completion() {
            let ud = cqe.user_data();
            match ud & !0xffff_ffff {
                TAG_SEND => complete_send(tx, counters, (ud & 0xffff_ffff) as u32, cqe.result()),
                TAG_RECV | TAG_WAKE => self.stash.push_back((ud, cqe.result(), cqe.flags())),
                _ => {}
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn handle(
        bufs: &mut BufRing,
        recv_msg: &[libc::msghdr; 2],
        armed: &mut [bool; 2],
        tx: &mut TxPool,
        rx: &mut RxState,
        locals: [Option<SocketAddr>; 2],
        (ud, res, flags): StashedCqe,
        on_rx: &mut dyn FnMut(&mut RxDatagram<'_>),
    ) -> usize {
        let tag = ud & !0xffff_ffff;
        let idx = (ud & 0xffff_ffff) as usize;
        if tag == TAG_SEND {
            complete_send(tx, &mut rx.counters, idx as u32, res);
            return 0;
        }
        if tag != TAG_RECV || idx > 1 {
            return 0;
        }
        if !cqueue::more(flags) {
            armed[idx] = false;
        }
        if res < 0 {
            match -res {
                libc::ENOBUFS => rx.counters.rx_no_buffers += 1,
                libc::ECANCELED => {}
                _ => rx.counters.rx_errors += 1,
            }
            return 0;
        }
        let Some(bid) = cqueue::buffer_select(flags) else {
            rx.counters.rx_errors += 1;
            return 0;
        };
        // The metadata first (it lies in the buffer in front of the payload, where the link
        // may then write headers), then the payload, by its place in the buffer.
        let len = res as usize;
        let parsed = match (bufs.buffer(bid, len), locals[idx]) {
            (Some(buf), Some(local)) => {
                match io_uring::types::RecvMsgOut::parse(buf, &recv_msg[idx]) {
                    Ok(out) => {
                        // The payload is a piece of `buf` (the crate slices it out): its
                        // place is the distance between the two starts.
                        let payload = out.payload_data();
                        let at = (payload.as_ptr() as usize)
                            .checked_sub(buf.as_ptr() as usize)
                            .filter(|at| at + payload.len() <= buf.len());
                        match at {
                            Some(at) => rx
                                .head(
                                    local,
                                    out.name_data(),
                                    out.control_data(),
                                    payload.len(),
                                    out.is_payload_truncated(),
                                )
                                .map(|head| (head, at, at + payload.len()))
                                .ok_or(()),
                            None => {
                                rx.counters.rx_errors += 1;
                                Err(())
                            }
                        }
                    }
                    Err(()) => {
                        rx.counters.rx_errors += 1;
                        Err(())
                    }
                }
            }
            _ => {
                rx.counters.rx_errors += 1;
                Err(())
            }
        };
        let delivered = match parsed {
            Ok((head, at, end)) => match bufs.buffer_mut(bid, end) {
                Some(buf) => rx.deliver(head, buf, at, on_rx),
                None => 0,
            },
            Err(()) => 0,
        };
        if bid < bufs.entries {
            bufs.push(bid);
        }
        delivered
    }

    pub fn poll(
        &mut self,
        timeout: Option<Duration>,
        tx: &mut TxPool,
        rx: &mut RxState,
        locals: [Option<SocketAddr>; 2],
        fds: [Option<RawFd>; 2],
        on_rx: &mut dyn FnMut(&mut RxDatagram<'_>),
    ) -> io::Result<usize> {
        self.arm(fds)?;
        let mut delivered = 0;
        while let Some(c) = self.stash.pop_front() {
            if c.0 == TAG_WAKE {
                self.wake_armed = false;
                continue;
            }
            delivered += Self::handle(
                &mut self.bufs,
                &self.recv_msg,
                &mut self.armed,
                tx,
                rx,
                locals,
                c,
                on_rx,
            );
        }
        let ready = delivered > 0 || !self.ring.completion().is_empty();
        if ready || timeout == Some(Duration::ZERO) {
            self.submit()?;
        } else {
            self.submit_and_wait(timeout)?;
        }
        // Drain in rounds: completions that arrive while we process are taken too, up to a
        // bound so that one busy poll cannot starve the caller.
        for _ in 0..4 {
            let mut seen = 0;
            let (bufs, recv_msg, armed) = (&mut self.bufs, &self.recv_msg, &mut self.armed);
            for cqe in self.ring.completion() {
                seen += 1;
                if cqe.user_data() == TAG_WAKE {
                    self.wake_armed = false;
                    continue;
                }
                delivered += Self::handle(
                    bufs,
                    recv_msg,
                    armed,
                    tx,
                    rx,
                    locals,
                    (cqe.user_data(), cqe.result(), cqe.flags()),
                    on_rx,
                );
            }
            self.bufs.publish();
            if seen == 0 {
                break;
            }
        }
        self.arm(fds)?;
        self.submit()?;
        Ok(delivered)
    }

    /// Cancels the receives and waits (bounded) for every request to finish, so that no
    /// kernel access to the buffers or msghdrs outlives them.
    pub fn shutdown(&mut self, tx: &mut TxPool, counters: &mut NetCounters) {
        let _ = self.submit();
        let _ = self
            .ring
            .submitter()
            .register_sync_cancel(None, types::CancelBuilder::any());
        let cancel = opcode::AsyncCancel2::new(types::CancelBuilder::any())
            .build()
            .user_data(TAG_CANCEL);
        let _ = self.push(&cancel);
        for _ in 0..100 {
            let _ = self.submit_and_wait(Some(Duration::from_millis(10)));
            for cqe in self.ring.completion() {
                let ud = cqe.user_data();
                if ud & !0xffff_ffff == TAG_SEND {
                    complete_send(tx, counters, (ud & 0xffff_ffff) as u32, cqe.result());
                }
            }
            if tx.free.len() == tx.slots.len() {
                break;
            }
        }
    }
}

fn complete_send(tx: &mut TxPool, counters: &mut NetCounters, idx: u32, res: i32) {
    let Some(slot) = tx.slots.get(idx as usize) else {
        return;
    };
    if res < 0 {
        counters.tx_errors += slot.segments as u64;
        if -res == libc::EAGAIN {
            counters.tx_would_block += slot.segments as u64;
        }
        tracing::debug!("send failed: {}", io::Error::from_raw_os_error(-res));
    } else {
        counters.tx_packets += slot.segments as u64;
        counters.tx_bytes += res as u64;
    }
    tx.free.push(idx);
}
