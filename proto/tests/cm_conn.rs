//! Two CM endpoints exchanging MADs in memory under virtual time: every ib_cm exchange the
//! daemon relies on, with losses injected, checked message by message and against ib_cm's
//! timing.

use proto::cm::conn::{
    req_timeout_ms, AcceptParams, CmApiError, CmEndpoint, CmEvent, ConnId, ConnectParams,
    DisconnectCause, EndpointConfig, SidrParams, State, Transmit,
};
use proto::cm::msg::{attr, msg_kind, sidr_status, transport, CmMad, CmMessage, CmPath, RejReason};
use proto::cm::rdma_cm;
use std::net::{IpAddr, Ipv4Addr};

const MS: u64 = 1_000_000;
const A_ADDR: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 77, 0, 11));
const B_ADDR: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 77, 0, 12));
const SID: u64 = 0x0000_0000_0106_1c06;
const UDP_SID: u64 = 0x0000_0000_0111_1c06;
/// REQ retransmission period with rdma_cm's defaults on RoCE (PLT 16, response timeout 20).
const REQ_PERIOD_MS: u64 = 4608;
/// Passive side's REP / DREQ period: 2^(20-8) ms.
const REP_PERIOD_MS: u64 = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    A,
    B,
}

/// What went over the wire: sender, attribute, decoded message, TID.
#[derive(Debug, Clone)]
struct Sent {
    from: Side,
    at: u64,
    attr: u16,
    tid: u64,
    msg: CmMessage,
    dropped: bool,
}

struct Net {
    a: CmEndpoint,
    b: CmEndpoint,
    now: u64,
    log: Vec<Sent>,
    /// Drop the n-th (0-based) message of this attribute from this side.
    drops: Vec<(Side, u16, usize)>,
    /// Drop every message of this attribute from this side.
    drop_all: Vec<(Side, u16)>,
    ev_a: Vec<CmEvent>,
    ev_b: Vec<CmEvent>,
}

impl Net {
    fn new() -> Net {
        Net {
            a: CmEndpoint::new(EndpointConfig::new(0xa0a0, 2, 0x1111_2222)),
            b: CmEndpoint::new(EndpointConfig::new(0xb0b0, 3, 0x3333_4444)),
            now: 1_000 * MS,
            log: Vec::new(),
            drops: Vec::new(),
            drop_all: Vec::new(),
            ev_a: Vec::new(),
            ev_b: Vec::new(),
        }
    }

    fn sent_count(&self, from: Side, attr: u16) -> usize {
        self.log
            .iter()
            .filter(|s| s.from == from && s.attr == attr)
            .count()
    }

    fn deliver(&mut self, from: Side, t: Transmit) {
        let mad = CmMad::parse(&t.mad).expect("endpoints send well-formed MADs");
        let attr = mad.header.attribute_id;
        let nth = self.sent_count(from, attr);
        let dropped =
            self.drops.contains(&(from, attr, nth)) || self.drop_all.contains(&(from, attr));
        self.log.push(Sent {
            from,
            at: self.now,
            attr,
            tid: mad.header.transaction_id,
            msg: mad.message,
            dropped,
        });
        if dropped {
            return;
        }
        let (to, src) = match from {
            Side::A => (&mut self.b, A_ADDR),
            Side::B => (&mut self.a, B_ADDR),
        };
        assert_eq!(t.peer, if from == Side::A { B_ADDR } else { A_ADDR });
        to.handle_mad(self.now, src, &t.mad).unwrap();
    }

    /// Delivers until both endpoints are quiet, collecting events.
    fn pump(&mut self) {
        loop {
            if let Some(t) = self.a.poll_transmit() {
                self.deliver(Side::A, t);
            } else if let Some(t) = self.b.poll_transmit() {
                self.deliver(Side::B, t);
            } else {
                break;
            }
        }
        while let Some(e) = self.a.poll_event() {
            self.ev_a.push(e);
        }
        while let Some(e) = self.b.poll_event() {
            self.ev_b.push(e);
        }
    }

    /// Jumps to the earliest timer of either side, fires it, and pumps.
    fn advance(&mut self) -> Option<u64> {
        let next = [self.a.poll_timeout(), self.b.poll_timeout()]
            .into_iter()
            .flatten()
            .min()?;
        assert!(next >= self.now, "timers never lie in the past");
        self.now = next;
        self.a.handle_timeout(self.now);
        self.b.handle_timeout(self.now);
        self.pump();
        Some(next)
    }

    fn run_until_idle(&mut self) {
        while self.advance().is_some() {}
    }

    fn sent(&self, from: Side, attr: u16) -> Vec<&Sent> {
        self.log
            .iter()
            .filter(|s| s.from == from && s.attr == attr)
            .collect()
    }

    fn sequence(&self) -> Vec<(Side, &'static str)> {
        self.log
            .iter()
            .map(|s| (s.from, proto::wire::mad::cm_attribute_name(s.attr)))
            .collect()
    }
}

