//! The engine's per-packet path to and from the wire format.
//!
//! The wire layer ([`crate::wire::FrameRepr`]) is general: any link, v1 or v2, captures cut
//! short. Per packet it recomputes the extended-header offsets of the opcode (a walk of the
//! header order for each of nine headers), and moves whole frame reprs through several
//! levels of calls; at MTU 1024 that was about as much work as hashing the payload. The
//! engine only ever sends and receives whole network packets (RoCE v2 IPv4/IPv6, or a v1
//! GRH and the transport), so here:
//!
//! - the header offsets of each opcode are computed once ([`layouts`]) from the wire's own
//!   opcode table;
//! - [`emit`] writes a frame straight into the transmit buffer (network and UDP headers or
//!   the GRH, BTH, extended headers, payload through a callback, pad, ICRC), byte for byte what
//!   [`crate::wire::FrameRepr::emit`] writes (tested below for every opcode);
//! - [`parse_ipv4`] accepts only well-formed IPv4 RoCE v2 packets with a good ICRC, with
//!   checks at least as strict as the wire parser's. Anything else (IPv6, an anomaly, a bad
//!   ICRC) returns `None` and the caller runs the wire parser, whose verdict then stands. So
//!   the fast path never accepts what the wire layer would refuse, and errors are counted
//!   exactly as before.

use super::engine::{GidType, RxPacket, Transmit};
use crate::types::Rkey;
use crate::wire::{
    bth, icrc, ipv4, ipv6, payload_copy, udp, AethRepr, AtomicAckEthRepr, AtomicEthRepr, Bth,
    BthRepr, DethRepr, FethRepr, HeaderSet, Ipv4Packet, NetRepr, OpInfo, Opcode, RethRepr,
    TransportRepr, UdpRepr, ROCE_V2_PORT,
};
use std::net::IpAddr;
use std::sync::OnceLock;

/// The extended headers, in the order of [`HeaderSet::ORDER`].
const EXT: [HeaderSet; 9] = [
    HeaderSet::DETH,
    HeaderSet::FETH,
    HeaderSet::RETH,
    HeaderSet::ATOMIC_ETH,
    HeaderSet::AETH,
    HeaderSet::ATOMIC_ACK_ETH,
    HeaderSet::IMM,
    HeaderSet::IETH,
    HeaderSet::CNP_RESERVED,
];
const DETH: usize = 0;
const FETH: usize = 1;
const RETH: usize = 2;
const ATOMIC_ETH: usize = 3;
const AETH: usize = 4;
const ATOMIC_ACK_ETH: usize = 5;
const IMM: usize = 6;
const IETH: usize = 7;
const CNP: usize = 8;
/// Marks a header the opcode does not carry.
const ABSENT: u8 = u8::MAX;

/// Where the parts of an opcode's headers lie.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OpLayout {
    pub info: &'static OpInfo,
    /// BTH plus extended headers.
    pub header_len: usize,
    /// Offset of each of [`EXT`] after the BTH, or [`ABSENT`].
    offsets: [u8; 9],
}

impl OpLayout {
    fn at(&self, i: usize) -> Option<usize> {
        let o = self.offsets[i];
        (o != ABSENT).then_some(o as usize)
    }
}

/// The layout of every opcode (None for the unknown ones), computed on first use.
pub(crate) fn layouts() -> &'static [Option<OpLayout>; 256] {
    static TABLE: OnceLock<[Option<OpLayout>; 256]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = [None; 256];
        for (code, slot) in t.iter_mut().enumerate() {
            let Some(info) = Opcode(code as u8).info() else {
                continue;
            };
            let mut offsets = [ABSENT; 9];
            for (o, h) in offsets.iter_mut().zip(EXT) {
                if let Some(at) = info.headers.offset_of(h) {
                    *o = at as u8;
                }
            }
            *slot = Some(OpLayout {
                info,
                header_len: bth::HEADER_LEN + info.header_len(),
                offsets,
            });
        }
        t
    })
}

fn layout_of(opcode: Opcode) -> Option<&'static OpLayout> {
    layouts()[opcode.0 as usize].as_ref()
}

fn pad_of(payload_len: usize) -> usize {
    payload_len.wrapping_neg() & 3
}

/// BTH through ICRC of `t`, or None for an unknown opcode.
pub(crate) fn transport_len(t: &TransportRepr) -> Option<usize> {
    let l = layout_of(t.bth.opcode)?;
    Some(l.header_len + t.payload_len + pad_of(t.payload_len) + crate::wire::ICRC_LEN)
}

/// Where a packet the engine sends goes: its network header (lengths are filled in when it
/// is written) and its UDP source port. Kept apart from the transport headers so that
/// neither is copied around per packet.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Route {
    pub net: NetRepr,
    pub src_port: u16,
}

impl Route {
    /// Length of the network header and, for RoCE v2, the UDP header.
    #[inline]
    fn headers_len(&self) -> usize {
        match self.net {
            NetRepr::Grh(_) => ipv6::HEADER_LEN,
            net => net.header_len() + udp::HEADER_LEN,
        }
    }
}

/// The whole packet's length: network header through ICRC, or None for an unknown opcode.
#[cfg(test)]
pub(crate) fn frame_len(route: &Route, t: &TransportRepr) -> Option<usize> {
    Some(route.headers_len() + transport_len(t)?)
}

