//! Queue pairs: created by the daemon, posted to through shared rings. `ibv_post_send` and
//! `ibv_post_recv` validate each work request as rxe does, encode it into the next ring slot
//! and publish it; the only system call is the doorbell write when the daemon said it sleeps.

use std::ptr::{self, addr_of_mut};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use libc::{c_int, c_void};
use proto::ctl::{self, Request, Response};
use proto::ring::wqe::{self, MwBind, RecvWqe, SendData, SendWqe, Sge, UdDest, WrOpcode};
use proto::ring::{RingError, SharedRing};
use proto::transport::SendWr;
use proto::{Lkey, Qkey, Qpn, Rkey};

use crate::abi::*;
use crate::ffi::{self, Errno};
use crate::runtime::{self, ShimContext, CQS, MRS, QPS};
use crate::shm::Mapping;
use crate::verbs::wr::{self, BuiltWr, WrBatch};
use crate::verbs::{ah, cq, helpers, mw, pd, srq};

/// One producer end (send queue, receive queue or SRQ) with its scratch slot.
pub struct Producer {
    ring: SharedRing,
    slot: Vec<u8>,
    inline: Vec<u8>,
    /// The WRs of a post on the same-host fast path, converted (kept between posts: an
    /// allocation per post otherwise; room for at most [`FAST_WRS_KEPT`] kept).
    fast_wrs: Vec<SendWr>,
}

/// How many converted WRs' room a send queue keeps between fast-path posts.
const FAST_WRS_KEPT: usize = 64;

impl Producer {
    pub fn new(ring: SharedRing) -> Producer {
        let slot = vec![0u8; ring.geometry().slot_size as usize];
        Producer {
            ring,
            slot,
            inline: Vec::new(),
            fast_wrs: Vec::new(),
        }
    }

    /// Publishes the first `len` bytes of the scratch slot; `Ok(true)` if the daemon sleeps
    /// and must be woken. A full ring is `ENOMEM`, as for a full provider queue.
    fn publish(&mut self, len: usize) -> Result<bool, Errno> {
        match self.ring.push(&self.slot[..len]) {
            Ok(sleeping) => Ok(sleeping),
            Err(RingError::Full) => Err(Errno::NOMEM),
            Err(_) => Err(Errno::IO),
        }
    }

    /// Whether the daemon lent this receive ring to the fast path (read after a post).
    pub fn lent(&self) -> bool {
        self.ring.fast_lent()
    }

    /// Encodes and publishes one receive WQE.
    pub fn post_recv(&mut self, wr: &IbvRecvWr, max_sge: u32) -> Result<bool, Errno> {
        let mut sges = [Sge::default(); wqe::MAX_SGE];
        let n = read_sges(wr.sg_list, wr.num_sge, max_sge, &mut sges)?;
        let len = RecvWqe {
            wr_id: wr.wr_id,
            sges: &sges[..n],
        }
        .encode(&mut self.slot)
        .map_err(|_| Errno::INVAL)?;
        self.publish(len)
    }
}

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Copies a caller's scatter/gather list, checking its length against the queue's limit.
fn read_sges(
    list: *const IbvSge,
    num_sge: c_int,
    max_sge: u32,
    out: &mut [Sge; wqe::MAX_SGE],
) -> Result<usize, Errno> {
    let n = usize::try_from(num_sge).map_err(|_| Errno::INVAL)?;
    if n > max_sge as usize || n > wqe::MAX_SGE {
        return Err(Errno::INVAL);
    }
    if n > 0 && list.is_null() {
        return Err(Errno::INVAL);
    }
    for (i, o) in out.iter_mut().enumerate().take(n) {
        // SAFETY: the caller's list holds num_sge entries (verb contract), i < n.
        let s = unsafe { list.add(i).read() };
        *o = Sge {
            addr: s.addr,
            length: s.length,
            lkey: Lkey(s.lkey),
        };
    }
    Ok(n)
}

/// The allocation behind an `ibv_qp *` (= `ibv_qp_ex *`).
#[repr(C)]
pub struct ShimQp {
    pub qp: IbvQpEx,
    cap: ctl::QpCap,
    sq_sig_all: bool,
    sq: Mutex<Producer>,
    rq: Option<Mutex<Producer>>,
    /// Async events handed out for this QP; destroy waits until they are acknowledged.
    pub events_reported: AtomicU32,
    /// Receive WQEs posted and not yet completed (as seen by `ibv_poll_cq`): the daemon
    /// drains the ring into its engine early, so the ring alone would let an application post
    /// more than `max_recv_wr`; rxe refuses that with `ENOMEM`.
    pub rq_outstanding: AtomicU32,
    /// `send_ops_flags` of a QP made for the `ibv_wr_*` API (0: not offered).
    pub send_ops: u64,
    /// The `ibv_wr_*` batch being built.
    pub batch: Mutex<WrBatch>,
    /// Its doorbell in the context's table (both queues share it).
    doorbell: u32,
    /// After the rings, so they are dropped before the memory is unmapped (a chunk shared
    /// with the context's other QPs, or a region of its own).
    _map: Arc<Mapping>,
}

/// Maps an `ibv_qp *` from a caller to our QP.
pub fn qp_from_ptr<'a>(qp: *mut IbvQp) -> Result<&'a ShimQp, Errno> {
    if !QPS.contains(qp) {
        return Err(Errno::INVAL);
    }
    // SAFETY: registered, so the first member (same address) of a live Box<ShimQp>.
    Ok(unsafe { &*qp.cast::<ShimQp>() })
}

impl ShimQp {
    pub fn as_qp(&self) -> *mut IbvQp {
        (self as *const ShimQp).cast_mut().cast()
    }

    fn state(&self) -> c_int {
        // SAFETY: reading a field of a live QP; modify_qp may write it concurrently, as in
        // libibverbs, so read it volatile.
        unsafe { ptr::addr_of!(self.qp.qp_base.state).read_volatile() }
    }

