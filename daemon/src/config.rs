//! What the daemon serves: devices, their addresses, RoCE version and MTU, and where the control
//! socket lives. From flags, a TOML file (`--config`), or the embedded default: one device,
//! `srxe0`, RoCE v2 on 127.0.0.1 and ::1.
//!
//! A device is either on the kernel's UDP sockets (`--addr`, `--netdev`: RoCE v2 only, as
//! rxe), or an L2 device of its own on the Ethernet behind a TAP interface (`--tap`), which
//! speaks RoCE v1, v2 or both (`--roce v1|v2|both`).

use anyhow::{bail, Context, Result};
use proto::ctl::{
    self, DeviceInfo, FaultDirection, FaultKind, FaultRule, FaultTrigger, GidEntry, LinkSpec,
    RoceVersion,
};
use proto::iface::IpCidr;
use proto::transport::{Algorithm, CcParams, CongestionConfig};
use proto::wire::EthernetAddress;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// The RoCE versions a device speaks (`--roce`, `roce = "..."`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum RoceMode {
    /// Ethertype 0x8915 only (a `--tap` device).
    #[serde(alias = "v1")]
    V1,
    /// UDP port 4791 only (the default; rxe's only mode).
    #[serde(alias = "v2")]
    V2,
    /// Both, each address listed twice in the GID table, once per type (as mlx5 does; a
    /// `--tap` device).
    #[serde(alias = "both")]
    Both,
}

impl RoceMode {
    /// Whether the device has GIDs of type `v`.
    pub fn offers(self, v: RoceVersion) -> bool {
        matches!(
            (self, v),
            (RoceMode::Both, _) | (RoceMode::V1, RoceVersion::V1) | (RoceMode::V2, RoceVersion::V2)
        )
    }

    /// The GID types of each address, in GID table order.
    pub fn gid_types(self) -> &'static [RoceVersion] {
        match self {
            RoceMode::V1 => &[RoceVersion::V1],
            RoceMode::V2 => &[RoceVersion::V2],
            RoceMode::Both => &[RoceVersion::V1, RoceVersion::V2],
        }
    }
}

impl core::fmt::Display for RoceMode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            RoceMode::V1 => "v1",
            RoceMode::V2 => "v2",
            RoceMode::Both => "both",
        })
    }
}

impl core::str::FromStr for RoceMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "both" | "v1,v2" | "v1+v2" => Ok(RoceMode::Both),
            other => match other.parse::<RoceVersion>() {
                Ok(RoceVersion::V1) => Ok(RoceMode::V1),
                Ok(RoceVersion::V2) => Ok(RoceMode::V2),
                Err(_) => Err(format!(
                    "unknown RoCE mode {other:?} (expected v1, v2 or both)"
                )),
            },
        }
    }
}

/// An Ethernet address from `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Result<EthernetAddress> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut mac {
        let part = parts.next().unwrap_or("");
        *b = u8::from_str_radix(part, 16)
            .with_context(|| format!("MAC address {s:?}: expected six hex bytes a:b:c:d:e:f"))?;
    }
    if parts.next().is_some() {
        bail!("MAC address {s:?}: expected six hex bytes a:b:c:d:e:f");
    }
    let mac = EthernetAddress(mac);
    if mac.is_multicast() || mac == EthernetAddress::default() {
        bail!("MAC address {s:?} is not a unicast address");
    }
    Ok(mac)
}

pub const DEFAULT_DEVICE: &str = "srxe0";
/// Loopback's link MTU is 65536, so the path MTU is the largest IB MTU.
pub const DEFAULT_MTU: u32 = 4096;

/// One device as configured.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceConfig {
    pub name: String,
    /// Addresses served (IPv4 and IPv6), besides those of `netdev`; `ADDR/PREFIX` on a
    /// `tap` device (the prefix says which peers are on its link; a bare address is a host
    /// route, /32 or /128).
    #[serde(default)]
    pub addr: Vec<IpCidr>,
    /// A network interface whose addresses are served, followed as they change.
    #[serde(default)]
    pub netdev: Option<String>,
    /// A TAP interface to create (or open) and be a host of its own behind: the L2 device,
    /// which frames packets itself and speaks RoCE v1 as well as v2.
    #[serde(default)]
    pub tap: Option<String>,
    /// The L2 device's Ethernet address (default: a locally administered one derived from
    /// the device name, stable across restarts).
    #[serde(default)]
    pub mac: Option<String>,
    #[serde(default = "default_mode")]
    pub roce: RoceMode,
    /// Largest path MTU in bytes (256 .. 4096).
    #[serde(default = "default_mtu")]
    pub mtu: u32,
    /// Most QPs and MRs the device will create.
    #[serde(default = "default_max_qp")]
    pub max_qp: u32,
    #[serde(default = "default_max_mr")]
    pub max_mr: u32,
    /// Deepest CQ a client may create (`ibv_query_device` reports it as `max_cqe`). The
    /// default is what the stacks ask for without tuning: libfabric's `ofi_rxm` creates its
    /// core CQs with 262,144 entries, which rxe's 32,767 refuses (EINVAL at `fi_enable`);
    /// 1,048,575 leaves room above that (mlx5 reports 4,194,303) and keeps a CQ ring within
    /// 2^20 slots of 64 bytes, whose pages are only touched as the CQ fills.
    #[serde(default = "default_max_cqe")]
    pub max_cqe: u32,
    /// The port's speed in Mb/s, as ethtool gives it, reported as the port's active width
    /// and speed (`ibv_query_port`) by the kernel's rule for RoCE devices
    /// (`ib_get_eth_speed`). Unset: the speed of the `netdev` when the kernel knows it (as
    /// rxe reports it), else [`DEFAULT_SPEED_MBPS`].
    #[serde(default)]
    pub speed: Option<u32>,
    /// Caps on what the device holds over all its clients and on what one client may hold on
    /// it (docs/robustness.md, "Resource limits"), the TOML table `[device.limits]`.
    /// Reaching one fails the verb with ENOMEM.
    #[serde(default)]
    pub limits: ResourceLimits,
    /// The GID type rdma_cm uses on this device (configfs `default_roce_mode`); unset, RoCE
    /// v2 where the device offers it, else v1 (the kernel's rule). See
    /// [`DeviceConfig::cm_roce_mode`].
    #[serde(default)]
    pub default_roce_mode: Option<RoceVersion>,
    /// `CMA_CM_RESPONSE_TIMEOUT` (4.096 µs · 2^t) and `CMA_MAX_CM_RETRIES` of the REQs the
    /// device's rdma_cm sends: the kernel's 20 and 15 unless tests want a dead address to be
    /// found unreachable sooner.
    #[serde(default = "default_cm_response_timeout")]
    pub cm_response_timeout: u8,
    #[serde(default = "default_cm_max_retries")]
    pub cm_max_retries: u8,
    /// Send packets between QPs of this device through its UDP socket, so that a capture on
    /// the interface shows them (`tcpdump -i lo`), instead of handing them from engine to
    /// engine inside the daemon as rxe's loopback does (faster; the default).
    #[serde(default)]
    pub local_via_socket: bool,
    /// UDP GSO on send (one whole RoCE packet per segment): over IPv6, to IPv4 loopback, and
    /// over IPv4 to softroce devices (which accept any Identification). A capture on `lo`, or
    /// on a veth or bridge to another softroce device, shows each GSO send as one oversized
    /// datagram; turn it off (`--no-gso`) to capture packet by packet there.
    #[serde(default = "default_true")]
    pub gso: bool,
    /// Fault injection rules in force from the start (`[[device.fault]]`), as
    /// `softroce fault` adds them on a running daemon.
    #[serde(default)]
    pub fault: Vec<FaultConfig>,
    /// How RC QPs recover lost packets (`--loss-recovery`): go-back-N as rxe, selective
    /// retransmission, or selective only with peers that are softroce too (the default).
    #[serde(default)]
    pub loss_recovery: LossRecoveryMode,
    /// The bandwidth-delay product (bytes) selective retransmission's window is capped at
    /// (`--selective-bdp`).
    #[serde(default = "default_selective_bdp")]
    pub selective_bdp: u32,
    /// Congestion control: `dcqcn` (the default: ECN, CNPs, per-QP pacing) or `none`
    /// (kernel rxe's behaviour on the wire).
    #[serde(default = "default_cc")]
    pub cc: Algorithm,
    /// Congestion-control parameters by name (NVIDIA's DOCA names, or mlx5's `rp_`/`np_`
    /// ones), as `--cc-param NAME=VALUE`; docs/congestion.md lists them.
    #[serde(default)]
    pub cc_params: BTreeMap<String, CcParamValue>,
}

