"""`csbench report`: one self-contained HTML file (inline CSS, SVG and a small script) from a campaign's results.

model  — lenient pydantic input model of Result.observations (today's compact ttft shape included)
load   — build a Report from a folder of Result JSON files or from a campaign in OSS
charts — which charts a job gets (pure: Job → svg.Chart)
svg    — the chart primitive, rendered to inline SVG
render — the HTML page (pure: Report → str)
assets — the inline stylesheet and script, and the Content-Security-Policy that pins that script
"""

from __future__ import annotations

from csbench.report.load import load_channel, load_dir
from csbench.report.model import Job, Report, job_from_result
from csbench.report.render import render_report

__all__ = ["Job", "Report", "job_from_result", "load_channel", "load_dir", "render_report"]
