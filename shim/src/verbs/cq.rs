//! Completion queues: the daemon produces `struct ibv_wc` images into a shared ring, the
//! application's `ibv_poll_cq` copies them out with no system call. CQs are allocated as
//! `ibv_cq_ex` (rdma-core 44 providers do the same), so `ibv_cq_ex_to_cq` / the extended
//! polling API work on every CQ.

use std::collections::VecDeque;
use std::ptr::{self, addr_of_mut};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};

use libc::{c_int, c_uint, c_void};
use proto::ctl::{Request, Response};
use proto::ring::wqe::IBV_WC_LEN;
use proto::ring::SharedRing;

use crate::abi::*;
use crate::ffi::{self, Errno};
use crate::runtime::{self, ShimContext, COMP_CHANNELS, CQS};
use crate::shm::Mapping;
use crate::verbs::events::ShimCompChannel;
use crate::verbs::qp;

/// Largest CQ slot the shim accepts (the daemon uses 64 bytes).
const MAX_CQ_SLOT: usize = 256;

/// Empty polls of one CQ between two `sched_yield()`s (`SOFTROCE_POLL_YIELD`, default 4,
/// 0 = never).
///
/// Why: perftest and most RDMA programs spin on `ibv_poll_cq`. On a small machine the
/// spinners and the daemon share few CPUs, and a spinner that keeps its CPU while its CQ is
/// empty delays exactly the process (the daemon, or its peer) that would fill it: one-way
/// latency was ~45 µs with two spinners and the daemon on 2 vCPUs. Yielding after an empty
/// poll lets any runnable task on that CPU go first; with nothing else runnable it returns
/// at once (~0.3 µs), so a lone spinner loses almost nothing.
fn poll_yield_every() -> u32 {
    static EVERY: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *EVERY.get_or_init(|| {
        std::env::var("SOFTROCE_POLL_YIELD")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(4)
    })
}

/// Empty polls of a CQ whose last completion came from the same-host fast path before the
/// first `sched_yield()`. Such completions are made by a process (this one at its poll, or
/// the peer's), not by the daemon: two spinners on two CPUs, none waiting for this one's
/// CPU, and a yield only delays the poll that would see the peer's message (`ib_send_lat -s
/// 2` on the fast path, 8 alternating pairs of builds: median 1.85 µs against 2.27; after
/// 64 quiet polls instead of 512, no difference: a round trip outlasts 64). Past this
/// stretch (some 10-20 µs) the peer may be waiting for this CPU on a busy machine: yields
/// as usual. The daemon's path needs them at once (without, 2 ms: a scheduler tick).
const FAST_QUIET_POLLS: u32 = 512;

/// Counts a poll in `empty_polls` (consecutive empty ones; a completion starts over) and says
/// whether this one is an `every`-th empty one in a row past the first `quiet` (`every` 0:
/// never).
fn count_poll(empty_polls: &AtomicU32, found: bool, every: u32, quiet: u32) -> bool {
    if found {
        empty_polls.store(0, Ordering::Relaxed);
        return false;
    }
    let n = empty_polls.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
    every > 0 && n > quiet && n.is_multiple_of(every)
}

/// The consumer end of a CQ's completion ring, with the mapping it lives in and, after a
/// resize, what the old ring still held (taken before the new ring's entries).
struct CqRing {
    ring: SharedRing,
    carried: VecDeque<[u8; MAX_CQ_SLOT]>,
    /// Declared after `ring`, so the ring handle is gone before the memory is unmapped.
    _map: Mapping,
}

impl CqRing {
    fn arm(&self, solicited_only: bool) {
        self.ring.arm(solicited_only);
    }
}

