//! ringside's NCCL tuner plugin: `libnccl-tuner-ringside.so`, loaded by NCCL with
//! `NCCL_TUNER_PLUGIN=ringside`, makes a job's ringside hints reach NCCL's algorithm, channel and
//! chunk-size choice for allreduce.
//!
//! - [`abi`]: `#[repr(C)]` mirrors of NCCL's tuner interface v2 to v7 (the C side:
//!   `include/ringside_nccl_tuner.h`).
//! - [`plugin`]: the exported tables `ncclTunerPlugin_v2` .. `ncclTunerPlugin_v7` and their
//!   functions.
//! - [`follow`]: the background poll of `GET {RINGSIDE_JOB_URL}/hints` (token `RINGSIDE_TOKEN`).
//! - [`shape`]: the pure cost-table shaping, unit-tested over matrices of tables.
//!
//! Invariants:
//! - Fail open: `init` and `getCollInfo` always return `ncclSuccess` for valid arguments; without
//!   a job, a hint, or a reachable agent, NCCL's own choice stands untouched (the cost table is
//!   not written, `nChannels` is left at NCCL's 0 = "yours").
//! - `getCollInfo` never blocks on the network; it never panics across the C boundary (panics are
//!   caught and the call leaves NCCL's defaults).
//! - See docs/tenant-guide.md, "NCCL tuner plugin", for what maps to what.

pub mod abi;
pub mod follow;
pub mod log;
pub mod plugin;
pub mod shape;
