//! `softroce capture`: a live capture, made inside the daemon, of every packet a device
//! sends and receives (same-host traffic between its QPs included), as a pcapng stream of
//! whole Ethernet frames: into a file (`-w FILE`), to stdout (`-w -`, for `tshark -i -` or
//! Wireshark), or printed one line per packet.
//!
//! The daemon writes the stream straight into the file or stdout this command hands it (no
//! copy through this process), or into a pipe this command reads to print lines; when the
//! stream is whole it reports the packets written and dropped on a second pipe. Ctrl-C closes
//! the control connection, which ends the capture with its statistics blocks.

use super::{unexpected, CliResult, Failure, Session};
use crate::capture::pcapng;
use anyhow::{anyhow, Context};
use clap::Args;
use proto::ctl::{CaptureSpec, Request, Response};
use proto::wire::{FrameRepr, Opcode};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
#[command(after_help = "Examples:
  softroce capture -w pingpong.pcapng                 until Ctrl-C, every device
  softroce capture -i srxe0 -c 100 -w x.pcapng        the first 100 packets of srxe0
  softroce capture -w - | tshark -i - -Y infiniband   live, decoded by tshark
  softroce capture --qp 65553 --opcode RDMA_WRITE_ONLY   one line per packet")]
pub struct CaptureArgs {
    /// The device to capture (default: every device, one pcapng interface each).
    #[arg(short = 'i', long = "interface", value_name = "NAME")]
    device: Option<String>,
    /// Write pcapng to FILE, or to stdout with `-`; without it, one line per packet.
    #[arg(short = 'w', value_name = "FILE")]
    write: Option<String>,
    /// Only packets of this QP: those addressed to it and those it sends to its peer.
    #[arg(long, value_name = "QPN", value_parser = parse_qpn)]
    qp: Option<u32>,
    /// Only packets with this BTH opcode: a name (RC_SEND_ONLY, or SEND_ONLY for the RC
    /// one; UD_SEND_ONLY, RC_ACKNOWLEDGE, ...) or a number (0x04).
    #[arg(long, value_name = "NAME", value_parser = parse_opcode)]
    opcode: Option<u8>,
    /// Stop after COUNT packets.
    #[arg(short = 'c', value_name = "COUNT")]
    count: Option<u64>,
    /// Keep at most SNAPLEN bytes of each frame (default: all of it).
    #[arg(short = 's', value_name = "SNAPLEN", default_value_t = 0)]
    snaplen: u32,
    /// No summary on stderr at the end.
    #[arg(short, long)]
    quiet: bool,
    #[arg(long)]
    socket: Option<PathBuf>,
}

fn parse_qpn(v: &str) -> Result<u32, String> {
    super::stat::parse_qpn(v)
}

/// A BTH opcode by name (as `pcap check -v` prints them) or number.
pub fn parse_opcode(v: &str) -> Result<u8, String> {
    if let Some(h) = v.strip_prefix("0x") {
        return u8::from_str_radix(h, 16).map_err(|_| format!("{v:?} is not an opcode"));
    }
    if let Ok(n) = v.parse::<u8>() {
        return Ok(n);
    }
    let want = v.to_ascii_uppercase().replace('-', "_");
    Opcode::all()
        .find(|o| o.name() == want || o.name() == format!("RC_{want}"))
        .map(|o| o.0)
        .ok_or_else(|| {
            format!("unknown opcode {v:?} (names as `softroce pcap check -v` prints them)")
        })
}

