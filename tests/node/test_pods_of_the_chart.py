"""``helm install`` of the chart, for real: the operator and gateway pods run the images built here,
become Ready, and reach the API server with their own service accounts' tokens."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from tests.support.incluster import InCluster

pytestmark = pytest.mark.node


def pod(story: InCluster, component: str) -> dict[str, Any]:
    selector = f"app.kubernetes.io/instance={story.release},app.kubernetes.io/component={component}"
    pods = story.cluster.kubectl_json("get", "pods", "-l", selector, namespace=story.namespace)
    (found,) = pods["items"]
    assert isinstance(found, dict)
    return found


@pytest.mark.parametrize("component", ["operator", "gateway"])
def test_the_charts_pods_are_ready_and_use_their_service_accounts(
    on_cluster: InCluster, component: str
) -> None:
    found = pod(on_cluster, component)
    conditions = {c["type"]: c["status"] for c in found["status"]["conditions"]}
    assert conditions["Ready"] == "True"
    spec = found["spec"]
    assert spec["serviceAccountName"] == f"{on_cluster.release}-{component}"
    # The service-account admission mounted a token the kubelet keeps fresh.
    projected = [v for v in spec["volumes"] if "projected" in v]
    sources = [s for v in projected for s in v["projected"]["sources"]]
    assert any("serviceAccountToken" in s for s in sources), spec["volumes"]
    (container,) = spec["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert found["status"]["containerStatuses"][0]["restartCount"] == 0


def test_the_gateway_pod_read_its_routes_through_the_api(on_cluster: InCluster) -> None:
    """The gateway answers /readyz only once it has listed its routes ConfigMap, which it can do
    only with its service account's token (its Role allows exactly that ConfigMap)."""
    with urllib.request.urlopen(f"{on_cluster.gateway_url}/readyz", timeout=5) as resp:  # noqa: S310
        assert resp.status == 200
    with urllib.request.urlopen(f"{on_cluster.gateway_admin_url}/v1/routes", timeout=5) as resp:  # noqa: S310
        assert "models" in json.loads(resp.read())
    logs = on_cluster.kubectl("logs", f"deployment/{on_cluster.release}-gateway").stdout
    assert "Unauthorized" not in logs, logs[-2000:]
    assert "Forbidden" not in logs, logs[-2000:]
