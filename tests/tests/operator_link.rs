//! `softroce link add|del|show` on a running daemon, with unmodified programs: a device added
//! at run time is listed by `ibv_devices` and carries a pingpong; a device deleted while a
//! program holds a context on it gives that context IBV_EVENT_DEVICE_FATAL while the daemon,
//! its other device and the program's context there carry on; `link show -j` is JSON with the
//! device's state, addresses, GIDs and their types, mode, MTU and congestion control; `--save`
//! edits the TOML config.

mod shim_support;

use shim_support::netns::{listening, Netns};
use shim_support::operator::{counters, delta, softroce, softroce_json, softroce_ok, ProgramPair};
use shim_support::programs::{assert_fails_saying, loopback_daemon, rping_client, scratch, Logged};
use shim_support::{compile_c, require_program, Daemon};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn a_device_added_at_run_time_is_listed_and_carries_a_pingpong() {
    let d = loopback_daemon("op-link-add", 101);
    let before = d.run_preloaded(&require_program("ibv_devices"), &[]);
    assert!(!before.contains("srxe1"), "{before}");
    softroce_ok(
        &d,
        &[
            "link",
            "add",
            "srxe1",
            "type",
            "rxe",
            "addr",
            "127.0.0.102",
            "mtu",
            "2048",
        ],
    );
    let listed = d.run_preloaded(&require_program("ibv_devices"), &[]);
    for name in ["srxe0", "srxe1"] {
        assert!(
            listed.split_whitespace().any(|w| w == name),
            "ibv_devices does not list {name}:\n{listed}"
        );
    }
    ProgramPair::start(
        &d,
        &d,
        "ibv_rc_pingpong",
        19501,
        &["-d", "srxe1", "-g", "0", "-n", "50"],
        "link-add",
    )
    .succeed(Duration::from_secs(60), &d);

    let links = softroce_json(&d, &["link", "show"]);
    let links = links.as_array().expect("an array of devices");
    assert_eq!(links.len(), 2, "{links:?}");
    let l = links
        .iter()
        .find(|l| l["ifname"] == "srxe1")
        .expect("srxe1 shown");
    assert_eq!(l["state"], "ACTIVE");
    assert_eq!(l["port"], 1);
    assert_eq!(l["addrs"], serde_json::json!(["127.0.0.102"]));
    assert_eq!(l["mode"], "v2");
    assert_eq!(l["mtu"], 2048);
    assert_eq!(
        l["congestion_control"], "dcqcn",
        "the default, as for --addr devices"
    );
    let gid = &l["gids"][0];
    assert_eq!(gid["index"], 0);
    assert_eq!(gid["type"], "RoCE v2");
    assert_eq!(gid["gid"], "0000:0000:0000:0000:0000:ffff:7f00:0066");
    assert_eq!(gid["addr"], "127.0.0.102");
    assert!(l["node_guid"].as_str().is_some_and(|g| g.len() == 16));
    assert!(l.get("netdev").is_some() && l.get("transport").is_some());
    // One device, and the plain form.
    let one = softroce_json(&d, &["link", "show", "srxe0"]);
    assert_eq!(one.as_array().map(Vec::len), Some(1));
    let text = softroce_ok(&d, &["link", "show"]);
    assert!(text.contains("link srxe1/1 state ACTIVE"), "{text}");

    // Refusals: a name in use is refused by the daemon (1), bad words by the command (2).
    assert_eq!(
        softroce(&d, &["link", "add", "srxe1", "addr", "127.0.0.103"])
            .status
            .code(),
        Some(1)
    );
    assert_eq!(
        softroce(&d, &["link", "add", "srxe2", "mtu", "1500"])
            .status
            .code(),
        Some(2)
    );
    assert_eq!(
        softroce(&d, &["link", "del", "nosuch"]).status.code(),
        Some(1)
    );
}

/// Opens `argv[1]` and `argv[2]`, says ready, and waits for an async event on the first;
/// then destroys the first's completion channel and uses the second.
const HOLDER: &str = r#"
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <infiniband/verbs.h>

