//! Managed collectives on an [`IpuStar`]: the host ↔ IPU link and the IPUs' fabric addresses that
//! `ringside-ipu` needs, and the services themselves.
//!
//! ```text
//!   host i ns                              IPU i ns
//!   pcie0 10.78.i.2/30 ────── veth ────── pcie 10.78.i.1/30        (host link: tenant ↔ service)
//!   eth0  10.77.0.(i+1) ──── veth ────── host ─[ipuwire]─ fabric 10.77.1.(i+1)/24 ── switch
//! ```
//!
//! - The host link is a dedicated veth pair (`pcie0` in the host, `pcie` in the IPU), the stand-in
//!   for PCIe; the forwarder never sees it. The tenant reaches its own IPU's service there and
//!   nothing else of the IPU (the IPU does not route between its ports).
//! - The IPU's fabric address sits on its `fabric` port. The forwarder delivers frames addressed
//!   to that port's MAC to the IPU's own stack and forwards everything else (see
//!   `dataplane-ebpf/src/ipuwire.rs`), so the services' traffic crosses the same cable, switch port
//!   and faults as the tenants' (link `h<i>` of the rig). Broadcasts are still forwarded to the
//!   host, so ARP cannot resolve an IPU: every IPU gets permanent neighbour entries for the
//!   others' fabric addresses instead. 10.77.1.0/24 is not on the hosts' subnet; a tenant has no
//!   route to it (a tenant that adds one reaches other IPUs' services like any fabric host:
//!   the services authenticate nothing, as the rank mesh does not).
//! - [`ManagedServices`] runs one `ringside-ipu` per rank in the IPU namespaces; drop stops them
//!   (SIGTERM, then SIGKILL after 5 s). The links go with the namespaces when the star drops.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::cmd::{self, parse_json};
use crate::error::{Error, Result};
use crate::ipu::{IpuStar, IPU_FABRIC_PORT};

/// The host's end of the host ↔ IPU link.
pub const HOST_LINK_HOST_IFACE: &str = "pcie0";
/// The IPU's end of the host ↔ IPU link.
pub const HOST_LINK_IPU_IFACE: &str = "pcie";
/// Name of the managed collective service binary (ipu-firmware).
pub const SERVICE_BINARY: &str = "ringside-ipu";

/// IPU i's address on its host link (where `ringside-ipu --listen` binds): 10.78.i.1.
pub fn ipu_link_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 78, i as u8, 1)
}

/// Host i's address on its host link: 10.78.i.2.
pub fn host_link_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 78, i as u8, 2)
}

/// IPU i's fabric address (where the services reach each other): 10.77.1.(i+1).
pub fn ipu_fabric_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, 1, (i + 1) as u8)
}

/// Adds every host's host link and every IPU's fabric address (with static neighbours) to a
/// running [`IpuStar`]. Idempotence is not attempted: call once per star.
pub fn enable_managed(star: &IpuStar) -> Result<()> {
    let mut root = String::new();
    for h in &star.hosts {
        root.push_str(&format!(
            "link add {HOST_LINK_HOST_IFACE} netns {} type veth peer name {HOST_LINK_IPU_IFACE} netns {}\n",
            h.ns.name(),
            h.ipu.name()
        ));
    }
    cmd::ip_batch(None, &root)?;
    let mut macs = Vec::with_capacity(star.hosts.len());
    for (i, h) in star.hosts.iter().enumerate() {
        cmd::ip_batch(
            Some(h.ipu.name()),
            &format!(
                "addr add {}/30 dev {HOST_LINK_IPU_IFACE}\nlink set {HOST_LINK_IPU_IFACE} up\naddr add {}/24 dev {IPU_FABRIC_PORT}\n",
                ipu_link_addr(i),
                ipu_fabric_addr(i)
            ),
        )?;
        cmd::ip_batch(Some(h.ns.name()), &format!("addr add {}/30 dev {HOST_LINK_HOST_IFACE}\nlink set {HOST_LINK_HOST_IFACE} up\n", host_link_addr(i)))?;
        let out = cmd::ip(&["-n", h.ipu.name(), "-j", "link", "show", "dev", IPU_FABRIC_PORT])?;
        let v = parse_json("ip link show", &out)?;
        let mac = v[0]["address"].as_str().ok_or_else(|| Error::BadOutput { command: "ip link show".into(), detail: format!("no address for {IPU_FABRIC_PORT}: {out}") })?;
        macs.push(mac.to_string());
    }
    for (i, h) in star.hosts.iter().enumerate() {
        let script: String = macs
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(j, mac)| format!("neigh replace {} lladdr {mac} dev {IPU_FABRIC_PORT} nud permanent\n", ipu_fabric_addr(j)))
            .collect();
        if !script.is_empty() {
            cmd::ip_batch(Some(h.ipu.name()), &script)?;
        }
    }
    let start = Instant::now();
    cmd::wait_until_ready("host links coming up", Duration::from_secs(15), || {
        for h in &star.hosts {
            for (ns, iface) in [(h.ns.name(), HOST_LINK_HOST_IFACE), (h.ipu.name(), HOST_LINK_IPU_IFACE)] {
                let out = cmd::ip(&["-n", ns, "-j", "link", "show", "dev", iface])?;
                let v = parse_json("ip link show", &out)?;
                if v[0]["operstate"] != "UP" {
                    return Ok(Some(format!("{ns} {iface} is {}", v[0]["operstate"])));
                }
            }
        }
        Ok(None)
    })?;
    tracing::info!(prefix = star.prefix(), waited_ms = start.elapsed().as_millis() as u64, "managed links up");
    Ok(())
}

