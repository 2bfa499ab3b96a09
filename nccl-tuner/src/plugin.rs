//! The exported tables NCCL looks up (`ncclTunerPlugin_v2` .. `ncclTunerPlugin_v7`) and their
//! functions. Every version shares one context type and one decision path; the versions differ
//! only in signature:
//!
//! - v2: no cost table; NCCL asks for an algorithm *and* a protocol. With a hint the plugin names
//!   the hinted algorithm with the Simple protocol (the one every algorithm has; NCCL's v2 adapter
//!   then zeroes that entry's cost only if NCCL supports it).
//! - v3 to v7: the cost table is shaped ([`crate::shape::steer_cost_table`]); NCCL keeps choosing
//!   the protocol within the hinted algorithm.
//! - v6, v7: `getChunkSize` sets the hinted chunk size for allreduce with the hinted algorithm and
//!   the Simple protocol (the LL protocols' chunks are a different unit).
//! - v5+: NCCL's tuning constants are left as NCCL set them.

use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::abi::*;
use crate::follow::{self, HintFollower};
use crate::log::Logger;
use crate::shape::{covers, steer_cost_table, Shaping, Steer};

/// What NCCL keeps between `init` and `destroy`/`finalize`: one per communicator.
pub struct TunerContext {
    logger: Logger,
    follower: Option<HintFollower>,
    /// The last hint version a "cannot apply" warning was logged for (0: none).
    warned_version: AtomicU64,
}

impl TunerContext {
    fn new(abi_version: u32, n_ranks: usize, n_nodes: usize, logger: Logger) -> TunerContext {
        let follower = match follow::job_from_env() {
            Ok(None) => {
                logger.info(&format!("{} is not set: NCCL's defaults apply", follow::JOB_URL_ENV));
                None
            }
            Ok(Some(client)) => {
                let url = client.job_url().to_owned();
                match HintFollower::start(client, logger) {
                    Ok(f) => {
                        logger.info(&format!("tuner v{abi_version} for {n_ranks} ranks on {n_nodes} nodes follows the hints of {url}"));
                        Some(f)
                    }
                    Err(e) => {
                        logger.warn(&format!("{e}; NCCL's defaults apply"));
                        None
                    }
                }
            }
            Err(e) => {
                logger.warn(&format!("{e}; NCCL's defaults apply"));
                None
            }
        };
        TunerContext { logger, follower, warned_version: AtomicU64::new(0) }
    }

    /// The hint that applies to `coll` now, if any.
    fn shaping(&self, coll: NcclFunc) -> Option<Shaping> {
        if !covers(coll) {
            return None;
        }
        self.follower.as_ref()?.current()
    }

    fn warn_once(&self, version: u64, msg: &str) {
        if self.warned_version.swap(version, Ordering::Relaxed) != version {
            self.logger.warn(msg);
        }
    }
}

unsafe fn context<'a>(ctx: *mut c_void) -> Option<&'a TunerContext> {
    unsafe { ctx.cast::<TunerContext>().as_ref() }
}

/// Runs an entry point, turning a panic into `on_panic` instead of unwinding into C.
fn guarded(on_panic: NcclResult, f: impl FnOnce() -> NcclResult) -> NcclResult {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(on_panic)
}

unsafe fn init_common(abi_version: u32, n_ranks: usize, n_nodes: usize, log: DebugLogger, out: *mut *mut c_void) -> NcclResult {
    if out.is_null() {
        return NCCL_INVALID_ARGUMENT;
    }
    guarded(NCCL_INTERNAL_ERROR, || {
        let ctx = Box::new(TunerContext::new(abi_version, n_ranks, n_nodes, Logger(log)));
        unsafe { *out = Box::into_raw(ctx).cast() };
        NCCL_SUCCESS
    })
}

