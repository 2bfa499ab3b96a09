//! What the policy tells a tenant about its own job each window (`/v1/jobs/{id}/metrics`).
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// What the policy measured for a job in its last window: the tenant's `/v1/jobs/{id}/metrics`.
/// Only the job's own peers appear; never links, interfaces or other jobs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobInsight {
    /// Unix ms of the window's end.
    pub updated_unix_ms: u64,
    /// Observed training step time (compute + communication), ms, if steps were recognised.
    pub step_ms: Option<f64>,
    /// Observed communication time per step, ms.
    pub comm_ms: Option<f64>,
    /// The cost model's prediction of communication time per step under the current hint, ms.
    pub predicted_comm_ms: Option<f64>,
    /// Per peer of the job: `healthy`, `degraded` (a verdict names it or its path) or `idle`.
    pub peers: Vec<PeerHealth>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerHealth {
    pub peer: IpAddr,
    /// `healthy`, `degraded` or `idle`.
    pub health: String,
    /// In-burst goodput the job reached with this peer, bytes/s.
    pub goodput_bytes_per_second: Option<f64>,
    /// Loss evidence packets / data packets in the window.
    pub loss_ratio: Option<f64>,
}
