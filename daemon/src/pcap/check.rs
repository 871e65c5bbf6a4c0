//! `softroce pcap check`: parse every RoCE packet in capture files and verify every ICRC.

use super::{parse_record, CaptureReader, ReadError};
use proto::wire::frame::IcrcStatus;
use proto::wire::{mad, Error, NetRepr, Opcode, ParsedFrame};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// What one file held.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FileReport {
    pub frames: usize,
    pub roce: usize,
    pub v2_ipv4: usize,
    pub v2_ipv6: usize,
    pub v1: usize,
    pub icrc_ok: usize,
    pub icrc_bad: usize,
    /// RoCE packets the capture's snaplen cut short: headers decoded, ICRC not checkable.
    pub cut_short: usize,
    pub other: usize,
    pub by_opcode: BTreeMap<u8, usize>,
    pub cm_messages: BTreeMap<&'static str, usize>,
    /// (1-based frame number, reason) for every packet that failed.
    pub bad: Vec<(usize, String)>,
}

impl FileReport {
    pub fn is_clean(&self) -> bool {
        self.bad.is_empty()
    }
}

/// Reads and checks one capture held in memory. `verbose` receives one line per RoCE packet.
pub fn check_bytes(
    bytes: Vec<u8>,
    mut verbose: Option<&mut dyn FnMut(String)>,
) -> Result<FileReport, ReadError> {
    let mut reader = CaptureReader::from_bytes(bytes)?;
    let mut r = FileReport::default();
    while let Some(rec) = reader.next_record() {
        let rec = match rec {
            Ok(rec) => rec,
            Err(e) => {
                r.bad.push((
                    r.frames + 1,
                    format!("capture file corrupt or cut mid-record: {e}"),
                ));
                break;
            }
        };
        r.frames += 1;
        let n = r.frames;
        let captured_whole = rec.data.len() >= rec.orig_len;
        match parse_record(&rec) {
            Ok(p) => {
                r.roce += 1;
                match p.repr.net {
                    NetRepr::Ipv4(_) => r.v2_ipv4 += 1,
                    NetRepr::Ipv6(_) => r.v2_ipv6 += 1,
                    NetRepr::Grh(_) => r.v1 += 1,
                }
                *r.by_opcode
                    .entry(p.repr.transport.bth.opcode.0)
                    .or_default() += 1;
                let cm = cm_message(&p);
                if let Some(cm) = &cm {
                    *r.cm_messages.entry(cm.name).or_default() += 1;
                }
                match p.icrc {
                    IcrcStatus::Ok => r.icrc_ok += 1,
                    IcrcStatus::NotCaptured => r.cut_short += 1,
                    IcrcStatus::Bad { computed, carried } => {
                        r.icrc_bad += 1;
                        r.bad.push((
                            n,
                            format!(
                                "{}: bad ICRC (computed {computed:#010x}, carried {carried:#010x})",
                                p.repr.transport.bth.opcode
                            ),
                        ));
                    }
                }
                if let Some(out) = verbose.as_mut() {
                    out(describe(n, &p, cm.as_ref()));
                }
            }
            Err(Error::NotRoce(_)) | Err(Error::Unsupported("link type")) => r.other += 1,
            // The snaplen cut into the headers themselves: RoCE, but nothing more to say.
            Err(Error::Truncated { .. }) if !captured_whole => {
                r.roce += 1;
                r.cut_short += 1;
                if let Some(out) = verbose.as_mut() {
                    out(format!("{n:>6}  (headers cut short by the snaplen)"));
                }
            }
            Err(e) => {
                r.roce += 1;
                r.bad.push((n, e.to_string()));
                if let Some(out) = verbose.as_mut() {
                    out(format!("{n:>6}  BAD: {e}"));
                }
            }
        }
    }
    Ok(r)
}

/// Reads and checks one capture file.
pub fn check_file(
    path: &Path,
    verbose: Option<&mut dyn FnMut(String)>,
) -> Result<FileReport, ReadError> {
    let bytes = std::fs::read(path)?;
    check_bytes(bytes, verbose)
}

fn cm_message(p: &ParsedFrame<'_>) -> Option<mad::CmSummary> {
    let t = &p.repr.transport;
    let is_mad = matches!(t.bth.opcode, Opcode::UD_SEND_ONLY) && p.payload.len() == mad::MAD_LEN;
    if !is_mad {
        return None;
    }
    let h = mad::MadHeader::parse(p.payload).ok()?;
    (h.mgmt_class == mad::CLASS_CM).then(|| mad::cm_summary(p.payload).ok())?
}

