"""The autoscaling pipeline on the local control plane, for the integration tests: KEDA (its
operator and metrics adapter), a real Prometheus, and a series the test sets, served on loopback
and scraped the way the chart's PodMonitor scrapes the sidecars.

The ``autoscaling`` fixture (tests/integration/conftest.py) gives an :class:`Autoscaling`; a test
passes :attr:`Autoscaling.prometheus_url` where the operator takes ``--prometheus-url``, and sets
the load through :attr:`Autoscaling.in_flight`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from modelroll_common import metric_names as names
from modelroll_devcluster import Cluster
from modelroll_devcluster.keda import Keda
from modelroll_devcluster.processes import free_port
from modelroll_devcluster.prometheus import Prometheus, static_job

IN_FLIGHT = names.REQUESTS_IN_FLIGHT
"""Requests a version's replica is working on, one series per pod."""
SERIES_LABELS = ("namespace", "pod", "model", "version")
"""A sidecar's series carry ``model`` and ``version``; the PodMonitor adds ``namespace`` and
``pod``."""


class InFlight:
    """:data:`IN_FLIGHT` as a version's pods would export it, set by the test and served on
    loopback (``/metrics`` at :attr:`target`). Prometheus keeps the series' own ``namespace`` and
    ``pod`` (``honor_labels``), so one server stands for the pods of every test's namespace."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.gauge = Gauge(
            IN_FLIGHT,
            "Requests in flight in a replica (set by the test).",
            SERIES_LABELS,
            registry=self.registry,
        )
        port = free_port()
        self.server, self.thread = start_http_server(port, "127.0.0.1", self.registry)
        self.target = f"127.0.0.1:{port}"

    def set(self, namespace: str, model: str, version: str, per_pod: list[float]) -> None:
        """The version's pods (``<version>-0``, ``<version>-1``, ...) with these values; its
        other pods' series are gone, as a deleted pod's are."""
        for labels in list(self._series(namespace, model, version)):
            self.gauge.remove(*labels)
        for index, value in enumerate(per_pod):
            self.gauge.labels(namespace, f"{version}-{index}", model, version).set(value)

    def _series(self, namespace: str, model: str, version: str) -> Iterator[tuple[str, ...]]:
        for metric in self.registry.collect():
            for sample in metric.samples:
                labels = sample.labels
                if (labels["namespace"], labels["model"], labels["version"]) == (
                    namespace,
                    model,
                    version,
                ):
                    yield tuple(labels[name] for name in SERIES_LABELS)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def in_flight_query(namespace: str, model: str, version: str) -> str:
    """What the version's replicas are working on in all, as a ScaledObject's trigger asks."""
    return f'sum({IN_FLIGHT}{{namespace="{namespace}",model="{model}",version="{version}"}})'


@dataclass
class Autoscaling:
    """KEDA serving the cluster's ScaledObjects, and a Prometheus scraping :attr:`in_flight`."""

    keda: Keda
    prometheus: Prometheus
    in_flight: InFlight

    @property
    def prometheus_url(self) -> str:
        return self.prometheus.url


@contextlib.contextmanager
def running_autoscaling(
    cluster: Cluster, run_dir: Path, **kubeconfigs: Path
) -> Iterator[Autoscaling]:
    """KEDA, Prometheus and the in-flight series, stopped when the block ends; ``kubeconfigs``
    (``operator_kubeconfig``, ``adapter_kubeconfig``) go to :class:`Keda`."""
    in_flight = InFlight()
    job: dict[str, Any] = {**static_job("sidecars", [in_flight.target]), "honor_labels": True}
    with contextlib.ExitStack() as stack:
        stack.callback(in_flight.stop)
        prometheus = stack.enter_context(Prometheus(run_dir / "prometheus", [job]))
        keda = stack.enter_context(Keda(cluster, run_dir / "keda", **kubeconfigs))
        yield Autoscaling(keda, prometheus, in_flight)
