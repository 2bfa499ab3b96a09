//! `#[repr(C)]` mirrors of NCCL's tuner-plugin interface, v2 to v7 (`include/ringside_nccl_tuner.h`
//! is the C side; both assert the same sizes at compile time).
//!
//! C enums that NCCL passes by value (`ncclFunc_t`, `ncclResult_t`, `ncclDebugLogLevel`) are
//! `c_int` here with named constants, never Rust enums: NCCL may pass a value this build does not
//! know (a newer collective), and a Rust enum holding it would be undefined behaviour.
//!
//! The cost table: declared `float**`, passed as a contiguous `float[numAlgo][numProto]` cast to
//! `float**` (NCCL's own v2 adapter casts it back), so entry (a, p) is at `a * numProto + p`.

use std::ffi::{c_char, c_int, c_ulong, c_void};

/// `ncclResult_t`.
pub type NcclResult = c_int;
pub const NCCL_SUCCESS: NcclResult = 0;
pub const NCCL_INTERNAL_ERROR: NcclResult = 3;
pub const NCCL_INVALID_ARGUMENT: NcclResult = 4;

/// `ncclFunc_t`.
pub type NcclFunc = c_int;
pub const FUNC_BROADCAST: NcclFunc = 0;
pub const FUNC_REDUCE: NcclFunc = 1;
pub const FUNC_ALL_GATHER: NcclFunc = 2;
pub const FUNC_REDUCE_SCATTER: NcclFunc = 3;
pub const FUNC_ALL_REDUCE: NcclFunc = 4;

/// Rows of the cost table.
pub const ALGO_UNDEF: c_int = -1;
pub const ALGO_TREE: c_int = 0;
pub const ALGO_RING: c_int = 1;
pub const ALGO_COLLNET_DIRECT: c_int = 2;
pub const ALGO_COLLNET_CHAIN: c_int = 3;
pub const ALGO_NVLS: c_int = 4;
pub const ALGO_NVLS_TREE: c_int = 5;
pub const ALGO_PAT: c_int = 6;
/// Rows in the v5+ tables (`NCCL_NUM_ALGORITHMS_V5`); NCCL passes the row count it uses.
pub const NUM_ALGORITHMS: usize = 7;

/// Columns of the cost table.
pub const PROTO_UNDEF: c_int = -1;
pub const PROTO_LL: c_int = 0;
pub const PROTO_LL128: c_int = 1;
pub const PROTO_SIMPLE: c_int = 2;
pub const NUM_PROTOCOLS: usize = 3;

/// `NCCL_ALGO_PROTO_IGNORE`: an algorithm/protocol NCCL cannot run for this call.
pub const ALGO_PROTO_IGNORE: f32 = -1.0;

/// `ncclDebugLogLevel` and the subsystem flag of tuning messages.
pub const LOG_WARN: c_int = 2;
pub const LOG_INFO: c_int = 3;
pub const LOG_TRACE: c_int = 5;
pub const SUBSYS_INIT: c_ulong = 1;
pub const SUBSYS_TUNING: c_ulong = 64;

/// `ncclDebugLogger_t`: printf-style; `None` when the caller passed NULL.
pub type DebugLogger = Option<unsafe extern "C" fn(level: c_int, flags: c_ulong, file: *const c_char, line: c_int, fmt: *const c_char, ...)>;

/// `ncclNvlDomainInfo_v5_t` (also v6, v7).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NvlDomainInfoV5 {
    pub n_nvl_domains: c_int,
    pub min_ranks_per_nvl_domain: c_int,
    pub max_ranks_per_nvl_domain: c_int,
}

const HW_LINKS: usize = 3;
const TUNING_SCALES: usize = 3;

/// `ncclTunerConstants_v5_t` (also v6). ringside leaves NCCL's constants alone; the type is here
/// for the init signature and the layout check.
#[repr(C)]
pub struct TunerConstantsV5 {
    pub base_latencies: [[f64; NUM_PROTOCOLS]; NUM_ALGORITHMS],
    pub hw_latencies: [[[f64; NUM_PROTOCOLS]; NUM_ALGORITHMS]; HW_LINKS],
    pub ll_max_bws: [[f64; TUNING_SCALES]; 4],
    pub per_ch_max_ring_ll128_bws: [[f64; TUNING_SCALES]; 4],
    pub per_ch_max_tree_ll128_bws: [[f64; TUNING_SCALES]; 4],
    pub per_ch_max_tree_bws: [[f64; TUNING_SCALES]; 4],
    pub per_ch_max_nvls_tree_bws: [[f64; TUNING_SCALES]; 4],
}

/// `ncclTunerConstants_v7_t`: v5's with a fifth compute-capability row.
#[repr(C)]
pub struct TunerConstantsV7 {
    pub base_latencies: [[f64; NUM_PROTOCOLS]; NUM_ALGORITHMS],
    pub hw_latencies: [[[f64; NUM_PROTOCOLS]; NUM_ALGORITHMS]; HW_LINKS],
    pub ll_max_bws: [[f64; TUNING_SCALES]; 5],
    pub per_ch_max_ring_ll128_bws: [[f64; TUNING_SCALES]; 5],
    pub per_ch_max_tree_ll128_bws: [[f64; TUNING_SCALES]; 5],
    pub per_ch_max_tree_bws: [[f64; TUNING_SCALES]; 5],
    pub per_ch_max_nvls_tree_bws: [[f64; TUNING_SCALES]; 5],
}

