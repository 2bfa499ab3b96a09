//! Gives the cdylib the soname NCCL's loader looks for (`libnccl-tuner-ringside.so`), so a copy
//! installed under that name is also what `ldd`/`dlinfo` report.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl-tuner-ringside.so");
    println!("cargo:rerun-if-changed=build.rs");
}
