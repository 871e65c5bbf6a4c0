//! Helpers shared by the `net_*` tests: RoCE packets with recognisable contents, and a
//! receive loop with a hang guard (not a timing assertion).
#![allow(dead_code)]

use proto::wire::{BthRepr, Opcode, RocePacket, TransportRepr};
use proto::{Psn, Qpn};
use softroce_daemon::net::{NetConfig, PacketBuilder, RxDatagram, UdpTransport};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

pub const LO4: Ipv4Addr = Ipv4Addr::LOCALHOST;
pub const LO6: Ipv6Addr = Ipv6Addr::LOCALHOST;

/// A loopback config on ephemeral ports (never the real 4791 of a running daemon).
pub fn cfg() -> NetConfig {
    NetConfig {
        ipv4: Some(LO4),
        ipv6: Some(LO6),
        port: 0,
        ..NetConfig::default()
    }
}

pub fn repr(opcode: Opcode, psn: u32, payload_len: usize) -> TransportRepr {
    let mut t = TransportRepr::new(BthRepr {
        opcode,
        solicited: false,
        mig_req: false,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qpn: Qpn::new(0x11),
        ack_req: false,
        psn: Psn::new(psn),
    });
    t.payload_len = payload_len;
    t
}

pub fn payload(psn: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (psn as usize * 31 + i * 7) as u8)
        .collect()
}

/// A SEND_ONLY of `len` payload bytes (or SEND_MIDDLE when `middle`), its PSN naming it.
pub fn build(b: &PacketBuilder, ident: u16, psn: u32, len: usize, middle: bool) -> Vec<u8> {
    let op = if middle {
        Opcode(0x01)
    } else {
        Opcode::RC_SEND_ONLY
    };
    let r = repr(op, psn, len);
    let mut out = vec![0u8; r.buffer_len()];
    let n = b.emit(ident, &r, &payload(psn, len), &mut out).unwrap();
    assert_eq!(n, out.len());
    out
}

pub fn psn_of(bytes: &[u8]) -> u32 {
    RocePacket::new_checked(bytes).unwrap().bth().psn().value()
}

/// A builder for packets from `from`'s socket of the family of `to`.
pub fn builder(from: SocketAddr, to: SocketAddr) -> PacketBuilder {
    let mut b = PacketBuilder::new(from.ip(), to.ip(), from.port());
    b.dst_port = to.port();
    b
}

/// An owned copy of what the callback saw.
#[derive(Debug, Clone)]
pub struct Got {
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub tos: u8,
    pub bytes: Vec<u8>,
    pub ident: Option<u16>,
    /// The free bytes in front of the datagram in the driver's buffer (where a link
    /// rebuilds the IP and UDP headers instead of copying the datagram).
    pub room: usize,
}

/// Polls `t` until `want` datagrams arrived, or until 10 s pass without progress (a hang
/// guard: the test then fails on the count, not on time).
pub fn recv_n(t: &mut UdpTransport, want: usize) -> Vec<Got> {
    let mut got = Vec::new();
    let mut idle = 0;
    while got.len() < want && idle < 200 {
        let n = t
            .poll(
                Some(Duration::from_millis(50)),
                &mut |d: &mut RxDatagram<'_>| {
                    got.push(Got {
                        src: d.src,
                        dst: d.dst,
                        tos: d.tos,
                        bytes: d.bytes().to_vec(),
                        ident: d.ipv4.map(|i| i.ident),
                        room: d.room(),
                    })
                },
            )
            .unwrap();
        idle = if n == 0 { idle + 1 } else { 0 };
    }
    got
}

/// Polls `t` briefly for datagrams that should not come, to let the kernel deliver them.
pub fn settle(t: &mut UdpTransport) -> usize {
    let mut n = 0;
    for _ in 0..5 {
        n += t
            .poll(
                Some(Duration::from_millis(20)),
                &mut |_: &mut RxDatagram<'_>| {},
            )
            .unwrap();
    }
    n
}

pub fn local(t: &UdpTransport, ip: IpAddr) -> SocketAddr {
    if ip.is_ipv4() {
        t.local_addr_v4().unwrap()
    } else {
        t.local_addr_v6().unwrap()
    }
}
