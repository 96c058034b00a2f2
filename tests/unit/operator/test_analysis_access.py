"""What a canary's analysis may read: Services of its own namespace, and what the operator's
flags allow besides (analysis/access.py)."""

from __future__ import annotations

import pytest

from modelroll_operator.analysis.access import ReadAccess, RefusedSource

FIELD = "spec.analysis.metrics.prometheus.url"


@pytest.mark.parametrize(
    ("url", "service"),
    [
        ("http://prometheus.prod.svc:9090", "prometheus"),
        ("https://prometheus.prod.svc.cluster.local/", "prometheus"),
        ("http://Gateway.PROD.svc.:8080/metrics", "gateway"),
    ],
)
def test_a_service_of_the_versions_namespace_may_be_read(url: str, service: str) -> None:
    assert ReadAccess().check_url(FIELD, url, "prod") == service


@pytest.mark.parametrize(
    "url",
    [
        "http://prometheus:9090",  # resolved in the operator's own namespace first
        "http://prometheus.prod:9090",  # resolved through the operator's search path
        "http://prometheus.monitoring.svc:9090",  # another namespace's
        "http://prometheus.prod.svc.evil.example/",  # a host outside the cluster
        "http://pod.subdomain.prod.svc/",  # a pod's name, not a Service's
        "http://169.254.169.254/latest/meta-data/",
        "http://10.96.0.1:443/",
        "http://[::1]:9090/",
        "http://user:secret@prometheus.prod.svc/",
        "http://prometheus.prod.svc/?redirect=x",
        "file:///etc/passwd",
        "not a url",
    ],
)
def test_any_other_url_is_refused_by_default(url: str) -> None:
    with pytest.raises(RefusedSource, match=FIELD):
        ReadAccess().check_url(FIELD, url, "prod")


@pytest.mark.parametrize(
    ("prefix", "url", "allowed"),
    [
        ("http://prometheus.monitoring.svc:9090/", "http://prometheus.monitoring.svc:9090", True),
        ("http://prometheus.monitoring.svc:9090", "http://prometheus.monitoring.svc:9090/x", True),
        ("http://prometheus.monitoring.svc:9090", "http://prometheus.monitoring.svc:9091/", False),
        ("http://prometheus.monitoring.svc:9090", "https://prometheus.monitoring.svc:9090/", False),
        (
            "http://prometheus.monitoring.svc",
            "http://prometheus.monitoring.svc.evil.example/",
            False,
        ),
        ("http://prometheus.monitoring.svc", "http://prometheus.monitoring.svc:9090/", True),
        ("http://127.0.0.1", "http://127.0.0.1:80@evil.example/", False),
        ("http://thanos.example/prom/", "http://thanos.example/prom", True),
        ("http://thanos.example/prom/", "http://thanos.example/prom/api", True),
        ("http://thanos.example/prom/", "http://thanos.example/prometheus", False),
        ("http://thanos.example/prom/", "http://thanos.example/prom/../admin", False),
    ],
)
def test_a_prefix_allows_the_urls_under_it(prefix: str, url: str, allowed: bool) -> None:
    """Same scheme and host, the same port unless the prefix names none, a path at or under
    the prefix's: a prefix is compared part by part, never as text."""
    access = ReadAccess.of([prefix])
    if allowed:
        assert access.check_url(FIELD, url, "prod") is None
    else:
        with pytest.raises(RefusedSource):
            access.check_url(FIELD, url, "prod")


def test_a_prefix_that_is_no_http_url_is_refused() -> None:
    for prefix in ("127.0.0.1", "http://", "http://a:b@host/", "ftp://host/"):
        with pytest.raises(ValueError, match=r"URL|credentials"):
            ReadAccess.of([prefix])
