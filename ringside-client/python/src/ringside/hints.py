"""The hint: the plan ringside recommends for one job, as typed, validated, frozen dataclasses.

This module mirrors ``ringside-client/src/types.rs`` (the agent serves exactly those types):

- Every enum's value is the exact lowercase string the agent sends and accepts (``"ring"``,
  ``"int8"``, ``"topk:0.1"``), so JSON, logs and Prometheus labels agree.
- Parsing validates every field and a bad one raises :class:`HintError` naming it
  (``hint.channels: 0 is not valid: ...``); a hint object that exists is always well formed.
- Unknown fields in a hint are ignored (a newer agent may add some); unknown fields in
  :class:`Constraints` are rejected, as the agent rejects them, so a typo is loud.

Standard library only.
"""

from __future__ import annotations

import enum
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Tuple, Union

__all__ = [
    "Algorithm",
    "CodecFamily",
    "Codec",
    "Constraints",
    "Hint",
    "HintError",
]

_U64_MAX = (1 << 64) - 1
#: The largest minimum retransmission timeout a hint advises, ms: Linux's own floor (200 ms).
MAX_RTO_MIN_MS = 200
_U32_MAX = (1 << 32) - 1


class HintError(ValueError):
    """A hint (or constraint, or codec string) that does not validate.

    ``field`` names the offending field (``"hint.compression"``), ``value`` is what was given.
    """

    def __init__(self, field: str, value: Any, expected: str):
        self.field = field
        self.value = value
        self.expected = expected
        super().__init__(f"{field}: {value!r} is not valid: {expected}")


class Algorithm(str, enum.Enum):
    """Allreduce algorithm (``Algorithm`` in types.rs)."""

    #: Ring reduce-scatter + allgather: bandwidth-optimal, latency grows with the rank count.
    RING = "ring"
    #: Binary tree reduce + broadcast: fewer latency terms, about twice the bytes of a ring.
    TREE = "tree"
    #: Recursive halving-doubling: log2(n) latency terms, bandwidth-optimal for powers of two.
    RHD = "rhd"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, text: Any, what: str = "algorithm") -> "Algorithm":
        try:
            return cls(text)
        except ValueError:
            raise HintError(what, text, "use ring, tree or rhd") from None


class CodecFamily(str, enum.Enum):
    """A codec without its parameters, from exact to most lossy."""

    NONE = "none"
    FP16 = "fp16"
    BF16 = "bf16"
    INT8 = "int8"
    TOPK = "topk"

    def __str__(self) -> str:
        return self.value

    @property
    def lossiness(self) -> int:
        """Rank in the lossiness order (0 = exact), as ``Codec::lossiness`` in types.rs."""
        return _FAMILY_ORDER.index(self)


_FAMILY_ORDER = [CodecFamily.NONE, CodecFamily.FP16, CodecFamily.BF16, CodecFamily.INT8, CodecFamily.TOPK]
_CODEC_EXPECTED = "use none, fp16, bf16, int8 or topk:RATIO with RATIO in (0, 1]"


def _format_ratio(r: float) -> str:
    # Shortest round-tripping text, and "1" rather than "1.0", like Rust's f32 Display.
    s = repr(float(r))
    return s[:-2] if s.endswith(".0") else s


