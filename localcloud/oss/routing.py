"""From a raw HTTP request target to (bucket, key, query) and the name of the OSS operation it invokes.

Only path-style addressing (`/bucket/key`) is served: oss2 and alibabacloud-oss-v2 both use it for IP
endpoints such as http://127.0.0.1:PORT. Paths are decoded here, once; signature code re-encodes.
"""

from __future__ import annotations

from urllib.parse import unquote

from csbench.localcloud.oss.auth import WireRequest
from csbench.localcloud.oss.errors import OssError, not_implemented
from csbench.localcloud.oss.signing import V1_SUBRESOURCES

# Sub-resources this server implements; any other OSS sub-resource (acl, tagging, append, ...) is answered
# with 501 NotImplemented rather than being silently treated as a plain object request.
HANDLED_SUBRESOURCES = frozenset(
    [
        "uploadId", "uploads", "partNumber", "delete", "objectMeta", "bucketInfo", "location",
        "continuation-token", "security-token", "response-content-type", "response-content-language",
        "response-cache-control", "response-content-encoding", "response-expires",
        "response-content-disposition",
    ]
)  # fmt: skip


def parse_target(method: str, target: str, headers: dict[str, str]) -> WireRequest:
    """`target` is the raw request line target, e.g. `/bkt/a%20b.txt?uploadId=X&partNumber=1`."""
    path, _, raw_query = target.partition("?")
    query: list[tuple[str, str]] = []
    for item in raw_query.split("&"):
        if item:
            name, _, value = item.partition("=")
            # Percent-decoding only: '+' stays '+' (the SDKs always send a literal plus as %2B).
            query.append((unquote(name), unquote(value)))
    bucket_raw, _, key_raw = path.lstrip("/").partition("/") if path.startswith("/") else ("", "", "")
    bucket = unquote(bucket_raw) or None
    return WireRequest(method=method, bucket=bucket, key=unquote(key_raw) if bucket else "", query=query, headers=headers)


def _method_not_allowed(method: str) -> OssError:
    return OssError(405, "MethodNotAllowed", "The specified method is not allowed against this resource.", Method=method)


def classify(w: WireRequest) -> str:
    """The OSS API name this request invokes. Raises for unsupported sub-resources and methods."""
    for name, _ in w.query:
        if name in V1_SUBRESOURCES and name not in HANDLED_SUBRESOURCES:
            raise not_implemented(f"The sub-resource ?{name}")
    m = w.method
    if w.bucket is None:
        if m == "GET":
            return "ListBuckets"
        raise _method_not_allowed(m)
    if not w.key:
        if m == "GET":
            if w.has("bucketInfo"):
                return "GetBucketInfo"
            if w.has("location"):
                return "GetBucketLocation"
            if w.has("uploads"):
                return "ListMultipartUploads"
            return "ListObjectsV2" if w.param("list-type") == "2" else "ListObjects"
        if m == "PUT":
            return "PutBucket"
        if m == "DELETE":
            return "DeleteBucket"
        if m == "POST" and w.has("delete"):
            return "DeleteMultipleObjects"
        raise _method_not_allowed(m)
    if m in ("GET", "HEAD"):
        if w.has("uploadId") and m == "GET":
            return "ListParts"
        if w.has("objectMeta"):
            return "GetObjectMeta"
        return "GetObject" if m == "GET" else "HeadObject"
    if m == "PUT":
        if w.has("uploadId") or w.has("partNumber"):
            if "x-oss-copy-source" in w.headers:
                raise not_implemented("UploadPartCopy")
            return "UploadPart"
        return "CopyObject" if "x-oss-copy-source" in w.headers else "PutObject"
    if m == "POST":
        if w.has("uploads"):
            return "InitiateMultipartUpload"
        if w.has("uploadId"):
            return "CompleteMultipartUpload"
        raise _method_not_allowed(m)
    if m == "DELETE":
        return "AbortMultipartUpload" if w.has("uploadId") else "DeleteObject"
    raise _method_not_allowed(m)
