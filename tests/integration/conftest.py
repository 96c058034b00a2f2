"""pytest fixtures for the integration tests (the operator's helpers are in
tests/support/apiserver.py).

- ``crd`` (session): the ModelVersion CRD from crds/ applied and Established;
- ``gateway_api`` (session): the Gateway API CRDs (``make traefik-bins``) applied and Established;
- ``keda_crds`` (session): KEDA's CRDs (``make keda-bins``) applied and Established, no KEDA
  running (for what the operator writes);
- ``autoscaling`` (session): KEDA's operator and metrics adapter (``make keda-bins``) serving
  ScaledObjects and the external metrics API, a real Prometheus (``make prometheus``) and a
  series the test sets (``tests.support.autoscaling``);
- ``garbage_collector`` (session): waits until kube-controller-manager collects the children
  of deleted ModelVersions (up to ~30 s after the CRD is new; only tests that rely on it);
- ``routes`` (function): the test namespace's routes ConfigMap (``testing.Routes``);
- ``start_operator`` (function): ``start_operator(*flags)`` starts ``modelroll-operator`` as a
  real process serving the test's namespace and waits for its liveness endpoint. At teardown the
  operators stop and our finalizer is taken off the ModelVersions left, so that it never holds
  the namespace's deletion.

They build on the ``cluster`` and ``namespace`` fixtures of modelroll_devcluster and on the
``spawn`` fixture of the repository's tests/conftest.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from modelroll_devcluster.keda import install_keda_crds
from modelroll_devcluster.processes import ClusterError, free_port
from modelroll_devcluster.traefik import install_gateway_api_crds
from tests.support.apiserver import (
    OperatorProcess,
    Routes,
    StartOperator,
    apply_crd,
    wait_for_garbage_collection,
)
from tests.support.autoscaling import Autoscaling, running_autoscaling

if TYPE_CHECKING:
    from modelroll_devcluster import Cluster
    from tests.support.processes import Proc


@pytest.fixture(scope="session")
def crd(cluster: Cluster) -> None:
    apply_crd(cluster)


@pytest.fixture(scope="session")
def gateway_api(cluster: Cluster) -> None:
    install_gateway_api_crds(cluster)


@pytest.fixture(scope="session")
def keda_crds(cluster: Cluster) -> None:
    install_keda_crds(cluster)


@pytest.fixture(scope="session")
def autoscaling(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Autoscaling]:
    try:
        with running_autoscaling(cluster, tmp_path_factory.mktemp("autoscaling")) as running:
            yield running
    except ClusterError as err:  # a missing build fails the tests that use it, naming the fix
        pytest.fail(str(err), pytrace=False)


@pytest.fixture(scope="session")
def garbage_collector(cluster: Cluster, crd: None) -> None:
    wait_for_garbage_collection(cluster)


@pytest.fixture
def routes(cluster: Cluster, namespace: str) -> Routes:
    return Routes(cluster, namespace)


@pytest.fixture
def start_operator(
    spawn: Callable[..., Proc], cluster: Cluster, namespace: str, crd: None
) -> Iterator[StartOperator]:
    """``start_operator(*flags)``: a new operator process for the test's namespace."""
    started: list[OperatorProcess] = []

    def start(*flags: str) -> OperatorProcess:
        liveness = f"http://127.0.0.1:{free_port()}/healthz"
        proc = spawn(
            "modelroll-operator",
            f"--namespace={namespace}",
            f"--kubeconfig={cluster.kubeconfig}",
            f"--liveness={liveness}",
            "--metrics-port=0",  # several operators may run at once on this machine
            "--sidecar-image=registry.local/modelroll-sidecar:test",
            *flags,
            ready=liveness,
        )
        started.append(OperatorProcess(proc, liveness))
        return started[-1]

    yield start
    # Stop the operators, then take our finalizer off what is left, so that the namespace goes
    # at once (deletion through a running operator is tested on its own, and can wait out a
    # retry's backoff).
    for operator in started:
        operator.proc.stop()
    held = _held_versions(cluster, namespace)
    if held:  # one request for all of them: a test may leave hundreds
        cluster.kubectl(
            "replace",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": held}),
            namespace=namespace,
            check=False,
        )
    # A version changed since it was read (an HPA still scaling it) refused the replace: patch
    # its finalizer off on its own, which needs no resourceVersion.
    for version in _held_versions(cluster, namespace):
        cluster.kubectl(
            "patch",
            "modelversion",
            version["metadata"]["name"],
            "--type=merge",
            "-p",
            json.dumps({"metadata": {"finalizers": None}}),
            namespace=namespace,
            check=False,  # gone meanwhile
        )


def _held_versions(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    """The namespace's ModelVersions that carry a finalizer, with their finalizers taken out."""
    left = cluster.kubectl_json("get", "modelversions", namespace=namespace)["items"]
    return [mv for mv in left if mv["metadata"].pop("finalizers", None)]
