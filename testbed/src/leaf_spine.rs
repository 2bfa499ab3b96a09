//! [`LeafSpine`]: two (or more) leaves of k hosts each, joined through a routing spine, so
//! cross-leaf traffic shares one uplink per leaf.
//!
//! ```text
//!   rs-<pid>-<n>-h0  eth0 10.77.0.1/24 ──veth── p0 ┐
//!   rs-<pid>-<n>-h1  eth0 10.77.0.2/24 ──veth── p1 ┤ br0 in rs-<pid>-<n>-leaf0 ─ uplink ─veth─ l0 10.77.0.254/24 ┐
//!                                                                                          rs-<pid>-<n>-spine (router)
//!   rs-<pid>-<n>-h2  eth0 10.77.1.1/24 ──veth── p0 ┐                                                           │
//!   rs-<pid>-<n>-h3  eth0 10.77.1.2/24 ──veth── p1 ┤ br0 in rs-<pid>-<n>-leaf1 ─ uplink ─veth─ l1 10.77.1.254/24 ┘
//! ```
//!
//! Host `i` (global index) is host `j = i % k` of leaf `L = i / k`: 10.77.L.(j+1)/24 and
//! fd77:0:0:L::(j+1)/64, default routes via the spine's 10.77.L.254 / fd77:0:0:L::fe. Leaves are
//! pure L2 bridges (no addresses, no IPv6), the spine routes between the /24s (and /64s). Links:
//! `h<i>` (host ↔ leaf port `p<j>`) and `up<L>` (leaf port `uplink` ↔ spine `l<L>`).
//!
//! Invariants as for [`crate::Star`]: no interface ever appears in the root namespace; when
//! [`LeafSpine::new`] returns every link is up, every bridge port forwarding, no address
//! tentative, and every host can reach every other; dropping it deletes every namespace.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::cmd::{self, parse_json};
use crate::error::{Error, Result};
use crate::fault::FaultRecord;
use crate::netns::{unique_prefix, Netns};
use crate::link::{Endpoint, Link, Side, BRIDGE, HOST_IFACE};
use crate::rig::Rig;
use crate::tuning::{self, BacklogGuard};

/// Name of a leaf's uplink port (in the leaf namespace).
/// (Not `up`: iproute2 would read that as a keyword.)
pub const LEAF_UPLINK: &str = "uplink";
/// Largest leaf: hosts .1 ..= .200 (the spine is .254).
pub const MAX_HOSTS_PER_LEAF: usize = 200;
/// Most leaves (10.77.0.0/24 ..= 10.77.7.0/24).
pub const MAX_LEAVES: usize = 8;

/// How to build a [`LeafSpine`]. `LeafSpineConfig::default()` is 2 leaves × 2 hosts.
#[derive(Debug, Clone)]
pub struct LeafSpineConfig {
    /// Number of leaves (2..=8). Default 2.
    pub leaves: usize,
    /// Hosts per leaf (1..=200). Default 2.
    pub hosts_per_leaf: usize,
    /// RPS on every link (see [`crate::StarConfig::rps`]). Default true.
    pub rps: bool,
    /// Raise `net.core.netdev_max_backlog` while the rig lives. Default true.
    pub raise_backlog: bool,
    /// Keep TSO/GSO/GRO on (see [`crate::StarConfig::offloads`]). Default true.
    pub offloads: bool,
    /// MTU of every link. Default 1500.
    pub mtu: u32,
    /// How long to wait for links and routes. Default 10 s.
    pub settle_timeout: Duration,
}

impl Default for LeafSpineConfig {
    fn default() -> Self {
        LeafSpineConfig { leaves: 2, hosts_per_leaf: 2, rps: true, raise_backlog: true, offloads: true, mtu: 1500, settle_timeout: Duration::from_secs(10) }
    }
}

/// One host of a [`LeafSpine`].
#[derive(Debug)]
pub struct LeafSpineHost {
    pub ns: Netns,
    /// 10.77.L.(j+1)
    pub addr: Ipv4Addr,
    /// fd77:0:0:L::(j+1)
    pub addr6: Ipv6Addr,
    /// Always `eth0`.
    pub iface: &'static str,
    /// The leaf this host hangs off.
    pub leaf: usize,
    /// Its port on the leaf's bridge: `p<j>`.
    pub leaf_port: String,
    /// 02:77:01:L:00:(j+1)
    pub mac: String,
}