/// One `[[device.fault]]` table: `kind` (drop, duplicate, delay, reorder, corrupt, rnr,
/// access-error), `ms` for delay, `rate` (0..1) or `next` (a count; neither: every packet),
/// and optionally `qp` and `direction` ("tx" or "rx").
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultConfig {
    pub kind: String,
    #[serde(default)]
    pub ms: Option<u32>,
    #[serde(default)]
    pub rate: Option<f64>,
    #[serde(default)]
    pub next: Option<u32>,
    #[serde(default)]
    pub qp: Option<u32>,
    #[serde(default)]
    pub direction: Option<String>,
}

// The rate is a probability read from TOML; configs compare equal when it does.
impl Eq for FaultConfig {}

impl FaultConfig {
    /// The rule it stands for.
    pub fn rule(&self) -> Result<FaultRule> {
        let kind = match (self.kind.as_str(), self.ms) {
            ("drop", None) => FaultKind::Drop,
            ("duplicate", None) => FaultKind::Duplicate,
            ("delay", Some(ms)) => FaultKind::Delay { ms },
            ("delay", None) => bail!("fault kind delay needs ms"),
            ("reorder", None) => FaultKind::Reorder,
            ("corrupt", None) => FaultKind::Corrupt,
            ("rnr", None) => FaultKind::Rnr,
            ("access-error", None) => FaultKind::AccessError,
            (k, Some(_)) if k != "delay" => bail!("fault kind {k} takes no ms"),
            (k, _) => bail!(
                "unknown fault kind {k:?} (drop, duplicate, delay, reorder, corrupt, rnr, access-error)"
            ),
        };
        let trigger = match (self.rate, self.next) {
            (Some(_), Some(_)) => bail!("a fault has a rate or a next count, not both"),
            (Some(r), None) if (0.0..=1.0).contains(&r) => FaultTrigger::Rate {
                ppm: (r * 1_000_000.0).round() as u32,
            },
            (Some(r), None) => bail!("fault rate {r} is not between 0 and 1"),
            (None, Some(count)) => FaultTrigger::Next { count },
            (None, None) => FaultTrigger::Rate { ppm: 1_000_000 },
        };
        let direction = match self.direction.as_deref() {
            None | Some("both") => FaultDirection::Both,
            Some("tx") => FaultDirection::Tx,
            Some("rx") => FaultDirection::Rx,
            Some(d) => bail!("fault direction {d:?}: expected tx or rx"),
        };
        Ok(FaultRule {
            kind,
            trigger,
            qpn: self.qp,
            direction,
        })
    }
}

/// `--loss-recovery`: how a device's RC QPs recover lost packets (docs/loss-recovery.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LossRecoveryMode {
    /// Go-back-N, exactly as kernel rxe, toward every peer; probes from softroce peers are
    /// answered "not offered".
    Gbn,
    /// Selective retransmission on every RC QP at once, without asking the peer: for
    /// networks of softroce devices only (a kernel rxe peer would see SACK packets).
    Selective,
    /// Selective retransmission with peers that answer softroce's capability probe (a
    /// vendor MAD on QP1), go-back-N with everyone else.
    #[default]
    Auto,
}

impl std::str::FromStr for LossRecoveryMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "gbn" => Ok(LossRecoveryMode::Gbn),
            "selective" => Ok(LossRecoveryMode::Selective),
            "auto" => Ok(LossRecoveryMode::Auto),
            _ => Err(format!("{s:?} is not one of gbn, selective, auto")),
        }
    }
}

/// A congestion-control parameter's value in the TOML config: a number, a boolean, or the
/// text `--cc-param` would take.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum CcParamValue {
    Number(u64),
    Flag(bool),
    Text(String),
}

impl CcParamValue {
    fn text(&self) -> String {
        match self {
            CcParamValue::Number(n) => n.to_string(),
            CcParamValue::Flag(b) => u8::from(*b).to_string(),
            CcParamValue::Text(t) => t.clone(),
        }
    }
}

impl std::fmt::Display for LossRecoveryMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LossRecoveryMode::Gbn => "gbn",
            LossRecoveryMode::Selective => "selective",
            LossRecoveryMode::Auto => "auto",
        })
    }
}

fn default_selective_bdp() -> u32 {
    proto::transport::selective::DEFAULT_BDP_BYTES
}

/// The lateness a paced QP of the daemon may make up at once, µs (`pacing_tolerance`). The
/// engine's default, 20 µs, is a NIC's; the daemon's device thread wakes for a paced packet
/// through the kernel's timers and scheduler, on a VM tens to hundreds of µs late when the
/// machine is busy and now and then 2-30 ms late (the thread not scheduled at all), and every
/// µs of lateness not made up is rate lost (measured on a loaded two-CPU VM, load average
/// 8-20: a QP paced at 1 Gbit/s sent 0.55-0.7 Gbit/s with 20 µs, 0.84 with 1 ms, 0.98 with
/// 5 ms; at 300 Mbit/s 0.70-0.92 with 1 ms, 1.00 with 5 ms). The price is a burst of up to
/// 5 ms of the QP's rate after such a stall, which keeps the rate the QP was given over the
/// stall (a QP below the line rate only: one at the line rate is not paced).
pub const DAEMON_PACING_TOLERANCE_US: u32 = 5000;

