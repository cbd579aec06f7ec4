"""`cb-probe` / `python -m csbench.probe`: the carrier process (settings: CB_PROBE_* env, see config.py).

Exit codes: 0 after a stop, an idle timeout or SIGTERM (final.json written); 2 on a configuration error
(nothing to retry — fix the unit's Environment= lines); 1 on a bug (systemd restarts it).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from csbench import __version__
from csbench.probe.config import ConfigError, ProbeConfig, load_config

if TYPE_CHECKING:
    from csbench.probe.blobstore import OssBlobStore
    from csbench.probe.carrier import Outcome

log = logging.getLogger("csbench.probe")


def build_store(cfg: ProbeConfig) -> OssBlobStore:
    import oss2
    import oss2.credentials

    from csbench.probe.blobstore import EcsMetadataCredentials, OssBlobStore

    # Our loop retries with backoff; oss2's own retries would multiply a stalled call's duration.
    oss2.defaults.request_retries = 1
    creds: oss2.credentials.CredentialsProvider
    if cfg.access_key_id is not None and cfg.access_key_secret is not None:
        creds = oss2.credentials.StaticCredentialsProvider(cfg.access_key_id.get_secret_value(),
                                                           cfg.access_key_secret.get_secret_value())
    else:
        creds = EcsMetadataCredentials(cfg.metadata_url, timeout_s=3.0)
    return OssBlobStore(cfg.bucket, region=cfg.region, endpoint=cfg.oss_endpoint, credentials=creds,
                        timeout_s=cfg.store_timeout_s)


def poweroff() -> None:
    """Stop billing: the VM has nothing left to do. systemctl first, plain poweroff as a fallback."""
    for cmd in (["systemctl", "poweroff"], ["poweroff"]):
        if shutil.which(cmd[0]) is None:
            continue
        try:
            if subprocess.run(cmd, timeout=30).returncode == 0:
                return
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.error("%s failed: %s", " ".join(cmd), exc)
    log.error("could not power off: neither `systemctl poweroff` nor `poweroff` worked")


async def _amain(cfg: ProbeConfig) -> Outcome:
    from csbench.probe.carrier import Carrier

    loop = asyncio.get_running_loop()
    # Store calls run in threads; a few may hang on a stalled store for a timeout — keep room for the rest.
    loop.set_default_executor(ThreadPoolExecutor(max_workers=16, thread_name_prefix="store"))
    carrier = Carrier(cfg, build_store(cfg), package_version=__version__)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, carrier.request_exit, sig.name)
    log.info("carrier %s (incarnation %s, csbench %s) polling %s on %s", cfg.carrier_id, carrier.incarnation,
             __version__, carrier.keys.signals_dir, cfg.oss_endpoint)
    return await carrier.run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cb-probe", description="csbench in-region probe carrier")
    parser.add_argument("--poweroff", action="store_true",
                        help="power the VM off after a stop or an idle timeout (the VM stops billing)")
    parser.add_argument("--version", action="version", version=f"cb-probe {__version__}")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("CB_PROBE_LOG_LEVEL", "INFO").upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(os.environ)
    except ConfigError as exc:
        print(f"cb-probe: configuration error: {exc}. Set it in the environment "
              f"(on a carrier VM: the Environment= lines of cb-probe.service).", file=sys.stderr)
        return 2
    run: Any = asyncio.run
    try:
        import uvloop

        run = uvloop.run
    except ImportError:  # uvloop is optional (not on Windows); asyncio's loop works, a bit slower
        pass
    outcome: Outcome = run(_amain(cfg))
    from csbench.probe.protocol import ExitReason

    if args.poweroff and outcome.exit_reason in (ExitReason.stopped, ExitReason.idle):
        poweroff()
    return 0


if __name__ == "__main__":
    sys.exit(main())
