//! How the devices of one daemon share UDP port 4791, as kernel rxe devices share it.
//!
//! rxe has one UDP socket on 4791 for all its devices and hands each packet to the device of
//! its netdev. softroce's devices each have their own sockets and thread, so they share the
//! port through the kernel instead: every device socket is `SO_REUSEADDR`, a device of fixed
//! addresses binds its own address and a device that follows a netdev binds the wildcard
//! address, and the kernel hands a datagram to the socket bound to its destination address
//! before any wildcard one (`compute_score` in net/ipv4/udp.c). So `--addr 127.0.0.1` beside
//! `--netdev eth0` (the README's example configuration) works, in one daemon or in two.
//!
//! What `SO_REUSEADDR` would also allow, and this module refuses: two sockets bound to the
//! *same* address and port, between which the kernel's choice is arbitrary (a second daemon
//! on the first one's address would silently take some of its packets). Before a device
//! socket is bound, `/proc/net/udp` (or `udp6`) is searched for a socket bound to exactly that
//! address and port, and again after the bind, for a second one: two daemons that raced past
//! the first look both give up, and neither steals the other's packets. A socket of another
//! program that is not `SO_REUSEADDR` (kernel rxe's among them) still fails the bind itself.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

/// Who holds the sockets bound to exactly `addr` (its address and port).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Holders {
    /// Sockets of this process.
    pub ours: usize,
    /// Sockets of other processes, or of the kernel.
    pub others: usize,
}

impl Holders {
    pub fn total(&self) -> usize {
        self.ours + self.others
    }
}

/// The sockets bound to exactly `addr` (never a wildcard for a specific address, or the
/// other way round: those share the port).
pub fn holders(addr: SocketAddr) -> Holders {
    let table = if addr.is_ipv4() {
        "/proc/net/udp"
    } else {
        "/proc/net/udp6"
    };
    let inodes = bound_inodes(&std::fs::read_to_string(table).unwrap_or_default(), addr);
    if inodes.is_empty() {
        return Holders::default();
    }
    let own = own_socket_inodes();
    let ours = inodes.iter().filter(|i| own.contains(i)).count();
    Holders {
        ours,
        others: inodes.len() - ours,
    }
}

/// The inodes of the sockets that `table` (the text of /proc/net/udp or udp6) lists as bound
/// to exactly `addr`.
fn bound_inodes(table: &str, addr: SocketAddr) -> Vec<u64> {
    let want = proc_local_address(addr);
    table_inodes(table, |local| local.eq_ignore_ascii_case(&want))
}

/// The inodes of the sockets that `table` (the text of /proc/net/udp or udp6) lists with a
/// local address (as the table prints it, `ADDRESS:PORT` in hexadecimal) that `keep` takes.
/// The doctor's port check reads the same tables through it.
pub(crate) fn table_inodes(table: &str, keep: impl Fn(&str) -> bool) -> Vec<u64> {
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            if !keep(cols.get(1)?) {
                return None;
            }
            cols.get(9)?.parse().ok()
        })
        .collect()
}

/// `addr` as /proc/net/udp prints a local address: each 32-bit word of the address as the
/// kernel stores it, in hexadecimal of the host's byte order, then the port.
fn proc_local_address(addr: SocketAddr) -> String {
    let words: Vec<[u8; 4]> = match addr.ip() {
        IpAddr::V4(a) => vec![a.octets()],
        IpAddr::V6(a) => a
            .octets()
            .chunks_exact(4)
            .map(|c| [c[0], c[1], c[2], c[3]])
            .collect(),
    };
    let mut s: String = words
        .iter()
        .map(|w| format!("{:08X}", u32::from_ne_bytes(*w)))
        .collect();
    s.push_str(&format!(":{:04X}", addr.port()));
    s
}

/// The inodes of this process's sockets.
fn own_socket_inodes() -> Vec<u64> {
    socket_inodes(Path::new("/proc/self/fd"))
}

/// The inodes of the sockets among the descriptors in `fd_dir` (a `/proc/PID/fd`: its links
/// `socket:[N]`).
pub(crate) fn socket_inodes(fd_dir: &Path) -> Vec<u64> {
    std::fs::read_dir(fd_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|fd| {
            let target = std::fs::read_link(fd.path()).ok()?;
            let t = target.to_str()?;
            t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

/// Names a clash with another device of this daemon (in [`in_use`]'s message).
const OWN_CLASH: &str = "by another device of this daemon";

/// Whether `e` is a clash with another device of this daemon, which no waiting resolves.
pub fn is_own_clash(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::AddrInUse && e.to_string().contains(OWN_CLASH)
}

/// The error for a device socket whose exact address is bound already.
pub fn in_use(addr: SocketAddr, h: Holders) -> io::Error {
    let (who, why) = match (h.others, addr.ip().is_unspecified()) {
        (0, true) => (
            OWN_CLASH,
            " (a --netdev device binds the wildcard address: one per daemon and port; give the \
             other device its addresses with --addr)",
        ),
        (0, false) => (OWN_CLASH, " (an address belongs to one device)"),
        _ => ("by another program", ""),
    };
    io::Error::new(
        io::ErrorKind::AddrInUse,
        format!("bind {addr}: address already bound {who}{why}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr, UdpSocket};

    #[test]
    fn local_addresses_print_as_the_kernel_prints_them() {
        // From /proc/net/udp on x86-64: 127.0.0.1:4791 and [::1]:4791, [::]:4791.
        let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, 4791));
        assert_eq!(proc_local_address(v4), "0100007F:12B7");
        let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, 4791));
        assert_eq!(
            proc_local_address(v6),
            "00000000000000000000000001000000:12B7"
        );
        let any6 = SocketAddr::from((Ipv6Addr::UNSPECIFIED, 4791));
        assert_eq!(
            proc_local_address(any6),
            "00000000000000000000000000000000:12B7"
        );
    }

    #[test]
    fn only_the_exact_address_counts() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
            1: 0100007F:12B7 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 111 2 0 0\n\
            2: 00000000:12B7 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 222 2 0 0\n\
            3: 0200007F:12B7 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 333 2 0 0\n\
            4: 0100007F:12B8 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 444 2 0 0\n";
        let at = |a: Ipv4Addr| bound_inodes(table, SocketAddr::from((a, 4791)));
        assert_eq!(at(Ipv4Addr::LOCALHOST), vec![111]);
        assert_eq!(at(Ipv4Addr::UNSPECIFIED), vec![222]);
        assert_eq!(at(Ipv4Addr::new(127, 0, 0, 3)), Vec::<u64>::new());
    }

    #[test]
    fn a_socket_of_this_process_is_found_as_ours() {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let h = holders(s.local_addr().unwrap());
        assert_eq!(h, Holders { ours: 1, others: 0 });
        drop(s);
    }
}
