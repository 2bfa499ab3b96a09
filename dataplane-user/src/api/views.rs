//! The API's response types (also what the CLI decodes) and how each is built from the state.
use serde::{Deserialize, Serialize};

use crate::{
    events::Event,
    flow_table::{direction_name, format_addr, kind_name, BurstRecord, FlowEntry, Rates},
    loader::AttachedInterface,
    state::AgentState,
};
use dataplane_common::{flow_kind, stats};
use ringside_client::JobView;

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
    pub dup_acks: u64,
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
    pub interfaces: Vec<AttachedInterface>,
    pub pin_dir: Option<String>,
    pub poll_interval_seconds: f64,
    pub polls: u64,
    pub poll_errors: u64,
    pub last_poll_age_seconds: Option<f64>,
    pub flows_tracked: usize,
    /// `STATS`, summed over CPUs, by name.
    pub dataplane: Vec<(String, u64)>,
}

/// Names of the `STATS` entries, in index order.
pub const STATS_NAMES: [(&str, u32); 9] = [
    ("seen", stats::SEEN),
    ("parsed", stats::PARSED),
    ("matched", stats::MATCHED),
    ("malformed", stats::MALFORMED),
    ("unsupported", stats::UNSUPPORTED),
    ("map_full", stats::MAP_FULL),
    ("ringbuf_full", stats::RINGBUF_FULL),
    ("events", stats::EVENTS),
    ("unreadable", stats::UNREADABLE),
];

const _: () = assert!(STATS_NAMES.len() == stats::COUNT as usize, "name every STATS entry");

impl FlowView {
    pub fn new(e: &FlowEntry, state: &AgentState, now_ns: u64) -> Self {
        let c = &e.totals.counters;
        let k = &e.key;
        let Rates { bytes_per_second, packets_per_second, ewma_bytes_per_second, ewma_packets_per_second, .. } = e.rates;
        let b = &e.bursts;
        let mean = |total: u64| if b.count == 0 { 0.0 } else { total as f64 / b.count as f64 };
        FlowView {
            interface: state.ifname(k.ifindex),
            direction: direction_name(k.direction).to_owned(),
            kind: kind_name(k.kind).to_owned(),
            src_addr: format_addr(&k.src_addr),
            dst_addr: format_addr(&k.dst_addr),
            src_port: k.src_port,
            dst_port: k.dst_port,
            peer: format_addr(&e.peer()),
            packets: c.packets,
            bytes: c.bytes,
            payload_bytes: c.payload_bytes,
            ce_marks: c.ce_marks,
            rates: RatesView { bytes_per_second, packets_per_second, ewma_bytes_per_second, ewma_packets_per_second },
            idle_seconds: now_ns.saturating_sub(e.totals.last_seen_ns) as f64 / 1e9,
            tcp: (k.kind == flow_kind::TCP).then(|| TcpView {
                retransmissions: c.tcp_retrans,
                pure_acks: c.tcp_pure_acks,
                dup_acks: c.tcp_dup_acks,
                ece: c.tcp_ece,
                cwr: c.tcp_cwr,
                rst: c.tcp_rst,
                fin: c.tcp_fin,
                syn: c.tcp_syn,
            }),
            roce: (k.kind == flow_kind::ROCEV2).then(|| RoceView {
                psn_gap_events: c.roce_psn_gap_events,
                psn_gap_packets: c.roce_psn_gap_packets,
                psn_out_of_order: c.roce_psn_out_of_order,
                naks: c.roce_naks,
                cnps: c.roce_cnps,
            }),
            bursts: BurstsView {
                count: b.count,
                mean_duration_seconds: mean(b.total_duration_ns) / 1e9,
                mean_bytes: mean(b.total_bytes),
                recent: b
                    .recent
                    .iter()
                    .map(|r: &BurstRecord| BurstView { duration_seconds: r.duration_ns as f64 / 1e9, bytes: r.bytes, packets: r.packets })
                    .collect(),
            },
        }
    }
}

/// `GET /v1/jobs` response.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JobsResponse {
    /// Registered jobs, in registration order.
    pub jobs: Vec<JobView>,
    /// Jobs from the config file's `[[job]]` (no tenant token; the operator reads their hints).
    pub config_jobs: Vec<String>,
}

/// Builds the `/v1/events` body; `all` adds the retained closed events.
pub fn events_of(s: &AgentState, all: bool, limit: usize) -> EventsResponse {
    let log = &s.events;
    let open = log.open_events().cloned();
    let events: Vec<Event> =
        if all { open.chain(log.recent_closed().cloned()).take(limit).collect() } else { open.take(limit).collect() };
    EventsResponse {
        state: if all { "all" } else { "open" }.to_owned(),
        limit,
        open_count: log.open_events().count(),
        closed_retained: log.recent_closed().count(),
        windows: log.counters.windows,
        jobs: s.jobs.clone(),
        events,
    }
}

/// Builds the `/v1/status` body.
pub fn status_of(s: &AgentState) -> StatusResponse {
    let ready = s.readiness();
    let ds = s.table.dataplane_stats();
    StatusResponse {
        ready: ready.is_ok(),
        not_ready_reason: ready.err(),
        interfaces: s.interfaces.clone(),
        pin_dir: s.pin_dir.as_ref().map(|p| p.display().to_string()),
        poll_interval_seconds: s.poll_interval.as_secs_f64(),
        polls: s.polls,
        poll_errors: s.poll_errors,
        last_poll_age_seconds: s.poll_age().map(|d| d.as_secs_f64()),
        flows_tracked: s.table.len(),
        dataplane: STATS_NAMES.iter().map(|(n, i)| ((*n).to_owned(), ds.get(*i as usize).copied().unwrap_or(0))).collect(),
    }
}

