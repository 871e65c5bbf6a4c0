//! The fallback driver: `sendmmsg`/`recvmmsg` batches and `poll(2)`, for hosts where io_uring
//! is not available (old kernels, seccomp filters, `kernel.io_uring_disabled`). With a batch of
//! 1 it is also the per-packet baseline of the benchmark.

use super::cmsg::{ControlBuf, SockAddrBuf, CONTROL_LEN, SOCKADDR_LEN};
use super::transport::{NetCounters, RxDatagram, RxState, TxPool};
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::time::Duration;

/// Receive rounds per socket per poll, so that one flooded socket cannot starve the caller.
const MAX_RX_ROUNDS: usize = 16;

/// Bytes kept free in front of each receive buffer: the link rebuilds a packet's IP and UDP
/// headers there (`RxDatagram::with_room`) instead of copying it.
const RX_HEADROOM: usize = 64;

pub(crate) struct SyscallDriver {
    batch: usize,
    rx_buf_len: usize,
    rx_data: Box<[u8]>,
    rx_names: Box<[SockAddrBuf]>,
    rx_control: Box<[ControlBuf]>,
    rx_iov: Box<[libc::iovec]>,
    rx_msgs: Box<[libc::mmsghdr]>,
    tx_pending: Vec<u32>,
    tx_msgs: Box<[libc::mmsghdr]>,
    /// A descriptor whose readability also ends a blocking poll.
    pub wake: Option<RawFd>,
}

fn zeroed_mmsg(n: usize) -> Box<[libc::mmsghdr]> {
    // SAFETY: mmsghdr is plain old data for which all-zero is valid.
    (0..n).map(|_| unsafe { std::mem::zeroed() }).collect()
}

