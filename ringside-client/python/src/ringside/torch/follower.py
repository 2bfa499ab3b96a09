"""Following ringside's hints in a DDP training job: every rank switches codec at the same step.

How it works:

- Only rank 0 (of the DDP process group) talks to the agent: a background daemon thread
  (:class:`_HintFeed`) follows the job's hint stream and keeps the newest hint that fits the
  tenant's constraints. The training loop never waits for it.
- At ``follower.step(i)`` (once per step, on every rank, before the forward pass) rank 0
  starts a broadcast of the newest hint's (version, codec, error feedback, step_from, transport
  advice) through the process group: six float64 values, sent while the step computes. At the
  next synchronised step ``j`` every rank waits for it (long done by then) and a hint newer than
  the last one seen becomes *pending*, taking effect at step ``max(step_from, j)``; since every
  rank takes the same values at the same step, every rank switches at the same step. With
  ``sync_every=N`` the broadcast runs only every N steps (hints then take up to N-1 steps longer
  to arrive); pending plans still apply at their exact step.
- Rank 0 also tells the agent which plan runs and how long its steps take (:class:`_PlanReporter`,
  ``PUT {job}/plan`` from another daemon thread: at once when a plan takes effect, then every
  ``report_every_s``, 1 s, with the mean time of the steps since the previous report, all under
  that plan). The network shows the agent when bytes move, not what a codec costs the job's CPU
  or the overlap with the backward pass it gives up; with the job's step times the agent keeps a
  codec only if the steps got faster. ``report_every_s=0`` turns reporting off.
- Transport advice (``Hint.tcp_rto_min_ms``, for jobs registered with ``transport_tuning`` and
  followed with constraints that allow it): it travels in the same broadcast and every rank applies
  it at the same step, as a floor for TCP's retransmission timeout on the routes to the peers its
  process is connected to (:mod:`ringside.transport`: host routes, needs ``CAP_NET_ADMIN``); the
  routes are removed when the advice ends and at :meth:`HintFollower.close`. Applying it runs a
  few ``ip`` commands per peer in that step, once per change. A rank that cannot apply it logs
  why and trains on.
- Fail open: if the agent is unreachable, the stream fails, or a hint breaks the constraints, the
  job keeps its current plan, logs the problem once (at WARNING, until it recovers) and keeps
  retrying in the background with bounded backoff. A plan already in force stays in force when
  its hint expires: ringside renews live hints, and an expired one only means the agent is gone.

Overhead: one broadcast of 48 bytes per synchronised step, off the step's critical path: it
runs behind the forward and backward pass and is waited for one synchronised step later, so a
hint takes effect one synchronised step after rank 0 read it. A blocking broadcast there held
every rank until rank 0 arrived: 0.19 ms with 2 ranks and 0.27 ms with 3 on loopback (median, 2
busy cores; p99 4-5 ms). Use ``sync_every`` to broadcast less often.
"""

import dataclasses
import logging
import math
import socket
import threading
import time
import urllib.parse
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist

from ..client import Backoff, ClientConfig, JobClient
from ..errors import ConfigError, RingsideError
from ..hints import Codec, CodecFamily, Constraints, Hint
from ..transport import RtoRoutes, connected_peers
from .codecs import INT8_BLOCK, CompressionHook, compression_hook, parse_codec

__all__ = ["HintFollower", "follow_hints", "use_codec"]

log = logging.getLogger("ringside.torch")

_FAMILIES = list(CodecFamily)
# step_from travels as a float64: clamp to what it represents exactly.
_MAX_EXACT = float(2**53)


def _check_ddp(ddp_model) -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise ConfigError("torch.distributed is not initialised: call torch.distributed.init_process_group(...) before wrapping the model in DDP")
    if not hasattr(ddp_model, "register_comm_hook"):
        raise ConfigError(f"expected a torch.nn.parallel.DistributedDataParallel model, got {type(ddp_model).__name__}: wrap it in DDP first")


def _group_of(ddp_model, process_group):
    return process_group if process_group is not None else getattr(ddp_model, "process_group", None)


