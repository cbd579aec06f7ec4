"""localcloud OSS driven by the real clients (oss2, alibabacloud-oss-v2, plain requests for presigned URLs)."""

from __future__ import annotations

import base64
import datetime
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import alibabacloud_oss_v2 as ossv2
import oss2
import pytest
import requests
from alibabacloud_oss_v2.signer.v1 import SignerV1
from alibabacloud_oss_v2.signer.v4 import SignerV4
from alibabacloud_oss_v2.types import HttpRequest, SigningContext

from csbench.localcloud.cloud import LocalCloudThread
from csbench.localcloud.oss import signing
from csbench.localcloud.oss.admin import OssAdmin
from csbench.localcloud.oss.listing import list_page
from csbench.localcloud.oss.routing import parse_target

REGION = "cn-hangzhou"
BUCKET = "bench"


@dataclass
class Oss:
    cloud: LocalCloudThread
    endpoint: str
    ak: str
    sk: str

    def bucket(self, name: str = BUCKET, **kw: Any) -> oss2.Bucket:
        return oss2.Bucket(oss2.Auth(self.ak, self.sk), self.endpoint, name, **kw)

    def bucket_v4(self, name: str = BUCKET, sk: str | None = None) -> oss2.Bucket:
        return oss2.Bucket(oss2.AuthV4(self.ak, sk or self.sk), self.endpoint, name, region=REGION)

    def v2(self, token_cred: Any = None, sk: str | None = None, **cfg_kw: Any) -> ossv2.Client:
        cfg = ossv2.config.load_default()
        if token_cred is None:
            cfg.credentials_provider = ossv2.credentials.StaticCredentialsProvider(self.ak, sk or self.sk)
        else:
            cfg.credentials_provider = ossv2.credentials.StaticCredentialsProvider(
                token_cred.access_key_id, token_cred.access_key_secret, token_cred.security_token
            )
        cfg.region = REGION
        cfg.endpoint = self.endpoint
        for k, v in cfg_kw.items():
            setattr(cfg, k, v)
        return ossv2.Client(cfg)

    @property
    def admin(self) -> OssAdmin:
        return OssAdmin(self.endpoint, self.sk)


@pytest.fixture
def start_oss(make_cloud: Callable[..., LocalCloudThread]) -> Callable[..., Oss]:
    def _start(config: dict[str, Any] | None = None, state_dir: Path | None = None) -> Oss:
        cfg = {"buckets": [BUCKET]} if config is None else config
        cloud = make_cloud(state_dir=state_dir, services=["oss"], config={"oss": cfg})
        admin = cloud.ctx.admin
        return Oss(cloud, cloud.endpoints["oss"], admin.access_key_id, admin.access_key_secret)

    return _start


@pytest.fixture
def oss(start_oss: Callable[..., Oss]) -> Oss:
    return start_oss()


def _status_code(exc: oss2.exceptions.OssError) -> tuple[int, str]:
    return exc.status, exc.code


# ------------------------------------------------------------------------- pure signing vs SDK signers
def _wire_from_url(method: str, url: str, headers: dict[str, str]) -> Any:
    parts = urlsplit(url)
    target = parts.path + ("?" + parts.query if parts.query else "")
    return parse_target(method, target, {k.lower(): v for k, v in headers.items()})


def test_v4_signature_matches_ossv2_signer() -> None:
    cred = ossv2.credentials.StaticCredentialsProvider("ak-id", "sk-secret").get_credentials()
    url = "http://127.0.0.1:1/bkt/dir/a%20b%2Bc%E4%B8%AD.txt?partNumber=1&uploadId=ABC%2F%3D"
    req = HttpRequest("PUT", url, headers={"Content-Type": "text/plain", "x-oss-meta-Who": "me", "Range": "bytes=1-2"})
    ctx = SigningContext(product="oss", region=REGION, bucket="bkt", key="dir/a b+c中.txt", request=req,
                         credentials=cred, additional_headers={"range"},
                         signing_time=datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.timezone.utc))  # fmt: skip
    SignerV4().sign(ctx)
    auth = signing.parse_v4_authorization(req.headers["Authorization"])
    w = _wire_from_url("PUT", req.url, dict(req.headers))
    assert (w.bucket, w.key) == ("bkt", "dir/a b+c中.txt")
    canonical = signing.v4_canonical_request(w.method, w.bucket, w.key, w.query, w.headers, auth.additional_headers)
    sts = signing.v4_string_to_sign(w.headers["x-oss-date"], auth.credential.scope, canonical)
    assert sts == ctx.string_to_sign
    assert signing.v4_signature("sk-secret", auth.credential.scope, sts) == auth.signature


