//! Every metric the agent exposes: names, help strings, labels, rendering. No other file names a
//! metric. docs/metrics.md mirrors the table below.
//!
//! Rendered at scrape time from the stages' snapshots ([`AgentView`]) through `prometheus-client`'s OpenMetrics text
//! encoder (a custom `Collector`, because every value is a snapshot of kernel counters or of the
//! flow table, not something incremented in place). Counters are named here without `_total`;
//! the encoder appends it.
//!
//! Labels are bounded: `interface` (attached interfaces), `direction` (2), `kind` (tcp, udp,
//! rocev2), `peer` (at most `max_peers` addresses plus `other`), `result`/`reason` (fixed sets).
//! Detection metrics carry only `kind`, `severity` and `operation` (fixed sets): which peer or link
//! an event names is in `/v1/events`, not in labels.
//! The raw 5-tuple is never a label; it is available from `/v1/flows`.
use prometheus_client::{
    collector::Collector,
    encoding::{text::encode, DescriptorEncoder, MetricEncoder, NoLabelSet},
    metrics::MetricType,
    registry::Registry,
};

use crate::{
    collector::POLL_DURATION_BUCKETS,
    flow_table::{direction_name, format_addr, kind_name, Counters, InterfaceKey, PeerKey, BURST_DURATION_BUCKETS},
    hint_board::HintBoard,
    view::AgentView,
};
use dataplane_common::stats;

/// A metric's name (without `_total` for counters) and help string.
pub struct Metric {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: MetricType,
}

macro_rules! metric {
    ($id:ident, $name:literal, $kind:ident, $help:literal) => {
        pub const $id: Metric = Metric { name: $name, help: $help, kind: MetricType::$kind };
    };
}

// --- eBPF data plane (STATS array, summed over CPUs) ---
metric!(DATAPLANE_PACKETS, "ringside_dataplane_packets", Counter,
    "Packets seen by the flow monitor, by result: seen (all), parsed (down to TCP/UDP/RoCEv2), matched (matched the configuration: counted in a flow, or also map_full or contended), malformed, unsupported (skipped by design), unreadable (headers could not be pulled into the linear skb), contended (matched, but another CPU was creating the flow's slot at that instant, or the slot changed between the classifier's two reads of it: passed uncounted)");
metric!(DATAPLANE_MAP_FULL, "ringside_dataplane_map_full", Counter,
    "Matched packets of flows that found no free slot in their probe window of the kernel flow table (table too full: raise kernel_max_flows); those packets were not counted in any flow");
metric!(DATAPLANE_RINGBUF_FULL, "ringside_dataplane_ringbuf_full", Counter,
    "Events lost because the kernel ring buffer was full (the agent drained it too slowly); packets are unaffected");
metric!(DATAPLANE_FLOW_SLOTS, "ringside_dataplane_flow_slots", Gauge,
    "Slots of the kernel flow table (kernel_max_flows of them) by state: live (a flow), tombstone (a flow the agent evicted; free to a new flow, turned back into empty when an empty slot follows its run), claiming (a flow being created), empty. Keep live under about 50 % of kernel_max_flows: above that, probe windows fill and packets count as map_full");
metric!(DATAPLANE_EVENTS, "ringside_dataplane_events", Counter,
    "Events written to the kernel ring buffer");
// --- flows ---
metric!(FLOWS_TRACKED, "ringside_flows_tracked", Gauge,
    "Flows currently held in the agent's flow table");
metric!(PEER_BYTES, "ringside_peer_bytes", Counter,
    "L3 bytes (IP header included) exchanged with a peer (the remote address)");
metric!(PEER_PACKETS, "ringside_peer_packets", Counter,
    "Packets exchanged with a peer");
metric!(PEER_TCP_RETRANSMISSIONS, "ringside_peer_tcp_retransmissions", Counter,
    "TCP data segments at or below the highest sequence already seen (retransmission or reordering)");
metric!(PEER_TCP_DSACKS, "ringside_peer_tcp_dsacks", Counter,
    "TCP pure ACKs carrying a D-SACK: the receiver got data again that it already had (a spurious retransmission in the other direction)");
metric!(PEER_CE_MARKS, "ringside_peer_ce_marks", Counter,
    "Packets carrying ECN Congestion Experienced");
metric!(PEER_ROCE_PSN_GAPS, "ringside_peer_roce_psn_gaps", Counter,
    "RoCEv2 packets whose PSN jumped ahead of the expected one (gap events)");
metric!(PEER_ROCE_PSN_GAP_PACKETS, "ringside_peer_roce_psn_gap_packets", Counter,
    "RoCEv2 PSNs skipped by those gaps (packets presumed lost upstream)");
metric!(PEER_ROCE_CNPS, "ringside_peer_roce_cnps", Counter,
    "RoCEv2 Congestion Notification Packets");
metric!(PEER_ROCE_NAKS, "ringside_peer_roce_naks", Counter,
    "RoCEv2 ACKs carrying a NAK syndrome");
metric!(INTERFACE_BYTES, "ringside_interface_bytes", Counter,
    "L3 bytes of matched flows on an interface");
metric!(INTERFACE_PACKETS, "ringside_interface_packets", Counter,
    "Packets of matched flows on an interface");
// --- bursts ---
metric!(BURSTS, "ringside_bursts", Counter,
    "Bursts (steps) that ended: a flow went idle for longer than the burst gap");
metric!(BURST_BYTES, "ringside_burst_bytes", Counter,
    "Bytes carried by bursts that ended");
metric!(BURST_DURATION, "ringside_burst_duration_seconds", Histogram,
    "Duration of ended bursts, first to last packet");
// --- agent ---
metric!(AGENT_EVENTS, "ringside_agent_events", Counter,
    "Ring-buffer events received by the agent, by kind");
metric!(AGENT_POLLS, "ringside_agent_polls", Counter,
    "Successful map polls");
metric!(AGENT_POLL_ERRORS, "ringside_agent_poll_errors", Counter,
    "Map polls that failed (see the agent log)");
metric!(AGENT_POLL_DURATION, "ringside_agent_poll_duration_seconds", Histogram,
    "Time to read the kernel maps, drain the ring buffer and update the flow table");
metric!(AGENT_LAST_POLL, "ringside_agent_last_poll_timestamp_seconds", Gauge,
    "Unix time of the last successful poll");
metric!(AGENT_FLOWS_EVICTED, "ringside_agent_flows_evicted", Counter,
    "Flows dropped from the agent's table, by reason: idle (no packet for flow_idle_timeout_secs) or capacity (max_flows)");
metric!(AGENT_INTERFACES_ATTACHED, "ringside_agent_interfaces_attached", Gauge,
    "Interfaces the flow monitor is attached to");

// --- detection ---
metric!(VERDICTS_OPEN, "ringside_verdicts_open", Gauge,
    "Open detection events (/v1/events), by kind (congestion, gray_failure, straggler) and severity (info, warning, critical); carried-over events included");
metric!(VERDICTS, "ringside_verdicts", Counter,
    "Detection events opened since the agent started, by kind (events carried over from before a restart are not counted again)");
metric!(DETECT_WINDOWS, "ringside_detect_windows", Counter,
    "Detection windows run (detect.window_ms each)");
metric!(DETECT_INPUT_ERRORS, "ringside_detect_input_errors", Counter,
    "Job windows the detectors rejected (window too short or long, out of order, too many jobs); see the agent log");
metric!(DETECT_WINDOWS_DROPPED, "ringside_detect_windows_dropped", Counter,
    "Detection windows the collector dropped because the analysis stage was that many windows behind (its queue was full); the poll loop never waits for detection");
metric!(DETECT_STATE_FILE_ERRORS, "ringside_detect_state_file_errors", Counter,
    "Problems with the events state file in state_dir, by operation: load (unreadable or corrupt at start: the agent started fresh) or save (open events may not survive a restart)");

