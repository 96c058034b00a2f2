"""What the node tier reads back from a cluster that runs pods: a version's conditions, its pods
and their containers' statuses, the gateway's weights, and ``kubectl modelroll`` as a user runs
it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.incluster import InCluster
from tests.support.story import MODEL

IMAGE = "ghcr.io/modelroll/modelroll-demo:0.1.0"  # `make images`; it holds the demo model


def ready(story: InCluster, name: str) -> dict[str, Any]:
    mv = story.cluster.kubectl_json("get", "mv", name, namespace=story.namespace)
    found = [c for c in mv.get("status", {}).get("conditions", []) if c["type"] == "Ready"]
    return found[0] if found else {}


def pods(story: InCluster, name: str) -> list[dict[str, Any]]:
    listed = story.cluster.kubectl_json(
        "get", "pods", "-l", f"modelroll.io/version={name}", namespace=story.namespace
    )
    items: list[dict[str, Any]] = listed["items"]
    return items


def statuses(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every container's status by name, init containers (the model is one) included."""
    status = pod.get("status", {})
    every = status.get("initContainerStatuses", []) + status.get("containerStatuses", [])
    return {s["name"]: s for s in every}


def condition(mv: dict[str, Any], kind: str) -> dict[str, Any]:
    found = [c for c in mv.get("status", {}).get("conditions", []) if c["type"] == kind]
    return found[0] if found else {}


STABLE, CANARY = "sentiment-stable", "sentiment-canary"


def status_of(story: InCluster, name: str) -> dict[str, Any]:
    mv = story.cluster.kubectl_json("get", "mv", name, namespace=story.namespace)
    status: dict[str, Any] = mv.get("status") or {}
    return status


def ready_and_routed(story: InCluster, names: tuple[str, ...] = (STABLE, CANARY)) -> bool:
    for name in names:
        conditions = {c["type"]: c["status"] for c in status_of(story, name).get("conditions", [])}
        if conditions.get("Ready") != "True" or conditions.get("Routed") != "True":
            return False
    return True


def gateway_weights(story: InCluster, model_name: str = MODEL) -> dict[str, int]:
    model = story.routes().get(model_name) or {"versions": []}
    return {v["name"]: v["weight"] for v in model["versions"]}


def kubectl_modelroll(story: InCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """`kubectl modelroll ...` as the user runs it: the plugin found on PATH by kubectl."""
    env = {
        **os.environ,
        "KUBECONFIG": str(story.cluster.kubeconfig),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    return subprocess.run(
        [str(story.cluster.kubectl_path), "modelroll", "-n", story.namespace, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