fn connect_params() -> ConnectParams {
    ConnectParams {
        peer: B_ADDR,
        service_id: SID,
        transport_type: transport::RC,
        local_qpn: 0x11,
        starting_psn: 0xabcdef,
        primary_path: CmPath {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: rdma_cm::ip_to_gid(A_ADDR),
            remote_gid: rdma_cm::ip_to_gid(B_ADDR),
            flow_label: 0x12345,
            hop_limit: 64,
            local_ack_timeout: 17,
            ..CmPath::default()
        },
        path_mtu: 3,
        packet_life_time: 16,
        responder_resources: 1,
        initiator_depth: 1,
        flow_control: false,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: false,
        remote_cm_response_timeout: 20,
        local_cm_response_timeout: 20,
        max_cm_retries: 15,
        private_data: vec![0x55; 40],
    }
}

fn accept_params() -> AcceptParams {
    AcceptParams {
        local_qpn: 0x12,
        starting_psn: 0x123456,
        responder_resources: 1,
        initiator_depth: 1,
        flow_control: false,
        rnr_retry_count: 7,
        srq: false,
        private_data: vec![0x66; 8],
    }
}

/// A connects to B, which listens; returns (A's id, B's id) once B has the REQ.
fn start(net: &mut Net) -> (ConnId, ConnId) {
    net.b.listen(SID).unwrap();
    let a = net.a.connect(net.now, connect_params()).unwrap();
    net.pump();
    let b = match net.ev_b.last() {
        Some(CmEvent::ConnectRequest {
            id,
            service_id,
            peer,
            req,
        }) => {
            assert_eq!((*service_id, *peer), (SID, A_ADDR));
            assert_eq!(req.local_qpn, 0x11);
            assert_eq!(req.private_data[..40], [0x55; 40]);
            *id
        }
        other => panic!("B expected CONNECT_REQUEST, has {other:?}"),
    };
    (a, b)
}

/// Accepts on B and completes on A when its REP arrives.
fn establish(net: &mut Net) -> (ConnId, ConnId) {
    let (a, b) = start(net);
    net.b.accept(net.now, b, accept_params()).unwrap();
    net.pump();
    complete_on_rep(net, a);
    (a, b)
}

fn complete_on_rep(net: &mut Net, a: ConnId) {
    match net.ev_a.last() {
        Some(CmEvent::ConnectResponse { id, rep }) => {
            assert_eq!(*id, a);
            assert_eq!((rep.local_qpn, rep.starting_psn), (0x12, 0x123456));
            assert_eq!(rep.target_ack_delay, rdma_cm::RXE_ACK_DELAY);
        }
        other => panic!("A expected CONNECT_RESPONSE, has {other:?}"),
    }
    net.a.send_rtu(net.now, a, &[]).unwrap();
    net.pump();
}

#[test]
fn connect_accept_establish() {
    let mut net = Net::new();
    let (a, b) = establish(&mut net);
    assert_eq!(
        net.sequence(),
        vec![(Side::A, "REQ"), (Side::B, "REP"), (Side::A, "RTU")]
    );
    assert_eq!(net.ev_a.last(), Some(&CmEvent::Established { id: a }));
    assert_eq!(net.ev_b.last(), Some(&CmEvent::Established { id: b }));
    assert_eq!(net.a.state(a), Some(State::Established));
    assert_eq!(net.b.state(b), Some(State::Established));
    // One TID for the whole exchange: A's hi_tid (2) and A's comm ID in CPU order.
    let tid = net.log[0].tid;
    assert_eq!(tid >> 32, 2);
    assert_eq!(tid as u32, a.0.swap_bytes());
    assert!(net.log.iter().all(|s| s.tid == tid));
    // Comm IDs cross-referenced.
    let CmMessage::Rep(rep) = &net.log[1].msg else {
        panic!()
    };
    assert_eq!((rep.local_comm_id, rep.remote_comm_id), (b.0, a.0));
    let CmMessage::Rtu(rtu) = &net.log[2].msg else {
        panic!()
    };
    assert_eq!((rtu.local_comm_id, rtu.remote_comm_id), (a.0, b.0));
    // Nothing is left armed while established.
    assert_eq!(net.a.poll_timeout(), None);
    assert_eq!(net.b.poll_timeout(), None);
}

#[test]
fn consumer_reject() {
    let mut net = Net::new();
    let (a, b) = start(&mut net);
    net.b
        .reject(net.now, b, RejReason::CONSUMER_DEFINED, &[], b"go away")
        .unwrap();
    net.pump();
    match net.ev_a.last() {
        Some(CmEvent::Rejected {
            id,
            reason,
            private_data,
            ..
        }) => {
            assert_eq!((*id, *reason), (a, RejReason::CONSUMER_DEFINED));
            assert_eq!(&private_data[..7], b"go away");
        }
        other => panic!("{other:?}"),
    }
    let CmMessage::Rej(rej) = &net.log[1].msg else {
        panic!()
    };
    assert_eq!(rej.message_rejected, msg_kind::REQ);
    assert_eq!((rej.local_comm_id, rej.remote_comm_id), (b.0, a.0));
    assert!(net.a.is_empty() && net.b.is_empty());
    assert_eq!(
        net.b.accept(net.now, b, accept_params()),
        Err(CmApiError::UnknownConn(b.0))
    );
}

