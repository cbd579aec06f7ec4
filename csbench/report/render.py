"""The HTML report: pure functions from the model to strings, one per section.

Rules that hold everywhere: every value from a result goes through `esc` (results are data from remote
machines, not markup); a number whose run is invalid is never shown without saying so; cold, warm-up and
steady-state statistics sit in separate rows and are never pooled.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from csbench.report.assets import CSS, JS, csp
from csbench.report.charts import job_charts, sweep_runs
from csbench.report.model import METRICS, PHASES, Job, LatencyStats, Report, Run, Verdict
from csbench.report.svg import esc, render_chart

VERDICT_TEXT = {"valid": "valid", "warn": "warning", "invalid": "INVALID", "unknown": "unverified"}
PHASE_TEXT = {"cold": "cold start", "warmup": "warm-up", "steady": "steady state"}


def render_report(report: Report) -> str:
    body = [_header(report), _overview(report)]
    body += [_job(job) for job in report.jobs]
    if report.problems:
        body.append('<div class="card problems"><h3>Problems reading the results</h3><ul>'
                    + "".join(f"<li>{esc(p)}</li>" for p in report.problems) + "</ul></div>")
    title = f"csbench report — {report.campaign or 'campaign'}"
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{esc(csp())}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{CSS}</style></head>"
            f'<body data-verdict="{esc(report.verdict)}"><main>{"".join(body)}</main>'
            f"<script>{JS}</script></body></html>\n")


# -- small helpers ---------------------------------------------------------------------------------------
def badge(verdict: Verdict) -> str:
    return f'<span class="badge {esc(verdict)}">{esc(VERDICT_TEXT.get(verdict, verdict))}</span>'


def fmt_ms(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def fmt_value(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return {True: "yes", False: "no", None: "–"}[value]
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict | list):
        return json.dumps(value, default=str)
    return str(value)


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, cls: str = "", caption: str = "",
           num_from: int = 99) -> str:
    """Rows are already-escaped HTML cells; columns from `num_from` on are right-aligned numbers."""
    def cell(tag: str, i: int, content: str) -> str:
        return f'<{tag} class="num">{content}</{tag}>' if i >= num_from else f"<{tag}>{content}</{tag}>"

    head = "".join(cell("th", i, esc(h)) for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(c if c.startswith("<td") else cell("td", i, c) for i, c in enumerate(row))
                   + "</tr>" for row in rows)
    cap = f"<caption>{caption}</caption>" if caption else ""
    return f'<table class="{esc(cls)}">{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _kv(pairs: Iterable[tuple[str, Any]]) -> str:
    rows = [(esc(k), esc(fmt_value(v))) for k, v in pairs if v not in (None, "", {}, [])]
    return _table(["", ""], rows).replace("<thead><tr><th></th><th></th></tr></thead>", "") if rows else ""


# -- header ----------------------------------------------------------------------------------------------
def _header(report: Report) -> str:
    targets = sorted({j.target for j in report.jobs if j.target})
    head = [f"<h1>csbench report: {esc(report.campaign or 'campaign')}</h1>",
            f'<p class="sub">{len(report.jobs)} job(s) from {esc(report.source or "?")}'
            f'{" · generated " + esc(report.generated_at) if report.generated_at else ""}</p>',
            _banner(report),
            '<div class="card"><h3>Campaign</h3>'
            + _kv([("campaign", report.campaign), ("target", ", ".join(targets)), ("source", report.source),
                   ("overall verdict", VERDICT_TEXT[report.verdict])])]
    vantages = _distinct(j.observations.vantage.model_dump() for j in report.jobs)
    if vantages:
        cols = ["carrier_id", "instance_id", "instance_type", "region", "zone", "image_id", "in_vpc",
                "package_version"]
        head.append("<h3>Vantage</h3>" + _table(cols, ([esc(fmt_value(v.get(c))) for c in cols] for v in vantages)))
    provenance = _distinct({k: v for k, v in j.observations.provenance.model_dump().items()
                            if k not in ("started_at", "finished_at", "spec_sha256")} for j in report.jobs)
    if provenance:
        cols = ["csbench_version", "python", "aiohttp", "uvloop"]
        head.append("<h3>Provenance</h3>" + _table(cols, ([esc(fmt_value(p.get(c))) for c in cols]
                                                          for p in provenance)))
    head.append("</div>")
    return "".join(head)


def _distinct(docs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    for doc in docs:
        if any(v is not None for v in doc.values()) and doc not in seen:
            seen.append(doc)
    return seen


def _banner(report: Report) -> str:
    """The verdict first and loudest: an invalid campaign must be impossible to miss."""
    verdict = report.verdict
    reasons = [f"{j.job_id}: {r}" for j in report.jobs if j.verdict != "valid" for r in j.verdict_reasons()]
    text = {"invalid": "INVALID — some numbers below measured the load generator or a failed job, not the "
                       "platform. Those numbers are marked INVALID; do not quote them.",
            "warn": "WARNING — the generator was near its limits in some runs; read the marked numbers with care.",
            "valid": "All runs passed the generator self-check.",
            "unknown": "Unverified — at least one job carries no generator self-check."}[verdict]
    items = "".join(f"<li>{esc(r)}</li>" for r in reasons[:40])
    more = f"<li>… and {len(reasons) - 40} more</li>" if len(reasons) > 40 else ""
    role = ' role="alert"' if verdict == "invalid" else ""
    return (f'<div class="banner {esc(verdict)}" id="verdict"{role} data-verdict="{esc(verdict)}">'
            f"{esc(text)}{'<ul>' + items + more + '</ul>' if items else ''}</div>")


def _overview(report: Report) -> str:
    if not report.jobs:
        return '<div class="card">No job results found.</div>'
    rows = []
    for j in report.jobs:
        o = j.observations
        ttft = next((r.summary.latency_ms["ttft"] for r in o.runs if "ttft" in r.summary.latency_ms), None)
        # An invalid job's headline numbers are struck through here too: this table gets copied into chats.
        num = '<td class="num inv-num">' if j.verdict == "invalid" else '<td class="num">'
        rows.append([f'<a href="#job-{esc(j.job_id)}">{esc(j.job_id)}</a>', esc(o.kind or "?"), esc(j.status),
                     badge(j.verdict), esc(len(o.runs)), f"{num}{esc(fmt_ms(ttft.p50 if ttft else None))}</td>",
                     f"{num}{esc(fmt_ms(ttft.p99 if ttft else None))}</td>",
                     esc(fmt_value(ttft.n if ttft else None))])
    return ('<div class="card"><h3>Jobs</h3>'
            + _table(["job", "kind", "status", "verdict", "runs", "TTFT p50 ms (first run)", "TTFT p99 ms",
                      "n"], rows, num_from=4) + "</div>")


# -- one job ---------------------------------------------------------------------------------------------
def _job(job: Job) -> str:
    o = job.observations
    verdict = job.verdict
    out = [f'<section class="job {esc(verdict)}" id="job-{esc(job.job_id)}" data-verdict="{esc(verdict)}">',
           f"<h2>{esc(job.job_id)} · {esc(o.kind or 'unknown kind')} {badge(verdict)}</h2>"]
    reasons = job.verdict_reasons()
    if verdict in ("invalid", "warn") and reasons:
        out.append(f'<div class="banner {esc(verdict)}">{esc(VERDICT_TEXT[verdict])}: '
                   f"<ul>{''.join(f'<li>{esc(r)}</li>' for r in reasons)}</ul></div>")
    elif reasons:
        out.append(f'<p class="sub">{esc("; ".join(reasons))}</p>')
    out.append(_kv([("status", job.status), ("attempt", job.attempt), ("carrier", job.carrier_id),
                    ("reason", job.reason), ("message", job.message), ("target", job.target),
                    ("started", o.provenance.started_at or job.started_at),
                    ("finished", o.provenance.finished_at or job.finished_at),
                    ("spec sha256", o.provenance.spec_sha256)]))
    if job.problems:
        out.append('<ul class="problems">' + "".join(f"<li>{esc(p)}</li>" for p in job.problems) + "</ul>")
    if o.findings:
        out.append("<h3>Findings</h3>" + _kv(sorted(o.findings.items())))
    if o.params:
        out.append(f"<details><summary>Parameters</summary><pre>{esc(json.dumps(o.params, indent=1, default=str))}"
                   "</pre></details>")
    if sweep_runs(job):
        out.append("<h3>Runs</h3>" + _sweep_table(job))
    load, timeline = job_charts(job)
    out.append('<h3>Latency and load</h3><div class="charts">' + "".join(render_chart(c) for c in load)
               + "</div>")
    # TTFT over time sits beside the generator's lag and CPU so the resolution of each number is in view.
    out.append('<h3>TTFT over time, beside the generator self-check</h3><div class="charts">'
               + "".join(render_chart(c) for c in timeline) + "</div>")
    out.append(_selfcheck_table(o.runs))
    for i, run in enumerate(o.runs):
        out.append(_run(run, i, open_=len(o.runs) <= 4 or run.verdict == "invalid"))
    out.append("</section>")
    return "".join(out)


def _run(run: Run, index: int, *, open_: bool) -> str:
    s = run.summary
    name = run.label or f"run {index + 1}"
    level = ", ".join(f"{k} {fmt_value(v)}" for k, v in run.level.items())
    invalid = run.verdict == "invalid"
    parts = [f'<details class="run" data-verdict="{esc(run.verdict)}"{" open" if open_ else ""}>'
             f"<summary>{esc(name)}{' (' + esc(level) + ')' if level else ''} {badge(run.verdict)}</summary>"]
    window = (f"{fmt_value(s.window.start_s)}–{fmt_value(s.window.end_s)} s"
              if s.window.start_s is not None else None)
    c, r = s.counts, s.rates
    parts.append(_kv([("steady window", window), ("offered", c.offered), ("sent", c.sent),
                      ("completed", c.completed), ("dropped", c.dropped), ("late", c.late),
                      ("offered/s", r.offered_per_s), ("achieved send/s", r.achieved_send_per_s),
                      ("completed/s", r.completed_per_s), ("goodput/s", r.goodput_per_s)]))
    parts.append(latency_table(s.latency_ms, invalid=invalid, caption="steady state"))
    phases = phase_table(s.phases, invalid=invalid)
    if phases:
        parts.append("<h4>By phase (never pooled)</h4>" + phases)
    if s.errors or c.errors:
        parts.append("<h4>Errors</h4>" + _errors_table(run))
    return "".join(parts) + "</details>"


def _pct_cell(stats: LatencyStats, q: str) -> str:
    value = getattr(stats, q)
    ci = stats.ci95.get(q)
    if ci == "insufficient":
        extra = '<br><small class="insuff">CI: insufficient n</small>'
    elif isinstance(ci, tuple):
        extra = f"<br><small>[{esc(fmt_ms(ci[0]))}–{esc(fmt_ms(ci[1]))}]</small>"
    elif q == "p999" and stats.n is not None and stats.n < 3688 and value is not None:
        # load_anchors §4.6: a 95 % CI for p99.9 needs 3,688 samples; below that it is the max, not p99.9.
        extra = '<br><small class="insuff">insufficient n</small>'
    else:
        extra = ""
    return f"{esc(fmt_ms(value))}{extra}"


_COLS = ("mean", "p50", "p90", "p95", "p99", "p999", "max")


def latency_table(latency: dict[str, LatencyStats], *, invalid: bool, caption: str = "") -> str:
    """Percentiles with their 95 % CI and sample count; an invalid run's table says INVALID on every row."""
    names = [m for m in METRICS if m in latency] + sorted(m for m in latency if m not in METRICS)
    if not names:
        return '<p class="sub">no latency statistics recorded</p>'
    rows = []
    for m in names:
        st = latency[m]
        row = [f"<td><b>{esc(m)}</b></td>", esc(fmt_value(st.n))]
        row += [esc(fmt_ms(st.mean)) if q == "mean" else _pct_cell(st, q) for q in _COLS]
        rows.append(row + (['<td class="inv">INVALID</td>'] if invalid else []))
    cap = (f"INVALID — {caption}: the generator failed its self-check; these numbers are not platform latency"
           if invalid else f"{caption}, ms; brackets: distribution-free 95 % CI")
    headers = ["metric (ms)", "n", "mean", "p50", "p90", "p95", "p99", "p99.9", "max"] + (["validity"] if invalid else [])
    return _table(headers, rows, cls="latency invalid" if invalid else "latency", caption=esc(cap), num_from=1)


