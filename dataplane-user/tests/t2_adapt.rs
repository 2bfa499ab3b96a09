//! T2: the closed loop end to end. A 4-host testbed star, the `ringside` agent in the switch
//! namespace on every bridge port (listening on 0.0.0.0, reached by the hosts at the star's
//! management address), a job registered through the real API (`POST /v1/jobs`), and the emulated
//! training job (`ringside-rank`, ring allreduce over TCP port 29500) following its hints from rank 0.
//! After a healthy warm-up (the policy needs a healthy baseline), one host's link is rate-capped
//! until the job ends. The test asserts, from the ranks' own reports:
//! - the cap hurt (capped communication time ≥ 1.5× healthy) and the plan did not change before it
//!   (unless rank 0's own communication time explains the change, ≥ 1.3× in the 2 s before it:
//!   then the machine broke the healthy phase, and the run is inconclusive and runs once more,
//!   `support::adapt::early_change`);
//! - a hint of version ≥ 2 with a compressed codec was applied after the cap started, every
//!   rank ran the same plan at every step, and the job settled on a compressed plan (at most one
//!   undone change: a revert that made the job slower is itself undone, see "Verification" in
//!   `docs/policy.md`);
//! - the mean communication time of the compressed steps is at least 1.3× lower than that of
//!   the capped uncompressed ones (ratios within one run, never absolute times), and the step
//!   time recovers too. When the switch came so fast that fewer than three steps ran capped and
//!   uncompressed, that reference comes from a short static uncompressed job run under the same
//!   cap right after;
//! - every rank verified every step (`--verify`), so compression did not corrupt the allreduce.
//!
//! Needs root, an agent built with its eBPF object (`cargo xtask test` does both) and the rank
//! binary in release (`cargo build --release -p ipu-firmware --bin ringside-rank`, or
//! `RINGSIDE_RANK_BIN`). Without any of them it FAILS with the reason; it never skips. Every wait
//! is bounded. `RINGSIDE_AGENT_LOG=info` (the default) shows the agent's "plan changed" lines;
//! `RINGSIDE_AGENT_LOG=info,ringside::detect::input=debug` dumps each detection window.
mod detect_rig;
mod support;

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use detect_rig::*;
use ringside_client::{Algorithm, PortRange};
use serde_json::Value;
use support::adapt::{Inconclusive, f, mean, registration, unix_ms, RegisteredJob};
use testbed::{ByteSize, JobConfig, Star, StarConfig};

const RANKS: usize = 4;
const AGENT_PORT: u16 = 9473;
const GRADIENT_BYTES: u64 = 4 << 20;
/// The host whose link is capped.
const CAPPED_HOST: usize = 2;
/// Well under what the healthy job sends per link on this rig (6 MiB per step at ≈ 120 ms a
/// step, ≈ 400 Mbit/s averaged, in bursts several times faster): the capped ring takes several
/// times longer (asserted below, from the same run).
const CAP_MBIT: u64 = 150;
/// Healthy run before the cap: the policy needs `min_baseline_windows` healthy 1 s windows, and
/// the detectors their own baseline.
const WARMUP: Duration = Duration::from_secs(12);
/// Steps of the job: ≈ 100 healthy (≈ 120 ms with `--verify`), a few capped, then ≈ 200 adapted (≈ 150 ms).
const STEPS: u32 = 300;

/// Fewer capped uncompressed steps than this in the adaptive job and the reference comes from
/// [`static_capped_steps`] instead.
const MIN_CAPPED_STEPS: usize = 3;
/// Steps of that static job; the first two (connection set-up, the queue filling) are left out.
const BASELINE_STEPS: u32 = 14;

