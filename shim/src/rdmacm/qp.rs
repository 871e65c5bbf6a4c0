//! QPs, SRQs and CQs made for an id (`rdma_create_qp[_ex]`, `rdma_create_srq[_ex]`), and the
//! QP state changes librdmacm makes on the application's behalf with attributes from the
//! daemon's connection manager (`rdma_init_qp_attr` = `CmInitQpAttr`).

use std::ptr;

use libc::c_int;
use proto::ctl::{self, Request, Response};

use crate::abi::*;
use crate::ffi::Errno;
use crate::rdmacm::abi::*;
use crate::rdmacm::state::{self, call, ShimCmId};
use crate::verbs;

// enum ibv_qp_attr_mask bits used here.
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_QKEY: c_int = 1 << 6;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;

const QP_INIT_ATTR_PD: u32 = 1;
const SRQ_INIT_ATTR_TYPE: u32 = 1;
const SRQ_INIT_ATTR_PD: u32 = 2;

/// `struct ibv_qp_attr` from the protocol's form, with the daemon's capabilities.
fn qp_attr_from_ctl(a: &ctl::QpAttr) -> IbvQpAttr {
    let cap = IbvQpCap {
        max_send_wr: a.cap.max_send_wr,
        max_recv_wr: a.cap.max_recv_wr,
        max_send_sge: a.cap.max_send_sge,
        max_recv_sge: a.cap.max_recv_sge,
        max_inline_data: a.cap.max_inline_data,
    };
    verbs::qp::qp_attr_from_ctl(a, cap)
}

/// `rdma_init_qp_attr`: the daemon's attributes for moving the id's QP to `state`, with the
/// id's options applied (type of service, ACK timeout, minimum RNR timer), as the kernel's
/// `rdma_init_qp_attr` applies them.
pub fn init_qp_attr(id: &ShimCmId, state: c_int) -> Result<(IbvQpAttr, c_int), Errno> {
    let (attr, mask) = match call(&Request::CmInitQpAttr {
        id: id.handle,
        qp_state: u32::try_from(state).map_err(|_| Errno::INVAL)?,
    })?
    .0
    {
        Response::CmQpAttr { attr, mask } => (attr, mask as c_int),
        _ => return Err(Errno::PROTO),
    };
    let mut attr = qp_attr_from_ctl(&attr);
    let mut mask = mask;
    let opts = id.state().options;
    if state == IBV_QPS_RTR {
        if let Some(tos) = opts.tos {
            if mask & IBV_QP_AV != 0 {
                attr.ah_attr.grh.traffic_class = tos;
            }
        }
        if let Some(t) = opts.min_rnr_timer {
            if mask & IBV_QP_MIN_RNR_TIMER != 0 {
                attr.min_rnr_timer = t;
            }
        }
    }
    if state == IBV_QPS_RTS {
        if let Some(t) = opts.ack_timeout {
            attr.timeout = t;
            mask |= IBV_QP_TIMEOUT;
        }
    }
    Ok((attr, mask))
}

fn modify(qp: *mut IbvQp, attr: &mut IbvQpAttr, mask: c_int) -> Result<(), Errno> {
    // SAFETY: qp is the id's QP (a live object of ours or rejected by ibv_modify_qp).
    match unsafe { verbs::qp::ibv_modify_qp(qp, attr, mask) } {
        0 => Ok(()),
        e => Err(Errno(e)),
    }
}

fn qp_state(qp: *mut IbvQp) -> c_int {
    // SAFETY: callers pass the id's live QP.
    unsafe { (*qp).state }
}

/// librdmacm's `ucma_modify_qp_rtr`: INIT (refreshing the defaults) then RTR, with the
/// responder resources the connection negotiated.
pub fn modify_qp_rtr(id: &ShimCmId, resp_res: u8) -> Result<(), Errno> {
    let qp = id.id.qp;
    if qp.is_null() {
        return Err(Errno::INVAL);
    }
    // INIT again even when already there (INIT -> INIT is legal, IBTA 10.3.1): the access
    // flags depend on the responder resources, known only now (ib_cm_init_qp_attr).
    if qp_state(qp) == IBV_QPS_RESET || qp_state(qp) == IBV_QPS_INIT {
        let (mut a, m) = init_qp_attr(id, IBV_QPS_INIT)?;
        modify(qp, &mut a, m)?;
    }
    let (mut a, m) = init_qp_attr(id, IBV_QPS_RTR)?;
    if resp_res != RDMA_MAX_RESP_RES {
        a.max_dest_rd_atomic = resp_res;
    }
    modify(qp, &mut a, m)
}