static struct ibv_context *open_named(const char *name) {
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    struct ibv_context *ctx = NULL;
    for (int i = 0; list && i < n; i++)
        if (!strcmp(ibv_get_device_name(list[i]), name))
            ctx = ibv_open_device(list[i]);
    if (list) ibv_free_device_list(list);
    return ctx;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    struct ibv_context *doomed = open_named(argv[1]), *other = open_named(argv[2]);
    if (!doomed || !other) { printf("FAIL open (errno %d)\n", errno); return 1; }
    struct ibv_pd *pd = ibv_alloc_pd(doomed);
    struct ibv_comp_channel *channel = ibv_create_comp_channel(doomed);
    if (!pd || !channel) { printf("FAIL pd or channel\n"); return 1; }
    printf("ready\n");
    fflush(stdout);
    struct pollfd p = { .fd = doomed->async_fd, .events = POLLIN };
    if (poll(&p, 1, 20000) != 1) { printf("FAIL no async event\n"); return 1; }
    struct ibv_async_event ev;
    if (ibv_get_async_event(doomed, &ev)) { printf("FAIL get event\n"); return 1; }
    printf("event %d %s\n", (int)ev.event_type, ibv_event_type_str(ev.event_type));
    ibv_ack_async_event(&ev);
    struct ibv_pd *late = ibv_alloc_pd(doomed);
    printf("alloc on the deleted device %s\n", late ? "succeeded" : "failed");
    printf("destroy its channel: %d\n", ibv_destroy_comp_channel(channel));
    struct ibv_pd *fine = ibv_alloc_pd(other);
    printf("alloc on the other device %s\n", fine ? "succeeded" : "failed");
    fflush(stdout);
    char line[8];
    if (!fgets(line, sizeof line, stdin)) return 1;
    if (fine) ibv_dealloc_pd(fine);
    ibv_close_device(other);
    ibv_close_device(doomed);
    return 0;
}
"#;

#[test]
fn deleting_a_device_in_use_is_fatal_to_its_contexts_only() {
    let exe = compile_c("op_link_holder", HOLDER, &["ibverbs"]);
    let d = loopback_daemon("op-link-del", 105);
    softroce_ok(&d, &["link", "add", "srxe1", "addr", "127.0.0.106"]);
    let mut holder = d
        .command(&exe)
        .args(["srxe1", "srxe0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the holder");
    let mut out = BufReader::new(holder.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n", "{}", d.log());
    softroce_ok(&d, &["link", "del", "srxe1"]);
    let mut lines = Vec::new();
    for _ in 0..4 {
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        lines.push(l.trim_end().to_string());
    }
    holder.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let status = holder.wait().unwrap();
    assert_eq!(
        lines,
        [
            "event 8 local catastrophic error",
            "alloc on the deleted device failed",
            // rdma-core closes a channel's descriptor and never fails the destroy (but with
            // EBUSY while CQs use it), disassociated device or not.
            "destroy its channel: 0",
            "alloc on the other device succeeded",
        ],
        "{}",
        d.log()
    );
    assert!(status.success());
    // The daemon carries on with its other device.
    let links = softroce_json(&d, &["link", "show"]);
    let names: Vec<&str> = links
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l["ifname"].as_str())
        .collect();
    assert_eq!(names, ["srxe0"]);
    ProgramPair::start(
        &d,
        &d,
        "ibv_rc_pingpong",
        19502,
        &["-d", "srxe0", "-g", "0", "-n", "20"],
        "link-del",
    )
    .succeed(Duration::from_secs(60), &d);
    // The name can be used again.
    softroce_ok(&d, &["link", "add", "srxe1", "addr", "127.0.0.106"]);
}

/// After `link del` of a device a program is using, its destroy verbs fail with EIO, as
/// rdma-core's do after a kernel device's removal; with `RDMAV_ALLOW_DISASSOC_DESTROY` set they
/// succeed and free what the program holds (libibverbs' rule for a disassociated device). An
/// unmodified `ib_write_bw` whose device is deleted mid-run: "Couldn't destroy QP -
/// Input/output error" and exit 1, or a clean exit 0.
#[test]
fn destroys_after_the_device_is_deleted_fail_unless_the_program_allows_them() {
    let d = loopback_daemon("op-link-disassoc", 148);
    for (allow, port) in [(false, 19583u16), (true, 19584)] {
        softroce_ok(&d, &["link", "add", "srxe1", "addr", "127.0.0.149"]);
        let env: &[(&str, &str)] = if allow {
            &[("RDMAV_ALLOW_DISASSOC_DESTROY", "1")]
        } else {
            &[]
        };
        let pair = ProgramPair::start_with_env(
            &d,
            &d,
            "ib_write_bw",
            port,
            &["-d", "srxe1", "-x", "0", "-F", "-D", "4"],
            &format!("disassoc-{allow}"),
            env,
        );
        // Both QPs are connected (the run is on: the sender's in RTS, the passive side's in
        // RTR) before the device goes.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let qps = softroce_json(&d, &["res", "show", "qp"]);
            let on = qps.as_array().map_or(0, |q| {
                q.iter()
                    .filter(|q| q["ifname"] == "srxe1" && q["rqpn"].as_u64().is_some())
                    .filter(|q| q["state"] == "RTS" || q["state"] == "RTR")
                    .count()
            });
            if on == 2 {
                break;
            }
            assert!(Instant::now() < deadline, "never connected: {qps}");
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(500));
        softroce_ok(&d, &["link", "del", "srxe1"]);
        let (server_ok, client_ok, report) = pair.finish(Duration::from_secs(60));
        if allow {
            assert!(server_ok && client_ok, "{report}");
            assert!(!report.contains("Input/output error"), "{report}");
        } else {
            assert!(!server_ok && !client_ok, "{report}");
            assert!(
                report.contains("Couldn't destroy QP - Input/output error"),
                "{report}"
            );
        }
    }
}

