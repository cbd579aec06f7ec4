"""The object-store adapter both planes use: get, put, put-if-absent, list, delete, presign.

`OssBlobStore` is Aliyun OSS through oss2 with V4 signing. Semantics every caller relies on:
- a missing key is `None`, never an exception (the seed's NoSuchKey bug);
- put_if_absent is atomic on the server (`x-oss-forbid-overwrite: true` → 409 FileAlreadyExists → False);
- every call is bounded by a timeout, and failures raise StoreError with `transient` telling whether a
  retry can help (5xx, throttling, timeouts, connection errors) or not (403, 400: fix the config).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import oss2
import oss2.credentials
import oss2.exceptions
import requests

DEFAULT_METADATA_URL = "http://100.100.100.200"


@dataclass(frozen=True)
class Blob:
    body: bytes
    etag: str


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    etag: str
    size: int
    last_modified: int  # unix seconds, as OSS reports it


class StoreError(Exception):
    def __init__(self, op: str, key: str, detail: str, *, transient: bool, status: int | None = None):
        super().__init__(f"object store {op} {key!r} failed: {detail}")
        self.op = op
        self.key = key
        self.transient = transient
        self.status = status


class BlobStore(Protocol):
    def get(self, key: str) -> Blob | None: ...
    def put(self, key: str, body: bytes, content_type: str = "application/json") -> str: ...
    def put_if_absent(self, key: str, body: bytes, content_type: str = "application/json") -> bool: ...
    def list(self, prefix: str, delimiter: str = "") -> Iterator[ObjectInfo]: ...
    def delete(self, key: str) -> None: ...
    def presign(self, method: str, key: str, expires_s: int) -> str: ...


# -- credentials -----------------------------------------------------------------------------------------
class EcsMetadataCredentials(oss2.credentials.CredentialsProvider):
    """STS credentials of the instance's RAM role from the ECS metadata service.

    Discovers the role name, then delegates fetching and refresh-before-expiry to oss2's provider.
    Every HTTP call has a short timeout so nothing blocks on a metadata service that is not there.
    """

    def __init__(self, metadata_url: str = DEFAULT_METADATA_URL, timeout_s: float = 3.0):
        self.base = metadata_url.rstrip("/") + "/latest/meta-data/ram/security-credentials/"
        self.timeout_s = timeout_s
        self._inner: oss2.credentials.EcsRamRoleCredentialsProvider | None = None
        self._lock = threading.Lock()

    def role_name(self) -> str:
        resp = requests.get(self.base, timeout=self.timeout_s)
        if resp.status_code != 200 or not resp.text.strip():
            raise oss2.exceptions.ClientError(
                f"no RAM role attached to this instance (metadata answered {resp.status_code} at {self.base})")
        return resp.text.strip().splitlines()[0]

    def get_credentials(self) -> oss2.credentials.Credentials:
        with self._lock:
            if self._inner is None:
                self._inner = oss2.credentials.EcsRamRoleCredentialsProvider(
                    self.base + self.role_name(), max_retries=2, timeout=self.timeout_s)
        return self._inner.get_credentials()


# -- OSS -------------------------------------------------------------------------------------------------
def oss_endpoint(region: str, *, internal: bool, override: str | None = None) -> str:
    """The OSS endpoint for a region; carriers use the VPC-internal one (no NAT, no public egress)."""
    if override:
        return override
    return f"https://oss-{region}{'-internal' if internal else ''}.aliyuncs.com"


def _classify(op: str, key: str, exc: Exception) -> StoreError:
    if isinstance(exc, oss2.exceptions.RequestError):  # connection refused/reset, timeouts
        return StoreError(op, key, f"request error: {exc}", transient=True)
    if isinstance(exc, oss2.exceptions.OssError):
        status = int(exc.status)
        code = getattr(exc, "code", "") or ""
        transient = status >= 500 or status == 429 or code in {"RequestTimeout", "Throttling"} or status < 0
        return StoreError(op, key, f"HTTP {status} {code}: {getattr(exc, 'message', '')}", transient=transient,
                          status=status)
    if isinstance(exc, (requests.RequestException, OSError)):
        return StoreError(op, key, f"{type(exc).__name__}: {exc}", transient=True)
    return StoreError(op, key, f"{type(exc).__name__}: {exc}", transient=False)


class OssBlobStore:
    def __init__(
        self,
        bucket: str,
        *,
        region: str,
        endpoint: str,
        credentials: oss2.credentials.CredentialsProvider,
        timeout_s: float = 10.0,
    ):
        auth = oss2.ProviderAuthV4(credentials)
        self.bucket_name = bucket
        # Path-style for IP/localhost endpoints (localcloud); virtual-hosted for real OSS domains.
        self._bucket = oss2.Bucket(auth, endpoint, bucket, region=region, connect_timeout=timeout_s,
                                   is_path_style=_is_local(endpoint))

    def get(self, key: str) -> Blob | None:
        try:
            result = self._bucket.get_object(key)
            return Blob(body=result.read(), etag=result.etag)
        except oss2.exceptions.NoSuchKey:
            return None
        except Exception as exc:
            raise _classify("get", key, exc) from exc

    def put(self, key: str, body: bytes, content_type: str = "application/json") -> str:
        try:
            return str(self._bucket.put_object(key, body, headers={"Content-Type": content_type}).etag)
        except Exception as exc:
            raise _classify("put", key, exc) from exc

    def put_if_absent(self, key: str, body: bytes, content_type: str = "application/json") -> bool:
        headers = {"Content-Type": content_type, "x-oss-forbid-overwrite": "true"}
        try:
            self._bucket.put_object(key, body, headers=headers)
            return True
        except oss2.exceptions.OssError as exc:
            if exc.status == 409 and getattr(exc, "code", "") == "FileAlreadyExists":
                return False
            raise _classify("put_if_absent", key, exc) from exc
        except Exception as exc:
            raise _classify("put_if_absent", key, exc) from exc

    def list(self, prefix: str, delimiter: str = "") -> Iterator[ObjectInfo]:
        try:
            for obj in oss2.ObjectIteratorV2(self._bucket, prefix=prefix, delimiter=delimiter, max_keys=1000):
                if obj.is_prefix():
                    yield ObjectInfo(key=obj.key, etag="", size=0, last_modified=0)
                else:
                    yield ObjectInfo(key=obj.key, etag=obj.etag, size=obj.size, last_modified=obj.last_modified)
        except Exception as exc:
            raise _classify("list", prefix, exc) from exc

    def delete(self, key: str) -> None:
        try:
            self._bucket.delete_object(key)
        except oss2.exceptions.NoSuchKey:
            return
        except Exception as exc:
            raise _classify("delete", key, exc) from exc

    def presign(self, method: str, key: str, expires_s: int) -> str:
        try:
            return str(self._bucket.sign_url(method, key, expires_s, slash_safe=True))
        except Exception as exc:
            raise _classify("presign", key, exc) from exc


def _is_local(endpoint: str) -> bool:
    host = endpoint.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]
    return host in {"localhost", "127.0.0.1", "[::1]"} or host.startswith("127.")
