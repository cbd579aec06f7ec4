"""`ttft`: time to first token of a streaming OpenAI-compatible chat completion, sample by sample.

Params: samples (5), warmup (1, not in the statistics), session ("per_job" | "per_sample": a fresh session id
for the whole job or for every request), prompt, max_tokens (16), request_timeout_s (60).
Per sample (perf_counter_ns from just before the request is sent): headers_ms (response headers),
first_event_ms (first SSE event), ttft_ms (first non-empty delta.content), total_ms ([DONE] or end of body).
Observations: the samples, exact nearest-rank p50/p90/max of ttft_ms over the ok samples, errors by class.
Compact on purpose: the full measurement engine (arrivals, self-check) comes later.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import time
import uuid
from typing import Any

import aiohttp

from csbench.probe.jobs import JobContext
from csbench.probe.protocol import Phase
from csbench.probe.ssrf import blocked_address


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile: an actual sample, never an interpolation."""
    if not sorted_values:
        raise ValueError("no samples")
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


class SseParser:
    """Minimal text/event-stream framing: events end at a blank line; `data:` lines are joined with \\n."""

    def __init__(self) -> None:
        self._buf = ""

    def feed(self, chunk: bytes) -> list[str]:
        self._buf += chunk.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
        events = []
        while "\n\n" in self._buf:
            raw, self._buf = self._buf.split("\n\n", 1)
            data = [line[5:].removeprefix(" ") for line in raw.split("\n") if line.startswith("data:")]
            if data:
                events.append("\n".join(data))
        return events


def token_of(event: str) -> str:
    """The content text an OpenAI chunk carries ('' for role-only, usage and finish chunks)."""
    doc = json.loads(event)
    for choice in doc.get("choices") or []:
        content = (choice.get("delta") or {}).get("content")
        if content:
            return str(content)
    return ""


class _GuardedResolver(aiohttp.abc.AbstractResolver):
    """Re-check resolved addresses at connect time, so a name cannot be rebound to the metadata service."""

    def __init__(self) -> None:
        self._inner = aiohttp.ThreadedResolver()

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> Any:
        hosts = await self._inner.resolve(host, port, family)
        for h in hosts:
            why = blocked_address(h["host"])
            if why:
                raise OSError(f"refused to connect to {host}: {why}")
        return hosts

    async def close(self) -> None:
        await self._inner.close()


def error_class(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ClientResponseError):
        return f"http_{exc.status}"
    if isinstance(exc, asyncio.TimeoutError):
        return "timeout"
    if isinstance(exc, aiohttp.ClientConnectionError | OSError):
        return "connection"
    if isinstance(exc, ValueError | KeyError):
        return "protocol"
    return type(exc).__name__


async def one_sample(http: aiohttp.ClientSession, ctx: JobContext, session_id: str) -> dict[str, Any]:
    t = ctx.spec.target
    p = ctx.params
    body = {"model": t.model, "stream": True, "max_tokens": int(p.get("max_tokens", 16)),
            "messages": [{"role": "user", "content": str(p.get("prompt", "Say hello."))}]}
    headers = {**t.headers, t.session_header: session_id}
    out: dict[str, Any] = {"session_id": session_id, "ok": False}
    ms = 1e-6
    t0 = time.perf_counter_ns()
    try:
        async with http.post(t.url.rstrip("/") + t.path, json=body, headers=headers) as resp:
            out["headers_ms"] = (time.perf_counter_ns() - t0) * ms
            out["status"] = resp.status
            if resp.status != 200:
                raise aiohttp.ClientResponseError(resp.request_info, (), status=resp.status,
                                                  message=(await resp.text())[:200])
            parser = SseParser()
            done = False
            async for chunk in resp.content.iter_any():
                for event in parser.feed(chunk):
                    now = time.perf_counter_ns()
                    out.setdefault("first_event_ms", (now - t0) * ms)
                    if event.strip() == "[DONE]":
                        done = True
                        break
                    if "ttft_ms" not in out and token_of(event):
                        out["ttft_ms"] = (now - t0) * ms
                if done:
                    break
            out["total_ms"] = (time.perf_counter_ns() - t0) * ms
        if "ttft_ms" not in out:
            raise ValueError("stream ended without a content token")
        out["ok"] = True
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        out["error"] = error_class(exc)
        out["error_message"] = f"{type(exc).__name__}: {exc}"[:300]
    return out


async def run_ttft(ctx: JobContext) -> dict[str, Any]:
    p = ctx.params
    samples, warmup = int(p.get("samples", 5)), int(p.get("warmup", 1))
    per_sample = str(p.get("session", "per_job")) == "per_sample"
    if samples < 1 or warmup < 0 or samples + warmup > ctx.spec.limits.max_requests:
        raise ValueError(f"samples={samples}, warmup={warmup}: need samples ≥ 1, warmup ≥ 0 and "
                         f"samples + warmup ≤ limits.max_requests ({ctx.spec.limits.max_requests})")
    if ctx.spec.target.credential_ref:
        raise ValueError("target.credential_ref is not supported by this carrier yet")
    job_session = f"csb-{uuid.uuid4().hex[:16]}"
    timeout = aiohttp.ClientTimeout(total=float(p.get("request_timeout_s", 60)))
    results: list[dict[str, Any]] = []
    errors: dict[str, int] = {}
    connector = aiohttp.TCPConnector(resolver=_GuardedResolver(), limit=1)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        for i in range(warmup + samples):
            phase = Phase.warmup if i < warmup else Phase.measuring
            ctx.progress(phase, completed=max(0, i - warmup), total=samples)
            sid = f"csb-{uuid.uuid4().hex[:16]}" if per_sample else job_session
            sample = await one_sample(http, ctx, sid)
            sample["index"], sample["warmup"] = i, i < warmup
            await ctx.telemetry.write("samples", sample)
            if i >= warmup:
                results.append(sample)
                if not sample["ok"]:
                    errors[sample["error"]] = errors.get(sample["error"], 0) + 1
    ctx.progress(Phase.finishing, completed=samples, total=samples)
    ttfts = sorted(s["ttft_ms"] for s in results if s["ok"])
    if not ttfts:
        raise RuntimeError(f"all {samples} samples failed: {errors}")
    return {
        "samples": results,
        "ttft_ms": {"n": len(ttfts), "p50": percentile(ttfts, 0.5), "p90": percentile(ttfts, 0.9),
                    "max": ttfts[-1], "method": "nearest-rank"},
        "errors": errors,
        "session": "per_sample" if per_sample else "per_job",
    }
