//! T2: transport advice on a real PyTorch job (docs/policy.md rule 8). A 4-host testbed star, the
//! `ringside` agent in the switch namespace on every bridge port, a job registered through the
//! real API with `transport_tuning` and no codec but `none` (so that the advice is all the policy
//! can change), and a PyTorch DDP job over gloo (one rank per host) that
//! follows hints with `ringside.torch.follow_hints` and the registered constraints. After a
//! healthy warm-up, one host's link loses 2 % of its packets both ways until the job ends. The test
//! asserts:
//! - the agent published a hint with `tcp_rto_min_ms` = 5 (and none before the loss);
//! - every rank applied it at the same step, to a host route for each other rank, without a
//!   problem; while it stood, every host's routing table held those routes with `rto_min lock
//!   5ms`, protocol 82 (read in the hosts' namespaces);
//! - the ranks removed exactly their routes when they closed the follower (none left after the
//!   job);
//! - the retransmission stalls ended: under loss, at most half as many of the steps after the
//!   advice wait ≥ 200 ms (Linux's minimum retransmission timeout) longer for their gradients than
//!   the fast steps of the same phase (the lower quartile of its `comm_ms`, so that a stall on a
//!   step a little faster than the median still counts: on a busy machine a step's
//!   communication alone takes 100-200 ms, and a fixed 200 ms then counted CPU waits as stalls,
//!   72 % against 44 % at load 8-10 in session 31; and each phase its own, because the CPU's
//!   speed drifts between phases: in session 34's round 9 the warm-up's lower quartile was 108
//!   ms, the lossy phases' 149 and 160, and against the warm-up's CPU waits counted as stalls in
//!   both, 6 % against 5 %; with each phase's own, 3.0 % against 1.0 %, and rounds 3 and 5 of
//!   that session 4.6 % against 1.2 % and 2.5 % against 1.0 %) as of the
//!   steps of static runs of the same job under the same loss started right after on the same rig
//!   ([`REFERENCE_STEPS`] each, one after another until they stalled [`ENOUGH_STATIC_STALLS`]
//!   times, at most [`REFERENCE_RUNS`])
//!   (steps of a synchronous codec the policy tried meanwhile are left out: their `comm_ms`
//!   includes the codec's CPU time). The mean communication time of the two runs is printed,
//!   not compared: the two runs are sequential, and beside a build their CPU speed differs by up
//!   to 60 %, which moves a mean by more than the advice does (an RTO saved on 5-10 % of the
//!   steps). Session 34's rounds 3 and 5: stalls fell from 5 % to 1 % and from 8 % to 1 %, while
//!   the mean's gain (static over advised) was ×0.82 and ×1.32 (compute medians 110 against 68
//!   ms in round 3), and that of each run's mean over its own lower quartile ×1.07 and ×0.96
//!   (earlier forms of this test asserted a gain above 1 on the first, then on the second, and
//!   each failed once). What the advice gains a job is measured in `cargo xtask eval adaptation`
//!   (docs/eval-adaptation.md, the PyTorch column's loss-2 row). Static
//!   runs with fewer than [`MIN_STATIC_STALLS`] stalls in all make the run inconclusive (run once more):
//!   random loss does not always hit a tail segment, and then there is nothing to compare (seven
//!   runs beside a CI run, load 4-8: static stalls on 5-44 % of 57 steps, advised on 0-6 %; comm
//!   ×1.09-2.05); so do fewer than [`MIN_ADVISED_STEPS`] advised steps to count on;
//! - every loss value finite.
//!
//! Needs root, an agent built with its eBPF object (`cargo xtask test` does both) and the PyTorch
//! venv with the `ringside` package (`cargo xtask setup`). Without any of them it FAILS with the
//! reason; it never skips. Every wait is bounded; about 90 s on a quiet machine.
mod detect_rig;
mod support;

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use detect_rig::{wait_for, Agent, POLL};
use ringside_client::{Algorithm, PortRange};
use serde_json::Value;
use support::adapt::{f, mean, registration, unix_ms, Inconclusive, OutDir, RegisteredJob};
use testbed::{Star, StarConfig, TorchConfig};

