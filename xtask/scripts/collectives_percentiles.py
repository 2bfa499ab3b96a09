#!/usr/bin/env python3
"""Percentiles of ringside's per-step allreduce time in a `cargo xtask bench collectives` run.

Usage: python3 xtask/scripts/collectives_percentiles.py [JOBS_DIR]
(default target/bench/collectives-jobs; copy it away between runs, every run overwrites it).

For each cell directory (ALGORITHM-SIZE-PORT) it takes every rank's per-step `comm_ms` from
rank-*.json, the slowest rank per step (what the bench's median uses), drops the first tenth of the
steps as warm-up, and prints p10, p25 and the median in microseconds. On a loaded machine the median
is dominated by scheduling bursts; p10 is the closest to what the engine costs when it gets the CPU,
so A/B comparisons of two builds under load (`--rank-bin`) read p10 first.
"""
import glob
import json
import os
import sys


def main() -> None:
    jobs = sys.argv[1] if len(sys.argv) > 1 else "target/bench/collectives-jobs"
    cells = sorted(glob.glob(os.path.join(jobs, "*")))
    if not cells:
        sys.exit(f"no cell directories under {jobs}: run `cargo xtask bench collectives` first")
    for cell in cells:
        per_rank = []
        for f in sorted(glob.glob(os.path.join(cell, "rank-*.json"))):
            with open(f) as fh:
                per_rank.append([s["comm_ms"] for s in json.load(fh)["steps"]])
        if not per_rank:
            print(f"{os.path.basename(cell):28s} no rank reports")
            continue
        n = min(len(p) for p in per_rank)
        warm = max(2, n // 10)
        slowest = sorted(max(p[i] for p in per_rank) for i in range(warm, n))
        if not slowest:
            print(f"{os.path.basename(cell):28s} only {n} steps")
            continue
        q = lambda x: slowest[int(x * (len(slowest) - 1))] * 1e3
        print(f"{os.path.basename(cell):28s} n={len(slowest):4d} p10 {q(.1):9.1f} p25 {q(.25):9.1f} med {q(.5):9.1f} us")


if __name__ == "__main__":
    main()
