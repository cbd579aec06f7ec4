"""`csbench carrier ...`: look at (and stop or cancel) the carriers and jobs of one campaign prefix in OSS.

For humans: these commands may scan the campaign's history. The operator's hot path is
`CampaignChannel.observe()`. Credentials come from ALIBABA_CLOUD_ACCESS_KEY_ID / ALIBABA_CLOUD_ACCESS_KEY_SECRET
(and ALIBABA_CLOUD_SECURITY_TOKEN for STS) and are never printed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

ENV_KEY_ID = "ALIBABA_CLOUD_ACCESS_KEY_ID"
ENV_KEY_SECRET = "ALIBABA_CLOUD_ACCESS_KEY_SECRET"
ENV_TOKEN = "ALIBABA_CLOUD_SECURITY_TOKEN"


class UsageError(Exception):
    """Something the user has to fix before the command can run (exit 2)."""


def _channel(args: argparse.Namespace) -> Any:
    import oss2.credentials

    from csbench.probe.blobstore import OssBlobStore, oss_endpoint
    from csbench.probe.control import CampaignChannel

    missing = [name for name in (ENV_KEY_ID, ENV_KEY_SECRET) if not os.environ.get(name)]
    if missing:
        raise UsageError(f"{' and '.join(missing)} not set: export the OSS access key of an account or RAM user "
                         "that may read the bucket (ALIBABA_CLOUD_SECURITY_TOKEN too for STS credentials)")
    for flag, value in (("--bucket", args.bucket), ("--campaign-uid", args.campaign_uid)):
        if not value:
            raise UsageError(f"{flag} is required (or set {_ENV_DEFAULTS[flag]})")
    creds = oss2.credentials.StaticCredentialsProvider(
        os.environ[ENV_KEY_ID], os.environ[ENV_KEY_SECRET], os.environ.get(ENV_TOKEN) or "")
    store = OssBlobStore(args.bucket, region=args.region, credentials=creds,
                         endpoint=oss_endpoint(args.region, internal=False, override=args.endpoint))
    try:
        return CampaignChannel(store, args.campaign_uid)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


_ENV_DEFAULTS = {"--bucket": "CSBENCH_OSS_BUCKET", "--campaign-uid": "CSBENCH_CAMPAIGN_UID"}


# -- rendering -----------------------------------------------------------------------------------------
def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Plain aligned columns: readable in any terminal and stable to grep."""
    cells = [[str(h) for h in headers]] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def _emit(args: argparse.Namespace, doc: Any, text: str) -> None:
    if args.output == "json":
        print(json.dumps(doc, indent=1, default=str))
    else:
        print(text)


def _dump(model: Any) -> Any:
    return None if model is None else model.model_dump(mode="json", by_alias=True, exclude_none=True)


def _age(moment: datetime | int | None) -> str | None:
    """Display-only age: the local wall clock against a timestamp from another machine (never used to decide)."""
    if moment is None or moment == 0:
        return None
    ts = moment.timestamp() if isinstance(moment, datetime) else float(moment)
    return f"{max(0.0, time.time() - ts):.0f}s"


# -- commands ------------------------------------------------------------------------------------------
def cmd_jobs(args: argparse.Namespace) -> int:
    jobs = _channel(args).list_jobs()
    rows = []
    for j in jobs:
        claim = j.claims[-1] if j.claims else None
        rows.append([j.job_id, j.spec.probe if j.spec else None, j.state, len(j.claims),
                     claim.carrier_id if claim else None,
                     f"{j.progress.phase.value} {j.progress.completed}/{j.progress.total or '?'}" if j.progress else None,
                     j.result.reason if j.result else None, len(j.problems) or None])
    doc = [{"job_id": j.job_id, "state": j.state, "probe": j.spec.probe if j.spec else None,
            "attempts": len(j.claims), "carrier_id": j.claims[-1].carrier_id if j.claims else None,
            "reason": j.result.reason if j.result else None,
            "problems": [p.__dict__ for p in j.problems]} for j in jobs]
    _emit(args, doc, _table(["JOB", "PROBE", "STATE", "ATTEMPTS", "CARRIER", "PROGRESS", "REASON", "PROBLEMS"], rows)
          if jobs else "no jobs")
    return 0


