//! The L2 device's packet I/O: whole Ethernet frames through a TAP interface, created or
//! opened with the `tun-tap` crate (`IFF_TAP | IFF_NO_PI`), read and written in batches.
//!
//! A TAP descriptor takes exactly one frame per `write` and gives one per `read`; `writev`
//! joins its iovecs into one frame, so it cannot batch (measured in
//! `examples/tap_bench.rs`). What batches is io_uring on the descriptor, which is what the
//! [`Backend::IoUring`] driver does:
//!
//! - receive: one multishot `IORING_OP_READ_MULTISHOT` (Linux 6.7) into a provided-buffer
//!   ring ([`super::uring`]'s `BufRing`): the kernel fills a buffer per frame and posts a
//!   completion, with no submission per frame; one `io_uring_enter` reaps them all;
//! - send: `IORING_OP_WRITE` requests from a fixed pool of frame slots, queued by
//!   [`TapIo::send_with`] and submitted together by [`TapIo::flush`] (or when a batch is
//!   full): one system call per batch instead of one per frame.
//!
//! Where io_uring or the multishot read is missing (older kernel, seccomp), the
//! [`Backend::Syscalls`] driver reads until `EAGAIN` after each `poll(2)` and writes each frame
//! with `write(2)`.
//!
//! A packet socket is no alternative here: bound to the TAP interface it sends in the wrong
//! direction (towards this descriptor), and it would not relieve the descriptor's queue.

use super::interface::{interface_mtu, set_up};
use super::uring::BufRing;
use super::{Backend, BackendChoice};
use io_uring::{cqueue, opcode, types, IoUring};
use memmap2::MmapMut;
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

const TAG_SHIFT: u32 = 32;
const TAG_READ: u64 = 1 << TAG_SHIFT;
const TAG_WRITE: u64 = 2 << TAG_SHIFT;
const TAG_WAKE: u64 = 3 << TAG_SHIFT;
const TAG_CANCEL: u64 = 4 << TAG_SHIFT;
const BGID: u16 = 0x7461;
/// Room in each frame buffer beyond the MTU: the Ethernet header, an 802.1Q tag, slack.
const FRAME_OVERHEAD: usize = 64;
/// The largest RoCE packet after the Ethernet header: IPv6 + UDP + BTH + the largest
/// extended headers + 4096 bytes of payload + pad + ICRC, rounded up.
const MAX_ROCE_FRAME: usize = 4352;

/// How to open the TAP device.
#[derive(Debug, Clone)]
pub struct TapConfig {
    /// The interface to create, or to open if it exists (a persistent TAP made by `ip
    /// tuntap add`).
    pub name: String,
    pub backend: BackendChoice,
    /// Frame buffers the kernel can fill before the daemon reads them.
    pub rx_buffers: u16,
    /// Frames queued for sending at once.
    pub tx_slots: usize,
    /// Bring the interface up (the kernel side; a bridge port must be up to forward).
    pub set_up: bool,
}

impl TapConfig {
    pub fn new(name: &str) -> TapConfig {
        TapConfig {
            name: name.to_string(),
            backend: BackendChoice::Auto,
            rx_buffers: 512,
            tx_slots: 256,
            set_up: true,
        }
    }
}

/// Counters of the TAP I/O.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TapCounters {
    pub rx_frames: u64,
    pub rx_bytes: u64,
    pub tx_frames: u64,
    pub tx_bytes: u64,
    pub tx_errors: u64,
    pub rx_errors: u64,
    /// The receive buffers were all in use (frames the kernel then kept or dropped).
    pub rx_no_buffers: u64,
    /// System calls made to send (a batch counts once).
    pub tx_calls: u64,
    /// Frames longer than a send slot, refused.
    pub tx_too_long: u64,
}

