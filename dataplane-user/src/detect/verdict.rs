//! Verdicts: the events the detectors emit, served by the agent at `GET /v1/events`.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

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
    /// A local link id, as given in [`crate::detect::PeerWindow::link`].
    Link { link: String },
    /// A remote host, and the local link its traffic crosses.
    Peer { peer: IpAddr, link: String },
    /// The whole job. Reserved: no detector emits job-wide verdicts yet.
    Job,
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

/// Why a verdict closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// `clear_windows` consecutive clean windows.
    Cleared,
    /// The peer, link or job was not seen for `forget_after_ns`.
    Expired,
}

/// Which number an [`Evidence`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Bytes per second within communication phases.
    InBurstGoodputBps,
    /// Loss packets (retrans + PSN gaps + NAKs) per data packet.
    LossRate,
    /// Longest silence of the peer in the window, in ns (with loss: a stall).
    SilenceNs,
    /// CE marks per data packet on a link.
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

/// A detected condition, open or closed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// Unique within one [`crate::detect::DetectorSet`], increasing in opening order.
    pub id: u64,
    pub job: String,
    pub kind: VerdictKind,
    pub scope: Scope,
    pub severity: Severity,
    /// Set for gray failures only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub classification: Option<Classification>,
    /// Start of the first anomalous window that led to the raise (the estimated fault start).
    pub started_ns: u64,
    /// End of the window in which the verdict was raised.
    pub raised_ns: u64,
    /// Set when closed: end of the last window that was not clean (the estimated fault end) for
    /// `cleared`, the last time the scope was seen for `expired`.
    pub ended_ns: Option<u64>,
    pub end_reason: Option<EndReason>,
    /// Windows observed since the raise (raise window included), and how many were anomalous.
    pub observed_windows: u32,
    pub anomalous_windows: u32,
    /// The numbers of the latest anomalous window.
    pub evidence: Vec<Evidence>,
}

/// A change in the set of verdicts, as returned by [`crate::detect::DetectorSet::observe`].
/// Updates are emitted only when severity or classification changes, not on every window; the
/// current evidence of open verdicts is available from
/// [`crate::detect::DetectorSet::open_verdicts`].
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "change", content = "verdict", rename_all = "snake_case")]
pub enum VerdictChange {
    Opened(Verdict),
    Updated(Verdict),
    Closed(Verdict),
}

impl VerdictChange {
    pub fn verdict(&self) -> &Verdict {
        match self {
            Self::Opened(v) | Self::Updated(v) | Self::Closed(v) => v,
        }
    }
}
