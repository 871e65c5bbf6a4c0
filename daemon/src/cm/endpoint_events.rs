//! What the devices' ib_cm endpoints report, as rdma_cm events on the ids' channels: a peer's
//! REP, RTU, REJ, DREQ and SIDR_REP, a connection that timed out or left timewait; and a REQ
//! or SIDR_REQ for a service we listen on, which the listener that takes it hands its program
//! as a new id (CONNECT_REQUEST).

use super::addressing::{gid_ip, listener_takes, ROUTE_HOP_LIMIT};
use super::ids::{Id, Role};
use super::{random_u32, CmService};
use proto::cm::msg::{sidr_status, ReqRepr};
use proto::cm::rdma_cm::{self as rc, CmaHdr, RdmaCmEventType as Ev};
use proto::cm::{AcceptParams, CmEvent, ConnId, RejReason};
use proto::ctl::{self, cm_ps, qp_type, CmConnParam, CmPathInfo, CmUdParam};
use std::net::{IpAddr, SocketAddr};
use tracing::debug;

/// Most connection requests a listener holds unanswered (ucma's `max_backlog`); more are
/// refused as the kernel does when the backlog is exhausted (REJ 28).
pub(super) const MAX_BACKLOG: usize = 1024;

impl CmService {
    /// One event of device `device`'s endpoint, as its id's rdma_cm event.
    pub(super) fn on_event(&mut self, device: usize, ev: CmEvent) {
        let (kind, status) = ev.rdma_cm_event();
        match ev {
            CmEvent::ConnectRequest {
                id,
                peer,
                req,
                service_id,
            } => {
                let pd = req.private_data.clone();
                self.on_connect_request(device, id, peer, service_id, pd, Some(req))
            }
            CmEvent::SidrRequest {
                id,
                peer,
                req,
                service_id,
            } => self.on_connect_request(device, id, peer, service_id, req.private_data, None),
            CmEvent::ConnectResponse { id, rep } => {
                let Some(&h) = self.conns.get(&(device, id)) else {
                    return;
                };
                let Some(x) = self.ids.get_mut(&h) else {
                    return;
                };
                if let Some(p) = &x.connect {
                    x.negotiated =
                        Some(x.with_overrides(proto::cm::conn::negotiated_active(p, &rep)));
                }
                let mut m = Self::event(kind, status);
                m.conn = CmConnParam {
                    private_data: rep.private_data.clone(),
                    responder_resources: rep.responder_resources,
                    initiator_depth: rep.initiator_depth,
                    flow_control: u8::from(rep.end_to_end_flow_control),
                    retry_count: 0,
                    rnr_retry_count: rep.rnr_retry_count,
                    srq: u8::from(rep.srq),
                    qp_num: rep.local_qpn,
                    qkey: 0,
                };
                self.emit(h, m);
            }
            CmEvent::Established { id } => {
                let Some(&h) = self.conns.get(&(device, id)) else {
                    return;
                };
                // The active side's ESTABLISHED is reported by the shim after CmEstablish
                // (librdmacm's ucma_process_conn_resp).
                if self.ids.get(&h).is_some_and(|x| x.role == Role::Active) {
                    return;
                }
                self.emit(h, Self::event(kind, status));
            }
            CmEvent::Rejected {
                id, private_data, ..
            } => {
                let Some(h) = self.forget_conn(device, id) else {
                    return;
                };
                let mut m = Self::event(kind, status);
                m.conn.private_data = private_data;
                self.emit(h, m);
            }
            CmEvent::Unreachable { id } => {
                let Some(h) = self.forget_conn(device, id) else {
                    return;
                };
                self.emit(h, Self::event(kind, status));
            }
            CmEvent::Disconnected {
                id, private_data, ..
            } => {
                let Some(&h) = self.conns.get(&(device, id)) else {
                    return;
                };
                let mut m = Self::event(kind, status);
                m.conn.private_data = private_data;
                self.emit(h, m);
            }
            CmEvent::TimewaitExit { id } => {
                let Some(h) = self.forget_conn(device, id) else {
                    return;
                };
                self.emit(h, Self::event(kind, status));
            }
            CmEvent::SidrResponse { id, rep } => {
                let Some(h) = self.forget_conn(device, id) else {
                    return;
                };
                let ah = self.ah_of(h);
                let mut m = Self::event(kind, status);
                if rep.status == sidr_status::SUCCESS {
                    m.ud = Some(CmUdParam {
                        ah_attr: ah,
                        qp_num: rep.qpn,
                        qkey: rep.qkey,
                    });
                    m.conn.qp_num = rep.qpn;
                    m.conn.qkey = rep.qkey;
                }
                m.conn.private_data = rep.private_data.clone();
                self.emit(h, m);
            }
        }
    }

