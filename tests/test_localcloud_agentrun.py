"""The AgentRun-like target and the mock-tool server: wire format, ground-truth timing, sessions, limits,
injected faults and stalls, disconnects, auth, admin, and the seed's mock-tool protocol."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
import time
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp
import pytest
import requests

from csbench.localcloud.agentrun.config import ConfigError, Dist, merge_patch, parse_config
from csbench.localcloud.agentrun.limits import Ceiling, TokenBucket, retry_after_value
from csbench.localcloud.agentrun.sessions import SessionTable
from csbench.localcloud.agentrun.timing import choose, compile_dist, hold, plan_response
from csbench.localcloud.agentrun.wire import ApiError, parse_chat_request

CHAT = "/openai/v1/chat/completions"
MSG = {"messages": [{"role": "user", "content": "hello"}]}
MS = 1_000_000


# ---------------------------------------------------------------------------------------------------------
# Pure parts: timing plans, limiter decisions, sessions, config and request checks.


def test_dists_are_seeded_and_clamped() -> None:
    for spec in [
        {"kind": "uniform", "low": 0.01, "high": 0.02},
        {"kind": "normal", "mean": 0.05, "std": 0.01},
        {"kind": "lognormal", "mean": 0.05, "std": 0.02},
        {"kind": "exponential", "mean": 0.05},
    ]:
        f = compile_dist(Dist.model_validate(spec))
        a = [f(random.Random(7)) for _ in range(3)]
        assert a == [f(random.Random(7)) for _ in range(3)]  # same seed, same samples
        xs = [f(r) for r in [random.Random(1)] for _ in range(20_000)]
        assert min(xs) >= 0
        if spec["kind"] != "uniform":
            assert abs(sum(xs) / len(xs) - 0.05) < 0.002, spec  # mean as configured
    assert compile_dist(Dist.model_validate(0.25))(random.Random()) == 0.25  # bare number = constant
    clamped = compile_dist(Dist(kind="normal", mean=1.0, std=5.0, min=0.5, max=1.5))
    assert all(0.5 <= clamped(r) <= 1.5 for r in [random.Random(3)] for _ in range(1000))
    with pytest.raises(ValueError, match="high"):
        Dist(kind="uniform", low=2, high=1)


def test_plan_uses_absolute_deadlines_and_shifts_for_stalls() -> None:
    const = compile_dist(Dist(value=0.1))
    gap = compile_dist(Dist(value=0.02))
    p = plan_response(1000, 4, random.Random(), const, gap)
    assert p.ready == 1000
    assert p.tokens == (1000 + 100 * MS, 1000 + 120 * MS, 1000 + 140 * MS, 1000 + 160 * MS)
    s = plan_response(0, 4, random.Random(), const, gap, stall_after=2, stall_ns=500 * MS)
    assert s.tokens == (100 * MS, 120 * MS, 640 * MS, 660 * MS)  # silence after 2 tokens, pace kept
    h = plan_response(0, 2, random.Random(), const, gap, stall_after=None, stall_ns=500 * MS)
    assert h.ready == 500 * MS and h.tokens == (600 * MS, 620 * MS)  # headers held


def test_stall_windows_hold_sends_until_the_window_ends() -> None:
    w = ((100, 200), (300, 400))
    assert [hold(t, w) for t in (50, 100, 150, 199, 200, 350, 500)] == [50, 200, 200, 200, 200, 400, 500]
    assert choose(3, frozenset({3}), 0.0, random.Random())
    assert not choose(2, frozenset({3}), 0.0, random.Random())
    assert choose(2, frozenset(), 1.0, random.Random())


def test_token_bucket_and_ceiling() -> None:
    b = TokenBucket(rate=2.0, burst=2.0, now=0.0)
    assert b.take(0.0) == 0.0 and b.take(0.0) == 0.0
    assert b.take(0.0) == pytest.approx(0.5)  # next token in 1/rate
    assert b.take(0.25) == pytest.approx(0.25)
    assert b.take(0.5) == 0.0
    c = Ceiling(2)
    assert c.enter() and c.enter() and not c.enter()
    c.leave()
    assert c.enter() and c.peak == 2


def test_retry_after_forms() -> None:
    assert retry_after_value(0.2, "seconds", 0) == "1"  # at least 1, whole seconds
    assert retry_after_value(2.01, "seconds", 0) == "3"  # rounded up: never retry early
    now = 1_700_000_000.4
    when = parsedate_to_datetime(retry_after_value(2.0, "http-date", now)).timestamp()
    assert now + 2 <= when <= now + 3


def test_sessions_cold_once_then_again_after_idle_timeout() -> None:
    t = SessionTable(idle_timeout_ns=1000, max_sessions=10)
    assert t.begin("a", 0, 500) == (True, 500)
    assert t.begin("a", 10, 999) == (False, 500)  # joins the same cold start, is not cold itself
    t.end("a", 600)
    t.end("a", 700)
    assert t.begin("a", 1600, 5) == (False, 1600)  # idle 900 ns < 1000; warm: ready at once
    t.end("a", 1700)
    assert t.begin("a", 2701, 5) == (True, 2706)  # idle 1001 ns: recycled
    assert t.recycled == 1
    t.begin("b", 0, 0)  # in flight forever: never recycled
    assert t.begin("b", 10**9, 0)[0] is False
    full = SessionTable(idle_timeout_ns=10**12, max_sessions=10)
    for i in range(10):
        full.begin(f"s{i}", i, 0)
        full.end(f"s{i}", i)
    full.begin("new", 100, 0)  # at capacity: the longest-idle tenth (s0) makes room
    assert "s0" not in full.sessions and "s1" in full.sessions and full.evicted == 1


def test_config_rejects_unknown_keys_by_name() -> None:
    with pytest.raises(ConfigError, match=r"agentrun\.ttft_ms: unknown key"):
        parse_config({"ttft_ms": 5})
    with pytest.raises(ConfigError, match=r"agentrun\.retry_after\.form: unknown key"):
        parse_config({"retry_after": {"form": "seconds"}})
    with pytest.raises(ConfigError, match=r"agentrun\.max_concurrency"):
        parse_config({"max_concurrency": 0})
    cfg = parse_config({"ttft": 0.2, "session_header": "X-AgentRun-Session-ID"})
    assert cfg.ttft.kind == "constant" and cfg.ttft.value == 0.2
    assert cfg.session_header == "x-agentrun-session-id"
    assert merge_patch({"a": {"b": 1, "c": 2}, "d": 1}, {"a": {"b": 3}, "d": None}) == {"a": {"b": 3, "c": 2}}


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        (b"{nope", None, "parse the JSON"),
        (b"[1]", None, "JSON object"),
        (b"{}", "messages", "Missing required parameter: 'messages'"),
        (b'{"messages": "hi"}', "messages", "expected an array"),
        (b'{"messages": []}', "messages", "empty array"),
        (b'{"messages": [{"content": "x"}]}', "messages[0].role", "Missing required"),
        (b'{"messages": [{"role": "wizard", "content": "x"}]}', "messages[0].role", "'wizard'"),
        (b'{"messages": [{"role": "user", "content": 5}]}', "messages[0].content", "got int"),
        (b'{"messages": [{"role": "user"}], "stream": "yes"}', "stream", "expected a boolean"),
        (b'{"messages": [{"role": "user"}], "max_tokens": "9"}', "max_tokens", "expected an integer"),
        (b'{"messages": [{"role": "user"}], "max_tokens": 0}', "max_tokens", "minimum"),
        (
            b'{"messages": [{"role": "user"}], "stream_options": {"include_usage": true}}',
            "stream_options",
            "only",
        ),
    ],
)
def test_bad_requests_name_the_problem(body: bytes, param: str | None, fragment: str) -> None:
    with pytest.raises(ApiError) as e:
        parse_chat_request(body)
    assert e.value.status == 400 and e.value.param == param and fragment in e.value.message


# ---------------------------------------------------------------------------------------------------------
# Helpers for the live server.


def _post(base: str, body: Any = None, headers: dict[str, str] | None = None, **kw: Any) -> requests.Response:
    return requests.post(base + CHAT, json=MSG if body is None else body, headers=headers, timeout=10, **kw)


async def _stream(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
    """One streaming request with client-side perf_counter_ns stamps of the send, headers and each event."""
    async with aiohttp.ClientSession() as s:
        t0 = time.perf_counter_ns()
        async with s.post(url, json=body, headers=headers) as r:
            t_headers = time.perf_counter_ns()
            events: list[tuple[int, str]] = []
            error = None
            try:
                while line := await r.content.readline():
                    if line.startswith(b"data: "):
                        events.append((time.perf_counter_ns(), line[6:].strip().decode()))
            except aiohttp.ClientPayloadError as e:  # truncated stream
                error = str(e)
            return {"t0": t0, "t_headers": t_headers, "status": r.status, "headers": r.headers.copy(),
                    "events": events, "error": error}  # fmt: skip


def stream(
    base: str, body: dict[str, Any] | None = None, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    return asyncio.run(_stream(base + CHAT, {**(body or MSG), "stream": True}, headers))


def record(base: str, request_id: str, until: str | None = None) -> dict[str, Any]:
    """The server's ground-truth record; with `until`, wait for that outcome (records complete async)."""
    for _ in range(200):
        rec = requests.get(f"{base}/-/requests/{request_id}", timeout=5).json()
        if until is None or rec["outcome"] == until:
            return rec
        time.sleep(0.01)
    raise AssertionError(f"record {request_id} stuck at {rec['outcome']}")


