#!/bin/bash
# Rounds of T2 test binaries on a busy machine: the check behind "every T2 test passes 20 runs in a
# row" (issue 9; docs/testing.md says when it was run and what it found).
#
# Each test binary is built once and then run directly, one after the other, so nothing is rebuilt
# between runs and work on the checkout cannot change what the rounds run. Run as root.
#
#   t2_rounds.sh prepare DIR
#       From this checkout (commit it first): the eBPF objects (`cargo xtask build --release`)
#       copied to DIR/frozen, release ringside-rank and ringside-ipu built into DIR/target and
#       copied there too, and every T2 test binary built into DIR/target with the objects
#       embedded; DIR/bins.txt lists them (name, executable, package directory). The tenants'
#       Python package (ringside-client/python/src) is copied to DIR/frozen/python: the PyTorch
#       tests import it from there, so editing the checkout's copy does not change the rounds.
#   t2_rounds.sh run DIR NAME ROUNDS TEST...
#       ROUNDS rounds; each runs the named T2 binaries (e.g. t2_detect t2_adapt) one after the
#       other with `--ignored --test-threads=2`. One line per run in DIR/results-NAME.txt, logs in
#       DIR/logs/. Two `run`s with disjoint TEST lists may go side by side (every T2 test makes
#       its own namespaces). Stops before the next test once DIR/stop exists. FIRST=N starts at
#       round N (to go on with the same binaries after an interruption, appending to the file).
#   t2_rounds.sh load DIR
#       The load: from-scratch release builds of the workspace at nice 10, one after the other,
#       until DIR/stop exists (one line per build in DIR/results-build.txt).
#   t2_rounds.sh summary DIR
#       Per test binary: runs passed / runs, failing rounds, the runs passed in a row at the end
#       (what "N runs in a row" counts: of one build, since each line records a digest of the
#       test binary and the frozen programs), seconds per run, load average range.
set -u
cmd=${1:?usage: t2_rounds.sh prepare|run|load|summary DIR ...}
dir=${2:?usage: t2_rounds.sh $cmd DIR ...}
repo=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

case $cmd in
prepare)
    set -e
    cd "$repo"
    cargo xtask build --release
    mkdir -p "$dir/frozen"
    cp target/ebpf/bpfel-unknown-none/release/flowmon target/ebpf/bpfel-unknown-none/release/ipuwire "$dir/frozen/"
    export CARGO_TARGET_DIR=$dir/target RINGSIDE_EBPF_OBJECT=$dir/frozen/flowmon
    cargo build -q --release -p ipu-firmware --bin ringside-rank --bin ringside-ipu
    cp "$dir/target/release/ringside-rank" "$dir/target/release/ringside-ipu" "$dir/frozen/"
    rm -rf "$dir/frozen/python"
    cp -r ringside-client/python/src "$dir/frozen/python"
    cargo test -q --no-run --workspace --exclude dataplane-ebpf --test 't2_*' --message-format=json >"$dir/build.json"
    python3 - "$dir" <<'PY'
import json, os, sys
d = sys.argv[1]
with open(os.path.join(d, "bins.txt"), "w") as out:
    for line in open(os.path.join(d, "build.json")):
        try:
            m = json.loads(line)
        except ValueError:
            continue
        t = m.get("target", {})
        if m.get("reason") == "compiler-artifact" and m.get("executable") and t.get("kind") == ["test"] and t["name"].startswith("t2_"):
            out.write(f"{t['name']} {m['executable']} {os.path.dirname(m['manifest_path'])}\n")
PY
    echo "prepared $(wc -l <"$dir/bins.txt") T2 test binaries of $(git rev-parse --short HEAD) in $dir"
    ;;
