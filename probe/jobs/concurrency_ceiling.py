"""`concurrency_ceiling`: how many requests may be in flight at once before the platform rejects some?
(docs/job-kinds.md#concurrency_ceiling)

For each level N (ascending): N requests started at once (one burst; sessions per_request or shared), run
to completion; the level *fails* when rejected / sent > `rejection_threshold` (default 0: any rejection),
rejected = HTTP 429, HTTP 5xx, or a transport/connect failure. With `refine`, levels between the last
passing and the first failing are bisected (≤ max_refine_steps more bursts). Reported: last_passing and
first_failing concurrency and the rule — the seed reported only the failing level, as `max_in_flight`.
A level whose requests never overlapped (client-side peak in flight < N, e.g. responses too short) proves
nothing about N: it is marked `overlapped: false` and cannot pass.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from pydantic import Field, field_validator

from csbench.probe.engine import LoadSpec, PhasePlan
from csbench.probe.jobs import JobContext
from csbench.probe.jobs.common import new_session_id, observation, parse_params
from csbench.probe.jobs.loadkit import (
    BURST_WINDOW_S,
    LoadParams,
    all_counts,
    engine_run,
    fixed_session_target,
    peak_inflight,
)
from csbench.probe.protocol import Phase

KIND = "concurrency_ceiling"
REJECTIONS = ("http_429", "http_5xx", "transport", "connect_timeout")


class CeilingParams(LoadParams):
    levels: list[int] = Field(default_factory=lambda: [4, 8, 16, 32, 64])
    rejection_threshold: float = Field(default=0.0, ge=0, lt=1)
    refine: bool = True
    max_refine_steps: int = Field(default=4, ge=0, le=10)
    level_gap_s: float = Field(default=1.0, ge=0, le=600)
    session: Literal["per_request", "shared"] = "per_request"
    max_tokens: int | None = Field(default=64, ge=1)  # long enough for the burst to overlap

    @field_validator("levels")
    @classmethod
    def _levels(cls, v: list[int]) -> list[int]:
        if not v or any(x < 1 for x in v) or sorted(set(v)) != list(v):
            raise ValueError(f"levels must be ≥ 1 and strictly ascending, got {v}")
        return v


def level_row(level: int, counts: dict[str, Any], peak: int, threshold: float) -> dict[str, Any]:
    """Pure: one level's outcome under the rule."""
    sent = counts["sent"]
    rejected = sum(counts["errors"].get(k, 0) for k in REJECTIONS)
    frac = rejected / sent if sent else 0.0
    overlapped = peak >= level
    return {"concurrency": level, "sent": sent, "completed": counts["completed"], "rejected": rejected,
            "rejection_fraction": frac, "http_429": counts["errors"].get("http_429", 0),
            "other_errors": sum(counts["errors"].values()) - rejected, "peak_inflight": peak,
            "overlapped": overlapped, "passed": frac <= threshold and overlapped and sent == level,
            "failed": frac > threshold}


def bracket(rows: list[dict[str, Any]]) -> tuple[int | None, int | None]:
    """(last passing, first failing): the highest passing level below the lowest failing one. Pure."""
    failing = [r["concurrency"] for r in rows if r["failed"]]
    first_fail = min(failing) if failing else None
    passing = [r["concurrency"] for r in rows if r["passed"] and (first_fail is None or r["concurrency"] < first_fail)]
    return (max(passing) if passing else None), first_fail


def next_probe(rows: list[dict[str, Any]]) -> int | None:
    """Midpoint of the open bracket, if any level is left between its ends. Pure."""
    lo, hi = bracket(rows)
    if lo is None or hi is None or hi - lo <= 1:
        return None
    return (lo + hi) // 2


def findings(rows: list[dict[str, Any]], threshold: float, skipped: list[int]) -> dict[str, Any]:
    lo, hi = bracket(rows)
    return {
        "last_passing_concurrency": lo,
        "first_failing_concurrency": hi,
        "ceiling_exact": lo is not None and hi is not None and hi - lo == 1,
        "rule": f"a level fails when rejected/sent > {threshold} (rejected = {', '.join(REJECTIONS)}); "
                "it passes when it does not fail, every request was sent, and they all overlapped",
        "hard_limit_429": any(r["http_429"] for r in rows),
        "levels": sorted(rows, key=lambda r: r["concurrency"]),
        "levels_skipped_by_limits": skipped,
    }


async def run_concurrency_ceiling(ctx: JobContext) -> dict[str, Any]:
    p = parse_params(CeilingParams, ctx.params, KIND)
    cap = ctx.spec.limits.max_concurrency
    levels = [x for x in p.levels if x <= cap]
    skipped = [x for x in p.levels if x > cap]
    if not levels:
        raise ValueError(f"{KIND}: every level exceeds limits.max_concurrency ({cap})")
    target = fixed_session_target(ctx.spec.target, new_session_id("ceil")) if p.session == "shared" else None
    rows: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []

    async def probe(level: int) -> dict[str, Any]:
        if runs:
            await asyncio.sleep(p.level_gap_s)  # let the previous burst drain and limiters refill
        ctx.progress(Phase.measuring, len(runs), None, concurrency=float(level))
        load = LoadSpec(model="burst", burst_size=level, bursts=1, duration_s=BURST_WINDOW_S, seed=p.seed + len(runs))
        run, res = await engine_run(ctx, p, load, PhasePlan(sessions="per_request"), f"burst-{level}",
                                    {"concurrency": level}, target)
        runs.append(run)
        row = level_row(level, all_counts(run["summary"]), peak_inflight(res), p.rejection_threshold)
        rows.append(row)
        return row

    for level in levels:
        if (await probe(level))["failed"]:
            break
    for _ in range(p.max_refine_steps if p.refine else 0):
        mid = next_probe(rows)
        if mid is None:
            break
        await probe(mid)
    ctx.progress(Phase.finishing)
    f = findings(rows, p.rejection_threshold, skipped)
    checks = []
    if any(not r["overlapped"] and not r["failed"] for r in rows):
        checks.append(("warn", ["some levels never had all requests in flight at once (responses too short?)"]))
    return observation(KIND, p, runs, f, checks)
