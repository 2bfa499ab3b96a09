//! T0: collective correctness over loopback TCP, ranks as threads.

use ipu_firmware::job::{run_job, run_job_in_process, run_ranks_in_process, ComputeMode, JobConfig};
use ipu_firmware::plan::{Compression, Dtype, PlanSource};
use ipu_firmware::{segment, Algorithm, Bf16, CodecKind, Communicator, CommunicatorConfig, Plan, ScriptedPlans, TcpOptions};
use rand::{Rng, SeedableRng};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(20);

fn opts(channels: u8) -> TcpOptions {
    TcpOptions { channels, timeout: TIMEOUT }
}

/// Inputs k/64 with |k| <= 512: every partial sum is exact in f32 regardless of order.
fn input(rank: usize, tag: u64, n: usize) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(tag * 1009 + rank as u64);
    (0..n).map(|_| rng.gen_range(-512i32..=512) as f32 / 64.0).collect()
}

const SIZES: [usize; 6] = [1, 2, 7, 33, 1000, 4099];

fn codecs() -> Vec<(CodecKind, bool)> {
    let mut v = vec![(CodecKind::None, false), (CodecKind::TopK { ratio: 1.0 }, false)];
    for k in [CodecKind::Fp16, CodecKind::Bf16, CodecKind::Int8, CodecKind::TopK { ratio: 0.3 }] {
        v.push((k, false));
        v.push((k, true));
    }
    v
}

/// One plan per training step: every algorithm × codec, varying chunk size and channel count.
fn matrix_plans() -> Vec<Plan> {
    let mut plans = Vec::new();
    for (ai, algorithm) in Algorithm::ALL.into_iter().enumerate() {
        for (ci, (codec, error_feedback)) in codecs().into_iter().enumerate() {
            let i = plans.len() as u64;
            plans.push(Plan {
                step_from: i,
                algorithm,
                chunk_bytes: [12u32, 64, 1000, 1 << 20][(ai + ci) % 4],
                channels: 1 + ((ai + ci) % 2) as u8,
                compression: Compression { codec, error_feedback },
            });
        }
    }
    plans
}

/// Checks rank results against the exact sum and the documented codec bound.
fn check(world: usize, plan: &Plan, inputs: &[Vec<f32>], results: &[Vec<f32>]) {
    check_carrying(world, plan, inputs, &[], results)
}

/// [`check`] for a collective whose error-feedback residuals may hold the error of an earlier one
/// with inputs `carried` (its values widen the bound; empty for none).
fn check_carrying(world: usize, plan: &Plan, inputs: &[Vec<f32>], carried: &[Vec<f32>], results: &[Vec<f32>]) {
    let n = inputs[0].len();
    for r in 1..world {
        assert!(
            results[r].iter().zip(&results[0]).all(|(a, b)| a.to_bits() == b.to_bits()),
            "rank {r} result differs from rank 0 (plan {plan:?}, n {n})"
        );
    }
    let abs_sum: Vec<f64> =
        (0..n).map(|i| inputs.iter().chain(carried).map(|x| f64::from(x[i].abs())).sum()).collect();
    let max_abs = abs_sum.iter().cloned().fold(0.0, f64::max);
    let hops = (world + 1) as f64;
    for i in 0..n {
        let exact: f64 = inputs.iter().map(|x| f64::from(x[i])).sum();
        let got = f64::from(results[0][i]);
        let bound = match plan.compression.codec {
            CodecKind::None => 0.0,
            CodecKind::TopK { ratio } if ratio >= 1.0 => 0.0,
            CodecKind::Fp16 => hops * 2f64.powi(-11) * abs_sum[i] * 1.01 + hops * 2f64.powi(-24),
            CodecKind::Bf16 => hops * 2f64.powi(-8) * abs_sum[i] * 1.01,
            CodecKind::Int8 => hops * max_abs / 254.0 * 1.01,
            CodecKind::TopK { .. } => hops * max_abs,
        };
        assert!(
            (got - exact).abs() <= bound,
            "elem {i}/{n}: got {got}, exact {exact}, bound {bound} (world {world}, plan {plan:?})"
        );
    }
}

