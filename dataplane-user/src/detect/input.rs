//! What the collector feeds the detectors: one [`JobWindow`] per job per detection window.
//!
//! The collector reads the flow counters every poll (100 ms), groups flows into jobs and peers
//! (remote hosts), and every detection window (default 1 s) emits, per job, one [`PeerWindow`] per
//! peer that exchanged traffic with this host in the window. All counters are *deltas over the
//! window*, summed over both directions and over all of the job's flows with that peer.
//!
//! Invariants the detectors rely on (checked by [`crate::detect::DetectorSet::observe`]):
//! - `window_start_ns < window_end_ns`, one clock for everything (`bpf_ktime_get_ns`, i.e.
//!   CLOCK_MONOTONIC), windows of one job arrive in time order and do not overlap;
//! - a peer appears at most once per window.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// One burst (communication phase) exchanged with a peer.
///
/// Fill from the `BURST_END` events of the peer's flows whose burst *ended* in this window
/// (`start_ns`, `last_ns` as `end_ns`, `bytes`). The kernel ends a burst after a 1 ms idle gap, so
/// one step's communication phase usually arrives as many bursts, across several flows; pass them
/// all unmerged: the detectors merge a peer's bursts separated by less than
/// [`crate::detect::DetectorConfig::phase_merge_gap_ns`] (overlapping ones included) into phases.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BurstSummary {
    /// Time of the burst's first packet.
    pub start_ns: u64,
    /// Time of the burst's last packet.
    pub end_ns: u64,
    /// L3 bytes carried by the burst.
    pub bytes: u64,
    /// Whom the burst was sent to (the flow's destination), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<IpAddr>,
}

/// One peer's traffic in one window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerWindow {
    /// The remote host.
    pub peer: IpAddr,
    /// The local link (interface name, or a path id such as `eth0/leaf2` when the collector knows
    /// the topology) this peer's traffic crosses. Peers sharing a link id are assumed to share a
    /// bottleneck: congestion is attributed to the link when several of them degrade together.
    pub link: String,
    /// L3 bytes exchanged in the window (both directions). A peer below
    /// [`crate::detect::DetectorConfig::min_window_bytes`] is treated as idle.
    pub bytes: u64,
    /// Packets carrying payload (TCP segments with data, RoCEv2 data packets), both directions:
    /// the denominator of the loss and CE rates.
    pub data_packets: u64,
    /// Retransmitted data packets: `FlowStats::tcp_retrans` (segments below the highest sequence
    /// seen) plus `roce_psn_out_of_order`. Includes reordering on veth: the detectors expect a
    /// few per window on healthy links.
    pub retrans: u64,
    /// Packets with ECN CE (`FlowStats::ce_marks`).
    pub ce_marks: u64,
    /// RoCEv2 Congestion Notification Packets (`roce_cnps`).
    pub cnps: u64,
    /// RoCEv2 packets presumed lost from PSN jumps (`roce_psn_gap_packets`).
    pub psn_gap_packets: u64,
    /// RoCEv2 NAKs (`roce_naks`).
    pub naks: u64,
    /// Bursts that ended in this window, in any order.
    pub bursts: Vec<BurstSummary>,
    /// Set when the agent sees both ends of this peer's degraded connections and another peer's
    /// path explains all of them ([`crate::attribution`]): the peer is then not judged a gray
    /// failure in this window (the other one is). The detectors compute it from
    /// [`JobWindow::conns`] when the window has them; otherwise this value is used as given.
    #[serde(default)]
    pub explained_by: Option<IpAddr>,
    /// Links whose egress carries this peer's job traffic together with other traffic (another
    /// job's, or none's): if the detectors find one of them congested in the window, the peer's
    /// degradation is that link's, not a gray failure of the peer.
    #[serde(default)]
    pub shared_links: Vec<String>,
    /// The peer's small sends of the window that carried payload (bursts of its flows without
    /// data-sized packets but with more bytes than headers: a protocol's control messages such
    /// as a rendezvous go-ahead; not runs of pure ACKs, which its kernel sends whatever the
    /// application does), with their destination: whether it told another peer to go ahead just
    /// before that peer sent to it.
    #[serde(default)]
    pub pokes: Vec<BurstSummary>,
}