/// librdmacm's `ucma_modify_qp_rts`.
pub fn modify_qp_rts(id: &ShimCmId, init_depth: u8) -> Result<(), Errno> {
    let qp = id.id.qp;
    let (mut a, m) = init_qp_attr(id, IBV_QPS_RTS)?;
    if init_depth != RDMA_MAX_INIT_DEPTH {
        a.max_rd_atomic = init_depth;
    }
    modify(qp, &mut a, m)
}

/// librdmacm's `ucma_modify_qp_err`: no-op without a QP.
pub fn modify_qp_err(id: &ShimCmId) -> Result<(), Errno> {
    let qp = id.id.qp;
    if qp.is_null() {
        return Ok(());
    }
    let mut a = IbvQpAttr {
        qp_state: IBV_QPS_ERR,
        ..IbvQpAttr::default()
    };
    modify(qp, &mut a, IBV_QP_STATE)
}

/// A new connected-mode QP goes to INIT with the id's port, pkey and access flags
/// (`ucma_init_conn_qp`).
fn init_conn_qp(id: &ShimCmId, qp: *mut IbvQp) -> Result<(), Errno> {
    let (mut a, m) = init_qp_attr(id, IBV_QPS_INIT)?;
    modify(qp, &mut a, m)
}

/// A new UD QP goes straight to RTS with the port space's Q_Key (`ucma_init_ud_qp`).
fn init_ud_qp(id: &ShimCmId, qp: *mut IbvQp) -> Result<(), Errno> {
    let (mut a, m) = match init_qp_attr(id, IBV_QPS_INIT) {
        Ok(v) => v,
        Err(_) => (
            IbvQpAttr {
                qp_state: IBV_QPS_INIT,
                port_num: id.id.port_num.max(1),
                qkey: RDMA_UDP_QKEY,
                ..IbvQpAttr::default()
            },
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY,
        ),
    };
    modify(qp, &mut a, m)?;
    let mut a = IbvQpAttr {
        qp_state: IBV_QPS_RTR,
        ..IbvQpAttr::default()
    };
    modify(qp, &mut a, IBV_QP_STATE)?;
    let mut a = IbvQpAttr {
        qp_state: IBV_QPS_RTS,
        sq_psn: 0,
        ..IbvQpAttr::default()
    };
    modify(qp, &mut a, IBV_QP_STATE | IBV_QP_SQ_PSN)
}

pub fn is_ud(id: &ShimCmId) -> bool {
    id.id.qp_type == IBV_QPT_UD
}

/// `ucma_create_cqs`: a completion channel and a CQ for each direction the caller gave none
/// for, stored in the id (`rdma_get_send_comp`/`rdma_get_recv_comp` use them).
fn create_cqs(id: &ShimCmId, send_size: u32, recv_size: u32) -> Result<(), Errno> {
    let p = id.as_id_ptr();
    let verbs = id.id.verbs;
    let cq_context = p.cast::<libc::c_void>();
    let make = |size: u32| -> Result<(*mut IbvCompChannel, *mut IbvCq), Errno> {
        // SAFETY: verbs is the id's shared context.
        let ch = unsafe { verbs::events::ibv_create_comp_channel(verbs) };
        if ch.is_null() {
            return Err(Errno::last());
        }
        // SAFETY: as above; the channel was just created.
        let cq =
            unsafe { verbs::cq::ibv_create_cq(verbs, size.max(1) as c_int, cq_context, ch, 0) };
        if cq.is_null() {
            let e = Errno::last();
            // SAFETY: ours, unused.
            unsafe { verbs::events::ibv_destroy_comp_channel(ch) };
            return Err(e);
        }
        Ok((ch, cq))
    };
    if recv_size > 0 {
        let (ch, cq) = make(recv_size)?;
        // SAFETY: p is the live id.
        unsafe {
            (*p).recv_cq_channel = ch;
            (*p).recv_cq = cq;
        }
    }
    if send_size > 0 {
        let (ch, cq) = match make(send_size) {
            Ok(v) => v,
            Err(e) => {
                destroy_cqs(id);
                return Err(e);
            }
        };
        // SAFETY: p is the live id.
        unsafe {
            (*p).send_cq_channel = ch;
            (*p).send_cq = cq;
        }
    }
    Ok(())
}

