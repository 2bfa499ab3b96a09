//! The agent's configuration: the `ringside.toml` file, its defaults, and its translation into the
//! kernel's `CONFIG` entry and `MATCH_PREFIXES` keys.
//!
//! Every key is optional; `ringside.example.toml` documents each one with its default. Unknown keys
//! are rejected (`deny_unknown_fields`) so a typo never silently falls back to a default. Errors name
//! the file, the line and the key, using the byte span the `toml` crate attaches to its errors.
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
/// Default cap on flows held by the agent (the kernel map's capacity).
pub const DEFAULT_MAX_FLOWS: usize = dataplane_common::MAX_FLOWS as usize;
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
    /// Leave the pins in place on exit, default false.
    pub keep_pins: Option<bool>,
    /// `clsact` (netlink filter on the clsact qdisc, default) or `tcx` (kernel ≥ 6.6 bpf links).
    pub attach: Option<AttachMode>,
    /// Seconds without a packet after which a flow is forgotten, default 60.
    pub flow_idle_timeout_secs: Option<u64>,
    /// Idle gap that ends a burst, in microseconds, default 1000.
    pub burst_gap_us: Option<u64>,
    /// Cap on flows in the agent's table, default 16384.
    pub max_flows: Option<usize>,
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

/// An inclusive port range `lo..=hi`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortSpec {
    pub lo: u16,
    pub hi: u16,
}

impl FromStr for PortSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parse = |p: &str| {
            p.trim()
                .parse::<u16>()
                .map_err(|_| format!("`{p}` is not a port number (0-65535)"))
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
                let p = u16::try_from(v)
                    .map_err(|_| E::custom(format!("{v} is not a port number (0-65535)")))?;
                Ok(PortSpec { lo: p, hi: p })
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
    #[error("cannot read config file {path}: {source}; check the path given to --config")]
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

