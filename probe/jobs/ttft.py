"""`ttft`: time to first token of a streaming request, sample by sample, with the cold request apart.

Semantics (docs/job-kinds.md#ttft). Per request, from just before it is written (t_send):
headers_ms (status line + headers), first_event_ms (first SSE event of any kind — a role-only chunk
counts), ttft_ms (first event carrying generated output), ttfc_ms (first user-visible content),
total_ms ([DONE] / end of body). The seed reported the first chunk as TTFT even when it was an empty
role chunk sent before any work; here TTFT is the first *output* event and the others are reported apart.

session = per_job: one new session; its first request is the cold request (reported as `cold`, never a
sample), then `warmup` discarded requests, then `samples` warm samples. per_sample: every sample opens a
new session, so every sample is a cold-session TTFT (findings say so).
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from pydantic import Field

from csbench.probe.engine.stats import nearest_rank
from csbench.probe.jobs import JobContext
from csbench.probe.jobs.common import (
    Client,
    RequestParams,
    Sample,
    new_session_id,
    observation,
    p50,
    parse_params,
    run_entry,
    sample_summary,
)
from csbench.probe.protocol import Phase

KIND = "ttft"


class TtftParams(RequestParams):
    samples: int = Field(default=5, ge=1, le=10_000)
    warmup: int = Field(default=1, ge=0, le=1000)
    session: Literal["per_job", "per_sample"] = "per_job"


def findings(cold: Sample | None, samples: list[Sample], per_sample: bool) -> dict[str, Any]:
    """Headline values (ms) from measured samples. Pure."""
    ok = [s for s in samples if s.ok]
    ttft = sorted(s.ttft_ms for s in ok if s.ttft_ms is not None)
    out: dict[str, Any] = {
        "ttft_p50_ms": p50(ttft),
        "ttft_p90_ms": ttft[max(0, math.ceil(0.9 * len(ttft)) - 1)] if ttft else None,
        "ttft_max_ms": ttft[-1] if ttft else None,
        "first_event_p50_ms": p50(s.first_event_ms for s in ok),
        "headers_p50_ms": p50(s.headers_ms for s in ok),
        "first_content_p50_ms": p50(s.ttfc_ms for s in ok),
        "e2e_p50_ms": p50(s.total_ms for s in ok),
        # > 0 when the platform sends status/role events before any output (the seed's quirk).
        "first_event_to_first_token_p50_ms": p50(
            s.ttft_ms - s.first_event_ms for s in ok if s.ttft_ms is not None and s.first_event_ms is not None),
        "samples_ok": len(ok),
        "samples_failed": len(samples) - len(ok),
        "samples_are_cold": per_sample,
        "cold_ttft_ms": cold.ttft_ms if cold is not None and cold.ok else None,
        "cold_penalty_ms": None,
    }
    if out["cold_ttft_ms"] is not None and out["ttft_p50_ms"] is not None and not per_sample:
        out["cold_penalty_ms"] = out["cold_ttft_ms"] - out["ttft_p50_ms"]
    return out


async def run_ttft(ctx: JobContext) -> dict[str, Any]:
    p = parse_params(TtftParams, ctx.params, KIND)
    per_sample = p.session == "per_sample"
    total = p.samples + p.warmup + (0 if per_sample else 1)
    if total > ctx.spec.limits.max_requests:
        raise ValueError(f"{KIND}: {total} requests (samples + warmup + cold) exceed limits.max_requests "
                         f"({ctx.spec.limits.max_requests})")
    job_session = new_session_id("ttft")
    cold: Sample | None = None
    samples: list[Sample] = []
    async with Client(ctx.spec.target, p, limit=1) as client:
        if not per_sample:
            ctx.progress(Phase.warmup, 0, p.samples)
            cold = await client.request(job_session)
            await ctx.telemetry.write("samples", {**cold.to_dict(), "role": "cold"})
        for i in range(p.warmup + p.samples):
            warm = i < p.warmup
            ctx.progress(Phase.warmup if warm else Phase.measuring, max(0, i - p.warmup), p.samples)
            s = await client.request(new_session_id("ttft") if per_sample else job_session)
            await ctx.telemetry.write("samples", {**s.to_dict(), "role": "warmup" if warm else "sample",
                                                  "index": i})
            if not warm:
                samples.append(s)
    ctx.progress(Phase.finishing, p.samples, p.samples)
    summary = sample_summary(samples)
    if not summary["counts"]["completed"]:
        first = next((s.error_detail for s in samples if s.error_detail), "")
        raise RuntimeError(f"all {p.samples} samples failed: {summary['counts']['errors']}; first: {first}")
    runs = [run_entry("samples", summary)]
    if cold is not None:
        runs.insert(0, run_entry("cold", sample_summary([cold])))
    return observation(KIND, p, runs, findings(cold, samples, per_sample),
                       samples=[s.to_dict() for s in samples])


# -- small helpers kept for tests/test_carrier.py (jobs use the engine's SseFramer) --------------------------
def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile: an actual sample, never an interpolation (the engine's definition)."""
    return nearest_rank(sorted_values, q)


class SseParser:
    """Minimal text/event-stream framing: events end at a blank line; `data:` lines are joined with \\n."""

    def __init__(self) -> None:
        self._buf = ""

    def feed(self, chunk: bytes) -> list[str]:
        self._buf += chunk.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
        events = []
        while "\n\n" in self._buf:
            raw, self._buf = self._buf.split("\n\n", 1)
            data = [line[5:].removeprefix(" ") for line in raw.split("\n") if line.startswith("data:")]
            if data:
                events.append("\n".join(data))
        return events


def token_of(event: str) -> str:
    """The content text an OpenAI chunk carries ('' for role-only, usage and finish chunks)."""
    doc = json.loads(event)
    for choice in doc.get("choices") or []:
        content = (choice.get("delta") or {}).get("content")
        if content:
            return str(content)
    return ""