/// Runs the job's ranks again, uncompressed and without hints, while the cap still holds, and
/// returns rank 0's steps: the capped reference measured on the same rig, in the same run.
fn static_capped_steps(star: &Star, adaptive: &JobConfig) -> Vec<Value> {
    let cfg = JobConfig {
        steps: BASELINE_STEPS,
        // Another port: the adaptive job's connections may still be in TIME_WAIT.
        port: adaptive.port + 1,
        algorithm: Some("ring".into()),
        compression: Some("none".into()),
        extra_args: vec!["--max-channels".into(), "1".into()],
        out_dir: None,
        ..adaptive.clone()
    };
    let report = testbed::spawn_job(star, &cfg).expect("starting the static capped job").wait(None).expect("the static capped job ran to the end");
    let rank0: Value = serde_json::from_str(&std::fs::read_to_string(&report.ranks[0].out).unwrap()).unwrap();
    for (r, summary) in report.ranks.iter().enumerate() {
        assert!(summary.error.is_none(), "static capped job, rank {r}: {:?}", summary.error);
    }
    let steps = rank0["steps"].as_array().cloned().unwrap_or_default();
    assert_eq!(steps.len(), BASELINE_STEPS as usize, "the static capped job completed every step");
    let _ = std::fs::remove_dir_all(&report.out_dir);
    steps
}

fn codec(plan: &Value) -> &str {
    plan["compression"]["codec"].as_str().unwrap_or_else(|| panic!("plan without a codec: {plan}"))
}

#[test]
#[ignore = "needs root (T2): run with cargo xtask test"]
fn rate_cap_makes_the_job_compress_and_its_comm_time_recover() {
    support::adapt::at_most_twice(rate_cap_run);
}

