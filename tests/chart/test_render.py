"""The chart as helm lints and renders it: Chart.yaml, which objects the default and the full
values render, and the CRDs it ships in crds/, never templated."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelroll_operator.permissions import PERMISSIONS
from tests.support.chart import CHART, FULL_VALUES, Helm, by_kind, one
from tests.support.rendering import KEDA_ON, chart_meta, rules_of


@pytest.mark.parametrize(
    "values", [(), (FULL_VALUES,), (KEDA_ON,)], ids=["default", "full", "keda"]
)
def test_helm_lint_strict_passes(helm: Helm, values: tuple[Path, ...]) -> None:
    args = ["lint", "--strict", str(CHART)]
    for path in values:
        args += ["--values", str(path)]
    result = helm.run(*args)
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout
    assert "[ERROR]" not in result.stdout, result.stdout
    assert "[WARNING]" not in result.stdout, result.stdout


def test_chart_yaml_is_v2_with_kube_version() -> None:
    meta = chart_meta()
    assert meta["apiVersion"] == "v2"
    assert meta["kubeVersion"].startswith(">=")
    assert meta["type"] == "application"


def test_default_install_is_operator_and_gateway_without_monitoring(helm: Helm) -> None:
    docs = helm.template()
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "NetworkPolicy",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    assert [d["metadata"]["name"] for d in by_kind(docs, "Deployment")] == [
        "modelroll-gateway",
        "modelroll-operator",
    ]


def test_full_values_render_every_optional_object(helm: Helm) -> None:
    docs = helm.template(values=[FULL_VALUES])
    for kind in ("PodMonitor", "ServiceMonitor", "PrometheusRule", "ConfigMap"):
        assert by_kind(docs, kind), f"no {kind} rendered with {FULL_VALUES.name}"
    # The operator watches two namespaces: a Role and RoleBinding in each, no ClusterRole for them.
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]) for r in by_kind(docs, "Role")}
    assert ("models", "modelroll-operator") in roles
    assert ("models-staging", "modelroll-operator") in roles
    cluster_roles = [r["metadata"]["name"] for r in by_kind(docs, "ClusterRole")]
    assert cluster_roles == ["modelroll-operator-cluster"]
    # Cluster-wide, only what lets it finish deleting a watched namespace once the Role is gone.
    deletion = rules_of(one(docs, "ClusterRole", "-operator-cluster")) - rules_of(
        one(helm.template(), "ClusterRole", "-operator-cluster")
    )
    # gatewayAPI and peering are on in the full values: their rows are kept there too.
    assert deletion == {
        (p.group, p.resource, verb) for p in PERMISSIONS if p.deleting for verb in p.deleting.verbs
    }
    configmaps = [
        r
        for r in one(docs, "ClusterRole", "-operator-cluster")["rules"]
        if "configmaps" in r["resources"]
    ]
    assert [r.get("resourceNames") for r in configmaps] == [["modelroll-routes"]]


def test_the_crd_is_shipped_in_crds_and_not_templated(helm: Helm) -> None:
    assert not by_kind(helm.template(), "CustomResourceDefinition")
    crds = by_kind(helm.template("--include-crds"), "CustomResourceDefinition")
    assert sorted(c["metadata"]["name"] for c in crds) == [
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
        "modelversions.modelroll.io",
    ]
