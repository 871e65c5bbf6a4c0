//! The `ibv_wr_*` send API of QPs created with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`: between
//! `ibv_wr_start` and `ibv_wr_complete` each `ibv_wr_<op>` begins a work request and the
//! `ibv_wr_set_*` calls give it data and a UD destination; `ibv_wr_complete` posts the batch
//! through the same validation and ring as `ibv_post_send`. Errors met while building (an
//! opcode the QP was not created for, too many SGEs, too much inline data) are remembered and
//! returned by `ibv_wr_complete`, which then posts nothing, like rxe's provider.

use std::sync::{Mutex, MutexGuard};

use libc::{c_int, c_void, size_t};

use crate::abi::*;
use crate::ffi::Errno;
use crate::verbs::qp::{self, ShimQp};

/// `struct ibv_data_buf`.
#[repr(C)]
pub struct IbvDataBuf {
    pub addr: *mut c_void,
    pub length: size_t,
}

// enum ibv_qp_create_send_ops_flags
pub const WITH_RDMA_WRITE: u64 = 1 << 0;
pub const WITH_RDMA_WRITE_WITH_IMM: u64 = 1 << 1;
pub const WITH_SEND: u64 = 1 << 2;
pub const WITH_SEND_WITH_IMM: u64 = 1 << 3;
pub const WITH_RDMA_READ: u64 = 1 << 4;
pub const WITH_ATOMIC_CMP_AND_SWP: u64 = 1 << 5;
pub const WITH_ATOMIC_FETCH_AND_ADD: u64 = 1 << 6;
pub const WITH_LOCAL_INV: u64 = 1 << 7;
pub const WITH_BIND_MW: u64 = 1 << 8;
pub const WITH_SEND_WITH_INV: u64 = 1 << 9;
pub const WITH_ATOMIC_WRITE: u64 = 1 << 12;

/// The `send_ops_flags` a QP of `qp_type` may be created with: rxe's sets (rdma-core 44,
/// `providers/rxe`): everything but TSO and XRC on RC, the IBTA 1.5 atomic write included
/// (kernel rxe runs it since Linux 6.2; rdma-core 44 has no flush verb); no reads, atomics or
/// invalidations on UC; sends only on UD. Anything else is `EOPNOTSUPP`.
pub fn supported(qp_type: c_int) -> u64 {
    const UD: u64 = WITH_SEND | WITH_SEND_WITH_IMM;
    const UC: u64 =
        UD | WITH_RDMA_WRITE | WITH_RDMA_WRITE_WITH_IMM | WITH_BIND_MW | WITH_SEND_WITH_INV;
    const RC: u64 = UC
        | WITH_RDMA_READ
        | WITH_ATOMIC_CMP_AND_SWP
        | WITH_ATOMIC_FETCH_AND_ADD
        | WITH_LOCAL_INV
        | WITH_ATOMIC_WRITE;
    match qp_type {
        IBV_QPT_RC => RC,
        IBV_QPT_UC => UC,
        IBV_QPT_UD => UD,
        _ => 0,
    }
}

/// One work request being built.
pub struct BuiltWr {
    pub wr: IbvSendWr,
    pub sges: Vec<IbvSge>,
    pub inline: Option<Vec<u8>>,
}

/// The batch between `wr_start` and `wr_complete`.
#[derive(Default)]
pub struct WrBatch {
    pub wrs: Vec<BuiltWr>,
    pub error: Option<Errno>,
}

// SAFETY: the raw pointers inside (the bind window, the AH) are only handles the post path
// checks against the registries; the batch is always behind a Mutex.
unsafe impl Send for WrBatch {}

fn lock(m: &Mutex<WrBatch>) -> MutexGuard<'_, WrBatch> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The QP behind an `ibv_qp_ex *` (same address), if it is ours and has the API.
fn shim(qp: *mut IbvQpEx) -> Option<&'static ShimQp> {
    qp::qp_from_ptr(qp.cast::<IbvQp>())
        .ok()
        .filter(|q| q.send_ops != 0)
}

/// Begins a new WR of `opcode` (if the QP was created for it) and lets `fill` set its fields.
fn begin(qp: *mut IbvQpEx, opcode: c_int, needed: u64, fill: impl FnOnce(&mut IbvSendWr)) {
    let Some(s) = shim(qp) else { return };
    let mut batch = lock(&s.batch);
    if s.send_ops & needed == 0 {
        batch.error.get_or_insert(Errno::INVAL);
        return;
    }
    // SAFETY: an all-zero ibv_send_wr (null pointers, zero counts and unions) is valid.
    let mut wr: IbvSendWr = unsafe { std::mem::zeroed() };
    wr.wr_id = s.qp.wr_id;
    wr.send_flags = s.qp.wr_flags;
    wr.opcode = opcode;
    fill(&mut wr);
    batch.wrs.push(BuiltWr {
        wr,
        sges: Vec::new(),
        inline: None,
    });
}