fn default_cc() -> Algorithm {
    Algorithm::Dcqcn
}

fn default_true() -> bool {
    true
}

fn default_mode() -> RoceMode {
    RoceMode::V2
}

/// Resource caps of one device, besides `max_qp` and `max_mr` (device-wide). Every value is a
/// count or bytes; TOML keys as the field names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceLimits {
    /// Most CQs the device holds.
    #[serde(default = "default_max_cq")]
    pub max_cq: u32,
    /// Most SRQs the device holds.
    #[serde(default = "default_max_srq")]
    pub max_srq: u32,
    /// Most bytes registered in MRs over all clients (registration pins nothing here, so the
    /// default is the whole 47-bit user address space of many processes).
    #[serde(default = "default_max_mr_bytes")]
    pub max_mr_bytes: u64,
    /// Most bytes of shared ring memory (QP, SRQ and CQ rings) over all clients: the daemon
    /// allocates it.
    #[serde(default = "default_max_ring_bytes")]
    pub max_ring_bytes: u64,
    /// What one client may hold on the device.
    #[serde(default = "default_client_max_qp")]
    pub client_max_qp: u32,
    #[serde(default = "default_client_max_cq")]
    pub client_max_cq: u32,
    #[serde(default = "default_client_max_mr")]
    pub client_max_mr: u32,
    #[serde(default = "default_client_max_srq")]
    pub client_max_srq: u32,
    #[serde(default = "default_client_max_mr_bytes")]
    pub client_max_mr_bytes: u64,
    #[serde(default = "default_client_max_ring_bytes")]
    pub client_max_ring_bytes: u64,
}

fn default_max_cq() -> u32 {
    ctl::DeviceLimits::default().max_cq
}
fn default_max_srq() -> u32 {
    ctl::DeviceLimits::default().max_srq
}
fn default_max_mr_bytes() -> u64 {
    1 << 52
}
fn default_max_ring_bytes() -> u64 {
    8 << 30
}
fn default_client_max_qp() -> u32 {
    // A client gets another QPN block of 65536 numbers each time its QPs fill those it has
    // (device::DeviceThread::grow_qpns); 131072 lets one process hold the 100,000 QPs of the
    // scale goal (issue 17), its rings still capped by client_max_ring_bytes.
    1 << 17
}
fn default_client_max_cq() -> u32 {
    1 << 16
}
fn default_client_max_mr() -> u32 {
    1 << 19
}
fn default_client_max_srq() -> u32 {
    1 << 14
}
fn default_client_max_mr_bytes() -> u64 {
    1 << 47
}
fn default_client_max_ring_bytes() -> u64 {
    2 << 30
}

impl Default for ResourceLimits {
    fn default() -> ResourceLimits {
        ResourceLimits {
            max_cq: default_max_cq(),
            max_srq: default_max_srq(),
            max_mr_bytes: default_max_mr_bytes(),
            max_ring_bytes: default_max_ring_bytes(),
            client_max_qp: default_client_max_qp(),
            client_max_cq: default_client_max_cq(),
            client_max_mr: default_client_max_mr(),
            client_max_srq: default_client_max_srq(),
            client_max_mr_bytes: default_client_max_mr_bytes(),
            client_max_ring_bytes: default_client_max_ring_bytes(),
        }
    }
}

fn default_max_connections() -> u32 {
    1024
}
fn default_max_connections_per_uid() -> u32 {
    256
}

/// A user or group, by number or by name (resolved when the daemon starts).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum UserOrId {
    Id(u32),
    Name(String),
}

impl std::str::FromStr for UserOrId {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<UserOrId, Self::Err> {
        Ok(s.parse()
            .map_or_else(|_| UserOrId::Name(s.to_string()), UserOrId::Id))
    }
}

impl UserOrId {
    /// The uid this names.
    pub fn uid(&self) -> Result<u32> {
        match self {
            UserOrId::Id(id) => Ok(*id),
            UserOrId::Name(n) if n.parse::<u32>().is_ok() => Ok(n.parse()?),
            UserOrId::Name(n) => nix::unistd::User::from_name(n)
                .ok()
                .flatten()
                .map(|u| u.uid.as_raw())
                .with_context(|| format!("no user named {n:?}")),
        }
    }

    /// The gid this names.
    pub fn gid(&self) -> Result<u32> {
        match self {
            UserOrId::Id(id) => Ok(*id),
            UserOrId::Name(n) if n.parse::<u32>().is_ok() => Ok(n.parse()?),
            UserOrId::Name(n) => nix::unistd::Group::from_name(n)
                .ok()
                .flatten()
                .map(|g| g.gid.as_raw())
                .with_context(|| format!("no group named {n:?}")),
        }
    }
}

fn default_cm_response_timeout() -> u8 {
    proto::cm::rdma_cm::CMA_CM_RESPONSE_TIMEOUT
}
fn default_cm_max_retries() -> u8 {
    proto::cm::rdma_cm::CMA_MAX_CM_RETRIES
}
fn default_mtu() -> u32 {
    DEFAULT_MTU
}
// The device-wide defaults are kernel rxe's (proto::ctl::DeviceLimits), so that
// `ibv_devinfo -v` reads as on rxe.
fn default_max_qp() -> u32 {
    ctl::DeviceLimits::default().max_qp
}
fn default_max_mr() -> u32 {
    ctl::DeviceLimits::default().max_mr
}
pub fn default_max_cqe() -> u32 {
    (1 << 20) - 1
}

impl DeviceConfig {
    pub fn new(name: &str) -> DeviceConfig {
        DeviceConfig {
            name: name.to_string(),
            addr: Vec::new(),
            netdev: None,
            tap: None,
            mac: None,
            roce: default_mode(),
            mtu: default_mtu(),
            max_qp: default_max_qp(),
            max_mr: default_max_mr(),
            max_cqe: default_max_cqe(),
            speed: None,
            limits: ResourceLimits::default(),
            default_roce_mode: None,
            cm_response_timeout: default_cm_response_timeout(),
            cm_max_retries: default_cm_max_retries(),
            local_via_socket: false,
            gso: true,
            fault: Vec::new(),
            loss_recovery: LossRecoveryMode::default(),
            selective_bdp: default_selective_bdp(),
            cc: default_cc(),
            cc_params: BTreeMap::new(),
        }
    }

