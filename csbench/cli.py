"""`csbench` command line: localcloud stand-ins, the local control plane, the demo."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

from csbench import __version__


def _state_home() -> Path:
    from csbench.localcloud.kube.build import cache_root

    return cache_root()


# -- csbench localcloud up ------------------------------------------------------------------------------
def cmd_localcloud_up(args: argparse.Namespace) -> int:
    import yaml

    from csbench.localcloud.cloud import SERVICES, LocalCloud

    config = yaml.safe_load(Path(args.config).read_text()) if args.config else {}
    if not isinstance(config, dict):
        print(f"csbench: {args.config}: expected a mapping of service name to settings", file=sys.stderr)
        return 2
    unknown = sorted(set(config) - set(SERVICES))
    if unknown:
        print(f"csbench: {args.config}: unknown service(s) {unknown}; known: {sorted(SERVICES)}", file=sys.stderr)
        return 2
    services = args.services.split(",") if args.services else None
    cloud = LocalCloud(Path(args.state_dir), region=args.region, services=services, config=config)

    async def serve() -> None:
        endpoints = await cloud.start()
        admin = cloud.ctx.admin
        print(f"localcloud is up (state in {args.state_dir}, region {args.region})")
        for name, url in endpoints.items():
            print(f"  {name:9s} {url}")
        print(f"  access key id     {admin.access_key_id}")
        print(f"  access key secret {admin.access_key_secret}")
        print("Ctrl-C stops it; state is kept for the next start.", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await cloud.stop()

    asyncio.run(serve())
    return 0


# -- csbench localcloud kube up|down|env -----------------------------------------------------------------
def _kube_run_dir(args: argparse.Namespace) -> Path:
    return Path(args.dir) if args.dir else _state_home() / "run" / "kube"


def cmd_kube_up(args: argparse.Namespace) -> int:
    from csbench.localcloud.kube.controlplane import ControlPlane, pid_alive

    run_dir = _kube_run_dir(args)
    state = run_dir / "state.json"
    if state.exists():
        doc = json.loads(state.read_text())
        if all(pid_alive(p) for p in doc["pids"]):
            print(f"already running; export KUBECONFIG={doc['kubeconfig']}")
            return 0
        _kube_kill(doc)
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    plane = ControlPlane(run_dir)
    started = time.monotonic()
    endpoints = plane.start()
    doc = {"pids": [p.pid for p in plane.procs], "kubeconfig": str(endpoints.kubeconfig), "server": endpoints.server}
    state.write_text(json.dumps(doc))
    print(f"control plane ready in {time.monotonic() - started:.1f}s at {endpoints.server}", file=sys.stderr)
    if args.foreground:
        print(f"export KUBECONFIG={endpoints.kubeconfig}", flush=True)
        try:
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
        finally:
            plane.stop()
            state.unlink(missing_ok=True)
        return 0
    print(f"export KUBECONFIG={endpoints.kubeconfig}")
    return 0


def _kube_kill(doc: dict[str, object]) -> None:
    from csbench.localcloud.kube.controlplane import pid_alive

    pids = [int(p) for p in doc.get("pids", [])]  # type: ignore[attr-defined]
    for pid in reversed(pids):  # apiserver first, then etcd
        if pid_alive(pid):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 15
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def cmd_kube_down(args: argparse.Namespace) -> int:
    import shutil

    run_dir = _kube_run_dir(args)
    state = run_dir / "state.json"
    if not state.exists():
        print("no local control plane is running", file=sys.stderr)
        return 0
    _kube_kill(json.loads(state.read_text()))
    shutil.rmtree(run_dir, ignore_errors=True)
    print("control plane stopped", file=sys.stderr)
    return 0


def cmd_kube_env(args: argparse.Namespace) -> int:
    state = _kube_run_dir(args) / "state.json"
    if not state.exists():
        print("no local control plane is running: `csbench localcloud kube up` first", file=sys.stderr)
        return 1
    print(f"export KUBECONFIG={json.loads(state.read_text())['kubeconfig']}")
    return 0


def cmd_kube_build(args: argparse.Namespace) -> int:
    from csbench.localcloud.kube.build import ensure_apiserver

    print(ensure_apiserver())
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from csbench.demo import run_demo

    return run_demo()


# -- parser ---------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="csbench", description=__doc__)
    parser.add_argument("--version", action="version", version=f"csbench {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    lc = sub.add_parser("localcloud", help="local stand-ins for Aliyun and Kubernetes").add_subparsers(
        dest="what", required=True)
    up = lc.add_parser("up", help="serve OSS, ECS (+metadata), the AgentRun-like target and mock tools")
    up.add_argument("--state-dir", default=str(_state_home() / "localcloud"))
    up.add_argument("--region", default="cn-hangzhou")
    up.add_argument("--services", help="comma-separated subset, e.g. oss,ecs")
    up.add_argument("--config", help="YAML: service name -> settings")
    up.set_defaults(func=cmd_localcloud_up)

    kube = lc.add_parser("kube", help="a local etcd + kube-apiserver").add_subparsers(dest="action", required=True)
    for name, func, help_ in (("up", cmd_kube_up, "start (building kube-apiserver on first use)"),
                              ("down", cmd_kube_down, "stop and remove its data"),
                              ("env", cmd_kube_env, "print the KUBECONFIG export"),
                              ("build", cmd_kube_build, "only build/cache kube-apiserver")):
        p = kube.add_parser(name, help=help_)
        p.add_argument("--dir", help="run directory (default ~/.cache/csbench/run/kube)")
        if name == "up":
            p.add_argument("--foreground", action="store_true", help="stay attached; Ctrl-C stops it")
        p.set_defaults(func=func)

    demo = sub.add_parser("demo", help="run the end-to-end demo on the embedded default")
    demo.set_defaults(func=cmd_demo)

    from csbench.carrier_cli import add_carrier_parser

    add_carrier_parser(sub)
    from csbench.report_cli import add_report_parser

    add_report_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
