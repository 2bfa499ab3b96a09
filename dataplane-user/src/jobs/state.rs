//! The jobs state file: the jobs registered through `POST /v1/jobs`, kept in `state_dir` so that a
//! tenant's job id and token survive an agent restart (and a crash).
//!
//! Invariants:
//! - the file holds each job's registration (as validated), id, registration time and the SHA-256
//!   of its tenant token, never the token ([`super::tokens`]); it is created mode 0600 because the
//!   hashes are enough to test token guesses offline;
//! - it is rewritten whole, atomically (a temporary file in the same directory, fsynced, renamed
//!   over the old one, then the directory fsynced), at every registration and removal, so a
//!   SIGKILL right after a `201` keeps the job;
//! - a missing file is a fresh start; an unreadable, corrupt or other-version file is reported,
//!   moved aside (never deleted: `jobs.json.corrupt-<unix ms>`) and also a fresh start: the agent
//!   never refuses to start over its own state. A job in a good file that no longer validates is
//!   dropped by the catalog with a warning ([`super::JobCatalog::restore`]).
use std::path::{Path, PathBuf};

use ringside_client::JobRegistration;
use serde::{Deserialize, Serialize};

use super::tokens::TokenHash;

/// File name of the registered jobs inside `state_dir`.
pub const JOBS_FILE: &str = "jobs.json";
/// Version of the jobs file format.
pub const JOBS_VERSION: u32 = 1;

/// One registered job as the file stores it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PersistedJob {
    pub id: String,
    pub registered_unix_ms: u64,
    /// SHA-256 of the tenant token, 64 lowercase hex digits.
    pub token_sha256: String,
    /// The registration as accepted (members trimmed); validated again on load.
    pub registration: JobRegistration,
}

impl PersistedJob {
    /// The token hash, if `token_sha256` is 64 hex digits.
    pub fn token_hash(&self) -> Option<TokenHash> {
        TokenHash::from_hex(&self.token_sha256)
    }
}

/// The file: registered jobs in registration order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PersistedJobs {
    pub version: u32,
    pub saved_unix_ms: u64,
    pub jobs: Vec<PersistedJob>,
}

/// Why the jobs file could not be used or written.
#[derive(Debug, thiserror::Error)]
pub enum JobsFileError {
    #[error("cannot read {path}: {source}; starting with no registered jobs (fix its permissions and restart to get them back)")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is corrupt ({message}); moved aside to {moved_to}, starting with no registered jobs (tenants must register again)")]
    Corrupt { path: PathBuf, message: String, moved_to: String },
    #[error("cannot write {path}: {source}; registered jobs will not survive a restart until `state_dir` is writable")]
    Write { path: PathBuf, source: std::io::Error },
}

/// Path of the jobs file in `dir`.
pub fn jobs_path(dir: &Path) -> PathBuf {
    dir.join(JOBS_FILE)
}

/// Writes the jobs file atomically, mode 0600. Creates `dir` if needed.
pub fn save(dir: &Path, state: &PersistedJobs) -> Result<(), JobsFileError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = jobs_path(dir);
    let werr = |source| JobsFileError::Write { path: path.clone(), source };
    std::fs::create_dir_all(dir).map_err(werr)?;
    let tmp = dir.join(format!(".{JOBS_FILE}.tmp"));
    let text = serde_json::to_vec_pretty(state).expect("jobs serialize");
    // A leftover temporary file of a crashed write may have other permissions: start over.
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).map_err(werr)?;
    f.write_all(&text).and_then(|()| f.sync_all()).map_err(werr)?;
    drop(f);
    std::fs::rename(&tmp, &path).map_err(werr)?;
    // The rename itself is durable only once the directory is synced (a crash could otherwise
    // bring back the old file after the tenant got its 201).
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(werr)
}