    fn context(&self) -> Result<&ShimContext, Errno> {
        runtime::context_from_ptr(self.qp.qp_base.context)
    }

    /// Posts a batch built with the `ibv_wr_*` API: all of it, or nothing when the send
    /// queue cannot take it all.
    pub fn post_built(&self, mut wrs: Vec<BuiltWr>) -> Result<(), Errno> {
        let ctx = self.context()?;
        ctx.data_path_ok()?;
        // The `ibv_wr_*` batches go through the ring: a direction of this QP comes back to
        // the daemon first.
        ctx.fast.give_back(ctx, self.qp.qp_base.qp_num);
        if self.state() < IBV_QPS_RTS {
            return Err(Errno::INVAL);
        }
        let ring_bell = {
            let mut sq = lock(&self.sq);
            if (sq.ring.free().map_err(|_| Errno::IO)? as usize) < wrs.len() {
                return Err(Errno::NOMEM);
            }
            let mut ring_bell = false;
            for b in &mut wrs {
                if let Some(data) = &b.inline {
                    b.sges = vec![IbvSge {
                        addr: data.as_ptr() as u64,
                        length: u32::try_from(data.len()).map_err(|_| Errno::INVAL)?,
                        lkey: 0,
                    }];
                    b.wr.send_flags |= IBV_SEND_INLINE;
                } else {
                    b.wr.send_flags &= !IBV_SEND_INLINE;
                }
                b.wr.sg_list = b.sges.as_mut_ptr();
                b.wr.num_sge = c_int::try_from(b.sges.len()).map_err(|_| Errno::INVAL)?;
                b.wr.next = ptr::null_mut();
                ring_bell |= self.post_send_one(&mut sq, &b.wr)?;
            }
            ring_bell
        };
        ctx.rang(self.doorbell, ring_bell);
        Ok(())
    }

    /// Validates and encodes one send WR into the send queue (rxe's validate_send_wr checks).
    fn post_send_one(&self, sq: &mut Producer, wr: &IbvSendWr) -> Result<bool, Errno> {
        let len = self.encode_send(sq, wr)?;
        sq.publish(len)
    }

    /// Whether this QP's type can be on the same-host fast path (the daemon decides if it
    /// is: see `crate::fast`).
    fn fast_capable(&self) -> bool {
        matches!(self.qp.qp_base.qp_type, IBV_QPT_RC | IBV_QPT_UC)
    }

    /// Posts the list starting at `wr` on the fast path when this QP's direction runs here
    /// (or the daemon offers it): each WR is validated and encoded exactly as for the ring,
    /// then decoded from that encoding, so that both paths see the same work request. `None`:
    /// post through the ring.
    fn post_fast(
        &self,
        ctx: &ShimContext,
        sq: &mut Producer,
        wr: *mut IbvSendWr,
    ) -> Option<Result<(), (Errno, *mut IbvSendWr)>> {
        if !crate::fast::enabled() || !self.fast_capable() {
            return None;
        }
        let qpn = self.qp.qp_base.qp_num;
        let offered = sq.ring.fast_offered();
        let runs = ctx.fast.runs(qpn);
        if !offered && !runs {
            return None;
        }
        // A take carries what waits in the send ring (posted while the daemon had the QP).
        let ring = if runs {
            None
        } else {
            let send_cq = super::cq::cq_context_handle(self.qp.qp_base.send_cq)
                .ok()?
                .0;
            crate::fast::backlog::SendRing::of(
                &sq.ring,
                self.cap.max_send_sge as usize,
                self.cap.max_inline_data as usize,
                send_cq,
            )
        };
        let mut wrs = std::mem::take(&mut sq.fast_wrs);
        wrs.clear();
        let mut failed = None;
        let mut sges = [wqe::Sge::default(); wqe::MAX_SGE];
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: non-null and part of the caller's list of valid WRs (verb contract).
            let w = unsafe { &*cur };
            let converted = self.encode_send(sq, w).and_then(|len| {
                crate::fast::backlog::decode(
                    &sq.slot[..len],
                    self.cap.max_send_sge as usize,
                    self.cap.max_inline_data as usize,
                    &mut sges,
                )
                .ok_or(Errno::INVAL)
            });
            match converted {
                Ok(x) => wrs.push(x),
                Err(e) => {
                    failed = Some((e, cur));
                    break;
                }
            }
            cur = w.next;
        }
        let posted = ctx.fast.post(ctx, qpn, offered, ring, &mut wrs);
        wrs.clear();
        // A post's list is as long as the program makes it: what is kept for the next is
        // bounded.
        wrs.shrink_to(FAST_WRS_KEPT);
        sq.fast_wrs = wrs;
        match posted {
            crate::fast::Posted::Ring => None,
            crate::fast::Posted::Done => Some(match failed {
                None => Ok(()),
                Some(f) => Err(f),
            }),
        }
    }

    /// Validates and encodes one send WR into the producer's scratch slot; returns its
    /// length.
    fn encode_send(&self, sq: &mut Producer, wr: &IbvSendWr) -> Result<usize, Errno> {
        let qp_type = self.qp.qp_base.qp_type;
        let opcode = WrOpcode::from_u32(wr.opcode as u32).ok_or(Errno::INVAL)?;
        let allowed = match qp_type {
            IBV_QPT_UD => matches!(opcode, WrOpcode::Send | WrOpcode::SendWithImm),
            IBV_QPT_UC => matches!(
                opcode,
                WrOpcode::Send
                    | WrOpcode::SendWithImm
                    | WrOpcode::SendWithInv
                    | WrOpcode::RdmaWrite
                    | WrOpcode::RdmaWriteWithImm
                    | WrOpcode::LocalInv
                    | WrOpcode::BindMw
            ),
            _ => true,
        };
        if !allowed || wr.send_flags & !wqe::send_flags::ALL != 0 {
            return Err(Errno::INVAL);
        }
        let mut sges = [Sge::default(); wqe::MAX_SGE];
        let n = read_sges(wr.sg_list, wr.num_sge, self.cap.max_send_sge, &mut sges)?;
        let inline = wr.send_flags & IBV_SEND_INLINE != 0
            && !matches!(
                opcode,
                WrOpcode::RdmaRead
                    | WrOpcode::AtomicCmpAndSwp
                    | WrOpcode::AtomicFetchAndAdd
                    | WrOpcode::LocalInv
                    | WrOpcode::BindMw
            );
        let data = if inline {
            let total: u64 = sges[..n].iter().map(|s| u64::from(s.length)).sum();
            if total > u64::from(self.cap.max_inline_data) {
                return Err(Errno::INVAL);
            }
            sq.inline.clear();
            for s in &sges[..n] {
                if s.length == 0 {
                    continue;
                }
                if s.addr == 0 {
                    return Err(Errno::INVAL);
                }
                // SAFETY: with IBV_SEND_INLINE the SGEs name the caller's own readable
                // memory (the lkey is ignored), copied now as the verb requires; the
                // pointer is non-null and the length non-zero (checked above).
                let bytes =
                    unsafe { std::slice::from_raw_parts(s.addr as *const u8, s.length as usize) };
                sq.inline.extend_from_slice(bytes);
            }
            SendData::Inline(&sq.inline)
        } else {
            SendData::Sges(&sges[..n])
        };
        // SAFETY: `wr.wr` is a union of plain-data arms; which one is meaningful depends on
        // the opcode and QP type, as in C.
        let (rdma, atomic, ud) = unsafe { (wr.wr.rdma, wr.wr.atomic, wr.wr.ud) };
        let (remote_addr, rkey, compare_add, swap) = match opcode {
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd | WrOpcode::AtomicWrite => (
                atomic.remote_addr,
                atomic.rkey,
                atomic.compare_add,
                atomic.swap,
            ),
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm | WrOpcode::RdmaRead => {
                (rdma.remote_addr, rdma.rkey, 0, 0)
            }
            _ => (0, 0, 0, 0),
        };
        let ud = if qp_type == IBV_QPT_UD {
            let ah = ah::ah_handle(ud.ah).ok_or(Errno::INVAL)?;
            Some(UdDest {
                ah,
                remote_qpn: Qpn::new(ud.remote_qpn),
                remote_qkey: Qkey(ud.remote_qkey),
            })
        } else {
            None
        };
        let bind = if opcode == WrOpcode::BindMw {
            // SAFETY: the bind_mw arm is the meaningful one for IBV_WR_BIND_MW.
            let b = unsafe { wr.ext.bind_mw };
            Some(bind_args(b.mw, b.rkey, &b.bind_info)?)
        } else {
            None
        };
        let mut flags = wr.send_flags & wqe::send_flags::ALL;
        if !inline {
            flags &= !IBV_SEND_INLINE;
        }
        if self.sq_sig_all {
            flags |= wqe::send_flags::SIGNALED;
        }
        let entry = SendWqe {
            wr_id: wr.wr_id,
            opcode,
            flags,
            // `imm_data` is `__be32` (the application stores `htonl(x)`); the WQE carries the
            // bytes as stored and the daemon turns them into the ImmDt field's value, so the
            // wire holds the application's bytes unchanged, as rxe passes ImmDt through. An
            // invalidate R_Key (`invalidate_rkey`) is host order already.
            imm_or_inv: wr.imm_data,
            remote_addr,
            rkey: Rkey(rkey),
            compare_add,
            swap,
            ud,
            bind,
            data,
        };
        let mut slot = std::mem::take(&mut sq.slot);
        let encoded = entry.encode(&mut slot);
        sq.slot = slot;
        encoded.map_err(|_| Errno::INVAL)
    }
}