// --- mirrored-frame ingest (mirror.rs; only with [mirror]) ---
metric!(MIRROR_FRAMES, "ringside_mirror_frames", Counter,
    "Frames read from the mirror port, by result: seen (all), parsed (down to TCP/UDP/RoCEv2), matched (counted in a flow), malformed, unsupported (skipped by design), unreadable (headers beyond the snap length)");
metric!(MIRROR_RING_DROPS, "ringside_mirror_ring_drops", Counter,
    "Mirrored frames the kernel dropped because the receive ring was full ([mirror] ring_blocks x ring_block_kib too small, or the agent starved of CPU)");
metric!(MIRROR_FLOWS, "ringside_mirror_flows", Gauge,
    "Flows tracked from the mirror port");
metric!(MIRROR_TABLE_FULL, "ringside_mirror_table_full", Counter,
    "Matched mirrored frames of new flows not tracked because [mirror] max_flows flows were held");
metric!(MIRROR_EVENTS_DROPPED, "ringside_mirror_events_dropped", Counter,
    "Burst-end and flow-start events of mirrored flows dropped because too many waited for the collector");
metric!(MIRROR_TIMESTAMP_FALLBACKS, "ringside_mirror_timestamp_fallbacks", Counter,
    "Mirrored frames whose socket timestamp was more than 10 s from the clock; their receive time was used instead");

// --- Egress queues of the attached interfaces (queue_stats.rs; growth since the first read) ---
metric!(INTERFACE_QUEUE_PACKETS, "ringside_interface_queue_packets", Counter,
    "Packets the interface's root qdisc sent (0 for a queue-less interface such as veth's noqueue), read once per detection window");
metric!(INTERFACE_QUEUE_DROPS, "ringside_interface_queue_drops", Counter,
    "Packets the interface's root qdisc dropped (queue full, rate limit, AQM): loss at this end of the link, the congestion detector's queue_drop_rate");
metric!(INTERFACE_QUEUE_OVERLIMITS, "ringside_interface_queue_overlimits", Counter,
    "Times the interface's root qdisc, a shaper (tbf, htb), held a packet back for lack of rate: this end of the link is the bottleneck of what it is offered, the congestion detector's queue_throttle_rate");
metric!(INTERFACE_CARRIER_DOWNS, "ringside_interface_carrier_downs", Counter,
    "Times the interface lost its carrier (the far end's port went down, a cable pulled, a PHY retrained), read with the queues: a link flap, the gray-failure detector's carrier_downs");
metric!(INTERFACE_QUEUE_READS, "ringside_interface_queue_reads", Counter,
    "Dumps of the namespace's root qdiscs (RTM_GETQDISC), one per detection window");
metric!(INTERFACE_QUEUE_READ_ERRORS, "ringside_interface_queue_read_errors", Counter,
    "Dumps that failed (no queue counters for that window; logged once per failure streak)");

// --- RDMA port counters (rdma_counters.rs; growth since the agent first read the port) ---
metric!(RDMA_PORT_BYTES, "ringside_rdma_port_bytes", Counter,
    "Bytes an RDMA port sent (egress) or received (ingress), from its port_xmit_data / port_rcv_data counters, including RoCE the host kernel never sees");
metric!(RDMA_PORT_PACKETS, "ringside_rdma_port_packets", Counter,
    "Packets an RDMA port sent (egress) or received (ingress), from port_xmit_packets / port_rcv_packets");
metric!(RDMA_PORT_CNPS, "ringside_rdma_port_cnps", Counter,
    "RoCE Congestion Notification Packets by role: sent (np_cnp_sent: ECN-marked packets arrived, congestion on the way in) or handled (rp_cnp_handled: what the port sent met congestion)");
metric!(RDMA_PORT_ECN_MARKED_PACKETS, "ringside_rdma_port_ecn_marked_packets", Counter,
    "ECN-marked RoCE packets the port received (np_ecn_marked_roce_packets)");
metric!(RDMA_PORT_LOSS_SIGNALS, "ringside_rdma_port_loss_signals", Counter,
    "Loss evidence from the port's hw_counters, by counter: out_of_sequence, packet_seq_err, implied_nak_seq_err, local_ack_timeout_err, duplicate_request, roce_adp_retrans");
metric!(RDMA_PORT_ERRORS, "ringside_rdma_port_errors", Counter,
    "Port errors that are not loss evidence, by counter: port_rcv_errors, port_xmit_discards, link_downed, symbol_error, rnr_nak_retry_err");
metric!(RDMA_PORT_READ_PROBLEMS, "ringside_rdma_port_read_problems", Counter,
    "Problems reading the RDMA port counters, by reason: vanished (a counter file went away), unreadable, not_numeric, reset (a counter went backwards: no delta for that interval), capped (devices or ports beyond the reader's caps, not read)");
metric!(RDMA_PORT_POLLS, "ringside_rdma_port_polls", Counter,
    "Reads of the RDMA port counters (one per detection window; with no device, reads of an empty or missing directory)");
metric!(RDMA_PORTS_READ, "ringside_rdma_ports_read", Gauge,
    "RDMA ports whose counters the last read found (0 with no RDMA device)");

// --- API ---
metric!(API_JOBS_REGISTERED, "ringside_api_jobs_registered", Gauge,
    "Jobs registered through POST /v1/jobs (config-file jobs not included)");
metric!(API_JOBS_FILE_ERRORS, "ringside_api_jobs_file_errors", Counter,
    "Problems with the registered-jobs file in state_dir, by operation: load (unreadable or corrupt at start and moved aside, or jobs in it dropped) or save (the last registration or removal may not survive a restart)");
metric!(API_HINT_STREAMS, "ringside_api_hint_streams", Gauge,
    "Open hint streams (GET /v1/jobs/{id}/hints/stream)");

// --- one job (GET /v1/jobs/{id}/metrics only; every series carries `job`) ---
metric!(JOB_PLAN_INFO, "ringside_job_plan_info", Gauge,
    "The job's current plan: 1, labelled with the algorithm and the compression (codec) to use");
metric!(JOB_PLAN_REPORTED_INFO, "ringside_job_plan_reported_info", Gauge,
    "The plan the job last reported it runs (PUT /v1/jobs/{id}/plan, within 30 s): 1, labelled with the algorithm and the compression; absent without a report");
metric!(JOB_PLAN_CHUNK_BYTES, "ringside_job_plan_chunk_bytes", Gauge,
    "Pipeline chunk size of the current plan, bytes");
metric!(JOB_PLAN_CHANNELS, "ringside_job_plan_channels", Gauge,
    "Parallel connections per peer pair of the current plan");
metric!(JOB_PLAN_TCP_RTO_MIN, "ringside_job_plan_tcp_rto_min_seconds", Gauge,
    "Transport advice of the current hint: the minimum TCP retransmission timeout advised on the job's connections, seconds; absent without advice");
metric!(JOB_PLAN_VERSION, "ringside_job_plan_version", Gauge,
    "Version of the current hint (increases by one with every plan change)");
metric!(JOB_PLAN_CONFIDENCE, "ringside_job_plan_confidence", Gauge,
    "How sure the policy is that the current plan beats the previous one, 0 to 1");
metric!(JOB_PLAN_EXPIRES, "ringside_job_plan_expires_timestamp_seconds", Gauge,
    "Unix time after which the current hint is stale unless renewed");
metric!(JOB_STEP_SECONDS, "ringside_job_step_seconds", Gauge,
    "Observed training step time (compute and communication) in the last detection window");
metric!(JOB_COMM_SECONDS, "ringside_job_comm_seconds", Gauge,
    "Observed communication time per step in the last detection window");
metric!(JOB_PREDICTED_COMM_SECONDS, "ringside_job_predicted_comm_seconds", Gauge,
    "Communication time per step the cost model predicts under the current plan");
metric!(JOB_PEER_HEALTH, "ringside_job_peer_health", Gauge,
    "1 for the job's peer in its current health (healthy, degraded or idle), by peer; only the job's own peers");
metric!(JOB_PEER_GOODPUT, "ringside_job_peer_goodput_bytes_per_second", Gauge,
    "In-burst goodput the job reached with a peer in the last window");
