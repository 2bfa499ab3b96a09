//! Closed-loop policy tests: a fake job whose communication time follows the plan the policy
//! publishes (the "truth" is the cost model with its own α, per-peer bandwidths and seeded
//! noise), observed through the same `JobWindow`s the collector builds.

use std::net::IpAddr;

use ringside_client::{Algorithm, Codec, Constraints, Hint};

use super::cost::{CostConstants, CostModel, PathModel, PlanChoice};
use super::job_policy::{DecisionKind, JobContext, JobPolicy, PlanInForce};
use super::observe::{PhaseParams, VerdictSummary};
use super::PolicyConfig;
use crate::detect::{BurstSummary, JobWindow, PeerWindow};

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;
const MIB16: u64 = 16 << 20;

/// splitmix64, seeded.
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in [1 − a, 1 + a].
    fn factor(&mut self, a: f64) -> f64 {
        1.0 + a * (2.0 * self.unit() - 1.0)
    }
}

struct FakeJob {
    peers: Vec<IpAddr>,
    /// Path bandwidth per peer, bytes/s.
    bw: Vec<f64>,
    /// Loss ratio per peer.
    loss: Vec<f64>,
    gradient_bytes: u64,
    compute_ns: u64,
    truth: CostModel,
    /// Whether compression shortens the wire time (false: the path is CPU-bound, it does not).
    compression_helps: bool,
    /// Extra compute of one rank (its peers wait: a straggler).
    straggler_ns: u64,
    /// A peer whose path runs at a quarter of its bandwidth only while the job sends
    /// uncompressed: a rate cap that a compressed job fits under (its queue never fills, so the
    /// compressed job sees no slowdown at all).
    capped_when_uncompressed: Option<usize>,
    /// Whether the tenant registered `gradient_bytes` (else the policy estimates it).
    tell_gradient: bool,
    /// Noise: per-window factor and per-step per-peer factor on bandwidth, ± fraction.
    window_noise: f64,
    step_noise: f64,
    t_ns: u64,
    rng: Rng,
}

impl FakeJob {
    /// 4 ranks (this host and 3 peers) at the testbed's 0.43 GB/s, 16 MiB, 50 ms compute.
    fn testbed(seed: u64) -> Self {
        FakeJob {
            peers: (2..=4).map(|i| format!("10.0.0.{i}").parse().unwrap()).collect(),
            bw: vec![0.43e9; 3],
            loss: vec![0.0; 3],
            gradient_bytes: MIB16,
            compute_ns: 50 * MS,
            truth: CostModel::new(CostConstants { alpha_s: 150e-6, ..Default::default() }),
            compression_helps: true,
            straggler_ns: 0,
            capped_when_uncompressed: None,
            tell_gradient: false,
            window_noise: 0.05,
            step_noise: 0.05,
            t_ns: 0,
            rng: Rng(seed),
        }
    }

    fn window(&mut self, plan: &PlanChoice) -> JobWindow {
        let n = self.peers.len() + 1;
        let start = self.t_ns;
        let end = start + S;
        let wf = self.rng.factor(self.window_noise);
        let mut bursts: Vec<Vec<BurstSummary>> = vec![Vec::new(); self.peers.len()];
        let mut loss_pkts = vec![0u64; self.peers.len()];
        let mut data_pkts = vec![0u64; self.peers.len()];
        let wire_plan = if self.compression_helps { *plan } else { PlanChoice { compression: Codec::None, ..*plan } };
        let peer_bytes = (self.gradient_bytes as f64 * plan.compression.wire_bytes_per_f32() / 4.0 * 2.0 * (n as f64 - 1.0) / n as f64) as u64;
        let mut t = self.t_ns;
        loop {
            let c0 = t + self.compute_ns;
            let mut step_end = c0;
            let durations: Vec<u64> = (0..self.peers.len())
                .map(|i| {
                    let cap = if self.capped_when_uncompressed == Some(i) && plan.compression == Codec::None { 0.25 } else { 1.0 };
                    let bw = self.bw[i] * cap * wf * self.rng.factor(self.step_noise);
                    let path = PathModel { ranks: n, bytes: self.gradient_bytes as f64, bandwidth_bps: bw, lossy: self.loss[i] > 0.0 };
                    (self.truth.seconds(&wire_plan, &path) * 1e9) as u64
                })
                .collect();
            // The ring runs at its slowest path; every peer's phase spans the whole allreduce.
            let comm = *durations.iter().max().unwrap();
            for (i, b) in bursts.iter_mut().enumerate() {
                let (s, e) = if self.straggler_ns > 0 && i != 0 {
                    // Peers send a first chunk, then wait for rank 0's late data.
                    b.push(BurstSummary { start_ns: c0, end_ns: c0 + 2 * MS, bytes: peer_bytes / 6, to: None });
                    (c0 + self.straggler_ns, c0 + self.straggler_ns + comm)
                } else {
                    (c0 + if i == 0 { self.straggler_ns } else { 0 }, c0 + self.straggler_ns + comm)
                };
                // The kernel splits a phase into bursts at 1 ms idle gaps.
                let mid = s + (e - s) / 2;
                b.push(BurstSummary { start_ns: s, end_ns: mid, bytes: peer_bytes / 2, to: None });
                b.push(BurstSummary { start_ns: mid + MS / 2, end_ns: e, bytes: peer_bytes - peer_bytes / 2, to: None });
                let pk = peer_bytes / 1448;
                data_pkts[i] += pk;
                loss_pkts[i] += (pk as f64 * self.loss[i]) as u64;
                step_end = step_end.max(e);
            }
            t = step_end;
            if t >= end {
                break;
            }
        }
        // Bursts that end after the window belong to the next one: keep it simple and let the
        // next window start where the last step ended.
        self.t_ns = t;
        JobWindow {
            job: "j".into(),
            window_start_ns: start,
            window_end_ns: t.max(start + 1),
            peers: self
                .peers
                .iter()
                .enumerate()
                .map(|(i, &peer)| PeerWindow {
                    peer,
                    link: format!("veth{i}"),
                    bytes: bursts[i].iter().map(|b| b.bytes).sum(),
                    data_packets: data_pkts[i],
                    retrans: loss_pkts[i] + 3,
                    ce_marks: 0,
                    cnps: 0,
                    psn_gap_packets: 0,
                    naks: 0,
                    bursts: std::mem::take(&mut bursts[i]),
                    explained_by: None,
                    shared_links: Vec::new(),
                    pokes: Vec::new(),
                })
                .collect(),
            links: Vec::new(),
            conns: Vec::new(),
            local: None,
        }
    }
}