run)
    name=${3:?NAME}
    rounds=${4:?ROUNDS}
    shift 4
    [ $# -gt 0 ] || { echo "no test named" >&2; exit 2; }
    for t in "$@"; do
        grep -q "^$t " "$dir/bins.txt" || { echo "$t is not in $dir/bins.txt (run prepare)" >&2; exit 2; }
    done
    f=$dir/frozen
    export RINGSIDE_EBPF_OBJECT=$f/flowmon RINGSIDE_RANK_BIN=$f/ringside-rank RINGSIDE_IPU_BIN=$f/ringside-ipu
    export CARGO_TARGET_DIR=$dir/target
    # PyTorch tests: the venv of `cargo xtask setup`, with the frozen copy of the tenants' Python
    # package first.
    [ -d "$f/python" ] || { echo "$f/python is missing (run prepare)" >&2; exit 2; }
    export RINGSIDE_PYTHON=${RINGSIDE_PYTHON:-$repo/target/venv/bin/python} PYTHONPATH=$f/python
    mkdir -p "$dir/logs"
    for r in $(seq "${FIRST:-1}" "$rounds"); do
        for t in "$@"; do
            [ -e "$dir/stop" ] && exit 0
            read -r _ exe pkg < <(grep "^$t " "$dir/bins.txt")
            log=$dir/logs/$name-$t-$r.log
            # What runs: the test binary's and the frozen programs' digest, taken before the run
            # starts (a rebuild in place during it is the next run's; `summary` starts a new count).
            bin=$(cat "$exe" "$f/flowmon" "$f/ipuwire" "$f/ringside-rank" "$f/ringside-ipu" | sha256sum | cut -c1-12)
            s=$(date +%s)
            l1=$(cut -d' ' -f1 /proc/loadavg)
            # Bounded: a run that hangs is killed and counts as a failure.
            (cd "$pkg" && timeout -k 30 1800 "$exe" --ignored --test-threads=2) >"$log" 2>&1
            rc=$?
            l2=$(cut -d' ' -f1 /proc/loadavg)
            echo "round $r $t rc=$rc $(($(date +%s) - s))s load $l1->$l2 $(date -u +%H:%M:%S) bin=$bin $(grep -h '^test result' "$log" | tail -1)" >>"$dir/results-$name.txt"
        done
    done
    echo "done $(date -u +%H:%M:%S)" >>"$dir/results-$name.txt"
    ;;
load)
    cd "$repo"
    n=0
    while [ ! -e "$dir/stop" ]; do
        rm -rf "$dir/load-target"
        n=$((n + 1))
        s=$(date +%s)
        nice -n 10 cargo build -q --release --workspace --exclude dataplane-ebpf --target-dir "$dir/load-target" >"$dir/load.log" 2>&1
        echo "build $n rc=$? $(($(date +%s) - s))s $(date -u +%H:%M:%S)" >>"$dir/results-build.txt"
    done
    rm -rf "$dir/load-target"
    ;;
summary)
    python3 - "$dir" <<'PY'
import collections, glob, os, re, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "results-*.txt"))):
    tests = collections.OrderedDict()
    for line in open(f):
        m = re.match(r"round (\d+) (\S+) rc=(\d+) (\d+)s load ([\d.]+)->([\d.]+) (\S+)(?: bin=(\w+))?", line)
        if not m:
            continue
        r, t, rc, s, l1, l2, at, bin = m.groups()
        e = tests.setdefault(t, {"runs": 0, "ok": 0, "failed": [], "streak": 0, "s": [], "load": [], "first": at, "last": at, "bin": None})
        e["runs"] += 1
        e["ok"] += rc == "0"
        # Runs in a row of one build: a run of another binary than the one before starts over
        # (lines written before the digest was recorded carry none and count on).
        same = bin is None or e["bin"] in (None, bin)
        e["streak"] = (e["streak"] if same else 0) + 1 if rc == "0" else 0
        e["bin"] = bin or e["bin"]
        if rc != "0":
            e["failed"].append(int(r))
        e["s"].append(int(s))
        e["load"] += [float(l1), float(l2)]
        e["last"] = at
    if not tests:
        continue
    print(os.path.basename(f))
    for t, e in tests.items():
        print(f"  {t:16} {e['ok']:3}/{e['runs']:<3} failed rounds {e['failed'] or '-'}  {e['streak']:2} in a row  {min(e['s'])}-{max(e['s'])} s  load {min(e['load']):.1f}-{max(e['load']):.1f}  {e['first']}..{e['last']} UTC")
PY
    ;;
*)
    echo "unknown command $cmd: prepare, run, load or summary" >&2
    exit 2
    ;;
esac
