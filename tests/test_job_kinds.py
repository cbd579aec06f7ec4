"""The thirteen job kinds against the localcloud AgentRun target and mock-tool server: each kind's
findings must match the ground truth configured on the target. Pure `findings(...)` functions and param
validation are tested without a network first. Durations are short on purpose (2 shared cores)."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone
from typing import Any

import pytest

from csbench.probe.jobs import KINDS, JobContext, registry
from csbench.probe.jobs.common import Sample, parse_params
from csbench.probe.protocol import JobSpec, Limits, Target

NOW = datetime(2025, 1, 1, tzinfo=timezone.utc)


class FakeTelemetry:
    def __init__(self) -> None:
        self.records: dict[str, list[dict[str, Any]]] = {}

    async def write(self, stream: str, record: dict[str, Any]) -> None:
        json.dumps(record, default=str)  # must be encodable, like the real writer's NDJSON
        self.records.setdefault(stream, []).append(record)


def run_kind(kind: str, params: dict[str, Any], url: str, limits: Limits | None = None,
             **target: Any) -> dict[str, Any]:
    spec = JobSpec(job_id="j1", campaign_uid="c1", probe=kind, params=params, target=Target(url=url, **target),
                   limits=limits or Limits(), timeout_s=60, created_at=NOW)
    ctx = JobContext(spec=spec, attempt=1, carrier_id="t", telemetry=FakeTelemetry())
    obs = asyncio.run(registry()[kind](ctx))
    json.dumps(obs)  # a Result's observations are plain JSON
    assert obs["kind"] == kind and obs["verdict"] in ("valid", "warn", "invalid")
    assert set(obs) >= {"params", "runs", "findings", "verdict", "verdict_reasons"}
    for r in obs["runs"]:
        assert set(r) >= {"label", "level", "summary"} and "counts" in r["summary"]
    return obs


@pytest.fixture
def cloud(make_cloud: Any) -> Any:
    """make(**agentrun_config) → (agentrun url, mocktool url)."""

    def _make(**config: Any) -> tuple[str, str]:
        c = make_cloud(services=["agentrun", "mocktool"], config={"agentrun": config})
        return c.endpoints["agentrun"], c.endpoints["mocktool"]

    return _make


def S(**kw: Any) -> Sample:  # noqa: N802 (a tiny factory)
    return Sample(session_id="s", **kw)


# -- registry and params ------------------------------------------------------------------------------------
def test_every_kind_is_registered_and_rejects_unknown_params() -> None:
    reg = registry()
    assert set(KINDS) <= set(reg) and len(KINDS) == 13
    for kind in KINDS:
        with pytest.raises(ValueError, match=r"unknown params \['max_window_s', 'warmup_x'\]"):
            run_kind(kind, {"warmup_x": 1, "max_window_s": 3}, "http://127.0.0.1:9")


def test_params_are_validated_with_the_field_named() -> None:
    from csbench.probe.jobs.ttft import TtftParams

    with pytest.raises(ValueError, match="ttft: invalid params: samples"):
        parse_params(TtftParams, {"samples": 0}, "ttft")
    assert parse_params(TtftParams, {"samples": 3}, "ttft").samples == 3



# -- pure findings (no network) -----------------------------------------------------------------------------
def test_wake_classification_thresholds() -> None:
    from csbench.probe.jobs.idle import Thresholds, classify_wake

    th = Thresholds(cold_ms=1000, deep_factor=3, deep_min_extra_ms=20)
    assert classify_wake(1000, 10, th) == "cold" and classify_wake(None, 10, th) == "failed"
    assert classify_wake(31, 10, th) == "deep" and classify_wake(24, 5, th) == "shallow"  # 20 ms floor
    assert classify_wake(29, 10, th) == "shallow"


def test_cancellation_needs_server_evidence() -> None:
    from csbench.probe.jobs.cancellation import classify_attempt

    aborted, follow = S(error="aborted", aborted_ms=5.0, t_end_ns=100), S(ok=True, total_ms=3.0)
    rec = {"outcome": "disconnected", "disconnect_ns": 2_000_100, "tokens_planned": 50, "tokens_sent": 3}
    a = classify_attempt(aborted, follow, rec, True)
    assert a["honoured"] and a["server_ended_early"] and a["server_notice_ms"] == pytest.approx(2.0)
    assert classify_attempt(aborted, follow, {**rec, "outcome": "ok"}, True)["honoured"] is False
    assert classify_attempt(aborted, follow, None, False)["honoured"] is None  # nothing to prove it with
    assert classify_attempt(S(ok=True), follow, {"outcome": "ok"}, True)["result"] == "not_aborted"


def test_ceiling_bracket_and_bisection() -> None:
    from csbench.probe.jobs.concurrency_ceiling import bracket, level_row, next_probe

    ok = {"sent": 0, "completed": 0, "errors": {}}
    rows = [level_row(4, {**ok, "sent": 4, "completed": 4}, 4, 0.0),
            level_row(16, {"sent": 16, "completed": 10, "errors": {"http_429": 6}}, 16, 0.0)]
    assert bracket(rows) == (4, 16) and next_probe(rows) == 10
    # a level whose requests never overlapped proves nothing
    assert not level_row(8, {**ok, "sent": 8, "completed": 8}, 3, 0.0)["passed"]


def test_rate_onset_and_retry_storm_rules() -> None:
    from csbench.probe.jobs.rate_limit import onset, step_row
    from csbench.probe.jobs.retry_storm import findings as storm

    rows = [step_row(5, {"sent": 50, "completed": 50, "errors": {}}),
            step_row(10, {"sent": 100, "completed": 99, "errors": {"http_429": 1}}),
            step_row(20, {"sent": 200, "completed": 150, "errors": {"http_429": 50}})]
    assert onset(rows, 0.01) == (20, 10) and onset(rows, 0.0) == (10, 5)
    answer = {"ok": False, "attempts": 3}
    assert storm(3, 3, 2, S(ok=True, total_ms=500), answer, None)["storm_bounded_by"] == "agent"
    assert storm(3, 5, 2, S(ok=True, total_ms=500), answer, None)["storm_bounded_by"] == "none"  # kept coming
    assert storm(2, 2, 2, S(error="total_timeout", total_ms=500), None, None)["storm_bounded_by"] == "platform"


def test_curve_soak_and_scaling_findings() -> None:
    from csbench.probe.jobs.scaling import findings as scaling
    from csbench.probe.jobs.soak import windows
    from csbench.probe.jobs.startup_curve import curve_findings

    c = curve_findings([900.0, 160.0, 100.0, 100.0, 100.0], 1.5)
    assert c["warm_steady_ms"] == 100 and c["cold_penalty_ms"] == 800 and c["calls_to_warm"] == 3
    w = windows([(0.1, True, 5.0), (0.5, False, None), (1.2, True, 7.0)], 2.0, 1.0)
    assert [x["availability"] for x in w] == [0.5, 1.0] and w[1]["ttft_p50_ms"] == 7.0
    pts = [{"concurrency": n, "throughput_per_s": x, "success_rate": 1.0, "ttft_p50_ms": t}
           for n, x, t in ((1, 10.0, 50.0), (4, 38.0, 55.0), (16, 39.0, 180.0))]
    f = scaling(pts, "per_worker")
    assert f["saturation_concurrency"] == 4 and f["knee_concurrency"] == 16
    assert f["points"][1]["scaling_efficiency"] == pytest.approx(0.95)


# -- sequential kinds ---------------------------------------------------------------------------------------
def test_ttft_reports_first_token_apart_from_first_event_and_cold(cloud: Any) -> None:
    url, _ = cloud(cold_start=0.15, ttft=0.03, inter_token=0.001, role_chunk="with_headers")
    obs = run_kind("ttft", {"samples": 4, "warmup": 1}, url)
    f = obs["findings"]
    assert [r["label"] for r in obs["runs"]] == ["cold", "samples"]
    assert 30 <= f["ttft_p50_ms"] < 45, f
    # the role chunk comes with the headers: the first event is not the first token
    assert f["first_event_p50_ms"] < 10 and f["first_event_to_first_token_p50_ms"] > 20
    assert f["cold_ttft_ms"] == pytest.approx(180, abs=25) and f["cold_penalty_ms"] == pytest.approx(150, abs=25)
    assert obs["runs"][1]["summary"]["counts"]["completed"] == 4 and not f["samples_are_cold"]


def test_startup_curve_cold_start_matches_config(cloud: Any) -> None:
    url, _ = cloud(cold_start=0.2, ttft=0.01)
    obs = run_kind("startup_curve", {"n_calls": 4, "sessions": 2}, url)
    f = obs["findings"]
    assert f["cold_start_ms"] == pytest.approx(200, abs=30), f
    assert f["calls_to_warm_max"] == 2 and len(f["curves_ms"]) == 2 and obs["verdict"] == "valid"
    assert obs["runs"][0]["summary"]["counts"]["sent"] == 2  # cold calls summarised apart


def test_warm_retention_classifies_gaps_against_the_idle_timeout(cloud: Any) -> None:
    url, _ = cloud(cold_start=0.2, ttft=0.01, session_idle_timeout_s=0.5)
    obs = run_kind("warm_retention", {"idle_gaps_s": [0.1, 0.9, 1.5], "cold_threshold_ms": 150,
                                      "platform_idle_timeout_s": 0.5, "ground_truth_url": url}, url)
    f = obs["findings"]
    assert [t["tier"] for t in f["tiers"]] == ["shallow", "cold"], f["tiers"]  # stop_on_cold
    assert f["shallow_retention_s"] == 0.1 and f["cold_onset_s"] == 0.9 and not f["keeps_warm"]
    assert f["gaps_beyond_idle_timeout_s"] == [0.9] and f["server_agrees"] is True
    warm = next(r for r in obs["runs"] if r["label"] == "warm")["summary"]
    assert warm["latency_ms"]["ttft"]["max"] < 150  # the cold wake never enters the warm baseline


def test_idle_timeout_honor(cloud: Any) -> None:
    url, _ = cloud(cold_start=0.2, ttft=0.01, session_idle_timeout_s=0.5)
    obs = run_kind("idle_timeout_honor", {"session_idle_timeout_s": 0.5, "decay_gaps_s": [0.9],
                                          "cold_threshold_ms": 150, "ground_truth_url": url}, url)
    f = obs["findings"]
    assert f["promise_idle_s"] == 0.4 and f["promise_tier"] == "shallow" and f["honored"]
    assert f["expiry_observed_s"] == 0.9 and f["expires_after_timeout"] and f["server_agrees"]
    with pytest.raises(ValueError, match="promise_idle_s"):
        run_kind("idle_timeout_honor", {"session_idle_timeout_s": 0.5, "promise_idle_s": 0.6}, url)


def test_cancellation_is_honoured_only_when_the_server_recorded_it(cloud: Any) -> None:
    url, _ = cloud(ttft=0.02, inter_token=0.01, output_tokens=200, output_tokens_from_request=True)
    obs = run_kind("cancellation", {"attempts": 2, "ground_truth_url": url}, url)
    f = obs["findings"]
    assert f["honoured"] is True and f["aborted_attempts"] == 2 and f["followup_ok_all"]
    assert f["server_ended_early_all"] is True and f["server_evidence"] == "ground_truth_records"
    assert all(d["server_outcome"] == "disconnected" for d in f["details"])
    # Without server-side records nothing is assumed.
    blind = run_kind("cancellation", {"attempts": 1}, url)["findings"]
    assert blind["honoured"] is None and blind["aborted_attempts"] == 1 and blind["not_provable"]
    # A request that finished before the abort was not cancelled: never "honoured".
    fast, _ = cloud(ttft=0.001, inter_token=0.0, output_tokens=2)
    done = run_kind("cancellation", {"attempts": 1, "abort_at": "after_ms", "abort_after_ms": 300,
                                     "ground_truth_url": fast}, fast)
    assert done["findings"]["honoured"] is None and done["findings"]["details"][0]["result"] == "not_aborted"
    assert done["verdict"] == "warn"


AGENT = {"agent": {"backoff_ms": 20, "max_retries": 2}, "ttft": 0.005}


def test_fault_recovery_attempts_are_failures_plus_one(cloud: Any) -> None:
    url, mock = cloud(**AGENT)
    f = run_kind("fault_recovery", {"mock_base_url": mock, "failures": 2}, url)["findings"]
    assert f["recovered"] and f["observed_attempts"] == 3 == f["agent_reported_attempts"] and f["attempts_match"]
    assert f["retry_overhead_ms"] >= 2 * 20 - 5
    # More failures than the agent retries: no recovery, attempts bounded by the agent's policy.
    f = run_kind("fault_recovery", {"mock_base_url": mock, "failures": 5}, url)["findings"]
    assert not f["recovered"] and f["observed_attempts"] == 3 and f["final_tool_status"] == 500


def test_retry_storm_is_bounded_by_the_agents_retry_limit(cloud: Any) -> None:
    url, mock = cloud(**AGENT)
    f = run_kind("retry_storm", {"mock_base_url": mock, "settle_s": 0.3}, url)["findings"]
    assert f["total_attempts"] == 3 and f["storm_bounded_by"] == "agent" and f["attempts_after_answer"] == 0
    assert f["retry_gap_ms"] and min(f["retry_gap_ms"]) >= 15
    # An agent retrying more than its declared limit is a storm.
    url2, mock2 = cloud(agent={"backoff_ms": 5, "max_retries": 6})
    f = run_kind("retry_storm", {"mock_base_url": mock2, "settle_s": 0.2, "agent_retry_limit": 2}, url2)["findings"]
    assert f["total_attempts"] == 7 and f["storm_bounded_by"] == "none"


def test_hol_blocking_reflects_the_injected_latency(cloud: Any) -> None:
    url, mock = cloud(**AGENT)
    obs = run_kind("hol_blocking", {"mock_base_url": mock, "fast_count": 5, "slow_latency_ms": 300}, url)
    f = obs["findings"]
    assert f["slow_reflects_injection"] and 300 <= f["slow_call_ms"] < 450
    # localcloud runs a session's requests independently: no head-of-line blocking
    assert not f["serialized"] and f["blocked_fraction"] == 0 and f["hol_ratio"] < 2
    assert obs["verdict"] == "valid"


# -- load kinds (measurement engine) --------------------------------------------------------------------------
def test_sustained_load_is_open_loop_at_the_target_rate(cloud: Any) -> None:
    url, _ = cloud(ttft=0.02, inter_token=0.001, output_tokens=4)
    obs = run_kind("sustained_load", {"target_rps": 40, "duration_s": 2.0, "warmup_s": 0.5,
                                      "arrival": "constant"}, url)
    f = obs["findings"]
    assert f["achieved_send_rate_per_s"] == pytest.approx(40, rel=0.05) and f["rate_realization"] > 0.95
    assert f["requests"] == 80 and f["error_rate"] == 0 and f["latency_anchor"] == "intended"
    assert 20 <= f["ttft_p50_ms"] < 35 and obs["runs"][0]["level"] == {"rate": 40}
    assert obs["runs"][0]["summary"]["selfcheck"]["verdict"] == obs["verdict"] or obs["verdict_reasons"]


def test_soak_counts_availability_per_window(cloud: Any) -> None:
    url, _ = cloud(ttft=0.005, output_tokens=2, failures=[{"requests": [10, 11], "status": 503}])
    f = run_kind("soak", {"rate_per_s": 20, "duration_s": 2.0, "window_s": 1.0}, url)["findings"]
    n = f["requests"]
    assert n == 40  # every request of the window, the 4 pooled sessions' cold first requests included
    assert f["achieved_send_rate_per_s"] == pytest.approx(20, rel=0.05)  # the held rate reads as held
    assert sum(f["errors"].values()) == 2 and f["availability"] == pytest.approx((n - 2) / n)
    assert len(f["windows"]) == 2 and f["windows_with_errors"] >= 1 and f["min_window_availability"] < 1


def test_rate_limit_reports_onset_as_a_rate_and_as_a_concurrency(cloud: Any) -> None:
    # token bucket: 20/s, burst 20; Retry-After as an HTTP-date
    url, _ = cloud(ttft=0.005, output_tokens=2, rate_limit_rps=20, retry_after={"format": "http-date"})
    obs = run_kind("rate_limit", {"rate_steps": [8, 60], "step_duration_s": 1.0, "burst_levels": [10, 40],
                                  "step_gap_s": 1.2}, url)
    f = obs["findings"]
    assert f["max_unthrottled_rate_per_s"] == 8 < 20 <= f["throttle_onset_rate_per_s"] == 60
    assert f["max_unthrottled_concurrency"] == 10 < 20 <= f["throttle_onset_concurrency"] == 40
    assert f["burst_levels"][-1]["http_429"] == 20  # 40 at once, 20 tokens
    assert f["retry_after_s"]["n"] > 0 and 0 <= f["retry_after_s"]["max"] <= 3 and f["retry_after_honest"]
    assert [r["level"] for r in obs["runs"]] == [{"rate": 8}, {"rate": 60}, {"concurrency": 10}, {"concurrency": 40}]
    # delta-seconds Retry-After, bursts only
    url2, _ = cloud(ttft=0.005, output_tokens=2, rate_limit_rps=5, retry_after={"seconds": 2})
    f2 = run_kind("rate_limit", {"rate_steps": [], "burst_levels": [10], "max_retry_wait_s": 0}, url2)["findings"]
    assert f2["throttle_onset_concurrency"] == 10 and f2["throttle_onset_rate_per_s"] is None
    assert f2["retry_after_s"] == {"n": 5, "p50": 2.0, "max": 2.0}


def test_concurrency_ceiling_brackets_the_configured_ceiling(cloud: Any) -> None:
    url, _ = cloud(ttft=0.15, output_tokens=2, max_concurrency=6)
    obs = run_kind("concurrency_ceiling", {"levels": [2, 4, 8], "level_gap_s": 0.2}, url)
    f = obs["findings"]
    assert f["last_passing_concurrency"] == 6 and f["first_failing_concurrency"] == 7 and f["ceiling_exact"]
    assert f["last_passing_concurrency"] < 7 <= f["first_failing_concurrency"]  # ceiling 6: 7th rejected
    assert f["hard_limit_429"] and "rejected/sent > 0.0" in f["rule"]
    assert [lv["concurrency"] for lv in f["levels"]] == [2, 4, 6, 7, 8]
    assert all(lv["overlapped"] for lv in f["levels"])


def test_scaling_with_explicit_session_policy(cloud: Any) -> None:
    import requests as rq

    url, _ = cloud(ttft=0.05, output_tokens=2, inter_token=0.0)
    f = run_kind("scaling", {"levels": [1, 4], "level_duration_s": 1.0, "warmup_s": 0.3, "level_gap_s": 0.1},
                 url)["findings"]
    p1, p4 = f["points"]
    assert f["session_policy"] == "per_worker" and p4["scaling_efficiency"] > 0.8 and f["saturation_concurrency"] == 4
    assert p1["ttft_p50_ms"] == pytest.approx(50, abs=10) and f["knee_concurrency"] is None
    # shared: one session for every level of the job (ground truth: one session id on the server)
    url2, _ = cloud(ttft=0.02, output_tokens=2)
    run_kind("scaling", {"levels": [1, 2], "level_duration_s": 0.4, "warmup_s": 0, "level_gap_s": 0,
                         "session": "shared"}, url2)
    recs = rq.get(url2 + "/-/requests", params={"limit": 10000}, timeout=5).json()["records"]
    assert len(recs) > 10 and len({r["session_id"] for r in recs}) == 1


# -- through a real carrier -----------------------------------------------------------------------------------
def test_fault_recovery_runs_on_a_carrier_through_the_protocol(make_cloud: Any, tmp_path: Any) -> None:
    """cb-probe (a subprocess) claims the job from localcloud OSS, drives agent + mock, writes the Result."""
    import os
    import secrets
    import signal

    from test_carrier import BUCKET, Bench  # the carrier test's control-side half of the protocol

    from csbench.probe.protocol import ResultStatus

    cloud = make_cloud(services=["oss", "agentrun", "mocktool"],
                       config={"oss": {"buckets": [BUCKET]}, "agentrun": AGENT})
    bench = Bench(cloud, tmp_path)
    uid = f"c-{secrets.token_hex(4)}"
    proc = bench.start(uid, "car-k")
    try:
        job = bench.dispatch(uid, "fault_recovery", {"mock_base_url": cloud.endpoints["mocktool"], "failures": 1},
                             url=cloud.endpoints["agentrun"])
        res = bench.wait_result(uid, job, timeout=30)
        assert res.status is ResultStatus.succeeded, res
        f = res.observations["findings"]
        assert res.observations["kind"] == "fault_recovery" and f["recovered"] and f["observed_attempts"] == 2
        bad = bench.dispatch(uid, "retry_storm", {"mock_base_url": cloud.endpoints["mocktool"], "max_window_s": 5},
                             url=cloud.endpoints["agentrun"])
        refused = bench.wait_result(uid, bad, timeout=30)
        assert refused.status is ResultStatus.failed and "unknown params ['max_window_s']" in str(refused.message)
        bench.stop(uid)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
