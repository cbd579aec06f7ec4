"""Configuration, fault injection and request counters for the OSS stand-in.

A fault rule matches requests by method, operation (OSS API name such as "PutObject"), bucket and key
prefix — every field left out matches everything — and then either answers with an OSS error, stalls the
request for some seconds before handling it normally (so client timeouts fire), or drops the connection.
A rule is bounded by `count` (number of requests it applies to) and/or `duration` (seconds after it was
added); an exhausted rule is removed. Rules come from the service config and from the admin API.
"""

from __future__ import annotations

import itertools
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class FaultRule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    action: Literal["error", "stall", "drop"]
    method: str | None = None  # GET, PUT, ...
    operation: str | None = None  # OSS API name: PutObject, GetObject, ListObjectsV2, ...
    bucket: str | None = None
    key_prefix: str | None = None
    # action == "error"
    status: int = Field(503, ge=400, le=599)
    code: str = "ServiceUnavailable"
    message: str = "Please reduce your request rate. (injected by localcloud)"
    # action == "stall"
    seconds: float = Field(30.0, ge=0)
    # bounds; None = unbounded
    count: int | None = Field(None, ge=1)
    duration: float | None = Field(None, gt=0)
    probability: float = Field(1.0, ge=0, le=1)

    @field_validator("method")
    @classmethod
    def _upper(cls, v: str | None) -> str | None:
        return v.upper() if v else v


class BucketSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    acl: Literal["private", "public-read", "public-read-write"] = "private"


class OssConfig(BaseModel):
    """`config["oss"]` for localcloud. Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")

    buckets: list[str | BucketSpec] = Field(default_factory=list)  # created at start if missing
    faults: list[FaultRule] = Field(default_factory=list)
    max_clock_skew_seconds: float = Field(900.0, gt=0)  # OSS allows 15 minutes

    def bucket_specs(self) -> list[BucketSpec]:
        return [b if isinstance(b, BucketSpec) else BucketSpec(name=b) for b in self.buckets]


@dataclass
class _Active:
    id: int
    rule: FaultRule
    until: float | None
    remaining: int | None
    hits: int = 0

    def describe(self) -> dict[str, Any]:
        return {"id": self.id, "hits": self.hits, "remaining": self.remaining, "until": self.until,
                **self.rule.model_dump(exclude_none=True)}  # fmt: skip


@dataclass
class Faults:
    rules: list[_Active] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def add(self, rule: FaultRule, now: float | None = None) -> int:
        now = time.monotonic() if now is None else now
        active = _Active(next(self._ids), rule, now + rule.duration if rule.duration else None, rule.count)
        self.rules.append(active)
        return active.id

    def clear(self) -> int:
        n = len(self.rules)
        self.rules.clear()
        return n

    def pick(self, method: str, operation: str, bucket: str | None, key: str, now: float | None = None) -> FaultRule | None:
        """The first live rule matching this request, consuming one of its uses; None if nothing applies."""
        now = time.monotonic() if now is None else now
        self.rules = [a for a in self.rules if (a.until is None or now < a.until) and a.remaining != 0]
        for a in self.rules:
            r = a.rule
            if r.method and r.method != method:
                continue
            if r.operation and r.operation != operation:
                continue
            if r.bucket and r.bucket != bucket:
                continue
            if r.key_prefix is not None and not key.startswith(r.key_prefix):
                continue
            if r.probability < 1.0 and random.random() >= r.probability:
                continue
            a.hits += 1
            if a.remaining is not None:
                a.remaining -= 1
            return r
        return None

    def describe(self) -> list[dict[str, Any]]:
        return [a.describe() for a in self.rules]


@dataclass
class Stats:
    """Requests seen per OSS operation (faulted ones included) and how many of them a fault answered."""

    requests: Counter[str] = field(default_factory=Counter)
    faulted: Counter[str] = field(default_factory=Counter)
    started: float = field(default_factory=time.time)

    def snapshot(self) -> dict[str, Any]:
        return {
            "since": self.started,
            "total": sum(self.requests.values()),
            "requests": dict(sorted(self.requests.items())),
            "faulted": dict(sorted(self.faulted.items())),
        }

    def reset(self) -> None:
        self.requests.clear()
        self.faulted.clear()
        self.started = time.time()
