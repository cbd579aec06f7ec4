"""The ECS stand-in's configuration (`config={"ecs": {...}}`), validated strictly: an unknown key is an error.

Defaults are realistic but quick: an instance is Running about two seconds after RunInstances, AutoReleaseTime
must be ≥ 30 minutes ahead (Aliyun's rule; tests lower `auto_release_min_seconds`), and every zone has stock.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from csbench.localcloud.ecs.errors import CATALOGUE


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Image(_Strict):
    image_id: str
    name: str
    os_type: Literal["linux", "windows"] = "linux"
    os_name: str
    platform: str
    architecture: Literal["x86_64", "arm64"] = "x86_64"
    owner_alias: Literal["system", "self", "others", "marketplace"] = "system"
    size_gb: int = 20


DEFAULT_IMAGES = [
    Image(image_id="aliyun_3_x64_20G_alibase_20240819.vhd", name="aliyun_3_x64_20G_alibase_20240819.vhd",
          os_name="Alibaba Cloud Linux  3.2104 LTS 64位", platform="Aliyun"),
    Image(image_id="aliyun_3_arm64_20G_alibase_20240819.vhd", name="aliyun_3_arm64_20G_alibase_20240819.vhd",
          os_name="Alibaba Cloud Linux  3.2104 LTS 64位 ARM版", platform="Aliyun", architecture="arm64"),
    Image(image_id="ubuntu_22_04_x64_20G_alibase_20240101.vhd", name="ubuntu_22_04_x64_20G_alibase_20240101.vhd",
          os_name="Ubuntu  22.04 64位", platform="Ubuntu"),
    Image(image_id="ubuntu_22_04_arm64_20G_alibase_20240101.vhd", name="ubuntu_22_04_arm64_20G_alibase_20240101.vhd",
          os_name="Ubuntu  22.04 64位 ARM版", platform="Ubuntu", architecture="arm64"),
]

# instance type -> (vCPU, memory GiB)
DEFAULT_INSTANCE_TYPES: dict[str, tuple[int, float]] = {
    "ecs.t6-c1m1.large": (2, 2), "ecs.t6-c1m2.large": (2, 4), "ecs.u1-c1m1.large": (2, 2),
    "ecs.u1-c1m2.large": (2, 4), "ecs.e-c1m2.large": (2, 4), "ecs.g7.large": (2, 8), "ecs.g7.xlarge": (4, 16),
    "ecs.c7.large": (2, 4), "ecs.c7.xlarge": (4, 8), "ecs.g8i.large": (2, 8), "ecs.c8i.large": (2, 4),
    "ecs.g8y.large": (2, 8), "ecs.c8y.large": (2, 4),
}

StockCategory = Literal["WithStock", "ClosedWithStock", "WithoutStock", "ClosedWithoutStock"]


class FaultRule(_Strict):
    """Answer matching requests with an error instead of serving them.

    A rule matches by `action` (None = any), and for RunInstances optionally by `zone_id`/`instance_type`.
    It is bounded by `count` (matches it answers, then it is spent) and/or `duration_seconds` (from when it
    was added); unbounded rules stay until removed. `skip` lets the first N matching requests through.
    """

    code: str
    action: str | None = None
    http_status: int | None = None  # default: the catalogue's status for `code` (400 for unknown codes)
    message: str | None = None
    count: int | None = Field(default=None, ge=1)
    duration_seconds: float | None = Field(default=None, gt=0)
    skip: int = Field(default=0, ge=0)
    zone_id: str | None = None
    instance_type: str | None = None
    retry_after_seconds: int | None = None  # sets x-acs-retry-after (the SDK then raises ThrottlingException)

    @model_validator(mode="after")
    def _status(self) -> FaultRule:
        if self.http_status is None and self.code not in CATALOGUE:
            raise ValueError(f"fault code {self.code!r} is not in the catalogue; give http_status explicitly")
        return self


class EcsConfig(_Strict):
    # Status machine (seconds)
    pending_seconds: float = Field(default=1.0, ge=0)
    starting_seconds: float = Field(default=1.0, ge=0)
    stopping_seconds: float = Field(default=0.3, ge=0)
    # A new instance is invisible to DescribeInstances/DescribeInstanceStatus for this long (eventual consistency).
    visibility_delay_seconds: float = Field(default=0.0, ge=0)
    # AutoReleaseTime window. Aliyun: at least 30 minutes ahead, at most 3 years.
    auto_release_min_seconds: float = Field(default=1800.0, ge=0)
    auto_release_max_seconds: float = Field(default=3 * 365 * 86400.0, gt=0)
    # InvalidUser.PassRoleForbidden for this long after a RAM role is created (RAM propagation delay).
    pass_role_propagation_seconds: float = Field(default=0.0, ge=0)
    # Images, zones and stock
    images: list[Image] = Field(default_factory=lambda: list(DEFAULT_IMAGES))
    instance_types: dict[str, tuple[int, float]] = Field(default_factory=lambda: dict(DEFAULT_INSTANCE_TYPES))
    zones: list[str] | None = None  # default: <region>-h, -i, -j
    # zone -> instance type -> stock category; anything unlisted is WithStock.
    stock: dict[str, dict[str, StockCategory]] = Field(default_factory=dict)
    system_disk_categories: list[str] = Field(
        default_factory=lambda: ["cloud_essd", "cloud_ssd", "cloud_efficiency", "cloud_auto", "cloud", "cloud_essd_entry"])
    vswitch_zones: dict[str, str] = Field(default_factory=dict)  # VSwitchId -> ZoneId, when a test cares
    max_user_data_bytes: int = 32 * 1024
    faults: list[FaultRule] = Field(default_factory=list)
    # Booting
    boot: bool = True  # run UserData in a sandbox when an instance reaches Running
    sandbox_isolation: Literal["auto", "unshare", "none"] = "auto"
    sts_ttl_seconds: float = Field(default=3600.0, ge=60)
    metadata_http_tokens: Literal["optional", "required"] = "optional"
    kill_grace_seconds: float = Field(default=2.0, ge=0)

    def zone_ids(self, region: str) -> list[str]:
        return self.zones if self.zones is not None else [f"{region}-h", f"{region}-i", f"{region}-j"]


def load_config(raw: dict | None) -> EcsConfig:
    """Validate `raw`; errors name the offending key (e.g. "ecs config: pending_secs: Extra inputs ...")."""
    try:
        return EcsConfig.model_validate(raw or {})
    except ValidationError as e:
        details = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in e.errors())
        raise ValueError(f"ecs config: {details}") from None
