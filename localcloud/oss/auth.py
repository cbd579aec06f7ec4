"""Who sent this request? Verifies the four ways OSS requests are signed and returns the credential.

    Authorization: OSS <ak>:<sig>                                    V1 header   (oss2 default)
    ?OSSAccessKeyId=<ak>&Expires=<unix>&Signature=<sig>              V1 presigned URL
    Authorization: OSS4-HMAC-SHA256 Credential=..,Signature=..       V4 header   (alibabacloud-oss-v2 default)
    ?x-oss-signature-version=OSS4-HMAC-SHA256&x-oss-credential=..    V4 presigned URL

No signature at all means anonymous (None). Everything else either verifies or raises the OssError real OSS
would answer with. The pure signature maths lives in signing.py.
"""

from __future__ import annotations

import calendar
import hmac
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

from csbench.localcloud.credentials import Credential, CredentialError, CredentialStore
from csbench.localcloud.oss import signing
from csbench.localcloud.oss.errors import OssError, invalid_argument
from csbench.localcloud.oss.xmldoc import iso8601

MAX_PRESIGN_SECONDS = 7 * 24 * 3600  # V4 presigned URLs live at most 7 days


@dataclass
class WireRequest:
    """The parts of an HTTP request that signatures and routing look at, all decoded."""

    method: str
    bucket: str | None
    key: str
    query: list[tuple[str, str]]  # in arrival order; duplicates kept
    headers: dict[str, str]  # lower-case names

    def param(self, name: str) -> str | None:
        for k, v in self.query:
            if k == name:
                return v
        return None

    def has(self, name: str) -> bool:
        return any(k == name for k, _ in self.query)


def _security_token(w: WireRequest) -> str | None:
    # oss2 V1 presign: ?security-token; V4 presign: ?x-oss-security-token; headers: x-oss-security-token
    # (alibabacloud-oss-v2 in V1 mode sends a bare "security-token" header).
    return (
        w.headers.get("x-oss-security-token")
        or w.headers.get("security-token")
        or w.param("security-token")
        or w.param("x-oss-security-token")
    )


def _lookup(creds: CredentialStore, access_key_id: str, token: str | None) -> Credential:
    try:
        return creds.lookup(access_key_id, token)
    except CredentialError as e:
        if e.code == "InvalidAccessKeyId":
            raise OssError(
                403,
                "InvalidAccessKeyId",
                "The OSS Access Key Id you provided does not exist in our records.",
                OSSAccessKeyId=access_key_id,
            ) from None
        if e.code == "InvalidSecurityToken.Expired":
            raise OssError(403, "SecurityTokenExpired", "The security token you provided has expired.") from None
        if e.code.startswith("InvalidSecurityToken"):
            raise OssError(403, "InvalidSecurityToken", f"The security token you provided is invalid. ({e.message})") from None
        raise OssError(403, "AccessDenied", e.message) from None


def _signature_mismatch(ak: str, provided: str, string_to_sign: str, canonical_request: str | None = None) -> OssError:
    fields = {
        "OSSAccessKeyId": ak,
        "SignatureProvided": provided,
        "StringToSign": string_to_sign,
        "StringToSignBytes": " ".join(f"{b:02x}" for b in string_to_sign.encode()),
    }
    if canonical_request is not None:
        fields["CanonicalRequest"] = canonical_request
    return OssError(
        403,
        "SignatureDoesNotMatch",
        "The request signature we calculated does not match the signature you provided. "
        "Check your key and signing method.",
        **fields,
    )


def _check_skew(request_time: float, now: float, max_skew: float, shown: str) -> None:
    if abs(now - request_time) > max_skew:
        raise OssError(
            403,
            "RequestTimeTooSkewed",
            "The difference between the request time and the current time is too large.",
            RequestTime=shown,
            ServerTime=iso8601(now),
            MaxAllowedSkewMilliseconds=str(int(max_skew * 1000)),
        )


def _expired(expires_at: float, now: float) -> OssError:
    return OssError(403, "AccessDenied", "Request has expired.", Expires=iso8601(expires_at), ServerTime=iso8601(now))


def authenticate(
    w: WireRequest, creds: CredentialStore, region: str, *, now: float | None = None, max_skew: float = 900.0
) -> Credential | None:
    """The verified credential behind `w`, or None for an anonymous request."""
    now = time.time() if now is None else now
    auth = w.headers.get("authorization")
    if auth:
        if auth.startswith(signing.V4_ALGORITHM + " "):
            return _v4_header(w, auth, creds, region, now, max_skew)
        if auth.startswith("OSS "):
            return _v1_header(w, auth, creds, now, max_skew)
        raise invalid_argument(
            "Authorization header is invalid (localcloud OSS verifies 'OSS ak:sig' and OSS4-HMAC-SHA256; "
            "signature version 2 is not implemented).",
            "Authorization",
            auth.split(" ", 1)[0],
        )
    if w.param("x-oss-signature-version") is not None:
        return _v4_query(w, creds, region, now)
    if w.has("OSSAccessKeyId") or w.has("Signature"):
        return _v1_query(w, creds, now)
    return None


# ---------------------------------------------------------------------------------------------- V1
def _v1_header(w: WireRequest, auth: str, creds: CredentialStore, now: float, max_skew: float) -> Credential:
    ak, sep, provided = auth[4:].strip().rpartition(":")
    if not sep or not ak or not provided:
        raise invalid_argument("Authorization header is invalid.", "Authorization", auth)
    date = w.headers.get("x-oss-date") or w.headers.get("date")
    if not date:
        raise OssError(403, "AccessDenied", "OSS authentication requires a valid Date.")
    try:
        request_time = parsedate_to_datetime(date).timestamp()
    except (TypeError, ValueError):
        raise OssError(403, "AccessDenied", f"Invalid date format: {date!r}") from None
    _check_skew(request_time, now, max_skew, date)
    cred = _lookup(creds, ak, _security_token(w))
    sts = signing.v1_string_to_sign(w.method, w.headers, w.bucket, w.key, w.query, date)
    if not hmac.compare_digest(signing.v1_signature(cred.access_key_secret, sts), provided):
        raise _signature_mismatch(ak, provided, sts)
    return cred


