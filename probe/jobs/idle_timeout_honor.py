"""`idle_timeout_honor`: does the platform keep a session for its configured idle timeout, and recycle it
after? (docs/job-kinds.md#idle_timeout_honor)

The runtime is provisioned with `session_idle_timeout_s` = T by the control plane (or localcloud config).
One new session, warm baseline, then: idle for `promise_idle_s` (< T, default 0.8·T) → the wake must not
be cold (`honored`); then idle for each `decay_gaps_s` (default 1.5·T and 3·T) → the first cold wake is
where the platform actually recycled (`expiry_observed_s`). Tiers and thresholds as in `idle.py`.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from csbench.probe.jobs import JobContext
from csbench.probe.jobs.common import observation, parse_params
from csbench.probe.jobs.idle import IdleParams, Thresholds, ascending, idle_sweep, sweep_runs, tier_findings
from csbench.probe.protocol import Phase

KIND = "idle_timeout_honor"


class IdleTimeoutParams(IdleParams):
    session_idle_timeout_s: float = Field(gt=0)
    promise_idle_s: float | None = Field(default=None, gt=0)
    decay_gaps_s: list[float] | None = None

    @field_validator("decay_gaps_s")
    @classmethod
    def _gaps(cls, v: list[float] | None) -> list[float] | None:
        return None if v is None else ascending(v, "decay_gaps_s")

    @model_validator(mode="after")
    def _promise_below_timeout(self) -> IdleTimeoutParams:
        if self.promise_idle_s is not None and self.promise_idle_s >= self.session_idle_timeout_s:
            raise ValueError(f"promise_idle_s ({self.promise_idle_s}) must be < session_idle_timeout_s "
                             f"({self.session_idle_timeout_s}): it tests the time the session is promised")
        if self.decay_gaps_s and self.decay_gaps_s[0] <= (self.promise_idle_s or 0):
            raise ValueError("decay_gaps_s must all be longer than promise_idle_s")
        return self

    @property
    def promise(self) -> float:
        return self.promise_idle_s if self.promise_idle_s is not None else 0.8 * self.session_idle_timeout_s

    @property
    def decay(self) -> list[float]:
        t = self.session_idle_timeout_s
        return self.decay_gaps_s if self.decay_gaps_s is not None else [1.5 * t, 3.0 * t]


def findings(tiers: list[dict[str, Any]], timeout_s: float, promise_s: float, cold_ms: float | None,
             warm_p50: float | None, warm_p95: float | None, th: Thresholds) -> dict[str, Any]:
    """Pure. tiers[0] is the promise wake, the rest the decay sweep."""
    out = tier_findings(tiers, cold_ms, warm_p50, warm_p95, th)
    promise = tiers[0] if tiers else None
    decay = tiers[1:]
    expiry = next((t["idle_s"] for t in decay if t["tier"] == "cold"), None)
    out.update({
        "configured_idle_timeout_s": timeout_s,
        "promise_idle_s": promise_s,
        "promise_tier": promise["tier"] if promise else None,
        # honored: the session survived an idle gap inside the promise (deep = kept but slowed, reported).
        "honored": promise is not None and promise["tier"] in ("shallow", "deep"),
        "degraded_within_promise": promise is not None and promise["tier"] == "deep",
        "expiry_observed_s": expiry,
        "expires_after_timeout": expiry is not None and expiry > timeout_s,
        "kept_beyond_timeout_s": max((t["idle_s"] for t in decay if t["tier"] in ("shallow", "deep")
                                      and t["idle_s"] > timeout_s), default=None),
    })
    return out


async def run_idle_timeout_honor(ctx: JobContext) -> dict[str, Any]:
    p = parse_params(IdleTimeoutParams, ctx.params, KIND)
    gaps = [p.promise, *p.decay]
    # Never stop on a cold promise wake: the decay sweep still says when the platform recycles.
    sw = await idle_sweep(ctx, p, gaps, stop_on_cold=False)
    ctx.progress(Phase.finishing, len(sw.tiers), len(gaps))
    th = Thresholds(p.cold_threshold_ms, p.deep_factor, p.deep_min_extra_ms)
    cold_ms = sw.cold.ttft_ms if p.metric == "ttft" else sw.cold.total_ms
    f = findings(sw.tiers, p.session_idle_timeout_s, p.promise, cold_ms, sw.warm_p50_ms, sw.warm_p95_ms, th)
    checks = [("warn", ["the server's cold-start records disagree with a tier"])] if f["server_agrees"] is False else []
    return observation(KIND, p, sweep_runs(sw), f, checks)
