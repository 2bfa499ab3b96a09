//! The job catalog: every job the agent watches, from the config file (`[[job]]`) or registered
//! through `POST /v1/jobs`, and the tokens that guard the API.
//!
//! It is the only place that onboards or removes a job: [`JobCatalog::onboard_config_jobs`] at
//! start, [`JobCatalog::onboard`] and [`JobCatalog::remove`] for the API. Onboarding gives the job
//! its hint-board channel and baseline plan ([`crate::policy::baseline_hint`]) and, for a
//! registered job, its member prefixes in the kernel's `MATCH_PREFIXES` ([`crate::match_map`]);
//! removing undoes both.
//!
//! Invariants:
//! - Tokens are kept as hashes ([`TokenHash`]) and compared in constant time; every candidate
//!   hash is compared (no early exit), so response time does not say which prefix of a token or
//!   which job matched.
//! - Job ids are random (`j-` + 12 hex digits): an id leaks nothing about other jobs and cannot be
//!   guessed from a name.
//! - At most [`MAX_JOBS`] registered jobs; names are unique among them.
//! - The job set the analysis stage uses ([`JobCatalog::job_set`]) lists config-file jobs first,
//!   then registered jobs in registration order, so a flow belongs to exactly one job.
//! - With a state directory ([`JobCatalog::with_state_dir`]) every successful registration and
//!   removal rewrites the jobs file ([`super::state`]) before the API answers, and
//!   [`JobCatalog::restore`] onboards its jobs at start like new registrations: a tenant's job id
//!   and token survive a restart or a crash. Config-file jobs are never written there.
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use dataplane_common::PrefixKey;
use std::path::{Path, PathBuf};

use ringside_client::{JobRegistration, JobView, PortRange};

use super::{
    state::{self, PersistedJob, PersistedJobs, JOBS_VERSION},
    tokens::{new_job_id, new_token, RandomnessError, TokenHash, TENANT_TOKEN_PREFIX},
    windows::{JobSet, JobSpec, DEFAULT_JOB},
};
use crate::{
    config::{MemberSpec, PortSpec, PrefixSpec},
    hint_board::HintBoard,
    match_map::{self, MatchMapError},
    policy::{baseline_hint, restart_first_version, FIRST_VERSION},
};

/// Most registered jobs (each costs a hint channel, a job window per detection window and trie
/// entries in the kernel).
pub const MAX_JOBS: usize = 64;
/// Most members (addresses or prefixes) of one job.
pub const MAX_MEMBERS: usize = 64;
/// Most port ranges per protocol of one job.
pub const MAX_PORT_RANGES_PER_JOB: usize = 16;

/// Why a registration was refused. Each maps to one HTTP status (see `api`).
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error("invalid `{field}`: {message}")]
    Invalid { field: &'static str, message: String },
    #[error("a job named `{name}` is already registered (or is a [[job]] of the config file); pick another name or DELETE /v1/jobs/{{id}} first")]
    NameTaken { name: String },
    #[error("{max} jobs are registered, the most this agent holds; delete finished jobs (DELETE /v1/jobs/{{id}}) first")]
    Full { max: usize },
    #[error(transparent)]
    Randomness(#[from] RandomnessError),
    #[error("cannot monitor the job's members: {0}")]
    Kernel(MatchMapError),
}

/// Why a job could not be removed.
#[derive(Debug, thiserror::Error)]
pub enum RemoveError {
    #[error("job `{id}` comes from the config file ([[job]]); remove it there and restart the agent")]
    ConfigJob { id: String },
    #[error("no registered job with id `{id}`; list them with GET /v1/jobs")]
    Unknown { id: String },
}

/// Whether `name` is 1-64 characters of `[A-Za-z0-9._-]`.
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// A registration checked and turned into the agent's types.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidRegistration {
    pub view_members: Vec<String>,
    pub spec: JobSpec,
}