def _device_for(process_group) -> torch.device:
    # NCCL only moves CUDA tensors; gloo (and others) take CPU tensors.
    backend = dist.get_backend(process_group)
    if str(backend).lower() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def use_codec(ddp_model, name="none", *, error_feedback: bool = True, process_group=None, int8_block: int = INT8_BLOCK) -> CompressionHook:
    """Registers the compression hook with a fixed codec (``"none"``, ``"fp16"``, ``"bf16"``,
    ``"int8"``, ``"topk"`` or ``"topk:R"``) and returns it (``.plan_name``, ``.set_plan``).

    ``error_feedback`` applies to int8 and top-k. DDP allows one hook per model, so this cannot
    be combined with :func:`follow_hints` on the same model.
    """
    _check_ddp(ddp_model)
    hook = CompressionHook(_group_of(ddp_model, process_group), codec=name, error_feedback=error_feedback, int8_block=int8_block)
    ddp_model.register_comm_hook(hook, compression_hook)
    return hook


class _HintFeed:
    """Rank 0's background follower of the hint stream (daemon thread, never blocks training)."""

    def __init__(self, client: JobClient, constraints: Constraints):
        self._client = client
        self._constraints = constraints
        self._lock = threading.Lock()
        self._latest: Optional[Hint] = None
        self._stop = threading.Event()
        self._stream = None
        self._trouble: Optional[str] = None
        #: Versions refused because they break the constraints.
        self.rejected: List[int] = []
        self._thread = threading.Thread(target=self._run, name="ringside-hints", daemon=True)
        self._thread.start()

    def latest(self) -> Optional[Hint]:
        with self._lock:
            return self._latest

    def close(self, timeout: float = 2.0) -> None:
        self._stop.set()
        s = self._stream
        if s is not None:
            s.close()
        self._thread.join(timeout)

    def _problem(self, what: str) -> None:
        # Log once per outage: a hint stream that stays down would otherwise fill the log.
        if self._trouble is None:
            log.warning("ringside hints unavailable (%s); training goes on with the current plan and retries in the background", what)
        else:
            log.debug("ringside hints still unavailable: %s", what)
        self._trouble = what

    def _healthy(self) -> None:
        if self._trouble is not None:
            log.info("ringside hints available again")
            self._trouble = None

    def _run(self) -> None:
        backoff = self._client.config.reconnect
        rounds = 0
        # One stream at a time; each ends by giving up (bounded backoff inside), by an error, or by
        # the job's deletion. Between streams, wait with the same bounded backoff. Runs until close().
        while not self._stop.is_set():
            # The stream reports each retried failure here (not as its own warnings), so an outage
            # is logged once however many streams and attempts it spans.
            stream = self._client.stream_retrying(on_failure=lambda err, attempt: self._problem(str(err)))
            self._stream = stream
            if self._stop.is_set():
                break
            try:
                for hint in stream:
                    rounds = 0
                    self._healthy()
                    why = self._constraints.why_not(hint)
                    if why is not None:
                        self.rejected.append(hint.version)
                        log.warning("ignoring ringside hint v%d (%s): outside the job's constraints: %s; keeping the current plan", hint.version, hint.compression, why)
                        continue
                    if hint.tcp_rto_min_ms is not None and not self._constraints.transport_tuning:
                        # The plan is still good; only the advice is not this job's to take.
                        log.info("ringside hint v%d advises a %d ms TCP retransmission floor; not applied: the constraints given to follow_hints have transport_tuning off", hint.version, hint.tcp_rto_min_ms)
                        hint = dataclasses.replace(hint, tcp_rto_min_ms=None)
                    with self._lock:
                        self._latest = hint
                if not self._stop.is_set():
                    self._problem("the hint stream ended: the job was deleted")
            except RingsideError as e:
                self._problem(str(e))
            except Exception as e:  # noqa: BLE001 - fail open: the thread must outlive any bug here
                self._problem(f"unexpected {type(e).__name__}: {e}")
            finally:
                stream.close()
            rounds += 1
            self._stop.wait(backoff.delay(rounds))


