"""The measurement engine every job kind uses: build requests, drive a load model, time every request on
one monotonic clock, check the generator itself, and summarise with exact statistics.

Map (read in this order): `requests` (what is sent) → `sse` (how a stream is framed and classified) →
`records` (columnar per-request storage) → `client` (one request, all timestamps) → `load` (pure schedules)
→ `monitor` (loop lag, CPU, GC) → `stats` (percentiles, CIs, HDR) → `selfcheck` (is the generator
trustworthy?) → `summary` (the JSON contract) → `run` (run_load, run_load_multiprocess).
Definitions: docs/measurement.md and /work/shared/reference/load_anchors.md §4.
"""

from __future__ import annotations

from csbench.probe.engine.load import LoadSpec
from csbench.probe.engine.run import PhasePlan, RunResult, run_load, run_load_multiprocess

__all__ = ["LoadSpec", "PhasePlan", "RunResult", "run_load", "run_load_multiprocess"]
