"""run_load: drive one load model against a target, in this process or in N worker processes.

Flow: clamp the load to the Limits (and report every clamp) → resolve credentials once → start the
monitor → dispatch (open loop: release every due slot on each wake-up; closed loop: N workers) → follow
every request to completion or timeout → summary from raw records. Latency is anchored at t_intended.
"""

from __future__ import annotations

import asyncio
import math
import os
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import aiohttp

from csbench.probe.engine.client import Timeouts, execute, make_trace_config
from csbench.probe.engine.load import NS, LoadSpec, arrivals, phase_of, think_times
from csbench.probe.engine.monitor import GcControl, Monitor
from csbench.probe.engine.records import P_COLD, PHASES, Records
from csbench.probe.engine.requests import (
    CredentialResolver,
    HttpTemplate,
    OpenAIBody,
    RequestBuilder,
    resolve_credentials,
)
from csbench.probe.engine.selfcheck import Thresholds
from csbench.probe.engine.summary import summarize
from csbench.probe.protocol import Limits, Target

now_ns = time.perf_counter_ns
ProgressFn = Callable[[str, int, "int | None", dict[str, float]], None]


class TelemetrySink(Protocol):
    async def write(self, stream: str, record: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class PhasePlan:
    """Sessions and GC policy. Cold = the first request of a new session; it is tagged `cold` whatever its
    time, and never counted in warm-up or steady statistics.

    sessions: shared (one for the run) | pool (closed loop: one per worker; open loop: `pool_size`,
    round-robin) | per_request (every request new ⇒ every request cold).
    """

    sessions: str = "pool"
    pool_size: int = 8
    gc_control: bool = True  # collect+freeze+disable in the steady window (load_anchors §2.5)
    trace_connections: bool = False  # aiohttp TraceConfig → conn_reused (~10 % CPU)

    def __post_init__(self) -> None:
        if self.sessions not in ("shared", "pool", "per_request"):
            raise ValueError(f"sessions {self.sessions!r}: expected shared, pool or per_request")


@dataclass
class RunResult:
    records: Records
    monitors: list[Monitor | None]
    load: LoadSpec  # effective (after clamps)
    asked: LoadSpec  # as requested
    clamps: list[dict[str, Any]]
    epoch_ns: int  # CLOCK_MONOTONIC start instant (t = 0 of the schedule)
    wall_epoch_ns: int  # time.time_ns() at the same instant, for aligning with server logs
    processes: int = 1
    thresholds: Thresholds | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """The summary contract of docs/measurement.md (plain JSON-able dicts)."""
        ld = self.load
        s = summarize(
            self.records,
            self.monitors,
            epoch_ns=self.epoch_ns,
            load={**ld.to_dict(), "open_loop": ld.open_loop, "processes": self.processes},
            warmup_s=ld.warmup_s,
            duration_s=ld.duration_s,
            closed_workers=None if ld.open_loop else ld.concurrency,
            think_mean_s=ld.think_s,
            thresholds=self.thresholds,
        )
        s["clock"]["epoch_wall_ns"] = self.wall_epoch_ns
        s["load"]["clamps"] = self.clamps
        s.update(self.extra)
        return s


def clamp(
    load: LoadSpec, limits: Limits, max_duration_s: float | None = None
) -> tuple[LoadSpec, list[dict[str, Any]]]:
    """Fit a load into the Limits. Pure. Returns the effective load and one entry per clamp."""
    clamps: list[dict[str, Any]] = []
    ch: dict[str, Any] = {}

    def cap(param: str, asked: float, limit: float, used: float | None = None) -> None:
        used = limit if used is None else used
        ch[param] = used
        clamps.append({"param": param, "asked": asked, "used": used, "limit": limit})

    if load.model == "closed" and load.concurrency > limits.max_concurrency:
        cap("concurrency", load.concurrency, limits.max_concurrency)
    if load.model in ("constant", "poisson") and load.rate > limits.max_rate_per_s:
        cap("rate", load.rate, limits.max_rate_per_s)
    if load.open_loop and (load.max_inflight is None or load.max_inflight > limits.max_concurrency):
        if load.max_inflight is not None:
            cap("max_inflight", load.max_inflight, limits.max_concurrency)
        else:
            ch["max_inflight"] = limits.max_concurrency  # the limit is the cap; not a clamp
    if load.model == "burst":
        most = min(limits.max_concurrency, max(1, math.floor(limits.max_rate_per_s * load.burst_interval_s)))
        if load.burst_size > most:
            cap("burst_size", load.burst_size, most)
    if load.max_requests is None or load.max_requests > limits.max_requests:
        if load.max_requests is not None:
            cap("max_requests", load.max_requests, limits.max_requests)
        else:
            ch["max_requests"] = limits.max_requests
    if max_duration_s is not None and load.total_s > max_duration_s:
        steady = max(0.0, max_duration_s - load.warmup_s - load.cooldown_s)
        cap("duration_s", load.duration_s, max_duration_s, steady)
    return replace(load, **ch), clamps


class _Run:
    """State of one in-process run (one event loop)."""

    def __init__(
        self,
        target: Target,
        load: LoadSpec,
        phases: PhasePlan,
        builder: RequestBuilder,
        timeouts: Timeouts,
        process_index: int,
        max_rate_per_s: float,
    ) -> None:
        self.load, self.phases, self.builder, self.timeouts = load, phases, builder, timeouts
        self.process_index = process_index
        self.max_rate_per_s = max_rate_per_s
        capacity = len(arrivals(load)) if load.open_loop else 1024
        self.rec = Records(capacity)
        self.run_id = secrets.token_hex(4)
        self.seen_sessions: set[str] = set()
        self.inflight = 0
        self.issued = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.sem: asyncio.Semaphore | None = None
        self.http: aiohttp.ClientSession | None = None
        self.start = 0

    def session_for(self, seq: int, worker: int | None) -> str:
        mode = self.phases.sessions
        if mode == "shared":
            k = "0"
        elif mode == "per_request":
            k = f"r{seq}"
        else:
            k = f"w{worker}" if worker is not None else f"s{seq % max(1, self.phases.pool_size)}"
        return f"csb-{self.run_id}-p{self.process_index}-{k}"

    def new_row(self, t_intended: int, worker: int | None) -> int:
        rec = self.rec
        i = rec.add()
        c = rec.cols
        seq = self.issued
        self.issued += 1
        c["t_intended"][i] = t_intended
        c["process"][i] = self.process_index
        sid = self.session_for(seq, worker)
        rec.session[i] = sid
        if sid not in self.seen_sessions:
            self.seen_sessions.add(sid)
            c["new_session"][i] = 1
            c["phase"][i] = P_COLD
        else:
            c["phase"][i] = phase_of(t_intended - self.start, self.load)
        return i

    async def one(self, i: int) -> None:
        c = self.rec.cols
        t0 = now_ns()
        if self.sem is not None:
            async with self.sem:
                t = now_ns()
                c["t_dispatch"][i] = t
                c["cap_wait_ns"][i] = t - t0
                await self._send(i)
        else:
            c["t_dispatch"][i] = t0
            await self._send(i)

    async def _send(self, i: int) -> None:
        assert self.http is not None
        req = self.builder.build(self.rec.session[i] or "", i)
        self.inflight += 1
        try:
            await execute(self.http, req, self.rec, i, self.timeouts, self.phases.trace_connections)
        finally:
            self.inflight -= 1

    async def open_loop(self) -> None:
        sched = arrivals(self.load)
        n = len(sched)
        start = self.start
        cap = self.load.max_inflight
        drop = self.load.overflow == "drop"
        if cap and not drop:
            self.sem = asyncio.Semaphore(cap)
        loop = asyncio.get_running_loop()
        k = 0
        while k < n:
            now = now_ns()
            # Release every slot that is due (timers are ~1 ms granular: never one sleep per request).
            while k < n and start + sched[k] <= now:
                i = self.new_row(start + sched[k], None)
                k += 1
                if drop and cap and self.inflight + self._pending() >= cap:
                    self.rec.cols["dropped"][i] = 1
                    continue
                t = loop.create_task(self.one(i))
                self.tasks.add(t)
                t.add_done_callback(self.tasks.discard)
            if k < n:
                await asyncio.sleep(max(0.0, (start + sched[k] - now_ns()) / NS))
        while self.tasks:
            await asyncio.gather(*list(self.tasks))

    def _pending(self) -> int:
        """Tasks created but not yet sending (count against the cap for the drop policy)."""
        return len(self.tasks) - self.inflight

    async def closed_loop(self) -> None:
        ld = self.load
        end = self.start + int(ld.total_s * NS)
        limit = ld.max_requests or 0
        gap = int(NS / self.max_rate_per_s)
        reserved = [0]
        gate = [self.start]  # next instant any worker may send: keeps a closed loop under max_rate_per_s

        async def worker(w: int) -> None:
            think = think_times(ld.think, ld.think_s, ld.seed * 100_003 + w)
            t_int = self.start
            while t_int < end and (not limit or reserved[0] < limit):
                reserved[0] += 1  # count the request before sleeping, so sleeping workers cannot overshoot
                t_int = max(t_int, gate[0])
                gate[0] = t_int + gap
                delay = t_int - now_ns()
                if delay > 0:
                    await asyncio.sleep(delay / NS)
                i = self.new_row(t_int, w)
                await self.one(i)
                t_int = self.rec.cols["t_end"][i] + next(think)

        await asyncio.gather(*(worker(w) for w in range(ld.concurrency)))


async def run_load(
    target: Target,
    load: LoadSpec,
    *,
    limits: Limits | None = None,
    phases: PhasePlan | None = None,
    on_progress: ProgressFn | None = None,
    telemetry: TelemetrySink | None = None,
    credential_resolver: CredentialResolver | None = None,
    timeouts: Timeouts | None = None,
    openai_body: OpenAIBody | None = None,
    http_template: HttpTemplate | None = None,
    max_duration_s: float | None = None,
    thresholds: Thresholds | None = None,
    start_at_ns: int | None = None,
    process_index: int = 0,
    credential_headers: dict[str, str] | None = None,
) -> RunResult:
    """Run `load` against `target` in this event loop and return the raw records + summary.

    start_at_ns: a common CLOCK_MONOTONIC start (multi-process runs); default = now + 50 ms.
    on_progress(phase, completed, total, metrics) is called about once a second.
    telemetry: records are written to its "requests" stream after the run (one NDJSON line per request).
    """
    limits = limits or Limits()
    phases = phases or PhasePlan()
    timeouts = timeouts or Timeouts()
    effective, clamps = clamp(load, limits, max_duration_s)
    creds = (
        credential_headers
        if credential_headers is not None
        else resolve_credentials(target, credential_resolver)
    )
    builder = RequestBuilder(target, openai_body=openai_body, http=http_template, credential_headers=creds)
    run = _Run(target, effective, phases, builder, timeouts, process_index, limits.max_rate_per_s)
    conc = effective.max_inflight if effective.open_loop else effective.concurrency
    connector = aiohttp.TCPConnector(limit=max(1, conc or limits.max_concurrency), limit_per_host=0)
    trace = [make_trace_config(run.rec)] if phases.trace_connections else None
    mon = Monitor()
    gcc = GcControl(phases.gc_control)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeouts.client_timeout(), trace_configs=trace, auto_decompress=False
    ) as http:
        run.http = http
        gcc.before_start()
        mon.start()
        run.start = start_at_ns if start_at_ns is not None else now_ns() + 50_000_000
        wall_epoch = time.time_ns() + (run.start - now_ns())
        ticker = asyncio.create_task(_phase_ticker(run, gcc, on_progress))
        try:
            if effective.open_loop:
                await run.open_loop()
            else:
                await run.closed_loop()
        finally:
            ticker.cancel()
            try:
                await ticker
            except asyncio.CancelledError:
                pass
            gcc.restore()
            await mon.stop()
    result = RunResult(
        run.rec,
        [None] * process_index + [mon],
        effective,
        load,
        clamps,
        run.start,
        wall_epoch,
        thresholds=thresholds,
    )
    if on_progress:
        on_progress("finishing", run.rec.n, run.rec.n, {})
    if telemetry is not None:
        await write_records(telemetry, run.rec)
    return result