/// Loads the jobs file: `Ok(None)` if there is none. A corrupt or other-version file is renamed to
/// `jobs.json.corrupt-<now_unix_ms>` (an earlier one is kept) and reported as an error.
pub fn load(dir: &Path, now_unix_ms: u64) -> Result<Option<PersistedJobs>, JobsFileError> {
    let path = jobs_path(dir);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(JobsFileError::Read { path, source }),
    };
    // The version first, so a file of another version says so rather than failing on a field.
    #[derive(Deserialize)]
    struct Version {
        version: u32,
    }
    let parsed = serde_json::from_slice::<Version>(&bytes)
        .map_err(|e| e.to_string())
        .and_then(|v| match v.version {
            JOBS_VERSION => serde_json::from_slice::<PersistedJobs>(&bytes).map_err(|e| e.to_string()),
            other => Err(format!("version {other} where {JOBS_VERSION} was expected")),
        });
    match parsed {
        Ok(s) => Ok(Some(s)),
        Err(message) => {
            let aside = dir.join(format!("{JOBS_FILE}.corrupt-{now_unix_ms}"));
            let moved_to = match std::fs::rename(&path, &aside) {
                Ok(()) => aside.display().to_string(),
                Err(e) => format!("nowhere ({e})"),
            };
            Err(JobsFileError::Corrupt { path, message, moved_to })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::tests::tempdir;
    use std::os::unix::fs::PermissionsExt as _;

    fn job(id: &str, name: &str) -> PersistedJob {
        PersistedJob {
            id: id.into(),
            registered_unix_ms: 1_700_000_000_000,
            token_sha256: "ab".repeat(32),
            registration: crate::jobs::catalog::tests::registration(name, &["10.77.0.0/24"]),
        }
    }

    #[test]
    fn round_trip_is_atomic_and_private() {
        let dir = tempdir("jobs-roundtrip");
        assert!(load(&dir, 1).unwrap().is_none(), "missing file: a fresh start");
        let state = PersistedJobs { version: JOBS_VERSION, saved_unix_ms: 5, jobs: vec![job("j-000000000001", "a"), job("j-000000000002", "b")] };
        save(&dir, &state).unwrap();
        assert!(!dir.join(format!(".{JOBS_FILE}.tmp")).exists(), "temporary file renamed");
        let mode = std::fs::metadata(jobs_path(&dir)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "token hashes are readable by the agent's user only");
        assert_eq!(load(&dir, 1).unwrap().unwrap(), state);
        // Rewritten whole: a removal leaves one job.
        let one = PersistedJobs { jobs: vec![job("j-000000000002", "b")], ..state };
        save(&dir, &one).unwrap();
        assert_eq!(load(&dir, 1).unwrap().unwrap().jobs, one.jobs);
        // A stale temporary file of a crashed write does not stop the next save.
        std::fs::write(dir.join(format!(".{JOBS_FILE}.tmp")), b"partial").unwrap();
        save(&dir, &one).unwrap();
        assert_eq!(load(&dir, 1).unwrap().unwrap().jobs.len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn corrupt_or_other_version_is_moved_aside_not_deleted() {
        let dir = tempdir("jobs-corrupt");
        std::fs::write(jobs_path(&dir), b"{\"version\": 1, \"jobs\": [tru").unwrap();
        let e = load(&dir, 11).unwrap_err();
        assert!(matches!(e, JobsFileError::Corrupt { .. }), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("jobs.json") && msg.contains("corrupt") && msg.contains("starting with no registered jobs"), "{msg}");
        assert!(!jobs_path(&dir).exists());
        assert_eq!(std::fs::read(dir.join("jobs.json.corrupt-11")).unwrap(), b"{\"version\": 1, \"jobs\": [tru", "kept byte for byte");
        // Another version: named in the error, moved aside next to the first (which stays).
        std::fs::write(jobs_path(&dir), b"{\"version\": 2, \"saved_unix_ms\": 0, \"jobs\": [], \"new_field\": 1}").unwrap();
        let e = load(&dir, 12).unwrap_err().to_string();
        assert!(e.contains("version 2 where 1 was expected"), "{e}");
        assert!(dir.join("jobs.json.corrupt-11").exists() && dir.join("jobs.json.corrupt-12").exists());
        // A file of this version with a malformed job is corrupt too (no half-loaded state).
        let mut bad = serde_json::to_value(PersistedJobs { version: 1, saved_unix_ms: 0, jobs: vec![job("j-1", "a")] }).unwrap();
        bad["jobs"][0]["registration"]["members"] = serde_json::json!(7);
        std::fs::write(jobs_path(&dir), serde_json::to_vec(&bad).unwrap()).unwrap();
        assert!(matches!(load(&dir, 13), Err(JobsFileError::Corrupt { .. })));
        // Then a fresh save works.
        save(&dir, &PersistedJobs { version: JOBS_VERSION, saved_unix_ms: 0, jobs: vec![] }).unwrap();
        assert_eq!(load(&dir, 14).unwrap().unwrap().jobs.len(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unwritable_dir_is_a_write_error_naming_the_file() {
        // A regular file where the directory should be: create_dir_all fails even for root.
        let dir = tempdir("jobs-unwritable");
        let not_a_dir = dir.join("file");
        std::fs::write(&not_a_dir, b"").unwrap();
        let e = save(&not_a_dir, &PersistedJobs { version: 1, saved_unix_ms: 0, jobs: vec![] }).unwrap_err().to_string();
        assert!(e.contains("jobs.json") && e.contains("state_dir"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
