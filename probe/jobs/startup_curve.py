"""`startup_curve`: latency of calls 1..n on a new session — how many calls until it is warm
(docs/job-kinds.md#startup_curve).

For each of `sessions` new sessions: `n_calls` sequential requests on that session. Call 1 is the cold
call; the warm steady value is the median of calls 2..n; `calls_to_warm` is the first call k from which
every call is ≤ warm_factor × that median. Per-session curves are kept; cold calls are summarised apart.
"""

from __future__ import annotations

import statistics
from typing import Any, Literal

from pydantic import Field

from csbench.probe.jobs import JobContext
from csbench.probe.jobs.common import (
    Client,
    RequestParams,
    Sample,
    new_session_id,
    observation,
    p50,
    parse_params,
    run_entry,
    sample_summary,
)
from csbench.probe.protocol import Phase

KIND = "startup_curve"


class StartupCurveParams(RequestParams):
    n_calls: int = Field(default=8, ge=3, le=1000)
    sessions: int = Field(default=1, ge=1, le=100)
    warm_factor: float = Field(default=1.5, gt=1)
    metric: Literal["ttft", "e2e"] = "ttft"


def curve_findings(curve: list[float | None], warm_factor: float) -> dict[str, Any]:
    """One session's curve (ms per call, None = failed call). Pure."""
    warm = [v for v in curve[1:] if v is not None]
    steady = statistics.median(warm) if warm else None
    first = curve[0]
    to_warm = None
    if steady is not None:
        limit = warm_factor * steady
        for k in range(len(curve)):
            if all(v is not None and v <= limit for v in curve[k:]):
                to_warm = k + 1
                break
    return {
        "first_call_ms": first,
        "second_call_ms": curve[1] if len(curve) > 1 else None,
        "third_call_ms": curve[2] if len(curve) > 2 else None,
        "warm_steady_ms": steady,
        "cold_penalty_ms": first - steady if first is not None and steady is not None else None,
        "speedup_ratio": first / steady if first is not None and steady else None,
        "calls_to_warm": to_warm,
        "failed_calls": sum(1 for v in curve if v is None),
    }


def findings(curves: list[list[float | None]], warm_factor: float) -> dict[str, Any]:
    per = [curve_findings(c, warm_factor) for c in curves]
    return {
        "cold_start_ms": p50(f["cold_penalty_ms"] for f in per),  # median over sessions of call1 − steady
        "first_call_p50_ms": p50(f["first_call_ms"] for f in per),
        "warm_steady_p50_ms": p50(f["warm_steady_ms"] for f in per),
        "calls_to_warm_max": max((f["calls_to_warm"] for f in per if f["calls_to_warm"] is not None), default=None),
        "sessions": per,
        "curves_ms": curves,
    }


async def run_startup_curve(ctx: JobContext) -> dict[str, Any]:
    p = parse_params(StartupCurveParams, ctx.params, KIND)
    total = p.n_calls * p.sessions
    if total > ctx.spec.limits.max_requests:
        raise ValueError(f"{KIND}: {total} requests exceed limits.max_requests ({ctx.spec.limits.max_requests})")
    cold: list[Sample] = []
    warm: list[Sample] = []
    curves: list[list[float | None]] = []
    async with Client(ctx.spec.target, p, limit=1) as client:
        for k in range(p.sessions):
            sid = new_session_id("curve")
            curve: list[float | None] = []
            for i in range(p.n_calls):
                ctx.progress(Phase.measuring, k * p.n_calls + i, total)
                s = await client.request(sid)
                (cold if i == 0 else warm).append(s)
                curve.append((s.ttft_ms if p.metric == "ttft" else s.total_ms) if s.ok else None)
                await ctx.telemetry.write("samples", {**s.to_dict(), "session_index": k, "call": i + 1})
            curves.append(curve)
    ctx.progress(Phase.finishing, total, total)
    runs = [run_entry("cold", sample_summary(cold)), run_entry("warm", sample_summary(warm))]
    f = findings(curves, p.warm_factor)
    checks = [("warn", [f"{n} failed calls"])] if (n := sum(x["failed_calls"] for x in f["sessions"])) else []
    return observation(KIND, p, runs, f, checks)
