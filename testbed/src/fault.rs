//! Fault injection on any link of a rig ([`crate::Rig`]: [`crate::Star`], [`crate::LeafSpine`]): random
//! loss (nftables), rate caps (tc tbf), link flaps (link down / up), cross traffic (bulk TCP
//! between hosts that are not part of the job) and compute stragglers (recorded by the job
//! launcher). There is no netem on the target kernels, so these are the building blocks (see
//! DESIGN.md, Decisions).
//!
//! Every fault returns a guard that removes it on drop and records its start and end in the rig's
//! fault log ([`crate::Rig::faults`], [`crate::Star::fault_log`]), in wall-clock milliseconds so
//! evaluations can line faults up with the agent's events.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::cmd::{self, parse_json, Tool};
use crate::error::{Error, Result};
use crate::link::{Endpoint, Link, HOST_IFACE};
use crate::netns::NetnsHandle;

/// A rig's fault log, shared with the guards.
pub type FaultLog = Arc<Mutex<Vec<FaultRecord>>>;

static FAULT_COUNTER: AtomicU64 = AtomicU64::new(0);

/// What a fault is.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FaultKind {
    /// Random drop of `percent` % of the packets on the host's link, both directions.
    Loss { percent: f64, site: LossSite },
    /// Token-bucket cap of `rate_mbit` Mbit/s on both directions of the link.
    RateCap { rate_mbit: u64 },
    /// The link goes down for `down_ms`, then up; again every `period_ms` if set.
    Flap { down_ms: u64, period_ms: Option<u64> },
    /// Bulk TCP from host `from` to host `to` on `streams` connections, at `rate_mbit` in total
    /// (unbounded when `None`).
    CrossTraffic { from: usize, to: usize, streams: usize, rate_mbit: Option<u64> },
    /// Rank `rank` computes `extra_ms` longer every step (the job launcher records it).
    Straggler { rank: usize, extra_ms: u64 },
}

/// One fault in a rig's log.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FaultRecord {
    pub id: u64,
    /// The host concerned: the access link's host, the cross-traffic sender, the straggler's host.
    /// `None` for uplink faults.
    pub host: Option<usize>,
    /// The link (`h<i>`, `up<L>`), when the fault is on one.
    pub link: Option<String>,
    /// Where the fault is installed (namespace and interface).
    pub netns: String,
    pub iface: String,
    #[serde(flatten)]
    pub kind: FaultKind,
    /// Wall-clock start, milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
    /// Wall-clock end, once the guard was dropped or removed.
    pub ended_unix_ms: Option<u64>,
}

pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

pub(crate) fn log_start(log: &FaultLog, rec: FaultRecord) {
    log.lock().unwrap_or_else(|p| p.into_inner()).push(rec);
}

pub(crate) fn log_end(log: &FaultLog, id: u64) -> Option<FaultRecord> {
    log_end_at(log, id, unix_ms(SystemTime::now()))
}

fn log_end_at(log: &FaultLog, id: u64, ended_unix_ms: u64) -> Option<FaultRecord> {
    let mut l = log.lock().unwrap_or_else(|p| p.into_inner());
    let r = l.iter_mut().find(|r| r.id == id)?;
    if r.ended_unix_ms.is_none() {
        r.ended_unix_ms = Some(ended_unix_ms.max(r.started_unix_ms));
    }
    Some(r.clone())
}

/// Packets and bytes an nftables loss rule dropped, per direction of the host's link.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DropCounters {
    /// Dropped on the way from the host to the switch.
    pub from_host_packets: u64,
    pub from_host_bytes: u64,
    /// Dropped on the way from the switch to the host.
    pub to_host_packets: u64,
    pub to_host_bytes: u64,
}

/// Removes a loss rule when dropped. See [`crate::Star::add_loss`].
#[derive(Debug)]
pub struct LossGuard {
    ns: NetnsHandle,
    table: String,
    site: LossSite,
    record: FaultRecord,
    log: Arc<Mutex<Vec<FaultRecord>>>,
    removed: bool,
}