    /// Parses config text; `path` is only used in error messages. Also checks values whose
    /// validity depends on more than their type (zero intervals, too many ranges).
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let file: ConfigFile = toml::from_str(text).map_err(|e| {
            let offset = e.span().map(|s| s.start).unwrap_or(0);
            let (line, key) = locate(text, offset);
            ConfigError::Invalid { path: path.to_owned(), line, key, message: e.message().to_owned() }
        })?;
        file.validate().map_err(|(key, message)| {
            let (section, name) = key.rsplit_once('.').unwrap_or(("", key));
            ConfigError::Invalid {
                path: path.to_owned(),
                line: find_key_line(text, section, name).unwrap_or(0),
                key: key.to_owned(),
                message,
            }
        })?;
        file.validate_jobs().map_err(|(index, key, message)| ConfigError::Invalid {
            path: path.to_owned(),
            line: find_job_key_line(text, index, key).unwrap_or(0),
            key: format!("job.{key}"),
            message,
        })?;
        Ok(file)
    }

    /// `[[job]]` checks: (job index, key, message).
    fn validate_jobs(&self) -> Result<(), (usize, &'static str, String)> {
        let jobs = self.jobs.as_deref().unwrap_or_default();
        for (i, j) in jobs.iter().enumerate() {
            if j.name.trim().is_empty() {
                return Err((i, "name", "must not be empty".to_owned()));
            }
            if let Some(first) = jobs[..i].iter().position(|o| o.name == j.name) {
                return Err((i, "name", format!("job `{}` is defined twice (also job #{}); give each job its own name", j.name, first + 1)));
            }
            if j.members.is_empty() {
                return Err((i, "members", "must list at least one address or prefix".to_owned()));
            }
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), (&'static str, String)> {
        let positive = |v: Option<u64>, key: &'static str| match v {
            Some(0) => Err((key, "must be greater than 0".to_owned())),
            _ => Ok(()),
        };
        positive(self.poll_interval_ms, "poll_interval_ms")?;
        positive(self.flow_idle_timeout_secs, "flow_idle_timeout_secs")?;
        positive(self.burst_gap_us, "burst_gap_us")?;
        positive(self.ewma_tau_ms, "ewma_tau_ms")?;
        positive(self.max_flows.map(|v| v as u64), "max_flows")?;
        positive(self.max_peers.map(|v| v as u64), "max_peers")?;
        positive(self.burst_history.map(|v| v as u64), "burst_history")?;
        if let Some(d) = &self.detect {
            positive(d.window_ms, "detect.window_ms")?;
            positive(d.recent_events.map(|v| v as u64), "detect.recent_events")?;
            positive(d.carry_over_windows.map(u64::from), "detect.carry_over_windows")?;
        }
        if let Some(m) = &self.match_ {
            let n = m.tcp_ports.as_ref().map_or(0, Vec::len) + m.udp_ports.as_ref().map_or(0, Vec::len);
            if n > MAX_PORT_RANGES {
                return Err((
                    "match.tcp_ports",
                    format!("{n} port ranges given (tcp_ports + udp_ports), the kernel holds at most {MAX_PORT_RANGES}; merge adjacent ranges"),
                ));
            }
            let p = m.prefixes.as_ref().map_or(0, Vec::len);
            if p > MAX_PREFIXES as usize {
                return Err(("match.prefixes", format!("{p} prefixes given, at most {MAX_PREFIXES}")));
            }
        }
        Ok(())
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

/// Line (1-based) where `name` is assigned inside `[section]` (`""` for the top level).
fn find_key_line(text: &str, section: &str, name: &str) -> Option<usize> {
    let mut current = String::new();
    for (i, l) in text.lines().enumerate() {
        let t = l.trim();
        if t.starts_with('[') {
            current = t.trim_matches(|c| c == '[' || c == ']').trim().to_owned();
        } else if current == section {
            if let Some((k, _)) = t.split_once('=') {
                if k.trim().trim_matches('"') == name {
                    return Some(i + 1);
                }
            }
        }
    }
    None
}

/// Line (1-based) of `key` inside the `index`-th `[[job]]` table (or of its header).
fn find_job_key_line(text: &str, index: usize, key: &str) -> Option<usize> {
    let mut seen = 0usize;
    let mut header = None;
    for (i, l) in text.lines().enumerate() {
        let t = l.trim();
        if t.starts_with('[') {
            if header.is_some() {
                break;
            }
            if t.trim_matches(|c| c == '[' || c == ']').trim() == "job" {
                if seen == index {
                    header = Some(i + 1);
                }
                seen += 1;
            }
        } else if header.is_some() {
            if let Some((k, _)) = t.split_once('=') {
                if k.trim().trim_matches('"') == key {
                    return Some(i + 1);
                }
            }
        }
    }
    header
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
    fn example_file_parses() {
        let text = include_str!("../ringside.example.toml");
        let f = parse(text).unwrap();
        assert_eq!(f.listen, Some(DEFAULT_LISTEN.parse().unwrap()));
        assert_eq!(f.poll_interval_ms, Some(DEFAULT_POLL_INTERVAL_MS));
        assert_eq!(f.pin_dir.as_deref(), Some(Path::new(DEFAULT_PIN_DIR)));
        assert_eq!(f.flow_idle_timeout_secs, Some(DEFAULT_FLOW_IDLE_TIMEOUT_SECS));
        assert_eq!(f.burst_gap_us, Some(DEFAULT_BURST_GAP_US));
        assert_eq!(f.max_flows, Some(DEFAULT_MAX_FLOWS));
        assert_eq!(f.max_peers, Some(DEFAULT_MAX_PEERS));
        assert_eq!(f.burst_history, Some(DEFAULT_BURST_HISTORY));
        assert_eq!(f.ewma_tau_ms, Some(DEFAULT_EWMA_TAU_MS));
        assert_eq!(f.ebpf_debug_log, Some(false));
        let m = MatchSettings::from_file(f.match_.as_ref());
        assert_eq!(m.tcp_ports, vec![PortSpec { lo: 29500, hi: 29600 }, PortSpec { lo: 12345, hi: 12345 }]);
        assert!(!m.prefixes.is_empty());
        assert_eq!(f.state_dir.as_deref(), Some(Path::new(DEFAULT_STATE_DIR)));
        let d = f.detect.as_ref().unwrap();
        assert_eq!(d.window_ms, Some(DEFAULT_DETECT_WINDOW_MS));
        assert_eq!(d.recent_events, Some(DEFAULT_RECENT_EVENTS));
        assert_eq!(d.carry_over_windows, Some(DEFAULT_CARRY_OVER_WINDOWS));
        let defaults = crate::detect::DetectorConfig::default();
        assert_eq!((d.min_window_bytes, d.min_data_packets), (Some(defaults.min_window_bytes), Some(defaults.min_data_packets)));
        let jobs = f.jobs.as_ref().unwrap();
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].name, "train");
        assert_eq!(jobs[0].members.len(), 2);
        assert!(jobs[0].members[0].0.contains("10.77.0.9".parse().unwrap()));
        assert!(!jobs[0].members[0].0.contains("10.78.0.9".parse().unwrap()));
        assert_eq!(jobs[0].members[1].0.len, 128);
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
