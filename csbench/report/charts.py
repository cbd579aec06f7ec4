"""Which charts a job gets, built from the model: pure functions from a Job to `svg.Chart`s.

Raw samples (telemetry) are preferred because they show the real distribution; when a job has none, the
summary percentiles are drawn instead and the caption says so — a CDF through six points is an outline, not
the distribution, and readers must be able to tell.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from csbench.report.model import Job, LatencyStats, Run
from csbench.report.svg import PALETTE, Axis, Chart, Series, fmt_num

MAX_CDF_POINTS = 400  # enough for a smooth curve; every point is still an observed value
MAX_SCATTER_POINTS = 2000
_PCTS = (("min", 0.0), ("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99), ("p999", 0.999), ("max", 1.0))
# Field names per metric in telemetry records (the compact ttft job wrote total_ms for the end of stream).
SAMPLE_FIELDS = {"ttft": ("ttft_ms",), "e2e": ("e2e_ms", "total_ms"), "ttft_service": ("ttft_service_ms",),
                 "queue_delay": ("queue_delay_ms",)}


# -- raw samples -----------------------------------------------------------------------------------------
def sample_phase(rec: dict[str, Any]) -> str:
    phase = str(rec.get("phase") or ("warmup" if rec.get("warmup") else "steady"))
    return {"measuring": "steady", "warm": "steady", "warm-up": "warmup"}.get(phase, phase)


def sample_ok(rec: dict[str, Any]) -> bool:
    return rec.get("ok", True) is not False and not rec.get("error_class") and not rec.get("error")


def sample_values(samples: Sequence[dict[str, Any]], metric: str, phase: str = "steady") -> list[float]:
    out = []
    for rec in samples:
        if sample_phase(rec) != phase or not sample_ok(rec):
            continue
        for name in SAMPLE_FIELDS.get(metric, (f"{metric}_ms",)):
            value = rec.get(name)
            if isinstance(value, int | float) and math.isfinite(value):
                out.append(float(value))
                break
    return out


def ecdf(values: Sequence[float]) -> list[tuple[float, float]]:
    """Empirical CDF points (x = observed value, y = fraction ≤ x), thinned to MAX_CDF_POINTS ranks."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return []
    ranks = range(n) if n <= MAX_CDF_POINTS else sorted({round(i * (n - 1) / (MAX_CDF_POINTS - 1))
                                                          for i in range(MAX_CDF_POINTS)})
    return [(xs[0], 0.0)] + [(xs[i], (i + 1) / n) for i in ranks]


def summary_cdf(stats: LatencyStats) -> list[tuple[float, float]]:
    pts = [(getattr(stats, name), q) for name, q in _PCTS]
    return [(float(x), q) for x, q in pts if isinstance(x, int | float)]


def _timeline(samples: Sequence[dict[str, Any]]) -> tuple[str, list[tuple[float, dict[str, Any]]]]:
    """(x label, [(x, record)]): intended time if recorded (the schedule), else send time, else sequence."""
    for field, label in (("t_intended_ns", "intended send time (s)"), ("t_send_ns", "send time (s)")):
        stamped = [(rec[field], rec) for rec in samples if isinstance(rec.get(field), int | float)]
        if stamped and len(stamped) == len(samples):
            t0 = min(t for t, _ in stamped)
            return label, [((t - t0) / 1e9, rec) for t, rec in stamped]
    return "request #", [(float(rec.get("seq", i)), rec) for i, rec in enumerate(samples)]


def _thin(points: list[Any], limit: int) -> list[Any]:
    if len(points) <= limit:
        return points
    step = len(points) / limit
    return [points[int(i * step)] for i in range(limit)]


# -- the charts ------------------------------------------------------------------------------------------
def _run_name(run: Run, i: int) -> str:
    axis = run.level_axis
    if run.label:
        return run.label
    return f"{axis[0]} {fmt_num(axis[1])}" if axis else f"run {i + 1}"


