//! `softroce res show [qp|cq|mr|pd|srq|cm_id] [-j]`: the daemon's resources, in the shape of
//! `rdma resource show`, each with the pid and command of the process that owns it. Without a
//! kind: the devices and one line per client process with what it holds.

use super::{print_json, unexpected, CliResult, Session};
use clap::Subcommand;
use proto::ctl::{Request, ResDetail, ResKind, Response};
use serde_json::{json, Value};
use std::path::PathBuf;

#[derive(Subcommand, Debug)]
pub enum ResCommand {
    /// Devices and, per client process, the resources it holds; or one kind of resource,
    /// one line each, with its owner's pid and command (pdn, cqn, mrn and srqn are numbered
    /// on the device, unique across processes).
    ///
    /// Examples:
    ///   softroce res show
    ///   softroce res show qp
    ///   softroce res show mr -j
    #[command(verbatim_doc_comment)]
    Show {
        /// qp, cq, mr, pd, srq or cm_id.
        kind: Option<ResKind>,
        /// JSON, one line.
        #[arg(short, long)]
        json: bool,
        #[arg(long)]
        socket: Option<PathBuf>,
    },
}

pub fn run(command: ResCommand) -> CliResult {
    let ResCommand::Show { kind, json, socket } = command;
    let mut s = Session::open(socket.as_deref(), "res show")?;
    let Some(kind) = kind else {
        return summary(&mut s, json);
    };
    let Response::ResDetail(d) = s.ask(&Request::ResDetail { kind })? else {
        return Err(super::Failure::failed(anyhow::anyhow!(
            "unexpected answer from the daemon"
        )));
    };
    let rows = rows(&d);
    if json {
        print_json(&Value::Array(rows.into_iter().map(|r| r.0).collect()));
    } else {
        for (_, line) in rows {
            println!("{line}");
        }
    }
    Ok(())
}

fn summary(s: &mut Session, json: bool) -> CliResult {
    let Response::Resources { devices, clients } = s.ask(&Request::ResShow)? else {
        return Err(unexpected(Response::Done));
    };
    let Response::Congestion(congestion) = s.ask(&Request::CongestionShow)? else {
        return Err(unexpected(Response::Done));
    };
    if json {
        print_json(&json!({
            "devices": devices,
            "congestion": congestion,
            "clients": clients.iter().map(|c| json!({
                "client": c.client, "pid": c.pid, "uid": c.uid, "comm": c.program,
                "pd": c.pds, "mr": c.mrs, "cq": c.cqs, "qp": c.qps, "srq": c.srqs,
                "ah": c.ahs, "mw": c.mws,
            })).collect::<Vec<_>>(),
        }));
        return Ok(());
    }
    println!("devices: {}", devices.join(" "));
    println!(
        "{:>6} {:>8} {:>6}  {:<24} {:>4} {:>6} {:>4} {:>6} {:>4} {:>4} {:>4}",
        "client", "pid", "uid", "program", "pd", "mr", "cq", "qp", "srq", "ah", "mw"
    );
    for c in clients {
        println!(
            "{:>6} {:>8} {:>6}  {:<24} {:>4} {:>6} {:>4} {:>6} {:>4} {:>4} {:>4}",
            c.client, c.pid, c.uid, c.program, c.pds, c.mrs, c.cqs, c.qps, c.srqs, c.ahs, c.mws
        );
    }
    for d in &congestion {
        print!("{}", congestion_table(d));
    }
    Ok(())
}

/// The congestion-control part of `softroce res show`: algorithm, counters, then one line
/// per QP with its rate.
fn congestion_table(d: &proto::ctl::DeviceCongestion) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let counters: Vec<String> = d.counters.iter().map(|(n, v)| format!("{n} {v}")).collect();
    let _ = writeln!(
        out,
        "congestion control on {}: {}; {}",
        d.device,
        d.algorithm,
        counters.join(", ")
    );
    if !d.qps.is_empty() {
        let _ = writeln!(
            out,
            "{:>6} {:>8} {:>14} {:>14} {:>6} {:>5}",
            "client", "qpn", "rate Mbit/s", "target Mbit/s", "alpha", "paced"
        );
    }
    for q in &d.qps {
        let _ = writeln!(
            out,
            "{:>6} {:>#8x} {:>14.3} {:>14.3} {:>6.3} {:>5}",
            q.client,
            q.qpn,
            q.rate_bps as f64 / 1e6,
            q.target_bps as f64 / 1e6,
            f64::from(q.alpha_1024) / 1024.0,
            if q.paced { "yes" } else { "no" }
        );
    }
    if d.qps_not_shown > 0 {
        let _ = writeln!(out, "({} more QPs not shown)", d.qps_not_shown);
    }
    out
}

