"""The carrier loop: discover jobs in object storage, claim one atomically, run it, write its result once.

It never loses a job and never exits on the store's or a job's failure (docs/protocol.md):
- one LIST of `signals/` per poll (2 s idle, ≤1 s busy); only changed stop signals are read;
- claims are put-if-absent; an attempt whose claimant stopped heartbeating for its lease is taken over;
- results are put-if-absent; a late result of a superseded attempt goes to `superseded/` (nothing lost);
- the heartbeat is its own task, so a stalled store call never silences it, and a stalled heartbeat never
  stalls job supervision (timeouts, cancel, drain are decided on the local monotonic clock);
- oss2 blocks, so every store call runs in a worker thread with the adapter's timeout.

Decisions are pure functions at the top of this module; `Carrier` only does the I/O around them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from typing import Any, TypeVar

from csbench.probe.blobstore import BlobStore, StoreError
from csbench.probe.config import ProbeConfig
from csbench.probe.jobs import JobContext, JobFn, registry
from csbench.probe.jobs.common import JOB_SECRETS
from csbench.probe.protocol import (
    MAX_DOCUMENT_BYTES,
    CarrierState,
    Claim,
    CurrentJob,
    ExitReason,
    Final,
    Heartbeat,
    JobSpec,
    Keys,
    Progress,
    ProtocolError,
    Result,
    ResultStatus,
    Secret,
    Stop,
    parse,
    parse_signal,
)
from csbench.probe.ssrf import TargetRefused, check_target
from csbench.probe.telemetry import TelemetryWriter
from csbench.probe.vantage import fetch_metadata, provenance, vantage

log = logging.getLogger("csbench.probe")
T = TypeVar("T")

BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 30.0
CANCEL_GRACE_S = 1.0  # a cancelled job task must be gone within this, or the carrier takes no new job
STOP_RESULT_GRACE_S = 30.0  # after the drain bound, how long a stopping carrier keeps retrying its result


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


# -- pure decisions (unit-tested without a store) ----------------------------------------------------------
def backoff_s(failures: int, *, base: float = BACKOFF_BASE_S, cap: float = BACKOFF_CAP_S,
              rand: Callable[[], float] = random.random) -> float:
    """Capped exponential backoff with full jitter: uniform in [0, min(cap, base·2^(failures-1))]."""
    if failures <= 0:
        return 0.0
    return rand() * min(cap, base * 2 ** min(failures - 1, 30))


def secret_refs(spec: JobSpec) -> list[str]:
    """Every secret a job names: target.credential_ref and any string param ending in `_ref`."""
    refs = [spec.target.credential_ref] if spec.target.credential_ref else []
    refs += [v for k, v in sorted(spec.params.items()) if k.endswith("_ref") and isinstance(v, str) and v]
    return list(dict.fromkeys(refs))


@dataclass(frozen=True)
class Sighting:
    """What this carrier saw of another carrier's heartbeat, on its own monotonic clock."""

    etag: str | None
    first_seen: float
    changed_at: float


def observe(prev: Sighting | None, etag: str | None, now: float) -> Sighting:
    if prev is None:
        return Sighting(etag, now, now)
    if etag != prev.etag:
        return Sighting(etag, prev.first_seen, now)
    return prev


def claimant_dead(claim: Claim | None, hb: Heartbeat | None, sighting: Sighting, now: float, *,
                  default_lease_s: float, me: str, my_incarnation: str) -> str | None:
    """Why the attempt `claim` is presumed lost, or None while its claimant may still be running it.

    Never compares clocks across machines: only how long the heartbeat object stayed unchanged here.
    """
    if claim is not None and claim.carrier_id == me:
        if claim.incarnation != my_incarnation:
            return f"claimed by an earlier incarnation of this carrier ({claim.incarnation[:8]})"
        return None
    if claim is not None and hb is not None and hb.incarnation != claim.incarnation:
        return f"carrier {claim.carrier_id} restarted since it claimed the job"
    lease = hb.lease_s if hb is not None else default_lease_s
    if sighting.etag is None:
        if now - sighting.first_seen >= lease:
            return f"claimant has no heartbeat {now - sighting.first_seen:.1f}s after the claim was first seen"
        return None
    if now - sighting.changed_at >= lease:
        return f"claimant's heartbeat unchanged for {now - sighting.changed_at:.1f}s (lease {lease:.1f}s)"
    return None


