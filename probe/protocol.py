"""The wire protocol between the control plane and carriers: documents and key layout in object storage.

Every document is a pydantic model with `schema` (protocol major version) and `kind`. Readers accept
unknown fields of the same major version (forward compatible) and refuse another major version or a
malformed body with a ProtocolError that says which document and why — the caller reports it, never crashes.

Key layout (all under one prefix per Campaign UID, see campaign_prefix):

    signals/job-<job>.json         control → carriers   a job is queued or running (small pointer)
    signals/cancel-<job>.json      control → carriers   cooperative cancel of one job
    signals/stop.json              control → carriers   drain, then exit (all carriers)
    signals/stop-<carrier>.json    control → carrier    drain, then exit (one carrier)
    jobs/<job>/spec.json           control              the job (write-once)
    jobs/<job>/claims/<NNNN>.json  carrier              attempt N claimed (put-if-absent = atomic)
    jobs/<job>/progress.json       carrier → control    overwritten at a bounded rate
    jobs/<job>/result.json         carrier|control      terminal, write-once (put-if-absent)
    jobs/<job>/telemetry/<NNNN>/   carrier              NDJSON chunks + manifest.json (per attempt)
    carriers/<carrier>/heartbeat.json  carrier          overwritten every heartbeat interval
    carriers/<carrier>/final.json      carrier          last state and exit reason
    carriers/<carrier>/boot.log        carrier boot     boot stages as text (user-data)
    secrets/<name>.json            control → carrier    a target credential named by reference (never in a job)

Carriers poll one prefix (`signals/`) with one LIST per interval; its size is bounded by active jobs,
not history, because the control side deletes a job's signal once its result is in.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from enum import Enum
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

SCHEMA = "csbench.dev/v1"
ROOT = "csbench/v1"
MAX_DOCUMENT_BYTES = 1 << 20  # specs, heartbeats, progress: anything bigger is refused unread

_ID = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


class ProtocolError(ValueError):
    """A document that cannot be used: malformed, oversized, wrong kind or unsupported version."""

    def __init__(self, key: str, reason: str):
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


def check_id(value: str, what: str) -> str:
    if not _ID.match(value):
        raise ValueError(f"{what} {value!r} must be a DNS label: lowercase letters, digits and '-', ≤63 chars")
    return value


# -- key layout ------------------------------------------------------------------------------------------
def campaign_prefix(campaign_uid: str) -> str:
    """Everything of one Campaign lives under its UID, so nothing of an earlier run can touch it."""
    return f"{ROOT}/campaigns/{check_id(campaign_uid, 'campaign uid')}/"


class Keys:
    """Object keys relative to nothing: each method returns the full key under the campaign prefix."""

    def __init__(self, campaign_uid: str):
        self.prefix = campaign_prefix(campaign_uid)

    signals_dir = property(lambda self: self.prefix + "signals/")
    stop_all = property(lambda self: self.prefix + "signals/stop.json")

    def job_signal(self, job: str) -> str:
        return f"{self.prefix}signals/job-{job}.json"

    def cancel(self, job: str) -> str:
        return f"{self.prefix}signals/cancel-{job}.json"

    def stop_carrier(self, carrier: str) -> str:
        return f"{self.prefix}signals/stop-{carrier}.json"

    def job_dir(self, job: str) -> str:
        return f"{self.prefix}jobs/{job}/"

    def spec(self, job: str) -> str:
        return f"{self.prefix}jobs/{job}/spec.json"

    def claims_dir(self, job: str) -> str:
        return f"{self.prefix}jobs/{job}/claims/"

    def claim(self, job: str, attempt: int) -> str:
        return f"{self.prefix}jobs/{job}/claims/{attempt:04d}.json"

    def progress(self, job: str) -> str:
        return f"{self.prefix}jobs/{job}/progress.json"

    def result(self, job: str) -> str:
        return f"{self.prefix}jobs/{job}/result.json"

    def telemetry_dir(self, job: str, attempt: int) -> str:
        return f"{self.prefix}jobs/{job}/telemetry/{attempt:04d}/"

    def carriers_dir(self) -> str:
        return f"{self.prefix}carriers/"

    def heartbeat(self, carrier: str) -> str:
        return f"{self.prefix}carriers/{carrier}/heartbeat.json"

    def final(self, carrier: str) -> str:
        return f"{self.prefix}carriers/{carrier}/final.json"

    def boot_log(self, carrier: str) -> str:
        return f"{self.prefix}carriers/{carrier}/boot.log"

    def secret(self, name: str) -> str:
        return f"{self.prefix}secrets/{check_id(name, 'secret name')}.json"


_SIGNAL = re.compile(r"^(?:job-(?P<job>[a-z0-9-]+)|cancel-(?P<cancel>[a-z0-9-]+)|stop-(?P<stop>[a-z0-9-]+)|"
                     r"(?P<all>stop))\.json$")


def parse_signal(name: str) -> tuple[str, str] | None:
    """('job'|'cancel'|'stop'|'stop-all', id) for a key's basename under signals/, None if not ours."""
    m = _SIGNAL.match(name)
    if not m:
        return None
    if m["job"]:
        return ("job", m["job"])
    if m["cancel"]:
        return ("cancel", m["cancel"])
    if m["stop"]:
        return ("stop", m["stop"])
    return ("stop-all", "")