def cmd_carriers(args: argparse.Namespace) -> int:
    carriers = _channel(args).list_carriers()
    rows, doc = [], []
    for c in carriers:
        hb = c.heartbeat
        state = "exited" if c.final else (hb.state.value if hb else None)
        job = f"{hb.current_job.job_id}#{hb.current_job.attempt}" if hb and hb.current_job else None
        last_error = hb.last_error if hb else None
        if c.problems:
            last_error = f"{c.problems[0].key.rsplit('/', 1)[-1]}: {c.problems[0].reason}"
        rows.append([c.carrier_id, _age(c.heartbeat_modified), hb.seq if hb else None, state, job,
                     c.final.exit_reason.value if c.final else None, (last_error or "")[:80] or None])
        doc.append({"carrier_id": c.carrier_id, "heartbeat_age": _age(c.heartbeat_modified), "state": state,
                    "heartbeat": _dump(hb), "final": _dump(c.final), "problems": [p.__dict__ for p in c.problems]})
    _emit(args, doc, _table(["CARRIER", "HB AGE", "SEQ", "STATE", "JOB", "EXIT", "LAST ERROR"], rows)
          if carriers else "no carriers")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    text = _channel(args).read_boot_log(args.carrier_id)
    if text is None:
        print(f"csbench: carrier {args.carrier_id} has no boot.log in this campaign", file=sys.stderr)
        return 1
    _emit(args, {"carrier_id": args.carrier_id, "boot_log": text}, text.rstrip("\n"))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    d = _channel(args).job_detail(args.job_id)
    if d.spec is None and not d.claims and d.result is None and not d.problems:
        print(f"csbench: no job {args.job_id} in this campaign", file=sys.stderr)
        return 1
    doc = {"job_id": d.job_id, "state": d.state, "spec": _dump(d.spec), "claims": [_dump(c) for c in d.claims],
           "progress": _dump(d.progress), "result": _dump(d.result), "superseded": [_dump(r) for r in d.superseded],
           "telemetry_objects": d.telemetry_objects, "problems": [p.__dict__ for p in d.problems]}
    lines = [f"job       {d.job_id}", f"state     {d.state}"]
    if d.spec:
        lines += [f"probe     {d.spec.probe}", f"target    {d.spec.target.kind.value} {d.spec.target.url}",
                  f"timeout   {d.spec.timeout_s:g}s, max attempts {d.spec.max_attempts}",
                  f"created   {d.spec.created_at.isoformat()}"]
    for c in d.claims:
        lines.append(f"claim     attempt {c.attempt} by {c.carrier_id} at {c.claimed_at.isoformat()}")
    if d.progress:
        p = d.progress
        lines.append(f"progress  attempt {p.attempt} {p.phase.value} {p.completed}/{p.total or '?'} "
                     f"{p.elapsed_s:.1f}s")
    if d.result:
        r = d.result
        lines.append(f"result    {r.status.value} attempt {r.attempt} by {r.carrier_id or 'control'}"
                     f"{' ' + r.reason if r.reason else ''}{': ' + r.message if r.message else ''}")
    for r in d.superseded:
        lines.append(f"superseded attempt {r.attempt} {r.status.value} by {r.carrier_id}")
    lines.append(f"telemetry {d.telemetry_objects} object(s)")
    lines += [f"problem   {p.key}: {p.reason}" for p in d.problems]
    _emit(args, doc, "\n".join(lines))
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    if bool(args.carrier_id) == bool(args.all):
        raise UsageError("name one carrier or pass --all")
    key = _channel(args).stop(None if args.all else args.carrier_id, drain_s=args.drain)
    who = "all carriers" if args.all else f"carrier {args.carrier_id}"
    _emit(args, {"stop": key, "drain_s": args.drain}, f"asked {who} to stop (drain {args.drain:g}s): {key}")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    sent = _channel(args).cancel(args.job_id, reason=args.reason)
    text = (f"asked the carrier running {args.job_id} to cancel it" if sent
            else f"job {args.job_id} already has a result; nothing to cancel")
    _emit(args, {"job_id": args.job_id, "cancel_sent": sent}, text)
    return 0


