//! T2: what survives an agent restart. Registered jobs (ids, names, tenant-token hashes) live in
//! `<state_dir>/jobs.json`, written at registration and removal, so they come back after a clean
//! stop (SIGTERM) and after a crash (SIGKILL), and the tenant's old token still opens its job;
//! a restored job's hint version is above every version the previous run served (issue 11).
//!
//! Needs root and an agent built with its eBPF object (`cargo xtask build`, or
//! `RINGSIDE_EBPF_OBJECT=... cargo test -p dataplane-user --test t2_state -- --ignored`). Without
//! either it FAILS with the reason; it never skips. Every wait is bounded.
mod support;

use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Child,
    time::Duration,
};

use ringside_client::{operator::JobsResponse, ClientError, JobClient, JobCreated, JobRegistration, OperatorClient};
use support::wait_for;
use testbed::{Star, StarConfig};

const AGENT_PORT: u16 = 9464;
const POLL: Duration = Duration::from_millis(100);

fn preconditions() {
    if let Err(e) = testbed::require_root() {
        panic!("t2_state attaches eBPF programs in network namespaces and needs root: {e}");
    }
    if let Err(e) = dataplane_user::object::flowmon_object() {
        panic!("t2_state runs the real agent: {e}");
    }
}

/// The test's own state directory, pin directory and agent; removes all three on drop (the
/// agent SIGTERMed, then SIGKILLed if it does not exit).
struct Run<'a> {
    star: &'a Star,
    state_dir: PathBuf,
    pin_dir: PathBuf,
    agent: Option<Child>,
}

impl<'a> Run<'a> {
    fn new(star: &'a Star) -> Self {
        let id = std::process::id();
        let state_dir = std::env::temp_dir().join(format!("ringside-t2-state-{id}"));
        let _ = std::fs::remove_dir_all(&state_dir);
        let pin_dir = PathBuf::from(format!("/sys/fs/bpf/ringside-t2s-{id}"));
        Run { star, state_dir, pin_dir, agent: None }
    }

    /// Starts the agent on host 0's eth0 with the test's state and pin directories and waits
    /// until it is ready. The operator token is the one the agent generates in `state_dir`
    /// (the same file across restarts).
    fn start(&mut self) {
        assert!(self.agent.is_none(), "one agent at a time");
        // A [match] prefix, so job prefixes go into MATCH_PREFIXES (with none, every address is
        // monitored and the trie is left alone).
        let config = self.state_dir.join("ringside.toml");
        std::fs::create_dir_all(&self.state_dir).unwrap();
        std::fs::write(&config, "[match]\nprefixes = [\"10.77.0.0/24\"]\n").unwrap();
        let mut cmd = self.star.hosts[0].ns.command(env!("CARGO_BIN_EXE_ringside"));
        cmd.args(["agent", "--iface", "eth0", "--listen", &format!("127.0.0.1:{AGENT_PORT}"), "--state-dir"])
            .arg(&self.state_dir)
            .arg("--config")
            .arg(&config)
            .arg("--pin-dir")
            .arg(&self.pin_dir)
            .env("RUST_LOG", "info");
        self.agent = Some(cmd.spawn().expect("spawning the ringside binary"));
        wait_for(Duration::from_secs(20), POLL, "the agent to become ready", || {
            if let Some(Ok(Some(status))) = self.agent.as_mut().map(Child::try_wait) {
                panic!("the agent exited during start: {status}");
            }
            let token = std::fs::read_to_string(self.state_dir.join("operator.token")).ok()?;
            self.operator(token.trim(), OperatorClient::status).ok().filter(|s| s.ready)
        });
    }

    fn operator_token(&self) -> String {
        std::fs::read_to_string(self.state_dir.join("operator.token")).unwrap().trim().to_owned()
    }

    fn operator<T: Send>(&self, token: &str, call: impl FnOnce(&OperatorClient) -> Result<T, ClientError> + Send) -> Result<T, ClientError> {
        let url = format!("http://127.0.0.1:{AGENT_PORT}");
        self.star.hosts[0].ns.run(|| OperatorClient::new(&url, token).and_then(|c| call(&c)))
    }

