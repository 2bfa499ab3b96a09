//! The JSON types of the operator API: `GET /v1/flows`, `/v1/status`, `/v1/events` and
//! `GET /v1/jobs` (operator token). The agent serializes exactly these types and
//! [`crate::OperatorClient`] decodes them; `docs/openapi.json` documents them.
//!
//! Invariants:
//! - The JSON is the agent's contract with the CLI, the Python package and any script reading the
//!   API: field names and their order, and which optional fields are omitted when absent, change
//!   only deliberately (and `docs/openapi.json` with them).
//! - Enums serialise as snake_case strings (`gray_failure`, `in_burst_goodput_bps`); [`Scope`] is
//!   internally tagged (`{"type":"peer","peer":..,"link":..}`).
//! - The detection vocabulary ([`VerdictKind`], [`Scope`], [`Severity`], [`Classification`],
//!   [`Evidence`] and its parts) and the [`Event`] are defined here once; the agent's detectors and
//!   event log use these same types (the event log also persists [`Event`]s in its state file).

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::types::JobView;

// ---- /v1/flows and /v1/status ----

/// One flow in `/v1/flows`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FlowView {
    pub interface: String,
    /// `ingress` or `egress`.
    pub direction: String,
    /// `tcp`, `udp` or `rocev2`.
    pub kind: String,
    pub src_addr: String,
    pub dst_addr: String,
    pub src_port: u16,
    pub dst_port: u16,
    /// The remote end (source for ingress, destination for egress).
    pub peer: String,
    pub packets: u64,
    /// L3 bytes.
    pub bytes: u64,
    pub payload_bytes: u64,
    pub ce_marks: u64,
    pub rates: RatesView,
    /// Seconds since the flow's last packet (relative to the last poll).
    pub idle_seconds: f64,
    /// TCP counters (TCP flows only).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub tcp: Option<TcpView>,
    /// RoCEv2 counters (RoCEv2 flows only).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub roce: Option<RoceView>,
    pub bursts: BurstsView,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RatesView {
    pub bytes_per_second: f64,
    pub packets_per_second: f64,
    pub ewma_bytes_per_second: f64,
    pub ewma_packets_per_second: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TcpView {
    pub retransmissions: u64,
    pub pure_acks: u64,
    /// Pure ACKs carrying a D-SACK: the receiver got data it already had (a spurious
    /// retransmission of the reverse flow). Replaced `dup_acks` (layout 4).
    pub dsacks: u64,
    pub ece: u64,
    pub cwr: u64,
    pub rst: u64,
    pub fin: u64,
    pub syn: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RoceView {
    pub psn_gap_events: u64,
    pub psn_gap_packets: u64,
    pub psn_out_of_order: u64,
    pub naks: u64,
    pub cnps: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BurstsView {
    /// Ended bursts since the flow was first tracked.
    pub count: u64,
    pub mean_duration_seconds: f64,
    pub mean_bytes: f64,
    /// The most recent ended bursts, oldest first (bounded by `burst_history`).
    pub recent: Vec<BurstView>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BurstView {
    pub duration_seconds: f64,
    pub bytes: u64,
    pub packets: u64,
}

/// `/v1/flows` response.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FlowsResponse {
    /// Flows in the agent's table.
    pub total_flows: usize,
    pub limit: usize,
    /// Top flows by bytes, largest first.
    pub flows: Vec<FlowView>,
}

/// `/v1/status` response.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StatusResponse {
    pub ready: bool,
    /// Why not ready (absent when ready).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub not_ready_reason: Option<String>,
    pub interfaces: Vec<InterfaceView>,
    pub pin_dir: Option<String>,
    pub poll_interval_seconds: f64,
    pub polls: u64,
    pub poll_errors: u64,
    pub last_poll_age_seconds: Option<f64>,
    pub flows_tracked: usize,
    /// `STATS`, summed over CPUs, by name.
    pub dataplane: Vec<(String, u64)>,
}

/// An interface the classifier is attached to (`/v1/status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InterfaceView {
    pub name: String,
    pub ifindex: u32,
    /// `clsact` or `tcx`.
    pub mode: String,
    /// Whether the agent added the clsact qdisc (and so removes it on exit).
    pub qdisc_added: bool,
}

// ---- /v1/events ----

/// `/v1/events` response.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EventsResponse {
    /// `open` or `all` (the query's `state`).
    pub state: String,
    pub limit: usize,
    /// Open events in total (the list may be cut by `limit`).
    pub open_count: usize,
    /// Closed events retained (`detect.recent_events` at most).
    pub closed_retained: usize,
    /// Detection windows run since start.
    pub windows: u64,
    /// Configured jobs.
    pub jobs: Vec<String>,
    /// Open events (oldest first), then, with `state=all`, closed ones (newest first); at most
    /// `limit`.
    pub events: Vec<Event>,
}

