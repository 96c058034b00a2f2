"""The chart and managed ModelVersions on a cluster whose pods really run.

By default that cluster is the local node (``node_cluster``: control plane, containerd, kubelet,
kube-proxy, CNI, CoreDNS, images from ``make images``): the fixture below installs the chart
with helm, and runs a real Prometheus on the host that discovers the sidecar pods through the
Kubernetes API with the chart's own PodMonitor selector. With ``MODELROLL_KUBECONFIG`` set
(``make e2e-kind``), hack/kind/e2e.sh has installed the chart and kube-prometheus-stack already
and names them through the environment (see tests/support/incluster.py): the same scenario runs.
``traefik_gateway`` adds a Gateway API data plane on the local node (Traefik on the host) for
tests that route through HTTPRoutes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from modelroll_devcluster import Cluster, ClusterError, namespace_name
from modelroll_devcluster.node import POD_CIDR
from modelroll_devcluster.prometheus import Prometheus, pod_monitor_job
from modelroll_devcluster.traefik import (
    Traefik,
    TraefikGateway,
    create_gateway,
    install_gateway_api_crds,
)
from tests.support.chart import CHART, Helm, helm
from tests.support.incluster import InCluster

__all__ = ["helm"]

NAMESPACE = "modelroll"
RELEASE = "modelroll"
INSTALL_TIMEOUT_S = 110  # within Helm.run's own 120 s


#: What the local node needs on top of the chart's defaults: nothing can be pulled, so the images
#: `make images` imported are used as they are; and the tests, on the host, pin versions through
#: the gateway's Service, whose connections from the host kube-proxy masquerades to the host's
#: address on the pod network (the CNI bridge's): the gateway trusts that network to pin. (They
#: read GET /v1/routes on its admin Service, which the node's CNI lets the host reach: it does
#: not enforce NetworkPolicy.) The operator also routes models that an HTTPRoute claims
#: (test_httproute_on_node.py).
NODE_VALUES = (
    "operator.image.pullPolicy=Never",
    "gateway.image.pullPolicy=Never",
    f"gateway.trustedNetworks={{{POD_CIDR}}}",
    "operator.gatewayAPI=true",
)


def set_flags(*values: str) -> list[str]:
    return [arg for value in values for arg in ("--set", value)]


def rendered_pod_monitor(helm: Helm) -> dict[str, Any]:
    """The PodMonitor the chart renders for this release (the Prometheus Operator's CRDs are not
    installed on the node, so it is applied to real pods through Prometheus's own discovery)."""
    out = helm.run(
        "template",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        *set_flags(*NODE_VALUES, "monitoring.podMonitor.enabled=true"),
    )
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    (monitor,) = [d for d in docs if d["kind"] == "PodMonitor"]
    assert isinstance(monitor, dict)
    return monitor


def install_chart(cluster: Cluster, helm: Helm) -> float:
    """``helm install --wait`` with the locally built images; seconds it took."""
    started = time.monotonic()
    helm.run(
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--create-namespace",
        "--kubeconfig",
        str(cluster.kubeconfig),
        "--wait",
        f"--timeout={INSTALL_TIMEOUT_S}s",
        # Monitoring stays off: the PodMonitor's CRD is not on the node, and the Prometheus
        # the fixture runs applies the PodMonitor's selector itself.
        *set_flags(*NODE_VALUES),
    )
    return time.monotonic() - started


@pytest.fixture(scope="session")
def on_cluster(
    node_cluster: Cluster, helm: Helm, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InCluster]:
    """The chart installed on the cluster, its gateway's Service and a Prometheus that scrapes
    the sidecar pods, as the scenario's :class:`InCluster`."""
    if not node_cluster.is_local:
        yield InCluster.from_env(node_cluster)
        return
    # The operator routes models by HTTPRoutes too (operator.gatewayAPI), so the Gateway API
    # CRDs are there before it starts.
    install_gateway_api_crds(node_cluster)
    installed = install_chart(node_cluster, helm)
    gateway = node_cluster.kubectl_json("get", "service", f"{RELEASE}-gateway", namespace=NAMESPACE)
    port = gateway["spec"]["ports"][0]["port"]
    admin = node_cluster.kubectl_json(
        "get", "service", f"{RELEASE}-gateway-admin", namespace=NAMESPACE
    )
    job = pod_monitor_job(rendered_pod_monitor(helm), node_cluster.kubeconfig)
    prometheus = Prometheus(tmp_path_factory.mktemp("prometheus"), [job])
    prometheus.start()
    incluster = InCluster(
        node_cluster,
        namespace=NAMESPACE,
        release=RELEASE,
        # Through the Service's cluster IP, which kube-proxy serves on the node's host too.
        gateway_url=f"http://{gateway['spec']['clusterIP']}:{port}",
        gateway_admin_url=f"http://{admin['spec']['clusterIP']}:{admin['spec']['ports'][0]['port']}",
        prometheus_url=prometheus.url,
        settle_s=120.0,
    )
    incluster.install_seconds = installed
    try:
        yield incluster
    finally:
        prometheus.stop()


@pytest.fixture(scope="session")
def sidecar_scrape_job(node_cluster: Cluster, helm: Helm) -> dict[str, Any]:
    """A Prometheus scrape job that finds the sidecars of the local node as the chart's
    PodMonitor selects them, for a Prometheus of a test's own."""
    return pod_monitor_job(rendered_pod_monitor(helm), node_cluster.kubeconfig)


@pytest.fixture
def story(on_cluster: InCluster, request: pytest.FixtureRequest) -> Iterator[InCluster]:
    """The installed chart for one test; afterwards its versions are deleted (and, after a
    failure, the components' logs are shown)."""
    yield on_cluster
    if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
        print(f"--- component logs ---\n{on_cluster.log_tails()}")
    on_cluster.cleanup()


@pytest.fixture(scope="session")
def traefik_gateway(
    node_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TraefikGateway]:
    """Traefik as the node's Gateway API data plane: the Gateway API CRDs installed, Traefik
    running on the host (``make traefik-bins``), and a Gateway in a namespace of its own that
    Traefik has programmed and that takes HTTPRoutes from every namespace. Skipped on a cluster
    given by MODELROLL_KUBECONFIG: Traefik on the host reaches backends at their pod IPs."""
    if not node_cluster.is_local:
        pytest.skip("Traefik runs on the host and needs the pod IPs of the local node")
    run_dir = tmp_path_factory.mktemp("traefik")
    traefik = Traefik(node_cluster, run_dir)
    namespace = namespace_name("gateway")
    try:
        install_gateway_api_crds(node_cluster)
        node_cluster.create_namespace(namespace)
        traefik.start()
        gateway = create_gateway(node_cluster, traefik, namespace)
    except ClusterError as err:
        traefik.stop()
        pytest.fail(str(err), pytrace=False)
    try:
        yield gateway
    finally:
        traefik.stop()
        node_cluster.kubectl("delete", "namespace", namespace, "--wait=false", "--ignore-not-found")


@pytest.fixture
def node_namespace(node_cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace on the node's cluster for one test, deleted after it."""
    name = node_cluster.create_namespace(namespace_name(request.node.name))
    yield name
    node_cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


LIFECYCLE = "test_node_lifecycle.py"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """test_node_lifecycle.py brings nodes of its own up and down, and checks that the host is
    clean before and after: it runs before anything starts the session's ``node_cluster`` (two
    nodes cannot share one host), whatever the other files are called. The rest share the one
    installed chart in any order."""
    items.sort(key=lambda item: item.path.name != LIFECYCLE)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
    return report
