//! What the kernel's verifier does with the flow monitor: for each program of an eBPF object
//! (the embedded one, or the file given as the first argument), the instructions the verifier
//! processed (`verified_insns`, 5.16+), the program's own size, and the time its load took.
//! The verifier walks every path of the program; the ratio of the two counts says how much
//! state pruning it could do. Needs root. Run:
//! `cargo run --release -p dataplane-user --example verifier_cost [-- path/to/flowmon]`
//! (`cargo xtask build` first for the embedded object).
use std::time::Instant;

use aya::{programs::SchedClassifier, EbpfLoader};
use dataplane_common::programs;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let file = std::env::args().nth(1).map(std::fs::read).transpose()?;
    let object: &[u8] = match &file {
        Some(bytes) => bytes,
        None => dataplane_user::object::flowmon_object()?,
    };
    let mut ebpf = EbpfLoader::new().load(object)?;
    for name in [programs::FLOWMON, programs::NOOP] {
        let prog: &mut SchedClassifier = ebpf.program_mut(name).ok_or(format!("no program {name}"))?.try_into()?;
        let started = Instant::now();
        prog.load()?;
        let took = started.elapsed();
        let info = prog.info()?;
        let size = info.size_translated().map(|b| b / 8);
        println!(
            "{name}: verified_insns {} for {} instructions, load {:.1} ms",
            info.verified_instruction_count().map_or("unknown (kernel < 5.16)".into(), |n| n.to_string()),
            size.map_or("?".into(), |n| n.to_string()),
            took.as_secs_f64() * 1e3
        );
    }
    Ok(())
}
