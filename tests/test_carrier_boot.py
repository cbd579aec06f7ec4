"""The carrier booted for real: a localcloud ECS instance runs the rendered user-data, which fetches a dev
wheel of this repository through a presigned URL (sha256-checked), installs it into a venv, starts
cb-probe under the systemctl shim with the instance role's STS credentials from the metadata service;
the carrier heartbeats, runs a ttft job, boot.log shows the stages, and DeleteInstances kills it."""

from __future__ import annotations

import base64
import hashlib
import json
import sys
import sysconfig
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import oss2.credentials
import pytest
from alibabacloud_ecs20140526 import models as m
from test_localcloud_ecs import REGION, RT, client, describe, run, wait_for

from csbench.devwheel import build_dev_wheel
from csbench.localcloud.ecs.sandbox import marked_pids
from csbench.localcloud.ecs.server import service_for
from csbench.operator.userdata import DevWheel, render_user_data
from csbench.probe.blobstore import OssBlobStore
from csbench.probe.protocol import Heartbeat, JobSignal, JobSpec, Keys, Result, ResultStatus, Target, parse

REPO = Path(__file__).resolve().parent.parent
BUCKET = "bench"
BOOT = {"pending_seconds": 0.1, "starting_seconds": 0.1, "kill_grace_seconds": 1.0}


@pytest.fixture(scope="session")
def dev_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_dev_wheel(tmp_path_factory.mktemp("wheel"))  # a real `pip wheel` of this checkout


@pytest.mark.slow
def test_carrier_boots_from_user_data_and_runs_a_job(make_cloud: Any, dev_wheel: Path) -> None:
    cloud = make_cloud(services=["oss", "ecs", "agentrun"],
                       config={"oss": {"buckets": [BUCKET]}, "ecs": BOOT})
    cloud.ctx.credentials.create_role("CarrierRole", created_at=time.time() - 600)
    admin = cloud.ctx.admin
    store = OssBlobStore(BUCKET, region=cloud.ctx.region, endpoint=cloud.endpoints["oss"], timeout_s=5,
                         credentials=oss2.credentials.StaticCredentialsProvider(admin.access_key_id,
                                                                                admin.access_key_secret))
    body = dev_wheel.read_bytes()
    store.put(f"dev-wheels/{dev_wheel.name}", body, "application/octet-stream")
    url = store.presign("GET", f"dev-wheels/{dev_wheel.name}", 600)
    uid, carrier = "c-boot1", "car-vm1"
    script = render_user_data(
        bucket=BUCKET, region=cloud.ctx.region, campaign_uid=uid, carrier_id=carrier,
        endpoint=cloud.endpoints["oss"],
        package=DevWheel(url=url, sha256=hashlib.sha256(body).hexdigest(), filename=dev_wheel.name),
        settings={"CB_PROBE_POLL_INTERVAL": "0.3", "CB_PROBE_HEARTBEAT_INTERVAL": "0.5",
                  "CB_PROBE_IDLE_TIMEOUT": "300"},
        python=sys._base_executable,  # type: ignore[attr-defined]
        # Offline: the test venv's dependencies are made visible to the carrier's venv instead of downloaded.
        pip_args=["--no-deps", "--no-index"], extra_site_packages=[sysconfig.get_paths()["purelib"]],
        poweroff=False)
    assert admin.access_key_secret not in script and admin.access_key_id not in script.replace(url, "")
    c = client(cloud)
    [iid] = run(c, ram_role_name="CarrierRole", v_switch_id="vsw-carriers", security_group_id="sg-carriers", user_data=base64.b64encode(script.encode()).decode())
    svc = service_for(cloud.ctx)
    keys = Keys(uid)

    def heartbeat() -> Heartbeat | None:
        blob = store.get(keys.heartbeat(carrier))
        return parse(Heartbeat, "hb", blob.body) if blob else None

    try:
        hb = wait_for(heartbeat, timeout=60, step=0.3)
    except AssertionError:
        raise AssertionError("no heartbeat; console:\n" + svc.console_log(iid)) from None
    assert hb.instance_id in (None, iid)
    hb = wait_for(lambda: (h := heartbeat()) and h.instance_id == iid and h, timeout=15, step=0.3)
    assert hb.package_version == "0.1.0"

    job = f"j{datetime.now(timezone.utc):%Y%m%d%H%M%S}-abc123"
    spec = JobSpec(job_id=job, campaign_uid=uid, probe="ttft", params={"samples": 3, "warmup": 1},
                   target=Target(url=cloud.endpoints["agentrun"]), timeout_s=60,
                   created_at=datetime.now(timezone.utc))
    assert store.put_if_absent(keys.spec(job), spec.to_bytes())
    store.put(keys.job_signal(job), JobSignal(job_id=job, created_at=datetime.now(timezone.utc)).to_bytes())
    blob = wait_for(lambda: store.get(keys.result(job)), timeout=30, step=0.3)
    res = parse(Result, "r", blob.body)
    assert res.status is ResultStatus.succeeded and res.carrier_id == carrier, res
    assert res.observations["runs"][-1]["label"] == "samples" and res.observations["runs"][-1]["summary"]["latency_ms"]["ttft"]["n"] == 3
    vantage = res.observations["vantage"]  # measured from this VM, and the result says so
    assert vantage["instance_id"] == iid and vantage["in_vpc"] is True and vantage["zone"]
    assert vantage["instance_type"] and vantage["image_id"] and vantage["package_version"] == "0.1.0"
    assert res.observations["provenance"]["spec_sha256"] == hashlib.sha256(spec.to_bytes()).hexdigest()

    boot_log = store.get(keys.boot_log(carrier)).body.decode()  # type: ignore[union-attr]
    stages = [line.split()[1] for line in boot_log.splitlines()]
    assert stages == ["user-data-started", "python-ready", "package-fetch", "package-verified",
                      "package-installed", "service-started"], boot_log
    # The carrier ran with the role's STS credentials, not static keys: its unit has none.
    unit = (cloud.ctx.state_dir / "ecs/instances" / iid / "root/etc/systemd/system/cb-probe.service").read_text()
    assert "ACCESS_KEY" not in unit and "CB_PROBE_METADATA_URL=http://127.0.0.1:" in unit

    c.delete_instances_with_options(m.DeleteInstancesRequest(region_id=REGION, instance_id=[iid], force=True), RT)
    wait_for(lambda: describe(c, instance_ids=json.dumps([iid])).total_count == 0, timeout=15)
    assert not marked_pids(iid)
    last = heartbeat()
    time.sleep(1.5)
    assert heartbeat() == last  # nothing heartbeats any more