/// Takes an object pointer out of an id field, leaving NULL (so it is destroyed once).
///
/// # Safety
/// `field` points into a live id.
unsafe fn take<T>(field: *mut *mut T) -> Option<*mut T> {
    // SAFETY: per the contract.
    let p = unsafe { field.replace(ptr::null_mut()) };
    (!p.is_null()).then_some(p)
}

/// `ucma_destroy_cqs`: the CQs and channels the id holds.
pub fn destroy_cqs(id: &ShimCmId) {
    let p = id.as_id_ptr();
    // SAFETY: p is the live id; each object is one of ours (or refused harmlessly).
    unsafe {
        if let Some(cq) = take(ptr::addr_of_mut!((*p).recv_cq)) {
            verbs::cq::ibv_destroy_cq(cq);
        }
        if let Some(ch) = take(ptr::addr_of_mut!((*p).recv_cq_channel)) {
            verbs::events::ibv_destroy_comp_channel(ch);
        }
        if let Some(cq) = take(ptr::addr_of_mut!((*p).send_cq)) {
            verbs::cq::ibv_destroy_cq(cq);
        }
        if let Some(ch) = take(ptr::addr_of_mut!((*p).send_cq_channel)) {
            verbs::events::ibv_destroy_comp_channel(ch);
        }
    }
}

/// `rdma_create_qp_ex`.
pub fn create_qp_ex(id: &ShimCmId, attr: &mut IbvQpInitAttrEx) -> Result<(), Errno> {
    let p = id.as_id_ptr();
    if !id.id.qp.is_null() || id.id.verbs.is_null() {
        return Err(Errno::INVAL);
    }
    if attr.comp_mask & QP_INIT_ATTR_PD == 0 || attr.pd.is_null() {
        attr.pd = state::default_pd(id.id.verbs)?;
        attr.comp_mask |= QP_INIT_ATTR_PD;
    }
    // The caller's PD is read only once known to be a live one of ours (a freed or foreign
    // pointer was dereferenced here before the verb below could refuse it).
    if !crate::runtime::PDS.contains(attr.pd) {
        return Err(Errno::INVAL);
    }
    // SAFETY: registered, so a live IbvPd.
    if unsafe { (*attr.pd).context } != id.id.verbs {
        return Err(Errno::INVAL);
    }
    let send = if attr.send_cq.is_null() && id.id.send_cq.is_null() {
        attr.cap.max_send_wr
    } else {
        0
    };
    let recv = if attr.recv_cq.is_null() && id.id.recv_cq.is_null() {
        attr.cap.max_recv_wr
    } else {
        0
    };
    create_cqs(id, send, recv)?;
    if attr.send_cq.is_null() {
        attr.send_cq = id.id.send_cq;
    }
    if attr.recv_cq.is_null() {
        attr.recv_cq = id.id.recv_cq;
    }
    if attr.srq.is_null() && !id.id.srq.is_null() {
        attr.srq = id.id.srq;
    }
    // SAFETY: the shared context and a filled-in, valid attribute struct.
    let qp = unsafe { verbs::qp::create_qp_ex(id.id.verbs, attr) };
    if qp.is_null() {
        let e = Errno::last();
        destroy_cqs(id);
        return Err(e);
    }
    let init = if is_ud(id) {
        init_ud_qp(id, qp)
    } else {
        init_conn_qp(id, qp)
    };
    if let Err(e) = init {
        // SAFETY: just created, ours.
        unsafe { verbs::qp::ibv_destroy_qp(qp) };
        destroy_cqs(id);
        return Err(e);
    }
    // SAFETY: p is the live id; qp is live.
    unsafe {
        (*p).pd = (*qp).pd;
        (*p).qp = qp;
    }
    Ok(())
}