/// The bind arguments of a memory-window bind, from the window and the caller's bind info.
pub fn bind_args(mw: *mut c_void, new_rkey: u32, info: &IbvMwBindInfo) -> Result<MwBind, Errno> {
    let mw_rkey = mw::mw_rkey(mw).ok_or(Errno::INVAL)?;
    // A zero-length bind unbinds and needs no MR (IBTA 10.6.7.2).
    let mr_lkey = if info.mr.is_null() {
        0
    } else if MRS.contains(info.mr) {
        // SAFETY: registered, so a live IbvMr.
        unsafe { (*info.mr).lkey }
    } else {
        return Err(Errno::INVAL);
    };
    Ok(MwBind {
        mw_rkey: Rkey(mw_rkey),
        new_rkey: Rkey(new_rkey),
        mr_lkey: Lkey(mr_lkey),
        addr: info.addr,
        length: info.length,
        access: info.mw_access_flags,
    })
}

/// `ctx->ops.post_send`: 0, or an errno with `*bad_wr` at the first WR not posted.
///
/// # Safety
/// Called by libibverbs' inline verbs with the application's arguments; pointers are only
/// dereferenced after they are found to be live objects of ours (or, for WR lists and
/// output arrays, as the verb's contract makes them valid).
pub unsafe extern "C" fn post_send(
    qp: *mut IbvQp,
    wr: *mut IbvSendWr,
    bad_wr: *mut *mut IbvSendWr,
) -> c_int {
    let mut failed: *mut IbvSendWr = ptr::null_mut();
    let rc = ffi::zero_or_errno(|| {
        let shim = qp_from_ptr(qp)?;
        let ctx = shim.context()?;
        ctx.data_path_ok()?;
        let (ring_bell, result) = {
            let mut sq = lock(&shim.sq);
            // rxe refuses posting before RTS (rxe_post_send: "qp not ready to send").
            if shim.state() < IBV_QPS_RTS {
                failed = wr;
                return Err(Errno::INVAL);
            }
            if let Some(result) = shim.post_fast(ctx, &mut sq, wr) {
                (None, result)
            } else {
                // SAFETY: `wr` heads the caller's list of valid WRs (the verb's contract).
                let (bell, result) =
                    unsafe { helpers::post_each(wr, |w| shim.post_send_one(&mut sq, w)) };
                (Some(bell), result)
            }
        };
        // Work posted on the fast path is not in the ring: no doorbell (it would set the
        // QP's bit and wake a sleeping device thread for nothing, a third process on the
        // CPUs for every message).
        if let Some(ring_bell) = ring_bell {
            ctx.rang(shim.doorbell, ring_bell);
        }
        result.map_err(|(e, at)| {
            failed = at;
            e
        })
    });
    if rc != 0 && !bad_wr.is_null() {
        // SAFETY: non-null; the inline verb passes the address of the caller's bad_wr.
        unsafe { *bad_wr = if failed.is_null() { wr } else { failed } };
    }
    rc
}

/// `ctx->ops.post_recv`.
///
/// # Safety
/// Called by libibverbs' inline verbs with the application's arguments; pointers are only
/// dereferenced after they are found to be live objects of ours (or, for WR lists and
/// output arrays, as the verb's contract makes them valid).
pub unsafe extern "C" fn post_recv(
    qp: *mut IbvQp,
    wr: *mut IbvRecvWr,
    bad_wr: *mut *mut IbvRecvWr,
) -> c_int {
    let mut failed: *mut IbvRecvWr = ptr::null_mut();
    let rc = ffi::zero_or_errno(|| {
        let shim = qp_from_ptr(qp)?;
        let ctx = shim.context()?;
        ctx.data_path_ok()?;
        // A QP on an SRQ has no receive queue; rxe refuses posting in RESET.
        let Some(rq) = &shim.rq else {
            failed = wr;
            return Err(Errno::INVAL);
        };
        if shim.state() == IBV_QPS_RESET {
            failed = wr;
            return Err(Errno::INVAL);
        }
        let (ring_bell, result, lent) = {
            let mut rq = lock(rq);
            // SAFETY: `wr` heads the caller's list of valid WRs (the verb's contract).
            let (bell, result) = unsafe {
                helpers::post_each(wr, |w| {
                    if shim.rq_outstanding.load(Ordering::Acquire) >= shim.cap.max_recv_wr {
                        return Err(Errno::NOMEM);
                    }
                    let bell = rq.post_recv(w, shim.cap.max_recv_sge)?;
                    shim.rq_outstanding.fetch_add(1, Ordering::AcqRel);
                    Ok(bell)
                })
            };
            (bell, result, rq.lent())
        };
        // A ring lent to the process that runs this QP's responder (the fast path) is read
        // there: the device needs no doorbell, and waking it would put a third process on
        // the CPUs for every message.
        if !lent {
            ctx.rang(shim.doorbell, ring_bell);
        }
        result.map_err(|(e, at)| {
            failed = at;
            e
        })
    });
    if rc != 0 && !bad_wr.is_null() {
        // SAFETY: non-null, the caller's bad_wr.
        unsafe { *bad_wr = if failed.is_null() { wr } else { failed } };
    }
    rc
}

// IBV_QP_INIT_ATTR_* (enum ibv_qp_init_attr_mask)
const QP_INIT_ATTR_PD: u32 = 1 << 0;
const QP_INIT_ATTR_CREATE_FLAGS: u32 = 1 << 2;
const QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;

#[allow(clippy::too_many_arguments)]
fn create(
    pd: *mut IbvPd,
    qp_context: *mut c_void,
    send_cq: *mut IbvCq,
    recv_cq: *mut IbvCq,
    srq_ptr: *mut IbvSrq,
    cap: &mut IbvQpCap,
    qp_type: c_int,
    sq_sig_all: c_int,
    send_ops: u64,
) -> Result<*mut ShimQp, Errno> {
    let ctx = pd::pd_context(pd)?;
    if send_ops & !wr::supported(qp_type) != 0 {
        return Err(Errno::OPNOTSUPP);
    }
    if !CQS.contains(send_cq) || !CQS.contains(recv_cq) {
        return Err(Errno::INVAL);
    }
    let (send_cq_handle, _) = cq::cq_context_handle(send_cq)?;
    let (recv_cq_handle, _) = cq::cq_context_handle(recv_cq)?;
    let srq_handle = if srq_ptr.is_null() {
        None
    } else {
        Some(srq::srq_from_ptr(srq_ptr)?.srq.handle)
    };
    let qp_type_u32 = u32::try_from(qp_type).map_err(|_| Errno::INVAL)?;
    // SAFETY: live PD (checked by pd_context).
    let (context, pd_handle) = unsafe { ((*pd).context, (*pd).handle) };
    let (resp, mut fds) = ctx.call(
        &Request::CreateQp {
            pd: pd_handle,
            qp_type: qp_type_u32,
            send_cq: send_cq_handle,
            recv_cq: recv_cq_handle,
            srq: srq_handle,
            cap: ctl::QpCap {
                max_send_wr: cap.max_send_wr,
                max_recv_wr: cap.max_recv_wr,
                max_send_sge: cap.max_send_sge,
                max_recv_sge: cap.max_recv_sge,
                max_inline_data: cap.max_inline_data,
            },
            sq_sig_all: sq_sig_all != 0,
        },
        &[],
    )?;
    let Response::Qp {
        qpn,
        cap: granted,
        sq,
        rq,
        region_len,
        doorbell,
        region,
    } = resp
    else {
        return Err(Errno::PROTO);
    };
    let attached = (|| {
        let fd = fds.pop().ok_or(Errno::PROTO)?;
        let map = ctx.ring_chunk(region, &fd, region_len)?;
        let sq = map.ring(&sq, true)?;
        let rq = match (&rq, srq_handle) {
            (Some(place), None) => Some(map.ring(place, true)?),
            (None, Some(_)) => None,
            _ => return Err(Errno::PROTO),
        };
        Ok((map, sq, rq))
    })();
    let (map, sq, rq) = match attached {
        Ok(x) => x,
        Err(e) => {
            let _ = ctx.call_done(&Request::DestroyQp { qpn });
            return Err(e);
        }
    };
    // rxe reports the granted capacities back through the caller's attributes.
    *cap = IbvQpCap {
        max_send_wr: granted.max_send_wr,
        max_recv_wr: granted.max_recv_wr,
        max_send_sge: granted.max_send_sge,
        max_recv_sge: granted.max_recv_sge,
        max_inline_data: granted.max_inline_data,
    };
    let null = ptr::null_mut();
    let shim = Box::new(ShimQp {
        qp: IbvQpEx {
            qp_base: IbvQp {
                context,
                qp_context,
                pd,
                send_cq,
                recv_cq,
                srq: srq_ptr,
                handle: qpn,
                qp_num: qpn,
                state: IBV_QPS_RESET,
                qp_type,
                mutex: libc::PTHREAD_MUTEX_INITIALIZER,
                cond: libc::PTHREAD_COND_INITIALIZER,
                events_completed: 0,
            },
            comp_mask: 0,
            wr_id: 0,
            wr_flags: 0,
            wr_atomic_cmp_swp: null,
            wr_atomic_fetch_add: null,
            wr_bind_mw: null,
            wr_local_inv: null,
            wr_rdma_read: null,
            wr_rdma_write: null,
            wr_rdma_write_imm: null,
            wr_send: null,
            wr_send_imm: null,
            wr_send_inv: null,
            wr_send_tso: null,
            wr_set_ud_addr: null,
            wr_set_xrc_srqn: null,
            wr_set_inline_data: null,
            wr_set_inline_data_list: null,
            wr_set_sge: null,
            wr_set_sge_list: null,
            wr_start: null,
            wr_complete: null,
            wr_abort: null,
            wr_atomic_write: null,
        },
        cap: granted,
        sq_sig_all: sq_sig_all != 0,
        sq: Mutex::new(Producer::new(sq)),
        rq: rq.map(|r| Mutex::new(Producer::new(r))),
        events_reported: AtomicU32::new(0),
        rq_outstanding: AtomicU32::new(0),
        send_ops,
        batch: Mutex::new(WrBatch::default()),
        doorbell,
        _map: map,
    });
    let mut shim = shim;
    if send_ops != 0 {
        wr::install(&mut shim.qp);
    }
    let p = Box::into_raw(shim);
    QPS.insert(p);
    ctx.objects().qps.insert(qpn, p as usize);
    Ok(p)
}

