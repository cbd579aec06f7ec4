"""fastsse: the raw-protocol SSE server the measurement benches use as ground truth."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator

import pytest

from csbench.localcloud.agentrun.fastsse import FastSSEConfig, FastSSEProcess, FastSSEThread

PATH = "/openai/v1/chat/completions"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture
def server() -> Iterator[FastSSEThread]:
    with FastSSEThread(FastSSEConfig(events=4)) as s:
        yield s


def _conn(s: FastSSEThread | FastSSEProcess) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", int(s.url.rsplit(":", 1)[1]), timeout=5)


def _post(c: http.client.HTTPConnection, body: object, path: str = PATH,
          headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    c.request("POST", path, raw, {"Content-Type": "application/json", **(headers or {})})
    return c.getresponse()


def _events(raw: bytes) -> list[str]:
    """SSE framing: events end with a blank line; keep the `data:` payloads."""
    text = raw.decode()
    assert text.endswith("\n\n")
    out = []
    for block in text.split("\n\n")[:-1]:
        lines = block.split("\n")
        assert all(line.startswith("data: ") for line in lines), block
        out.append("\n".join(line[6:] for line in lines))
    return out


def _records(c: http.client.HTTPConnection, since: int = 0) -> list[dict]:
    c.request("GET", f"/-/requests?since={since}")
    r = c.getresponse()
    assert r.status == 200
    return json.loads(r.read())["records"]


def test_streaming_format(server: FastSSEThread) -> None:
    c = _conn(server)
    t0 = time.monotonic_ns()
    r = _post(c, {**BODY, "stream": True}, headers={"x-request-id": "abc"})
    assert r.status == 200 and r.getheader("content-type") == "text/event-stream"
    assert r.getheader("transfer-encoding") == "chunked" and r.getheader("x-request-id") == "abc"
    events = _events(r.read())
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    content, usage = chunks[:-1], chunks[-1]
    assert len(content) == 4
    assert all(ch["object"] == "chat.completion.chunk" and ch["id"] == "chatcmpl-abc" for ch in chunks)
    assert content[0]["choices"][0]["delta"]["role"] == "assistant"
    assert [ch["choices"][0]["finish_reason"] for ch in content] == [None, None, None, "stop"]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 4
    assert usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + 4
    stamps = [ch["srv_ns"] for ch in chunks]
    assert t0 < stamps[0] <= time.monotonic_ns() and stamps == sorted(stamps)


def test_non_streaming_json_and_keep_alive(server: FastSSEThread) -> None:
    c = _conn(server)
    for i in range(3):  # one connection, three requests
        r = _post(c, {**BODY, "max_tokens": 2 + i})
        assert r.status == 200 and r.getheader("connection") is None
        doc = json.loads(r.read())
        assert doc["object"] == "chat.completion"
        assert doc["choices"][0]["message"]["content"] == " ".join(f"tok{k}" for k in range(2 + i))
        assert doc["usage"]["completion_tokens"] == 2 + i and doc["srv_ns"] > 0
    assert c.sock is not None  # never reconnected
    recs = _records(c)
    assert [r["events"] for r in recs] == [2, 3, 4]
    assert all(r["arrival_ns"] <= r["first_write_ns"] <= r["end_ns"] for r in recs)
    assert _records(c, since=recs[1]["seq"])[0]["seq"] == recs[2]["seq"]


def test_pipelined_and_partial_bytes(server: FastSSEThread) -> None:
    body = json.dumps({**BODY, "stream": True}).encode()
    one = b"POST %s?ttft_ms=5 HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (PATH.encode(), len(body), body)
    last = one.replace(b"Host: x", b"Host: x\r\nConnection: close")
    wire = one * 2 + last
    s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    for i in range(0, len(wire), 7):  # dribble the three requests across many small segments
        s.sendall(wire[i:i + 7])
        time.sleep(0.0005)
    data = b""
    while chunk := s.recv(65536):  # the server closes after the third (Connection: close)
        data += chunk
    assert data.count(b"HTTP/1.1 200 OK") == 3 and data.count(b"data: [DONE]") == 3
    assert data.endswith(b"0\r\n\r\n")
    # responses in request order: the stream of request k completes before headers of request k+1
    first_end = data.index(b"0\r\n\r\n")
    assert first_end < data.index(b"HTTP/1.1", 10)


@pytest.mark.parametrize("wire, status", [
    (b"GARBAGE\r\n\r\n", 400),
    (b"POST %s HTTP/1.1\r\nContent-Length: abc\r\n\r\n" % PATH.encode(), 400),
    (b"POST %s HTTP/1.1\r\nContent-Length: 5\r\n\r\n{bad}" % PATH.encode(), 400),
    (b"POST %s HTTP/1.1\r\nContent-Length: 2\r\n\r\n[]" % PATH.encode(), 400),
    (b"POST %s HTTP/1.1\r\nContent-Length: 14\r\n\r\n{\"messages\":1}" % PATH.encode(), 400),
    (b"POST %s HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n" % PATH.encode(), 413),
    (b"GET %s HTTP/1.1\r\n\r\n" % PATH.encode(), 405),
    (b"GET /nope HTTP/1.1\r\n\r\n", 404),
    (b"POST %s HTTP/1.1\r\nX: " % PATH.encode() + b"a" * 20000 + b"\r\n\r\n", 431),
])
def test_bad_input_answers_json_error(server: FastSSEThread, wire: bytes, status: int) -> None:
    s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    s.sendall(wire)
    s.shutdown(socket.SHUT_WR)
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), head
    assert json.loads(body)["error"]["type"] == "invalid_request_error"
    # and the server still serves
    assert _post(_conn(server), BODY).status == 200


def test_stall_window_holds_responses(server: FastSSEThread) -> None:
    c = _conn(server)
    r = _post(c, {"seconds": 0.3}, path="/-/stall")
    window = json.loads(r.read())
    t0 = time.monotonic_ns()
    r = _post(c, {**BODY, "stream": True})
    assert r.status == 200
    events = _events(r.read())
    assert time.monotonic_ns() >= window["end_ns"] > t0
    assert json.loads(events[0])["srv_ns"] >= window["end_ns"]
    rec = _records(c)[-1]
    assert rec["held_ns"] > 0.2e9 and rec["first_write_ns"] >= window["end_ns"]
    t1 = time.monotonic()
    _post(c, BODY).read()  # after the window: immediate again
    assert time.monotonic() - t1 < 0.1
    assert _post(c, {"seconds": "x"}, path="/-/stall").status == 400


def test_timed_stream_follows_deadlines(server: FastSSEThread) -> None:
    c = _conn(server)
    r = _post(c, {**BODY, "stream": True}, path=PATH + "?events=5&ttft_ms=30&gap_ms=10")
    stamps = [json.loads(e)["srv_ns"] for e in _events(r.read())[:-1]]
    rec = _records(c)[-1]
    ttft = rec["first_write_ns"] - rec["arrival_ns"]
    assert 30e6 <= ttft < 60e6  # never early; a loaded CI box may be late
    # every event at or after its absolute deadline (late ones may share a write, never early)
    assert all(stamps[i] - rec["arrival_ns"] >= 30e6 + i * 10e6 for i in range(5))
    assert stamps == sorted(stamps) and stamps[-1] == rec["end_ns"]


def test_subprocess_pinned() -> None:
    with FastSSEProcess(FastSSEConfig(events=2), cpu=0, workers=2) as p:
        for _ in range(4):
            c = _conn(p)
            assert json.loads(_post(c, BODY).read())["usage"]["completion_tokens"] == 2
            c.close()
        assert p.cpu_seconds() >= 0
