"""The e2e scenario against a real cluster (``make e2e-kind``): the chart's operator and gateway,
managed versions running as pods, and the cluster's Prometheus.

hack/kind/e2e.sh installs the chart with monitoring on, trusting the pins of clients on the
gateway pod's loopback (where ``kubectl port-forward`` arrives), then reaches the gateway, its
admin port and Prometheus through ``kubectl port-forward`` and names them here through the
environment:

| variable | meaning | default |
|---|---|---|
| ``MODELROLL_KUBECONFIG`` | the cluster (selects this mode) | unset: local stack |
| ``MODELROLL_E2E_NAMESPACE`` | the release namespace (the versions go there) | ``modelroll`` |
| ``MODELROLL_E2E_RELEASE`` | the chart's release name | ``modelroll`` |
| ``MODELROLL_E2E_GATEWAY_URL`` | the gateway, port-forwarded | ``http://127.0.0.1:18080`` |
| ``MODELROLL_E2E_GATEWAY_ADMIN_URL`` | its admin port, forwarded | ``http://127.0.0.1:18090`` |
| ``MODELROLL_E2E_PROMETHEUS_URL`` | Prometheus, port-forwarded | ``http://127.0.0.1:19090`` |

The versions are the managed examples (examples/managed/), renamed to the story's stable-v1 and
canary-v2 at weights 9 and 1, one replica each, the canary's demo model failing 20% of items.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from modelroll_devcluster import Cluster
from modelroll_devcluster.prometheus import PrometheusAPI
from modelroll_devcluster.stack import CONFIGMAP, MODEL, get_json, venv_script

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "managed"
STORY = {  # version -> (example it is made from, weight, demo model's error rate)
    "stable-v1": ("sentiment-stable.yaml", 9, 0.0),
    "canary-v2": ("sentiment-canary.yaml", 1, 0.2),
}


def managed_manifest(name: str) -> dict[str, Any]:
    example, weight, error_rate = STORY[name]
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / example).read_text())
    doc["metadata"] = {"name": name}
    spec = doc["spec"]
    spec["model"] = MODEL
    spec["weight"] = weight
    spec["replicas"] = 1
    args = [a for a in spec["server"]["args"] if not a.startswith("--error-rate")]
    spec["server"]["args"] = [*args, f"--error-rate={error_rate}"]
    return doc


@dataclass
class InCluster:
    cluster: Cluster
    namespace: str
    release: str
    gateway_url: str
    gateway_admin_url: str
    """The gateway's admin port: GET /metrics and GET /v1/routes."""
    prometheus_url: str
    settle_s: float = 240.0
    install_seconds: float | None = None
    """How long ``helm install --wait`` took, when the test session installed the chart."""
    _killed: list[str] = field(default_factory=list)

    @classmethod
    def from_env(cls, cluster: Cluster) -> InCluster:
        env = os.environ.get
        return cls(
            cluster,
            namespace=env("MODELROLL_E2E_NAMESPACE", "modelroll"),
            release=env("MODELROLL_E2E_RELEASE", "modelroll"),
            gateway_url=env("MODELROLL_E2E_GATEWAY_URL", "http://127.0.0.1:18080"),
            gateway_admin_url=env("MODELROLL_E2E_GATEWAY_ADMIN_URL", "http://127.0.0.1:18090"),
            prometheus_url=env("MODELROLL_E2E_PROMETHEUS_URL", "http://127.0.0.1:19090"),
        )

    @property
    def operator_selector(self) -> str:
        return f"app.kubernetes.io/instance={self.release},app.kubernetes.io/component=operator"

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl(*args, namespace=self.namespace, input=input, check=check)

    def manifests_yaml(self) -> str:
        return yaml.safe_dump_all([managed_manifest(n) for n in STORY], sort_keys=False)

    def plugin(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        argv = [
            venv_script("kubectl-modelroll"),
            f"--kubeconfig={self.cluster.kubeconfig}",
            f"--namespace={self.namespace}",
            *args,
        ]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=True)

    def routes(self) -> dict[str, Any]:
        doc = get_json(f"{self.gateway_admin_url}/v1/routes")
        return {m["model"]: m for m in doc["models"]}

    def configmap_data(self) -> dict[str, str]:
        result = self.kubectl("get", "configmap", CONFIGMAP, "-o", "json", check=False)
        data: dict[str, str] = json.loads(result.stdout).get("data") or {} if result.stdout else {}
        return data

    def _operator_pods(self) -> list[str]:
        out = self.kubectl("get", "pods", "-l", self.operator_selector, "-o", "name").stdout
        return out.split()

    def kill_operator(self) -> None:
        """Delete the operator's pod at once (no grace period), as a node failure would."""
        self._killed = self._operator_pods()
        self.kubectl("delete", *self._killed, "--grace-period=0", "--force", "--wait=false")

    def start_operator(self) -> object:
        """The Deployment starts a new pod by itself: wait until it is Ready."""
        deadline = time.monotonic() + 180
        while not (new := [p for p in self._operator_pods() if p not in self._killed]):
            if time.monotonic() > deadline:
                raise TimeoutError("no new operator pod within 180 s")
            time.sleep(0.5)
        self.kubectl("wait", "--for=condition=Ready", *new, "--timeout=180s")
        return new

    def prometheus_api(self) -> PrometheusAPI:
        return PrometheusAPI(self.prometheus_url)

    def log_tails(self) -> str:
        out = self.kubectl("logs", "-l", self.operator_selector, "--tail=30", check=False)
        return out.stdout + out.stderr

    def cleanup(self) -> None:
        """Delete the story's versions (the operator removes their routes and workloads)."""
        self.kubectl(
            "delete", "modelversions", *STORY, "--ignore-not-found", "--timeout=60s", check=False
        )
