"""Figures for the local stand-ins: OSS throughput, RunInstances → Running, control-plane start."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from benches import Figure, bench, percentile


@bench("kube_start")
def kube_start() -> list[Figure]:
    from csbench.localcloud.kube.build import ensure_apiserver
    from csbench.localcloud.kube.controlplane import ControlPlane

    ensure_apiserver()  # build time is a one-off; the figure is the warm-cache start
    samples = []
    for _ in range(3):
        with tempfile.TemporaryDirectory() as tmp:
            plane = ControlPlane(Path(tmp))
            t0 = time.perf_counter()
            plane.start()
            samples.append(time.perf_counter() - t0)
            plane.stop()
    samples.sort()
    return [Figure("kube_controlplane_start_warm_p50", samples[1], "s", "etcd + kube-apiserver to /readyz, 3 runs")]


def _cloud(tmp: str, services: list[str], config: dict | None = None):  # type: ignore[no-untyped-def]
    from csbench.localcloud.cloud import LocalCloudThread

    return LocalCloudThread(Path(tmp), services=services, config=config or {}).start()


@bench("oss_ops")
def oss_ops() -> list[Figure]:
    """Sequential oss2 calls from one process (V4 signing, path style, loopback): the store's per-op cost."""
    import oss2

    figures = []
    with tempfile.TemporaryDirectory() as tmp:
        cloud = _cloud(tmp, ["oss"], {"oss": {"buckets": ["bench"]}})
        try:
            admin = cloud.ctx.admin
            auth = oss2.ProviderAuthV4(oss2.credentials.StaticCredentialsProvider(
                admin.access_key_id, admin.access_key_secret))
            bucket = oss2.Bucket(auth, cloud.endpoints["oss"], "bench", region=cloud.ctx.region)
            body = b"x" * 1024
            n = 500
            t0 = time.perf_counter()
            for i in range(n):
                bucket.put_object(f"k/{i:05d}", body)
            figures.append(Figure("oss_put_1KiB_ops_per_s", n / (time.perf_counter() - t0), "ops/s"))
            t0 = time.perf_counter()
            for i in range(n):
                bucket.get_object(f"k/{i:05d}").read()
            figures.append(Figure("oss_get_1KiB_ops_per_s", n / (time.perf_counter() - t0), "ops/s"))
            pages = 50
            t0 = time.perf_counter()
            for _ in range(pages):
                result = bucket.list_objects_v2(prefix="k/", max_keys=100)
                assert len(result.object_list) == 100
            figures.append(Figure("oss_list_100_keys_ops_per_s", pages / (time.perf_counter() - t0), "ops/s"))
        finally:
            cloud.stop()
    return figures


@bench("ecs_run_to_running")
def ecs_run_to_running() -> list[Figure]:
    """RunInstances → DescribeInstances shows Running, polled every 100 ms, with localcloud's default delays."""
    from alibabacloud_ecs20140526 import models as m
    from alibabacloud_ecs20140526.client import Client
    from alibabacloud_tea_openapi import models as om

    samples = []
    with tempfile.TemporaryDirectory() as tmp:
        cloud = _cloud(tmp, ["ecs"], {"ecs": {"boot": False}})
        try:
            admin = cloud.ctx.admin
            client = Client(om.Config(access_key_id=admin.access_key_id, access_key_secret=admin.access_key_secret,
                                      region_id=cloud.ctx.region, protocol="HTTP",
                                      endpoint=cloud.endpoints["ecs"].removeprefix("http://")))
            images = client.describe_images(m.DescribeImagesRequest(region_id=cloud.ctx.region,
                                                                    image_owner_alias="system"))
            image = images.body.images.image[0].image_id
            for i in range(5):
                t0 = time.perf_counter()
                run = client.run_instances(m.RunInstancesRequest(
                    region_id=cloud.ctx.region, image_id=image, instance_type="ecs.t6-c1m1.large",
                    client_token=f"bench-{i}", amount=1))
                iid = run.body.instance_id_sets.instance_id_set[0]
                while True:
                    desc = client.describe_instances(m.DescribeInstancesRequest(
                        region_id=cloud.ctx.region, instance_ids=f'["{iid}"]'))
                    found = desc.body.instances.instance if desc.body.instances else []
                    if found and found[0].status == "Running":
                        break
                    time.sleep(0.1)
                samples.append(time.perf_counter() - t0)
        finally:
            cloud.stop()
    samples.sort()
    return [Figure("ecs_run_instances_to_running_p50", percentile(samples, 50), "s",
                   "localcloud defaults: pending 1 s + starting 1 s; 5 instances, 100 ms polling")]
