//! Packets built the way kernel rxe sends them — non-zero, varying IPv4 Identification,
//! DF set — are injected with a raw IP_HDRINCL socket on loopback; the transport must verify
//! them through Identification recovery. Needs CAP_NET_RAW (root, as `scripts/test`
//! runs): without it the test fails, it never passes without running.

mod net_util;

use net_util::*;
use proto::wire::{
    icrc, ipv4, FrameRepr, Ipv4Repr, LinkRepr, NetRepr, Opcode, RocePacket, UdpRepr,
};
use softroce_daemon::net::{BackendChoice, NetConfig, UdpTransport};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A raw socket that sends whole IPv4 packets (IPPROTO_RAW implies IP_HDRINCL).
fn raw_socket() -> Result<OwnedFd, std::io::Error> {
    // SAFETY: plain syscall; the descriptor is owned right away.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn send_raw(fd: &OwnedFd, packet: &[u8], dst: Ipv4Addr) {
    // SAFETY: sockaddr_in is plain old data; zero is valid.
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    sa.sin_family = libc::AF_INET as libc::sa_family_t;
    sa.sin_addr.s_addr = u32::from_ne_bytes(dst.octets());
    // SAFETY: the packet and address outlive the call; lengths are theirs.
    let n = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            packet.as_ptr().cast(),
            packet.len(),
            0,
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    assert_eq!(
        n,
        packet.len() as isize,
        "{}",
        std::io::Error::last_os_error()
    );
}

/// A whole IPv4 RoCE packet as rxe would put it on the wire.
fn rxe_frame(src: SocketAddrV4, dst: SocketAddrV4, ident: u16, df: bool, psn: u32) -> Vec<u8> {
    let len = 256 + (psn as usize % 3);
    let mut frame = FrameRepr {
        link: LinkRepr::None,
        net: NetRepr::Ipv4(Ipv4Repr {
            src: *src.ip(),
            dst: *dst.ip(),
            tos: 0,
            ident,
            dont_frag: df,
            ttl: 1,
            protocol: ipv4::PROTOCOL_UDP,
            payload_len: 0,
        }),
        udp: Some(UdpRepr {
            src_port: src.port(),
            dst_port: dst.port(),
            checksum: 0,
            payload_len: 0,
        }),
        transport: repr(Opcode::RC_SEND_ONLY, psn, len),
    };
    frame.fill_lengths();
    let mut out = vec![0u8; frame.buffer_len()];
    frame.emit(&mut out, &payload(psn, len)).unwrap();
    // The ICRC is right for the whole frame, Identification included.
    let n = out.len();
    let carried = u32::from_le_bytes(out[n - 4..].try_into().unwrap());
    assert_eq!(
        icrc::v2_ipv4(&out[..20], &out[20..28], &out[28..n - 4]),
        carried
    );
    out
}

#[test]
fn rxe_style_nonzero_idents_are_recovered() {
    let raw = raw_socket().unwrap_or_else(|e| {
        panic!("precondition missing: a raw IPv4 socket needs CAP_NET_RAW (root): {e}")
    });
    for backend in [BackendChoice::IoUring, BackendChoice::Syscalls] {
        let mut b = UdpTransport::open(&NetConfig {
            ipv6: None,
            backend,
            ..cfg()
        })
        .unwrap();
        let SocketAddr::V4(dst) = b.local_addr_v4().unwrap() else {
            unreachable!()
        };
        // A source on another loopback address and port, as a remote rxe would be.
        let src = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 1), 0xc132);
        let idents: Vec<u16> = (0..40u16)
            .map(|i| 0x1234u16.wrapping_add(i * 977))
            .collect();
        let mut sent = Vec::new();
        for (psn, &ident) in idents.iter().enumerate() {
            let f = rxe_frame(src, dst, ident, true, psn as u32);
            send_raw(&raw, &f, *dst.ip());
            sent.push(f);
        }
        // DF clear is tried as a fallback.
        let f = rxe_frame(src, dst, 0x0bad, false, 100);
        send_raw(&raw, &f, *dst.ip());
        sent.push(f);
        // A corrupted one (a payload bit flipped after the ICRC was computed).
        let mut bad = rxe_frame(src, dst, 0x4242, true, 101);
        let last = bad.len() - 10;
        bad[last] ^= 1;
        send_raw(&raw, &bad, *dst.ip());

        let got = recv_n(&mut b, sent.len());
        assert_eq!(got.len(), sent.len(), "{backend:?}");
        assert_eq!(settle(&mut b), 0);
        for (g, (f, want_ident)) in got
            .iter()
            .zip(sent.iter().zip(idents.iter().copied().chain([0x0bad])))
        {
            assert_eq!(g.src, SocketAddr::V4(src));
            assert_eq!(&g.bytes[..], &f[28..], "the UDP payload as sent");
            RocePacket::new_checked(&g.bytes[..]).unwrap();
            assert_eq!(g.ident, Some(want_ident));
        }
        let c = b.counters();
        assert_eq!(c.rx_packets, sent.len() as u64);
        assert_eq!(c.rx_ident_recovered, sent.len() as u64);
        assert_eq!(c.rx_bad_icrc, 1);
    }
}