/// A TAP interface and its driver.
pub struct TapIo {
    // Field order is drop order: the driver goes first (it cancels its requests), then the
    // descriptor.
    driver: Driver,
    iface: tun_tap::Iface,
    mtu: usize,
    slot_len: usize,
    counters: TapCounters,
}

impl std::fmt::Debug for TapIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TapIo")
            .field("name", &self.iface.name())
            .field("mtu", &self.mtu)
            .field("backend", &self.backend())
            .finish()
    }
}

enum Driver {
    Uring(Box<UringTap>),
    Syscalls(SyscallTap),
}

impl TapIo {
    /// Creates or opens the TAP interface and starts its driver. The second value is why
    /// io_uring was not used, if it was wanted and failed.
    pub fn open(cfg: &TapConfig) -> io::Result<(TapIo, Option<String>)> {
        // EBUSY: the TAP is still attached to a descriptor of a process that just exited
        // (io_uring lets go of its files a moment after the process is gone), or another
        // daemon holds it; the first clears up within a second.
        let mut tries = 0;
        let iface = loop {
            match tun_tap::Iface::without_packet_info(&cfg.name, tun_tap::Mode::Tap) {
                Ok(i) => break i,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 60 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(io::Error::new(e.kind(), format!("TAP {}: {e}", cfg.name))),
            }
        };
        let fd = iface.as_raw_fd();
        set_nonblocking(fd)?;
        if cfg.set_up {
            set_up(iface.name())?;
        }
        let mtu = interface_mtu(iface.name())?;
        // Every RoCE frame fits (4096 bytes of payload and the largest headers) whatever the
        // interface's MTU is now, and every frame the interface's MTU allows.
        let slot_len = mtu.max(MAX_ROCE_FRAME) + FRAME_OVERHEAD;
        let mut why = None;
        let driver = match cfg.backend {
            BackendChoice::Syscalls => Driver::Syscalls(SyscallTap::new(slot_len)),
            choice => match UringTap::new(fd, cfg.rx_buffers, slot_len, cfg.tx_slots) {
                Ok(u) => Driver::Uring(Box::new(u)),
                Err(e) if choice == BackendChoice::Auto => {
                    why = Some(e.to_string());
                    Driver::Syscalls(SyscallTap::new(slot_len))
                }
                Err(e) => return Err(e),
            },
        };
        Ok((
            TapIo {
                driver,
                iface,
                mtu,
                slot_len,
                counters: TapCounters::default(),
            },
            why,
        ))
    }

    pub fn name(&self) -> &str {
        self.iface.name()
    }

    /// The TAP descriptor (for measurements that write to it directly).
    pub fn raw_fd(&self) -> RawFd {
        self.iface.as_raw_fd()
    }

