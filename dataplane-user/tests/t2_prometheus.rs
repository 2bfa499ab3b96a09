//! T2: the operators' Prometheus rules and Grafana dashboard against a real Prometheus scraping a
//! live agent. The detection rig of `t2_detect.rs` (a 6-host star, the agent in the switch
//! namespace on every bridge port, the emulated ring-allreduce job), plus `/usr/bin/prometheus`
//! (Debian's package, `cargo xtask setup`) started in the switch namespace with a config in a
//! temporary directory: scrape and evaluation every second, the rule files of `deploy/prometheus`,
//! the agent's `/metrics` (scrape job `ringside`) and the job's `/v1/jobs/t2/metrics` (scrape job
//! `ringside-jobs`, operator token, `honor_labels`, as docs/operator-guide.md says).
//!
//! It asserts through Prometheus's HTTP API that every rule loaded and evaluates without error,
//! that no ringside alert fires while the job is healthy, that `RingsideGrayFailure` fires once
//! one host's link loses 5 % of its packets, and that every query of `deploy/grafana/ringside.json`
//! (template variables substituted) succeeds, with data unless the rig cannot produce it (RoCE:
//! listed in [`MAY_BE_EMPTY`] with the reason), the training-job row included.
//!
//! Needs root, the agent built with its eBPF object, the rank binary and `/usr/bin/prometheus`;
//! without any of them it FAILS with the reason. Every wait is bounded.
mod detect_rig;
mod support;

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use detect_rig::*;
use serde_json::Value;
use testbed::{Star, StarConfig};

const PROMETHEUS: &str = "/usr/bin/prometheus";

/// Dashboard queries that may return no series on this rig, and why. Every other query must.
const MAY_BE_EMPTY: &[(&str, &str)] = &[
    ("ringside_peer_roce_psn_gap_packets", "the job is TCP: no RoCEv2 traffic"),
    ("ringside_peer_roce_cnps", "the job is TCP: no RoCEv2 traffic"),
];

/// A Prometheus server in a namespace, killed (and its directory removed) on drop.
struct PrometheusServer {
    child: Option<Child>,
    dir: PathBuf,
    port: u16,
}

