"""Build a wheel of this source checkout, offline, for carriers booted in development and in localcloud.

A released carrier installs `csbench[probe]==<version>` from an index; in development it installs the wheel
built here, fetched through a presigned URL and checked by sha256 (see operator/userdata.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def build_dev_wheel(out_dir: Path, source: Path = REPO) -> Path:
    if not (source / "pyproject.toml").exists():
        raise RuntimeError(f"{source} is not a csbench source checkout; a dev wheel needs one")
    out_dir.mkdir(parents=True, exist_ok=True)
    # No build isolation: setuptools and wheel come from the dev environment, so nothing is downloaded.
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out_dir),
         str(source)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"building the dev wheel of {source} failed:\n{proc.stderr[-3000:]}")
    wheels = sorted(out_dir.glob("csbench-*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise RuntimeError(f"pip wheel left no csbench wheel in {out_dir}")
    return wheels[-1]
