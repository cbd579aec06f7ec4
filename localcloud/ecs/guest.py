"""What runs *inside* a localcloud instance: a tiny init, the systemctl/poweroff shims, and service supervision.

`python -m csbench.localcloud.ecs.guest init CONFIG.json` is the instance's "PID 1". The host starts it under
`unshare --mount --propagation private`, so the bind mounts it makes (the instance's own /etc/systemd/system,
/opt, /var/log, /var/lib/cloud, /root, /home, /run, /tmp) are invisible to the host. It then

* first boot: runs the user-data script once (as cloud-init would), output to the console log;
* reboot (localcloud restarted): skips user-data and starts the units that were enabled;
* serves the shims over an abstract unix socket (`CSBENCH_GUEST_SOCKET`): `systemctl daemon-reload |
  enable [--now] | disable [--now] | start | stop | restart | status | is-active | is-enabled`, and
  `poweroff` (also `shutdown`, `halt`, `systemctl poweroff`), after which init stops everything and exits 0 —
  the host sees the exit and moves the instance to Stopping → Stopped;
* supervises services parsed from `/etc/systemd/system/<name>.service` (ExecStart, Environment,
  EnvironmentFile, WorkingDirectory, Restart=no|on-failure|always, RestartSec), each in its own process group.

Shims are one-line shell scripts calling `python -m csbench.localcloud.ecs.guest systemctl ARGS...`.
Everything this module needs is imported at the top: after the mounts, /tmp-based paths may be gone.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import shlex
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MS_BIND = 4096
MS_REC = 16384
ENABLED_STATE = "/var/lib/csbench-guest/enabled.json"


def log(msg: str) -> None:
    print(f"[csbench-init] {time.strftime('%H:%M:%S')} {msg}", flush=True)


# -- unit files -------------------------------------------------------------------------------------

@dataclass
class Unit:
    name: str
    exec_start: list[str]
    env: dict[str, str] = field(default_factory=dict)
    working_directory: str | None = None
    restart: str = "no"
    restart_sec: float = 0.1


def _seconds(value: str) -> float:
    v = value.strip().lower()
    for suffix, mult in (("ms", 0.001), ("min", 60.0), ("s", 1.0), ("m", 60.0)):
        if v.endswith(suffix):
            return float(v[: -len(suffix)]) * mult
    return float(v)


def parse_env_file(path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key.strip().removeprefix("export ").strip()] = value
    return out


def parse_unit(name: str, text: str) -> Unit:
    """Parse the [Service] section of a unit file (the subset a cloud-init script realistically writes)."""
    section = ""
    unit = Unit(name=name, exec_start=[])
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        if section != "Service" or "=" not in line:
            continue
        key, _, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if key == "ExecStart" and value and not unit.exec_start:
            unit.exec_start = shlex.split(value.lstrip("-@+!:"))
        elif key == "Environment":
            for pair in shlex.split(value):
                k, _, v = pair.partition("=")
                unit.env[k] = v
        elif key == "EnvironmentFile":
            optional = value.startswith("-")
            path = value.lstrip("-")
            try:
                unit.env.update(parse_env_file(path))
            except OSError:
                if not optional:
                    raise
        elif key == "WorkingDirectory":
            unit.working_directory = value.lstrip("-")
        elif key == "Restart":
            unit.restart = value
        elif key == "RestartSec":
            unit.restart_sec = _seconds(value)
    if not unit.exec_start:
        raise ValueError(f"{name}: no ExecStart= in [Service]")
    return unit


# -- the init ---------------------------------------------------------------------------------------

@dataclass
class Service:
    unit: Unit
    proc: asyncio.subprocess.Process | None = None
    wanted: bool = False  # started and not stopped by request
    state: str = "inactive"  # inactive | active | failed
    starts: list[float] = field(default_factory=list)
    task: asyncio.Task[None] | None = None


class Init:
    def __init__(self, cfg: dict[str, Any]):
        self.cfg = cfg
        self.unit_dir = Path(cfg["unit_dir"])
        self.env = dict(cfg["env"])
        self.services: dict[str, Service] = {}
        self.enabled: set[str] = set()
        self.done = asyncio.Event()
        self.user_data_proc: asyncio.subprocess.Process | None = None

    # -- lifecycle --
    async def main(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.done.set)
        # Abstract socket ("@name" → "\0name"): it lives in the network namespace, not the filesystem, so the
        # bind mounts cannot hide it and nothing is left behind on disk.
        server = await asyncio.start_unix_server(self._client, path="\0" + self.cfg["socket"].lstrip("@"))
        self._load_enabled()
        if self.cfg["run_user_data"]:
            asyncio.create_task(self._run_user_data())
        else:
            log(f"reboot: starting enabled units {sorted(self.enabled)}")
            for name in sorted(self.enabled):
                await self.start(name)
        await self.done.wait()
        server.close()
        await self.shutdown()
        return 0

    async def _run_user_data(self) -> None:
        script = Path(self.cfg["user_data_path"])
        if not script.exists() or script.stat().st_size == 0:
            log("no user-data")
            return
        script.chmod(0o700)
        argv = [str(script)] if script.read_bytes().startswith(b"#!") else ["/bin/sh", str(script)]
        log(f"running user-data ({script.stat().st_size} bytes)")
        self.user_data_proc = await asyncio.create_subprocess_exec(*argv, env=self.env, cwd=self.env.get("HOME", "/"))
        rc = await self.user_data_proc.wait()
        log(f"user-data finished with exit code {rc}")
        Path(self.cfg["boot_finished_path"]).write_text(f"{time.time()} rc={rc}\n")

    async def shutdown(self) -> None:
        log("stopping all services")
        await asyncio.gather(*(self.stop(n) for n in list(self.services)))
        if self.user_data_proc is not None and self.user_data_proc.returncode is None:
            self.user_data_proc.kill()

    # -- enabled units persist across reboots (the instance's /var/lib survives) --
    def _load_enabled(self) -> None:
        try:
            self.enabled = set(json.loads(Path(self.cfg["enabled_path"]).read_text()))
        except (OSError, ValueError):
            self.enabled = set()

    def _save_enabled(self) -> None:
        p = Path(self.cfg["enabled_path"])
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(sorted(self.enabled)))

    # -- services --
    def _unit(self, name: str) -> Unit:
        return parse_unit(name, (self.unit_dir / name).read_text())

    async def start(self, name: str) -> str:
        svc = self.services.get(name)
        if svc is not None and svc.state == "active":
            return ""
        unit = self._unit(name)  # re-read on start, as systemd does after daemon-reload
        svc = self.services[name] = Service(unit=unit, wanted=True)
        svc.task = asyncio.create_task(self._supervise(svc))
        return ""

    async def _supervise(self, svc: Service) -> None:
        u = svc.unit
        while svc.wanted:
            now = time.monotonic()
            svc.starts = [t for t in svc.starts if now - t < 10] + [now]
            if len(svc.starts) > 5:  # systemd's default StartLimitBurst=5 per 10 s
                log(f"{u.name}: start request repeated too quickly, refusing to start")
                svc.state = "failed"
                return
            env = {**self.env, **u.env}
            try:
                svc.proc = await asyncio.create_subprocess_exec(
                    *u.exec_start, env=env, cwd=u.working_directory or "/", start_new_session=True)
            except OSError as e:
                log(f"{u.name}: failed to execute {u.exec_start[0]}: {e}")
                svc.state = "failed"
                rc = 203
            else:
                svc.state = "active"
                log(f"{u.name}: started pid {svc.proc.pid}")
                rc = await svc.proc.wait()
                log(f"{u.name}: exited with code {rc}")
                svc.state = "inactive" if rc == 0 else "failed"
            if not svc.wanted:
                break
            if u.restart == "always" or (u.restart in ("on-failure", "on-abnormal") and rc != 0):
                await asyncio.sleep(u.restart_sec)
                continue
            svc.wanted = False

    async def stop(self, name: str) -> None:
        svc = self.services.get(name)
        if svc is None:
            return
        svc.wanted = False
        if svc.proc is not None and svc.proc.returncode is None:
            try:
                os.killpg(svc.proc.pid, signal.SIGTERM)
                await asyncio.wait_for(svc.proc.wait(), 3)
            except (ProcessLookupError, PermissionError):
                pass
            except asyncio.TimeoutError:
                os.killpg(svc.proc.pid, signal.SIGKILL)
                await svc.proc.wait()
        if svc.task is not None:
            svc.task.cancel()
        svc.state = "inactive"

    # -- the shim protocol: one JSON line in ({"argv": [...]}), one JSON line out ({"rc": N, "out": "..."}) --
    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            argv = json.loads(await reader.readline())["argv"]
            rc, out = await self.command(argv)
        except Exception as e:  # a bad unit file must not kill init; report like systemctl does
            rc, out = 1, f"Failed: {e}\n"
        writer.write(json.dumps({"rc": rc, "out": out}).encode() + b"\n")
        await writer.drain()
        writer.close()

    async def command(self, argv: list[str]) -> tuple[int, str]:
        if argv and argv[0] in ("poweroff", "shutdown", "halt"):
            log(f"{argv[0]} requested")
            asyncio.get_running_loop().call_later(0.05, self.done.set)
            return 0, ""
        args = [a for a in argv[1:] if not a.startswith("-")]
        flags = {a for a in argv[1:] if a.startswith("-")}
        if not args:
            return 1, "systemctl: too few arguments\n"
        verb, names = args[0], [n if "." in n else n + ".service" for n in args[1:]]
        log(f"systemctl {' '.join(argv[1:])}")
        if verb == "daemon-reload":
            return 0, ""
        if verb == "poweroff":
            return await self.command(["poweroff"])
        missing = [n for n in names if verb in ("enable", "start", "restart") and not (self.unit_dir / n).exists()]
        if missing:
            return (1 if verb == "enable" else 5), f"Failed to {verb} unit: Unit {missing[0]} not found.\n"
        if verb in ("enable", "disable"):
            for n in names:
                (self.enabled.add if verb == "enable" else self.enabled.discard)(n)
            self._save_enabled()
            if "--now" in flags:
                for n in names:
                    await (self.start(n) if verb == "enable" else self.stop(n))
            return 0, ""
        if verb == "start":
            for n in names:
                await self.start(n)
            return 0, ""
        if verb == "stop":
            for n in names:
                await self.stop(n)
            return 0, ""
        if verb == "restart":
            for n in names:
                await self.stop(n)
                await self.start(n)
            return 0, ""
        if verb in ("is-active", "status"):
            states = [self.services[n].state if n in self.services else "inactive" for n in names]
            if verb == "is-active":
                return (0 if all(s == "active" for s in states) else 3), "".join(s + "\n" for s in states)
            out = ""
            for n, s in zip(names, states, strict=True):
                svc = self.services.get(n)
                pid = svc.proc.pid if svc and svc.proc and s == "active" else None
                out += f"● {n}\n   Active: {s}{' (running)' if s == 'active' else ''}\n"
                out += f" Main PID: {pid}\n" if pid else ""
            return (0 if all(s == "active" for s in states) else 3), out
        if verb == "is-enabled":
            states = ["enabled" if n in self.enabled else "disabled" for n in names]
            return (0 if all(s == "enabled" for s in states) else 1), "".join(s + "\n" for s in states)
        return 1, f"systemctl (csbench shim): unsupported command {verb!r}\n"


def _set_subreaper() -> None:
    # Orphans (double-forked daemons) re-parent to init instead of the host's PID 1, so the host can find
    # and kill the whole tree by walking parent links from init.
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


MS_REMOUNT = 32
MS_RDONLY = 1


def _bind_mounts(mounts: list[list[str]], keep: list[str]) -> None:
    """Bind each instance directory over its absolute path, then bind the host paths in `keep` (the Python
    running csbench, e.g. ~/.pyenv under /root) back on top, read-only, so the shims and the host interpreter
    keep working. Sources are opened first and mounted through /proc/self/fd, so mounting over /tmp cannot
    hide a source that lives under /tmp."""
    libc = ctypes.CDLL(None, use_errno=True)

    def bind(fd: int, dst: str, flags: int = 0) -> None:
        src = f"/proc/self/fd/{fd}".encode()
        if libc.mount(src, dst.encode(), None, MS_BIND | MS_REC, None) != 0 or (
                flags and libc.mount(None, dst.encode(), None, MS_BIND | MS_REMOUNT | flags, None) != 0):
            err = ctypes.get_errno()
            raise OSError(err, f"bind mount over {dst} failed: {os.strerror(err)}")

    fds = []
    for src, dst in mounts:
        os.makedirs(src, exist_ok=True)
        os.makedirs(dst, exist_ok=True)  # e.g. /var/lib/cloud may not exist on the host: an empty mount point
        fds.append((os.open(src, os.O_RDONLY | os.O_DIRECTORY), dst))
    kept = [(os.open(k, os.O_RDONLY | os.O_DIRECTORY), k) for k in keep if os.path.isdir(k)]
    for fd, dst in fds:
        bind(fd, dst)
        os.close(fd)
    for fd, dst in kept:
        os.makedirs(dst, exist_ok=True)  # an empty mount point on the instance's disk
        bind(fd, dst, MS_RDONLY)
        os.close(fd)


def init_main(config_path: str) -> int:
    cfg = json.loads(Path(config_path).read_text())
    if cfg.get("mounts"):
        _bind_mounts(cfg["mounts"], cfg.get("keep", []))
    _set_subreaper()
    os.chdir(cfg["env"].get("HOME", "/"))
    log(f"instance {cfg['env'].get('CSBENCH_INSTANCE_ID')} booting (isolation={cfg['isolation']})")
    return asyncio.run(Init(cfg).main())


def shim_main(argv: list[str]) -> int:
    """The client side of a shim (`systemctl ...`, `poweroff`)."""
    name = os.environ.get("CSBENCH_GUEST_SOCKET")
    if not name:
        print(f"{argv[0]}: not inside a csbench instance (CSBENCH_GUEST_SOCKET unset)", file=sys.stderr)
        return 1
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect("\0" + name.lstrip("@"))
        s.sendall(json.dumps({"argv": argv}).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    reply = json.loads(data or b'{"rc": 0, "out": ""}')
    sys.stdout.write(reply["out"])
    return int(reply["rc"])


def main() -> int:
    if len(sys.argv) >= 3 and sys.argv[1] == "init":
        return init_main(sys.argv[2])
    if len(sys.argv) >= 2 and sys.argv[1] in ("systemctl", "poweroff", "shutdown", "halt"):
        return shim_main(sys.argv[1:])
    print("usage: python -m csbench.localcloud.ecs.guest init CONFIG | systemctl ARGS | poweroff", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
