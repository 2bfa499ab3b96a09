"""A small blocking client for ringside's hints API, standard library only.

:class:`JobClient` holds one job's url and tenant token: :meth:`JobClient.hint`
(``GET {job}/hints``), :meth:`JobClient.metrics` (``GET {job}/metrics``, Prometheus text) and
:meth:`JobClient.stream` (``GET {job}/hints/stream``, server-sent events), which returns a
:class:`HintStream`: an iterator of :class:`~ringside.hints.Hint`.

It follows the Rust client (``ringside-client/src/client.rs``) point by point:

- Every wait is bounded: connecting (``connect_timeout``), a whole plain request
  (``request_timeout``), and each read of a stream: a stream that receives nothing, not even the
  agent's keep-alive comment (sent every 15 s), for ``stream_read_timeout`` (45 s) is dead and is
  replaced.
- Reconnects use bounded exponential backoff (:class:`Backoff`, with jitter): after
  ``max_attempts`` failures in a row the stream raises :class:`~ringside.errors.GaveUp` and ends.
  A well-formed hint resets the count, so a healthy long-lived stream never runs out. A 429 or
  503 with ``Retry-After`` waits at least that long (capped at :data:`MAX_RETRY_AFTER_S`).
- Every reconnect sends ``Last-Event-ID`` (the id of the last *complete* event), and the stream
  yields only hints whose version is strictly newer than the last one it yielded: no duplicates,
  no going back, whatever the server replays. Renewals (same version, later ``expires_at``) are
  therefore not yielded.
- A malformed event (bad JSON, a hint that does not validate) is logged, counted in
  :attr:`HintStream.malformed_events` and skipped; it also counts as a failure, so a server
  sending nothing but garbage ends the stream with ``GaveUp``.
- Errors that retrying cannot fix (401, 403, a 404 before any hint, a url that is not the agent)
  are raised at once and end the stream. A 404 after hints were received means the job was
  deleted: the stream simply ends.
- Memory is bounded: response bodies (:data:`MAX_JSON_BYTES`, :data:`MAX_METRICS_BYTES`), SSE lines
  (:data:`MAX_SSE_LINE`) and events (:data:`MAX_SSE_EVENT`).
- :meth:`HintStream.close` may be called from any thread: it wakes a backoff sleep and shuts the
  socket down, so a blocked read returns at once.
- The token only travels in the ``Authorization`` header; it never appears in errors, logs or
  ``repr``.

SSE framing (the agent's, axum): ``event: hint``, ``id: <version>``, ``data: <Hint JSON>`` and a
blank line per event; lines starting with ``:`` are comments (keep-alives). Multi-line ``data`` is
joined with ``\\n``; ``\\r\\n`` line ends are accepted; ``retry:`` and unknown fields are ignored;
events whose type is neither ``hint`` nor the default ``message`` are skipped.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import logging
import math
import os
import random
import re
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Tuple
from urllib.parse import urlsplit

from .errors import (
    ConfigError,
    GaveUp,
    NotAnEventStream,
    NotFound,
    ProtocolError,
    RingsideError,
    TransportError,
    api_error,
)
from .hints import Hint, HintError

__all__ = [
    "Backoff",
    "ClientConfig",
    "JobClient",
    "HintStream",
    "MAX_JSON_BYTES",
    "MAX_METRICS_BYTES",
    "MAX_SSE_LINE",
    "MAX_SSE_EVENT",
    "MAX_RETRY_AFTER_S",
    "FailureCallback",
    "TOKEN_ENV",
]

log = logging.getLogger("ringside.client")

#: The environment variable a missing ``token`` argument falls back to.
TOKEN_ENV = "RINGSIDE_TOKEN"
#: Largest JSON response body read (a hint), in bytes.
MAX_JSON_BYTES = 4 << 20
#: Largest Prometheus response read, in bytes.
MAX_METRICS_BYTES = 16 << 20
#: Longest SSE line accepted, in bytes.
MAX_SSE_LINE = 256 << 10
#: Largest SSE event (all its ``data`` lines) accepted, in bytes.
MAX_SSE_EVENT = 1 << 20
#: Longest ``Retry-After`` honoured, in seconds (a bigger one is capped, so waits stay bounded).
MAX_RETRY_AFTER_S = 300.0
#: Largest error body read to extract the agent's message.
_MAX_ERROR_BYTES = 64 << 10

_JOB_PATH = re.compile(r"^(?P<prefix>.*)/v1/jobs/(?P<id>[A-Za-z0-9._-]{1,128})$")


@dataclass(frozen=True)
class Backoff:
    """Bounded exponential backoff between reconnect attempts: ``initial``, ``2 * initial``, ...
    capped at ``max`` seconds, each plus up to 25 % random jitter (so many clients do not reconnect
    in lockstep after an agent restart); at most ``max_attempts`` failures in a row."""

    initial: float = 0.5
    max: float = 30.0
    max_attempts: int = 12

    def __post_init__(self) -> None:
        if not (0 < self.initial <= self.max):
            raise ConfigError(f"backoff: need 0 < initial ({self.initial}) <= max ({self.max}) seconds")
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ConfigError(f"backoff: max_attempts {self.max_attempts!r} must be a whole number >= 1")

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based), jitter included."""
        base = min(self.max, self.initial * (2 ** min(max(attempt - 1, 0), 30)))
        return base * (1.0 + random.uniform(0.0, 0.25))