metric!(JOB_PEER_LOSS_RATIO, "ringside_job_peer_loss_ratio", Gauge,
    "Loss-evidence packets per data packet exchanged with a peer in the last window");

// --- the agent process (`/proc/self`, see process_metrics.rs) and its build ---
// The standard names of Prometheus client libraries and the node exporter's process collector,
// so existing dashboards and alerts work; hence no `ringside_` prefix, except for build info.
metric!(BUILD_INFO, "ringside_build_info", Gauge,
    "1, labelled with the agent's version, the git commit it was built from (when known) and the rustc version");
metric!(PROCESS_CPU_SECONDS, "process_cpu_seconds", Counter,
    "Total user and system CPU time spent by the agent process in seconds");
metric!(PROCESS_RESIDENT_MEMORY, "process_resident_memory_bytes", Gauge,
    "Resident memory size of the agent process in bytes");
metric!(PROCESS_VIRTUAL_MEMORY, "process_virtual_memory_bytes", Gauge,
    "Virtual memory size of the agent process in bytes");
metric!(PROCESS_START_TIME, "process_start_time_seconds", Gauge,
    "Start time of the agent process since the Unix epoch in seconds");
metric!(PROCESS_OPEN_FDS, "process_open_fds", Gauge,
    "Number of open file descriptors of the agent process");
metric!(PROCESS_MAX_FDS, "process_max_fds", Gauge,
    "Maximum number of open file descriptors of the agent process (soft limit; absent when unlimited)");

// --- the HTTP server (api/server.rs) ---
metric!(HTTP_CONNECTIONS_ACCEPTED, "ringside_http_connections_accepted", Counter,
    "HTTP connections the agent accepted");
metric!(HTTP_CONNECTIONS_REFUSED, "ringside_http_connections_refused", Counter,
    "HTTP connections closed at once because the connection limit was reached");
metric!(HTTP_CONNECTIONS_OPEN, "ringside_http_connections_open", Gauge,
    "HTTP connections open now");

/// The process and build metrics, in exposition order (rendered after [`ALL`]).
#[cfg_attr(not(test), allow(dead_code))] // the catalogue the tests check names and help against
pub const PROCESS_ALL: &[&Metric] = &[
    &BUILD_INFO, &PROCESS_CPU_SECONDS, &PROCESS_RESIDENT_MEMORY, &PROCESS_VIRTUAL_MEMORY,
    &PROCESS_START_TIME, &PROCESS_OPEN_FDS, &PROCESS_MAX_FDS,
    &HTTP_CONNECTIONS_ACCEPTED, &HTTP_CONNECTIONS_REFUSED, &HTTP_CONNECTIONS_OPEN,
];

/// Every job-scoped metric (`GET /v1/jobs/{id}/metrics`), in exposition order.
#[cfg_attr(not(test), allow(dead_code))] // the catalogue the tests check names and help against
pub const JOB_ALL: &[&Metric] = &[
    &JOB_PLAN_INFO, &JOB_PLAN_REPORTED_INFO, &JOB_PLAN_CHUNK_BYTES, &JOB_PLAN_CHANNELS, &JOB_PLAN_TCP_RTO_MIN, &JOB_PLAN_VERSION,
    &JOB_PLAN_CONFIDENCE, &JOB_PLAN_EXPIRES, &JOB_STEP_SECONDS, &JOB_COMM_SECONDS, &JOB_PREDICTED_COMM_SECONDS,
    &JOB_PEER_HEALTH, &JOB_PEER_GOODPUT, &JOB_PEER_LOSS_RATIO,
];

/// Every metric, in exposition order.
#[cfg_attr(not(test), allow(dead_code))] // the catalogue the tests check names and help against
pub const ALL: &[&Metric] = &[
    &DATAPLANE_PACKETS, &DATAPLANE_MAP_FULL, &DATAPLANE_RINGBUF_FULL, &DATAPLANE_EVENTS, &DATAPLANE_FLOW_SLOTS,
    &FLOWS_TRACKED, &PEER_BYTES, &PEER_PACKETS, &PEER_TCP_RETRANSMISSIONS, &PEER_TCP_DSACKS, &PEER_CE_MARKS,
    &PEER_ROCE_PSN_GAPS, &PEER_ROCE_PSN_GAP_PACKETS, &PEER_ROCE_CNPS, &PEER_ROCE_NAKS,
    &INTERFACE_BYTES, &INTERFACE_PACKETS, &BURSTS, &BURST_BYTES, &BURST_DURATION,
    &AGENT_EVENTS, &AGENT_POLLS, &AGENT_POLL_ERRORS, &AGENT_POLL_DURATION, &AGENT_LAST_POLL,
    &AGENT_FLOWS_EVICTED, &AGENT_INTERFACES_ATTACHED,
    &VERDICTS_OPEN, &VERDICTS, &DETECT_WINDOWS, &DETECT_INPUT_ERRORS, &DETECT_WINDOWS_DROPPED, &DETECT_STATE_FILE_ERRORS,
    &MIRROR_FRAMES, &MIRROR_RING_DROPS, &MIRROR_FLOWS, &MIRROR_TABLE_FULL, &MIRROR_EVENTS_DROPPED, &MIRROR_TIMESTAMP_FALLBACKS,
    &RDMA_PORT_BYTES, &RDMA_PORT_PACKETS, &RDMA_PORT_CNPS, &RDMA_PORT_ECN_MARKED_PACKETS, &RDMA_PORT_LOSS_SIGNALS,
    &RDMA_PORT_ERRORS, &RDMA_PORT_READ_PROBLEMS, &RDMA_PORT_POLLS, &RDMA_PORTS_READ,
    &INTERFACE_QUEUE_PACKETS, &INTERFACE_QUEUE_DROPS, &INTERFACE_QUEUE_OVERLIMITS, &INTERFACE_CARRIER_DOWNS, &INTERFACE_QUEUE_READS, &INTERFACE_QUEUE_READ_ERRORS,
    &API_JOBS_REGISTERED, &API_JOBS_FILE_ERRORS, &API_HINT_STREAMS,
];

/// The `Content-Type` of [`render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