pub fn run(args: CaptureArgs) -> CliResult {
    use nix::fcntl::OFlag;
    // Where the daemon writes the stream: the file, stdout, or a pipe this command reads to
    // print one line per packet. The daemon writes straight into the first two (no copy
    // through this process); its summary comes on `done` when the stream is whole.
    let (out, mut lines): (std::os::fd::OwnedFd, Option<std::fs::File>) =
        match args.write.as_deref() {
            Some("-") => (
                std::io::stdout()
                    .as_fd()
                    .try_clone_to_owned()
                    .context("stdout")?,
                None,
            ),
            Some(path) => (
                std::fs::File::create(path)
                    .with_context(|| format!("cannot create {path}"))
                    .map_err(Failure::usage)?
                    .into(),
                None,
            ),
            None => {
                let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).context("creating a pipe")?;
                (w, Some(std::fs::File::from(r)))
            }
        };
    let (done_r, done_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).context("creating a pipe")?;
    let mut s = Session::open(args.socket.as_deref(), "capture")?;
    let spec = CaptureSpec {
        device: args.device.clone(),
        qpn: args.qp,
        opcode: args.opcode,
        count: args.count,
        snaplen: args.snaplen,
    };
    let fds = [out.as_raw_fd(), done_w.as_raw_fd()];
    let interfaces = match s.ask_fds(&Request::CaptureStart { spec }, &fds)? {
        (Response::CaptureStarted { interfaces }, _) => interfaces,
        (other, _) => return Err(unexpected(other)),
    };
    // Only the daemon's copies may hold them open.
    drop((out, done_w));
    if !args.quiet {
        eprintln!("softroce: capturing on {}", interfaces.join(", "));
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("installing a signal handler")?;
    }
    let mut client = Some(s.into_client());
    let mut done = std::fs::File::from(done_r);
    let mut summary = String::new();
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut line = 0usize;
    let mut stop_deadline: Option<Instant> = None;
    let mut done_open = true;
    while done_open || lines.is_some() {
        if stop.load(Ordering::Relaxed) && client.is_some() {
            // Closing the control connection ends the capture: the daemon writes the
            // statistics blocks, closes the stream and reports.
            client = None;
            stop_deadline = Some(Instant::now() + Duration::from_secs(3));
        }
        if stop_deadline.is_some_and(|d| Instant::now() > d) {
            break;
        }
        use nix::poll::{PollFd, PollFlags, PollTimeout};
        let mut fds = vec![PollFd::new(done.as_fd(), PollFlags::POLLIN)];
        if let Some(l) = &lines {
            fds.push(PollFd::new(l.as_fd(), PollFlags::POLLIN));
        }
        match nix::poll::poll(&mut fds, PollTimeout::from(200u16)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(Failure::failed(anyhow!("waiting for the capture: {e}"))),
        }
        let ready = |i: usize| {
            fds.get(i)
                .and_then(|f| f.revents())
                .is_some_and(|r| !r.is_empty())
        };
        let (done_ready, lines_ready) = (ready(0), ready(1));
        drop(fds);
        if lines_ready {
            if let Some(l) = lines.as_mut() {
                match l.read(&mut buf) {
                    Ok(0) => lines = None,
                    Ok(n) => {
                        pending.extend_from_slice(&buf[..n]);
                        let (blocks, used) = pcapng::complete_blocks(&pending);
                        for (kind, block) in &blocks {
                            if *kind == pcapng::BLOCK_EPB {
                                line += 1;
                                println!("{}", packet_line(line, block));
                            }
                        }
                        std::io::stdout().flush()?;
                        pending.drain(..used);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(Failure::failed(anyhow!("reading the capture: {e}"))),
                }
            }
        }
        if done_ready && done_open {
            match done.read(&mut buf) {
                Ok(0) => done_open = false,
                Ok(n) => summary.push_str(&String::from_utf8_lossy(&buf[..n])),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Failure::failed(anyhow!("reading the capture's end: {e}"))),
            }
        }
    }
    drop(client);
    let mut counts = summary.split_whitespace().map(|w| w.parse::<u64>().ok());
    let (Some(Some(packets)), Some(Some(dropped))) = (counts.next(), counts.next()) else {
        return Err(Failure::failed(anyhow!(
            "the capture ended without the daemon's summary (the stream may be cut)"
        )));
    };
    if !args.quiet {
        eprintln!("softroce: {packets} packets captured, {dropped} dropped");
    }
    Ok(())
}

/// One line for an Enhanced Packet Block's frame, as `pcap check -v` prints it.
fn packet_line(n: usize, epb: &[u8]) -> String {
    let word = |at: usize| {
        epb.get(at..at + 4)
            .map_or(0, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    };
    let (captured, orig) = (word(20) as usize, word(24) as usize);
    let Some(frame) = epb.get(28..28 + captured) else {
        return format!("{n:>6}  (truncated block)");
    };
    let dir = match epb
        .get(28 + captured.div_ceil(4) * 4..)
        .and_then(|o| o.get(4..5))
    {
        Some([1]) => "in ",
        Some([2]) => "out",
        _ => "   ",
    };
    match FrameRepr::parse_ethernet(frame, orig) {
        Ok(p) => format!("{dir} {}", crate::pcap::check::describe(n, &p, None)),
        Err(e) => format!("{dir} {n:>6}  not decoded: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcodes_by_name_or_number() {
        assert_eq!(parse_opcode("RC_SEND_ONLY"), Ok(0x04));
        assert_eq!(parse_opcode("send_only"), Ok(0x04));
        assert_eq!(parse_opcode("RDMA_WRITE_ONLY"), Ok(0x0a));
        assert_eq!(parse_opcode("UD_SEND_ONLY"), Ok(0x64));
        assert_eq!(parse_opcode("0x11"), Ok(0x11));
        assert!(parse_opcode("FROB").is_err());
    }
}
