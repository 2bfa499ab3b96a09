"""ringside.torch with real torch.distributed: gloo process groups of spawned ranks on loopback,
real DDP models, the scripted agent on 127.0.0.1 as the hint source.

The parent checks the ranks' results itself (true sums computed here from every rank's input), so
a bug in the hook cannot also bend the reference.
"""

import math
import queue
import socket
import time

import pytest

# A plain import: without torch this module fails to collect (an error), it is never skipped.
import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import ringside  # noqa: E402
import ringside.torch as rt  # noqa: E402
from ddp_ranks import CODEC_N, LATE_S, codec_worker, follow_worker, late_root_worker, run_ranks  # noqa: E402
from scripted_agent import Reply, ScriptedAgent, make_hint  # noqa: E402

TOKEN = "tenant-secret"
WORLD = 3
CODECS = ["none", "fp16", "bf16", "int8", "topk:0.1"]
EF_STEPS = 30
FAST = ringside.ClientConfig(connect_timeout=1.0, request_timeout=3.0, stream_read_timeout=5.0, reconnect=ringside.Backoff(initial=0.05, max=0.2, max_attempts=3))


# -- in-process checks (no process group needed) ------------------------------------------------------


def test_codec_names_and_refusals():
    assert str(rt.parse_codec("topk")) == f"topk:{rt.DEFAULT_TOPK_RATIO}"
    assert str(rt.parse_codec("topk:0.25")) == "topk:0.25"
    with pytest.raises(ringside.ConfigError, match="use none, fp16"):
        rt.parse_codec("zstd")
    with pytest.raises(ringside.ConfigError, match="int8_block"):
        rt.CompressionHook(None, int8_block=0)
    with pytest.raises(ringside.ConfigError, match="init_process_group"):
        rt.use_codec(torch.nn.Linear(2, 2), "int8")


def test_int8_packing_round_trips_any_shard_length():
    # The int8 exchange sends each shard's values and float32 scales in one byte row; a shard of
    # an odd block size puts the scales at an unaligned offset, which must still read back exactly.
    from ringside.torch.codecs import _pack, _unpack

    for shard, per_shard in [(768, 3), (9, 3), (7, 7), (1, 1)]:
        q = torch.randint(-127, 128, (4, shard), dtype=torch.int8)
        scale = torch.rand(4, per_shard) * 1e-3
        rows = _pack(q, scale)
        assert rows.dtype == torch.int8 and rows.shape == (4, shard + 4 * per_shard)
        q2, s2 = _unpack(rows, shard, per_shard)
        assert torch.equal(q2, q)
        assert torch.equal(s2, scale)


# -- codecs on 3 ranks ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def codec_results(tmp_path_factory):
    """One 3-rank run computing every codec's reduction and the error-feedback series."""
    return run_ranks(codec_worker, WORLD, tmp_path_factory.mktemp("codecs"), CODECS, ["topk:0.05", "int8"], EF_STEPS, timeout=90)


def _inputs_and_output(results, codec):
    xs = torch.stack([r["single"][codec]["input"] for r in results]).double()
    outs = [r["single"][codec]["output"].double() for r in results]
    for o in outs[1:]:
        assert torch.equal(o, outs[0]), f"{codec}: ranks disagree on the reduced gradient"
    return xs, outs[0]


def test_none_is_the_exact_average(codec_results):
    xs, out = _inputs_and_output(codec_results, "none")
    err = (out - xs.mean(0)).abs()
    assert (err <= 1e-6 * xs.abs().sum(0) / WORLD + 1e-12).all()


@pytest.mark.parametrize("codec,unit", [("fp16", 2.0**-11), ("bf16", 2.0**-8)])
def test_half_precision_codecs_within_their_rounding_bound(codec_results, codec, unit):
    xs, out = _inputs_and_output(codec_results, codec)
    true = xs.mean(0)
    # Each rank's value rounds once, then every add of the W-rank sum rounds once more.
    bound = (WORLD + 2) * unit * xs.abs().sum(0) / WORLD + 2.0**-24
    err = (out - true).abs()
    assert (err <= bound).all(), f"{codec}: worst error {float((err - bound).max()):.3g} over the bound"
    assert err.max() > 0, f"{codec} was exact: the codec did not run"