@dataclass(frozen=True)
class ClientConfig:
    """Timeouts (seconds) and the reconnect policy. Defaults suit a trainer near the agent."""

    #: TCP connect bound. Name resolution is bounded only by the system resolver's own timeouts
    #: (the standard library cannot interrupt it); give an IP address where that matters.
    connect_timeout: float = 5.0
    #: Whole-request bound for plain requests (hint, metrics) and for a stream's response headers.
    request_timeout: float = 15.0
    #: A stream with no bytes for this long is dead. Must exceed the agent's keep-alive period
    #: (15 s) with margin for a busy agent.
    stream_read_timeout: float = 45.0
    reconnect: Backoff = field(default_factory=Backoff)

    def __post_init__(self) -> None:
        for name in ("connect_timeout", "request_timeout", "stream_read_timeout"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 < v < 86400):
                raise ConfigError(f"{name} {v!r} must be a positive number of seconds")


def _parse_retry_after(value: Optional[str]) -> Optional[float]:
    """``Retry-After`` as seconds from now: delta-seconds or an HTTP date (RFC 9110 10.2.3)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), MAX_RETRY_AFTER_S)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return min(max(0.0, when.timestamp() - time.time()), MAX_RETRY_AFTER_S)


def _check_token(token: str) -> str:
    # A token goes into a header line: whitespace or control characters would corrupt the request
    # (or inject headers). Agent tokens are one word of printable ASCII.
    if not token:
        raise ConfigError(f"no token: pass token=... (the job's tenant token) or set {TOKEN_ENV}")
    if not all(33 <= ord(c) <= 126 for c in token):
        raise ConfigError("the token must be one word of printable ASCII (no spaces or line breaks); copy it exactly as the operator gave it")
    return token


class _Endpoint:
    """Where to connect: scheme, host, port and the path prefix of the job."""

    def __init__(self, job_url: str):
        if not isinstance(job_url, str):
            raise ConfigError(f"job_url must be a string like http://HOST:9464/v1/jobs/ID, not {type(job_url).__name__}")
        bad = lambda why: ConfigError(f"invalid job url {job_url!r}: {why}")  # noqa: E731
        try:
            parts = urlsplit(job_url.strip())
            port = parts.port
        except ValueError as e:
            raise bad(f"{e}; use http://HOST:PORT/v1/jobs/ID") from None
        if parts.scheme not in ("http", "https"):
            raise bad("use http://HOST:PORT/v1/jobs/ID")
        if not parts.hostname:
            raise bad("the host is missing: use http://HOST:PORT/v1/jobs/ID")
        if parts.username or parts.password:
            raise bad("remove the user:password part; the token is passed separately")
        if parts.query or parts.fragment or " " in job_url.strip():
            raise bad("remove the query, fragment or spaces")
        m = _JOB_PATH.match(parts.path.rstrip("/"))
        if not m:
            raise bad("the path must end in /v1/jobs/ID, the job id (letters, digits, . _ -) the operator gave you")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = port or (443 if parts.scheme == "https" else 80)
        self.job_id = m.group("id")
        self.path = parts.path.rstrip("/")
        self.url = f"{parts.scheme}://{parts.netloc}{self.path}"

    def connection(self, connect_timeout: float) -> http.client.HTTPConnection:
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=connect_timeout, context=ssl.create_default_context())
        return http.client.HTTPConnection(self.host, self.port, timeout=connect_timeout)


class JobClient:
    """A tenant's view of one job: ``http://HOST:PORT/v1/jobs/{id}`` plus its token.

    ``token`` defaults to the ``RINGSIDE_TOKEN`` environment variable; neither raises
    :class:`~ringside.errors.ConfigError`. Plain ``http://`` and ``https://`` (system CAs) are
    accepted. Thread-safe: every call opens its own connection.
    """

    def __init__(self, job_url: str, token: Optional[str] = None, *, config: Optional[ClientConfig] = None):
        self._endpoint = _Endpoint(job_url)
        self._token = _check_token(token if token is not None else os.environ.get(TOKEN_ENV, ""))
        self.config = config or ClientConfig()

    def __repr__(self) -> str:
        # Never the token.
        return f"JobClient({self._endpoint.url!r})"

    @property
    def job_url(self) -> str:
        """The normalised job url (no trailing slash)."""
        return self._endpoint.url

    @property
    def job_id(self) -> str:
        return self._endpoint.job_id

    # -- plain requests -------------------------------------------------------------------------

    def hint(self) -> Hint:
        """The current hint (``GET {job}/hints``). ``NotFound`` if the agent has not planned the job yet."""
        url = f"{self.job_url}/hints"
        body = self._get(url, "/hints", MAX_JSON_BYTES, "application/json")
        try:
            return Hint.from_json(body)
        except HintError as e:
            raise ProtocolError(url, str(e)) from e

    def metrics(self) -> str:
        """The job's Prometheus text (``GET {job}/metrics``), only this job's series."""
        url = f"{self.job_url}/metrics"
        return self._get(url, "/metrics", MAX_METRICS_BYTES, "text/plain").decode("utf-8", "replace")

    def report_plan(
        self,
        *,
        algorithm: str,
        chunk_bytes: int,
        channels: int,
        compression: str,
        error_feedback: bool = False,
        step: int = 0,
        step_time_ms: Optional[float] = None,
    ) -> None:
        """Tells the agent which plan the job's collectives run now (``PUT {job}/plan``), and, if
        given, the job's mean step time in ms over the steps since its previous report, all of
        them under this plan. The agent attributes what it measures to the plan that ran, and
        keeps a change only if the job's steps got faster. The agent forgets a report after 30 s:
        repeat it. A value the agent refuses raises :class:`~ringside.errors.BadRequest`."""
        if step_time_ms is not None and not (isinstance(step_time_ms, (int, float)) and not isinstance(step_time_ms, bool) and math.isfinite(step_time_ms) and step_time_ms > 0):
            raise ConfigError(f"step_time_ms {step_time_ms!r} must be a number of milliseconds above 0")
        body: Dict[str, object] = {
            "algorithm": algorithm,
            "chunk_bytes": chunk_bytes,
            "channels": channels,
            "compression": compression,
            "error_feedback": bool(error_feedback),
            "step": step,
        }
        if step_time_ms is not None:
            body["step_time_ms"] = float(step_time_ms)
        url = f"{self.job_url}/plan"
        headers = {**self._headers("application/json"), "Content-Type": "application/json"}
        conn, resp = self._open(url, "/plan", headers, self.config.request_timeout, method="PUT", body=json.dumps(body).encode())
        try:
            resp.read(_MAX_ERROR_BYTES)
        except (OSError, http.client.HTTPException):
            pass
        finally:
            conn.close()

    def stream(self, *, on_failure: Optional[FailureCallback] = None) -> "HintStream":
        """Opens the hint stream now: a connection failure or refusal is raised here, and only
        later losses are retried by the stream. See :class:`HintStream` for ``on_failure``."""
        s = HintStream(self, on_failure)
        s._connect_first()
        return s

    def stream_retrying(self, *, on_failure: Optional[FailureCallback] = None) -> "HintStream":
        """A hint stream that connects on the first ``next()``, treating a first failure like any
        later one (retried with backoff). For callers that must not fail when the agent is down."""
        return HintStream(self, on_failure)

    def _headers(self, accept: str) -> Dict[str, str]:
        return {"Authorization": f"Bearer {self._token}", "Accept": accept, "User-Agent": "ringside-python/0.1"}

    def _open(
        self, url: str, suffix: str, headers: Dict[str, str], read_timeout: float, *, method: str = "GET", body: Optional[bytes] = None
    ) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Connects, sends the request (a GET unless told otherwise) and reads the status line and headers. A non-2xx status becomes the
        matching :class:`~ringside.errors.ApiError` (with the agent's message); the connection is
        closed on every error."""
        conn = self._endpoint.connection(self.config.connect_timeout)
        try:
            try:
                conn.connect()
                # From here on, each socket operation (send, every recv) is bounded by read_timeout.
                conn.sock.settimeout(read_timeout)
                conn.request(method, self._endpoint.path + suffix, body=body, headers=headers)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                raise TransportError(url, _describe(e)) from None
            if not 200 <= resp.status < 300:
                raise self._status_error(url, resp)
            return conn, resp
        except BaseException:
            conn.close()
            raise

    @staticmethod
    def _status_error(url: str, resp: http.client.HTTPResponse) -> RingsideError:
        try:
            text = resp.read(_MAX_ERROR_BYTES).decode("utf-8", "replace")
        except (OSError, http.client.HTTPException):
            text = ""
        try:
            message = json.loads(text)["error"]
            if not isinstance(message, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            # Not the agent's {"error": ...}: a proxy or another server. Show a short excerpt.
            message = " ".join(text.split())[:200] or (resp.reason or "no message")
        return api_error(url, resp.status, message, _parse_retry_after(resp.getheader("Retry-After")))

    def _get(self, url: str, suffix: str, limit: int, accept: str) -> bytes:
        deadline = time.monotonic() + self.config.request_timeout
        conn, resp = self._open(url, suffix, self._headers(accept), self.config.request_timeout)
        try:
            chunks: List[bytes] = []
            size = 0
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TransportError(url, f"the response took longer than {self.config.request_timeout} s")
                conn.sock.settimeout(remaining)
                try:
                    chunk = resp.read1(min(65536, limit + 1 - size))
                except (OSError, http.client.HTTPException) as e:
                    raise TransportError(url, _describe(e)) from None
                if not chunk:
                    return b"".join(chunks)
                size += len(chunk)
                if size > limit:
                    raise ProtocolError(url, f"the response is larger than {limit} bytes")
                chunks.append(chunk)
        finally:
            conn.close()


def _describe(e: BaseException) -> str:
    if isinstance(e, (socket.timeout, TimeoutError)):
        return "timed out"
    if isinstance(e, http.client.IncompleteRead):
        return "the connection closed mid-response"
    return str(e) or type(e).__name__


#: ``on_failure(error, attempt)``: called for each failure the stream retries.
FailureCallback = Callable[[RingsideError, int], None]


class _Lost(Exception):
    """The connection ended or failed: reconnect."""


class HintStream(Iterator[Hint]):
    """Iterator over a job's hints from the SSE stream, reconnecting as needed (see the module
    docs for the guarantees). Use as a context manager, or call :meth:`close`, to end it.

    Retried failures are logged on ``ringside.client`` (the first of a run at WARNING, the rest at
    DEBUG). With ``on_failure(error, attempt)`` the caller reports them instead and the stream
    logs them at DEBUG only: for callers with their own once-per-outage reporting.
    """

    def __init__(self, client: JobClient, on_failure: Optional[FailureCallback] = None):
        self._client = client
        self._on_failure = on_failure
        self.url = f"{client.job_url}/hints/stream"
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._conn: Optional[http.client.HTTPConnection] = None
        self._resp: Optional[http.client.HTTPResponse] = None
        self._buf = bytearray()
        self._done = False
        #: Version of the last hint yielded.
        self.last_version: Optional[int] = None
        #: Id of the last complete event (sent as ``Last-Event-ID`` on reconnect).
        self.last_event_id: Optional[str] = None
        #: Failed attempts (connects, lost connections, malformed events) since the last good hint.
        self.failures = 0
        #: Malformed events skipped since the stream was created.
        self.malformed_events = 0
        #: Successful connections since the stream was created.
        self.connects = 0

    def __repr__(self) -> str:
        return f"HintStream({self.url!r}, connected={self._resp is not None}, last_version={self.last_version})"

    def __enter__(self) -> "HintStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def close(self) -> None:
        """Ends the stream; safe from any thread. A blocked read or a backoff sleep returns at
        once and the iteration stops (``StopIteration``)."""
        self._closed.set()
        with self._lock:
            conn = self._conn
        sock = getattr(conn, "sock", None)  # read once: the reader thread may be closing it
        if sock is not None:
            try:
                # shutdown (not close) wakes a recv blocked in another thread; the reader closes.
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed

    def _drop(self) -> None:
        with self._lock:
            conn, self._conn, self._resp = self._conn, None, None
        self._buf.clear()
        if conn is not None:
            conn.close()

    def _connect(self) -> None:
        c = self._client
        headers = c._headers("text/event-stream")
        headers["Cache-Control"] = "no-cache"
        if self.last_event_id is not None:
            headers["Last-Event-ID"] = self.last_event_id
        # The response headers must come within request_timeout; afterwards each read waits up to
        # stream_read_timeout (the silence bound).
        conn, resp = c._open(self.url, "/hints/stream", headers, c.config.request_timeout)
        ctype = resp.getheader("Content-Type", "")
        if not ctype.strip().lower().startswith("text/event-stream"):
            conn.close()
            raise NotAnEventStream(self.url, ctype)
        conn.sock.settimeout(c.config.stream_read_timeout)
        with self._lock:
            self._conn, self._resp = conn, resp
        if self._closed.is_set():  # close() ran between connect and publishing the connection
            self._drop()
            return
        self.connects += 1
        if self.failures:
            log.info("hint stream %s reconnected (last event id %s)", self.url, self.last_event_id)
        else:
            log.debug("hint stream %s connected", self.url)

    def _connect_first(self) -> None:
        self._connect()

    def _fail(self, err: RingsideError) -> None:
        """Counts a failure, then sleeps before the next attempt or raises GaveUp."""
        self._drop()
        self.failures += 1
        backoff = self._client.config.reconnect
        if self.failures >= backoff.max_attempts:
            self._done = True
            raise GaveUp(self.url, self.failures, err)
        delay = backoff.delay(self.failures)
        retry_after = getattr(err, "retry_after", None)
        if retry_after:
            delay = max(delay, retry_after)
        # The first failure in a row is worth a warning; the rest would only repeat it.
        (log.warning if self.failures == 1 and self._on_failure is None else log.debug)(
            "hint stream %s unavailable (%s); retry %d in %.2f s", self.url, err, self.failures, delay
        )
        if self._on_failure is not None:
            self._on_failure(err, self.failures)
        self._closed.wait(delay)

    def _read_line(self) -> bytes:
        """One line without its terminator. Raises _Lost on EOF, timeout, cut or close."""
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[:nl])
                del self._buf[: nl + 1]
                return line[:-1] if line.endswith(b"\r") else line
            if len(self._buf) > MAX_SSE_LINE:
                raise ProtocolError(self.url, f"a line is longer than {MAX_SSE_LINE} bytes")
            resp = self._resp
            if resp is None or self._closed.is_set():
                raise _Lost("closed")
            try:
                chunk = resp.read1(65536)
            except (socket.timeout, TimeoutError):
                raise _Lost(
                    f"nothing received for {self._client.config.stream_read_timeout} s (not even a keep-alive): connection presumed dead"
                ) from None
            except (OSError, http.client.HTTPException, ValueError, AttributeError) as e:
                # ValueError/AttributeError: http.client on a socket that close() shut down.
                raise _Lost(f"connection lost: {_describe(e)}") from None
            if not chunk:
                raise _Lost("the server closed the stream" + (" mid-line" if self._buf else ""))
            self._buf += chunk

    def _read_event(self) -> Tuple[Optional[str], Optional[str]]:
        """Reads lines until an event is complete; returns (event type, data)."""
        event: Optional[str] = None
        data: Optional[List[str]] = None
        eid: Optional[str] = None
        size = 0
        while True:
            raw = self._read_line()
            if not raw:
                # The id becomes the stream's last event id only when its event is complete (SSE
                # spec), so a reconnect after a cut never claims an event it did not receive whole.
                if eid is not None:
                    self.last_event_id = eid
                if event is not None or data is not None:
                    return event, ("\n".join(data) if data is not None else None)
                continue
            if raw.startswith(b":"):
                continue  # a comment: the agent's keep-alive
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ProtocolError(self.url, "a line is not valid utf-8") from None
            name, sep, value = text.partition(":")
            if sep and value.startswith(" "):
                value = value[1:]
            size += len(value)
            if size > MAX_SSE_EVENT:
                raise ProtocolError(self.url, f"an event is larger than {MAX_SSE_EVENT} bytes")
            if name == "event":
                event = value
            elif name == "data":
                data = (data or []) + [value]
            elif name == "id" and "\0" not in value:  # the SSE spec ignores ids containing NUL
                eid = value
            # `retry` and unknown fields are ignored.

    def __iter__(self) -> "HintStream":
        return self

    def __next__(self) -> Hint:
        # Each turn either returns, raises, counts one failure towards max_attempts (which ends the
        # stream), or reads one event: a server can make it spin only by sending events.
        while True:
            if self._done or self._closed.is_set():
                self._done = True
                self._drop()
                raise StopIteration
            if self._resp is None:
                try:
                    self._connect()
                except NotFound as e:
                    if self.last_version is not None:
                        log.info("hint stream %s: the job is no longer registered; the stream ends", self.url)
                        self._done = True
                        raise StopIteration from None
                    self._done = True
                    raise e
                except RingsideError as e:
                    if not e.transient:
                        self._done = True
                        raise
                    self._fail(e)
                    continue
                continue
            try:
                kind, data = self._read_event()
            except _Lost as e:
                if self._closed.is_set():
                    continue
                self._fail(ProtocolError(self.url, str(e)))
                continue
            except ProtocolError as e:
                # A framing error loses sync with the server: reconnect.
                self._fail(e)
                continue
            kind = kind or "message"
            if kind not in ("hint", "message"):
                log.debug("hint stream %s: ignoring event type %r", self.url, kind)
                continue
            try:
                hint = Hint.from_json(data or "")
            except HintError as e:
                self.malformed_events += 1
                self.failures += 1
                log.warning("hint stream %s: skipping a malformed event: %s", self.url, e)
                if self.failures >= self._client.config.reconnect.max_attempts:
                    self._done = True
                    self._drop()
                    raise GaveUp(self.url, self.failures, ProtocolError(self.url, str(e))) from None
                continue
            # A well-formed hint proves the connection healthy.
            self.failures = 0
            if self.last_version is not None and hint.version <= self.last_version:
                log.debug("hint stream %s: skipping version %d (not newer than %d)", self.url, hint.version, self.last_version)
                continue
            self.last_version = hint.version
            return hint
