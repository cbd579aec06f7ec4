"""Shared pieces of the job kinds: strict params, one timed request, summaries, the observation shape,
and the two side channels some kinds read (the mock-tool server, a target's ground-truth records).

Every kind returns `observation(...)`: {"kind", "params", "runs": [{"label", "level", "summary"}],
"findings", "verdict", "verdict_reasons"} (docs/job-kinds.md). Load-shaped kinds put the engine's
RunResult.summary() in `summary`; sequential kinds put the compatible subset `sample_summary(...)` makes
(counts, latency_ms {metric: describe()}, errors), with latencies measured from the actual send (there is
no schedule, so intended = send).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import re
import socket
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import aiohttp
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from csbench.probe.engine.client import exception_error, parse_retry_after, status_error
from csbench.probe.engine.requests import HttpTemplate, OpenAIBody, PreparedRequest, RequestBuilder
from csbench.probe.engine.selfcheck import combine
from csbench.probe.engine.sse import (
    K_CONTENT,
    K_DONE,
    K_ERROR,
    K_TOKEN,
    SseFramer,
    classify_generic,
    classify_openai,
)
from csbench.probe.engine.stats import describe
from csbench.probe.protocol import Target, TargetKind
from csbench.probe.ssrf import blocked_address, check_target

MS = 1e-6
P = TypeVar("P", bound="KindParams")


# -- params ------------------------------------------------------------------------------------------------
class KindParams(BaseModel):
    """Base of every kind's params: unknown keys are an error (the seed silently ignored `warmup`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class RequestParams(KindParams):
    """What one request looks like. openai targets: prompt/max_tokens; http targets: `request` template."""

    prompt: str = "Say hello."
    max_tokens: int | None = Field(default=16, ge=1)
    request: dict[str, Any] | None = None  # kind=http: {method, path, headers, body, stream}
    request_timeout_s: float = Field(default=60.0, gt=0, le=3600)


def parse_params(model: type[P], raw: Mapping[str, Any] | None, kind: str) -> P:
    """Validate a job's params; the error names every unknown or invalid param and the accepted ones."""
    raw = dict(raw or {})
    unknown = sorted(set(raw) - set(model.model_fields))
    if unknown:
        raise ValueError(f"{kind}: unknown params {unknown}; accepted: {sorted(model.model_fields)}")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(x) for x in e['loc']) or 'params'}: {e['msg']}" for e in exc.errors()[:6]
        )
        raise ValueError(f"{kind}: invalid params: {problems}") from None


# -- secrets by reference ------------------------------------------------------------------------------------
# The carrier resolves a job's references before the job starts and puts them here, scoped to the job's task.
JOB_SECRETS: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar("csbench_job_secrets",
                                                                                       default=None)


def resolve_secret(ref: str) -> str:
    """A secret named by reference: the Secret document the control side wrote under the campaign's secrets/
    (fetched by the carrier when the job starts), else — for development — the carrier's environment
    CB_PROBE_SECRET_<REF> (REF upper-cased, every non-alphanumeric character → '_'). Never logged, never put
    in observations."""
    found = (JOB_SECRETS.get() or {}).get(ref)
    if found:
        return found
    name = "CB_PROBE_SECRET_" + re.sub(r"[^A-Za-z0-9]", "_", ref).upper()
    value = os.environ.get(name)
    if not value:
        raise ValueError(f"secret reference {ref!r} is not available on this carrier: no secrets/{ref}.json "
                         f"in the campaign's prefix (and no env {name})")
    return value


def credential_headers(target: Target) -> dict[str, str]:
    """target.credential_ref → an Authorization header (bearer token), resolved locally."""
    if not target.credential_ref:
        return {}
    return {"Authorization": f"Bearer {resolve_secret(target.credential_ref)}"}


# -- one timed request ---------------------------------------------------------------------------------------
@dataclass
class Sample:
    """One request, every time in ms from just before the request was written (t_send)."""

    session_id: str
    ok: bool = False
    status: int = 0
    request_id: str | None = None  # the server's x-request-id, if it answered headers
    error: str | None = None  # engine error class (http_429, http_5xx, transport, truncated, aborted…)
    error_detail: str | None = None
    headers_ms: float | None = None  # status line + headers received
    first_event_ms: float | None = None  # first SSE event of any kind (role-only chunks included)
    ttft_ms: float | None = None  # first event carrying generated output (content, reasoning, tool args)
    ttfc_ms: float | None = None  # first event carrying user-visible content
    total_ms: float | None = None  # [DONE] / end of body / failure
    n_events: int = 0
    n_token_events: int = 0
    retry_after_s: float | None = None
    retry_after_raw: str | None = None
    aborted_ms: float | None = None  # when the client closed the connection on purpose
    content: str | None = None  # assistant text (kept only when asked for; agent answers)
    t_send_ns: int = 0  # perf_counter_ns at send (CLOCK_MONOTONIC: comparable with localcloud records)
    t_end_ns: int = 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: v for k, v in d.items() if v is not None}


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


