//! Pieces shared by the testbed evaluations (`cargo xtask eval ...`).
use std::{
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant},
};

use crate::util::{output, workspace_root};

pub fn now_ms() -> u64 {
    testbed::fault::unix_ms(std::time::SystemTime::now())
}

/// Sleeps `d` in small steps; false when a stop was requested.
pub fn sleep_checked(d: Duration, stop: &AtomicBool) -> bool {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if stop.load(Ordering::SeqCst) {
            return false;
        }
        thread::sleep((end - Instant::now()).min(Duration::from_millis(100)));
    }
    !stop.load(Ordering::SeqCst)
}

/// Nearest-rank quantile `q` (0..=1) of `v`.
pub fn percentile(v: &[f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    // Nearest rank.
    let idx = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1;
    Some(s[idx])
}

pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" ")).unwrap_or_default()
}

/// CPU, kernel and source revision, for a report's header.
pub fn machine() -> String {
    let cpus = thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split_once(':')).map(|(_, m)| m.trim().to_string()))
        .unwrap_or_else(|| "unknown CPU".into());
    let kernel = output(std::process::Command::new("uname").arg("-r")).map(|s| s.trim().to_string()).unwrap_or_default();
    let rev = output(std::process::Command::new("git").current_dir(workspace_root()).args(["describe", "--always", "--dirty"]))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    format!("{cpus} vCPU ({model}), Linux {kernel}; source {rev} (a dirty tree includes other engineers' uncommitted work)")
}