/// `ibv_create_qp`: NULL + errno; `attr->cap` gets the granted capacities.
///
/// # Safety
/// `attr` is NULL or a valid `ibv_qp_init_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(pd: *mut IbvPd, attr: *mut IbvQpInitAttr) -> *mut IbvQp {
    ffi::ptr_or_null(|| {
        let mut a = ffi::non_null(attr)?;
        // SAFETY: non-null, the caller's init attributes.
        let a = unsafe { a.as_mut() };
        create(
            pd,
            a.qp_context,
            a.send_cq,
            a.recv_cq,
            a.srq,
            &mut a.cap,
            a.qp_type,
            a.sq_sig_all,
            0,
        )
        .map(|p| p.cast::<IbvQp>())
    })
}

/// `verbs_context.create_qp_ex` (the inline `ibv_create_qp_ex`): the PD form only; the
/// `ibv_wr_*` send API (`IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`) is not offered.
///
/// # Safety
/// Called by libibverbs' inline verbs with the application's arguments; pointers are only
/// dereferenced after they are found to be live objects of ours (or, for WR lists and
/// output arrays, as the verb's contract makes them valid).
pub unsafe extern "C" fn create_qp_ex(
    context: *mut IbvContext,
    attr: *mut IbvQpInitAttrEx,
) -> *mut IbvQp {
    ffi::ptr_or_null(|| {
        runtime::context_from_ptr(context)?;
        let mut a = ffi::non_null(attr)?;
        // SAFETY: non-null, the caller's extended init attributes.
        let a = unsafe { a.as_mut() };
        if a.comp_mask & QP_INIT_ATTR_PD == 0 {
            return Err(Errno::INVAL);
        }
        let known = QP_INIT_ATTR_PD | QP_INIT_ATTR_CREATE_FLAGS | QP_INIT_ATTR_SEND_OPS_FLAGS;
        // No creation flags are offered (as rxe); an empty set is fine.
        if a.comp_mask & !known != 0
            || (a.comp_mask & QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0)
        {
            return Err(Errno::OPNOTSUPP);
        }
        let send_ops = if a.comp_mask & QP_INIT_ATTR_SEND_OPS_FLAGS != 0 {
            if a.send_ops_flags == 0 {
                return Err(Errno::INVAL);
            }
            a.send_ops_flags
        } else {
            0
        };
        create(
            a.pd,
            a.qp_context,
            a.send_cq,
            a.recv_cq,
            a.srq,
            &mut a.cap,
            a.qp_type,
            a.sq_sig_all,
            send_ops,
        )
        .map(|p| p.cast::<IbvQp>())
    })
}

/// `ibv_qp_to_qp_ex`: the QP's `ibv_qp_ex` (same address) if it was created for the
/// `ibv_wr_*` API, else NULL (as libibverbs for QPs without `VERBS_QP_EX`).
///
/// # Safety
/// `qp` is NULL or any pointer.
#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut IbvQp) -> *mut IbvQpEx {
    match qp_from_ptr(qp) {
        Ok(s) if s.send_ops != 0 => qp.cast::<IbvQpEx>(),
        _ => ptr::null_mut(),
    }
}

/// `struct ibv_ah_attr` as the control protocol carries it.
pub(crate) fn to_ctl_ah(a: &IbvAhAttr) -> ctl::AhAttr {
    ctl::AhAttr {
        dgid: a.grh.dgid.raw,
        flow_label: a.grh.flow_label,
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        is_global: a.is_global != 0,
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        port_num: a.port_num,
    }
}

