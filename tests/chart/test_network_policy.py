"""The chart's NetworkPolicies. Over the managed model pods: on by default, it admits the
gateway's pods (and the scraper, when the sidecars are scraped) to the sidecar's port and nothing
else, so no other pod reaches the model server's own port. Over the gateway's pods: every client
reaches the clients' port, only the scraper and the operator the admin port, whose metrics and
routes name every version. Rendered here, and accepted as they are by the real API server (a
server-side dry run with strict field validation).

Whether the policy is enforced is the network plugin's business: the local node's bridge CNI
does not enforce NetworkPolicy, so no test sends traffic against it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from modelroll_devcluster import Cluster
from modelroll_operator.config import SIDECAR_PORT, OperatorConfig
from modelroll_operator.manifests import deployment_manifest
from modelroll_operator.snapshots import VersionInfo
from tests.support.chart import CHART, EXAMPLES, FULL_VALUES, Helm, Manifest, by_kind, one

MODEL_POD_SELECTOR = {
    "app.kubernetes.io/managed-by": "modelroll-operator",
    "app.kubernetes.io/component": "model-server",
}
KUBE_PROMETHEUS_STACK = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}
SIDECAR_PORT_RULE = [{"protocol": "TCP", "port": SIDECAR_PORT}]


def policy(docs: list[Manifest]) -> Manifest:
    return one(docs, "NetworkPolicy", "-model-pods")


def gateway_policy(docs: list[Manifest]) -> Manifest:
    return one(docs, "NetworkPolicy", "-gateway")


def managed_pod(example: str = "sentiment-stable.yaml") -> Manifest:
    """The pod template the operator renders for a managed example, in namespace models."""
    body: dict[str, Any] = yaml.safe_load((EXAMPLES / "managed" / example).read_text())
    body["metadata"].update(namespace="models", uid="uid-1", generation=1)
    version = VersionInfo.from_body(body)
    assert version is not None
    template: Manifest = deployment_manifest(version, OperatorConfig())["spec"]["template"]
    return template


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a matchLabels-only LabelSelector selects a pod with these labels."""
    assert set(selector) == {"matchLabels"}, selector
    return bool(selector["matchLabels"].items() <= labels.items())


def test_by_default_only_the_gateway_reaches_the_model_pods_and_only_on_the_sidecar_port(
    helm: Helm,
) -> None:
    docs = helm.template()
    found = policy(docs)
    assert found["apiVersion"] == "networking.k8s.io/v1"
    assert found["metadata"]["namespace"] == "models"  # where the gateway routes
    spec = found["spec"]
    assert spec["podSelector"] == {"matchLabels": MODEL_POD_SELECTOR}
    assert spec["policyTypes"] == ["Ingress"]
    gateway = one(docs, "Deployment", "-gateway")
    (rule,) = spec["ingress"]
    assert rule == {
        "from": [{"podSelector": {"matchLabels": gateway["spec"]["selector"]["matchLabels"]}}],
        "ports": SIDECAR_PORT_RULE,
    }


