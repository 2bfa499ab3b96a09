//! What the analysis stage's once-per-window interface read costs (`queue_stats::
//! read_interface_counters`: one `RTM_GETQDISC` dump of the calling process's network namespace
//! and one `RTM_GETLINK` per attached interface) against the number of interfaces there and the
//! number attached: a DPU's Arm side has a representor per VF, hundreds of them. Reported twice:
//! with 4 interfaces attached, and with every interface of the namespace attached. Measured as the thread's CPU time
//! (`CLOCK_THREAD_CPUTIME_ID`: the kernel's work building the dump is charged to the reading
//! thread, the wall clock of a shared machine counts other processes too) and the wall time per
//! read. No root needed to read; to measure many interfaces, run it as root with `--veth-pairs N`:
//! it then creates a network namespace with N veth pairs (2N interfaces, each up with veth's
//! `noqueue`, as the testbed's ports), reads there, and deletes the namespace.
//!
//! Run: `cargo run --release -p dataplane-user --example bench_ifcounters -- [--veth-pairs N] [--reads R]`
//! (defaults: this namespace, 1000 reads).
use std::time::{Duration, Instant};

use dataplane_user::queue_stats::read_interface_counters;

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn arg(args: &[String], name: &str) -> Option<usize> {
    let i = args.iter().position(|a| a == name)?;
    Some(args.get(i + 1).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{name} takes a number")))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let reads = arg(&args, "--reads").unwrap_or(1000).max(1);
    let ns = arg(&args, "--veth-pairs").map(|n| {
        let ns = testbed::Netns::new("ifc").expect("creating a network namespace (root)");
        let h = ns.handle();
        // One `ip -batch` for all of them: N separate `ip` runs would take longer than the reads.
        let batch: String =
            (0..n).map(|i| format!("link add va{i} type veth peer name vb{i}\nlink set va{i} up\nlink set vb{i} up\n")).collect();
        let path = std::env::temp_dir().join(format!("ringside-ifc-{}.batch", std::process::id()));
        std::fs::write(&path, batch).unwrap();
        let out = h.command("ip").args(["-batch"]).arg(&path).output().expect("running ip -batch");
        std::fs::remove_file(&path).ok();
        assert!(out.status.success(), "ip -batch: {}", String::from_utf8_lossy(&out.stderr));
        ns
    });
    let run = || {
        // A fresh namespace numbers its interfaces from 1 (loopback) up; the veths have root
        // qdiscs (`noqueue`), loopback none.
        let interfaces = read_interface_counters([]).expect("reading the interfaces").len() as u32;
        let mut out = Vec::new();
        for attached in [interfaces.min(4), interfaces] {
            let (cpu0, wall0) = (thread_cpu(), Instant::now());
            for _ in 0..reads {
                read_interface_counters(1..=attached).expect("reading the interfaces");
            }
            out.push((interfaces, attached, (thread_cpu() - cpu0) / reads as u32, wall0.elapsed() / reads as u32));
        }
        out
    };
    let results = match &ns {
        Some(ns) => ns.run(run),
        None => run(),
    };
    for (interfaces, attached, cpu, wall) in results {
        println!(
            "{interfaces} interfaces with a root qdisc, {attached} attached, {reads} reads: {:.1} µs CPU and {:.1} µs wall per read",
            cpu.as_secs_f64() * 1e6,
            wall.as_secs_f64() * 1e6
        );
    }
}