/// [`TransportRepr::check`] by the table: the headers present are exactly the opcode's, and
/// the payload length suits it.
fn check(t: &TransportRepr, l: &OpLayout) -> bool {
    let present = [
        t.deth.is_some(),
        t.feth.is_some(),
        t.reth.is_some(),
        t.atomic_eth.is_some(),
        t.aeth.is_some(),
        t.atomic_ack_eth.is_some(),
        t.imm.is_some(),
        t.ieth.is_some(),
    ];
    // CNP's reserved bytes are not a field of the repr: always "present" when wanted.
    let headers_ok = present
        .iter()
        .enumerate()
        .all(|(i, &p)| p == (l.offsets[i] != ABSENT));
    let payload_ok = if l.info.has(OpInfo::ATOMIC_WRITE) {
        t.payload_len == 8
    } else {
        l.info.has(OpInfo::PAYLOAD) || t.payload_len == 0
    };
    headers_ok && payload_ok
}

/// Writes BTH and extended headers into `buf` (the transport part of a frame, at least
/// `header_len` long): what `TransportRepr::emit_in_place` writes before the payload.
fn emit_headers(t: &TransportRepr, l: &OpLayout, buf: &mut [u8]) {
    t.bth.emit(buf, pad_of(t.payload_len) as u8);
    let ext = &mut buf[bth::HEADER_LEN..l.header_len];
    if let (Some(o), Some(h)) = (l.at(DETH), t.deth) {
        h.emit(&mut ext[o..]);
    }
    if let (Some(o), Some(h)) = (l.at(FETH), t.feth) {
        h.emit(&mut ext[o..]);
    }
    if let (Some(o), Some(h)) = (l.at(RETH), t.reth) {
        h.emit(&mut ext[o..]);
    }
    if let (Some(o), Some(h)) = (l.at(ATOMIC_ETH), t.atomic_eth) {
        h.emit(&mut ext[o..]);
    }
    if let (Some(o), Some(h)) = (l.at(AETH), t.aeth) {
        h.emit(&mut ext[o..]);
    }
    if let (Some(o), Some(h)) = (l.at(ATOMIC_ACK_ETH), t.atomic_ack_eth) {
        h.emit(&mut ext[o..]);
    }
    if let (Some(o), Some(v)) = (l.at(IMM), t.imm) {
        ext[o..o + 4].copy_from_slice(&v.to_be_bytes());
    }
    if let (Some(o), Some(k)) = (l.at(IETH), t.ieth) {
        ext[o..o + 4].copy_from_slice(&k.0.to_be_bytes());
    }
    if let Some(o) = l.at(CNP) {
        ext[o..o + 16].fill(0);
    }
}

/// How a transmit path provided a packet's payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Payload<'a> {
    /// It wrote the payload into the slice it was given.
    Written,
    /// It lends the payload's bytes (registered memory in this process): [`emit`] copies
    /// them into the frame in the pass that computes the ICRC.
    Lent(&'a [u8]),
    /// The payload stays where it was lent and the frame's payload bytes are left as they
    /// were: an unsealed packet whose consumer reads them there
    /// ([`crate::transport::MemoryAccess::leave_in_place`]).
    InPlace,
}

/// The headers of a full-MTU MIDDLE packet of the message a QP is sending, kept from the
/// first such packet to build the next ones: they differ only in the PSN and the AckReq bit
/// (the IPv4 Identification is 0, the lengths are equal; RoCE v1 has a GRH and no UDP). Copying 40-60 bytes and patching 4
/// replaces the per-packet work of building, checking and writing the headers field by
/// field, which was about a third of the requester's time per packet at MTU 4096.
#[derive(Debug, Clone)]
pub(crate) struct SegmentTemplate {
    /// The first PSN of the work request these packets belong to (its identity).
    pub first_psn: crate::types::Psn,
    header: [u8; SEGMENT_HEADER_MAX],
    /// Network + UDP + BTH.
    header_len: usize,
    tx: Transmit,
}

/// IPv6 (40) + UDP (8) + BTH (12).
const SEGMENT_HEADER_MAX: usize = 60;

impl SegmentTemplate {
    /// Keeps the headers of `frame`, a MIDDLE packet `tx` described, as sent for the work
    /// request that started at `first_psn`. None if it is not one (extended headers, a pad).
    pub(crate) fn capture(
        frame: &[u8],
        tx: &Transmit,
        first_psn: crate::types::Psn,
    ) -> Option<SegmentTemplate> {
        let header_len = tx.transport_offset + bth::HEADER_LEN;
        let b = Bth::new_checked(frame.get(tx.transport_offset..)?).ok()?;
        let l = layout_of(b.opcode())?;
        if l.header_len != bth::HEADER_LEN
            || b.pad_count() != 0
            || header_len > SEGMENT_HEADER_MAX
            || frame.len() != tx.len
        {
            return None;
        }
        let mut header = [0u8; SEGMENT_HEADER_MAX];
        header[..header_len].copy_from_slice(&frame[..header_len]);
        Some(SegmentTemplate {
            first_psn,
            header,
            header_len,
            tx: *tx,
        })
    }

    /// Payload bytes of each packet.
    pub(crate) fn payload_len(&self) -> usize {
        self.tx.len - self.header_len - crate::wire::ICRC_LEN
    }