    /// The device `softroce link add` asks for.
    pub fn from_spec(spec: &LinkSpec) -> Result<DeviceConfig> {
        let mut d = DeviceConfig::new(&spec.name);
        d.addr = spec.addr.clone();
        d.netdev = spec.netdev.clone();
        d.tap = spec.tap.clone();
        d.mac = spec.mac.clone();
        if let Some(r) = &spec.roce {
            d.roce = r
                .parse()
                .map_err(|e: String| anyhow::anyhow!("device {}: {e}", spec.name))?;
        }
        if let Some(m) = spec.mtu {
            d.mtu = m;
        }
        d.validate()?;
        Ok(d)
    }

    /// Adds one `--cc-param NAME=VALUE`.
    pub fn add_cc_param(&mut self, assignment: &str) -> Result<()> {
        let Some((name, value)) = assignment.split_once('=') else {
            bail!("--cc-param {assignment:?}: expected NAME=VALUE");
        };
        self.cc_params.insert(
            name.trim().to_string(),
            CcParamValue::Text(value.trim().to_string()),
        );
        Ok(())
    }

    /// The device's congestion control: the algorithm with its parameters applied to the
    /// defaults (NVIDIA's, and [`DAEMON_PACING_TOLERANCE_US`]).
    pub fn congestion(&self) -> Result<CongestionConfig> {
        let mut params = CcParams {
            pacing_tolerance: DAEMON_PACING_TOLERANCE_US,
            ..CcParams::default()
        };
        for (name, value) in &self.cc_params {
            params
                .set(name, &value.text())
                .with_context(|| format!("device {}", self.name))?;
        }
        Ok(CongestionConfig {
            algorithm: self.cc,
            params,
        })
    }

    /// The embedded default: RoCE v2 on 127.0.0.1 and ::1.
    pub fn loopback_default() -> DeviceConfig {
        DeviceConfig {
            addr: vec!["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()],
            ..DeviceConfig::new(DEFAULT_DEVICE)
        }
    }

    /// The GID type rdma_cm uses: `default_roce_mode`, else v2 if offered (the kernel's
    /// CMA_PREFERRED_ROCE_GID_TYPE), else v1.
    pub fn cm_roce_mode(&self) -> RoceVersion {
        self.default_roce_mode
            .unwrap_or(if self.roce.offers(RoceVersion::V2) {
                RoceVersion::V2
            } else {
                RoceVersion::V1
            })
    }

    pub fn validate(&self) -> Result<()> {
        if self.name.is_empty() || self.name.len() > 63 || self.name.contains('/') {
            bail!(
                "device name {:?} must be 1 to 63 characters without '/'",
                self.name
            );
        }
        if ctl::mtu_enum(self.mtu).is_none() {
            bail!(
                "device {}: MTU {} is not one of 256, 512, 1024, 2048, 4096",
                self.name,
                self.mtu
            );
        }
        // A CQ is a ring of a power-of-two number of slots, one kept empty: the deepest CQ
        // is 2^k - 1 (rxe's 32,767, mlx5's 4,194,303).
        if self.max_cqe == 0
            || self.max_cqe > default_max_cqe()
            || !(self.max_cqe + 1).is_power_of_two()
        {
            bail!(
                "device {}: max_cqe {} must be one less than a power of two, at most {}",
                self.name,
                self.max_cqe,
                default_max_cqe()
            );
        }
        if let Some(tap) = &self.tap {
            if self.netdev.is_some() {
                bail!(
                    "device {}: --tap {tap} and --netdev exclude each other (a TAP device has its own addresses: --addr ADDR/PREFIX)",
                    self.name
                );
            }
            if tap.is_empty() || tap.len() > 15 || tap.contains('/') {
                bail!(
                    "device {}: TAP interface name {tap:?} must be 1 to 15 characters without '/'",
                    self.name
                );
            }
            if let Some(m) = &self.mac {
                parse_mac(m).with_context(|| format!("device {}", self.name))?;
            }
        } else {
            if self.addr.is_empty() && self.netdev.is_none() {
                bail!(
                    "device {} has no address: give --addr, --netdev or --tap",
                    self.name
                );
            }
            if self.roce != RoceMode::V2 {
                // Refused rather than half-served: RoCE v1 is Ethernet frames of type 0x8915,
                // which a device on the kernel's UDP sockets can neither send nor receive.
                bail!(
                    "device {}: RoCE {} needs a device of its own on the Ethernet: add --tap TAP (a TAP interface the daemon creates or opens; see the README); --addr/--netdev devices speak RoCE v2 only",
                    self.name,
                    self.roce
                );
            }
            if self.mac.is_some() {
                bail!("device {}: --mac is for a --tap device", self.name);
            }
        }
        if !self.roce.offers(self.cm_roce_mode()) {
            bail!(
                "device {}: default_roce_mode {} is not offered: the device speaks RoCE {} only",
                self.name,
                self.cm_roce_mode(),
                self.roce
            );
        }
        if self.selective_bdp < 4096 {
            bail!(
                "device {}: selective_bdp {} is below 4096 bytes",
                self.name,
                self.selective_bdp
            );
        }
        self.congestion()?;
        if !(8..=31).contains(&self.cm_response_timeout) || self.cm_max_retries > 15 {
            bail!(
                "device {}: cm_response_timeout must be 8..31 and cm_max_retries 0..15",
                self.name
            );
        }
        Ok(())
    }
}

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub socket: Option<PathBuf>,
    /// Users besides the daemon's own that may connect (uids or user names).
    #[serde(default)]
    pub allow_uid: Vec<UserOrId>,
    /// Groups whose members may connect (gids or group names); the first one owns the
    /// control socket, which is then mode 0660 rather than 0600.
    #[serde(default)]
    pub allow_group: Vec<UserOrId>,
    /// Most control connections at once (each has a thread in the daemon), over all users.
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// Most control connections of one uid at once.
    #[serde(default = "default_max_connections_per_uid")]
    pub max_connections_per_uid: u32,
    #[serde(default, rename = "device")]
    pub devices: Vec<DeviceConfig>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            socket: None,
            allow_uid: Vec::new(),
            allow_group: Vec::new(),
            max_connections: default_max_connections(),
            max_connections_per_uid: default_max_connections_per_uid(),
            devices: Vec::new(),
        }
    }
}

impl Config {
    pub fn from_toml(text: &str) -> Result<Config> {
        let c: Config = toml::from_str(text)?;
        Ok(c)
    }

    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config {}", path.display()))?;
        Config::from_toml(&text).with_context(|| format!("parsing config {}", path.display()))
    }

    pub fn validate(&self) -> Result<()> {
        if self.devices.is_empty() {
            bail!("no device configured");
        }
        if self.max_connections == 0 || self.max_connections_per_uid == 0 {
            bail!("max_connections and max_connections_per_uid must be at least 1");
        }
        for u in &self.allow_uid {
            u.uid()?;
        }
        for g in &self.allow_group {
            g.gid()?;
        }
        for (i, d) in self.devices.iter().enumerate() {
            d.validate()?;
            for f in &d.fault {
                f.rule().with_context(|| format!("device {}", d.name))?;
            }
            if self.devices[..i].iter().any(|o| o.name == d.name) {
                bail!("device {} is configured twice", d.name);
            }
        }
        Ok(())
    }
}