fn baseline() -> PlanChoice {
    PlanChoice { algorithm: Algorithm::Ring, chunk_bytes: 1 << 20, channels: 1, compression: Codec::None, error_feedback: false }
}

/// Runs `windows` windows; `at(w, job, verdicts)` changes the world before window `w`.
/// Returns the policy and the plan of every window.
fn run(
    job: &mut FakeJob,
    constraints: &Constraints,
    windows: usize,
    mut at: impl FnMut(usize, &mut FakeJob, &mut VerdictSummary),
) -> (JobPolicy, Vec<PlanChoice>) {
    let mut p = JobPolicy::new(PolicyConfig::default(), PhaseParams::default(), baseline());
    let ctx = JobContext { constraints, gradient_bytes: job.tell_gradient.then_some(job.gradient_bytes) };
    let mut verdicts = VerdictSummary::default();
    let mut plans = Vec::new();
    for w in 0..windows {
        at(w, job, &mut verdicts);
        let jw = job.window(p.current());
        let out = p.observe(&jw, verdicts.clone(), &ctx, None, 1_000 * w as u64);
        if let Some(c) = &out.change {
            assert!(c.kind != DecisionKind::Verified);
            assert!(!c.reasons.is_empty(), "{c:?}");
            assert!(c.reasons.iter().all(|r| !r.contains("veth")), "no link names in reasons: {:?}", c.reasons);
            let h = p.hint("j", &out, None, 1_000 * w as u64).unwrap();
            assert!((0.0..=1.0).contains(&h.confidence));
        }
        plans.push(*p.current());
    }
    (p, plans)
}

fn kinds(p: &JobPolicy) -> Vec<DecisionKind> {
    p.history().map(|d| d.kind).collect()
}

fn slow_peer(from: usize, to: usize) -> impl FnMut(usize, &mut FakeJob, &mut VerdictSummary) {
    move |w, job, _| {
        job.bw[1] = if (from..to).contains(&w) { 0.43e9 / 4.0 } else { 0.43e9 };
    }
}

#[test]
fn compresses_when_a_path_slows_and_returns_to_baseline_after_recovery() {
    let mut job = FakeJob::testbed(1);
    let (p, plans) = run(&mut job, &Constraints::default(), 120, slow_peer(20, 70));
    assert!(plans[..20].iter().all(|q| *q == baseline()), "healthy: baseline plan");
    let adapted = plans[20..30].iter().find(|q| q.compression != Codec::None).expect("compresses within 10 windows");
    assert!(adapted.error_feedback);
    assert_eq!(kinds(&p), vec![DecisionKind::Adapt, DecisionKind::Verified, DecisionKind::Restore], "{:#?}", p.history().collect::<Vec<_>>());
    let first = p.history().next().unwrap();
    assert!(first.reasons.iter().any(|r| r.starts_with("communication time ")), "{:?}", first.reasons);
    assert_eq!(*plans.last().unwrap(), baseline());
    let restore = p.history().last().unwrap();
    assert!(restore.reasons[0].contains("back to the original plan"));
}

#[test]
fn a_severe_slowdown_acts_without_waiting_for_the_trigger_windows() {
    // A quarter of the bandwidth on one path (communication about 4x, its goodput a quarter):
    // acted on once the recent median shows it (two windows), like a verdict. Half of it (about
    // 2x, goodput a half) is degraded but not severe: it waits for the trigger windows.
    for (div, earliest, latest) in [(4.0, 20, 22), (2.0, 23, 26)] {
        let mut job = FakeJob::testbed(5);
        let (p, plans) = run(&mut job, &Constraints::default(), 40, |w, job, _| job.bw[1] = if w >= 20 { 0.43e9 / div } else { 0.43e9 });
        let first = plans.iter().position(|q| q.compression != Codec::None);
        assert!(first.is_some_and(|w| (earliest..=latest).contains(&w)), "bandwidth / {div}: first compressed window {first:?}, expected {earliest}..={latest}: {:#?}", p.history().collect::<Vec<_>>());
        let adapt = p.history().next().unwrap();
        assert!(adapt.reasons.iter().any(|r| r.starts_with("communication time ")), "{:?}", adapt.reasons);
    }
}

#[test]
fn returns_to_the_baseline_under_a_lasting_cap_back_off() {
    // From window 20 to the end, peer 1's path is capped so that only an uncompressed job feels
    // it: compressed, the job looks healthy, so the policy returns to the baseline after its
    // healthy windows, finds the cap again and compresses again. Each return the cap outlasts
    // doubles the wait before the next, up to 8x.
    let mut job = FakeJob::testbed(3);
    let (p, plans) = run(&mut job, &Constraints::default(), 400, |w, job, _| job.capped_when_uncompressed = (w >= 20).then_some(1));
    assert!(plans[..20].iter().all(|q| *q == baseline()), "healthy: baseline plan");
    let restores: Vec<_> = p.history().filter(|d| d.kind == DecisionKind::Restore).collect();
    // Each compressed spell lasts the healthy windows the return waited for (10, 20, 40, then 80
    // at most), give or take the windows the change took to settle.
    let spells: Vec<usize> = (1..plans.len())
        .filter(|&w| plans[w] != baseline() && plans[w - 1] == baseline())
        .map(|start| (start..plans.len()).find(|&w| plans[w] == baseline()).unwrap_or(plans.len()) - start)
        .collect();
    assert!(spells.len() >= 4, "several probes in 380 capped windows: {spells:?}");
    for (i, s) in spells.iter().enumerate().take(spells.len() - 1) {
        let wait = 10usize << i.min(3);
        assert!(*s >= wait && *s <= wait + 6, "compressed spell {i} lasted {s} windows, expected about the {wait}-window wait: {spells:?}");
    }
    // With the back-off 31 of 380 windows ran uncompressed; without it (every return after 10
    // healthy windows) 126 of 380, in 26 returns.
    let uncompressed = plans[20..].iter().filter(|q| q.compression == Codec::None).count();
    assert!(uncompressed * 5 < plans.len() - 20, "{uncompressed} of {} capped windows ran uncompressed: {spells:?}", plans.len() - 20);
    let last = restores.last().expect("returns to the baseline");
    assert!(last.reasons[0].contains("waited 8x as long"), "{:?}", last.reasons);
    assert!(restores[0].reasons[0].ends_with("back to the original plan"), "{:?}", restores[0].reasons);
}

