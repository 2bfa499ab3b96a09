//! Fault injection on a [`Star`]: random loss (nftables) and rate caps (tc tbf). There is no netem
//! on the target kernels, so these are the building blocks (see DESIGN.md, Decisions).
//!
//! Every fault returns a guard that removes it on drop and records its start and end in the rig's
//! fault log ([`Star::fault_log`]), in wall-clock milliseconds so evaluations can line faults up
//! with the agent's events.

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::cmd::{self, Tool};
use crate::error::{Error, Result};
use crate::netns::NetnsHandle;
use crate::star::{parse_json, Star, HOST_IFACE};

static FAULT_COUNTER: AtomicU64 = AtomicU64::new(0);

/// What a fault is.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FaultKind {
    /// Random drop of `percent` % of the packets on the host's link, both directions.
    Loss { percent: f64, site: LossSite },
    /// Token-bucket cap of `rate_mbit` Mbit/s on both directions of the host's link.
    RateCap { rate_mbit: u64 },
}

/// One fault in a rig's log.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FaultRecord {
    pub id: u64,
    pub host: usize,
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

fn log_start(log: &Arc<Mutex<Vec<FaultRecord>>>, rec: FaultRecord) {
    log.lock().unwrap_or_else(|p| p.into_inner()).push(rec);
}

fn log_end(log: &Arc<Mutex<Vec<FaultRecord>>>, id: u64) -> Option<FaultRecord> {
    let mut l = log.lock().unwrap_or_else(|p| p.into_inner());
    let r = l.iter_mut().find(|r| r.id == id)?;
    if r.ended_unix_ms.is_none() {
        r.ended_unix_ms = Some(unix_ms(SystemTime::now()));
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

/// Removes a loss rule when dropped. See [`Star::add_loss`].
#[derive(Debug)]
pub struct LossGuard {
    ns: NetnsHandle,
    table: String,
    site: LossSite,
    record: FaultRecord,
    log: Arc<Mutex<Vec<FaultRecord>>>,
    removed: bool,
}

/// Removes a rate cap when dropped. See [`Star::rate_cap`].
#[derive(Debug)]
pub struct RateCapGuard {
    host_ns: NetnsHandle,
    switch_ns: NetnsHandle,
    switch_port: String,
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

impl Star {
    /// Drops `percent` % of the packets on host `host`'s link, independently at random in both
    /// directions (nftables `numgen random mod 10000 < percent*100`, 0.01 % resolution), at
    /// [`LossSite::SwitchPort`]. There is no netem on the target kernels. The rule drops packets
    /// as the device sees them: with offloads on ([`crate::StarConfig::offloads`]) one TCP "packet"
    /// may be a 64 KiB GSO frame, so the segment loss rate is burstier than `percent` suggests.
    pub fn add_loss(&self, host: usize, percent: f64) -> Result<LossGuard> {
        self.add_loss_at(host, percent, LossSite::SwitchPort)
    }

    /// [`Star::add_loss`] at an explicit [`LossSite`].
    pub fn add_loss_at(&self, host: usize, percent: f64, site: LossSite) -> Result<LossGuard> {
        let h = self.host(host)?;
        let threshold = loss_threshold(percent)?;
        let id = FAULT_COUNTER.fetch_add(1, Ordering::Relaxed);
        let table = format!("ringside_loss_{id}");
        let (ns, iface) = match site {
            LossSite::SwitchPort => (self.switch.handle(), h.switch_port.clone()),
            LossSite::HostEth0 => (h.ns.handle(), HOST_IFACE.to_string()),
        };
        nft(&ns, &["-f", "-"], Some(&loss_ruleset(&table, &iface, threshold)))?;
        let record = FaultRecord {
            id,
            host,
            netns: ns.name().to_string(),
            iface,
            kind: FaultKind::Loss { percent, site },
            started_unix_ms: unix_ms(SystemTime::now()),
            ended_unix_ms: None,
        };
        log_start(&self.faults, record.clone());
        tracing::info!(host, percent, ?site, table, "loss fault started");
        Ok(LossGuard { ns, table, site, record, log: self.faults.clone(), removed: false })
    }

    /// Caps host `host`'s link at `rate_mbit` Mbit/s in both directions: a `tbf` root qdisc on
    /// the host's eth0 (host → switch) and on its bridge port (switch → host). A pure rate cap
    /// produces almost no loss; it shows as lower delivery rate and higher RTT.
    pub fn rate_cap(&self, host: usize, rate_mbit: u64) -> Result<RateCapGuard> {
        let h = self.host(host)?;
        if rate_mbit == 0 {
            return Err(Error::InvalidArgument { field: "rate_mbit", reason: "must be at least 1".into() });
        }
        let (rate, burst, limit) = tbf_params(rate_mbit);
        let id = FAULT_COUNTER.fetch_add(1, Ordering::Relaxed);
        let args = ["qdisc", "replace", "dev", HOST_IFACE, "root", "tbf", "rate", &rate, "burst", &burst, "limit", &limit];
        tc(&h.ns.handle(), &args)?;
        let mut sw_args = args;
        sw_args[3] = &h.switch_port;
        let guard = RateCapGuard {
            host_ns: h.ns.handle(),
            switch_ns: self.switch.handle(),
            switch_port: h.switch_port.clone(),
            record: FaultRecord {
                id,
                host,
                netns: h.ns.name().to_string(),
                iface: HOST_IFACE.into(),
                kind: FaultKind::RateCap { rate_mbit },
                started_unix_ms: unix_ms(SystemTime::now()),
                ended_unix_ms: None,
            },
            log: self.faults.clone(),
            removed: false,
        };
        // If this fails the guard's drop removes the host side again.
        tc(&self.switch.handle(), &sw_args)?;
        log_start(&self.faults, guard.record.clone());
        tracing::info!(host, rate_mbit, "rate cap started");
        Ok(guard)
    }
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
        let a = tc(&self.host_ns, &["qdisc", "del", "dev", HOST_IFACE, "root"]);
        let b = tc(&self.switch_ns, &["qdisc", "del", "dev", &self.switch_port, "root"]);
        a.and(b).map(|_| ())
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
    fn tbf_burst_floor() {
        let (rate, burst, _) = tbf_params(1);
        assert_eq!(rate, "1mbit");
        assert_eq!(burst, "16384");
        let (_, burst, _) = tbf_params(10_000);
        assert_eq!(burst, (10_000u64 * 1_000_000 / 8 / 100).to_string());
    }
}
