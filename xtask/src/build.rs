//! `cargo xtask build`: the eBPF object (nightly, `bpfel-unknown-none`) and the workspace with it
//! embedded (dataplane-user/build.rs reads `RINGSIDE_EBPF_OBJECT`).
use std::{path::PathBuf, process::Command};

use anyhow::{Context, Result};

use crate::util::{cargo, sh, workspace_root};

/// Environment variable through which the object's path reaches dataplane-user/build.rs.
pub const OBJECT_ENV: &str = "RINGSIDE_EBPF_OBJECT";

/// Builds the eBPF object and returns its path. Always invoked (cargo's own freshness check makes
/// a no-op rebuild take about a second), so the embedded object never lags its source.
pub fn ebpf() -> Result<PathBuf> {
    let root = workspace_root();
    let target_dir = root.join("target/ebpf");
    let mut cmd = Command::new("cargo");
    cmd.current_dir(&root)
        .args(["+nightly", "build", "-p", "dataplane-ebpf", "--release"])
        .args(["--target", "bpfel-unknown-none", "-Z", "build-std=core"])
        .arg("--target-dir")
        .arg(&target_dir);
    // `cargo xtask` runs under the stable toolchain; these variables would make the nightly cargo
    // use the stable rustc (same reason aya-build removes them).
    for var in ["RUSTC", "RUSTC_WORKSPACE_WRAPPER", "RUSTUP_TOOLCHAIN", "CARGO"] {
        cmd.env_remove(var);
    }
    sh(&mut cmd).context(
        "building the eBPF program needs the nightly toolchain with rust-src and bpf-linker: run `cargo xtask setup`",
    )?;
    Ok(target_dir.join("bpfel-unknown-none/release/flowmon"))
}

/// Builds everything: the eBPF object, then the workspace (tests and examples too) with it embedded.
/// Returns the object path for callers that run further cargo commands with it.
pub fn all(release: bool) -> Result<PathBuf> {
    let object = ebpf()?;
    let mut cmd = cargo();
    cmd.args(["build", "--workspace", "--exclude", "dataplane-ebpf", "--bins", "--examples"]);
    if release {
        cmd.arg("--release");
    }
    sh(cmd.env(OBJECT_ENV, &object))?;
    Ok(object)
}

/// Path of a workspace binary built in debug or release mode.
pub fn bin_path(name: &str, release: bool) -> PathBuf {
    workspace_root().join("target").join(if release { "release" } else { "debug" }).join(name)
}

/// `cargo xtask testbed ARGS`: builds and runs `ringside-testbed ARGS`.
pub fn testbed(args: &[String]) -> Result<()> {
    let mut cmd = cargo();
    cmd.args(["run", "--quiet", "--release", "-p", "testbed", "--bin", "ringside-testbed", "--"]).args(args);
    sh(&mut cmd)
}
