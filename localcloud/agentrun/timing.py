"""Timing plans: seeded samplers and the pure arithmetic of when each byte is due.

Everything is in integer nanoseconds on the CLOCK_MONOTONIC timeline (`time.perf_counter_ns()` on Linux,
the same clock as `loop.time()`), so plans, records and a same-host client's timestamps are comparable.
Deadlines are absolute and derived from the *plan*, never from when the previous write actually happened:
a late wake-up does not push every later token back (no accumulated drift).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from csbench.localcloud.agentrun.config import Dist, StallWindow

Sampler = Callable[[random.Random], float]
NS = 1_000_000_000


def compile_dist(d: Dist) -> Sampler:
    """Turn a validated Dist into a cheap closure (no attribute lookups or branching per sample)."""
    lo, hi = d.min, d.max if d.max is not None else math.inf

    def clamp(x: float) -> float:
        return lo if x < lo else hi if x > hi else x

    if d.kind == "constant":
        v = clamp(d.value)
        return lambda rng: v
    if d.kind == "uniform":
        a, b = d.low, d.high
        return lambda rng: clamp(rng.uniform(a, b))
    if d.kind == "normal":
        m, s = d.mean, d.std
        return lambda rng: clamp(rng.gauss(m, s))
    if d.kind == "exponential":
        if d.mean <= 0:
            return lambda rng: clamp(0.0)
        lam = 1.0 / d.mean
        return lambda rng: clamp(rng.expovariate(lam))
    # lognormal from the mean/std of the result: sigma² = ln(1 + s²/m²), mu = ln m − sigma²/2
    sigma2 = math.log1p((d.std / d.mean) ** 2)
    mu, sigma = math.log(d.mean) - sigma2 / 2, math.sqrt(sigma2)
    return lambda rng: clamp(rng.lognormvariate(mu, sigma))


@dataclass(frozen=True)
class Plan:
    """When one response's bytes are due, as absolute monotonic ns. `tokens[i]` is token i's deadline."""

    ready: int  # session warm (arrival + cold start wait): headers may go out
    tokens: tuple[int, ...]

    @property
    def end(self) -> int:
        return self.tokens[-1]


def plan_response(
    ready_ns: int,
    n_tokens: int,
    rng: random.Random,
    ttft: Sampler,
    gap: Sampler,
    stall_after: int | None = None,
    stall_ns: int = 0,
) -> Plan:
    """Plan a response: first token `ttft` after ready, then one `gap` sample between tokens.

    A per-request stall (`stall_after` tokens sent, then silence for `stall_ns`) shifts every later
    deadline; `stall_after=None` means the stall happens before the headers (it shifts everything).
    """
    if stall_after is None and stall_ns:
        ready_ns += stall_ns
        stall_ns = 0
    t = ready_ns + int(ttft(rng) * NS)
    out = []
    for i in range(n_tokens):
        if i:
            t += int(gap(rng) * NS)
        if stall_ns and i == stall_after:  # i tokens already sent: silence before token i
            t += stall_ns
        out.append(t)
    return Plan(ready_ns, tuple(out))


def windows_ns(windows: Sequence[StallWindow], epoch_ns: int) -> tuple[tuple[int, int], ...]:
    """Absolute [start, end) of each stall window, sorted, for `hold`."""
    return tuple(
        sorted(
            (epoch_ns + int(w.start_s * NS), epoch_ns + int((w.start_s + w.duration_s) * NS)) for w in windows
        )
    )


def hold(t_ns: int, windows: Sequence[tuple[int, int]]) -> int:
    """A send planned inside a server-wide stall window is held until the window ends."""
    for start, end in windows:
        if start <= t_ns < end:
            t_ns = end
    return t_ns


def choose(index: int, numbers: Collection[int], probability: float, rng: random.Random) -> bool:
    """Whether request number `index` (1-based since reset) is selected by an injection rule.

    The rng is only drawn when a probability is set, so adding a deterministic rule never changes the
    random stream the timing samplers see."""
    if index in numbers:
        return True
    return probability > 0 and rng.random() < probability