/// `softroce link add --save`: appends the device to the TOML config at `path` as a
/// `[[device]]` table with the keys the command gave; the rest of the file, comments
/// included, stays as it was.
pub fn save_added(path: &Path, spec: &LinkSpec) -> Result<()> {
    edit_config(path, |doc| {
        let devices = doc
            .entry("device")
            .or_insert(toml_edit::Item::ArrayOfTables(Default::default()))
            .as_array_of_tables_mut()
            .context("`device` in the config is not an array of tables")?;
        if devices
            .iter()
            .any(|t| t.get("name").and_then(|n| n.as_str()) == Some(spec.name.as_str()))
        {
            bail!("the config already has a device {}", spec.name);
        }
        let mut t = toml_edit::Table::new();
        t.insert("name", toml_edit::value(spec.name.as_str()));
        if !spec.addr.is_empty() {
            // A host address as written (`127.0.0.2`), a prefix where one was given.
            let addrs: toml_edit::Array = spec
                .addr
                .iter()
                .map(|a| {
                    let host = if a.addr.is_ipv4() { 32 } else { 128 };
                    if a.prefix_len == host {
                        a.addr.to_string()
                    } else {
                        a.to_string()
                    }
                })
                .collect();
            t.insert("addr", toml_edit::value(addrs));
        }
        if let Some(n) = &spec.netdev {
            t.insert("netdev", toml_edit::value(n.as_str()));
        }
        if let Some(n) = &spec.tap {
            t.insert("tap", toml_edit::value(n.as_str()));
        }
        if let Some(m) = &spec.mac {
            t.insert("mac", toml_edit::value(m.as_str()));
        }
        if let Some(r) = &spec.roce {
            t.insert("roce", toml_edit::value(r.as_str()));
        }
        if let Some(m) = spec.mtu {
            t.insert("mtu", toml_edit::value(i64::from(m)));
        }
        devices.push(t);
        Ok(())
    })
}

/// `softroce link del --save`: removes the device's `[[device]]` table from the config.
pub fn save_removed(path: &Path, name: &str) -> Result<()> {
    edit_config(path, |doc| {
        let Some(devices) = doc
            .get_mut("device")
            .and_then(|d| d.as_array_of_tables_mut())
        else {
            bail!("the config has no device {name}");
        };
        let before = devices.len();
        devices.retain(|t| t.get("name").and_then(|n| n.as_str()) != Some(name));
        if devices.len() == before {
            bail!("the config has no device {name}");
        }
        Ok(())
    })
}

/// Reads, edits and atomically replaces the config (the result must still parse).
fn edit_config(
    path: &Path,
    edit: impl FnOnce(&mut toml_edit::DocumentMut) -> Result<()>,
) -> Result<()> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config {}", path.display()))?;
    let mut doc: toml_edit::DocumentMut = text
        .parse()
        .with_context(|| format!("parsing config {}", path.display()))?;
    edit(&mut doc)?;
    let out = doc.to_string();
    Config::from_toml(&out).context("the edited config does not parse")?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, out).with_context(|| format!("writing {}", Path::new(&tmp).display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))?;
    Ok(())
}

/// Where the control socket is: `--socket`, else `$SOFTROCE_SOCKET`, else
/// `$XDG_RUNTIME_DIR/softroce/ctl.sock`, else `/run/softroce/ctl.sock`.
pub fn socket_path(flag: Option<&Path>) -> PathBuf {
    if let Some(p) = flag {
        return p.to_path_buf();
    }
    if let Some(p) = std::env::var_os("SOFTROCE_SOCKET").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").filter(|p| !p.is_empty()) {
        return PathBuf::from(dir).join("softroce/ctl.sock");
    }
    PathBuf::from("/run/softroce/ctl.sock")
}

/// The link MTU of a network interface, in the daemon's network namespace
/// ([`crate::net::interface`]).
pub fn netdev_mtu(name: &str) -> Option<u32> {
    crate::net::interface::interface_mtu(name)
        .ok()
        .and_then(|m| u32::try_from(m).ok())
}

/// The addresses of a network interface, now.
pub fn netdev_addrs(name: &str) -> Result<Vec<IpAddr>> {
    let mut out = Vec::new();
    let mut found = false;
    for ifa in nix::ifaddrs::getifaddrs()? {
        if ifa.interface_name != name {
            continue;
        }
        found = true;
        let Some(addr) = ifa.address else { continue };
        if let Some(v4) = addr.as_sockaddr_in() {
            out.push(IpAddr::V4(v4.ip()));
        } else if let Some(v6) = addr.as_sockaddr_in6() {
            out.push(IpAddr::V6(v6.ip()));
        }
    }
    if !found {
        bail!("no network interface named {name}");
    }
    Ok(out)
}

/// Whether a network interface is up with carrier (`IFF_UP` and `IFF_RUNNING`): kernel rxe's
/// port is ACTIVE exactly then (`rxe_notify`: `netif_running && netif_carrier_ok`), and
/// DOWN (`IBV_EVENT_PORT_ERR`) otherwise.
pub fn netdev_running(name: &str) -> bool {
    crate::net::interface::interface_running(name).unwrap_or(false)
}

fn netdev_mac(name: &str) -> Option<[u8; 6]> {
    crate::net::interface::interface_mac(name)
        .ok()
        .filter(|mac| *mac != [0; 6])
}

/// EUI-64 from a MAC: insert ff:fe and flip the universal/local bit (as rxe's node GUID).
fn eui64(mac: [u8; 6]) -> [u8; 8] {
    EthernetAddress(mac).eui64()
}

/// A locally administered MAC derived from the device name, stable across restarts.
fn derived_mac(name: &str) -> [u8; 6] {
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let b = h.to_be_bytes();
    [0x02, b[3], b[4], b[5], b[6], b[7]]
}

/// The Ethernet address of a `--tap` device: `--mac`, else derived from its name.
pub fn tap_mac(d: &DeviceConfig) -> EthernetAddress {
    d.mac
        .as_deref()
        .and_then(|m| parse_mac(m).ok())
        .unwrap_or(EthernetAddress(derived_mac(&d.name)))
}

/// The addresses of a `--tap` device with their prefixes: its link-local `fe80::` address
/// (EUI-64 of its MAC, rxe's GID 0) first, then `--addr`.
pub fn tap_addrs(d: &DeviceConfig) -> Vec<IpCidr> {
    let ll = IpCidr::new(IpAddr::V6(tap_mac(d).link_local()), 64);
    let mut out = vec![ll];
    for a in &d.addr {
        if !out.iter().any(|o| o.addr == a.addr) {
            out.push(*a);
        }
    }
    out
}