/// Applies `f` to the WR being built; using a setter before any `ibv_wr_<op>` is an error.
fn current(qp: *mut IbvQpEx, f: impl FnOnce(&mut BuiltWr)) {
    let Some(s) = shim(qp) else { return };
    let mut batch = lock(&s.batch);
    match batch.wrs.last_mut() {
        Some(w) => f(w),
        None => {
            batch.error.get_or_insert(Errno::INVAL);
        }
    }
}

unsafe extern "C" fn wr_start(qp: *mut IbvQpEx) {
    if let Some(s) = shim(qp) {
        *lock(&s.batch) = WrBatch::default();
    }
}

unsafe extern "C" fn wr_complete(qp: *mut IbvQpEx) -> c_int {
    let Some(s) = shim(qp) else {
        return libc::EINVAL;
    };
    let batch = std::mem::take(&mut *lock(&s.batch));
    if let Some(e) = batch.error {
        return e.0;
    }
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.post_built(batch.wrs)))
        .unwrap_or(Err(Errno::IO))
        .err()
        .map_or(0, |e| e.0)
}

unsafe extern "C" fn wr_abort(qp: *mut IbvQpEx) {
    if let Some(s) = shim(qp) {
        *lock(&s.batch) = WrBatch::default();
    }
}

unsafe extern "C" fn wr_send(qp: *mut IbvQpEx) {
    begin(qp, IBV_WR_SEND, WITH_SEND, |_| {});
}

unsafe extern "C" fn wr_send_imm(qp: *mut IbvQpEx, imm: u32) {
    begin(qp, IBV_WR_SEND_WITH_IMM, WITH_SEND_WITH_IMM, |w| {
        w.imm_data = imm
    });
}

unsafe extern "C" fn wr_send_inv(qp: *mut IbvQpEx, rkey: u32) {
    begin(qp, IBV_WR_SEND_WITH_INV, WITH_SEND_WITH_INV, |w| {
        w.imm_data = rkey
    });
}

unsafe extern "C" fn wr_rdma_write(qp: *mut IbvQpEx, rkey: u32, remote_addr: u64) {
    begin(qp, IBV_WR_RDMA_WRITE, WITH_RDMA_WRITE, |w| {
        w.wr.rdma = IbvSendWrRdma { remote_addr, rkey }
    });
}

unsafe extern "C" fn wr_rdma_write_imm(qp: *mut IbvQpEx, rkey: u32, remote_addr: u64, imm: u32) {
    begin(
        qp,
        IBV_WR_RDMA_WRITE_WITH_IMM,
        WITH_RDMA_WRITE_WITH_IMM,
        |w| {
            w.wr.rdma = IbvSendWrRdma { remote_addr, rkey };
            w.imm_data = imm;
        },
    );
}

unsafe extern "C" fn wr_rdma_read(qp: *mut IbvQpEx, rkey: u32, remote_addr: u64) {
    begin(qp, IBV_WR_RDMA_READ, WITH_RDMA_READ, |w| {
        w.wr.rdma = IbvSendWrRdma { remote_addr, rkey }
    });
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qp: *mut IbvQpEx,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    begin(
        qp,
        IBV_WR_ATOMIC_CMP_AND_SWP,
        WITH_ATOMIC_CMP_AND_SWP,
        |w| {
            w.wr.atomic = IbvSendWrAtomic {
                remote_addr,
                compare_add: compare,
                swap,
                rkey,
            }
        },
    );
}

unsafe extern "C" fn wr_atomic_fetch_add(qp: *mut IbvQpEx, rkey: u32, remote_addr: u64, add: u64) {
    begin(
        qp,
        IBV_WR_ATOMIC_FETCH_AND_ADD,
        WITH_ATOMIC_FETCH_AND_ADD,
        |w| {
            w.wr.atomic = IbvSendWrAtomic {
                remote_addr,
                compare_add: add,
                swap: 0,
                rkey,
            }
        },
    );
}

/// `ibv_wr_atomic_write`: the 8 bytes at `atomic_wr` land at `remote_addr` as one unit (IBTA
/// 1.5 §9.4.7: RDMA ATOMIC WRITE, 8-byte aligned). They are read now, as rxe's provider
/// copies them into the WQE, so the caller may reuse its buffer once the call returns.
unsafe extern "C" fn wr_atomic_write(
    qp: *mut IbvQpEx,
    rkey: u32,
    remote_addr: u64,
    atomic_wr: *const c_void,
) {
    if atomic_wr.is_null() {
        return fail(qp, Errno::INVAL);
    }
    // SAFETY: non-null; the verb's contract makes it 8 readable bytes (any alignment). The
    // bytes are kept in their order: the engine sends `value`'s native bytes.
    let value = u64::from_ne_bytes(unsafe { atomic_wr.cast::<[u8; 8]>().read_unaligned() });
    begin(qp, IBV_WR_ATOMIC_WRITE, WITH_ATOMIC_WRITE, |w| {
        w.wr.atomic = IbvSendWrAtomic {
            remote_addr,
            compare_add: value,
            swap: 0,
            rkey,
        }
    });
}

