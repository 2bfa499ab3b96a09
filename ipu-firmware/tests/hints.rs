//! T0: the closed loop in process. Ranks are threads over loopback TCP; rank 0 follows a job's hint
//! stream served by a canned HTTP server on a real socket; every rank must switch together.

#[path = "../../ringside-client/tests/support/canned.rs"]
mod canned;

use canned::{hint_event, serve, within, Reply};
use ipu_firmware::job::{run_job_in_process, ComputeMode, JobConfig, JobReport};
use ipu_firmware::plan::Dtype;
use ipu_firmware::{Algorithm, CodecKind, HintFollower, Plan};
use ringside_client::{Backoff, ClientConfig, JobClient};
use std::time::Duration;

fn template(steps: u64) -> JobConfig {
    JobConfig {
        rank: 0,
        world: 3,
        peers: vec![],
        size_bytes: 4 * 4099,
        dtype: Dtype::F32,
        steps,
        compute_ms: 15.0,
        compute_jitter_ms: 0.0,
        straggler_extra_ms: 0.0,
        compute_mode: ComputeMode::Sleep,
        plan: Plan { chunk_bytes: 4096, ..Plan::default() },
        max_channels: 2,
        timeout_ms: 20_000,
        verify: true,
        barrier: false,
        progress: None,
    }
}

fn fast() -> ClientConfig {
    ClientConfig {
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(5),
        stream_read_timeout: Duration::from_secs(5),
        reconnect: Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(100), max_attempts: 3 },
        ..ClientConfig::default()
    }
}

fn hint(version: u64, algorithm: &str, compression: &str, channels: u8) -> String {
    format!(
        r#"{{"job":"j1","version":{version},"step_from":0,"algorithm":"{algorithm}","chunk_bytes":8192,"channels":{channels},"compression":"{compression}","error_feedback":true,"reasons":["path to peer 10.0.0.3 lossy"],"confidence":0.9,"expires_at":1}}"#
    )
}

fn reports(results: Vec<ipu_firmware::error::Result<JobReport>>) -> Vec<JobReport> {
    results.into_iter().map(|r| r.expect("rank ran")).collect()
}

#[test]
fn all_ranks_switch_together_to_the_hinted_plans() {
    within(120, || {
        let srv = serve(vec![Reply::Sse {
            parts: vec![hint_event(1, &hint(1, "tree", "fp16", 2)), hint_event(2, &hint(2, "rhd", "int8", 1))],
            pause: Duration::from_millis(100),
            end: false,
            hold: Duration::from_secs(60),
        }]);
        let client = JobClient::with_config(&format!("{}/v1/jobs/j1", srv.base), "t", fast()).unwrap();
        let follower = HintFollower::start(client, 2).unwrap();
        let applied = follower.applied();
        let mut reps = reports(run_job_in_process(&template(60), Some(Box::new(follower))));
        for (r, rep) in reps.iter().enumerate() {
            assert!(rep.error.is_none(), "rank {r}: {:?}", rep.error);
            assert_eq!(rep.summary.steps_completed, 60);
            assert_eq!(rep.summary.all_verified, Some(true), "rank {r}");
            let plans: Vec<Plan> = rep.steps.iter().map(|s| s.plan).collect();
            assert_eq!(plans, reps[0].steps.iter().map(|s| s.plan).collect::<Vec<_>>(), "rank {r} ran other plans than rank 0");
        }
        let log = applied.snapshot();
        assert_eq!(log.iter().map(|h| h.version).collect::<Vec<_>>(), [1, 2]);
        reps[0].record_hints(&log);
        let steps = &reps[0].steps;
        assert_eq!(steps[0].hint_version, None, "step 0 runs the initial plan");
        // Each hint takes effect exactly at the step after the one during which it was polled.
        for h in &log {
            let first = steps.iter().position(|s| s.hint_version == Some(h.version)).expect("hint applied");
            assert_eq!(first as u64, h.received_at_step + 1);
            assert_eq!(steps[first].plan, h.plan);
        }
        let v: Vec<Option<u64>> = steps.iter().map(|s| s.hint_version).collect();
        assert!(v.windows(2).all(|w| w[0] <= w[1]), "hint versions go back: {v:?}");
        let last = steps.last().unwrap().plan;
        assert_eq!((last.algorithm, last.compression.codec, last.channels), (Algorithm::Rhd, CodecKind::Int8, 1));
        let json = serde_json::to_value(&reps[0]).unwrap();
        assert_eq!(json["hints"][1]["version"], 2);
        assert!(json["steps"][0].get("hint_version").is_none() && json["steps"][59]["hint_version"] == 2);
        assert!(json["steps"][59]["step_ms"].is_f64() && json["steps"][59]["comm_ms"].is_f64());
    });
}

#[test]
fn training_goes_on_when_the_agent_is_unreachable() {
    within(120, || {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let client = JobClient::with_config(&format!("http://127.0.0.1:{port}/v1/jobs/j1"), "t", fast()).unwrap();
        let follower = HintFollower::start(client, 2).unwrap();
        let applied = follower.applied();
        let reps = reports(run_job_in_process(&template(10), Some(Box::new(follower))));
        for rep in &reps {
            assert!(rep.error.is_none());
            assert_eq!(rep.summary.steps_completed, 10);
            assert!(rep.steps.iter().all(|s| s.plan == template(10).plan));
        }
        assert!(applied.snapshot().is_empty());
    });
}