type Labels = Vec<(&'static str, String)>;

enum Value {
    Counter(u64),
    CounterSeconds(f64),
    Gauge(f64),
    Count(u64),
    Histogram { sum: f64, count: u64, buckets: Vec<(f64, u64)> },
}

/// One metric with its series, built from the snapshots.
struct Family {
    metric: &'static Metric,
    series: Vec<(Labels, Value)>,
}

fn families(view: &AgentView) -> Vec<Family> {
    let t = view.collector();
    let events = view.events();
    let attach = &*view.attach;
    let ds = &t.dataplane;
    let d = |i: u32| ds[i as usize];
    let single = |metric, v| Family { metric, series: vec![(Vec::new(), v)] };

    let results = [
        ("seen", stats::SEEN),
        ("parsed", stats::PARSED),
        ("matched", stats::MATCHED),
        ("malformed", stats::MALFORMED),
        ("unsupported", stats::UNSUPPORTED),
        ("unreadable", stats::UNREADABLE),
        ("contended", stats::CONTENDED),
    ];
    let mut out = vec![
        Family {
            metric: &DATAPLANE_PACKETS,
            series: results.iter().map(|(r, i)| (vec![("result", (*r).to_owned())], Value::Counter(d(*i)))).collect(),
        },
        single(&DATAPLANE_MAP_FULL, Value::Counter(d(stats::MAP_FULL))),
        single(&DATAPLANE_RINGBUF_FULL, Value::Counter(d(stats::RINGBUF_FULL))),
        single(&DATAPLANE_EVENTS, Value::Counter(d(stats::EVENTS))),
    ];
    if let Some(sl) = t.slots {
        let empty = sl.capacity.saturating_sub(sl.live + sl.claiming + sl.tombstones);
        out.push(Family {
            metric: &DATAPLANE_FLOW_SLOTS,
            series: [("live", sl.live), ("tombstone", sl.tombstones), ("claiming", sl.claiming), ("empty", empty)]
                .iter()
                .map(|(st, n)| (vec![("state", (*st).to_owned())], Value::Count(*n)))
                .collect(),
        });
    }

    let per_if = &t.flows_per_interface;
    let mut tracked: Vec<(Labels, Value)> = attach
        .interfaces
        .iter()
        .map(|i| (vec![("interface", i.name.clone())], Value::Count(*per_if.get(&i.ifindex).unwrap_or(&0))))
        .collect();
    // Flows on an interface the agent does not know by name (should not happen) still count.
    for (ifindex, n) in per_if {
        if !attach.interfaces.iter().any(|i| i.ifindex == *ifindex) {
            tracked.push((vec![("interface", attach.ifname(*ifindex))], Value::Count(*n)));
        }
    }
    out.push(Family { metric: &FLOWS_TRACKED, series: tracked });

    let peers = &t.peers;
    let peer_labels = |k: &PeerKey| -> Labels {
        vec![
            ("interface", attach.ifname(k.ifindex)),
            ("direction", direction_name(k.direction).to_owned()),
            ("kind", kind_name(k.kind).to_owned()),
            ("peer", format_addr(&k.peer)),
        ]
    };
    let peer_family = |metric: &'static Metric, f: fn(&Counters) -> u64, only: Option<&str>| Family {
        metric,
        series: peers
            .iter()
            .filter(|(k, _)| only.is_none_or(|kind| kind_name(k.kind) == kind))
            .map(|(k, c)| (peer_labels(k), Value::Counter(f(c))))
            .collect(),
    };
    out.push(peer_family(&PEER_BYTES, |c| c.bytes, None));
    out.push(peer_family(&PEER_PACKETS, |c| c.packets, None));
    out.push(peer_family(&PEER_TCP_RETRANSMISSIONS, |c| c.tcp_retrans, Some("tcp")));
    out.push(peer_family(&PEER_TCP_DSACKS, |c| c.tcp_dsacks, Some("tcp")));
    out.push(peer_family(&PEER_CE_MARKS, |c| c.ce_marks, None));
    out.push(peer_family(&PEER_ROCE_PSN_GAPS, |c| c.roce_psn_gap_events, Some("rocev2")));
    out.push(peer_family(&PEER_ROCE_PSN_GAP_PACKETS, |c| c.roce_psn_gap_packets, Some("rocev2")));
    out.push(peer_family(&PEER_ROCE_CNPS, |c| c.roce_cnps, Some("rocev2")));
    out.push(peer_family(&PEER_ROCE_NAKS, |c| c.roce_naks, Some("rocev2")));

    let if_labels = |k: &InterfaceKey| -> Labels {
        vec![
            ("interface", attach.ifname(k.ifindex)),
            ("direction", direction_name(k.direction).to_owned()),
            ("kind", kind_name(k.kind).to_owned()),
        ]
    };
    let ifs = &t.interfaces;
    out.push(Family { metric: &INTERFACE_BYTES, series: ifs.iter().map(|(k, c)| (if_labels(k), Value::Counter(c.bytes))).collect() });
    out.push(Family { metric: &INTERFACE_PACKETS, series: ifs.iter().map(|(k, c)| (if_labels(k), Value::Counter(c.packets))).collect() });

    let bursts = &t.bursts;
    out.push(Family { metric: &BURSTS, series: bursts.iter().map(|(k, b)| (if_labels(k), Value::Counter(b.count))).collect() });
    out.push(Family { metric: &BURST_BYTES, series: bursts.iter().map(|(k, b)| (if_labels(k), Value::Counter(b.bytes))).collect() });
    out.push(Family {
        metric: &BURST_DURATION,
        series: bursts
            .iter()
            .map(|(k, b)| {
                (if_labels(k), Value::Histogram { sum: b.duration_sum_seconds, count: b.count, buckets: with_bounds(&BURST_DURATION_BUCKETS, &b.buckets) })
            })
            .collect(),
    });

    let ev = t.events;
    out.push(Family {
        metric: &AGENT_EVENTS,
        series: [("flow_start", ev.flow_start), ("burst_end", ev.burst_end), ("map_full", ev.map_full), ("unknown", ev.unknown)]
            .into_iter()
            .map(|(k, v)| (vec![("kind", k.to_owned())], Value::Counter(v)))
            .collect(),
    });
    out.push(single(&AGENT_POLLS, Value::Counter(t.poll.polls)));
    out.push(single(&AGENT_POLL_ERRORS, Value::Counter(t.poll.errors)));
    let pt = &t.poll.times;
    out.push(single(
        &AGENT_POLL_DURATION,
        Value::Histogram { sum: pt.sum_seconds, count: pt.count, buckets: with_bounds(&POLL_DURATION_BUCKETS, &pt.buckets) },
    ));
    out.push(single(&AGENT_LAST_POLL, Value::Gauge(t.poll.last_poll_unix_seconds)));
    let evic = t.evictions;
    out.push(Family {
        metric: &AGENT_FLOWS_EVICTED,
        series: vec![
            (vec![("reason", "idle".to_owned())], Value::Counter(evic.idle)),
            (vec![("reason", "capacity".to_owned())], Value::Counter(evic.capacity)),
        ],
    });
    let attached = if attach.attached { attach.interfaces.len() } else { 0 };
    out.push(single(&AGENT_INTERFACES_ATTACHED, Value::Count(attached as u64)));

    // Detection: labels are the fixed kind × severity sets, never a peer or a job.
    use crate::detect::{Severity, VerdictKind};
    let kinds = [(VerdictKind::Congestion, "congestion"), (VerdictKind::GrayFailure, "gray_failure"), (VerdictKind::Straggler, "straggler")];
    let severities = [(Severity::Info, "info"), (Severity::Warning, "warning"), (Severity::Critical, "critical")];
    let ev = &events.log;
    let mut open = Vec::new();
    for (k, kn) in kinds {
        for (sev, sn) in severities {
            let n = ev.open_events().filter(|e| e.kind == k && e.severity == sev).count() as u64;
            open.push((vec![("kind", kn.to_owned()), ("severity", sn.to_owned())], Value::Count(n)));
        }
    }
    out.push(Family { metric: &VERDICTS_OPEN, series: open });
    out.push(Family {
        metric: &VERDICTS,
        series: kinds.iter().map(|(k, kn)| (vec![("kind", (*kn).to_owned())], Value::Counter(ev.opened_total(*k)))).collect(),
    });
    out.push(single(&DETECT_WINDOWS, Value::Counter(ev.counters.windows)));
    out.push(single(&DETECT_INPUT_ERRORS, Value::Counter(ev.counters.input_errors)));
    out.push(single(&DETECT_WINDOWS_DROPPED, Value::Counter(t.windows_dropped)));
    out.push(Family {
        metric: &DETECT_STATE_FILE_ERRORS,
        series: vec![
            (vec![("operation", "load".to_owned())], Value::Counter(ev.counters.state_load_errors)),
            (vec![("operation", "save".to_owned())], Value::Counter(ev.counters.state_write_errors)),
        ],
    });
    if let Some(m) = &view.mirror {
        out.extend(mirror_families(&m.status()));
    }
    if let Some(r) = &events.rdma {
        out.extend(rdma_families(r));
    }
    if let Some(q) = &events.queues {
        out.extend(queue_families(q));
    }
    let (registered, file) = {
        let c = view.catalog();
        (c.len(), c.file_counters)
    };
    out.push(single(&API_JOBS_REGISTERED, Value::Count(registered as u64)));
    out.push(Family {
        metric: &API_JOBS_FILE_ERRORS,
        series: vec![
            (vec![("operation", "load".to_owned())], Value::Counter(file.load_errors)),
            (vec![("operation", "save".to_owned())], Value::Counter(file.save_errors)),
        ],
    });
    out.push(single(&API_HINT_STREAMS, Value::Count(view.hint_streams.load(std::sync::atomic::Ordering::Relaxed) as u64)));
    out
}