pub type InitV2 = unsafe extern "C" fn(n_ranks: usize, n_nodes: usize, log: DebugLogger, context: *mut *mut c_void) -> NcclResult;
pub type InitV5 = unsafe extern "C" fn(
    context: *mut *mut c_void,
    comm_id: u64,
    n_ranks: usize,
    n_nodes: usize,
    log: DebugLogger,
    nvl: *mut NvlDomainInfoV5,
    constants: *mut TunerConstantsV5,
) -> NcclResult;
pub type InitV7 = unsafe extern "C" fn(
    context: *mut *mut c_void,
    comm_id: u64,
    n_ranks: usize,
    n_nodes: usize,
    log: DebugLogger,
    nvl: *mut NvlDomainInfoV5,
    constants: *mut TunerConstantsV7,
) -> NcclResult;
#[allow(clippy::too_many_arguments)]
pub type GetCollInfoV2 = unsafe extern "C" fn(
    context: *mut c_void,
    coll: NcclFunc,
    n_bytes: usize,
    coll_net_support: c_int,
    nvls_support: c_int,
    num_pipe_ops: c_int,
    algorithm: *mut c_int,
    protocol: *mut c_int,
    n_channels: *mut c_int,
) -> NcclResult;
pub type GetCollInfoV3 = unsafe extern "C" fn(
    context: *mut c_void,
    coll: NcclFunc,
    n_bytes: usize,
    num_pipe_ops: c_int,
    cost_table: *mut *mut f32,
    num_algo: c_int,
    num_proto: c_int,
    n_channels: *mut c_int,
) -> NcclResult;
/// v4, v5, v6 and v7.
pub type GetCollInfoV4 = unsafe extern "C" fn(
    context: *mut c_void,
    coll: NcclFunc,
    n_bytes: usize,
    num_pipe_ops: c_int,
    cost_table: *mut *mut f32,
    num_algo: c_int,
    num_proto: c_int,
    reg_buff: c_int,
    n_channels: *mut c_int,
) -> NcclResult;
pub type Destroy = unsafe extern "C" fn(context: *mut c_void) -> NcclResult;
pub type GetChunkSize = unsafe extern "C" fn(
    context: *mut c_void,
    coll: NcclFunc,
    n_bytes: usize,
    algo: c_int,
    proto: c_int,
    n_channels: c_int,
    chunk_size: *mut usize,
) -> NcclResult;

/// `ncclTuner_v2_t`.
#[repr(C)]
pub struct TunerV2 {
    pub name: *const c_char,
    pub init: InitV2,
    pub get_coll_info: GetCollInfoV2,
    pub destroy: Destroy,
}

/// `ncclTuner_v3_t`.
#[repr(C)]
pub struct TunerV3 {
    pub name: *const c_char,
    pub init: InitV2,
    pub get_coll_info: GetCollInfoV3,
    pub destroy: Destroy,
}

/// `ncclTuner_v4_t`.
#[repr(C)]
pub struct TunerV4 {
    pub name: *const c_char,
    pub init: InitV2,
    pub get_coll_info: GetCollInfoV4,
    pub destroy: Destroy,
}

/// `ncclTuner_v5_t` (`destroy` is called `finalize` from v5 on).
#[repr(C)]
pub struct TunerV5 {
    pub name: *const c_char,
    pub init: InitV5,
    pub get_coll_info: GetCollInfoV4,
    pub finalize: Destroy,
}

/// `ncclTuner_v6_t`.
#[repr(C)]
pub struct TunerV6 {
    pub name: *const c_char,
    pub init: InitV5,
    pub get_coll_info: GetCollInfoV4,
    pub finalize: Destroy,
    pub get_chunk_size: Option<GetChunkSize>,
}

/// `ncclTuner_v7_t`.
#[repr(C)]
pub struct TunerV7 {
    pub name: *const c_char,
    pub init: InitV7,
    pub get_coll_info: GetCollInfoV4,
    pub finalize: Destroy,
    pub get_chunk_size: Option<GetChunkSize>,
}

// The tables are exported as immutable statics that NCCL only reads; the name points at a static
// C string.
unsafe impl Sync for TunerV2 {}
unsafe impl Sync for TunerV3 {}
unsafe impl Sync for TunerV4 {}
unsafe impl Sync for TunerV5 {}
unsafe impl Sync for TunerV6 {}
unsafe impl Sync for TunerV7 {}

// Layout checks: the same numbers as the _Static_asserts in include/ringside_nccl_tuner.h.
const PTR: usize = size_of::<*const c_void>();
const _: () = assert!(size_of::<NvlDomainInfoV5>() == 12);
const _: () = assert!(size_of::<TunerConstantsV5>() == 144 * 8);
const _: () = assert!(size_of::<TunerConstantsV7>() == 159 * 8);
const _: () = assert!(size_of::<TunerV2>() == 4 * PTR);
const _: () = assert!(size_of::<TunerV3>() == 4 * PTR);
const _: () = assert!(size_of::<TunerV4>() == 4 * PTR);
const _: () = assert!(size_of::<TunerV5>() == 4 * PTR);
const _: () = assert!(size_of::<TunerV6>() == 5 * PTR);
const _: () = assert!(size_of::<TunerV7>() == 5 * PTR);
const _: () = assert!(std::mem::offset_of!(TunerV7, get_chunk_size) == 4 * PTR);
const _: () = assert!(size_of::<Option<GetChunkSize>>() == PTR);
