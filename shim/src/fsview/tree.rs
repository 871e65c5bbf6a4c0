//! The files a kernel rxe device shows, as a tree of paths built from the shim's device
//! descriptions: `/dev/infiniband/uverbsN` and `rdma_cm`, `/sys/class/infiniband/<dev>` (a link
//! into `/sys/devices/virtual/infiniband/<dev>`, with `node_type`, `node_guid`, `ports/1/...`),
//! `/sys/class/infiniband_verbs/uverbsN` and `/sys/class/misc/rdma_cm`.
//!
//! The layout and every value are those of kernel 6.1's rxe on the rxe lab's guest (`ls -l`
//! and `cat` of each file, recorded in `docs/stacks.md`): an rxe device is a virtual device, so
//! it has no `device` link (UCX then reads no PCI id, as on rxe); the GID table lists all
//! `gid_tbl_len` slots, an empty slot reads as zeros and its `gid_attrs` files fail with EINVAL.
//! Pure: no system calls; [`super::interpose`] turns lookups into libc answers.

use std::collections::HashMap;

/// The directories the view owns: a path equal to one of them or under one is answered from
/// the tree (or ENOENT), any other path goes to the real file system untouched.
pub const ROOTS: [&str; 7] = [
    "/dev/infiniband",
    "/sys/class/infiniband",
    "/sys/class/infiniband_verbs",
    "/sys/class/misc/rdma_cm",
    "/sys/devices/virtual/infiniband",
    "/sys/devices/virtual/infiniband_verbs",
    "/sys/devices/virtual/misc/rdma_cm",
];

/// The uverbs character devices' major and first minor (`IB_UVERBS_MAJOR`,
/// `IB_UVERBS_BASE_MINOR`), and rdma_cm's misc minor as the lab's kernel numbered it.
pub const UVERBS_MAJOR: u32 = 231;
pub const UVERBS_BASE_MINOR: u32 = 192;
pub const MISC_MAJOR: u32 = 10;
pub const RDMA_CM_MINOR: u32 = 124;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    /// Entry names, in listing order.
    Dir(Vec<String>),
    /// A sysfs attribute: its text, or the errno its read fails with (an empty GID slot's
    /// type).
    File(Result<String, i32>),
    /// A symbolic link and its target as `readlink` reports it (relative, as in sysfs).
    Link(String),
    /// A character device: (major, minor), mode 0666 as udev leaves uverbs and rdma_cm.
    CharDev(u32, u32),
}

/// One GID slot as the view shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GidView {
    pub gid: [u8; 16],
    /// `RoCE v2` or `IB/RoCE v1`, as `gid_attrs/types/N` reads.
    pub roce_v2: bool,
    /// The netdev the GID belongs to (`gid_attrs/ndevs/N`).
    pub ndev: String,
}

/// What the tree needs of one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceView {
    pub name: String,
    pub node_guid: [u8; 8],
    /// `ibv_port_state` and `phys_state` numbers of port 1.
    pub port_state: u32,
    pub phys_state: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub cap_mask: u32,
    /// `gid_tbl_len` slots; `None` is empty.
    pub gids: Vec<Option<GidView>>,
    pub pkeys: Vec<u16>,
    /// The netdev rxe was created on (`parent`).
    pub parent: String,
}

/// The whole view: canonical absolute path (no trailing slash) to node.
#[derive(Debug, Default)]
pub struct Tree {
    nodes: HashMap<String, Node>,
}

/// Where a path leads.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup<'a> {
    /// Not a path of the view: the real file system answers.
    Real,
    /// A node of the view, at its canonical path (links followed as asked).
    Found(String, &'a Node),
    /// Inside the view but absent (or through a non-directory): the errno.
    Missing(i32),
}

