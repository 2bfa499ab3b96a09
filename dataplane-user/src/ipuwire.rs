//! The emulated IPU's data path: loads the `ipuwire` forwarder (`dataplane-ebpf/src/ipuwire.rs`)
//! and attaches it on the ingress of the IPU's two ports, so every frame arriving on one port
//! leaves by the other (a bump in the wire, no bridge). `ringside ipu-wire` runs it.
//!
//! Coexistence with the flow monitor on the same port (the agent attaches `flowmon` on the fabric
//! port in the IPU namespace):
//! - The forwarder is always a clsact `tc` filter at priority [`WIRE_PRIORITY`] (65535, the last
//!   slot). A clsact `flowmon` takes a kernel-chosen priority (49152 for the first filter, one
//!   below the lowest existing one after that), so it always runs first on the fabric port's
//!   ingress, returns `TC_ACT_PIPE`, and the forwarder then redirects. A TCX `flowmon` runs
//!   before every clsact filter anyway (`sch_handle_ingress`: tcx first). Were the forwarder first,
//!   its redirect would end classification and the monitor would miss every inbound frame.
//! - Frames redirected from the host port pass the fabric port's egress hook, so `flowmon` on
//!   that egress counts the host's outbound traffic.
//! - The forwarder adds the clsact qdisc when it is missing and never deletes it: deleting it
//!   would delete the agent's filters too. For the same reason, start the forwarder before the
//!   agent: an agent that added the qdisc itself deletes it on exit, and the forwarder's filters
//!   with it (the wire then drops everything, see below).
//!
//! Fail-closed: the program drops (`TC_ACT_SHOT`) every frame it cannot forward, and with no
//! forwarder attached the IPU namespace forwards nothing (no bridge, no routing, no addresses),
//! so an IPU whose forwarder is not running is a cut cable, as a real IPU without firmware is.
//!
//! The map names, the `IPU_PORTS` layout and the `IPU_STATS` indices are repeated from the eBPF
//! source (the shared crate dataplane-common is the flow monitor's); `tests/t1_ipuwire.rs` runs
//! the real program on crafted frames and checks each verdict lands in the [`WireStats`] field
//! named for it, so a drift fails there.
use aya::{
    maps::{Array, MapError, PerCpuArray},
    programs::{
        tc::{self, NlOptions, SchedClassifierLinkId, TcAttachOptions, TcError},
        ProgramError, SchedClassifier, TcAttachType,
    },
    Ebpf, EbpfError,
};

use crate::{loader, object, privileges};

/// Name of the program in the object (its `tc filter` name is the same).
pub const PROGRAM: &str = "ipuwire";
/// `[host ifindex, fabric ifindex]`.
pub const PORTS_MAP: &str = "IPU_PORTS";
/// The fabric port's MAC (one u64, see [`mac_to_u64`]): frames for it are delivered locally.
pub const LOCAL_MAC_MAP: &str = "IPU_LOCAL_MAC";
/// Per-CPU frame counters, indexed as [`WireStats`]'s fields.
pub const STATS_MAP: &str = "IPU_STATS";
/// The forwarder's clsact priority: last, after any flow monitor (see the module docs).
pub const WIRE_PRIORITY: u16 = u16::MAX;

const STAT_TO_FABRIC: u32 = 0;
const STAT_TO_HOST: u32 = 1;
const STAT_UNCONFIGURED: u32 = 2;
const STAT_FOREIGN_PORT: u32 = 3;
const STAT_REDIRECT_FAILED: u32 = 4;
const STAT_TO_LOCAL: u32 = 5;

/// `IPU_LOCAL_MAC`'s encoding: the MAC's bytes 0..6 of a little-endian u64.
pub fn mac_to_u64(mac: [u8; 6]) -> u64 {
    u64::from_le_bytes([mac[0], mac[1], mac[2], mac[3], mac[4], mac[5], 0, 0])
}

/// The hardware address of `iface` in the caller's network namespace, asked of the kernel with
/// `SIOCGIFHWADDR` on a socket (sockets belong to the namespace they are created in; reading
/// /sys/class/net would show the namespace /sys was mounted for, which after a bare `setns` is
/// not this one).
pub fn interface_mac(iface: &str) -> std::io::Result<[u8; 6]> {
    // SAFETY: plain syscalls on a socket this function owns and closes; `req` is a zeroed ifreq
    // whose name is NUL-terminated (checked length), as SIOCGIFHWADDR expects.
    unsafe {
        let mut req: libc::ifreq = std::mem::zeroed();
        let name = iface.as_bytes();
        if name.is_empty() || name.len() >= req.ifr_name.len() {
            return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
        }
        for (d, s) in req.ifr_name.iter_mut().zip(name) {
            *d = *s as libc::c_char;
        }
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let rc = libc::ioctl(fd, libc::SIOCGIFHWADDR as _, &mut req);
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        if rc < 0 {
            return Err(err);
        }
        let sa = req.ifr_ifru.ifru_hwaddr;
        Ok(std::array::from_fn(|i| sa.sa_data[i] as u8))
    }
}