class Action(str, Enum):
    claim = "claim"
    wait = "wait"
    exhaust = "exhaust"


def decide_attempt(highest: int, max_attempts: int, lost: bool) -> tuple[Action, int]:
    """Given the highest attempt claimed so far, which attempt (if any) this carrier should claim."""
    if highest == 0:
        return Action.claim, 1
    if not lost:
        return Action.wait, highest
    if highest + 1 <= max_attempts:
        return Action.claim, highest + 1
    return Action.exhaust, highest


def pick_order(job_ids: Iterable[str], *, skip: set[str], not_before: dict[str, float], now: float) -> list[str]:
    """Oldest job first (ids sort by creation time), without finished, cancelled or backed-off jobs."""
    return sorted(j for j in set(job_ids) if j not in skip and not_before.get(j, 0.0) <= now)


def failure_of(exc: BaseException) -> tuple[ResultStatus, str, str]:
    """A job's exception → (status, reason, message) of its Result."""
    if isinstance(exc, TargetRefused):
        return ResultStatus.failed, "TargetRefused", str(exc)
    if isinstance(exc, ProtocolError):
        return ResultStatus.failed, "SpecInvalid", str(exc)
    return ResultStatus.failed, "ProbeError", f"{type(exc).__name__}: {exc}"[:2000]


def validate_spec(spec: JobSpec, job_id: str, campaign_uid: str, kinds: Iterable[str]) -> tuple[str, str] | None:
    """(reason, message) if a well-formed spec still cannot run here, else None."""
    if spec.job_id != job_id:
        return "SpecInvalid", f"spec.job_id {spec.job_id!r} does not match its key's job {job_id!r}"
    if spec.campaign_uid != campaign_uid:
        return "SpecInvalid", f"spec.campaign_uid {spec.campaign_uid!r} is not this campaign ({campaign_uid!r})"
    if spec.probe not in kinds:
        return "UnknownProbe", f"probe {spec.probe!r} is not one of {sorted(kinds)}"
    return None


def fit_result(result: Result) -> Result:
    """Keep a Result under the document limit: per-sample lists are in telemetry, so drop them first."""
    if len(result.to_bytes()) <= MAX_DOCUMENT_BYTES:
        return result
    obs = {k: v for k, v in result.observations.items() if not isinstance(v, list)}
    note = "observations trimmed to fit the 1 MiB document limit; raw samples are in telemetry"
    trimmed = result.model_copy(update={"observations": {**obs, "trimmed": True}, "message": note})
    if len(trimmed.to_bytes()) <= MAX_DOCUMENT_BYTES:
        return trimmed
    return result.model_copy(update={"observations": {"trimmed": True}, "message": note})


def metadata_instance_id(metadata_url: str, timeout_s: float = 2.0) -> str:
    """This VM's instance id from the metadata service (short timeout: it may not be there in dev)."""
    url = metadata_url.rstrip("/") + "/latest/meta-data/instance-id"
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (fixed scheme from config)
        value = resp.read().decode().strip()
    if not value:
        raise ValueError(f"{url} answered an empty instance id")
    return value


# -- the loop ----------------------------------------------------------------------------------------------
@dataclass
class Running:
    spec: JobSpec
    attempt: int
    ctx: JobContext
    task: asyncio.Task[dict[str, Any]]
    deadline: float
    started_at: datetime
    cancel_why: tuple[ResultStatus, str, str] | None = None
    progress_version: int = -1
    progress_at: float = -1e9


@dataclass
class Outcome:
    exit_reason: ExitReason
    message: str
    counters: dict[str, int] = field(default_factory=dict)


