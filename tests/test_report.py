"""`csbench report`: the input model, escaping, the CLI, and the charts as a real browser renders them."""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from csbench.cli import main
from csbench.report import Report, job_from_result, load_dir, render_report
from csbench.report.charts import ecdf, job_charts, sweep_runs
from csbench.report.model import observations_from

CHROMIUM = "/usr/bin/chromium"
HOSTILE = "<script>document.body.setAttribute('data-pwned','1')</script>"
HOSTILE_IMG = "<img src=x onerror=\"document.body.setAttribute('data-pwned','2')\">"


# -- sample inputs (the engine's contract, see docs/report.md) -------------------------------------------
def _stats(rng: random.Random, base: float, n: int) -> dict[str, Any]:
    xs = sorted(rng.lognormvariate(0, 0.25) * base for _ in range(max(n, 1)))
    q = lambda p: xs[min(len(xs) - 1, int(p * len(xs)))]  # noqa: E731
    return {"n": n, "mean": sum(xs) / len(xs), "std": base * 0.25, "min": xs[0], "p50": q(0.5), "p90": q(0.9),
            "p95": q(0.95), "p99": q(0.99), "p999": q(0.999), "max": xs[-1],
            "ci95": {"p50": [q(0.47), q(0.53)], "p90": [q(0.88), q(0.92)],
                     "p99": [q(0.984), q(0.997)] if n >= 370 else "insufficient"}}


def _selfcheck(verdict: str, *, lag: float = 0.4, cpu: float = 0.3, reasons: list[str] | None = None) -> dict:
    return {"verdict": verdict, "reasons": reasons or [], "sched_lag_ms": {"p50": lag / 3, "p99": lag, "max": lag * 4},
            "loop_lag_ms": {"p50": 0.1, "p99": lag, "max": lag * 5}, "cpu_share": cpu,
            "gc_pause_ms": {"count": 0, "max": 0, "total": 0}, "dropped_slots": 0, "late_sends": 0}


def _summary(rng: random.Random, level: int, ttft: float, *, verdict: str = "valid", n: int = 400,
             errors: int = 0, reasons: list[str] | None = None, lag: float = 0.4, cpu: float = 0.3) -> dict:
    duration = 30
    return {
        "load": {"model": "closed", "concurrency": level}, "window": {"start_s": 5, "end_s": 5 + duration},
        "counts": {"offered": n, "sent": n, "completed": n - errors, "dropped": 0, "late": 0,
                   "errors": {"http_429": errors} if errors else {}},
        "rates": {"offered_per_s": n / duration, "achieved_send_per_s": n / duration * 0.995,
                  "completed_per_s": (n - errors) / duration},
        "latency_ms": {"ttft": _stats(rng, ttft, n), "ttft_service": _stats(rng, ttft * 0.97, n),
                       "e2e": _stats(rng, ttft * 3, n), "queue_delay": _stats(rng, 0.3, n)},
        "errors": {"http_429": {"n": errors, "rate": errors / n, "wilson95": [errors / n * 0.6, errors / n * 1.5 + 0.001]}}
        if errors else {},
        "phases": {"cold": {"ttft": _stats(rng, ttft * 6, 3)}, "warmup": {"ttft": _stats(rng, ttft * 1.3, 20)},
                   "steady": {"ttft": _stats(rng, ttft, n)}},
        "selfcheck": _selfcheck(verdict, lag=lag, cpu=cpu, reasons=reasons),
        "hdr": {"ttft": "SElTVEZBQ1RPUlk="},
        "timeseries": [{"t_s": t, "offered": n / duration, "sent": n / duration, "completed": n / duration,
                        "errors": 0, "http_429": 0, "inflight": level,
                        "ttft_p50_ms": ttft * rng.uniform(0.95, 1.05), "ttft_p99_ms": ttft * rng.uniform(1.6, 1.9),
                        "cpu_share": cpu * rng.uniform(0.9, 1.1), "loop_lag_p99_ms": lag * rng.uniform(0.8, 1.2)}
                       for t in range(0, duration, 2)],
        "future_field": {"ignored": True},
    }


def _result(job_id: str, observations: dict, *, status: str = "succeeded", **extra: Any) -> dict[str, Any]:
    return {"schema": "csbench.dev/v1", "kind": "Result", "job_id": job_id, "attempt": 1, "status": status,
            "carrier_id": "carrier-a", "finished_at": "2025-12-02T12:00:00Z", "observations": observations, **extra}


