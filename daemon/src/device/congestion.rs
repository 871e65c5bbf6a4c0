//! The device's congestion control as it runs: the algorithm and parameters every engine of
//! the device was created with, mlx5's counters summed over the device's engines (those of
//! clients that are gone included), and the rate of every QP (`softroce res show`).

use super::DeviceThread;
use proto::ctl::{DeviceCongestion, QpRate, MAX_QP_RATES};
use proto::Qpn;

impl DeviceThread {
    pub(super) fn congestion_report(&self) -> DeviceCongestion {
        // Those of the clients that are gone, then the live ones'.
        let mut counters: Vec<(String, u64)> = self
            .departed
            .cc_counters()
            .iter()
            .map(|(name, v)| (name.to_string(), *v))
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