def test_user_data_refuses_a_wheel_with_the_wrong_sha256(make_cloud: Any, dev_wheel: Path) -> None:
    cloud = make_cloud(services=["oss", "ecs"], config={"oss": {"buckets": [BUCKET]}, "ecs": BOOT})
    cloud.ctx.credentials.create_role("CarrierRole", created_at=time.time() - 600)
    admin = cloud.ctx.admin
    store = OssBlobStore(BUCKET, region=cloud.ctx.region, endpoint=cloud.endpoints["oss"], timeout_s=5,
                         credentials=oss2.credentials.StaticCredentialsProvider(admin.access_key_id,
                                                                                admin.access_key_secret))
    store.put(f"dev-wheels/{dev_wheel.name}", dev_wheel.read_bytes(), "application/octet-stream")
    script = render_user_data(
        bucket=BUCKET, region=cloud.ctx.region, campaign_uid="c-boot2", carrier_id="car-vm2",
        endpoint=cloud.endpoints["oss"],
        package=DevWheel(url=store.presign("GET", f"dev-wheels/{dev_wheel.name}", 600), sha256="0" * 64,
                         filename=dev_wheel.name),
        python=sys._base_executable, pip_args=["--no-deps", "--no-index"])  # type: ignore[attr-defined]
    [iid] = run(client(cloud), ram_role_name="CarrierRole", user_data=base64.b64encode(script.encode()).decode())
    key = Keys("c-boot2").boot_log("car-vm2")
    log = wait_for(lambda: (b := store.get(key)) and "failed" in b.body.decode() and b.body.decode(), timeout=30,
                   step=0.3)
    assert "dev wheel fetch or sha256 check failed" in log and "package-installed" not in log
    assert "sha256 mismatch" in service_for(cloud.ctx).console_log(iid)
    assert store.get(Keys("c-boot2").heartbeat("car-vm2")) is None