fn matrix(world: usize) {
    let plans = matrix_plans();
    let steps = plans.len();
    let source = std::sync::Mutex::new(Some(ScriptedPlans(plans.clone())));
    let per_rank = run_ranks_in_process(world, opts(2), move |rank, t| {
        let mut comm = Communicator::new(t, CommunicatorConfig { initial_plan: Plan::default(), timeout: TIMEOUT })?;
        if rank == 0 {
            let src: Box<dyn PlanSource> = Box::new(source.lock().unwrap().take().unwrap());
            comm.set_plan_source(src);
        }
        let mut out = Vec::new();
        for step in 0..steps as u64 {
            comm.begin_step(step);
            for (si, &n) in SIZES.iter().enumerate() {
                let mut buf = input(rank, step * 100 + si as u64, n);
                let rep = comm.allreduce_f32(&mut buf)?;
                out.push((step, n, rep.plan, buf));
            }
        }
        comm.close();
        Ok(out)
    });
    let per_rank: Vec<_> = per_rank.into_iter().map(|r| r.expect("rank failed")).collect();
    for (j, (step, n, plan, _)) in per_rank[0].iter().enumerate() {
        assert_eq!(*plan, plans[*step as usize], "rank 0 ran step {step} with the wrong plan");
        for r in 1..world {
            assert_eq!(per_rank[r][j].2, *plan, "rank {r} disagrees on the plan at step {step}");
        }
        let si = SIZES.iter().position(|s| s == n).unwrap() as u64;
        let inputs: Vec<Vec<f32>> = (0..world).map(|r| input(r, step * 100 + si, *n)).collect();
        let results: Vec<Vec<f32>> = (0..world).map(|r| per_rank[r][j].3.clone()).collect();
        check(world, plan, &inputs, &results);
    }
    assert_eq!(per_rank[0].len(), steps * SIZES.len());
}

#[test]
fn allreduce_matrix_world_2() {
    matrix(2);
}
#[test]
fn allreduce_matrix_world_3() {
    matrix(3);
}
#[test]
fn allreduce_matrix_world_4() {
    matrix(4);
}
#[test]
fn allreduce_matrix_world_5() {
    matrix(5);
}
#[test]
fn allreduce_matrix_world_8() {
    matrix(8);
}

#[test]
fn single_rank_is_identity() {
    let res = run_ranks_in_process(1, opts(1), |_, t| {
        let mut c = Communicator::new(t, CommunicatorConfig::default())?;
        let mut b = vec![1.5f32, -2.0];
        c.allreduce_f32(&mut b)?;
        Ok(b)
    });
    assert_eq!(res.into_iter().next().unwrap().unwrap(), vec![1.5, -2.0]);
}

#[test]
fn bf16_allreduce_is_exact_for_small_integers() {
    for algorithm in Algorithm::ALL {
        let world = 5;
        let res = run_ranks_in_process(world, opts(1), move |rank, t| {
            let plan = Plan { algorithm, chunk_bytes: 16, ..Plan::default() };
            let mut c = Communicator::new(t, CommunicatorConfig { initial_plan: plan, timeout: TIMEOUT })?;
            let mut b: Vec<Bf16> = (0..301).map(|i| Bf16::from_f32(((i * 3 + rank * 5) % 17) as f32 - 8.0)).collect();
            let rep = c.allreduce_bf16(&mut b)?;
            // bf16 buffers travel as bf16: half the bytes of the same allreduce in f32.
            let mut f: Vec<f32> = vec![1.0; 301];
            let rep_f32 = c.allreduce_f32(&mut f)?;
            assert!(rep.bytes_sent * 10 <= rep_f32.bytes_sent * 6, "bf16 {} vs f32 {} bytes", rep.bytes_sent, rep_f32.bytes_sent);
            Ok(b)
        });
        for r in res {
            let b = r.unwrap();
            for (i, x) in b.iter().enumerate() {
                let exact: f32 = (0..world).map(|rk| ((i * 3 + rk * 5) % 17) as f32 - 8.0).sum();
                assert_eq!(x.to_f32(), exact, "{algorithm} elem {i}");
            }
        }
    }
}

#[test]
fn reduce_scatter_allgather_broadcast() {
    for world in [2usize, 3, 5] {
        for n in [1usize, 7, 1000] {
            let res = run_ranks_in_process(world, opts(2), move |rank, t| {
                let plan = Plan { chunk_bytes: 40, channels: 2, ..Plan::default() };
                let mut c = Communicator::new(t, CommunicatorConfig { initial_plan: plan, timeout: TIMEOUT })?;
                let mut rs = input(rank, 7, n);
                let (own, _) = c.reduce_scatter_f32(&mut rs)?;
                let rs_own = rs[own.clone()].to_vec();
                let mut ag = vec![f32::NAN; n];
                let mine = segment(n, world, rank);
                ag[mine.clone()].copy_from_slice(&input(rank, 8, n)[mine]);
                c.allgather_f32(&mut ag)?;
                let root = world - 1;
                let mut bc = if rank == root { input(rank, 9, n) } else { vec![0.0; n] };
                c.broadcast_f32(&mut bc, root)?;
                c.close();
                Ok((own, rs_own, ag, bc))
            });
            for (rank, r) in res.into_iter().enumerate() {
                let (own, rs_own, ag, bc) = r.unwrap();
                assert_eq!(own, segment(n, world, rank));
                for (j, i) in own.enumerate() {
                    let exact: f32 = (0..world).map(|q| input(q, 7, n)[i]).sum();
                    assert_eq!(rs_own[j], exact, "reduce-scatter world {world} n {n} elem {i}");
                }
                for q in 0..world {
                    let seg = segment(n, world, q);
                    assert_eq!(ag[seg.clone()], input(q, 8, n)[seg], "allgather world {world} n {n} seg {q}");
                }
                assert_eq!(bc, input(world - 1, 9, n), "broadcast world {world} n {n}");
            }
        }
    }
}

