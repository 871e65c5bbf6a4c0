//! A network interface's properties, read (and its IFF_UP set) through ioctls on a datagram
//! socket: they answer for the network namespace the daemon runs in. `/sys/class/net` shows
//! the namespace of whoever mounted `/sys`, so a daemon entered into a namespace with
//! `setns` or `nsenter --net` (not `ip netns exec`, which remounts it) read the host's
//! interfaces there: a veth's 1500-byte MTU read as nothing (or as a host interface's of
//! the same name), and the port offered a 4096-byte MTU the link refused.

use std::io;

/// An `ifreq` naming `name`, for the interface ioctls.
fn ifreq(name: &str) -> io::Result<libc::ifreq> {
    // SAFETY: all-zero is a valid ifreq.
    let mut r: libc::ifreq = unsafe { std::mem::zeroed() };
    let b = name.as_bytes();
    if b.len() >= r.ifr_name.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "interface name too long",
        ));
    }
    for (d, s) in r.ifr_name.iter_mut().zip(b) {
        *d = *s as libc::c_char;
    }
    Ok(r)
}

/// Runs an interface ioctl on a throwaway datagram socket (of this network namespace).
fn if_ioctl(request: libc::c_ulong, r: &mut libc::ifreq) -> io::Result<()> {
    // SAFETY: a socket we close below; `r` is a valid ifreq for these requests.
    unsafe {
        let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if s < 0 {
            return Err(io::Error::last_os_error());
        }
        let rc = libc::ioctl(s, request, r as *mut libc::ifreq);
        let e = io::Error::last_os_error();
        libc::close(s);
        if rc < 0 {
            return Err(e);
        }
    }
    Ok(())
}

/// The MTU of interface `name` (SIOCGIFMTU: of this network namespace, unlike a sysfs read
/// in a namespace that did not remount /sys).
pub fn interface_mtu(name: &str) -> io::Result<usize> {
    let mut r = ifreq(name)?;
    if_ioctl(libc::SIOCGIFMTU, &mut r)?;
    // SAFETY: SIOCGIFMTU fills the mtu member of the union.
    Ok(unsafe { r.ifr_ifru.ifru_mtu } as usize)
}

