"""`scaling`: throughput and latency as concurrency grows, with an explicit session policy
(docs/job-kinds.md#scaling).

Each level N is a closed loop of N workers for `level_duration_s` (after `warmup_s`), `level_gap_s`
apart. Session policy — the seed silently put every request of a level on one session id:
  per_worker   each worker its own new session (engine `pool`): N sessions per level;
  per_request  every request a new session (all cold: statistics come from the cold phase);
  per_level    one new session per level shared by its N workers (the seed's behaviour, made explicit);
  shared       one session for every level of the job.
Per level: completed/s, TTFT p50/p95 (from intended send), e2e p95, success rate. Findings: scaling
efficiency = X(N) / (N · X(1)); knee = first N whose TTFT p50 > 2 × the lowest level's; saturation = the
highest N up to which throughput grew ≥ 5 % per step with errors < 1 %. Instances are not observable from
the client (observed_instances is always null).
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from pydantic import Field, field_validator

from csbench.probe.engine import LoadSpec, PhasePlan
from csbench.probe.jobs import JobContext
from csbench.probe.jobs.common import new_session_id, observation, parse_params
from csbench.probe.jobs.loadkit import LoadParams, engine_run, fixed_session_target, lat, measured_block
from csbench.probe.protocol import Phase

KIND = "scaling"
ENGINE_SESSIONS = {"per_worker": "pool", "per_request": "per_request", "per_level": "shared", "shared": "pool"}


class ScalingParams(LoadParams):
    levels: list[int] = Field(default_factory=lambda: [1, 4, 16, 32])
    level_duration_s: float = Field(default=10.0, gt=0, le=3600)
    warmup_s: float = Field(default=2.0, ge=0)
    level_gap_s: float = Field(default=5.0, ge=0, le=600)
    session: Literal["per_worker", "per_request", "per_level", "shared"] = "per_worker"

    @field_validator("levels")
    @classmethod
    def _levels(cls, v: list[int]) -> list[int]:
        if not v or any(x < 1 for x in v) or sorted(set(v)) != list(v):
            raise ValueError(f"levels must be ≥ 1 and strictly ascending, got {v}")
        return v


def point(level: int, summary: dict[str, Any], duration_s: float) -> dict[str, Any]:
    phase, block = measured_block(summary)
    c = block["counts"]
    sent = c["sent"]
    return {"concurrency": level, "measured_phase": phase, "sent": sent, "completed": c["completed"],
            "throughput_per_s": c["completed"] / duration_s if duration_s else None,
            "success_rate": c["completed"] / sent if sent else None,
            "ttft_p50_ms": lat(block, "ttft"), "ttft_p95_ms": lat(block, "ttft", "p95"),
            "e2e_p95_ms": lat(block, "e2e", "p95"), "observed_instances": None}


def findings(points: list[dict[str, Any]], session: str) -> dict[str, Any]:
    """Pure."""
    base = points[0] if points else None
    x1 = base["throughput_per_s"] / base["concurrency"] if base and base["throughput_per_s"] else None
    for pt in points:
        pt["scaling_efficiency"] = (pt["throughput_per_s"] / (pt["concurrency"] * x1)
                                    if x1 and pt["throughput_per_s"] is not None else None)
    knee = None
    if base and base["ttft_p50_ms"]:
        knee = next((pt["concurrency"] for pt in points[1:]
                     if pt["ttft_p50_ms"] is not None and pt["ttft_p50_ms"] > 2 * base["ttft_p50_ms"]), None)
    saturation = base["concurrency"] if base and (base["success_rate"] or 0) >= 0.99 else None
    for prev, pt in zip(points, points[1:], strict=False):
        grows = (prev["throughput_per_s"] and pt["throughput_per_s"] is not None
                 and pt["throughput_per_s"] >= 1.05 * prev["throughput_per_s"])
        if saturation is None or not grows or (pt["success_rate"] or 0) < 0.99:
            break
        saturation = pt["concurrency"]
    return {"session_policy": session, "points": points, "knee_concurrency": knee,
            "saturation_concurrency": saturation,
            "max_throughput_per_s": max((pt["throughput_per_s"] or 0 for pt in points), default=None),
            "instance_visibility": "not observable from the client; observed_instances is null"}


async def run_scaling(ctx: JobContext) -> dict[str, Any]:
    p = parse_params(ScalingParams, ctx.params, KIND)
    cap = ctx.spec.limits.max_concurrency
    if p.levels[-1] > cap:
        raise ValueError(f"{KIND}: level {p.levels[-1]} exceeds limits.max_concurrency ({cap})")
    job_target = fixed_session_target(ctx.spec.target, new_session_id("scale")) if p.session == "shared" else None
    runs: list[dict[str, Any]] = []
    points: list[dict[str, Any]] = []
    for k, level in enumerate(p.levels):
        if k:
            await asyncio.sleep(p.level_gap_s)
        ctx.progress(Phase.measuring, k, len(p.levels), concurrency=float(level))
        load = LoadSpec(model="closed", concurrency=level, duration_s=p.level_duration_s, warmup_s=p.warmup_s,
                        seed=p.seed + k)
        phases = PhasePlan(sessions=ENGINE_SESSIONS[p.session])
        run, res = await engine_run(ctx, p, load, phases, f"concurrency-{level}", {"concurrency": level}, job_target)
        runs.append(run)
        points.append(point(level, run["summary"], res.load.duration_s))
    ctx.progress(Phase.finishing)
    return observation(KIND, p, runs, findings(points, p.session))