/// Removes a rate cap when dropped. See [`crate::Star::rate_cap`], [`crate::Rig::link_rate_cap`].
#[derive(Debug)]
pub struct RateCapGuard {
    ends: Vec<Endpoint>,
    record: FaultRecord,
    log: Arc<Mutex<Vec<FaultRecord>>>,
    removed: bool,
}

fn nft(ns: &NetnsHandle, args: &[&str], stdin: Option<&str>) -> Result<String> {
    let mut c: Command = ns.command("nft");
    c.args(args);
    cmd::run(Tool::Nft, &mut c, stdin)
}

fn tc(ns: &NetnsHandle, args: &[&str]) -> Result<String> {
    let mut c: Command = ns.command("tc");
    c.args(args);
    cmd::run(Tool::Tc, &mut c, None)
}

/// nftables script for a loss table on `iface`. The netdev family's ingress hook runs after TC
/// ingress and its egress hook before TC egress (net/core/dev.c: nf_hook_ingress after the tcx /
/// clsact ingress, nf_hook_egress before sch_handle_egress), so a TC program on the same device
/// sees dropped inbound packets but never dropped outbound ones.
pub fn loss_ruleset(table: &str, iface: &str, threshold_per_10000: u32) -> String {
    // `numgen random mod 10000` yields 0..=9999, and nft rejects a 10000 literal: 100 % is a bare drop.
    let matcher = if threshold_per_10000 >= 10_000 { String::new() } else { format!("numgen random mod 10000 < {threshold_per_10000} ") };
    format!(
        "table netdev {table} {{\n\
         \x20 chain ingress {{ type filter hook ingress device \"{iface}\" priority 0; policy accept; {matcher}counter drop; }}\n\
         \x20 chain egress {{ type filter hook egress device \"{iface}\" priority 0; policy accept; {matcher}counter drop; }}\n\
         }}\n"
    )
}

/// Converts a percentage to the `numgen random mod 10000 < X` threshold.
pub fn loss_threshold(percent: f64) -> Result<u32> {
    if !(0.0..=100.0).contains(&percent) || percent.is_nan() {
        return Err(Error::InvalidArgument { field: "loss percent", reason: format!("{percent} (must be 0..=100)") });
    }
    Ok((percent * 100.0).round() as u32)
}

/// Where a loss rule sits. Both places drop on the host's link in both directions; they differ in
/// who can notice the drop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LossSite {
    /// On the host's bridge port `p<i>` in the switch namespace: like a lossy cable. The sending
    /// host's stack cannot tell a packet was dropped, so TCP recovers with real retransmissions,
    /// and a TC monitor on the host's eth0 sees every packet the host sent but only the inbound
    /// packets that survived.
    #[default]
    SwitchPort,
    /// On the host's own eth0 (netdev ingress/egress hooks in the host namespace). Outbound drops
    /// happen inside the sender's `dev_queue_xmit` and are reported back to it synchronously (TCP
    /// treats them as local congestion and resends without counting a retransmission), so this
    /// mostly models inbound loss.
    HostEth0,
}

fn new_record(link: &Link, host: Option<usize>, at: &Endpoint, kind: FaultKind) -> FaultRecord {
    FaultRecord {
        id: FAULT_COUNTER.fetch_add(1, Ordering::Relaxed),
        host,
        link: Some(link.name.clone()),
        netns: at.ns.name().to_string(),
        iface: at.iface.clone(),
        kind,
        started_unix_ms: unix_ms(SystemTime::now()),
        ended_unix_ms: None,
    }
}

/// Puts a loss table on `link` (far end for [`LossSite::SwitchPort`], near end for
/// [`LossSite::HostEth0`]) and logs it in `log`.
pub fn add_loss(link: &Link, percent: f64, site: LossSite, log: FaultLog) -> Result<LossGuard> {
    let threshold = loss_threshold(percent)?;
    let at = match site {
        LossSite::SwitchPort => &link.far,
        LossSite::HostEth0 => &link.near,
    };
    let record = new_record(link, link.host, at, FaultKind::Loss { percent, site });
    let table = format!("ringside_loss_{}", record.id);
    nft(&at.ns, &["-f", "-"], Some(&loss_ruleset(&table, &at.iface, threshold)))?;
    log_start(&log, record.clone());
    tracing::info!(link = %link.name, percent, ?site, table, "loss fault started");
    Ok(LossGuard { ns: at.ns.clone(), table, site, record, log, removed: false })
}

