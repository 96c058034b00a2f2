"""The operator as a real process against a real API server: routes, statuses, events.

Every test starts `modelroll-operator` serving only its own namespace and drives it with
kubectl, the way a person would. Versions here are in external mode (spec.endpoint): they are
Ready as soon as they exist, so these tests are about routing; managed workloads are in
test_operator_managed.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from modelroll_common.routes import CONFIGMAP_NAME
from modelroll_devcluster import Cluster
from tests.support.apiserver import Routes, StartOperator, conditions, eventually, model_version
from tests.support.credentials import cluster_admin, credential_plugin, exec_kubeconfig

pytestmark = pytest.mark.integration


def apply(cluster: Cluster, namespace: str, *manifests: dict[str, Any]) -> None:
    for manifest in manifests:
        cluster.apply(manifest, namespace=namespace)


def external(name: str, model: str, weight: int) -> dict[str, Any]:
    return model_version(name, model, weight=weight, endpoint=f"http://{name}.example:8000")


def mv(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    doc: dict[str, Any] = cluster.kubectl_json("get", "mv", name, namespace=namespace)
    return doc


def settled(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    """The version's body once its status describes its current generation."""
    body = mv(cluster, namespace, name)
    status = body.get("status") or {}
    return body if status.get("observedGeneration") == body["metadata"]["generation"] else None


def events(cluster: Cluster, namespace: str, name: str) -> list[tuple[str, str]]:
    doc = cluster.kubectl_json(
        "get", "events", f"--field-selector=involvedObject.name={name}", namespace=namespace
    )
    items = sorted(doc["items"], key=lambda e: e.get("eventTime") or e["metadata"]["name"])
    return [(e["reason"], e["message"]) for e in items if e["source"]["component"] != "kopf"]


def test_ready_versions_are_routed_by_weight_with_conditions_and_events(
    cluster: Cluster, namespace: str, start_operator: StartOperator, routes: Routes
) -> None:
    operator = start_operator()
    apply(
        cluster,
        namespace,
        external("stable-v1", "sentiment", 9),
        external("canary-v2", "sentiment", 1),
    )
    eventually(lambda: routes.weights("sentiment") == {"canary-v2": 1, "stable-v1": 9}, "routing")
    assert routes.endpoints("sentiment")["canary-v2"] == "http://canary-v2.example:8000"

    stable = eventually(lambda: settled(cluster, namespace, "stable-v1"), "stable-v1's status")
    status = stable["status"]
    assert status["routedWeight"] == 9
    assert status["endpoint"] == "http://stable-v1.example:8000"
    ready, routed = conditions(stable)["Ready"], conditions(stable)["Routed"]
    assert (ready["status"], ready["reason"]) == ("True", "ExternalEndpoint")
    assert (routed["status"], routed["reason"]) == ("True", "Routed")
    assert routed["message"] == "In the routes of model sentiment with weight 9"
    assert routed["observedGeneration"] == stable["metadata"]["generation"]

    row = cluster.kubectl("get", "mv", "stable-v1", "--no-headers", namespace=namespace).stdout
    assert row.split()[:5] == ["stable-v1", "sentiment", "9", "True", "Routed"]

    eventually(
        lambda: (
            (
                "Routed",
                "Now routed: 10.0% of model sentiment's traffic (weight 1 of 10) "
                "to http://canary-v2.example:8000",
            )
            in events(cluster, namespace, "canary-v2")
        ),
        "an event saying canary-v2 is routed",
    )

    # Weight 0: deployed but dark. The version stays listed (a request can pin it).
    cluster.kubectl(
        "patch",
        "mv",
        "canary-v2",
        "--type=merge",
        "-p",
        '{"spec":{"weight":0}}',
        namespace=namespace,
    )
    eventually(lambda: routes.weights("sentiment") == {"canary-v2": 0, "stable-v1": 9}, "dark")
    canary = eventually(lambda: settled(cluster, namespace, "canary-v2"), "canary-v2's status")
    assert canary["status"]["routedWeight"] == 0
    assert conditions(canary)["Routed"]["reason"] == "WeightZero"
    assert conditions(canary)["Ready"]["status"] == "True"
    eventually(
        lambda: (
            (
                "Routed",
                "Routing changed: 10.0% -> 0.0% of model sentiment's traffic (weight 0 of 9)",
            )
            in events(cluster, namespace, "canary-v2")
        ),
        "an event saying canary-v2's weight went to 0",
    )
    # stable-v1's share moved only because canary-v2 changed: no event of its own.
    assert not any(
        m.startswith("Routing changed") for _, m in events(cluster, namespace, "stable-v1")
    )

    # Sticky cohorts: the header a version names goes into its model's route.
    patch = '{"spec":{"cohortHeader":"X-User-Id"}}'
    cluster.kubectl("patch", "mv", "stable-v1", "--type=merge", "-p", patch, namespace=namespace)

    def cohort_header() -> object:
        return json.loads(routes.data()["sentiment"]).get("cohortHeader")

    eventually(lambda: cohort_header() == "X-User-Id", "the cohort header in the route")

    # Shadow traffic: the percentage a version asks for goes into its entry.
    patch = '{"spec":{"shadow":{"percent":10}}}'
    cluster.kubectl("patch", "mv", "canary-v2", "--type=merge", "-p", patch, namespace=namespace)

    def shadows() -> dict[str, int]:
        versions = json.loads(routes.data()["sentiment"])["versions"]
        return {v["name"]: v["shadow"] for v in versions if "shadow" in v}

    eventually(lambda: shadows() == {"canary-v2": 10}, "the shadow percentage in the route")
    assert operator.errors() == []


