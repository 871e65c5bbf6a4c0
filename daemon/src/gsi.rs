//! The GSI (QP1) plumbing between the device threads and the CM thread: CM MADs the devices
//! receive go to the CM thread as [`GsiMad`]s through a bounded queue, and the MADs the CM
//! thread sends go back to the device that carries them as [`GsiOut`]s, to leave through its
//! link like all its traffic (so a capture sees the CM exchange even when the daemon talks to
//! itself), with the peers whose link-layer address rdma_cm's address resolution waits for
//! ([`ToDevice`]). Neither side knows the other's internals: this module is all they share.

use crossbeam_channel::{Receiver, Sender};
use proto::cm::{GSI_QKEY, GSI_QPN};
use proto::transport::GidType;
use proto::wire::{BthRepr, DethRepr, Opcode, RocePacket, TransportRepr};
use proto::{Psn, Qkey, Qpn};
use std::net::IpAddr;

/// A CM MAD a device thread received on QP1.
#[derive(Debug, Clone)]
pub struct GsiMad {
    pub device: usize,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub mad: Vec<u8>,
    /// The framing it came in (RoCE v1 or v2): the passive side answers in the REQ's.
    pub gid_type: GidType,
}

/// MADs received and not yet taken by the CM thread: the kernel's GSI QP has as many receive
/// buffers (ib_mad's `IB_MAD_QP_RECV_SIZE`); a MAD that finds them all taken is dropped, and
/// the sender's retries cover it. Without a bound, a peer sending MADs faster than the CM
/// thread handles them would grow the daemon's memory without limit.
pub const GSI_RECV_QUEUE: usize = 512;

/// The queue from the device threads to the CM thread.
pub fn gsi_queue() -> (Sender<GsiMad>, Receiver<GsiMad>) {
    crossbeam_channel::bounded(GSI_RECV_QUEUE)
}

/// Hands a received MAD to the CM thread without ever blocking the device thread; false when
/// it was dropped (the queue is full, or the CM thread is gone).
pub fn deliver_gsi(sink: &Sender<GsiMad>, mad: GsiMad) -> bool {
    sink.try_send(mad).is_ok()
}

/// A MAD for a device to send: `packet` is BTH..ICRC of a UD SEND_ONLY from QP1 (built by
/// [`gsi_packet`]); its ICRC is computed by the device's link for the headers it sends with.
#[derive(Debug, Clone)]
pub struct GsiOut {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub packet: Vec<u8>,
    /// The framing to send it in.
    pub gid_type: GidType,
}

/// What the CM thread hands a device thread.
#[derive(Debug, Clone)]
pub enum ToDevice {
    /// A CM MAD to send.
    Mad(GsiOut),
    /// A peer whose link-layer address rdma_cm's address resolution waits for (the L2
    /// device resolves it; the kernel does for a UDP device).
    Solicit(IpAddr),
}

/// Hands a [`ToDevice`] to one device thread (and wakes it); false when the device is gone.
pub type DeviceSender = Box<dyn Fn(ToDevice) -> bool + Send>;

/// The part of a received datagram (BTH..ICRC, ICRC already verified) that is a MAD for QP1:
/// a UD SEND_ONLY with the GSI Q_Key (facts §8.1). `None` for anything else, which rxe's GSI
/// QP would drop too.
pub fn gsi_payload(bytes: &[u8]) -> Option<&[u8]> {
    let p = RocePacket::new_checked(bytes).ok()?;
    let t = TransportRepr::parse(&p).ok()?;
    if t.bth.opcode != Opcode::UD_SEND_ONLY || t.bth.dest_qpn.value() != GSI_QPN {
        return None;
    }
    if t.deth.map(|d| d.qkey.0) != Some(GSI_QKEY) {
        return None;
    }
    let start = p.layout().header_len;
    if p.layout().payload_len < proto::wire::mad::MAD_LEN {
        return None;
    }
    bytes.get(start..start + proto::wire::mad::MAD_LEN)
}

/// A MAD as the UD SEND_ONLY packet from QP1 to QP1 that carries it (BTH, DETH, MAD, room for
/// the ICRC, which the sender computes for the addresses it sends with).
pub fn gsi_packet(psn: u32, mad: &[u8]) -> Option<Vec<u8>> {
    let mut t = TransportRepr::new(BthRepr {
        opcode: Opcode::UD_SEND_ONLY,
        solicited: false,
        mig_req: false,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qpn: Qpn::new(GSI_QPN),
        // rxe sets AckReq on every MAD it sends (a signaled send's last packet), as every
        // captured kernel REQ/REP/RTU/DREQ/DREP/SIDR shows; the receiver ignores it on UD.
        ack_req: true,
        psn: Psn::new(psn),
    });
    t.deth = Some(DethRepr {
        qkey: Qkey(GSI_QKEY),
        src_qpn: Qpn::new(GSI_QPN),
    });
    t.payload_len = mad.len();
    let mut buf = vec![0u8; t.buffer_len()];
    t.emit(&mut buf, mad).ok()?;
    Some(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn received_mads_beyond_the_gsi_queue_are_dropped_without_blocking() {
        let (sink, queue) = gsi_queue();
        let mad = |i: usize| GsiMad {
            device: 0,
            src: IpAddr::V4(Ipv4Addr::new(127, 0, 0, 9)),
            dst: IpAddr::V4(Ipv4Addr::LOCALHOST),
            mad: vec![i as u8; proto::wire::mad::MAD_LEN],
            gid_type: GidType::RoceV2,
        };
        // Nobody reads: the device thread must neither block nor queue without limit.
        let taken = (0..GSI_RECV_QUEUE + 10)
            .filter(|&i| deliver_gsi(&sink, mad(i)))
            .count();
        assert_eq!(taken, GSI_RECV_QUEUE);
        assert_eq!(queue.len(), GSI_RECV_QUEUE);
        // The oldest were kept, in order; room again once the CM thread takes one.
        assert_eq!(queue.recv().map(|m| m.mad[0]).ok(), Some(0));
        assert!(deliver_gsi(&sink, mad(1)));
        drop(queue);
        assert!(!deliver_gsi(&sink, mad(2)), "the CM thread is gone");
    }

    #[test]
    fn gsi_packets_round_trip() {
        let mut mad = [0u8; proto::wire::mad::MAD_LEN];
        mad[0] = 1;
        mad[1] = 7;
        let p = gsi_packet(0x123, &mad).unwrap();
        assert_eq!(p.len(), 12 + 8 + 256 + 4);
        assert_eq!(p[0], 0x64, "UD SEND_ONLY");
        assert_eq!(&p[4..8], &[0, 0, 0, 1], "dest QP 1");
        assert_eq!(&p[12..16], &GSI_QKEY.to_be_bytes());
        assert_eq!(gsi_payload(&p), Some(&mad[..]));
        let mut wrong = p.clone();
        wrong[12] ^= 1;
        assert_eq!(gsi_payload(&wrong), None, "Q_Key other than GSI");
        assert_eq!(gsi_payload(&p[..100]), None);
    }
}