/// Caps both directions of `link` with a tbf root qdisc on each end and logs it in `log`.
pub fn rate_cap(link: &Link, rate_mbit: u64, log: FaultLog) -> Result<RateCapGuard> {
    if rate_mbit == 0 {
        return Err(Error::InvalidArgument { field: "rate_mbit", reason: "must be at least 1".into() });
    }
    let (rate, burst, limit) = tbf_params(rate_mbit);
    let guard = RateCapGuard {
        ends: vec![link.near.clone(), link.far.clone()],
        record: new_record(link, link.host, &link.near, FaultKind::RateCap { rate_mbit }),
        log: log.clone(),
        removed: false,
    };
    // If one fails, the guard's drop removes what was installed.
    for e in &guard.ends {
        tc(&e.ns, &["qdisc", "replace", "dev", &e.iface, "root", "tbf", "rate", &rate, "burst", &burst, "limit", &limit])?;
    }
    log_start(&log, guard.record.clone());
    tracing::info!(link = %link.name, rate_mbit, "rate cap started");
    Ok(guard)
}

/// tbf `rate`, `burst` and `limit` for a cap: 10 ms worth of burst (at least 16 KiB, so one
/// maximum-size GSO frame is segmented rather than stuck) and 50 ms worth of queue.
pub fn tbf_params(rate_mbit: u64) -> (String, String, String) {
    let bytes_per_s = rate_mbit * 1_000_000 / 8;
    let burst = (bytes_per_s / 100).max(16 * 1024);
    let limit = (bytes_per_s / 20).max(burst + 64 * 1024);
    (format!("{rate_mbit}mbit"), burst.to_string(), limit.to_string())
}

impl LossGuard {
    pub fn record(&self) -> &FaultRecord {
        &self.record
    }

    /// Wall-clock start of the fault.
    pub fn started_unix_ms(&self) -> u64 {
        self.record.started_unix_ms
    }

    /// The nftables table holding the rule (in the switch or the host namespace, see [`LossSite`]).
    pub fn table(&self) -> &str {
        &self.table
    }

    pub fn site(&self) -> LossSite {
        self.site
    }

    /// The namespace holding the table.
    pub fn netns(&self) -> &NetnsHandle {
        &self.ns
    }

    /// What the rule has dropped so far.
    pub fn dropped(&self) -> Result<DropCounters> {
        let out = nft(&self.ns, &["-j", "list", "table", "netdev", &self.table], None)?;
        let v = parse_json("nft -j list table", &out)?;
        let mut c = DropCounters::default();
        for item in v["nftables"].as_array().into_iter().flatten() {
            let rule = &item["rule"];
            let Some(exprs) = rule["expr"].as_array() else { continue };
            for e in exprs {
                let Some(counter) = e.get("counter") else { continue };
                let p = counter["packets"].as_u64().unwrap_or(0);
                let b = counter["bytes"].as_u64().unwrap_or(0);
                // On the switch port, ingress is traffic from the host; on eth0 it is to the host.
                let from_host = match (rule["chain"].as_str(), self.site) {
                    (Some("ingress"), LossSite::SwitchPort) | (Some("egress"), LossSite::HostEth0) => true,
                    (Some("egress"), LossSite::SwitchPort) | (Some("ingress"), LossSite::HostEth0) => false,
                    _ => continue,
                };
                if from_host {
                    c.from_host_packets += p;
                    c.from_host_bytes += b;
                } else {
                    c.to_host_packets += p;
                    c.to_host_bytes += b;
                }
            }
        }
        Ok(c)
    }

    /// Removes the rule now (drop does the same, ignoring errors) and returns the finished record.
    pub fn remove(mut self) -> Result<FaultRecord> {
        self.removed = true;
        nft(&self.ns, &["delete", "table", "netdev", &self.table], None)?;
        Ok(log_end(&self.log, self.record.id).unwrap_or_else(|| self.record.clone()))
    }
}

