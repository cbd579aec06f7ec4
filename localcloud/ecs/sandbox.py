"""Boot an instance on the host: its user-data runs as a local process tree in a private mount namespace.

Layout under `<state_dir>/ecs/instances/<instance-id>/`:

    root/            the instance's disk: root/etc/systemd/system, root/opt, root/var/log, root/var/lib/cloud,
                     root/root (HOME), root/home, root/run, root/tmp — bind-mounted over the real absolute
                     paths inside the namespace, so a cloud-init script writes /opt/x without touching the host
    root/run/csbench/bin/   PATH shims: systemctl, poweroff/shutdown/halt, dnf/yum/apt-get/apt (log + succeed)
    console.log      the console: init's, user-data's and services' stdout+stderr
    guest.json       the init's configuration (see guest.py)

Isolation: `unshare --mount --propagation private` (needs root / CAP_SYS_ADMIN). The host Python running
localcloud (and csbench's source) is bound back read-only if it lives under a guest path (e.g. ~/.pyenv under
/root). Without unshare, isolation "none" runs the same init without mounts: HOME and the unit directory move
into root/, but absolute paths in the script hit the host.

Killing: init runs in its own session (process group = its pid) and is a child subreaper, so every
descendant stays in its tree; `kill()` signals the group, the descendants found by walking /proc parent links,
and any process whose environment carries this instance's CSBENCH_INSTANCE_ID; then checks none survived.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from csbench.localcloud.ecs.instances import Instance

log = logging.getLogger(__name__)

GUEST_PATHS = ["/etc/systemd/system", "/opt", "/var/log", "/var/lib/cloud", "/root", "/home", "/run", "/tmp"]
PACKAGE_MANAGERS = ["dnf", "yum", "apt-get", "apt"]
GUEST_PATH_ENV = "/run/csbench/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def unshare_available() -> bool:
    return shutil.which("unshare") is not None and os.geteuid() == 0


def host_paths_to_keep() -> list[str]:
    """Host directories the guest still needs that a bind mount would hide: the Python interpreter and
    environment running localcloud (e.g. /root/.pyenv, a venv under /opt) and csbench's own source."""
    import csbench
    import csbench.localcloud

    candidates = {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix),
                  os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))),
                  os.path.dirname(os.path.realpath(csbench.__file__)),
                  os.path.dirname(os.path.realpath(csbench.localcloud.__file__))}
    under = [c for c in candidates if any(c == p or c.startswith(p + "/") for p in GUEST_PATHS)]
    # Keep only outermost paths; a nested one is already covered.
    return sorted(c for c in under if not any(o != c and c.startswith(o + "/") for o in under))


