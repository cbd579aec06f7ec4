"""kubectl against the local control plane: a real kube-apiserver validating, storing and watching CRs."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import yaml

pytestmark = pytest.mark.kube

GROUP = "test.csbench.dev"

# A small CRD with what our real CRDs rely on: structural schema, defaults, enum, CEL (immutability and
# cross-field), status subresource, printer columns, a short name and a category.
WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"widgets.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wdg"],
                  "categories": ["csbench-test"]},
        "versions": [{
            "name": "v1alpha1", "served": True, "storage": True,
            "subresources": {"status": {}},
            "additionalPrinterColumns": [{"name": "Size", "type": "integer", "jsonPath": ".spec.size"}],
            "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {
                        "type": "object",
                        "required": ["size", "region"],
                        "x-kubernetes-validations": [
                            {"rule": "self.region == oldSelf.region", "message": "region is immutable"},
                            {"rule": "self.size <= self.maxSize", "message": "size must not exceed maxSize"},
                        ],
                        "properties": {
                            "size": {"type": "integer", "minimum": 1},
                            "maxSize": {"type": "integer", "default": 10},
                            "region": {"type": "string", "enum": ["cn-hangzhou", "cn-shanghai"]},
                        },
                    },
                    "status": {"type": "object", "properties": {"phase": {"type": "string"}}},
                },
            }},
        }],
    },
}


def widget(name: str, **spec: object) -> str:
    return yaml.safe_dump({"apiVersion": f"{GROUP}/v1alpha1", "kind": "Widget",
                           "metadata": {"name": name, "namespace": "default"}, "spec": spec})


@pytest.fixture(scope="module")
def crd(kube):  # type: ignore[no-untyped-def]
    kube.kubectl("apply", "-f", "-", input=json.dumps(WIDGET_CRD))
    kube.kubectl("wait", "--for=condition=Established", f"crd/widgets.{GROUP}", "--timeout=30s")
    # Discovery caches in kubectl lag a freshly established CRD by a moment.
    deadline = time.monotonic() + 20
    while kube.kubectl("get", "wdg", check=False).returncode != 0:
        assert time.monotonic() < deadline, "Widget kind never became discoverable"
        time.sleep(0.3)
    yield kube
    kube.kubectl("delete", "crd", f"widgets.{GROUP}", "--wait=false")


def test_server_reports_a_real_version(kube) -> None:  # type: ignore[no-untyped-def]
    version = json.loads(kube.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"].startswith("v1.")
    assert version["serverVersion"]["major"] == "1"


def test_apply_client_side_then_server_side_with_defaults_and_columns(crd) -> None:  # type: ignore[no-untyped-def]
    crd.kubectl("apply", "-f", "-", input=widget("w1", size=3, region="cn-hangzhou"))
    got = json.loads(crd.kubectl("get", "widget", "w1", "-o", "json").stdout)
    assert got["spec"]["maxSize"] == 10  # structural default applied by the server
    assert got["metadata"]["uid"] and got["metadata"]["resourceVersion"]

    crd.kubectl("apply", "--server-side", "--field-manager=csbench-test", "-f", "-",
                input=widget("w2", size=2, region="cn-shanghai"))
    got2 = json.loads(crd.kubectl("get", "wdg", "w2", "-o", "json", "--show-managed-fields").stdout)
    managers = {m["manager"] for m in got2["metadata"]["managedFields"]}
    assert "csbench-test" in managers

    table = crd.kubectl("get", "csbench-test").stdout  # category lists the kind
    assert "SIZE" in table and "w1" in table and "w2" in table


def test_field_validation_errors_name_the_field(crd) -> None:  # type: ignore[no-untyped-def]
    bad_type = crd.kubectl("apply", "-f", "-", input=widget("bad1", size="three", region="cn-hangzhou"),
                           check=False)
    assert bad_type.returncode != 0
    assert "spec.size" in bad_type.stderr

    unknown = crd.kubectl("apply", "--validate=strict", "-f", "-",
                          input=widget("bad2", size=1, region="cn-hangzhou", colour="red"), check=False)
    assert unknown.returncode != 0
    assert 'unknown field "spec.colour"' in unknown.stderr

    missing = crd.kubectl("apply", "-f", "-", input=widget("bad3", size=1), check=False)
    assert missing.returncode != 0 and "spec.region" in missing.stderr and "Required" in missing.stderr

    enum = crd.kubectl("apply", "-f", "-", input=widget("bad4", size=1, region="us-east-1"), check=False)
    assert enum.returncode != 0 and "spec.region" in enum.stderr and "Unsupported value" in enum.stderr


def test_cel_rules_enforce_immutability_and_cross_field_checks(crd) -> None:  # type: ignore[no-untyped-def]
    crd.kubectl("apply", "-f", "-", input=widget("w3", size=1, region="cn-hangzhou"))
    moved = crd.kubectl("apply", "-f", "-", input=widget("w3", size=1, region="cn-shanghai"), check=False)
    assert moved.returncode != 0 and "region is immutable" in moved.stderr

    too_big = crd.kubectl("apply", "-f", "-", input=widget("w4", size=11, region="cn-hangzhou"), check=False)
    assert too_big.returncode != 0 and "size must not exceed maxSize" in too_big.stderr


def test_watch_status_subresource_wait_and_delete(crd) -> None:  # type: ignore[no-untyped-def]
    crd.kubectl("apply", "-f", "-", input=widget("w5", size=1, region="cn-hangzhou"))
    watch = subprocess.Popen(
        ["kubectl", f"--kubeconfig={crd.kubeconfig}", "get", "widget", "w5", "-w", "--output-watch-events",
         "-o", "jsonpath={.type} {.object.status.phase}{'\\n'}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert watch.stdout is not None
        first = watch.stdout.readline().strip()  # the watch is established once it printed the object
        assert first == "ADDED", first
        # The status subresource ignores spec changes and the main resource ignores status changes.
        crd.kubectl("patch", "widget", "w5", "--subresource=status", "--type=merge",
                    "-p", '{"status":{"phase":"Ready"}}')
        crd.kubectl("wait", "widget/w5", "--for=jsonpath={.status.phase}=Ready", "--timeout=20s")
        crd.kubectl("delete", "widget", "w5", "--timeout=20s")
        lines: list[str] = [first]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(line.startswith("DELETED") for line in lines):
            lines.append(watch.stdout.readline().strip())
    finally:
        watch.terminate()
        watch.wait(5)
    assert lines[0].startswith("ADDED")
    assert "MODIFIED Ready" in lines
    assert any(line.startswith("DELETED") for line in lines)
    gone = crd.kubectl("get", "widget", "w5", check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr
