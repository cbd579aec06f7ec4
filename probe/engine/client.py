"""Execute one request with aiohttp and write every timestamp into a Records row.

Timing rules (docs/measurement.md "Timestamps"): `perf_counter_ns()` everywhere; the arrival time of a
body chunk is read right after `iter_any()` returns and before any parsing, and is shared by every SSE
event that chunk completed.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from types import SimpleNamespace
from typing import Any

import aiohttp

from csbench.probe.engine.records import ERROR_CODE, Records
from csbench.probe.engine.requests import PreparedRequest
from csbench.probe.engine.sse import (
    K_CONTENT,
    K_DONE,
    K_ERROR,
    K_TOKEN,
    SseFramer,
    classify_block_generic,
    classify_block_openai,
    parse_block,
)

now_ns = time.perf_counter_ns


@dataclass(frozen=True)
class Timeouts:
    connect_s: float = 10.0  # TCP (+TLS) connect
    ttft_s: float = 60.0  # send → first token (first body byte for non-streaming)
    idle_s: float = 60.0  # longest silence between two reads (also while waiting for headers)
    total_s: float = 300.0  # send → end

    def client_timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(
            total=self.total_s, sock_connect=self.connect_s, connect=None, sock_read=self.idle_s
        )


def parse_retry_after(value: str | None, now_wall: datetime | None = None) -> float | None:
    """Retry-After in seconds: delta-seconds ("3", "1.5") or an HTTP-date (RFC 9110 §10.2.3). None if absent
    or unparseable; a date in the past gives 0."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    now_wall = now_wall or datetime.now(timezone.utc)
    return max(0.0, (when - now_wall).total_seconds())


def status_error(status: int) -> str | None:
    """Error class of an HTTP status; None for success (2xx/3xx)."""
    if status == 429:
        return "http_429"
    if 400 <= status < 500:
        return "http_4xx"
    if status >= 500:
        return "http_5xx"
    return None


# aiohttp ≥ 3.10 tells connect and read timeouts apart; older versions raise ServerTimeoutError for both.
_CONNECT_TIMEOUT: Any = getattr(aiohttp, "ConnectionTimeoutError", ())
_READ_TIMEOUT: Any = getattr(aiohttp, "SocketTimeoutError", aiohttp.ServerTimeoutError)


def exception_error(exc: BaseException) -> str:
    """Error class of an exception raised while a request was in flight."""
    # Order matters: the aiohttp timeout errors are subclasses of asyncio.TimeoutError.
    if isinstance(exc, _CONNECT_TIMEOUT):
        return "connect_timeout"
    if isinstance(exc, _READ_TIMEOUT):
        return "idle_timeout"
    if isinstance(exc, asyncio.TimeoutError):
        return "total_timeout"
    if isinstance(exc, aiohttp.ClientError | ConnectionError | OSError):
        return "transport"
    if isinstance(exc, ValueError | KeyError | UnicodeDecodeError):
        return "protocol"
    return "client"


def make_trace_config(records: Records) -> aiohttp.TraceConfig:
    """Optional connection tracing (conn_reused). Costs ~10 % CPU at 1k streaming req/s, hence opt-in."""
    tc = aiohttp.TraceConfig()
    reused = records.cols  # resolved at call time: Records may grow (new arrays)

    async def on_create(session: Any, ctx: SimpleNamespace, params: Any) -> None:
        i = (ctx.trace_request_ctx or {}).get("i")
        if i is not None:
            reused["conn_reused"][i] = 0

    async def on_reuse(session: Any, ctx: SimpleNamespace, params: Any) -> None:
        i = (ctx.trace_request_ctx or {}).get("i")
        if i is not None:
            reused["conn_reused"][i] = 1

    tc.on_connection_create_end.append(on_create)
    tc.on_connection_reuseconn.append(on_reuse)
    return tc


class _TtftWatchdog:
    """Cancels the running request task when no token arrived in time; `fired` tells our cancel apart."""

    __slots__ = ("fired", "handle", "task")

    def __init__(self, seconds: float) -> None:
        self.fired = False
        self.task = asyncio.current_task()
        self.handle = asyncio.get_running_loop().call_later(seconds, self._fire)

    def _fire(self) -> None:
        self.fired = True
        if self.task is not None:
            self.task.cancel()

    def done(self) -> None:
        self.handle.cancel()


