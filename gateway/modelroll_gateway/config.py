"""Gateway settings: one frozen dataclass, filled from flags and MODELROLL_* env by cli.py."""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network
from pathlib import Path

from modelroll_common.routes import CONFIGMAP_NAME

Network = IPv4Network | IPv6Network

DEFAULT_TRUSTED_NETWORKS = "127.0.0.0/8,::1/128"
"""Loopback only: the gateway's own host, and `kubectl port-forward`, whose connections reach
the pod from its own loopback."""

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
    """Clients allowed GET /v1/routes (the versions' internal endpoints), and pins when
    `pin_trusted_only`; judged by the connection's peer address, never by a header."""
    pin_trusted_only: bool = False
    """Ignore the version header of clients outside `trusted_networks` (route them by weight).
    Off by default: any client may pin, a weight-0 version too."""

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
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port {self.port} is outside 0..65535")
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