impl Drop for LossGuard {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        if let Err(e) = nft(&self.ns, &["delete", "table", "netdev", &self.table], None) {
            tracing::debug!(error = %e, table = %self.table, "loss table already gone");
        }
        log_end(&self.log, self.record.id);
    }
}

impl RateCapGuard {
    pub fn record(&self) -> &FaultRecord {
        &self.record
    }

    pub fn started_unix_ms(&self) -> u64 {
        self.record.started_unix_ms
    }

    fn delete(&self) -> Result<()> {
        let mut result = Ok(());
        for e in &self.ends {
            let r = tc(&e.ns, &["qdisc", "del", "dev", &e.iface, "root"]);
            result = result.and(r.map(|_| ()));
        }
        result
    }

    /// Removes the cap now and returns the finished record.
    pub fn remove(mut self) -> Result<FaultRecord> {
        self.removed = true;
        self.delete()?;
        Ok(log_end(&self.log, self.record.id).unwrap_or_else(|| self.record.clone()))
    }
}

impl Drop for RateCapGuard {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        if let Err(e) = self.delete() {
            tracing::debug!(error = %e, "rate cap already gone");
        }
        log_end(&self.log, self.record.id);
    }
}

/// How a link flaps. `FlapSpec::once(Duration::from_millis(800))` is one outage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlapSpec {
    /// How long the link stays down each time.
    pub down: Duration,
    /// Start of one outage to the start of the next; `None` = a single outage.
    pub period: Option<Duration>,
    /// Stop after this many outages (`None` with a period: until the guard drops, at most
    /// [`MAX_FLAPS`]).
    pub count: Option<u32>,
}

/// Upper bound on outages of one flap guard.
pub const MAX_FLAPS: u32 = 1_000_000;

impl FlapSpec {
    pub fn once(down: Duration) -> FlapSpec {
        FlapSpec { down, period: None, count: Some(1) }
    }

    pub fn periodic(down: Duration, period: Duration) -> FlapSpec {
        FlapSpec { down, period: Some(period), count: None }
    }

    fn outages(&self) -> u32 {
        match (self.period, self.count) {
            (None, _) => 1,
            (Some(_), Some(n)) => n.min(MAX_FLAPS),
            (Some(_), None) => MAX_FLAPS,
        }
    }
}

/// A stop signal threads can sleep on.
#[derive(Debug, Default)]
struct Stopper {
    stopped: Mutex<bool>,
    cv: Condvar,
}

impl Stopper {
    fn stop(&self) {
        *self.stopped.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.cv.notify_all();
    }

    #[cfg(test)]
    fn is_stopped(&self) -> bool {
        *self.stopped.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sleeps `d` or until stopped; true if stopped.
    fn sleep(&self, d: Duration) -> bool {
        let deadline = Instant::now() + d;
        let mut g = self.stopped.lock().unwrap_or_else(|p| p.into_inner());
        // Bounded: each wait either ends at the deadline or on a (rare) spurious wakeup.
        for _ in 0..10_000 {
            if *g {
                return true;
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else { return false };
            g = self.cv.wait_timeout(g, left).unwrap_or_else(|p| p.into_inner()).0;
        }
        *g
    }
}

fn set_link(end: &Endpoint, up: bool) -> Result<()> {
    let state = if up { "up" } else { "down" };
    cmd::ip_batch(Some(end.ns.name()), &format!("link set dev {} {state}\n", end.iface)).map(|_| ())
}

/// Brings the flapped end up when dropped (also when the flapping thread panics).
struct UpOnDrop<'a>(&'a Endpoint);

impl Drop for UpOnDrop<'_> {
    fn drop(&mut self) {
        if let Err(e) = set_link(self.0, true) {
            tracing::debug!(error = %e, iface = %self.0.iface, "could not bring link up (rig gone?)");
        }
    }
}