/// The allocation behind an `ibv_cq *` / `ibv_cq_ex *` (same address).
#[repr(C)]
pub struct ShimCq {
    pub cq: IbvCqEx,
    pub handle: u32,
    /// Consumer end of the completion ring; the lock serialises pollers as a provider's CQ
    /// spinlock does.
    ring: Mutex<CqRing>,
    /// The completion the extended polling API (`ibv_start_poll` ..) currently points at.
    current: Mutex<IbvWc>,
    /// Completion events handed out by `ibv_get_cq_event` (what the kernel reports as
    /// `comp_events_reported`); `ibv_destroy_cq` waits until they are all acknowledged.
    comp_events_reported: AtomicU32,
    /// Async events (CQ errors) handed out for this CQ.
    pub async_events_reported: AtomicU32,
    /// Consecutive polls that found the ring empty (see [`poll_yield_every`]).
    empty_polls: AtomicU32,
    /// The last completion polled came from the same-host fast path (see
    /// [`FAST_QUIET_POLLS`]).
    fed_fast: AtomicBool,
    /// The daemon said no fast-path direction feeds this CQ again (`Response::CqEvents`).
    events_only: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Maps an `ibv_cq *` from a caller to our CQ.
pub fn cq_from_ptr<'a, T>(cq: *mut T) -> Result<&'a ShimCq, Errno> {
    if !CQS.contains(cq) {
        return Err(Errno::INVAL);
    }
    // SAFETY: registered, so it is the first member (same address) of a live Box<ShimCq>.
    Ok(unsafe { &*cq.cast::<ShimCq>() })
}

impl ShimCq {
    /// Counts one poll (`ibv_poll_cq`, `ibv_start_poll`/`ibv_next_poll`) and yields the CPU
    /// on every [`poll_yield_every`]-th consecutive one that found the ring empty (for a CQ
    /// fed by the fast path, only past the first [`FAST_QUIET_POLLS`]).
    fn polled(&self, found: bool) {
        let quiet = if self.fed_fast.load(Ordering::Relaxed) {
            FAST_QUIET_POLLS
        } else {
            0
        };
        if count_poll(&self.empty_polls, found, poll_yield_every(), quiet) {
            // SAFETY: no arguments; sched_yield cannot fail on Linux.
            unsafe { libc::sched_yield() };
        }
    }

    /// Drops the completions of QP `qpn` the CQ still holds (those the daemon wrote, read
    /// out of the ring into `carried` first): what a QP moved to RESET leaves behind, the
    /// flushed work of its error state, is gone from its CQs as on mlx5 (whose provider
    /// cleans the CQs at that transition), so that a program that resets a QP after an error
    /// and reuses its CQs does not poll the old flushes as its new work's completions.
    pub fn clean(&self, qpn: u32) {
        let mut ring = lock(&self.ring);
        let ring = &mut *ring;
        let mut slot = [0u8; MAX_CQ_SLOT];
        while let Ok(true) = ring.ring.pop(&mut slot) {
            ring.carried.push_back(slot);
        }
        const QP_NUM: usize = std::mem::offset_of!(IbvWc, qp_num);
        ring.carried.retain(|s| {
            u32::from_ne_bytes([s[QP_NUM], s[QP_NUM + 1], s[QP_NUM + 2], s[QP_NUM + 3]]) != qpn
        });
    }

    pub fn as_cq(&self) -> *mut IbvCq {
        (self as *const ShimCq).cast_mut().cast()
    }

