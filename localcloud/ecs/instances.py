"""The instance model, its status machine, and the store persisted under `<state_dir>/ecs/instances.json`.

Status machine (all transitions happen in `InstanceStore.advance`, driven by the server's ticker):

    RunInstances ─► Pending ─(pending_seconds)─► Starting ─(starting_seconds)─► Running ─► [boot event]
    poweroff inside the instance ─► Stopping ─(stopping_seconds)─► Stopped
    DeleteInstances / AutoReleaseTime ─► releasing=True ─► [release event] ─► processes killed ─► gone

The store only records facts; it never starts or kills processes. `advance` returns events ("boot",
"release") for the server to act on, which keeps this module free of I/O other than its JSON file.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

PENDING, STARTING, RUNNING, STOPPING, STOPPED = "Pending", "Starting", "Running", "Stopping", "Stopped"
STATUSES = (PENDING, STARTING, RUNNING, STOPPING, STOPPED)


def iso_minute(ts: float | None) -> str:
    """Aliyun's DescribeInstances time format: `2026-12-02T11:54Z` (UTC, minute precision)."""
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%MZ")


def iso_second(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_instance_id(region: str) -> str:
    # Real ids look like i-bp1<17 chars> in cn-hangzhou: a short region-derived prefix and random base36.
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "i-" + "".join(secrets.choice(alphabet) for _ in range(20))


@dataclass
class Instance:
    instance_id: str
    region_id: str
    zone_id: str
    image_id: str
    instance_type: str
    instance_name: str
    host_name: str
    description: str
    created_at: float
    visible_at: float  # eventual consistency: Describe* hide the instance before this time
    status: str = PENDING
    status_since: float = 0.0
    start_time: float | None = None
    auto_release_at: float | None = None
    user_data: str = ""  # base64, as given
    ram_role_name: str = ""
    security_group_ids: list[str] = field(default_factory=list)
    vswitch_id: str = ""
    vpc_id: str = ""
    private_ip: str = ""
    public_ip: str = ""
    internet_max_bandwidth_out: int = 0
    system_disk_category: str = "cloud_efficiency"
    system_disk_size: int = 40
    instance_charge_type: str = "PostPaid"
    spot_strategy: str = "NoSpot"
    deletion_protection: bool = False
    tags: list[list[str]] = field(default_factory=list)  # [[key, value], ...] in the order given
    client_token: str = ""
    releasing: bool = False  # DeleteInstances or AutoReleaseTime: processes are being killed, then gone
    release_reason: str = ""
    release_started: bool = False
    user_data_ran: bool = False  # cloud-init runs user-data once per instance; a reboot does not re-run it
    boot_count: int = 0
    stop_reason: str = ""

    def set_status(self, status: str, now: float) -> None:
        self.status, self.status_since = status, now

    def tag_dict(self) -> dict[str, str]:
        return {k: v for k, v in self.tags}


@dataclass
class TokenRecord:
    fingerprint: str
    instance_ids: list[str]
    created_at: float


class InstanceStore:
    """Thread-safe store of instances and RunInstances client tokens, saved to JSON after every change."""

    def __init__(self, path: Path | None):
        self._path = path
        self.lock = threading.RLock()
        self.instances: dict[str, Instance] = {}
        self.tokens: dict[str, TokenRecord] = {}
        self.delete_tokens: dict[str, list[str]] = {}
        self._ip_counter = 10
        if path is not None and path.exists():
            self._load(path)

    # -- persistence ---------------------------------------------------------------------------------
    def save(self) -> None:
        if self._path is None:
            return
        with self.lock:
            doc = {
                "instances": [asdict(i) for i in self.instances.values()],
                "tokens": {k: asdict(v) for k, v in self.tokens.items()},
                "delete_tokens": self.delete_tokens,
                "ip_counter": self._ip_counter,
            }
            self._path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self._path.with_suffix(".tmp")
            tmp.write_text(json.dumps(doc, indent=1))
            tmp.replace(self._path)

    def _load(self, path: Path) -> None:
        doc = json.loads(path.read_text())
        self.instances = {d["instance_id"]: Instance(**d) for d in doc.get("instances", [])}
        self.tokens = {k: TokenRecord(**v) for k, v in doc.get("tokens", {}).items()}
        self.delete_tokens = doc.get("delete_tokens", {})
        self._ip_counter = int(doc.get("ip_counter", 10))

    # -- allocation ----------------------------------------------------------------------------------
    def next_private_ip(self) -> str:
        with self.lock:
            self._ip_counter += 1
            n = self._ip_counter
        return f"172.16.{(n // 250) % 250}.{n % 250 + 2}"

    def next_public_ip(self) -> str:
        return f"47.{secrets.randbelow(200) + 20}.{secrets.randbelow(250)}.{secrets.randbelow(250) + 1}"

    # -- queries -------------------------------------------------------------------------------------
    def get(self, instance_id: str) -> Instance | None:
        with self.lock:
            return self.instances.get(instance_id)

    def visible(self, now: float) -> list[Instance]:
        """Instances Describe* can see: past the consistency delay, ordered by creation (a batch in RunInstances order)."""
        with self.lock:
            items = [i for i in self.instances.values() if i.visible_at <= now]
        return sorted(items, key=lambda i: i.created_at)  # stable: a batch keeps RunInstances order

    def add(self, instances: list[Instance], token: str, fingerprint: str, now: float) -> None:
        with self.lock:
            for inst in instances:
                self.instances[inst.instance_id] = inst
            if token:
                self.tokens[token] = TokenRecord(fingerprint, [i.instance_id for i in instances], now)
            self.save()

    def remove(self, instance_id: str) -> Instance | None:
        with self.lock:
            inst = self.instances.pop(instance_id, None)
            self.save()
        return inst

    # -- the status machine --------------------------------------------------------------------------
    def advance(self, now: float, pending_s: float, starting_s: float, stopping_s: float) -> list[tuple[str, Instance]]:
        """Move every instance along its status machine; return (event, instance) pairs for the server."""
        events: list[tuple[str, Instance]] = []
        changed = False
        with self.lock:
            for inst in list(self.instances.values()):
                if inst.releasing:
                    if not inst.release_started:
                        inst.release_started = True
                        events.append(("release", inst))
                        changed = True
                    continue
                if inst.auto_release_at is not None and now >= inst.auto_release_at:
                    inst.releasing, inst.release_reason, inst.release_started = True, "AutoRelease", True
                    events.append(("release", inst))
                    changed = True
                    continue
                if inst.status == PENDING and now - inst.status_since >= pending_s:
                    inst.set_status(STARTING, now)
                    changed = True
                if inst.status == STARTING and now - inst.status_since >= starting_s:
                    inst.set_status(RUNNING, now)
                    inst.start_time = now
                    inst.boot_count += 1
                    events.append(("boot", inst))
                    changed = True
                elif inst.status == STOPPING and now - inst.status_since >= stopping_s:
                    inst.set_status(STOPPED, now)
                    changed = True
            if changed:
                self.save()
        return events

    def mark_stopping(self, instance_id: str, reason: str, now: float | None = None) -> None:
        """The guest powered off (or its init died): Running → Stopping; `advance` finishes at Stopped."""
        with self.lock:
            inst = self.instances.get(instance_id)
            if inst is None or inst.releasing or inst.status not in (RUNNING, STARTING):
                return
            inst.set_status(STOPPING, now or time.time())
            inst.stop_reason = reason
            self.save()
