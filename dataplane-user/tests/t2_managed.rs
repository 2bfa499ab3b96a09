//! T2: managed collectives (issue 12). A 4-host [`IpuStar`] with the host ↔ IPU links and the
//! IPUs' fabric addresses ([`testbed::managed::enable_managed`]); one `ringside-ipu` per IPU and
//! the real agent in every IPU on its fabric port; the job registered through the real API with
//! each agent (members: the IPUs' fabric subnet, the services' mesh port), and each service
//! following its own IPU's agent (`--agent`) and voting with its hints; the emulated job
//! (`ringside-rank --managed`, `--verify`) hands every step's buffer to its IPU and follows no
//! hints itself. After a healthy warm-up, IPU 2's fabric cable (`h2`: not rank 0's, so before
//! every IPU steered this fault went unnoticed) is rate-capped until the job ends.
//!
//! `rate_cap_off_rank_0_is_applied_by_every_ipu_service_without_the_tenant`:
//! - every rank completed every step and verified every allreduce (the sums of the deterministic
//!   inputs: exact for uncompressed steps, within the codec's bound for compressed ones), and
//!   every rank ran the same plan at every step (so every rank switched at the same collective);
//! - no plan change before the cap; after it, steps ran a compressed plan that came from a hint of
//!   version ≥ 2 that the winning service had proposed (the services report the rank and version
//!   behind each plan; the ranks had no hint flag and no agent address), a service other than
//!   rank 0's proposed a compressed plan, and the job ended compressed (a plan change before the
//!   cap that rank 0's own communication time explains, ≥ 1.3× in the 2 s before it, makes the
//!   run inconclusive and it runs once more: `support::adapt::early_change`);
//! - the plans never left the registered constraints (no top-k: not registered);
//! - when at least 3 steps ran capped and uncompressed, the compressed steps' mean communication
//!   time is at least 1.3× lower (a ratio within one run);
//! - the tenant's namespace reaches its IPU's service on the host link, but not the agent's API;
//! - every agent's job metrics show the plan the job ended on as reported by its IPU's service
//!   (`ringside_job_plan_reported_info`, from `PUT /v1/jobs/{id}/plan`).
//!
//! Needs root, the eBPF objects (`cargo xtask build`), `ringside-rank` and `ringside-ipu`
//! (`RINGSIDE_RANK_BIN` / `RINGSIDE_IPU_BIN`, set by `cargo xtask test`, else
//! target/{release,debug}). Without them it FAILS with the reason.
mod support;

use std::{
    net::SocketAddr,
    path::PathBuf,
    time::{Duration, Instant},
};

use ringside_client::{Algorithm, Constraints, JobCreated, JobRegistration, PortRange};
use serde_json::Value;
use support::{
    adapt::{f, mean, Inconclusive},
    ipu_agent::IpuAgent,
    wait_for,
};
use testbed::managed::{self, ManagedServices, ServiceConfig};
use testbed::{ByteSize, IpuStar, IpuStarConfig, JobConfig, Rig};

const POLL: Duration = Duration::from_millis(200);
const RANKS: usize = 4;
const AGENT_PORT: u16 = 9491;
/// The services' mesh port on the fabric.
const FABRIC_PORT: u16 = 29600;
/// The services' port on the host link (the ranks' `--managed`).
const SERVICE_PORT: u16 = 29700;
const GRADIENT_BYTES: u64 = 4 << 20;
/// As t2_adapt: well under what the healthy job sends per link.
const CAP_MBIT: u64 = 150;
const WARMUP: Duration = Duration::from_secs(12);
const STEPS: u32 = 300;
/// The capped host: not rank 0's.
const CAPPED: usize = 2;

fn binary(env: &str, name: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env) {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "{env}={} is not a file", p.display());
        return p;
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    ["release", "debug"].iter().map(|p| target.join(p).join(name)).find(|p| p.is_file()).unwrap_or_else(|| {
        panic!("t2_managed needs {name}, not found in {}/{{release,debug}}; run `cargo build --release -p ipu-firmware --bin {name}` (or set {env})", target.display())
    })
}

fn preconditions() -> (PathBuf, PathBuf) {
    if let Err(e) = testbed::require_root() {
        panic!("t2_managed builds network namespaces and attaches eBPF programs, and needs root: {e}");
    }
    if let Err(e) = dataplane_user::object::flowmon_object() {
        panic!("t2_managed runs the real agent: {e}");
    }
    if let Err(e) = dataplane_user::object::ipuwire_object() {
        panic!("t2_managed runs the IPU forwarder (`ringside ipu-wire`): {e}");
    }
    (binary("RINGSIDE_RANK_BIN", "ringside-rank"), binary("RINGSIDE_IPU_BIN", "ringside-ipu"))
}