    /// [`emit`] for the next packet like the kept one, with PSN `psn`.
    #[inline(always)]
    pub(crate) fn emit<'a, E>(
        &self,
        psn: crate::types::Psn,
        ack_req: bool,
        buf: &mut [u8],
        seal: bool,
        fill: impl FnOnce(&mut [u8]) -> Result<Payload<'a>, E>,
    ) -> Option<Result<(), E>> {
        let (len, h, payload_len) = (self.tx.len, self.header_len, self.payload_len());
        let buf = buf.get_mut(..len)?;
        let (head, rest) = buf.split_at_mut(h);
        let payload_out = &mut rest[..payload_len];
        let lent = match fill(payload_out) {
            Err(e) => return Some(Err(e)),
            Ok(Payload::Written | Payload::InPlace) => None,
            Ok(Payload::Lent(bytes)) if bytes.len() == payload_len => Some(bytes),
            Ok(Payload::Lent(_)) => return None,
        };
        head.copy_from_slice(&self.header[..h]);
        // BTH byte 8: AckReq and 7 reserved bits; bytes 9-11: the PSN (IBTA §9.2).
        let bth_at = self.tx.transport_offset;
        head[bth_at + 8] = if ack_req { 0x80 } else { 0 };
        head[bth_at + 9..bth_at + 12].copy_from_slice(&psn.value().to_be_bytes()[1..]);
        let v1 = self.tx.gid_type == GidType::RoceV1;
        let net_len = if v1 { bth_at } else { bth_at - udp::HEADER_LEN };
        let crc = match (seal, lent) {
            (false, Some(bytes)) => {
                payload_copy::copy(payload_out, bytes);
                0
            }
            (false, None) => 0,
            (true, Some(bytes)) if v1 => {
                let (grh, bth_bytes) = head.split_at(net_len);
                icrc::v1_copying_payload(grh, bth_bytes, bytes, payload_out)
            }
            (true, Some(bytes)) => {
                let (net, udp_and_bth) = head.split_at(net_len);
                let (udp_hdr, bth_bytes) = udp_and_bth.split_at(udp::HEADER_LEN);
                icrc::v2_copying_payload(net, udp_hdr, bth_bytes, bytes, payload_out)
            }
            (true, None) if v1 => {
                let (grh, transport) = buf.split_at(net_len);
                icrc::v1(grh, &transport[..transport.len() - crate::wire::ICRC_LEN])
            }
            (true, None) => {
                let (net, rest) = buf.split_at(net_len);
                let (udp_hdr, transport) = rest.split_at(udp::HEADER_LEN);
                let body = &transport[..transport.len() - crate::wire::ICRC_LEN];
                if net_len == ipv4::HEADER_LEN {
                    icrc::v2_ipv4(net, udp_hdr, body)
                } else {
                    icrc::v2_ipv6(net, udp_hdr, body)
                }
            }
        };
        buf[len - crate::wire::ICRC_LEN..].copy_from_slice(&crc.to_le_bytes());
        Some(Ok(()))
    }

    /// What each packet built from these headers is: see [`Transmit`]. (Read from here
    /// when returned, rather than carried through the emit path: the copy stalled on store
    /// forwarding in the profile.)
    pub(crate) fn transmit(&self) -> Transmit {
        self.tx
    }
}

/// Writes the packet of `t` along `route` into `buf`, letting `fill` provide the payload (read from registered
/// memory straight into the frame, or lent). Returns None when `buf` is too short or the
/// repr is inconsistent, `Some(Err)` when `fill` failed. The UDP checksum is 0, as rxe sends
/// it; the length fields are computed here. Without `seal` the ICRC field is left zero: the
/// daemon seals each packet once for the headers its socket writes (`EngineConfig::seal_icrc`).
#[inline(always)]
pub(crate) fn emit<'a, E>(
    route: &Route,
    t: &TransportRepr,
    buf: &mut [u8],
    seal: bool,
    fill: impl FnOnce(&mut [u8]) -> Result<Payload<'a>, E>,
) -> Option<Result<Transmit, E>> {
    let l = layout_of(t.bth.opcode)?;
    if !check(t, l) {
        return None;
    }
    let net_len = route.net.header_len();
    let transport_at = route.headers_len();
    let transport_len = transport_len(t)?;
    let len = transport_at + transport_len;
    if buf.len() < len {
        return None;
    }
    let buf = &mut buf[..len];
    let payload_at = transport_at + l.header_len;
    let lent = match fill(&mut buf[payload_at..payload_at + t.payload_len]) {
        Err(e) => return Some(Err(e)),
        Ok(Payload::Written | Payload::InPlace) => None,
        Ok(Payload::Lent(bytes)) if bytes.len() == t.payload_len => Some(bytes),
        Ok(Payload::Lent(_)) => return None,
    };
    let (net, rest) = buf.split_at_mut(net_len);
    let (src, dst) = (route.net.src_addr(), route.net.dst_addr());
    let gid_type = match route.net {
        NetRepr::Ipv4(ip) => {
            emit_ipv4(&ip, (len) as u16, net);
            GidType::RoceV2
        }
        NetRepr::Ipv6(mut ip) => {
            ip.payload_len = udp::HEADER_LEN + transport_len;
            ip.emit(net);
            GidType::RoceV2
        }
        NetRepr::Grh(mut grh) => {
            // PayLen: everything after the GRH, ICRC included (roce-rxe-facts.md §1.1).
            grh.payload_len = transport_len;
            grh.emit(net);
            GidType::RoceV1
        }
    };
    let (udp_hdr, transport) = rest.split_at_mut(transport_at - net_len);
    let src_port = if gid_type == GidType::RoceV2 {
        let u = UdpRepr {
            src_port: route.src_port,
            dst_port: ROCE_V2_PORT,
            checksum: 0,
            payload_len: transport_len,
        };
        u.emit(udp_hdr);
        u.src_port
    } else {
        0
    };
    emit_headers(t, l, transport);
    let pad_at = l.header_len + t.payload_len;
    let covered = transport_len - crate::wire::ICRC_LEN;
    let (body, trailer) = transport.split_at_mut(covered);
    if !seal {
        let out = &mut body[l.header_len..];
        if let Some(payload) = lent {
            payload_copy::copy(&mut out[..payload.len()], payload);
        }
        out[t.payload_len..].fill(0);
        trailer.fill(0);
        return Some(Ok(Transmit {
            len,
            src,
            dst,
            src_port,
            transport_offset: transport_at,
            gid_type,
        }));
    }
    let crc = match (lent, route.net) {
        (Some(payload), NetRepr::Grh(_)) => {
            let (headers, out) = body.split_at_mut(l.header_len);
            icrc::v1_copying_payload(net, headers, payload, out)
        }
        (Some(payload), _) => {
            // Copy and hash in one pass; it writes the pad too.
            let (headers, out) = body.split_at_mut(l.header_len);
            icrc::v2_copying_payload(net, udp_hdr, headers, payload, out)
        }
        (None, NetRepr::Grh(_)) => {
            body[pad_at..].fill(0);
            icrc::v1(net, body)
        }
        (None, NetRepr::Ipv4(_)) => {
            body[pad_at..].fill(0);
            icrc::v2_ipv4(net, udp_hdr, body)
        }
        (None, _) => {
            body[pad_at..].fill(0);
            icrc::v2_ipv6(net, udp_hdr, body)
        }
    };
    trailer.copy_from_slice(&crc.to_le_bytes());
    Some(Ok(Transmit {
        len,
        src,
        dst,
        src_port,
        transport_offset: transport_at,
        gid_type,
    }))
}

