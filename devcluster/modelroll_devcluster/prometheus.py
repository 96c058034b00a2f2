"""A real Prometheus on loopback, scraping processes a test or the demo runs.

The Prometheus and promtool are the ones `make prometheus` builds into ``.bin/`` from the Go module
proxy (Prometheus 3, pinned in hack/go/prometheus/go.mod): the version users of
kube-prometheus-stack run, so every expression of the dashboard and rules is checked against it.

One implementation for every user: the e2e suite and ``make demo`` (through :mod:`.stack`) and the
chart's PromQL checks (tests/chart/test_promql.py). Storage and the generated configuration live
in the run directory; the process is stopped like the control plane's components.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import yaml

from .controlplane import MissingBinaryError, default_bin_dir
from .processes import ClusterError, Component, free_port, tail

Series = list[dict[str, Any]]


class PrometheusError(ClusterError):
    """Prometheus did not start, or could not parse or evaluate a query."""


def find_tool(name: str = "prometheus") -> Path:
    """``prometheus`` or ``promtool`` from ``.bin/``; raises MissingBinaryError naming the build."""
    path = default_bin_dir() / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise MissingBinaryError(
            f"{name} is not built: run `make prometheus` (Prometheus 3 from Go modules, into "
            f"{path.parent})"
        )
    return path


def static_job(name: str, targets: Sequence[str], **labels: str) -> dict[str, Any]:
    """A scrape job over fixed ``host:port`` targets, each series labelled with ``labels``."""
    config: dict[str, Any] = {"targets": list(targets)}
    if labels:
        config["labels"] = dict(labels)
    return {"job_name": name, "static_configs": [config]}


def _label_name(label: str) -> str:
    """A Kubernetes label as Prometheus's pod discovery names it (``__meta_..._label_<name>``)."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in label)