/// Flaps a link on a background thread. Dropping it stops flapping and leaves the link up. See
/// [`crate::Rig::link_flap`].
#[derive(Debug)]
pub struct FlapGuard {
    end: Endpoint,
    stopper: Arc<Stopper>,
    thread: Option<JoinHandle<()>>,
    outages: Arc<AtomicU64>,
    record: FaultRecord,
    log: FaultLog,
}

/// Starts flapping `link` (the end [`Link::flap_side`]) per `spec`, logging one record whose
/// start is the first outage and whose end is when the link is up for good.
pub fn flap(link: &Link, spec: FlapSpec, log: FaultLog) -> Result<FlapGuard> {
    if spec.down.is_zero() {
        return Err(Error::InvalidArgument { field: "flap down time", reason: "must be > 0".into() });
    }
    if let Some(p) = spec.period {
        if p <= spec.down {
            return Err(Error::InvalidArgument { field: "flap period", reason: format!("{p:?} must be longer than the down time {:?}", spec.down) });
        }
    }
    let end = link.end(link.flap_side).clone();
    let kind = FaultKind::Flap { down_ms: spec.down.as_millis() as u64, period_ms: spec.period.map(|p| p.as_millis() as u64) };
    let record = new_record(link, link.host, &end, kind);
    // The first outage starts now, on this thread, so the recorded start time is right.
    set_link(&end, false)?;
    log_start(&log, record.clone());
    tracing::info!(link = %link.name, ?spec, "link flap started");
    let stopper = Arc::new(Stopper::default());
    let outages = Arc::new(AtomicU64::new(1));
    let thread = {
        let (end, stopper, outages, log, id) = (end.clone(), stopper.clone(), outages.clone(), log.clone(), record.id);
        std::thread::Builder::new()
            .name("testbed-flap".into())
            .spawn(move || {
                let restore = UpOnDrop(&end);
                let n = spec.outages();
                let mut i = 1;
                loop {
                    let stopped = stopper.sleep(spec.down);
                    if let Err(e) = set_link(&end, true) {
                        tracing::warn!(error = %e, "flap: could not bring the link up");
                    }
                    let Some(period) = spec.period else { break };
                    if stopped || i >= n || stopper.sleep(period - spec.down) {
                        break;
                    }
                    if let Err(e) = set_link(&end, false) {
                        tracing::warn!(error = %e, "flap: could not set the link down");
                        break;
                    }
                    i += 1;
                    outages.store(i as u64, Ordering::Relaxed);
                }
                drop(restore);
                log_end(&log, id);
            })
            .map_err(|source| Error::Spawn { command: "flap thread".into(), source })?
    };
    Ok(FlapGuard { end, stopper, thread: Some(thread), outages, record, log })
}

impl FlapGuard {
    pub fn record(&self) -> &FaultRecord {
        &self.record
    }

    pub fn started_unix_ms(&self) -> u64 {
        self.record.started_unix_ms
    }

    /// The end being set down and up.
    pub fn endpoint(&self) -> &Endpoint {
        &self.end
    }

    /// Outages started so far.
    pub fn outages(&self) -> u64 {
        self.outages.load(Ordering::Relaxed)
    }

