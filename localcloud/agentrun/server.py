"""An AgentRun-like target: OpenAI-compatible chat completions with known ground-truth timing.

Data plane: `POST /openai/v1/chat/completions` (also under AgentRun's real data-plane prefix
`/agent-runtimes/{runtime}/endpoints/{endpoint}/invocations`), streaming and not, with session affinity,
cold starts, seeded TTFT / inter-token distributions, 429s, failures, stalls and client-disconnect
detection. Admin plane under `/-/` (see `admin.py`): reconfigure, reset, read the ground-truth records.

The hot path avoids pydantic, per-request JSON encoding of stream chunks and drifting sleeps: every send
waits for an absolute deadline from the plan (`timing.py`) and is timestamped after the write returned.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from array import array
from typing import Any

from aiohttp import web
from aiohttp.streams import StreamReader

from csbench.localcloud.agentrun import admin
from csbench.localcloud.agentrun.agent import run_tool_plan, tool_plan
from csbench.localcloud.agentrun.config import ConfigError
from csbench.localcloud.agentrun.limits import retry_after_value
from csbench.localcloud.agentrun.records import RequestRecord
from csbench.localcloud.agentrun.state import STATE_KEY, AgentRunState, Runtime
from csbench.localcloud.agentrun.timing import NS, Plan, choose, hold, plan_response
from csbench.localcloud.agentrun.wire import ApiError, ChatRequest, parse_chat_request

log = logging.getLogger(__name__)

perf_ns = time.perf_counter_ns
CHAT_PATH = "/openai/v1/chat/completions"
AGENTRUN_PREFIX = "/agent-runtimes/{runtime}/endpoints/{endpoint}/invocations"
_OUTCOME = {429: "rejected", 401: "unauthorized"}


class Disconnected(Exception):
    """The client went away; raised out of a wait or a write."""


# ---------------------------------------------------------------------------------------------------------
# Waiting for a deadline while noticing a client disconnect.


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Clock:
    """Sleeps to absolute monotonic deadlines; a client disconnect interrupts the sleep at once.

    aiohttp does not cancel handlers when the peer goes away (handler_cancellation is off), but it does
    fail the request's body stream with ConnectionResetError. Once the body has been read, nothing else
    feeds that stream, so parking our sleep future in its waiter slot turns "connection lost" into an
    immediate wake-up — exactly when the server observed the disconnect, not at the next write.
    """

    __slots__ = ("loop", "reader")

    def __init__(self, request: web.Request):
        self.loop = asyncio.get_running_loop()
        content = request.content
        ok = isinstance(content, StreamReader) and content.at_eof() and getattr(content, "_waiter", 1) is None
        self.reader: StreamReader | None = content if ok else None

    async def until(self, deadline_ns: int) -> None:
        if deadline_ns <= perf_ns():
            return
        fut = self.loop.create_future()
        # loop.time() is time.monotonic(): the same CLOCK_MONOTONIC as perf_counter_ns on Linux.
        handle = self.loop.call_at(deadline_ns / NS, _wake, fut)
        reader = self.reader
        parked = reader is not None and reader._waiter is None
        if parked:
            reader._waiter = fut  # type: ignore[union-attr]
        try:
            await fut
        except ConnectionError as e:
            raise Disconnected(str(e) or "connection lost") from None
        finally:
            handle.cancel()
            if parked and reader._waiter is fut:  # type: ignore[union-attr]
                reader._waiter = None  # type: ignore[union-attr]


# ---------------------------------------------------------------------------------------------------------
# Handlers.


async def _send_json(request: web.Request, rec: RequestRecord, status: int, body: bytes,
                     headers: dict[str, str]) -> web.Response:  # fmt: skip
    resp = web.Response(status=status, body=body, content_type="application/json", headers=headers)
    rec.status = status
    try:
        await resp.prepare(request)
        await resp.write_eof()
    except ConnectionError as e:
        rec.disconnect_ns = perf_ns()
        rec.outcome, rec.error = "disconnected", str(e)
        return resp
    rec.headers_ns = rec.end_ns = perf_ns()
    return resp


def _admit(st: AgentRunState, rt: Runtime, request: web.Request, rec: RequestRecord) -> None:
    """Auth, then the concurrency ceiling, then the rate bucket (so a rejected request spends no token)."""
    if rt.auth is not None and not hmac.compare_digest(
        request.headers.get("Authorization", "").encode(), rt.auth
    ):
        present = "Authorization" in request.headers
        raise ApiError(401, "Incorrect API key provided." if present else
                       "You didn't provide an API key. Provide it as 'Authorization: Bearer <key>'.",
                       param=None, code="invalid_api_key")  # fmt: skip
    ra = rt.cfg.retry_after
    if not st.ceiling.enter():
        wait = ra.seconds if ra.seconds is not None else 1.0
        raise ApiError(429, f"Too many concurrent requests: {st.ceiling.limit} in flight is the limit.",
                       type="requests", code="concurrency_limit_exceeded",
                       headers={"Retry-After": retry_after_value(wait, ra.format, time.time())})  # fmt: skip
    if st.bucket is not None:
        wait = st.bucket.take(rec.arrival_ns / NS)
        if wait:
            st.ceiling.leave()
            wait = ra.seconds if ra.seconds is not None else wait
            raise ApiError(429, f"Rate limit reached: {st.bucket.rate:g} requests/s (burst {st.bucket.burst:g}).",
                           type="requests", code="rate_limit_exceeded",
                           headers={"Retry-After": retry_after_value(wait, ra.format, time.time())})  # fmt: skip


async def _body(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge as e:
        raise ApiError(413, f"Request body too large: {e.text}", code="request_too_large") from None


async def chat_completions(request: web.Request) -> web.StreamResponse:
    arrival_ns, arrival_wall = perf_ns(), time.time_ns()
    st = request.app[STATE_KEY]
    rt = st.rt
    st.index += 1
    st.next_id += 1
    rid = f"{st.boot}-{st.next_id:x}"
    rec = RequestRecord(st.index, rid, arrival_wall, arrival_ns, request.path)
    sid = request.headers.get(rt.session_header)
    rec.session_id = sid
    headers = {"x-request-id": rid}
    if sid is not None:
        headers[rt.session_header] = sid
    st.ring.start(rec)
    admitted = False
    try:
        try:
            _admit(st, rt, request, rec)
            admitted = True
            chat = parse_chat_request(await _body(request))
        except ApiError as e:
            rec.outcome, rec.error = _OUTCOME.get(e.status, "bad_request"), e.message
            rec.retry_after = e.headers.get("Retry-After")
            return await _send_json(request, rec, e.status, e.body(), {**headers, **e.headers})
        rec.stream, rec.prompt_tokens = chat.stream, chat.prompt_tokens
        return await _generate(request, st, rt, rec, chat, sid or "", headers)
    finally:
        if admitted:
            st.ceiling.leave()
        st.finish(rec)


async def _generate(request: web.Request, st: AgentRunState, rt: Runtime, rec: RequestRecord,
                    chat: ChatRequest, sid: str, headers: dict[str, str]) -> web.StreamResponse:  # fmt: skip
    cfg, rng = rt.cfg, st.rng
    n = cfg.output_tokens
    if cfg.output_tokens_from_request and chat.max_tokens is not None:
        n = chat.max_tokens
    n = min(n, cfg.max_output_tokens)
    finish = "length" if chat.max_tokens is not None and n >= chat.max_tokens else "stop"
    cold, ready = st.sessions.begin(sid, rec.arrival_ns, int(rt.cold(rng) * NS))
    try:
        rec.cold_start = cold
        stall_ns, stall_after = 0, None
        for numbers, s in rt.stalls:
            if choose(rec.index, numbers, s.probability, rng):
                stall_ns, stall_after = int(s.duration_s * NS), s.after_tokens
                break
        failure = None
        for numbers, f in rt.failures:
            if choose(rec.index, numbers, f.probability, rng):
                failure = f
                break
        clock = Clock(request)
        tool = tool_plan(chat.last_user) if cfg.agent.enabled else None
        answer = None
        try:
            if tool is not None:  # the seed's benchmark agent: do the tool call, then answer its result
                await _wait(clock, rt, rec, ready)
                rec.tool = await run_tool_plan(st.http(), tool, cfg.agent)
                answer = json.dumps(rec.tool)
                ready, n, finish = perf_ns(), 1, "stop"
            plan = plan_response(ready, n, rng, rt.ttft, rt.gap, stall_after, stall_ns)
            rec.ready_ns, rec.stall_ns, rec.tokens_planned = plan.ready, stall_ns, n
            rec.planned_first_token_ns, rec.planned_end_ns = plan.tokens[0], plan.end
            if failure is not None and failure.mode == "status":
                await _wait(clock, rt, rec, plan.ready)
                rec.outcome, rec.error = "failed", f"injected failure (request #{rec.index})"
                body = ApiError(
                    failure.status, rec.error, type="server_error", code="injected_failure"
                ).body()
                return await _send_json(request, rec, failure.status, body, headers)
            if chat.stream:
                return await _stream(request, rt, rec, chat, plan, clock, headers, finish, failure, answer)
            await _wait(clock, rt, rec, plan.end)
            if failure is not None:  # drop mode without streaming: the connection dies, no response at all
                return _drop(request, rec, web.StreamResponse())
            created = rec.arrival_wall_ns // NS
            usage = _usage(chat, n)
            text = answer if answer is not None else rt.codec.text(n)
            body = rt.codec.completion("chatcmpl-" + rec.request_id, created, text, finish, usage)
            resp = await _send_json(request, rec, 200, body, headers)
            if rec.outcome == "in_flight":
                rec.outcome, rec.tokens_sent = "ok", n
                rec.first_token_ns = rec.last_token_ns = rec.end_ns
            return resp
        except Disconnected as e:
            rec.disconnect_ns = perf_ns()
            rec.outcome, rec.error = "disconnected", str(e)
            return web.Response(status=499)  # never sent: the peer is gone; aiohttp drops it
    finally:
        st.sessions.end(sid, perf_ns())


def _usage(chat: ChatRequest, n: int) -> dict[str, int]:
    return {
        "prompt_tokens": chat.prompt_tokens,
        "completion_tokens": n,
        "total_tokens": chat.prompt_tokens + n,
    }


async def _wait(clock: Clock, rt: Runtime, rec: RequestRecord, planned_ns: int) -> None:
    due = hold(planned_ns, rt.windows) if rt.windows else planned_ns
    rec.held_ns += due - planned_ns
    await clock.until(due)


async def _write(resp: web.StreamResponse, data: bytes) -> int:
    try:
        await resp.write(data)
    except ConnectionError as e:
        raise Disconnected(str(e) or "connection lost") from None
    return perf_ns()


async def _stream(request: web.Request, rt: Runtime, rec: RequestRecord, chat: ChatRequest, plan: Plan,
                  clock: Clock, headers: dict[str, str], finish: str, failure: Any, answer: str | None) -> web.StreamResponse:  # fmt: skip
    codec = rt.codec
    resp = web.StreamResponse(status=200, headers=headers)
    resp.content_type = "text/event-stream"
    resp.headers["Cache-Control"] = "no-cache"
    resp.headers["X-Accel-Buffering"] = "no"
    await _wait(clock, rt, rec, plan.ready)
    try:
        await resp.prepare(request)
    except ConnectionError as e:
        raise Disconnected(str(e)) from None
    rec.status = 200
    rec.headers_ns = perf_ns()
    head = codec.head("chatcmpl-" + rec.request_id, rec.arrival_wall_ns // NS)
    tail = codec.tail_usage if chat.include_usage else codec.tail
    deltas, first_deltas = (codec.deltas, codec.role_token_deltas) if answer is None else codec.custom(answer)
    if rt.cfg.role_chunk == "with_headers":
        await _write(resp, head + codec.role_delta + tail)
        first_deltas = deltas
    # else the first chunk carries the role and the first token
    nd = len(deltas)
    times = array("q") if rt.cfg.record_token_times else None
    rec.token_ns = times
    drop_at = failure.after_tokens if failure is not None else -1
    tokens, n, i = plan.tokens, len(plan.tokens), 0
    windows = rt.windows
    while i < n:
        if i == drop_at:
            return _drop(request, rec, resp)
        due = hold(tokens[i], windows) if windows else tokens[i]
        rec.held_ns += due - tokens[i]
        await clock.until(due)
        # Send every token already due in one write: after a late wake-up or a stall the backlog goes out
        # together (as a real server's buffered output would), and gap-0 streams cost one syscall.
        now = perf_ns()
        buf = head + (first_deltas if i == 0 else deltas)[i % nd] + tail
        j = i + 1
        while (
            j < n and j != drop_at and tokens[j] <= now and not (windows and hold(tokens[j], windows) > now)
        ):
            buf += head + deltas[j % nd] + tail
            j += 1
        t = await _write(resp, buf)
        if times is not None:
            times.extend([t] * (j - i))
        if i == 0:
            rec.first_token_ns = t
        rec.last_token_ns = t
        rec.tokens_sent = i = j
    usage = _usage(chat, n) if chat.include_usage else None
    await _write(resp, codec.final(head, finish, usage))
    try:
        await resp.write_eof()
    except ConnectionError as e:
        raise Disconnected(str(e)) from None
    rec.end_ns = perf_ns()
    rec.outcome = "ok"
    return resp


def _drop(request: web.Request, rec: RequestRecord, resp: web.StreamResponse) -> web.StreamResponse:
    """Injected transport failure: abort the connection mid-stream (RST), no terminal events."""
    if request.transport is not None:
        request.transport.abort()
    rec.end_ns = perf_ns()
    rec.outcome, rec.error = "dropped", f"injected drop after {rec.tokens_sent} tokens (request #{rec.index})"
    return resp


# ---------------------------------------------------------------------------------------------------------
# App.


@web.middleware
async def _json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Unknown paths, wrong methods and anything unexpected answer OpenAI-style JSON, never a traceback."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        typ = "not_found_error" if e.status == 404 else "invalid_request_error"
        body = ApiError(e.status, f"{e.reason}: {request.method} {request.path}", type=typ).body()
        allow = {"Allow": e.headers["Allow"]} if "Allow" in e.headers else None
        return web.Response(status=e.status, body=body, content_type="application/json", headers=allow)
    except (asyncio.CancelledError, ConnectionError):
        raise
    except Exception as e:  # a bug in this server: say so in JSON, log the traceback server-side
        log.exception("agentrun: unhandled error on %s %s", request.method, request.path)
        body = ApiError(
            500, f"internal error in the local target: {type(e).__name__}: {e}", type="server_error"
        ).body()
        return web.Response(status=500, body=body, content_type="application/json")


async def health(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def models(request: web.Request) -> web.Response:
    rt = request.app[STATE_KEY].rt
    return web.json_response({"object": "list", "data": [{"id": rt.cfg.model, "object": "model", "created": 0,
                                                          "owned_by": "localcloud"}]})  # fmt: skip


def build_app(ctx: Any, config: dict[str, Any]) -> web.Application:
    """The AgentRun-like target. `config` is an AgentRunConfig document; unknown keys are an error."""
    try:
        state = AgentRunState(dict(config))
    except ConfigError as e:
        raise ConfigError(f"localcloud agentrun config rejected: {e}") from None
    app = web.Application(middlewares=[_json_errors], client_max_size=8 * 1024 * 1024)
    app[STATE_KEY] = state
    app.on_cleanup.append(lambda _app: state.close())
    for prefix in ("", AGENTRUN_PREFIX):
        app.router.add_post(prefix + CHAT_PATH, chat_completions)
        app.router.add_get(prefix + "/openai/v1/models", models)
    app.router.add_get("/health", health)
    admin.add_routes(app)
    return app