/// `struct ibv_qp_attr` from the protocol's form, with `cap` as the caller reports it
/// (`ibv_query_qp` answers the QP's own capabilities, `rdma_init_qp_attr` the daemon's).
pub(crate) fn qp_attr_from_ctl(a: &ctl::QpAttr, cap: IbvQpCap) -> IbvQpAttr {
    IbvQpAttr {
        qp_state: a.qp_state as c_int,
        cur_qp_state: a.cur_qp_state as c_int,
        path_mtu: a.path_mtu as c_int,
        path_mig_state: a.path_mig_state as c_int,
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: a.qp_access_flags,
        cap,
        ah_attr: from_ctl_ah(&a.ah_attr),
        pkey_index: a.pkey_index,
        en_sqd_async_notify: a.en_sqd_async_notify,
        sq_draining: a.sq_draining,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        ..IbvQpAttr::default()
    }
}

pub(crate) fn from_ctl_ah(a: &ctl::AhAttr) -> IbvAhAttr {
    IbvAhAttr {
        grh: IbvGlobalRoute {
            dgid: IbvGid { raw: a.dgid },
            flow_label: a.flow_label,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
        },
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: u8::from(a.is_global),
        port_num: a.port_num,
    }
}

/// `ibv_modify_qp`: 0 or errno; `qp->state` follows a successful state change.
///
/// # Safety
/// `attr` is NULL or a valid `ibv_qp_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(qp: *mut IbvQp, attr: *mut IbvQpAttr, mask: c_int) -> c_int {
    ffi::zero_or_errno(|| {
        let shim = qp_from_ptr(qp)?;
        let a = ffi::non_null(attr)?;
        // SAFETY: non-null, the caller's attributes.
        let a = unsafe { a.as_ref() };
        let ctx = shim.context()?;
        // A QP whose requester runs here comes back to the daemon before it changes (the
        // daemon reclaims the peer's half of it itself).
        ctx.fast.give_back(ctx, shim.qp.qp_base.qp_num);
        let c = |v: c_int| v as u32;
        ctx.call_done(&Request::ModifyQp {
            qpn: shim.qp.qp_base.qp_num,
            attr: ctl::QpAttr {
                qp_state: c(a.qp_state),
                cur_qp_state: c(a.cur_qp_state),
                path_mtu: c(a.path_mtu),
                path_mig_state: c(a.path_mig_state),
                qkey: a.qkey,
                rq_psn: a.rq_psn,
                sq_psn: a.sq_psn,
                dest_qp_num: a.dest_qp_num,
                qp_access_flags: a.qp_access_flags,
                cap: ctl::QpCap {
                    max_send_wr: a.cap.max_send_wr,
                    max_recv_wr: a.cap.max_recv_wr,
                    max_send_sge: a.cap.max_send_sge,
                    max_recv_sge: a.cap.max_recv_sge,
                    max_inline_data: a.cap.max_inline_data,
                },
                ah_attr: to_ctl_ah(&a.ah_attr),
                pkey_index: a.pkey_index,
                en_sqd_async_notify: a.en_sqd_async_notify,
                sq_draining: a.sq_draining,
                max_rd_atomic: a.max_rd_atomic,
                max_dest_rd_atomic: a.max_dest_rd_atomic,
                min_rnr_timer: a.min_rnr_timer,
                port_num: a.port_num,
                timeout: a.timeout,
                retry_cnt: a.retry_cnt,
                rnr_retry: a.rnr_retry,
            },
            mask: mask as u32,
        })?;
        if mask & IBV_QP_STATE != 0 && a.qp_state == IBV_QPS_RESET {
            // RESET empties the queues (IBTA 10.3.1): nothing posted is outstanding any more.
            shim.rq_outstanding.store(0, Ordering::Release);
            // SAFETY: live QP; its CQ pointers were set at creation.
            let (send_cq, recv_cq, qpn) = unsafe { ((*qp).send_cq, (*qp).recv_cq, (*qp).qp_num) };
            for c in [send_cq, recv_cq] {
                if let Ok(c) = cq::cq_from_ptr(c) {
                    c.clean(qpn);
                }
            }
        }
        if mask & IBV_QP_STATE != 0 {
            // SAFETY: live QP; libibverbs' ibv_modify_qp updates qp->state the same way.
            unsafe { addr_of_mut!((*qp).state).write_volatile(a.qp_state) };
        }
        Ok(())
    })
}

/// `ibv_query_qp`: 0 or errno.
///
/// # Safety
/// `attr` and `init_attr` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut IbvQp,
    attr: *mut IbvQpAttr,
    mask: c_int,
    init_attr: *mut IbvQpInitAttr,
) -> c_int {
    ffi::zero_or_errno(|| {
        let shim = qp_from_ptr(qp)?;
        let out = ffi::non_null(attr)?;
        let init_out = ffi::non_null(init_attr)?;
        let ctx = shim.context()?;
        let (a, sq_sig_all) = match ctx
            .call(
                &Request::QueryQp {
                    qpn: shim.qp.qp_base.qp_num,
                    mask: mask as u32,
                },
                &[],
            )?
            .0
        {
            Response::QpAttr { attr, .. } => (attr, shim.sq_sig_all),
            _ => return Err(Errno::PROTO),
        };
        let cap = IbvQpCap {
            max_send_wr: shim.cap.max_send_wr,
            max_recv_wr: shim.cap.max_recv_wr,
            max_send_sge: shim.cap.max_send_sge,
            max_recv_sge: shim.cap.max_recv_sge,
            max_inline_data: shim.cap.max_inline_data,
        };
        let attr = qp_attr_from_ctl(&a, cap);
        let b = &shim.qp.qp_base;
        // SAFETY: both non-null and writable per the caller.
        unsafe {
            out.as_ptr().write(attr);
            init_out.as_ptr().write(IbvQpInitAttr {
                qp_context: b.qp_context,
                send_cq: b.send_cq,
                recv_cq: b.recv_cq,
                srq: b.srq,
                cap,
                qp_type: b.qp_type,
                sq_sig_all: c_int::from(sq_sig_all),
            });
        }
        if mask & IBV_QP_STATE != 0 {
            // SAFETY: live QP; libibverbs refreshes qp->state from a state query.
            unsafe { addr_of_mut!((*qp).state).write_volatile(attr.qp_state) };
        }
        Ok(())
    })
}

