"""Gradient compression for DDP: one communication hook whose codec can change between steps.

DDP accepts one ``register_comm_hook`` per model, so :class:`CompressionHook` is registered once
and dispatches each gradient bucket to the codec of the current plan. Every hook returns the
*average* over ranks (as DDP's default allreduce does).

====================  =================================  ============================================
codec                 what goes on the wire per float32  error of the averaged gradient, per element
====================  =================================  ============================================
``none``              4 B (torch's ``allreduce_hook``)   0 (float32 summation order aside)
``fp16``              2 B (``fp16_compress_hook``)       about ``|x|·2⁻¹¹`` per rank and per add;
                                                          overflows to inf above 65504
``bf16``              2 B (``bf16_compress_hook``)       about ``|x|·2⁻⁸`` per rank and per add;
                                                          float32's range
``int8``              1 B + 4 B per ``int8_block``       ``(Σ_r M_r + M_Σ) / (254·W)`` (see below)
                      elements, twice (see below)
``topk:R``            8 B per kept value (index +        ``Σ_r τ_r / W``, τ_r = rank r's smallest
                      value), R of them, from each rank  kept magnitude (every dropped one is ≤ it)
====================  =================================  ============================================

``int8``: the bucket is split into blocks of ``int8_block`` consecutive elements (the flat bucket,
zero-padded to a multiple of ``W·int8_block``), each quantized symmetrically with its own scale
``max|x|/127``. Summing int8 values over ranks would overflow, so the reduction is done in two
exchanges, each carrying int8: an all-to-all sends block shard *j* of every rank to rank *j*, which
dequantizes and sums its shard in float32 and requantizes the sum (new per-block scales); a second
all-to-all then brings every summed shard to every rank (an all-gather in one round with every
peer, where gloo's all-gather is a ring of ``W-1`` rounds). Bytes per rank on the wire:
``2·(W-1)/W · n · (1 + 4/int8_block)``, a quarter of a float32 ring allreduce at any rank count.
Per element of block *b*: ``M_r`` is rank r's ``max|x|`` in that block and ``M_Σ`` the summed
block's, so the error of the average is at most ``(Σ_r M_r + M_Σ) / (254·W)``.

``topk:R``: each rank keeps its ``ceil(R·n)`` largest magnitudes; values and indices are
all-gathered and summed into a dense bucket. Bytes received per rank: ``(W-1)·8·ceil(R·n)``,
fewer than a float32 ring allreduce's ``2·(W-1)/W·4n`` only while ``R < 1/W`` (and than fp16's
while ``R < 1/(2W)``).

Error feedback (when the plan asks for it, int8 and top-k): what a rank's compression dropped
(its input minus what it sent) is kept per bucket and added to that bucket's gradient at the next
step, so over steps the sum of what was sent equals the sum of the gradients minus one residual:
the compression error does not accumulate. For int8 the requantization error of a summed shard is
carried by the rank that owns the shard, so all of int8's error is fed back. A residual costs one float32 copy of the bucket. When
the plan changes to a codec without error feedback, a pending residual is added once and dropped.

Costs: ``none``/``fp16``/``bf16`` use torch's asynchronous hooks, which overlap with the rest of
the backward pass. ``int8`` and ``topk`` run their collectives synchronously inside the hook (one
after the other, in bucket order on every rank, which keeps ranks matched), so their buckets do not
overlap with backward computation; they pay off when the network, not the CPU/GPU, is the bottleneck.

Non-finite gradients: fp16/bf16 keep inf/NaN; int8 and top-k turn a block containing them into
non-finite values (NaN), so AMP's GradScaler still sees the overflow and skips the step. Error
feedback then drops what it would carry at those positions (it would be inf or NaN at every later
step): the step after an overflow compresses cleanly.
"""

import collections
import math
import threading
from typing import Counter, Dict, Optional, Tuple

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ..errors import ConfigError
from ..hints import Codec, CodecFamily, HintError

__all__ = ["CompressionHook", "compression_hook", "parse_codec", "DEFAULT_TOPK_RATIO", "INT8_BLOCK"]

#: Top-k ratio when a codec is named ``"topk"`` without one.
DEFAULT_TOPK_RATIO = 0.1
#: Elements per int8 scale: 4 bytes of scale per 256 bytes of payload (1.6 %), and a block small
#: enough that one large gradient does not flatten the resolution of its neighbours.
INT8_BLOCK = 256