#[test]
fn no_listener_is_rejected_with_invalid_service_id() {
    let mut net = Net::new();
    let a = net.a.connect(net.now, connect_params()).unwrap();
    net.pump();
    assert_eq!(net.sequence(), vec![(Side::A, "REQ"), (Side::B, "REJ")]);
    let CmMessage::Rej(rej) = &net.log[1].msg else {
        panic!()
    };
    assert_eq!(rej.reason, RejReason::INVALID_SERVICE_ID);
    assert_eq!((rej.local_comm_id, rej.remote_comm_id), (0, a.0));
    assert_eq!(net.log[1].tid, net.log[0].tid);
    assert!(matches!(
        net.ev_a.last(),
        Some(CmEvent::Rejected {
            reason: RejReason::INVALID_SERVICE_ID,
            ..
        })
    ));
    assert!(net.a.is_empty() && net.b.is_empty());
    assert!(net.ev_b.is_empty());
}

#[test]
fn lost_req_is_retransmitted_after_the_ib_cm_timeout() {
    let mut net = Net::new();
    net.drops.push((Side::A, attr::REQ, 0));
    net.b.listen(SID).unwrap();
    let t0 = net.now;
    let a = net.a.connect(t0, connect_params()).unwrap();
    net.pump();
    assert!(net.ev_b.is_empty());
    assert_eq!(net.a.poll_timeout(), Some(t0 + REQ_PERIOD_MS * MS));
    assert_eq!(req_timeout_ms(16, 20), REQ_PERIOD_MS);
    net.advance();
    let reqs = net.sent(Side::A, attr::REQ);
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[1].at, t0 + REQ_PERIOD_MS * MS);
    assert!(reqs[0].dropped && !reqs[1].dropped);
    assert_eq!(
        reqs[0].msg, reqs[1].msg,
        "the retransmission is the same REQ"
    );
    let Some(CmEvent::ConnectRequest { id: b, .. }) = net.ev_b.last().cloned() else {
        panic!("{:?}", net.ev_b)
    };
    net.b.accept(net.now, b, accept_params()).unwrap();
    net.pump();
    complete_on_rep(&mut net, a);
    assert_eq!(net.ev_b.last(), Some(&CmEvent::Established { id: b }));
}

#[test]
fn lost_rep_is_retransmitted_by_the_passive_side() {
    let mut net = Net::new();
    net.drops.push((Side::B, attr::REP, 0));
    let (a, b) = start(&mut net);
    let t_accept = net.now;
    net.b.accept(t_accept, b, accept_params()).unwrap();
    net.pump();
    assert_eq!(net.b.state(b), Some(State::RepSent));
    // The passive REP period comes from the REQ's local CM response timeout (20): 4096 ms,
    // shorter than A's REQ period, so B's REP goes first.
    assert_eq!(net.b.poll_timeout(), Some(t_accept + REP_PERIOD_MS * MS));
    net.advance();
    let reps = net.sent(Side::B, attr::REP);
    assert_eq!(reps.len(), 2);
    assert_eq!(reps[1].at, t_accept + REP_PERIOD_MS * MS);
    complete_on_rep(&mut net, a);
    assert_eq!(net.ev_b.last(), Some(&CmEvent::Established { id: b }));
    // A's REQ timer died with the REP: no REQ retransmission ever happened.
    assert_eq!(net.sent(Side::A, attr::REQ).len(), 1);
}

#[test]
fn lost_rtu_is_recovered_by_rep_retransmission() {
    let mut net = Net::new();
    net.drops.push((Side::A, attr::RTU, 0));
    let (a, b) = establish(&mut net);
    assert_eq!(net.a.state(a), Some(State::Established));
    assert_eq!(net.b.state(b), Some(State::RepSent));
    net.advance();
    // B resent its REP; A, established, answered with the RTU again; B is established.
    assert_eq!(net.sequence()[3..], [(Side::B, "REP"), (Side::A, "RTU")]);
    assert_eq!(net.ev_b.last(), Some(&CmEvent::Established { id: b }));
    assert_eq!(net.b.poll_timeout(), None);
}

#[test]
fn lost_rtu_then_first_data_establishes_the_passive_side() {
    let mut net = Net::new();
    net.drop_all.push((Side::A, attr::RTU));
    let (_a, b) = establish(&mut net);
    assert_eq!(net.b.state(b), Some(State::RepSent));
    // The daemon sees the first packet on B's QP (IB_EVENT_COMM_EST).
    net.b.notify_comm_established(net.now, b).unwrap();
    net.pump();
    assert_eq!(net.ev_b.last(), Some(&CmEvent::Established { id: b }));
    assert_eq!(net.b.poll_timeout(), None, "no more REP retransmissions");
}