    /// Whether the flapping is over (a single outage ended, or the count was reached).
    pub fn finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Waits for a finite flap (single outage or `count`) to end, bounded by `timeout`; the link
    /// is up afterwards either way. Returns the finished record.
    pub fn wait(mut self, timeout: Duration) -> Result<FaultRecord> {
        let start = Instant::now();
        for _ in 0..100_000 {
            if self.finished() || start.elapsed() >= timeout {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let done = self.finished();
        self.stop();
        if !done {
            return Err(Error::Timeout { what: "link flap to end".into(), waited: start.elapsed(), detail: "stopped it".into() });
        }
        Ok(log_end(&self.log, self.record.id).unwrap_or_else(|| self.record.clone()))
    }

    fn stop(&mut self) {
        self.stopper.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Belt and braces: whatever the thread did, the link ends up.
        let _ = set_link(&self.end, true);
        log_end(&self.log, self.record.id);
    }
}

impl Drop for FlapGuard {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Bulk TCP between two hosts of a rig that are not part of the job: with `from` and `to` on
/// different leaves of a [`crate::LeafSpine`] it loads both uplinks.
#[derive(Debug, Clone, PartialEq)]
pub struct CrossTrafficSpec {
    pub from: usize,
    pub to: usize,
    /// Parallel connections (1..=64). Default 4.
    pub streams: usize,
    /// Total rate in Mbit/s (application-paced); `None` = as fast as TCP goes.
    pub rate_mbit: Option<u64>,
    /// Stop by itself after this long; `None` = until the guard drops (at most 24 h).
    pub duration: Option<Duration>,
    /// TCP port of the sink on `to` (0: ephemeral).
    pub port: u16,
}

impl Default for CrossTrafficSpec {
    fn default() -> Self {
        CrossTrafficSpec { from: 0, to: 1, streams: 4, rate_mbit: None, duration: None, port: 0 }
    }
}

/// Longest cross traffic run.
pub const MAX_CROSS_TRAFFIC: Duration = Duration::from_secs(24 * 3600);

/// What cross traffic moved.
#[derive(Debug, Clone, Serialize)]
pub struct CrossTrafficReport {
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub duration_ms: f64,
    pub goodput_mbit: f64,
    pub record: FaultRecord,
}

/// Runs cross traffic until it is stopped, dropped, or its duration passes. See
/// [`crate::Rig::cross_traffic`].
#[derive(Debug)]
pub struct CrossTraffic {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    sent: Arc<AtomicU64>,
    received: Arc<AtomicU64>,
    started: Instant,
    /// When the traffic stops by itself.
    deadline: Instant,
    record: FaultRecord,
    log: FaultLog,
}

const CROSS_CHUNK: usize = 64 * 1024;
const CROSS_IO_TIMEOUT: Duration = Duration::from_millis(200);

/// Starts `spec` from `from` to `to_addr` (inside `to`), logging it in `log`.
pub fn cross_traffic(spec: &CrossTrafficSpec, from: NetnsHandle, to: NetnsHandle, to_addr: Ipv4Addr, log: FaultLog) -> Result<CrossTraffic> {
    if spec.streams == 0 || spec.streams > 64 {
        return Err(Error::InvalidArgument { field: "cross traffic streams", reason: format!("{} (must be 1..=64)", spec.streams) });
    }
    if spec.from == spec.to {
        return Err(Error::InvalidArgument { field: "cross traffic", reason: "from and to are the same host".into() });
    }
    if spec.rate_mbit == Some(0) {
        return Err(Error::InvalidArgument { field: "cross traffic rate", reason: "must be at least 1 Mbit/s (or unbounded)".into() });
    }
    let duration = spec.duration.unwrap_or(MAX_CROSS_TRAFFIC).min(MAX_CROSS_TRAFFIC);
    let listen = SocketAddr::new(to_addr.into(), spec.port);
    let listener = to.try_run(|| TcpListener::bind(listen))?.map_err(|source| Error::Socket { op: "listen on", addr: listen.to_string(), source })?;
    let dst = listener.local_addr().map_err(|source| Error::Socket { op: "query", addr: listen.to_string(), source })?;
    listener.set_nonblocking(true).map_err(|source| Error::Socket { op: "set nonblocking", addr: dst.to_string(), source })?;
    let streams = spec.streams;
    let conns = from.try_run(|| (0..streams).map(|_| TcpStream::connect_timeout(&dst, Duration::from_secs(5))).collect::<std::io::Result<Vec<_>>>())?
        .map_err(|source| Error::Socket { op: "connect to", addr: dst.to_string(), source })?;
    let kind = FaultKind::CrossTraffic { from: spec.from, to: spec.to, streams, rate_mbit: spec.rate_mbit };
    let record = FaultRecord {
        id: FAULT_COUNTER.fetch_add(1, Ordering::Relaxed),
        host: Some(spec.from),
        link: None,
        netns: from.name().to_string(),
        iface: HOST_IFACE.into(),
        kind,
        started_unix_ms: unix_ms(SystemTime::now()),
        ended_unix_ms: None,
    };
    log_start(&log, record.clone());
    tracing::info!(from = spec.from, to = spec.to, streams, rate_mbit = ?spec.rate_mbit, ?duration, "cross traffic started");
    let started = Instant::now();
    let deadline = started + duration;
    let stop = Arc::new(AtomicBool::new(false));
    let (sent, received) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut ct = CrossTraffic { stop: stop.clone(), threads: Vec::new(), sent: sent.clone(), received: received.clone(), started, deadline, record, log };
    // Receiver: accept `streams` connections (bounded by the deadline), read each to EOF.
    {
        let (stop, received) = (stop.clone(), received.clone());
        let t = std::thread::Builder::new()
            .name("testbed-cross-rx".into())
            .spawn(move || {
                let mut readers = Vec::new();
                while readers.len() < streams && !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    match listener.accept() {
                        Ok((s, _)) => {
                            let (stop, received) = (stop.clone(), received.clone());
                            readers.push(std::thread::spawn(move || drain(s, &stop, &received, deadline)));
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(5)),
                        Err(e) => {
                            tracing::warn!(error = %e, "cross traffic: accept failed");
                            break;
                        }
                    }
                }
                for r in readers {
                    let _ = r.join();
                }
            })
            .map_err(|source| Error::Spawn { command: "cross traffic thread".into(), source })?;
        ct.threads.push(t);
    }
    let per_stream_bps = spec.rate_mbit.map(|r| r as f64 * 1e6 / 8.0 / streams as f64);
    for s in conns {
        let (stop, sent) = (stop.clone(), sent.clone());
        let t = std::thread::Builder::new()
            .name("testbed-cross-tx".into())
            .spawn(move || pump(s, &stop, &sent, deadline, per_stream_bps))
            .map_err(|source| Error::Spawn { command: "cross traffic thread".into(), source })?;
        ct.threads.push(t);
    }
    Ok(ct)
}

/// Writes until stopped or the deadline, paced to `bytes_per_s` if given; then closes.
fn pump(mut s: TcpStream, stop: &AtomicBool, sent: &AtomicU64, deadline: Instant, bytes_per_s: Option<f64>) {
    let buf = vec![0x5au8; CROSS_CHUNK];
    let _ = s.set_write_timeout(Some(CROSS_IO_TIMEOUT));
    let start = Instant::now();
    let mut mine: u64 = 0;
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        if let Some(bps) = bytes_per_s {
            // Token bucket: do not get ahead of rate × elapsed (sleep in short slices to stay stoppable).
            let due = Duration::from_secs_f64(mine as f64 / bps);
            if let Some(wait) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(wait.min(Duration::from_millis(20)));
                continue;
            }
        }
        let n = bytes_per_s.map(|bps| ((bps / 100.0) as usize).clamp(1024, CROSS_CHUNK)).unwrap_or(CROSS_CHUNK);
        match s.write(&buf[..n]) {
            Ok(0) => break,
            Ok(k) => {
                mine += k as u64;
                sent.fetch_add(k as u64, Ordering::Relaxed);
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted) => {}
            Err(e) => {
                tracing::debug!(error = %e, "cross traffic: send ended");
                break;
            }
        }
    }
    let _ = s.shutdown(std::net::Shutdown::Both);
}

