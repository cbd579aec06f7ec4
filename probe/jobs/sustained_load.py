"""`sustained_load`: a fixed arrival rate held for a while — open loop, so the rate is what was asked for
whatever the target does (docs/job-kinds.md#sustained_load).

The seed ran N closed-loop workers ("token bucket" in the docstring, none in the code): its throughput
was bounded by its own concurrency. Here the engine's open-loop dispatcher releases requests at their
scheduled times (`arrival`: constant or poisson at `target_rps`); a request waits for nothing but an
in-flight cap slot (`max_inflight`, default limits.max_concurrency; overflow queue = counted in
queue_delay, or drop = counted as dropped). Latency is measured from the intended send time. Reported:
target, offered and achieved rates, latency from intended and from actual send, errors by class.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from csbench.probe.engine import LoadSpec, PhasePlan
from csbench.probe.jobs import JobContext
from csbench.probe.jobs.common import observation, parse_params
from csbench.probe.jobs.loadkit import LoadParams, SessionPolicy, all_counts, engine_run, lat
from csbench.probe.protocol import Phase

KIND = "sustained_load"


class SustainedLoadParams(LoadParams):
    target_rps: float = Field(default=10.0, gt=0)
    duration_s: float = Field(default=60.0, gt=0, le=24 * 3600)
    warmup_s: float = Field(default=5.0, ge=0)
    cooldown_s: float = Field(default=0.0, ge=0)
    arrival: Literal["poisson", "constant"] = "poisson"
    max_inflight: int | None = Field(default=None, ge=1)
    overflow: Literal["queue", "drop"] = "queue"
    session: SessionPolicy = "pool"
    pool_size: int = Field(default=8, ge=1)


def findings(summary: dict[str, Any], target_rps: float) -> dict[str, Any]:
    """Headline values from the engine summary (steady window). Pure."""
    rates = summary.get("rates", {})
    counts = summary["counts"]
    sent = counts["sent"]
    errors = sum(counts["errors"].values())
    achieved = rates.get("achieved_send_per_s")
    return {
        "target_rate_per_s": target_rps,
        "effective_rate_per_s": summary["load"]["rate"],  # after limits (see load.clamps)
        "rate_clamped": any(c["param"] == "rate" for c in summary["load"].get("clamps", [])),
        "offered_rate_per_s": rates.get("offered_per_s"),
        "achieved_send_rate_per_s": achieved,
        "completed_rate_per_s": rates.get("completed_per_s"),
        "rate_realization": achieved / target_rps if achieved is not None else None,
        "ttft_p50_ms": lat(summary, "ttft"),
        "ttft_p99_ms": lat(summary, "ttft", "p99"),
        "ttft_service_p50_ms": lat(summary, "ttft_service"),
        "e2e_p50_ms": lat(summary, "e2e"),
        "e2e_p99_ms": lat(summary, "e2e", "p99"),
        "jitter_ms": (lat(summary, "e2e", "p99") or 0) - (lat(summary, "e2e") or 0) if lat(summary, "e2e") else None,
        "queue_delay_p99_ms": lat(summary, "queue_delay", "p99"),
        "requests": sent,
        "dropped": counts["dropped"],
        "error_rate": errors / sent if sent else None,
        "errors": counts["errors"],
        "cold_requests": summary["phases"]["cold"]["counts"]["offered"],
        "all_phases": all_counts(summary),
        "latency_anchor": "intended",
    }


async def run_sustained_load(ctx: JobContext) -> dict[str, Any]:
    p = parse_params(SustainedLoadParams, ctx.params, KIND)
    load = LoadSpec(model=p.arrival, rate=p.target_rps, duration_s=p.duration_s, warmup_s=p.warmup_s,
                    cooldown_s=p.cooldown_s, seed=p.seed, max_inflight=p.max_inflight, overflow=p.overflow)
    run, _ = await engine_run(ctx, p, load, PhasePlan(sessions=p.session, pool_size=p.pool_size), "steady",
                              {"rate": p.target_rps})
    ctx.progress(Phase.finishing)
    f = findings(run["summary"], p.target_rps)
    checks = []
    if f["rate_realization"] is not None and f["rate_realization"] < 0.97:
        checks.append(("warn", [f"achieved send rate {f['achieved_send_rate_per_s']:.2f}/s is "
                                f"{f['rate_realization']:.1%} of the target {p.target_rps}/s"]))
    return observation(KIND, p, [run], f, checks)
