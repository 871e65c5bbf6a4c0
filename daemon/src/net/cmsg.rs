//! Control messages and socket addresses as plain bytes.
//!
//! The kernel's `cmsghdr` and `sockaddr_in{,6}` layouts are fixed by the Linux ABI, so they are
//! encoded and decoded here with safe slice code instead of the `CMSG_*` pointer macros: a
//! malformed or truncated control buffer from the kernel then ends the iteration instead of
//! reading out of bounds.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// `SOL_UDP` options not (or not everywhere) in the `libc` crate (linux/udp.h).
pub const UDP_NO_CHECK6_TX: libc::c_int = 101;
pub const UDP_NO_CHECK6_RX: libc::c_int = 102;
pub const UDP_SEGMENT: libc::c_int = 103;
pub const UDP_GRO: libc::c_int = 104;
/// `SOL_SOCKET` option: send UDP over IPv4 with a zero checksum, as rxe does.
pub const SO_NO_CHECK: libc::c_int = 11;
/// `IPPROTO_IPV6` option: 0 keeps the flow label at 0, as rxe sends it.
pub const IPV6_AUTOFLOWLABEL: libc::c_int = 70;

/// Size of `struct cmsghdr`, and the alignment of every control message.
const HDR_LEN: usize = std::mem::size_of::<libc::cmsghdr>();
const ALIGN: usize = std::mem::size_of::<libc::size_t>();

const fn align(len: usize) -> usize {
    (len + ALIGN - 1) & !(ALIGN - 1)
}

/// `CMSG_SPACE(data_len)`.
pub const fn space(data_len: usize) -> usize {
    align(HDR_LEN) + align(data_len)
}

/// Room for every control message softroce sends or receives on one datagram: packet info
/// (the larger IPv6 form), TOS/traffic class, TTL/hop limit and the GSO/GRO segment size.
pub const CONTROL_LEN: usize = space(20) + space(4) + space(4) + space(4) + space(4);

/// A control buffer with the alignment `cmsghdr` needs.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
pub struct ControlBuf(pub [u8; CONTROL_LEN]);

impl Default for ControlBuf {
    fn default() -> Self {
        ControlBuf([0; CONTROL_LEN])
    }
}

/// Appends control messages to a byte buffer.
pub struct CmsgWriter<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> CmsgWriter<'a> {
    pub fn new(buf: &'a mut [u8]) -> Self {
        CmsgWriter { buf, len: 0 }
    }

    /// Appends one message; returns false (writing nothing) if it does not fit.
    pub fn push(&mut self, level: libc::c_int, ty: libc::c_int, data: &[u8]) -> bool {
        let need = space(data.len());
        let Some(out) = self.buf.get_mut(self.len..self.len + need) else {
            return false;
        };
        out.fill(0);
        let cmsg_len = align(HDR_LEN) + data.len();
        out[..ALIGN].copy_from_slice(&cmsg_len.to_ne_bytes());
        out[ALIGN..ALIGN + 4].copy_from_slice(&level.to_ne_bytes());
        out[ALIGN + 4..ALIGN + 8].copy_from_slice(&ty.to_ne_bytes());
        out[align(HDR_LEN)..align(HDR_LEN) + data.len()].copy_from_slice(data);
        self.len += need;
        true
    }

    pub fn push_int(&mut self, level: libc::c_int, ty: libc::c_int, v: libc::c_int) -> bool {
        self.push(level, ty, &v.to_ne_bytes())
    }

    /// Bytes written: the `msg_controllen` to pass.
    pub fn len(&self) -> usize {
        self.len
    }
}

/// One received control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cmsg<'a> {
    pub level: libc::c_int,
    pub ty: libc::c_int,
    pub data: &'a [u8],
}

/// Iterates over the control messages in `buf`, stopping at the first malformed one.
pub fn iter(buf: &[u8]) -> impl Iterator<Item = Cmsg<'_>> {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        let hdr = buf.get(at..at + HDR_LEN)?;
        let len = usize::from_ne_bytes(hdr[..ALIGN].try_into().ok()?);
        let level = libc::c_int::from_ne_bytes(hdr[ALIGN..ALIGN + 4].try_into().ok()?);
        let ty = libc::c_int::from_ne_bytes(hdr[ALIGN + 4..ALIGN + 8].try_into().ok()?);
        let data_start = at + align(HDR_LEN);
        let data = buf.get(data_start..at.checked_add(len)?)?;
        if len < align(HDR_LEN) {
            return None;
        }
        at += align(len);
        Some(Cmsg { level, ty, data })
    })
}