#[test]
fn save_writes_added_and_deleted_devices_into_the_config() {
    let dir = shim_support::programs::scratch("operator", "link-save");
    let config = dir.join("softroce.toml");
    std::fs::write(
        &config,
        "# my devices\n[[device]]\nname = \"srxe0\"\naddr = [\"127.0.0.107\"]\n",
    )
    .unwrap();
    let d = Daemon::start(
        "op-link-save",
        &["--config", config.to_str().unwrap(), "--port", "4791"],
    );
    softroce_ok(
        &d,
        &[
            "link",
            "add",
            "srxe1",
            "addr",
            "127.0.0.108",
            "::1",
            "--save",
        ],
    );
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.starts_with("# my devices\n"), "{text}");
    assert!(
        text.contains("name = \"srxe1\"") && text.contains("\"127.0.0.108\", \"::1\""),
        "{text}"
    );
    // Without --save the file is left alone.
    softroce_ok(&d, &["link", "add", "srxe2", "addr", "127.0.0.109"]);
    assert!(!std::fs::read_to_string(&config).unwrap().contains("srxe2"));
    softroce_ok(&d, &["link", "del", "srxe1", "--save"]);
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(!text.contains("srxe1") && text.contains("srxe0"), "{text}");
    // A daemon started from the saved file serves what it says.
    drop(d);
    let d = Daemon::start(
        "op-link-save-2",
        &["--config", config.to_str().unwrap(), "--port", "4791"],
    );
    let names: Vec<String> = softroce_json(&d, &["link", "show"])
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l["ifname"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(names, ["srxe0"]);
}

#[test]
fn json_logs_carry_the_spans_of_the_client_and_the_qp() {
    let d = Daemon::start(
        "op-logs-json",
        &[
            "--addr",
            "127.0.0.115",
            "--port",
            "4791",
            "--log-format",
            "json",
            "--log",
            "debug",
        ],
    );
    ProgramPair::start(
        &d,
        &d,
        "ibv_rc_pingpong",
        19503,
        &["-d", "srxe0", "-g", "0", "-n", "5"],
        "logs-json",
    )
    .succeed(Duration::from_secs(60), &d);
    let log = d.log();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let in_span = |name: &str| {
        lines.iter().any(|l| {
            l["spans"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| s["name"] == name))
        })
    };
    assert!(in_span("client"), "no line in a client span:\n{log}");
    assert!(in_span("qp"), "no line in a QP span:\n{log}");
    assert!(lines.iter().all(|l| l["level"].is_string()));
}

