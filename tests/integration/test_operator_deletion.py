"""Deleting ModelVersions, and namespaces that hold them, always completes.

The operator holds every ModelVersion's deletion with our finalizer until the version is out of
its model's route. Here the deletion must still finish: when the namespace is deleted together
with the operator's Role in it (the chart's per-namespace RBAC), when the operator starts while
the namespace is already Terminating, and when the spec is too large to be copied into an
annotation.
"""

from __future__ import annotations

import json
import secrets
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from modelroll_devcluster import Cluster, namespace_name
from tests.support import chart
from tests.support.apiserver import (
    Routes,
    StartOperator,
    chart_operator_rbac,
    eventually,
    finalizer_holders,
    httproute,
    model_refs,
    model_version,
)
from tests.support.credentials import service_account_kubeconfig

pytestmark = pytest.mark.integration

helm = chart.helm
"""helm from .bin/ with its own home directories (the chart tests' fixture)."""

NAMESPACE_GONE_WITHIN = 90.0
"""The namespace controller retries a namespace that still holds finalized content every 15 s."""
ANNOTATIONS_LIMIT = 256 * 1024
"""Kubernetes refuses an object whose annotations take more than this many bytes in total."""
BIG_ARGS = [f"--shard-{i}={'x' * 70_000}" for i in range(4)]
assert len(json.dumps(BIG_ARGS)) > ANNOTATIONS_LIMIT

GrantChartRbac = Callable[..., Path]
"""``chart_rbac(watched, *values)``: values are more ``--set`` assignments."""


@pytest.fixture
def operator_namespace(cluster: Cluster) -> Iterator[str]:
    """Where the chart is installed (the operator's service account): not the watched namespace."""
    name = cluster.create_namespace(namespace_name("operator"))
    yield name
    cluster.delete_namespace(name)


@pytest.fixture
def chart_rbac(
    helm: chart.Helm, cluster: Cluster, operator_namespace: str, tmp_path: Path
) -> Iterator[GrantChartRbac]:
    """``chart_rbac(watched)``: the RBAC objects of the chart rendered with
    ``operator.watchNamespaces=[watched]`` applied as they are; returns a kubeconfig of the
    chart's operator service account."""
    release = f"mr-{secrets.token_hex(3)}"
    applied: list[dict[str, Any]] = []

    def grant(watched: str, *values: str) -> Path:
        sets = [arg for value in values for arg in ("--set", value)]
        docs = helm.template(
            "--set",
            f"operator.watchNamespaces={{{watched}}}",
            *sets,
            release=release,
            namespace=operator_namespace,
        )
        rbac = chart_operator_rbac(docs)
        assert {d["kind"] for d in rbac} == {
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "ClusterRole",
            "ClusterRoleBinding",
        }
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac))
        applied.extend(rbac)
        account = next(d for d in rbac if d["kind"] == "ServiceAccount")["metadata"]["name"]
        return service_account_kubeconfig(
            cluster, operator_namespace, account, tmp_path / "operator.kubeconfig"
        )

    yield grant
    for doc in applied:
        if doc["kind"].startswith("Cluster"):
            cluster.kubectl(
                "delete", doc["kind"].lower(), doc["metadata"]["name"], "--ignore-not-found"
            )


def external(name: str, model: str, weight: int) -> dict[str, Any]:
    return model_version(name, model, weight=weight, endpoint=f"http://{name}.example:8000")


def create_versions(cluster: Cluster, namespace: str) -> None:
    """Two models, one version of them managed (a Deployment and a Service of its own)."""
    for manifest in (
        external("a", "sentiment", 1),
        external("b", "sentiment", 3),
        external("t1", "translate", 2),
        model_version("m1", "sentiment", weight=1, server={"image": "acme/s:2"}),
    ):
        cluster.apply(manifest, namespace=namespace)


def wait_until_held(cluster: Cluster, namespace: str, routes: Routes) -> None:
    """Until the operator serves the versions: routed, and each held by our finalizer."""
    eventually(lambda: routes.weights("sentiment") == {"a": 1, "b": 3}, "sentiment routed")
    eventually(lambda: routes.weights("translate") == {"t1": 2}, "translate routed")
    eventually(lambda: cluster.exists("deploy", "m1", namespace=namespace), "m1's Deployment")
    eventually(
        lambda: len(finalizer_holders(cluster, namespace)) == 4, "our finalizer on each version"
    )


def namespace_gone(cluster: Cluster, namespace: str) -> None:
    def gone() -> bool:
        if cluster.exists("namespace", namespace):
            holders = finalizer_holders(cluster, namespace)
            raise AssertionError(f"still there; held by our finalizer on {holders}")
        return True

    eventually(gone, f"namespace {namespace} deleted", within=NAMESPACE_GONE_WITHIN)


def all_deleting(cluster: Cluster, namespace: str) -> bool:
    items = cluster.kubectl_json("get", "modelversions", namespace=namespace)["items"]
    return bool(items) and all(item["metadata"].get("deletionTimestamp") for item in items)


def no_rbac_left(cluster: Cluster, namespace: str) -> bool:
    names = cluster.kubectl("get", "roles,rolebindings", "-o", "name", namespace=namespace)
    return not names.stdout.strip()


def conditions(cluster: Cluster, kind: str, name: str) -> dict[str, str]:
    body = cluster.kubectl_json("get", kind, name)
    return {c["type"]: c["status"] for c in (body.get("status") or {}).get("conditions") or []}


