"""Kinds that go through the agent's tool call (fault_recovery, retry_storm, hol_blocking): shared params
and the mock-tool round trip.

The seed's protocol: the probe configures a fault or latency rule on the mock-tool server for a fresh
correlation id, invokes the agent once with a JSON tool plan naming that correlation id, and reads the
mock's call counter `target|corr`. The counter is the server-side truth of how many times the agent
called the tool; the agent's own answer ({"ok", "status", "attempts"}) is reported beside it.
The mock token is passed by reference (`mock_token_ref`, resolved on the carrier), never in the job.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Literal

from csbench.probe.jobs.common import (
    Client,
    MockTool,
    RequestParams,
    Sample,
    agent_answer,
    checked_url,
    new_session_id,
    resolve_secret,
    tool_plan,
)
from csbench.probe.protocol import Target, TargetKind


class AgentParams(RequestParams):
    mock_base_url: str  # what the agent calls (sent inside the tool plan)
    mock_admin_url: str | None = None  # what the probe calls for config/state (default: mock_base_url)
    mock_token_ref: str | None = None  # secret reference → X-Clousight-Token (and the plan's mock_token)
    tool_target: Literal["prices", "inventory", "reports"] = "prices"
    warm: bool = True  # one plain request first, so a cold start is not mistaken for retry time


@dataclass
class AgentEnv:
    client: Client
    mock: MockTool
    token: str | None
    session: str


def require_openai(target: Target, kind: str) -> None:
    if target.kind != TargetKind.openai:
        raise ValueError(f"{kind}: needs an agent target (kind=openai) that runs the JSON tool plan; "
                         f"a kind=http template cannot carry it")


async def open_env(client: Client, p: AgentParams) -> AgentEnv:
    assert client.http is not None
    admin = await checked_url(p.mock_admin_url or p.mock_base_url, "mock_admin_url")
    token = resolve_secret(p.mock_token_ref) if p.mock_token_ref else None
    env = AgentEnv(client, MockTool(client.http, admin, token), token, new_session_id("agent"))
    if p.warm:
        s = await client.request(env.session)
        if not s.ok:
            raise RuntimeError(f"warm-up request failed: {s.error}: {s.error_detail}")
    return env


def new_corr(tag: str) -> str:
    return f"csb-{tag}-{uuid.uuid4().hex[:12]}"


async def invoke(env: AgentEnv, p: AgentParams, corr: str, target: str | None = None,
                 session: str | None = None) -> tuple[Sample, dict[str, Any] | None]:
    """One agent invocation with the tool plan for `corr`; returns the sample and the agent's answer."""
    plan = tool_plan(p.mock_base_url.rstrip("/"), target or p.tool_target, corr, env.token,
                     "POST" if (target or p.tool_target) == "reports" else "GET")
    s = await env.client.request(session or env.session, prompt=plan, keep_content=True)
    return s, agent_answer(s)


def public_sample(s: Sample) -> dict[str, Any]:
    """A sample without the plan/answer text (the plan may hold the mock token)."""
    d = s.to_dict()
    d.pop("content", None)
    return d
