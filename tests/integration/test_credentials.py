"""How the operator and the gateway get their credentials, as real processes.

- With a pod's identity (credentials.PodIdentity): the service account's token, CA and namespace
  at /var/run/secrets/kubernetes.io/serviceaccount and KUBERNETES_SERVICE_HOST/PORT, with no
  kubeconfig anywhere. The token file is then rewritten while they run and the old token
  revoked; both must carry on without a restart.
- With a kubeconfig whose exec credential plugin fails: each exits at once, naming the plugin.
  (Working exec plugins: test_operator.py, test_gateway_watch.py and test_plugin.py.)
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from modelroll_devcluster import Cluster
from tests.support.apiserver import OperatorProcess, Routes, eventually, model_version
from tests.support.credentials import (
    PodIdentity,
    cluster_admin,
    credential_plugin,
    exec_kubeconfig,
    service_account_token,
    token_accepted,
)
from tests.support.processes import VENV_BIN, Spawn, free_port

pytestmark = pytest.mark.integration

TOKEN_REREAD = 60.0
"""The client re-reads the token file once its copy is this old (kubernetes.config's period);
the kubelet rotates a projected token long before it expires, at 80% of its life."""


def gateway_weights(admin_port: int, model: str) -> dict[str, int] | None:
    """The weights the gateway routes `model` by, from GET /v1/routes on its admin port."""
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/v1/routes", timeout=5) as resp:
        doc = json.load(resp)
    for item in doc["models"]:
        if item["model"] == model:
            return {v["name"]: v["weight"] for v in item["versions"]}
    return None


def gateway_source(admin_port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/v1/routes", timeout=5) as resp:
        return str(json.load(resp)["source"])


@pytest.mark.timeout(300)  # it waits a minute for the client's token re-read
def test_in_cluster_credentials_and_a_rotated_token_need_no_restart(
    cluster: Cluster, namespace: str, crd: None, spawn: Spawn, routes: Routes, tmp_path: Path
) -> None:
    if not cluster.is_local:
        pytest.skip("dropping every watch (an API server restart) needs the local control plane")
    with cluster_admin(cluster, namespace) as account:
        first = service_account_token(cluster, namespace, account, bound_to="first-token")
        pod = PodIdentity.create(cluster, tmp_path / "serviceaccount", namespace, first)
        in_pod = {"prefix": pod.prefix(), "env": pod.env(home=tmp_path)}
        gateway_port, admin_port = free_port(), free_port()
        liveness = f"http://127.0.0.1:{free_port()}/healthz"
        # No --kubeconfig, and no --namespace for the gateway: the service account's namespace.
        gateway = spawn(
            "modelroll-gateway",
            f"--port={gateway_port}",
            f"--admin-port={admin_port}",
            ready=f"http://127.0.0.1:{gateway_port}/readyz",
            **in_pod,
        )
        flags = [
            f"--namespace={namespace}",
            f"--liveness={liveness}",
            "--metrics-port=0",
            "--sidecar-image=s:test",
        ]
        operator = OperatorProcess(
            spawn("modelroll-operator", *flags, ready=liveness, **in_pod), liveness
        )
        loaded = time.monotonic()  # both have read the token file by now
        assert gateway_source(admin_port) == f"configmap {namespace}/modelroll-routes"

        endpoint = "http://stable-v1.example:8000"
        cluster.apply(
            model_version("stable-v1", "sentiment", weight=3, endpoint=endpoint),
            namespace=namespace,
        )
        eventually(lambda: gateway_weights(admin_port, "sentiment") == {"stable-v1": 3}, "routing")
        assert operator.logged("Initial authentication has finished")

        # The kubelet's rotation: a new token in the file; here the old one is also revoked.
        second = service_account_token(cluster, namespace, account, bound_to="second-token")
        pod.write_token(second)
        cluster.kubectl("delete", "secret", "first-token", namespace=namespace)
        eventually(lambda: not token_accepted(cluster, first), "the first token's revocation")
        time.sleep(max(0.0, loaded + TOKEN_REREAD + 1.0 - time.monotonic()))
        # Every connection (kopf's watches, the gateway's) must now start again, and
        # authenticate with whatever token each process holds.
        cluster.restart_apiserver()

        cluster.kubectl(
            "patch",
            "mv",
            "stable-v1",
            "--type=merge",
            "-p",
            '{"spec": {"weight": 5}}',
            namespace=namespace,
        )
        eventually(
            lambda: gateway_weights(admin_port, "sentiment") == {"stable-v1": 5},
            "the new weight through the operator and the gateway",
            within=60.0,
        )
        assert operator.running()
        assert gateway.popen.poll() is None
        # While the operator runs, so that it releases its finalizer.
        cluster.kubectl("delete", "mv", "stable-v1", "--timeout=30s", namespace=namespace)


@pytest.mark.parametrize("command", ["modelroll-gateway", "modelroll-operator"])
def test_a_failing_exec_plugin_is_named(command: str, cluster: Cluster, tmp_path: Path) -> None:
    failing = credential_plugin(tmp_path / "no-token", None)
    kubeconfig = exec_kubeconfig(cluster, tmp_path / "failing.kubeconfig", failing)
    result = subprocess.run(
        [str(VENV_BIN / command), f"--kubeconfig={kubeconfig}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert f"the kubeconfig's exec credential plugin '{failing}' gave no token" in result.stderr
    assert "no credentials for you" in result.stderr  # the plugin's own words, from the client