def configure(base: str, patch: dict[str, Any]) -> requests.Response:
    return requests.put(base + "/-/config", json=patch, timeout=5)


@pytest.fixture
def agentrun(make_cloud: Any) -> Any:
    """Factory: a running target with the given config; returns its base URL."""

    def _make(**config: Any) -> str:
        cloud = make_cloud(services=["agentrun"], config={"agentrun": config})
        return cloud.endpoints["agentrun"]

    return _make


# ---------------------------------------------------------------------------------------------------------
# Wire format.


def test_streaming_is_valid_sse_ending_in_done(agentrun: Any) -> None:
    base = agentrun(ttft=0.0, inter_token=0.0, output_tokens=4)
    r = requests.post(base + CHAT, json={**MSG, "stream": True, "stream_options": {"include_usage": True}},
                      headers={"x-agentrun-session-id": "s1"}, timeout=10)  # fmt: skip
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    assert r.headers["x-agentrun-session-id"] == "s1"
    rid = r.headers["x-request-id"]
    blocks = r.text.split("\n\n")
    assert blocks[-1] == "" and blocks[-2] == "data: [DONE]"  # every event terminated by a blank line
    chunks = [json.loads(b.removeprefix("data: ")) for b in blocks[:-2]]
    assert all(b.startswith("data: ") for b in blocks[:-1])
    assert {c["id"] for c in chunks} == {f"chatcmpl-{rid}"}
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "agentrun-local" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    content = [c["choices"][0]["delta"].get("content") for c in chunks[:4]]
    assert all(content) and len(content) == 4
    assert chunks[4]["choices"][0]["finish_reason"] == "stop" and chunks[4]["choices"][0]["delta"] == {}
    assert chunks[5]["choices"] == [] and chunks[5]["usage"]["completion_tokens"] == 4
    assert all(c["usage"] is None for c in chunks[:5])  # include_usage: null on every other chunk
    # without include_usage there is no usage chunk at all
    r2 = requests.post(base + CHAT, json={**MSG, "stream": True}, timeout=10)
    assert '"usage"' not in r2.text and r2.text.endswith("data: [DONE]\n\n")


