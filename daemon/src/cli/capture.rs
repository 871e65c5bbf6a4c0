//! `softroce capture`: a live capture, made inside the daemon, of every packet a device
//! sends and receives (same-host traffic between its QPs included), as a pcapng stream of
//! whole Ethernet frames: into a file (`-w FILE`), to stdout (`-w -`, for `tshark -i -` or
//! Wireshark), or printed one line per packet.
//!
//! The daemon writes the stream into a pipe this command gives it and copies only whole
//! blocks onward, so a capture stopped by Ctrl-C still ends with a whole block: the command
//! then closes its control connection, the daemon ends the capture with its statistics
//! blocks and closes the pipe.

use super::{unexpected, CliResult, Failure, Session};
use crate::capture::pcapng;
use anyhow::{anyhow, Context};
use clap::Args;
use proto::ctl::{CaptureSpec, Request, Response};
use proto::wire::{FrameRepr, Opcode};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
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

enum Output {
    File(std::fs::File),
    Stdout(std::io::Stdout),
    Lines,
}

pub fn run(args: CaptureArgs) -> CliResult {
    let mut out = match args.write.as_deref() {
        Some("-") => Output::Stdout(std::io::stdout()),
        Some(path) => Output::File(
            std::fs::File::create(path)
                .with_context(|| format!("cannot create {path}"))
                .map_err(Failure::usage)?,
        ),
        None => Output::Lines,
    };
    let mut s = Session::open(args.socket.as_deref(), "capture")?;
    let (read_end, write_end) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("creating a pipe")?;
    let spec = CaptureSpec {
        device: args.device.clone(),
        qpn: args.qp,
        opcode: args.opcode,
        count: args.count,
        snaplen: args.snaplen,
    };
    let interfaces = match s.ask_fds(&Request::CaptureStart { spec }, &[write_end.as_raw_fd()])? {
        (Response::CaptureStarted { interfaces }, _) => interfaces,
        (other, _) => return Err(unexpected(other)),
    };
    // Only the daemon's copy may hold the pipe open.
    drop(write_end);
    if !args.quiet {
        eprintln!("softroce: capturing on {}", interfaces.join(", "));
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("installing a signal handler")?;
    }
    let mut client = Some(s.into_client());
    let mut pipe = std::fs::File::from(read_end);
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 256 * 1024];
    let (mut packets, mut dropped, mut line) = (0u64, 0u64, 0usize);
    let mut stop_deadline: Option<Instant> = None;
    loop {
        if stop.load(Ordering::Relaxed) && client.is_some() {
            // Closing the control connection ends the capture: the daemon writes the
            // statistics blocks and closes the pipe.
            client = None;
            stop_deadline = Some(Instant::now() + Duration::from_secs(3));
        }
        if stop_deadline.is_some_and(|d| Instant::now() > d) {
            break;
        }
        let mut fds = [nix::poll::PollFd::new(
            std::os::fd::AsFd::as_fd(&pipe),
            nix::poll::PollFlags::POLLIN,
        )];
        match nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(200u16)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(Failure::failed(anyhow!("waiting for the capture: {e}"))),
        }
        let n = match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Failure::failed(anyhow!("reading the capture: {e}"))),
        };
        pending.extend_from_slice(&buf[..n]);
        let (blocks, used) = pcapng::complete_blocks(&pending);
        for (kind, block) in &blocks {
            match *kind {
                pcapng::BLOCK_EPB => packets += 1,
                pcapng::BLOCK_ISB => dropped += pcapng::isb_dropped(block).unwrap_or(0),
                _ => {}
            }
        }
        match &mut out {
            Output::File(f) => f
                .write_all(&pending[..used])
                .context("writing the capture")?,
            Output::Stdout(o) => {
                let mut o = o.lock();
                o.write_all(&pending[..used])?;
                o.flush()?;
            }
            Output::Lines => {
                for (kind, block) in &blocks {
                    if *kind == pcapng::BLOCK_EPB {
                        line += 1;
                        println!("{}", packet_line(line, block));
                    }
                }
                std::io::stdout().flush()?;
            }
        }
        pending.drain(..used);
    }
    drop(client);
    if let Output::File(f) = &mut out {
        f.flush()?;
    }
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
