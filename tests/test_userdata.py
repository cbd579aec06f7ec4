"""The carrier's user-data (a pure render) and the stdlib boot reporter it embeds."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import oss2
import pytest

from csbench.operator.userdata import (
    MAX_USER_DATA_BYTES,
    DevWheel,
    IndexPackage,
    bootreport_source,
    render_user_data,
)
from csbench.probe import bootreport
from csbench.probe.protocol import Keys

AK, SECRET, TOKEN = "LTAIexampleKeyId0001", "exampleSecretValue0123456789", "CAISexampleStsToken"
BASE: dict[str, Any] = {"bucket": "bench", "region": "cn-hangzhou", "campaign_uid": "c-0a1b",
                        "carrier_id": "car-1"}
WHEEL = DevWheel(url="http://bench.oss-cn-hangzhou-internal.aliyuncs.com/dev/csbench-0.1.0-py3-none-any.whl"
                     "?x-oss-expires=600&x-oss-signature=abc", sha256="a" * 64,
                 filename="csbench-0.1.0-py3-none-any.whl")


def _bash_syntax_ok(script: str) -> None:
    proc = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=10)
    assert proc.returncode == 0, proc.stderr


def test_index_install_script() -> None:
    s = render_user_data(**BASE, package=IndexPackage("0.1.0", "http://10.0.0.5:8080/simple"),
                         settings={"CB_PROBE_POLL_INTERVAL": "2", "CB_PROBE_IDLE_TIMEOUT": "3600"})
    _bash_syntax_ok(s)
    assert s.startswith("#!/bin/bash\n") and "\nset -u\n" in s and "/var/log/csbench-boot.log" in s
    assert '"csbench[probe]==0.1.0"' in s and "--index-url http://10.0.0.5:8080/simple --trusted-host 10.0.0.5" in s
    assert "python3.12 python3.11 python3.10 python3" in s and "dnf install -y python3.11" in s
    assert "apt-get install -y python3 python3-venv" in s and "/opt/csbench/venv" in s
    for line in ["Restart=on-failure", "RestartSec=2", "ExecStart=/opt/csbench/venv/bin/cb-probe --poweroff",
                 'Environment="CB_PROBE_CAMPAIGN_UID=c-0a1b"', 'Environment="CB_PROBE_POLL_INTERVAL=2"',
                 "systemctl daemon-reload && systemctl enable --now cb-probe"]:
        assert line in s, line
    https = render_user_data(**BASE, package=IndexPackage("0.1.0", "https://mirrors.example.com/pypi/simple"))
    assert "--trusted-host" not in https


def test_dev_wheel_script_verifies_sha256_and_takes_localcloud_knobs() -> None:
    s = render_user_data(**BASE, package=WHEEL, python="/usr/local/bin/python3.11", poweroff=False,
                         venv_args=["--system-site-packages"], pip_args=["--no-deps"],
                         extra_site_packages=["/srv/venv/lib/python3.11/site-packages"])
    _bash_syntax_ok(s)
    assert "a" * 64 in s and "sha256 mismatch" in s and "refusing to install" in s
    assert "for c in /usr/local/bin/python3.11 python3.12" in s
    assert "-m venv --system-site-packages /opt/csbench/venv" in s and "--no-deps" in s
    assert "csbench-extra-site.pth" in s and "cb-probe --poweroff" not in s
    with pytest.raises(ValueError, match="sha256"):
        render_user_data(**BASE, package=DevWheel(url="http://x/w.whl", sha256="xyz", filename="w-1-py3-none-any.whl"))
    with pytest.raises(ValueError, match="wheel file name"):
        render_user_data(**BASE, package=DevWheel(url="http://x/w", sha256="a" * 64, filename="w; rm -rf /"))


def test_no_secret_ever_reaches_user_data() -> None:
    s = render_user_data(**BASE, endpoint="http://127.0.0.1:9000", package=WHEEL,
                         settings={k: "1" for k in ["CB_PROBE_POLL_INTERVAL", "CB_PROBE_HEARTBEAT_INTERVAL",
                                                    "CB_PROBE_PROGRESS_INTERVAL", "CB_PROBE_IDLE_TIMEOUT",
                                                    "CB_PROBE_DRAIN_TIMEOUT", "CB_PROBE_STORE_TIMEOUT"]})
    for word in [AK, SECRET, TOKEN, "CB_PROBE_ACCESS_KEY_ID=", "CB_PROBE_ACCESS_KEY_SECRET=", "SECURITY_TOKEN"]:
        assert word not in s
    for bad in ["CB_PROBE_ACCESS_KEY_ID", "CB_PROBE_ACCESS_KEY_SECRET", "CB_PROBE_SECURITY_TOKEN", "CB_PROBE_BUCKET"]:
        with pytest.raises(ValueError, match="cannot go into user-data"):
            render_user_data(**BASE, package=WHEEL, settings={bad: SECRET})
    with pytest.raises(ValueError, match="only letters"):
        render_user_data(**{**BASE, "bucket": "bench$(curl evil)"}, package=WHEEL)


def test_size_is_within_aliyuns_limit() -> None:
    s = render_user_data(**BASE, package=WHEEL, extra_site_packages=["/x" * 200])
    assert len(s.encode()) < MAX_USER_DATA_BYTES // 2  # room to grow
    with pytest.raises(ValueError, match="32768-byte limit"):
        render_user_data(**BASE, package=WHEEL, extra_site_packages=["/x" * 20000])


def test_bootreport_is_embedded_stdlib_only_and_uses_the_protocol_layout() -> None:
    src = bootreport_source()
    assert src in render_user_data(**BASE, package=WHEEL)
    assert src == (Path(bootreport.__file__)).read_text()
    imports = {line.split()[1].split(".")[0] for line in src.splitlines() if line.startswith(("import ", "from "))}
    assert imports <= set(sys.stdlib_module_names), imports - set(sys.stdlib_module_names)
    assert bootreport.boot_log_key("c-0a1b", "car-1") == Keys("c-0a1b").boot_log("car-1")
    assert bootreport.object_url("http://127.0.0.1:9000", "b", "k/x y") == "http://127.0.0.1:9000/b/k/x%20y"
    assert bootreport.object_url("https://oss-cn-hangzhou-internal.aliyuncs.com", "b", "k") == \
        "https://b.oss-cn-hangzhou-internal.aliyuncs.com/k"


def test_bootreport_signature_matches_oss2() -> None:
    # oss2's own V1 signer over the same request must give the same signature.
    auth = oss2.StsAuth(AK, SECRET, TOKEN)
    req = oss2.http.Request("PUT", "http://127.0.0.1/b/k", headers={
        "Date": "Mon, 01 Jan 2024 00:00:00 GMT", "Content-Type": "text/plain", "Content-MD5": "abc=="})
    auth._sign_request(req, "b", "k")
    expected = req.headers["authorization"].split(":", 1)[1]
    got = bootreport.sign_v1(SECRET, "PUT", "abc==", "text/plain", req.headers["date"],  # oss2 re-stamps Date
                             {"x-oss-security-token": TOKEN}, "/b/k")
    assert got == expected


def test_bootreport_uploads_the_log_and_never_fails(make_cloud: Any, tmp_path: Path) -> None:
    cloud = make_cloud(services=["oss"], config={"oss": {"buckets": ["bench"]}})
    admin = cloud.ctx.admin
    env = {"PATH": os.environ["PATH"], "CB_PROBE_BUCKET": "bench", "CB_PROBE_REGION": cloud.ctx.region,
           "CB_PROBE_ENDPOINT": cloud.endpoints["oss"], "CB_PROBE_CAMPAIGN_UID": "c-0a1b",
           "CB_PROBE_CARRIER_ID": "car-1", "CB_PROBE_ACCESS_KEY_ID": admin.access_key_id,
           "CB_PROBE_ACCESS_KEY_SECRET": admin.access_key_secret, "CB_BOOT_LOG": str(tmp_path / "boot.log")}
    script = Path(bootreport.__file__)
    for args in (["user-data-started", "Linux 6.1"], ["python-ready", "/usr/bin/python3.11", "3.11.7"]):
        proc = subprocess.run([sys.executable, "-I", str(script), *args], env=env, capture_output=True, text=True,
                              timeout=30)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    bucket = oss2.Bucket(oss2.Auth(admin.access_key_id, admin.access_key_secret), cloud.endpoints["oss"], "bench")
    body = bucket.get_object(Keys("c-0a1b").boot_log("car-1")).read().decode()
    lines = body.splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == ["user-data-started Linux 6.1",
                                                         "python-ready /usr/bin/python3.11 3.11.7"]
    # No metadata service and no static keys: reported on stderr, exit 0, the local log still grows.
    env2 = {k: v for k, v in env.items() if "ACCESS_KEY" not in k}
    env2["CB_PROBE_METADATA_URL"] = "http://127.0.0.1:9"
    proc = subprocess.run([sys.executable, "-I", str(script), "failed", "oops"], env=env2, capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 0 and "upload of stage 'failed' failed" in proc.stderr
    assert (tmp_path / "boot.log").read_text().splitlines()[-1].endswith("failed oops")
    assert hashlib.sha256(body.encode()).hexdigest()  # the uploaded body is the whole log so far
