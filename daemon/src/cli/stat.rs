//! `softroce stat`: a device's counters under the names of `rdma statistic show` (rxe's, then
//! the congestion counters and the drops the engine and the packet I/O count), per QP with
//! `qp QPN`, and rates every N seconds with `-w`.

use super::{print_json, unexpected, CliResult, Failure, Session};
use anyhow::anyhow;
use clap::Args;
use proto::ctl::{DeviceStats, Request, Response};
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  softroce stat\n  softroce stat srxe0 -j\n  softroce stat srxe0 qp 65553\n  softroce stat srxe0 -w 1"
)]
pub struct StatArgs {
    /// [NAME] [qp QPN]: one device (default: all), one of its QPs. `show` and `link`, as
    /// `rdma statistic show link rxe0/1` takes them, are accepted; a `/1` port suffix too.
    words: Vec<String>,
    /// JSON, one line.
    #[arg(short, long)]
    json: bool,
    /// Print the rates (per second) every SECONDS seconds, until interrupted.
    #[arg(short = 'w', long = "watch", value_name = "SECONDS")]
    watch: Option<f64>,
    #[arg(long)]
    socket: Option<PathBuf>,
}

/// `(device, qpn)` from the positional words.
fn parse_words(words: &[String]) -> Result<(Option<String>, Option<u32>), String> {
    let mut device = None;
    let mut qpn = None;
    let mut it = words.iter();
    while let Some(w) = it.next() {
        match w.as_str() {
            "show" | "link" | "mode" => {}
            "qp" => {
                let v = it.next().ok_or("`qp` needs a QP number")?;
                qpn = Some(parse_qpn(v)?);
            }
            name if device.is_none() => {
                device = Some(name.strip_suffix("/1").unwrap_or(name).to_string());
            }
            other => return Err(format!("unexpected word {other:?}")),
        }
    }
    Ok((device, qpn))
}

/// A QPN in decimal or 0x-hex.
pub fn parse_qpn(v: &str) -> Result<u32, String> {
    let n = match v.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16),
        None => v.parse(),
    };
    n.ok()
        .filter(|n| *n <= 0x00ff_ffff)
        .ok_or_else(|| format!("{v:?} is not a QP number"))
}

fn fetch(
    s: &mut Session,
    device: &Option<String>,
    qpn: Option<u32>,
) -> Result<Vec<DeviceStats>, Failure> {
    match s.ask(&Request::Stat {
        device: device.clone(),
        qpn,
    })? {
        Response::Stats(st) => Ok(st),
        other => Err(unexpected(other)),
    }
}

pub fn run(args: StatArgs) -> CliResult {
    let (device, qpn) = parse_words(&args.words).map_err(|e| Failure::usage(anyhow!(e)))?;
    let mut s = Session::open(args.socket.as_deref(), "stat")?;
    let first = fetch(&mut s, &device, qpn)?;
    if qpn.is_some() && first.iter().all(|d| d.qps.is_empty()) {
        return Err(Failure::failed(anyhow!(
            "no QP {} on {}",
            qpn.unwrap_or(0),
            device.as_deref().unwrap_or("any device")
        )));
    }
    let Some(every) = args.watch else {
        if args.json {
            print_json(&Value::Array(
                first.iter().map(|d| stats_json(d, qpn.is_some())).collect(),
            ));
        } else {
            for d in &first {
                print!("{}", stats_text(d, qpn.is_some()));
            }
        }
        return Ok(());
    };
    if !(every > 0.0 && every.is_finite()) {
        return Err(Failure::usage(anyhow!(
            "-w needs a positive number of seconds"
        )));
    }
    let mut before = first;
    let mut at = Instant::now();
    loop {
        std::thread::sleep(Duration::from_secs_f64(every));
        let now_stats = fetch(&mut s, &device, qpn)?;
        let now = Instant::now();
        let secs = (now - at).as_secs_f64();
        let rates: Vec<Value> = now_stats
            .iter()
            .map(|d| {
                rates_json(
                    before.iter().find(|b| b.device == d.device),
                    d,
                    secs,
                    qpn.is_some(),
                )
            })
            .collect();
        if args.json {
            print_json(&Value::Array(rates));
        } else {
            for r in &rates {
                println!("{}", rates_text(r));
            }
        }
        use std::io::Write;
        let _ = std::io::stdout().flush();
        (before, at) = (now_stats, now);
    }
}