#[test]
fn error_feedback_makes_compression_unbiased_over_steps() {
    // Constant inputs every step: without error feedback top-k keeps dropping the same small entries;
    // with it, the mean result converges to the exact sum (residuals stay bounded, so the error of the
    // mean shrinks like 1/steps). Everything here is deterministic.
    let world = 4;
    let n = 200;
    // Max over elements of |mean result over the first s steps − exact sum|, for s = 10 and s = 40.
    let mean_errors = |error_feedback: bool| -> (f64, f64) {
        let res = run_ranks_in_process(world, opts(1), move |rank, t| {
            let plan = Plan {
                chunk_bytes: 400,
                compression: Compression { codec: CodecKind::TopK { ratio: 0.25 }, error_feedback },
                ..Plan::default()
            };
            let mut c = Communicator::new(t, CommunicatorConfig { initial_plan: plan, timeout: TIMEOUT })?;
            let mut acc = vec![0f64; n];
            let mut at10 = Vec::new();
            for s in 0..40 {
                c.begin_step(s);
                let mut b = input(rank, 1, n);
                c.allreduce_f32(&mut b)?;
                acc.iter_mut().zip(&b).for_each(|(a, x)| *a += f64::from(*x));
                if s == 9 {
                    at10 = acc.clone();
                }
            }
            Ok((at10, acc))
        });
        let (at10, at40) = res.into_iter().next().unwrap().unwrap();
        let exact: Vec<f64> = (0..n).map(|i| (0..world).map(|r| f64::from(input(r, 1, n)[i])).sum()).collect();
        let err = |acc: &[f64], s: f64| (0..n).map(|i| (acc[i] / s - exact[i]).abs()).fold(0.0, f64::max);
        (err(&at10, 10.0), err(&at40, 40.0))
    };
    let (_, without) = mean_errors(false);
    let (with10, with40) = mean_errors(true);
    assert!(with40 < without / 5.0, "error feedback did not help: max mean error {with40} vs {without} without");
    assert!(with40 < with10 / 2.0, "mean error does not shrink with steps: {with10} after 10, {with40} after 40");
}

#[test]
fn plan_change_mid_run_switches_every_rank_at_the_same_step() {
    let template = JobConfig {
        rank: 0,
        world: 4,
        peers: vec![],
        size_bytes: 4 * 1003,
        dtype: Dtype::F32,
        steps: 8,
        compute_ms: 1.0,
        compute_jitter_ms: 2.0,
        straggler_extra_ms: 0.0,
        compute_mode: ComputeMode::Sleep,
        plan: Plan { chunk_bytes: 512, ..Plan::default() },
        max_channels: 3,
        timeout_ms: 20_000,
        verify: true,
        barrier: false,
        progress: None,
    };
    let later = Plan {
        step_from: 3,
        algorithm: Algorithm::Rhd,
        chunk_bytes: 100,
        channels: 3,
        compression: Compression { codec: CodecKind::Int8, error_feedback: true },
    };
    let last = Plan { step_from: 6, algorithm: Algorithm::Tree, channels: 2, ..Plan::default() };
    let reports = run_job_in_process(&template, Some(Box::new(ScriptedPlans(vec![later, last]))));
    for (rank, r) in reports.into_iter().enumerate() {
        let r = r.unwrap();
        assert!(r.error.is_none(), "rank {rank}: {:?}", r.error);
        assert_eq!(r.steps.len(), 8);
        for s in &r.steps {
            let want = match s.step {
                0..=2 => template.plan,
                3..=5 => later,
                _ => last,
            };
            assert_eq!(s.plan, want, "rank {rank} step {}", s.step);
            assert_eq!(s.verified, Some(true), "rank {rank} step {}", s.step);
            assert!(s.bytes_sent > 0);
        }
        assert_eq!(r.summary.all_verified, Some(true));
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["steps"][3]["plan"]["algorithm"], "rhd");
    }
}

#[test]
fn barrier_returns_on_no_rank_before_every_rank_has_called_it() {
    for world in [2, 3, 4] {
        for algorithm in Algorithm::ALL {
            let plan = Plan { algorithm, ..Plan::default() };
            // Rank r arrives r·30 ms late; every exit must come after the last arrival.
            let res = run_ranks_in_process(world, opts(1), move |rank, t| {
                let mut c = Communicator::new(t, CommunicatorConfig { initial_plan: plan, timeout: TIMEOUT })?;
                let mut times = Vec::new();
                for round in 0..3u64 {
                    std::thread::sleep(Duration::from_millis(30 * ((rank as u64 + round) % world as u64)));
                    let arrived = std::time::Instant::now();
                    c.barrier()?;
                    times.push((arrived, std::time::Instant::now()));
                }
                Ok(times)
            });
            let times: Vec<Vec<_>> = res.into_iter().map(|r| r.unwrap()).collect();
            for round in 0..3 {
                let last_arrival = times.iter().map(|t| t[round].0).max().unwrap();
                for (rank, t) in times.iter().enumerate() {
                    assert!(t[round].1 >= last_arrival, "{algorithm:?}, {world} ranks, round {round}: rank {rank} left the barrier before the last rank arrived");
                }
            }
        }
    }
}

