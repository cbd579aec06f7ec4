"""Configuration of the AgentRun-like target: pydantic models, validated once per (re)configuration.

Nothing here runs per request: the server compiles a validated `AgentRunConfig` into samplers and
pre-encoded byte templates (`server.Runtime`) so the hot path never touches pydantic.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class ConfigError(ValueError):
    """A configuration document was rejected; the message names the offending key."""


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Dist(StrictModel):
    """A seeded distribution of durations in seconds. A bare number means `constant`.

    normal/lognormal take the mean and standard deviation of the *resulting* durations (lognormal's
    mu/sigma are derived), so `{"kind": "lognormal", "mean": 0.05, "std": 0.02}` reads as it looks.
    Samples are clamped to [min, max] (min defaults to 0: durations are never negative).
    """

    kind: Literal["constant", "uniform", "normal", "lognormal", "exponential"] = "constant"
    value: float = Field(default=0.0, ge=0)  # constant
    low: float = Field(default=0.0, ge=0)  # uniform
    high: float = Field(default=0.0, ge=0)
    mean: float = Field(default=0.0, ge=0)  # normal, lognormal, exponential
    std: float = Field(default=0.0, ge=0)  # normal, lognormal
    min: float = Field(default=0.0, ge=0)
    max: float | None = Field(default=None, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _number_is_constant(cls, data: Any) -> Any:
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return {"kind": "constant", "value": data}
        return data

    @model_validator(mode="after")
    def _check(self) -> Dist:
        if self.kind == "uniform" and self.high < self.low:
            raise ValueError(f"uniform: high ({self.high}) < low ({self.low})")
        if self.kind == "lognormal" and self.mean <= 0:
            raise ValueError("lognormal: mean must be > 0")
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) < min ({self.min})")
        return self


class StallWindow(StrictModel):
    """The whole server freezes for `duration_s`, starting `start_s` after the config epoch.

    Every header or event send planned inside the window is held until the window ends (a GC-pause or
    stop-the-world stall): requests arriving in it get late headers, streams in flight stop and then
    burst out what they owe. This is the coordinated-omission demonstration.
    """

    start_s: float = Field(ge=0)
    duration_s: float = Field(gt=0)


class RequestStall(StrictModel):
    """One request stops sending for `duration_s`: before its headers (`after_tokens` null) or after its
    Nth token. Applies to the 1-based request numbers in `requests` (counted since the last reset) and,
    independently, with `probability`. The rest of that stream keeps its pace, shifted by the stall."""

    duration_s: float = Field(gt=0)
    after_tokens: int | None = Field(default=None, ge=0)
    requests: tuple[int, ...] = ()
    probability: float = Field(default=0.0, ge=0, le=1)


class Failure(StrictModel):
    """Injected failures: 1-based request numbers (since reset) and/or a probability.

    mode `status` answers `status` with an OpenAI-style error body before any streaming;
    mode `drop` sends headers and `after_tokens` tokens, then closes the connection without the terminal
    events (a transport error / truncated stream from the client's point of view)."""

    status: int = Field(default=500, ge=400, le=599)
    requests: tuple[int, ...] = ()
    probability: float = Field(default=0.0, ge=0, le=1)
    mode: Literal["status", "drop"] = "status"
    after_tokens: int = Field(default=1, ge=0)


class RetryAfter(StrictModel):
    """How a 429 states Retry-After. `seconds` null: computed from the limiter (time until the token
    bucket has a token, 1 s for the concurrency ceiling), rounded up to whole seconds (RFC 9110)."""

    format: Literal["seconds", "http-date"] = "seconds"
    seconds: float | None = Field(default=None, ge=0)


class AgentPolicy(StrictModel):
    """The built-in benchmark agent (agent.py): runs tool plans found in user messages."""

    enabled: bool = True
    max_retries: int = Field(default=2, ge=0, le=100)
    backoff_ms: int = Field(default=200, ge=0)
    timeout_s: float = Field(default=10.0, gt=0)
    tool_hosts: tuple[str, ...] = ("127.0.0.1", "localhost", "::1")


class AgentRunConfig(StrictModel):
    session_header: str = "x-agentrun-session-id"
    api_key: str | None = None  # set → `Authorization: Bearer <api_key>` required on the data plane
    model: str = "agentrun-local"

    # Sessions: the first request of a session pays cold_start; a session idle (no request in flight)
    # for longer than session_idle_timeout_s is recycled, so its next request is cold again.
    cold_start: Dist = Dist()
    session_idle_timeout_s: float = Field(default=900.0, gt=0)
    max_sessions: int = Field(default=100_000, ge=1)  # beyond it the longest-idle are evicted

    # Generation timing: TTFT is measured from when the session is warm (after any cold start).
    ttft: Dist = Dist(value=0.01)
    inter_token: Dist = Dist(value=0.002)
    output_tokens: int = Field(default=16, ge=1, le=100_000)
    output_tokens_from_request: bool = False  # use max_tokens / max_completion_tokens when given
    max_output_tokens: int = Field(default=4096, ge=1)
    role_chunk: Literal["with_first_token", "with_headers"] = "with_first_token"

    # Limits (None = unlimited). Two separate knobs, as platforms enforce both.
    rate_limit_rps: float | None = Field(default=None, gt=0)
    rate_limit_burst: float | None = Field(default=None, ge=1)
    max_concurrency: int | None = Field(default=None, ge=1)
    retry_after: RetryAfter = RetryAfter()

    failures: tuple[Failure, ...] = ()
    stalls: tuple[RequestStall, ...] = ()
    stall_windows: tuple[StallWindow, ...] = ()

    agent: AgentPolicy = AgentPolicy()

    seed: int = 0
    records_capacity: int = Field(default=100_000, ge=1)
    record_token_times: bool = True  # every token's send time (8 bytes each); off for huge soaks

    @field_validator("session_header")
    @classmethod
    def _lower(cls, v: str) -> str:
        if not v or any(c.isspace() or c == ":" for c in v):
            raise ValueError(f"not a valid header name: {v!r}")
        return v.lower()


def _describe(err: ValidationError, prefix: str) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"] if not str(x).startswith("function-"))
        where = f"{prefix}.{loc}" if loc else prefix
        if e["type"] == "extra_forbidden":
            parts.append(f"{where}: unknown key")
        else:
            parts.append(f"{where}: {e['msg']}")
    return "; ".join(parts)


def parse_model(model: type[BaseModel], doc: Any, prefix: str) -> Any:
    """Validate `doc` into `model`; raise ConfigError naming every offending key."""
    if not isinstance(doc, dict):
        raise ConfigError(f"{prefix}: expected a JSON object, got {type(doc).__name__}")
    try:
        return model.model_validate(doc)
    except ValidationError as err:
        raise ConfigError(_describe(err, prefix)) from None


def parse_config(doc: Any) -> AgentRunConfig:
    result: AgentRunConfig = parse_model(AgentRunConfig, doc, "agentrun")
    return result


def merge_patch(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386 JSON merge patch: objects merge recursively, null deletes (back to the default)."""
    out = dict(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_patch(out[key], value)
        else:
            out[key] = value
    return out
