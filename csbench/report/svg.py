"""Inline SVG charts as pure functions of their data: no library, no CDN, nothing fetched when viewed.

One chart type covers what the report needs — x/y series drawn as lines, steps (CDFs) or points, with
optional whiskers for confidence intervals. Every label and tooltip goes through `esc`, so a hostile string
in a result can only ever appear as text.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Literal

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#17becf", "#8c564b", "#e377c2")
W, H = 560, 280
ML, MR, MT, MB = 60, 14, 12, 40  # margins: room for y tick labels on the left and the x label below


def esc(value: object) -> str:
    return escape(str(value), quote=True)


@dataclass(frozen=True)
class Series:
    name: str
    points: Sequence[tuple[float, float]]
    mode: Literal["line", "step", "scatter", "linepoints"] = "line"
    whiskers: Sequence[tuple[float, float, float]] = ()  # (x, lo, hi): a CI drawn as a vertical bar
    tips: Sequence[str] = ()  # one tooltip per point (shown by the report's small script)
    dashed: bool = False
    color: str | None = None


@dataclass(frozen=True)
class Axis:
    label: str
    log: bool = False
    ticks: Sequence[float] = ()  # explicit ticks (e.g. the levels of a sweep); else "nice" ones
    zero: bool = True  # start at 0 (linear axes) so bars of different runs compare honestly
    fmt: str = "g"


@dataclass(frozen=True)
class Chart:
    chart_id: str
    title: str
    x: Axis
    y: Axis
    series: Sequence[Series]
    note: str = ""  # the caption's small print: where the data came from, what is approximate
    invalid: bool = False  # draw the chart but stamp it: its numbers come from a saturated generator
    extra_classes: Sequence[str] = field(default_factory=tuple)


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values (1, 2, 5 × 10^k steps) covering [lo, hi]."""
    if not math.isfinite(lo) or not math.isfinite(hi):
        return [0.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks, t = [], start
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    if ticks[-1] < hi:
        ticks.append(round(t, 12))
    return ticks


def _log_ticks(lo: float, hi: float) -> list[float]:
    ticks = [10.0 ** k for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)]
    return ticks if len(ticks) >= 2 else [lo, hi]


def fmt_num(value: float, spec: str = "g") -> str:
    if spec == "%":
        return f"{value * 100:.3g}%"
    if abs(value) >= 10_000:
        return f"{value / 1000:.0f}k"
    return f"{value:.4g}"


class _Scale:
    def __init__(self, axis: Axis, values: list[float], a: float, b: float):
        self.log = axis.log and all(v > 0 for v in values) and bool(values)
        if axis.ticks:
            ticks = sorted(set(float(t) for t in axis.ticks))
            lo, hi = min(ticks + values), max(ticks + values)
        else:
            lo, hi = min(values), max(values)
            if axis.zero and not self.log:
                lo = min(0.0, lo)
            ticks = _log_ticks(lo, hi) if self.log else nice_ticks(lo, hi)
            lo, hi = min(lo, ticks[0]), max(hi, ticks[-1])
        if self.log:
            lo, hi = math.log10(lo), math.log10(hi)
        if hi <= lo:
            hi = lo + 1.0
        self.lo, self.hi, self.a, self.b, self.ticks = lo, hi, a, b, ticks

    def __call__(self, v: float) -> float:
        v = math.log10(v) if self.log else v
        return self.a + (v - self.lo) / (self.hi - self.lo) * (self.b - self.a)


def _finite(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in points if x is not None and y is not None
            and math.isfinite(x) and math.isfinite(y)]


