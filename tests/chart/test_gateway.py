"""The gateway's Deployment: the routes ConfigMap it follows; as Kubernetes stops it, a grace
period that outlasts the gateway's own drain, and a PodDisruptionBudget when there are replicas
to keep serving; the clients it trusts to pin, from values to flags; and its admin port, on a
Service of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelroll_gateway import GatewayConfig
from modelroll_gateway import cli as gateway_cli
from tests.support.chart import CHART, FULL_VALUES, Helm, Manifest, by_kind, one


def pod_template(docs: list[Manifest], suffix: str = "-gateway") -> Manifest:
    """The pod template of the Deployment whose name ends with `suffix`."""
    pod: Manifest = one(docs, "Deployment", suffix)["spec"]["template"]
    return pod


@pytest.mark.parametrize(
    ("values", "settings"),
    [
        ((), ()),
        ((FULL_VALUES,), ()),
        ((), ("--set", "gateway.upstreamTimeoutSeconds=90")),
        ((), ("--set-json", "gateway.upstreamTimeoutSeconds=2.5")),
    ],
    ids=["default", "full", "long-timeout", "fractional-timeout"],
)
def test_the_gateways_grace_period_outlasts_its_drain(
    helm: Helm, values: tuple[Path, ...], settings: tuple[str, ...]
) -> None:
    """Killed before its drain ends, the gateway would drop the requests it still holds."""
    docs = helm.template(*settings, values=values)
    spec = pod_template(docs)["spec"]
    config = gateway_cli.config_from_args(
        gateway_cli.build_parser().parse_args(spec["containers"][0]["args"])
    )
    # aiohttp rounds its last wait up to a whole second: 1 s more.
    assert spec["terminationGracePeriodSeconds"] >= gateway_cli.drain_seconds(config) + 1


def test_one_gateway_replica_gets_no_disruption_budget(helm: Helm) -> None:
    """A budget for a single pod protects nothing: there is no other pod to keep serving."""
    assert not by_kind(helm.template(), "PodDisruptionBudget")
    assert not by_kind(helm.template("--set", "gateway.replicas=1"), "PodDisruptionBudget")
    assert not by_kind(
        helm.template("--set", "gateway.replicas=2,gateway.enabled=false"), "PodDisruptionBudget"
    )


def test_more_gateway_replicas_get_a_budget_over_exactly_the_gateway_pods(helm: Helm) -> None:
    docs = helm.template("--set", "gateway.replicas=2")
    budget = one(docs, "PodDisruptionBudget", "-gateway")
    assert budget["apiVersion"] == "policy/v1"
    assert budget["metadata"]["name"] == "modelroll-gateway"
    assert budget["metadata"]["namespace"] == "models"
    assert budget["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": pod_template(docs)["metadata"]["labels"]},
    }
    deployment = one(docs, "Deployment", "-gateway")
    assert budget["spec"]["selector"] == deployment["spec"]["selector"]
    # Not the operator's pods: their labels differ in the component.
    operator_labels = pod_template(docs, "-operator")["metadata"]["labels"]
    assert not budget["spec"]["selector"]["matchLabels"].items() <= operator_labels.items()


def test_extra_pod_labels_stay_out_of_the_budgets_selector(helm: Helm) -> None:
    """The selector is the Deployment's: it selects the pods, whatever labels they add."""
    docs = helm.template(
        "--set", "gateway.replicas=3,gateway.podLabels.team=ml", values=[FULL_VALUES]
    )
    budget = one(docs, "PodDisruptionBudget", "-gateway")
    pod_labels = pod_template(docs)["metadata"]["labels"]
    assert pod_labels["team"] == "ml"
    assert budget["spec"]["selector"] == one(docs, "Deployment", "-gateway")["spec"]["selector"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


@pytest.mark.parametrize(("setting", "rendered"), [("2", 2), ("25%", "25%")])
def test_the_budget_takes_a_number_or_a_percentage(
    helm: Helm, setting: str, rendered: int | str
) -> None:
    docs = helm.template(
        "--set", f"gateway.replicas=4,gateway.podDisruptionBudget.maxUnavailable={setting}"
    )
    assert one(docs, "PodDisruptionBudget", "-gateway")["spec"]["maxUnavailable"] == rendered


@pytest.mark.parametrize("setting", ["0", "101%", "all"])
def test_a_budget_that_would_block_every_drain_or_means_nothing_is_refused(
    helm: Helm, setting: str
) -> None:
    result = helm.run(
        "template",
        "modelroll",
        str(CHART),
        "--set",
        "gateway.replicas=2",
        "--set",
        f"gateway.podDisruptionBudget.maxUnavailable={setting}",
        check=False,
    )
    assert result.returncode != 0, f"maxUnavailable={setting} was accepted"
    assert "values don't meet the specifications of the schema" in result.stderr


def gateway_config(helm: Helm, *settings: str) -> GatewayConfig:
    """The gateway's settings as the chart's arguments give them."""
    args = pod_template(helm.template(*settings))["spec"]["containers"][0]["args"]
    return gateway_cli.config_from_args(gateway_cli.build_parser({}).parse_args(args))


def test_trusted_networks_and_pins_from_any_client_reach_the_gateway_as_its_flags(
    helm: Helm,
) -> None:
    """By default no client pins, loopback (a mesh's sidecar, an in-pod proxy) included."""
    default = gateway_config(helm)
    assert (default.trusted_networks, default.pins_from_any_client) == ((), False)
    assert not any(default.trusts(a) for a in ("127.0.0.6", "127.0.0.1", "::1", "10.244.3.1"))
    trusted = gateway_config(helm, "--set", "gateway.trustedNetworks={10.244.0.0/16,fd00::/8}")
    assert [str(n) for n in trusted.trusted_networks] == ["10.244.0.0/16", "fd00::/8"]
    assert trusted.trusts("10.244.3.1")
    assert not trusted.trusts("127.0.0.1")
    assert gateway_config(helm, "--set", "gateway.pinsFromAnyClient=true").pins_from_any_client


@pytest.mark.parametrize("values", [(), (FULL_VALUES,)], ids=["default", "full"])
def test_the_admin_port_is_a_container_port_with_a_clusterip_service_of_its_own(
    helm: Helm, values: tuple[Path, ...]
) -> None:
    """Whatever type the clients' Service has (a LoadBalancer in the full values), the admin
    port is on a ClusterIP Service that has no other port, and the clients' Service lacks it."""
    docs = helm.template(values=values)
    config = gateway_cli.config_from_args(
        gateway_cli.build_parser({}).parse_args(pod_template(docs)["spec"]["containers"][0]["args"])
    )
    container = pod_template(docs)["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": config.port, "admin": config.admin_port}
    assert config.admin_port == (9091 if values else 9090)
    admin = one(docs, "Service", "-gateway-admin")["spec"]
    assert admin["type"] == "ClusterIP"
    assert admin["ports"] == [
        {"name": "admin", "port": config.admin_port, "targetPort": "admin", "protocol": "TCP"}
    ]
    assert (
        admin["selector"] == one(docs, "Deployment", "-gateway")["spec"]["selector"]["matchLabels"]
    )
    clients = one(docs, "Service", "-gateway")["spec"]
    assert [p["targetPort"] for p in clients["ports"]] == ["http"]


def test_the_same_port_for_clients_and_admin_is_refused(helm: Helm) -> None:
    result = helm.run(
        "template", "modelroll", str(CHART), "--set", "gateway.adminPort=8080", check=False
    )
    assert result.returncode != 0
    assert "gateway.adminPort and gateway.port are both 8080" in result.stderr


def test_gateway_follows_the_routes_configmap_of_its_own_namespace(helm: Helm) -> None:
    deployment = one(helm.template(), "Deployment", "-gateway")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--namespace=$(POD_NAMESPACE)" in container["args"]
    assert "--configmap=modelroll-routes" in container["args"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    probes = {p: container[p]["httpGet"]["path"] for p in ("readinessProbe", "livenessProbe")}
    assert probes == {"readinessProbe": "/readyz", "livenessProbe": "/livez"}
