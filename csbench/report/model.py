"""The report's input model: what a job's Result.observations may hold, validated leniently.

The measurement engine writes these documents and evolves them; the report must render today's results and
tomorrow's. So every model ignores unknown fields, every field has a default, and a value of the wrong
shape becomes "absent" plus a note in `problems` rather than an exception: a report that refuses to render
because one number is malformed helps nobody. The one thing never relaxed is the verdict — anything we cannot
read as valid is shown as such, not silently promoted.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

Verdict = Literal["valid", "warn", "invalid", "unknown"]
_VERDICT_RANK = {"valid": 0, "unknown": 1, "warn": 2, "invalid": 3}

# Canonical metric order: the headline first, then the others by the anchoring in load_anchors.md §4.3.
METRICS = ("ttft", "ttft_service", "ttfe", "ttfb_headers", "ttfc", "e2e", "e2e_service", "queue_delay",
           "tpot", "itl_event", "max_stall")
PHASES = ("cold", "warmup", "steady")


def normalize_verdict(value: Any) -> Verdict:
    """The engine says valid/warn/invalid; a self-check table says pass/warn/fail. One vocabulary here."""
    text = str(value or "").strip().lower()
    if text in {"valid", "pass", "ok", "passed"}:
        return "valid"
    if text in {"warn", "warning"}:
        return "warn"
    if text in {"invalid", "fail", "failed", "error"}:
        return "invalid"
    return "unknown"


def worst(*verdicts: Verdict) -> Verdict:
    return max(verdicts, key=_VERDICT_RANK.__getitem__, default="unknown")


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


CI = tuple[float, float] | Literal["insufficient"] | None


class LatencyStats(_Lenient):
    n: int | None = None
    mean: float | None = None
    std: float | None = None
    min: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    p999: float | None = None
    max: float | None = None
    ci95: dict[str, CI] = Field(default_factory=dict)

    @field_validator("ci95", mode="before")
    @classmethod
    def _ci(cls, value: Any) -> dict[str, Any]:
        # Keep what parses; anything else is "no CI reported", which renders as a dash.
        out: dict[str, Any] = {}
        for key, ci in (value or {}).items() if isinstance(value, dict) else ():
            if isinstance(ci, str) and ci.lower() == "insufficient":
                out[str(key)] = "insufficient"
            elif isinstance(ci, list | tuple) and len(ci) == 2 and all(isinstance(v, int | float) for v in ci):
                out[str(key)] = (float(ci[0]), float(ci[1]))
        return out


class Lag(_Lenient):
    p50: float | None = None
    p99: float | None = None
    max: float | None = None


class GcPause(_Lenient):
    count: int | None = None
    max: float | None = None
    total: float | None = None


class SelfCheck(_Lenient):
    verdict: Verdict = "unknown"
    reasons: list[str] = Field(default_factory=list)
    sched_lag_ms: Lag = Field(default_factory=Lag)
    loop_lag_ms: Lag = Field(default_factory=Lag)
    cpu_share: float | None = None
    gc_pause_ms: GcPause = Field(default_factory=GcPause)
    dropped_slots: int | None = None
    late_sends: int | None = None

    @field_validator("verdict", mode="before")
    @classmethod
    def _norm_verdict(cls, value: Any) -> Verdict:
        return normalize_verdict(value)


class Counts(_Lenient):
    offered: int | None = None
    sent: int | None = None
    completed: int | None = None
    dropped: int | None = None
    late: int | None = None
    errors: dict[str, int] = Field(default_factory=dict)


class Rates(_Lenient):
    offered_per_s: float | None = None
    achieved_send_per_s: float | None = None
    completed_per_s: float | None = None
    goodput_per_s: float | None = None


class ErrorStat(_Lenient):
    n: int = 0
    rate: float | None = None
    wilson95: tuple[float, float] | None = None

    @field_validator("wilson95", mode="before")
    @classmethod
    def _interval(cls, value: Any) -> Any:
        ok = isinstance(value, list | tuple) and len(value) == 2 and all(isinstance(v, int | float) for v in value)
        return value if ok else None


class TimePoint(_Lenient):
    t_s: float
    offered: float | None = None
    sent: float | None = None
    completed: float | None = None
    errors: float | None = None
    http_429: float | None = None
    inflight: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    cpu_share: float | None = None
    loop_lag_p99_ms: float | None = None


class Window(_Lenient):
    start_s: float | None = None
    end_s: float | None = None


class RunSummary(_Lenient):
    load: dict[str, Any] = Field(default_factory=dict)
    window: Window = Field(default_factory=Window)
    counts: Counts = Field(default_factory=Counts)
    rates: Rates = Field(default_factory=Rates)
    latency_ms: dict[str, LatencyStats] = Field(default_factory=dict)
    errors: dict[str, ErrorStat] = Field(default_factory=dict)
    phases: dict[str, dict[str, LatencyStats]] = Field(default_factory=dict)
    selfcheck: SelfCheck | None = None
    timeseries: list[TimePoint] = Field(default_factory=list)

    @field_validator("phases", mode="before")
    @classmethod
    def _phase_latencies(cls, value: Any) -> Any:
        # The engine nests each phase as {counts, latency_ms: {metric: stats}, errors}; keep the metrics.
        if not isinstance(value, dict):
            return {}
        return {name: (block.get("latency_ms", block) if isinstance(block, dict) else {})
                for name, block in value.items()}

    @field_validator("timeseries", mode="before")
    @classmethod
    def _points(cls, value: Any) -> list[Any]:
        # A point without a time cannot be placed on the chart; drop it rather than the whole run.
        return [p for p in value if isinstance(p, dict) and isinstance(p.get("t_s"), int | float)] \
            if isinstance(value, list) else []

    # hdr (base64 HdrHistogram) is deliberately not modelled: the report does not decode it.


class Run(_Lenient):
    label: str = ""
    level: dict[str, Any] = Field(default_factory=dict)  # numbers for sweeps; anything else is just shown
    summary: RunSummary = Field(default_factory=RunSummary)
    # Raw per-request records for this run (telemetry), attached by the loader, never by the engine.
    samples: list[dict[str, Any]] = Field(default_factory=list)

    @property
    def level_axis(self) -> tuple[str, float] | None:
        """('concurrency'|'rate', value) when the run is one step of a sweep."""
        for key in ("concurrency", "rate"):
            value = self.level.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                return key, float(value)
        return None

    @property
    def verdict(self) -> Verdict:
        return self.summary.selfcheck.verdict if self.summary.selfcheck else "unknown"


class Vantage(_Lenient):
    carrier_id: str | None = None
    instance_id: str | None = None
    instance_type: str | None = None
    zone: str | None = None
    image_id: str | None = None
    region: str | None = None
    in_vpc: bool | None = None
    package_version: str | None = None


class Provenance(_Lenient):
    csbench_version: str | None = None
    python: str | None = None
    aiohttp: str | None = None
    uvloop: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    spec_sha256: str | None = None


class Observations(_Lenient):
    kind: str = ""
    params: dict[str, Any] = Field(default_factory=dict)
    vantage: Vantage = Field(default_factory=Vantage)
    provenance: Provenance = Field(default_factory=Provenance)
    runs: list[Run] = Field(default_factory=list)
    findings: dict[str, Any] = Field(default_factory=dict)
    verdict: Verdict = "unknown"
    verdict_reasons: list[str] = Field(default_factory=list)
    legacy: bool = False  # converted from the compact ttft shape (no self-check: verdict stays unknown)

    @field_validator("verdict", mode="before")
    @classmethod
    def _norm_verdict(cls, value: Any) -> Verdict:
        return normalize_verdict(value)


class Job(_Lenient):
    """One job as the report sees it: the Result's envelope plus its parsed observations."""

    job_id: str
    attempt: int | None = None
    status: str = "unknown"
    carrier_id: str | None = None
    reason: str | None = None
    message: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    target: str | None = None  # from the job spec when the loader had it
    observations: Observations = Field(default_factory=Observations)
    problems: list[str] = Field(default_factory=list)  # what could not be read, shown in the report

    @property
    def verdict(self) -> Verdict:
        """The job's own verdict, made no better than its worst run: an invalid run invalidates its numbers."""
        if self.status != "succeeded":
            return "invalid"
        runs = [r.verdict for r in self.observations.runs if r.verdict != "unknown"]
        return worst(self.observations.verdict, *runs) if runs else self.observations.verdict

    def verdict_reasons(self) -> list[str]:
        reasons: list[str] = []
        if self.status != "succeeded":
            reasons.append(f"job {self.status}" + (f": {self.reason}" if self.reason else "")
                           + (f" — {self.message}" if self.message else ""))
        reasons += self.observations.verdict_reasons
        for run in self.observations.runs:
            if run.summary.selfcheck and run.verdict in ("warn", "invalid"):
                reasons += [f"run {run.label or '?'}: {r}" for r in run.summary.selfcheck.reasons] or [
                    f"run {run.label or '?'}: self-check {run.verdict}"]
        if self.observations.legacy:
            reasons.append("compact ttft result: no generator self-check was recorded, and TTFT is timed from the "
                           "actual send (there was no schedule)")
        return reasons