def test_v4_signature_matches_oss2_signer() -> None:
    req = oss2.http.Request("GET", "http://127.0.0.1:1/bkt/k%2B1", params={"list-type": "2", "prefix": "a/b c"},
                            headers={"x-oss-meta-a": "1"}, region=REGION, product="oss")  # fmt: skip
    oss2.AuthV4("ak-id", "sk-secret")._sign_request(req, "bkt", "k+1")
    auth = signing.parse_v4_authorization(req.headers["authorization"])
    query = list(req.params.items())
    canonical = signing.v4_canonical_request("GET", "bkt", "k+1", query, {k.lower(): v for k, v in req.headers.items()}, auth.additional_headers)
    sts = signing.v4_string_to_sign(req.headers["x-oss-date"], auth.credential.scope, canonical)
    assert signing.v4_signature("sk-secret", auth.credential.scope, sts) == auth.signature


def test_v1_signature_matches_both_sdks() -> None:
    req = oss2.http.Request("POST", "http://h/bkt/", params={"delete": "", "encoding-type": "url"},
                            headers={"Content-MD5": "abc==", "Content-Type": "application/xml", "x-oss-date": "Mon, 06 May 2024 07:08:09 GMT"})  # fmt: skip
    oss2.Auth("ak-id", "sk-secret")._sign_request(req, "bkt", "")
    headers = {k.lower(): v for k, v in req.headers.items()}
    sts = signing.v1_string_to_sign("POST", headers, "bkt", "", list(req.params.items()), headers["x-oss-date"])
    assert "OSS ak-id:" + signing.v1_signature("sk-secret", sts) == req.headers["authorization"]

    cred = ossv2.credentials.StaticCredentialsProvider("ak-id", "sk-secret").get_credentials()
    req2 = HttpRequest("GET", "http://h/bkt/a%20b?uploadId=X&max-parts=5", headers={"x-oss-meta-z": "1"})
    ctx = SigningContext(product="oss", region=REGION, bucket="bkt", key="a b", request=req2, credentials=cred,
                         signing_time=datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.timezone.utc))  # fmt: skip
    SignerV1().sign(ctx)
    w = _wire_from_url("GET", req2.url, dict(req2.headers))
    assert signing.v1_string_to_sign("GET", w.headers, w.bucket, w.key, w.query, w.headers["date"]) == ctx.string_to_sign


def test_list_page_delimiter_and_resume() -> None:
    keys = sorted(["a/1", "a/2", "b", "c/x/1", "c/y", "d"])
    page = list_page(keys, "", "/", "", 2)
    assert (page.prefixes, page.keys, page.truncated, page.last) == (["a/"], ["b"], True, "b")
    page = list_page(keys, "", "/", "b", 2)
    assert (page.prefixes, page.keys, page.truncated) == (["c/"], ["d"], False)
    assert list_page(keys, "c/", "/", "", 10).prefixes == ["c/x/"]


# ------------------------------------------------------------------------------------ oss2 basics
def test_oss2_round_trip_metadata_and_crc(oss: Oss) -> None:
    b = oss.bucket()
    data = os.urandom(3000)
    put = b.put_object("dir/file.json", data, headers={"x-oss-meta-Run": "r1", "Cache-Control": "no-cache"})
    assert put.status == 200 and put.etag == hashlib.md5(data).hexdigest().upper()
    assert put.crc is not None  # oss2 compared it with its own CRC64 and raised if different
    got = b.get_object("dir/file.json")
    assert got.read() == data and got.server_crc == got.client_crc
    assert got.headers["Content-Type"] == "application/json"  # inferred from the extension like OSS
    assert got.headers["x-oss-meta-run"] == "r1" and got.headers["Cache-Control"] == "no-cache"
    head = b.head_object("dir/file.json")
    assert head.content_length == 3000 and head.etag == put.etag and head.object_type == "Normal"
    meta = b.get_object_meta("dir/file.json")
    assert meta.content_length == 3000 and meta.etag == put.etag
    assert b.object_exists("dir/file.json") and not b.object_exists("nope")
    assert b.delete_object("dir/file.json").status == 204
    assert b.delete_object("never-existed").status == 204
    with pytest.raises(oss2.exceptions.NoSuchKey) as e:
        b.get_object("dir/file.json")
    assert e.value.status == 404 and e.value.request_id
    info = b.get_bucket_info()
    assert info.name == BUCKET and info.acl.grant == "private"
    assert [x.name for x in oss2.BucketIterator(oss2.Service(oss2.Auth(oss.ak, oss.sk), oss.endpoint))] == [BUCKET]


