//! Which RC QPs use selective retransmission (`--loss-recovery`, docs/loss-recovery.md), and
//! the capability exchange on QP1 that tells softroce peers from the others
//! ([`proto::cm::caps`]); the link learns from it which IPv4 peers accept GSO on any path.
//!
//! Every QP starts with go-back-N, exactly as rxe. When one reaches RTR with its peer's
//! address: with `selective` it switches at once; with `auto` it switches if the device's
//! cache says the peer is a softroce device offering selective retransmission, and otherwise
//! waits (on go-back-N, so its first packets never wait) for the answer to the probe the
//! lookup sent, switching when a yes arrives. A kernel rxe peer refuses the probe (Linux
//! answers an unserved MAD class with status "unsupported") or never answers: its QPs stay on
//! go-back-N and it never sees a SACK. The cache is warmed by connection setup: a CM MAD to
//! or from a peer looks it up, so rdma_cm connections are usually decided before RTR.
//!
//! Both ends decide independently; while they disagree (the answer is on its way) the
//! engine still delivers both ways (`transport::selective`).

use super::DeviceThread;
use crate::config::LossRecoveryMode;
use crate::gsi::gsi_packet;
use crate::net::Link;
use proto::cm::caps::{Caps, CapsCache, Classified, PeerCaps};
use proto::ctl::RoceVersion;
use proto::transport::{self as tp, GidType, LossRecovery, QpState, QpType, SelectiveParams};
use proto::Qpn;
use std::collections::HashMap;
use std::net::IpAddr;
use tracing::info;

/// A device's side of the negotiation.
pub(super) struct Negotiation {
    mode: LossRecoveryMode,
    params: SelectiveParams,
    caps: CapsCache,
    /// QPs on go-back-N waiting for their peer's answer: peer -> (client, QPN).
    waiting: HashMap<IpAddr, Vec<(u64, u32)>>,
    /// The local address a peer is reached from (the probe's source) and the framing it is
    /// reached in (a RoCE v1 peer gets its probes as RoCE v1).
    via: HashMap<IpAddr, (IpAddr, GidType)>,
    /// PSN of the next MAD sent from QP1 (UD: any value; counted as rxe's GSI QP does).
    gsi_psn: u32,
}

impl Negotiation {
    /// `any_ident`: the device accepts any IPv4 Identification (a UDP link solves for it; a
    /// TAP link checks the one it sees), as its answers say.
    pub(super) fn new(
        mode: LossRecoveryMode,
        bdp_bytes: u32,
        any_ident: bool,
        seed: u64,
    ) -> Negotiation {
        let params = SelectiveParams { bdp_bytes };
        Negotiation {
            mode,
            params,
            caps: CapsCache::new(
                Caps {
                    selective: mode != LossRecoveryMode::Gbn,
                    bdp_bytes,
                    any_ident,
                },
                seed,
            ),
            waiting: HashMap::new(),
            via: HashMap::new(),
            gsi_psn: 0,
        }
    }

    pub(super) fn poll_timeout(&self) -> Option<tp::Nanos> {
        self.caps.poll_timeout()
    }

    /// The peers the capability exchange knows of, for `softroce link show`.
    pub(super) fn peers(&self) -> Vec<proto::ctl::PeerInfo> {
        self.caps
            .peers()
            .into_iter()
            .map(|(addr, known)| {
                let (kind, caps) = match known {
                    PeerCaps::Softroce(c) => ("softroce", Some(c)),
                    PeerCaps::Other => ("other", None),
                    PeerCaps::Asking => ("asking", None),
                };
                proto::ctl::PeerInfo {
                    addr,
                    kind: kind.into(),
                    selective: caps.is_some_and(|c| c.selective),
                    any_ident: caps.is_some_and(|c| c.any_ident),
                }
            })
            .collect()
    }

    /// The selective parameters for a QP toward a peer offering `peer`: the smaller window.
    fn toward(&self, peer: Caps) -> Option<SelectiveParams> {
        peer.selective.then(|| SelectiveParams {
            bdp_bytes: self.params.bdp_bytes.min(peer.bdp_bytes.max(4096)),
        })
    }
}

impl DeviceThread {
    /// A QP was modified: once an RC QP has its peer (RTR or later), choose its loss recovery.
    pub(super) fn choose_loss_recovery(&mut self, client: u64, qpn: u32) {
        let now = self.now();
        let Some(c) = self.clients.get_mut(&client) else {
            return;
        };
        let q = Qpn::new(qpn);
        if c.engine.qp_type(q) != Some(QpType::Rc)
            || c.engine.loss_recovery(q) != Some(LossRecovery::GoBackN)
        {
            return;
        }
        let Ok((state, attr)) = c.engine.query_qp(q) else {
            return;
        };
        let Some(av) = attr
            .ah_attr
            .filter(|_| matches!(state, QpState::Rtr | QpState::Rts))
        else {
            return;
        };
        let n = &mut self.negotiation;
        let params = match n.mode {
            LossRecoveryMode::Gbn => return,
            LossRecoveryMode::Selective => Some(n.params),
            // QPs between two of this device's own addresses: their packets never cross a
            // network (only an injected fault loses one), and the same-host fast path moves
            // such QPs between engines, which go-back-N's state allows: they recover as rxe.
            LossRecoveryMode::Auto if self.gids.contains(&av.dgid) => None,
            LossRecoveryMode::Auto => {
                if let Some(local) = self
                    .gids
                    .get(usize::from(av.sgid_index))
                    .filter(|a| !a.is_unspecified())
                {
                    let ty = gid_type_at(&self.info, usize::from(av.sgid_index));
                    n.via.insert(av.dgid, (*local, ty));
                }
                match n.caps.lookup(now, av.dgid) {
                    PeerCaps::Softroce(peer) => n.toward(peer),
                    PeerCaps::Other => None,
                    PeerCaps::Asking => {
                        let w = n.waiting.entry(av.dgid).or_default();
                        if !w.contains(&(client, qpn)) {
                            w.push((client, qpn));
                        }
                        None
                    }
                }
            }
        };
        if let Some(p) = params {
            switch(&mut c.engine, q, p, av.dgid);
        }
        self.send_caps_mads();
    }