    /// Turns the interface's carrier on or off (TUNSETCARRIER): the operator's `link set
    /// down` pulls the device's cable as the host sees it (`NO-CARRIER`, a bridge port
    /// disabled), as a NIC's link going down does.
    pub fn set_carrier(&self, on: bool) -> io::Result<()> {
        /// `_IOW('T', 226, int)` (linux/if_tun.h).
        const TUNSETCARRIER: libc::c_ulong = 0x4004_54e2;
        let on = libc::c_int::from(on);
        // SAFETY: an ioctl on the TAP descriptor we own, reading one int from a live local.
        if unsafe { libc::ioctl(self.iface.as_raw_fd(), TUNSETCARRIER, &on) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The interface's MTU (the largest frame payload, Ethernet header excluded).
    pub fn mtu(&self) -> usize {
        self.mtu
    }

    pub fn backend(&self) -> Backend {
        match self.driver {
            Driver::Uring(_) => Backend::IoUring,
            Driver::Syscalls(_) => Backend::Syscalls,
        }
    }

    pub fn counters(&self) -> TapCounters {
        self.counters
    }

    /// Largest frame [`TapIo::send_with`] takes.
    pub fn max_frame_len(&self) -> usize {
        self.slot_len
    }

    /// Makes a blocking [`TapIo::poll`] also return when `fd` is readable (the device's
    /// doorbell). The caller drains `fd`.
    pub fn set_wake_fd(&mut self, fd: RawFd) {
        match &mut self.driver {
            Driver::Uring(u) => u.wake = Some(fd),
            Driver::Syscalls(s) => s.wake = Some(fd),
        }
    }

    /// Queues one frame, written by `build` into a buffer of [`TapIo::max_frame_len`] bytes;
    /// `build` returns its length (0: nothing to send). It leaves with the next
    /// [`TapIo::flush`] or [`TapIo::poll`], or at once when a batch is full.
    pub fn send_with(&mut self, build: impl FnOnce(&mut [u8]) -> usize) -> io::Result<()> {
        let fd = self.iface.as_raw_fd();
        match &mut self.driver {
            Driver::Uring(u) => u.send_with(fd, &mut self.counters, build),
            Driver::Syscalls(s) => {
                let len = build(&mut s.scratch).min(s.scratch.len());
                if len > 0 {
                    write_frame(fd, &s.scratch[..len], &mut self.counters);
                }
                Ok(())
            }
        }
    }

    /// Queues a copy of `frame`.
    pub fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        if frame.len() > self.slot_len {
            self.counters.tx_too_long += 1;
            return Ok(());
        }
        self.send_with(|buf| {
            buf[..frame.len()].copy_from_slice(frame);
            frame.len()
        })
    }

    /// Submits the queued frames.
    pub fn flush(&mut self) -> io::Result<()> {
        match &mut self.driver {
            Driver::Uring(u) => u.flush(&mut self.counters),
            Driver::Syscalls(_) => Ok(()),
        }
    }

    /// Submits queued frames, waits up to `timeout` (`None`: without limit) for a frame or
    /// the wake descriptor, and hands every received frame to `on_frame`. Returns how many.
    pub fn poll(
        &mut self,
        timeout: Option<Duration>,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize> {
        let fd = self.iface.as_raw_fd();
        match &mut self.driver {
            Driver::Uring(u) => u.poll(fd, timeout, &mut self.counters, on_frame),
            Driver::Syscalls(s) => s.poll(fd, timeout, &mut self.counters, on_frame),
        }
    }
}

impl Drop for TapIo {
    fn drop(&mut self) {
        if let Driver::Uring(u) = &mut self.driver {
            u.shutdown(&mut self.counters);
        }
    }
}

fn write_frame(fd: RawFd, frame: &[u8], counters: &mut TapCounters) {
    // SAFETY: a valid buffer of `frame.len()` bytes.
    let r = unsafe { libc::write(fd, frame.as_ptr().cast(), frame.len()) };
    counters.tx_calls += 1;
    if r < 0 {
        counters.tx_errors += 1;
    } else {
        counters.tx_frames += 1;
        counters.tx_bytes += r as u64;
    }
}

/// The system call driver.
struct SyscallTap {
    scratch: Vec<u8>,
    rx: Vec<u8>,
    wake: Option<RawFd>,
}

impl SyscallTap {
    fn new(slot_len: usize) -> SyscallTap {
        SyscallTap {
            scratch: vec![0u8; slot_len],
            rx: vec![0u8; slot_len],
            wake: None,
        }
    }

    fn poll(
        &mut self,
        fd: RawFd,
        timeout: Option<Duration>,
        counters: &mut TapCounters,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize> {
        let mut n = self.read_ready(fd, counters, on_frame);
        if n > 0 || timeout == Some(Duration::ZERO) {
            return Ok(n);
        }
        let mut fds = [
            libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.wake.unwrap_or(-1),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let ms = timeout.map_or(-1, |t| t.as_millis().clamp(1, i32::MAX as u128) as i32);
        // SAFETY: two valid pollfds.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        n += self.read_ready(fd, counters, on_frame);
        Ok(n)
    }

    fn read_ready(
        &mut self,
        fd: RawFd,
        counters: &mut TapCounters,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> usize {
        let mut n = 0;
        // Bounded, so that a flood cannot keep the device loop from its other work.
        for _ in 0..256 {
            // SAFETY: a valid buffer of its own length.
            let r = unsafe { libc::read(fd, self.rx.as_mut_ptr().cast(), self.rx.len()) };
            if r <= 0 {
                break;
            }
            counters.rx_frames += 1;
            counters.rx_bytes += r as u64;
            on_frame(&self.rx[..r as usize]);
            n += 1;
        }
        n
    }
}

type StashedCqe = (u64, i32, u32);

/// The io_uring driver.
struct UringTap {
    // Field order is drop order: the ring first, so the kernel lets go of the buffers.
    ring: IoUring,
    bufs: BufRing,
    tx: MmapMut,
    slot_len: usize,
    free: Vec<u32>,
    slots: usize,
    read_armed: bool,
    wake: Option<RawFd>,
    wake_armed: bool,
    unsubmitted: usize,
    /// Read completions seen while waiting for a free send slot.
    stash: VecDeque<StashedCqe>,
}

impl UringTap {
    fn new(fd: RawFd, rx_buffers: u16, slot_len: usize, tx_slots: usize) -> io::Result<UringTap> {
        let entries = rx_buffers.clamp(2, 1 << 15).next_power_of_two();
        let slots = tx_slots.clamp(8, 4096).next_power_of_two();
        let cq = (entries as u32 * 2 + slots as u32 * 2).next_power_of_two();
        let ring = IoUring::builder()
            .setup_cqsize(cq)
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .build(slots as u32)
            .or_else(|_| IoUring::builder().setup_cqsize(cq).build(slots as u32))
            .map_err(|e| io::Error::new(e.kind(), format!("io_uring_setup: {e}")))?;
        let bufs = BufRing::new(entries, slot_len)?;
        // SAFETY: the ring mapping is page aligned, holds `entries` entries, and lives (in
        // place) until the ring is dropped.
        unsafe {
            ring.submitter()
                .register_buf_ring_with_flags(bufs.ring.as_ptr() as u64, entries, BGID, 0)
                .map_err(|e| io::Error::new(e.kind(), format!("io_uring buffer ring: {e}")))?;
        }
        let mut u = UringTap {
            ring,
            bufs,
            tx: MmapMut::map_anon(slots * slot_len)?,
            slot_len,
            free: (0..slots as u32).rev().collect(),
            slots,
            read_armed: false,
            wake: None,
            wake_armed: false,
            unsubmitted: 0,
            stash: VecDeque::new(),
        };
        // The multishot read must be accepted: without it (before Linux 6.7) the kernel
        // fails it at once, and the syscall driver takes over.
        u.arm(fd)?;
        u.submit_and_wait(Some(Duration::from_millis(1)))?;
        let mut refused = None;
        for cqe in u.ring.completion() {
            if cqe.user_data() == TAG_READ && cqe.result() < 0 && !cqueue::more(cqe.flags()) {
                refused = Some(io::Error::from_raw_os_error(-cqe.result()));
            } else {
                if cqe.user_data() == TAG_READ && !cqueue::more(cqe.flags()) {
                    // Ended already (with a frame): nothing for `end_read` to wait for.
                    u.read_armed = false;
                }
                u.stash
                    .push_back((cqe.user_data(), cqe.result(), cqe.flags()));
            }
        }
        if let Some(e) = refused {
            return Err(io::Error::new(
                e.kind(),
                format!("io_uring multishot read on the TAP: {e}"),
            ));
        }
        u.end_read()?;
        Ok(u)
    }

    /// Ends the multishot read, for the device thread's first poll to arm it again. io_uring
    /// runs a multishot request's work (the copy of each frame, on every wake-up of the
    /// TAP) as task work of the thread that submitted it, and this driver is built by the
    /// thread that creates the device: left armed, that thread would do every read, woken
    /// for each. Frames read before the end stay in the stash.
    fn end_read(&mut self) -> io::Result<()> {
        if !self.read_armed {
            return Ok(());
        }
        let timeout = types::Timespec::from(Duration::from_millis(100));
        let _ = self
            .ring
            .submitter()
            .register_sync_cancel(Some(timeout), types::CancelBuilder::user_data(TAG_READ));
        let deadline = std::time::Instant::now() + Duration::from_millis(100);
        while self.read_armed {
            if std::time::Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "io_uring: the TAP's first multishot read did not end when cancelled",
                ));
            }
            self.submit_and_wait(Some(Duration::from_millis(1)))?;
            for cqe in self.ring.completion() {
                let c = (cqe.user_data(), cqe.result(), cqe.flags());
                if c.0 == TAG_READ && !cqueue::more(c.2) {
                    self.read_armed = false;
                    if c.1 < 0 {
                        continue;
                    }
                }
                self.stash.push_back(c);
            }
        }
        Ok(())
    }

    fn push(&mut self, sqe: &io_uring::squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: every SQE points at memory that outlives its request: send slots are
            // held until their completion, the buffer ring until the ring is dropped.
            if unsafe { self.ring.submission().push(sqe).is_ok() } {
                self.unsubmitted += 1;
                return Ok(());
            }
            let before = self.unsubmitted;
            self.submit()?;
            if self.unsubmitted == before {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    "io_uring submission queue full",
                ));
            }
        }
    }

    fn arm(&mut self, fd: RawFd) -> io::Result<()> {
        if let (Some(w), false) = (self.wake, self.wake_armed) {
            let sqe = opcode::PollAdd::new(types::Fd(w), libc::POLLIN as u32)
                .build()
                .user_data(TAG_WAKE);
            self.push(&sqe)?;
            self.wake_armed = true;
        }
        if !self.read_armed {
            let sqe = opcode::ReadMulti::new(types::Fd(fd), 0, BGID)
                .build()
                .user_data(TAG_READ);
            self.push(&sqe)?;
            self.read_armed = true;
        }
        Ok(())
    }

    fn submit(&mut self) -> io::Result<()> {
        if self.unsubmitted == 0 && !self.ring.submission().taskrun() {
            return Ok(());
        }
        match self.ring.submit() {
            Ok(_) => {
                self.unsubmitted = 0;
                Ok(())
            }
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
            Err(e) if e.raw_os_error() == Some(libc::ETIME) => {
                self.unsubmitted = 0;
                Ok(())
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EBUSY)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn send_with(
        &mut self,
        fd: RawFd,
        counters: &mut TapCounters,
        build: impl FnOnce(&mut [u8]) -> usize,
    ) -> io::Result<()> {
        let idx = loop {
            if let Some(i) = self.free.pop() {
                break i;
            }
            // Every slot in flight: wait for a write to finish, keeping what else completes.
            self.submit_and_wait(None)?;
            let mut done = Vec::new();
            for cqe in self.ring.completion() {
                done.push((cqe.user_data(), cqe.result(), cqe.flags()));
            }
            for c in done {
                if c.0 & !0xffff_ffff == TAG_WRITE {
                    self.complete_write(c, counters);
                } else {
                    self.stash.push_back(c);
                }
            }
        };
        let at = idx as usize * self.slot_len;
        let slot = &mut self.tx[at..at + self.slot_len];
        let len = build(slot).min(self.slot_len);
        if len == 0 {
            self.free.push(idx);
            return Ok(());
        }
        // Offset -1: the descriptor's own position (a TAP has none), as write(2).
        let sqe = opcode::Write::new(types::Fd(fd), slot.as_ptr(), len as u32)
            .offset(u64::MAX)
            .build()
            .user_data(TAG_WRITE | u64::from(idx));
        if let Err(e) = self.push(&sqe) {
            self.free.push(idx);
            return Err(e);
        }
        // A full batch leaves at once; otherwise with the next flush or poll.
        if self.unsubmitted >= 32 {
            self.submit()?;
            counters.tx_calls += 1;
        }
        Ok(())
    }

    fn complete_write(&mut self, (ud, res, _): StashedCqe, counters: &mut TapCounters) {
        let idx = (ud & 0xffff_ffff) as u32;
        if (idx as usize) < self.slots {
            self.free.push(idx);
        }
        if res < 0 {
            counters.tx_errors += 1;
            tracing::debug!("TAP write failed: {}", io::Error::from_raw_os_error(-res));
        } else {
            counters.tx_frames += 1;
            counters.tx_bytes += res as u64;
        }
    }

    fn flush(&mut self, counters: &mut TapCounters) -> io::Result<()> {
        if self.unsubmitted > 0 {
            counters.tx_calls += 1;
        }
        self.submit()
    }

    /// Handles one completion; returns 1 if it delivered a frame.
    fn handle(
        &mut self,
        c: StashedCqe,
        counters: &mut TapCounters,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> usize {
        let (ud, res, flags) = c;
        match ud & !0xffff_ffff {
            TAG_WRITE => {
                self.complete_write(c, counters);
                0
            }
            TAG_WAKE => {
                self.wake_armed = false;
                0
            }
            TAG_READ => {
                if !cqueue::more(flags) {
                    self.read_armed = false;
                }
                if res < 0 {
                    match -res {
                        libc::ENOBUFS => counters.rx_no_buffers += 1,
                        libc::ECANCELED => {}
                        _ => counters.rx_errors += 1,
                    }
                    return 0;
                }
                let Some(bid) = cqueue::buffer_select(flags) else {
                    counters.rx_errors += 1;
                    return 0;
                };
                let n = match self.bufs.buffer(bid, res as usize) {
                    Some(frame) => {
                        counters.rx_frames += 1;
                        counters.rx_bytes += frame.len() as u64;
                        on_frame(frame);
                        1
                    }
                    None => {
                        counters.rx_errors += 1;
                        0
                    }
                };
                if bid < self.bufs.entries {
                    self.bufs.push(bid);
                }
                n
            }
            _ => 0,
        }
    }

    fn poll(
        &mut self,
        fd: RawFd,
        timeout: Option<Duration>,
        counters: &mut TapCounters,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize> {
        let mut delivered = 0;
        // The stash first: it may hold the end of a read armed elsewhere (`end_read`).
        while let Some(c) = self.stash.pop_front() {
            delivered += self.handle(c, counters, on_frame);
        }
        self.arm(fd)?;
        if self.unsubmitted > 0 {
            counters.tx_calls += 1;
        }
        let ready = delivered > 0 || !self.ring.completion().is_empty();
        if ready || timeout == Some(Duration::ZERO) {
            self.submit()?;
        } else {
            self.submit_and_wait(timeout)?;
        }
        for _ in 0..4 {
            let batch: Vec<StashedCqe> = self
                .ring
                .completion()
                .map(|c| (c.user_data(), c.result(), c.flags()))
                .collect();
            if batch.is_empty() {
                break;
            }
            for c in batch {
                delivered += self.handle(c, counters, on_frame);
            }
            self.bufs.publish();
        }
        self.bufs.publish();
        self.arm(fd)?;
        self.submit()?;
        Ok(delivered)
    }

    fn shutdown(&mut self, counters: &mut TapCounters) {
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
            let done: Vec<StashedCqe> = self
                .ring
                .completion()
                .map(|c| (c.user_data(), c.result(), c.flags()))
                .collect();
            for c in done {
                if c.0 & !0xffff_ffff == TAG_WRITE {
                    self.complete_write(c, counters);
                }
            }
            if self.free.len() == self.slots {
                break;
            }
        }
    }
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on a descriptor we own.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl < 0 || libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