#[test]
fn verdict_on_a_lossy_peer_is_a_reason_and_acts_at_once() {
    let mut job = FakeJob::testbed(2);
    let peer = job.peers[1];
    let (p, plans) = run(&mut job, &Constraints::default(), 40, move |w, job, v| {
        if w == 20 {
            job.bw[1] = 0.43e9 / 4.0;
            job.loss[1] = 0.03;
        }
        if w >= 21 {
            v.gray_peers.insert(peer);
        }
    });
    let d = p.history().next().expect("a change");
    assert!(d.reasons.iter().any(|r| r == "path to peer 10.0.0.3 lossy (3.0% loss)"), "{:?}", d.reasons);
    assert!(plans[21..24].iter().any(|q| q.compression != Codec::None), "a verdict acts without waiting for the streak");
}

#[test]
fn a_change_on_the_faults_first_window_is_verified_against_the_degraded_time() {
    // The verdict comes in the same window the path slows (a severe one raises at once), so the
    // recent windows are still healthy: the change must be judged against the degraded time,
    // not the healthy one, or a compression that helps is reverted.
    let mut job = FakeJob::testbed(3);
    let peer = job.peers[1];
    let (p, plans) = run(&mut job, &Constraints::default(), 40, move |w, job, v| {
        if w == 20 {
            job.bw[1] = 0.43e9 / 4.0;
            v.gray_peers.insert(peer);
        }
    });
    assert_eq!(kinds(&p)[..2], [DecisionKind::Adapt, DecisionKind::Verified], "{:#?}", p.history().collect::<Vec<_>>());
    assert!(plans[30..].iter().all(|q| q.compression != Codec::None), "still compressed while the path is slow");
}

/// One window of a job whose uncompressed step outlasts the window: a rate cap whose queue never
/// drains in the compute phase, so every peer sends without a gap and no step completes.
fn stalled_window(job: &mut FakeJob) -> JobWindow {
    let mut jw = job.window(&baseline());
    let start = jw.window_start_ns;
    jw.window_end_ns = start + S;
    job.t_ns = start + S;
    for pw in &mut jw.peers {
        // 10 ms bursts 1 ms apart (one phase) at the capped rate, 150 Mbit/s.
        pw.bursts = (0..90).map(|i| BurstSummary { start_ns: start + i * 11 * MS, end_ns: start + i * 11 * MS + 10 * MS, bytes: 187_500, to: None }).collect();
        pw.bytes = 90 * 187_500;
        pw.data_packets = pw.bytes / 1448;
        pw.retrans = 0;
    }
    jw
}

#[test]
fn a_verdict_acts_when_no_step_completes_under_the_fault() {
    // Seen in t2_adapt: a rate cap that queues (no loss), the uncompressed ring's traffic never
    // pauses, so no step completes in the windows after the cap; the gray verdict opens four
    // windows later, when the recent history has no communication time left. The open step's
    // communication time so far stands for it: the policy compresses, and the change is verified
    // against that stall, not the healthy time.
    let mut job = FakeJob::testbed(5);
    let peer = job.peers[1];
    let constraints = Constraints::default();
    let ctx = JobContext { constraints: &constraints, gradient_bytes: None };
    let mut p = JobPolicy::new(PolicyConfig::default(), PhaseParams::default(), baseline());
    let mut verdicts = VerdictSummary::default();
    let mut plans = Vec::new();
    for w in 0..40usize {
        if w == 24 {
            verdicts.gray_peers.insert(peer);
        }
        let capped = w >= 20;
        let jw = if capped && p.current().compression == Codec::None {
            stalled_window(&mut job)
        } else {
            job.bw = vec![if capped { 0.43e9 / 6.0 } else { 0.43e9 }; 3];
            job.window(p.current())
        };
        let out = p.observe(&jw, verdicts.clone(), &ctx, None, 1_000 * w as u64);
        if let Some(c) = &out.change {
            assert!(c.kind != DecisionKind::Verified);
        }
        plans.push(*p.current());
    }
    let history: Vec<_> = p.history().cloned().collect();
    assert!(kinds(&p).starts_with(&[DecisionKind::Adapt, DecisionKind::Verified]), "{history:#?}");
    let adapt = &history[0];
    assert!(adapt.observed_comm_ms.is_some_and(|ms| ms >= 3_000.0), "judged against the stall (≥ 4 windows of an open step): {adapt:?}");
    assert!(plans[24..27].iter().any(|q| q.compression != Codec::None), "acts on the verdict's window or the next: {plans:?}");
    assert!(plans[30..].iter().all(|q| q.compression != Codec::None), "still compressed while the path is capped");
}

#[test]
fn a_revert_that_made_things_worse_is_undone() {
    // The verdict comes one window *before* the job's steps slow (loss seen at once, the slow
    // steps end later): the change is judged against the healthy time and reverted; back on the
    // original plan the job is far slower than it was compressed, so the revert is undone, once.
    let mut job = FakeJob::testbed(4);
    let peer = job.peers[1];
    let (p, plans) = run(&mut job, &Constraints::default(), 60, move |w, job, v| {
        if w == 20 {
            v.gray_peers.insert(peer);
        }
        if w == 21 {
            job.bw[1] = 0.43e9 / 8.0;
        }
    });
    let k = kinds(&p);
    assert_eq!(k.iter().filter(|d| **d == DecisionKind::Revert).count(), 2, "{:#?}", p.history().collect::<Vec<_>>());
    assert_eq!(k.last(), Some(&DecisionKind::Verified), "{k:?}");
    let undo = p.history().filter(|d| d.kind == DecisionKind::Revert).nth(1).unwrap();
    assert!(undo.reasons[0].starts_with("back to ring/"), "{:?}", undo.reasons);
    assert!(plans[50..].iter().all(|q| q.compression != Codec::None), "compressed while the path is slow");
}

