"""`fault_recovery`: the agent's tool call fails `failures` times, then works — does the agent recover,
with how many attempts, at what latency cost? (docs/job-kinds.md#fault_recovery)

Method: warm the session; one baseline invocation with no fault (correlation id A); configure the fault
`{target, corr: B, status, fail_from_call: 1, fail_count: failures}`; invoke once with B; read the mock's
call count for `target|B` (server-side truth); neutralise our rule (only ours: `{}` would clear others').
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from csbench.probe.jobs import JobContext
from csbench.probe.jobs.agent import AgentParams, invoke, new_corr, open_env, public_sample, require_openai
from csbench.probe.jobs.common import Client, Sample, observation, parse_params, run_entry, sample_summary
from csbench.probe.protocol import Phase

KIND = "fault_recovery"


class FaultRecoveryParams(AgentParams):
    failures: int = Field(default=1, ge=1, le=100)
    fault_status: int = Field(default=500, ge=400, le=599)
    max_tokens: int | None = None  # the agent answers one JSON token; no cap needed


def findings(failures: int, observed_attempts: int, answer: dict[str, Any] | None, invoke_sample: Sample,
             baseline: Sample) -> dict[str, Any]:
    """Pure. recovered = the agent answered and its tool call finally succeeded."""
    recovered = bool(answer and answer.get("ok"))
    return {
        "configured_failures": failures,
        "expected_attempts_if_recovered": failures + 1,
        "observed_attempts": observed_attempts,  # mock counter: every call the agent made
        "agent_reported_attempts": answer.get("attempts") if answer else None,
        "recovered": recovered,
        "final_tool_status": answer.get("status") if answer else None,
        "attempts_match": recovered and observed_attempts == failures + 1,
        "platform_terminated": not invoke_sample.ok,  # the invocation itself failed (not the tool)
        "invoke_error": invoke_sample.error,
        "recovery_ms": invoke_sample.total_ms,
        "baseline_ms": baseline.total_ms,
        "retry_overhead_ms": (invoke_sample.total_ms - baseline.total_ms)
        if invoke_sample.total_ms is not None and baseline.total_ms is not None and baseline.ok else None,
    }


async def run_fault_recovery(ctx: JobContext) -> dict[str, Any]:
    p = parse_params(FaultRecoveryParams, ctx.params, KIND)
    require_openai(ctx.spec.target, KIND)
    async with Client(ctx.spec.target, p, limit=2) as client:
        ctx.progress(Phase.warmup, 0, 2)
        env = await open_env(client, p)
        base_corr, corr = new_corr("base"), new_corr("fault")
        baseline, _ = await invoke(env, p, base_corr)
        ctx.progress(Phase.measuring, 1, 2)
        await env.mock.fault(p.tool_target, corr, status=p.fault_status, fail_count=p.failures)
        try:
            sample, answer = await invoke(env, p, corr)
            observed = await env.mock.call_count(p.tool_target, corr)
        finally:
            await env.mock.clear_fault(p.tool_target, corr)
    ctx.progress(Phase.finishing, 2, 2)
    await ctx.telemetry.write("invocations", {"corr": corr, "answer": answer, **public_sample(sample)})
    f = findings(p.failures, observed, answer, sample, baseline)
    runs = [run_entry("baseline", sample_summary([baseline])), run_entry("fault", sample_summary([sample]))]
    checks = [] if baseline.ok else [("warn", [f"baseline invocation failed: {baseline.error}"])]
    return observation(KIND, p, runs, f, checks)