async def write_records(telemetry: TelemetrySink, rec: Records) -> None:
    for i in range(rec.n):
        await telemetry.write("requests", rec.row(i))


async def _phase_ticker(run: _Run, gcc: GcControl, on_progress: ProgressFn | None) -> None:
    """GC policy at phase boundaries and ~1 Hz progress reports."""
    ld = run.load
    steady_at = run.start + int(ld.warmup_s * NS)
    steady_end = steady_at + int(ld.duration_s * NS)
    in_steady = False
    if ld.warmup_s == 0:
        gcc.enter_steady()
        in_steady = True
    total = len(arrivals(ld)) if ld.open_loop else None
    while True:
        now = now_ns()
        if not in_steady and now >= steady_at and now < steady_end:
            gcc.enter_steady()
            in_steady = True
        if in_steady and now >= steady_end:
            gcc.leave_steady()
            in_steady = False
            steady_at = 1 << 62  # never again
        if on_progress:
            t = now - run.start
            name = (
                "warmup"
                if t < ld.warmup_s * NS
                else "measuring"
                if t < (ld.warmup_s + ld.duration_s) * NS
                else "finishing"
            )
            on_progress(name, run.rec.n, total, {"inflight": float(run.inflight)})
        nxt = min(x for x in (steady_at, steady_end, now + NS) if x > now)
        await asyncio.sleep((nxt - now) / NS)


