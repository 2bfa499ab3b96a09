//! Embeds the eBPF flow monitor object into the agent.
//!
//! The object is built by `cargo xtask build` (nightly + bpf-linker, `bpfel-unknown-none`) and its
//! path passed in `RINGSIDE_EBPF_OBJECT`. Plain `cargo build` / `cargo test` at the workspace root
//! must work on stable without bpf-linker, so when the variable is unset an empty object is embedded
//! and the agent refuses to load it with a message that says to use `cargo xtask build`.
use std::{env, fs, path::PathBuf};

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=RINGSIDE_EBPF_OBJECT");
    let out = PathBuf::from(env::var("OUT_DIR")?).join("flowmon.bpf.o");
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
        }
        None => fs::write(&out, [])?,
    }
    Ok(())
}
