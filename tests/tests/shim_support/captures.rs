//! Checks of a capture file by three independent readers: tshark (every RoCE frame decoded
//! as InfiniBand, no "Malformed" frame, no expert warning or error), `softroce pcap check` (every ICRC
//! right), and the oracle `../shared/tools/roce-pcap-check` (the same, in plain Python). Each
//! must be present: a missing one fails the test with the way to install it.

use super::programs::scratch;
use super::{check_output, require_program, softroce_bin, workspace_root, Daemon};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// One frame of a capture, as tshark decodes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub ethertype: u16,
    /// The destination MAC (which host a QPN belongs to).
    pub eth_dst: String,
    /// The BTH's destination QP, for a RoCE frame.
    pub dest_qp: Option<u32>,
    /// The IPv4 Identification, for an IPv4 frame.
    pub ip_id: Option<u16>,
    pub udp_dport: Option<u16>,
    /// Decoded as InfiniBand (RoCE v1, or RRoCE for v2).
    pub infiniband: bool,
}

/// What the readers found.
#[derive(Debug)]
pub struct CaptureReport {
    pub frames: Vec<Frame>,
    /// Frame count per Ethertype.
    pub ethertypes: BTreeMap<u16, usize>,
    /// RoCE frames: v1 (0x8915) and v2 (UDP 4791).
    pub v1: usize,
    pub v2: usize,
}

/// The oracle: `$SOFTROCE_PCAP_ORACLE`, else `../shared/tools/roce-pcap-check` beside the
/// project.
pub fn oracle() -> PathBuf {
    let p = std::env::var_os("SOFTROCE_PCAP_ORACLE")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("../shared/tools/roce-pcap-check"));
    assert!(
        p.is_file(),
        "the ICRC oracle {} is missing: the project's ../shared must sit beside it (or set \
         SOFTROCE_PCAP_ORACLE)",
        p.display()
    );
    p
}

/// `file` as classic pcap, which the oracle reads: itself when it is one, else a copy
/// converted by `editcap -F pcap` beside it.
pub fn classic_pcap(file: &Path) -> PathBuf {
    let magic = std::fs::read(file).expect("read the capture");
    // A pcapng file begins with its Section Header Block's type, 0x0A0D0D0A.
    if !magic.starts_with(&[0x0a, 0x0d, 0x0d, 0x0a]) {
        return file.to_path_buf();
    }
    let classic = file.with_extension("pcap");
    let out = Command::new(require_program("editcap"))
        .args(["-F", "pcap"])
        .arg(file)
        .arg(&classic)
        .output()
        .expect("run editcap");
    check_output("editcap -F pcap", out);
    classic
}

fn hex_u32(s: &str) -> Option<u32> {
    let s = s.trim();
    let s = s.strip_prefix("0x").unwrap_or(s);
    u32::from_str_radix(s, 16).ok()
}

