//! T2: OpenMPI's `MPI_Allreduce` across the namespaces of a star, through `testbed::spawn_mpi`,
//! once with every `coll_tuned` allreduce algorithm: each launch starts (every emulated host's
//! `orted` comes up), every rank runs its steps and verifies every sum.
//!
//! Seven launches in a row is what makes a launch race visible: before each emulated host had its
//! own OpenMPI session directory, the daemons raced to create one and about one launch in six
//! hung at load 15 (`testbed/src/mpi.rs`, `write_launch_agent`).
//!
//! Needs root and OpenMPI (`mpirun`, `mpicc`: `cargo xtask setup`); without them it FAILS saying
//! so. About 20 s on a quiet machine.
use std::path::PathBuf;
use std::time::Duration;

use testbed::{ByteSize, MpiAlgorithm, MpiConfig, Star, StarConfig};

/// Removes the jobs' output directory however the test ends.
struct OutDir(PathBuf);

impl Drop for OutDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
#[ignore = "needs root (T2): run with cargo xtask test"]
fn every_allreduce_algorithm_launches_and_verifies_its_sums() {
    if let Err(e) = testbed::require_root() {
        panic!("t2_mpi creates network namespaces: {e}");
    }
    let ranks = 4;
    let star = Star::new(StarConfig { hosts: ranks, ..Default::default() }).unwrap();
    let out = OutDir(std::env::temp_dir().join(format!("ringside-t2-mpi-{}", std::process::id())));
    let mut failures = Vec::new();
    for algorithm in MpiAlgorithm::ALL {
        let dir = out.0.join(algorithm.name());
        let cfg = MpiConfig {
            ranks,
            algorithm,
            size: ByteSize(256 << 10),
            compute_ms: 5,
            steps: 4,
            // A launch takes ~1.5 s here; a hung launch waits for a daemon that died.
            timeout: Duration::from_secs(90),
            out_dir: Some(dir),
            ..Default::default()
        };
        let report = match testbed::spawn_mpi(&star, &cfg).and_then(|job| job.wait(None)) {
            Ok(r) => r,
            Err(e) => {
                failures.push(format!("{}: {e}", algorithm.name()));
                continue;
            }
        };
        assert_eq!(report.ranks.len(), ranks, "{}: one result per rank", algorithm.name());
        for r in &report.ranks {
            assert_eq!(r.step_ms.count, 4, "{} rank {}: steps in {}", algorithm.name(), r.rank, r.out.display());
            assert_eq!(r.verified, Some(true), "{} rank {}: every step's sum verified ({})", algorithm.name(), r.rank, r.out.display());
            assert_eq!(r.error, None, "{} rank {}", algorithm.name(), r.rank);
        }
    }
    assert!(failures.is_empty(), "OpenMPI jobs that did not run:\n{}", failures.join("\n"));
}
