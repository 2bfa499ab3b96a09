//! Jobs and detection windows: which flows belong to which job, and how one window of the flow
//! table (per-flow counter deltas and `BURST_END` events, see
//! [`WindowAccumulator`](crate::flow_table::WindowAccumulator)) becomes one
//! [`JobWindow`] per job for the detectors.
//!
//! Pure functions over the accumulator; the agent's analysis stage calls them.
//!
//! Rules (documented for operators in `ringside.example.toml`):
//! - a flow's *peer* is its remote end (source of an ingress packet, destination of an egress
//!   one); on a switch's bridge ports that is the host cabled to the port;
//! - a flow belongs to the first `[[job]]` (in file order) whose `members` contain its peer and
//!   whose ports match (no `tcp_ports`/`udp_ports`: any port; otherwise TCP flows need a port in
//!   `tcp_ports`, UDP and RoCEv2 flows one in `udp_ports`, on either end);
//! - without `[[job]]`, every flow belongs to the job `default`;
//! - a [`PeerWindow`] sums, over both directions and all of the job's flows with that peer, the
//!   counter growth of the window; its `link` is the interface carrying most of those bytes;
//! - bursts are the `BURST_END` events drained in the window (the kernel reports a burst when the
//!   flow's next packet arrives, so a burst can land in the window after the one it ended in), and
//!   a peer's bursts are only the *data the peer sent*: ingress flows (whose source is the peer, on
//!   a host NIC and on a switch port alike) with an average packet of at least
//!   [`MIN_DATA_BURST_PACKET_BYTES`]. A rank that computes late still ACKs (its kernel does) and
//!   still receives its neighbour's data on time (socket buffers absorb it); only its own sends
//!   start late, so counting the other bursts would hide a compute straggler;
//! - loss evidence leaves out retransmissions the receiver reported as duplicates: a TCP flow's
//!   `tcp_retrans` growth minus the D-SACKs of its reverse flow at the same vantage (same
//!   interface, other direction) in the window, at least 0. A tail loss probe that fired before a
//!   late ACK (a busy receiver) resends data that was not lost;
//! - the job's directed connections (loss per connection, goodput over its sender's merged data
//!   bursts) go with the window, for the detectors' [`crate::attribution`]; the job's
//!   [`LinkWindow`]s and each peer's `shared_links` from the traffic of *every* matched flow per
//!   interface direction (the job's and others'), so the detectors can tell a shared congested link
//!   from a bad host path.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv6Addr},
};

use dataplane_common::{direction, flow_kind, FlowKey};

use crate::{
    attribution::{self, DirectedConn},
    config::{JobFile, PortSpec, PrefixSpec},
    detect::{merge_phases, BurstSummary, DetectorConfig, JobWindow, LinkWindow, LocalSends, PeerWindow},
    flow_table::{peer_of, BurstRecord, Counters, FastMap, WindowAccumulator, OTHER_PEER},
};

/// Name of the job that holds every flow when no `[[job]]` is configured.
pub const DEFAULT_JOB: &str = "default";

/// One job's membership rule and what the policy needs to know about it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobSpec {
    /// The job id: `[[job]]` name in the config file, or the id `POST /v1/jobs` returned. It is
    /// the `job` of every [`JobWindow`], event and hint.
    pub name: String,
    pub members: Vec<PrefixSpec>,
    pub tcp_ports: Option<Vec<PortSpec>>,
    pub udp_ports: Option<Vec<PortSpec>>,
    /// Bytes reduced per step, if the registration said (the cost model estimates it otherwise).
    pub gradient_bytes: Option<u64>,
    /// What the tenant lets the policy change (config-file jobs: the defaults).
    pub constraints: ringside_client::Constraints,
}

impl JobSpec {
    fn matches(&self, key: &FlowKey) -> bool {
        let peer = peer_ip(key);
        if !self.members.iter().any(|m| m.contains(peer)) {
            return false;
        }
        if self.tcp_ports.is_none() && self.udp_ports.is_none() {
            return true;
        }
        let ranges = match key.kind {
            flow_kind::TCP => self.tcp_ports.as_deref(),
            flow_kind::UDP | flow_kind::ROCEV2 => self.udp_ports.as_deref(),
            _ => None,
        };
        ranges.is_some_and(|r| {
            r.iter().any(|p| (p.lo..=p.hi).contains(&key.src_port) || (p.lo..=p.hi).contains(&key.dst_port))
        })
    }
}

/// The configured jobs.
#[derive(Debug, Clone, PartialEq)]
pub struct JobSet {
    /// Empty: one implicit job, [`DEFAULT_JOB`], with every flow.
    jobs: Vec<JobSpec>,
}

impl JobSet {
    pub fn from_config(jobs: Option<&[JobFile]>) -> Self {
        let jobs = jobs
            .unwrap_or_default()
            .iter()
            .map(|j| JobSpec {
                name: j.name.clone(),
                members: j.members.iter().map(|m| m.0).collect(),
                tcp_ports: j.tcp_ports.clone(),
                udp_ports: j.udp_ports.clone(),
                gradient_bytes: None,
                constraints: Default::default(),
            })
            .collect();
        JobSet { jobs }
    }

    /// A job set from explicit specs (config-file jobs followed by registered ones: the first
    /// match wins, so a flow belongs to at most one job).
    pub fn from_specs(jobs: Vec<JobSpec>) -> Self {
        JobSet { jobs }
    }

    /// The specs, in match order (empty: the implicit [`DEFAULT_JOB`]).
    pub fn specs(&self) -> &[JobSpec] {
        &self.jobs
    }

    /// The spec of job `name`, if configured or registered.
    pub fn spec(&self, name: &str) -> Option<&JobSpec> {
        self.jobs.iter().find(|j| j.name == name)
    }

    /// The job a flow belongs to, if any.
    pub fn job_of(&self, key: &FlowKey) -> Option<&str> {
        if self.jobs.is_empty() {
            return (peer_of(key) != OTHER_PEER).then_some(DEFAULT_JOB);
        }
        self.jobs.iter().find(|j| j.matches(key)).map(|j| j.name.as_str())
    }

