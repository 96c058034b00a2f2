"""Two operator replicas with --peering: one acts, the other waits and takes over when it goes.

The kopf peering CRDs are the ones the Helm chart ships (charts/modelroll/crds/kopf-peering.yaml);
the chart also creates the peering object, which this test does by hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from modelroll_devcluster import Cluster
from modelroll_devcluster.cluster import KubectlError
from tests.support.apiserver import Routes, StartOperator, eventually, model_version

pytestmark = pytest.mark.integration

PEERING_CRDS = Path(__file__).resolve().parents[2] / "charts/modelroll/crds/kopf-peering.yaml"


@pytest.fixture
def peering(cluster: Cluster, namespace: str) -> str:
    """A KopfPeering named "modelroll" in the test namespace (what the chart creates)."""
    cluster.kubectl("apply", "-f", str(PEERING_CRDS))
    cluster.wait_established("kopfpeerings.kopf.dev")
    manifest = {
        "apiVersion": "kopf.dev/v1",
        "kind": "KopfPeering",
        "metadata": {"name": "modelroll"},
    }

    def created() -> bool:
        try:  # the new kind may take a moment to be served
            cluster.apply(manifest, namespace=namespace)
        except KubectlError:
            return False
        return True

    eventually(created, "the KopfPeering created")
    return "modelroll"


def test_of_two_peered_replicas_one_acts_and_the_other_takes_over(
    cluster: Cluster, namespace: str, start_operator: StartOperator, routes: Routes, peering: str
) -> None:
    # With peering, kopf starts paused and resumes once it sees that no live peer outranks it.
    active = start_operator(f"--peering={peering}", "--priority=20")
    standby = start_operator(f"--peering={peering}", "--priority=10")
    eventually(lambda: active.logged("Resuming operations"), "the higher priority acting")

    cluster.apply(model_version("v1", "sentiment", weight=1, endpoint="http://v1:8000"), namespace)
    eventually(lambda: routes.weights("sentiment") == {"v1": 1}, "the active replica routing")
    assert active.logged("Routed model")
    assert not standby.logged("Resuming operations")  # still paused: it wrote nothing
    assert not standby.logged("Routed model")

    active.stop()
    eventually(lambda: standby.logged("Resuming operations"), "the standby resuming", within=90)
    cluster.apply(model_version("v2", "sentiment", weight=3, endpoint="http://v2:8000"), namespace)
    eventually(lambda: routes.weights("sentiment") == {"v1": 1, "v2": 3}, "the standby routing")
    assert standby.errors() == []