#[test]
fn respects_constraints() {
    // int8 and top-k disallowed: fp16 or bf16.
    let c = Constraints { codecs: vec!["none".into(), "fp16".into(), "bf16".into()], ..Default::default() };
    let (_, plans) = run(&mut FakeJob::testbed(3), &c, 60, slow_peer(20, 60));
    assert!(plans.iter().all(|q| matches!(q.compression, Codec::None | Codec::Fp16 | Codec::Bf16)));
    assert!(plans.iter().any(|q| q.compression != Codec::None));

    // Only `none`: never compresses.
    let c = Constraints { codecs: vec!["none".into()], ..Default::default() };
    let (_, plans) = run(&mut FakeJob::testbed(4), &c, 60, slow_peer(20, 60));
    assert!(plans.iter().all(|q| q.compression == Codec::None));

    // Top-k only, at least 50 %: top-k 0.1 is never chosen (0.5 moves as many bytes as f32).
    let c = Constraints { codecs: vec!["topk".into()], min_topk_ratio: 0.5, ..Default::default() };
    let (_, plans) = run(&mut FakeJob::testbed(5), &c, 60, slow_peer(20, 60));
    assert!(plans.iter().all(|q| match q.compression {
        Codec::TopK { ratio } => ratio >= 0.5,
        c => c == Codec::None,
    }));

    // Uncompressed, lossy path: more channels, never more than allowed.
    let c = Constraints { codecs: vec!["none".into()], max_channels: 2, ..Default::default() };
    let (_, plans) = run(&mut FakeJob::testbed(6), &c, 60, |w, job, _| {
        if w == 20 {
            job.bw[1] = 0.43e9 / 4.0;
            job.loss[1] = 0.02;
        }
    });
    assert!(plans.iter().all(|q| q.channels <= 2));
    assert!(plans.iter().any(|q| q.channels == 2), "loss-limited TCP gains from a second channel");
}

#[test]
fn healthy_noise_never_changes_the_plan() {
    for seed in 0..3 {
        let mut job = FakeJob::testbed(10 + seed);
        job.window_noise = 0.15;
        job.step_noise = 0.15;
        let (p, plans) = run(&mut job, &Constraints::default(), 200, |_, _, _| {});
        assert_eq!(p.history().count(), 0, "seed {seed}: {:#?}", p.history().collect::<Vec<_>>());
        assert!(plans.iter().all(|q| *q == baseline()));
    }
}

#[test]
fn reverts_a_change_that_did_not_help_and_does_not_retry_it() {
    let mut job = FakeJob::testbed(7);
    job.compression_helps = false;
    let (p, plans) = run(&mut job, &Constraints::default(), 70, slow_peer(20, 70));
    assert_eq!(kinds(&p), vec![DecisionKind::Adapt, DecisionKind::Revert], "{:#?}", p.history().collect::<Vec<_>>());
    let r = &p.history().nth(1).unwrap().reasons[0];
    let tried = p.history().next().unwrap().to.compression;
    assert!(r.starts_with(&format!("reverted: {tried} did not reduce communication time (")), "{r}");
    assert_eq!(*plans.last().unwrap(), baseline());
}

#[test]
fn stragglers_are_not_network() {
    let mut job = FakeJob::testbed(8);
    let (p, plans) = run(&mut job, &Constraints { step_time_target_ms: Some(150.0), ..Default::default() }, 60, |w, job, v| {
        if w == 20 {
            job.straggler_ns = 80 * MS;
        }
        v.straggler = w >= 21;
    });
    assert_eq!(p.history().count(), 0, "{:#?}", p.history().collect::<Vec<_>>());
    assert!(plans.iter().all(|q| *q == baseline()));
}

#[test]
fn a_straggler_not_yet_named_is_not_network_either() {
    // No straggler verdict (the detectors need enough peers to name one): the others wait, so the
    // communication phases grow, but every path keeps its goodput.
    let mut job = FakeJob::testbed(10);
    let (p, plans) = run(&mut job, &Constraints::default(), 60, |w, job, _| {
        if w == 20 {
            job.straggler_ns = 80 * MS;
        }
    });
    assert_eq!(p.history().count(), 0, "{:#?}", p.history().collect::<Vec<_>>());
    assert!(plans.iter().all(|q| *q == baseline()));
}

#[test]
fn compresses_a_healthy_job_only_for_its_step_time_target() {
    let mut job = FakeJob::testbed(9);
    // 50 ms compute + ~58 ms communication ≈ 110 ms per step: a 90 ms target is missed.
    let (p, plans) = run(&mut job, &Constraints { step_time_target_ms: Some(90.0), ..Default::default() }, 60, |_, _, _| {});
    let d = p.history().next().expect("a change");
    assert!(d.reasons.iter().any(|r| r.starts_with("step time target 90 ms missed")), "{:?}", d.reasons);
    assert_eq!(d.to.compression, Codec::Fp16, "the least lossy codec that meets the target");
    assert_eq!(plans.last().unwrap().compression, Codec::Fp16, "stays: the baseline would miss the target again");
}



#[test]
fn registered_gradient_size_gives_the_same_decisions() {
    let mut job = FakeJob::testbed(1);
    job.tell_gradient = true;
    let (p, plans) = run(&mut job, &Constraints::default(), 120, slow_peer(20, 70));
    assert_eq!(kinds(&p), vec![DecisionKind::Adapt, DecisionKind::Verified, DecisionKind::Restore]);
    assert_eq!(*plans.last().unwrap(), baseline());
}

#[test]
fn a_change_that_cannot_be_verified_is_reverted() {
    let mut job = FakeJob::testbed(12);
    let mut p = JobPolicy::new(PolicyConfig::default(), PhaseParams::default(), baseline());
    let c = Constraints::default();
    let ctx = JobContext { constraints: &c, gradient_bytes: None };
    let mut last = None;
    for w in 0..60u64 {
        if w == 20 {
            job.bw[1] /= 4.0;
        }
        let mut jw = job.window(p.current());
        if p.current().compression != Codec::None {
            // The job went quiet right after the change: no steps to verify with.
            jw.peers.clear();
        }
        if let Some(d) = p.observe(&jw, VerdictSummary::default(), &ctx, None, w * 1000).change {
            last = Some(d);
        }
    }
    let d = last.expect("a revert");
    assert_eq!(d.kind, DecisionKind::Revert);
    assert!(d.reasons[0].contains("could not be verified"), "{:?}", d.reasons);
}