# --- several processes ------------------------------------------------------------------------------------


def split_load(load: LoadSpec, processes: int, k: int) -> LoadSpec:
    """Process k's share: rate/P with an independent seed (a superposition of Poisson streams is Poisson);
    concurrency, caps and request budgets divided with the remainder going to the first processes."""

    def share(total: int) -> int:
        return total // processes + (1 if k < total % processes else 0)

    ch: dict[str, Any] = {"seed": load.seed * 1_000_003 + 7919 * (k + 1)}
    if load.model in ("constant", "poisson"):
        ch["rate"] = load.rate / processes
    if load.model == "closed":
        ch["concurrency"] = max(1, share(load.concurrency))
    if load.model == "burst":
        ch["burst_size"] = max(1, share(load.burst_size))
    if load.max_inflight:
        ch["max_inflight"] = max(1, share(load.max_inflight))
    if load.max_requests:
        ch["max_requests"] = max(1, share(load.max_requests))
    return replace(load, **ch)


def _child(args: dict[str, Any]) -> dict[str, Any]:
    """Entry point of a worker process (spawned: imports only what it needs)."""

    async def main() -> RunResult:
        return await run_load(
            args["target"],
            args["load"],
            limits=args["limits"],
            phases=args["phases"],
            timeouts=args["timeouts"],
            openai_body=args["openai_body"],
            http_template=args["http_template"],
            start_at_ns=args["start_at_ns"],
            process_index=args["k"],
            credential_headers=args["creds"],
            thresholds=args["thresholds"],
        )

    res = _run_uvloop(main)
    return {
        "records": res.records.export(),
        "monitor": res.monitors[-1].export() if res.monitors[-1] else None,
        "epoch": res.epoch_ns,
        "wall": res.wall_epoch_ns,
        "pid": os.getpid(),
    }