impl PrometheusServer {
    /// Starts Prometheus in the switch namespace on a free loopback port, scraping the agent at
    /// 127.0.0.1:`agent_port` with `token` for the job-scoped endpoint of job `job`.
    fn start(star: &Star, agent_port: u16, token: &str, job: &str) -> PrometheusServer {
        let dir = std::env::temp_dir().join(format!("ringside-t2p-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let token_file = dir.join("operator-token");
        std::fs::write(&token_file, token).unwrap();
        let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus").canonicalize().unwrap();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {rules}/*.rules.yml\n\
             scrape_configs:\n\
             \x20 - job_name: ringside\n    static_configs:\n      - targets: ['127.0.0.1:{agent_port}']\n\
             \x20 - job_name: ringside-jobs\n    honor_labels: true\n    metrics_path: /v1/jobs/{job}/metrics\n\
             \x20   authorization:\n      credentials_file: {token}\n\
             \x20   static_configs:\n      - targets: ['127.0.0.1:{agent_port}']\n",
            rules = rules.display(),
            token = token_file.display(),
        );
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        // A port that is free in the switch namespace (nothing else listens there but the agent).
        let port = star.switch.run(|| std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port());
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = star
            .switch
            .command(PROMETHEUS)
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {PROMETHEUS}: {e}; run `cargo xtask setup` (Debian package prometheus)"));
        let mut server = PrometheusServer { child: Some(child), dir, port };
        let ready = wait_for_opt(Duration::from_secs(30), || {
            if let Some(Ok(Some(status))) = server.child.as_mut().map(|c| c.try_wait()) {
                panic!("prometheus exited ({status}) at start:\n{}", server.log());
            }
            let out = star.switch.command("curl").args(["-sf", &format!("{}/-/ready", server.url())]).output().ok()?;
            out.status.success().then_some(())
        });
        assert!(ready.is_some(), "prometheus was not ready within 30 s:\n{}", server.log());
        server
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The tail of Prometheus's own log, for failure messages.
    fn log(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// GET `path` of the HTTP API (with `query` URL-encoded when given) as JSON.
    fn api(&self, star: &Star, path: &str, query: Option<&str>) -> Value {
        let mut cmd = star.switch.command("curl");
        cmd.args(["-sS", "--max-time", "10", "-G", &format!("{}{path}", self.url())]);
        if let Some(q) = query {
            cmd.arg("--data-urlencode").arg(format!("query={q}"));
        }
        let out = cmd.output().expect("running curl");
        let body = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(&body).unwrap_or_else(|e| {
            panic!("GET {path} {query:?}: not JSON ({e}): {body}{}\nprometheus log:\n{}", String::from_utf8_lossy(&out.stderr), self.log())
        })
    }

    /// An instant query: `Ok(result array)` or `Err(the error Prometheus gave)`.
    fn query(&self, star: &Star, q: &str) -> Result<Vec<Value>, String> {
        let v = self.api(star, "/api/v1/query", Some(q));
        if v["status"] == "success" {
            Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
        } else {
            Err(format!("{}: {}", v["errorType"], v["error"]))
        }
    }

    /// The ringside alerts Prometheus holds, as (name, state, instance).
    fn alerts(&self, star: &Star) -> Vec<(String, String, String)> {
        let v = self.api(star, "/api/v1/alerts", None);
        v["data"]["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| {
                let s = |x: &Value| x.as_str().unwrap_or_default().to_owned();
                (s(&a["labels"]["alertname"]), s(&a["state"]), s(&a["labels"]["instance"]))
            })
            .filter(|(name, _, _)| name.starts_with("Ringside"))
            .collect()
    }
}

impl Drop for PrometheusServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Like [`wait_for`] but returns `None` at the deadline instead of panicking, so the caller can
/// say what it saw.
fn wait_for_opt<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

/// Every PromQL expression of the dashboard: panel targets (with their panel's title) and
/// annotation queries, in file order.
fn dashboard_queries(dash: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in dash["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap_or_else(|| panic!("panel {:?}: a target without expr", p["title"]));
            out.push((p["title"].as_str().unwrap_or_default().to_owned(), expr.to_owned()));
        }
    }
    for a in dash["annotations"]["list"].as_array().into_iter().flatten() {
        if let Some(expr) = a["expr"].as_str() {
            out.push((format!("annotation {}", a["name"]), expr.to_owned()));
        }
    }
    out
}

/// Grafana's template variables replaced as a dashboard with every agent and job selected sends
/// them: multi-value `$instance` and `$training_job` as the regex `.*`, `$__rate_interval` as 1m.
fn substitute(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m").replace("$instance", ".*").replace("$training_job", ".*")
}

#[test]
#[ignore = "needs root (T2): run with cargo xtask test"]
fn prometheus_fires_the_gray_failure_alert_and_serves_the_dashboard() {
    let rank_bin = preconditions();
    assert!(
        Path::new(PROMETHEUS).is_file(),
        "t2_prometheus runs a real Prometheus and needs {PROMETHEUS}: run `cargo xtask setup` (Debian package prometheus)"
    );
    let dash: Value = serde_json::from_str(include_str!("../../deploy/grafana/ringside.json")).expect("deploy/grafana/ringside.json is JSON");
    let star = Star::new(StarConfig { hosts: HOSTS, offloads: false, ..Default::default() }).unwrap();
    let agent = Agent::start(&star, "prom", 9473);
    let token = agent.token().expect("the agent's operator token");
    let prom = PrometheusServer::start(&star, agent.port(), &token, "t2");
    let instance = format!("127.0.0.1:{}", agent.port());

    // Every rule file loaded, and every rule evaluates without error.
    let rules = prom.api(&star, "/api/v1/rules", None);
    let groups = rules["data"]["groups"].as_array().cloned().unwrap_or_default();
    let names: Vec<&str> = groups.iter().filter_map(|g| g["file"].as_str()).collect();
    assert!(
        names.iter().any(|f| f.ends_with("ringside-alerts.rules.yml")) && names.iter().any(|f| f.ends_with("ringside-recording.rules.yml")),
        "the rule files were not loaded: {names:?}\n{}",
        prom.log()
    );

    let _job = warm_up(&star, &agent, &job(rank_bin, None), Duration::from_secs(10));
    // Both targets scraped.
    for target in ["ringside", "ringside-jobs"] {
        let q = format!("up{{job=\"{target}\"}} == 1");
        let up = wait_for_opt(Duration::from_secs(30), || prom.query(&star, &q).ok().filter(|r| !r.is_empty()));
        assert!(up.is_some(), "prometheus never scraped scrape job {target}: {:?}\n{}", prom.api(&star, "/api/v1/targets", None)["data"], prom.log());
    }
    let rule_errors: Vec<String> = prom.api(&star, "/api/v1/rules", None)["data"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .filter(|r| r["health"] == "err")
        .map(|r| format!("{}: {}", r["name"], r["lastError"]))
        .collect();
    assert!(rule_errors.is_empty(), "rules failing to evaluate: {rule_errors:?}");
    // Healthy: no ringside alert fires.
    let firing: Vec<_> = prom.alerts(&star).into_iter().filter(|(_, state, _)| state == "firing").collect();
    assert!(firing.is_empty(), "ringside alerts firing on a healthy job: {firing:?}");

    let target = 2usize;
    let addr: IpAddr = star.hosts[target].addr.into();
    let _loss = star.add_loss(target, 5.0).unwrap();
    let started = Instant::now();
    // The detector's own persistence, then the alert's `for: 30s`: generous on a loaded machine.
    let fired = wait_for_opt(Duration::from_secs(90), || {
        prom.alerts(&star).into_iter().find(|(name, state, inst)| name == "RingsideGrayFailure" && state == "firing" && *inst == instance)
    });
    if fired.is_none() {
        let events = agent.events(&star);
        panic!(
            "RingsideGrayFailure did not fire within 90 s of 5 % loss on {addr}'s link.\n\
             prometheus alerts: {:?}\nringside_verdicts_open: {:?}\nthe agent's events:{}\nprometheus log:\n{}",
            prom.alerts(&star),
            prom.query(&star, "ringside_verdicts_open > 0"),
            summary(&events),
            prom.log()
        );
    }
    eprintln!("RingsideGrayFailure fired {:.1} s after the loss started", started.elapsed().as_secs_f64());
    // Only that alert: nothing about the agent or its data plane.
    let others: Vec<_> = prom
        .alerts(&star)
        .into_iter()
        .filter(|(name, state, _)| state == "firing" && !matches!(name.as_str(), "RingsideGrayFailure" | "RingsideCongestion" | "RingsideStraggler"))
        .collect();
    assert!(others.is_empty(), "agent or data-plane alerts firing: {others:?}");

    // Every dashboard query, as Grafana would send it.
    let mut failures = Vec::new();
    let mut empty_allowed = Vec::new();
    let queries = dashboard_queries(&dash);
    assert!(queries.len() >= 20, "only {} queries in the dashboard", queries.len());
    for (title, expr) in &queries {
        let q = substitute(expr);
        assert!(!q.contains('$'), "an unsubstituted template variable in {title:?}: {q}");
        match prom.query(&star, &q) {
            Err(e) => failures.push(format!("{title}: {q}: {e}")),
            Ok(r) if r.is_empty() => match MAY_BE_EMPTY.iter().find(|(m, _)| q.contains(m)) {
                Some((_, why)) => empty_allowed.push(format!("{title} ({why})")),
                None => failures.push(format!("{title}: {q}: no data")),
            },
            Ok(_) => {}
        }
    }
    // The template variables' queries (Grafana's label_values(SELECTOR, LABEL)).
    for var in dash["templating"]["list"].as_array().expect("templating") {
        let Some(def) = var["definition"].as_str() else { continue };
        let inner = def.strip_prefix("label_values(").and_then(|d| d.strip_suffix(')')).unwrap_or_else(|| panic!("variable {}: {def}", var["name"]));
        let (selector, label) = inner.rsplit_once(',').unwrap();
        let (selector, label) = (selector.trim(), label.trim());
        match prom.query(&star, selector) {
            Ok(r) if r.iter().any(|s| s["metric"][label].is_string()) => {}
            other => failures.push(format!("variable {}: {selector} has no {label}: {other:?}", var["name"])),
        }
    }
    eprintln!("{} dashboard queries evaluated; empty as allowed: {empty_allowed:?}", queries.len());
    assert!(failures.is_empty(), "dashboard queries that fail or return nothing:\n  {}", failures.join("\n  "));
}
