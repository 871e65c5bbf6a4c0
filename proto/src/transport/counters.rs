//! The counters kernel rxe keeps (`rdma statistic`, sysfs `hw_counters`; roce-rxe-facts.md
//! §6.2), under the same names, plus a few engine-only drop counters that rxe logs instead,
//! and mlx5's congestion-control counters.

/// Per-device counters (and per QP, [`crate::transport::Engine::qp_counters`]). Field names
/// are rxe's counter names; `softroce stat` shows every field under its name (through serde,
/// so a counter added here appears there without more code).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
    /// mlx5's names: remote access error NAKs received by requesters (an R_Key violation at
    /// the peer) and sent by responders, and invalid request NAKs received.
    pub req_remote_access_errors: u64,
    pub resp_remote_access_errors: u64,
    pub req_remote_invalid_request: u64,
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
    /// a UD QP, or no such QP).
    pub np_ecn_marked_roce_packets: u64,
    pub np_cnp_sent: u64,
    pub rp_cnp_handled: u64,
    pub rp_cnp_ignored: u64,
    /// Engine-only, selective retransmission (`transport::selective`): SACK reports sent
    /// and received, request packets held out of order by the responder, and packets the
    /// requester sent again because a report (or a timeout probe) showed them missing.
    pub sack_sent: u64,
    pub sack_rcvd: u64,
    pub ooo_held: u64,
    pub sel_retransmits: u64,
    /// Engine-only: selective retransmission's probe timer fired (a stall of about two
    /// round trips, answered by a probe long before the IBTA timeout).
    pub sel_probes: u64,
    /// Engine-only: why packets were dropped or refused, one counter per reason (issue 16:
    /// every hostile packet is counted under a reason).
    pub drops: DropCounters,
}

/// Why received packets were dropped, ignored or refused.
///
/// Every packet the engine is given ends in exactly one of `rcvd_pkts`, `dropped_pkts`,
/// `icrc_errors`, `rp_cnp_handled`, `rp_cnp_ignored` and `drops.bad_pkey`; every `dropped_pkts` has one of the reasons
/// of the first group here. The second group says what became of packets counted in
/// `rcvd_pkts` that did nothing (the rxe counters `duplicate_request`, `out_of_seq_request`,
/// `send_rnr_err` count the rest).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DropCounters {
    // Dropped before reaching a QP (each also in `dropped_pkts`).
    /// The headers do not parse: lengths that disagree, a pad count the length cannot hold,
    /// a wrong transport version, a truncated header, a bad IP or UDP header.
    pub malformed: u64,
    pub unknown_opcode: u64,
    /// The destination QPN names no QP of this device.
    pub unknown_qp: u64,
    /// An opcode of another transport than the QP's (an RC opcode to a UD QP, ...).
    pub wrong_transport: u64,
    /// An RC/UC packet from or to other addresses than the QP's path, or for a QP with none.
    pub wrong_path: u64,
    // Not counted in `dropped_pkts`.
    /// A P_Key other than the default partition (also `bad_pkey_cntr`, which saturates).
    pub bad_pkey: u64,
    /// A multicast packet for a group no QP of this device joined.
    pub no_group: u64,
    // Accepted (in `rcvd_pkts`), then ignored or refused.
    /// The QP is in a state that does not take it (RESET, INIT, ERR, ...).
    pub qp_state: u64,
    /// Requests after a PSN gap, dropped silently once the gap was NAKed (IBTA §9.7.5.1.3).
    pub psn_gap: u64,
    /// A duplicate request with nothing to answer (class D, IBTA §9.7.5.1.5).
    pub duplicate_ignored: u64,
    /// A response that matched no outstanding request, or repeated one: no effect.
    pub response_ignored: u64,
    /// A UC message abandoned (a lost packet or a refused request; UC never NAKs).
    pub uc_abandoned: u64,
    /// A UD datagram with a wrong Q_Key (also `qkey_viol_cntr`, which saturates).
    pub ud_bad_qkey: u64,
    /// A UD datagram without a DETH, with no receive WQE, or too long for it.
    pub ud_not_received: u64,
    /// Requests NAKed with a remote access error (bad R_Key, PD, bounds or access).
    pub nak_remote_access: u64,
    /// Requests NAKed as invalid (lengths, opcode sequence, misaligned atomics, ...).
    pub nak_invalid_request: u64,
    /// Requests NAKed with a remote operational error.
    pub nak_remote_operational: u64,
}