def _descendants(root_pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, stack = set(), [root_pid]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in out:
                out.add(child)
                stack.append(child)
    return out


def marked_pids(instance_id: str) -> set[int]:
    """Processes whose environment says they belong to `instance_id` (catches setsid'd escapees)."""
    marker = f"CSBENCH_INSTANCE_ID={instance_id}".encode()
    me = os.getpid()
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    found.add(int(entry))
        except OSError:
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Sandbox:
    """One booted instance: its init process, console log and metadata URL."""

    def __init__(self, instance_dir: Path, instance_id: str, isolation: str,
                 on_exit: Callable[[str, int], None], kill_grace: float = 2.0):
        self.dir = instance_dir
        self.root = instance_dir / "root"
        self.console = instance_dir / "console.log"
        self.instance_id = instance_id
        self.isolation = isolation
        self.on_exit = on_exit
        self.kill_grace = kill_grace
        self.proc: asyncio.subprocess.Process | None = None
        self._watch: asyncio.Task[None] | None = None
        self._killing = False

    # -- preparing the disk ----------------------------------------------------------------------------
    def _guest_path(self, path: str) -> str:
        """Where `path` (absolute, inside the guest) is reachable from inside the guest."""
        return path if self.isolation == "unshare" else str(self.root) + path

    def prepare(self, inst: Instance, first_boot: bool) -> None:
        for p in GUEST_PATHS:
            (self.root / p.lstrip("/")).mkdir(parents=True, exist_ok=True)
        bindir = self.root / "run/csbench/bin"
        bindir.mkdir(parents=True, exist_ok=True)
        guest = f"{sys.executable} -m csbench.localcloud.ecs.guest"
        shims = {"systemctl": f'exec {guest} systemctl "$@"'}
        for name in ("poweroff", "shutdown", "halt"):
            shims[name] = f"exec {guest} poweroff"
        pkg_log = self._guest_path("/var/log/csbench-packages.log")
        for name in PACKAGE_MANAGERS:
            # The host's Python and tools stand in for whatever the script installs.
            shims[name] = (f'echo "[csbench shim] {name} $*: skipped (host packages are used)" >&2\n'
                           f'echo "$(date -u +%FT%TZ) {name} $*" >> {pkg_log}\nexit 0')
        for name, body in shims.items():
            f = bindir / name
            f.write_text(f"#!/bin/sh\n{body}\n")
            f.chmod(0o755)
        if first_boot:
            import base64

            ud = self.root / "var/lib/cloud/instance/user-data.txt"
            ud.parent.mkdir(parents=True, exist_ok=True)
            ud.write_bytes(base64.b64decode(inst.user_data or ""))

    def _guest_config(self, inst: Instance, metadata_url: str, first_boot: bool) -> dict[str, object]:
        env = {
            "PATH": GUEST_PATH_ENV if self.isolation == "unshare"
            else f"{self.root}/run/csbench/bin:{GUEST_PATH_ENV.split(':', 1)[1]}",
            "HOME": self._guest_path("/root"),
            "LANG": "C.UTF-8",
            "CSBENCH_METADATA_URL": metadata_url,
            "CSBENCH_INSTANCE_ID": inst.instance_id,
            "CSBENCH_GUEST_SOCKET": f"@csbench-guest-{inst.instance_id}-{os.getpid()}-{time.monotonic_ns()}",
            "CSBENCH_SANDBOX_ROOT": "/" if self.isolation == "unshare" else str(self.root),
        }
        return {
            "isolation": self.isolation,
            "mounts": [[str(self.root) + p, p] for p in GUEST_PATHS] if self.isolation == "unshare" else [],
            "keep": host_paths_to_keep() if self.isolation == "unshare" else [],
            "env": env,
            "socket": env["CSBENCH_GUEST_SOCKET"],
            "unit_dir": self._guest_path("/etc/systemd/system"),
            "run_user_data": first_boot,
            "user_data_path": self._guest_path("/var/lib/cloud/instance/user-data.txt"),
            "boot_finished_path": self._guest_path("/var/lib/cloud/instance/boot-finished"),
            "enabled_path": self._guest_path("/var/lib/cloud/csbench-enabled-units.json"),
        }

    # -- running ---------------------------------------------------------------------------------------
    async def start(self, inst: Instance, metadata_url: str, first_boot: bool) -> None:
        self.kill_strays()  # a previous localcloud process may have died without cleaning up
        self.prepare(inst, first_boot)
        cfg_path = self.dir / "guest.json"
        cfg_path.write_text(json.dumps(self._guest_config(inst, metadata_url, first_boot), indent=1))
        argv = [sys.executable, "-m", "csbench.localcloud.ecs.guest", "init", str(cfg_path)]
        if self.isolation == "unshare":
            argv = ["unshare", "--mount", "--propagation", "private", "--", *argv]
        # The host's environment is not the guest's: pass only what a fresh VM would have (plus how to import
        # csbench itself), and the marker every process inherits.
        env = {"PATH": os.environ.get("PATH", GUEST_PATH_ENV), "LANG": "C.UTF-8",
               "CSBENCH_INSTANCE_ID": inst.instance_id, "PYTHONUNBUFFERED": "1"}
        if os.environ.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        with open(self.console, "ab") as console:
            console.write(f"--- boot {inst.boot_count} ({'first boot' if first_boot else 'reboot'}) "
                          f"at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} ---\n".encode())
            console.flush()
            self.proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=console, stderr=asyncio.subprocess.STDOUT,
                env=env, cwd=str(self.dir), start_new_session=True)
        self._killing = False
        self._watch = asyncio.create_task(self._wait())

    async def _wait(self) -> None:
        assert self.proc is not None
        rc = await self.proc.wait()
        if not self._killing:
            # The guest powered itself off (or init died): reap whatever it left and tell the API.
            self.kill_strays()
            self.on_exit(self.instance_id, rc)

    def pids(self) -> set[int]:
        found = marked_pids(self.instance_id)
        if self.proc is not None and self.proc.returncode is None:
            found |= {self.proc.pid} | _descendants(self.proc.pid)
        return {p for p in found if _alive(p)}

    def kill_strays(self) -> None:
        for pid in marked_pids(self.instance_id):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    async def kill(self) -> None:
        """Stop the whole tree: SIGTERM (init stops services gracefully), then SIGKILL after the grace period."""
        self._killing = True
        pids = self.pids()
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGTERM)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.kill_grace
        while time.monotonic() < deadline and self.pids():
            await asyncio.sleep(0.05)
        for _ in range(20):
            left = self.pids()
            if not left:
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(0.05)
        if self.proc is not None:
            with contextlib.suppress(asyncio.TimeoutError, ProcessLookupError):
                await asyncio.wait_for(self.proc.wait(), 5)
        if self._watch is not None:
            self._watch.cancel()
        left = self.pids()
        if left:
            log.error("instance %s: processes %s survived SIGKILL", self.instance_id, sorted(left))
