"""Exact statistics on raw samples: nearest-rank percentiles, binomial order-statistic CIs, Wilson
intervals, and HdrHistogram export/merge (the interchange format, never the source of our percentiles)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

QUANTILES = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99, "p999": 0.999}
CI_KEYS = ("p50", "p90", "p99")
INSUFFICIENT = "insufficient"
HDR_LOW_US, HDR_HIGH_US, HDR_DIGITS = 1, 3_600_000_000, 3


def nearest_rank(sorted_values: Sequence[float], q: float) -> float:
    """The ceil(q·n)-th smallest sample (an observed value; numpy's method="inverted_cdf")."""
    if not sorted_values:
        raise ValueError("percentile of no samples")
    rank = max(1, math.ceil(q * len(sorted_values) - 1e-9))
    return sorted_values[rank - 1]


def _binom_window(n: int, q: float) -> tuple[int, list[float]]:
    """(lo, pmf[lo..hi]) over the part of Bin(n, q) that carries any probability (±12 sd and a margin)."""
    sd = math.sqrt(n * q * (1 - q))
    lo = max(0, math.floor(n * q - 12 * sd - 12))
    hi = min(n, math.ceil(n * q + 12 * sd + 12))
    lq, lp = math.log(q), math.log1p(-q)
    lgn = math.lgamma(n + 1)
    pmf = [
        math.exp(lgn - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * lq + (n - k) * lp)
        for k in range(lo, hi + 1)
    ]
    return lo, pmf


def ci_ranks(n: int, q: float, level: float = 0.95) -> tuple[int, int] | None:
    """1-based ranks (l, u) with P(x_(l) ≤ ξ_q ≤ x_(u)) ≥ level, distribution-free; None if none exist.

    l = largest r with P(Bin(n,q) ≥ r) ≥ 1−α/2, u = smallest r with P(Bin(n,q) ≤ r−1) ≥ 1−α/2
    (the convention of load_anchors.md §4.6: n=1000 → p50 [470, 532], p99 [984, 997])."""
    if n <= 0 or not 0 < q < 1:
        return None
    alpha2 = (1 - level) / 2
    lo, pmf = _binom_window(n, q)
    # cdf[k-lo] = P(B ≤ k)
    cdf, acc = [], 0.0
    for p in pmf:
        acc += p
        cdf.append(acc)
    # l: P(B ≥ l) = 1 − P(B ≤ l−1) ≥ 1 − α/2  ⇔  P(B ≤ l−1) ≤ α/2
    low = None
    for k in range(len(cdf) - 1, -1, -1):
        if cdf[k] <= alpha2:
            low = lo + k + 1  # l − 1 = lo + k
            break
    if low is None:
        low = lo if lo > 0 else 0  # P(B ≤ lo−1) ≈ 0 ⇒ l = lo (0 ⇒ no lower order statistic)
    # u: P(B ≤ u−1) ≥ 1 − α/2
    high = None
    for k, c in enumerate(cdf):
        if c >= 1 - alpha2:
            high = lo + k + 1
            break
    if low < 1 or high is None or high > n:
        return None
    return low, high


def describe(values: Iterable[float], *, ci: bool = True) -> dict[str, Any]:
    """{n, mean, std, min, p50…p999, max, ci95} of raw samples (ms in, ms out). Empty → {"n": 0}."""
    xs = sorted(values)
    n = len(xs)
    if not n:
        return {"n": 0}
    mean = math.fsum(xs) / n
    std = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0
    out: dict[str, Any] = {"n": n, "mean": mean, "std": std, "min": xs[0]}
    for name, q in QUANTILES.items():
        out[name] = nearest_rank(xs, q)
    out["max"] = xs[-1]
    if ci:
        cis: dict[str, Any] = {}
        for name in CI_KEYS:
            r = ci_ranks(n, QUANTILES[name])
            cis[name] = [xs[r[0] - 1], xs[r[1] - 1]] if r else INSUFFICIENT
        out["ci95"] = cis
    return out


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval for a proportion k/n (n = 0 → the whole [0, 1])."""
    if n <= 0:
        return (0.0, 1.0)
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    lo = 0.0 if k == 0 else max(0.0, centre - half)  # exact ends where float rounding would leave 1e-18
    hi = 1.0 if k == n else min(1.0, centre + half)
    return (lo, hi)


# --- HdrHistogram (interchange) ------------------------------------------------------------------------


def hdr_encode(values_ms: Iterable[float]) -> str | None:
    """Base64 HdrHistogram of the values in µs (1 µs – 1 h, 3 significant digits); None if the optional
    `hdrhistogram` package is missing (the exact statistics never depend on it)."""
    try:
        from hdrh.histogram import HdrHistogram
    except ImportError:
        return None
    h = HdrHistogram(HDR_LOW_US, HDR_HIGH_US, HDR_DIGITS)
    for v in values_ms:
        h.record_value(min(HDR_HIGH_US, max(HDR_LOW_US, round(v * 1000))))
    return h.encode().decode()


def hdr_merge(encoded: Iterable[str | None]) -> str | None:
    """Merge several base64 histograms (e.g. one per carrier/process) into one."""
    from hdrh.histogram import HdrHistogram

    total = HdrHistogram(HDR_LOW_US, HDR_HIGH_US, HDR_DIGITS)
    any_ = False
    for e in encoded:
        if e:
            total.decode_and_add(e)
            any_ = True
    return total.encode().decode() if any_ else None


def hdr_percentile_ms(encoded: str, q: float) -> float:
    from hdrh.histogram import HdrHistogram

    return HdrHistogram.decode(encoded).get_value_at_percentile(q * 100) / 1000