def test_non_streaming_body_and_agentrun_path(agentrun: Any) -> None:
    base = agentrun(ttft=0.0, inter_token=0.0, output_tokens=10, output_tokens_from_request=True)
    r = _post(base, {**MSG, "max_tokens": 3})
    doc = r.json()
    assert r.status_code == 200 and doc["object"] == "chat.completion"
    assert doc["id"] == "chatcmpl-" + r.headers["x-request-id"]
    choice = doc["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"] == "Local cloud agent"
    assert choice["finish_reason"] == "length"  # stopped by max_tokens
    assert doc["usage"] == {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}
    alt = base + "/agent-runtimes/rt-1/endpoints/Default/invocations" + CHAT
    assert requests.post(alt, json=MSG, timeout=10).json()["choices"][0]["finish_reason"] == "stop"


def test_errors_are_openai_json_never_tracebacks(agentrun: Any) -> None:
    base = agentrun()
    r = requests.post(base + CHAT, data=b"{nope", timeout=5)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = _post(base, {"messages": [{"role": "user", "content": 1}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content"
    r = requests.get(base + CHAT, timeout=5)
    assert r.status_code == 405 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = requests.post(base + CHAT, data=b"{" + b" " * (9 * 1024 * 1024) + b"}", timeout=10)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = requests.post(base + "/openai/v1/nothing", json=MSG, timeout=5)
    assert r.status_code == 404 and "error" in r.json()
    recs = requests.get(base + "/-/requests", timeout=5).json()["records"]
    assert [x["outcome"] for x in recs] == ["bad_request"] * 3


# ---------------------------------------------------------------------------------------------------------
# Timing against ground truth.


def test_ttft_and_gaps_match_config_and_ground_truth(agentrun: Any) -> None:
    base = agentrun(ttft=0.08, inter_token=0.02, output_tokens=6)
    stream(base)  # warm the session and the code paths
    res = stream(base)
    rid = res["headers"]["x-request-id"]
    rec = record(base, rid)
    tokens = [t for t, d in res["events"] if d != "[DONE]" and json.loads(d)["choices"][:1]
              and json.loads(d)["choices"][0]["delta"].get("content")]  # fmt: skip
    assert len(tokens) == 6 and rec["tokens_sent"] == 6 and rec["outcome"] == "ok"
    # client view: configured TTFT and gaps, within a loopback tolerance
    ttft = (tokens[0] - res["t0"]) / MS
    assert 80 <= ttft < 95, ttft
    gaps = [(b - a) / MS for a, b in zip(tokens, tokens[1:], strict=False)]
    assert all(15 < g < 25 for g in gaps), gaps
    # server truth: same monotonic clock. The server stamps after write() returned, and the client (on the
    # other core) may already have the bytes by then: client − server is ≥ a few µs negative, never more.
    assert rec["arrival_ns"] >= res["t0"]
    server = rec["token_ns"]
    lag = [(c - s) / MS for c, s in zip(tokens, server, strict=True)]
    assert all(-1 < x < 10 for x in lag), lag  # client and server share one GIL in this test
    assert rec["first_token_ns"] == server[0] and rec["ttft_ns"] == server[0] - rec["arrival_ns"]
    # the server's own schedule: never early; typically 0.5-1 ms late (epoll's 1 ms resolution), more when
    # the client thread holds the GIL — `python -m csbench.localcloud.agentrun.accuracy` measures it across processes
    planned = [rec["planned_first_token_ns"] + i * 20 * MS for i in range(6)]
    err = [(s - p) / MS for s, p in zip(server, planned, strict=True)]
    assert all(0 <= e < 10 for e in err), err
    assert rec["planned_end_ns"] == planned[-1]
    assert rec["arrival_wall_ns"] - rec["arrival_ns"] == rec["first_token_wall_ns"] - rec["first_token_ns"]


def test_cold_start_per_new_session_and_after_idle_timeout(agentrun: Any) -> None:
    base = agentrun(cold_start=0.3, session_idle_timeout_s=0.5, ttft=0.0, inter_token=0.0, output_tokens=1)

    def call(sid: str) -> tuple[float, dict[str, Any]]:
        t0 = time.perf_counter()
        r = _post(base, headers={"x-agentrun-session-id": sid})
        return time.perf_counter() - t0, record(base, r.headers["x-request-id"])

    (d1, r1), (d2, r2) = call("s1"), call("s1")
    assert r1["cold_start"] and d1 >= 0.3 and r1["ready_ns"] - r1["arrival_ns"] == 300 * MS
    assert not r2["cold_start"] and d2 < 0.1 and r2["ready_ns"] == r2["arrival_ns"]
    time.sleep(0.25)
    assert not call("s1")[1]["cold_start"]  # idle 0.25 s < 0.5 s: still warm (idle clock restarts)
    d3, r3 = call("s2")
    assert r3["cold_start"] and d3 >= 0.3  # another session pays its own cold start
    time.sleep(0.3)  # s1 now idle > 0.6 s
    d5, r5 = call("s1")
    assert r5["cold_start"] and d5 >= 0.3  # idle 0.6 s > 0.5 s: recycled
    assert requests.get(base + "/-/stats", timeout=5).json()["sessions_recycled"] >= 1


# ---------------------------------------------------------------------------------------------------------
# Limits, failures, stalls, disconnects.


def test_rate_limit_429_with_retry_after_in_both_forms(agentrun: Any) -> None:
    base = agentrun(rate_limit_rps=1, rate_limit_burst=2, ttft=0, inter_token=0, output_tokens=1)
    codes = [_post(base) for _ in range(3)]
    assert [r.status_code for r in codes] == [200, 200, 429]
    err = codes[2].json()["error"]
    assert err["code"] == "rate_limit_exceeded" and err["type"] == "requests"
    assert codes[2].headers["Retry-After"] == "1"
    assert configure(base, {"retry_after": {"format": "http-date", "seconds": 5}}).status_code == 200
    r = _post(base)
    assert r.status_code == 429
    when = parsedate_to_datetime(r.headers["Retry-After"]).timestamp()
    assert time.time() + 4 <= when <= time.time() + 7
    rec = record(base, r.headers["x-request-id"])
    assert rec["outcome"] == "rejected" and rec["retry_after"] == r.headers["Retry-After"]


def test_concurrency_ceiling_429(agentrun: Any) -> None:
    base = agentrun(max_concurrency=2, ttft=0.4, output_tokens=1)
    results: list[requests.Response] = []
    threads = [threading.Thread(target=lambda: results.append(_post(base))) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.15)  # both in flight
    r = _post(base)
    for t in threads:
        t.join()
    assert r.status_code == 429 and r.json()["error"]["code"] == "concurrency_limit_exceeded"
    assert r.headers["Retry-After"] == "1"
    assert sorted(x.status_code for x in results) == [200, 200]
    assert _post(base).status_code == 200  # capacity is back
    stats = requests.get(base + "/-/stats", timeout=5).json()
    assert stats["peak_in_flight"] == 2 and stats["outcomes"]["rejected"] == 1


def test_injected_failures_nth_probability_and_drop(agentrun: Any) -> None:
    base = agentrun(ttft=0, inter_token=0.0, output_tokens=4, failures=[{"requests": [2], "status": 503}])
    assert [_post(base).status_code for _ in range(3)] == [200, 503, 200]
    configure(base, {"failures": [{"probability": 1.0}]})
    r = _post(base)
    assert r.status_code == 500 and r.json()["error"]["code"] == "injected_failure"
    configure(base, {"failures": [{"probability": 1.0, "mode": "drop", "after_tokens": 2}]})
    res = stream(base)  # the server aborts mid-stream: the client sees 2 tokens and no [DONE]
    assert res["status"] == 200 and len(res["events"]) == 2 and res["error"]
    rec = record(base, res["headers"]["x-request-id"])
    assert rec["outcome"] == "dropped" and rec["tokens_sent"] == 2
    with pytest.raises(requests.ConnectionError):  # without streaming: the connection dies, no response
        _post(base)


def test_request_stalls_mid_stream_and_before_headers(agentrun: Any) -> None:
    base = agentrun(ttft=0.0, inter_token=0.01, output_tokens=4,
                    stalls=[{"requests": [1], "after_tokens": 2, "duration_s": 0.3},
                            {"requests": [2], "duration_s": 0.3}])  # fmt: skip
    res = stream(base)
    times = [t for t, _ in res["events"]]
    assert (times[2] - times[1]) / MS >= 300 and (times[1] - times[0]) / MS < 50
    assert record(base, res["headers"]["x-request-id"])["stall_ns"] == 300 * MS
    res = stream(base)
    assert (res["t_headers"] - res["t0"]) / MS >= 300


def test_stall_window_freezes_the_server(agentrun: Any) -> None:
    base = agentrun(ttft=0.0, inter_token=0.0, output_tokens=2)
    r = requests.post(base + "/-/stall", json={"duration_s": 0.4, "delay_s": 0.1}, timeout=5)
    assert r.status_code == 200
    window_end = r.json()["windows_ns"][0][1]
    assert _post(base).status_code == 200  # before the window: prompt
    time.sleep(0.15)
    t0 = time.perf_counter_ns()
    res = _post(base)
    assert time.perf_counter_ns() >= window_end and (time.perf_counter_ns() - t0) / MS >= 300
    rec = record(base, res.headers["x-request-id"])
    assert rec["held_ns"] > 250 * MS and rec["end_ns"] >= window_end
    bad = requests.post(base + "/-/stall", json={"duration": 1}, timeout=5)
    assert bad.status_code == 400 and "duration" in bad.json()["error"]["message"]


def test_client_disconnect_is_observed_and_recorded(agentrun: Any) -> None:
    base = agentrun(ttft=3.0, output_tokens=2)
    host, port = base.removeprefix("http://").split(":")
    body = json.dumps({**MSG, "stream": True}).encode()
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)  # fmt: skip
        time.sleep(0.2)
        t_close = time.perf_counter_ns()
    recs = []
    for _ in range(100):
        recs = requests.get(base + "/-/requests", timeout=5).json()["records"]
        if recs:
            break
        time.sleep(0.01)
    rec = recs[0]
    assert rec["outcome"] == "disconnected" and rec["tokens_sent"] == 0
    # observed while waiting for the first token (not 3 s later at the next write)
    assert 0 <= (rec["disconnect_ns"] - t_close) / MS < 100
    assert rec["disconnect_wall_ns"] is not None


def test_disconnect_mid_stream(agentrun: Any) -> None:
    base = agentrun(ttft=0.0, inter_token=0.2, output_tokens=10)

    async def go() -> str:
        async with aiohttp.ClientSession() as s:
            r = await s.post(base + CHAT, json={**MSG, "stream": True})
            await r.content.readline()
            rid = r.headers["x-request-id"]
            r.close()  # drop the connection after the first event
            return rid

    rid = asyncio.run(go())
    rec = record(base, rid, until="disconnected")
    assert 1 <= rec["tokens_sent"] < 10 and rec["disconnect_ns"] - rec["first_token_ns"] < 150 * MS


# ---------------------------------------------------------------------------------------------------------
# Auth and admin.


def test_bearer_auth(agentrun: Any) -> None:
    base = agentrun(api_key="sk-local", ttft=0, inter_token=0, output_tokens=1)
    r = _post(base)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert "didn't provide" in r.json()["error"]["message"]
    r = _post(base, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and "Incorrect" in r.json()["error"]["message"]
    assert _post(base, headers={"Authorization": "Bearer sk-local"}).status_code == 200
    outcomes = [x["outcome"] for x in requests.get(base + "/-/requests", timeout=5).json()["records"]]
    assert outcomes == ["unauthorized", "unauthorized", "ok"]


def test_admin_reconfigure_reset_and_paging(agentrun: Any, make_cloud: Any) -> None:
    base = agentrun(ttft=0, inter_token=0, output_tokens=2)
    assert len(stream(base)["events"]) == 4  # 2 tokens, finish, [DONE]
    r = configure(base, {"output_tokens": 5, "ttft": {"kind": "uniform", "low": 0, "high": 0.001}})
    assert r.status_code == 200 and r.json()["config"]["output_tokens"] == 5
    assert len(stream(base)["events"]) == 7
    bad = configure(base, {"inter_token": {"kind": "constant", "valeu": 1}})
    assert (
        bad.status_code == 400 and "agentrun.inter_token.valeu: unknown key" in bad.json()["error"]["message"]
    )
    assert requests.get(base + "/-/config", timeout=5).json()["config"]["output_tokens"] == 5  # unchanged
    page = requests.get(base + "/-/requests", params={"since": 1}, timeout=5).json()
    assert [x["seq"] for x in page["records"]] == [2] and page["next"] == 2
    r = requests.post(base + "/-/reset", json={"output_tokens": 1}, timeout=5)
    assert r.status_code == 200 and r.json()["raw"] == {"output_tokens": 1}
    assert requests.get(base + "/-/requests", timeout=5).json()["records"] == []
    res = stream(base)
    assert len(res["events"]) == 3
    rec = record(base, res["headers"]["x-request-id"])
    assert rec["seq"] == 3 and rec["index"] == 1  # paging stays monotonic; request numbers restart
    with pytest.raises(ConfigError, match="agentrun.bogus: unknown key"):
        make_cloud(services=["agentrun"], config={"agentrun": {"bogus": 1}})


# ---------------------------------------------------------------------------------------------------------
# Mock-tool server (seed protocol).


@pytest.fixture
def mock(make_cloud: Any) -> str:
    cloud = make_cloud(services=["mocktool"], config={"mocktool": {"token": "t0k"}})
    return cloud.endpoints["mocktool"]


def _m(
    base: str, method: str, path: str, corr: str | None = None, token: str | None = "t0k", **kw: Any
) -> Any:
    headers = {}
    if token is not None:
        headers["X-Clousight-Token"] = token
    if corr is not None:
        headers["X-Clousight-Correlation-Id"] = corr
    return requests.request(method, base + path, headers=headers, timeout=5, **kw)


def test_mocktool_token_protection(mock: str) -> None:
    assert _m(mock, "GET", "/health", token=None).json() == {"ok": True}  # reachability stays open
    for path in ("/prices", "/fault/state", "/-/calls"):
        r = _m(mock, "GET", path, token=None)
        assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    assert _m(mock, "POST", "/fault/config", token="nope", json={}).status_code == 401
    r = _m(mock, "GET", "/prices", params={"provider": "aliyun", "service": "oss"})
    assert r.status_code == 200 and [p["sku"] for p in r.json()["products"]] == ["standard"]
    assert _m(mock, "GET", "/fault/state").json()["call_counts"] == {"prices": 1}  # 401s are not counted


def test_mocktool_fault_per_correlation_and_counting(mock: str) -> None:
    r = _m(
        mock,
        "POST",
        "/fault/config",
        json={"target": "prices", "fail_on_calls": [1], "status": 500, "corr": "A"},
    )
    assert r.json()["ok"] is True
    a1, a2 = _m(mock, "GET", "/prices", corr="A"), _m(mock, "GET", "/prices", corr="A")
    assert a1.status_code == 500 and a1.json() == {"error": "injected_fault", "target": "prices", "call_index": 1,
                                                   "status": 500}  # fmt: skip
    assert a2.status_code == 200
    assert _m(mock, "GET", "/prices", corr="B").status_code == 200  # other correlation ids unaffected
    # retry_storm shape: a persistent window on another target, kept alongside the first rule
    _m(mock, "POST", "/fault/config", json={"target": "reports", "fail_from_call": 1, "fail_count": 999,
                                            "status": 503, "corr": "S"})  # fmt: skip
    assert [_m(mock, "POST", "/reports", corr="S", json={"x": 1}).status_code for _ in range(3)] == [503] * 3
    assert _m(mock, "GET", "/prices", corr="A").status_code == 200
    state = _m(mock, "GET", "/fault/state").json()
    assert state["call_counts"] == {"prices|A": 3, "prices|B": 1, "reports|S": 3}
    assert state["fault"]["corr"] == "S" and len(state["faults"]) == 2
    calls = _m(mock, "GET", "/-/calls").json()["calls"]
    assert [c["status"] for c in calls] == [500, 200, 200, 503, 503, 503, 200]
    # refused instead of silently injecting nothing (the seed's 2e7bfa8 bug)
    bad = _m(mock, "POST", "/fault/config", json={"fail_on_calls": [1]})
    assert bad.status_code == 400 and "target" in bad.json()["detail"]
    bad = _m(mock, "POST", "/fault/config", json={"target": "prices", "fail_on_call": [1]})
    assert bad.status_code == 400 and "fault.fail_on_call: unknown key" in bad.json()["detail"]
    assert _m(mock, "POST", "/fault/config", data=b"{x").json()["error"] == "invalid_json"
    assert _m(mock, "POST", "/reset").json() == {"ok": True}
    state = _m(mock, "GET", "/fault/state").json()
    assert state == {"call_counts": {}, "fault": None, "faults": []}


def test_mocktool_latency_per_correlation(mock: str) -> None:
    _m(
        mock,
        "POST",
        "/latency/config",
        json={"target": "reports", "add_ms": 250, "corr": "slow", "on_calls": [1]},
    )

    def timed(corr: str) -> float:
        t0 = time.perf_counter()
        assert _m(mock, "POST", "/reports", corr=corr, json={"r": corr}).status_code == 200
        return time.perf_counter() - t0

    assert timed("slow") >= 0.25
    assert timed("slow") < 0.1  # only call 1 of that correlation
    assert timed("fast") < 0.1
    _m(mock, "POST", "/latency/config", json={"target": "prices", "add_ms": 200})  # no corr: every caller
    t0 = time.perf_counter()
    _m(mock, "GET", "/prices", corr="whoever")
    assert time.perf_counter() - t0 >= 0.2
    lat = _m(mock, "GET", "/latency/state").json()
    assert lat["latency"] == {"target": "prices", "add_ms": 200} and len(lat["latencies"]) == 2
    assert lat["call_counts"]["reports|slow"] == 2
    assert len(_m(mock, "GET", "/reports").json()["reports"]) == 3
    assert _m(mock, "POST", "/latency/config", json={}).json()["ok"]  # {} clears
    assert _m(mock, "GET", "/latency/state").json()["latencies"] == []


def test_mocktool_config_is_validated(make_cloud: Any) -> None:
    with pytest.raises(ConfigError, match="mocktool.tokn: unknown key"):
        make_cloud(services=["mocktool"], config={"mocktool": {"tokn": "x"}})
    open_mock = make_cloud(services=["mocktool"]).endpoints["mocktool"]
    assert requests.get(open_mock + "/inventory", timeout=5).json()["resources"]  # no token configured: open


# ---------------------------------------------------------------------------------------------------------
# Target + mock together: the built-in benchmark agent runs the seed's tool plans (fault_recovery,
# retry_storm), so the probes that count attempts at the mock work end to end.


def test_agent_tool_plans_against_the_mock(make_cloud: Any) -> None:
    cloud = make_cloud(
        services=["agentrun", "mocktool"],
        config={
            "agentrun": {"ttft": 0, "inter_token": 0, "agent": {"backoff_ms": 10}},
            "mocktool": {"token": "t0k"},
        },
    )
    base, mock = cloud.endpoints["agentrun"], cloud.endpoints["mocktool"]

    def invoke(corr: str, target: str = "prices", url: str = mock, stream_it: bool = False) -> dict[str, Any]:
        plan = {
            "tool": {"target": target},
            "mock_base_url": url,
            "mock_token": "t0k",
            "_correlation_id": corr,
        }
        body = {"messages": [{"role": "user", "content": json.dumps(plan)}]}
        if stream_it:
            res = stream(base, body)
            return json.loads(json.loads(res["events"][0][1])["choices"][0]["delta"]["content"])
        return json.loads(_post(base, body).json()["choices"][0]["message"]["content"])

    # fault_recovery: the first call fails, the agent's retry succeeds
    _m(
        mock,
        "POST",
        "/fault/config",
        json={"target": "prices", "fail_on_calls": [1], "status": 500, "corr": "fr"},
    )
    assert invoke("fr", stream_it=True) == {"ok": True, "status": 200, "tool_target": "prices", "attempts": 2}
    # retry_storm: a persistent fault; the agent gives up after 1 + max_retries attempts
    _m(
        mock,
        "POST",
        "/fault/config",
        json={"target": "prices", "fail_from_call": 1, "fail_count": 999, "corr": "rs"},
    )
    assert invoke("rs") == {"ok": False, "status": 500, "tool_target": "prices", "attempts": 3}
    assert _m(mock, "GET", "/fault/state").json()["call_counts"] == {"prices|fr": 2, "prices|rs": 3}
    # never an SSRF relay: only loopback mock URLs are followed
    refused = invoke("x", url="http://100.100.100.200/latest")
    assert refused["ok"] is False and refused["attempts"] == 0 and "not allowed" in refused["error"]
    rec = requests.get(base + "/-/requests", timeout=5).json()["records"][0]
    assert rec["tool"]["attempts"] == 2 and rec["tokens_sent"] == 1