/// `Ipv4Repr::emit` for a packet `total_len` bytes long, with the checksum summed from the
/// field values rather than read back from the bytes just written (a store-forwarding
/// stall in the profile).
fn emit_ipv4(ip: &crate::wire::Ipv4Repr, total_len: u16, b: &mut [u8]) {
    let flags: u16 = if ip.dont_frag { 0x4000 } else { 0 };
    let (src, dst) = (u32::from(ip.src), u32::from(ip.dst));
    let words = [
        0x4500 | u16::from(ip.tos),
        total_len,
        ip.ident,
        flags,
        (u16::from(ip.ttl) << 8) | u16::from(ip.protocol),
        (src >> 16) as u16,
        src as u16,
        (dst >> 16) as u16,
        dst as u16,
    ];
    let mut sum: u32 = words.iter().map(|&w| u32::from(w)).sum();
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    let checksum = !(sum as u16);
    let b = &mut b[..ipv4::HEADER_LEN];
    b[0..2].copy_from_slice(&words[0].to_be_bytes());
    b[2..4].copy_from_slice(&total_len.to_be_bytes());
    b[4..6].copy_from_slice(&ip.ident.to_be_bytes());
    b[6..8].copy_from_slice(&flags.to_be_bytes());
    b[8] = ip.ttl;
    b[9] = ip.protocol;
    b[10..12].copy_from_slice(&checksum.to_be_bytes());
    b[12..16].copy_from_slice(&ip.src.octets());
    b[16..20].copy_from_slice(&ip.dst.octets());
}

/// Parses a whole IPv4 RoCE v2 packet whose ICRC is right (or, without `check_icrc`, whose
/// ICRC the caller has already verified), or returns None (then the wire parser decides; see
/// the module documentation).
#[inline]
pub(crate) fn parse_ipv4(packet: &[u8], check_icrc: bool) -> Option<RxPacket<'_>> {
    let icrc = if check_icrc {
        IcrcCheck::Now
    } else {
        IcrcCheck::Skip
    };
    parse_ipv4_with(packet, icrc).map(|(rx, _)| rx)
}

/// What [`parse_ipv4_with`] does with the ICRC.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum IcrcCheck {
    /// Verify it before returning.
    Now,
    /// The caller already did.
    Skip,
    /// Verify it now, except for an RC RDMA WRITE MIDDLE or LAST packet: for those return a
    /// [`PendingIcrc`], so that the responder can verify it by the same pass that copies the
    /// payload into memory (see [`PendingIcrc`]).
    DeferPlacement,
}

/// The ICRC of a received packet not verified yet: the responder checks it while it copies
/// the payload into the target memory ([`PendingIcrc::copy_out`]), or before it does anything
/// else with the packet ([`PendingIcrc::verify`]).
///
/// Placing the payload before the ICRC is known to be good is safe only where the target
/// range does not come from the packet: a WRITE's MIDDLE and LAST packets land at the offset
/// the responder keeps for the message in progress, after the checks that the packet is the
/// expected PSN and exactly as long as that message allows (a MIDDLE one MTU, a LAST the
/// rest). A corrupt one is then dropped like any other corrupt packet: nothing advances, and
/// the requester's retransmission of that PSN overwrites exactly the same bytes. The target
/// of a WRITE that has not completed holds no defined contents yet, so nobody can tell; RNICs
/// that place data cut-through behave the same way.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PendingIcrc<'a> {
    net: &'a [u8],
    udp: &'a [u8],
    /// BTH through pad: what the ICRC covers after the UDP header.
    body: &'a [u8],
    header_len: usize,
    carried: u32,
}