fn int_of(data: &[u8]) -> Option<i32> {
    Some(i32::from_ne_bytes(data.get(..4)?.try_into().ok()?))
}

/// What softroce reads from the control messages of a received datagram.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RxControl {
    /// The destination address of the IP header (IP_PKTINFO / IPV6_PKTINFO).
    pub dst: Option<IpAddr>,
    /// IPv4 TOS or IPv6 traffic class, ECN bits included.
    pub tos: Option<u8>,
    /// With UDP_GRO: the size of each coalesced datagram but the last.
    pub gro_segment: Option<u16>,
}

impl RxControl {
    pub fn parse(buf: &[u8]) -> RxControl {
        let mut c = RxControl::default();
        for m in iter(buf) {
            match (m.level, m.ty) {
                (libc::IPPROTO_IP, libc::IP_PKTINFO) => {
                    // struct in_pktinfo { int ifindex; in_addr spec_dst; in_addr addr; }
                    if let Some(a) = m.data.get(8..12) {
                        c.dst = Some(IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3])));
                    }
                }
                (libc::IPPROTO_IP, libc::IP_TOS) => c.tos = m.data.first().copied(),
                (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) => {
                    // struct in6_pktinfo { in6_addr addr; int ifindex; }
                    if let Some(a) = m.data.get(..16) {
                        let mut o = [0u8; 16];
                        o.copy_from_slice(a);
                        c.dst = Some(IpAddr::V6(Ipv6Addr::from(o)));
                    }
                }
                (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => {
                    c.tos = int_of(m.data).map(|v| v as u8);
                }
                (libc::SOL_UDP, UDP_GRO) => {
                    c.gro_segment = int_of(m.data).and_then(|v| u16::try_from(v).ok());
                }
                _ => {}
            }
        }
        c
    }
}

/// Room for a `sockaddr_in6`, the larger of the two address forms.
pub const SOCKADDR_LEN: usize = 28;

/// A socket address buffer with the alignment of `sockaddr_in6`.
#[derive(Clone, Copy, Default)]
#[repr(C, align(4))]
pub struct SockAddrBuf(pub [u8; SOCKADDR_LEN]);

