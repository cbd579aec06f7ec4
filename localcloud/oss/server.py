"""localcloud OSS: an aiohttp server speaking Aliyun OSS's wire protocol to the unmodified oss2 and
alibabacloud-oss-v2 clients.

Request path, in order: parse the raw target (routing.py) -> name the operation -> count it -> apply a
matching fault rule, if any (faults.py) -> verify the signature (auth.py) -> run the operation
(service.py, on top of store.py). Any OssError becomes OSS's XML error; anything unexpected becomes a
500 InternalError in the same shape — never a traceback.

Admin API (bucket names cannot start with '-', so these never collide with OSS paths). Send the account
key's secret as `Authorization: Bearer <ctx.admin.access_key_secret>`; see admin.py for a client.

    GET    /-/faults   list active fault rules          POST /-/faults  add one rule or a list (JSON)
    DELETE /-/faults   remove all rules                 GET  /-/stats   requests per operation
    DELETE /-/stats    reset the counters
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
from typing import Any

from aiohttp import web
from pydantic import TypeAdapter, ValidationError

from csbench.localcloud.cloud import CloudContext
from csbench.localcloud.oss import xmldoc
from csbench.localcloud.oss.auth import authenticate
from csbench.localcloud.oss.errors import OssError
from csbench.localcloud.oss.faults import FaultRule, Faults, OssConfig, Stats
from csbench.localcloud.oss.routing import classify, parse_target
from csbench.localcloud.oss.service import OssService
from csbench.localcloud.oss.store import Store

log = logging.getLogger(__name__)

MAX_BODY = 5 * 1024**3  # OSS's PutObject limit
_RULES = TypeAdapter(list[FaultRule])
REQUEST_ID = web.RequestKey("oss_request_id", str)


class OssServer:
    """Everything one OSS app holds; reachable in-process as `app[OSS_SERVER]`."""

    def __init__(self, ctx: CloudContext, config: OssConfig, store: Store):
        self.ctx = ctx
        self.config = config
        self.store = store
        self.service = OssService(ctx, store)
        self.faults = Faults()
        self.stats = Stats()
        self.closing = asyncio.Event()  # releases stalled requests at shutdown
        for rule in config.faults:
            self.faults.add(rule)

    # -- OSS requests ---------------------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.StreamResponse:
        request_id = request[REQUEST_ID] = secrets.token_hex(12).upper()
        bucket: str | None = None
        try:
            headers: dict[str, str] = {}
            for name, value in request.headers.items():
                lname = name.lower()
                headers[lname] = f"{headers[lname]},{value}" if lname in headers else value
            w = parse_target(request.method, request.raw_path, headers)
            bucket = w.bucket
            try:
                operation = classify(w)
            except OssError:
                self.stats.requests["Invalid"] += 1
                raise
            self.stats.requests[operation] += 1
            rule = self.faults.pick(w.method, operation, w.bucket, w.key)
            if rule is not None:
                self.stats.faulted[operation] += 1
                dropped = await self._apply_fault(rule, request)
                if dropped is not None:
                    return dropped
            cred = authenticate(w, self.ctx.credentials, self.ctx.region, max_skew=self.config.max_clock_skew_seconds)
            return await self.service.dispatch(operation, w, request, cred)
        except OssError as e:
            return self._error(e, request_id, bucket, request.method)
        except web.HTTPRequestEntityTooLarge:
            return self._error(OssError(400, "EntityTooLarge", "Your proposed upload exceeds the maximum allowed object size."), request_id, bucket, request.method)
        except Exception:
            log.exception("localcloud OSS: internal error on %s %s", request.method, request.raw_path)
            return self._error(OssError(500, "InternalError", "We encountered an internal error. Please try again."), request_id, bucket, request.method)

    async def _apply_fault(self, rule: FaultRule, request: web.Request) -> web.StreamResponse | None:
        """Raise the injected error, drop the connection (returns the response to give aiohttp), or stall."""
        if rule.action == "error":
            raise OssError(rule.status, rule.code, rule.message)
        if rule.action == "drop":
            if request.transport is not None:
                request.transport.abort()  # the client sees a reset / "connection aborted"
            return web.Response(status=500)  # never reaches the client
        try:  # stall, then answer normally; shutdown cuts the stall short
            await asyncio.wait_for(self.closing.wait(), timeout=rule.seconds)
        except asyncio.TimeoutError:
            return None
        raise OssError(503, "ServiceUnavailable", "localcloud OSS is shutting down.")

    def _error(self, e: OssError, request_id: str, bucket: str | None, method: str) -> web.Response:
        nodes: list[xmldoc.Node] = [("Code", e.code), ("Message", e.message), ("RequestId", request_id),
                                    ("HostId", self.service.host_id(bucket))]  # fmt: skip
        nodes += [(k, v) for k, v in e.fields.items()]
        nodes += [("EC", e.ec), ("RecommendDoc", f"https://api.aliyun.com/troubleshoot?q={e.ec}")]
        body = xmldoc.render("Error", nodes)
        return web.Response(status=e.status, body=body, content_type="application/xml", headers={"x-oss-ec": e.ec})

    # -- admin API ------------------------------------------------------------------------------------
    def _admin_check(self, request: web.Request) -> None:
        given = request.headers.get("Authorization", "")
        expected = "Bearer " + self.ctx.admin.access_key_secret
        if not hmac.compare_digest(given.encode(), expected.encode()):
            raise web.HTTPForbidden(
                text='{"error": "send Authorization: Bearer <admin access_key_secret>"}', content_type="application/json"
            )

    async def admin_faults(self, request: web.Request) -> web.Response:
        self._admin_check(request)
        if request.method == "GET":
            return web.json_response({"rules": self.faults.describe()})
        if request.method == "DELETE":
            return web.json_response({"removed": self.faults.clear()})
        try:
            doc: Any = await request.json()
            rules = _RULES.validate_python(doc if isinstance(doc, list) else [doc])
        except (ValueError, ValidationError) as e:
            return web.json_response({"error": f"invalid fault rule: {e}"}, status=400)
        return web.json_response({"ids": [self.faults.add(r) for r in rules]})

    async def admin_stats(self, request: web.Request) -> web.Response:
        self._admin_check(request)
        if request.method == "DELETE":
            self.stats.reset()
        return web.json_response(self.stats.snapshot())


OSS_SERVER = web.AppKey("oss_server", OssServer)


async def _common_headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.setdefault("x-oss-request-id", request.get(REQUEST_ID) or secrets.token_hex(12).upper())
    response.headers.setdefault("Server", "AliyunOSS")


def build_app(ctx: CloudContext, config: dict[str, Any]) -> web.Application:
    try:
        cfg = OssConfig.model_validate(config)
    except ValidationError as e:
        raise ValueError(f"invalid localcloud OSS config: {e}") from None
    store = Store(ctx.state_dir / "oss")
    for spec in cfg.bucket_specs():
        if spec.name not in store.buckets:
            store.create_bucket(spec.name, acl=spec.acl)
    server = OssServer(ctx, cfg, store)

    async def _release_stalls(app: web.Application) -> None:
        server.closing.set()

    app = web.Application(client_max_size=MAX_BODY)
    app[OSS_SERVER] = server
    app.on_response_prepare.append(_common_headers)
    app.on_shutdown.append(_release_stalls)
    app.router.add_route("*", "/-/faults", server.admin_faults)
    app.router.add_route("*", "/-/stats", server.admin_stats)
    app.router.add_route("*", "/{tail:.*}", server.handle)
    return app