class _PlanReporter:
    """Rank 0's reports of the plan in force and its step times (daemon thread, never blocks
    training: ``step_done`` and ``plan_changed`` only update a few fields under a lock)."""

    def __init__(self, client: JobClient, every_s: float):
        self._client = client
        self._every_s = every_s
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._plan: Optional[dict] = None
        self._step = 0
        self._count = 0
        self._total_s = 0.0
        self._trouble: Optional[str] = None
        #: Reports the agent accepted (for logs and tests).
        self.sent = 0
        self._thread = threading.Thread(target=self._run, name="ringside-plan-report", daemon=True)
        self._thread.start()

    def plan_changed(self, plan: dict, step_index: int) -> None:
        """A new plan runs from ``step_index``: steps timed so far ran the old one and are dropped."""
        with self._lock:
            self._plan, self._step, self._count, self._total_s = dict(plan), step_index, 0, 0.0
        self._wake.set()

    def step_done(self, seconds: float) -> None:
        """One step of the plan in force took ``seconds``."""
        with self._lock:
            if self._plan is not None:
                self._count += 1
                self._total_s += seconds

    def close(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)

    def _take(self) -> Optional[dict]:
        with self._lock:
            if self._plan is None:
                return None
            body = dict(self._plan, step=self._step)
            if self._count:
                body["step_time_ms"] = self._total_s / self._count * 1e3
            self._count, self._total_s = 0, 0.0
            return body

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._every_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            body = self._take()
            if body is None:
                continue
            try:
                self._client.report_plan(**body)
                self.sent += 1
                if self._trouble is not None:
                    log.info("ringside plan reports accepted again")
                    self._trouble = None
            except Exception as e:  # noqa: BLE001 - fail open: training never depends on a report
                if self._trouble is None:
                    log.warning("ringside plan report failed (%s); training goes on, reports are retried every %.1f s", e, self._every_s)
                self._trouble = str(e)