/// How to run the services.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Ranks: services on IPUs 0..ranks.
    pub ranks: usize,
    /// The services' mesh port on their fabric addresses.
    pub fabric_port: u16,
    /// The port each service listens on at its host-link address (the tenant's `--managed`).
    pub listen_port: u16,
    /// The binary; `ringside-ipu` next to the current executable when `None`.
    pub bin: Option<PathBuf>,
    /// Arguments for every service (initial plan, `--max-channels`, timeouts).
    pub args: Vec<String>,
    /// Arguments for one rank's service only, index = rank (`--agent URL --constraints FILE`:
    /// each IPU's agent registers the job under its own id); ranks past the end get none.
    pub rank_args: Vec<Vec<String>>,
    /// `RINGSIDE_TOKEN` for one rank's service, index = rank (the job's tenant token at that
    /// IPU's agent); ranks past the end get none.
    pub tokens: Vec<Option<String>>,
    /// Where `ipu-<i>.log` go.
    pub log_dir: PathBuf,
}

/// The tenant's `--managed` address for the rank on host `i`.
pub fn service_addr(i: usize, listen_port: u16) -> SocketAddr {
    SocketAddr::new(ipu_link_addr(i).into(), listen_port)
}

/// `ringside-ipu` next to the current executable (or one directory up, for test binaries).
pub fn find_service_binary(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return if p.is_file() { Ok(p.to_path_buf()) } else { Err(Error::RankBinaryMissing { binary: p.to_path_buf() }) };
    }
    let exe = std::env::current_exe().map_err(|e| Error::file("/proc/self/exe", e))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let candidates = [dir.join(SERVICE_BINARY), dir.join("..").join(SERVICE_BINARY)];
    candidates.iter().find(|c| c.is_file()).cloned().ok_or_else(|| Error::RankBinaryMissing { binary: candidates[0].clone() })
}

/// Running services; stopped on drop.
#[derive(Debug)]
pub struct ManagedServices {
    children: Vec<(Child, PathBuf)>,
    stopped: bool,
}

impl ManagedServices {
    /// Starts one `ringside-ipu` per rank in IPUs 0..ranks of `star` (after [`enable_managed`]).
    pub fn spawn(star: &IpuStar, cfg: &ServiceConfig) -> Result<ManagedServices> {
        if cfg.ranks < 2 || cfg.ranks > star.hosts.len() {
            return Err(Error::InvalidArgument { field: "ranks", reason: format!("{} (need 2..={})", cfg.ranks, star.hosts.len()) });
        }
        let bin = find_service_binary(cfg.bin.as_deref())?;
        std::fs::create_dir_all(&cfg.log_dir).map_err(|e| Error::file(&cfg.log_dir, e))?;
        let peers = (0..cfg.ranks).map(|i| format!("{}:{}", ipu_fabric_addr(i), cfg.fabric_port)).collect::<Vec<_>>().join(",");
        let mut services = ManagedServices { children: Vec::new(), stopped: false };
        for i in 0..cfg.ranks {
            let log = cfg.log_dir.join(format!("ipu-{i}.log"));
            let f = std::fs::File::create(&log).map_err(|e| Error::file(&log, e))?;
            let mut c = star.hosts[i].ipu.command(&bin);
            c.arg("--rank").arg(i.to_string())
                .arg("--world").arg(cfg.ranks.to_string())
                .arg("--peers").arg(&peers)
                .arg("--listen").arg(service_addr(i, cfg.listen_port).to_string())
                .args(&cfg.args);
            if let Some(args) = cfg.rank_args.get(i) {
                c.args(args);
            }
            if let Some(Some(t)) = cfg.tokens.get(i) {
                c.env("RINGSIDE_TOKEN", t);
            }
            c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(f);
            let command = cmd::describe(&c);
            tracing::info!(ipu = i, %command, "starting ringside-ipu");
            let child = c.spawn().map_err(|source| Error::Spawn { command, source })?;
            services.children.push((child, log));
        }
        Ok(services)
    }

    /// The services' log files, index = rank.
    pub fn logs(&self) -> Vec<PathBuf> {
        self.children.iter().map(|(_, l)| l.clone()).collect()
    }

    /// Ranks whose service has exited, with the status (a service runs until stopped).
    pub fn exited(&mut self) -> Vec<(usize, std::process::ExitStatus)> {
        self.children.iter_mut().enumerate().filter_map(|(i, (c, _))| c.try_wait().ok().flatten().map(|s| (i, s))).collect()
    }

    /// Stops every service (SIGTERM, up to 5 s, then SIGKILL).
    pub fn stop(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        for (c, _) in &self.children {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), nix::sys::signal::Signal::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for (c, _) in &mut self.children {
            while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}

impl Drop for ManagedServices {
    fn drop(&mut self) {
        self.stop();
    }
}