def test_bucket_lifecycle(oss: Oss) -> None:
    b = oss.bucket("fresh-bucket")
    b.create_bucket()
    with pytest.raises(oss2.exceptions.ServerError) as e:
        b.create_bucket()
    assert _status_code(e.value) == (409, "BucketAlreadyExists")
    b.put_object("k", b"x")
    with pytest.raises(oss2.exceptions.ServerError) as e:
        b.delete_bucket()
    assert _status_code(e.value) == (409, "BucketNotEmpty")
    b.delete_object("k")
    b.delete_bucket()
    with pytest.raises(oss2.exceptions.NoSuchBucket):
        b.get_object("k")


def test_paginated_listing_v1_and_v2(oss: Oss) -> None:
    b = oss.bucket()
    keys = sorted(f"runs/r{i % 3}/obj-{i:03d}" for i in range(25))
    for k in keys:
        b.put_object(k, b"x")
    b.put_object("top.txt", b"y")
    assert [o.key for o in oss2.ObjectIteratorV2(b, prefix="runs/", max_keys=7)] == keys
    assert [o.key for o in oss2.ObjectIterator(b, prefix="runs/", max_keys=7)] == keys
    v2 = [o.key for o in oss2.ObjectIteratorV2(b, delimiter="/", max_keys=1)]
    assert v2 == ["runs/", "top.txt"]
    assert [o.key for o in oss2.ObjectIterator(b, prefix="runs/", delimiter="/", max_keys=2)] == ["runs/r0/", "runs/r1/", "runs/r2/"]
    first = b.list_objects_v2(prefix="runs/r1/", max_keys=3, fetch_owner=True)
    assert first.is_truncated and len(first.object_list) == 3 and first.object_list[0].owner is not None
    start = b.list_objects_v2(start_after=keys[-2])
    assert [o.key for o in start.object_list] == [keys[-1], "top.txt"]
    assert b.list_objects_v2(prefix="runs/", max_keys=1000).is_truncated is False


def test_url_encoding_type_with_odd_keys(oss: Oss) -> None:
    b = oss.bucket()
    odd = sorted(["with space.txt", "plus+sign", "percent%41", "unicode/中文 é", "tab\tkey", "q?x=1&y"])
    for k in odd:
        b.put_object(k, k.encode())
    assert [o.key for o in oss2.ObjectIteratorV2(b, max_keys=2)] == odd  # oss2 sends encoding-type=url
    assert [o.key for o in oss2.ObjectIterator(b, max_keys=4)] == odd
    assert all(b.get_object(k).read() == k.encode() for k in odd)
    result = b.batch_delete_objects(odd[:3])
    assert sorted(result.deleted_keys) == odd[:3]
    assert [o.key for o in oss2.ObjectIteratorV2(b)] == odd[3:]


def test_forbid_overwrite_md5_range_and_conditions(oss: Oss) -> None:
    b = oss.bucket()
    put = b.put_object("k", b"0123456789")
    with pytest.raises(oss2.exceptions.ServerError) as e:
        b.put_object("k", b"other", headers={"x-oss-forbid-overwrite": "true"})
    assert _status_code(e.value) == (409, "FileAlreadyExists")
    assert b.put_object("new", b"1", headers={"x-oss-forbid-overwrite": "true"}).status == 200
    with pytest.raises(oss2.exceptions.ServerError) as e:
        b.put_object("k2", b"abc", headers={"Content-MD5": base64.b64encode(hashlib.md5(b"xyz").digest()).decode()})
    assert _status_code(e.value) == (400, "InvalidDigest")
    assert b.put_object("k3", b"abc", headers={"Content-MD5": base64.b64encode(hashlib.md5(b"abc").digest()).decode()}).status == 200

    r = b.get_object("k", byte_range=(2, 5))
    assert r.status == 206 and r.read() == b"2345" and r.headers["Content-Range"] == "bytes 2-5/10"
    assert b.get_object("k", byte_range=(7, None)).read() == b"789"
    assert b.get_object("k", byte_range=(None, 3)).read() == b"789"
    assert b.get_object("k", byte_range=(8, 100)).read() == b"89"  # end past the object is truncated
    whole = b.get_object("k", byte_range=(20, 30))  # invalid range: OSS ignores it
    assert whole.status == 200 and whole.read() == b"0123456789"
    with pytest.raises(oss2.exceptions.ServerError) as e:
        b.get_object("k", byte_range=(20, 30), headers={"x-oss-range-behavior": "standard"})
    assert _status_code(e.value) == (416, "InvalidRange")

    etag = f'"{put.etag}"'
    assert b.get_object("k", headers={"If-Match": etag}).read() == b"0123456789"
    with pytest.raises(oss2.exceptions.PreconditionFailed) as e:
        b.get_object("k", headers={"If-Match": '"0000"'})
    assert e.value.status == 412
    with pytest.raises(oss2.exceptions.NotModified):
        b.get_object("k", headers={"If-None-Match": etag})
    future = oss2.utils.http_date(int(time.time()) + 3600)
    past = oss2.utils.http_date(int(time.time()) - 3600)
    with pytest.raises(oss2.exceptions.NotModified):
        b.get_object("k", headers={"If-Modified-Since": future})
    assert b.get_object("k", headers={"If-Modified-Since": past}).status == 200
    with pytest.raises(oss2.exceptions.PreconditionFailed):
        b.get_object("k", headers={"If-Unmodified-Since": past})


def test_multipart_resumable_upload(oss: Oss, tmp_path: Path) -> None:
    b = oss.bucket()
    data = os.urandom(350 * 1024)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    result = oss2.resumable_upload(b, "big/obj.bin", str(src), store=oss2.ResumableStore(root=str(tmp_path)),
                                   multipart_threshold=100 * 1024, part_size=100 * 1024, num_threads=2)  # fmt: skip
    assert result.status == 200 and result.crc is not None
    got = b.get_object("big/obj.bin")
    assert got.read() == data and got.headers["x-oss-object-type"] == "Multipart"
    assert b.head_object("big/obj.bin").etag.endswith("-4")

    upload_id = b.init_multipart_upload("m").upload_id
    p1 = b.upload_part("m", upload_id, 1, os.urandom(100 * 1024))
    p2 = b.upload_part("m", upload_id, 2, b"tail")
    assert [p.part_number for p in b.list_parts("m", upload_id).parts] == [1, 2]
    with pytest.raises(oss2.exceptions.ServerError) as e:
        b.complete_multipart_upload("m", upload_id, [oss2.models.PartInfo(1, p1.etag), oss2.models.PartInfo(1, p1.etag)])
    assert _status_code(e.value) == (400, "InvalidPartOrder")  # oss2 sorts parts itself; a duplicate is out of order
    with pytest.raises(oss2.exceptions.ServerError) as e:
        b.complete_multipart_upload("m", upload_id, [oss2.models.PartInfo(1, p1.etag), oss2.models.PartInfo(2, "BAD")])
    assert _status_code(e.value) == (400, "InvalidPart")
    done = b.complete_multipart_upload("m", upload_id, [oss2.models.PartInfo(1, p1.etag), oss2.models.PartInfo(2, p2.etag)])
    assert done.status == 200 and b.head_object("m").content_length == 100 * 1024 + 4

    small_id = b.init_multipart_upload("s").upload_id
    s1, s2 = b.upload_part("s", small_id, 1, b"a"), b.upload_part("s", small_id, 2, b"b")
    with pytest.raises(oss2.exceptions.ServerError) as e:
        b.complete_multipart_upload("s", small_id, [oss2.models.PartInfo(1, s1.etag), oss2.models.PartInfo(2, s2.etag)])
    assert _status_code(e.value) == (400, "EntityTooSmall")
    b.abort_multipart_upload("s", small_id)
    with pytest.raises(oss2.exceptions.NoSuchUpload):
        b.upload_part("s", small_id, 3, b"x")


