//! The program's side of a connection: `rdma_connect` (a REQ, or a SIDR_REQ for a UD id),
//! `rdma_accept` (REP, SIDR_REP), `rdma_reject` (REJ, or a SIDR_REP that refuses) and
//! `rdma_establish` (the active side's RTU; the passive side's communication established).

use super::addressing::ps_of;
use super::ids::Role;
use super::requests::{done, error, Reply};
use super::{random_u32, CmService};
use proto::cm::msg::sidr_status;
use proto::cm::rdma_cm::{self as rc, CmaHdr, RoceRoute};
use proto::cm::{AcceptParams, ConnId, ConnectParams, RejReason, SidrParams};
use proto::ctl::{qp_type, CmConnParam, Response};

impl CmService {
    /// `rdma_connect`: a REQ, or a SIDR_REQ for a UD id (the route resolved first when it is
    /// not yet).
    pub(super) fn connect(
        &mut self,
        now: u64,
        h: u32,
        conn: CmConnParam,
        psn: Option<u32>,
    ) -> Reply {
        let Some(x) = self.ids.get(&h) else {
            return error(libc::EINVAL, "no such id");
        };
        if x.role != Role::Idle {
            return error(libc::EINVAL, "the id is already connecting or listening");
        }
        let (Some(d), Some(src), Some(dst), Some(peer)) = (x.device, x.src, x.dst, x.peer_ip)
        else {
            return error(libc::EINVAL, "the address is not resolved");
        };
        if x.path.is_none() {
            let r = self.resolve_route(h);
            if !matches!(r.0, Response::Done) {
                return r;
            }
        }
        let Some(x) = self.ids.get(&h) else {
            return error(libc::EINVAL, "no such id");
        };
        let Some(path) = x.path else {
            return error(libc::EINVAL, "no route");
        };
        let Some(ps) = ps_of(x.ps) else {
            return error(libc::EINVAL, "unsupported port space");
        };
        let local = self.local_ip(x).unwrap_or(src.ip());
        let dev = &self.devices[d];
        // The rdma_cm header names the addresses the program used; the path the wire ones.
        let hdr = CmaHdr {
            src_port: src.port(),
            src_addr: src.ip(),
            dst_addr: dst.ip(),
        };
        let (timeout, retries) = (dev.setup.cm_response_timeout, dev.setup.cm_max_retries);
        if x.is_ud() {
            let pd = match rc::req_private_data(
                &hdr,
                &conn.private_data,
                rc::user_private_data_max::SIDR_REQ,
            ) {
                Ok(pd) => pd,
                Err(e) => return error(libc::EINVAL, e.to_string()),
            };
            let p = SidrParams {
                peer,
                service_id: rc::service_id(ps, dst.port()),
                pkey: 0xffff,
                private_data: pd,
                timeout_ms: proto::cm::conn::cm_convert_to_ms(timeout),
                max_cm_retries: retries,
            };
            let version = self.id_version(x);
            self.devices[d].peer_types.insert(peer, version);
            return match self.devices[d].endpoint.sidr_resolve(now, p) {
                Ok(c) => {
                    self.conns.insert((d, c), h);
                    if let Some(x) = self.ids.get_mut(&h) {
                        x.conn = Some(c);
                        x.role = Role::SidrActive;
                    }
                    done()
                }
                Err(e) => error(libc::EINVAL, e.to_string()),
            };
        }
        let route = RoceRoute {
            src_addr: local,
            dst_addr: peer,
            src_port: src.port(),
            dst_port: dst.port(),
            hop_limit: path.hop_limit,
            traffic_class: path.traffic_class,
            sl: path.sl,
            path_mtu: path.mtu,
            packet_life_time: path.packet_life_time,
            rate: path.rate,
        };
        let param = rc::RdmaConnParam {
            private_data: conn.private_data.clone(),
            responder_resources: conn.responder_resources,
            initiator_depth: conn.initiator_depth,
            flow_control: conn.flow_control != 0,
            retry_count: conn.retry_count,
            rnr_retry_count: conn.rnr_retry_count,
            srq: conn.srq != 0,
            qp_num: conn.qp_num,
        };
        let qpt = if x.qp_type == qp_type::UC {
            rc::QpType::Uc
        } else {
            rc::QpType::Rc
        };
        let starting_psn = psn.unwrap_or_else(random_u32) & 0xff_ffff;
        let mut p = match ConnectParams::rdma_cm(
            &route,
            ps,
            &param,
            qpt,
            starting_psn,
            rc::RXE_ACK_DELAY,
        ) {
            Ok(p) => p,
            Err(e) => return error(libc::EINVAL, e.to_string()),
        };
        match rc::req_private_data(&hdr, &conn.private_data, rc::user_private_data_max::REQ) {
            Ok(pd) => p.private_data = pd,
            Err(e) => return error(libc::EINVAL, e.to_string()),
        }
        p.remote_cm_response_timeout = timeout;
        p.local_cm_response_timeout = timeout;
        p.max_cm_retries = retries;
        let version = self.id_version(x);
        self.devices[d].peer_types.insert(peer, version);
        match self.devices[d].endpoint.connect(now, p.clone()) {
            Ok(c) => {
                self.conns.insert((d, c), h);
                if let Some(x) = self.ids.get_mut(&h) {
                    x.conn = Some(c);
                    x.role = Role::Active;
                    x.local_psn = starting_psn;
                    x.connect = Some(p);
                }
                done()
            }
            Err(e) => error(libc::EINVAL, e.to_string()),
        }
    }

