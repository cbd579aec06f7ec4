"""Build a real kube-apiserver from the Go module proxy, once, into a cache keyed by version.

No distribution ships kube-apiserver as a package, so we compile `k8s.io/kubernetes/cmd/kube-apiserver`.
The published k8s.io/kubernetes go.mod requires its staging modules (k8s.io/api, apiserver, …) at v0.0.0
and relies on a local `staging/` tree; outside that tree each one must be pinned by `replace` to the
matching v0.X.Y release. We derive that list from the module's own go.mod so it stays exact per version.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

KUBE_VERSION = "v1.34.4"


def cache_root() -> Path:
    return Path(os.environ.get("CSBENCH_CACHE") or Path.home() / ".cache" / "csbench")


def apiserver_path(version: str = KUBE_VERSION) -> Path:
    return cache_root() / "kube" / version / "kube-apiserver"


def staging_replaces(gomod_text: str, version: str) -> list[tuple[str, str]]:
    """(module, staging version) for every k8s.io module the kubernetes go.mod requires at v0.0.0."""
    staging = "v0." + version.lstrip("v").split(".", 1)[1]  # v1.34.4 -> v0.34.4
    mods = re.findall(r"^\s*(k8s\.io/[\w.\-/]+)\s+v0\.0\.0\s*$", gomod_text, flags=re.MULTILINE)
    return [(m, staging) for m in sorted(set(mods))]


def render_gomod(version: str, replaces: list[tuple[str, str]]) -> str:
    lines = [
        "module csbench.local/kube-apiserver-build",
        "",
        "go 1.24.0",
        "",
        f"require k8s.io/kubernetes {version}",
        "",
        "replace (",
        *(f"\t{mod} => {mod} {ver}" for mod, ver in replaces),
        ")",
        "",
    ]
    return "\n".join(lines)


def version_ldflags(version: str) -> str:
    # Without these the server reports v0.0.0-master and kubectl warns about version skew.
    major, minor = version.lstrip("v").split(".")[:2]
    pkg = "k8s.io/component-base/version"
    return " ".join(
        [
            "-s -w",
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}/verflag.programName=kube-apiserver",
        ]
    )


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(
            f"building kube-apiserver: `{' '.join(cmd)}` failed with exit code {proc.returncode}:\n"
            f"{proc.stderr[-4000:]}\nFix the Go toolchain or proxy access (GOPROXY) and run again."
        )
    return proc.stdout


def _usable(binary: Path, version: str) -> bool:
    if not binary.exists():
        return False
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and out.stdout.split()[-1:] == [version]


def ensure_apiserver(version: str = KUBE_VERSION, say: Callable[[str], None] | None = None) -> Path:
    """Path to a working kube-apiserver binary, building it first if the cache lacks one."""
    say = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
    binary = apiserver_path(version)
    if _usable(binary, version):
        return binary
    binary.parent.mkdir(parents=True, exist_ok=True)
    # One builder at a time (parallel test sessions, `make demo` beside `make test`).
    with open(binary.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _usable(binary, version):
            return binary
        go = shutil.which("go")
        if go is None:
            raise RuntimeError("building kube-apiserver needs the Go toolchain: install Go ≥1.24 and run again.")
        _build(go, version, binary, say)
    return binary


def _build(go: str, version: str, binary: Path, say: Callable[[str], None]) -> None:
    src = binary.parent / "src"
    src.mkdir(exist_ok=True)
    env = dict(os.environ, GOFLAGS="-mod=mod", CGO_ENABLED="0")
    say(f"kube-apiserver {version}: not cached; building it once into {binary.parent} "
        "(downloads ~500 MB of Go modules; 5-15 min on 2 cores)")
    started = time.monotonic()
    info = json.loads(_run([go, "mod", "download", "-json", f"k8s.io/kubernetes@{version}"], src, env))
    replaces = staging_replaces(Path(info["GoMod"]).read_text(), version)
    (src / "go.mod").write_text(render_gomod(version, replaces))
    say(f"kube-apiserver {version}: resolving {len(replaces)} staging modules ...")
    _run([go, "get", f"k8s.io/kubernetes/cmd/kube-apiserver@{version}"], src, env)

    done = threading.Event()

    def heartbeat() -> None:
        while not done.wait(30):
            say(f"kube-apiserver {version}: still compiling ({time.monotonic() - started:.0f}s) ...")

    threading.Thread(target=heartbeat, daemon=True).start()
    tmp = binary.with_suffix(".tmp")
    try:
        say(f"kube-apiserver {version}: compiling ...")
        _run([go, "build", "-trimpath", "-ldflags", version_ldflags(version), "-o", str(tmp),
              "k8s.io/kubernetes/cmd/kube-apiserver"], src, env)
    finally:
        done.set()
    tmp.replace(binary)
    say(f"kube-apiserver {version}: built in {time.monotonic() - started:.0f}s -> {binary}")


if __name__ == "__main__":
    print(ensure_apiserver())