/// The forwarder's counters, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WireStats {
    /// Frames from the host port handed to the fabric port.
    pub to_fabric: u64,
    /// Frames from the fabric port handed to the host port.
    pub to_host: u64,
    /// Frames dropped because the port map was not set.
    pub unconfigured: u64,
    /// Frames dropped because they arrived on neither port.
    pub foreign_port: u64,
    /// Frames dropped because `bpf_redirect` refused.
    pub redirect_failed: u64,
    /// Frames from the fabric port for the fabric port's own MAC, passed to the IPU's stack
    /// (managed collectives: the IPU's fabric address).
    #[serde(default)]
    pub to_local: u64,
}

/// Errors setting up the forwarder. Each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error(transparent)]
    Privileges(#[from] privileges::PrivilegeError),
    #[error(transparent)]
    Loader(#[from] loader::LoaderError),
    #[error(transparent)]
    MissingObject(#[from] object::MissingObject),
    #[error("--host-port and --fabric-port are both `{port}`; the wire needs two different interfaces of this network namespace")]
    SamePort { port: String },
    #[error("the kernel rejected the ipuwire object: {0}; run with RUST_LOG=debug and check `dmesg`")]
    Load(#[source] EbpfError),
    #[error("the ipuwire object has no {what} `{name}`; rebuild it with `cargo xtask build`")]
    MissingItem { what: &'static str, name: &'static str },
    #[error("cannot read the MAC of `{iface}` (SIOCGIFHWADDR): {source}; is it an Ethernet interface of this network namespace?")]
    Mac { iface: String, source: std::io::Error },
    #[error("the kernel rejected program `ipuwire`: {0}; the verifier log is in the error chain (RUST_LOG=debug)")]
    Program(#[source] ProgramError),
    #[error("cannot write or read map `{name}`: {source}")]
    Map { name: &'static str, source: MapError },
    #[error("cannot add the clsact qdisc to `{iface}`: {source}; check `tc qdisc show dev {iface}`")]
    Qdisc { iface: String, source: TcError },
    #[error("cannot attach ipuwire to the ingress of `{iface}`: {source}; check `tc filter show dev {iface} ingress` (priority {WIRE_PRIORITY} must be free)")]
    Attach { iface: String, source: ProgramError },
}

/// The forwarder, attached. Dropping it detaches both filters (the wire then drops everything).
pub struct IpuWire {
    ebpf: Ebpf,
    links: Vec<(String, SchedClassifierLinkId)>,
    host_port: String,
    fabric_port: String,
}

impl IpuWire {
    /// Loads the forwarder, sets its ports and attaches it on both ports' ingress. On error,
    /// whatever was attached is detached again (by `Drop`).
    pub fn attach(host_port: &str, fabric_port: &str) -> Result<IpuWire, WireError> {
        if host_port == fabric_port {
            return Err(WireError::SamePort { port: host_port.to_owned() });
        }
        privileges::check_agent()?;
        loader::check_btf()?;
        loader::raise_memlock();
        let host = loader::ifindex(host_port)?;
        let fabric = loader::ifindex(fabric_port)?;
        let ebpf = Ebpf::load(object::ipuwire_object()?).map_err(WireError::Load)?;
        let mut wire = IpuWire { ebpf, links: Vec::new(), host_port: host_port.to_owned(), fabric_port: fabric_port.to_owned() };
        {
            let map = wire.ebpf.map_mut(PORTS_MAP).ok_or(WireError::MissingItem { what: "map", name: PORTS_MAP })?;
            let mut ports: Array<_, u32> = Array::try_from(map).map_err(|source| WireError::Map { name: PORTS_MAP, source })?;
            // Written before the attach, so the program never sees a half-set map in service.
            ports.set(0, host, 0).map_err(|source| WireError::Map { name: PORTS_MAP, source })?;
            ports.set(1, fabric, 0).map_err(|source| WireError::Map { name: PORTS_MAP, source })?;
            // The fabric port's own MAC: frames for it reach this namespace's stack (where a
            // managed collective service listens on the IPU's fabric address) instead of the host.
            let mac = interface_mac(fabric_port).map_err(|source| WireError::Mac { iface: fabric_port.to_owned(), source })?;
            let map = wire.ebpf.map_mut(LOCAL_MAC_MAP).ok_or(WireError::MissingItem { what: "map", name: LOCAL_MAC_MAP })?;
            let mut local: Array<_, u64> = Array::try_from(map).map_err(|source| WireError::Map { name: LOCAL_MAC_MAP, source })?;
            local.set(0, mac_to_u64(mac), 0).map_err(|source| WireError::Map { name: LOCAL_MAC_MAP, source })?;
        }
        let prog: &mut SchedClassifier = wire
            .ebpf
            .program_mut(PROGRAM)
            .ok_or(WireError::MissingItem { what: "program", name: "ipuwire" })?
            .try_into()
            .map_err(WireError::Program)?;
        prog.load().map_err(WireError::Program)?;
        for iface in [host_port, fabric_port] {
            match tc::qdisc_add_clsact(iface) {
                Ok(()) => {}
                Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => {}
                Err(source) => return Err(WireError::Qdisc { iface: iface.to_owned(), source }),
            }
            let options = TcAttachOptions::Netlink(NlOptions { priority: WIRE_PRIORITY, ..NlOptions::default() });
            let id = prog
                .attach_with_options(iface, TcAttachType::Ingress, options)
                .map_err(|source| WireError::Attach { iface: iface.to_owned(), source })?;
            wire.links.push((iface.to_owned(), id));
        }
        tracing::info!(host_port, host_ifindex = host, fabric_port, fabric_ifindex = fabric, priority = WIRE_PRIORITY, "ipuwire forwarding");
        Ok(wire)
    }

    pub fn host_port(&self) -> &str {
        &self.host_port
    }

    pub fn fabric_port(&self) -> &str {
        &self.fabric_port
    }

    /// The counters, summed over CPUs.
    pub fn stats(&self) -> Result<WireStats, WireError> {
        wire_stats(&self.ebpf)
    }

    /// Detaches both filters; returns what could not be undone, for the log.
    pub fn detach(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(prog) = self.ebpf.program_mut(PROGRAM) {
            if let Ok(prog) = <&mut SchedClassifier>::try_from(prog) {
                for (iface, id) in self.links.drain(..) {
                    if let Err(e) = prog.detach(id) {
                        problems.push(format!("detach ipuwire from the ingress of {iface}: {e}"));
                    }
                }
            }
        }
        problems
    }
}

/// The counters of a loaded `ipuwire` object (attached or not: the T1 test runs it with
/// `BPF_PROG_TEST_RUN`), summed over CPUs.
pub fn wire_stats(ebpf: &Ebpf) -> Result<WireStats, WireError> {
    let map = ebpf.map(STATS_MAP).ok_or(WireError::MissingItem { what: "map", name: STATS_MAP })?;
    let stats: PerCpuArray<_, u64> = PerCpuArray::try_from(map).map_err(|source| WireError::Map { name: STATS_MAP, source })?;
    let sum = |index: u32| -> Result<u64, WireError> {
        let values = stats.get(&index, 0).map_err(|source| WireError::Map { name: STATS_MAP, source })?;
        Ok(values.iter().sum())
    };
    Ok(WireStats {
        to_fabric: sum(STAT_TO_FABRIC)?,
        to_host: sum(STAT_TO_HOST)?,
        unconfigured: sum(STAT_UNCONFIGURED)?,
        foreign_port: sum(STAT_FOREIGN_PORT)?,
        redirect_failed: sum(STAT_REDIRECT_FAILED)?,
        to_local: sum(STAT_TO_LOCAL)?,
    })
}

impl Drop for IpuWire {
    fn drop(&mut self) {
        for p in self.detach() {
            tracing::warn!("teardown: {p}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_port_twice_is_refused_before_anything_is_loaded() {
        let e = IpuWire::attach("eth0", "eth0").err().expect("refused").to_string();
        assert!(e.contains("two different interfaces"), "{e}");
    }

    #[test]
    fn loopback_has_the_zero_mac_and_unknown_interfaces_fail() {
        assert_eq!(interface_mac("lo").unwrap(), [0; 6]);
        assert!(interface_mac("no-such-if0").is_err());
        assert!(interface_mac("").is_err());
    }

    #[test]
    fn macs_encode_as_the_program_reads_them() {
        assert_eq!(mac_to_u64([1, 2, 3, 4, 5, 6]), 0x0605_0403_0201);
    }
}