def cmd_secret_set(args: argparse.Namespace) -> int:
    # The value comes from stdin, never argv: argv is visible in ps and shell history.
    value = sys.stdin.read().rstrip("\n")
    if not value:
        print(f"csbench carrier secret-set: no value on stdin for {args.name!r}", file=sys.stderr)
        return 2
    key = _channel(args).put_secret(args.name, value)
    _emit(args, {"name": args.name, "key": key}, f"stored secret {args.name!r} at {key}")
    return 0


# -- parser --------------------------------------------------------------------------------------------
def add_carrier_parser(sub: Any) -> None:
    """Add `carrier` to the top-level subparsers (called from csbench.cli.build_parser)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--bucket", default=os.environ.get("CSBENCH_OSS_BUCKET"), help="OSS bucket")
    common.add_argument("--region", default=os.environ.get("ALIBABA_CLOUD_REGION_ID", "cn-hangzhou"))
    common.add_argument("--endpoint", help="OSS endpoint override (default: the region's public endpoint)")
    common.add_argument("--campaign-uid", default=os.environ.get("CSBENCH_CAMPAIGN_UID"),
                        help="the Campaign's UID (its prefix csbench/v1/campaigns/<uid>/)")
    common.add_argument("-o", "--output", choices=("table", "json"), default="table")

    carrier = sub.add_parser("carrier", help="inspect carriers and jobs of a campaign in OSS; stop, cancel")
    cmds = carrier.add_subparsers(dest="carrier_command", required=True)
    cmds.add_parser("jobs", parents=[common], help="every job: state, attempts, progress").set_defaults(
        func=cmd_jobs)
    cmds.add_parser("carriers", parents=[common],
                    help="every carrier: heartbeat age, seq, state, job, last error").set_defaults(func=cmd_carriers)
    p = cmds.add_parser("logs", parents=[common], help="a carrier's boot.log")
    p.add_argument("carrier_id")
    p.set_defaults(func=cmd_logs)
    p = cmds.add_parser("show", parents=[common], help="one job: spec summary, claims, progress, result")
    p.add_argument("job_id")
    p.set_defaults(func=cmd_show)
    p = cmds.add_parser("stop", parents=[common], help="drain, then stop one carrier or all")
    p.add_argument("carrier_id", nargs="?")
    p.add_argument("--all", action="store_true", help="every carrier of the campaign")
    p.add_argument("--drain", type=float, default=30.0, metavar="S", help="seconds to let a running job finish")
    p.set_defaults(func=cmd_stop)
    p = cmds.add_parser("cancel", parents=[common], help="cancel one job (cooperative)")
    p.add_argument("job_id")
    p.add_argument("--reason", default="requested from the command line")
    p.set_defaults(func=cmd_cancel)
    p = cmds.add_parser("secret-set", parents=[common],
                        help="store a target credential jobs name by reference (value read from stdin)")
    p.add_argument("name")
    p.set_defaults(func=cmd_secret_set)
    for action in cmds.choices.values():
        action.set_defaults(wrapped=action.get_default("func"), func=_run)


def _run(args: argparse.Namespace) -> int:
    """Turn expected failures into one clear line and an exit code instead of a traceback."""
    from csbench.probe.blobstore import StoreError

    try:
        return int(args.wrapped(args))
    except UsageError as exc:
        print(f"csbench carrier: {exc}", file=sys.stderr)
        return 2
    except StoreError as exc:
        hint = " (retry later)" if exc.transient else " (check the bucket, region, endpoint and the key's permissions)"
        print(f"csbench carrier: {exc}{hint}", file=sys.stderr)
        return 1
    except ValueError as exc:  # bad ids on the command line
        print(f"csbench carrier: {exc}", file=sys.stderr)
        return 2


