"""Traefik as the Gateway API data plane of a devcluster: GatewayClasses, Gateways and HTTPRoutes
become real HTTP routing to the pods of the local node.

``make traefik-bins`` builds Traefik from the Go module proxy (hack/go/traefik) and writes the
standard channel CRDs of the Gateway API release it is built against to ``.bin/``.
:func:`install_gateway_api_crds` applies them; :class:`Traefik` runs Traefik on the host as a
:class:`Component`, reading the API server as a ServiceAccount bound to the RBAC that Traefik
documents for its kubernetesGateway provider (so a permission it lacks shows up here, not only in
production); :func:`create_gateway` writes a GatewayClass and a Gateway whose HTTP listener is
Traefik's ``web`` entrypoint and waits until Traefik has programmed it.

Traefik sends each request to an address of the backend Service's EndpointSlices, a pod's IP: on
the local node the host routes to pods, on a cluster elsewhere (kind) it does not.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self, TypeVar

import yaml

from .cluster import Cluster
from .controlplane import MissingBinaryError, default_bin_dir
from .processes import ClusterError, Component, PortTaken, free_port

__all__ = [
    "CONTROLLER_NAME",
    "GATEWAY_CLASS",
    "Traefik",
    "TraefikError",
    "TraefikGateway",
    "conditions_by_type",
    "create_gateway",
    "find_traefik",
    "install_gateway_api_crds",
]

T = TypeVar("T")

BINARY = "traefik"
CRDS_FILE = "gateway-api-crds.yaml"
"""The Gateway API standard channel CRDs, concatenated, under the binary directory."""
CONTROLLER_NAME = "traefik.io/gateway-controller"
"""The ``spec.controllerName`` of the GatewayClasses Traefik serves (fixed in Traefik)."""
GATEWAY_CLASS = "traefik"
ENTRYPOINT = "web"
"""Traefik's entrypoint for the Gateways' HTTP listeners: Traefik maps a listener to the
entrypoint that listens on the listener's port."""
GATEWAY_API = "gateway.networking.k8s.io"
ACCESS_NAMESPACE = "modelroll-traefik"
"""Where the ServiceAccount Traefik reads the API server as lives."""
SERVICE_ACCOUNT = "traefik"
CLUSTER_ROLE = "modelroll-traefik-gateway"
CREDENTIAL_LIFETIME = "24h"
"""Lifetime of Traefik's ServiceAccount token: longer than any test session."""
READY_TIMEOUT = 30.0
"""Seconds Traefik gets to answer /ping, and a Gateway or HTTPRoute to get its status."""
GRACE_TIMEOUT = "2s"
"""How long Traefik lets requests in flight finish on SIGTERM (its default, 10 s, is as long as
:meth:`Component.stop` waits before SIGKILL)."""
THROTTLE = "200ms"
"""The least time between two configurations Traefik applies (its default is 2 s): a route a test
writes serves soon after its status says Accepted."""

#: The ClusterRole of Traefik's own docs/content/reference/dynamic-configuration/
#: kubernetes-gateway-rbac.yml (v3.6), the rights its kubernetesGateway provider uses.
GATEWAY_RBAC_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
    {
        "apiGroups": [""],
        "resources": ["services", "secrets", "configmaps"],
        "verbs": ["get", "list", "watch"],
    },
    {
        "apiGroups": ["discovery.k8s.io"],
        "resources": ["endpointslices"],
        "verbs": ["list", "watch"],
    },
    {
        "apiGroups": [GATEWAY_API],
        "resources": [
            "gatewayclasses",
            "gateways",
            "httproutes",
            "grpcroutes",
            "tcproutes",
            "tlsroutes",
            "referencegrants",
            "backendtlspolicies",
        ],
        "verbs": ["get", "list", "watch"],
    },
    {
        "apiGroups": [GATEWAY_API],
        "resources": [
            "gatewayclasses/status",
            "gateways/status",
            "httproutes/status",
            "grpcroutes/status",
            "tcproutes/status",
            "tlsroutes/status",
            "referencegrants/status",
            "backendtlspolicies/status",
        ],
        "verbs": ["update"],
    },
]


class TraefikError(ClusterError):
    """Traefik did not start, or a Gateway or route it serves did not get its status in time."""


def find_traefik(bin_dir: Path | None = None) -> tuple[Path, Path]:
    """The traefik binary and the Gateway API CRDs file; raises MissingBinaryError naming the
    make target that writes them."""
    bin_dir = bin_dir or default_bin_dir()
    binary, crds = bin_dir / BINARY, bin_dir / CRDS_FILE
    if not (binary.is_file() and binary.stat().st_mode & 0o111 and crds.is_file()):
        raise MissingBinaryError(
            f"Traefik or the Gateway API CRDs are missing in {bin_dir}: run `make traefik-bins` "
            "(or point MODELROLL_BIN_DIR at a directory that has them)."
        )
    return binary, crds