/// One leaf: a bridge namespace with an uplink to the spine.
#[derive(Debug)]
pub struct Leaf {
    pub ns: Netns,
    /// Global indices of its hosts.
    pub hosts: Vec<usize>,
    /// The uplink's port on this leaf's bridge: `uplink`.
    pub uplink_iface: &'static str,
    /// The uplink's interface in the spine namespace: `l<L>`.
    pub spine_iface: String,
    /// The spine's address on this leaf's subnet (the hosts' gateway): 10.77.L.254.
    pub gateway: Ipv4Addr,
    pub gateway6: Ipv6Addr,
}

/// A leaf-spine fabric; see the module docs. Drop tears it down.
#[derive(Debug)]
pub struct LeafSpine {
    // Field order is drop order: hosts first, then leaves, then the spine, then tuning.
    pub hosts: Vec<LeafSpineHost>,
    pub leaves: Vec<Leaf>,
    pub spine: Netns,
    prefix: String,
    faults: Arc<Mutex<Vec<FaultRecord>>>,
    _backlog: Option<BacklogGuard>,
}

/// Address of host `j` of leaf `leaf`.
pub fn leaf_host_addr(leaf: usize, j: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, leaf as u8, (j + 1) as u8)
}

/// IPv6 address of host `j` of leaf `leaf`.
pub fn leaf_host_addr6(leaf: usize, j: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd77, 0, 0, leaf as u16, 0, 0, 0, (j + 1) as u16)
}

impl LeafSpine {
    pub fn new(cfg: LeafSpineConfig) -> Result<LeafSpine> {
        cmd::require_root()?;
        if !(2..=MAX_LEAVES).contains(&cfg.leaves) {
            return Err(Error::InvalidArgument { field: "leaves", reason: format!("{} (must be 2..={MAX_LEAVES})", cfg.leaves) });
        }
        if cfg.hosts_per_leaf == 0 || cfg.hosts_per_leaf > MAX_HOSTS_PER_LEAF {
            return Err(Error::InvalidArgument { field: "hosts_per_leaf", reason: format!("{} (must be 1..={MAX_HOSTS_PER_LEAF})", cfg.hosts_per_leaf) });
        }
        let prefix = unique_prefix();
        let backlog = if cfg.raise_backlog { Some(BacklogGuard::acquire()?) } else { None };
        let mtu = cfg.mtu;

        let spine = Netns::create(format!("{prefix}-spine"))?;
        {
            let h = spine.handle();
            h.sysctl_write("net/ipv4/ip_forward", "1")?;
            h.sysctl_write("net/ipv6/conf/default/accept_dad", "0")?;
            h.sysctl_write("net/ipv6/conf/all/accept_dad", "0")?;
            h.sysctl_write("net/ipv6/conf/all/forwarding", "1")?;
            // A flap of a spine port must not lose its addresses (and with them the routes).
            h.sysctl_write("net/ipv6/conf/default/keep_addr_on_down", "1")?;
            h.sysctl_write("net/ipv6/conf/all/keep_addr_on_down", "1")?;
        }
        let mut ls = LeafSpine { hosts: Vec::new(), leaves: Vec::new(), spine, prefix: prefix.clone(), faults: Arc::new(Mutex::new(Vec::new())), _backlog: backlog };
        let mut root_script = String::new();
        for l in 0..cfg.leaves {
            let ns = crate::star::l2_switch(format!("{prefix}-leaf{l}"))?;
            root_script.push_str(&format!(
                "link add name {LEAF_UPLINK} netns {} mtu {mtu} type veth peer name l{l} netns {} mtu {mtu}\n",
                ns.name(),
                ls.spine.name()
            ));
            let first = ls.hosts.len();
            for j in 0..cfg.hosts_per_leaf {
                let i = first + j;
                let hns = Netns::create(format!("{prefix}-h{i}"))?;
                hns.handle().sysctl_write("net/ipv6/conf/default/accept_dad", "0")?;
                hns.handle().sysctl_write("net/ipv6/conf/all/accept_dad", "0")?;
                let mac = format!("02:77:01:{l:02x}:00:{:02x}", j + 1);
                root_script.push_str(&format!(
                    "link add {HOST_IFACE} netns {} address {mac} mtu {mtu} type veth peer name p{j} netns {} mtu {mtu}\n",
                    hns.name(),
                    ns.name()
                ));
                ls.hosts.push(LeafSpineHost {
                    ns: hns,
                    addr: leaf_host_addr(l, j),
                    addr6: leaf_host_addr6(l, j),
                    iface: HOST_IFACE,
                    leaf: l,
                    leaf_port: format!("p{j}"),
                    mac,
                });
            }
            ls.leaves.push(Leaf {
                ns,
                hosts: (first..first + cfg.hosts_per_leaf).collect(),
                uplink_iface: LEAF_UPLINK,
                spine_iface: format!("l{l}"),
                gateway: Ipv4Addr::new(10, 77, l as u8, 254),
                gateway6: Ipv6Addr::new(0xfd77, 0, 0, l as u16, 0, 0, 0, 0xfe),
            });
        }
        // From here on `ls` owns every namespace, so an error below tears it all down.
        cmd::ip_batch(None, &root_script)?;

        let mut spine_script = String::from("link set lo up\n");
        for (l, leaf) in ls.leaves.iter().enumerate() {
            let mut s = format!("link set dev {LEAF_UPLINK} master {BRIDGE} up\n");
            for &i in &leaf.hosts {
                s.push_str(&format!("link set dev {} master {BRIDGE} up\n", ls.hosts[i].leaf_port));
            }
            cmd::ip_batch(Some(leaf.ns.name()), &s)?;
            spine_script.push_str(&format!(
                "addr add {}/24 dev l{l}\naddr add {}/64 dev l{l} nodad\nlink set l{l} up\n",
                leaf.gateway, leaf.gateway6
            ));
        }
        cmd::ip_batch(Some(ls.spine.name()), &spine_script)?;
        for h in &ls.hosts {
            let leaf = &ls.leaves[h.leaf];
            cmd::ip_batch(
                Some(h.ns.name()),
                &format!(
                    "link set lo up\n\
                     addr add {}/24 dev {HOST_IFACE}\n\
                     addr add {}/64 dev {HOST_IFACE} nodad\n\
                     link set {HOST_IFACE} up\n\
                     route add default via {}\n\
                     route add default via {}\n",
                    h.addr, h.addr6, leaf.gateway, leaf.gateway6
                ),
            )?;
        }
        for link in ls.links() {
            if !cfg.offloads {
                for e in [&link.near, &link.far] {
                    tuning::set_offloads(&e.ns, &e.iface, false, Some(false))?;
                }
            }
            if cfg.rps {
                tuning::enable_rps(&link.near.ns, &[&link.near.iface])?;
                tuning::enable_rps(&link.far.ns, &[&link.far.iface])?;
            }
        }
        ls.wait_ready(cfg.settle_timeout)?;
        tracing::info!(prefix = %ls.prefix, leaves = ls.leaves.len(), hosts = ls.hosts.len(), "leaf-spine is up");
        Ok(ls)
    }

