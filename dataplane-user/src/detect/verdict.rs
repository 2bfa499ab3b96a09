//! Verdicts: the events the detectors emit, served by the agent at `GET /v1/events`.

use serde::{Deserialize, Serialize};

// The detection vocabulary is the operator API's (`GET /v1/events`): one definition, in
// ringside-client, shared by the detectors, the event log and the CLI.
pub use ringside_client::operator::{
    Classification, Evidence, Metric, PeerCount, Reference, Scope, Severity, VerdictKind, WindowCount,
};

/// Why a verdict closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// `clear_windows` consecutive clean windows.
    Cleared,
    /// The peer, link or job was not seen for `forget_after_ns`.
    Expired,
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
