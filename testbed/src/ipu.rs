//! [`IpuStar`]: a star where every host reaches the switch through its own IPU namespace, a bump
//! in the wire run by the provider.
//!
//! ```text
//!   rs-<pid>-<n>-h0            rs-<pid>-<n>-ipu0                    rs-<pid>-<n>-sw
//!   eth0 10.77.0.1/24 ──veth── host ─[ipuwire]─ fabric ──veth── p0 ┐
//!                              (no bridge, no address)              br0 (bridge)
//!   eth0 10.77.0.2/24 ──veth── host ─[ipuwire]─ fabric ──veth── p1 ┘
//!   rs-<pid>-<n>-h1            rs-<pid>-<n>-ipu1
//! ```
//!
//! Each IPU namespace has two ports, `host` and `fabric`, and nothing else: no bridge, no
//! address, no routing. `ringside ipu-wire --host-port host --fabric-port fabric` (the real
//! binary, started by [`IpuStar::new`] in each IPU namespace) moves every frame from one port to
//! the other with an eBPF TC redirect; without it the IPU passes nothing. The agent is attached
//! by the caller in an IPU namespace on `fabric` ([`IpuStar::ipu`], [`IPU_FABRIC_PORT`]).
//!
//! Invariants: as [`crate::Star`] (veth ends created inside their namespaces, links up, bridge
//! ports forwarding, no tentative address when `new` returns), plus every IPU's forwarder is
//! attached on both ports' ingress when `new` returns. Drop stops the forwarders (SIGTERM, then
//! SIGKILL), then deletes every namespace. Names follow [`crate::netns`]'s `rs-<pid>-...`
//! invariant, so `cargo xtask testbed clean` removes a crashed run's IPUs with the rest.
//!
//! Links (for [`Rig`] faults): `h<i>` is IPU i's fabric cable (IPU `fabric` ↔ switch `p<i>`),
//! where the star's host links carry faults, so loss and rate caps act between the IPU and the
//! fabric, where the IPU's monitor sees their effect; `a<i>` is host i's cable to its IPU
//! (`eth0` ↔ IPU `host`). Loss goes on the switch port ([`crate::LossSite::SwitchPort`]): an
//! nftables netdev rule on an IPU port would run after the forwarder's redirect on ingress and
//! never see those frames.
//!
//! Isolation (what a tenant in a host namespace can reach): only `lo` and its `eth0`; the IPU's
//! ports, its `tc` filters and anything listening in the IPU namespace (the agent's API on
//! 127.0.0.1) are in another network namespace, and the IPU has no address on the host's
//! subnet. The namespaces share the caller's mount namespace, so bpffs pins (the agent's
//! `--pin-dir`) are visible to root in a host namespace: the forwarder pins nothing, but a
//! real deployment keeps the tenant out of the provider's mount namespace (a VM, or a container
//! without /sys/fs/bpf).

use std::io::Read;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cmd::{self, parse_json};
use crate::error::{Error, Result};
use crate::fault::FaultRecord;
use crate::link::{Endpoint, Link, Side, BRIDGE, HOST_IFACE};
use crate::netns::{unique_prefix, Netns};
use crate::rig::Rig;
use crate::star::{host_addr, host_addr6, l2_switch, MAX_HOSTS};
use crate::tuning::{self, BacklogGuard};

/// The IPU's port cabled to its host.
pub const IPU_HOST_PORT: &str = "host";
/// The IPU's port cabled to the switch: attach the agent here.
pub const IPU_FABRIC_PORT: &str = "fabric";

/// How to build an [`IpuStar`].
#[derive(Debug, Clone)]
pub struct IpuStarConfig {
    /// Number of hosts (each with its IPU), 1..=250.
    pub hosts: usize,
    /// The `ringside` binary whose `ipu-wire` subcommand runs each IPU's forwarder. Default
    /// `ringside` on PATH.
    pub ringside_bin: PathBuf,
    /// As [`crate::StarConfig::rps`], on every link end including the IPU ports. Default true.
    pub rps: bool,
    /// As [`crate::StarConfig::raise_backlog`]. Default true.
    pub raise_backlog: bool,
    /// As [`crate::StarConfig::offloads`], on every veth of the rig. Default true.
    pub offloads: bool,
    /// Link MTU. Default 1500.
    pub mtu: u32,
    /// How long to wait for links and forwarders to come up. Default 15 s.
    pub settle_timeout: Duration,
}

impl Default for IpuStarConfig {
    fn default() -> Self {
        IpuStarConfig {
            hosts: 2,
            ringside_bin: PathBuf::from("ringside"),
            rps: true,
            raise_backlog: true,
            offloads: true,
            mtu: 1500,
            settle_timeout: Duration::from_secs(15),
        }
    }
}

