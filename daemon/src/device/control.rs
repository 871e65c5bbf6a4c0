//! Requests from the client threads about the device's objects: every verb that is not on
//! the data path (contexts, PDs, MRs, completion channels, CQs, QPs, SRQs, AHs, MWs, multicast
//! attachments). Object creation, with its rings, is in [`super::objects`].

use super::objects;
use super::DeviceThread;
use proto::ctl::{ip_of_gid, Request, Response};
use proto::transport::{self as tp, Access, VerbsError};
use proto::Qpn;
use std::os::fd::{AsFd, OwnedFd};

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
        pid: i32,
        request: Request,
        mut fds: Vec<OwnedFd>,
    ) -> (Response, Vec<OwnedFd>) {
        let name = self.info.name.clone();
        let qps: usize = self.clients.values().map(|c| c.qps.len()).sum();
        let mrs: usize = self.clients.values().map(|c| c.mrs.len()).sum();
        match request {
            Request::CreateQp { .. } if qps >= self.max_qp => {
                return (
                    errno(libc::ENOMEM, "the device's QP limit (max_qp) is reached"),
                    vec![],
                );
            }
            Request::RegMr { .. } if mrs >= self.max_mr => {
                return (
                    errno(libc::ENOMEM, "the device's MR limit (max_mr) is reached"),
                    vec![],
                );
            }
            _ => {}
        }
        let c = match self.client(client, pid) {
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
                let h = c.handle();
                c.contexts.insert(h, fd);
                // The context's doorbell: the shim writes it after posting to a ring whose
                // consumer (this thread) said it sleeps.
                let doorbell = self.wake.as_fd().try_clone_to_owned();
                return match doorbell {
                    Ok(d) => (Response::Context { ctx: h }, vec![d]),
                    Err(e) => (errno(libc::EMFILE, &e.to_string()), none),
                };
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
                if iova != addr {
                    return (
                        errno(
                            libc::EOPNOTSUPP,
                            "MRs with an IOVA other than their address",
                        ),
                        none,
                    );
                }
                if length > 0
                    && c.engine
                        .memory()
                        .0
                        .borrow()
                        .check_mapped(addr, length)
                        .is_err()
                {
                    return (errno(libc::EFAULT, "range not mapped in the process"), none);
                }
                match c.engine.reg_mr(epd, addr, length, Access(access)) {
                    Ok(keys) => {
                        let h = c.handle();
                        c.mrs.insert(h, keys.handle);
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
                Some(e) => match c.engine.dereg_mr(e) {
                    Ok(()) => {
                        c.mrs.remove(&mr);
                        Response::Done
                    }
                    Err(e) => err(e),
                },
                None => errno(libc::EINVAL, "no such MR"),
            },
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
                let h = c.handle();
                c.channels.insert(h, fd);
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
            } => return objects::create_cq(c, ctx, cqe, channel),
            Request::DestroyCq { cq } => {
                if c.qps.values().any(|q| q.send_cq == cq) {
                    return (errno(libc::EBUSY, "QPs still use the CQ"), none);
                }
                match c.engine.destroy_cq(cq) {
                    Ok(()) => {
                        c.cqs.remove(&cq);
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
            } => return objects::create_qp(c, pd, qp_type, send_cq, recv_cq, srq, cap, sq_sig_all),
            Request::ModifyQp { qpn, attr, mask } => objects::modify_qp(c, qpn, &attr, mask),
            Request::QueryQp { qpn, mask: _ } => objects::query_qp(c, qpn),
            Request::DestroyQp { qpn } => {
                if !c.qps.contains_key(&qpn) {
                    return (errno(libc::EINVAL, "no such QP"), none);
                }
                match c.engine.destroy_qp(Qpn::new(qpn)) {
                    Ok(()) => {
                        c.qps.remove(&qpn);
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
            } => return objects::create_srq(c, pd, max_wr, max_sge, srq_limit),
            Request::ModifySrq {
                srq,
                max_wr: _,
                srq_limit,
                mask,
            } => {
                // IBV_SRQ_MAX_WR (1): resizing is not supported; IBV_SRQ_LIMIT (2) arms.
                if mask & 1 != 0 {
                    errno(libc::EOPNOTSUPP, "SRQ resize")
                } else if mask & 2 != 0 {
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
                }
            }
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
                    c.srqs.remove(&srq);
                    Response::Done
                }
                Err(e) => err(e),
            },
            Request::CreateAh { pd, attr } => {
                let Some(&(epd, _)) = c.pds.get(&pd) else {
                    return (errno(libc::EINVAL, "no such PD"), none);
                };
                match c.engine.create_ah(epd, objects::address_vector(&attr)) {
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
