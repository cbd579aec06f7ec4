"""Carrier settings from CB_PROBE_* environment variables (the systemd unit's Environment= lines).

Only non-secret settings travel through user-data; the optional static keys exist for development
against localcloud. A missing or invalid variable is one ConfigError naming it; `cb-probe` exits 2.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from csbench.probe.blobstore import DEFAULT_METADATA_URL, oss_endpoint
from csbench.probe.protocol import check_id

# env var -> field name. Order is the order errors are reported in.
ENV: dict[str, str] = {
    "CB_PROBE_BUCKET": "bucket",
    "CB_PROBE_REGION": "region",
    "CB_PROBE_ENDPOINT": "endpoint",
    "CB_PROBE_CAMPAIGN_UID": "campaign_uid",
    "CB_PROBE_CARRIER_ID": "carrier_id",
    "CB_PROBE_INSTANCE_ID": "instance_id",
    "CB_PROBE_POLL_INTERVAL": "poll_interval_s",
    "CB_PROBE_HEARTBEAT_INTERVAL": "heartbeat_interval_s",
    "CB_PROBE_PROGRESS_INTERVAL": "progress_interval_s",
    "CB_PROBE_IDLE_TIMEOUT": "idle_timeout_s",
    "CB_PROBE_DRAIN_TIMEOUT": "drain_timeout_s",
    "CB_PROBE_METADATA_URL": "metadata_url",
    "CB_PROBE_STORE_TIMEOUT": "store_timeout_s",
    "CB_PROBE_ACCESS_KEY_ID": "access_key_id",
    "CB_PROBE_ACCESS_KEY_SECRET": "access_key_secret",
}
FIELD_ENV = {v: k for k, v in ENV.items()}
# Never rendered into user-data or logged.
SECRET_ENV = frozenset({"CB_PROBE_ACCESS_KEY_ID", "CB_PROBE_ACCESS_KEY_SECRET"})


class ConfigError(ValueError):
    def __init__(self, var: str, problem: str):
        super().__init__(f"{var}: {problem}")
        self.var = var


class ProbeConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    bucket: str = Field(min_length=3, max_length=63)
    region: str = Field(min_length=1, pattern=r"^[a-z0-9-]+$")
    endpoint: str | None = None  # None → the region's VPC-internal endpoint
    campaign_uid: str
    carrier_id: str
    instance_id: str | None = None  # None → read from the metadata service
    poll_interval_s: float = Field(default=2.0, gt=0, le=300)
    heartbeat_interval_s: float = Field(default=5.0, gt=0, le=300)
    progress_interval_s: float = Field(default=2.0, gt=0, le=300)
    idle_timeout_s: float = Field(default=3600.0, gt=0)
    drain_timeout_s: float = Field(default=60.0, ge=0)
    metadata_url: str = DEFAULT_METADATA_URL
    store_timeout_s: float = Field(default=5.0, gt=0, le=120)
    access_key_id: SecretStr | None = None
    access_key_secret: SecretStr | None = None

    @field_validator("campaign_uid", "carrier_id")
    @classmethod
    def _dns_label(cls, v: str) -> str:
        return check_id(v, "value")

    @field_validator("endpoint", "metadata_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError(f"{v!r} must start with http:// or https://")
        return v.rstrip("/") if v else v

    @property
    def busy_poll_interval_s(self) -> float:
        # While a job runs, a cancel must be seen within ~1 s.
        return min(self.poll_interval_s, 1.0)

    @property
    def lease_s(self) -> float:
        return 3 * self.heartbeat_interval_s

    @property
    def oss_endpoint(self) -> str:
        return oss_endpoint(self.region, internal=True, override=self.endpoint)

    @property
    def static_keys(self) -> bool:
        return self.access_key_id is not None


def load_config(env: Mapping[str, str]) -> ProbeConfig:
    """Build the settings from `env`; raise ConfigError naming the first bad or missing variable."""
    values = {field: env[var] for var, field in ENV.items() if env.get(var, "").strip() != ""}
    if ("access_key_id" in values) != ("access_key_secret" in values):
        missing = "CB_PROBE_ACCESS_KEY_SECRET" if "access_key_id" in values else "CB_PROBE_ACCESS_KEY_ID"
        raise ConfigError(missing, "static keys need both CB_PROBE_ACCESS_KEY_ID and CB_PROBE_ACCESS_KEY_SECRET "
                                   "(or neither, to use the instance RAM role)")
    try:
        return ProbeConfig.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else ""
        var = FIELD_ENV.get(field, field)
        if err["type"] == "missing":
            raise ConfigError(var, "is required but not set") from None
        shown = "<hidden>" if var in SECRET_ENV else repr(values.get(field))
        raise ConfigError(var, f"invalid value {shown}: {err['msg']}") from None
