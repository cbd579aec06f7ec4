"""`hol_blocking`: does one slow tool call hold up fast calls sent beside it (head-of-line blocking)?
(docs/job-kinds.md#hol_blocking)

Method: warm the session(s). Phase A (baseline): `fast_count` concurrent invocations of the fast tool.
Then inject `slow_latency_ms` on the slow tool for one correlation id (the mock's latency injection).
Phase B: start the slow invocation, `start_offset_ms` later start `fast_count` fast ones concurrently.
A fast call in B is *blocked* when its latency ≥ baseline p50 + block_fraction × slow_latency_ms.
session = shared: all of a phase's invocations on one session (HOL inside a session — the usual
question); per_request: each on a new warm session (HOL across the runtime).
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from pydantic import Field, model_validator

from csbench.probe.jobs import JobContext
from csbench.probe.jobs.agent import AgentParams, invoke, new_corr, open_env, public_sample, require_openai
from csbench.probe.jobs.common import (
    Client,
    Sample,
    new_session_id,
    observation,
    p50,
    parse_params,
    run_entry,
    sample_summary,
)
from csbench.probe.protocol import Phase

KIND = "hol_blocking"


class HolParams(AgentParams):
    fast_target: Literal["prices", "inventory", "reports"] = "prices"
    slow_target: Literal["prices", "inventory", "reports"] = "reports"
    fast_count: int = Field(default=20, ge=1, le=500)
    slow_latency_ms: int = Field(default=500, ge=1, le=600_000)
    start_offset_ms: float = Field(default=20.0, ge=0)
    block_fraction: float = Field(default=0.5, gt=0, le=1)
    session: Literal["shared", "per_request"] = "shared"
    max_tokens: int | None = None

    @model_validator(mode="after")
    def _targets(self) -> HolParams:
        if self.fast_target == self.slow_target:
            raise ValueError("fast_target and slow_target must differ (the latency rule is per target)")
        return self


def findings(baseline: list[Sample], fast: list[Sample], slow: Sample, slow_latency_ms: int,
             block_fraction: float) -> dict[str, Any]:
    """Pure. Latencies are end-to-end ms of whole invocations (tool call included)."""
    base = p50(s.total_ms for s in baseline if s.ok)
    under = p50(s.total_ms for s in fast if s.ok)
    limit = None if base is None else base + block_fraction * slow_latency_ms
    blocked = [s for s in fast if s.ok and limit is not None and s.total_ms is not None and s.total_ms >= limit]
    ok_fast = [s for s in fast if s.ok]
    frac = len(blocked) / len(ok_fast) if ok_fast else None
    return {
        "injected_latency_ms": slow_latency_ms,
        "slow_call_ms": slow.total_ms if slow.ok else None,
        "slow_reflects_injection": slow.ok and slow.total_ms is not None and slow.total_ms >= slow_latency_ms,
        "fast_p50_baseline_ms": base,
        "fast_p50_under_slow_ms": under,
        "hol_ratio": under / base if under is not None and base else None,
        "blocked_threshold_ms": limit,
        "blocked_fraction": frac,
        "serialized": frac is not None and frac >= 0.5,
        "fast_errors": sum(1 for s in fast if not s.ok),
    }


async def run_hol_blocking(ctx: JobContext) -> dict[str, Any]:
    p = parse_params(HolParams, ctx.params, KIND)
    require_openai(ctx.spec.target, KIND)
    n = 2 * p.fast_count + 3
    if n > ctx.spec.limits.max_requests or p.fast_count + 1 > ctx.spec.limits.max_concurrency:
        raise ValueError(f"{KIND}: fast_count={p.fast_count} needs {n} requests and {p.fast_count + 1} in flight; "
                         f"limits allow {ctx.spec.limits.max_requests} and {ctx.spec.limits.max_concurrency}")
    async with Client(ctx.spec.target, p, limit=p.fast_count + 2) as client:
        ctx.progress(Phase.warmup, 0, 2)
        env = await open_env(client, p)

        async def sessions(k: int) -> list[str]:
            if p.session == "shared":
                return [env.session] * k
            ids = [new_session_id("hol") for _ in range(k)]
            await asyncio.gather(*(client.request(s) for s in ids))  # warm each: no cold start in the data
            return ids

        fast_sessions = await sessions(p.fast_count)
        ctx.progress(Phase.measuring, 0, 2)
        baseline = [s for s, _ in await asyncio.gather(
            *(invoke(env, p, new_corr("fast"), p.fast_target, sid) for sid in fast_sessions))]
        slow_corr = new_corr("slow")
        await env.mock.latency(p.slow_target, slow_corr, p.slow_latency_ms)
        try:
            fast_sessions = await sessions(p.fast_count)
            slow_session = env.session if p.session == "shared" else (await sessions(1))[0]
            slow_task = asyncio.ensure_future(invoke(env, p, slow_corr, p.slow_target, slow_session))
            await asyncio.sleep(p.start_offset_ms / 1000)
            ctx.progress(Phase.measuring, 1, 2)
            fast = [s for s, _ in await asyncio.gather(
                *(invoke(env, p, new_corr("fast"), p.fast_target, sid) for sid in fast_sessions))]
            slow, _ = await slow_task
        finally:
            await env.mock.clear_latency(p.slow_target, slow_corr)
    ctx.progress(Phase.finishing, 2, 2)
    for role, group in (("baseline", baseline), ("fast", fast), ("slow", [slow])):
        for s in group:
            await ctx.telemetry.write("invocations", {"role": role, **public_sample(s)})
    f = findings(baseline, fast, slow, p.slow_latency_ms, p.block_fraction)
    runs = [run_entry("baseline", sample_summary(baseline), {"concurrency": p.fast_count}),
            run_entry("under_slow", sample_summary(fast), {"concurrency": p.fast_count + 1}),
            run_entry("slow", sample_summary([slow]))]
    checks = []
    if not f["slow_reflects_injection"]:
        checks.append(("warn", ["the slow call was not slower than the injected latency: injection not applied?"]))
    return observation(KIND, p, runs, f, checks)