def distribution_chart(job: Job, metric: str, label: str) -> Chart:
    series: list[Series] = []
    sources: set[str] = set()
    # Cold curves only beside a single run: with a sweep's many steps they would bury the steady curves
    # (the per-run phase tables still list them).
    single = len(job.observations.runs) == 1
    for i, run in enumerate(job.observations.runs):
        name = _run_name(run, i)
        steady = sample_values(run.samples, metric)
        if steady:
            sources.add("raw samples")
            series.append(Series(f"{name} (n={len(steady)})", ecdf(steady), mode="step"))
            cold = sample_values(run.samples, metric, "cold") if single else []
            if cold:  # cold starts are their own population: a separate, dashed curve, never pooled
                series.append(Series(f"cold starts (n={len(cold)})", ecdf(cold), mode="step", dashed=True))
            continue
        stats = run.summary.latency_ms.get(metric)
        if stats and summary_cdf(stats):
            sources.add("summary percentiles")
            pts = summary_cdf(stats)
            series.append(Series(f"{name} (n={stats.n if stats.n is not None else '?'})", pts, mode="linepoints",
                                 tips=[f"{name}: {q * 100:g}th percentile = {x:.4g} ms" for x, q in pts]))
        cold_stats = run.summary.phases.get("cold", {}).get(metric) if single else None
        if cold_stats and summary_cdf(cold_stats):
            pts = summary_cdf(cold_stats)
            series.append(Series(f"cold starts (n={cold_stats.n if cold_stats.n is not None else '?'})", pts,
                                 mode="linepoints", dashed=True,
                                 tips=[f"{name} cold: p{q * 100:g} = {x:.4g} ms" for x, q in pts]))
    has_cold = any(s.dashed for s in series)
    note = ("Steady state; cold starts dashed. " if has_cold else "Steady state. ") + (
        "From summary percentiles only (min, p50, p90, p95, p99, p99.9, max): an outline of the distribution."
        if sources == {"summary percentiles"} else "Empirical CDF of the raw samples." if sources else "")
    return Chart(f"{metric}-cdf", f"{label} distribution (CDF)", Axis(f"{label} (ms)"),
                 Axis("fraction of requests ≤ x", fmt="%"), series[:8], note=note.strip(),
                 invalid=job.verdict == "invalid")


def ttft_time_chart(job: Job) -> Chart:
    series: list[Series] = []
    x_label = "time in run (s)"
    note = ""
    runs = job.observations.runs
    for i, run in enumerate(runs):
        name = _run_name(run, i)
        ts = run.summary.timeseries
        if any(p.ttft_p50_ms is not None for p in ts):
            # One colour per run, p99 dashed: the eye pairs a run's two lines without the legend.
            prefix, color = (f"{name} ", PALETTE[i % len(PALETTE)]) if len(runs) > 1 else ("", None)
            series.append(Series(f"{prefix}p50", [(p.t_s, p.ttft_p50_ms) for p in ts if p.ttft_p50_ms is not None],
                                 color=color))
            series.append(Series(f"{prefix}p99", [(p.t_s, p.ttft_p99_ms) for p in ts if p.ttft_p99_ms is not None],
                                 dashed=True, color=color or PALETTE[1]))
            note = "TTFT p50 and p99 per time-series bucket."
            continue
        steady = [s for s in run.samples if isinstance(s.get("ttft_ms"), int | float) and sample_ok(s)]
        if steady:
            x_label, timeline = _timeline(steady)
            pts = _thin([(x, float(rec["ttft_ms"]), sample_phase(rec)) for x, rec in timeline], MAX_SCATTER_POINTS)
            series.append(Series(name, [(x, y) for x, y, _ in pts], mode="scatter",
                                 tips=[f"{name} ({ph}): {y:.4g} ms at {x:.4g}" for x, y, ph in pts]))
            note = "Each point is one successful request."
    return Chart("ttft-time", "TTFT over time", Axis(x_label), Axis("TTFT (ms)"), series[:8], note=note,
                 invalid=job.verdict == "invalid")