def test_the_policy_selects_the_operators_model_pods_and_admits_the_charts_gateway_pods(
    helm: Helm,
) -> None:
    """Selectors that match nothing would leave every port open: each is checked against the
    pods it is for, and against the pods it is not for."""
    docs = helm.template()
    spec = policy(docs)["spec"]
    pod = managed_pod()
    assert selects(spec["podSelector"], pod["metadata"]["labels"])
    assert selects(spec["podSelector"], managed_pod("sentiment-canary.yaml")["metadata"]["labels"])
    (peer,) = spec["ingress"][0]["from"]
    for deployment in by_kind(docs, "Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert not selects(spec["podSelector"], labels), deployment["metadata"]["name"]
        is_gateway = deployment["metadata"]["name"].endswith("-gateway")
        assert selects(peer["podSelector"], labels) == is_gateway
    assert not selects(peer["podSelector"], pod["metadata"]["labels"])
    # The one admitted port is the sidecar's; the model server's own is not admitted.
    ports = {c["name"]: c["ports"][0]["containerPort"] for c in pod["spec"]["initContainers"]}
    ports["sidecar"] = pod["spec"]["containers"][0]["ports"][0]["containerPort"]
    assert ports == {"model": 8080, "sidecar": SIDECAR_PORT}
    assert [p["port"] for p in spec["ingress"][0]["ports"]] == [ports["sidecar"]]


def test_with_gateway_api_the_operator_is_admitted_to_the_sidecar_port_only(helm: Helm) -> None:
    """A canary analysis of a model an HTTPRoute routes reads the versions' sidecars."""
    assert len(policy(helm.template())["spec"]["ingress"]) == 1  # the gateway only
    docs = helm.template("--set", "operator.gatewayAPI=true")
    _, operator_rule = policy(docs)["spec"]["ingress"]
    assert operator_rule["ports"] == SIDECAR_PORT_RULE
    (peer,) = operator_rule["from"]
    for deployment in by_kind(docs, "Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        is_operator = deployment["metadata"]["name"].endswith("-operator")
        assert selects(peer["podSelector"], labels) == is_operator, deployment["metadata"]["name"]
    assert not selects(peer["podSelector"], managed_pod()["metadata"]["labels"])


def test_with_the_sidecars_scraped_the_scraper_is_admitted_to_the_sidecar_port(
    helm: Helm, tmp_path: Path
) -> None:
    docs = helm.template("--set", "monitoring.podMonitor.enabled=true")
    rules = policy(docs)["spec"]["ingress"]
    assert len(rules) == 2
    assert rules[1] == {"from": [KUBE_PROMETHEUS_STACK], "ports": SIDECAR_PORT_RULE}
    # The PodMonitor scrapes the sidecar's port, which the policy admits.
    monitor = one(docs, "PodMonitor")
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "http"
    (port,) = managed_pod()["spec"]["containers"][0]["ports"]
    assert (port["name"], port["containerPort"]) == ("http", SIDECAR_PORT)
    # Another Prometheus. Helm merges given values into the defaults, so a values file drops a
    # default label with null.
    given = tmp_path / "values.yaml"
    given.write_text(
        "networkPolicy:\n"
        "  scraper:\n"
        "    namespaceSelector:\n"
        "      matchLabels: {kubernetes.io/metadata.name: null, team: observability}\n"
        "    podSelector:\n"
        "      matchLabels: null\n"
        "      matchExpressions: [{key: app, operator: In, values: [vmagent]}]\n"
    )
    docs = helm.template("--set", "monitoring.podMonitor.enabled=true", values=[given])
    assert policy(docs)["spec"]["ingress"][1]["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"team": "observability"}},
            "podSelector": {
                "matchExpressions": [{"key": "app", "operator": "In", "values": ["vmagent"]}]
            },
        }
    ]


def test_the_values_default_to_the_kube_prometheus_stack_scraper() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["networkPolicy"]
    assert values == {
        "enabled": True,
        "scraper": KUBE_PROMETHEUS_STACK,
        "extraIngress": [],
        "gatewayAdminFrom": [],
    }


def container_ports(docs: list[Manifest], suffix: str) -> dict[str, int]:
    """The named ports of the first container of the Deployment whose name ends with suffix."""
    pod = one(docs, "Deployment", suffix)["spec"]["template"]["spec"]
    return {p["name"]: p["containerPort"] for p in pod["containers"][0]["ports"]}


@pytest.mark.parametrize("values", [(), (FULL_VALUES,)], ids=["default", "full"])
def test_only_the_scraper_and_the_operator_reach_the_gateways_admin_port(
    helm: Helm, values: tuple[Path, ...]
) -> None:
    """Every client reaches the clients' port; the admin port, whose /metrics and /v1/routes
    name every version, admits the scraper and the operator's pods, and no other pod (the
    gateway's own and the model pods included)."""
    docs = helm.template(values=values)
    spec = gateway_policy(docs)["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    gateway = one(docs, "Deployment", "-gateway")
    assert spec["podSelector"] == {"matchLabels": gateway["spec"]["selector"]["matchLabels"]}
    ports = container_ports(docs, "-gateway")
    assert set(ports) == {"http", "admin"}
    clients, admin = spec["ingress"]
    assert clients == {"ports": [{"protocol": "TCP", "port": ports["http"]}]}  # from anywhere
    assert admin["ports"] == [{"protocol": "TCP", "port": ports["admin"]}]
    scraper, operator = admin["from"]
    assert scraper == KUBE_PROMETHEUS_STACK
    pods = {
        d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"]
        for d in by_kind(docs, "Deployment")
    }
    pods["model-pod"] = managed_pod()["metadata"]["labels"]
    admitted = [name for name, labels in pods.items() if selects(operator["podSelector"], labels)]
    assert admitted == ["modelroll-operator"]
    selected = [name for name, labels in pods.items() if selects(spec["podSelector"], labels)]
    assert selected == ["modelroll-gateway"]


def test_without_the_operator_the_scraper_and_the_named_peers_alone_reach_the_admin_port(
    helm: Helm,
) -> None:
    """An operator of another release is named in networkPolicy.gatewayAdminFrom."""
    elsewhere = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}}
    docs = helm.template(
        "--set",
        "operator.enabled=false",
        "--set-json",
        f"networkPolicy.gatewayAdminFrom=[{json.dumps(elsewhere)}]",
    )
    _, admin = gateway_policy(docs)["spec"]["ingress"]
    assert admin["from"] == [KUBE_PROMETHEUS_STACK, elsewhere]
    no_gateway = by_kind(helm.template("--set", "gateway.enabled=false"), "NetworkPolicy")
    assert [p["metadata"]["name"] for p in no_gateway] == ["modelroll-model-pods"]


