//! One stream (SOCK_STREAM, RC) rsocket: librdmacm's protocol over the shim's own rdma_cm
//! and verbs functions. Each side exposes a receive buffer (`rbuf`) its peer RDMA-WRITEs
//! into, half of it at a time, and a two-entry target SGL where the peer announces those
//! halves; every data transfer is an RDMA WRITE WITH IMMEDIATE (`RS_OP_DATA | length`) that
//! consumes one receive WR, and receive credits come back as `RS_OP_SGL | (rseq_no +
//! rq_size)`, with the next free half of `rbuf` written into the sender's target SGL when
//! one is free (`rs_send_credits`).

mod iomap;

use std::collections::VecDeque;
use std::ptr;

use libc::{c_int, c_void};

use super::wire::{self, ConnData, RsSge};
use crate::abi::consts::{IBV_QPT_RC, IBV_SEND_INLINE, IBV_WR_RDMA_WRITE_WITH_IMM};
use crate::abi::{IbvCq, IbvMr, IbvQpInitAttr, IbvRecvWr, IbvSendWr, IbvSge, IbvWc};
use crate::ffi::Errno;
use crate::rdmacm::abi::{RdmaCmId, RdmaConnParam, RDMA_PS_TCP};
use crate::rdmacm::{exports, qp as cmqp, state as cmstate};
use crate::verbs;

pub const RS_OLAP_START_SIZE: u32 = 2048;
pub const RS_MAX_TRANSFER: u32 = 65536;
pub const RS_SNDLOWAT: u32 = 2048;
pub const RS_QP_MIN_SIZE: u16 = 16;
pub const RS_QP_MAX_SIZE: u16 = 0xFFFE;
/// Control messages in flight at most (`RS_QP_CTRL_SIZE`).
pub const RS_QP_CTRL_SIZE: u32 = 4;
const RS_MAX_CTRL_MSG: usize = wire::SGE_LEN;
/// librdmacm's defaults (`def_inline`, `def_sqsize`, `def_rqsize`, `def_mem`, `def_wmem`).
pub const DEF_INLINE: u16 = 64;
pub const DEF_SQSIZE: u16 = 384;
pub const DEF_RQSIZE: u16 = 384;
pub const DEF_MEM: u32 = 1 << 17;
pub const DEF_WMEM: u32 = 1 << 17;

/// `RDMA_IOMAPSIZE` as an rsocket keeps it: rounded to what the connection data's byte can
/// carry (`rs_scale_to_value(rs_value_to_scale(v, 8), 8)`).
pub fn iomap_size(v: c_int) -> u16 {
    let v = v.clamp(0, i32::from(u16::MAX)) as u32;
    iomap::scale_to_value(iomap::value_to_scale(v, 8) & 0xff, 8).min(u32::from(u16::MAX)) as u16
}

const WR_ID_FLAG_RECV: u64 = 1 << 63;
const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
const IBV_ACCESS_REMOTE_WRITE: c_int = 2;
const IBV_WC_SUCCESS: c_int = 0;
const IBV_WC_WITH_IMM: u32 = 1 << 1;

/// librdmacm's `enum rs_state` bits (ordered: passive, connecting, connected, closed).
pub mod st {
    pub const INIT: u32 = 0;
    pub const BOUND: u32 = 0x0001;
    pub const LISTENING: u32 = 0x0002;
    pub const OPENING: u32 = 0x0004;
    pub const CONNECTED: u32 = 0x0100;
    pub const WRITABLE: u32 = 0x0200;
    pub const READABLE: u32 = 0x0400;
    pub const CONNECT_RDWR: u32 = CONNECTED | READABLE | WRITABLE;
    pub const CONNECT_ERROR: u32 = 0x0800;
    pub const DISCONNECTED: u32 = 0x1000;
    pub const ERROR: u32 = 0x2000;
}

/// A registered, heap-allocated buffer whose address never moves.
struct Region {
    buf: Box<[u64]>,
    mr: *mut IbvMr,
}

impl Region {
    fn new(len: usize, pd: *mut crate::abi::IbvPd, access: c_int) -> Result<Region, Errno> {
        let buf = vec![0u64; len.div_ceil(8).max(1)].into_boxed_slice();
        let mut r = Region {
            buf,
            mr: ptr::null_mut(),
        };
        // SAFETY: the buffer lives as long as the region, which deregisters it on drop.
        let mr = unsafe { verbs::pd::ibv_reg_mr(pd, r.ptr().cast(), len, access) };
        if mr.is_null() {
            return Err(Errno::last());
        }
        r.mr = mr;
        Ok(r)
    }

    fn ptr(&mut self) -> *mut u8 {
        self.buf.as_mut_ptr().cast()
    }

    /// Its length in bytes (what was asked for, rounded up to 8).
    fn len(&self) -> usize {
        self.buf.len() * 8
    }

    fn lkey(&self) -> u32 {
        // SAFETY: mr is live while the region is.
        unsafe { (*self.mr).lkey }
    }

    fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr).rkey }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if !self.mr.is_null() {
            // SAFETY: our registration.
            unsafe { verbs::pd::ibv_dereg_mr(self.mr) };
        }
    }
}

/// The socket options rcopy/rstream set: accepted and stored.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    pub reuseaddr: c_int,
    pub keepalive: c_int,
    pub nodelay: c_int,
    /// `struct linger` as (l_onoff, l_linger).
    pub linger: (c_int, c_int),
    pub oobinline: c_int,
}

pub struct Stream {
    pub id: *mut RdmaCmId,
    pub state: u32,
    pub fd_flags: c_int,
    pub err: c_int,
    pub opts: Options,

    pub sbuf_size: u32,
    pub rbuf_size: u32,
    pub sq_size: u16,
    pub rq_size: u16,
    pub sq_inline: u16,

    swap_sgl: bool,
    sbuf: Option<Region>,
    rbuf: Option<Region>,
    target: Option<Region>,

    ctrl_seqno: u32,
    ctrl_max_seqno: u32,
    sseq_no: u16,
    sseq_comp: u16,
    rseq_no: u16,
    rseq_comp: u16,
    remote_sge: u32,
    remote_sgl: RsSge,
    target_sge: usize,

    rbuf_bytes_avail: u32,
    rbuf_free_offset: u32,
    rbuf_offset: u32,
    sbuf_bytes_avail: u32,
    /// Offset in `sbuf` of the next copy (`ssgl[0].addr`).
    ssgl_off: u32,
    sqe_avail: i32,
    /// Lengths of received data messages not yet consumed (`rmsg`).
    rmsg: VecDeque<u32>,
    cq_armed: bool,
    unack_cqe: u32,

    /// Slots of our iomap table (`RDMA_IOMAPSIZE`), which the peer writes.
    pub target_iomap_size: u16,
    /// The peer's table: its address, rkey, and slot count as length.
    remote_iomap: RsSge,
    /// The buffers this side mapped ([`iomap`]).
    iomaps: Vec<iomap::IoMapping>,
}