    /// `rdma_accept` of a connection request: a REP, or a SIDR_REP.
    pub(super) fn accept(&mut self, now: u64, h: u32, conn: CmConnParam) -> Reply {
        let reply = self.answer_request(now, h, conn);
        self.answered(h, &reply);
        reply
    }

    /// Once a connection request is answered it no longer counts toward its listener's
    /// backlog; an answer refused (a SIDR_REP's private data too long) leaves it waiting,
    /// and counting, until another accept or a reject.
    fn answered(&mut self, h: u32, reply: &Reply) {
        if matches!(reply.0, Response::Done) {
            if let Some(x) = self.ids.get_mut(&h) {
                x.pending_on = None;
            }
        }
    }

    fn answer_request(&mut self, now: u64, h: u32, conn: CmConnParam) -> Reply {
        let Some(x) = self.ids.get_mut(&h) else {
            return error(libc::EINVAL, "no such id");
        };
        let (Some(d), Some(c)) = (x.device, x.conn) else {
            return error(libc::EINVAL, "the id has no connection request");
        };
        match x.role {
            Role::SidrPassive => {
                let qkey = if conn.qkey == 0 {
                    rc::RDMA_UDP_QKEY
                } else {
                    conn.qkey
                };
                x.qkey = qkey;
                match self.devices[d].endpoint.sidr_reply(
                    now,
                    c,
                    sidr_status::SUCCESS,
                    conn.qp_num,
                    qkey,
                    &conn.private_data,
                ) {
                    Ok(()) => {
                        // Answered: the endpoint has forgotten the request. A refused answer
                        // (private data too long) leaves it waiting, as the kernel's id
                        // stays in SIDR_REQ_RCVD, for another accept or a reject.
                        x.conn = None;
                        self.conns.remove(&(d, c));
                        done()
                    }
                    Err(e) => error(libc::EINVAL, e.to_string()),
                }
            }
            Role::Passive => {
                let a = AcceptParams {
                    local_qpn: conn.qp_num,
                    starting_psn: x.local_psn,
                    responder_resources: conn.responder_resources,
                    initiator_depth: conn.initiator_depth,
                    flow_control: conn.flow_control != 0,
                    rnr_retry_count: conn.rnr_retry_count,
                    srq: conn.srq != 0,
                    private_data: conn.private_data,
                };
                if let Some(req) = &x.req {
                    x.negotiated =
                        Some(x.with_overrides(proto::cm::conn::negotiated_passive(req, &a)));
                }
                match self.devices[d].endpoint.accept(now, c, a) {
                    Ok(()) => done(),
                    Err(e) => error(libc::EINVAL, e.to_string()),
                }
            }
            _ => error(libc::EINVAL, "only a connection request can be accepted"),
        }
    }

