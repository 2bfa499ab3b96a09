"""Runs real ``torch.distributed`` ranks (gloo over loopback) as spawned processes, and the rank
functions of the torch tests. A separate module (not a test file) so spawned children import it
without pytest's collection.

Each rank: one CPU thread (the machine's cores are shared), ``GLOO_SOCKET_IFNAME=lo`` so all
collective traffic stays on loopback, a file:// rendezvous in the test's temporary directory, a
30 s collective timeout, and its result written with ``torch.save`` to ``rank{r}.pt``.

A rank that finished ends with ``os._exit(0)`` after ``destroy_process_group``: the interpreter's
teardown would otherwise destroy gloo's C++ process group (still referenced by the DDP model and
its comm hook) from finalizers and static destructors. A rank aborted once in CI ("terminate
called without an active exception", SIGABRT, 2026-11-29), which has that signature; it was not
reproduced here (40 runs beside a build), so where it aborted is not known.
A crash before that point still fails the test: ``faulthandler`` prints the rank's Python stack
on a fatal signal, and the failure names the ranks that had not saved their result.
"""

import datetime
import faulthandler
import gc
import logging
import os
import pathlib
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=30)


def _rank_main(rank, world, workdir, fn, args):
    faulthandler.enable()  # a C++ abort prints this rank's Python stack to stderr
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{workdir}/rendezvous", rank=rank, world_size=world, timeout=COLLECTIVE_TIMEOUT)
    try:
        result = fn(rank, world, *args)
        torch.save(result, pathlib.Path(workdir) / f"rank{rank}.pt")
        del result
    finally:
        gc.collect()  # the rank's DDP model and hook, while the interpreter is whole
        dist.destroy_process_group()
    # Done and saved: skip the interpreter's teardown (module docstring). An exception above
    # never gets here, so spawn still reports it with its traceback.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_ranks(fn, world, workdir, *args, timeout=60.0, while_running=None):
    """Runs ``fn(rank, world, *args)`` in ``world`` spawned processes; returns their results by rank.

    ``while_running(deadline)`` runs in the parent meanwhile (to drive a scripted agent). A rank
    that raises fails the test with its traceback; ranks still alive at ``timeout`` are killed.
    """
    workdir = pathlib.Path(workdir)
    ctx = mp.start_processes(_rank_main, args=(world, str(workdir), fn, args), nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    try:
        if while_running is not None:
            while_running(deadline)
        try:
            while not ctx.join(timeout=max(0.0, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    raise AssertionError(f"ranks did not finish within {timeout} s")
        except mp.ProcessExitedException as e:
            missing = [r for r in range(world) if not (workdir / f"rank{r}.pt").exists()]
            raise AssertionError(f"{e}; ranks without a saved result: {missing or 'none'} (their stderr is above)") from e
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()  # only the processes this helper started
            p.join(timeout=5)
    return [torch.load(workdir / f"rank{r}.pt") for r in range(world)]


class _Param(torch.nn.Module):
    """One flat parameter: with ``loss = (w * g).sum()`` its gradient is exactly ``g``, so a test
    chooses each rank's gradient and reads the hook's reduced result back from ``w.grad``."""

    def __init__(self, n):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(n))

    def forward(self, g):
        return (self.w * g).sum()


def _ddp(n):
    return torch.nn.parallel.DistributedDataParallel(_Param(n))


def _reduce(ddp, g):
    ddp.zero_grad(set_to_none=False)
    ddp(g).backward()
    return ddp.module.w.grad.detach().clone()


# -- codec accuracy and error feedback ---------------------------------------------------------------

CODEC_N = 3000  # not a multiple of W·int8_block: exercises the padding


def codec_gradient(rank, seed):
    """Rank ``rank``'s test gradient: large entries in the first 1024, tiny ones after, and an
    all-zero block (so per-block scaling and zero scales are both exercised)."""
    gen = torch.Generator().manual_seed(1000 * seed + rank)
    g = torch.randn(CODEC_N, generator=gen)
    g[:1024] *= 100.0
    g[1024:] *= 0.01
    g[2048:2304] = 0.0
    return g


def codec_worker(rank, world, codecs, ef_codecs, ef_steps):
    import ringside.torch as rt

    ddp = _ddp(CODEC_N)
    hook = rt.use_codec(ddp, "none", error_feedback=False)
    out = {"single": {}, "ef": {}, "nonfinite": {}}
    for seed, name in enumerate(codecs):
        hook.set_plan(name, error_feedback=False)
        g = codec_gradient(rank, seed)
        out["single"][name] = {"input": g, "output": _reduce(ddp, g)}
    # Error feedback: the same gradient every step; the parent compares the running sum of what
    # was reduced with the running sum of the true averages.
    for name in ef_codecs:
        for ef in (False, True):
            hook.set_plan(name, error_feedback=ef)
            g = codec_gradient(rank, 99)
            outs = [_reduce(ddp, g) for _ in range(ef_steps)]
            hook.set_plan("none", error_feedback=False)
            flushed = _reduce(ddp, torch.zeros(CODEC_N))  # the pending residual, sent once under `none`
            out["ef"][(name, ef)] = {"input": g, "outputs": torch.stack(outs), "flushed": flushed, "residual_after_flush": hook.residual_norm}
    # An overflow step: rank 0's gradient holds an inf, rank 1's a NaN (in another int8 block);
    # then a finite step. The parent checks that the overflow reaches every rank and that the
    # next step is finite (error feedback must not carry inf/NaN over).
    for name in ef_codecs:
        hook.set_plan(name, error_feedback=True)
        g = codec_gradient(rank, 7)
        if rank == 0:
            g[5] = float("inf")
        if rank == 1:
            g[1500] = float("nan")
        overflow = _reduce(ddp, g)
        after = [_reduce(ddp, codec_gradient(rank, 8)) for _ in range(2)]
        residual = hook.residual_norm
        hook.set_plan("none", error_feedback=False)
        _reduce(ddp, torch.zeros(CODEC_N))  # flush, so the next codec starts without a residual
        out["nonfinite"][name] = {"overflow": overflow, "after": torch.stack(after), "residual": residual}
    out["buckets_by_codec"] = dict(hook.buckets_by_codec)
    return out


# -- following hints ---------------------------------------------------------------------------------


class _CountWarnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def follow_worker(rank, world, job_url, token, events, stop_version, max_steps, constraints, client_config, step_sleep):
    """Trains a small model for up to ``max_steps``, following hints; stops 3 steps after the plan of
    ``stop_version`` is in force (the same step on every rank, since the version is broadcast).
    Rank 0 reports each applied version on ``events`` as ("applied", version, step) and its step
    count every 10 steps as ("step", step)."""
    import ringside.torch as rt

    warnings = _CountWarnings()
    logging.getLogger("ringside").addHandler(warnings)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    result = {"config_errors": []}
    # A bad url on rank 0 must stop every rank with an error, not leave them waiting.
    try:
        rt.follow_hints(ddp, "ftp://not-an-agent/v1/jobs/j-1" if rank == 0 else job_url, token)
    except Exception as e:  # noqa: BLE001 - recorded for the parent to check
        result["config_errors"].append(f"{type(e).__name__}: {e}")

    follower = rt.follow_hints(ddp, job_url, token if rank == 0 else None, constraints=constraints, client_config=client_config)
    gen = torch.Generator().manual_seed(rank)
    per_step, step_seconds = [], []
    stop_at = None
    announced = set()
    for i in range(max_steps):
        t0 = time.perf_counter()
        follower.step(i)
        step_seconds.append(time.perf_counter() - t0)
        per_step.append((follower.plan_name, follower.hint_version))
        x = torch.randn(32, 64, generator=gen)
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            for step, version, _ in follower.applied:
                if version not in announced:
                    announced.add(version)
                    events.put(("applied", version, step))
            if i % 10 == 0:
                events.put(("step", i))
        if stop_at is None and follower.hint_version == stop_version:
            stop_at = i + 3
        if stop_at is not None and i >= stop_at:
            break
        time.sleep(step_sleep)
    follower.close()
    result.update(
        per_step=per_step,
        step_seconds=step_seconds,
        applied=follower.applied,
        received=follower.received,
        transport_applied=[list(t) for t in follower.transport_applied],
        transport_routes=follower.transport.routes,
        buckets_by_codec=dict(follower.hook.buckets_by_codec),
        rejected=follower.rejected_versions,
        latest_hint_version=follower.latest_hint.version if follower.latest_hint is not None else None,
        warnings=warnings.messages,
        finite=all(torch.isfinite(p).all().item() for p in model.parameters()),
    )
    return result


# -- the plan broadcast off the step's critical path --------------------------------------------------

LATE_S = 1.0  # rank 0 starts this much later than the others
COMPUTE_S = 1.5  # each rank's "step" between follower.step calls


def late_root_worker(rank, world, job_url, steps):
    """Calls ``follower.step`` ``steps`` times with ``COMPUTE_S`` of sleep between, rank 0 starting
    ``LATE_S`` late; returns how long each call took on this rank. A broadcast that blocks in
    ``step`` holds every other rank there until rank 0 arrives (about ``LATE_S`` each step); one
    started at a step and waited for at the next has long completed by then."""
    import ringside.torch as rt

    ddp = _ddp(8)
    # Nobody listens there: rank 0's feed fails open, which is all this test needs of it.
    follower = rt.follow_hints(ddp, job_url, "t" if rank == 0 else None, report_every_s=0)
    if rank == 0:
        time.sleep(LATE_S)
    took = []
    for i in range(steps):
        t0 = time.perf_counter()
        follower.step(i)
        took.append(time.perf_counter() - t0)
        time.sleep(COMPUTE_S)
    follower.close()
    return {"took": took, "plan": follower.plan_name}