fn rate_cap_run() -> Result<(), Inconclusive> {
    let rank_bin = preconditions();
    let t0 = Instant::now();
    let star = Star::new(StarConfig { hosts: RANKS, offloads: false, ..Default::default() }).unwrap();
    let mgmt = star.add_management_address().expect("management address on the switch bridge");
    let agent = Agent::start_with(
        &star,
        "adapt",
        IpAddr::from([0, 0, 0, 0]),
        AGENT_PORT,
        "[match]\nprefixes = [\"10.77.0.0/24\"]\n",
    );
    let operator_token = wait_for(Duration::from_secs(5), POLL, "the agent's operator token", || agent.token());

    // Register the job through the API, as its launcher would.
    let wanted = registration("t2-adapt", vec!["10.77.0.0/24".into()], PortRange { lo: 29500, hi: 29500 }, GRADIENT_BYTES, Algorithm::ALL.to_vec());
    let job = RegisteredJob::register(&star, &agent.url(), mgmt, AGENT_PORT, &operator_token, &wanted);
    let (job_url, tenant) = (job.job_url.clone(), job.tenant.clone());
    eprintln!("registered job {} ({:.1} s into the test); rank 0 follows {job_url}", job.id, t0.elapsed().as_secs_f64());

    let cfg = JobConfig {
        ranks: RANKS,
        size: ByteSize(GRADIENT_BYTES),
        steps: STEPS,
        compute_ms: 50,
        verify: true,
        rank_bin: Some(rank_bin),
        timeout: Duration::from_secs(75),
        extra_args: vec!["--max-channels".into(), "1".into(), "--follow-hints".into(), job_url.clone(), "--token".into(), tenant.clone()],
        ..Default::default()
    };
    let running = testbed::spawn_job(&star, &cfg).expect("starting the emulated job");
    std::thread::sleep(WARMUP);
    let before_cap = job.hint(&star).expect("GET hints before the cap");
    let cap_ms = unix_ms();
    let _cap = star.rate_cap(CAPPED_HOST, CAP_MBIT).expect("rate cap");
    eprintln!("capped host {CAPPED_HOST}'s link at {CAP_MBIT} Mbit/s after {WARMUP:?} of the job (hint then: v{})", before_cap.version);

    job.watch_for_new_hint(&star, before_cap.version, Duration::from_secs(25));
    let report = running.wait(None).expect("the job ran to the end");
    eprintln!("job wall time {:.1} s; test so far {:.1} s; rank reports in {}", report.wall_ms / 1e3, t0.elapsed().as_secs_f64(), report.out_dir.display());
    let events = agent.events(&star);
    eprintln!("agent events:{}", summary(&events));
    eprintln!("job metrics:\n{}", job.metrics(&star));

    // (c) Every rank finished every step, verified.
    let ranks: Vec<Value> = report
        .ranks
        .iter()
        .map(|r| serde_json::from_str(&std::fs::read_to_string(&r.out).unwrap()).unwrap())
        .collect();
    for (r, (summary, v)) in report.ranks.iter().zip(&ranks).enumerate() {
        assert!(summary.error.is_none(), "rank {r} reported an error: {:?}", summary.error);
        assert_eq!(v["steps"].as_array().map(Vec::len), Some(STEPS as usize), "rank {r} completed every step");
        assert_eq!(summary.verified, Some(true), "rank {r}: an allreduce result did not verify (see {})", summary.out.display());
    }
    // Every rank ran the same plan at every step.
    let steps0 = ranks[0]["steps"].as_array().unwrap();
    for (r, v) in ranks.iter().enumerate().skip(1) {
        for (i, (a, b)) in steps0.iter().zip(v["steps"].as_array().unwrap()).enumerate() {
            assert_eq!(a["plan"], b["plan"], "step {i}: rank 0 and rank {r} ran different plans");
        }
    }

    // (a) The applied hints: none of version ≥ 2 before the cap; a compressed one after it.
    let start_ms = |s: &Value| f(s, "end_unix_ms") - f(s, "step_ms");
    let hints = ranks[0]["hints"].as_array().cloned().unwrap_or_default();
    for h in &hints {
        eprintln!(
            "rank 0 applied hint v{} at step {} (from step {}): {} {} ×{} {}",
            h["version"], h["received_at_step"], h["plan"]["step_from"], h["plan"]["algorithm"], codec(&h["plan"]), h["plan"]["channels"], h["reasons"]
        );
    }
    let received_ms = |h: &Value| steps0[h["received_at_step"].as_u64().unwrap() as usize]["end_unix_ms"].as_f64().unwrap();
    eprintln!("rank 0 mean comm ms per second before the cap: {}", support::adapt::comm_per_second(steps0, cap_ms as f64));
    let early: Vec<&Value> = hints.iter().filter(|h| h["version"].as_u64() >= Some(2) && received_ms(h) < cap_ms as f64).collect();
    if let Some(h) = early.first() {
        let why = support::adapt::early_change(steps0, 20, received_ms(h), &format!("{early:?}"));
        let _ = std::fs::remove_dir_all(&report.out_dir);
        return Err(why);
    }
    let adapted = hints
        .iter()
        .find(|h| h["version"].as_u64() >= Some(2) && codec(&h["plan"]) != "none")
        .unwrap_or_else(|| panic!("no compressed hint of version ≥ 2 was applied after the cap; applied: {hints:?}"));
    let switch = adapted["plan"]["step_from"].as_u64().unwrap() as usize;
    assert!(switch < steps0.len(), "the compressed plan (from step {switch}) took effect before the job ended");
    assert_eq!(steps0[switch]["plan"], adapted["plan"], "rank 0 ran the hinted plan from its step_from");
    let switch_ms = start_ms(&steps0[switch]);
    for h in &hints {
        let from = h["plan"]["step_from"].as_u64().unwrap() as usize;
        if from < steps0.len() {
            assert_eq!(steps0[from]["plan"], h["plan"], "rank 0 ran hint v{} from its step_from", h["version"]);
        }
    }

    // The policy may undo a change once and retry it when the path is still degraded (its
    // reference predated the fault); it must settle on a compressed plan, with few changes.
    assert!(hints.len() <= 5, "the plan flapped: {} hints applied", hints.len());
    let last = steps0.last().unwrap();
    assert_ne!(codec(&last["plan"]), "none", "the job ended uncompressed under the cap");

    // (b) Communication time: healthy (skip the first steps: connection setup); capped on the
    // uncompressed plan (before the change, and after an undone change if any); and on the
    // compressed plans, skipping two steps after each switch (the first drains the capped queue).
    let comm = |s: &Value| f(s, "comm_ms");
    let step = |s: &Value| f(s, "step_ms");
    let compressed = |i: usize| codec(&steps0[i]["plan"]) != "none";
    let healthy: Vec<&Value> = steps0.iter().skip(20).filter(|s| f(s, "end_unix_ms") < cap_ms as f64).collect();
    let capped: Vec<&Value> = (0..steps0.len()).filter(|&i| !compressed(i) && start_ms(&steps0[i]) >= cap_ms as f64).map(|i| &steps0[i]).collect();
    let after: Vec<&Value> = (2..steps0.len()).filter(|&i| compressed(i) && compressed(i - 1) && compressed(i - 2)).map(|i| &steps0[i]).collect();
    eprintln!(
        "steps: {} healthy, {} capped uncompressed, {} compressed (first switch at step {switch}, {:.1} s after the cap)",
        healthy.len(),
        capped.len(),
        after.len(),
        (switch_ms - cap_ms as f64) / 1e3,
    );
    assert!(healthy.len() >= 30, "only {} healthy steps before the cap", healthy.len());
    assert!(after.len() >= 50, "only {} steps ran compressed", after.len());
    // The capped, uncompressed reference. When the policy switched so fast that fewer than
    // `MIN_CAPPED_STEPS` steps ran capped and uncompressed (seen on a busy machine: 1 step, the
    // switch 0.8 s after the cap), measure it on a short static job under the same cap instead.
    let baseline: Vec<Value>;
    let capped: Vec<&Value> = if capped.len() >= MIN_CAPPED_STEPS {
        capped
    } else {
        eprintln!("only {} steps ran capped and uncompressed: measuring the capped reference on a static uncompressed job", capped.len());
        baseline = static_capped_steps(&star, &cfg);
        baseline.iter().skip(2).collect()
    };
    let (h_comm, c_comm, a_comm) = (mean(&healthy.iter().map(|s| comm(s)).collect::<Vec<_>>()), mean(&capped.iter().map(|s| comm(s)).collect::<Vec<_>>()), mean(&after.iter().map(|s| comm(s)).collect::<Vec<_>>()));
    let (h_step, c_step, a_step) = (mean(&healthy.iter().map(|s| step(s)).collect::<Vec<_>>()), mean(&capped.iter().map(|s| step(s)).collect::<Vec<_>>()), mean(&after.iter().map(|s| step(s)).collect::<Vec<_>>()));
    let hurt = c_comm / h_comm;
    let gain = c_comm / a_comm;
    let step_gain = c_step / a_step;
    eprintln!(
        "mean comm ms: healthy {h_comm:.1}, capped {c_comm:.1}, adapted ({}) {a_comm:.1}; step ms: {h_step:.1}, {c_step:.1}, {a_step:.1}",
        codec(&adapted["plan"])
    );
    eprintln!("RATIOS cap hurt ×{hurt:.2}, comm recovered ×{gain:.2}, step recovered ×{step_gain:.2}; test {:.1} s", t0.elapsed().as_secs_f64());
    assert!(hurt >= 1.5, "the cap did not hurt the job: capped comm {c_comm:.1} ms vs healthy {h_comm:.1} ms (×{hurt:.2})");
    assert!(gain >= 1.3, "the plan change did not recover comm time: capped {c_comm:.1} ms, after {a_comm:.1} ms (×{gain:.2})");
    assert!(step_gain >= 1.2, "the plan change did not recover step time: capped {c_step:.1} ms, after {a_step:.1} ms (×{step_gain:.2})");
    // Passed: the ranks' reports and logs are not needed (a failure keeps them for a look).
    let _ = std::fs::remove_dir_all(&report.out_dir);
    Ok(())
}
