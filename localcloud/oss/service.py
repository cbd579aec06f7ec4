"""The OSS operations: one method per API, each taking the decoded WireRequest and returning a response.

Authentication and fault injection have already happened in server.py by the time these run; `bucket`
existence and anonymous access (ACL) are checked here because their errors depend on the operation.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import mimetypes
from collections.abc import Awaitable, Callable
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote, unquote

from aiohttp import web

from csbench.localcloud.cloud import CloudContext
from csbench.localcloud.credentials import Credential
from csbench.localcloud.oss import xmldoc
from csbench.localcloud.oss.auth import WireRequest
from csbench.localcloud.oss.errors import OssError, invalid_argument, malformed_xml
from csbench.localcloud.oss.listing import list_page
from csbench.localcloud.oss.store import MAX_PART_NUMBER, MIN_PART_SIZE, Bucket, ObjectMeta, Store
from csbench.localcloud.oss.xmldoc import Node, http_date, iso8601

Handler = Callable[[WireRequest, web.Request, "Credential | None"], Awaitable[web.StreamResponse]]

OBJECT_ACLS = ("default", "private", "public-read", "public-read-write")
STORAGE_CLASSES = ("Standard", "IA", "Archive", "ColdArchive", "DeepColdArchive")
# Standard HTTP headers OSS stores with an object and returns on GET/HEAD.
STORED_HTTP_HEADERS = {
    "cache-control": "Cache-Control",
    "content-disposition": "Content-Disposition",
    "content-encoding": "Content-Encoding",
    "content-language": "Content-Language",
    "expires": "Expires",
}
RESPONSE_OVERRIDES = {
    "response-content-type": "Content-Type",
    "response-content-language": "Content-Language",
    "response-expires": "Expires",
    "response-cache-control": "Cache-Control",
    "response-content-disposition": "Content-Disposition",
    "response-content-encoding": "Content-Encoding",
}
READ_OPERATIONS = frozenset(["GetObject", "HeadObject", "GetObjectMeta"])
LIST_OPERATIONS = frozenset(["ListObjects", "ListObjectsV2", "GetBucketInfo", "GetBucketLocation"])
WRITE_OPERATIONS = frozenset(
    ["PutObject", "DeleteObject", "DeleteMultipleObjects", "InitiateMultipartUpload", "UploadPart",
     "CompleteMultipartUpload", "AbortMultipartUpload", "ListParts", "CopyObject"]
)  # fmt: skip


def _xml(root: str, nodes: list[Node], status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=xmldoc.render(root, nodes), status=status, content_type="application/xml", headers=headers)


def _head_response(status: int, headers: dict[str, str], length: int) -> web.StreamResponse:
    """Headers only, with the Content-Length of the body a GET would return (web.Response would say 0)."""
    response = web.StreamResponse(status=status, headers=headers)
    response.content_length = length
    return response


def _quoted(etag: str) -> str:
    return f'"{etag}"'


def _enc(value: str, url: bool) -> str:
    # encoding-type=url: OSS percent-encodes names in the response (so control characters survive XML).
    return quote(value, safe="/") if url else value


def _validate_key(key: str) -> None:
    if len(key.encode()) > 1023:
        raise OssError(400, "InvalidObjectName", "The length of the object name must be less than 1024 bytes.")
    if key.startswith(("/", "\\")):
        raise OssError(400, "InvalidObjectName", "The object name must not start with '/' or '\\'.", Key=key)


def _encoding_type(w: WireRequest) -> bool:
    value = w.param("encoding-type")
    if value in (None, ""):
        return False
    if value != "url":
        raise invalid_argument("The encoding-type must be url.", "encoding-type", value)
    return True


def _int_param(w: WireRequest, name: str, default: int, low: int, high: int) -> int:
    raw = w.param(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise invalid_argument(f"{name} must be an integer.", name, raw) from None
    if not low <= value <= high:
        raise invalid_argument(f"{name} must be between {low} and {high}.", name, raw)
    return value


def _encode_token(after: str) -> str:
    """Continuation tokens are opaque to clients; ours is the last name returned, base64url without padding."""
    return base64.urlsafe_b64encode(after.encode()).decode().rstrip("=")


def _decode_token(token: str) -> str:
    try:
        after = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    except (binascii.Error, ValueError):
        after = None
    if after is None or _encode_token(after) != token:  # b64decode silently skips junk; insist on a round trip
        raise invalid_argument("The continuation token provided is incorrect.", "continuation-token", token)
    return after


def _check_md5(w: WireRequest, data: bytes) -> None:
    given = w.headers.get("content-md5")
    if given is None:
        return
    try:
        ok = base64.b64decode(given, validate=True) == hashlib.md5(data).digest()
    except (binascii.Error, ValueError):
        ok = False
    if not ok:
        raise OssError(400, "InvalidDigest", "The Content-MD5 you specified is not valid.", ContentMD5=given)


def _parse_http_date(value: str) -> float | None:
    try:
        return parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None  # OSS ignores unparsable conditional dates


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """`bytes=a-b` -> (start, end exclusive), or None when OSS would treat it as invalid.

    OSS semantics: an end past the object is truncated; a start past the end, a reversed range, several
    ranges or garbage make the range invalid — and an invalid range is IGNORED (200 with the whole object)
    unless the client sends `x-oss-range-behavior: standard` (then 416).
    """
    if not header.startswith("bytes=") or "," in header:
        return None
    first, sep, last = header[6:].strip().partition("-")
    if not sep:
        return None
    try:
        if first == "":
            n = int(last)
            if n <= 0 or size == 0:
                return None
            return max(0, size - n), size
        start = int(first)
        end = size - 1 if last == "" else int(last)
    except ValueError:
        return None
    if start < 0 or end < start or start >= size:
        return None
    return start, min(end, size - 1) + 1


class OssService:
    def __init__(self, ctx: CloudContext, store: Store):
        self.ctx = ctx
        self.store = store
        self.owner_id = str(int(hashlib.sha256(ctx.admin.access_key_id.encode()).hexdigest()[:15], 16))
        self.handlers: dict[str, Handler] = {
            "ListBuckets": self.list_buckets,
            "PutBucket": self.put_bucket,
            "DeleteBucket": self.delete_bucket,
            "GetBucketInfo": self.get_bucket_info,
            "GetBucketLocation": self.get_bucket_location,
            "ListObjects": self.list_objects,
            "ListObjectsV2": self.list_objects,
            "PutObject": self.put_object,
            "CopyObject": self.copy_object,
            "GetObject": self.get_object,
            "HeadObject": self.get_object,
            "GetObjectMeta": self.get_object_meta,
            "DeleteObject": self.delete_object,
            "DeleteMultipleObjects": self.delete_multiple,
            "InitiateMultipartUpload": self.initiate_multipart,
            "UploadPart": self.upload_part,
            "CompleteMultipartUpload": self.complete_multipart,
            "AbortMultipartUpload": self.abort_multipart,
            "ListParts": self.list_parts,
            "ListMultipartUploads": self.list_multipart_uploads,
        }

    # -- access ---------------------------------------------------------------------------------------
    def host_id(self, bucket: str | None) -> str:
        domain = f"oss-{self.ctx.region}.aliyuncs.com"
        return f"{bucket}.{domain}" if bucket else domain

    def authorize(self, operation: str, w: WireRequest, cred: Credential | None) -> None:
        """Every valid key of the account may do everything; anonymous access follows the ACLs."""
        if cred is not None:
            return
        if operation == "ListBuckets" or operation == "PutBucket" or operation == "DeleteBucket":
            raise OssError(403, "AccessDenied", "Anonymous access is forbidden for this operation.")
        bucket = self.store.bucket(w.bucket or "")
        acl = bucket.meta.acl
        meta = bucket.objects.get(w.key) if w.key else None
        if meta is not None and meta.acl != "default":
            acl = meta.acl
        if operation in READ_OPERATIONS | LIST_OPERATIONS and acl in ("public-read", "public-read-write"):
            return
        if operation in WRITE_OPERATIONS and acl == "public-read-write":
            return
        raise OssError(
            403, "AccessDenied", "You have no right to access this object because of bucket acl.", Bucket=bucket.name
        )

    async def dispatch(self, operation: str, w: WireRequest, request: web.Request, cred: Credential | None) -> web.StreamResponse:
        if w.bucket is not None and operation != "PutBucket":
            self.store.bucket(w.bucket)  # NoSuchBucket before anything else, as OSS does
        self.authorize(operation, w, cred)
        return await self.handlers[operation](w, request, cred)

    # -- buckets --------------------------------------------------------------------------------------
    def _owner(self) -> list[Node]:
        return [("ID", self.owner_id), ("DisplayName", self.owner_id)]

    def _bucket_nodes(self, b: Bucket) -> list[Node]:
        return [
            ("Name", b.name),
            ("CreationDate", iso8601(b.meta.created)),
            ("Location", f"oss-{self.ctx.region}"),
            ("ExtranetEndpoint", f"oss-{self.ctx.region}.aliyuncs.com"),
            ("IntranetEndpoint", f"oss-{self.ctx.region}-internal.aliyuncs.com"),
            ("Region", self.ctx.region),
            ("StorageClass", b.meta.storage_class),
        ]

    async def list_buckets(self, w: WireRequest, request: web.Request, cred: Credential | None) -> web.StreamResponse:
        prefix = w.param("prefix") or ""
        marker = w.param("marker") or ""
        max_keys = _int_param(w, "max-keys", 100, 1, 1000)
        names = sorted(n for n in self.store.buckets if n.startswith(prefix) and n > marker)
        page, truncated = names[:max_keys], len(names) > max_keys
        nodes: list[Node] = [("Owner", self._owner())]
        if prefix:
            nodes.append(("Prefix", prefix))
        if marker:
            nodes.append(("Marker", marker))
        if w.has("max-keys"):
            nodes.append(("MaxKeys", max_keys))
        nodes.append(("IsTruncated", truncated))
        if truncated:
            nodes.append(("NextMarker", page[-1]))
        nodes.append(("Buckets", [("Bucket", self._bucket_nodes(self.store.buckets[n])) for n in page]))
        return _xml("ListAllMyBucketsResult", nodes)

    async def put_bucket(self, w: WireRequest, request: web.Request, cred: Credential | None) -> web.StreamResponse:
        name = w.bucket or ""
        if not (3 <= len(name) <= 63) or not all(c.islower() or c.isdigit() or c == "-" for c in name) \
                or not name.isascii() or name[0] == "-" or name[-1] == "-":  # fmt: skip
            raise OssError(
                400,
                "InvalidBucketName",
                "The specified bucket is not valid: 3-63 characters, lower-case letters, digits and '-', "
                "starting and ending with a letter or digit.",
                BucketName=name,
            )
        acl = w.headers.get("x-oss-acl", "private")
        if acl not in ("private", "public-read", "public-read-write"):
            raise invalid_argument("no such bucket access control exists", "x-oss-acl", acl)
        storage_class = xmldoc.parse_create_bucket(await request.read()) or "Standard"
        if storage_class not in STORAGE_CLASSES:
            raise invalid_argument("Invalid storage class.", "StorageClass", storage_class)
        self.store.create_bucket(name, acl=acl, storage_class=storage_class)
        return web.Response(headers={"Location": f"/{name}"})

    async def delete_bucket(self, w: WireRequest, request: web.Request, cred: Credential | None) -> web.StreamResponse:
        self.store.delete_bucket(w.bucket or "")
        return web.Response(status=204)

    async def get_bucket_info(self, w: WireRequest, request: web.Request, cred: Credential | None) -> web.StreamResponse:
        b = self.store.bucket(w.bucket or "")
        nodes = self._bucket_nodes(b) + [
            ("Owner", self._owner()),
            ("AccessControlList", [("Grant", b.meta.acl)]),
            ("DataRedundancyType", "LRS"),
            ("Versioning", None),
            ("ServerSideEncryptionRule", [("SSEAlgorithm", "None")]),
        ]
        return _xml("BucketInfo", [("Bucket", nodes)])

    async def get_bucket_location(self, w: WireRequest, request: web.Request, cred: Credential | None) -> web.StreamResponse:
        body = f'<?xml version="1.0" encoding="UTF-8"?>\n<LocationConstraint>oss-{self.ctx.region}</LocationConstraint>'
        return web.Response(body=body.encode(), content_type="application/xml")

    # -- listing --------------------------------------------------------------------------------------
    def _contents(self, meta: ObjectMeta, url: bool, owner: bool) -> Node:
        nodes: list[Node] = [
            ("Key", _enc(meta.key, url)),
            ("LastModified", iso8601(meta.last_modified)),
            ("ETag", _quoted(meta.etag)),
            ("Type", meta.object_type),
            ("Size", meta.size),
            ("StorageClass", meta.storage_class),
        ]
        if owner:
            nodes.append(("Owner", self._owner()))
        return ("Contents", nodes)

    async def list_objects(self, w: WireRequest, request: web.Request, cred: Credential | None) -> web.StreamResponse:
        bucket = self.store.bucket(w.bucket or "")
        v2 = w.param("list-type") == "2"
        url = _encoding_type(w)
        prefix, delimiter = w.param("prefix") or "", w.param("delimiter") or ""
        max_keys = _int_param(w, "max-keys", 100, 1, 1000)
        if v2:
            token = w.param("continuation-token") or ""
            start_after = w.param("start-after") or ""
            after = _decode_token(token) if token else start_after
        else:
            after = w.param("marker") or ""
        page = list_page(bucket.keys, prefix, delimiter, after, max_keys)

        nodes: list[Node] = [("Name", bucket.name), ("Prefix", _enc(prefix, url))]
        if v2:
            if w.param("continuation-token"):
                nodes.append(("ContinuationToken", w.param("continuation-token")))
            if start_after:
                nodes.append(("StartAfter", _enc(start_after, url)))
        else:
            nodes.append(("Marker", _enc(after, url)))
        nodes += [("MaxKeys", max_keys), ("Delimiter", _enc(delimiter, url))]
        if url:
            nodes.append(("EncodingType", "url"))
        nodes.append(("IsTruncated", page.truncated))
        if page.truncated:
            if v2:
                nodes.append(("NextContinuationToken", _encode_token(page.last)))
            else:
                nodes.append(("NextMarker", _enc(page.last, url)))
        if v2:
            nodes.append(("KeyCount", page.count))
        owner = not v2 or (w.param("fetch-owner") or "").lower() == "true"
        nodes += [self._contents(bucket.objects[k], url, owner) for k in page.keys]
        nodes += [("CommonPrefixes", [("Prefix", _enc(p, url))]) for p in page.prefixes]
        return _xml("ListBucketResult", nodes)

    # -- objects --------------------------------------------------------------------------------------
    def _object_attrs(self, w: WireRequest) -> dict[str, Any]:
        acl = w.headers.get("x-oss-object-acl", "default")
        if acl not in OBJECT_ACLS:
            raise invalid_argument("no such object access control exists", "x-oss-object-acl", acl)
        storage_class = w.headers.get("x-oss-storage-class", "Standard")
        if storage_class not in STORAGE_CLASSES:
            raise invalid_argument("Invalid storage class.", "x-oss-storage-class", storage_class)
        content_type = (
            w.headers.get("content-type") or mimetypes.guess_type(w.key)[0] or "application/octet-stream"
        )
        return {
            "content_type": content_type,
            "acl": acl,
            "storage_class": storage_class,
            "user_meta": {k[len("x-oss-meta-"):]: v for k, v in w.headers.items() if k.startswith("x-oss-meta-")},
            "http_headers": {STORED_HTTP_HEADERS[k]: v for k, v in w.headers.items() if k in STORED_HTTP_HEADERS},
        }

    def _forbid_overwrite(self, w: WireRequest, bucket: Bucket, key: str) -> None:
        if w.headers.get("x-oss-forbid-overwrite", "").lower() == "true" and key in bucket.objects:
            raise OssError(
                409, "FileAlreadyExists", "The object you specified already exists and can not be overwritten.", Key=key
            )

    @staticmethod
    def _write_headers(meta: ObjectMeta) -> dict[str, str]:
        h = {"ETag": _quoted(meta.etag), "x-oss-hash-crc64ecma": str(meta.crc64)}
        if meta.content_md5:
            h["Content-MD5"] = meta.content_md5
        return h

    async def put_object(self, w: WireRequest, request: web.Request, cred: Credential | None) -> web.StreamResponse:
        _validate_key(w.key)
        bucket = self.store.bucket(w.bucket or "")
        data = await request.read()
        _check_md5(w, data)
        self._forbid_overwrite(w, bucket, w.key)
        meta = self.store.put(bucket, w.key, data, **self._object_attrs(w))
        return web.Response(headers=self._write_headers(meta))

    async def copy_object(self, w: WireRequest, request: web.Request, cred: Credential | None) -> web.StreamResponse:
        _validate_key(w.key)
        bucket = self.store.bucket(w.bucket or "")
        source = unquote(w.headers["x-oss-copy-source"]).lstrip("/")
        src_bucket_name, _, src_key = source.partition("/")
        src_bucket = self.store.bucket(src_bucket_name)
        src = self.store.head(src_bucket, src_key)
        self._forbid_overwrite(w, bucket, w.key)
        directive = w.headers.get("x-oss-metadata-directive", "COPY").upper()
        if directive not in ("COPY", "REPLACE"):
            raise invalid_argument("x-oss-metadata-directive must be COPY or REPLACE.", "x-oss-metadata-directive", directive)
        if directive == "REPLACE":
            attrs: dict[str, Any] = self._object_attrs(w)
        else:
            attrs = {"content_type": src.content_type, "acl": src.acl, "storage_class": src.storage_class,
                     "user_meta": dict(src.user_meta), "http_headers": dict(src.http_headers)}  # fmt: skip
        meta = self.store.put(bucket, w.key, self.store.read(src_bucket, src), **attrs)
        return _xml(
            "CopyObjectResult",
            [("ETag", _quoted(meta.etag)), ("LastModified", iso8601(meta.last_modified))],
            headers=self._write_headers(meta),
        )

    @staticmethod
    def _read_headers(meta: ObjectMeta) -> dict[str, str]:
        h = {
            "Content-Type": meta.content_type,
            "ETag": _quoted(meta.etag),
            "Last-Modified": http_date(meta.last_modified),
            "Accept-Ranges": "bytes",
            "x-oss-object-type": meta.object_type,
            "x-oss-storage-class": meta.storage_class,
            "x-oss-hash-crc64ecma": str(meta.crc64),
        }
        if meta.content_md5:
            h["Content-MD5"] = meta.content_md5
        h.update(meta.http_headers)
        h.update({f"x-oss-meta-{k}": v for k, v in meta.user_meta.items()})
        return h

    @staticmethod
    def _check_conditions(w: WireRequest, meta: ObjectMeta) -> bool:
        """Raise 412 for a failed If-Match/If-Unmodified-Since; return True when the answer is 304."""
        etag = _quoted(meta.etag)
        modified = int(meta.last_modified)
        if_match = w.headers.get("if-match")
        if if_match is not None:
            if if_match.strip() not in ("*", etag):
                raise OssError(412, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold.", Condition="If-Match")
        elif (since := w.headers.get("if-unmodified-since")) is not None:
            t = _parse_http_date(since)
            if t is not None and modified > t:
                raise OssError(412, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold.", Condition="If-Unmodified-Since")
        if_none_match = w.headers.get("if-none-match")
        if if_none_match is not None:
            return if_none_match.strip() in ("*", etag)
        if (since := w.headers.get("if-modified-since")) is not None:
            t = _parse_http_date(since)
            return t is not None and modified <= t
        return False

    async def get_object(self, w: WireRequest, request: web.Request, cred: Credential | None) -> web.StreamResponse:
        bucket = self.store.bucket(w.bucket or "")
        meta = self.store.head(bucket, w.key)
        headers = self._read_headers(meta)
        if self._check_conditions(w, meta):
            return web.Response(status=304, headers={k: headers[k] for k in ("ETag", "Last-Modified")})
        for param, header in RESPONSE_OVERRIDES.items():
            if (value := w.param(param)) is not None:
                headers[header] = value
        status, start, end = 200, 0, meta.size
        range_header = w.headers.get("range")
        if range_header:
            parsed = _parse_range(range_header, meta.size)
            if parsed is not None:
                status, (start, end) = 206, parsed
                headers["Content-Range"] = f"bytes {start}-{end - 1}/{meta.size}"
            elif w.headers.get("x-oss-range-behavior", "").lower() == "standard":
                raise OssError(
                    416, "InvalidRange", "The requested range cannot be satisfied.", RangeRequested=range_header,
                    ActualObjectSize=str(meta.size),
                )  # fmt: skip
        if w.method == "HEAD":
            return _head_response(status, headers, end - start)
        return web.Response(status=status, body=self.store.read(bucket, meta, start, end), headers=headers)

    async def get_object_meta(self, w: WireRequest, request: web.Request, cred: Credential | None) -> web.StreamResponse:
        meta = self.store.head(self.store.bucket(w.bucket or ""), w.key)
        headers = {
            "ETag": _quoted(meta.etag),
            "Last-Modified": http_date(meta.last_modified),
            "x-oss-hash-crc64ecma": str(meta.crc64),
            "x-oss-last-access-time": http_date(meta.last_modified),
        }
        return _head_response(200, headers, meta.size)

    async def delete_object(self, w: WireRequest, request: web.Request, cred: Credential | None) -> web.StreamResponse:
        self.store.delete(self.store.bucket(w.bucket or ""), w.key)  # OSS answers 204 for a missing key too
        return web.Response(status=204)

    async def delete_multiple(self, w: WireRequest, request: web.Request, cred: Credential | None) -> web.StreamResponse:
        bucket = self.store.bucket(w.bucket or "")
        url = _encoding_type(w)
        body = await request.read()
        _check_md5(w, body)
        quiet, keys = xmldoc.parse_delete(body)
        for key in keys:
            self.store.delete(bucket, key)
        nodes: list[Node] = [] if quiet else [("Deleted", [("Key", _enc(k, url))]) for k in keys]
        if url:
            nodes.append(("EncodingType", "url"))
        return _xml("DeleteResult", nodes)

    # -- multipart ------------------------------------------------------------------------------------
    async def initiate_multipart(self, w: WireRequest, request: web.Request, cred: Credential | None) -> web.StreamResponse:
        _validate_key(w.key)
        bucket = self.store.bucket(w.bucket or "")
        self._forbid_overwrite(w, bucket, w.key)
        url = _encoding_type(w)
        upload = self.store.initiate(bucket, w.key, **self._object_attrs(w))
        nodes: list[Node] = [("Bucket", bucket.name), ("Key", _enc(w.key, url)), ("UploadId", upload.upload_id)]
        if url:
            nodes.append(("EncodingType", "url"))
        return _xml("InitiateMultipartUploadResult", nodes)

    async def upload_part(self, w: WireRequest, request: web.Request, cred: Credential | None) -> web.StreamResponse:
        bucket = self.store.bucket(w.bucket or "")
        if not w.param("uploadId"):
            raise invalid_argument("uploadId is required with partNumber.", "uploadId", "")
        number = _int_param(w, "partNumber", 0, 1, MAX_PART_NUMBER)
        upload = self.store.upload(bucket, w.key, w.param("uploadId") or "")
        data = await request.read()
        _check_md5(w, data)
        part = self.store.put_part(upload, number, data)
        return web.Response(headers={"ETag": _quoted(part.etag), "x-oss-hash-crc64ecma": str(part.crc64)})

    async def complete_multipart(self, w: WireRequest, request: web.Request, cred: Credential | None) -> web.StreamResponse:
        bucket = self.store.bucket(w.bucket or "")
        upload = self.store.upload(bucket, w.key, w.param("uploadId") or "")
        body = await request.read()
        url = _encoding_type(w)
        if w.headers.get("x-oss-complete-all", "").lower() == "yes":
            if body.strip():
                raise invalid_argument("With x-oss-complete-all: yes the body must be empty.", "x-oss-complete-all", "yes")
            numbers = sorted(upload.parts)
            if not numbers:
                raise malformed_xml("the upload has no parts")
        else:
            _check_md5(w, body)
            requested = xmldoc.parse_complete(body)
            numbers = [n for n, _ in requested]
            if any(b <= a for a, b in zip(numbers, numbers[1:], strict=False)):
                raise OssError(400, "InvalidPartOrder", "The list of parts was not in ascending order. The parts list must be specified in order by part number.")
            for n, etag in requested:
                part = upload.parts.get(n)
                if part is None or part.etag != etag:
                    raise OssError(
                        400, "InvalidPart",
                        "One or more of the specified parts could not be found or the specified entity tag might not have matched the part's entity tag.",
                        PartNumber=str(n), ETag=etag,
                    )  # fmt: skip
        for n in numbers[:-1]:
            if upload.parts[n].size < MIN_PART_SIZE:
                raise OssError(
                    400, "EntityTooSmall", "Your proposed upload is smaller than the minimum allowed size.",
                    PartNumber=str(n), MinSizeAllowed=str(MIN_PART_SIZE),
                )  # fmt: skip
        self._forbid_overwrite(w, bucket, w.key)
        meta = self.store.complete(bucket, upload, numbers)
        nodes: list[Node] = []
        if url:
            nodes.append(("EncodingType", "url"))
        nodes += [
            ("Location", f"http://{self.host_id(bucket.name)}/{quote(meta.key)}"),
            ("Bucket", bucket.name),
            ("Key", _enc(meta.key, url)),
            ("ETag", _quoted(meta.etag)),
        ]
        return _xml("CompleteMultipartUploadResult", nodes, headers={"ETag": _quoted(meta.etag), "x-oss-hash-crc64ecma": str(meta.crc64)})

    async def abort_multipart(self, w: WireRequest, request: web.Request, cred: Credential | None) -> web.StreamResponse:
        bucket = self.store.bucket(w.bucket or "")
        self.store.abort(self.store.upload(bucket, w.key, w.param("uploadId") or ""))
        return web.Response(status=204)

    async def list_parts(self, w: WireRequest, request: web.Request, cred: Credential | None) -> web.StreamResponse:
        bucket = self.store.bucket(w.bucket or "")
        upload = self.store.upload(bucket, w.key, w.param("uploadId") or "")
        marker = _int_param(w, "part-number-marker", 0, 0, MAX_PART_NUMBER)
        max_parts = _int_param(w, "max-parts", 1000, 1, 1000)
        numbers = [n for n in sorted(upload.parts) if n > marker]
        page, truncated = numbers[:max_parts], len(numbers) > max_parts
        nodes: list[Node] = [
            ("Bucket", bucket.name),
            ("Key", upload.key),
            ("UploadId", upload.upload_id),
            ("PartNumberMarker", marker),
            ("NextPartNumberMarker", page[-1] if page else marker),
            ("MaxParts", max_parts),
            ("IsTruncated", truncated),
        ]
        for n in page:
            p = upload.parts[n]
            nodes.append(("Part", [("PartNumber", n), ("LastModified", iso8601(p.last_modified)), ("ETag", _quoted(p.etag)),
                                   ("HashCrc64ecma", p.crc64), ("Size", p.size)]))  # fmt: skip
        return _xml("ListPartsResult", nodes)

    async def list_multipart_uploads(self, w: WireRequest, request: web.Request, cred: Credential | None) -> web.StreamResponse:
        # One page with every upload (the bench never has more than a handful in flight).
        bucket = self.store.bucket(w.bucket or "")
        url = _encoding_type(w)
        prefix = w.param("prefix") or ""
        uploads = [u for u in self.store.uploads_in(bucket) if u.key.startswith(prefix)]
        nodes: list[Node] = [
            ("Bucket", bucket.name),
            ("KeyMarker", ""),
            ("UploadIdMarker", ""),
            ("NextKeyMarker", ""),
            ("NextUploadIdMarker", ""),
            ("Delimiter", ""),
            ("Prefix", _enc(prefix, url)),
            ("MaxUploads", 1000),
            ("IsTruncated", False),
        ]
        if url:
            nodes.append(("EncodingType", "url"))
        nodes += [("Upload", [("Key", _enc(u.key, url)), ("UploadId", u.upload_id), ("StorageClass", u.storage_class),
                              ("Initiated", iso8601(u.initiated))]) for u in uploads]  # fmt: skip
        return _xml("ListMultipartUploadsResult", nodes)

