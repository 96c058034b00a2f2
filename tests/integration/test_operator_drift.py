"""What the operator owns converges back after hand changes: a managed Deployment's image and
replica count, a Service's selector, and keys of the routes ConfigMap for models that have no
ModelVersions; while it runs, and when it starts after the change."""

from __future__ import annotations

import json

import pytest

from modelroll_devcluster import Cluster
from tests.support.apiserver import (
    Routes,
    StartOperator,
    containers,
    eventually,
    get,
    maybe,
    model_version,
)
from tests.support.specs import SERVER

pytestmark = pytest.mark.integration

SELECTOR = {"modelroll.io/model": "sentiment", "modelroll.io/version": "canary-v2"}


def image(cluster: Cluster, namespace: str) -> str:
    image: str = containers(get(cluster, namespace, "deploy", "canary-v2"))["model"]["image"]
    return image


def replicas(cluster: Cluster, namespace: str) -> int:
    return int(get(cluster, namespace, "deploy", "canary-v2")["spec"]["replicas"])


def selector(cluster: Cluster, namespace: str) -> dict[str, str]:
    return dict(get(cluster, namespace, "svc", "canary-v2")["spec"]["selector"])


def change_by_hand(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl(
        "set", "image", "deploy/canary-v2", "model=evil.example/miner:1", namespace=namespace
    )
    cluster.kubectl("scale", "deploy/canary-v2", "--replicas=3", namespace=namespace)
    cluster.kubectl(
        "patch",
        "svc",
        "canary-v2",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"selector": {"modelroll.io/version": "nothing"}}}),
        namespace=namespace,
    )


def converged(cluster: Cluster, namespace: str) -> bool:
    return (
        image(cluster, namespace) == SERVER["image"]
        and replicas(cluster, namespace) == 1
        and selector(cluster, namespace) == SELECTOR
    )


def test_hand_changes_to_managed_objects_are_undone_while_running_and_on_restart(
    cluster: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    operator = start_operator()
    cluster.apply(model_version("canary-v2", "sentiment", weight=1, server=SERVER), namespace)
    eventually(lambda: maybe(cluster, namespace, "svc", "canary-v2"), "the Service")
    eventually(lambda: maybe(cluster, namespace, "deploy", "canary-v2"), "the Deployment")

    change_by_hand(cluster, namespace)
    eventually(lambda: converged(cluster, namespace), "the image, replicas and selector restored")
    assert operator.logged("Restored Deployment")
    assert operator.logged("Restored Service")

    operator.stop()
    change_by_hand(cluster, namespace)
    assert not converged(cluster, namespace)  # no operator runs: the changes stay
    start_operator()
    eventually(lambda: converged(cluster, namespace), "the same, after a restart")


def ghost_route(model: str) -> str:
    return json.dumps(
        {"model": model, "versions": [{"name": "gone", "weight": 1, "endpoint": "http://g:8000"}]}
    )


def add_key(cluster: Cluster, namespace: str, model: str) -> None:
    cluster.kubectl(
        "patch",
        "configmap",
        "modelroll-routes",
        "--type=merge",
        "-p",
        json.dumps({"data": {model: ghost_route(model)}}),
        namespace=namespace,
    )


def test_routes_of_models_without_versions_are_removed_while_running_and_on_restart(
    cluster: Cluster, namespace: str, start_operator: StartOperator, routes: Routes
) -> None:
    operator = start_operator()
    cluster.apply(model_version("v1", "kept", weight=1, endpoint="http://k:8000"), namespace)
    eventually(lambda: routes.weights("kept") == {"v1": 1}, "the kept model's route")

    add_key(cluster, namespace, "ghost")  # a model with no ModelVersions
    eventually(lambda: "ghost" not in routes.data(), "the ghost key removed")

    # The last version of a model goes while no operator runs (its finalizer removed by hand).
    cluster.apply(model_version("w1", "leaving", weight=1, endpoint="http://l:8000"), namespace)
    eventually(lambda: routes.weights("leaving") == {"w1": 1}, "the leaving model's route")
    operator.stop()
    cluster.kubectl(
        "patch",
        "mv",
        "w1",
        "--type=merge",
        "-p",
        '{"metadata":{"finalizers":null}}',
        namespace=namespace,
    )
    cluster.kubectl("delete", "mv", "w1", namespace=namespace)
    add_key(cluster, namespace, "ghost2")
    assert routes.weights("leaving") == {"w1": 1}

    start_operator()
    eventually(
        lambda: set(routes.data()) == {"kept"}, "only the model with versions left in the routes"
    )