impl Tree {
    /// The view of `devices`; with no device there is no view at all (every path is
    /// [`Lookup::Real`]), as on a machine without RDMA devices.
    pub fn build(devices: &[DeviceView]) -> Tree {
        let mut t = Tree::default();
        if devices.is_empty() {
            return t;
        }
        for root in [
            "/sys/devices/virtual/infiniband",
            "/sys/devices/virtual/infiniband_verbs",
        ] {
            t.dir(root);
        }
        t.dir("/dev/infiniband");
        t.dir("/sys/class/infiniband");
        t.dir("/sys/class/infiniband_verbs");
        t.file("/sys/class/infiniband_verbs/abi_version", "6");
        for (i, d) in devices.iter().enumerate() {
            t.device(i, d);
        }
        t.chardev("/dev/infiniband/rdma_cm", MISC_MAJOR, RDMA_CM_MINOR);
        let cm = "/sys/devices/virtual/misc/rdma_cm";
        t.dir(cm);
        t.file(&format!("{cm}/abi_version"), "4");
        t.file(
            &format!("{cm}/dev"),
            &format!("{MISC_MAJOR}:{RDMA_CM_MINOR}"),
        );
        t.dir(&format!("{cm}/power"));
        t.link(&format!("{cm}/subsystem"), "../../../../class/misc");
        t.file(
            &format!("{cm}/uevent"),
            &format!("MAJOR={MISC_MAJOR}\nMINOR={RDMA_CM_MINOR}\nDEVNAME=infiniband/rdma_cm"),
        );
        t.link(
            "/sys/class/misc/rdma_cm",
            "../../devices/virtual/misc/rdma_cm",
        );
        t
    }

    fn device(&mut self, index: usize, d: &DeviceView) {
        let name = &d.name;
        let base = format!("/sys/devices/virtual/infiniband/{name}");
        self.link(
            &format!("/sys/class/infiniband/{name}"),
            &format!("../../devices/virtual/infiniband/{name}"),
        );
        self.dir(&base);
        self.file(&format!("{base}/fw_ver"), "");
        self.file(&format!("{base}/node_desc"), "softroce");
        self.file(&format!("{base}/node_guid"), &guid_text(&d.node_guid));
        self.file(&format!("{base}/node_type"), "1: CA");
        self.file(&format!("{base}/parent"), &d.parent);
        self.dir(&format!("{base}/power"));
        self.link(&format!("{base}/subsystem"), "../../../../class/infiniband");
        self.file(&format!("{base}/sys_image_guid"), &guid_text(&d.node_guid));
        self.file(&format!("{base}/uevent"), &format!("NAME={name}"));
        let port = format!("{base}/ports/1");
        self.dir(&format!("{base}/ports"));
        self.dir(&port);
        self.file(
            &format!("{port}/cap_mask"),
            &format!("0x{:08x}", d.cap_mask),
        );
        self.file(&format!("{port}/lid"), "0x0");
        self.file(&format!("{port}/lid_mask_count"), "0");
        self.file(&format!("{port}/link_layer"), "Ethernet");
        self.file(
            &format!("{port}/phys_state"),
            &phys_state_text(d.phys_state),
        );
        self.file(
            &format!("{port}/rate"),
            &rate_text(d.active_width, d.active_speed),
        );
        self.file(&format!("{port}/sm_lid"), "0x0");
        self.file(&format!("{port}/sm_sl"), "0");
        self.file(&format!("{port}/state"), &port_state_text(d.port_state));
        self.dir(&format!("{port}/gids"));
        self.dir(&format!("{port}/gid_attrs"));
        self.dir(&format!("{port}/gid_attrs/types"));
        self.dir(&format!("{port}/gid_attrs/ndevs"));
        for (n, slot) in d.gids.iter().enumerate() {
            let gid = slot.as_ref().map_or([0; 16], |g| g.gid);
            self.file(&format!("{port}/gids/{n}"), &gid_text(&gid));
            let (ty, ndev) = match slot {
                Some(g) => (
                    Ok(if g.roce_v2 {
                        "RoCE v2\n"
                    } else {
                        "IB/RoCE v1\n"
                    }
                    .to_owned()),
                    Ok(format!("{}\n", g.ndev)),
                ),
                None => (Err(libc::EINVAL), Err(libc::EINVAL)),
            };
            self.node(&format!("{port}/gid_attrs/types/{n}"), Node::File(ty));
            self.node(&format!("{port}/gid_attrs/ndevs/{n}"), Node::File(ndev));
        }
        self.dir(&format!("{port}/pkeys"));
        for (n, pkey) in d.pkeys.iter().enumerate() {
            self.file(&format!("{port}/pkeys/{n}"), &format!("0x{pkey:04x}"));
        }

        let minor = UVERBS_BASE_MINOR + index as u32;
        let uverbs = format!("uverbs{index}");
        self.chardev(&format!("/dev/infiniband/{uverbs}"), UVERBS_MAJOR, minor);
        let vbase = format!("/sys/devices/virtual/infiniband_verbs/{uverbs}");
        self.link(
            &format!("/sys/class/infiniband_verbs/{uverbs}"),
            &format!("../../devices/virtual/infiniband_verbs/{uverbs}"),
        );
        self.dir(&vbase);
        // The provider ABI version (rxe's RXE_UVERBS_ABI_VERSION is 2).
        self.file(&format!("{vbase}/abi_version"), "2");
        self.file(&format!("{vbase}/dev"), &format!("{UVERBS_MAJOR}:{minor}"));
        self.file(&format!("{vbase}/ibdev"), name);
        self.dir(&format!("{vbase}/power"));
        self.link(
            &format!("{vbase}/subsystem"),
            "../../../../class/infiniband_verbs",
        );
        self.file(
            &format!("{vbase}/uevent"),
            &format!(
                "MAJOR={UVERBS_MAJOR}\nMINOR={minor}\nDEVNAME=infiniband/{uverbs}\nDEVMODE=0666"
            ),
        );
    }