#[test]
fn hints_get_the_next_version_on_change_and_renew_in_between() {
    let mut job = FakeJob::testbed(13);
    let mut p = JobPolicy::new(PolicyConfig::default(), PhaseParams::default(), baseline());
    let c = Constraints::default();
    let ctx = JobContext { constraints: &c, gradient_bytes: None };
    let mut latest = baseline().to_hint("j", 1, vec![], 0.5, 0);
    let mut published = Vec::new();
    for w in 0..40u64 {
        if w == 20 {
            job.bw[1] /= 4.0;
        }
        let now = 100_000 + w * 1000;
        let out = p.observe(&job.window(p.current()), VerdictSummary::default(), &ctx, None, now);
        if let Some(h) = p.hint("j", &out, Some(&latest), now) {
            assert_eq!(h.expires_at, now + 60_000);
            published.push((w, h.version));
            latest = h;
        }
    }
    let versions: Vec<u64> = published.iter().map(|&(_, v)| v).collect();
    assert!(versions.contains(&2), "{published:?}");
    assert!(versions.windows(2).all(|v| v[1] == v[0] || v[1] == v[0] + 1), "{published:?}");
    let renewals_before_change: Vec<u64> = published.iter().filter(|&&(w, v)| v == 1 && w < 20).map(|&(w, _)| w).collect();
    assert_eq!(renewals_before_change, vec![0, 10], "renewed every 10 s");
    assert_eq!(latest.compression, p.current().compression);
    assert!(!latest.reasons.is_empty() && latest.confidence > 0.0);
    let mut idle = p.clone();
    assert!(idle.renewal(&latest, 139_500).is_none(), "not due yet");
    assert_eq!(idle.renewal(&latest, 1_000_000).unwrap().expires_at, 1_060_000);
}

/// Runs 100 windows with 2 % loss on peer 1's path in windows 20..60 and publishes hints as the
/// agent does; returns the transport advice of the latest hint after each window, the hints
/// whose advice changed, and the plan of each window.
fn loss_spell(cfg: PolicyConfig, c: &Constraints) -> (Vec<Option<u32>>, Vec<(u64, Hint)>, Vec<PlanChoice>) {
    let mut job = FakeJob::testbed(17);
    let mut p = JobPolicy::new(cfg, PhaseParams::default(), baseline());
    let ctx = JobContext { constraints: c, gradient_bytes: None };
    let mut latest = baseline().to_hint("j", 1, vec![], 0.5, 0);
    let (mut advice, mut changes, mut plans) = (Vec::new(), Vec::new(), Vec::new());
    for w in 0..100u64 {
        job.loss[1] = if (20..60).contains(&w) { 0.02 } else { 0.0 };
        let now = 100_000 + w * 1000;
        let out = p.observe(&job.window(p.current()), VerdictSummary::default(), &ctx, None, now);
        if let Some(h) = p.hint("j", &out, Some(&latest), now) {
            assert!(h.version == latest.version || h.version == latest.version + 1, "{} after {}", h.version, latest.version);
            if h.tcp_rto_min_ms != latest.tcp_rto_min_ms {
                assert_eq!(h.version, latest.version + 1, "new advice is a new version");
                changes.push((w, h.clone()));
            }
            latest = h;
        }
        assert_eq!(latest.tcp_rto_min_ms, p.rto_advice());
        advice.push(latest.tcp_rto_min_ms);
        plans.push(*p.current());
    }
    (advice, changes, plans)
}

#[test]
fn transport_advice_follows_loss_for_jobs_that_allow_it() {
    let allowed = Constraints { transport_tuning: true, ..Constraints::default() };
    let (advice, changes, plans) = loss_spell(PolicyConfig::default(), &allowed);
    // The loss is first the advice's to handle: the plan stays until the advice has stood
    // settle + verify windows (4, from window 22); a job without advice compresses at once
    // (below). Loss that remains then is a trigger again.
    let labels = plans.iter().map(PlanChoice::label).collect::<Vec<_>>();
    assert!(plans[..26].iter().all(|q| *q == baseline()), "{labels:?}");
    assert!(plans[26..60].iter().any(|q| q.compression != Codec::None), "loss that outlasts the advice's settling is a trigger: {labels:?}");
    assert!(advice[..20].iter().all(Option::is_none), "no advice while healthy: {advice:?}");
    // On after trigger_windows (3) lossy windows, off after recover_windows (10) clean ones.
    let on = advice.iter().position(Option::is_some).expect("advised under loss");
    assert_eq!(on, 22, "{advice:?}");
    assert!(advice[22..60].iter().all(|a| *a == Some(5)), "kept while the loss lasts: {advice:?}");
    let off = (60..100).find(|&w| advice[w].is_none()).expect("dropped after the loss");
    assert_eq!(off, 69, "{advice:?}");
    assert!(advice[off..].iter().all(Option::is_none), "{advice:?}");
    assert_eq!(changes.len(), 2, "one hint to start the advice, one to end it: {changes:?}");
    let (_, start) = &changes[0];
    assert!(start.reasons.iter().any(|r| r == "paths lossy: a 5 ms floor for TCP retransmission timeouts advised"), "{:?}", start.reasons);
    assert!(changes[1].1.reasons.iter().all(|r| !r.contains("retransmission")), "{:?}", changes[1].1.reasons);

    // A job that did not allow it never gets advice; nor does any job when the operator turned
    // it off (loss_rto_min_ms = 0). A configured floor is what is advised.
    let (advice, changes, plans) = loss_spell(PolicyConfig::default(), &Constraints::default());
    assert!(advice.iter().all(Option::is_none) && changes.is_empty(), "{advice:?}");
    assert!(plans[20..60].iter().any(|q| q.compression != Codec::None), "without advice the lossy path itself triggers compression");
    let (advice, _, _) = loss_spell(PolicyConfig { loss_rto_min_ms: 0, ..PolicyConfig::default() }, &allowed);
    assert!(advice.iter().all(Option::is_none), "{advice:?}");
    let (advice, _, _) = loss_spell(PolicyConfig { loss_rto_min_ms: 20, ..PolicyConfig::default() }, &allowed);
    assert_eq!(advice[30], Some(20));

    // Loss that also slows the path (a quarter of the bandwidth): the communication time, not the
    // loss, moves the plan of a job that takes advice.
    let mut job = FakeJob::testbed(19);
    let (_, plans) = run(&mut job, &allowed, 40, |w, job, _| {
        if w == 20 {
            job.bw[1] /= 4.0;
            job.loss[1] = 0.02;
        }
    });
    let first = plans.iter().position(|q| q.compression != Codec::None);
    assert!(first.is_some_and(|w| (20..=26).contains(&w)), "first compressed window {first:?}");
}

/// A report of `plan` running from window `w` on (the test's windows end at `1000 × w` ms and
/// last about a second; the window before is left mixed).
fn in_force_from(plan: PlanChoice, w: u64) -> PlanInForce {
    let since_unix_ms = (1000 * w).saturating_sub(2000);
    PlanInForce { plan, since_unix_ms, reported_unix_ms: since_unix_ms, step_time_ms: None }
}

