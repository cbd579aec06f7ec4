"""The kube-apiserver build recipe, checked against the real go.mod of the pinned release."""

from __future__ import annotations

from csbench.localcloud.kube.build import KUBE_VERSION, render_gomod, staging_replaces, version_ldflags

GOMOD_EXCERPT = """module k8s.io/kubernetes

go 1.24.0

require (
\tgithub.com/spf13/cobra v1.9.1
\tk8s.io/api v0.0.0
\tk8s.io/apiserver v0.0.0
\tk8s.io/kube-openapi v0.0.0-20250710124328-f3f2b991d03b
\tk8s.io/utils v0.0.0-20250604170112-4c0f3b243397
)
"""


def test_only_v0_0_0_staging_modules_are_replaced_with_the_matching_release() -> None:
    assert staging_replaces(GOMOD_EXCERPT, "v1.34.4") == [("k8s.io/api", "v0.34.4"), ("k8s.io/apiserver", "v0.34.4")]


def test_gomod_requires_the_release_and_pins_each_staging_module() -> None:
    text = render_gomod("v1.34.4", [("k8s.io/api", "v0.34.4")])
    assert "require k8s.io/kubernetes v1.34.4" in text
    assert "\tk8s.io/api => k8s.io/api v0.34.4" in text


def test_ldflags_stamp_the_version_the_server_reports() -> None:
    flags = version_ldflags(KUBE_VERSION)
    assert f"gitVersion={KUBE_VERSION}" in flags and "gitMajor=1" in flags