    /// Copies the next completion into `out`; false when the ring is empty. `ctx` is this
    /// CQ's context, already looked up (and checked) by the caller once per poll rather than
    /// again for every receive completion.
    fn pop(&self, ctx: &ShimContext, ring: &mut CqRing, out: &mut IbvWc) -> Result<bool, Errno> {
        if ctx.fast.may_feed(&ring.ring) {
            // Completions of the same-host fast path come first (crate::fast: they are the
            // older ones of each queue).
            if let Some(c) = ctx.fast.poll_one(ctx, self.handle, &mut ring.ring) {
                let mut image = [0u8; IBV_WC_LEN];
                c.encode(&mut image);
                // SAFETY: IbvWc is plain data of IBV_WC_LEN bytes, `image` a `struct
                // ibv_wc` image (ring::wqe::Cqe).
                unsafe {
                    ptr::copy_nonoverlapping(
                        image.as_ptr(),
                        (out as *mut IbvWc).cast::<u8>(),
                        IBV_WC_LEN,
                    )
                };
                if out.opcode & IBV_WC_RECV != 0 {
                    qp::receive_completed(ctx, out.qp_num);
                }
                self.fed_fast.store(true, Ordering::Relaxed);
                return Ok(true);
            }
        }
        let mut slot = [0u8; MAX_CQ_SLOT];
        let popped = match ring.carried.pop_front() {
            Some(carried) => {
                slot = carried;
                Ok(true)
            }
            None => ring.ring.pop(&mut slot),
        };
        match popped {
            Ok(true) => {
                // SAFETY: IbvWc is plain data of IBV_WC_LEN bytes; the daemon wrote a
                // `struct ibv_wc` image (ring::wqe::Cqe) into the slot's first 48 bytes.
                unsafe {
                    ptr::copy_nonoverlapping(
                        slot.as_ptr(),
                        (out as *mut IbvWc).cast::<u8>(),
                        IBV_WC_LEN,
                    )
                };
                // Receive opcodes have bit 7 set (IBV_WC_RECV = 1 << 7); flushed receives too.
                if out.opcode & IBV_WC_RECV != 0 {
                    qp::receive_completed(ctx, out.qp_num);
                }
                self.fed_fast.store(false, Ordering::Relaxed);
                Ok(true)
            }
            Ok(false) => Ok(false),
            Err(_) => Err(Errno::IO),
        }
    }
}

fn channel_handle(channel: *mut IbvCompChannel) -> Result<Option<u32>, Errno> {
    if channel.is_null() {
        return Ok(None);
    }
    if !COMP_CHANNELS.contains(channel) {
        return Err(Errno::INVAL);
    }
    // SAFETY: registered, so the first member of a live ShimCompChannel.
    Ok(Some(unsafe { (*channel.cast::<ShimCompChannel>()).handle }))
}

/// `channel->refcnt` as an atomic (libibverbs changes it under the context mutex).
fn channel_refcnt<'a>(channel: *mut IbvCompChannel) -> &'a AtomicI32 {
    // SAFETY: callers pass a live channel; AtomicI32 has the layout of c_int.
    unsafe { &*addr_of_mut!((*channel).refcnt).cast::<AtomicI32>() }
}

#[allow(clippy::too_many_arguments)]
fn create(
    context: *mut IbvContext,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut IbvCompChannel,
    comp_vector: c_int,
    wc_flags: u64,
) -> Result<*mut ShimCq, Errno> {
    let ctx: &ShimContext = runtime::context_from_ptr(context)?;
    if cqe < 1 || comp_vector < 0 || comp_vector >= ctx.vctx.context.num_comp_vectors {
        return Err(Errno::INVAL);
    }
    if wc_flags & !IBV_WC_STANDARD_FLAGS != 0 {
        return Err(Errno::OPNOTSUPP);
    }
    let channel_handle = channel_handle(channel)?;
    let (resp, mut fds) = ctx.call(
        &Request::CreateCq {
            ctx: ctx.handle,
            cqe: cqe as u32,
            channel: channel_handle,
            comp_vector: comp_vector as u32,
        },
        &[],
    )?;
    let Response::Cq {
        cq: handle,
        cqe: granted,
        ring,
        region_len,
    } = resp
    else {
        return Err(Errno::PROTO);
    };
    let destroy = || {
        let _ = ctx.call_done(&Request::DestroyCq { cq: handle });
    };
    let attached = (|| {
        let fd = fds.pop().ok_or(Errno::PROTO)?;
        if ring.slot_size as usize > MAX_CQ_SLOT || (ring.slot_size as usize) < IBV_WC_LEN {
            return Err(Errno::PROTO);
        }
        let map = Mapping::map(&fd, region_len)?;
        let r = map.ring(&ring, false)?;
        Ok((map, r))
    })();
    let (map, ring) = match attached {
        Ok(x) => x,
        Err(e) => {
            destroy();
            return Err(e);
        }
    };
    let shim = Box::new(ShimCq {
        cq: IbvCqEx {
            context,
            channel,
            cq_context,
            handle,
            cqe: granted.min(i32::MAX as u32) as c_int,
            mutex: libc::PTHREAD_MUTEX_INITIALIZER,
            cond: libc::PTHREAD_COND_INITIALIZER,
            comp_events_completed: 0,
            async_events_completed: 0,
            comp_mask: 0,
            status: 0,
            wr_id: 0,
            start_poll: Some(start_poll),
            next_poll: Some(next_poll),
            end_poll: Some(end_poll),
            read_opcode: Some(read_opcode),
            read_vendor_err: Some(read_vendor_err),
            read_byte_len: Some(read_byte_len),
            read_imm_data: Some(read_imm_data),
            read_qp_num: Some(read_qp_num),
            read_src_qp: Some(read_src_qp),
            read_wc_flags: Some(read_wc_flags),
            read_slid: Some(read_slid),
            read_sl: Some(read_sl),
            read_dlid_path_bits: Some(read_dlid_path_bits),
            read_completion_ts: None,
            read_cvlan: None,
            read_flow_tag: None,
            read_tm_info: None,
            read_completion_wallclock_ns: None,
        },
        handle,
        ring: Mutex::new(CqRing {
            ring,
            carried: VecDeque::new(),
            _map: map,
        }),
        current: Mutex::new(IbvWc::default()),
        comp_events_reported: AtomicU32::new(0),
        async_events_reported: AtomicU32::new(0),
        empty_polls: AtomicU32::new(0),
        fed_fast: AtomicBool::new(false),
        events_only: AtomicBool::new(false),
    });
    if !channel.is_null() {
        channel_refcnt(channel).fetch_add(1, Ordering::AcqRel);
    }
    let p = Box::into_raw(shim);
    CQS.insert(p);
    ctx.objects().cqs.insert(handle, p as usize);
    Ok(p)
}

/// `ibv_create_cq`: NULL + errno.
///
/// # Safety
/// Pointers are NULL or anything (only used when they are live objects of ours).
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut IbvContext,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut IbvCompChannel,
    comp_vector: c_int,
) -> *mut IbvCq {
    ffi::ptr_or_null(|| {
        create(context, cqe, cq_context, channel, comp_vector, 0).map(|p| p.cast::<IbvCq>())
    })
}