    /// Adds `node` at `path` and its name to the parent directory's listing (parents are made
    /// first by the builder).
    fn node(&mut self, path: &str, node: Node) {
        if let Some((parent, leaf)) = path.rsplit_once('/') {
            if let Some(Node::Dir(entries)) = self.nodes.get_mut(parent) {
                entries.push(leaf.to_owned());
            }
        }
        self.nodes.insert(path.to_owned(), node);
    }

    fn dir(&mut self, path: &str) {
        self.node(path, Node::Dir(Vec::new()));
    }

    /// A sysfs attribute: one line.
    fn file(&mut self, path: &str, text: &str) {
        self.node(path, Node::File(Ok(format!("{text}\n"))));
    }

    fn link(&mut self, path: &str, target: &str) {
        self.node(path, Node::Link(target.to_owned()));
    }

    fn chardev(&mut self, path: &str, major: u32, minor: u32) {
        self.node(path, Node::CharDev(major, minor));
    }

    /// Resolves an absolute `path`: `.`/`..` and repeated slashes as the kernel does, the
    /// view's links followed (the last one only if `follow_last`).
    pub fn lookup(&self, path: &[u8], follow_last: bool) -> Lookup<'_> {
        // A trailing slash names the directory a link leads to, as in the kernel.
        let follow_last = follow_last || path.ends_with(b"/");
        let Some(normal) = normalize(path) else {
            return Lookup::Real;
        };
        if self.nodes.is_empty() || !owned(&normal) {
            return Lookup::Real;
        }
        let mut pending: Vec<String> = normal
            .split('/')
            .filter(|c| !c.is_empty())
            .rev()
            .map(str::to_owned)
            .collect();
        let mut cur = String::new();
        let mut hops = 0;
        while let Some(comp) = pending.pop() {
            match comp.as_str() {
                "." => continue,
                ".." => {
                    if let Some(i) = cur.rfind('/') {
                        cur.truncate(i);
                    }
                    continue;
                }
                _ => {}
            }
            cur.push('/');
            cur.push_str(&comp);
            let last = pending.is_empty();
            match self.nodes.get(&cur) {
                None if owned(&cur) => return Lookup::Missing(libc::ENOENT),
                None => {} // a real directory above the view (/sys, /sys/class, ...)
                Some(Node::Link(target)) if !last || follow_last => {
                    hops += 1;
                    if hops > 40 {
                        return Lookup::Missing(libc::ELOOP);
                    }
                    if let Some(i) = cur.rfind('/') {
                        cur.truncate(i);
                    }
                    if target.starts_with('/') {
                        cur.clear();
                    }
                    pending.extend(
                        target
                            .split('/')
                            .filter(|c| !c.is_empty())
                            .rev()
                            .map(str::to_owned),
                    );
                }
                Some(Node::Dir(_)) => {}
                Some(_) if !last => return Lookup::Missing(libc::ENOTDIR),
                Some(_) => {}
            }
        }
        match self.nodes.get(&cur) {
            Some(node) => Lookup::Found(cur, node),
            // Only the view's own links lead here, and they all land inside it.
            None => Lookup::Real,
        }
    }
}

/// True when the normalized absolute `path` is one of [`ROOTS`] or below one.
fn owned(path: &str) -> bool {
    ROOTS.iter().any(|root| {
        path.strip_prefix(root)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    })
}

