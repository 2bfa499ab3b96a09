"""The client against a real HTTP server on 127.0.0.1 (tests/scripted_agent.py) that speaks the
agent's formats: JSON errors, chunked SSE with ids and keep-alives, cuts, silence, 429s."""

import socket
import threading
import time

import pytest

import ringside
from ringside import Backoff, ClientConfig, JobClient
from scripted_agent import Reply, ScriptedAgent, make_hint

TOKEN = "tenant-secret"


def fast(**over) -> ClientConfig:
    """Short timeouts and fast reconnects so failures show up in milliseconds."""
    cfg = dict(
        connect_timeout=2.0,
        request_timeout=5.0,
        stream_read_timeout=2.0,
        reconnect=Backoff(initial=0.02, max=0.1, max_attempts=4),
    )
    cfg.update(over)
    return ClientConfig(**cfg)


@pytest.fixture
def agent():
    with ScriptedAgent({TOKEN: "j-1", "other-tenant": "j-2"}) as a:
        a.publish(make_hint("j-1", 1))
        yield a


def client(agent, **over) -> JobClient:
    return JobClient(agent.job_url() + "/", TOKEN, config=fast(**over))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- construction ----------------------------------------------------------------------------------


def test_token_comes_from_the_environment_or_fails_clearly(agent, monkeypatch):
    monkeypatch.setenv("RINGSIDE_TOKEN", TOKEN)
    c = JobClient(agent.job_url())
    assert c.hint().version == 1
    assert c.job_id == "j-1"
    monkeypatch.delenv("RINGSIDE_TOKEN")
    with pytest.raises(ringside.ConfigError, match="RINGSIDE_TOKEN"):
        JobClient(agent.job_url())
    with pytest.raises(ringside.ConfigError, match="printable ASCII"):
        JobClient(agent.job_url(), "two words")


@pytest.mark.parametrize(
    "url,needle",
    [
        ("ftp://h/v1/jobs/j", "use http://"),
        ("http:///v1/jobs/j", "host is missing"),
        ("http://h:99999/v1/jobs/j", "Port out of range"),
        ("http://h:9464", "must end in /v1/jobs/ID"),
        ("http://h:9464/v1/jobs/", "must end in /v1/jobs/ID"),
        ("http://h:9464/v1/jobs/a b", "spaces"),
        ("http://h:9464/v1/jobs/j?x=1", "query"),
        ("http://u:p@h:9464/v1/jobs/j", "user:password"),
    ],
)
def test_bad_urls_are_refused_before_any_request(url, needle):
    with pytest.raises(ringside.ConfigError) as e:
        JobClient(url, TOKEN)
    assert needle in str(e.value)


# -- plain requests --------------------------------------------------------------------------------


def test_hint_sends_the_token_and_parses(agent):
    c = client(agent)
    h = c.hint()
    assert (h.job, h.version, str(h.compression)) == ("j-1", 1, "none")
    req = agent.requests[-1]
    assert req.path == "/v1/jobs/j-1/hints"
    assert req.headers["authorization"] == f"Bearer {TOKEN}"
    assert TOKEN not in repr(c)


def test_metrics_are_text(agent):
    text = client(agent).metrics()
    assert 'ringside_job_step_seconds{job="j-1"} 0.25' in text
    assert agent.requests[-1].path == "/v1/jobs/j-1/metrics"


