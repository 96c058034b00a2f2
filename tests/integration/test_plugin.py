"""`kubectl modelroll`: status, set-weight, promote and rollback against a running operator."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from modelroll_devcluster import Cluster
from tests.integration.credentials import credential_plugin, exec_kubeconfig
from tests.integration.operator_support import (
    Routes,
    StartOperator,
    eventually,
    model_version,
)

pytestmark = pytest.mark.integration

VENV_BIN = Path(sys.executable).parent


def run(
    cluster: Cluster, namespace: str, *args: str, via_kubectl: bool = False
) -> subprocess.CompletedProcess[str]:
    """The plugin as a person runs it: with the cluster's KUBECONFIG and -n <namespace>."""
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    if via_kubectl:  # kubectl finds kubectl-modelroll on PATH
        env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
        argv = [str(cluster.kubectl_path), "modelroll", "-n", namespace, *args]
    else:
        argv = [str(VENV_BIN / "kubectl-modelroll"), "-n", namespace, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=90, env=env, check=False)


def table(output: str) -> list[list[str]]:
    return [line.split() for line in output.strip().splitlines()]


@pytest.fixture
def versions(
    cluster: Cluster, namespace: str, start_operator: StartOperator, routes: Routes
) -> Routes:
    """stable-v1 (weight 9) and canary-v2 (weight 1) of model sentiment, routed."""
    start_operator()
    for name, weight in (("stable-v1", 9), ("canary-v2", 1)):
        manifest = model_version(name, "sentiment", weight=weight, endpoint=f"http://{name}:8000")
        cluster.apply(manifest, namespace=namespace)
    eventually(lambda: routes.weights("sentiment") == {"canary-v2": 1, "stable-v1": 9}, "routed")
    eventually(
        lambda: "90.0%" in run(cluster, namespace, "status").stdout, "shares in the status table"
    )
    return routes


