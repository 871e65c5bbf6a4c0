//! `netem-router`: a router in user space for the emulated-network tests. This machine's
//! kernel has no `sch_netem`, `sch_red` or `fq_codel`, so the bottleneck and the impairments
//! live here: the test's router namespace sends every packet it forwards into a TUN device,
//! this program reads it, and writes it back (the kernel then forwards it on by its main
//! routing table).
//!
//! What it does to a packet, in order:
//! 1. impairments, if the packet's destination is one of `--impair-dst` (every packet when
//!    none is given): `--loss P` drops it, `--dup P` sends it twice, `--reorder P` holds it
//!    back by `--reorder-delay` µs so that later packets overtake it, `--delay`/`--jitter` µs
//!    delay it; SIGUSR1 turns a black hole on (every packet dropped), SIGUSR2 off;
//! 2. the bottleneck, if its destination is one of `--bottleneck-dst`: one FIFO drained at
//!    `--rate` Mbit/s, tail drop beyond `--buffer` bytes, ECN CE marked by RED's rule
//!    (`--red MIN,MAX,PMAX`: probability 0 up to MIN bytes of queue, rising linearly to PMAX
//!    at MAX, 1 above) on the depth of the queue behind a packet as it leaves, as
//!    shared-buffer switches mark (the mark tells of the queue as it is now);
//! 3. out, unchanged otherwise.
//!
//! `--realtime` makes it a SCHED_FIFO task, so that a busy machine does not stop the link.
//! `--stats FILE` gets `key=value` lines (forwarded, marked, dropped, max_queue, bytes per
//! source...) every 200 ms and at exit (SIGTERM, SIGINT); `--series FILE` gets one line per
//! 10 ms and source, `ms source bytes` of what left the bottleneck (rate over time per flow),
//! and `ms queue bytes`, the deepest queue a packet found in those 10 ms.

use proto::wire::ecn;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::fmt::Write as _;
use std::fs::File;
use std::io::Write;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

static STOP: AtomicBool = AtomicBool::new(false);
static BLACK_HOLE: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(sig: libc::c_int) {
    match sig {
        libc::SIGUSR1 => BLACK_HOLE.store(true, Ordering::SeqCst),
        libc::SIGUSR2 => BLACK_HOLE.store(false, Ordering::SeqCst),
        _ => STOP.store(true, Ordering::SeqCst),
    }
}

#[derive(Debug, Default)]
struct Options {
    tun: String,
    bottleneck_dst: Vec<IpAddr>,
    impair_dst: Vec<IpAddr>,
    rate_mbps: f64,
    buffer: u64,
    red: Option<(u64, u64, f64)>,
    loss: f64,
    dup: f64,
    reorder: f64,
    reorder_delay: Duration,
    delay: Duration,
    jitter: Duration,
    seed: u64,
    stats: Option<String>,
    series: Option<String>,
    realtime: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: netem-router --tun NAME [--bottleneck-dst IP]... [--rate MBIT] [--buffer BYTES] \
         [--red MIN,MAX,PMAX] [--impair-dst IP]... [--loss P] [--dup P] [--reorder P] \
         [--reorder-delay US] [--delay US] [--jitter US] [--seed N] [--stats FILE] \
         [--series FILE] [--realtime]"
    );
    std::process::exit(2)
}

fn parse_args() -> Options {
    let mut o = Options {
        buffer: 1_000_000,
        reorder_delay: Duration::from_micros(500),
        seed: 1,
        ..Options::default()
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut v = || args.next().unwrap_or_else(|| usage());
        let num = |s: String| s.parse::<f64>().unwrap_or_else(|_| usage());
        let us = |s: String| Duration::from_secs_f64(num(s) / 1e6);
        match a.as_str() {
            "--tun" => o.tun = v(),
            "--bottleneck-dst" => o
                .bottleneck_dst
                .push(v().parse().unwrap_or_else(|_| usage())),
            "--impair-dst" => o.impair_dst.push(v().parse().unwrap_or_else(|_| usage())),
            "--rate" => o.rate_mbps = num(v()),
            "--buffer" => o.buffer = num(v()) as u64,
            "--red" => {
                let s = v();
                let p: Vec<f64> = s.split(',').map(|x| num(x.to_string())).collect();
                if p.len() != 3 {
                    usage();
                }
                o.red = Some((p[0] as u64, p[1] as u64, p[2]));
            }
            "--loss" => o.loss = num(v()),
            "--dup" => o.dup = num(v()),
            "--reorder" => o.reorder = num(v()),
            "--reorder-delay" => o.reorder_delay = us(v()),
            "--delay" => o.delay = us(v()),
            "--jitter" => o.jitter = us(v()),
            "--seed" => o.seed = num(v()) as u64,
            "--stats" => o.stats = Some(v()),
            "--series" => o.series = Some(v()),
            "--realtime" => o.realtime = true,
            _ => usage(),
        }
    }
    if o.tun.is_empty() {
        usage();
    }
    o
}

