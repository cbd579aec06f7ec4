"""The seed's benchmark agent, inside the target: execute a JSON tool plan against the mock-tool server.

The seed's probes (fault_recovery, retry_storm, hol_blocking, ensure_warm) send a user message whose content
is JSON: `{"tool": {"target", "method"?, "params"?, "body"?}, "mock_base_url", "mock_token"?,
"_correlation_id"?}`. The deployed agent makes that one tool call with its pinned retry policy (a 5xx is
retried up to `max_retries` times after `backoff_ms`; 4xx and connection failures are final) and answers
`{"ok", "status", "tool_target", "attempts"}` as the assistant message content. Every attempt carries the
same correlation id, so the probe reads the attempt count from the mock's `target|corr` counter.

Only loopback mock URLs are followed (`tool_hosts`): the target must never become an SSRF relay.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlencode, urlsplit

import aiohttp

from csbench.localcloud.agentrun.config import AgentPolicy


def tool_plan(content: str | None) -> dict[str, Any] | None:
    """The tool plan in a user message, or None for an ordinary prompt (cheap check first)."""
    if not content or content[0] != "{":
        return None
    try:
        doc = json.loads(content)
    except ValueError:
        return None
    if isinstance(doc, dict) and isinstance(doc.get("tool"), dict) and "mock_base_url" in doc:
        return doc
    return None


async def run_tool_plan(
    session: aiohttp.ClientSession, plan: dict[str, Any], policy: AgentPolicy
) -> dict[str, Any]:
    tool = plan["tool"]
    target = str(tool.get("target") or "")
    method = str(tool.get("method") or "GET").upper()
    base = str(plan.get("mock_base_url") or "").rstrip("/")
    host = urlsplit(base).hostname or ""
    if urlsplit(base).scheme not in ("http", "https") or host not in policy.tool_hosts:
        return {"ok": False, "status": 599, "tool_target": target, "attempts": 0,
                "error": f"mock_base_url host {host!r} is not allowed (tool_hosts: {list(policy.tool_hosts)})"}  # fmt: skip
    url = f"{base}/{target}"
    params = tool.get("params") or {}
    if method == "GET" and isinstance(params, dict) and params:
        url += "?" + urlencode({k: str(v) for k, v in params.items()})
    data = json.dumps(tool.get("body") or {}).encode() if method == "POST" else None
    headers = {"Content-Type": "application/json"}
    if plan.get("mock_token"):
        headers["X-Clousight-Token"] = str(plan["mock_token"])
    if plan.get("_correlation_id"):
        headers["X-Clousight-Correlation-Id"] = str(plan["_correlation_id"])
    timeout = aiohttp.ClientTimeout(total=policy.timeout_s)
    status, attempts = 599, 0
    for attempt in range(1, policy.max_retries + 2):
        attempts = attempt
        try:
            async with session.request(method, url, data=data, headers=headers, timeout=timeout) as resp:
                await resp.read()
                status = resp.status
        except (aiohttp.ClientError, asyncio.TimeoutError):
            status = 599  # connection failure: final, as in the seed agent
        if 500 <= status <= 598 and attempt <= policy.max_retries:
            await asyncio.sleep(policy.backoff_ms / 1000)
            continue
        break
    return {"ok": 200 <= status < 300, "status": status, "tool_target": target, "attempts": attempts}
