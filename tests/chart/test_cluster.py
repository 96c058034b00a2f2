"""The chart against a real API server (hack/devcluster): what it renders is accepted as it is,
`helm install` works, and the service accounts may do what the components need and no more.

The PodMonitor, ServiceMonitor and PrometheusRule CRDs come from the prometheus-operator Go module
(`make monitoring-crds`); the ModelVersion CRD from crds/.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
import yaml

from modelroll_devcluster import Cluster
from tests.chart.conftest import (
    CHART,
    EXAMPLES,
    FULL_VALUES,
    MONITORING_CRD_FILES,
    MONITORING_CRDS,
    REPO,
    Helm,
    by_kind,
)

pytestmark = pytest.mark.integration

MONITORING_ON = (
    "--set",
    "monitoring.podMonitor.enabled=true,monitoring.serviceMonitor.enabled=true,"
    "monitoring.prometheusRule.enabled=true,monitoring.dashboard.enabled=true",
)


@pytest.fixture(scope="session")
def crds(cluster: Cluster) -> Cluster:
    """The cluster, with the chart's CRDs and the three prometheus-operator CRDs established."""
    files = [MONITORING_CRDS / name for name in MONITORING_CRD_FILES]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} missing from {MONITORING_CRDS}: run `make monitoring-crds`",
            pytrace=False,
        )
    files += sorted((CHART / "crds").glob("*.yaml"))
    args = ["apply", "--server-side", "--force-conflicts"]
    for path in files:
        args += ["-f", str(path)]
    cluster.kubectl(*args)
    names = [d["metadata"]["name"] for f in files for d in yaml.safe_load_all(f.read_text())]
    cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", *[f"crd/{n}" for n in names]
    )
    return cluster


def helm_env(cluster: Cluster) -> dict[str, str]:
    return {"KUBECONFIG": str(cluster.kubeconfig)}


def install(helm: Helm, cluster: Cluster, release: str, namespace: str, *args: str) -> str:
    """`helm install` the chart into the cluster; its output (with the NOTES)."""
    chart = str(REPO / "charts" / "modelroll")
    result = helm.run(
        "install", release, chart, "--namespace", namespace, *args, env=helm_env(cluster)
    )
    return result.stdout


@pytest.mark.parametrize("values", ["default", "full"])
def test_everything_rendered_passes_a_server_side_dry_run(
    helm: Helm, crds: Cluster, namespace: str, values: str
) -> None:
    """The API server (with the real CRD schemas) accepts every object the chart renders."""
    if values == "default":
        docs = helm.template("--include-crds", *MONITORING_ON, namespace=namespace)
    else:
        # The full values name two namespaces that the test cluster does not have.
        docs = helm.template(
            "--include-crds",
            "--set",
            f"operator.watchNamespaces={{{namespace}}}",
            "--set",
            f"monitoring.podMonitor.namespaceSelector.matchNames={{{namespace}}}",
            values=[FULL_VALUES],
            namespace=namespace,
        )
    for kind in ("PodMonitor", "ServiceMonitor", "PrometheusRule", "CustomResourceDefinition"):
        assert by_kind(docs, kind), kind
    result = crds.kubectl(
        "apply",
        "--dry-run=server",
        "-f",
        "-",
        namespace=namespace,
        input=yaml.safe_dump_all(docs),
    )
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == len(docs), result.stdout
    assert all("(server dry run)" in line for line in lines), result.stdout


def test_the_examples_are_valid_model_versions(crds: Cluster, namespace: str) -> None:
    for mode in ("managed", "external"):
        result = crds.kubectl(
            "apply", "--dry-run=server", "-f", str(EXAMPLES / mode), namespace=namespace
        )
        assert sorted(result.stdout.split("\n"))[-2:] == [
            "modelversion.modelroll.io/sentiment-canary created (server dry run)",
            "modelversion.modelroll.io/sentiment-stable created (server dry run)",
        ], result.stdout


def can_i(cluster: Cluster, account: str, namespace: str, verb: str, *what: str) -> bool:
    """`kubectl auth can-i` in `namespace` as `account` ("<its namespace>:<name>")."""
    result = cluster.kubectl(
        "auth",
        "can-i",
        verb,
        *what,
        f"--as=system:serviceaccount:{account}",
        namespace=namespace,
        check=False,
    )
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), result.stderr
    return answer == "yes"