def _envelope(kind: str, runs: list[dict], **over: Any) -> dict[str, Any]:
    doc = {"kind": kind, "params": {"duration_s": 30},
           "vantage": {"carrier_id": "carrier-a", "instance_id": "i-123", "instance_type": "ecs.c7.large",
                       "zone": "cn-hangzhou-i", "image_id": "debian_12", "region": "cn-hangzhou", "in_vpc": True,
                       "package_version": "0.1.0"},
           "provenance": {"csbench_version": "0.1.0", "python": "3.11.2", "aiohttp": "3.9.5", "uvloop": "0.19.0",
                          "started_at": "2025-12-02T11:58:00Z", "finished_at": "2025-12-02T12:00:00Z",
                          "spec_sha256": "ab" * 32},
           "runs": runs, "findings": {}, "verdict": "valid", "verdict_reasons": []}
    doc.update(over)
    return doc


def sweep_result() -> dict[str, Any]:
    rng = random.Random(1)
    runs = [{"label": f"c{c}", "level": {"concurrency": c},
             "summary": _summary(rng, c, 110 + 12 * c * c / 4, n=[400, 780, 1450, 1900][i], errors=[0, 0, 2, 9][i])}
            for i, c in enumerate((1, 2, 4, 8))]
    return _result("20251202-sweep", _envelope("concurrency_ceiling", runs, findings={
        "last_passing_concurrency": 4, "first_failing_concurrency": 8}))


def ttft_result() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    rng = random.Random(2)
    run = {"label": "steady", "level": {}, "summary": _summary(rng, 1, 120, n=300)}
    t0 = 10**12
    samples = [{"seq": i, "phase": "cold" if i < 3 else "steady", "t_intended_ns": t0 + i * 100_000_000,
                "t_send_ns": t0 + i * 100_000_000 + 200_000, "ttft_ms": rng.gauss(700 if i < 3 else 120, 12),
                "e2e_ms": rng.gauss(360, 30), "error_class": None} for i in range(303)]
    samples.append({"seq": 303, "phase": "steady", "t_intended_ns": t0 + 303 * 100_000_000, "error_class": "http_5xx"})
    return _result("20251202-ttft", _envelope("ttft", [run], findings={"cold_penalty_ms": 580.2})), samples


def invalid_result() -> dict[str, Any]:
    rng = random.Random(3)
    why = "generator CPU 91% > 75% (FAIL)"
    run = {"label": "rate-2000", "level": {"rate": 2000},
           "summary": _summary(rng, 1, 300, verdict="fail", lag=14.0, cpu=0.91, reasons=[why])}
    return _result("20251202-overload", _envelope("sustained_load", [run], verdict="invalid",
                                                  verdict_reasons=["self-check failed in the steady window"]))


def legacy_result() -> dict[str, Any]:
    rng = random.Random(4)
    samples = [{"session_id": "csb-1", "ok": True, "headers_ms": 40.0, "status": 200, "first_event_ms": 90.0,
                "ttft_ms": rng.gauss(120, 15), "total_ms": 250.0, "index": i + 1, "warmup": False} for i in range(5)]
    samples.append({"session_id": "csb-1", "ok": False, "error": "http_503", "error_message": "boom",
                    "index": 6, "warmup": False})
    ttfts = sorted(s["ttft_ms"] for s in samples if s["ok"])
    return _result("20251202-legacy", {"samples": samples, "ttft_ms": {"n": 5, "p50": ttfts[2], "p90": ttfts[4],
                                                                        "max": ttfts[4], "method": "nearest-rank"},
                                       "errors": {"http_503": 1}, "session": "per_job"})


def hostile_result() -> dict[str, Any]:
    rng = random.Random(5)
    summary = _summary(rng, 1, 100, verdict="warn", reasons=[HOSTILE])
    summary["errors"] = {HOSTILE_IMG: {"n": 1, "rate": 0.01, "wilson95": [0.0, 0.05]}}
    run = {"label": HOSTILE, "level": {"concurrency": 1}, "summary": summary}
    obs = _envelope(HOSTILE, [run, {**run, "label": HOSTILE_IMG, "level": {"concurrency": 2}}],
                    params={"prompt": HOSTILE}, findings={HOSTILE: HOSTILE_IMG}, verdict_reasons=[HOSTILE])
    obs["vantage"]["instance_type"] = HOSTILE_IMG
    return _result("20251202-hostile", obs, message=HOSTILE, reason=HOSTILE_IMG)


