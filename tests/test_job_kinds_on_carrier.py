"""All thirteen job kinds through ONE real carrier: a `cb-probe` subprocess claims each job from localcloud
OSS, runs it against the localcloud AgentRun target (and the token-locked mock-tool server), and writes the
Result. Each kind gets the smallest params that still measure something, and one finding is checked against
the ground truth configured on the target below. The mock token is given by reference only.

CASES is the whole picture: (kind, params, check on the Result's findings). "$mocktool" / "$agentrun" in
params stand for the endpoints, known once the cloud is up. The jobs run one after another on the carrier,
in this order, against one target whose state (sessions, token bucket) they share."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from test_carrier import BUCKET, Bench  # the control side's half of the protocol, and the carrier launcher

from csbench.localcloud.cloud import LocalCloudThread
from csbench.probe.control import CampaignChannel
from csbench.probe.jobs import KINDS
from csbench.probe.protocol import Keys, Result, ResultStatus, Target

# -- ground truth: what the target is configured to do ----------------------------------------------------
COLD_START_S = 0.2  # first request of a session waits this long
TTFT_S = 0.01
IDLE_TIMEOUT_S = 0.5  # a session idle longer is recycled (next request cold)
RATE_RPS, RATE_BURST = 40, 10  # token bucket: above every load kind's rate, burst ≥ every burst below
MAX_CONCURRENCY = 6  # in-flight ceiling: the 7th simultaneous request gets a 429 (so do bursts > 6)
AGENT_RETRIES, AGENT_BACKOFF_MS = 2, 20  # the built-in agent retries a failing tool call twice, 20 ms apart
AGENTRUN = {
    "cold_start": COLD_START_S, "ttft": TTFT_S, "inter_token": 0.002,
    "output_tokens_from_request": True,  # a request's length follows its max_tokens (cancellation: long)
    "session_idle_timeout_s": IDLE_TIMEOUT_S, "rate_limit_rps": RATE_RPS, "rate_limit_burst": RATE_BURST,
    "max_concurrency": MAX_CONCURRENCY, "agent": {"backoff_ms": AGENT_BACKOFF_MS, "max_retries": AGENT_RETRIES},
}  # fmt: skip
MOCK_TOKEN = "mt-" + secrets.token_hex(16)  # the mock-tool server requires it; jobs name it "mock-token"
TOKEN_REF = "mock-token"

COLD_MS, TTFT_MS = COLD_START_S * 1000, TTFT_S * 1000
AGENT = {"mock_base_url": "$mocktool", "mock_token_ref": TOKEN_REF}  # every tool-plan kind
GROUND_TRUTH = {"ground_truth_url": "$agentrun"}  # localcloud's server-side request records

Check = Callable[[dict[str, Any]], bool]
CASES: list[tuple[str, dict[str, Any], Check]] = [
    ("ttft", {"samples": 3, "warmup": 1},
     lambda f: TTFT_MS - 1 <= f["ttft_p50_ms"] < TTFT_MS + 60 and abs(f["cold_penalty_ms"] - COLD_MS) < 80),
    ("startup_curve", {"n_calls": 3, "sessions": 2},
     lambda f: abs(f["cold_start_ms"] - COLD_MS) < 80 and len(f["curves_ms"]) == 2),
    ("sustained_load", {"target_rps": 10, "duration_s": 1.0, "warmup_s": 0.3, "arrival": "constant", "pool_size": 2},
     lambda f: f["rate_realization"] > 0.9 and f["error_rate"] == 0 and f["ttft_p50_ms"] >= TTFT_MS - 1),
    ("soak", {"rate_per_s": 10, "duration_s": 1.0, "window_s": 0.5, "pool_size": 2},
     lambda f: f["availability"] == 1.0 and len(f["windows"]) == 2 and f["requests"] >= 6),
    ("warm_retention", {"idle_gaps_s": [0.1, 0.9], "warmup_samples": 2, "cold_threshold_ms": 150,
                        "deep_min_extra_ms": 80, "platform_idle_timeout_s": IDLE_TIMEOUT_S, **GROUND_TRUTH},
     lambda f: f["shallow_retention_s"] == 0.1 and f["cold_onset_s"] == 0.9 > IDLE_TIMEOUT_S
     and f["server_agrees"] is True),
    ("idle_timeout_honor", {"session_idle_timeout_s": IDLE_TIMEOUT_S, "promise_idle_s": 0.25, "decay_gaps_s": [0.9],
                            "warmup_samples": 2, "cold_threshold_ms": 150, "deep_min_extra_ms": 80, **GROUND_TRUTH},
     lambda f: f["honored"] and f["promise_tier"] == "shallow" and f["expiry_observed_s"] == 0.9
     and f["expires_after_timeout"] and f["server_agrees"] is True),
    ("rate_limit", {"rate_steps": [10, 80], "step_duration_s": 0.5, "burst_levels": [4, 10], "step_gap_s": 0.3},
     lambda f: f["max_unthrottled_rate_per_s"] == 10 < RATE_RPS < f["throttle_onset_rate_per_s"] == 80
     and f["max_unthrottled_concurrency"] == 4 < MAX_CONCURRENCY < f["throttle_onset_concurrency"] == 10
     and f["retry_after_honest"] is True),
    ("concurrency_ceiling", {"levels": [2, 4, 8], "level_gap_s": 0.2, "max_tokens": 8},
     lambda f: f["last_passing_concurrency"] == MAX_CONCURRENCY < f["first_failing_concurrency"] == 7
     and f["ceiling_exact"] and f["hard_limit_429"]),
    ("cancellation", {"attempts": 2, **GROUND_TRUTH},
     lambda f: f["honoured"] is True and f["aborted_attempts"] == 2 and f["server_ended_early_all"] is True),
    ("scaling", {"levels": [1, 2], "level_duration_s": 0.6, "warmup_s": 0.2, "level_gap_s": 0.1, "max_tokens": 32},
     lambda f: [p["success_rate"] for p in f["points"]] == [1.0, 1.0] and f["points"][1]["scaling_efficiency"] > 0.6
     and f["points"][0]["ttft_p50_ms"] >= TTFT_MS - 1),
    ("hol_blocking", {**AGENT, "fast_count": 4, "slow_latency_ms": 300},
     lambda f: f["slow_reflects_injection"] and 300 <= f["slow_call_ms"] < 600 and not f["serialized"]),
    ("fault_recovery", {**AGENT, "failures": 2},
     lambda f: f["recovered"] and f["observed_attempts"] == 2 + 1 == f["expected_attempts_if_recovered"]
     and f["attempts_match"] and f["recovery_ms"] >= 2 * AGENT_BACKOFF_MS),
    ("retry_storm", {**AGENT, "settle_s": 0.3},
     lambda f: f["total_attempts"] == AGENT_RETRIES + 1 and f["storm_bounded_by"] == "agent"
     and f["attempts_after_answer"] == 0 and min(f["retry_gap_ms"]) >= AGENT_BACKOFF_MS - 2),
]  # fmt: skip


# -- one cloud, one carrier, every job -------------------------------------------------------------------
@dataclass
class Run:
    bench: Bench
    uid: str
    proc: Any
    results: dict[str, Result | None]


def fill(params: dict[str, Any], endpoints: dict[str, str]) -> dict[str, Any]:
    return {k: endpoints[v[1:]] if isinstance(v, str) and v.startswith("$") else v for k, v in params.items()}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("kinds-on-carrier")
    cloud = LocalCloudThread(tmp / "cloud", services=["oss", "agentrun", "mocktool"],
                             config={"oss": {"buckets": [BUCKET]}, "agentrun": AGENTRUN,
                                     "mocktool": {"token": MOCK_TOKEN}}).start()
    bench = Bench(cloud, tmp)
    uid = f"c-{secrets.token_hex(4)}"
    try:
        channel = CampaignChannel(bench.store, uid)  # job ids count up: the carrier runs them in CASES order
        channel.put_secret(TOKEN_REF, MOCK_TOKEN)
        proc = bench.start(uid, "car-k")
        jobs = {kind: channel.dispatch(channel.job_spec(
            probe=kind, target=Target(url=cloud.endpoints["agentrun"]), timeout_s=30,
            params=fill(params, cloud.endpoints))) for kind, params, _ in CASES}
        t0 = time.monotonic()
        results: dict[str, Result | None] = dict.fromkeys(jobs)
        while time.monotonic() - t0 < 55 and any(r is None for r in results.values()) and proc.poll() is None:
            for kind, job in jobs.items():  # one job at a time, in order: ask only for the next result
                if results[kind] is None:
                    results[kind] = bench.result(uid, job)
                    if results[kind] is None:
                        break
            time.sleep(0.25)
        channel.stop(drain_s=5)
        with contextlib.suppress(Exception):
            proc.wait(15)
        yield Run(bench, uid, proc, results)
    finally:
        for proc in bench.procs:  # only the process this module started, by pid
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
        cloud.stop()


def test_cases_cover_every_kind() -> None:
    assert [kind for kind, _, _ in CASES] == list(KINDS)


@pytest.mark.parametrize(("kind", "params", "check"), CASES, ids=[c[0] for c in CASES])
def test_kind_runs_on_the_carrier(run: Run, kind: str, params: dict[str, Any], check: Check) -> None:
    res = run.results[kind]
    assert res is not None, f"no result for {kind}; carrier log:\n{run.bench.log(run.proc)[-3000:]}"
    assert res.status is ResultStatus.succeeded, (res.reason, res.message)
    assert res.attempt == 1 and res.carrier_id == "car-k"
    obs = res.observations
    assert obs["kind"] == kind and obs["findings"], obs
    assert obs["vantage"]["carrier_id"] == "car-k" and obs["provenance"]["csbench_version"]
    assert check(obs["findings"]), obs["findings"]


def test_mock_token_by_reference_never_leaks(run: Run) -> None:
    assert run.proc.poll() == 0, "the carrier did not stop cleanly"
    used = [kind for kind, params, _ in CASES if params.get("mock_token_ref") == TOKEN_REF]
    assert used and all(run.results[k] is not None for k in used)
    keys = run.bench.keys_under(Keys(run.uid).prefix)
    secret_key = Keys(run.uid).secret(TOKEN_REF)
    assert secret_key in keys and any("/telemetry/" in k for k in keys)
    leaked = [k for k in keys if k != secret_key and MOCK_TOKEN.encode() in run.bench.store.get(k).body]  # type: ignore[union-attr]
    assert leaked == []
    assert MOCK_TOKEN not in Path(run.proc.log_path).read_text()
    # ...and it was needed: the mock-tool server refuses the agent kinds' calls without it.
    mock = run.bench.cloud.endpoints["mocktool"]
    assert requests.get(f"{mock}/fault/state", timeout=5).status_code == 401
    assert requests.get(f"{mock}/fault/state", headers={"X-Clousight-Token": MOCK_TOKEN}, timeout=5).ok
