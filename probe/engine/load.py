"""Load models as pure schedule generators (no clock, no I/O), plus the LoadSpec parameter model.

Open loop: `arrivals(spec)` gives every intended send time (ns offsets from the run start) up front, so
the dispatcher only releases due slots. Closed loop: each worker's next intended time is its previous
completion + think time (`think_times`). Sweeps are a list of LoadSpecs run one after another
(`sweep_steps`, `sweep_should_stop`).
"""

from __future__ import annotations

import math
import random
from array import array
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

NS = 1_000_000_000
MODELS = ("closed", "constant", "poisson", "burst")


@dataclass(frozen=True)
class LoadSpec:
    """One load model with its phases. Times in seconds.

    model: closed (concurrency workers) | constant / poisson (rate per s) | burst (burst_size starts at
    once, `bursts` times, `burst_interval_s` apart). warmup_s, duration_s (the steady window) and
    cooldown_s run back to back; load is applied through all three, statistics use the steady window.
    """

    model: str = "poisson"
    rate: float = 10.0
    concurrency: int = 1
    duration_s: float = 10.0
    warmup_s: float = 0.0
    cooldown_s: float = 0.0
    seed: int = 0
    think: str = "constant"  # closed loop: constant | exponential
    think_s: float = 0.0
    max_inflight: int | None = None  # open loop cap
    overflow: str = "queue"  # queue (wait for a slot; counted in queue_delay) | drop (count a dropped slot)
    burst_size: int = 1
    bursts: int = 1
    burst_interval_s: float = 1.0
    max_requests: int | None = None  # stop issuing after this many

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"load model {self.model!r}: expected one of {', '.join(MODELS)}")
        if self.think not in ("constant", "exponential"):
            raise ValueError(f"think {self.think!r}: expected constant or exponential")
        if self.overflow not in ("queue", "drop"):
            raise ValueError(f"overflow {self.overflow!r}: expected queue or drop")
        for name in ("duration_s", "warmup_s", "cooldown_s", "think_s", "burst_interval_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} = {getattr(self, name)}: must be ≥ 0")
        if self.model in ("constant", "poisson") and self.rate <= 0:
            raise ValueError(f"rate = {self.rate}: must be > 0 for an open loop")
        if self.concurrency < 1 or self.burst_size < 1 or self.bursts < 1:
            raise ValueError("concurrency, burst_size and bursts must be ≥ 1")

    @classmethod
    def from_params(cls, p: Mapping[str, Any]) -> LoadSpec:
        known = set(cls.__dataclass_fields__)
        unknown = set(p) - known
        if unknown:
            raise ValueError(f"load: unknown keys {sorted(unknown)} (known: {sorted(known)})")
        return cls(**dict(p))

    @property
    def total_s(self) -> float:
        return self.warmup_s + self.duration_s + self.cooldown_s

    @property
    def open_loop(self) -> bool:
        return self.model != "closed"

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def constant_arrivals(rate: float, duration_s: float) -> array:
    """Evenly spaced: slot k at k/rate, for k/rate < duration."""
    n = math.ceil(rate * duration_s - 1e-9)
    return array("q", (round(k * NS / rate) for k in range(max(0, n))))


def poisson_arrivals(rate: float, duration_s: float, seed: int) -> array:
    """Exponential gaps from random.Random(seed) (the first arrival one gap after 0)."""
    rng = random.Random(seed)
    end = duration_s * NS
    out = array("q")
    t = 0.0
    mean_gap = NS / rate
    while True:
        t += rng.expovariate(1.0) * mean_gap
        if t >= end:
            return out
        out.append(round(t))


def burst_arrivals(size: int, bursts: int, interval_s: float) -> array:
    return array("q", (round(b * interval_s * NS) for b in range(bursts) for _ in range(size)))


def arrivals(spec: LoadSpec) -> array:
    """Every intended send time of an open-loop spec, ns from the run start, sorted, capped by max_requests."""
    if spec.model == "constant":
        out = constant_arrivals(spec.rate, spec.total_s)
    elif spec.model == "poisson":
        out = poisson_arrivals(spec.rate, spec.total_s, spec.seed)
    elif spec.model == "burst":
        out = burst_arrivals(spec.burst_size, spec.bursts, spec.burst_interval_s)
    else:
        raise ValueError("a closed loop has no precomputed arrivals")
    if spec.max_requests is not None and len(out) > spec.max_requests:
        out = out[: spec.max_requests]
    return out


def think_times(kind: str, mean_s: float, seed: int) -> Iterator[int]:
    """Think times in ns for one closed-loop worker (seeded per worker)."""
    if mean_s <= 0:
        while True:
            yield 0
    rng = random.Random(seed)
    while True:
        yield round((rng.expovariate(1.0 / mean_s) if kind == "exponential" else mean_s) * NS)


def phase_of(offset_ns: int, spec: LoadSpec) -> int:
    """0 warmup, 1 steady, 2 cooldown — by intended time (requests intended in the window belong to it)."""
    if offset_ns < spec.warmup_s * NS:
        return 0
    if offset_ns < (spec.warmup_s + spec.duration_s) * NS:
        return 1
    return 2


def realized_rate(offsets: array, window_s: float) -> float:
    return len(offsets) / window_s if window_s > 0 else 0.0


@dataclass(frozen=True)
class Sweep:
    """Steps of rate (open loop) or concurrency (closed loop), each a full LoadSpec with its own phases."""

    base: LoadSpec
    values: tuple[float, ...]
    stop_error_fraction: float = 0.05  # stop after a step whose (errors + 429s) / sent exceeds this
    stop_429_fraction: float | None = None  # separate 429 threshold (None: counted in the error fraction)
    extra: Mapping[str, Any] = field(default_factory=dict)


def sweep_steps(sweep: Sweep) -> list[LoadSpec]:
    """The LoadSpec of every step; seeds differ per step so steps are independent but reproducible."""
    out = []
    for k, v in enumerate(sweep.values):
        if sweep.base.model == "closed":
            out.append(replace(sweep.base, concurrency=int(v), seed=sweep.base.seed + k))
        else:
            out.append(replace(sweep.base, rate=float(v), seed=sweep.base.seed + k))
    return out


def sweep_should_stop(counts: Mapping[str, Any], sweep: Sweep) -> str | None:
    """Early stop rule on a step's summary counts; returns the reason or None to go on."""
    sent = counts.get("sent", 0)
    if not sent:
        return None
    errors = counts.get("errors", {})
    n429 = errors.get("http_429", 0)
    total = sum(errors.values())
    if sweep.stop_429_fraction is not None:
        if n429 / sent > sweep.stop_429_fraction:
            return f"429 fraction {n429 / sent:.4f} > {sweep.stop_429_fraction}"
        total -= n429
    if total / sent > sweep.stop_error_fraction:
        return f"error fraction {total / sent:.4f} > {sweep.stop_error_fraction}"
    return None
