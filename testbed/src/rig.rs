//! [`Rig`]: what the job launcher and the fault injectors need from a topology, implemented by
//! [`crate::Star`] and [`crate::LeafSpine`]. Its links ([`Link`], defined in [`crate::link`] and
//! re-exported here) are named so faults can be put on any of them from code or the command line.
//!
//! Layering: `link` (cables, names) ← `fault` (what can go wrong on a link) ← `rig` (the trait that
//! puts faults on a topology's links) ← `star` / `leaf_spine` (the topologies). Each imports only
//! downward.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::fault::{self, CrossTraffic, CrossTrafficSpec, FaultRecord, FlapGuard, FlapSpec, LossGuard, LossSite, RateCapGuard};
pub use crate::link::{normalize_link_name, Endpoint, Link, Side};
use crate::netns::Netns;

/// A topology the job launcher and the fault injectors can use.
pub trait Rig {
    /// The `rs-<pid>-<n>` prefix shared by this rig's namespaces.
    fn rig_prefix(&self) -> &str;
    fn host_count(&self) -> usize;
    fn host_netns(&self, index: usize) -> Result<&Netns>;
    fn host_ipv4(&self, index: usize) -> Result<Ipv4Addr>;
    fn host_ipv6(&self, index: usize) -> Result<Ipv6Addr>;
    /// Every link of the rig: access links `h0..`, then uplinks.
    fn links(&self) -> Vec<Link>;
    /// The shared fault log (faults append their records, guards set their end times).
    fn fault_log_handle(&self) -> Arc<Mutex<Vec<FaultRecord>>>;

    /// The link called `name` (see [`normalize_link_name`]).
    fn link(&self, name: &str) -> Result<Link> {
        let want = normalize_link_name(name);
        let links = self.links();
        let known: Vec<String> = links.iter().map(|l| l.name.clone()).collect();
        links.into_iter().find(|l| l.name == want).ok_or_else(|| Error::InvalidArgument {
            field: "link",
            reason: format!("{name:?}: this rig has {}", known.join(", ")),
        })
    }

    /// Every fault injected on this rig so far, with start (and end, once over) times.
    fn faults(&self) -> Vec<FaultRecord> {
        self.fault_log_handle().lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Random loss of `percent` % in both directions on `link`, at the far end (switch port /
    /// spine port). See [`crate::Star::add_loss`].
    fn link_loss(&self, link: &str, percent: f64) -> Result<LossGuard> {
        self.link_loss_at(link, percent, LossSite::SwitchPort)
    }

    /// [`Rig::link_loss`] at an explicit site ([`LossSite::HostEth0`] = the near end).
    fn link_loss_at(&self, link: &str, percent: f64, site: LossSite) -> Result<LossGuard> {
        fault::add_loss(&self.link(link)?, percent, site, self.fault_log_handle())
    }

    /// tbf cap of `rate_mbit` on both directions of `link`.
    fn link_rate_cap(&self, link: &str, rate_mbit: u64) -> Result<RateCapGuard> {
        fault::rate_cap(&self.link(link)?, rate_mbit, self.fault_log_handle())
    }

    /// Sets `link` down for `spec.down`, then up (repeating every `spec.period` if given). The
    /// guard stops flapping and brings the link up when dropped.
    fn link_flap(&self, link: &str, spec: FlapSpec) -> Result<FlapGuard> {
        fault::flap(&self.link(link)?, spec, self.fault_log_handle())
    }

    /// One-shot flap: down for `down`, then up.
    fn link_down_for(&self, link: &str, down: Duration) -> Result<FlapGuard> {
        self.link_flap(link, FlapSpec { down, period: None, count: Some(1) })
    }

    /// Turns TSO/GSO on or off at both ends of `link` (GRO as it was). On a rig built without
    /// offloads, turning them back on along the path of cross traffic (its hosts' links and the
    /// uplinks) lets the bulk traffic cross the rig as 64 KiB super-packets, so it loads the links
    /// rather than the machine's CPUs, while the job's hosts still send MTU-sized segments.
    fn link_segmentation_offloads(&self, link: &str, on: bool) -> Result<()> {
        let link = self.link(link)?;
        for e in [&link.near, &link.far] {
            crate::tuning::set_offloads(&e.ns, &e.iface, on, None)?;
        }
        tracing::info!(link = %link.name, on, "segmentation offloads set");
        Ok(())
    }

    /// Bulk TCP traffic between two hosts (not part of a job) for a while; see [`CrossTrafficSpec`].
    fn cross_traffic(&self, spec: CrossTrafficSpec) -> Result<CrossTraffic> {
        let from = self.host_netns(spec.from)?.handle();
        let to = self.host_netns(spec.to)?.handle();
        let to_addr = self.host_ipv4(spec.to)?;
        fault::cross_traffic(&spec, from, to, to_addr, self.fault_log_handle())
    }
}
