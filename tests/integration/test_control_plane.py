"""The local control plane behaves like a real cluster: the things later tests rely on."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from modelroll_devcluster import Cluster, ControlPlane, MissingBinaryError, namespace_name
from modelroll_devcluster.controlplane import pid_alive

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

WIDGET_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.devcluster.modelroll.io
spec:
  group: devcluster.modelroll.io
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wdg]}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                size: {type: integer, minimum: 0}
"""


def pinned_kubernetes_version() -> str:
    """The k8s.io/kubernetes release hack/go/kubernetes/go.mod pins."""
    gomod = (REPO / "hack" / "go" / "kubernetes" / "go.mod").read_text()
    match = re.search(r"^\s*k8s\.io/kubernetes (v\S+)", gomod, re.MULTILINE)
    assert match, "hack/go/kubernetes/go.mod does not require k8s.io/kubernetes"
    return match.group(1)


def eventually(check: Any, timeout: float = 30.0, what: str = "condition") -> None:
    """Poll ``check()`` until it returns true."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {timeout:.0f}s")
        time.sleep(0.2)


def configmap(name: str, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if owner:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
            }
        ]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {"k": "v"}}


def test_server_and_kubectl_report_the_pinned_version(cluster: Cluster) -> None:
    versions = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    if cluster.is_local:
        expected = pinned_kubernetes_version()
        assert versions["clientVersion"]["gitVersion"] == expected
        assert versions["serverVersion"]["gitVersion"] == expected
    major, minor = versions["serverVersion"]["major"], versions["serverVersion"]["minor"]
    assert (int(major), int(minor.rstrip("+"))) >= (1, 34)


def test_crd_apply_then_create_and_list_objects(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=WIDGET_CRD)
    cluster.wait_established("widgets.devcluster.modelroll.io", timeout=30)
    for name, size in (("small", 1), ("large", 9)):
        cluster.apply(
            {
                "apiVersion": "devcluster.modelroll.io/v1",
                "kind": "Widget",
                "metadata": {"name": name},
                "spec": {"size": size},
            },
            namespace=namespace,
        )

    listed = cluster.kubectl_json("get", "widgets", namespace=namespace)
    assert {i["metadata"]["name"]: i["spec"]["size"] for i in listed["items"]} == {
        "small": 1,
        "large": 9,
    }
    # The schema is enforced: a negative size is rejected by the API server.
    rejected = cluster.kubectl(
        "apply",
        "-f",
        "-",
        namespace=namespace,
        check=False,
        input="apiVersion: devcluster.modelroll.io/v1\nkind: Widget\n"
        "metadata: {name: bad}\nspec: {size: -1}\n",
    )
    assert rejected.returncode != 0
    assert "spec.size" in rejected.stderr


def test_namespace_deletion_completes(cluster: Cluster) -> None:
    name = cluster.create_namespace(namespace_name("deletion"))
    cluster.apply(configmap("content"), namespace=name)
    cluster.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "web", "image": "example.invalid/web:1"}]},
                },
            },
        },
        namespace=name,
    )
    started = time.monotonic()
    cluster.delete_namespace(name, timeout=60)
    assert not cluster.exists("namespace", name)
    assert time.monotonic() - started < 60


def test_owner_reference_garbage_collection(cluster: Cluster, namespace: str) -> None:
    cluster.apply(configmap("owner"), namespace=namespace)
    owner = cluster.kubectl_json("get", "configmap", "owner", namespace=namespace)
    cluster.apply(configmap("child", owner=owner), namespace=namespace)
    assert cluster.exists("configmap", "child", namespace=namespace)

    cluster.kubectl("delete", "configmap", "owner", "--wait=false", namespace=namespace)
    cluster.wait_gone("configmap", "child", namespace=namespace, timeout=30)


def test_deployment_controllers_create_replicaset_and_pods(
    cluster: Cluster, namespace: str
) -> None:
    """Deployment → ReplicaSet → Pods (never scheduled: there is no kubelet), then cascade GC."""
    cluster.kubectl(
        "create",
        "deployment",
        "web",
        "--image=example.invalid/web:1",
        "--replicas=2",
        namespace=namespace,
    )

    def pods() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = cluster.kubectl_json(
            "get", "pods", "-l", "app=web", namespace=namespace
        )["items"]
        return items

    eventually(lambda: len(pods()) == 2, what="two pods of the Deployment")
    replicasets = cluster.kubectl_json("get", "replicasets", namespace=namespace)["items"]
    assert [rs["metadata"]["ownerReferences"][0]["kind"] for rs in replicasets] == ["Deployment"]

    cluster.kubectl("delete", "deployment", "web", "--wait=false", namespace=namespace)
    eventually(
        lambda: (
            not pods()
            and not cluster.kubectl_json("get", "replicasets", namespace=namespace)["items"]
        ),
        what="garbage collection of the ReplicaSet and its pods",
    )


def test_objects_survive_an_apiserver_restart(cluster: Cluster, namespace: str) -> None:
    if not cluster.is_local:
        pytest.skip("MODELROLL_KUBECONFIG names a cluster this suite did not start")
    cluster.apply(configmap("durable"), namespace=namespace)
    before = cluster.kubectl_json("get", "configmap", "durable", namespace=namespace)

    cluster.restart_apiserver()

    after = cluster.kubectl_json("get", "configmap", "durable", namespace=namespace)
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["data"] == {"k": "v"}


def test_kubeconfig_fixture_exports_kubeconfig(kubeconfig: Path, cluster: Cluster) -> None:
    assert os.environ["KUBECONFIG"] == str(kubeconfig)
    result = subprocess.run(
        [str(cluster.kubectl_path), "get", "namespace", "default", "-o", "name"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == "namespace/default"


def test_missing_binary_names_make_target(tmp_path: Path) -> None:
    with pytest.raises(MissingBinaryError, match=r"make cluster-bins"):
        ControlPlane(tmp_path / "run", bin_dir=tmp_path / "empty-bin").start()


def test_missing_binary_fails_the_fixture_instead_of_skipping(tmp_path: Path) -> None:
    (tmp_path / "test_needs_cluster.py").write_text(
        textwrap.dedent(
            """
            def test_uses_cluster(cluster):
                pass
            """
        )
    )
    env = {
        **os.environ,
        "MODELROLL_BIN_DIR": str(tmp_path / "empty-bin"),
        "PYTEST_ADDOPTS": "",
    }
    env.pop("MODELROLL_KUBECONFIG", None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "make cluster-bins" in result.stdout
    assert "1 error" in result.stdout
    assert "skipped" not in result.stdout


def test_cli_up_twice_then_down_leaves_no_process(cluster: Cluster, tmp_path: Path) -> None:
    """`make cluster-up` / `make cluster-down` through the command they run."""
    if not cluster.is_local:
        pytest.skip("MODELROLL_KUBECONFIG names a cluster this suite did not start")
    assert cluster.plane is not None
    state_dir = tmp_path / "cluster"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "modelroll_devcluster.cli", "--dir", str(state_dir), *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=90, check=False)

    def pids() -> dict[str, int]:
        state: dict[str, dict[str, int]] = json.loads((state_dir / "state.json").read_text())
        return state["pids"]

    try:
        first = cli("up", "--bin-dir", str(cluster.plane.bin_dir))
        assert first.returncode == 0, first.stderr
        assert first.stdout.strip() == f"export KUBECONFIG={state_dir.resolve() / 'kubeconfig'}"
        started = pids()
        assert set(started) == {"etcd", "kube-apiserver", "kube-controller-manager"}

        second = cli("up", "--bin-dir", str(cluster.plane.bin_dir))
        assert second.returncode == 0, second.stderr
        assert "already up" in second.stderr
        assert pids() == started
        assert cli("status").returncode == 0

        up = Cluster.existing(state_dir / "kubeconfig", cluster.plane.bin_dir)
        assert up.exists("namespace", "default")
    finally:
        down = cli("down")
    assert down.returncode == 0, down.stderr
    assert not [pid for pid in started.values() if pid_alive(pid)]
    assert cli("status").returncode == 1