/// The mirror ingest's counters (absent without `[mirror]`). Label: `interface` (one), `result`
/// (a fixed set).
fn mirror_families(m: &crate::mirror::MirrorStatus) -> Vec<Family> {
    let c = &m.counters;
    let i = || vec![("interface", m.interface.clone())];
    let one = |metric, v| Family { metric, series: vec![(i(), v)] };
    let results = [
        ("seen", c.seen),
        ("parsed", c.parsed),
        ("matched", c.matched),
        ("malformed", c.malformed),
        ("unsupported", c.unsupported),
        ("unreadable", c.unreadable),
    ];
    vec![
        Family {
            metric: &MIRROR_FRAMES,
            series: results.iter().map(|(r, v)| (vec![("interface", m.interface.clone()), ("result", (*r).to_owned())], Value::Counter(*v))).collect(),
        },
        one(&MIRROR_RING_DROPS, Value::Counter(c.ring_drops)),
        one(&MIRROR_FLOWS, Value::Count(m.flows as u64)),
        one(&MIRROR_TABLE_FULL, Value::Counter(c.table_full)),
        one(&MIRROR_EVENTS_DROPPED, Value::Counter(c.events_dropped)),
        one(&MIRROR_TIMESTAMP_FALLBACKS, Value::Counter(c.timestamp_fallbacks)),
    ]
}

/// The attached interfaces' egress queues (absent before the first detection window and without
/// detection). Label: `interface` (attached interfaces only).
fn queue_families(q: &crate::queue_stats::QueueSnapshot) -> Vec<Family> {
    let per = |metric, f: fn(&crate::queue_stats::QueueDelta) -> u64| Family {
        metric,
        series: q.interfaces.iter().map(|(i, d)| (vec![("interface", i.clone())], Value::Counter(f(d)))).collect(),
    };
    vec![
        per(&INTERFACE_QUEUE_PACKETS, |d| d.packets),
        per(&INTERFACE_QUEUE_DROPS, |d| d.drops),
        per(&INTERFACE_QUEUE_OVERLIMITS, |d| d.overlimits),
        per(&INTERFACE_CARRIER_DOWNS, |d| d.carrier_downs),
        Family { metric: &INTERFACE_QUEUE_READS, series: vec![(Vec::new(), Value::Counter(q.reads))] },
        Family { metric: &INTERFACE_QUEUE_READ_ERRORS, series: vec![(Vec::new(), Value::Counter(q.errors))] },
    ]
}

/// The RDMA port counters (absent with `[rdma] enabled = false`). Labels: `device` and `port`
/// (at most `MAX_DEVICES` × `MAX_PORTS`), plus fixed sets; a counter the port does not provide has
/// no series.
fn rdma_families(r: &crate::rdma_counters::RdmaSnapshot) -> Vec<Family> {
    use crate::rdma_counters::{self as rc, counter_name};
    let labels = |id: &rc::PortId, extra: Option<(&'static str, &str)>| -> Labels {
        let mut l = vec![("device", id.device.clone()), ("port", id.port.to_string())];
        l.extend(extra.map(|(k, v)| (k, v.to_owned())));
        l
    };
    let by = |metric: &'static Metric, label: &'static str, slots: &[(usize, &str)]| Family {
        metric,
        series: r
            .ports
            .iter()
            .flat_map(|(id, v)| slots.iter().filter_map(move |&(i, name)| v[i].map(|x| (labels(id, Some((label, name))), Value::Counter(x)))))
            .collect(),
    };
    let named = |slots: &[usize]| slots.iter().map(|&i| (i, counter_name(i))).collect::<Vec<_>>();
    let p = r.problems;
    vec![
        by(&RDMA_PORT_BYTES, "direction", &[(rc::XMIT_BYTES, "egress"), (rc::RCV_BYTES, "ingress")]),
        by(&RDMA_PORT_PACKETS, "direction", &[(rc::XMIT_PACKETS, "egress"), (rc::RCV_PACKETS, "ingress")]),
        by(&RDMA_PORT_CNPS, "role", &[(rc::CNP_SENT, "sent"), (rc::CNP_HANDLED, "handled")]),
        Family {
            metric: &RDMA_PORT_ECN_MARKED_PACKETS,
            series: r.ports.iter().filter_map(|(id, v)| v[rc::ECN_MARKED].map(|x| (labels(id, None), Value::Counter(x)))).collect(),
        },
        by(&RDMA_PORT_LOSS_SIGNALS, "counter", &named(rc::LOSS_SIGNALS)),
        by(&RDMA_PORT_ERRORS, "counter", &named(rc::ERRORS)),
        Family {
            metric: &RDMA_PORT_READ_PROBLEMS,
            series: [("vanished", p.vanished), ("unreadable", p.unreadable), ("not_numeric", p.not_numeric), ("reset", p.resets), ("capped", p.capped)]
                .into_iter()
                .map(|(k, v)| (vec![("reason", k.to_owned())], Value::Counter(v)))
                .collect(),
        },
        Family { metric: &RDMA_PORT_POLLS, series: vec![(Vec::new(), Value::Counter(r.polls))] },
        Family { metric: &RDMA_PORTS_READ, series: vec![(Vec::new(), Value::Count(r.ports.len() as u64))] },
    ]
}

/// The families of one job's metrics: its plan and what the policy measured, nothing else
/// (no interface, link or other job).
fn job_families(job: &str, hint: Option<&ringside_client::Hint>, reported: Option<&crate::policy::PlanInForce>, insight: Option<&crate::policy::JobInsight>) -> Vec<Family> {
    let j = || vec![("job", job.to_owned())];
    let gauge = |metric, v: Option<f64>| Family { metric, series: v.map(|v| (j(), Value::Gauge(v))).into_iter().collect() };
    let info = |metric, plan: Option<(ringside_client::Algorithm, ringside_client::Codec)>| Family {
        metric,
        series: plan
            .map(|(a, c)| (vec![("job", job.to_owned()), ("algorithm", a.to_string()), ("compression", c.to_string())], Value::Count(1)))
            .into_iter()
            .collect(),
    };
    let mut out = vec![
        info(&JOB_PLAN_INFO, hint.map(|h| (h.algorithm, h.compression))),
        info(&JOB_PLAN_REPORTED_INFO, reported.map(|r| (r.plan.algorithm, r.plan.compression))),
    ];
    out.push(gauge(&JOB_PLAN_CHUNK_BYTES, hint.map(|h| f64::from(h.chunk_bytes))));
    out.push(gauge(&JOB_PLAN_CHANNELS, hint.map(|h| f64::from(h.channels))));
    out.push(gauge(&JOB_PLAN_TCP_RTO_MIN, hint.and_then(|h| h.tcp_rto_min_ms).map(|ms| f64::from(ms) / 1e3)));
    out.push(gauge(&JOB_PLAN_VERSION, hint.map(|h| h.version as f64)));
    out.push(gauge(&JOB_PLAN_CONFIDENCE, hint.map(|h| h.confidence)));
    out.push(gauge(&JOB_PLAN_EXPIRES, hint.map(|h| h.expires_at as f64 / 1e3)));
    let ms = |v: Option<f64>| v.map(|v| v / 1e3);
    out.push(gauge(&JOB_STEP_SECONDS, ms(insight.and_then(|i| i.step_ms))));
    out.push(gauge(&JOB_COMM_SECONDS, ms(insight.and_then(|i| i.comm_ms))));
    out.push(gauge(&JOB_PREDICTED_COMM_SECONDS, ms(insight.and_then(|i| i.predicted_comm_ms))));
    let peers = insight.map(|i| i.peers.as_slice()).unwrap_or_default();
    let peer_labels = |p: &crate::policy::PeerHealth| vec![("job", job.to_owned()), ("peer", p.peer.to_string())];
    out.push(Family {
        metric: &JOB_PEER_HEALTH,
        series: peers
            .iter()
            .map(|p| {
                let mut l = peer_labels(p);
                l.push(("health", p.health.clone()));
                (l, Value::Count(1))
            })
            .collect(),
    });
    out.push(Family {
        metric: &JOB_PEER_GOODPUT,
        series: peers.iter().filter_map(|p| p.goodput_bytes_per_second.map(|v| (peer_labels(p), Value::Gauge(v)))).collect(),
    });
    out.push(Family {
        metric: &JOB_PEER_LOSS_RATIO,
        series: peers.iter().filter_map(|p| p.loss_ratio.map(|v| (peer_labels(p), Value::Gauge(v)))).collect(),
    });
    out
}

