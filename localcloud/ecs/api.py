"""ECS actions as plain functions of (parameters, time) → response dict, or an EcsError.

No HTTP here: `EcsApi.call(action, params, now)` is what the aiohttp layer invokes after the signature check,
and what unit tests can call directly. Parameters arrive exactly as the SDK puts them on the wire (flat
strings: `Tag.1.Key`, `InstanceId.2`, `SystemDisk.Category`, `InstanceIds='["i-1"]'`, `Force=True`).
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import hashlib
import json
import secrets
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from csbench.localcloud.credentials import CredentialStore
from csbench.localcloud.ecs.config import EcsConfig, FaultRule, Image
from csbench.localcloud.ecs.errors import EcsError, invalid, missing
from csbench.localcloud.ecs.instances import (
    PENDING,
    RUNNING,
    STARTING,
    STATUSES,
    STOPPED,
    STOPPING,
    Instance,
    InstanceStore,
    iso_minute,
    new_instance_id,
)

Params = dict[str, str]


def request_id() -> str:
    return str(uuid.uuid4()).upper()


# -- parameter helpers (pure) -----------------------------------------------------------------------

def req(params: Params, name: str) -> str:
    value = params.get(name, "")
    if value == "":
        raise missing(name)
    return value


def as_int(params: Params, name: str, default: int, lo: int, hi: int, code: str | None = None) -> int:
    raw = params.get(name, "")
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise EcsError(code, "") if code else invalid(name, f"{raw!r} is not an integer.") from None
    if not lo <= value <= hi:
        raise EcsError(code, "") if code else invalid(name, f"It must be between {lo} and {hi}; got {value}.")
    return value


def as_bool(params: Params, name: str) -> bool:
    raw = params.get(name, "")
    if raw.lower() in ("", "false"):
        return False
    if raw.lower() == "true":
        return True
    raise invalid(name, f"Use true or false; got {raw!r}.")


def indexed(params: Params, prefix: str, limit: int = 100) -> list[str]:
    """`InstanceId.1`, `InstanceId.2`, … → values in index order (gaps allowed, as the SDK never makes them)."""
    found: list[tuple[int, str]] = []
    for key, value in params.items():
        head, dot, idx = key.partition(".")
        if head == prefix and dot and idx.isdigit():
            found.append((int(idx), value))
    if len(found) > limit:
        raise invalid(prefix, f"At most {limit} values are accepted; got {len(found)}.")
    return [v for _, v in sorted(found)]


def tags_from(params: Params, limit: int = 20) -> list[tuple[str, str | None]]:
    """`Tag.N.Key` / `Tag.N.Value` → [(key, value or None)] in index order."""
    by_index: dict[int, dict[str, str]] = {}
    for key, value in params.items():
        parts = key.split(".")
        if len(parts) == 3 and parts[0] == "Tag" and parts[1].isdigit() and parts[2] in ("Key", "Value"):
            by_index.setdefault(int(parts[1]), {})[parts[2]] = value
    if len(by_index) > limit:
        raise invalid("Tag", f"At most {limit} tags are accepted; got {len(by_index)}.")
    out: list[tuple[str, str | None]] = []
    for idx in sorted(by_index):
        item = by_index[idx]
        if not item.get("Key"):
            raise EcsError("InvalidTagKey.Malformed" if "Key" in item else "MissingParameter",
                           f"Tag.{idx}.Key must be given and non-empty.", status=400)
        out.append((item["Key"], item.get("Value")))
    return out


def parse_release_time(value: str, now: float, min_s: float, max_s: float) -> float:
    """`yyyy-MM-ddTHH:mm:ssZ` (UTC) inside [now+min_s, now+max_s]; else InvalidAutoReleaseTime.Malformed."""
    try:
        ts = datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        raise EcsError("InvalidAutoReleaseTime.Malformed",
                       f"AutoReleaseTime {value!r} is not valid; use UTC ISO 8601 yyyy-MM-ddTHH:mm:ssZ.") from None
    if ts < now + min_s - 1:  # 1 s of slack: the client computed `now` a moment before we did
        raise EcsError("InvalidAutoReleaseTime.Malformed",
                       f"AutoReleaseTime {value} must be at least {int(min_s)} seconds after the current time.")
    if ts > now + max_s:
        raise EcsError("InvalidAutoReleaseTime.Malformed",
                       f"AutoReleaseTime {value} must be less than {int(max_s // 86400)} days after the current time.")
    return ts


def paginate_numbers(params: Params, default_size: int, max_size: int) -> tuple[int, int]:
    size = as_int(params, "PageSize", default_size, 1, max_size)
    number = as_int(params, "PageNumber", 1, 1, 1_000_000)
    return number, size


def encode_token(offset: int) -> str:
    # Opaque to clients (as on Aliyun); it is just the offset of the next item, base64-wrapped.
    return base64.urlsafe_b64encode(f"off:{offset}".encode()).decode().rstrip("=")


def decode_token(token: str) -> int:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        tag, _, num = raw.partition(":")
        if tag != "off" or not num.isdigit():
            raise ValueError
        return int(num)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise EcsError("InvalidNextToken", f"NextToken {token!r} is not valid; pass the NextToken of the previous page.") from None


# -- fault injection --------------------------------------------------------------------------------

@dataclass
class _ActiveRule:
    rule: FaultRule
    added_at: float
    seen: int = 0
    fired: int = 0


class FaultEngine:
    """Configured and runtime-added FaultRules; `check` raises the first matching rule's error."""

    def __init__(self, rules: list[FaultRule], now: float):
        self._lock = threading.Lock()
        self._rules = [_ActiveRule(r, now) for r in rules]

    def add(self, rule: FaultRule, now: float) -> None:
        with self._lock:
            self._rules.append(_ActiveRule(rule, now))

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def list(self, now: float) -> list[dict[str, Any]]:
        with self._lock:
            self._expire(now)
            return [{**a.rule.model_dump(exclude_none=True), "fired": a.fired} for a in self._rules]

    def _expire(self, now: float) -> None:
        self._rules = [a for a in self._rules
                       if (a.rule.count is None or a.fired < a.rule.count)
                       and (a.rule.duration_seconds is None or now - a.added_at < a.rule.duration_seconds)]

    def check(self, action: str, params: Params, now: float) -> None:
        with self._lock:
            self._expire(now)
            for a in self._rules:
                r = a.rule
                if r.action is not None and r.action != action:
                    continue
                if r.zone_id is not None and params.get("ZoneId") != r.zone_id:
                    continue
                if r.instance_type is not None and params.get("InstanceType") != r.instance_type:
                    continue
                a.seen += 1
                if a.seen <= r.skip:
                    continue
                a.fired += 1
                raise EcsError(r.code, r.message or "", r.http_status or 0, retry_after=r.retry_after_seconds or 0)