    /// Job names (for the API), in configuration order.
    pub fn names(&self) -> Vec<String> {
        if self.jobs.is_empty() {
            vec![DEFAULT_JOB.to_owned()]
        } else {
            self.jobs.iter().map(|j| j.name.clone()).collect()
        }
    }

    /// Builds one [`JobWindow`] per job with traffic in the window, ordered by job name; peers
    /// ordered by address. `ifname` names an interface index (the `link` of a peer).
    pub fn windows(&self, w: &WindowAccumulator, ifname: impl Fn(u32) -> String) -> Vec<JobWindow> {
        let Some(start) = w.start_ns else { return Vec::new() };
        #[derive(Default)]
        struct Acc {
            c: Counters,
            bytes_by_if: BTreeMap<u32, u64>,
            bursts: Vec<BurstSummary>,
            pokes: Vec<BurstSummary>,
        }
        let mut jobs: BTreeMap<&str, BTreeMap<IpAddr, Acc>> = BTreeMap::new();
        // Per job, its directed connections (for `attribution`), and their senders' data bursts.
        // Hashed, not ordered: a window can hold tens of thousands of connections, and a B-tree
        // lookup per flow delta and per burst was a third of the agent's CPU at 10k flows; the
        // job's list is sorted once at the end, so its order is the same as before.
        let mut conns: BTreeMap<&str, FastMap<ConnId, DirectedConn>> = BTreeMap::new();
        let mut conn_bursts: BTreeMap<&str, FastMap<ConnId, Vec<BurstSummary>>> = BTreeMap::new();
        // Per job, the bursts leaving by an egress hook: this vantage's own host's sends when
        // they all come from one address.
        let mut egress: BTreeMap<&str, Vec<EgressBurst>> = BTreeMap::new();
        // Every matched flow, the job's or not, per interface direction (for `LinkWindow`s).
        let mut traffic = LinkTraffic::default();
        let spurious = SpuriousResends::of(&w.deltas);
        for (key, delta) in &w.deltas {
            let net;
            let delta = if delta.tcp_retrans > 0 && !spurious.is_empty() {
                net = spurious.net(key, delta);
                &net
            } else {
                delta
            };
            let job = self.job_of(key);
            traffic.add_delta(key, delta, job);
            let Some(job) = job else { continue };
            let acc = jobs.entry(job).or_default().entry(peer_ip(key)).or_default();
            acc.c.add(delta);
            *acc.bytes_by_if.entry(key.ifindex).or_default() += delta.bytes;
            let c = conns.entry(job).or_default().entry(ConnId::of(key)).or_insert_with(|| DirectedConn::of(key));
            c.loss_packets += loss_packets(delta);
            c.data_packets += data_packets(delta);
        }
        for (key, b) in &w.bursts {
            let Some(job) = self.job_of(key) else { continue };
            traffic.add_burst(key, b, job);
            let acc = jobs.entry(job).or_default().entry(peer_ip(key)).or_default();
            acc.bytes_by_if.entry(key.ifindex).or_default();
            if key.direction == direction::EGRESS {
                let e = egress.entry(job).or_default();
                if e.len() < MAX_LOCAL_BURSTS {
                    let from = addr_ip(key.src_addr);
                    e.push(EgressBurst { from, ifindex: key.ifindex, data: is_data(b), payload: carried_payload(from, b), burst: summary(key, b) });
                }
            }
            if !sent_by_peer_with_data(key, b) {
                if key.direction == direction::INGRESS && carried_payload(addr_ip(key.src_addr), b) && acc.pokes.len() < MAX_POKES_PER_PEER {
                    acc.pokes.push(summary(key, b));
                }
                continue;
            }
            acc.bursts.push(summary(key, b));
            conn_bursts.entry(job).or_default().entry(ConnId::of(key)).or_default().push(summary(key, b));
        }
        for (job, per_conn) in conn_bursts {
            for (id, bursts) in per_conn {
                let (bytes, ns) = phase_goodput(&bursts);
                let c = conns.entry(job).or_default().entry(id).or_insert_with(|| DirectedConn::of_id(&id));
                (c.burst_bytes, c.burst_ns) = (bytes, ns);
            }
        }
        jobs.into_iter()
            .map(|(job, peers)| {
                let mut job_conns: Vec<(ConnId, DirectedConn)> = conns.remove(job).unwrap_or_default().into_iter().collect();
                job_conns.sort_unstable_by_key(|(id, _)| *id);
                let job_conns: Vec<DirectedConn> = job_conns.into_iter().map(|(_, c)| c).collect();
                let (links, shared_links) = traffic.for_job(job, &ifname);
                let local = local_sends(egress.remove(job).unwrap_or_default(), &ifname);
                (job, peers, job_conns, links, shared_links, local)
            })
            .map(|(job, peers, job_conns, links, shared_links, local)| JobWindow {
                job: job.to_owned(),
                window_start_ns: start,
                window_end_ns: w.end_ns,
                peers: peers
                    .into_iter()
                    .map(|(peer, a)| {
                        // The interface with most bytes; ties to the lowest index (stable).
                        let ifindex = a
                            .bytes_by_if
                            .iter()
                            .max_by(|x, y| x.1.cmp(y.1).then(y.0.cmp(x.0)))
                            .map(|(i, _)| *i)
                            .unwrap_or(0);
                        let mut pw = peer_window(peer, ifname(ifindex), &a.c, a.bursts);
                        pw.shared_links = shared_links.get(&peer).cloned().unwrap_or_default();
                        pw.pokes = a.pokes;
                        pw
                    })
                    .collect(),
                links,
                conns: job_conns,
                local,
            })
            .collect()
    }
}

/// The D-SACKs of the window's flows, by the flow whose retransmissions they report spurious:
/// the reverse flow at the same vantage (same interface, the other direction: a host's data
/// enters its switch port and its ACKs leave by it; a host NIC sends data and receives ACKs).
struct SpuriousResends(FastMap<FlowKey, u64>);