    fn jobs(&self) -> JobsResponse {
        self.operator(&self.operator_token(), OperatorClient::jobs).unwrap()
    }

    fn register(&self, name: &str, members: &[&str]) -> JobCreated {
        let reg = JobRegistration {
            name: name.into(),
            members: members.iter().map(|m| (*m).to_owned()).collect(),
            tcp_ports: vec!["29500".parse().unwrap()],
            udp_ports: vec![],
            gradient_bytes: Some(64 << 20),
            constraints: Default::default(),
        };
        self.operator(&self.operator_token(), |c| c.register(&reg)).unwrap()
    }

    /// `GET /v1/jobs/{id}/hints` with `token`, as the tenant does.
    fn tenant_hint(&self, id: &str, token: &str) -> Result<ringside_client::Hint, ClientError> {
        let url = format!("http://127.0.0.1:{AGENT_PORT}/v1/jobs/{id}");
        self.star.hosts[0].ns.run(|| JobClient::new(&url, token)?.hint())
    }

    /// SIGTERM and a bounded wait: the agent must exit successfully and remove its pins.
    fn stop(&mut self) {
        let mut child = self.agent.take().expect("an agent is running");
        assert!(support::stop_child(&mut child, Duration::from_secs(10)), "the agent did not exit cleanly on SIGTERM");
        assert!(!self.pin_dir.exists(), "pins left in {}", self.pin_dir.display());
    }

