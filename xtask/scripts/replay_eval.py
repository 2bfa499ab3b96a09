#!/usr/bin/env python3
"""Replay an evaluation's recorded detector input through the current detectors, and rescore it.

`cargo xtask eval detection` run with `RUST_LOG=info,ringside::detect=debug` records every window
the detectors saw (`ringside::detect::input` lines, with the job's connections) in each agent log.
This script feeds each run's windows through the detectors of the current tree (the
`replay_recorded_windows` unit test, `--ignored`) and scores the verdicts they open the way the
evaluation does: a network event matches when it is raised between the fault's start and its end
+ 3 s and names the faulted host (or, for uplink congestion, is the faulted leaf agent's `uplink`).
It answers "what would this code have said on that traffic", without rerunning the jobs.

Usage (from the workspace root):
    cargo test -p dataplane-user --lib --no-run      # prints the test binary's path
    python3 xtask/scripts/replay_eval.py target/eval target/debug/deps/dataplane_user-HASH

At the IPU vantage (runs with `"vantage": "ipu"`) it replays all six IPU agents' logs with
`[detect.gray] min_peers = 2`; a link-scoped event names the agent's own host. Events are not
merged across agents as the evaluation merges them, so precision counts each agent's own events.

Limits: timings are those of the recorded windows (the replayed agent reacts to the same input,
not to a job that reacts back); runs whose log or detection.json entry is missing are skipped.
"""
import datetime
import json
import os
import re
import statistics
import subprocess
import sys


def wall_ms(line):
    return datetime.datetime.fromisoformat(line[:26]).replace(tzinfo=datetime.timezone.utc).timestamp() * 1000


def replay(test_bin, log, ipu=False):
    """(wall ms of the window, kind, scope) of every verdict the replay opens."""
    times = [wall_ms(l) for l in open(log) if "ringside::detect::input" in l]
    env = dict(os.environ, RINGSIDE_REPLAY=log)
    if ipu:
        env["RINGSIDE_REPLAY_GRAY_MIN_PEERS"] = "2"  # the IPU agents' [detect.gray] min_peers
    out = subprocess.run(
        [test_bin, "--ignored", "--exact", "detect::scenarios::replay_recorded_windows", "--nocapture"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    opened, window = [], None
    for line in out.splitlines():
        m = re.match(r"w(\d+) ", line)
        if m:
            window = int(m.group(1))
            continue
        m = re.match(r"\s+opened (\w+) (.*?) (Critical|Warning|Info)", line)
        if m and window is not None:
            opened.append((times[window], m.group(1), m.group(2)))
    return opened


def main(eval_dir, test_bin):
    report = json.load(open(os.path.join(eval_dir, "detection.json")))
    per_source = {}
    for run in report["runs"]:
        source, scenario, rep = run["source"], run["scenario"], run["repeat"]
        ipu = run.get("vantage") == "ipu"
        logs = [f"{eval_dir}/detection-logs/{source}-{scenario}-{rep}-agent.log"]
        if ipu:
            # One agent per IPU; agent i's link-scoped events name host i (10.77.0.i+1).
            logs = [f"{eval_dir}/detection-logs/{source}-ipu-{scenario}-{rep}-ipu{i}-agent.log" for i in range(6)]
        elif scenario == "uplink-congestion":
            logs = [f"{eval_dir}/detection-logs/{source}-{scenario}-{rep}-leaf{l}-agent.log" for l in (0, 1)]
        fault, target = run["fault"], run["target"]
        m = re.search(r"\((10\.\d+\.\d+\.\d+)", target)
        ip = m.group(1) if m else None
        m = re.match(r"up(\d)", target)
        leaf = int(m.group(1)) if m else None
        network, stragglers = [], []
        for agent, log in enumerate(logs):
            if not os.path.exists(log):
                continue
            for t, kind, scope in replay(test_bin, log, ipu):
                if kind == "Straggler":
                    stragglers.append(scope)
                    continue
                if ipu and "peer: " not in scope:
                    scope = f"ipu{agent} {scope} (peer: 10.77.0.{agent + 1}, its own host)"
                elif ipu:
                    scope = f"ipu{agent} {scope}"
                ok = False
                if fault and fault["started_unix_ms"] <= t <= fault.get("ended_unix_ms", float("inf")) + 3000:
                    if leaf is not None:
                        ok = kind == "Congestion" and agent == leaf and "uplink" in scope
                    elif ip:
                        ok = f"peer: {ip}," in scope or f"peer: {ip}, its own host" in scope
                network.append((t - (fault["started_unix_ms"] if fault else 0), kind, scope, ok))
        s = per_source.setdefault(source, {"events": 0, "right": 0, "faults": 0, "found": 0, "latency": [], "quiet_runs_events": 0})
        if scenario in ("healthy", "straggler"):
            s["quiet_runs_events"] += len(network)
        else:
            s["faults"] += 1
            s["events"] += len(network)
            s["right"] += sum(1 for e in network if e[3])
            right = [e[0] for e in network if e[3]]
            if right:
                s["found"] += 1
                s["latency"].append(min(right) / 1000)
        events = " ; ".join(f"{k} {sc[:44]} {dt / 1000:+.1f}s {'ok' if ok else 'WRONG'}" for dt, k, sc, ok in network)
        print(f"{source} {scenario} #{rep} target {target[:34]} | {events or 'none'} | straggler verdicts {stragglers or 'none'}")
    for source, s in per_source.items():
        lat = sorted(s["latency"])
        p90 = statistics.quantiles(lat, n=10, method="inclusive")[-1] if len(lat) > 1 else (lat[0] if lat else None)
        print(
            f"{source}: precision {s['right']}/{s['events']}, recall {s['found']}/{s['faults']}, "
            f"latency median {statistics.median(lat) if lat else None} s, p90 {p90} s (all network faults), "
            f"network events in healthy and straggler runs {s['quiet_runs_events']}"
        )


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
