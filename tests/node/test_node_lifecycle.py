"""``make cluster-up NODE=1`` / ``make cluster-down`` as a person runs them: a node that runs pods
whose names resolve, and nothing left on the host afterwards, twice in a row.

This file runs before the session's ``node_cluster`` starts (conftest.py puts its tests first,
and pytest starts a session fixture when it is first used): two nodes cannot share one host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from modelroll_devcluster import nodehost
from modelroll_devcluster.controlplane import default_bin_dir, pid_alive
from modelroll_devcluster.node import NODE_NAME

pytestmark = pytest.mark.node

CLI = [sys.executable, "-m", "modelroll_devcluster.cli"]
#: A pod that resolves a Service's name through cluster DNS and exits 0 when it does.
PROBE = (
    "import socket; "
    "print(socket.gethostbyname('kubernetes.default.svc.cluster.local'), "
    "socket.gethostbyname('kube-dns.kube-system'))"
)


def cli(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "--dir", str(directory), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def kubectl(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(default_bin_dir() / "kubectl"), f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.mark.timeout(600)
@pytest.mark.parametrize("run", [1, 2])
def test_cluster_up_with_a_node_runs_pods_with_dns_and_down_leaves_nothing(
    run: int, tmp_path: Path
) -> None:
    if os.environ.get("MODELROLL_KUBECONFIG"):
        pytest.skip("starts a local node; MODELROLL_KUBECONFIG names another cluster")
    directory = tmp_path / "cluster"
    assert nodehost.leftovers(directory / "node") == []
    up = cli(directory, "up", "--node", "--bin-dir", str(default_bin_dir()))
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        kubeconfig = directory / "kubeconfig"
        node = json.loads(kubectl(kubeconfig, "get", "node", NODE_NAME, "-o", "json").stdout)
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
        assert ready == "True"
        assert not node["spec"].get("taints"), node["spec"]["taints"]

        started = kubectl(
            kubeconfig,
            "run",
            "dns-probe",
            "--restart=Never",
            "--image=ghcr.io/modelroll/modelroll-sidecar:0.1.0",
            "--image-pull-policy=Never",
            "--command",
            "--",
            "python3",
            "-c",
            PROBE,
        )
        assert started.returncode == 0, started.stderr
        done = kubectl(
            kubeconfig,
            "wait",
            "pod/dns-probe",
            "--for=jsonpath={.status.phase}=Succeeded",
            "--timeout=120s",
        )
        logs = kubectl(kubeconfig, "logs", "dns-probe")  # through the kubelet
        assert done.returncode == 0, f"{done.stderr} {logs.stdout} {logs.stderr}"
        assert logs.stdout.split() == ["10.0.0.1", "10.0.0.10"]
        state = json.loads((directory / "state.json").read_text())
        assert {"containerd", "kubelet", "kube-proxy", "kube-scheduler"} <= set(state["pids"])
    finally:
        down = cli(directory, "down")
    assert down.returncode == 0, down.stderr
    assert not [name for name, pid in state["pids"].items() if pid_alive(pid)]
    assert nodehost.leftovers(directory / "node") == []
