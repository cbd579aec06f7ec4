"""`csbench report`: write a campaign's results as one self-contained HTML file.

Two sources: a campaign in OSS (`--bucket`, `--campaign-uid`; credentials from ALIBABA_CLOUD_ACCESS_KEY_ID /
ALIBABA_CLOUD_ACCESS_KEY_SECRET as for `csbench carrier`), or a folder of Result JSON files (`--from-dir`),
which is what the demo and the tests use. The file needs nothing at view time: no network, no CDN.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any


def cmd_report(args: argparse.Namespace) -> int:
    from csbench.report import load_channel, load_dir, render_report

    if args.from_dir:
        try:
            report = load_dir(Path(args.from_dir), campaign=args.campaign_uid)
        except FileNotFoundError as exc:
            print(f"csbench report: {exc}", file=sys.stderr)
            return 2
    else:
        from csbench.carrier_cli import UsageError, _channel
        from csbench.probe.blobstore import StoreError

        try:
            channel = _channel(args)
            report = load_channel(channel, source=f"oss://{args.bucket}/{channel.keys.prefix}",
                                  with_telemetry=not args.no_telemetry)
        except UsageError as exc:
            print(f"csbench report: {exc}", file=sys.stderr)
            return 2
        except StoreError as exc:
            hint = " (retry later)" if exc.transient else " (check the bucket, region, endpoint and permissions)"
            print(f"csbench report: {exc}{hint}", file=sys.stderr)
            return 1
        except ValueError as exc:  # a malformed campaign uid
            print(f"csbench report: {exc}", file=sys.stderr)
            return 2
    html = render_report(report)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(out)  # never leave a half-written report where the last good one was
    print(f"wrote {out} ({len(html) // 1024} KiB): {len(report.jobs)} job(s), verdict {report.verdict}"
          + (f", {len(report.problems)} problem(s) noted in the report" if report.problems else ""),
          file=sys.stderr)
    return 0


def add_report_parser(sub: Any) -> None:
    """Add `report` to the top-level subparsers (called from csbench.cli.build_parser)."""
    p = sub.add_parser("report", help="a campaign's results as one self-contained HTML file with charts")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--from-dir", metavar="DIR", help="read Result JSON files from DIR (recursively) instead of OSS")
    src.add_argument("--bucket", default=os.environ.get("CSBENCH_OSS_BUCKET"), help="OSS bucket")
    p.add_argument("--campaign-uid", default=os.environ.get("CSBENCH_CAMPAIGN_UID"),
                   help="the Campaign's UID (with --from-dir: only the name shown in the report)")
    p.add_argument("--region", default=os.environ.get("ALIBABA_CLOUD_REGION_ID", "cn-hangzhou"))
    p.add_argument("--endpoint", help="OSS endpoint override (default: the region's public endpoint)")
    p.add_argument("--no-telemetry", action="store_true",
                   help="do not download raw samples; charts use the summary percentiles")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the HTML file to write")
    p.set_defaults(func=cmd_report)