@dataclass(frozen=True)
class Codec:
    """Wire compression of gradients: ``none``, ``fp16``, ``bf16``, ``int8`` or ``topk:RATIO``.

    ``ratio`` is set for top-k only: the fraction of values kept, in (0, 1]; smaller is lossier.
    """

    family: CodecFamily
    ratio: Optional[float] = None

    def __post_init__(self) -> None:
        try:
            fam = CodecFamily(self.family)
        except ValueError:
            raise HintError("codec", self.family, _CODEC_EXPECTED) from None
        object.__setattr__(self, "family", fam)
        if fam is CodecFamily.TOPK:
            r = self.ratio
            if isinstance(r, bool) or not isinstance(r, (int, float)) or not (0.0 < r <= 1.0):
                raise HintError("codec", f"topk:{r}", _CODEC_EXPECTED)
            object.__setattr__(self, "ratio", float(r))
        elif self.ratio is not None:
            raise HintError("codec", f"{fam.value}:{self.ratio}", f"only topk takes a ratio; {_CODEC_EXPECTED}")

    @classmethod
    def parse(cls, text: Any, what: str = "codec") -> "Codec":
        """Parses the agent's codec string (``"int8"``, ``"topk:0.1"``)."""
        if not isinstance(text, str):
            raise HintError(what, text, _CODEC_EXPECTED)
        if text.startswith("topk:"):
            try:
                ratio = float(text[len("topk:"):])
            except ValueError:
                raise HintError(what, text, _CODEC_EXPECTED) from None
            if not (0.0 < ratio <= 1.0):  # also rejects nan
                raise HintError(what, text, _CODEC_EXPECTED)
            return cls(CodecFamily.TOPK, ratio)
        if text == "topk":
            raise HintError(what, text, "top-k needs its ratio: write topk:RATIO, e.g. topk:0.1")
        try:
            return cls(CodecFamily(text))
        except ValueError:
            raise HintError(what, text, _CODEC_EXPECTED) from None

    def __str__(self) -> str:
        if self.family is CodecFamily.TOPK:
            return f"topk:{_format_ratio(self.ratio)}"  # type: ignore[arg-type]
        return self.family.value

    @property
    def lossless(self) -> bool:
        return self.family is CodecFamily.NONE

    @property
    def wire_bytes_per_f32(self) -> float:
        """Bytes on the wire per float32 element, approximately (as ``Codec::wire_bytes_per_f32``)."""
        return {
            CodecFamily.NONE: 4.0,
            CodecFamily.FP16: 2.0,
            CodecFamily.BF16: 2.0,
            CodecFamily.INT8: 1.0,
        }.get(self.family, 8.0 * (self.ratio or 0.0))


Codec.NONE = Codec(CodecFamily.NONE)  # type: ignore[attr-defined]


def _int(obj: Mapping[str, Any], name: str, lo: int, hi: int, prefix: str) -> int:
    v = _required(obj, name, prefix)
    # bool is an int in Python but not in JSON; 1.0 is a float in JSON and serde refuses it too.
    if isinstance(v, bool) or not isinstance(v, int) or not (lo <= v <= hi):
        raise HintError(f"{prefix}.{name}", v, f"a whole number from {lo} to {hi}")
    return v


def _required(obj: Mapping[str, Any], name: str, prefix: str) -> Any:
    if name not in obj:
        raise HintError(f"{prefix}.{name}", None, "the field is missing; client and agent versions may differ")
    return obj[name]


def _load(data: Union[str, bytes, Mapping[str, Any]], what: str) -> Mapping[str, Any]:
    if isinstance(data, (str, bytes, bytearray)):
        try:
            data = json.loads(data)
        except ValueError as e:
            raise HintError(what, _preview(data), f"not JSON ({e})") from None
    if not isinstance(data, Mapping):
        raise HintError(what, _preview(data), "expected a JSON object")
    return data


def _preview(data: Any) -> Any:
    # Error messages carry at most a short excerpt of a malformed document.
    if isinstance(data, (bytes, bytearray)):
        data = bytes(data[:120]).decode("utf-8", "replace")
    if isinstance(data, str) and len(data) > 120:
        return data[:120] + "..."
    return data