// SAFETY: the raw pointers are shim objects usable from any thread; every Stream sits behind
// a Mutex in the socket table.
unsafe impl Send for Stream {}

impl Drop for Stream {
    fn drop(&mut self) {
        self.free();
    }
}

impl Stream {
    /// `rsocket(domain, SOCK_STREAM, 0)`: a synchronous id (private channel).
    pub fn open(domain: c_int) -> Result<Stream, Errno> {
        let mut id: *mut RdmaCmId = ptr::null_mut();
        // SAFETY: out pointer valid.
        let r = unsafe {
            exports::rdma_create_id(ptr::null_mut(), &mut id, ptr::null_mut(), RDMA_PS_TCP)
        };
        if r != 0 || id.is_null() {
            return Err(Errno::last());
        }
        // SAFETY: live id; librdmacm records the family so a later resolve uses it.
        unsafe { (*id).route.addr.src_addr.ss_family = domain as libc::sa_family_t };
        Ok(Stream::with_id(id, None))
    }

    fn with_id(id: *mut RdmaCmId, parent: Option<&Stream>) -> Stream {
        let (sbuf_size, rbuf_size, sq_size, rq_size, sq_inline, target_iomap_size) = match parent {
            Some(p) => (
                p.sbuf_size,
                p.rbuf_size,
                p.sq_size,
                p.rq_size,
                p.sq_inline,
                p.target_iomap_size,
            ),
            None => (DEF_WMEM, DEF_MEM, DEF_SQSIZE, DEF_RQSIZE, DEF_INLINE, 0),
        };
        Stream {
            id,
            state: st::INIT,
            fd_flags: 0,
            err: 0,
            opts: Options::default(),
            sbuf_size,
            rbuf_size,
            sq_size,
            rq_size,
            sq_inline,
            swap_sgl: false,
            sbuf: None,
            rbuf: None,
            target: None,
            ctrl_seqno: 0,
            ctrl_max_seqno: RS_QP_CTRL_SIZE,
            sseq_no: 0,
            sseq_comp: 0,
            rseq_no: 0,
            rseq_comp: 0,
            remote_sge: 0,
            remote_sgl: RsSge::default(),
            target_sge: 0,
            rbuf_bytes_avail: 0,
            rbuf_free_offset: 0,
            rbuf_offset: 0,
            sbuf_bytes_avail: 0,
            ssgl_off: 0,
            sqe_avail: 0,
            rmsg: VecDeque::new(),
            cq_armed: false,
            unack_cqe: 0,
            target_iomap_size,
            remote_iomap: RsSge::default(),
            iomaps: Vec::new(),
        }
    }

    /// The index librdmacm hands out: the id's event channel descriptor.
    pub fn channel_fd(&self) -> c_int {
        // SAFETY: live id with its private channel.
        unsafe {
            let ch = (*self.id).channel;
            if ch.is_null() {
                -1
            } else {
                (*ch).fd
            }
        }
    }

    pub fn cq_channel_fd(&self) -> c_int {
        // SAFETY: live id.
        unsafe {
            let ch = (*self.id).recv_cq_channel;
            if ch.is_null() {
                -1
            } else {
                (*ch).fd
            }
        }
    }

    fn free(&mut self) {
        if self.id.is_null() {
            return;
        }
        let id = self.id;
        self.free_iomaps();
        self.sbuf = None;
        self.rbuf = None;
        self.target = None;
        // SAFETY: our live id; the send and receive CQ/channel are one object each, so the
        // send fields are cleared before the id's QP and CQs are destroyed once.
        unsafe {
            if !(*id).recv_cq.is_null() && self.unack_cqe > 0 {
                verbs::cq::ibv_ack_cq_events((*id).recv_cq, self.unack_cqe);
            }
            (*id).send_cq = ptr::null_mut();
            (*id).send_cq_channel = ptr::null_mut();
            if let Ok(s) = cmstate::id_from_ptr(id) {
                cmqp::destroy_qp(s);
            }
            exports::rdma_destroy_id(id);
        }
        self.id = ptr::null_mut();
    }

    pub fn bind(&mut self, addr: *const libc::sockaddr) -> Result<(), Errno> {
        // SAFETY: caller's address (checked non-null by the export).
        let r = unsafe { exports::rdma_bind_addr(self.id, addr as *mut _) };
        if r != 0 {
            return Err(Errno::last());
        }
        self.state = st::BOUND;
        Ok(())
    }

    pub fn listen(&mut self, backlog: c_int) -> Result<(), Errno> {
        if self.state != st::LISTENING {
            // SAFETY: live id.
            if unsafe { exports::rdma_listen(self.id, backlog) } != 0 {
                return Err(Errno::last());
            }
            self.state = st::LISTENING;
        }
        Ok(())
    }

    fn set_qp_size(&mut self) {
        let clamp = |v: u16| v.clamp(RS_QP_MIN_SIZE, RS_QP_MAX_SIZE);
        self.sq_size = clamp(self.sq_size);
        self.rq_size = clamp(self.rq_size);
    }

    /// `rs_create_ep`: one CQ (and completion channel) for both directions, the RC QP,
    /// the buffers, and `rq_size` zero-length receives (RDMA WRITE WITH IMM consumes one).
    fn create_ep(&mut self) -> Result<(), Errno> {
        self.set_qp_size();
        let id = self.id;
        // SAFETY: live id, bound/resolved so `verbs` is set.
        let verbs_ctx = unsafe { (*id).verbs };
        if verbs_ctx.is_null() {
            return Err(Errno(libc::ENODEV));
        }
        // SAFETY: the id's shared context.
        let ch = unsafe { verbs::events::ibv_create_comp_channel(verbs_ctx) };
        if ch.is_null() {
            return Err(Errno::last());
        }
        let cqe = c_int::from(self.sq_size) + c_int::from(self.rq_size);
        // SAFETY: as above; the channel was just created.
        let cq = unsafe { verbs::cq::ibv_create_cq(verbs_ctx, cqe, id.cast(), ch, 0) };
        if cq.is_null() {
            let e = Errno::last();
            // SAFETY: ours, unused.
            unsafe { verbs::events::ibv_destroy_comp_channel(ch) };
            return Err(e);
        }
        if self.fd_flags & libc::O_NONBLOCK != 0 {
            // SAFETY: the channel's fd.
            unsafe { libc::fcntl((*ch).fd, libc::F_SETFL, libc::O_NONBLOCK) };
        }
        // SAFETY: live id; from here the id owns the CQ (destroyed with its QP).
        unsafe {
            (*id).recv_cq_channel = ch;
            (*id).recv_cq = cq;
            (*id).send_cq_channel = ch;
            (*id).send_cq = cq;
            verbs::cq::req_notify_cq(cq, 0);
        }
        let mut attr = IbvQpInitAttr {
            qp_context: ptr::null_mut(),
            send_cq: cq,
            recv_cq: cq,
            srq: ptr::null_mut(),
            cap: crate::abi::IbvQpCap {
                max_send_wr: u32::from(self.sq_size),
                max_recv_wr: u32::from(self.rq_size),
                max_send_sge: 2,
                max_recv_sge: 1,
                max_inline_data: u32::from(self.sq_inline),
            },
            qp_type: IBV_QPT_RC,
            sq_sig_all: 1,
        };
        let shim_id = cmstate::id_from_ptr(id)?;
        cmqp::create_qp(shim_id, ptr::null_mut(), &mut attr)?;
        self.sq_inline = attr.cap.max_inline_data.min(u32::from(u16::MAX)) as u16;
        // SAFETY: live id with its QP.
        let pd = unsafe { (*(*id).qp).pd };
        self.init_bufs(pd)?;
        for _ in 0..self.rq_size {
            self.post_recv()?;
        }
        Ok(())
    }

