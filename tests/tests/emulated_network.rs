//! Congestion control on a real, emulated network (the short form; `scripts/bench congestion`
//! runs the long form): four hosts with unmodified `ib_write_bw` into one receiver through a
//! 100 Mbit/s bottleneck that marks ECN by RED's rule (tests/src/bin/netem-router.rs, in a
//! router namespace; see emulated/mod.rs for the topology). With DCQCN the marks come back
//! as CNPs, the senders slow down, nothing is dropped and they share the link fairly; without
//! congestion control the queue overflows. And a black hole after the connection is up ends
//! the requester's work request with IBV_WC_RETRY_EXC_ERR after (retry_cnt + 1) retransmit
//! timeouts.
//!
//! Root and network namespaces are needed (scripts/test runs under them; so does
//! `sudo unshare --net cargo test -p softroce-e2e --test emulated_network`).

mod emulated;
mod shim_support;

use emulated::{dcqcn_100mbit, incast_router, run_incast, Incast, Network, RouterConfig, RECEIVER};
use std::time::{Duration, Instant};

const SENDERS: u8 = 4;

/// The router was kept from running this long (µs) at worst: beyond it the run says more
/// about the machine than about the network (what arrived meanwhile reached the queue as one
/// burst), and it is run again.
const ROUTER_STALL_LIMIT_US: u64 = 20_000;

#[test]
fn four_senders_with_dcqcn_share_a_marking_bottleneck_without_loss() {
    let mut stalls = Vec::new();
    let run = loop {
        let mut net = Network::new("dcqcn", SENDERS, &incast_router(), &dcqcn_100mbit());
        // 20 s of ib_write_bw: DCQCN needs seconds to even out the shares at these rates (its
        // timers are scaled 250-fold, see emulated::dcqcn_100mbit).
        let run = run_incast(&mut net, SENDERS, 20);
        let late = run.router["max_late_us"];
        if late <= ROUTER_STALL_LIMIT_US {
            break run;
        }
        stalls.push(late);
        println!("the router was stalled {late} µs (a busy machine): running again");
        assert!(
            stalls.len() < 3,
            "the machine is too busy to emulate a network: the router stalled {stalls:?} µs"
        );
    };
    let (mbps, jain, window) = run.shares();
    let marked = run.router["marked"];
    let dropped = run.router["dropped"];
    let np_marked = run.counter(RECEIVER, "np_ecn_marked_roce_packets");
    let cnps_sent = run.counter(RECEIVER, "np_cnp_sent");
    let cnps_handled = run.cnps_handled();
    println!(
        "DCQCN: per sender {mbps:.1?} Mbit/s over {window:?} ms, Jain {jain:.3}; bottleneck \
         marked {marked} dropped {dropped} max queue {}; receiver saw {np_marked} CE marks, \
         sent {cnps_sent} CNPs, senders handled {cnps_handled}",
        run.router["max_queue"]
    );
    // ECT(0) went out (the router marks only ECN-capable packets), CE came in (IP_RECVTOS
    // into the rebuilt IP header), CNPs went back and were acted on.
    assert!(marked > 0, "the bottleneck marked packets");
    // (A marked packet may still be lost on the way, in the receiver's socket buffer.)
    assert!(
        np_marked <= marked && np_marked * 10 >= marked * 9,
        "the marks reached the receiver's engine"
    );
    assert!(cnps_sent > 0 && cnps_handled > 0);
    assert!(cnps_handled <= cnps_sent && cnps_handled * 10 >= cnps_sent * 9);
    assert_eq!(dropped, 0, "DCQCN kept the queue within the buffer");
    assert!(jain >= 0.9, "fair shares: {mbps:?}");
    assert!(
        mbps.iter().sum::<f64>() >= 50.0,
        "the bottleneck stayed busy: {mbps:?}"
    );
}

#[test]
fn four_senders_without_congestion_control_overflow_the_bottleneck() {
    let none = ["--cc".to_string(), "none".to_string()];
    let mut net = Network::new("none", SENDERS, &incast_router(), &none);
    let run = run_incast(&mut net, SENDERS, 6);
    let (mbps, jain, _) = run.shares();
    println!(
        "no congestion control: per sender {mbps:.1?} Mbit/s, Jain {jain:.3}; bottleneck \
         marked {} dropped {} max queue {}",
        run.router["marked"], run.router["dropped"], run.router["max_queue"]
    );
    // rxe's behaviour: Not-ECT, so nothing to mark; the windows do not fit the buffer.
    assert_eq!(run.router["marked"], 0);
    assert!(run.router["dropped"] > 0, "the queue overflowed");
    assert_eq!(run.counter(RECEIVER, "np_cnp_sent"), 0);
}