/// SplitMix64: small and seeded, so a run's random choices replay from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

/// Opens TUN device `name` (IFF_TUN | IFF_NO_PI: whole IP packets), non-blocking.
fn open_tun(name: &str) -> std::io::Result<OwnedFd> {
    // SAFETY: open(2) of a fixed NUL-terminated path; the descriptor is owned at once.
    let fd = unsafe {
        libc::open(
            c"/dev/net/tun".as_ptr(),
            libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // struct ifreq: 16 bytes of name, then the flags (a short) in the union.
    let mut ifr = [0u8; 40];
    let n = name.len().min(15);
    ifr[..n].copy_from_slice(&name.as_bytes()[..n]);
    let flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    ifr[16..18].copy_from_slice(&flags.to_ne_bytes());
    // SAFETY: TUNSETIFF reads and writes a struct ifreq, which `ifr` is sized for (40 bytes).
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, ifr.as_mut_ptr()) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

/// Where each packet waits for its time, ordered by that time (then by arrival).
struct Scheduled {
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    packets: BTreeMap<u64, (Vec<u8>, Stage)>,
    seq: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Impaired (delayed or reordered): next, the bottleneck or out.
    AfterImpairment,
    /// Its last bit leaves the bottleneck: mark, then out.
    Departing,
}

impl Scheduled {
    fn push(&mut self, at: Instant, packet: Vec<u8>, stage: Stage) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq)));
        self.packets.insert(self.seq, (packet, stage));
    }
    fn next_time(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((t, _))| *t)
    }
    /// The next packet whose time has come, with how late it is.
    fn pop_due(&mut self, now: Instant) -> Option<(Vec<u8>, Stage, Duration)> {
        let Reverse((t, seq)) = *self.heap.peek()?;
        if t > now {
            return None;
        }
        self.heap.pop();
        let (p, stage) = self.packets.remove(&seq)?;
        Some((p, stage, now - t))
    }
}

#[derive(Debug, Default)]
struct Stats {
    received: u64,
    forwarded: u64,
    forwarded_bytes: u64,
    marked: u64,
    dropped: u64,
    max_queue: u64,
    impair_dropped: u64,
    duplicated: u64,
    reordered: u64,
    black_holed: u64,
    write_errors: u64,
    /// The latest a packet left after its time, µs: how long the router was kept from
    /// running (a busy machine), during which the link was stopped.
    max_late_us: u64,
    /// Bytes that left the bottleneck, per source.
    by_source: BTreeMap<IpAddr, u64>,
}

impl Stats {
    fn render(&self) -> String {
        let mut text = format!(
            "received={}\nforwarded={}\nforwarded_bytes={}\nmarked={}\ndropped={}\nmax_queue={}\n\
             impair_dropped={}\nduplicated={}\nreordered={}\nblack_holed={}\nwrite_errors={}\n\
             max_late_us={}\n",
            self.received,
            self.forwarded,
            self.forwarded_bytes,
            self.marked,
            self.dropped,
            self.max_queue,
            self.impair_dropped,
            self.duplicated,
            self.reordered,
            self.black_holed,
            self.write_errors,
            self.max_late_us
        );
        for (src, b) in &self.by_source {
            text.push_str(&format!("bytes.{src}={b}\n"));
        }
        text
    }
}

/// What the router writes to its files. Files are written by a thread of their own: a write
/// on a busy disk can block for a hundred milliseconds, which the packet loop must never do.
enum Output {
    /// The whole statistics file.
    Stats(String),
    /// Lines to append to the series file.
    Series(String),
    Done,
}

fn writer(stats: Option<String>, series: Option<String>, rx: std::sync::mpsc::Receiver<Output>) {
    let mut series = series.map(|p| File::create(p).expect("series file"));
    while let Ok(out) = rx.recv() {
        match out {
            Output::Stats(text) => {
                if let Some(path) = &stats {
                    // Written whole, then renamed: a reader never sees half a file.
                    let tmp = format!("{path}.tmp");
                    if std::fs::write(&tmp, text).is_ok() {
                        let _ = std::fs::rename(&tmp, path);
                    }
                }
            }
            Output::Series(lines) => {
                if let Some(f) = &mut series {
                    let _ = f.write_all(lines.as_bytes());
                }
            }
            Output::Done => return,
        }
    }
}

/// The bottleneck port: its FIFO is the packets scheduled as `Departing`; here are its
/// rate, occupancy and marking.
struct Port {
    rate_bps: f64,
    buffer: u64,
    red: Option<(u64, u64, f64)>,
    busy_until: Instant,
    queued_bytes: u64,
}

