"""The exceptions of the ringside client: one small hierarchy under :class:`RingsideError`.

::

    RingsideError
    ├── ConfigError          bad url, job id or token, found before any request (also a ValueError)
    ├── TransportError       cannot connect, connection lost, timed out             (transient)
    ├── ProtocolError        a response that is not what the agent sends            (transient)
    │   └── NotAnEventStream     the stream url answered something else: a wrong url    (not transient)
    ├── ApiError             the agent answered {"error": "..."} with a 4xx/5xx status
    │   ├── BadRequest            400
    │   ├── Unauthorized          401  missing or wrong token
    │   ├── Forbidden             403  the token is for another job
    │   ├── NotFound              404  unknown job, or no hint yet
    │   ├── Conflict              409
    │   ├── PayloadTooLarge       413
    │   ├── UnsupportedMediaType  415
    │   ├── RateLimited           429  (``retry_after`` seconds, from ``Retry-After``)  (transient)
    │   └── ServerError           5xx  (503: ``ServiceUnavailable``)                  (transient)
    └── GaveUp               a hint stream failed ``attempts`` times in a row; ``last`` is the last error

``transient`` says whether retrying the same request can help. The token never appears in any
message.
"""

from __future__ import annotations

from typing import Dict, Optional, Type

__all__ = [
    "RingsideError",
    "ConfigError",
    "TransportError",
    "ProtocolError",
    "NotAnEventStream",
    "ApiError",
    "BadRequest",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "Conflict",
    "PayloadTooLarge",
    "UnsupportedMediaType",
    "RateLimited",
    "ServerError",
    "ServiceUnavailable",
    "GaveUp",
    "api_error",
]


class RingsideError(Exception):
    """Base of every error the client raises."""

    #: Whether retrying the same request can help.
    transient = False


class ConfigError(RingsideError, ValueError):
    """The client was given something it cannot use (url, job id, token); fix the call."""


class TransportError(RingsideError):
    """The agent could not be reached, or the connection failed or timed out."""

    transient = True

    def __init__(self, url: str, reason: str):
        self.url = url
        self.reason = reason
        super().__init__(f"cannot reach {url}: {reason}; check that the ringside agent is running and the url is right")


class ProtocolError(RingsideError):
    """A response or server-sent event that does not follow the agent's formats."""

    transient = True

    def __init__(self, url: str, reason: str):
        self.url = url
        self.reason = reason
        super().__init__(f"unexpected response from {url}: {reason}")


class NotAnEventStream(ProtocolError):
    """The stream endpoint answered without ``text/event-stream``: the url does not lead to the agent."""

    transient = False

    def __init__(self, url: str, content_type: str):
        super().__init__(
            url,
            f"content type {content_type!r}, not text/event-stream: use the job's base url (http://HOST:PORT/v1/jobs/ID)",
        )
        self.content_type = content_type


_ADVICE = {
    400: " (the request is malformed: see the message)",
    401: " (check the bearer token: the job's tenant token, or RINGSIDE_TOKEN)",
    403: " (this token does not grant access to this job: use that job's tenant token)",
    404: " (the job is not registered, was deleted, or has no hint yet)",
    409: " (conflicts with the agent's state, e.g. a job name already taken)",
    413: " (the request body is too large)",
    415: " (send the body as JSON with Content-Type: application/json)",
    429: " (too many requests or streams: retry later)",
    503: " (the agent is not ready: retry later)",
}


class ApiError(RingsideError):
    """The agent refused the request with ``{"error": message}`` and a 4xx/5xx ``status``."""

    status = 0

    def __init__(self, url: str, status: int, message: str, retry_after: Optional[float] = None):
        self.url = url
        self.status = status
        self.message = message
        #: Seconds the server asked to wait (``Retry-After``), if it said.
        self.retry_after = retry_after
        super().__init__(f"{url} answered {status}: {message}{_ADVICE.get(status, '')}")


class BadRequest(ApiError):
    pass


class Unauthorized(ApiError):
    pass


class Forbidden(ApiError):
    pass


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    pass


class PayloadTooLarge(ApiError):
    pass


class UnsupportedMediaType(ApiError):
    pass


class RateLimited(ApiError):
    transient = True


class ServerError(ApiError):
    transient = True


class ServiceUnavailable(ServerError):
    pass


_BY_STATUS: Dict[int, Type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    429: RateLimited,
    503: ServiceUnavailable,
}


def api_error(url: str, status: int, message: str, retry_after: Optional[float] = None) -> ApiError:
    """The most specific :class:`ApiError` subclass for ``status``."""
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else ApiError
    err = cls(url, status, message, retry_after)
    if cls is ApiError and status == 408:
        err.transient = True  # request timeout: the same request may well succeed
    return err


class GaveUp(RingsideError):
    """A hint stream failed ``attempts`` times in a row (bounded backoff); ``last`` says why."""

    def __init__(self, url: str, attempts: int, last: BaseException):
        self.url = url
        self.attempts = attempts
        self.last = last
        super().__init__(f"gave up on {url} after {attempts} failed attempts in a row; last error: {last}")