/// Checks a registration (everything but name uniqueness and the cap); the error names the field.
pub fn validate(reg: &JobRegistration) -> Result<ValidRegistration, RegisterError> {
    let invalid = |field, message: String| RegisterError::Invalid { field, message };
    if !valid_name(&reg.name) {
        return Err(invalid("name", format!("{:?} must be 1-64 characters of A-Z a-z 0-9 . _ -", reg.name)));
    }
    if reg.members.is_empty() {
        return Err(invalid("members", "list at least one address or CIDR prefix (\"10.77.0.2\", \"10.77.0.0/24\")".into()));
    }
    if reg.members.len() > MAX_MEMBERS {
        return Err(invalid("members", format!("{} given, at most {MAX_MEMBERS}; use CIDR prefixes", reg.members.len())));
    }
    let mut members = Vec::with_capacity(reg.members.len());
    for (i, m) in reg.members.iter().enumerate() {
        let spec: MemberSpec = m.trim().parse().map_err(|e: String| RegisterError::Invalid { field: "members", message: format!("[{i}]: {e}") })?;
        if spec.0.len == 0 {
            return Err(invalid("members", format!("[{i}]: `{m}` covers every address; list the job's own hosts or prefixes")));
        }
        members.push(spec.0);
    }
    let ports = |field: &'static str, r: &[PortRange]| -> Result<Option<Vec<PortSpec>>, RegisterError> {
        if r.len() > MAX_PORT_RANGES_PER_JOB {
            return Err(RegisterError::Invalid { field, message: format!("{} ranges given, at most {MAX_PORT_RANGES_PER_JOB}", r.len()) });
        }
        Ok((!r.is_empty()).then(|| r.iter().map(|p| PortSpec { lo: p.lo, hi: p.hi }).collect()))
    };
    let tcp_ports = ports("tcp_ports", &reg.tcp_ports)?;
    let udp_ports = ports("udp_ports", &reg.udp_ports)?;
    if reg.gradient_bytes == Some(0) {
        return Err(invalid("gradient_bytes", "must be greater than 0 (omit it to let ringside estimate it)".into()));
    }
    reg.constraints.validate().map_err(|m| invalid("constraints", m))?;
    Ok(ValidRegistration {
        view_members: reg.members.iter().map(|m| m.trim().to_owned()).collect(),
        spec: JobSpec {
            name: String::new(),
            members,
            tcp_ports,
            udp_ports,
            gradient_bytes: reg.gradient_bytes,
            constraints: reg.constraints.clone(),
        },
    })
}

#[derive(Debug, Clone)]
struct RegisteredJob {
    view: JobView,
    spec: JobSpec,
    token: TokenHash,
}

/// Problems with the jobs file, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JobsFileCounters {
    /// The file was unreadable or corrupt at start (moved aside), or held jobs that were dropped.
    pub load_errors: u64,
    /// Failed writes: the last registration or removal may not survive a restart.
    pub save_errors: u64,
}

/// Config-file and registered jobs, the operator tokens, and the prefixes the config file already
/// monitors.
#[derive(Debug)]
pub struct JobCatalog {
    /// The `[[job]]`s, in file order.
    config_jobs: Vec<JobSpec>,
    /// By id; `order` keeps registration order (the match order).
    jobs: BTreeMap<String, RegisteredJob>,
    order: Vec<String>,
    operators: Vec<TokenHash>,
    /// `[match] prefixes` as trie keys: never removed from `MATCH_PREFIXES` on unregister.
    static_prefixes: Vec<PrefixKey>,
    max_jobs: usize,
    /// Where the jobs file lives; `None`: registered jobs are not persisted (tests, tools).
    state_dir: Option<PathBuf>,
    pub file_counters: JobsFileCounters,
}

impl Default for JobCatalog {
    /// No jobs and no operator token (nothing but the open endpoints is reachable).
    fn default() -> Self {
        JobCatalog::new(Vec::new(), Vec::new())
    }
}

impl JobCatalog {
    pub fn new(operators: Vec<TokenHash>, static_prefixes: Vec<PrefixKey>) -> Self {
        JobCatalog {
            config_jobs: Vec::new(),
            jobs: BTreeMap::new(),
            order: Vec::new(),
            operators,
            static_prefixes,
            max_jobs: MAX_JOBS,
            state_dir: None,
            file_counters: JobsFileCounters::default(),
        }
    }

    /// With the config file's `[[job]]`s (onboard them with [`JobCatalog::onboard_config_jobs`]).
    pub fn with_config_jobs(mut self, jobs: &JobSet) -> Self {
        self.config_jobs = jobs.specs().to_vec();
        self
    }

    /// Persists registered jobs in `dir`'s jobs file (load them with [`JobCatalog::restore`]).
    pub fn with_state_dir(mut self, dir: PathBuf) -> Self {
        self.state_dir = Some(dir);
        self
    }

    /// Names of the config-file jobs (the implicit [`DEFAULT_JOB`] when there are none).
    pub fn config_job_names(&self) -> Vec<String> {
        JobSet::from_specs(self.config_jobs.clone()).names()
    }

    /// The jobs the policy plans: config-file jobs and registered ones (each has a hint-board
    /// channel); never the implicit or catch-all [`DEFAULT_JOB`].
    pub fn planned_jobs(&self) -> BTreeSet<String> {
        self.config_jobs.iter().map(|j| j.name.clone()).chain(self.order.iter().cloned()).collect()
    }