class Carrier:
    def __init__(self, cfg: ProbeConfig, store: BlobStore, *, package_version: str,
                 kinds: dict[str, JobFn] | None = None, clock: Callable[[], float] = time.monotonic):
        self.cfg = cfg
        self.store = store
        self.keys = Keys(cfg.campaign_uid)
        self.me = cfg.carrier_id
        self.kinds = kinds if kinds is not None else registry()
        self.package_version = package_version
        self.clock = clock
        self.incarnation = uuid.uuid4().hex
        self.instance_id = cfg.instance_id
        self.metadata: dict[str, str | None] | None = None  # vantage facts from the metadata service
        self.seq = 0
        self.state = CarrierState.booting
        self.counters: Counter[str] = Counter()
        self.last_error: str | None = None
        self.store_failures = 0  # consecutive failed steps, drives the backoff
        self.signals: dict[str, str] = {}  # key → etag from the last LIST
        self.cancels: set[str] = set()
        self.specs: dict[str, JobSpec | ProtocolError] = {}
        self.claims: dict[str, Claim | None] = {}
        self.sightings: dict[str, Sighting] = {}
        self.done: set[str] = set()
        self.not_before: dict[str, float] = {}
        self.running: Running | None = None
        self.stray: asyncio.Task[Any] | None = None  # a job task that ignored cancellation
        self.pending: list[Result] = []
        self.stop: Stop | None = None
        self.drain_deadline = 0.0
        self.stop_seen_at = 0.0
        self.signal_name: str | None = None
        self.idle_since = clock()
        self._wake: asyncio.Event | None = None

    # -- I/O helpers ----------------------------------------------------------------------------------------
    async def _io(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await asyncio.to_thread(fn, *args)
        except StoreError as exc:
            self.counters["store_errors"] += 1
            self.last_error = str(exc)
            raise

    def _list(self, prefix: str) -> list[str]:
        return [o.key for o in self.store.list(prefix)]

    def _listing(self, prefix: str) -> dict[str, str]:
        return {o.key: o.etag for o in self.store.list(prefix)}

    def wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def request_exit(self, signame: str) -> None:
        """SIGTERM/SIGINT: cancel the job now, write what we have, leave (systemd or the VM is going away)."""
        self.signal_name = signame
        self.wake()

    # -- main loop ------------------------------------------------------------------------------------------
    async def run(self) -> Outcome:
        self._wake = asyncio.Event()
        self.idle_since = self.clock()
        self.state = CarrierState.idle
        hb = asyncio.create_task(self._heartbeat_loop(), name="heartbeat")
        md = None if self.instance_id else asyncio.create_task(self._fetch_instance_id(), name="instance-id")
        try:
            while True:
                outcome = await self._step()
                if outcome is not None:
                    break
                await self._sleep(self._next_wait())
        finally:
            for task in (hb, md):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
        await self._finish(outcome)
        return outcome

    async def _sleep(self, seconds: float) -> None:
        assert self._wake is not None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=max(0.0, seconds))
        self._wake.clear()

    def _next_wait(self) -> float:
        now = self.clock()
        wait = self.cfg.busy_poll_interval_s if self.running else self.cfg.poll_interval_s
        if self.store_failures:
            wait = max(wait, backoff_s(self.store_failures))
        if self.running:
            wait = min(wait, self.running.deadline - now)
            if self.stop is not None:
                wait = min(wait, self.drain_deadline - now)
        else:
            wait = min(wait, self.idle_since + self.cfg.idle_timeout_s - now)
        return max(0.01, wait)

    async def _step(self) -> Outcome | None:
        now = self.clock()
        if self.signal_name is not None:
            if self.running:
                await self._cancel(ResultStatus.cancelled, "CarrierStopped",
                                   f"carrier {self.me} received {self.signal_name}")
            await self._flush_results(deadline=self.clock() + 5.0)
            return Outcome(ExitReason.signal, f"received {self.signal_name}")
        await self._supervise(now)
        try:
            await self._flush_progress()
            await self._flush_results()
            await self._poll_signals()
            await self._supervise(self.clock())  # a cancel or stop just seen is honoured now, not next poll
            if self._can_take_job():
                await self._pick_job()
            self.store_failures = 0
        except StoreError as exc:
            self.store_failures += 1
            log.warning("object store unavailable (%d consecutive failures), backing off: %s",
                        self.store_failures, exc)
        return self._exit_decision(self.clock())

    def _can_take_job(self) -> bool:
        if self.stray is not None and self.stray.done():
            self.stray = None
        return self.running is None and self.stop is None and not self.pending and self.stray is None

    def _exit_decision(self, now: float) -> Outcome | None:
        if self.stop is not None and self.running is None:
            if not self.pending:
                return Outcome(ExitReason.stopped, f"stop signal: {self.stop.reason}")
            if now > self.drain_deadline + STOP_RESULT_GRACE_S:
                return Outcome(ExitReason.stopped, f"stop signal: {self.stop.reason}; "
                               f"{len(self.pending)} result(s) could not be written: {self.last_error}")
        if self.running is None and not self.pending and self.stop is None \
                and now - self.idle_since >= self.cfg.idle_timeout_s:
            return Outcome(ExitReason.idle, f"no job for {self.cfg.idle_timeout_s:g}s")
        return None

    # -- job supervision (local clock only; works while the store is down) ----------------------------------
    async def _supervise(self, now: float) -> None:
        r = self.running
        if r is None:
            return
        if r.task.done():
            await self._complete(r)
        elif now >= r.deadline:
            await self._cancel(ResultStatus.timed_out, "Timeout",
                               f"job did not finish within spec.timeout_s={r.spec.timeout_s:g}s of its claim")
        elif r.spec.job_id in self.cancels:
            await self._cancel(ResultStatus.cancelled, "Cancelled", "cancel signal")
        elif self.stop is not None and now >= self.drain_deadline:
            await self._cancel(ResultStatus.cancelled, "CarrierStopped",
                               f"carrier stopping: job still running after the drain bound "
                               f"({self.drain_deadline - self.stop_seen_at:g}s)")

    async def _cancel(self, status: ResultStatus, reason: str, message: str) -> None:
        r = self.running
        assert r is not None
        r.cancel_why = (status, reason, message)
        r.task.cancel()
        done, _ = await asyncio.wait({r.task}, timeout=CANCEL_GRACE_S)
        if not done:
            log.error("job %s ignored cancellation for %.1fs; taking no new job until it ends",
                      r.spec.job_id, CANCEL_GRACE_S)
            self.stray = r.task
        await self._complete(r)

    async def _complete(self, r: Running) -> None:
        status, reason, message = r.cancel_why or (ResultStatus.succeeded, None, None)
        observations: dict[str, Any] = {}
        if r.cancel_why is None:
            exc = r.task.exception() if not r.task.cancelled() else asyncio.CancelledError("job cancelled itself")
            if exc is not None:
                status, reason, message = failure_of(exc)
            else:
                observations = r.task.result()
                if not isinstance(observations, dict):
                    status, reason, message = (ResultStatus.failed, "ProbeError",
                                               f"job returned {type(observations).__name__}, not a dict")
                    observations = {}
        try:
            manifest = await r.ctx.telemetry.close()
        except Exception as exc:  # telemetry must never cost the result
            manifest = None
            message = f"{message or ''} (telemetry lost: {type(exc).__name__}: {exc})".strip()
        if r.ctx.telemetry.lost_records:
            message = f"{message or ''} ({r.ctx.telemetry.lost_records} telemetry records lost)".strip()
        finished = utcnow()
        observations["vantage"] = vantage(self.metadata, carrier_id=self.me, instance_id=self.instance_id,
                                          region=self.cfg.region,
                                          oss_endpoint=self.cfg.oss_endpoint, package_version=self.package_version)
        observations["provenance"] = provenance(r.spec.to_bytes(), r.started_at, finished)
        try:
            result = Result(job_id=r.spec.job_id, attempt=r.attempt, status=status, carrier_id=self.me,
                            reason=reason, message=message, started_at=r.started_at, finished_at=finished,
                            observations=observations, telemetry_manifest=manifest)
            result = fit_result(result)
        except Exception as exc:  # e.g. observations that are not JSON
            result = Result(job_id=r.spec.job_id, attempt=r.attempt, status=ResultStatus.failed,
                            carrier_id=self.me, reason="ProbeError", started_at=r.started_at,
                            message=f"observations cannot be encoded: {type(exc).__name__}: {exc}"[:2000],
                            finished_at=utcnow(), telemetry_manifest=manifest)
        self.counters[{ResultStatus.succeeded: "jobs_succeeded", ResultStatus.failed: "jobs_failed",
                       ResultStatus.cancelled: "jobs_cancelled",
                       ResultStatus.timed_out: "jobs_timed_out"}[result.status]] += 1
        log.info("job %s attempt %d: %s%s", result.job_id, result.attempt, result.status.value,
                 f" ({result.reason}: {result.message})" if result.reason else "")
        self.running = None
        self.state = CarrierState.draining if self.stop is not None else CarrierState.idle
        self.idle_since = self.clock()
        self.pending.append(result)

    # -- store side ---------------------------------------------------------------------------------------
    async def _flush_results(self, deadline: float | None = None) -> None:
        while self.pending:
            result = self.pending[0]
            try:
                won = await self._io(self.store.put_if_absent, self.keys.result(result.job_id), result.to_bytes())
                if not won:
                    # Another attempt or the control side finished first: keep ours, overwrite nothing.
                    key = f"{self.keys.job_dir(result.job_id)}superseded/{result.attempt:04d}.json"
                    await self._io(self.store.put, key, result.to_bytes())
                    self.counters["results_superseded"] += 1
                    log.warning("job %s already had a result; attempt %d's result kept at %s",
                                result.job_id, result.attempt, key)
            except StoreError:
                if deadline is None or self.clock() >= deadline:
                    raise
                await asyncio.sleep(min(1.0, max(0.0, deadline - self.clock())))
                continue
            self.pending.pop(0)
            self.done.add(result.job_id)

    async def _flush_progress(self) -> None:
        r = self.running
        if r is None:
            return
        snap = r.ctx.snapshot
        now = self.clock()
        if snap.version == r.progress_version or now - r.progress_at < self.cfg.progress_interval_s:
            return
        doc = Progress(job_id=r.spec.job_id, attempt=r.attempt, carrier_id=self.me, phase=snap.phase,
                       completed=snap.completed, total=snap.total, elapsed_s=round(now - r.ctx.started_mono, 3),
                       metrics=snap.metrics, updated_at=utcnow())
        r.progress_version, r.progress_at = snap.version, now  # set first: a failed write waits an interval
        await self._io(self.store.put, self.keys.progress(r.spec.job_id), doc.to_bytes())
        self.counters["progress_writes"] += 1

    async def _poll_signals(self) -> None:
        listing = await self._io(self._listing, self.keys.signals_dir)
        self.counters["polls"] += 1
        changed = {k for k, etag in listing.items() if self.signals.get(k) != etag}
        self.signals = listing
        cancels: set[str] = set()
        for key in listing:
            sig = parse_signal(key.rsplit("/", 1)[-1])
            if sig is None:
                continue
            what, ident = sig
            if what == "cancel":
                cancels.add(ident)
            elif key in changed and self.stop is None and (what == "stop-all" or (what == "stop" and ident == self.me)):
                await self._read_stop(key)
        self.cancels = cancels

    async def _read_stop(self, key: str) -> None:
        blob = await self._io(self.store.get, key)
        if blob is None:
            return
        try:
            stop = parse(Stop, key, blob.body)
        except ProtocolError as exc:
            # A stop is a stop even if its body is broken: honour it with the default drain.
            log.warning("stop signal unreadable (%s); stopping with the default drain", exc)
            stop = Stop(reason=f"unreadable stop signal: {exc.reason}", created_at=utcnow())
        self.stop = stop
        self.stop_seen_at = self.clock()
        self.drain_deadline = self.stop_seen_at + min(stop.drain_s, self.cfg.drain_timeout_s)
        self.state = CarrierState.draining
        log.info("stop signal %s (%s): draining for up to %.1fs", key, stop.reason,
                 self.drain_deadline - self.stop_seen_at)

    async def _spec(self, job: str) -> JobSpec | ProtocolError | None:
        if job in self.specs:
            return self.specs[job]
        key = self.keys.spec(job)
        blob = await self._io(self.store.get, key)
        if blob is None:
            return None
        try:
            spec: JobSpec | ProtocolError = parse(JobSpec, key, blob.body)
        except ProtocolError as exc:
            spec = exc
        self.specs[job] = spec
        return spec

    async def _pick_job(self) -> None:
        jobs = [ident for key in self.signals
                if (sig := parse_signal(key.rsplit("/", 1)[-1])) and sig[0] == "job" for ident in [sig[1]]]
        now = self.clock()
        if jobs and any(j not in self.done for j in jobs):
            self.counters["pick_rounds"] += 1
        for job in pick_order(jobs, skip=self.done | self.cancels, not_before=self.not_before, now=now):
            if await self._consider(job):
                return

    async def _consider(self, job: str) -> bool:
        """Try to claim and start `job`; True when a job is now running."""
        now = self.clock()
        recheck = now + max(self.cfg.poll_interval_s, self.cfg.lease_s / 3)
        spec = await self._spec(job)
        if spec is None:  # signal without spec (yet): look again later
            self.not_before[job] = recheck
            return False
        if await self._io(self.store.get, self.keys.result(job)) is not None:
            self.done.add(job)
            return False
        prefix = self.keys.claims_dir(job)
        attempts = [int(k[len(prefix):].split(".", 1)[0]) for k in await self._io(self._list, prefix)
                    if k[len(prefix):].split(".", 1)[0].isdigit()]
        highest = max(attempts, default=0)
        lost: str | None = None
        if highest:
            lost = await self._attempt_lost(job, highest)
        max_attempts = spec.max_attempts if isinstance(spec, JobSpec) else 1
        action, attempt = decide_attempt(highest, max_attempts, lost is not None)
        if action is Action.wait:
            self.not_before[job] = recheck
            return False
        if action is Action.exhaust:
            result = Result(job_id=job, attempt=highest, status=ResultStatus.failed, carrier_id=self.me,
                            reason="AttemptsExhausted",
                            message=f"attempt {highest} of {max_attempts} lost: {lost}", finished_at=utcnow())
            await self._io(self.store.put_if_absent, self.keys.result(job), result.to_bytes())
            self.done.add(job)
            return False
        claim = Claim(job_id=job, attempt=attempt, carrier_id=self.me, incarnation=self.incarnation,
                      claimed_at=utcnow())
        claimed_at = self.clock()
        if not await self._io(self.store.put_if_absent, self.keys.claim(job, attempt), claim.to_bytes()):
            self.not_before[job] = recheck  # someone else won this attempt
            return False
        self.counters["claims"] += 1
        log.info("claimed job %s attempt %d%s", job, attempt, f" (attempt {highest} lost: {lost})" if lost else "")
        self.idle_since = claimed_at
        refused = await self._refusal(job, spec)
        if refused is not None:
            reason, message = refused
            self.pending.append(Result(job_id=job, attempt=attempt, status=ResultStatus.failed, carrier_id=self.me,
                                       reason=reason, message=message, finished_at=utcnow()))
            self.counters["jobs_failed"] += 1
            log.warning("job %s refused: %s: %s", job, reason, message)
            await self._flush_results()
            return False
        assert isinstance(spec, JobSpec)
        self._start(spec, attempt, claimed_at)
        return True

    async def _attempt_lost(self, job: str, attempt: int) -> str | None:
        key = self.keys.claim(job, attempt)
        if key not in self.claims:
            blob = await self._io(self.store.get, key)
            try:
                self.claims[key] = parse(Claim, key, blob.body) if blob else None
            except ProtocolError as exc:
                log.warning("unreadable claim %s: %s", key, exc)
                self.claims[key] = None
        claim = self.claims[key]
        hb: Heartbeat | None = None
        etag: str | None = None
        if claim is not None and claim.carrier_id != self.me:
            hb_key = self.keys.heartbeat(claim.carrier_id)
            blob = await self._io(self.store.get, hb_key)
            if blob is not None:
                etag = blob.etag
                with contextlib.suppress(ProtocolError):
                    hb = parse(Heartbeat, hb_key, blob.body)
            sight_key = hb_key
        else:
            sight_key = key  # an unreadable claim ages from when we first saw it
        now = self.clock()
        self.sightings[sight_key] = sighting = observe(self.sightings.get(sight_key), etag, now)
        if claim is None:
            return ("unreadable claim, no heartbeat to follow" if now - sighting.first_seen >= self.cfg.lease_s
                    else None)
        return claimant_dead(claim, hb, sighting, now, default_lease_s=self.cfg.lease_s, me=self.me,
                             my_incarnation=self.incarnation)

    async def _refusal(self, job: str, spec: JobSpec | ProtocolError) -> tuple[str, str] | None:
        if isinstance(spec, ProtocolError):
            return "SpecInvalid", str(spec)
        bad = validate_spec(spec, job, self.cfg.campaign_uid, self.kinds)
        if bad:
            return bad
        try:
            await check_target(spec.target.url)
        except TargetRefused as exc:
            return "TargetRefused", str(exc)
        return None

    def _start(self, spec: JobSpec, attempt: int, claimed_at: float) -> None:
        ctx = JobContext(spec=spec, attempt=attempt, carrier_id=self.me,
                         telemetry=TelemetryWriter(self.store, self.keys, spec.job_id, attempt))
        task = asyncio.create_task(self._run_job(spec, ctx), name=f"job-{spec.job_id}")
        task.add_done_callback(lambda _t: self.wake())
        self.running = Running(spec=spec, attempt=attempt, ctx=ctx, task=task,
                               deadline=claimed_at + spec.timeout_s, started_at=utcnow())
        self.state = CarrierState.busy

    async def _run_job(self, spec: JobSpec, ctx: JobContext) -> dict[str, Any]:
        """Resolve the job's secret references, then run its kind with them visible to this task only."""
        secrets: dict[str, str] = {}
        for ref in secret_refs(spec):
            secrets[ref] = await self._read_secret(ref)
        JOB_SECRETS.set(secrets)  # a task's context is its own: other jobs and the loop never see them
        return await self.kinds[spec.probe](ctx)

    async def _read_secret(self, ref: str) -> str:
        key = self.keys.secret(ref)
        for failures in range(1, 6):
            try:
                blob = await self._io(self.store.get, key)
                break
            except StoreError as exc:
                if not exc.transient or failures == 5:
                    raise
                await asyncio.sleep(backoff_s(failures))
        if blob is None:
            raise LookupError(f"secret reference {ref!r}: no {key} (write it with `csbench carrier secret-set`)")
        return parse(Secret, key, blob.body).value

    # -- heartbeat ----------------------------------------------------------------------------------------
    def heartbeat(self) -> Heartbeat:
        self.seq += 1
        r = self.running
        current = CurrentJob(job_id=r.spec.job_id, attempt=r.attempt, phase=r.ctx.snapshot.phase) if r else None
        last_error = self.last_error
        if last_error and self.store_failures:
            last_error += f" (retrying; {self.store_failures} consecutive failed polls)"
        return Heartbeat(carrier_id=self.me, instance_id=self.instance_id, incarnation=self.incarnation,
                         seq=self.seq, package_version=self.package_version, state=self.state,
                         current_job=current, counters=dict(self.counters), last_error=last_error,
                         interval_s=self.cfg.heartbeat_interval_s, lease_s=self.cfg.lease_s,
                         wall_time=utcnow(), monotonic_s=round(self.clock(), 3))

    async def _write_heartbeat(self) -> bool:
        try:
            await self._io(self.store.put, self.keys.heartbeat(self.me), self.heartbeat().to_bytes())
        except StoreError as exc:
            log.warning("heartbeat write failed (next try in %.1fs): %s", self.cfg.heartbeat_interval_s, exc)
            return False
        self.counters["heartbeats"] += 1
        return True

    async def _heartbeat_loop(self) -> None:
        while True:
            started = self.clock()
            await self._write_heartbeat()
            await asyncio.sleep(max(0.0, self.cfg.heartbeat_interval_s - (self.clock() - started)))

    async def _fetch_instance_id(self) -> None:
        for attempt in range(5):
            try:
                self.instance_id = await asyncio.to_thread(metadata_instance_id, self.cfg.metadata_url)
                self.metadata = await asyncio.to_thread(fetch_metadata, self.cfg.metadata_url)
                return
            except Exception as exc:  # no metadata service (dev) is not an error worth more than a log line
                log.info("instance id not available from %s (%s)", self.cfg.metadata_url, exc)
                await asyncio.sleep(min(60.0, 5.0 * 2 ** attempt))

    # -- exit ---------------------------------------------------------------------------------------------
    async def _finish(self, outcome: Outcome) -> None:
        self.state = CarrierState.stopped
        for attempt in range(3):
            if await self._write_heartbeat():
                break
            await asyncio.sleep(backoff_s(attempt + 1))
        outcome.counters = dict(self.counters)
        final = Final(carrier_id=self.me, incarnation=self.incarnation, exit_reason=outcome.exit_reason,
                      message=outcome.message, counters=outcome.counters, finished_at=utcnow())
        for attempt in range(5):
            try:
                await self._io(self.store.put, self.keys.final(self.me), final.to_bytes())
                break
            except StoreError as exc:
                log.warning("final.json write failed (try %d of 5): %s", attempt + 1, exc)
                await asyncio.sleep(backoff_s(attempt + 1, cap=5.0))
        log.info("carrier %s exiting: %s (%s)", self.me, outcome.exit_reason.value, outcome.message)