/// Shapes a cost table (v3+) and sets the channel count; always `ncclSuccess` (fail open).
unsafe fn coll_info_table(ctx: *mut c_void, coll: NcclFunc, table: *mut *mut f32, num_algo: c_int, num_proto: c_int, n_channels: *mut c_int) -> NcclResult {
    guarded(NCCL_SUCCESS, || {
        let Some(ctx) = (unsafe { context(ctx) }) else { return NCCL_SUCCESS };
        let Some(s) = ctx.shaping(coll) else { return NCCL_SUCCESS };
        let (Ok(na), Ok(np)) = (usize::try_from(num_algo), usize::try_from(num_proto)) else { return NCCL_SUCCESS };
        if table.is_null() || na == 0 || np == 0 || na > 64 || np > 64 {
            ctx.warn_once(s.version, &format!("cost table {num_algo}x{num_proto} at {table:p} is not usable; NCCL's defaults apply"));
            return NCCL_SUCCESS;
        }
        // NCCL passes a contiguous float[numAlgo][numProto] cast to float** (see abi.rs).
        let costs = unsafe { std::slice::from_raw_parts_mut(table.cast::<f32>(), na * np) };
        match steer_cost_table(costs, na, np, s.algorithm) {
            Steer::Steered { .. } => {}
            Steer::HintedUnsupported | Steer::BadShape => ctx.warn_once(
                s.version,
                &format!("hint v{}: NCCL cannot run algorithm {} for this allreduce; NCCL's choice stands", s.version, s.algorithm),
            ),
        }
        if let (Some(c), false) = (s.channels, n_channels.is_null()) {
            unsafe { *n_channels = c };
        }
        NCCL_SUCCESS
    })
}

unsafe extern "C" fn init_v2(n_ranks: usize, n_nodes: usize, log: DebugLogger, ctx: *mut *mut c_void) -> NcclResult {
    unsafe { init_common(2, n_ranks, n_nodes, log, ctx) }
}

unsafe extern "C" fn init_v3(n_ranks: usize, n_nodes: usize, log: DebugLogger, ctx: *mut *mut c_void) -> NcclResult {
    unsafe { init_common(3, n_ranks, n_nodes, log, ctx) }
}

unsafe extern "C" fn init_v4(n_ranks: usize, n_nodes: usize, log: DebugLogger, ctx: *mut *mut c_void) -> NcclResult {
    unsafe { init_common(4, n_ranks, n_nodes, log, ctx) }
}

unsafe extern "C" fn init_v5(ctx: *mut *mut c_void, _comm_id: u64, n_ranks: usize, n_nodes: usize, log: DebugLogger, _nvl: *mut NvlDomainInfoV5, _constants: *mut TunerConstantsV5) -> NcclResult {
    unsafe { init_common(5, n_ranks, n_nodes, log, ctx) }
}

unsafe extern "C" fn init_v6(ctx: *mut *mut c_void, _comm_id: u64, n_ranks: usize, n_nodes: usize, log: DebugLogger, _nvl: *mut NvlDomainInfoV5, _constants: *mut TunerConstantsV5) -> NcclResult {
    unsafe { init_common(6, n_ranks, n_nodes, log, ctx) }
}

