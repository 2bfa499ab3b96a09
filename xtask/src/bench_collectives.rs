//! `cargo xtask bench collectives`: allreduce bus bandwidth of the ringside engine on a 4-host star,
//! next to the same star's iperf3 point-to-point throughput and OpenMPI's `MPI_Allreduce`, all
//! measured in one run; plus the codec throughput bench of ipu-firmware when it exists.
//!
//! Definitions (as nccl-tests): algbw = size / time, busbw = algbw · 2(n−1)/n, GB/s = 1e9 B/s.
//! "time" is the median over measured steps of the slowest rank's allreduce time in that step.
//!
//! Output: a table on stdout, `target/bench/collectives.json`, and `docs/benchmarks-collectives.md`.
use std::{
    io::Read,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use ringside_stats::median;
use serde_json::{json, Value};
use testbed::{ByteSize, JobConfig, Star, StarConfig};

use crate::{
    build,
    util::{cargo, output, sh, workspace_root},
};

const ALGORITHMS: [&str; 3] = ["ring", "tree", "rhd"];
const WORLD: usize = 4;

/// Options of `cargo xtask bench collectives`.
#[derive(clap::Args, Clone, Debug)]
pub struct Opts {
    /// Largest message size in MiB (sizes are 1 KiB · 4^k up to this). Ignored with --sizes.
    #[arg(long, default_value_t = 64)]
    pub max_mib: u64,
    /// Measure only these message sizes (comma-separated, e.g. `64KiB,256KiB,1MiB`) instead of
    /// 1 KiB · 4^k up to --max-mib.
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<ByteSize>,
    /// The small-message check in about two minutes: sizes 64 KiB, 256 KiB and 1 MiB (unless --sizes
    /// says otherwise), no 16 MiB variants, no codec bench, one round (unless --rounds says otherwise).
    #[arg(long)]
    pub quick: bool,
    /// Bytes moved per (algorithm, size) cell, in MiB; bounds the step count (between --min-steps
    /// and --max-steps).
    #[arg(long, default_value_t = 512)]
    pub budget_mib: u64,
    #[arg(long, default_value_t = 10)]
    pub min_steps: u32,
    #[arg(long, default_value_t = 200)]
    pub max_steps: u32,
    /// Measure every ringside cell and every OpenMPI algorithm this many times, alternating which
    /// of the two goes first (default 3; 1 with --quick). Tables show each cell's median over the
    /// rounds; the targets use, per size, the median over rounds of ringside's best / OpenMPI's best
    /// measured within the same round, so that a drift of the shared machine's speed over the run
    /// does not decide a comparison. The 16 MiB variants are measured once.
    #[arg(long)]
    pub rounds: Option<u32>,
    /// Skip the OpenMPI baseline.
    #[arg(long)]
    pub no_openmpi: bool,
    /// Skip the extra 16 MiB ring variants (channels, chunk sizes, compression).
    #[arg(long)]
    pub no_extras: bool,
    /// Skip the codec throughput bench.
    #[arg(long)]
    pub no_codecs: bool,
    /// Run this `ringside-rank` binary instead of building the workspace's: A/B runs of two builds
    /// on the same rig minutes apart (e.g. a copy of main's binary against this tree's). It is run
    /// with `--barrier` (builds before 2026-11-29 lack it: wrap them in a script that drops it).
    #[arg(long)]
    pub rank_bin: Option<PathBuf>,
}

/// A 16 MiB ring variant: (name, extra rank args, compression, result).
type Extra<'a> = (&'a str, String, Option<&'a str>, std::result::Result<Cell, String>);
/// One OpenMPI run: (name, coll_tuned_allreduce_algorithm, cells or why not).
type MpiRun<'a> = (&'a str, u32, std::result::Result<Vec<Cell>, String>);

/// What one measured cell produced.
#[derive(Clone, Debug)]
struct Cell {
    size: u64,
    steps: usize,
    /// Median over steps of the slowest rank's time, seconds.
    time_s: f64,
    busbw: f64,
    /// Median over steps of the fastest rank's time (the rank that entered last), seconds.
    time_min_rank_s: f64,
}

impl Cell {
    fn json(&self) -> Value {
        json!({
            "size": self.size,
            "steps": self.steps,
            "time_us": self.time_s * 1e6,
            "algbw_gbs": self.size as f64 / self.time_s / 1e9,
            "busbw_gbs": self.busbw / 1e9,
            "time_fastest_rank_us": self.time_min_rank_s * 1e6,
        })
    }
}

pub fn busbw(bytes: u64, world: usize, seconds: f64) -> f64 {
    bytes as f64 / seconds * 2.0 * (world as f64 - 1.0) / world as f64
}


fn sizes(max_mib: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut s = 1024u64;
    while s <= max_mib << 20 {
        out.push(s);
        s *= 4;
    }
    out
}

