"""Builders for ModelVersion bodies and snapshots, shared by the operator's unit tests."""

from __future__ import annotations

from typing import Any

from modelroll_operator.snapshots import VersionInfo
from modelroll_operator.spec import API_VERSION, KIND


def mv_body(
    name: str = "canary-v2",
    *,
    model: str = "sentiment",
    namespace: str = "prod",
    uid: str = "uid-1",
    generation: int = 1,
    labels: dict[str, str] | None = None,
    status: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A ModelVersion body; ``spec`` keys are the CRD's (weight, server, endpoint, batching)."""
    if "server" not in spec and "endpoint" not in spec:
        spec["server"] = {"image": "ghcr.io/acme/sentiment:1.4", "port": 8080}
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "generation": generation,
            "labels": labels or {},
        },
        "spec": {"model": model, **spec},
        "status": status or {},
    }


def version(name: str = "canary-v2", **kwargs: Any) -> VersionInfo:
    info = VersionInfo.from_body(mv_body(name, **kwargs))
    assert info is not None
    return info