    /// `rs_init_bufs`.
    fn init_bufs(&mut self, pd: *mut crate::abi::IbvPd) -> Result<(), Errno> {
        let mut total_sbuf = self.sbuf_size as usize;
        if usize::from(self.sq_inline) < RS_MAX_CTRL_MSG {
            total_sbuf += RS_MAX_CTRL_MSG * RS_QP_CTRL_SIZE as usize;
        }
        self.sbuf = Some(Region::new(total_sbuf, pd, IBV_ACCESS_LOCAL_WRITE)?);
        self.target = Some(Region::new(
            wire::SGE_LEN * wire::RS_SGL_SIZE
                + iomap::IOMAP_LEN * usize::from(self.target_iomap_size),
            pd,
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
        )?);
        self.rbuf = Some(Region::new(
            self.rbuf_size as usize,
            pd,
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
        )?);
        self.ssgl_off = 0;
        self.sbuf_bytes_avail = self.sbuf_size;
        self.rbuf_free_offset = self.rbuf_size >> 1;
        self.rbuf_bytes_avail = self.rbuf_size >> 1;
        self.sqe_avail = i32::from(self.sq_size) - self.ctrl_max_seqno as i32;
        self.rseq_comp = self.rq_size >> 1;
        Ok(())
    }

    /// Entry `i` of our target SGL (the peer RDMA-writes it: read volatile).
    fn target_sgl(&mut self, i: usize) -> RsSge {
        let Some(t) = self.target.as_mut() else {
            return RsSge::default();
        };
        let p = t.ptr().wrapping_add(i * wire::SGE_LEN);
        // SAFETY: inside the 32-byte target region; u64-aligned (boxed u64 slice).
        unsafe {
            RsSge {
                addr: ptr::read_volatile(p.cast::<u64>()),
                key: ptr::read_volatile(p.add(8).cast::<u32>()),
                length: ptr::read_volatile(p.add(12).cast::<u32>()),
            }
        }
    }

    fn set_target_sgl(&mut self, i: usize, s: RsSge) {
        let Some(t) = self.target.as_mut() else {
            return;
        };
        let p = t.ptr().wrapping_add(i * wire::SGE_LEN);
        // SAFETY: as in target_sgl.
        unsafe {
            ptr::write_volatile(p.cast::<u64>(), s.addr);
            ptr::write_volatile(p.add(8).cast::<u32>(), s.key);
            ptr::write_volatile(p.add(12).cast::<u32>(), s.length);
        }
    }

    /// `rs_format_conn_data`.
    fn conn_data(&mut self) -> ConnData {
        let (t_addr, t_key) = match self.target.as_mut() {
            Some(t) => (t.ptr() as u64, t.rkey()),
            None => (0, 0),
        };
        let (r_addr, r_key) = match self.rbuf.as_mut() {
            Some(r) => (r.ptr() as u64, r.rkey()),
            None => (0, 0),
        };
        ConnData {
            version: wire::RS_CONN_VERSION,
            flags: ConnData::host_flags(),
            credits: self.rq_size,
            target_iomap_size: iomap::value_to_scale(u32::from(self.target_iomap_size), 8) as u8,
            target_sgl: RsSge {
                addr: t_addr,
                key: t_key,
                length: wire::RS_SGL_SIZE as u32,
            },
            data_buf: RsSge {
                addr: r_addr,
                key: r_key,
                length: self.rbuf_size >> 1,
            },
        }
    }

    /// `rs_save_conn_data`.
    fn save_conn_data(&mut self, c: &ConnData) {
        self.remote_sgl = c.target_sgl;
        self.remote_sge = 1;
        self.swap_sgl = c.peer_needs_swap();
        if c.flags & wire::RS_CONN_FLAG_IOMAP != 0 {
            // The peer's iomap table follows its target SGL.
            self.remote_iomap = RsSge {
                addr: c
                    .target_sgl
                    .addr
                    .wrapping_add(wire::SGE_LEN as u64 * u64::from(c.target_sgl.length)),
                key: c.target_sgl.key,
                length: iomap::scale_to_value(u32::from(c.target_iomap_size), 8),
            };
        }
        self.set_target_sgl(0, c.data_buf);
        self.sseq_comp = c.credits;
    }

    /// The event private data of the id's held event (REQ or REP), as rsocket conn data.
    fn event_conn_data(id: *mut RdmaCmId) -> Result<ConnData, Errno> {
        // SAFETY: live id; the held event lives until the id's next operation.
        unsafe {
            let ev = (*id).event;
            if ev.is_null() {
                return Err(Errno::PROTO);
            }
            let c = (*ev).param.conn;
            if c.private_data.is_null() {
                return Err(Errno(libc::ENOTSUP));
            }
            let b = std::slice::from_raw_parts(
                c.private_data.cast::<u8>(),
                usize::from(c.private_data_len),
            );
            ConnData::parse(b).map_err(|_| Errno(libc::ENOTSUP))
        }
    }

    /// `rconnect` (always completes before returning, also on a non-blocking socket).
    pub fn connect(&mut self, addr: *const libc::sockaddr, len: usize) -> Result<(), Errno> {
        if self.state & st::CONNECTED != 0 {
            return Err(Errno(libc::EISCONN));
        }
        if self.state != st::INIT && self.state != st::BOUND {
            return Err(Errno::INVAL);
        }
        // The connection is made synchronously even on a non-blocking socket (a connect
        // that completes at once is valid non-blocking behaviour): the id's private CM
        // channel blocks for the duration.
        let ch = self.channel_fd();
        // SAFETY: our channel descriptor.
        let fl = unsafe { libc::fcntl(ch, libc::F_GETFL) };
        if fl >= 0 && fl & libc::O_NONBLOCK != 0 {
            // SAFETY: as above.
            unsafe { libc::fcntl(ch, libc::F_SETFL, fl & !libc::O_NONBLOCK) };
        }
        let r = self.do_connect(addr, len);
        if fl >= 0 && fl & libc::O_NONBLOCK != 0 && self.state & st::CONNECTED == 0 {
            // SAFETY: as above.
            unsafe { libc::fcntl(ch, libc::F_SETFL, fl) };
        }
        if let Err(e) = r {
            self.state = st::CONNECT_ERROR;
            self.err = e.0;
        }
        r
    }

