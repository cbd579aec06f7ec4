"""Per-instance metadata service (Aliyun's 100.100.100.200, here on 127.0.0.1:<port>).

One small aiohttp server per booted instance, so "who is asking" is simply "which port" — no source-IP
tricks. Paths follow Aliyun's layout (`/latest/meta-data/...`, `/latest/user-data`), including the RAM role
credentials at `/latest/meta-data/ram/security-credentials/<role>`, minted by the shared CredentialStore so
OSS accepts them. Security-hardening mode (IMDSv2-like): `PUT /latest/api/token` with
`X-aliyun-ecs-metadata-token-ttl-seconds: 1..21600` returns a token that GETs pass in
`X-aliyun-ecs-metadata-token`. With `metadata_http_tokens="required"` a GET without a token gets 403, and a
wrong or expired token gets 401 in either mode.
"""

from __future__ import annotations

import base64
import secrets
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from csbench.localcloud.credentials import Credential, CredentialError, CredentialStore
from csbench.localcloud.ecs.instances import Instance, iso_second

TOKEN_TTL_HEADER = "X-aliyun-ecs-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aliyun-ecs-metadata-token"
MAX_TOKEN_TTL = 21600


class MetadataService:
    def __init__(self, get_instance: Callable[[], Instance | None], credentials: CredentialStore,
                 sts_ttl_seconds: float, http_tokens: str):
        self._get = get_instance
        self._credentials = credentials
        self._sts_ttl = sts_ttl_seconds
        self._http_tokens = http_tokens
        self._tokens: dict[str, float] = {}  # token -> expiry
        self._sts: Credential | None = None
        self._sts_issued_at = 0.0
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        app = web.Application()
        app.router.add_put("/latest/api/token", self._token)
        app.router.add_get("/latest/user-data", self._user_data)
        app.router.add_get("/latest/meta-data", self._meta)
        app.router.add_get("/latest/meta-data/{path:.*}", self._meta)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- hardening-mode tokens -----------------------------------------------------------------------
    async def _token(self, request: web.Request) -> web.Response:
        if "X-Forwarded-For" in request.headers:  # Aliyun refuses token requests that went through a proxy
            return web.Response(status=403, text="Forbidden")
        raw = request.headers.get(TOKEN_TTL_HEADER, "")
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_TOKEN_TTL:
            return web.Response(status=400, text=f"{TOKEN_TTL_HEADER} must be an integer in [1, {MAX_TOKEN_TTL}]")
        token = secrets.token_urlsafe(32)
        now = time.time()
        self._tokens = {t: exp for t, exp in self._tokens.items() if exp > now}
        self._tokens[token] = now + int(raw)
        return web.Response(text=token)

    def _authorised(self, request: web.Request) -> web.Response | None:
        token = request.headers.get(TOKEN_HEADER)
        if token is None:
            return web.Response(status=403, text="Forbidden: security hardening mode requires a token") \
                if self._http_tokens == "required" else None
        if self._tokens.get(token, 0) <= time.time():
            return web.Response(status=401, text="Unauthorized: invalid or expired metadata token")
        return None

    # -- content -------------------------------------------------------------------------------------
    async def _user_data(self, request: web.Request) -> web.Response:
        if (denied := self._authorised(request)) is not None:
            return denied
        inst = self._get()
        if inst is None:
            return web.Response(status=404, text="Not Found")
        return web.Response(body=base64.b64decode(inst.user_data or ""), content_type="text/plain")

    def _credentials_doc(self, role: str) -> dict[str, Any]:
        now = time.time()
        # Refresh well before expiry, as the real service does, so a client never holds a dying token.
        if self._sts is None or self._sts.role_name != role or \
                (self._sts.expires_at or 0) - now < self._sts_ttl / 4:
            self._sts = self._credentials.issue_sts(role, ttl_seconds=self._sts_ttl)
            self._sts_issued_at = now
        c = self._sts
        return {"AccessKeyId": c.access_key_id, "AccessKeySecret": c.access_key_secret,
                "SecurityToken": c.security_token, "Expiration": iso_second(c.expires_at or now),
                "LastUpdated": iso_second(self._sts_issued_at), "Code": "Success"}

    async def _meta(self, request: web.Request) -> web.StreamResponse:
        if (denied := self._authorised(request)) is not None:
            return denied
        inst = self._get()
        if inst is None:
            return web.Response(status=404, text="Not Found")
        path = request.match_info.get("path", "").strip("/")
        flat = {
            "instance-id": inst.instance_id, "region-id": inst.region_id, "zone-id": inst.zone_id,
            "hostname": inst.host_name, "private-ipv4": inst.private_ip, "image-id": inst.image_id,
            "instance/instance-type": inst.instance_type, "instance/instance-name": inst.instance_name,
            "vswitch-id": inst.vswitch_id, "vpc-id": inst.vpc_id, "serial-number": inst.instance_id,
            "owner-account-id": "1234567890123456", "mac": "00:16:3e:00:00:01",
        }
        if inst.public_ip:
            flat["eipv4"] = inst.public_ip
            flat["public-ipv4"] = inst.public_ip
        if path in flat:
            return web.Response(text=flat[path])
        if path == "ram/security-credentials":
            if not inst.ram_role_name:
                return web.Response(status=404, text="Not Found")
            return web.Response(text=inst.ram_role_name)
        if path.startswith("ram/security-credentials/"):
            role = path.rsplit("/", 1)[1]
            if role != inst.ram_role_name:
                return web.Response(status=404, text="Not Found")
            try:
                return web.json_response(self._credentials_doc(role))
            except CredentialError as e:
                return web.json_response({"Code": e.code, "Message": e.message}, status=500)
        # Directory listings: children of `path`, with a trailing "/" for sub-directories.
        keys = list(flat) + (["ram/security-credentials/"] if inst.ram_role_name else [])
        prefix = path + "/" if path else ""
        children = sorted({k[len(prefix):].split("/")[0] + ("/" if "/" in k[len(prefix):] else "")
                           for k in keys if k.startswith(prefix)})
        if not children:
            return web.Response(status=404, text="Not Found")
        return web.Response(text="\n".join(children))