def _selector_relabelings(selector: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A label selector (matchLabels, matchExpressions) as keep/drop rules over discovered pods,
    as the Prometheus Operator writes them."""
    label = "__meta_kubernetes_pod_label_"
    present = "__meta_kubernetes_pod_labelpresent_"
    rules: list[dict[str, Any]] = [
        {"source_labels": [label + _label_name(k)], "regex": v, "action": "keep"}
        for k, v in sorted(selector.get("matchLabels", {}).items())
    ]
    for expression in selector.get("matchExpressions", []):
        key, operator = _label_name(expression["key"]), expression["operator"]
        values = "|".join(expression.get("values", []))
        rule = {
            "Exists": (present + key, "true", "keep"),
            "DoesNotExist": (present + key, "true", "drop"),
            "In": (label + key, f"({values})", "keep"),
            "NotIn": (label + key, f"({values})", "drop"),
        }.get(operator)
        if rule is None:
            raise PrometheusError(f"unsupported selector operator {operator!r}")
        rules.append({"source_labels": [rule[0]], "regex": rule[1], "action": rule[2]})
    return rules


def pod_monitor_job(monitor: Mapping[str, Any], kubeconfig: Path) -> dict[str, Any]:
    """A scrape job that finds pods the way the Prometheus Operator turns ``monitor`` (a
    PodMonitor) into configuration: Kubernetes pod discovery, kept by the PodMonitor's selector
    and its endpoint's port name, labelled ``namespace`` and ``pod``. For clusters without the
    Prometheus Operator (the local node)."""
    spec = monitor["spec"]
    (endpoint,) = spec["podMetricsEndpoints"]
    discovery: dict[str, Any] = {"role": "pod", "kubeconfig_file": str(kubeconfig)}
    namespaces = spec.get("namespaceSelector", {})
    if names := namespaces.get("matchNames"):
        discovery["namespaces"] = {"names": list(names)}
    elif not namespaces.get("any"):
        discovery["namespaces"] = {"names": [monitor["metadata"]["namespace"]]}
    keep = _selector_relabelings(spec.get("selector", {}))
    keep.append(
        {
            "source_labels": ["__meta_kubernetes_pod_container_port_name"],
            "regex": endpoint["port"],
            "action": "keep",
        }
    )
    return {
        "job_name": f"podMonitor/{monitor['metadata']['namespace']}/{monitor['metadata']['name']}",
        "metrics_path": endpoint.get("path", "/metrics"),
        "kubernetes_sd_configs": [discovery],
        "relabel_configs": [
            *keep,
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        ],
    }


class PrometheusAPI:
    """The HTTP API of a Prometheus at ``url`` (one this module started, or any other)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def api(self, path: str, **params: str) -> Any:
        """GET an HTTP API path (``/api/v1/...``) and return the decoded JSON, errors included."""
        query = urllib.parse.urlencode(params)
        url = f"{self.url}{path}?{query}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 (an http URL)
                return json.load(resp)
        except urllib.error.HTTPError as err:
            return json.load(err)

    def query(self, expr: str) -> Series:
        """An instant query's vector; raises PrometheusError if it does not parse or evaluate."""
        doc = self.api("/api/v1/query", query=expr)
        if doc.get("status") != "success":
            raise PrometheusError(f"{expr}\n{doc.get('errorType')}: {doc.get('error')}")
        if doc["data"]["resultType"] != "vector":
            raise PrometheusError(f"{expr} returned a {doc['data']['resultType']}, not a vector")
        result: Series = doc["data"]["result"]
        return result

    def by_label(self, expr: str, label: str = "version") -> dict[str, float]:
        """An instant query's values keyed by one label (NaN values left out)."""
        out: dict[str, float] = {}
        for series in self.query(expr):
            value = float(series["value"][1])
            if value == value:  # not NaN (0/0 over a version with no requests)
                out[series["metric"].get(label, "")] = value
        return out


class Prometheus(PrometheusAPI):
    """One Prometheus server on a free port (of loopback unless ``host`` says otherwise),
    scraping ``scrape_configs``."""

    def __init__(
        self,
        run_dir: Path,
        scrape_configs: Sequence[Mapping[str, Any]],
        *,
        rule_files: Sequence[Path] = (),
        scrape_interval: str = "1s",
        die_with_parent: bool = True,
        start_timeout: float = 60.0,
        host: str = "127.0.0.1",
    ) -> None:
        self.run_dir = run_dir.resolve()
        self.scrape_configs = [dict(c) for c in scrape_configs]
        self.rule_files = list(rule_files)
        self.scrape_interval = scrape_interval
        self.die_with_parent = die_with_parent
        self.start_timeout = start_timeout
        self.host = host
        """The address it listens on and is reached at: loopback, or the host's address on a
        node's pod network for clients in pods (KEDA's operator)."""
        self.port = 0
        super().__init__("")
        self.component: Component | None = None

    @property
    def log_path(self) -> Path:
        return self.run_dir / "prometheus.log"

    def start(self) -> Self:
        """Write the configuration, start the server and wait until it answers /-/ready."""
        binary = find_tool("prometheus")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {
                "scrape_interval": self.scrape_interval,
                "evaluation_interval": self.scrape_interval,
            },
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": self.scrape_configs,
        }
        config_file = self.run_dir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        self.port = self.port or free_port()  # started again: the same address
        self.url = f"http://{self.host}:{self.port}"
        self.component = Component(
            "prometheus",
            [
                str(binary),
                f"--config.file={config_file}",
                f"--storage.tsdb.path={self.run_dir / 'data'}",
                f"--web.listen-address={self.host}:{self.port}",
                "--storage.tsdb.retention.time=1h",
            ],
            self.log_path,
        )
        self.component.start(die_with_parent=self.die_with_parent)
        deadline = time.monotonic() + self.start_timeout
        while not self._ready():
            if not self.component.running():
                self.stop()
                raise self._failure("exited during start-up")
            if time.monotonic() > deadline:
                self.stop()
                raise self._failure(f"was not ready after {self.start_timeout:.0f}s")
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        if self.component is not None:
            self.component.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as resp:  # noqa: S310
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def _failure(self, reason: str) -> PrometheusError:
        return PrometheusError(f"prometheus {reason}; log {self.log_path}:\n{tail(self.log_path)}")