impl PendingIcrc<'_> {
    /// Whether the ICRC is right.
    pub(crate) fn verify(&self) -> bool {
        icrc::v2_ipv4(self.net, self.udp, self.body) == self.carried
    }

    /// Copies the payload (the first `dst.len()` bytes after the headers) to `dst` while
    /// computing the ICRC; returns whether it is right. On false `dst` holds the corrupt
    /// bytes (see the type's documentation).
    pub(crate) fn copy_out(&self, dst: &mut [u8]) -> bool {
        let (headers, rest) = self.body.split_at(self.header_len);
        icrc::v2_copying_out(self.net, self.udp, headers, rest, dst) == self.carried
    }
}

/// An IPv4 RoCE v2 packet cut at its headers: the IP view, the IP header, the UDP header,
/// the transport (BTH through ICRC).
type Ipv4UdpParts<'a> = (Ipv4Packet<&'a [u8]>, &'a [u8], &'a [u8], &'a [u8]);

/// The checks of an IPv4 RoCE v2 packet up to its transport: version 4, no options, exactly
/// this long, not a fragment, UDP to port 4791 of the right length, a valid header
/// checksum, room for a BTH and an ICRC. Returns the IP view, the IP and UDP headers and the
/// transport (BTH through ICRC).
#[inline(always)]
fn ipv4_udp(packet: &[u8]) -> Option<Ipv4UdpParts<'_>> {
    let total = packet.len();
    if total < ipv4::HEADER_LEN + udp::HEADER_LEN + bth::HEADER_LEN + crate::wire::ICRC_LEN {
        return None;
    }
    let p = Ipv4Packet::new_unchecked(packet);
    if packet[0] != 0x45
        || p.total_len() as usize != total
        || p.is_fragment()
        || p.protocol() != ipv4::PROTOCOL_UDP
        || !p.verify_checksum()
    {
        return None;
    }
    let (net, rest) = packet.split_at(ipv4::HEADER_LEN);
    let (udp_hdr, transport) = rest.split_at(udp::HEADER_LEN);
    let udp_len = u16::from_be_bytes([udp_hdr[4], udp_hdr[5]]) as usize;
    if u16::from_be_bytes([udp_hdr[2], udp_hdr[3]]) != ROCE_V2_PORT || udp_len != rest.len() {
        return None;
    }
    Some((p, net, udp_hdr, transport))
}

/// An RC RDMA WRITE MIDDLE packet over IPv4, parsed only as far as the responder's
/// predicted path needs (`responder::on_predicted_write_middle`): the packet that, while a
/// long WRITE streams in, nearly every packet is. Its ICRC is not verified yet.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WriteMiddle<'a> {
    pub dest_qpn: crate::types::Qpn,
    pub psn: crate::types::Psn,
    pub ack_req: bool,
    pub src: std::net::Ipv4Addr,
    pub dst: std::net::Ipv4Addr,
    pub ecn_ce: bool,
    pub payload_len: usize,
    pub wire_len: usize,
    pub icrc: PendingIcrc<'a>,
}

/// Parses `packet` as a well-formed IPv4 RC RDMA WRITE MIDDLE with the default P_Key and no
/// pad, or returns None (then the general path judges it).
#[inline(always)]
pub(crate) fn parse_write_middle(packet: &[u8]) -> Option<WriteMiddle<'_>> {
    if packet.get(ipv4::HEADER_LEN + udp::HEADER_LEN) != Some(&Opcode::RC_RDMA_WRITE_MIDDLE.0) {
        return None;
    }
    let (p, net, udp_hdr, transport) = ipv4_udp(packet)?;
    let b = Bth::new_unchecked(transport);
    let covered = transport.len() - crate::wire::ICRC_LEN;
    let payload_len = covered - bth::HEADER_LEN;
    if b.tver() != 0
        || b.pad_count() != 0
        || b.pkey() & 0x7fff != 0x7fff
        || !payload_len.is_multiple_of(4)
    {
        return None;
    }
    let (body, trailer) = transport.split_at(covered);
    Some(WriteMiddle {
        dest_qpn: b.dest_qpn(),
        psn: b.psn(),
        ack_req: b.ack_req(),
        src: p.src_addr(),
        dst: p.dst_addr(),
        ecn_ce: p.tos() & 3 == 3,
        payload_len,
        wire_len: packet.len(),
        icrc: PendingIcrc {
            net,
            udp: udp_hdr,
            body,
            header_len: bth::HEADER_LEN,
            carried: u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]),
        },
    })
}