def install_gateway_api_crds(
    cluster: Cluster, bin_dir: Path | None = None, timeout: float = 60.0
) -> list[str]:
    """Apply the Gateway API CRDs and wait until each is Established; returns their names."""
    _, crds = find_traefik(bin_dir)
    names = [doc["metadata"]["name"] for doc in yaml.safe_load_all(crds.read_text()) if doc]
    # Server-side: the CRDs are too large for client-side apply's last-applied annotation.
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds))
    cluster.wait_established(*names, timeout=timeout)
    return names


def conditions_by_type(conditions: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """``metav1.Condition`` entries keyed by their ``type``."""
    return {c["type"]: c for c in conditions or []}


class Traefik:
    """Traefik on 127.0.0.1, serving the Gateway API objects of ``cluster``.

    Two entrypoints on free ports: ``web`` (:attr:`web_port`, :attr:`url`) for the Gateways'
    HTTP listeners and ``traefik`` for ``/ping``. Its log is ``<run_dir>/traefik.log``. Use it
    as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        cluster: Cluster,
        run_dir: Path,
        *,
        bin_dir: Path | None = None,
        die_with_parent: bool = True,
        start_timeout: float = READY_TIMEOUT,
    ) -> None:
        self.cluster = cluster
        self.run_dir = run_dir.resolve()
        self.bin_dir = bin_dir
        self.die_with_parent = die_with_parent
        self.start_timeout = start_timeout
        self.web_port = self.ping_port = 0
        self.component: Component | None = None

    @property
    def url(self) -> str:
        """The ``web`` entrypoint, e.g. ``http://127.0.0.1:40123``."""
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def log_path(self) -> Path:
        return self.run_dir / "traefik.log"

    def start(self) -> Self:
        """Give Traefik its ServiceAccount, start it, and wait until it answers /ping; a port
        taken by another process before Traefik bound it is picked again."""
        binary, _ = find_traefik(self.bin_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        token = self.run_dir / "token"
        token.write_text(self._grant_access())
        token.chmod(0o600)
        ca = self._write_ca()
        for attempt in range(3):
            self.web_port, self.ping_port = free_port(), free_port()
            self.component = Component("traefik", self._argv(binary, token, ca), self.log_path)
            self.component.start(die_with_parent=self.die_with_parent)
            try:
                self._wait_ping(self.component)
                return self
            except PortTaken:
                self.stop()
                if attempt == 2:
                    raise
            except BaseException:
                self.stop()
                raise
        return self  # pragma: no cover - the loop returns or raises

    def stop(self) -> None:
        """SIGTERM, then SIGKILL; safe to call twice."""
        if self.component is not None:
            self.component.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _argv(self, binary: Path, token: Path, ca: Path) -> list[str]:
        provider = "--providers.kubernetesgateway"
        lifecycle = "transport.lifecycle.gracetimeout"
        return [
            str(binary),
            f"--entrypoints.{ENTRYPOINT}.address=127.0.0.1:{self.web_port}",
            f"--entrypoints.{ENTRYPOINT}.{lifecycle}={GRACE_TIMEOUT}",
            f"--entrypoints.traefik.address=127.0.0.1:{self.ping_port}",
            f"--entrypoints.traefik.{lifecycle}={GRACE_TIMEOUT}",
            "--ping=true",
            f"{provider}=true",
            f"{provider}.endpoint={self.cluster.server}",
            f"{provider}.token={token}",
            f"{provider}.certauthfilepath={ca}",
            f"--providers.providersthrottleduration={THROTTLE}",
            "--log.level=INFO",
            "--log.nocolor=true",
            "--global.checknewversion=false",
            "--global.sendanonymoususage=false",
        ]

    def _grant_access(self) -> str:
        """Create Traefik's ServiceAccount, bind it to :data:`GATEWAY_RBAC_RULES`, and return a
        token for it."""
        subject = {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": ACCESS_NAMESPACE}
        objects: list[dict[str, Any]] = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ACCESS_NAMESPACE}},
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": SERVICE_ACCOUNT, "namespace": ACCESS_NAMESPACE},
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": CLUSTER_ROLE},
                "rules": GATEWAY_RBAC_RULES,
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": CLUSTER_ROLE},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": CLUSTER_ROLE,
                },
                "subjects": [subject],
            },
        ]
        self.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))
        token = self.cluster.kubectl(
            "create",
            "token",
            SERVICE_ACCOUNT,
            f"--duration={CREDENTIAL_LIFETIME}",
            namespace=ACCESS_NAMESPACE,
        )
        return token.stdout.strip()

    def _write_ca(self) -> Path:
        """The CA bundle of the cluster's current context, as a file (Traefik takes a path)."""
        data = self.cluster.kubectl(
            "config",
            "view",
            "--raw",
            "--minify",
            "--flatten",
            "--output=jsonpath={.clusters[0].cluster.certificate-authority-data}",
        ).stdout
        ca = self.run_dir / "ca.crt"
        ca.write_bytes(base64.b64decode(data))
        return ca

    def _wait_ping(self, component: Component) -> None:
        ping = f"http://127.0.0.1:{self.ping_port}/ping"
        try:
            component.wait_ready(ping, self.start_timeout, error=TraefikError)
        except TraefikError:
            if not component.running():
                raise component.exited() from None  # PortTaken when a port was taken first
            raise


