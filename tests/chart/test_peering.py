"""operator.peering (kopf-peering.yaml): the peering objects the operator's replicas share and
the RBAC on them, and more than one replica only with peering."""

from __future__ import annotations

import pytest

from tests.support.chart import CHART, Helm, by_kind, one
from tests.support.rendering import operator_args, rules_of


def test_peering_creates_the_peering_object_the_replicas_share(helm: Helm) -> None:
    standalone = helm.template()
    assert "--standalone" in operator_args(standalone)
    assert not by_kind(standalone, "ClusterKopfPeering")
    peering = helm.template("--set", "operator.peering=true,operator.replicas=2")
    assert "--peering=modelroll" in operator_args(peering)
    assert "--standalone" not in operator_args(peering)
    assert one(peering, "ClusterKopfPeering")["metadata"]["name"] == "modelroll"
    assert ("kopf.dev", "clusterkopfpeerings", "patch") in rules_of(
        one(peering, "ClusterRole", "-operator-cluster")
    )
    limited = helm.template("--set", "operator.peering=true,operator.watchNamespaces={a,b}")
    peerings = by_kind(limited, "KopfPeering")
    assert sorted(p["metadata"]["namespace"] for p in peerings) == ["a", "b"]
    assert not by_kind(limited, "ClusterKopfPeering")
    for role in by_kind(limited, "Role"):
        if role["metadata"]["name"].endswith("-operator"):
            assert ("kopf.dev", "kopfpeerings", "patch") in rules_of(role)


@pytest.mark.parametrize("replicas", ["2", "3"])
def test_more_than_one_operator_without_peering_is_refused_naming_the_fix(
    helm: Helm, replicas: str
) -> None:
    """Two standalone operators would both act on every ModelVersion at once."""
    for values in (
        f"operator.replicas={replicas}",
        f"operator.replicas={replicas},operator.peering=false",
    ):
        refused = helm.run("template", "modelroll", str(CHART), "--set", values, check=False)
        assert refused.returncode != 0, f"--set {values} was rendered"
        assert f"operator.replicas is {replicas}" in refused.stderr, refused.stderr
        assert "set operator.peering=true" in refused.stderr, refused.stderr
    peering = helm.template("--set", f"operator.replicas={replicas},operator.peering=true")
    assert one(peering, "Deployment", "-operator")["spec"]["replicas"] == int(replicas)
    # One replica (or none) needs no peering; nor does a chart that deploys no operator.
    for values in ("operator.replicas=1", "operator.replicas=0"):
        assert "--standalone" in operator_args(helm.template("--set", values))
    helm.template("--set", f"operator.replicas={replicas},operator.enabled=false")