fn encode_families(fams: Vec<Family>) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Families(fams)));
    let mut out = String::new();
    encode(&mut out, &registry).expect("writing to a String cannot fail");
    out
}

/// Renders job `job`'s metrics (`GET /v1/jobs/{id}/metrics`) as OpenMetrics text.
pub fn render_job(board: &HintBoard, job: &str) -> String {
    let (hint, insight) = (board.latest(job), board.insight(job));
    let reported = board.applied(job, crate::clock::unix_ms());
    encode_families(job_families(job, hint.as_ref(), reported.as_ref(), insight.as_ref()))
}

fn with_bounds(bounds: &[f64], counts: &[u64]) -> Vec<(f64, u64)> {
    bounds.iter().copied().chain([f64::MAX]).zip(counts.iter().copied()).collect()
}

/// Adapter: a `Collector` over families built from the snapshots.
struct Families(Vec<Family>);

impl std::fmt::Debug for Families {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Families({})", self.0.len())
    }
}

impl Collector for Families {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for fam in &self.0 {
            let m = fam.metric;
            let mut me = encoder.encode_descriptor(m.name, m.help, None, m.kind)?;
            for (labels, value) in &fam.series {
                if labels.is_empty() {
                    encode_value(&mut me, value)?;
                } else {
                    encode_value(&mut me.encode_family(labels)?, value)?;
                }
            }
        }
        Ok(())
    }
}

fn encode_value(e: &mut MetricEncoder, value: &Value) -> Result<(), std::fmt::Error> {
    match value {
        Value::Counter(v) => e.encode_counter::<NoLabelSet, _, u64>(v, None),
        Value::CounterSeconds(v) => e.encode_counter::<NoLabelSet, _, u64>(v, None),
        Value::Gauge(v) => e.encode_gauge(v),
        Value::Count(v) => e.encode_gauge(v),
        // The last bound is f64::MAX, which the encoder writes as `+Inf`.
        Value::Histogram { sum, count, buckets } => e.encode_histogram::<NoLabelSet>(*sum, *count, buckets, None),
    }
}

/// Renders every metric as OpenMetrics text from the latest snapshots (no stage waits for it).
pub fn render(view: &AgentView) -> String {
    encode_families(families(view).into_iter().chain(process_families()).collect())
}

