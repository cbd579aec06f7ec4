"""The ECS stand-in's HTTP layer: what the real `alibabacloud_ecs20140526` SDK talks to, unmodified.

Wire format (ECS API 2014-05-26 through the V3 signer): `POST /`, every parameter in the query string, empty
body, the action in `x-acs-action`, an `ACS3-HMAC-SHA256` Authorization header, optional
`x-acs-security-token` for STS credentials. Responses are JSON; errors use Aliyun's shape and status codes
(see errors.py), never a traceback.

This module only authenticates, dispatches to `api.EcsApi`, and runs the side effects the API asks for
(booting and killing instances, metadata servers). Admin endpoints, unauthenticated, loopback only:

    GET    /-/stats                        {"requests": {action: n}, "errors": {"Action:Code": n}}
    GET    /-/faults                       active fault rules
    POST   /-/faults                       add a rule (or a list of rules); body = config.FaultRule fields
    DELETE /-/faults                       remove all rules
    GET    /-/instances                    every instance, including hidden/releasing ones, with pids
    GET    /-/instances/{id}/console       the console log (text)

From Python: `service_for(ctx)` returns the running `EcsService` (add_fault, console_log, pids, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from aiohttp import web

from csbench.localcloud.cloud import CloudContext
from csbench.localcloud.credentials import CredentialError
from csbench.localcloud.ecs import acs3
from csbench.localcloud.ecs.api import EcsApi, request_id
from csbench.localcloud.ecs.config import EcsConfig, FaultRule, load_config
from csbench.localcloud.ecs.errors import EcsError
from csbench.localcloud.ecs.instances import RUNNING, Instance, InstanceStore
from csbench.localcloud.ecs.metadata import MetadataService
from csbench.localcloud.ecs.sandbox import Sandbox, unshare_available

log = logging.getLogger(__name__)

API_VERSION = "2014-05-26"
TICK_SECONDS = 0.1
_SERVICES: dict[str, EcsService] = {}


def service_for(ctx: CloudContext) -> EcsService:
    """The EcsService of the cloud whose state lives in `ctx.state_dir` (for tests and benches)."""
    return _SERVICES[str(ctx.state_dir)]


class EcsService:
    """Owns the API state plus the running side: ticker, sandboxes, metadata servers."""

    def __init__(self, ctx: CloudContext, config: EcsConfig):
        self.ctx = ctx
        self.config = config
        self.dir = ctx.state_dir / "ecs"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.store = InstanceStore(self.dir / "instances.json")
        self.api = EcsApi(config, self.store, ctx.credentials, ctx.region)
        self.auth_errors: dict[str, int] = {}
        if config.sandbox_isolation == "auto":
            self.isolation = "unshare" if unshare_available() else "none"
        else:
            self.isolation = config.sandbox_isolation
        self.sandboxes: dict[str, Sandbox] = {}
        self.metadata: dict[str, MetadataService] = {}
        self._ticker: asyncio.Task[None] | None = None
        self._side_effects: set[asyncio.Task[None]] = set()
        self._stopped = False

    # -- lifecycle -----------------------------------------------------------------------------------
    async def start(self) -> None:
        # A restart is a reboot for instances that were Running: relaunch without re-running user-data.
        for inst in list(self.store.instances.values()):
            if inst.status == RUNNING and not inst.releasing and self.config.boot:
                self._spawn(self._boot(inst))
        self._ticker = asyncio.create_task(self._tick_forever())

    async def shutdown(self) -> None:
        """Kill every instance's process tree and stop metadata servers; instance records stay on disk."""
        if self._stopped:
            return
        self._stopped = True
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        await asyncio.gather(*(sb.kill() for sb in self.sandboxes.values()), return_exceptions=True)
        await asyncio.gather(*(md.stop() for md in self.metadata.values()), return_exceptions=True)
        for task in list(self._side_effects):
            task.cancel()
        self.sandboxes.clear()
        self.metadata.clear()
        _SERVICES.pop(str(self.ctx.state_dir), None)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._side_effects.add(task)
        task.add_done_callback(self._side_effects.discard)

    async def _tick_forever(self) -> None:
        while True:
            try:
                for event, inst in self.api.tick():
                    if event == "boot" and self.config.boot:
                        self._spawn(self._boot(inst))
                    elif event == "release":
                        self._spawn(self._release(inst))
            except Exception:  # the ticker must survive anything; the next tick retries
                log.exception("ecs ticker failed")
            await asyncio.sleep(TICK_SECONDS)

    # -- side effects --------------------------------------------------------------------------------
    async def _boot(self, inst: Instance) -> None:
        iid = inst.instance_id
        try:
            md = self.metadata.get(iid)
            if md is None:
                md = self.metadata[iid] = MetadataService(lambda: self.store.get(iid), self.ctx.credentials,
                                                          self.config.sts_ttl_seconds, self.config.metadata_http_tokens)
                await md.start()
            first_boot = not inst.user_data_ran
            sb = Sandbox(self.dir / "instances" / iid, iid, self.isolation, self._guest_exited,
                         self.config.kill_grace_seconds)
            sb.dir.mkdir(parents=True, exist_ok=True)
            self.sandboxes[iid] = sb
            await sb.start(inst, md.url, first_boot)
            with self.store.lock:
                inst.user_data_ran = True
                self.store.save()
        except Exception:
            log.exception("instance %s failed to boot", iid)
            self.store.mark_stopping(iid, "BootFailed")

    def _guest_exited(self, instance_id: str, rc: int) -> None:
        log.info("instance %s: guest exited (%s)", instance_id, rc)
        self.store.mark_stopping(instance_id, "PowerOff" if rc == 0 else f"GuestExit({rc})")
        self.sandboxes.pop(instance_id, None)
        md = self.metadata.pop(instance_id, None)
        if md is not None:
            self._spawn(md.stop())

    async def _release(self, inst: Instance) -> None:
        iid = inst.instance_id
        sb = self.sandboxes.pop(iid, None)
        if sb is None:
            # Not booted by us in this process, but a previous run may have left processes behind.
            sb = Sandbox(self.dir / "instances" / iid, iid, self.isolation, lambda *_: None)
        await sb.kill()
        md = self.metadata.pop(iid, None)
        if md is not None:
            await md.stop()
        self.store.remove(iid)
        log.info("instance %s released (%s)", iid, inst.release_reason)

    # -- Python accessors ----------------------------------------------------------------------------
    def add_fault(self, **rule: Any) -> None:
        self.api.faults.add(FaultRule(**rule), time.time())

    def console_log(self, instance_id: str) -> str:
        path = self.dir / "instances" / instance_id / "console.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def pids(self, instance_id: str) -> set[int]:
        sb = self.sandboxes.get(instance_id)
        if sb is not None:
            return sb.pids()
        from csbench.localcloud.ecs.sandbox import marked_pids

        return marked_pids(instance_id)

    def stats(self) -> dict[str, Any]:
        errors = dict(self.api.errors)
        for k, v in self.auth_errors.items():
            errors[k] = errors.get(k, 0) + v
        return {"requests": dict(self.api.requests), "errors": errors}

    # -- the API endpoint ----------------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.Response:
        rid = request_id()
        action = request.headers.get("x-acs-action", "")
        try:
            if not action:
                raise EcsError("MissingParameter", "The x-acs-action header is missing; use the Aliyun SDK "
                                                   "(ACS3-HMAC-SHA256, POST / with x-acs-action).")
            body = await request.read()
            params = acs3.parse_query(request.query_string)
            if body and request.content_type == "application/x-www-form-urlencoded":
                params.update(acs3.parse_query(body.decode()))
            self._authenticate(request, params, body, action)
            version = request.headers.get("x-acs-version", API_VERSION)
            if version != API_VERSION:
                raise EcsError("InvalidVersion", f"Specified version {version!r} is not valid; ECS is {API_VERSION}.")
            result = self.api.call(action, params)
            return web.json_response({"RequestId": rid, **result})
        except EcsError as e:
            headers = {}
            if e.retry_after:
                headers["x-acs-retry-after"] = str(e.retry_after)
            return web.json_response(e.body(rid), status=e.status, headers=headers)
        except Exception:
            log.exception("ecs: %s failed", action)
            return web.json_response(EcsError("InternalError").body(rid), status=500)

    def _authenticate(self, request: web.Request, params: dict[str, str], body: bytes, action: str) -> None:
        try:
            auth = acs3.parse_authorization(request.headers.get("Authorization", ""))
            token = request.headers.get("x-acs-security-token")
            try:
                cred = self.ctx.credentials.lookup(auth.access_key_id, token)
            except CredentialError as e:
                code = "InvalidAccessKeyId.NotFound" if e.code == "InvalidAccessKeyId" else e.code
                raise EcsError(code, e.message) from None
            acs3.verify(cred.access_key_secret, request.method, request.path, params, request.headers, auth, body)
        except EcsError as e:
            key = f"{action or '?'}:{e.code}"
            self.auth_errors[key] = self.auth_errors.get(key, 0) + 1
            raise

    # -- admin endpoints -----------------------------------------------------------------------------
    async def admin_stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats())

    async def admin_faults(self, request: web.Request) -> web.Response:
        now = time.time()
        if request.method == "POST":
            try:
                doc = await request.json()
                rules = [FaultRule.model_validate(r) for r in (doc if isinstance(doc, list) else [doc])]
            except (ValueError, TypeError) as e:
                return web.json_response({"error": f"invalid fault rule: {e}"}, status=400)
            for r in rules:
                self.api.faults.add(r, now)
        elif request.method == "DELETE":
            self.api.faults.clear()
        return web.json_response(self.api.faults.list(now))

    async def admin_instances(self, request: web.Request) -> web.Response:
        with self.store.lock:
            items = [{**asdict(i), "user_data": f"<{len(i.user_data)} base64 chars>",
                      "pids": sorted(self.pids(i.instance_id))} for i in self.store.instances.values()]
        return web.json_response({"isolation": self.isolation, "instances": items})

    async def admin_console(self, request: web.Request) -> web.Response:
        iid = request.match_info["id"]
        path: Path = self.dir / "instances" / iid / "console.log"
        if not path.exists():
            return web.json_response({"error": f"no console log for {iid}"}, status=404)
        return web.Response(text=self.console_log(iid))


def build_app(ctx: CloudContext, config: dict[str, Any]) -> web.Application:
    cfg = load_config(config)
    service = EcsService(ctx, cfg)
    _SERVICES[str(ctx.state_dir)] = service
    # The SDK puts every parameter in the query string, and UserData alone may be 32 KiB before base64:
    # lift aiohttp's 8 KiB request-line limit well above that.
    app = web.Application(client_max_size=1024 * 1024, handler_args={"max_line_size": 256 * 1024, "max_field_size": 64 * 1024})
    app.router.add_get("/-/stats", service.admin_stats)
    app.router.add_route("*", "/-/faults", service.admin_faults)
    app.router.add_get("/-/instances", service.admin_instances)
    app.router.add_get("/-/instances/{id}/console", service.admin_console)
    app.router.add_route("*", "/", service.handle)

    async def on_startup(_: web.Application) -> None:
        await service.start()

    async def on_cleanup(_: web.Application) -> None:
        await service.shutdown()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    ctx.on_shutdown.append(service.shutdown)
    return app


__all__ = ["build_app", "service_for", "EcsService"]