def new_session_id(tag: str = "s") -> str:
    return f"csb-{tag}-{uuid.uuid4().hex[:12]}"


class Client:
    """Sequential requests against one target, timed like the engine's client (perf_counter_ns, arrival
    time read before parsing). Used by kinds that send a handful of requests, not a load."""

    def __init__(self, target: Target, p: RequestParams, *, limit: int = 8):
        self.target = target
        self.p = p
        self.creds = credential_headers(target)
        self.http_template = HttpTemplate.from_params(p.request) if p.request is not None else None
        if target.kind == TargetKind.http and self.http_template is None:
            self.http_template = HttpTemplate(path=target.path)
        self._builders: dict[tuple[str, int | None], RequestBuilder] = {}
        self._limit = limit
        self.http: aiohttp.ClientSession | None = None
        self.seq = 0

    async def __aenter__(self) -> Client:
        timeout = aiohttp.ClientTimeout(total=self.p.request_timeout_s, sock_connect=10)
        connector = aiohttp.TCPConnector(resolver=_GuardedResolver(), limit=self._limit)
        self.http = aiohttp.ClientSession(timeout=timeout, connector=connector, auto_decompress=False)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self.http is not None:
            await self.http.close()

    def _builder(self, prompt: str, max_tokens: int | None) -> RequestBuilder:
        b = self._builders.get((prompt, max_tokens))
        if b is None:
            body = OpenAIBody(prompt=prompt, max_tokens=max_tokens)
            b = RequestBuilder(self.target, openai_body=body, http=self.http_template,
                               credential_headers=self.creds)
            self._builders[(prompt, max_tokens)] = b
        return b

    def prepared(self, session: str, prompt: str | None = None, max_tokens: int | None = -1) -> PreparedRequest:
        self.seq += 1
        mt = self.p.max_tokens if max_tokens == -1 else max_tokens
        return self._builder(prompt if prompt is not None else self.p.prompt, mt).build(session, self.seq)

    async def request(self, session: str, *, prompt: str | None = None, keep_content: bool = False,
                      abort_at: str | None = None, abort_after_ms: float | None = None,
                      max_tokens: int | None = -1) -> Sample:
        """Send one request and follow it to the end. abort_at: "headers" | "first_token" closes the
        connection right after that moment; abort_after_ms closes it that long after send (if still open).
        max_tokens: override of params.max_tokens (-1: keep it). Never raises except for cancellation:
        failures become `error` classes."""
        assert self.http is not None, "use `async with Client(...)`"
        req = self.prepared(session, prompt, max_tokens)
        s = Sample(session_id=session)
        if abort_after_ms is not None:
            task = asyncio.ensure_future(self._run(req, s, keep_content, abort_at))
            done, _ = await asyncio.wait({task}, timeout=abort_after_ms / 1000)
            if not done:
                task.cancel()  # aiohttp closes the connection of a cancelled request
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                now = time.perf_counter_ns()
                s.aborted_ms = (now - s.t_send_ns) * MS if s.t_send_ns else 0.0
                s.t_end_ns, s.total_ms, s.ok = now, s.aborted_ms, False
                s.error, s.error_detail = "aborted", f"client closed the connection after {abort_after_ms} ms"
            return s
        await self._run(req, s, keep_content, abort_at)
        return s

    async def _run(self, req: PreparedRequest, s: Sample, keep_content: bool, abort_at: str | None) -> None:
        assert self.http is not None
        classify = classify_openai if req.openai else classify_generic
        text: list[str] = []
        t0 = 0
        try:
            t0 = s.t_send_ns = time.perf_counter_ns()
            async with self.http.request(req.method, req.url, data=req.body, headers=req.headers) as resp:
                t = time.perf_counter_ns()
                s.headers_ms, s.status = (t - t0) * MS, resp.status
                s.request_id = resp.headers.get("x-request-id")
                err = status_error(resp.status)
                if err is not None:
                    if resp.status == 429:
                        s.retry_after_raw = resp.headers.get("Retry-After")
                        s.retry_after_s = parse_retry_after(s.retry_after_raw)
                    body = await resp.content.read(2048)
                    s.error, s.error_detail = err, f"HTTP {resp.status}: {body[:200].decode(errors='replace')}"
                    return
                if abort_at == "headers":
                    s.aborted_ms = (time.perf_counter_ns() - t0) * MS
                    resp.close()
                    s.error, s.error_detail = "aborted", "client closed the connection after the headers"
                    return
                if not req.stream:
                    body = await resp.read()
                    t = time.perf_counter_ns()
                    s.ttft_ms = s.ttfc_ms = s.first_event_ms = (t - t0) * MS  # first byte ≈ whole body
                    if keep_content:
                        s.content = body[:65536].decode(errors="replace")
                    s.ok = True
                    return
                framer = SseFramer()
                finished = False
                async for chunk in resp.content.iter_any():
                    t = time.perf_counter_ns()  # arrival: before parsing
                    for ev in framer.feed(chunk):
                        s.n_events += 1
                        if s.first_event_ms is None:
                            s.first_event_ms = (t - t0) * MS
                        k = classify(ev)
                        if K_TOKEN <= k.kind <= K_CONTENT:
                            s.n_token_events += 1
                            if s.ttft_ms is None:
                                s.ttft_ms = (t - t0) * MS
                            if k.kind == K_CONTENT and s.ttfc_ms is None:
                                s.ttfc_ms = (t - t0) * MS
                            if keep_content and ev.data:
                                text.append(content_of(ev.data, req.openai))
                        elif k.kind == K_DONE:
                            finished = True
                        elif k.kind == K_ERROR:
                            s.error, s.error_detail = "stream_error", (ev.data or "")[:200]
                            return
                        if finished:
                            break
                    if finished:
                        break
                    if abort_at == "first_token" and s.ttft_ms is not None:
                        s.aborted_ms = (time.perf_counter_ns() - t0) * MS
                        resp.close()
                        s.error, s.error_detail = "aborted", "client closed the connection after the first token"
                        return
                if not finished:
                    s.error, s.error_detail = "truncated", f"stream ended without [DONE] after {s.n_events} events"
                    return
                s.ok = s.ttft_ms is not None
                if not s.ok:
                    s.error, s.error_detail = "protocol", "stream finished without any output token"
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # classified, never raised
            s.error, s.error_detail = exception_error(exc), f"{type(exc).__name__}: {exc}"[:300]
        finally:
            s.t_end_ns = time.perf_counter_ns()
            if t0:
                s.total_ms = (s.t_end_ns - t0) * MS
            if keep_content and text:
                s.content = "".join(text)