#[test]
fn a_job_with_barriers_times_only_its_allreduces_and_verifies_them() {
    let template = JobConfig {
        rank: 0,
        world: 3,
        peers: vec![],
        size_bytes: 4 * 1003,
        dtype: Dtype::F32,
        steps: 6,
        compute_ms: 1.0,
        compute_jitter_ms: 0.0,
        straggler_extra_ms: 0.0,
        compute_mode: ComputeMode::Sleep,
        plan: Plan { algorithm: Algorithm::Rhd, chunk_bytes: 512, ..Plan::default() },
        max_channels: 1,
        timeout_ms: 20_000,
        verify: true,
        barrier: true,
        progress: None,
    };
    for barrier in [true, false] {
        let template = JobConfig { barrier, ..template.clone() };
        // Rank 0's compute phase is 40 ms longer every step: the others wait for it inside the
        // allreduce without a barrier, before it with one.
        let reports = run_ranks_in_process(3, opts(1), move |rank, t| {
            let straggler_extra_ms = if rank == 0 { 40.0 } else { 0.0 };
            run_job(&JobConfig { rank, straggler_extra_ms, ..template.clone() }, t, None)
        });
        for (rank, r) in reports.into_iter().enumerate() {
            let r = r.unwrap();
            assert!(r.error.is_none(), "rank {rank}: {:?}", r.error);
            assert_eq!(r.summary.all_verified, Some(true), "rank {rank}");
            if rank == 1 {
                let median = r.summary.comm_ms.p50;
                if barrier {
                    assert!(median < 30.0, "with barriers rank 1's median comm time is {median} ms: the wait for rank 0 leaked into it");
                } else {
                    assert!(median >= 30.0, "without barriers rank 1's median comm time is {median} ms: it should include rank 0's extra 40 ms");
                }
            }
        }
    }
}

#[test]
fn every_step_is_appended_to_the_progress_file_as_it_ends() {
    let path = std::env::temp_dir().join(format!("ringside-progress-test-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let template = JobConfig {
        rank: 0,
        world: 2,
        peers: vec![],
        size_bytes: 4 * 257,
        dtype: Dtype::F32,
        steps: 5,
        compute_ms: 1.0,
        compute_jitter_ms: 0.0,
        straggler_extra_ms: 0.0,
        compute_mode: ComputeMode::Sleep,
        plan: Plan::default(),
        max_channels: 1,
        timeout_ms: 20_000,
        verify: true,
        barrier: false,
        progress: Some(path.clone()),
    };
    let reports: Vec<_> = run_job_in_process(&template, None).into_iter().map(|r| r.unwrap()).collect();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    // Both ranks (threads here) append to the one file: a line per step of each, the same records
    // as the reports'.
    let mut lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 10, "{text}");
    let mut reported: Vec<serde_json::Value> = reports.iter().flat_map(|r| r.steps.iter().map(|s| serde_json::to_value(s).unwrap())).collect();
    // Floats read back from JSON may differ in their last bit: compared within 1e-9 ms.
    let key = |v: &serde_json::Value| (v["end_unix_ms"].as_u64(), v["step"].as_u64(), v["bytes_sent"].as_u64(), (v["comm_ms"].as_f64().unwrap() * 1e6).round() as u64);
    lines.sort_by_key(key);
    reported.sort_by_key(key);
    for (l, r) in lines.iter().zip(&reported) {
        assert_eq!((&l["step"], &l["end_unix_ms"], &l["bytes_sent"], &l["plan"], &l["verified"]), (&r["step"], &r["end_unix_ms"], &r["bytes_sent"], &r["plan"], &r["verified"]));
        for k in ["comm_ms", "compute_ms", "step_ms"] {
            assert!((l[k].as_f64().unwrap() - r[k].as_f64().unwrap()).abs() < 1e-9, "{k}: {l} against {r}");
        }
    }
}

#[test]
fn invalid_plan_from_source_is_ignored() {
    let res = run_ranks_in_process(2, opts(1), |rank, t| {
        let mut c = Communicator::new(t, CommunicatorConfig { initial_plan: Plan::default(), timeout: TIMEOUT })?;
        if rank == 0 {
            c.set_plan_source(Box::new(ScriptedPlans(vec![Plan { channels: 4, ..Plan::default() }])));
        }
        let mut b = vec![1.0f32; 10];
        let rep = c.allreduce_f32(&mut b)?;
        Ok((rep.plan, b))
    });
    for r in res {
        let (plan, b) = r.unwrap();
        assert_eq!(plan, Plan::default());
        assert_eq!(b, vec![2.0; 10]);
    }
}