class Report(_Lenient):
    campaign: str = ""
    source: str = ""  # where the results came from (bucket/prefix or folder), for the header
    generated_at: str = ""
    jobs: list[Job] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)

    @property
    def verdict(self) -> Verdict:
        return worst(*(j.verdict for j in self.jobs)) if self.jobs else "unknown"


# -- building jobs from raw documents --------------------------------------------------------------------
def _legacy_ttft(obs: dict[str, Any]) -> dict[str, Any]:
    """Today's compact ttft observations (samples + ttft_ms {n,p50,p90,max}) as one run of the new shape."""
    summary: dict[str, Any] = obs["ttft_ms"] if isinstance(obs.get("ttft_ms"), dict) else {}
    samples = [s for s in obs.get("samples") or [] if isinstance(s, dict)]
    errors: dict[str, Any] = obs["errors"] if isinstance(obs.get("errors"), dict) else {}
    ok = sum(1 for s in samples if s.get("ok"))
    run = {
        "label": "samples",
        "level": {"concurrency": 1},
        "summary": {
            "counts": {"sent": len(samples) or None, "completed": ok if samples else summary.get("n"),
                       "errors": errors},
            "latency_ms": {"ttft": summary},
        },
        # The compact samples time TTFT from the actual send (there is no schedule), so they are ttft_service
        # in the new vocabulary; keep the name the job used but carry them as raw samples for the charts.
        "samples": [{**s, "seq": s.get("index", i)} for i, s in enumerate(samples)],
    }
    params = {k: v for k, v in obs.items() if k not in {"samples", "ttft_ms", "errors"}}
    return {"kind": "ttft", "params": params, "runs": [run], "verdict": "unknown", "legacy": True}