def test_each_agent_error_maps_to_its_exception_with_the_servers_message(agent):
    c = client(agent)
    wrong = JobClient(agent.job_url(), "wrong-secret", config=fast())
    with pytest.raises(ringside.Unauthorized) as e:
        wrong.hint()
    assert e.value.status == 401 and "invalid token" in str(e.value) and "wrong-secret" not in str(e.value)
    assert not e.value.transient
    with pytest.raises(ringside.Forbidden, match="not valid for the requested job"):
        JobClient(agent.job_url("j-2"), TOKEN, config=fast()).hint()
    with pytest.raises(ringside.NotFound, match="no hint yet"):
        JobClient(agent.job_url("j-2"), "other-tenant", config=fast()).hint()

    agent.script("hints", Reply.error(429, "64 hint streams are open", Retry_After="7"))
    with pytest.raises(ringside.RateLimited) as e:
        c.hint()
    assert (e.value.status, e.value.retry_after, e.value.transient) == (429, 7.0, True)

    agent.script("hints", Reply.error(503, "not ready: no poll yet"))
    with pytest.raises(ringside.ServiceUnavailable, match="not ready"):
        c.hint()
    for status, cls in [(400, ringside.BadRequest), (409, ringside.Conflict), (413, ringside.PayloadTooLarge), (415, ringside.UnsupportedMediaType)]:
        agent.script("hints", Reply.error(status, "refused"))
        with pytest.raises(cls):
            c.hint()
    # Not the agent's JSON (a proxy in between): the status and an excerpt of the body.
    agent.script("hints", Reply.raw(502, "text/html", b"<html><body>Bad   gateway</body></html>"))
    with pytest.raises(ringside.ServerError, match="502: <html><body>Bad gateway"):
        c.hint()
    # A 200 whose hint does not validate is a protocol error naming the field.
    agent.script("hints", Reply.raw(200, "application/json", b'{"job":"j-1","version":0}'))
    with pytest.raises(ringside.ProtocolError, match=r"hint\.version"):
        c.hint()


def test_report_plan_puts_the_plan_and_the_agent_refusals_are_errors(agent):
    c = client(agent)
    c.report_plan(algorithm="ring", chunk_bytes=1 << 20, channels=1, compression="int8", error_feedback=True, step=42, step_time_ms=207.5)
    c.report_plan(algorithm="ring", chunk_bytes=1 << 20, channels=1, compression="none")
    req = agent.requests[-1]
    assert (req.method, req.path, req.headers["authorization"], req.headers["content-type"]) == ("PUT", "/v1/jobs/j-1/plan", f"Bearer {TOKEN}", "application/json")
    assert agent.plan_reports() == [
        {"algorithm": "ring", "chunk_bytes": 1 << 20, "channels": 1, "compression": "int8", "error_feedback": True, "step": 42, "step_time_ms": 207.5},
        {"algorithm": "ring", "chunk_bytes": 1 << 20, "channels": 1, "compression": "none", "error_feedback": False, "step": 0},
    ]
    for bad in (0, -1.0, float("nan"), float("inf"), "207", True):
        with pytest.raises(ringside.ConfigError, match="step_time_ms"):
            c.report_plan(algorithm="ring", chunk_bytes=1, channels=1, compression="none", step_time_ms=bad)
    agent.script("plan", Reply.error(400, "channels must be at least 1"))
    with pytest.raises(ringside.BadRequest, match="channels must be at least 1"):
        c.report_plan(algorithm="ring", chunk_bytes=1, channels=0, compression="none")
    with pytest.raises(ringside.Forbidden):
        JobClient(agent.job_url("j-2"), TOKEN, config=fast()).report_plan(algorithm="ring", chunk_bytes=1, channels=1, compression="none")
    assert len(agent.plan_reports()) == 2, "refused reports are not recorded"


def test_an_unreachable_agent_is_a_transport_error():
    c = JobClient(f"http://127.0.0.1:{free_port()}/v1/jobs/j-1", TOKEN, config=fast())
    with pytest.raises(ringside.TransportError, match="cannot reach") as e:
        c.hint()
    assert e.value.transient
    with pytest.raises(ringside.TransportError):
        c.stream()


# -- the stream ------------------------------------------------------------------------------------


def test_stream_yields_the_current_hint_then_each_change_skipping_keep_alives(agent):
    with client(agent).stream() as s:
        assert next(s).version == 1
        time.sleep(0.5)  # a couple of keep-alive comments (every 0.2 s) go by
        agent.publish(make_hint("j-1", 2, "int8"))
        h = next(s)
        assert (h.version, str(h.compression)) == (2, "int8")
        assert s.connects == 1
    req = agent.stream_requests()[0]
    assert req.path == "/v1/jobs/j-1/hints/stream"
    assert req.headers["accept"] == "text/event-stream"
    assert "last-event-id" not in req.headers
    assert next(s, None) is None  # closed: iteration is over


