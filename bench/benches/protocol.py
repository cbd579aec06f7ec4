"""Figures for the carrier wire protocol, with a real `cb-probe` against localcloud OSS (counted by `/-/stats`).

- protocol_idle_carrier: object-store requests per minute of an idle carrier at the default intervals
  (poll 2 s, heartbeat 5 s; budget 30 LIST + 12 PUT = 42/min, docs/protocol.md);
- protocol_latency: dispatch → claim (claim.claimed_at against the dispatch's wall time, same host) with a
  1 s carrier poll, and heartbeat write → control-side observation (observe() every 1 s), p50/p99;
  plus the control side's own requests per minute while doing it.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benches import Figure, bench, percentile

BUCKET = "bench"
CB_PROBE = Path(sys.executable).parent / "cb-probe"


@contextmanager
def _cloud() -> Iterator[tuple[object, object, object]]:
    import oss2.credentials

    from csbench.localcloud.cloud import LocalCloudThread
    from csbench.localcloud.oss.admin import OssAdmin
    from csbench.probe.blobstore import OssBlobStore

    with tempfile.TemporaryDirectory() as tmp, LocalCloudThread(
            Path(tmp), services=["oss"], config={"oss": {"buckets": [BUCKET]}}) as cloud:
        admin = cloud.ctx.admin
        store = OssBlobStore(BUCKET, region=cloud.ctx.region, endpoint=cloud.endpoints["oss"],
                             credentials=oss2.credentials.StaticCredentialsProvider(admin.access_key_id,
                                                                                    admin.access_key_secret))
        yield cloud, store, OssAdmin(cloud.endpoints["oss"], admin.access_key_secret)


@contextmanager
def _carrier(cloud: object, uid: str, carrier_id: str, **env: str) -> Iterator[subprocess.Popen[bytes]]:
    if not CB_PROBE.exists():
        raise RuntimeError(f"{CB_PROBE} does not exist: install the package (make dev) — no figure without a carrier")
    admin = cloud.ctx.admin  # type: ignore[attr-defined]
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CB_PROBE_BUCKET": BUCKET,
            "CB_PROBE_REGION": cloud.ctx.region, "CB_PROBE_ENDPOINT": cloud.endpoints["oss"],  # type: ignore[attr-defined]
            "CB_PROBE_CAMPAIGN_UID": uid, "CB_PROBE_CARRIER_ID": carrier_id, "CB_PROBE_INSTANCE_ID": "i-bench",
            "CB_PROBE_IDLE_TIMEOUT": "600", "CB_PROBE_ACCESS_KEY_ID": admin.access_key_id,
            "CB_PROBE_ACCESS_KEY_SECRET": admin.access_key_secret, "CB_PROBE_LOG_LEVEL": "WARNING", **env}
    proc = subprocess.Popen([str(CB_PROBE)], env=full, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _wait_heartbeat(store: object, uid: str, carrier_id: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    from csbench.probe.protocol import Keys

    key = Keys(uid).heartbeat(carrier_id)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise RuntimeError(f"cb-probe exited with {proc.returncode} before its first heartbeat: {err[-800:]}")
        if store.get(key) is not None:  # type: ignore[attr-defined]
            return
        time.sleep(0.1)
    raise RuntimeError(f"cb-probe wrote no heartbeat at {key} within {timeout:.0f}s")


@bench("protocol_idle_carrier")
def idle_carrier() -> list[Figure]:
    window_s = 30.0
    uid = "bench-idle"
    with _cloud() as (cloud, store, admin), _carrier(cloud, uid, "idle-1") as proc:
        _wait_heartbeat(store, uid, "idle-1", proc)  # boot requests are not the steady state
        time.sleep(1.0)
        admin.reset_stats()  # type: ignore[attr-defined]
        t0 = time.monotonic()
        time.sleep(window_s)
        stats = admin.stats()  # type: ignore[attr-defined]
        elapsed = time.monotonic() - t0
        if proc.poll() is not None:
            raise RuntimeError(f"cb-probe exited ({proc.returncode}) during the idle window")
    per_min = {op: n * 60.0 / elapsed for op, n in stats["requests"].items()}
    total = sum(per_min.values())
    detail = ", ".join(f"{op} {v:.1f}" for op, v in sorted(per_min.items()))
    return [
        Figure("protocol_idle_carrier_requests_per_min", total, "req/min",
               f"default poll 2 s, heartbeat 5 s; budget 42/min; {window_s:.0f} s window: {detail}"),
        Figure("protocol_idle_carrier_list_per_min", per_min.get("ListObjectsV2", 0.0), "req/min", "budget 30"),
        Figure("protocol_idle_carrier_put_per_min", per_min.get("PutObject", 0.0), "req/min", "budget 12"),
    ]


@bench("protocol_latency")
def latency() -> list[Figure]:
    from csbench.probe.control import CampaignChannel
    from csbench.probe.protocol import Target

    jobs_n, poll_s = 40, 1.0
    uid = "bench-latency"
    claim_lat: list[float] = []
    hb_lat: list[float] = []
    with _cloud() as (cloud, store, _admin), _carrier(cloud, uid, "lat-1", CB_PROBE_POLL_INTERVAL="1",
                                                      CB_PROBE_HEARTBEAT_INTERVAL="1.37") as proc:
        _wait_heartbeat(store, uid, "lat-1", proc)
        ch = CampaignChannel(store, uid, poll_interval_s=poll_s, heartbeat_lease_s=6.0)  # type: ignore[arg-type]
        lock = threading.Lock()  # the channel is single-threaded: dispatch and observe take turns
        dispatched: dict[str, float] = {}
        finished: dict[str, threading.Event] = {}
        stop = threading.Event()
        control_requests = 0
        observe_started = time.monotonic()

        def observer() -> None:
            nonlocal control_requests
            tick = time.monotonic()
            while not stop.is_set():
                tick += poll_s
                time.sleep(max(0.0, tick - time.monotonic()))
                with lock:
                    obs = ch.observe()
                seen = time.time()
                control_requests += obs.requests
                for hb in obs.heartbeats:
                    hb_lat.append(seen - hb.wall_time.timestamp())
                for claim in obs.claims:
                    if claim.job_id in dispatched:
                        claim_lat.append(claim.claimed_at.timestamp() - dispatched[claim.job_id])
                for result in obs.results:
                    finished.setdefault(result.job_id, threading.Event()).set()

        thread = threading.Thread(target=observer, daemon=True)
        thread.start()
        try:
            for _ in range(jobs_n):
                time.sleep(random.uniform(0.0, poll_s))  # a uniform phase against the carrier's poll
                with lock:
                    spec = ch.job_spec(probe="sleep", target=Target(url="http://127.0.0.1:9"), timeout_s=30,
                                       params={"seconds": 0.01})
                    finished[spec.job_id] = threading.Event()
                    dispatched[spec.job_id] = time.time()
                    ch.dispatch(spec)
                if not finished[spec.job_id].wait(30):
                    raise RuntimeError(f"job {spec.job_id} got no result within 30 s; is cb-probe running jobs?")
        finally:
            stop.set()
            thread.join(10)
        minutes = (time.monotonic() - observe_started) / 60
    if len(claim_lat) < jobs_n:
        raise RuntimeError(f"saw {len(claim_lat)} claims for {jobs_n} jobs")
    claim_lat.sort()
    hb_lat.sort()
    return [
        Figure("protocol_dispatch_to_claim_p50", percentile(claim_lat, 50) * 1000, "ms",
               f"{len(claim_lat)} jobs, carrier poll 1 s"),
        Figure("protocol_dispatch_to_claim_p99", percentile(claim_lat, 99) * 1000, "ms", f"{len(claim_lat)} jobs"),
        Figure("protocol_heartbeat_to_observe_p50", percentile(hb_lat, 50) * 1000, "ms",
               f"{len(hb_lat)} heartbeats every 1.37 s (a phase that sweeps the poll), observe() every {poll_s:g} s"),
        Figure("protocol_heartbeat_to_observe_p99", percentile(hb_lat, 99) * 1000, "ms", f"{len(hb_lat)} heartbeats"),
        Figure("protocol_control_requests_per_min", control_requests / minutes, "req/min",
               f"observe() every {poll_s:g} s, 1 carrier, <= 1 active job (budget 60*(1+J) LIST + changed GETs)"),
    ]