/// [`PROCESS_ALL`]: the build's labels (from build.rs) and a fresh reading of `/proc/self`. If
/// `/proc` cannot be read, the process metrics are left out of the scrape (logged at debug: the
/// same failure would repeat on every scrape).
fn process_families() -> Vec<Family> {
    let mut build = vec![("version", env!("CARGO_PKG_VERSION").to_owned())];
    if let Some(commit) = option_env!("RINGSIDE_GIT_COMMIT").filter(|c| !c.is_empty()) {
        build.push(("git_commit", commit.to_owned()));
    }
    if let Some(rustc) = option_env!("RINGSIDE_RUSTC_VERSION").filter(|c| !c.is_empty()) {
        build.push(("rustc_version", rustc.to_owned()));
    }
    let mut out = vec![Family { metric: &BUILD_INFO, series: vec![(build, Value::Count(1))] }];
    match crate::process_metrics::ProcessSample::read() {
        Ok(p) => {
            let single = |metric, v| Family { metric, series: vec![(Vec::new(), v)] };
            out.push(single(&PROCESS_CPU_SECONDS, Value::CounterSeconds(p.cpu_seconds)));
            out.push(single(&PROCESS_RESIDENT_MEMORY, Value::Count(p.resident_bytes)));
            out.push(single(&PROCESS_VIRTUAL_MEMORY, Value::Count(p.virtual_bytes)));
            out.push(single(&PROCESS_START_TIME, Value::Gauge(p.start_time_seconds)));
            out.push(single(&PROCESS_OPEN_FDS, Value::Count(p.open_fds)));
            out.push(Family { metric: &PROCESS_MAX_FDS, series: p.max_fds.map(|m| (Vec::new(), Value::Count(m))).into_iter().collect() });
        }
        Err(e) => tracing::debug!("process metrics left out of this scrape: {e}"),
    }
    let http = &crate::api::server::STATS;
    let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    for (metric, value) in [
        (&HTTP_CONNECTIONS_ACCEPTED, load(&http.accepted)),
        (&HTTP_CONNECTIONS_REFUSED, load(&http.refused)),
        (&HTTP_CONNECTIONS_OPEN, load(&http.open)),
    ] {
        out.push(Family { metric, series: vec![(Vec::new(), Value::Count(value))] });
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{
        analysis::EventsSnapshot,
        collector::Collector,
        events::EventLog,
        flow_table::{tests::{key, stats}, PollSnapshot, TableSettings},
        jobs::JobCatalog,
        loader::AttachedInterface,
        view::AttachInfo,
    };
    use dataplane_common::{direction, event_kind, flow_kind, BurstState, Event, FlowStats};
    use std::{
        sync::{Arc, Mutex},
        time::Duration,
    };

    /// The operator token of [`sample_state`].
    pub(crate) const TEST_OPERATOR_TOKEN: &str = "rso_test-operator-token";

    /// The event log of [`sample_state`]: one open gray-failure event.
    pub(crate) fn sample_events() -> EventLog {
        let mut log = EventLog::new(crate::config::DEFAULT_RECENT_EVENTS, crate::config::DEFAULT_CARRY_OVER_WINDOWS);
        let clock = crate::clock::Clock { mono_ns: 20_000_000_000, unix_ms: 1_700_000_020_000 };
        let v = crate::events::tests::verdict(1, crate::detect::VerdictKind::GrayFailure, "10.77.0.3");
        log.apply(&[crate::detect::VerdictChange::Opened(v)], &clock);
        log
    }

    /// An agent attached to eth0 after one poll with a TCP and a RoCE flow, one open event, and
    /// the operator token [`TEST_OPERATOR_TOKEN`].
    pub(crate) fn sample_state() -> AgentView {
        let attach = AttachInfo {
            interfaces: vec![AttachedInterface { name: "eth0".into(), ifindex: 2, mode: "clsact".into(), qdisc_added: true }],
            ifnames: [(2, "eth0".to_owned())].into(),
            attached: true,
            poll_interval: Duration::from_millis(100),
            pin_dir: None,
        };
        let (mut collector, snapshots) = Collector::new(TableSettings::default());
        let tcp = key(1, 2, 29500, direction::EGRESS, flow_kind::TCP);
        let roce = key(1, 3, 4791, direction::EGRESS, flow_kind::ROCEV2);
        let mut st = [0u64; crate::flow_table::STATS_COUNT];
        st[stats::SEEN as usize] = 100;
        st[stats::PARSED as usize] = 90;
        st[stats::MATCHED as usize] = 80;
        st[stats::MALFORMED as usize] = 1;
        st[stats::RINGBUF_FULL as usize] = 2;
        collector.fold(&PollSnapshot {
            mono_ns: 1_000_000_000,
            flows: vec![
                (tcp, FlowStats { tcp_retrans: 3, ..stats(10, 15_000, 1, 999_000_000) }),
                (roce, FlowStats { roce_psn_gap_events: 2, roce_psn_gap_packets: 5, roce_cnps: 7, ..stats(20, 40_000, 1, 999_000_000) }),
            ],
            stats: st,
            events: vec![Event {
                kind: event_kind::BURST_END,
                key: roce,
                burst: BurstState { start_ns: 0, last_ns: 3_000_000, bytes: 40_000, packets: 20 },
                ..Default::default()
            }],
            slots: Some(crate::flow_table::SlotCounts { capacity: 16_384, live: 2, claiming: 0, tombstones: 1 }),
            partial: false,
            vanished: Vec::new(),
        });
        collector.poll_done(Duration::from_micros(700));
        // The RDMA fixture tree, read twice (mlx5_0 port 1 sent 10 CNPs in between).
        let rdma = crate::rdma_counters::tests::TreeCopy::of("hosts");
        let mut reader = crate::rdma_counters::RdmaPortReader::new(rdma.0.clone());
        reader.poll(1_000_000_000);
        rdma.add("mlx5_0/ports/1/hw_counters/np_cnp_sent", 10);
        rdma.add("mlx5_0/ports/1/counters/port_rcv_data", 250);
        reader.poll(2_000_000_000);
        let rdma = Some(reader.snapshot().clone());
        let mut queues = crate::queue_stats::QueueSnapshot { reads: 3, errors: 1, ..Default::default() };
        queues.interfaces.insert("eth0".into(), crate::queue_stats::QueueDelta { packets: 5000, drops: 40, overlimits: 7, carrier_downs: 2 });
        let events = tokio::sync::watch::channel(Arc::new(EventsSnapshot { log: sample_events(), jobs: Vec::new(), rdma, queues: Some(queues) })).1;
        let catalog = JobCatalog::new(vec![crate::jobs::TokenHash::of(TEST_OPERATOR_TOKEN)], Vec::new());
        // A mirror port that read one RoCE frame and one ARP frame.
        let mut table = crate::mirror::MirrorTable::new(9, &crate::mirror::MirrorSettings::new("mir0".into()), crate::mirror::FlowMatch::default());
        let frame = ringside_test_support::frames::rocev2_4([10, 77, 0, 1], [10, 77, 0, 3], 49152, 0x0a, 1, 1, &[], &[0; 32]);
        table.ingest(&frame, frame.len(), 1_000_000_000);
        table.ingest(&[0xff; 60], 60, 1_000_000_000);
        let mirror = crate::mirror::MirrorFeed::new("mir0".into(), table);
        AgentView::new(attach, snapshots, events, Arc::new(Mutex::new(catalog)), HintBoard::default()).with_mirror(Some(mirror))
    }

    #[test]
    fn renders_expected_lines() {
        let text = render(&sample_state());
        for line in [
            "ringside_dataplane_packets_total{result=\"seen\"} 100",
            "ringside_dataplane_packets_total{result=\"matched\"} 80",
            "ringside_dataplane_packets_total{result=\"malformed\"} 1",
            "ringside_dataplane_ringbuf_full_total 2",
            "ringside_mirror_frames_total{interface=\"mir0\",result=\"seen\"} 2",
            "ringside_mirror_frames_total{interface=\"mir0\",result=\"matched\"} 1",
            "ringside_mirror_frames_total{interface=\"mir0\",result=\"unsupported\"} 1",
            "ringside_mirror_flows{interface=\"mir0\"} 1",
            "ringside_interface_queue_packets_total{interface=\"eth0\"} 5000",
            "ringside_interface_queue_drops_total{interface=\"eth0\"} 40",
            "ringside_interface_queue_overlimits_total{interface=\"eth0\"} 7",
            "ringside_interface_carrier_downs_total{interface=\"eth0\"} 2",
            "ringside_interface_queue_reads_total 3",
            "ringside_interface_queue_read_errors_total 1",
            "ringside_mirror_ring_drops_total{interface=\"mir0\"} 0",
            "ringside_flows_tracked{interface=\"eth0\"} 2",
            "ringside_peer_bytes_total{interface=\"eth0\",direction=\"egress\",kind=\"tcp\",peer=\"10.77.0.2\"} 15000",
            "ringside_peer_tcp_retransmissions_total{interface=\"eth0\",direction=\"egress\",kind=\"tcp\",peer=\"10.77.0.2\"} 3",
            "ringside_peer_roce_psn_gap_packets_total{interface=\"eth0\",direction=\"egress\",kind=\"rocev2\",peer=\"10.77.0.3\"} 5",
            "ringside_peer_roce_psn_gaps_total{interface=\"eth0\",direction=\"egress\",kind=\"rocev2\",peer=\"10.77.0.3\"} 2",
            "ringside_peer_roce_cnps_total{interface=\"eth0\",direction=\"egress\",kind=\"rocev2\",peer=\"10.77.0.3\"} 7",
            "ringside_interface_bytes_total{interface=\"eth0\",direction=\"egress\",kind=\"rocev2\"} 40000",
            "ringside_bursts_total{interface=\"eth0\",direction=\"egress\",kind=\"rocev2\"} 1",
            "ringside_burst_duration_seconds_bucket{le=\"0.001\",interface=\"eth0\",direction=\"egress\",kind=\"rocev2\"} 0",
            "ringside_burst_duration_seconds_bucket{le=\"0.005\",interface=\"eth0\",direction=\"egress\",kind=\"rocev2\"} 1",
            "ringside_burst_duration_seconds_count{interface=\"eth0\",direction=\"egress\",kind=\"rocev2\"} 1",
            "ringside_agent_polls_total 1",
            "ringside_dataplane_map_full_total 0",
            "ringside_dataplane_flow_slots{state=\"live\"} 2",
            "ringside_dataplane_flow_slots{state=\"tombstone\"} 1",
            "ringside_dataplane_flow_slots{state=\"empty\"} 16381",
            "ringside_burst_duration_seconds_bucket{le=\"+Inf\",interface=\"eth0\",direction=\"egress\",kind=\"rocev2\"} 1",
            "ringside_agent_poll_duration_seconds_count 1",
            "ringside_agent_poll_duration_seconds_bucket{le=\"0.001\"} 1",
            "ringside_agent_events_total{kind=\"burst_end\"} 1",
            "ringside_agent_interfaces_attached 1",
            "ringside_verdicts_open{kind=\"gray_failure\",severity=\"critical\"} 1",
            "ringside_verdicts_open{kind=\"straggler\",severity=\"info\"} 0",
            "ringside_verdicts_total{kind=\"gray_failure\"} 1",
            "ringside_verdicts_total{kind=\"congestion\"} 0",
            "ringside_detect_windows_total 0",
            "ringside_detect_input_errors_total 0",
            "ringside_detect_state_file_errors_total{operation=\"load\"} 0",
            "ringside_rdma_port_cnps_total{device=\"mlx5_0\",port=\"1\",role=\"sent\"} 10",
            "ringside_rdma_port_cnps_total{device=\"mlx5_0\",port=\"2\",role=\"handled\"} 0",
            "ringside_rdma_port_bytes_total{device=\"mlx5_0\",port=\"1\",direction=\"ingress\"} 1000",
            "ringside_rdma_port_packets_total{device=\"qib0\",port=\"1\",direction=\"egress\"} 0",
            "ringside_rdma_port_loss_signals_total{device=\"mlx5_0\",port=\"2\",counter=\"out_of_sequence\"} 0",
            "ringside_rdma_port_errors_total{device=\"mlx5_0\",port=\"1\",counter=\"link_downed\"} 0",
            "ringside_rdma_port_read_problems_total{reason=\"not_numeric\"} 6",
            "ringside_rdma_port_polls_total 2",
            "ringside_rdma_ports_read 4",
            "# TYPE ringside_peer_bytes counter",
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "missing line {line:?} in\n{text}");
        }
        // TCP-only and RoCE-only counters are not emitted for the other kind.
        assert!(!text.contains("ringside_peer_tcp_retransmissions_total{interface=\"eth0\",direction=\"egress\",kind=\"rocev2\""));
        // A port without hw_counters/ has no CNP series (not a zero it never counted).
        assert!(!text.contains("ringside_rdma_port_cnps_total{device=\"qib0\""), "{text}");
    }

    #[test]
    fn every_metric_follows_naming_rules_and_has_help() {
        let text = render(&sample_state());
        let mut names = std::collections::HashSet::new();
        for m in ALL {
            assert!(m.name.starts_with("ringside_"), "{}", m.name);
            assert!(!m.name.ends_with("_total"), "{}: the encoder appends _total", m.name);
            assert!(m.help.len() > 10, "{}", m.name);
            assert!(names.insert(m.name), "duplicate {}", m.name);
            assert!(text.contains(&format!("# HELP {} ", m.name)), "{} not rendered", m.name);
        }
        // Every sample line parses as `name{labels} value` with a known name and a numeric value.
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            let (series, value) = l.rsplit_once(' ').unwrap();
            assert!(value.parse::<f64>().is_ok() || value == "+Inf", "{l}");
            let name = series.split('{').next().unwrap();
            assert!(ALL.iter().chain(PROCESS_ALL).any(|m| name.starts_with(m.name)), "unknown series {name}");
            // Never the raw 5-tuple. The RDMA port metrics' `port` is the NIC port number (as
            // node_exporter's infiniband collector labels it), not an L4 port.
            let rdma = name.starts_with("ringside_rdma_port_");
            for forbidden in ["port=", "src", "dst"] {
                assert!(!series.contains(forbidden) || (rdma && forbidden == "port="), "{l}");
            }
        }
    }
}