def test_a_cut_connection_reconnects_with_last_event_id_and_never_repeats(agent):
    agent.publish(make_hint("j-1", 2, "fp16"))
    # Two whole events, then the connection is cut in the middle of a third.
    agent.script("stream", Reply.cut((1, 2)))
    c = client(agent)
    with c.stream() as s:
        assert [next(s).version, next(s).version] == [1, 2]
        # The reconnect replays the current hint (2): skipped. The next change comes through.
        agent.publish(make_hint("j-1", 3, "bf16"))
        assert next(s).version == 3
        assert s.connects == 2
    reqs = agent.stream_requests()
    assert len(reqs) == 2
    assert reqs[1].headers["last-event-id"] == "2"  # not 99: that event never arrived whole
    assert reqs[1].headers["authorization"] == f"Bearer {TOKEN}"


def test_stale_versions_and_renewals_are_not_yielded(agent):
    with client(agent).stream() as s:
        assert next(s).version == 1
        agent.publish(make_hint("j-1", 3, "int8"))
        assert next(s).version == 3
        agent.publish(make_hint("j-1", 3, "int8", expires_at=int(time.time() * 1000) + 120_000))  # renewal
        time.sleep(0.05)
        agent.publish(make_hint("j-1", 2, "fp16"))  # going back
        time.sleep(0.05)
        agent.publish(make_hint("j-1", 4, "bf16"))
        assert next(s).version == 4


def test_a_silent_connection_is_declared_dead_and_replaced(agent):
    agent.script("stream", Reply.silent())
    with client(agent, stream_read_timeout=0.4).stream() as s:
        assert next(s).version == 1
        t0 = time.monotonic()
        agent.publish(make_hint("j-1", 2, "int8"))  # not sent on the silent connection
        assert next(s).version == 2  # ... but on the replacement
        assert 0.35 < time.monotonic() - t0 < 3.0
        assert s.connects == 2


def test_429_on_reconnect_waits_for_retry_after(agent):
    agent.script("stream", Reply.cut((1,), tail=b""), Reply.error(429, "64 hint streams are open", Retry_After="1"))
    with client(agent).stream() as s:
        assert next(s).version == 1
        agent.publish(make_hint("j-1", 2, "int8"))
        assert next(s).version == 2
    t = [r.at for r in agent.stream_requests()]
    assert len(t) == 3
    assert t[2] - t[1] >= 0.95, "the retry after a 429 must honour Retry-After: 1 (backoff alone is 0.02 s)"
    assert t[1] - t[0] < 0.9


def test_malformed_events_are_skipped_and_a_garbage_stream_gives_up(agent):
    bad = b"event: hint\nid: 7\ndata: {not json\n\n"
    other = b"event: stats\ndata: {}\n\n"  # unknown event type: ignored, not an error
    good = b'event: hint\nid: 2\ndata: ' + __import__("json").dumps(make_hint("j-1", 2, "fp16")).encode() + b"\n\n"
    agent.script("stream", Reply.cut((), tail=bad + other + good))
    with client(agent).stream() as s:
        assert next(s).version == 2
        assert s.malformed_events == 1
    # Only garbage, on every connection: bounded by max_attempts (4), then GaveUp.
    agent.script("stream", *[Reply.cut((), tail=bad * 2) for _ in range(4)])
    s = client(agent).stream()
    with pytest.raises(ringside.GaveUp) as e:
        next(s)
    assert e.value.attempts == 4
    assert next(s, None) is None


