//! A queue pair's state: the send queue with per-WQE progress, the requester/completer
//! variables (rxe's `qp->req` and `qp->comp`), and the responder's (`qp->resp`).

use super::congestion::{AnyController, NoControl, Pacer};
use super::packet_io::Route;
use super::qp_attr::{AddressVector, Mtu, QpAttr, QpState, QpType};
use super::timers::Nanos;
use super::verbs::{RecvWr, SendWr};
use crate::types::{Psn, Qpn, Rkey};
use crate::wire::AethSyndrome;
use std::collections::VecDeque;

/// Capacities asked for at create time (`ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

impl Default for QpCap {
    fn default() -> Self {
        QpCap {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 256,
        }
    }
}

/// `ibv_qp_init_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInit {
    pub pd: u32,
    pub qp_type: QpType,
    pub send_cq: u32,
    pub recv_cq: u32,
    pub srq: Option<u32>,
    pub cap: QpCap,
    /// Every send WR generates a completion, signaled or not.
    pub sq_sig_all: bool,
}

/// A send work queue element and the requester's progress on it.
#[derive(Debug, Clone)]
pub(crate) struct SendWqe {
    pub wr: SendWr,
    pub len: u32,
    /// PSNs are assigned when the WQE is first sent and never change (retries resend the same).
    pub started: bool,
    pub first_psn: Psn,
    pub last_psn: Psn,
    pub npkts: u32,
    /// PSN of the next packet the requester sends for it in the current pass.
    pub next_psn: Psn,
    /// The requester has sent all of it in the current pass.
    pub sent_all: bool,
    /// It holds one of the `max_rd_atomic` slots.
    pub holds_rd_atomic: bool,
    /// PSN of the most recent READ request for it (a partial retry starts later).
    pub read_req_psn: Psn,
    /// A local error found while building a packet; reported when it reaches the head.
    pub error: Option<super::verbs::WcStatus>,
    /// Selective retransmission only ([`super::selective`]): the READ response packets
    /// received so far, one bit per response PSN (allocated on first use).
    pub got: Vec<u64>,
    /// Selective only: how many bits of `got` are set.
    pub got_count: u32,
    /// Selective only: the response a READ (all of it), atomic, FLUSH or ATOMIC_WRITE waits
    /// for has arrived (and been placed); it completes once it is the oldest.
    pub resp_done: bool,
    /// Selective only: missing responses before this PSN have already been asked for again.
    pub repair_upto: Psn,
}

impl SendWqe {
    pub fn new(wr: SendWr, len: u32) -> SendWqe {
        SendWqe {
            wr,
            len,
            started: false,
            first_psn: Psn::new(0),
            last_psn: Psn::new(0),
            npkts: 0,
            next_psn: Psn::new(0),
            sent_all: false,
            holds_rd_atomic: false,
            read_req_psn: Psn::new(0),
            error: None,
            got: Vec::new(),
            got_count: 0,
            resp_done: false,
            repair_upto: Psn::new(0),
        }
    }
}

/// What the responder holds to answer a duplicate READ or atomic (IBTA §9.7.5.1.5,
/// rxe's `resp_res`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResourceKind {
    Read {
        va: u64,
        rkey: Rkey,
        len: u32,
    },
    Atomic {
        orig: u64,
    },
    /// FLUSH and ATOMIC_WRITE answer with an empty read response.
    EmptyRead,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Resource {
    pub kind: ResourceKind,
    pub first_psn: Psn,
    pub last_psn: Psn,
}

/// A packet the responder owes the requester, built when `poll_transmit` asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RespOut {
    Ack {
        syndrome: AethSyndrome,
        psn: Psn,
        msn: u32,
    },
    AtomicAck {
        psn: Psn,
        orig: u64,
        msn: u32,
    },
    /// A (possibly replayed) read response stream, one packet per poll.
    Read {
        psn: Psn,
        va: u64,
        rkey: Rkey,
        remaining: u32,
        first: bool,
        msn: u32,
    },
    /// Zero-length READ_RESPONSE_ONLY answering FLUSH / ATOMIC_WRITE.
    EmptyRead {
        psn: Psn,
        msn: u32,
    },
    /// A congestion notification packet for the remote QP of this flow.
    Cnp,
    /// Selective retransmission's report ([`crate::wire::sack`]): the responder lacks `epsn`;
    /// the bitmap of what it holds beyond is built when the packet is.
    Sack {
        epsn: Psn,
        msn: u32,
    },
}

/// The message the responder is in the middle of (rxe's `resp.opcode` and DMA state).
#[derive(Debug, Clone)]
pub(crate) struct InMessage {
    pub is_send: bool,
    /// The receive WQE a SEND or WRITE_WITH_IMM consumes.
    pub recv: Option<RecvWr>,
    pub recv_from_srq: bool,
    /// Bytes placed so far.
    pub offset: u32,
    /// WRITE target, validated on the FIRST/ONLY packet, and its address space.
    pub va: u64,
    pub space: u64,
    pub resid: u32,
}