def test_int8_within_its_per_block_bound(codec_results):
    xs, out = _inputs_and_output(codec_results, "int8")
    b = rt.INT8_BLOCK
    true_sum = xs.sum(0)
    err = (out - true_sum / WORLD).abs()
    for start in range(0, CODEC_N, b):
        blk = slice(start, min(start + b, CODEC_N))
        m_ranks = xs[:, blk].abs().amax(1).sum()  # Σ_r M_r
        # The summed block that is requantized is itself off by at most Σ_r M_r / 254.
        m_sum = true_sum[blk].abs().max() + m_ranks / 254
        bound = (m_ranks + m_sum) / (254 * WORLD) * (1 + 1e-5) + 1e-12
        assert (err[blk] <= bound).all(), f"block at {start}: error {float(err[blk].max()):.3g} > bound {float(bound):.3g}"
    # Per-block scales: the tiny entries (0.01 scale) keep a tiny error next to entries 10^4 larger.
    assert err[1024:2048].max() < 1e-3
    assert (out[2048:2304] == 0).all(), "an all-zero block must come back exactly zero"
    assert (err[:1024].max() > 0), "int8 was exact: the codec did not run"


def test_topk_is_the_average_of_each_ranks_largest_entries(codec_results):
    xs, out = _inputs_and_output(codec_results, "topk:0.1")
    k = math.ceil(0.1 * CODEC_N)
    ref = torch.zeros(CODEC_N, dtype=torch.float64)
    taus = []
    for x in xs:
        _, idx = x.abs().topk(k)
        ref[idx] += x[idx]
        taus.append(x.abs()[idx].min())
    ref /= WORLD
    assert torch.allclose(out, ref, rtol=1e-6, atol=1e-9)
    err = (out - xs.mean(0)).abs()
    assert (err <= sum(taus) / WORLD * (1 + 1e-6)).all()
    assert (out != 0).sum() <= WORLD * k


def _accumulated_error(entry):
    """Relative error of the running sum of reduced gradients after each step."""
    true = torch.stack([entry_r["input"] for entry_r in entry]).double().mean(0)
    outs = entry[0]["outputs"].double()
    steps = torch.arange(1, outs.shape[0] + 1, dtype=torch.float64)[:, None]
    return ((outs.cumsum(0) - steps * true).norm(dim=1) / (steps[:, 0] * true.norm()))


@pytest.mark.parametrize("codec", ["topk:0.05", "int8"])
def test_error_feedback_shrinks_the_accumulated_error(codec_results, codec):
    with_ef = _accumulated_error([r["ef"][(codec, True)] for r in codec_results])
    without = _accumulated_error([r["ef"][(codec, False)] for r in codec_results])
    last = EF_STEPS - 1
    # Without feedback the same entries are lost every step: the relative error stays put.
    assert without[last] > 0.5 * without[0]
    # With feedback what was dropped is sent later: the error of the running sum falls ~1/steps.
    assert with_ef[last] < 0.5 * with_ef[9], f"{codec}: {with_ef[9]:.3g} -> {with_ef[last]:.3g}"
    assert with_ef[last] < 0.25 * without[last], f"{codec}: with EF {with_ef[last]:.3g}, without {without[last]:.3g}"
    # Switching to `none` sends the residual once: the running sum is then (nearly) exact.
    true = torch.stack([r["ef"][(codec, True)]["input"] for r in codec_results]).double().mean(0)
    e = codec_results[0]["ef"][(codec, True)]
    total = e["outputs"].double().sum(0) + e["flushed"].double()
    assert (total - EF_STEPS * true).norm() / (EF_STEPS * true.norm()) < 1e-5
    assert all(r["ef"][(codec, True)]["residual_after_flush"] == 0.0 for r in codec_results)


@pytest.mark.parametrize("codec", ["topk:0.05", "int8"])
def test_an_overflow_reaches_every_rank_and_error_feedback_does_not_carry_it(codec_results, codec):
    outs = [r["nonfinite"][codec] for r in codec_results]
    for o in outs:
        # What a loss scaler checks: the reduced gradient is not finite on any rank.
        assert not torch.isfinite(o["overflow"]).all(), f"{codec}: the inf/NaN did not reach every rank"
        # The next steps, with error feedback, are finite everywhere (without the reset the
        # residual made these positions NaN for good).
        assert torch.isfinite(o["after"]).all(), f"{codec}: a step after the overflow is not finite"
        assert math.isfinite(o["residual"])
    for o in outs[1:]:
        assert torch.equal(o["after"], outs[0]["after"]), f"{codec}: ranks disagree after the overflow"


# -- reporting the plan and its step times (rank 0's reporter, no process group needed) -------------


