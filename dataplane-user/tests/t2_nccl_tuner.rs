//! T2: ringside's NCCL tuner plugin against the real agent. A job is registered through
//! `POST /v1/jobs`; `nccl-tuner/tests/harness.c` loads `libnccl-tuner-ringside.so` as NCCL does
//! (one process per tuner ABI version, v2..v7, all at once) with `RINGSIDE_JOB_URL` and
//! `RINGSIDE_TOKEN` set to the job's, and must see the job's hinted algorithm (its baseline
//! hint, published at registration) win allreduce at every size, with the hinted channels and
//! (v6+) chunk size, while the other collectives keep NCCL's choice; after `DELETE /v1/jobs/{id}`
//! (the job's token is then refused) every decision must be NCCL's own again. No traffic is
//! needed: the hint exists from registration on.
//!
//! Needs root (the agent attaches its eBPF program in the testbed's switch namespace) and the
//! eBPF object (`cargo xtask test`, or
//! `RINGSIDE_EBPF_OBJECT=... cargo test -p dataplane-user --test t2_nccl_tuner -- --ignored`).
//! Without either it FAILS with the reason. The plugin is built by the test (`cargo build -p
//! ringside-nccl-tuner`), the harness with `$CC`. Every wait is bounded.
mod detect_rig;
mod support;
#[path = "../../nccl-tuner/tests/support/harness.rs"]
mod nccl_harness;

use std::net::IpAddr;
use std::time::Duration;

use detect_rig::Agent;
use nccl_harness::{build_plugin, compile_harness, install_plugin, steered, Harness, Pick, Scratch, VERSIONS};
use ringside_client::{Algorithm, Constraints, JobClient, JobRegistration, OperatorClient, PortRange};
use support::wait_for;
use testbed::{Star, StarConfig};

const AGENT_PORT: u16 = 9464;
const WAIT: Duration = Duration::from_secs(20);

fn preconditions() {
    if let Err(e) = testbed::require_root() {
        panic!("t2_nccl_tuner runs the agent, which attaches eBPF programs in a network namespace, and needs root: {e}");
    }
    if let Err(e) = dataplane_user::object::flowmon_object() {
        panic!("t2_nccl_tuner runs the real agent: {e}");
    }
}

#[test]
#[ignore = "needs root (T2): run with cargo xtask test"]
fn agent_hints_steer_nccl_through_the_tuner_plugin_until_the_job_is_deleted() {
    preconditions();
    let scratch = Scratch::new("t2");
    install_plugin(&build_plugin(), &scratch.0);
    let harness_bin = compile_harness(&scratch.0);

    let star = Star::new(StarConfig { hosts: 2, rps: false, raise_backlog: false, ..Default::default() }).unwrap();
    let agent = Agent::start_with(&star, "nccl", IpAddr::from([127, 0, 0, 1]), AGENT_PORT, "[match]\nprefixes = [\"10.77.0.0/24\"]\n");
    let operator_token = wait_for(Duration::from_secs(5), Duration::from_millis(100), "the agent's operator token", || agent.token());
    let url = agent.url();
    let registration = JobRegistration {
        name: "t2-nccl-tuner".into(),
        members: vec!["10.77.0.0/24".into()],
        tcp_ports: vec![PortRange { lo: 29500, hi: 29510 }],
        udp_ports: vec![],
        gradient_bytes: Some(64 << 20),
        constraints: Constraints { max_channels: 4, ..Constraints::default() },
    };
    let created = star.switch.run(|| OperatorClient::new(&url, &operator_token)?.register(&registration)).expect("POST /v1/jobs");
    let job_url = format!("{url}/v1/jobs/{}", created.id);
    let hint = star.switch.run(|| JobClient::new(&job_url, &created.tenant_token)?.hint()).expect("GET the job's hint");
    eprintln!("job {} registered; its hint: v{} {} channels {} chunk {} B", created.id, hint.version, hint.algorithm, hint.channels, hint.chunk_bytes);
    let nccl = match hint.algorithm {
        Algorithm::Ring => "ring",
        Algorithm::Tree | Algorithm::Rhd => "tree",
    };
    let (channels, chunk) = (i32::from(hint.channels), u64::from(hint.chunk_bytes));

    // One harness per ABI version, all following the job; each in the switch namespace, where
    // the agent listens on 127.0.0.1.
    let env = [("RINGSIDE_JOB_URL", job_url.as_str()), ("RINGSIDE_TOKEN", created.tenant_token.as_str())];
    let mut harnesses: Vec<Harness> = VERSIONS.map(|v| Harness::start(star.switch.command(&harness_bin), &scratch.0, v, &env)).collect();
    for h in &mut harnesses {
        let picks = h.round_until(WAIT, &format!("allreduce steered to {nccl} by hint v{}", hint.version), |p| steered(p, nccl, channels, chunk));
        assert!(
            picks.iter().any(|p: &Pick| p.coll == "allreduce" && p.default_algo != nccl),
            "v{}: the harness's cost model must have sizes where {nccl} does not win by itself",
            h.version
        );
        assert!(h.logged(&format!("hint v{} from {job_url}", hint.version)), "v{}: {:#?}", h.version, h.log);
    }

    star.switch.run(|| OperatorClient::new(&url, &operator_token)?.delete(&created.id)).expect("DELETE the job");
    for h in &mut harnesses {
        h.round_until(WAIT, "NCCL's defaults after the job was deleted", |p| p.iter().all(Pick::is_default));
        // The agent authenticates before it looks the job up: the deleted job's tenant token is
        // now unknown (401), which the plugin takes as the end of the job.
        h.wait_log("answered 401", WAIT);
    }
    for h in harnesses {
        h.quit();
    }
}
