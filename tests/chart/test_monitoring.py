"""The scrape objects (podmonitor.yaml, operator-podmonitor.yaml, servicemonitor.yaml): opt-in,
labelled for kube-prometheus-stack, selecting the sidecars, the operator and the gateway."""

from __future__ import annotations

from tests.support.chart import Helm, by_kind, one
from tests.support.rendering import MONITORING_ON, operator_args


def test_monitoring_is_opt_in_and_labelled_for_kube_prometheus_stack(helm: Helm) -> None:
    docs = helm.template(values=[MONITORING_ON])
    monitors = [
        ("PodMonitor", "-sidecars"),
        ("PodMonitor", "-operator"),
        ("ServiceMonitor", ""),
        ("PrometheusRule", ""),
    ]
    for kind, suffix in monitors:
        labels = one(docs, kind, suffix)["metadata"]["labels"]
        assert labels["release"] == "kube-prometheus-stack", kind
    relabelled = helm.template(
        "--set", "monitoring.additionalLabels.release=prom", values=[MONITORING_ON]
    )
    for monitor in by_kind(relabelled, "PodMonitor"):
        assert monitor["metadata"]["labels"]["release"] == "prom"


def test_podmonitor_selects_sidecars_by_the_modelroll_labels(helm: Helm) -> None:
    spec = one(helm.template(values=[MONITORING_ON]), "PodMonitor", "-sidecars")["spec"]
    keys = {e["key"] for e in spec["selector"]["matchExpressions"]}
    assert keys == {"modelroll.io/model", "modelroll.io/version"}
    assert spec["selector"]["matchLabels"] == {"app.kubernetes.io/managed-by": "modelroll-operator"}
    assert spec["namespaceSelector"] == {"any": True}
    assert spec["podMetricsEndpoints"][0]["port"] == "http"
    assert spec["podMetricsEndpoints"][0]["path"] == "/metrics"
    limited = helm.template("--set", "operator.watchNamespaces={models}", values=[MONITORING_ON])
    assert one(limited, "PodMonitor", "-sidecars")["spec"]["namespaceSelector"] == {
        "matchNames": ["models"]
    }


def test_the_operator_serves_metrics_on_a_port_its_podmonitor_scrapes(helm: Helm) -> None:
    docs = helm.template(values=[MONITORING_ON])
    deployment = one(docs, "Deployment", "-operator")
    pod = deployment["spec"]["template"]
    ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    assert ports == {"health": 8081, "metrics": 8082}
    assert "--metrics-port=8082" in operator_args(docs)
    monitor = one(docs, "PodMonitor", "-operator")
    assert monitor["metadata"]["namespace"] == "models"
    spec = monitor["spec"]
    assert spec["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert spec["selector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    assert spec["namespaceSelector"] == {"matchNames": ["models"]}
    [endpoint] = spec["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
    # The series name the canary's namespace: it must not become exported_namespace.
    assert endpoint["honorLabels"] is True
    # Off by default, and with no operator to scrape; the port follows operator.metricsPort.
    assert not by_kind(helm.template(), "PodMonitor")
    no_operator = helm.template("--set", "operator.enabled=false", values=[MONITORING_ON])
    assert [m["metadata"]["name"] for m in by_kind(no_operator, "PodMonitor")] == [
        "modelroll-sidecars"
    ]
    moved = helm.template("--set", "operator.metricsPort=9102", values=[MONITORING_ON])
    assert "--metrics-port=9102" in operator_args(moved)
    container = one(moved, "Deployment", "-operator")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "metrics", "containerPort": 9102, "protocol": "TCP"} in container["ports"]


def test_servicemonitor_scrapes_the_gateways_admin_port(helm: Helm) -> None:
    """The gateway serves /metrics on its admin port alone: the ServiceMonitor's endpoint is the
    admin Service's one port, and no port of the clients' Service."""
    docs = helm.template(values=[MONITORING_ON])
    monitor = one(docs, "ServiceMonitor")["spec"]
    (endpoint,) = monitor["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("admin", "/metrics")
    admin, clients = one(docs, "Service", "-gateway-admin"), one(docs, "Service", "-gateway")
    for service in (admin, clients):
        assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [p["name"] for p in admin["spec"]["ports"]] == ["admin"]
    assert "admin" not in {p["name"] for p in clients["spec"]["ports"]}
    pod = one(docs, "Deployment", "-gateway")["spec"]["template"]["spec"]
    ports = {p["name"]: p["containerPort"] for p in pod["containers"][0]["ports"]}
    assert f"--admin-port={ports['admin']}" in pod["containers"][0]["args"]