def observations_from(raw: Any) -> tuple[Observations, list[str]]:
    """Parse a Result's observations in either shape; never raises. Returns (observations, problems)."""
    if not isinstance(raw, dict) or not raw:
        return Observations(), []
    problems: list[str] = []
    doc = _legacy_ttft(raw) if "runs" not in raw and ("ttft_ms" in raw or "samples" in raw) else dict(raw)
    try:
        return Observations.model_validate(doc), problems
    except ValidationError as exc:
        problems += [f"observations.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5]]
    # Salvage run by run: one malformed run must not hide the others.
    runs = []
    for i, run in enumerate(doc.get("runs") or []):
        try:
            runs.append(Run.model_validate(run))
        except ValidationError as exc:
            problems.append(f"run {i} unreadable: {exc.errors()[0]['msg']}")
    head = {k: v for k, v in doc.items() if k != "runs"}
    try:
        obs = Observations.model_validate(head)
    except ValidationError:
        obs = Observations(kind=str(doc.get("kind", "")))
    # Unreadable parts mean we cannot vouch for the job: never better than "warn".
    return obs.model_copy(update={"runs": runs, "verdict": worst(obs.verdict, "warn")}), problems


def job_from_result(result: dict[str, Any], *, target: str | None = None,
                    samples: list[dict[str, Any]] | None = None) -> Job:
    """A Job from one Result document (as a dict), optionally with its telemetry records."""
    obs, problems = observations_from(result.get("observations"))
    if samples:
        obs = obs.model_copy(update={"runs": attach_samples(obs.runs, samples)})
    return Job(job_id=str(result.get("job_id") or "?"), attempt=_int(result.get("attempt")),
               status=str(result.get("status") or "unknown"), carrier_id=_str(result.get("carrier_id")),
               reason=_str(result.get("reason")), message=_str(result.get("message")),
               started_at=_str(result.get("started_at")), finished_at=_str(result.get("finished_at")),
               target=target, observations=obs, problems=problems)


def attach_samples(runs: list[Run], records: list[dict[str, Any]]) -> list[Run]:
    """Give each run its raw telemetry records, matched by the record's run label when it has one.

    Records without a label go to the only run, or to none when there are several (we will not guess which
    step of a sweep a request belonged to: the summary percentiles are used instead).
    """
    records = [r for r in records if isinstance(r, dict)]
    by_label: dict[str, list[dict[str, Any]]] = {}
    unlabelled: list[dict[str, Any]] = []
    for rec in records:
        label = rec.get("run", rec.get("label"))
        (by_label.setdefault(str(label), []) if label is not None else unlabelled).append(rec)
    out = []
    for run in runs:
        mine = by_label.get(run.label, []) + (unlabelled if len(runs) == 1 else [])
        out.append(run.model_copy(update={"samples": mine}) if mine and not run.samples else run)
    return out


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return None if value is None else str(value)
