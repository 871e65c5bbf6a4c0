//! Real kernel-rxe packets (the golden captures, Debian 6.1 rxe, non-zero varying IPv4
//! Identification) verified the way the transport's receive path sees them: only the UDP
//! payload, the addresses and the ports. The Identification must be recovered exactly and
//! every packet accepted; a flipped bit must be rejected. Pure computation, no traffic.

use proto::wire::frame::IcrcStatus;
use proto::wire::{FrameRepr, NetRepr};
use softroce_daemon::net::{RxVerdict, RxVerifier};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

/// The golden captures: `../shared` beside the project (as CI lays it), else the team machine's.
fn captures_dir() -> std::path::PathBuf {
    let beside = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/captures");
    let team = Path::new("/work/shared/captures");
    let found = [beside.as_path(), team]
        .into_iter()
        .find(|p| p.is_dir())
        .map(Path::to_path_buf);
    match found {
        Some(p) => p,
        None => panic!(
            "precondition missing: the golden captures are expected at {} (../shared beside the project)",
            beside.display()
        ),
    }
}

/// The records of a little-endian classic pcap file with Ethernet frames: (bytes, wire length).
fn pcap_records(file: &[u8]) -> Vec<(&[u8], usize)> {
    let u32_at = |at: usize| u32::from_le_bytes(file[at..at + 4].try_into().unwrap()) as usize;
    assert!(file.len() >= 24, "short pcap");
    assert!(
        matches!(
            file[..4],
            [0xd4, 0xc3, 0xb2, 0xa1] | [0x4d, 0x3c, 0xb2, 0xa1]
        ),
        "little-endian pcap"
    );
    assert_eq!(u32_at(20) & 0x0fff_ffff, 1, "Ethernet link type");
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= file.len() {
        let (incl, orig) = (u32_at(at + 8), u32_at(at + 12));
        let Some(data) = file.get(at + 16..at + 16 + incl) else {
            break;
        };
        out.push((data, orig));
        at += 16 + incl;
    }
    out
}

#[test]
fn kernel_rxe_captures_verify_with_ident_recovery() {
    let dir = captures_dir();
    let entries = std::fs::read_dir(&dir).unwrap();
    let mut files: Vec<_> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pcap"))
        .collect();
    files.sort();
    let mut v = RxVerifier::new();
    let (mut checked, mut nonzero_ident) = (0usize, 0usize);
    for path in &files {
        for (data, orig_len) in pcap_records(&std::fs::read(path).unwrap()) {
            let Ok(parsed) = FrameRepr::parse_ethernet(data, orig_len) else {
                continue; // TCP, ARP, ...
            };
            if parsed.icrc != IcrcStatus::Ok {
                continue; // cut by the snaplen
            }
            let repr = parsed.repr;
            let Some(udp) = repr.udp else { continue };
            let start = repr.link.header_len() + repr.net.header_len() + udp.header_len();
            let datagram = &data[start..start + udp.payload_len];
            let (src, dst, ident) = match repr.net {
                NetRepr::Ipv4(ip) => (IpAddr::V4(ip.src), IpAddr::V4(ip.dst), Some(ip.ident)),
                NetRepr::Ipv6(ip) => (IpAddr::V6(ip.src), IpAddr::V6(ip.dst), None),
                NetRepr::Grh(_) => continue,
            };
            let src = SocketAddr::new(src, udp.src_port);
            let dst = SocketAddr::new(dst, udp.dst_port);
            match v.verify(src, dst, datagram) {
                RxVerdict::Good { ipv4 } => {
                    assert_eq!(ipv4.map(|i| i.ident), ident, "{}", path.display());
                    if ident.is_some_and(|i| i != 0) {
                        nonzero_ident += 1;
                    }
                }
                other => panic!("{}: {other:?}", path.display()),
            }
            // One flipped payload bit (past the BTH) must not pass.
            let mut bad = datagram.to_vec();
            let at = bad.len() - 5;
            bad[at] ^= 0x08;
            assert_eq!(
                v.verify(src, dst, &bad),
                RxVerdict::BadIcrc,
                "{}",
                path.display()
            );
            checked += 1;
        }
    }
    println!("{checked} captured rxe packets verified, {nonzero_ident} with a non-zero ID");
    assert!(checked > 1000, "only {checked} packets found");
    assert!(nonzero_ident > 1000);
}
