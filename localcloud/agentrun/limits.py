"""Admission decisions: a token-bucket request rate and a ceiling on requests in flight.

Both are plain objects fed the current monotonic time, so the decisions are unit-testable without a
server or a clock. They are separate knobs because platforms enforce them separately and a probe must be
able to tell which one it hit (`rate_limit` vs `concurrency_ceiling`).
"""

from __future__ import annotations

import math
from email.utils import formatdate


class TokenBucket:
    """`rate` tokens per second, at most `burst` stored; one request takes one token."""

    __slots__ = ("rate", "burst", "tokens", "t")

    def __init__(self, rate: float, burst: float, now: float):
        self.rate, self.burst = rate, burst
        self.tokens, self.t = burst, now  # start full, as a fresh platform quota would

    def take(self, now: float) -> float:
        """Take a token if one is available: return 0.0. Otherwise return seconds until one will be."""
        if now > self.t:
            self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
            self.t = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


class Ceiling:
    """Concurrent in-flight requests; `limit` None = unlimited (still counted, for the stats)."""

    __slots__ = ("limit", "in_flight", "peak")

    def __init__(self, limit: int | None):
        self.limit, self.in_flight, self.peak = limit, 0, 0

    def enter(self) -> bool:
        if self.limit is not None and self.in_flight >= self.limit:
            return False
        self.in_flight += 1
        if self.in_flight > self.peak:
            self.peak = self.in_flight
        return True

    def leave(self) -> None:
        self.in_flight -= 1


def retry_after_value(wait_s: float, form: str, wall_now: float) -> str:
    """Retry-After as delay-seconds (whole, at least 1, rounded up) or as an IMF-fixdate HTTP-date."""
    secs = max(1, math.ceil(wait_s - 1e-9))
    if form == "http-date":
        # An HTTP-date has 1 s resolution; round the target instant up so a client never retries early.
        return formatdate(math.ceil(wall_now + secs), usegmt=True)
    return str(secs)