#[test]
fn a_change_is_verified_only_on_windows_in_which_it_ran() {
    // The job keeps its old plan for 20 windows after the policy's change (in managed mode, the
    // services' vote held it), then runs it. Judged on the windows of the old plan the change
    // looks useless; with the job's reports it waits for its own windows and is verified.
    let decisions = |report: bool| {
        let mut job = FakeJob::testbed(14);
        let mut p = JobPolicy::new(PolicyConfig::default(), PhaseParams::default(), baseline());
        let c = Constraints::default();
        let ctx = JobContext { constraints: &c, gradient_bytes: None };
        let mut running = in_force_from(baseline(), 0);
        let mut adapted_at = None;
        for w in 0..80u64 {
            if w == 20 {
                job.bw[1] /= 4.0;
            }
            if adapted_at.is_some_and(|a| w == a + 20) {
                running = in_force_from(*p.current(), w);
            }
            let jw = job.window(&running.plan);
            // The job runs its own chunk size: not a different plan.
            let reported = PlanInForce { plan: PlanChoice { chunk_bytes: 1 << 18, ..running.plan }, ..running };
            let out = p.observe(&jw, VerdictSummary::default(), &ctx, report.then_some(&reported), 1000 * w);
            if adapted_at.is_none() && out.change.is_some_and(|d| d.kind == DecisionKind::Adapt) {
                adapted_at = Some(w);
            }
        }
        kinds(&p)
    };
    assert_eq!(decisions(true), [DecisionKind::Adapt, DecisionKind::Verified]);
    let blind = decisions(false);
    assert_eq!(blind[..2], [DecisionKind::Adapt, DecisionKind::Revert], "without reports the old plan's windows are taken for the new one's: {blind:?}");
}

#[test]
fn a_codec_that_slows_the_jobs_steps_is_reverted_when_the_job_reports_them() {
    // A path slows at window 20 and every codec cuts the wire time the agent sees. But the job's
    // int8 and top-k run on its CPU, synchronously (as the PyTorch hook's do), and make each step
    // half as long again; fp16/bf16 are cheap and make it shorter. Only the job's own step times
    // show that. With them the policy reverts the costly codecs and settles on a cheap one;
    // without them it keeps the first codec the model prefers (asserted, so the test can fail).
    let run_with = |report: bool| {
        let mut job = FakeJob::testbed(17);
        let mut p = JobPolicy::new(PolicyConfig::default(), PhaseParams::default(), baseline());
        let c = Constraints::default();
        let ctx = JobContext { constraints: &c, gradient_bytes: None };
        let mut running = in_force_from(baseline(), 0);
        for w in 0..200u64 {
            if w == 20 {
                job.bw[1] /= 4.0;
            }
            if running.plan != *p.current() {
                running = in_force_from(*p.current(), w);
            }
            let uncompressed_ms = if w < 20 { 150.0 } else { 300.0 };
            let step_ms = match running.plan.compression {
                Codec::None => uncompressed_ms,
                Codec::Fp16 | Codec::Bf16 => 0.7 * uncompressed_ms,
                Codec::Int8 | Codec::TopK { .. } => 1.5 * uncompressed_ms,
            };
            // One report per window, during it, of steps that all ran the reported plan.
            let reported = PlanInForce { reported_unix_ms: (1000 * w).saturating_sub(100), step_time_ms: Some(step_ms), ..running };
            let jw = job.window(&running.plan);
            let out = p.observe(&jw, VerdictSummary::default(), &ctx, report.then_some(&reported), 1000 * w);
            if report {
                assert_eq!(out.insight.step_ms, Some(step_ms), "the tenant sees the step time it reported");
            }
            if let Some(d) = &out.verified {
                assert_eq!(p.history().last(), Some(d));
            }
        }
        p
    };
    let p = run_with(true);
    let history: Vec<_> = p.history().cloned().collect();
    let first_revert = history.iter().find(|d| d.kind == DecisionKind::Revert).unwrap_or_else(|| panic!("a revert: {history:#?}"));
    assert!(
        first_revert.reasons.iter().any(|r| r.contains("but not the job's step time") && r.contains("as the job reports")),
        "{:?}",
        first_revert.reasons
    );
    for d in history.iter().filter(|d| d.kind == DecisionKind::Revert) {
        assert!(d.reasons[0].contains("but not the job's step time"), "no revert is undone (the job's steps were slower with the codec): {d:#?}");
    }
    assert!(matches!(p.current().compression, Codec::Fp16 | Codec::Bf16), "settles on a cheap codec: {:?} after {history:#?}", p.current());
    assert!(
        history.iter().any(|d| d.kind == DecisionKind::Verified
            && matches!(d.to.compression, Codec::Fp16 | Codec::Bf16)
            && d.reasons[0].contains("the job's steps went from 300 ms to 210 ms")),
        "{history:#?}"
    );
    // A costly codec is tried again only once its cooldown (60 windows) is over: over 180
    // windows of fault, int8 and top-k at most 3 times each.
    let probes = history.iter().filter(|d| d.kind == DecisionKind::Adapt && matches!(d.to.compression, Codec::Int8 | Codec::TopK { .. })).count();
    assert!(probes <= 6, "{probes} probes: {history:#?}");
    let blind = run_with(false);
    let blind_history: Vec<_> = blind.history().map(|d| d.kind).collect();
    assert_eq!(blind_history, [DecisionKind::Adapt, DecisionKind::Verified], "without step reports the codec stays: {blind_history:?}");
    assert!(matches!(blind.current().compression, Codec::Int8 | Codec::TopK { .. }), "{:?}", blind.current());
}

#[test]
fn a_revert_judged_before_the_slowdown_is_undone_by_the_jobs_step_times() {
    // A verdict opens at window 20, before the job's steps slow (the cap bites at 26). int8 is
    // judged against the healthy step time, is no faster yet, and is reverted. Uncompressed under
    // the cap the job then reports steps four times as long as int8's: the revert is undone and
    // int8 verified against them.
    let p = reporting_job(Fault { seed: 18, cap_at: 26, verdict_from: Some(20), windows: 80 }, &["none", "int8"], |codec, w| {
        Some(match (codec, w >= 26) {
            (Codec::None, false) => 150.0,
            (Codec::None, true) => 800.0,
            (_, false) => 165.0,
            (_, true) => 200.0,
        })
    });
    let history: Vec<_> = p.history().cloned().collect();
    let k: Vec<_> = history.iter().map(|d| d.kind).collect();
    assert_eq!(k[..4], [DecisionKind::Adapt, DecisionKind::Revert, DecisionKind::Revert, DecisionKind::Verified], "{history:#?}");
    assert!(history[1].reasons[0].contains("not the job's step time"), "{:?}", history[1].reasons);
    assert!(history[2].reasons[0].contains("the job's steps are slower with ring/none/1ch"), "{:?}", history[2].reasons);
    assert_eq!(p.current().compression, Codec::Int8);
}

