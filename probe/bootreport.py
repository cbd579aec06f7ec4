#!/usr/bin/env python3
"""Boot-stage reporter for a carrier VM (stdlib only: it runs before anything is pip-installed).

    python3 bootreport.py <stage> [message]

Appends `<UTC time> <stage> <message>` to a local log and uploads the whole log to
`csbench/v1/campaigns/<uid>/carriers/<carrier>/boot.log` (same layout as csbench.probe.protocol.Keys),
signed with OSS V1 (HMAC-SHA1) using the instance RAM role's STS credentials from the metadata service
(or CB_PROBE_ACCESS_KEY_ID/SECRET in development). Settings: the same CB_PROBE_* variables as cb-probe,
plus CB_BOOT_LOG (local log path). Every network call has a short timeout; a failure is reported on stderr
and never fails the boot (exit code is always 0).
"""

import base64
import datetime
import hashlib
import hmac
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from email.utils import formatdate

METADATA_TIMEOUT_S = 2.0
UPLOAD_TIMEOUT_S = 5.0


def boot_log_key(campaign_uid, carrier_id):
    return f"csbench/v1/campaigns/{campaign_uid}/carriers/{carrier_id}/boot.log"


def role_credentials(metadata_url):
    base = metadata_url.rstrip("/") + "/latest/meta-data/ram/security-credentials/"
    with urllib.request.urlopen(base, timeout=METADATA_TIMEOUT_S) as resp:
        role = resp.read().decode().strip().splitlines()[0]
    with urllib.request.urlopen(base + urllib.parse.quote(role), timeout=METADATA_TIMEOUT_S) as resp:
        doc = json.loads(resp.read())
    if doc.get("Code") != "Success":
        raise RuntimeError("metadata service returned credentials with Code={!r}".format(doc.get("Code")))
    return doc["AccessKeyId"], doc["AccessKeySecret"], doc.get("SecurityToken")


def sign_v1(secret, verb, content_md5, content_type, date, oss_headers, resource):
    """OSS V1 signature: base64(HMAC-SHA1(secret, VERB\\nMD5\\nType\\nDate\\n<x-oss-* headers><resource>))."""
    canon = "".join(f"{k}:{oss_headers[k]}\n" for k in sorted(oss_headers))
    string_to_sign = "\n".join([verb, content_md5, content_type, date, canon + resource])
    digest = hmac.new(secret.encode(), string_to_sign.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def object_url(endpoint, bucket, key):
    """Path-style for IP/localhost endpoints (localcloud), virtual-hosted for OSS domains."""
    parts = urllib.parse.urlsplit(endpoint)
    host = parts.hostname or ""
    quoted = urllib.parse.quote(key, safe="/")
    if host in ("localhost", "::1") or host.startswith("127."):
        return f"{parts.scheme}://{parts.netloc}/{bucket}/{quoted}"
    return f"{parts.scheme}://{bucket}.{parts.netloc}/{quoted}"


def upload(env, body):
    bucket = env["CB_PROBE_BUCKET"]
    endpoint = env.get("CB_PROBE_ENDPOINT") or "https://oss-{}-internal.aliyuncs.com".format(env["CB_PROBE_REGION"])
    key = boot_log_key(env["CB_PROBE_CAMPAIGN_UID"], env["CB_PROBE_CARRIER_ID"])
    if env.get("CB_PROBE_ACCESS_KEY_ID"):
        ak, secret, token = env["CB_PROBE_ACCESS_KEY_ID"], env.get("CB_PROBE_ACCESS_KEY_SECRET", ""), None
    else:
        ak, secret, token = role_credentials(env.get("CB_PROBE_METADATA_URL") or "http://100.100.100.200")
    date = formatdate(usegmt=True)
    ctype = "text/plain; charset=utf-8"
    md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
    oss_headers = {"x-oss-security-token": token} if token else {}
    signature = sign_v1(secret, "PUT", md5, ctype, date, oss_headers, f"/{bucket}/{key}")
    req = urllib.request.Request(object_url(endpoint, bucket, key), data=body, method="PUT")
    for name, value in [("Date", date), ("Content-Type", ctype), ("Content-MD5", md5),
                        ("Authorization", f"OSS {ak}:{signature}")] + sorted(oss_headers.items()):
        req.add_header(name, value)
    try:
        with urllib.request.urlopen(req, timeout=UPLOAD_TIMEOUT_S) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:
        raise RuntimeError("OSS answered {}: {}".format(exc.code, exc.read()[:300].decode(errors="replace"))) from None


def main(argv):
    if len(argv) < 2:
        sys.stderr.write("usage: bootreport.py <stage> [message]\n")
        return 0
    stage, message = argv[1], " ".join(argv[2:])
    path = os.environ.get("CB_BOOT_LOG", "/var/log/csbench-boot-stages.log")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    line = (f"{stamp} {stage} {message}").rstrip() + "\n"
    body = line.encode()
    try:
        with open(path, "ab") as f:
            f.write(body)
        with open(path, "rb") as f:
            body = f.read()[-(256 * 1024):]  # bounded: the tail of a very chatty boot is what matters
    except OSError as exc:
        sys.stderr.write(f"bootreport: cannot write {path} ({exc}); uploading this line only\n")
    try:
        upload(os.environ, body)
    except Exception as exc:  # never fail the boot over a report
        sys.stderr.write(f"bootreport: upload of stage {stage!r} failed: {type(exc).__name__}: {exc}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
