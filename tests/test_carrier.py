"""cb-probe, the carrier loop: pure decisions without a store, then real carriers (subprocesses of
.venv/bin/cb-probe) against localcloud OSS through oss2 — races, SIGKILL, zombies, 30 s of faults, bad
documents, stop/drain, cancel, idle timeout, SSRF, and a ttft job against the localcloud AgentRun target."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import oss2.credentials
import pytest

from csbench.localcloud.oss.admin import OssAdmin
from csbench.probe import carrier as cr
from csbench.probe.blobstore import OssBlobStore
from csbench.probe.config import ConfigError, load_config
from csbench.probe.jobs.ttft import SseParser, percentile, token_of
from csbench.probe.protocol import (
    Claim,
    Final,
    Heartbeat,
    JobSignal,
    JobSpec,
    Keys,
    Result,
    ResultStatus,
    Stop,
    Target,
    TelemetryManifest,
    parse,
)
from csbench.probe.ssrf import TargetRefused, blocked_address, check_target
from csbench.probe.telemetry import encode_chunk

BUCKET = "bench"
CB_PROBE = Path(sys.executable).parent / "cb-probe"
NOW = datetime(2025, 1, 1, tzinfo=timezone.utc)


# -- pure decisions --------------------------------------------------------------------------------------
def test_backoff_is_capped_exponential_with_full_jitter() -> None:
    assert cr.backoff_s(0) == 0.0
    assert [cr.backoff_s(n, rand=lambda: 1.0) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert cr.backoff_s(50, rand=lambda: 1.0) == 30.0 and cr.backoff_s(10**6, rand=lambda: 1.0) == 30.0
    assert cr.backoff_s(5, rand=lambda: 0.0) == 0.0


def _claim(carrier: str = "a", inc: str = "i1") -> Claim:
    return Claim(job_id="j1", attempt=1, carrier_id=carrier, incarnation=inc, claimed_at=NOW)


def _hb(inc: str = "i1", lease: float = 3.0) -> Heartbeat:
    return Heartbeat(carrier_id="a", incarnation=inc, seq=1, package_version="0", state="busy", interval_s=1,
                     lease_s=lease, wall_time=NOW, monotonic_s=0)


def test_lease_expiry_uses_only_the_observers_clock() -> None:
    kw: dict[str, Any] = {"default_lease_s": 3.0, "me": "b", "my_incarnation": "mine"}
    s = cr.observe(None, "e1", now=100.0)
    assert cr.claimant_dead(_claim(), _hb(), s, 102.9, **kw) is None
    assert "unchanged" in str(cr.claimant_dead(_claim(), _hb(), s, 103.0, **kw))
    s2 = cr.observe(s, "e2", now=102.0)  # the heartbeat moved: the lease restarts from our clock
    assert s2.first_seen == 100.0 and s2.changed_at == 102.0
    assert cr.claimant_dead(_claim(), _hb(), s2, 104.5, **kw) is None
    assert cr.observe(s2, "e2", now=110.0) is s2
    # No heartbeat at all: dead once the claim has been seen for a lease.
    none = cr.observe(None, None, now=0.0)
    assert cr.claimant_dead(_claim(), None, none, 2.0, **kw) is None
    assert "no heartbeat" in str(cr.claimant_dead(_claim(), None, none, 3.0, **kw))
    # The heartbeat's own lease wins over ours.
    assert cr.claimant_dead(_claim(), _hb(lease=10), s, 105.0, **kw) is None
    # Restarted claimant (new incarnation) or our own earlier incarnation: lost at once.
    assert "restarted" in str(cr.claimant_dead(_claim(), _hb(inc="i2"), s, 100.0, **kw))
    own = {"default_lease_s": 3.0, "me": "a", "my_incarnation": "i2"}
    assert "earlier incarnation" in str(cr.claimant_dead(_claim(), None, none, 0.0, **own))
    assert cr.claimant_dead(_claim(inc="i2"), None, none, 99.0, **own) is None


def test_attempt_decisions() -> None:
    assert cr.decide_attempt(0, 2, lost=False) == (cr.Action.claim, 1)
    assert cr.decide_attempt(1, 2, lost=False) == (cr.Action.wait, 1)
    assert cr.decide_attempt(1, 2, lost=True) == (cr.Action.claim, 2)
    assert cr.decide_attempt(2, 2, lost=True) == (cr.Action.exhaust, 2)
    assert cr.pick_order(["j3", "j1", "j2", "j1"], skip={"j2"}, not_before={"j3": 5.0}, now=1.0) == ["j1"]
    assert cr.pick_order(["j3", "j1"], skip=set(), not_before={"j3": 5.0}, now=5.0) == ["j1", "j3"]


def test_errors_become_result_reasons() -> None:
    assert cr.failure_of(TargetRefused("x"))[1] == "TargetRefused"
    status, reason, msg = cr.failure_of(KeyError("boom"))
    assert (status, reason, msg) == (ResultStatus.failed, "ProbeError", "KeyError: 'boom'")
    spec = JobSpec(job_id="j1", campaign_uid="c1", probe="ttft", target=Target(url="http://127.0.0.1"),
                   timeout_s=5, created_at=NOW)
    assert cr.validate_spec(spec, "j1", "c1", {"ttft"}) is None
    assert cr.validate_spec(spec, "j2", "c1", {"ttft"})[0] == "SpecInvalid"  # type: ignore[index]
    assert cr.validate_spec(spec, "j1", "c2", {"ttft"})[0] == "SpecInvalid"  # type: ignore[index]
    assert cr.validate_spec(spec, "j1", "c1", {"sleep"})[0] == "UnknownProbe"  # type: ignore[index]


def test_oversized_results_are_trimmed_not_lost() -> None:
    big = Result(job_id="j1", attempt=1, status=ResultStatus.succeeded, finished_at=NOW,
                 observations={"samples": ["x" * 1000] * 2000, "p50": 1.0})
    fitted = cr.fit_result(big)
    assert fitted.observations == {"p50": 1.0, "trimmed": True} and "telemetry" in str(fitted.message)
    small = Result(job_id="j1", attempt=1, status=ResultStatus.succeeded, finished_at=NOW)
    assert cr.fit_result(small) is small


def test_config_names_the_bad_variable() -> None:
    base = {"CB_PROBE_BUCKET": "bench", "CB_PROBE_REGION": "cn-hangzhou", "CB_PROBE_CAMPAIGN_UID": "c-1",
            "CB_PROBE_CARRIER_ID": "car-1"}
    cfg = load_config(base)
    assert cfg.oss_endpoint == "https://oss-cn-hangzhou-internal.aliyuncs.com" and cfg.lease_s == 15.0
    assert cfg.metadata_url == "http://100.100.100.200" and not cfg.static_keys
    for var, value in [("CB_PROBE_CAMPAIGN_UID", "Bad_UID"), ("CB_PROBE_POLL_INTERVAL", "-1"),
                       ("CB_PROBE_ENDPOINT", "oss.example.com"), ("CB_PROBE_IDLE_TIMEOUT", "soon")]:
        with pytest.raises(ConfigError) as info:
            load_config({**base, var: value})
        assert info.value.var == var
    for missing in base:
        with pytest.raises(ConfigError, match=missing):
            load_config({k: v for k, v in base.items() if k != missing})
    with pytest.raises(ConfigError, match="CB_PROBE_ACCESS_KEY_SECRET"):
        load_config({**base, "CB_PROBE_ACCESS_KEY_ID": "AKID"})
    cfg = load_config({**base, "CB_PROBE_ACCESS_KEY_ID": "AKID", "CB_PROBE_ACCESS_KEY_SECRET": "s3cr3t"})
    assert "s3cr3t" not in repr(cfg) and "s3cr3t" not in str(cfg.model_dump())


def test_ssrf_guard() -> None:
    for bad in ["169.254.169.254", "100.100.100.200", "fe80::1", "fd00:ec2::254", "::ffff:169.254.1.1", "0.0.0.0"]:
        assert blocked_address(bad), bad
    for ok in ["127.0.0.1", "10.0.0.1", "100.100.100.201", "::1", "8.8.8.8"]:
        assert blocked_address(ok) is None, ok

    async def go() -> None:
        assert await check_target("http://127.0.0.1:8080/x") == ["127.0.0.1"]
        for url in ["http://100.100.100.200/latest/meta-data/", "http://[fe80::1]/", "file:///etc/passwd",
                    "http://169.254.169.254:80/"]:
            with pytest.raises(TargetRefused):
                await check_target(url)
        loop = asyncio.get_running_loop()

        async def fake_getaddrinfo(host: str, port: int, **kw: Any) -> list[Any]:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", port))]

        loop.getaddrinfo = fake_getaddrinfo  # type: ignore[method-assign]
        with pytest.raises(TargetRefused, match="metadata-ish.example resolves|169.254.169.254"):
            await check_target("http://metadata-ish.example/")

    asyncio.run(go())


def test_sse_framing_and_percentiles() -> None:
    p = SseParser()
    assert p.feed(b'data: {"choices":[{"delta":{"role":"assistant"}}]}\r\n\r\nda') == [
        '{"choices":[{"delta":{"role":"assistant"}}]}']
    assert p.feed(b'ta: {"choices":[{"delta":{"content":"Hi"}}]}\n\n: comment\n\ndata: [DONE]\n\n') == [
        '{"choices":[{"delta":{"content":"Hi"}}]}', "[DONE]"]
    assert token_of('{"choices":[{"delta":{"content":"Hi"}}]}') == "Hi"
    assert token_of('{"choices":[{"delta":{"content":""}}]}') == "" and token_of('{"choices":[]}') == ""
    values = sorted(float(v) for v in range(1, 11))
    assert (percentile(values, 0.5), percentile(values, 0.9), percentile(values, 1.0)) == (5.0, 9.0, 10.0)
    assert percentile([7.0], 0.9) == 7.0
    assert encode_chunk([{"a": 1}, {"b": 2}]) == b'{"a":1}\n{"b":2}\n'


# -- real carriers against localcloud OSS ----------------------------------------------------------------
def wait_for(pred: Callable[[], Any], timeout: float = 15.0, step: float = 0.1, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"{what} not met within {timeout}s")


class Bench:
    """One localcloud (OSS + AgentRun target) and the control side's half of the protocol, for tests."""

    def __init__(self, cloud: Any, tmp: Path):
        self.cloud = cloud
        self.tmp = tmp
        admin = cloud.ctx.admin
        self.store = OssBlobStore(BUCKET, region=cloud.ctx.region, endpoint=cloud.endpoints["oss"], timeout_s=5,
                                  credentials=oss2.credentials.StaticCredentialsProvider(
                                      admin.access_key_id, admin.access_key_secret))
        self.admin = OssAdmin(cloud.endpoints["oss"], admin.access_key_secret)
        self.procs: list[subprocess.Popen[bytes]] = []

    def env(self, uid: str, carrier: str, **over: Any) -> dict[str, str]:
        admin = self.cloud.ctx.admin
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CB_PROBE_BUCKET": BUCKET,
               "CB_PROBE_REGION": self.cloud.ctx.region, "CB_PROBE_ENDPOINT": self.cloud.endpoints["oss"],
               "CB_PROBE_CAMPAIGN_UID": uid, "CB_PROBE_CARRIER_ID": carrier, "CB_PROBE_INSTANCE_ID": "i-test",
               "CB_PROBE_POLL_INTERVAL": "0.2", "CB_PROBE_HEARTBEAT_INTERVAL": "0.5",
               "CB_PROBE_PROGRESS_INTERVAL": "0.5", "CB_PROBE_IDLE_TIMEOUT": "120", "CB_PROBE_DRAIN_TIMEOUT": "10",
               "CB_PROBE_STORE_TIMEOUT": "2", "CB_PROBE_ACCESS_KEY_ID": admin.access_key_id,
               "CB_PROBE_ACCESS_KEY_SECRET": admin.access_key_secret}
        env.update({f"CB_PROBE_{k.upper()}": str(v) for k, v in over.items()})
        return env

    def start(self, uid: str, carrier: str, **over: Any) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{carrier}-{len(self.procs)}.log", "wb")  # noqa: SIM115 (owned by the process)
        proc = subprocess.Popen([str(CB_PROBE)], env=self.env(uid, carrier, **over), stdout=log, stderr=log)
        proc.log_path = log.name  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return Path(proc.log_path).read_text()  # type: ignore[attr-defined]

    def dispatch(self, uid: str, probe: str = "sleep", params: dict[str, Any] | None = None, *,
                 url: str = "http://127.0.0.1:9", timeout_s: float = 30, max_attempts: int = 2,
                 raw: bytes | None = None, job: str | None = None) -> str:
        keys = Keys(uid)
        job = job or f"j{datetime.now(timezone.utc):%Y%m%d%H%M%S}-{secrets.token_hex(3)}"
        body = raw if raw is not None else JobSpec(
            job_id=job, campaign_uid=uid, probe=probe, params=params or {}, target=Target(url=url),
            timeout_s=timeout_s, max_attempts=max_attempts, created_at=datetime.now(timezone.utc)).to_bytes()
        assert self.store.put_if_absent(keys.spec(job), body)
        self.store.put(keys.job_signal(job), JobSignal(job_id=job, created_at=datetime.now(timezone.utc)).to_bytes())
        return job

    def result(self, uid: str, job: str) -> Result | None:
        blob = self.store.get(Keys(uid).result(job))
        return parse(Result, "result", blob.body) if blob else None

    def wait_result(self, uid: str, job: str, timeout: float = 20) -> Result:
        return wait_for(lambda: self.result(uid, job), timeout=timeout, what=f"result of {job}")  # type: ignore[no-any-return]

    def heartbeat(self, uid: str, carrier: str) -> Heartbeat | None:
        blob = self.store.get(Keys(uid).heartbeat(carrier))
        return parse(Heartbeat, "hb", blob.body) if blob else None

    def final(self, uid: str, carrier: str) -> Final | None:
        blob = self.store.get(Keys(uid).final(carrier))
        return parse(Final, "final", blob.body) if blob else None

    def keys_under(self, prefix: str) -> list[str]:
        return sorted(o.key for o in self.store.list(prefix))

    def stop(self, uid: str, carrier: str | None = None, drain_s: float = 30) -> None:
        keys = Keys(uid)
        self.store.put(keys.stop_carrier(carrier) if carrier else keys.stop_all,
                       Stop(drain_s=drain_s, created_at=datetime.now(timezone.utc)).to_bytes())


