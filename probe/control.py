"""The control side of the wire protocol: dispatch jobs to carriers and observe them through object storage.

Used by the operator (hot path: `CampaignChannel.observe()` once per poll interval) and by `csbench carrier`
(humans: `list_jobs`, `list_carriers`, `job_detail`, which may scan history). Nothing here imports kopf or a
Kubernetes client, so it works from the lean `probe` extra too.

Request budget of `observe()` (see docs/protocol.md, "Request budget"): per call

    1 LIST carriers/  +  1 LIST jobs/<job>/ per active job            (one page each up to 1000 keys)
    + 1 GET per key whose ETag changed since the previous call        (heartbeats, claims, progress, results)
    + 2 DELETE per job whose result was seen (its signals), once
    + 1 PUT per job the control side fails itself (attempts exhausted / deadline), once

so with poll interval P seconds, C live carriers heartbeating every H s, J active jobs whose progress is
written at most every G s:  LIST/min = 60/P * (1 + J);  GET/min <= C * 60/max(P, H) + J * 60/max(P, G),
plus a constant handful per job over its whole life. "Active" means dispatched and no result seen yet: a
finished job leaves the set and its signals are deleted, so the cost does not grow with the campaign's
history. The first call after a restart adds 1 LIST signals/ plus 1 GET per active job's spec (recovery).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from typing import Any

from csbench.probe.blobstore import BlobStore, ObjectInfo, StoreError
from csbench.probe.protocol import (
    Cancel,
    Claim,
    D,
    Final,
    Heartbeat,
    JobSignal,
    JobSpec,
    Keys,
    Progress,
    ProtocolError,
    Result,
    ResultStatus,
    Secret,
    Stop,
    TelemetryManifest,
    check_id,
    control_deadline_s,
    parse,
    parse_signal,
)

DEFAULT_POLL_INTERVAL_S = 2.0
DEFAULT_HEARTBEAT_LEASE_S = 15.0  # 3 x the carrier's default 5 s heartbeat interval (rule 7)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _etag(value: str) -> str:
    # oss2 strips the quotes on some paths and not others; compare bare values.
    return value.strip('"')


# -- pure decisions (unit-tested without a store) ---------------------------------------------------------
def new_job_id(now: datetime | None = None, previous: str | None = None) -> str:
    """`j<YYYYmmddHHMMSS>-<6 hex>`: sorts by creation (carriers take the oldest first), a DNS label.

    The suffix is random (two controllers never collide in practice) but, within one second of the same
    dispatcher, follows `previous` so that jobs dispatched in one burst still run in order.
    """
    stamp = (now or utcnow()).astimezone(timezone.utc).strftime("%Y%m%d%H%M%S")
    if previous and previous[1:15] == stamp and int(previous[16:], 16) < 0xFFFFFF:
        return f"j{stamp}-{int(previous[16:], 16) + 1:06x}"
    return f"j{stamp}-{secrets.randbelow(0x800000):06x}"  # lower half: room to count up within the second


def listing_diff(previous: dict[str, str], listing: Iterable[ObjectInfo]) -> tuple[list[str], list[str], dict[str, str]]:
    """(keys new or with a changed ETag, keys gone, the new key → ETag map). Directory markers are skipped."""
    current = {o.key: _etag(o.etag) for o in listing if not o.key.endswith("/")}
    changed = [k for k, e in current.items() if previous.get(k) != e]
    gone = [k for k in previous if k not in current]
    return changed, gone, current


def is_stale(last_change_mono: float, now_mono: float, lease_s: float) -> bool:
    """A heartbeat is stale when it has not changed for lease_s on the observer's own monotonic clock."""
    return now_mono - last_change_mono >= lease_s


class Verdict(str, Enum):
    running = "running"  # nothing to do
    attempt_lost = "AttemptLost"  # claimant dead, attempts remain: a live carrier claims the next (rule 3)
    attempts_exhausted = "AttemptsExhausted"  # claimant dead, no attempt left: control writes failed
    lease_expired = "LeaseExpired"  # control deadline passed: control writes failed (rule 11)