unsafe extern "C" fn init_v7(ctx: *mut *mut c_void, _comm_id: u64, n_ranks: usize, n_nodes: usize, log: DebugLogger, _nvl: *mut NvlDomainInfoV5, _constants: *mut TunerConstantsV7) -> NcclResult {
    unsafe { init_common(7, n_ranks, n_nodes, log, ctx) }
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn get_coll_info_v2(
    ctx: *mut c_void,
    coll: NcclFunc,
    _n_bytes: usize,
    _coll_net_support: c_int,
    _nvls_support: c_int,
    _num_pipe_ops: c_int,
    algorithm: *mut c_int,
    protocol: *mut c_int,
    n_channels: *mut c_int,
) -> NcclResult {
    guarded(NCCL_SUCCESS, || {
        let Some(ctx) = (unsafe { context(ctx) }) else { return NCCL_SUCCESS };
        let Some(s) = ctx.shaping(coll) else { return NCCL_SUCCESS };
        // Both or neither: NCCL ignores an algorithm without a protocol.
        if !algorithm.is_null() && !protocol.is_null() {
            unsafe {
                *algorithm = s.algorithm;
                *protocol = PROTO_SIMPLE;
            }
        }
        if let (Some(c), false) = (s.channels, n_channels.is_null()) {
            unsafe { *n_channels = c };
        }
        NCCL_SUCCESS
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn get_coll_info_v3(
    ctx: *mut c_void,
    coll: NcclFunc,
    _n_bytes: usize,
    _num_pipe_ops: c_int,
    table: *mut *mut f32,
    num_algo: c_int,
    num_proto: c_int,
    n_channels: *mut c_int,
) -> NcclResult {
    unsafe { coll_info_table(ctx, coll, table, num_algo, num_proto, n_channels) }
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn get_coll_info_v4(
    ctx: *mut c_void,
    coll: NcclFunc,
    _n_bytes: usize,
    _num_pipe_ops: c_int,
    table: *mut *mut f32,
    num_algo: c_int,
    num_proto: c_int,
    _reg_buff: c_int,
    n_channels: *mut c_int,
) -> NcclResult {
    unsafe { coll_info_table(ctx, coll, table, num_algo, num_proto, n_channels) }
}

unsafe extern "C" fn get_chunk_size(ctx: *mut c_void, coll: NcclFunc, _n_bytes: usize, algo: c_int, proto: c_int, _n_channels: c_int, chunk_size: *mut usize) -> NcclResult {
    guarded(NCCL_SUCCESS, || {
        let Some(ctx) = (unsafe { context(ctx) }) else { return NCCL_SUCCESS };
        let Some(s) = ctx.shaping(coll) else { return NCCL_SUCCESS };
        if let (Some(c), true, true, false) = (s.chunk_bytes, algo == s.algorithm, proto == PROTO_SIMPLE, chunk_size.is_null()) {
            unsafe { *chunk_size = c };
        }
        NCCL_SUCCESS
    })
}

/// `destroy` (v2-v4) and `finalize` (v5+): stops the hint thread (bounded) and frees the context.
unsafe extern "C" fn destroy(ctx: *mut c_void) -> NcclResult {
    if ctx.is_null() {
        return NCCL_SUCCESS;
    }
    guarded(NCCL_INTERNAL_ERROR, || {
        drop(unsafe { Box::from_raw(ctx.cast::<TunerContext>()) });
        NCCL_SUCCESS
    })
}

const NAME: *const c_char = c"ringside".as_ptr();

#[unsafe(no_mangle)]
#[allow(non_upper_case_globals)]
pub static ncclTunerPlugin_v2: TunerV2 = TunerV2 { name: NAME, init: init_v2, get_coll_info: get_coll_info_v2, destroy };

#[unsafe(no_mangle)]
#[allow(non_upper_case_globals)]
pub static ncclTunerPlugin_v3: TunerV3 = TunerV3 { name: NAME, init: init_v3, get_coll_info: get_coll_info_v3, destroy };

#[unsafe(no_mangle)]
#[allow(non_upper_case_globals)]
pub static ncclTunerPlugin_v4: TunerV4 = TunerV4 { name: NAME, init: init_v4, get_coll_info: get_coll_info_v4, destroy };

#[unsafe(no_mangle)]
#[allow(non_upper_case_globals)]
pub static ncclTunerPlugin_v5: TunerV5 = TunerV5 { name: NAME, init: init_v5, get_coll_info: get_coll_info_v4, finalize: destroy };

#[unsafe(no_mangle)]
#[allow(non_upper_case_globals)]
pub static ncclTunerPlugin_v6: TunerV6 =
    TunerV6 { name: NAME, init: init_v6, get_coll_info: get_coll_info_v4, finalize: destroy, get_chunk_size: Some(get_chunk_size) };

#[unsafe(no_mangle)]
#[allow(non_upper_case_globals)]
pub static ncclTunerPlugin_v7: TunerV7 =
    TunerV7 { name: NAME, init: init_v7, get_coll_info: get_coll_info_v4, finalize: destroy, get_chunk_size: Some(get_chunk_size) };