def content_of(data: str, openai: bool) -> str:
    if not openai:
        return data
    try:
        doc = json.loads(data)
    except ValueError:
        return ""
    return "".join(str((c.get("delta") or {}).get("content") or "") for c in doc.get("choices") or ())


# -- summaries and the observation shape ---------------------------------------------------------------------
SAMPLE_METRICS = {"ttft": "ttft_ms", "ttfe": "first_event_ms", "ttfb_headers": "headers_ms", "ttfc": "ttfc_ms",
                  "e2e": "total_ms"}


def sample_summary(samples: Sequence[Sample]) -> dict[str, Any]:
    """The engine summary's subset for sequential samples: counts, latency_ms (from send), errors."""
    errs: dict[str, int] = {}
    for s in samples:
        if s.error:
            errs[s.error] = errs.get(s.error, 0) + 1
    ok = [s for s in samples if s.ok]
    lat = {m: describe([getattr(s, f) for s in ok if getattr(s, f) is not None]) for m, f in SAMPLE_METRICS.items()}
    n = len(samples)
    return {
        "counts": {"offered": n, "sent": n, "completed": len(ok), "dropped": 0, "errors": errs},
        "latency_ms": lat,
        "latency_anchor": "send",  # sequential: no schedule, intended = send
        "errors": {k: {"n": v, "rate": v / n} for k, v in sorted(errs.items())} if n else {},
    }


def run_entry(label: str, summary: dict[str, Any], level: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"label": label, "level": level or {}, "summary": summary}


def verdict_of(runs: Iterable[dict[str, Any]], extra: Iterable[tuple[str, list[str]]] = ()) -> tuple[str, list[str]]:
    """Worst engine self-check over the runs (runs without one count as valid), plus kind-level checks."""
    parts = [(r["summary"]["selfcheck"]["verdict"], list(r["summary"]["selfcheck"]["reasons"]))
             for r in runs if isinstance(r.get("summary", {}).get("selfcheck"), dict)]
    return combine([*parts, *extra])


def observation(kind: str, params: KindParams, runs: list[dict[str, Any]], findings: dict[str, Any],
                checks: Iterable[tuple[str, list[str]]] = (), **extra: Any) -> dict[str, Any]:
    verdict, reasons = verdict_of(runs, checks)
    return {"kind": kind, "params": params.model_dump(mode="json"), "runs": runs, "findings": findings,
            "verdict": verdict, "verdict_reasons": reasons, **extra}


def p50(values: Iterable[float | None]) -> float | None:
    xs = sorted(v for v in values if v is not None)
    return describe(xs, ci=False)["p50"] if xs else None


