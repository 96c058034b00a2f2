"""The operator's Deployment: the flags values become, read by the operator's own parser (and the
gateway's arguments by the gateway's), the sidecar image and resources it injects."""

from __future__ import annotations

import urllib.parse
from pathlib import Path

import pytest
import yaml

from modelroll_gateway import cli as gateway_cli
from modelroll_operator import cli as operator_cli
from modelroll_operator.config import DEFAULT_SIDECAR_IMAGE
from tests.support.chart import CHART, FULL_VALUES, Helm, one
from tests.support.rendering import chart_meta, container_args, operator_args


def test_operator_gets_the_sidecar_image_from_values(helm: Helm) -> None:
    app_version = chart_meta()["appVersion"]
    default = operator_args(helm.template())
    assert f"--sidecar-image=ghcr.io/modelroll/modelroll-sidecar:{app_version}" in default
    retagged = operator_args(
        helm.template("--set", "sidecar.image.repository=reg.local/sc,sidecar.image.tag=1.2.3")
    )
    assert "--sidecar-image=reg.local/sc:1.2.3" in retagged
    explicit = operator_args(helm.template("--set", "operator.sidecarImage=reg.local/other:9"))
    assert "--sidecar-image=reg.local/other:9" in explicit


def test_operator_watches_all_namespaces_or_the_listed_ones(helm: Helm) -> None:
    assert "--all-namespaces" in operator_args(helm.template())
    listed = operator_args(helm.template("--set", "operator.watchNamespaces={a,b}"))
    assert "--namespace=a" in listed
    assert "--namespace=b" in listed
    assert "--all-namespaces" not in listed


@pytest.mark.parametrize("values", [(), (FULL_VALUES,)], ids=["default", "full"])
def test_the_operator_and_the_gateway_accept_the_rendered_arguments(
    helm: Helm, values: tuple[Path, ...]
) -> None:
    """Their own argument parsers read what the chart passes (a wrong flag exits the pod)."""
    docs = helm.template(values=values)
    operator = operator_cli.build_parser().parse_args(container_args(docs, "-operator"))
    config = operator_cli.parse_config(operator)
    gateway = gateway_cli.config_from_args(
        gateway_cli.build_parser().parse_args(container_args(docs, "-gateway"))
    )
    deployment = one(docs, "Deployment", "-gateway")["spec"]["template"]["spec"]
    assert gateway.port == deployment["containers"][0]["ports"][0]["containerPort"]
    operator_pod = one(docs, "Deployment", "-operator")["spec"]["template"]["spec"]
    health = {p["name"]: p["containerPort"] for p in operator_pod["containers"][0]["ports"]}
    assert urllib.parse.urlsplit(operator.liveness).port == health["health"]
    assert config.metrics_port == health["metrics"]
    if values:
        assert config.peering == "modelroll"
        assert config.gateway_api
        assert operator.namespace == ["models", "models-staging"]
        assert config.sidecar_image == "registry.example.com/modelroll/sidecar:0.1.0"
    else:
        assert config.peering is None
        assert not config.gateway_api
        assert operator.all_namespaces


@pytest.mark.parametrize("layout", [(), ("--set", "operator.watchNamespaces={a,b}")])
def test_the_operator_gets_gateway_api_only_with_the_switch(
    helm: Helm, layout: tuple[str, ...]
) -> None:
    assert "--gateway-api" not in operator_args(helm.template(*layout))
    args = operator_args(helm.template(*layout, "--set", "operator.gatewayAPI=true"))
    assert args.count("--gateway-api") == 1
    assert operator_cli.parse_config(operator_cli.build_parser({}).parse_args(args)).gateway_api


def test_the_operator_scales_before_shifting_unless_values_turn_it_off(helm: Helm) -> None:
    assert "--no-scale-before-shift" not in operator_args(helm.template())
    args = operator_args(helm.template("--set", "operator.scaleBeforeShift=false"))
    assert args.count("--no-scale-before-shift") == 1
    assert not operator_cli.parse_config(
        operator_cli.build_parser({}).parse_args(args)
    ).scale_before_shift


def test_analyses_read_their_own_namespace_unless_values_allow_more(helm: Helm) -> None:
    """By default the operator reads no URL outside a version's namespace's Services and no
    other namespace's gateway pods; each value relaxes that with its flag."""
    default = operator_cli.parse_config(
        operator_cli.build_parser({}).parse_args(operator_args(helm.template()))
    )
    assert (default.analysis_url_prefixes, default.analysis_gateway_namespaces) == ((), ())
    args = operator_args(
        helm.template(
            "--set",
            "operator.analysis.urlPrefixes={http://prometheus-operated.monitoring.svc:9090/}",
            "--set",
            "operator.analysis.gatewayNamespaces={gateways,edge}",
        )
    )
    config = operator_cli.parse_config(operator_cli.build_parser({}).parse_args(args))
    assert config.analysis_url_prefixes == ("http://prometheus-operated.monitoring.svc:9090/",)
    assert config.analysis_gateway_namespaces == ("gateways", "edge")


def test_the_charts_default_sidecar_image_is_the_operators_default() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    image = values["sidecar"]["image"]
    assert f"{image['repository']}:{chart_meta()['appVersion']}" == DEFAULT_SIDECAR_IMAGE


def test_the_sidecars_resources_in_values_reach_the_operator_parsed_as_its_flag(
    helm: Helm,
) -> None:
    assert not [a for a in operator_args(helm.template()) if a.startswith("--sidecar-resources")]
    guaranteed = (
        "sidecar.resources.requests.cpu=250m,sidecar.resources.limits.cpu=250m,"
        "sidecar.resources.requests.memory=256Mi,sidecar.resources.limits.memory=256Mi"
    )
    given = operator_args(helm.template("--set", guaranteed))
    (flag,) = [a for a in given if a.startswith("--sidecar-resources=")]
    config = operator_cli.parse_config(operator_cli.build_parser({}).parse_args([flag]))
    assert config.sidecar_resources == {
        "requests": {"cpu": "250m", "memory": "256Mi"},
        "limits": {"cpu": "250m", "memory": "256Mi"},
    }