def phase_table(phases: dict[str, dict[str, LatencyStats]], *, invalid: bool) -> str:
    rows = []
    for phase in [p for p in PHASES if p in phases] + sorted(p for p in phases if p not in PHASES):
        for metric, st in phases[phase].items():
            rows.append([esc(PHASE_TEXT.get(phase, phase)), f"<b>{esc(metric)}</b>", esc(fmt_value(st.n)),
                         _pct_cell(st, "p50"), _pct_cell(st, "p90"), _pct_cell(st, "p99"), esc(fmt_ms(st.max))]
                        + (['<td class="inv">INVALID</td>'] if invalid else []))
    if not rows:
        return ""
    return _table(["phase", "metric (ms)", "n", "p50", "p90", "p99", "max"] + (["validity"] if invalid else []),
                  rows, cls="phases invalid" if invalid else "phases", num_from=2,
                  caption=esc("INVALID — per phase" if invalid else "per phase, ms"))


def _errors_table(run: Run) -> str:
    s = run.summary
    classes = sorted(set(s.errors) | set(s.counts.errors))
    rows = []
    for cls in classes:
        st = s.errors.get(cls)
        n = st.n if st else s.counts.errors.get(cls, 0)
        rate = f"{st.rate * 100:.3g}%" if st and st.rate is not None else "–"
        ci = (f"{st.wilson95[0] * 100:.3g}%–{st.wilson95[1] * 100:.3g}%" if st and st.wilson95 else "–")
        rows.append([esc(cls), esc(n), esc(rate), esc(ci)])
    return _table(["class", "n", "rate", "Wilson 95 %"], rows, num_from=1)


