//! The client threads' requests ([`CmMsg::Request`](super::CmMsg::Request)): the id a request
//! names must be its client's; each goes to the method that serves it. Also the replies'
//! shapes and the id options (`rdma_set_option`).

use super::addressing::ps_of;
use super::ids::Id;
use super::{cm_id_of, CmService};
use proto::ctl::{cm_option, cm_ps, qp_type, Request, Response};
use std::os::fd::OwnedFd;

/// A reply to a client thread: the response and the descriptors that go with it (a new
/// channel's socket).
pub(super) type Reply = (Response, Vec<OwnedFd>);

/// An error reply.
pub(super) fn error(errno: i32, message: impl Into<String>) -> Reply {
    (
        Response::Error {
            errno,
            message: message.into(),
        },
        Vec::new(),
    )
}

/// The reply of a request done.
pub(super) fn done() -> Reply {
    (Response::Done, Vec::new())
}

impl CmService {
    /// Serves one request of `client`.
    pub(super) fn request(&mut self, client: u64, request: Request) -> Reply {
        let now = self.now();
        let r = match request {
            Request::CmCreateChannel => return self.create_channel(client),
            Request::CmDestroyChannel { channel } => {
                match self.channels.get(&channel) {
                    Some(c) if c.client == client => {}
                    _ => return error(libc::EINVAL, "no such event channel"),
                }
                if self.ids.values().any(|x| x.channel == channel) {
                    return error(libc::EBUSY, "ids still use the event channel");
                }
                self.channels.remove(&channel);
                return done();
            }
            Request::CmCreateId {
                channel,
                ps,
                qp_type: qpt,
            } => {
                if !self.owns_channel(client, channel) {
                    return error(libc::EINVAL, "no such event channel");
                }
                if ps_of(ps).is_none() || ps == cm_ps::IPOIB {
                    return error(libc::EPROTONOSUPPORT, "unsupported port space");
                }
                if ![qp_type::RC, qp_type::UC, qp_type::UD].contains(&qpt) {
                    return error(libc::EINVAL, "unsupported QP type");
                }
                self.next_handle += 1;
                let h = self.next_handle;
                self.ids.insert(h, Id::new(client, channel, ps, qpt));
                return (Response::CmId { id: h }, Vec::new());
            }
            other => other,
        };
        let Some(handle) = cm_id_of(&r) else {
            return error(libc::EINVAL, "not an rdma_cm request");
        };
        if self.ids.get(&handle).is_none_or(|x| x.client != client) {
            return error(libc::EINVAL, "no such rdma_cm id");
        }
        match r {
            Request::CmDestroyId { id } => {
                self.destroy_id(now, id);
                done()
            }
            Request::CmBind { id, addr } => match self.bind(id, addr) {
                Ok(()) => (Response::CmIdInfo(self.info(id)), Vec::new()),
                Err((errno, why)) => error(errno, why),
            },
            Request::CmResolveAddr {
                id,
                src,
                dst,
                timeout_ms,
            } => self.resolve_addr(id, src, dst, timeout_ms),
            Request::CmResolveRoute { id, .. } => self.resolve_route(id),
            Request::CmListen { id, .. } => self.listen(id),
            Request::CmConnect { id, conn, psn } => self.connect(now, id, conn, psn),
            Request::CmAccept { id, conn } => self.accept(now, id, conn),
            Request::CmReject { id, private_data } => self.reject(now, id, &private_data),
            Request::CmEstablish { id } => self.establish(now, id),
            Request::CmDisconnect { id, private_data } => {
                let Some((d, conn)) = self.conn_of(id) else {
                    return error(libc::EINVAL, "the id is not connected");
                };
                match self.devices[d]
                    .endpoint
                    .disconnect(now, conn, &private_data)
                {
                    Ok(()) => done(),
                    Err(e) => error(libc::EINVAL, e.to_string()),
                }
            }
            Request::CmInitQpAttr { id, qp_state } => self.init_qp_attr(id, qp_state),
            Request::CmSetOption {
                id,
                level,
                name,
                value,
            } => self.set_option(id, level, name, &value),
            Request::CmJoinMcast { id, addr, .. } => self.join_mcast(id, addr),
            Request::CmLeaveMcast { .. } => done(),
            Request::CmMigrateId { id, channel } => {
                if !self.owns_channel(client, channel) {
                    return error(libc::EINVAL, "no such event channel");
                }
                if let Some(x) = self.ids.get_mut(&id) {
                    x.channel = channel;
                }
                done()
            }
            Request::CmQueryId { id } => (Response::CmIdInfo(self.info(id)), Vec::new()),
            _ => error(libc::EINVAL, "not an rdma_cm request"),
        }
    }