    fn do_connect(&mut self, addr: *const libc::sockaddr, len: usize) -> Result<(), Errno> {
        let id = self.id;
        let n = len.min(std::mem::size_of::<libc::sockaddr_storage>());
        // SAFETY: caller's `len` bytes; the id's storage is large enough for `n`.
        unsafe {
            let dst = ptr::addr_of_mut!((*id).route.addr.dst_addr).cast::<u8>();
            ptr::copy_nonoverlapping(addr.cast::<u8>(), dst, n);
            if exports::rdma_resolve_addr(id, ptr::null_mut(), dst.cast(), 2000) != 0 {
                return Err(Errno::last());
            }
            if exports::rdma_resolve_route(id, 2000) != 0 {
                return Err(Errno::last());
            }
        }
        self.create_ep()?;
        let cd = self.conn_data().emit();
        let mut param = RdmaConnParam {
            private_data: cd.as_ptr().cast(),
            private_data_len: wire::CONN_DATA_LEN as u8,
            responder_resources: 0,
            initiator_depth: 0,
            flow_control: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: 0,
            qp_num: 0,
        };
        // SAFETY: live id; param and its private data outlive the call.
        if unsafe { exports::rdma_connect(id, &mut param) } != 0 {
            return Err(Errno::last());
        }
        let resp = Self::event_conn_data(id)?;
        self.save_conn_data(&resp);
        self.state = st::CONNECT_RDWR;
        Ok(())
    }

    /// `raccept`: the next request of this listener as a new connected stream.
    pub fn accept(&mut self) -> Result<Stream, Errno> {
        let mut child: *mut RdmaCmId = ptr::null_mut();
        // SAFETY: live listening id; out pointer valid.
        if unsafe { crate::rdmacm::ep::rdma_get_request(self.id, &mut child) } != 0 {
            return Err(Errno::last());
        }
        let mut s = Stream::with_id(child, Some(self));
        let creq = Self::event_conn_data(child)?;
        // SAFETY: the held request event of the child.
        let mut param = unsafe { (*(*child).event).param.conn };
        s.create_ep()?;
        s.save_conn_data(&creq);
        let cd = s.conn_data().emit();
        param.private_data = cd.as_ptr().cast();
        param.private_data_len = wire::CONN_DATA_LEN as u8;
        // SAFETY: live child id; param outlives the call.
        if unsafe { exports::rdma_accept(child, &mut param) } != 0 {
            return Err(Errno::last());
        }
        s.state = st::CONNECT_RDWR;
        Ok(s)
    }

    fn qp(&self) -> *mut crate::abi::IbvQp {
        // SAFETY: live id.
        unsafe { (*self.id).qp }
    }

    fn cq(&self) -> *mut IbvCq {
        // SAFETY: live id.
        unsafe { (*self.id).recv_cq }
    }

    fn post_recv(&mut self) -> Result<(), Errno> {
        let mut wr = IbvRecvWr {
            wr_id: WR_ID_FLAG_RECV,
            next: ptr::null_mut(),
            sg_list: ptr::null_mut(),
            num_sge: 0,
        };
        let mut bad: *mut IbvRecvWr = ptr::null_mut();
        // SAFETY: our QP; wr valid for the call.
        let r = unsafe { verbs::qp::post_recv(self.qp(), &mut wr, &mut bad) };
        if r != 0 {
            return Err(Errno(r));
        }
        Ok(())
    }

    /// One RDMA WRITE WITH IMMEDIATE `msg` (zero-length when `sges` is empty).
    fn post_write(
        &mut self,
        sges: &mut [IbvSge],
        msg: u32,
        inline: bool,
        addr: u64,
        rkey: u32,
    ) -> Result<(), Errno> {
        self.post(IBV_WR_RDMA_WRITE_WITH_IMM, sges, msg, inline, addr, rkey)
    }

    /// One RDMA WRITE (`opcode`: with immediate `msg`, or without, as `riowrite`'s, whose
    /// peer sees only the bytes); `msg` names it to its completion either way.
    fn post(
        &mut self,
        opcode: c_int,
        sges: &mut [IbvSge],
        msg: u32,
        inline: bool,
        addr: u64,
        rkey: u32,
    ) -> Result<(), Errno> {
        // SAFETY: an all-zero ibv_send_wr is valid (NULL pointers, zero scalars).
        let mut wr: IbvSendWr = unsafe { std::mem::zeroed() };
        wr.wr_id = u64::from(msg);
        wr.sg_list = if sges.is_empty() {
            ptr::null_mut()
        } else {
            sges.as_mut_ptr()
        };
        wr.num_sge = sges.len() as c_int;
        wr.opcode = opcode;
        wr.send_flags = if inline { IBV_SEND_INLINE } else { 0 };
        if opcode == IBV_WR_RDMA_WRITE_WITH_IMM {
            wr.imm_data = msg.to_be();
        }
        wr.wr.rdma = crate::abi::IbvSendWrRdma {
            remote_addr: addr,
            rkey,
        };
        let mut bad: *mut IbvSendWr = ptr::null_mut();
        // SAFETY: our QP; wr and its SGEs valid for the call (inline data copied at post).
        let r = unsafe { verbs::qp::post_send(self.qp(), &mut wr, &mut bad) };
        if r != 0 {
            return Err(Errno(r));
        }
        Ok(())
    }

    /// `rs_post_msg`: a zero-length RDMA WRITE WITH IMM carrying only `msg`.
    fn post_msg(&mut self, msg: u32) -> Result<(), Errno> {
        self.post_write(&mut [], msg, false, 0, 0)
    }

    /// `rs_write_data`.
    fn write_data(&mut self, sges: &mut [IbvSge], length: u32, inline: bool) -> Result<(), Errno> {
        self.sseq_no = self.sseq_no.wrapping_add(1);
        self.sqe_avail -= 1;
        self.sbuf_bytes_avail -= length;
        let t = self.target_sgl(self.target_sge);
        let (addr, rkey) = (t.addr, t.key);
        let t = consume_target(t, length);
        let i = self.target_sge;
        self.set_target_sgl(i, t);
        if t.length == 0 {
            self.target_sge = (self.target_sge + 1) % wire::RS_SGL_SIZE;
        }
        self.post_write(
            sges,
            wire::msg_set(wire::RS_OP_DATA, length),
            inline,
            addr,
            rkey,
        )
    }

