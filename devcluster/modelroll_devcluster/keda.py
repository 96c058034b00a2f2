"""KEDA on the local control plane: a ScaledObject becomes a HorizontalPodAutoscaler whose external
metric KEDA's metrics adapter serves through the API server's aggregation layer, and
kube-controller-manager's own HPA controller scales the target.

``make keda-bins`` builds KEDA's operator and metrics adapter from the Go module proxy
(hack/go/keda) and writes KEDA's CRDs to ``.bin/``. :class:`Keda` installs the CRDs and runs both
as processes on the host with the cluster's admin kubeconfig, the way the control plane's own
processes run:

- the operator watches ScaledObjects in every namespace, writes their HPAs, and answers the
  adapter's metric requests over mutual-TLS gRPC on loopback (it queries the trigger, e.g.
  Prometheus, at each request);
- the adapter serves ``external.metrics.k8s.io`` on loopback, with a certificate signed by the
  cluster's CA, and trusts the API server's front-proxy client (the control plane's aggregation
  flags);
- the APIService ``v1beta1.external.metrics.k8s.io`` names a Service of type ExternalName
  (``localhost``) in the ``keda`` namespace: the aggregator routes to an ExternalName Service's
  host at the APIService's port (an Endpoints or EndpointSlice address may not be a loopback one),
  and checks the certificate against ``<service>.<namespace>.svc``.

It needs the local control plane (its PKI, and an API server on this host).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

import yaml

from .cluster import Cluster
from .controlplane import MissingBinaryError, default_bin_dir
from .pki import issue_tls_dir
from .processes import ClusterError, Component, environment, free_port

__all__ = [
    "APISERVICE",
    "Keda",
    "KedaError",
    "find_keda",
    "install_keda_crds",
]

OPERATOR = "keda-operator"
ADAPTER = "keda-adapter"
CRDS_FILE = "keda-crds.yaml"
"""KEDA's CRDs, concatenated, under the binary directory."""
NAMESPACE = "keda"
"""The namespace KEDA believes it runs in: the adapter's Service lives there."""
SERVICE = "keda-metrics-apiserver"
"""The Service the APIService names (KEDA's own manifests' name)."""
APISERVICE = "v1beta1.external.metrics.k8s.io"
FINALIZER = "finalizer.keda.sh"
"""What KEDA's operator puts on each ScaledObject and ScaledJob it serves."""
READY_TIMEOUT = 60.0
"""Seconds the operator gets to answer /readyz, and the APIService to become Available."""


class KedaError(ClusterError):
    """KEDA did not start, or the API server could not reach its metrics adapter."""


def find_keda(bin_dir: Path | None = None) -> tuple[Path, Path, Path]:
    """KEDA's operator and adapter binaries and its CRDs file; raises MissingBinaryError naming
    the make target that writes them."""
    bin_dir = bin_dir or default_bin_dir()
    paths = (bin_dir / OPERATOR, bin_dir / ADAPTER, bin_dir / CRDS_FILE)
    executable = all(p.is_file() and p.stat().st_mode & 0o111 for p in paths[:2])
    if not (executable and paths[2].is_file()):
        raise MissingBinaryError(
            f"KEDA (keda-operator, keda-adapter, {CRDS_FILE}) is missing in {bin_dir}: run "
            "`make keda-bins` (or point MODELROLL_BIN_DIR at a directory that has them)."
        )
    return paths


def install_keda_crds(cluster: Cluster, bin_dir: Path | None = None) -> list[str]:
    """Apply KEDA's CRDs and wait until each is Established; returns their names."""
    *_, crds = find_keda(bin_dir)
    names = [doc["metadata"]["name"] for doc in yaml.safe_load_all(crds.read_text()) if doc]
    # Server-side: the CRDs are too large for client-side apply's last-applied annotation.
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds))
    cluster.wait_established(*names)
    return names