def _run_uvloop(main: Callable[[], Any]) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main())
    return uvloop.run(main())


async def run_load_multiprocess(
    target: Target,
    load: LoadSpec,
    *,
    processes: int,
    limits: Limits | None = None,
    phases: PhasePlan | None = None,
    on_progress: ProgressFn | None = None,
    telemetry: TelemetrySink | None = None,
    credential_resolver: CredentialResolver | None = None,
    timeouts: Timeouts | None = None,
    openai_body: OpenAIBody | None = None,
    http_template: HttpTemplate | None = None,
    max_duration_s: float | None = None,
    thresholds: Thresholds | None = None,
    start_delay_s: float = 3.0,
) -> RunResult:
    """Run `load` split over `processes` spawned worker processes that share one CLOCK_MONOTONIC start.

    Limits apply to the total (clamped here, then divided). Records are concatenated for exact statistics,
    each process's monitor feeds the self-check (worst process wins). start_delay_s must cover process
    start-up (imports ≈ 0.5–1 s); a late process shows up as schedule lag, not as hidden error.
    """
    if processes < 1:
        raise ValueError(f"processes = {processes}: must be ≥ 1")
    limits = limits or Limits()
    phases = phases or PhasePlan()
    effective, clamps = clamp(load, limits, max_duration_s)
    creds = resolve_credentials(target, credential_resolver)  # once, here: children never see the resolver
    start = now_ns() + int(start_delay_s * NS)
    wall = time.time_ns() + (start - now_ns())
    child_limits = Limits(
        max_concurrency=max(1, math.ceil(limits.max_concurrency / processes)),
        max_rate_per_s=limits.max_rate_per_s / processes,
        max_requests=max(1, math.ceil(limits.max_requests / processes)),
    )
    jobs = [
        {
            "target": target,
            "load": split_load(effective, processes, k),
            "limits": child_limits,
            "phases": phases,
            "timeouts": timeouts or Timeouts(),
            "openai_body": openai_body,
            "http_template": http_template,
            "start_at_ns": start,
            "k": k,
            "creds": creds,
            "thresholds": thresholds,
        }
        for k in range(processes)
    ]
    if load.model == "constant":
        # Interleave the per-process grids: process k is offset by k/rate (of the total), so the union of
        # P grids at rate/P is the asked constant grid.
        for k, j in enumerate(jobs):
            j["start_at_ns"] = start + int(k * NS / effective.rate)
    import multiprocessing

    loop = asyncio.get_running_loop()
    if on_progress:
        on_progress("starting", 0, None, {"processes": float(processes)})
    with ProcessPoolExecutor(max_workers=processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        parts = await asyncio.gather(*(loop.run_in_executor(pool, _child, j) for j in jobs))
    records = Records.concat([p["records"] for p in parts])
    monitors: list[Monitor | None] = [
        Monitor.from_export(p["monitor"]) if p["monitor"] else None for p in parts
    ]
    result = RunResult(
        records,
        monitors,
        effective,
        load,
        clamps,
        start,
        wall,
        processes=processes,
        thresholds=thresholds,
        extra={"process_pids": [p["pid"] for p in parts]},
    )
    if on_progress:
        on_progress("finishing", records.n, records.n, {})
    if telemetry is not None:
        await write_records(telemetry, records)
    return result


__all__ = ["PHASES", "PhasePlan", "RunResult", "clamp", "run_load", "run_load_multiprocess", "split_load"]