def render_chart(chart: Chart) -> str:
    """A <figure> with the SVG, its legend and caption. Empty data renders an explicit 'no data' figure."""
    series = [s for s in chart.series if _finite(s.points)]
    classes = " ".join(["chart", *chart.extra_classes, *(["invalid"] if chart.invalid else [])])
    empty = ' data-empty="true"' if not series else ""
    head = (f'<figure class="{esc(classes)}" data-chart="{esc(chart.chart_id)}"{empty} data-rendered="false">'
            f'<figcaption class="title">{esc(chart.title)}</figcaption>')
    if not series:
        return head + f'<div class="nodata">no data{": " + esc(chart.note) if chart.note else ""}</div></figure>'
    xs = [x for s in series for x, _ in _finite(s.points)] + [w[0] for s in series for w in s.whiskers]
    ys = [y for s in series for _, y in _finite(s.points)] + [v for s in series for w in s.whiskers
                                                              for v in w[1:]]
    sx = _Scale(chart.x, [x for x in xs if math.isfinite(x)], ML, W - MR)
    sy = _Scale(chart.y, [y for y in ys if math.isfinite(y)], H - MB, MT)
    parts = [f'<svg viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
             f'aria-label="{esc(chart.title)}" xmlns="http://www.w3.org/2000/svg">']
    parts += _axes(chart, sx, sy)
    for i, s in enumerate(series):
        parts.append(_series(s, s.color or PALETTE[i % len(PALETTE)], sx, sy))
    if chart.invalid:
        # Stamped over the plot: the shape may look plausible, but it measured the generator.
        parts.append(f'<text class="stamp" x="{(ML + W - MR) / 2:.1f}" y="{(MT + H - MB) / 2:.1f}" '
                     'text-anchor="middle" dominant-baseline="middle">INVALID</text>')
    parts.append("</svg>")
    legend = "".join(f'<span class="key"><i style="background:{esc(s.color or PALETTE[i % len(PALETTE)])}">'
                     f'</i>{esc(s.name)}</span>' for i, s in enumerate(series)) if len(series) > 1 else ""
    note = f'<figcaption class="note">{esc(chart.note)}</figcaption>' if chart.note else ""
    return head + "".join(parts) + (f'<div class="legend">{legend}</div>' if legend else "") + note + "</figure>"


def _axes(chart: Chart, sx: _Scale, sy: _Scale) -> list[str]:
    out = ['<g class="axes">']
    for t in sy.ticks:
        y = sy(t)
        out.append(f'<line class="grid" x1="{ML}" x2="{W - MR}" y1="{y:.1f}" y2="{y:.1f}"/>'
                   f'<text class="tick" x="{ML - 6}" y="{y:.1f}" text-anchor="end" dominant-baseline="middle">'
                   f'{esc(fmt_num(t, chart.y.fmt))}</text>')
    for t in sx.ticks:
        x = sx(t)
        out.append(f'<line class="tickmark" x1="{x:.1f}" x2="{x:.1f}" y1="{H - MB}" y2="{H - MB + 4}"/>'
                   f'<text class="tick" x="{x:.1f}" y="{H - MB + 15}" text-anchor="middle">'
                   f'{esc(fmt_num(t, chart.x.fmt))}</text>')
    out.append(f'<line class="axis" x1="{ML}" x2="{W - MR}" y1="{H - MB}" y2="{H - MB}"/>'
               f'<line class="axis" x1="{ML}" x2="{ML}" y1="{MT}" y2="{H - MB}"/>'
               f'<text class="label" x="{(ML + W - MR) / 2:.1f}" y="{H - 6}" text-anchor="middle">'
               f'{esc(chart.x.label)}</text>'
               f'<text class="label" transform="translate(14 {(MT + H - MB) / 2:.1f}) rotate(-90)" '
               f'text-anchor="middle">{esc(chart.y.label)}</text></g>')
    return out


def _series(s: Series, color: str, sx: _Scale, sy: _Scale) -> str:
    pts = _finite(s.points)
    out = [f'<g class="series" data-series="{esc(s.name)}" style="color:{esc(color)}">']
    if s.mode in ("line", "linepoints", "step") and len(pts) >= 1:
        d, first = [], True
        prev_y = None
        for x, y in pts:
            px, py = sx(x), sy(y)
            if first:
                d.append(f"M{px:.1f},{py:.1f}")
                first = False
            elif s.mode == "step":  # a CDF is flat until the next observation, then jumps
                d.append(f"H{px:.1f}V{py:.1f}")
            else:
                d.append(f"L{px:.1f},{py:.1f}")
            prev_y = py
        if len(pts) == 1 and prev_y is not None:  # one point still draws a visible mark
            d.append("h0.01")
        dash = ' stroke-dasharray="5 4"' if s.dashed else ""
        out.append(f'<path class="line" d="{"".join(d)}"{dash}/>')
    for x, lo, hi in s.whiskers:
        if all(math.isfinite(v) for v in (x, lo, hi)):
            px = sx(x)
            out.append(f'<path class="whisker" d="M{px:.1f},{sy(lo):.1f}V{sy(hi):.1f}'
                       f'M{px - 4:.1f},{sy(lo):.1f}h8M{px - 4:.1f},{sy(hi):.1f}h8"/>')
    if s.mode in ("scatter", "linepoints") or s.tips:
        r = 2.2 if s.mode == "scatter" and len(pts) > 200 else 3.2
        for i, (x, y) in enumerate(pts):
            tip = s.tips[i] if i < len(s.tips) else f"{s.name}: {fmt_num(x)}, {fmt_num(y)}"
            hidden = "" if s.mode in ("scatter", "linepoints") else ' class="hit"'
            out.append(f'<circle{hidden} cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="{r}" data-tip="{esc(tip)}"/>')
    out.append("</g>")
    return "".join(out)