fn human(b: u64) -> String {
    if b >= 1 << 20 {
        format!("{} MiB", b >> 20)
    } else if b >= 1 << 10 {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}

/// (measured steps, warm-up steps) for a size.
fn steps_for(o: &Opts, size: u64) -> (u32, u32) {
    steps_for_budget(o, o.budget_mib, size)
}

fn steps_for_budget(o: &Opts, budget_mib: u64, size: u64) -> (u32, u32) {
    let n = ((budget_mib << 20) / size).clamp(o.min_steps as u64, o.max_steps as u64) as u32;
    (n, (n / 10).max(2))
}

fn check_stop(stop: &AtomicBool) -> Result<()> {
    if stop.load(Ordering::SeqCst) {
        bail!("interrupted; tearing down");
    }
    Ok(())
}

/// ringside's cells of one round: per algorithm, per size, the cell or why it failed.
type AlgCells = Vec<(&'static str, Vec<(u64, std::result::Result<Cell, String>)>)>;

/// One round: every ringside cell and every OpenMPI algorithm, measured minutes apart at most.
struct Round {
    ringside: AlgCells,
    mpi: Vec<MpiRun<'static>>,
}

fn ringside_round(star: &Star, rank_bin: &Path, o: &Opts, size_list: &[u64], port: &mut u16, stop: &AtomicBool) -> Result<AlgCells> {
    let mut ringside = Vec::new();
    for alg in ALGORITHMS {
        let mut cells = Vec::new();
        for &size in size_list {
            check_stop(stop)?;
            *port += 1;
            let t0 = Instant::now();
            let cell = ringside_cell(star, rank_bin, o, alg, size, &[], None, *port, stop);
            let took = t0.elapsed().as_secs_f64();
            match &cell {
                Ok(c) => println!(
                    "  ringside {alg:<4} {:>8}: {:>10.1} us  busbw {:>7.3} GB/s  ({} steps, {took:.1} s)",
                    human(size),
                    c.time_s * 1e6,
                    c.busbw / 1e9,
                    c.steps
                ),
                Err(e) => println!("  ringside {alg:<4} {:>8}: FAILED: {e:#}", human(size)),
            }
            cells.push((size, cell.map_err(|e| format!("{e:#}"))));
        }
        ringside.push((alg, cells));
    }
    Ok(ringside)
}

/// The 16 MiB ring variants (measured once, in the first round).
fn extras_16mib(star: &Star, rank_bin: &Path, o: &Opts, port: &mut u16, stop: &AtomicBool) -> Result<Vec<Extra<'static>>> {
    let size = 16u64 << 20;
    let variants: [(&str, Vec<&str>, Option<&str>); 6] = [
        ("ring, 2 channels", vec!["--channels", "2"], None),
        ("ring, chunk 256 KiB", vec!["--chunk-bytes", "256KiB"], None),
        ("ring, chunk 4 MiB", vec!["--chunk-bytes", "4MiB"], None),
        ("ring, 2 channels, chunk 4 MiB", vec!["--channels", "2", "--chunk-bytes", "4MiB"], None),
        ("ring, fp16 wire", vec![], Some("fp16")),
        ("ring, int8 wire", vec![], Some("int8")),
    ];
    let mut extras = Vec::new();
    for (name, args, comp) in variants {
        check_stop(stop)?;
        *port += 1;
        let cell = ringside_cell(star, rank_bin, o, "ring", size, &args, comp, *port, stop);
        match &cell {
            Ok(c) => println!("  16 MiB {name:<30}: {:>10.1} us  busbw {:>7.3} GB/s", c.time_s * 1e6, c.busbw / 1e9),
            Err(e) => println!("  16 MiB {name:<30}: FAILED: {e:#}"),
        }
        extras.push((name, args.join(" "), comp, cell.map_err(|e| format!("{e:#}"))));
    }
    Ok(extras)
}

/// Every OpenMPI algorithm at every size (nothing when the baseline is unavailable).
fn mpi_round(
    star: &Star,
    bench_dir: &Path,
    mpi_ready: &std::result::Result<PathBuf, String>,
    o: &Opts,
    size_list: &[u64],
    stop: &AtomicBool,
) -> Result<Vec<MpiRun<'static>>> {
    let mut mpi = Vec::new();
    let Ok(mpi_bin) = mpi_ready else { return Ok(mpi) };
    for (name, id) in testbed::MpiAlgorithm::ALL.map(|a| (a.name(), a.id())) {
        check_stop(stop)?;
        let t0 = Instant::now();
        let r = run_mpi(star, bench_dir, mpi_bin, o, size_list, id, stop);
        let took = t0.elapsed().as_secs_f64();
        match &r {
            Ok(cells) => {
                let line: Vec<String> = cells.iter().map(|c| format!("{}={:.3}", human(c.size).replace(' ', ""), c.busbw / 1e9)).collect();
                println!("  OpenMPI {name:<18} busbw GB/s: {}  [{took:.1} s]", line.join(" "));
            }
            Err(e) => println!("  OpenMPI {name:<18}: FAILED: {e:#}"),
        }
        mpi.push((name, id, r.map_err(|e| format!("{e:#}"))));
    }
    Ok(mpi)
}

/// The cell of the median time of `cells` (one per round); `None` when there is none.
fn median_cell(cells: &[&Cell]) -> Option<Cell> {
    let first = cells.first()?;
    let time_s = median(cells.iter().map(|c| c.time_s))?;
    Some(Cell {
        size: first.size,
        steps: cells.iter().map(|c| c.steps).sum(),
        time_s,
        busbw: busbw(first.size, WORLD, time_s),
        time_min_rank_s: median(cells.iter().map(|c| c.time_min_rank_s)).unwrap_or(f64::NAN),
    })
}

/// Why a merged cell has no value: the first round's error (or "not measured" when no round ran it).
fn first_error<T>(results: &[&std::result::Result<T, String>]) -> String {
    results.iter().find_map(|r| r.as_ref().err().cloned()).unwrap_or_else(|| "not measured".into())
}

/// ringside's cells over all rounds: per (algorithm, size) the median over the rounds that measured it.
fn merge_ringside(rounds: &[Round]) -> AlgCells {
    ALGORITHMS
        .iter()
        .map(|&alg| {
            let sizes: Vec<u64> = rounds.first().and_then(|r| r.ringside.iter().find(|(a, _)| *a == alg)).map(|(_, c)| c.iter().map(|(s, _)| *s).collect()).unwrap_or_default();
            let cells = sizes
                .into_iter()
                .map(|size| {
                    let all: Vec<&std::result::Result<Cell, String>> = rounds
                        .iter()
                        .filter_map(|r| r.ringside.iter().find(|(a, _)| *a == alg)?.1.iter().find(|(s, _)| *s == size).map(|(_, c)| c))
                        .collect();
                    let ok: Vec<&Cell> = all.iter().filter_map(|c| c.as_ref().ok()).collect();
                    let merged = median_cell(&ok).ok_or_else(|| first_error(&all));
                    (size, merged)
                })
                .collect();
            (alg, cells)
        })
        .collect()
}

/// OpenMPI over all rounds: per (algorithm, size) the median over the rounds whose run succeeded.
fn merge_mpi(rounds: &[Round]) -> Vec<MpiRun<'static>> {
    let Some(first) = rounds.first() else { return Vec::new() };
    first
        .mpi
        .iter()
        .map(|&(name, id, _)| {
            let runs: Vec<&std::result::Result<Vec<Cell>, String>> =
                rounds.iter().filter_map(|r| r.mpi.iter().find(|(n, _, _)| *n == name).map(|(_, _, c)| c)).collect();
            let ok: Vec<&Vec<Cell>> = runs.iter().filter_map(|r| r.as_ref().ok()).collect();
            let merged = match ok.first() {
                None => Err(first_error(&runs)),
                Some(cells) => Ok(cells
                    .iter()
                    .filter_map(|c| {
                        let same: Vec<&Cell> = ok.iter().filter_map(|cs| cs.iter().find(|x| x.size == c.size)).collect();
                        median_cell(&same)
                    })
                    .collect()),
            };
            (name, id, merged)
        })
        .collect()
}

fn alg_cells_json(cells: &AlgCells) -> Value {
    Value::Object(
        cells
            .iter()
            .map(|(alg, cells)| {
                let rows: Vec<Value> = cells
                    .iter()
                    .map(|(size, c)| match c {
                        Ok(c) => c.json(),
                        Err(e) => json!({ "size": size, "error": e }),
                    })
                    .collect();
                (alg.to_string(), Value::Array(rows))
            })
            .collect(),
    )
}

