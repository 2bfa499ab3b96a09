//! The agent's configuration: the `ringside.toml` file, its defaults, and its translation into the
//! kernel's `CONFIG` entry and `MATCH_PREFIXES` keys.
//!
//! Every key is optional; `ringside.example.toml` documents each one with its default. Unknown keys
//! are rejected (`deny_unknown_fields`) so a typo never silently falls back to a default. Errors name
//! the file, the line and the key: a syntax or type error through the byte span the `toml` crate
//! attaches to it, a value that parses but is out of range (`ConfigFile::validate`, which also runs
//! the `[detect.*]` and `[policy]` sections' `validate`) through the spans of the parsed document
//! (`toml_edit`). `ringside check-config FILE` runs exactly this.
//! Command-line flags override the file (`AgentSettings::from_file_and_overrides` in `agent`).
use std::{
    fmt,
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    str::FromStr,
    time::Duration,
};

use dataplane_common::{config_flags, ipv4_mapped, PortRange, PrefixKey, MAX_PORT_RANGES, MAX_PREFIXES};
use serde::{de, Deserialize, Deserializer};

/// Default HTTP listen address (loopback: `/metrics`, `/healthz` and `/readyz` need no token).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9464";
/// Default map-poll interval.
pub const DEFAULT_POLL_INTERVAL_MS: u64 = 100;
/// Default bpffs directory the maps are pinned under.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/ringside";
/// Default idle time after which a flow is dropped from the agent's table (and from `FLOWS`).
pub const DEFAULT_FLOW_IDLE_TIMEOUT_SECS: u64 = 60;
/// Default burst gap: the kernel default, 1 ms.
pub const DEFAULT_BURST_GAP_US: u64 = dataplane_common::DEFAULT_BURST_GAP_NS / 1_000;
/// Default cap on flows held by the agent and default capacity of the kernel maps.
pub const DEFAULT_MAX_FLOWS: usize = dataplane_common::MAX_FLOWS as usize;
/// Smallest `kernel_max_flows`: below this, LRU maps spread over CPUs evict live flows constantly.
pub const MIN_KERNEL_MAX_FLOWS: u32 = 256;
/// Default size of the kernel's event ring `EVENTS` in KiB (the size the object declares).
pub const DEFAULT_KERNEL_EVENT_RING_KIB: u32 = dataplane_common::EVENTS_RING_BYTES / 1024;
/// Range of `kernel_event_ring_kib` (a power of two): 64 KiB to 256 MiB.
pub const KERNEL_EVENT_RING_KIB_RANGE: (u32, u32) = (64, 256 * 1024);
/// Default cap on distinct peers with their own metric series; further peers share `peer="other"`.
pub const DEFAULT_MAX_PEERS: usize = 256;
/// Default number of ended bursts remembered per flow.
pub const DEFAULT_BURST_HISTORY: usize = 32;
/// Default time constant of the rate EWMA.
pub const DEFAULT_EWMA_TAU_MS: u64 = 1_000;

/// The `ringside.toml` file as written by the operator. All keys optional.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Interfaces to attach to (added to `--iface`).
    pub interfaces: Option<Vec<String>>,
    /// HTTP listen address, default `127.0.0.1:9464`.
    pub listen: Option<SocketAddr>,
    /// Map-poll interval in milliseconds, default 100.
    pub poll_interval_ms: Option<u64>,
    /// bpffs directory for map pins, default `/sys/fs/bpf/ringside`.
    pub pin_dir: Option<PathBuf>,
    /// Leave the map pins in place on exit (the program is detached), default false.
    pub keep_pins: Option<bool>,
    /// Persistent mode, default false: on exit leave the program attached and the maps pinned, so
    /// packets are counted while no agent runs; the next agent takes over with every counter
    /// continuing. `ringside detach` removes it all.
    pub persist: Option<bool>,
    /// `clsact` (netlink filter on the clsact qdisc, default) or `tcx` (kernel ≥ 6.6 bpf links).
    pub attach: Option<AttachMode>,
    /// Seconds without a packet after which a flow is forgotten, default 60.
    pub flow_idle_timeout_secs: Option<u64>,
    /// Idle gap that ends a burst, in microseconds, default 1000.
    pub burst_gap_us: Option<u64>,
    /// Cap on flows in the agent's table, default `kernel_max_flows`.
    pub max_flows: Option<usize>,
    /// Capacity of the kernel map `FLOWS` (entries), set at load time, default
    /// 16384, at most 1048576. Memory: see the operator guide's "Sizing the kernel maps".
    pub kernel_max_flows: Option<u32>,
    /// Size of the kernel's event ring `EVENTS` (burst ends, new flows, map-full) in KiB, set at
    /// load time, a power of two from 64 to 262144, default 256 (2,730 events of 96 bytes).
    pub kernel_event_ring_kib: Option<u32>,
    /// Cap on peers with their own metric series, default 256.
    pub max_peers: Option<usize>,
    /// Ended bursts remembered per flow, default 32.
    pub burst_history: Option<usize>,
    /// Time constant of the rate EWMA in milliseconds, default 1000.
    pub ewma_tau_ms: Option<u64>,
    /// Debug records from the eBPF classifier (skipped packets, new flows), rate-limited in the
    /// kernel and logged under the `ringside::ebpf` target, default false.
    pub ebpf_debug_log: Option<bool>,
    /// Which traffic the kernel counts.
    #[serde(rename = "match")]
    pub match_: Option<MatchFile>,
    /// Directory for state that survives a restart (open detection events), default
    /// `/var/lib/ringside`.
    pub state_dir: Option<PathBuf>,
    /// Detection settings (`[detect]`).
    pub detect: Option<DetectFile>,
    /// Jobs (`[[job]]`); without any, one job `default` holds every matched flow.
    #[serde(rename = "job")]
    pub jobs: Option<Vec<JobFile>>,
    /// Policy settings (`[policy]`, see `docs/policy.md`); every key defaulted.
    pub policy: Option<crate::policy::PolicyConfig>,
    /// HTTP API settings (`[api]`).
    pub api: Option<ApiFile>,
    /// RDMA port counters (`[rdma]`).
    pub rdma: Option<RdmaFile>,
    /// Mirrored-frame ingest (`[mirror]`): flows the host kernel never sees.
    pub mirror: Option<MirrorFile>,
}

/// The `[mirror]` section: read frames a switch or DPU mirrors to an interface of the agent's
/// namespace (`crate::mirror`), for RoCE that hardware carries past the host kernel.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MirrorFile {
    /// The interface the mirrored frames arrive on (required; not one of `interfaces`).
    pub interface: Option<String>,
    /// Prefixes of the watched hosts: a mirrored frame from an address inside one is `egress`,
    /// any other `ingress` (so the peer label is the remote end). Default none: all `ingress`.
    pub local_prefixes: Option<Vec<PrefixSpec>>,
    /// Flows tracked from the mirror, default 16384.
    pub max_flows: Option<usize>,
    /// Blocks of the receive ring, default 16.
    pub ring_blocks: Option<u32>,
    /// Size of one ring block in KiB (a power of two, 4..=4096), default 256.
    pub ring_block_kib: Option<u32>,
}

impl MirrorFile {
    /// The resolved settings, `None` without an interface (validation refuses that).
    pub fn settings(&self) -> Option<crate::mirror::MirrorSettings> {
        let mut s = crate::mirror::MirrorSettings::new(self.interface.clone()?);
        s.local_prefixes = self.local_prefixes.iter().flatten().map(|p| p.to_key()).collect();
        s.max_flows = self.max_flows.unwrap_or(s.max_flows);
        s.ring_blocks = self.ring_blocks.unwrap_or(s.ring_blocks);
        s.ring_block_kib = self.ring_block_kib.unwrap_or(s.ring_block_kib);
        Some(s)
    }
}

/// The `[rdma]` section: the NIC's own port counters, for RoCE the host kernel never sees
/// (`crate::rdma_counters`). Read once per detection window by the analysis stage.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RdmaFile {
    /// Read the port counters and judge them, default true (with no device the agent says so
    /// once and reads nothing more than the empty directory).
    pub enabled: Option<bool>,
    /// Directory of the RDMA devices, default `/sys/class/infiniband`; elsewhere for a DPU that
    /// exposes its representors' counters under another path.
    pub counters_root: Option<PathBuf>,
}