impl DropCounters {
    /// Every reason as (name, value), for `counters` listings.
    pub fn named(&self) -> [(&'static str, u64); 17] {
        [
            ("drop_malformed", self.malformed),
            ("drop_unknown_opcode", self.unknown_opcode),
            ("drop_unknown_qp", self.unknown_qp),
            ("drop_wrong_transport", self.wrong_transport),
            ("drop_wrong_path", self.wrong_path),
            ("drop_bad_pkey", self.bad_pkey),
            ("drop_no_group", self.no_group),
            ("drop_qp_state", self.qp_state),
            ("drop_psn_gap", self.psn_gap),
            ("drop_duplicate_ignored", self.duplicate_ignored),
            ("drop_response_ignored", self.response_ignored),
            ("drop_uc_abandoned", self.uc_abandoned),
            ("drop_ud_bad_qkey", self.ud_bad_qkey),
            ("drop_ud_not_received", self.ud_not_received),
            ("nak_remote_access", self.nak_remote_access),
            ("nak_invalid_request", self.nak_invalid_request),
            ("nak_remote_operational", self.nak_remote_operational),
        ]
    }

    /// The reasons that are also counted in `dropped_pkts`.
    pub fn dropped_total(&self) -> u64 {
        self.malformed
            + self.unknown_opcode
            + self.unknown_qp
            + self.wrong_transport
            + self.wrong_path
    }
}

/// A packet dropped before it reached a QP (counted in `dropped_pkts` and under its reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dropped {
    Malformed,
    UnknownOpcode,
    UnknownQp,
    WrongTransport,
    WrongPath,
}

