//! The InfiniBand connection manager (IBTA Vol. 1 ch. 12) as Linux's `ib_cm` and `rdma_cm`
//! put it on the wire, free of I/O.
//!
//! - [`msg`]: every CM message as a `Repr`, decoded and encoded byte-exactly;
//! - [`rdma_cm`]: what the rdma_cm layer puts in and derives from those messages (service
//!   IDs, the private-data header, QP attributes, the RoCE v2 flow label);
//! - [`conn`]: the ib_cm state machine for many connections and listeners, driven by MADs
//!   and virtual time (quinn-proto style: `handle_*` in, `poll_*` out).
//!
//! Driving it (the daemon): one [`CmEndpoint`] per port. Every UD SEND_ONLY to QP1 whose
//! 256-byte payload is a CM MAD (class 0x07) goes to `handle_mad(now, source IP, payload)`;
//! every [`Transmit`] goes out as a UD SEND_ONLY from QP1 to QP1 of `peer` with Q_Key
//! [`GSI_QKEY`]; `handle_timeout(now)` runs at `poll_timeout()`. Events map to rdma_cm
//! events with [`CmEvent::rdma_cm_event`]; QP attributes come from
//! [`conn::negotiated_active`] / [`conn::negotiated_passive`] and [`rdma_cm::qp_attrs`].
//!
//! [`caps`] is softroce's own use of QP1: a vendor-class MAD with which two softroce devices
//! agree on selective retransmission, and the per-peer cache of the answers.

pub mod caps;
pub mod conn;
pub mod msg;
pub mod rdma_cm;

pub use conn::{
    AcceptParams, CmEndpoint, CmEvent, ConnId, ConnInfo, ConnectParams, DisconnectCause,
    EndpointConfig, SidrParams, State, Transmit,
};
pub use msg::{CmError, CmMad, CmMessage, RejReason};

/// CM MADs travel on the GSI QP (QP1) of both nodes (facts §8.1).
pub const GSI_QPN: u32 = 1;
/// The well-known GSI Q_Key in every CM MAD's DETH.
pub const GSI_QKEY: u32 = 0x8001_0000;
/// rxe's UDP source port for QP1: `0xC000 + hash_32(1, 14)` (facts §1.3 step 1).
pub const GSI_UDP_SPORT: u16 = 0xD872;
/// Receive buffers for MADs hold the 40-byte GRH slot and the 256-byte MAD.
pub const GSI_RECV_LEN: usize = 40 + crate::wire::mad::MAD_LEN;

#[cfg(test)]
mod tests {
    #[test]
    fn gsi_source_port_is_rxe_hash_of_qp1() {
        let hash_32 = |v: u32| v.wrapping_mul(0x61C8_8647) >> 18;
        assert_eq!(
            0xC000 + (hash_32(super::GSI_QPN) & 0x3FFF),
            u32::from(super::GSI_UDP_SPORT)
        );
    }
}
