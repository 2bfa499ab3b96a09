//! [`Rig`]: what the job launcher and the fault injectors need from a topology, implemented by
//! [`crate::Star`] and [`crate::LeafSpine`], and [`Link`]: one cable of a rig, named so faults
//! can be put on any of them from code or the command line.
//!
//! Link names: `h<i>` (or just `<i>`) is host i's access link (host eth0 ↔ its switch/leaf port);
//! `up<L>` is leaf L's uplink to the spine (leaf-spine only).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::fault::{self, CrossTraffic, CrossTrafficSpec, FaultRecord, FlapGuard, FlapSpec, LossGuard, LossSite, RateCapGuard};
use crate::netns::{Netns, NetnsHandle};

/// One end of a link: an interface inside a namespace.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub ns: NetnsHandle,
    pub iface: String,
}

/// Which end of a [`Link`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    /// The host's eth0 (access link) or the leaf's `up` port (uplink).
    Near,
    /// The switch/leaf bridge port `p<i>` (access link) or the spine's `l<L>` (uplink).
    Far,
}

/// A cable of a rig (a veth pair).
#[derive(Debug, Clone)]
pub struct Link {
    /// `h<i>` or `up<L>`.
    pub name: String,
    /// The host whose access link this is (`None` for uplinks).
    pub host: Option<usize>,
    /// Host side (access link) or leaf side (uplink). Traffic leaving `near` is "from host" in
    /// [`crate::DropCounters`].
    pub near: Endpoint,
    /// Switch side (access link) or spine side (uplink). Loss rules sit here by default.
    pub far: Endpoint,
    /// The end a flap sets down: always a bridge port (it carries no addresses, so nothing but
    /// the carrier changes and both sides come back by themselves).
    pub flap_side: Side,
}

impl Link {
    pub fn end(&self, side: Side) -> &Endpoint {
        match side {
            Side::Near => &self.near,
            Side::Far => &self.far,
        }
    }
}

/// Normalizes a link name given by a person: `3` → `h3`, `uplink0` → `up0`.
pub fn normalize_link_name(name: &str) -> String {
    let n = name.trim();
    if !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()) {
        return format!("h{n}");
    }
    if let Some(rest) = n.strip_prefix("uplink") {
        return format!("up{rest}");
    }
    n.to_string()
}

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

    /// Bulk TCP traffic between two hosts (not part of a job) for a while; see [`CrossTrafficSpec`].
    fn cross_traffic(&self, spec: CrossTrafficSpec) -> Result<CrossTraffic> {
        let from = self.host_netns(spec.from)?.handle();
        let to = self.host_netns(spec.to)?.handle();
        let to_addr = self.host_ipv4(spec.to)?;
        fault::cross_traffic(&spec, from, to, to_addr, self.fault_log_handle())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_names() {
        assert_eq!(normalize_link_name("3"), "h3");
        assert_eq!(normalize_link_name("h3"), "h3");
        assert_eq!(normalize_link_name("uplink1"), "up1");
        assert_eq!(normalize_link_name("up0"), "up0");
    }
}