/// Each resource as (JSON object, text line), `rdma resource show`'s keys and order.
pub fn rows(d: &ResDetail) -> Vec<(Value, String)> {
    let mut out = Vec::new();
    for q in &d.qps {
        out.push((
            json!({
                "ifname": q.owner.device, "port": 1, "lqpn": q.qpn, "rqpn": q.dest_qpn,
                "type": q.qp_type, "state": q.state, "rq-psn": q.rq_psn, "sq-psn": q.sq_psn,
                "path-mtu": q.path_mtu, "pdn": q.pd, "send-cqn": q.send_cq,
                "recv-cqn": q.recv_cq, "srqn": q.srq, "pid": q.owner.pid, "comm": q.owner.comm,
            }),
            format!(
                "link {}/1 lqpn {} rqpn {} type {} state {} rq-psn {} sq-psn {} path-mtu {} pdn {} pid {} comm {}",
                q.owner.device, q.qpn, q.dest_qpn, q.qp_type, q.state, q.rq_psn, q.sq_psn,
                q.path_mtu, q.pd, q.owner.pid, q.owner.comm
            ),
        ));
    }
    for c in &d.cqs {
        out.push((
            json!({
                "ifname": c.owner.device, "cqn": c.cqn, "cqe": c.cqe, "users": c.users,
                "pid": c.owner.pid, "comm": c.owner.comm,
            }),
            format!(
                "dev {} cqn {} cqe {} users {} pid {} comm {}",
                c.owner.device, c.cqn, c.cqe, c.users, c.owner.pid, c.owner.comm
            ),
        ));
    }
    for m in &d.mrs {
        out.push((
            json!({
                "ifname": m.owner.device, "mrn": m.mrn, "rkey": format!("{:#x}", m.rkey),
                "lkey": format!("{:#x}", m.lkey), "iova": format!("{:#x}", m.iova),
                "mrlen": m.length, "access": format!("{:#x}", m.access), "pdn": m.pd,
                "pid": m.owner.pid, "comm": m.owner.comm,
            }),
            format!(
                "dev {} mrn {} rkey {:#x} lkey {:#x} iova {:#x} mrlen {} pdn {} pid {} comm {}",
                m.owner.device,
                m.mrn,
                m.rkey,
                m.lkey,
                m.iova,
                m.length,
                m.pd,
                m.owner.pid,
                m.owner.comm
            ),
        ));
    }
    for p in &d.pds {
        out.push((
            json!({
                "ifname": p.owner.device, "pdn": p.pdn, "users": p.users,
                "pid": p.owner.pid, "comm": p.owner.comm,
            }),
            format!(
                "dev {} pdn {} users {} pid {} comm {}",
                p.owner.device, p.pdn, p.users, p.owner.pid, p.owner.comm
            ),
        ));
    }
    for s in &d.srqs {
        out.push((
            json!({
                "ifname": s.owner.device, "srqn": s.srqn, "type": "BASIC", "pdn": s.pd,
                "max-wr": s.max_wr, "posted": s.posted, "pid": s.owner.pid, "comm": s.owner.comm,
            }),
            format!(
                "dev {} srqn {} type BASIC pdn {} max-wr {} posted {} pid {} comm {}",
                s.owner.device, s.srqn, s.pd, s.max_wr, s.posted, s.owner.pid, s.owner.comm
            ),
        ));
    }
    for c in &d.cm_ids {
        let addr = |a: &Option<std::net::SocketAddr>| a.map_or("-".to_string(), |a| a.to_string());
        let dev = if c.owner.device.is_empty() {
            "-".to_string()
        } else {
            format!("{}/1", c.owner.device)
        };
        out.push((
            json!({
                "ifname": c.owner.device, "cm-idn": c.id, "lqpn": c.qpn, "qp-type": c.qp_type,
                "state": c.state, "ps": c.ps, "src-addr": c.src_addr.map(|a| a.to_string()),
                "dst-addr": c.dst_addr.map(|a| a.to_string()), "pid": c.owner.pid,
                "comm": c.owner.comm,
            }),
            format!(
                "link {dev} cm-idn {} lqpn {} qp-type {} state {} ps {} pid {} comm {} src-addr {} dst-addr {}",
                c.id, c.qpn, c.qp_type, c.state, c.ps, c.owner.pid, c.owner.comm,
                addr(&c.src_addr), addr(&c.dst_addr)
            ),
        ));
    }
    out
}