/// The devices of one daemon share UDP port 4791, as kernel rxe devices share it: a device of
/// fixed addresses beside a `netdev` device, which binds the wildcard address (the README's
/// example configuration), both start, and an unmodified pingpong runs from one to the other
/// (the kernel hands each datagram to the socket bound to its destination before the
/// wildcard one). A second `netdev` device on the port is refused, naming the clash. In a
/// network namespace the test makes: a veth pair, one end 10.79.0.1/24.
#[test]
fn a_device_of_fixed_addresses_and_a_netdev_device_share_the_port() {
    let (_ns, d, dir) = veth_daemon(
        "port-share",
        ["srs0", "srs1"],
        "10.79.0.1/24",
        "[[device]]\nname = \"srxe0\"\naddr = [\"127.0.0.1\"]\n\
         [[device]]\nname = \"srxe1\"\nnetdev = \"srs0\"\n",
    );
    // The netdev device learns its interface's addresses within its 2 s re-read.
    let deadline = Instant::now() + Duration::from_secs(15);
    let gid = loop {
        let shown = softroce_json(&d, &["link", "show", "srxe1"]);
        let found = shown[0]["gids"].as_array().and_then(|g| {
            g.iter()
                .find(|g| g["addr"] == "10.79.0.1")
                .and_then(|g| g["index"].as_u64())
        });
        if let Some(i) = found {
            break i.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "srxe1 never had 10.79.0.1: {shown}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let before = counters(&d, "srxe1");
    let program = require_program("ibv_rc_pingpong");
    let mut server = d.command(&program);
    server.args(["-d", "srxe1", "-g", &gid, "-p", "19582", "-n", "50"]);
    let mut server = Logged::spawn(server, dir.join("server.log"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !listening(server.child.id(), 19582) {
        assert!(
            server.wait_for(Duration::ZERO).is_none() && Instant::now() < deadline,
            "server never listened:\n{}",
            server.output()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut client = d.command(&program);
    client.args([
        "-d",
        "srxe0",
        "-g",
        "0",
        "-p",
        "19582",
        "-n",
        "50",
        "10.79.0.1",
    ]);
    let mut client = Logged::spawn(client, dir.join("client.log"));
    let t0 = Instant::now();
    let c = client.wait_for(Duration::from_secs(60));
    let took = t0.elapsed();
    let s = server.wait_for(Duration::from_secs(20));
    let report = format!(
        "--- server ({s:?})\n{}\n--- client ({c:?}, {took:?})\n{}\n--- daemon\n{}",
        server.output(),
        client.output(),
        d.log()
    );
    assert!(
        c.is_some_and(|c| c.success()) && s.is_some_and(|s| s.success()),
        "{report}"
    );
    assert!(client.output().contains(" iters in "), "{report}");
    // Through the netdev device's own (wildcard) socket.
    let received = delta(&before, &counters(&d, "srxe1"), "net.rx_packets");
    assert!(
        received >= 100,
        "srxe1 received {received} packets: {report}"
    );

    let out = softroce(&d, &["link", "add", "srxe2", "netdev", "srs0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("0.0.0.0:4791: address already bound by another device of this daemon")
            && err.contains("(Address already in use)"),
        "{err}"
    );
}

/// The C the watchers share: the headers, and `open_named`, which opens the device of that
/// name (NULL if there is none).
macro_rules! open_named_c {
    () => {
        r#"
#include <stdio.h>
#include <string.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>

static struct ibv_context *open_named(const char *name) {
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    struct ibv_context *ctx = NULL;
    for (int i = 0; list && i < n; i++)
        if (!strcmp(ibv_get_device_name(list[i]), name))
            ctx = ibv_open_device(list[i]);
    return ctx;
}
"#
    };
}

/// Opens `argv[1]`, says ready, then for each of two async events prints the event and the
/// port state `ibv_query_port` gives right after it (a program that learns the port went
/// down and looks for when it is back); then, at each line on its stdin, the port's active
/// MTU (which follows the netdev's MTU, with no event).
const PORT_WATCHER: &str = concat!(
    open_named_c!(),
    r#"
int main(int argc, char **argv) {
    if (argc != 2) return 2;
    struct ibv_context *ctx = open_named(argv[1]);
    if (!ctx) { printf("FAIL open\n"); return 1; }
    struct ibv_port_attr a;
    if (ibv_query_port(ctx, 1, &a)) { printf("FAIL query\n"); return 1; }
    printf("ready %s\n", ibv_port_state_str(a.state));
    fflush(stdout);
    for (int i = 0; i < 2; i++) {
        struct ibv_async_event ev;
        if (ibv_get_async_event(ctx, &ev)) { printf("FAIL get event\n"); return 1; }
        int port = ev.element.port_num;
        ibv_ack_async_event(&ev);
        if (ibv_query_port(ctx, 1, &a)) { printf("FAIL query\n"); return 1; }
        printf("%s port %d: %s phys %d\n", ibv_event_type_str(ev.event_type), port,
               ibv_port_state_str(a.state), (int)a.phys_state);
        fflush(stdout);
    }
    char line[8];
    while (fgets(line, sizeof line, stdin)) {
        if (ibv_query_port(ctx, 1, &a)) { printf("FAIL query\n"); return 1; }
        printf("active_mtu %d\n", (int)a.active_mtu);
        fflush(stdout);
    }
    ibv_close_device(ctx);
    return 0;
}
"#
);

/// A program's output lines as they come (stdout piped, read on a thread).
struct Lines {
    child: std::process::Child,
    rx: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Lines {
    fn spawn(mut cmd: std::process::Command) -> Lines {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the program");
        let out = BufReader::new(child.stdout.take().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines {
            child,
            rx,
            seen: Vec::new(),
        }
    }

    /// Waits (at most 20 s) for a line containing `what`; returns it.
    fn expect(&mut self, what: &str, daemon: &Daemon) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(what) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "no line with {what:?}; saw {:?}\n--- daemon\n{}",
                    self.seen,
                    daemon.log()
                ),
            }
        }
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `ibv_asyncwatch` (unmodified; line-buffered by `stdbuf`, as a pipe would hold its lines)
/// on `device` of `daemon`.
fn asyncwatch(daemon: &Daemon, device: &str) -> Lines {
    let mut cmd = daemon.command(&require_program("stdbuf"));
    cmd.args(["-oL"])
        .arg(require_program("ibv_asyncwatch"))
        .args(["-d", device]);
    let mut w = Lines::spawn(cmd);
    w.expect("async event FD", daemon);
    w
}

/// `ibv_devinfo -d DEVICE`'s port state line.
fn devinfo_state(daemon: &Daemon, device: &str) -> String {
    let out = daemon.run_preloaded(&require_program("ibv_devinfo"), &["-d", device]);
    out.lines()
        .find(|l| l.trim_start().starts_with("state:"))
        .unwrap_or_else(|| panic!("no state in ibv_devinfo:\n{out}"))
        .split_whitespace()
        .skip(1)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Waits until `link show srxe0` says `want` (at most 15 s, looking every 20 ms); how long
/// it took.
fn link_state_becomes(d: &Daemon, want: &str) -> Duration {
    let t0 = Instant::now();
    loop {
        let shown = softroce_json(d, &["link", "show", "srxe0"]);
        if shown[0]["state"] == want {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "srxe0 never {want}: {shown}\n--- daemon\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What programs see of srxe0's port going down (`down`) or coming back: `ibv_asyncwatch`
/// prints the event for port 1, the context holder (`PORT_WATCHER`, when there is one) reads
/// the new state from `ibv_query_port` right after the event, and `ibv_devinfo` says it.
fn port_change_seen(d: &Daemon, watch: &mut Lines, watcher: Option<&mut Lines>, down: bool) {
    let (event, query, devinfo) = if down {
        (
            "IBV_EVENT_PORT_ERR (10), port 1",
            "port error port 1: down phys 3",
            "PORT_DOWN (1)",
        )
    } else {
        (
            "IBV_EVENT_PORT_ACTIVE (9), port 1",
            "port active port 1: active phys 5",
            "PORT_ACTIVE (4)",
        )
    };
    watch.expect(event, d);
    if let Some(w) = watcher {
        assert_eq!(w.expect("port 1", d), query);
    }
    assert_eq!(devinfo_state(d, "srxe0"), devinfo);
}

/// `softroce link set srxe0 down` pulls the cable, as unmodified programs see it: an
/// `ib_write_bw` in full flight (on the same-host fast path) ends with "Failed status 12"
/// (transport retry counter exceeded, what an RC requester reports when its peer is
/// unreachable), `ibv_asyncwatch` prints IBV_EVENT_PORT_ERR for port 1, `ibv_devinfo` says
/// PORT_DOWN, and a program holding a context reads PORT_DOWN from `ibv_query_port` after
/// the event; `link set srxe0 up`: IBV_EVENT_PORT_ACTIVE, PORT_ACTIVE, and a pingpong runs.
/// `link_downed` counts one, the dropped packets are counted.
#[test]
fn a_port_set_down_is_a_pulled_cable_to_programs() {
    let d = loopback_daemon("op-link-set", 174);
    let exe = compile_c("op_port_watcher", PORT_WATCHER, &["ibverbs"]);
    let mut watch = asyncwatch(&d, "srxe0");
    let mut watcher = Lines::spawn({
        let mut c = d.command(&exe);
        c.arg("srxe0");
        c
    });
    watcher.expect("ready active", &d);
    assert_eq!(devinfo_state(&d, "srxe0"), "PORT_ACTIVE (4)");
    let before = counters(&d, "srxe0");
    let pair = ProgramPair::start(
        &d,
        &d,
        "ib_write_bw",
        19510,
        &["-d", "srxe0", "-x", "0", "-D", "30", "-s", "65536"],
        "link-set",
    );
    // In full flight first.
    let deadline = Instant::now() + Duration::from_secs(30);
    while delta(&before, &counters(&d, "srxe0"), "sent_bytes") < 64 << 20 {
        assert!(Instant::now() < deadline, "ib_write_bw never streamed");
        std::thread::sleep(Duration::from_millis(50));
    }
    softroce_ok(&d, &["link", "set", "srxe0", "down"]);
    port_change_seen(&d, &mut watch, Some(&mut watcher), true);
    let shown = softroce_json(&d, &["link", "show", "srxe0"]);
    assert_eq!(shown[0]["state"], "DOWN", "{shown}");
    assert_eq!(shown[0]["physical_state"], "DISABLED", "{shown}");
    // The operator is told why, by `link show` and by `doctor`.
    let text = softroce_ok(&d, &["link", "show", "srxe0"]);
    assert!(
        text.contains("down: set down by the operator (`softroce link set srxe0 up`"),
        "{text}"
    );
    let doctor = softroce(&d, &["doctor"]);
    let said = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        doctor.status.code() == Some(1)
            && said.contains("port DOWN: srxe0: set down by the operator"),
        "{said}"
    );
    let (_, client_ok, report) = pair.finish(Duration::from_secs(60));
    assert!(
        !client_ok && report.contains("Failed status 12"),
        "ib_write_bw did not fail with a retry error:\n{report}\n--- daemon\n{}",
        d.log()
    );

    softroce_ok(&d, &["link", "set", "srxe0", "up"]);
    port_change_seen(&d, &mut watch, Some(&mut watcher), false);
    ProgramPair::start(
        &d,
        &d,
        "ibv_rc_pingpong",
        19511,
        &["-d", "srxe0", "-g", "0", "-n", "50"],
        "link-set-up",
    )
    .succeed(Duration::from_secs(60), &d);
    let after = counters(&d, "srxe0");
    assert_eq!(delta(&before, &after, "link_downed"), 1, "{after:?}");
    assert!(
        delta(&before, &after, "retry_exceeded_err") >= 1,
        "{after:?}"
    );
    assert!(
        delta(&before, &after, "net.port_down_dropped") > 0,
        "{after:?}"
    );
    // Refusals: no such device (1), no such state (2).
    assert_eq!(
        softroce(&d, &["link", "set", "nosuch", "down"])
            .status
            .code(),
        Some(1)
    );
    assert_eq!(
        softroce(&d, &["link", "set", "srxe0", "sideways"])
            .status
            .code(),
        Some(2)
    );
}

/// A device that follows a netdev follows its carrier too, as kernel rxe's port does
/// (`rxe_notify`): the veth's peer set down takes the carrier away and the port down
/// (IBV_EVENT_PORT_ERR, PORT_DOWN), the peer up brings it back (IBV_EVENT_PORT_ACTIVE).
#[test]
fn a_netdev_device_goes_down_with_its_carrier() {
    let (ns, d, _) = netdev_daemon("port-carrier", ["src0", "src1"], "10.79.2.1/24");
    // How long the port took to follow each change (the daemon re-reads the netdev at
    // once on rtnetlink's word, and every 2 s regardless).
    let mut took = Vec::new();
    link_state_becomes(&d, "ACTIVE");
    let mut watch = asyncwatch(&d, "srxe0");
    let mut watcher = Lines::spawn({
        let mut c = d.command(&compile_c("op_port_watcher", PORT_WATCHER, &["ibverbs"]));
        c.arg("srxe0");
        c
    });
    watcher.expect("ready active", &d);
    ns.ip(&["link", "set", "src1", "down"]);
    took.push(link_state_becomes(&d, "DOWN"));
    port_change_seen(&d, &mut watch, Some(&mut watcher), true);
    let shown = softroce_json(&d, &["link", "show", "srxe0"]);
    assert!(
        shown[0]["down_because"]
            .as_str()
            .is_some_and(|w| w.starts_with("its netdev src0 is down or has no carrier")),
        "{shown}"
    );
    ns.ip(&["link", "set", "src1", "up"]);
    took.push(link_state_becomes(&d, "ACTIVE"));
    port_change_seen(&d, &mut watch, Some(&mut watcher), false);
    // The MTU follows the netdev's, seen by the open context: 1500 carries 1024 (3), 9000
    // carries 4096 (5), as rxe's `rxe_set_mtu`.
    let mut ask_mtu = |want: &str| {
        let t0 = Instant::now();
        loop {
            watcher
                .child
                .stdin
                .as_mut()
                .unwrap()
                .write_all(b"mtu\n")
                .unwrap();
            if watcher.expect("active_mtu", &d) == want {
                return t0.elapsed();
            }
            assert!(
                t0.elapsed() < Duration::from_secs(15),
                "never {want}: {:?}",
                watcher.seen
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    ask_mtu("active_mtu 3");
    // The veth's speed too (10 Gb/s: 1X FDR10, by the kernel's `ib_get_eth_speed`), read in
    // the daemon's namespace, not the host's /sys.
    let verbose = d.run_preloaded(&require_program("ibv_devinfo"), &["-d", "srxe0", "-v"]);
    assert!(
        verbose
            .lines()
            .any(|l| l.contains("active_speed:") && l.contains("10.0 Gbps")),
        "{verbose}"
    );
    ns.ip(&["link", "set", "src0", "mtu", "9000"]);
    let mtu_took = ask_mtu("active_mtu 5");
    drop(watcher);
    // Once more down and up.
    ns.ip(&["link", "set", "src1", "down"]);
    took.push(link_state_becomes(&d, "DOWN"));
    ns.ip(&["link", "set", "src1", "up"]);
    took.push(link_state_becomes(&d, "ACTIVE"));
    let shown = softroce_json(&d, &["stat", "srxe0"]);
    assert_eq!(shown[0]["link_downed"], 2, "{shown}");
    // Each change followed at once, as rxe's port follows its netdev's notifier, not at the
    // next 2 s re-read (which all five would beat by 600 ms once in 400 runs).
    took.push(mtu_took);
    assert!(
        took.iter().all(|t| *t < Duration::from_millis(600)),
        "{took:?}"
    );
}

/// Opens `argv[1]`, prints its GID table ("ready: INDEX=ADDRESS ..."), then at each async
/// event the event and the table `ibv_query_gid_ex` reads right after it.
const GID_WATCHER: &str = concat!(
    open_named_c!(),
    r#"
/* Port 1's GID table as ibv_query_gid_ex reads it now: " INDEX=ADDRESS" per entry. */
static void table(struct ibv_context *ctx, const char *what) {
    printf("%s:", what);
    for (int i = 0; i < 16; i++) {
        struct ibv_gid_entry e;
        char s[INET6_ADDRSTRLEN];
        if (ibv_query_gid_ex(ctx, 1, i, &e, 0)) continue;
        inet_ntop(AF_INET6, e.gid.raw, s, sizeof s);
        printf(" %d=%s", i, s);
    }
    printf("\n");
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    struct ibv_context *ctx = open_named(argv[1]);
    if (!ctx) { printf("FAIL open\n"); return 1; }
    table(ctx, "ready");
    for (;;) {
        struct ibv_async_event ev;
        char what[64];
        if (ibv_get_async_event(ctx, &ev)) { printf("FAIL get event\n"); return 1; }
        snprintf(what, sizeof what, "%s port %d", ibv_event_type_str(ev.event_type),
                 ev.element.port_num);
        ibv_ack_async_event(&ev);
        table(ctx, what);
    }
}
"#
);

/// `rping -c` (unmodified) to `addr`, port `port`, two pings: it must succeed.
fn rping_to(d: &Daemon, addr: &str, port: &str, log: std::path::PathBuf) {
    let mut cmd = d.command(&require_program("rping"));
    cmd.args(["-c", "-a", addr, "-p", port, "-v", "-C", "2"]);
    let mut client = Logged::spawn(cmd, log);
    let status = client.wait_for(Duration::from_secs(30));
    let out = client.output();
    assert!(
        status.is_some_and(|s| s.success()) && out.contains("ping data: rdma-ping-1"),
        "rping to {addr}: {status:?}\n{out}\n--- daemon\n{}",
        d.log()
    );
}

/// A device's GID table follows its netdev's addresses as the kernel's GID cache does
/// (`roce_gid_mgmt`, `ib_cache_gid_add`): an address added takes the lowest free index, one
/// removed leaves its slot empty while the others keep theirs (a running program's QPs and
/// AHs go on naming the same GIDs). Every open context gets IBV_EVENT_GID_CHANGE for port 1
/// (`ibv_asyncwatch`) and reads the new table from `ibv_query_gid_ex` at once; a running
/// rdma_cm server (`rping -s -P`, whose process made its first connection before the change)
/// accepts on the new address; `ibv_devinfo` in a new process shows the same indices.
#[test]
fn the_gid_table_follows_the_netdevs_addresses() {
    let (ns, d, dir) = netdev_daemon("gid-table", ["gsrc0", "gsrc1"], "10.79.4.1/24");
    link_state_becomes(&d, "ACTIVE");
    let mut watch = asyncwatch(&d, "srxe0");
    let mut watcher = Lines::spawn({
        let mut c = d.command(&compile_c("op_gid_watcher", GID_WATCHER, &["ibverbs"]));
        c.arg("srxe0");
        c
    });
    assert_eq!(watcher.expect("ready", &d), "ready: 0=::ffff:10.79.4.1");
    let mut server = d.command(&require_program("rping"));
    server.args(["-s", "-P", "-a", "0.0.0.0", "-p", "19583", "-v", "-C", "2"]);
    let _server = Logged::spawn(server, dir.join("server.log"));
    std::thread::sleep(Duration::from_millis(500));
    rping_to(&d, "10.79.4.1", "19583", dir.join("client1.log"));

    // Another subnet: a second address of 10.79.4.0/24 would be a secondary, which the
    // kernel removes with the primary.
    ns.ip(&["addr", "add", "10.79.5.9/24", "dev", "gsrc0"]);
    watch.expect("IBV_EVENT_GID_CHANGE (18), port 1", &d);
    watcher.expect(
        "GID table change port 1: 0=::ffff:10.79.4.1 1=::ffff:10.79.5.9",
        &d,
    );
    rping_to(&d, "10.79.5.9", "19583", dir.join("client2.log"));

    ns.ip(&["addr", "del", "10.79.4.1/24", "dev", "gsrc0"]);
    watch.expect("IBV_EVENT_GID_CHANGE (18), port 1", &d);
    watcher.expect("GID table change port 1: 1=::ffff:10.79.5.9", &d);
    let devinfo = d.run_preloaded(&require_program("ibv_devinfo"), &["-d", "srxe0", "-v"]);
    let gids: Vec<&str> = devinfo
        .lines()
        .filter(|l| l.contains("GID["))
        .map(str::trim)
        .collect();
    assert_eq!(
        gids,
        ["GID[  1]:\t\t::ffff:10.79.5.9, RoCE v2"],
        "{devinfo}"
    );
    rping_to(&d, "10.79.5.9", "19583", dir.join("client3.log"));

    // The slot left empty is the lowest free one for the next address.
    ns.ip(&["addr", "add", "10.79.6.7/24", "dev", "gsrc0"]);
    watcher.expect(
        "GID table change port 1: 0=::ffff:10.79.6.7 1=::ffff:10.79.5.9",
        &d,
    );
}

/// Address resolution asks the kernel's routing table first, as the kernel's `addr_resolve`
/// does: `rping -c` to an address no route reaches ends at once, its `rdma_resolve_addr`
/// failing with ENETUNREACH ("Network is unreachable"), as on kernel rxe, where it used to
/// resolve, send its REQs nowhere and wait for the CM's retries (a minute and more). An
/// address the route does reach still connects.
#[test]
fn a_peer_no_route_reaches_is_an_address_error_at_once() {
    let (_ns, d, dir) = netdev_daemon("noroute", ["nrsrc0", "nrsrc1"], "10.79.7.1/24");
    link_state_becomes(&d, "ACTIVE");
    let t0 = Instant::now();
    let log = dir.join("unrouted.log");
    let mut client = rping_client(&d, "10.79.99.9", &["-p", "19584"], log);
    assert_fails_saying(
        &mut client,
        "rping to an unrouted address",
        "rdma_resolve_addr: Network is unreachable",
        &d,
    );
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    let mut server = d.command(&require_program("rping"));
    server.args(["-s", "-a", "10.79.7.1", "-p", "19584", "-v", "-C", "2"]);
    let _server = Logged::spawn(server, dir.join("server.log"));
    std::thread::sleep(Duration::from_millis(500));
    rping_to(&d, "10.79.7.1", "19584", dir.join("routed.log"));
}

/// [`veth_daemon`] with one device, `srxe0`, following the first end of the pair.
fn netdev_daemon(tag: &str, ends: [&str; 2], addr: &str) -> (Netns, Daemon, std::path::PathBuf) {
    let config = format!("[[device]]\nname = \"srxe0\"\nnetdev = \"{}\"\n", ends[0]);
    veth_daemon(tag, ends, addr, &config)
}

/// A network namespace with a veth pair `ends`, the first with `addr`, both up, and a daemon
/// in it on `config` (TOML); with the test's scratch directory. IPv6 is off on the pair: a
/// link-local address that came after the daemon started would take a GID index at a moment
/// the test does not choose.
fn veth_daemon(
    tag: &str,
    ends: [&str; 2],
    addr: &str,
    config: &str,
) -> (Netns, Daemon, std::path::PathBuf) {
    let ns = Netns::new(tag);
    ns.ip(&[
        "link", "add", ends[0], "type", "veth", "peer", "name", ends[1],
    ]);
    for end in ends {
        ns.sysctl(&format!("net.ipv6.conf.{end}.disable_ipv6"), "1");
    }
    ns.ip(&["addr", "add", addr, "dev", ends[0]]);
    for end in ends {
        ns.ip(&["link", "set", end, "up"]);
    }
    let dir = scratch("operator", tag);
    let path = dir.join("softroce.toml");
    std::fs::write(&path, config).unwrap();
    let d = Daemon::start_in(
        &format!("op-{tag}"),
        Some(&ns.name),
        &["--config", path.to_str().unwrap(), "--port", "4791"],
    );
    (ns, d, dir)
}

/// On the L2 device the port and its TAP go down together, either way round: `softroce link
/// set NAME down` turns the TAP's carrier off (the host sees NO-CARRIER, as a switch sees a
/// NIC whose cable was pulled) and back on with `up`; `ip link set TAP down` takes the port
/// down (IBV_EVENT_PORT_ERR) and `up` brings it back.
#[test]
fn the_l2_device_and_its_tap_go_down_together() {
    let ns = Netns::new("port-tap");
    ns.bridge("br0", &["tapc"], 1500, &[]);
    let d = Daemon::start_in(
        "op-port-tap",
        Some(&ns.name),
        &["--name", "srxe0", "--tap", "tapc", "--addr", "10.79.3.1/24"],
    );
    let carrier = || {
        let out = Command::new("ip")
            .args(["-n", &ns.name, "link", "show", "tapc"])
            .output()
            .expect("ip link show");
        !String::from_utf8_lossy(&out.stdout).contains("NO-CARRIER")
    };
    link_state_becomes(&d, "ACTIVE");
    assert!(carrier(), "the daemon's TAP has no carrier");
    let mut watch = asyncwatch(&d, "srxe0");
    softroce_ok(&d, &["link", "set", "srxe0", "down"]);
    link_state_becomes(&d, "DOWN");
    port_change_seen(&d, &mut watch, None, true);
    assert!(!carrier(), "link set down left the TAP's carrier on");
    softroce_ok(&d, &["link", "set", "srxe0", "up"]);
    link_state_becomes(&d, "ACTIVE");
    port_change_seen(&d, &mut watch, None, false);
    assert!(carrier(), "link set up left the TAP without carrier");
    ns.ip(&["link", "set", "tapc", "down"]);
    link_state_becomes(&d, "DOWN");
    port_change_seen(&d, &mut watch, None, true);
    ns.ip(&["link", "set", "tapc", "up"]);
    link_state_becomes(&d, "ACTIVE");
    port_change_seen(&d, &mut watch, None, false);
}
