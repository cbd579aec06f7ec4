"""Watch the generator itself: event-loop lag (5 ms probe), CPU share per second, GC pauses; and control
the GC around measurement windows. Samples are kept raw (arrays) so self-checks can cut them per window."""

from __future__ import annotations

import asyncio
import gc
import time
from array import array
from bisect import bisect_left
from typing import Any

now_ns = time.perf_counter_ns
LAG_PROBE_S = 0.005


class Monitor:
    def __init__(self, *, lag_probe_s: float = LAG_PROBE_S) -> None:
        self.lag_probe_s = lag_probe_s
        self.lag_t = array("q")  # when the probe woke up
        self.lag_ns = array("q")  # how late it woke up
        self.cpu_t = array("q")  # end of each ~1 s CPU interval
        self.cpu_share = array("d")  # process CPU time / wall time over that interval
        self.gc_t = array("q")
        self.gc_ns = array("q")
        self._gc_start = 0
        self._tasks: list[asyncio.Task[Any]] = []
        self._lag_handle: asyncio.TimerHandle | None = None
        self._lag_t0 = 0

    # -- lifecycle --
    def start(self) -> None:
        gc.callbacks.append(self._on_gc)
        loop = asyncio.get_running_loop()
        self._lag_t0 = now_ns()
        self._lag_handle = loop.call_later(self.lag_probe_s, self._lag_tick, loop)
        self._tasks = [asyncio.create_task(self._cpu_loop())]

    async def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._lag_handle is not None:
            self._lag_handle.cancel()
            self._lag_handle = None
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except asyncio.CancelledError:
                pass

    # -- samplers --
    def _lag_tick(self, loop: asyncio.AbstractEventLoop) -> None:
        """The lag probe: a plain timer callback re-armed from itself — the same measurement as
        `t0 = now; await sleep(step); lag = now - t0 - step`, without a Task step and a Future per tick."""
        t1 = now_ns()
        self.lag_t.append(t1)
        lag = t1 - self._lag_t0 - round(self.lag_probe_s * 1e9)
        self.lag_ns.append(lag if lag > 0 else 0)
        self._lag_t0 = now_ns()
        self._lag_handle = loop.call_later(self.lag_probe_s, self._lag_tick, loop)

    async def _cpu_loop(self) -> None:
        w0, c0 = now_ns(), time.process_time_ns()
        while True:
            await asyncio.sleep(1.0)
            w1, c1 = now_ns(), time.process_time_ns()
            self.cpu_t.append(w1)
            # process_time covers all threads of the process; in tests the localcloud server thread shares
            # it, so the share is an upper bound for the generator there.
            self.cpu_share.append((c1 - c0) / max(1, w1 - w0))
            w0, c0 = w1, c1

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = now_ns()
        elif self._gc_start:
            t = now_ns()
            self.gc_t.append(t)
            self.gc_ns.append(t - self._gc_start)
            self._gc_start = 0

    # -- queries (pure over the samples) --
    def window(self, t0: int, t1: int) -> dict[str, Any]:
        """Samples whose timestamp falls in [t0, t1)."""

        # Timestamps are appended in order, so a window is a slice (bisect), not a scan.
        def cut(ts: array, vs: array, a: int, b: int) -> list[Any]:
            return list(vs[bisect_left(ts, a) : bisect_left(ts, b)])

        # A CPU sample stamped at t covers the second before t: it belongs to the window it mostly overlaps.
        half = 500_000_000
        return {
            "lag_ns": cut(self.lag_t, self.lag_ns, t0, t1),
            "cpu": cut(self.cpu_t, self.cpu_share, t0 + half, t1 + half),
            "gc_ns": cut(self.gc_t, self.gc_ns, t0, t1),
        }

    def export(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("lag_t", "lag_ns", "cpu_t", "cpu_share", "gc_t", "gc_ns")}

    @classmethod
    def from_export(cls, d: dict[str, Any]) -> Monitor:
        m = cls()
        for k, v in d.items():
            setattr(m, k, v)
        return m


class GcControl:
    """GC policy of a run (load_anchors §2.5). A full collection of a big heap takes 10-150 ms, so it is
    never done while requests are in flight: collect + freeze once before the first slot (the frozen
    heap is never scanned again), disable inside the steady window, re-enable after it (young objects are
    then collected normally), unfreeze and restore the caller's state at the end."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._was_enabled = gc.isenabled()

    def before_start(self) -> None:
        if self.enabled:
            gc.collect()
            gc.freeze()

    def enter_steady(self) -> None:
        if self.enabled:
            gc.disable()

    def leave_steady(self) -> None:
        if self.enabled:
            gc.enable()

    def restore(self) -> None:
        if self.enabled:
            gc.unfreeze()
            if self._was_enabled:
                gc.enable()
            else:
                gc.disable()