impl SpuriousResends {
    fn of(deltas: &[(FlowKey, Counters)]) -> Self {
        let mut m = FastMap::default();
        for (k, c) in deltas.iter().filter(|(k, c)| c.tcp_dsacks > 0 && k.kind == flow_kind::TCP) {
            *m.entry(reverse_flow(k)).or_default() += c.tcp_dsacks;
        }
        SpuriousResends(m)
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `delta` with the retransmissions its receiver reported as duplicates taken out: loss
    /// evidence is what was lost, not a tail loss probe that fired before a late ACK. A D-SACK
    /// that lands in the window after its retransmission is taken out of nothing (clamped).
    fn net(&self, key: &FlowKey, delta: &Counters) -> Counters {
        let dup = self.0.get(key).copied().unwrap_or(0);
        Counters { tcp_retrans: delta.tcp_retrans.saturating_sub(dup), ..*delta }
    }
}

/// The flow in the other direction at the same vantage: ends and ports swapped, same interface,
/// the other hook direction.
fn reverse_flow(k: &FlowKey) -> FlowKey {
    FlowKey {
        src_addr: k.dst_addr,
        dst_addr: k.src_addr,
        src_port: k.dst_port,
        dst_port: k.src_port,
        direction: if k.direction == direction::INGRESS { direction::EGRESS } else { direction::INGRESS },
        ..*k
    }
}

/// A burst leaving by an egress hook.
struct EgressBurst {
    from: IpAddr,
    ifindex: u32,
    /// [`is_data`].
    data: bool,
    /// [`carried_payload`].
    payload: bool,
    burst: BurstSummary,
}

/// This vantage's own host's bursts, if every egress burst of the job came from one address (a
/// host NIC, an IPU's fabric port); `None` when none carried data or several hosts sent (a
/// switch's ports carry every host's traffic out). The link is the interface most of its data
/// left by.
fn local_sends(egress: Vec<EgressBurst>, ifname: &impl Fn(u32) -> String) -> Option<LocalSends> {
    let addr = egress.first()?.from;
    if egress.iter().any(|e| e.from != addr) || !egress.iter().any(|e| e.data) {
        return None;
    }
    let mut by_if: BTreeMap<u32, u64> = BTreeMap::new();
    for e in egress.iter().filter(|e| e.data) {
        *by_if.entry(e.ifindex).or_default() += e.burst.bytes;
    }
    let ifindex = by_if.iter().max_by(|x, y| x.1.cmp(y.1).then(y.0.cmp(x.0))).map(|(i, _)| *i).unwrap_or(0);
    let (data, small): (Vec<EgressBurst>, Vec<EgressBurst>) = egress.into_iter().partition(|e| e.data);
    Some(LocalSends {
        addr,
        link: ifname(ifindex),
        bursts: data.into_iter().map(|e| e.burst).collect(),
        pokes: small.into_iter().filter(|e| e.payload).map(|e| e.burst).collect(),
    })
}

/// A directed connection: a flow's 5-tuple without interface or direction. The addresses are the
/// key's 16 bytes read big-endian, so the order is the bytes' order and hashing or comparing one
/// is a few integer operations (a window can hold tens of thousands).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct ConnId {
    kind: u8,
    src: u128,
    src_port: u16,
    dst: u128,
    dst_port: u16,
}

impl ConnId {
    fn of(k: &FlowKey) -> Self {
        ConnId {
            kind: k.kind,
            src: u128::from_be_bytes(k.src_addr),
            src_port: k.src_port,
            dst: u128::from_be_bytes(k.dst_addr),
            dst_port: k.dst_port,
        }
    }
    fn src_ip(&self) -> IpAddr {
        addr_ip(self.src.to_be_bytes())
    }
    fn dst_ip(&self) -> IpAddr {
        addr_ip(self.dst.to_be_bytes())
    }
}

impl DirectedConn {
    fn of(k: &FlowKey) -> Self {
        Self::of_id(&ConnId::of(k))
    }
    fn of_id(c: &ConnId) -> Self {
        DirectedConn { src: Some(c.src_ip()), dst: Some(c.dst_ip()), ..Default::default() }
    }
}

/// A burst of `key`'s flow; `to` is the flow's destination (for a burst the peer sent: whom it
/// sent to).
fn summary(key: &FlowKey, b: &BurstRecord) -> BurstSummary {
    BurstSummary { start_ns: b.start_ns, end_ns: b.start_ns.saturating_add(b.duration_ns), bytes: b.bytes, to: Some(addr_ip(key.dst_addr)) }
}

/// Bytes and time inside the communication phases of `bursts`, merged and filtered as the
/// detectors do with their default `phase_merge_gap_ns` and `min_phase_bytes`: a shaped sender
/// (tbf) sends line-rate bursts a few ms apart, which only merged phases show as slow.
fn phase_goodput(bursts: &[BurstSummary]) -> (u64, u64) {
    let d = DetectorConfig::default();
    merge_phases(bursts, d.phase_merge_gap_ns, d.max_phases_per_window)
        .iter()
        .filter(|p| p.bytes >= d.min_phase_bytes)
        .fold((0, 0), |(b, t), p| (b + p.bytes, t + (p.end_ns - p.start_ns)))
}

/// Traffic per direction of every interface, over all flows (any job or none), for
/// [`LinkWindow`]s: which directed connections carry data there, which of them lose, how many
/// bytes each job and everyone else sent, and the in-burst goodput of each job's data there.
#[derive(Default)]
struct LinkTraffic<'a> {
    dirs: BTreeMap<(u32, u8), DirTraffic<'a>>,
}

/// One connection's loss packets, data packets and job, on one interface direction.
type DirFlow<'a> = (u64, u64, Option<&'a str>);

#[derive(Default)]
struct DirTraffic<'a> {
    /// Hashed: one entry per connection with data (tens of thousands at most), order-free uses.
    conns: FastMap<ConnId, DirFlow<'a>>,
    /// Bytes by job (`None`: traffic of no job).
    bytes: BTreeMap<Option<&'a str>, u64>,
    /// Per job: its data bursts.
    bursts: BTreeMap<&'a str, Vec<BurstSummary>>,
}