/// An rhd plan on the raw f32 wire (the only wire on which small rhd runs as recursive doubling).
fn rhd_plan(chunk_bytes: u32, channels: u8) -> Plan {
    Plan { step_from: 0, algorithm: Algorithm::Rhd, chunk_bytes, channels, compression: Compression::NONE }
}

/// Both rhd paths, on both sides of the doubling threshold, for every world size the matrix uses:
/// exact sums, identical on every rank. Rank 1's wire bytes tell which path ran: recursive doubling
/// sends the whole buffer log2(p) times, halving-doubling 2·(p−1)/p of it (world 4: 2 vs 1.5).
#[test]
fn rhd_doubling_and_halving_are_exact_around_the_threshold() {
    use ipu_firmware::engine::RHD_DOUBLING_MAX_BYTES;
    use ipu_firmware::wire::HEADER_LEN;
    let at = RHD_DOUBLING_MAX_BYTES / 4;
    for world in [2usize, 3, 4, 5, 8] {
        for (n, chunk_bytes) in [(at, 1u32 << 20), (at, 40_000), (at + 1, 1 << 20), (at + 1, 40_000), (5, 1 << 20)] {
            let res = run_ranks_in_process(world, opts(2), move |rank, t| {
                let plan = rhd_plan(chunk_bytes, 2);
                let mut comm = Communicator::new(t, CommunicatorConfig { initial_plan: plan, timeout: TIMEOUT })?;
                let mut buf = input(rank, 11, n);
                let rep = comm.allreduce_f32(&mut buf)?;
                comm.close();
                Ok((buf, rep.bytes_sent))
            });
            let res: Vec<_> = res.into_iter().map(|r| r.expect("rank failed")).collect();
            let inputs: Vec<Vec<f32>> = (0..world).map(|r| input(r, 11, n)).collect();
            let results: Vec<Vec<f32>> = res.iter().map(|r| r.0.clone()).collect();
            check(world, &rhd_plan(chunk_bytes, 2), &inputs, &results);
            if world == 4 {
                let frames = n.div_ceil(ipu_firmware::engine::chunk_elems(chunk_bytes, Dtype::F32, n, false));
                let doubling = (2 * (4 * n + frames * HEADER_LEN)) as u64;
                let sent = res[1].1;
                if n <= at {
                    assert_eq!(sent, doubling, "world 4, n {n}, chunk {chunk_bytes}: rank 1 did not run recursive doubling");
                } else {
                    assert!(sent < doubling * 4 / 5, "world 4, n {n}: rank 1 sent {sent} bytes, as if doubling ({doubling})");
                }
            }
        }
    }
}

/// Recursive doubling without the owner-encodes-once rule still ends bit-identical on every rank
/// when the sums are inexact (the grouping of additions matters) and when different NaN payloads
/// meet (which payload `a + b` keeps is unspecified; the engine canonicalises NaN sums).
#[test]
fn rhd_doubling_is_bit_identical_for_inexact_sums_and_nans() {
    for world in [2usize, 3, 4, 5, 8] {
        let n = 4099;
        let make = move |rank: usize| -> Vec<f32> {
            let mut rng = rand::rngs::StdRng::seed_from_u64(77 + rank as u64);
            let mut v: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0f32..1.0) * 10f32.powi(rng.gen_range(-6..7))).collect();
            v[0] = f32::from_bits(0x7fc0_0000 | (rank as u32 + 1)); // a quiet NaN with a per-rank payload
            v
        };
        let res = run_ranks_in_process(world, opts(1), move |rank, t| {
            let mut comm = Communicator::new(t, CommunicatorConfig { initial_plan: rhd_plan(1 << 20, 1), timeout: TIMEOUT })?;
            let mut buf = make(rank);
            comm.allreduce_f32(&mut buf)?;
            comm.close();
            Ok(buf)
        });
        let res: Vec<Vec<f32>> = res.into_iter().map(|r| r.expect("rank failed")).collect();
        assert!(res[0][0].is_nan(), "world {world}: NaN lost");
        for r in 1..world {
            let differ = (0..n).filter(|&i| res[r][i].to_bits() != res[0][i].to_bits()).count();
            assert_eq!(differ, 0, "world {world}: rank {r} differs from rank 0 in {differ} elements");
        }
        let inputs: Vec<Vec<f32>> = (0..world).map(make).collect();
        for i in 1..n {
            let exact: f64 = inputs.iter().map(|x| f64::from(x[i])).sum();
            let mag: f64 = inputs.iter().map(|x| f64::from(x[i].abs())).sum();
            let got = f64::from(res[0][i]);
            assert!((got - exact).abs() <= mag * world as f64 * 2f64.powi(-23), "world {world} elem {i}: {got} vs {exact}");
        }
    }
}

