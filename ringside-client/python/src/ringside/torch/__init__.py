"""PyTorch DDP support: a communication hook that follows ringside's hints on every rank at once.

::

    import ringside.torch
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    follower = ringside.torch.follow_hints(ddp, "http://10.0.0.1:9464/v1/jobs/j-7f3a")
    for step, batch in enumerate(loader):
        follower.step(step)                  # every rank, before forward: all switch together
        loss = ddp(batch).sum(); loss.backward(); opt.step(); opt.zero_grad()
        print(step, follower.plan_name, follower.hint_version)

Or a fixed codec: ``ringside.torch.use_codec(ddp, "int8")``. Codecs, their wire cost and error
bounds: :mod:`ringside.torch.codecs`; the follower's protocol and overhead:
:mod:`ringside.torch.follower`.
"""

try:
    import torch  # noqa: F401
    import torch.distributed as _dist
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("ringside.torch needs PyTorch: pip install 'ringside[torch]' (or install torch yourself)") from e
if not _dist.is_available():  # pragma: no cover - depends on the torch build
    raise ImportError("ringside.torch needs torch.distributed, which this PyTorch build lacks")

from .codecs import DEFAULT_TOPK_RATIO, INT8_BLOCK, CompressionHook, compression_hook, parse_codec
from .follower import HintFollower, follow_hints, use_codec

__all__ = [
    "CompressionHook",
    "DEFAULT_TOPK_RATIO",
    "HintFollower",
    "INT8_BLOCK",
    "compression_hook",
    "follow_hints",
    "parse_codec",
    "use_codec",
]
