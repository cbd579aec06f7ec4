"""ECS error codes, HTTP statuses and messages, as Aliyun returns them.

Every failure the stand-in can produce is an `EcsError`; the aiohttp layer turns it into Aliyun's JSON shape
`{RequestId, HostId, Code, Message, Recommend}` with the matching HTTP status, so the real SDK raises
`ClientException` (4xx) or `ServerException` (5xx) carrying `.code`. The catalogue below is the single place
that knows which code goes with which status; codes and statuses follow the ECS API error centre.
"""

from __future__ import annotations

from dataclasses import dataclass

# code -> (HTTP status, default message). Messages mirror Aliyun's wording so log-grepping code behaves alike.
CATALOGUE: dict[str, tuple[int, str]] = {
    # Request / authentication layer (POP gateway)
    "MissingParameter": (400, "The input parameter {name} that is mandatory for processing this request is not supplied."),
    "InvalidParameter": (400, "The specified parameter {name} is not valid."),
    "SignatureDoesNotMatch": (400, "Specified signature is not matched with our calculation."),
    "IncompleteSignature": (400, "The request signature does not conform to Aliyun standards."),
    "InvalidAccessKeyId.NotFound": (404, "Specified access key is not found."),
    "InvalidSecurityToken.Expired": (400, "Specified SecurityToken is expired."),
    "InvalidSecurityToken.Mismatch": (400, "Specified SecurityToken is not matched with the AccessKeyId."),
    "InvalidSecurityToken.MissingToken": (400, "The security token of the STS AccessKeyId is missing."),
    "InvalidAction.NotFound": (404, "Specified api is not found, please check your url and method."),
    "InvalidVersion": (400, "Specified parameter Version is not valid."),
    "Throttling.User": (400, "Request was denied due to user flow control."),
    "Throttling": (400, "Request was denied due to request throttling."),
    "ServiceUnavailable": (503, "The request has failed due to a temporary failure of the server."),
    "InternalError": (500, "The request processing has failed due to some unknown error, exception or failure."),
    # RunInstances
    "DryRunOperation": (400, "Request validation has been passed with DryRun flag set."),
    "IdempotentParameterMismatch": (
        400, "Request uses a client token in a previous request but is not identical to that request."),
    "InvalidImageId.NotFound": (404, "The specified ImageId does not exist."),
    "InvalidInstanceType.ValueNotSupported": (403, "The specified InstanceType does not exist or beyond the permitted range."),
    "InvalidZoneId.NotFound": (404, "The specified ZoneId does not exist."),
    "InvalidSystemDiskCategory.ValueNotSupported": (403, "The specified parameter SystemDisk.Category is not valid."),
    "InvalidRamRole.NotFound": (404, "The specified parameter \"RAMRoleName\" does not exist."),
    "InvalidUser.PassRoleForbidden": (403, "The RAM user does not have the privilege to pass a RAM role."),
    "OperationDenied.NoStock": (
        403, "Sales of this resource are temporarily suspended in the specified region; please try again later."),
    "InvalidUserData.SizeExceeded": (400, "The specified parameter UserData exceeds the size."),
    "InvalidUserData.Base64FormatInvalid": (400, "The specified UserData is not valid Base64."),
    "InvalidAutoReleaseTime.Malformed": (400, "The specified parameter autoReleaseTime is not valid."),
    "InvalidParameter.Amount": (400, "The specified parameter Amount or MinAmount is not valid."),
    "InvalidInternetMaxBandwidthOut.Malformed": (400, "The specified parameter InternetMaxBandwidthOut is not valid."),
    "QuotaExceed.PostPaidInstance": (403, "Living instances quota exceeded in this zone."),
    # Describe*
    "InvalidInstanceIds.Malformed": (400, "The specified parameter InstanceIds is not valid."),
    "InvalidStatus.ValueNotSupported": (400, "The specified parameter Status is not valid."),
    "InvalidNextToken": (400, "The specified parameter NextToken is not valid."),
    "InvalidParameter.DestinationResource": (400, "The specified parameter DestinationResource is not valid."),
    # Instance lifecycle
    "InvalidInstanceId.NotFound": (404, "The specified InstanceId does not exist."),
    "IncorrectInstanceStatus": (403, "The current status of the resource does not support this operation."),
    "IncorrectInstanceStatus.Initializing": (403, "The specified instance is in initializing status."),
}

HOST_ID = "ecs.aliyuncs.com"


@dataclass
class EcsError(Exception):
    """A request failed with an Aliyun error `code`; `status` and `message` default from the catalogue."""

    code: str
    message: str = ""
    status: int = 0
    recommend: str = ""
    retry_after: int = 0  # seconds; sent as x-acs-retry-after (the SDK then raises ThrottlingException)

    def __post_init__(self) -> None:
        status, default = CATALOGUE.get(self.code, (400, self.code))
        self.status = self.status or status
        self.message = self.message or default
        super().__init__(f"{self.code}: {self.message}")

    def body(self, request_id: str) -> dict[str, str]:
        return {
            "RequestId": request_id,
            "HostId": HOST_ID,
            "Code": self.code,
            "Message": self.message,
            "Recommend": self.recommend
            or f"https://api.aliyun.com/troubleshoot?q={self.code}&product=Ecs&requestId={request_id}",
        }


def missing(name: str) -> EcsError:
    return EcsError("MissingParameter", CATALOGUE["MissingParameter"][1].format(name=name))


def invalid(name: str, why: str = "") -> EcsError:
    msg = CATALOGUE["InvalidParameter"][1].format(name=name)
    return EcsError("InvalidParameter", f"{msg} {why}".strip())