def test_an_overlong_line_drops_the_connection_and_resyncs(agent, monkeypatch):
    monkeypatch.setattr(ringside.client, "MAX_SSE_LINE", 1024)
    agent.script("stream", Reply.cut((), tail=b"data: " + b"x" * 4096))
    with client(agent).stream() as s:
        assert next(s).version == 1  # from the second connection
        assert s.connects == 2


def test_refusals_end_the_stream_at_once(agent):
    s = JobClient(agent.job_url(), "wrong-secret", config=fast()).stream_retrying()
    with pytest.raises(ringside.Unauthorized):
        next(s)
    assert len(agent.stream_requests()) == 1, "a 401 is not retried"
    agent.script("stream", Reply.raw(200, "text/html", b"<html>a dashboard</html>"))
    with pytest.raises(ringside.NotAnEventStream, match="use the job's base url"):
        client(agent).stream()


def test_a_deleted_job_ends_the_stream(agent):
    with client(agent).stream() as s:
        assert next(s).version == 1
        agent.delete_job("j-1")
        # The server ends the stream; the reconnect gets 404: the iteration stops.
        assert next(s, None) is None
    assert agent.stream_requests()[-1].headers["last-event-id"] == "1"


def test_an_agent_that_stays_down_makes_the_stream_give_up_in_bounded_time():
    c = JobClient(f"http://127.0.0.1:{free_port()}/v1/jobs/j-1", TOKEN, config=fast())
    t0 = time.monotonic()
    s = c.stream_retrying()
    with pytest.raises(ringside.GaveUp) as e:
        next(s)
    assert isinstance(e.value.last, ringside.TransportError)
    assert e.value.attempts == 4
    assert time.monotonic() - t0 < 2.0  # 3 sleeps of at most 0.1 s * 1.25


def test_an_agent_that_comes_back_is_found_again():
    port = free_port()
    c = JobClient(f"http://127.0.0.1:{port}/v1/jobs/j-1", TOKEN, config=fast(reconnect=Backoff(initial=0.05, max=0.2, max_attempts=40)))
    s = c.stream_retrying()
    got = []
    t = threading.Thread(target=lambda: got.append(next(s)), daemon=True)
    t.start()
    time.sleep(0.3)  # a few failed connects
    assert not got
    with ScriptedAgent({TOKEN: "j-1"}, port=port) as agent:
        agent.publish(make_hint("j-1", 5, "int8"))
        t.join(timeout=5)
        assert not t.is_alive() and got[0].version == 5
        s.close()


def test_close_from_another_thread_ends_a_blocked_read(agent):
    s = client(agent, stream_read_timeout=30.0).stream()
    assert next(s).version == 1
    ended = threading.Event()

    def read_rest():
        for _ in s:
            pass
        ended.set()

    t = threading.Thread(target=read_rest, daemon=True)
    t.start()
    time.sleep(0.3)  # blocked in a read (keep-alives arrive, no events)
    t0 = time.monotonic()
    s.close()
    assert ended.wait(2.0), "close() must wake the reader"
    assert time.monotonic() - t0 < 1.0
    assert s.closed


def test_on_failure_takes_over_the_reporting_of_retries(caplog):
    c = JobClient(f"http://127.0.0.1:{free_port()}/v1/jobs/j-1", TOKEN, config=fast())
    calls = []
    with caplog.at_level("DEBUG", logger="ringside.client"):
        s = c.stream_retrying(on_failure=lambda err, attempt: calls.append((type(err).__name__, attempt)))
        with pytest.raises(ringside.GaveUp):
            next(s)
    assert calls == [("TransportError", 1), ("TransportError", 2), ("TransportError", 3)]
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    assert len([r for r in caplog.records if "unavailable" in r.getMessage()]) == 3  # at DEBUG
    # Without a callback, the first failure of a run is a warning.
    caplog.clear()
    with caplog.at_level("DEBUG", logger="ringside.client"):
        with pytest.raises(ringside.GaveUp):
            next(c.stream_retrying())
    assert [r.levelname for r in caplog.records if "unavailable" in r.getMessage()] == ["WARNING", "DEBUG", "DEBUG"]