def selfcheck_time_charts(job: Job) -> list[Chart]:
    """The generator's own resolution next to TTFT: loop lag and CPU over time, else lag per sweep step.

    Lag (ms) and CPU (%) get a chart each: on one axis the sub-millisecond lag would be a flat line at zero.
    """
    lag_series: list[Series] = []
    cpu_series: list[Series] = []
    runs = job.observations.runs
    for i, run in enumerate(runs):
        ts = run.summary.timeseries
        name = _run_name(run, i) if len(runs) > 1 else "loop lag p99"
        color = PALETTE[i % len(PALETTE)]
        lag = [(p.t_s, p.loop_lag_p99_ms) for p in ts if p.loop_lag_p99_ms is not None]
        if lag:
            lag_series.append(Series(name, lag, color=color))
        cpu = [(p.t_s, p.cpu_share * 100) for p in ts if p.cpu_share is not None]
        if cpu:
            cpu_series.append(Series(_run_name(run, i) if len(runs) > 1 else "generator CPU", cpu, color=color))
    charts = []
    if lag_series:
        charts.append(Chart("loop-lag-time", "Generator event-loop lag p99 over time", Axis("time in run (s)"),
                            Axis("loop lag p99 (ms)"), lag_series[:8],
                            note="PASS: p99 ≤ 2 ms; FAIL: p99 > 5 ms (load_anchors §4.7). TTFT differences "
                                 "smaller than this are not resolved."))
    if cpu_series:
        charts.append(Chart("cpu-time", "Generator CPU over time", Axis("time in run (s)"),
                            Axis("event-loop thread CPU (%)"), cpu_series[:8],
                            note="WARN above 60 %, FAIL above 75 %."))
    if charts:
        return charts
    leveled = [(r.level_axis, r.summary.selfcheck) for r in runs if r.level_axis and r.summary.selfcheck]
    if len(leveled) >= 2:
        axis_name = leveled[0][0][0]
        levels = [lvl[1] for lvl, _ in leveled]
        series = []
        for label, attr in (("schedule lag p99", "sched_lag_ms"), ("loop lag p99", "loop_lag_ms")):
            pts = [(lvl[1], getattr(sc, attr).p99) for lvl, sc in leveled]
            series.append(Series(f"{label} (ms)", [(x, y) for x, y in pts if y is not None], mode="linepoints"))
        return [Chart("selfcheck-level", "Generator lag per step", _level_axis(axis_name, levels),
                      Axis("lag p99 (ms)"), series, note="PASS needs p99 ≤ 2 ms for both (load_anchors §4.7).")]
    return [Chart("loop-lag-time", "Generator event-loop lag over time", Axis("time (s)"), Axis("ms"), [],
                  note="no self-check time series recorded")]


def _level_axis(name: str, levels: Sequence[float]) -> Axis:
    positive = [v for v in levels if v > 0]
    wide = bool(positive) and max(positive) / min(positive) >= 8
    return Axis("concurrency (in-flight requests)" if name == "concurrency" else "offered rate (req/s)",
                log=wide, ticks=sorted(set(levels)), zero=not wide)


def sweep_runs(job: Job) -> tuple[str, list[tuple[float, Run]]] | None:
    """The runs of a sweep, by level, when the job has at least two runs on one axis."""
    leveled = [(r.level_axis, r) for r in job.observations.runs if r.level_axis]
    names = {lvl[0] for lvl, _ in leveled}
    if len(leveled) < 2 or len(names) != 1:
        return None
    return names.pop(), sorted(((lvl[1], r) for lvl, r in leveled), key=lambda t: t[0])


