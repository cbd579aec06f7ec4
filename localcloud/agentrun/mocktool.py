"""The seed's mock-tool server: the HTTP tools an agent calls, with deterministic fault and latency
injection per correlation id, call counting and token protection.

Protocol (as clousight-bench's `mock_tools.py`, which the seed's probes drive):

    GET  /health                       open even when token-locked (reachability preflight)
    GET  /prices[?provider=&service=]  tool: read a price list          (counted, injectable)
    GET  /inventory                    tool: read a resource inventory  (counted, injectable)
    POST /reports                      tool: write a report             (counted, injectable)
    GET  /reports                      the reports written so far
    POST /reset                        clear reports, fault/latency config and counters
    POST /fault/config                 {"target", "corr"?, "status"?, "fail_on_calls": [n..]}
                                       or {"target", "corr"?, "status"?, "fail_from_call": n, "fail_count": k}
    GET  /fault/state                  {"call_counts": {"prices": 3, "prices|<corr>": 1}, "fault": <last>, "faults": [...]}
    POST /latency/config               {"target", "corr"?, "add_ms", "on_calls"? | "from_call"?, "count"?}
    GET  /latency/state                {"call_counts": ..., "latency": <last>, "latencies": [...]}
    GET  /-/calls?since=<seq>          admin view: counts and a bounded log of every tool call

Headers: `X-Clousight-Token` (when a token is configured, every path but /health needs it, compared in
constant time) and `X-Clousight-Correlation-Id` (selects the per-correlation counter `target|corr`).
Calls are numbered per counter from 1; injection rules are keyed by call number, so a scenario replays
exactly (no randomness).

Differences from the seed, on purpose: configs are stored per (target, corr) instead of in one slot, so
concurrent probes with different correlation ids do not overwrite each other (a config without `corr`
still applies to every caller of that target, and `{}` still clears everything); a config without
`target` or with unknown keys is refused with 400 instead of silently injecting nothing (the seed's
`2e7bfa8` bug).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections import deque
from typing import Any

from aiohttp import web
from pydantic import Field, model_validator

from csbench.localcloud.agentrun.config import ConfigError, StrictModel, parse_model

TARGETS = ("prices", "inventory", "reports")


class MockToolConfig(StrictModel):
    token: str | None = None  # None: open (loopback only); set: required on every path but /health
    token_header: str = "X-Clousight-Token"
    correlation_header: str = "X-Clousight-Correlation-Id"
    call_log_capacity: int = Field(default=10_000, ge=1)


class _Rule(StrictModel):
    target: str
    corr: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _target_required(cls, data: Any) -> Any:
        if isinstance(data, dict) and data and "target" not in data:
            raise ValueError(f"'target' is required (one of {', '.join(TARGETS)}); send {{}} to clear all")
        return data


class FaultRule(_Rule):
    status: int = Field(default=500, ge=100, le=599)
    fail_on_calls: tuple[int, ...] | None = None
    fail_from_call: int | None = Field(default=None, ge=1)
    fail_count: int = Field(default=1, ge=0)

    def status_for(self, call: int) -> int | None:
        if self.fail_on_calls is not None:  # the seed checks the list form first
            return self.status if call in self.fail_on_calls else None
        if self.fail_from_call is not None:
            return (
                self.status if self.fail_from_call <= call < self.fail_from_call + self.fail_count else None
            )
        return None


class LatencyRule(_Rule):
    add_ms: int = Field(default=0, ge=0)
    on_calls: tuple[int, ...] | None = None
    from_call: int | None = Field(default=None, ge=1)
    count: int = Field(default=1, ge=0)

    def delay_ms(self, call: int) -> int:
        if self.on_calls is not None:
            return self.add_ms if call in self.on_calls else 0
        if self.from_call is not None:
            return self.add_ms if self.from_call <= call < self.from_call + self.count else 0
        return self.add_ms


def _pick(rules: dict[tuple[str, str | None], Any], target: str, corr: str | None) -> Any:
    """The rule for this caller: its own correlation's rule first, else the target-wide one."""
    rule = rules.get((target, corr)) if corr is not None else None
    return rule if rule is not None else rules.get((target, None))


