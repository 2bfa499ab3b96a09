//! T2: the real collective engine across network namespaces. One `ringside-rank` per host of a star,
//! over the testbed's veth/bridge links, each rank checking its allreduce result (`--verify`: exact
//! for lossless plans, within the codec's documented bound otherwise) at every step.
//!
//! Needs root and the rank binary: `cargo xtask test` builds it in release and passes
//! `RINGSIDE_RANK_BIN`; by hand, `cargo build --release -p ipu-firmware --bin ringside-rank` and
//! run with `RINGSIDE_RANK_BIN=target/release/ringside-rank`. Without either it FAILS with the reason.
use std::{path::PathBuf, time::Duration};

use testbed::{job::JobConfig, JobReport, Star, StarConfig};

fn rank_bin() -> PathBuf {
    if let Err(e) = testbed::require_root() {
        panic!("t2_collectives creates network namespaces: {e}");
    }
    match std::env::var_os("RINGSIDE_RANK_BIN") {
        Some(p) => PathBuf::from(p),
        None => testbed::job::find_rank_binary(None).unwrap_or_else(|e| {
            panic!("{e}: run `cargo build --release -p ipu-firmware --bin ringside-rank` and set RINGSIDE_RANK_BIN")
        }),
    }
}

/// Runs one job and asserts every rank finished, verified every step, and reported no error.
fn run_verified(star: &Star, ranks: usize, what: &str, args: &[&str], dir: &std::path::Path) -> JobReport {
    let cfg = JobConfig {
        ranks,
        // 1 MiB + 12 bytes: 262,147 f32 elements, which no world size or chunk divides evenly.
        size: testbed::ByteSize((1 << 20) + 12),
        steps: 4,
        compute_ms: 0,
        verify: true,
        rank_bin: Some(rank_bin()),
        out_dir: Some(dir.join(what.replace([' ', ':', '/'], "_"))),
        timeout: Duration::from_secs(60),
        extra_args: args.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let report = testbed::run_job(star, &cfg, None).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(report.ranks.len(), ranks, "{what}");
    for r in &report.ranks {
        assert_eq!(r.error, None, "{what}: rank {} failed (log {})", r.rank, r.log.display());
        assert_eq!(r.verified, Some(true), "{what}: rank {} did not verify (log {})", r.rank, r.log.display());
    }
    report
}

#[test]
#[ignore = "needs root (T2): run with cargo xtask test"]
fn every_algorithm_and_codec_is_correct_across_namespaces() {
    let star = Star::new(StarConfig { hosts: 5, ..Default::default() }).unwrap();
    let dir = std::env::temp_dir().join(format!("ringside-t2-collectives-{}", std::process::id()));
    let mut runs = 0;
    for algorithm in ["ring", "tree", "rhd"] {
        // 3 and 5 ranks: non-powers of two (rhd folds the extra ranks first); 4: the plain case.
        for ranks in [3, 4, 5] {
            for compression in ["none", "int8"] {
                let mut args = vec!["--algorithm", algorithm, "--compression", compression, "--chunk-bytes", "65536"];
                if compression != "none" {
                    args.push("--error-feedback");
                }
                run_verified(&star, ranks, &format!("{algorithm} n={ranks} {compression}"), &args, &dir);
                runs += 1;
            }
        }
        for compression in ["fp16", "bf16", "topk:0.25"] {
            let args = ["--algorithm", algorithm, "--compression", compression, "--channels", "2"];
            run_verified(&star, 4, &format!("{algorithm} n=4 {compression} 2 channels"), &args, &dir);
            runs += 1;
        }
        run_verified(&star, 4, &format!("{algorithm} n=4 bf16 buffers"), &["--algorithm", algorithm, "--dtype", "bf16"], &dir);
        runs += 1;
    }
    assert_eq!(runs, 3 * (3 * 2 + 3 + 1));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
#[ignore = "needs root (T2): run with cargo xtask test"]
fn a_plan_change_applies_on_every_rank_at_the_same_step_across_namespaces() {
    let star = Star::new(StarConfig { hosts: 4, ..Default::default() }).unwrap();
    let dir = std::env::temp_dir().join(format!("ringside-t2-plan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let schedule = dir.join("plans.json");
    std::fs::write(
        &schedule,
        r#"[{"step_from":2,"algorithm":"rhd","chunk_bytes":262144,"channels":2,"compression":{"codec":"int8","error_feedback":true}},
            {"step_from":4,"algorithm":"tree","chunk_bytes":1048576,"channels":1,"compression":{"codec":"none","error_feedback":false}}]"#,
    )
    .unwrap();
    let sched = schedule.to_str().unwrap();
    // Only rank 0 reads the schedule; the others learn each plan from rank 0's control header.
    let report = run_verified(&star, 4, "plan change", &["--plan-schedule", sched, "--max-channels", "2"], &dir);
    let plans: Vec<Vec<String>> = report
        .ranks
        .iter()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&r.out).unwrap()).unwrap();
            v["steps"].as_array().unwrap().iter().map(|s| s["plan"]["algorithm"].as_str().unwrap().to_owned()).collect()
        })
        .collect();
    assert_eq!(plans[0], ["ring", "ring", "rhd", "rhd"], "rank 0 follows the schedule");
    for (rank, p) in plans.iter().enumerate() {
        assert_eq!(p, &plans[0], "rank {rank} switched at a different step");
    }
    std::fs::remove_dir_all(&dir).ok();
}