def write_campaign(folder: Path, *, hostile: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    ttft, samples = ttft_result()
    docs = {"sweep": sweep_result(), "ttft": ttft, "invalid": invalid_result(), "legacy": legacy_result()}
    if hostile:
        docs["hostile"] = hostile_result()
    for name, doc in docs.items():
        (folder / f"{name}.json").write_text(json.dumps(doc))
    (folder / "ttft.ndjson").write_text("".join(json.dumps(s) + "\n" for s in samples))
    (folder / "manifest.json").write_text(json.dumps({"kind": "TelemetryManifest"}))  # not a Result: skipped
    return folder


# -- model -----------------------------------------------------------------------------------------------
def test_sweep_job_validates_with_four_runs_and_tolerates_extra_fields() -> None:
    job = job_from_result(sweep_result())
    assert job.problems == []
    assert [r.level_axis for r in job.observations.runs] == [("concurrency", c) for c in (1.0, 2.0, 4.0, 8.0)]
    axis, runs = sweep_runs(job)  # type: ignore[misc]
    assert axis == "concurrency" and len(runs) == 4
    ttft = job.observations.runs[0].summary.latency_ms["ttft"]
    assert isinstance(ttft.ci95["p50"], tuple) and isinstance(ttft.ci95["p99"], tuple)
    cold = job.observations.runs[0].summary.phases["cold"]["ttft"]
    assert cold.n == 3 and cold.ci95["p99"] == "insufficient"
    assert job.observations.runs[3].summary.errors["http_429"].wilson95 is not None
    assert job.verdict == "valid"
    load, timeline = job_charts(job)
    assert [c.chart_id for c in load] == ["ttft-level", "throughput", "errors", "ttft-cdf", "e2e-cdf"]
    assert [c.chart_id for c in timeline] == ["ttft-time", "loop-lag-time", "cpu-time"]


def test_ttft_job_uses_raw_samples_and_keeps_cold_apart() -> None:
    doc, samples = ttft_result()
    job = job_from_result(doc, samples=samples)
    (run,) = job.observations.runs
    assert len(run.samples) == len(samples)
    assert run.summary.phases["cold"]["ttft"].n == 3
    cdf = next(c for c in job_charts(job)[0] if c.chart_id == "ttft-cdf")
    names = [s.name for s in cdf.series]
    assert names == ["steady (n=300)", "cold starts (n=3)"]  # the failed request is in neither
    assert cdf.series[0].points[-1][1] == 1.0 and "raw samples" in cdf.note


def test_invalid_run_invalidates_job_and_report() -> None:
    job = job_from_result(invalid_result())
    assert job.observations.runs[0].verdict == "invalid"  # "fail" normalised
    assert job.verdict == "invalid"
    assert any("CPU 91%" in r for r in job.verdict_reasons())
    report = Report(jobs=[job_from_result(sweep_result()), job])
    assert report.verdict == "invalid"


def test_failed_job_is_invalid_even_without_observations() -> None:
    job = job_from_result(_result("j", {}, status="failed", reason="ProbeError", message="boom"))
    assert job.verdict == "invalid" and "ProbeError" in job.verdict_reasons()[0]


def test_legacy_compact_ttft_shape_becomes_one_run() -> None:
    job = job_from_result(legacy_result())
    assert job.observations.legacy and job.observations.kind == "ttft"
    (run,) = job.observations.runs
    assert run.summary.latency_ms["ttft"].n == 5 and run.summary.latency_ms["ttft"].p99 is None
    assert len(run.samples) == 6 and run.summary.counts.errors == {"http_503": 1}
    assert job.verdict == "unknown"  # no self-check: unverified, never "valid"
    cdf = next(c for c in job_charts(job)[0] if c.chart_id == "ttft-cdf")
    assert len(cdf.series[0].points) == 6  # 5 ok samples + the origin


def test_malformed_run_is_salvaged_and_reported() -> None:
    good = sweep_result()["observations"]["runs"][0]
    obs, problems = observations_from({"kind": "scaling", "verdict": "valid", "runs": [good, {"summary": 7}]})
    assert len(obs.runs) == 1 and problems and obs.verdict == "warn"


def test_odd_values_are_dropped_not_fatal() -> None:
    run = sweep_result()["observations"]["runs"][0]
    run["summary"]["timeseries"].append({"ttft_p50_ms": 3})  # no t_s
    run["summary"]["errors"] = {"x": {"n": 1, "rate": 0.1, "wilson95": "n/a"}}
    run["level"] = {"profile": "burst"}
    obs, problems = observations_from({"kind": "scaling", "runs": [run]})
    assert problems == [] and obs.runs[0].level_axis is None
    assert obs.runs[0].summary.errors["x"].wilson95 is None and len(obs.runs[0].summary.timeseries) == 15


def test_ecdf_thins_to_observed_values() -> None:
    xs = [float(i) for i in range(10_000)]
    pts = ecdf(xs)
    assert len(pts) <= 401 and pts[-1] == (9999.0, 1.0) and all(x in set(xs) for x, _ in pts)


# -- rendering -------------------------------------------------------------------------------------------
def test_render_escapes_hostile_strings() -> None:
    html = render_report(Report(campaign=HOSTILE, source=HOSTILE_IMG, jobs=[job_from_result(hostile_result())]))
    assert html.count("<script") == 1  # ours, at the end of the body
    assert "<img" not in html and "onerror=\"" not in html
    assert "&lt;script&gt;document.body.setAttribute(&#x27;data-pwned&#x27;,&#x27;1&#x27;)&lt;/script&gt;" in html
    # Defence in depth: the CSP admits only our script, by hash.
    assert "script-src &#x27;sha256-" in html


def test_invalid_run_is_impossible_to_miss() -> None:
    html = render_report(Report(jobs=[job_from_result(invalid_result()), job_from_result(sweep_result())]))
    assert 'class="banner invalid" id="verdict" role="alert"' in html
    assert "generator CPU 91% &gt; 75% (FAIL)" in html
    table = re.search(r'<table class="latency invalid">.*?</table>', html)
    assert table and "INVALID" in table.group(0) and table.group(0).count('<td class="inv">INVALID</td>') == 4
    assert "CI: insufficient n" in html  # cold phase with n=3


# -- CLI and browser -------------------------------------------------------------------------------------
def test_cli_from_dir_writes_report(tmp_path: Path) -> None:
    folder = write_campaign(tmp_path / "results")
    out = tmp_path / "out" / "report.html"
    assert main(["report", "--from-dir", str(folder), "--campaign-uid", "camp-1", "-o", str(out)]) == 0
    report = load_dir(folder)
    assert len(report.jobs) == 5 and report.problems == []
    html = out.read_text()
    assert "csbench report: camp-1" in html
    # Self-contained: nothing the browser would fetch (no src/href to a host, no CSS url() or @import).
    assert not re.search(r"""(?:src|href)=["']?(?:https?:)?//|url\(|@import""", html)


def _chromium() -> str:
    path = shutil.which("chromium") or (CHROMIUM if Path(CHROMIUM).exists() else None)
    if path is None:
        pytest.fail("chromium is not installed; the report's browser test needs it. Install Debian's package "
                    "as root: `apt-get install -y chromium` (listed in .ci/apt-packages; `make system-deps`).")
    return path


def test_report_renders_charts_in_headless_chromium(tmp_path: Path) -> None:
    browser = _chromium()
    folder = write_campaign(tmp_path / "results")
    out = tmp_path / "report.html"
    assert main(["report", "--from-dir", str(folder), "-o", str(out)]) == 0
    proc = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
         "--dump-dom", out.as_uri()], capture_output=True, text=True, timeout=120)
    dom = proc.stdout
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Uncaught" not in proc.stderr, proc.stderr[-2000:]
    assert 'data-report-ready="true"' in dom, "the report's script did not run"
    assert "data-pwned" not in dom.replace("&#x27;data-pwned&#x27;", "").replace("'data-pwned'", ""), \
        "a hostile string executed"
    figures = re.findall(r'<figure class="chart[^"]*" data-chart="([^"]+)"([^>]*)>', dom)
    rendered = [(cid, attrs) for cid, attrs in figures if 'data-empty="true"' not in attrs]
    assert len(rendered) >= 15, figures
    not_drawn = [cid for cid, attrs in rendered if 'data-rendered="true"' not in attrs]
    assert not not_drawn, f"charts without visible marks: {not_drawn}"
    marks = [int(m) for m in re.findall(r'data-marks="(\d+)"', dom)]
    assert marks and min(marks) > 0
    assert re.search(r'<path class="line" d="M[0-9.]+,[0-9.]+[LH]', dom), "no non-empty line paths"


