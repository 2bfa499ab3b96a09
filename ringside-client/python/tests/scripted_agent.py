"""A real HTTP server on 127.0.0.1 that speaks the ringside agent's tenant API formats exactly
(``dataplane-user/src/api/`` and ``auth.rs``), with faults the tests script.

What it reproduces:

- ``GET /v1/jobs/{id}/hints``: the current hint as JSON, or 404 ``{"error": ...}`` before the first.
- ``GET /v1/jobs/{id}/hints/stream``: ``text/event-stream`` over HTTP/1.1 chunked encoding (as axum
  sends it): the current hint first, then one ``event: hint`` / ``id: <version>`` / ``data: <json>``
  event per publish, and a ``:`` keep-alive comment every ``keep_alive`` seconds. Deleting the job
  ends every stream (the final chunk), and later requests get 404.
- ``GET /v1/jobs/{id}/metrics``: Prometheus text scoped to the job.
- Auth as the agent: no or unknown token → 401 with ``WWW-Authenticate: Bearer``, another job's
  tenant token → 403 whatever the id, errors always ``{"error": "..."}``.

Faults are queued per endpoint with :meth:`ScriptedAgent.script`: a JSON error with headers (429 +
``Retry-After``), a stream cut mid-event after some events, a silent stream (no keep-alives), raw
bytes. Every request is recorded (:attr:`ScriptedAgent.requests`) so tests can assert on
``Last-Event-ID`` and ``Authorization``. Every wait in the server is bounded, and :meth:`stop`
ends all connections, so a test leaves no thread behind.
"""

from __future__ import annotations

import collections
import http.server
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Optional, Tuple

WWW_AUTHENTICATE = 'Bearer realm="ringside"'


def make_hint(job: str, version: int, compression: str = "none", step_from: int = 0, **over) -> dict:
    """A hint as the agent serializes it (field order of types.rs)."""
    h = {
        "job": job,
        "version": version,
        "step_from": step_from,
        "algorithm": "ring",
        "chunk_bytes": 1 << 20,
        "channels": 1,
        "compression": compression,
        "error_feedback": compression.startswith("topk") or compression == "int8",
        "reasons": ["initial plan: no measurements yet"] if version == 1 else ["path to peer 10.0.0.3 lossy"],
        "confidence": 0.0 if version == 1 else 0.8,
        "expires_at": int(time.time() * 1000) + 60_000,
    }
    h.update(over)
    return h


def sse_event(hint: dict) -> bytes:
    """One event exactly as axum's ``Event::default().event("hint").id(v).json_data(h)`` writes it."""
    data = json.dumps(hint, separators=(",", ":"))
    return f"event: hint\nid: {hint['version']}\ndata: {data}\n\n".encode()


@dataclass
class Reply:
    """A scripted answer for the next request to one endpoint."""

    kind: str  # "error", "cut", "silent", "raw"
    status: int = 200
    message: str = ""
    headers: Dict[str, str] = field(default_factory=dict)
    #: cut: events (hint versions from the published history) to send before cutting.
    versions: Tuple[int, ...] = ()
    #: cut: the bytes of a partial event sent before the connection is closed.
    tail: bytes = b""
    #: raw: content type and body.
    content_type: str = ""
    body: bytes = b""

    @staticmethod
    def error(status: int, message: str, **headers: str) -> "Reply":
        return Reply("error", status=status, message=message, headers={k.replace("_", "-"): v for k, v in headers.items()})

    @staticmethod
    def cut(versions: Tuple[int, ...], tail: bytes = b'event: hint\nid: 99\ndata: {"jo') -> "Reply":
        return Reply("cut", versions=versions, tail=tail)

    @staticmethod
    def silent() -> "Reply":
        """Headers and the current hint, then nothing at all (no keep-alive) until stop."""
        return Reply("silent")

    @staticmethod
    def raw(status: int, content_type: str, body: bytes) -> "Reply":
        return Reply("raw", status=status, content_type=content_type, body=body)


@dataclass
class Recorded:
    method: str
    path: str
    headers: Dict[str, str]
    at: float


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = False  # joined by server_close(), so stop() leaves no thread behind
    block_on_close = True
    allow_reuse_address = True