/// `verbs_context.create_cq_ex` (what the inline `ibv_create_cq_ex` calls).
///
/// # Safety
/// Called by libibverbs' inline verbs with the application's arguments; pointers are only
/// dereferenced after they are found to be live objects of ours (or, for WR lists and
/// output arrays, as the verb's contract makes them valid).
pub unsafe extern "C" fn create_cq_ex(
    context: *mut IbvContext,
    attr: *mut IbvCqInitAttrEx,
) -> *mut IbvCqEx {
    ffi::ptr_or_null(|| {
        let a = ffi::non_null(attr)?;
        // SAFETY: non-null and, per the verb's contract, a readable ibv_cq_init_attr_ex.
        let a = unsafe { a.as_ref() };
        if a.comp_mask != 0 || a.flags != 0 {
            return Err(Errno::OPNOTSUPP);
        }
        let cqe = c_int::try_from(a.cqe).map_err(|_| Errno::INVAL)?;
        let comp_vector = c_int::try_from(a.comp_vector).map_err(|_| Errno::INVAL)?;
        create(
            context,
            cqe,
            a.cq_context,
            a.channel,
            comp_vector,
            a.wc_flags,
        )
        .map(|p| p.cast::<IbvCqEx>())
    })
}

/// `ibv_destroy_cq`: 0 or errno (`EBUSY` while QPs use it). Like libibverbs, waits until every
/// completion event handed out was acknowledged.
///
/// # Safety
/// `cq` is NULL or any pointer.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut IbvCq) -> c_int {
    ffi::zero_or_errno(|| {
        let shim = cq_from_ptr(cq)?;
        let ctx = runtime::context_from_ptr(shim.cq.context)?;
        super::released(ctx.call_done(&Request::DestroyCq { cq: shim.handle }))?;
        ctx.objects().cqs.remove(&shim.handle);
        // SAFETY: live CQ; the mutex and condition variable were initialised statically.
        unsafe {
            let p = cq.cast::<ShimCq>();
            libc::pthread_mutex_lock(addr_of_mut!((*p).cq.mutex));
            while (*p).cq.comp_events_completed != (*p).comp_events_reported.load(Ordering::Acquire)
                || (*p).cq.async_events_completed
                    != (*p).async_events_reported.load(Ordering::Acquire)
            {
                libc::pthread_cond_wait(addr_of_mut!((*p).cq.cond), addr_of_mut!((*p).cq.mutex));
            }
            libc::pthread_mutex_unlock(addr_of_mut!((*p).cq.mutex));
        }
        if !CQS.remove(cq) {
            return Err(Errno::INVAL);
        }
        let channel = shim.cq.channel;
        if !channel.is_null() && COMP_CHANNELS.contains(channel) {
            channel_refcnt(channel).fetch_sub(1, Ordering::AcqRel);
        }
        // SAFETY: from Box::into_raw in `create`, unregistered just now.
        drop(unsafe { Box::from_raw(cq.cast::<ShimCq>()) });
        Ok(())
    })
}

