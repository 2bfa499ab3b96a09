//! `cargo xtask dist`: the binaries an operator installs, for the host or for a DPU's Arm cores.
//!
//! The eBPF object is the same for every target (BPF bytecode, `bpfel-unknown-none`); only user
//! space is cross-compiled. For `aarch64-unknown-linux-gnu` (BlueField's and the IPU E2000's
//! Neoverse cores) the linker is Debian's `aarch64-linux-gnu-gcc`, and `--check` runs the result
//! under `qemu-aarch64-static` (user-mode emulation, with the Arm libc from
//! `libc6-dev-arm64-cross`): `ringside --version`, `ringside-rank --help`, and unit-test binaries
//! whose results depend on the target's layout and arithmetic (the shared map and wire structs in
//! `dataplane-common`, the statistics). `cargo xtask setup` installs the target and the packages.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::{
    build,
    util::{cargo, sh, workspace_root},
};

/// The binaries a distribution holds: (package, binary).
/// `ringside-ipu` is the managed collective service that runs on the DPU itself.
pub const BINARIES: &[(&str, &str)] = &[("dataplane-user", "ringside"), ("ipu-firmware", "ringside-rank"), ("ipu-firmware", "ringside-ipu")];

/// Crates whose unit tests `--check` runs on the target: the layouts shared with the kernel and
/// the wire (`dataplane-common`'s compile-time and test-time layout checks), the statistics, and
/// the collective engine's codecs, wire frames and plans (`ipu-firmware`, which runs on the DPU).
pub const CHECKED_CRATES: &[&str] = &["dataplane-common", "ringside-stats", "ipu-firmware"];

pub const AARCH64: &str = "aarch64-unknown-linux-gnu";

#[derive(Debug, Clone, clap::Args)]
pub struct Opts {
    /// Target triple; default: the host's. `aarch64-unknown-linux-gnu` is the DPU's Arm cores.
    #[arg(long, value_name = "TRIPLE")]
    pub target: Option<String>,
    /// Build with the dev profile instead of release (faster to compile; what CI checks).
    #[arg(long)]
    pub debug: bool,
    /// Also run the binaries and the target's unit tests (under qemu-user for a foreign target).
    #[arg(long)]
    pub check: bool,
}

/// How to link and run binaries of a target from this host.
struct Toolchain {
    /// `CARGO_TARGET_<TRIPLE>_LINKER` value, for cross targets.
    linker: Option<(&'static str, &'static str)>,
    /// Command prefix that runs a target binary here (qemu-user), for cross targets.
    runner: Vec<String>,
    /// ELF `e_machine` of the target's binaries.
    machine: u16,
}

fn toolchain(target: &str) -> Result<Toolchain> {
    let host = host_triple()?;
    if target == host {
        return Ok(Toolchain { linker: None, runner: Vec::new(), machine: elf_machine_of(&host)? });
    }
    match target {
        AARCH64 => Ok(Toolchain {
            linker: Some(("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER", "aarch64-linux-gnu-gcc")),
            runner: vec!["qemu-aarch64-static".into(), "-L".into(), "/usr/aarch64-linux-gnu".into()],
            machine: 0xb7,
        }),
        other => bail!("no cross toolchain is set up for {other}; supported: {host} (the host) and {AARCH64}"),
    }
}

fn host_triple() -> Result<String> {
    let out = Command::new("rustc").arg("-vV").output().context("running rustc -vV")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .context("rustc -vV printed no host line")
}

fn elf_machine_of(triple: &str) -> Result<u16> {
    Ok(match triple.split('-').next() {
        Some("x86_64") => 0x3e,
        Some("aarch64") => 0xb7,
        _ => bail!("unknown ELF machine for {triple}"),
    })
}

/// The ELF header's `e_machine` (offset 18, little-endian for both targets here).
fn elf_machine(path: &Path) -> Result<u16> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if bytes.len() < 20 || &bytes[..4] != b"\x7fELF" {
        bail!("{} is not an ELF file", path.display());
    }
    Ok(u16::from_le_bytes([bytes[18], bytes[19]]))
}