# -- documents -------------------------------------------------------------------------------------------
class Document(BaseModel):
    """Base of every wire document: versioned, forward compatible within a major version."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)
    KIND: ClassVar[str] = ""

    schema_: Literal["csbench.dev/v1"] = Field(default="csbench.dev/v1", alias="schema")
    kind: str = ""

    def model_post_init(self, __context: Any) -> None:
        if self.kind != self.KIND:
            object.__setattr__(self, "kind", self.KIND)

    def to_bytes(self) -> bytes:
        return self.model_dump_json(by_alias=True, exclude_none=True).encode()


class TargetKind(str, Enum):
    openai = "openai"  # OpenAI-compatible chat completions, e.g. AgentRun
    http = "http"  # a generic HTTP request template


class Target(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    kind: TargetKind = TargetKind.openai
    url: str = Field(description="base URL of the endpoint; for openai, the path is appended")
    path: str = "/openai/v1/chat/completions"
    model: str = "csbench"
    session_header: str = "X-AgentRun-Session-ID"
    # Name of a credential the carrier resolves locally (never the secret itself).
    credential_ref: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("headers")
    @classmethod
    def _no_secret_headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if name.lower() in {"authorization", "proxy-authorization", "cookie", "x-api-key"}:
                raise ValueError(f"header {name!r} would put a secret in the job document; use credential_ref")
        return value


class Limits(BaseModel):
    """Hard caps the carrier enforces whatever the job parameters ask for."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    max_concurrency: int = Field(default=64, ge=1, le=10_000)
    max_rate_per_s: float = Field(default=1000.0, gt=0)
    max_requests: int = Field(default=100_000, ge=1)


class JobSpec(Document):
    KIND: ClassVar[str] = "JobSpec"

    job_id: str
    campaign_uid: str
    probe: str = Field(description="job kind, e.g. ttft")
    params: dict[str, Any] = Field(default_factory=dict)
    target: Target
    limits: Limits = Field(default_factory=Limits)
    # The one timeout: the carrier stops the job at timeout_s after its claim; the control side derives
    # its own deadline from it (see control_deadline_s).
    timeout_s: float = Field(gt=0, le=24 * 3600)
    max_attempts: int = Field(default=2, ge=1, le=10)
    created_at: datetime

    @field_validator("job_id")
    @classmethod
    def _job_id(cls, v: str) -> str:
        return check_id(v, "job_id")


def control_deadline_s(spec: JobSpec, poll_interval_s: float, heartbeat_lease_s: float) -> float:
    """Seconds after a claim the control side waits before declaring the attempt lost.

    The carrier stops the job at timeout_s, then needs up to one poll to notice and a few seconds to
    write its result; a dead carrier is detected by its lease. The control side never races the carrier.
    """
    return spec.timeout_s + 2 * poll_interval_s + heartbeat_lease_s + 5.0


class JobSignal(Document):
    KIND: ClassVar[str] = "JobSignal"
    job_id: str
    created_at: datetime


class Claim(Document):
    KIND: ClassVar[str] = "Claim"
    job_id: str
    attempt: int = Field(ge=1)
    carrier_id: str
    incarnation: str
    claimed_at: datetime