fn mpi_json(mpi: &[MpiRun]) -> Value {
    Value::Object(
        mpi.iter()
            .map(|(name, id, r)| {
                let v = match r {
                    Ok(cells) => json!({ "coll_tuned_allreduce_algorithm": id, "cells": cells.iter().map(Cell::json).collect::<Vec<_>>() }),
                    Err(e) => json!({ "coll_tuned_allreduce_algorithm": id, "error": e }),
                };
                (name.to_string(), v)
            })
            .collect(),
    )
}

/// ringside's fastest algorithm at a size (the engine's counterpart of "OpenMPI best").
fn ringside_best(cells: &AlgCells, size: u64) -> Option<(f64, &'static str)> {
    cells
        .iter()
        .filter_map(|(a, cs)| cs.iter().find(|(s, _)| *s == size)?.1.as_ref().ok().map(|c| (c.busbw, *a)))
        .max_by(|a, b| a.0.total_cmp(&b.0))
}

/// OpenMPI's fastest algorithm at a size.
fn mpi_best(mpi: &[MpiRun<'static>], size: u64) -> Option<(f64, &'static str)> {
    mpi.iter()
        .filter_map(|(n, _, r)| r.as_ref().ok()?.iter().find(|c| c.size == size).map(|c| (c.busbw, *n)))
        .max_by(|a, b| a.0.total_cmp(&b.0))
}

/// One algorithm of ringside at a size.
fn ringside_at(cells: &AlgCells, alg: &str, size: u64) -> Option<f64> {
    cells.iter().find(|(a, _)| *a == alg)?.1.iter().find(|(s, _)| *s == size)?.1.as_ref().ok().map(|c| c.busbw)
}

/// Per round, a ratio of ringside (its best, or one algorithm) to OpenMPI's best in the same round;
/// with the median over the rounds that have both.
struct Ratios {
    per_round: Vec<Option<(f64, &'static str, &'static str)>>,
    median: Option<f64>,
}

fn ratios(rounds: &[Round], size: u64, alg: Option<&'static str>) -> Ratios {
    let per_round: Vec<Option<(f64, &'static str, &'static str)>> = rounds
        .iter()
        .map(|r| {
            let (ours, a) = match alg {
                Some(a) => (ringside_at(&r.ringside, a, size)?, a),
                None => ringside_best(&r.ringside, size)?,
            };
            let (theirs, n) = mpi_best(&r.mpi, size)?;
            Some((ours / theirs, a, n))
        })
        .collect();
    let median = median(per_round.iter().flatten().map(|x| x.0));
    Ratios { per_round, median }
}

pub fn run(mut o: Opts) -> Result<()> {
    if o.quick {
        if o.sizes.is_empty() {
            o.sizes = [64u64 << 10, 256 << 10, 1 << 20].map(ByteSize).to_vec();
        }
        o.no_extras = true;
        o.no_codecs = true;
    }
    testbed::require_root().context("bench collectives runs network namespaces")?;
    let stop = testbed::signals::stop_flag();
    let started = Instant::now();
    let root = workspace_root();
    let bench_dir = root.join("target/bench");
    std::fs::create_dir_all(&bench_dir)?;

    let rank_bin = match &o.rank_bin {
        Some(bin) => {
            println!("bench collectives: ringside-rank from --rank-bin {}", bin.display());
            std::fs::canonicalize(bin).with_context(|| format!("--rank-bin {}", bin.display()))?
        }
        None => {
            println!("bench collectives: building ringside-rank (release)");
            sh(cargo().args(["build", "--release", "-p", "ipu-firmware", "--bin", "ringside-rank"]))?;
            build::bin_path("ringside-rank", true)
        }
    };

    // The OpenMPI program, compiled now so that a missing toolchain is reported, not hidden.
    let mpi_ready: std::result::Result<PathBuf, String> = if o.no_openmpi {
        Err("skipped (--no-openmpi)".into())
    } else {
        testbed::mpi::compile("mpi_allreduce", include_str!("../bench/mpi_allreduce.c")).map_err(|e| e.to_string())
    };
    if let Err(e) = &mpi_ready {
        println!("OpenMPI baseline unavailable: {e}");
    }

    let machine = machine_info();
    let size_list = if o.sizes.is_empty() {
        sizes(o.max_mib)
    } else {
        let mut v: Vec<u64> = o.sizes.iter().map(|s| s.0).collect();
        v.sort_unstable();
        v.dedup();
        if let Some(bad) = v.iter().find(|&&s| s < 4 || s % 4 != 0) {
            bail!("--sizes: {bad} bytes is not a whole number of f32 elements; use a multiple of 4 bytes");
        }
        v
    };
    let mut report = json!({
        "command": "cargo xtask bench collectives",
        "options": format!("{o:?}"),
        "machine": machine,
        "world": WORLD,
        "definition": "busbw = size / time * 2(n-1)/n (nccl-tests); time = median over measured steps of the slowest rank's allreduce time; GB/s = 1e9 B/s",
    });

    // ---- everything that needs the star ------------------------------------------------------
    let n_rounds = o.rounds.unwrap_or(if o.quick { 1 } else { 3 });
    if n_rounds == 0 {
        bail!("--rounds 0: at least one round is needed");
    }
    let (iperf, rounds, extras) = {
        println!("bench collectives: bringing up a {WORLD}-host star");
        let star = Star::new(StarConfig { hosts: WORLD, ..Default::default() })?;
        let result = (|| -> Result<_> {
            let iperf = run_iperf(&star, stop);
            check_stop(stop)?;
            if let Err(e) = &iperf {
                println!("iperf3 failed: {e:#}");
            }
            let mut port = 29600u16;
            let mut rounds = Vec::new();
            let mut extras = Vec::new();
            for round in 0..n_rounds {
                // Odd rounds run OpenMPI first: a drift of the machine's speed during a round then
                // favours each side equally often.
                let mpi_first = round % 2 == 1;
                println!(
                    "bench collectives: round {} of {n_rounds} ({} first)",
                    round + 1,
                    if mpi_first { "OpenMPI" } else { "ringside" }
                );
                let mut mpi = Vec::new();
                if mpi_first {
                    mpi = mpi_round(&star, &bench_dir, &mpi_ready, &o, &size_list, stop)?;
                }
                let ringside = ringside_round(&star, &rank_bin, &o, &size_list, &mut port, stop)?;
                if round == 0 && !o.no_extras && size_list.contains(&(16 << 20)) {
                    extras = extras_16mib(&star, &rank_bin, &o, &mut port, stop)?;
                }
                if !mpi_first {
                    mpi = mpi_round(&star, &bench_dir, &mpi_ready, &o, &size_list, stop)?;
                }
                rounds.push(Round { ringside, mpi });
            }
            Ok((iperf, rounds, extras))
        })();
        // Whatever happened, no process of ours may outlive the star in its namespaces.
        kill_namespace_processes(&star);
        drop(star);
        result?
    };
    check_stop(stop)?;

    // ---- codecs (CPU only, after the star is gone) --------------------------------------------
    let codecs: std::result::Result<(Vec<Value>, String), String> =
        if o.no_codecs { Err("skipped (--no-codecs)".into()) } else { run_codecs() };
    if let Err(e) = &codecs {
        println!("codec throughput bench: {e}");
    }

    // ---- report -------------------------------------------------------------------------------
    let iperf_json = match &iperf {
        Ok(v) => v.clone(),
        Err(e) => json!({ "error": format!("{e:#}") }),
    };
    report["iperf3"] = iperf_json;
    // The tables show per cell the median over rounds; the verdicts use the median over rounds of
    // the ratio measured within each round (side by side, minutes apart).
    let ringside = merge_ringside(&rounds);
    let mpi = merge_mpi(&rounds);
    report["rounds"] = Value::Array(
        rounds
            .iter()
            .enumerate()
            .map(|(i, r)| {
                json!({
                    "round": i + 1,
                    "first": if i % 2 == 1 { "openmpi" } else { "ringside" },
                    "ringside": alg_cells_json(&r.ringside),
                    "openmpi": mpi_json(&r.mpi),
                })
            })
            .collect(),
    );
    report["ringside"] = alg_cells_json(&ringside);
    report["ringside_16mib_variants"] = Value::Array(
        extras
            .iter()
            .map(|(name, args, comp, c)| {
                let mut v = match c {
                    Ok(c) => c.json(),
                    Err(e) => json!({ "error": e }),
                };
                v["variant"] = json!(name);
                v["rank_args"] = json!(args);
                v["compression"] = json!(comp.unwrap_or("none"));
                v
            })
            .collect(),
    );
    report["openmpi"] = match &mpi_ready {
        Err(e) => json!({ "error": e }),
        Ok(_) => mpi_json(&mpi),
    };
    report["codecs"] = match &codecs {
        Ok((rows, _)) => json!({ "rows": rows, "target_gbs_per_core": 2.0 }),
        Err(e) => json!({ "error": e }),
    };

    // Table rows.
    let ring_at = |alg: &str, size: u64| ringside_at(&ringside, alg, size);
    let mpi_at = |name: &str, size: u64| -> Option<f64> {
        mpi.iter().find(|(n, _, _)| *n == name)?.2.as_ref().ok()?.iter().find(|c| c.size == size).map(|c| c.busbw)
    };
    let iperf_gbs: Option<(f64, f64)> = iperf.as_ref().ok().and_then(|v| {
        Some((v["single_stream_gbit_s"].as_f64()? / 8.0, v["four_streams_gbit_s"].as_f64().unwrap_or(f64::NAN) / 8.0))
    });
    let fmt = |x: Option<f64>| x.map(|v| format!("{:.3}", v / 1e9)).unwrap_or_else(|| "—".into());
    let n_done = rounds.len();
    let per_round = if n_done > 1 { format!(", median of {n_done} rounds") } else { String::new() };
    let mut table = String::new();
    table.push_str(&format!(
        "| size | ringside ring | ringside tree | ringside rhd | OpenMPI default | OpenMPI best (algorithm) | ring / OpenMPI best{per_round} | ringside best / OpenMPI best{per_round} |\n"
    ));
    table.push_str("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    // Per size and round: ringside's best / OpenMPI's best in that round (the verdict's basis).
    let mut round_table = format!("| size |{} median |\n|---:|{}---:|\n", (1..=n_done).map(|i| format!(" round {i} |")).collect::<String>(), "---:|".repeat(n_done));
    let mut rows_json = Vec::new();
    let mut best_ratios = Vec::new();
    for &size in &size_list {
        let best = mpi_best(&mpi, size);
        let ring = ring_at("ring", size);
        let ours = ringside_best(&ringside, size);
        let ring_r = ratios(&rounds, size, Some("ring"));
        let best_r = ratios(&rounds, size, None);
        let fmt_ratio = |r: Option<f64>| r.map(|r| format!("{r:.2}")).unwrap_or_else(|| "—".into());
        table.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            human(size),
            fmt(ring),
            fmt(ring_at("tree", size)),
            fmt(ring_at("rhd", size)),
            fmt(mpi_at("default", size)),
            best.map(|(b, n)| format!("{:.3} ({n})", b / 1e9)).unwrap_or_else(|| "—".into()),
            fmt_ratio(ring_r.median),
            match (best_r.median, ours) {
                (Some(m), Some((_, a))) if n_done == 1 => format!("{m:.2} ({a})"),
                (m, _) => fmt_ratio(m),
            }
        ));
        round_table.push_str(&format!("| {} |", human(size)));
        for r in &best_r.per_round {
            match r {
                Some((x, a, n)) => round_table.push_str(&format!(" {x:.2} ({a} / {n}) |")),
                None => round_table.push_str(" — |"),
            }
        }
        round_table.push_str(&format!(" **{}** |\n", fmt_ratio(best_r.median)));
        let round_json = |r: &Ratios| -> Vec<Value> {
            r.per_round.iter().map(|x| x.map_or(Value::Null, |(v, a, n)| json!({ "ratio": v, "ringside": a, "openmpi": n }))).collect()
        };
        rows_json.push(json!({
            "size": size,
            "ring_gbs": ring.map(|x| x / 1e9),
            "tree_gbs": ring_at("tree", size).map(|x| x / 1e9),
            "rhd_gbs": ring_at("rhd", size).map(|x| x / 1e9),
            "openmpi_default_gbs": mpi_at("default", size).map(|x| x / 1e9),
            "openmpi_best_gbs": best.map(|b| b.0 / 1e9),
            "openmpi_best_algorithm": best.map(|b| b.1),
            "ringside_best_gbs": ours.map(|o| o.0 / 1e9),
            "ringside_best_algorithm": ours.map(|o| o.1),
            "ring_over_openmpi_best_per_round": round_json(&ring_r),
            "ring_over_openmpi_best_median": ring_r.median,
            "best_over_openmpi_best_per_round": round_json(&best_r),
            "best_over_openmpi_best_median": best_r.median,
        }));
        best_ratios.push((size, best_r, ring_r));
    }
    // Issue 12's target: ringside's best algorithm >= OpenMPI's best at every size from 64 KiB to
    // 64 MiB, judged on the median over rounds of the ratio within each round.
    let basis = if n_done > 1 { format!(", median over {n_done} rounds of the ratio within each round") } else { String::new() };
    let small = {
        let in_range: Vec<&(u64, Ratios, Ratios)> = best_ratios.iter().filter(|(s, _, _)| (64 << 10..=64 << 20).contains(s)).collect();
        let mut misses = Vec::new();
        let mut measured = 0;
        for (size, r, _) in &in_range {
            if let Some(m) = r.median {
                measured += 1;
                if m < 1.0 {
                    let each: Vec<String> = r.per_round.iter().flatten().map(|(x, a, n)| format!("{x:.2} {a}/{n}")).collect();
                    misses.push(format!("{} {m:.2}x ({})", human(*size), each.join(", ")));
                }
            }
        }
        let met = (measured > 0).then_some(misses.is_empty() && measured == in_range.len());
        report["target_best_64k_64m"] =
            json!({ "sizes_in_range": in_range.len(), "measured": measured, "rounds": n_done, "met": met, "misses": misses });
        let what = format!("Target (ringside's best ≥ OpenMPI's best at every size from 64 KiB to 64 MiB{basis})");
        match met {
            None => format!("{what}: UNDETERMINED — no size in range has both results."),
            Some(true) => format!("{what}: MET at all {measured} measured sizes."),
            Some(false) => format!(
                "{what}: NOT MET — {} of {} sizes measured{}{}.",
                measured,
                in_range.len(),
                if misses.is_empty() { "" } else { "; below: " },
                misses.join(", ")
            ),
        }
    };
    let iperf_line = match (&iperf, iperf_gbs) {
        (Ok(_), Some((one, four))) => format!(
            "iperf3 point-to-point h0→h1 on the same star: {:.2} Gbit/s = {:.3} GB/s (1 stream), {:.2} Gbit/s = {:.3} GB/s (4 streams)",
            one * 8.0,
            one,
            four * 8.0,
            four
        ),
        (Err(e), _) => format!("iperf3: FAILED: {e:#}"),
        _ => "iperf3: no result".into(),
    };
    report["table"] = Value::Array(rows_json);

    // The target: ring at 16 MiB >= OpenMPI's best at 16 MiB (median over rounds of the ratio within each).
    let target_size = 16u64 << 20;
    let ring16 = best_ratios.iter().find(|(s, _, _)| *s == target_size).and_then(|(_, _, r)| r.median);
    let target = match (ring16, ring_at("ring", target_size), mpi_best(&mpi, target_size)) {
        (Some(m), Some(r), Some((b, n))) => {
            let met = m >= 1.0;
            report["target_ring_16mib"] =
                json!({ "ratio_median": m, "rounds": n_done, "ring_gbs": r / 1e9, "openmpi_best_gbs": b / 1e9, "openmpi_best_algorithm": n, "met": met });
            format!(
                "Target (ringside ring at 16 MiB ≥ OpenMPI's best at 16 MiB{basis}): {} — {:.0}%; ring {:.3} GB/s vs OpenMPI {n} {:.3} GB/s (medians).",
                if met { "MET" } else { "NOT MET" },
                100.0 * m,
                r / 1e9,
                b / 1e9,
            )
        }
        (_, r, _) => {
            let why = if r.is_none() { "the ringside ring 16 MiB cell has no result" } else { "OpenMPI has no 16 MiB result" };
            report["target_ring_16mib"] = json!({ "met": Value::Null, "why": why });
            format!("Target (ringside ring at 16 MiB ≥ OpenMPI's best): UNDETERMINED — {why}.")
        }
    };
    let codec_target = match &codecs {
        Ok((rows, _)) => {
            let below: Vec<String> = rows
                .iter()
                .filter(|r| r["codec"].as_str() != Some("none"))
                .filter(|r| r["enc_dec_gbs"].as_f64().unwrap_or(0.0) < 2.0)
                .map(|r| format!("{} {:.2}", r["codec"].as_str().unwrap_or("?"), r["enc_dec_gbs"].as_f64().unwrap_or(0.0)))
                .collect();
            let met = below.is_empty() && !rows.is_empty();
            report["target_codecs"] = json!({ "met": met, "below_2_gbs": below });
            if met {
                "Target (every compression codec ≥ 2 GB/s per core, encode+decode): MET.".to_string()
            } else {
                format!("Target (every compression codec ≥ 2 GB/s per core, encode+decode): NOT MET — below: {}.", below.join(", "))
            }
        }
        Err(e) => {
            report["target_codecs"] = json!({ "met": Value::Null, "why": e });
            format!("Target (codecs ≥ 2 GB/s per core): UNDETERMINED — {e}.")
        }
    };
    report["elapsed_s"] = json!(started.elapsed().as_secs_f64());
    report["machine"]["loadavg_at_end"] = json!(loadavg());
    // With --rank-bin the commit above is the harness's, not necessarily the measured engine's.
    report["rank_bin"] = json!(rank_bin.display().to_string());

    println!();
    println!("allreduce bus bandwidth, {WORLD} ranks on the star testbed, GB/s (busbw as nccl-tests defines it):");
    println!("{iperf_line}");
    print!("{table}");
    if n_done > 1 {
        println!("ringside best / OpenMPI best per round:");
        print!("{round_table}");
    }
    println!("{target}");
    println!("{small}");
    println!("{codec_target}");
    if let Ok((_, text)) = &codecs {
        println!("{text}");
    }

    let md_path = root.join("docs/benchmarks-collectives.md");
    let targets = format!("{target}**\n\n**{small}");
    let round_table = (n_done > 1).then_some(round_table.as_str());
    // Every failure of every round, so that a median over fewer rounds does not hide one.
    let mut failed = Vec::new();
    for (i, r) in rounds.iter().enumerate() {
        for (n, _, res) in &r.mpi {
            if let Err(e) = res {
                failed.push(format!("- round {}: OpenMPI {n}: {e}", i + 1));
            }
        }
        for (alg, cells) in &r.ringside {
            for (size, c) in cells {
                if let Err(e) = c {
                    failed.push(format!("- round {}: ringside {alg} {}: {e}", i + 1, human(*size)));
                }
            }
        }
    }
    report["failures"] = json!(failed);
    let json_path = bench_dir.join("collectives.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&report)? + "\n")?;
    let md = markdown(&o, &report, &report["machine"], &iperf_line, &table, round_table, &failed, &extras, &mpi_ready.as_ref().map(|_| ()).map_err(String::clone), &mpi, &codecs, &targets, &codec_target);
    std::fs::write(&md_path, md)?;
    println!("wrote {} and {} in {:.0} s", json_path.display(), md_path.display(), started.elapsed().as_secs_f64());
    Ok(())
}

// ---- ringside ------------------------------------------------------------------------------------

#[allow(clippy::too_many_arguments)]
fn ringside_cell(
    star: &Star,
    rank_bin: &Path,
    o: &Opts,
    alg: &str,
    size: u64,
    extra: &[&str],
    compression: Option<&str>,
    port: u16,
    stop: &AtomicBool,
) -> Result<Cell> {
    let (n, warm) = steps_for(o, size);
    // The ranks regenerate their gradients before every step (the "backward pass"); a compute
    // phase a little longer than that fill makes every rank enter the allreduce at about the same
    // time, so a rank's allreduce time is not inflated by waiting for a slower filler.
    let compute_ms = fill_ms(size);
    let cfg = JobConfig {
        ranks: WORLD,
        size: ByteSize(size),
        steps: n + warm,
        compute_ms,
        algorithm: Some(alg.to_string()),
        compression: compression.map(str::to_string),
        rank_bin: Some(rank_bin.to_path_buf()),
        port,
        timeout: Duration::from_secs(120),
        out_dir: Some(workspace_root().join(format!("target/bench/collectives-jobs/{alg}-{size}-{port}"))),
        // An untimed barrier before every timed allreduce, as OpenMPI's baseline has.
        extra_args: std::iter::once("--barrier").chain(extra.iter().copied()).map(str::to_string).collect(),
        ..Default::default()
    };
    let report = testbed::run_job(star, &cfg, Some(stop))?;
    // Per-step comm times of every rank (the summary only has distributions).
    let mut per_rank: Vec<Vec<f64>> = Vec::new();
    for r in &report.ranks {
        let text = std::fs::read_to_string(&r.out)?;
        let v: Value = serde_json::from_str(&text)?;
        let (_, comm) = testbed::job::step_times(&v);
        if let Some(e) = &r.error {
            bail!("rank {} reported: {e}", r.rank);
        }
        per_rank.push(comm);
    }
    let steps = per_rank.iter().map(Vec::len).min().unwrap_or(0);
    if steps <= warm as usize {
        bail!("only {steps} steps recorded (expected {})", n + warm);
    }
    let slowest: Vec<f64> = (warm as usize..steps).map(|s| per_rank.iter().map(|r| r[s]).fold(0.0, f64::max)).collect();
    let fastest: Vec<f64> =
        (warm as usize..steps).map(|s| per_rank.iter().map(|r| r[s]).fold(f64::INFINITY, f64::min)).collect();
    let time_s = median(&slowest).unwrap_or(f64::NAN) / 1e3;
    let time_min_rank_s = median(&fastest).unwrap_or(f64::NAN) / 1e3;
    Ok(Cell { size, steps: steps - warm as usize, time_s, busbw: busbw(size, WORLD, time_s), time_min_rank_s })
}

/// Compute phase (ms) that covers a rank's gradient fill of `size` bytes with margin, on a busy
/// 2-core machine (measured with 4 ranks on 2 busy cores: about 13 ms at 16 MiB, up to 30).
fn fill_ms(size: u64) -> u64 {
    1 + (size >> 20) * 3 / 2
}

// ---- iperf3 --------------------------------------------------------------------------------------

/// Kills the child (and reaps it) when dropped.
struct ChildGuard(Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn run_iperf(star: &Star, stop: &AtomicBool) -> Result<Value> {
    let server_addr = star.hosts[1].addr.to_string();
    let port = "5301";
    let mut srv = star.hosts[1].ns.command("iperf3");
    srv.args(["-s", "-B", &server_addr, "-p", port]).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    let _server = ChildGuard(Some(srv.spawn().context("starting iperf3 -s in h1")?));
    let mut out = json!({ "server": format!("h1 {server_addr}"), "client": "h0", "seconds": 4 });
    for (key, streams) in [("single_stream_gbit_s", 1), ("four_streams_gbit_s", 4)] {
        let mut last_err = String::new();
        let mut got = None;
        for _attempt in 0..20 {
            check_stop(stop)?;
            let mut c = star.hosts[0].ns.command("timeout");
            c.args(["20", "iperf3", "-c", &server_addr, "-p", port, "-t", "4", "-P", &streams.to_string(), "-J"]);
            let o = c.output().context("starting iperf3 -c in h0")?;
            let text = String::from_utf8_lossy(&o.stdout);
            match serde_json::from_str::<Value>(&text) {
                Ok(v) if v.get("error").is_none() && o.status.success() => {
                    got = Some(v);
                    break;
                }
                Ok(v) => last_err = format!("{}", v.get("error").cloned().unwrap_or(json!(o.status.to_string()))),
                Err(_) => last_err = format!("{} {}", o.status, String::from_utf8_lossy(&o.stderr).trim()),
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        let v = got.with_context(|| format!("iperf3 -P {streams}: {last_err}"))?;
        let bps = v["end"]["sum_received"]["bits_per_second"].as_f64().context("iperf3 JSON without end.sum_received")?;
        let retrans = v["end"]["sum_sent"]["retransmits"].as_u64();
        println!("  iperf3 h0→h1 {streams} stream(s): {:.2} Gbit/s ({} retransmits)", bps / 1e9, retrans.map_or("?".into(), |r| r.to_string()));
        out[key] = json!(bps / 1e9);
        out[format!("{key}_retransmits")] = json!(retrans);
    }
    Ok(out)
}

// ---- OpenMPI -------------------------------------------------------------------------------------

fn run_mpi(star: &Star, dir: &Path, bin: &Path, o: &Opts, sizes: &[u64], algorithm: u32, stop: &AtomicBool) -> Result<Vec<Cell>> {
    let algorithm = testbed::MpiAlgorithm::ALL.into_iter().find(|a| a.id() == algorithm).context("unknown OpenMPI algorithm id")?;
    let launch = testbed::MpiLaunch {
        hosts: (0..WORLD).collect(),
        algorithm,
        port_min: 30000,
        timeout: Duration::from_secs(180),
        dir: dir.to_path_buf(),
        // Extra mpirun parameters for experiments, e.g. RINGSIDE_BENCH_MPI_EXTRA="mpi_yield_when_idle=0".
        mca: std::env::var("RINGSIDE_BENCH_MPI_EXTRA")
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
            .collect(),
    };
    let mut args = Vec::new();
    // OpenMPI's own choice gets the full budget; the six forced algorithms half of it each (they
    // only compete for "best"), which keeps the whole bench near 10 minutes on 2 cores.
    let budget = if algorithm == testbed::MpiAlgorithm::Default { o.budget_mib } else { (o.budget_mib / 2).max(1) };
    for &s in sizes {
        let (n, warm) = steps_for_budget(o, budget, s);
        args.push(format!("{s}:{n}:{warm}"));
    }
    let mut cmd = launch.command(star, bin, &args)?;
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = ChildGuard(Some(cmd.spawn().context("starting mpirun in h0's namespace")?));
    let c = child.0.as_mut().expect("just spawned");
    // Drain both pipes on threads so a chatty mpirun cannot block.
    let mut so = c.stdout.take().expect("piped");
    let mut se = c.stderr.take().expect("piped");
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(st) = c.try_wait()? {
            break st;
        }
        if stop.load(Ordering::SeqCst) {
            let _ = c.kill();
            kill_namespace_processes(star);
            bail!("interrupted");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    child.0 = None;
    let stdout = out_t.join().unwrap_or_default();
    let stderr = err_t.join().unwrap_or_default();
    kill_namespace_processes(star); // stray orteds, if mpirun died abnormally
    let mut cells = Vec::new();
    for line in stdout.lines().filter(|l| l.starts_with('{')) {
        let v: Value = serde_json::from_str(line).with_context(|| format!("bad line from mpi_allreduce: {line}"))?;
        let size = v["size"].as_u64().context("size")?;
        let t = v["median_us"].as_f64().context("median_us")? / 1e6;
        if v["correct"].as_bool() != Some(true) {
            bail!("MPI_Allreduce result wrong at size {size}");
        }
        cells.push(Cell {
            size,
            steps: v["iters"].as_u64().unwrap_or(0) as usize,
            time_s: t,
            busbw: busbw(size, WORLD, t),
            time_min_rank_s: f64::NAN,
        });
    }
    if !status.success() || cells.len() != sizes.len() {
        let tail: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).rev().take(12).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!(
            "mpirun exited {status} with {} of {} sizes{}; stderr: {}",
            cells.len(),
            sizes.len(),
            if status.code() == Some(124) { " (timed out)" } else { "" },
            tail.join(" | ")
        );
    }
    Ok(cells)
}

/// Kills every process still running in the star's host namespaces (only processes this bench
/// started live there: the rigs are private to this process).
fn kill_namespace_processes(star: &Star) {
    for h in &star.hosts {
        let Ok(pids) = output(Command::new("ip").args(["netns", "pids", h.ns.name()])) else { continue };
        for pid in pids.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
            if pid as u32 != std::process::id() {
                // SAFETY: kill(2) with a pid read from the kernel's list for our own namespace.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

// ---- codecs --------------------------------------------------------------------------------------

/// Runs ipu-firmware's codec bench (`ringside-collective-bench codecs`) and parses its table.
fn run_codecs() -> std::result::Result<(Vec<Value>, String), String> {
    let root = workspace_root();
    let src = root.join("ipu-firmware/src/bin/ringside-collective-bench.rs");
    if !src.exists() {
        return Err("ipu-firmware has no codec throughput bench yet (ipu-firmware/src/bin/ringside-collective-bench.rs missing)".into());
    }
    let b = cargo()
        .args(["build", "--release", "--quiet", "-p", "ipu-firmware", "--bin", "ringside-collective-bench"])
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !b.status.success() {
        return Err(format!("building ringside-collective-bench failed: {}", String::from_utf8_lossy(&b.stderr).trim()));
    }
    let bin = build::bin_path("ringside-collective-bench", true);
    let text = output(Command::new("timeout").arg("120").arg(&bin).arg("codecs")).map_err(|e| format!("{e:#}"))?;
    // Rows: codec encode decode enc+dec ratio (GB/s of f32 input).
    let mut rows = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() == 5 {
            if let (Ok(e), Ok(d), Ok(ed), Ok(r)) = (f[1].parse::<f64>(), f[2].parse::<f64>(), f[3].parse::<f64>(), f[4].parse::<f64>()) {
                rows.push(json!({ "codec": f[0], "encode_gbs": e, "decode_gbs": d, "enc_dec_gbs": ed, "wire_ratio": r }));
            }
        }
    }
    if rows.is_empty() {
        return Err(format!("could not parse the codec bench output:\n{text}"));
    }
    Ok((rows, text))
}

// ---- machine and markdown ------------------------------------------------------------------------

fn machine_info() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split(':').nth(1)).map(|s| s.trim().to_string()));
    let sh1 = |p: &str, a: &[&str]| output(Command::new(p).args(a)).map(|s| s.trim().to_string()).ok();
    json!({
        "nproc": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "kernel": sh1("uname", &["-r"]),
        "cpu": cpu,
        "openmpi": sh1("mpirun", &["--version"]).and_then(|s| s.lines().next().map(str::to_string)),
        "iperf3": sh1("iperf3", &["--version"]).and_then(|s| s.lines().next().map(str::to_string)),
        "git_commit": output(Command::new("git").arg("-C").arg(workspace_root()).args(["rev-parse", "--short", "HEAD"])).ok().map(|s| s.trim().to_string()),
        "date_utc": sh1("date", &["-u", "+%Y-%m-%d %H:%M"]),
        "loadavg_at_start": loadavg(),
    })
}

/// The 1/5/15-minute load averages (other work on the machine is noise in every number here).
fn loadavg() -> Option<String> {
    std::fs::read_to_string("/proc/loadavg").ok().map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}

#[allow(clippy::too_many_arguments)]
fn markdown(
    o: &Opts,
    report: &Value,
    machine: &Value,
    iperf_line: &str,
    table: &str,
    round_table: Option<&str>,
    failed: &[String],
    extras: &[Extra],
    mpi_ready: &std::result::Result<(), String>,
    mpi: &[MpiRun],
    codecs: &std::result::Result<(Vec<Value>, String), String>,
    target: &str,
    codec_target: &str,
) -> String {
    let s = |k: &str| machine[k].as_str().unwrap_or("?").to_string();
    let mut m = String::new();
    m.push_str("# Collectives: allreduce bus bandwidth\n\n");
    m.push_str("Generated by `cargo xtask bench collectives` (this file is overwritten by every run; the raw numbers are in\n`target/bench/collectives.json`).\n\n");
    m.push_str(&format!(
        "Machine: {} cores ({}), kernel {}, {}, {}; commit {}, {} UTC; load average {} at the start, {} at the end\n\
         (the machine is shared: other work shows up as noise). Run took {:.0} s. Options: `{:?}`.\n\n",
        machine["nproc"],
        s("cpu"),
        s("kernel"),
        s("openmpi"),
        s("iperf3"),
        s("git_commit"),
        s("date_utc"),
        s("loadavg_at_start"),
        s("loadavg_at_end"),
        report["elapsed_s"].as_f64().unwrap_or(f64::NAN),
        o
    ));
    m.push_str("## Method\n\n");
    m.push_str(&format!(
        "- Rig: the testbed's {WORLD}-host star (namespaces h0..h3, 10.77.0.1-4, veth pairs into one bridge; RPS and a raised\n  \
         `netdev_max_backlog` as the testbed sets them). All {WORLD} ranks and the bridge share the machine's cores.\n\
         - busbw as nccl-tests defines it: `busbw = size / time · 2(n−1)/n` with n = {WORLD}; GB/s = 10^9 B/s. `time` is the\n  \
         median over measured steps of the slowest rank's allreduce time in that step (warm-up steps discarded).\n\
         - ringside: `ringside-rank` (release) per host via `testbed::run_job`, f32 buffers, chunk 1 MiB and 1 channel unless\n  \
         stated (the engine cuts an uncompressed collective below 8 MiB into chunks of an eighth of it, at least 32 KiB: `engine::chunk_elems`); steps per size = clamp({} MiB / size, {}, {}) plus 10% (min 2) warm-up (OpenMPI's forced algorithms: half the budget). Every step the ranks regenerate\n  \
         their gradients; the compute phase is set just long enough to cover that fill ({} ms at 16 MiB); then an untimed\n  \
         barrier (`ringside-rank --barrier`: an allreduce of one float per rank), as OpenMPI's baseline has `MPI_Barrier`, so\n  \
         that a rank's time is its allreduce and not its wait for a rank whose compute phase ended later.\n\
         - OpenMPI: `xtask/bench/mpi_allreduce.c` (compiled with `mpicc -O2`), `MPI_Allreduce(MPI_FLOAT, MPI_SUM)` out of place,\n  \
         the same sizes and iteration counts, `MPI_Barrier` before every timed call, per-iteration time = max over ranks.\n  \
         `mpirun` runs in h0's namespace with a launch agent (`plm_rsh_agent`) that starts each remote `orted` with\n  \
         `nsenter --net=/run/netns/<host's netns>`; `--mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24\n  \
         --mca oob_tcp_if_include 10.77.0.0/24 --mca pml ob1 --mca mpi_yield_when_idle 1` (each namespace is a 1-slot \"node\",\n  \
         so OpenMPI would otherwise busy-poll: four spinning ranks on two cores run an order of magnitude slower; set\n  \
         `RINGSIDE_BENCH_MPI_EXTRA=\"--mca mpi_yield_when_idle 0\"` to see it). \"default\" is OpenMPI's own decision; the others are forced\n  \
         with `coll_tuned_use_dynamic_rules 1 coll_tuned_allreduce_algorithm N`; \"best\" is the fastest of all of them at that size.\n\
         - Rounds: {} (`--rounds`). A round measures every ringside cell and every OpenMPI algorithm at every size; odd\n  \
         rounds run ringside first, even rounds OpenMPI first. The tables give each cell's median over the rounds; the\n  \
         ratios and the targets use, per size, the median over rounds of the ratio measured within one round (ringside's\n  \
         best of its three algorithms / OpenMPI's best of its seven, minutes apart), so that the shared machine's drift\n  \
         over the run (10-25 % within hours on 2026-11-29) is not what a comparison measures. The 16 MiB variants and\n  \
         the codecs are measured once.\n\
         - iperf3: server in h1, client in h0, 4 s, 1 and 4 streams: the point-to-point limit of one link of this rig.\n\n",
        o.budget_mib,
        o.min_steps,
        o.max_steps,
        fill_ms(16 << 20),
        report["rounds"].as_array().map_or(0, Vec::len),
    ));
    m.push_str("## Results (busbw, GB/s)\n\n");
    m.push_str(&format!("{iperf_line}\n\n"));
    m.push_str(table);
    if let Some(rt) = round_table {
        m.push_str("\nringside's best / OpenMPI's best within each round (ringside algorithm / OpenMPI algorithm), and the median\nover rounds that the targets use:\n\n");
        m.push_str(rt);
    }
    m.push_str(&format!("\n**{target}**\n\n"));
    if let Err(e) = mpi_ready {
        m.push_str(&format!("OpenMPI baseline not measured: {e}\n\n"));
    }
    if !failed.is_empty() {
        m.push_str("Runs and cells that failed (a median leaves out the rounds that failed):\n\n");
        m.push_str(&failed.join("\n"));
        m.push_str("\n\n");
    }
    // Every OpenMPI algorithm per size.
    if mpi.iter().any(|(_, _, r)| r.is_ok()) {
        m.push_str("### OpenMPI by algorithm (busbw, GB/s)\n\n| size |");
        for (n, _, _) in mpi {
            m.push_str(&format!(" {n} |"));
        }
        m.push_str("\n|---:|");
        for _ in mpi {
            m.push_str("---:|");
        }
        m.push('\n');
        let sizes: Vec<u64> = report["table"].as_array().map(|a| a.iter().filter_map(|r| r["size"].as_u64()).collect()).unwrap_or_default();
        for size in sizes {
            m.push_str(&format!("| {} |", human(size)));
            for (_, _, r) in mpi {
                let v = r.as_ref().ok().and_then(|c| c.iter().find(|c| c.size == size)).map(|c| format!("{:.3}", c.busbw / 1e9));
                m.push_str(&format!(" {} |", v.unwrap_or_else(|| "—".into())));
            }
            m.push('\n');
        }
        m.push('\n');
    }
    if !extras.is_empty() {
        m.push_str("### ringside ring variants at 16 MiB\n\n| variant | time (ms) | busbw (GB/s) |\n|---|---:|---:|\n");
        for (name, _, comp, c) in extras {
            let note = if comp.is_some() { " (busbw of the f32 payload, not of the compressed wire bytes)" } else { "" };
            match c {
                Ok(c) => m.push_str(&format!("| {name}{note} | {:.2} | {:.3} |\n", c.time_s * 1e3, c.busbw / 1e9)),
                Err(e) => m.push_str(&format!("| {name} | failed: {} | — |\n", e.replace('|', "/"))),
            }
        }
        m.push('\n');
    }
    m.push_str("## Compression codecs (one core, encode + decode)\n\n");
    match codecs {
        Ok((rows, _)) => {
            m.push_str("From `ringside-collective-bench codecs` (ipu-firmware), GB/s of f32 input:\n\n| codec | encode | decode | encode+decode | wire/f32 |\n|---|---:|---:|---:|---:|\n");
            for r in rows {
                m.push_str(&format!(
                    "| {} | {:.2} | {:.2} | {:.2} | {:.3} |\n",
                    r["codec"].as_str().unwrap_or("?"),
                    r["encode_gbs"].as_f64().unwrap_or(f64::NAN),
                    r["decode_gbs"].as_f64().unwrap_or(f64::NAN),
                    r["enc_dec_gbs"].as_f64().unwrap_or(f64::NAN),
                    r["wire_ratio"].as_f64().unwrap_or(f64::NAN)
                ));
            }
            m.push('\n');
        }
        Err(e) => m.push_str(&format!("Not measured: {e}\n\n")),
    }
    m.push_str(&format!("**{codec_target}**\n\n"));
    m.push_str("## Caveats\n\n");
    m.push_str(
        "- Two shared cores run four ranks, the bridge and the kernel's TCP stack: these numbers are CPU-bound, and the\n  \
         iperf3 line is a CPU-bound veth/bridge limit, not a NIC's. Other work on the machine during the run shows up as noise.\n\
         - The per-step allreduce times of ringside are measured inside `ringside-rank` (after a compute phase and a\n  \
         barrier); OpenMPI's back to back after a barrier. Both take the slowest rank per step/iteration and the median.\n\
         - Run-to-run variation on this shared 2-core machine is large (while this bench was written, the same 16 MiB ring\n  \
         cell moved by 2-3× between runs): compare columns of one run, and repeat a run before trusting a small difference.\n",
    );
    m
}
