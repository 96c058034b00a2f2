"""KEDA in the chart: rendered only when asked (autoscaling.keda.install), the operator's
--autoscaler and --prometheus-url following autoscaling.keda.enabled, KEDA's pods locked down
like the chart's own, its APIService served by its adapter, its CRDs those of the KEDA module
the repository builds, and its RBAC narrower than KEDA's own."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from modelroll_operator import cli as operator_cli
from tests.support.chart import CHART, REPO, Helm, Manifest, by_kind, one
from tests.support.dockerfiles import Dockerfile
from tests.support.rendering import KEDA_ON, chart_meta, container_args, operator_args, rules_of

PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"
APISERVICE = "v1beta1.external.metrics.k8s.io"
KEDA_KINDS = {
    "scaledobjects.keda.sh",
    "scaledjobs.keda.sh",
    "triggerauthentications.keda.sh",
    "clustertriggerauthentications.keda.sh",
    "cloudeventsources.eventing.keda.sh",
    "clustercloudeventsources.eventing.keda.sh",
}
KEDA_MODULE = "github.com/kedacore/keda/v2"


def keda_objects(docs: list[Manifest]) -> list[str]:
    """The kind and name of every rendered object of KEDA's."""
    return [
        f"{d['kind']}/{d['metadata']['name']}"
        for d in docs
        if "keda" in d["metadata"]["name"] or d["metadata"]["name"] == APISERVICE
    ]


def autoscaler_flags(docs: list[Manifest]) -> list[str]:
    return [a for a in operator_args(docs) if a.startswith(("--autoscaler", "--prometheus-url"))]


def test_nothing_of_keda_renders_unless_asked(helm: Helm) -> None:
    docs = helm.template()
    assert keda_objects(docs) == []
    assert autoscaler_flags(docs) == []


def test_install_renders_keda_and_points_the_operator_at_it(helm: Helm) -> None:
    docs = helm.template(values=[KEDA_ON])
    assert {d["metadata"]["name"] for d in by_kind(docs, "CustomResourceDefinition")} == (
        KEDA_KINDS
    )
    assert sorted(d["metadata"]["name"] for d in by_kind(docs, "Deployment")) == [
        "modelroll-gateway",
        "modelroll-keda",
        "modelroll-keda-adapter",
        "modelroll-operator",
    ]
    assert autoscaler_flags(docs) == ["--autoscaler=keda", f"--prometheus-url={PROMETHEUS}"]


def test_a_keda_of_the_clusters_gets_the_flags_and_nothing_installed(helm: Helm) -> None:
    docs = helm.template(
        "--set", f"autoscaling.keda.enabled=true,autoscaling.prometheusUrl={PROMETHEUS}"
    )
    assert keda_objects(docs) == []
    assert autoscaler_flags(docs) == ["--autoscaler=keda", f"--prometheus-url={PROMETHEUS}"]


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("autoscaling.keda.enabled=true", "autoscaling.prometheusUrl"),
        (
            f"autoscaling.keda.install=true,autoscaling.prometheusUrl={PROMETHEUS}",
            "autoscaling.keda.enabled",
        ),
    ],
    ids=["enabled-without-prometheus", "install-without-enabled"],
)
def test_incomplete_or_contradictory_values_are_refused_by_name(
    helm: Helm, setting: str, named: str
) -> None:
    result = helm.run("template", "modelroll", str(CHART), "--set", setting, check=False)
    assert result.returncode != 0, f"--set {setting} was accepted"
    assert named in result.stderr, result.stderr


def test_the_schema_refuses_a_prometheus_url_that_is_no_url(helm: Helm) -> None:
    result = helm.run(
        "template",
        "modelroll",
        str(CHART),
        "--set",
        "autoscaling.prometheusUrl=prometheus:9090",
        check=False,
    )
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr


