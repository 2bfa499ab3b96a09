//! Helpers shared by the root-only integration tests (T2).
use std::{
    process::Child,
    time::{Duration, Instant},
};

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

/// Stops a process the way the agent is meant to be stopped: SIGTERM, then up to `grace` for it to
/// exit, then SIGKILL. Returns whether it exited on its own with success.
pub fn stop_child(child: &mut Child, grace: Duration) -> bool {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return status.success();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    false
}

// Only the closed-loop tests use these; the others compile the module too.
#[allow(dead_code)]
pub mod adapt;
// The agent's start, stop and /metrics for the tests that run it directly (t2_agent, t2_mirror).
#[allow(dead_code)]
pub mod agent;

// Only the IPU tests use it; the others compile the module too.
#[allow(dead_code)]
pub mod ipu_agent;
