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
    """Nearest-rank percentile of an already sorted list (q in 0..100), as the engine defines it."""
    from csbench.probe.engine.stats import nearest_rank

    return nearest_rank(sorted_values, q / 100)


from benches import engine_cpu, localcloud, measurement, protocol  # noqa: E402,F401  (registers)
