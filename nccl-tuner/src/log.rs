//! Messages through the logger NCCL passes to `init`, so they appear in NCCL's own log
//! (`NCCL_DEBUG=INFO`, subsystem `TUNING`). Nothing is logged per collective call: only state
//! changes (a new hint, the job gone, the agent unreachable) and errors.

use std::ffi::{c_int, CString};

use crate::abi::{DebugLogger, LOG_INFO, LOG_WARN, SUBSYS_INIT, SUBSYS_TUNING};

/// NCCL's logger, or nothing when NCCL passed NULL.
#[derive(Clone, Copy)]
pub struct Logger(pub DebugLogger);

// A C function pointer; NCCL's logger is callable from any thread.
unsafe impl Send for Logger {}
unsafe impl Sync for Logger {}

impl Logger {
    pub fn info(&self, msg: &str) {
        self.log(LOG_INFO, msg);
    }

    pub fn warn(&self, msg: &str) {
        self.log(LOG_WARN, msg);
    }

    fn log(&self, level: c_int, msg: &str) {
        let Some(f) = self.0 else { return };
        let text = CString::new(format!("TUNER/ringside: {}", msg.replace('\0', " "))).unwrap_or_default();
        // The message goes through "%s": it is data, never a format string.
        unsafe { f(level, SUBSYS_INIT | SUBSYS_TUNING, c"ringside-nccl-tuner".as_ptr(), line!() as c_int, c"%s".as_ptr(), text.as_ptr()) };
    }
}