# ----------------------------------------------------------------------------- signatures, presign, STS
def test_presigned_urls_v1_and_v4(oss: Oss) -> None:
    for b in (oss.bucket(), oss.bucket_v4()):
        put_url = b.sign_url("PUT", "pre/a b.txt", 60)
        assert requests.put(put_url, data=b"via-url").status_code == 200
        get_url = b.sign_url("GET", "pre/a b.txt", 60)
        r = requests.get(get_url)
        assert r.status_code == 200 and r.content == b"via-url"
        tampered = get_url.replace("a%20b.txt", "other.txt")
        assert tampered != get_url
        r = requests.get(tampered)
        assert r.status_code == 403 and "<Code>SignatureDoesNotMatch</Code>" in r.text
        assert requests.put(put_url, data=b"x", headers={"x-oss-meta-new": "1"}).status_code == 403
    expired = oss.bucket().sign_url("GET", "pre/a b.txt", -10)
    r = requests.get(expired)
    assert r.status_code == 403 and "<Code>AccessDenied</Code>" in r.text and "Request has expired." in r.text
    anon = requests.get(f"{oss.endpoint}/{BUCKET}/pre/a%20b.txt")
    assert anon.status_code == 403 and "<Code>AccessDenied</Code>" in anon.text and anon.headers["x-oss-request-id"]

    client = oss.v2()
    signed = client.presign(ossv2.GetObjectRequest(bucket=BUCKET, key="pre/a b.txt"), expires=datetime.timedelta(seconds=60))
    assert requests.get(signed.url).content == b"via-url"
    old = client.presign(ossv2.GetObjectRequest(bucket=BUCKET, key="pre/a b.txt"),
                         expiration=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=2))  # fmt: skip
    time.sleep(1.2)
    r = requests.get(old.url)
    assert r.status_code == 403 and "Request has expired." in r.text


def test_wrong_secret_and_unknown_key(oss: Oss) -> None:
    for b in (oss2.Bucket(oss2.Auth(oss.ak, "wrong"), oss.endpoint, BUCKET), oss.bucket_v4(sk="wrong")):
        with pytest.raises(oss2.exceptions.ServerError) as e:
            b.put_object("k", b"x")
        assert _status_code(e.value) == (403, "SignatureDoesNotMatch")
        assert "StringToSign" in e.value.details
    with pytest.raises(oss2.exceptions.ServerError) as e:
        oss2.Bucket(oss2.Auth("LTAInobody", "x"), oss.endpoint, BUCKET).get_object("k")
    assert _status_code(e.value) == (403, "InvalidAccessKeyId")
    bad_v2 = oss.v2(sk="wrong")
    with pytest.raises(ossv2.exceptions.OperationError) as e2:
        bad_v2.get_object(ossv2.GetObjectRequest(bucket=BUCKET, key="k"))
    err = e2.value.unwrap()
    assert (err.status_code, err.code) == (403, "SignatureDoesNotMatch")