class Keda:
    """KEDA's operator and metrics adapter on loopback, serving ``cluster``'s ScaledObjects and
    its ``external.metrics.k8s.io`` API.

    Logs: ``<run_dir>/keda-operator.log`` and ``<run_dir>/keda-adapter.log``. Use it as a
    context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        cluster: Cluster,
        run_dir: Path,
        *,
        bin_dir: Path | None = None,
        operator_kubeconfig: Path | None = None,
        adapter_kubeconfig: Path | None = None,
    ) -> None:
        """Each process uses the cluster's admin kubeconfig unless given its own (a service
        account's: what the chart grants KEDA)."""
        if cluster.plane is None:
            raise KedaError(
                "KEDA runs as host processes for the local control plane only; on another "
                "cluster install it with its Helm chart"
            )
        self.cluster = cluster
        self.run_dir = run_dir.resolve()
        self.bin_dir = bin_dir
        self.operator_kubeconfig = operator_kubeconfig or cluster.kubeconfig
        self.adapter_kubeconfig = adapter_kubeconfig or cluster.kubeconfig
        self.components: list[Component] = []

    def start(self) -> Self:
        """Install the CRDs, start the operator and the adapter, register the APIService, and
        wait until the API server reaches the adapter; on failure nothing is left running."""
        operator, adapter, _ = find_keda(self.bin_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        install_keda_crds(self.cluster, self.bin_dir)
        certs = self._issue_certs()
        grpc = f"127.0.0.1:{free_port()}"
        health, secure_port = free_port(), free_port()

        def env(kubeconfig: Path) -> dict[str, str]:
            return environment(
                {
                    "KUBECONFIG": str(kubeconfig),
                    "WATCH_NAMESPACE": "",  # every namespace
                    "POD_NAMESPACE": NAMESPACE,
                    "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE,
                }
            )

        self.components = [
            Component(
                OPERATOR,
                self._operator_argv(operator, certs, grpc, health),
                self.run_dir / f"{OPERATOR}.log",
                env=env(self.operator_kubeconfig),
            ),
            Component(
                ADAPTER,
                self._adapter_argv(adapter, certs, grpc, secure_port),
                self.run_dir / f"{ADAPTER}.log",
                env=env(self.adapter_kubeconfig),
            ),
        ]
        try:
            operating, serving = self.components
            operating.start(die_with_parent=True)
            ready = f"http://127.0.0.1:{health}/readyz"
            operating.wait_ready(ready, READY_TIMEOUT, error=KedaError)
            serving.start(die_with_parent=True)
            self.cluster.apply(self._api_objects(certs / "ca.crt", secure_port))
            self._wait_available(serving)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Unregister the APIService, stop the processes, and take KEDA's finalizer off the
        ScaledObjects left; safe to call twice.

        An APIService whose server is gone makes API discovery fail, and the namespace
        controller waits for a full discovery before it deletes a namespace's contents; a
        finalizer whose controller is gone holds its object, and its namespace, for ever."""
        if not self.components:
            return
        self.cluster.kubectl("delete", "apiservice", APISERVICE, "--ignore-not-found")
        for component in reversed(self.components):
            component.stop()
        self.components = []
        self._release_scaled_objects()

    def _release_scaled_objects(self) -> None:
        listed = self.cluster.kubectl_json("get", "scaledobjects,scaledjobs", "--all-namespaces")
        for item in listed["items"]:
            meta = item["metadata"]
            finalizers = meta.get("finalizers", [])
            if FINALIZER not in finalizers:
                continue
            rest = [f for f in finalizers if f != FINALIZER]
            self.cluster.kubectl(
                "patch",
                item["kind"].lower(),
                meta["name"],
                "--type=merge",
                "-p",
                json.dumps({"metadata": {"finalizers": rest}}),
                namespace=meta["namespace"],
                check=False,  # gone meanwhile: nothing to release
            )

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _issue_certs(self) -> Path:
        """One certificate for the adapter's serving and for both ends of the gRPC link,
        signed by the cluster's CA (which the APIService names as its caBundle)."""
        assert self.cluster.plane is not None
        hosts = ["localhost", "127.0.0.1", f"{SERVICE}.{NAMESPACE}.svc"]
        return issue_tls_dir(self.cluster.plane.pki, self.run_dir / "certs", SERVICE, hosts)

    def _operator_argv(self, binary: Path, certs: Path, grpc: str, health: int) -> list[str]:
        return [
            str(binary),
            "--leader-elect=false",
            f"--metrics-bind-address=127.0.0.1:{free_port()}",
            f"--health-probe-bind-address=127.0.0.1:{health}",
            f"--metrics-service-bind-address={grpc}",
            f"--cert-dir={certs}",
            "--zap-encoder=console",
        ]

    def _adapter_argv(self, binary: Path, certs: Path, grpc: str, secure_port: int) -> list[str]:
        kubeconfig = str(self.adapter_kubeconfig)
        return [
            str(binary),
            f"--secure-port={secure_port}",
            "--bind-address=127.0.0.1",
            f"--cert-dir={certs}",  # ca.crt, tls.crt, tls.key for the operator's gRPC
            f"--tls-cert-file={certs / 'tls.crt'}",
            f"--tls-private-key-file={certs / 'tls.key'}",
            f"--metrics-service-address={grpc}",
            f"--port={free_port()}",  # its own /metrics
            f"--lister-kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--zap-encoder=console",
        ]

    def _api_objects(self, ca: Path, port: int) -> dict[str, Any]:
        """The namespace, the ExternalName Service and the APIService, as one List."""
        bundle = base64.b64encode(ca.read_bytes()).decode()
        items: list[Mapping[str, Any]] = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": SERVICE, "namespace": NAMESPACE},
                "spec": {"type": "ExternalName", "externalName": "localhost"},
            },
            {
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {"name": APISERVICE},
                "spec": {
                    "group": "external.metrics.k8s.io",
                    "version": "v1beta1",
                    "service": {"name": SERVICE, "namespace": NAMESPACE, "port": port},
                    "caBundle": bundle,
                    "groupPriorityMinimum": 100,
                    "versionPriority": 100,
                },
            },
        ]
        return {"apiVersion": "v1", "kind": "List", "items": items}

    def _wait_available(self, adapter: Component) -> None:
        """Wait until the APIService is Available: the aggregator reached the adapter through
        the Service, trusted its certificate, and the adapter trusted the front proxy."""
        deadline = time.monotonic() + READY_TIMEOUT
        last = "no status yet"
        while True:
            if not adapter.running():
                raise KedaError(str(adapter.exited()))
            status = self.cluster.kubectl_json("get", "apiservice", APISERVICE).get("status", {})
            for condition in status.get("conditions", []):
                if condition["type"] == "Available":
                    if condition["status"] == "True":
                        return
                    last = f"{condition.get('reason')}: {condition.get('message')}"
            if time.monotonic() > deadline:
                raise adapter.failure(
                    f"was not reachable through {APISERVICE} after {READY_TIMEOUT:.0f}s ({last})"
                )
            time.sleep(0.5)