/// `ibv_resize_cq`: 0 or errno (EINVAL below the completions the CQ holds). The daemon
/// gives the CQ a new ring and writes only there from its answer on; what the old ring still
/// holds is kept here and polled first. `cq->cqe` becomes the granted depth.
///
/// # Safety
/// `cq` is NULL or any pointer.
#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut IbvCq, cqe: c_int) -> c_int {
    ffi::zero_or_errno(|| {
        let shim = cq_from_ptr(cq)?;
        let cqe = u32::try_from(cqe)
            .ok()
            .filter(|&n| n > 0)
            .ok_or(Errno::INVAL)?;
        let ctx = runtime::context_from_ptr(shim.cq.context)?;
        // No poll may run between the daemon's switch and ours.
        let mut ring = lock(&shim.ring);
        let (resp, mut fds) = ctx.call(
            &Request::ResizeCq {
                cq: shim.handle,
                cqe,
            },
            &[],
        )?;
        let Response::Cq {
            cqe: granted,
            ring: place,
            region_len,
            ..
        } = resp
        else {
            return Err(Errno::PROTO);
        };
        let fd = fds.pop().ok_or(Errno::PROTO)?;
        if place.slot_size as usize > MAX_CQ_SLOT || (place.slot_size as usize) < IBV_WC_LEN {
            return Err(Errno::PROTO);
        }
        let map = Mapping::map(&fd, region_len)?;
        let new = map.ring(&place, false)?;
        let mut carried = std::mem::take(&mut ring.carried);
        let mut slot = [0u8; MAX_CQ_SLOT];
        while let Ok(true) = ring.ring.pop(&mut slot) {
            carried.push_back(slot);
        }
        *ring = CqRing {
            ring: new,
            carried,
            _map: map,
        };
        // SAFETY: live CQ; `cqe` is the public field ibv_resize_cq updates (as providers do).
        unsafe { (*cq.cast::<ShimCq>()).cq.cqe = granted.min(i32::MAX as u32) as c_int };
        Ok(())
    })
}

/// `ctx->ops.poll_cq`: the number of completions copied, or -1.
///
/// # Safety
/// Called by libibverbs' inline verbs with the application's arguments; pointers are only
/// dereferenced after they are found to be live objects of ours (or, for WR lists and
/// output arrays, as the verb's contract makes them valid).
pub unsafe extern "C" fn poll_cq(cq: *mut IbvCq, n: c_int, wc: *mut IbvWc) -> c_int {
    ffi::int_or_minus_one(|| {
        let shim = cq_from_ptr(cq)?;
        if n < 0 || (n > 0 && wc.is_null()) {
            return Err(Errno::INVAL);
        }
        let ctx = runtime::context_from_ptr(shim.cq.context)?;
        ctx.data_path_ok()?;
        let mut ring = lock(&shim.ring);
        let mut got = 0;
        while got < n {
            let mut one = IbvWc::default();
            if !shim.pop(ctx, &mut ring, &mut one)? {
                break;
            }
            // SAFETY: the caller's array holds `n` entries and got < n.
            unsafe { wc.add(got as usize).write(one) };
            got += 1;
        }
        drop(ring);
        // A zero-entry poll is not an empty one (it asked for nothing).
        shim.polled(got > 0 || n == 0);
        Ok(got)
    })
}

/// `ctx->ops.req_notify_cq`: arms the CQ in shared memory; no system call, unless fast-path
/// directions have fed this CQ (`crate::fast`): only the daemon raises events, so it takes
/// them back and adds the CQ's completions itself until the event fired
/// (`Request::CqEventsWanted`).
///
/// # Safety
/// Called by libibverbs' inline verbs with the application's arguments; pointers are only
/// dereferenced after they are found to be live objects of ours (or, for WR lists and
/// output arrays, as the verb's contract makes them valid).
pub unsafe extern "C" fn req_notify_cq(cq: *mut IbvCq, solicited_only: c_int) -> c_int {
    ffi::zero_or_errno(|| {
        let shim = cq_from_ptr(cq)?;
        let fed = {
            let ring = lock(&shim.ring);
            ring.arm(solicited_only != 0);
            // Dekker with the daemon's grant, which counts the new source and then reads the
            // arm: one of the two sees the other.
            std::sync::atomic::fence(Ordering::SeqCst);
            ring.ring.fast_sources() != 0
        };
        if fed && !shim.cq.channel.is_null() && !shim.events_only.load(Ordering::Acquire) {
            let ctx = runtime::context_from_ptr(shim.cq.context)?;
            // This process's own directions into it first (the daemon would wait for them);
            // the daemon takes back the others'.
            ctx.fast.give_back_cq(ctx, shim.handle);
            match ctx
                .call(&Request::CqEventsWanted { cq: shim.handle }, &[])?
                .0
            {
                // No direction feeds it again: later arms are a store, as before any did.
                Response::CqEvents { events_only } => {
                    shim.events_only.store(events_only, Ordering::Release)
                }
                _ => return Err(Errno::PROTO),
            }
        }
        Ok(())
    })
}