def test_sts_credentials(oss: Oss) -> None:
    creds = oss.cloud.ctx.credentials
    creds.create_role("carrier")
    sts = creds.issue_sts("carrier")
    b = oss2.Bucket(oss2.StsAuth(sts.access_key_id, sts.access_key_secret, sts.security_token), oss.endpoint, BUCKET)
    b.put_object("sts/a", b"1")
    assert b.get_object("sts/a").read() == b"1"
    assert requests.get(b.sign_url("GET", "sts/a", 60)).content == b"1"  # security-token in the query
    b4 = oss2.Bucket(oss2.StsAuth(sts.access_key_id, sts.access_key_secret, sts.security_token, auth_version="v4"),
                     oss.endpoint, BUCKET, region=REGION)  # fmt: skip
    assert requests.get(b4.sign_url("GET", "sts/a", 60)).content == b"1"
    client = oss.v2(token_cred=sts)
    client.put_object(ossv2.PutObjectRequest(bucket=BUCKET, key="sts/b", body=b"2"))
    assert client.get_object(ossv2.GetObjectRequest(bucket=BUCKET, key="sts/b")).body.read() == b"2"

    wrong = oss2.Bucket(oss2.StsAuth(sts.access_key_id, sts.access_key_secret, "CAISforged"), oss.endpoint, BUCKET)
    with pytest.raises(oss2.exceptions.ServerError) as e:
        wrong.get_object("sts/a")
    assert _status_code(e.value) == (403, "InvalidSecurityToken")
    short = creds.issue_sts("carrier", ttl_seconds=0.5)
    time.sleep(0.7)
    expired = oss2.Bucket(oss2.StsAuth(short.access_key_id, short.access_key_secret, short.security_token), oss.endpoint, BUCKET)
    with pytest.raises(oss2.exceptions.ServerError) as e:
        expired.get_object("sts/a")
    assert _status_code(e.value) == (403, "SecurityTokenExpired")


# ------------------------------------------------------------------------------ alibabacloud-oss-v2
def test_ossv2_v4_round_trip_paginator_forbid_overwrite(oss: Oss) -> None:
    client = oss.v2()
    client.put_bucket(ossv2.PutBucketRequest(bucket="v2-bucket"))
    for i in range(10):
        client.put_object(ossv2.PutObjectRequest(bucket="v2-bucket", key=f"p/k{i:02d} x", body=f"v{i}".encode(),
                                                 metadata={"idx": str(i)}))  # fmt: skip
    got = client.get_object(ossv2.GetObjectRequest(bucket="v2-bucket", key="p/k03 x"))
    assert got.body.read() == b"v3" and got.metadata == {"idx": "3"} and got.hash_crc64
    head = client.head_object(ossv2.HeadObjectRequest(bucket="v2-bucket", key="p/k03 x"))
    assert head.content_length == 2
    assert client.is_object_exist("v2-bucket", "p/k03 x") and not client.is_object_exist("v2-bucket", "p/none")
    pages = list(client.list_objects_v2_paginator(limit=3).iter_page(ossv2.ListObjectsV2Request(bucket="v2-bucket", prefix="p/")))
    assert len(pages) == 4
    assert [o.key for p in pages for o in p.contents] == [f"p/k{i:02d} x" for i in range(10)]
    with pytest.raises(ossv2.exceptions.OperationError) as e:
        client.put_object(ossv2.PutObjectRequest(bucket="v2-bucket", key="p/k00 x", body=b"z", forbid_overwrite=True))
    err = e.value.unwrap()
    assert (err.status_code, err.code) == (409, "FileAlreadyExists")
    deleted = client.delete_multiple_objects(ossv2.DeleteMultipleObjectsRequest(
        bucket="v2-bucket", objects=[ossv2.DeleteObject(key="p/k00 x"), ossv2.DeleteObject(key="p/k01 x")]))  # fmt: skip
    assert sorted(d.key for d in deleted.deleted_objects) == ["p/k00 x", "p/k01 x"]
    put = client.presign(ossv2.PutObjectRequest(bucket="v2-bucket", key="pre"))
    assert requests.put(put.url, data=b"p", headers=put.signed_headers).status_code == 200