@dataclass(frozen=True)
class Constraints:
    """What the tenant allows ringside to change (``Constraints`` in types.rs, same defaults).

    ``none`` is always allowed: it is what the job runs without hints.
    """

    algorithms: Tuple[Algorithm, ...] = (Algorithm.RING, Algorithm.TREE, Algorithm.RHD)
    codecs: Tuple[CodecFamily, ...] = tuple(_FAMILY_ORDER)
    #: Smallest top-k ratio acceptable ("top-k keeping at least 10 %" = 0.1).
    min_topk_ratio: float = 0.1
    #: Most channels (parallel connections per peer pair) the job opened.
    max_channels: int = 1
    #: Whether the job can carry compression residuals to the next step (error feedback).
    error_feedback: bool = True
    #: The step time the tenant wants, in ms, or None.
    step_time_target_ms: Optional[float] = None
    #: Whether hints may carry transport advice (``Hint.tcp_rto_min_ms``): the job's ranks can
    #: change their own TCP connections' retransmission timer (:mod:`ringside.transport`, which
    #: needs ``CAP_NET_ADMIN`` in the ranks' network namespace). Off by default.
    transport_tuning: bool = False

    def __post_init__(self) -> None:
        p = "constraints"
        algs = tuple(Algorithm.parse(a, f"{p}.algorithms") for a in self.algorithms)
        if not algs:
            raise HintError(f"{p}.algorithms", [], "allow at least one of ring, tree, rhd")
        fams = []
        for c in self.codecs:
            try:
                fams.append(CodecFamily(c))
            except ValueError:
                raise HintError(f"{p}.codecs", c, "use none, fp16, bf16, int8 or topk") from None
        r = self.min_topk_ratio
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not (0.0 < r <= 1.0):
            raise HintError(f"{p}.min_topk_ratio", r, "a number in (0, 1]")
        m = self.max_channels
        if isinstance(m, bool) or not isinstance(m, int) or not (1 <= m <= 255):
            raise HintError(f"{p}.max_channels", m, "a whole number from 1 to 255")
        if not isinstance(self.error_feedback, bool):
            raise HintError(f"{p}.error_feedback", self.error_feedback, "true or false")
        t = self.step_time_target_ms
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not (math.isfinite(t) and t > 0)):
            raise HintError(f"{p}.step_time_target_ms", t, "a positive number of milliseconds, or null")
        if not isinstance(self.transport_tuning, bool):
            raise HintError(f"{p}.transport_tuning", self.transport_tuning, "true or false")
        object.__setattr__(self, "algorithms", algs)
        object.__setattr__(self, "codecs", tuple(fams))
        object.__setattr__(self, "min_topk_ratio", float(r))

    @classmethod
    def from_json(cls, data: Union[str, bytes, Mapping[str, Any]]) -> "Constraints":
        obj = _load(data, "constraints")
        known = {"algorithms", "codecs", "min_topk_ratio", "max_channels", "error_feedback", "step_time_target_ms", "transport_tuning"}
        unknown = sorted(set(obj) - known)
        if unknown:
            raise HintError(f"constraints.{unknown[0]}", obj[unknown[0]], f"unknown field; known fields: {', '.join(sorted(known))}")
        for name in ("algorithms", "codecs"):
            if name in obj and not isinstance(obj[name], list):
                raise HintError(f"constraints.{name}", obj[name], "a list of strings")
        return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in obj.items()})

    def to_json(self) -> dict:
        return {
            "algorithms": [a.value for a in self.algorithms],
            "codecs": [c.value for c in self.codecs],
            "min_topk_ratio": self.min_topk_ratio,
            "max_channels": self.max_channels,
            "error_feedback": self.error_feedback,
            "step_time_target_ms": self.step_time_target_ms,
            "transport_tuning": self.transport_tuning,
        }

    def allows_algorithm(self, a: Algorithm) -> bool:
        return a in self.algorithms

    def allows_codec(self, c: Codec) -> bool:
        """``none`` always; others when their family is listed (top-k also needs
        ``ratio >= min_topk_ratio``), as ``Constraints::allows_codec``."""
        if c.family is CodecFamily.NONE:
            return True
        if c.family not in self.codecs:
            return False
        return c.family is not CodecFamily.TOPK or (c.ratio or 0.0) >= self.min_topk_ratio

    def why_not(self, hint: "Hint") -> Optional[str]:
        """Why ``hint`` breaks these constraints, or None when it keeps them. Only the fields a
        training job applies in-process are checked: the codec, error feedback and channels.
        Transport advice is apart from the plan: without ``transport_tuning`` a follower takes the
        plan and leaves the advice (``ringside.torch`` does)."""
        if not self.allows_codec(hint.compression):
            if hint.compression.family is CodecFamily.TOPK and hint.compression.family in self.codecs:
                return f"compression {hint.compression} keeps less than min_topk_ratio {_format_ratio(self.min_topk_ratio)}"
            return f"compression {hint.compression} is not among the allowed codecs ({', '.join(c.value for c in self.codecs)})"
        if hint.error_feedback and not self.error_feedback:
            return "error feedback is not allowed"
        if hint.channels > self.max_channels:
            return f"{hint.channels} channels exceed max_channels {self.max_channels}"
        return None


