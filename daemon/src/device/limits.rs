//! The device's resource caps ([`crate::config::ResourceLimits`], `max_qp`, `max_mr`): what the
//! device holds over all its clients and what one client may hold on it. A request past a cap
//! fails with ENOMEM at the verb, as a device out of a resource does, before anything is
//! allocated; ring memory (which the daemon allocates) is charged by the bytes of the region
//! a CQ, QP or SRQ would get.

use super::clients::ClientDev;
use super::control::errno;
use super::DeviceThread;
use proto::ctl::{Request, Response};

/// What one client holds, or the device over all of them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Usage {
    pub qps: u64,
    pub cqs: u64,
    pub srqs: u64,
    pub mrs: u64,
    pub mr_bytes: u64,
    pub ring_bytes: u64,
}

impl Usage {
    pub fn of(c: &ClientDev) -> Usage {
        Usage {
            qps: c.qps.len() as u64,
            cqs: c.cqs.len() as u64,
            srqs: c.srqs.len() as u64,
            mrs: c.mrs.len() as u64,
            mr_bytes: c.mr_bytes,
            ring_bytes: c.ring_bytes,
        }
    }

    fn add(self, o: Usage) -> Usage {
        Usage {
            qps: self.qps + o.qps,
            cqs: self.cqs + o.cqs,
            srqs: self.srqs + o.srqs,
            mrs: self.mrs + o.mrs,
            mr_bytes: self.mr_bytes.saturating_add(o.mr_bytes),
            ring_bytes: self.ring_bytes.saturating_add(o.ring_bytes),
        }
    }
}

/// One cap: the count in use, one more wanted, the limit and its name.
fn over(used: u64, more: u64, limit: u64, what: &str, key: &str) -> Result<(), String> {
    if used.saturating_add(more) > limit {
        Err(format!("{what} limit ({key} = {limit}) is reached"))
    } else {
        Ok(())
    }
}

impl DeviceThread {
    /// What the device holds over all its clients.
    fn usage(&self) -> Usage {
        self.clients
            .values()
            .map(Usage::of)
            .fold(Usage::default(), Usage::add)
    }

    /// The answer to `request` of `client` if it would pass a cap (ENOMEM naming the cap).
    pub(super) fn past_a_limit(&self, client: u64, request: &Request) -> Option<Response> {
        self.cap_reached(client, request)
            .err()
            .map(|why| errno(libc::ENOMEM, &why))
    }

    /// The cap `request` of `client` would pass, if any.
    fn cap_reached(&self, client: u64, request: &Request) -> Result<(), String> {
        let device = self.usage();
        let mine = self.clients.get(&client).map(Usage::of).unwrap_or_default();
        let (l, dev, me) = (&self.limits, "the device's", "this client's");
        let check = |used_dev: u64,
                     used_me: u64,
                     more: u64,
                     max_dev: u64,
                     max_me: u64,
                     keys: (&str, &str, &str)| {
            let (key_dev, key_me, what) = keys;
            over(used_dev, more, max_dev, &format!("{dev} {what}"), key_dev)?;
            over(used_me, more, max_me, &format!("{me} {what}"), key_me)
        };
        match request {
            Request::CreateQp { .. } => check(
                device.qps,
                mine.qps,
                1,
                self.max_qp as u64,
                l.client_max_qp.into(),
                ("max_qp", "client_max_qp", "QP"),
            ),
            Request::CreateCq { .. } => check(
                device.cqs,
                mine.cqs,
                1,
                l.max_cq.into(),
                l.client_max_cq.into(),
                ("max_cq", "client_max_cq", "CQ"),
            ),
            Request::CreateSrq { .. } => check(
                device.srqs,
                mine.srqs,
                1,
                l.max_srq.into(),
                l.client_max_srq.into(),
                ("max_srq", "client_max_srq", "SRQ"),
            ),
            Request::RegMr { length, .. } => {
                check(
                    device.mrs,
                    mine.mrs,
                    1,
                    self.max_mr as u64,
                    l.client_max_mr.into(),
                    ("max_mr", "client_max_mr", "MR"),
                )?;
                check(
                    device.mr_bytes,
                    mine.mr_bytes,
                    *length,
                    l.max_mr_bytes,
                    l.client_max_mr_bytes,
                    ("max_mr_bytes", "client_max_mr_bytes", "registered memory"),
                )
            }
            _ => Ok(()),
        }
    }

    /// The ring bytes `client` may still be given (under both ring caps).
    pub(super) fn ring_budget(&self, client: u64) -> u64 {
        let device = self.usage().ring_bytes;
        let mine = self.clients.get(&client).map_or(0, |c| c.ring_bytes);
        let l = &self.limits;
        l.max_ring_bytes
            .saturating_sub(device)
            .min(l.client_max_ring_bytes.saturating_sub(mine))
    }
}