    /// `rdma_reject`: a REJ (consumer defined), or a SIDR_REP that refuses.
    pub(super) fn reject(&mut self, now: u64, h: u32, private_data: &[u8]) -> Reply {
        let reply = self.refuse_request(now, h, private_data);
        self.answered(h, &reply);
        reply
    }

    fn refuse_request(&mut self, now: u64, h: u32, private_data: &[u8]) -> Reply {
        let Some(x) = self.ids.get_mut(&h) else {
            return error(libc::EINVAL, "no such id");
        };
        let (Some(d), Some(c)) = (x.device, x.conn) else {
            return error(libc::EINVAL, "nothing to reject");
        };
        let ep = &mut self.devices[d].endpoint;
        let r = if x.role == Role::SidrPassive {
            ep.sidr_reply(now, c, sidr_status::REJECT, 0, 0, private_data)
        } else {
            ep.reject(now, c, RejReason::CONSUMER_DEFINED, &[], private_data)
        };
        // A rejected request is forgotten at once; a rejected REP waits out timewait.
        if ep.state(c).is_none() {
            x.conn = None;
            self.conns.remove(&(d, c));
        }
        match r {
            Ok(()) => done(),
            Err(e) => error(libc::EINVAL, e.to_string()),
        }
    }

    /// `rdma_establish`: the active side sends the RTU; on the passive side the endpoint is
    /// told the connection is established.
    pub(super) fn establish(&mut self, now: u64, h: u32) -> Reply {
        let Some((d, c)) = self.conn_of(h) else {
            return error(libc::EINVAL, "the id is not connecting");
        };
        let role = self.ids.get(&h).map(|x| x.role);
        let ep = &mut self.devices[d].endpoint;
        let r = if role == Some(Role::Active) {
            ep.send_rtu(now, ConnId(c.0), &[])
        } else {
            ep.notify_comm_established(now, c)
        };
        match r {
            Ok(()) => done(),
            Err(e) => error(libc::EINVAL, e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::test_support::*;
    use crate::gsi::gsi_payload;
    use proto::cm::rdma_cm::{PortSpace, RdmaCmEventType as Ev};
    use proto::cm::GSI_QPN;
    use proto::ctl::{self, cm_ps, CmEventMsg, Request, RoceVersion};
    use std::net::IpAddr;
    use std::os::fd::OwnedFd;
    use std::path::Path;

    /// The CM MADs of a kernel capture: (source address, MAD) in order.
    fn captured_mads(name: &str) -> Vec<(IpAddr, Vec<u8>)> {
        use crate::pcap::{parse_record, CaptureReader};
        use proto::wire::NetRepr;
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/captures")
            .join(name);
        let mut r = CaptureReader::from_bytes(std::fs::read(&path).unwrap()).unwrap();
        let mut out = Vec::new();
        while let Some(rec) = r.next_record() {
            let rec = rec.unwrap();
            let Ok(f) = parse_record(&rec) else { continue };
            if f.repr.transport.bth.dest_qpn.value() != GSI_QPN {
                continue;
            }
            let src = match f.repr.net {
                NetRepr::Ipv4(ip) => IpAddr::V4(ip.src),
                NetRepr::Ipv6(ip) | NetRepr::Grh(ip) => IpAddr::V6(ip.src),
            };
            out.push((src, f.payload.to_vec()));
        }
        out
    }

    /// A listener (port space `ps`, QP type `qpt`) bound to `bind` on a device at 10.77.0.12,
    /// handed the first MAD of the kernel rxe capture `pcap` (its client's request), which it
    /// must report as one connect request: the service, its wire, the listener's events and
    /// the request (source, MAD). The listener's channel stays open while the caller holds
    /// its descriptor.
    fn kernel_request_to_listener(
        ps: u16,
        qpt: u32,
        bind: &str,
        pcap: &str,
    ) -> (CmService, Wire, OwnedFd, Vec<CmEventMsg>, (IpAddr, Vec<u8>)) {
        let (mut svc, wire) = service(&["10.77.0.12"], RoceVersion::V2);
        let (ch, fd) = channel(&mut svc, 1);
        let l = id(&mut svc, 1, ch, ps, qpt);
        ok(
            &mut svc,
            1,
            Request::CmBind {
                id: l,
                addr: sa(bind),
            },
        );
        ok(&mut svc, 1, Request::CmListen { id: l, backlog: 1 });
        let (src, req_mad) = captured_mads(pcap).swap_remove(0);
        let now = svc.now();
        svc.devices[0]
            .endpoint
            .handle_mad(now, src, &req_mad)
            .unwrap();
        svc.drain();
        let evs = events(&fd);
        assert_eq!(kinds(&evs), vec![Ev::ConnectRequest as u32]);
        (svc, wire, fd, evs, (src, req_mad))
    }

    /// A kernel rxe client's REQ (rping's, from the lab capture) reaches a softroce listener,
    /// which answers with a REP naming the kernel's comm ID, TID and PSN as ib_cm would.
    #[test]
    fn a_kernel_rxe_request_is_answered() {
        use proto::cm::{CmMad, CmMessage};
        let (mut svc, wire, _channel, evs, (src, req_mad)) =
            kernel_request_to_listener(cm_ps::TCP, qp_type::RC, "10.77.0.12:7174", "rping.pcap");
        let src = &src;
        let req = CmMad::parse(&req_mad).unwrap();
        let CmMessage::Req(kreq) = &req.message else {
            panic!("the capture starts with the REQ")
        };
        let child = evs[0].child.clone().unwrap();
        assert_eq!(evs[0].conn.qp_num, 0x21);
        assert_eq!(child.src_addr, Some(sa("10.77.0.12:7174")));
        assert_eq!(child.dst_addr.map(|a| a.ip()), Some(*src));
        let (attr, _) = qp_attr(&mut svc, 1, child.id, 2);
        // Linux reads a REQ's Starting PSN as the PSN its sender receives at: the passive
        // side sends from it (RTS) and receives at its own REP's (docs/interop.md).
        assert_eq!(attr.dest_qp_num, 0x21);
        assert_ne!(attr.rq_psn, kreq.starting_psn);
        assert_eq!(
            attr.path_mtu, 3,
            "the kernel's path MTU (1024 on a 1500-byte link)"
        );
        assert_eq!(attr.ah_attr.dgid, ctl::gid_of(*src));
        assert_eq!(attr.ah_attr.flow_label, kreq.primary_path.flow_label);
        let Response::CmQpAttr { attr: rts, .. } = ok(
            &mut svc,
            1,
            Request::CmInitQpAttr {
                id: child.id,
                qp_state: 3,
            },
        ) else {
            panic!()
        };
        assert_eq!(
            rts.timeout, kreq.primary_path.local_ack_timeout,
            "PLT 18 + 1"
        );
        ok(
            &mut svc,
            1,
            Request::CmAccept {
                id: child.id,
                conn: CmConnParam {
                    qp_num: 0x10011,
                    responder_resources: 1,
                    initiator_depth: 1,
                    rnr_retry_count: 7,
                    ..CmConnParam::default()
                },
            },
        );
        svc.drain();
        let sent = std::mem::take(&mut *wire.lock().unwrap());
        assert_eq!(sent.len(), 1);
        let (from, to, packet) = &sent[0];
        assert_eq!((*from, *to), ("10.77.0.12".parse().unwrap(), *src));
        let rep = CmMad::parse(gsi_payload(packet).unwrap()).unwrap();
        assert_eq!(rep.header.transaction_id, req.header.transaction_id);
        let CmMessage::Rep(r) = rep.message else {
            panic!("{rep:?}")
        };
        assert_eq!(r.remote_comm_id, kreq.local_comm_id);
        // Our REP carries the PSN we receive at; we send from the kernel's REQ PSN.
        assert_eq!((r.local_qpn, r.starting_psn), (0x10011, attr.rq_psn));
        assert_eq!(rts.sq_psn, kreq.starting_psn);
        assert_eq!(r.target_ack_delay, rc::RXE_ACK_DELAY);
    }

    /// udaddy's SIDR_REQ from the lab capture gets a SIDR_REP with our QPN and Q_Key.
    #[test]
    fn a_kernel_rxe_sidr_request_is_answered() {
        use proto::cm::{CmMad, CmMessage};
        let (mut svc, wire, _channel, evs, _) =
            kernel_request_to_listener(cm_ps::UDP, qp_type::UD, "0.0.0.0:7174", "udaddy.pcap");
        let child = evs[0].child.clone().unwrap().id;
        ok(
            &mut svc,
            1,
            Request::CmAccept {
                id: child,
                conn: CmConnParam {
                    qp_num: 0x10012,
                    ..CmConnParam::default()
                },
            },
        );
        svc.drain();
        let sent = std::mem::take(&mut *wire.lock().unwrap());
        let rep = CmMad::parse(gsi_payload(&sent[0].2).unwrap()).unwrap();
        let CmMessage::SidrRep(r) = rep.message else {
            panic!("{rep:?}")
        };
        assert_eq!((r.status, r.qpn, r.qkey), (0, 0x10012, rc::RDMA_UDP_QKEY));
        assert_eq!(r.service_id, rc::service_id(PortSpace::Udp, 7174));
    }

    /// An accept whose private data a SIDR_REP cannot carry fails, and leaves the request
    /// to be answered (as the kernel's ib_send_cm_sidr_rep, which fails with EINVAL then).
    #[test]
    fn a_refused_sidr_accept_leaves_the_request_answerable() {
        use proto::cm::{CmMad, CmMessage};
        let (mut svc, wire, _channel, evs, _) =
            kernel_request_to_listener(cm_ps::UDP, qp_type::UD, "0.0.0.0:7174", "udaddy.pcap");
        let child = evs[0].child.clone().unwrap().id;
        let too_long = CmConnParam {
            qp_num: 0x10012,
            private_data: vec![0xab; proto::cm::msg::private_data_len::SIDR_REP + 1],
            ..CmConnParam::default()
        };
        let r = call(
            &mut svc,
            1,
            Request::CmAccept {
                id: child,
                conn: too_long,
            },
        );
        assert_eq!(errno_of(r), libc::EINVAL);
        svc.drain();
        assert!(wire.lock().unwrap().is_empty(), "nothing was sent");
        let listener = svc.ids[&child].pending_on;
        assert!(
            listener.is_some(),
            "still unanswered: it counts toward the backlog"
        );
        let fits = CmConnParam {
            qp_num: 0x10012,
            private_data: b"ok".to_vec(),
            ..CmConnParam::default()
        };
        ok(
            &mut svc,
            1,
            Request::CmAccept {
                id: child,
                conn: fits,
            },
        );
        svc.drain();
        let sent = std::mem::take(&mut *wire.lock().unwrap());
        let rep = CmMad::parse(gsi_payload(&sent[0].2).unwrap()).unwrap();
        let CmMessage::SidrRep(r) = rep.message else {
            panic!("{rep:?}")
        };
        assert_eq!((r.status, r.qpn), (sidr_status::SUCCESS, 0x10012));
        assert!(r.private_data.starts_with(b"ok"));
        assert_eq!(svc.ids[&child].pending_on, None, "answered");
    }
}