/// Ranks 1..n−1 start a collective on rank 0's promise from the previous control header (without
/// waiting for the new header) exactly when rank 0's schedule has no plan due: never on the first
/// collective, not at the step a pending plan takes effect, and again after it. Results stay exact
/// and every rank runs the plan rank 0 chose.
#[test]
fn later_collectives_start_on_rank_0s_promise_until_a_plan_is_due() {
    let world = 4;
    let base = Plan { algorithm: Algorithm::Tree, chunk_bytes: 4096, ..Plan::default() };
    let later = Plan { step_from: 2, algorithm: Algorithm::Ring, chunk_bytes: 1024, ..Plan::default() };
    let n = 3000;
    let source = std::sync::Mutex::new(Some(ScriptedPlans(vec![later])));
    let per_rank = run_ranks_in_process(world, opts(1), move |rank, t| {
        let mut comm = Communicator::new(t, CommunicatorConfig { initial_plan: base, timeout: TIMEOUT })?;
        if rank == 0 {
            comm.set_plan_source(Box::new(source.lock().unwrap().take().unwrap()));
        }
        let mut out = Vec::new();
        for step in 0..4u64 {
            comm.begin_step(step);
            for k in 0..2u64 {
                let mut buf = input(rank, step * 10 + k, n);
                let rep = comm.allreduce_f32(&mut buf)?;
                out.push((step, k, rep.plan, rep.on_promise, buf));
            }
        }
        comm.close();
        Ok(out)
    });
    let per_rank: Vec<_> = per_rank.into_iter().map(|r| r.expect("rank failed")).collect();
    for (j, &(step, k, plan, _, _)) in per_rank[0].iter().enumerate() {
        assert_eq!(plan, if step < 2 { base } else { later }, "step {step} op {k}");
        // The first collective has no previous header; step 2's first one is where `later` is due.
        let promised = k != 0 || !matches!(step, 0 | 2);
        for (r, ops) in per_rank.iter().enumerate() {
            assert_eq!(ops[j].2, plan, "rank {r} step {step} op {k}: plan");
            assert_eq!(ops[j].3, promised && r != 0, "rank {r} step {step} op {k}: started on the promise");
        }
        let inputs: Vec<Vec<f32>> = (0..world).map(|r| input(r, step * 10 + k, n)).collect();
        let results: Vec<Vec<f32>> = per_rank.iter().map(|ops| ops[j].4.clone()).collect();
        check(world, &plan, &inputs, &results);
    }
}

/// A voter that proposes `plan` from training step `from` on (and abstains before).
struct ScriptedVoter {
    from: u64,
    proposal: Option<ipu_firmware::PlanProposal>,
}

impl ipu_firmware::PlanVoter for ScriptedVoter {
    fn propose(&mut self, step: u64) -> Option<ipu_firmware::PlanProposal> {
        self.proposal.filter(|_| step >= self.from)
    }
}

