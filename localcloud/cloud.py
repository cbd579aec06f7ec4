"""Run every localcloud service on loopback: OSS, ECS (+ per-instance metadata), the AgentRun-like target, mock tools.

Each service is an aiohttp application built by `build_app(ctx, config)` in its own module; this module only
owns ports, the shared context and the lifecycle. Use `LocalCloud` from async code, or `LocalCloudThread`
from synchronous code (tests, benches) where the real clients block.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from csbench.localcloud.credentials import Credential, CredentialStore

# name -> "module:function"; the function is build_app(ctx: CloudContext, config: dict) -> web.Application
SERVICES: dict[str, str] = {
    "oss": "csbench.localcloud.oss.server:build_app",
    "ecs": "csbench.localcloud.ecs.server:build_app",
    "agentrun": "csbench.localcloud.agentrun.server:build_app",
    "mocktool": "csbench.localcloud.agentrun.mocktool:build_app",
}

DEFAULT_REGION = "cn-hangzhou"
HOST = "127.0.0.1"


@dataclass
class CloudContext:
    """What every service shares. `endpoints` is filled once all services are bound (read it at request time)."""

    state_dir: Path
    region: str
    credentials: CredentialStore
    admin: Credential  # the account's long-term key, printed by `csbench localcloud up`
    endpoints: dict[str, str] = field(default_factory=dict)
    # Services register cleanup coroutines here (e.g. ECS killing instance process trees).
    on_shutdown: list[Callable[[], Any]] = field(default_factory=list)


def _load_builder(spec: str) -> Callable[[CloudContext, dict[str, Any]], web.Application]:
    module, func = spec.split(":")
    return getattr(importlib.import_module(module), func)  # type: ignore[no-any-return,unused-ignore]


class LocalCloud:
    """All services in one event loop. State lives under `state_dir`; a restart on the same folder keeps it."""

    def __init__(
        self,
        state_dir: Path,
        *,
        region: str = DEFAULT_REGION,
        services: list[str] | None = None,
        config: dict[str, dict[str, Any]] | None = None,
        ports: dict[str, int] | None = None,
    ):
        state_dir.mkdir(parents=True, exist_ok=True)
        creds = CredentialStore(state_dir / "credentials.json")
        admin_file = state_dir / "admin-key.json"
        if admin_file.exists():
            doc = json.loads(admin_file.read_text())
            admin = creds.lookup(doc["access_key_id"])
        else:
            admin = creds.add_access_key()
            admin_file.write_text(json.dumps({"access_key_id": admin.access_key_id}))
            admin_file.chmod(0o600)
        self.ctx = CloudContext(state_dir=state_dir, region=region, credentials=creds, admin=admin)
        self.services = services if services is not None else list(SERVICES)
        self.config = config or {}
        self.ports = ports or {}
        self._runners: list[web.AppRunner] = []

    async def start(self) -> dict[str, str]:
        try:
            for name in self.services:
                app = _load_builder(SERVICES[name])(self.ctx, self.config.get(name, {}))
                runner = web.AppRunner(app, access_log=None, handle_signals=False)
                await runner.setup()
                site = web.TCPSite(runner, HOST, self.ports.get(name, 0), reuse_address=True)
                await site.start()
                self._runners.append(runner)
                port = runner.addresses[0][1]
                self.ctx.endpoints[name] = f"http://{HOST}:{port}"
        except BaseException:
            await self.stop()
            raise
        (self.ctx.state_dir / "endpoints.json").write_text(json.dumps(self.ctx.endpoints, indent=1))
        return dict(self.ctx.endpoints)

    async def stop(self) -> None:
        for hook in reversed(self.ctx.on_shutdown):
            result = hook()
            if asyncio.iscoroutine(result):
                await result
        self.ctx.on_shutdown.clear()
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()


class LocalCloudThread:
    """A LocalCloud on its own event loop thread, for synchronous callers. Use as a context manager."""

    def __init__(self, state_dir: Path, **kwargs: Any):
        self.cloud = LocalCloud(state_dir, **kwargs)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="localcloud", daemon=True)

    @property
    def ctx(self) -> CloudContext:
        return self.cloud.ctx

    @property
    def endpoints(self) -> dict[str, str]:
        return self.cloud.ctx.endpoints

    def run(self, coro: Any, timeout: float = 30.0) -> Any:
        """Run a coroutine on the cloud's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> LocalCloudThread:
        self._thread.start()
        try:
            self.run(self.cloud.start())
        except BaseException:
            # LocalCloud.start already closed what it opened; end the loop thread too.
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()
            raise
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        try:
            self.run(self.cloud.stop(), timeout=60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()

    def __enter__(self) -> LocalCloudThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