impl<'a> LinkTraffic<'a> {
    /// One flow's counter growth (`job`: the job it belongs to, if any).
    fn add_delta(&mut self, key: &FlowKey, delta: &Counters, job: Option<&'a str>) {
        let d = self.dirs.entry((key.ifindex, key.direction)).or_default();
        *d.bytes.entry(job).or_default() += delta.bytes;
        let data = data_packets(delta);
        if data > 0 {
            let e = d.conns.entry(ConnId::of(key)).or_insert((0, 0, job));
            e.0 += loss_packets(delta);
            e.1 += data;
        }
    }

    /// One burst of a job's flow (kept only if it carried data).
    fn add_burst(&mut self, key: &FlowKey, b: &BurstRecord, job: &'a str) {
        if b.bytes >= b.packets.saturating_mul(MIN_DATA_BURST_PACKET_BYTES) {
            self.dirs.entry((key.ifindex, key.direction)).or_default().bursts.entry(job).or_default().push(summary(key, b));
        }
    }

    /// The job's [`LinkWindow`]s (every interface direction carrying its data), and per peer,
    /// the links whose egress carries its data together with other traffic.
    fn for_job(&self, job: &str, ifname: &impl Fn(u32) -> String) -> (Vec<LinkWindow>, BTreeMap<IpAddr, Vec<String>>) {
        let mut links = Vec::new();
        let mut shared: BTreeMap<IpAddr, Vec<String>> = BTreeMap::new();
        for (&(ifindex, dir), d) in &self.dirs {
            let job_conns: Vec<&ConnId> = d.conns.iter().filter(|(_, (_, _, j))| *j == Some(job)).map(|(c, _)| c).collect();
            if job_conns.is_empty() {
                continue;
            }
            let lossy: Vec<(&ConnId, &DirFlow<'_>)> =
                d.conns.iter().filter(|(_, (loss, data, _))| attribution::is_lossy(*loss, *data)).collect();
            let mut common: Option<BTreeSet<IpAddr>> = None;
            for (c, _) in &lossy {
                let ends = BTreeSet::from([c.src_ip(), c.dst_ip()]);
                common = Some(match common {
                    None => ends,
                    Some(s) => s.intersection(&ends).copied().collect(),
                });
            }
            let (burst_bytes, burst_ns) = d.bursts.get(job).map(|b| phase_goodput(b)).unwrap_or_default();
            let lw = LinkWindow {
                link: ifname(ifindex),
                direction: if dir == direction::INGRESS { "ingress" } else { "egress" }.to_owned(),
                flows: d.conns.len() as u32,
                lossy_flows: lossy.len() as u32,
                lossy_job_flows: lossy.iter().filter(|(_, (_, _, j))| *j == Some(job)).count() as u32,
                common_endpoint: common.and_then(|s| s.first().copied()),
                loss_packets: lossy.iter().map(|(_, (l, _, _))| l).sum(),
                data_packets: lossy.iter().map(|(_, (_, d, _))| d).sum(),
                job_bytes: d.bytes.get(&Some(job)).copied().unwrap_or(0),
                other_bytes: d.bytes.iter().filter(|(j, _)| **j != Some(job)).map(|(_, b)| b).sum(),
                job_burst_bytes: burst_bytes,
                job_burst_ns: burst_ns,
                // Filled in by the analysis stage, which reads the queues once per window.
                queue: None,
            };
            if lw.direction == "egress" && (lw.other_bytes > 0 || lw.lossy_flows > lw.lossy_job_flows) {
                for c in &job_conns {
                    for end in [c.src_ip(), c.dst_ip()] {
                        let v = shared.entry(end).or_default();
                        if !v.contains(&lw.link) {
                            v.push(lw.link.clone());
                        }
                    }
                }
            }
            links.push(lw);
        }
        (links, shared)
    }
}

/// Smallest average packet of a burst that counts as data (a TCP pure-ACK burst averages 52-66 B).
pub const MIN_DATA_BURST_PACKET_BYTES: u64 = 256;

/// At most this many small bursts ([`PeerWindow::pokes`]) per peer and window: they only place a
/// go-ahead in time, and a chatty peer must not grow a window without bound.
const MAX_POKES_PER_PEER: usize = 4096;

/// At most this many of the local host's bursts per job and window ([`LocalSends`]).
const MAX_LOCAL_BURSTS: usize = 4096;

/// Largest packet that may carry no payload over IPv4: a 20-byte IP header and a TCP header with
/// the most options (60 bytes: timestamps and three SACK blocks). A pure ACK with timestamps is
/// 52 bytes, a RoCEv2 ACK 48. Over IPv6 the IP header takes 20 more.
const MAX_HEADER_ONLY_PACKET_V4: u64 = 80;
const MAX_HEADER_ONLY_PACKET_V6: u64 = MAX_HEADER_ONLY_PACKET_V4 + 20;

/// Whether a burst carried some payload: more bytes than its packets' headers alone can take. A
/// run of pure ACKs never does (its kernel sends those whatever the application does); a
/// protocol's control message does (an OpenMPI rendezvous reply, the go-ahead
/// [`PeerWindow::pokes`] are kept for).
/// `sender`: the burst's source address.
fn carried_payload(sender: IpAddr, b: &BurstRecord) -> bool {
    let header = if sender.is_ipv4() { MAX_HEADER_ONLY_PACKET_V4 } else { MAX_HEADER_ONLY_PACKET_V6 };
    b.bytes > b.packets.saturating_mul(header)
}

/// Whether a burst carried data (not a run of pure ACKs).
fn is_data(b: &BurstRecord) -> bool {
    b.bytes >= b.packets.saturating_mul(MIN_DATA_BURST_PACKET_BYTES)
}

/// Whether a burst is data sent by the flow's peer (see the module docs).
fn sent_by_peer_with_data(key: &FlowKey, b: &BurstRecord) -> bool {
    key.direction == direction::INGRESS && is_data(b)
}

/// The detector input of one peer from its summed counter growth.
pub fn peer_window(peer: IpAddr, link: String, c: &Counters, bursts: Vec<BurstSummary>) -> PeerWindow {
    PeerWindow {
        peer,
        link,
        bytes: c.bytes,
        data_packets: data_packets(c),
        retrans: c.tcp_retrans.saturating_add(c.roce_psn_out_of_order),
        ce_marks: c.ce_marks,
        cnps: c.roce_cnps,
        psn_gap_packets: c.roce_psn_gap_packets,
        naks: c.roce_naks,
        bursts,
        explained_by: None,
        shared_links: Vec::new(),
        pokes: Vec::new(),
    }
}

/// Data packets: everything but TCP pure ACKs and RoCE control packets (CNPs, NAKs). SYN/FIN
/// without data are too few to matter.
fn data_packets(c: &Counters) -> u64 {
    let control = c.tcp_pure_acks.saturating_add(c.roce_cnps).saturating_add(c.roce_naks);
    c.packets.saturating_sub(control)
}

/// Loss evidence packets, as [`PeerWindow::loss_packets`] counts them.
fn loss_packets(c: &Counters) -> u64 {
    c.tcp_retrans
        .saturating_add(c.roce_psn_out_of_order)
        .saturating_add(c.roce_psn_gap_packets)
        .saturating_add(c.roce_naks)
}

/// The peer of a flow as an address (IPv4-mapped addresses as IPv4).
pub fn peer_ip(key: &FlowKey) -> IpAddr {
    addr_ip(peer_of(key))
}

/// A flow-key address as an `IpAddr` (IPv4-mapped addresses as IPv4).
fn addr_ip(a: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(a);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        config::ConfigFile,
        flow_table::{
            tests::{key, stats},
            FlowTable, PollSnapshot, TableSettings,
        },
    };
    use dataplane_common::{direction, event_kind, BurstState, Event, FlowStats};
    use std::path::Path;

