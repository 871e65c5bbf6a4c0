//! `softroce pcap check` against the golden captures, the independent oracle
//! (`../shared/tools/roce-pcap-check`), damaged copies and other capture formats.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn shared() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared");
    assert!(dir.is_dir(), "../shared is expected beside the project");
    dir
}

fn captures() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(shared().join("captures"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    v.sort();
    v
}

fn softroce(args: &[&str], files: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_softroce"))
        .args(args)
        .args(files)
        .output()
        .expect("run softroce")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Reads the number that follows `key` in a summary line.
fn count(summary: &str, key: &str) -> usize {
    let at = summary
        .find(key)
        .unwrap_or_else(|| panic!("{key} missing in {summary}"))
        + key.len();
    summary[at..]
        .trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// The lines of our report that belong to `name`.
fn section<'a>(report: &'a str, name: &str) -> Vec<&'a str> {
    let mut lines = report
        .lines()
        .skip_while(|l| !l.starts_with(&format!("{name}:")));
    let head = lines
        .next()
        .unwrap_or_else(|| panic!("no summary for {name}"));
    std::iter::once(head)
        .chain(lines.take_while(|l| l.starts_with("  ")))
        .collect()
}

#[test]
fn every_golden_capture_passes_and_agrees_with_the_oracle() {
    let files = captures();
    assert!(files.len() >= 20);
    let refs: Vec<&Path> = files.iter().map(|p| p.as_path()).collect();
    let ours = softroce(&["pcap", "check"], &refs);
    assert!(ours.status.success(), "{}", stdout(&ours));
    let ours = stdout(&ours);

    let oracle = Command::new("python3")
        .arg(shared().join("tools/roce-pcap-check"))
        .args(&refs)
        .output()
        .expect("run the oracle (python3)");
    assert!(oracle.status.success());
    let oracle = stdout(&oracle);

    for file in &files {
        let name = file.display().to_string();
        let mine = section(&ours, &name);
        let theirs = oracle
            .lines()
            .find(|l| l.starts_with(&format!("{name}:")))
            .unwrap();
        let head = mine[0];
        assert_eq!(count(head, ":"), count(theirs, "packets="), "{name} frames");
        assert_eq!(
            count(head, "frames,"),
            count(theirs, "roce="),
            "{name} RoCE"
        );
        assert_eq!(
            count(head, "ICRC ok"),
            count(theirs, "icrc_ok="),
            "{name} ok"
        );
        assert_eq!(count(head, "bad"), 0);
        assert_eq!(
            count(head, "cut short by snaplen"),
            count(theirs, "truncated="),
            "{name} truncated"
        );
        // Opcode counts: the oracle prints "0xNNxCOUNT" pairs.
        let ops = theirs.split("opcodes:").nth(1).unwrap();
        for pair in ops.split_whitespace() {
            let (op, n) = pair[2..].split_once('x').unwrap();
            let line = mine
                .iter()
                .find(|l| l.starts_with(&format!("  0x{op} ")))
                .unwrap_or_else(|| panic!("{name}: opcode 0x{op} missing"));
            let mine_n: usize = line.split_whitespace().last().unwrap().parse().unwrap();
            assert_eq!(mine_n, n.parse::<usize>().unwrap(), "{name} opcode 0x{op}");
        }
    }
}

/// A classic little-endian pcap file: global header plus (orig_len, data) records.
struct Pcap {
    header: Vec<u8>,
    records: Vec<(u32, Vec<u8>)>,
}

impl Pcap {
    fn read(path: &Path) -> Pcap {
        let bytes = std::fs::read(path).unwrap();
        assert_eq!(&bytes[..4], &[0xd4, 0xc3, 0xb2, 0xa1]);
        let mut records = Vec::new();
        let mut at = 24;
        while at + 16 <= bytes.len() {
            let word = |o: usize| u32::from_le_bytes(bytes[at + o..at + o + 4].try_into().unwrap());
            let (incl, orig) = (word(8) as usize, word(12));
            records.push((orig, bytes[at + 16..at + 16 + incl].to_vec()));
            at += 16 + incl;
        }
        Pcap {
            header: bytes[..24].to_vec(),
            records,
        }
    }

    fn with_linktype(mut self, linktype: u32) -> Pcap {
        self.header[20..24].copy_from_slice(&linktype.to_le_bytes());
        self
    }

    fn write(&self, path: &Path) {
        let mut out = self.header.clone();
        for (orig, data) in &self.records {
            out.extend_from_slice(&[0; 8]);
            out.extend_from_slice(&(data.len() as u32).to_le_bytes());
            out.extend_from_slice(&orig.to_le_bytes());
            out.extend_from_slice(data);
        }
        std::fs::write(path, out).unwrap();
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pcap-check");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn is_roce_v4(d: &[u8]) -> bool {
    d.len() > 46 && d[12..14] == [8, 0] && d[23] == 17 && d[36..38] == [0x12, 0xb7]
}

#[test]
fn a_flipped_bit_anywhere_in_the_icrc_coverage_is_reported() {
    let golden = shared().join("captures/ib_read_bw.pcap");
    let original = Pcap::read(&golden);
    let roce: Vec<usize> = original
        .records
        .iter()
        .enumerate()
        .filter(|(_, (_, d))| is_roce_v4(d))
        .map(|(i, _)| i)
        .take(3)
        .collect();
    assert_eq!(roce.len(), 3);
    for &rec in &roce {
        let len = original.records[rec].1.len();
        // IP addresses, UDP ports and length, BTH opcode and PSN, RETH or payload, the ICRC.
        for byte in [26, 33, 34, 39, 42, 51, 60, len - 5, len - 1] {
            let mut damaged = Pcap::read(&golden);
            damaged.records[rec].1[byte] ^= 0x10;
            let path = scratch(&format!("flip-{rec}-{byte}.pcap"));
            damaged.write(&path);
            let out = softroce(&["pcap", "check"], &[&path]);
            let text = stdout(&out);
            assert_eq!(out.status.code(), Some(1), "flip at {byte}: {text}");
            let frame = format!("BAD frame {}:", rec + 1);
            let line = text
                .lines()
                .find(|l| l.contains(&frame))
                .unwrap_or_else(|| {
                    panic!("flip at byte {byte} of frame {} not named: {text}", rec + 1)
                });
            assert!(
                ["icrc", "checksum", "opcode", "length", "truncated", "pad"]
                    .iter()
                    .any(|w| line.to_lowercase().contains(w)),
                "unclear reason: {line}"
            );
        }
    }
}

#[test]
fn truncated_packets_and_files_are_reported_not_fatal() {
    let golden = shared().join("captures/verbs_extra.pcap");
    let original = Pcap::read(&golden);
    let last_roce = original
        .records
        .iter()
        .rposition(|(_, d)| is_roce_v4(d) && d.len() > 60)
        .unwrap();
    let len = original.records[last_roce].1.len();
    for cut in [15, 30, 40, 45, 50, len - 4, len - 1] {
        // The packet itself is short (not a snaplen cut): the IP length claims more.
        let mut damaged = Pcap::read(&golden);
        damaged.records[last_roce].1.truncate(cut);
        damaged.records[last_roce].0 = cut as u32;
        let path = scratch(&format!("short-{cut}.pcap"));
        damaged.write(&path);
        let out = softroce(&["pcap", "check"], &[&path]);
        assert_eq!(out.status.code(), Some(1), "cut at {cut}: {}", stdout(&out));
        assert!(stdout(&out).contains(&format!("BAD frame {}:", last_roce + 1)));

        // A snaplen cut (orig_len kept) is counted, not an error.
        let mut snapped = Pcap::read(&golden);
        snapped.records[last_roce].1.truncate(cut);
        let path = scratch(&format!("snap-{cut}.pcap"));
        snapped.write(&path);
        let out = softroce(&["pcap", "check"], &[&path]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "snap at {cut}: {}",
            stdout(&out)
        );
        assert_eq!(count(&stdout(&out), "cut short by snaplen"), 1);
    }
    // A file that ends in the middle of a record.
    let bytes = std::fs::read(&golden).unwrap();
    let path = scratch("cut-file.pcap");
    std::fs::write(&path, &bytes[..bytes.len() - 7]).unwrap();
    let out = softroce(&["pcap", "check"], &[&path]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("cut mid-record"), "{}", stdout(&out));
}

#[test]
fn unreadable_files_exit_2() {
    let path = scratch("garbage.pcap");
    std::fs::write(&path, b"this is not a capture file at all").unwrap();
    let out = softroce(&["pcap", "check"], &[&path]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
    let out = softroce(&["pcap", "check"], &[Path::new("/nonexistent/x.pcap")]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn cooked_raw_and_pcapng_captures_are_read() {
    use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
    use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionBlock;
    use pcap_file::pcapng::PcapNgWriter;
    use pcap_file::DataLink;

    let golden = shared().join("captures/rping.pcap");
    let eth = Pcap::read(&golden);
    let frames = eth.records.len();

    // Linux cooked v1 (113): 16-byte header with the protocol at 14.
    let mut sll = Pcap::read(&golden).with_linktype(113);
    for (orig, d) in &mut sll.records {
        let mut h = vec![0u8; 16];
        h[14..16].copy_from_slice(&d[12..14]);
        h.extend_from_slice(&d[14..]);
        *d = h;
        *orig += 2;
    }
    // Linux cooked v2 (276): 20-byte header with the protocol first.
    let mut sll2 = Pcap::read(&golden).with_linktype(276);
    for (orig, d) in &mut sll2.records {
        let mut h = vec![0u8; 20];
        h[0..2].copy_from_slice(&d[12..14]);
        h.extend_from_slice(&d[14..]);
        *d = h;
        *orig += 6;
    }
    // Raw IP (101).
    let mut raw = Pcap::read(&golden).with_linktype(101);
    for (orig, d) in &mut raw.records {
        d.drain(..14);
        *orig -= 14;
    }
    for (name, p) in [("sll", sll), ("sll2", sll2), ("raw", raw)] {
        let path = scratch(&format!("rping-{name}.pcap"));
        p.write(&path);
        let out = softroce(&["pcap", "check"], &[&path]);
        let text = stdout(&out);
        assert!(out.status.success(), "{name}: {text}");
        assert_eq!(count(&text, ":"), frames, "{name}");
        assert_eq!(count(&text, "ICRC ok"), 125, "{name}: {text}");
    }

    // pcapng with one Ethernet interface.
    let path = scratch("rping.pcapng");
    let mut w = PcapNgWriter::new(std::fs::File::create(&path).unwrap()).unwrap();
    w.write_pcapng_block(InterfaceDescriptionBlock::new(DataLink::ETHERNET, 0))
        .unwrap();
    for (orig, d) in &eth.records {
        w.write_pcapng_block(EnhancedPacketBlock {
            interface_id: 0,
            timestamp: std::time::Duration::ZERO,
            original_len: *orig,
            data: std::borrow::Cow::Borrowed(d),
            options: vec![],
        })
        .unwrap();
    }
    drop(w);
    let out = softroce(&["pcap", "check", "-v"], &[&path]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    let head = section(&text, &path.display().to_string())[0];
    assert_eq!(count(head, "ICRC ok"), 125, "{head}");
    assert_eq!(text.lines().filter(|l| l.ends_with("ICRC ok")).count(), 125);
    assert!(
        text.contains("CM REQ"),
        "verbose lines decode the CM: {text}"
    );
    assert!(text.contains("RC_RDMA_READ_REQUEST QP=0x000021"));
}