    /// `rs_send_credits`.
    fn send_credits(&mut self) {
        self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
        self.rseq_comp = self.rseq_no.wrapping_add(self.rq_size >> 1);
        let credits = u32::from(self.rseq_no.wrapping_add(self.rq_size));
        let msg = wire::msg_set(wire::RS_OP_SGL, credits);
        if self.rbuf_bytes_avail >= (self.rbuf_size >> 1) {
            let (base, rkey) = match self.rbuf.as_mut() {
                Some(r) => (r.ptr() as u64, r.rkey()),
                None => return,
            };
            let sge = RsSge {
                addr: base + u64::from(self.rbuf_free_offset),
                key: rkey,
                length: self.rbuf_size >> 1,
            };
            let bytes = sge.to_host_bytes(self.swap_sgl);
            // The peer's SGL address comes from its connect private data: any value, so
            // wrap (a bad address is the peer's remote access error) rather than overflow.
            let remote = self
                .remote_sgl
                .addr
                .wrapping_add(u64::from(self.remote_sge).wrapping_mul(wire::SGE_LEN as u64));
            let rkey_remote = self.remote_sgl.key;
            let r = if usize::from(self.sq_inline) >= wire::SGE_LEN {
                let mut s = [IbvSge {
                    addr: bytes.as_ptr() as u64,
                    length: wire::SGE_LEN as u32,
                    lkey: 0,
                }];
                self.post_write(&mut s, msg, true, remote, rkey_remote)
            } else {
                let slot = (self.ctrl_seqno & (RS_QP_CTRL_SIZE - 1)) as usize;
                let off = self.sbuf_size as usize + RS_MAX_CTRL_MSG * slot;
                let Some(sb) = self.sbuf.as_mut() else { return };
                let p = sb.ptr().wrapping_add(off);
                // SAFETY: the control area after sbuf_size (allocated when inline is small).
                unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), p, wire::SGE_LEN) };
                let mut s = [IbvSge {
                    addr: p as u64,
                    length: wire::SGE_LEN as u32,
                    lkey: sb.lkey(),
                }];
                self.post_write(&mut s, msg, false, remote, rkey_remote)
            };
            if r.is_err() {
                self.state = st::ERROR;
                self.err = libc::EIO;
            }
            self.rbuf_bytes_avail -= self.rbuf_size >> 1;
            self.rbuf_free_offset += self.rbuf_size >> 1;
            if self.rbuf_free_offset >= self.rbuf_size {
                self.rbuf_free_offset = 0;
            }
            self.remote_sge += 1;
            if self.remote_sge >= self.remote_sgl.length {
                self.remote_sge = 0;
            }
        } else if self.post_msg(msg).is_err() {
            self.state = st::ERROR;
            self.err = libc::EIO;
        }
    }

    fn ctrl_avail(&self) -> bool {
        self.ctrl_seqno != self.ctrl_max_seqno
    }

    fn give_credits(&self) -> bool {
        (self.rbuf_bytes_avail >= (self.rbuf_size >> 1)
            || (self.rseq_no.wrapping_sub(self.rseq_comp) as i16) >= 0)
            && self.ctrl_avail()
            && self.state & st::CONNECTED != 0
    }

    fn update_credits(&mut self) {
        if self.give_credits() {
            self.send_credits();
        }
    }

    /// `rs_poll_cq`: every completion, then the consumed receives reposted.
    fn poll_cq(&mut self) -> Result<(), Errno> {
        let mut rcnt = 0u32;
        let cq = self.cq();
        loop {
            let mut wc = IbvWc::default();
            // SAFETY: our CQ; one wc slot.
            let n = unsafe { verbs::cq::poll_cq(cq, 1, &mut wc) };
            if n <= 0 {
                break;
            }
            if wc.wr_id & WR_ID_FLAG_RECV != 0 {
                if wc.status != IBV_WC_SUCCESS {
                    continue;
                }
                rcnt += 1;
                if wc.wc_flags & IBV_WC_WITH_IMM == 0 {
                    continue;
                }
                let msg = u32::from_be(wc.imm_data);
                match wire::msg_op(msg) {
                    wire::RS_OP_SGL => self.sseq_comp = wire::msg_data(msg) as u16,
                    wire::RS_OP_IOMAP_SGL | wire::RS_OP_WRITE => {}
                    wire::RS_OP_CTRL => match wire::msg_data(msg) {
                        wire::RS_CTRL_DISCONNECT => {
                            self.state = st::DISCONNECTED;
                            return Ok(());
                        }
                        wire::RS_CTRL_SHUTDOWN => {
                            if self.state & st::WRITABLE != 0 {
                                self.state &= !st::READABLE;
                            } else {
                                self.state = st::DISCONNECTED;
                                return Ok(());
                            }
                        }
                        _ => {}
                    },
                    _ => {
                        let len = wire::msg_data(msg);
                        if len > self.rbuf_size {
                            // More than our ring holds: not an rsocket peer. Never copy
                            // beyond the ring for it.
                            self.state = st::ERROR;
                            self.err = libc::EPROTO;
                            return Err(Errno::PROTO);
                        }
                        self.rmsg.push_back(len);
                    }
                }
            } else {
                let data = wc.wr_id as u32;
                match wire::msg_op(data) {
                    wire::RS_OP_SGL => self.ctrl_max_seqno = self.ctrl_max_seqno.wrapping_add(1),
                    wire::RS_OP_CTRL => {
                        self.ctrl_max_seqno = self.ctrl_max_seqno.wrapping_add(1);
                        if wire::msg_data(data) == wire::RS_CTRL_DISCONNECT {
                            self.state = st::DISCONNECTED;
                        }
                    }
                    // Its data is the slot, and it took a slot's bytes of the ring.
                    wire::RS_OP_IOMAP_SGL => {
                        self.sqe_avail += 1;
                        self.sbuf_bytes_avail += iomap::IOMAP_LEN as u32;
                    }
                    _ => {
                        self.sqe_avail += 1;
                        self.sbuf_bytes_avail += wire::msg_data(data);
                    }
                }
                if wc.status != IBV_WC_SUCCESS && self.state & st::CONNECTED != 0 {
                    self.state = st::ERROR;
                    self.err = libc::EIO;
                }
            }
        }
        if self.state & st::CONNECTED != 0 {
            for _ in 0..rcnt {
                if let Err(e) = self.post_recv() {
                    self.state = st::ERROR;
                    self.err = e.0;
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// `rs_get_cq_event`: waits (blocking channel) for the armed CQ's event.
    fn get_cq_event(&mut self) -> Result<(), Errno> {
        if !self.cq_armed {
            return Ok(());
        }
        let mut cq: *mut IbvCq = ptr::null_mut();
        let mut ctx: *mut c_void = ptr::null_mut();
        // SAFETY: live id's completion channel; out pointers valid.
        let r =
            unsafe { verbs::cq::ibv_get_cq_event((*self.id).recv_cq_channel, &mut cq, &mut ctx) };
        if r == 0 {
            self.unack_cqe += 1;
            if self.unack_cqe >= u32::from(self.sq_size) + u32::from(self.rq_size) {
                // SAFETY: our CQ.
                unsafe { verbs::cq::ibv_ack_cq_events(self.cq(), self.unack_cqe) };
                self.unack_cqe = 0;
            }
            self.cq_armed = false;
            Ok(())
        } else {
            let e = Errno::last();
            if e.0 != libc::EAGAIN && e.0 != libc::EINTR {
                self.state = st::ERROR;
            }
            Err(e)
        }
    }

    /// `rs_process_cq`: completions until `test` holds (or EAGAIN when `nonblock`).
    pub fn process_cq(
        &mut self,
        nonblock: bool,
        test: fn(&mut Stream) -> bool,
    ) -> Result<(), Errno> {
        if self.id.is_null() || self.cq().is_null() {
            return Err(Errno(libc::ENOTCONN));
        }
        let r = loop {
            self.update_credits();
            let polled = self.poll_cq();
            if test(self) {
                break Ok(());
            }
            if let Err(e) = polled {
                break Err(e);
            }
            if nonblock {
                break Err(Errno::AGAIN);
            }
            if !self.cq_armed {
                // SAFETY: our CQ.
                unsafe { verbs::cq::req_notify_cq(self.cq(), 0) };
                self.cq_armed = true;
            } else {
                self.update_credits();
                if let Err(e) = self.get_cq_event() {
                    break Err(e);
                }
            }
        };
        self.update_credits();
        r
    }

    fn nonblocking(&self, flags: c_int) -> bool {
        self.fd_flags & libc::O_NONBLOCK != 0 || flags & libc::MSG_DONTWAIT != 0
    }

    pub fn can_send(&mut self) -> bool {
        let t = self.target_sge;
        self.sqe_avail > 0
            && self.sbuf_bytes_avail >= RS_SNDLOWAT
            && self.sseq_no != self.sseq_comp
            && self.target_sgl(t).length != 0
    }

    fn conn_can_send(s: &mut Stream) -> bool {
        s.can_send() || s.state & st::WRITABLE == 0
    }

    pub fn have_rdata(&self) -> bool {
        !self.rmsg.is_empty()
    }

    fn conn_have_rdata(s: &mut Stream) -> bool {
        s.have_rdata() || s.state & st::READABLE == 0
    }

    fn conn_can_send_ctrl(s: &mut Stream) -> bool {
        s.ctrl_avail() || s.state & st::CONNECTED == 0
    }

    fn conn_all_sends_done(s: &mut Stream) -> bool {
        (s.ctrl_max_seqno.wrapping_sub(s.ctrl_seqno) as i32 + s.sqe_avail == i32::from(s.sq_size))
            || s.state & st::CONNECTED == 0
    }

    pub fn poll_all(_: &mut Stream) -> bool {
        true
    }

    pub fn is_cq_armed(s: &mut Stream) -> bool {
        s.cq_armed
    }

    /// `rsend`/`rsendv`: the bytes of `iov`, in transfers growing from 2 KiB to 64 KiB.
    pub fn send(&mut self, iov: &[&[u8]], flags: c_int) -> Result<usize, Errno> {
        if self.state & st::CONNECTED == 0 && self.state & st::DISCONNECTED == 0 {
            return Err(Errno(libc::ENOTCONN));
        }
        if self.state & st::WRITABLE == 0 {
            // After rshutdown(SHUT_WR) (or the peer's disconnect), as a TCP socket: EPIPE.
            // (librdmacm would still write while credits last.)
            return Err(Errno(libc::EPIPE));
        }
        self.send_iomaps(flags)?;
        let len: usize = iov.iter().map(|s| s.len()).sum();
        let mut cursor = IovCursor::new(iov);
        let mut left = len;
        let mut olen = RS_OLAP_START_SIZE;
        let mut ret = Ok(());
        while left > 0 {
            if !self.can_send() {
                if let Err(e) =
                    self.process_cq_polling(self.nonblocking(flags), Self::conn_can_send)
                {
                    ret = Err(e);
                    break;
                }
                if self.state & st::WRITABLE == 0 {
                    ret = Err(Errno(libc::ECONNRESET));
                    break;
                }
            }
            let mut xfer = if (olen as usize) < left {
                let x = olen;
                if olen < RS_MAX_TRANSFER {
                    olen <<= 1;
                }
                x
            } else {
                left as u32
            };
            xfer = xfer.min(self.sbuf_bytes_avail);
            let t = self.target_sge;
            xfer = xfer.min(self.target_sgl(t).length);
            let r = self.stage(&mut cursor, xfer, |s, sges, inline| {
                s.write_data(sges, xfer, inline)
            });
            if let Err(e) = r {
                ret = Err(e);
                break;
            }
            left -= xfer as usize;
        }
        match ret {
            Err(e) if left == len => Err(e),
            _ => Ok(len - left),
        }
    }

    /// Puts the next `xfer` bytes of `cursor` where a WRITE sends them from, and has `post`
    /// post it with those SGEs: inline from the caller's own buffer when they fit (one
    /// buffer), else copied into the send ring (two SGEs where it wraps).
    fn stage(
        &mut self,
        cursor: &mut IovCursor<'_>,
        xfer: u32,
        post: impl FnOnce(&mut Self, &mut [IbvSge], bool) -> Result<(), Errno>,
    ) -> Result<(), Errno> {
        let sbuf_size = self.sbuf_size;
        let inline = xfer <= u32::from(self.sq_inline);
        if inline && cursor.single() {
            let chunk = cursor.take_slice(xfer as usize);
            let mut s = [IbvSge {
                addr: chunk.as_ptr() as u64,
                length: xfer,
                lkey: 0,
            }];
            return post(self, &mut s, true);
        }
        let Some(sb) = self.sbuf.as_mut() else {
            return Err(Errno(libc::ENOTCONN));
        };
        let base = sb.ptr();
        let lkey = sb.lkey();
        let sbuf_left = sbuf_size - self.ssgl_off;
        if xfer <= sbuf_left {
            // SAFETY: [ssgl_off, ssgl_off + xfer) is inside sbuf.
            unsafe { cursor.copy_to(base.add(self.ssgl_off as usize), xfer as usize) };
            let mut s = [IbvSge {
                addr: base as u64 + u64::from(self.ssgl_off),
                length: xfer,
                lkey,
            }];
            if xfer < sbuf_left {
                self.ssgl_off += xfer;
            } else {
                self.ssgl_off = 0;
            }
            post(self, &mut s, inline)
        } else {
            let first = sbuf_left;
            let second = xfer - first;
            // SAFETY: the tail of sbuf, then its head.
            unsafe {
                cursor.copy_to(base.add(self.ssgl_off as usize), first as usize);
                cursor.copy_to(base, second as usize);
            }
            let mut s = [
                IbvSge {
                    addr: base as u64 + u64::from(self.ssgl_off),
                    length: first,
                    lkey,
                },
                IbvSge {
                    addr: base as u64,
                    length: second,
                    lkey,
                },
            ];
            self.ssgl_off = second;
            post(self, &mut s, inline)
        }
    }

    /// `rs_get_comp`: the process_cq loop (librdmacm busy-polls 10 µs first; we block at once).
    fn process_cq_polling(
        &mut self,
        nonblock: bool,
        test: fn(&mut Stream) -> bool,
    ) -> Result<(), Errno> {
        match self.process_cq(true, test) {
            Ok(()) => Ok(()),
            Err(e) if nonblock || e.0 != libc::EAGAIN => Err(e),
            Err(_) => self.process_cq(false, test),
        }
    }

    /// `rrecv` into `buf` (`MSG_PEEK`, `MSG_WAITALL`, `MSG_DONTWAIT` honoured).
    pub fn recv(&mut self, buf: &mut [u8], flags: c_int) -> Result<usize, Errno> {
        if self.state & (st::CONNECTED | st::DISCONNECTED | st::ERROR) == 0 {
            return Err(Errno(libc::ENOTCONN));
        }
        let len = buf.len();
        let mut left = len;
        let mut ret = Ok(());
        loop {
            if !self.have_rdata() {
                if let Err(e) =
                    self.process_cq_polling(self.nonblocking(flags), Self::conn_have_rdata)
                {
                    ret = Err(e);
                    break;
                }
            }
            if flags & libc::MSG_PEEK != 0 {
                left = len - self.peek(buf);
                break;
            }
            let rbuf_size = self.rbuf_size;
            let Some(rb) = self.rbuf.as_mut() else { break };
            let rbase = rb.ptr();
            while left > 0 {
                let Some(head) = self.rmsg.front_mut() else {
                    break;
                };
                // Saturate, not truncate: a buffer of exactly 4 GiB made `left as u32`
                // zero, so nothing was consumed and this loop never ended.
                let want = u32::try_from(left).unwrap_or(u32::MAX);
                let mut rsize = if want < *head {
                    *head -= want;
                    want
                } else {
                    let r = *head;
                    self.rmsg.pop_front();
                    self.rseq_no = self.rseq_no.wrapping_add(1);
                    r
                };
                let end_size = rbuf_size - self.rbuf_offset;
                let dst_off = len - left;
                if rsize > end_size {
                    // SAFETY: inside rbuf and inside buf (rsize <= left).
                    unsafe {
                        ptr::copy_nonoverlapping(
                            rbase.add(self.rbuf_offset as usize),
                            buf.as_mut_ptr().add(dst_off),
                            end_size as usize,
                        )
                    };
                    self.rbuf_offset = 0;
                    rsize -= end_size;
                    left -= end_size as usize;
                    self.rbuf_bytes_avail = self.rbuf_bytes_avail.saturating_add(end_size);
                }
                let dst_off = len - left;
                // SAFETY: as above.
                unsafe {
                    ptr::copy_nonoverlapping(
                        rbase.add(self.rbuf_offset as usize),
                        buf.as_mut_ptr().add(dst_off),
                        rsize as usize,
                    )
                };
                self.rbuf_offset += rsize;
                left -= rsize as usize;
                self.rbuf_bytes_avail = self.rbuf_bytes_avail.saturating_add(rsize);
            }
            if !(left > 0 && flags & libc::MSG_WAITALL != 0 && self.state & st::READABLE != 0) {
                break;
            }
        }
        match ret {
            Err(e) if left == len => Err(e),
            _ => Ok(len - left),
        }
    }

    fn peek(&mut self, buf: &mut [u8]) -> usize {
        let rbuf_size = self.rbuf_size as usize;
        let mut off = self.rbuf_offset as usize;
        let Some(rb) = self.rbuf.as_mut() else {
            return 0;
        };
        let rbase = rb.ptr();
        let mut done = 0usize;
        for &m in self.rmsg.iter() {
            if done == buf.len() {
                break;
            }
            let mut n = (m as usize).min(buf.len() - done);
            while n > 0 {
                let k = n.min(rbuf_size - off);
                // SAFETY: inside rbuf and buf.
                unsafe { ptr::copy_nonoverlapping(rbase.add(off), buf.as_mut_ptr().add(done), k) };
                done += k;
                n -= k;
                off = (off + k) % rbuf_size;
            }
        }
        done
    }

    /// `rshutdown`.
    pub fn shutdown(&mut self, how: c_int) -> Result<(), Errno> {
        let nb = self.fd_flags & libc::O_NONBLOCK != 0;
        if nb {
            self.set_nonblocking(0);
        }
        let mut ret = Ok(());
        'out: {
            if self.state & st::CONNECTED != 0 {
                let ctrl = if how == libc::SHUT_RDWR {
                    self.state &= !(st::READABLE | st::WRITABLE);
                    wire::RS_CTRL_DISCONNECT
                } else if how == libc::SHUT_WR {
                    self.state &= !st::WRITABLE;
                    if self.state & st::READABLE != 0 {
                        wire::RS_CTRL_SHUTDOWN
                    } else {
                        wire::RS_CTRL_DISCONNECT
                    }
                } else {
                    self.state &= !st::READABLE;
                    if self.state & st::WRITABLE != 0 {
                        break 'out;
                    }
                    wire::RS_CTRL_DISCONNECT
                };
                if !self.ctrl_avail() {
                    if let Err(e) = self.process_cq(false, Self::conn_can_send_ctrl) {
                        ret = Err(e);
                        break 'out;
                    }
                }
                if self.state & st::CONNECTED != 0 && self.ctrl_avail() {
                    self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
                    ret = self.post_msg(wire::msg_set(wire::RS_OP_CTRL, ctrl));
                }
            }
            if self.state & st::CONNECTED != 0 {
                let _ = self.process_cq(false, Self::conn_all_sends_done);
            }
        }
        if nb && self.state & st::CONNECTED != 0 {
            self.set_nonblocking(self.fd_flags);
        }
        if self.state & st::DISCONNECTED != 0 {
            // ucma_shutdown: the QP to ERR flushes the receives, which wakes rpoll.
            // SAFETY: our CQ.
            unsafe { verbs::cq::req_notify_cq(self.cq(), 0) };
            if let Ok(s) = cmstate::id_from_ptr(self.id) {
                let _ = cmqp::modify_qp_err(s);
            }
        }
        ret
    }

    /// `rs_set_nonblocking`: the completion channel, and the CM channel before connection.
    pub fn set_nonblocking(&mut self, arg: c_int) {
        let cq_fd = self.cq_channel_fd();
        // SAFETY: our descriptors (or -1, refused by the kernel).
        unsafe {
            if cq_fd >= 0 {
                libc::fcntl(cq_fd, libc::F_SETFL, arg);
            }
            if self.state < st::CONNECTED {
                libc::fcntl(self.channel_fd(), libc::F_SETFL, arg);
            }
        }
    }

    /// `rs_poll_rs`: the poll events of this socket now.
    pub fn poll_events(
        &mut self,
        events: i16,
        nonblock: bool,
        test: fn(&mut Stream) -> bool,
    ) -> i16 {
        if self.state & st::CONNECTED != 0
            || self.state == st::DISCONNECTED
            || self.state & st::ERROR != 0
        {
            let _ = self.process_cq(nonblock, test);
            let mut rev = 0i16;
            if events & libc::POLLIN != 0 && Self::conn_have_rdata(self) {
                rev |= libc::POLLIN;
            }
            if events & libc::POLLOUT != 0 && self.can_send() {
                rev |= libc::POLLOUT;
            }
            if self.state & st::CONNECTED == 0 {
                rev |= if self.state == st::DISCONNECTED {
                    libc::POLLHUP
                } else {
                    libc::POLLERR
                };
            }
            return rev;
        }
        if self.state == st::LISTENING {
            let mut p = libc::pollfd {
                fd: self.channel_fd(),
                events,
                revents: 0,
            };
            // SAFETY: one pollfd.
            unsafe { libc::poll(&mut p, 1, 0) };
            return p.revents;
        }
        if self.state == st::CONNECT_ERROR {
            return (events & (libc::POLLOUT | libc::POLLIN)) | libc::POLLERR;
        }
        0
    }

    /// The descriptor rpoll waits on for this socket.
    pub fn wait_fd(&self) -> c_int {
        if self.state >= st::CONNECTED {
            self.cq_channel_fd()
        } else {
            self.channel_fd()
        }
    }

    /// After `poll` saw the wait descriptor readable: take the CQ event (`rs_get_cq_event`).
    pub fn consume_wakeup(&mut self) {
        if self.state >= st::CONNECTED {
            let fd = self.cq_channel_fd();
            // The channel is blocking; poll said it is readable, so this returns at once.
            let _ = fd;
            let _ = self.get_cq_event();
        }
    }

    pub fn local_addr(&self) -> libc::sockaddr_storage {
        // SAFETY: live id.
        unsafe { (*self.id).route.addr.src_addr }
    }

    pub fn peer_addr(&self) -> libc::sockaddr_storage {
        // SAFETY: live id.
        unsafe { (*self.id).route.addr.dst_addr }
    }
}

/// What is left of target SGE `t` after a transfer of `length` bytes into it. The entry is the
/// peer's: it RDMA-writes our target SGL whenever it likes, so the entry may have shrunk since
/// `send` sized the transfer from it. Saturate and wrap rather than overflow (a panic on the
/// send path); a transfer past what the peer offers is its remote access error to report.
fn consume_target(t: RsSge, length: u32) -> RsSge {
    RsSge {
        addr: t.addr.wrapping_add(u64::from(length)),
        key: t.key,
        length: t.length.saturating_sub(length),
    }
}

/// Walks an iovec list, copying out consecutive bytes.
struct IovCursor<'a> {
    iov: &'a [&'a [u8]],
    idx: usize,
    off: usize,
}