class ToolState:
    def __init__(self, capacity: int):
        self.reports: list[Any] = []
        self.call_counts: dict[str, int] = {}
        self.faults: dict[tuple[str, str | None], FaultRule] = {}
        self.latencies: dict[tuple[str, str | None], LatencyRule] = {}
        self.last_fault: dict[str, Any] | None = None
        self.last_latency: dict[str, Any] | None = None
        self.log: deque[dict[str, Any]] = deque(maxlen=capacity)
        self.seq = 0

    def reset(self) -> None:
        self.reports.clear()
        self.call_counts.clear()
        self.faults.clear()
        self.latencies.clear()
        self.last_fault = self.last_latency = None

    def next_call(self, target: str, corr: str | None) -> int:
        key = target if corr is None else f"{target}|{corr}"
        n = self.call_counts.get(key, 0) + 1
        self.call_counts[key] = n
        return n

    def configure(self, kind: str, doc: dict[str, Any]) -> dict[str, Any]:
        """Store a fault or latency rule; `{}` clears every rule of that kind (the seed's way to clear)."""
        rules, model = (self.faults, FaultRule) if kind == "fault" else (self.latencies, LatencyRule)
        if not doc:
            rules.clear()
        else:
            rule = parse_model(model, doc, kind)
            rules[(rule.target, rule.corr)] = rule
        if kind == "fault":
            self.last_fault = doc
        else:
            self.last_latency = doc
        return doc


STATE_KEY = web.AppKey("mocktool_state", ToolState)
CONFIG_KEY = web.AppKey("mocktool_config", MockToolConfig)

# Fixed, small tool data: the point is a stable tool universe, not realistic prices.
PRICES = [
    {"provider": "aliyun", "service": "ecs", "sku": "ecs.e-c1m2.large", "unit": "hour", "price": 0.062},
    {"provider": "aliyun", "service": "oss", "sku": "standard", "unit": "GB-month", "price": 0.017},
    {"provider": "aliyun", "service": "agentrun", "sku": "vcpu-second", "unit": "second", "price": 0.000018},
    {"provider": "aws", "service": "ec2", "sku": "t3.small", "unit": "hour", "price": 0.0208},
    {"provider": "aws", "service": "s3", "sku": "standard", "unit": "GB-month", "price": 0.023},
]
INVENTORY = {
    "resources": [
        {"id": "i-local0001", "type": "ecs", "region": "cn-hangzhou", "state": "Running"},
        {"id": "bucket-local", "type": "oss", "region": "cn-hangzhou", "state": "Available"},
    ]
}


def _send(payload: Any, status: int = 200) -> web.Response:
    return web.json_response(payload, status=status)


@web.middleware
async def _auth(request: web.Request, handler: Any) -> web.StreamResponse:
    cfg = request.app[CONFIG_KEY]
    if cfg.token and request.path != "/health":
        presented = request.headers.get(cfg.token_header, "")
        if not hmac.compare_digest(presented.encode(), cfg.token.encode()):
            return _send(
                {"error": "unauthorized", "detail": f"missing or wrong {cfg.token_header} header"}, 401
            )
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return _send({"error": "not_found", "path": request.path}, 404)
    except web.HTTPMethodNotAllowed:
        return _send({"error": "method_not_allowed", "method": request.method, "path": request.path}, 405)


async def _tool_call(request: web.Request, target: str) -> web.Response | None:
    """Count the call, inject its latency, then its fault (both keyed by the same call number).
    Returns the fault response to send, or None to serve the tool normally."""
    st = request.app[STATE_KEY]
    corr = request.headers.get(request.app[CONFIG_KEY].correlation_header) or None
    arrival, wall = time.perf_counter_ns(), time.time_ns()
    call = st.next_call(target, corr)
    lat = _pick(st.latencies, target, corr)
    delay_ms = lat.delay_ms(call) if lat is not None else 0
    fault = _pick(st.faults, target, corr)
    status = fault.status_for(call) if fault is not None else None
    st.seq += 1
    st.log.append({"seq": st.seq, "target": target, "corr": corr, "call": call, "method": request.method,
                   "arrival_ns": arrival, "arrival_wall_ns": wall, "latency_ms": delay_ms,
                   "status": status or 200, "injected_fault": status is not None})  # fmt: skip
    if delay_ms:
        await asyncio.sleep(delay_ms / 1000)
    if status is not None:
        return _send(
            {"error": "injected_fault", "target": target, "call_index": call, "status": status}, status
        )
    return None