    /// Onboards the config-file jobs: each gets a hint-board channel and the baseline plan, like a
    /// registered job, so the policy plans them and the operator reads their hints. Called at
    /// start, with the start time: a previous run may have published hints for the same names, so
    /// their versions start at [`restart_first_version`], above that run's.
    pub fn onboard_config_jobs(&self, board: &HintBoard, now_unix_ms: u64) {
        for spec in &self.config_jobs {
            board.ensure_job(&spec.name);
            if board.latest(&spec.name).is_none() {
                if let Err(e) = board.publish(baseline_hint(&spec.name, restart_first_version(now_unix_ms), now_unix_ms)) {
                    tracing::warn!("{e}");
                }
            }
        }
    }

    /// Onboards a registered job: checks and records it ([`JobCatalog::register`]), inserts its
    /// prefixes into the kernel trie under `pin_dir` (`None`: no program loaded, the kernel is not
    /// touched), and publishes its baseline hint. A kernel failure rolls the registration back.
    /// Returns the job id and its tenant token.
    pub fn onboard(
        &mut self,
        reg: &JobRegistration,
        now_unix_ms: u64,
        pin_dir: Option<&Path>,
        board: &HintBoard,
    ) -> Result<(String, String), RegisterError> {
        let (id, token) = self.register(reg, now_unix_ms)?;
        self.onboard_registered(&id, FIRST_VERSION, now_unix_ms, pin_dir, board)?;
        self.persist(now_unix_ms);
        Ok((id, token))
    }

    /// The kernel and hint-board half of onboarding an already registered job `id`, whose baseline
    /// hint gets `first_version`; a kernel failure unregisters it.
    fn onboard_registered(
        &mut self,
        id: &str,
        first_version: u64,
        now_unix_ms: u64,
        pin_dir: Option<&Path>,
        board: &HintBoard,
    ) -> Result<(), RegisterError> {
        let id = id.to_owned();
        let keys = self.prefix_keys(&id);
        match pin_dir {
            Some(dir) => match match_map::add(dir, &keys) {
                Ok(match_map::Added::AllAddressesMatched) => {
                    tracing::debug!(job = %id, "no [match] prefixes configured: every address is already monitored");
                }
                Ok(match_map::Added::Inserted { total }) => {
                    tracing::debug!(job = %id, added = keys.len(), total, "job prefixes added to MATCH_PREFIXES");
                }
                Err(e) => {
                    self.unregister(&id);
                    tracing::warn!(job = %id, "registration rolled back: {e}");
                    return Err(RegisterError::Kernel(e));
                }
            },
            None => tracing::info!(job = %id, "job registered while no eBPF program is loaded: its prefixes are not written to the kernel"),
        }
        board.ensure_job(&id);
        if let Err(e) = board.publish(baseline_hint(&id, first_version, now_unix_ms)) {
            tracing::warn!("{e}");
        }
        Ok(())
    }

    /// Onboards the jobs of the jobs file in `state_dir` (a previous run's registrations) as if
    /// they were registered now, in their registration order, keeping their ids, names,
    /// registration times and token hashes. A job that no longer fits is dropped with a warning
    /// naming it: its name is a config-file `[[job]]`'s (the config file wins) or another
    /// restored job's, its id is taken, it no longer validates, its token hash is malformed, the
    /// cap is reached, or the kernel refused its prefixes. A bad file is moved aside (see
    /// [`super::state`]). Each restored job's hint versions start at [`restart_first_version`]
    /// of `now_unix_ms` (the start time), above every version the previous run published, so a
    /// tenant that followed the job before the restart takes its next plan. Returns how many jobs
    /// were restored. Call once, before serving.
    pub fn restore(&mut self, now_unix_ms: u64, pin_dir: Option<&Path>, board: &HintBoard) -> usize {
        let Some(dir) = self.state_dir.clone() else { return 0 };
        let file = state::jobs_path(&dir);
        let saved = match state::load(&dir, now_unix_ms) {
            Ok(Some(saved)) => saved,
            Ok(None) => return 0,
            Err(e) => {
                tracing::warn!("{e}");
                self.file_counters.load_errors += 1;
                return 0;
            }
        };
        let config_names: BTreeSet<String> = self.config_jobs.iter().map(|j| j.name.clone()).collect();
        let (mut restored, mut dropped) = (0, 0);
        for job in saved.jobs {
            let (id, name) = (job.id.clone(), job.registration.name.clone());
            match self.restore_one(job, &config_names, now_unix_ms, pin_dir, board) {
                Ok(()) => restored += 1,
                Err(why) => {
                    dropped += 1;
                    tracing::warn!(job = %id, name = %name, file = %file.display(), "registered job not restored: {why}");
                }
            }
        }
        if dropped > 0 {
            self.file_counters.load_errors += 1;
        }
        tracing::info!(restored, dropped, file = %file.display(), "registered jobs restored from the previous run");
        restored
    }