impl Port {
    /// RED's marking probability at a queue depth of `q` bytes.
    fn probability(&self, q: u64) -> f64 {
        match self.red {
            None => 0.0,
            Some((min, _, _)) if q <= min => 0.0,
            Some((_, max, _)) if q > max => 1.0,
            Some((min, max, p)) => p * (q - min) as f64 / (max - min).max(1) as f64,
        }
    }
}

struct Router {
    o: Options,
    tun: OwnedFd,
    rng: Rng,
    port: Port,
    scheduled: Scheduled,
    stats: Stats,
    /// To the writer thread.
    out: std::sync::mpsc::Sender<Output>,
    series_on: bool,
    series_bin: BTreeMap<IpAddr, u64>,
    series_start: Instant,
    series_ms: u64,
    /// The deepest queue a packet found in the current 10 ms.
    series_queue: u64,
}

impl Router {
    fn write_out(&mut self, packet: &[u8]) {
        // SAFETY: write(2) of a live buffer to our own descriptor.
        let n = unsafe { libc::write(self.tun.as_raw_fd(), packet.as_ptr().cast(), packet.len()) };
        if n < 0 {
            self.stats.write_errors += 1;
        } else {
            self.stats.forwarded += 1;
            self.stats.forwarded_bytes += packet.len() as u64;
        }
    }

    fn is(&self, list: &[IpAddr], packet: &[u8]) -> bool {
        destination(packet).is_some_and(|d| list.contains(&d))
    }

    /// A packet read from the TUN device at `now`.
    fn arrive(&mut self, now: Instant, packet: Vec<u8>) {
        self.stats.received += 1;
        if BLACK_HOLE.load(Ordering::Relaxed) {
            self.stats.black_holed += 1;
            return;
        }
        let impaired = self.o.impair_dst.is_empty() || self.is(&self.o.impair_dst.clone(), &packet);
        if !impaired {
            self.after_impairment(now, packet);
            return;
        }
        if self.rng.chance(self.o.loss) {
            self.stats.impair_dropped += 1;
            return;
        }
        let copies = if self.rng.chance(self.o.dup) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut delay = self.o.delay;
            if !self.o.jitter.is_zero() {
                delay += Duration::from_nanos(self.rng.below(self.o.jitter.as_nanos() as u64));
            }
            if self.rng.chance(self.o.reorder) {
                self.stats.reordered += 1;
                delay += self.o.reorder_delay;
            }
            if delay.is_zero() {
                self.after_impairment(now, packet.clone());
            } else {
                self.scheduled
                    .push(now + delay, packet.clone(), Stage::AfterImpairment);
            }
        }
    }

    /// Into the bottleneck, or out.
    fn after_impairment(&mut self, now: Instant, packet: Vec<u8>) {
        if self.port.rate_bps <= 0.0 || !self.is(&self.o.bottleneck_dst.clone(), &packet) {
            self.write_out(&packet);
            return;
        }
        let len = packet.len() as u64;
        let q = self.port.queued_bytes;
        self.stats.max_queue = self.stats.max_queue.max(q);
        self.series_queue = self.series_queue.max(q);
        if q + len > self.port.buffer {
            self.stats.dropped += 1;
            return;
        }
        let start = self.port.busy_until.max(now);
        let depart = start + Duration::from_secs_f64(len as f64 * 8.0 / self.port.rate_bps);
        self.port.busy_until = depart;
        self.port.queued_bytes += len;
        self.scheduled.push(depart, packet, Stage::Departing);
    }

    /// A packet's last bit leaves the bottleneck: RED on the queue behind it, then out.
    fn depart(&mut self, now: Instant, mut packet: Vec<u8>) {
        self.port.queued_bytes = self.port.queued_bytes.saturating_sub(packet.len() as u64);
        let p = self.port.probability(self.port.queued_bytes);
        if self.rng.chance(p) && ecn::mark_ce(&mut packet) {
            self.stats.marked += 1;
        }
        if let Some(src) = ecn::packet_source(&packet) {
            *self.stats.by_source.entry(src).or_default() += packet.len() as u64;
            if self.series_on {
                self.account_series(now, src, packet.len() as u64);
            }
        }
        self.write_out(&packet);
    }

    fn account_series(&mut self, now: Instant, src: IpAddr, bytes: u64) {
        let ms = now.duration_since(self.series_start).as_millis() as u64 / 10 * 10;
        if ms != self.series_ms {
            self.flush_series();
            self.series_ms = ms;
        }
        *self.series_bin.entry(src).or_default() += bytes;
    }

    fn flush_series(&mut self) {
        if self.series_on {
            let mut lines = String::new();
            for (src, b) in &self.series_bin {
                let _ = writeln!(lines, "{} {src} {b}", self.series_ms);
            }
            let _ = writeln!(lines, "{} queue {}", self.series_ms, self.series_queue);
            let _ = self.out.send(Output::Series(lines));
        }
        self.series_bin.clear();
        self.series_queue = 0;
    }
}