/// One event of `/v1/events`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub id: u64,
    pub job: String,
    pub kind: VerdictKind,
    /// What the event is about: `{"type":"peer","peer":..,"link":..}`, `{"type":"link","link":..}`.
    pub scope: Scope,
    pub severity: Severity,
    /// Gray failures only: transient, intermittent or persistent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classification: Option<Classification>,
    pub state: EventState,
    /// Loaded from the state file after a restart.
    #[serde(default)]
    pub carried_over: bool,
    /// A carried-over event the detectors raised again after the restart.
    #[serde(default)]
    pub confirmed: bool,
    /// Estimated fault start (start of the first anomalous window), Unix ms.
    pub started_unix_ms: u64,
    /// When the detectors raised it, Unix ms.
    pub raised_unix_ms: u64,
    /// Estimated fault end (closed events), Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_unix_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_reason: Option<EventEnd>,
    /// Windows observed since the raise, and how many of them were anomalous.
    pub observed_windows: u32,
    pub anomalous_windows: u32,
    /// The numbers of the latest anomalous window.
    pub evidence: Vec<Evidence>,
    /// Every metric that was evidence in any window since the raise, in the order first seen
    /// (`evidence` shows the latest anomalous window's only: a verdict raised on loss may end on
    /// a goodput dip). Empty from agents older than this field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub signals: Vec<Metric>,
}

impl Event {
    /// Whether every signal the event was ever raised or kept on is in-burst goodput: evidence a
    /// busy host's CPU can fake as well as a slow path (no loss, stall, ECN, CNP or queue count).
    /// Reads `signals`, or `evidence` from an agent that does not report them.
    pub fn goodput_only(&self) -> bool {
        let mut metrics = self.signals.iter().copied().chain(self.evidence.iter().map(|e| e.metric)).peekable();
        metrics.peek().is_some() && metrics.all(|m| m == Metric::InBurstGoodputBps)
    }
}

/// Open or closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventState {
    Open,
    Closed,
}

/// Why an event closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventEnd {
    /// The detectors saw `clear_windows` clean windows.
    Cleared,
    /// The peer, link or job stopped sending for `forget_after`.
    Expired,
    /// Carried over from before a restart and not raised again within `carry_over_windows`.
    NotConfirmed,
}

/// What was detected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    /// A link (shared bottleneck) is congested.
    Congestion,
    /// The path to one peer is degraded while the job's other peers are fine.
    GrayFailure,
    /// A peer's worker is slow to start communicating: compute, not network.
    Straggler,
}

impl VerdictKind {
    /// Whether the verdict blames the network (fabric, links, paths).
    pub fn is_network_fault(self) -> bool {
        matches!(self, Self::Congestion | Self::GrayFailure)
    }
}

/// What a verdict is about.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Scope {
    /// A local link id (the agent's interface name for the link).
    Link { link: String },
    /// A remote host, and the local link its traffic crosses.
    Peer { peer: IpAddr, link: String },
    /// The whole job. Reserved: no detector emits job-wide verdicts yet.
    Job,
    /// One port of an RDMA device, judged from the NIC's own port counters
    /// (`/sys/class/infiniband/{device}/ports/{port}/`): RoCE the host kernel never sees. The
    /// vantage is the port, not a peer: the counters cannot say which remote host or job the
    /// traffic belonged to, so these verdicts carry the pseudo-job `@rdma-ports`.
    RdmaPort { device: String, port: u32 },
}

/// How bad. Ordered: `Info < Warning < Critical`. An open verdict's severity only escalates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Worth knowing, no action (stragglers below `warning_lateness_ns`).
    Info,
    /// Degraded.
    Warning,
    /// Severely degraded (the severe thresholds of the config).
    Critical,
}

