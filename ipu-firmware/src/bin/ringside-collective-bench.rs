//! `ringside-collective-bench`: codec throughput (GB/s, one core, encode + decode) and in-process
//! loopback allreduce bus bandwidth (nccl-tests definition: busbw = algbw · 2(n−1)/n).
//!
//! Run in release: `cargo run --release -p ipu-firmware --bin ringside-collective-bench -- all`.

use anyhow::Context;
use clap::{Parser, Subcommand};
use ipu_firmware::codec::{CodecKind, DecodeMode};
use ipu_firmware::job::{parse_size, run_mesh_ranks_in_process};
use ipu_firmware::plan::Compression;
use ipu_firmware::{
    allreduce_busbw, Algorithm, Communicator, CommunicatorConfig, MeshOptions, Plan, ScriptedPlans, TcpOptions,
    TransportKind,
};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(name = "ringside-collective-bench")]
struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand, Debug)]
enum What {
    /// Codec encode+decode throughput on one core.
    Codecs(CodecArgs),
    /// Loopback allreduce bus bandwidth per algorithm and size.
    Busbw(BusbwArgs),
    /// Both, with defaults.
    All,
}

#[derive(Parser, Debug, Clone)]
struct CodecArgs {
    /// Buffer size (f32) encoded and decoded per round.
    #[arg(long, default_value = "16MiB", value_parser = parse_size)]
    size: usize,
    /// Chunk size, as in a plan.
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    chunk_bytes: usize,
    /// Minimum measuring time per codec, ms.
    #[arg(long, default_value_t = 700)]
    min_ms: u64,
}

#[derive(Parser, Debug, Clone)]
struct BusbwArgs {
    /// Ranks (threads).
    #[arg(long, default_value_t = 4)]
    world: usize,
    #[arg(long, default_value = "1KiB", value_parser = parse_size)]
    min_size: usize,
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    max_size: usize,
    /// Size multiplier between rows.
    #[arg(long, default_value_t = 4)]
    factor: usize,
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    chunk_bytes: usize,
    #[arg(long, default_value_t = 1)]
    channels: u8,
    /// Wire compression for every run.
    #[arg(long, default_value = "none")]
    compression: CodecKind,
    /// Algorithms to run (comma-separated; default all).
    #[arg(long, value_delimiter = ',')]
    algorithms: Vec<Algorithm>,
    /// Approximate bytes reduced per (algorithm, size) cell; bounds iterations.
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    budget: usize,
    /// Transport between the rank threads: tcp, rdma (needs the `rdma` feature and a device) or
    /// auto (RDMA if a device is usable, else TCP with a warning).
    #[arg(long, value_enum, default_value_t = TransportKind::Tcp)]
    transport: TransportKind,
    /// RDMA device for --transport rdma|auto; default: the first one whose port 1 is active.
    #[arg(long)]
    rdma_device: Option<String>,
}

fn bench_codecs(a: &CodecArgs) {
    let n = a.size / 4;
    let chunk = (a.chunk_bytes / 4).max(1);
    // Gradient-like data: mixed magnitudes and signs.
    let src: Vec<f32> = (0..n).map(|i| ((i as f32 * 0.618).sin() * 3.0) * (1.0 + (i % 7) as f32)).collect();
    let mut dst = vec![0f32; n];
    println!("codec throughput, one core, {} MiB f32 in {} KiB chunks (GB/s of f32 input, encode+decode):", a.size >> 20, a.chunk_bytes >> 10);
    println!("{:<10} {:>10} {:>10} {:>12} {:>8}", "codec", "encode", "decode", "enc+dec", "ratio");
    for kind in [CodecKind::None, CodecKind::Fp16, CodecKind::Bf16, CodecKind::Int8, CodecKind::TopK { ratio: 0.1 }] {
        let codec = ipu_firmware::codec::for_kind(kind);
        let mut payload = Vec::with_capacity(codec.max_encoded_len(chunk));
        let (mut enc, mut dec, mut rounds, mut wire) = (Duration::ZERO, Duration::ZERO, 0u32, 0usize);
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(a.min_ms) || rounds < 2 {
            wire = 0;
            for (s, d) in src.chunks(chunk).zip(dst.chunks_mut(chunk)) {
                payload.clear();
                let t0 = Instant::now();
                codec.encode(s, &mut payload);
                let t1 = Instant::now();
                codec.decode(&payload, d, DecodeMode::Accumulate).expect("own payload decodes");
                dec += t1.elapsed();
                enc += t1 - t0;
                wire += payload.len();
            }
            rounds += 1;
        }
        std::hint::black_box(&dst);
        let bytes = (a.size as f64) * f64::from(rounds);
        let gbs = |d: Duration| bytes / d.as_secs_f64() / 1e9;
        println!(
            "{:<10} {:>10.2} {:>10.2} {:>12.2} {:>8.3}",
            kind.to_string(),
            gbs(enc),
            gbs(dec),
            gbs(enc + dec),
            wire as f64 / a.size as f64
        );
    }
}