/// When and how a fault hits a job that reports its step times: peer 1's path slows to an eighth
/// from window `cap_at`, a gray-failure verdict on it is open from `verdict_from`.
struct Fault {
    seed: u64,
    cap_at: u64,
    verdict_from: Option<u64>,
    windows: u64,
}

/// A job that reports its step times under `fault`; `step_ms(codec, window)` is what it reports
/// (the report of window w arrives during it). Returns the policy after the fault's windows.
fn reporting_job(fault: Fault, codecs: &[&str], step_ms: impl Fn(Codec, u64) -> Option<f64>) -> JobPolicy {
    let mut job = FakeJob::testbed(fault.seed);
    let mut p = JobPolicy::new(PolicyConfig::default(), PhaseParams::default(), baseline());
    let c = Constraints { codecs: codecs.iter().map(|c| c.to_string()).collect(), algorithms: vec![Algorithm::Ring], ..Constraints::default() };
    let ctx = JobContext { constraints: &c, gradient_bytes: None };
    let mut running = in_force_from(baseline(), 0);
    let peer = job.peers[1];
    for w in 0..fault.windows {
        if w == fault.cap_at {
            job.bw[1] /= 8.0;
        }
        if running.plan != *p.current() {
            running = in_force_from(*p.current(), w);
        }
        let mut verdicts = VerdictSummary::default();
        if fault.verdict_from.is_some_and(|v| w >= v) {
            verdicts.gray_peers.insert(peer);
        }
        let reported = PlanInForce { reported_unix_ms: (1000 * w).saturating_sub(100), step_time_ms: step_ms(running.plan.compression, w), ..running };
        let jw = job.window(&running.plan);
        p.observe(&jw, verdicts, &ctx, Some(&reported), 1000 * w);
    }
    p
}

/// The fault of the tests below: the cap at window 20, with a verdict from then on or none.
fn reporting_job_under_a_fault(seed: u64, verdict: bool, codecs: &[&str], step_ms: impl Fn(Codec, u64) -> Option<f64>) -> JobPolicy {
    reporting_job(Fault { seed, cap_at: 20, verdict_from: verdict.then_some(20), windows: 60 }, codecs, step_ms)
}

#[test]
fn a_change_under_a_cap_is_judged_against_the_steps_under_the_cap() {
    // Seen with PyTorch under uplink congestion: the cap bites at window 20 and the job's
    // uncompressed steps (1320 ms) outlast the windows, so the report of the fault's first window
    // still carries the pre-fault step time (a report covers the second before it) and the next
    // ones none. int8's steps (829 ms) are far faster than the uncompressed ones under the cap,
    // but slower than the healthy steps: judged against 150 ms int8 was reverted ("829 ms vs
    // 150 ms") and taken back 3.8 s later. The change waits for the first step time under the
    // cap and is kept, whether a verdict came in the fault's first window or the severe
    // slowdown in its second, and whether the stale report is shorter than the communication
    // time the agent sees under the cap (about 470 ms here) or not (a job whose healthy steps
    // are mostly compute).
    for (verdict, healthy_ms) in [(true, 150.0), (false, 150.0), (true, 500.0), (false, 500.0)] {
        let p = reporting_job_under_a_fault(21, verdict, &["none", "int8"], |codec, w| match (codec, w) {
            (_, 0..21) => Some(healthy_ms),
            (Codec::None, 21..24) => None,
            (Codec::None, _) => Some(1320.0),
            _ => Some(829.0),
        });
        let history: Vec<_> = p.history().cloned().collect();
        let k: Vec<_> = history.iter().map(|d| d.kind).collect();
        assert_eq!(k, [DecisionKind::Adapt, DecisionKind::Verified], "verdict {verdict}, healthy {healthy_ms} ms: {history:#?}");
        assert_eq!(history[0].unix_ms, 24_000, "verdict {verdict}, healthy {healthy_ms} ms: adapted on the first step time under the cap: {history:#?}");
        assert!(history[1].reasons[0].ends_with("the job's steps went from 1320 ms to 829 ms"), "verdict {verdict}, healthy {healthy_ms} ms: {:?}", history[1].reasons);
        assert_eq!(p.current().compression, Codec::Int8);
    }
}

#[test]
fn a_codec_slower_than_the_uncompressed_steps_under_the_fault_is_reverted() {
    // Seen with PyTorch under uplink congestion on another machine: the agent sees int8 cut the
    // communication time (73 ms to 21 ms), but its synchronous exchanges made the job's steps
    // 890 ms against 381 ms uncompressed under the same fault, while fp16 (torch's asynchronous
    // hook) made them shorter. Here (the fake job's uncompressed communication under the fault
    // is about 470 ms): 700 ms uncompressed, 1500 ms int8, 600 ms fp16/bf16. The verdict acts in
    // the fault's first window, whose report is still the healthy 150 ms: the change waits for
    // the next report, the degraded one, so int8 is judged against the uncompressed steps under
    // the fault, reverted, and fp16 (or bf16) kept.
    let p = reporting_job_under_a_fault(22, true, &["none", "fp16", "bf16", "int8"], |codec, w| match (codec, w) {
        (_, 0..21) => Some(150.0),
        (Codec::None, _) => Some(700.0),
        (Codec::Int8, _) => Some(1500.0),
        _ => Some(600.0),
    });
    let history: Vec<_> = p.history().cloned().collect();
    let k: Vec<_> = history.iter().map(|d| d.kind).collect();
    assert!(k.len() >= 4, "{history:#?}");
    assert_eq!(k[..4], [DecisionKind::Adapt, DecisionKind::Revert, DecisionKind::Adapt, DecisionKind::Verified], "{history:#?}");
    assert_eq!((history[0].unix_ms, history[0].to.compression), (21_000, Codec::Int8), "{history:#?}");
    assert!(history[1].reasons[0].ends_with("but not the job's step time (1500 ms vs 700 ms, as the job reports)"), "{:?}", history[1].reasons);
    assert!(matches!(p.current().compression, Codec::Fp16 | Codec::Bf16), "{history:#?}");
}

