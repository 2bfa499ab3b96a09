//! [`Link`]: one cable of a rig (a veth pair) and its two [`Endpoint`]s, and the interface names
//! every rig uses. The bottom of the rig layers: [`crate::fault`] puts faults on links,
//! [`crate::Rig`] finds a topology's links by name, [`crate::Star`] and [`crate::LeafSpine`]
//! build them.
//!
//! Link names: `h<i>` (or just `<i>`) is host i's access link (host eth0 ↔ its switch/leaf port);
//! `up<L>` is leaf L's uplink to the spine (leaf-spine only).

use serde::Serialize;

use crate::error::{Error, Result};
use crate::netns::NetnsHandle;

/// Interface name of every host's link.
pub const HOST_IFACE: &str = "eth0";
/// Name of the bridge in a switch (star) or leaf namespace.
pub const BRIDGE: &str = "br0";

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

/// What one end of a link has moved so far: the kernel's 64-bit counters of the interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LinkCounters {
    pub rx_bytes: u64,
    pub rx_packets: u64,
    pub tx_bytes: u64,
    pub tx_packets: u64,
}

/// `iface`'s counters inside `ns`, from `ip -s -j link show` (no sysfs needed, so it works from
/// any mount namespace).
pub fn link_counters(ns: &NetnsHandle, iface: &str) -> Result<LinkCounters> {
    let what = format!("ip -s -j link show dev {iface} in {}", ns.name());
    let mut c = ns.command("ip");
    c.args(["-s", "-j", "link", "show", "dev", iface]);
    let v = crate::cmd::parse_json(&what, &crate::cmd::run(crate::cmd::Tool::Ip, &mut c, None)?)?;
    let s = &v[0]["stats64"];
    let get = |dir: &str, key: &str| s[dir][key].as_u64().ok_or_else(|| Error::BadOutput { command: what.clone(), detail: format!("no stats64.{dir}.{key} in {v}") });
    Ok(LinkCounters { rx_bytes: get("rx", "bytes")?, rx_packets: get("rx", "packets")?, tx_bytes: get("tx", "bytes")?, tx_packets: get("tx", "packets")? })
}