/// [`parse_ipv4`], with the ICRC handled as `icrc` says.
#[inline(always)]
pub(crate) fn parse_ipv4_with(
    packet: &[u8],
    icrc: IcrcCheck,
) -> Option<(RxPacket<'_>, Option<PendingIcrc<'_>>)> {
    let total = packet.len();
    let (p, net, udp_hdr, transport) = ipv4_udp(packet)?;
    // The transport's lengths, as `wire::packet::Layout::compute` checks them.
    let b = Bth::new_unchecked(transport);
    let l = layout_of(b.opcode())?;
    let available = transport
        .len()
        .checked_sub(l.header_len + crate::wire::ICRC_LEN)?;
    let pad = b.pad_count() as usize;
    let payload_len = available.checked_sub(pad)?;
    let lengths_ok = if l.info.has(OpInfo::ATOMIC_WRITE) {
        payload_len == 8 && pad == 0
    } else if l.info.has(OpInfo::PAYLOAD) {
        available.is_multiple_of(4)
    } else {
        available == 0
    };
    if !lengths_ok {
        return None;
    }
    let covered = transport.len() - crate::wire::ICRC_LEN;
    let (body, trailer) = transport.split_at(covered);
    let carried = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
    let defer = icrc == IcrcCheck::DeferPlacement
        && matches!(
            b.opcode(),
            Opcode::RC_RDMA_WRITE_MIDDLE | Opcode::RC_RDMA_WRITE_LAST
        );
    let pending = if defer {
        Some(PendingIcrc {
            net,
            udp: udp_hdr,
            body,
            header_len: l.header_len,
            carried,
        })
    } else {
        if icrc != IcrcCheck::Skip && icrc::v2_ipv4(net, udp_hdr, body) != carried {
            return None;
        }
        None
    };
    // Built in place: the repr is large, and copies of it showed in the profile.
    let rx = RxPacket {
        t: parse_headers(transport, l, payload_len)?,
        payload: &transport[l.header_len..l.header_len + payload_len],
        src: IpAddr::V4(p.src_addr()),
        dst: IpAddr::V4(p.dst_addr()),
        ecn_ce: p.tos() & 3 == 3,
        net_header: net,
        wire_len: total,
        v1: false,
    };
    Some((rx, pending))
}