async def execute(
    http: aiohttp.ClientSession,
    req: PreparedRequest,
    rec: Records,
    i: int,
    timeouts: Timeouts,
    trace: bool = False,
) -> None:
    """Send `req`, fill row `i` of `rec` (t_intended/t_dispatch are set by the caller). Never raises except
    for an external cancellation: every failure becomes an error class on the row."""
    c = rec.cols
    classify = classify_block_openai if req.openai else classify_block_generic
    watchdog = _TtftWatchdog(timeouts.ttft_s)
    t_first_token = t_last_token = t_end = 0
    n_events = n_token = max_gap = bytes_in = 0
    usage_tokens: int | None = None
    finished = False
    err: str | None = None
    detail: str | None = None
    kw: dict[str, Any] = {"trace_request_ctx": {"i": i}} if trace else {}
    try:
        c["t_send"][i] = now_ns()
        async with http.request(req.method, req.url, data=req.body, headers=req.headers, **kw) as resp:
            t = now_ns()
            c["t_resp_headers"][i] = t
            c["status"][i] = resp.status
            rec.server_id[i] = resp.headers.get("x-request-id")
            err = status_error(resp.status)
            if err is not None or not req.stream:
                watchdog.done()  # no tokens to wait for: the idle and total timeouts bound the rest
            if err is not None:
                if err == "http_429":
                    ra = parse_retry_after(resp.headers.get("Retry-After"))
                    c["retry_after_ms"][i] = -1 if ra is None else round(ra * 1000)
                body = await resp.content.read(2048)
                detail = f"HTTP {resp.status}: {body[:200].decode('utf-8', errors='replace')}"
                t_end = now_ns()
            elif not req.stream:
                async for chunk in resp.content.iter_any():
                    t = now_ns()
                    if not bytes_in:
                        c["t_first_byte"][i] = t
                    bytes_in += len(chunk)
                t_end = now_ns()
                finished = True
            else:
                framer = SseFramer()
                t_first_event = t_first_content = 0
                async for chunk in resp.content.iter_any():
                    t = now_ns()  # arrival time: before any parsing
                    if not bytes_in:
                        c["t_first_byte"][i] = t
                    bytes_in += len(chunk)
                    if finished:
                        continue  # drain to EOF after [DONE] so the connection can be reused
                    for block in framer.blocks(chunk):
                        n_events += 1
                        if not t_first_event:
                            t_first_event = t
                        kind, tokens = classify(block)
                        if tokens is not None:
                            usage_tokens = tokens
                        if kind >= K_TOKEN and kind <= K_CONTENT:
                            n_token += 1
                            if t_last_token:
                                gap = t - t_last_token
                                rec.gap_req.append(i)
                                rec.gap_ns.append(gap)
                                if gap > max_gap:
                                    max_gap = gap
                            else:
                                t_first_token = t
                                watchdog.done()
                            t_last_token = t
                            if kind == K_CONTENT and not t_first_content:
                                t_first_content = t
                        elif kind == K_DONE:
                            finished = True
                            t_end = t
                            break
                        elif kind == K_ERROR:
                            err, detail = "stream_error", (parse_block(block).data or "")[:200]
                            finished = True
                            t_end = t
                            break
                c["t_first_event"][i] = t_first_event
                c["t_first_content"][i] = t_first_content
                if not finished:
                    t_end = now_ns()
                    err = "truncated"
                    detail = f"stream ended without [DONE] after {n_events} events" + (
                        f" ({framer.pending} bytes of an unterminated event)" if framer.pending else ""
                    )
    except asyncio.CancelledError:
        if not watchdog.fired:
            raise
        task = asyncio.current_task()
        if task is not None and hasattr(task, "uncancel"):
            task.uncancel()  # our own cancel: absorbed here, so the caller's task is not left "cancelling"
        err, detail = "ttft_timeout", f"no token within {timeouts.ttft_s} s of send"
        t_end = now_ns()
    except Exception as exc:  # classified, never raised: one failed request must not end the run
        err = exception_error(exc)
        detail = f"{type(exc).__name__}: {exc}"[:300]
        t_end = now_ns()
    finally:
        watchdog.done()
    c["t_first_token"][i] = t_first_token
    c["t_last_token"][i] = t_last_token
    c["t_end"][i] = t_end
    c["n_events"][i] = n_events
    c["n_token_events"][i] = n_token
    c["max_gap_ns"][i] = max_gap
    c["bytes_in"][i] = bytes_in
    if usage_tokens is not None:
        c["output_tokens"][i] = usage_tokens
        c["token_source"][i] = 1
    elif n_token:
        c["output_tokens"][i] = n_token
        c["token_source"][i] = 2
    if err is not None:
        c["error"][i] = ERROR_CODE[err]
        if detail:
            rec.detail[i] = detail
