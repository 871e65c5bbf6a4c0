//! `softroce`: the user-space RoCE device and its tools.

mod pcap;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "softroce",
    version,
    about = "A software RoCE device in user space"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Work with packet captures.
    Pcap {
        #[command(subcommand)]
        command: PcapCommand,
    },
}

#[derive(Subcommand, Debug)]
enum PcapCommand {
    /// Parse every RoCE packet (v2 over UDP 4791 on IPv4 and IPv6, v1 on Ethertype 0x8915) in
    /// pcap or pcapng files and verify every ICRC. Exit status: 0 when every whole RoCE packet
    /// parses and carries the right ICRC, 1 otherwise, 2 when a file cannot be read.
    Check {
        /// One line per packet: opcode, QPN, PSN, flags and extended headers.
        #[arg(short, long)]
        verbose: bool,
        /// Capture files (pcap or pcapng; Ethernet, Linux cooked v1/v2 or raw IP).
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

fn main() -> ExitCode {
    restore_default_sigpipe();
    let cli = Cli::parse();
    match cli.command {
        Command::Pcap {
            command: PcapCommand::Check { verbose, files },
        } => pcap_check(&files, verbose),
    }
}

fn pcap_check(files: &[PathBuf], verbose: bool) -> ExitCode {
    let mut unreadable = false;
    let mut bad = false;
    for path in files {
        let mut print = |line: String| println!("{line}");
        let sink: Option<&mut dyn FnMut(String)> = if verbose { Some(&mut print) } else { None };
        // A capture library bug must not take the whole run down: treat a panic as unreadable.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pcap::check::check_file(path, sink)
        }));
        match result {
            Ok(Ok(report)) => {
                print!(
                    "{}",
                    pcap::check::summary(&path.display().to_string(), &report)
                );
                bad |= !report.is_clean();
            }
            Ok(Err(e)) => {
                eprintln!("softroce: cannot read {}: {e}", path.display());
                unreadable = true;
            }
            Err(_) => {
                eprintln!(
                    "softroce: cannot read {}: the capture reader failed",
                    path.display()
                );
                unreadable = true;
            }
        }
    }
    if unreadable {
        ExitCode::from(2)
    } else if bad {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Rust ignores SIGPIPE, so `softroce pcap check -v | head` would fail on a closed pipe. A
/// command-line tool should simply stop, as C tools do.
fn restore_default_sigpipe() {
    // SAFETY: setting a signal's disposition to SIG_DFL installs no handler and touches no
    // memory; it happens before any thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