#[cfg(test)]
mod process_tests {
    use super::*;

    fn value(text: &str, name: &str) -> f64 {
        let line = text.lines().find(|l| l.split([' ', '{']).next() == Some(name)).unwrap_or_else(|| panic!("no {name} in\n{text}"));
        line.rsplit_once(' ').unwrap().1.parse().unwrap()
    }

    /// The standard process metrics of this (test) process, and the build's info series.
    #[test]
    fn renders_process_and_build_info() {
        let text = render(&tests::sample_state());
        for m in PROCESS_ALL {
            assert!(!m.name.ends_with("_total"), "{}: the encoder appends _total", m.name);
            assert!(text.contains(&format!("# HELP {} ", m.name)), "{} not rendered", m.name);
        }
        let info = text.lines().find(|l| l.starts_with("ringside_build_info{")).expect("ringside_build_info");
        assert!(info.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))) && info.ends_with(" 1"), "{info}");
        assert!(text.contains("# TYPE process_cpu_seconds counter"), "{text}");
        assert!(value(&text, "process_cpu_seconds_total") > 0.0);
        assert!(value(&text, "process_resident_memory_bytes") > 1e6);
        assert!(value(&text, "process_virtual_memory_bytes") >= value(&text, "process_resident_memory_bytes"));
        let start = value(&text, "process_start_time_seconds");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        assert!(start > now - 86_400.0 && start <= now + 1.0, "start {start}, now {now}");
        assert!(value(&text, "process_open_fds") >= 3.0);
    }
}

#[cfg(test)]
mod job_tests {
    use super::*;

    #[test]
    fn job_metrics_follow_the_naming_rules_and_render_without_a_plan() {
        for m in JOB_ALL {
            assert!(m.name.starts_with("ringside_job_") && !m.name.ends_with("_total") && m.help.len() > 10, "{}", m.name);
            assert!(!ALL.iter().any(|a| a.name == m.name), "{} is also agent-wide", m.name);
        }
        // A job on the board with no plan and no insight yet: descriptors only, no series.
        let text = encode_families(job_families("j-1", None, None, None));
        assert!(text.contains("# HELP ringside_job_plan_info "), "{text}");
        assert!(text.lines().all(|l| l.starts_with('#')), "{text}");
    }
}

#[cfg(test)]
mod docs_tests {
    /// docs/metrics.md is the operators' reference: every metric must be documented there.
    #[test]
    fn every_metric_is_documented() {
        let doc = include_str!("../../docs/metrics.md");
        let missing: Vec<&str> = super::ALL
            .iter()
            .chain(super::JOB_ALL)
            .chain(super::PROCESS_ALL)
            .map(|m| m.name)
            .filter(|name| {
                let counter = format!("`{name}_total`");
                !doc.contains(&format!("`{name}`")) && !doc.contains(&counter)
            })
            .collect();
        assert!(missing.is_empty(), "metrics missing from docs/metrics.md: {missing:?}");
    }
}

#[cfg(test)]
mod deploy_tests {
    /// The operators' rules and dashboard (deploy/) name only metrics this file defines (with the
    /// encoder's `_total` and the histogram suffixes) or series their own recording rules define.
    #[test]
    fn deploy_files_name_only_existing_metrics() {
        let recording = include_str!("../../deploy/prometheus/ringside-recording.rules.yml");
        let alerts = include_str!("../../deploy/prometheus/ringside-alerts.rules.yml");
        let dashboard = include_str!("../../deploy/grafana/ringside.json");
        let mut recorded: Vec<&str> =
            recording.lines().filter_map(|l| l.trim().strip_prefix("- record:")).map(str::trim).collect();
        assert!(recorded.len() >= 20, "{recorded:?}");
        // Longest first, so no recorded name is left half-removed by a shorter one.
        recorded.sort_by_key(|r| std::cmp::Reverse(r.len()));
        let known = |name: &str| {
            super::ALL.iter().chain(super::JOB_ALL).chain(super::PROCESS_ALL).any(|m| {
                ["", "_total", "_bucket", "_sum", "_count"].iter().any(|suffix| name == format!("{}{suffix}", m.name))
            })
        };
        for (file, text) in [("ringside-recording.rules.yml", recording), ("ringside-alerts.rules.yml", alerts), ("ringside.json", dashboard)] {
            let mut body: String = text
                .lines()
                .filter(|l| !l.trim_start().starts_with('#') && !l.trim_start().starts_with("- record:"))
                .collect::<Vec<_>>()
                .join("\n");
            for r in &recorded {
                body = body.replace(r, " ");
            }
            let mut unknown = Vec::new();
            let mut found = 0;
            for prefix in ["ringside_", "process_"] {
                for (at, _) in body.match_indices(prefix) {
                    if body[..at].chars().next_back().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                        continue;
                    }
                    let name: String = body[at..].chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_').collect();
                    found += 1;
                    if !known(&name) {
                        unknown.push(name);
                    }
                }
            }
            assert!(found > 5, "{file}: only {found} metric names found");
            assert!(unknown.is_empty(), "{file} names metrics that do not exist: {unknown:?}");
        }
    }

    /// The dashboard imports into Grafana 10/11 without questions: a schema version of that line,
    /// a Prometheus data-source variable that every panel and query uses, and the agent selector.
    #[test]
    fn dashboard_uses_its_datasource_and_instance_variables() {
        let dash: serde_json::Value = serde_json::from_str(include_str!("../../deploy/grafana/ringside.json")).unwrap();
        let schema = dash["schemaVersion"].as_u64().unwrap();
        assert!((36..=41).contains(&schema), "schemaVersion {schema} is not Grafana 10/11's");
        let vars = dash["templating"]["list"].as_array().unwrap();
        let var = |name: &str| vars.iter().find(|v| v["name"] == name).unwrap_or_else(|| panic!("no ${name} variable"));
        assert_eq!(var("datasource")["type"], "datasource");
        assert_eq!(var("datasource")["query"], "prometheus");
        assert_eq!(var("instance")["type"], "query");
        let ds = serde_json::json!({"type": "prometheus", "uid": "${datasource}"});
        let panels: Vec<_> = dash["panels"].as_array().unwrap().iter().filter(|p| p["type"] != "row").collect();
        assert!(panels.len() >= 20, "{} panels", panels.len());
        let mut ids = std::collections::HashSet::new();
        for p in &dash["panels"].as_array().unwrap()[..] {
            assert!(ids.insert(p["id"].as_u64().unwrap()), "duplicate panel id in {}", p["title"]);
        }
        for p in panels {
            assert_eq!(p["datasource"], ds, "panel {}", p["title"]);
            let targets = p["targets"].as_array().unwrap();
            assert!(!targets.is_empty(), "panel {} has no query", p["title"]);
            for t in targets {
                assert_eq!(t["datasource"], ds, "panel {}", p["title"]);
                let expr = t["expr"].as_str().unwrap();
                // Every agent-scoped query follows the agent selector.
                if !expr.contains("ringside_job") && !expr.starts_with("kind") {
                    assert!(expr.contains("instance=~\"$instance\""), "panel {}: {expr} ignores $instance", p["title"]);
                }
            }
        }
    }
}
