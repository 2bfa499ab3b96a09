//! Jobs: which tenant jobs the agent watches and what each one's traffic looks like per window.
//!
//! - [`catalog`]: [`JobCatalog`], config-file and registered jobs; the only place a job is
//!   onboarded or removed;
//! - [`windows`]: [`JobSet`] (which flow belongs to which job) and the per-job detection window
//!   ([`JobSet::windows`]) built from the flow table's window;
//! - [`tokens`]: tenant and operator tokens (hashed at rest) and job ids;
//! - [`state`]: the jobs file in `state_dir` (registered jobs and token hashes across restarts).
pub mod catalog;
pub mod state;
pub mod tokens;
pub mod windows;

pub use catalog::{JobCatalog, RegisterError};
pub use tokens::TokenHash;
pub use windows::JobSet;

/// The catalog, shared by the API (which registers and removes jobs) and the analysis stage (which
/// reads the job set once per window). Its mutex guards the catalog alone, nothing else.
pub type SharedCatalog = std::sync::Arc<std::sync::Mutex<JobCatalog>>;

/// Locks the catalog; a panic elsewhere while it was held leaves a consistent catalog (every
/// method finishes its change before returning), so the lock is taken anyway.
pub fn lock(catalog: &SharedCatalog) -> std::sync::MutexGuard<'_, JobCatalog> {
    catalog.lock().unwrap_or_else(|p| p.into_inner())
}