def _sweep_table(job: Job) -> str:
    sweep = sweep_runs(job)
    assert sweep is not None
    axis, runs = sweep
    rows = []
    for level, run in runs:
        s = run.summary
        ttft = s.latency_ms.get("ttft")
        sent = s.counts.sent or s.counts.offered
        errors = sum(s.counts.errors.values()) or sum(e.n for e in s.errors.values())
        invalid = run.verdict == "invalid"
        mark = ' class="num inv-num"' if invalid else ' class="num"'
        rows.append([esc(fmt_value(level)), esc(run.label), badge(run.verdict),
                     esc(fmt_value(s.rates.offered_per_s)), esc(fmt_value(s.rates.achieved_send_per_s)),
                     esc(fmt_value(s.rates.completed_per_s)),
                     esc(f"{errors / sent * 100:.3g}%" if sent else "–"),
                     f"<td{mark}>{_pct_cell(ttft, 'p50') if ttft else '–'}</td>",
                     f"<td{mark}>{_pct_cell(ttft, 'p99') if ttft else '–'}</td>",
                     esc(fmt_value(ttft.n if ttft else None))])
    return _table([axis, "run", "self-check", "offered/s", "achieved send/s", "completed/s", "errors",
                   "TTFT p50 ms", "TTFT p99 ms", "n"], rows, num_from=3, cls="sweep")