/// `ibv_destroy_qp`: 0 or errno; waits until the QP's async events are acknowledged.
///
/// # Safety
/// `qp` is NULL or any pointer.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut IbvQp) -> c_int {
    ffi::zero_or_errno(|| {
        let shim = qp_from_ptr(qp)?;
        let ctx = shim.context()?;
        let qpn = shim.qp.qp_base.qp_num;
        ctx.fast.give_back(ctx, qpn);
        super::released(ctx.call_done(&Request::DestroyQp { qpn }))?;
        ctx.objects().qps.remove(&qpn);
        // SAFETY: live QP; mutex/cond initialised statically.
        unsafe {
            wait_async_events_acked(
                addr_of_mut!((*qp).mutex),
                addr_of_mut!((*qp).cond),
                addr_of_mut!((*qp).events_completed),
                &shim.events_reported,
            )
        };
        if !QPS.remove(qp) {
            return Err(Errno::INVAL);
        }
        // SAFETY: from Box::into_raw in `create`, unregistered just now.
        drop(unsafe { Box::from_raw(qp.cast::<ShimQp>()) });
        Ok(())
    })
}

/// A receive completion of `qpn` was polled: its WQE no longer occupies the receive queue.
pub(crate) fn receive_completed(ctx: &ShimContext, qpn: u32) {
    let Some(addr) = ctx.objects().qps.get(&qpn).copied() else {
        return;
    };
    if let Ok(q) = qp_from_ptr(addr as *mut IbvQp) {
        let _ = q
            .rq_outstanding
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }
}

/// Acknowledges one async event of `qp`.
pub(crate) fn ack_async_event(qp: *mut IbvQp) {
    if !QPS.contains(qp) {
        return;
    }
    // SAFETY: live QP; its mutex/cond are initialised.
    unsafe {
        ack_events(
            addr_of_mut!((*qp).mutex),
            addr_of_mut!((*qp).cond),
            addr_of_mut!((*qp).events_completed),
            1,
        )
    };
}

/// Waits, under the object's mutex, until the application acknowledged every async event
/// reported for it: rdma-core's destroy verbs block the same way, so an `ibv_async_event`
/// the application still holds never names freed memory.
///
/// # Safety
/// `mutex`, `cond` and `completed` point into a live object whose mutex and condition
/// variable are initialised; `completed` is only changed under `mutex`.
pub(crate) unsafe fn wait_async_events_acked(
    mutex: *mut libc::pthread_mutex_t,
    cond: *mut libc::pthread_cond_t,
    completed: *const u32,
    reported: &AtomicU32,
) {
    // SAFETY: per the contract; `completed` is re-read after every wake-up.
    unsafe {
        libc::pthread_mutex_lock(mutex);
        while *completed != reported.load(Ordering::Acquire) {
            libc::pthread_cond_wait(cond, mutex);
        }
        libc::pthread_mutex_unlock(mutex);
    }
}

/// Adds `n` acknowledged events to `completed` under the object's mutex and wakes a
/// destroy waiting in [`wait_async_events_acked`] (or the CQ's own wait).
///
/// # Safety
/// As for [`wait_async_events_acked`], with `completed` writable.
pub(crate) unsafe fn ack_events(
    mutex: *mut libc::pthread_mutex_t,
    cond: *mut libc::pthread_cond_t,
    completed: *mut u32,
    n: u32,
) {
    // SAFETY: per the contract.
    unsafe {
        libc::pthread_mutex_lock(mutex);
        *completed = (*completed).wrapping_add(n);
        libc::pthread_cond_signal(cond);
        libc::pthread_mutex_unlock(mutex);
    }
}

fn mcast(qp: *mut IbvQp, gid: *const IbvGid, attach: bool) -> Result<(), Errno> {
    let shim = qp_from_ptr(qp)?;
    let gid = ffi::non_null_const(gid)?;
    // SAFETY: non-null, the caller's GID.
    let gid = unsafe { gid.as_ref() }.raw;
    let qpn = shim.qp.qp_base.qp_num;
    shim.context()?.call_done(&if attach {
        Request::AttachMcast { qpn, gid }
    } else {
        Request::DetachMcast { qpn, gid }
    })
}

/// `ibv_attach_mcast`: 0 or errno.
///
/// # Safety
/// `gid` is NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(qp: *mut IbvQp, gid: *const IbvGid, _lid: u16) -> c_int {
    ffi::zero_or_errno(|| mcast(qp, gid, true))
}

