"""localcloud ECS driven by the real alibabacloud_ecs20140526 SDK: signatures, calls, errors, idempotency,
pagination, eventual consistency, fault injection, AutoReleaseTime and persistence. Booting is off here
(`boot: False`); tests/test_localcloud_instance_boot.py covers the sandbox."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest
import requests
from alibabacloud_ecs20140526 import models as m
from alibabacloud_ecs20140526.client import Client
from alibabacloud_tea_openapi import models as om
from alibabacloud_tea_openapi.exceptions import ClientException, ServerException
from alibabacloud_tea_openapi.utils import Utils
from darabonba.runtime import RuntimeOptions

from csbench.localcloud.ecs import acs3
from csbench.localcloud.ecs.api import parse_release_time, tags_from
from csbench.localcloud.ecs.config import load_config
from csbench.localcloud.ecs.errors import EcsError
from csbench.localcloud.ecs.guest import parse_unit

REGION = "cn-hangzhou"
IMAGE = "aliyun_3_x64_20G_alibase_20240819.vhd"
ITYPE = "ecs.g7.large"
RT = RuntimeOptions(autoretry=False, read_timeout=10000, connect_timeout=2000)
FAST = {"pending_seconds": 0.2, "starting_seconds": 0.2, "boot": False, "auto_release_min_seconds": 1}


def client(cloud: Any, ak: str | None = None, secret: str | None = None, token: str | None = None) -> Client:
    admin = cloud.ctx.admin
    return Client(om.Config(access_key_id=ak or admin.access_key_id, access_key_secret=secret or admin.access_key_secret,
                            security_token=token, region_id=REGION,
                            endpoint=cloud.endpoints["ecs"].removeprefix("http://"), protocol="HTTP"))


def run(c: Client, **kw: Any) -> list[str]:
    kw.setdefault("region_id", REGION)
    kw.setdefault("image_id", IMAGE)
    kw.setdefault("instance_type", ITYPE)
    return c.run_instances_with_options(m.RunInstancesRequest(**kw), RT).body.instance_id_sets.instance_id_set


def describe(c: Client, **kw: Any) -> Any:
    kw.setdefault("region_id", REGION)
    return c.describe_instances_with_options(m.DescribeInstancesRequest(**kw), RT).body


def wait_for(pred: Any, timeout: float = 10.0, step: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := pred():
            return value
        time.sleep(step)
    raise AssertionError("condition not met in time")


def expect(exc_type: type, code: str, http_status: int, fn: Any, /, *args: Any, **kw: Any) -> Any:
    """Call fn(*args, **kw); it must raise `exc_type` with Aliyun error `code` and HTTP `http_status`."""
    with pytest.raises(exc_type) as info:
        fn(*args, **kw)
    err: Any = info.value
    assert err.code == code, err
    assert err.status_code == http_status, err
    return err


def future(seconds: float) -> str:
    return (datetime.now(timezone.utc) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- pure units ---------------------------------------------------------------------------------------

def test_acs3_verifier_matches_the_sdk_signer() -> None:
    query = {"RegionId": REGION, "Tag.1.Key": "bench.example.com/campaign", "Tag.1.Value": "c 1+x",
             "InstanceIds": '["i-1","i-2"]', "UserData": "IyEvYmluL3No+/=="}
    headers = {"host": "127.0.0.1:1", "x-acs-action": "DescribeInstances", "x-acs-version": "2014-05-26",
               "x-acs-date": "2026-12-02T11:54:59Z", "x-acs-content-sha256": acs3.EMPTY_SHA256,
               "x-acs-signature-nonce": "abc", "accept": "application/json"}
    req = SimpleNamespace(pathname="/", method="POST", query=query, headers=headers)
    header = Utils.get_authorization(req, "ACS3-HMAC-SHA256", acs3.EMPTY_SHA256, "AK", "secret")
    auth = acs3.parse_authorization(header)
    assert auth.access_key_id == "AK" and "x-acs-action" in auth.signed_headers
    # What arrives on the wire is form-encoded; the verifier must decode it back to the signed values.
    from urllib.parse import urlencode

    wire = acs3.parse_query(urlencode(query))
    acs3.verify("secret", "POST", "/", wire, headers, auth)
    with pytest.raises(EcsError) as e:
        acs3.verify("wrong", "POST", "/", wire, headers, auth)
    assert e.value.code == "SignatureDoesNotMatch" and e.value.status == 400
    with pytest.raises(EcsError, match="SignatureDoesNotMatch"):
        acs3.verify("secret", "POST", "/", {**wire, "RegionId": "cn-beijing"}, headers, auth)


def test_pure_helpers() -> None:
    assert tags_from({"Tag.2.Key": "b", "Tag.1.Key": "a", "Tag.1.Value": "1"}) == [("a", "1"), ("b", None)]
    now = time.time()
    assert parse_release_time(future(3600), now, 1800, 86400) > now
    for bad in ("2026-01-01 00:00:00", future(60)):
        with pytest.raises(EcsError, match="InvalidAutoReleaseTime.Malformed"):
            parse_release_time(bad, now, 1800, 86400)
    unit = parse_unit("p.service", "[Unit]\nDescription=x\n[Service]\nExecStart=-/usr/bin/python3 -m x 'a b'\n"
                                   "Environment=A=1 \"B=two words\"\nRestart=on-failure\nRestartSec=2s\n")
    assert unit.exec_start == ["/usr/bin/python3", "-m", "x", "a b"]
    assert unit.env == {"A": "1", "B": "two words"} and unit.restart == "on-failure" and unit.restart_sec == 2.0
    with pytest.raises(ValueError, match="pending_secs"):
        load_config({"pending_secs": 1})


# -- the SDK against the server ----------------------------------------------------------------------

def test_lifecycle_run_describe_status_delete(make_cloud: Any) -> None:
    cloud = make_cloud(services=["ecs"], config={"ecs": {**FAST, "pending_seconds": 0.6}})
    c = client(cloud)
    [iid] = run(c, instance_name="probe-1", internet_max_bandwidth_out=5, security_group_id="sg-1",
                v_switch_id="vsw-1", system_disk=m.RunInstancesRequestSystemDisk(category="cloud_essd", size="40"),
                auto_release_time=future(3600), tag=[m.RunInstancesRequestTag(key="owner", value="me")])
    body = describe(c, instance_ids=json.dumps([iid]))
    inst = body.instances.instance[0]
    assert body.total_count == 1 and inst.status == "Pending"
    assert (inst.instance_name, inst.instance_type, inst.image_id, inst.region_id) == ("probe-1", ITYPE, IMAGE, REGION)
    assert inst.zone_id.startswith(REGION) and inst.creation_time.endswith("Z") and inst.auto_release_time
    assert inst.public_ip_address.ip_address and inst.vpc_attributes.private_ip_address.ip_address
    assert inst.vpc_attributes.v_switch_id == "vsw-1" and inst.security_group_ids.security_group_id == ["sg-1"]
    assert [(t.tag_key, t.tag_value) for t in inst.tags.tag] == [("owner", "me")]
    assert inst.instance_charge_type == "PostPaid" and inst.expired_time
    # Deleting while Pending is refused with the code the operator retries on.
    expect(ClientException, "IncorrectInstanceStatus.Initializing", 403, c.delete_instances_with_options,
           m.DeleteInstancesRequest(region_id=REGION, instance_id=[iid], force=True), RT)
    seen = set()

    def running() -> bool:
        status = c.describe_instance_status_with_options(
            m.DescribeInstanceStatusRequest(region_id=REGION, instance_id=[iid]), RT).body
        seen.add(status.instance_statuses.instance_status[0].status)
        return "Running" in seen

    wait_for(running)
    assert {"Pending", "Running"} <= seen
    assert describe(c, instance_ids=json.dumps([iid])).instances.instance[0].start_time
    expect(ClientException, "IncorrectInstanceStatus", 403, c.delete_instances_with_options,
           m.DeleteInstancesRequest(region_id=REGION, instance_id=[iid]), RT)
    c.delete_instances_with_options(m.DeleteInstancesRequest(region_id=REGION, instance_id=[iid], force=True), RT)
    wait_for(lambda: describe(c, instance_ids=json.dumps([iid])).total_count == 0)
    expect(ClientException, "InvalidInstanceId.NotFound", 404, c.delete_instances_with_options,
           m.DeleteInstancesRequest(region_id=REGION, instance_id=[iid], force=True), RT)


def test_client_token_idempotency(make_cloud: Any) -> None:
    cloud = make_cloud(services=["ecs"], config={"ecs": FAST})
    c = client(cloud)
    tags = [m.RunInstancesRequestTag(key="bench/carrier-uid", value="u1")]
    first = run(c, client_token="pc-u1-0", amount=2, tag=tags)
    assert run(c, client_token="pc-u1-0", amount=2, tag=tags) == first
    assert describe(c).total_count == 2  # the retry created nothing
    expect(ClientException, "IdempotentParameterMismatch", 400, run, c, client_token="pc-u1-0", amount=3, tag=tags)
    assert run(c, client_token="pc-u1-1", amount=2, tag=tags) != first


def test_pagination_page_numbers_and_next_token(make_cloud: Any) -> None:
    cloud = make_cloud(services=["ecs"], config={"ecs": FAST})
    c = client(cloud)
    ids = run(c, amount=23)
    pages = [describe(c, page_size=10, page_number=n) for n in (1, 2, 3, 4)]
    assert [len(p.instances.instance) for p in pages] == [10, 10, 3, 0]
    assert all(p.total_count == 23 for p in pages)
    assert [i.instance_id for p in pages for i in p.instances.instance] == sorted(ids, key=ids.index)
    got, token, calls = [], None, 0
    while True:
        body = describe(c, max_results=10, next_token=token)
        got += [i.instance_id for i in body.instances.instance]
        calls += 1
        token = body.next_token
        if not token:
            break
    assert calls == 3 and sorted(got) == sorted(ids)
    expect(ClientException, "InvalidNextToken", 400, describe, c, next_token="garbage!")
    expect(ClientException, "InvalidParameter", 400, describe, c, page_size=101)


def test_tag_and_status_filters(make_cloud: Any) -> None:
    cloud = make_cloud(services=["ecs"], config={"ecs": FAST})
    c = client(cloud)
    T = m.RunInstancesRequestTag
    a = run(c, tag=[T(key="campaign", value="c1"), T(key="role", value="probe")])
    b = run(c, tag=[T(key="campaign", value="c1"), T(key="role", value="other")])
    run(c, tag=[T(key="campaign", value="c2")])
    F = m.DescribeInstancesRequestTag

    def ids(**kw: Any) -> list[str]:
        return [i.instance_id for i in describe(c, **kw).instances.instance]

    assert ids(tag=[F(key="campaign", value="c1")]) == a + b
    assert ids(tag=[F(key="campaign", value="c1"), F(key="role", value="probe")]) == a  # AND
    assert ids(tag=[F(key="role")]) == a + b  # key only: any value
    assert ids(tag=[F(key="campaign", value="nope")]) == []
    assert len(ids(status="Pending")) == 3 and ids(status="Stopped") == []
    expect(ClientException, "InvalidStatus.ValueNotSupported", 400, describe, c, status="Exploded")
    expect(ClientException, "InvalidInstanceIds.Malformed", 400, describe, c, instance_ids="i-1,i-2")


def test_eventual_consistency(make_cloud: Any) -> None:
    cloud = make_cloud(services=["ecs"], config={"ecs": {**FAST, "visibility_delay_seconds": 0.8}})
    c = client(cloud)
    t0 = time.monotonic()
    [iid] = run(c, tag=[m.RunInstancesRequestTag(key="k", value="v")])
    assert describe(c, instance_ids=json.dumps([iid])).total_count == 0
    assert describe(c, tag=[m.DescribeInstancesRequestTag(key="k", value="v")]).total_count == 0
    wait_for(lambda: describe(c, instance_ids=json.dumps([iid])).total_count == 1)
    assert time.monotonic() - t0 >= 0.7


def test_authentication_errors(make_cloud: Any) -> None:
    cloud = make_cloud(services=["ecs"], config={"ecs": FAST})
    good = client(cloud)
    expect(ClientException, "SignatureDoesNotMatch", 400, describe, client(cloud, secret="not-the-secret"))
    expect(ClientException, "InvalidAccessKeyId.NotFound", 404, describe, client(cloud, ak="LTAInope", secret="x"))
    cloud.ctx.credentials.create_role("EcsRole")
    sts = cloud.ctx.credentials.issue_sts("EcsRole")
    assert describe(client(cloud, sts.access_key_id, sts.access_key_secret, sts.security_token)).total_count == 0
    expect(ClientException, "InvalidSecurityToken.Mismatch", 400, describe,
           client(cloud, sts.access_key_id, sts.access_key_secret, "CAISwrong"))
    params = om.Params(action="NoSuchThing", version="2014-05-26", protocol="HTTP", pathname="/", method="POST",
                       auth_type="AK", style="RPC", req_body_type="formData", body_type="json")
    expect(ClientException, "InvalidAction.NotFound", 404, good.call_api, params,
           om.OpenApiRequest(query={"RegionId": REGION}), RT)
    # Unsigned requests get Aliyun's JSON error, not a traceback.
    r = requests.post(cloud.endpoints["ecs"] + "/", headers={"x-acs-action": "DescribeInstances"}, timeout=5)
    assert r.status_code == 400 and r.json()["Code"] == "IncompleteSignature" and r.json()["RequestId"]


def test_validation_errors_and_dry_run(make_cloud: Any) -> None:
    cloud = make_cloud(services=["ecs"], config={"ecs": FAST})
    c = client(cloud)
    e = expect(ClientException, "DryRunOperation", 400, run, c, dry_run=True)
    assert "Request validation has been passed with DryRun flag set." in e.message
    assert describe(c).total_count == 0
    expect(ClientException, "MissingParameter", 400, run, c, image_id=None)
    expect(ClientException, "InvalidImageId.NotFound", 404, run, c, image_id="no_such_image.vhd")
    expect(ClientException, "InvalidInstanceType.ValueNotSupported", 403, run, c, instance_type="ecs.huge.9xl")
    expect(ClientException, "InvalidZoneId.NotFound", 404, run, c, zone_id="cn-hangzhou-z")
    expect(ClientException, "InvalidSystemDiskCategory.ValueNotSupported", 403, run, c,
           system_disk=m.RunInstancesRequestSystemDisk(category="floppy"))
    expect(ClientException, "InvalidParameter.Amount", 400, run, c, amount=101)
    expect(ClientException, "InvalidParameter.Amount", 400, run, c, amount=2, min_amount=3)
    expect(ClientException, "InvalidRamRole.NotFound", 404, run, c, ram_role_name="NoSuchRole")
    expect(ClientException, "InvalidUserData.Base64FormatInvalid", 400, run, c, user_data="@@not base64@@")
    import base64

    expect(ClientException, "InvalidUserData.SizeExceeded", 400, run, c,
           user_data=base64.b64encode(b"x" * (32 * 1024 + 1)).decode())
    expect(ClientException, "InvalidAutoReleaseTime.Malformed", 400, run, c, auto_release_time="tomorrow")
    expect(ClientException, "InvalidAutoReleaseTime.Malformed", 400, run, c, auto_release_time=future(-60))
    expect(ClientException, "InvalidRegionId.NotFound", 404, describe, c, region_id="us-west-1")


def test_fault_injection(make_cloud: Any) -> None:
    cfg = {**FAST, "stock": {"cn-hangzhou-h": {"ecs.c7.large": "WithoutStock"}},
           "pass_role_propagation_seconds": 30,
           "faults": [{"code": "Throttling.User", "action": "DescribeInstances", "count": 2}]}
    cloud = make_cloud(services=["ecs"], config={"ecs": cfg})
    c = client(cloud)
    base = cloud.endpoints["ecs"]
    for _ in range(2):
        expect(ClientException, "Throttling.User", 400, describe, c)
    assert describe(c).total_count == 0  # the rule is spent
    # runtime rules through the admin endpoint
    r = requests.post(base + "/-/faults", json={"code": "ServiceUnavailable", "action": "RunInstances", "count": 1},
                      timeout=5)
    assert r.status_code == 200 and r.json()[0]["code"] == "ServiceUnavailable"
    expect(ServerException, "ServiceUnavailable", 503, run, c)
    requests.post(base + "/-/faults", json={"code": "OperationDenied.NoStock", "action": "RunInstances",
                                            "zone_id": "cn-hangzhou-i", "duration_seconds": 0.5}, timeout=5)
    expect(ClientException, "OperationDenied.NoStock", 403, run, c, zone_id="cn-hangzhou-i")
    assert run(c, zone_id="cn-hangzhou-j")  # other zones unaffected
    time.sleep(0.6)
    assert run(c, zone_id="cn-hangzhou-i")  # the time-bounded rule expired
    # stock from configuration, per zone and type; without a zone, ECS picks one with stock
    expect(ClientException, "OperationDenied.NoStock", 403, run, c, zone_id="cn-hangzhou-h", instance_type="ecs.c7.large")
    [iid] = run(c, instance_type="ecs.c7.large")
    assert describe(c, instance_ids=json.dumps([iid])).instances.instance[0].zone_id != "cn-hangzhou-h"
    # RAM propagation: a fresh role cannot be passed for pass_role_propagation_seconds
    cloud.ctx.credentials.create_role("FreshRole")
    cloud.ctx.credentials.create_role("OldRole", created_at=time.time() - 60)
    expect(ClientException, "InvalidUser.PassRoleForbidden", 403, run, c, ram_role_name="FreshRole")
    assert run(c, ram_role_name="OldRole")
    # any catalogue code, scoped to an action, with skip
    requests.post(base + "/-/faults", json={"code": "IncorrectInstanceStatus", "action": "DeleteInstances",
                                            "count": 1}, timeout=5)
    expect(ClientException, "IncorrectInstanceStatus", 403, c.delete_instances_with_options,
           m.DeleteInstancesRequest(region_id=REGION, instance_id=[iid], force=True), RT)
    assert requests.delete(base + "/-/faults", timeout=5).json() == []
    stats = requests.get(base + "/-/stats", timeout=5).json()
    assert stats["requests"]["DescribeInstances"] >= 4 and stats["requests"]["RunInstances"] >= 6
    assert stats["errors"]["DescribeInstances:Throttling.User"] == 2
    assert requests.post(base + "/-/faults", json={"code": "Made.Up"}, timeout=5).status_code == 400


def test_images_and_available_resource(make_cloud: Any) -> None:
    cloud = make_cloud(services=["ecs"], config={"ecs": {**FAST, "stock": {"cn-hangzhou-i": {ITYPE: "WithoutStock"}}}})
    c = client(cloud)
    imgs = c.describe_images_with_options(m.DescribeImagesRequest(region_id=REGION, image_owner_alias="system",
                                                                  ostype="linux", architecture="x86_64"), RT).body
    names = {i.image_id for i in imgs.images.image}
    assert IMAGE in names and any(n.startswith("ubuntu_22_04_x64") for n in names)
    assert all(i.architecture == "x86_64" and i.image_owner_alias == "system" for i in imgs.images.image)
    arm = c.describe_images_with_options(m.DescribeImagesRequest(region_id=REGION, architecture="arm64"), RT).body
    assert arm.total_count == 2
    res = c.describe_available_resource_with_options(m.DescribeAvailableResourceRequest(
        region_id=REGION, destination_resource="InstanceType", instance_type=ITYPE), RT).body
    by_zone = {z.zone_id: z.available_resources.available_resource[0].supported_resources.supported_resource[0]
               for z in res.available_zones.available_zone}
    assert by_zone["cn-hangzhou-i"].status_category == "WithoutStock" and by_zone["cn-hangzhou-i"].status == "SoldOut"
    assert by_zone["cn-hangzhou-h"].status_category == "WithStock" and by_zone["cn-hangzhou-h"].value == ITYPE
    expect(ClientException, "MissingParameter", 400, c.describe_available_resource_with_options,
           m.DescribeAvailableResourceRequest(region_id=REGION), RT)


def test_auto_release_time_releases_and_can_be_modified(make_cloud: Any) -> None:
    cloud = make_cloud(services=["ecs"], config={"ecs": FAST})
    c = client(cloud)
    [doomed] = run(c, auto_release_time=future(2))
    [kept] = run(c, auto_release_time=future(2))
    c.modify_instance_auto_release_time_with_options(m.ModifyInstanceAutoReleaseTimeRequest(
        region_id=REGION, instance_id=kept, auto_release_time=future(3600)), RT)
    expect(ClientException, "InvalidAutoReleaseTime.Malformed", 400, c.modify_instance_auto_release_time_with_options,
           m.ModifyInstanceAutoReleaseTimeRequest(region_id=REGION, instance_id=kept, auto_release_time=future(-5)), RT)
    wait_for(lambda: describe(c, instance_ids=json.dumps([doomed])).total_count == 0, timeout=6)
    assert describe(c, instance_ids=json.dumps([kept])).total_count == 1
    # An empty AutoReleaseTime cancels automatic release.
    c.modify_instance_auto_release_time_with_options(m.ModifyInstanceAutoReleaseTimeRequest(
        region_id=REGION, instance_id=kept), RT)
    assert describe(c, instance_ids=json.dumps([kept])).instances.instance[0].auto_release_time == ""


def test_state_survives_restart(make_cloud: Any, tmp_path: Any) -> None:
    state = tmp_path / "persist"
    cloud = make_cloud(state_dir=state, services=["ecs"], config={"ecs": FAST})
    ids = run(make_client := client(cloud), client_token="tok-1", amount=2,
              tag=[m.RunInstancesRequestTag(key="k", value="v")])
    wait_for(lambda: all(i.status == "Running" for i in describe(make_client).instances.instance))
    cloud.stop()
    cloud2 = make_cloud(state_dir=state, services=["ecs"], config={"ecs": FAST})
    c2 = client(cloud2)
    body = describe(c2, tag=[m.DescribeInstancesRequestTag(key="k", value="v")])
    assert sorted(i.instance_id for i in body.instances.instance) == sorted(ids)
    assert {i.status for i in body.instances.instance} == {"Running"}
    assert run(c2, client_token="tok-1", amount=2, tag=[m.RunInstancesRequestTag(key="k", value="v")]) == ids