@pytest.fixture
def release(helm: Helm, crds: Cluster, namespace: str) -> Iterator[str]:
    """A release name unique to the test; whatever was installed under it is uninstalled."""
    name = f"mr-{secrets.token_hex(3)}"
    yield name
    helm.run("uninstall", name, "--namespace", namespace, "--wait", "--timeout=60s",
             "--ignore-not-found", env=helm_env(crds))  # fmt: skip


def test_helm_install_creates_the_release_and_prints_the_next_commands(
    helm: Helm, crds: Cluster, namespace: str, release: str
) -> None:
    output = install(helm, crds, release, namespace, *MONITORING_ON)
    assert "STATUS: deployed" in output
    fullname = f"{release}-modelroll"
    assert f"port-forward service/{fullname}-gateway 8080:8080" in output
    assert f"rollout status deployment/{fullname}-operator" in output
    for kind, name in (
        ("deployment", f"{fullname}-operator"),
        ("deployment", f"{fullname}-gateway"),
        ("service", f"{fullname}-gateway"),
        ("podmonitor", f"{fullname}-sidecars"),
        ("servicemonitor", f"{fullname}-gateway"),
        ("prometheusrule", fullname),
        ("configmap", f"{fullname}-dashboard"),
    ):
        assert crds.exists(kind, name, namespace=namespace), f"{kind}/{name} was not created"
    helm.run("uninstall", release, "--namespace", namespace, "--wait", env=helm_env(crds))
    assert not crds.exists("clusterrole", f"{fullname}-operator")


def test_the_gateway_may_read_its_routes_configmap_and_nothing_else(
    helm: Helm, crds: Cluster, namespace: str, release: str
) -> None:
    install(helm, crds, release, namespace)
    account = f"{namespace}:{release}-modelroll-gateway"
    for verb in ("get", "list", "watch"):
        assert can_i(crds, account, namespace, verb, "configmaps/modelroll-routes"), verb
    for verb, what in (
        ("get", "configmaps/other"),
        ("create", "configmaps"),
        ("patch", "configmaps/modelroll-routes"),
        ("get", "secrets"),
        ("list", "pods"),
        ("list", "modelversions.modelroll.io"),
    ):
        assert not can_i(crds, account, namespace, verb, what), f"gateway may {verb} {what}"


def test_the_operator_may_do_what_it_needs_and_no_more(
    helm: Helm, crds: Cluster, namespace: str, release: str
) -> None:
    install(helm, crds, release, namespace)
    account = f"{namespace}:{release}-modelroll-operator"
    allowed = [
        ("watch", "modelversions.modelroll.io"),
        ("patch", "modelversions.modelroll.io"),
        ("patch", "modelversions.modelroll.io", "--subresource=status"),
        ("create", "configmaps"),
        ("patch", "configmaps/modelroll-routes"),
        ("create", "deployments.apps"),
        ("delete", "deployments.apps"),
        ("create", "services"),
        ("create", "events"),
        ("watch", "customresourcedefinitions.apiextensions.k8s.io"),
        ("list", "namespaces"),
    ]
    for verb, *what in allowed:
        assert can_i(crds, account, namespace, verb, *what), f"operator may not {verb} {what}"
    # Every namespace, since watchNamespaces is empty by default.
    assert can_i(crds, account, "default", "patch", "modelversions.modelroll.io")
    denied = [
        ("delete", "configmaps"),
        ("delete", "modelversions.modelroll.io"),
        ("update", "modelversions.modelroll.io"),
        ("create", "modelversions.modelroll.io"),
        ("get", "secrets"),
        ("create", "pods"),
        ("list", "nodes"),
        ("create", "clusterroles.rbac.authorization.k8s.io"),
        ("delete", "namespaces"),
        ("create", "customresourcedefinitions.apiextensions.k8s.io"),
    ]
    for verb, *what in denied:
        assert not can_i(crds, account, namespace, verb, *what), f"operator may {verb} {what}"


def test_an_operator_limited_to_namespaces_gets_roles_only_there(
    helm: Helm, crds: Cluster, namespace: str, release: str
) -> None:
    install(helm, crds, release, namespace, "--set", f"operator.watchNamespaces={{{namespace}}}")
    account = f"{namespace}:{release}-modelroll-operator"
    assert can_i(crds, account, namespace, "patch", "modelversions.modelroll.io")
    assert can_i(crds, account, namespace, "create", "deployments.apps")
    assert not can_i(crds, account, "default", "patch", "modelversions.modelroll.io")
    assert not can_i(crds, account, "default", "create", "deployments.apps")
