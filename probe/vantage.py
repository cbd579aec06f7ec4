"""Where a measurement was taken from (vantage) and with what (provenance), stamped on every result.

A number without its vantage is the seed's mislabel (in-region results stamped "local"); here the carrier
reads its own instance facts from the ECS metadata service and says plainly when it could not.
"""

from __future__ import annotations

import hashlib
import platform
import urllib.request
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any

# metadata path → vantage field
METADATA_FIELDS = {
    "instance-id": "instance_id",
    "region-id": "region",
    "zone-id": "zone",
    "image-id": "image_id",
    "instance/instance-type": "instance_type",
    "vpc-id": "vpc_id",
}


def fetch_metadata(metadata_url: str, timeout_s: float = 2.0) -> dict[str, str | None]:
    """Each known field, or None when the metadata service does not answer it (dev machines have none)."""
    found: dict[str, str | None] = {}
    base = metadata_url.rstrip("/") + "/latest/meta-data/"
    for path, name in METADATA_FIELDS.items():
        try:
            with urllib.request.urlopen(base + path, timeout=timeout_s) as resp:  # noqa: S310 (configured URL)
                found[name] = resp.read().decode().strip() or None
        except (OSError, ValueError):
            found[name] = None
    return found


def vantage(meta: dict[str, str | None] | None, *, carrier_id: str, instance_id: str | None, region: str,
            oss_endpoint: str, package_version: str) -> dict[str, Any]:
    """`meta` is None when the metadata service was not read: unknown facts stay None, never guessed."""
    meta = meta or {}
    return {
        "carrier_id": carrier_id,
        "instance_id": meta.get("instance_id") or instance_id,
        "instance_type": meta.get("instance_type"),
        "zone": meta.get("zone"),
        "image_id": meta.get("image_id"),
        "region": meta.get("region") or region,
        # In a VPC when the metadata service names one; None = unknown (no metadata service answered).
        "in_vpc": (meta.get("vpc_id") is not None) if any(meta.values()) else None,
        "oss_internal_endpoint": "-internal." in oss_endpoint,
        "package_version": package_version,
    }


def _dist_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def provenance(spec_body: bytes, started_at: datetime | None, finished_at: datetime) -> dict[str, Any]:
    return {
        "csbench_version": _dist_version("csbench"),
        "python": platform.python_version(),
        "aiohttp": _dist_version("aiohttp"),
        "uvloop": _dist_version("uvloop"),
        "platform": platform.platform(),
        "started_at": started_at.isoformat() if started_at else None,
        "finished_at": finished_at.isoformat(),
        "spec_sha256": hashlib.sha256(spec_body).hexdigest(),
    }