# -- the API ----------------------------------------------------------------------------------------

RUN_FINGERPRINT_EXCLUDE = {"ClientToken", "DryRun"}


class EcsApi:
    def __init__(self, config: EcsConfig, store: InstanceStore, credentials: CredentialStore, region: str,
                 clock: Callable[[], float] = time.time):
        self.config = config
        self.store = store
        self.credentials = credentials
        self.region = region
        self.clock = clock
        self.faults = FaultEngine(config.faults, clock())
        self.requests: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.images: dict[str, Image] = {i.image_id: i for i in config.images}
        self.zones = config.zone_ids(region)
        self.actions: dict[str, Callable[[Params, float], dict[str, Any]]] = {
            "RunInstances": self.run_instances,
            "DescribeInstances": self.describe_instances,
            "DescribeInstanceStatus": self.describe_instance_status,
            "DeleteInstances": self.delete_instances,
            "DeleteInstance": self.delete_instance,
            "ModifyInstanceAutoReleaseTime": self.modify_auto_release_time,
            "DescribeImages": self.describe_images,
            "DescribeAvailableResource": self.describe_available_resource,
            "DescribeZones": self.describe_zones,
            "DescribeRegions": self.describe_regions,
        }

    def call(self, action: str, params: Params, now: float | None = None) -> dict[str, Any]:
        """Serve one request; raises EcsError. The response dict lacks RequestId (the HTTP layer adds it)."""
        now = self.clock() if now is None else now
        self.requests[action] += 1
        try:
            handler = self.actions.get(action)
            if handler is None:
                raise EcsError("InvalidAction.NotFound",
                               f"Specified api {action!r} is not found; supported: {', '.join(sorted(self.actions))}.")
            self.faults.check(action, params, now)
            return handler(params, now)
        except EcsError as e:
            self.errors[f"{action}:{e.code}"] += 1
            raise

    def _region(self, params: Params) -> str:
        region = req(params, "RegionId")
        if region != self.region:
            raise EcsError("InvalidRegionId.NotFound", f"The region {region!r} does not exist; this cloud serves {self.region!r}.",
                           status=404)
        return region

    def _stock(self, zone: str, itype: str) -> str:
        return self.config.stock.get(zone, {}).get(itype, "WithStock")

    # -- RunInstances --------------------------------------------------------------------------------
    def run_instances(self, p: Params, now: float) -> dict[str, Any]:
        region = self._region(p)
        token = p.get("ClientToken", "")
        if len(token) > 64 or not token.isascii():
            raise invalid("ClientToken", "It must be at most 64 ASCII characters.")
        fingerprint = hashlib.sha256(json.dumps(
            {k: v for k, v in sorted(p.items()) if k not in RUN_FINGERPRINT_EXCLUDE}).encode()).hexdigest()
        dry_run = as_bool(p, "DryRun")
        if token and not dry_run:
            with self.store.lock:
                prior = self.store.tokens.get(token)
            if prior is not None:
                if prior.fingerprint != fingerprint:
                    raise EcsError("IdempotentParameterMismatch",
                                   f"ClientToken {token!r} was used by an earlier RunInstances with different "
                                   "parameters; reuse a token only to retry the identical request.")
                return self._run_response(prior.instance_ids)

        image_id = req(p, "ImageId")
        if image_id not in self.images:
            raise EcsError("InvalidImageId.NotFound", f"The specified ImageId {image_id!r} does not exist; see DescribeImages.")
        itype = req(p, "InstanceType")
        if itype not in self.config.instance_types:
            raise EcsError("InvalidInstanceType.ValueNotSupported",
                           f"The specified InstanceType {itype!r} does not exist or is not offered here; "
                           "see DescribeAvailableResource.")
        zone = p.get("ZoneId") or self.config.vswitch_zones.get(p.get("VSwitchId", ""), "")
        if zone and zone not in self.zones:
            raise EcsError("InvalidZoneId.NotFound", f"The specified ZoneId {zone!r} does not exist in {region}.")
        if not zone:  # like ECS without a zone: pick one that has stock for this type
            zone = next((z for z in self.zones if self._stock(z, itype) == "WithStock"), self.zones[0])
        if self._stock(zone, itype) != "WithStock":
            raise EcsError("OperationDenied.NoStock",
                           f"{itype} is out of stock in {zone}; try another zone or instance type, or retry later.")
        category = p.get("SystemDisk.Category") or "cloud_efficiency"
        if category not in self.config.system_disk_categories:
            raise EcsError("InvalidSystemDiskCategory.ValueNotSupported",
                           f"SystemDisk.Category {category!r} is not supported for {itype} in {zone}; "
                           f"use one of {self.config.system_disk_categories}.")
        disk_size = as_int(p, "SystemDisk.Size", 40, 20, 2048)
        amount = as_int(p, "Amount", 1, 1, 100, "InvalidParameter.Amount")
        min_amount = as_int(p, "MinAmount", amount, 1, 100, "InvalidParameter.Amount")
        if min_amount > amount:
            raise EcsError("InvalidParameter.Amount", f"MinAmount ({min_amount}) must not exceed Amount ({amount}).")
        bandwidth = as_int(p, "InternetMaxBandwidthOut", 0, 0, 100, "InvalidInternetMaxBandwidthOut.Malformed")
        user_data = p.get("UserData", "")
        if user_data:
            try:
                decoded = base64.b64decode(user_data, validate=True)
            except (binascii.Error, ValueError):
                raise EcsError("InvalidUserData.Base64FormatInvalid",
                               "UserData must be Base64-encoded (standard alphabet, padded).") from None
            if len(decoded) > self.config.max_user_data_bytes:
                raise EcsError("InvalidUserData.SizeExceeded",
                               f"UserData is {len(decoded)} bytes before encoding; the limit is {self.config.max_user_data_bytes}.")
        role = p.get("RamRoleName", "")
        if role:
            created = self.credentials.role_created_at(role)
            if created is None:
                raise EcsError("InvalidRamRole.NotFound",
                               f"The RAM role {role!r} does not exist; create it (and its trust policy for ECS) first.")
            if now - created < self.config.pass_role_propagation_seconds:
                raise EcsError("InvalidUser.PassRoleForbidden",
                               f"The RAM role {role!r} cannot be passed yet (created {now - created:.0f}s ago; "
                               "RAM changes take a while to propagate). Retry with backoff.")
        release_at = None
        if p.get("AutoReleaseTime"):
            release_at = parse_release_time(p["AutoReleaseTime"], now, self.config.auto_release_min_seconds,
                                            self.config.auto_release_max_seconds)
        tags = tags_from(p)
        charge = p.get("InstanceChargeType") or "PostPaid"
        if charge not in ("PostPaid", "PrePaid"):
            raise invalid("InstanceChargeType", "Use PostPaid or PrePaid.")
        sg_ids = [p["SecurityGroupId"]] if p.get("SecurityGroupId") else indexed(p, "SecurityGroupIds")
        if dry_run:
            raise EcsError("DryRunOperation")

        name = p.get("InstanceName", "")
        instances: list[Instance] = []
        for n in range(amount):
            iid = new_instance_id(region)
            inst = Instance(
                instance_id=iid, region_id=region, zone_id=zone, image_id=image_id, instance_type=itype,
                instance_name=(f"{name}{n + 1:03d}" if name and amount > 1 and as_bool(p, "UniqueSuffix") else name) or iid,
                host_name=p.get("HostName") or "iZ" + iid[2:] + "Z", description=p.get("Description", ""),
                created_at=now, visible_at=now + self.config.visibility_delay_seconds, status=PENDING,
                status_since=now, auto_release_at=release_at, user_data=user_data, ram_role_name=role,
                security_group_ids=sg_ids, vswitch_id=p.get("VSwitchId", ""),
                vpc_id=("vpc-" + hashlib.sha1(p.get("VSwitchId", "").encode()).hexdigest()[:20]) if p.get("VSwitchId") else "",
                private_ip=self.store.next_private_ip(),
                public_ip=self.store.next_public_ip() if bandwidth > 0 else "",
                internet_max_bandwidth_out=bandwidth, system_disk_category=category, system_disk_size=disk_size,
                instance_charge_type=charge, spot_strategy=p.get("SpotStrategy") or "NoSpot",
                deletion_protection=as_bool(p, "DeletionProtection"),
                tags=[[k, v or ""] for k, v in tags], client_token=token)
            instances.append(inst)
        self.store.add(instances, token, fingerprint, now)
        return self._run_response([i.instance_id for i in instances])

    @staticmethod
    def _run_response(ids: list[str]) -> dict[str, Any]:
        return {"InstanceIdSets": {"InstanceIdSet": list(ids)}, "OrderId": str(200000000000000 + secrets.randbelow(10**14)),
                "TradePrice": 0.0}

    # -- DescribeInstances ---------------------------------------------------------------------------
    def describe_instances(self, p: Params, now: float) -> dict[str, Any]:
        self._region(p)
        items = self.store.visible(now)
        if p.get("InstanceIds"):
            try:
                ids = json.loads(p["InstanceIds"])
                if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids) or len(ids) > 100:
                    raise ValueError
            except ValueError:
                raise EcsError("InvalidInstanceIds.Malformed",
                               'InstanceIds must be a JSON array of up to 100 ids, e.g. ["i-1","i-2"].') from None
            wanted = set(ids)
            items = [i for i in items if i.instance_id in wanted]
        if p.get("Status"):
            if p["Status"] not in STATUSES:
                raise EcsError("InvalidStatus.ValueNotSupported", f"Status {p['Status']!r} is not one of {list(STATUSES)}.")
            items = [i for i in items if i.status == p["Status"]]
        for key, value in tags_from(p):
            items = [i for i in items if key in i.tag_dict() and (value is None or i.tag_dict()[key] == value)]
        simple = {"ZoneId": "zone_id", "InstanceType": "instance_type", "ImageId": "image_id",
                  "VSwitchId": "vswitch_id", "VpcId": "vpc_id", "InstanceChargeType": "instance_charge_type"}
        for param, attr in simple.items():
            if p.get(param):
                items = [i for i in items if getattr(i, attr) == p[param]]
        if p.get("SecurityGroupId"):
            items = [i for i in items if p["SecurityGroupId"] in i.security_group_ids]
        if p.get("InstanceName"):
            items = [i for i in items if fnmatch.fnmatchcase(i.instance_name, p["InstanceName"])]

        total = len(items)
        body: dict[str, Any] = {"TotalCount": total}
        if p.get("NextToken") or p.get("MaxResults"):
            # Token pagination: NextToken is "" on the last page.
            size = as_int(p, "MaxResults", 10, 1, 100)
            offset = decode_token(p["NextToken"]) if p.get("NextToken") else 0
            page = items[offset:offset + size]
            body["NextToken"] = encode_token(offset + size) if offset + size < total else ""
            body.update(PageSize=size, PageNumber=offset // size + 1)
        else:
            number, size = paginate_numbers(p, 10, 100)
            page = items[(number - 1) * size:number * size]
            body.update(PageSize=size, PageNumber=number, NextToken="")
        body["Instances"] = {"Instance": [self._instance_view(i) for i in page]}
        return body

    def _instance_view(self, i: Instance) -> dict[str, Any]:
        cpu, mem = self.config.instance_types.get(i.instance_type, (2, 4))
        image = self.images.get(i.image_id)
        return {
            "InstanceId": i.instance_id, "InstanceName": i.instance_name, "HostName": i.host_name,
            "Description": i.description, "RegionId": i.region_id, "ZoneId": i.zone_id, "Status": i.status,
            "InstanceType": i.instance_type, "InstanceTypeFamily": ".".join(i.instance_type.split(".")[:2]),
            "Cpu": cpu, "Memory": int(mem * 1024), "ImageId": i.image_id,
            "OSType": image.os_type if image else "linux", "OSName": image.os_name if image else "",
            "OSNameEn": image.os_name if image else "",
            "CreationTime": iso_minute(i.created_at), "StartTime": iso_minute(i.start_time),
            "AutoReleaseTime": iso_minute(i.auto_release_at),
            "ExpiredTime": "2099-12-31T15:59Z", "InstanceChargeType": i.instance_charge_type,
            "InternetChargeType": "PayByTraffic", "SpotStrategy": i.spot_strategy,
            "InternetMaxBandwidthOut": i.internet_max_bandwidth_out, "InternetMaxBandwidthIn": 100 if i.public_ip else -1,
            "InstanceNetworkType": "vpc", "IoOptimized": True, "DeletionProtection": i.deletion_protection,
            "StoppedMode": "Not-applicable", "SerialNumber": hashlib.md5(i.instance_id.encode()).hexdigest(),
            "Recyclable": False, "GPUAmount": 0, "DeviceAvailable": True, "ResourceGroupId": "",
            "SecurityGroupIds": {"SecurityGroupId": list(i.security_group_ids)},
            "VpcAttributes": {"VpcId": i.vpc_id, "VSwitchId": i.vswitch_id, "NatIpAddress": "",
                              "PrivateIpAddress": {"IpAddress": [i.private_ip]}},
            "InnerIpAddress": {"IpAddress": []},
            "PublicIpAddress": {"IpAddress": [i.public_ip] if i.public_ip else []},
            "EipAddress": {"AllocationId": "", "IpAddress": "", "Bandwidth": 0},
            "OperationLocks": {"LockReason": []},
            "Tags": {"Tag": [{"TagKey": k, "TagValue": v} for k, v in i.tags]},
            "MetadataOptions": {"HttpEndpoint": "enabled", "HttpTokens": self.config.metadata_http_tokens},
        }

    # -- DescribeInstanceStatus ----------------------------------------------------------------------
    def describe_instance_status(self, p: Params, now: float) -> dict[str, Any]:
        self._region(p)
        items = self.store.visible(now)
        ids = indexed(p, "InstanceId")
        if ids:
            wanted = set(ids)
            items = [i for i in items if i.instance_id in wanted]
        if p.get("ZoneId"):
            items = [i for i in items if i.zone_id == p["ZoneId"]]
        number, size = paginate_numbers(p, 10, 50)
        page = items[(number - 1) * size:number * size]
        return {"TotalCount": len(items), "PageNumber": number, "PageSize": size,
                "InstanceStatuses": {"InstanceStatus": [{"InstanceId": i.instance_id, "Status": i.status} for i in page]}}

    # -- DeleteInstances -----------------------------------------------------------------------------
    def delete_instances(self, p: Params, now: float) -> dict[str, Any]:
        self._region(p)
        ids = indexed(p, "InstanceId")
        if not ids:
            raise missing("InstanceId.1")
        force = as_bool(p, "Force")
        token = p.get("ClientToken", "")
        if token and self.store.delete_tokens.get(token) == sorted(ids):
            return {}
        with self.store.lock:
            targets: list[Instance] = []
            for iid in ids:
                inst = self.store.get(iid)
                if inst is None or inst.visible_at > now:
                    raise EcsError("InvalidInstanceId.NotFound", f"The specified InstanceId {iid!r} does not exist.")
                targets.append(inst)
            for inst in targets:
                self._check_deletable(inst, force)
            if as_bool(p, "DryRun"):
                raise EcsError("DryRunOperation")
            for inst in targets:
                if not inst.releasing:
                    inst.releasing, inst.release_reason = True, "DeleteInstances"
                    if inst.status in (RUNNING, STARTING):
                        inst.set_status(STOPPING, now)
            if token:
                self.store.delete_tokens[token] = sorted(ids)
            self.store.save()
        return {}

    def delete_instance(self, p: Params, now: float) -> dict[str, Any]:
        iid = req(p, "InstanceId")
        q = {k: v for k, v in p.items() if k != "InstanceId"}
        q["InstanceId.1"] = iid
        q.setdefault("RegionId", self.region)
        return self.delete_instances(q, now)

    @staticmethod
    def _check_deletable(inst: Instance, force: bool) -> None:
        if inst.releasing:
            return  # deleting twice is fine: the second call is a no-op
        if inst.status == PENDING:
            raise EcsError("IncorrectInstanceStatus.Initializing",
                           f"Instance {inst.instance_id} is still initializing (Pending); retry in a few seconds.")
        if inst.deletion_protection:
            raise EcsError("InvalidOperation.DeletionProtection",
                           f"Instance {inst.instance_id} has deletion protection enabled.", status=403)
        if inst.status != STOPPED and not force:
            raise EcsError("IncorrectInstanceStatus",
                           f"Instance {inst.instance_id} is {inst.status}; stop it first or pass Force=true.")

    # -- ModifyInstanceAutoReleaseTime ---------------------------------------------------------------
    def modify_auto_release_time(self, p: Params, now: float) -> dict[str, Any]:
        iid = req(p, "InstanceId")
        with self.store.lock:
            inst = self.store.get(iid)
            if inst is None or inst.releasing:
                raise EcsError("InvalidInstanceId.NotFound", f"The specified InstanceId {iid!r} does not exist.")
            if inst.instance_charge_type != "PostPaid":
                raise EcsError("ChargeTypeViolation", "Only pay-as-you-go instances can be released automatically.",
                               status=403)
            value = p.get("AutoReleaseTime", "")
            # An empty AutoReleaseTime cancels automatic release (Aliyun semantics).
            inst.auto_release_at = parse_release_time(value, now, self.config.auto_release_min_seconds,
                                                      self.config.auto_release_max_seconds) if value else None
            self.store.save()
        return {}

    # -- DescribeImages ------------------------------------------------------------------------------
    def describe_images(self, p: Params, now: float) -> dict[str, Any]:
        region = self._region(p)
        images = list(self.images.values())
        if p.get("ImageId"):
            wanted = {x.strip() for x in p["ImageId"].split(",")}
            images = [i for i in images if i.image_id in wanted]
        if p.get("ImageOwnerAlias"):
            images = [i for i in images if i.owner_alias == p["ImageOwnerAlias"]]
        if p.get("OSType"):
            images = [i for i in images if i.os_type == p["OSType"].lower()]
        if p.get("Architecture"):
            arch = {"x86_64": "x86_64", "arm64": "arm64", "i386": "i386"}.get(p["Architecture"])
            if arch is None:
                raise invalid("Architecture", "Use x86_64, i386 or arm64.")
            images = [i for i in images if i.architecture == arch]
        if p.get("ImageName"):
            images = [i for i in images if fnmatch.fnmatchcase(i.name, p["ImageName"])]
        if p.get("Status") and "Available" not in p["Status"].split(","):
            images = []
        number, size = paginate_numbers(p, 10, 100)
        page = images[(number - 1) * size:number * size]
        return {"RegionId": region, "TotalCount": len(images), "PageNumber": number, "PageSize": size,
                "Images": {"Image": [{
                    "ImageId": i.image_id, "ImageName": i.name, "ImageOwnerAlias": i.owner_alias,
                    "OSType": i.os_type, "OSName": i.os_name, "OSNameEn": i.os_name, "Platform": i.platform,
                    "Architecture": i.architecture, "Status": "Available", "Size": i.size_gb, "Usage": "instance",
                    "IsSupportCloudinit": True, "IsSupportIoOptimized": True, "IsPublic": i.owner_alias == "system",
                    "Progress": "100%", "CreationTime": "2024-08-19T00:00:00Z", "BootMode": "BIOS",
                    "ImageFamily": "", "Description": "",
                } for i in page]}}

    # -- DescribeAvailableResource / DescribeZones / DescribeRegions ---------------------------------
    def describe_available_resource(self, p: Params, now: float) -> dict[str, Any]:
        region = self._region(p)
        dest = req(p, "DestinationResource")
        if dest not in ("Zone", "InstanceType", "SystemDisk", "IoOptimized", "InstanceTypeFamily", "Network", "DataDisk"):
            raise EcsError("InvalidParameter.DestinationResource", f"DestinationResource {dest!r} is not supported.")
        zones = [z for z in self.zones if not p.get("ZoneId") or z == p["ZoneId"]]
        types = [t for t in self.config.instance_types if not p.get("InstanceType") or t == p["InstanceType"]]

        def status_of(category: str) -> str:
            return "Available" if category in ("WithStock", "ClosedWithStock") else "SoldOut"

        out = []
        for zone in zones:
            cats = [self._stock(zone, t) for t in types]
            zone_cat = "WithStock" if "WithStock" in cats else (cats[0] if cats else "WithoutStock")
            resources: list[dict[str, Any]] = []
            if dest in ("InstanceType", "InstanceTypeFamily"):
                values = [(t, self._stock(zone, t)) for t in types] if dest == "InstanceType" else \
                    sorted({(".".join(t.split(".")[:2]), self._stock(zone, t)) for t in types})
                resources.append({"Type": dest, "SupportedResources": {"SupportedResource": [
                    {"Value": v, "Status": status_of(c), "StatusCategory": c} for v, c in values]}})
            elif dest in ("SystemDisk", "DataDisk"):
                resources.append({"Type": dest, "SupportedResources": {"SupportedResource": [
                    {"Value": c, "Status": "Available", "StatusCategory": "WithStock", "Min": 20, "Max": 2048,
                     "Unit": "GiB"} for c in self.config.system_disk_categories]}})
            out.append({"ZoneId": zone, "RegionId": region, "Status": status_of(zone_cat),
                        "StatusCategory": zone_cat, "AvailableResources": {"AvailableResource": resources}})
        return {"AvailableZones": {"AvailableZone": out}}

    def describe_zones(self, p: Params, now: float) -> dict[str, Any]:
        self._region(p)
        return {"Zones": {"Zone": [{"ZoneId": z, "LocalName": z, "ZoneType": "AvZone"} for z in self.zones]}}

    def describe_regions(self, p: Params, now: float) -> dict[str, Any]:
        return {"Regions": {"Region": [{"RegionId": self.region, "LocalName": self.region,
                                        "RegionEndpoint": "ecs.aliyuncs.com", "Status": "available"}]}}

    # -- driven by the server ------------------------------------------------------------------------
    def tick(self, now: float | None = None) -> list[tuple[str, Instance]]:
        now = self.clock() if now is None else now
        return self.store.advance(now, self.config.pending_seconds, self.config.starting_seconds,
                                  self.config.stopping_seconds)


__all__ = ["EcsApi", "FaultEngine", "request_id", "STOPPED", "STOPPING"]
