"""Gateway settings: one frozen dataclass, filled from flags and MODELROLL_* env by cli.py."""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network
from pathlib import Path

from modelroll_common.metric_names import GATEWAY_ADMIN_PORT
from modelroll_common.routes import CONFIGMAP_NAME

Network = IPv4Network | IPv6Network

DEFAULT_TRUSTED_NETWORKS = ""
"""None. Every address a default could name is some proxy's in a pod: Istio's sidecar hands
each inbound connection to the gateway from 127.0.0.6, an authenticating proxy or another mesh's
proxy in the gateway's pod connects from 127.0.0.1, and so does `kubectl port-forward`. A
default network would trust every client such a proxy forwards; the platform names its own."""

DEFAULT_COHORT_KEY_BUDGET = 10
"""Judged requests a cohort key a minute: a tenth of a step's default minRequests (100), half
the guardrail's (20), and more than most users send."""
DEFAULT_SERIES_GRACE = 600.0
"""Seconds a version's series outlive its place in the route: twice the usual 5-minute rate()
window, so that Prometheus and the analyses have its last counts."""
DEFAULT_SHADOW_MAX_COMPARE_BYTES = 1 << 20
"""An answer over 1 MiB is not compared: parsing 1 MiB of JSON takes about 15 ms, with the
interpreter's lock held (128 vectors of 384 floats take 1 MB)."""


def parse_networks(text: str) -> tuple[Network, ...]:
    """A comma-separated list of CIDR networks (a bare address is one host); empty: none.
    Host bits set (`10.1.2.3/8`) are refused rather than widened to the network silently."""
    # ip_network's messages name the item: "10.1.2.3/8 has host bits set".
    return tuple(ip_network(item) for item in (p.strip() for p in text.split(",")) if item)


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """What a gateway process needs. Routes come from `routes_file` if set, else the API server."""

    host: str = "0.0.0.0"
    port: int = 8080
    admin_port: int = GATEWAY_ADMIN_PORT
    """Where GET /metrics and GET /v1/routes are served (on `host` too), for the scraper and
    the operator; never on `port`, which clients reach. 0: nowhere."""
    namespace: str | None = None
    """Namespace of the routes ConfigMap; None: the service account's, else the kubeconfig's."""
    configmap: str = CONFIGMAP_NAME
    routes_file: Path | None = None
    """A JSON file (or a mounted ConfigMap directory) read instead of watching the API."""
    routes_poll_seconds: float = 0.25
    """How often the routes file is checked for changes."""
    kubeconfig: Path | None = None
    """None: $KUBECONFIG, else the in-cluster service account."""
    upstream_timeout: float = 30.0
    """Seconds for a whole upstream exchange; past it the gateway answers 504. On the OpenAI
    paths, the longest a stream's version may be silent, its headers included."""
    generation_timeout: float = 600.0
    """Seconds for a whole answer not streamed on the OpenAI paths (a generation sends nothing
    until it is done); past it 504. 10 minutes: the official OpenAI clients' own timeout."""
    connect_timeout: float = 2.0
    """Seconds to open a connection to a sidecar; past it the gateway answers 502."""
    upstream_connection_max_age: float = 10.0
    """Seconds a kept-alive connection to a sidecar is reused. A version's Service balances
    connections, not requests, so new replicas get their share only from new connections."""
    upstream_max_connections: int = 100
    """Connections per version at most; further requests wait for one (until their deadline)."""
    shadow_max_in_flight: int = 64
    """Shadow copies open at once at most; a copy beyond it is dropped (and counted)."""
    shadow_max_compare_bytes: int = DEFAULT_SHADOW_MAX_COMPARE_BYTES
    """A shadow copy whose answer, or the client's, is larger is not compared (and counted)."""
    cohort_key_budget: int = DEFAULT_COHORT_KEY_BUDGET
    """Requests routed by one cohort key that a canary analysis judges, per key a minute; the
    rest are counted as routing="cohort_over_budget". 0: none."""
    series_grace_seconds: float = DEFAULT_SERIES_GRACE
    """Seconds a version's series are still exported once it is out of its model's route."""
    max_body_bytes: int = 1024 * 1024
    """Largest request body accepted; larger ones get 413."""
    read_timeout: float = 30.0
    """Seconds a client has to send its whole request, from its first byte (a new connection:
    from connecting); past it the gateway answers 408 and closes the connection."""
    watch_timeout_seconds: int = 300
    """How long one watch request lasts before it is renewed (the server ends it then)."""
    trusted_networks: tuple[Network, ...] = parse_networks(DEFAULT_TRUSTED_NETWORKS)
    """Clients whose version header pins a version; judged by the connection's peer address,
    never by a header. Another client's header is ignored (its request routed by weight)."""
    pins_from_any_client: bool = False
    """Let every client pin any version of a route, a weight-0 one too, and tell a version's
    name from a guess by the answer (404 for a guess). Off: only `trusted_networks` pin."""

    def trusts(self, address: str | None) -> bool:
        """Whether a peer at `address` (aiohttp's `request.remote`) is in `trusted_networks`; an
        IPv4 client of a dual-stack listener (`::ffff:10.0.0.1`) counts as its IPv4 address."""
        if not address:
            return False
        try:
            peer = ip_address(address)
        except ValueError:
            return False
        if isinstance(peer, IPv6Address) and peer.ipv4_mapped is not None:
            peer = peer.ipv4_mapped
        return any(peer in network for network in self.trusted_networks)

    def __post_init__(self) -> None:
        for name, port in (("port", self.port), ("admin_port", self.admin_port)):
            if not 0 <= port <= 65535:
                raise ValueError(f"{name} {port} is outside 0..65535")
        if self.admin_port and self.admin_port == self.port:
            raise ValueError(f"--admin-port must differ from --port, got {self.port} for both")
        timeouts = (self.upstream_timeout, self.generation_timeout, self.connect_timeout)
        if min(*timeouts, self.read_timeout) <= 0:
            raise ValueError("timeouts must be positive")
        if self.upstream_connection_max_age <= 0:
            raise ValueError("upstream_connection_max_age must be positive")
        if self.upstream_max_connections <= 0:
            raise ValueError("upstream_max_connections must be positive")
        if self.shadow_max_in_flight <= 0:
            raise ValueError("shadow_max_in_flight must be positive")
        if self.shadow_max_compare_bytes <= 0:
            raise ValueError("shadow_max_compare_bytes must be positive")
        if self.cohort_key_budget < 0:
            raise ValueError("cohort_key_budget must not be negative")
        if self.series_grace_seconds <= 0:
            raise ValueError("series_grace_seconds must be positive")
        if self.max_body_bytes <= 0:
            raise ValueError("max_body_bytes must be positive")
        if self.routes_poll_seconds <= 0:
            raise ValueError("routes_poll_seconds must be positive")
        if self.watch_timeout_seconds <= 0:
            raise ValueError("watch_timeout_seconds must be positive")
