"""`retry_storm`: the tool fails on every call — how many calls does one invocation cause, and what
bounds them? (docs/job-kinds.md#retry_storm)

Method: warm; fault `{target, corr, status, fail_from_call: 1, fail_count: 1_000_000}`; invoke once; read
the mock counter when the invocation returns and again `settle_s` later (calls that keep coming after the
answer are background retries: a storm the client cannot see). Bounded by:
  agent     ≤ agent_retry_limit + 1 calls and the agent answered (its own retry cap held);
  platform  the invocation was cut by the platform (error/timeout) and the calls stopped;
  none      more calls than the agent's limit allows, or calls still arriving after settle_s.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import Field

from csbench.probe.jobs import JobContext
from csbench.probe.jobs.agent import AgentParams, invoke, new_corr, open_env, public_sample, require_openai
from csbench.probe.jobs.common import Client, Sample, observation, parse_params, run_entry, sample_summary
from csbench.probe.protocol import Phase

KIND = "retry_storm"
FOREVER = 1_000_000


class RetryStormParams(AgentParams):
    fault_status: int = Field(default=500, ge=500, le=599)  # 5xx: the class agents retry
    agent_retry_limit: int = Field(default=2, ge=0, le=100)  # the deployed agent's declared retry cap
    settle_s: float = Field(default=1.0, ge=0, le=600)
    max_tokens: int | None = None


def findings(at_answer: int, after_settle: int, limit: int, sample: Sample, answer: dict[str, Any] | None,
             call_times_ms: list[float] | None) -> dict[str, Any]:
    """Pure."""
    late = after_settle - at_answer
    if after_settle > limit + 1 or late > 0:
        bounded = "none"
    elif answer is not None:
        bounded = "agent"
    elif not sample.ok:
        bounded = "platform"
    else:
        bounded = "none"
    gaps = [b - a for a, b in zip(call_times_ms or [], (call_times_ms or [])[1:], strict=False)]
    return {
        "total_attempts": after_settle,
        "attempts_at_answer": at_answer,
        "attempts_after_answer": late,
        "max_expected_attempts": limit + 1,
        "storm_bounded_by": bounded,
        "agent_reported_attempts": answer.get("attempts") if answer else None,
        "duration_ms": sample.total_ms,
        "invoke_error": sample.error,
        "retry_gap_ms": gaps or None,  # from the mock's call log, where it has one
        "attempt_rate_per_s": (after_settle / (sample.total_ms / 1000)) if sample.total_ms else None,
    }


async def run_retry_storm(ctx: JobContext) -> dict[str, Any]:
    p = parse_params(RetryStormParams, ctx.params, KIND)
    require_openai(ctx.spec.target, KIND)
    async with Client(ctx.spec.target, p, limit=2) as client:
        ctx.progress(Phase.warmup, 0, 1)
        env = await open_env(client, p)
        corr = new_corr("storm")
        await env.mock.fault(p.tool_target, corr, status=p.fault_status, fail_count=FOREVER)
        try:
            ctx.progress(Phase.measuring, 0, 1)
            sample, answer = await invoke(env, p, corr)
            at_answer = await env.mock.call_count(p.tool_target, corr)
            await asyncio.sleep(p.settle_s)
            after = await env.mock.call_count(p.tool_target, corr)
            log = await env.mock.call_log(p.tool_target, corr)
        finally:
            await env.mock.clear_fault(p.tool_target, corr)
    ctx.progress(Phase.finishing, 1, 1)
    times = [c["arrival_ns"] * 1e-6 for c in log] if log else None
    await ctx.telemetry.write("invocations", {"corr": corr, "answer": answer, **public_sample(sample)})
    f = findings(at_answer, after, p.agent_retry_limit, sample, answer, times)
    return observation(KIND, p, [run_entry("storm", sample_summary([sample]))], f)
