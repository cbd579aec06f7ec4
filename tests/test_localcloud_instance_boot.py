"""Instances really boot: user-data runs in a private mount namespace, reads the metadata service, writes to
localcloud OSS with the role's STS credentials, installs a systemd unit the systemctl shim supervises, and
DeleteInstances / poweroff / a localcloud restart do to that process tree what they would do to a VM."""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import oss2
import requests
from alibabacloud_ecs20140526 import models as m
from test_localcloud_ecs import REGION, RT, client, describe, run, wait_for

from csbench.localcloud.ecs.sandbox import marked_pids
from csbench.localcloud.ecs.server import service_for

BOOT = {"pending_seconds": 0.1, "starting_seconds": 0.1, "kill_grace_seconds": 1.0}

PROBE = """\
import json, os, sys, time, urllib.request
import oss2
md = os.environ["CSBENCH_METADATA_URL"] + "/latest/meta-data/"
def get(path):
    return urllib.request.urlopen(md + path, timeout=5).read().decode()
iid = get("instance-id")
role = get("ram/security-credentials/").strip()
creds = json.loads(get("ram/security-credentials/" + role))
assert creds["Code"] == "Success", creds
bucket = oss2.Bucket(oss2.StsAuth(creds["AccessKeyId"], creds["AccessKeySecret"], creds["SecurityToken"]),
                     os.environ["OSS_ENDPOINT"], "bench")
bucket.put_object(f"{sys.argv[1]}/{iid}", json.dumps({"pid": os.getpid(), "zone": get("zone-id")}))
if sys.argv[1] == "heartbeat":
    while True:
        time.sleep(1)
"""

USER_DATA = """\
#!/bin/bash
set -euo pipefail
dnf install -y python3.11
mkdir -p /opt/probe
cat > /opt/probe/probe.py <<'EOF'
{probe}
EOF
OSS_ENDPOINT={oss} {python} /opt/probe/probe.py boot
cat > /opt/probe/probe.env <<'EOF'
OSS_ENDPOINT={oss}
EOF
cat > /etc/systemd/system/probe.service <<'EOF'
[Unit]
Description=csbench probe
[Service]
ExecStart={python} /opt/probe/probe.py heartbeat
EnvironmentFile=/opt/probe/probe.env
Environment=GREETING=hi
WorkingDirectory=/opt/probe
Restart=always
RestartSec=0.2
[Install]
WantedBy=multi-user.target
EOF
systemctl daemon-reload
systemctl enable --now probe
systemctl is-active probe
echo "user-data done"
"""


def test_user_data_uses_role_credentials_and_delete_kills_the_tree(make_cloud: Any) -> None:
    cloud = make_cloud(services=["oss", "ecs"], config={"ecs": BOOT})
    admin = cloud.ctx.admin
    oss_ep = cloud.endpoints["oss"]
    oss2.Bucket(oss2.Auth(admin.access_key_id, admin.access_key_secret), oss_ep, "bench").create_bucket()
    cloud.ctx.credentials.create_role("ProbeRole", created_at=time.time() - 600)
    script = USER_DATA.format(probe=PROBE, python=sys.executable, oss=oss_ep)
    c = client(cloud)
    [iid] = run(c, ram_role_name="ProbeRole", user_data=base64.b64encode(script.encode()).decode())
    bucket = oss2.Bucket(oss2.Auth(admin.access_key_id, admin.access_key_secret), oss_ep, "bench")
    svc = service_for(cloud.ctx)

    try:
        wait_for(lambda: bucket.object_exists(f"heartbeat/{iid}"), timeout=20, step=0.2)
    except AssertionError:
        raise AssertionError("no heartbeat; console:\n" + svc.console_log(iid)) from None
    assert bucket.object_exists(f"boot/{iid}")
    console = svc.console_log(iid)
    assert "user-data done" in console and "[csbench shim] dnf install -y python3.11" in console
    # The script wrote real absolute paths — into the instance's disk, not the host's.
    disk = cloud.ctx.state_dir / "ecs" / "instances" / iid / "root"
    assert (disk / "opt/probe/probe.py").exists() and not Path("/opt/probe").exists()
    assert (disk / "etc/systemd/system/probe.service").exists()
    assert not Path("/etc/systemd/system/probe.service").exists()

    # The service is supervised: kill it and it is restarted (Restart=always).
    first_pid = json.loads(bucket.get_object(f"heartbeat/{iid}").read())["pid"]
    bucket.delete_object(f"heartbeat/{iid}")
    os.kill(first_pid, 9)
    wait_for(lambda: bucket.object_exists(f"heartbeat/{iid}"), timeout=10, step=0.2)
    assert json.loads(bucket.get_object(f"heartbeat/{iid}").read())["pid"] != first_pid
    pids = svc.pids(iid)
    assert pids and marked_pids(iid)

    c.delete_instances_with_options(m.DeleteInstancesRequest(region_id=REGION, instance_id=[iid], force=True), RT)
    wait_for(lambda: describe(c, instance_ids=json.dumps([iid])).total_count == 0, timeout=10)
    assert not marked_pids(iid)
    assert not [p for p in pids if Path(f"/proc/{p}").exists()]


