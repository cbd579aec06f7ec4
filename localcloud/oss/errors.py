"""OSS error responses: one exception type carrying the HTTP status, the OSS code and extra XML fields.

Handlers raise `OssError`; the middleware in server.py renders it as Aliyun does:
`<Error><Code/><Message/><RequestId/><HostId/>...<EC/></Error>` plus the `x-oss-ec` header.
"""

from __future__ import annotations

# Error codes ("EC") as shown by real OSS in `x-oss-ec` and <EC>. Codes we are not sure of use a neutral
# placeholder of the same shape, so clients that only log the value keep working.
_EC: dict[str, str] = {
    "NoSuchKey": "0026-00000001",
    "NoSuchBucket": "0015-00000101",
    "SignatureDoesNotMatch": "0002-00000040",
    "InvalidAccessKeyId": "0002-00000902",
    "AccessDenied": "0003-00000001",
    "FileAlreadyExists": "0026-00000002",
    "InvalidDigest": "0016-00000503",
    "PreconditionFailed": "0026-00000003",
    "BucketNotEmpty": "0015-00000301",
    "BucketAlreadyExists": "0015-00000104",
}
_EC_PLACEHOLDER = "0000-00000000"


class OssError(Exception):
    def __init__(self, status: int, code: str, message: str, **fields: str):
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.fields = fields  # extra children of <Error>, e.g. Key, BucketName, StringToSign

    @property
    def ec(self) -> str:
        return _EC.get(self.code, _EC_PLACEHOLDER)


# Shorthands for the errors raised in many places; the messages are Aliyun's.
def no_such_bucket(bucket: str) -> OssError:
    return OssError(404, "NoSuchBucket", "The specified bucket does not exist.", BucketName=bucket)


def no_such_key(key: str) -> OssError:
    return OssError(404, "NoSuchKey", "The specified key does not exist.", Key=key)


def invalid_argument(message: str, name: str = "", value: str = "") -> OssError:
    fields = {"ArgumentName": name, "ArgumentValue": value} if name else {}
    return OssError(400, "InvalidArgument", message, **fields)


def malformed_xml(detail: str) -> OssError:
    return OssError(
        400, "MalformedXML", f"The XML you provided was not well-formed or did not validate against our published schema. ({detail})"
    )


def not_implemented(what: str) -> OssError:
    return OssError(501, "NotImplemented", f"{what} is not implemented by localcloud OSS.")
