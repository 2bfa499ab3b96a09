"""ringside for tenants: read the hints ringside serves for your training job, and follow them.

- :mod:`ringside.hints`: the hint and its parts as typed, validated, frozen dataclasses.
- :mod:`ringside.client`: :class:`JobClient` (``hint()``, ``metrics()``, ``stream()``) over the
  agent's HTTP API, standard library only.
- :mod:`ringside.errors`: the exception hierarchy (``Unauthorized``, ``RateLimited``, ...).
- :mod:`ringside.torch` (needs PyTorch): a DDP communication hook that follows the hints'
  compression on every rank at the same step (``follow_hints``), or applies one codec
  (``use_codec``). Import it explicitly; ``import ringside`` never imports torch.

::

    import ringside
    client = ringside.JobClient("http://10.0.0.1:9464/v1/jobs/j-7f3a")  # token from RINGSIDE_TOKEN
    print(client.hint())
    with client.stream() as hints:
        for hint in hints:
            print(hint.version, hint.compression, hint.reasons)

See docs/tenant-guide.md.
"""

from .client import Backoff, ClientConfig, HintStream, JobClient
from .errors import (
    ApiError,
    BadRequest,
    ConfigError,
    Conflict,
    Forbidden,
    GaveUp,
    NotAnEventStream,
    NotFound,
    PayloadTooLarge,
    ProtocolError,
    RateLimited,
    RingsideError,
    ServerError,
    ServiceUnavailable,
    TransportError,
    Unauthorized,
    UnsupportedMediaType,
)
from .hints import Algorithm, Codec, CodecFamily, Constraints, Hint, HintError

__version__ = "0.1.0"

__all__ = [
    "Algorithm",
    "ApiError",
    "Backoff",
    "BadRequest",
    "ClientConfig",
    "Codec",
    "CodecFamily",
    "ConfigError",
    "Conflict",
    "Constraints",
    "Forbidden",
    "GaveUp",
    "Hint",
    "HintError",
    "HintStream",
    "JobClient",
    "NotAnEventStream",
    "NotFound",
    "PayloadTooLarge",
    "ProtocolError",
    "RateLimited",
    "RingsideError",
    "ServerError",
    "ServiceUnavailable",
    "TransportError",
    "Unauthorized",
    "UnsupportedMediaType",
]
