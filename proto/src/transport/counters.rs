//! The counters kernel rxe keeps (`rdma statistic`, sysfs `hw_counters`; roce-rxe-facts.md
//! §6.2), under the same names, plus a few engine-only drop counters that rxe logs instead.

/// Per-device counters. Field names are rxe's counter names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub sent_pkts: u64,
    pub rcvd_pkts: u64,
    pub duplicate_request: u64,
    pub out_of_seq_request: u64,
    pub rcvd_rnr_err: u64,
    pub send_rnr_err: u64,
    pub rcvd_seq_err: u64,
    pub ack_deferred: u64,
    pub retry_exceeded_err: u64,
    pub retry_rnr_exceeded_err: u64,
    pub completer_retry_err: u64,
    pub send_err: u64,
    pub link_downed: u64,
    pub rdma_sends: u64,
    pub rdma_recvs: u64,
    pub sent_bytes: u64,
    pub rcvd_bytes: u64,
    /// Port counters that saturate at 0xFFFF (`ibv_query_port`).
    pub qkey_viol_cntr: u16,
    pub bad_pkey_cntr: u16,
    /// Engine-only: packets dropped for a bad ICRC (rxe drops them silently).
    pub icrc_errors: u64,
    /// Engine-only: packets dropped by header checks (malformed, unknown QP, wrong state,
    /// address mismatch, wrong transport).
    pub dropped_pkts: u64,
    /// Engine-only: CNPs sent and received through the congestion-control seam.
    pub cnp_sent: u64,
    pub cnp_rcvd: u64,
    /// Engine-only: ECN CE-marked packets received.
    pub ecn_marked_pkts: u64,
}

impl Counters {
    /// The rxe counters as (name, value) pairs, in rxe's order: what `rdma statistic` prints.
    pub fn rxe_counters(&self) -> [(&'static str, u64); 17] {
        [
            ("sent_pkts", self.sent_pkts),
            ("rcvd_pkts", self.rcvd_pkts),
            ("duplicate_request", self.duplicate_request),
            ("out_of_seq_request", self.out_of_seq_request),
            ("rcvd_rnr_err", self.rcvd_rnr_err),
            ("send_rnr_err", self.send_rnr_err),
            ("rcvd_seq_err", self.rcvd_seq_err),
            ("ack_deferred", self.ack_deferred),
            ("retry_exceeded_err", self.retry_exceeded_err),
            ("retry_rnr_exceeded_err", self.retry_rnr_exceeded_err),
            ("completer_retry_err", self.completer_retry_err),
            ("send_err", self.send_err),
            ("link_downed", self.link_downed),
            ("rdma_sends", self.rdma_sends),
            ("rdma_recvs", self.rdma_recvs),
            ("sent_bytes", self.sent_bytes),
            ("rcvd_bytes", self.rcvd_bytes),
        ]
    }

    /// Every counter as one word, in a fixed order: how the same-host fast path publishes
    /// the counters of the engines a process runs for the daemon ([`Counters::from_words`]).
    pub fn to_words(&self) -> [u64; 24] {
        [
            self.sent_pkts,
            self.rcvd_pkts,
            self.duplicate_request,
            self.out_of_seq_request,
            self.rcvd_rnr_err,
            self.send_rnr_err,
            self.rcvd_seq_err,
            self.ack_deferred,
            self.retry_exceeded_err,
            self.retry_rnr_exceeded_err,
            self.completer_retry_err,
            self.send_err,
            self.link_downed,
            self.rdma_sends,
            self.rdma_recvs,
            self.sent_bytes,
            self.rcvd_bytes,
            u64::from(self.qkey_viol_cntr),
            u64::from(self.bad_pkey_cntr),
            self.icrc_errors,
            self.dropped_pkts,
            self.cnp_sent,
            self.cnp_rcvd,
            self.ecn_marked_pkts,
        ]
    }

    /// The counters [`Counters::to_words`] wrote (missing words are 0).
    pub fn from_words(w: &[u64]) -> Counters {
        let g = |i: usize| w.get(i).copied().unwrap_or(0);
        Counters {
            sent_pkts: g(0),
            rcvd_pkts: g(1),
            duplicate_request: g(2),
            out_of_seq_request: g(3),
            rcvd_rnr_err: g(4),
            send_rnr_err: g(5),
            rcvd_seq_err: g(6),
            ack_deferred: g(7),
            retry_exceeded_err: g(8),
            retry_rnr_exceeded_err: g(9),
            completer_retry_err: g(10),
            send_err: g(11),
            link_downed: g(12),
            rdma_sends: g(13),
            rdma_recvs: g(14),
            sent_bytes: g(15),
            rcvd_bytes: g(16),
            qkey_viol_cntr: g(17).min(0xffff) as u16,
            bad_pkey_cntr: g(18).min(0xffff) as u16,
            icrc_errors: g(19),
            dropped_pkts: g(20),
            cnp_sent: g(21),
            cnp_rcvd: g(22),
            ecn_marked_pkts: g(23),
        }
    }

    /// Adds `other` (the counters of another engine that served the same client).
    pub fn accumulate(&mut self, other: &Counters) {
        let (a, b) = (self.to_words(), other.to_words());
        let mut sum = [0u64; 24];
        for (s, (x, y)) in sum.iter_mut().zip(a.iter().zip(b.iter())) {
            *s = x.saturating_add(*y);
        }
        *self = Counters::from_words(&sum);
    }

    pub(crate) fn qkey_violation(&mut self) {
        self.qkey_viol_cntr = self.qkey_viol_cntr.saturating_add(1);
    }
}
