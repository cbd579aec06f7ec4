"""`cancellation`: when a client goes away mid-request, does the server notice and stop?
(docs/job-kinds.md#cancellation)

Per attempt, on one warm session: start a streaming request, close the connection at `abort_at`
("headers", "first_token", or `abort_after_ms` after send), then send a follow-up request on the same
session. What is provable, and how:
  - client aborted mid-request: the response had not finished when we closed it (else the attempt is
    `not_aborted`: nothing was cancelled, and it never counts as honoured — the seed counted any exception);
  - follow-up succeeded: the session and platform are usable after the abort (provable anywhere);
  - server observed the disconnect and ended the request early: only with server-side evidence. With
    `ground_truth_url` (localcloud `/-/requests`): the record's outcome is `disconnected` with a disconnect
    stamp, and tokens_sent < tokens_planned. On a real platform without such records this is unknown
    (honoured = None), never assumed.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from csbench.probe.jobs import JobContext
from csbench.probe.jobs.common import (
    Client,
    GroundTruth,
    RequestParams,
    Sample,
    checked_url,
    new_session_id,
    observation,
    parse_params,
    run_entry,
    sample_summary,
)
from csbench.probe.protocol import Phase

KIND = "cancellation"


class CancellationParams(RequestParams):
    attempts: int = Field(default=3, ge=1, le=100)
    abort_at: Literal["headers", "first_token", "after_ms"] = "first_token"
    abort_after_ms: float | None = Field(default=None, gt=0)
    max_tokens: int | None = Field(default=256, ge=1)  # the aborted request: still streaming when we abort
    followup_max_tokens: int | None = Field(default=16, ge=1)  # warm-up and follow-up requests: short
    ground_truth_url: str | None = None
    verify_timeout_s: float = Field(default=5.0, gt=0, le=120)

    @model_validator(mode="after")
    def _after_ms(self) -> CancellationParams:
        if (self.abort_at == "after_ms") != (self.abort_after_ms is not None):
            raise ValueError("abort_after_ms is required with abort_at='after_ms' and only then")
        return self


def classify_attempt(aborted: Sample, followup: Sample, record: dict[str, Any] | None,
                     have_ground_truth: bool) -> dict[str, Any]:
    """What one attempt proves. Pure.

    honoured: True only if the server recorded the disconnect; False if it recorded anything else (it
    finished, or never noticed); None when there is no server-side evidence to decide."""
    out: dict[str, Any] = {
        "aborted": aborted.error == "aborted",
        "abort_ms": aborted.aborted_ms,
        "request_id": aborted.request_id,
        "followup_ok": followup.ok,
        "followup_ms": followup.total_ms,
        "server_outcome": None,
        "server_observed_disconnect": None,
        "server_ended_early": None,
        "honoured": None,
    }
    if not out["aborted"]:
        out["result"] = "not_aborted"  # the request ended (or failed) before we could cancel it
        out["honoured"] = False if have_ground_truth else None
        return out
    if record is None:
        out["result"] = "no_server_evidence" if not have_ground_truth else "record_missing"
        return out
    out["server_outcome"] = record.get("outcome")
    observed = record.get("outcome") == "disconnected" and record.get("disconnect_ns") is not None
    out["server_observed_disconnect"] = observed
    planned, sent = record.get("tokens_planned"), record.get("tokens_sent")
    out["server_ended_early"] = (sent < planned) if isinstance(planned, int) and isinstance(sent, int) else None
    if observed and aborted.t_end_ns and record.get("disconnect_ns"):
        # both CLOCK_MONOTONIC on the same host (localcloud): how long until the server noticed
        out["server_notice_ms"] = (record["disconnect_ns"] - aborted.t_end_ns) * 1e-6
    out["honoured"] = observed
    out["result"] = "honoured" if observed else "not_observed_by_server"
    return out


def findings(attempts: list[dict[str, Any]], have_ground_truth: bool) -> dict[str, Any]:
    aborted = [a for a in attempts if a["aborted"]]
    decided = [a["honoured"] for a in aborted if a["honoured"] is not None]
    return {
        "attempts": len(attempts),
        "aborted_attempts": len(aborted),
        "followup_ok_all": all(a["followup_ok"] for a in attempts),
        "server_evidence": "ground_truth_records" if have_ground_truth else "none",
        # None = not provable here (no server-side records): never inferred from a client exception.
        "honoured": (all(decided) if decided else None) if have_ground_truth and aborted else None,
        "honoured_attempts": sum(1 for a in aborted if a["honoured"]),
        "server_ended_early_all": all(a["server_ended_early"] for a in aborted)
        if have_ground_truth and aborted and all(a["server_ended_early"] is not None for a in aborted) else None,
        "provable": ["client aborted before the response finished", "follow-up call on the same session"]
        + (["server recorded the disconnect", "server stopped generating early"] if have_ground_truth else []),
        "not_provable": [] if have_ground_truth else [
            "whether the server noticed the disconnect or kept generating (no server-side records)"],
        "details": attempts,
    }


async def run_cancellation(ctx: JobContext) -> dict[str, Any]:
    p = parse_params(CancellationParams, ctx.params, KIND)
    n = 1 + 2 * p.attempts
    if n > ctx.spec.limits.max_requests:
        raise ValueError(f"{KIND}: {n} requests exceed limits.max_requests ({ctx.spec.limits.max_requests})")
    session = new_session_id("cancel")
    results: list[dict[str, Any]] = []
    aborted_samples: list[Sample] = []
    followups: list[Sample] = []
    async with Client(ctx.spec.target, p, limit=2) as client:
        assert client.http is not None
        gt = GroundTruth(client.http, await checked_url(p.ground_truth_url, "ground_truth_url")) \
            if p.ground_truth_url else None  # fmt: skip
        ctx.progress(Phase.warmup, 0, p.attempts)
        warm = await client.request(session, max_tokens=p.followup_max_tokens)  # not the cold start
        if not warm.ok:
            raise RuntimeError(f"warm-up request failed: {warm.error}: {warm.error_detail}")
        for k in range(p.attempts):
            ctx.progress(Phase.measuring, k, p.attempts)
            if p.abort_at == "after_ms":
                a = await client.request(session, abort_after_ms=p.abort_after_ms)
            else:
                a = await client.request(session, abort_at=p.abort_at)
            record = None
            if gt is not None:
                if a.request_id:
                    record = await gt.settled(a.request_id, p.verify_timeout_s)
                else:  # aborted before the headers: find it by its session, latest first
                    recs = await gt.by_session(session)
                    record = max(recs, key=lambda r: r.get("arrival_ns", 0)) if recs else None
            f = await client.request(session, max_tokens=p.followup_max_tokens)
            aborted_samples.append(a)
            followups.append(f)
            res = classify_attempt(a, f, record, gt is not None)
            results.append(res)
            await ctx.telemetry.write("attempts", {**res, "aborted_sample": a.to_dict(), "followup": f.to_dict()})
    ctx.progress(Phase.finishing, p.attempts, p.attempts)
    runs = [run_entry("aborted", sample_summary(aborted_samples)), run_entry("followup", sample_summary(followups))]
    fnd = findings(results, gt is not None)
    checks = []
    if any(not r["aborted"] for r in results):
        checks.append(("warn", ["some requests finished before the abort: raise max_tokens or abort earlier"]))
    return observation(KIND, p, runs, fnd, checks)
