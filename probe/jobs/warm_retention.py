"""`warm_retention`: how long a session stays warm when left idle (docs/job-kinds.md#warm_retention).

One new session: its cold first request, `warmup_samples` warm requests (the baseline), then one wake
request after each idle gap (ascending), classified cold / deep / shallow with the explicit thresholds of
`idle.py`. Gaps longer than the platform's idle timeout (`platform_idle_timeout_s`, if known) are
expected to wake cold and are marked as such. Cold samples never enter the warm statistics.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from csbench.probe.jobs import JobContext
from csbench.probe.jobs.common import observation, parse_params
from csbench.probe.jobs.idle import IdleParams, Thresholds, ascending, idle_sweep, sweep_runs, tier_findings
from csbench.probe.protocol import Phase

KIND = "warm_retention"


class WarmRetentionParams(IdleParams):
    idle_gaps_s: list[float] = Field(default_factory=lambda: [30.0, 120.0, 300.0])
    stop_on_cold: bool = True  # a longer gap after a cold wake only re-measures the cold start
    platform_idle_timeout_s: float | None = Field(default=None, gt=0)

    @field_validator("idle_gaps_s")
    @classmethod
    def _gaps(cls, v: list[float]) -> list[float]:
        return ascending(v, "idle_gaps_s")


def findings(tiers: list[dict[str, Any]], cold_ms: float | None, warm_p50: float | None,
             warm_p95: float | None, th: Thresholds, platform_idle_timeout_s: float | None) -> dict[str, Any]:
    """tier_findings plus which gaps exceeded the platform's idle timeout. Pure."""
    out = tier_findings(tiers, cold_ms, warm_p50, warm_p95, th)
    out["platform_idle_timeout_s"] = platform_idle_timeout_s
    if platform_idle_timeout_s is not None:
        out["gaps_beyond_idle_timeout_s"] = [t["idle_s"] for t in tiers if t["idle_s"] > platform_idle_timeout_s]
        # A wake after more than the idle timeout that was not cold: the platform kept the session longer.
        out["warm_beyond_idle_timeout"] = any(
            t["idle_s"] > platform_idle_timeout_s and t["tier"] in ("shallow", "deep") for t in tiers)
    return out


async def run_warm_retention(ctx: JobContext) -> dict[str, Any]:
    p = parse_params(WarmRetentionParams, ctx.params, KIND)
    sw = await idle_sweep(ctx, p, p.idle_gaps_s, stop_on_cold=p.stop_on_cold)
    ctx.progress(Phase.finishing, len(sw.tiers), len(p.idle_gaps_s))
    th = Thresholds(p.cold_threshold_ms, p.deep_factor, p.deep_min_extra_ms)
    cold_ms = sw.cold.ttft_ms if p.metric == "ttft" else sw.cold.total_ms
    f = findings(sw.tiers, cold_ms, sw.warm_p50_ms, sw.warm_p95_ms, th, p.platform_idle_timeout_s)
    checks = [("warn", ["the server's cold-start records disagree with a tier"])] if f["server_agrees"] is False else []
    return observation(KIND, p, sweep_runs(sw), f, checks)