/// Encodes `addr` as a `sockaddr_in` or `sockaddr_in6`; returns its length.
pub fn encode_sockaddr(addr: &SocketAddr, out: &mut SockAddrBuf) -> usize {
    let b = &mut out.0;
    b.fill(0);
    match addr {
        SocketAddr::V4(a) => {
            b[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
            b[2..4].copy_from_slice(&a.port().to_be_bytes());
            b[4..8].copy_from_slice(&a.ip().octets());
            16
        }
        SocketAddr::V6(a) => {
            b[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
            b[2..4].copy_from_slice(&a.port().to_be_bytes());
            b[4..8].copy_from_slice(&a.flowinfo().to_be_bytes());
            b[8..24].copy_from_slice(&a.ip().octets());
            b[24..28].copy_from_slice(&a.scope_id().to_ne_bytes());
            28
        }
    }
}

/// Decodes a `sockaddr_in` or `sockaddr_in6` as the kernel wrote it.
pub fn decode_sockaddr(b: &[u8]) -> Option<SocketAddr> {
    let family = u16::from_ne_bytes(b.get(..2)?.try_into().ok()?);
    let port = u16::from_be_bytes(b.get(2..4)?.try_into().ok()?);
    if family == libc::AF_INET as u16 {
        let a = b.get(4..8)?;
        Some(SocketAddr::V4(SocketAddrV4::new(
            Ipv4Addr::new(a[0], a[1], a[2], a[3]),
            port,
        )))
    } else if family == libc::AF_INET6 as u16 {
        let flowinfo = u32::from_be_bytes(b.get(4..8)?.try_into().ok()?);
        let mut a = [0u8; 16];
        a.copy_from_slice(b.get(8..24)?);
        let scope = u32::from_ne_bytes(b.get(24..28)?.try_into().ok()?);
        Some(SocketAddr::V6(SocketAddrV6::new(
            Ipv6Addr::from(a),
            port,
            flowinfo,
            scope,
        )))
    } else {
        None
    }
}

/// Writes the send-side control messages of one transmit; returns `msg_controllen`.
pub fn encode_tx_control(
    out: &mut ControlBuf,
    ipv6: bool,
    src: Option<IpAddr>,
    tos: Option<u8>,
    ttl: Option<u8>,
    segment_size: Option<u16>,
) -> usize {
    let mut w = CmsgWriter::new(&mut out.0);
    // Each push fits: CONTROL_LEN has room for all of them at once.
    if ipv6 {
        if let Some(IpAddr::V6(a)) = src {
            let mut info = [0u8; 20];
            info[..16].copy_from_slice(&a.octets());
            w.push(libc::IPPROTO_IPV6, libc::IPV6_PKTINFO, &info);
        }
        if let Some(t) = tos {
            w.push_int(libc::IPPROTO_IPV6, libc::IPV6_TCLASS, t as libc::c_int);
        }
        if let Some(h) = ttl {
            w.push_int(libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT, h as libc::c_int);
        }
    } else {
        if let Some(IpAddr::V4(a)) = src {
            // ipi_spec_dst chooses the source address; ifindex 0 lets routing pick the device.
            let mut info = [0u8; 12];
            info[4..8].copy_from_slice(&a.octets());
            w.push(libc::IPPROTO_IP, libc::IP_PKTINFO, &info);
        }
        if let Some(t) = tos {
            w.push_int(libc::IPPROTO_IP, libc::IP_TOS, t as libc::c_int);
        }
        if let Some(h) = ttl {
            w.push_int(libc::IPPROTO_IP, libc::IP_TTL, h as libc::c_int);
        }
    }
    if let Some(s) = segment_size {
        w.push(libc::SOL_UDP, UDP_SEGMENT, &s.to_ne_bytes());
    }
    w.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writer_and_iterator_round_trip() {
        let mut buf = ControlBuf::default();
        let n = encode_tx_control(
            &mut buf,
            false,
            Some("127.0.0.2".parse().unwrap()),
            Some(0x02),
            Some(64),
            Some(1024),
        );
        let msgs: Vec<_> = iter(&buf.0[..n]).collect();
        assert_eq!(msgs.len(), 4);
        assert_eq!(
            (msgs[0].level, msgs[0].ty),
            (libc::IPPROTO_IP, libc::IP_PKTINFO)
        );
        assert_eq!(&msgs[0].data[4..8], &[127, 0, 0, 2]);
        assert_eq!(msgs[1].data, &2i32.to_ne_bytes());
        assert_eq!(msgs[2].data, &64i32.to_ne_bytes());
        assert_eq!((msgs[3].level, msgs[3].ty), (libc::SOL_UDP, UDP_SEGMENT));
        assert_eq!(msgs[3].data, &1024u16.to_ne_bytes());
    }

    #[test]
    fn rx_control_parses_pktinfo_tos_and_gro() {
        let mut buf = ControlBuf::default();
        let mut w = CmsgWriter::new(&mut buf.0);
        let mut info = [0u8; 12];
        info[8..12].copy_from_slice(&[127, 0, 0, 9]);
        assert!(w.push(libc::IPPROTO_IP, libc::IP_PKTINFO, &info));
        assert!(w.push(libc::IPPROTO_IP, libc::IP_TOS, &[0x03]));
        assert!(w.push_int(libc::SOL_UDP, UDP_GRO, 1040));
        let n = w.len();
        let c = RxControl::parse(&buf.0[..n]);
        assert_eq!(c.dst, Some("127.0.0.9".parse().unwrap()));
        assert_eq!(c.tos, Some(3));
        assert_eq!(c.gro_segment, Some(1040));
    }

    #[test]
    fn malformed_control_stops_without_panicking() {
        // A length that claims more than the buffer, then one below the header size.
        let mut b = [0u8; 40];
        b[..8].copy_from_slice(&1000usize.to_ne_bytes());
        assert_eq!(iter(&b).count(), 0);
        b[..8].copy_from_slice(&3usize.to_ne_bytes());
        assert_eq!(iter(&b).count(), 0);
        assert_eq!(iter(&b[..5]).count(), 0);
        assert_eq!(RxControl::parse(&b), RxControl::default());
    }

    #[test]
    fn sockaddr_round_trip() {
        for s in ["127.0.0.1:4791", "[::1]:14791"] {
            let a: SocketAddr = s.parse().unwrap();
            let mut buf = SockAddrBuf::default();
            let n = encode_sockaddr(&a, &mut buf);
            assert_eq!(decode_sockaddr(&buf.0[..n]), Some(a));
        }
        assert_eq!(decode_sockaddr(&[0u8; 3]), None);
        assert_eq!(decode_sockaddr(&[0xffu8; 28]), None);
    }
}
