"""The chart against a real API server (devcluster/): what it renders is accepted as it is,
`helm install` works, and the service accounts may do what the components need and no more.

The PodMonitor, ServiceMonitor and PrometheusRule CRDs come from the prometheus-operator Go module
(`make monitoring-crds`); the ModelVersion CRD from crds/.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from modelroll_devcluster import Cluster
from tests.support.apiserver import model_version
from tests.support.autoscaling import in_flight_query, running_autoscaling
from tests.support.chart import (
    CHART,
    EXAMPLES,
    FULL_VALUES,
    MONITORING_CRD_FILES,
    MONITORING_CRDS,
    REPO,
    Helm,
    Manifest,
    by_kind,
    commented_manifest,
    one,
)
from tests.support.credentials import service_account_kubeconfig
from tests.support.processes import Proc, Spawn, free_port
from tests.support.rendering import KEDA_ON, MONITORING_ON

pytestmark = pytest.mark.integration


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
    cluster.wait_established(*names)
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
        docs = helm.template("--include-crds", values=[MONITORING_ON], namespace=namespace)
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


def test_keda_passes_a_server_side_dry_run(helm: Helm, crds: Cluster, namespace: str) -> None:
    """KEDA's objects too, applied server-side as Helm writes them: its ScaledJob CRD is too
    large for the annotation a client-side apply keeps."""
    docs = helm.template("--include-crds", values=[KEDA_ON], namespace=namespace)
    by_namespace: dict[str | None, list[Manifest]] = {}
    for doc in docs:
        by_namespace.setdefault(doc["metadata"].get("namespace"), []).append(doc)
    assert set(by_namespace) == {None, namespace, "kube-system"}
    for where, group in by_namespace.items():
        result = crds.kubectl(
            "apply",
            "--server-side",
            "--dry-run=server",
            "-f",
            "-",
            namespace=where or namespace,
            input=yaml.safe_dump_all(group),
        )
        lines = [line for line in result.stdout.splitlines() if line.strip()]
        assert len(lines) == len(group), result.stdout
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
    result = crds.kubectl(
        "apply", "--dry-run=server", "-f", str(EXAMPLES / "analysis"), namespace=namespace
    )
    assert result.stdout.strip() == (
        "modelversion.modelroll.io/sentiment-canary created (server dry run)"
    )
    result = crds.kubectl(
        "apply", "--dry-run=server", "-f", str(EXAMPLES / "llm"), namespace=namespace
    )
    assert sorted(result.stdout.split("\n"))[-2:] == [
        "modelversion.modelroll.io/chat-canary created (server dry run)",
        "modelversion.modelroll.io/chat-stable created (server dry run)",
    ], result.stdout
    # The vLLM version its comments show is valid too (the API server checks the CRD's schema).
    vllm = commented_manifest(EXAMPLES / "llm" / "chat-stable.yaml")
    result = crds.kubectl(
        "apply", "--dry-run=server", "-f", "-", namespace=namespace, input=yaml.safe_dump(vllm)
    )
    assert result.stdout.strip() == "modelversion.modelroll.io/chat-stable created (server dry run)"


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
    helm.run(
        "uninstall",
        name,
        "--namespace",
        namespace,
        "--wait",
        "--timeout=60s",
        "--ignore-not-found",
        env=helm_env(crds),
    )


def test_helm_install_creates_the_release_and_prints_the_next_commands(
    helm: Helm, crds: Cluster, namespace: str, release: str
) -> None:
    output = install(helm, crds, release, namespace, "--values", str(MONITORING_ON))
    assert "STATUS: deployed" in output
    fullname = f"{release}-modelroll"
    assert f"port-forward service/{fullname}-gateway 8080:8080" in output
    assert f"port-forward service/{fullname}-gateway-admin 9090:9090" in output
    assert "No client may pin a version with X-Modelroll-Version" in output
    assert f"rollout status deployment/{fullname}-operator" in output
    assert (
        f"NetworkPolicy/{fullname}-model-pods lets only the gateway, the scraper "
        f"(networkPolicy.scraper) reach the model pods in {namespace}, on the sidecar's port 8000"
    ) in output
    assert (
        f"NetworkPolicy/{fullname}-gateway lets only the scraper (networkPolicy.scraper) and "
        "the operator reach the gateway's admin port 9090."
    ) in output
    for kind, name in (
        ("deployment", f"{fullname}-operator"),
        ("deployment", f"{fullname}-gateway"),
        ("service", f"{fullname}-gateway"),
        ("service", f"{fullname}-gateway-admin"),
        ("networkpolicy", f"{fullname}-model-pods"),
        ("networkpolicy", f"{fullname}-gateway"),
        ("podmonitor", f"{fullname}-sidecars"),
        ("podmonitor", f"{fullname}-operator"),
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
        ("list", "pods"),  # canary analyses find the gateway pods
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
        ("get", "pods"),
        ("create", "pods/exec"),
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
    assert can_i(crds, account, namespace, "create", "configmaps")
    # Elsewhere, only what removing our finalizer from a namespace being deleted takes (its
    # Role may be deleted first): see Deleting in modelroll_operator/permissions.py.
    for verb, *what in (
        ("watch", "modelversions.modelroll.io"),
        ("patch", "modelversions.modelroll.io"),
        ("get", "configmaps/modelroll-routes"),
        ("patch", "configmaps/modelroll-routes"),
        ("list", "deployments.apps"),
        ("watch", "services"),
    ):
        assert can_i(crds, account, "default", verb, *what), f"operator may not {verb} {what}"
    for verb, *what in (
        ("create", "deployments.apps"),
        ("patch", "deployments.apps"),
        ("get", "deployments.apps"),
        ("delete", "services"),
        ("create", "configmaps"),
        ("get", "configmaps/other"),
        ("list", "configmaps"),
        ("patch", "modelversions.modelroll.io", "--subresource=status"),
        ("create", "events"),
        ("delete", "modelversions.modelroll.io"),
    ):
        assert not can_i(crds, account, "default", verb, *what), f"operator may {verb} {what}"


def rendered_operator_args(helm: Helm, cluster: Cluster, release: str, namespace: str) -> list[str]:
    manifest = helm.run("get", "manifest", release, "--namespace", namespace, env=helm_env(cluster))
    docs = [d for d in yaml.safe_load_all(manifest.stdout) if d]
    deployment = one(docs, "Deployment", "-operator")
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def routes_weights(cluster: Cluster, namespace: str) -> dict[str, int]:
    if not cluster.exists("configmap", "modelroll-routes", namespace=namespace):
        return {}
    data = cluster.kubectl_json("get", "configmap", "modelroll-routes", namespace=namespace)
    route = json.loads((data.get("data") or {}).get("sentiment", "null")) or {"versions": []}
    return {v["name"]: v["weight"] for v in route["versions"]}


def poll(check: Callable[[], bool], what: str, proc: Proc, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc.popen.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {timeout:.0f}s; operator log:\n{proc.log()}")
        time.sleep(0.2)


@pytest.mark.timeout(240)
def test_the_operator_runs_with_nothing_but_the_charts_rbac(
    helm: Helm, crds: Cluster, namespace: str, release: str, spawn: Spawn, tmp_path: Path
) -> None:
    """The real operator, started with the arguments the chart renders and authenticated as the
    chart's service account, routes the external example and runs the managed one."""
    install(helm, crds, release, namespace)
    account = f"{release}-modelroll-operator"
    kubeconfig = service_account_kubeconfig(
        crds, namespace, account, tmp_path / "operator.kubeconfig"
    )
    args = rendered_operator_args(helm, crds, release, namespace)
    liveness = f"http://127.0.0.1:{free_port()}/healthz"
    # On this machine, not in a pod: no metrics port that other tests' operators could hold.
    operator = spawn(
        "modelroll-operator",
        *args,
        f"--kubeconfig={kubeconfig}",
        f"--liveness={liveness}",
        "--metrics-port=0",
        ready=liveness,
    )
    try:
        crds.kubectl("apply", "-f", str(EXAMPLES / "external"), namespace=namespace)
        poll(
            lambda: (
                routes_weights(crds, namespace) == {"sentiment-stable": 90, "sentiment-canary": 10}
            ),
            "routing the external versions",
            operator,
        )

        # Managed mode: the operator runs the model with the sidecar image the chart gave it.
        crds.kubectl("apply", "-f", str(EXAMPLES / "managed"), namespace=namespace)
        poll(
            lambda: crds.exists("deployment", "sentiment-canary", namespace=namespace),
            "creating the managed Deployment",
            operator,
        )
        pod = crds.kubectl_json("get", "deployment", "sentiment-canary", namespace=namespace)
        images = {c["image"] for c in pod["spec"]["template"]["spec"]["containers"]}
        sidecar_image = next(a.split("=", 1)[1] for a in args if a.startswith("--sidecar-image="))
        assert sidecar_image in images
        assert crds.exists("service", "sentiment-canary", namespace=namespace)

        # A chat LLM version: the sidecar in front of the engine speaks OpenAI, capped as given.
        crds.kubectl("apply", "-f", str(EXAMPLES / "llm"), namespace=namespace)
        poll(
            lambda: crds.exists("deployment", "chat-canary", namespace=namespace),
            "creating the chat version's Deployment",
            operator,
        )
        pod = crds.kubectl_json("get", "deployment", "chat-canary", namespace=namespace)
        [sidecar] = pod["spec"]["template"]["spec"]["containers"]
        assert sidecar["image"] == sidecar_image
        assert {
            "--protocol=openai",
            "--max-in-flight=128",
            "--model=chat",
            "--version=chat-canary",
        } <= set(sidecar["args"])
        engines = [
            c
            for c in pod["spec"]["template"]["spec"]["initContainers"]
            if c.get("command") == ["modelroll-demo-llm"]
        ]
        assert len(engines) == 1, pod["spec"]["template"]["spec"]["initContainers"]
        assert "--served-model-name=chat" in engines[0]["args"]

        # Back to external mode: the operator deletes the workload it created.
        crds.kubectl("apply", "-f", str(EXAMPLES / "external"), namespace=namespace)
        poll(
            lambda: not crds.exists("deployment", "sentiment-canary", namespace=namespace),
            "deleting the managed Deployment",
            operator,
        )
    finally:
        # While the operator still runs, so that it removes its finalizers.
        crds.kubectl(
            "delete", "modelversions", "--all", "--timeout=60s", namespace=namespace, check=False
        )
    log = operator.log()
    assert "Forbidden" not in log, log
    assert " 403" not in log, log