    fn restore_one(
        &mut self,
        job: PersistedJob,
        config_names: &BTreeSet<String>,
        now_unix_ms: u64,
        pin_dir: Option<&Path>,
        board: &HintBoard,
    ) -> Result<(), String> {
        let reg = &job.registration;
        if config_names.contains(&reg.name) {
            return Err(format!("the config file now has a [[job]] named `{}`, which takes precedence; register the job again under another name", reg.name));
        }
        if self.jobs.values().any(|j| j.view.name == reg.name) {
            return Err(format!("another restored job is named `{}`", reg.name));
        }
        if !job.id.starts_with("j-") || self.jobs.contains_key(&job.id) || config_names.contains(&job.id) {
            return Err(format!("its id `{}` is malformed or taken", job.id));
        }
        if self.jobs.len() >= self.max_jobs {
            return Err(RegisterError::Full { max: self.max_jobs }.to_string());
        }
        let token = job.token_hash().ok_or("its token hash is not 64 hex digits")?;
        let valid = validate(reg).map_err(|e| format!("it no longer validates: {e}"))?;
        let view = JobView {
            id: job.id.clone(),
            name: reg.name.clone(),
            members: valid.view_members,
            tcp_ports: reg.tcp_ports.clone(),
            udp_ports: reg.udp_ports.clone(),
            gradient_bytes: reg.gradient_bytes,
            constraints: reg.constraints.clone(),
            registered_unix_ms: job.registered_unix_ms,
        };
        let spec = JobSpec { name: job.id.clone(), ..valid.spec };
        self.jobs.insert(job.id.clone(), RegisteredJob { view, spec, token });
        self.order.push(job.id.clone());
        self.onboard_registered(&job.id, restart_first_version(now_unix_ms), now_unix_ms, pin_dir, board).map_err(|e| e.to_string())
    }

    /// What the jobs file holds: every registered job, in registration order.
    pub fn persisted(&self, now_unix_ms: u64) -> PersistedJobs {
        let jobs = self
            .order
            .iter()
            .filter_map(|id| self.jobs.get(id))
            .map(|j| PersistedJob {
                id: j.view.id.clone(),
                registered_unix_ms: j.view.registered_unix_ms,
                token_sha256: j.token.to_hex(),
                registration: JobRegistration {
                    name: j.view.name.clone(),
                    members: j.view.members.clone(),
                    tcp_ports: j.view.tcp_ports.clone(),
                    udp_ports: j.view.udp_ports.clone(),
                    gradient_bytes: j.view.gradient_bytes,
                    constraints: j.view.constraints.clone(),
                },
            })
            .collect();
        PersistedJobs { version: JOBS_VERSION, saved_unix_ms: now_unix_ms, jobs }
    }

    /// Rewrites the jobs file (with a state directory). A failure is logged and counted, not
    /// returned: the job is registered (or removed) in this run either way, and refusing it would
    /// not make the file writable.
    fn persist(&mut self, now_unix_ms: u64) {
        let Some(dir) = &self.state_dir else { return };
        if let Err(e) = state::save(dir, &self.persisted(now_unix_ms)) {
            self.file_counters.save_errors += 1;
            tracing::warn!("{e}");
        }
    }

    /// Removes registered job `id`: ends its hint streams and releases the prefixes nobody else
    /// needs from the kernel trie under `pin_dir`. Returns how many prefixes were released.
    pub fn remove(&mut self, id: &str, pin_dir: Option<&Path>, board: &HintBoard) -> Result<usize, RemoveError> {
        let keys = self.prefix_keys(id);
        if self.unregister(id).is_none() {
            return Err(if board.contains(id) {
                RemoveError::ConfigJob { id: id.to_owned() }
            } else {
                RemoveError::Unknown { id: id.to_owned() }
            });
        }
        // Ends every hint stream of the job.
        board.remove_job(id);
        let unneeded = self.unneeded(&keys);
        if let Some(dir) = pin_dir {
            if let Err(e) = match_map::remove(dir, &unneeded) {
                // The job is gone either way; a stale prefix only keeps counting traffic nobody reads.
                tracing::warn!(job = %id, "cannot remove the job's prefixes from MATCH_PREFIXES: {e}");
            }
        }
        self.persist(crate::clock::unix_ms());
        Ok(unneeded.len())
    }