#[test]
fn all_reqs_lost_is_unreachable_after_every_retry() {
    let mut net = Net::new();
    net.drop_all.push((Side::A, attr::REQ));
    net.b.listen(SID).unwrap();
    let t0 = net.now;
    let a = net.a.connect(t0, connect_params()).unwrap();
    net.pump();
    net.run_until_idle();
    // 1 + max_cm_retries (15) sends, REQ_PERIOD apart; UNREACHABLE one period after the last.
    let reqs = net.sent(Side::A, attr::REQ);
    assert_eq!(reqs.len(), 16);
    for (i, r) in reqs.iter().enumerate() {
        assert_eq!(r.at, t0 + i as u64 * REQ_PERIOD_MS * MS);
    }
    assert_eq!(net.ev_a, vec![CmEvent::Unreachable { id: a }]);
    assert_eq!(net.now, t0 + 16 * REQ_PERIOD_MS * MS);
    assert!(net.a.is_empty());
}

#[test]
fn duplicate_req_before_accept_gets_an_mra() {
    let mut net = Net::new();
    net.drop_all.push((Side::B, attr::REP)); // irrelevant: B does not accept yet
    let (a, b) = start(&mut net);
    // A's REQ timer fires: B still deciding, answers the duplicate with MRA (timeout 24).
    net.advance();
    assert_eq!(
        net.sequence(),
        vec![(Side::A, "REQ"), (Side::A, "REQ"), (Side::B, "MRA")]
    );
    let CmMessage::Mra(mra) = &net.log[2].msg else {
        panic!()
    };
    assert_eq!(mra.message_mraed, msg_kind::REQ);
    assert_eq!(mra.service_timeout, rdma_cm::CMA_CM_MRA_SETTING);
    assert_eq!((mra.local_comm_id, mra.remote_comm_id), (b.0, a.0));
    assert_eq!(net.a.state(a), Some(State::MraReqRcvd));
    assert_eq!(net.b.state(b), Some(State::MraReqSent));
    // Only one CONNECT_REQUEST for both copies.
    assert_eq!(net.ev_b.len(), 1);
    // A now waits 2^(24-8) + 2^(17-8) ms before it tries again.
    assert_eq!(net.a.poll_timeout(), Some(net.now + (65536 + 512) * MS));
    // B accepts late; everything completes.
    net.drop_all.clear();
    net.b.accept(net.now, b, accept_params()).unwrap();
    net.pump();
    complete_on_rep(&mut net, a);
    assert_eq!(net.ev_b.last(), Some(&CmEvent::Established { id: b }));
}

#[test]
fn duplicate_rep_before_rtu_gets_an_mra_and_after_rtu_the_rtu() {
    let mut net = Net::new();
    let (a, b) = start(&mut net);
    net.b.accept(net.now, b, accept_params()).unwrap();
    net.pump();
    // A has the REP but its consumer has not sent the RTU yet; B's REP timer fires.
    net.advance();
    assert_eq!(net.sequence()[2..], [(Side::B, "REP"), (Side::A, "MRA")]);
    let CmMessage::Mra(mra) = &net.log[3].msg else {
        panic!()
    };
    assert_eq!(mra.message_mraed, msg_kind::REP);
    assert_eq!(net.b.state(b), Some(State::MraRepRcvd));
    assert_eq!(net.a.state(a), Some(State::MraRepSent));
    assert_eq!(
        net.ev_a
            .iter()
            .filter(|e| matches!(e, CmEvent::ConnectResponse { .. }))
            .count(),
        1
    );
    net.a.send_rtu(net.now, a, &[]).unwrap();
    net.pump();
    assert_eq!(net.ev_b.last(), Some(&CmEvent::Established { id: b }));
}

fn disconnected(ev: Option<&CmEvent>) -> Option<(ConnId, DisconnectCause)> {
    match ev {
        Some(CmEvent::Disconnected { id, cause, .. }) => Some((*id, *cause)),
        _ => None,
    }
}

#[test]
fn disconnect_from_the_active_side() {
    let mut net = Net::new();
    let (a, b) = establish(&mut net);
    net.a.disconnect(net.now, a, b"bye").unwrap();
    net.pump();
    assert_eq!(
        disconnected(net.ev_b.last()),
        Some((b, DisconnectCause::DreqReceived))
    );
    net.b.disconnect(net.now, b, &[]).unwrap();
    net.pump();
    assert_eq!(
        disconnected(net.ev_a.last()),
        Some((a, DisconnectCause::DrepReceived))
    );
    assert_eq!(net.sequence()[3..], [(Side::A, "DREQ"), (Side::B, "DREP")]);
    let (dreq, drep) = (&net.log[3], &net.log[4]);
    assert_eq!(dreq.tid, drep.tid, "DREP reuses the DREQ's TID");
    let CmMessage::Dreq(d) = &dreq.msg else {
        panic!()
    };
    assert_eq!(d.remote_qpn_eecn, 0x12);
    assert_eq!(&d.private_data[..3], b"bye");
    assert_eq!(net.a.state(a), Some(State::Timewait));
    assert_eq!(net.b.state(b), Some(State::Timewait));
    // Timewait: 2^(av.timeout-8) ms, av.timeout = PLT + 1 = 17 on A, the REQ's ACK timeout
    // (17) on B.
    let t = net.now;
    net.run_until_idle();
    assert_eq!(net.ev_a.last(), Some(&CmEvent::TimewaitExit { id: a }));
    assert_eq!(net.ev_b.last(), Some(&CmEvent::TimewaitExit { id: b }));
    assert_eq!(net.now, t + 512 * MS);
    assert!(net.a.is_empty() && net.b.is_empty());
}

