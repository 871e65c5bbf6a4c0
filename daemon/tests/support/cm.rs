//! rdma_cm through the control socket, as the shim's librdmacm does it: event channels whose
//! events arrive on a socketpair, ids, and QPs moved to RTS with `CmInitQpAttr`.
#![allow(dead_code)]

use super::client::{ok, Side};
use proto::cm::rdma_cm::RdmaCmEventType as Ev;
use proto::ctl::{self, CmConnParam, CmEventMsg, QpAttr, Request, Response};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

/// An event channel: its handle and our end of the socketpair.
pub struct Channel {
    pub channel: u32,
    pub fd: OwnedFd,
}

/// Waits at most `timeout` for the next event on `ch`; `None` if none came.
pub fn try_event(ch: &Channel, timeout: Duration) -> Option<CmEventMsg> {
    use nix::sys::socket::{recv, setsockopt, sockopt::ReceiveTimeout, MsgFlags};
    setsockopt(
        &ch.fd,
        ReceiveTimeout,
        &nix::sys::time::TimeVal::from(libc::timeval {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_usec: timeout.subsec_micros() as libc::suseconds_t,
        }),
    )
    .unwrap();
    let mut buf = vec![0u8; ctl::MAX_MESSAGE];
    let len = match recv(ch.fd.as_raw_fd(), &mut buf, MsgFlags::empty()) {
        Ok(n) => n,
        Err(nix::errno::Errno::EAGAIN) => return None,
        Err(e) => panic!("reading the event channel: {e}"),
    };
    assert!(len > 0, "event channel closed by the daemon");
    Some(ctl::decode(&buf[..len]).expect("an undecodable event"))
}

/// An event already waiting on `ch`, if any (never blocks).
pub fn poll_event(ch: &Channel) -> Option<CmEventMsg> {
    use nix::sys::socket::{recv, MsgFlags};
    let mut buf = vec![0u8; ctl::MAX_MESSAGE];
    match recv(ch.fd.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
        Ok(n) if n > 0 => Some(ctl::decode(&buf[..n]).expect("an undecodable event")),
        Ok(_) => panic!("event channel closed by the daemon"),
        Err(nix::errno::Errno::EAGAIN) => None,
        Err(e) => panic!("reading the event channel: {e}"),
    }
}

/// The next event, which must be `want` (20 s at most: CM retries on loopback never take that
/// long unless something is broken).
pub fn expect_event(ch: &Channel, want: Ev) -> CmEventMsg {
    let e = try_event(ch, Duration::from_secs(20))
        .unwrap_or_else(|| panic!("no event (waiting for {want:?})"));
    assert_eq!(e.event, want as u32, "waiting for {want:?}, got {e:?}");
    e
}

impl Side {
    pub fn cm(&mut self, r: Request) -> Response {
        self.client.request(&r).unwrap()
    }

    pub fn cm_ok(&mut self, r: Request) -> Response {
        ok(self.cm(r))
    }

    pub fn cm_channel(&mut self) -> Channel {
        let (r, mut fds) = self
            .client
            .request_fds(&Request::CmCreateChannel, &[])
            .unwrap();
        let Response::CmChannel { channel } = ok(r) else {
            panic!()
        };
        Channel {
            channel,
            fd: fds.pop().expect("the channel's fd"),
        }
    }

    pub fn cm_id(&mut self, ch: &Channel, ps: u16, qp_type: u32) -> u32 {
        let Response::CmId { id } = self.cm_ok(Request::CmCreateId {
            channel: ch.channel,
            ps,
            qp_type,
        }) else {
            panic!()
        };
        id
    }

    /// `rdma_bind_addr` + `rdma_listen`.
    pub fn cm_listen(&mut self, id: u32, addr: SocketAddr) -> ctl::CmIdInfo {
        let Response::CmIdInfo(info) = self.cm_ok(Request::CmBind { id, addr }) else {
            panic!()
        };
        self.cm_ok(Request::CmListen { id, backlog: 8 });
        info
    }

    /// `rdma_resolve_addr` + `rdma_resolve_route`, waiting for both events.
    pub fn cm_resolve(&mut self, ch: &Channel, id: u32, dst: SocketAddr) -> ctl::CmIdInfo {
        self.cm_ok(Request::CmResolveAddr {
            id,
            src: None,
            dst,
            timeout_ms: 2000,
        });
        expect_event(ch, Ev::AddrResolved);
        self.cm_ok(Request::CmResolveRoute {
            id,
            timeout_ms: 2000,
        });
        expect_event(ch, Ev::RouteResolved)
            .info
            .expect("the id's info")
    }

    /// `rdma_connect` for the QP `qp_num` with `private_data`, from a random PSN (the REQ's
    /// starting PSN is the daemon's choice, as the kernel's).
    pub fn cm_connect(&mut self, id: u32, qp_num: u32, private_data: &[u8]) {
        self.cm_ok(Request::CmConnect {
            id,
            conn: conn_param(qp_num, private_data),
            psn: None,
        });
    }

    /// `rdma_init_qp_attr` for `state`.
    pub fn cm_qp_attr(&mut self, id: u32, state: u32) -> (QpAttr, u32) {
        let Response::CmQpAttr { attr, mask } = self.cm_ok(Request::CmInitQpAttr {
            id,
            qp_state: state,
        }) else {
            panic!()
        };
        (attr, mask)
    }

    /// Moves this side's QP through `states` with the attributes rdma_cm gives; returns them.
    pub fn cm_modify(&mut self, id: u32, states: &[u32]) -> Vec<QpAttr> {
        let mut out = Vec::new();
        for &s in states {
            let (attr, mask) = self.cm_qp_attr(id, s);
            let qpn = self.qpn;
            ok(self
                .client
                .request(&Request::ModifyQp { qpn, attr, mask })
                .unwrap());
            out.push(attr);
        }
        out
    }
}

/// Connection parameters as rping and ucmatose pass them.
pub fn conn_param(qp_num: u32, private_data: &[u8]) -> CmConnParam {
    CmConnParam {
        private_data: private_data.to_vec(),
        responder_resources: 1,
        initiator_depth: 1,
        flow_control: 0,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: 0,
        qp_num,
        qkey: 0,
    }
}