/// One line per packet, in the spirit of tshark's summary line.
pub fn describe(n: usize, p: &ParsedFrame<'_>, cm: Option<&mad::CmSummary>) -> String {
    let mut s = String::new();
    let t = &p.repr.transport;
    let (src, dst, ver) = match (&p.repr.net, &p.repr.udp) {
        (NetRepr::Ipv4(ip), Some(u)) => (
            format!("{}:{}", ip.src, u.src_port),
            format!("{}:{}", ip.dst, u.dst_port),
            "v2",
        ),
        (NetRepr::Ipv6(ip), Some(u)) => (
            format!("[{}]:{}", ip.src, u.src_port),
            format!("[{}]:{}", ip.dst, u.dst_port),
            "v2",
        ),
        (NetRepr::Ipv4(ip), None) => (ip.src.to_string(), ip.dst.to_string(), "v2"),
        (NetRepr::Ipv6(ip), None) | (NetRepr::Grh(ip), _) => {
            (ip.src.to_string(), ip.dst.to_string(), "v1")
        }
    };
    let _ = write!(
        s,
        "{n:>6}  {ver} {src} -> {dst}  {} QP={:#08x} PSN={}",
        t.bth.opcode,
        t.bth.dest_qpn.value(),
        t.bth.psn
    );
    for (on, name) in [
        (t.bth.ack_req, "AckReq"),
        (t.bth.solicited, "SE"),
        (t.bth.fecn, "FECN"),
        (t.bth.becn, "BECN"),
    ] {
        if on {
            let _ = write!(s, " {name}");
        }
    }
    if let NetRepr::Ipv4(ip) = &p.repr.net {
        if ip.tos & 3 != 0 {
            let _ = write!(s, " ECN={}", ip.tos & 3);
        }
    }
    if let Some(d) = t.deth {
        let _ = write!(s, " DETH(qkey={} srcqp={:#x})", d.qkey, d.src_qpn.value());
    }
    if let Some(f) = t.feth {
        let _ = write!(s, " FETH(sel={} plt={})", f.selectivity, f.placement);
    }
    if let Some(r) = t.reth {
        let _ = write!(s, " RETH(va={:#x} rkey={} len={})", r.va, r.rkey, r.len);
    }
    if let Some(a) = t.atomic_eth {
        let _ = write!(
            s,
            " AtomicETH(va={:#x} rkey={} swap_add={:#x} cmp={:#x})",
            a.va, a.rkey, a.swap_add, a.compare
        );
    }
    if let Some(a) = t.aeth {
        let _ = write!(s, " AETH({} MSN={})", a.syndrome, a.msn);
    }
    if let Some(a) = t.atomic_ack_eth {
        let _ = write!(s, " orig={:#x}", a.orig);
    }
    if let Some(imm) = t.imm {
        let _ = write!(s, " imm={imm:#010x}");
    }
    if let Some(k) = t.ieth {
        let _ = write!(s, " inv_rkey={k}");
    }
    let _ = write!(s, " len={}", t.payload_len);
    if let Some(cm) = cm {
        let _ = write!(s, "  CM {} lcid={:#x}", cm.name, cm.local_comm_id);
        if let Some(r) = cm.remote_comm_id {
            let _ = write!(s, " rcid={r:#x}");
        }
        if let Some(sid) = cm.service_id {
            let _ = write!(s, " sid={sid:#018x}");
        }
        if let Some(q) = cm.qpn {
            let _ = write!(s, " qpn={:#x}", q.value());
        }
        if let Some(psn) = cm.starting_psn {
            let _ = write!(s, " spsn={psn}");
        }
        if let Some(r) = cm.reason {
            let _ = write!(s, " reason={r}");
        }
    }
    let _ = write!(
        s,
        "  ICRC {}",
        match p.icrc {
            IcrcStatus::Ok => "ok",
            IcrcStatus::Bad { .. } => "BAD",
            IcrcStatus::NotCaptured => "not captured",
        }
    );
    s
}

/// The per-file summary that `pcap check` prints.
pub fn summary(name: &str, r: &FileReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{name}: {} frames, {} RoCE (v2/IPv4 {}, v2/IPv6 {}, v1 {}), ICRC ok {}, bad {}, cut short by snaplen {}, other {}",
        r.frames, r.roce, r.v2_ipv4, r.v2_ipv6, r.v1, r.icrc_ok, r.icrc_bad, r.cut_short, r.other
    );
    for (op, count) in &r.by_opcode {
        let _ = writeln!(s, "  {:#04x} {:<36} {count}", op, Opcode(*op).name());
    }
    for (name, count) in &r.cm_messages {
        let _ = writeln!(s, "  CM   {name:<36} {count}");
    }
    for (n, why) in &r.bad {
        let _ = writeln!(s, "  BAD frame {n}: {why}");
    }
    s
}
