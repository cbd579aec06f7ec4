"""Idle-gap probing shared by warm_retention and idle_timeout_honor: a session is made warm, left idle for
a gap, then woken by one request whose latency is classified against explicit thresholds.

Tiers of a wake request (latency = its TTFT by default, ms from send):
  cold     latency ≥ cold_threshold_ms (the platform started a new instance/session);
  deep     not cold, latency > deep_factor × warm p95 AND latency − warm p95 ≥ deep_min_extra_ms
           (kept, but paged out / slowed — the absolute floor stops 10 ms jitter on a 5 ms baseline
           from counting as "deep");
  shallow  otherwise (still warm).
Wake samples are reported per gap and never enter the warm baseline; the cold first request of the
session is reported on its own.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator

from csbench.probe.engine.stats import nearest_rank
from csbench.probe.jobs import JobContext
from csbench.probe.jobs.common import (
    Client,
    GroundTruth,
    RequestParams,
    Sample,
    checked_url,
    new_session_id,
    p50,
    run_entry,
    sample_summary,
)
from csbench.probe.protocol import Phase

NS = 1_000_000_000


class IdleParams(RequestParams):
    warmup_samples: int = Field(default=3, ge=2, le=100)
    cold_threshold_ms: float = Field(default=15_000.0, gt=0)
    deep_factor: float = Field(default=3.0, gt=1)
    deep_min_extra_ms: float = Field(default=20.0, ge=0)
    metric: Literal["ttft", "e2e"] = "ttft"
    ground_truth_url: str | None = None  # a target's `/-/requests` (localcloud): cross-checks every tier

    @field_validator("ground_truth_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("must be an http(s) URL")
        return v


def ascending(gaps: list[float], name: str) -> list[float]:
    if not gaps:
        raise ValueError(f"{name}: at least one gap")
    if any(g <= 0 for g in gaps) or sorted(gaps) != list(gaps):
        raise ValueError(f"{name}: gaps must be > 0 and ascending, got {gaps}")
    return gaps


@dataclass(frozen=True)
class Thresholds:
    cold_ms: float
    deep_factor: float
    deep_min_extra_ms: float


def classify_wake(latency_ms: float | None, warm_p95_ms: float, th: Thresholds) -> str:
    """cold | deep | shallow for one wake latency (None: the wake request failed → "failed"). Pure."""
    if latency_ms is None:
        return "failed"
    if latency_ms >= th.cold_ms:
        return "cold"
    if latency_ms > th.deep_factor * warm_p95_ms and latency_ms - warm_p95_ms >= th.deep_min_extra_ms:
        return "deep"
    return "shallow"


def latency_of(s: Sample, metric: str) -> float | None:
    if not s.ok:
        return None
    return s.ttft_ms if metric == "ttft" else s.total_ms


@dataclass
class Sweep:
    session: str
    cold: Sample
    warm: list[Sample]
    tiers: list[dict[str, Any]]
    warm_p50_ms: float | None
    warm_p95_ms: float | None


async def idle_sweep(ctx: JobContext, p: IdleParams, gaps: list[float], *, stop_on_cold: bool) -> Sweep:
    """Cold request, warm baseline, then for each gap: stay idle for it (from the end of the previous
    request), send one wake request, classify it. Stops after the first cold wake if asked."""
    n = 1 + p.warmup_samples + len(gaps)
    if n > ctx.spec.limits.max_requests:
        raise ValueError(f"{n} requests exceed limits.max_requests ({ctx.spec.limits.max_requests})")
    th = Thresholds(p.cold_threshold_ms, p.deep_factor, p.deep_min_extra_ms)
    session = new_session_id("idle")
    tiers: list[dict[str, Any]] = []
    async with Client(ctx.spec.target, p, limit=1) as client:
        gt = GroundTruth(client.http, await checked_url(p.ground_truth_url, "ground_truth_url")) \
            if p.ground_truth_url and client.http else None  # fmt: skip
        ctx.progress(Phase.warmup, 0, len(gaps))
        cold = await client.request(session)
        if not cold.ok:
            raise RuntimeError(f"the first (cold) request failed: {cold.error}: {cold.error_detail}")
        warm = [await client.request(session) for _ in range(p.warmup_samples)]
        vals = sorted(v for v in (latency_of(s, p.metric) for s in warm) if v is not None)
        if len(vals) < 2:
            raise RuntimeError(f"warm baseline failed: {[s.error for s in warm]}")
        warm_p95 = nearest_rank(vals, 0.95)
        last_end = warm[-1].t_end_ns
        for k, gap in enumerate(gaps):
            ctx.progress(Phase.measuring, k, len(gaps), idle_s=gap)
            await asyncio.sleep(max(0.0, gap - (time.perf_counter_ns() - last_end) / NS))
            s = await client.request(session)
            idle = (s.t_send_ns - last_end) / NS
            last_end = s.t_end_ns
            lat = latency_of(s, p.metric)
            tier = classify_wake(lat, warm_p95, th)
            entry: dict[str, Any] = {"idle_s": gap, "measured_idle_s": idle, "latency_ms": lat, "tier": tier,
                                     "sample": s}
            if gt is not None and s.request_id:
                rec = await gt.record(s.request_id)
                entry["server_cold_start"] = None if rec is None else bool(rec.get("cold_start"))
            tiers.append(entry)
            await ctx.telemetry.write("wakes", {**{k2: v for k2, v in entry.items() if k2 != "sample"},
                                                **s.to_dict()})
            if tier == "cold" and stop_on_cold:
                break
    return Sweep(session, cold, warm, tiers, p50(vals), warm_p95)


def sweep_runs(sw: Sweep) -> list[dict[str, Any]]:
    """cold / warm / one run per wake — never pooled together."""
    runs = [run_entry("cold", sample_summary([sw.cold])), run_entry("warm", sample_summary(sw.warm))]
    for t in sw.tiers:
        r = run_entry(f"wake-after-{t['idle_s']:g}s", sample_summary([t["sample"]]))
        r["idle_s"], r["tier"] = t["idle_s"], t["tier"]
        runs.append(r)
    return runs


def public_tiers(tiers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in t.items() if k != "sample"} for t in tiers]


def tier_findings(tiers: list[dict[str, Any]], cold_latency_ms: float | None, warm_p50_ms: float | None,
                  warm_p95_ms: float | None, th: Thresholds) -> dict[str, Any]:
    """Headline values of an idle sweep. Pure."""
    shallow = [t["idle_s"] for t in tiers if t["tier"] == "shallow"]
    deep = [t["idle_s"] for t in tiers if t["tier"] == "deep"]
    cold = [t["idle_s"] for t in tiers if t["tier"] == "cold"]
    agree = [t["server_cold_start"] == (t["tier"] == "cold") for t in tiers if t.get("server_cold_start") is not None]
    return {
        "cold_latency_ms": cold_latency_ms,
        "warm_latency_p50_ms": warm_p50_ms,
        "warm_latency_p95_ms": warm_p95_ms,
        "cold_penalty_ms": (cold_latency_ms - warm_p50_ms)
        if cold_latency_ms is not None and warm_p50_ms is not None else None,
        "shallow_retention_s": max(shallow) if shallow else None,
        "deep_onset_s": min(deep) if deep else None,
        "cold_onset_s": min(cold) if cold else None,
        "keeps_warm": not cold,
        "max_idle_tested_s": max((t["idle_s"] for t in tiers), default=None),
        "thresholds": {"cold_ms": th.cold_ms, "deep_factor": th.deep_factor,
                       "deep_min_extra_ms": th.deep_min_extra_ms,
                       "deep_ms": None if warm_p95_ms is None else max(th.deep_factor * warm_p95_ms,
                                                                       warm_p95_ms + th.deep_min_extra_ms)},
        "tiers": public_tiers(tiers),
        "server_agrees": all(agree) if agree else None,
    }