    /// The id of a connection the endpoint has finished with (rejected, unreachable, out of
    /// timewait, SIDR answered), which no longer has it (nor is a request waiting on its
    /// listener).
    fn forget_conn(&mut self, device: usize, conn: ConnId) -> Option<u32> {
        let h = self.conns.remove(&(device, conn))?;
        if let Some(x) = self.ids.get_mut(&h) {
            x.conn = None;
            x.pending_on = None;
        }
        Some(h)
    }

    /// A REQ (`req`), or a SIDR_REQ when `req` is `None`, for a service we listen on: find the
    /// listener by port space, port and the destination address of the rdma_cm header; give
    /// the program a new id for it.
    fn on_connect_request(
        &mut self,
        device: usize,
        conn: ConnId,
        peer: IpAddr,
        service_id: u64,
        private_data: Vec<u8>,
        req: Option<Box<ReqRepr>>,
    ) {
        let now = self.now();
        let sidr = req.is_none();
        let parsed = rc::parse_service_id(service_id);
        let hdr = CmaHdr::parse(&private_data).ok();
        let listener = match (parsed, hdr) {
            (Some((ps, port)), Some(hdr)) => self
                .ids
                .iter()
                .filter(|(_, x)| {
                    x.role == Role::Listen
                        && x.port == Some(port)
                        && (x.ps == ps as u16 || x.ps == cm_ps::IB)
                        && x.device.is_none_or(|d| d == device)
                        && x.src
                            .is_some_and(|s| listener_takes(s.ip(), x.afonly, hdr.dst_addr))
                })
                // An exact address wins over a wildcard.
                .min_by_key(|(_, x)| x.src.is_some_and(|s| s.ip().is_unspecified()))
                .map(|(h, _)| (*h, hdr)),
            _ => None,
        };
        let d = &mut self.devices[device];
        // ib_cm / rdma_cm's refusal: REJ "consumer defined" (28), or the SIDR status.
        let mut refuse = |sidr_status: u8| {
            let _ = if sidr {
                d.endpoint.sidr_reply(now, conn, sidr_status, 0, 0, &[])
            } else {
                d.endpoint
                    .reject(now, conn, RejReason::CONSUMER_DEFINED, &[], &[])
            };
        };
        let Some((lh, hdr)) = listener else {
            debug!(
                service = service_id,
                "REQ for no matching listener: rejected"
            );
            refuse(sidr_status::UNSUPPORTED);
            return;
        };
        let waiting = self
            .ids
            .values()
            .filter(|x| x.pending_on == Some(lh))
            .count();
        if waiting >= MAX_BACKLOG {
            debug!(listener = lh, "connection request refused: backlog full");
            refuse(sidr_status::REJECT);
            return;
        }
        let Some(l) = self.ids.get(&lh) else { return };
        // The child answers from the address the peer asked for, when it is ours.
        let local_ip = if d.addrs.contains(&hdr.dst_addr) {
            hdr.dst_addr
        } else {
            d.local_for(peer).unwrap_or(hdr.dst_addr)
        };
        let mut child = Id::new(l.client, l.channel, l.ps, l.qp_type);
        child.device = Some(device);
        // Answered, and connected, in the version the request came in.
        child.gid_type = Some(d.mad_version(peer));
        child.pending_on = Some(lh);
        child.src = Some(SocketAddr::new(hdr.dst_addr, l.port.unwrap_or(0)));
        child.dst = Some(SocketAddr::new(hdr.src_addr, hdr.src_port));
        child.peer_ip = Some(peer);
        child.conn = Some(conn);
        child.local_psn = random_u32() & 0xff_ffff;
        child.tos = l.tos;
        child.ack_timeout = l.ack_timeout;
        child.min_rnr_timer = l.min_rnr_timer;
        let user_pd = private_data
            .get(rc::CMA_HDR_LEN..)
            .unwrap_or_default()
            .to_vec();
        let mut m = Self::event(Ev::ConnectRequest, 0);
        match req {
            None => {
                child.role = Role::SidrPassive;
                child.qp_type = qp_type::UD;
                child.path = Some(CmPathInfo {
                    sgid: ctl::gid_of(local_ip),
                    dgid: ctl::gid_of(peer),
                    hop_limit: ROUTE_HOP_LIMIT,
                    pkey: 0xffff,
                    mtu: d.setup.info.active_mtu,
                    packet_life_time: rc::CMA_IBOE_PACKET_LIFETIME,
                    ..CmPathInfo::default()
                });
                m.conn.private_data = user_pd;
            }
            Some(req) => {
                child.role = Role::Passive;
                let p = &req.primary_path;
                // cm_format_paths_from_req: the connection's path is the REQ's, seen from
                // this side (its local GID is the peer's QP address, its remote GID ours).
                let (their, ours) = (gid_ip(p.local_gid), gid_ip(p.remote_gid));
                if d.addrs.contains(&ours) && !their.is_unspecified() {
                    child.peer_ip = Some(their);
                    child.wire_local = Some(ours);
                }
                child.path = Some(CmPathInfo {
                    sgid: ctl::gid_of(child.wire_local.unwrap_or(local_ip)),
                    dgid: ctl::gid_of(child.peer_ip.unwrap_or(peer)),
                    flow_label: p.flow_label,
                    hop_limit: p.hop_limit,
                    traffic_class: p.traffic_class,
                    sl: p.sl,
                    pkey: req.pkey,
                    mtu: req.path_mtu,
                    rate: p.packet_rate,
                    packet_life_time: p.local_ack_timeout.saturating_sub(1),
                });
                // ib_cm's passive side: our responder resources are the peer's initiator
                // depth and the other way round, until rdma_accept says otherwise.
                let a = AcceptParams {
                    local_qpn: 0,
                    starting_psn: child.local_psn,
                    responder_resources: req.initiator_depth,
                    initiator_depth: req.responder_resources,
                    flow_control: req.end_to_end_flow_control,
                    rnr_retry_count: req.rnr_retry_count,
                    srq: req.srq,
                    private_data: Vec::new(),
                };
                child.negotiated =
                    Some(child.with_overrides(proto::cm::conn::negotiated_passive(&req, &a)));
                m.conn = CmConnParam {
                    private_data: user_pd,
                    responder_resources: req.responder_resources,
                    initiator_depth: req.initiator_depth,
                    flow_control: u8::from(req.end_to_end_flow_control),
                    retry_count: req.retry_count,
                    rnr_retry_count: req.rnr_retry_count,
                    srq: u8::from(req.srq),
                    qp_num: req.local_qpn,
                    qkey: 0,
                };
                child.req = Some(req);
            }
        }
        self.next_handle += 1;
        let ch = self.next_handle;
        self.ids.insert(ch, child);
        self.conns.insert((device, conn), ch);
        if sidr {
            m.ud = Some(CmUdParam {
                ah_attr: self.ah_of(ch),
                qp_num: 0,
                qkey: 0,
            });
        }
        m.child = Some(self.info(ch));
        self.emit(lh, m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::qp_mask;
    use crate::cm::test_support::*;
    use proto::ctl::{cm_option, Request, RoceVersion};
    use std::os::fd::OwnedFd;

    /// A new active id of client 2 on channel `ch`, resolved to `dst` and connecting with QP
    /// `qpn` (the REQ sent and the wire settled); returns the id. What a listener made of
    /// the REQ is for the caller to read from its own channel.
    fn start_connect(
        svc: &mut CmService,
        wire: &Wire,
        ch: (u32, &OwnedFd),
        dst: SocketAddr,
        qpn: u32,
    ) -> u32 {
        let a = id(svc, 2, ch.0, cm_ps::TCP, qp_type::RC);
        ok(svc, 2, resolve_addr_to(a, dst));
        ok(svc, 2, resolve_route(a));
        assert_eq!(
            kinds(&events(ch.1)),
            vec![Ev::AddrResolved as u32, Ev::RouteResolved as u32]
        );
        ok(
            svc,
            2,
            Request::CmConnect {
                id: a,
                conn: CmConnParam {
                    qp_num: qpn,
                    responder_resources: 2,
                    initiator_depth: 3,
                    retry_count: 6,
                    rnr_retry_count: 5,
                    ..CmConnParam::default()
                },
                psn: Some(0x42),
            },
        );
        settle(svc, wire);
        a
    }

    #[test]
    fn an_ipv6_wildcard_listener_takes_ipv4_unless_afonly() {
        let (mut svc, wire) = service(&["127.0.0.1", "::1"], RoceVersion::V2);
        let (ch, fd) = channel(&mut svc, 1);
        let l = listener(&mut svc, 1, ch, "[::]:7100");
        let (cch, cfd) = channel(&mut svc, 2);
        let a = start_connect(&mut svc, &wire, (cch, &cfd), sa("127.0.0.1:7100"), 0x10011);
        let evs = events(&fd);
        assert_eq!(kinds(&evs), vec![Ev::ConnectRequest as u32]);
        let req = &evs[0];
        assert_eq!(req.id, l);
        assert_eq!(
            (
                req.conn.qp_num,
                req.conn.responder_resources,
                req.conn.initiator_depth
            ),
            (0x10011, 2, 3)
        );
        let child = req.child.clone().unwrap();
        assert_eq!(child.src_addr, Some(sa("127.0.0.1:7100")));
        assert_eq!(
            child.dst_addr.map(|d| d.ip()),
            Some("127.0.0.1".parse().unwrap())
        );
        // The child's QP attributes come from the REQ: our rd_atomic bounds are the peer's
        // initiator depth and responder resources.
        let (attr, mask) = qp_attr(&mut svc, 1, child.id, 2);
        assert_eq!(attr.dest_qp_num, 0x10011);
        assert_ne!(
            attr.rq_psn, 0x42,
            "the passive side receives at its own PSN (the REP's)"
        );
        assert_eq!(attr.max_dest_rd_atomic, 3);
        assert_eq!(attr.min_rnr_timer, 0, "rdma_cm's default (facts §5.2)");
        assert_eq!(
            mask,
            qp_mask::STATE
                | qp_mask::AV
                | qp_mask::PATH_MTU
                | qp_mask::DEST_QPN
                | qp_mask::RQ_PSN
                | qp_mask::MAX_DEST_RD_ATOMIC
                | qp_mask::MIN_RNR_TIMER
        );
        // Destroying the child before accepting it rejects the request (consumer defined).
        ok(&mut svc, 1, Request::CmDestroyId { id: child.id });
        settle(&mut svc, &wire);
        let evs = events(&cfd);
        assert_eq!(kinds(&evs), vec![Ev::Rejected as u32]);
        assert_eq!((evs[0].id, evs[0].status), (a, 28));

        // AFONLY: the IPv6 wildcard no longer takes IPv4; nobody else listens on that port,
        // yet the service ID is listened on, so the answer is REJ 28 from rdma_cm.
        ok(
            &mut svc,
            1,
            Request::CmSetOption {
                id: l,
                level: cm_option::LEVEL_ID,
                name: cm_option::ID_AFONLY,
                value: 1i32.to_ne_bytes().to_vec(),
            },
        );
        let b = start_connect(&mut svc, &wire, (cch, &cfd), sa("127.0.0.1:7100"), 0x10012);
        assert!(events(&fd).is_empty());
        let evs = events(&cfd);
        assert_eq!((evs[0].id, evs[0].event), (b, Ev::Rejected as u32));
    }
}