const RANKS: usize = 4;
/// Not another T2 test's port: `cargo xtask test` runs test binaries side by side.
const AGENT_PORT: u16 = 9477;
/// The host whose link loses packets (not rank 0's: rank 0 also streams the hints).
const LOSSY_HOST: usize = 2;
const LOSS_PERCENT: f64 = 2.0;
/// The floor the agent advises by default (`[policy] loss_rto_min_ms`).
const ADVISED_MS: u64 = 5;
/// ringside's route protocol (`ringside.transport.RTPROT_RINGSIDE`).
const RTPROT_RINGSIDE: &str = "82";
const WARMUP: Duration = Duration::from_secs(15);
/// Under loss: 3 lossy windows to the advice, then enough steps with it to count stalls.
const LOSSY: Duration = Duration::from_secs(30);
/// Steps of a static reference run under the same loss. 100 stalled on 4 % of their steps on
/// session 27's machine, 4 of 97 in both attempts of one busy round (under the 5 needed).
const REFERENCE_STEPS: u64 = 200;
/// Static reference runs go on, one after another, until they stalled [`ENOUGH_STATIC_STALLS`]
/// times or this many ran. Beside a build (session 34, load 7-11) 200 steps stalled on 1-2 % of
/// their steps (the job's healthy communication took 175-200 ms, and the stall threshold rose
/// with it), so both attempts of round 8 had 3-4 stalls and were inconclusive; on a quiet
/// machine one run of 200 steps stalls 5-10 % of the time and is enough.
const REFERENCE_RUNS: usize = 4;
/// Stalls after which no further static reference run is needed.
const ENOUGH_STATIC_STALLS: usize = 10;
/// Fewest stalls the static reference runs must show for the comparison to mean anything.
const MIN_STATIC_STALLS: usize = 5;
/// Fewest steps under the advice (with a codec whose `comm_ms` times the network) to count
/// stalls on; fewer makes the run inconclusive. Beside one T2 loop and two builds (load ~12,
/// session 31) one run had 11: healthy steps took 225 ms of communication and the policy kept
/// int8 for most of the lossy phase (the job allows no codec since session 32).
const MIN_ADVISED_STEPS: usize = 20;
/// A step whose gradients took this much longer than a healthy step's waited for a
/// retransmission timeout (at least 200 ms).
const STALL_MS: f64 = 200.0;
const SKIP_STEPS: usize = 3;

/// ringside's host routes in `host`'s namespace: (destination, `ip route get`'s view of it).
fn ringside_routes(star: &Star, host: usize) -> Vec<(String, String)> {
    let ns = &star.hosts[host].ns;
    let out = ns.command("ip").args(["-j", "route", "show", "proto", RTPROT_RINGSIDE]).output().expect("ip route show");
    assert!(out.status.success(), "ip route show in h{host}: {}", String::from_utf8_lossy(&out.stderr));
    let routes: Vec<Value> = serde_json::from_slice(&out.stdout).expect("ip -j route show: JSON");
    routes
        .iter()
        .map(|r| {
            let dst = r["dst"].as_str().expect("a route with a destination").to_string();
            let got = ns.command("ip").args(["route", "get", &dst]).output().expect("ip route get");
            (dst, String::from_utf8_lossy(&got.stdout).trim().to_string())
        })
        .collect()
}

/// Steps whose gradients waited for a retransmission timeout: `comm_ms` at least `stall_ms`
/// ([`stall_threshold`]).
fn stall_count(comm: &[f64], stall_ms: f64) -> usize {
    comm.iter().filter(|&&c| c >= stall_ms).count()
}

/// Whether a step's `comm_ms` measures the network: not for a synchronous codec (int8, top-k),
/// whose hook compresses inside the backward pass and times that CPU work as communication (on a
/// loaded machine 10 of an int8 trial's 12 steps took ≥ 200 ms without a retransmission timeout,
/// session 27). A guard: the job allows no codec, so no step should be left out.
fn times_the_network(step: &Value) -> bool {
    !step["compression"].as_str().is_some_and(|c| c == "int8" || c.starts_with("topk"))
}