def test_deleting_versions_edits_only_their_models_key_and_keys_without_versions_go(
    cluster: Cluster, namespace: str, start_operator: StartOperator, routes: Routes
) -> None:
    """The operator owns every key: one for a model without ModelVersions ("legacy") goes."""
    foreign = json.dumps({"model": "legacy", "versions": []})
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CONFIGMAP_NAME},
            "data": {"legacy": foreign},
        },
        namespace=namespace,
    )
    start_operator()
    apply(
        cluster,
        namespace,
        external("a", "sentiment", 1),
        external("b", "sentiment", 3),
        external("t1", "translate", 2),
    )
    eventually(lambda: routes.weights("sentiment") == {"a": 1, "b": 3}, "sentiment routed")
    eventually(lambda: routes.weights("translate") == {"t1": 2}, "translate routed")
    eventually(lambda: "legacy" not in routes.data(), "the key of a model without versions gone")
    translate = routes.data()["translate"]

    cluster.kubectl("delete", "mv", "a", namespace=namespace)  # waits for our finalizer
    assert routes.weights("sentiment") == {"b": 3}  # out of the route before it is gone
    b = eventually(lambda: settled(cluster, namespace, "b"), "b's status")
    assert b["status"]["routedWeight"] == 3
    assert b["metadata"]["finalizers"] == ["modelroll.io/finalizer"]

    cluster.kubectl("delete", "mv", "b", namespace=namespace)
    assert "sentiment" not in routes.data()  # the last version took the key with it
    assert routes.data() == {"translate": translate}


def test_the_routes_configmap_is_created_when_missing_and_restored_when_deleted_or_edited(
    cluster: Cluster, namespace: str, start_operator: StartOperator, routes: Routes
) -> None:
    start_operator()
    assert routes.configmap() is None
    apply(cluster, namespace, external("stable-v1", "sentiment", 9))
    eventually(lambda: routes.weights("sentiment") == {"stable-v1": 9}, "the ConfigMap created")
    labels = (routes.configmap() or {})["metadata"]["labels"]
    assert labels["app.kubernetes.io/managed-by"] == "modelroll-operator"
    # The shared ConfigMap belongs to no version: deleting one must never collect it.
    assert "ownerReferences" not in (routes.configmap() or {})["metadata"]
    written = routes.data()

    cluster.kubectl("delete", "configmap", CONFIGMAP_NAME, namespace=namespace)
    eventually(lambda: routes.data() == written, "the ConfigMap re-created")

    broken = json.dumps({"data": {"sentiment": "not json"}})
    cluster.kubectl(
        "patch", "configmap", CONFIGMAP_NAME, "--type=merge", "-p", broken, namespace=namespace
    )
    eventually(lambda: routes.data() == written, "the hand-edited entry rewritten")


def test_the_operator_logs_in_through_an_exec_credential_plugin(
    cluster: Cluster, namespace: str, start_operator: StartOperator, routes: Routes, tmp_path: Path
) -> None:
    """kopf's login and the operator's own calls both take the token an exec plugin prints (as
    on EKS, GKE or AKS): here a ServiceAccount's, bound to cluster-admin for the test."""
    with cluster_admin(cluster, namespace) as account:
        token = cluster.kubectl("create", "token", account, namespace=namespace).stdout.strip()
        plugin = credential_plugin(tmp_path / "get-token", token)
        kubeconfig = exec_kubeconfig(cluster, tmp_path / "exec.kubeconfig", plugin)
        operator = start_operator(f"--kubeconfig={kubeconfig}")
        apply(cluster, namespace, external("stable-v1", "sentiment", 3))
        eventually(lambda: routes.weights("sentiment") == {"stable-v1": 3}, "routing")
        eventually(lambda: settled(cluster, namespace, "stable-v1"), "status written")
        assert operator.logged("Initial authentication has finished")
        assert not operator.errors(), operator.errors()