#[derive(Debug)]
pub(crate) struct Qp {
    pub qpn: Qpn,
    pub ty: QpType,
    pub state: QpState,
    pub attr: QpAttr,
    pub init: QpInit,
    pub src_port: u16,
    /// The route last computed for this QP's packets, with the address vector and source
    /// port it was computed for (see [`super::engine::route_for`]).
    pub route_cache: Option<(AddressVector, u16, Route)>,
    /// The headers of the MIDDLE packets of the message being sent, once one was built
    /// (see [`super::packet_io::SegmentTemplate`]). Cleared by every modify.
    pub next_segment: Option<super::packet_io::SegmentTemplate>,

    // Send queue and requester (rxe `qp->req`).
    pub sq: VecDeque<SendWqe>,
    /// Index into `sq` of the next WQE the requester works on.
    pub req_index: usize,
    pub req_psn: Psn,
    pub noack_pkts: u32,
    pub rd_atomic_in_flight: u32,
    pub need_retry: bool,
    /// A retry is under way and no response has made progress since (rxe `started_retry`).
    pub started_retry: bool,
    /// Go-back-N retries this QP started (timeouts, sequence NAKs, implied NAKs, RNR NAKs).
    pub retry_events: u64,
    pub rnr_wait_until: Option<Nanos>,
    /// The pacer holds the next request packet until then.
    pub paced_until: Option<Nanos>,
    /// Congestion control: the QP's controller (reaction point of what it sends,
    /// notification point of what it receives) and its rate limiter.
    pub cc: AnyController,
    pub pacer: Pacer,

    // Completer (rxe `qp->comp`).
    pub comp_psn: Psn,
    pub retry_left: u8,
    pub rnr_retry_left: u8,
    pub retrans_deadline: Option<Nanos>,
    /// Selective retransmission's probe timer (a tail-loss probe after a stall of about two
    /// round trips; see `selective::on_probe`). Always None on go-back-N.
    pub probe_deadline: Option<Nanos>,
    pub sqd_notified: bool,

    // Responder (rxe `qp->resp`).
    pub rq: VecDeque<RecvWr>,
    pub resp_psn: Psn,
    pub msn: u32,
    pub sent_psn_nak: bool,
    pub in_msg: Option<InMessage>,
    pub resources: Vec<Option<Resource>>,
    pub next_resource: usize,
    pub resp_out: VecDeque<RespOut>,

    /// Listed in the device's round-robin of QPs that may have something to send.
    pub scheduled: bool,
    /// The time of this QP's entry in the device's timer queue, if it has one
    /// ([`super::timers::TimerQueue`]).
    pub timer_at: Option<Nanos>,
    /// This QP's share of the device's counters (`rdma statistic qp`): packets and bytes
    /// sent and received, and the retry, RNR and error counters of its requester,
    /// completer and responder.
    pub counters: super::counters::Counters,

    /// Selective retransmission's state, when this RC QP uses it (None: go-back-N, as rxe).
    pub selective: Option<Box<super::selective::Selective>>,
}

impl Qp {
    pub fn new(qpn: Qpn, init: QpInit) -> Qp {
        Qp {
            qpn,
            ty: init.qp_type,
            state: QpState::Reset,
            attr: QpAttr::default(),
            init,
            src_port: udp_sport_at_create(qpn),
            route_cache: None,
            next_segment: None,
            sq: VecDeque::new(),
            req_index: 0,
            req_psn: Psn::new(0),
            noack_pkts: 0,
            rd_atomic_in_flight: 0,
            need_retry: false,
            started_retry: false,
            retry_events: 0,
            rnr_wait_until: None,
            paced_until: None,
            cc: AnyController::None(NoControl),
            pacer: Pacer::default(),
            comp_psn: Psn::new(0),
            retry_left: 0,
            rnr_retry_left: 0,
            retrans_deadline: None,
            probe_deadline: None,
            sqd_notified: false,
            rq: VecDeque::new(),
            resp_psn: Psn::new(0),
            msn: 0,
            sent_psn_nak: false,
            in_msg: None,
            resources: vec![None],
            next_resource: 0,
            resp_out: VecDeque::new(),
            scheduled: false,
            timer_at: None,
            counters: super::counters::Counters::default(),
            selective: None,
        }
    }