class Phase(str, Enum):
    starting = "starting"
    warmup = "warmup"
    measuring = "measuring"
    finishing = "finishing"


class Progress(Document):
    KIND: ClassVar[str] = "Progress"
    job_id: str
    attempt: int
    carrier_id: str
    phase: Phase
    completed: int = 0
    total: int | None = None
    elapsed_s: float = 0.0
    metrics: dict[str, float] = Field(default_factory=dict)
    updated_at: datetime


class ResultStatus(str, Enum):
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"
    timed_out = "timed_out"


class Result(Document):
    KIND: ClassVar[str] = "Result"
    job_id: str
    attempt: int
    status: ResultStatus
    carrier_id: str | None = None  # None when the control side wrote it (attempts exhausted, spec invalid)
    reason: str | None = None  # machine-readable, e.g. SpecInvalid, Timeout, ProbeError, LeaseExpired
    message: str | None = None
    started_at: datetime | None = None
    finished_at: datetime
    observations: dict[str, Any] = Field(default_factory=dict)
    telemetry_manifest: str | None = None  # key of the manifest.json, if telemetry was written


class Cancel(Document):
    KIND: ClassVar[str] = "Cancel"
    job_id: str
    reason: str = "requested"
    created_at: datetime


class Stop(Document):
    KIND: ClassVar[str] = "Stop"
    reason: str = "requested"
    drain_s: float = Field(default=30.0, ge=0)
    created_at: datetime


class CarrierState(str, Enum):
    booting = "booting"
    idle = "idle"
    busy = "busy"
    draining = "draining"
    stopped = "stopped"


class CurrentJob(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    job_id: str
    attempt: int
    phase: Phase


class Heartbeat(Document):
    KIND: ClassVar[str] = "Heartbeat"
    carrier_id: str
    instance_id: str | None = None
    incarnation: str  # new per process start: a restarted carrier is told apart from a live one
    seq: int = Field(ge=0)  # monotonic within an incarnation
    package_version: str
    boot_stage: str = "running"
    state: CarrierState
    current_job: CurrentJob | None = None
    counters: dict[str, int] = Field(default_factory=dict)
    last_error: str | None = None
    interval_s: float
    lease_s: float  # the carrier is presumed dead when no new heartbeat appears within this
    wall_time: datetime
    monotonic_s: float


class ExitReason(str, Enum):
    stopped = "Stopped"
    idle = "IdleTimeout"
    fatal = "Fatal"
    signal = "Signal"


class Final(Document):
    KIND: ClassVar[str] = "Final"
    carrier_id: str
    incarnation: str
    exit_reason: ExitReason
    message: str | None = None
    counters: dict[str, int] = Field(default_factory=dict)
    finished_at: datetime


class Secret(Document):
    """A credential a job names by reference (Target.credential_ref, params *_ref). It lives apart from jobs so
    that no job document, result, heartbeat or log ever carries it; the carrier reads it when a job starts."""

    KIND: ClassVar[str] = "Secret"
    name: str
    value: str
    created_at: datetime


class TelemetryChunk(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    stream: str
    key: str
    records: int
    sha256: str
    bytes: int


class TelemetryManifest(Document):
    KIND: ClassVar[str] = "TelemetryManifest"
    job_id: str
    attempt: int
    chunks: list[TelemetryChunk] = Field(default_factory=list)
    media_type: str = "application/x-ndjson"


D = TypeVar("D", bound=Document)


def parse(model: type[D], key: str, body: bytes) -> D:
    """Decode `body` (read from `key`) as `model`, or raise ProtocolError saying exactly what is wrong."""
    if len(body) > MAX_DOCUMENT_BYTES:
        raise ProtocolError(key, f"document is {len(body)} bytes, over the {MAX_DOCUMENT_BYTES}-byte limit")
    try:
        raw = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(key, f"not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ProtocolError(key, f"expected a JSON object, got {type(raw).__name__}")
    schema = raw.get("schema")
    if schema != SCHEMA:
        raise ProtocolError(key, f"unsupported schema {schema!r}; this reader speaks {SCHEMA!r} (another major version: upgrade csbench)")
    if raw.get("kind") != model.KIND:
        raise ProtocolError(key, f"expected kind {model.KIND!r}, got {raw.get('kind')!r}")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
        raise ProtocolError(key, f"invalid {model.KIND}: {problems}") from None