/// A device as presented to clients: its GID table and port attributes, with the addresses of
/// its netdev read now.
pub fn device_info(d: &DeviceConfig) -> Result<DeviceInfo> {
    if d.tap.is_some() {
        return Ok(tap_device_info(d));
    }
    let mut addrs: Vec<IpAddr> = d.addr.iter().map(|c| c.addr).collect();
    if let Some(n) = &d.netdev {
        for a in netdev_addrs(n)? {
            if !addrs.contains(&a) {
                addrs.push(a);
            }
        }
    }
    // A MAC for the GUID and the default GID: the netdev's, or a locally administered one
    // derived from the device name, stable across restarts.
    let mac = d
        .netdev
        .as_deref()
        .and_then(netdev_mac)
        .unwrap_or_else(|| derived_mac(&d.name));
    let guid = eui64(mac);
    // One RoCE GID per address. Link-local IPv6 addresses come first, so a device on a real
    // NIC looks like rxe's (index 0 = fe80::EUI-64, then the IPv4 and other addresses); on
    // loopback, which has no link-local address, index 0 is 127.0.0.1 and `-g 0` works.
    addrs.sort_by_key(|a| !matches!(a, IpAddr::V6(v6) if v6.is_unicast_link_local()));
    let gids = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| GidEntry {
            index: i as u32,
            gid: ctl::gid_of(*a),
            roce: RoceVersion::V2,
        })
        .collect();
    // As rxe: the active MTU is the largest IB MTU the netdev's link MTU carries with the
    // RoCE headers (a 1500-byte veth or NIC: 1024), capped by the configured one. A 4096-byte
    // path MTU over such a link sent packets the link refuses, and every multi-packet message
    // between two hosts stalled (UCX's 2 KiB eager sends, fi_pingpong).
    let link = d
        .netdev
        .as_deref()
        .and_then(netdev_mtu)
        .map_or(5, ctl::active_mtu_for_link);
    let mtu = ctl::mtu_enum(d.mtu).unwrap_or(5).min(link);
    Ok(DeviceInfo {
        name: d.name.clone(),
        node_guid: u64::from_be_bytes(guid),
        roce: RoceVersion::V2,
        max_mtu: 5,
        active_mtu: mtu,
        port_active: !addrs.is_empty() && d.netdev.as_deref().is_none_or(netdev_running),
        gids,
        netdevs: d.netdev.iter().cloned().collect(),
        max_cqe: d.max_cqe,
        limits: device_limits(d),
        speed_mbps: port_speed(d, d.netdev.as_deref()),
    })
}

/// What a device without a known link speed reports, in Mb/s: 100 Gb/s (4X EDR), what kernel
/// rxe reports on a link whose speed is unknown (a virtio NIC: ethtool's SPEED_UNKNOWN falls
/// through `ib_get_eth_speed`'s table to its last row) and the common RoCE NIC's. Kernel rxe
/// on `lo` reports 2.5 Gb/s (1X SDR, its fallback of 1 Gb/s when there is no ethtool), and
/// the stacks size their protocols by it: UCX 1.13 then sends a 64 KiB tagged message as
/// eight 8 KiB copies (rendezvous from 415 KB) instead of one zero-copy RDMA READ
/// (rendezvous from 39 KB at 100 Gb/s), at a quarter of the speed (docs/stacks.md).
pub const DEFAULT_SPEED_MBPS: u32 = 100_000;

/// The device's port speed (Mb/s): configured, else its interface's, else the default.
fn port_speed(d: &DeviceConfig, netdev: Option<&str>) -> u32 {
    d.speed
        .or_else(|| netdev.and_then(netdev_speed))
        .unwrap_or(DEFAULT_SPEED_MBPS)
}

/// An interface's speed in Mb/s when the kernel knows it (ethtool's; `lo` has none, a link
/// without carrier has none known).
pub fn netdev_speed(name: &str) -> Option<u32> {
    crate::net::interface::interface_speed(name)
}

/// The device-wide caps a client is told (`ibv_query_device`).
fn device_limits(d: &DeviceConfig) -> ctl::DeviceLimits {
    ctl::DeviceLimits {
        max_qp: d.max_qp,
        max_cq: d.limits.max_cq,
        max_mr: d.max_mr,
        max_srq: d.limits.max_srq,
    }
}

/// A `--tap` device as presented to clients: GID 0 is its `fe80::` address, then `--addr`;
/// with `--roce both` each address twice, RoCE v1 then v2, as mlx5 lists them. The port's
/// active MTU is what the TAP interface's MTU carries (rxe's rule; 1500, a new TAP's, gives
/// 1024), at most the configured one.
pub fn tap_device_info(d: &DeviceConfig) -> DeviceInfo {
    let link_mtu = d
        .tap
        .as_deref()
        .and_then(|t| crate::net::interface::interface_mtu(t).ok())
        .unwrap_or(1500);
    let active_mtu = ctl::mtu_enum(d.mtu)
        .unwrap_or(5)
        .min(ib_mtu_for_link(link_mtu));
    let mac = tap_mac(d);
    let mut gids = Vec::new();
    for a in tap_addrs(d) {
        for &roce in d.roce.gid_types() {
            gids.push(GidEntry {
                index: gids.len() as u32,
                gid: ctl::gid_of(a.addr),
                roce,
            });
        }
    }
    DeviceInfo {
        name: d.name.clone(),
        node_guid: u64::from_be_bytes(mac.eui64()),
        roce: if d.roce == RoceMode::V1 {
            RoceVersion::V1
        } else {
            RoceVersion::V2
        },
        max_mtu: 5,
        active_mtu,
        // The TAP administratively up (`ip link set TAP down` takes the port down; its
        // carrier is the daemon's own, off only after `softroce link set NAME down`, and
        // IFF_RUNNING follows a TAP's carrier up to a second late); one not made yet is
        // about to be, and up.
        port_active: d
            .tap
            .as_deref()
            .is_none_or(|t| crate::net::interface::interface_up(t).unwrap_or(true)),
        gids,
        netdevs: Vec::new(),
        max_cqe: d.max_cqe,
        limits: device_limits(d),
        // The TAP's own speed is the tun driver's fiction (10 Mb/s): the device is the host.
        speed_mbps: port_speed(d, None),
    }
}