    fn set_option(&mut self, h: u32, level: i32, name: i32, value: &[u8]) -> Reply {
        let Some(x) = self.ids.get_mut(&h) else {
            return error(libc::EINVAL, "no such id");
        };
        let byte = value.first().copied();
        let int = value
            .get(..4)
            .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
        match (level, name) {
            (cm_option::LEVEL_ID, cm_option::ID_TOS) => {
                let Some(v) = byte else {
                    return error(libc::EINVAL, "TOS is one byte");
                };
                x.tos = Some(v);
            }
            (cm_option::LEVEL_ID, cm_option::ID_REUSEADDR) => {
                let Some(v) = int else {
                    return error(libc::EINVAL, "REUSEADDR is an int");
                };
                x.reuse = v != 0;
            }
            (cm_option::LEVEL_ID, cm_option::ID_AFONLY) => {
                let Some(v) = int else {
                    return error(libc::EINVAL, "AFONLY is an int");
                };
                x.afonly = v != 0;
            }
            (cm_option::LEVEL_ID, cm_option::ID_ACK_TIMEOUT) => {
                let Some(v) = byte.filter(|v| *v <= 31) else {
                    return error(libc::EINVAL, "ACK timeout is one byte, at most 31");
                };
                x.ack_timeout = Some(v);
            }
            (cm_option::LEVEL_ID, cm_option::ID_MIN_RNR_TIMER) => {
                let Some(v) = byte.filter(|v| *v <= 31) else {
                    return error(libc::EINVAL, "min RNR timer is one byte, at most 31");
                };
                x.min_rnr_timer = Some(v);
            }
            _ => return error(libc::ENOSYS, "option not supported"),
        }
        if let Some(n) = x.negotiated {
            x.negotiated = Some(x.with_overrides(n));
        }
        done()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::test_support::*;
    use proto::cm::rdma_cm::{self as rc, RdmaCmEventType as Ev};
    use proto::ctl::{self, CmConnParam, RoceVersion};

    #[test]
    fn options_shape_the_qp_attributes_and_migrate_moves_events() {
        let (mut svc, wire) = service(&["127.0.0.1"], RoceVersion::V2);
        let (ch, fd) = channel(&mut svc, 1);
        let (ch_b, fd_b) = channel(&mut svc, 1);
        let l = listener(&mut svc, 1, ch, "127.0.0.1:7200");
        ok(
            &mut svc,
            1,
            Request::CmMigrateId {
                id: l,
                channel: ch_b,
            },
        );
        let (cch, cfd) = channel(&mut svc, 2);
        let a = id(&mut svc, 2, cch, cm_ps::TCP, qp_type::RC);
        for (name, v) in [(cm_option::ID_TOS, 0x20u8), (cm_option::ID_ACK_TIMEOUT, 14)] {
            ok(
                &mut svc,
                2,
                Request::CmSetOption {
                    id: a,
                    level: cm_option::LEVEL_ID,
                    name,
                    value: vec![v],
                },
            );
        }
        let r = call(
            &mut svc,
            2,
            Request::CmSetOption {
                id: a,
                level: cm_option::LEVEL_IB,
                name: cm_option::IB_PATH,
                value: vec![0; 64],
            },
        );
        assert_eq!(errno_of(r), libc::ENOSYS);
        ok(&mut svc, 2, resolve_addr_to(a, sa("127.0.0.1:7200")));
        ok(&mut svc, 2, resolve_route(a));
        let evs = events(&cfd);
        let path = evs[1].info.as_ref().unwrap().path.unwrap();
        assert_eq!((path.traffic_class, path.packet_life_time), (0x20, 13));
        assert_eq!(
            path.flow_label,
            rc::rdma_flow_label(evs[1].info.as_ref().unwrap().src_addr.unwrap().port(), 7200)
        );
        let r = call(&mut svc, 2, Request::CmInitQpAttr { id: a, qp_state: 2 });
        assert_eq!(errno_of(r), libc::EINVAL, "RTR needs the peer's REP");
        ok(
            &mut svc,
            2,
            Request::CmConnect {
                id: a,
                conn: CmConnParam {
                    qp_num: 0x20011,
                    ..CmConnParam::default()
                },
                psn: Some(7),
            },
        );
        settle(&mut svc, &wire);
        assert!(events(&fd).is_empty(), "the listener's events moved");
        let evs = events(&fd_b);
        let child = evs[0].child.clone().unwrap().id;
        ok(
            &mut svc,
            1,
            Request::CmAccept {
                id: child,
                conn: CmConnParam {
                    qp_num: 0x30011,
                    rnr_retry_count: 6,
                    private_data: b"ok".to_vec(),
                    ..CmConnParam::default()
                },
            },
        );
        settle(&mut svc, &wire);
        let evs = events(&cfd);
        assert_eq!(kinds(&evs), vec![Ev::ConnectResponse as u32]);
        assert_eq!(evs[0].conn.qp_num, 0x30011);
        let (attr, _) = qp_attr(&mut svc, 2, a, 3);
        assert_eq!(attr.timeout, 14, "the ACK timeout option");
        assert_eq!(attr.rnr_retry, 6, "RNR retry from the REP");
        // Linux: the active side sends from the REP's Starting PSN, not its own REQ's (7).
        assert_ne!(attr.sq_psn, 7);
        let (attr, _) = qp_attr(&mut svc, 2, a, 2);
        assert_eq!(attr.ah_attr.traffic_class, 0x20);
        assert_eq!(attr.ah_attr.dgid, ctl::gid_of("127.0.0.1".parse().unwrap()));
        ok(&mut svc, 2, Request::CmEstablish { id: a });
        settle(&mut svc, &wire);
        assert!(
            events(&cfd).is_empty(),
            "the shim reports the active ESTABLISHED"
        );
        assert_eq!(kinds(&events(&fd_b)), vec![Ev::Established as u32]);
        // The active client dies: its connection sends DREQ; the passive side hears it.
        svc.client_gone(2);
        settle(&mut svc, &wire);
        let evs = events(&fd_b);
        assert_eq!((evs[0].id, evs[0].event), (child, Ev::Disconnected as u32));
    }
}