def test_the_apiservice_is_served_by_the_adapters_service(helm: Helm) -> None:
    docs = helm.template(values=[KEDA_ON])
    api = one(docs, "APIService", APISERVICE)["spec"]
    assert (api["group"], api["version"]) == ("external.metrics.k8s.io", "v1beta1")
    assert "insecureSkipTLSVerify" not in api  # KEDA's operator puts its CA in caBundle
    service = one(docs, "Service", "-keda-adapter")
    assert api["service"]["name"] == service["metadata"]["name"]
    assert api["service"]["namespace"] == service["metadata"]["namespace"] == "models"
    port = next(p for p in service["spec"]["ports"] if p["port"] == api["service"]["port"])
    pod = one(docs, "Deployment", "-keda-adapter")["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    container = pod["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert f"--secure-port={ports[port['targetPort']]}" in container["args"]


def test_the_adapter_reaches_the_operators_grpc_service_by_a_name_in_its_certificate(
    helm: Helm,
) -> None:
    """KEDA's operator makes one certificate for the Services it is told the names of; the
    adapter calls the operator by one of the names that certificate holds."""
    docs = helm.template(values=[KEDA_ON])
    operator = container_args(docs, "-keda")
    names = dict(a.removeprefix("--").split("=", 1) for a in operator if "=" in a)
    assert names["operator-service-name"] == one(docs, "Service", "-keda")["metadata"]["name"]
    adapter_service = one(docs, "Service", "-keda-adapter")["metadata"]["name"]
    assert names["metrics-server-service-name"] == adapter_service
    grpc = next(
        p["port"] for p in one(docs, "Service", "-keda")["spec"]["ports"] if p["name"] == "grpc"
    )
    adapter = container_args(docs, "-keda-adapter")
    assert f"--metrics-service-address={names['operator-service-name']}.models.svc:{grpc}" in (
        adapter
    )
    secrets = {
        v["secret"]["secretName"]
        for d in (one(docs, "Deployment", "-keda"), one(docs, "Deployment", "-keda-adapter"))
        for v in d["spec"]["template"]["spec"]["volumes"]
        if "secret" in v
    }
    assert secrets == {names["cert-secret-name"]}


def test_kedas_operator_scales_model_versions_only_and_reads_no_secret_elsewhere(
    helm: Helm,
) -> None:
    docs = helm.template(values=[KEDA_ON])
    cluster = rules_of(one(docs, "ClusterRole", "-keda"))
    assert not {rule for rule in cluster if "*" in rule[0] or "*" in rule[1]}
    scaled = {(group, resource) for group, resource, _ in cluster if resource.endswith("/scale")}
    assert scaled == {("modelroll.io", "modelversions/scale")}
    assert not {rule for rule in cluster if rule[1] in ("secrets", "configmaps", "pods")}
    namespaced = one(docs, "Role", "-keda")
    assert namespaced["metadata"]["namespace"] == "models"
    assert ("", "secrets", "get") in rules_of(namespaced)
    adapter = rules_of(one(docs, "ClusterRole", "-keda-adapter"))
    assert adapter == {("keda.sh", "scaledobjects", v) for v in ("get", "list", "watch")}
    delegation = {
        (b["metadata"].get("namespace"), b["roleRef"]["name"])
        for b in by_kind(docs, "ClusterRoleBinding") + by_kind(docs, "RoleBinding")
        if b["subjects"][0]["name"] == "modelroll-keda-adapter"
    }
    assert delegation == {
        (None, "modelroll-keda-adapter"),
        (None, "system:auth-delegator"),
        ("kube-system", "extension-apiserver-authentication-reader"),
    }


def test_kedas_crds_are_kept_on_uninstall(helm: Helm) -> None:
    """Deleting a CRD deletes its objects: every ScaledObject of every namespace."""
    for crd in by_kind(helm.template(values=[KEDA_ON]), "CustomResourceDefinition"):
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def keda_version() -> str:
    go_mod = (REPO / "hack" / "go" / "keda" / "go.mod").read_text()
    found = re.search(rf"^require {re.escape(KEDA_MODULE)} (v\S+)$", go_mod, re.MULTILINE)
    assert found, "hack/go/keda/go.mod requires no KEDA"
    return found.group(1)


def module_crds(version: str) -> Path:
    cache = subprocess.run(
        ["go", "env", "GOMODCACHE"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "GOFLAGS": ""},
    ).stdout.strip()
    bases = Path(cache) / f"{KEDA_MODULE}@{version}" / "config" / "crd" / "bases"
    if not bases.is_dir():
        pytest.fail(f"KEDA {version} is not in the module cache: run `make keda-chart-crds`")
    return bases


def test_the_charts_keda_crds_are_those_of_the_module_the_repository_builds() -> None:
    version = keda_version()
    copy = (CHART / "keda" / "crds.yaml").read_text()
    assert copy.startswith(f"# KEDA {version}'s CRDs"), "run `make keda-chart-crds`"
    shipped = [d for d in yaml.safe_load_all(copy) if d]
    module = [yaml.safe_load(p.read_text()) for p in sorted(module_crds(version).glob("*.yaml"))]
    assert shipped == module, "charts/modelroll/keda/crds.yaml is stale: `make keda-chart-crds`"


def test_kedas_pods_run_the_image_make_images_builds_as_a_non_root_user(helm: Helm) -> None:
    """The image hack/images/build.sh tags (the registry prefix, the chart's appVersion) holds
    the two commands the chart runs, from files build.sh puts in its context; its user is not
    root, like the chart's pods'."""
    build_sh = (REPO / "hack" / "images" / "build.sh").read_text()
    assert "image=$registry/modelroll-keda:$tag" in build_sh
    dockerfile = Dockerfile.parse(REPO / "hack" / "images" / "keda.Dockerfile")
    for source in dockerfile.context_sources():
        assert f'"$keda_context/{source}"' in build_sh, source
    held = {shlex.split(c)[-1] for c in dockerfile.all("COPY")}
    [user] = dockerfile.all("USER")
    assert not user.startswith(("0", "root"))
    tag = chart_meta()["appVersion"]
    for suffix in ("-keda", "-keda-adapter"):
        container = one(helm.template(values=[KEDA_ON]), "Deployment", suffix)["spec"]["template"][
            "spec"
        ]["containers"][0]
        assert container["image"] == f"ghcr.io/modelroll/modelroll-keda:{tag}"
        assert container["command"][0] in held, suffix


def flags_of(binary: str) -> set[str]:
    """The long flags a KEDA binary of `make keda-bins` lists in its --help."""
    path = REPO / ".bin" / binary
    if not path.is_file():
        pytest.fail(f"{path} is missing: build it with `make keda-bins`", pytrace=False)
    usage = subprocess.run(
        [str(path), "--help"], capture_output=True, text=True, timeout=30, check=True
    )
    return set(re.findall(r"^\s+(?:-\w, )?(--[a-z0-9-]+)", usage.stdout + usage.stderr, re.M))


@pytest.mark.parametrize(
    ("suffix", "binary"), [("-keda", "keda-operator"), ("-keda-adapter", "keda-adapter")]
)
def test_kedas_processes_know_every_flag_the_chart_passes(
    helm: Helm, suffix: str, binary: str
) -> None:
    """A flag KEDA does not know exits its pod at start."""
    args = container_args(helm.template(values=[KEDA_ON]), suffix)
    assert {a.split("=", 1)[0] for a in args} <= flags_of(binary)


def test_the_operator_reads_the_autoscaler_the_chart_passes(helm: Helm) -> None:
    parsed = operator_cli.build_parser({}).parse_args(
        operator_args(helm.template(values=[KEDA_ON]))
    )
    config = operator_cli.parse_config(parsed)
    assert (config.autoscaler, config.prometheus_url) == ("keda", PROMETHEUS)