    const MS: u64 = 1_000_000;

    fn jobs(toml: &str) -> JobSet {
        let f = ConfigFile::parse(toml, Path::new("t.toml")).unwrap();
        JobSet::from_config(f.jobs.as_deref())
    }

    #[test]
    fn membership_by_prefix_address_and_ports() {
        let j = jobs(
            "[[job]]\nname = \"a\"\nmembers = [\"10.77.0.2\"]\ntcp_ports = [29500]\n\
             [[job]]\nname = \"b\"\nmembers = [\"10.77.0.0/24\"]\n",
        );
        // Egress to 10.77.0.2 port 29500: job a (first match).
        assert_eq!(j.job_of(&key(1, 2, 29500, direction::EGRESS, flow_kind::TCP)), Some("a"));
        // Same peer, other port: a's ports do not match, b takes it.
        assert_eq!(j.job_of(&key(1, 2, 80, direction::EGRESS, flow_kind::TCP)), Some("b"));
        // UDP with only tcp_ports on a: not a.
        assert_eq!(j.job_of(&key(1, 2, 4791, direction::EGRESS, flow_kind::ROCEV2)), Some("b"));
        // Ingress: the peer is the source (10.77.0.3), so a does not match.
        assert_eq!(j.job_of(&key(3, 2, 29500, direction::INGRESS, flow_kind::TCP)), Some("b"));
        let mut outside = key(1, 2, 29500, direction::EGRESS, flow_kind::TCP);
        outside.dst_addr = dataplane_common::ipv4_mapped([10, 78, 0, 2]);
        assert_eq!(j.job_of(&outside), None);
        // The source port counts too.
        let mut k = key(1, 2, 40000, direction::EGRESS, flow_kind::TCP);
        k.src_port = 29500;
        assert_eq!(j.job_of(&k), Some("a"));

        let d = jobs("");
        assert_eq!(d.job_of(&key(1, 2, 80, direction::EGRESS, flow_kind::UDP)), Some(DEFAULT_JOB));
        assert_eq!(d.names(), vec![DEFAULT_JOB]);
        let u = jobs("[[job]]\nname = \"r\"\nmembers = [\"10.77.0.0/16\"]\nudp_ports = [4791]\n");
        assert_eq!(u.job_of(&key(1, 2, 4791, direction::EGRESS, flow_kind::ROCEV2)), Some("r"));
        assert_eq!(u.job_of(&key(1, 2, 29500, direction::EGRESS, flow_kind::TCP)), None);
    }

    fn burst(k: FlowKey, start: u64, end: u64, bytes: u64) -> Event {
        Event {
            kind: event_kind::BURST_END,
            key: k,
            burst: BurstState { start_ns: start, last_ns: end, bytes, packets: 1 },
            ..Default::default()
        }
    }

    #[test]
    fn switch_vantage_explains_the_neighbours_of_a_lossy_host() {
        // A ring 1 -> 2 -> 3 -> 4 -> 1 seen on the switch ports p1..p4 (ifindex = host). Host 2's
        // link drops both ways: 1 -> 2 and 2 -> 3 retransmit, at the sender's port (ingress) and
        // at the receiver's (egress). Per peer, hosts 1, 2 and 3 all look lossy.
        let mut t = FlowTable::new(TableSettings::default());
        t.enable_windows();
        let mut flows = Vec::new();
        for (src, dst) in [(1u8, 2u8), (2, 3), (3, 4), (4, 1)] {
            let retrans = if src == 2 || dst == 2 { 80 } else { 1 };
            for (ifindex, dir) in [(src, direction::INGRESS), (dst, direction::EGRESS)] {
                let k = FlowKey { ifindex: ifindex as u32, ..key(src, dst, 29500, dir, flow_kind::TCP) };
                flows.push((k, FlowStats { tcp_retrans: retrans, ..stats(10_000, 15_000_000, 1, 900 * MS) }));
            }
        }
        t.apply(&PollSnapshot { mono_ns: 0, ..Default::default() });
        t.apply(&PollSnapshot { mono_ns: 1000 * MS, flows, ..Default::default() });
        let w = t.take_window().unwrap();
        let jw = &jobs("").windows(&w, |i| format!("p{i}"))[0];
        // The window carries the directed connections; the detectors attribute them.
        let peers: BTreeSet<IpAddr> = jw.peers.iter().map(|p| p.peer).collect();
        let blame = attribution::attribute(&jw.conns, &peers, &BTreeSet::new());
        let explained: Vec<_> =
            jw.peers.iter().map(|p| (p.peer.to_string(), p.retrans, blame.explained_by.get(&p.peer).map(|e| e.to_string()))).collect();
        let by2 = Some("10.77.0.2".to_string());
        assert_eq!(
            explained,
            vec![
                ("10.77.0.1".into(), 81, by2.clone()),
                ("10.77.0.2".into(), 160, None),
                ("10.77.0.3".into(), 81, by2),
                ("10.77.0.4".into(), 2, None),
            ]
        );
    }