#[test]
fn a_change_waits_for_the_jobs_step_times_when_its_steps_outlast_the_windows() {
    // Seen with PyTorch under uplink congestion: steps of 2-2.4 s, so a report carries a step
    // time every second or third window, and the 3 verification windows held one. int8 (2400 ms
    // steps) is slower than the uncompressed steps under the fault (2000 ms) although the agent
    // sees its communication time cut: the verification waits for two step times and reverts it.
    let p = reporting_job_under_a_fault(23, true, &["none", "int8"], |codec, w| match (codec, w) {
        (_, 0..21) => Some(150.0),
        (Codec::None, _) => (w % 2 == 0).then_some(2000.0),
        _ => (w % 3 == 0).then_some(2400.0),
    });
    let history: Vec<_> = p.history().cloned().collect();
    assert!(history.len() >= 2, "{history:#?}");
    assert_eq!((history[0].kind, history[0].to.compression), (DecisionKind::Adapt, Codec::Int8), "{history:#?}");
    assert_eq!(history[1].kind, DecisionKind::Revert, "{history:#?}");
    assert!(history[1].reasons[0].ends_with("but not the job's step time (2400 ms vs 2000 ms, as the job reports)"), "{:?}", history[1].reasons);
    assert!(history.iter().all(|d| d.kind != DecisionKind::Verified || d.to.compression == Codec::None), "int8 never verified: {history:#?}");
}

/// Higher is more severe (the services' vote: the most severe proposal runs).
fn severity(p: &PlanChoice) -> u8 {
    match p.compression {
        Codec::None => 0,
        Codec::Fp16 | Codec::Bf16 => 1,
        Codec::Int8 => 2,
        Codec::TopK { .. } => 3,
    }
}

#[test]
fn managed_an_agent_whose_plan_is_outvoted_stops_judging_the_job() {
    // Two IPUs' agents advise one managed job, which runs the more severe advice. A path slows
    // at window 20; to agent A's view compression does not help (its verification reverts it),
    // to B's it does. The job stays compressed on B's advice. Without the job's reports, A
    // takes the compressed windows for its own plan's and keeps adapting and reverting; with
    // them A's revert waits for its plan to run, which never happens, and A stays quiet.
    let decisions = |report: bool| {
        let (mut view_a, mut view_b) = (FakeJob::testbed(15), FakeJob::testbed(16));
        view_a.compression_helps = false;
        let c = Constraints::default();
        let ctx = JobContext { constraints: &c, gradient_bytes: None };
        let mut a = JobPolicy::new(PolicyConfig::default(), PhaseParams::default(), baseline());
        let mut b = a.clone();
        let mut running = in_force_from(baseline(), 0);
        let mut plans = Vec::new();
        let mut a_comm_ms = None;
        for w in 0..240u64 {
            if w == 20 {
                view_a.bw[1] /= 4.0;
                view_b.bw[1] /= 4.0;
            }
            let agreed = if severity(a.current()) > severity(b.current()) { *a.current() } else { *b.current() };
            if agreed != running.plan {
                running = in_force_from(agreed, w);
            }
            plans.push(running.plan);
            let f = report.then_some(&running);
            a_comm_ms = a.observe(&view_a.window(&running.plan), VerdictSummary::default(), &ctx, f, 1000 * w).insight.comm_ms;
            b.observe(&view_b.window(&running.plan), VerdictSummary::default(), &ctx, f, 1000 * w);
        }
        (kinds(&a), kinds(&b), plans, a_comm_ms)
    };
    let (a, b, plans, a_comm_ms) = decisions(true);
    assert!(a_comm_ms.is_some(), "the tenant still sees its communication time while A's plan does not run");
    assert_eq!(a, [DecisionKind::Adapt, DecisionKind::Revert], "A: {a:?}");
    assert_eq!(b, [DecisionKind::Adapt, DecisionKind::Verified], "B: {b:?}");
    let first = plans.iter().position(|p| p.compression != Codec::None).expect("compressed");
    assert!(plans[first..].iter().all(|p| p.compression != Codec::None), "the job stays compressed");
    let (blind_a, _, _, _) = decisions(false);
    assert!(blind_a.len() > 2, "without reports A keeps changing its advice: {blind_a:?}");
}

/// The detectors' simulators are open loop (they ignore the plan), so these check the policy's
/// reaction to what the detectors say, not the effect of its plans.
mod with_detectors {
    use super::*;
    use crate::detect::sim::{Fault, RingJob, Scenario};
    use crate::detect::{DetectorConfig, DetectorSet};

    fn run_open_loop(windows: &[JobWindow]) -> JobPolicy {
        let mut det = DetectorSet::new(DetectorConfig::default());
        let mut pol = JobPolicy::new(PolicyConfig::default(), PhaseParams::from(det.config()), baseline());
        let c = Constraints::default();
        let ctx = JobContext { constraints: &c, gradient_bytes: None };
        for (i, w) in windows.iter().enumerate() {
            det.observe(w).unwrap();
            let v = VerdictSummary::of_job(&w.job, det.open_verdicts());
            pol.observe(w, v, &ctx, None, i as u64 * 1000);
        }
        pol
    }

    #[test]
    fn ring_job_with_a_straggler_keeps_its_plan() {
        for seed in 1..=3 {
            let job = RingJob { straggler: Some((3, 60 * MS, 100, 200)), ..RingJob::testbed(seed) };
            let p = run_open_loop(&job.windows(300));
            assert_eq!(p.history().count(), 0, "seed {seed}: {:#?}", p.history().collect::<Vec<_>>());
        }
    }

    #[test]
    fn gray_failure_verdict_triggers_a_change_with_the_peer_as_reason() {
        let sc = Scenario::star(4).with(Fault::GoodputCut { peer: 2, factor: 0.25 }, 40, 80);
        let peer = sc.peer(2);
        let p = run_open_loop(&sc.windows(80));
        let d = p.history().next().expect("a change");
        assert_eq!(d.kind, DecisionKind::Adapt);
        assert!(d.to.compression != Codec::None);
        assert!(d.reasons.contains(&format!("path to peer {peer} degraded")), "{:?}", d.reasons);
    }

    #[test]
    fn healthy_simulated_jobs_keep_their_plan() {
        for seed in 1..=3 {
            assert_eq!(run_open_loop(&RingJob::testbed(seed).windows(200)).history().count(), 0, "ring seed {seed}");
            assert_eq!(run_open_loop(&Scenario::two_leaves(seed).windows(200)).history().count(), 0, "leaves seed {seed}");
        }
    }
}