/// Collapses repeated slashes and `.`, and resolves `..` lexically, for the [`owned`] test.
/// `None` for relative or non-UTF-8 paths (never the view's).
pub fn normalize(path: &[u8]) -> Option<String> {
    let path = std::str::from_utf8(path).ok()?;
    if !path.starts_with('/') {
        return None;
    }
    let mut parts: Vec<&str> = Vec::new();
    for comp in path.split('/') {
        match comp {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    Some(format!("/{}", parts.join("/")))
}

/// A quick test for paths that cannot be the view's, done before anything else on every
/// interposed call: the view's paths all contain "infiniband" or "rdma_cm".
pub fn may_be_owned(path: &[u8]) -> bool {
    path.first() == Some(&b'/') && (contains(path, b"infiniband") || contains(path, b"rdma_cm"))
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// `xxxx:xxxx:xxxx:xxxx`, as sysfs prints a GUID.
fn guid_text(guid: &[u8; 8]) -> String {
    guid.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// Eight groups of four hex digits, as sysfs prints a GID.
fn gid_text(gid: &[u8; 16]) -> String {
    gid.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// `ports/N/state` (drivers/infiniband/core/sysfs.c `state_show`).
fn port_state_text(state: u32) -> String {
    let name = match state {
        1 => "DOWN",
        2 => "INIT",
        3 => "ARMED",
        4 => "ACTIVE",
        5 => "ACTIVE_DEFER",
        _ => "NOP",
    };
    format!("{state}: {name}")
}

/// `ports/N/phys_state` (`phys_state_show`, IBTA 14.2.5.6).
fn phys_state_text(state: u8) -> String {
    let name = match state {
        1 => "Sleep",
        2 => "Polling",
        3 => "Disabled",
        4 => "PortConfigurationTraining",
        5 => "LinkUp",
        6 => "LinkErrorRecovery",
        7 => "Phy Test",
        _ => "<unknown>",
    };
    format!("{state}: {name}")
}

/// `ports/N/rate` (`rate_show`): the speed per lane times the width, e.g. rxe's default
/// "2.5 Gb/sec (1X SDR)".
fn rate_text(width: u8, speed: u8) -> String {
    use crate::abi::*;
    let lanes = match width {
        IB_WIDTH_4X => 4,
        IB_WIDTH_8X => 8,
        IB_WIDTH_12X => 12,
        IB_WIDTH_2X => 2,
        _ => 1,
    };
    let (tenths, name) = match speed {
        IB_SPEED_DDR => (50, " DDR"),
        IB_SPEED_QDR => (100, " QDR"),
        IB_SPEED_FDR10 => (100, " FDR10"),
        IB_SPEED_FDR => (140, " FDR"),
        IB_SPEED_EDR => (250, " EDR"),
        IB_SPEED_HDR => (500, " HDR"),
        IB_SPEED_NDR => (1000, " NDR"),
        _ => (25, " SDR"),
    };
    let total = tenths * lanes;
    let rate = if total % 10 == 0 {
        format!("{}", total / 10)
    } else {
        format!("{}.{}", total / 10, total % 10)
    };
    format!("{rate} Gb/sec ({lanes}X{name})")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> Tree {
        let mut gids = vec![None; 4];
        let mut v4 = [0u8; 16];
        v4[10] = 0xff;
        v4[11] = 0xff;
        v4[12..].copy_from_slice(&[127, 0, 0, 1]);
        gids[1] = Some(GidView {
            gid: v4,
            roce_v2: true,
            ndev: "lo".into(),
        });
        Tree::build(&[DeviceView {
            name: "srxe0".into(),
            node_guid: [0x02, 0, 0, 0xff, 0xfe, 0, 0, 1],
            port_state: 4,
            phys_state: 5,
            active_width: 1,
            active_speed: 1,
            cap_mask: 0x10000,
            gids,
            pkeys: vec![0xffff],
            parent: "lo".into(),
        }])
    }

    fn text(t: &Tree, path: &str) -> String {
        match t.lookup(path.as_bytes(), true) {
            Lookup::Found(_, Node::File(Ok(s))) => s.clone(),
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn files_read_as_on_kernel_rxe() {
        let t = view();
        assert_eq!(text(&t, "/sys/class/infiniband/srxe0/node_type"), "1: CA\n");
        assert_eq!(
            text(&t, "/sys/class/infiniband/srxe0/node_guid"),
            "0200:00ff:fe00:0001\n"
        );
        assert_eq!(
            text(&t, "/sys/class/infiniband/srxe0/ports/1/state"),
            "4: ACTIVE\n"
        );
        assert_eq!(
            text(&t, "/sys/class/infiniband/srxe0/ports/1/phys_state"),
            "5: LinkUp\n"
        );
        assert_eq!(
            text(&t, "/sys/class/infiniband/srxe0/ports/1/rate"),
            "2.5 Gb/sec (1X SDR)\n"
        );
        assert_eq!(
            text(&t, "/sys/class/infiniband/srxe0/ports/1/gids/1"),
            "0000:0000:0000:0000:0000:ffff:7f00:0001\n"
        );
        assert_eq!(
            text(&t, "/sys/class/infiniband/srxe0/ports/1/gids/0"),
            "0000:0000:0000:0000:0000:0000:0000:0000\n"
        );
        assert_eq!(
            text(&t, "/sys/class/infiniband/srxe0/ports/1/gid_attrs/types/1"),
            "RoCE v2\n"
        );
        assert_eq!(
            text(
                &t,
                "//sys/class/./infiniband/srxe0/ports/1/gid_attrs/ndevs/1"
            ),
            "lo\n"
        );
        assert!(matches!(
            t.lookup(
                b"/sys/class/infiniband/srxe0/ports/1/gid_attrs/types/2",
                true
            ),
            Lookup::Found(_, Node::File(Err(libc::EINVAL)))
        ));
        assert_eq!(
            text(&t, "/sys/class/infiniband_verbs/uverbs0/ibdev"),
            "srxe0\n"
        );
        assert_eq!(
            text(&t, "/sys/class/infiniband_verbs/uverbs0/dev"),
            "231:192\n"
        );
        assert_eq!(text(&t, "/sys/class/misc/rdma_cm/abi_version"), "4\n");
    }

    #[test]
    fn links_resolve_and_stay_links_when_not_followed() {
        let t = view();
        match t.lookup(b"/sys/class/infiniband/srxe0", false) {
            Lookup::Found(p, Node::Link(target)) => {
                assert_eq!(p, "/sys/class/infiniband/srxe0");
                assert_eq!(target, "../../devices/virtual/infiniband/srxe0");
            }
            other => panic!("{other:?}"),
        }
        match t.lookup(b"/sys/class/infiniband/srxe0/", false) {
            Lookup::Found(p, Node::Dir(entries)) => {
                assert_eq!(p, "/sys/devices/virtual/infiniband/srxe0");
                assert!(entries.contains(&"ports".to_owned()));
                assert!(!entries.contains(&"device".to_owned()));
            }
            other => panic!("{other:?}"),
        }
        match t.lookup(
            b"/sys/class/infiniband/srxe0/subsystem/srxe0/ports/1/../1/lid",
            true,
        ) {
            Lookup::Found(p, _) => {
                assert_eq!(p, "/sys/devices/virtual/infiniband/srxe0/ports/1/lid")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            t.lookup(b"/dev/infiniband/uverbs0", true),
            Lookup::Found("/dev/infiniband/uverbs0".into(), &Node::CharDev(231, 192))
        );
    }

    #[test]
    fn only_the_view_is_answered() {
        let t = view();
        assert_eq!(t.lookup(b"/sys/class/net/lo", true), Lookup::Real);
        assert_eq!(t.lookup(b"/sys/class/infiniband_mad", true), Lookup::Real);
        assert_eq!(t.lookup(b"relative/infiniband", true), Lookup::Real);
        assert_eq!(
            t.lookup(b"/sys/class/infiniband/mlx5_0", true),
            Lookup::Missing(libc::ENOENT)
        );
        assert_eq!(
            t.lookup(b"/sys/class/infiniband/srxe0/node_type/x", true),
            Lookup::Missing(libc::ENOTDIR)
        );
        assert_eq!(
            Tree::build(&[]).lookup(b"/dev/infiniband", true),
            Lookup::Real
        );
        assert!(may_be_owned(b"/dev/infiniband/rdma_cm"));
        assert!(!may_be_owned(b"/proc/self/maps"));
    }

    #[test]
    fn rates_read_as_sysfs_prints_them() {
        assert_eq!(rate_text(1, 1), "2.5 Gb/sec (1X SDR)");
        assert_eq!(rate_text(2, 32), "100 Gb/sec (4X EDR)");
        assert_eq!(rate_text(2, 16), "56 Gb/sec (4X FDR)");
    }
}
