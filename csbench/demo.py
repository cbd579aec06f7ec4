"""`make demo`: the data plane end to end on one machine, through the real protocols.

localcloud (OSS, ECS with its instance sandbox and metadata service, an AgentRun-like target) → a dev wheel
of this checkout uploaded to OSS → a carrier VM booted through the ECS API from the real user-data (stock
image, venv, pip install of the wheel checked by sha256, cb-probe under systemd, the instance role's STS
credentials) → ttft jobs dispatched through OSS → progress while they run → a results table → stop, drain,
power off, DeleteInstances. Until the operator exists, this script plays the control plane's part with the
same CampaignChannel the operator will use.
"""

from __future__ import annotations

import base64
import hashlib
import sys
import sysconfig
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

BUCKET = "csbench-demo"
ROLE = "CsbenchCarrierRole"
TARGET = {  # ground truth the measurements should recover
    "cold_start": {"kind": "constant", "value": 0.8},
    "ttft": {"kind": "normal", "mean": 0.120, "std": 0.015, "min": 0.08},
    "inter_token": {"kind": "constant", "value": 0.010},
    "output_tokens": 12,
}


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, step: float = 0.3) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(step)
    raise TimeoutError(f"demo: gave up waiting for {what} after {timeout:.0f}s")


def run_demo() -> int:
    import oss2.credentials
    from alibabacloud_ecs20140526 import models as ecs
    from alibabacloud_ecs20140526.client import Client
    from alibabacloud_tea_openapi import models as om

    from csbench.devwheel import build_dev_wheel
    from csbench.localcloud.cloud import LocalCloudThread
    from csbench.localcloud.ecs.server import service_for
    from csbench.operator.userdata import DevWheel, render_user_data
    from csbench.probe.blobstore import OssBlobStore
    from csbench.probe.control import CampaignChannel
    from csbench.probe.protocol import Target

    with tempfile.TemporaryDirectory(prefix="csbench-demo-") as tmp:
        say("starting localcloud: OSS, ECS (+ metadata service, instance sandbox), AgentRun-like target")
        cloud = LocalCloudThread(Path(tmp) / "cloud", services=["oss", "ecs", "agentrun"], config={
            "oss": {"buckets": [BUCKET]},
            "ecs": {"pending_seconds": 0.5, "starting_seconds": 0.5},
            "agentrun": TARGET,
        }).start()
        try:
            for name, url in cloud.endpoints.items():
                say(f"  {name:9s} {url}")
            admin = cloud.ctx.admin
            cloud.ctx.credentials.create_role(ROLE, created_at=time.time() - 600)
            store = OssBlobStore(BUCKET, region=cloud.ctx.region, endpoint=cloud.endpoints["oss"], timeout_s=5,
                                 credentials=oss2.credentials.StaticCredentialsProvider(
                                     admin.access_key_id, admin.access_key_secret))

            say("building a dev wheel of this checkout and uploading it to OSS")
            wheel = build_dev_wheel(Path(tmp) / "wheel")
            body = wheel.read_bytes()
            store.put(f"dev-wheels/{wheel.name}", body, "application/octet-stream")
            url = store.presign("GET", f"dev-wheels/{wheel.name}", 3600)

            campaign_uid = f"demo-{uuid.uuid4().hex[:8]}"
            carrier_id = "carrier-0"
            channel = CampaignChannel(store, campaign_uid, poll_interval_s=0.5, heartbeat_lease_s=3.0)
            user_data = render_user_data(
                bucket=BUCKET, region=cloud.ctx.region, campaign_uid=campaign_uid, carrier_id=carrier_id,
                endpoint=cloud.endpoints["oss"],
                package=DevWheel(url=url, sha256=hashlib.sha256(body).hexdigest(), filename=wheel.name),
                settings={"CB_PROBE_POLL_INTERVAL": "0.5", "CB_PROBE_HEARTBEAT_INTERVAL": "1",
                          "CB_PROBE_IDLE_TIMEOUT": "300"},
                # localcloud runs offline: the carrier's venv sees this interpreter's packages instead of PyPI.
                python=getattr(sys, "_base_executable", sys.executable),
                pip_args=["--no-deps", "--no-index"], extra_site_packages=[sysconfig.get_paths()["purelib"]])

            ecs_client = Client(om.Config(access_key_id=admin.access_key_id,
                                          access_key_secret=admin.access_key_secret, region_id=cloud.ctx.region,
                                          endpoint=cloud.endpoints["ecs"].removeprefix("http://"), protocol="HTTP"))
            image = ecs_client.describe_images(ecs.DescribeImagesRequest(
                region_id=cloud.ctx.region, image_owner_alias="system")).body.images.image[0].image_id
            release = (datetime.now(timezone.utc) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
            run = ecs_client.run_instances(ecs.RunInstancesRequest(
                region_id=cloud.ctx.region, image_id=image, instance_type="ecs.t6-c1m1.large", amount=1,
                client_token=f"{campaign_uid}-{carrier_id}-1", ram_role_name=ROLE, internet_max_bandwidth_out=0,
                v_switch_id="vsw-csbench-demo", security_group_id="sg-csbench-demo",
                auto_release_time=release, user_data=base64.b64encode(user_data.encode()).decode(),
                tag=[ecs.RunInstancesRequestTag(key="csbench.dev/campaign", value=campaign_uid),
                     ecs.RunInstancesRequestTag(key="csbench.dev/carrier", value=carrier_id)]))
            instance_id = run.body.instance_id_sets.instance_id_set[0]
            say(f"RunInstances → {instance_id} (image {image}, stock OS, no public IP, auto-release {release})")

            booted = _watch_boot(channel, store, ecs_client, ecs, cloud.ctx.region, instance_id, carrier_id)
            if not booted:
                say("the carrier did not come up; its console log:")
                print(service_for(cloud.ctx).console_log(instance_id))
                return 1

            target = Target(url=cloud.endpoints["agentrun"])
            jobs = {
                channel.dispatch(channel.job_spec(probe="ttft", target=target, timeout_s=120,
                                                  params={"samples": 4, "warmup": 0, "session": "per_sample"})):
                    "cold: new session per request",
                channel.dispatch(channel.job_spec(probe="ttft", target=target, timeout_s=120,
                                                  params={"samples": 20, "warmup": 2, "session": "per_job"})):
                    "warm: one session, 2 warm-ups",
            }
            say(f"dispatched {len(jobs)} ttft jobs through OSS: {', '.join(jobs)}")
            results = _watch_jobs(channel, set(jobs))

            _print_results(results, jobs)
            from csbench.report.load import load_channel
            from csbench.report.render import render_report

            report_path = Path("build/demo/report.html").resolve()
            report_path.parent.mkdir(parents=True, exist_ok=True)
            report_path.write_text(render_report(load_channel(channel, source=f"oss://{BUCKET}")))
            say(f"HTML report (charts, percentiles): {report_path}")

            say(f"stop {carrier_id}: drain, final heartbeat, final.json, power off")
            channel.stop(carrier_id, drain_s=10)
            final = wait_for("the carrier's final.json", lambda: next(
                (c.final for c in channel.list_carriers() if c.carrier_id == carrier_id and c.final), None), 30)
            say(f"carrier exited: {final.exit_reason.value} ({final.message or 'no message'}), "
                f"counters {final.counters}")
            wait_for("the instance to power off", lambda: _status(ecs_client, ecs, cloud.ctx.region,
                                                                  instance_id) == "Stopped", 30)
            say(f"{instance_id} is Stopped; DeleteInstances")
            ecs_client.delete_instances(ecs.DeleteInstancesRequest(region_id=cloud.ctx.region,
                                                                    instance_id=[instance_id], force=True))
            wait_for("the instance to be gone", lambda: _status(ecs_client, ecs, cloud.ctx.region,
                                                                instance_id) is None or None, 30)
            say(f"{instance_id} is gone. Demo complete.")
            return 0 if all(r.status.value == "succeeded" for r in results.values()) else 1
        finally:
            cloud.stop()


def _status(client: Any, ecs: Any, region: str, instance_id: str) -> str | None:
    body = client.describe_instances(ecs.DescribeInstancesRequest(
        region_id=region, instance_ids=f'["{instance_id}"]')).body
    found = body.instances.instance if body.instances else []
    return str(found[0].status) if found else None


def _watch_boot(channel: Any, store: Any, client: Any, ecs: Any, region: str, instance_id: str,
                carrier_id: str, timeout: float = 180) -> bool:
    """Print instance status, boot stages and the first heartbeat as they appear."""
    deadline = time.monotonic() + timeout
    seen_status, seen_stages = None, 0
    while time.monotonic() < deadline:
        status = _status(client, ecs, region, instance_id)
        if status != seen_status:
            say(f"instance {instance_id}: {status}")
            seen_status = status
        log = channel.read_boot_log(carrier_id) or ""
        lines = log.splitlines()
        for line in lines[seen_stages:]:
            say(f"boot: {line}")
        seen_stages = len(lines)
        if "failed" in log:
            return False
        obs = channel.observe()
        for hb in obs.heartbeats:
            say(f"heartbeat from {hb.carrier_id}: seq {hb.seq}, state {hb.state.value}, "
                f"csbench {hb.package_version}, instance {hb.instance_id}")
            return True
        time.sleep(0.5)
    return False


def _watch_jobs(channel: Any, pending: set[str], timeout: float = 300) -> dict[str, Any]:
    results: dict[str, Any] = {}
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        obs = channel.observe()
        for claim in obs.claims:
            say(f"job {claim.job_id}: claimed by {claim.carrier_id} (attempt {claim.attempt})")
        for prog in obs.progress:
            total = f"/{prog.total}" if prog.total else ""
            p50 = prog.metrics.get("ttft_p50_ms")
            extra = f", ttft p50 so far {p50:.1f} ms" if p50 is not None else ""
            say(f"job {prog.job_id}: {prog.phase.value} {prog.completed}{total}{extra}")
        for res in obs.results:
            say(f"job {res.job_id}: {res.status.value}" + (f" ({res.reason}: {res.message})" if res.reason else ""))
            results[res.job_id] = res
            pending.discard(res.job_id)
        for problem in obs.problems:
            say(f"problem: {problem}")
        time.sleep(channel.poll_interval_s)
    if pending:
        raise TimeoutError(f"demo: jobs {sorted(pending)} did not finish within {timeout:.0f}s")
    return results


def _print_results(results: dict[str, Any], labels: dict[str, str]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="TTFT measured by the carrier, ms (target's truth: cold start 800 + TTFT ~120 ± 15)")
    for col in ("job", "scenario", "status", "n", "ttft p50", "ttft p90", "ttft max", "errors"):
        table.add_column(col, justify="right" if col not in ("job", "scenario", "status") else "left")
    for job_id, res in sorted(results.items()):
        ttft = res.observations.get("ttft_ms") or {}
        errors = sum((res.observations.get("errors") or {}).values())

        def fmt(key: str, ttft: dict[str, Any] = ttft) -> str:
            return f"{ttft[key]:.1f}" if isinstance(ttft.get(key), (int, float)) else "-"

        table.add_row(job_id, labels.get(job_id, ""), res.status.value, str(ttft.get("n", 0)), fmt("p50"),
                      fmt("p90"), fmt("max"), str(errors))
    Console(width=max(Console().width, 110)).print(table)
