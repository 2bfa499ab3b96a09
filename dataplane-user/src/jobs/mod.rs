//! Jobs: which tenant jobs the agent watches and what each one's traffic looks like per window.
//!
//! - [`catalog`]: [`JobCatalog`], config-file and registered jobs; the only place a job is
//!   onboarded or removed;
//! - [`windows`]: [`JobSet`] (which flow belongs to which job) and the per-job detection window
//!   ([`JobSet::windows`]) built from the flow table's window;
//! - [`tokens`]: tenant and operator tokens (hashed at rest) and job ids.
pub mod catalog;
pub mod tokens;
pub mod windows;

pub use catalog::{JobCatalog, RegisterError};
pub use tokens::TokenHash;
pub use windows::JobSet;
