"""Ground truth: one record per request, with server-side timestamps, in a bounded ring.

Timestamps are `time.perf_counter_ns()` (CLOCK_MONOTONIC on Linux, shared by every process on the host),
taken *after* the corresponding write returned, i.e. when the bytes were handed to the kernel. Each record
also carries the wall clock (`time.time_ns()`) read at arrival; every other wall time in the JSON view is
derived from it and the monotonic difference, so wall and monotonic views never disagree.
"""

from __future__ import annotations

import itertools
from array import array
from collections import deque
from typing import Any

# Monotonic timestamp fields rendered with a `_wall_ns` twin in the JSON view.
_TIMES = ("arrival", "ready", "headers", "first_token", "last_token", "end", "disconnect")


class RequestRecord:
    __slots__ = (
        "seq", "index", "request_id", "session_id", "path", "stream", "cold_start", "status", "outcome",
        "error", "arrival_wall_ns", "arrival_ns", "ready_ns", "headers_ns", "token_ns", "first_token_ns",
        "last_token_ns", "end_ns", "disconnect_ns", "tokens_planned", "tokens_sent", "planned_first_token_ns",
        "planned_end_ns", "held_ns", "stall_ns", "prompt_tokens", "retry_after", "tool",
    )  # fmt: skip

    def __init__(self, index: int, request_id: str, arrival_wall_ns: int, arrival_ns: int, path: str):
        self.seq = 0  # assigned when the record is completed (paging order)
        self.index = index  # 1-based request number since the last reset (failure/stall selectors)
        self.request_id = request_id
        self.session_id: str | None = None
        self.path = path
        self.stream = False
        self.cold_start = False
        self.status = 0
        self.outcome = "in_flight"
        self.error: str | None = None
        self.arrival_wall_ns = arrival_wall_ns
        self.arrival_ns = arrival_ns
        self.ready_ns: int | None = None
        self.headers_ns: int | None = None
        self.token_ns: array[int] | None = None
        self.first_token_ns: int | None = None
        self.last_token_ns: int | None = None
        self.end_ns: int | None = None
        self.disconnect_ns: int | None = None
        self.tokens_planned = 0
        self.tokens_sent = 0
        self.planned_first_token_ns: int | None = None
        self.planned_end_ns: int | None = None
        self.held_ns = 0  # total delay added by server-wide stall windows
        self.stall_ns = 0  # per-request stall injected
        self.prompt_tokens = 0
        self.retry_after: str | None = None
        self.tool: dict[str, Any] | None = None  # the built-in agent's tool-call result, if it ran one

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "seq": self.seq,
            "index": self.index,
            "request_id": self.request_id,
            "session_id": self.session_id,
            "path": self.path,
            "stream": self.stream,
            "cold_start": self.cold_start,
            "status": self.status,
            "outcome": self.outcome,
            "error": self.error,
            "tokens_planned": self.tokens_planned,
            "tokens_sent": self.tokens_sent,
            "prompt_tokens": self.prompt_tokens,
            "held_ns": self.held_ns,
            "stall_ns": self.stall_ns,
            "retry_after": self.retry_after,
            "tool": self.tool,
            "planned_first_token_ns": self.planned_first_token_ns,
            "planned_end_ns": self.planned_end_ns,
        }
        base_wall, base = self.arrival_wall_ns, self.arrival_ns
        for name in _TIMES:
            t = getattr(self, name + "_ns")
            d[name + "_ns"] = t
            d[name + "_wall_ns"] = None if t is None else base_wall + (t - base)
        d["token_ns"] = None if self.token_ns is None else self.token_ns.tolist()
        first = self.first_token_ns
        d["ttft_ns"] = None if first is None else first - base
        return d


class RecordRing:
    """Completed records, oldest first, at most `capacity`; plus the ones still in flight."""

    def __init__(self, capacity: int):
        self.done: deque[RequestRecord] = deque(maxlen=capacity)
        self.in_flight: dict[str, RequestRecord] = {}
        self.seq = 0

    def start(self, rec: RequestRecord) -> None:
        self.in_flight[rec.request_id] = rec

    def finish(self, rec: RequestRecord) -> None:
        self.in_flight.pop(rec.request_id, None)
        self.seq += 1
        rec.seq = self.seq
        self.done.append(rec)

    def since(self, seq: int, limit: int) -> tuple[list[RequestRecord], int]:
        """Completed records with seq > `seq` (up to `limit`), and how many such were already evicted."""
        if not self.done:
            return [], 0
        first = self.done[0].seq
        skip = max(0, seq - first + 1)
        lost = max(0, first - seq - 1)
        return list(itertools.islice(self.done, skip, skip + limit)), lost

    def find(self, request_id: str) -> RequestRecord | None:
        rec = self.in_flight.get(request_id)
        if rec is not None:
            return rec
        for rec in reversed(self.done):
            if rec.request_id == request_id:
                return rec
        return None

    def resize(self, capacity: int) -> None:
        if capacity != self.done.maxlen:
            self.done = deque(self.done, maxlen=capacity)
