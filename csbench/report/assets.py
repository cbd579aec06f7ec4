"""The report's inline stylesheet and script. Kept apart so the HTML code reads as structure only.

The script does two things and nothing else: it checks that every chart actually rendered (each drawn mark
has a non-empty bounding box, which only a real layout engine can say) and marks the chart container with
data-rendered, so a headless browser test can assert on it; and it shows tooltips from data-tip attributes,
via textContent only, so a tooltip can never become markup.
"""

from __future__ import annotations

import base64
import hashlib

CSS = """
:root { --ok:#1a7f37; --warn:#b26b00; --bad:#c62828; --muted:#667; --line:#dde; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0; color: #1d1f24;
       background: #f6f7f9; }
main { max-width: 1220px; margin: 0 auto; padding: 16px 24px 48px; }
h1 { font-size: 22px; margin: 8px 0 4px; } h2 { font-size: 18px; margin: 0 0 6px; }
h3 { font-size: 15px; margin: 18px 0 6px; } h4 { font-size: 13px; margin: 12px 0 4px; color: #333; }
.sub { color: var(--muted); margin: 0 0 12px; }
.banner { padding: 12px 16px; border-radius: 6px; margin: 12px 0; font-weight: 600; color: #fff; }
.banner ul { margin: 6px 0 0 18px; padding: 0; font-weight: 400; }
.banner.invalid { background: var(--bad); font-size: 16px; border: 3px solid #7f0000; }
.banner.warn { background: var(--warn); } .banner.valid { background: var(--ok); }
.banner.unknown { background: #5b6270; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; font-weight: 700;
         color: #fff; vertical-align: middle; text-transform: uppercase; letter-spacing: .03em; }
.badge.valid { background: var(--ok); } .badge.warn { background: var(--warn); }
.badge.invalid { background: var(--bad); } .badge.unknown { background: #5b6270; }
section.job { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 16px 18px;
              margin: 18px 0; }
section.job.invalid { border: 3px solid var(--bad); }
.card { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 12px 16px; margin: 12px 0; }
table { border-collapse: collapse; margin: 4px 0 8px; font-size: 13px; }
th, td { border-bottom: 1px solid var(--line); padding: 3px 9px; text-align: left; vertical-align: top; }
th { background: #f0f2f5; font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td small, th small { color: var(--muted); font-weight: 400; }
.insuff { color: var(--warn); }
table.invalid { outline: 2px solid var(--bad); }
table.invalid caption { color: #fff; background: var(--bad); font-weight: 700; padding: 3px 8px; text-align: left; }
table.invalid td.num { color: var(--bad); text-decoration: line-through; text-decoration-color: rgba(198,40,40,.5); }
td.inv { color: var(--bad); font-weight: 700; }
td.inv-num { color: var(--bad); text-decoration: line-through; }
caption { caption-side: top; text-align: left; font-size: 12px; color: var(--muted); padding: 2px 0; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(460px, 1fr)); gap: 14px; }
figure.chart { margin: 0; background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 8px; }
figure.chart.invalid { border: 2px solid var(--bad); }
figure.chart svg { display: block; width: 100%; height: auto; }
figcaption.title { font-weight: 600; margin-bottom: 4px; }
figcaption.note { color: var(--muted); font-size: 12px; margin-top: 4px; }
.nodata { color: var(--muted); padding: 28px 8px; text-align: center; font-style: italic; }
svg .grid { stroke: #eceef2; } svg .axis, svg .tickmark { stroke: #889; }
svg .tick { font-size: 11px; fill: #556; } svg .label { font-size: 12px; fill: #333; }
svg .series .line { fill: none; stroke: currentColor; stroke-width: 1.8; }
svg .series circle { fill: currentColor; stroke: #fff; stroke-width: .6; }
svg .series circle.hit { fill: transparent; stroke: none; }
svg .series .whisker { stroke: currentColor; stroke-width: 1.2; fill: none; opacity: .75; }
svg .stamp { font-size: 54px; font-weight: 800; fill: rgba(198,40,40,.22); letter-spacing: .1em; }
.legend { font-size: 12px; margin-top: 2px; } .legend .key { margin-right: 12px; white-space: nowrap; }
.legend i { display: inline-block; width: 11px; height: 11px; border-radius: 2px; margin-right: 4px;
            vertical-align: -1px; }
pre { background: #f3f4f6; padding: 8px; border-radius: 4px; overflow-x: auto; font-size: 12px; margin: 4px 0; }
details > summary { cursor: pointer; font-weight: 600; margin: 8px 0 4px; }
.problems { color: var(--bad); }
.tip { position: fixed; pointer-events: none; background: #1d1f24; color: #fff; font-size: 12px; padding: 4px 8px;
       border-radius: 4px; max-width: 420px; z-index: 10; }
@media print { body { background: #fff; } .tip { display: none; } }
"""

JS = """
(function () {
  "use strict";
  var figures = document.querySelectorAll("figure.chart");
  for (var i = 0; i < figures.length; i++) {
    var fig = figures[i];
    if (fig.getAttribute("data-empty") === "true") { fig.setAttribute("data-rendered", "empty"); continue; }
    var marks = fig.querySelectorAll("svg g.series path.line, svg g.series circle");
    var drawn = 0;
    for (var j = 0; j < marks.length; j++) {
      var box = marks[j].getBBox();
      if (box.width > 0 || box.height > 0) { drawn++; }
    }
    fig.setAttribute("data-marks", String(drawn));
    fig.setAttribute("data-rendered", drawn > 0 ? "true" : "false");
  }
  var tip = document.createElement("div");
  tip.className = "tip";
  tip.hidden = true;
  document.body.appendChild(tip);
  document.addEventListener("mouseover", function (e) {
    var text = e.target && e.target.getAttribute ? e.target.getAttribute("data-tip") : null;
    if (text) { tip.textContent = text; tip.hidden = false; } else { tip.hidden = true; }
  });
  document.addEventListener("mousemove", function (e) {
    tip.style.left = (e.clientX + 12) + "px";
    tip.style.top = (e.clientY + 12) + "px";
  });
  document.body.setAttribute("data-report-ready", "true");
})();
"""


def script_hash() -> str:
    """CSP source for the one script we ship: anything else (an injected <script>) is refused by the browser."""
    return "sha256-" + base64.b64encode(hashlib.sha256(JS.encode()).digest()).decode()


def csp() -> str:
    # No network at all: the report must work offline and must not beacon anywhere when opened.
    return (f"default-src 'none'; style-src 'unsafe-inline'; script-src '{script_hash()}'; "
            "img-src data:; base-uri 'none'; form-action 'none'")