fn bench_busbw(a: &BusbwArgs) -> anyhow::Result<()> {
    let mut sizes = Vec::new();
    let mut s = a.min_size.max(4);
    while s <= a.max_size {
        sizes.push(s);
        s *= a.factor.max(2);
    }
    let algorithms: Vec<Algorithm> = if a.algorithms.is_empty() { Algorithm::ALL.to_vec() } else { a.algorithms.clone() };
    let per_size = algorithms.clone();
    let cells: Vec<(Algorithm, usize)> =
        sizes.iter().flat_map(|&s| per_size.clone().into_iter().map(move |al| (al, s))).collect();
    let plans: Vec<Plan> = cells
        .iter()
        .enumerate()
        .map(|(i, &(algorithm, _))| Plan {
            step_from: i as u64,
            algorithm,
            chunk_bytes: a.chunk_bytes as u32,
            channels: a.channels,
            compression: Compression { codec: a.compression, error_feedback: false },
        })
        .collect();
    let budget = a.budget;
    let iters = move |size: usize| (budget / size).clamp(3, 500);
    let world = a.world;
    let timeout = Duration::from_secs(60);
    let cells2 = cells.clone();
    let options = MeshOptions {
        transport: a.transport,
        tcp: TcpOptions { channels: a.channels, timeout },
        rdma_device: a.rdma_device.clone(),
    };
    let results = run_mesh_ranks_in_process(world, options, move |rank, t| {
        let used = t.kind();
        let mut c = Communicator::new(t, CommunicatorConfig { initial_plan: plans[0], timeout })?;
        if rank == 0 {
            c.set_plan_source(Box::new(ScriptedPlans(plans.clone())));
        }
        let mut out = Vec::new();
        for (i, &(_, size)) in cells2.iter().enumerate() {
            c.begin_step(i as u64);
            let mut buf = vec![1.0f32; size / 4];
            c.allreduce_f32(&mut buf)?; // warm-up
            let k = iters(size);
            let t0 = Instant::now();
            for _ in 0..k {
                c.allreduce_f32(&mut buf)?;
            }
            out.push(t0.elapsed().as_secs_f64() / k as f64);
        }
        c.close();
        Ok((used, out))
    });
    let (used, times) = results.into_iter().next().context("no rank 0")?.context("rank 0 failed")?;
    println!(
        "loopback allreduce, {world} ranks as threads on this machine, transport {used}, chunk {} KiB, {} channel(s), compression {}:",
        a.chunk_bytes >> 10,
        a.channels,
        a.compression
    );
    print!("{:>10}", "size");
    for al in &algorithms {
        print!(" {:>12} {:>11}", format!("{al} time_us"), "busbw GB/s");
    }
    println!();
    for (si, &size) in sizes.iter().enumerate() {
        print!("{:>10}", human(size));
        for (ai, _) in algorithms.iter().enumerate() {
            let t = times[si * algorithms.len() + ai];
            print!(" {:>12.1} {:>11.3}", t * 1e6, allreduce_busbw(size, world, t) / 1e9);
        }
        println!();
    }
    Ok(())
}

fn human(b: usize) -> String {
    if b >= 1 << 20 {
        format!("{}MiB", b >> 20)
    } else if b >= 1 << 10 {
        format!("{}KiB", b >> 10)
    } else {
        format!("{b}B")
    }
}

fn main() -> anyhow::Result<()> {
    // On stderr, so that `--transport auto`'s fallback warning shows without mixing into the tables.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    match args.what {
        What::Codecs(c) => bench_codecs(&c),
        What::Busbw(b) => bench_busbw(&b)?,
        What::All => {
            bench_codecs(&CodecArgs::parse_from(["codecs"]));
            println!();
            bench_busbw(&BusbwArgs::parse_from(["busbw"]))?;
        }
    }
    Ok(())
}
