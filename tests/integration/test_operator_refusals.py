"""What the API server and the cluster's admission refuse, against the real API server: an edit
of a serving version that cannot be applied changes nothing that serves and names the field, a
refusal for good is not retried, a refused Deployment gets no Service, and pods that a
ResourceQuota or Pod Security "restricted" refuses say why in the version's status, and are
admitted once the version sets the fields they need.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from modelroll_devcluster import Cluster
from tests.support.apiserver import (
    Routes,
    StartOperator,
    condition,
    eventually,
    get,
    mark_pods_ready,
    model_version,
    warning_reasons,
)

pytestmark = pytest.mark.integration

SERVER: dict[str, Any] = {"image": "ghcr.io/acme/solo:1", "port": 9000}


def ready(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    for c in get(cluster, namespace, "mv", name).get("status", {}).get("conditions", []):
        if c["type"] == "Ready":
            return dict(c)
    return {}


def ready_because(cluster: Cluster, namespace: str, reason: str) -> dict[str, Any]:
    """solo-v1's Ready condition, once its reason is ``reason``."""
    found: dict[str, Any] = eventually(
        lambda: c if (c := ready(cluster, namespace, "solo-v1")).get("reason") == reason else None,
        f"solo-v1 Ready with reason {reason}",
        60,
    )
    return found


def serving_solo(cluster: Cluster, namespace: str, routes: Routes) -> dict[str, Any]:
    """solo-v1, the only version of its model, applied and serving; its Deployment."""
    cluster.apply(model_version("solo-v1", "solo", weight=1, server=SERVER), namespace)
    eventually(lambda: mark_pods_ready(cluster, namespace, "modelroll.io/version=solo-v1"), "a pod")
    eventually(lambda: routes.weights("solo") == {"solo-v1": 1}, "solo-v1 routed")
    eventually(lambda: ready(cluster, namespace, "solo-v1").get("status") == "True", "Ready")
    return get(cluster, namespace, "deploy", "solo-v1")


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            {"tolerations": [{"key": "gpu", "operator": "Sometimes"}]},
            "tolerations[0].operator",
        ),
        (
            {"livenessProbe": {"httpGet": {"path": "/livez", "port": 8000}}},
            "spec.server.livenessProbe.httpGet.port 8000 is not the model server's port",
        ),
        (
            {
                "initContainers": [
                    {
                        "name": "fetch",
                        "image": "ghcr.io/acme/fetch:1",
                        "env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}],
                    }
                ]
            },
            "duplicate entries for key",
        ),
    ],
    ids=["API server 422", "operator", "server-side apply 500"],
)
def test_a_refused_edit_of_the_only_serving_version_changes_nothing_that_serves(
    cluster: Cluster,
    namespace: str,
    start_operator: StartOperator,
    routes: Routes,
    change: dict[str, Any],
    says: str,
) -> None:
    operator = start_operator()
    before = serving_solo(cluster, namespace, routes)
    routes_before = routes.data()

    patch = {"spec": {"server": change}}
    cluster.kubectl(
        "patch", "mv", "solo-v1", "--type=merge", "-p", json.dumps(patch), namespace=namespace
    )
    refused = ready_because(cluster, namespace, "UpdateRefused")
    assert refused["status"] == "True"
    assert says in refused["message"]
    assert "running its previous spec" in refused["message"]
    assert condition(get(cluster, namespace, "mv", "solo-v1"), "Routed") == ("True", "Routed")
    assert routes.data() == routes_before  # the gateway's routes did not move
    after = get(cluster, namespace, "deploy", "solo-v1")
    assert after["metadata"]["generation"] == before["metadata"]["generation"]  # no rollout

    # A refusal for good is not retried: the same spec would be refused again.
    time.sleep(3)
    assert not operator.logged("retrying in"), operator.messages()[-5:]
    assert "WorkloadRefused" not in warning_reasons(cluster, namespace, "solo-v1")


