"""The gateway's Deployment: the routes ConfigMap it follows; as Kubernetes stops it, a grace
period that outlasts the gateway's own drain, and a PodDisruptionBudget when there are replicas
to keep serving; and the clients it trusts, from values to flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelroll_gateway import GatewayConfig
from modelroll_gateway import cli as gateway_cli
from tests.chart.conftest import CHART, FULL_VALUES, Helm, Manifest, by_kind, one


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


def test_trusted_networks_and_trusted_pins_reach_the_gateway_as_its_flags(helm: Helm) -> None:
    """Empty by default: the gateway's own default (loopback) stands, and anyone may pin."""
    parser = gateway_cli.build_parser()

    def config(*settings: str) -> GatewayConfig:
        args = pod_template(helm.template(*settings))["spec"]["containers"][0]["args"]
        return gateway_cli.config_from_args(parser.parse_args(args))

    default = config()
    assert [str(n) for n in default.trusted_networks] == ["127.0.0.0/8", "::1/128"]
    assert not default.pin_trusted_only
    trusted = config(
        "--set",
        "gateway.trustedNetworks={10.244.0.0/16,fd00::/8}",
        "--set",
        "gateway.pinTrustedOnly=true",
    )
    assert [str(n) for n in trusted.trusted_networks] == ["10.244.0.0/16", "fd00::/8"]
    assert trusted.pin_trusted_only
    assert trusted.trusts("10.244.3.1")
    assert not trusted.trusts("127.0.0.1")


def test_gateway_follows_the_routes_configmap_of_its_own_namespace(helm: Helm) -> None:
    deployment = one(helm.template(), "Deployment", "-gateway")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--namespace=$(POD_NAMESPACE)" in container["args"]
    assert "--configmap=modelroll-routes" in container["args"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    probes = {p: container[p]["httpGet"]["path"] for p in ("readinessProbe", "livenessProbe")}
    assert probes == {"readinessProbe": "/readyz", "livenessProbe": "/livez"}