impl<'a> IovCursor<'a> {
    fn new(iov: &'a [&'a [u8]]) -> Self {
        IovCursor {
            iov,
            idx: 0,
            off: 0,
        }
    }

    /// Whether the list is one buffer (whose bytes can be sent inline from where they are).
    fn single(&self) -> bool {
        self.iov.len() == 1
    }

    /// The next `n` bytes of a single-buffer list.
    fn take_slice(&mut self, n: usize) -> &'a [u8] {
        let s = &self.iov[self.idx][self.off..self.off + n];
        self.off += n;
        s
    }

    /// # Safety
    /// `dst` has `n` writable bytes; `n` bytes remain in the list.
    unsafe fn copy_to(&mut self, mut dst: *mut u8, mut n: usize) {
        while n > 0 && self.idx < self.iov.len() {
            let cur = self.iov[self.idx];
            let k = (cur.len() - self.off).min(n);
            // SAFETY: per the contract.
            unsafe { ptr::copy_nonoverlapping(cur.as_ptr().add(self.off), dst, k) };
            // SAFETY: as above.
            dst = unsafe { dst.add(k) };
            n -= k;
            self.off += k;
            if self.off == cur.len() {
                self.idx += 1;
                self.off = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iov_cursor_copies_across_vectors() {
        let a = [1u8, 2, 3];
        let b: [u8; 0] = [];
        let c = [4u8, 5, 6, 7];
        let iov: [&[u8]; 3] = [&a, &b, &c];
        let mut cur = IovCursor::new(&iov);
        let mut out = [0u8; 5];
        // SAFETY: 5 writable bytes, 7 available.
        unsafe { cur.copy_to(out.as_mut_ptr(), 5) };
        assert_eq!(out, [1, 2, 3, 4, 5]);
        let mut rest = [0u8; 2];
        // SAFETY: 2 writable bytes, 2 available.
        unsafe { cur.copy_to(rest.as_mut_ptr(), 2) };
        assert_eq!(rest, [6, 7]);
    }

    #[test]
    fn iov_cursor_slices_a_single_buffer() {
        let a = [9u8; 10];
        let iov: [&[u8]; 1] = [&a];
        let mut cur = IovCursor::new(&iov);
        assert_eq!(cur.take_slice(4).len(), 4);
        assert_eq!(cur.take_slice(6).len(), 6);
    }

    #[test]
    fn a_target_sge_the_peer_shrank_or_placed_at_the_top_never_overflows() {
        let t = RsSge {
            addr: 0x1000,
            key: 7,
            length: 4096,
        };
        assert_eq!(
            consume_target(t, 1024),
            RsSge {
                addr: 0x1400,
                key: 7,
                length: 3072
            }
        );
        // The peer rewrote the entry to 100 bytes after a 1024-byte transfer was sized.
        let shrunk = RsSge { length: 100, ..t };
        assert_eq!(consume_target(shrunk, 1024).length, 0);
        let top = RsSge {
            addr: u64::MAX - 1,
            ..t
        };
        assert_eq!(consume_target(top, 4).addr, 2);
    }

    #[test]
    fn defaults_are_librdmacms() {
        // rs_alloc's defaults (def_sqsize, def_rqsize, def_inline, def_mem, def_wmem) and the
        // sizes announced in the connection data: half the receive ring, RQ depth as credits.
        assert_eq!((DEF_SQSIZE, DEF_RQSIZE, DEF_INLINE), (384, 384, 64));
        assert_eq!((DEF_MEM, DEF_WMEM), (1 << 17, 1 << 17));
        assert_eq!(
            (RS_SNDLOWAT, RS_OLAP_START_SIZE, RS_MAX_TRANSFER),
            (2048, 2048, 65536)
        );
        assert_eq!(RS_QP_CTRL_SIZE, 4);
    }
}