class ScriptedAgent:
    """See the module docs. ``tokens`` maps tenant token → job id."""

    def __init__(self, tokens: Optional[Dict[str, str]] = None, keep_alive: float = 0.2, port: int = 0):
        self.tokens = dict(tokens or {"tenant-secret": "j-1"})
        self.keep_alive = keep_alive
        self.requests: List[Recorded] = []
        self._cond = threading.Condition()
        self._hints: Dict[str, List[dict]] = {job: [] for job in self.tokens.values()}
        self._deleted: set = set()
        self._script: Dict[str, Deque[Reply]] = collections.defaultdict(collections.deque)
        self._stopping = False
        self._open: set = set()
        self.streams_opened = 0
        #: Plan reports received (``PUT {job}/plan``), per job: (body, monotonic time).
        self.plans: Dict[str, List[Tuple[dict, float]]] = {}
        agent = self

        class Handler(_Handler):
            pass

        Handler.agent = agent
        self._httpd = _Server(("127.0.0.1", port), Handler)
        self.port = self._httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def job_url(self, job: str = "j-1") -> str:
        return f"{self.base_url}/v1/jobs/{job}"

    def __enter__(self) -> "ScriptedAgent":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """Ends every stream and connection, then the server; bounded by the handlers' own waits."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            conns = list(self._open)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    # -- what the tests drive -------------------------------------------------------------------

    def publish(self, hint: dict) -> None:
        """Makes ``hint`` the job's current hint and sends it on every open stream of the job."""
        with self._cond:
            self._hints.setdefault(hint["job"], []).append(hint)
            self._cond.notify_all()

    def delete_job(self, job: str = "j-1") -> None:
        with self._cond:
            self._deleted.add(job)
            self._cond.notify_all()

    def script(self, endpoint: str, *replies: Reply) -> None:
        """Queues replies for the next requests to ``endpoint``: "hints", "stream", "metrics" or "plan"."""
        with self._cond:
            self._script[endpoint].extend(replies)

    def plan_reports(self, job: str = "j-1") -> List[dict]:
        """The bodies of the plan reports received for ``job``, oldest first."""
        with self._cond:
            return [b for b, _ in self.plans.get(job, [])]

    def wait_plan_reports(self, n: int, job: str = "j-1", timeout: float = 10.0) -> List[dict]:
        """Waits until ``n`` plan reports for ``job`` arrived (AssertionError after ``timeout``)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.plans.get(job, [])) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{len(self.plans.get(job, []))} plan reports after {timeout} s, wanted {n}")
                self._cond.wait(left)
            return [b for b, _ in self.plans[job]]

    def stream_requests(self) -> List[Recorded]:
        with self._cond:
            return [r for r in self.requests if r.path.endswith("/hints/stream")]

    def wait_streams(self, n: int, timeout: float = 10.0) -> None:
        """Waits until ``n`` streams have been opened (200 sent) in total; fails after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.streams_opened < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"only {self.streams_opened} of {n} hint streams opened within {timeout} s")
                self._cond.wait(left)

    # -- internals ------------------------------------------------------------------------------

    def _next_reply(self, endpoint: str) -> Optional[Reply]:
        with self._cond:
            q = self._script.get(endpoint)
            return q.popleft() if q else None

    def _current(self, job: str) -> Optional[dict]:
        hs = self._hints.get(job) or []
        return hs[-1] if hs else None


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    agent: ScriptedAgent
    # Bounds the wait for a request line on an idle kept-alive connection.
    timeout = 5

    def log_message(self, fmt, *args):  # keep pytest output clean
        pass

    def setup(self):
        super().setup()
        with self.agent._cond:
            self.agent._open.add(self.connection)

    def finish(self):
        with self.agent._cond:
            self.agent._open.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    # -- replies --------------------------------------------------------------------------------

    def _send(self, status: int, content_type: str, body: bytes, headers: Optional[Dict[str, str]] = None):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, headers: Optional[Dict[str, str]] = None):
        body = json.dumps({"error": message}).encode()
        self._send(status, "application/json", body, headers)

    def _chunk(self, data: bytes):
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    # -- routing --------------------------------------------------------------------------------

    def do_GET(self):
        a = self.agent
        with a._cond:
            a.requests.append(Recorded("GET", self.path, {k.lower(): v for k, v in self.headers.items()}, time.monotonic()))
        parts = self.path.split("/")
        # ["", "v1", "jobs", ID, rest...]
        if len(parts) < 5 or parts[1:3] != ["v1", "jobs"]:
            return self._error(404, f"no such endpoint `{self.path}`; GET /v1/openapi.json lists every endpoint")
        job, rest = parts[3], "/".join(parts[4:])
        endpoint = {"hints": "hints", "hints/stream": "stream", "metrics": "metrics"}.get(rest)
        if endpoint is None:
            return self._error(404, f"no such endpoint `{self.path}`; GET /v1/openapi.json lists every endpoint")
        if not self._authorized(job):
            return None
        reply = a._next_reply(endpoint)
        if reply is not None and reply.kind == "error":
            return self._error(reply.status, reply.message, reply.headers)
        if reply is not None and reply.kind == "raw":
            return self._send(reply.status, reply.content_type, reply.body)
        with a._cond:
            deleted = job in a._deleted
        if deleted:
            return self._error(404, f"no registered job with id `{job}`")
        if endpoint == "hints":
            with a._cond:
                cur = a._current(job)
            if cur is None:
                return self._error(404, "no hint yet for this job: the policy has not planned it; retry after the next detection window")
            return self._send(200, "application/json", json.dumps(cur).encode())
        if endpoint == "metrics":
            body = f'# HELP ringside_job_step_seconds Step time.\n# TYPE ringside_job_step_seconds gauge\nringside_job_step_seconds{{job="{job}"}} 0.25\n'
            return self._send(200, "text/plain; version=0.0.4; charset=utf-8", body.encode())
        return self._stream(job, reply)

    def _authorized(self, job: str) -> bool:
        """The agent's bearer checks; sends the 401/403 and returns False when they fail."""
        a = self.agent
        auth = self.headers.get("Authorization", "")
        scheme, _, token = auth.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            self._error(401, "missing bearer token: send `Authorization: Bearer <token>`", {"WWW-Authenticate": WWW_AUTHENTICATE})
            return False
        if token not in a.tokens:
            self._error(401, "invalid token: use the operator token or the tenant token POST /v1/jobs returned for this job", {"WWW-Authenticate": WWW_AUTHENTICATE})
            return False
        if a.tokens[token] != job:
            self._error(403, "this token is not valid for the requested job; use the tenant token of that job")
            return False
        return True

    def do_PUT(self):
        """``PUT /v1/jobs/{id}/plan``: recorded in :attr:`ScriptedAgent.plans` (body, time); 204."""
        a = self.agent
        with a._cond:
            a.requests.append(Recorded("PUT", self.path, {k.lower(): v for k, v in self.headers.items()}, time.monotonic()))
        parts = self.path.split("/")
        if len(parts) != 5 or parts[1:3] != ["v1", "jobs"] or parts[4] != "plan":
            return self._error(404, f"no such endpoint `{self.path}`; GET /v1/openapi.json lists every endpoint")
        job = parts[3]
        length = int(self.headers.get("Content-Length", "0") or 0)
        body = self.rfile.read(min(length, 65536))
        if not self._authorized(job):
            return None
        reply = a._next_reply("plan")
        if reply is not None and reply.kind == "error":
            return self._error(reply.status, reply.message, reply.headers)
        try:
            plan = json.loads(body)
            missing = [k for k in ("algorithm", "chunk_bytes", "channels", "compression") if k not in plan]
        except ValueError as e:
            return self._error(400, f"bad JSON: {e}")
        if missing:
            return self._error(400, f"missing field `{missing[0]}`")
        t = plan.get("step_time_ms")
        if t is not None and not (isinstance(t, (int, float)) and t > 0):
            return self._error(400, f"step_time_ms {t} must be a number of milliseconds above 0 and at most 3600000")
        with a._cond:
            a.plans.setdefault(job, []).append((plan, time.monotonic()))
            a._cond.notify_all()
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()
        return None

    def _stream(self, job: str, reply: Optional[Reply]):
        a = self.agent
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        with a._cond:
            a.streams_opened += 1
            a._cond.notify_all()
            history = list(a._hints.get(job) or [])
        try:
            if reply is not None and reply.kind == "cut":
                by_version = {h["version"]: h for h in history}
                self._chunk(b"".join(sse_event(by_version[v]) for v in reply.versions) + reply.tail)
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)  # no final chunk: a cut, not an end
                return
            sent = len(history)
            if history:
                self._chunk(sse_event(history[-1]))  # the current hint first, as the agent does
            silent = reply is not None and reply.kind == "silent"
            while True:
                with a._cond:
                    if not a._stopping and job not in a._deleted and len(a._hints.get(job) or []) == sent:
                        a._cond.wait(a.keep_alive)
                    if a._stopping:
                        self.close_connection = True
                        return
                    if job in a._deleted:
                        break
                    hs = a._hints.get(job) or []
                    # A watch channel: only the newest hint, superseded plans are skipped.
                    new = hs[-1] if len(hs) > sent else None
                    sent = len(hs)
                if silent:
                    continue  # a half-open connection: nothing ever arrives
                if new is not None:
                    self._chunk(sse_event(new))
                else:
                    self._chunk(b":\n\n")  # axum's default keep-alive comment
            self.wfile.write(b"0\r\n\r\n")  # the job was deleted: the stream ends cleanly
            self.wfile.flush()
        except OSError:
            self.close_connection = True  # the client went away
