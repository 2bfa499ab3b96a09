//! Keeps a job's latest hint in memory for `getCollInfo`: a background thread polls
//! `GET {RINGSIDE_JOB_URL}/hints` through [`ringside_client::JobClient`].
//!
//! Invariants:
//! - Reading the hint ([`HintFollower::current`]) never touches the network: it copies a small
//!   `Copy` value under a mutex that the thread holds only to replace it.
//! - A hint applies until it expires (`expires_at`; the agent renews a live job's hint, and every
//!   poll picks the renewal up), the job is gone (404; the agent answers a deleted job's tenant
//!   token with 401) or the token is refused (401/403: polling stops).
//!   While the agent is unreachable the last hint stays until it expires; then NCCL's defaults.
//! - Stopping is bounded: [`HintFollower::stop`] sets a cancel flag the thread checks at least
//!   every 50 ms between polls, and a poll itself is bounded by [`REQUEST_TIMEOUT`]; `stop`
//!   waits at most [`STOP_WAIT`] for the thread to end, then joins it.
//! - Polling, not the SSE stream: a stream read blocks until the next keep-alive (15 s), which
//!   would hold NCCL's communicator teardown that long; a poll every [`POLL_INTERVAL`] costs one
//!   small request and bounds teardown by [`REQUEST_TIMEOUT`]. Failed polls back off up to
//!   [`MAX_BACKOFF`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use ringside_client::{ClientConfig, ClientError, JobClient};

use crate::log::Logger;
use crate::shape::Shaping;

/// Environment variable naming the job's base URL, `http://HOST:PORT/v1/jobs/ID`.
pub const JOB_URL_ENV: &str = "RINGSIDE_JOB_URL";
/// Environment variable holding the job's tenant token (the Python package and `ringside-rank` read it too).
pub const TOKEN_ENV: &str = "RINGSIDE_TOKEN";

/// Time between successful polls.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Longest wait between failed polls (doubling from [`POLL_INTERVAL`]).
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// Bound of one poll (connect included).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound of [`HintFollower::stop`]'s wait for the thread.
pub const STOP_WAIT: Duration = Duration::from_secs(5);

/// Why the plugin cannot follow a job's hints (it then leaves NCCL's defaults).
#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    #[error("{JOB_URL_ENV} is set but {TOKEN_ENV} is not: set {TOKEN_ENV} to the job's tenant token")]
    MissingToken,
    #[error("{JOB_URL_ENV}: {0}; set it to the job's url, http://HOST:PORT/v1/jobs/ID (or https://)")]
    BadUrl(#[source] ClientError),
    /// `RINGSIDE_CA_FILE` (for an `https://` agent) cannot be used.
    #[error("{0}")]
    Tls(#[source] ClientError),
    #[error("cannot start the hint thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// The job to follow, from the environment: `Ok(None)` when `RINGSIDE_JOB_URL` is unset or empty.
pub fn job_from_env() -> Result<Option<JobClient>, FollowError> {
    let Some(url) = std::env::var(JOB_URL_ENV).ok().filter(|u| !u.trim().is_empty()) else {
        return Ok(None);
    };
    let token = std::env::var(TOKEN_ENV).ok().filter(|t| !t.trim().is_empty()).ok_or(FollowError::MissingToken)?;
    let config = ClientConfig { connect_timeout: REQUEST_TIMEOUT / 2, request_timeout: REQUEST_TIMEOUT, ..ClientConfig::default() };
    JobClient::with_config(url.trim(), token.trim(), config).map(Some).map_err(|e| match e {
        ClientError::CaFile { .. } => FollowError::Tls(e),
        e => FollowError::BadUrl(e),
    })
}

pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

type Slot = Arc<Mutex<Option<Shaping>>>;

fn read(slot: &Slot) -> Option<Shaping> {
    *slot.lock().unwrap_or_else(|p| p.into_inner())
}

fn write(slot: &Slot, v: Option<Shaping>) {
    *slot.lock().unwrap_or_else(|p| p.into_inner()) = v;
}

/// The background poller and the hint it last saw.
pub struct HintFollower {
    slot: Slot,
    cancel: Arc<AtomicBool>,
    /// Disconnected when the thread ends (its sender is dropped).
    ended: mpsc::Receiver<()>,
    thread: Option<JoinHandle<()>>,
    logger: Logger,
}

impl HintFollower {
    /// Starts polling `client`'s job. Does not touch the network itself.
    pub fn start(client: JobClient, logger: Logger) -> Result<HintFollower, FollowError> {
        let slot: Slot = Arc::default();
        let cancel = Arc::new(AtomicBool::new(false));
        let (ended_tx, ended) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("ringside-hints".into())
            .spawn({
                let (slot, cancel) = (slot.clone(), cancel.clone());
                move || {
                    let _ended = ended_tx;
                    poll_loop(&client, &slot, &cancel, logger);
                }
            })
            .map_err(FollowError::Thread)?;
        Ok(HintFollower { slot, cancel, ended, thread: Some(thread), logger })
    }

    /// The hint in force now, if any. No network, no waiting beyond a short lock.
    pub fn current(&self) -> Option<Shaping> {
        read(&self.slot).filter(|s| s.is_live(unix_ms()))
    }

    /// Stops the thread: waits at most [`STOP_WAIT`], then joins it; a thread still running then
    /// (a poll stuck past its own timeout) is left detached and logged.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
        let Some(thread) = self.thread.take() else { return };
        match self.ended.recv_timeout(STOP_WAIT) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                let _ = thread.join();
            }
            Err(RecvTimeoutError::Timeout) => {
                self.logger.warn(&format!("hint thread still running after {STOP_WAIT:?}; leaving it detached"));
            }
        }
    }
}