def judge_attempt(*, attempt: int, max_attempts: int, claimant_dead: bool, claim_age_s: float,
                  deadline_s: float) -> Verdict:
    """What the control side does about the latest attempt of an active job (no result seen).

    The deadline wins over attempts left: a claimant that is alive but past timeout_s + slack blocks every
    re-claim (rule 3 only re-claims from dead claimants), so waiting longer cannot help.
    """
    if claim_age_s >= deadline_s:
        return Verdict.lease_expired
    if claimant_dead:
        return Verdict.attempts_exhausted if attempt >= max_attempts else Verdict.attempt_lost
    return Verdict.running


def claimant_dead(claim: Claim, claim_first_seen: float, carrier: CarrierTrack | None, now_mono: float,
                  default_lease_s: float) -> str | None:
    """Why the claimant of `claim` is presumed dead (rule 3), or None while it may be alive."""
    if carrier is not None and carrier.final is not None and carrier.final.incarnation == claim.incarnation:
        return f"carrier {claim.carrier_id} exited ({carrier.final.exit_reason.value}) without a result"
    if carrier is None or carrier.heartbeat_etag is None:
        if now_mono - claim_first_seen >= default_lease_s:
            return f"carrier {claim.carrier_id} has no heartbeat and the claim is older than {default_lease_s:g}s"
        return None
    hb = carrier.heartbeat
    # Only a heartbeat read after the claim appeared says which incarnation is alive now.
    if hb is not None and hb.incarnation != claim.incarnation and carrier.changed_at > claim_first_seen:
        return f"carrier {claim.carrier_id} restarted (incarnation {hb.incarnation} != claim's {claim.incarnation})"
    if is_stale(carrier.changed_at, now_mono, carrier.lease_s(default_lease_s)):
        return f"carrier {claim.carrier_id} heartbeat unchanged for {now_mono - carrier.changed_at:.0f}s"
    return None


# -- what observe() returns --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Problem:
    """A document or request the observer could not use. Nothing is lost: the object stays where it is."""

    key: str
    reason: str
    transient: bool = False  # a store error that a later call may not hit


@dataclass(frozen=True)
class HeartbeatMissing:
    carrier_id: str
    silent_s: float  # since the heartbeat last changed, on the observer's monotonic clock
    lease_s: float
    last: Heartbeat | None


@dataclass(frozen=True)
class AttemptVerdict:
    job_id: str
    attempt: int
    carrier_id: str
    verdict: Verdict
    why: str


@dataclass
class Observation:
    at_mono: float
    heartbeats: list[Heartbeat] = field(default_factory=list)  # new or changed since the last call
    finals: list[Final] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)
    progress: list[Progress] = field(default_factory=list)
    results: list[Result] = field(default_factory=list)  # every result seen (carrier's or the control side's)
    written: list[Result] = field(default_factory=list)  # results this call wrote itself
    heartbeat_missing: list[HeartbeatMissing] = field(default_factory=list)  # all currently stale carriers
    verdicts: list[AttemptVerdict] = field(default_factory=list)  # lost attempts and failures decided now
    problems: list[Problem] = field(default_factory=list)
    requests: int = 0  # object-store requests this call made (the budget above)

    @property
    def changed(self) -> bool:
        return bool(self.heartbeats or self.finals or self.claims or self.progress or self.results
                    or self.written or self.verdicts or self.problems)


# -- observer state ----------------------------------------------------------------------------------------
@dataclass
class CarrierTrack:
    carrier_id: str
    changed_at: float  # observer monotonic time the heartbeat's ETag last changed
    heartbeat_etag: str | None = None
    heartbeat: Heartbeat | None = None
    final: Final | None = None

    def lease_s(self, default: float) -> float:
        # The carrier declares its own lease (3 x its interval); trust it only to lengthen ours.
        return max(default, self.heartbeat.lease_s) if self.heartbeat else default


@dataclass
class JobTrack:
    spec: JobSpec
    etags: dict[str, str] = field(default_factory=dict)
    claims: dict[int, Claim] = field(default_factory=dict)
    claim_seen: dict[int, float] = field(default_factory=dict)  # attempt -> observer monotonic first seen
    reported: set[tuple[int, Verdict]] = field(default_factory=set)
    progress: Progress | None = None

    @property
    def latest(self) -> int:
        return max(self.claims, default=0)


