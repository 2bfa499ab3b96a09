//! Helpers shared by the root-only integration tests (T2).
use std::time::{Duration, Instant};

/// Calls `check` every `poll` until it returns `Some`, for at most `limit`; panics naming `what`
/// when the time runs out (every wait in a test is bounded).
pub fn wait_for<T>(limit: Duration, poll: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check() {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {limit:?} waiting for {what}");
        }
        std::thread::sleep(poll);
    }
}

// Only the closed-loop tests use these; the others compile the module too.
#[allow(dead_code)]
pub mod adapt;
