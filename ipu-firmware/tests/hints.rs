//! T0: the closed loop in process. Ranks are threads over loopback TCP; rank 0 follows a job's hint
//! stream served by a canned HTTP server on a real socket; every rank must switch together. With
//! transport advice, every rank follows the stream and the advice must reach every connection of
//! its mesh (read back from the transport's own sockets).

#[path = "../../ringside-client/tests/support/canned.rs"]
mod canned;

use canned::{hint_event, serve, within, Reply};
use ipu_firmware::job::{expected_sum, rank_input, run_job_in_process, run_ranks_in_process, ComputeMode, JobConfig, JobReport};
use ipu_firmware::plan::Dtype;
use ipu_firmware::rto::{rto_min_us, system_rto_min_us};
use ipu_firmware::{Algorithm, CodecKind, Communicator, CommunicatorConfig, HintFollower, Plan, TcpOptions, TcpRtoFloor};
use ringside_client::{Backoff, ClientConfig, JobClient};
use std::time::{Duration, Instant};

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

#[test]
fn transport_advice_reaches_every_connection_of_every_rank() {
    const WORLD: usize = 3;
    const CHANNELS: u8 = 2;
    const STEPS: u64 = 40;
    within(120, || {
        // Where this kernel has no TCP_RTO_MIN_US (before 6.15) the job must still run, and the
        // floors' logs must say why nothing was set.
        let supported = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            rto_min_us(&std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap()).is_ok()
        };
        let advised = format!("{},\"tcp_rto_min_ms\":5}}", hint(2, "tree", "fp16", 2).strip_suffix('}').unwrap());
        let parts = vec![hint_event(1, &hint(1, "ring", "none", 2)), hint_event(2, &advised)];
        // One stream per rank: each follows the job on its own.
        let srv = serve((0..WORLD).map(|_| Reply::Sse { parts: parts.clone(), pause: Duration::from_millis(100), end: false, hold: Duration::from_secs(60) }).collect());
        let url = format!("{}/v1/jobs/j1", srv.base);
        let timeout = Duration::from_secs(20);
        let results = run_ranks_in_process(WORLD, TcpOptions { channels: CHANNELS, timeout }, move |rank, mut t| {
            let floor = TcpRtoFloor::new();
            t.set_rto_floor(&floor);
            let client = JobClient::with_config(&url, "t", fast()).unwrap();
            let follower = if rank == 0 {
                HintFollower::start_with_rto_floor(client, CHANNELS, floor.clone())
            } else {
                HintFollower::start_rto_floor_only(client, floor.clone())
            }
            .unwrap();
            let initial = Plan { chunk_bytes: 4096, channels: CHANNELS, ..Plan::default() };
            let mut comm = Communicator::new(t, CommunicatorConfig { initial_plan: initial, timeout })?;
            let mut advice_follower = None;
            if rank == 0 {
                comm.set_plan_source(Box::new(follower));
            } else {
                advice_follower = Some(follower);
            }
            let mut plans = Vec::new();
            for step in 0..STEPS {
                std::thread::sleep(Duration::from_millis(15));
                comm.begin_step(step);
                let mut buf: Vec<f32> = (0..4099).map(|i| rank_input(rank, step, i)).collect();
                let rep = comm.allreduce_f32(&mut buf)?;
                // Small integers: exact under fp16 too.
                assert!(buf.iter().enumerate().all(|(i, &x)| x == expected_sum(WORLD, step, i)), "rank {rank} step {step}");
                plans.push(rep.plan);
            }
            // The follower's thread applies the advice when it arrives, not at a step: wait for
            // it on the transport's own sockets (bounded).
            let deadline = Instant::now() + Duration::from_secs(20);
            let floors = loop {
                let now = comm.transport().connection_rto_min_us();
                let done = now.iter().all(|(_, us)| us.as_ref().is_ok_and(|us| (5000..200_000).contains(us)));
                if done || !supported || Instant::now() >= deadline {
                    break now.into_iter().map(|(pc, us)| (pc, us.map_err(|e| e.to_string()))).collect::<Vec<_>>();
                }
                std::thread::sleep(Duration::from_millis(10));
            };
            // The floor's log is complete once the advice is in force.
            while floor.applied().is_empty() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let log = floor.applied();
            comm.close();
            assert_eq!(floor.sockets(), 0, "rank {rank}: the closed transport left its sockets registered");
            drop(advice_follower);
            Ok((plans, floors, log))
        });
        let results: Vec<_> = results.into_iter().map(|r| r.expect("rank ran")).collect();
        for (rank, (plans, floors, log)) in results.iter().enumerate() {
            assert_eq!(plans, &results[0].0, "rank {rank} ran other plans than rank 0");
            let last = plans.last().unwrap();
            assert_eq!((last.algorithm, last.compression.codec), (Algorithm::Tree, CodecKind::Fp16), "rank {rank}: the advised hint's plan ran too");
            let peers_channels: Vec<(usize, usize)> = floors.iter().map(|(pc, _)| *pc).collect();
            let expected: Vec<(usize, usize)> = (0..WORLD).filter(|&p| p != rank).flat_map(|p| (0..usize::from(CHANNELS)).map(move |c| (p, c))).collect();
            assert_eq!(peers_channels, expected, "rank {rank}: every peer, every channel");
            assert_eq!(log.len(), 1, "rank {rank}: one change of advice: {log:?}");
            assert_eq!((log[0].hint_version, log[0].tcp_rto_min_ms), (Some(2), Some(5)), "rank {rank}");
            if supported {
                for ((peer, ch), us) in floors {
                    let us = us.as_ref().unwrap();
                    assert!((5000..200_000).contains(us), "rank {rank} peer {peer} channel {ch}: {us} µs, system default {}", system_rto_min_us());
                }
                assert_eq!((log[0].sockets, log[0].error.as_deref()), (expected.len(), None), "rank {rank}");
            } else {
                assert!(log[0].error.as_deref().is_some_and(|e| e.contains("Linux 6.15")), "rank {rank}: {log:?}");
            }
        }
    });
}