#[test]
fn plan_votes_switch_every_rank_at_the_same_op_to_the_most_severe_proposal() {
    use ipu_firmware::plan::severity;
    use ipu_firmware::{PlanOrigin, PlanProposal};
    let base = Plan { chunk_bytes: 512, ..Plan::default() };
    let tree = Plan { algorithm: Algorithm::Tree, ..base };
    let int8 = Plan { compression: Compression { codec: CodecKind::Int8, error_feedback: false }, ..base };
    let proposal = move |plan: Plan, version| Some(PlanProposal { plan, version, severity: severity(&plan, &base) });
    // Rank 3 (not rank 0) proposes a change of algorithm from step 2; rank 2 compresses from step
    // 5 and outranks it; rank 1 abstains throughout (an unreachable agent); rank 0 proposes the
    // baseline (a healthy agent's first hint).
    let voters = move |rank: usize| match rank {
        0 => ScriptedVoter { from: 0, proposal: proposal(base, 1) },
        1 => ScriptedVoter { from: 0, proposal: None },
        2 => ScriptedVoter { from: 5, proposal: proposal(int8, 4) },
        _ => ScriptedVoter { from: 2, proposal: proposal(tree, 2) },
    };
    let steps = 8u64;
    let n = 1003;
    let res = run_ranks_in_process(4, opts(1), move |rank, t| {
        let mut c = Communicator::new(t, CommunicatorConfig { initial_plan: base, timeout: TIMEOUT })?;
        c.set_plan_voter(Box::new(voters(rank)));
        let mut out = Vec::new();
        for step in 0..steps {
            c.begin_step(step);
            // Two collectives per step: a plan never changes between them.
            for k in 0..2u64 {
                let mut b = input(rank, step * 2 + k, n);
                let rep = c.allreduce_f32(&mut b)?;
                out.push((step, k, rep.plan, b, c.plan_origin(&rep.plan), rep.on_promise));
            }
        }
        Ok(out)
    });
    let res: Vec<_> = res.into_iter().map(|r| r.unwrap()).collect();
    for (rank, ops) in res.iter().enumerate() {
        for (i, (step, k, plan, b, origin, on_promise)) in ops.iter().enumerate() {
            // Agreed at the first collective of the step a proposal appears, run from the next.
            let want = match step {
                0..=2 => base,
                3..=5 => tree,
                _ => int8,
            };
            assert!(plan.same_as(&want), "rank {rank} op {i} (step {step}): ran {plan:?}, want {want:?}");
            assert_eq!(plan, &res[0][i].2, "rank {rank} op {i}: a different plan than rank 0");
            // Votes respect rank 0's promise: a step's second collective always starts on it, the
            // first one only when no agreed plan takes effect at that step (1: the baseline
            // agreed at step 0, 3: tree, 6: int8).
            let promised = *k != 0 || !matches!(step, 0 | 1 | 3 | 6);
            assert_eq!(*on_promise, promised && rank != 0, "rank {rank} op {i} (step {step}): started on the promise");
            let inputs: Vec<Vec<f32>> = (0..4).map(|r| input(r, step * 2 + (i as u64 % 2), n)).collect();
            if want.compression.codec == CodecKind::None {
                let sum: Vec<f32> = (0..n).map(|j| inputs.iter().map(|v| v[j]).sum()).collect();
                assert_eq!(b, &sum, "rank {rank} op {i}: inexact sum");
            } else {
                assert_eq!(b, &res[0][i].3, "rank {rank} op {i}: ranks disagree on a compressed result");
            }
            if rank == 0 {
                let from = match step {
                    0..=2 => (*step > 0).then_some(PlanOrigin { rank: 0, version: 1 }),
                    3..=5 => Some(PlanOrigin { rank: 3, version: 2 }),
                    _ => Some(PlanOrigin { rank: 2, version: 4 }),
                };
                assert_eq!(*origin, from, "op {i} (step {step})");
            } else {
                assert_eq!(*origin, None, "only rank 0 knows where a plan came from");
            }
        }
    }
}

/// With one collective per step, rank 0 has promised the next collective's plan before it takes
/// the votes (it does not wait for them before its header), so a plan agreed at step `s` runs from
/// step `s + 2`: one collective later than the step after the vote, on every rank at once.
#[test]
fn a_vote_taken_after_the_header_takes_effect_one_collective_later_on_every_rank() {
    use ipu_firmware::plan::severity;
    use ipu_firmware::PlanProposal;
    let base = Plan { chunk_bytes: 512, ..Plan::default() };
    let int8 = Plan { compression: Compression { codec: CodecKind::Int8, error_feedback: false }, ..base };
    let voters = move |rank: usize| match rank {
        2 => ScriptedVoter { from: 2, proposal: Some(PlanProposal { plan: int8, version: 3, severity: severity(&int8, &base) }) },
        _ => ScriptedVoter { from: 0, proposal: None },
    };
    let n = 777;
    let res = run_ranks_in_process(4, opts(1), move |rank, t| {
        let mut c = Communicator::new(t, CommunicatorConfig { initial_plan: base, timeout: TIMEOUT })?;
        c.set_plan_voter(Box::new(voters(rank)));
        let mut out = Vec::new();
        for step in 0..6u64 {
            c.begin_step(step);
            let mut b = input(rank, 700 + step, n);
            let rep = c.allreduce_f32(&mut b)?;
            out.push((rep.plan, b));
        }
        Ok(out)
    });
    let res: Vec<_> = res.into_iter().map(|r| r.unwrap()).collect();
    for (rank, ops) in res.iter().enumerate() {
        for (step, (plan, b)) in ops.iter().enumerate() {
            let want = if step >= 4 { int8 } else { base };
            assert!(plan.same_as(&want), "rank {rank} step {step}: ran {plan:?}, want {want:?}");
            assert_eq!(b, &res[0][step].1, "rank {rank} step {step}: ranks disagree");
        }
    }
}

