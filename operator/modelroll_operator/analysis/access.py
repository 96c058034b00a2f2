"""What a canary's analysis may read: the URLs and the gateway namespace that
``spec.analysis.metrics`` names are held to the version's own namespace, unless the operator's
flags allow more.

The operator reads with its own network position and, for gateway pods, its cluster-wide right
to list pods, on behalf of whoever may write a ModelVersion. So by default an analysis reads
only what its namespace holds:

- a URL (``gateway.url``, ``prometheus.url``) whose host is a Service of the version's
  namespace, written ``<service>.<namespace>.svc`` or ``<service>.<namespace>.svc.cluster.local``
  (a shorter name would be resolved in the operator's own namespace first), and which is not
  of type ExternalName (a DNS alias can name any host): the reader checks that on the API
  server (:meth:`..reader.MetricsReader.read`);
- the gateway pods of the version's namespace.

``--analysis-url-prefix`` and ``--analysis-gateway-namespace`` (the chart's
``operator.analysis`` values) let the platform team allow more: a Prometheus in ``monitoring``,
a shared gateway namespace. A refusal names the field and the flag; it says nothing about what
the refused place holds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from yarl import URL

URL_FLAG = "--analysis-url-prefix"
NAMESPACE_FLAG = "--analysis-gateway-namespace"
SCHEMES = ("http", "https")
SERVICE_DOMAINS = ("svc", "svc.cluster.local")
"""What follows ``<service>.<namespace>.`` in the host of a URL that names a Service."""


class RefusedSource(ValueError):
    """A URL or namespace that the operator may not read for this version; the message names
    the field and the flag that would allow it."""


def parse_url(text: str) -> URL:
    """An absolute http(s) URL with a host and no credentials, as aiohttp will request it;
    raises ValueError saying what it lacks."""
    try:
        url = URL(text)
    except ValueError as exc:
        raise ValueError(f"{text} is not a URL") from exc
    if url.scheme not in SCHEMES or not url.host:
        raise ValueError(f"{text} is not an http(s) URL with a host")
    if url.user is not None or url.password is not None:
        raise ValueError(f"{text} carries credentials")
    if url.query_string or url.fragment:
        raise ValueError(f"{text} has a query or a fragment")
    return url


@dataclass(frozen=True)
class ReadAccess:
    """The operator's allowances beyond a version's own namespace (none by default)."""

    url_prefixes: tuple[URL, ...] = ()
    """URLs under one of these may be read (``--analysis-url-prefix``): same scheme and host,
    the same port unless the prefix names none, and a path at or under the prefix's."""
    gateway_namespaces: tuple[str, ...] = ()
    """Namespaces besides the version's own whose gateway pods may be read
    (``--analysis-gateway-namespace``)."""

    @classmethod
    def of(cls, url_prefixes: Iterable[str] = (), namespaces: Iterable[str] = ()) -> ReadAccess:
        """From the flags' values; raises ValueError for a prefix that is no http(s) URL."""
        return cls(tuple(parse_url(p) for p in url_prefixes), tuple(namespaces))

    def check_url(self, field: str, text: str, namespace: str) -> str | None:
        """The Service of ``namespace`` that the URL ``text`` must name for the version in
        ``namespace`` to read it (None: a prefix allows it as it is); raises RefusedSource."""
        try:
            url = parse_url(text)
        except ValueError as exc:
            raise RefusedSource(f"{field}: {exc}") from None
        if any(_under(url, prefix) for prefix in self.url_prefixes):
            return None
        name = service_name(url.host or "", namespace)
        if name is None:
            raise RefusedSource(
                f"{field} {text} names no Service of namespace {namespace} (write its host as "
                f"<service>.{namespace}.svc), and the operator's {URL_FLAG} allows no prefix of it"
            )
        return name

    def check_namespace(self, field: str, where: str, namespace: str) -> None:
        """Raise RefusedSource unless a version in ``namespace`` may read gateway pods of
        ``where``."""
        if where != namespace and where not in self.gateway_namespaces:
            raise RefusedSource(
                f"{field} {where} is not this version's namespace ({namespace}), and the "
                f"operator's {NAMESPACE_FLAG} does not list it"
            )


def service_name(host: str, namespace: str) -> str | None:
    """The Service that ``host`` names in ``namespace`` (``<service>.<namespace>.svc``, with or
    without ``.cluster.local``, and a final dot), or None."""
    name, dot, rest = host.lower().removesuffix(".").partition(".")
    if dot and name and rest in (f"{namespace}.{domain}" for domain in SERVICE_DOMAINS):
        return name
    return None


def _under(url: URL, prefix: URL) -> bool:
    if (url.scheme, url.host) != (prefix.scheme, prefix.host):
        return False
    if prefix.explicit_port is not None and url.port != prefix.port:
        return False
    base = prefix.raw_path.rstrip("/")
    return url.raw_path == base or url.raw_path.startswith(base + "/")