/// Time pattern of a gray failure; operators act differently on each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Classification {
    /// One short episode so far (a flap): log it, no action unless it recurs. Every gray verdict
    /// starts here until its pattern is known.
    Transient,
    /// Comes and goes (several episodes, or recurring within `recurrence_ns`): the classic gray
    /// failure; investigate the path, consider draining it.
    Intermittent,
    /// One unbroken run of at least `persistent_windows`: repair or route around it now.
    Persistent,
}

/// Which number an [`Evidence`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Bytes per second within communication phases.
    InBurstGoodputBps,
    /// Loss packets (retrans + PSN gaps + NAKs) per data packet. For an RDMA port: its loss
    /// signals (out-of-sequence, sequence-error NAKs, ack timeouts, duplicate requests, adaptive
    /// retransmits) per packet sent and received.
    LossRate,
    /// Longest silence of the peer in the window, in ns (with loss: a stall).
    SilenceNs,
    /// CE marks per data packet on a link. For an RDMA port: ECN-marked RoCE packets received
    /// (`np_ecn_marked_roce_packets`) per packet received.
    CeRate,
    /// CNPs per second on a link.
    CnpPerS,
    /// How late the peer starts its steps against the other peers, in ns, counting only the
    /// time the rest of the job waited in silence for it (lateness right after other peers' data
    /// is waiting for input, not computing: see `detect::features`).
    PhaseStartLatenessNs,
    /// Flows (the job's and other traffic's) losing packets in one direction of a link, with no
    /// host common to all of them: a shared bottleneck, not one host's path. `peers` counts
    /// flows here (lossy of all).
    LossyFlows,
    /// Bytes per second of other traffic (not the job's) on a link's egress; the reference is
    /// the job's own in-burst goodput baseline there.
    OtherTrafficBps,
    /// Packets the link's own egress queue (its interface's root qdisc) dropped per packet it was
    /// offered: loss at this end of the link, not behind it.
    QueueDropRate,
    /// Times the link's own egress queue (a shaping root qdisc: `tbf`, `htb`) held a packet back
    /// for lack of rate, per packet it sent (`tc -s qdisc`: `overlimits`): the link is the
    /// bottleneck of what this end offers it.
    QueueThrottleRate,
    /// Times the link's interface lost its carrier in the window (the far end's port went down,
    /// a cable pulled, a PHY retraining: `IFLA_CARRIER_DOWN_COUNT`): the link flapped.
    CarrierDowns,
    /// RDMA port counters: CNPs the port sent per second (`np_cnp_sent`: it received
    /// ECN-marked packets, so the path *into* the port is congested).
    CnpSentPerS,
    /// RDMA port counters: CNPs the port received and reacted to per second (`rp_cnp_handled`:
    /// what it sent met congestion on the way out).
    CnpHandledPerS,
}

/// What `Evidence::reference` was computed from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reference {
    /// Median over the job's other peers in the same window.
    PeerMedian,
    /// Median of the scope's own recent non-anomalous windows.
    OwnBaseline,
    /// A fixed configured threshold.
    Threshold,
}

/// A count of peers (for link-scoped evidence).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerCount {
    /// Peers whose metric crossed the threshold.
    pub affected: u32,
    /// Peers assessed on the link.
    pub of: u32,
}

/// A count of windows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowCount {
    /// Anomalous windows among the last `of` observed windows of the scope.
    pub anomalous: u32,
    pub of: u32,
}

/// One number that made a window anomalous.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    pub metric: Metric,
    /// The scope's value in the latest anomalous window (for links: median over the affected
    /// peers, or the link-wide rate).
    pub value: f64,
    /// What it was compared with.
    pub reference: f64,
    pub reference_kind: Reference,
    /// Median absolute deviation of the reference population (0 when not applicable).
    pub mad: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peers: Option<PeerCount>,
    /// Filled in when the verdict is emitted.
    pub windows: WindowCount,
}

// ---- GET /v1/jobs ----

/// `GET /v1/jobs` response.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JobsResponse {
    /// Registered jobs, in registration order.
    pub jobs: Vec<JobView>,
    /// Jobs from the config file's `[[job]]` (no tenant token; the operator reads their hints).
    pub config_jobs: Vec<String>,
}