def _selfcheck_table(runs: Sequence[Run]) -> str:
    rows = []
    for i, run in enumerate(runs):
        sc = run.summary.selfcheck
        if sc is None:
            continue
        rows.append([esc(run.label or f"run {i + 1}"), badge(sc.verdict),
                     esc(f"{fmt_ms(sc.sched_lag_ms.p50)} / {fmt_ms(sc.sched_lag_ms.p99)} / {fmt_ms(sc.sched_lag_ms.max)}"),
                     esc(f"{fmt_ms(sc.loop_lag_ms.p50)} / {fmt_ms(sc.loop_lag_ms.p99)} / {fmt_ms(sc.loop_lag_ms.max)}"),
                     esc(f"{sc.cpu_share * 100:.0f}%" if sc.cpu_share is not None else "–"),
                     esc(f"{fmt_value(sc.gc_pause_ms.count)} / {fmt_ms(sc.gc_pause_ms.max)}"),
                     esc(fmt_value(sc.dropped_slots)), esc(fmt_value(sc.late_sends)),
                     esc("; ".join(sc.reasons) or "–")])
    if not rows:
        return ""
    return _table(["run", "verdict", "schedule lag p50/p99/max ms", "loop lag p50/p99/max ms", "CPU",
                   "GC pauses n / max ms", "dropped slots", "late sends", "reasons"], rows, num_from=2,
                  caption=esc("the generator's own resolution: TTFT differences smaller than these lags are "
                              "not measurable (load_anchors §4.7)"))
