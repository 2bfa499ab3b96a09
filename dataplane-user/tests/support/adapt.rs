//! Pieces of the closed-loop tests (`t2_adapt.rs`, `t2_adapt_torch.rs`): the job's view from the
//! agent, the arithmetic over the ranks' per-step records, and the switch port counters a rate cap
//! is sized from.
use std::{
    collections::BTreeMap,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use ringside_client::JobClient;
use serde_json::Value;
use testbed::Star;

pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

pub fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// A numeric field of a step record, or a panic naming it (a report without it is a bug).
pub fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or_else(|| panic!("step record without numeric {k}: {v}"))
}

/// The job's Prometheus text from the agent (`GET /v1/jobs/{id}/metrics`), or the error.
pub fn job_metrics(star: &Star, job_url: &str, token: &str) -> String {
    star.switch
        .run(|| JobClient::new(job_url, token).and_then(|c| c.metrics()))
        .unwrap_or_else(|e| format!("(GET metrics failed: {e})"))
        .lines()
        .filter(|l| !l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Bytes each switch port has received so far (= bytes its host sent into the switch), from the
/// switch namespace's /proc/thread-self/net/dev (the calling thread's namespace, unlike /proc/self).
pub fn switch_rx_bytes(star: &Star) -> BTreeMap<String, u64> {
    let dev = star.switch.run(|| std::fs::read_to_string("/proc/thread-self/net/dev")).expect("reading the switch's /proc/net/dev");
    let mut out = BTreeMap::new();
    for line in dev.lines().skip(2) {
        let Some((name, fields)) = line.split_once(':') else { continue };
        // The first field is receive bytes.
        if let Some(rx) = fields.split_whitespace().next().and_then(|x| x.parse().ok()) {
            out.insert(name.trim().to_string(), rx);
        }
    }
    out
}

/// The rate (Mbit/s) at which host `host` sends into the switch while its job runs: the 90th
/// percentile of `samples` 100 ms deltas of its switch port's receive counter. The job sends in
/// bursts (its communication phases), so the high percentile is close to its in-phase rate, and a
/// cap well under it slows every phase.
pub fn host_send_rate_mbit(star: &Star, host: usize, samples: usize) -> f64 {
    let port = star.hosts[host].switch_port.clone();
    let interval = Duration::from_millis(100);
    let mut rates = Vec::with_capacity(samples);
    let mut prev = switch_rx_bytes(star)[&port];
    let mut t_prev = std::time::Instant::now();
    for _ in 0..samples {
        std::thread::sleep(interval);
        let now = switch_rx_bytes(star)[&port];
        let dt = t_prev.elapsed().as_secs_f64();
        t_prev = std::time::Instant::now();
        rates.push((now - prev) as f64 * 8.0 / dt / 1e6);
        prev = now;
    }
    rates.sort_by(f64::total_cmp);
    rates[(rates.len() * 9 / 10).min(rates.len() - 1)]
}