/// Reads until EOF, stop, or the deadline (plus a second to drain).
fn drain(mut s: TcpStream, stop: &AtomicBool, received: &AtomicU64, deadline: Instant) {
    let mut buf = vec![0u8; CROSS_CHUNK];
    let _ = s.set_read_timeout(Some(CROSS_IO_TIMEOUT));
    let hard = deadline + Duration::from_secs(1);
    while Instant::now() < hard {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => {
                received.fetch_add(k as u64, Ordering::Relaxed);
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted) => {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
            }
            Err(_) => break,
        }
    }
}

impl CrossTraffic {
    pub fn record(&self) -> &FaultRecord {
        &self.record
    }

    pub fn started_unix_ms(&self) -> u64 {
        self.record.started_unix_ms
    }

    /// Payload bytes written so far.
    pub fn bytes_sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Whether every sender has stopped (duration over, or the peer went away).
    pub fn finished(&self) -> bool {
        self.threads.iter().all(|t| t.is_finished())
    }

    /// Stops the traffic now and reports what it moved.
    pub fn stop(mut self) -> CrossTrafficReport {
        self.halt();
        let d = self.started.elapsed();
        let bytes_received = self.received.load(Ordering::Relaxed);
        let record = log_end(&self.log, self.record.id).unwrap_or_else(|| self.record.clone());
        CrossTrafficReport {
            bytes_sent: self.sent.load(Ordering::Relaxed),
            bytes_received,
            duration_ms: d.as_secs_f64() * 1e3,
            goodput_mbit: bytes_received as f64 * 8.0 / d.as_secs_f64().max(1e-9) / 1e6,
            record,
        }
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // The traffic ended at its deadline if that has passed, else now.
        let now = Instant::now();
        let ended = SystemTime::now() - now.saturating_duration_since(self.deadline.min(now));
        log_end_at(&self.log, self.record.id, unix_ms(ended));
    }
}