/// The destination address of an IPv4 or IPv6 packet.
fn destination(p: &[u8]) -> Option<IpAddr> {
    match p.first().map(|v| v >> 4) {
        Some(4) if p.len() >= 20 => Some(<[u8; 4]>::try_from(&p[16..20]).ok()?.into()),
        Some(6) if p.len() >= 40 => Some(<[u8; 16]>::try_from(&p[24..40]).ok()?.into()),
        _ => None,
    }
}

fn main() {
    let o = parse_args();
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGUSR1, libc::SIGUSR2] {
        // SAFETY: the handler only stores to atomics, which is async-signal-safe.
        unsafe {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }
    // Wake-ups at the packets' times, not 50 µs later (the default timer slack), and ahead of
    // the test's busy programs on a small machine: a router that waits for a CPU is a link
    // that stops (the loop blocks in ppoll, so a high weight takes nothing it does not use).
    // With --realtime the router is a SCHED_FIFO task: a link that waits tens of ms for a
    // CPU behind a busy machine's other work is a link that stops, and what arrives meanwhile
    // reaches its queue as one burst (the kernel holds it in the TUN device). The kernel's RT
    // throttling still leaves the others 5 % of every CPU, should the router ever spin.
    // SAFETY: prctl, setpriority and sched_setscheduler with plain arguments, on this process.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
        libc::setpriority(libc::PRIO_PROCESS, 0, -19);
        if o.realtime {
            let param = libc::sched_param { sched_priority: 10 };
            if libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) != 0 {
                eprintln!(
                    "netem-router: SCHED_FIFO refused: {}",
                    std::io::Error::last_os_error()
                );
            }
        }
    }
    let tun = open_tun(&o.tun).unwrap_or_else(|e| {
        eprintln!("netem-router: cannot open TUN device {}: {e}", o.tun);
        std::process::exit(1)
    });
    let now = Instant::now();
    let (out, rx) = std::sync::mpsc::channel();
    let files = {
        let (stats, series) = (o.stats.clone(), o.series.clone());
        std::thread::spawn(move || writer(stats, series, rx))
    };
    let mut r = Router {
        rng: Rng(o.seed),
        port: Port {
            rate_bps: o.rate_mbps * 1e6,
            buffer: o.buffer,
            red: o.red,
            busy_until: now,
            queued_bytes: 0,
        },
        scheduled: Scheduled {
            heap: BinaryHeap::new(),
            packets: BTreeMap::new(),
            seq: 0,
        },
        stats: Stats::default(),
        out,
        series_on: o.series.is_some(),
        series_bin: BTreeMap::new(),
        series_start: now,
        series_ms: 0,
        series_queue: 0,
        tun,
        o,
    };
    eprintln!("netem-router: {} ready", r.o.tun);
    let mut buf = vec![0u8; 65536];
    let mut last_stats = Instant::now();
    while !STOP.load(Ordering::SeqCst) {
        let now = Instant::now();
        while let Some((packet, stage, late)) = r.scheduled.pop_due(now) {
            r.stats.max_late_us = r.stats.max_late_us.max(late.as_micros() as u64);
            match stage {
                Stage::AfterImpairment => r.after_impairment(now, packet),
                Stage::Departing => r.depart(now, packet),
            }
        }
        if now.duration_since(last_stats) > Duration::from_millis(200) {
            last_stats = now;
            let _ = r.out.send(Output::Stats(r.stats.render()));
        }
        let wait = r
            .scheduled
            .next_time()
            .map_or(Duration::from_millis(50), |t| {
                t.saturating_duration_since(now)
            })
            .min(Duration::from_millis(50));
        let ts = libc::timespec {
            tv_sec: wait.as_secs() as libc::time_t,
            tv_nsec: wait.subsec_nanos() as libc::c_long,
        };
        let mut pfd = libc::pollfd {
            fd: r.tun.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd and a timespec, both live for the call.
        unsafe {
            libc::ppoll(&mut pfd, 1, &ts, std::ptr::null());
        }
        // A bounded batch, so that departures are served on time under a flood of arrivals.
        for _ in 0..64 {
            // SAFETY: read(2) into our own buffer, at most its length.
            let n = unsafe { libc::read(r.tun.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                break;
            }
            r.arrive(Instant::now(), buf[..n as usize].to_vec());
        }
    }
    // Whatever is still queued leaves now (the test asked us to stop).
    r.flush_series();
    let _ = r.out.send(Output::Stats(r.stats.render()));
    let _ = r.out.send(Output::Done);
    let _ = files.join();
}
