"""Session affinity state: which sessions are warm, and until when.

A session is created cold by its first request, which pays the cold start; concurrent requests of the
same session arriving during that cold start wait for the same instance (they are not cold themselves,
but their wait is recorded). A session with nothing in flight for longer than the idle timeout is
recycled: its next request is cold again. That is what warm_retention and idle_timeout_honor probe.
All times are monotonic ns passed in by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Session:
    ready_ns: int  # when the instance finished (or will finish) its cold start
    last_end_ns: int  # when the last request finished (idle clock starts here)
    in_flight: int = 0
    requests: int = 0


class SessionTable:
    def __init__(self, idle_timeout_ns: int, max_sessions: int):
        self.idle_timeout_ns = idle_timeout_ns
        self.max_sessions = max_sessions
        self.sessions: dict[str, Session] = {}
        self.recycled = 0  # sessions dropped for idleness (on lookup or sweep)
        self.evicted = (
            0  # sessions dropped for capacity before their idle timeout (their next request is cold)
        )

    def begin(self, sid: str, now: int, cold_ns: int) -> tuple[bool, int]:
        """Admit a request of session `sid` at `now`. Returns (cold, ready_ns): when this request may
        start, i.e. `now` for a warm session, or the end of the session's (possibly shared) cold start.

        `cold_ns` is this request's cold-start duration should it turn out to be the first of its
        session (sampled by the caller so the timing rng stays deterministic per request)."""
        s = self.sessions.get(sid)
        if s is not None and s.in_flight == 0 and now - s.last_end_ns > self.idle_timeout_ns:
            del self.sessions[sid]
            self.recycled += 1
            s = None
        if s is None:
            if len(self.sessions) >= self.max_sessions:
                # Make room for a tenth of the capacity at once, so the O(n log n) sweep is amortised.
                self.sweep(now, keep=self.max_sessions - max(1, self.max_sessions // 10))
            s = Session(ready_ns=now + cold_ns, last_end_ns=now)
            self.sessions[sid] = s
            cold = True
        else:
            cold = False
        s.in_flight += 1
        s.requests += 1
        return cold, max(now, s.ready_ns)

    def end(self, sid: str, now: int) -> None:
        s = self.sessions.get(sid)
        if s is None:
            return
        s.in_flight -= 1
        if now > s.last_end_ns:
            s.last_end_ns = now

    def sweep(self, now: int, keep: int | None = None) -> int:
        """Drop idle-expired sessions; then, if more than `keep` remain, the longest-idle ones."""
        timeout = self.idle_timeout_ns
        dead = [k for k, s in self.sessions.items() if s.in_flight == 0 and now - s.last_end_ns > timeout]
        for k in dead:
            del self.sessions[k]
        self.recycled += len(dead)
        excess = len(self.sessions) - (self.max_sessions if keep is None else keep)
        if excess > 0:
            idle = sorted((s.last_end_ns, k) for k, s in self.sessions.items() if s.in_flight == 0)
            for _, k in idle[:excess]:
                del self.sessions[k]
            self.evicted += min(excess, len(idle))
        return len(dead)
