//! `softroce link add|del|set|show`: devices on a running daemon, in the look of `rdma link`.

use super::{gid_addr, gid_string, print_json, unexpected, CliResult, Failure, Session};
use anyhow::anyhow;
use clap::Subcommand;
use proto::ctl::{LinkInfo, LinkSpec, Request, Response};
use serde_json::json;
use std::path::PathBuf;

#[derive(Subcommand, Debug)]
pub enum LinkCommand {
    /// Create a device on the running daemon: at once listed by `ibv_devices` and usable.
    ///
    /// Words, as `rdma link add`: `addr ADDR...` (IPv4 or IPv6, one or more), `netdev IFACE`
    /// (all of its addresses, followed as they change), `tap TAP` (RoCE v1 on a TAP device),
    /// `roce v1|v2|both`, `mtu 256..4096`; `type rxe` is accepted and ignored.
    ///
    /// Example: softroce link add srxe1 addr 127.0.0.2 ::1 mtu 1024 --save
    #[command(verbatim_doc_comment)]
    Add {
        /// The new device's name.
        name: String,
        /// What it serves: addr ADDR... | netdev IFACE | tap TAP, then roce, mtu.
        #[arg(required = true, num_args = 1..)]
        words: Vec<String>,
        /// Also write the device into the daemon's TOML config (its --config file).
        #[arg(long)]
        save: bool,
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Delete a device: contexts open on it get IBV_EVENT_DEVICE_FATAL, the daemon and its
    /// other devices carry on.
    ///
    /// Example: softroce link del srxe1 --save
    #[command(verbatim_doc_comment)]
    Del {
        name: String,
        /// Also remove the device from the daemon's TOML config.
        #[arg(long)]
        save: bool,
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Take a device's port down or bring it back up, as a pulled cable and a plugged one:
    /// down, every context gets IBV_EVENT_PORT_ERR, ibv_query_port says PORT_DOWN, nothing
    /// is sent or received (RC requests end in retry-exceeded errors, as on hardware) and
    /// link_downed counts it; up, IBV_EVENT_PORT_ACTIVE. A device that follows a netdev is
    /// also down while the netdev is down or has no carrier.
    ///
    /// Example: softroce link set srxe0 down
    #[command(verbatim_doc_comment)]
    Set {
        name: String,
        /// up or down.
        #[arg(value_parser = ["up", "down"])]
        state: String,
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Show devices: state, netdev, addresses, GIDs with their types, mode, MTU, congestion
    /// control, and the peers met in the capability exchange (softroce: selective
    /// retransmission, gso4 = IPv4 GSO on any path; other: sent exactly what rxe sends;
    /// asking: a probe is out).
    ///
    /// Example: softroce link show srxe0 -j
    #[command(verbatim_doc_comment)]
    Show {
        /// One device (default: all).
        name: Option<String>,
        /// JSON, one line.
        #[arg(short, long)]
        json: bool,
        #[arg(long)]
        socket: Option<PathBuf>,
    },
}

/// Reads `rdma link add`-style words into a device spec.
pub fn parse_spec(name: &str, words: &[String]) -> Result<LinkSpec, String> {
    let mut spec = LinkSpec {
        name: name.to_string(),
        ..LinkSpec::default()
    };
    let mut it = words.iter().peekable();
    let keyword = |w: &str| {
        matches!(
            w,
            "addr" | "netdev" | "tap" | "mac" | "roce" | "mtu" | "type"
        )
    };
    while let Some(w) = it.next() {
        let mut value = |what: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("`{w}` needs {what}"))
        };
        match w.as_str() {
            "addr" => {
                let mut any = false;
                while let Some(a) = it.peek().filter(|a| !keyword(a)) {
                    let ip = a.parse().map_err(|_| {
                        format!("{a:?} is not an IPv4 or IPv6 address (ADDR or ADDR/PREFIX)")
                    })?;
                    spec.addr.push(ip);
                    any = true;
                    it.next();
                }
                if !any {
                    return Err("`addr` needs one or more addresses".into());
                }
            }
            "netdev" => spec.netdev = Some(value("an interface name")?),
            "tap" => spec.tap = Some(value("a TAP interface name")?),
            "mac" => spec.mac = Some(value("an Ethernet address")?),
            "roce" => {
                let v = value("v1, v2 or both")?;
                if !matches!(v.as_str(), "v1" | "v2" | "both") {
                    return Err(format!("roce {v:?}: expected v1, v2 or both"));
                }
                spec.roce = Some(v);
            }
            "mtu" => {
                let v = value("a size")?;
                let m: u32 = v
                    .parse()
                    .map_err(|_| format!("mtu {v:?} is not a number"))?;
                if proto::ctl::mtu_enum(m).is_none() {
                    return Err(format!("mtu {m}: expected 256, 512, 1024, 2048 or 4096"));
                }
                spec.mtu = Some(m);
            }
            "type" => {
                value("a type")?;
            }
            other => {
                return Err(format!(
                    "unknown word {other:?} (expected addr, netdev, tap, mac, roce or mtu)"
                ))
            }
        }
    }
    if spec.addr.is_empty() && spec.netdev.is_none() && spec.tap.is_none() {
        return Err("a device needs addr ADDR..., netdev IFACE or tap TAP".into());
    }
    Ok(spec)
}

pub fn run(command: LinkCommand) -> CliResult {
    match command {
        LinkCommand::Add {
            name,
            words,
            save,
            socket,
        } => {
            let spec = parse_spec(&name, &words).map_err(|e| Failure::usage(anyhow!(e)))?;
            let mut s = Session::open(socket.as_deref(), "link add")?;
            match s.ask(&Request::LinkAdd { spec, save })? {
                Response::Done => Ok(()),
                other => Err(unexpected(other)),
            }
        }
        LinkCommand::Del { name, save, socket } => {
            let mut s = Session::open(socket.as_deref(), "link del")?;
            match s.ask(&Request::LinkDel { name, save })? {
                Response::Done => Ok(()),
                other => Err(unexpected(other)),
            }
        }
        LinkCommand::Set {
            name,
            state,
            socket,
        } => {
            let mut s = Session::open(socket.as_deref(), "link set")?;
            match s.ask(&Request::LinkSet {
                name,
                up: state == "up",
            })? {
                Response::Done => Ok(()),
                other => Err(unexpected(other)),
            }
        }
        LinkCommand::Show { name, json, socket } => {
            let mut s = Session::open(socket.as_deref(), "link show")?;
            let Response::Links(mut links) = s.ask(&Request::LinkShow)? else {
                return Err(Failure::failed(anyhow!(
                    "unexpected answer from the daemon"
                )));
            };
            if let Some(n) = &name {
                links.retain(|l| &l.info.name == n);
                if links.is_empty() {
                    return Err(Failure::failed(anyhow!("no device named {n}")));
                }
            }
            if json {
                print_json(&serde_json::Value::Array(
                    links.iter().map(link_json).collect(),
                ));
            } else {
                for l in &links {
                    print!("{}", link_text(l));
                }
            }
            Ok(())
        }
    }
}

fn modes(l: &LinkInfo) -> String {
    l.modes
        .iter()
        .map(|m| m.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The JSON of one device, with `rdma link -j`'s keys first.
pub fn link_json(l: &LinkInfo) -> serde_json::Value {
    json!({
        "ifname": l.info.name,
        "port": 1,
        "state": l.state,
        "down_because": l.down_because,
        "physical_state": if l.state == "ACTIVE" { "LINK_UP" } else { "DISABLED" },
        "netdev": l.info.netdevs.first(),
        "netdevs": l.info.netdevs,
        "node_guid": format!("{:016x}", l.info.node_guid),
        "addrs": l.addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "gids": l.info.gids.iter().map(|g| json!({
            "index": g.index,
            "gid": gid_string(&g.gid),
            "type": format!("RoCE {}", g.roce),
            "addr": gid_addr(&g.gid).to_string(),
        })).collect::<Vec<_>>(),
        "mode": modes(l),
        "default_roce_mode": l.default_roce_mode.to_string(),
        "mtu": l.mtu,
        "active_mtu": 128u32 << l.info.active_mtu,
        "congestion_control": l.congestion_control,
        "transport": l.transport,
        "gso": l.gso,
        "local_via_socket": l.local_via_socket,
        "clients": l.clients,
        "peers": l.peers.iter().map(|p| json!({
            "addr": p.addr.to_string(),
            "kind": p.kind,
            "selective": p.selective,
            "any_ident": p.any_ident,
        })).collect::<Vec<_>>(),
    })
}

pub fn link_text(l: &LinkInfo) -> String {
    let mut out = format!(
        "link {}/1 state {} physical_state {} netdev {} mode {} mtu {} cc {} clients {}\n",
        l.info.name,
        l.state,
        if l.state == "ACTIVE" {
            "LINK_UP"
        } else {
            "DISABLED"
        },
        l.info.netdevs.first().map_or("-", String::as_str),
        modes(l),
        l.mtu,
        l.congestion_control,
        l.clients,
    );
    if let Some(why) = &l.down_because {
        out += &format!("    down: {why}\n");
    }
    out += &format!(
        "    node_guid {:016x} addrs {}\n",
        l.info.node_guid,
        l.addrs
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    );
    for g in &l.info.gids {
        out += &format!(
            "    gid {} {} RoCE {} ({})\n",
            g.index,
            gid_string(&g.gid),
            g.roce,
            gid_addr(&g.gid)
        );
    }
    out += &format!(
        "    transport {}{}{}\n",
        l.transport.join(", "),
        if l.gso { " gso" } else { "" },
        if l.local_via_socket {
            " local-via-socket"
        } else {
            ""
        }
    );
    // What the capability exchange learnt: selective retransmission ("selective") and IPv4
    // GSO on any path ("gso4") toward softroce peers; "other" peers get what rxe sends.
    for p in &l.peers {
        out += &format!(
            "    peer {} {}{}{}\n",
            p.addr,
            p.kind,
            if p.selective { " selective" } else { "" },
            if p.any_ident { " gso4" } else { "" },
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn rdma_style_words_parse() {
        let s = parse_spec(
            "srxe1",
            &words("type rxe addr 127.0.0.2 ::1 mtu 1024 roce v2"),
        )
        .unwrap();
        assert_eq!(s.addr.len(), 2);
        assert_eq!((s.mtu, s.roce.as_deref()), (Some(1024), Some("v2")));
        let s = parse_spec("srxe2", &words("netdev eth0")).unwrap();
        assert_eq!(s.netdev.as_deref(), Some("eth0"));
        for bad in [
            "",
            "addr",
            "addr nope",
            "mtu 1500 addr 1.2.3.4",
            "roce v3 addr ::1",
            "color red",
        ] {
            assert!(parse_spec("x", &words(bad)).is_err(), "{bad:?}");
        }
    }
}