def annotations_of(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    meta = cluster.kubectl_json("get", "mv", name, namespace=namespace)["metadata"]
    return dict(meta.get("annotations") or {})


def test_status_is_a_table_of_each_models_versions(
    cluster: Cluster, namespace: str, versions: Routes
) -> None:
    cluster.apply(model_version("t1", "translate", weight=2, endpoint="http://t1:8000"), namespace)
    eventually(lambda: versions.weights("translate") == {"t1": 2}, "translate routed")
    eventually(lambda: "100.0%" in run(cluster, namespace, "status").stdout, "t1's share")
    result = run(cluster, namespace, "status", via_kubectl=True)
    assert result.returncode == 0, result.stderr
    assert table(result.stdout) == [
        ["MODEL", "VERSION", "WEIGHT", "SHARE", "READY", "ROUTED", "ENDPOINT"],
        ["sentiment", "canary-v2", "1", "10.0%", "True", "Routed", "http://canary-v2:8000"],
        ["sentiment", "stable-v1", "9", "90.0%", "True", "Routed", "http://stable-v1:8000"],
        ["translate", "t1", "2", "100.0%", "True", "Routed", "http://t1:8000"],
    ]
    only = table(run(cluster, namespace, "status", "translate").stdout)
    assert [row[1] for row in only[1:]] == ["t1"]


def test_promote_moves_all_traffic_and_rollback_restores_it(
    cluster: Cluster, namespace: str, versions: Routes
) -> None:
    result = run(cluster, namespace, "promote", "canary-v2")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == [
        "modelversion/canary-v2 weight 1 -> 10",
        "modelversion/stable-v1 weight 9 -> 0",
    ]
    # By the time promote returns, the operator has routed it.
    assert versions.weights("sentiment") == {"canary-v2": 10, "stable-v1": 0}
    assert ["sentiment", "canary-v2", "10", "100.0%", "True", "Routed"] in [
        row[:6] for row in table("\n".join(lines[2:]))
    ]
    assert annotations_of(cluster, namespace, "stable-v1")["modelroll.io/previous-weight"] == "9"
    # No workload was touched: promote is a patch of ModelVersions only.
    assert cluster.kubectl_json("get", "deploy,rs,pods", namespace=namespace)["items"] == []

    again = run(cluster, namespace, "promote", "canary-v2")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("Nothing to change in model sentiment.")

    back = run(cluster, namespace, "rollback", "canary-v2")
    assert back.returncode == 0, back.stderr
    assert back.stdout.splitlines()[:2] == [
        "modelversion/stable-v1 weight 0 -> 9",
        "modelversion/canary-v2 weight 10 -> 0",
    ]
    assert versions.weights("sentiment") == {"canary-v2": 0, "stable-v1": 9}
    assert "modelroll.io/previous-weight" not in annotations_of(cluster, namespace, "stable-v1")


def test_set_weight_patches_one_version_and_reports_what_the_api_server_refuses(
    cluster: Cluster, namespace: str, versions: Routes
) -> None:
    result = run(cluster, namespace, "set-weight", "canary-v2", "3")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "modelversion/canary-v2 weight 1 -> 3"
    assert versions.weights("sentiment") == {"canary-v2": 3, "stable-v1": 9}

    negative = run(cluster, namespace, "set-weight", "canary-v2", "-1")
    assert negative.returncode == 1
    assert "spec.weight in body should be greater than or equal to 0" in negative.stderr
    missing = run(cluster, namespace, "set-weight", "nope", "3")
    assert missing.returncode == 1
    assert (
        missing.stderr.strip() == f'error: ModelVersion "nope" not found in namespace {namespace}'
    )


def test_promote_refuses_a_version_that_is_not_ready(
    cluster: Cluster, namespace: str, versions: Routes
) -> None:
    manifest = model_version("cold-v3", "sentiment", weight=0, server={"image": "acme/s:3"})
    cluster.apply(manifest, namespace=namespace)
    eventually(
        lambda: "ReplicasNotReady" in run(cluster, namespace, "promote", "cold-v3").stderr,
        "the operator reporting cold-v3 not Ready",
    )
    refused = run(cluster, namespace, "promote", "cold-v3")
    assert refused.returncode == 1
    assert "cold-v3 is not Ready" in refused.stderr
    assert "--force" in refused.stderr
    assert versions.weights("sentiment") == {"canary-v2": 1, "stable-v1": 9}


@pytest.mark.usefixtures("crd")
def test_without_an_operator_a_change_is_made_and_the_wait_says_so(
    cluster: Cluster, namespace: str
) -> None:
    cluster.apply(
        model_version("lonely", "sentiment", weight=1, endpoint="http://l:8000"), namespace
    )
    result = run(cluster, namespace, "set-weight", "lonely", "4", "--wait=1")
    assert result.returncode == 1
    assert "has not reconciled lonely within 1s (is modelroll-operator running?)" in result.stderr
    assert cluster.kubectl_json("get", "mv", "lonely", namespace=namespace)["spec"]["weight"] == 4


def test_an_exec_credential_plugin_in_the_kubeconfig_works_and_its_failure_is_named(
    cluster: Cluster, namespace: str, versions: Routes, tmp_path: Path
) -> None:
    """The token comes from a ServiceAccount that may read and patch ModelVersions here."""
    cluster.kubectl("create", "serviceaccount", "plugin-user", namespace=namespace)
    cluster.kubectl(
        "create", "role", "modelversions", "--verb=get,list,patch",
        "--resource=modelversions.modelroll.io", namespace=namespace,
    )  # fmt: skip
    cluster.kubectl(
        "create", "rolebinding", "plugin-user", "--role=modelversions",
        f"--serviceaccount={namespace}:plugin-user", namespace=namespace,
    )  # fmt: skip
    token = cluster.kubectl("create", "token", "plugin-user", namespace=namespace).stdout.strip()
    plugin = credential_plugin(tmp_path / "get-token", token)
    kubeconfig = exec_kubeconfig(cluster, tmp_path / "exec.kubeconfig", plugin)
    binary = str(VENV_BIN / "kubectl-modelroll")

    def plugin_run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [binary, f"--kubeconfig={kubeconfig}", "-n", namespace, *args],
            capture_output=True, text=True, timeout=90, check=False,
        )  # fmt: skip

    status = plugin_run("status")
    assert status.returncode == 0, status.stderr
    assert [row[1] for row in table(status.stdout)[1:]] == ["canary-v2", "stable-v1"]
    changed = plugin_run("set-weight", "canary-v2", "2")
    assert changed.returncode == 0, changed.stderr
    eventually(lambda: versions.weights("sentiment") == {"canary-v2": 2, "stable-v1": 9}, "2:9")

    credential_plugin(plugin, None)  # now it fails
    failed = plugin_run("status")
    assert failed.returncode != 0
    assert f"exec credential plugin '{plugin}' gave no token" in failed.stderr
    assert "no credentials for you" in failed.stderr  # the plugin's own words, passed on