def test_the_reporter_sends_each_plan_at_once_then_its_mean_step_time(caplog):
    from ringside.torch.follower import _PlanReporter

    none = {"algorithm": "ring", "chunk_bytes": 1 << 20, "channels": 1, "compression": "none", "error_feedback": False}
    int8 = dict(none, compression="int8", error_feedback=True)
    with ScriptedAgent({TOKEN: "j-1"}) as agent:
        rep = _PlanReporter(ringside.JobClient(agent.job_url(), TOKEN, config=FAST), 0.2)
        try:
            rep.step_done(9.0)  # before any plan: not reported
            rep.plan_changed(none, 10)
            first = agent.wait_plan_reports(1)[0]
            assert first == dict(none, step=10), "at once, without a step time: no step of it has ended yet"
            for d in (0.1, 0.2, 0.3):
                rep.step_done(d)
            reports = agent.wait_plan_reports(2)
            assert reports[1]["step_time_ms"] == pytest.approx(200.0) and reports[1]["compression"] == "none"
            rep.step_done(0.5)  # a step of the old plan, then the switch: dropped
            rep.plan_changed(int8, 14)
            rep.step_done(0.05)
            deadline = time.monotonic() + 10
            while not any(r["compression"] == "int8" and "step_time_ms" in r for r in agent.plan_reports()):
                assert time.monotonic() < deadline, agent.plan_reports()
                time.sleep(0.05)
            timed = [r for r in agent.plan_reports() if r["compression"] == "int8" and "step_time_ms" in r]
            assert timed[0]["step_time_ms"] == pytest.approx(50.0) and timed[0]["step"] == 14
            assert all(r.get("step_time_ms") in (None, pytest.approx(200.0)) for r in agent.plan_reports() if r["compression"] == "none")
            # Fail open: an agent that refuses is logged once, and reporting goes on.
            agent.script("plan", *[Reply.error(500, "boom")] * 3)
            n = len(agent.plan_reports())
            agent.wait_plan_reports(n + 1, timeout=10)
            assert sum("plan report failed" in r.getMessage() for r in caplog.records) == 1
        finally:
            rep.close()
        assert not rep._thread.is_alive()


# -- following hints -------------------------------------------------------------------------------------


def _wait_event(events, want, deadline, what):
    """Next event matching ``want`` from rank 0, before ``deadline``."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"timed out waiting for {what}")
        try:
            ev = events.get(timeout=min(left, 1.0))
        except queue.Empty:
            continue
        if want(ev):
            return ev


@pytest.fixture(scope="module")
def follow_run(tmp_path_factory):
    """One 3-rank training run following hints, driven through every phase:

    1. no agent listening at the job url for the first 30 steps (fail open);
    2. the agent comes up on that port serving v1 (`none`), then v2 (`int8`, from the next step);
    3. v3 (`topk:0.25`, with transport advice: a 5 ms retransmission floor) for a step 25 steps
       ahead;
    4. v4 (`topk:0.01`), below the job's min_topk_ratio (0.1): refused;
    5. v5 (`bf16`, the advice withdrawn); the ranks stop 3 steps after it is in force.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free now; the agent binds it later (a race only with strangers)
    job_url = f"http://127.0.0.1:{port}/v1/jobs/j-1"
    events = mp.get_context("spawn").Queue()
    seen = {}
    agents = []

    def drive(deadline):
        _wait_event(events, lambda e: e[0] == "step" and e[1] >= 30, deadline, "30 steps without an agent")
        agent = ScriptedAgent({TOKEN: "j-1"}, port=port)
        agents.append(agent)
        agent.__enter__()
        agent.publish(make_hint("j-1", 1))
        seen["agent_up_step"] = _wait_event(events, lambda e: e[:2] == ("applied", 1), deadline, "v1 applied")[2]
        agent.publish(make_hint("j-1", 2, "int8"))
        s2 = _wait_event(events, lambda e: e[:2] == ("applied", 2), deadline, "v2 applied")[2]
        # A plan for a future step: it must start exactly there (or on arrival, if that is later).
        seen["v3_step_from"] = s2 + 25
        agent.publish(make_hint("j-1", 3, "topk:0.25", step_from=s2 + 25, tcp_rto_min_ms=5))
        _wait_event(events, lambda e: e[:2] == ("applied", 3), deadline, "v3 applied")
        agent.publish(make_hint("j-1", 4, "topk:0.01"))
        time.sleep(0.3)
        agent.publish(make_hint("j-1", 5, "bf16", error_feedback=False))

    try:
        constraints = ringside.Constraints(min_topk_ratio=0.1, transport_tuning=True)
        results = run_ranks(
            follow_worker, WORLD, tmp_path_factory.mktemp("follow"), job_url, TOKEN, events, 5, 1500, constraints, FAST, 0.01, timeout=120, while_running=drive
        )
        seen["stream_requests"] = agents[0].stream_requests()
        seen["plan_reports"] = agents[0].plan_reports()
    finally:
        for a in agents:
            a.stop()
    return results, seen


def test_every_rank_runs_the_same_plan_at_every_step(follow_run):
    results, _ = follow_run
    per_step = [r["per_step"] for r in results]
    assert all(p == per_step[0] for p in per_step), "ranks ran different plans at some step"
    for r in results:
        assert r["applied"] == results[0]["applied"]
        assert r["finite"]
    applied = results[0]["applied"]
    assert [(v, p) for _, v, p in applied] == [(1, "none"), (2, "int8"), (3, "topk:0.25"), (5, "bf16")]
    for step, version, name in applied:  # the plan in force per step matches the applied list
        assert per_step[0][step] == (name, version)
        assert per_step[0][step - 1][1] != version


