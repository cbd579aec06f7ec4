"""run_load_multiprocess: two spawned worker processes share one monotonic start; records merge exactly."""

from __future__ import annotations

import asyncio
from typing import Any

import requests

from csbench.probe.engine import LoadSpec, PhasePlan, run_load_multiprocess
from csbench.probe.engine.load import arrivals
from csbench.probe.engine.run import clamp, split_load
from csbench.probe.engine.stats import hdr_merge
from csbench.probe.protocol import Limits, Target


def test_two_processes_merge_counts_exactly(make_cloud: Any) -> None:
    base = make_cloud(services=["agentrun"], config={"agentrun": {"ttft": 0.01, "inter_token": 0.0,
                                                                  "output_tokens": 2}}).endpoints["agentrun"]  # fmt: skip
    load = LoadSpec(model="poisson", rate=60, warmup_s=0.3, duration_s=1.5, seed=5)
    lim = Limits()
    res = asyncio.run(run_load_multiprocess(Target(url=base), load, processes=2, limits=lim,
                                            phases=PhasePlan(sessions="pool", pool_size=2)))  # fmt: skip
    eff, _ = clamp(load, lim)
    expected = sum(len(arrivals(split_load(eff, 2, k))) for k in range(2))
    s = res.summary()
    assert res.records.n == expected and len(set(res.extra["process_pids"])) == 2
    assert sorted(set(res.records.process)) == [0, 1]
    total = sum(ph["counts"]["offered"] for ph in s["phases"].values())
    assert total == expected == sum(ph["counts"]["completed"] for ph in s["phases"].values())
    server = requests.get(base + "/-/stats", timeout=5).json()
    assert requests.get(base + "/-/requests", params={"limit": 1000}, timeout=5).json()["records"]
    assert len(set(res.records.server_id)) == expected, server
    # one common start: both processes' first intended times are within the first second of the epoch
    assert s["selfcheck"]["verdict"] in ("valid", "warn", "invalid") and len(s["selfcheck"]["windows"]) == 2
    assert s["latency_ms"]["ttft"]["n"] == s["counts"]["completed"]
    assert hdr_merge([s["hdr"]["ttft"], s["hdr"]["ttft"]]) is not None