    #[test]
    fn shared_loss_on_an_uplink_egress_becomes_a_link_window() {
        // A leaf: hosts 1 and 2 on ports if1 and if2, the uplink if9. The job's 1 -> 3 and three
        // cross-traffic flows 2 -> 5 (not the job's: port 5201) all lose on the uplink's egress;
        // the job's 4 -> 1 arrives clean through the uplink.
        let mut t = FlowTable::new(TableSettings::default());
        t.enable_windows();
        let lossy = |k: FlowKey| (k, FlowStats { tcp_retrans: 60, ..stats(10_000, 15_000_000, 1, 900 * MS) });
        let at = |k: FlowKey, ifindex: u32| FlowKey { ifindex, ..k };
        let job = key(1, 3, 29500, direction::INGRESS, flow_kind::TCP);
        let mut flows = vec![lossy(at(job, 1)), lossy(FlowKey { direction: direction::EGRESS, ..at(job, 9) })];
        for sport in [40001, 40002, 40003] {
            let cross = FlowKey { src_port: sport, ..key(2, 5, 5201, direction::INGRESS, flow_kind::TCP) };
            flows.push(lossy(at(cross, 2)));
            flows.push(lossy(FlowKey { direction: direction::EGRESS, ..at(cross, 9) }));
        }
        let back = key(4, 1, 29500, direction::INGRESS, flow_kind::TCP);
        flows.push((at(back, 9), stats(10_000, 15_000_000, 1, 900 * MS)));
        flows.push((FlowKey { direction: direction::EGRESS, ..at(back, 1) }, stats(10_000, 15_000_000, 1, 900 * MS)));
        t.apply(&PollSnapshot { mono_ns: 0, ..Default::default() });
        t.apply(&PollSnapshot { mono_ns: 1000 * MS, flows, ..Default::default() });
        let w = t.take_window().unwrap();
        let js = jobs("[[job]]\nname = \"train\"\nmembers = [\"10.77.0.0/24\"]\ntcp_ports = [29500]\n");
        let jw = &js.windows(&w, |i| if i == 9 { "uplink".into() } else { format!("p{i}") })[0];
        let egress = jw.links.iter().find(|l| l.link == "uplink" && l.direction == "egress").expect("uplink egress");
        assert_eq!((egress.flows, egress.lossy_flows, egress.lossy_job_flows, egress.common_endpoint), (4, 4, 1, None));
        assert!(egress.shared_loss(3));
        // On p1's ingress only the job's own connection loses: one host common to all, not shared.
        let p1 = jw.links.iter().find(|l| l.link == "p1").expect("p1 ingress");
        assert_eq!((p1.lossy_flows, p1.common_endpoint.is_some()), (1, true));
        assert!(!p1.shared_loss(3));
        assert_eq!((egress.job_bytes, egress.other_bytes), (15_000_000, 45_000_000));
        // The job's peers whose data shares the uplink's egress with other traffic: 1 -> 3's ends.
        let via: Vec<_> = jw.peers.iter().map(|p| (p.peer.to_string(), p.shared_links.clone())).collect();
        let up = vec!["uplink".to_string()];
        assert_eq!(via, vec![("10.77.0.1".into(), up.clone()), ("10.77.0.3".into(), up), ("10.77.0.4".into(), vec![])]);
        // The uplink's ingress carries the job's 4 -> 1 alone: no other traffic, no loss.
        let ingress = jw.links.iter().find(|l| l.link == "uplink" && l.direction == "ingress").expect("uplink ingress");
        assert_eq!((ingress.flows, ingress.lossy_flows, ingress.other_bytes), (1, 0, 0));
    }

