//! Embeds the eBPF flow monitor object (and the IPU forwarder `ipuwire` built beside it) into the agent.
//!
//! The object is built by `cargo xtask build` (nightly + bpf-linker, `bpfel-unknown-none`) and its
//! path passed in `RINGSIDE_EBPF_OBJECT`. Plain `cargo build` / `cargo test` at the workspace root
//! must work on stable without bpf-linker, so when the variable is unset an empty object is embedded
//! and the agent refuses to load it with a message that says to use `cargo xtask build`.
//!
//! It also sets the labels of `ringside_build_info`: `RINGSIDE_GIT_COMMIT` (taken from the
//! environment when set, as in a build from a source tarball, else from `git rev-parse HEAD`;
//! left unset outside a git checkout) and `RINGSIDE_RUSTC_VERSION` (`$RUSTC --version`).
use std::{env, fs, path::PathBuf, process::Command};

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=RINGSIDE_EBPF_OBJECT");
    build_info();
    let out = PathBuf::from(env::var("OUT_DIR")?).join("flowmon.bpf.o");
    let wire_out = PathBuf::from(env::var("OUT_DIR")?).join("ipuwire.bpf.o");
    match env::var_os("RINGSIDE_EBPF_OBJECT") {
        Some(path) => {
            let path = PathBuf::from(path);
            println!("cargo:rerun-if-changed={}", path.display());
            let bytes = fs::read(&path).map_err(|e| {
                anyhow::anyhow!(
                    "RINGSIDE_EBPF_OBJECT={} cannot be read ({e}); run `cargo xtask build`",
                    path.display()
                )
            })?;
            fs::write(&out, bytes)?;
            // The IPU forwarder (`ipuwire`) is a second binary of the same eBPF crate, so it lands
            // next to the flow monitor. An older object directory without it embeds an empty one:
            // only `ringside ipu-wire` needs it, and it says how to get it.
            let wire = path.with_file_name("ipuwire");
            println!("cargo:rerun-if-changed={}", wire.display());
            fs::write(&wire_out, fs::read(&wire).unwrap_or_default())?;
        }
        None => {
            fs::write(&out, [])?;
            fs::write(&wire_out, [])?;
        }
    }
    Ok(())
}

/// The output of a command that succeeded, trimmed; `None` otherwise.
fn stdout_of(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok().filter(|o| o.status.success())?;
    Some(String::from_utf8(out.stdout).ok()?.trim().to_owned()).filter(|s| !s.is_empty())
}

/// `ringside_build_info`'s labels, passed to the crate as compile-time environment variables.
fn build_info() {
    println!("cargo:rerun-if-env-changed=RINGSIDE_GIT_COMMIT");
    let commit = env::var("RINGSIDE_GIT_COMMIT").ok().filter(|c| !c.is_empty()).or_else(|| {
        let git = |args: &[&str]| stdout_of(Command::new("git").args(args));
        let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
        // Rebuild when HEAD moves: HEAD itself (a branch switch) and the branch's ref (a commit).
        // A packed ref has no file of its own; watching a missing path would rerun every build.
        for path in [git(&["rev-parse", "--git-path", "HEAD"]), git(&["symbolic-ref", "-q", "HEAD"]).and_then(|r| git(&["rev-parse", "--git-path", &r]))]
            .into_iter()
            .flatten()
            .filter(|p| std::path::Path::new(p).exists())
        {
            println!("cargo:rerun-if-changed={path}");
        }
        Some(commit)
    });
    if let Some(commit) = commit {
        println!("cargo:rustc-env=RINGSIDE_GIT_COMMIT={commit}");
    }
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    // "rustc 1.95.0 (hash date)" -> "1.95.0"
    if let Some(v) = stdout_of(Command::new(rustc).arg("--version")).and_then(|v| v.split_whitespace().nth(1).map(str::to_owned)) {
        println!("cargo:rustc-env=RINGSIDE_RUSTC_VERSION={v}");
    }
}
