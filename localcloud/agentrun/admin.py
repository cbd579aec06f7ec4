"""Admin plane of the AgentRun-like target, under `/-/` (a prefix no OpenAI path uses).

GET  /-/config                 effective config + the raw document it came from
PUT  /-/config                 JSON merge patch (RFC 7386) onto the raw document; keeps sessions/records
POST /-/reset                  clear sessions, records, counters, limiter; body (optional) = new full config
POST /-/stall                  {"duration_s": 1.0, "delay_s": 0.0}: freeze the server for a window
GET  /-/requests?since=&limit= completed ground-truth records with seq > since (paging by `next`)
GET  /-/requests/{request_id}  one record, in flight or completed
GET  /-/stats                  counters: outcomes, in flight, peak concurrency, sessions
GET  /-/clock                  the server's wall and monotonic clocks read together
"""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import web

from csbench.localcloud.agentrun.config import ConfigError
from csbench.localcloud.agentrun.state import STATE_KEY, AgentRunState

NS = 1_000_000_000


def _state(request: web.Request) -> AgentRunState:
    return request.app[STATE_KEY]


def _error(status: int, message: str, param: str | None = None) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}},
        status=status,
    )


async def _json_body(request: web.Request, *, allow_empty: bool) -> dict[str, Any]:
    raw = await request.read()
    if not raw.strip():
        if allow_empty:
            return {}
        raise ConfigError("request body: expected a JSON object, got nothing")
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise ConfigError(f"request body is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"request body: expected a JSON object, got {type(doc).__name__}")
    return doc


def _config_view(st: AgentRunState) -> dict[str, Any]:
    rt = st.rt
    return {"config": rt.cfg.model_dump(mode="json"), "raw": rt.raw, "epoch_ns": rt.epoch_ns}


async def get_config(request: web.Request) -> web.Response:
    return web.json_response(_config_view(_state(request)))


async def put_config(request: web.Request) -> web.Response:
    st = _state(request)
    try:
        st.patch(await _json_body(request, allow_empty=False))
    except ConfigError as e:
        return _error(400, str(e))
    return web.json_response(_config_view(st))


async def reset(request: web.Request) -> web.Response:
    st = _state(request)
    try:
        doc = await _json_body(request, allow_empty=True)
        st.apply(doc if doc else st.rt.raw, reset=True)
    except ConfigError as e:
        return _error(400, str(e))
    return web.json_response(_config_view(st))


async def stall(request: web.Request) -> web.Response:
    """Add a server-wide stall window starting `delay_s` from now; windows still ahead are kept."""
    st = _state(request)
    try:
        doc = await _json_body(request, allow_empty=False)
        unknown = set(doc) - {"duration_s", "delay_s"}
        if unknown:
            raise ConfigError(f"stall: unknown key {sorted(unknown)[0]!r}")
        duration, delay = doc.get("duration_s"), doc.get("delay_s", 0.0)
        if not isinstance(duration, (int, float)) or isinstance(duration, bool) or duration <= 0:
            raise ConfigError("stall.duration_s: a number > 0 is required")
        if not isinstance(delay, (int, float)) or isinstance(delay, bool) or delay < 0:
            raise ConfigError("stall.delay_s: must be a number >= 0")
        now = time.perf_counter_ns()
        # Re-express the windows still to come relative to the new epoch (now).
        windows = [{"start_s": max(0.0, (s - now) / NS), "duration_s": (e - max(s, now)) / NS}
                   for s, e in st.rt.windows if e > now]  # fmt: skip
        windows.append({"start_s": float(delay), "duration_s": float(duration)})
        rt = st.patch({"stall_windows": windows})
    except ConfigError as e:
        return _error(400, str(e))
    return web.json_response({"windows_ns": [list(w) for w in rt.windows], "now_ns": now})


async def requests(request: web.Request) -> web.Response:
    st = _state(request)
    try:
        since = int(request.query.get("since", "0"))
        limit = int(request.query.get("limit", "10000"))
    except ValueError:
        return _error(400, "since and limit must be integers", "since")
    if limit < 1:
        return _error(400, "limit must be >= 1", "limit")
    recs, lost = st.ring.since(since, limit)
    return web.json_response({
        "records": [r.to_dict() for r in recs],
        "next": recs[-1].seq if recs else max(since, 0),
        "last_seq": st.ring.seq,
        "lost": lost,
        "in_flight": len(st.ring.in_flight),
    })  # fmt: skip


async def one_request(request: web.Request) -> web.Response:
    rec = _state(request).ring.find(request.match_info["request_id"])
    if rec is None:
        return _error(404, f"no record of request {request.match_info['request_id']!r} (unknown or evicted)")
    return web.json_response(rec.to_dict())


async def stats(request: web.Request) -> web.Response:
    st = _state(request)
    return web.json_response({
        "requests_since_reset": st.index,
        "outcomes": st.outcomes,
        "in_flight": st.ceiling.in_flight,
        "peak_in_flight": st.ceiling.peak,
        "sessions": len(st.sessions.sessions),
        "sessions_recycled": st.sessions.recycled,
        "sessions_evicted": st.sessions.evicted,
        "records": len(st.ring.done),
        "last_seq": st.ring.seq,
    })  # fmt: skip


async def clock(request: web.Request) -> web.Response:
    mono = time.perf_counter_ns()
    wall = time.time_ns()
    return web.json_response(
        {"wall_ns": wall, "mono_ns": mono, "mono_clock": "CLOCK_MONOTONIC (perf_counter_ns)"}
    )


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/-/config", get_config)
    r.add_put("/-/config", put_config)
    r.add_post("/-/reset", reset)
    r.add_post("/-/stall", stall)
    r.add_get("/-/requests", requests)
    r.add_get("/-/requests/{request_id}", one_request)
    r.add_get("/-/stats", stats)
    r.add_get("/-/clock", clock)