/// `ibv_get_cq_event`: reads the next record from the channel's pipe (blocking unless the
/// app made it non-blocking), skips records of CQs destroyed since, and returns the CQ.
///
/// # Safety
/// `cq` and `cq_context` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut IbvCompChannel,
    cq: *mut *mut IbvCq,
    cq_context: *mut *mut c_void,
) -> c_int {
    ffi::int_or_minus_one(|| {
        if !COMP_CHANNELS.contains(channel) {
            return Err(Errno::INVAL);
        }
        let cq_out = ffi::non_null(cq)?;
        let ctx_out = ffi::non_null(cq_context)?;
        // SAFETY: registered channel.
        let (fd, context) = unsafe { ((*channel).fd, (*channel).context) };
        let ctx = runtime::context_from_ptr(context)?;
        loop {
            // The device is gone: EIO, as the kernel's event file of a removed device
            // answers, rather than a wait for events that cannot come.
            if ctx.data_path_ok().is_err() {
                return Err(Errno::IO);
            }
            let mut rec = [0u8; 8];
            let n = runtime::read_record(fd, &mut rec)?;
            if n != rec.len() {
                return Err(Errno::IO);
            }
            let handle = u32::from_ne_bytes([rec[0], rec[1], rec[2], rec[3]]);
            if handle == crate::verbs::events::DEVICE_LOST {
                continue; // checked at the top of the loop
            }
            let Some(addr) = ctx.objects().cqs.get(&handle).copied() else {
                continue; // the CQ was destroyed after the event was queued
            };
            let shim = cq_from_ptr(addr as *mut IbvCq)?;
            if shim.cq.channel != channel {
                continue;
            }
            shim.comp_events_reported.fetch_add(1, Ordering::AcqRel);
            // SAFETY: both non-null and writable per the caller.
            unsafe {
                cq_out.as_ptr().write(shim.as_cq());
                ctx_out.as_ptr().write(shim.cq.cq_context);
            }
            return Ok(0);
        }
    })
}

/// `ibv_ack_cq_events`: wakes an `ibv_destroy_cq` waiting for the acknowledgements.
///
/// # Safety
/// `cq` is NULL or any pointer.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut IbvCq, nevents: c_uint) {
    if !CQS.contains(cq) {
        return;
    }
    let p = cq.cast::<ShimCq>();
    // SAFETY: live CQ; its mutex/cond are initialised.
    unsafe {
        qp::ack_events(
            addr_of_mut!((*p).cq.mutex),
            addr_of_mut!((*p).cq.cond),
            addr_of_mut!((*p).cq.comp_events_completed),
            nevents,
        )
    };
}

/// Acknowledges one async event of `cq` (from `ibv_ack_async_event`).
pub(crate) fn ack_async_event(cq: *mut IbvCq) {
    if !CQS.contains(cq) {
        return;
    }
    let p = cq.cast::<ShimCq>();
    // SAFETY: live CQ; its mutex/cond are initialised.
    unsafe {
        qp::ack_events(
            addr_of_mut!((*p).cq.mutex),
            addr_of_mut!((*p).cq.cond),
            addr_of_mut!((*p).cq.async_events_completed),
            1,
        )
    };
}

// ---- extended polling (ibv_start_poll / ibv_next_poll / ibv_end_poll / ibv_wc_read_*) ----