def test_transport_advice_reaches_every_rank_at_the_plans_step(follow_run):
    # The ranks' peers are on loopback here, which has no retransmission floor to set: each rank
    # applies the advice to no route, without a problem (routes themselves: test_transport.py).
    for r in follow_run[0]:
        at = {v: s for s, v, _ in r["applied"]}
        assert r["transport_applied"] == [[at[3], 5, [], []], [at[5], None, [], []]], r["transport_applied"]
        assert r["transport_routes"] == []


def test_the_codecs_of_the_hints_really_reduce_the_gradients(follow_run):
    for r in follow_run[0]:
        for name in ("none", "int8", "topk:0.25", "bf16"):
            assert r["buckets_by_codec"].get(name, 0) > 0, f"{name} never reduced a bucket"


def test_a_plan_for_a_future_step_starts_exactly_there(follow_run):
    results, seen = follow_run
    for r in results:
        got = {v: (s, sf) for s, v, sf in r["received"]}
        step3 = next(s for s, v, _ in r["applied"] if v == 3)
        assert got[3][1] == seen["v3_step_from"]
        assert step3 == max(got[3][0], seen["v3_step_from"])
        # Hints with step_from 0 apply at the step they reach the ranks.
        assert next(s for s, v, _ in r["applied"] if v == 2) == got[2][0]


def test_a_hint_outside_the_constraints_is_refused_and_logged_once(follow_run):
    r0 = follow_run[0][0]
    assert r0["rejected"] == [4]
    assert r0["latest_hint_version"] == 5 and all(r["latest_hint_version"] is None for r in follow_run[0][1:])
    assert 4 not in [v for _, v, _ in r0["applied"]]
    assert sum("outside the job's constraints" in m for m in r0["warnings"]) == 1


def test_training_goes_on_while_the_agent_is_down(follow_run):
    results, seen = follow_run
    r0 = results[0]
    first = next(i for i, (_, v) in enumerate(r0["per_step"]) if v is not None)
    assert first == seen["agent_up_step"] and first >= 30
    assert all(p == ("none", None) for p in r0["per_step"][:first])
    # Failing open never stalls the training loop: step() is a broadcast, never a network wait.
    assert max(r0["step_seconds"]) < 0.5, f"slowest step() took {max(r0['step_seconds']):.3f} s"
    # Logged once for the whole outage, although the background retried many times: rank 0's
    # only other warning is the refused hint.
    assert sum("hints unavailable" in m for m in r0["warnings"]) == 1, r0["warnings"]
    assert len(r0["warnings"]) == 2, r0["warnings"]


def test_rank_0_reports_each_plan_it_applies(follow_run):
    results, seen = follow_run
    reported = [r["compression"] for r in seen["plan_reports"]]
    # At once when a plan takes effect (refreshes repeat it): the applied plans in order, perhaps
    # without the last one (the ranks stop 3 steps after it).
    distinct = [c for i, c in enumerate(reported) if i == 0 or reported[i - 1] != c]
    assert distinct[:3] == ["none", "int8", "topk:0.25"], reported
    applied_at = {name: step for step, _, name in results[0]["applied"]}
    for r in seen["plan_reports"]:
        assert r["step"] == applied_at[r["compression"]], r
        assert r.get("step_time_ms", 1.0) > 0


def test_only_rank_0_talks_to_the_agent(follow_run):
    results, seen = follow_run
    reqs = seen["stream_requests"]
    assert len(reqs) == 1 and reqs[0].headers["authorization"] == f"Bearer {TOKEN}"
    assert all(r["warnings"] == [] for r in results[1:])


def test_a_bad_job_url_on_rank_0_stops_every_rank_with_an_error(follow_run):
    results, _ = follow_run
    assert all(len(r["config_errors"]) == 1 and r["config_errors"][0].startswith("ConfigError") for r in results)
    assert "use http://" in results[0]["config_errors"][0]
    assert all("rank 0 could not start" in r["config_errors"][0] for r in results[1:])


def test_the_plan_broadcast_does_not_hold_up_a_step(tmp_path):
    # Rank 0 starts 1 s late; the others must not wait for it inside follower.step: each step's
    # broadcast runs behind the step's compute and is collected at the next step.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    results = run_ranks(late_root_worker, 2, tmp_path, f"http://127.0.0.1:{port}/v1/jobs/j-1", 4, timeout=60.0)
    took = results[1]["took"]
    assert len(took) == 4 and results[0]["plan"] == "none"
    assert max(took) < LATE_S / 2, f"rank 1 waited in follower.step for the late rank 0: {took}"