def test_metadata_service_and_hardening_mode(make_cloud: Any) -> None:
    cloud = make_cloud(services=["ecs"], config={"ecs": {**BOOT, "metadata_http_tokens": "required",
                                                         "sts_ttl_seconds": 900}})
    cloud.ctx.credentials.create_role("R", created_at=time.time() - 600)
    c = client(cloud)
    [iid] = run(c, ram_role_name="R", zone_id="cn-hangzhou-j", user_data=base64.b64encode(b"#!/bin/sh\ntrue\n").decode())
    svc = service_for(cloud.ctx)
    url = wait_for(lambda: svc.metadata.get(iid) and svc.metadata[iid].url, timeout=5)
    assert requests.get(f"{url}/latest/meta-data/instance-id", timeout=5).status_code == 403
    assert requests.put(f"{url}/latest/api/token", timeout=5).status_code == 400
    token = requests.put(f"{url}/latest/api/token", headers={"X-aliyun-ecs-metadata-token-ttl-seconds": "60"},
                         timeout=5).text
    h = {"X-aliyun-ecs-metadata-token": token}
    assert requests.get(f"{url}/latest/meta-data/instance-id", headers=h, timeout=5).text == iid
    assert requests.get(f"{url}/latest/meta-data/zone-id", headers=h, timeout=5).text == "cn-hangzhou-j"
    assert requests.get(f"{url}/latest/meta-data/instance/instance-type", headers=h, timeout=5).text == "ecs.g7.large"
    assert requests.get(f"{url}/latest/user-data", headers=h, timeout=5).text == "#!/bin/sh\ntrue\n"
    doc = requests.get(f"{url}/latest/meta-data/ram/security-credentials/R", headers=h, timeout=5).json()
    assert set(doc) == {"AccessKeyId", "AccessKeySecret", "SecurityToken", "Expiration", "LastUpdated", "Code"}
    cred = cloud.ctx.credentials.lookup(doc["AccessKeyId"], doc["SecurityToken"])
    assert cred.role_name == "R" and 800 < cred.expires_at - time.time() <= 900
    bad = {"X-aliyun-ecs-metadata-token": "nope"}
    assert requests.get(f"{url}/latest/meta-data/instance-id", headers=bad, timeout=5).status_code == 401
    assert requests.get(f"{url}/latest/meta-data/ram/security-credentials/Other", headers=h, timeout=5).status_code == 404


def test_poweroff_stops_and_restart_reboots_without_rerunning_user_data(make_cloud: Any, tmp_path: Path) -> None:
    state = tmp_path / "vm"
    ud = """#!/bin/sh
echo run >> /var/log/user-data-runs
cat > /etc/systemd/system/tick.service <<'EOF'
[Service]
ExecStart=/bin/sh -c 'echo $$ >> /var/log/tick-pids; exec sleep 600'
Restart=on-failure
EOF
systemctl enable --now tick.service
"""
    poweroff_ud = "#!/bin/sh\necho bye\npoweroff\n"
    cloud = make_cloud(state_dir=state, services=["ecs"], config={"ecs": BOOT})
    c = client(cloud)
    [vm] = run(c, user_data=base64.b64encode(ud.encode()).decode())
    [off] = run(c, user_data=base64.b64encode(poweroff_ud.encode()).decode())
    disk = state / "ecs" / "instances" / vm / "root"
    wait_for(lambda: (disk / "var/log/tick-pids").exists(), timeout=10)
    wait_for(lambda: describe(c, instance_ids=json.dumps([off])).instances.instance[0].status == "Stopped", timeout=10)
    assert not marked_pids(off)
    c.delete_instances_with_options(m.DeleteInstancesRequest(region_id=REGION, instance_id=[off]), RT)  # Stopped: no Force

    cloud.stop()  # localcloud going down kills every instance tree …
    assert not marked_pids(vm)
    cloud2 = make_cloud(state_dir=state, services=["ecs"], config={"ecs": BOOT})  # … and coming back reboots them
    c2 = client(cloud2)
    assert describe(c2, instance_ids=json.dumps([vm])).instances.instance[0].status == "Running"
    wait_for(lambda: len((disk / "var/log/tick-pids").read_text().split()) == 2, timeout=10)
    assert (disk / "var/log/user-data-runs").read_text() == "run\n"  # cloud-init ran it once per instance
    assert marked_pids(vm)
    c2.delete_instances_with_options(m.DeleteInstancesRequest(region_id=REGION, instance_id=[vm], force=True), RT)
    wait_for(lambda: describe(c2, instance_ids=json.dumps([vm])).total_count == 0, timeout=10)
    assert not marked_pids(vm)
