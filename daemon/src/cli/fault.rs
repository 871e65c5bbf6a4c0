//! `softroce fault`: fault injection on a running daemon, so that a program's error handling
//! meets what hardware would give it: lost, duplicated, delayed, reordered and corrupted
//! packets (the transport retransmits), RNR NAKs (the requester waits and retries) and remote
//! access errors (the work request fails with REM_ACCESS_ERR).

use super::{print_json, unexpected, CliResult, Failure, Session};
use anyhow::anyhow;
use clap::{Args, ValueEnum};
use proto::ctl::{
    DeviceFaults, FaultDirection, FaultKind, FaultRule, FaultTrigger, Request, Response,
};
use serde_json::json;
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DirectionArg {
    Tx,
    Rx,
}

#[derive(Args, Debug)]
#[command(after_help = "Kinds:
  drop             the packet is lost
  duplicate        it arrives twice
  delay MS         it is held back MS milliseconds
  reorder          it arrives after the packet that follows it
  corrupt          a bit flips: the receiver's ICRC check drops it
  rnr              the responder answers with an RNR NAK (as without a receive WQE): SENDs and
                   WRITEs with immediate, which take one
  access-error     the responder answers with a remote access error NAK (as for a bad R_Key):
                   the first packet of an RDMA WRITE, READ, atomic or flush; a SEND never
  clear            remove every rule of the device
  show             the rules in force and how many packets each took

Examples:
  softroce fault srxe0 drop --rate 0.01
  softroce fault srxe0 delay 20 --next 5 --direction tx
  softroce fault srxe0 rnr --next 3 --qp 65553
  softroce fault srxe0 access-error --next 1
  softroce fault srxe0 clear")]
pub struct FaultArgs {
    /// The device (for `show`: optional).
    device: String,
    /// The kind (drop, duplicate, delay MS, reorder, corrupt, rnr, access-error), clear or
    /// show.
    words: Vec<String>,
    /// Take each eligible packet with probability P (0..1, or a percentage: 5%); the default
    /// is every packet.
    #[arg(long, value_name = "P", conflicts_with = "next")]
    rate: Option<String>,
    /// Take the next N eligible packets, then stop.
    #[arg(long, value_name = "N")]
    next: Option<u32>,
    /// Only packets of this QP (addressed to it, or sent by it to its peer).
    #[arg(long, value_name = "QPN", value_parser = super::stat::parse_qpn)]
    qp: Option<u32>,
    /// Only packets the device sends (tx) or receives (rx); default both.
    #[arg(long, value_enum)]
    direction: Option<DirectionArg>,
    /// JSON (for `show`).
    #[arg(short, long)]
    json: bool,
    #[arg(long)]
    socket: Option<PathBuf>,
}

/// A probability: `0.05` or `5%`, as parts per million.
pub fn parse_rate(v: &str) -> Result<u32, String> {
    let (number, scale) = match v.strip_suffix('%') {
        Some(p) => (p, 0.01),
        None => (v, 1.0),
    };
    let p: f64 = number
        .parse()
        .map_err(|_| format!("rate {v:?} is not a number"))?;
    let p = p * scale;
    if !(0.0..=1.0).contains(&p) {
        return Err(format!(
            "rate {v:?} is not between 0 and 1 (or 0% and 100%)"
        ));
    }
    Ok((p * 1_000_000.0).round() as u32)
}

/// The kind from its words (`delay` takes the milliseconds).
pub fn parse_kind(words: &[String]) -> Result<FaultKind, String> {
    let w: Vec<&str> = words.iter().map(String::as_str).collect();
    Ok(match w.as_slice() {
        ["drop"] => FaultKind::Drop,
        ["duplicate"] | ["dup"] => FaultKind::Duplicate,
        ["delay", ms] => FaultKind::Delay {
            ms: ms
                .strip_suffix("ms")
                .unwrap_or(ms)
                .parse()
                .map_err(|_| format!("delay {ms:?}: expected milliseconds"))?,
        },
        ["delay"] => return Err("`delay` needs the milliseconds: delay 20".into()),
        ["reorder"] => FaultKind::Reorder,
        ["corrupt"] => FaultKind::Corrupt,
        ["rnr"] => FaultKind::Rnr,
        ["access-error"] | ["access_error"] => FaultKind::AccessError,
        _ => {
            return Err(format!(
                "unknown fault {:?} (drop, duplicate, delay MS, reorder, corrupt, rnr, access-error, clear, show)",
                words.join(" ")
            ))
        }
    })
}

