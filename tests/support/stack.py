"""The e2e scenario's view of a running stack, local or in a cluster: what it needs of one
(``Rollout``), its metrics, polling, and a version's canary manifest and analysis status."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from modelroll_devcluster.processes import http_get
from modelroll_devcluster.prometheus import PrometheusAPI
from modelroll_devcluster.stack import Stack

T = TypeVar("T")


class Rollout(Protocol):
    """What the scenario needs of a running stack, local or in a cluster."""

    namespace: str
    gateway_url: str
    settle_s: float
    """How long versions may take to become routable (pods starting, in a real cluster)."""

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]: ...

    def manifests_yaml(self) -> str: ...

    def plugin(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]: ...

    def routes(self) -> dict[str, Any]: ...

    def configmap_data(self) -> dict[str, str]: ...

    def kill_operator(self) -> None: ...

    def start_operator(self) -> object: ...

    def prometheus_api(self) -> PrometheusAPI: ...

    def log_tails(self) -> str: ...


def metric(url: str, sample: str, **labels: str) -> float:
    """The sum of the samples named ``sample`` with those labels at ``url`` (Prometheus text)."""
    status, body = http_get(url)
    assert status == 200, body
    return sum(
        s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
        if s.name == sample and labels.items() <= s.labels.items()
    )


def gateway_metric(stack: Stack, sample: str, **labels: str) -> float:
    """A sample of the stack's gateway's /metrics, on its admin port (summed over the labels not
    given)."""
    return metric(f"{stack.gateway_admin_url}/metrics", sample, **labels)


def eventually(check: Callable[[], T | None], what: str, within: float) -> T:
    """Poll ``check`` every 50 ms until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {within:g}s; last saw: {value!r}")
        time.sleep(0.05)


def canary_manifest(stack: Stack, name: str, analysis: dict[str, Any]) -> str:
    """The ModelVersion of the stack's version ``name`` at weight 0, with ``analysis`` reading
    the gateway's /metrics (on its admin port)."""
    manifest = stack.manifest(name, weight=0)
    metrics = {"gateway": {"url": f"{stack.gateway_admin_url}/metrics"}}
    manifest["spec"]["analysis"] = {"metrics": metrics, **analysis}
    return yaml.safe_dump(manifest)


def analysis_of(stack: Stack, name: str) -> dict[str, Any]:
    """The version's ``status.analysis`` (empty before it has one)."""
    out = stack.kubectl("get", "mv", name, "-o", "json").stdout
    status: dict[str, Any] = json.loads(out).get("status") or {}
    found: dict[str, Any] = status.get("analysis") or {}
    return found


def wait_condition_of(stack: Stack, name: str, kind: str, within: float) -> None:
    """kubectl wait for the version's condition, as a user would."""
    result = stack.kubectl(
        "wait",
        f"--for=condition={kind}",
        f"--timeout={within:g}s",
        f"mv/{name}",
        check=False,
        timeout=within + 30,
    )
    assert result.returncode == 0, (
        f"{kind} not True: {analysis_of(stack, name)}\n{stack.log_tails()}"
    )


StartLocal = Callable[..., Stack]
