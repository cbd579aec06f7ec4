"""Bench registry: name -> function returning Figures. Each module registers its own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    name: str
    value: float
    unit: str
    note: str = ""


BENCHES: dict[str, Callable[[], list[Figure]]] = {}


def bench(name: str) -> Callable[[Callable[[], list[Figure]]], Callable[[], list[Figure]]]:
    def register(func: Callable[[], list[Figure]]) -> Callable[[], list[Figure]]:
        BENCHES[name] = func
        return func

    return register


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (q in 0..100)."""
    if not sorted_values:
        raise ValueError("percentile of no samples")
    rank = max(1, min(len(sorted_values), round(q / 100 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


from benches import engine_cpu, localcloud, measurement, protocol  # noqa: E402,F401  (registers)
