//! The Linux capabilities `ringside agent` needs, checked before it touches the kernel.
//!
//! The agent needs exactly three (deploy/systemd/ringside.service, deploy/kubernetes/daemonset.yaml
//! and docs/operator-guide.md "Deployment" grant only these):
//!
//! - `CAP_BPF`: the `bpf()` syscall: create the maps, load the BTF and the program, pin the maps.
//! - `CAP_NET_ADMIN`: load a networking program type (`BPF_PROG_TYPE_SCHED_CLS` needs
//!   `bpf_net_capable()`, kernel/bpf/syscall.c) and attach it: the clsact qdisc and tc filters over
//!   rtnetlink, or a tcx link.
//! - `CAP_PERFMON`: the verifier's "privileged" mode (`bpf_allow_ptr_leaks`,
//!   `bpf_bypass_spec_v1/v4` in include/linux/bpf.h). Without it the classifier is rejected:
//!   on 6.18 with CAP_BPF and CAP_NET_ADMIN alone, BPF_PROG_LOAD fails with EACCES and the
//!   verifier log says `R3 pointer -= pointer prohibited` (the packet-length arithmetic on
//!   `data_end - data`).
//!
//! `CAP_SYS_ADMIN` stands in for `CAP_BPF` and `CAP_PERFMON` (the kernel's `bpf_capable()` and
//! `perfmon_capable()` accept it; kernels before 5.8 know only it), never for `CAP_NET_ADMIN`.
//! So full root passes, and so does a process with exactly the three.
//!
//! What the agent reads is its *effective* set (`CapEff` in /proc/self/status): that is what the
//! kernel checks. A binary started by a non-root user gets the capabilities as ambient ones
//! (systemd `AmbientCapabilities=`, `setpriv --ambient-caps`) or from file capabilities
//! (`setcap ...+ep`).
use std::{fmt, io};

/// One capability the agent needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capability {
    /// `CAP_BPF`, as in capabilities(7).
    pub name: &'static str,
    /// Bit number (include/uapi/linux/capability.h).
    pub bit: u32,
    /// What the agent does with it.
    pub why: &'static str,
}

pub const CAP_NET_ADMIN: Capability =
    Capability { name: "CAP_NET_ADMIN", bit: 12, why: "load a TC (sched_cls) program and attach it to interfaces (clsact qdisc, tc filters, tcx links)" };
pub const CAP_BPF: Capability = Capability { name: "CAP_BPF", bit: 39, why: "create the eBPF maps, load the program and pin the maps in bpffs" };
pub const CAP_PERFMON: Capability =
    Capability { name: "CAP_PERFMON", bit: 38, why: "have the verifier accept the classifier's pointer arithmetic (without it: `pointer -= pointer prohibited`)" };
/// Bit of `CAP_SYS_ADMIN`, which the kernel accepts in place of `CAP_BPF` and `CAP_PERFMON`.
pub const CAP_SYS_ADMIN_BIT: u32 = 21;

/// What `ringside agent` needs, in the order messages name them.
pub const AGENT_CAPABILITIES: [Capability; 3] = [CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON];

/// The capabilities the agent lacks.
#[derive(Debug)]
pub struct Missing(pub Vec<Capability>);

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|c| format!("{} (to {})", c.name, c.why)).collect();
        f.write_str(&parts.join(", "))
    }
}

/// Why the agent will not start.
#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    #[error(
        "ringside lacks {0}; `ringside agent` needs CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON, `ringside detach` CAP_BPF and CAP_NET_ADMIN (or root). Grant them: \
         under systemd `AmbientCapabilities=CAP_BPF CAP_NET_ADMIN CAP_PERFMON` with the same CapabilityBoundingSet= \
         (deploy/systemd/ringside.service); on a binary, `setcap cap_bpf,cap_net_admin,cap_perfmon+ep /usr/local/bin/ringside`; \
         in Kubernetes, securityContext.capabilities.add: [BPF, NET_ADMIN, PERFMON] (deploy/kubernetes/daemonset.yaml); \
         or run it as root"
    )]
    Missing(Missing),
    #[error("cannot read the process's capabilities from /proc/self/status: {0}; is /proc mounted?")]
    Read(#[source] io::Error),
}

