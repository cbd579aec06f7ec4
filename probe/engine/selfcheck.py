"""Is the generator trustworthy? load_anchors.md §4.7 as pure functions over one window's signals.

Each rule returns a level (0 valid, 1 warn, 2 invalid) and, when not valid, a reason naming the signal,
its value and the threshold it crossed. A window's verdict is its worst rule; a run's is its worst steady
window (and, with several processes, the worst process).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

VERDICTS = ("valid", "warn", "invalid")
LATE_MS = 2.0  # a send more than this behind its intended time is "late" (1 ms timer granularity + margin)
# Below these counts a p99 is just the max of a handful of samples (and Little's law is rounding noise):
# the rule then judges what the samples can support instead of inventing an "invalid".
MIN_LAG_SAMPLES_FOR_P99 = 50
MIN_COMPLETIONS_FOR_LITTLE = 30


@dataclass(frozen=True)
class Thresholds:
    sched_p99_pass_ms: float = 2.0
    sched_late_pass_frac: float = 0.01
    sched_p99_warn_ms: float = 10.0
    sched_warn_frac_of_ttft: float = 0.02  # …or p99 ≤ 2 % of TTFT p50 (long TTFTs tolerate more lag)
    rate_pass: float = 0.99
    rate_warn: float = 0.97
    dropped_fail_frac: float = 0.001
    loop_p99_pass_ms: float = 2.0
    loop_max_pass_ms: float = 20.0
    loop_p99_warn_ms: float = 5.0
    loop_max_fail_ms: float = 100.0
    cpu_pass: float = 0.60
    cpu_warn: float = 0.75
    gc_pause_warn_ms: float = 5.0  # GC pauses also show as loop lag; this names the cause
    little_pass: float = 0.05
    little_warn: float = 0.10


@dataclass
class WindowSignals:
    """Everything the rules look at, for one window (None = not measured / not applicable)."""

    sched_lag_p99_ms: float | None = None
    late_fraction: float | None = None
    ttft_p50_ms: float | None = None
    offered: int = 0  # slots intended in the window
    sent: int = 0  # sends that happened in the window
    dropped: int = 0
    loop_lag_p99_ms: float | None = None
    loop_lag_max_ms: float | None = None
    loop_lag_samples: int | None = None  # None = unknown (treated as enough)
    cpu_share: float | None = None  # max per-second share in the window
    gc_pause_max_ms: float | None = None
    client_errors: int = 0
    little_deviation: float | None = None  # closed loop: |X·cycle / N − 1|
    little_completions: int | None = None  # completions the deviation was computed from


Rule = tuple[int, str | None]


def check_sched_lag(s: WindowSignals, th: Thresholds) -> Rule:
    p99, late = s.sched_lag_p99_ms, s.late_fraction
    if p99 is None:
        return 0, None
    if p99 <= th.sched_p99_pass_ms and (late or 0) <= th.sched_late_pass_frac:
        return 0, None
    ttft_room = th.sched_warn_frac_of_ttft * s.ttft_p50_ms if s.ttft_p50_ms else 0.0
    limit = max(th.sched_p99_warn_ms, ttft_room)
    what = (
        f"schedule lag p99 {p99:.2f} ms, {100 * (late or 0):.2f} % of sends > {LATE_MS} ms late "
        f"(valid: p99 ≤ {th.sched_p99_pass_ms} ms and ≤ {100 * th.sched_late_pass_frac:g} % late"
    )
    if p99 <= limit:
        return 1, what + f"; warn up to {limit:.2f} ms)"
    return 2, what + f"; invalid above {limit:.2f} ms)"


def check_rate(s: WindowSignals, th: Thresholds) -> Rule:
    if s.offered <= 0:
        return 0, None
    if s.dropped / s.offered > th.dropped_fail_frac:
        return 2, (
            f"dropped slots {s.dropped}/{s.offered} = {100 * s.dropped / s.offered:.2f} % "
            f"(invalid above {100 * th.dropped_fail_frac:g} %)"
        )
    ratio = s.sent / s.offered
    if ratio >= th.rate_pass:
        return 0, None
    what = f"achieved/offered send rate {ratio:.3f} ({s.sent}/{s.offered})"
    if ratio >= th.rate_warn:
        return 1, what + f" (valid ≥ {th.rate_pass}, warn ≥ {th.rate_warn})"
    return 2, what + f" (invalid below {th.rate_warn})"


def check_loop_lag(s: WindowSignals, th: Thresholds) -> Rule:
    p99, mx = s.loop_lag_p99_ms, s.loop_lag_max_ms
    n = s.loop_lag_samples
    if mx is not None and n is not None and n < MIN_LAG_SAMPLES_FOR_P99:
        # Too few probes for a p99: judge the worst observed lag against the p99 limits (stricter than max's).
        what = f"event-loop lag max {mx:.2f} ms over only {n} probes (p99 needs ≥ {MIN_LAG_SAMPLES_FOR_P99})"
        if mx <= th.loop_p99_pass_ms:
            return 0, None
        if mx <= th.loop_p99_warn_ms:
            return 1, what + f" (valid ≤ {th.loop_p99_pass_ms} ms, warn ≤ {th.loop_p99_warn_ms} ms)"
        if mx <= th.loop_max_fail_ms:
            return 1, what + f" (above {th.loop_p99_warn_ms} ms, but too few probes to call the window invalid)"
        return 2, what + f" (invalid: > {th.loop_max_fail_ms} ms)"
    if p99 is None or mx is None:
        return 0, None
    if p99 <= th.loop_p99_pass_ms and mx <= th.loop_max_pass_ms:
        return 0, None
    what = f"event-loop lag p99 {p99:.2f} ms, max {mx:.2f} ms"
    if p99 <= th.loop_p99_warn_ms and mx <= th.loop_max_fail_ms:
        return 1, what + (
            f" (valid: p99 ≤ {th.loop_p99_pass_ms} ms and max ≤ {th.loop_max_pass_ms} ms; "
            f"warn: p99 ≤ {th.loop_p99_warn_ms} ms)"
        )
    return 2, what + f" (invalid: p99 > {th.loop_p99_warn_ms} ms or max > {th.loop_max_fail_ms} ms)"


def check_cpu(s: WindowSignals, th: Thresholds) -> Rule:
    c = s.cpu_share
    if c is None or c <= th.cpu_pass:
        return 0, None
    what = f"generator CPU share {100 * c:.0f} %"
    if c <= th.cpu_warn:
        return 1, what + f" (valid ≤ {100 * th.cpu_pass:.0f} %, warn ≤ {100 * th.cpu_warn:.0f} %)"
    return 2, what + f" (invalid above {100 * th.cpu_warn:.0f} %)"


def check_gc(s: WindowSignals, th: Thresholds) -> Rule:
    g = s.gc_pause_max_ms
    if g is None or g <= th.gc_pause_warn_ms:
        return 0, None
    return 1, f"GC pause max {g:.2f} ms (warn above {th.gc_pause_warn_ms} ms)"


def check_client_errors(s: WindowSignals, th: Thresholds) -> Rule:
    if s.client_errors <= 0:
        return 0, None
    return 2, f"client-side errors {s.client_errors} (any probe-side failure invalidates the window)"


def check_little(s: WindowSignals, th: Thresholds) -> Rule:
    d = s.little_deviation
    if d is None or d <= th.little_pass:
        return 0, None
    if s.little_completions is not None and s.little_completions < MIN_COMPLETIONS_FOR_LITTLE:
        return 0, None  # e.g. 7 completions in 0.6 s: the deviation is rounding, not the generator
    what = f"closed loop Little's law deviation {100 * d:.1f} % (throughput × cycle vs workers"
    if d <= th.little_warn:
        return 1, what + f"; valid ≤ {100 * th.little_pass:g} %, warn ≤ {100 * th.little_warn:g} %)"
    return 2, what + f"; invalid above {100 * th.little_warn:g} %)"


RULES = (check_sched_lag, check_rate, check_loop_lag, check_cpu, check_gc, check_client_errors, check_little)


def evaluate(s: WindowSignals, th: Thresholds | None = None) -> tuple[str, list[str]]:
    """Verdict of one window and the reasons (worst first)."""
    th = th or Thresholds()
    results = [rule(s, th) for rule in RULES]
    level = max((lvl for lvl, _ in results), default=0)
    reasons = [f"{VERDICTS[lvl]}: {why}" for lvl, why in sorted(results, key=lambda r: -r[0]) if why]
    return VERDICTS[level], reasons


def combine(verdicts: Iterable[tuple[str, list[str]]]) -> tuple[str, list[str]]:
    """Worst verdict wins; reasons of every non-valid part are kept (deduplicated, in order)."""
    worst = 0
    reasons: list[str] = []
    for v, rs in verdicts:
        worst = max(worst, VERDICTS.index(v))
        for r in rs:
            if r not in reasons:
                reasons.append(r)
    return VERDICTS[worst], reasons


def little_deviation(workers: int, completed: int, window_s: float, mean_cycle_s: float) -> float | None:
    """|X·E[cycle] / N − 1| where X = completions/s and cycle = e2e from intended + think."""
    if workers <= 0 or window_s <= 0 or completed <= 0:
        return None
    return abs(completed / window_s * mean_cycle_s / workers - 1)


def signals_dict(s: WindowSignals) -> dict[str, Any]:
    return {k: getattr(s, k) for k in s.__dataclass_fields__}