def parse_codec(name) -> Codec:
    """A :class:`~ringside.hints.Codec` from ``"none"``, ``"fp16"``, ``"bf16"``, ``"int8"``,
    ``"topk"`` (ratio :data:`DEFAULT_TOPK_RATIO`) or ``"topk:R"``, or a ``Codec``."""
    if isinstance(name, Codec):
        return name
    if name == "topk":
        return Codec(CodecFamily.TOPK, DEFAULT_TOPK_RATIO)
    try:
        return Codec.parse(name)
    except HintError as e:
        raise ConfigError(str(e)) from None


def _bucket_key(bucket) -> Tuple[int, ...]:
    # DDP rebuilds its buckets after the first iteration, and indices then mean other parameters:
    # a residual belongs to the exact parameters of its bucket.
    return tuple(id(p) for p in bucket.parameters())


def _done(t: torch.Tensor) -> torch.futures.Future:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(t)
    return fut


def _pack(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Rows of int8 values (k, shard) and their float32 scales (k, per_shard) as one int8 tensor
    (k, shard + 4 * per_shard): each row its values, then its scales' bytes."""
    return torch.cat([q, scale.contiguous().view(torch.int8)], dim=1)


def _unpack(rows: torch.Tensor, shard: int, per_shard: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The inverse of ``_pack``: (values (k, shard), scales (k, per_shard) as float32)."""
    # A copy, not a view: a float32 view needs a 4-byte-aligned start, and `shard` need not be one.
    return rows[:, :shard], rows[:, shard:].clone().view(torch.float32)


class CompressionHook:
    """The state of the dispatching DDP comm hook: the current codec, error feedback, residuals.

    ``set_plan`` must be called between steps on every rank with the same arguments (the follower
    does that); the hook reads the plan without locking because DDP runs it during backward only.
    """

    def __init__(self, process_group: Optional[dist.ProcessGroup] = None, codec="none", error_feedback: bool = True, int8_block: int = INT8_BLOCK):
        if isinstance(int8_block, bool) or not isinstance(int8_block, int) or int8_block < 1:
            raise ConfigError(f"int8_block {int8_block!r} must be a whole number of elements >= 1")
        self.process_group = process_group
        self.int8_block = int8_block
        self.codec = parse_codec(codec)
        self.error_feedback = bool(error_feedback)
        self._residuals: Dict[Tuple[int, ...], torch.Tensor] = {}
        self._lock = threading.Lock()
        #: Buckets reduced so far, by codec name (for logs and tests).
        self.buckets_by_codec: Counter[str] = collections.Counter()

    @property
    def plan_name(self) -> str:
        """The current codec, as the agent writes it (``"none"``, ``"int8"``, ``"topk:0.1"``)."""
        return str(self.codec)

    def set_plan(self, codec, error_feedback: bool) -> None:
        self.codec = parse_codec(codec)
        self.error_feedback = bool(error_feedback)

    @property
    def residual_norm(self) -> float:
        """L2 norm of every pending error-feedback residual (0 when none)."""
        with self._lock:
            return math.sqrt(sum(float(r.double().pow(2).sum()) for r in self._residuals.values()))

    def _world(self) -> int:
        return dist.get_world_size(self.process_group)

    def __call__(self, bucket) -> torch.futures.Future:
        codec, ef = self.codec, self.error_feedback
        buf = bucket.buffer()
        key = _bucket_key(bucket)
        with self._lock:
            residual = self._residuals.pop(key, None)
        if residual is not None and residual.numel() != buf.numel():
            residual = None
        self.buckets_by_codec[str(codec)] += 1
        fam = codec.family
        if fam in (CodecFamily.NONE, CodecFamily.FP16, CodecFamily.BF16):
            if residual is not None:
                # Left over from a lossy codec with error feedback: send it once, then it is gone.
                buf.add_(residual.to(buf.dtype))
            pg = self.process_group
            if fam is CodecFamily.NONE:
                return default_hooks.allreduce_hook(pg, bucket)
            if fam is CodecFamily.FP16:
                return default_hooks.fp16_compress_hook(pg, bucket)
            return default_hooks.bf16_compress_hook(pg, bucket)
        x = buf.detach().to(torch.float32, copy=True)
        if residual is not None:
            x.add_(residual)
        if fam is CodecFamily.INT8:
            out, new_residual = self._int8(x, ef)
        else:
            out, new_residual = self._topk(x, codec.ratio, ef)
        if new_residual is not None:
            # A bucket holding an inf or a NaN (an overflow the loss scaler will skip) leaves a
            # residual that is not finite there; kept, it would make those positions inf/NaN in
            # every later step. Reset to 0, so the next step compresses cleanly (as the IPU engine's
            # error feedback does, ipu-firmware codec::encode_with_feedback).
            new_residual.masked_fill_(~torch.isfinite(new_residual), 0.0)
            with self._lock:
                self._residuals[key] = new_residual
        buf.copy_(out)
        return _done(buf)

    # -- int8 ------------------------------------------------------------------------------------

    @staticmethod
    def _quantize(blocks: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Symmetric int8 per row: (q, scale) with ``blocks ≈ q · scale[:, None]``."""
        scale = blocks.abs().amax(dim=1) / 127.0
        # An all-zero block has scale 0: divide by 1 instead (its q are all 0 anyway). NaN/inf
        # scales are left alone so non-finite gradients stay non-finite.
        safe = torch.where(scale == 0, torch.ones_like(scale), scale)
        q = torch.round(blocks / safe[:, None]).clamp_(-127, 127).to(torch.int8)
        return q, safe

    def _int8(self, x: torch.Tensor, ef: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        pg, w, b = self.process_group, self._world(), self.int8_block
        n = x.numel()
        shard = -(-n // (w * b)) * b  # elements per rank's shard: whole blocks
        padded = torch.zeros(w * shard, dtype=torch.float32, device=x.device)
        padded[:n] = x
        blocks = padded.view(-1, b)
        q, scale = self._quantize(blocks)
        residual = padded - (q.to(torch.float32) * scale[:, None]).view(-1) if ef else None
        per_shard = shard // b
        # Exchange 1 (all-to-all): shard j of every rank, its int8 values and their scales packed
        # into one byte row, goes to rank j. One collective, not one for values and one for scales:
        # each collective is a round of messages, and on a lossy link every round risks a
        # retransmission stall of its own.
        row = _pack(q.view(w, shard), scale.view(w, per_shard))
        row_in = torch.empty_like(row)
        dist.all_to_all_single(row_in.view(-1), row.view(-1), group=pg)
        q_in, s_in = _unpack(row_in, shard, per_shard)
        part = (q_in.reshape(w, per_shard, b).to(torch.float32) * s_in.view(w, per_shard, 1)).sum(dim=0)
        q2, scale2 = self._quantize(part)
        if residual is not None:
            # The requantization error of the summed shard is nobody's input: its owner (this rank)
            # carries it, so the next step's sum makes up for it and no int8 error accumulates.
            me = dist.get_rank(pg)
            residual[me * shard : (me + 1) * shard] += (part - q2.to(torch.float32) * scale2[:, None]).view(-1)
        # Exchange 2 (an all-gather made of one all-to-all): every rank's summed shard (values and
        # scales, packed) to every rank. gloo's all-gather is a ring of W-1 rounds, each waiting for
        # the last; an all-to-all is one round with every peer at once, the same bytes per rank.
        # int8 is chosen when the network is slow, where each round costs round trips.
        mine = _pack(q2.view(1, shard), scale2.view(1, per_shard))
        rows = torch.empty(w, mine.shape[1], dtype=torch.int8, device=x.device)
        dist.all_to_all_single(rows.view(-1), mine.expand(w, -1).contiguous().view(-1), group=pg)
        q_all, s_all = _unpack(rows, shard, per_shard)
        total = (q_all.reshape(-1, b).to(torch.float32) * s_all.reshape(-1)[:, None]).view(-1)[:n]
        return total.div_(w), (residual[:n].clone() if residual is not None else None)

    # -- top-k -----------------------------------------------------------------------------------

    def _topk(self, x: torch.Tensor, ratio: float, ef: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        pg, w = self.process_group, self._world()
        n = x.numel()
        k = min(n, max(1, math.ceil(ratio * n)))
        _, idx = x.abs().topk(k, sorted=False)
        vals = x[idx]
        residual = None
        if ef:
            residual = x.clone()
            residual[idx] = 0.0
        # int32 indices halve the index bytes; buckets beyond 2^31 elements need int64.
        idx_dtype = torch.int32 if n < 2**31 else torch.int64
        vals_all = torch.empty(w * k, dtype=torch.float32, device=x.device)
        idx_all = torch.empty(w * k, dtype=idx_dtype, device=x.device)
        dist.all_gather_into_tensor(vals_all, vals, group=pg)
        dist.all_gather_into_tensor(idx_all, idx.to(idx_dtype), group=pg)
        out = torch.zeros(n, dtype=torch.float32, device=x.device)
        out.index_add_(0, idx_all.to(torch.int64), vals_all)
        return out.div_(w), residual


# DDP checks these annotations: the bucket must be a GradBucket, the result a Future[Tensor].
def compression_hook(state: CompressionHook, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The function registered with ``register_comm_hook(state, compression_hook)``."""
    return state(bucket)
