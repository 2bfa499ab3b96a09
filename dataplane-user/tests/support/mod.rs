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

/// A busy machine: `n` threads that each copy 32 MiB (the caches and memory bandwidth a build
/// takes) and spin on arithmetic in turn, until dropped (at most 5 minutes). Drop stops and joins
/// them.
#[allow(dead_code)]
pub struct CpuHogs {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<u64>>,
}

#[allow(dead_code)]
impl CpuHogs {
    const LIMIT: Duration = Duration::from_secs(300);

    pub fn start(n: usize) -> CpuHogs {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..n)
            .map(|i| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let started = Instant::now();
                    let mut x = i as u64 + 1;
                    let (mut a, mut b) = (vec![1u8; 32 << 20], vec![0u8; 32 << 20]);
                    while !stop.load(Ordering::Relaxed) && started.elapsed() < Self::LIMIT {
                        b.copy_from_slice(&a);
                        std::mem::swap(&mut a, &mut b);
                        x = x.wrapping_add(u64::from(a[(x as usize) % a.len()]));
                        for _ in 0..1_000_000 {
                            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                        }
                    }
                    x
                })
            })
            .collect();
        CpuHogs { stop, threads }
    }
}

impl Drop for CpuHogs {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = std::hint::black_box(t.join());
        }
    }
}