pub fn run(args: FaultArgs) -> CliResult {
    let words: Vec<&str> = args.words.iter().map(String::as_str).collect();
    // `softroce fault show` names no device: the device word is then the verb.
    let (device, verb) = match (args.device.as_str(), words.as_slice()) {
        ("show", []) => (None, "show"),
        ("show", [name]) => (Some(name.to_string()), "show"),
        (_, []) => {
            return Err(Failure::usage(anyhow!(
                "what fault? drop, duplicate, delay MS, reorder, corrupt, rnr, access-error, clear or show"
            )))
        }
        (d, ["show"]) => (Some(d.to_string()), "show"),
        (d, ["clear"]) => (Some(d.to_string()), "clear"),
        (d, _) => (Some(d.to_string()), "add"),
    };
    let usage = |e: String| Failure::usage(anyhow!(e));
    match verb {
        "show" => {
            let mut s = Session::open(args.socket.as_deref(), "fault show")?;
            let Response::Faults(all) = s.ask(&Request::FaultShow { device })? else {
                return Err(Failure::failed(anyhow!(
                    "unexpected answer from the daemon"
                )));
            };
            if args.json {
                print_json(&serde_json::Value::Array(
                    all.iter().map(faults_json).collect(),
                ));
            } else {
                for d in &all {
                    print!("{}", faults_text(d));
                }
            }
            Ok(())
        }
        "clear" => {
            let mut s = Session::open(args.socket.as_deref(), "fault clear")?;
            let device = device.unwrap_or_default();
            match s.ask(&Request::FaultClear { device })? {
                Response::Done => Ok(()),
                other => Err(unexpected(other)),
            }
        }
        _ => {
            let kind = parse_kind(&args.words).map_err(usage)?;
            let trigger = match (args.next, &args.rate) {
                (Some(count), _) => FaultTrigger::Next { count },
                (None, Some(r)) => FaultTrigger::Rate {
                    ppm: parse_rate(r).map_err(usage)?,
                },
                (None, None) => FaultTrigger::Rate { ppm: 1_000_000 },
            };
            let direction = match args.direction {
                Some(DirectionArg::Tx) => FaultDirection::Tx,
                Some(DirectionArg::Rx) => FaultDirection::Rx,
                None => FaultDirection::Both,
            };
            if matches!(kind, FaultKind::Rnr | FaultKind::AccessError)
                && direction == FaultDirection::Tx
            {
                return Err(usage(format!(
                    "{kind} is the responder's answer to requests the device receives: it has no tx direction"
                )));
            }
            let rule = FaultRule {
                kind,
                trigger,
                qpn: args.qp,
                direction,
            };
            let mut s = Session::open(args.socket.as_deref(), "fault")?;
            let device = device.unwrap_or_default();
            match s.ask(&Request::FaultAdd { device, rule })? {
                Response::Done => Ok(()),
                other => Err(unexpected(other)),
            }
        }
    }
}

fn trigger_text(t: &FaultTrigger) -> String {
    match t {
        FaultTrigger::Rate { ppm } => format!("rate {}", *ppm as f64 / 1_000_000.0),
        FaultTrigger::Next { count } => format!("next {count}"),
    }
}

fn direction_text(d: FaultDirection) -> &'static str {
    match d {
        FaultDirection::Tx => "tx",
        FaultDirection::Rx => "rx",
        FaultDirection::Both => "both",
    }
}

pub fn faults_json(d: &DeviceFaults) -> serde_json::Value {
    json!({
        "ifname": d.device,
        "rules": d.rules.iter().map(|r| json!({
            "kind": r.rule.kind.to_string(),
            "trigger": trigger_text(&r.rule.trigger),
            "qpn": r.rule.qpn,
            "direction": direction_text(r.rule.direction),
            "injected": r.injected,
        })).collect::<Vec<_>>(),
    })
}

pub fn faults_text(d: &DeviceFaults) -> String {
    if d.rules.is_empty() {
        return format!("link {}/1 no faults\n", d.device);
    }
    let mut out = String::new();
    for r in &d.rules {
        out += &format!(
            "link {}/1 {} {} direction {}{} injected {}\n",
            d.device,
            r.rule.kind,
            trigger_text(&r.rule.trigger),
            direction_text(r.rule.direction),
            r.rule.qpn.map_or(String::new(), |q| format!(" qp {q}")),
            r.injected
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_kinds_parse() {
        assert_eq!(parse_rate("0.05"), Ok(50_000));
        assert_eq!(parse_rate("5%"), Ok(50_000));
        assert_eq!(parse_rate("1"), Ok(1_000_000));
        assert!(parse_rate("1.5").is_err());
        assert!(parse_rate("x").is_err());
        let w = |s: &str| s.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(parse_kind(&w("delay 20")), Ok(FaultKind::Delay { ms: 20 }));
        assert_eq!(parse_kind(&w("access-error")), Ok(FaultKind::AccessError));
        assert!(parse_kind(&w("delay")).is_err());
        assert!(parse_kind(&w("explode")).is_err());
    }
}
