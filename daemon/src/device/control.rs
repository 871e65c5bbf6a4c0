//! Requests from the client threads about the device's objects: every verb that is not on
//! the data path (contexts, PDs, MRs, completion channels, CQs, QPs, SRQs, AHs, MWs, multicast
//! attachments). Object creation, with its rings, is in [`super::objects`].

use super::arena::RingArena;
use super::clients::QpHost;
use super::doorbells::{Bell, DoorbellTable};
use super::events::EventSink;
use super::objects;
use super::resize;
use super::DeviceThread;
use crate::peer::ClientProcess;
use proto::ctl::{ip_of_gid, Request, Response};
use proto::transport::{self as tp, Access, VerbsError};
use proto::Qpn;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

pub(super) fn err(e: VerbsError) -> Response {
    Response::Error {
        errno: e.errno(),
        message: e.to_string(),
    }
}

pub(super) fn errno(errno: i32, message: &str) -> Response {
    Response::Error {
        errno,
        message: message.to_string(),
    }
}

impl DeviceThread {
    pub(super) fn request(
        &mut self,
        client: u64,
        process: &Arc<ClientProcess>,
        request: Request,
        mut fds: Vec<OwnedFd>,
    ) -> (Response, Vec<OwnedFd>) {
        let name = self.info.name.clone();
        if let Some(refused) = self.past_a_limit(client, &request) {
            return (refused, vec![]);
        }
        match &request {
            Request::FastTake { qpn } => {
                let answer = self.fast_take(client, *qpn);
                if matches!(answer.0, Response::Error { .. }) {
                    self.fast.refused += 1;
                }
                return answer;
            }
            Request::FastReturn { qpn, events } => {
                return (self.fast_return(client, *qpn, events), vec![])
            }
            Request::FastSources { cq, known } => return self.fast_sources(client, *cq, known),
            _ => {}
        }
        let ring_budget = self.ring_budget(client);
        let port = self.port_state();
        if matches!(request, Request::CreateQp { .. }) {
            self.grow_qpns(client);
        }
        let c = match self.client(client, process) {
            Ok(c) => c,
            Err((code, why)) => return (errno(code, why), vec![]),
        };
        let none = Vec::new();
        let r = match request {
            Request::OpenContext { device } => {
                if device != name {
                    return (errno(libc::ENODEV, "no such device"), none);
                }
                let Some(fd) = fds.pop() else {
                    return (
                        errno(libc::EINVAL, "OpenContext needs the async event socket"),
                        none,
                    );
                };
                let sink = match EventSink::new(fd) {
                    Ok(s) => s,
                    Err(why) => return (errno(libc::EINVAL, why), none),
                };
                // The client's doorbell table, made with its first context on the device and
                // shared by all of them.
                if c.bells.is_none() {
                    match DoorbellTable::new() {
                        Ok(t) => {
                            t.set_port(port);
                            c.bells = Some(t)
                        }
                        Err(e) => return (errno(libc::ENOMEM, &format!("{e:#}")), none),
                    }
                }
                let Some((table, doorbells_len)) = c.bells.as_ref().and_then(DoorbellTable::share)
                else {
                    return (errno(libc::EMFILE, "doorbell table descriptor"), none);
                };
                let h = c.handle();
                c.contexts.insert(h, sink);
                // The eventfd the shim writes after ringing a doorbell while the device
                // thread said it sleeps.
                let wake = match self.wake.as_fd().try_clone_to_owned() {
                    Ok(d) => d,
                    Err(e) => return (errno(libc::EMFILE, &e.to_string()), none),
                };
                return (
                    Response::Context {
                        ctx: h,
                        doorbells_len,
                    },
                    vec![wake, table],
                );
            }
            Request::CloseContext { ctx } => match c.contexts.remove(&ctx) {
                Some(_) => Response::Done,
                None => errno(libc::EINVAL, "no such context"),
            },
            Request::AllocPd { ctx } => {
                if !c.contexts.contains_key(&ctx) {
                    return (errno(libc::EINVAL, "no such context"), none);
                }
                let pd = c.engine.alloc_pd();
                let h = c.handle();
                c.pds.insert(h, (pd, ctx));
                Response::Pd { pd: h }
            }
            Request::DeallocPd { pd } => match c.pds.get(&pd).map(|p| p.0) {
                Some(e) => match c.engine.dealloc_pd(e) {
                    Ok(()) => {
                        c.pds.remove(&pd);
                        Response::Done
                    }
                    Err(e) => err(e),
                },
                None => errno(libc::EINVAL, "no such PD"),
            },
            Request::RegMr {
                pd,
                addr,
                length,
                iova,
                access,
            } => {
                let Some(&(epd, _)) = c.pds.get(&pd) else {
                    return (errno(libc::EINVAL, "no such PD"), none);
                };
                if let Some(refused) = odp_refused(access) {
                    return (refused, none);
                }
                if iova != addr {
                    return (
                        errno(
                            libc::EOPNOTSUPP,
                            "MRs with an IOVA other than their address",
                        ),
                        none,
                    );
                }
                if length > 0 && !mapped(c, addr, length) {
                    return (errno(libc::EFAULT, "range not mapped in the process"), none);
                }
                match c.engine.reg_mr(epd, addr, length, Access(access)) {
                    Ok(keys) => {
                        let h = c.handle();
                        c.mrs.insert(h, (keys.handle, length));
                        c.mr_bytes = c.mr_bytes.saturating_add(length);
                        Response::Mr {
                            mr: h,
                            lkey: keys.lkey.0,
                            rkey: keys.rkey.0,
                        }
                    }
                    Err(e) => err(e),
                }
            }
            Request::DeregMr { mr } => match c.mrs.get(&mr).copied() {
                Some((e, length)) => match c.engine.dereg_mr(e) {
                    Ok(()) => {
                        c.mrs.remove(&mr);
                        c.mr_bytes = c.mr_bytes.saturating_sub(length);
                        Response::Done
                    }
                    Err(e) => err(e),
                },
                None => errno(libc::EINVAL, "no such MR"),
            },
            Request::ReregMr {
                mr,
                pd,
                range,
                access,
            } => {
                let Some(&(e, old_length)) = c.mrs.get(&mr) else {
                    return (errno(libc::EINVAL, "no such MR"), none);
                };
                // As the kernel's ib_uverbs_rereg_mr: some change must be asked for.
                if pd.is_none() && range.is_none() && access.is_none() {
                    return (errno(libc::EINVAL, "rereg asks for no change"), none);
                }
                let new_pd = match pd {
                    Some(pd) => match c.pds.get(&pd) {
                        Some(&(epd, _)) => Some(epd),
                        None => return (errno(libc::EINVAL, "no such PD"), none),
                    },
                    None => None,
                };
                if range.is_some_and(|(addr, length)| length == 0 || !mapped(c, addr, length)) {
                    return (errno(libc::EFAULT, "range not mapped in the process"), none);
                }
                if let Some(refused) = access.and_then(odp_refused) {
                    return (refused, none);
                }
                let new_access = access.map(Access);
                match c.engine.rereg_mr(e, new_pd, range, new_access) {
                    Ok(()) => {
                        let new_length = range.map_or(old_length, |r| r.1);
                        c.mrs.insert(mr, (e, new_length));
                        c.mr_bytes = c
                            .mr_bytes
                            .saturating_sub(old_length)
                            .saturating_add(new_length);
                        Response::Done
                    }
                    Err(e) => err(e),
                }
            }
            Request::CreateCompChannel { ctx } => {
                if !c.contexts.contains_key(&ctx) {
                    return (errno(libc::EINVAL, "no such context"), none);
                }
                let Some(fd) = fds.pop() else {
                    return (
                        errno(libc::EINVAL, "a completion channel needs its pipe"),
                        none,
                    );
                };
                let sink = match EventSink::new(fd) {
                    Ok(s) => s,
                    Err(why) => return (errno(libc::EINVAL, why), none),
                };
                let h = c.handle();
                c.channels.insert(h, sink);
                Response::CompChannel { channel: h }
            }
            Request::DestroyCompChannel { channel } => {
                if c.cqs.values().any(|q| q.channel == Some(channel)) {
                    errno(libc::EBUSY, "CQs still use the channel")
                } else if c.channels.remove(&channel).is_some() {
                    Response::Done
                } else {
                    errno(libc::EINVAL, "no such channel")
                }
            }
            Request::CreateCq {
                ctx,
                cqe,
                channel,
                comp_vector: _,
            } => return objects::create_cq(c, ctx, cqe, channel, ring_budget),
            Request::DestroyCq { cq } => {
                if c.qps.values().any(|q| q.send_cq == cq) {
                    return (errno(libc::EBUSY, "QPs still use the CQ"), none);
                }
                match c.engine.destroy_cq(cq) {
                    Ok(()) => {
                        if let Some(q) = c.cqs.remove(&cq) {
                            c.ring_bytes -= q.region.len() as u64;
                        }
                        Response::Done
                    }
                    Err(e) => err(e),
                }
            }
            Request::CreateQp {
                pd,
                qp_type,
                send_cq,
                recv_cq,
                srq,
                cap,
                sq_sig_all,
            } => {
                return objects::create_qp(
                    c,
                    pd,
                    qp_type,
                    send_cq,
                    recv_cq,
                    srq,
                    cap,
                    sq_sig_all,
                    ring_budget,
                )
            }
            Request::ModifyQp { qpn, attr, mask } => {
                let r = objects::modify_qp(c, qpn, &attr, mask);
                if r == Response::Done {
                    self.choose_loss_recovery(client, qpn);
                }
                r
            }
            Request::QueryQp { qpn, mask: _ } => objects::query_qp(c, qpn),
            Request::DestroyQp { qpn } => {
                if !c.qps.contains_key(&qpn) {
                    return (errno(libc::EINVAL, "no such QP"), none);
                }
                match c.engine.destroy_qp(Qpn::new(qpn)) {
                    Ok(()) => {
                        if let Some(q) = c.qps.remove(&qpn) {
                            c.ring_bytes -= RingArena::charged(&q.memory);
                            if q.fast.is_some() {
                                c.fast_fds -= 1;
                            }
                            c.remove_bell(q.doorbell, Bell::Qp(qpn));
                            // The rings' handles go first; their region is used again.
                            let QpHost { memory, .. } = q;
                            c.arena.free(memory);
                        }
                        // A destroyed QP leaves its groups (rxe detaches it in rxe_qp_destroy).
                        self.group_detach(|m| m == (client, qpn), None);
                        Response::Done
                    }
                    Err(e) => err(e),
                }
            }
            Request::CreateSrq {
                pd,
                max_wr,
                max_sge,
                srq_limit,
            } => return objects::create_srq(c, pd, max_wr, max_sge, srq_limit, ring_budget),
            Request::ModifySrq {
                srq,
                max_wr,
                srq_limit,
                mask,
            } => {
                // IBV_SRQ_MAX_WR (1) resizes (a new ring), IBV_SRQ_LIMIT (2) arms; both may
                // come at once, the limit checked against the new size before anything
                // changes (rxe_srq_chk_attr).
                let new_max = max_wr
                    .max(1)
                    .checked_next_power_of_two()
                    .unwrap_or(u32::MAX);
                if mask & 3 == 3 && srq_limit > new_max {
                    return (errno(libc::EINVAL, "SRQ limit above max_wr"), none);
                }
                let resized = if mask & 1 != 0 {
                    let (r, fds) = resize::resize_srq(c, srq, max_wr, ring_budget);
                    if !matches!(r, Response::Srq { .. }) {
                        return (r, fds);
                    }
                    Some((r, fds))
                } else {
                    None
                };
                let armed = if mask & 2 != 0 {
                    match c.engine.arm_srq_limit(srq, srq_limit) {
                        Ok(()) => {
                            if let Some(s) = c.srqs.get_mut(&srq) {
                                s.limit = srq_limit;
                            }
                            Response::Done
                        }
                        Err(e) => err(e),
                    }
                } else {
                    Response::Done
                };
                match resized {
                    Some((r, fds)) => return (r, fds),
                    None => armed,
                }
            }
            Request::ResizeCq { cq, cqe } => {
                return resize::resize_cq(c, cq, cqe, ring_budget);
            }
            // The directions that fed it are back by now (`DeviceThread::fast_blockers`). A
            // client that arms again and again waits on events: from its second such arm the
            // CQ stays with the device rather than go back and forth, and its arms stop
            // asking (each is a control request).
            Request::CqEventsWanted { cq } => match c.cqs.get_mut(&cq) {
                Some(q) => {
                    q.arm_requests = q.arm_requests.saturating_add(1);
                    q.events_only |= q.arm_requests >= 2;
                    Response::CqEvents {
                        events_only: q.events_only,
                    }
                }
                None => errno(libc::EINVAL, "no such CQ"),
            },
            Request::QuerySrq { srq } => match c.srqs.get(&srq) {
                Some(s) => Response::SrqAttr {
                    max_wr: s.max_wr,
                    max_sge: s.max_sge,
                    srq_limit: s.limit,
                },
                None => errno(libc::EINVAL, "no such SRQ"),
            },
            Request::DestroySrq { srq } => match c.engine.destroy_srq(srq) {
                Ok(()) => {
                    if let Some(s) = c.srqs.remove(&srq) {
                        c.ring_bytes -= s.region.len() as u64;
                        c.fast_fds -= usize::from(s.fast.is_some());
                        c.remove_bell(s.doorbell, Bell::Srq(srq));
                    }
                    Response::Done
                }
                Err(e) => err(e),
            },
            Request::CreateAh { pd, attr } => {
                let Some(&(epd, _)) = c.pds.get(&pd) else {
                    return (errno(libc::EINVAL, "no such PD"), none);
                };
                match c.engine.create_ah(epd, attr.address_vector()) {
                    Ok(ah) => {
                        c.ahs.insert(ah, epd);
                        Response::Ah { ah }
                    }
                    Err(e) => err(e),
                }
            }
            Request::DestroyAh { ah } => match c.engine.destroy_ah(ah) {
                Ok(()) => {
                    c.ahs.remove(&ah);
                    Response::Done
                }
                Err(e) => err(e),
            },
            Request::AttachMcast { qpn, gid } => {
                match c.engine.attach_mcast(Qpn::new(qpn), ip_of_gid(gid)) {
                    Ok(()) => {
                        self.group_attach(client, qpn, ip_of_gid(gid));
                        Response::Done
                    }
                    Err(e) => err(e),
                }
            }
            Request::DetachMcast { qpn, gid } => {
                match c.engine.detach_mcast(Qpn::new(qpn), ip_of_gid(gid)) {
                    Ok(()) => {
                        self.group_detach(|m| m == (client, qpn), Some(ip_of_gid(gid)));
                        Response::Done
                    }
                    Err(e) => err(e),
                }
            }
            Request::AllocMw { pd, mw_type } => {
                let Some(&(epd, _)) = c.pds.get(&pd) else {
                    return (errno(libc::EINVAL, "no such PD"), none);
                };
                let ty = match mw_type {
                    1 => tp::MwType::Type1,
                    2 => tp::MwType::Type2,
                    _ => return (errno(libc::EINVAL, "memory window type"), none),
                };
                match c.engine.alloc_mw(epd, ty) {
                    Ok((mw, rkey)) => {
                        c.mws.insert(mw);
                        Response::Mw { mw, rkey: rkey.0 }
                    }
                    Err(e) => err(e),
                }
            }
            Request::DeallocMw { mw } => match c.engine.dealloc_mw(mw) {
                Ok(()) => {
                    c.mws.remove(&mw);
                    Response::Done
                }
                Err(e) => err(e),
            },
            _ => errno(libc::EINVAL, "not a device request"),
        };
        (r, none)
    }
}

/// No on-demand paging: an MR asking for it is refused as by a device without it (the
/// kernel's ib_check_mr_access), and ODP is not advertised (odp_caps are 0).
fn odp_refused(access: u32) -> Option<Response> {
    (access & Access::ON_DEMAND.0 != 0).then(|| {
        errno(
            libc::EOPNOTSUPP,
            "IBV_ACCESS_ON_DEMAND: the device has no ODP",
        )
    })
}

/// Whether `[addr, addr + length)` is mapped in the client's process (a registration of
/// anything else is EFAULT, as the kernel's pinning fails).
fn mapped(c: &super::ClientDev, addr: u64, length: u64) -> bool {
    c.engine
        .memory()
        .0
        .borrow()
        .check_mapped(addr, length)
        .is_ok()
}
