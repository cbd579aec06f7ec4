"""The summary contract (docs/measurement.md "Summary format"), computed from raw records and monitor
samples. Pure: nothing here reads a clock or does I/O."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from csbench.probe.engine.monitor import Monitor
from csbench.probe.engine.records import ERRORS, PHASES, Records
from csbench.probe.engine.selfcheck import (
    LATE_MS,
    Thresholds,
    WindowSignals,
    combine,
    evaluate,
    little_deviation,
)
from csbench.probe.engine.stats import describe, hdr_encode, nearest_rank, wilson

MS = 1e-6
NS = 1_000_000_000
SELFCHECK_WINDOW_S = 10.0
E_CLIENT = ERRORS.index("client")
E_429 = ERRORS.index("http_429")

# metric name → (start column, end column), both must be set and the request must have succeeded.
SPAN_METRICS: dict[str, tuple[str, str]] = {
    "ttft": ("t_intended", "t_first_token"),
    "ttft_service": ("t_send", "t_first_token"),
    "ttfe": ("t_intended", "t_first_event"),
    "ttfb_headers": ("t_send", "t_resp_headers"),
    "ttfc": ("t_intended", "t_first_content"),
    "e2e": ("t_intended", "t_end"),
    "e2e_service": ("t_send", "t_end"),
}
METRICS = (*SPAN_METRICS, "queue_delay", "tpot", "itl_event", "max_stall")


def metric_values(r: Records, idx: Sequence[int], name: str) -> list[float]:
    """Values in ms of one metric over the request indexes `idx`."""
    c = r.cols
    err = c["error"]
    if name in SPAN_METRICS:
        a, b = (c[x] for x in SPAN_METRICS[name])
        return [(b[i] - a[i]) * MS for i in idx if not err[i] and a[i] and b[i]]
    if name == "queue_delay":  # every sent request, failed ones too: the client delay is ours either way
        tq, ts = c["t_intended"], c["t_send"]
        return [(ts[i] - tq[i]) * MS for i in idx if ts[i]]
    if name == "tpot":
        f, la, n = c["t_first_token"], c["t_last_token"], c["output_tokens"]
        return [(la[i] - f[i]) * MS / (n[i] - 1) for i in idx if not err[i] and n[i] >= 2 and f[i]]
    if name == "max_stall":
        g, nt = c["max_gap_ns"], c["n_token_events"]
        return [g[i] * MS for i in idx if not err[i] and nt[i] >= 2]
    if name == "itl_event":
        keep = {i for i in idx if not err[i]}
        return [g * MS for q, g in zip(r.gap_req, r.gap_ns, strict=True) if q in keep]
    raise KeyError(name)


def sched_lag_ms(r: Records, i: int) -> float:
    """Dispatcher lateness: t_send − t_intended minus the intentional wait for an in-flight cap slot."""
    c = r.cols
    return (c["t_send"][i] - c["t_intended"][i] - c["cap_wait_ns"][i]) * MS


def block(r: Records, idx: Sequence[int], window_s: float | None, *, hdr: bool = False) -> dict[str, Any]:
    """counts / rates / latency_ms / errors for a subset of requests (a phase or the steady window)."""
    c = r.cols
    dropped = [i for i in idx if c["dropped"][i]]
    live = [i for i in idx if not c["dropped"][i]]
    sent = [i for i in live if c["t_send"][i]]
    errs: dict[str, int] = {}
    for i in sent:
        e = c["error"][i]
        if e:
            errs[ERRORS[e]] = errs.get(ERRORS[e], 0) + 1
    completed = len(sent) - sum(errs.values())
    late = sum(1 for i in sent if sched_lag_ms(r, i) > LATE_MS)
    out: dict[str, Any] = {
        "counts": {
            "offered": len(idx),
            "sent": len(sent),
            "completed": completed,
            "dropped": len(dropped),
            "late": late,
            "errors": errs,
        },
    }
    if window_s:
        out["rates"] = {
            "offered_per_s": len(idx) / window_s,
            "achieved_send_per_s": len(sent) / window_s,
            "completed_per_s": completed / window_s,
        }
    lat: dict[str, Any] = {}
    hdrs: dict[str, Any] = {}
    for m in METRICS:
        vals = metric_values(r, sent, m)
        lat[m] = describe(vals)
        if hdr and vals:
            hdrs[m] = hdr_encode(vals)
    out["latency_ms"] = lat
    out["errors"] = {
        k: {"n": n, "rate": n / len(sent), "wilson95": list(wilson(n, len(sent)))}
        for k, n in sorted(errs.items())
    }
    if hdr:
        out["hdr"] = hdrs
    return out


def _pct(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"p50": None, "p99": None, "max": None}
    s = sorted(xs)
    return {"p50": nearest_rank(s, 0.5), "p99": nearest_rank(s, 0.99), "max": s[-1]}


def _windows(t0: int, t1: int) -> list[tuple[int, int]]:
    """10 s self-check windows over [t0, t1); a short tail (< 5 s) joins the previous window."""
    step = int(SELFCHECK_WINDOW_S * NS)
    out: list[tuple[int, int]] = []
    a = t0
    while a < t1:
        b = min(t1, a + step)
        if out and b - a < step // 2:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
        a = b
    return out or [(t0, t1)]


def window_signals(
    r: Records,
    idx: Sequence[int],
    mon: Monitor | None,
    t0: int,
    t1: int,
    closed_workers: int | None,
    think_mean_s: float,
) -> WindowSignals:
    c = r.cols
    win = [i for i in idx if t0 <= c["t_intended"][i] < t1]
    sent = [i for i in win if not c["dropped"][i] and c["t_send"][i]]
    lags = [sched_lag_ms(r, i) for i in sent]
    ok = [i for i in sent if not c["error"][i] and c["t_first_token"][i]]
    ttft = sorted((c["t_first_token"][i] - c["t_intended"][i]) * MS for i in ok)
    s = WindowSignals(
        sched_lag_p99_ms=nearest_rank(sorted(lags), 0.99) if lags else None,
        late_fraction=sum(1 for x in lags if x > LATE_MS) / len(lags) if lags else None,
        ttft_p50_ms=nearest_rank(ttft, 0.5) if ttft else None,
        offered=len(win),
        sent=sum(1 for i in idx if t0 <= c["t_send"][i] < t1),
        dropped=sum(1 for i in win if c["dropped"][i]),
        client_errors=sum(1 for i in sent if c["error"][i] == E_CLIENT),
    )
    if closed_workers:
        s.offered = s.sent = 0  # a closed loop offers what it can: the rate rule does not apply
        done = [i for i in win if c["t_end"][i]]
        if done:
            cycle = sum((c["t_end"][i] - c["t_intended"][i]) for i in done) / len(done) / NS + think_mean_s
            s.little_deviation = little_deviation(closed_workers, len(done), (t1 - t0) / NS, cycle)
            s.little_completions = len(done)
    if mon is not None:
        w = mon.window(t0, t1)
        if w["lag_ns"]:
            lag = sorted(x * MS for x in w["lag_ns"])
            s.loop_lag_p99_ms, s.loop_lag_max_ms = nearest_rank(lag, 0.99), lag[-1]
            s.loop_lag_samples = len(lag)
        if w["cpu"]:
            s.cpu_share = max(w["cpu"])
        if w["gc_ns"]:
            s.gc_pause_max_ms = max(w["gc_ns"]) * MS
    return s


def summarize(
    r: Records,
    monitors: Sequence[Monitor | None],
    *,
    epoch_ns: int,
    load: dict[str, Any],
    warmup_s: float,
    duration_s: float,
    closed_workers: int | None = None,
    think_mean_s: float = 0.0,
    thresholds: Thresholds | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    c = r.cols
    n = r.n
    ph = c["phase"]
    by_phase = {name: [i for i in range(n) if ph[i] == k] for k, name in enumerate(PHASES)}
    steady = by_phase["steady"]
    w0, w1 = epoch_ns + int(warmup_s * NS), epoch_ns + int((warmup_s + duration_s) * NS)
    main = block(r, steady, duration_s, hdr=True)
    out: dict[str, Any] = {
        "load": load,
        "window": {"start_s": warmup_s, "end_s": warmup_s + duration_s},
        "clock": {"epoch_mono_ns": epoch_ns},
    }
    out.update({k: main[k] for k in ("counts", "rates", "latency_ms", "errors")})
    out["retry_after_s"] = [
        c["retry_after_ms"][i] / 1000
        for i in range(n)
        if c["error"][i] == E_429 and c["retry_after_ms"][i] >= 0
    ][:1000]
    out["phases"] = {
        name: block(r, by_phase[name], None) for name in ("cold", "warmup", "steady", "cooldown")
    }
    out["selfcheck"] = selfcheck_block(r, steady, monitors, w0, w1, closed_workers, think_mean_s, thresholds)
    out["hdr"] = main["hdr"]
    out["timeseries"] = timeseries(r, monitors, epoch_ns)
    if extra:
        out.update(extra)
    return out


def selfcheck_block(
    r: Records,
    steady: Sequence[int],
    monitors: Sequence[Monitor | None],
    w0: int,
    w1: int,
    closed_workers: int | None,
    think_mean_s: float,
    thresholds: Thresholds | None,
) -> dict[str, Any]:
    c = r.cols
    procs = sorted({c["process"][i] for i in steady}) or [0]
    verdicts = []
    windows_out = []
    for p in procs:
        idx = [i for i in steady if c["process"][i] == p]
        mon = monitors[p] if p < len(monitors) else None
        workers = None
        if closed_workers:
            workers = max(1, closed_workers // max(1, len(procs)))
        for a, b in _windows(w0, w1):
            sig = window_signals(r, idx, mon, a, b, workers, think_mean_s)
            v = evaluate(sig, thresholds)
            verdicts.append(v)
            windows_out.append(
                {"process": p, "start_s": None, "verdict": v[0], "reasons": v[1], "t0_ns": a, "t1_ns": b}
            )
    verdict, reasons = combine(verdicts)
    sent = [i for i in steady if not c["dropped"][i] and c["t_send"][i]]
    lags = [sched_lag_ms(r, i) for i in sent]
    loop: list[float] = []
    cpu: list[float] = []
    gcs: list[float] = []
    for mon in monitors:
        if mon is None:
            continue
        w = mon.window(w0, w1)
        loop += [x * MS for x in w["lag_ns"]]
        cpu.append(sum(w["cpu"]) / len(w["cpu"]) if w["cpu"] else math.nan)
        gcs += [x * MS for x in w["gc_ns"]]
    cpu = [x for x in cpu if not math.isnan(x)]
    for wo in windows_out:
        wo["start_s"] = (wo.pop("t0_ns") - w0) / NS
        wo["end_s"] = (wo.pop("t1_ns") - w0) / NS
    return {
        "verdict": verdict,
        "reasons": reasons,
        "sched_lag_ms": _pct(lags),
        "loop_lag_ms": _pct(loop),
        "cpu_share": max(cpu) if cpu else None,
        "gc_pause_ms": {"count": len(gcs), "max": max(gcs) if gcs else 0.0, "total": sum(gcs)},
        "dropped_slots": sum(1 for i in steady if c["dropped"][i]),
        "late_sends": sum(1 for x in lags if x > LATE_MS),
        "windows": windows_out,
    }


def timeseries(r: Records, monitors: Sequence[Monitor | None], epoch_ns: int) -> list[dict[str, Any]]:
    """1 s buckets from the run epoch to the last completion."""
    c = r.cols
    n = r.n
    last = max([c["t_end"][i] for i in range(n)] + [c["t_intended"][i] for i in range(n)] + [epoch_ns])
    nb = int((last - epoch_ns) // NS) + 1

    def bucket(t: int) -> int:
        return -1 if not t or t < epoch_ns else int((t - epoch_ns) // NS)

    rows: list[dict[str, Any]] = [
        {"t_s": float(b), "offered": 0, "sent": 0, "completed": 0, "errors": 0, "http_429": 0, "inflight": 0}
        for b in range(nb)
    ]
    ttfts: list[list[float]] = [[] for _ in range(nb)]
    delta = [0] * (nb + 1)

    def count(t: int, key: str) -> None:
        b = bucket(t)
        if 0 <= b < nb:
            rows[b][key] += 1

    for i in range(n):
        count(c["t_intended"][i], "offered")
        ts, te = c["t_send"][i], c["t_end"][i]
        if not ts:
            continue
        count(ts, "sent")
        e = c["error"][i]
        count(te, "errors" if e else "completed")
        if e == E_429:
            count(te, "http_429")
        # in flight at the end of bucket b: sent at or before it, not finished by then
        bs, be = bucket(ts), bucket(te) if te else nb
        if 0 <= bs < nb:
            delta[bs] += 1
            delta[min(nb, be)] -= 1
        if not e and c["t_first_token"][i]:
            b = bucket(c["t_intended"][i])
            if 0 <= b < nb:
                ttfts[b].append((c["t_first_token"][i] - c["t_intended"][i]) * MS)
    run = 0
    for b in range(nb):
        run += delta[b]
        row = rows[b]
        row["inflight"] = run
        s = sorted(ttfts[b])
        row["ttft_p50_ms"] = nearest_rank(s, 0.5) if s else None
        row["ttft_p99_ms"] = nearest_rank(s, 0.99) if s else None
        cpu: list[float] = []
        lag: list[float] = []
        for mon in monitors:
            if mon is None:
                continue
            w = mon.window(epoch_ns + b * NS, epoch_ns + (b + 1) * NS)
            cpu += w["cpu"]
            lag += [x * MS for x in w["lag_ns"]]
        row["cpu_share"] = max(cpu) if cpu else None
        row["loop_lag_p99_ms"] = nearest_rank(sorted(lag), 0.99) if lag else None
    return rows