    /// The earliest of the QP's deadlines (pacing, RNR wait, retransmission).
    #[inline]
    pub fn next_deadline(&self) -> Option<Nanos> {
        [
            self.paced_until,
            self.rnr_wait_until,
            self.retrans_deadline,
            self.probe_deadline,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    pub fn mtu(&self) -> u32 {
        self.attr.path_mtu.bytes()
    }

    pub fn av(&self) -> Option<AddressVector> {
        self.attr.ah_attr
    }

    /// Something is sent and not yet acknowledged (rxe: `req.psn > comp.psn`).
    pub fn has_unacked(&self) -> bool {
        self.sq
            .front()
            .is_some_and(|w| w.started && !w.wr.op.is_local())
    }

    /// Clears requester, completer and responder state (the transition to RESET).
    pub fn reset(&mut self) {
        let (qpn, init) = (self.qpn, self.init);
        *self = Qp::new(qpn, init);
    }

    /// Sizes the responder resource ring: max_dest_rd_atomic rounded up to a power of two
    /// (rxe), at least one entry.
    pub fn resize_resources(&mut self) {
        let n = u32::from(self.attr.max_dest_rd_atomic)
            .max(1)
            .next_power_of_two() as usize;
        self.resources = vec![None; n];
        self.next_resource = 0;
    }

    /// Round-robin allocation of a responder resource (rxe recycles the oldest).
    pub fn push_resource(&mut self, r: Resource) {
        let n = self.resources.len();
        self.resources[self.next_resource % n] = Some(r);
        self.next_resource = (self.next_resource + 1) % n;
    }

    pub fn find_resource(&self, psn: Psn) -> Option<Resource> {
        self.resources
            .iter()
            .flatten()
            .copied()
            .find(|r| !psn.is_before(r.first_psn) && !psn.is_after(r.last_psn))
    }
}

pub(crate) fn npkts(len: u32, mtu: Mtu) -> u32 {
    len.div_ceil(mtu.bytes()).max(1)
}

/// rxe's UDP source port at QP creation: `0xC000 + (hash_32(qpn, 14) & 0x3FFF)`
/// (roce-rxe-facts.md §1.3).
pub(crate) fn udp_sport_at_create(qpn: Qpn) -> u16 {
    let h = qpn.value().wrapping_mul(0x61c8_8647) >> 18;
    0xc000 + (h & 0x3fff) as u16
}

/// rxe's UDP source port once the AV is set (`rdma_get_udp_sport`), from the flow label, or
/// from a symmetric label of the two QPNs when it is zero.
pub(crate) fn udp_sport_for_flow(flow_label: u32, lqpn: Qpn, rqpn: Qpn) -> u16 {
    let fl = if flow_label == 0 {
        let mut v = u64::from(lqpn.value()) * u64::from(rqpn.value());
        v ^= v >> 20;
        v ^= v >> 40;
        (v & 0xfffff) as u32
    } else {
        flow_label & 0xfffff
    };
    0xc000 | (((fl & 0x3fff) ^ ((fl & 0xfc000) >> 14)) as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_source_ports_match_rxe_examples() {
        assert_eq!(udp_sport_at_create(Qpn::new(1)), 0xd872);
        assert_eq!(udp_sport_at_create(Qpn::new(17)), 0xdf94);
        assert_eq!(udp_sport_for_flow(0, Qpn::new(17), Qpn::new(18)), 0xc132);
        assert_eq!(
            udp_sport_for_flow(0x308ef, Qpn::new(17), Qpn::new(18)),
            0xc8e3
        );
    }

    #[test]
    fn packet_counts() {
        assert_eq!(npkts(0, Mtu::Mtu1024), 1);
        assert_eq!(npkts(1024, Mtu::Mtu1024), 1);
        assert_eq!(npkts(1025, Mtu::Mtu1024), 2);
        assert_eq!(npkts(4096 * 3, Mtu::Mtu4096), 3);
    }
}

#[cfg(test)]
mod resource_tests {
    use super::*;
    use crate::transport::qp_attr::QpType;

    #[test]
    fn responder_resources_are_a_power_of_two_ring_found_by_psn() {
        let init = QpInit {
            pd: 1,
            qp_type: QpType::Rc,
            send_cq: 1,
            recv_cq: 1,
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: false,
        };
        let mut qp = Qp::new(Qpn::new(17), init);
        qp.attr.max_dest_rd_atomic = 3;
        qp.resize_resources();
        assert_eq!(qp.resources.len(), 4);
        for i in 0..5u32 {
            qp.push_resource(Resource {
                kind: ResourceKind::Atomic { orig: u64::from(i) },
                first_psn: Psn::new(i * 10),
                last_psn: Psn::new(i * 10 + 2),
            });
        }
        // The oldest was recycled; the others are found anywhere in their PSN range.
        assert!(qp.find_resource(Psn::new(1)).is_none());
        let r = qp.find_resource(Psn::new(12)).unwrap();
        assert_eq!(r.kind, ResourceKind::Atomic { orig: 1 });
        assert!(qp.find_resource(Psn::new(43)).is_none());
    }
}
