"""fastsse: a raw asyncio.Protocol OpenAI-compatible SSE server, fast enough never to be the bottleneck.

The aiohttp target (`server.py`) models a platform; this one exists to measure the *measurer*. One process
answers tens of thousands of requests/s, so when a load generator on the other core saturates, it is the
generator. Every SSE event carries `srv_ns` = `time.monotonic_ns()` read just before its write — the same
CLOCK_MONOTONIC as `time.perf_counter_ns()` on Linux — so a same-host client computes its own observation
delay exactly (client stamp − srv_ns), and `GET /-/requests` returns per-request ground truth.

    POST /openai/v1/chat/completions   stream=true → headers + K chunks + usage chunk + [DONE]
                                       stream=false → chat.completion JSON (the path wrk hits)
        query overrides: ?events=K&ttft_ms=T&gap_ms=G (T = G = 0: the whole stream in one write)
        body `max_tokens` / `max_completion_tokens` also sets K
    GET  /-/requests?since=<seq>&limit=<n>   ground-truth records, completion order
    POST /-/stall {"seconds": 1, "delay_s": 0}   hold every response write inside the window
    GET  /-/clock, GET /health

    python -m csbench.localcloud.agentrun.fastsse --port 8080 [--cpu 1] [--workers 2] [--events 8]

With `--workers N` each worker process binds the same port with SO_REUSEPORT and keeps its own records and
stalls (use `--stall START:DURATION` for a schedule that holds in every worker).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

HOST = "127.0.0.1"
CHAT_PATH = b"/openai/v1/chat/completions"
MS = 1_000_000


@dataclass
class FastSSEConfig:
    events: int = 8  # content chunks per response (K)
    ttft_ms: float = 0.0  # first-event delay; 0 with gap_ms 0 → everything in one write
    gap_ms: float = 0.0  # inter-event gap, scheduled from absolute deadlines
    max_events: int = 4096
    records_capacity: int = 100_000
    max_body: int = 1 << 20
    max_header: int = 16 << 10
    # (start_s after server start, duration_s): every write planned inside is held to the window end
    stall_windows: list[tuple[float, float]] = field(default_factory=list)
    model: str = "fastsse"


@dataclass
class Record:
    seq: int
    request_id: str
    status: int
    stream: bool
    events: int
    arrival_ns: int  # when the request's last byte was read
    first_write_ns: int  # srv_ns of the first content event (non-streaming: the body write); 0 = none
    end_ns: int  # srv_ns of the final write
    planned_first_ns: int
    held_ns: int  # delay added by stall windows

    def as_dict(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        d["ttft_ns"] = self.first_write_ns - self.arrival_ns if self.first_write_ns else None
        return d


class _State:
    """What all connections of one server process share: config, records, stall windows."""

    def __init__(self, config: FastSSEConfig) -> None:
        self.config = config
        self.epoch_ns = time.monotonic_ns()
        self.records: collections.deque[Record] = collections.deque(maxlen=config.records_capacity)
        self.seq = 0
        self.requests = 0
        self.stalls: list[tuple[int, int]] = [
            (self.epoch_ns + int(s * 1e9), self.epoch_ns + int((s + d) * 1e9)) for s, d in config.stall_windows]

    def add_stall(self, seconds: float, delay_s: float = 0.0) -> tuple[int, int]:
        start = time.monotonic_ns() + int(delay_s * 1e9)
        window = (start, start + int(seconds * 1e9))
        self.stalls.append(window)
        return window

    def held_until(self, t_ns: int) -> int:
        """End of the stall covering t_ns (chained if windows overlap), or 0 when t_ns is free."""
        if not self.stalls:
            return 0
        self.stalls = [w for w in self.stalls if w[1] > t_ns - 60_000 * MS]  # keep recent ones for late timers
        end = 0
        t = t_ns
        changed = True
        while changed:
            changed = False
            for start, stop in self.stalls:
                if start <= t < stop:
                    t = end = stop
                    changed = True
        return end

    def record(self, rec: Record) -> None:
        self.seq += 1
        rec.seq = self.seq
        self.records.append(rec)

    def records_since(self, since: int, limit: int) -> dict[str, Any]:
        out: list[dict[str, Any]] = []
        if self.records:
            first = self.records[0].seq
            start = max(0, since - first + 1)
            for i in range(start, min(len(self.records), start + limit)):
                out.append(self.records[i].as_dict())
        return {"records": out, "next": out[-1]["seq"] if out else since, "last_seq": self.seq,
                "oldest_seq": self.records[0].seq if self.records else None}


class HTTPError(Exception):
    def __init__(self, status: int, message: str, *, close: bool = False, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.close, self.param = status, message, close, param


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 411: "Length Required",
            413: "Payload Too Large", 431: "Request Header Fields Too Large", 500: "Internal Server Error"}


@functools.lru_cache(maxsize=8192)
def _event_body(i: int, last: bool) -> bytes:
    """The choices part of content chunk i (cached: it is the same in every response)."""
    return b'[{"index":0,"delta":{%s"content":"tok%d "},"finish_reason":%s}],' % (
        b'"role":"assistant",' if i == 0 else b"", i, b'"stop"' if last else b"null")


@functools.lru_cache(maxsize=256)
def _content(events: int) -> bytes:
    return b" ".join(b"tok%d" % i for i in range(events))


_SAFE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class _Conn(asyncio.Protocol):
    """One HTTP/1.1 connection. Requests are answered strictly in order: while a response is still being
    sent (timed stream or stall), further pipelined bytes wait in the buffer."""

    def __init__(self, state: _State) -> None:
        self.state = state
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.busy = False  # a response is in progress; parsing resumes when it ends
        self.parsing = False
        self.paused = False
        self.eof = False
        self.closing = False
        self.timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport is no asyncio.Transport
        sock = transport.get_extra_info("socket")
        if sock is not None:  # small SSE writes must leave now, not wait for an ACK (Nagle)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if self.timer is not None:
            self.timer.cancel()
        self.transport = None

    def eof_received(self) -> bool:
        # A half-closed client (shutdown(SHUT_WR)) still gets the responses it asked for; close after them.
        self.eof = True
        if not self.busy:
            self._close()
        return True

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self._process()
        if self.busy and not self.paused and len(self.buf) > self.state.config.max_header and self.transport:
            self.paused = True  # a pipelining client far ahead of us: stop reading rather than buffer
            self.transport.pause_reading()

    # -- parsing -----------------------------------------------------------------------------------------
    def _process(self) -> None:
        self.parsing = True  # responses completing synchronously return here instead of recursing
        try:
            while not self.busy and not self.closing and self.buf:
                if not self._one_request():
                    break
        except HTTPError as e:
            self._error(e)
        except Exception as e:  # a bug answers 500 and closes this connection; the server keeps serving
            self._error(HTTPError(500, f"internal error: {e!r}", close=True))
        finally:
            self.parsing = False
        if self.paused and not self.busy and self.transport is not None and not self.closing:
            self.paused = False
            self.transport.resume_reading()

    def _one_request(self) -> bool:
        """Parse and dispatch one request from the buffer; False when more bytes are needed."""
        cfg = self.state.config
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buf) > cfg.max_header:
                raise HTTPError(431, "request header block too large", close=True)
            return False
        if end > cfg.max_header:
            raise HTTPError(431, "request header block too large", close=True)
        head = bytes(self.buf[:end]).split(b"\r\n")
        parts = head[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            raise HTTPError(400, "malformed request line", close=True)
        method, target, version = parts
        headers: dict[bytes, bytes] = {}
        for line in head[1:]:
            name, sep, value = line.partition(b":")
            if not sep or not name or name != name.strip():
                raise HTTPError(400, "malformed header line", close=True)
            name = name.lower()
            value = value.strip()
            if name in headers and name == b"content-length" and headers[name] != value:
                raise HTTPError(400, "conflicting content-length", close=True)
            headers[name] = value
        if b"transfer-encoding" in headers:
            raise HTTPError(411, "chunked request bodies are not supported; send content-length", close=True)
        cl = headers.get(b"content-length", b"0")
        if not cl.isdigit():
            raise HTTPError(400, "invalid content-length", close=True)
        length = int(cl)
        if length > cfg.max_body:
            raise HTTPError(413, f"body larger than {cfg.max_body} bytes", close=True)
        total = end + 4 + length
        if len(self.buf) < total:
            if headers.get(b"expect", b"").lower() == b"100-continue" and len(self.buf) == end + 4:
                self._write(b"HTTP/1.1 100 Continue\r\n\r\n")
            return False
        body = bytes(self.buf[end + 4:total])
        del self.buf[:total]
        conn = headers.get(b"connection", b"").lower()
        keep = conn != b"close" if version == b"HTTP/1.1" else conn == b"keep-alive"
        self._dispatch(method, target, headers, body, keep)
        return True

    # -- routing -------------------------------------------------------------------------------------------
    def _dispatch(self, method: bytes, target: bytes, headers: dict[bytes, bytes], body: bytes,
                  keep: bool) -> None:
        arrival = time.monotonic_ns()
        path, _, query = target.partition(b"?")
        try:
            if path == CHAT_PATH:
                if method != b"POST":
                    raise HTTPError(405, "use POST")
                self._chat(query, headers, body, keep, arrival)
            elif path == b"/-/requests" and method == b"GET":
                q = dict(parse_qsl(query.decode("latin-1")))
                try:
                    since, limit = int(q.get("since", 0)), int(q.get("limit", 100_000))
                except ValueError:
                    raise HTTPError(400, "since and limit must be integers", param="since") from None
                self._json(200, self.state.records_since(since, max(1, limit)), keep)
            elif path == b"/-/stall" and method == b"POST":
                try:
                    req = json.loads(body or b"{}")
                    seconds = float(req.get("seconds", req.get("duration_s", 1.0)))
                    delay = float(req.get("delay_s", 0.0))
                except (ValueError, TypeError, AttributeError):
                    raise HTTPError(400, 'body must be {"seconds": <number>, "delay_s": <number>}') from None
                if not 0 <= seconds <= 3600 or not 0 <= delay <= 3600:
                    raise HTTPError(400, "seconds and delay_s must be within 0..3600", param="seconds")
                start, stop = self.state.add_stall(seconds, delay)
                self._json(200, {"start_ns": start, "end_ns": stop}, keep)
            elif path == b"/-/clock" and method == b"GET":
                self._json(200, {"monotonic_ns": time.monotonic_ns(), "wall_ns": time.time_ns()}, keep)
            elif path == b"/health" and method == b"GET":
                self._json(200, {"ok": True, "requests": self.state.requests}, keep)
            elif path in (b"/-/requests", b"/-/stall", b"/-/clock", b"/health"):
                raise HTTPError(405, "method not allowed")
            else:
                raise HTTPError(404, f"no route {path.decode('latin-1')!r}")
        except HTTPError as e:
            e.close = e.close or not keep
            if path == CHAT_PATH:
                self._record(headers, e.status, False, 0, arrival, 0, time.monotonic_ns(), 0, 0)
            self._error(e)

    def _chat(self, query: bytes, headers: dict[bytes, bytes], body: bytes, keep: bool, arrival: int) -> None:
        st = self.state
        cfg = st.config
        st.requests += 1
        try:
            req = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise HTTPError(400, "body is not valid JSON") from None
        if not isinstance(req, dict):
            raise HTTPError(400, "body must be a JSON object")
        messages = req.get("messages")
        if not isinstance(messages, list) or not messages:
            raise HTTPError(400, "messages must be a non-empty array", param="messages")
        stream = req.get("stream", False)
        if not isinstance(stream, bool):
            raise HTTPError(400, "stream must be a boolean", param="stream")
        events, ttft_ms, gap_ms = cfg.events, cfg.ttft_ms, cfg.gap_ms
        mt = req.get("max_completion_tokens", req.get("max_tokens"))
        if mt is not None:
            if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
                raise HTTPError(400, "max_tokens must be a positive integer", param="max_tokens")
            events = mt
        if query:
            try:
                q = dict(parse_qsl(query.decode("latin-1")))
                events = int(q.get("events", events))
                ttft_ms = float(q.get("ttft_ms", ttft_ms))
                gap_ms = float(q.get("gap_ms", gap_ms))
            except ValueError:
                raise HTTPError(400, "events, ttft_ms, gap_ms must be numbers") from None
        if not 1 <= events <= cfg.max_events or ttft_ms < 0 or gap_ms < 0 or ttft_ms > 3.6e6 or gap_ms > 3.6e6:
            raise HTTPError(400, f"events must be 1..{cfg.max_events}; ttft_ms, gap_ms 0..3.6e6")
        prompt = sum(len(m.get("content") or "") if isinstance(m, dict) and isinstance(m.get("content"), str)
                     else 1 for m in messages) // 4 + 1
        rid = headers.get(b"x-request-id", b"").decode("latin-1")
        if not _SAFE_ID.fullmatch(rid):  # it is echoed inside JSON and headers: only plain ids
            rid = str(st.requests)
        resp = _Response(self, rid, stream, events, prompt, keep, arrival,
                         arrival + int(ttft_ms * MS), int(gap_ms * MS))
        resp.start()

    # -- writing -------------------------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def _json(self, status: int, obj: Any, keep: bool, extra: bytes = b"") -> None:
        body = json.dumps(obj, separators=(",", ":")).encode()
        self._write(b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s%s\r\n%s" % (
            status, _REASONS.get(status, "Error").encode(), len(body), extra,
            b"" if keep else b"Connection: close\r\n", body))
        if not keep:
            self._close()

    def _error(self, e: HTTPError) -> None:
        etype = "invalid_request_error" if e.status < 500 else "server_error"
        self._json(e.status, {"error": {"message": e.message, "type": etype, "param": e.param,
                                        "code": None}}, not e.close)

    def _close(self) -> None:
        self.closing = True
        self.buf.clear()
        if self.transport is not None:
            self.transport.close()

    def _record(self, headers: dict[bytes, bytes], status: int, stream: bool, events: int, arrival: int,
                first: int, end: int, planned: int, held: int) -> None:
        rid = headers.get(b"x-request-id", b"").decode("latin-1")[:128]
        self.state.record(Record(0, rid, status, stream, events, arrival, first, end, planned, held))

    def done(self, rec: Record, keep: bool) -> None:
        """A response finished: record it, then continue with pipelined requests (or close)."""
        self.state.record(rec)
        self.busy = False
        self.timer = None
        if not keep:
            self._close()
        elif not self.parsing and not self.closing:
            self._process()  # finished asynchronously (timed stream, stall): serve what was pipelined
            if self.eof and not self.busy:
                self._close()


class _Response:
    """One chat response: a single write when nothing is delayed, otherwise writes at absolute deadlines
    (`loop.call_at`); anything due by the time the loop wakes up (a late timer, the end of a stall) goes
    out in one write. Writes are never early."""

    def __init__(self, conn: _Conn, rid: str, stream: bool, events: int, prompt: int, keep: bool,
                 arrival: int, first_ns: int, gap_ns: int) -> None:
        self.conn, self.rid, self.stream, self.events = conn, rid, stream, events
        self.prompt, self.keep, self.arrival = prompt, keep, arrival
        self.first_ns, self.gap_ns = first_ns, gap_ns
        self.sent = 0  # content events written
        self.headers_sent = False
        self.first_write = 0
        self.held = 0  # total ns added by stall windows
        self.held_from = 0
        self.cid = b"chatcmpl-" + rid.encode()
        self.created = int(time.time())
        # the part of every chunk that does not change within a response, rendered once
        self.prefix = b'data: {"id":"%s","object":"chat.completion.chunk","created":%d,"model":"%s","choices":' % (
            self.cid, self.created, conn.state.config.model.encode())

    def deadline(self) -> int:
        """When the next write is due: headers now, then event `sent` (non-streaming: the last event's)."""
        if not self.stream:
            return self.first_ns + (self.events - 1) * self.gap_ns
        if not self.headers_sent:
            return self.arrival
        return self.first_ns + self.sent * self.gap_ns

    def start(self) -> None:
        self.conn.busy = True
        self.step()

    def step(self) -> None:
        conn = self.conn
        if conn.closing or conn.transport is None:
            return  # client went away: drop the rest silently, like a server whose write would fail
        now = time.monotonic_ns()
        due = self.deadline()
        hold = conn.state.held_until(max(now, due))
        if due > now or hold:
            if hold and not self.held_from:
                self.held_from = max(now, due)
            conn.timer = conn.loop.call_at(conn.loop.time() + (max(due, hold) - now) / 1e9, self._on_timer)
            return
        if self.held_from:
            self.held += now - self.held_from
            self.held_from = 0
        if not self.stream:
            self._write_completion()
            return
        out = []
        if not self.headers_sent:
            self.headers_sent = True
            out.append(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                       b"Transfer-Encoding: chunked\r\nx-request-id: %s\r\n%s\r\n" % (
                           self.rid.encode(), b"" if self.keep else b"Connection: close\r\n"))
        # every event now due (for the one-write case: all of them), stamped just before the write
        srv_ns = time.monotonic_ns()
        n_due = self.events - self.sent
        if self.gap_ns and self.first_ns <= now:
            n_due = min(n_due, (now - self.first_ns) // self.gap_ns + 1 - self.sent)
        elif self.first_ns > now:
            n_due = 0
        payload: list[bytes] = []
        if n_due:
            stamp = b'"srv_ns":%d}\n\n' % srv_ns
            for i in range(self.sent, self.sent + n_due):
                payload += (self.prefix, _event_body(i, i == self.events - 1), stamp)
            self.sent += n_due
            if not self.first_write:
                self.first_write = srv_ns
        finished = self.sent == self.events
        if finished:
            payload += (self.prefix, b'[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d},'
                        b'"srv_ns":%d}\n\ndata: [DONE]\n\n' % (self.prompt, self.events,
                                                               self.prompt + self.events, srv_ns))
        if payload:
            out.append(_chunk(b"".join(payload)))
        if finished:
            out.append(b"0\r\n\r\n")
        conn._write(b"".join(out))
        if finished:
            conn.done(Record(0, self.rid, 200, True, self.events, self.arrival, self.first_write, srv_ns,
                             self.first_ns, self.held), self.keep)
        else:
            self.step()  # schedules the next deadline

    def _on_timer(self) -> None:
        try:
            self.step()
        except Exception:  # a bug must not leave the client hanging on a busy connection: drop it
            self.conn._close()

    def _write_completion(self) -> None:
        conn = self.conn
        srv_ns = time.monotonic_ns()
        body = (b'{"id":"%s","object":"chat.completion","created":%d,"model":"%s","choices":[{"index":0,"message":'
                b'{"role":"assistant","content":"%s"},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,'
                b'"completion_tokens":%d,"total_tokens":%d},"srv_ns":%d}' % (
                    self.cid, self.created, conn.state.config.model.encode(), _content(self.events), self.prompt,
                    self.events, self.prompt + self.events, srv_ns))
        conn._write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                    b"x-request-id: %s\r\n%s\r\n%s" % (len(body), self.rid.encode(),
                                                       b"" if self.keep else b"Connection: close\r\n", body))
        conn.done(Record(0, self.rid, 200, False, self.events, self.arrival, srv_ns, srv_ns,
                         self.first_ns, self.held), self.keep)


# -- running it -------------------------------------------------------------------------------------------

def _listen_socket(host: str, port: int, reuse_port: bool) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(4096)
    sock.setblocking(False)
    return sock


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (lower per-write cost and wake-up lag), else the default loop."""
    try:
        import uvloop

        return uvloop.new_event_loop()  # type: ignore[no-any-return,unused-ignore]
    except ImportError:
        return asyncio.new_event_loop()


async def start_server(config: FastSSEConfig, sock: socket.socket) -> tuple[asyncio.Server, _State]:
    state = _State(config)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Conn(state), sock=sock)
    return server, state


class FastSSEThread:
    """In-process server on its own thread and loop (tests). `.url`, `.state` (read only after stop or
    through HTTP: it belongs to the server thread)."""

    def __init__(self, config: FastSSEConfig | None = None, *, port: int = 0) -> None:
        self.config = config or FastSSEConfig()
        self.port = port
        self.url = ""
        self.state: _State | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> FastSSEThread:
        ready = threading.Event()
        sock = _listen_socket(HOST, self.port, False)
        self.port = sock.getsockname()[1]
        self.url = f"http://{HOST}:{self.port}"

        def run() -> None:
            loop = self._loop = new_event_loop()
            asyncio.set_event_loop(loop)
            server, self.state = loop.run_until_complete(start_server(self.config, sock))
            ready.set()
            try:
                loop.run_forever()
            finally:
                server.close()
                loop.run_until_complete(server.wait_closed())
                loop.close()

        self._thread = threading.Thread(target=run, name="fastsse", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fastsse did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> FastSSEThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class FastSSEProcess:
    """The server in a child interpreter (its own GIL), optionally pinned to `cpu` — how benches run it,
    so the generator's core and the server's core never compete."""

    def __init__(self, config: FastSSEConfig | None = None, *, cpu: int | None = None, workers: int = 1,
                 port: int = 0) -> None:
        self.config = config or FastSSEConfig()
        self.cpu, self.workers, self.port = cpu, workers, port
        self.url = ""
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> FastSSEProcess:
        cfg = self.config
        cmd = [sys.executable, "-m", "csbench.localcloud.agentrun.fastsse", "--port", str(self.port),
               "--workers", str(self.workers), "--events", str(cfg.events), "--ttft-ms", str(cfg.ttft_ms),
               "--gap-ms", str(cfg.gap_ms), "--records", str(cfg.records_capacity)]
        if self.cpu is not None:
            cmd += ["--cpu", str(self.cpu)]
        for start, duration in cfg.stall_windows:
            cmd += ["--stall", f"{start}:{duration}"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONSAFEPATH": "1"})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if len(line) != 2 or line[0] != "listening":
            self.stop()
            raise RuntimeError(f"fastsse did not start: {line!r}")
        self.url = line[1]
        self.port = int(self.url.rsplit(":", 1)[1])
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def cpu_seconds(self) -> float:
        """User + system CPU of the server process so far (Linux /proc)."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def __enter__(self) -> FastSSEProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _serve_forever(config: FastSSEConfig, sock: socket.socket) -> None:
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(start_server(config, sock))
    try:
        loop.run_forever()
    except KeyboardInterrupt:
        pass


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--host", default=HOST)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--workers", type=int, default=1, help="processes sharing the port via SO_REUSEPORT")
    p.add_argument("--cpu", type=int, action="append", help="pin to this core (repeat: one per worker)")
    p.add_argument("--events", type=int, default=8)
    p.add_argument("--ttft-ms", type=float, default=0.0)
    p.add_argument("--gap-ms", type=float, default=0.0)
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--stall", action="append", default=[], metavar="START_S:DURATION_S")
    a = p.parse_args(argv)
    stalls = [(float(s.split(":")[0]), float(s.split(":")[1])) for s in a.stall]
    config = FastSSEConfig(events=a.events, ttft_ms=a.ttft_ms, gap_ms=a.gap_ms, records_capacity=a.records,
                           stall_windows=stalls)
    sock = _listen_socket(a.host, a.port, a.workers > 1)
    port = sock.getsockname()[1]
    print(f"listening http://{a.host}:{port}", flush=True)
    if a.workers <= 1:
        if a.cpu and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {a.cpu[0]})
        _serve_forever(config, sock)
        return
    # N workers: each binds its own SO_REUSEPORT socket (the kernel spreads connections); this parent only
    # supervises, so terminating it (FastSSEProcess.stop) takes the workers down with it.
    children = []
    for i in range(a.workers):
        pid = os.fork()
        if pid == 0:
            _die_with_parent()
            if a.cpu and hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(0, {a.cpu[i % len(a.cpu)]})
            if i > 0:  # worker 0 keeps the first socket: connections already queued there are not lost
                sock.close()
                sock = _listen_socket(a.host, port, True)
            _serve_forever(config, sock)
            os._exit(0)
        children.append(pid)
    sock.close()

    def stop(signum: int, frame: object) -> None:
        for pid in children:
            os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for pid in children:
        os.waitpid(pid, 0)


def _die_with_parent() -> None:
    """Linux PR_SET_PDEATHSIG: a worker gets SIGTERM when its supervisor dies, even by SIGKILL."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass

if __name__ == "__main__":
    main()
