"""The control-side client (probe/control.py) and `csbench carrier` against localcloud OSS with the real oss2.

No carrier process: the carrier's documents are written here with the protocol models (and broken on purpose).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import oss2.credentials
import pytest

from csbench.localcloud.cloud import LocalCloudThread
from csbench.localcloud.oss.admin import OssAdmin
from csbench.probe import protocol
from csbench.probe.blobstore import ObjectInfo, OssBlobStore, StoreError
from csbench.probe.control import (
    CampaignChannel,
    CarrierTrack,
    TelemetryError,
    Verdict,
    claimant_dead,
    is_stale,
    judge_attempt,
    listing_diff,
    new_job_id,
)
from csbench.probe.protocol import (
    Claim,
    CurrentJob,
    Final,
    Heartbeat,
    Keys,
    Phase,
    Progress,
    Result,
    ResultStatus,
    TelemetryChunk,
    TelemetryManifest,
)

REPO = Path(__file__).resolve().parents[1]
BUCKET = "bench"
UID = "c0ffee00-1111-2222-3333-444455556666"


def now() -> datetime:
    return datetime.now(timezone.utc)


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Env:
    cloud: LocalCloudThread
    store: OssBlobStore
    admin: OssAdmin
    keys: Keys

    def channel(self, **kw: Any) -> CampaignChannel:
        kw.setdefault("poll_interval_s", 1.0)
        kw.setdefault("heartbeat_lease_s", 15.0)
        return CampaignChannel(self.store, UID, **kw)

    def requests(self) -> dict[str, int]:
        return dict(self.admin.stats()["requests"])


@pytest.fixture
def env(make_cloud: Callable[..., LocalCloudThread]) -> Env:
    cloud = make_cloud(services=["oss"], config={"oss": {"buckets": [BUCKET]}})
    creds = oss2.credentials.StaticCredentialsProvider(cloud.ctx.admin.access_key_id,
                                                       cloud.ctx.admin.access_key_secret)
    store = OssBlobStore(BUCKET, region="cn-hangzhou", endpoint=cloud.endpoints["oss"], credentials=creds)
    return Env(cloud, store, OssAdmin(cloud.endpoints["oss"], cloud.ctx.admin.access_key_secret), Keys(UID))


class FakeCarrier:
    """Writes what a carrier would, with the protocol models."""

    def __init__(self, env: Env, carrier_id: str = "carrier-a"):
        self.store, self.keys, self.id = env.store, env.keys, carrier_id
        self.incarnation = uuid.uuid4().hex
        self.seq = 0

    def heartbeat(self, state: str = "idle", job: tuple[str, int] | None = None, lease_s: float = 15) -> Heartbeat:
        self.seq += 1
        hb = Heartbeat(carrier_id=self.id, incarnation=self.incarnation, seq=self.seq, package_version="0.1.0",
                       state=state, interval_s=lease_s / 3, lease_s=lease_s, wall_time=now(), monotonic_s=time.monotonic(),
                       current_job=CurrentJob(job_id=job[0], attempt=job[1], phase=Phase.measuring) if job else None)
        self.store.put(self.keys.heartbeat(self.id), hb.to_bytes())
        return hb

    def claim(self, job_id: str, attempt: int = 1) -> bool:
        doc = Claim(job_id=job_id, attempt=attempt, carrier_id=self.id, incarnation=self.incarnation,
                    claimed_at=now())
        return self.store.put_if_absent(self.keys.claim(job_id, attempt), doc.to_bytes())

    def progress(self, job_id: str, completed: int, attempt: int = 1) -> None:
        doc = Progress(job_id=job_id, attempt=attempt, carrier_id=self.id, phase=Phase.measuring,
                       completed=completed, total=10, updated_at=now())
        self.store.put(self.keys.progress(job_id), doc.to_bytes())

    def result(self, job_id: str, attempt: int = 1, status: str = "succeeded", manifest: str | None = None) -> bool:
        doc = Result(job_id=job_id, attempt=attempt, status=status, carrier_id=self.id, finished_at=now(),
                     telemetry_manifest=manifest)
        return self.store.put_if_absent(self.keys.result(job_id), doc.to_bytes())

    def final(self) -> None:
        doc = Final(carrier_id=self.id, incarnation=self.incarnation, exit_reason="Stopped", finished_at=now())
        self.store.put(self.keys.final(self.id), doc.to_bytes())


def dispatch(ch: CampaignChannel, timeout_s: float = 60, max_attempts: int = 2) -> str:
    spec = ch.job_spec(probe="ttft", target={"url": "http://127.0.0.1:9"}, timeout_s=timeout_s,
                       max_attempts=max_attempts)
    return ch.dispatch(spec)


# -- pure decisions --------------------------------------------------------------------------------------
def test_job_ids_sort_by_creation_and_are_dns_labels() -> None:
    a = new_job_id(datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc))
    b = new_job_id(datetime(2024, 1, 2, 3, 4, 6, tzinfo=timezone.utc))
    assert re.fullmatch(r"j20240102030405-[0-9a-f]{6}", a)
    assert a < b
    protocol.check_id(a, "job id")
    same_second = datetime(2024, 1, 2, 3, 4, 6, tzinfo=timezone.utc)
    c = new_job_id(same_second, previous=b)
    assert c > b and c[:16] == b[:16]
    assert new_job_id(same_second, previous="j20240102030406-ffffff") != "j20240102030406-ffffff"


def test_listing_diff() -> None:
    def info(key: str, etag: str) -> ObjectInfo:
        return ObjectInfo(key, etag, 1, 0)

    changed, gone, current = listing_diff({"a": "1", "b": "2", "c": "3"},
                                          [info("a", '"1"'), info("b", "9"), info("d", "4"), info("dir/", "")])
    assert sorted(changed) == ["b", "d"]
    assert gone == ["c"]
    assert current == {"a": "1", "b": "9", "d": "4"}


def test_is_stale_uses_the_observers_clock_only() -> None:
    assert not is_stale(100.0, 114.9, 15.0)
    assert is_stale(100.0, 115.0, 15.0)


def test_judge_attempt() -> None:
    kw: dict[str, Any] = {"claim_age_s": 1.0, "deadline_s": 100.0}
    assert judge_attempt(attempt=1, max_attempts=2, claimant_dead=False, **kw) is Verdict.running
    assert judge_attempt(attempt=1, max_attempts=2, claimant_dead=True, **kw) is Verdict.attempt_lost
    assert judge_attempt(attempt=2, max_attempts=2, claimant_dead=True, **kw) is Verdict.attempts_exhausted
    # past the deadline even a live claimant is given up on: it blocks every re-claim
    assert judge_attempt(attempt=1, max_attempts=2, claimant_dead=False, claim_age_s=100.0,
                         deadline_s=100.0) is Verdict.lease_expired


def test_claimant_dead_reasons() -> None:
    claim = Claim(job_id="j1", attempt=1, carrier_id="c1", incarnation="inc1", claimed_at=now())
    hb = Heartbeat(carrier_id="c1", incarnation="inc1", seq=1, package_version="x", state="busy", interval_s=5,
                   lease_s=15, wall_time=now(), monotonic_s=0)
    assert claimant_dead(claim, 0.0, None, 14.0, 15.0) is None
    assert "no heartbeat" in (claimant_dead(claim, 0.0, None, 15.0, 15.0) or "")
    live = CarrierTrack("c1", changed_at=10.0, heartbeat_etag="e", heartbeat=hb)
    assert claimant_dead(claim, 0.0, live, 20.0, 15.0) is None
    assert "unchanged" in (claimant_dead(claim, 0.0, live, 25.0, 15.0) or "")
    restarted = CarrierTrack("c1", changed_at=10.0, heartbeat_etag="e",
                             heartbeat=hb.model_copy(update={"incarnation": "inc2"}))
    assert "restarted" in (claimant_dead(claim, 5.0, restarted, 11.0, 15.0) or "")
    assert claimant_dead(claim, 10.0, restarted, 11.0, 15.0) is None  # seen together: not proof yet
    exited = CarrierTrack("c1", changed_at=10.0, heartbeat_etag="e", heartbeat=hb,
                          final=Final(carrier_id="c1", incarnation="inc1", exit_reason="IdleTimeout",
                                      finished_at=now()))
    assert "exited" in (claimant_dead(claim, 0.0, exited, 11.0, 15.0) or "")


# -- docs cannot drift from the code -----------------------------------------------------------------------
def test_protocol_doc_names_every_document_and_field() -> None:
    from pydantic import BaseModel

    doc = (REPO / "docs" / "protocol.md").read_text()
    missing = []
    for name, obj in vars(protocol).items():
        if isinstance(obj, type) and issubclass(obj, BaseModel) and obj.__module__ == protocol.__name__:
            if f"`{name}`" not in doc:
                missing.append(name)
            for field_name, info in obj.model_fields.items():
                wire = info.alias or field_name
                if f"`{wire}`" not in doc:
                    missing.append(f"{name}.{wire}")
        if isinstance(obj, type) and issubclass(obj, protocol.Enum) and obj.__module__ == protocol.__name__:
            missing += [f"{name}.{m.value}" for m in obj if f"`{m.value}`" not in doc]
    for method in [m for m in vars(Keys) if not m.startswith("_")]:
        if f"`{method}`" not in doc:
            missing.append(f"Keys.{method}")
    assert not missing, f"docs/protocol.md does not mention: {missing}"


# -- dispatch, cancel, stop --------------------------------------------------------------------------------
def test_dispatch_writes_spec_then_signal_and_is_idempotent(env: Env) -> None:
    ch = env.channel()
    spec = ch.job_spec(probe="ttft", target={"url": "http://127.0.0.1:9"}, timeout_s=30)
    assert ch.dispatch(spec) == spec.job_id
    stored = protocol.parse(protocol.JobSpec, "spec", env.store.get(env.keys.spec(spec.job_id)).body)
    assert stored == spec
    signal = protocol.parse(protocol.JobSignal, "sig", env.store.get(env.keys.job_signal(spec.job_id)).body)
    assert signal.job_id == spec.job_id
    assert ch.dispatch(spec) == spec.job_id  # a retry after an uncertain write is harmless
    other = spec.model_copy(update={"probe": "soak"})
    with pytest.raises(ValueError, match="already used"):
        ch.dispatch(other)
    with pytest.raises(ValueError, match="belongs to campaign"):
        ch.dispatch(spec.model_copy(update={"campaign_uid": "other"}))


def test_cancel_and_stop_documents(env: Env) -> None:
    ch = env.channel()
    job = dispatch(ch)
    assert ch.cancel(job, "user asked")
    cancel = protocol.parse(protocol.Cancel, "c", env.store.get(env.keys.cancel(job)).body)
    assert (cancel.job_id, cancel.reason) == (job, "user asked")
    assert ch.stop("carrier-a", drain_s=5) == env.keys.stop_carrier("carrier-a")
    assert ch.stop(drain_s=7) == env.keys.stop_all
    stop = protocol.parse(protocol.Stop, "s", env.store.get(env.keys.stop_all).body)
    assert stop.drain_s == 7
    assert protocol.parse_signal(env.keys.stop_all.rsplit("/", 1)[-1]) == ("stop-all", "")
    # not claimed yet: carriers will skip it, so the control side ends it
    queued = protocol.parse(Result, "r", env.store.get(env.keys.result(job)).body)
    assert (queued.status, queued.reason, queued.attempt, queued.carrier_id) == (
        ResultStatus.cancelled, "Cancelled", 0, None)
    assert not ch.cancel(job)  # finished: nothing to cancel
    running = dispatch(ch)
    carrier = FakeCarrier(env)
    carrier.claim(running)
    assert ch.cancel(running)
    assert env.store.get(env.keys.result(running)) is None  # the carrier running it writes the result


# -- observe -----------------------------------------------------------------------------------------------
def test_observe_sees_changes_once_and_lists_only_when_nothing_changed(env: Env) -> None:
    ch = env.channel()
    job = dispatch(ch)
    carrier = FakeCarrier(env)
    carrier.heartbeat()
    obs = ch.observe()
    assert [h.seq for h in obs.heartbeats] == [1] and not obs.claims
    carrier.claim(job)
    carrier.heartbeat("busy", (job, 1))
    carrier.progress(job, 3)
    obs = ch.observe()
    assert [h.seq for h in obs.heartbeats] == [2]
    assert [(c.job_id, c.attempt, c.carrier_id) for c in obs.claims] == [(job, 1, "carrier-a")]
    assert [p.completed for p in obs.progress] == [3]

    env.admin.reset_stats()
    obs = ch.observe()
    assert not obs.changed
    assert env.requests() == {"ListObjectsV2": 2}  # carriers/ + the one active job: no GET
    assert obs.requests == 2

    carrier.progress(job, 4)
    env.admin.reset_stats()
    obs = ch.observe()
    assert [p.completed for p in obs.progress] == [4] and not obs.heartbeats
    assert env.requests() == {"ListObjectsV2": 2, "GetObject": 1}


def test_result_removes_signals_and_job_leaves_the_active_set(env: Env) -> None:
    ch = env.channel()
    job = dispatch(ch)
    carrier = FakeCarrier(env)
    carrier.claim(job)
    ch.cancel(job)
    carrier.result(job)
    obs = ch.observe()
    assert [(r.job_id, r.status) for r in obs.results] == [(job, ResultStatus.succeeded)]
    assert env.store.get(env.keys.job_signal(job)) is None
    assert env.store.get(env.keys.cancel(job)) is None
    assert job not in ch.active
    env.admin.reset_stats()
    ch.observe()
    assert env.requests() == {"ListObjectsV2": 1}


def test_stale_heartbeat_reported_within_lease_plus_one_poll(env: Env) -> None:
    lease, poll = 1.0, 0.2
    ch = env.channel(heartbeat_lease_s=lease, poll_interval_s=poll)
    carrier = FakeCarrier(env)
    carrier.heartbeat(lease_s=lease)
    last_write = time.monotonic()
    deadline = last_write + 10
    while time.monotonic() < deadline:
        obs = ch.observe()
        if obs.heartbeat_missing:
            break
        time.sleep(poll)
    else:
        pytest.fail("no HeartbeatMissing within 10 s")
    elapsed = time.monotonic() - last_write
    assert obs.heartbeat_missing[0].carrier_id == "carrier-a"
    assert elapsed <= obs.heartbeat_missing[0].lease_s + poll + 0.5


def test_stale_heartbeat_with_a_fake_clock_and_recovery(env: Env) -> None:
    clock = FakeClock()
    ch = env.channel(clock=clock)
    carrier = FakeCarrier(env)
    carrier.heartbeat()
    assert not ch.observe().heartbeat_missing
    clock.t += 14.9
    assert not ch.observe().heartbeat_missing
    clock.t += 0.1
    missing = ch.observe().heartbeat_missing
    assert [(m.carrier_id, m.silent_s) for m in missing] == [("carrier-a", pytest.approx(15.0))]
    carrier.heartbeat()
    assert not ch.observe().heartbeat_missing  # a change is life, whatever the clocks say
    carrier.final()
    clock.t += 100
    obs = ch.observe()
    assert [f.exit_reason.value for f in obs.finals] == ["Stopped"] and not obs.heartbeat_missing


def test_attempt_lost_reported_then_exhausted_written_once(env: Env) -> None:
    clock = FakeClock()
    ch = env.channel(clock=clock)
    job = dispatch(ch, max_attempts=2)
    dead, live = FakeCarrier(env, "carrier-a"), FakeCarrier(env, "carrier-b")
    dead.heartbeat("busy", (job, 1))
    dead.claim(job, 1)
    ch.observe()
    clock.t += 16
    live.heartbeat()
    obs = ch.observe()
    assert [m.carrier_id for m in obs.heartbeat_missing] == ["carrier-a"]
    assert [(v.attempt, v.verdict) for v in obs.verdicts] == [(1, Verdict.attempt_lost)]
    assert env.store.get(env.keys.result(job)) is None  # attempts remain: a live carrier claims #2
    assert not ch.observe().verdicts  # reported once

    live.claim(job, 2)
    live.heartbeat("busy", (job, 2))
    assert [c.attempt for c in ch.observe().claims] == [2]
    clock.t += 16  # carrier-b dies too
    obs = ch.observe()
    assert [(v.attempt, v.verdict) for v in obs.verdicts] == [(2, Verdict.attempts_exhausted)]
    assert [(r.status, r.reason, r.carrier_id) for r in obs.written] == [(ResultStatus.failed, "AttemptsExhausted",
                                                                          None)]
    stored = protocol.parse(Result, "r", env.store.get(env.keys.result(job)).body)
    assert stored.reason == "AttemptsExhausted" and stored.attempt == 2
    assert env.store.get(env.keys.job_signal(job)) is None

    env.admin.reset_stats()
    obs = ch.observe()
    assert not obs.written and not obs.verdicts
    assert "PutObject" not in env.requests()
    assert not live.result(job, 2)  # the carrier's late result cannot overwrite the control side's
    assert protocol.parse(Result, "r", env.store.get(env.keys.result(job)).body).reason == "AttemptsExhausted"


def test_control_deadline_writes_lease_expired(env: Env) -> None:
    clock = FakeClock()
    ch = env.channel(clock=clock, poll_interval_s=1.0, heartbeat_lease_s=15.0)
    job = dispatch(ch, timeout_s=10, max_attempts=3)
    carrier = FakeCarrier(env)
    carrier.claim(job)
    carrier.heartbeat("busy", (job, 1))
    ch.observe()
    deadline = protocol.control_deadline_s(ch.active[job].spec, 1.0, 15.0)
    for _ in range(int(deadline // 5)):  # alive all along: heartbeats keep changing
        clock.t += 5
        carrier.heartbeat("busy", (job, 1))
        assert not ch.observe().written
    clock.t += 5
    carrier.heartbeat("busy", (job, 1))
    obs = ch.observe()
    assert [(r.reason, r.attempt) for r in obs.written] == [("LeaseExpired", 1)]
    assert "control deadline" in (obs.written[0].message or "")


def test_claimant_without_any_heartbeat_is_dead_after_a_lease(env: Env) -> None:
    clock = FakeClock()
    ch = env.channel(clock=clock)
    job = dispatch(ch, max_attempts=1)
    FakeCarrier(env, "ghost").claim(job)
    assert not ch.observe().verdicts
    clock.t += 15
    obs = ch.observe()
    assert [(v.verdict, v.carrier_id) for v in obs.verdicts] == [(Verdict.attempts_exhausted, "ghost")]


def test_late_carrier_result_wins_race_is_read_not_overwritten(env: Env) -> None:
    clock = FakeClock()
    ch = env.channel(clock=clock)
    job = dispatch(ch, max_attempts=1)
    carrier = FakeCarrier(env)
    carrier.claim(job)
    ch.observe()
    clock.t += 16
    carrier.result(job)  # lands between our LIST and our put_if_absent? simulate: written before judging
    obs = ch.observe()
    assert [(r.status, r.carrier_id) for r in obs.results] == [(ResultStatus.succeeded, "carrier-a")]
    assert not obs.written


def test_malformed_and_future_documents_are_problems_not_exceptions(env: Env) -> None:
    ch = env.channel()
    job = dispatch(ch)
    keys = env.keys
    env.store.put(keys.heartbeat("bad-json"), b"{not json")
    future = json.loads(FakeCarrier(env, "future").heartbeat().to_bytes())
    future["schema"] = "csbench.dev/v2"
    env.store.put(keys.heartbeat("future"), json.dumps(future).encode())
    env.store.put(keys.heartbeat("partial"), b'{"schema": "csbench.dev/v1", "kind": "Heartbeat", "seq": 1}')
    env.store.put(keys.final("huge"), b" " * (protocol.MAX_DOCUMENT_BYTES + 1))
    env.store.put(keys.claim(job, 1), b"[]")
    env.store.put(keys.progress(job), b'{"schema": "csbench.dev/v1", "kind": "Claim"}')
    obs = ch.observe()
    reasons = {p.key.removeprefix(keys.prefix): p.reason for p in obs.problems}
    assert "not valid JSON" in reasons["carriers/bad-json/heartbeat.json"]
    assert "unsupported schema 'csbench.dev/v2'" in reasons["carriers/future/heartbeat.json"]
    assert "invalid Heartbeat" in reasons["carriers/partial/heartbeat.json"]
    assert "over the" in reasons["carriers/huge/final.json"]
    assert "expected a JSON object" in reasons[f"jobs/{job}/claims/0001.json"]
    assert "expected kind 'Progress'" in reasons[f"jobs/{job}/progress.json"]
    assert not any(p.transient for p in obs.problems)
    assert not ch.observe().problems  # each version reported once

    # an unreadable result still ends the job (result.json is write-once) and says why
    env.store.put(keys.result(job), b'{"schema": "csbench.dev/v9", "kind": "Result"}')
    obs = ch.observe()
    assert [(r.reason, r.status) for r in obs.results] == [("ResultUnreadable", ResultStatus.failed)]
    assert job not in ch.active


def test_transient_errors_are_reported_and_403_raises(env: Env) -> None:
    ch = env.channel()
    dispatch(ch)
    FakeCarrier(env).heartbeat()
    # oss2's list iterator retries 5xx three times itself; 12 failures outlast it on every LIST of this call
    env.admin.add_fault(action="error", status=503, code="ServiceUnavailable", operation="ListObjectsV2", count=12)
    obs = ch.observe()
    assert obs.problems and all(p.transient for p in obs.problems)
    env.admin.clear_faults()
    assert [h.seq for h in ch.observe().heartbeats] == [1]  # nothing lost: picked up on the next call
    env.admin.add_fault(action="error", status=403, code="AccessDenied", operation="ListObjectsV2", count=1)
    with pytest.raises(StoreError) as info:
        ch.observe()
    assert info.value.status == 403 and not info.value.transient


def test_restarted_observer_recovers_active_jobs_from_signals(env: Env) -> None:
    first = env.channel()
    running, done = dispatch(first), dispatch(first)
    carrier = FakeCarrier(env)
    carrier.claim(running)
    carrier.result(done)  # finished while no observer ran: its signal is still there
    second = env.channel()
    obs = second.observe()
    assert set(second.active) == {running}
    assert [c.job_id for c in obs.claims] == [running]
    assert [r.job_id for r in obs.results] == [done]
    assert env.store.get(env.keys.job_signal(done)) is None


def test_request_count_does_not_grow_with_finished_jobs(env: Env) -> None:
    def steady_requests(ch: CampaignChannel) -> dict[str, int]:
        ch.observe()
        env.admin.reset_stats()
        ch.observe()
        return env.requests()

    carrier = FakeCarrier(env)
    carrier.heartbeat()
    ch = env.channel()
    active = dispatch(ch)
    carrier.claim(active)
    baseline = steady_requests(ch)
    for _ in range(50):
        job = dispatch(ch)
        carrier.claim(job)
        carrier.progress(job, 10)
        carrier.result(job)
    ch.observe()  # sees the 50 results, deletes their signals
    assert set(ch.active) == {active}
    assert steady_requests(ch) == baseline == {"ListObjectsV2": 2}
    restarted = env.channel()
    restarted.observe()
    env.admin.reset_stats()
    restarted.observe()
    assert env.requests() == baseline  # a restarted observer does not rescan history either


# -- telemetry and boot log --------------------------------------------------------------------------------
def write_telemetry(env: Env, job: str, attempt: int, chunks: dict[str, list[dict[str, Any]]]) -> str:
    base = env.keys.telemetry_dir(job, attempt)
    entries = []
    for name, records in chunks.items():
        body = b"".join(json.dumps(r).encode() + b"\n" for r in records)
        key = f"{base}{name}.ndjson"
        env.store.put(key, body, "application/x-ndjson")
        entries.append(TelemetryChunk(stream=name.split("-")[0], key=key, records=len(records),
                                      sha256=hashlib.sha256(body).hexdigest(), bytes=len(body)))
    manifest_key = base + "manifest.json"
    env.store.put(manifest_key, TelemetryManifest(job_id=job, attempt=attempt, chunks=entries).to_bytes())
    return manifest_key


def test_fetch_telemetry_verifies_chunks(env: Env) -> None:
    ch = env.channel()
    job = dispatch(ch)
    write_telemetry(env, job, 1, {"requests-0001": [{"n": 1}], "requests-0002": [{"n": 2}, {"n": 3}]})
    manifest = write_telemetry(env, job, 2, {"requests-0001": [{"n": 10}], "events-0001": [{"e": "x"}]})
    assert [r["n"] for r in ch.fetch_telemetry(job, attempt=1)] == [1, 2, 3]
    assert ch.fetch_telemetry(job) == [{"n": 10}, {"e": "x"}]  # highest attempt with a manifest
    FakeCarrier(env).result(job, attempt=1, manifest=env.keys.telemetry_dir(job, 1) + "manifest.json")
    assert len(ch.fetch_telemetry(job)) == 3  # the result names its attempt's manifest

    tampered = env.keys.telemetry_dir(job, 2) + "events-0001.ndjson"
    env.store.put(tampered, b'{"e": "y"}\n')
    with pytest.raises(TelemetryError, match=re.escape(tampered) + ".*sha256"):
        ch.fetch_telemetry(job, attempt=2)
    env.store.delete(tampered)
    with pytest.raises(TelemetryError, match="missing"):
        ch.fetch_telemetry(job, attempt=2)
    with pytest.raises(TelemetryError, match="no telemetry manifest"):
        ch.fetch_telemetry(job, attempt=3)
    assert manifest.endswith("0002/manifest.json")


def test_fetch_telemetry_record_count_mismatch(env: Env) -> None:
    ch = env.channel()
    job = dispatch(ch)
    base = env.keys.telemetry_dir(job, 1)
    body = b'{"a": 1}\n{"a": 2}\n'
    env.store.put(base + "r-1.ndjson", body)
    chunk = TelemetryChunk(stream="r", key="r-1.ndjson", records=3, sha256=hashlib.sha256(body).hexdigest(),
                           bytes=len(body))  # a relative key works too
    env.store.put(base + "manifest.json", TelemetryManifest(job_id=job, attempt=1, chunks=[chunk]).to_bytes())
    with pytest.raises(TelemetryError, match="has 2 records, manifest says 3"):
        ch.fetch_telemetry(job, 1)


def test_read_boot_log_and_human_listings(env: Env) -> None:
    ch = env.channel()
    env.store.put(env.keys.boot_log("carrier-a"), b"stage python ok\nstage pip ok\n", "text/plain")
    assert ch.read_boot_log("carrier-a") == "stage python ok\nstage pip ok\n"
    assert ch.read_boot_log("nobody") is None
    jobs = [dispatch(ch) for _ in range(3)]
    carrier = FakeCarrier(env)
    carrier.heartbeat()
    carrier.claim(jobs[0])
    carrier.result(jobs[0])
    carrier.claim(jobs[1])
    assert [(j.job_id, j.state) for j in ch.list_jobs()] == [(jobs[0], "succeeded"), (jobs[1], "running"),
                                                             (jobs[2], "queued")]
    carriers = ch.list_carriers()
    assert [(c.carrier_id, c.heartbeat.seq if c.heartbeat else None, c.has_boot_log) for c in carriers] == [
        ("carrier-a", 1, True)]


# -- csbench carrier (a subprocess, as a human runs it) -----------------------------------------------------
def run_cli(env: Env, *args: str, creds: bool = True) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("ALIBABA_CLOUD_")}
    e["PYTHONSAFEPATH"] = "1"
    if creds:
        e["ALIBABA_CLOUD_ACCESS_KEY_ID"] = env.cloud.ctx.admin.access_key_id
        e["ALIBABA_CLOUD_ACCESS_KEY_SECRET"] = env.cloud.ctx.admin.access_key_secret
    cmd = [sys.executable, "-m", "csbench.cli", "carrier", args[0], "--bucket", BUCKET, "--region", "cn-hangzhou",
           "--endpoint", env.cloud.endpoints["oss"], "--campaign-uid", UID, *args[1:]]
    return subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=60)


def test_cli_subcommands(env: Env) -> None:
    ch = env.channel()
    done, running = dispatch(ch), dispatch(ch)
    carrier = FakeCarrier(env)
    carrier.heartbeat("busy", (running, 1))
    carrier.claim(done)
    carrier.result(done)
    carrier.claim(running)
    carrier.progress(running, 4)
    env.store.put(env.keys.heartbeat("broken"), b"nope")
    env.store.put(env.keys.boot_log("carrier-a"), b"stage install ok\n", "text/plain")

    jobs = run_cli(env, "jobs")
    assert jobs.returncode == 0, jobs.stderr
    assert re.search(rf"{done}\s+ttft\s+succeeded", jobs.stdout)
    assert re.search(rf"{running}\s+ttft\s+running\s+1\s+carrier-a\s+measuring 4/10", jobs.stdout)
    as_json = json.loads(run_cli(env, "jobs", "-o", "json").stdout)
    assert [j["state"] for j in as_json] == ["succeeded", "running"]

    carriers = run_cli(env, "carriers")
    assert carriers.returncode == 0, carriers.stderr
    assert re.search(rf"carrier-a\s+\d+s\s+1\s+busy\s+{running}#1", carriers.stdout)
    assert re.search(r"broken .*heartbeat.json: not valid JSON", carriers.stdout)
    assert env.cloud.ctx.admin.access_key_secret not in carriers.stdout + carriers.stderr
    cj = json.loads(run_cli(env, "carriers", "-o", "json").stdout)
    assert {c["carrier_id"]: c["state"] for c in cj} == {"broken": None, "carrier-a": "busy"}

    show = run_cli(env, "show", running)
    assert show.returncode == 0, show.stderr
    assert "claim     attempt 1 by carrier-a" in show.stdout and "progress  attempt 1 measuring 4/10" in show.stdout
    shown = json.loads(run_cli(env, "show", done, "-o", "json").stdout)
    assert shown["result"]["status"] == "succeeded" and shown["spec"]["probe"] == "ttft"
    assert run_cli(env, "show", "j20000101000000-abcdef").returncode == 1

    logs = run_cli(env, "logs", "carrier-a")
    assert logs.returncode == 0 and logs.stdout == "stage install ok\n"
    assert run_cli(env, "logs", "nobody").returncode == 1

    cancel = run_cli(env, "cancel", running, "-o", "json")
    assert json.loads(cancel.stdout) == {"job_id": running, "cancel_sent": True}
    assert env.store.get(env.keys.cancel(running)) is not None
    assert "already has a result" in run_cli(env, "cancel", done).stdout

    stop = run_cli(env, "stop", "carrier-a", "--drain", "5")
    assert stop.returncode == 0, stop.stderr
    assert protocol.parse(protocol.Stop, "s", env.store.get(env.keys.stop_carrier("carrier-a")).body).drain_s == 5
    assert run_cli(env, "stop", "--all").returncode == 0
    assert env.store.get(env.keys.stop_all) is not None
    assert run_cli(env, "stop").returncode == 2  # neither a carrier nor --all


def test_cli_missing_credentials_exit_2(env: Env) -> None:
    proc = run_cli(env, "jobs", creds=False)
    assert proc.returncode == 2
    assert "ALIBABA_CLOUD_ACCESS_KEY_ID" in proc.stderr and "ALIBABA_CLOUD_ACCESS_KEY_SECRET" in proc.stderr


def test_cli_wrong_secret_is_a_clear_error(env: Env) -> None:
    e = dict(os.environ, PYTHONSAFEPATH="1", ALIBABA_CLOUD_ACCESS_KEY_ID=env.cloud.ctx.admin.access_key_id,
             ALIBABA_CLOUD_ACCESS_KEY_SECRET="wrong-secret")
    proc = subprocess.run([sys.executable, "-m", "csbench.cli", "carrier", "jobs", "--bucket", BUCKET,
                           "--endpoint", env.cloud.endpoints["oss"], "--campaign-uid", UID],
                          capture_output=True, text=True, env=e, timeout=60)
    assert proc.returncode == 1
    assert "403" in proc.stderr and "permissions" in proc.stderr and "wrong-secret" not in proc.stderr


# -- with the real carrier ---------------------------------------------------------------------------------
CB_PROBE = Path(sys.executable).parent / "cb-probe"


def test_with_a_real_carrier_dispatch_observe_cancel_telemetry(env: Env, tmp_path: Path) -> None:
    """The two halves agree: cb-probe runs what CampaignChannel dispatches, and observe() sees it through."""
    from csbench.probe.protocol import Target

    admin = env.cloud.ctx.admin
    carrier_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CB_PROBE_BUCKET": BUCKET,
                   "CB_PROBE_REGION": "cn-hangzhou", "CB_PROBE_ENDPOINT": env.cloud.endpoints["oss"],
                   "CB_PROBE_CAMPAIGN_UID": UID, "CB_PROBE_CARRIER_ID": "real-1", "CB_PROBE_INSTANCE_ID": "i-test",
                   "CB_PROBE_POLL_INTERVAL": "0.2", "CB_PROBE_HEARTBEAT_INTERVAL": "0.5",
                   "CB_PROBE_PROGRESS_INTERVAL": "0.2", "CB_PROBE_ACCESS_KEY_ID": admin.access_key_id,
                   "CB_PROBE_ACCESS_KEY_SECRET": admin.access_key_secret}
    ch = env.channel(poll_interval_s=0.2, heartbeat_lease_s=1.5)
    with open(tmp_path / "carrier.log", "wb") as log:
        proc = subprocess.Popen([str(CB_PROBE)], env=carrier_env, stdout=log, stderr=log)
    try:
        quick = ch.dispatch(ch.job_spec(probe="sleep", target=Target(url="http://127.0.0.1:9"), timeout_s=20,
                                        params={"seconds": 0.3}))
        slow = ch.dispatch(ch.job_spec(probe="sleep", target=Target(url="http://127.0.0.1:9"), timeout_s=20,
                                       params={"seconds": 30}))
        results: dict[str, Result] = {}
        heartbeats = 0
        cancelled = False
        deadline = time.monotonic() + 30
        while len(results) < 2 and time.monotonic() < deadline:
            obs = ch.observe()
            assert not obs.problems, obs.problems
            heartbeats += len(obs.heartbeats)
            results.update({r.job_id: r for r in obs.results})
            if not cancelled and any(c.job_id == slow for c in obs.claims):
                assert ch.cancel(slow, "test")
                cancelled = True
            time.sleep(0.2)
        assert set(results) == {quick, slow}, (tmp_path / "carrier.log").read_text()[-2000:]
        assert results[quick].status is ResultStatus.succeeded and results[quick].carrier_id == "real-1"
        assert (results[slow].status, results[slow].reason) == (ResultStatus.cancelled, "Cancelled")
        assert heartbeats >= 2 and not ch.active
        assert [o.key for o in env.store.list(env.keys.signals_dir)] == []  # rule 13: nothing left to poll
        assert ch.fetch_telemetry(quick) == [{"slept_s": 0.3}]
    finally:
        proc.send_signal(15)
        proc.wait(20)
