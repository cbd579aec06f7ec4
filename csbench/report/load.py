"""Gather a campaign's results into a `Report`: from a folder of Result JSON files, or from OSS.

Neither source may stop the report: an unreadable file or a missing telemetry chunk becomes a line in the
report's problems list and the rest renders. Telemetry is optional by design — the summaries are enough for
every table; raw samples only sharpen the distribution charts.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from csbench.report.model import Job, Report, job_from_result

MAX_FILE_BYTES = 64 << 20  # a Result with thousands of compact samples is a few MB; refuse anything absurd


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _read_ndjson(path: Path, problems: list[str]) -> list[dict[str, Any]]:
    records = []
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"{path}: line {n} is not JSON ({exc.msg}); skipped")
            continue
        if isinstance(rec, dict):
            records.append(rec)
    return records


def _telemetry_near(result_path: Path, job_id: str, problems: list[str]) -> list[dict[str, Any]]:
    """NDJSON records that belong to a result file, by either layout we write or mirror:

    - `<name>.ndjson` next to `<name>.json` (one file per job, as the demo writes them);
    - `telemetry/<NNNN>/*.ndjson` next to `result.json` (a copy of the bucket's jobs/<job>/ folder): the
      highest attempt only, since earlier attempts were superseded.
    """
    sibling = result_path.with_suffix(".ndjson")
    if sibling.is_file():
        return _read_ndjson(sibling, problems)
    tele = result_path.parent / "telemetry"
    if tele.is_dir():
        attempts = sorted(p for p in tele.iterdir() if p.is_dir())
        if attempts:
            return [r for f in sorted(attempts[-1].glob("*.ndjson")) for r in _read_ndjson(f, problems)]
    return []


def _spec_target(result_path: Path) -> tuple[str | None, str | None]:
    """(target URL, campaign uid) from a spec.json next to the result, when the folder mirrors the bucket."""
    spec = result_path.parent / "spec.json"
    if result_path.name != "result.json" or not spec.is_file():
        return None, None
    try:
        doc = json.loads(spec.read_text())
        target = doc.get("target") or {}
        url = str(target.get("url", "")).rstrip("/") + str(target.get("path", "")) if target.get("url") else None
        return url, doc.get("campaign_uid")
    except (OSError, ValueError, AttributeError):
        return None, None


def load_dir(folder: Path, *, campaign: str | None = None) -> Report:
    """Every Result document under `folder` (recursively); other JSON files (specs, manifests) are skipped."""
    problems: list[str] = []
    jobs: list[Job] = []
    campaigns: set[str] = set()
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a directory")
    for path in sorted(folder.rglob("*.json")):
        if path.stat().st_size > MAX_FILE_BYTES:
            problems.append(f"{path}: {path.stat().st_size} bytes, over the {MAX_FILE_BYTES}-byte limit; skipped")
            continue
        try:
            doc = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            problems.append(f"{path}: not readable JSON ({exc}); skipped")
            continue
        if not isinstance(doc, dict) or doc.get("kind") != "Result":
            continue
        target, uid = _spec_target(path)
        if uid:
            campaigns.add(str(uid))
        jobs.append(job_from_result(doc, target=target, samples=_telemetry_near(path, str(doc.get("job_id")),
                                                                                 problems)))
    if not jobs:
        problems.append(f"no Result documents (JSON with \"kind\": \"Result\") under {folder}")
    name = campaign or (campaigns.pop() if len(campaigns) == 1 else folder.name)
    return Report(campaign=name, source=str(folder), generated_at=_now(), jobs=_sorted(jobs), problems=problems)


def load_channel(channel: Any, *, source: str, with_telemetry: bool = True) -> Report:
    """Every job of a campaign through a `CampaignChannel` (list_jobs, fetch_telemetry)."""
    from csbench.probe.control import TelemetryError

    problems: list[str] = []
    jobs: list[Job] = []
    for detail in channel.list_jobs():
        problems += [f"{p.key}: {p.reason}" for p in detail.problems]
        if detail.result is None:
            problems.append(f"job {detail.job_id}: no result yet (state {detail.state}); not in the report")
            continue
        target = None
        if detail.spec is not None:
            target = detail.spec.target.url.rstrip("/") + detail.spec.target.path
        samples: list[dict[str, Any]] = []
        if with_telemetry and detail.result.telemetry_manifest:
            try:
                samples = channel.fetch_telemetry(detail.job_id, detail.result.attempt)
            except TelemetryError as exc:
                problems.append(f"job {detail.job_id}: telemetry not used ({exc}); charts use the summaries")
        doc = detail.result.model_dump(mode="json", by_alias=True)
        jobs.append(job_from_result(doc, target=target, samples=samples))
    return Report(campaign=channel.campaign_uid if hasattr(channel, "campaign_uid") else "", source=source,
                  generated_at=_now(), jobs=_sorted(jobs), problems=problems)


def _sorted(jobs: list[Job]) -> list[Job]:
    # Job ids are time-ordered (new_job_id), so this is dispatch order.
    return sorted(jobs, key=lambda j: j.job_id)