#[test]
fn disconnect_from_the_passive_side_uses_its_own_tid() {
    let mut net = Net::new();
    let (a, b) = establish(&mut net);
    net.b.disconnect(net.now, b, &[]).unwrap();
    net.pump();
    assert_eq!(
        disconnected(net.ev_a.last()),
        Some((a, DisconnectCause::DreqReceived))
    );
    net.a.disconnect(net.now, a, &[]).unwrap();
    net.pump();
    assert_eq!(
        disconnected(net.ev_b.last()),
        Some((b, DisconnectCause::DrepReceived))
    );
    let dreq = &net.log[3];
    assert_eq!((dreq.from, dreq.attr), (Side::B, attr::DREQ));
    // B's hi_tid is 3; its comm ID in CPU order is the low half.
    assert_eq!(dreq.tid, (3u64 << 32) | u64::from(b.0.swap_bytes()));
    assert_eq!(net.log[4].tid, dreq.tid);
}

#[test]
fn lost_drep_is_recovered_from_timewait() {
    let mut net = Net::new();
    net.drops.push((Side::B, attr::DREP, 0));
    let (a, b) = establish(&mut net);
    net.a.disconnect(net.now, a, &[]).unwrap();
    net.pump();
    net.b.disconnect(net.now, b, &[]).unwrap();
    net.pump();
    assert_eq!(net.a.state(a), Some(State::DreqSent));
    assert_eq!(net.b.state(b), Some(State::Timewait));
    // B's timewait (512 ms) ends before A's DREQ retry (4608 ms): the late DREQ meets no
    // connection and ib_cm still answers it with a DREP (cm_issue_drep).
    net.run_until_idle();
    assert_eq!(
        net.sequence()[3..],
        [
            (Side::A, "DREQ"),
            (Side::B, "DREP"),
            (Side::A, "DREQ"),
            (Side::B, "DREP")
        ]
    );
    assert!(net
        .ev_a
        .iter()
        .any(|e| disconnected(Some(e)) == Some((a, DisconnectCause::DrepReceived))));
    let (d1, d2) = (&net.log[5], &net.log[6]);
    assert_eq!(d1.tid, d2.tid);
    let CmMessage::Drep(r) = &d2.msg else {
        panic!()
    };
    assert_eq!((r.local_comm_id, r.remote_comm_id), (b.0, a.0));
    assert!(net.a.is_empty() && net.b.is_empty());
}

#[test]
fn dreq_retransmitted_within_timewait_is_answered_from_timewait() {
    let mut net = Net::new();
    // A long packet lifetime makes B's timewait (2^(24-8) ms) outlast A's DREQ period.
    let mut p = connect_params();
    p.primary_path.local_ack_timeout = 24;
    net.b.listen(SID).unwrap();
    let a = net.a.connect(net.now, p).unwrap();
    net.pump();
    let Some(CmEvent::ConnectRequest { id: b, .. }) = net.ev_b.last().cloned() else {
        panic!()
    };
    net.b.accept(net.now, b, accept_params()).unwrap();
    net.pump();
    complete_on_rep(&mut net, a);
    net.drops.push((Side::B, attr::DREP, 0));
    net.a.disconnect(net.now, a, &[]).unwrap();
    net.pump();
    net.b.disconnect(net.now, b, &[]).unwrap();
    net.pump();
    net.advance(); // A's DREQ retry
    assert_eq!(net.b.state(b), Some(State::Timewait));
    assert_eq!(net.a.state(a), Some(State::Timewait));
    assert_eq!(net.sent(Side::B, attr::DREP).len(), 2);
}

#[test]
fn unanswered_dreq_times_out_into_timewait() {
    let mut net = Net::new();
    net.drop_all.push((Side::A, attr::DREQ));
    let (a, _b) = establish(&mut net);
    net.a.disconnect(net.now, a, &[]).unwrap();
    net.pump();
    let t0 = net.now;
    while net.a.state(a) == Some(State::DreqSent) {
        net.advance();
    }
    assert_eq!(net.sent(Side::A, attr::DREQ).len(), 16);
    assert_eq!(net.now, t0 + 16 * REQ_PERIOD_MS * MS);
    assert_eq!(
        disconnected(net.ev_a.last()),
        Some((a, DisconnectCause::DreqTimeout))
    );
    assert_eq!(net.a.state(a), Some(State::Timewait));
}

#[test]
fn duplicate_req_in_timewait_is_rejected_as_stale() {
    let mut net = Net::new();
    let (a, b) = establish(&mut net);
    net.b.disconnect(net.now, b, &[]).unwrap();
    net.pump();
    net.a.disconnect(net.now, a, &[]).unwrap();
    net.pump();
    assert_eq!(net.b.state(b), Some(State::Timewait));
    // A copy of the old REQ arrives late.
    let old_req = net.log[0].clone();
    let mad = CmMad::new(old_req.tid, old_req.msg).emit().unwrap();
    net.b.handle_mad(net.now, A_ADDR, &mad).unwrap();
    let t = net.b.poll_transmit().unwrap();
    let CmMessage::Rej(rej) = CmMad::parse(&t.mad).unwrap().message else {
        panic!()
    };
    assert_eq!(rej.reason, RejReason::STALE_CONN);
    assert_eq!((rej.local_comm_id, rej.remote_comm_id), (b.0, a.0));
}