/// Takes the next completion into `current`, and sets the CQ's `status`/`wr_id`.
fn advance(cq: *mut IbvCqEx) -> c_int {
    let Ok(shim) = cq_from_ptr(cq) else {
        return libc::EINVAL;
    };
    let ctx = match runtime::context_from_ptr(shim.cq.context) {
        Ok(c) => c,
        Err(e) => return e.0,
    };
    if let Err(e) = ctx.data_path_ok() {
        return e.0;
    }
    let mut wc = IbvWc::default();
    let got = {
        let mut ring = lock(&shim.ring);
        shim.pop(ctx, &mut ring, &mut wc)
    };
    match got {
        Ok(true) => {
            shim.polled(true);
            *lock(&shim.current) = wc;
            // SAFETY: live CQ; these two public fields are what ibv_cq_ex users read.
            unsafe {
                (*cq).status = wc.status;
                (*cq).wr_id = wc.wr_id;
            }
            0
        }
        Ok(false) => {
            shim.polled(false);
            libc::ENOENT
        }
        Err(e) => e.0,
    }
}

unsafe extern "C" fn start_poll(cq: *mut IbvCqEx, _attr: *mut c_void) -> c_int {
    std::panic::catch_unwind(|| advance(cq)).unwrap_or(libc::EIO)
}

unsafe extern "C" fn next_poll(cq: *mut IbvCqEx) -> c_int {
    std::panic::catch_unwind(|| advance(cq)).unwrap_or(libc::EIO)
}

unsafe extern "C" fn end_poll(_cq: *mut IbvCqEx) {}

fn current(cq: *mut IbvCqEx) -> IbvWc {
    cq_from_ptr(cq)
        .map(|s| *lock(&s.current))
        .unwrap_or_default()
}

unsafe extern "C" fn read_opcode(cq: *mut IbvCqEx) -> c_int {
    current(cq).opcode
}
unsafe extern "C" fn read_vendor_err(cq: *mut IbvCqEx) -> u32 {
    current(cq).vendor_err
}
unsafe extern "C" fn read_byte_len(cq: *mut IbvCqEx) -> u32 {
    current(cq).byte_len
}
unsafe extern "C" fn read_imm_data(cq: *mut IbvCqEx) -> u32 {
    current(cq).imm_data
}
unsafe extern "C" fn read_qp_num(cq: *mut IbvCqEx) -> u32 {
    current(cq).qp_num
}
unsafe extern "C" fn read_src_qp(cq: *mut IbvCqEx) -> u32 {
    current(cq).src_qp
}
unsafe extern "C" fn read_wc_flags(cq: *mut IbvCqEx) -> c_uint {
    current(cq).wc_flags
}
unsafe extern "C" fn read_slid(cq: *mut IbvCqEx) -> u32 {
    u32::from(current(cq).slid)
}
unsafe extern "C" fn read_sl(cq: *mut IbvCqEx) -> u8 {
    current(cq).sl
}
unsafe extern "C" fn read_dlid_path_bits(cq: *mut IbvCqEx) -> u8 {
    current(cq).dlid_path_bits
}

/// The context a CQ belongs to, for QP creation checks.
pub fn cq_context_handle(cq: *mut IbvCq) -> Result<(u32, *mut IbvContext), Errno> {
    let shim = cq_from_ptr(cq)?;
    Ok((shim.handle, shim.cq.context))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yields_count_consecutive_empty_polls_on_both_poll_paths() {
        let c = AtomicU32::new(0);
        let run = |found: &[bool]| -> Vec<bool> {
            found.iter().map(|&f| count_poll(&c, f, 4, 0)).collect()
        };
        assert_eq!(
            run(&[false, false, false, false]),
            [false, false, false, true]
        );
        // A completion starts the count over: three empty polls after it are not a fourth.
        assert_eq!(run(&[false, true, false, false, false]), [false; 5]);
        assert_eq!(run(&[false]), [true]);
        assert!(!count_poll(&c, false, 0, 0), "0 never yields");
    }

    #[test]
    fn a_cq_fed_by_the_fast_path_polls_quietly_first() {
        let c = AtomicU32::new(0);
        let yields: Vec<u32> = (1..=FAST_QUIET_POLLS + 16)
            .filter(|_| count_poll(&c, false, 4, FAST_QUIET_POLLS))
            .collect();
        assert_eq!(
            yields,
            [
                FAST_QUIET_POLLS + 4,
                FAST_QUIET_POLLS + 8,
                FAST_QUIET_POLLS + 12,
                FAST_QUIET_POLLS + 16
            ],
            "every fourth past the quiet stretch"
        );
        assert!(!count_poll(&c, true, 4, FAST_QUIET_POLLS));
        assert!(
            (1..=FAST_QUIET_POLLS).all(|_| !count_poll(&c, false, 4, FAST_QUIET_POLLS)),
            "a completion starts the quiet stretch over"
        );
    }
}
