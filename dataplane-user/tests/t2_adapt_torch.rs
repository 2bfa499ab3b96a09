//! T2: the closed loop on a real PyTorch job. A 4-host testbed star, the `ringside` agent in the
//! switch namespace on every bridge port (listening on 0.0.0.0, reached by the hosts at the star's
//! management address), a job registered through the real API (`POST /v1/jobs`: members = the
//! ranks' addresses, TCP ports = the DDP job's port range, compression allowed), and a PyTorch
//! DistributedDataParallel job over gloo (`testbed::spawn_torch`, one rank per host) whose comm
//! hook is `ringside.torch.follow_hints`. After a healthy warm-up, one host's link is rate-capped
//! to a quarter of the rate it was sending at, until the job ends. The test asserts, from the
//! ranks' own per-step records:
//! - nothing changed before the cap (unless rank 0's own communication time explains it: the run
//!   is then inconclusive and runs once more, `support::adapt::early_change`), and the cap hurt (uncompressed communication time under the
//!   cap ≥ 1.5× healthy);
//! - a compressed hint of version ≥ 2 was applied after the cap, and every rank ran the same codec
//!   and hint version at every step: every rank switched at the same step;
//! - the job settled on a compressed plan, with few changes;
//! - the communication recovered: the compressed steps under the cap communicate (`comm_ms`) at
//!   least 1.3× faster than the steps of a static (uncompressed) run of the same job started right
//!   after on the same rig under the same cap (ratios, never absolute times; not step time, which
//!   other work on the cores stretches by CPU time the link never touched);
//! - the model still trained: every loss finite, and the loss fell;
//! - the agent's job metrics show the plan the job ended on as rank 0 reported it
//!   (`ringside_job_plan_reported_info`, from `ringside.torch`'s `PUT {job}/plan`).
//!
//! Why the algorithm is constrained to ring: DDP's allreduce is gloo's, which the hook cannot
//! change; only the codec is the tenant's to switch (a tenant registers what its job can follow).
//!
//! Needs root, an agent built with its eBPF object (`cargo xtask test` does both) and the PyTorch
//! venv with the `ringside` package (`cargo xtask setup`, `target/venv`, or `RINGSIDE_PYTHON`).
//! Without any of them it FAILS with the reason; it never skips. Every wait is bounded; the whole
//! test takes about 80 s on a quiet machine (each rank imports torch, twice: 5-15 s of CPU), up to 4
//! min when other work saturates the cores (bounded: the jobs are killed after 170 s and 150 s).
mod detect_rig;
mod support;

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use detect_rig::{wait_for, Agent, POLL};
use ringside_client::{Algorithm, PortRange};
use serde_json::Value;
use support::adapt::{Inconclusive, OutDir, f, host_send_rate_mbit, mean, registration, unix_ms, RegisteredJob};
use testbed::{Star, StarConfig, TorchConfig};

const RANKS: usize = 4;
/// Not t2_adapt's port: `cargo xtask test` may run both test binaries at once (each in its own rig).
const AGENT_PORT: u16 = 9475;
/// The host whose link is capped (not rank 0's: rank 0 also streams the hints).
const CAPPED_HOST: usize = 2;
/// The cap is this fraction of what the host sent during the warm-up (its in-phase rate, see
/// `host_send_rate_mbit`): the uncompressed job must slow down several times, and an int8 plan
/// (a quarter of the bytes) fits under it again.
const CAP_FRACTION: f64 = 0.25;
/// Healthy run before the cap: the policy needs `min_baseline_windows` healthy 1 s windows, and
/// the detectors their own baseline.
const WARMUP: Duration = Duration::from_secs(15);
/// How long the job runs under the cap: detection (a few 1 s windows), the hint, then enough
/// compressed steps to measure.
const CAPPED: Duration = Duration::from_secs(35);
/// Steps of the static reference run under the cap (see (b) in the test): a count, not a time,
/// since a capped uncompressed step takes 0.5 s on a quiet machine and over 2 s on a loaded one.
const REFERENCE_STEPS: u64 = SKIP_STEPS as u64 + 6;

/// Steps left out of the healthy mean: step 0 opens connections and DDP rebuilds its buckets
/// after it; the next ones still warm caches and allocators.
const SKIP_STEPS: usize = 3;

fn codec(step: &Value) -> &str {
    step["compression"].as_str().unwrap_or_else(|| panic!("step record without a compression: {step}"))
}