/// One host of an [`IpuStar`] and its IPU.
#[derive(Debug)]
pub struct IpuHost {
    /// The tenant's namespace.
    pub ns: Netns,
    /// 10.77.0.(i+1)
    pub addr: Ipv4Addr,
    /// fd77::(i+1)
    pub addr6: Ipv6Addr,
    /// The provider's IPU namespace in front of the host.
    pub ipu: Netns,
    /// The switch port IPU i is cabled to: `p<i>`.
    pub switch_port: String,
}

/// What an IPU's forwarder counted, printed by `ringside ipu-wire` when it stops (the fields of
/// `dataplane_user::ipuwire::WireStats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct WireReport {
    pub to_fabric: u64,
    pub to_host: u64,
    pub unconfigured: u64,
    pub foreign_port: u64,
    pub redirect_failed: u64,
}

/// A running `ringside ipu-wire`; stopped on drop.
#[derive(Debug)]
struct Wire {
    child: Option<Child>,
    log: PathBuf,
}

impl Wire {
    /// SIGTERM, up to 10 s to exit, then SIGKILL. Returns the counters it printed, if it exited
    /// cleanly.
    fn stop(&mut self) -> Option<WireReport> {
        let mut child = self.child.take()?;
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    let mut out = String::new();
                    if let Some(mut s) = child.stdout.take() {
                        let _ = s.read_to_string(&mut out);
                    }
                    if !status.success() {
                        tracing::warn!(%status, log = %self.log.display(), "ipu-wire exited with an error");
                        return None;
                    }
                    // A clean exit leaves nothing to read in its log; a failed one keeps it.
                    let _ = std::fs::remove_file(&self.log);
                    return out.lines().last().and_then(|l| serde_json::from_str(l).ok());
                }
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return None;
                }
            }
        }
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The topology; see the module docs. Drop tears it down.
#[derive(Debug)]
pub struct IpuStar {
    // Field order is drop order: the forwarders first (they hold the IPUs' ports), then the
    // namespaces, then tuning.
    wires: Vec<Wire>,
    pub hosts: Vec<IpuHost>,
    pub switch: Netns,
    prefix: String,
    faults: Arc<Mutex<Vec<FaultRecord>>>,
    _backlog: Option<BacklogGuard>,
}

