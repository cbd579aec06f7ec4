"""ACS3-HMAC-SHA256: Aliyun's V3 request signature, verified server-side.

Mirrors `alibabacloud_tea_openapi.utils.Utils.get_authorization` (the signer the SDK uses):

    canonical = METHOD \\n PATH \\n canonical-query \\n canonical-headers \\n signed-header-names \\n sha256(body)
    string_to_sign = "ACS3-HMAC-SHA256\\n" + hex(sha256(canonical))
    signature = hex(hmac_sha256(secret, string_to_sign))

The canonical query sorts keys and percent-encodes values with RFC 3986 (only `~` kept unreserved, so
`/`, `[`, `"` in tag keys or `InstanceIds` are encoded). The SDK puts every parameter in the query string
(form-encoded: spaces as `+`), so `parse_query` decodes it the same way before re-encoding canonically.
All functions are pure; `verify` raises EcsError with the code Aliyun would return.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote

from csbench.localcloud.ecs.errors import EcsError

ALGORITHM = "ACS3-HMAC-SHA256"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def parse_query(raw: str) -> dict[str, str]:
    """Decode a form-encoded query string into a flat dict (the SDK never repeats a key)."""
    return dict(parse_qsl(raw, keep_blank_values=True))


def canonical_query(query: Mapping[str, str]) -> str:
    return "&".join(f"{k}={quote(query[k], safe='~')}" for k in sorted(query))


def canonical_headers(headers: Mapping[str, str], signed: list[str]) -> str:
    """`name:value\\n` for each signed header (lower-cased names, trimmed values), in the order given."""
    lower = {k.lower(): v for k, v in headers.items()}
    return "".join(f"{name}:{lower.get(name, '').strip()}\n" for name in signed)


def canonical_request(method: str, path: str, query: Mapping[str, str], headers: Mapping[str, str],
                      signed: list[str], payload_sha256: str) -> str:
    return "\n".join([method.upper(), path or "/", canonical_query(query),
                      canonical_headers(headers, signed), ";".join(signed), payload_sha256])


def signature(secret: str, canonical: str) -> str:
    string_to_sign = f"{ALGORITHM}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    return hmac.new(secret.encode(), string_to_sign.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Authorization:
    access_key_id: str
    signed_headers: list[str]
    signature: str


def parse_authorization(header: str) -> Authorization:
    """Parse `ACS3-HMAC-SHA256 Credential=AK,SignedHeaders=a;b,Signature=hex`."""
    if not header:
        raise EcsError("IncompleteSignature", "The Authorization header is missing; sign the request with ACS3-HMAC-SHA256.")
    algo, _, rest = header.strip().partition(" ")
    if algo != ALGORITHM:
        raise EcsError("IncompleteSignature", f"Unsupported signature algorithm {algo!r}; only {ALGORITHM} is accepted.")
    parts: dict[str, str] = {}
    for item in rest.split(","):
        key, sep, value = item.strip().partition("=")
        if sep:
            parts[key] = value
    if not {"Credential", "SignedHeaders", "Signature"} <= parts.keys():
        raise EcsError("IncompleteSignature", "Authorization needs Credential, SignedHeaders and Signature.")
    signed = [h for h in parts["SignedHeaders"].split(";") if h]
    return Authorization(parts["Credential"], signed, parts["Signature"].lower())


def expected_signature(secret: str, method: str, path: str, query: Mapping[str, str],
                       headers: Mapping[str, str], auth: Authorization) -> str:
    payload = {k.lower(): v for k, v in headers.items()}.get("x-acs-content-sha256", EMPTY_SHA256)
    return signature(secret, canonical_request(method, path, query, headers, auth.signed_headers, payload))


def verify(secret: str, method: str, path: str, query: Mapping[str, str], headers: Mapping[str, str],
           auth: Authorization, body: bytes = b"") -> None:
    """Raise SignatureDoesNotMatch unless `auth` signs this request with `secret`."""
    lower = {k.lower(): v for k, v in headers.items()}
    # The body hash is part of what is signed; make sure the claimed hash matches what arrived.
    claimed = lower.get("x-acs-content-sha256")
    if claimed is not None and claimed != hashlib.sha256(body).hexdigest():
        raise EcsError("SignatureDoesNotMatch", "x-acs-content-sha256 does not match the request body.")
    for required in ("host", "x-acs-action", "x-acs-date"):
        if required in lower and required not in auth.signed_headers:
            raise EcsError("IncompleteSignature", f"Header {required!r} must be signed.")
    want = expected_signature(secret, method, path, query, headers, auth)
    if not hmac.compare_digest(want, auth.signature):
        raise EcsError("SignatureDoesNotMatch",
                       "Specified signature is not matched with our calculation. "
                       "Check the AccessKeySecret and that the request was not altered after signing.")
