//! [`MirrorPort`]: a copy of every frame that crosses one switch port, delivered to an interface
//! in another namespace, the way a switch's SPAN port or a DPU's mirror hands hardware-carried
//! RoCE to an agent that never sees it on the host.
//!
//! ```text
//!   switch namespace                               watcher namespace (e.g. the agent's host)
//!   p<i> ── clsact ingress ─┐ u32 (every frame)
//!        └─ clsact egress ──┴ mirred egress mirror ─▶ mir<i> ──veth── <iface> (no address)
//! ```
//!
//! `tc filter add dev p<i> ingress|egress protocol all u32 match u32 0 0 action mirred egress
//! mirror dev mir<i>` (a u32 filter matching every frame: the CI kernels have no `matchall`
//! classifier, `CONFIG_NET_CLS_MATCHALL` is off; on a switch `matchall` is the usual spelling): the
//! original frame goes on untouched, a clone leaves through `mir<i>`. Frames from host i enter
//! the switch at `p<i>`'s ingress and frames to it leave at its egress, so the copy holds both
//! directions of host i's traffic, once each. The watcher's end has no address and no IPv6, so its
//! namespace sends nothing on it and routes nothing from it (the copies are addressed to other
//! MACs: the stack drops them as "other host" after packet sockets have seen them).
//!
//! Drop removes the filters and the veth pair. Tearing down the rig first is fine too: the
//! namespaces take the links and qdiscs with them.
use std::process::Command;

use crate::cmd::{self, Tool};
use crate::error::Result;
use crate::netns::NetnsHandle;
use crate::star::Star;

/// A mirror of one switch port; see the module docs. Drop removes it.
#[derive(Debug)]
pub struct MirrorPort {
    switch: NetnsHandle,
    /// The mirrored switch port (`p<i>`).
    pub port: String,
    /// The switch's end of the mirror veth (`mir<i>`).
    pub switch_end: String,
    /// The watcher's end: where the copies arrive.
    pub watcher: NetnsHandle,
    pub iface: String,
    /// This mirror added the clsact qdisc (else it only removes its own filters).
    added_qdisc: bool,
}

/// Preference of the mirror's filters, so Drop removes exactly those.
const FILTER_PREF: &str = "4900";

fn tc(ns: &NetnsHandle, args: &[&str]) -> Result<String> {
    let mut c: Command = ns.command("tc");
    c.args(args);
    cmd::run(Tool::Tc, &mut c, None)
}

impl MirrorPort {
    /// Mirrors switch port `p<host>` of `star` (both directions) to a new interface `iface` in
    /// `watcher` (a namespace of the rig, such as a host's).
    pub fn on_star(star: &Star, host: usize, watcher: &NetnsHandle, iface: &str) -> Result<MirrorPort> {
        let port = star.host(host)?.switch_port.clone();
        let switch = star.switch.handle();
        let switch_end = format!("mir{host}");
        cmd::ip_batch(
            None,
            &format!("link add {switch_end} netns {} type veth peer name {iface} netns {}\n", switch.name(), watcher.name()),
        )?;
        // From here on Drop cleans up whatever was made.
        let mut m = MirrorPort { switch, port, switch_end, watcher: watcher.clone(), iface: iface.to_owned(), added_qdisc: false };
        m.watcher.sysctl_write(&format!("net/ipv6/conf/{iface}/disable_ipv6"), "1")?;
        cmd::ip_batch(Some(m.watcher.name()), &format!("link set {iface} up\n"))?;
        cmd::ip_batch(Some(m.switch.name()), &format!("link set {} up\n", m.switch_end))?;
        let has_clsact = tc(&m.switch, &["qdisc", "show", "dev", &m.port])?.contains("clsact");
        if !has_clsact {
            tc(&m.switch, &["qdisc", "add", "dev", &m.port, "clsact"])?;
            m.added_qdisc = true;
        }
        for hook in ["ingress", "egress"] {
            tc(
                &m.switch,
                &[
                    "filter", "add", "dev", &m.port, hook, "pref", FILTER_PREF, "protocol", "all", "u32", "match", "u32", "0", "0", "action", "mirred",
                    "egress", "mirror", "dev", &m.switch_end,
                ],
            )?;
        }
        tracing::info!(port = %m.port, to = %format!("{}/{}", m.watcher.name(), m.iface), "switch port mirrored");
        Ok(m)
    }
}

impl Drop for MirrorPort {
    fn drop(&mut self) {
        // Errors are expected when the rig is already gone; nothing else holds these objects.
        if self.added_qdisc {
            let _ = tc(&self.switch, &["qdisc", "del", "dev", &self.port, "clsact"]);
        } else {
            for hook in ["ingress", "egress"] {
                let _ = tc(&self.switch, &["filter", "del", "dev", &self.port, hook, "pref", FILTER_PREF]);
            }
        }
        let _ = cmd::ip_batch(Some(self.switch.name()), &format!("link del {}\n", self.switch_end));
    }
}