/// One direction of a link the job's data crosses, counted over *all* flows on it, the job's and
/// other traffic's: a congested shared link drops or slows everyone's packets, a bad host path
/// only the flows to and from that host.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkWindow {
    /// Link id, as in [`PeerWindow::link`].
    pub link: String,
    /// `ingress` or `egress` (as the agent's interface sees it).
    pub direction: String,
    /// Directed connections carrying data in this direction in the window.
    pub flows: u32,
    /// Of those, the lossy ones (see [`crate::attribution`]), and how many belong to the job.
    pub lossy_flows: u32,
    pub lossy_job_flows: u32,
    /// A host that is an endpoint of every lossy flow, if one is (the loss is then that host's
    /// path, not the link).
    pub common_endpoint: Option<IpAddr>,
    /// Loss packets and data packets of the lossy flows.
    pub loss_packets: u64,
    pub data_packets: u64,
    /// L3 bytes of the job's flows and of all other flows in this direction in the window.
    pub job_bytes: u64,
    pub other_bytes: u64,
    /// Bytes and time inside the job's data bursts here (bursts of at least 64 KiB): its
    /// in-burst goodput on this link direction.
    pub job_burst_bytes: u64,
    pub job_burst_ns: u64,
    /// Egress only: what the interface's own queue (root qdisc) sent and dropped in the window,
    /// all traffic (`crate::queue_stats`); `None` when it was not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<crate::queue_stats::QueueDelta>,
}

impl LinkWindow {
    /// Several unrelated flows losing on this link's egress while the job's data crosses it.
    ///
    /// Egress only: the agent's TC hook sees an egress packet before the interface's queue, so
    /// loss there is this link's queue or what lies behind it; loss seen on ingress happened
    /// upstream, before the packet reached this link, and the agent there reports it.
    pub fn shared_loss(&self, min_flows: u32) -> bool {
        self.direction == "egress" && self.lossy_flows >= min_flows.max(2) && self.common_endpoint.is_none()
    }

    /// Several unrelated flows, not all of them the job's, losing on their way *in* through this
    /// link: the loss happened upstream, on a path the job shares with other traffic (a
    /// congested uplink of another switch, which the agent there reports). A peer whose traffic
    /// arrives through this link is then not a gray failure of its own in the window.
    pub fn upstream_shared_loss(&self, min_flows: u32) -> bool {
        self.direction == "ingress"
            && self.lossy_flows >= min_flows.max(2)
            && self.lossy_flows > self.lossy_job_flows
            && self.common_endpoint.is_none()
    }

    /// Other traffic coming *in* through this link beside the job's data, at least `min_other`
    /// of the job's bytes here. The job's peers behind the link then share their path in with
    /// it: if they slow down together, the queue may be this link's far end or any link before
    /// it (another switch's uplink, whose agent sees it on its egress as competition), and this
    /// vantage cannot tell which ([`super::DetectorSet`] names nobody for it).
    pub fn upstream_competition(&self, min_other: f64) -> bool {
        self.direction == "ingress" && self.job_bytes > 0 && self.other_bytes as f64 >= min_other * self.job_bytes as f64
    }

    /// The job's in-burst goodput here, bytes/s.
    pub fn job_goodput_bps(&self) -> Option<f64> {
        (self.job_burst_ns > 0).then(|| self.job_burst_bytes as f64 * 1e9 / self.job_burst_ns as f64)
    }
}

impl PeerWindow {
    /// Packets that are evidence of loss: retransmissions, PSN gaps and NAKs. The three come from
    /// different vantage points (sender, receiver, receiver's reply), so one loss can count up to
    /// three times on RoCE; thresholds are relative to the job's other peers, which count the
    /// same way.
    pub fn loss_packets(&self) -> u64 {
        self.retrans
            .saturating_add(self.psn_gap_packets)
            .saturating_add(self.naks)
    }
}