/// The largest IB MTU enum (1 = 256 .. 5 = 4096) a link of `link_mtu` bytes carries: rxe's
/// rule, the link MTU less 80 bytes of headers (roce-rxe-facts.md §0.15): 1500 gives 1024.
pub fn ib_mtu_for_link(link_mtu: usize) -> u8 {
    let room = link_mtu.saturating_sub(80);
    (1..=5u8)
        .rev()
        .find(|e| (128usize << e) <= room)
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_config_parses_and_validates() {
        let c = Config::from_toml(
            r#"
            socket = "/tmp/x.sock"
            [[device]]
            name = "srxe0"
            addr = ["127.0.0.1", "::1"]
            [[device]]
            name = "srxe1"
            addr = ["127.0.0.2"]
            mtu = 1024
            "#,
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.devices[1].mtu, 1024);
        assert_eq!(c.devices[0].roce, RoceMode::V2);
        assert!(Config::from_toml("[[device]]\nname = \"a\"\nbogus = 1").is_err());
        let dup = Config::from_toml(
            "[[device]]\nname=\"a\"\naddr=[\"127.0.0.1\"]\n[[device]]\nname=\"a\"\naddr=[\"127.0.0.2\"]",
        )
        .unwrap();
        assert!(dup.validate().is_err());
        let mut bad = DeviceConfig::loopback_default();
        bad.mtu = 1500;
        assert!(bad.validate().is_err());
        bad.mtu = 1024;
        bad.roce = RoceMode::V1;
        let why = bad.validate().unwrap_err().to_string();
        assert!(why.contains("RoCE v1") && why.contains("--tap"), "{why}");
        bad.roce = RoceMode::Both;
        assert!(bad.validate().unwrap_err().to_string().contains("--tap"));
    }

    #[test]
    fn rdma_cm_settings_parse_and_a_mode_the_device_lacks_is_refused() {
        let c = Config::from_toml(
            "[[device]]\nname=\"a\"\naddr=[\"127.0.0.1\"]\ndefault_roce_mode=\"v2\"\ncm_response_timeout=12\ncm_max_retries=3",
        )
        .unwrap();
        c.validate().unwrap();
        let d = &c.devices[0];
        assert_eq!(
            (d.cm_roce_mode(), d.cm_response_timeout, d.cm_max_retries),
            (RoceVersion::V2, 12, 3)
        );
        let plain = DeviceConfig::loopback_default();
        assert_eq!((plain.cm_response_timeout, plain.cm_max_retries), (20, 15));
        let mut v1 = plain.clone();
        v1.default_roce_mode = Some(RoceVersion::V1);
        let why = v1.validate().unwrap_err().to_string();
        assert!(why.contains("default_roce_mode v1 is not offered"), "{why}");
        let mut fast = plain;
        fast.cm_max_retries = 16;
        assert!(fast.validate().is_err());
    }

    #[test]
    fn the_example_config_parses_and_its_faults_are_rules() {
        let c = Config::from_toml(include_str!("../../dist/softroce.toml")).unwrap();
        c.validate().unwrap();
        assert_eq!(c.devices.len(), 1);
        assert_eq!(
            c.devices[0],
            DeviceConfig::loopback_default(),
            "the example shows the defaults"
        );
        let c = Config::from_toml(
            "[[device]]\nname=\"a\"\naddr=[\"127.0.0.1\"]\n[[device.fault]]\nkind=\"delay\"\nms=20\nnext=3\ndirection=\"tx\"\n[[device.fault]]\nkind=\"drop\"\nrate=0.5",
        )
        .unwrap();
        c.validate().unwrap();
        let rules: Vec<FaultRule> = c.devices[0]
            .fault
            .iter()
            .map(|f| f.rule().unwrap())
            .collect();
        assert_eq!(rules[0].kind, FaultKind::Delay { ms: 20 });
        assert_eq!(rules[0].trigger, FaultTrigger::Next { count: 3 });
        assert_eq!(rules[1].trigger, FaultTrigger::Rate { ppm: 500_000 });
        let bad = Config::from_toml(
            "[[device]]\nname=\"a\"\naddr=[\"127.0.0.1\"]\n[[device.fault]]\nkind=\"delay\"",
        )
        .unwrap();
        assert!(bad.validate().is_err());
    }

    #[test]
    fn saving_a_link_keeps_the_comments_and_round_trips() {
        let dir = std::env::temp_dir().join(format!("softroce-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("softroce.toml");
        std::fs::write(&path, include_str!("../../dist/softroce.toml")).unwrap();
        let spec = LinkSpec {
            name: "srxe7".into(),
            addr: vec!["127.0.0.7".parse().unwrap()],
            mtu: Some(1024),
            ..LinkSpec::default()
        };
        save_added(&path, &spec).unwrap();
        assert!(save_added(&path, &spec).is_err(), "twice");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("# Fault injection from the start"),
            "comments kept"
        );
        let c = Config::load(&path).unwrap();
        c.validate().unwrap();
        assert_eq!(c.devices[1], DeviceConfig::from_spec(&spec).unwrap());
        save_removed(&path, "srxe7").unwrap();
        assert!(save_removed(&path, "srxe7").is_err());
        assert_eq!(Config::load(&path).unwrap().devices.len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn loss_recovery_settings_parse_with_auto_the_default() {
        let c = Config::from_toml(
            "[[device]]\nname=\"a\"\naddr=[\"127.0.0.1\"]\nloss_recovery=\"gbn\"\n[[device]]\nname=\"b\"\naddr=[\"127.0.0.2\"]\nselective_bdp=65536",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.devices[0].loss_recovery, LossRecoveryMode::Gbn);
        assert_eq!(c.devices[1].loss_recovery, LossRecoveryMode::Auto);
        assert_eq!(c.devices[1].selective_bdp, 65536);
        assert_eq!(DeviceConfig::loopback_default().selective_bdp, 512 * 1024);
        assert!(Config::from_toml("[[device]]\nname=\"a\"\nloss_recovery=\"irn\"").is_err());
        assert_eq!("selective".parse(), Ok(LossRecoveryMode::Selective));
        assert!("sack".parse::<LossRecoveryMode>().is_err());
        assert_eq!(LossRecoveryMode::Auto.to_string(), "auto");
        let mut small = DeviceConfig::loopback_default();
        small.selective_bdp = 100;
        assert!(small.validate().is_err());
    }

    #[test]
    fn congestion_control_is_dcqcn_by_default_and_takes_named_parameters() {
        let plain = DeviceConfig::loopback_default();
        let cc = plain.congestion().unwrap();
        assert_eq!(cc.algorithm, Algorithm::Dcqcn);
        assert_eq!(
            cc.params,
            CcParams {
                pacing_tolerance: DAEMON_PACING_TOLERANCE_US,
                ..CcParams::default()
            }
        );
        let c = Config::from_toml(
            "[[device]]\nname=\"a\"\naddr=[\"127.0.0.1\"]\ncc=\"none\"\n\
             cc_params = { rpg_time_reset = 55, clamp_tgt_rate = true, np_cnp_dscp = \"46\" }",
        )
        .unwrap();
        c.validate().unwrap();
        let cc = c.devices[0].congestion().unwrap();
        assert_eq!(cc.algorithm, Algorithm::None);
        assert_eq!(cc.params.rpg_time_reset, 55);
        assert!(cc.params.clamp_tgt_rate);
        assert_eq!(cc.params.cnp_dscp, 46);
        let mut d = DeviceConfig::loopback_default();
        d.add_cc_param("rpg_ai_rate=10").unwrap();
        assert_eq!(d.congestion().unwrap().params.rpg_ai_rate, 10);
        assert!(d.add_cc_param("rpg_ai_rate").is_err());
        d.add_cc_param("no_such_param=1").unwrap();
        let why = format!("{:#}", d.validate().unwrap_err());
        assert!(why.contains("no_such_param"), "{why}");
        assert!(Config::from_toml("[[device]]\nname=\"a\"\ncc=\"reno\"").is_err());
    }

    #[test]
    fn access_and_limits_parse_with_documented_defaults() {
        let c = Config::from_toml(
            r#"
            allow_uid = [1000, "root"]
            allow_group = ["0"]
            max_connections = 10
            [[device]]
            name = "srxe0"
            addr = ["127.0.0.1"]
            [device.limits]
            client_max_qp = 4
            max_ring_bytes = 1048576
            "#,
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(
            c.allow_uid,
            [UserOrId::Id(1000), UserOrId::Name("root".into())]
        );
        assert_eq!(c.allow_uid[1].uid().unwrap(), 0);
        assert_eq!((c.max_connections, c.max_connections_per_uid), (10, 256));
        let l = c.devices[0].limits;
        assert_eq!((l.client_max_qp, l.max_ring_bytes), (4, 1 << 20));
        assert_eq!(l.client_max_cq, ResourceLimits::default().client_max_cq);
        assert_eq!(c.devices[0].max_qp, 1_048_560, "rxe's max_qp by default");
        let bad = Config::from_toml(
            "allow_uid = [\"no-such-user-here\"]\n[[device]]\nname=\"a\"\naddr=[\"127.0.0.1\"]",
        )
        .unwrap();
        assert!(bad.validate().is_err());
        assert!(Config::from_toml("[[device]]\nname=\"a\"\n[device.limits]\nbogus = 1").is_err());
    }

    #[test]
    fn default_device_has_rxe_like_gids() {
        let info = device_info(&DeviceConfig::loopback_default()).unwrap();
        assert_eq!(info.gids.len(), 2);
        assert_eq!(
            info.gids[0].gid,
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1]
        );
        assert_eq!(info.gids[1].gid, std::net::Ipv6Addr::LOCALHOST.octets());
        assert_eq!(info.active_mtu, 5);
        assert_eq!(info.node_guid.to_be_bytes()[3..5], [0xff, 0xfe]);
    }

    #[test]
    fn a_tap_device_lists_each_address_once_per_type_in_mlx5_order() {
        let c = Config::from_toml(
            r#"
            [[device]]
            name = "srxe1"
            tap = "srtap1"
            addr = ["10.0.0.1/24", "fd00::1/64"]
            roce = "both"
            mac = "02:00:00:00:00:01"
            default_roce_mode = "v1"
            "#,
        )
        .unwrap();
        c.validate().unwrap();
        let d = &c.devices[0];
        assert_eq!(d.roce, RoceMode::Both);
        let info = device_info(d).unwrap();
        let table: Vec<(std::net::Ipv6Addr, RoceVersion)> = info
            .gids
            .iter()
            .map(|g| (std::net::Ipv6Addr::from(g.gid), g.roce))
            .collect();
        let ll: std::net::Ipv6Addr = "fe80::ff:fe00:1".parse().unwrap();
        let v4: std::net::Ipv6Addr = "::ffff:10.0.0.1".parse().unwrap();
        let v6: std::net::Ipv6Addr = "fd00::1".parse().unwrap();
        use RoceVersion::{V1, V2};
        assert_eq!(
            table,
            [(ll, V1), (ll, V2), (v4, V1), (v4, V2), (v6, V1), (v6, V2)]
        );
        assert!(info
            .gids
            .iter()
            .enumerate()
            .all(|(i, g)| g.index == i as u32));
        // The node GUID is the EUI-64 of the device's MAC, as rxe's of its netdev's.
        assert_eq!(info.node_guid, 0x0000_00ff_fe00_0001);
        let prefixes = tap_addrs(d);
        assert_eq!(prefixes[1].prefix_len, 24);
        // v1 only: one entry per address.
        let mut v1 = d.clone();
        v1.roce = RoceMode::V1;
        let info = device_info(&v1).unwrap();
        assert_eq!(info.gids.len(), 3);
        assert!(info.gids.iter().all(|g| g.roce == V1));
        assert_eq!(info.roce, V1);
        // A v1-only device cannot default rdma_cm to v2.
        assert_eq!(v1.cm_roce_mode(), V1);
        v1.default_roce_mode = Some(V2);
        assert!(v1
            .validate()
            .unwrap_err()
            .to_string()
            .contains("not offered"));
    }

    #[test]
    fn tap_settings_are_checked() {
        let mut d = DeviceConfig::new("srxe2");
        d.tap = Some("srtap2".into());
        // No --addr: the link-local GID alone is enough for RoCE v1 with -g 0.
        d.roce = RoceMode::V1;
        d.validate().unwrap();
        assert_eq!(d.cm_roce_mode(), RoceVersion::V1);
        assert_eq!(device_info(&d).unwrap().gids.len(), 1);
        d.netdev = Some("lo".into());
        assert!(d.validate().unwrap_err().to_string().contains("exclude"));
        d.netdev = None;
        for bad in [
            "01:00:00:00:00:01",
            "02:00:00:00:00",
            "zz:00:00:00:00:01",
            "0:0:0:0:0:0",
        ] {
            d.mac = Some(bad.into());
            assert!(d.validate().is_err(), "{bad}");
        }
        d.mac = Some("02:aa:bb:cc:dd:ee".into());
        d.validate().unwrap();
        assert_eq!(tap_mac(&d).0, [2, 0xaa, 0xbb, 0xcc, 0xdd, 0xee]);
        let mut udp = DeviceConfig::loopback_default();
        udp.mac = Some("02:aa:bb:cc:dd:ee".into());
        assert!(udp.validate().is_err());
        assert_eq!("BOTH".parse::<RoceMode>(), Ok(RoceMode::Both));
        assert!("v3".parse::<RoceMode>().is_err());
        assert_eq!(ib_mtu_for_link(1500), 3);
        assert_eq!(ib_mtu_for_link(9000), 5);
        assert_eq!(ib_mtu_for_link(600), 2);
        assert_eq!(ib_mtu_for_link(100), 1);
    }

    #[test]
    fn netdev_lo_is_followed() {
        let addrs = netdev_addrs("lo").unwrap();
        assert!(addrs.contains(&"127.0.0.1".parse().unwrap()));
        assert!(netdev_addrs("no-such-if0").is_err());
    }
}
