//! [`clean`]: removes what crashed runs left behind: `rs-*` namespaces whose creating process is
//! gone (see the naming invariant in [`crate::netns`]), a raised `net.core.netdev_max_backlog`
//! (see [`crate::tuning`]) and job output directories of processes that are gone (see
//! [`crate::job::stale_job_dirs`]), and the bpffs pin directories of test and eval agents that were
//! killed before they could remove them ([`stale_pin_dirs`]). It sits above both, so neither
//! imports the other.

use std::path::{Path, PathBuf};

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
    /// Agents' pin directories under `/sys/fs/bpf` whose agent is gone (see [`stale_pin_dirs`]),
    /// removed.
    pub pin_dirs_removed: Vec<PathBuf>,
    /// Test and eval agents' scratch files and directories under the temp dir (config, state,
    /// tokens: `ringside-...-PID-...`) whose agent is gone (see [`stale_scratch`]), removed.
    pub scratch_removed: Vec<PathBuf>,
}

/// Where bpffs is mounted; test and eval agents pin under it.
pub const BPFFS_ROOT: &str = "/sys/fs/bpf";

/// The pinned map every ringside agent's pin directory holds.
const PIN_MARKER: &str = dataplane_common::maps::FLOWS;

/// Pin directories directly under `root` that a test or eval agent left: the name starts with
/// `ringside-` or `rs-` and carries its agent's process id as a `-`-separated number (the tests'
/// `ringside-t2d-PID-TAG`, `ringside-TEST-PID-TAG`, `rs-PID-TAG`; the eval's `ringside-TAG-PID`),
/// the directory holds ringside's `FLOWS` pin, and no number in the name is a live process. An
/// operator's `/sys/fs/bpf/ringside` (no number) is never one; a name whose numbers include a live
/// process is kept, so a running agent's pins are never touched.
pub fn stale_pin_dirs(root: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(root) else { return Vec::new() };
    let mut out: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| owner_gone(&e.file_name().to_string_lossy()) && e.path().join(PIN_MARKER).exists())
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

/// Test and eval agents' scratch entries directly under `tmp` (files or directories, e.g.
/// `ringside-t2d-state-PID-TAG`, `ringside-t2d-PID-TAG.toml`, `ringside-TAG-PID`) named as
/// [`stale_pin_dirs`] names pin directories, whose process is gone.
pub fn stale_scratch(tmp: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(tmp) else { return Vec::new() };
    let mut out: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            // `.toml`, `.tokens`: the number before the extension counts too.
            let stem = name.split_once('.').map_or(name.as_str(), |(s, _)| s);
            owner_gone(stem)
        })
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

/// Whether `name` is a test or eval agent's pin directory or scratch file name whose process is
/// gone.
fn owner_gone(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("ringside-").or_else(|| name.strip_prefix("rs-")) else { return false };
    let pids: Vec<i32> = rest.split('-').filter_map(|t| t.parse::<i32>().ok()).collect();
    !pids.is_empty() && !pids.iter().any(|&p| pid_alive(p))
}

/// Deletes leftover testbed namespaces: every `rs-*` namespace whose creating process is gone, or
/// every `rs-*` namespace with `all` (this also breaks rigs of runs still in progress). Interfaces,
/// qdiscs and nftables tables inside a namespace die with it. Also restores a
/// `net.core.netdev_max_backlog` left raised by a crashed run, and removes the job output
/// directories (`ringside-{job,mpi,torch}-PID-N` under the temp dir) of processes that are gone,
/// and test and eval agents' pin directories whose agent is gone ([`stale_pin_dirs`]; after the
/// namespaces, so the interfaces their pinned links held are gone first).
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
    for entry in stale_scratch(&std::env::temp_dir()) {
        let removed = if entry.is_dir() { std::fs::remove_dir_all(&entry) } else { std::fs::remove_file(&entry) };
        if removed.is_ok() {
            report.scratch_removed.push(entry);
        }
    }
    for dir in stale_pin_dirs(Path::new(BPFFS_ROOT)) {
        // Unlinking the pins drops the last reference to the maps and links they held.
        if std::fs::remove_dir_all(&dir).is_ok() {
            report.pin_dirs_removed.push(dir);
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_dir_names_of_gone_agents() {
        // Above any pid_max (at most 2^22): never a live process.
        let gone = i32::MAX - 1;
        let me = std::process::id();
        assert!(owner_gone(&format!("ringside-t2d-{gone}-adapt-torch")));
        assert!(owner_gone(&format!("ringside-t2ipu-{gone}-loss")));
        assert!(owner_gone(&format!("ringside-ratecap-quarter-{gone}")));
        assert!(owner_gone(&format!("rs-{gone}-caps")));
        // A live process among the numbers: kept, even if another number is not one.
        assert!(!owner_gone(&format!("ringside-t2d-{me}-loss-{gone}")));
        assert!(!owner_gone(&format!("ringside-t2d-{me}-loss")));
        // No number, or not ours: never.
        assert!(!owner_gone("ringside"));
        assert!(!owner_gone("ringside-prod"));
        assert!(!owner_gone(&format!("cilium-{gone}")));
    }

    #[test]
    fn stale_pin_dirs_need_ringsides_pins() {
        let root = std::env::temp_dir().join(format!("ringside-pin-clean-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let gone = i32::MAX - 1;
        for (name, marker) in [(format!("ringside-t2d-{gone}-a"), true), (format!("ringside-t2d-{gone}-b"), false), ("ringside".to_string(), true)] {
            let d = root.join(&name);
            std::fs::create_dir_all(&d).unwrap();
            if marker {
                std::fs::write(d.join(PIN_MARKER), b"").unwrap();
            }
        }
        let found: Vec<String> = stale_pin_dirs(&root).iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(found, vec![format!("ringside-t2d-{gone}-a")]);
    }

    #[test]
    fn stale_scratch_is_files_and_directories_of_gone_agents() {
        let root = std::env::temp_dir().join(format!("ringside-scratch-clean-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let gone = i32::MAX - 1;
        let me = std::process::id();
        for d in [format!("ringside-t2d-state-{gone}-loss"), format!("ringside-t2d-state-{me}-loss"), "ringside-base".into()] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        for f in [format!("ringside-t2d-{gone}-loss.toml"), format!("ringside-t2d-{me}-loss.toml"), "ringside-prod.toml".into(), "notes.txt".into()] {
            std::fs::write(root.join(f), b"").unwrap();
        }
        let found: Vec<String> = stale_scratch(&root).iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(found, vec![format!("ringside-t2d-{gone}-loss.toml"), format!("ringside-t2d-state-{gone}-loss")]);
    }
}