/// `ibv_detach_mcast`: 0 or errno.
///
/// # Safety
/// `gid` is NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(qp: *mut IbvQp, gid: *const IbvGid, _lid: u16) -> c_int {
    ffi::zero_or_errno(|| mcast(qp, gid, false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::ring::RingGeometry;

    /// A QP of `qp_type` in RTS over a private send ring, and a consumer end to read back
    /// what was posted.
    fn qp(qp_type: c_int, sq_sig_all: bool) -> (ShimQp, SharedRing) {
        let g = RingGeometry::new(4, 64 + 64).unwrap();
        let (fd, len) = crate::shm::test_region(g);
        let map = Mapping::map(&fd, len).unwrap();
        let place = ctl::RingPlace {
            offset: 0,
            slot_size: g.slot_size,
            slot_count: g.slot_count,
        };
        let sq = map.ring(&place, true).unwrap();
        let consumer = map.ring(&place, false).unwrap();
        // SAFETY: all-zero is a valid ibv_qp_ex (null pointers, zero counts, a zeroed
        // pthread mutex/cond is the static initialiser on glibc).
        let mut q: IbvQpEx = unsafe { std::mem::zeroed() };
        q.qp_base.qp_type = qp_type;
        q.qp_base.state = IBV_QPS_RTS;
        let shim = ShimQp {
            qp: q,
            cap: ctl::QpCap {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 2,
                max_recv_sge: 1,
                max_inline_data: 64,
            },
            sq_sig_all,
            sq: Mutex::new(Producer::new(sq)),
            rq: None,
            events_reported: AtomicU32::new(0),
            rq_outstanding: AtomicU32::new(0),
            send_ops: 0,
            batch: Mutex::new(WrBatch::default()),
            doorbell: 0,
            _map: Arc::new(map),
        };
        (shim, consumer)
    }

    fn wr(opcode: c_int, sges: &mut [IbvSge], flags: u32) -> IbvSendWr {
        // SAFETY: all-zero is a valid ibv_send_wr.
        let mut w: IbvSendWr = unsafe { std::mem::zeroed() };
        w.wr_id = 77;
        w.opcode = opcode;
        w.sg_list = sges.as_mut_ptr();
        w.num_sge = sges.len() as c_int;
        w.send_flags = flags;
        w
    }

    fn post(q: &ShimQp, w: &IbvSendWr) -> Result<bool, Errno> {
        q.post_send_one(&mut lock(&q.sq), w)
    }

    #[test]
    fn send_wrs_are_validated_as_rxe_does() {
        let (rc, _) = qp(IBV_QPT_RC, false);
        let mut one = [IbvSge {
            addr: 0x1000,
            length: 8,
            lkey: 5,
        }];
        assert_eq!(post(&rc, &wr(99, &mut one, 0)), Err(Errno::INVAL), "opcode");
        assert_eq!(
            post(&rc, &wr(IBV_WR_TSO, &mut one, 0)),
            Err(Errno::INVAL),
            "TSO"
        );
        let mut three = [one[0]; 3];
        assert_eq!(
            post(&rc, &wr(IBV_WR_SEND, &mut three, 0)),
            Err(Errno::INVAL),
            "more SGEs than max_send_sge"
        );
        let big = [0u8; 65];
        let mut inline = [IbvSge {
            addr: big.as_ptr() as u64,
            length: 65,
            lkey: 0,
        }];
        assert_eq!(
            post(&rc, &wr(IBV_WR_SEND, &mut inline, IBV_SEND_INLINE)),
            Err(Errno::INVAL),
            "inline above max_inline_data"
        );
        assert_eq!(
            post(&rc, &wr(IBV_WR_SEND, &mut one, 1 << 20)),
            Err(Errno::INVAL),
            "unknown send flag"
        );

        let (ud, _) = qp(IBV_QPT_UD, false);
        assert_eq!(
            post(&ud, &wr(IBV_WR_RDMA_WRITE, &mut one, 0)),
            Err(Errno::INVAL),
            "RDMA on UD"
        );
        assert_eq!(
            post(&ud, &wr(IBV_WR_SEND, &mut one, 0)),
            Err(Errno::INVAL),
            "UD send without one of our AHs"
        );
        let (uc, _) = qp(IBV_QPT_UC, false);
        assert_eq!(
            post(&uc, &wr(IBV_WR_RDMA_READ, &mut one, 0)),
            Err(Errno::INVAL),
            "READ on UC"
        );
    }

    #[test]
    fn posted_wrs_reach_the_ring_with_inline_data_copied_and_full_is_enomem() {
        let (rc, mut consumer) = qp(IBV_QPT_RC, true);
        let mut data = *b"inline payload";
        let mut inline = [IbvSge {
            addr: data.as_mut_ptr() as u64,
            length: data.len() as u32,
            lkey: 0,
        }];
        let mut w = wr(IBV_WR_SEND_WITH_IMM, &mut inline, IBV_SEND_INLINE);
        w.imm_data = 0x0102_0304u32.to_be();
        assert_eq!(
            post(&rc, &w),
            Ok(false),
            "the consumer is awake: no doorbell"
        );
        data.fill(b'X'); // the WQE holds its own copy
        let mut write_sges = [
            IbvSge {
                addr: 0x1000,
                length: 100,
                lkey: 7,
            },
            IbvSge {
                addr: 0x2000,
                length: 50,
                lkey: 8,
            },
        ];
        let mut rdma = wr(IBV_WR_RDMA_WRITE, &mut write_sges, 0);
        rdma.wr.rdma = IbvSendWrRdma {
            remote_addr: 0xdead_0000,
            rkey: 0x42,
        };
        assert_eq!(post(&rc, &rdma), Ok(false));

        let mut slot = vec![0u8; consumer.geometry().slot_size as usize];
        let mut sges = [wqe::Sge::default(); wqe::MAX_SGE];
        assert_eq!(consumer.pop(&mut slot), Ok(true));
        let got = SendWqe::decode(&slot, 2, 64, &mut sges).unwrap();
        assert_eq!(got.wr_id, 77);
        assert_eq!(got.opcode, WrOpcode::SendWithImm);
        assert_eq!(
            got.imm_or_inv,
            0x0102_0304u32.to_be(),
            "the bytes as stored"
        );
        assert_eq!(got.data, SendData::Inline(b"inline payload"));
        assert!(
            got.flags & wqe::send_flags::SIGNALED != 0,
            "sq_sig_all signals every WR"
        );
        assert_eq!(consumer.pop(&mut slot), Ok(true));
        let got = SendWqe::decode(&slot, 2, 64, &mut sges).unwrap();
        assert_eq!(got.opcode, WrOpcode::RdmaWrite);
        assert_eq!((got.remote_addr, got.rkey), (0xdead_0000, Rkey(0x42)));
        let SendData::Sges(s) = got.data else {
            panic!("expected SGEs")
        };
        assert_eq!(s.len(), 2);
        assert_eq!((s[1].addr, s[1].length, s[1].lkey), (0x2000, 50, Lkey(8)));

        for _ in 0..4 {
            assert!(post(&rc, &rdma).is_ok());
        }
        assert_eq!(post(&rc, &rdma), Err(Errno::NOMEM), "a full send queue");
        // The consumer drains the ring and sleeps: the next post asks for the doorbell.
        while consumer.pop(&mut slot) == Ok(true) {}
        assert_eq!(consumer.consumer_prepare_sleep(), Ok(false));
        assert_eq!(post(&rc, &rdma), Ok(true));
    }
}