impl IpuStar {
    pub fn new(cfg: IpuStarConfig) -> Result<IpuStar> {
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
            ns.handle().sysctl_write("net/ipv6/conf/default/accept_dad", "0")?;
            ns.handle().sysctl_write("net/ipv6/conf/all/accept_dad", "0")?;
            let ipu = Netns::create(format!("{prefix}-ipu{i}"))?;
            // The IPU is a wire: it sends nothing of its own (no IPv6 link-local, no RS/NS).
            ipu.handle().sysctl_write("net/ipv6/conf/default/disable_ipv6", "1")?;
            ipu.handle().sysctl_write("net/ipv6/conf/all/disable_ipv6", "1")?;
            let mac = format!("02:77:00:00:{:02x}:{:02x}", (i + 1) >> 8, (i + 1) & 0xff);
            let mtu = cfg.mtu;
            root_script.push_str(&format!(
                "link add {HOST_IFACE} netns {} address {mac} mtu {mtu} type veth peer name {IPU_HOST_PORT} netns {} mtu {mtu}\n",
                ns.name(),
                ipu.name(),
            ));
            root_script.push_str(&format!(
                "link add {IPU_FABRIC_PORT} netns {} mtu {mtu} type veth peer name p{i} netns {} mtu {mtu}\n",
                ipu.name(),
                switch.name(),
            ));
            hosts.push(IpuHost { ns, addr: host_addr(i), addr6: host_addr6(i), ipu, switch_port: format!("p{i}") });
        }
        // From here on `star` owns everything, so an error below still tears it all down.
        let mut star =
            IpuStar { wires: Vec::new(), hosts, switch, prefix, faults: Arc::new(Mutex::new(Vec::new())), _backlog: backlog };
        cmd::ip_batch(None, &root_script)?;
        let mut sw_script = String::new();
        for h in &star.hosts {
            sw_script.push_str(&format!("link set {} master {BRIDGE} up\n", h.switch_port));
        }
        cmd::ip_batch(Some(star.switch.name()), &sw_script)?;
        for h in &star.hosts {
            cmd::ip_batch(
                Some(h.ipu.name()),
                &format!("link set lo up\nlink set {IPU_HOST_PORT} up\nlink set {IPU_FABRIC_PORT} up\n"),
            )?;
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
                for (ns, iface) in
                    [(&h.ns, HOST_IFACE), (&h.ipu, IPU_HOST_PORT), (&h.ipu, IPU_FABRIC_PORT), (&star.switch, h.switch_port.as_str())]
                {
                    tuning::set_offloads(&ns.handle(), iface, false, Some(false))?;
                }
            }
        }
        if cfg.rps {
            let ports: Vec<&str> = star.hosts.iter().map(|h| h.switch_port.as_str()).collect();
            tuning::enable_rps(&star.switch.handle(), &ports)?;
            for h in &star.hosts {
                tuning::enable_rps(&h.ns.handle(), &[HOST_IFACE])?;
                tuning::enable_rps(&h.ipu.handle(), &[IPU_HOST_PORT, IPU_FABRIC_PORT])?;
            }
        }
        for (i, h) in star.hosts.iter().enumerate() {
            let log = std::env::temp_dir().join(format!("{}-ipu{i}-wire.log", star.prefix));
            let stderr = std::fs::File::create(&log).map_err(|e| Error::file(&log, e))?;
            let mut c = h.ipu.command(&cfg.ringside_bin);
            c.args(["ipu-wire", "--host-port", IPU_HOST_PORT, "--fabric-port", IPU_FABRIC_PORT, "--stats-every", "0"])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(stderr);
            let child = c.spawn().map_err(|source| Error::Spawn { command: format!("{} ipu-wire", cfg.ringside_bin.display()), source })?;
            star.wires.push(Wire { child: Some(child), log });
        }
        star.wait_ready(cfg.settle_timeout)?;
        tracing::info!(prefix = %star.prefix, hosts = star.hosts.len(), "ipu star is up");
        Ok(star)
    }

    /// The `rs-<pid>-<n>` prefix shared by this rig's namespaces.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn host(&self, index: usize) -> Result<&IpuHost> {
        self.hosts.get(index).ok_or(Error::NoSuchHost { index, hosts: self.hosts.len() })
    }

    /// IPU `index`'s namespace (where its agent runs, on [`IPU_FABRIC_PORT`]).
    pub fn ipu(&self, index: usize) -> Result<&Netns> {
        Ok(&self.host(index)?.ipu)
    }

    /// Stops every IPU's forwarder and returns what each counted (`None` for one that did not
    /// exit cleanly; its log, `$TMPDIR/<prefix>-ipu<i>-wire.log`, is kept then and removed after a
    /// clean exit). The wire is cut afterwards.
    pub fn stop_wires(&mut self) -> Vec<Option<WireReport>> {
        self.wires.iter_mut().map(Wire::stop).collect()
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        cmd::wait_until_ready("ipu star links and forwarders coming up", timeout, || self.not_ready())
    }

    fn not_ready(&mut self) -> Result<Option<String>> {
        for (i, w) in self.wires.iter_mut().enumerate() {
            if let Some(child) = w.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    let log = std::fs::read_to_string(&w.log).unwrap_or_default();
                    return Err(Error::CommandFailed {
                        command: format!("ringside ipu-wire in ipu{i}"),
                        status: status.to_string(),
                        stderr: log.trim().to_string(),
                    });
                }
            }
        }
        for h in &self.hosts {
            let out = cmd::ip(&["-n", h.ns.name(), "-j", "addr", "show", "dev", HOST_IFACE])?;
            let v: serde_json::Value = parse_json("ip addr show", &out)?;
            if v[0]["operstate"] != "UP" {
                return Ok(Some(format!("{} {HOST_IFACE} is {}", h.ns.name(), v[0]["operstate"])));
            }
            if v[0]["addr_info"].as_array().is_some_and(|a| a.iter().any(|a| a["tentative"] == true)) {
                return Ok(Some(format!("{} has tentative addresses", h.ns.name())));
            }
            for port in [IPU_HOST_PORT, IPU_FABRIC_PORT] {
                let mut c = h.ipu.command("tc");
                c.args(["-j", "filter", "show", "dev", port, "ingress"]);
                let out = cmd::run(cmd::Tool::Tc, &mut c, None).unwrap_or_default();
                if !out.contains("ipuwire") {
                    return Ok(Some(format!("no ipuwire filter yet on {} {port}", h.ipu.name())));
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

impl Rig for IpuStar {
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
        let fabric = self.hosts.iter().enumerate().map(|(i, h)| Link {
            name: format!("h{i}"),
            host: Some(i),
            near: Endpoint { ns: h.ipu.handle(), iface: IPU_FABRIC_PORT.into() },
            far: Endpoint { ns: self.switch.handle(), iface: h.switch_port.clone() },
            flap_side: Side::Far,
        });
        let access = self.hosts.iter().enumerate().map(|(i, h)| Link {
            name: format!("a{i}"),
            host: Some(i),
            near: Endpoint { ns: h.ns.handle(), iface: HOST_IFACE.into() },
            far: Endpoint { ns: h.ipu.handle(), iface: IPU_HOST_PORT.into() },
            flap_side: Side::Far,
        });
        fabric.chain(access).collect()
    }

    fn fault_log_handle(&self) -> Arc<Mutex<Vec<FaultRecord>>> {
        self.faults.clone()
    }
}