# ----------------------------------------------------------------------- persistence, faults, errors
def test_state_survives_restart(start_oss: Callable[..., Oss], tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = start_oss(state_dir=state)
    b = first.bucket()
    for i in range(30):
        b.put_object(f"keep/{i:02d}", str(i).encode())
    b.delete_object("keep/05")
    upload_id = b.init_multipart_upload("mp").upload_id
    first.cloud.stop()

    second = start_oss(state_dir=state)
    assert second.ak == first.ak
    b2 = second.bucket()
    keys = [o.key for o in oss2.ObjectIteratorV2(b2, prefix="keep/")]
    assert len(keys) == 29 and "keep/05" not in keys
    assert b2.get_object("keep/29").read() == b"29"
    assert b2.list_parts("mp", upload_id).parts == []


def test_fault_injection_and_stats(oss: Oss) -> None:
    b = oss.bucket()
    admin = oss.admin
    admin.add_fault(action="error", status=503, code="ServiceUnavailable", operation="PutObject", count=3)
    for _ in range(3):
        with pytest.raises(oss2.exceptions.ServerError) as e:
            b.put_object("f", b"x")
        assert _status_code(e.value) == (503, "ServiceUnavailable")
    assert b.put_object("f", b"x").status == 200
    assert admin.faults() == []  # exhausted rules go away

    b.put_object("slow/a", b"x")
    admin.add_fault(action="stall", seconds=2, key_prefix="slow/", count=1)
    timeout_bucket = oss.bucket(connect_timeout=0.5)
    with pytest.raises(oss2.exceptions.RequestError):
        timeout_bucket.get_object("slow/a")
    admin.add_fault(action="drop", method="GET", count=1)
    with pytest.raises(oss2.exceptions.RequestError):
        b.get_object("f")
    assert b.get_object("f").read() == b"x"

    admin.add_fault(action="error", status=500, code="InternalError", operation="GetObject", count=2)
    client = oss.v2()  # alibabacloud-oss-v2 retries 5xx by default
    assert client.get_object(ossv2.GetObjectRequest(bucket=BUCKET, key="f")).body.read() == b"x"

    stats = admin.stats()
    assert stats["requests"]["PutObject"] == 5 and stats["faulted"]["PutObject"] == 3
    assert stats["faulted"]["GetObject"] == 4
    assert admin.reset_stats()["total"] == 0
    r = requests.get(f"{oss.endpoint}/-/stats")
    assert r.status_code == 403


def test_faults_from_config_and_bad_config(start_oss: Callable[..., Oss]) -> None:
    oss = start_oss({"buckets": [BUCKET], "faults": [{"action": "error", "status": 500, "code": "InternalError", "duration": 30}]})
    with pytest.raises(oss2.exceptions.ServerError) as e:
        oss.bucket().get_object("x")
    assert _status_code(e.value) == (500, "InternalError")
    with pytest.raises(ValueError, match="bukets"):
        start_oss({"bukets": ["x"]})


def test_malformed_requests_get_oss_errors(oss: Oss) -> None:
    b = oss.bucket()
    url = f"{oss.endpoint}/{BUCKET}/"

    def signed(method: str, key: str, params: dict[str, str], data: bytes = b"", headers: dict[str, str] | None = None) -> requests.Response:
        req = oss2.http.Request(method, f"{oss.endpoint}/{BUCKET}/{oss2.compat.urlquote(key, '')}", data=data,
                                params=params, headers=headers or {})  # fmt: skip
        b.auth._sign_request(req, BUCKET, key)
        return requests.request(method, req.url, params=req.params, data=data, headers=dict(req.headers))

    def code(r: requests.Response) -> tuple[int, str]:
        text = r.text
        return r.status_code, text.split("<Code>")[1].split("</Code>")[0] if "<Code>" in text else ""

    assert code(signed("POST", "", {"delete": ""}, b"<Delete><Object>")) == (400, "MalformedXML")
    assert code(signed("GET", "k", {"acl": ""})) == (501, "NotImplemented")
    assert code(signed("PUT", "k", {"tagging": ""})) == (501, "NotImplemented")
    assert code(signed("POST", "k", {"append": "", "position": "0"}, b"x")) == (501, "NotImplemented")
    assert code(signed("GET", "", {"max-keys": "abc"})) == (400, "InvalidArgument")
    assert code(signed("GET", "", {"max-keys": "1001"})) == (400, "InvalidArgument")
    assert code(signed("GET", "", {"encoding-type": "base64"})) == (400, "InvalidArgument")
    assert code(signed("GET", "", {"list-type": "2", "continuation-token": "!!!"})) == (400, "InvalidArgument")
    r = requests.get(f"{oss.endpoint}/no-such-bucket/k")
    assert code(r) == (404, "NoSuchBucket") and r.headers["x-oss-ec"]
    r = requests.get(url, headers={"Authorization": "OSS broken"})
    assert code(r) == (400, "InvalidArgument")
    r = requests.put(f"{oss.endpoint}/Bad_Name", headers={"Date": oss2.utils.http_date()})
    assert code(r) == (403, "AccessDenied")  # anonymous PutBucket
