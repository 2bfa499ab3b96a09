#!/usr/bin/env python3
"""Scores the IPU runs of `cargo xtask eval detection --vantage ipu` twice from their raw events:
through the fleet view (the `events` the eval scored) and through the plain merge with one event per
host (network events of any kind naming one host with overlapping lifetimes counted once: the
fleet's unit), so the two can be compared on the same runs. Runs written before the eval printed
that line itself (session 36: its JSON's `merged_events` are per kind) are scored here.

Usage: python3 xtask/scripts/ipu_fleet_vs_merge.py target/eval-ipu-fleet2 [more out-dirs]

Scoring as the eval's (xtask/src/eval_detection.rs, `summarize`): network-fault runs only
(stragglers and healthy runs left out); an event matches a fault when raised within [fault start,
fault end + 3 s]; precision = matching events naming the faulted host / all network events of
those runs; a fault is detected when some event matches it; latency = the first matching event's
raise - the fault's start.
"""
import json
import statistics
import sys

GRACE_MS = 3000  # eval_detection.rs GRACE_MS


def named_host(agent, e, own):
    s = e["scope"]
    if s["type"] == "peer":
        return s["peer"]
    return own[agent]


def plain_merge_per_host(raw, own):
    """merge_ipu_events_by(.., by_kind = false) over the network events."""
    items = sorted(((x["event"]["raised_unix_ms"], x["agent"], x["event"]) for x in raw if x["event"]["kind"] in ("congestion", "gray_failure")), key=lambda t: (t[0], t[1]))
    out = []  # [raised, ended or None, host]
    for raised, agent, e in items:
        h = named_host(agent, e, own)
        end = e.get("ended_unix_ms")
        same = next((m for m in out if m[2] == h and (m[1] is None or raised <= m[1])), None)
        if same:
            same[1] = None if same[1] is None or end is None else max(same[1], end)
        else:
            out.append([raised, end, h])
    return [(m[0], m[2]) for m in out]


def score(runs):
    net = right = faults = detected = 0
    lat = []
    for r in runs:
        f = r["fault"]
        start, end = f["started_unix_ms"], f["ended_unix_ms"] + GRACE_MS
        host = r["faulted"]
        evs = r["events"]
        net += len(evs)
        matching = sorted((raised, h) for raised, h in evs if start <= raised <= end)
        right += sum(1 for _, h in matching if h == host)
        faults += 1
        if matching:
            detected += 1
            lat.append((matching[0][0] - start) / 1e3)
    p = right / net if net else float("nan")
    med = statistics.median(lat) if lat else float("nan")
    return f"{detected}/{faults} detected, median latency {med:.1f} s, precision {p:.2f} ({right}/{net})"


def main():
    for d in sys.argv[1:]:
        data = json.load(open(f"{d}/detection.json"))
        own = [f"10.77.0.{i + 1}" for i in range(6)]  # the IpuStar's hosts, agent i on host i
        fleet, merge = [], []
        for r in data["runs"]:
            if r.get("vantage") != "ipu" or not r.get("fault") or r["scenario"] == "straggler" or r.get("error"):
                continue
            faulted = r["target"].split("(")[1].split(",")[0]
            fleet.append({"fault": r["fault"], "faulted": faulted, "events": [(x["event"]["raised_unix_ms"], x["event"]["ipu_named_host"]) for x in r["events"] if x["event"]["kind"] != "straggler"]})
            merge.append({"fault": r["fault"], "faulted": faulted, "events": plain_merge_per_host(r["raw_events"], own)})
        print(f"{d}: fleet {score(fleet)}; plain merge, one event per host: {score(merge)}")


if __name__ == "__main__":
    main()