impl Drop for CrossTraffic {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Records a fault that the caller applies itself (the job launcher's straggler); the returned
/// id ends it with [`end_fault`].
pub fn record_fault(log: &FaultLog, host: Option<usize>, netns: &str, kind: FaultKind) -> u64 {
    let id = FAULT_COUNTER.fetch_add(1, Ordering::Relaxed);
    let rec = FaultRecord {
        id,
        host,
        link: None,
        netns: netns.to_string(),
        iface: String::new(),
        kind,
        started_unix_ms: unix_ms(SystemTime::now()),
        ended_unix_ms: None,
    };
    log_start(log, rec);
    id
}

/// Sets the end time of a fault recorded with [`record_fault`] (no-op if already ended).
pub fn end_fault(log: &FaultLog, id: u64) -> Option<FaultRecord> {
    log_end(log, id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds() {
        assert_eq!(loss_threshold(5.0).unwrap(), 500);
        assert_eq!(loss_threshold(0.01).unwrap(), 1);
        assert_eq!(loss_threshold(100.0).unwrap(), 10000);
        assert!(loss_threshold(-1.0).is_err());
        assert!(loss_threshold(f64::NAN).is_err());
    }

    #[test]
    fn ruleset_mentions_both_hooks() {
        let r = loss_ruleset("t", "eth0", 500);
        assert!(r.contains("hook ingress device \"eth0\""));
        assert!(r.contains("hook egress device \"eth0\""));
        assert_eq!(r.matches("numgen random mod 10000 < 500 counter drop").count(), 2);
        let all = loss_ruleset("t", "eth0", 10_000);
        assert!(!all.contains("numgen") && all.matches("counter drop").count() == 2);
    }

    #[test]
    fn flap_outages() {
        assert_eq!(FlapSpec::once(Duration::from_millis(5)).outages(), 1);
        let p = FlapSpec { count: Some(3), ..FlapSpec::periodic(Duration::from_millis(5), Duration::from_millis(10)) };
        assert_eq!(p.outages(), 3);
        assert_eq!(FlapSpec::periodic(Duration::from_millis(5), Duration::from_millis(10)).outages(), MAX_FLAPS);
    }

    #[test]
    fn stopper_wakes_early() {
        let s = Arc::new(Stopper::default());
        let s2 = s.clone();
        let t = std::thread::spawn(move || s2.sleep(Duration::from_secs(30)));
        std::thread::sleep(Duration::from_millis(20));
        s.stop();
        assert!(t.join().unwrap());
        assert!(s.is_stopped());
        assert!(!Stopper::default().sleep(Duration::from_millis(1)));
    }

    #[test]
    fn tbf_burst_floor() {
        let (rate, burst, _) = tbf_params(1);
        assert_eq!(rate, "1mbit");
        assert_eq!(burst, "16384");
        let (_, burst, _) = tbf_params(10_000);
        assert_eq!(burst, (10_000u64 * 1_000_000 / 8 / 100).to_string());
    }
}
