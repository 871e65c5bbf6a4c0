//! Golden vectors: every packet that the Linux kernel's rxe put on the wire in
//! `../shared/captures` must parse, verify its ICRC, and be reproduced byte for byte (ICRC
//! included) by emitting its parsed `Repr`.

use pcap_file::pcap::PcapReader;
use pcap_file::DataLink;
use proto::wire::{frame::IcrcStatus, mad, Error, FrameRepr, Opcode};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn captures_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/captures");
    assert!(
        dir.is_dir(),
        "the golden captures are expected at {} (../shared/captures beside the project)",
        dir.display()
    );
    dir
}

fn capture_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(captures_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 20,
        "expected the full set of golden captures"
    );
    files
}

#[derive(Default, Debug)]
struct Tally {
    frames: usize,
    roce: usize,
    verified: usize,
    truncated: usize,
    by_opcode: BTreeMap<u8, usize>,
    cm_mads: usize,
}

fn check_file(path: &Path) -> Tally {
    let file = std::fs::File::open(path).unwrap();
    let mut reader = PcapReader::new(file).unwrap();
    assert_eq!(reader.header().datalink, DataLink::ETHERNET);
    let mut t = Tally::default();
    // Raw records: pcap-file refuses orig_len > snaplen, which every snaplen-128 capture has.
    while let Some(pkt) = reader.next_raw_packet() {
        let pkt = pkt.unwrap();
        t.frames += 1;
        let data = &pkt.data[..];
        let parsed = match FrameRepr::parse_ethernet(data, pkt.orig_len as usize) {
            Ok(p) => p,
            Err(Error::NotRoce(_)) => continue,
            Err(e) => panic!("{}: frame {}: {e}", path.display(), t.frames),
        };
        t.roce += 1;
        let op = parsed.repr.transport.bth.opcode;
        *t.by_opcode.entry(op.0).or_default() += 1;
        match parsed.icrc {
            IcrcStatus::Ok => {
                t.verified += 1;
                // Emit reproduces the frame exactly, ICRC included.
                let mut out = vec![0u8; parsed.repr.buffer_len()];
                parsed.repr.emit(&mut out, parsed.payload).unwrap();
                assert_eq!(
                    &out[..],
                    &data[..out.len()],
                    "{}: frame {} ({op:?}) re-emitted differently",
                    path.display(),
                    t.frames
                );
                if op == Opcode::UD_SEND_ONLY && parsed.payload.len() == mad::MAD_LEN {
                    let h = mad::MadHeader::parse(parsed.payload).unwrap();
                    if h.mgmt_class == mad::CLASS_CM {
                        mad::cm_summary(parsed.payload).unwrap();
                        t.cm_mads += 1;
                    }
                }
            }
            IcrcStatus::Bad { computed, carried } => panic!(
                "{}: frame {} bad ICRC {computed:#x} vs {carried:#x}",
                path.display(),
                t.frames
            ),
            IcrcStatus::NotCaptured => t.truncated += 1,
        }
    }
    t
}

#[test]
fn every_golden_packet_parses_verifies_and_reemits() {
    let mut total = 0;
    for path in capture_files() {
        let t = check_file(&path);
        assert!(t.roce > 0, "{}: no RoCE packets", path.display());
        assert_eq!(t.verified + t.truncated, t.roce);
        total += t.roce;
    }
    assert!(total > 30_000, "only {total} RoCE packets seen");
}

/// Counts from CAPTURES.md, spot-checked: the parser and the reference agree.
#[test]
fn counts_agree_with_captures_md() {
    let dir = captures_dir();
    let rc = check_file(&dir.join("rc_pingpong_default.pcap"));
    assert_eq!((rc.frames, rc.roce), (10443, 10428));
    assert_eq!(rc.by_opcode[&0x00], 2061);
    assert_eq!(rc.by_opcode[&0x01], 4106);
    assert_eq!(rc.by_opcode[&0x02], 2047);
    assert_eq!(rc.by_opcode[&0x11], 2214);
    // Snaplen 128: only the ACKs were captured whole.
    assert_eq!(rc.verified, 2214);

    let extra = check_file(&dir.join("verbs_extra.pcap"));
    assert_eq!((extra.frames, extra.roce, extra.verified), (57, 42, 42));
    assert_eq!(extra.by_opcode[&0x17], 1, "SEND_ONLY_WITH_INVALIDATE");
    assert_eq!(extra.by_opcode[&0x05], 10);

    let cm = check_file(&dir.join("ib_send_bw_rdmacm.pcap"));
    assert_eq!(cm.by_opcode[&0x64], 10);
    assert_eq!(cm.cm_mads, 10);

    let ud = check_file(&dir.join("udaddy.pcap"));
    assert_eq!(ud.by_opcode[&0x65], 20);
}

/// Every bit of a packet that the ICRC covers, flipped, is caught (or the packet is refused
/// before the ICRC is even looked at); flips of the bits the ICRC masks are not.
#[test]
fn flipped_bits_are_caught() {
    let path = captures_dir().join("ib_read_lat.pcap");
    let mut reader = PcapReader::new(std::fs::File::open(path).unwrap()).unwrap();
    let mut frames = Vec::new();
    while let Some(p) = reader.next_raw_packet() {
        let p = p.unwrap();
        if FrameRepr::parse_ethernet(&p.data, p.orig_len as usize).is_ok() {
            frames.push(p.data.into_owned());
        }
        if frames.len() == 4 {
            break;
        }
    }
    assert_eq!(frames.len(), 4);
    for frame in frames {
        // IPv4 TOS and TTL, UDP checksum, BTH byte 4: masked out of the ICRC.
        let masked = [14 + 1, 14 + 8, 14 + 20 + 6, 14 + 20 + 7, 14 + 28 + 4];
        for bit in (14 * 8)..(frame.len() * 8) {
            let byte = bit / 8;
            let mut f = frame.clone();
            f[byte] ^= 1 << (bit % 8);
            let verified = matches!(
                FrameRepr::parse_ethernet(&f, f.len()),
                Ok(p) if p.icrc == IcrcStatus::Ok
            );
            if masked.contains(&byte) {
                // The IPv4 header checksum still covers TOS and TTL.
                let caught_by_ip_checksum = byte < 14 + 20;
                assert_eq!(verified, !caught_by_ip_checksum, "masked byte {byte}");
            } else {
                assert!(!verified, "flip of bit {bit} (byte {byte}) went unnoticed");
            }
        }
        // Truncated anywhere: an error or an unverified packet, never a panic.
        for cut in 0..frame.len() {
            if let Ok(p) = FrameRepr::parse_ethernet(&frame[..cut], frame.len()) {
                assert_eq!(p.icrc, IcrcStatus::NotCaptured);
            }
            let verified = matches!(
                FrameRepr::parse_ethernet(&frame[..cut], cut),
                Ok(p) if p.icrc == IcrcStatus::Ok
            );
            assert!(!verified, "a frame cut to {cut} bytes verified");
        }
    }
}