def test_extra_ingress_rules_are_added_and_the_policy_can_be_turned_off(helm: Helm) -> None:
    extra = [{"from": [{"podSelector": {"matchLabels": {"app": "batch-scorer"}}}]}]
    docs = helm.template("--set-json", f"networkPolicy.extraIngress={json.dumps(extra)}")
    assert policy(docs)["spec"]["ingress"][1:] == extra
    assert not by_kind(helm.template("--set", "networkPolicy.enabled=false"), "NetworkPolicy")
    assert gateway_policy(docs) == gateway_policy(helm.template())  # the model pods' rules only


def test_without_the_gateway_nothing_reaches_the_model_pods(helm: Helm) -> None:
    """A policy with no rule still isolates the pods it selects: nothing is admitted."""
    spec = policy(helm.template("--set", "gateway.enabled=false"))["spec"]
    assert spec["ingress"] == []
    assert spec["policyTypes"] == ["Ingress"]


@pytest.mark.parametrize(
    ("setting", "key"),
    [
        ("networkPolicy.enable=false", "enable"),
        ("networkPolicy.scraper.namespaceSelector.matchLabel.team=x", "matchLabel"),
        ("networkPolicy.scraper.podSelector.selector.app=x", "selector"),
    ],
)
def test_a_misspelt_key_is_refused_rather_than_opening_the_policy(
    helm: Helm, setting: str, key: str
) -> None:
    """A selector that lost a misspelt key would select more namespaces or pods than meant."""
    result = helm.run("template", "modelroll", str(CHART), "--set", setting, check=False)
    assert result.returncode != 0, f"--set {setting} was accepted"
    assert "values don't meet the specifications of the schema" in result.stderr
    assert key in result.stderr, result.stderr


@pytest.mark.integration
@pytest.mark.parametrize(
    "settings",
    [
        (),
        ("--set", "monitoring.podMonitor.enabled=true"),
        ("--set", "gateway.enabled=false"),
        (
            "--set-json",
            'networkPolicy.extraIngress=[{"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], '
            '"ports": [{"protocol": "TCP", "port": 8000}]}]',
        ),
        (
            "--set",
            "operator.enabled=false",
            "--set-json",
            'networkPolicy.gatewayAdminFrom=[{"ipBlock": {"cidr": "10.0.0.0/8"}}]',
        ),
    ],
    ids=["default", "scraped", "no-gateway", "extra", "admin-from"],
)
def test_the_api_server_accepts_the_policies_as_rendered(
    helm: Helm, cluster: Cluster, namespace: str, settings: tuple[str, ...]
) -> None:
    """No field is unknown to the API server (strict validation), and it keeps every one."""
    for rendered in by_kind(helm.template(*settings, namespace=namespace), "NetworkPolicy"):
        result = cluster.kubectl(
            *("apply", "--dry-run=server", "--validate=strict", "-o", "json", "-f", "-"),
            namespace=namespace,
            input=yaml.safe_dump(rendered),
        )
        stored = json.loads(result.stdout)
        assert stored["kind"] == "NetworkPolicy"
        assert stored["metadata"]["namespace"] == namespace
        # No rule (nothing admitted) is stored without the empty list.
        assert {"ingress": [], **stored["spec"]} == rendered["spec"]