class TelemetryError(Exception):
    """Telemetry that cannot be trusted: a chunk is missing, altered or does not match its manifest."""


# -- the channel -------------------------------------------------------------------------------------------
class CampaignChannel:
    """One Campaign's control channel. Not thread-safe: one observer calls observe() in a loop."""

    def __init__(self, store: BlobStore, campaign_uid: str, *, poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
                 heartbeat_lease_s: float = DEFAULT_HEARTBEAT_LEASE_S,
                 clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.campaign_uid = check_id(campaign_uid, "campaign uid")
        self.keys = Keys(campaign_uid)
        self.poll_interval_s = poll_interval_s
        self.heartbeat_lease_s = heartbeat_lease_s
        self.clock = clock
        self.carriers: dict[str, CarrierTrack] = {}
        self.active: dict[str, JobTrack] = {}
        self._carrier_etags: dict[str, str] = {}
        self._recovered = False
        self._requests = 0
        self._last_job_id: str | None = None

    # -- writes ----------------------------------------------------------------------------------------
    def new_job_id(self) -> str:
        self._last_job_id = new_job_id(previous=self._last_job_id)
        return self._last_job_id

    def job_spec(self, *, probe: str, target: Any, timeout_s: float, params: dict[str, Any] | None = None,
                 **extra: Any) -> JobSpec:
        """A JobSpec for this campaign with a fresh job id (convenience for dispatch)."""
        return JobSpec(job_id=self.new_job_id(), campaign_uid=self.campaign_uid, probe=probe, target=target,
                       timeout_s=timeout_s, params=params or {}, created_at=utcnow(), **extra)

    def dispatch(self, spec: JobSpec) -> str:
        """Rule 1: spec (write-once), then the signal carriers poll. Safe to retry after an uncertain write."""
        if spec.campaign_uid != self.campaign_uid:
            raise ValueError(f"job {spec.job_id} belongs to campaign {spec.campaign_uid}, "
                             f"not this channel's {self.campaign_uid}")
        body = spec.to_bytes()
        if not self._call(self.store.put_if_absent, self.keys.spec(spec.job_id), body):
            existing = self._call(self.store.get, self.keys.spec(spec.job_id))
            if existing is None or existing.body != body:
                raise ValueError(f"job id {spec.job_id} is already used by another spec under "
                                 f"{self.keys.job_dir(spec.job_id)}; dispatch it with a new job id")
        signal = JobSignal(job_id=spec.job_id, created_at=spec.created_at)
        self._call(self.store.put, self.keys.job_signal(spec.job_id), signal.to_bytes())
        self.active[spec.job_id] = JobTrack(spec=spec)
        return spec.job_id

    def cancel(self, job_id: str, reason: str = "requested") -> bool:
        """Ask the carrier running `job_id` to cancel it (rule 5). False when the job already has a result."""
        check_id(job_id, "job id")
        if self._call(self.store.get, self.keys.result(job_id)) is not None:
            return False
        doc = Cancel(job_id=job_id, reason=reason, created_at=utcnow())
        self._call(self.store.put, self.keys.cancel(job_id), doc.to_bytes())
        # Carriers skip a cancelled job they have not started, so nobody else would ever end a queued one.
        # The signal is written first: a carrier that claims in between sees it within ~1 s and its result
        # goes to superseded/ (nothing lost).
        if not any(True for _ in self._call(self.store.list, self.keys.claims_dir(job_id))):
            result = Result(job_id=job_id, attempt=0, status=ResultStatus.cancelled, reason="Cancelled",
                            message=f"cancelled before any carrier claimed it: {reason}", finished_at=utcnow())
            self._call(self.store.put_if_absent, self.keys.result(job_id), result.to_bytes())
        return True

    def put_secret(self, name: str, value: str) -> str:
        """Store a target credential that jobs name by reference (Target.credential_ref, params *_ref).

        Kept under secrets/ so no job document carries it; carriers read it when a job that names it starts.
        Protect the prefix with server-side encryption and a RAM policy scoped to this campaign's carriers.
        Returns the key (never the value)."""
        key = self.keys.secret(name)
        self._call(self.store.put, key, Secret(name=name, value=value, created_at=utcnow()).to_bytes())
        return key

    def stop(self, carrier_id: str | None = None, drain_s: float = 30.0, reason: str = "requested") -> str:
        """Stop one carrier or all of this campaign's (rule 8): drain for up to drain_s, then exit. Returns the key."""
        key = self.keys.stop_all if carrier_id is None else self.keys.stop_carrier(check_id(carrier_id, "carrier id"))
        self._call(self.store.put, key, Stop(reason=reason, drain_s=drain_s, created_at=utcnow()).to_bytes())
        return key

    # -- the hot path ----------------------------------------------------------------------------------
    def observe(self) -> Observation:
        """One poll: see what changed, decide about lost attempts, clean up finished jobs. See module doc."""
        self._requests = 0
        obs = Observation(at_mono=self.clock())
        if not self._recovered:
            self._recover(obs)
        carriers_listed = self._observe_carriers(obs)
        for job_id in sorted(self.active):
            self._observe_job(job_id, obs, judge=carriers_listed)
        obs.at_mono = self.clock()
        if carriers_listed:
            for track in sorted(self.carriers.values(), key=lambda t: t.carrier_id):
                lease = track.lease_s(self.heartbeat_lease_s)
                exited = track.final is not None and (track.heartbeat is None
                                                      or track.final.incarnation == track.heartbeat.incarnation)
                if not exited and is_stale(track.changed_at, obs.at_mono, lease):
                    obs.heartbeat_missing.append(HeartbeatMissing(
                        track.carrier_id, obs.at_mono - track.changed_at, lease, track.heartbeat))
        obs.requests = self._requests
        return obs

    def _recover(self, obs: Observation) -> None:
        """After a restart the active set is rebuilt from signals/: it holds exactly the unfinished jobs."""
        try:
            names = [o.key for o in self._call(lambda: list(self.store.list(self.keys.signals_dir)))]
        except StoreError as exc:
            self._transient(exc, obs)
            return
        for key in names:
            parsed = parse_signal(key.rsplit("/", 1)[-1])
            if parsed is None or parsed[0] != "job" or parsed[1] in self.active:
                continue
            before = len(obs.problems)
            spec = self._read(JobSpec, self.keys.spec(parsed[1]), obs)
            if spec is not None:
                self.active[spec.job_id] = JobTrack(spec=spec)
            elif len(obs.problems) == before:
                obs.problems.append(Problem(key, f"job signal without a spec at {self.keys.spec(parsed[1])}; "
                                                 "the job is not observed (delete the signal or re-dispatch)"))
        # A transient failure leaves recovery for the next call rather than forgetting a job.
        self._recovered = not any(p.transient for p in obs.problems)

    def _observe_carriers(self, obs: Observation) -> bool:
        prefix = self.keys.carriers_dir()
        try:
            listing = self._call(lambda: list(self.store.list(prefix)))
        except StoreError as exc:
            self._transient(exc, obs)
            return False
        changed, gone, current = listing_diff(self._carrier_etags, listing)
        for key in gone:
            self._carrier_etags.pop(key, None)
        now = self.clock()
        for key in changed:
            carrier_id, _, name = key[len(prefix):].partition("/")
            if name not in ("heartbeat.json", "final.json"):
                self._carrier_etags[key] = current[key]  # boot.log: read on demand only
                continue
            track = self.carriers.setdefault(carrier_id, CarrierTrack(carrier_id, changed_at=now))
            if name == "heartbeat.json":
                # Liveness is the change itself, even if the new body is unreadable.
                track.changed_at = now
                track.heartbeat_etag = current[key]
                hb = self._read(Heartbeat, key, obs, etags=self._carrier_etags, listed_etag=current[key])
                if hb is not None:
                    track.heartbeat = hb
                    obs.heartbeats.append(hb)
            else:
                final = self._read(Final, key, obs, etags=self._carrier_etags, listed_etag=current[key])
                if final is not None:
                    track.final = final
                    obs.finals.append(final)
        return True

    def _observe_job(self, job_id: str, obs: Observation, *, judge: bool) -> None:
        job = self.active[job_id]
        try:
            listing = self._call(lambda: list(self.store.list(self.keys.job_dir(job_id))))
        except StoreError as exc:
            self._transient(exc, obs)
            return
        changed, gone, current = listing_diff(job.etags, listing)
        for key in gone:
            job.etags.pop(key, None)
        claims_dir, result_key, progress_key = (self.keys.claims_dir(job_id), self.keys.result(job_id),
                                                self.keys.progress(job_id))
        now = self.clock()
        for key in sorted(changed):
            if key.startswith(claims_dir):
                claim = self._read(Claim, key, obs, etags=job.etags, listed_etag=current[key])
                if claim is not None:
                    if claim.job_id != job_id or f"{claim.attempt:04d}.json" != key[len(claims_dir):]:
                        obs.problems.append(Problem(key, f"claim names job {claim.job_id} attempt {claim.attempt}"))
                    else:
                        job.claims[claim.attempt] = claim
                        job.claim_seen.setdefault(claim.attempt, now)
                        obs.claims.append(claim)
            elif key == progress_key:
                progress = self._read(Progress, key, obs, etags=job.etags, listed_etag=current[key])
                if progress is not None:
                    job.progress = progress
                    obs.progress.append(progress)
            elif key == result_key:
                if self._read_result(job_id, key, obs, etags=job.etags, listed_etag=current[key]):
                    return
            else:
                job.etags[key] = current[key]  # spec, telemetry, superseded: not needed on the hot path
        if judge and job.claims:
            self._judge(job, obs)

    def _read_result(self, job_id: str, key: str, obs: Observation, *, etags: dict[str, str],
                     listed_etag: str) -> bool:
        """True when the job is finished (its result was read, or exists but is unreadable)."""
        try:
            blob = self._call(self.store.get, key)
        except StoreError as exc:
            self._transient(exc, obs)
            return False
        if blob is None:
            return False
        try:
            result = parse(Result, key, blob.body)
        except ProtocolError as exc:
            # The key is write-once: nobody can replace it, so the job is over. Keep the raw object, say why.
            obs.problems.append(Problem(key, exc.reason))
            job = self.active[job_id]
            result = Result(job_id=job_id, attempt=job.latest, status=ResultStatus.failed,
                            reason="ResultUnreadable", message=exc.reason, finished_at=utcnow())
        obs.results.append(result)
        self._finish(job_id, obs)
        return True

    def _judge(self, job: JobTrack, obs: Observation) -> None:
        attempt = job.latest
        claim = job.claims[attempt]
        now = self.clock()
        why = claimant_dead(claim, job.claim_seen[attempt], self.carriers.get(claim.carrier_id), now,
                            self.heartbeat_lease_s)
        deadline = control_deadline_s(job.spec, self.poll_interval_s, self.heartbeat_lease_s)
        age = now - job.claim_seen[attempt]
        verdict = judge_attempt(attempt=attempt, max_attempts=job.spec.max_attempts, claimant_dead=why is not None,
                                claim_age_s=age, deadline_s=deadline)
        if verdict is Verdict.running:
            return
        if verdict is Verdict.lease_expired:
            why = (f"no result {age:.0f}s after attempt {attempt} was claimed by {claim.carrier_id} "
                   f"(control deadline {deadline:.0f}s = timeout_s {job.spec.timeout_s:g}s + slack)")
        assert why is not None
        if verdict is Verdict.attempt_lost:
            if (attempt, verdict) not in job.reported:  # report once; a live carrier will claim attempt+1
                job.reported.add((attempt, verdict))
                obs.verdicts.append(AttemptVerdict(job.spec.job_id, attempt, claim.carrier_id, verdict, why))
            return
        result = Result(job_id=job.spec.job_id, attempt=attempt, status=ResultStatus.failed, reason=verdict.value,
                        message=why, finished_at=utcnow(), started_at=claim.claimed_at)
        key = self.keys.result(job.spec.job_id)
        try:
            wrote = self._call(self.store.put_if_absent, key, result.to_bytes())
        except StoreError as exc:
            self._transient(exc, obs)
            return
        if wrote:
            obs.verdicts.append(AttemptVerdict(job.spec.job_id, attempt, claim.carrier_id, verdict, why))
            obs.written.append(result)
            obs.results.append(result)
            self._finish(job.spec.job_id, obs)
        else:  # a carrier's result won the race: read it rather than ours
            self._read_result(job.spec.job_id, key, obs, etags=job.etags, listed_etag="")

    def _finish(self, job_id: str, obs: Observation) -> None:
        """Rule 13: the result is in, so carriers no longer need the job's signals; the job leaves the set."""
        try:
            self._call(self.store.delete, self.keys.job_signal(job_id))
            self._call(self.store.delete, self.keys.cancel(job_id))
        except StoreError as exc:
            self._transient(exc, obs)
            return  # stays active; the next call sees the result again (it is re-read) and retries
        self.active.pop(job_id, None)

    # -- reading helpers -------------------------------------------------------------------------------
    def _read(self, model: type[D], key: str, obs: Observation, *, etags: dict[str, str] | None = None,
              listed_etag: str = "") -> D | None:
        """GET + parse; problems (absent, malformed, other version, transient errors) go into obs."""
        try:
            blob = self._call(self.store.get, key)
        except StoreError as exc:
            self._transient(exc, obs)
            return None  # ETag not recorded: the next call retries this key
        if blob is None:
            if etags is not None:
                etags.pop(key, None)
            return None
        if etags is not None:
            # Remember the version read (not the listed one) so a bad document is reported once per version.
            etags[key] = _etag(blob.etag) or listed_etag
        try:
            return parse(model, key, blob.body)
        except ProtocolError as exc:
            obs.problems.append(Problem(key, exc.reason))
            return None

    def _transient(self, exc: StoreError, obs: Observation) -> None:
        if not exc.transient:
            raise exc  # 403, 400, missing bucket: the configuration is wrong; retrying will not help
        obs.problems.append(Problem(exc.key, str(exc), transient=True))

    def _call(self, func: Callable[..., Any], *args: Any) -> Any:
        self._requests += 1
        return func(*args)

    # -- for humans and for fetching results (may scan history) ----------------------------------------
    def read_boot_log(self, carrier_id: str) -> str | None:
        blob = self.store.get(self.keys.boot_log(check_id(carrier_id, "carrier id")))
        return None if blob is None else blob.body.decode("utf-8", errors="replace")

    def list_job_ids(self) -> list[str]:
        prefix = self.keys.prefix + "jobs/"
        return sorted(o.key[len(prefix):].rstrip("/") for o in self.store.list(prefix, delimiter="/")
                      if o.key.endswith("/"))

    def job_detail(self, job_id: str) -> JobDetail:
        """Everything about one job: spec, claims, progress, result, problems. Reads each document once."""
        check_id(job_id, "job id")
        detail = JobDetail(job_id=job_id)
        obs = Observation(at_mono=self.clock())
        for info in self.store.list(self.keys.job_dir(job_id)):
            key = info.key
            rel = key[len(self.keys.job_dir(job_id)):]
            if rel == "spec.json":
                detail.spec = self._read(JobSpec, key, obs)
            elif rel.startswith("claims/"):
                claim = self._read(Claim, key, obs)
                if claim is not None:
                    detail.claims.append(claim)
            elif rel == "progress.json":
                detail.progress = self._read(Progress, key, obs)
            elif rel == "result.json":
                detail.result = self._read(Result, key, obs)
            elif rel.startswith("superseded/"):
                superseded = self._read(Result, key, obs)
                if superseded is not None:
                    detail.superseded.append(superseded)
            elif rel.startswith("telemetry/"):
                detail.telemetry_objects += 1
        detail.problems = obs.problems
        return detail

    def list_jobs(self) -> list[JobDetail]:
        return [self.job_detail(job_id) for job_id in self.list_job_ids()]

    def list_carriers(self) -> list[CarrierDetail]:
        prefix = self.keys.carriers_dir()
        found: dict[str, CarrierDetail] = {}
        obs = Observation(at_mono=self.clock())
        for info in self.store.list(prefix):
            carrier_id, _, name = info.key[len(prefix):].partition("/")
            detail = found.setdefault(carrier_id, CarrierDetail(carrier_id=carrier_id))
            if name == "heartbeat.json":
                detail.heartbeat = self._read(Heartbeat, info.key, obs)
                detail.heartbeat_modified = info.last_modified
            elif name == "final.json":
                detail.final = self._read(Final, info.key, obs)
            elif name == "boot.log":
                detail.has_boot_log = True
        for problem in obs.problems:
            carrier_id = problem.key[len(prefix):].partition("/")[0]
            found[carrier_id].problems.append(problem)
        return [found[k] for k in sorted(found)]

    def fetch_telemetry(self, job_id: str, attempt: int | None = None) -> list[dict[str, Any]]:
        """All records of one attempt's telemetry, in manifest order, each chunk verified (sha256, bytes, count).

        attempt None: the attempt named by the job's result, else the highest attempt that has a manifest.
        """
        check_id(job_id, "job id")
        manifest_key = self._manifest_key(job_id, attempt)
        blob = self.store.get(manifest_key)
        if blob is None:
            raise TelemetryError(f"no telemetry manifest at {manifest_key}: the attempt wrote no telemetry "
                                 "(or has not finished); see `csbench carrier show`")
        try:
            manifest = parse(TelemetryManifest, manifest_key, blob.body)
        except ProtocolError as exc:
            raise TelemetryError(f"telemetry manifest {manifest_key} is unusable: {exc.reason}") from None
        base = manifest_key.rsplit("/", 1)[0] + "/"
        records: list[dict[str, Any]] = []
        for chunk in manifest.chunks:
            key = chunk.key if chunk.key.startswith(self.keys.prefix) else base + chunk.key
            data = self.store.get(key)
            if data is None:
                raise TelemetryError(f"telemetry chunk {key} listed in {manifest_key} is missing")
            digest = hashlib.sha256(data.body).hexdigest()
            if digest != chunk.sha256 or len(data.body) != chunk.bytes:
                raise TelemetryError(
                    f"telemetry chunk {key}: sha256 {digest} / {len(data.body)} bytes does not match the "
                    f"manifest's {chunk.sha256} / {chunk.bytes} bytes; the chunk was altered or partially "
                    "written — do not use this attempt's telemetry")
            lines = [line for line in data.body.splitlines() if line.strip()]
            if len(lines) != chunk.records:
                raise TelemetryError(f"telemetry chunk {key} has {len(lines)} records, manifest says {chunk.records}")
            for n, line in enumerate(lines, 1):
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise TelemetryError(f"telemetry chunk {key} line {n} is not JSON: {exc}") from None
        return records

    def _manifest_key(self, job_id: str, attempt: int | None) -> str:
        if attempt is not None:
            return self.keys.telemetry_dir(job_id, attempt) + "manifest.json"
        blob = self.store.get(self.keys.result(job_id))
        if blob is not None:
            try:
                result = parse(Result, self.keys.result(job_id), blob.body)
                if result.telemetry_manifest:
                    return result.telemetry_manifest
            except ProtocolError:
                pass  # fall back to the listing below
        prefix = self.keys.job_dir(job_id) + "telemetry/"
        attempts = sorted(o.key for o in self.store.list(prefix, delimiter="/") if o.key.endswith("/"))
        if not attempts:
            raise TelemetryError(f"job {job_id} has no telemetry under {prefix}")
        return attempts[-1] + "manifest.json"


@dataclass
class JobDetail:
    job_id: str
    spec: JobSpec | None = None
    claims: list[Claim] = field(default_factory=list)
    progress: Progress | None = None
    result: Result | None = None
    superseded: list[Result] = field(default_factory=list)
    telemetry_objects: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def state(self) -> str:
        if self.result is not None:
            return self.result.status.value
        if any(p.key.endswith("/result.json") for p in self.problems):
            return "result-unreadable"
        return "running" if self.claims else "queued"


@dataclass
class CarrierDetail:
    carrier_id: str
    heartbeat: Heartbeat | None = None
    heartbeat_modified: int = 0  # unix seconds, the store's clock (display only)
    final: Final | None = None
    has_boot_log: bool = False
    problems: list[Problem] = field(default_factory=list)
