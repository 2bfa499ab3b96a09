//! T2 test of the job launcher with a stand-in for `ringside-rank` (a shell script that checks it
//! runs in its rank's namespace and writes a result file in the documented shape).

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use testbed::job::JobConfig;
use testbed::{FaultKind, LeafSpine, LeafSpineConfig, Rig, Star, StarConfig};

const FAKE_RANK: &str = r#"#!/bin/sh
# Stand-in for ringside-rank: parse the flags, check our address, write per-step times.
set -e
while [ $# -gt 0 ]; do
  case "$1" in
    --rank) rank=$2; shift 2;;
    --world) world=$2; shift 2;;
    --peers) peers=$2; shift 2;;
    --steps) steps=$2; shift 2;;
    --straggler-extra-ms) extra=$2; shift 2;;
    --out) out=$2; shift 2;;
    --verify) shift;;
    *) shift 2;;
  esac
done
me=$(echo "$peers" | cut -d, -f$((rank + 1)) | cut -d: -f1)
ip -o addr show dev eth0 | grep -q " $me/" || { echo "rank $rank is not on $me" >&2; exit 3; }
step=$((10 + ${extra:-0}))
printf '{"rank":%s,"world":%s,"steps":[' "$rank" "$world" > "$out"
i=0; while [ $i -lt "$steps" ]; do
  [ $i -gt 0 ] && printf ',' >> "$out"
  printf '{"step":%s,"step_ms":%s,"comm_ms":4}' $i $step >> "$out"
  i=$((i + 1))
done
printf ']}\n' >> "$out"
"#;

#[test]
#[ignore = "needs root (T2): run with cargo xtask test"]
fn job_runs_one_rank_per_host_and_summarizes() {
    if let Err(e) = testbed::require_root() {
        panic!("testbed tests create network namespaces: {e}");
    }
    let dir = std::env::temp_dir().join(format!("ringside-fake-rank-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bin = dir.join("ringside-rank");
    std::fs::write(&bin, FAKE_RANK).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();

    let star = Star::new(StarConfig { hosts: 3, ..Default::default() }).unwrap();
    let cfg = JobConfig {
        ranks: 3,
        steps: 5,
        straggler: Some((2, 30)),
        verify: true,
        rank_bin: Some(bin.clone()),
        out_dir: Some(dir.join("out")),
        timeout: Duration::from_secs(30),
        ..Default::default()
    };
    let report = testbed::run_job(&star, &cfg, None).unwrap();
    assert_eq!(report.ranks.len(), 3);
    assert_eq!(report.step_ms.count, 15);
    assert_eq!(report.ranks[0].step_ms.mean, 10.0);
    assert_eq!(report.ranks[2].step_ms.mean, 40.0);
    assert_eq!(report.comm_ms.p50, 4.0);
    assert_eq!(report.step_ms.max, 40.0);
    // The straggler is a recorded fault spanning the job.
    let log = star.fault_log();
    let s = log.iter().find(|r| matches!(r.kind, FaultKind::Straggler { rank: 2, extra_ms: 30 })).expect("straggler recorded");
    assert_eq!(s.host, Some(2));
    assert!(s.started_unix_ms >= report.started_unix_ms && s.ended_unix_ms.unwrap() >= s.started_unix_ms, "{s:?}");

    // A failing rank fails the job with its log named.
    let bad = JobConfig { extra_args: vec!["--peers".into(), "1.2.3.4:1,1.2.3.5:1,1.2.3.6:1".into()], ..cfg.clone() };
    match testbed::run_job(&star, &bad, None) {
        Err(testbed::Error::RankFailed { detail, .. }) => assert!(detail.contains("is not on"), "{detail}"),
        other => panic!("expected a rank failure, got {other:?}"),
    }
    // A missing binary is reported before anything starts.
    let missing = JobConfig { rank_bin: Some(dir.join("nope")), ..cfg.clone() };
    assert!(matches!(testbed::run_job(&star, &missing, None), Err(testbed::Error::RankBinaryMissing { .. })));

    // The launcher works on any rig, with ranks on chosen hosts: here a 2×3 leaf-spine with
    // ranks on hosts 0,1 (leaf 0) and 3,4 (leaf 1); the fake rank checks it runs on its address.
    let ls = LeafSpine::new(LeafSpineConfig { hosts_per_leaf: 3, ..Default::default() }).unwrap();
    let cfg = JobConfig { ranks: 4, hosts: Some(vec![0, 1, 3, 4]), straggler: Some((3, 5)), ..cfg };
    let report = testbed::run_job(&ls, &cfg, None).unwrap();
    assert_eq!(report.ranks.len(), 4);
    assert_eq!(report.ranks[3].step_ms.mean, 15.0);
    assert_eq!(ls.faults()[0].host, Some(4));
    let dup = JobConfig { hosts: Some(vec![0, 1, 1, 4]), ..cfg };
    assert!(matches!(testbed::run_job(&ls, &dup, None), Err(testbed::Error::InvalidArgument { .. })));
    std::fs::remove_dir_all(&dir).unwrap();
}