/// `rdma_create_qp`: the `ibv_qp_init_attr` form, PD optional.
pub fn create_qp(id: &ShimCmId, pd: *mut IbvPd, attr: &mut IbvQpInitAttr) -> Result<(), Errno> {
    // SAFETY: IbvQpInitAttrEx is integers and raw pointers: all-zero is valid.
    let mut ex: IbvQpInitAttrEx = unsafe { std::mem::zeroed() };
    ex.qp_context = attr.qp_context;
    ex.send_cq = attr.send_cq;
    ex.recv_cq = attr.recv_cq;
    ex.srq = attr.srq;
    ex.cap = attr.cap;
    ex.qp_type = attr.qp_type;
    ex.sq_sig_all = attr.sq_sig_all;
    ex.comp_mask = QP_INIT_ATTR_PD;
    ex.pd = pd;
    create_qp_ex(id, &mut ex)?;
    attr.cap = ex.cap;
    attr.send_cq = ex.send_cq;
    attr.recv_cq = ex.recv_cq;
    Ok(())
}

/// `rdma_destroy_qp`.
pub fn destroy_qp(id: &ShimCmId) {
    let p = id.as_id_ptr();
    // SAFETY: p is the live id; its QP is ours (or NULL).
    unsafe {
        if let Some(qp) = take(ptr::addr_of_mut!((*p).qp)) {
            verbs::qp::ibv_destroy_qp(qp);
        }
    }
    destroy_cqs(id);
}

/// `rdma_create_srq_ex`.
pub fn create_srq_ex(id: &ShimCmId, attr: &mut IbvSrqInitAttrEx) -> Result<(), Errno> {
    let p = id.as_id_ptr();
    if id.id.verbs.is_null() || !id.id.srq.is_null() {
        return Err(Errno::INVAL);
    }
    if attr.comp_mask & SRQ_INIT_ATTR_TYPE == 0 {
        attr.comp_mask |= SRQ_INIT_ATTR_TYPE;
        attr.srq_type = 0;
    }
    if attr.comp_mask & SRQ_INIT_ATTR_PD == 0 || attr.pd.is_null() {
        attr.pd = if id.id.pd.is_null() {
            state::default_pd(id.id.verbs)?
        } else {
            id.id.pd
        };
        attr.comp_mask |= SRQ_INIT_ATTR_PD;
    }
    // SAFETY: the shared context and a valid attribute struct.
    let srq = unsafe { verbs::srq::create_srq_ex(id.id.verbs, attr) };
    if srq.is_null() {
        return Err(Errno::last());
    }
    // SAFETY: p is the live id; srq is live.
    unsafe {
        (*p).pd = attr.pd;
        (*p).srq = srq;
    }
    Ok(())
}

/// `rdma_create_srq`.
pub fn create_srq(id: &ShimCmId, pd: *mut IbvPd, attr: &mut IbvSrqInitAttr) -> Result<(), Errno> {
    // SAFETY: integers and raw pointers: all-zero is valid.
    let mut ex: IbvSrqInitAttrEx = unsafe { std::mem::zeroed() };
    ex.srq_context = attr.srq_context;
    ex.attr = attr.attr;
    ex.comp_mask = SRQ_INIT_ATTR_TYPE | SRQ_INIT_ATTR_PD;
    ex.pd = pd;
    create_srq_ex(id, &mut ex)?;
    attr.attr = ex.attr;
    Ok(())
}

/// `rdma_destroy_srq`.
pub fn destroy_srq(id: &ShimCmId) {
    let p = id.as_id_ptr();
    // SAFETY: p is the live id; its SRQ is ours (or NULL).
    unsafe {
        if let Some(srq) = take(ptr::addr_of_mut!((*p).srq)) {
            verbs::srq::ibv_destroy_srq(srq);
        }
    }
}

/// Copies an `ibv_qp_init_attr` (for `rdma_create_ep` of a passive id).
pub fn copy_init_attr(a: &IbvQpInitAttr) -> IbvQpInitAttr {
    IbvQpInitAttr {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
    }
}