/// Reads `file` with all three readers and fails the test unless every one accepts every
/// RoCE frame. Returns what tshark saw.
pub fn check(file: &Path) -> CaptureReport {
    let tshark = require_program("tshark");
    // tshark: no malformed frame, no expert warning or error (notes stay: "TTL only 1" is
    // the pingpongs' own hop limit), every RoCE frame InfiniBand.
    let filter = "_ws.malformed || _ws.expert.severity >= 0x600000";
    let out = Command::new(&tshark)
        .arg("-r")
        .arg(file)
        .args(["-Y", filter])
        .output()
        .expect("run tshark");
    let bad = check_output(&format!("tshark -Y {filter}"), out);
    assert!(
        bad.trim().is_empty(),
        "{}: tshark reports malformed frames or expert warnings/errors:\n{}",
        file.display(),
        bad.lines().take(20).collect::<Vec<_>>().join("\n")
    );
    let out = Command::new(&tshark)
        .arg("-r")
        .arg(file)
        .args([
            "-T",
            "fields",
            "-E",
            "separator=;",
            "-e",
            "eth.type",
            "-e",
            "infiniband.bth.destqp",
            "-e",
            "ip.id",
            "-e",
            "udp.dstport",
            "-e",
            "infiniband",
            "-e",
            "eth.dst",
        ])
        .output()
        .expect("run tshark");
    let fields = check_output("tshark -T fields", out);
    let mut frames = Vec::new();
    for line in fields.lines() {
        let c: Vec<&str> = line.split(';').collect();
        let get = |i: usize| c.get(i).copied().unwrap_or("").trim();
        // An ARP or ND frame has one Ethertype; the first one is the frame's.
        let ethertype = get(0).split(',').next().and_then(hex_u32).unwrap_or(0) as u16;
        frames.push(Frame {
            ethertype,
            dest_qp: get(1).split(',').next().and_then(hex_u32),
            ip_id: get(2).split(',').next().and_then(hex_u32).map(|v| v as u16),
            udp_dport: get(3).split(',').next().and_then(|p| p.parse().ok()),
            infiniband: !get(4).is_empty(),
            eth_dst: get(5).to_string(),
        });
    }
    let mut ethertypes = BTreeMap::new();
    for f in &frames {
        *ethertypes.entry(f.ethertype).or_insert(0) += 1;
    }
    let v1 = frames.iter().filter(|f| f.ethertype == 0x8915).count();
    let v2 = frames.iter().filter(|f| f.udp_dport == Some(4791)).count();
    for (i, f) in frames.iter().enumerate() {
        if f.ethertype == 0x8915 || f.udp_dport == Some(4791) {
            assert!(
                f.infiniband,
                "{}: frame {} is RoCE but tshark did not decode it as InfiniBand: {f:?}",
                file.display(),
                i + 1
            );
        }
    }
    // softroce pcap check: every whole RoCE packet parses and carries the right ICRC.
    let out = Command::new(softroce_bin())
        .args(["pcap", "check"])
        .arg(file)
        .output()
        .expect("run softroce pcap check");
    let summary = check_output("softroce pcap check", out);
    // The oracle, on the same packets (it reads classic pcap).
    let out = Command::new("python3")
        .arg(oracle())
        .arg(classic_pcap(file))
        .output()
        .expect("run the oracle (python3)");
    let verdict = check_output("roce-pcap-check", out);
    let want = format!("roce={} v1={v1} v2={v2} icrc_ok={}", v1 + v2, v1 + v2);
    assert!(
        verdict.contains(&want) && verdict.contains("icrc_bad=0"),
        "{}: the oracle disagrees (expected {want}):\n{verdict}\n--- softroce pcap check\n{summary}",
        file.display()
    );
    CaptureReport {
        frames,
        ethertypes,
        v1,
        v2,
    }
}

/// A running `softroce capture -i DEVICE -w FILE` (the daemon's own live capture), started
/// once the daemon has it.
pub struct LiveCapture {
    child: Child,
    file: PathBuf,
}

impl LiveCapture {
    /// Captures `srxe0` into a scratch file named after `name`.
    pub fn start(d: &Daemon, name: &str) -> LiveCapture {
        let file = scratch("operator", "capture").join(format!("{name}.pcapng"));
        LiveCapture::on(d, "srxe0", file)
    }

    pub fn on(d: &Daemon, device: &str, file: PathBuf) -> LiveCapture {
        let mut child = Command::new(softroce_bin())
            .args(["capture", "-i", device, "-w"])
            .arg(&file)
            .env("SOFTROCE_SOCKET", &d.socket)
            .stderr(Stdio::piped())
            .spawn()
            .expect("start softroce capture");
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        err.read_line(&mut line).unwrap();
        assert!(
            line.contains(&format!("capturing on {device}")),
            "capture did not start: {line}\n{}",
            d.log()
        );
        std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = std::io::Read::read_to_string(&mut err, &mut rest);
            eprint!("{rest}");
        });
        LiveCapture { child, file }
    }

    /// Ctrl-C: the capture ends with whole blocks and exits 0.
    pub fn stop(mut self) -> PathBuf {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let status = self.child.wait().unwrap();
        assert!(status.success(), "softroce capture exited {status}");
        self.file
    }
}

/// The UDP checksums of a capture as tshark verifies them: (good, bad). Frames without one
/// (IPv4 with 0, as rxe sends) count in neither.
pub fn udp_checksums(file: &Path) -> (u64, u64) {
    let out = Command::new(require_program("tshark"))
        .args(["-n", "-o", "udp.check_checksum:TRUE", "-r"])
        .arg(file)
        .args(["-T", "fields", "-e", "udp.checksum.status"])
        .output()
        .expect("run tshark");
    let statuses = check_output("tshark -e udp.checksum.status", out);
    // Wireshark's checksum status: 0 bad, 1 good, 2 unverified, 3 not present.
    let count = |s: &str| statuses.lines().filter(|l| l.trim() == s).count() as u64;
    (count("1"), count("0"))
}
