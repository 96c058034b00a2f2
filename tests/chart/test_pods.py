"""The pods of the operator's and the gateway's Deployments: non-root with a read-only root and a
writable /tmp, resources, images, and selectors on stable labels only."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.chart import FULL_VALUES, Helm, by_kind, containers
from tests.support.rendering import KEDA_ON, chart_meta


@pytest.mark.parametrize(
    ("values", "count"),
    [((), 2), ((FULL_VALUES,), 2), ((KEDA_ON,), 4)],
    ids=["default", "full", "keda"],
)
def test_containers_run_non_root_with_read_only_root_and_a_writable_tmp(
    helm: Helm, values: tuple[Path, ...], count: int
) -> None:
    rendered = list(containers(helm.template(values=values)))
    assert len(rendered) == count
    for name, pod, container in rendered:
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] != 0, name
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True, name
        assert security["allowPrivilegeEscalation"] is False, name
        assert security["capabilities"]["drop"] == ["ALL"], name
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert "emptyDir" in volumes[mounts["/tmp"]], name


def test_the_operators_memory_is_limited_by_default_and_resources_pass_through(
    helm: Helm,
) -> None:
    """The operator reads answers of the cluster's canaries (each up to 16 MiB) in one process:
    its limit keeps one that grows from taking the node's memory."""
    default = {n: c for n, _, c in containers(helm.template())}
    assert default["modelroll-operator"]["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"memory": "512Mi"},
    }
    assert "resources" not in default["modelroll-gateway"]
    full = {n: c for n, _, c in containers(helm.template(values=[FULL_VALUES]))}
    assert full["modelroll-operator"]["resources"]["limits"] == {"memory": "256Mi"}


def test_images_default_to_the_app_version(helm: Helm) -> None:
    app_version = chart_meta()["appVersion"]
    images = {n: c["image"] for n, _, c in containers(helm.template())}
    assert images == {
        "modelroll-gateway": f"ghcr.io/modelroll/modelroll-gateway:{app_version}",
        "modelroll-operator": f"ghcr.io/modelroll/modelroll-operator:{app_version}",
    }


def test_selectors_use_only_stable_labels(helm: Helm) -> None:
    docs = helm.template(values=[FULL_VALUES])
    selectors = [d["spec"]["selector"]["matchLabels"] for d in by_kind(docs, "Deployment")]
    selectors += [d["spec"]["selector"] for d in by_kind(docs, "Service")]
    for selector in selectors:
        assert set(selector) == {
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/component",
        }
    for deployment in by_kind(docs, "Deployment"):
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector.items() <= pod_labels.items()
