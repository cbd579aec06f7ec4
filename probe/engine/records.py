"""Per-request records as columns (array('q') / array('b')), not one object per request.

Why: at 1,000+ req/s a run keeps millions of values; arrays cost 8 bytes a value, are invisible to the
cyclic GC (no pause growth) and pickle cheaply between processes. Timestamps are absolute
`perf_counter_ns()` values (CLOCK_MONOTONIC, shared by every process on the host); 0 means "did not happen".
"""

from __future__ import annotations

from array import array
from typing import Any

# int64 columns: timestamps (ns) and counters.
TIME_COLS = (
    "t_intended",
    "t_dispatch",
    "t_send",
    "t_resp_headers",
    "t_first_byte",
    "t_first_event",
    "t_first_token",
    "t_first_content",
    "t_last_token",
    "t_end",
)
INT_COLS = (
    "cap_wait_ns",
    "status",
    "n_events",
    "n_token_events",
    "output_tokens",
    "max_gap_ns",
    "retry_after_ms",
    "bytes_in",
)
# int8 columns: codes.
CODE_COLS = ("phase", "error", "token_source", "new_session", "conn_reused", "process", "dropped")

PHASES = ("warmup", "steady", "cooldown", "cold")
P_WARMUP, P_STEADY, P_COOLDOWN, P_COLD = range(4)
ERRORS = (
    "",
    "http_4xx",
    "http_429",
    "http_5xx",
    "connect_timeout",
    "ttft_timeout",
    "idle_timeout",
    "total_timeout",
    "transport",
    "truncated",
    "protocol",
    "stream_error",
    "client",
)
E_NONE = 0
ERROR_CODE = {name: i for i, name in enumerate(ERRORS)}
TOKEN_SOURCES = ("", "usage", "events")


class Records:
    """Columnar store with capacity preallocated (grown by doubling if a closed loop outruns it)."""

    def __init__(self, capacity: int = 1024) -> None:
        capacity = max(1, capacity)
        self.n = 0
        self.capacity = capacity
        self.cols: dict[str, array] = {}
        for name in TIME_COLS + INT_COLS:
            self.cols[name] = array("q", bytes(8 * capacity))
        for name in CODE_COLS:
            self.cols[name] = array("b", bytes(capacity))
        self.cols["conn_reused"] = array("b", [-1]) * capacity  # -1 = unknown (tracing off)
        self.session: list[str | None] = [None] * capacity
        self.server_id: list[str | None] = [None] * capacity
        self.detail: dict[int, str] = {}  # sparse: error detail text for failed requests
        # Pooled gaps between consecutive token events (ITL_event), tagged with the request index.
        self.gap_req = array("q")
        self.gap_ns = array("q")

    def __getattr__(self, name: str) -> array:
        try:
            return self.__dict__["cols"][name]
        except KeyError:
            raise AttributeError(name) from None

    def add(self) -> int:
        """Reserve the next row; returns its index."""
        if self.n == self.capacity:
            self._grow()
        i = self.n
        self.n += 1
        return i

    def _grow(self) -> None:
        extra = self.capacity
        for name, col in self.cols.items():
            col.extend(array(col.typecode, [-1 if name == "conn_reused" else 0]) * extra)
        self.session.extend([None] * extra)
        self.server_id.extend([None] * extra)
        self.capacity += extra

    def row(self, i: int) -> dict[str, Any]:
        """One record as a JSON-able dict (the telemetry `requests` stream). No headers, no credentials."""
        c = self.cols
        out: dict[str, Any] = {
            "i": i,
            "process": c["process"][i],
            "phase": PHASES[c["phase"][i]],
            "session_id": self.session[i],
            "new_session": bool(c["new_session"][i]),
        }
        for name in TIME_COLS:
            v = c[name][i]
            out[name] = v or None
        for name in INT_COLS:
            out[name] = c[name][i]
        out["error_class"] = ERRORS[c["error"][i]] or None
        out["dropped"] = bool(c["dropped"][i])
        out["token_source"] = TOKEN_SOURCES[c["token_source"][i]] or None
        cr = c["conn_reused"][i]
        out["conn_reused"] = None if cr < 0 else bool(cr)
        out["server_request_id"] = self.server_id[i]
        if i in self.detail:
            out["error_detail"] = self.detail[i]
        return out

    def export(self) -> dict[str, Any]:
        """Trimmed columns for pickling across processes."""
        n = self.n
        return {
            "n": n,
            "cols": {k: v[:n] for k, v in self.cols.items()},
            "session": self.session[:n],
            "server_id": self.server_id[:n],
            "detail": dict(self.detail),
            "gap_req": self.gap_req,
            "gap_ns": self.gap_ns,
        }

    @classmethod
    def concat(cls, parts: list[dict[str, Any]]) -> Records:
        """Merge exported parts (one per process) into one store; request indexes are renumbered."""
        total = sum(p["n"] for p in parts)
        r = cls(total)
        for name, col in r.cols.items():
            merged = array(col.typecode)
            for p in parts:
                merged.extend(p["cols"][name])
            r.cols[name] = merged
        r.session, r.server_id = [], []
        offset = 0
        for p in parts:
            r.session.extend(p["session"])
            r.server_id.extend(p["server_id"])
            r.detail.update({k + offset: v for k, v in p["detail"].items()})
            r.gap_req.extend(x + offset for x in p["gap_req"])
            r.gap_ns.extend(p["gap_ns"])
            offset += p["n"]
        r.n = r.capacity = total
        return r