#[test]
fn a_black_hole_ends_the_requester_with_retry_exceeded_after_retry_cnt_plus_one_timeouts() {
    // perftest's QPs: timeout 14 (4.096 µs × 2^14 = 67.1 ms), retry_cnt 7. Every packet is
    // dropped from a moment on: the oldest unacknowledged request is retried 7 times, and the
    // 8th timeout completes it with IBV_WC_RETRY_EXC_ERR (12). (ibv_rc_pingpong would not
    // do: its hop limit of 1 does not cross a router, exactly as on kernel rxe.)
    let timeout = 4.096e-6 * f64::from(1u32 << 14);
    let expected = 8.0 * timeout;
    let mut net = Network::new("blackhole", 1, &RouterConfig::default(), &dcqcn_100mbit());
    let args = [
        "-d", "srxe0", "-x", "0", "-F", "-s", "65536", "-D", "60", "-p", "18611",
    ];
    let mut server = net.command(RECEIVER, "ib_write_bw");
    server.args(args);
    let s = net.spawn(server, "server.log");
    std::thread::sleep(Duration::from_millis(500));
    let mut client = net.command(1, "ib_write_bw");
    client.args(args).arg(format!("10.77.{RECEIVER}.2"));
    let c = net.spawn(client, "client.log");
    // Connected and moving data through the router.
    let deadline = Instant::now() + Duration::from_secs(30);
    while net.router_stats().get("forwarded").copied().unwrap_or(0) < 5000 {
        assert!(Instant::now() < deadline, "the traffic never started");
        assert!(
            net.wait(c, Duration::ZERO).is_none(),
            "{}",
            net.log("client.log")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    net.signal_router(libc::SIGUSR1);
    let t0 = Instant::now();
    let status = net.wait(c, Duration::from_secs(30));
    let took = t0.elapsed().as_secs_f64();
    let log = net.log("client.log");
    println!(
        "black hole: the client failed {took:.3} s after it began (expected about {expected:.3} s)"
    );
    assert!(status.is_some_and(|s| !s.success()), "{log}");
    assert!(
        log.contains("Failed status 12"),
        "the requester's WR completed with IBV_WC_RETRY_EXC_ERR: {log}"
    );
    // From the black hole on: the last ACK came at most a round trip earlier, and the
    // program needs a moment to report and exit.
    assert!(
        took >= expected * 0.9 && took <= expected + 0.4,
        "RETRY_EXC_ERR after {took:.3} s, not about {expected:.3} s"
    );
    let stats = net.stop_router();
    assert!(stats["black_holed"] > 0);
    let _ = net.wait(s, Duration::from_secs(5));
}

/// The long form, for `scripts/bench congestion` (not part of the suite): DCQCN and no
/// congestion control, `$SOFTROCE_CC_BENCH_SECS` seconds each (default 60), written to
/// `$SOFTROCE_CC_BENCH_OUT` (a directory): `table.md` and, per run, the bottleneck's series
/// as `<run>.dat` (ms, Mbit/s per sender, queue KB) for gnuplot.
#[test]
#[ignore]
fn congestion_bench() {
    let out = std::path::PathBuf::from(
        std::env::var_os("SOFTROCE_CC_BENCH_OUT").expect("SOFTROCE_CC_BENCH_OUT"),
    );
    std::fs::create_dir_all(&out).unwrap();
    let secs: u32 = std::env::var("SOFTROCE_CC_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let mut table = String::from(
        "| run | goodput per flow (Mbit/s, last half) | total | Jain | bottleneck marked | \
         dropped | max queue (KB) | receiver CE marks | CNPs sent | CNPs handled | router \
         stalled at most (ms) |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let none = vec!["--cc".to_string(), "none".to_string()];
    for (name, args) in [("dcqcn", dcqcn_100mbit()), ("none", none)] {
        let mut net = Network::new(&format!("bench-{name}"), SENDERS, &incast_router(), &args);
        let run = run_incast(&mut net, SENDERS, secs);
        let (mbps, jain, _) = run.shares();
        table.push_str(&format!(
            "| {name} | {} | {:.1} | {jain:.3} | {} | {} | {} | {} | {} | {} | {:.1} |\n",
            mbps.iter()
                .map(|m| format!("{m:.1}"))
                .collect::<Vec<_>>()
                .join(" / "),
            mbps.iter().sum::<f64>(),
            run.router["marked"],
            run.router["dropped"],
            run.router["max_queue"] / 1000,
            run.counter(RECEIVER, "np_ecn_marked_roce_packets"),
            run.counter(RECEIVER, "np_cnp_sent"),
            run.cnps_handled(),
            run.router["max_late_us"] as f64 / 1000.0,
        ));
        std::fs::write(out.join(format!("{name}.dat")), plot_data(&run)).unwrap();
    }
    std::fs::write(out.join("table.md"), &table).unwrap();
    print!("{table}");
}

/// Per 100 ms: the time (s), each sender's rate (Mbit/s) and the deepest queue (KB).
fn plot_data(run: &Incast) -> String {
    let bin = 100;
    let mut rows: std::collections::BTreeMap<u64, (Vec<u64>, u64)> = Default::default();
    let n = run.series.bytes.len();
    for (i, m) in run.series.bytes.values().enumerate() {
        for (&ms, &b) in m {
            rows.entry(ms / bin).or_insert_with(|| (vec![0; n], 0)).0[i] += b;
        }
    }
    for &(ms, q) in &run.series.queue {
        let r = rows.entry(ms / bin).or_insert_with(|| (vec![0; n], 0));
        r.1 = r.1.max(q);
    }
    let mut text = format!(
        "# seconds, {} (Mbit/s), queue (KB)\n",
        run.series
            .bytes
            .keys()
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    );
    for (k, (bytes, q)) in rows {
        text.push_str(&format!("{:.1}", (k * bin) as f64 / 1000.0));
        for b in bytes {
            text.push_str(&format!(
                " {:.2}",
                b as f64 * 8.0 / 1e6 / (bin as f64 / 1000.0)
            ));
        }
        text.push_str(&format!(" {:.1}\n", q as f64 / 1000.0));
    }
    text
}