impl SyscallDriver {
    pub fn new(rx_buffers: usize, rx_buf_len: usize, batch: usize) -> SyscallDriver {
        let batch = batch.max(1);
        let rx = rx_buffers.clamp(1, batch);
        SyscallDriver {
            batch,
            rx_buf_len,
            rx_data: vec![0u8; rx * (RX_HEADROOM + rx_buf_len)].into_boxed_slice(),
            rx_names: vec![SockAddrBuf::default(); rx].into_boxed_slice(),
            rx_control: vec![ControlBuf::default(); rx].into_boxed_slice(),
            rx_iov: (0..rx)
                .map(|_| libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                })
                .collect(),
            rx_msgs: zeroed_mmsg(rx),
            tx_pending: Vec::with_capacity(batch),
            tx_msgs: zeroed_mmsg(batch),
            wake: None,
        }
    }

    pub fn queue_send(
        &mut self,
        tx: &mut TxPool,
        idx: u32,
        fds: [Option<RawFd>; 2],
        counters: &mut NetCounters,
    ) {
        self.tx_pending.push(idx);
        if self.tx_pending.len() >= self.batch {
            self.flush(tx, fds, counters);
        }
    }

    /// Sends every queued datagram, in order, one `sendmmsg` per run of the same socket.
    pub fn flush(&mut self, tx: &mut TxPool, fds: [Option<RawFd>; 2], counters: &mut NetCounters) {
        let mut start = 0;
        while start < self.tx_pending.len() {
            let sock = tx.slots[self.tx_pending[start] as usize].sock;
            let mut end = start;
            while end < self.tx_pending.len()
                && end - start < self.tx_msgs.len()
                && tx.slots[self.tx_pending[end] as usize].sock == sock
            {
                let slot = &tx.slots[self.tx_pending[end] as usize];
                self.tx_msgs[end - start].msg_hdr = slot.msg;
                self.tx_msgs[end - start].msg_len = 0;
                end += 1;
            }
            let run = &self.tx_pending[start..end];
            let mut done = 0;
            while done < run.len() {
                let sent = match fds[sock] {
                    // SAFETY: tx_msgs[done..run.len()] hold msghdrs pointing into send slots
                    // that stay allocated and untouched during the call.
                    Some(fd) => unsafe {
                        libc::sendmmsg(
                            fd,
                            self.tx_msgs[done..].as_mut_ptr(),
                            (run.len() - done) as libc::c_uint,
                            0,
                        )
                    },
                    None => -1,
                };
                if sent < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                if sent <= 0 {
                    // The first datagram failed: count it and go on with the rest.
                    counters.tx_errors += tx.slots[run[done] as usize].segments as u64;
                    done += 1;
                } else {
                    for &idx in &run[done..done + sent as usize] {
                        let s = &tx.slots[idx as usize];
                        counters.tx_packets += s.segments as u64;
                        counters.tx_bytes += s.len as u64;
                    }
                    done += sent as usize;
                }
            }
            tx.free.extend_from_slice(run);
            start = end;
        }
        self.tx_pending.clear();
    }

    /// One `recvmmsg` on `fd`; returns datagrams read (0 when none were waiting).
    fn recv_round(
        &mut self,
        fd: RawFd,
        local: SocketAddr,
        rx: &mut RxState,
        on_rx: &mut dyn FnMut(&mut RxDatagram<'_>),
        delivered: &mut usize,
    ) -> io::Result<usize> {
        let n = self.rx_msgs.len();
        for i in 0..n {
            let at = i * (RX_HEADROOM + self.rx_buf_len) + RX_HEADROOM;
            self.rx_iov[i].iov_base = self.rx_data[at..].as_mut_ptr().cast();
            self.rx_iov[i].iov_len = self.rx_buf_len;
            let h = &mut self.rx_msgs[i].msg_hdr;
            h.msg_name = self.rx_names[i].0.as_mut_ptr().cast();
            h.msg_namelen = SOCKADDR_LEN as libc::socklen_t;
            h.msg_iov = &mut self.rx_iov[i];
            h.msg_iovlen = 1;
            h.msg_control = self.rx_control[i].0.as_mut_ptr().cast();
            h.msg_controllen = CONTROL_LEN as _;
            h.msg_flags = 0;
            self.rx_msgs[i].msg_len = 0;
        }
        // SAFETY: every msghdr points at buffers of the lengths it declares, owned by self.
        let got = unsafe {
            libc::recvmmsg(
                fd,
                self.rx_msgs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if got < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(0),
                _ => {
                    rx.counters.rx_errors += 1;
                    Err(e)
                }
            };
        }
        for i in 0..got as usize {
            let m = &self.rx_msgs[i];
            let len = (m.msg_len as usize).min(self.rx_buf_len);
            let name_len = (m.msg_hdr.msg_namelen as usize).min(SOCKADDR_LEN);
            // msg_controllen is size_t on glibc but u32 on musl.
            #[allow(clippy::unnecessary_cast)]
            let control_len = (m.msg_hdr.msg_controllen as usize).min(CONTROL_LEN);
            let truncated = m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            let Some(head) = rx.head(
                local,
                &self.rx_names[i].0[..name_len],
                &self.rx_control[i].0[..control_len],
                len,
                truncated,
            ) else {
                continue;
            };
            let start = i * (RX_HEADROOM + self.rx_buf_len);
            let buf = &mut self.rx_data[start..start + RX_HEADROOM + len];
            *delivered += rx.deliver(head, buf, RX_HEADROOM, on_rx);
        }
        Ok(got as usize)
    }

    fn recv_all(
        &mut self,
        rx: &mut RxState,
        locals: [Option<SocketAddr>; 2],
        fds: [Option<RawFd>; 2],
        on_rx: &mut dyn FnMut(&mut RxDatagram<'_>),
    ) -> io::Result<(usize, usize)> {
        let (mut read, mut delivered) = (0, 0);
        for i in 0..2 {
            let (Some(fd), Some(local)) = (fds[i], locals[i]) else {
                continue;
            };
            for _ in 0..MAX_RX_ROUNDS {
                let got = self.recv_round(fd, local, rx, on_rx, &mut delivered)?;
                read += got;
                if got < self.rx_msgs.len() {
                    break;
                }
            }
        }
        Ok((read, delivered))
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
        self.flush(tx, fds, &mut rx.counters);
        let (read, mut delivered) = self.recv_all(rx, locals, fds, on_rx)?;
        if read > 0 || timeout == Some(Duration::ZERO) {
            return Ok(delivered);
        }
        let mut pfds = [libc::pollfd {
            fd: -1,
            events: libc::POLLIN,
            revents: 0,
        }; 3];
        for (p, fd) in pfds.iter_mut().zip(fds) {
            p.fd = fd.unwrap_or(-1);
        }
        pfds[2].fd = self.wake.unwrap_or(-1);
        let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as libc::c_int);
        // SAFETY: pfds is a valid array of 3 pollfds; negative fds are ignored by poll(2).
        let r = unsafe { libc::poll(pfds.as_mut_ptr(), 3, ms) };
        if r > 0 {
            delivered += self.recv_all(rx, locals, fds, on_rx)?.1;
        }
        Ok(delivered)
    }
}
