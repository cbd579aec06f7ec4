"""Mutable state of one AgentRun-like target, and the hot-path compilation of its config."""

from __future__ import annotations

import os
import random
import time
from typing import Any

import aiohttp
from aiohttp import web

from csbench.localcloud.agentrun.config import AgentRunConfig, merge_patch, parse_config
from csbench.localcloud.agentrun.limits import Ceiling, TokenBucket
from csbench.localcloud.agentrun.records import RecordRing, RequestRecord
from csbench.localcloud.agentrun.sessions import SessionTable
from csbench.localcloud.agentrun.timing import NS, compile_dist, windows_ns
from csbench.localcloud.agentrun.wire import Codec

perf_ns = time.perf_counter_ns


class Runtime:
    """A validated config compiled for the hot path. Immutable: a reconfiguration builds a new one, and
    requests already in flight finish with the Runtime they started with."""

    def __init__(self, cfg: AgentRunConfig, raw: dict[str, Any], epoch_ns: int):
        self.cfg, self.raw, self.epoch_ns = cfg, raw, epoch_ns
        self.ttft = compile_dist(cfg.ttft)
        self.gap = compile_dist(cfg.inter_token)
        self.cold = compile_dist(cfg.cold_start)
        self.windows = windows_ns(cfg.stall_windows, epoch_ns)
        self.failures = tuple((frozenset(f.requests), f) for f in cfg.failures)
        self.stalls = tuple((frozenset(s.requests), s) for s in cfg.stalls)
        self.codec = Codec(cfg.model)
        self.auth = None if cfg.api_key is None else f"Bearer {cfg.api_key}".encode()
        self.session_header = cfg.session_header


class AgentRunState:
    """Everything mutable about one target: current Runtime, sessions, limiter, counters, records."""

    rt: Runtime  # the current compiled config; replaced, never mutated

    def __init__(self, raw: dict[str, Any]):
        self.boot = os.urandom(3).hex()  # keeps request ids unique across restarts of the target
        self.next_id = 0
        self.ring = RecordRing(1)
        self.ceiling = Ceiling(None)  # survives resets: requests in flight still leave it
        self.bucket: TokenBucket | None = None
        self._http: aiohttp.ClientSession | None = None
        self.apply(raw, reset=True)

    def apply(self, raw: dict[str, Any], *, reset: bool) -> Runtime:
        """Install a full config document (validated). `reset` also clears sessions, records, counters."""
        cfg = parse_config(raw)
        now = perf_ns()
        old: Runtime | None = self.__dict__.get("rt")  # None only on the first apply
        # Stall windows are relative to when they were configured, so keep the epoch unless they changed.
        keep_epoch = old is not None and not reset and old.cfg.stall_windows == cfg.stall_windows
        rt = Runtime(cfg, raw, old.epoch_ns if keep_epoch and old else now)
        if reset:
            self.rng = random.Random(cfg.seed)
            self.sessions = SessionTable(int(cfg.session_idle_timeout_s * NS), cfg.max_sessions)
            seq = self.ring.seq
            in_flight = self.ring.in_flight
            self.ring = RecordRing(cfg.records_capacity)
            self.ring.seq, self.ring.in_flight = seq, in_flight  # paging stays monotonic across resets
            self.index = 0
            self.outcomes: dict[str, int] = {}
            self.ceiling.peak = self.ceiling.in_flight
        else:
            if old is not None and old.cfg.seed != cfg.seed:
                self.rng = random.Random(cfg.seed)
            self.sessions.idle_timeout_ns = int(cfg.session_idle_timeout_s * NS)
            self.sessions.max_sessions = cfg.max_sessions
            self.ring.resize(cfg.records_capacity)
        self.ceiling.limit = cfg.max_concurrency
        if cfg.rate_limit_rps is None:
            self.bucket = None
        elif reset or old is None or (old.cfg.rate_limit_rps, old.cfg.rate_limit_burst) != (
            cfg.rate_limit_rps, cfg.rate_limit_burst,
        ):  # fmt: skip
            burst = cfg.rate_limit_burst or max(1.0, cfg.rate_limit_rps)
            self.bucket = TokenBucket(cfg.rate_limit_rps, burst, now / NS)
        self.rt = rt
        return rt

    def http(self) -> aiohttp.ClientSession:
        """The agent's HTTP client for tool calls, created on first use (inside the running loop)."""
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession()
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()

    def patch(self, patch: dict[str, Any]) -> Runtime:
        return self.apply(merge_patch(self.rt.raw, patch), reset=False)

    def finish(self, rec: RequestRecord) -> None:
        if rec.end_ns is None:
            rec.end_ns = perf_ns()
        if rec.outcome == "in_flight":  # left by a bug or a cancelled handler: never report it as live
            rec.outcome = "error"
        self.outcomes[rec.outcome] = self.outcomes.get(rec.outcome, 0) + 1
        self.ring.finish(rec)


STATE_KEY = web.AppKey("agentrun_state", AgentRunState)
