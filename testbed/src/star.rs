//! [`Star`]: N host namespaces on one Linux bridge.
//!
//! ```text
//!   rs-<pid>-<n>-h0          rs-<pid>-<n>-sw             rs-<pid>-<n>-h1
//!   eth0 10.77.0.1/24 ──veth── p0 ┐
//!        fd77::1/64                br0 (bridge)  ┌ p1 ──veth── eth0 10.77.0.2/24
//!                                  └─────────────┘                fd77::2/64
//! ```
//!
//! Invariants: both veth ends are created directly inside their target namespaces, so no
//! interface of a rig ever appears in the root namespace; when [`Star::new`] returns, every link
//! is up, every bridge port is forwarding and no address is tentative (DAD is disabled in the
//! rig's namespaces); dropping the `Star` deletes all its namespaces, which destroys the links,
//! qdiscs and nftables tables in them.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;


use crate::cmd::{self, parse_json};
use crate::error::{Error, Result};
use crate::fault::{add_loss, rate_cap, FaultRecord, LossGuard, LossSite, RateCapGuard};
pub use crate::link::{BRIDGE, HOST_IFACE};
use crate::link::{Endpoint, Link, Side};
use crate::netns::{unique_prefix, Netns};
use crate::rig::Rig;
use crate::tuning::{self, BacklogGuard};
/// Largest star: host addresses are 10.77.0.1 ..= 10.77.0.250.
pub const MAX_HOSTS: usize = 250;
/// The switch's own address once [`Star::add_management_address`] gave it one (above the hosts).
pub const MANAGEMENT_ADDR: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 253);

/// How to build a [`Star`]. `StarConfig { hosts: 4, ..Default::default() }`.
#[derive(Debug, Clone)]
pub struct StarConfig {
    /// Number of host namespaces (1..=250).
    pub hosts: usize,
    /// Spread receive processing of every link over all CPUs (RPS). Default true.
    pub rps: bool,
    /// Raise `net.core.netdev_max_backlog` while the rig lives. Default true.
    pub raise_backlog: bool,
    /// Keep the kernel's default segmentation offloads (TSO/GSO/GRO) on the veths. With offloads
    /// on, TC programs see 64 KiB super-packets instead of MTU-sized segments; turn them off
    /// (`false`) when comparing per-packet counters with TCP segment counts. Default true.
    pub offloads: bool,
    /// Link MTU. Default 1500.
    pub mtu: u32,
    /// How long to wait for links to come up. Default 10 s.
    pub settle_timeout: Duration,
}

impl Default for StarConfig {
    fn default() -> Self {
        StarConfig { hosts: 2, rps: true, raise_backlog: true, offloads: true, mtu: 1500, settle_timeout: Duration::from_secs(10) }
    }
}

/// One host of a [`Star`].
#[derive(Debug)]
pub struct StarHost {
    pub ns: Netns,
    /// 10.77.0.(i+1)
    pub addr: Ipv4Addr,
    /// fd77::(i+1)
    pub addr6: Ipv6Addr,
    /// Always `eth0`.
    pub iface: &'static str,
    /// The bridge port in the switch namespace this host is cabled to: `p<i>`.
    pub switch_port: String,
    /// MAC address of `eth0`: 02:77:00:00:00:(i+1).
    pub mac: String,
}

/// A star topology; see the module docs. Drop tears it down.
#[derive(Debug)]
pub struct Star {
    // Field order is drop order: hosts (and their veths) first, then the switch, then tuning.
    pub hosts: Vec<StarHost>,
    pub switch: Netns,
    prefix: String,
    pub(crate) faults: Arc<Mutex<Vec<FaultRecord>>>,
    _backlog: Option<BacklogGuard>,
}

/// Address of host `i` (zero-based).
pub fn host_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, 0, (i + 1) as u8)
}

/// IPv6 address of host `i` (zero-based).
pub fn host_addr6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, (i + 1) as u16)
}