@dataclass(frozen=True)
class TraefikGateway:
    """A Gateway that Traefik has programmed: its HTTP listener is Traefik's ``web`` entrypoint
    at :attr:`url`, and it takes HTTPRoutes from every namespace."""

    cluster: Cluster
    name: str
    namespace: str
    url: str
    log_path: Path
    """Traefik's log."""
    listener: str = "http"

    def parent_ref(self) -> dict[str, str]:
        """The ``parentRefs`` entry of an HTTPRoute attached to this Gateway."""
        return {
            "group": GATEWAY_API,
            "kind": "Gateway",
            "name": self.name,
            "namespace": self.namespace,
        }

    def route_conditions(self, route: str, namespace: str) -> dict[str, dict[str, Any]]:
        """The conditions Traefik reported for HTTPRoute ``route`` on this Gateway, by type,
        those of an older generation of the route left out ({} until it reports any)."""
        obj = self.cluster.kubectl_json("get", "httproute", route, namespace=namespace)
        generation = obj["metadata"].get("generation")
        for parent in obj.get("status", {}).get("parents", []):
            ref = parent.get("parentRef", {})
            if (ref.get("name"), ref.get("namespace", namespace)) != (self.name, self.namespace):
                continue
            conditions = conditions_by_type(parent.get("conditions"))
            return {
                kind: c
                for kind, c in conditions.items()
                if c.get("observedGeneration", generation) == generation
            }
        return {}

    def wait_route(
        self,
        route: str,
        namespace: str,
        timeout: float = READY_TIMEOUT,
        types: tuple[str, ...] = ("Accepted", "ResolvedRefs"),
    ) -> dict[str, dict[str, Any]]:
        """:meth:`route_conditions` once every one of ``types`` is among them, whatever its
        status (True, or False with the reason Traefik refused the route)."""

        def reported() -> dict[str, dict[str, Any]] | None:
            found = self.route_conditions(route, namespace)
            return found if all(kind in found for kind in types) else None

        return _wait(
            reported,
            f"HTTPRoute {namespace}/{route} has no {'/'.join(types)} conditions from Gateway "
            f"{self.namespace}/{self.name} (Traefik's log: {self.log_path})",
            timeout,
        )


def create_gateway(
    cluster: Cluster,
    traefik: Traefik,
    namespace: str,
    name: str = "traefik",
    *,
    gateway_class: str = GATEWAY_CLASS,
    timeout: float = READY_TIMEOUT,
) -> TraefikGateway:
    """Write GatewayClass ``gateway_class`` (controller :data:`CONTROLLER_NAME`) and a Gateway
    ``name`` in ``namespace`` whose HTTP listener has the ``web`` entrypoint's port; return it
    once Traefik has reported it Accepted and Programmed."""
    gateway = TraefikGateway(cluster, name, namespace, traefik.url, traefik.log_path)
    cluster.apply(
        {
            "apiVersion": f"{GATEWAY_API}/v1",
            "kind": "GatewayClass",
            "metadata": {"name": gateway_class},
            "spec": {"controllerName": CONTROLLER_NAME},
        }
    )
    cluster.apply(
        {
            "apiVersion": f"{GATEWAY_API}/v1",
            "kind": "Gateway",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "gatewayClassName": gateway_class,
                "listeners": [
                    {
                        "name": gateway.listener,
                        "protocol": "HTTP",
                        "port": traefik.web_port,
                        "allowedRoutes": {"namespaces": {"from": "All"}},
                    }
                ],
            },
        }
    )

    def programmed() -> dict[str, dict[str, Any]] | None:
        obj = cluster.kubectl_json("get", "gateway", name, namespace=namespace)
        found = conditions_by_type(obj.get("status", {}).get("conditions"))
        current = obj["metadata"]["generation"]
        ok = all(
            found.get(kind, {}).get("status") == "True"
            and found[kind].get("observedGeneration") == current
            for kind in ("Accepted", "Programmed")
        )
        return found if ok else None

    _wait(
        programmed,
        f"Gateway {namespace}/{name} is not Accepted and Programmed (Traefik's log: "
        f"{traefik.log_path})",
        timeout,
    )
    return gateway


def _wait(check: Callable[[], T | None], what: str, timeout: float) -> T:
    """Poll ``check`` every 100 ms until it returns a value; raise TraefikError naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        if (value := check()) is not None:
            return value
        if time.monotonic() > deadline:
            raise TraefikError(f"{what} after {timeout:.0f}s")
        time.sleep(0.1)