fn codec(plan: &Value) -> &str {
    plan["compression"]["codec"].as_str().unwrap_or_else(|| panic!("plan without a codec: {plan}"))
}

fn unix_ms() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as f64
}

/// Removes a file on drop.
struct TempFile(PathBuf);
impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
#[ignore = "needs root and the eBPF objects (T2): run with cargo xtask test"]
fn rate_cap_off_rank_0_is_applied_by_every_ipu_service_without_the_tenant() {
    support::adapt::at_most_twice(rate_cap_run);
}

fn rate_cap_run() -> Result<(), Inconclusive> {
    let (rank_bin, ipu_bin) = preconditions();
    let t0 = Instant::now();
    let star = IpuStar::new(IpuStarConfig { hosts: RANKS, offloads: false, ringside_bin: env!("CARGO_BIN_EXE_ringside").into(), ..Default::default() })
        .expect("building the IPU star");
    managed::enable_managed(&star).expect("host links and IPU fabric addresses");
    // One agent per IPU, each watching its own fabric port (the same config as `eval detection
    // --vantage ipu`: an IPU sees two ring peers, so the gray detector's peer minimum is 2).
    let agents: Vec<IpuAgent> = (0..RANKS)
        .map(|i| IpuAgent::start(&star, i, "t2managed", &format!("ipu{i}"), AGENT_PORT, "[match]\nprefixes = [\"10.77.1.0/24\"]\n[detect.gray]\nmin_peers = 2\n"))
        .collect();

    // The job as its launcher registers it: the IPUs' fabric addresses and the services' port.
    let constraints = Constraints {
        algorithms: Algorithm::ALL.to_vec(),
        codecs: ["none", "fp16", "bf16", "int8"].map(String::from).to_vec(),
        max_channels: 1,
        error_feedback: true,
        ..Default::default()
    };
    let job = JobRegistration {
        name: "t2-managed".into(),
        members: vec!["10.77.1.0/24".into()],
        tcp_ports: vec![PortRange { lo: FABRIC_PORT, hi: FABRIC_PORT }],
        udp_ports: vec![],
        gradient_bytes: Some(GRADIENT_BYTES),
        constraints: constraints.clone(),
    };
    let created: Vec<JobCreated> = agents.iter().map(|a| a.client(|c| c.register(&job)).expect("POST /v1/jobs")).collect();
    let constraints_file = TempFile(std::env::temp_dir().join(format!("ringside-t2managed-constraints-{}.json", std::process::id())));
    std::fs::write(&constraints_file.0, serde_json::to_string(&constraints).unwrap()).unwrap();
    let out_dir = std::env::temp_dir().join(format!("ringside-t2managed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out_dir);
    let mut services = ManagedServices::spawn(
        &star,
        &ServiceConfig {
            ranks: RANKS,
            fabric_port: FABRIC_PORT,
            listen_port: SERVICE_PORT,
            bin: Some(ipu_bin),
            args: vec!["--max-channels".into(), "1".into(), "--timeout-ms".into(), "30000".into(), "--constraints".into(), constraints_file.0.display().to_string()],
            rank_args: agents.iter().zip(&created).map(|(a, c)| vec!["--agent".into(), format!("{}/v1/jobs/{}", a.url(), c.id)]).collect(),
            tokens: created.iter().map(|c| Some(c.tenant_token.clone())).collect(),
            log_dir: out_dir.join("ipu"),
        },
    )
    .expect("starting ringside-ipu in every IPU");

    // Isolation: the tenant reaches its service on the host link, not the agent's API.
    let svc = managed::service_addr(0, SERVICE_PORT);
    wait_for(Duration::from_secs(30), POLL, "host 0 reaching its IPU's service", || {
        star.hosts[0].ns.run(|| std::net::TcpStream::connect_timeout(&svc, Duration::from_secs(1)).ok()).map(drop)
    });
    let agent_via_link = SocketAddr::new(managed::ipu_link_addr(0).into(), AGENT_PORT);
    let reach = star.hosts[0].ns.run(|| std::net::TcpStream::connect_timeout(&agent_via_link, Duration::from_secs(2)));
    assert!(reach.is_err(), "the agent's API is reachable from the host namespace over the host link");

    let cfg = JobConfig {
        ranks: RANKS,
        size: ByteSize(GRADIENT_BYTES),
        steps: STEPS,
        compute_ms: 50,
        verify: true,
        rank_bin: Some(rank_bin),
        timeout: Duration::from_secs(120),
        managed: Some(SERVICE_PORT),
        out_dir: Some(out_dir.join("ranks")),
        ..Default::default()
    };
    let running = testbed::spawn_job(&star, &cfg).expect("starting the managed job");
    std::thread::sleep(WARMUP);
    let cap_ms = unix_ms();
    let _cap = star.link_rate_cap(&format!("h{CAPPED}"), CAP_MBIT).expect("rate cap on IPU 2's fabric cable");
    eprintln!("capped h{CAPPED} at {CAP_MBIT} Mbit/s after {WARMUP:?} of the job");
    let report = running.wait(None).expect("the managed job ran to the end");
    eprintln!("job wall time {:.1} s; test so far {:.1} s; reports in {}", report.wall_ms / 1e3, t0.elapsed().as_secs_f64(), out_dir.display());
    assert!(services.exited().is_empty(), "a service exited during the job: {:?} (logs {:?})", services.exited(), services.logs());
    let logs: Vec<String> = services.logs().iter().map(|l| std::fs::read_to_string(l).unwrap_or_default()).collect();
    for (i, log) in logs.iter().enumerate() {
        for l in log.lines().filter(|l| l.contains("hint") || l.contains("refus") || l.contains("agreed")) {
            eprintln!("ipu{i}: {l}");
        }
    }
    let log0 = &logs[0];
    // Which services proposed a compressed plan (severity ≥ 2: a codec; see ipu_firmware::plan::severity).
    let compressing: Vec<usize> = (0..RANKS)
        .filter(|&i| logs[i].lines().any(|l| l.contains("proposing the local agent's hint") && !l.contains("severity=0") && !l.contains("severity=1")))
        .collect();
    eprintln!("services that proposed a compressed plan: {compressing:?}");

    let ranks: Vec<Value> = report.ranks.iter().map(|r| serde_json::from_str(&std::fs::read_to_string(&r.out).unwrap()).unwrap()).collect();
    for (r, (summary, v)) in report.ranks.iter().zip(&ranks).enumerate() {
        assert!(summary.error.is_none(), "rank {r} reported an error: {:?}", summary.error);
        assert_eq!(v["steps"].as_array().map(Vec::len), Some(STEPS as usize), "rank {r} completed every step");
        assert_eq!(summary.verified, Some(true), "rank {r}: an allreduce result did not verify (see {})", summary.out.display());
        assert!(v.get("hints").is_none(), "rank {r} followed hints itself");
    }
    let steps0 = ranks[0]["steps"].as_array().unwrap();
    for (r, v) in ranks.iter().enumerate().skip(1) {
        for (i, (a, b)) in steps0.iter().zip(v["steps"].as_array().unwrap()).enumerate() {
            assert_eq!(a["plan"], b["plan"], "step {i}: rank 0 and rank {r} ran different plans");
        }
    }
    let start_ms = |s: &Value| f(s, "end_unix_ms") - f(s, "step_ms");
    // What a plan does, without `step_from` (the baseline hint re-announces the initial plan from
    // step 1: the same plan, not a change).
    let what = |s: &Value| {
        let p = &s["plan"];
        (p["algorithm"].clone(), p["chunk_bytes"].clone(), p["channels"].clone(), p["compression"].clone())
    };
    let changes: Vec<(usize, &Value)> = (1..steps0.len()).filter(|&i| what(&steps0[i]) != what(&steps0[i - 1])).map(|i| (i, &steps0[i])).collect();
    for (i, s) in &changes {
        eprintln!("step {i}: plan {} {} ×{} (hint v{} from ipu{})", s["plan"]["algorithm"], codec(&s["plan"]), s["plan"]["channels"], s["hint_version"], s["hint_rank"]);
    }
    eprintln!("rank 0 mean comm ms per second before the cap: {}", support::adapt::comm_per_second(steps0, cap_ms));
    let early: Vec<_> = changes.iter().filter(|(_, s)| f(s, "end_unix_ms") < cap_ms).collect();
    if let Some((_, first)) = early.first() {
        let why = support::adapt::early_change(steps0, 10, start_ms(first), &format!("{early:?}"));
        let _ = std::fs::remove_dir_all(&out_dir);
        return Err(why);
    }
    assert!(changes.len() <= 5, "the plan flapped: {} changes", changes.len());
    for s in steps0 {
        let p = &s["plan"];
        assert!(["none", "fp16", "bf16", "int8"].contains(&codec(p)), "a plan outside the registered codecs ran: {p}");
        assert_eq!(p["channels"], 1, "a plan above the registered max_channels ran: {p}");
    }
    let (switch, adapted) = changes
        .iter()
        .find(|(_, s)| codec(&s["plan"]) != "none")
        .copied()
        .unwrap_or_else(|| panic!("no compressed plan ran after the cap; plan changes: {changes:?}\nipu0 log:\n{log0}"));
    assert!(adapted["hint_version"].as_u64() >= Some(2), "the compressed plan did not come from a hint of version ≥ 2: {adapted}");
    // The plan came from a proposal the named service made (its log names the version).
    let (from, version) = (adapted["hint_rank"].as_u64().expect("rank 0's step names the winning service") as usize, adapted["hint_version"].as_u64().unwrap());
    assert!(
        logs[from].lines().any(|l| l.contains("proposing the local agent's hint") && l.contains(&format!("version={version} "))),
        "ipu{from}'s service never proposed hint v{version}, yet rank 0 reports it won"
    );
    assert!(compressing.iter().any(|&i| i != 0), "no service other than rank 0's proposed compression: the cap on h{CAPPED} was seen only through IPU 0 (services proposing compression: {compressing:?})");
    assert_ne!(codec(&steps0.last().unwrap()["plan"]), "none", "the job ended uncompressed under the cap");

    let compressed = |i: usize| codec(&steps0[i]["plan"]) != "none";
    let comm = |v: &[&Value]| mean(&v.iter().map(|s| f(s, "comm_ms")).collect::<Vec<_>>());
    // Skip the first steps (mesh and host-link setup: the first took ≈ 600 ms).
    let healthy: Vec<&Value> = steps0.iter().skip(10).filter(|s| f(s, "end_unix_ms") < cap_ms).collect();
    let capped: Vec<&Value> = (0..steps0.len()).filter(|&i| !compressed(i) && start_ms(&steps0[i]) >= cap_ms).map(|i| &steps0[i]).collect();
    let after: Vec<&Value> = (2..steps0.len()).filter(|&i| compressed(i) && compressed(i - 1) && compressed(i - 2)).map(|i| &steps0[i]).collect();
    let switch_s = (start_ms(&steps0[switch]) - cap_ms) / 1e3;
    eprintln!(
        "steps: {} healthy, {} capped uncompressed, {} compressed (switch at step {switch}, {switch_s:.1} s after the cap); mean comm ms: healthy {:.1}, capped {:.1}, compressed {:.1}",
        healthy.len(),
        capped.len(),
        after.len(),
        comm(&healthy),
        comm(&capped),
        comm(&after)
    );
    // ≈ 200 ms a healthy managed step on a loaded 2-vCPU machine: ≈ 50 steps in the warm-up.
    assert!(healthy.len() >= 10, "only {} healthy steps before the cap", healthy.len());
    assert!(after.len() >= 50, "only {} steps ran compressed", after.len());
    if capped.len() >= 3 {
        let gain = comm(&capped) / comm(&after);
        eprintln!("RATIO managed comm recovered ×{gain:.2}");
        assert!(gain >= 1.3, "the plan change did not recover comm time: capped {:.1} ms, after {:.1} ms (×{gain:.2})", comm(&capped), comm(&after));
    } else {
        // The switch came before three capped steps ended: no in-run reference (t2_adapt measures
        // one on a static job; the managed comparison is `cargo xtask eval adaptation --source
        // managed`). Said, not hidden.
        eprintln!("NOTE only {} capped uncompressed steps: the comm-time recovery ratio is not asserted in this run", capped.len());
    }
    // Every service told its own agent the agreed plan (PUT /v1/jobs/{id}/plan, every 5 s): each
    // agent's job metrics name the plan the job ended on, whichever IPU's advice it was.
    let last = &steps0.last().unwrap()["plan"];
    let (algorithm, last_codec) = (last["algorithm"].as_str().unwrap_or_default(), codec(last));
    for (i, (a, c)) in agents.iter().zip(&created).enumerate() {
        let text = a.client(|op| op.job(&c.id, &c.tenant_token)?.metrics()).expect("the job's metrics");
        let want = format!("ringside_job_plan_reported_info{{job=\"{}\",algorithm=\"{algorithm}\",compression=\"{last_codec}\"}} 1", c.id);
        assert!(text.contains(&want), "ipu{i}'s agent does not show the plan in force ({want}):\n{text}");
    }
    drop(services);
    drop(agents);
    let _ = std::fs::remove_dir_all(&out_dir);
    Ok(())
}