/// A namespace named `name` holding one bridge (`BRIDGE`, no STP, no multicast snooping, no
/// forwarding delay) and no IPv6 on its ports: a pure L2 switch that sends nothing of its own.
/// The star's and the IPU star's switch and the leaf-spine's leaves are each one of these.
pub(crate) fn l2_switch(name: String) -> Result<Netns> {
    let switch = Netns::create(name)?;
    switch.handle().sysctl_write("net/ipv6/conf/default/disable_ipv6", "1")?;
    switch.handle().sysctl_write("net/ipv6/conf/all/disable_ipv6", "1")?;
    cmd::ip_batch(
        Some(switch.name()),
        &format!(
            "link set lo up\n\
             link add {BRIDGE} type bridge stp_state 0 mcast_snooping 0 forward_delay 0\n\
             link set {BRIDGE} up\n"
        ),
    )?;
    Ok(switch)
}

impl Star {
    pub fn new(cfg: StarConfig) -> Result<Star> {
        cmd::require_root()?;
        if cfg.hosts == 0 || cfg.hosts > MAX_HOSTS {
            return Err(Error::InvalidArgument { field: "hosts", reason: format!("{} (must be 1..={MAX_HOSTS})", cfg.hosts) });
        }
        let prefix = unique_prefix();
        let backlog = if cfg.raise_backlog { Some(BacklogGuard::acquire()?) } else { None };
        let switch = l2_switch(format!("{prefix}-sw"))?;

        let mut hosts = Vec::with_capacity(cfg.hosts);
        let mut root_script = String::new();
        for i in 0..cfg.hosts {
            let ns = Netns::create(format!("{prefix}-h{i}"))?;
            // No duplicate address detection: addresses are usable the moment they are added.
            ns.handle().sysctl_write("net/ipv6/conf/default/accept_dad", "0")?;
            ns.handle().sysctl_write("net/ipv6/conf/all/accept_dad", "0")?;
            let mac = format!("02:77:00:00:{:02x}:{:02x}", (i + 1) >> 8, (i + 1) & 0xff);
            root_script.push_str(&format!(
                "link add {HOST_IFACE} netns {} address {mac} mtu {} type veth peer name p{i} netns {} mtu {}\n",
                ns.name(),
                cfg.mtu,
                switch.name(),
                cfg.mtu
            ));
            hosts.push(StarHost {
                ns,
                addr: host_addr(i),
                addr6: host_addr6(i),
                iface: HOST_IFACE,
                switch_port: format!("p{i}"),
                mac,
            });
        }
        // From here on `star` owns everything, so an error below still tears it all down.
        let star = Star { hosts, switch, prefix, faults: Arc::new(Mutex::new(Vec::new())), _backlog: backlog };
        cmd::ip_batch(None, &root_script)?;

        let mut sw_script = String::new();
        for h in &star.hosts {
            sw_script.push_str(&format!("link set {} master {BRIDGE} up\n", h.switch_port));
        }
        cmd::ip_batch(Some(star.switch.name()), &sw_script)?;
        for h in &star.hosts {
            cmd::ip_batch(
                Some(h.ns.name()),
                &format!(
                    "link set lo up\n\
                     addr add {}/24 dev {HOST_IFACE}\n\
                     addr add {}/64 dev {HOST_IFACE} nodad\n\
                     link set {HOST_IFACE} up\n",
                    h.addr, h.addr6
                ),
            )?;
        }
        if !cfg.offloads {
            for h in &star.hosts {
                tuning::set_offloads(&h.ns.handle(), HOST_IFACE, false, Some(false))?;
                tuning::set_offloads(&star.switch.handle(), &h.switch_port, false, Some(false))?;
            }
        }
        if cfg.rps {
            let ports: Vec<&str> = star.hosts.iter().map(|h| h.switch_port.as_str()).collect();
            tuning::enable_rps(&star.switch.handle(), &ports)?;
            for h in &star.hosts {
                tuning::enable_rps(&h.ns.handle(), &[HOST_IFACE])?;
            }
        }
        star.wait_ready(cfg.settle_timeout)?;
        tracing::info!(prefix = %star.prefix, hosts = star.hosts.len(), "star is up");
        Ok(star)
    }