unsafe extern "C" fn wr_local_inv(qp: *mut IbvQpEx, rkey: u32) {
    begin(qp, IBV_WR_LOCAL_INV, WITH_LOCAL_INV, |w| w.imm_data = rkey);
}

unsafe extern "C" fn wr_bind_mw(
    qp: *mut IbvQpEx,
    mw: *mut c_void,
    rkey: u32,
    info: *const IbvMwBindInfo,
) {
    if info.is_null() {
        return fail(qp, Errno::INVAL);
    }
    // SAFETY: non-null, the caller's bind info.
    let bind_info = unsafe { *info };
    begin(qp, IBV_WR_BIND_MW, WITH_BIND_MW, |w| {
        w.ext.bind_mw = IbvSendWrBindMw {
            mw,
            rkey,
            bind_info,
        }
    });
}

/// Unsupported operations (TSO, XRC): the batch fails.
unsafe extern "C" fn wr_unsupported(qp: *mut IbvQpEx) {
    fail(qp, Errno::OPNOTSUPP);
}

/// Remembers the batch's first error, for `ibv_wr_complete` (which then posts nothing).
fn fail(qp: *mut IbvQpEx, e: Errno) {
    if let Some(s) = shim(qp) {
        lock(&s.batch).error.get_or_insert(e);
    }
}

unsafe extern "C" fn wr_set_sge(qp: *mut IbvQpEx, lkey: u32, addr: u64, length: u32) {
    current(qp, |w| {
        w.sges = vec![IbvSge { addr, length, lkey }];
        w.inline = None;
    });
}

unsafe extern "C" fn wr_set_sge_list(qp: *mut IbvQpEx, num_sge: size_t, list: *const IbvSge) {
    current(qp, |w| {
        w.inline = None;
        w.sges = if num_sge == 0 || list.is_null() {
            Vec::new()
        } else {
            // SAFETY: the caller's list of num_sge SGEs.
            unsafe { std::slice::from_raw_parts(list, num_sge) }.to_vec()
        };
    });
}

unsafe extern "C" fn wr_set_inline_data(qp: *mut IbvQpEx, addr: *mut c_void, length: size_t) {
    current(qp, |w| {
        let bytes = if length == 0 || addr.is_null() {
            Vec::new()
        } else {
            // SAFETY: the caller's buffer of `length` bytes, copied now as the API requires.
            unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), length) }.to_vec()
        };
        w.inline = Some(bytes);
        w.sges.clear();
    });
}

unsafe extern "C" fn wr_set_inline_data_list(
    qp: *mut IbvQpEx,
    num_buf: size_t,
    list: *const IbvDataBuf,
) {
    current(qp, |w| {
        let mut bytes = Vec::new();
        if !list.is_null() {
            // SAFETY: the caller's list of num_buf buffers.
            for b in unsafe { std::slice::from_raw_parts(list, num_buf) } {
                if !b.addr.is_null() {
                    // SAFETY: each buffer holds `length` readable bytes.
                    bytes.extend_from_slice(unsafe {
                        std::slice::from_raw_parts(b.addr.cast::<u8>(), b.length)
                    });
                }
            }
        }
        w.inline = Some(bytes);
        w.sges.clear();
    });
}

unsafe extern "C" fn wr_set_ud_addr(
    qp: *mut IbvQpEx,
    ah: *mut IbvAh,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    current(qp, |w| {
        w.wr.wr.ud = IbvSendWrUd {
            ah,
            remote_qpn,
            remote_qkey,
        }
    });
}

/// Fills the `wr_*` slots of a QP created with send ops.
pub fn install(q: &mut IbvQpEx) {
    q.wr_start = wr_start as *mut c_void;
    q.wr_complete = wr_complete as *mut c_void;
    q.wr_abort = wr_abort as *mut c_void;
    q.wr_send = wr_send as *mut c_void;
    q.wr_send_imm = wr_send_imm as *mut c_void;
    q.wr_send_inv = wr_send_inv as *mut c_void;
    q.wr_rdma_write = wr_rdma_write as *mut c_void;
    q.wr_rdma_write_imm = wr_rdma_write_imm as *mut c_void;
    q.wr_rdma_read = wr_rdma_read as *mut c_void;
    q.wr_atomic_cmp_swp = wr_atomic_cmp_swp as *mut c_void;
    q.wr_atomic_fetch_add = wr_atomic_fetch_add as *mut c_void;
    q.wr_local_inv = wr_local_inv as *mut c_void;
    q.wr_bind_mw = wr_bind_mw as *mut c_void;
    q.wr_send_tso = wr_unsupported as *mut c_void;
    q.wr_set_xrc_srqn = wr_unsupported as *mut c_void;
    q.wr_atomic_write = wr_atomic_write as *mut c_void;
    q.wr_set_sge = wr_set_sge as *mut c_void;
    q.wr_set_sge_list = wr_set_sge_list as *mut c_void;
    q.wr_set_inline_data = wr_set_inline_data as *mut c_void;
    q.wr_set_inline_data_list = wr_set_inline_data_list as *mut c_void;
    q.wr_set_ud_addr = wr_set_ud_addr as *mut c_void;
}