/// How many counters [`Counters::to_words`] writes.
pub const COUNTER_COUNT: usize = 50;

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

    /// Every counter as (name, value): rxe's first, then the engine's own and its drop
    /// reasons (what a `counters` listing prints).
    pub fn named(&self) -> Vec<(&'static str, u64)> {
        self.named_iter().collect()
    }

    /// [`Counters::named`] without a `Vec`: the same-host fast path publishes its engines'
    /// counters after every pass, and two allocations per engine per message were a tenth of
    /// its time per small message.
    fn named_iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
        self.rxe_counters()
            .into_iter()
            .chain([
                ("req_remote_access_errors", self.req_remote_access_errors),
                ("resp_remote_access_errors", self.resp_remote_access_errors),
                (
                    "req_remote_invalid_request",
                    self.req_remote_invalid_request,
                ),
                ("qkey_viol_cntr", u64::from(self.qkey_viol_cntr)),
                ("bad_pkey_cntr", u64::from(self.bad_pkey_cntr)),
                ("icrc_errors", self.icrc_errors),
                ("dropped_pkts", self.dropped_pkts),
                (
                    "np_ecn_marked_roce_packets",
                    self.np_ecn_marked_roce_packets,
                ),
                ("np_cnp_sent", self.np_cnp_sent),
                ("rp_cnp_handled", self.rp_cnp_handled),
                ("rp_cnp_ignored", self.rp_cnp_ignored),
                ("sack_sent", self.sack_sent),
                ("sack_rcvd", self.sack_rcvd),
                ("ooo_held", self.ooo_held),
                ("sel_retransmits", self.sel_retransmits),
                ("sel_probes", self.sel_probes),
            ])
            .chain(self.drops.named())
    }

    /// Every counter as one word, in the order of [`Counters::named`]: how the same-host fast
    /// path publishes the counters of the engines a process runs for the daemon
    /// ([`Counters::from_words`]).
    pub fn to_words(&self) -> Vec<u64> {
        self.named_iter().map(|(_, v)| v).collect()
    }

    /// [`Counters::to_words`] into `out` (as many as fit; the rest of `out` is left as it
    /// was), allocating nothing.
    pub fn write_words(&self, out: &mut [u64]) {
        let words = self.words();
        let n = out.len().min(words.len());
        out[..n].copy_from_slice(&words[..n]);
    }

    /// Every counter as one word, in the order of [`Counters::named`], spelt out: the
    /// same-host fast path publishes both of its engines' counters at the end of every pass,
    /// and walking the named pairs took about 1,200 instructions per engine (callgrind of
    /// `ib_send_lat`: a seventh of a round trip's). A test holds the order to `named`.
    pub fn words(&self) -> [u64; COUNTER_COUNT] {
        let d = &self.drops;
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
            self.req_remote_access_errors,
            self.resp_remote_access_errors,
            self.req_remote_invalid_request,
            u64::from(self.qkey_viol_cntr),
            u64::from(self.bad_pkey_cntr),
            self.icrc_errors,
            self.dropped_pkts,
            self.np_ecn_marked_roce_packets,
            self.np_cnp_sent,
            self.rp_cnp_handled,
            self.rp_cnp_ignored,
            self.sack_sent,
            self.sack_rcvd,
            self.ooo_held,
            self.sel_retransmits,
            self.sel_probes,
            d.malformed,
            d.unknown_opcode,
            d.unknown_qp,
            d.wrong_transport,
            d.wrong_path,
            d.bad_pkey,
            d.no_group,
            d.qp_state,
            d.psn_gap,
            d.duplicate_ignored,
            d.response_ignored,
            d.uc_abandoned,
            d.ud_bad_qkey,
            d.ud_not_received,
            d.nak_remote_access,
            d.nak_invalid_request,
            d.nak_remote_operational,
        ]
    }

    /// The counters [`Counters::to_words`] wrote (missing words are 0).
    pub fn from_words(words: &[u64]) -> Counters {
        let mut it = words.iter().copied();
        let mut next = || it.next().unwrap_or(0);
        let sat16 = |v: u64| v.min(u64::from(u16::MAX)) as u16;
        Counters {
            sent_pkts: next(),
            rcvd_pkts: next(),
            duplicate_request: next(),
            out_of_seq_request: next(),
            rcvd_rnr_err: next(),
            send_rnr_err: next(),
            rcvd_seq_err: next(),
            ack_deferred: next(),
            retry_exceeded_err: next(),
            retry_rnr_exceeded_err: next(),
            completer_retry_err: next(),
            send_err: next(),
            link_downed: next(),
            rdma_sends: next(),
            rdma_recvs: next(),
            sent_bytes: next(),
            rcvd_bytes: next(),
            req_remote_access_errors: next(),
            resp_remote_access_errors: next(),
            req_remote_invalid_request: next(),
            qkey_viol_cntr: sat16(next()),
            bad_pkey_cntr: sat16(next()),
            icrc_errors: next(),
            dropped_pkts: next(),
            np_ecn_marked_roce_packets: next(),
            np_cnp_sent: next(),
            rp_cnp_handled: next(),
            rp_cnp_ignored: next(),
            sack_sent: next(),
            sack_rcvd: next(),
            ooo_held: next(),
            sel_retransmits: next(),
            sel_probes: next(),
            drops: DropCounters {
                malformed: next(),
                unknown_opcode: next(),
                unknown_qp: next(),
                wrong_transport: next(),
                wrong_path: next(),
                bad_pkey: next(),
                no_group: next(),
                qp_state: next(),
                psn_gap: next(),
                duplicate_ignored: next(),
                response_ignored: next(),
                uc_abandoned: next(),
                ud_bad_qkey: next(),
                ud_not_received: next(),
                nak_remote_access: next(),
                nak_invalid_request: next(),
                nak_remote_operational: next(),
            },
        }
    }

    /// Adds `other` to these (a device's total over its clients' engines, live and gone).
    pub fn accumulate(&mut self, other: &Counters) {
        let mut sum = self.to_words();
        for (s, v) in sum.iter_mut().zip(other.to_words()) {
            *s = s.saturating_add(v);
        }
        *self = Counters::from_words(&sum);
    }

    pub(crate) fn qkey_violation(&mut self) {
        self.qkey_viol_cntr = self.qkey_viol_cntr.saturating_add(1);
        self.drops.ud_bad_qkey += 1;
    }

    pub(crate) fn bad_pkey(&mut self) {
        self.bad_pkey_cntr = self.bad_pkey_cntr.saturating_add(1);
        self.drops.bad_pkey += 1;
    }

    pub(crate) fn dropped(&mut self, why: Dropped) {
        self.dropped_pkts += 1;
        let d = &mut self.drops;
        *match why {
            Dropped::Malformed => &mut d.malformed,
            Dropped::UnknownOpcode => &mut d.unknown_opcode,
            Dropped::UnknownQp => &mut d.unknown_qp,
            Dropped::WrongTransport => &mut d.wrong_transport,
            Dropped::WrongPath => &mut d.wrong_path,
        } += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_words_are_the_named_counters_in_order() {
        // Every counter a different value (the two saturating ones below 0xFFFF), so that a
        // word out of place shows.
        let words: Vec<u64> = (1..=COUNTER_COUNT as u64).map(|i| i * 1000 + 7).collect();
        let c = Counters::from_words(&words);
        let named: Vec<u64> = c.named().into_iter().map(|(_, v)| v).collect();
        assert_eq!(named, words, "from_words and named disagree");
        assert_eq!(c.to_words(), words);
        let mut out = [u64::MAX; COUNTER_COUNT + 3];
        c.write_words(&mut out);
        assert_eq!(out[..COUNTER_COUNT], words[..]);
        assert_eq!(
            out[COUNTER_COUNT..],
            [u64::MAX; 3],
            "words past the counters kept"
        );
        let mut short = [0u64; 5];
        c.write_words(&mut short);
        assert_eq!(short[..], words[..5]);
    }

    #[test]
    fn accumulate_adds_every_named_counter() {
        // Every field distinct, so that a field `accumulate` maps to the wrong place shows.
        let mut one = Counters::default();
        let mut n = 0;
        let mut v = || {
            n += 1;
            n
        };
        one.sent_pkts = v();
        one.rcvd_pkts = v();
        one.duplicate_request = v();
        one.out_of_seq_request = v();
        one.rcvd_rnr_err = v();
        one.send_rnr_err = v();
        one.rcvd_seq_err = v();
        one.ack_deferred = v();
        one.retry_exceeded_err = v();
        one.retry_rnr_exceeded_err = v();
        one.completer_retry_err = v();
        one.send_err = v();
        one.link_downed = v();
        one.rdma_sends = v();
        one.rdma_recvs = v();
        one.sent_bytes = v();
        one.rcvd_bytes = v();
        one.qkey_viol_cntr = v() as u16;
        one.bad_pkey_cntr = v() as u16;
        one.icrc_errors = v();
        one.dropped_pkts = v();
        one.np_ecn_marked_roce_packets = v();
        one.np_cnp_sent = v();
        one.rp_cnp_handled = v();
        one.rp_cnp_ignored = v();
        let d = &mut one.drops;
        for f in [
            &mut d.malformed,
            &mut d.unknown_opcode,
            &mut d.unknown_qp,
            &mut d.wrong_transport,
            &mut d.wrong_path,
            &mut d.bad_pkey,
            &mut d.no_group,
            &mut d.qp_state,
            &mut d.psn_gap,
            &mut d.duplicate_ignored,
            &mut d.response_ignored,
            &mut d.uc_abandoned,
            &mut d.ud_bad_qkey,
            &mut d.ud_not_received,
            &mut d.nak_remote_access,
            &mut d.nak_invalid_request,
            &mut d.nak_remote_operational,
        ] {
            *f = v();
        }
        let mut sum = Counters::default();
        sum.accumulate(&one);
        assert_eq!(sum, one);
        sum.accumulate(&one);
        for ((name, got), (_, want)) in sum.named().into_iter().zip(one.named()) {
            assert_eq!(got, 2 * want, "{name}");
        }
        let names: std::collections::HashSet<_> = one.named().iter().map(|(k, _)| *k).collect();
        assert_eq!(names.len(), one.named().len(), "names are unique");
        // The words the fast path publishes, written in place, read back whole.
        let mut words = [7u64; crate::ring::fast::COUNTER_WORDS];
        one.write_words(&mut words);
        let n = one.to_words().len();
        assert!(n < words.len(), "every counter has a word");
        assert_eq!(&words[..n], &one.to_words()[..]);
        assert_eq!(words[n], 7, "words past the counters are left alone");
        assert_eq!(Counters::from_words(&words[..n]), one);
    }
}