    /// Lowers the job cap (tests).
    pub fn with_max_jobs(mut self, max: usize) -> Self {
        self.max_jobs = max;
        self
    }

    pub fn set_operators(&mut self, operators: Vec<TokenHash>) {
        self.operators = operators;
    }

    pub fn set_static_prefixes(&mut self, keys: Vec<PrefixKey>) {
        self.static_prefixes = keys;
    }

    /// Whether `token` is an operator token. Compares against every operator hash.
    pub fn is_operator(&self, token: &TokenHash) -> bool {
        self.operators.iter().fold(subtle::Choice::from(0), |acc, h| acc | h.ct_eq(token)).into()
    }

    /// Whether `token` is the tenant token of job `id` (false for an unknown id). Walks every job,
    /// so the time taken does not depend on whether `id` exists.
    pub fn is_tenant_of(&self, id: &str, token: &TokenHash) -> bool {
        self.jobs
            .iter()
            .fold(subtle::Choice::from(0), |acc, (jid, j)| acc | (subtle::Choice::from(u8::from(jid == id)) & j.token.ct_eq(token)))
            .into()
    }

    /// Whether `token` is the tenant token of some job. Compares against every job.
    pub fn is_any_tenant(&self, token: &TokenHash) -> bool {
        self.jobs.values().fold(subtle::Choice::from(0), |acc, j| acc | j.token.ct_eq(token)).into()
    }

    pub fn contains(&self, id: &str) -> bool {
        self.jobs.contains_key(id)
    }

    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// Registers a job: returns its id and its tenant token (the only time the token exists in
    /// the clear outside the tenant).
    pub fn register(&mut self, reg: &JobRegistration, now_unix_ms: u64) -> Result<(String, String), RegisterError> {
        let valid = validate(reg)?;
        // Config-file names too: the config file wins at the next start (`restore`), so such a job
        // would be dropped then.
        if self.jobs.values().any(|j| j.view.name == reg.name) || self.config_jobs.iter().any(|j| j.name == reg.name) {
            return Err(RegisterError::NameTaken { name: reg.name.clone() });
        }
        if self.jobs.len() >= self.max_jobs {
            return Err(RegisterError::Full { max: self.max_jobs });
        }
        let mut id = new_job_id()?;
        while self.jobs.contains_key(&id) {
            id = new_job_id()?;
        }
        let token = new_token(TENANT_TOKEN_PREFIX)?;
        let spec = JobSpec { name: id.clone(), ..valid.spec };
        let view = JobView {
            id: id.clone(),
            name: reg.name.clone(),
            members: valid.view_members,
            tcp_ports: reg.tcp_ports.clone(),
            udp_ports: reg.udp_ports.clone(),
            gradient_bytes: reg.gradient_bytes,
            constraints: reg.constraints.clone(),
            registered_unix_ms: now_unix_ms,
        };
        self.jobs.insert(id.clone(), RegisteredJob { view, spec, token: TokenHash::of(&token) });
        self.order.push(id.clone());
        Ok((id, token))
    }

    /// Forgets job `id`; returns its view if it was registered.
    pub fn unregister(&mut self, id: &str) -> Option<JobView> {
        let j = self.jobs.remove(id)?;
        self.order.retain(|o| o != id);
        Some(j.view)
    }

    /// Every registered job, in registration order (never tokens).
    pub fn views(&self) -> Vec<JobView> {
        self.order.iter().filter_map(|id| self.jobs.get(id)).map(|j| j.view.clone()).collect()
    }

    pub fn view(&self, id: &str) -> Option<JobView> {
        self.jobs.get(id).map(|j| j.view.clone())
    }

    pub fn spec(&self, id: &str) -> Option<&JobSpec> {
        self.jobs.get(id).map(|j| &j.spec)
    }

    /// The job set of the analysis stage: the config-file jobs (the `[[job]]`s) first, then registered
    /// jobs in registration order. Without `[[job]]`s but with registered jobs, a catch-all
    /// [`DEFAULT_JOB`] comes last, so the operator keeps seeing events for the rest of the traffic.
    pub fn job_set(&self) -> JobSet {
        self.job_set_with(&self.config_jobs)
    }

