"""`csbench localcloud up` and `csbench localcloud kube up|env|down` as a person runs them."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import oss2
import pytest

CSBENCH = str(Path(sys.executable).parent / "csbench")


def _start_localcloud(state: Path) -> tuple[subprocess.Popen[str], dict[str, str]]:
    proc = subprocess.Popen([CSBENCH, "localcloud", "up", "--state-dir", str(state), "--services", "oss"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip())
        if line.startswith("Ctrl-C"):
            break
    text = "\n".join(lines)
    found = dict(re.findall(r"^\s+(oss|access key id|access key secret)\s+(\S+)$", text, flags=re.MULTILINE))
    assert set(found) == {"oss", "access key id", "access key secret"}, text
    return proc, found


def _stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGINT)
    return proc.wait(20)


def test_localcloud_up_prints_endpoints_and_keys_and_keeps_state_across_restarts(tmp_path: Path) -> None:
    proc, found = _start_localcloud(tmp_path)
    try:
        auth = oss2.AuthV4(found["access key id"], found["access key secret"])
        oss2.Bucket(auth, found["oss"], "cli-bucket", region="cn-hangzhou").create_bucket()
        oss2.Bucket(auth, found["oss"], "cli-bucket", region="cn-hangzhou").put_object("k", b"kept")
    finally:
        assert _stop(proc) == 0
    proc, again = _start_localcloud(tmp_path)
    try:
        assert again["access key id"] == found["access key id"]  # the account key survives a restart
        auth = oss2.AuthV4(again["access key id"], again["access key secret"])
        assert oss2.Bucket(auth, again["oss"], "cli-bucket", region="cn-hangzhou").get_object("k").read() == b"kept"
    finally:
        assert _stop(proc) == 0


def test_localcloud_up_rejects_an_unknown_service_config(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("s3: {}\n")
    proc = subprocess.run([CSBENCH, "localcloud", "up", "--state-dir", str(tmp_path / "s"), "--config", str(cfg)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "unknown service(s) ['s3']" in proc.stderr


@pytest.mark.kube
def test_kube_up_env_down_leaves_nothing_behind(tmp_path: Path) -> None:
    run_dir = tmp_path / "kube"
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    up = subprocess.run([CSBENCH, "localcloud", "kube", "up", "--dir", str(run_dir)], capture_output=True,
                        text=True, timeout=180, env=env)
    assert up.returncode == 0, up.stderr
    state = json.loads((run_dir / "state.json").read_text())
    try:
        printed = subprocess.run([CSBENCH, "localcloud", "kube", "env", "--dir", str(run_dir)], capture_output=True,
                                 text=True, timeout=30).stdout.strip()
        assert printed == up.stdout.strip() == f"export KUBECONFIG={state['kubeconfig']}"
        ns = subprocess.run(["kubectl", f"--kubeconfig={state['kubeconfig']}", "get", "namespace", "default",
                             "-o", "name"], capture_output=True, text=True, timeout=30)
        assert ns.stdout.strip() == "namespace/default", ns.stderr
    finally:
        down = subprocess.run([CSBENCH, "localcloud", "kube", "down", "--dir", str(run_dir)], capture_output=True,
                              text=True, timeout=60)
    assert down.returncode == 0, down.stderr
    for pid in state["pids"]:  # etcd and kube-apiserver are gone, not orphaned
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    assert not run_dir.exists()
    after = subprocess.run([CSBENCH, "localcloud", "kube", "env", "--dir", str(run_dir)], capture_output=True,
                           text=True, timeout=30)
    assert after.returncode == 1 and "no local control plane is running" in after.stderr
