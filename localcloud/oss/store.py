"""Buckets, objects and multipart uploads on disk, with an in-memory sorted key index per bucket.

Layout under the root (ctx.state_dir / "oss"):

    buckets/<bucket>/bucket.json            bucket attributes
    buckets/<bucket>/meta/<sha256(key)>.json object metadata, including the name of its data file
    buckets/<bucket>/data/<uuid>            object bytes
    uploads/<upload-id>/upload.json         a multipart upload in progress
    uploads/<upload-id>/<part>.json|.data   its parts

Every write goes to a temporary file then `os.replace`, so a crash leaves either the old or the new version.
An object's metadata file is the commit point: new bytes go to a fresh data file first, then the metadata is
replaced, then the old data file is removed. Orphaned data files are swept at start-up.

All methods are synchronous and meant to be called from the single event-loop thread, which serialises them;
no locking is needed. The store raises OssError for conditions a client can cause.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import json
import os
import secrets
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import crcmod

from csbench.localcloud.oss.errors import OssError, no_such_bucket, no_such_key

# CRC-64/ECMA-182 as OSS computes it for x-oss-hash-crc64ecma; identical to oss2.utils.Crc64.
crc64 = crcmod.mkCrcFun(0x142F0E1EBA9EA3693, initCrc=0, xorOut=0xFFFFFFFFFFFFFFFF, rev=True)

MIN_PART_SIZE = 100 * 1024  # OSS rejects a non-last part smaller than 100 KB at CompleteMultipartUpload
MAX_PART_NUMBER = 10000


def _write_atomic(path: Path, data: bytes) -> None:
    # No fsync: the promise is "survives a restart of the cloud", not "survives a power cut".
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _write_json(path: Path, doc: Any) -> None:
    _write_atomic(path, json.dumps(doc, separators=(",", ":")).encode())


def _key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass
class ObjectMeta:
    key: str
    size: int
    etag: str  # upper-case hex, no quotes; "<hex>-<N>" for multipart objects
    crc64: int
    last_modified: float
    content_type: str
    data_file: str
    object_type: str = "Normal"  # Normal | Multipart
    storage_class: str = "Standard"
    content_md5: str | None = None  # base64, only for objects uploaded in one piece
    acl: str = "default"
    user_meta: dict[str, str] = field(default_factory=dict)  # x-oss-meta-* (lower-case names)
    http_headers: dict[str, str] = field(default_factory=dict)  # Cache-Control, Content-Disposition, ...


@dataclass
class BucketMeta:
    name: str
    created: float
    acl: str = "private"
    storage_class: str = "Standard"


class Bucket:
    def __init__(self, meta: BucketMeta, root: Path):
        self.meta = meta
        self.root = root
        self.objects: dict[str, ObjectMeta] = {}
        self.keys: list[str] = []  # sorted; str order == UTF-8 byte order, which is OSS's listing order

    @property
    def name(self) -> str:
        return self.meta.name

    def _index_add(self, key: str) -> None:
        if key not in self.objects:
            bisect.insort(self.keys, key)

    def _index_remove(self, key: str) -> None:
        i = bisect.bisect_left(self.keys, key)
        if i < len(self.keys) and self.keys[i] == key:
            del self.keys[i]


@dataclass
class PartMeta:
    number: int
    etag: str
    size: int
    crc64: int
    last_modified: float


@dataclass
class Upload:
    upload_id: str
    bucket: str
    key: str
    initiated: float
    content_type: str
    user_meta: dict[str, str] = field(default_factory=dict)
    http_headers: dict[str, str] = field(default_factory=dict)
    acl: str = "default"
    storage_class: str = "Standard"
    parts: dict[int, PartMeta] = field(default_factory=dict)


class Store:
    def __init__(self, root: Path):
        self.root = root
        self.buckets_dir = root / "buckets"
        self.uploads_dir = root / "uploads"
        self.buckets_dir.mkdir(parents=True, exist_ok=True)
        self.uploads_dir.mkdir(parents=True, exist_ok=True)
        self.buckets: dict[str, Bucket] = {}
        self.uploads: dict[str, Upload] = {}
        self._load()

    # -- start-up ------------------------------------------------------------------------------------
    def _load(self) -> None:
        for bdir in sorted(self.buckets_dir.iterdir()):
            doc_path = bdir / "bucket.json"
            if not doc_path.exists():
                continue
            bucket = Bucket(BucketMeta(**json.loads(doc_path.read_text())), bdir)
            referenced: set[str] = set()
            for meta_path in (bdir / "meta").glob("*.json"):
                meta = ObjectMeta(**json.loads(meta_path.read_text()))
                bucket.objects[meta.key] = meta
                referenced.add(meta.data_file)
            bucket.keys = sorted(bucket.objects)
            for data_path in (bdir / "data").iterdir():
                if data_path.name not in referenced:  # left behind by a crash between writes
                    data_path.unlink(missing_ok=True)
            self.buckets[bucket.name] = bucket
        for udir in self.uploads_dir.iterdir():
            doc_path = udir / "upload.json"
            if not doc_path.exists():
                continue
            doc = json.loads(doc_path.read_text())
            upload = Upload(**{k: v for k, v in doc.items() if k != "parts"})
            for part_path in udir.glob("*.json"):
                if part_path.name != "upload.json":
                    part = PartMeta(**json.loads(part_path.read_text()))
                    upload.parts[part.number] = part
            self.uploads[upload.upload_id] = upload

    # -- buckets -------------------------------------------------------------------------------------
    def create_bucket(self, name: str, acl: str = "private", storage_class: str = "Standard") -> Bucket:
        if name in self.buckets:
            raise OssError(
                409,
                "BucketAlreadyExists",
                "The requested bucket name is not available. The bucket namespace is shared by all users "
                "of the system. Please select a different name and try again.",
                BucketName=name,
            )
        bdir = self.buckets_dir / name
        (bdir / "meta").mkdir(parents=True, exist_ok=True)
        (bdir / "data").mkdir(parents=True, exist_ok=True)
        meta = BucketMeta(name=name, created=time.time(), acl=acl, storage_class=storage_class)
        _write_json(bdir / "bucket.json", asdict(meta))
        bucket = Bucket(meta, bdir)
        self.buckets[name] = bucket
        return bucket

    def bucket(self, name: str) -> Bucket:
        try:
            return self.buckets[name]
        except KeyError:
            raise no_such_bucket(name) from None

    def delete_bucket(self, name: str) -> None:
        bucket = self.bucket(name)
        if bucket.objects:
            raise OssError(409, "BucketNotEmpty", "The bucket you tried to delete is not empty.", BucketName=name)
        if any(u.bucket == name for u in self.uploads.values()):
            raise OssError(
                409, "BucketNotEmpty", "The bucket has multipart uploads that are not completed.", BucketName=name
            )
        # Remove the marker first: a crash halfway leaves no half-loaded bucket behind.
        (bucket.root / "bucket.json").unlink()
        shutil.rmtree(bucket.root, ignore_errors=True)
        del self.buckets[name]

    # -- objects -------------------------------------------------------------------------------------
    def head(self, bucket: Bucket, key: str) -> ObjectMeta:
        meta = bucket.objects.get(key)
        if meta is None:
            raise no_such_key(key)
        return meta

    def read(self, bucket: Bucket, meta: ObjectMeta, start: int = 0, end: int | None = None) -> bytes:
        """Bytes [start, end) of the object."""
        with open(bucket.root / "data" / meta.data_file, "rb") as f:
            f.seek(start)
            return f.read((meta.size if end is None else end) - start)

    def _commit(self, bucket: Bucket, meta: ObjectMeta) -> ObjectMeta:
        old = bucket.objects.get(meta.key)
        _write_json(bucket.root / "meta" / f"{_key_hash(meta.key)}.json", asdict(meta))
        bucket._index_add(meta.key)
        bucket.objects[meta.key] = meta
        if old is not None:
            (bucket.root / "data" / old.data_file).unlink(missing_ok=True)
        return meta

    def put(
        self,
        bucket: Bucket,
        key: str,
        data: bytes,
        *,
        content_type: str,
        user_meta: dict[str, str],
        http_headers: dict[str, str],
        acl: str = "default",
        storage_class: str = "Standard",
    ) -> ObjectMeta:
        data_file = uuid.uuid4().hex
        _write_atomic(bucket.root / "data" / data_file, data)
        md5 = hashlib.md5(data).digest()
        meta = ObjectMeta(
            key=key,
            size=len(data),
            etag=md5.hex().upper(),
            crc64=crc64(data),
            last_modified=time.time(),
            content_type=content_type,
            data_file=data_file,
            content_md5=base64.b64encode(md5).decode(),
            acl=acl,
            storage_class=storage_class,
            user_meta=user_meta,
            http_headers=http_headers,
        )
        return self._commit(bucket, meta)

    def delete(self, bucket: Bucket, key: str) -> bool:
        meta = bucket.objects.pop(key, None)
        if meta is None:
            return False
        bucket._index_remove(key)
        (bucket.root / "meta" / f"{_key_hash(key)}.json").unlink(missing_ok=True)
        (bucket.root / "data" / meta.data_file).unlink(missing_ok=True)
        return True

    # -- multipart -----------------------------------------------------------------------------------
    def _upload_dir(self, upload_id: str) -> Path:
        return self.uploads_dir / upload_id

    def initiate(self, bucket: Bucket, key: str, **attrs: Any) -> Upload:
        upload = Upload(upload_id=uuid.uuid4().hex.upper(), bucket=bucket.name, key=key, initiated=time.time(), **attrs)
        udir = self._upload_dir(upload.upload_id)
        udir.mkdir(parents=True)
        _write_json(udir / "upload.json", asdict(upload))
        self.uploads[upload.upload_id] = upload
        return upload

    def upload(self, bucket: Bucket, key: str, upload_id: str) -> Upload:
        upload = self.uploads.get(upload_id)
        if upload is None or upload.bucket != bucket.name or upload.key != key:
            raise OssError(
                404,
                "NoSuchUpload",
                "The specified upload does not exist. The upload ID may be invalid, or the upload may have "
                "been aborted or completed.",
                UploadId=upload_id,
            )
        return upload

    def put_part(self, upload: Upload, number: int, data: bytes) -> PartMeta:
        udir = self._upload_dir(upload.upload_id)
        _write_atomic(udir / f"{number:05d}.data", data)
        part = PartMeta(number, hashlib.md5(data).hexdigest().upper(), len(data), crc64(data), time.time())
        _write_json(udir / f"{number:05d}.json", asdict(part))
        upload.parts[number] = part
        return part

    def complete(self, bucket: Bucket, upload: Upload, numbers: list[int]) -> ObjectMeta:
        """Concatenate the chosen parts (already validated by the caller) into the object."""
        udir = self._upload_dir(upload.upload_id)
        data_file = uuid.uuid4().hex
        tmp = bucket.root / "data" / f".{data_file}.tmp"
        crc = 0
        md5s = b""
        size = 0
        with open(tmp, "wb") as out:
            for n in numbers:
                with open(udir / f"{n:05d}.data", "rb") as f:
                    chunk = f.read()
                out.write(chunk)
                crc = crc64(chunk, crc)
                md5s += bytes.fromhex(upload.parts[n].etag)
                size += len(chunk)
        os.replace(tmp, bucket.root / "data" / data_file)
        meta = ObjectMeta(
            key=upload.key,
            size=size,
            etag=f"{hashlib.md5(md5s).hexdigest().upper()}-{len(numbers)}",
            crc64=crc,
            last_modified=time.time(),
            content_type=upload.content_type,
            data_file=data_file,
            object_type="Multipart",
            storage_class=upload.storage_class,
            acl=upload.acl,
            user_meta=upload.user_meta,
            http_headers=upload.http_headers,
        )
        self._commit(bucket, meta)
        self.abort(upload)
        return meta

    def abort(self, upload: Upload) -> None:
        self.uploads.pop(upload.upload_id, None)
        udir = self._upload_dir(upload.upload_id)
        (udir / "upload.json").unlink(missing_ok=True)  # the commit point of the removal
        shutil.rmtree(udir, ignore_errors=True)

    def uploads_in(self, bucket: Bucket) -> Iterator[Upload]:
        return iter(sorted((u for u in self.uploads.values() if u.bucket == bucket.name), key=lambda u: (u.key, u.initiated)))