/// The `[api]` section.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiFile {
    /// File of operator tokens, one per line (`#` comments). Without it the agent creates
    /// `<state_dir>/operator.token` (mode 0600) on first start and reuses it.
    pub operator_tokens_file: Option<PathBuf>,
}

/// Default directory for state that survives a restart.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/ringside";
/// Default detection window.
pub const DEFAULT_DETECT_WINDOW_MS: u64 = 1_000;
/// Default number of closed events kept for `/v1/events`.
pub const DEFAULT_RECENT_EVENTS: usize = 256;
/// Default windows a carried-over event waits for the detectors to re-raise it.
pub const DEFAULT_CARRY_OVER_WINDOWS: u32 = 10;

/// The `[detect]` section. The subsections tune the detectors (see `detect::DetectorConfig`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetectFile {
    /// Run the detectors, default true.
    pub enabled: Option<bool>,
    /// Detection window in milliseconds, default 1000.
    pub window_ms: Option<u64>,
    /// Closed events kept for `/v1/events`, default 256.
    pub recent_events: Option<usize>,
    /// Windows an event carried over from before a restart stays open without the detectors
    /// raising it again, default 10.
    pub carry_over_windows: Option<u32>,
    /// A peer with fewer bytes in a window is idle (detector default 64 KiB).
    pub min_window_bytes: Option<u64>,
    /// Data packets a loss or CE rate needs in a window (detector default 1000).
    pub min_data_packets: Option<u64>,
    pub persistence: Option<crate::detect::PersistenceConfig>,
    pub gray: Option<crate::detect::GrayConfig>,
    pub congestion: Option<crate::detect::CongestionConfig>,
    pub straggler: Option<crate::detect::StragglerConfig>,
}

/// One `[[job]]`: which flows belong to a job.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobFile {
    /// Job name, unique (the `job` of its events).
    pub name: String,
    /// Member hosts: addresses (`"10.77.0.2"`) or CIDR prefixes (`"10.77.0.0/24"`).
    pub members: Vec<MemberSpec>,
    /// TCP port ranges of the job's flows (either end). With neither `tcp_ports` nor `udp_ports`,
    /// every port matches; with one of them, only flows of that protocol on those ports.
    pub tcp_ports: Option<Vec<PortSpec>>,
    /// UDP port ranges (RoCEv2 is UDP 4791: list it to include RoCE flows).
    pub udp_ports: Option<Vec<PortSpec>>,
}

/// A job member: one address or a prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberSpec(pub PrefixSpec);

impl FromStr for MemberSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.contains('/') {
            return s.parse().map(MemberSpec);
        }
        let addr: IpAddr = s
            .trim()
            .parse()
            .map_err(|_| format!("`{s}` is neither an IP address nor a CIDR prefix (\"10.77.0.2\" or \"10.77.0.0/24\")"))?;
        Ok(MemberSpec(PrefixSpec { addr, len: if addr.is_ipv4() { 32 } else { 128 } }))
    }
}

impl<'de> Deserialize<'de> for MemberSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(de::Error::custom)
    }
}

impl PrefixSpec {
    /// Whether `addr` is inside the prefix (IPv4 and IPv6 never match each other).
    pub fn contains(&self, addr: IpAddr) -> bool {
        let bits = |a: IpAddr| -> (u128, u32) {
            match a {
                IpAddr::V4(v) => (u128::from(u32::from(v)) << 96, 32),
                IpAddr::V6(v) => (u128::from(v), 128),
            }
        };
        let (net, width) = bits(self.addr);
        let (a, w2) = bits(addr);
        if width != w2 {
            return false;
        }
        let len = u32::from(self.len).min(width);
        if len == 0 {
            return true;
        }
        let mask = u128::MAX << (128 - len);
        net & mask == a & mask
    }
}

/// The `[match]` section.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatchFile {
    /// TCP port ranges: `29500`, `"29500"` or `"29500-29600"`.
    pub tcp_ports: Option<Vec<PortSpec>>,
    /// UDP port ranges (RoCEv2 on 4791 always matches).
    pub udp_ports: Option<Vec<PortSpec>>,
    /// IPv4/IPv6 CIDR prefixes; a packet matches if its source or destination is inside one.
    pub prefixes: Option<Vec<PrefixSpec>>,
    /// Emit a FLOW_START event for each new flow, default false.
    pub flow_start_events: Option<bool>,
}

/// How the classifier is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum AttachMode {
    /// A `tc` filter on the clsact qdisc (added if missing). Survives a SIGKILL of the agent.
    #[default]
    Clsact,
    /// A TCX bpf link (kernel ≥ 6.6). Detached by the kernel when the agent exits, even on SIGKILL.
    Tcx,
}

impl fmt::Display for AttachMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AttachMode::Clsact => "clsact",
            AttachMode::Tcx => "tcx",
        })
    }
}

const PORT_ZERO: &str = "port 0 is not a port a flow can use; ports are 1-65535";

/// An inclusive port range `lo..=hi`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortSpec {
    pub lo: u16,
    pub hi: u16,
}

impl FromStr for PortSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parse = |p: &str| match p.trim().parse::<u16>() {
            Ok(0) => Err(PORT_ZERO.to_owned()),
            Ok(p) => Ok(p),
            Err(_) => Err(format!("`{p}` is not a port number (1-65535)")),
        };
        let (lo, hi) = match s.split_once('-') {
            Some((lo, hi)) => (parse(lo)?, parse(hi)?),
            None => {
                let p = parse(s)?;
                (p, p)
            }
        };
        if lo > hi {
            return Err(format!("port range `{s}` is reversed; write it as \"{hi}-{lo}\""));
        }
        Ok(PortSpec { lo, hi })
    }
}

impl<'de> Deserialize<'de> for PortSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = PortSpec;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a port (29500) or a port range (\"29500-29600\")")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<PortSpec, E> {
                match u16::try_from(v) {
                    Ok(0) => Err(E::custom(PORT_ZERO)),
                    Ok(p) => Ok(PortSpec { lo: p, hi: p }),
                    Err(_) => Err(E::custom(format!("{v} is not a port number (1-65535)"))),
                }
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<PortSpec, E> {
                self.visit_i64(i64::try_from(v).unwrap_or(i64::MAX))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<PortSpec, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// A CIDR prefix, IPv4 or IPv6.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixSpec {
    pub addr: IpAddr,
    pub len: u8,
}

impl FromStr for PrefixSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (a, l) = s.split_once('/').ok_or_else(|| {
            format!("`{s}` is not a CIDR prefix; write it as \"10.0.0.0/8\" or \"fd00::/8\"")
        })?;
        let addr: IpAddr = a
            .trim()
            .parse()
            .map_err(|_| format!("`{a}` in `{s}` is not an IPv4 or IPv6 address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len: u8 = l
            .trim()
            .parse()
            .ok()
            .filter(|l| *l <= max)
            .ok_or_else(|| format!("prefix length `{l}` in `{s}` must be 0-{max}"))?;
        Ok(PrefixSpec { addr, len })
    }
}

impl<'de> Deserialize<'de> for PrefixSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(de::Error::custom)
    }
}

impl PrefixSpec {
    /// The LPM-trie key: IPv6 as is, IPv4 as `::ffff:a.b.c.d/(96+n)`. Host bits are cleared so
    /// that `10.1.2.3/8` and `10.0.0.0/8` are the same key.
    pub fn to_key(self) -> PrefixKey {
        let (mut addr, prefix_len) = match self.addr {
            IpAddr::V4(v4) => (ipv4_mapped(v4.octets()), 96 + u32::from(self.len)),
            IpAddr::V6(v6) => (v6.octets(), u32::from(self.len)),
        };
        for (i, byte) in addr.iter_mut().enumerate() {
            let bits_before = (i as u32) * 8;
            if bits_before >= prefix_len {
                *byte = 0;
            } else if prefix_len - bits_before < 8 {
                *byte &= 0xffu8 << (8 - (prefix_len - bits_before));
            }
        }
        PrefixKey { prefix_len, addr }
    }
}

/// Errors reading or validating `ringside.toml`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}; check the path given to --config (or to check-config)")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("invalid config {path} line {line}, key `{key}`: {message}; see dataplane-user/ringside.example.toml")]
    Invalid { path: PathBuf, line: usize, key: String, message: String },
    #[error("invalid setting `{key}`: {message}")]
    Setting { key: &'static str, message: String },
}

