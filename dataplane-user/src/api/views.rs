//! How each response of the API is built from the stages' snapshots. The response types themselves
//! are `ringside_client::operator`'s (one definition, which the CLI decodes).
use crate::{
    analysis::EventsSnapshot,
    events::Event,
    flow_table::{direction_name, format_addr, kind_name, BurstRecord, FlowEntry, Rates},
    view::{AgentView, AttachInfo},
};
use dataplane_common::{flow_kind, stats};
use ringside_client::operator::{
    BurstView, BurstsView, EventsResponse, FlowView, InterfaceView, RatesView, RoceView, StatusResponse, TcpView,
};

/// Names of the `STATS` entries, in index order.
pub const STATS_NAMES: [(&str, u32); 10] = [
    ("seen", stats::SEEN),
    ("parsed", stats::PARSED),
    ("matched", stats::MATCHED),
    ("malformed", stats::MALFORMED),
    ("unsupported", stats::UNSUPPORTED),
    ("map_full", stats::MAP_FULL),
    ("ringbuf_full", stats::RINGBUF_FULL),
    ("events", stats::EVENTS),
    ("unreadable", stats::UNREADABLE),
    ("contended", stats::CONTENDED),
];

const _: () = assert!(STATS_NAMES.len() == stats::COUNT as usize, "name every STATS entry");

/// One flow of `/v1/flows`, as of the poll at `now_ns`.
pub fn flow_view(e: &FlowEntry, attach: &AttachInfo, now_ns: u64) -> FlowView {
    let c = &e.totals.counters;
    let k = &e.key;
    let Rates { bytes_per_second, packets_per_second, ewma_bytes_per_second, ewma_packets_per_second, .. } = e.rates;
    let b = &e.bursts;
    let mean = |total: u64| if b.count == 0 { 0.0 } else { total as f64 / b.count as f64 };
    FlowView {
        interface: attach.ifname(k.ifindex),
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
            dsacks: c.tcp_dsacks,
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

/// Builds the `/v1/events` body; `all` adds the retained closed events.
pub fn events_of(s: &EventsSnapshot, all: bool, limit: usize) -> EventsResponse {
    let log = &s.log;
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
pub fn status_of(view: &AgentView) -> StatusResponse {
    let ready = view.readiness();
    let t = view.collector();
    let s = &*view.attach;
    let ds = &t.dataplane;
    StatusResponse {
        ready: ready.is_ok(),
        not_ready_reason: ready.err(),
        interfaces: s
            .interfaces
            .iter()
            .map(|i| InterfaceView { name: i.name.clone(), ifindex: i.ifindex, mode: i.mode.clone(), qdisc_added: i.qdisc_added })
            .collect(),
        pin_dir: s.pin_dir.as_ref().map(|p| p.display().to_string()),
        poll_interval_seconds: s.poll_interval.as_secs_f64(),
        polls: t.poll.polls,
        poll_errors: t.poll.errors,
        last_poll_age_seconds: t.poll.age().map(|d| d.as_secs_f64()),
        flows_tracked: t.flows_tracked,
        dataplane: STATS_NAMES.iter().map(|(n, i)| ((*n).to_owned(), ds.get(*i as usize).copied().unwrap_or(0))).collect(),
    }
}