def _v1_query(w: WireRequest, creds: CredentialStore, now: float) -> Credential:
    ak, expires, provided = w.param("OSSAccessKeyId"), w.param("Expires"), w.param("Signature")
    if not ak or not expires or not provided:
        raise OssError(
            403, "AccessDenied", "A presigned URL needs OSSAccessKeyId, Expires and Signature together."
        )
    try:
        expires_at = int(expires)
    except ValueError:
        raise invalid_argument("Expires must be an integer (unix seconds).", "Expires", expires) from None
    if now > expires_at:
        raise _expired(expires_at, now)
    cred = _lookup(creds, ak, _security_token(w))
    sts = signing.v1_string_to_sign(w.method, w.headers, w.bucket, w.key, w.query, expires)
    if not hmac.compare_digest(signing.v1_signature(cred.access_key_secret, sts), provided):
        raise _signature_mismatch(ak, provided, sts)
    return cred


# ---------------------------------------------------------------------------------------------- V4
def _parse_v4_time(value: str) -> float:
    try:
        return float(calendar.timegm(time.strptime(value, "%Y%m%dT%H%M%SZ")))
    except ValueError:
        raise invalid_argument("x-oss-date must look like 20240102T030405Z.", "x-oss-date", value) from None


def _check_scope(scope: signing.V4Scope, timestamp: str, region: str) -> None:
    if scope.date != timestamp[:8]:
        raise OssError(403, "SignatureDoesNotMatch", "Invalid signing date in Authorization header.")
    if scope.region != region:
        raise OssError(
            403, "SignatureDoesNotMatch", f"Invalid signing region in Authorization header: {scope.region!r}, expected {region!r}."
        )
    if scope.product != "oss":
        raise OssError(403, "SignatureDoesNotMatch", f"Invalid signing product in Authorization header: {scope.product!r}.")


def _v4_verify(
    w: WireRequest,
    cred: Credential,
    scope: signing.V4Scope,
    timestamp: str,
    query: list[tuple[str, str]],
    additional: tuple[str, ...],
    provided: str,
) -> None:
    canonical = signing.v4_canonical_request(w.method, w.bucket, w.key, query, w.headers, additional)
    sts = signing.v4_string_to_sign(timestamp, scope, canonical)
    if not hmac.compare_digest(signing.v4_signature(cred.access_key_secret, scope, sts), provided):
        raise _signature_mismatch(cred.access_key_id, provided, sts, canonical)


def _v4_header(
    w: WireRequest, auth: str, creds: CredentialStore, region: str, now: float, max_skew: float
) -> Credential:
    try:
        parsed = signing.parse_v4_authorization(auth)
    except ValueError as e:
        raise invalid_argument(f"Authorization header is invalid: {e}.", "Authorization", auth) from None
    timestamp = w.headers.get("x-oss-date")
    if not timestamp:
        raise OssError(403, "AccessDenied", "V4 signatures need the x-oss-date header.")
    _check_skew(_parse_v4_time(timestamp), now, max_skew, timestamp)
    _check_scope(parsed.credential.scope, timestamp, region)
    cred = _lookup(creds, parsed.credential.access_key_id, _security_token(w))
    _v4_verify(w, cred, parsed.credential.scope, timestamp, w.query, parsed.additional_headers, parsed.signature)
    return cred


def _v4_query(w: WireRequest, creds: CredentialStore, region: str, now: float) -> Credential:
    version = w.param("x-oss-signature-version")
    if version != signing.V4_ALGORITHM:
        raise invalid_argument("Unsupported x-oss-signature-version.", "x-oss-signature-version", version or "")
    credential, timestamp = w.param("x-oss-credential"), w.param("x-oss-date")
    expires, provided = w.param("x-oss-expires"), w.param("x-oss-signature")
    if not credential or not timestamp or not expires or not provided:
        raise OssError(
            403,
            "AccessDenied",
            "A V4 presigned URL needs x-oss-credential, x-oss-date, x-oss-expires and x-oss-signature.",
        )
    try:
        parsed = signing.parse_v4_credential(credential)
    except ValueError as e:
        raise invalid_argument(f"x-oss-credential is invalid: {e}.", "x-oss-credential", credential) from None
    try:
        lifetime = int(expires)
    except ValueError:
        raise invalid_argument("x-oss-expires must be an integer.", "x-oss-expires", expires) from None
    if not 0 < lifetime <= MAX_PRESIGN_SECONDS:
        raise invalid_argument(f"x-oss-expires must be in 1..{MAX_PRESIGN_SECONDS}.", "x-oss-expires", expires)
    signed_at = _parse_v4_time(timestamp)
    if now > signed_at + lifetime:
        raise _expired(signed_at + lifetime, now)
    _check_scope(parsed.scope, timestamp, region)
    cred = _lookup(creds, parsed.access_key_id, _security_token(w))
    query = [(k, v) for k, v in w.query if k != "x-oss-signature"]
    additional = tuple(h for h in (w.param("x-oss-additional-headers") or "").split(";") if h)
    _v4_verify(w, cred, parsed.scope, timestamp, query, additional, provided)
    return cred