async def health(request: web.Request) -> web.Response:
    return _send({"ok": True})


async def prices(request: web.Request) -> web.Response:
    fault = await _tool_call(request, "prices")
    if fault is not None:
        return fault
    provider, service = request.query.get("provider"), request.query.get("service")
    products = [
        p
        for p in PRICES
        if (not provider or p["provider"] == provider) and (not service or p["service"] == service)
    ]
    return _send({"products": products})


async def inventory(request: web.Request) -> web.Response:
    return await _tool_call(request, "inventory") or _send(INVENTORY)


async def _read_json(request: web.Request) -> Any:
    raw = await request.read()
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        raise ConfigError("invalid_json") from None


async def post_report(request: web.Request) -> web.Response:
    try:
        payload = await _read_json(request)
    except ConfigError:
        return _send({"error": "invalid_json"}, 400)
    fault = await _tool_call(request, "reports")
    if fault is not None:
        return fault
    st = request.app[STATE_KEY]
    st.reports.append(payload)
    return _send({"ok": True, "report_id": len(st.reports)})


async def get_reports(request: web.Request) -> web.Response:
    return _send({"reports": request.app[STATE_KEY].reports})


async def reset(request: web.Request) -> web.Response:
    request.app[STATE_KEY].reset()
    return _send({"ok": True})


def _config_handler(kind: str) -> Any:
    async def handler(request: web.Request) -> web.Response:
        try:
            doc = await _read_json(request)
            if not isinstance(doc, dict):
                raise ConfigError(f"{kind}: expected a JSON object, got {type(doc).__name__}")
            stored = request.app[STATE_KEY].configure(kind, doc)
        except ConfigError as e:
            error = "invalid_json" if str(e) == "invalid_json" else "invalid_config"
            return _send({"error": error, "detail": str(e)}, 400)
        return _send({"ok": True, kind: stored})

    return handler


async def fault_state(request: web.Request) -> web.Response:
    st = request.app[STATE_KEY]
    faults = [r.model_dump(exclude_none=True) for r in st.faults.values()]
    return _send({"call_counts": dict(st.call_counts), "fault": st.last_fault, "faults": faults})


async def latency_state(request: web.Request) -> web.Response:
    st = request.app[STATE_KEY]
    lats = [r.model_dump(exclude_none=True) for r in st.latencies.values()]
    return _send({"call_counts": dict(st.call_counts), "latency": st.last_latency, "latencies": lats})


async def calls(request: web.Request) -> web.Response:
    st = request.app[STATE_KEY]
    try:
        since = int(request.query.get("since", "0"))
    except ValueError:
        return _send({"error": "invalid_query", "detail": "since must be an integer"}, 400)
    log = [c for c in st.log if c["seq"] > since]
    return _send(
        {"call_counts": dict(st.call_counts), "calls": log, "next": log[-1]["seq"] if log else since}
    )


def build_app(ctx: Any, config: dict[str, Any]) -> web.Application:
    """The mock-tool server. `config`: MockToolConfig (token, header names, call-log size)."""
    try:
        cfg: MockToolConfig = parse_model(MockToolConfig, dict(config), "mocktool")
    except ConfigError as e:
        raise ConfigError(f"localcloud mocktool config rejected: {e}") from None
    app = web.Application(middlewares=[_auth])
    app[CONFIG_KEY] = cfg
    app[STATE_KEY] = ToolState(cfg.call_log_capacity)
    r = app.router
    r.add_get("/health", health)
    r.add_get("/prices", prices)
    r.add_get("/inventory", inventory)
    r.add_post("/reports", post_report)
    r.add_get("/reports", get_reports)
    r.add_post("/reset", reset)
    r.add_post("/fault/config", _config_handler("fault"))
    r.add_get("/fault/state", fault_state)
    r.add_post("/latency/config", _config_handler("latency"))
    r.add_get("/latency/state", latency_state)
    r.add_get("/-/calls", calls)
    return app