    fn job_set_with(&self, config_jobs: &[JobSpec]) -> JobSet {
        let mut specs: Vec<JobSpec> = config_jobs.to_vec();
        specs.extend(self.order.iter().filter_map(|id| self.jobs.get(id)).map(|j| j.spec.clone()));
        if config_jobs.is_empty() && !self.jobs.is_empty() {
            specs.push(JobSpec {
                name: DEFAULT_JOB.to_owned(),
                members: vec![
                    PrefixSpec { addr: IpAddr::V4(Ipv4Addr::UNSPECIFIED), len: 0 },
                    PrefixSpec { addr: IpAddr::V6(Ipv6Addr::UNSPECIFIED), len: 0 },
                ],
                tcp_ports: None,
                udp_ports: None,
                gradient_bytes: None,
                constraints: Default::default(),
            });
        }
        JobSet::from_specs(specs)
    }

    /// The distinct trie keys of job `id`'s members.
    pub fn prefix_keys(&self, id: &str) -> Vec<PrefixKey> {
        let mut keys = Vec::new();
        for m in self.jobs.get(id).map(|j| j.spec.members.as_slice()).unwrap_or_default() {
            let k = m.to_key();
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        keys
    }

    /// Of `keys` (a job being removed), those no registered job and no `[match]` prefix needs.
    /// Call after [`JobCatalog::unregister`].
    pub fn unneeded(&self, keys: &[PrefixKey]) -> Vec<PrefixKey> {
        keys.iter()
            .filter(|k| !self.static_prefixes.contains(k))
            .filter(|k| !self.jobs.values().any(|j| j.spec.members.iter().any(|m| m.to_key() == **k)))
            .copied()
            .collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ringside_client::Constraints;

    pub(crate) fn registration(name: &str, members: &[&str]) -> JobRegistration {
        JobRegistration {
            name: name.into(),
            members: members.iter().map(|m| (*m).to_owned()).collect(),
            tcp_ports: vec!["29500".parse().unwrap()],
            udp_ports: vec![],
            gradient_bytes: Some(100 << 20),
            constraints: Constraints::default(),
        }
    }

    #[test]
    fn tokens_are_random_prefixed_and_stored_hashed() {
        let mut r = JobCatalog::new(vec![TokenHash::of("op-secret-token-1")], vec![]);
        let (id, token) = r.register(&registration("a", &["10.77.0.0/24"]), 1).unwrap();
        assert!(id.starts_with("j-") && id.len() == 14, "{id}");
        assert!(token.starts_with(TENANT_TOKEN_PREFIX) && token.len() == 4 + 64, "{token}");
        // The catalog holds no plain token anywhere (its Debug prints every field).
        let dump = format!("{r:?}");
        assert!(!dump.contains(&token) && !dump.contains(&token[4..]), "{dump}");
        assert!(r.is_tenant_of(&id, &TokenHash::of(&token)));
        assert!(!r.is_tenant_of(&id, &TokenHash::of("rst_wrong")));
        assert!(!r.is_tenant_of("j-000000000000", &TokenHash::of(&token)));
        assert!(r.is_any_tenant(&TokenHash::of(&token)));
        assert!(r.is_operator(&TokenHash::of("op-secret-token-1")));
        assert!(!r.is_operator(&TokenHash::of(&token)));
        let (id2, token2) = r.register(&registration("b", &["10.78.0.1"]), 1).unwrap();
        assert_ne!((&id, &token), (&id2, &token2));
    }

    #[test]
    fn validation_names_the_field() {
        let mut r = JobCatalog::new(vec![], vec![]);
        let cases: Vec<(JobRegistration, &str)> = vec![
            (registration("", &["10.0.0.1"]), "name"),
            (registration("a b", &["10.0.0.1"]), "name"),
            (registration(&"x".repeat(65), &["10.0.0.1"]), "name"),
            (registration("a", &[]), "members"),
            (registration("a", &["10.0.0.300"]), "members"),
            (registration("a", &["10.0.0.0/33"]), "members"),
            (registration("a", &["0.0.0.0/0"]), "members"),
            (JobRegistration { gradient_bytes: Some(0), ..registration("a", &["10.0.0.1"]) }, "gradient_bytes"),
            (
                JobRegistration { constraints: Constraints { max_channels: 0, ..Default::default() }, ..registration("a", &["10.0.0.1"]) },
                "constraints",
            ),
        ];
        for (reg, field) in cases {
            let e = r.register(&reg, 0).unwrap_err();
            assert!(matches!(&e, RegisterError::Invalid { field: f, .. } if *f == field), "{field}: {e}");
            assert!(e.to_string().contains(field), "{e}");
        }
        assert!(valid_name("job-1.a_B"));
    }

    #[test]
    fn names_are_unique_and_the_cap_holds() {
        let mut r = JobCatalog::new(vec![], vec![]).with_max_jobs(2);
        let (a, _) = r.register(&registration("a", &["10.0.0.1"]), 0).unwrap();
        assert!(matches!(r.register(&registration("a", &["10.0.0.2"]), 0), Err(RegisterError::NameTaken { .. })));
        r.register(&registration("b", &["10.0.0.2"]), 0).unwrap();
        assert!(matches!(r.register(&registration("c", &["10.0.0.3"]), 0), Err(RegisterError::Full { max: 2 })));
        assert_eq!(r.unregister(&a).unwrap().name, "a");
        assert!(r.unregister(&a).is_none());
        r.register(&registration("a", &["10.0.0.1"]), 0).unwrap();
        assert_eq!(r.views().iter().map(|v| v.name.as_str()).collect::<Vec<_>>(), vec!["b", "a"]);
    }

    #[test]
    fn job_set_lists_config_jobs_first_then_registered_then_default() {
        use crate::flow_table::tests::key;
        use dataplane_common::{direction, flow_kind};
        let mut r = JobCatalog::new(vec![], vec![]);
        let (id, _) = r.register(&registration("a", &["10.77.0.0/24"]), 0).unwrap();
        let k = key(1, 3, 29500, direction::EGRESS, flow_kind::TCP); // 10.77.0.1 → 10.77.0.3
        // No [[job]]: the registered job, then the catch-all default.
        let set = r.job_set_with(&[]);
        assert_eq!(set.names(), vec![id.clone(), DEFAULT_JOB.to_owned()]);
        assert_eq!(set.job_of(&k), Some(id.as_str()));
        assert_eq!(set.job_of(&key(1, 3, 80, direction::EGRESS, flow_kind::TCP)), Some(DEFAULT_JOB));
        // A config job covering the same peer wins: a flow belongs to one job.
        let cfg = JobSpec { name: "cfg".into(), ..r.spec(&id).unwrap().clone() };
        let set = r.job_set_with(std::slice::from_ref(&cfg));
        assert_eq!(set.names(), vec!["cfg".to_owned(), id.clone()]);
        assert_eq!(set.job_of(&k), Some("cfg"));
        r.unregister(&id);
        assert!(r.job_set_with(&[]).specs().is_empty(), "no jobs: the implicit default");
    }

    #[test]
    fn registered_jobs_and_token_hashes_survive_a_restart() {
        use crate::events::tests::tempdir;
        let dir = tempdir("catalog-restore");
        let board = HintBoard::default();
        let mut first = JobCatalog::new(vec![], vec![]).with_state_dir(dir.clone());
        let (a, ta) = first.onboard(&registration("a", &[" 10.77.0.0/24 "]), 1_000, None, &board).unwrap();
        let (b, tb) = first.onboard(&registration("b", &["10.78.0.1"]), 2_000, None, &board).unwrap();
        let (c, _) = first.onboard(&registration("c", &["10.79.0.1"]), 3_000, None, &board).unwrap();
        first.remove(&c, None, &board).unwrap();
        // The file holds hashes, never a token.
        let text = std::fs::read_to_string(state::jobs_path(&dir)).unwrap();
        assert!(!text.contains(&ta) && !text.contains(&ta[4..]) && !text.contains(&tb[4..]), "{text}");
        assert!(text.contains(&TokenHash::of(&ta).to_hex()), "{text}");
        assert!(!text.contains(&c), "removed jobs leave the file: {text}");

        // A restart: same ids, names, order, registration times, specs; old tokens authenticate.
        let board2 = HintBoard::default();
        let mut second = JobCatalog::new(vec![], vec![]).with_state_dir(dir.clone());
        assert_eq!(second.restore(9_000, None, &board2), 2);
        assert_eq!(second.views(), first.views());
        assert_eq!(second.spec(&a), first.spec(&a));
        assert_eq!(second.job_set().names(), first.job_set().names());
        assert!(second.is_tenant_of(&a, &TokenHash::of(&ta)) && second.is_tenant_of(&b, &TokenHash::of(&tb)));
        assert!(!second.is_tenant_of(&a, &TokenHash::of(&tb)), "a token opens its own job only");
        assert!(!second.is_tenant_of(&a, &TokenHash::of("rst_wrong")));
        // Onboarded like new registrations: a hint channel and the baseline plan, but at a version
        // above the previous run's (which published 1 for each, then plan changes: say 40).
        assert_eq!(board.latest(&a).map(|h| h.version), Some(FIRST_VERSION), "a new registration starts at 1");
        let restored = board2.latest(&a).unwrap();
        assert_eq!((restored.job.as_str(), restored.version), (a.as_str(), restart_first_version(9_000)));
        assert!(restored.version > FIRST_VERSION + 40);
        assert_eq!(board2.latest(&b).map(|h| h.version), Some(9_000));
        assert!(board2.latest(&c).is_none());
        assert_eq!(second.file_counters, JobsFileCounters::default());
        // New registrations append to the restored ones and keep names unique; a new job's
        // versions start at 1 (no tenant followed it before).
        assert!(matches!(second.register(&registration("a", &["10.0.0.1"]), 0), Err(RegisterError::NameTaken { .. })));
        let (d, _) = second.onboard(&registration("d", &["10.80.0.1"]), 9_500, None, &board2).unwrap();
        assert_eq!(board2.latest(&d).map(|h| h.version), Some(FIRST_VERSION));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn config_jobs_win_and_bad_entries_are_dropped() {
        use crate::events::tests::tempdir;
        let dir = tempdir("catalog-restore-drop");
        let board = HintBoard::default();
        let mut first = JobCatalog::new(vec![], vec![]).with_state_dir(dir.clone());
        let (keep, tk) = first.onboard(&registration("keep", &["10.1.0.1"]), 1, None, &board).unwrap();
        first.onboard(&registration("train", &["10.2.0.1"]), 2, None, &board).unwrap();
        first.onboard(&registration("badhash", &["10.3.0.1"]), 3, None, &board).unwrap();
        first.onboard(&registration("invalid", &["10.4.0.1"]), 4, None, &board).unwrap();
        let mut saved = first.persisted(5);
        saved.jobs[2].token_sha256 = "nothex".into();
        saved.jobs[3].registration.members = vec!["0.0.0.0/0".into()];
        state::save(&dir, &saved).unwrap();

        // The next run's config file has a [[job]] named `train`.
        let cfg = JobSet::from_specs(vec![JobSpec { name: "train".into(), ..first.spec(&keep).unwrap().clone() }]);
        let mut second = JobCatalog::new(vec![], vec![]).with_config_jobs(&cfg).with_state_dir(dir.clone()).with_max_jobs(64);
        assert_eq!(second.restore(10, None, &HintBoard::default()), 1);
        assert_eq!(second.views().iter().map(|v| v.name.as_str()).collect::<Vec<_>>(), vec!["keep"]);
        assert!(second.is_tenant_of(&keep, &TokenHash::of(&tk)));
        assert_eq!(second.file_counters.load_errors, 1, "dropped jobs are counted once per load");
        // The file is not rewritten by a restore: the dropped entries stay until the next change.
        assert_eq!(state::load(&dir, 11).unwrap().unwrap().jobs.len(), 4);
        // A registration under a config job's name is refused (it would be dropped at restart).
        assert!(matches!(second.register(&registration("train", &["10.5.0.1"]), 0), Err(RegisterError::NameTaken { .. })));

        // A corrupt file: counted, moved aside, nothing restored, and the next save starts afresh.
        std::fs::write(state::jobs_path(&dir), b"garbage").unwrap();
        let mut third = JobCatalog::new(vec![], vec![]).with_state_dir(dir.clone());
        assert_eq!(third.restore(12, None, &HintBoard::default()), 0);
        assert_eq!(third.file_counters.load_errors, 1);
        assert!(dir.join("jobs.json.corrupt-12").exists());
        third.onboard(&registration("fresh", &["10.6.0.1"]), 13, None, &HintBoard::default()).unwrap();
        assert_eq!(state::load(&dir, 14).unwrap().unwrap().jobs.len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failed_save_is_counted_not_refused() {
        use crate::events::tests::tempdir;
        let dir = tempdir("catalog-save-fail");
        let not_a_dir = dir.join("file");
        std::fs::write(&not_a_dir, b"").unwrap();
        let mut r = JobCatalog::new(vec![], vec![]).with_state_dir(not_a_dir);
        r.onboard(&registration("a", &["10.0.0.1"]), 1, None, &HintBoard::default()).unwrap();
        assert_eq!((r.len(), r.file_counters.save_errors), (1, 1));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_unneeded_prefixes_are_released() {
        let stat: PrefixSpec = "10.1.0.0/16".parse().unwrap();
        let mut r = JobCatalog::new(vec![], vec![stat.to_key()]);
        let (a, _) = r.register(&registration("a", &["10.77.0.0/24", "10.1.0.0/16", "10.9.0.1"]), 0).unwrap();
        let (_b, _) = r.register(&registration("b", &["10.77.0.0/24"]), 0).unwrap();
        let keys = r.prefix_keys(&a);
        assert_eq!(keys.len(), 3);
        r.unregister(&a);
        let gone = r.unneeded(&keys);
        assert_eq!(gone, vec!["10.9.0.1/32".parse::<PrefixSpec>().unwrap().to_key()]);
    }
}
