//! The device's congestion control as it runs: the algorithm and parameters every engine of
//! the device was created with, mlx5's counters summed over the device's engines (those of
//! clients that are gone included), and the rate of every QP (`softroce res show`).

use super::DeviceThread;
use proto::ctl::{DeviceCongestion, QpRate, MAX_QP_RATES};
use proto::transport as tp;
use proto::Qpn;

impl DeviceThread {
    /// Keeps the congestion-control counters of an engine that is going away.
    pub(super) fn count_departed(&mut self, counters: &tp::Counters) {
        for (total, (_, v)) in self.cc_departed.iter_mut().zip(counters.cc_counters()) {
            *total += v;
        }
    }

    pub(super) fn congestion_report(&self) -> DeviceCongestion {
        let mut counters: Vec<(String, u64)> = tp::Counters::default()
            .cc_counters()
            .iter()
            .zip(self.cc_departed)
            .map(|((name, _), departed)| (name.to_string(), departed))
            .collect();
        let mut qps = Vec::new();
        for (&client, c) in &self.clients {
            for (total, (_, v)) in counters.iter_mut().zip(c.engine.counters().cc_counters()) {
                total.1 += v;
            }
            for &qpn in c.qps.keys() {
                let Some(q) = c.engine.qp_congestion(Qpn::new(qpn)) else {
                    continue;
                };
                qps.push(QpRate {
                    client,
                    qpn,
                    rate_bps: q.rate_bps,
                    target_bps: q.target_bps,
                    alpha_1024: (q.alpha * 1024.0).round() as u32,
                    paced: q.limited,
                });
            }
        }
        // Paced QPs first (the ones congestion control is acting on), then in QPN order.
        qps.sort_by_key(|q| (!q.paced, q.client, q.qpn));
        let qps_not_shown = qps.len().saturating_sub(MAX_QP_RATES) as u32;
        qps.truncate(MAX_QP_RATES);
        DeviceCongestion {
            device: self.info.name.clone(),
            algorithm: self.congestion.algorithm.to_string(),
            params: self
                .congestion
                .params
                .values()
                .iter()
                .map(|(n, v)| (n.to_string(), *v))
                .collect(),
            counters,
            qps,
            qps_not_shown,
        }
    }
}
