"""`rate_limit`: where does the platform start answering 429, as a *rate* and as a *concurrency*?
(docs/job-kinds.md#rate_limit)

Two explicit measurements (the seed had one, called `throttle_onset_rps`, that was a burst size):
1. Rate steps: for each rate in `rate_steps` (ascending), an open-loop constant arrival stream for
   `step_duration_s`; its 429 fraction = 429s / sent (all phases). The step is throttled when the fraction
   is > `throttle_threshold`. → throttle_onset_rate_per_s (first throttled step), max_unthrottled_rate_per_s
   (highest step below it), sustained_rate_per_s (highest step with 429 fraction < 0.1 % and completed ≥
   99 % of sent — load_anchors §4.3).
2. Burst levels: for each level N in `burst_levels`, N requests started at once (distinct sessions). →
   throttle_onset_concurrency, max_unthrottled_concurrency.
`step_gap_s` of idle between steps lets a token bucket refill. Retry-After is parsed as delta-seconds or
HTTP-date (engine); after the first throttled step the job waits that long (≤ max_retry_wait_s) and sends
one request: retry_after_honest = it succeeded.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import Field, field_validator, model_validator

from csbench.probe.engine import LoadSpec, PhasePlan
from csbench.probe.jobs import JobContext
from csbench.probe.jobs.common import Client, new_session_id, observation, parse_params
from csbench.probe.jobs.loadkit import BURST_WINDOW_S, LoadParams, SessionPolicy, all_counts, engine_run
from csbench.probe.protocol import Phase

KIND = "rate_limit"


def _ascending(v: list[float], name: str) -> list[float]:
    if any(x <= 0 for x in v) or sorted(v) != list(v) or len(set(v)) != len(v):
        raise ValueError(f"{name} must be positive and strictly ascending (or empty to skip), got {v}")
    return v


class RateLimitParams(LoadParams):
    rate_steps: list[float] = Field(default_factory=lambda: [5.0, 10.0, 20.0, 40.0])
    step_duration_s: float = Field(default=5.0, gt=0, le=3600)
    burst_levels: list[int] = Field(default_factory=lambda: [5, 10, 20, 40])
    step_gap_s: float = Field(default=1.0, ge=0, le=600)
    throttle_threshold: float = Field(default=0.01, ge=0, lt=1)
    stop_after_throttle: bool = True  # further steps only re-measure a limit already found
    session: SessionPolicy = "pool"  # rate steps; bursts always use one session per request
    check_retry_after: bool = True
    max_retry_wait_s: float = Field(default=30.0, ge=0)

    @field_validator("rate_steps")
    @classmethod
    def _rates(cls, v: list[float]) -> list[float]:
        return _ascending(v, "rate_steps")

    @field_validator("burst_levels")
    @classmethod
    def _bursts(cls, v: list[int]) -> list[int]:
        return [int(x) for x in _ascending([float(x) for x in v], "burst_levels")]

    @model_validator(mode="after")
    def _something(self) -> RateLimitParams:
        if not self.rate_steps and not self.burst_levels:
            raise ValueError("rate_steps and burst_levels are both empty: nothing to measure")
        return self


def step_row(value: float, counts: dict[str, Any]) -> dict[str, Any]:
    sent = counts["sent"]
    n429 = counts["errors"].get("http_429", 0)
    return {"value": value, "sent": sent, "completed": counts["completed"], "http_429": n429,
            "fraction_429": n429 / sent if sent else 0.0,
            "other_errors": sum(counts["errors"].values()) - n429}


def onset(rows: list[dict[str, Any]], threshold: float) -> tuple[float | None, float | None]:
    """(first throttled value, highest unthrottled value below it). Pure."""
    first = next((r["value"] for r in rows if r["fraction_429"] > threshold), None)
    below = [r["value"] for r in rows if r["fraction_429"] <= threshold and (first is None or r["value"] < first)]
    return first, (max(below) if below else None)


def findings(rate_rows: list[dict[str, Any]], burst_rows: list[dict[str, Any]], threshold: float,
             retry_after_s: list[float], retry_after_honest: bool | None) -> dict[str, Any]:
    r_on, r_ok = onset(rate_rows, threshold)
    c_on, c_ok = onset(burst_rows, threshold)
    sustained = [r["value"] for r in rate_rows
                 if r["sent"] and r["fraction_429"] < 0.001 and r["completed"] >= 0.99 * r["sent"]]
    ra = sorted(retry_after_s)
    return {
        "throttle_onset_rate_per_s": r_on,
        "max_unthrottled_rate_per_s": r_ok,
        "sustained_rate_per_s": max(sustained) if sustained else None,
        "throttle_onset_concurrency": c_on,
        "max_unthrottled_concurrency": c_ok,
        "throttle_rule": f"a step or burst is throttled when its 429 fraction > {threshold}",
        "rate_steps": [{"rate_per_s": r.pop("value"), **r} for r in [dict(x) for x in rate_rows]],
        "burst_levels": [{"concurrency": r.pop("value"), **r} for r in [dict(x) for x in burst_rows]],
        "retry_after_s": {"n": len(ra), "p50": ra[(len(ra) - 1) // 2] if ra else None, "max": ra[-1] if ra else None},
        "retry_after_honest": retry_after_honest,
        "hard_limit_seen": any(r["http_429"] for r in rate_rows + burst_rows),
    }


async def run_rate_limit(ctx: JobContext) -> dict[str, Any]:
    p = parse_params(RateLimitParams, ctx.params, KIND)
    runs: list[dict[str, Any]] = []
    rate_rows: list[dict[str, Any]] = []
    burst_rows: list[dict[str, Any]] = []
    retry: list[float] = []
    honest: bool | None = None

    async def check_retry(summary: dict[str, Any]) -> None:
        nonlocal honest
        ra = summary.get("retry_after_s") or []
        if honest is not None or not p.check_retry_after or not ra:
            return
        await asyncio.sleep(min(p.max_retry_wait_s, max(ra)))
        async with Client(ctx.spec.target, p, limit=1) as client:
            honest = (await client.request(new_session_id("retry"))).ok

    for k, rate in enumerate(p.rate_steps):
        if k:
            await asyncio.sleep(p.step_gap_s)
        load = LoadSpec(model="constant", rate=rate, duration_s=p.step_duration_s, seed=p.seed + k)
        run, _ = await engine_run(ctx, p, load, PhasePlan(sessions=p.session), f"rate-{rate:g}", {"rate": rate})
        runs.append(run)
        s = run["summary"]
        rate_rows.append(step_row(rate, all_counts(s)))
        retry += s.get("retry_after_s") or []
        if rate_rows[-1]["fraction_429"] > p.throttle_threshold:
            await check_retry(s)
            if p.stop_after_throttle:
                break
    for k, level in enumerate(p.burst_levels):
        if k or runs:
            await asyncio.sleep(p.step_gap_s)
        ctx.progress(Phase.measuring, k, len(p.burst_levels))
        load = LoadSpec(model="burst", burst_size=level, bursts=1, duration_s=BURST_WINDOW_S, seed=p.seed + k)
        run, _ = await engine_run(ctx, p, load, PhasePlan(sessions="per_request"), f"burst-{level}",
                                  {"concurrency": level})
        runs.append(run)
        s = run["summary"]
        burst_rows.append(step_row(level, all_counts(s)))
        retry += s.get("retry_after_s") or []
        if burst_rows[-1]["fraction_429"] > p.throttle_threshold:
            await check_retry(s)
            if p.stop_after_throttle:
                break
    ctx.progress(Phase.finishing)
    f = findings(rate_rows, burst_rows, p.throttle_threshold, retry, honest)
    return observation(KIND, p, runs, f)