pub fn run(opts: Opts) -> Result<()> {
    let target = match &opts.target {
        Some(t) => t.clone(),
        None => host_triple()?,
    };
    let tc = toolchain(&target)?;
    let object = build::ebpf()?;
    let with_toolchain = |cmd: &mut Command| {
        cmd.env(build::OBJECT_ENV, &object).args(["--target", &target]);
        if let Some((var, linker)) = tc.linker {
            cmd.env(var, linker);
        }
    };

    let mut cmd = cargo();
    cmd.arg("build");
    if !opts.debug {
        cmd.arg("--release");
    }
    for (package, bin) in BINARIES {
        cmd.args(["-p", package, "--bin", bin]);
    }
    with_toolchain(&mut cmd);
    sh(&mut cmd).with_context(|| format!("building for {target}: `cargo xtask setup` installs the target and its linker"))?;

    let profile = if opts.debug { "debug" } else { "release" };
    let built = workspace_root().join("target").join(&target).join(profile);
    let out_dir = workspace_root().join("target/dist").join(&target);
    std::fs::create_dir_all(&out_dir)?;
    for (_, bin) in BINARIES {
        let from = built.join(bin);
        let to = out_dir.join(bin);
        std::fs::copy(&from, &to).with_context(|| format!("copying {}", from.display()))?;
        let machine = elf_machine(&to)?;
        if machine != tc.machine {
            bail!("{} has ELF machine {machine:#x}, not {:#x} for {target}", to.display(), tc.machine);
        }
        let size = std::fs::metadata(&to)?.len();
        println!("dist: {} ({:.1} MiB, {target}, {profile})", to.display(), size as f64 / (1024.0 * 1024.0));
    }
    if opts.check {
        check(&target, &tc, &out_dir, !opts.debug, &with_toolchain)?;
    }
    Ok(())
}

/// Runs the built binaries and the target's unit tests (under qemu-user when foreign).
fn check(target: &str, tc: &Toolchain, out_dir: &Path, release: bool, with_toolchain: &dyn Fn(&mut Command)) -> Result<()> {
    let run = |program: &Path, args: &[&str]| -> Result<String> {
        let mut cmd = match tc.runner.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(program);
                c
            }
            None => Command::new(program),
        };
        let out = cmd.args(args).output().with_context(|| {
            format!("running {} for {target} (qemu-user-static from `cargo xtask setup` runs foreign binaries)", program.display())
        })?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            bail!("{} {args:?} on {target} failed ({}): {text}", program.display(), out.status);
        }
        Ok(text)
    };
    let version = run(&out_dir.join("ringside"), &["--version"])?;
    if !version.starts_with("ringside ") {
        bail!("ringside --version on {target} printed {version:?}");
    }
    println!("check: {}", version.trim());
    let help = run(&out_dir.join("ringside-rank"), &["--help"])?;
    println!("check: ringside-rank --help on {target}: {} lines", help.lines().count());

    // Unit-test binaries for the target, found from cargo's JSON messages. In the distribution's
    // profile: release shares the dependencies just built, and the codec tests take 1.5 minutes
    // under qemu in debug.
    let mut cmd = cargo();
    cmd.args(["test", "--lib", "--no-run", "--message-format=json-render-diagnostics"]);
    if release {
        cmd.arg("--release");
    }
    for c in CHECKED_CRATES {
        cmd.args(["-p", c]);
    }
    with_toolchain(&mut cmd);
    let out = cmd.stderr(std::process::Stdio::inherit()).output().context("building the unit tests for the target")?;
    if !out.status.success() {
        bail!("building the unit tests for {target} failed");
    }
    let tests: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["reason"] == "compiler-artifact" && v["profile"]["test"] == true)
        .filter_map(|v| v["executable"].as_str().map(PathBuf::from))
        .collect();
    if tests.len() < CHECKED_CRATES.len() {
        bail!("expected unit-test binaries of {CHECKED_CRATES:?}, cargo built {tests:?}");
    }
    for t in &tests {
        let text = run(t, &[])?;
        let result = text.lines().find(|l| l.starts_with("test result:")).unwrap_or("no result line");
        println!("check: {} on {target}: {result}", t.file_name().unwrap_or_default().to_string_lossy());
        if !result.starts_with("test result: ok.") {
            bail!("unit tests of {} failed on {target}:\n{text}", t.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elf_machines_of_the_supported_targets() {
        assert_eq!(elf_machine_of("x86_64-unknown-linux-gnu").unwrap(), 0x3e);
        assert_eq!(elf_machine_of(AARCH64).unwrap(), 0xb7);
        assert!(elf_machine_of("riscv64gc-unknown-linux-gnu").is_err());
        // This test binary is an ELF of the host.
        let me = std::env::current_exe().unwrap();
        assert_eq!(elf_machine(&me).unwrap(), elf_machine_of(&host_triple().unwrap()).unwrap());
        assert!(toolchain("mips-unknown-linux-gnu").is_err());
    }
}
