//! The seam between a device and the network it is attached to.
//!
//! A device thread drives its engines and moves their packets through one [`Link`]: today's
//! UDP sockets ([`super::UdpLink`], RoCE v2 through the kernel's IP stack), and whatever else
//! a device can sit on (a TAP device of its own on the Ethernet). Layers that watch or disturb
//! traffic (capture, fault injection) wrap a link the way smoltcp's `phy` middlewares wrap a
//! device, so the device loop never knows which link it has.
//!
//! What crosses the seam is what the engine speaks: network-layer packets, the IP (or RoCE v1
//! GRH) header first, BTH..ICRC after. A link of the L2 device ([`super::l2::L2Link`]) carries
//! both RoCE versions; the framing of a packet sent is the type of its source GID
//! ([`proto::transport::GidType`]), which the engine's [`Transmit`] names. On receive the link has already verified the ICRC
//! (it is the one that knows the headers the wire really carried), so the device hands the
//! packet to [`proto::transport::Engine::handle_verified_packet`]; on send the link seals the
//! ICRC for exactly the headers it will send.

use super::NetCounters;
use proto::transport::{GidType, Transmit};
use std::io;
use std::net::IpAddr;
use std::time::Duration;

/// One received packet, verified, borrowed from the link's receive buffer.
#[derive(Debug, Clone, Copy)]
pub struct RxPacket<'a> {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// The packet from its network header on (IPv4 or IPv6 with UDP, as on the wire, or
    /// the RoCE v1 GRH), ICRC verified: what the engine takes.
    pub packet: &'a [u8],
    /// Where the BTH starts in `packet`.
    pub bth: usize,
    /// How it was framed: RoCE v1 (a GRH) or v2 (IP/UDP). A CM MAD is answered in kind.
    pub gid_type: GidType,
}

impl RxPacket<'_> {
    /// BTH..ICRC.
    pub fn transport(&self) -> &[u8] {
        self.packet.get(self.bth..).unwrap_or_default()
    }

    /// The destination QPN in the BTH (bytes 5..8).
    pub fn dest_qpn(&self) -> Option<u32> {
        dest_qpn(self.transport())
    }
}

/// The destination QPN in a BTH (bytes 5..8).
pub fn dest_qpn(bth: &[u8]) -> Option<u32> {
    bth.get(5..8)
        .map(|b| u32::from_be_bytes([0, b[0], b[1], b[2]]))
}

/// A device's attachment to the network.
pub trait Link {
    /// Submits queued sends, waits up to `wait` for received packets (or the device's wake
    /// descriptor), and hands every packet that verified, addressed to one of the link's
    /// addresses or to a multicast group it joined, to `deliver`. Returns how many.
    fn poll(&mut self, wait: Duration, deliver: &mut dyn FnMut(&RxPacket<'_>)) -> usize;

    /// Queues one packet an engine wrote, `frame[..t.len]`; its ICRC is sealed here, for the
    /// headers the link sends it with.
    fn send(&mut self, frame: &mut [u8], t: &Transmit);

    /// Queues a MAD for the GSI QP: `packet` is BTH..ICRC of a UD SEND_ONLY from QP1, its
    /// ICRC sealed here.
    fn send_gsi(&mut self, src: IpAddr, dst: IpAddr, packet: &mut [u8]);

    /// [`Link::send_gsi`] in the framing of `gid_type`: a link that carries RoCE v1 (the L2
    /// device) overrides it; the default sends v2 MADs and refuses v1 ones (a UDP link
    /// cannot frame them). Layers that wrap a link forward it.
    fn send_gsi_as(&mut self, gid_type: GidType, src: IpAddr, dst: IpAddr, packet: &mut [u8]) {
        match gid_type {
            GidType::RoceV2 => self.send_gsi(src, dst, packet),
            GidType::RoceV1 => {
                tracing::debug!(%src, %dst, "a RoCE v1 MAD on a link without RoCE v1 dropped")
            }
        }
    }

    /// Submits what is queued.
    fn flush(&mut self);

    /// The device's addresses (its GID table) changed: receive for these from now on.
    fn set_addresses(&mut self, addrs: &[IpAddr]);

    /// Joins multicast `group` on the network for the device's first QP attached to it. An
    /// error leaves the device's own QPs still reached by its own sends to the group.
    fn join_group(&mut self, group: IpAddr) -> io::Result<()>;

    /// Leaves `group` (its last QP detached).
    fn leave_group(&mut self, group: IpAddr);

    /// How long an idle device may sleep at most because part of the link cannot wake it
    /// (and must be polled); `None` when everything wakes it.
    fn max_sleep(&self) -> Option<Duration>;

    /// The link's packet counters.
    fn counters(&self) -> NetCounters;

    /// Whether `peer` accepts any IPv4 Identification (a softroce device on a UDP socket,
    /// which solves for it: the capability exchange on QP1 said so). A UDP link then batches
    /// IPv4 sends to it with GSO on any path, not only on loopback. Layers that wrap a link
    /// forward it.
    fn peer_solves_ident(&mut self, _peer: IpAddr, _yes: bool) {}

    /// The packet the last [`Link::send`] or [`Link::send_gsi`] queued, as it leaves on the
    /// wire: what a capture layer records. `None` when the link cannot tell.
    fn last_sent(&self) -> Option<WireView<'_>> {
        None
    }

    /// The operator set the port up or down (`softroce link set`): a link that is an
    /// interface of its own (the L2 device's TAP) turns its carrier on or off, so that the
    /// host sees the cable pulled too. Layers that wrap a link forward it.
    fn set_carrier(&mut self, _on: bool) {}

    /// Starts resolving `peer`'s link-layer address for the CM thread's address resolution
    /// (the L2 device; the kernel resolves for a UDP link, which does nothing here). Layers
    /// that wrap a link forward it.
    fn solicit_neighbour(&mut self, _peer: IpAddr) {}

    /// Whether a capture listens: a link that must copy to show [`Link::last_sent`] (a TAP
    /// link's frame leaves in a slot it does not keep) does so only while asked.
    fn keep_last_sent(&mut self, _on: bool) {}

    /// Sends like [`Link::send`], but with one bit flipped after the ICRC was sealed, so that
    /// the receiver's ICRC check drops it (fault injection). False when the link cannot:
    /// the fault layer then drops the packet itself.
    fn send_corrupted(&mut self, _frame: &mut [u8], _t: &Transmit) -> bool {
        false
    }
}

/// A packet as it is on the wire, for a capture.
#[derive(Debug, Clone, Copy)]
pub enum WireView<'a> {
    /// A UDP datagram, with the header fields the kernel writes around its payload.
    Udp(crate::capture::UdpDatagram<'a>),
    /// A whole Ethernet frame (a TAP link's), its BTH at `bth`.
    Ethernet { frame: &'a [u8], bth: usize },
}