/// The effective capability mask from the text of `/proc/self/status` (`CapEff:` in hex).
pub fn parse_cap_eff(status: &str) -> Option<u64> {
    status.lines().find_map(|l| l.strip_prefix("CapEff:")).and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

/// What `ringside detach` needs: remove tc filters and the qdisc, unlink pins.
pub const DETACH_CAPABILITIES: [Capability; 2] = [CAP_BPF, CAP_NET_ADMIN];

/// Of [`AGENT_CAPABILITIES`], those `cap_eff` lacks (`CAP_SYS_ADMIN` covers `CAP_BPF` and
/// `CAP_PERFMON`).
pub fn missing_for_agent(cap_eff: u64) -> Vec<Capability> {
    missing_of(&AGENT_CAPABILITIES, cap_eff)
}

fn missing_of(needed: &[Capability], cap_eff: u64) -> Vec<Capability> {
    let has = |bit: u32| cap_eff & (1u64 << bit) != 0;
    needed
        .iter()
        .copied()
        .filter(|c| {
            let by_sys_admin = c.bit != CAP_NET_ADMIN.bit && has(CAP_SYS_ADMIN_BIT);
            !(has(c.bit) || by_sys_admin)
        })
        .collect()
}

/// This process's effective capabilities.
pub fn effective() -> Result<u64, PrivilegeError> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(PrivilegeError::Read)?;
    parse_cap_eff(&status).ok_or_else(|| PrivilegeError::Read(io::Error::other("no CapEff line")))
}

/// Fails, naming each missing capability and how to grant it, unless the process may run the
/// agent. Called by `ringside agent` before it binds or touches the kernel.
pub fn check_agent() -> Result<(), PrivilegeError> {
    check(&AGENT_CAPABILITIES)
}

/// [`check_agent`] for `ringside detach`, which needs only [`DETACH_CAPABILITIES`].
pub fn check_detach() -> Result<(), PrivilegeError> {
    check(&DETACH_CAPABILITIES)
}

fn check(needed: &[Capability]) -> Result<(), PrivilegeError> {
    let missing = missing_of(needed, effective()?);
    if missing.is_empty() {
        tracing::debug!(needed = ?needed.iter().map(|c| c.name).collect::<Vec<_>>(), "capabilities present");
        Ok(())
    } else {
        Err(PrivilegeError::Missing(Missing(missing)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn bits(caps: &[Capability]) -> u64 {
        let mut m = 0u64;
        let mut i = 0;
        while i < caps.len() {
            m |= 1 << caps[i].bit;
            i += 1;
        }
        m
    }

    #[test]
    fn exactly_three_suffice_and_each_is_needed() {
        let three = bits(&AGENT_CAPABILITIES);
        assert!(missing_for_agent(three).is_empty());
        for cap in AGENT_CAPABILITIES {
            let missing = missing_for_agent(three & !(1 << cap.bit));
            assert_eq!(missing, vec![cap], "without {}", cap.name);
            let msg = PrivilegeError::Missing(Missing(missing)).to_string();
            assert!(msg.contains(cap.name) && msg.contains("AmbientCapabilities") && msg.contains("setcap") && msg.contains("securityContext"), "{msg}");
        }
        assert_eq!(missing_for_agent(0), AGENT_CAPABILITIES.to_vec());
    }

    #[test]
    fn sys_admin_stands_in_for_bpf_and_perfmon_not_net_admin() {
        assert_eq!(missing_for_agent(1 << CAP_SYS_ADMIN_BIT), vec![CAP_NET_ADMIN]);
        assert!(missing_for_agent((1 << CAP_SYS_ADMIN_BIT) | (1 << CAP_NET_ADMIN.bit)).is_empty());
        // Full root on this kernel (41 capabilities).
        assert!(missing_for_agent(0x1ff_ffff_ffff).is_empty());
    }

    #[test]
    fn parses_proc_status() {
        let status = "Name:\tringside\nCapInh:\t0000000000000000\nCapPrm:\t000000c000001000\nCapEff:\t000000c000001000\n";
        let eff = parse_cap_eff(status).unwrap();
        assert_eq!(eff, bits(&AGENT_CAPABILITIES));
        assert_eq!(parse_cap_eff("CapEff:\tzz\n"), None);
        assert_eq!(parse_cap_eff("Name:\tx\n"), None);
        // This process's own line parses (whatever it holds).
        effective().unwrap();
    }
}