    #[test]
    fn retransmissions_the_receiver_dsacked_are_not_loss() {
        // A host NIC's view: data 10.77.0.1 -> .2 leaves (egress) and 9 of its segments are
        // sent again; .2's ACKs come back (ingress) with 7 D-SACKs: 7 of the 9 were tail loss
        // probes that fired before a late ACK, 2 were lost. A flow whose reverse has no D-SACK
        // (to .3), and D-SACKs of another interface, change nothing.
        // One window of these flows' totals (all new to the table), as the default job.
        let window = |flows: Vec<(FlowKey, FlowStats)>| {
            let mut t = FlowTable::new(TableSettings::default());
            t.enable_windows();
            t.apply(&PollSnapshot { mono_ns: 1000 * MS, ..Default::default() });
            t.apply(&PollSnapshot { mono_ns: 2000 * MS, flows, ..Default::default() });
            jobs("").windows(&t.take_window().unwrap(), |i| format!("if{i}")).remove(0)
        };
        let data = key(1, 2, 29500, direction::EGRESS, flow_kind::TCP);
        let acks = reverse_flow(&data);
        assert_eq!((acks.src_addr, acks.direction), (data.dst_addr, direction::INGRESS));
        let other = key(1, 3, 29500, direction::EGRESS, flow_kind::TCP);
        let acks_elsewhere = FlowKey { ifindex: 9, ..acks };
        let jw = &window(vec![
            (data, FlowStats { tcp_retrans: 9, ..stats(2_000, 2_900_000, 1, 1999 * MS) }),
            (acks, FlowStats { tcp_pure_acks: 1_000, tcp_dsacks: 7, ..stats(1_000, 52_000, 1, 1999 * MS) }),
            (other, FlowStats { tcp_retrans: 5, ..stats(2_000, 2_900_000, 1, 1999 * MS) }),
            (acks_elsewhere, FlowStats { tcp_pure_acks: 10, tcp_dsacks: 50, ..stats(10, 520, 1, 1999 * MS) }),
        ]);
        let peer = |a: &str| jw.peers.iter().find(|p| p.peer == a.parse::<IpAddr>().unwrap()).unwrap();
        assert_eq!(peer("10.77.0.2").retrans, 2, "9 resent, 7 of them D-SACKed");
        assert_eq!(peer("10.77.0.3").retrans, 5);
        let conn = |to: &str| jw.conns.iter().find(|c| c.dst == to.parse().ok() && c.src == "10.77.0.1".parse().ok()).unwrap();
        assert_eq!(conn("10.77.0.2").loss_packets, 2);
        assert_eq!(conn("10.77.0.3").loss_packets, 5);
        let egress = jw.links.iter().find(|l| l.link == "if2" && l.direction == "egress").unwrap();
        let lossy = |loss: u64| if attribution::is_lossy(loss, 2_000) { loss } else { 0 };
        assert_eq!(egress.loss_packets, lossy(5) + lossy(2), "the link's lossy flows count the net resends");
        // More D-SACKs than resends in a window (the ACK came in the next one): nothing negative.
        let jw = window(vec![
            (data, FlowStats { tcp_retrans: 1, ..stats(2_000, 2_900_000, 1, 1999 * MS) }),
            (acks, FlowStats { tcp_pure_acks: 1_000, tcp_dsacks: 3, ..stats(1_000, 52_000, 1, 1999 * MS) }),
        ]);
        assert_eq!(jw.peers[0].retrans, 0);
    }