impl ConfigFile {
    /// Reads and parses a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        Self::parse(&text, path)
    }

    /// Parses config text; `path` is only used in error messages. Then checks every value whose
    /// validity depends on more than its type (zero or out-of-range numbers, thresholds that must
    /// be ordered, too many ranges, names; `[detect.*]` and `[policy]` too): each error names the
    /// file, the line and the key.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let file: ConfigFile = toml::from_str(text).map_err(|e| {
            let offset = e.span().map(|s| s.start).unwrap_or(0);
            let (line, key) = locate(text, offset);
            ConfigError::Invalid { path: path.to_owned(), line, key, message: e.message().to_owned() }
        })?;
        file.validate().map_err(|mut bad| {
            let (line, key) = match line_of(text, &bad.path) {
                Some(line) => (line, bad.key()),
                // An ordering between two keys of a section (`z_clear` below `z_open`) where the
                // file sets only the other one: point at that one.
                None => bad.other_key_in(text).unwrap_or_else(|| (deepest_line(text, &bad.path), bad.key())),
            };
            ConfigError::Invalid { path: path.to_owned(), line, key, message: std::mem::take(&mut bad.message) }
        })?;
        Ok(file)
    }

    /// Every check that needs more than the value's type: ranges, orderings between keys, counts,
    /// names. The first bad value wins; its path leads to its line ([`line_of`]).
    fn validate(&self) -> Result<(), BadValue<'static>> {
        use crate::bounds::*;
        let top = |key: &'static str| move |m: String| BadValue::at(&[Seg::Key(key)], m);
        if let Some(ifaces) = &self.interfaces {
            for (i, name) in ifaces.iter().enumerate() {
                interface_name(name).map_err(|m| BadValue::at(&[Seg::Key("interfaces"), Seg::Index(i)], m))?;
            }
        }
        nonzero(self.poll_interval_ms).map_err(top("poll_interval_ms"))?;
        if let Some(dir) = &self.pin_dir {
            if !dir.is_absolute() {
                return Err(BadValue::at(&[Seg::Key("pin_dir")], format!("`{}` must be an absolute path in bpffs, such as \"{DEFAULT_PIN_DIR}\"", dir.display())));
            }
        }
        nonzero(self.flow_idle_timeout_secs).map_err(top("flow_idle_timeout_secs"))?;
        nonzero(self.burst_gap_us).map_err(top("burst_gap_us"))?;
        if let Some(gap) = self.burst_gap_us {
            // The detectors merge bursts less than `phase_merge_gap_ns` apart into one phase: a
            // burst gap at or above it would hand them phases that are never merged.
            let merge_us = crate::detect::DetectorConfig::default().phase_merge_gap_ns / 1_000;
            if gap >= merge_us {
                return Err(BadValue::at(&[Seg::Key("burst_gap_us")], format!("must be below the detectors' phase merge gap, {merge_us} µs (default {DEFAULT_BURST_GAP_US})")));
            }
        }
        nonzero(self.max_flows.map(|v| v as u64)).map_err(top("max_flows"))?;
        if let Some(n) = self.kernel_max_flows {
            let (lo, hi) = (MIN_KERNEL_MAX_FLOWS, dataplane_common::KERNEL_MAX_FLOWS_LIMIT);
            if !(lo..=hi).contains(&n) {
                return Err(BadValue::at(&[Seg::Key("kernel_max_flows")], format!("{n} is out of range: give {lo} to {hi} entries (default {DEFAULT_MAX_FLOWS})")));
            }
            if !n.is_power_of_two() {
                // FLOWS is an open-addressing table indexed by hash & (n - 1).
                return Err(BadValue::at(&[Seg::Key("kernel_max_flows")], format!("{n} is not a power of two: give {}", n.next_power_of_two())));
            }
        }
        if let Some(k) = self.kernel_event_ring_kib {
            let (lo, hi) = KERNEL_EVENT_RING_KIB_RANGE;
            if !(lo..=hi).contains(&k) || !k.is_power_of_two() {
                // A BPF ring buffer is a power-of-two number of pages.
                return Err(BadValue::at(
                    &[Seg::Key("kernel_event_ring_kib")],
                    format!("{k} is not a power of two from {lo} to {hi} KiB (default {DEFAULT_KERNEL_EVENT_RING_KIB})"),
                ));
            }
        }
        nonzero(self.max_peers.map(|v| v as u64)).map_err(top("max_peers"))?;
        nonzero(self.burst_history.map(|v| v as u64)).map_err(top("burst_history"))?;
        nonzero(self.ewma_tau_ms).map_err(top("ewma_tau_ms"))?;
        if let Some(dir) = &self.state_dir {
            non_empty_path(dir).map_err(top("state_dir"))?;
        }
        if let Some(m) = &self.match_ {
            let n = m.tcp_ports.as_ref().map_or(0, Vec::len) + m.udp_ports.as_ref().map_or(0, Vec::len);
            if n > MAX_PORT_RANGES {
                let key = if m.udp_ports.as_ref().is_some_and(|u| !u.is_empty()) { "udp_ports" } else { "tcp_ports" };
                return Err(BadValue::at(
                    &[Seg::Key("match"), Seg::Key(key)],
                    format!("{n} port ranges given (tcp_ports + udp_ports), the kernel holds at most {MAX_PORT_RANGES}; merge adjacent ranges"),
                ));
            }
            let p = m.prefixes.as_ref().map_or(0, Vec::len);
            if p > MAX_PREFIXES as usize {
                return Err(BadValue::at(&[Seg::Key("match"), Seg::Key("prefixes")], format!("{p} prefixes given, at most {MAX_PREFIXES}")));
            }
        }
        if let Some(d) = &self.detect {
            let key = |k: &'static str| move |m: String| BadValue::at(&[Seg::Key("detect"), Seg::Key(k)], m);
            nonzero(d.window_ms).map_err(key("window_ms"))?;
            if let (Some(w), Some(p)) = (d.window_ms, self.poll_interval_ms) {
                if w < p {
                    return Err(BadValue::at(&[Seg::Key("detect"), Seg::Key("window_ms")], format!("{w} ms is shorter than poll_interval_ms ({p} ms); a window holds at least one poll")));
                }
            }
            nonzero(d.recent_events.map(|v| v as u64)).map_err(key("recent_events"))?;
            nonzero(d.carry_over_windows.map(u64::from)).map_err(key("carry_over_windows"))?;
            nonzero(d.min_window_bytes).map_err(key("min_window_bytes"))?;
            nonzero(d.min_data_packets).map_err(key("min_data_packets"))?;
            let section = |name: &'static str| move |(k, m): (&'static str, String)| BadValue::at(&[Seg::Key("detect"), Seg::Key(name), Seg::Key(k)], m);
            if let Some(p) = &d.persistence {
                p.validate().map_err(section("persistence"))?;
            }
            if let Some(g) = &d.gray {
                g.validate().map_err(section("gray"))?;
            }
            if let Some(c) = &d.congestion {
                c.validate().map_err(section("congestion"))?;
            }
            if let Some(s) = &d.straggler {
                s.validate(crate::detect::DetectorConfig::default().phase_merge_gap_ns).map_err(section("straggler"))?;
            }
        }
        if let Some(p) = &self.policy {
            p.validate().map_err(|(path, m)| {
                let mut segs = vec![Seg::Key("policy")];
                segs.extend(path.iter().map(|&k| Seg::Key(k)));
                BadValue::at(&segs, m)
            })?;
        }
        if let Some(root) = self.rdma.as_ref().and_then(|r| r.counters_root.as_ref()) {
            if !root.is_absolute() {
                let m = format!("`{}` must be an absolute directory, such as \"{}\"", root.display(), crate::rdma_counters::DEFAULT_COUNTERS_ROOT);
                return Err(BadValue::at(&[Seg::Key("rdma"), Seg::Key("counters_root")], m));
            }
        }
        if let Some(m) = &self.mirror {
            let at = |key: &'static str, m: String| BadValue::at(&[Seg::Key("mirror"), Seg::Key(key)], m);
            match m.interface.as_deref() {
                None => return Err(at("interface", "is required in [mirror]: name the interface the mirrored frames arrive on (remove the section to read no mirror)".to_owned())),
                Some(i) if interface_name(i).is_err() => return Err(at("interface", interface_name(i).unwrap_err())),
                Some(i) if self.interfaces.as_ref().is_some_and(|l| l.iter().any(|x| x == i)) => {
                    return Err(at("interface", format!("`{i}` is also in `interfaces`: its frames would be counted twice; give the mirror port its own interface")));
                }
                Some(_) => {}
            }
            nonzero(m.max_flows.map(|v| v as u64)).map_err(|e| at("max_flows", e))?;
            if let Some(b) = m.ring_blocks {
                if !(1..=1024).contains(&b) {
                    return Err(at("ring_blocks", format!("{b} (must be 1..=1024)")));
                }
            }
            if let Some(k) = m.ring_block_kib {
                if !(4..=4096).contains(&k) || !k.is_power_of_two() {
                    return Err(at("ring_block_kib", format!("{k} (must be a power of two from 4 to 4096)")));
                }
            }
        }
        if let Some(tokens) = self.api.as_ref().and_then(|a| a.operator_tokens_file.as_ref()) {
            non_empty_path(tokens).map_err(|m| BadValue::at(&[Seg::Key("api"), Seg::Key("operator_tokens_file")], m))?;
        }
        self.validate_jobs()
    }

    /// `[[job]]` checks.
    fn validate_jobs(&self) -> Result<(), BadValue<'static>> {
        let jobs = self.jobs.as_deref().unwrap_or_default();
        for (i, j) in jobs.iter().enumerate() {
            let at = |key: &'static str, m: String| BadValue::at(&[Seg::Key("job"), Seg::Index(i), Seg::Key(key)], m);
            if j.name.trim().is_empty() {
                return Err(at("name", "must not be empty".to_owned()));
            }
            if let Some(first) = jobs[..i].iter().position(|o| o.name == j.name) {
                return Err(at("name", format!("job `{}` is defined twice (also job #{}); give each job its own name", j.name, first + 1)));
            }
            if j.members.is_empty() {
                return Err(at("members", "must list at least one address or prefix".to_owned()));
            }
        }
        Ok(())
    }
}

