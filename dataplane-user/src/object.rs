//! The embedded eBPF object (see `build.rs`).

/// The flow monitor's ELF object, 8-byte aligned as the ELF parser wants it.
/// Empty when the agent was built without `cargo xtask build`.
pub static FLOWMON_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/flowmon.bpf.o"));

/// Returns the embedded object, or an error that tells the operator how to get one.
pub fn flowmon_object() -> Result<&'static [u8], MissingObject> {
    if FLOWMON_OBJECT.is_empty() {
        Err(MissingObject)
    } else {
        Ok(FLOWMON_OBJECT)
    }
}

/// The binary was built without its eBPF object.
#[derive(Debug, thiserror::Error)]
#[error(
    "this ringside binary was built without its eBPF object (plain `cargo build`); \
     build it with `cargo xtask build` (needs nightly rust-src and bpf-linker: `cargo xtask setup`)"
)]
pub struct MissingObject;

/// The emulated IPU's forwarder (`dataplane-ebpf/src/ipuwire.rs`), built by `cargo xtask build`
/// next to the flow monitor. Empty when the agent was built without it.
pub static IPUWIRE_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/ipuwire.bpf.o"));

/// Returns the embedded forwarder, or an error that tells the operator how to get one.
pub fn ipuwire_object() -> Result<&'static [u8], MissingObject> {
    if IPUWIRE_OBJECT.is_empty() {
        Err(MissingObject)
    } else {
        Ok(IPUWIRE_OBJECT)
    }
}