# -- side channels -------------------------------------------------------------------------------------------
async def checked_url(url: str, what: str) -> str:
    """An auxiliary URL from a job document (mock server, ground truth): same SSRF rule as the target."""
    try:
        await check_target(url)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None
    return url.rstrip("/")


class MockTool:
    """The seed's mock-tool protocol, driven directly by the probe (X-Clousight-Token when given)."""

    def __init__(self, http: aiohttp.ClientSession, admin_url: str, token: str | None):
        self.http, self.url = http, admin_url
        self.headers = {"X-Clousight-Token": token} if token else {}

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        async with self.http.request(method, self.url + path, json=body, headers=self.headers,
                                     timeout=aiohttp.ClientTimeout(total=10)) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise RuntimeError(f"mock-tool {method} {path} answered HTTP {resp.status}: {text[:200]}")
            return json.loads(text) if text else {}

    async def fault(self, target: str, corr: str, *, status: int = 500, fail_from_call: int = 1,
                    fail_count: int = 1) -> None:
        await self._call("POST", "/fault/config", {"target": target, "corr": corr, "status": status,
                                                   "fail_from_call": fail_from_call, "fail_count": fail_count})

    async def clear_fault(self, target: str, corr: str) -> None:
        """Neutralise only our rule (`{}` would clear every prober's rules)."""
        await self._call("POST", "/fault/config", {"target": target, "corr": corr, "fail_from_call": 1,
                                                   "fail_count": 0})

    async def latency(self, target: str, corr: str, add_ms: int, count: int = 1_000_000) -> None:
        await self._call("POST", "/latency/config", {"target": target, "corr": corr, "add_ms": add_ms,
                                                     "from_call": 1, "count": count})

    async def clear_latency(self, target: str, corr: str) -> None:
        await self._call("POST", "/latency/config", {"target": target, "corr": corr, "add_ms": 0})

    async def call_count(self, target: str, corr: str) -> int:
        state = await self._call("GET", "/fault/state")
        return int((state.get("call_counts") or {}).get(f"{target}|{corr}", 0))

    async def call_log(self, target: str, corr: str) -> list[dict[str, Any]] | None:
        """Per-call log (localcloud's `/-/calls`), or None where the mock does not offer it."""
        try:
            doc = await self._call("GET", "/-/calls")
        except (RuntimeError, aiohttp.ClientError, ValueError):
            return None
        return [c for c in doc.get("calls", []) if c.get("target") == target and c.get("corr") == corr]


def tool_plan(mock_base_url: str, target: str, corr: str, token: str | None, method: str = "GET") -> str:
    """The seed's JSON tool plan (the user message the benchmark agent executes)."""
    plan: dict[str, Any] = {"tool": {"target": target, "method": method}, "mock_base_url": mock_base_url,
                            "_correlation_id": corr}
    if token:
        plan["mock_token"] = token
    return json.dumps(plan, separators=(",", ":"))


def agent_answer(sample: Sample) -> dict[str, Any] | None:
    """The benchmark agent's JSON answer {"ok", "status", "tool_target", "attempts"}, if it sent one."""
    if not sample.content:
        return None
    try:
        doc = json.loads(sample.content)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


class GroundTruth:
    """A target's server-side request records (localcloud's `GET /-/requests`); absent on real platforms."""

    def __init__(self, http: aiohttp.ClientSession, url: str):
        self.http, self.url = http, url

    async def record(self, request_id: str) -> dict[str, Any] | None:
        async with self.http.get(f"{self.url}/-/requests/{request_id}",
                                 timeout=aiohttp.ClientTimeout(total=10)) as resp:
            if resp.status == 404:
                return None
            if resp.status != 200:
                raise RuntimeError(f"ground truth answered HTTP {resp.status} for request {request_id}")
            return dict(await resp.json())

    async def by_session(self, session_id: str) -> list[dict[str, Any]]:
        """Completed records of one session (pages through the ring from the start)."""
        out: list[dict[str, Any]] = []
        since = 0
        while True:
            async with self.http.get(f"{self.url}/-/requests", params={"since": since, "limit": 1000},
                                     timeout=aiohttp.ClientTimeout(total=10)) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"ground truth answered HTTP {resp.status}")
                page = await resp.json()
            recs = page.get("records") or []
            out += [r for r in recs if r.get("session_id") == session_id]
            if not recs:
                return out
            since = recs[-1]["seq"]

    async def settled(self, request_id: str, timeout_s: float) -> dict[str, Any] | None:
        """The record once it is no longer in flight (the server may notice a disconnect a little later)."""
        deadline = time.monotonic() + timeout_s
        rec = None
        while time.monotonic() < deadline:
            rec = await self.record(request_id)
            if rec is not None and rec.get("outcome") != "in_flight":
                return rec
            await asyncio.sleep(0.05)
        return rec