    /// A CM MAD goes to or comes from `peer`: look it up, so that the answer is in before
    /// the connection's QPs reach RTR.
    pub(super) fn warm_loss_recovery(&mut self, peer: IpAddr, local: IpAddr, ty: GidType) {
        let n = &mut self.negotiation;
        if n.mode != LossRecoveryMode::Auto || self.gids.contains(&peer) {
            return;
        }
        n.via.insert(peer, (local, ty));
        let now = self.now();
        self.negotiation.caps.lookup(now, peer);
        self.send_caps_mads();
    }

    /// A capabilities MAD from `src` (to our `dst`) arrived on QP1.
    pub(super) fn caps_mad(&mut self, src: IpAddr, dst: IpAddr, ty: GidType, mad: Classified) {
        let now = self.now();
        let n = &mut self.negotiation;
        n.via.insert(src, (dst, ty));
        n.caps.handle_mad(now, src, mad);
        self.settle_negotiation();
    }

    /// Runs the cache's timers (probes resent, silent peers given up on).
    pub(super) fn negotiation_timers(&mut self) -> bool {
        let now = self.now();
        if self.negotiation.poll_timeout().is_none_or(|t| t > now) {
            return false;
        }
        self.negotiation.caps.handle_timeout(now);
        self.settle_negotiation();
        true
    }

    /// Sends what the cache has to send and switches the QPs whose peer answered.
    fn settle_negotiation(&mut self) {
        self.send_caps_mads();
        while let Some((peer, known)) = self.negotiation.caps.poll_update() {
            match known {
                PeerCaps::Softroce(c) => info!(device = %self.info.name, %peer,
                    selective = c.selective, bdp = c.bdp_bytes, any_ident = c.any_ident,
                    "peer is a softroce device"),
                _ => info!(device = %self.info.name, %peer,
                    "peer is not a softroce device: go-back-N toward it"),
            }
            // A peer that solves for the IPv4 Identification the ICRC covers gets IPv4 sends
            // batched with GSO on any path (`net::transport`).
            self.link
                .peer_solves_ident(peer, matches!(known, PeerCaps::Softroce(c) if c.any_ident));
            let waiting = self.negotiation.waiting.remove(&peer).unwrap_or_default();
            let params = match known {
                PeerCaps::Softroce(caps) => self.negotiation.toward(caps),
                _ => None,
            };
            let Some(p) = params else { continue };
            for (client, qpn) in waiting {
                if let Some(c) = self.clients.get_mut(&client) {
                    switch(&mut c.engine, Qpn::new(qpn), p, peer);
                }
            }
        }
    }

    fn send_caps_mads(&mut self) {
        while let Some(t) = self.negotiation.caps.poll_transmit() {
            let via = self.negotiation.via.get(&t.peer).copied().or_else(|| {
                let i = self
                    .gids
                    .iter()
                    .position(|g| !g.is_unspecified() && g.is_ipv4() == t.peer.is_ipv4())?;
                Some((self.gids[i], gid_type_at(&self.info, i)))
            });
            let Some((src, ty)) = via else { continue };
            let psn = self.negotiation.gsi_psn;
            self.negotiation.gsi_psn = psn.wrapping_add(1) & 0xff_ffff;
            if let Some(mut packet) = gsi_packet(psn, &t.mad) {
                self.link.send_gsi_as(ty, src, t.peer, &mut packet);
                // QP1 traffic counts in the device's packets, as rxe counts its MADs (and
                // as a capture shows them).
                self.gsi_sent += 1;
            }
        }
        self.link.flush();
    }
}

/// The framing of the device's GID `index` (RoCE v2 when there is none).
pub(super) fn gid_type_at(info: &proto::ctl::DeviceInfo, index: usize) -> GidType {
    match info.gid_entry(index).map(|g| g.roce) {
        Some(RoceVersion::V1) => GidType::RoceV1,
        _ => GidType::RoceV2,
    }
}

/// Switches one QP (still there, still on go-back-N) to selective retransmission.
fn switch(engine: &mut super::clients::Engine, qpn: Qpn, params: SelectiveParams, peer: IpAddr) {
    if engine.loss_recovery(qpn) != Some(LossRecovery::GoBackN) {
        return;
    }
    if engine
        .set_loss_recovery(qpn, LossRecovery::Selective(params))
        .is_ok()
    {
        info!(qpn = qpn.value(), %peer, bdp = params.bdp_bytes, "QP uses selective retransmission");
    }
}