def test_a_watched_namespace_is_deleted_although_the_operators_role_there_goes_first(
    cluster: Cluster,
    namespace: str,
    start_operator: StartOperator,
    routes: Routes,
    chart_rbac: GrantChartRbac,
) -> None:
    """The chart's per-namespace RBAC: the Role and RoleBinding live in the watched namespace
    and are deleted with it, in the same pass that marks its ModelVersions deleted. An operator
    busy elsewhere (here: stopped for that moment) handles their deletion only afterwards."""
    operator = start_operator(f"--kubeconfig={chart_rbac(namespace)}")
    create_versions(cluster, namespace)
    wait_until_held(cluster, namespace, routes)

    operator.proc.popen.send_signal(signal.SIGSTOP)
    try:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")
        eventually(lambda: all_deleting(cluster, namespace), "the versions marked deleted")
        eventually(lambda: no_rbac_left(cluster, namespace), "the Role and RoleBinding deleted")
    finally:
        operator.proc.popen.send_signal(signal.SIGCONT)
    namespace_gone(cluster, namespace)
    assert operator.running(), operator.proc.log()


@pytest.mark.parametrize("credentials", ["admin", "chart-rbac", "chart-rbac-gateway-api"])
def test_an_operator_started_while_its_namespace_is_terminating_finishes_the_deletion(
    cluster: Cluster,
    namespace: str,
    start_operator: StartOperator,
    routes: Routes,
    chart_rbac: GrantChartRbac,
    credentials: str,
    request: pytest.FixtureRequest,
) -> None:
    """The namespace was deleted while no operator ran: our finalizer holds it Terminating
    (and, with the chart's RBAC, the operator's Role there is gone) until one starts. With
    --gateway-api the operator lists HTTPRoutes before any handler runs, so the chart's
    cluster-wide rules must let it do that with the Role gone."""
    gateway_api = credentials == "chart-rbac-gateway-api"
    values = ("operator.gatewayAPI=true",) if gateway_api else ()
    flags = [] if credentials == "admin" else [f"--kubeconfig={chart_rbac(namespace, *values)}"]
    if gateway_api:
        request.getfixturevalue("gateway_api")
        flags.append("--gateway-api")
    first = start_operator(*flags)
    create_versions(cluster, namespace)
    wait_until_held(cluster, namespace, routes)
    if gateway_api:
        # The chart's rules let the operator write the route too (it reads it just before).
        cluster.apply(httproute("models"), namespace=namespace)
        eventually(lambda: routes.weights("sentiment") is None, "sentiment claimed by the route")
        backend = json.dumps({"spec": {"backendRef": {"name": "a", "port": 8000}}})
        cluster.kubectl("patch", "mv", "a", "--type=merge", "-p", backend, namespace=namespace)
        eventually(
            lambda: [r["name"] for r in model_refs(cluster, namespace)] == ["a"], "a in the route"
        )
    first.stop()

    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    eventually(
        lambda: (
            conditions(cluster, "namespace", namespace).get("NamespaceFinalizersRemaining")
            == "True"
        ),
        "the namespace held Terminating by our finalizer",
    )
    eventually(lambda: no_rbac_left(cluster, namespace), "the Role and RoleBinding deleted")
    assert len(finalizer_holders(cluster, namespace)) == 4

    second = start_operator(*flags)
    namespace_gone(cluster, namespace)
    assert second.running(), second.proc.log()


def test_a_version_whose_spec_exceeds_the_annotations_limit_can_be_deleted(
    cluster: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    operator = start_operator()
    big = model_version(
        "big", "sentiment", weight=1, server={"image": "acme/s:2", "args": BIG_ARGS}
    )
    # Not client-side `kubectl apply`: its own annotation would be as large as the spec.
    cluster.kubectl("create", "-f", "-", namespace=namespace, input=json.dumps(big))
    eventually(lambda: finalizer_holders(cluster, namespace) == ["modelversion/big"], "finalizer")
    eventually(lambda: cluster.exists("deploy", "big", namespace=namespace), "big's Deployment")

    cluster.kubectl("delete", "modelversion", "big", "--wait=false", namespace=namespace)
    eventually(lambda: not cluster.exists("modelversion", "big", namespace=namespace), "deleted")
    assert operator.errors() == []


def test_a_version_annotated_by_an_older_operator_can_grow_past_the_limit_and_be_deleted(
    cluster: Cluster, namespace: str, start_operator: StartOperator, tmp_path: Path
) -> None:
    """Operators before this one stored the whole spec in an annotation (kopf's diff base)."""
    old = model_version("old", "sentiment", weight=1, server={"image": "acme/s:2", "args": ["-v"]})
    spec = dict(old["spec"])
    old["metadata"]["finalizers"] = ["modelroll.io/finalizer"]
    old["metadata"]["annotations"] = {
        "modelroll.io/kopf-managed": "yes",
        "modelroll.io/last-handled-configuration": json.dumps({"spec": spec}) + "\n",
    }
    cluster.kubectl("create", "-f", "-", namespace=namespace, input=json.dumps(old))
    operator = start_operator()
    eventually(lambda: cluster.exists("deploy", "old", namespace=namespace), "old's Deployment")

    grow = tmp_path / "grow.json"
    grow.write_text(json.dumps({"spec": {"server": {"args": BIG_ARGS}}}))
    cluster.kubectl(
        "patch", "modelversion", "old", "--type=merge", f"--patch-file={grow}", namespace=namespace
    )
    eventually(
        lambda: (
            BIG_ARGS[0]
            in json.dumps(cluster.kubectl_json("get", "deploy", "old", namespace=namespace))
        ),
        "the Deployment running the new arguments",
    )

    cluster.kubectl("delete", "modelversion", "old", "--wait=false", namespace=namespace)
    eventually(lambda: not cluster.exists("modelversion", "old", namespace=namespace), "deleted")
    assert operator.errors() == []