def test_a_new_version_whose_deployment_is_refused_gets_no_service(
    cluster: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    start_operator()
    bad = {**SERVER, "tolerations": [{"key": "gpu", "operator": "Sometimes"}]}
    cluster.apply(model_version("solo-v1", "solo", weight=1, server=bad), namespace)
    refused = ready_because(cluster, namespace, "InvalidSpec")
    assert "tolerations[0].operator" in refused["message"]
    assert not cluster.exists("service", "solo-v1", namespace=namespace)
    assert not cluster.exists("deploy", "solo-v1", namespace=namespace)


SPREAD = {"topologyKey": "topology.kubernetes.io/zone", "maxSkew": 1}


@pytest.mark.parametrize(
    ("twice", "says"),
    [
        (
            {"imagePullSecrets": [{"name": "registry"}, {"name": "registry"}]},
            "spec.server.imagePullSecrets[1]: Duplicate value",
        ),
        (
            {"topologySpreadConstraints": [SPREAD, {**SPREAD, "maxSkew": 2}]},
            "spec.server.topologySpreadConstraints[1]: Duplicate value",
        ),
    ],
    ids=["imagePullSecrets", "topologySpreadConstraints"],
)
@pytest.mark.usefixtures("crd")
def test_the_crd_refuses_a_list_whose_keys_repeat(
    cluster: Cluster, namespace: str, twice: dict[str, Any], says: str
) -> None:
    """Refused at kubectl apply, by name, rather than by server-side apply of the Deployment."""
    doc = model_version("solo-v1", "solo", weight=1, server={**SERVER, **twice})
    refused = cluster.kubectl(
        "apply", "-f", "-", namespace=namespace, input=json.dumps(doc), check=False
    )
    assert refused.returncode != 0
    assert says in refused.stderr


QUOTA = {
    "apiVersion": "v1",
    "kind": "ResourceQuota",
    "metadata": {"name": "compute"},
    "spec": {
        "hard": {
            "requests.cpu": "8",
            "requests.memory": "16Gi",
            "limits.cpu": "8",
            "limits.memory": "16Gi",
        }
    },
}
RESTRICTED = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
GUARANTEED = {"limits": {"cpu": "1", "memory": "1Gi"}}


@pytest.mark.parametrize(
    ("setup", "refusal", "fix"),
    [
        ("quota", "must specify limits.cpu for: model", {"resources": GUARANTEED}),
        ("restricted", 'violates PodSecurity "restricted', {"securityContext": RESTRICTED}),
    ],
    ids=["ResourceQuota", "Pod Security restricted"],
)
def test_pods_the_namespace_refuses_are_named_and_admitted_once_the_fields_are_set(
    cluster: Cluster,
    namespace: str,
    start_operator: StartOperator,
    setup: str,
    refusal: str,
    fix: dict[str, Any],
) -> None:
    """The ReplicaSet's FailedCreate reaches the version's Ready condition (PodsRefused) and a
    Warning; the sidecar the operator injects passes both (it has resources, and runs as
    "restricted" asks), so the model container's fields are all a version needs."""
    if setup == "quota":
        cluster.apply(QUOTA, namespace)
    else:
        cluster.kubectl(
            "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted"
        )
    start_operator()
    cluster.apply(model_version("solo-v1", "solo", weight=1, server=SERVER), namespace)
    refused = ready_because(cluster, namespace, "PodsRefused")
    assert refused["status"] == "False"
    assert refusal in refused["message"]
    assert "sidecar" not in refused["message"]  # the model container, never the one injected
    eventually(lambda: "PodsRefused" in warning_reasons(cluster, namespace, "solo-v1"), "a Warning")
    assert not cluster.kubectl_json("get", "pods", namespace=namespace)["items"]

    fixed = {**SERVER, **fix}
    cluster.apply(model_version("solo-v1", "solo", weight=1, server=fixed), namespace)
    pods = eventually(
        lambda: cluster.kubectl_json("get", "pods", namespace=namespace)["items"],
        "the pod admitted",
        60,
    )
    (pod,) = pods
    if setup == "quota":
        assert pod["status"]["qosClass"] == "Guaranteed"  # the sidecar's requests raised too
    # Until the new pod is ready the old ReplicaSet keeps trying (and failing) to create its
    # own; once the new one serves, the rollout ends and so does the refusal.
    mark_pods_ready(cluster, namespace, "modelroll.io/version=solo-v1")
    eventually(
        lambda: (
            (r := ready(cluster, namespace, "solo-v1")).get("reason") == "ReplicasReady"
            and "cannot create pods" not in r["message"]
        ),
        "solo-v1 Ready, no longer refused",
        60,
    )
