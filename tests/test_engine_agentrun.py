"""Measurement engine against the localcloud AgentRun target, whose ground-truth records carry the
server's perf_counter_ns stamps on the same host clock. The target runs in a thread of this process
(one GIL), so accuracy bounds here are generous; the bench prints the real figures."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import requests

from csbench.probe.engine import LoadSpec, PhasePlan, run_load
from csbench.probe.engine.summary import metric_values
from csbench.probe.protocol import Limits, Target

MS = 1e-6


@pytest.fixture
def agentrun(make_cloud: Any) -> Any:
    def _make(**config: Any) -> str:
        return make_cloud(services=["agentrun"], config={"agentrun": config}).endpoints["agentrun"]

    return _make


def ground_truth(base: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    since = 0
    while True:
        page = requests.get(base + "/-/requests", params={"since": since, "limit": 1000}, timeout=10).json()
        for rec in page["records"]:
            out[rec["request_id"]] = rec
        if not page["records"]:
            return out
        since = page["records"][-1]["seq"]


def test_open_loop_recovers_ttft_against_ground_truth(agentrun: Any) -> None:
    base = agentrun(ttft=0.02, inter_token=0.002, output_tokens=8)
    load = LoadSpec(model="poisson", rate=40, warmup_s=0.5, duration_s=2.5, seed=11)
    res = asyncio.run(run_load(Target(url=base), load))
    s = res.summary()
    truth = ground_truth(base)
    c = res.records.cols
    lag, arrive = [], []
    for i in range(res.records.n):
        rec = truth[res.records.server_id[i]]
        assert rec["outcome"] == "ok" and c["t_first_token"][i]
        lag.append((c["t_first_token"][i] - rec["first_token_ns"]) * MS)  # observation delay
        arrive.append((rec["arrival_ns"] - c["t_send"][i]) * MS)  # send → server arrival
    lag.sort()
    p50, p99 = lag[len(lag) // 2], lag[int(len(lag) * 0.99)]
    print(f"\nTTFT observation delay vs ground truth: p50 {p50:.3f} ms, p99 {p99:.3f} ms, n={len(lag)}; "
          f"send→arrival p50 {sorted(arrive)[len(arrive) // 2]:.3f} ms; ttft p50 {s['latency_ms']['ttft']['p50']:.2f} ms; "
          f"selfcheck {s['selfcheck']['verdict']} {s['selfcheck']['reasons']}")  # fmt: skip
    assert -0.5 < p50 < 2.0, lag
    # The server stamps after write() returned; sharing one GIL with us, it can be descheduled in between.
    assert min(lag) > -3.0
    ttft = s["latency_ms"]["ttft_service"]
    assert 20 <= ttft["p50"] < 26, ttft
    assert s["counts"]["errors"] == {} and s["counts"]["completed"] == s["counts"]["sent"] > 60
    assert s["latency_ms"]["tpot"]["p50"] == pytest.approx(2.0, abs=1.0)
    assert s["phases"]["cold"]["counts"]["offered"] == 8  # one per pooled session, never in steady
    assert all(res.records.row(i)["token_source"] == "usage" for i in range(3))
    json.dumps(s)  # the summary is plain JSON


def test_coordinated_omission_open_vs_closed_around_a_stall(agentrun: Any) -> None:
    lim = Limits(max_concurrency=300, max_rate_per_s=1000)

    async def stalled(load: LoadSpec) -> dict[str, Any]:
        base = agentrun(ttft=0.005, inter_token=0.0, output_tokens=2)  # a fresh target per run
        requests.post(base + "/-/stall", json={"duration_s": 1.0, "delay_s": 0.8}, timeout=5)
        return (await run_load(Target(url=base), load, limits=lim)).summary()

    open_s = asyncio.run(stalled(LoadSpec(model="poisson", rate=100, duration_s=3.0, seed=2)))
    closed_s = asyncio.run(stalled(LoadSpec(model="closed", concurrency=4, duration_s=3.0)))
    o, cl = open_s["latency_ms"], closed_s["latency_ms"]
    print(
        f"\nopen loop ttft p99 {o['ttft']['p99']:.1f} ms (from intended), closed loop ttft_service p99 "
        f"{cl['ttft_service']['p99']:.1f} ms (n={cl['ttft_service']['n']}), closed max {cl['ttft_service']['max']:.0f}"
    )
    assert o["ttft"]["p99"] >= 800  # the stall is visible when latency is anchored at the intended time
    assert cl["ttft_service"]["p99"] < 100  # a closed loop hides it (coordinated omission)
    assert cl["ttft_service"]["max"] >= 800, closed_s["timeseries"]  # …though the stall did happen to it


@pytest.mark.parametrize("fmt", ["seconds", "http-date"])
def test_429_with_retry_after_classified(agentrun: Any, fmt: str) -> None:
    base = agentrun(ttft=0.0, inter_token=0.0, output_tokens=1, rate_limit_rps=2, rate_limit_burst=3,
                    retry_after={"format": fmt, "seconds": 5})  # fmt: skip
    res = asyncio.run(run_load(Target(url=base), LoadSpec(model="burst", burst_size=10, duration_s=0.5),
                               phases=PhasePlan(sessions="shared")))  # fmt: skip
    s = res.summary()
    errors = {**s["phases"]["cold"]["counts"]["errors"], **s["counts"]["errors"]}
    n429 = sum(ph["counts"]["errors"].get("http_429", 0) for ph in s["phases"].values())
    assert n429 == 7 and set(errors) == {"http_429"}, s["phases"]
    assert len(s["retry_after_s"]) == 7
    assert all(3.5 <= x <= 6.0 for x in s["retry_after_s"]), s["retry_after_s"]  # HTTP-date: 1 s resolution
    rows = [res.records.row(i) for i in range(res.records.n)]
    assert sorted(r["status"] for r in rows) == [200] * 3 + [429] * 7


def test_cold_start_is_tagged_apart(agentrun: Any) -> None:
    base = agentrun(cold_start=0.3, ttft=0.01, inter_token=0.0, output_tokens=2)
    load = LoadSpec(model="constant", rate=20, warmup_s=0.5, duration_s=1.0)
    s = asyncio.run(
        run_load(Target(url=base), load, phases=PhasePlan(sessions="pool", pool_size=2))
    ).summary()
    cold = s["phases"]["cold"]
    assert cold["counts"]["offered"] == 2 and cold["latency_ms"]["ttft"]["min"] >= 300
    assert s["latency_ms"]["ttft"]["max"] < 200  # steady: warm sessions only
    assert s["counts"]["offered"] == 20


def test_limits_clamp_and_are_reported(agentrun: Any) -> None:
    base = agentrun(ttft=0.0, inter_token=0.0, output_tokens=1)
    lim = Limits(max_concurrency=2, max_rate_per_s=20, max_requests=15)
    res = asyncio.run(
        run_load(Target(url=base), LoadSpec(model="constant", rate=500, duration_s=1.0), limits=lim)
    )
    s = res.summary()
    assert {c["param"]: c["used"] for c in s["load"]["clamps"]} == {"rate": 20}
    assert s["load"]["rate"] == 20 and res.records.n == 15  # 20 slots in 1 s, max_requests 15
    closed = asyncio.run(run_load(Target(url=base), LoadSpec(model="closed", concurrency=50, duration_s=2.0),
                                  limits=lim))  # fmt: skip
    cs = closed.summary()
    assert {c["param"] for c in cs["load"]["clamps"]} == {"concurrency"} and cs["load"]["concurrency"] == 2
    assert closed.records.n == 15  # max_requests
    sends = sorted(closed.records.t_send[: closed.records.n])
    assert (sends[-1] - sends[0]) * MS >= 14 * 50 * 0.9  # paced at ≤ 20/s even though a closed loop
    assert len(ground_truth(base)) == 30


class FakeTelemetry:
    def __init__(self) -> None:
        self.records: list[tuple[str, dict[str, Any]]] = []

    async def write(self, stream: str, record: dict[str, Any]) -> None:
        self.records.append((stream, record))


def test_telemetry_records_and_credentials_never_recorded(agentrun: Any) -> None:
    base = agentrun(api_key="sekrit-key", ttft=0.0, inter_token=0.0, output_tokens=3)
    tel = FakeTelemetry()
    target = Target(url=base, credential_ref="agentrun-key")
    res = asyncio.run(run_load(target, LoadSpec(model="constant", rate=20, duration_s=0.5), telemetry=tel,
                               credential_resolver=lambda ref: {"Authorization": "Bearer sekrit-key"}))  # fmt: skip
    assert len(tel.records) == res.records.n == 10 and {s for s, _ in tel.records} == {"requests"}
    blob = json.dumps([r for _, r in tel.records])
    assert "sekrit" not in blob and "Authorization" not in blob
    assert all(r["status"] == 200 and r["output_tokens"] == 3 for _, r in tel.records)
    assert metric_values(res.records, range(res.records.n), "e2e")  # all OK
    bad = asyncio.run(run_load(target, LoadSpec(model="constant", rate=5, duration_s=0.2),
                               credential_resolver=lambda ref: {"Authorization": "Bearer wrong"}))  # fmt: skip
    assert bad.summary()["phases"]["cold"]["counts"]["errors"] == {"http_4xx": 1}
