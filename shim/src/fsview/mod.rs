//! The files RDMA stacks look for before they use a device, without a kernel: UCX requires
//! `/dev/infiniband/uverbsN` to be a readable, writable character device and reads GID types
//! and netdevs under `/sys/class/infiniband/<dev>/ports/1/`; Open MPI's verbs components give
//! up when `/sys/class/infiniband` is missing. The shim shows each softroce device there
//! exactly as a kernel rxe device appears ([`tree`]), by interposing the libc calls these
//! libraries make on those paths ([`interpose`]), and only on those paths: every other path
//! goes to libc untouched.
//!
//! Why interposition, and not the alternatives (docs/stacks.md has the longer discussion):
//! * A FUSE file system run by the daemon needs `/dev/fuse` and a mount over `/sys/class` and
//!   `/dev`, which only root (or a setuid fusermount, itself refused inside most containers)
//!   can do, and it would change the view of every process on the machine.
//! * A private mount namespace set up by `softroce run` needs unprivileged user namespaces
//!   (off in many container runtimes and distributions) and makes the program uid 0 in its
//!   namespace, which Open MPI's `mpirun` refuses; it is also lost across `ssh`/`srun`
//!   launches of remote ranks, whereas `LD_PRELOAD` is forwarded (`mpirun -x`).
//! * Interposition costs a substring test per call on other paths, needs no privilege, and
//!   travels with `LD_PRELOAD`. Its limit: only the preload form interposes libc (a library
//!   found through the thin replacements comes after libc in the lookup order), and programs
//!   that make the system calls themselves (Go, static binaries) see the real file system.

pub mod interpose;
pub mod tree;

use std::sync::OnceLock;

use crate::abi::IBV_GID_TYPE_ROCE_V2;
use crate::runtime::{devices, ShimDevice};
use tree::{DeviceView, GidView, Tree};

static VIEW: OnceLock<Tree> = OnceLock::new();

/// The view of the process's devices, built with the device table on first use (a stat of
/// `/sys/class/infiniband` before any verb connects to the daemon, as Open MPI does).
pub fn view() -> &'static Tree {
    VIEW.get_or_init(|| {
        let views: Vec<DeviceView> = devices().iter().map(device_view).collect();
        Tree::build(&views)
    })
}

fn device_view(dev: &ShimDevice) -> DeviceView {
    let desc = &dev.desc;
    let port = desc.ports.first();
    let attr = port.map(|p| p.attr);
    let table_len = attr.map_or(0, |a| usize::try_from(a.gid_tbl_len).unwrap_or(0));
    let mut gids = vec![None; table_len];
    let mut parent = String::new();
    if let Some(port) = port {
        for (slot, gid) in gids.iter_mut().zip(&port.gids) {
            if let Some(g) = gid {
                let ndev = interface_name(g.ndev_ifindex);
                if parent.is_empty() {
                    parent = ndev.clone();
                }
                *slot = Some(GidView {
                    gid: g.gid,
                    roce_v2: g.gid_type == IBV_GID_TYPE_ROCE_V2,
                    ndev,
                });
            }
        }
    }
    DeviceView {
        name: desc.name.clone(),
        node_guid: desc.node_guid,
        port_state: attr.map_or(1, |a| a.state as u32),
        phys_state: attr.map_or(3, |a| a.phys_state),
        active_width: attr.map_or(1, |a| a.active_width),
        active_speed: attr.map_or(1, |a| a.active_speed),
        cap_mask: attr.map_or(0, |a| a.port_cap_flags),
        gids,
        pkeys: port.map(|p| p.pkeys.clone()).unwrap_or_default(),
        parent,
    }
}

/// The name of interface `ifindex` ("" when it does not exist).
fn interface_name(ifindex: u32) -> String {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: buf has IF_NAMESIZE bytes, as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return String::new();
    }
    // SAFETY: if_indextoname wrote a NUL-terminated name into buf.
    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}