# -- from a campaign channel (in-memory store: the same documents and keys as in OSS) ---------------------
class MemoryStore:
    """Just enough of BlobStore for CampaignChannel's read side: get, put and a LIST with delimiter."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    def get(self, key: str) -> Any:
        from csbench.probe.blobstore import Blob

        body = self.objects.get(key)
        return None if body is None else Blob(body=body, etag=hashlib.md5(body).hexdigest())

    def put(self, key: str, body: bytes, content_type: str = "application/json") -> str:
        self.objects[key] = body
        return hashlib.md5(body).hexdigest()

    def list(self, prefix: str, delimiter: str = "") -> Any:
        from csbench.probe.blobstore import ObjectInfo

        seen = set()
        for key in sorted(k for k in self.objects if k.startswith(prefix)):
            rest = key[len(prefix):]
            if delimiter and delimiter in rest:
                key = prefix + rest.split(delimiter, 1)[0] + delimiter
                if key in seen:
                    continue
                seen.add(key)
            yield ObjectInfo(key=key, etag="", size=0, last_modified=0)


def test_load_channel_reads_results_specs_and_verified_telemetry() -> None:
    from csbench.probe.control import CampaignChannel
    from csbench.probe.protocol import Keys, TelemetryChunk, TelemetryManifest
    from csbench.probe.telemetry import encode_chunk
    from csbench.report import load_channel

    store, keys = MemoryStore(), Keys("camp-1")
    doc, samples = ttft_result()
    job_id = "20251202-ttft"
    chunk = encode_chunk(samples)
    chunk_key = keys.telemetry_dir(job_id, 1) + "samples-00000.ndjson"
    store.put(chunk_key, chunk)
    manifest = TelemetryManifest(job_id=job_id, attempt=1, chunks=[TelemetryChunk(
        stream="samples", key=chunk_key, records=len(samples), sha256=hashlib.sha256(chunk).hexdigest(),
        bytes=len(chunk))])
    store.put(keys.telemetry_dir(job_id, 1) + "manifest.json", manifest.to_bytes())
    store.put(keys.result(job_id), json.dumps({**doc, "job_id": job_id, "telemetry_manifest":
                                               keys.telemetry_dir(job_id, 1) + "manifest.json"}).encode())
    store.put(keys.spec(job_id), json.dumps({
        "schema": "csbench.dev/v1", "kind": "JobSpec", "job_id": job_id, "campaign_uid": "camp-1", "probe": "ttft",
        "target": {"url": "http://agentrun.local:9000/"}, "timeout_s": 60,
        "created_at": "2025-12-02T11:57:00Z"}).encode())
    store.put(keys.result("20251202-legacy"), json.dumps({**legacy_result(), "job_id": "20251202-legacy"}).encode())
    store.put(keys.spec("20251202-queued"), b"{not json")  # no result and an unreadable spec: noted, not fatal

    report = load_channel(CampaignChannel(store, "camp-1"), source="memory")  # type: ignore[arg-type]
    assert [j.job_id for j in report.jobs] == ["20251202-legacy", "20251202-ttft"]
    ttft = report.jobs[1]
    assert ttft.target == "http://agentrun.local:9000/openai/v1/chat/completions"
    assert len(ttft.observations.runs[0].samples) == len(samples)
    assert any("20251202-queued" in p for p in report.problems)
    assert report.campaign == "camp-1"

    store.put(chunk_key, chunk.replace(b"steady", b"STEADY", 1))  # altered after upload: sha256 mismatch
    report = load_channel(CampaignChannel(store, "camp-1"), source="memory")  # type: ignore[arg-type]
    assert report.jobs[1].observations.runs[0].samples == []  # charts fall back to the summaries
    assert any("telemetry not used" in p and "sha256" in p for p in report.problems)


def test_engine_phase_blocks_keep_their_latency_metrics() -> None:
    from csbench.report.model import RunSummary

    stats = {"n": 4, "p50": 910.0, "p90": 930.0, "max": 940.0}
    run = RunSummary.model_validate({"phases": {
        "cold": {"counts": {"sent": 4}, "latency_ms": {"ttft": stats}, "errors": {}},
        "steady": {"ttft": stats},  # the flat shape still reads
    }})
    assert set(run.phases) == {"cold", "steady"}
    assert run.phases["cold"]["ttft"].p50 == 910.0 and run.phases["steady"]["ttft"].n == 4
