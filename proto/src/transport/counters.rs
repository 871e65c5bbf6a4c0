//! The counters kernel rxe keeps (`rdma statistic`, sysfs `hw_counters`; roce-rxe-facts.md
//! §6.2), under the same names, plus a few engine-only drop counters that rxe logs instead,
//! and mlx5's congestion-control counters.

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
    /// Congestion control, under mlx5's names (`ethtool -S`, `rdma statistic`): CE-marked
    /// RoCE packets received (counted whatever the algorithm), CNPs sent by the notification
    /// point, CNPs the reaction point acted on, and CNPs it ignored (congestion control off,
    /// or no such QP).
    pub np_ecn_marked_roce_packets: u64,
    pub np_cnp_sent: u64,
    pub rp_cnp_handled: u64,
    pub rp_cnp_ignored: u64,
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

    /// The congestion-control counters as (name, value) pairs, under mlx5's names.
    pub fn cc_counters(&self) -> [(&'static str, u64); 4] {
        [
            (
                "np_ecn_marked_roce_packets",
                self.np_ecn_marked_roce_packets,
            ),
            ("np_cnp_sent", self.np_cnp_sent),
            ("rp_cnp_handled", self.rp_cnp_handled),
            ("rp_cnp_ignored", self.rp_cnp_ignored),
        ]
    }

    pub(crate) fn qkey_violation(&mut self) {
        self.qkey_viol_cntr = self.qkey_viol_cntr.saturating_add(1);
    }
}