    /// The `rs-<pid>-<n>` prefix shared by this rig's namespaces.
    /// Gives leaf `leaf`'s bridge the address 10.77.L.253/24 (see
    /// [`crate::Star::add_management_address`]), reachable from that leaf's hosts. Idempotent.
    pub fn add_leaf_management_address(&self, leaf: usize) -> Result<Ipv4Addr> {
        let l = self.leaves.get(leaf).ok_or(Error::InvalidArgument { field: "leaf", reason: format!("{leaf} (the fabric has {})", self.leaves.len()) })?;
        let addr = Ipv4Addr::new(10, 77, leaf as u8, 253);
        cmd::ip_batch(Some(l.ns.name()), &format!("addr replace {addr}/24 dev {}
", BRIDGE))?;
        Ok(addr)
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn host(&self, index: usize) -> Result<&LeafSpineHost> {
        self.hosts.get(index).ok_or(Error::NoSuchHost { index, hosts: self.hosts.len() })
    }

    /// Every fault injected on this rig so far.
    pub fn fault_log(&self) -> Vec<FaultRecord> {
        self.faults()
    }

    /// Name of leaf `leaf`'s uplink for the fault functions: `up<L>`.
    pub fn uplink(&self, leaf: usize) -> Result<Link> {
        self.link(&format!("up{leaf}"))
    }

    /// Turns TSO/GSO back on along the path from host `from` to host `to` (both hosts' links and
    /// the uplinks of their leaves) and returns those links' names. On a rig built without
    /// offloads, cross traffic between them then crosses the fabric as 64 KiB super-packets and
    /// loads the uplink, not the machine's CPUs (as MTU-sized frames over four veth links, 4
    /// unbounded streams kept 62-89 % of 2 vCPUs in softirq: docs/eval-adaptation.md, session 28);
    /// every other host keeps sending MTU-sized segments.
    pub fn segmentation_offloads_between(&self, from: usize, to: usize) -> Result<Vec<String>> {
        let (a, b) = (self.host(from)?.leaf, self.host(to)?.leaf);
        let mut links = vec![format!("h{from}"), format!("up{a}")];
        if b != a {
            links.push(format!("up{b}"));
        }
        links.push(format!("h{to}"));
        for link in &links {
            self.link_segmentation_offloads(link, true)?;
        }
        Ok(links)
    }

    /// Bounded poll until every interface is UP, every bridge port forwarding, and the spine
    /// has its addresses.
    fn wait_ready(&self, timeout: Duration) -> Result<()> {
        cmd::wait_until_ready("leaf-spine links coming up", timeout, || self.not_ready())
    }

    fn not_ready(&self) -> Result<Option<String>> {
        for h in &self.hosts {
            if let Some(why) = addrs_not_ready(h.ns.name(), HOST_IFACE)? {
                return Ok(Some(why));
            }
        }
        for (l, leaf) in self.leaves.iter().enumerate() {
            if let Some(why) = addrs_not_ready(self.spine.name(), &format!("l{l}"))? {
                return Ok(Some(why));
            }
            let out = cmd::ip(&["-n", leaf.ns.name(), "-j", "-d", "link", "show"])?;
            let v: serde_json::Value = parse_json("ip link show", &out)?;
            let ports = leaf.hosts.iter().map(|&i| self.hosts[i].leaf_port.as_str()).chain([LEAF_UPLINK]);
            for port in ports {
                let Some(p) = v.as_array().and_then(|a| a.iter().find(|x| x["ifname"] == port)) else {
                    return Ok(Some(format!("{} {port} missing", leaf.ns.name())));
                };
                let state = &p["linkinfo"]["info_slave_data"]["state"];
                if p["operstate"] != "UP" || state != "forwarding" {
                    return Ok(Some(format!("{} {port} is {} / {}", leaf.ns.name(), p["operstate"], state)));
                }
            }
        }
        Ok(None)
    }
}

/// `Some(reason)` unless `iface` in `netns` is UP with no tentative address.
fn addrs_not_ready(netns: &str, iface: &str) -> Result<Option<String>> {
    let out = cmd::ip(&["-n", netns, "-j", "addr", "show", "dev", iface])?;
    let v: serde_json::Value = parse_json("ip addr show", &out)?;
    let link = &v[0];
    if link["operstate"] != "UP" {
        return Ok(Some(format!("{netns} {iface} is {}", link["operstate"])));
    }
    for a in link["addr_info"].as_array().into_iter().flatten() {
        if a["tentative"].as_bool() == Some(true) {
            return Ok(Some(format!("{netns} {iface} address {} is tentative", a["local"])));
        }
    }
    Ok(None)
}

impl Rig for LeafSpine {
    fn rig_prefix(&self) -> &str {
        &self.prefix
    }

    fn host_count(&self) -> usize {
        self.hosts.len()
    }

    fn host_netns(&self, index: usize) -> Result<&Netns> {
        Ok(&self.host(index)?.ns)
    }

    fn host_ipv4(&self, index: usize) -> Result<Ipv4Addr> {
        Ok(self.host(index)?.addr)
    }

    fn host_ipv6(&self, index: usize) -> Result<Ipv6Addr> {
        Ok(self.host(index)?.addr6)
    }

    fn links(&self) -> Vec<Link> {
        let access = self.hosts.iter().enumerate().map(|(i, h)| Link {
            name: format!("h{i}"),
            host: Some(i),
            near: Endpoint { ns: h.ns.handle(), iface: HOST_IFACE.into() },
            far: Endpoint { ns: self.leaves[h.leaf].ns.handle(), iface: h.leaf_port.clone() },
            flap_side: Side::Far,
        });
        let up = self.leaves.iter().enumerate().map(|(l, leaf)| Link {
            name: format!("up{l}"),
            host: None,
            near: Endpoint { ns: leaf.ns.handle(), iface: LEAF_UPLINK.into() },
            far: Endpoint { ns: self.spine.handle(), iface: leaf.spine_iface.clone() },
            // The leaf's bridge port: flapping it leaves the spine's addresses and routes alone.
            flap_side: Side::Near,
        });
        access.chain(up).collect()
    }

    fn fault_log_handle(&self) -> Arc<Mutex<Vec<FaultRecord>>> {
        self.faults.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(leaf_host_addr(1, 0), Ipv4Addr::new(10, 77, 1, 1));
        assert_eq!(leaf_host_addr6(1, 1).to_string(), "fd77:0:0:1::2");
    }
}