/// A stall's least `comm_ms` in a phase: [`STALL_MS`] over the lower quartile of the phase's
/// own steps (infinite for no steps).
fn stall_threshold(comm: &[f64]) -> f64 {
    ringside_stats::quantile(comm, 0.25).map_or(f64::INFINITY, |q| q + STALL_MS)
}

/// The share of steps that stalled.
fn stalls(comm: &[f64], stall_ms: f64) -> f64 {
    stall_count(comm, stall_ms) as f64 / comm.len().max(1) as f64
}

#[test]
#[ignore = "needs root (T2): run with cargo xtask test"]
fn loss_brings_a_retransmission_floor_to_every_rank_at_once_and_the_stalls_end() {
    support::adapt::at_most_twice(loss_run);
}

fn loss_run() -> Result<(), Inconclusive> {
    let python = support::adapt::torch_preconditions("t2_transport");
    let t0 = Instant::now();
    let star = Star::new(StarConfig { hosts: RANKS, offloads: false, ..Default::default() }).unwrap();
    let mgmt = star.add_management_address().expect("management address on the switch bridge");
    let agent = Agent::start_with(&star, "transport", IpAddr::from([0, 0, 0, 0]), AGENT_PORT, "[match]\nprefixes = [\"10.77.0.0/24\"]\n");
    let operator_token = wait_for(Duration::from_secs(5), POLL, "the agent's operator token", || agent.token());

    let out = OutDir::new("t2-transport");
    let mut cfg = TorchConfig {
        ranks: RANKS,
        steps: 0,
        duration: Some(WARMUP + LOSSY),
        python: Some(python),
        timeout: WARMUP + LOSSY + Duration::from_secs(120),
        out_dir: Some(out.path.clone()),
        ..Default::default()
    };
    let (lo, hi) = cfg.port_range().split_once('-').map(|(a, b)| (a.parse().unwrap(), b.parse().unwrap())).unwrap();
    let members = star.hosts.iter().map(|h| format!("{}/32", h.addr)).collect();
    let mut wanted = registration("t2-transport", members, PortRange { lo, hi }, cfg.grad_bytes(), vec![Algorithm::Ring]);
    wanted.constraints.transport_tuning = true;
    // No codec to choose: the plan stays uncompressed, so every step under the advice times the
    // network and the stalls are the advice's alone. With int8 allowed the policy moved the job to
    // it once the advice had settled (the loss remained) and kept it: 13 and 14 uncompressed steps
    // under the advice in both attempts of one busy round (session 32), too few to count on.
    wanted.constraints.codecs = vec!["none".into()];
    let job = RegisteredJob::register(&star, &agent.url(), mgmt, AGENT_PORT, &operator_token, &wanted);
    cfg.follow_hints = Some((job.job_url.clone(), job.tenant.clone()));
    cfg.follow_constraints = Some(serde_json::to_string(&wanted.constraints).unwrap());

    let running = testbed::spawn_torch(&star, &cfg).expect("starting the DDP job");
    testbed::torch::wait_training_started(&running, Duration::from_secs(90), None).expect("every rank training");
    eprintln!("every rank training {:.1} s into the test", t0.elapsed().as_secs_f64());
    std::thread::sleep(WARMUP);
    let before = job.hint(&star).expect("GET hints before the loss");
    assert_eq!(before.tcp_rto_min_ms, None, "transport advice before any loss: {before:?}");
    let loss_ms = unix_ms();
    let loss = star.add_loss(LOSSY_HOST, LOSS_PERCENT).expect("loss on the host's link");
    eprintln!("{LOSS_PERCENT} % loss on h{LOSSY_HOST}'s link after {WARMUP:?} of training");

    // The advice, then the routes it put in every host's table while the job still runs.
    let from = Instant::now();
    let advised = wait_for(LOSSY - Duration::from_secs(10), POLL, "a hint with transport advice", || {
        job.hint(&star).ok().filter(|h| h.tcp_rto_min_ms.is_some())
    });
    eprintln!("hint v{} advises {:?} ms, {:.1} s after the loss: {:?}", advised.version, advised.tcp_rto_min_ms, from.elapsed().as_secs_f64(), advised.reasons);
    assert_eq!(advised.tcp_rto_min_ms, Some(ADVISED_MS as u32));
    let others = |host: usize| -> Vec<String> { (0..RANKS).filter(|&h| h != host).map(|h| star.hosts[h].addr.to_string()).collect() };
    let tables = wait_for(Duration::from_secs(10), POLL, "every rank's routes with the floor", || {
        let t: Vec<Vec<(String, String)>> = (0..RANKS).map(|h| ringside_routes(&star, h)).collect();
        t.iter().enumerate().all(|(h, routes)| others(h).iter().all(|a| routes.iter().any(|(d, _)| d == a))).then_some(t)
    });
    for (h, routes) in tables.iter().enumerate() {
        for (dst, got) in routes {
            assert!(got.contains(&format!("rto_min lock {ADVISED_MS}ms")), "h{h}'s route to {dst} does not carry the floor: {got}");
        }
        eprintln!("h{h}: ringside routes to {:?}", routes.iter().map(|(d, _)| d.as_str()).collect::<Vec<_>>());
    }

    let report = running.wait(None).expect("the DDP job ran to the end");
    eprintln!("job wall time {:.1} s; rank reports in {}", report.wall_ms / 1e3, report.out_dir.display());
    eprintln!("agent events:{}", detect_rig::summary(&agent.events(&star)));
    for h in 0..RANKS {
        assert_eq!(ringside_routes(&star, h), vec![], "h{h} kept ringside routes after its rank closed the follower");
    }
    let ranks: Vec<Value> = report.ranks.iter().map(|r| serde_json::from_str(&std::fs::read_to_string(&r.out).unwrap()).unwrap()).collect();
    for (r, summary) in report.ranks.iter().enumerate() {
        assert!(summary.error.is_none(), "rank {r} reported an error: {:?} (log {})", summary.error, summary.log.display());
    }

    // Every rank applied the advice at the same step, to a route for each other rank.
    let transport0 = ranks[0]["transport"].as_array().cloned().unwrap_or_default();
    let first = transport0.first().unwrap_or_else(|| panic!("rank 0 applied no transport advice: {}", ranks[0]["hints"]));
    assert_eq!(first["tcp_rto_min_ms"].as_u64(), Some(ADVISED_MS), "{first}");
    for (r, v) in ranks.iter().enumerate() {
        let t = v["transport"].as_array().cloned().unwrap_or_default();
        assert_eq!(t.first().map(|x| &x["step"]), Some(&first["step"]), "rank {r} applied the advice at another step: {t:?} vs {transport0:?}");
        let x = &t[0];
        assert_eq!(x["problems"], Value::Array(vec![]), "rank {r}: {x}");
        let mut routes: Vec<String> = x["routes"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect();
        routes.sort();
        assert_eq!(routes, others(r), "rank {r} set the floor on other routes than its peers'");
        assert_eq!(v["hints"], ranks[0]["hints"], "rank {r} applied other plan changes than rank 0");
    }
    let steps0 = ranks[0]["steps"].as_array().unwrap();
    for (i, s) in steps0.iter().enumerate() {
        assert!(f(s, "loss").is_finite(), "step {i}: loss {} is not finite", s["loss"]);
    }

    let advised_from = first["step"].as_u64().unwrap() as usize;
    let advised_comm: Vec<f64> = steps0.iter().skip(advised_from + 1).filter(|s| times_the_network(s)).map(|s| f(s, "comm_ms")).collect();
    // The job's healthy communication time: its warm-up steps before the loss.
    let healthy: Vec<f64> =
        steps0.iter().skip(SKIP_STEPS).filter(|s| f(s, "end_unix_ms") < loss_ms as f64).map(|s| f(s, "comm_ms")).collect();
    assert!(healthy.len() >= 5, "only {} healthy steps before the loss", healthy.len());
    let healthy_ms = ringside_stats::quantile(&healthy, 0.25).expect("healthy steps");

    // The stalls without the advice: static reference runs under the same loss, right after on
    // the same rig, until they stalled often enough to compare with (or REFERENCE_RUNS ran).
    let mut static_comm: Vec<f64> = Vec::new();
    let mut reference_runs = 0;
    while reference_runs < REFERENCE_RUNS && stall_count(&static_comm, stall_threshold(&static_comm)) < ENOUGH_STATIC_STALLS {
        let reference_cfg = TorchConfig {
            follow_hints: None,
            follow_constraints: None,
            steps: REFERENCE_STEPS,
            duration: None,
            timeout: Duration::from_secs(150),
            out_dir: Some(out.path.join(format!("static-under-loss-{reference_runs}"))),
            ..cfg.clone()
        };
        let reference = testbed::spawn_torch(&star, &reference_cfg).and_then(|job| job.wait(None)).expect("the static reference run under the loss");
        let reference0: Value = serde_json::from_str(&std::fs::read_to_string(&reference.ranks[0].out).unwrap()).unwrap();
        assert!(reference0["error"].is_null(), "the static reference run failed: {}", reference0["error"]);
        static_comm.extend(reference0["steps"].as_array().unwrap().iter().skip(SKIP_STEPS).map(|s| f(s, "comm_ms")));
        reference_runs += 1;
    }
    drop(loss);
    let (static_stall_ms, advised_stall_ms) = (stall_threshold(&static_comm), stall_threshold(&advised_comm));
    let before_advice: Vec<f64> =
        steps0.iter().take(advised_from).filter(|s| f(s, "end_unix_ms") - f(s, "step_ms") >= loss_ms as f64).map(|s| f(s, "comm_ms")).collect();
    eprintln!(
        "healthy: {} steps, comm lower quartile {healthy_ms:.1} ms; \
         under loss: static runs {reference_runs}, {} steps, comm mean {:.1} ms, {:.1} % of steps stalled (≥ {static_stall_ms:.1} ms); \
         adaptive before the advice {} steps ({:.1} ms); with the advice {} steps, comm mean {:.1} ms, {:.1} % stalled (≥ {advised_stall_ms:.1} ms); test {:.1} s",
        healthy.len(),
        static_comm.len(),
        mean(&static_comm),
        100.0 * stalls(&static_comm, static_stall_ms),
        before_advice.len(),
        mean(&before_advice),
        advised_comm.len(),
        mean(&advised_comm),
        100.0 * stalls(&advised_comm, advised_stall_ms),
        t0.elapsed().as_secs_f64()
    );
    // Too few steps to count stalls on: the machine ran the job slowly, or the policy kept a
    // synchronous codec for most of them (its steps are left out above). Neither says anything
    // about the advice; the run is inconclusive (and runs once more, `at_most_twice`).
    if advised_comm.len() < MIN_ADVISED_STEPS {
        let codec_steps = steps0.iter().skip(advised_from + 1).filter(|s| !times_the_network(s)).count();
        return Err(Inconclusive(format!(
            "only {} steps ran with the advice and a network-timed codec ({codec_steps} more with int8 or top-k; healthy steps' communication lower quartile {healthy_ms:.0} ms): too few to count stalls on",
            advised_comm.len()
        )));
    }
    let static_stalls = stall_count(&static_comm, static_stall_ms);
    if static_stalls < MIN_STATIC_STALLS {
        return Err(Inconclusive(format!(
            "{reference_runs} static runs under {LOSS_PERCENT} % loss stalled (≥ {static_stall_ms:.0} ms) on only {static_stalls} of {} steps: too few to compare",
            static_comm.len()
        )));
    }
    assert!(
        stalls(&advised_comm, advised_stall_ms) <= 0.5 * stalls(&static_comm, static_stall_ms),
        "the advice did not halve the retransmission stalls (200 ms over each phase's lower quartile): {:.1} % of advised steps (≥ {advised_stall_ms:.0} ms) against {:.1} % without (≥ {static_stall_ms:.0} ms)",
        100.0 * stalls(&advised_comm, advised_stall_ms),
        100.0 * stalls(&static_comm, static_stall_ms)
    );
    Ok(())
}