/// Collectives at or below `DIRECT_READ_MAX_BYTES` are read on the engine's thread, larger ones by
/// the reader threads: alternating them on one mesh hands every connection's socket back and forth
/// (frames a reader read before it parked are taken first), and every result stays exact.
#[test]
fn small_and_large_collectives_alternate_between_direct_and_reader_reads() {
    use ipu_firmware::engine::DIRECT_READ_MAX_BYTES;
    let small = DIRECT_READ_MAX_BYTES / 4 / 16;
    let large = DIRECT_READ_MAX_BYTES / 4 * 3 + 5;
    let sizes = [small, large, small, small, large, large, small, 1, large, small];
    for world in [2usize, 3, 4] {
        for algorithm in Algorithm::ALL {
            let plan = Plan { algorithm, chunk_bytes: 256 << 10, ..Plan::default() };
            let res = run_ranks_in_process(world, opts(2), move |rank, t| {
                let mut comm = Communicator::new(t, CommunicatorConfig { initial_plan: plan, timeout: TIMEOUT })?;
                let mut out = Vec::new();
                for (i, &n) in sizes.iter().enumerate() {
                    let mut buf = input(rank, 500 + i as u64, n);
                    comm.allreduce_f32(&mut buf)?;
                    out.push(buf);
                }
                comm.close();
                Ok(out)
            });
            let res: Vec<_> = res.into_iter().map(|r| r.expect("rank failed")).collect();
            for (i, &n) in sizes.iter().enumerate() {
                let inputs: Vec<Vec<f32>> = (0..world).map(|r| input(r, 500 + i as u64, n)).collect();
                let results: Vec<Vec<f32>> = res.iter().map(|r| r[i].clone()).collect();
                check(world, &plan, &inputs, &results);
            }
        }
    }
}

/// A tenant's inf or NaN, or a sum that overflows f32, reaches every rank as a non-finite value with
/// every lossy codec and algorithm (int8: NaN), bit-identical everywhere and without a panic
/// (docs/fuzzing.md, findings 1 and 3); a single f32::MAX stays finite with int8. With error
/// feedback the next, finite step is within the codec's bound again: the residuals of the chunks
/// that were not finite were reset, not carried into every later step as inf/NaN.
#[test]
fn nonfinite_values_reach_every_rank_and_error_feedback_recovers() {
    let (world, n, at) = (3usize, 300usize, 5usize);
    let bad_input = move |case: usize, rank: usize| -> Vec<f32> {
        let mut v = input(rank, 40, n);
        match (case, rank) {
            (0, 1) => v[at] = f32::NAN,
            (1, 2) => v[at] = f32::INFINITY,
            (2, 1 | 2) => v[at] = f32::MAX, // the sum overflows
            (3, 1) => v[at] = f32::MAX,     // alone: finite on the raw wire
            _ => {}
        }
        v
    };
    for algorithm in Algorithm::ALL {
        for codec in [CodecKind::Fp16, CodecKind::Bf16, CodecKind::Int8, CodecKind::TopK { ratio: 0.3 }] {
            for error_feedback in [false, true] {
                let plan = Plan { algorithm, chunk_bytes: 64, compression: Compression { codec, error_feedback }, ..Plan::default() };
                let res = run_ranks_in_process(world, opts(1), move |rank, t| {
                    let mut c = Communicator::new(t, CommunicatorConfig { initial_plan: plan, timeout: TIMEOUT })?;
                    let mut out = Vec::new();
                    for case in 0..4 {
                        c.begin_step(2 * case as u64);
                        let mut b = bad_input(case, rank);
                        c.allreduce_f32(&mut b)?;
                        c.begin_step(2 * case as u64 + 1);
                        let mut next = input(rank, 41 + case as u64, n);
                        c.allreduce_f32(&mut next)?;
                        out.push((b, next));
                    }
                    c.close();
                    Ok(out)
                });
                let res: Vec<_> = res.into_iter().map(|r| r.expect("rank failed")).collect();
                for case in 0..4 {
                    let what = format!("{algorithm} {codec} feedback {error_feedback}, case {case}");
                    let bad: Vec<Vec<f32>> = res.iter().map(|r| r[case].0.clone()).collect();
                    for r in 1..world {
                        assert!(bad[r].iter().zip(&bad[0]).all(|(a, b)| a.to_bits() == b.to_bits()), "{what}: rank {r} differs");
                    }
                    let x = bad[0][at];
                    match (case, codec) {
                        (3, CodecKind::Int8 | CodecKind::TopK { .. }) => assert!(x.is_finite() && x >= f32::MAX * 0.99, "{what}: {x}"),
                        (3, _) => assert!(x == f32::INFINITY, "{what}: {x}"), // beyond fp16's and bf16's range
                        (_, CodecKind::Int8) => assert!(x.is_nan(), "{what}: {x}"),
                        _ => assert!(!x.is_finite(), "{what}: {x}"),
                    }
                    // An f32::MAX in a rank's own chunk leaves an ordinary residual with int8: that
                    // chunk was finite, so its error is still sent later, as error feedback should.
                    if case >= 2 && error_feedback && codec == CodecKind::Int8 {
                        continue;
                    }
                    // The next step: within the bound, widened by the residuals the bad step left in
                    // its finite chunks (its inputs without the bad value).
                    let inputs: Vec<Vec<f32>> = (0..world).map(|r| input(r, 41 + case as u64, n)).collect();
                    let carried: Vec<Vec<f32>> = if error_feedback { (0..world).map(|r| input(r, 40, n)).collect() } else { Vec::new() };
                    let next: Vec<Vec<f32>> = res.iter().map(|r| r[case].1.clone()).collect();
                    check_carrying(world, &plan, &inputs, &carried, &next);
                }
            }
        }
    }
}