#[test]
fn req_from_a_still_connected_qp_is_stale() {
    let mut net = Net::new();
    let (_a, b) = establish(&mut net);
    // A's node restarts (same GUID, same QPN) and connects again while B still has the old
    // connection: REJ "stale connection" and a DREQ on the old connection.
    net.a = CmEndpoint::new(EndpointConfig::new(0xa0a0, 9, 0x5555_6666));
    let a2 = net.a.connect(net.now, connect_params()).unwrap();
    net.pump();
    assert_eq!(
        net.sequence()[3..],
        [
            (Side::A, "REQ"),
            (Side::B, "REJ"),
            (Side::B, "DREQ"),
            (Side::A, "DREP")
        ]
    );
    let CmMessage::Rej(rej) = &net.log[4].msg else {
        panic!()
    };
    assert_eq!(rej.reason, RejReason::STALE_CONN);
    assert!(matches!(
        net.ev_a.last(),
        Some(CmEvent::Rejected { id, reason: RejReason::STALE_CONN, .. }) if *id == a2
    ));
    // The old connection on B learns its peer answered the DREQ.
    assert_eq!(
        disconnected(net.ev_b.last()),
        Some((b, DisconnectCause::DrepReceived))
    );
}

#[test]
fn messages_for_unknown_ids_get_the_ib_cm_answers() {
    let mut net = Net::new();
    // A REP naming no connection of ours: REJ "invalid comm ID" (message REP).
    let rep = CmMessage::Rep(proto::cm::msg::RepRepr {
        local_comm_id: 0x0102_0304,
        remote_comm_id: 0x0a0b_0c0d,
        local_qkey: 0,
        local_qpn: 5,
        vendor_id: 0,
        local_eecn: 0,
        starting_psn: 1,
        responder_resources: 0,
        initiator_depth: 0,
        target_ack_delay: 15,
        failover_accepted: 0,
        end_to_end_flow_control: false,
        rnr_retry_count: 7,
        srq: false,
        local_ca_guid: 7,
        private_data: vec![],
    });
    let mad = CmMad::new(77, rep.clone()).emit().unwrap();
    net.a.handle_mad(net.now, B_ADDR, &mad).unwrap();
    let t = net.a.poll_transmit().unwrap();
    let m = CmMad::parse(&t.mad).unwrap();
    assert_eq!(m.header.transaction_id, 77);
    let CmMessage::Rej(rej) = m.message else {
        panic!()
    };
    assert_eq!(rej.reason, RejReason::INVALID_COMM_ID);
    assert_eq!(rej.message_rejected, msg_kind::REP);
    assert_eq!(
        (rej.local_comm_id, rej.remote_comm_id),
        (0x0a0b_0c0d, 0x0102_0304)
    );
    // Unknown RTU / DREP / MRA / REJ: silence.
    for msg in [
        CmMessage::Rtu(proto::cm::msg::RtuRepr {
            local_comm_id: 1,
            remote_comm_id: 2,
            private_data: vec![],
        }),
        CmMessage::Drep(proto::cm::msg::RtuRepr {
            local_comm_id: 1,
            remote_comm_id: 2,
            private_data: vec![],
        }),
    ] {
        net.a
            .handle_mad(net.now, B_ADDR, &CmMad::new(1, msg).emit().unwrap())
            .unwrap();
        assert_eq!(net.a.poll_transmit(), None);
    }
    // Another class version is dropped, as ib_mad does for an unregistered version.
    let mut v3 = CmMad::new(5, rep).emit().unwrap();
    v3[2] = 3;
    assert_eq!(
        net.a.handle_mad(net.now, B_ADDR, &v3),
        Err(proto::cm::CmError::BadClassVersion(3))
    );
    assert_eq!(net.a.poll_transmit(), None);
    // Malformed input is an error, not a panic, and changes nothing.
    assert!(net.a.handle_mad(net.now, B_ADDR, &mad[..100]).is_err());
    assert!(net.a.poll_event().is_none());
}

fn sidr_params() -> SidrParams {
    SidrParams {
        peer: B_ADDR,
        service_id: UDP_SID,
        pkey: 0xffff,
        private_data: vec![0; 36],
        timeout_ms: 1 << (rdma_cm::CMA_CM_RESPONSE_TIMEOUT - 8),
        max_cm_retries: rdma_cm::CMA_MAX_CM_RETRIES,
    }
}

