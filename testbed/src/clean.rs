//! [`clean`]: removes what crashed runs left behind: `rs-*` namespaces whose creating process is
//! gone (see the naming invariant in [`crate::netns`]), a raised `net.core.netdev_max_backlog`
//! (see [`crate::tuning`]) and job output directories of processes that are gone (see
//! [`crate::job::stale_job_dirs`]). It sits above both, so neither imports the other.

use std::path::Path;

use crate::cmd;
use crate::error::Result;
use crate::netns::{creator_pid, list_rig_namespaces, pid_alive, NETNS_RUN_DIR};
use crate::tuning;

/// What [`clean`] did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CleanReport {
    /// Namespaces deleted.
    pub removed: Vec<String>,
    /// `rs-` namespaces kept because their creating process is alive (empty with `all`).
    pub kept: Vec<String>,
    /// Namespaces we tried to delete but could not, with the error.
    pub failed: Vec<(String, String)>,
    /// Whether a stale raised `net.core.netdev_max_backlog` was restored.
    pub backlog_restored: Option<u64>,
    /// Job output directories under the temp dir left by processes that are gone
    /// (`ringside-{job,mpi,torch}-PID-N`, see [`crate::job::stale_job_dirs`]), removed.
    pub job_dirs_removed: Vec<std::path::PathBuf>,
}

/// Deletes leftover testbed namespaces: every `rs-*` namespace whose creating process is gone, or
/// every `rs-*` namespace with `all` (this also breaks rigs of runs still in progress). Interfaces,
/// qdiscs and nftables tables inside a namespace die with it. Also restores a
/// `net.core.netdev_max_backlog` left raised by a crashed run, and removes the job output
/// directories (`ringside-{job,mpi,torch}-PID-N` under the temp dir) of processes that are gone.
pub fn clean(all: bool) -> Result<CleanReport> {
    cmd::require_root()?;
    let mut report = CleanReport::default();
    for name in list_rig_namespaces()? {
        let stale = match creator_pid(&name) {
            Some(pid) => !pid_alive(pid),
            None => false,
        };
        if !(all || stale) {
            report.kept.push(name);
            continue;
        }
        match cmd::ip(&["netns", "delete", &name]) {
            Ok(_) => report.removed.push(name),
            // A concurrent `clean` (another test process) got there first.
            Err(_) if !Path::new(NETNS_RUN_DIR).join(&name).exists() => {}
            Err(e) => report.failed.push((name, e.to_string())),
        }
    }
    report.backlog_restored = tuning::restore_stale_backlog()?;
    for dir in crate::job::stale_job_dirs(&std::env::temp_dir()) {
        if std::fs::remove_dir_all(&dir).is_ok() {
            report.job_dirs_removed.push(dir);
        }
    }
    Ok(report)
}
