//! Client-visible handles carry the device's index in their top bits, so that the control
//! threads route a request to its device thread without a lookup ([`handle_device`]); the
//! device strips it from requests ([`untag`]) and adds it to responses ([`tag`]).

use proto::ctl::{Request, Response};

/// Handles given to clients carry the device's index in their top 8 bits, so that the control
/// threads can route a request to the right device thread without a lookup.
pub const HANDLE_DEVICE_SHIFT: u32 = 24;
pub(super) const HANDLE_MASK: u32 = (1 << HANDLE_DEVICE_SHIFT) - 1;

/// The device a client-visible handle belongs to.
pub fn handle_device(h: u32) -> usize {
    (h >> HANDLE_DEVICE_SHIFT) as usize
}

/// Device `index`'s handle `h` as clients see it.
pub(super) fn tag_handle(index: u32, h: u32) -> u32 {
    (index << HANDLE_DEVICE_SHIFT) | h
}

/// A handle without its device index.
pub(super) fn untag_handle(h: u32) -> u32 {
    h & HANDLE_MASK
}

/// Strips the device index from every handle in a request.
pub(super) fn untag(r: Request) -> Request {
    let m = |h: u32| h & HANDLE_MASK;
    match r {
        Request::CloseContext { ctx } => Request::CloseContext { ctx: m(ctx) },
        Request::AllocPd { ctx } => Request::AllocPd { ctx: m(ctx) },
        Request::DeallocPd { pd } => Request::DeallocPd { pd: m(pd) },
        Request::RegMr {
            pd,
            addr,
            length,
            iova,
            access,
        } => Request::RegMr {
            pd: m(pd),
            addr,
            length,
            iova,
            access,
        },
        Request::DeregMr { mr } => Request::DeregMr { mr: m(mr) },
        Request::ReregMr {
            mr,
            pd,
            range,
            access,
        } => Request::ReregMr {
            mr: m(mr),
            pd: pd.map(m),
            range,
            access,
        },
        Request::CreateCompChannel { ctx } => Request::CreateCompChannel { ctx: m(ctx) },
        Request::DestroyCompChannel { channel } => Request::DestroyCompChannel {
            channel: m(channel),
        },
        Request::CreateCq {
            ctx,
            cqe,
            channel,
            comp_vector,
        } => Request::CreateCq {
            ctx: m(ctx),
            cqe,
            channel: channel.map(m),
            comp_vector,
        },
        Request::DestroyCq { cq } => Request::DestroyCq { cq: m(cq) },
        Request::ResizeCq { cq, cqe } => Request::ResizeCq { cq: m(cq), cqe },
        Request::CreateQp {
            pd,
            qp_type,
            send_cq,
            recv_cq,
            srq,
            cap,
            sq_sig_all,
        } => Request::CreateQp {
            pd: m(pd),
            qp_type,
            send_cq: m(send_cq),
            recv_cq: m(recv_cq),
            srq: srq.map(m),
            cap,
            sq_sig_all,
        },
        Request::CreateSrq {
            pd,
            max_wr,
            max_sge,
            srq_limit,
        } => Request::CreateSrq {
            pd: m(pd),
            max_wr,
            max_sge,
            srq_limit,
        },
        Request::ModifySrq {
            srq,
            max_wr,
            srq_limit,
            mask,
        } => Request::ModifySrq {
            srq: m(srq),
            max_wr,
            srq_limit,
            mask,
        },
        Request::QuerySrq { srq } => Request::QuerySrq { srq: m(srq) },
        Request::DestroySrq { srq } => Request::DestroySrq { srq: m(srq) },
        Request::CreateAh { pd, attr } => Request::CreateAh { pd: m(pd), attr },
        Request::DestroyAh { ah } => Request::DestroyAh { ah: m(ah) },
        Request::AllocMw { pd, mw_type } => Request::AllocMw { pd: m(pd), mw_type },
        Request::DeallocMw { mw } => Request::DeallocMw { mw: m(mw) },
        Request::FastSources { cq, known } => Request::FastSources { cq: m(cq), known },
        Request::CqEventsWanted { cq } => Request::CqEventsWanted { cq: m(cq) },
        other => other,
    }
}

/// Adds the device index to every handle in a response.
pub(super) fn tag(r: Response, index: u32) -> Response {
    let t = |h: u32| tag_handle(index, h);
    match r {
        Response::Context { ctx, doorbells_len } => Response::Context {
            ctx: t(ctx),
            doorbells_len,
        },
        Response::Pd { pd } => Response::Pd { pd: t(pd) },
        Response::Mr { mr, lkey, rkey } => Response::Mr {
            mr: t(mr),
            lkey,
            rkey,
        },
        Response::CompChannel { channel } => Response::CompChannel {
            channel: t(channel),
        },
        Response::Cq {
            cq,
            cqe,
            ring,
            region_len,
        } => Response::Cq {
            cq: t(cq),
            cqe,
            ring,
            region_len,
        },
        Response::Srq {
            srq,
            max_wr,
            max_sge,
            ring,
            region_len,
            doorbell,
        } => Response::Srq {
            srq: t(srq),
            max_wr,
            max_sge,
            ring,
            region_len,
            doorbell,
        },
        Response::Ah { ah } => Response::Ah { ah: t(ah) },
        Response::Mw { mw, rkey } => Response::Mw { mw: t(mw), rkey },
        other => other,
    }
}
