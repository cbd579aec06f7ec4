"""`soak`: a modest open-loop rate for a long time — availability and drift per window
(docs/job-kinds.md#soak).

The seed ran one sequential loop and reported the *configured* window as its duration. Here: the
engine's open loop at `rate_per_s` for `duration_s`; the steady window is cut into `window_s` windows
(by intended send time); per window: sent, completed, errors, availability = completed / sent, TTFT p50.
Drift = last window's TTFT p50 − first window's.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, model_validator

from csbench.probe.engine import LoadSpec, PhasePlan, RunResult
from csbench.probe.engine.records import P_COLD, P_STEADY
from csbench.probe.engine.stats import nearest_rank
from csbench.probe.jobs import JobContext
from csbench.probe.jobs.common import observation, parse_params
from csbench.probe.jobs.loadkit import LoadParams, SessionPolicy, engine_run, lat
from csbench.probe.protocol import Phase

KIND = "soak"
NS = 1_000_000_000


class SoakParams(LoadParams):
    rate_per_s: float = Field(default=2.0, gt=0)
    duration_s: float = Field(default=600.0, gt=0, le=7 * 24 * 3600)
    window_s: float = Field(default=60.0, gt=0)
    warmup_s: float = Field(default=0.0, ge=0)
    arrival: Literal["poisson", "constant"] = "constant"
    session: SessionPolicy = "pool"
    pool_size: int = Field(default=4, ge=1)

    @model_validator(mode="after")
    def _window(self) -> SoakParams:
        if self.window_s > self.duration_s:
            raise ValueError(f"window_s ({self.window_s}) must be ≤ duration_s ({self.duration_s})")
        return self


def windows(rows: list[tuple[float, bool, float | None]], duration_s: float, window_s: float) -> list[dict[str, Any]]:
    """rows: (intended offset in the steady window [s], ok, ttft ms). Pure."""
    n = max(1, math.ceil(duration_s / window_s - 1e-9))
    out: list[dict[str, Any]] = [
        {"start_s": k * window_s, "sent": 0, "completed": 0, "errors": 0, "_ttft": []} for k in range(n)]
    for t, ok, ttft in rows:
        k = min(n - 1, max(0, int(t // window_s)))
        w = out[k]
        w["sent"] += 1
        if ok:
            w["completed"] += 1
            if ttft is not None:
                w["_ttft"].append(ttft)
        else:
            w["errors"] += 1
    for w in out:
        xs = sorted(w.pop("_ttft"))
        w["availability"] = w["completed"] / w["sent"] if w["sent"] else None
        w["ttft_p50_ms"] = nearest_rank(xs, 0.5) if xs else None
    return out


def findings(summary: dict[str, Any], wins: list[dict[str, Any]]) -> dict[str, Any]:
    counts = summary["counts"]
    # Every request sent in the measured window, cold ones included (the engine's steady counts leave
    # cold requests out, which would make a held rate look missed).
    sent = sum(w["sent"] for w in wins)
    completed = sum(w["completed"] for w in wins)
    duration = summary["window"]["end_s"] - summary["window"]["start_s"]
    avail = [w["availability"] for w in wins if w["availability"] is not None]
    ttfts = [w["ttft_p50_ms"] for w in wins if w["ttft_p50_ms"] is not None]
    return {
        "availability": completed / sent if sent else None,
        "error_rate": (sent - completed) / sent if sent else None,
        "errors": counts["errors"],
        "requests": sent,
        "measured_duration_s": duration,
        "achieved_send_rate_per_s": sent / duration if duration else None,
        "min_window_availability": min(avail) if avail else None,
        "windows_with_errors": sum(1 for w in wins if w["errors"]),
        "ttft_p50_ms": lat(summary, "ttft"),
        "ttft_p50_drift_ms": ttfts[-1] - ttfts[0] if len(ttfts) >= 2 else None,
        "windows": wins,
    }


def steady_rows(res: RunResult) -> list[tuple[float, bool, float | None]]:
    c = res.records.cols
    w0 = res.epoch_ns + int(res.load.warmup_s * NS)
    rows = []
    for i in range(res.records.n):
        # A pooled session's first request is cold: it counts for availability and the send rate (it was
        # sent and answered), but its TTFT stays out of the warm per-window TTFT.
        cold = c["phase"][i] == P_COLD
        if not (c["phase"][i] == P_STEADY or (cold and c["t_intended"][i] >= w0)) or not c["t_send"][i]:
            continue
        ok = not c["error"][i]
        ttft = ((c["t_first_token"][i] - c["t_intended"][i]) * 1e-6
                if ok and not cold and c["t_first_token"][i] else None)
        rows.append(((c["t_intended"][i] - w0) / NS, ok, ttft))
    return rows


async def run_soak(ctx: JobContext) -> dict[str, Any]:
    p = parse_params(SoakParams, ctx.params, KIND)
    load = LoadSpec(model=p.arrival, rate=p.rate_per_s, duration_s=p.duration_s, warmup_s=p.warmup_s, seed=p.seed)
    run, res = await engine_run(ctx, p, load, PhasePlan(sessions=p.session, pool_size=p.pool_size), "soak",
                                {"rate": p.rate_per_s})
    ctx.progress(Phase.finishing)
    f = findings(run["summary"], windows(steady_rows(res), res.load.duration_s, p.window_s))
    return observation(KIND, p, [run], f)