impl Drop for HintFollower {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// Sleeps `d` in 50 ms steps; returns whether `cancel` was set.
fn sleep_cancellable(cancel: &AtomicBool, d: Duration) -> bool {
    let until = Instant::now() + d;
    loop {
        if cancel.load(Ordering::Relaxed) {
            return true;
        }
        let now = Instant::now();
        if now >= until {
            return false;
        }
        std::thread::sleep((until - now).min(Duration::from_millis(50)));
    }
}

/// What the thread last reported, so each state change is logged once.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Seen {
    Nothing,
    Hint(u64),
    Unreachable,
    Gone,
    Expired(u64),
}

fn poll_loop(client: &JobClient, slot: &Slot, cancel: &AtomicBool, logger: Logger) {
    let url = client.job_url().to_owned();
    let mut seen = Seen::Nothing;
    let mut failures: u32 = 0;
    loop {
        if cancel.load(Ordering::Relaxed) {
            return;
        }
        let next = match client.hint() {
            Ok(h) => {
                failures = 0;
                let s = Shaping::from_hint(&h);
                write(slot, Some(s));
                if seen != Seen::Hint(h.version) {
                    logger.info(&format!(
                        "hint v{} from {url}: allreduce algorithm {} (NCCL {}), channels {}, chunk {} B; codec {} has no NCCL counterpart",
                        h.version,
                        h.algorithm,
                        if s.algorithm == crate::abi::ALGO_RING { "RING" } else { "TREE" },
                        h.channels,
                        h.chunk_bytes,
                        h.compression
                    ));
                    seen = Seen::Hint(h.version);
                }
                POLL_INTERVAL
            }
            Err(e) if matches!(e.status(), Some(401 | 403)) => {
                write(slot, None);
                // The agent checks the token before the job id, so a deleted job's tenant token
                // is refused too.
                logger.warn(&format!("{e}; the job was deleted or {TOKEN_ENV} is wrong: NCCL's defaults apply, polling stops"));
                return;
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                if e.status() == Some(404) {
                    write(slot, None);
                    if seen != Seen::Gone {
                        logger.info(&format!("{e}; NCCL's defaults apply"));
                        seen = Seen::Gone;
                    }
                } else {
                    // Unreachable: keep the last hint until it expires.
                    if let Some(old) = read(slot).filter(|s| !s.is_live(unix_ms())) {
                        write(slot, None);
                        logger.info(&format!("hint v{} expired while the agent is unreachable; NCCL's defaults apply", old.version));
                        seen = Seen::Expired(old.version);
                    } else if !matches!(seen, Seen::Unreachable | Seen::Expired(_)) {
                        logger.warn(&format!("{e}; keeping the last hint until it expires, retrying"));
                        seen = Seen::Unreachable;
                    }
                }
                POLL_INTERVAL.saturating_mul(1 << failures.min(4)).min(MAX_BACKOFF)
            }
        };
        if sleep_cancellable(cancel, next) {
            return;
        }
    }
}