#[test]
fn sidr_resolves_a_service_to_qpn_and_qkey() {
    let mut net = Net::new();
    net.b.listen(UDP_SID).unwrap();
    let a = net.a.sidr_resolve(net.now, sidr_params()).unwrap();
    net.pump();
    let Some(CmEvent::SidrRequest {
        id: b,
        service_id,
        req,
        ..
    }) = net.ev_b.last().cloned()
    else {
        panic!("{:?}", net.ev_b)
    };
    assert_eq!(service_id, UDP_SID);
    assert_eq!(req.request_id, a.0);
    net.b
        .sidr_reply(
            net.now,
            b,
            sidr_status::SUCCESS,
            0x23,
            rdma_cm::RDMA_UDP_QKEY,
            &[],
        )
        .unwrap();
    net.pump();
    match net.ev_a.last() {
        Some(CmEvent::SidrResponse { id, rep }) => {
            assert_eq!(*id, a);
            assert_eq!(rep.status, sidr_status::SUCCESS);
            assert_eq!((rep.qpn, rep.qkey), (0x23, rdma_cm::RDMA_UDP_QKEY));
            assert_eq!(rep.service_id, UDP_SID);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(net.log[0].tid, net.log[1].tid);
    assert!(net.a.is_empty() && net.b.is_empty());
}

#[test]
fn sidr_without_listener_is_unsupported() {
    let mut net = Net::new();
    let a = net.a.sidr_resolve(net.now, sidr_params()).unwrap();
    net.pump();
    match net.ev_a.last() {
        Some(CmEvent::SidrResponse { id, rep }) => {
            assert_eq!(*id, a);
            assert_eq!(rep.status, sidr_status::UNSUPPORTED);
        }
        other => panic!("{other:?}"),
    }
    assert!(net.ev_b.is_empty());
}

#[test]
fn sidr_lost_requests_are_retried_then_unreachable() {
    let mut net = Net::new();
    net.b.listen(UDP_SID).unwrap();
    net.drops.push((Side::A, attr::SIDR_REQ, 0));
    let a = net.a.sidr_resolve(net.now, sidr_params()).unwrap();
    net.pump();
    net.advance();
    // The retry got through; B still considers it one request.
    assert_eq!(net.ev_b.len(), 1);
    // B never answers: A retries 15 times in all, then gives up; B's duplicates are dropped.
    net.run_until_idle();
    assert_eq!(net.sent(Side::A, attr::SIDR_REQ).len(), 16);
    assert_eq!(net.ev_b.len(), 1);
    assert_eq!(net.ev_a.last(), Some(&CmEvent::Unreachable { id: a }));
}

#[test]
fn api_misuse_is_an_error() {
    let mut net = Net::new();
    let (a, b) = establish(&mut net);
    assert_eq!(
        net.b.accept(net.now, b, accept_params()),
        Err(CmApiError::InvalidState(State::Established))
    );
    assert_eq!(
        net.a.send_rtu(net.now, a, &[]),
        Err(CmApiError::InvalidState(State::Established))
    );
    assert_eq!(net.b.listen(SID), Err(CmApiError::AddrInUse(SID)));
    assert!(matches!(
        net.a.disconnect(net.now, a, &[0; 221]),
        Err(CmApiError::Encode(_))
    ));
    assert_eq!(
        net.a.state(a),
        Some(State::Established),
        "a failed call changes nothing"
    );
    assert_eq!(
        net.a.disconnect(net.now, ConnId(1), &[]),
        Err(CmApiError::UnknownConn(1))
    );
}

#[test]
fn destroy_tells_the_peer_like_ib_cm() {
    // Destroyed while the REP is outstanding: REJ consumer defined, "other" (as captured in
    // host_probe_cm_rep.pcap), and no more REPs.
    let mut net = Net::new();
    net.drop_all.push((Side::B, attr::REP));
    let (a, b) = start(&mut net);
    net.b.accept(net.now, b, accept_params()).unwrap();
    net.pump();
    net.b.destroy(net.now, b);
    net.pump();
    let rej = net.sent(Side::B, attr::REJ);
    let CmMessage::Rej(r) = &rej[0].msg else {
        panic!()
    };
    assert_eq!(
        (r.reason, r.message_rejected),
        (RejReason::CONSUMER_DEFINED, msg_kind::OTHER)
    );
    // A never saw the REP, so it does not know B's comm ID and, like ib_cm
    // (cm_acquire_id(local, remote) with remote 0), ignores a REJ naming it: its REQ retries
    // run out instead.
    assert!(!net
        .ev_a
        .iter()
        .any(|e| matches!(e, CmEvent::Rejected { .. })));
    net.run_until_idle();
    assert_eq!(net.sent(Side::B, attr::REP).len(), 1);
    assert!(!net
        .ev_b
        .iter()
        .any(|e| matches!(e, CmEvent::TimewaitExit { .. })));
    assert_eq!(net.ev_a.last(), Some(&CmEvent::Unreachable { id: a }));

    // Destroyed after the peer saw the REP: the REJ reaches it.
    let mut net = Net::new();
    let (a, b) = start(&mut net);
    net.b.accept(net.now, b, accept_params()).unwrap();
    net.pump();
    net.b.destroy(net.now, b);
    net.pump();
    assert!(matches!(
        net.ev_a.last(),
        Some(CmEvent::Rejected { id, reason: RejReason::CONSUMER_DEFINED, .. }) if *id == a
    ));
    // ib_cm's cm_rej_handler: a REJ after our REP was received means timewait.
    assert_eq!(net.a.state(a), Some(State::Timewait));

    // Destroyed while established: one DREQ, then silent timewait.
    let mut net = Net::new();
    let (a, b) = establish(&mut net);
    net.a.destroy(net.now, a);
    net.pump();
    assert_eq!(
        disconnected(net.ev_b.last()),
        Some((b, DisconnectCause::DreqReceived))
    );
    assert_eq!(net.a.state(a), Some(State::Timewait));
}

#[test]
fn rep_from_a_qp_still_connected_under_another_id_is_stale() {
    let mut net = Net::new();
    let (a, b) = establish(&mut net);
    // B's node restarts and, listening again, answers a new REQ of A from the same QPN (0x12)
    // that A's old connection still names: A refuses the REP as stale.
    net.b = CmEndpoint::new(EndpointConfig::new(0xb0b0, 7, 0x7777_8888));
    net.b.listen(SID).unwrap();
    let mut p = connect_params();
    p.local_qpn = 0x13;
    let a2 = net.a.connect(net.now, p).unwrap();
    net.pump();
    let Some(CmEvent::ConnectRequest { id: b2, .. }) = net.ev_b.last().cloned() else {
        panic!()
    };
    net.b.accept(net.now, b2, accept_params()).unwrap();
    net.pump();
    assert_eq!(
        net.sequence()[3..],
        [(Side::A, "REQ"), (Side::B, "REP"), (Side::A, "REJ")]
    );
    let CmMessage::Rej(rej) = &net.log[5].msg else {
        panic!()
    };
    assert_eq!(
        (rej.reason, rej.message_rejected),
        (RejReason::STALE_CONN, msg_kind::REP)
    );
    assert_eq!(net.a.state(a2), Some(State::ReqSent));
    assert_eq!(net.a.state(a), Some(State::Established));
    let info = net.a.conn_info(a).unwrap();
    assert_eq!(
        (info.remote_comm_id, info.remote_qpn, info.local_qpn),
        (b.0, 0x12, 0x11)
    );
    assert!(matches!(net.ev_b.last(), Some(CmEvent::Rejected { id, .. }) if *id == b2));
}

#[test]
fn both_sides_derive_matching_qp_attributes() {
    use proto::cm::conn::{negotiated_active, negotiated_passive};
    let mut net = Net::new();
    let (_a, _b) = start(&mut net);
    let Some(CmEvent::ConnectRequest { id: b, req, .. }) = net.ev_b.last().cloned() else {
        panic!()
    };
    let mut acc = accept_params();
    acc.responder_resources = 4;
    acc.initiator_depth = 2;
    net.b.accept(net.now, b, acc.clone()).unwrap();
    net.pump();
    let Some(CmEvent::ConnectResponse { rep, .. }) = net.ev_a.last().cloned() else {
        panic!()
    };
    let act = rdma_cm::qp_attrs(&negotiated_active(&connect_params(), &rep));
    let pas = rdma_cm::qp_attrs(&negotiated_passive(&req, &acc));
    assert_eq!((act.dest_qpn, pas.dest_qpn), (0x12, 0x11));
    assert_eq!((act.sq_psn, act.rq_psn), (pas.rq_psn, pas.sq_psn));
    // As kernel rxe's rdma_cm: each side sends from the Starting PSN the *other* side put in
    // its message (golden rping.pcap: the active side's first SEND carries the REP's PSN).
    assert_eq!(act.sq_psn, rep.starting_psn);
    assert_eq!(pas.sq_psn, req.starting_psn);
    // Reads A issues are bounded by B's responder resources and the other way round.
    assert_eq!((act.max_rd_atomic, pas.max_dest_rd_atomic), (4, 4));
    assert_eq!((act.max_dest_rd_atomic, pas.max_rd_atomic), (2, 2));
    // PLT 16 on A: timeout 17; B sees ACK timeout 17 in the REQ and arrives at 17 too.
    assert_eq!((act.timeout, pas.timeout), (17, 17));
    assert_eq!((act.min_rnr_timer, pas.min_rnr_timer), (0, 0));
    assert_eq!(act.path_mtu, pas.path_mtu);
}

#[test]
fn events_map_to_rdma_cm_events() {
    use proto::cm::rdma_cm::RdmaCmEventType as T;
    let id = ConnId(1);
    let rej = CmEvent::Rejected {
        id,
        reason: RejReason::CONSUMER_DEFINED,
        ari: vec![],
        private_data: vec![],
    };
    assert_eq!(rej.rdma_cm_event(), (T::Rejected, 28));
    assert_eq!(
        CmEvent::Unreachable { id }.rdma_cm_event(),
        (T::Unreachable, -110)
    );
    assert_eq!(CmEvent::TimewaitExit { id }.rdma_cm_event().0 as u32, 15);
    assert_eq!(CmEvent::Established { id }.rdma_cm_event().0 as u32, 9);
    assert_eq!(rej.id(), id);
}
