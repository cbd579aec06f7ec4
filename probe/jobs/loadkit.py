"""Load-shaped kinds on the measurement engine: params shared by them, one engine run → one `runs[]`
entry, and small readers of the engine's summary (docs/measurement.md "Summary format")."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field

from csbench.probe.engine import LoadSpec, PhasePlan, RunResult, run_load
from csbench.probe.engine.client import Timeouts
from csbench.probe.engine.records import ERRORS
from csbench.probe.engine.requests import HttpTemplate, OpenAIBody
from csbench.probe.jobs import JobContext
from csbench.probe.jobs.common import RequestParams, credential_headers, run_entry
from csbench.probe.protocol import Phase, Target

PHASE_NAMES = ("cold", "warmup", "steady", "cooldown")
MARGIN_S = 5.0  # the job's timeout must leave room to summarise and write the result
# A one-burst run's nominal window (rates in its summary are per this window). Not 0: the engine's summary
# has no `rates` for a zero-length window (KeyError in summarize) — reported to the engine's author.
BURST_WINDOW_S = 1.0


class LoadParams(RequestParams):
    seed: int = 0
    ttft_timeout_s: float = Field(default=60.0, gt=0, le=3600)


def timeouts(p: LoadParams) -> Timeouts:
    return Timeouts(ttft_s=min(p.ttft_timeout_s, p.request_timeout_s), idle_s=p.request_timeout_s,
                    total_s=p.request_timeout_s)


def fixed_session_target(target: Target, session_id: str) -> Target:
    """A target whose every request carries `session_id` in the real session header: the engine names its
    own sessions per run, so for a session shared across runs its header is moved to a dummy name."""
    return target.model_copy(update={"session_header": "x-csbench-engine-session",
                                     "headers": {**target.headers, target.session_header: session_id}})


def remaining_s(ctx: JobContext) -> float:
    return ctx.spec.timeout_s - (time.monotonic() - ctx.started_mono) - MARGIN_S


async def engine_run(ctx: JobContext, p: LoadParams, load: LoadSpec, phases: PhasePlan, label: str,
                     level: dict[str, Any], target: Target | None = None) -> tuple[dict[str, Any], RunResult]:
    """One engine run bounded by the job's remaining time; returns (runs[] entry, RunResult)."""
    left = remaining_s(ctx)
    if left < load.warmup_s + load.cooldown_s + 0.5:
        raise RuntimeError(f"{label}: only {left:.1f} s left of the job's timeout_s; shorten the load")

    def progress(phase: str, done: int, total: int | None, metrics: dict[str, float]) -> None:
        try:
            ph = Phase(phase)
        except ValueError:
            ph = Phase.measuring
        ctx.progress(ph, done, total, **metrics)

    http = HttpTemplate.from_params(p.request) if p.request is not None else None
    t = target or ctx.spec.target
    res = await run_load(
        t, load, limits=ctx.spec.limits, phases=phases, on_progress=progress, telemetry=ctx.telemetry,
        credential_headers=credential_headers(ctx.spec.target), timeouts=timeouts(p),
        openai_body=OpenAIBody(prompt=p.prompt, max_tokens=p.max_tokens), http_template=http,
        max_duration_s=left,
    )
    return run_entry(label, res.summary(), level), res


def all_counts(summary: dict[str, Any]) -> dict[str, Any]:
    """Counts over every phase (cold included): what was sent and how it ended, whatever the phase."""
    out: dict[str, Any] = {"offered": 0, "sent": 0, "completed": 0, "dropped": 0, "errors": {}}
    for name in PHASE_NAMES:
        c = summary["phases"][name]["counts"]
        for k in ("offered", "sent", "completed", "dropped"):
            out[k] += c.get(k, 0)
        for e, n in c.get("errors", {}).items():
            out["errors"][e] = out["errors"].get(e, 0) + n
    return out


def measured_block(summary: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The steady block, or the cold block when every request opened a session (sessions=per_request)."""
    if summary["counts"]["sent"]:
        return "steady", {"counts": summary["counts"], "latency_ms": summary["latency_ms"]}
    return "cold", summary["phases"]["cold"]


def lat(block: dict[str, Any], metric: str, q: str = "p50") -> float | None:
    v = block["latency_ms"].get(metric, {})
    return v.get(q) if v.get("n") else None


def peak_inflight(res: RunResult) -> int:
    """Most requests in flight at once on the client side ([t_send, t_end] overlaps)."""
    c = res.records.cols
    ev: list[tuple[int, int]] = []
    for i in range(res.records.n):
        if c["t_send"][i]:
            ev.append((c["t_send"][i], 1))
            ev.append((c["t_end"][i] or c["t_send"][i], -1))
    ev.sort(key=lambda x: (x[0], x[1]))
    cur = peak = 0
    for _, d in ev:
        cur += d
        peak = max(peak, cur)
    return peak


def error_classes() -> Sequence[str]:
    return ERRORS[1:]


SessionPolicy = Literal["pool", "shared", "per_request"]