KEDA_NAMESPACE = "keda"
"""Where modelroll_devcluster.keda's processes believe they run: the chart renders KEDA there."""
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


def apply_by_namespace(cluster: Cluster, docs: list[Manifest], default: str) -> None:
    """Apply ``docs``, each namespace's with kubectl's --namespace (it refuses others)."""
    by_namespace: dict[str, list[Manifest]] = {}
    for doc in docs:
        by_namespace.setdefault(doc["metadata"].get("namespace") or default, []).append(doc)
    for where, group in by_namespace.items():
        cluster.kubectl("apply", "-f", "-", namespace=where, input=yaml.safe_dump_all(group))


def test_keda_scales_a_version_with_nothing_but_the_charts_rbac(
    helm: Helm, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    """KEDA's operator and metrics adapter, each as the service account the chart gives it and
    with only the chart's grants, turn a ScaledObject over a ModelVersion into an HPA, serve its
    metric through the aggregation layer, and the HPA scales the version: the rules narrower
    than KEDA's own (ModelVersions only, no Secret outside KEDA's namespace) are enough. (The
    processes run on the host with certificates of the cluster's CA, so KEDA's own certificate
    making and leader election, which the Role in its namespace covers, are not exercised.)"""
    crds.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KEDA_NAMESPACE}})
    docs = helm.template(values=[KEDA_ON], namespace=KEDA_NAMESPACE)
    rbac = [d for d in docs if d["kind"] in RBAC_KINDS and "-keda" in d["metadata"]["name"]]
    apply_by_namespace(crds, rbac, KEDA_NAMESPACE)
    kubeconfigs = {
        f"{process}_kubeconfig": service_account_kubeconfig(
            crds, KEDA_NAMESPACE, f"modelroll-{account}", tmp_path / f"{account}.kubeconfig"
        )
        for process, account in (("operator", "keda"), ("adapter", "keda-adapter"))
    }
    with running_autoscaling(crds, tmp_path / "autoscaling", **kubeconfigs) as autoscaling:
        version = model_version("v1", "sentiment", endpoint="http://v1:8000", replicas=1)
        crds.apply(version, namespace=namespace)
        status = {"replicas": 1, "selector": "modelroll.io/version=v1"}
        crds.kubectl(
            "patch",
            "mv",
            "v1",
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": status}),
            namespace=namespace,
        )
        query = in_flight_query(namespace, "sentiment", "v1")
        trigger = {"serverAddress": autoscaling.prometheus_url, "query": query, "threshold": "4"}
        scaled = {
            "apiVersion": "keda.sh/v1alpha1",
            "kind": "ScaledObject",
            "metadata": {"name": "v1"},
            "spec": {
                "scaleTargetRef": {
                    "apiVersion": "modelroll.io/v1alpha1",
                    "kind": "ModelVersion",
                    "name": "v1",
                },
                "minReplicaCount": 1,
                "maxReplicaCount": 5,
                "triggers": [
                    {"type": "prometheus", "metricType": "AverageValue", "metadata": trigger}
                ],
            },
        }
        crds.apply(scaled, namespace=namespace)
        # 9 requests in flight on the one replica: ceil(9 / 4) = 3 replicas.
        autoscaling.in_flight.set(namespace, "sentiment", "v1", [9])

        def scaled_to_three() -> bool:
            replicas = crds.kubectl_json("get", "mv", "v1", namespace=namespace)["spec"]
            return bool(replicas.get("replicas") == 3)

        deadline = time.monotonic() + 90
        while not scaled_to_three():
            if time.monotonic() > deadline:
                logs = "\n".join(
                    c.log_path.read_text()[-3000:] for c in autoscaling.keda.components
                )
                hpa = crds.kubectl("get", "hpa", "-o", "yaml", namespace=namespace, check=False)
                pytest.fail(f"the version did not scale to 3:\n{hpa.stdout}\n{logs}")
            time.sleep(0.5)