/// One step of a key path: a table key or an array index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seg<'a> {
    Key(&'a str),
    Index(usize),
}

/// A value that parsed but is not valid: where it is and why.
#[derive(Debug, Clone, PartialEq)]
pub struct BadValue<'a> {
    pub path: Vec<Seg<'a>>,
    pub message: String,
}

impl<'a> BadValue<'a> {
    fn at(path: &[Seg<'a>], message: String) -> Self {
        BadValue { path: path.to_vec(), message }
    }

    /// For an ordering message naming two keys in backticks, the line and dotted key of the
    /// other key, if the file sets it.
    fn other_key_in(&self, text: &str) -> Option<(usize, String)> {
        let Some(Seg::Key(own)) = self.path.last() else { return None };
        self.message.split('`').skip(1).step_by(2).filter(|k| k != own).find_map(|k| {
            let mut path = self.path.clone();
            *path.last_mut()? = Seg::Key(k);
            let line = line_of(text, &path)?;
            Some((line, BadValue { path, message: String::new() }.key()))
        })
    }

    /// The dotted key, without array indexes (`job.name`, `detect.gray.z_open`).
    fn key(&self) -> String {
        self.path.iter().filter_map(|s| if let Seg::Key(k) = s { Some(*k) } else { None }).collect::<Vec<_>>().join(".")
    }
}

/// Line number (1-based) of a byte offset, and the dotted key defined on that line or the
/// nearest line above it (the `[section]` header is prepended).
fn locate(text: &str, offset: usize) -> (usize, String) {
    let offset = offset.min(text.len());
    let line = text[..offset].matches('\n').count() + 1;
    let lines: Vec<&str> = text.lines().collect();
    let mut key = String::new();
    let mut section = String::new();
    for l in lines.iter().take(line).rev() {
        let t = l.trim();
        if key.is_empty() {
            if let Some((k, _)) = t.split_once('=') {
                if !t.starts_with('#') {
                    key = k.trim().trim_matches('"').to_owned();
                    continue;
                }
            }
        }
        if t.starts_with('[') {
            let name = t.trim_matches(|c| c == '[' || c == ']').trim().to_owned();
            if key.is_empty() {
                // The error is on the header itself (for example an unknown section).
                key = name;
            } else {
                section = name;
            }
            break;
        }
    }
    if !section.is_empty() {
        key = format!("{section}.{key}");
    }
    (line, key)
}

/// Line (1-based) of the value at `path`, found through the parsed document's spans (so dotted
/// keys, inline tables and `[[job]]` arrays all resolve): the key's line for a key, the element's
/// line for an array index. `None` when the file does not set it (a default).
fn line_of(text: &str, path: &[Seg]) -> Option<usize> {
    let (span, complete) = walk(text, path);
    if complete {
        span.map(|s| line_at(text, s.start))
    } else {
        None
    }
}

/// The line of the deepest step of `path` the file has (the `[section]` of a defaulted key); 0
/// when it has none.
fn deepest_line(text: &str, path: &[Seg]) -> usize {
    walk(text, path).0.map_or(0, |s| line_at(text, s.start))
}

fn line_at(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Follows `path` through the document: the span of the deepest step found, and whether every
/// step was.
fn walk(text: &str, path: &[Seg]) -> (Option<std::ops::Range<usize>>, bool) {
    use toml_edit::{Item, TableLike, Value};
    enum Node<'a> {
        Item(&'a Item),
        Table(&'a toml_edit::Table),
        Value(&'a Value),
    }
    let Ok(doc) = toml_edit::ImDocument::parse(text) else { return (None, false) };
    let mut node = Node::Item(doc.as_item());
    let mut span: Option<std::ops::Range<usize>> = None;
    for seg in path {
        let next = match (*seg, &node) {
            (Seg::Key(k), _) => {
                let table: Option<&dyn TableLike> = match node {
                    Node::Item(i) => i.as_table_like(),
                    Node::Table(t) => Some(t),
                    Node::Value(Value::InlineTable(t)) => Some(t),
                    Node::Value(_) => None,
                };
                table.and_then(|t| t.get_key_value(k)).map(|(key, v)| (key.span().or_else(|| v.span()), Node::Item(v)))
            }
            (Seg::Index(i), Node::Item(Item::ArrayOfTables(a))) => a.get(i).map(|t| (t.span(), Node::Table(t))),
            (Seg::Index(i), Node::Item(Item::Value(Value::Array(a))) | Node::Value(Value::Array(a))) => {
                a.get(i).map(|v| (v.span(), Node::Value(v)))
            }
            (Seg::Index(_), _) => None,
        };
        let Some((s, n)) = next else { return (span, false) };
        span = s.or(span);
        node = n;
    }
    (span, true)
}

/// The resolved match configuration handed to the kernel.
#[derive(Debug, Clone, PartialEq)]
pub struct MatchSettings {
    pub tcp_ports: Vec<PortSpec>,
    pub udp_ports: Vec<PortSpec>,
    pub prefixes: Vec<PrefixSpec>,
    pub flow_start_events: bool,
}

impl MatchSettings {
    pub fn from_file(m: Option<&MatchFile>) -> Self {
        let m = m.cloned().unwrap_or_default();
        MatchSettings {
            tcp_ports: m.tcp_ports.unwrap_or_default(),
            udp_ports: m.udp_ports.unwrap_or_default(),
            prefixes: m.prefixes.unwrap_or_default(),
            flow_start_events: m.flow_start_events.unwrap_or(false),
        }
    }

    /// The kernel `CONFIG` entry. Burst events are always on: they feed the burst history.
    pub fn kernel_config(&self, burst_gap: Duration) -> Result<dataplane_common::Config, ConfigError> {
        let ranges: Vec<PortRange> = self
            .tcp_ports
            .iter()
            .map(|p| (p, 6u8))
            .chain(self.udp_ports.iter().map(|p| (p, 17u8)))
            .map(|(p, protocol)| PortRange { lo: p.lo, hi: p.hi, protocol, _pad: [0; 3] })
            .collect();
        if ranges.len() > MAX_PORT_RANGES {
            return Err(ConfigError::Setting {
                key: "match.tcp_ports",
                message: format!("{} port ranges, the kernel holds at most {MAX_PORT_RANGES}", ranges.len()),
            });
        }
        if self.prefixes.len() > MAX_PREFIXES as usize {
            return Err(ConfigError::Setting {
                key: "match.prefixes",
                message: format!("{} prefixes, at most {MAX_PREFIXES}", self.prefixes.len()),
            });
        }
        let mut cfg = dataplane_common::Config {
            burst_gap_ns: u64::try_from(burst_gap.as_nanos()).unwrap_or(u64::MAX),
            n_port_ranges: ranges.len() as u32,
            n_prefixes: self.prefix_keys().len() as u32,
            flags: config_flags::BURST_EVENTS,
            ..Default::default()
        };
        if self.flow_start_events {
            cfg.flags |= config_flags::FLOW_START_EVENTS;
        }
        cfg.port_ranges[..ranges.len()].copy_from_slice(&ranges);
        Ok(cfg)
    }

    /// Distinct LPM keys (two specs with the same network collapse to one key).
    pub fn prefix_keys(&self) -> Vec<PrefixKey> {
        let mut keys: Vec<PrefixKey> = Vec::new();
        for p in &self.prefixes {
            let k = p.to_key();
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<ConfigFile, ConfigError> {
        ConfigFile::parse(s, Path::new("ringside.toml"))
    }

    #[test]
    fn empty_file_is_all_defaults() {
        assert_eq!(parse("").unwrap(), ConfigFile::default());
    }

    #[test]
    fn api_section() {
        let f = parse("[api]\noperator_tokens_file = \"/etc/ringside/ops\"\n").unwrap();
        assert_eq!(f.api.unwrap().operator_tokens_file.as_deref(), Some(Path::new("/etc/ringside/ops")));
        let e = parse("[api]\noperator_token = \"x\"\n").unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("api.operator_token"), "{e}");
    }

    #[test]
    fn kernel_event_ring_kib_range() {
        assert_eq!(parse("kernel_event_ring_kib = 2048\n").unwrap().kernel_event_ring_kib, Some(2048));
        assert_eq!(parse("kernel_event_ring_kib = 64\n").unwrap().kernel_event_ring_kib, Some(64));
        let e = parse("listen = \"127.0.0.1:1\"\nkernel_event_ring_kib = 1000\n").unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("kernel_event_ring_kib") && e.contains("power of two from 64 to 262144"), "{e}");
    }

    #[test]
    fn kernel_max_flows_range() {
        assert_eq!(parse("kernel_max_flows = 131072\n").unwrap().kernel_max_flows, Some(131_072));
        assert_eq!(parse("kernel_max_flows = 256\n").unwrap().kernel_max_flows, Some(256));
        let e = parse("listen = \"127.0.0.1:1\"\nkernel_max_flows = 100\n").unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("kernel_max_flows") && e.contains("256 to 1048576"), "{e}");
        let e = parse("kernel_max_flows = 100000\n").unwrap_err().to_string();
        assert!(e.contains("not a power of two: give 131072"), "{e}");
    }

    #[test]
    fn example_file_parses() {
        let text = include_str!("../ringside.example.toml");
        let f = parse(text).unwrap();
        assert_eq!(f.listen, Some(DEFAULT_LISTEN.parse().unwrap()));
        assert_eq!(f.poll_interval_ms, Some(DEFAULT_POLL_INTERVAL_MS));
        assert_eq!(f.pin_dir.as_deref(), Some(Path::new(DEFAULT_PIN_DIR)));
        assert_eq!(f.flow_idle_timeout_secs, Some(DEFAULT_FLOW_IDLE_TIMEOUT_SECS));
        assert_eq!(f.burst_gap_us, Some(DEFAULT_BURST_GAP_US));
        assert_eq!(f.max_flows, Some(DEFAULT_MAX_FLOWS));
        assert_eq!(f.kernel_max_flows, Some(DEFAULT_MAX_FLOWS as u32));
        assert_eq!(f.max_peers, Some(DEFAULT_MAX_PEERS));
        assert_eq!(f.burst_history, Some(DEFAULT_BURST_HISTORY));
        assert_eq!(f.ewma_tau_ms, Some(DEFAULT_EWMA_TAU_MS));
        assert_eq!(f.ebpf_debug_log, Some(false));
        // Nothing that narrows matching or adds jobs is live: copied as is, it counts what the
        // defaults count.
        assert_eq!(MatchSettings::from_file(f.match_.as_ref()), MatchSettings::from_file(None));
        assert_eq!(f.jobs, None);
        assert_eq!(f.state_dir.as_deref(), Some(Path::new(DEFAULT_STATE_DIR)));
        let d = f.detect.as_ref().unwrap();
        assert_eq!(d.window_ms, Some(DEFAULT_DETECT_WINDOW_MS));
        assert_eq!(d.recent_events, Some(DEFAULT_RECENT_EVENTS));
        assert_eq!(d.carry_over_windows, Some(DEFAULT_CARRY_OVER_WINDOWS));
        let defaults = crate::detect::DetectorConfig::default();
        assert_eq!((d.min_window_bytes, d.min_data_packets), (Some(defaults.min_window_bytes), Some(defaults.min_data_packets)));
        let r = f.rdma.as_ref().unwrap();
        assert_eq!((r.enabled, r.counters_root.as_deref()), (Some(true), Some(Path::new(crate::rdma_counters::DEFAULT_COUNTERS_ROOT))));
    }

    /// The example's commented-out `key = value` lines and `[table]` headers, uncommented, are a
    /// valid config too, and say what they claim.
    #[test]
    fn example_file_commented_examples_parse() {
        let text: String = include_str!("../ringside.example.toml")
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                Some(rest) if is_setting(rest) => rest,
                _ => l,
            })
            .map(|l| format!("{l}\n"))
            .collect();
        fn is_setting(l: &str) -> bool {
            let header = l.starts_with('[') && l.ends_with(']') && l.chars().all(|c| c.is_ascii_lowercase() || "[]._".contains(c));
            let key = l.split_once(" = ").is_some_and(|(k, _)| !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '_'));
            header || key
        }
        let f = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let m = MatchSettings::from_file(f.match_.as_ref());
        assert_eq!(m.tcp_ports, vec![PortSpec { lo: 29500, hi: 29600 }, PortSpec { lo: 12345, hi: 12345 }]);
        assert_eq!(m.prefixes.len(), 2);
        assert_eq!(f.interfaces, Some(vec!["eth0".to_owned()]));
        let jobs = f.jobs.as_ref().unwrap();
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].name, "train");
        assert_eq!(jobs[0].members.len(), 2);
        assert!(jobs[0].members[0].0.contains("10.77.0.9".parse().unwrap()));
        assert!(!jobs[0].members[0].0.contains("10.78.0.9".parse().unwrap()));
        assert_eq!(jobs[0].members[1].0.len, 128);
        assert!(f.detect.unwrap().gray.is_some() && f.policy.is_some());
        let mirror = f.mirror.as_ref().unwrap().settings().unwrap();
        assert_eq!((mirror.interface.as_str(), mirror.local_prefixes.len()), ("mirror0", 1));
        assert_eq!((mirror.max_flows, mirror.ring_blocks, mirror.ring_block_kib), (16384, 16, 256));
        assert_eq!(mirror, crate::mirror::MirrorSettings { local_prefixes: mirror.local_prefixes.clone(), ..crate::mirror::MirrorSettings::new("mirror0".into()) });
    }

    #[test]
    fn mirror_errors_name_line_and_key() {
        // The section without its interface: the header's line.
        let msg = parse("# ringside\n[mirror]\nmax_flows = 10\n").unwrap_err().to_string();
        assert!(msg.contains("line 2") && msg.contains("`mirror.interface`") && msg.contains("required"), "{msg}");
        for (line, key) in [
            ("max_flows = 0", "mirror.max_flows"),
            ("ring_blocks = 0", "mirror.ring_blocks"),
            ("ring_blocks = 2000", "mirror.ring_blocks"),
            ("ring_block_kib = 96", "mirror.ring_block_kib"),
            ("ring_block_kib = 8192", "mirror.ring_block_kib"),
            ("local_prefixes = [\"10.0.0.0/33\"]", "mirror.local_prefixes"),
        ] {
            let text = format!("# ringside\n[mirror]\ninterface = \"m0\"\n{line}\n");
            let msg = parse(&text).unwrap_err().to_string();
            assert!(msg.contains("line 4") && msg.contains(&format!("`{key}`")), "{text}=> {msg}");
        }
        let msg = parse("interfaces = [\"m0\"]\n[mirror]\ninterface = \"m0\"\n").unwrap_err().to_string();
        assert!(msg.contains("line 3") && msg.contains("counted twice"), "{msg}");
        let ok = parse("[mirror]\ninterface = \"m0\"\nring_blocks = 4\nring_block_kib = 64\nmax_flows = 9\n").unwrap();
        let s = ok.mirror.unwrap().settings().unwrap();
        assert_eq!((s.ring_blocks, s.ring_block_kib, s.max_flows, s.local_prefixes.len()), (4, 64, 9, 0));
    }

    #[test]
    fn job_errors_name_line_and_key() {
        let two = "[[job]]\nname = \"a\"\nmembers = [\"10.0.0.1\"]\n\n[[job]]\nname = \"a\"\nmembers = [\"10.0.0.2\"]\n";
        let msg = parse(two).unwrap_err().to_string();
        assert!(msg.contains("line 6") && msg.contains("job.name") && msg.contains("twice"), "{msg}");
        let msg = parse("[[job]]\nname = \"a\"\nmembers = []\n").unwrap_err().to_string();
        assert!(msg.contains("line 3") && msg.contains("job.members"), "{msg}");
        let msg = parse("[[job]]\nname = \"a\"\nmembers = [\"10.0.0.300\"]\n").unwrap_err().to_string();
        assert!(msg.contains("line 3") && msg.contains("members") && msg.contains("neither"), "{msg}");
        let msg = parse("[[job]]\nname = \"a\"\nmembers = [\"10.0.0.1\"]\ntcp_port = [1]\n").unwrap_err().to_string();
        assert!(msg.contains("line 4") && msg.contains("tcp_port"), "{msg}");
        let msg = parse("[detect]\nwindow_ms = 0\n").unwrap_err().to_string();
        assert!(msg.contains("line 2") && msg.contains("detect.window_ms"), "{msg}");
        let msg = parse("[detect.gray]\nz_opn = 1.0\n").unwrap_err().to_string();
        assert!(msg.contains("line 2") && msg.contains("z_opn"), "{msg}");
        let p = "::1/128".parse::<PrefixSpec>().unwrap();
        assert!(p.contains("::1".parse().unwrap()) && !p.contains("127.0.0.1".parse().unwrap()));
        assert!("0.0.0.0/0".parse::<PrefixSpec>().unwrap().contains("1.2.3.4".parse().unwrap()));
    }

    /// One bad value per key (issue 11): each error names the file, the line and the key. The
    /// bad line is the last of `text`, under a first line that is valid.
    #[test]
    fn every_bad_value_names_file_line_and_key() {
        #[rustfmt::skip]
        let cases: &[(&str, &str, &str)] = &[
            // (section, `key = value`, dotted key expected in the error)
            ("", "interfaces = [\"eth0\", \"\"]", "interfaces"),
            ("", "interfaces = [\"an-interface-name-too-long\"]", "interfaces"),
            ("", "interfaces = [\"eth0/1\"]", "interfaces"),
            ("", "interfaces = \"eth0\"", "interfaces"),
            ("", "listen = \"not an address\"", "listen"),
            ("", "listen = 9464", "listen"),
            ("", "poll_interval_ms = 0", "poll_interval_ms"),
            ("", "poll_interval_ms = -5", "poll_interval_ms"),
            ("", "poll_interval_ms = 1.5", "poll_interval_ms"),
            ("", "pin_dir = \"relative/pins\"", "pin_dir"),
            ("", "keep_pins = \"yes\"", "keep_pins"),
            ("", "persist = 1", "persist"),
            ("", "attach = \"xdp\"", "attach"),
            ("", "flow_idle_timeout_secs = 0", "flow_idle_timeout_secs"),
            ("", "burst_gap_us = 0", "burst_gap_us"),
            ("", "burst_gap_us = 20000", "burst_gap_us"),
            ("", "max_flows = 0", "max_flows"),
            ("", "kernel_max_flows = 0", "kernel_max_flows"),
            ("", "kernel_max_flows = 2000000", "kernel_max_flows"),
            ("", "kernel_max_flows = -1", "kernel_max_flows"),
            ("", "kernel_event_ring_kib = 0", "kernel_event_ring_kib"),
            ("", "kernel_event_ring_kib = 100", "kernel_event_ring_kib"),
            ("", "kernel_event_ring_kib = 524288", "kernel_event_ring_kib"),
            ("", "kernel_event_ring_kib = \"1M\"", "kernel_event_ring_kib"),
            ("", "max_peers = 0", "max_peers"),
            ("", "burst_history = 0", "burst_history"),
            ("", "ewma_tau_ms = 0", "ewma_tau_ms"),
            ("", "ebpf_debug_log = 1", "ebpf_debug_log"),
            ("", "state_dir = \"\"", "state_dir"),
            ("", "no_such_key = 1", "no_such_key"),
            ("match", "tcp_ports = [0]", "match.tcp_ports"),
            ("match", "tcp_ports = [\"0-10\"]", "match.tcp_ports"),
            ("match", "tcp_ports = [70000]", "match.tcp_ports"),
            ("match", "tcp_ports = [\"2-1\"]", "match.tcp_ports"),
            ("match", "tcp_ports = [\"http\"]", "match.tcp_ports"),
            ("match", "udp_ports = [-1]", "match.udp_ports"),
            ("match", "prefixes = [\"10.0.0.0/33\"]", "match.prefixes"),
            ("match", "prefixes = [\"10.0.0.1\"]", "match.prefixes"),
            ("match", "prefixes = [\"fd00::/129\"]", "match.prefixes"),
            ("match", "prefixes = [\"nonsense/8\"]", "match.prefixes"),
            ("match", "flow_start_events = \"no\"", "match.flow_start_events"),
            ("match", "ports = [1]", "match.ports"),
            ("detect", "enabled = \"yes\"", "detect.enabled"),
            ("detect", "window_ms = 0", "detect.window_ms"),
            ("detect", "recent_events = 0", "detect.recent_events"),
            ("detect", "carry_over_windows = 0", "detect.carry_over_windows"),
            ("detect", "min_window_bytes = 0", "detect.min_window_bytes"),
            ("detect", "min_data_packets = 0", "detect.min_data_packets"),
            ("detect.persistence", "raise_k = 0", "detect.persistence.raise_k"),
            ("detect.persistence", "raise_k = 4", "detect.persistence.raise_k"),
            ("detect.persistence", "raise_n = 33", "detect.persistence.raise_n"),
            ("detect.persistence", "raise_on_severe = 1", "detect.persistence.raise_on_severe"),
            ("detect.persistence", "mild_raise_k = 0", "detect.persistence.mild_raise_k"),
            ("detect.persistence", "mild_raise_k = 6", "detect.persistence.mild_raise_k"),
            ("detect.persistence", "mild_raise_n = 40", "detect.persistence.mild_raise_n"),
            ("detect.persistence", "clear_windows = 0", "detect.persistence.clear_windows"),
            ("detect.persistence", "persistent_windows = 0", "detect.persistence.persistent_windows"),
            ("detect.persistence", "recurrence_ns = 0", "detect.persistence.recurrence_ns"),
            ("detect.gray", "min_peers = 1", "detect.gray.min_peers"),
            ("detect.gray", "z_open = 1.0", "detect.gray.z_open"),
            ("detect.gray", "z_clear = -1.0", "detect.gray.z_clear"),
            ("detect.gray", "rel_scale_floor = 0.0", "detect.gray.rel_scale_floor"),
            ("detect.gray", "goodput_open_ratio = 1.5", "detect.gray.goodput_open_ratio"),
            ("detect.gray", "goodput_severe_ratio = 0.8", "detect.gray.goodput_severe_ratio"),
            ("detect.gray", "goodput_clear_ratio = nan", "detect.gray.goodput_clear_ratio"),
            ("detect.gray", "loss_open_floor = 2.0", "detect.gray.loss_open_floor"),
            ("detect.gray", "loss_open_ratio = 0.5", "detect.gray.loss_open_ratio"),
            ("detect.gray", "loss_severe = 0.001", "detect.gray.loss_severe"),
            ("detect.gray", "loss_clear_floor = -0.1", "detect.gray.loss_clear_floor"),
            ("detect.gray", "loss_scale_floor = 0.0", "detect.gray.loss_scale_floor"),
            ("detect.gray", "stall_open_ns = 10", "detect.gray.stall_open_ns"),
            ("detect.gray", "stall_severe_ns = 1", "detect.gray.stall_severe_ns"),
            ("detect.gray", "stall_clear_ns = 0", "detect.gray.stall_clear_ns"),
            ("detect.gray", "stall_min_loss_packets = -1", "detect.gray.stall_min_loss_packets"),
            ("detect.gray", "stall_scale_floor_ns = 0", "detect.gray.stall_scale_floor_ns"),
            ("detect.gray", "z_opn = 5.0", "detect.gray.z_opn"),
            ("detect.congestion", "baseline_windows = 0", "detect.congestion.baseline_windows"),
            ("detect.congestion", "baseline_min_windows = 31", "detect.congestion.baseline_min_windows"),
            ("detect.congestion", "goodput_open_ratio = 0.0", "detect.congestion.goodput_open_ratio"),
            ("detect.congestion", "goodput_severe_ratio = 0.75", "detect.congestion.goodput_severe_ratio"),
            ("detect.congestion", "goodput_clear_ratio = 1.2", "detect.congestion.goodput_clear_ratio"),
            ("detect.congestion", "min_degraded_peers = 0", "detect.congestion.min_degraded_peers"),
            ("detect.congestion", "min_degraded_fraction = 1.5", "detect.congestion.min_degraded_fraction"),
            ("detect.congestion", "ce_open_floor = 0.0", "detect.congestion.ce_open_floor"),
            ("detect.congestion", "ce_growth = 0.5", "detect.congestion.ce_growth"),
            ("detect.congestion", "ce_severe = 0.001", "detect.congestion.ce_severe"),
            ("detect.congestion", "cnp_open_per_s = 0.0", "detect.congestion.cnp_open_per_s"),
            ("detect.congestion", "cnp_growth = inf", "detect.congestion.cnp_growth"),
            ("detect.congestion", "min_shared_loss_flows = 1", "detect.congestion.min_shared_loss_flows"),
            ("detect.congestion", "competition_open_ratio = 1.0", "detect.congestion.competition_open_ratio"),
            ("detect.congestion", "competition_min_other = 0.0", "detect.congestion.competition_min_other"),
            ("detect.congestion", "queue_drop_open_floor = 0.0", "detect.congestion.queue_drop_open_floor"),
            ("detect.congestion", "queue_drop_growth = 0.5", "detect.congestion.queue_drop_growth"),
            ("detect.congestion", "queue_drop_severe = 0.001", "detect.congestion.queue_drop_severe"),
            ("detect.congestion", "queue_throttle_open_floor = 0.0", "detect.congestion.queue_throttle_open_floor"),
            ("detect.congestion", "queue_throttle_open_floor = inf", "detect.congestion.queue_throttle_open_floor"),
            ("detect.congestion", "queue_throttle_growth = 0.5", "detect.congestion.queue_throttle_growth"),
            ("detect.straggler", "min_peers = 1", "detect.straggler.min_peers"),
            ("detect.straggler", "max_start_offset_ns = 0", "detect.straggler.max_start_offset_ns"),
            ("detect.straggler", "min_matched_phases = 0", "detect.straggler.min_matched_phases"),
            ("detect.straggler", "min_idle_gap_ns = 1000000", "detect.straggler.min_idle_gap_ns"),
            ("detect.straggler", "open_lateness_ns = 5000000", "detect.straggler.open_lateness_ns"),
            ("detect.straggler", "clear_lateness_ns = 0", "detect.straggler.clear_lateness_ns"),
            ("detect.straggler", "warning_lateness_ns = 1000", "detect.straggler.warning_lateness_ns"),
            ("detect.straggler", "z_open = 0.0", "detect.straggler.z_open"),
            ("detect.straggler", "z_clear = 9.0", "detect.straggler.z_clear"),
            ("detect.straggler", "scale_floor_ns = 0", "detect.straggler.scale_floor_ns"),
            ("detect.straggler", "normal_goodput_ratio = 0.0", "detect.straggler.normal_goodput_ratio"),
            ("detect.straggler", "co_start_ns = \"3ms\"", "detect.straggler.co_start_ns"),
            ("detect.straggler", "go_ahead_ns = -1", "detect.straggler.go_ahead_ns"),
            ("detect.straggler", "raise_k = 6", "detect.straggler.raise_k"),
            ("detect.straggler", "raise_n = 40", "detect.straggler.raise_n"),
            ("policy", "recent_windows = 0", "policy.recent_windows"),
            ("policy", "baseline_windows = 0", "policy.baseline_windows"),
            ("policy", "min_baseline_windows = 0", "policy.min_baseline_windows"),
            ("policy", "degrade_ratio = 0.9", "policy.degrade_ratio"),
            ("policy", "path_slow_ratio = 0.0", "policy.path_slow_ratio"),
            ("policy", "severe_degrade_ratio = 1.2", "policy.severe_degrade_ratio"),
            ("policy", "severe_path_ratio = 0.9", "policy.severe_path_ratio"),
            ("policy", "trigger_windows = 0", "policy.trigger_windows"),
            ("policy", "min_improvement = 1.0", "policy.min_improvement"),
            ("policy", "lossy_slack = -0.1", "policy.lossy_slack"),
            ("policy", "min_dwell_windows = -1", "policy.min_dwell_windows"),
            ("policy", "settle_windows = \"1\"", "policy.settle_windows"),
            ("policy", "verify_windows = 0", "policy.verify_windows"),
            ("policy", "verify_min_gain = 1.5", "policy.verify_min_gain"),
            ("policy", "cooldown_windows = -3", "policy.cooldown_windows"),
            ("policy", "recover_windows = 0", "policy.recover_windows"),
            ("policy", "lossy_ratio = 0.0", "policy.lossy_ratio"),
            ("policy", "loss_rto_min_ms = 201", "policy.loss_rto_min_ms"),
            ("policy", "loss_rto_min_ms = -5", "policy.loss_rto_min_ms"),
            ("policy", "topk_ratio = 1.5", "policy.topk_ratio"),
            ("policy", "max_channels = 0", "policy.max_channels"),
            ("policy", "max_channels = 300", "policy.max_channels"),
            ("policy", "renew_ms = 0", "policy.renew_ms"),
            ("policy", "hint_ttl_ms = 5000", "policy.hint_ttl_ms"),
            ("policy", "history_len = 0", "policy.history_len"),
            ("policy", "max_jobs = 0", "policy.max_jobs"),
            ("policy.cost", "alpha_s = -1.0", "policy.cost.alpha_s"),
            ("policy.cost", "channel_exponent = nan", "policy.cost.channel_exponent"),
            ("policy.cost", "lossy_channel_exponent = -1.0", "policy.cost.lossy_channel_exponent"),
            ("policy.cost", "fp16_bps = 0.0", "policy.cost.fp16_bps"),
            ("policy.cost", "bf16_bps = -5.0", "policy.cost.bf16_bps"),
            ("policy.cost", "int8_bps = 0.0", "policy.cost.int8_bps"),
            ("policy.cost", "topk_bps = inf", "policy.cost.topk_bps"),
            ("api", "operator_tokens_file = \"\"", "api.operator_tokens_file"),
            ("api", "operator_tokens_file = 5", "api.operator_tokens_file"),
            ("rdma", "counters_root = \"\"", "rdma.counters_root"),
            ("rdma", "counters_root = \"sys/class/infiniband\"", "rdma.counters_root"),
            ("rdma", "counters_root = 1", "rdma.counters_root"),
            ("rdma", "enabled = \"yes\"", "rdma.enabled"),
            ("rdma", "poll_ms = 100", "rdma.poll_ms"),
            ("mirror", "interface = \"a/b\"", "mirror.interface"),
            ("mirror", "interface = 4", "mirror.interface"),
            ("mirror", "iface = \"m0\"", "mirror.iface"),
        ];
        for (section, line, key) in cases {
            let (text, want_line) = if section.is_empty() {
                (format!("# ringside\n{line}\n"), 2)
            } else {
                (format!("# ringside\n[{section}]\n{line}\n"), 3)
            };
            let err = ConfigFile::parse(&text, Path::new("/etc/ringside/ringside.toml")).expect_err(&text);
            let msg = err.to_string();
            match &err {
                ConfigError::Invalid { line, key: got, .. } => {
                    assert_eq!((*line, got.as_str()), (want_line, *key), "{text}=> {msg}");
                }
                other => panic!("{text}=> {other:?}"),
            }
            assert!(msg.contains("/etc/ringside/ringside.toml") && msg.contains(&format!("line {want_line}")) && msg.contains(&format!("`{key}`")), "{msg}");
        }
        // [[job]]: the line of the key inside the right table.
        let jobs = "[[job]]\nname = \"a\"\nmembers = [\"10.0.0.1\"]\n\n[[job]]\nname = \"b\"\nmembers = [\"10.0.0.2\"]\ntcp_ports = [0]\n";
        let job_cases: &[(&str, &str, usize, &str)] = &[
            ("name = \"b\"", "name = \"a\"", 6, "job.name"),
            ("name = \"b\"", "name = \" \"", 6, "job.name"),
            ("members = [\"10.0.0.2\"]", "members = []", 7, "job.members"),
            ("members = [\"10.0.0.2\"]", "members = [\"10.0.0.300\"]", 7, "job.members"),
            ("members = [\"10.0.0.2\"]", "members = [\"10.0.0.0/40\"]", 7, "job.members"),
            ("tcp_ports = [0]", "tcp_ports = [0]", 8, "job.tcp_ports"),
            ("tcp_ports = [0]", "udp_ports = [\"9-1\"]", 8, "job.udp_ports"),
            ("tcp_ports = [0]", "port = 1", 8, "job.port"),
        ];
        for (from, to, want_line, key) in job_cases {
            let text = jobs.replacen(from, to, 1);
            let text = if *from == "tcp_ports = [0]" { text } else { text.replace("tcp_ports = [0]\n", "") };
            let msg = parse(&text).expect_err(&text).to_string();
            assert!(msg.contains(&format!("line {want_line}")) && msg.contains(&format!("`{key}`")), "{text}=> {msg}");
        }
        // An interface name in a multi-line array: the element's own line.
        let msg = parse("interfaces = [\n  \"eth0\",\n  \"\",\n]\n").unwrap_err().to_string();
        assert!(msg.contains("line 3") && msg.contains("`interfaces`"), "{msg}");
        // A dotted key and an inline table resolve too.
        let msg = parse("[detect]\nwindow_ms = 1000\ngray.z_open = 1.0\n").unwrap_err().to_string();
        assert!(msg.contains("line 3") && msg.contains("detect.gray.z_open"), "{msg}");
        let msg = parse("[detect]\nwindow_ms = 1000\ngray = { z_clear = 2.0, rel_scale_floor = 7.0 }\n").unwrap_err().to_string();
        assert!(msg.contains("line 3") && msg.contains("detect.gray.rel_scale_floor"), "{msg}");
        // A window shorter than the poll interval.
        let msg = parse("poll_interval_ms = 500\n[detect]\nwindow_ms = 200\n").unwrap_err().to_string();
        assert!(msg.contains("line 3") && msg.contains("detect.window_ms") && msg.contains("poll_interval_ms"), "{msg}");
    }

    #[test]
    fn unknown_key_names_line_and_key() {
        let err = parse("listen = \"127.0.0.1:1\"\n\n[match]\ntcp_portz = [1]\n").unwrap_err();
        let msg = err.to_string();
        match &err {
            ConfigError::Invalid { line, key, .. } => {
                assert_eq!(*line, 4, "{msg}");
                assert_eq!(key, "match.tcp_portz", "{msg}");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(msg.contains("line 4") && msg.contains("tcp_portz"), "{msg}");
    }

    #[test]
    fn bad_value_names_line_and_key() {
        let err = parse("poll_interval_ms = 100\nlisten = \"not an address\"\n").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("line 2") && msg.contains("`listen`"), "{msg}");
    }

    #[test]
    fn bad_port_range_in_multiline_array() {
        let text = "[match]\ntcp_ports = [\n  \"29500-29600\",\n  \"29700-29600\",\n]\n";
        let err = parse(text).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("line 4") && msg.contains("match.tcp_ports") && msg.contains("reversed"), "{msg}");
    }

    #[test]
    fn zero_interval_rejected_with_line() {
        let err = parse("# comment\n\npoll_interval_ms = 0\n").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("line 3") && msg.contains("poll_interval_ms") && msg.contains("greater than 0"), "{msg}");
    }

    #[test]
    fn bad_prefix_rejected() {
        let err = parse("[match]\nprefixes = [\"10.0.0.0/33\"]\n").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("line 2") && msg.contains("match.prefixes") && msg.contains("0-32"), "{msg}");
        assert!(parse("[match]\nprefixes = [\"10.0.0.0\"]\n").unwrap_err().to_string().contains("CIDR"));
    }

    #[test]
    fn too_many_ranges_rejected() {
        let ports: Vec<String> = (0..17).map(|p| (1000 + p).to_string()).collect();
        let text = format!("[match]\ntcp_ports = [{}]\n", ports.join(", "));
        let msg = parse(&text).unwrap_err().to_string();
        assert!(msg.contains("line 2") && msg.contains("at most 16"), "{msg}");
    }

    #[test]
    fn port_specs() {
        assert_eq!("29500".parse::<PortSpec>().unwrap(), PortSpec { lo: 29500, hi: 29500 });
        assert_eq!("1-2".parse::<PortSpec>().unwrap(), PortSpec { lo: 1, hi: 2 });
        assert_eq!(" 10 - 20 ".parse::<PortSpec>().unwrap(), PortSpec { lo: 10, hi: 20 });
        assert!("65536".parse::<PortSpec>().is_err());
        assert!("2-1".parse::<PortSpec>().is_err());
        assert!("x".parse::<PortSpec>().is_err());
        let f = parse("[match]\ntcp_ports = [80, \"90-99\"]\nudp_ports = [\"5000\"]\n").unwrap();
        let m = MatchSettings::from_file(f.match_.as_ref());
        let cfg = m.kernel_config(Duration::from_micros(500)).unwrap();
        assert_eq!(cfg.burst_gap_ns, 500_000);
        assert_eq!(cfg.n_port_ranges, 3);
        assert_eq!(cfg.port_ranges[0], PortRange { lo: 80, hi: 80, protocol: 6, _pad: [0; 3] });
        assert_eq!(cfg.port_ranges[1], PortRange { lo: 90, hi: 99, protocol: 6, _pad: [0; 3] });
        assert_eq!(cfg.port_ranges[2], PortRange { lo: 5000, hi: 5000, protocol: 17, _pad: [0; 3] });
        assert_eq!(cfg.port_ranges[3], PortRange::default());
        assert_eq!(cfg.flags, config_flags::BURST_EVENTS);
        assert!(parse("[match]\ntcp_ports = [70000]\n").unwrap_err().to_string().contains("line 2"));
    }

    #[test]
    fn prefix_keys() {
        let k = "10.1.2.3/8".parse::<PrefixSpec>().unwrap().to_key();
        assert_eq!(k.prefix_len, 104);
        assert_eq!(k.addr, ipv4_mapped([10, 0, 0, 0]));
        let k = "192.168.1.130/25".parse::<PrefixSpec>().unwrap().to_key();
        assert_eq!(k.prefix_len, 121);
        assert_eq!(k.addr, ipv4_mapped([192, 168, 1, 128]));
        let k = "10.77.0.1/32".parse::<PrefixSpec>().unwrap().to_key();
        assert_eq!((k.prefix_len, k.addr), (128, ipv4_mapped([10, 77, 0, 1])));
        let k = "fd00:1:2::5/20".parse::<PrefixSpec>().unwrap().to_key();
        assert_eq!(k.prefix_len, 20);
        let mut want = [0u8; 16];
        want[0] = 0xfd;
        want[2] = 0x00; // 0x0001 & 0xf000 = 0
        assert_eq!(k.addr, want);
        let k = "fd00:ffff::/20".parse::<PrefixSpec>().unwrap().to_key();
        assert_eq!(&k.addr[..4], &[0xfd, 0x00, 0xf0, 0x00]);
        let k = "0.0.0.0/0".parse::<PrefixSpec>().unwrap().to_key();
        assert_eq!((k.prefix_len, k.addr), (96, ipv4_mapped([0, 0, 0, 0])));
        let m = MatchSettings {
            tcp_ports: vec![],
            udp_ports: vec![],
            prefixes: vec!["10.0.0.0/8".parse().unwrap(), "10.9.9.9/8".parse().unwrap()],
            flow_start_events: true,
        };
        assert_eq!(m.prefix_keys().len(), 1);
        let cfg = m.kernel_config(Duration::from_millis(1)).unwrap();
        assert_eq!(cfg.n_prefixes, 1);
        assert_eq!(cfg.flags, config_flags::BURST_EVENTS | config_flags::FLOW_START_EVENTS);
    }
}