/// `TransportRepr::parse_headers` by the table.
#[inline(always)]
fn parse_headers(head: &[u8], l: &OpLayout, payload_len: usize) -> Option<TransportRepr> {
    // `BthRepr::parse`, here so that the repr is built in place (returned through a
    // `Result`, it was read back before its bytes were stored: a stall in the profile).
    let b = Bth::new_unchecked(head);
    if b.tver() != 0 {
        return None;
    }
    let bth = BthRepr {
        opcode: b.opcode(),
        solicited: b.solicited(),
        mig_req: b.mig_req(),
        pkey: b.pkey(),
        fecn: b.fecn(),
        becn: b.becn(),
        dest_qpn: b.dest_qpn(),
        ack_req: b.ack_req(),
        psn: b.psn(),
    };
    let ext = &head[bth::HEADER_LEN..l.header_len];
    let at = |i: usize| l.at(i).map(|o| &ext[o..]);
    Some(TransportRepr {
        bth,
        deth: at(DETH).map(DethRepr::parse).transpose().ok()?,
        feth: at(FETH).map(FethRepr::parse).transpose().ok()?,
        reth: at(RETH).map(RethRepr::parse).transpose().ok()?,
        atomic_eth: at(ATOMIC_ETH).map(AtomicEthRepr::parse).transpose().ok()?,
        aeth: at(AETH).map(AethRepr::parse).transpose().ok()?,
        atomic_ack_eth: at(ATOMIC_ACK_ETH)
            .map(AtomicAckEthRepr::parse)
            .transpose()
            .ok()?,
        imm: at(IMM).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]])),
        ieth: at(IETH).map(|b| Rkey(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))),
        payload_len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Psn, Qkey, Qpn};
    use crate::wire::{AethSyndrome, FrameRepr, Ipv4Repr, Ipv6Repr, LinkRepr};

    fn route(f: &FrameRepr) -> Route {
        Route {
            net: f.net,
            src_port: f.udp.map_or(0, |u| u.src_port),
        }
    }

    /// A repr for `opcode` with every header it calls for, fields varied by `seed`.
    fn repr(opcode: Opcode, seed: u32, payload_len: usize) -> TransportRepr {
        let info = opcode.info().unwrap();
        let has = |h| info.headers.contains(h);
        let mut t = TransportRepr::new(BthRepr {
            opcode,
            solicited: seed & 1 != 0,
            mig_req: seed & 2 != 0,
            pkey: 0xffff,
            fecn: false,
            becn: seed & 4 != 0,
            dest_qpn: Qpn::new(0x12345 ^ seed),
            ack_req: seed & 8 != 0,
            psn: Psn::new(0xabcde ^ seed),
        });
        let s = u64::from(seed);
        t.deth = has(HeaderSet::DETH).then_some(DethRepr {
            qkey: Qkey(seed ^ 0x1111),
            src_qpn: Qpn::new(seed & 0xffff),
        });
        t.feth = has(HeaderSet::FETH).then_some(FethRepr {
            selectivity: (seed & 3) as u8,
            placement: (seed & 0xf) as u8,
        });
        t.reth = has(HeaderSet::RETH).then_some(RethRepr {
            va: s * 0x1_0001_0001,
            rkey: Rkey(seed ^ 0x55aa),
            len: seed * 3,
        });
        t.atomic_eth = has(HeaderSet::ATOMIC_ETH).then_some(AtomicEthRepr {
            va: s << 3,
            rkey: Rkey(seed),
            swap_add: !s,
            compare: s * 7,
        });
        t.aeth = has(HeaderSet::AETH).then_some(AethRepr {
            syndrome: AethSyndrome::ACK,
            msn: seed & 0xff_ffff,
        });
        t.atomic_ack_eth = has(HeaderSet::ATOMIC_ACK_ETH).then_some(AtomicAckEthRepr { orig: s });
        t.imm = has(HeaderSet::IMM).then_some(seed ^ 0xdead_beef);
        t.ieth = has(HeaderSet::IETH).then_some(Rkey(seed ^ 0x77));
        t.payload_len = if info.has(OpInfo::ATOMIC_WRITE) {
            8
        } else if info.has(OpInfo::PAYLOAD) {
            payload_len
        } else {
            0
        };
        t
    }

    /// The framings: RoCE v2 over IPv4, over IPv6, and RoCE v1.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Net {
        V4,
        V6,
        V1,
    }

    fn frame(t: TransportRepr, v6: bool) -> FrameRepr {
        frame_of(t, if v6 { Net::V6 } else { Net::V4 })
    }

    fn frame_of(t: TransportRepr, kind: Net) -> FrameRepr {
        let net = if kind == Net::V1 {
            NetRepr::Grh(Ipv6Repr {
                src: "::ffff:10.0.0.1".parse().unwrap(),
                dst: "fe80::2".parse().unwrap(),
                traffic_class: 2,
                flow_label: 0x12345,
                next_header: crate::wire::GRH_NEXT_HEADER_IBA,
                hop_limit: 64,
                payload_len: 0,
            })
        } else if kind == Net::V6 {
            NetRepr::Ipv6(Ipv6Repr {
                src: "fe80::1".parse().unwrap(),
                dst: "fe80::2".parse().unwrap(),
                traffic_class: 2,
                flow_label: 0,
                next_header: 17,
                hop_limit: 64,
                payload_len: 0,
            })
        } else {
            NetRepr::Ipv4(Ipv4Repr {
                src: "10.0.0.1".parse().unwrap(),
                dst: "10.0.0.2".parse().unwrap(),
                tos: 2,
                ident: 0,
                dont_frag: true,
                ttl: 64,
                protocol: 17,
                payload_len: 0,
            })
        };
        let mut f = FrameRepr {
            link: LinkRepr::None,
            net,
            udp: (kind != Net::V1).then_some(UdpRepr {
                src_port: 0xc000,
                dst_port: ROCE_V2_PORT,
                checksum: 0,
                payload_len: 0,
            }),
            transport: t,
        };
        f.fill_lengths();
        f
    }

    fn payload(n: usize, seed: u32) -> Vec<u8> {
        (0..n).map(|i| (i as u32 * 13 + seed) as u8).collect()
    }

    #[test]
    fn emit_writes_what_the_wire_layer_writes_for_every_opcode() {
        let mut checked = 0;
        for code in 0..=255u8 {
            let Some(info) = Opcode(code).info() else {
                continue;
            };
            if info.has(OpInfo::CNP) && code != 0x81 {
                continue;
            }
            for (seed, plen) in [(0u32, 0usize), (5, 1), (11, 7), (15, 256), (3, 1021)] {
                for kind in [Net::V4, Net::V6, Net::V1] {
                    let f = frame_of(repr(Opcode(code), seed, plen), kind);
                    let data = payload(f.transport.payload_len, seed);
                    let mut want = vec![0xeeu8; 1200];
                    f.emit(&mut want, &data).unwrap();
                    let mut got = vec![0x11u8; 1200];
                    let tx = emit(&route(&f), &f.transport, &mut got, true, |out| {
                        out.copy_from_slice(&data);
                        Ok::<_, ()>(Payload::Written)
                    })
                    .unwrap()
                    .unwrap();
                    // Lending the payload instead writes the same bytes.
                    let mut lent = vec![0x22u8; 1200];
                    let tx2 = emit(&route(&f), &f.transport, &mut lent, true, |_| {
                        Ok::<_, ()>(Payload::Lent(&data))
                    })
                    .unwrap()
                    .unwrap();
                    assert_eq!(tx2, tx);
                    assert_eq!(&lent[..tx.len], &want[..tx.len], "lent, opcode {code:#x}");
                    assert_eq!(tx.len, f.buffer_len(), "opcode {code:#x}");
                    assert_eq!(frame_len(&route(&f), &f.transport), Some(f.buffer_len()));
                    assert_eq!(&got[..tx.len], &want[..tx.len], "opcode {code:#x} {kind:?}");
                    let udp_len = if kind == Net::V1 { 0 } else { 8 };
                    assert_eq!(tx.transport_offset, f.net.header_len() + udp_len);
                    let gid_type = if kind == Net::V1 {
                        GidType::RoceV1
                    } else {
                        GidType::RoceV2
                    };
                    assert_eq!(tx.gid_type, gid_type);
                    // What was written parses as the same packet, with a good ICRC.
                    let back = FrameRepr::parse_network(&got[..tx.len], tx.len).unwrap();
                    assert_eq!(back.repr.net.is_v1(), kind == Net::V1);
                    back.verified().unwrap();
                    checked += 1;
                }
            }
        }
        assert!(checked > 200);
    }

    #[test]
    fn ipv4_header_matches_the_wire_layer() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..2000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let ip = Ipv4Repr {
                src: std::net::Ipv4Addr::from(seed as u32),
                dst: std::net::Ipv4Addr::from((seed >> 32) as u32),
                tos: (seed >> 8) as u8,
                ident: (seed >> 20) as u16,
                dont_frag: seed & 1 == 0,
                ttl: (seed >> 40) as u8,
                protocol: 17,
                payload_len: (seed >> 48) as usize % 9000,
            };
            let mut want = [0u8; 20];
            ip.emit(&mut want);
            let mut got = [0u8; 20];
            emit_ipv4(&ip, (20 + ip.payload_len) as u16, &mut got);
            assert_eq!(got, want);
        }
    }

    #[test]
    fn emit_refuses_an_inconsistent_repr_and_a_short_buffer() {
        let mut t = repr(Opcode::RC_RDMA_WRITE_FIRST, 1, 256);
        t.reth = None;
        let mut buf = vec![0u8; 2000];
        let fill = |_: &mut [u8]| Ok::<_, ()>(Payload::Written);
        let f = frame(repr(Opcode::RC_RDMA_WRITE_FIRST, 1, 256), false);
        let r = route(&f);
        assert!(emit(&r, &t, &mut buf, true, fill).is_none());
        assert!(emit(&r, &f.transport, &mut buf[..f.buffer_len() - 1], true, fill).is_none());
        assert_eq!(
            emit(&r, &f.transport, &mut buf, true, |_| Err(7)),
            Some(Err(7))
        );
        // A lent payload of the wrong length is refused.
        let short = [0u8; 255];
        let lend = |_: &mut [u8]| Ok::<_, ()>(Payload::Lent(&short));
        assert!(emit(&r, &f.transport, &mut buf, true, lend).is_none());
    }

    #[test]
    fn a_payload_left_in_place_is_not_written_and_the_headers_are() {
        let f = frame(repr(Opcode::RC_RDMA_WRITE_FIRST, 1, 256), false);
        let r = route(&f);
        let mut buf = vec![0xeeu8; 2000];
        let n = emit(&r, &f.transport, &mut buf, false, |_| {
            Ok::<_, ()>(Payload::InPlace)
        })
        .unwrap()
        .unwrap()
        .len;
        let mut want = vec![0u8; 2000];
        emit(&r, &f.transport, &mut want, false, |out| {
            out.fill(0xee);
            Ok::<_, ()>(Payload::Written)
        })
        .unwrap()
        .unwrap();
        assert_eq!(
            &buf[..n],
            &want[..n],
            "headers as usual, payload bytes untouched"
        );
        let rx = parse_ipv4(&buf[..n], false).unwrap();
        assert_eq!(rx.payload.len(), 256);
        assert!(rx.payload.iter().all(|&b| b == 0xee));
    }

    #[test]
    fn parse_never_panics_on_garbage() {
        let mut rng = 0x0123_4567_89ab_cdefu64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for _ in 0..20_000 {
            let len = (next() % 200) as usize;
            let mut v: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            // Often a plausible start, so that the checks further in are reached too.
            if len >= 20 && next() % 2 == 0 {
                v[0] = 0x45;
                v[2..4].copy_from_slice(&(len as u16).to_be_bytes());
                v[6] = 0;
                v[7] = 0;
                v[9] = 17;
            }
            let _ = parse_ipv4(&v, true);
        }
    }

    #[test]
    fn parse_accepts_only_what_the_wire_parser_accepts_and_agrees_on_it() {
        let mut accepted = 0;
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for code in 0..=255u8 {
            if Opcode(code).info().is_none() {
                continue;
            }
            for (seed, plen) in [(2u32, 0usize), (9, 3), (12, 64), (1, 1024)] {
                let f = frame(repr(Opcode(code), seed, plen), false);
                let data = payload(f.transport.payload_len, seed);
                let mut pkt = vec![0u8; f.buffer_len()];
                f.emit(&mut pkt, &data).unwrap();
                // The packet itself, then mutations of it: bit flips anywhere, truncation,
                // extension.
                let mut variants = vec![pkt.clone()];
                for _ in 0..12 {
                    let mut m = pkt.clone();
                    let bit = (next() as usize) % (m.len() * 8);
                    m[bit / 8] ^= 1 << (bit % 8);
                    variants.push(m);
                }
                variants.push(pkt[..pkt.len() - 4].to_vec());
                let mut longer = pkt.clone();
                longer.extend_from_slice(&[0; 4]);
                variants.push(longer);
                for v in &variants {
                    let wire = FrameRepr::parse_ip(v, v.len())
                        .ok()
                        .filter(|p| p.verified().is_ok());
                    match parse_ipv4(v, true) {
                        Some(fast) => {
                            let wire = wire.expect("the fast path accepted a refused packet");
                            assert_eq!(fast.t, wire.repr.transport, "opcode {code:#x}");
                            assert_eq!(fast.payload, wire.payload);
                            let NetRepr::Ipv4(ip) = wire.repr.net else {
                                panic!("not IPv4")
                            };
                            assert_eq!(fast.src, IpAddr::V4(ip.src));
                            assert_eq!(fast.dst, IpAddr::V4(ip.dst));
                            assert_eq!(fast.ecn_ce, ip.tos & 3 == 3);
                            assert_eq!(fast.net_header, &v[..20]);
                            assert_eq!(fast.wire_len, v.len());
                            accepted += 1;
                        }
                        None => {
                            // Unmodified, well-formed packets must take the fast path.
                            assert!(
                                v != &pkt || wire.is_none() || Opcode(code).info().is_none(),
                                "opcode {code:#x} fell back"
                            );
                        }
                    }
                }
            }
        }
        assert!(accepted > 100);
    }
}