    /// Gives the switch's bridge the address [`MANAGEMENT_ADDR`]/24, so processes in the hosts
    /// can reach a service in the switch namespace (the agent's hints API, as a DPU's management
    /// address would be reachable). Off by default: the switch is otherwise pure L2 and sends
    /// nothing of its own. Idempotent.
    pub fn add_management_address(&self) -> Result<Ipv4Addr> {
        cmd::ip_batch(Some(self.switch.name()), &format!("addr replace {MANAGEMENT_ADDR}/24 dev {BRIDGE}
"))?;
        Ok(MANAGEMENT_ADDR)
    }

    /// The `rs-<pid>-<n>` prefix shared by this rig's namespaces.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn host(&self, index: usize) -> Result<&StarHost> {
        self.hosts.get(index).ok_or(Error::NoSuchHost { index, hosts: self.hosts.len() })
    }

    /// Every fault injected on this rig so far, with start (and end, once removed) times.
    pub fn fault_log(&self) -> Vec<FaultRecord> {
        self.faults.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Bounded poll until every host link is UP without tentative addresses and every bridge port
    /// is forwarding.
    fn wait_ready(&self, timeout: Duration) -> Result<()> {
        cmd::wait_until_ready("star links coming up", timeout, || self.not_ready())
    }

    fn not_ready(&self) -> Result<Option<String>> {
        for h in &self.hosts {
            let out = cmd::ip(&["-n", h.ns.name(), "-j", "addr", "show", "dev", HOST_IFACE])?;
            let v: serde_json::Value = parse_json("ip addr show", &out)?;
            let link = &v[0];
            if link["operstate"] != "UP" {
                return Ok(Some(format!("{} {HOST_IFACE} is {}", h.ns.name(), link["operstate"])));
            }
            if let Some(addrs) = link["addr_info"].as_array() {
                if addrs.iter().any(|a| a["tentative"] == true) {
                    return Ok(Some(format!("{} has tentative addresses", h.ns.name())));
                }
            }
        }
        let out = cmd::ip(&["-n", self.switch.name(), "-j", "-d", "link", "show"])?;
        let v: serde_json::Value = parse_json("ip link show", &out)?;
        for h in &self.hosts {
            let Some(port) = v.as_array().and_then(|a| a.iter().find(|l| l["ifname"] == h.switch_port.as_str())) else {
                return Ok(Some(format!("{} missing", h.switch_port)));
            };
            let state = &port["linkinfo"]["info_slave_data"]["state"];
            if port["operstate"] != "UP" || state != "forwarding" {
                return Ok(Some(format!("{} is {} / {}", h.switch_port, port["operstate"], state)));
            }
        }
        Ok(None)
    }
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
        self.host(host)?;
        add_loss(&self.link(&format!("h{host}"))?, percent, site, self.faults.clone())
    }

    /// Caps host `host`'s link at `rate_mbit` Mbit/s in both directions: a `tbf` root qdisc on
    /// the host's eth0 (host → switch) and on its bridge port (switch → host). A pure rate cap
    /// produces almost no loss; it shows as lower delivery rate and higher RTT.
    pub fn rate_cap(&self, host: usize, rate_mbit: u64) -> Result<RateCapGuard> {
        self.host(host)?;
        rate_cap(&self.link(&format!("h{host}"))?, rate_mbit, self.faults.clone())
    }
}

impl Rig for Star {
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
        self.hosts
            .iter()
            .enumerate()
            .map(|(i, h)| Link {
                name: format!("h{i}"),
                host: Some(i),
                near: Endpoint { ns: h.ns.handle(), iface: HOST_IFACE.into() },
                far: Endpoint { ns: self.switch.handle(), iface: h.switch_port.clone() },
                flap_side: Side::Far,
            })
            .collect()
    }

    fn fault_log_handle(&self) -> Arc<Mutex<Vec<FaultRecord>>> {
        self.faults.clone()
    }
}
