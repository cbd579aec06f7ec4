"""Registry of job kinds: name → `async def run(ctx: JobContext) -> dict` (the Result's observations).

A job runs as its own asyncio task. It reports progress through `ctx.progress(...)` (the carrier writes it
at a bounded rate), writes raw records through `ctx.telemetry`, and must be cancellable: it is cancelled
with asyncio's CancelledError on a cancel signal, a stop past the drain bound, or its timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from csbench.probe.protocol import JobSpec, Phase
from csbench.probe.telemetry import TelemetryWriter


@dataclass
class ProgressSnapshot:
    phase: Phase = Phase.starting
    completed: int = 0
    total: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    version: int = 0  # bumped on every report, so the carrier writes only when something changed


@dataclass
class JobContext:
    spec: JobSpec
    attempt: int
    carrier_id: str
    telemetry: TelemetryWriter
    snapshot: ProgressSnapshot = field(default_factory=ProgressSnapshot)
    started_mono: float = field(default_factory=time.monotonic)

    @property
    def params(self) -> dict[str, Any]:
        return self.spec.params

    def progress(self, phase: Phase, completed: int = 0, total: int | None = None, **metrics: float) -> None:
        s = self.snapshot
        s.phase, s.completed, s.total, s.metrics = phase, completed, total, dict(metrics)
        s.version += 1


JobFn = Callable[[JobContext], Coroutine[Any, Any, dict[str, Any]]]


async def run_sleep(ctx: JobContext) -> dict[str, Any]:
    """Diagnostic kind: wait `seconds` (default 1), reporting progress each second; `fail` = raise that message.

    Lets the carrier loop be exercised (drain, cancel, kill, timeout) without a target.
    """
    seconds = float(ctx.params.get("seconds", 1.0))
    steps = max(1, int(seconds))
    for i in range(steps):
        ctx.progress(Phase.measuring, completed=i, total=steps)
        await asyncio.sleep(seconds / steps)
    if ctx.params.get("fail"):
        raise RuntimeError(str(ctx.params["fail"]))
    ctx.progress(Phase.finishing, completed=steps, total=steps)
    await ctx.telemetry.write("events", {"slept_s": seconds})
    return {"slept_s": seconds}


KINDS = (
    "ttft", "startup_curve", "sustained_load", "soak", "warm_retention", "idle_timeout_honor", "rate_limit",
    "concurrency_ceiling", "cancellation", "scaling", "hol_blocking", "fault_recovery", "retry_storm",
)  # fmt: skip


def registry() -> dict[str, JobFn]:
    """Every job kind the carrier runs: the diagnostic `sleep` and the thirteen (docs/job-kinds.md)."""
    import importlib

    kinds: dict[str, JobFn] = {"sleep": run_sleep}
    for kind in KINDS:
        module = importlib.import_module(f"csbench.probe.jobs.{kind}")
        kinds[kind] = getattr(module, f"run_{kind}")
    return kinds