    /// SIGKILL: nothing runs at exit. The leftover attachment (tc filters, pins) is then removed
    /// with `ringside detach`, as the operator guide says, so the next start can pin again.
    fn kill(&mut self) {
        let mut child = self.agent.take().expect("an agent is running");
        child.kill().unwrap();
        child.wait().unwrap();
        let out = self.star.hosts[0]
            .ns
            .command(env!("CARGO_BIN_EXE_ringside"))
            .args(["detach", "--iface", "eth0", "--pin-dir"])
            .arg(&self.pin_dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "ringside detach after SIGKILL: {}", String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for Run<'_> {
    fn drop(&mut self) {
        if let Some(mut child) = self.agent.take() {
            support::stop_child(&mut child, Duration::from_secs(10));
        }
        for name in dataplane_user::loader::PINNED_MAPS {
            let _ = std::fs::remove_file(self.pin_dir.join(name));
        }
        let _ = std::fs::remove_dir(&self.pin_dir);
        let _ = std::fs::remove_dir_all(&self.state_dir);
    }
}

/// Whether the pinned `MATCH_PREFIXES` holds IPv4 prefix `a.b.0.0/16`.
fn trie_holds_16(pin_dir: &Path, a: u8, b: u8) -> bool {
    use aya::maps::{lpm_trie::Key, LpmTrie, Map, MapData};
    let data = MapData::from_pin(pin_dir.join("MATCH_PREFIXES")).expect("open the pinned MATCH_PREFIXES");
    let trie: LpmTrie<MapData, [u8; 16], u32> = LpmTrie::try_from(Map::from_map_data(data).unwrap()).unwrap();
    let addr = dataplane_common::ipv4_mapped([a, b, 0, 0]);
    trie.keys().filter_map(Result::ok).any(|k: Key<[u8; 16]>| k.prefix_len() == 96 + 16 && k.data() == addr)
}

fn ids(jobs: &JobsResponse) -> Vec<(String, String)> {
    jobs.jobs.iter().map(|j| (j.id.clone(), j.name.clone())).collect()
}

#[test]
#[ignore = "needs root and the eBPF object (T2): run with cargo xtask test"]
fn registered_jobs_and_tokens_survive_sigterm_and_sigkill() {
    preconditions();
    let star = Star::new(StarConfig { hosts: 2, ..Default::default() }).unwrap();
    let mut run = Run::new(&star);

    // --- first run: register job A ---
    run.start();
    let a = run.register("t2-state-a", &["10.77.0.2", "10.97.0.0/16"]);
    assert!(trie_holds_16(&run.pin_dir, 10, 97));
    let before = run.jobs();
    assert_eq!(ids(&before), vec![(a.id.clone(), "t2-state-a".to_owned())]);
    // On disk at once, private, and without the token.
    let file = run.state_dir.join("jobs.json");
    let text = std::fs::read_to_string(&file).expect("jobs.json written at registration");
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    assert!(text.contains(&a.id) && !text.contains(&a.tenant_token[4..]), "{text}");
    let operator = run.operator_token();
    // Hint versions (issue 11): a new registration starts at 1; a follower that applied it
    // ignores any later hint whose version is not above it, so a restart must not go back.
    let a_version_run1 = run.tenant_hint(&a.id, &a.tenant_token).unwrap().version;
    assert_eq!(a_version_run1, 1, "a newly registered job's first hint");
    run.stop();

    // --- second run after SIGTERM: A is back, kernel prefixes included; its old token works ---
    run.start();
    assert_eq!(run.operator_token(), operator, "the generated operator token is reused");
    assert_eq!(run.jobs().jobs, before.jobs, "same id, name, members and registration time");
    assert!(trie_holds_16(&run.pin_dir, 10, 97), "the restored job's prefix is back in MATCH_PREFIXES");
    let hint = run.tenant_hint(&a.id, &a.tenant_token).expect("the tenant's token from before the restart");
    assert_eq!(hint.job, a.id);
    assert!(hint.version > a_version_run1, "after SIGTERM the restored job's version {} is not above {a_version_run1} from before", hint.version);
    let a_version_run2 = hint.version;
    let e = run.tenant_hint(&a.id, "rst_0000000000000000000000000000000000000000000000000000000000000000").unwrap_err();
    assert_eq!(e.status(), Some(401), "a wrong token is refused: {e}");
    // Register B, then crash: B was written at registration, not at exit.
    let b = run.register("t2-state-b", &["10.77.0.3", "10.96.0.0/16"]);
    let b_version_run2 = run.tenant_hint(&b.id, &b.tenant_token).unwrap().version;
    assert_eq!(b_version_run2, 1, "registered after a restart: still a new job's first hint");
    run.kill();

    // --- third run after SIGKILL: A and B, in registration order, both tokens work ---
    run.start();
    assert_eq!(ids(&run.jobs()), vec![(a.id.clone(), "t2-state-a".to_owned()), (b.id.clone(), "t2-state-b".to_owned())]);
    assert!(trie_holds_16(&run.pin_dir, 10, 97) && trie_holds_16(&run.pin_dir, 10, 96));
    let (hint_a, hint_b) = (run.tenant_hint(&a.id, &a.tenant_token).unwrap(), run.tenant_hint(&b.id, &b.tenant_token).unwrap());
    assert_eq!((hint_a.job.as_str(), hint_b.job.as_str()), (a.id.as_str(), b.id.as_str()));
    // After a crash too, each restored job's version is above the last run's.
    assert!(hint_a.version > a_version_run2, "after SIGKILL A's version {} is not above {a_version_run2}", hint_a.version);
    assert!(hint_b.version > b_version_run2, "after SIGKILL B's version {} is not above {b_version_run2}", hint_b.version);
    let e = run.tenant_hint(&a.id, &b.tenant_token).unwrap_err();
    assert_eq!(e.status(), Some(403), "B's token does not open A: {e}");
    // DELETE A: gone from the file at once, and still gone after a crash.
    run.operator(&operator, |c| c.delete(&a.id)).unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(!text.contains(&a.id) && text.contains(&b.id), "{text}");
    run.kill();
    run.start();
    assert_eq!(ids(&run.jobs()), vec![(b.id.clone(), "t2-state-b".to_owned())]);
    assert!(!trie_holds_16(&run.pin_dir, 10, 97), "the deleted job's prefix did not come back");
    let e = run.tenant_hint(&a.id, &a.tenant_token).unwrap_err();
    assert_eq!(e.status(), Some(401), "a deleted job's token stays invalid: {e}");
    run.stop();
}