#[test]
#[ignore = "needs root (T2): run with cargo xtask test"]
fn rate_cap_makes_a_ddp_job_compress_on_every_rank_at_once_and_its_communication_recovers() {
    support::adapt::at_most_twice(rate_cap_run);
}

fn rate_cap_run() -> Result<(), Inconclusive> {
    let python = support::adapt::torch_preconditions("t2_adapt_torch");
    let t0 = Instant::now();
    let star = Star::new(StarConfig { hosts: RANKS, offloads: false, ..Default::default() }).unwrap();
    let mgmt = star.add_management_address().expect("management address on the switch bridge");
    let agent = Agent::start_with(&star, "adapt-torch", IpAddr::from([0, 0, 0, 0]), AGENT_PORT, "[match]\nprefixes = [\"10.77.0.0/24\"]\n");
    let operator_token = wait_for(Duration::from_secs(5), POLL, "the agent's operator token", || agent.token());

    let out = OutDir::new("t2-adapt-torch");
    let mut cfg = TorchConfig {
        ranks: RANKS,
        steps: 0,
        duration: Some(WARMUP + CAPPED),
        python: Some(python),
        // Import, rendezvous and the run itself, with a wide margin for a loaded machine (importing
        // torch and building DDP has taken 80 s there).
        timeout: WARMUP + CAPPED + Duration::from_secs(120),
        out_dir: Some(out.path.clone()),
        ..Default::default()
    };
    let (lo, hi) = cfg.port_range().split_once('-').map(|(a, b)| (a.parse().unwrap(), b.parse().unwrap())).unwrap();

    // Register the job through the API, as its launcher would.
    let members = star.hosts.iter().map(|h| format!("{}/32", h.addr)).collect();
    let wanted = registration("t2-adapt-torch", members, PortRange { lo, hi }, cfg.grad_bytes(), vec![Algorithm::Ring]);
    let job = RegisteredJob::register(&star, &agent.url(), mgmt, AGENT_PORT, &operator_token, &wanted);
    let (job_url, tenant) = (job.job_url.clone(), job.tenant.clone());
    eprintln!("registered job {} ({:.1} s into the test); rank 0 follows {job_url}", job.id, t0.elapsed().as_secs_f64());

    cfg.follow_hints = Some((job_url.clone(), tenant.clone()));
    let running = testbed::spawn_torch(&star, &cfg).expect("starting the DDP job");
    testbed::torch::wait_training_started(&running, Duration::from_secs(90), None).expect("every rank training");
    eprintln!("every rank training {:.1} s into the test", t0.elapsed().as_secs_f64());
    let rate_samples = 20;
    std::thread::sleep(WARMUP - Duration::from_millis(100 * rate_samples as u64));
    let rate = host_send_rate_mbit(&star, CAPPED_HOST, rate_samples);
    let cap_mbit = ((rate * CAP_FRACTION).round() as u64).max(10);
    let before_cap = job.hint(&star).expect("GET hints before the cap");
    let cap_ms = unix_ms();
    let cap = star.rate_cap(CAPPED_HOST, cap_mbit).expect("rate cap");
    eprintln!("capped host {CAPPED_HOST}'s link at {cap_mbit} Mbit/s ({CAP_FRACTION} of the {rate:.0} Mbit/s it sent at) after {WARMUP:?} of training (hint then: v{})", before_cap.version);

    job.watch_for_new_hint(&star, before_cap.version, CAPPED - Duration::from_secs(5));
    let report = running.wait(None).expect("the DDP job ran to the end");
    eprintln!("job wall time {:.1} s; test so far {:.1} s; rank reports in {}", report.wall_ms / 1e3, t0.elapsed().as_secs_f64(), report.out_dir.display());
    eprintln!("agent events:{}", detect_rig::summary(&agent.events(&star)));
    let metrics = job.metrics(&star);
    eprintln!("job metrics:\n{metrics}");

    // Every rank finished, and every rank ran the same number of steps (rank 0 decides the stop).
    let ranks: Vec<Value> = report.ranks.iter().map(|r| serde_json::from_str(&std::fs::read_to_string(&r.out).unwrap()).unwrap()).collect();
    for (r, summary) in report.ranks.iter().enumerate() {
        assert!(summary.error.is_none(), "rank {r} reported an error: {:?} (log {})", summary.error, summary.log.display());
    }
    let steps0 = ranks[0]["steps"].as_array().unwrap();
    for (r, v) in ranks.iter().enumerate().skip(1) {
        let steps = v["steps"].as_array().unwrap();
        assert_eq!(steps.len(), steps0.len(), "rank {r} and rank 0 ran different step counts");
        // Every rank switched at the same step: codec and hint version equal at every step.
        for (a, b) in steps0.iter().zip(steps) {
            assert_eq!(
                (codec(a), &a["hint_version"]),
                (codec(b), &b["hint_version"]),
                "step {}: rank 0 and rank {r} ran different plans",
                a["step"]
            );
        }
        assert_eq!(v["hints"], ranks[0]["hints"], "rank {r} applied other plan changes than rank 0");
    }
    for (i, s) in steps0.iter().enumerate() {
        assert!(f(s, "loss").is_finite(), "step {i}: loss {} is not finite", s["loss"]);
    }

    // (a) The applied plan changes: none before the cap; a compressed one after it.
    let hints = ranks[0]["hints"].as_array().cloned().unwrap_or_default();
    let start_ms = |s: &Value| f(s, "end_unix_ms") - f(s, "step_ms");
    for h in &hints {
        let at = h["step"].as_u64().unwrap() as usize;
        eprintln!("every rank applied hint v{} ({}) at step {at}, {:+.1} s from the cap", h["version"], h["compression"], (start_ms(&steps0[at]) - cap_ms as f64) / 1e3);
    }
    if let Some(l) = ranks[0].get("latest_hint") {
        eprintln!("rank 0's latest hint: {l}");
    }
    eprintln!("rank 0 mean comm ms per second before the cap: {}", support::adapt::comm_per_second(steps0, cap_ms as f64));
    let early: Vec<&Value> = steps0.iter().filter(|s| f(s, "end_unix_ms") < cap_ms as f64 && (codec(s) != "none" || s["hint_version"].as_u64() > Some(1))).collect();
    if let Some(s) = early.first() {
        return Err(support::adapt::early_change(steps0, SKIP_STEPS, start_ms(s), &format!("{early:?}")));
    }
    let adapted = hints
        .iter()
        .find(|h| h["version"].as_u64() >= Some(2) && h["compression"] != "none")
        .unwrap_or_else(|| panic!("no compressed hint of version ≥ 2 was applied after the cap; applied: {hints:?}"));
    let switch = adapted["step"].as_u64().unwrap() as usize;
    assert_eq!(codec(&steps0[switch]), adapted["compression"], "rank 0 ran the hinted codec from the step it applied it");
    // The policy may undo a change once and retry it (see "Verification" in docs/policy.md); it
    // must settle on a compressed plan, with few changes.
    assert!(hints.len() <= 5, "the plan flapped: {} changes applied", hints.len());
    assert_ne!(codec(steps0.last().unwrap()), "none", "the job ended uncompressed under the cap");
    // Rank 0 reported the plan it ran (`PUT {job}/plan`, ringside.torch's reporter, every second):
    // the agent shows the last one next to the hint.
    let want = format!("ringside_job_plan_reported_info{{job=\"{}\",algorithm=\"ring\",compression=\"{}\"}} 1", job.id, codec(steps0.last().unwrap()));
    assert!(metrics.contains(&want), "the agent does not show the plan rank 0 reported ({want}):\n{metrics}");

    // (b) Step time. The reference for "uncompressed under the cap" is a second, static run of
    // the same job on the same rig under the same cap, right after: the agent reacts within one
    // or two capped steps, and on a machine loaded by other work one step can take a second, so
    // the adaptive run itself may hold a single uncompressed capped step (its own ones are
    // reported, not asserted). Healthy: the adaptive run's steps before the cap (after the first
    // few: DDP rebuilds its buckets, connections open); compressed: its compressed steps, skipping
    // two after each switch (the first drains the capped queue).
    let reference_cfg = TorchConfig {
        follow_hints: None,
        steps: REFERENCE_STEPS,
        duration: None,
        timeout: Duration::from_secs(150),
        out_dir: Some(out.path.join("static-under-cap")),
        ..cfg.clone()
    };
    let reference = testbed::spawn_torch(&star, &reference_cfg)
        .and_then(|job| job.wait(None))
        .expect("the static reference run under the cap");
    let reference0: Value = serde_json::from_str(&std::fs::read_to_string(&reference.ranks[0].out).unwrap()).unwrap();
    assert!(reference0["error"].is_null(), "the static reference run failed: {}", reference0["error"]);
    drop(cap);

    let compressed = |i: usize| codec(&steps0[i]) != "none";
    // Both per-step times, step_ms and comm_ms (the span of the step's gradient communication,
    // see testbed/python/ringside_ddp_train.py). The ratios are asserted on comm_ms: on a machine
    // whose cores other work saturates, forward, backward and the optimizer stretch every step
    // alike (healthy steps of 479 ms instead of ≈ 100 ms were seen at load 20), so a step-time
    // ratio shrinks toward 1 by CPU time the link never touched (×1.22 then, for a compressed plan
    // that did its job). The communication span is what the cap slows and the codec speeds up.
    let times = |key: &'static str| {
        let healthy: Vec<f64> = steps0.iter().skip(SKIP_STEPS).filter(|s| f(s, "end_unix_ms") < cap_ms as f64).map(|s| f(s, key)).collect();
        let static_capped: Vec<f64> = reference0["steps"].as_array().unwrap().iter().skip(SKIP_STEPS).map(|s| f(s, key)).collect();
        let own_capped: Vec<f64> = (0..steps0.len()).filter(|&i| !compressed(i) && start_ms(&steps0[i]) >= cap_ms as f64).map(|i| f(&steps0[i], key)).collect();
        let after: Vec<f64> = (2..steps0.len()).filter(|&i| compressed(i) && compressed(i - 1) && compressed(i - 2)).map(|i| f(&steps0[i], key)).collect();
        (healthy, static_capped, own_capped, after)
    };
    let (healthy, static_capped, own_capped, after) = times("step_ms");
    eprintln!(
        "steps: {} healthy, {} compressed (first switch at step {switch}, {:.1} s after the cap), {} of the static run under the cap; \
         the adaptive run's own uncompressed steps under the cap: {own_capped:?} ms",
        healthy.len(),
        after.len(),
        (start_ms(&steps0[switch]) - cap_ms as f64) / 1e3,
        static_capped.len(),
    );
    // Counts, not times: an idle machine runs ≈ 100 healthy and ≈ 170 compressed steps; a
    // machine loaded by several other experiments has been seen to run ten times fewer.
    assert!(healthy.len() >= 5, "only {} healthy steps before the cap", healthy.len());
    assert!(static_capped.len() >= 3, "only {} steps of the static run under the cap", static_capped.len());
    assert!(after.len() >= 10, "only {} steps ran compressed", after.len());
    let (h_step, c_step, a_step) = (mean(&healthy), mean(&static_capped), mean(&after));
    let (healthy, static_capped, _, after) = times("comm_ms");
    let (h_comm, c_comm, a_comm) = (mean(&healthy), mean(&static_capped), mean(&after));
    let (hurt, gain) = (c_comm / h_comm, c_comm / a_comm);
    eprintln!("mean step ms: healthy {h_step:.1}, static under the cap {c_step:.1}, adapted ({}) under the cap {a_step:.1}", adapted["compression"]);
    eprintln!("mean comm ms: healthy {h_comm:.1}, static under the cap {c_comm:.1}, adapted under the cap {a_comm:.1}");
    eprintln!(
        "RATIOS cap hurt comm ×{hurt:.2} (step ×{:.2}), comm recovered ×{gain:.2} (step ×{:.2}); test {:.1} s",
        c_step / h_step,
        c_step / a_step,
        t0.elapsed().as_secs_f64()
    );
    assert!(hurt >= 1.5, "the cap did not slow the job's communication: static under the cap {c_comm:.1} ms vs healthy {h_comm:.1} ms (×{hurt:.2})");
    assert!(gain >= 1.3, "the plan change did not recover communication time: static under the cap {c_comm:.1} ms, compressed {a_comm:.1} ms (×{gain:.2})");

    // (c) The model trained through the switch: the loss (mean over ranks) fell from the first
    // steps to the last ones.
    let loss_at = |i: usize| mean(&ranks.iter().map(|v| f(&v["steps"][i], "loss")).collect::<Vec<_>>());
    let n = steps0.len();
    let (first, last) = (mean(&(0..5).map(loss_at).collect::<Vec<_>>()), mean(&(n - 5..n).map(loss_at).collect::<Vec<_>>()));
    eprintln!("loss (mean over ranks) {first:.4} over the first 5 steps, {last:.4} over the last 5");
    assert!(last < 0.8 * first, "the loss did not fall: {first:.4} -> {last:.4}");
    Ok(())
}
