"""A tiny synchronous client for the OSS stand-in's admin API (fault rules and request counters).

    admin = OssAdmin(cloud.endpoints["oss"], cloud.ctx.admin.access_key_secret)
    admin.add_fault(action="error", status=503, code="ServiceUnavailable", operation="PutObject", count=3)
    admin.stats()["requests"]["PutObject"]
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any


class OssAdmin:
    def __init__(self, endpoint: str, admin_secret: str, timeout: float = 10.0):
        self.endpoint = endpoint.rstrip("/")
        self._auth = "Bearer " + admin_secret
        self.timeout = timeout

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.endpoint + path, data=data, method=method)
        req.add_header("Authorization", self._auth)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            return json.loads(resp.read())

    def add_fault(self, **rule: Any) -> int:
        """Add one rule (fields of faults.FaultRule); returns its id."""
        return int(self._call("POST", "/-/faults", rule)["ids"][0])

    def faults(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/-/faults")["rules"])

    def clear_faults(self) -> int:
        return int(self._call("DELETE", "/-/faults")["removed"])

    def stats(self) -> dict[str, Any]:
        return dict(self._call("GET", "/-/stats"))

    def reset_stats(self) -> dict[str, Any]:
        return dict(self._call("DELETE", "/-/stats"))