/// Sets IFF_UP on interface `name`.
pub fn set_up(name: &str) -> io::Result<()> {
    let mut r = ifreq(name)?;
    if_ioctl(libc::SIOCGIFFLAGS, &mut r)?;
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
    unsafe { r.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    if_ioctl(libc::SIOCSIFFLAGS, &mut r)
        .map_err(|e| io::Error::new(e.kind(), format!("bringing {name} up: {e}")))
}

/// The Ethernet address of interface `name` (SIOCGIFHWADDR).
pub fn interface_mac(name: &str) -> io::Result<[u8; 6]> {
    let mut r = ifreq(name)?;
    if_ioctl(libc::SIOCGIFHWADDR, &mut r)?;
    // SAFETY: SIOCGIFHWADDR fills the hwaddr member of the union.
    let sa = unsafe { r.ifr_ifru.ifru_hwaddr };
    let mut mac = [0u8; 6];
    for (d, s) in mac.iter_mut().zip(sa.sa_data.iter()) {
        *d = *s as u8;
    }
    Ok(mac)
}

/// Whether interface `name` is up with carrier (SIOCGIFFLAGS: IFF_UP and IFF_RUNNING, the
/// kernel's `netif_running && netif_oper_up`).
pub fn interface_running(name: &str) -> io::Result<bool> {
    let want = libc::IFF_UP | libc::IFF_RUNNING;
    Ok(interface_flags(name)? & want == want)
}

/// Whether interface `name` is administratively up (IFF_UP).
pub fn interface_up(name: &str) -> io::Result<bool> {
    Ok(interface_flags(name)? & libc::IFF_UP != 0)
}

fn interface_flags(name: &str) -> io::Result<i32> {
    let mut r = ifreq(name)?;
    if_ioctl(libc::SIOCGIFFLAGS, &mut r)?;
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
    Ok(i32::from(unsafe { r.ifr_ifru.ifru_flags }))
}

/// `struct ethtool_cmd` (linux/ethtool.h), enough of it for ETHTOOL_GSET's speed.
#[repr(C)]
#[derive(Default)]
struct EthtoolCmd {
    cmd: u32,
    supported: u32,
    advertising: u32,
    speed: u16,
    duplex: u8,
    port: u8,
    phy_address: u8,
    transceiver: u8,
    autoneg: u8,
    mdio_support: u8,
    maxtxpkt: u32,
    maxrxpkt: u32,
    speed_hi: u16,
    eth_tp_mdix: u8,
    eth_tp_mdix_ctrl: u8,
    lp_advertising: u32,
    reserved: [u32; 2],
}

const ETHTOOL_GSET: u32 = 1;

/// The link speed of interface `name` in Mb/s, when its driver knows it (ethtool's
/// ETHTOOL_GSET through SIOCETHTOOL; `lo` has no ethtool, a link without carrier reports
/// unknown).
pub fn interface_speed(name: &str) -> Option<u32> {
    let mut cmd = EthtoolCmd {
        cmd: ETHTOOL_GSET,
        ..EthtoolCmd::default()
    };
    let mut r = ifreq(name).ok()?;
    r.ifr_ifru.ifru_data = (&mut cmd as *mut EthtoolCmd).cast();
    if_ioctl(libc::SIOCETHTOOL, &mut r).ok()?;
    let speed = u32::from(cmd.speed_hi) << 16 | u32::from(cmd.speed);
    // SPEED_UNKNOWN is (u32)-1; 0 is no speed either.
    (speed != 0 && speed != u32::MAX && speed != 0xffff).then_some(speed)
}

/// Rtnetlink's multicast groups of link and address changes (`RTMGRP_LINK`,
/// `RTMGRP_IPV4_IFADDR`, `RTMGRP_IPV6_IFADDR`).
const RTMGRP_LINK: u32 = 0x1;
const RTMGRP_IPV4_IFADDR: u32 = 0x10;
const RTMGRP_IPV6_IFADDR: u32 = 0x100;

/// A thread that says (one `()` at a time, coalesced) when an interface of the daemon's
/// network namespace changed: went up or down, gained or lost carrier, an address, its MTU.
/// Kernel rxe learns of these at once from the netdev notifier chain (`rxe_notify`); a
/// device that follows a netdev re-reads it on each word from here, so that its port goes
/// down when the cable does, not up to a polling interval later. What the message said is
/// not parsed: the devices re-read what they follow. `Err` when rtnetlink is not allowed
/// (a seccomp filter): the caller's periodic re-read is then all there is.
pub fn watch_changes() -> io::Result<crossbeam_channel::Receiver<()>> {
    use nix::sys::socket::{
        bind, recv, socket, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType,
    };
    use std::os::fd::AsRawFd;
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkRoute,
    )?;
    bind(
        fd.as_raw_fd(),
        &NetlinkAddr::new(0, RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR),
    )?;
    let (tx, rx) = crossbeam_channel::bounded(1);
    std::thread::Builder::new()
        .name("netdev-watch".into())
        .spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()) {
                    // ENOBUFS: the kernel dropped messages; something changed all the same.
                    Ok(_) | Err(nix::errno::Errno::ENOBUFS) => {}
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => {
                        tracing::warn!("netdev watch ends ({e}); netdevs are re-read every 2 s");
                        return;
                    }
                }
                match tx.try_send(()) {
                    Ok(()) | Err(crossbeam_channel::TrySendError::Full(())) => {}
                    Err(crossbeam_channel::TrySendError::Disconnected(())) => return,
                }
                // A burst (an interface brought up announces its link, then each address)
                // is one re-read, and a host whose interfaces churn costs at most 50 a
                // second: what arrives meanwhile waits in the socket (or overflows it, which
                // says the same).
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        })?;
    Ok(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_as_the_kernel_has_it() {
        assert_eq!(interface_mtu("lo").unwrap(), 65536);
        assert_eq!(interface_mac("lo").unwrap(), [0; 6]);
        assert!(interface_running("lo").unwrap());
        assert!(interface_up("lo").unwrap());
        assert_eq!(interface_speed("lo"), None);
        assert!(interface_mtu("no-such-if0").is_err());
        assert!(interface_mtu("a-name-much-too-long-for-linux").is_err());
    }
}