@pytest.fixture
def bench(make_cloud: Any, tmp_path: Path) -> Iterator[Bench]:
    cloud = make_cloud(services=["oss", "agentrun"], config={"oss": {"buckets": [BUCKET]}})
    b = Bench(cloud, tmp_path)
    yield b
    for proc in b.procs:  # only the processes this test started, by pid
        if proc.poll() is None:
            with __import__("contextlib").suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait(10)


def uid() -> str:
    return f"c-{secrets.token_hex(4)}"


def listening_sockets(pid: int) -> list[str]:
    """TCP sockets of `pid` in LISTEN state (fd inodes matched against /proc/<pid>/net/tcp*)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with __import__("contextlib").suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:
                found.append(f"{table} {cols[1]}")
    return found


def test_missing_or_invalid_env_exits_2_naming_it(bench: Bench) -> None:
    env = bench.env(uid(), "car-a")
    del env["CB_PROBE_BUCKET"]
    proc = subprocess.run([str(CB_PROBE)], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "CB_PROBE_BUCKET" in proc.stderr
    env = bench.env(uid(), "car-a", heartbeat_interval="often")
    proc = subprocess.run([str(CB_PROBE)], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "CB_PROBE_HEARTBEAT_INTERVAL" in proc.stderr
    assert env["CB_PROBE_ACCESS_KEY_SECRET"] not in proc.stderr


def test_job_heartbeat_idle_timeout_and_request_budget(bench: Bench) -> None:
    u = uid()
    proc = bench.start(u, "car-a", idle_timeout=6, poll_interval=0.5, heartbeat_interval=1)
    wait_for(lambda: bench.heartbeat(u, "car-a"), what="first heartbeat")
    assert listening_sockets(proc.pid) == []
    job = bench.dispatch(u, "sleep", {"seconds": 1})
    res = bench.wait_result(u, job)
    assert res.status is ResultStatus.succeeded and res.attempt == 1 and res.carrier_id == "car-a"
    assert res.observations["slept_s"] == 1.0
    vantage = res.observations["vantage"]  # no metadata service here: unknown facts are None, not guessed
    assert vantage["carrier_id"] == "car-a" and vantage["instance_id"] == "i-test" and vantage["in_vpc"] is None
    assert res.observations["provenance"]["csbench_version"] == "0.1.0"
    manifest = parse(TelemetryManifest, "m", bench.store.get(res.telemetry_manifest).body)  # type: ignore[arg-type,union-attr]
    for chunk in manifest.chunks:
        assert hashlib.sha256(bench.store.get(chunk.key).body).hexdigest() == chunk.sha256  # type: ignore[union-attr]
    assert bench.store.get(Keys(u).progress(job)) is not None
    assert listening_sockets(proc.pid) == []
    # Idle request budget: one LIST per poll + one PUT per heartbeat, nothing else.
    bench.admin.reset_stats()
    time.sleep(4.0)
    stats = bench.admin.stats()["requests"]
    assert stats.get("ListObjectsV2", 0) <= 4 / 0.5 + 2, stats
    assert stats.get("PutObject", 0) <= 4 / 1 + 2, stats
    assert set(stats) <= {"ListObjectsV2", "PutObject"}, stats
    hb1 = bench.heartbeat(u, "car-a")
    time.sleep(1.2)
    hb2 = bench.heartbeat(u, "car-a")
    assert hb1 and hb2 and hb2.seq > hb1.seq and hb2.incarnation == hb1.incarnation
    assert hb2.counters["jobs_succeeded"] == 1 and hb2.state.value == "idle" and hb2.instance_id == "i-test"
    assert proc.wait(15) == 0
    final = bench.final(u, "car-a")
    assert final and final.exit_reason.value == "IdleTimeout"
    assert bench.heartbeat(u, "car-a").state.value == "stopped"  # type: ignore[union-attr]
    assert bench.cloud.ctx.admin.access_key_secret not in bench.log(proc)


def test_two_carriers_race_for_one_job(bench: Bench) -> None:
    u = uid()
    a, b = bench.start(u, "car-a"), bench.start(u, "car-b")
    wait_for(lambda: bench.heartbeat(u, "car-a") and bench.heartbeat(u, "car-b"), what="both heartbeats")
    jobs = [bench.dispatch(u, "sleep", {"seconds": 0.5}) for _ in range(3)]
    for job in jobs:
        res = bench.wait_result(u, job)
        assert res.status is ResultStatus.succeeded and res.attempt == 1
        assert bench.keys_under(Keys(u).claims_dir(job)) == [Keys(u).claim(job, 1)]
        assert bench.keys_under(Keys(u).job_dir(job) + "superseded/") == []
    time.sleep(0.5)
    succeeded = sum(bench.heartbeat(u, c).counters.get("jobs_succeeded", 0) for c in ("car-a", "car-b"))  # type: ignore[union-attr]
    assert succeeded == 3
    bench.stop(u)
    assert a.wait(15) == 0 and b.wait(15) == 0


def test_sigkilled_carrier_job_is_taken_over(bench: Bench) -> None:
    u = uid()
    a = bench.start(u, "car-a")
    job = bench.dispatch(u, "sleep", {"seconds": 3})
    k = Keys(u)
    wait_for(lambda: bench.store.get(k.claim(job, 1)), what="claim 1")
    a.kill()
    a.wait(10)
    t0 = time.monotonic()
    b = bench.start(u, "car-b")
    res = bench.wait_result(u, job, timeout=20)
    assert res.status is ResultStatus.succeeded and res.attempt == 2 and res.carrier_id == "car-b"
    # Lease = 3 × 0.5 s; the takeover waited for it, then ran the 3 s job.
    assert time.monotonic() - t0 >= 1.5 + 3
    claim2 = parse(Claim, "c", bench.store.get(k.claim(job, 2)).body)  # type: ignore[union-attr]
    assert claim2.carrier_id == "car-b"
    assert "lost" in bench.log(b)
    bench.stop(u)
    assert b.wait(15) == 0


def test_zombie_attempts_late_result_is_kept_as_superseded(bench: Bench) -> None:
    u = uid()
    k = Keys(u)
    a = bench.start(u, "car-a")
    job = bench.dispatch(u, "sleep", {"seconds": 2})
    wait_for(lambda: bench.store.get(k.claim(job, 1)), what="claim 1")
    os.kill(a.pid, signal.SIGSTOP)  # a zombie: alive, but its heartbeat stops
    b = bench.start(u, "car-b")
    res = bench.wait_result(u, job, timeout=20)
    assert res.attempt == 2 and res.carrier_id == "car-b"
    os.kill(a.pid, signal.SIGCONT)
    late = wait_for(lambda: bench.store.get(k.job_dir(job) + "superseded/0001.json"), what="superseded result")
    zombie = parse(Result, "late", late.body)
    assert zombie.attempt == 1 and zombie.carrier_id == "car-a"
    again = bench.result(u, job)
    assert again is not None and again.attempt == 2 and again.carrier_id == "car-b"  # not overwritten
    bench.stop(u)
    assert a.wait(15) == 0 and b.wait(15) == 0


def test_bad_documents_fail_their_job_and_the_carrier_goes_on(bench: Bench) -> None:
    u = uid()
    proc = bench.start(u, "car-a")
    base = json.loads(JobSpec(job_id="x", campaign_uid=u, probe="sleep", target=Target(url="http://127.0.0.1:9"),
                              timeout_s=10, created_at=NOW).to_bytes())
    bad: dict[str, tuple[bytes | None, str, str]] = {}

    def spec(job: str, **change: Any) -> bytes:
        doc = {**base, "job_id": job, **change}
        return json.dumps({k: v for k, v in doc.items() if v is not None}).encode()

    cases: list[tuple[str, Callable[[str], bytes | None], dict[str, Any], str, str]] = [
        ("a1-malformed", lambda j: b'{"schema": "csbench.dev/v1", "kind": "JobSpec", ', {}, "SpecInvalid", "JSON"),
        ("a2-missing", lambda j: spec(j, timeout_s=None), {}, "SpecInvalid", "timeout_s"),
        ("a3-future", lambda j: spec(j, schema="csbench.dev/v2"), {}, "SpecInvalid", "unsupported schema"),
        ("a4-oversized", lambda j: spec(j, params={"pad": "x" * (1 << 20)}), {}, "SpecInvalid", "over the"),
        ("a5-unknown", lambda j: spec(j, probe="teleport"), {}, "UnknownProbe", "teleport"),
        ("a6-metadata", lambda j: spec(j, target={"url": "http://100.100.100.200/latest/meta-data/"}), {},
         "TargetRefused", "100.100.100.200"),
        ("a7-linklocal", lambda j: spec(j, target={"url": "http://[fe80::1]:80/"}), {}, "TargetRefused", "fe80"),
        ("a8-raises", lambda j: spec(j, params={"fail": "target exploded"}), {}, "ProbeError",
         "RuntimeError: target exploded"),
        ("a9-timeout", lambda j: spec(j, params={"seconds": 30}, timeout_s=0.5), {}, "Timeout", "timeout_s"),
    ]
    for name, body, _, reason, text in cases:
        bad[name] = (body(name), reason, text)
        bench.dispatch(u, raw=body(name), job=name)
    good = bench.dispatch(u, "sleep", {"seconds": 0.2}, job="b1-good")
    res = bench.wait_result(u, good, timeout=30)
    assert res.status is ResultStatus.succeeded
    for name, (_, reason, text) in bad.items():
        r = bench.result(u, name)
        assert r is not None, name
        assert r.reason == reason and text in str(r.message), (name, r)
        assert r.status is (ResultStatus.timed_out if reason == "Timeout" else ResultStatus.failed)
        assert bench.keys_under(Keys(u).claims_dir(name)) == [Keys(u).claim(name, 1)]
    assert proc.poll() is None
    hb = wait_for(lambda: (h := bench.heartbeat(u, "car-a")) and h.counters.get("jobs_failed", 0) >= 7
                  and h.counters.get("jobs_succeeded", 0) >= 1 and h)
    assert hb.counters["jobs_succeeded"] == 1 and hb.counters["jobs_timed_out"] == 1
    bench.stop(u)
    assert proc.wait(15) == 0


def test_stop_during_long_job_drains_within_the_bound(bench: Bench) -> None:
    u = uid()
    k = Keys(u)
    long_runner = bench.start(u, "car-a", drain_timeout=2)
    long_job = bench.dispatch(u, "sleep", {"seconds": 60}, timeout_s=120)
    wait_for(lambda: bench.store.get(k.claim(long_job, 1)), what="claim")
    quick_runner = bench.start(u, "car-b", drain_timeout=10)  # the only idle carrier: it takes the quick job
    quick = bench.dispatch(u, "sleep", {"seconds": 1.5})
    wait_for(lambda: bench.store.get(k.claim(quick, 1)), what="claim of the quick job")
    t0 = time.monotonic()
    bench.stop(u, drain_s=30)  # each carrier caps it with its CB_PROBE_DRAIN_TIMEOUT
    assert long_runner.wait(10) == 0
    assert time.monotonic() - t0 <= 2 + 0.2 + 2.5  # drain bound + one poll + cancel and writes
    res = bench.result(u, long_job)
    assert res and res.status is ResultStatus.cancelled and res.reason == "CarrierStopped"
    assert quick_runner.wait(15) == 0
    assert bench.result(u, quick).status is ResultStatus.succeeded  # type: ignore[union-attr]  # drained
    for c in ("car-a", "car-b"):
        final = bench.final(u, c)
        assert final and final.exit_reason.value == "Stopped"
        assert bench.heartbeat(u, c).state.value == "stopped"  # type: ignore[union-attr]


def test_stale_stop_of_another_campaign_cannot_touch_this_one(bench: Bench) -> None:
    old, new = uid(), uid()
    bench.stop(old)
    bench.stop(old, "car-a")
    proc = bench.start(new, "car-a")
    res = bench.wait_result(new, bench.dispatch(new, "sleep", {"seconds": 0.2}))
    assert res.status is ResultStatus.succeeded
    time.sleep(1.0)
    assert proc.poll() is None and bench.final(new, "car-a") is None
    bench.stop(new, "car-a")  # a per-carrier stop of this campaign works
    assert proc.wait(15) == 0
    assert bench.final(new, "car-a").exit_reason.value == "Stopped"  # type: ignore[union-attr]


def test_cancel_is_honoured_within_a_second_of_being_seen(bench: Bench) -> None:
    u = uid()
    proc = bench.start(u, "car-a")
    job = bench.dispatch(u, "sleep", {"seconds": 60}, timeout_s=120)
    wait_for(lambda: (h := bench.heartbeat(u, "car-a")) and h.current_job, what="job running")
    t0 = time.monotonic()
    bench.store.put(Keys(u).cancel(job), b'{"schema":"csbench.dev/v1","kind":"Cancel","job_id":"' + job.encode() +
                    b'","created_at":"2025-01-01T00:00:00Z"}')
    res = bench.wait_result(u, job, timeout=5)
    elapsed = time.monotonic() - t0
    assert res.status is ResultStatus.cancelled and res.reason == "Cancelled"
    # seen within one busy poll (0.2 s), honoured within 1 s of that, plus the result write
    assert elapsed < 1.5, elapsed
    # A cancelled job is not picked again, and the carrier takes the next job.
    nxt = bench.dispatch(u, "sleep", {"seconds": 0.2})
    assert bench.wait_result(u, nxt).status is ResultStatus.succeeded
    bench.stop(u)
    assert proc.wait(15) == 0


def test_ttft_job_against_the_agentrun_target(bench: Bench) -> None:
    u = uid()
    proc = bench.start(u, "car-a")
    target = bench.cloud.endpoints["agentrun"]
    job = bench.dispatch(u, "ttft", {"samples": 6, "warmup": 1, "session": "per_sample"}, url=target)
    res = bench.wait_result(u, job, timeout=30)
    assert res.status is ResultStatus.succeeded, res
    obs = res.observations
    lat = obs["runs"][0]["summary"]["latency_ms"]["ttft"]
    assert obs["kind"] == "ttft" and lat["n"] == 6 and len(obs["samples"]) == 6
    assert obs["runs"][0]["summary"]["counts"]["errors"] == {} and obs["verdict"] == "valid"
    ttfts = sorted(s["ttft_ms"] for s in obs["samples"])
    assert obs["findings"]["ttft_p50_ms"] == ttfts[2] and obs["findings"]["ttft_max_ms"] == ttfts[-1]
    for s in obs["samples"]:
        assert 0 < s["headers_ms"] <= s["first_event_ms"] <= s["ttft_ms"] <= s["total_ms"]
        assert s["ttft_ms"] >= 10  # the target's configured TTFT is 10 ms
    assert len({s["session_id"] for s in obs["samples"]}) == 6
    manifest = parse(TelemetryManifest, "m", bench.store.get(res.telemetry_manifest).body)  # type: ignore[arg-type,union-attr]
    [chunk] = manifest.chunks
    body = bench.store.get(chunk.key).body  # type: ignore[union-attr]
    assert hashlib.sha256(body).hexdigest() == chunk.sha256 and chunk.records == 7  # warm-up included
    # A target that always fails: the job fails, errors counted by class.
    failing = bench.dispatch(u, "ttft", {"samples": 2, "warmup": 0}, url=target.rsplit(":", 1)[0] + ":9")
    bad = bench.wait_result(u, failing, timeout=30)
    assert bad.status is ResultStatus.failed and "transport" in str(bad.message)
    # Unknown params are refused by name (the seed ignored `warmup` remotely).
    typo = bench.dispatch(u, "ttft", {"sampels": 2}, url=target)
    refused = bench.wait_result(u, typo, timeout=30)
    assert refused.status is ResultStatus.failed and "unknown params ['sampels']" in str(refused.message)
    bench.stop(u)
    assert proc.wait(15) == 0


@pytest.mark.slow
def test_survives_30s_of_oss_errors_and_timeouts(bench: Bench) -> None:
    u = uid()
    proc = bench.start(u, "car-a")
    wait_for(lambda: bench.heartbeat(u, "car-a"), what="first heartbeat")
    job = bench.dispatch(u, "sleep", {"seconds": 2}, timeout_s=60)
    wait_for(lambda: bench.store.get(Keys(u).claim(job, 1)), what="claim")
    before = bench.heartbeat(u, "car-a")
    assert before is not None
    # The first live matching rule wins: ~30 % of requests stall past the 2 s client timeout, the rest get 500.
    bench.admin.add_fault(action="stall", seconds=4, probability=0.3, duration=30)
    bench.admin.add_fault(action="error", status=500, code="InternalError", duration=30)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 30:
        assert proc.poll() is None, bench.log(proc)
        time.sleep(1)
    res = bench.wait_result(u, job, timeout=45)  # the result was held while the store was down
    assert res.status is ResultStatus.succeeded and res.attempt == 1
    hb = wait_for(lambda: (h := bench.heartbeat(u, "car-a")) and h.seq > before.seq + 2 and h)
    assert hb.incarnation == before.incarnation and hb.counters["store_errors"] > 5
    assert hb.last_error and ("500" in hb.last_error or "timed out" in hb.last_error.lower()), hb.last_error
    bench.stop(u)
    assert proc.wait(20) == 0


def test_target_credentials_by_reference_never_leak(bench: Bench) -> None:
    """A job names its target's key by reference; the carrier reads the Secret when the job starts. The value
    reaches the target and nothing else: not the spec, result, progress, heartbeat, telemetry or log."""
    import requests

    from csbench.probe.control import CampaignChannel

    key_value = "sk-" + secrets.token_hex(16)
    target = bench.cloud.endpoints["agentrun"]
    assert requests.put(f"{target}/-/config", json={"api_key": key_value}, timeout=5).ok
    u = uid()
    channel = CampaignChannel(bench.store, u)
    channel.put_secret("agentrun-key", key_value)
    proc = bench.start(u, "car-a")
    spec = channel.job_spec(probe="ttft", target=Target(url=target, credential_ref="agentrun-key"), timeout_s=30,
                            params={"samples": 2, "warmup": 0})
    ok = bench.wait_result(u, channel.dispatch(spec), timeout=30)
    assert ok.status is ResultStatus.succeeded, ok
    missing = channel.job_spec(probe="ttft", target=Target(url=target, credential_ref="no-such-key"), timeout_s=30,
                               params={"samples": 1, "warmup": 0})
    refused = bench.wait_result(u, channel.dispatch(missing), timeout=30)
    assert refused.status is ResultStatus.failed and "no-such-key" in str(refused.message)
    bench.stop(u)
    assert proc.wait(15) == 0
    leaked = [k for k in bench.keys_under(Keys(u).prefix)
              if not k.endswith("secrets/agentrun-key.json") and key_value.encode() in bench.store.get(k).body]  # type: ignore[union-attr]
    assert leaked == [] and key_value not in bench.log(proc)
