"""OSS request signatures, V1 (HMAC-SHA1) and V4 (OSS4-HMAC-SHA256), as pure functions.

The server recomputes what the client signed from what arrived on the wire and compares. Everything here is
deterministic and free of I/O so it can be unit-tested against the SDKs' own signers (oss2.auth and
alibabacloud_oss_v2.signer): if those tests pass, the real clients verify here exactly as on Aliyun.

Inputs are always *decoded* values: the bucket, the key, and the query as (name, value) pairs after
percent-decoding. Each algorithm re-encodes what it needs, the way the SDKs do.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import quote

V4_ALGORITHM = "OSS4-HMAC-SHA256"
V4_TERMINATOR = "aliyun_v4_request"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"

# Query parameters that V1 signs ("sub-resources"). This is the union of oss2's and alibabacloud-oss-v2's
# lists: a parameter either SDK signs must be signed here too, otherwise that SDK's requests fail to verify.
V1_SUBRESOURCES = frozenset(
    [
        "acl", "uploadId", "uploads", "partNumber", "group", "link", "delete", "website", "location",
        "objectInfo", "objectMeta", "response-content-type", "response-content-language",
        "response-cache-control", "response-content-encoding", "response-expires",
        "response-content-disposition", "logging", "cors", "lifecycle", "restore", "qos", "referer", "stat",
        "bucketInfo", "append", "position", "security-token", "live", "comp", "status", "vod", "startTime",
        "endTime", "x-oss-process", "symlink", "callback", "callback-var", "tagging", "encryption",
        "versions", "versioning", "versionId", "policy", "requestPayment", "x-oss-traffic-limit", "qosInfo",
        "asyncFetch", "x-oss-request-payer", "sequential", "inventory", "inventoryId", "continuation-token",
        "worm", "wormId", "wormExtend", "replication", "replicationLocation", "replicationProgress",
        "transferAcceleration", "cname", "metaQuery", "x-oss-ac-source-ip", "x-oss-ac-subnet-mask",
        "x-oss-ac-vpc-id", "x-oss-ac-forward-allow", "resourceGroup", "style", "styleName",
        "x-oss-async-process", "regionList", "x-oss-write-get-object-response", "bucketArchiveDirectRead",
        "httpsConfig", "redundancyTransition", "x-oss-target-redundancy-type",
        "x-oss-redundancy-transition-taskid", "accessPoint", "accessPointPolicy", "publicAccessBlock",
        "x-oss-access-point-name", "requesterQosInfo", "qosRequester", "resourcePoolInfo", "resourcePool",
        "resourcePoolBuckets", "cloudboxes",
    ]
)  # fmt: skip


# --------------------------------------------------------------------------------------------- V1
def v1_canonical_resource(bucket: str | None, key: str, query: Iterable[tuple[str, str]]) -> str:
    """`/bucket/key?sub1&sub2=v` — key and values NOT percent-encoded, only sub-resources, sorted."""
    subs = sorted((k, v) for k, v in query if k in V1_SUBRESOURCES)
    sub = "?" + "&".join(f"{k}={v}" if v else k for k, v in subs) if subs else ""
    return f"/{bucket}/{key}{sub}" if bucket else f"/{sub}"


def v1_string_to_sign(
    method: str,
    headers: Mapping[str, str],
    bucket: str | None,
    key: str,
    query: Iterable[tuple[str, str]],
    date: str,
) -> str:
    """VERB \\n Content-MD5 \\n Content-Type \\n Date \\n CanonicalizedOSSHeaders + CanonicalizedResource.

    `headers` must be keyed by lower-case names. `date` is the Date/x-oss-date header, or `Expires` for a
    presigned URL.
    """
    oss_headers = sorted((k, v) for k, v in headers.items() if k.startswith("x-oss-"))
    canon_headers = "".join(f"{k}:{v}\n" for k, v in oss_headers)
    return "\n".join(
        [
            method,
            headers.get("content-md5", ""),
            headers.get("content-type", ""),
            date,
            canon_headers + v1_canonical_resource(bucket, key, query),
        ]
    )


def v1_signature(secret: str, string_to_sign: str) -> str:
    digest = hmac.new(secret.encode(), string_to_sign.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


# --------------------------------------------------------------------------------------------- V4
def v4_uri_encode(text: str, keep_slash: bool) -> str:
    """RFC 3986 encoding: only A-Z a-z 0-9 - _ . ~ stay literal (and '/' in the path). Upper-case hex."""
    return quote(text, safe="/" if keep_slash else "")


@dataclass(frozen=True)
class V4Scope:
    date: str  # YYYYMMDD
    region: str
    product: str  # "oss"

    def __str__(self) -> str:
        return f"{self.date}/{self.region}/{self.product}/{V4_TERMINATOR}"


def v4_canonical_request(
    method: str,
    bucket: str | None,
    key: str,
    query: Iterable[tuple[str, str]],
    headers: Mapping[str, str],
    additional_headers: Iterable[str],
) -> str:
    """VERB \\n URI \\n Query \\n Headers \\n AdditionalHeaders \\n HashedPayload.

    `headers` keyed by lower-case names; `query` decoded and without `x-oss-signature`. Signed headers are
    every x-oss-* header, Content-Type, Content-MD5, plus the listed additional headers.
    """
    additional = sorted({h.lower() for h in additional_headers})
    uri = v4_uri_encode(f"/{bucket}/{key}" if bucket else "/", keep_slash=True)
    pairs = sorted((v4_uri_encode(k, False), v4_uri_encode(v, False)) for k, v in query)
    canon_query = "&".join(f"{k}={v}" if v else k for k, v in pairs)
    signed = sorted(
        (k, v)
        for k, v in headers.items()
        if k.startswith("x-oss-") or k in ("content-type", "content-md5") or k in additional
    )
    canon_headers = "".join(f"{k}:{v}\n" for k, v in signed)
    payload = headers.get("x-oss-content-sha256", UNSIGNED_PAYLOAD)
    return "\n".join([method, uri, canon_query, canon_headers, ";".join(additional), payload])


def v4_string_to_sign(timestamp: str, scope: V4Scope, canonical_request: str) -> str:
    digest = hashlib.sha256(canonical_request.encode()).hexdigest()
    return f"{V4_ALGORITHM}\n{timestamp}\n{scope}\n{digest}"


def v4_signing_key(secret: str, scope: V4Scope) -> bytes:
    key = hmac.new(("aliyun_v4" + secret).encode(), scope.date.encode(), hashlib.sha256).digest()
    key = hmac.new(key, scope.region.encode(), hashlib.sha256).digest()
    key = hmac.new(key, scope.product.encode(), hashlib.sha256).digest()
    return hmac.new(key, V4_TERMINATOR.encode(), hashlib.sha256).digest()


def v4_signature(secret: str, scope: V4Scope, string_to_sign: str) -> str:
    return hmac.new(v4_signing_key(secret, scope), string_to_sign.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class V4Credential:
    access_key_id: str
    scope: V4Scope


def parse_v4_credential(value: str) -> V4Credential:
    """`AK/20240101/cn-hangzhou/oss/aliyun_v4_request` -> V4Credential; ValueError when malformed."""
    parts = value.split("/")
    if len(parts) != 5 or parts[4] != V4_TERMINATOR or not parts[0] or len(parts[1]) != 8:
        raise ValueError(f"malformed credential {value!r}")
    return V4Credential(parts[0], V4Scope(parts[1], parts[2], parts[3]))


@dataclass(frozen=True)
class V4Authorization:
    credential: V4Credential
    additional_headers: tuple[str, ...]
    signature: str


def parse_v4_authorization(header: str) -> V4Authorization:
    """Parse `OSS4-HMAC-SHA256 Credential=..,AdditionalHeaders=..,Signature=..`.

    oss2 separates fields with ", " and puts AdditionalHeaders last; alibabacloud-oss-v2 uses "," and puts it
    in the middle. Both are accepted. Raises ValueError naming what is wrong.
    """
    if not header.startswith(V4_ALGORITHM + " "):
        raise ValueError("Authorization does not start with OSS4-HMAC-SHA256")
    fields: dict[str, str] = {}
    for item in header[len(V4_ALGORITHM) + 1 :].split(","):
        name, sep, value = item.strip().partition("=")
        if not sep:
            raise ValueError(f"malformed Authorization field {item.strip()!r}")
        fields[name] = value
    if "Credential" not in fields or "Signature" not in fields:
        raise ValueError("Authorization lacks Credential or Signature")
    extra = tuple(h for h in fields.get("AdditionalHeaders", "").split(";") if h)
    return V4Authorization(parse_v4_credential(fields["Credential"]), extra, fields["Signature"])