/// All peers of one job in one window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobWindow {
    /// Job id (as registered through `POST /v1/jobs`).
    pub job: String,
    pub window_start_ns: u64,
    pub window_end_ns: u64,
    /// Peers with traffic in the window; a peer absent for
    /// [`crate::detect::DetectorConfig::forget_after_ns`] is forgotten.
    pub peers: Vec<PeerWindow>,
    /// Link directions the job's data crosses in the window.
    #[serde(default)]
    pub links: Vec<LinkWindow>,
    /// The job's directed connections in the window, when the agent sees both ends of them (on
    /// a switch, or a DPU serving several hosts): the detectors attribute degraded connections
    /// to one end ([`crate::attribution`]) and set each peer's `explained_by` from it, with the
    /// job's recent blame as memory. Empty: the peers' `explained_by` are used as given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conns: Vec<crate::attribution::DirectedConn>,
    /// What this vantage's own host sent, when the agent sits at one host's end of the wire (its
    /// NIC, or its IPU's fabric port): every data burst of the job leaving by an egress hook came
    /// from one address. `None` on a switch, whose egress ports carry every host's data. The
    /// straggler detector judges that host from it ([`crate::detect::DetectorSet::observe`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local: Option<LocalSends>,
}

/// The data bursts one host sent in a window, seen at its own end of the wire.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LocalSends {
    /// The host's address (the source of every one of its flows' egress data).
    pub addr: IpAddr,
    /// The link (interface) they left by.
    pub link: String,
    /// Its data bursts that ended in the window (`to`: the receiving peer), in any order.
    pub bursts: Vec<BurstSummary>,
    /// Its small sends that carried payload (a protocol's go-ahead), as [`PeerWindow::pokes`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pokes: Vec<BurstSummary>,
}

/// A peer's communication phases in one window: its bursts merged across flows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Phase {
    pub start_ns: u64,
    pub end_ns: u64,
    pub bytes: u64,
}

/// Merges bursts whose gap is below `merge_gap_ns` (overlaps included) into phases sorted by
/// start. Bursts with `end_ns < start_ns` are clamped to zero length. Keeps at most `max_phases`
/// (the earliest), so a pathological input cannot grow memory.
pub(crate) fn merge_phases(bursts: &[BurstSummary], merge_gap_ns: u64, max_phases: usize) -> Vec<Phase> {
    let mut sorted: Vec<BurstSummary> = bursts.to_vec();
    sorted.sort_by_key(|b| (b.start_ns, b.end_ns));
    let mut phases: Vec<Phase> = Vec::new();
    for b in sorted {
        let end = b.end_ns.max(b.start_ns);
        match phases.last_mut() {
            Some(p) if b.start_ns <= p.end_ns.saturating_add(merge_gap_ns) => {
                p.end_ns = p.end_ns.max(end);
                p.bytes = p.bytes.saturating_add(b.bytes);
            }
            _ => {
                if phases.len() == max_phases {
                    break;
                }
                phases.push(Phase { start_ns: b.start_ns, end_ns: end, bytes: b.bytes });
            }
        }
    }
    phases
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(start_ns: u64, end_ns: u64, bytes: u64) -> BurstSummary {
        BurstSummary { start_ns, end_ns, bytes, to: None }
    }

    #[test]
    fn merges_close_and_overlapping_bursts_only() {
        let phases = merge_phases(
            &[b(100, 200, 1), b(0, 50, 2), b(55, 120, 3), b(300, 310, 4)],
            10,
            16,
        );
        assert_eq!(
            phases,
            vec![
                Phase { start_ns: 0, end_ns: 200, bytes: 6 },
                Phase { start_ns: 300, end_ns: 310, bytes: 4 },
            ]
        );
    }

    #[test]
    fn caps_phase_count() {
        let bursts: Vec<_> = (0..10).map(|i| b(i * 100, i * 100 + 1, 1)).collect();
        assert_eq!(merge_phases(&bursts, 0, 3).len(), 3);
    }

    #[test]
    fn loss_packets_sums_all_evidence() {
        let w = PeerWindow {
            peer: "10.0.0.1".parse().unwrap(),
            link: "eth0".into(),
            bytes: 0,
            data_packets: 0,
            retrans: 1,
            ce_marks: 0,
            cnps: 0,
            psn_gap_packets: 2,
            naks: 3,
            bursts: vec![],
            explained_by: None,
            shared_links: Vec::new(),
            pokes: Vec::new(),
        };
        assert_eq!(w.loss_packets(), 6);
    }
}