@dataclass(frozen=True)
class Hint:
    """The plan ringside recommends for a job (``GET /v1/jobs/{id}/hints``, one SSE event per change)."""

    #: The job id.
    job: str
    #: +1 with every plan change (the first hint is 1); SSE event ids carry it.
    version: int
    #: Training step from which to apply the plan; 0 = at your next step (all ranks at once).
    step_from: int
    algorithm: Algorithm
    #: Pipeline chunk (frame) size in bytes.
    chunk_bytes: int
    #: Parallel connections per peer pair (at most the registration's ``max_channels``).
    channels: int
    compression: Codec
    #: Carry compression residuals to the next step.
    error_feedback: bool
    #: Why, coarse and privacy-safe ("path to peer 10.0.0.3 lossy").
    reasons: Tuple[str, ...] = field(default_factory=tuple)
    #: 0..1: how sure the policy is that this plan beats the previous one.
    confidence: float = 0.0
    #: Unix time (ms) after which the hint is stale unless renewed.
    expires_at: int = 0
    #: Transport advice (jobs with ``transport_tuning`` only): the minimum TCP retransmission
    #: timeout for the job's connections to its peers, ms, sent while its paths lose packets;
    #: None: the system's own (advice applied before is dropped).
    tcp_rto_min_ms: Optional[int] = None

    @classmethod
    def from_json(cls, data: Union[str, bytes, Mapping[str, Any]]) -> "Hint":
        """Builds a hint from the agent's JSON (text or an already decoded object).

        Raises :class:`HintError` naming the first bad field.
        """
        p = "hint"
        obj = _load(data, p)
        # Fields are checked in declaration order, so the error names the first bad one.
        job = _required(obj, "job", p)
        if not isinstance(job, str) or not job:
            raise HintError("hint.job", job, "a non-empty string (the job id)")
        version = _int(obj, "version", 1, _U64_MAX, p)
        step_from = _int(obj, "step_from", 0, _U64_MAX, p)
        algorithm = Algorithm.parse(_required(obj, "algorithm", p), "hint.algorithm")
        chunk_bytes = _int(obj, "chunk_bytes", 0, _U32_MAX, p)
        channels = _int(obj, "channels", 1, 255, p)
        compression = Codec.parse(_required(obj, "compression", p), "hint.compression")
        ef = _required(obj, "error_feedback", p)
        if not isinstance(ef, bool):
            raise HintError("hint.error_feedback", ef, "true or false")
        reasons = _required(obj, "reasons", p)
        if not isinstance(reasons, list) or not all(isinstance(r, str) for r in reasons):
            raise HintError("hint.reasons", reasons, "a list of strings")
        conf = _required(obj, "confidence", p)
        if isinstance(conf, bool) or not isinstance(conf, (int, float)) or not (0.0 <= conf <= 1.0):
            raise HintError("hint.confidence", conf, "a number from 0 to 1")
        expires_at = _int(obj, "expires_at", 0, _U64_MAX, p)
        # Optional: absent (or null) is no advice.
        rto = _int(obj, "tcp_rto_min_ms", 1, MAX_RTO_MIN_MS, p) if obj.get("tcp_rto_min_ms") is not None else None
        return cls(
            job=job,
            version=version,
            step_from=step_from,
            algorithm=algorithm,
            chunk_bytes=chunk_bytes,
            channels=channels,
            compression=compression,
            error_feedback=ef,
            reasons=tuple(reasons),
            confidence=float(conf),
            expires_at=expires_at,
            tcp_rto_min_ms=rto,
        )

    def to_json(self) -> dict:
        """The agent's JSON shape (what ``from_json`` reads)."""
        return {
            "job": self.job,
            "version": self.version,
            "step_from": self.step_from,
            "algorithm": self.algorithm.value,
            "chunk_bytes": self.chunk_bytes,
            "channels": self.channels,
            "compression": str(self.compression),
            "error_feedback": self.error_feedback,
            "reasons": list(self.reasons),
            "confidence": self.confidence,
            "expires_at": self.expires_at,
            **({"tcp_rto_min_ms": self.tcp_rto_min_ms} if self.tcp_rto_min_ms is not None else {}),
        }

    def expired(self, now_unix_ms: Optional[int] = None) -> bool:
        """Whether ``expires_at`` has passed (the stream renews live hints before that)."""
        now = int(time.time() * 1000) if now_unix_ms is None else now_unix_ms
        return now > self.expires_at