def throughput_chart(job: Job) -> Chart | None:
    sweep = sweep_runs(job)
    if sweep is None:
        return None
    axis, runs = sweep
    series = []
    for label, attr in (("offered/s", "offered_per_s"), ("achieved send/s", "achieved_send_per_s"),
                        ("completed/s", "completed_per_s"), ("goodput/s", "goodput_per_s")):
        pts = [(lvl, getattr(r.summary.rates, attr)) for lvl, r in runs]
        pts = [(x, y) for x, y in pts if y is not None]
        if pts:
            series.append(Series(label, pts, mode="linepoints", dashed=attr == "offered_per_s",
                                 tips=[f"{label} at {axis} {fmt_num(x)}: {y:.4g}" for x, y in pts]))
    return Chart("throughput", f"Throughput against {axis}", _level_axis(axis, [lvl for lvl, _ in runs]),
                 Axis("requests per second"), series, invalid=job.verdict == "invalid")


def errors_chart(job: Job) -> Chart | None:
    sweep = sweep_runs(job)
    if sweep is None:
        return None
    axis, runs = sweep
    classes = sorted({c for _, r in runs for c in r.summary.errors} | {c for _, r in runs
                                                                         for c in r.summary.counts.errors})
    series = []
    total = []
    for lvl, r in runs:
        sent = r.summary.counts.sent or r.summary.counts.offered
        n = sum(r.summary.counts.errors.values()) or sum(e.n for e in r.summary.errors.values())
        if sent:
            total.append((lvl, n / sent))
    if total:
        series.append(Series("all errors", total, mode="linepoints",
                             tips=[f"{axis} {fmt_num(x)}: {y * 100:.3g}% of sent requests failed" for x, y in total]))
    for cls in classes[:6]:
        pts, whiskers, tips = [], [], []
        for lvl, r in runs:
            stat = r.summary.errors.get(cls)
            if stat and stat.rate is not None:
                pts.append((lvl, stat.rate))
                tips.append(f"{cls} at {axis} {fmt_num(lvl)}: {stat.n} ({stat.rate * 100:.3g}%)")
                if stat.wilson95:
                    whiskers.append((lvl, *stat.wilson95))
        if pts:
            series.append(Series(cls, pts, mode="linepoints", whiskers=whiskers, tips=tips))
    return Chart("errors", f"Errors against {axis}", _level_axis(axis, [lvl for lvl, _ in runs]),
                 Axis("fraction of sent requests", fmt="%"), series,
                 note="Bars: Wilson 95 % interval per error class.")


def ttft_level_chart(job: Job) -> Chart | None:
    sweep = sweep_runs(job)
    if sweep is None:
        return None
    axis, runs = sweep
    series = []
    for q in ("p50", "p90", "p99"):
        pts, whiskers, tips = [], [], []
        for lvl, r in runs:
            stats = r.summary.latency_ms.get("ttft")
            value = getattr(stats, q, None) if stats else None
            if value is None:
                continue
            pts.append((lvl, value))
            ci = stats.ci95.get(q) if stats else None
            if isinstance(ci, tuple):
                whiskers.append((lvl, *ci))
            tips.append(f"TTFT {q} at {axis} {fmt_num(lvl)}: {value:.4g} ms"
                        + (f" (95% CI {ci[0]:.4g}–{ci[1]:.4g})" if isinstance(ci, tuple) else
                           " (CI insufficient)" if ci == "insufficient" else "")
                        + (" — INVALID run" if r.verdict == "invalid" else ""))
        if pts:
            series.append(Series(f"TTFT {q}", pts, mode="linepoints", whiskers=whiskers, tips=tips))
    return Chart("ttft-level", f"TTFT against {axis}", _level_axis(axis, [lvl for lvl, _ in runs]),
                 Axis("TTFT (ms)"), series, note="Bars: distribution-free 95 % CI of the percentile.",
                 invalid=job.verdict == "invalid")


def job_charts(job: Job) -> tuple[list[Chart], list[Chart]]:
    """(load response and distributions, TTFT over time with the generator's self-check beside it)."""
    charts: list[Chart] = [c for c in (ttft_level_chart(job), throughput_chart(job), errors_chart(job)) if c]
    charts.append(distribution_chart(job, "ttft", "TTFT"))
    e2e = distribution_chart(job, "e2e", "End-to-end latency")
    if e2e.series:
        charts.append(e2e)
    return charts, [ttft_time_chart(job), *selfcheck_time_charts(job)]