class HintFollower:
    """What :func:`follow_hints` returns. Call :meth:`step` once per training step on every rank."""

    def __init__(
        self,
        ddp_model,
        job_url: str,
        token: Optional[str] = None,
        process_group=None,
        *,
        constraints: Optional[Constraints] = None,
        initial="none",
        sync_every: int = 1,
        int8_block: int = INT8_BLOCK,
        client_config: Optional[ClientConfig] = None,
        report_every_s: float = 1.0,
    ):
        _check_ddp(ddp_model)
        if isinstance(report_every_s, bool) or not isinstance(report_every_s, (int, float)) or not math.isfinite(report_every_s) or report_every_s < 0:
            raise ConfigError(f"report_every_s {report_every_s!r} must be a number of seconds >= 0 (0: do not report)")
        if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
            raise ConfigError(f"sync_every {sync_every!r} must be a whole number of steps >= 1")
        if constraints is not None and not isinstance(constraints, Constraints):
            constraints = Constraints.from_json(constraints)
        self.constraints = constraints or Constraints()
        self.process_group = _group_of(ddp_model, process_group)
        pg = self.process_group
        self.rank = dist.get_rank(pg)
        self._src = dist.get_global_rank(pg, 0) if pg is not None and pg is not dist.GroupMember.WORLD else 0
        self._device = _device_for(pg)
        self.sync_every = sync_every
        self.hook = CompressionHook(pg, codec=initial, error_feedback=self.constraints.error_feedback, int8_block=int8_block)

        # Rank 0 checks the url and token; every rank learns the verdict, so a bad configuration
        # stops all ranks with an error instead of leaving the others waiting in a collective.
        problem: Optional[ConfigError] = None
        client = None
        if self.rank == 0:
            try:
                client = JobClient(job_url, token, config=client_config)
            except ConfigError as e:
                problem = e
        ok = torch.tensor([0.0 if problem else 1.0], dtype=torch.float64, device=self._device)
        dist.broadcast(ok, self._src, group=pg)
        if problem is not None:
            raise problem
        if ok.item() != 1.0:
            raise ConfigError("rank 0 could not start following ringside hints (bad job url or token): see rank 0's error")

        ddp_model.register_comm_hook(self.hook, compression_hook)
        #: The routes that carry transport advice (every rank, in its own process).
        self.transport = RtoRoutes()
        #: (step, tcp_rto_min_ms or None, peers whose route carries it, problems) of every change
        #: of transport advice.
        self.transport_applied: List[Tuple[int, Optional[int], List[str], List[str]]] = []
        #: The agent's addresses: rank 0's connection to it is not the job's.
        self._agent_addrs = _addresses_of(job_url) if self.rank == 0 else []
        self._feed = _HintFeed(client, self.constraints) if client is not None else None
        self._reporter = _PlanReporter(client, float(report_every_s)) if client is not None and report_every_s > 0 else None
        #: Rank 0: the hints broadcast, by version, until their plan takes effect.
        self._hints: dict = {}
        self._step_started: Optional[float] = None
        #: Version of the hint whose plan is in force, or None (the initial plan).
        self.hint_version: Optional[int] = None
        #: The newest version seen (applied or pending).
        self._seen_version = 0
        self._pending: Optional[Tuple[int, Codec, bool, int, Optional[int]]] = None  # version, codec, ef, apply_at, rto
        #: The broadcast started at the previous synchronised step: (work, its message).
        self._inflight: Optional[Tuple[object, torch.Tensor]] = None
        self._last_step: Optional[int] = None
        #: (step, version, plan name) of every plan change, on every rank.
        self.applied: List[Tuple[int, int, str]] = []
        #: (step, version, step_from) at which each new hint reached this rank.
        self.received: List[Tuple[int, int, int]] = []

    # -- what the training loop sees -------------------------------------------------------------

    @property
    def plan_name(self) -> str:
        """The codec in force: ``"none"``, ``"fp16"``, ``"bf16"``, ``"int8"`` or ``"topk:R"``."""
        return self.hook.plan_name

    @property
    def latest_hint(self) -> Optional[Hint]:
        """The newest hint rank 0 accepted (whole, with algorithm, channels and reasons), whether
        or not its plan is in force yet; None on other ranks and before the first hint."""
        return self._feed.latest() if self._feed is not None else None

    @property
    def rejected_versions(self) -> List[int]:
        """Hint versions refused because they break the constraints (rank 0 only; [] elsewhere)."""
        return list(self._feed.rejected) if self._feed is not None else []

    def step(self, step_index: int) -> None:
        """Call once per training step on every rank, before the forward pass, with the same
        ``step_index`` everywhere. Collective (a small broadcast) on synchronised steps."""
        if isinstance(step_index, bool) or not isinstance(step_index, int) or step_index < 0:
            raise ValueError(f"step_index {step_index!r} must be a whole number >= 0 (the training step)")
        if self._last_step is not None and step_index <= self._last_step:
            raise ValueError(f"step_index {step_index} is not after the previous step {self._last_step}: pass the training step, increasing")
        self._last_step = step_index
        now = time.monotonic()
        if self._reporter is not None and self._step_started is not None:
            # The step that just ended ran the plan in force until now.
            self._reporter.step_done(now - self._step_started)
        self._step_started = now
        if step_index % self.sync_every == 0:
            self._sync(step_index)
        p = self._pending
        if p is not None and p[3] <= step_index:
            version, codec, ef, _, rto = p
            self._pending = None
            self.hook.set_plan(codec, ef)
            if rto != self.transport.rto_min_ms:
                self._apply_transport(step_index, rto)
            self.hint_version = version
            self.applied.append((step_index, version, str(codec)))
            hint = self._hints.pop(version, None)
            self._hints = {v: h for v, h in self._hints.items() if v > version}
            if self._reporter is not None and hint is not None:
                plan = {"algorithm": hint.algorithm.value, "chunk_bytes": hint.chunk_bytes, "channels": hint.channels, "compression": str(codec), "error_feedback": ef}
                self._reporter.plan_changed(plan, step_index)
            if self.rank == 0:
                log.info("ringside hint v%d applied at step %d: compression %s%s", version, step_index, codec, " with error feedback" if ef else "")

    def close(self) -> None:
        """Stops rank 0's background stream (the hook stays registered with the current plan) and
        removes the routes of transport advice. Collective when a broadcast is in flight (every
        rank that called :meth:`step` equally often has one): waits for it."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            try:
                inflight[0].wait()
            except Exception as e:  # a peer is gone: nothing left to follow
                log.warning("ringside: the last plan broadcast did not complete (%s)", e)
        if self._feed is not None:
            self._feed.close()
        if self._reporter is not None:
            self._reporter.close()
        for problem in self.transport.clear():
            log.warning("ringside transport advice: %s", problem)

    def __enter__(self) -> "HintFollower":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------------

    def _apply_transport(self, step_index: int, rto: Optional[int]) -> None:
        peers = connected_peers(exclude=self._agent_addrs) if rto is not None else []
        problems = self.transport.apply(rto, peers)
        self.transport_applied.append((step_index, rto, self.transport.routes, problems))
        for problem in problems:
            log.warning("ringside transport advice on rank %d: %s; training goes on without it", self.rank, problem)
        if rto is None:
            log.info("rank %d: ringside transport advice withdrawn at step %d", self.rank, step_index)
        else:
            log.info("rank %d: ringside transport advice at step %d: %d ms TCP retransmission floor to %s", self.rank, step_index, rto, ", ".join(self.transport.routes) or "no peer")

    def _sync(self, step_index: int) -> None:
        # The broadcast started at the previous synchronised step ran behind that step's compute;
        # every rank takes its values now, at the same step, and starts the next one.
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            work, msg = inflight
            work.wait()
            self._take(msg, step_index)
        msg = self._message()
        self._inflight = (dist.broadcast(msg, self._src, group=self.process_group, async_op=True), msg)

    def _message(self) -> torch.Tensor:
        """Rank 0: the newest hint as the broadcast's six values (zeros before the first hint);
        other ranks: the buffer the broadcast fills."""
        msg = torch.zeros(6, dtype=torch.float64, device=self._device)
        if self._feed is not None:
            h = self._feed.latest()
            if h is not None:
                if h.version > self._seen_version:
                    self._hints[h.version] = h
                c = h.compression
                msg = torch.tensor(
                    [
                        float(h.version),
                        float(_FAMILIES.index(c.family)),
                        float(c.ratio or 0.0),
                        1.0 if h.error_feedback else 0.0,
                        min(float(h.step_from), _MAX_EXACT),
                        float(h.tcp_rto_min_ms or 0),
                    ],
                    dtype=torch.float64,
                    device=self._device,
                )
        return msg

    def _take(self, msg: torch.Tensor, step_index: int) -> None:
        """Every rank, at the same step: a hint newer than the last one seen becomes pending."""
        version, fam, ratio, ef, step_from, rto = msg.tolist()
        version = int(version)
        if version <= self._seen_version:
            return
        self._seen_version = version
        family = _FAMILIES[int(fam)]
        codec = Codec(family, ratio) if family is CodecFamily.TOPK else Codec(family)
        apply_at = max(int(step_from), step_index)
        self._pending = (version, codec, ef == 1.0, apply_at, int(rto) or None)
        self.received.append((step_index, version, int(step_from)))


def _addresses_of(url: str) -> List[str]:
    """The addresses the host of ``url`` resolves to (none when it does not)."""
    host = urllib.parse.urlsplit(url).hostname
    if not host:
        return []
    try:
        return sorted({ai[4][0] for ai in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)})
    except (OSError, UnicodeError):
        return []


def follow_hints(ddp_model, job_url: str, token: Optional[str] = None, process_group=None, **options) -> HintFollower:
    """Registers the compression hook on ``ddp_model`` and follows the job's hints.

    Call it on every rank after wrapping the model in DDP. ``job_url`` is
    ``http://HOST:9464/v1/jobs/ID``; ``token`` (the job's tenant token) defaults to
    ``RINGSIDE_TOKEN`` and is needed on rank 0 only. ``process_group`` defaults to the model's.
    Options (keyword):

    - ``constraints``: a :class:`~ringside.hints.Constraints` (or its JSON) the hints must keep;
      default: the registration defaults. A hint outside them is logged and ignored.
    - ``initial``: the codec before the first hint (default ``"none"``).
    - ``sync_every``: broadcast the plan every N steps (default 1).
    - ``int8_block``: elements per int8 scale (default 256).
    - ``client_config``: a :class:`~ringside.client.ClientConfig` (timeouts, reconnect backoff).

    Returns a :class:`HintFollower`: call ``.step(i)`` once per step before the forward pass;
    ``.plan_name`` and ``.hint_version`` say what is in force.
    """
    return HintFollower(ddp_model, job_url, token, process_group, **options)