    #[test]
    fn counter_deltas_become_peer_windows_over_both_directions() {
        let mut t = FlowTable::new(TableSettings::default());
        t.enable_windows();
        let out = key(1, 2, 29500, direction::EGRESS, flow_kind::TCP);
        let inb = key(2, 1, 29500, direction::INGRESS, flow_kind::TCP);
        let other = key(1, 3, 29500, direction::EGRESS, flow_kind::TCP);
        let base = FlowStats { tcp_retrans: 1, tcp_pure_acks: 2, ..stats(10, 10_000, 1, MS) };
        t.apply(&PollSnapshot { mono_ns: 1000 * MS, flows: vec![(out, base), (inb, stats(5, 300, 1, MS))], ..Default::default() });
        // One poll spans no time: no window yet. The window starts at that poll, and a flow new to
        // the table counts its whole totals as growth (the kernel map starts empty at attach).
        assert!(t.take_window().is_none());
        assert_eq!(t.pending_window_ns(), 0);

        t.apply(&PollSnapshot {
            mono_ns: 1500 * MS,
            flows: vec![
                (out, FlowStats { tcp_retrans: 4, tcp_pure_acks: 2, ..stats(110, 160_000, 1, 1499 * MS) }),
                (inb, FlowStats { tcp_pure_acks: 50, ..stats(55, 3_300, 1, 1499 * MS) }),
                (other, stats(7, 7_000, 1200 * MS, 1499 * MS)),
            ],
            events: vec![burst(out, 1100 * MS, 1110 * MS, 100_000), burst(inb, 1100 * MS, 1111 * MS, 2_000)],
            ..Default::default()
        });
        t.apply(&PollSnapshot {
            mono_ns: 2000 * MS,
            flows: vec![(out, FlowStats { tcp_retrans: 4, tcp_pure_acks: 2, ..stats(120, 170_000, 1, 1999 * MS) })],
            events: vec![burst(out, 1600 * MS, 1605 * MS, 10_000)],
            ..Default::default()
        });
        let w = t.take_window().unwrap();
        assert_eq!((w.start_ns, w.end_ns), (Some(1000 * MS), 2000 * MS));
        let js = jobs("[[job]]\nname = \"train\"\nmembers = [\"10.77.0.2\"]\n");
        let windows = js.windows(&w, |i| format!("if{i}"));
        assert_eq!(windows.len(), 1);
        let jw = &windows[0];
        assert_eq!((jw.job.as_str(), jw.window_start_ns, jw.window_end_ns), ("train", 1000 * MS, 2000 * MS));
        assert_eq!(jw.peers.len(), 1, "10.77.0.3 is not a member");
        let p = &jw.peers[0];
        assert_eq!(p.peer, "10.77.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(p.link, "if2");
        assert_eq!(p.bytes, 170_000 + 3_300);
        // 120 + 55 packets, of which 2 + 50 pure ACKs.
        assert_eq!(p.data_packets, 120 + 55 - 52);
        assert_eq!(p.retrans, 4);
        // Only the data the peer sent (ingress) is a burst of the peer; its egress bursts are ours.
        assert_eq!(p.bursts, vec![BurstSummary { start_ns: 1100 * MS, end_ns: 1111 * MS, bytes: 2_000, to: Some("10.77.0.1".parse().unwrap()) }]);

        // The next window starts where this one ended, empty.
        let same = FlowStats { tcp_retrans: 4, tcp_pure_acks: 2, ..stats(120, 170_000, 1, 1999 * MS) };
        t.apply(&PollSnapshot { mono_ns: 3000 * MS, flows: vec![(out, same)], ..Default::default() });
        let w2 = t.take_window().unwrap();
        assert_eq!(w2.start_ns, Some(2000 * MS));
        assert!(w2.bursts.is_empty());
        assert!(w2.deltas.is_empty(), "no growth, no delta");
        assert!(js.windows(&w2, |i| format!("if{i}")).is_empty());
    }

    #[test]
    fn bursts_go_to_the_window_that_drained_them() {
        let mut t = FlowTable::new(TableSettings::default());
        let k = key(2, 1, 4791, direction::INGRESS, flow_kind::ROCEV2);
        // Not enabled: nothing accumulates.
        t.apply(&PollSnapshot { mono_ns: MS, events: vec![burst(k, 0, 1, 1)], ..Default::default() });
        assert!(t.take_window().is_none());
        t.enable_windows();
        t.apply(&PollSnapshot { mono_ns: 100 * MS, events: vec![burst(k, 50 * MS, 60 * MS, 5)], ..Default::default() });
        t.apply(&PollSnapshot { mono_ns: 200 * MS, events: vec![burst(k, 150 * MS, 160 * MS, 6)], ..Default::default() });
        let w = t.take_window().unwrap();
        assert_eq!(w.bursts.iter().map(|(_, b)| b.bytes).collect::<Vec<_>>(), vec![5, 6]);
        t.apply(&PollSnapshot { mono_ns: 300 * MS, events: vec![burst(k, 190 * MS, 250 * MS, 7_000)], ..Default::default() });
        let w = t.take_window().unwrap();
        assert_eq!(w.bursts.len(), 1);
        let jw = JobSet::from_config(None).windows(&w, |_| "eth0".into());
        assert_eq!(jw[0].job, DEFAULT_JOB);
        assert_eq!(jw[0].peers[0].bursts, vec![BurstSummary { start_ns: 190 * MS, end_ns: 250 * MS, bytes: 7_000, to: Some("10.77.0.1".parse().unwrap()) }]);
        assert_eq!(jw[0].peers[0].bytes, 0, "a burst without counter growth still names its peer");
    }

    /// The job windows of one window (from 10 to 500 ms) whose `BURST_END` events are these
    /// (key, start ms, bytes, packets), each burst 1 ms long, every interface named `ifname`.
    fn windows_of_bursts(bursts: &[(FlowKey, u64, u64, u64)], ifname: &str) -> Vec<JobWindow> {
        let mut t = FlowTable::new(TableSettings::default());
        t.enable_windows();
        t.apply(&PollSnapshot { mono_ns: 10 * MS, ..Default::default() });
        let events = bursts
            .iter()
            .map(|&(key, start_ms, bytes, packets)| Event {
                kind: event_kind::BURST_END,
                key,
                burst: BurstState { start_ns: start_ms * MS, last_ns: (start_ms + 1) * MS, bytes, packets },
                ..Default::default()
            })
            .collect();
        t.apply(&PollSnapshot { mono_ns: 500 * MS, events, ..Default::default() });
        JobSet::from_config(None).windows(&t.take_window().unwrap(), |_| ifname.into())
    }

    #[test]
    fn ack_bursts_and_our_own_sends_are_not_the_peers_bursts() {
        let data_in = key(2, 1, 29500, direction::INGRESS, flow_kind::TCP);
        let acks_in = key(2, 1, 29501, direction::INGRESS, flow_kind::TCP);
        let data_out = key(1, 2, 29500, direction::EGRESS, flow_kind::TCP);
        let jw = windows_of_bursts(&[(data_in, 100, 1_448_000, 1000), (acks_in, 90, 52_000, 1000), (data_out, 80, 1_448_000, 1000)], "eth0");
        let starts: Vec<u64> = jw[0].peers[0].bursts.iter().map(|b| b.start_ns).collect();
        assert_eq!(starts, vec![100 * MS], "only the data 10.77.0.2 sent");
        // Our own data (one sender, 10.77.0.1) is the window's local sends, for the straggler
        // detector to judge this host by.
        let local = jw[0].local.as_ref().expect("the local host's sends");
        assert_eq!(local.addr, "10.77.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(local.bursts.iter().map(|b| (b.start_ns, b.to)).collect::<Vec<_>>(), vec![(80 * MS, Some("10.77.0.2".parse().unwrap()))]);
        assert!(local.pokes.is_empty());
    }

    #[test]
    fn only_small_sends_with_payload_are_pokes() {
        // A peer's pure ACKs (52 B with timestamps, 80 B with three SACK blocks) are what its
        // kernel sends whatever its application does; a 120 B control message (a rendezvous
        // reply) is the application telling us to go ahead.
        let acks_in = key(2, 1, 29501, direction::INGRESS, flow_kind::TCP);
        let ctrl_in = key(2, 1, 29502, direction::INGRESS, flow_kind::TCP);
        let sack_in = key(2, 1, 29503, direction::INGRESS, flow_kind::TCP);
        let acks_out = key(1, 2, 29501, direction::EGRESS, flow_kind::TCP);
        let ctrl_out = key(1, 2, 29502, direction::EGRESS, flow_kind::TCP);
        let data_out = key(1, 2, 29500, direction::EGRESS, flow_kind::TCP);
        let jw = windows_of_bursts(
            &[
                (acks_in, 100, 52, 1),
                (acks_in, 110, 156, 3),
                (sack_in, 120, 160, 2),
                (ctrl_in, 130, 120, 1),
                (ctrl_in, 140, 300, 3),
                (acks_out, 150, 52, 1),
                (ctrl_out, 160, 120, 1),
                (data_out, 170, 1_448_000, 1000),
            ],
            "eth0",
        );
        let starts = |v: &[BurstSummary]| v.iter().map(|b| b.start_ns / MS).collect::<Vec<_>>();
        assert_eq!(starts(&jw[0].peers[0].pokes), vec![130, 140], "the peer's pokes: its control messages, not its ACKs");
        assert!(jw[0].peers[0].bursts.is_empty());
        let local = jw[0].local.as_ref().expect("the local host's sends");
        assert_eq!(starts(&local.pokes), vec![160], "our own pokes: the control message, not the ACK");
        assert_eq!(starts(&local.bursts), vec![170]);
    }

    #[test]
    fn a_switch_port_s_egress_carries_many_senders_so_no_local_host() {
        // Egress data from two sources (a switch forwarding hosts 2 and 3 to host 1): no local
        // host to judge.
        let egress = |from| key(from, 1, 29500, direction::EGRESS, flow_kind::TCP);
        let jw = windows_of_bursts(&[(egress(2), 80, 1_448_000, 1000), (egress(3), 90, 1_448_000, 1000)], "p1");
        assert_eq!(jw[0].local, None);
    }
}