/// The counters shown: the QP's when one was asked for, else the device's and its net's.
fn shown(d: &DeviceStats, per_qp: bool) -> Vec<(String, u64)> {
    if per_qp {
        d.qps
            .first()
            .map(|q| q.counters.clone())
            .unwrap_or_default()
    } else {
        d.counters.iter().chain(&d.net).cloned().collect()
    }
}

pub fn stats_json(d: &DeviceStats, per_qp: bool) -> Value {
    let mut m = Map::new();
    m.insert("ifname".into(), json!(d.device));
    m.insert("port".into(), json!(1));
    if per_qp {
        if let Some(q) = d.qps.first() {
            m.insert("lqpn".into(), json!(q.qpn));
            m.insert("pid".into(), json!(q.pid));
            m.insert("comm".into(), json!(q.comm));
            for (k, v) in &q.counters {
                m.insert(k.clone(), json!(v));
            }
        }
    } else {
        for (k, v) in &d.counters {
            m.insert(k.clone(), json!(v));
        }
        let net: Map<String, Value> = d.net.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
        m.insert("net".into(), Value::Object(net));
    }
    Value::Object(m)
}

pub fn stats_text(d: &DeviceStats, per_qp: bool) -> String {
    let mut out = format!("link {}/1", d.device);
    if per_qp {
        if let Some(q) = d.qps.first() {
            out += &format!(" lqpn {} pid {} comm {}", q.qpn, q.pid, q.comm);
        }
    }
    for (k, v) in shown(d, per_qp) {
        out += &format!(" {k} {v}");
    }
    out + "\n"
}

fn rates_json(before: Option<&DeviceStats>, now: &DeviceStats, secs: f64, per_qp: bool) -> Value {
    let old = before.map(|b| shown(b, per_qp)).unwrap_or_default();
    let mut m = Map::new();
    m.insert("ifname".into(), json!(now.device));
    m.insert("interval".into(), json!(secs));
    let mut rates = Map::new();
    for (k, v) in shown(now, per_qp) {
        let was = old.iter().find(|(n, _)| *n == k).map_or(v, |(_, x)| *x);
        let delta = v.saturating_sub(was);
        if delta > 0 {
            rates.insert(k, json!((delta as f64 / secs * 10.0).round() / 10.0));
        }
    }
    m.insert("rates".into(), Value::Object(rates));
    Value::Object(m)
}

fn rates_text(r: &Value) -> String {
    let mut out = format!("link {}/1", r["ifname"].as_str().unwrap_or("?"));
    match r["rates"].as_object() {
        Some(rates) if !rates.is_empty() => {
            for (k, v) in rates {
                out += &format!(" {k} {v}/s");
            }
        }
        _ => out += " idle",
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn words_name_a_device_and_a_qp() {
        assert_eq!(parse_words(&w("")), Ok((None, None)));
        assert_eq!(
            parse_words(&w("show link srxe0/1 qp 0x11")),
            Ok((Some("srxe0".into()), Some(0x11)))
        );
        assert_eq!(
            parse_words(&w("srxe1 qp 65553")),
            Ok((Some("srxe1".into()), Some(65553)))
        );
        assert!(parse_words(&w("srxe0 qp")).is_err());
        assert!(parse_words(&w("srxe0 qp 0x1000000")).is_err());
        assert!(parse_words(&w("a b")).is_err());
    }

    #[test]
    fn rates_are_per_second_and_only_what_moved() {
        let mk = |sent| DeviceStats {
            device: "srxe0".into(),
            counters: vec![("sent_pkts".into(), sent), ("rcvd_pkts".into(), 5)],
            net: vec![],
            qps: vec![],
        };
        let r = rates_json(Some(&mk(10)), &mk(30), 2.0, false);
        assert_eq!(r["rates"]["sent_pkts"], json!(10.0));
        assert!(r["rates"].get("rcvd_pkts").is_none());
        assert_eq!(rates_text(&r), "link srxe0/1 sent_pkts 10.0/s");
        assert_eq!(
            stats_text(&mk(1), false),
            "link srxe0/1 sent_pkts 1 rcvd_pkts 5\n"
        );
        assert_eq!(stats_json(&mk(1), false)["sent_pkts"], json!(1));
    }
}
